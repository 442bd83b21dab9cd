"""No file destroyed, no work lost, signals and closed streams handled in one place (issue 36, classes 3, 7, 8)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import one_line_error

from toolkit.core import atomic, manifest
from toolkit.core.errors import describe_os_error

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "exported"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


# ---- pictures and outputs: checked first, written atomically ---------------------------------------

def test_a_picture_in_a_format_tk_does_not_draw_leaves_the_existing_file_intact(cli, tmp_path):
    photo = tmp_path / "k.jpg"
    photo.write_bytes(b"a photo")
    line = one_line_error(cli("attention", SHIPPED / "transformer", "Hi.", "-o", photo), 2)
    assert "PNG" in line
    assert photo.read_bytes() == b"a photo"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.jpg"]


def test_an_output_in_a_missing_directory_creates_no_directory(cli, tmp_path):
    missing = tmp_path / "missing"
    for args in (("attention", SHIPPED / "nw", "-o", missing / "a.png"),
                 ("translate", "--model", SHIPPED / "transformer", "Go.", "-o", missing / "fr.txt"),
                 ("attention", SHIPPED / "nw", "-o", tmp_path / "a.png", "--json", missing / "a.json")):
        assert "does not exist" in one_line_error(cli(*args), 2)
        assert not missing.exists()


def test_a_picture_whose_drawing_fails_leaves_the_previous_picture(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")  # the plot extra, which the test command installs
    from toolkit.deploy import pictures

    out = tmp_path / "history.png"
    pictures.training_figure([{"epoch": 1, "train_loss": 2.0}, {"epoch": 2, "train_loss": 1.0}], "run", out)
    before = out.read_bytes()
    from PIL import Image

    def broken(self, fp, *args, **kwargs):
        fp.write(b"half a picture")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", broken)
    with pytest.raises(OSError):
        pictures.training_figure([{"epoch": 1, "train_loss": 3.0}], "run", out)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.png"]


def test_a_later_write_removes_the_temporary_files_of_dead_writers_only(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = tmp_path / f".out.txt.{dead.pid}-0123abcd.tmp"
    live = tmp_path / f".out.txt.{os.getpid()}-89abcdef.tmp"
    users = [tmp_path / ".notes.tmp", tmp_path / ".out.txt.12345.tmp", tmp_path / "draft.tmp"]
    for path in (leftover, live, *users):
        path.write_bytes(b"x")
    atomic.write_atomic(tmp_path / "other.txt", b"new")
    assert not leftover.exists()
    assert live.exists() and all(p.exists() for p in users)
    assert (tmp_path / "other.txt").read_bytes() == b"new"


def test_a_replaced_file_keeps_its_mode(tmp_path):
    target = tmp_path / "m.json"
    target.write_bytes(b"old")
    target.chmod(0o640)
    atomic.write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o777) == 0o640


# ---- one manifest, two writers ---------------------------------------------------------------------

def test_two_commands_adding_to_one_manifest_both_keep_what_they_added(tmp_path, monkeypatch):
    model = tmp_path / "nw"
    shutil.copytree(SHIPPED / "nw", model)
    waiting = threading.Event()
    monkeypatch.setattr(atomic, "_say", lambda message: waiting.set())
    with manifest.locked(model):
        # Another command holds the directory: the second writer waits instead of reading a manifest about to change.
        second = threading.Thread(target=manifest.record_metric, args=(model, "second", "fp32", {"value": 2}))
        second.start()
        assert waiting.wait(30)
        first = manifest.load(model)
        first.metrics["first"] = {"value": 1}
        first.save()
    second.join(30)
    assert not second.is_alive()
    metrics = manifest.load(model).metrics
    assert metrics["first"] == {"value": 1} and metrics["second"] == {"value": 2}


@pytest.mark.timeout(300)
def test_concurrent_exports_adding_variants_to_one_directory_both_land(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(SHIPPED / "transformer", model)
    procs = [subprocess.Popen([sys.executable, "-m", "toolkit.cli", "export", str(model), *flags], env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for flags in (["--quantize", "int8"], ["--optimize"])]
    outputs = [p.communicate(timeout=200)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    stored = manifest.load(model).stored
    assert "int8" in stored and "optimized" in stored, (sorted(stored), outputs)
    assert not [p.name for p in model.iterdir() if p.name.endswith(".tmp")]


# ---- error messages name the real cause --------------------------------------------------------

@pytest.mark.parametrize(("code", "says"), [
    (errno.ENOSPC, "free space"), (errno.EACCES, "permission"), (errno.EROFS, "read-only"),
    (errno.ENAMETOOLONG, "too long"), (errno.EIO, "input/output"),
])
def test_an_os_error_is_described_by_its_cause(code, says):
    text = describe_os_error(OSError(code, os.strerror(code), "/some/file"))
    assert text.startswith("/some/file: ") and says in text
    assert ("free space" in text) == (code == errno.ENOSPC)


def test_an_output_name_too_long_is_refused_before_any_work(cli, tmp_path):
    line = one_line_error(cli("translate", "--model", SHIPPED / "transformer", "Go.", "-o", tmp_path / ("a" * 300 + ".txt")), 2)
    assert "too long" in line and "free space" not in line


def test_a_closed_standard_output_is_an_error_not_a_silent_success():
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "translate", "--model", str(SHIPPED / "transformer"), "Go."],
                          env=ENV, capture_output=False, stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1), timeout=120)
    assert proc.returncode == 2
    assert b"standard output is closed" in proc.stderr and b"Traceback" not in proc.stderr


def test_a_reader_that_stops_early_ends_the_run_quietly(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("Hello.\n" * 2000)
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "translate", "-i", str(src), "-q", "--model", str(SHIPPED / "transformer")],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline()
    proc.stdout.close()  # as `| head -1` does
    stderr = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 141, stderr
    assert "Traceback" not in stderr and "free space" not in stderr and "Exception ignored" not in stderr, stderr


# ---- signals ---------------------------------------------------------------------------------------

def _default_sigint() -> None:
    # A shell starts background jobs with SIGINT ignored (and tk keeps an ignored signal ignored).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("count", [2, 3])
def test_repeated_ctrl_c_exits_130_without_a_traceback_or_an_abort(tmp_path, count):
    src = tmp_path / "in.txt"
    src.write_text("The cat is sleeping on the sofa while we wait.\n" * 20000)
    out = tmp_path / "out.txt"
    out.write_text("previous run\n")
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "translate", "-i", str(src), "-o", str(out), "-q",
                             "--model", str(SHIPPED / "transformer"), "--threads", "1"], env=ENV, stderr=subprocess.PIPE,
                            preexec_fn=_default_sigint)
    deadline = time.time() + 120
    while not any(p.name.startswith(".out.txt.") for p in tmp_path.iterdir()):  # translation has started
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()
        time.sleep(0.05)
    for _ in range(count):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    stderr = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 130, stderr  # not -6 (SIGABRT)
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "error: interrupted", stderr
    assert out.read_text() == "previous run\n"


def test_ctrl_c_after_the_command_while_the_process_exits_is_one_line():
    """A third Ctrl-C in CI landed after the command had returned, while the interpreter joined its threads, and
    printed Python's "Exception ignored ... KeyboardInterrupt" traceback. Made certain here: a thread the exit waits for."""
    script = ("import sys, threading, time\n"
              "from toolkit.cli import main\n"
              "threading.Thread(target=time.sleep, args=(30,)).start()\n"  # not a daemon: the exit joins it
              "main(['--version'])\n")
    proc = subprocess.Popen([sys.executable, "-c", script], env={**ENV, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_default_sigint)
    assert proc.stdout.readline().startswith(b"tk")  # the command has returned; the exit now waits for the thread
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    stderr = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 130 and stderr.strip() == "error: interrupted", stderr


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_inside_code_run_from_a_string_still_exits_130(tmp_path, sig):
    """CI saw `python -m toolkit.cli translate` end by SIGINT (-2) after "error: interrupted": the SIGTERM had
    landed while the model loaded, inside an eval of a string type hint, and CPython took the KeyboardInterrupt
    tk caught for an unhandled one. Made certain here, run with -m as there (a script's exit takes another path)."""
    (tmp_path / "hang.py").write_text(
        "from toolkit.cli import main\n"
        "@main.command('hang')\n"
        "def hang():\n"
        f"    exec('import os, signal, time\\nos.kill(os.getpid(), signal.{sig})\\ntime.sleep(30)')\n"
        "main(['hang'])\n")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(tmp_path), ENV["PYTHONPATH"]])}
    proc = subprocess.run([sys.executable, "-m", "hang"], env=env, capture_output=True, timeout=60, preexec_fn=_default_sigint)
    assert proc.returncode == 130 and proc.stderr.decode().strip() == "error: interrupted", (proc.returncode, proc.stderr)


