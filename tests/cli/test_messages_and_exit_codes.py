"""What tk says about a path that is the wrong kind of thing, and the exit code of a machine's failure.

- A FIFO or a device where a model directory's file belongs (a listed graph or weights file, manifest.json) is named
  for what it is, never reported missing, and never opened for reading (a FIFO would block tk forever, /dev/zero
  would be hashed forever).
- `tk serve` says a model DIRECTORY is expected when given a file, and a mistyped DIR:SOURCE-TARGET is a malformed
  pair, while a directory whose name has a colon still serves.
- A full disk is the machine's failure, not the user's: every command that writes an output exits 1 on it, and a
  device given as the output is written through, never replaced.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from helpers import one_line_error

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "exported" / "transformer"
FULL = Path("/dev/full")


def _model_copy(tmp_path: Path, name: str = "model") -> Path:
    """The shipped model's directory: its small files copied, its weights linked (nothing here writes them)."""
    out = tmp_path / name
    out.mkdir()
    for f in SHIPPED.iterdir():
        if f.name == "weights.bin":
            (out / f.name).symlink_to(f)
        else:
            (out / f.name).write_bytes(f.read_bytes())
    return out


def _replace(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(kind)


KINDS = [("fifo", "a FIFO"), ("/dev/zero", "a character device")]


# ---- a FIFO or a device in a model directory's file's place -------------------------------------------------------

@pytest.mark.parametrize("kind, said", KINDS, ids=["fifo", "link-to-dev-zero"])
@pytest.mark.parametrize("name", ["weights.bin", "encoder.onnx"])
@pytest.mark.parametrize("command", ["translate", "verify"])
@pytest.mark.timeout(60)  # a FIFO opened for reading blocks until the timeout
def test_a_listed_file_that_is_not_a_regular_file_is_named_for_what_it_is(cli, tmp_path, command, name, kind, said):
    model = _model_copy(tmp_path)
    _replace(model / name, kind)
    args = ["translate", "--model", model, "Go."] if command == "translate" else ["verify", model, "--sentences", "1"]
    line = one_line_error(cli(*args), 2)
    assert f"{model / name} is {said}, not a regular file" in line and "missing" not in line, line


@pytest.mark.parametrize("kind, said", [*KINDS, ("/dev/null", "a character device")], ids=["fifo", "link-to-dev-zero", "link-to-dev-null"])
@pytest.mark.timeout(60)
def test_a_manifest_that_is_not_a_regular_file_is_named_for_what_it_is(cli, tmp_path, kind, said):
    model = _model_copy(tmp_path)
    _replace(model / "manifest.json", kind)
    line = one_line_error(cli("translate", "--model", model, "Go."), 2)
    assert f"{model / 'manifest.json'} is {said}, not a regular file" in line and "no manifest.json" not in line, line


# ---- tk serve's model arguments -----------------------------------------------------------------------------------

def test_serve_given_a_file_says_a_model_directory_is_expected(cli):
    line = one_line_error(cli("serve", SHIPPED, f"{SHIPPED / 'manifest.json'}:en-de"), 2)
    assert f"{SHIPPED / 'manifest.json'} is a file, not a model directory" in line and "does not exist" not in line, line
    assert f"give its directory {SHIPPED}" in line, line


@pytest.mark.parametrize("suffix", ["en", "en-fr-de", "", "EN-FR"])
def test_serve_calls_a_mistyped_pair_malformed_not_a_missing_directory(cli, suffix):
    line = one_line_error(cli("serve", f"{SHIPPED}:{suffix}"), 2)
    assert f"malformed pair {suffix!r}, expected DIR:SRC-TGT" in line and "does not exist" not in line, line


def test_serve_calls_a_mistyped_pair_of_a_missing_directory_malformed_and_says_both(cli, tmp_path):
    nowhere = tmp_path / "nowhere"
    line = one_line_error(cli("serve", f"{nowhere}:en"), 2)
    assert "malformed pair 'en', expected DIR:SRC-TGT" in line and f"neither {nowhere} nor {nowhere}:en exists" in line, line


def test_a_directory_whose_name_has_a_colon_still_serves(tmp_path):
    from toolkit.serve.plan import plan_models

    model = _model_copy(tmp_path, "tk:model")
    (whole,) = plan_models((str(model),))
    assert (whole.directory, whole.pairs) == (str(model), (("en", "fr"),))
    (paired,) = plan_models((f"{model}:en-fr",))
    assert (paired.directory, paired.pairs) == (str(model), (("en", "fr"),))


# ---- a full disk: the machine's failure, exit 1 from every command that writes an output --------------------------

WRITERS = {
    "translate": ["translate", "--model", SHIPPED, "-q", "Go.", "-o", "OUT"],
    "verify": ["verify", SHIPPED, "--sentences", "1", "--variant", "fp32", "--json", "OUT"],
    "bench": ["bench", "--model", SHIPPED, "--sentences", "1", "--batch-size", "1", "--beam", "1", "--no-textbook", "--repeat", "1",
              # one ONNX Runtime setting and no CTranslate2 (its conversion and backend probe): the write is what is tested
              "--variant", "fp32", "--no-ct2", "--threads", "1", "--streams", "1", "--json", "OUT"],
}


@pytest.mark.skipif(not FULL.exists(), reason="no /dev/full on this system")
@pytest.mark.parametrize("command", list(WRITERS))
def test_a_full_device_as_the_output_exits_1_and_stays_a_device(cli, command):
    line = one_line_error(cli(*[FULL if a == "OUT" else a for a in WRITERS[command]]), 1)
    assert f"{FULL}: the disk is full; free space" in line and "old file" not in line, line
    assert stat.S_ISCHR(os.stat(FULL).st_mode)  # written through, not renamed over


@pytest.mark.parametrize("command", list(WRITERS))
def test_a_disk_that_fills_up_while_writing_exits_1_and_keeps_the_old_file(cli, tmp_path, monkeypatch, command):
    """The disk fills up as the output is made durable (fsync); the file there before the run is what stays."""
    out = tmp_path / "out.txt"
    out.write_text("the previous run's output\n")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    line = one_line_error(cli(*[out if a == "OUT" else a for a in WRITERS[command]]), 1)
    assert "the disk is full; free space" in line, line
    assert out.read_text() == "the previous run's output\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary file left behind
