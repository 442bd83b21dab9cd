"""`tk bench --scale`'s work directory (by default in the user cache): a run killed while it prepares the model leaves
a directory the next run knows as its own and completes, redoing the step it was killed in; a directory tk did not
write (a user's folder) is still refused and left as it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolkit.bench import scale
from toolkit.bench.scale_model import SHAPES
from toolkit.core.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
TINY = SHAPES["tiny"]

# A preparation whose steps write their output piece by piece, killed (SIGKILL) half way through the step named.
KILLED_IN_A_STEP = """
import os, signal, sys
from pathlib import Path
from toolkit.bench import scale
from toolkit.bench.scale_model import SHAPES

work, killed_in = Path(sys.argv[1]), sys.argv[2]


def run_step(name, cmd, out, log, echo):
    out.mkdir(parents=True, exist_ok=True)
    (out / "first-half").write_text(name)
    if name == killed_in:
        os.kill(os.getpid(), signal.SIGKILL)
    (out / "second-half").write_text(name)
    return scale.Step(name, 1.0, 1.0)


scale._run_step = run_step
scale.prepare(SHAPES["tiny"], work, ct2=True, echo=print)
"""


def killed_in(work: Path, step: str) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_IN_A_STEP, str(work), step], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == -signal.SIGKILL, done.stderr


@pytest.mark.parametrize("step, writes", [("build (random weights, save_pretrained)", "hf"), ("tk export hf:DIR", "tk"),
                                          ("CTranslate2 TransformersConverter", "ct2")])
def test_a_preparation_killed_in_any_step_is_completed_by_the_next_run(tmp_path, monkeypatch, step, writes):
    work = tmp_path / "work"
    killed_in(work, step)
    ran: list[str] = []

    def run_step(name, cmd, out, log, echo):
        # A step that writes its output from nothing starts from nothing: what the killed run left there is gone.
        assert name not in ran and (name.startswith("tk export --quantize") or not (out / "first-half").exists()), name
        out.mkdir(parents=True, exist_ok=True)
        (out / "whole").write_text(name)
        ran.append(name)
        return scale.Step(name, 2.0, 2.0)

    monkeypatch.setattr(scale, "_run_step", run_step)
    steps = scale.prepare(TINY, work, ct2=True, echo=lambda m: None)
    assert step in ran and ran[-1] == "CTranslate2 TransformersConverter"
    assert all(steps[name].seconds == 1.0 for name in steps if name not in ran)  # the steps done before the kill: kept
    recorded = json.loads((work / scale.MARKER).read_text())
    assert recorded["shape"] == "tiny" and set(recorded["steps"]) == set(steps) and len(steps) == 4
    assert sorted(p.name for p in (work / writes).iterdir()) == ["whole"]  # redone from nothing
    again = scale.prepare(TINY, work, ct2=True, echo=lambda m: None)  # all done: nothing runs again
    assert again == steps and len(ran) == len(set(ran))


def test_the_ownership_mark_is_written_before_anything_else(tmp_path, monkeypatch):
    work = tmp_path / "cache" / "bench-scale" / "tiny"

    def run_step(name, cmd, out, log, echo):
        assert json.loads((work / scale.MARKER).read_text()) == {"shape": "tiny", "steps": {}}
        raise UsageError("interrupted")

    monkeypatch.setattr(scale, "_run_step", run_step)
    with pytest.raises(UsageError, match="interrupted"):
        scale.prepare(TINY, work, ct2=False, echo=lambda m: None)
    assert sorted(p.name for p in work.iterdir()) == [scale.MARKER]


@pytest.mark.parametrize("leftover", ["notes.txt", "hf"])
def test_a_directory_tk_did_not_write_is_still_refused_and_kept(tmp_path, leftover):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / leftover).write_text("keep me")
    with pytest.raises(UsageError, match="was not written by tk bench --scale"):
        scale.prepare(TINY, mine, ct2=False, echo=lambda m: None)
    assert sorted(p.name for p in mine.iterdir()) == [leftover] and (mine / leftover).read_text() == "keep me"


def test_a_work_directory_of_another_shape_or_with_an_unreadable_mark_is_refused_in_one_line(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / scale.MARKER).write_text(json.dumps({"shape": "opus-mt", "steps": {}}))
    with pytest.raises(UsageError, match="holds the opus-mt model"):
        scale.prepare(TINY, work, ct2=False, echo=lambda m: None)
    (work / scale.MARKER).write_text('{"shape": "ti')  # cut short
    with pytest.raises(UsageError, match=f"{scale.MARKER} .*remove {work}"):
        scale.prepare(TINY, work, ct2=False, echo=lambda m: None)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_real_preparation_killed_while_it_builds_the_model_is_completed_by_the_next_run(tmp_path):
    """The real steps (the tiny model's build and `tk export hf:`), the first run killed with its build half done."""
    work = tmp_path / "work"
    prepare = ("import sys; from pathlib import Path; from toolkit.bench import scale; from toolkit.bench.scale_model import SHAPES; "
               "scale.prepare(SHAPES['tiny'], Path(sys.argv[1]), ct2=False, echo=print, int8=False)")
    run = subprocess.Popen([sys.executable, "-c", prepare, str(work)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (work / "hf").exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(run.pid, signal.SIGKILL)  # the bench and the build it runs
    run.wait()
    assert not (work / "hf" / "config.json").exists()  # killed with the model half built
    steps = scale.prepare(TINY, work, ct2=False, echo=lambda m: None, int8=False)
    assert set(steps) == {"build (random weights, save_pretrained)", "tk export hf:DIR"}
    assert (work / "hf" / "config.json").is_file() and (work / "tk" / "manifest.json").is_file()