# ---- inputs that used to end in an internal error --------------------------------------------------

def test_an_argument_that_is_not_utf8_is_one_line():
    proc = subprocess.run([sys.executable.encode(), b"-m", b"toolkit.cli", b"translate", b"--model", bytes(SHIPPED / "transformer"),
                           b"Hello \xff world."], env=ENV, capture_output=True, timeout=120)
    assert proc.returncode == 2 and b"not valid UTF-8" in proc.stderr and b"Traceback" not in proc.stderr, proc.stderr


def test_a_closed_standard_input_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "translate", "--model", str(SHIPPED / "transformer")],
                          env=ENV, capture_output=True,
                          preexec_fn=lambda: os.close(0), timeout=120)
    assert proc.returncode == 2 and b"standard input is closed" in proc.stderr, proc.stderr


def test_a_binary_challenge_file_and_a_model_bench_cannot_time_are_one_line(cli, tmp_path):
    binary = tmp_path / "test.txt"
    binary.write_bytes(bytes(range(256)) * 8)
    assert "not UTF-8" in one_line_error(cli("evaluate", SHIPPED / "transformer", "--challenge", binary, "--limit", "2"), 2)
    assert "not a translation model" in one_line_error(cli("bench", "--model", SHIPPED / "nw", "--sentences", "2"), 2)


