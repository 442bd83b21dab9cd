"""Every file or directory tk writes as output destroys nothing (issue 46, "Destroyed data", and its mode 0700 and
kill -9 lines): a FIFO or device named as an output is written through, never replaced; a source inside the output
is refused before any work; --force replaces only what tk wrote (a git clone's .git, a user's README and notes stay);
written directories get the umask's mode; and the temporary directories of a killed writer are removed by the next
write of the same output, never those of a live one nor a user's."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import one_line_error

from toolkit.core import atomic, history, outputs
from toolkit.core.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
NW = REPO / "exported" / "nw"
SHIPPED = REPO / "exported" / "transformer"


def dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


class FifoReader:
    """Reads a FIFO in a thread (a writer opening it blocks until a reader does), keeping what it got."""

    def __init__(self, path: Path):
        self.path, self.data = path, b""
        os.mkfifo(path)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with open(self.path, "rb") as f:
            self.data = f.read()

    def join(self) -> bytes:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "nothing was written to the FIFO"
        return self.data


def assert_link_to(link: Path, device: str) -> None:
    assert link.is_symlink() and os.readlink(link) == device and stat.S_ISCHR(os.stat(link).st_mode)


# ---- an output that is a FIFO or a device is written through, never replaced -----------------------------------

def test_verify_json_into_a_fifo_and_a_link_to_dev_null_writes_through_them(cli, tmp_path):
    fifo = FifoReader(tmp_path / "report.fifo")
    result = cli("verify", NW, "--json", fifo.path)
    assert result.exit_code == 0, result.output
    assert json.loads(fifo.join())["rows"]  # the whole report came through the pipe
    assert stat.S_ISFIFO(os.lstat(fifo.path).st_mode)
    null = tmp_path / "null.json"
    null.symlink_to("/dev/null")
    assert cli("verify", NW, "--json", null).exit_code == 0
    assert_link_to(null, "/dev/null")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null.json", "report.fifo"]  # no temporary left


def test_a_full_device_is_one_line_with_a_nonzero_exit_and_stays_a_device(cli, tmp_path):
    full = tmp_path / "full.json"
    full.symlink_to("/dev/full")
    line = one_line_error(cli("verify", NW, "--json", full), 1)
    assert "disk is full" in line and str(full) in line
    assert_link_to(full, "/dev/full")


def test_attention_and_plot_write_their_json_and_pictures_through_a_fifo_and_dev_null(cli, tmp_path):
    pytest.importorskip("matplotlib")  # the plot extra, which the test command installs
    null_png, null_json = tmp_path / "a.png", tmp_path / "a.json"
    null_png.symlink_to("/dev/null")
    null_json.symlink_to("/dev/null")
    result = cli("attention", NW, "-o", null_png, "--json", null_json)
    assert result.exit_code == 0, result.output
    assert_link_to(null_png, "/dev/null") and assert_link_to(null_json, "/dev/null")
    (tmp_path / "run").mkdir()
    history.write(tmp_path / "run", "nw", [{"epoch": 1, "train_loss": 3.0}, {"epoch": 2, "train_loss": 2.0}])
    fifo = FifoReader(tmp_path / "loss.png")
    result = cli("plot", tmp_path / "run", "-o", fifo.path)
    assert result.exit_code == 0, result.output
    assert fifo.join().startswith(b"\x89PNG") and stat.S_ISFIFO(os.lstat(fifo.path).st_mode)


def test_standard_output_as_an_output_file_is_written_through_the_pipe(tmp_path):
    """`--json /dev/stdout` with stdout a pipe (here a link to /proc/self/fd/1, as /dev/stdout is): checked as
    writable, not as a path whose directory is missing, and the report goes down the pipe, the link left alone."""
    os.mkfifo(tmp_path / "out.fifo")
    atomic.check_output_path(tmp_path / "out.fifo", "--json")  # no error: the FIFO is there and writable
    link = tmp_path / "stdout.json"
    link.symlink_to("/proc/self/fd/1")
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", "verify", str(NW), "--json", str(link)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert '"rows": [' in done.stdout
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1" and sorted(p.name for p in tmp_path.iterdir()) == ["out.fifo", "stdout.json"]


def test_tk_s_own_files_are_never_written_through_a_fifo_in_their_place(tmp_path):
    """A manifest.json that is a FIFO (or a device node unpacked from an archive) in a directory from elsewhere is
    refused, not written into or replaced."""
    os.mkfifo(tmp_path / "manifest.json")
    with pytest.raises(UsageError, match="is a FIFO, not a file"):
        atomic.write_atomic(tmp_path / "manifest.json", b"{}")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "manifest.json").st_mode)


# ---- a source inside the output is refused before any work -------------------------------------------------------

@pytest.fixture()
def model_dir(tmp_path) -> Path:
    """A tk model directory (the shipped nw, copied) that a user put other things into."""
    model = tmp_path / "M"
    shutil.copytree(NW, model)
    return model


def test_export_refuses_a_checkpoint_or_hf_source_inside_its_out(cli, model_dir):
    (model_dir / "hf").mkdir()
    (model_dir / "hf" / "config.json").write_text("{}")
    (model_dir / "checkpoint.pt").write_bytes(b"the user's only checkpoint")
    for source in (f"hf:{model_dir / 'hf'}", model_dir / "checkpoint.pt"):
        line = one_line_error(cli("export", source, "--out", model_dir, "--force"), 2)
        assert "replacing" in line and "would delete it" in line
    assert (model_dir / "checkpoint.pt").read_bytes() == b"the user's only checkpoint" and (model_dir / "hf" / "config.json").exists()


def test_to_hf_and_web_refuse_a_model_directory_inside_their_output(cli, tmp_path):
    work = tmp_path / "W"
    work.mkdir()
    (work / "config.json").write_text(json.dumps({"model_type": "marian"}))
    shutil.copytree(SHIPPED, work / "model")
    for option in ("--to-hf", "--web"):
        line = one_line_error(cli("export", work / "model", option, work, "--force"), 2)
        assert f"{option} {work} holds" in line and "would delete it" in line
    assert (work / "model" / "manifest.json").is_file() and (work / "config.json").is_file()


# ---- --force replaces only what tk wrote -------------------------------------------------------------------------

def test_export_force_refuses_a_model_directory_holding_files_tk_did_not_write_and_names_them(cli, model_dir):
    (model_dir / "notes.txt").write_text("mine")
    line = one_line_error(cli("export", "nw", "--random-init", "--out", model_dir, "--force"), 2)
    assert "notes.txt" in line and "will not delete" in line
    assert (model_dir / "notes.txt").read_text() == "mine"


def test_to_hf_force_on_a_git_clone_replaces_tk_s_files_and_keeps_git_readme_edits_and_other_files(cli, tmp_path):
    clone = tmp_path / "clone"
    assert cli("export", SHIPPED, "--to-hf", clone).exit_code == 0
    tk_card = (clone / "README.md").read_bytes()
    (clone / "model.safetensors").write_bytes(b"an older upload")
    assert cli("export", SHIPPED, "--to-hf", clone, "--force").exit_code == 0  # tk's own card, unedited: replaced quietly
    assert (clone / "README.md").read_bytes() == tk_card and (clone / "model.safetensors").stat().st_size > 1000
    (clone / ".git").mkdir()
    (clone / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (clone / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (clone / "README.md").write_bytes(tk_card + b"\nMy uncommitted edit.\n")
    (clone / "results.txt").write_text("BLEU 40")
    (clone / "model.safetensors").write_bytes(b"an older upload")
    result = cli("export", SHIPPED, "--to-hf", clone, "--force")
    assert result.exit_code == 0, result.output
    assert (clone / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert (clone / ".gitattributes").read_text() == "*.safetensors filter=lfs\n" and (clone / "results.txt").read_text() == "BLEU 40"
    assert (clone / "README.md").read_bytes().endswith(b"My uncommitted edit.\n") and "kept" in result.output
    assert (clone / "model.safetensors").stat().st_size > 1000  # tk's file, replaced
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".clone.")]  # no temporary directory left


def test_web_force_keeps_git_and_cname_beside_the_site(cli, tmp_path):
    site = tmp_path / "site"
    assert cli("export", SHIPPED, "--web", site).exit_code == 0
    (site / ".git").mkdir()
    (site / ".git" / "HEAD").write_text("ref: refs/heads/gh-pages\n")
    (site / "CNAME").write_text("translate.example.org\n")
    (site / "model.json").write_text(json.dumps({**json.loads((site / "model.json").read_text()), "stale": True}))
    result = cli("export", SHIPPED, "--web", site, "--force")
    assert result.exit_code == 0, result.output
    assert (site / ".git" / "HEAD").read_text() == "ref: refs/heads/gh-pages\n" and (site / "CNAME").read_text() == "translate.example.org\n"
    assert "stale" not in json.loads((site / "model.json").read_text()) and (site / "vendor" / "LICENSE-onnxruntime-web.txt").is_file()


# ---- written directories get the umask's mode --------------------------------------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_an_exported_directory_gets_the_umask_s_mode_not_0700(cli, tmp_path, umask):
    old = os.umask(umask)
    try:
        result = cli("export", "nw", "--random-init", "--out", tmp_path / "model")
        made = outputs.temporary_directory(tmp_path, "site")  # what --to-hf, --web and the stores fill
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE(made.stat().st_mode) == 0o777 & ~umask


# ---- kill -9 leftovers are removed by the next write, a live writer's are kept ---------------------------------

def test_the_next_export_removes_a_killed_writer_s_temporary_directories_only(cli, tmp_path):
    dead, live = dead_pid(), os.getpid()
    leftovers = [tmp_path / f".model.new.{dead}-0123abcd", tmp_path / f".model.old.{dead}-4567cdef"]
    kept = [tmp_path / f".model.new.{live}-89abcdef", tmp_path / ".model.backup", tmp_path / f".model.{dead}",
            tmp_path / f".other.new.{dead}-0123abcd"]
    for path in leftovers + kept:
        path.mkdir()
        (path / "encoder.onnx").write_bytes(b"x" * 1000)
    result = cli("export", "nw", "--random-init", "--out", tmp_path / "model")
    assert result.exit_code == 0, result.output
    assert not any(p.exists() for p in leftovers)
    assert all((p / "encoder.onnx").exists() for p in kept)


@pytest.mark.parametrize("args, name", [(("--ctranslate2",), "tk-ct2"), (("--optimize",), "tk-variants")])
def test_a_killed_conversion_s_temporary_directory_inside_the_model_directory_is_removed_by_the_next(cli, tmp_path, args, name):
    model = tmp_path / "M"
    shutil.copytree(SHIPPED if name == "tk-ct2" else NW, model)
    dead = dead_pid()
    leftover, live, users = model / f".{name}.new.{dead}-0123abcd", model / f".{name}.new.{os.getpid()}-0123abcd", model / f"{name}-mine"
    for path in (leftover, live, users):
        path.mkdir()
    result = cli("export", model, *args)
    assert result.exit_code == 0, result.output
    assert not leftover.exists() and live.is_dir() and users.is_dir()
    assert not [p.name for p in model.iterdir() if p.name.startswith(f".{name}.new.{os.getpid()}-") and p != live]