def test_a_graph_swapped_for_another_models_with_the_same_inputs_is_refused(cli, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(SHIPPED / "transformer", model)
    shutil.copy(SHIPPED / "seq2seq" / "encoder.onnx", model / "encoder.onnx")  # inputs src, src_len as well
    data = json.loads((model / "manifest.json").read_text())
    data["graphs"]["encoder"]["sha256"] = manifest.file_sha256(model / "encoder.onnx")  # as an attacker would
    (model / "manifest.json").write_text(json.dumps(data))
    assert "graph outputs" in one_line_error(cli("translate", "--model", model, "Hello."), 2)


def test_a_sentence_longer_than_the_model_reads_is_refused_by_tk_attention(cli, tmp_path):
    """Drawn truncated, the picture would show another sentence (and 5,000 words made a 1-gigapixel image)."""
    out = tmp_path / "a.png"
    line = one_line_error(cli("attention", SHIPPED / "transformer", " ".join(["word"] * 5000), "-o", out), 2)
    assert "subwords long" in line and "shorter" in line
    assert not any(tmp_path.iterdir())


def test_a_model_directory_whose_name_is_not_utf8_is_one_line(tmp_path):
    model = Path(os.fsdecode(bytes(tmp_path) + b"/m\xff"))
    shutil.copytree(SHIPPED / "transformer", model)
    for args in (["translate", "--model", model, "Hello."], ["serve", model, "--port", "0"]):
        proc = subprocess.run([sys.executable, "-m", "toolkit.cli", *map(str, args)], env=ENV, capture_output=True, timeout=120)
        assert proc.returncode == 2 and b"not valid UTF-8; rename it" in proc.stderr and b"Traceback" not in proc.stderr, proc.stderr
