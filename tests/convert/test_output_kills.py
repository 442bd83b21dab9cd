"""An output directory survives `kill -9` at any point of its replacement: `tk export --to-hf OUT --force` (or --out,
--web) killed half way leaves OUT, or what it moved aside, whole; the next write of OUT puts the old directory back
before anything else, so a second kill loses nothing either, and a completed write leaves the new one whole. The same
holds for entries replaced one by one beside a user's own files (a git clone), and for a conversion's files stored into
a model directory before its manifest lists them.

Each write runs in a process of its own (forked) that SIGKILLs itself right after its Nth rename (or file or directory
made or removed): every N in turn, until one run completes."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from toolkit.core import outputs

TK_ENTRIES = {"a.txt", "vendor", "stale.txt"}  # what tk wrote in OUT; the user's notes.txt is not among them
EVERY_STEP = "replace,rename,mkdir,rmdir,unlink"  # every call that changes a directory


def content(version: str, users_file: bool) -> dict[str, str]:
    """OUT's files as a write of `version` leaves them: the old one has a file the new ones no longer write."""
    files = {"a.txt": f"{version} a", "vendor/c.txt": f"{version} c"}
    if version == "old":
        files["stale.txt"] = "old stale"
    if users_file:
        files["notes.txt"] = "the user's"
    return files


def files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*")) if p.is_file()}


def old_output(parent: Path, users_file: bool) -> Path:
    out = parent / "OUT"
    for name, text in content("old", users_file).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return out


def write(out: Path, version: str) -> None:
    """A write of OUT as `tk export --to-hf OUT --force` makes it (outputs.prepare, outputs.writing)."""
    target = outputs.prepare(out, option="--to-hf", sources=[], force=True, owned=lambda d: TK_ENTRIES, what="a test output",
                            keep_foreign=True)
    with outputs.writing(target) as tmp:
        (tmp / "a.txt").write_text(f"{version} a")
        (tmp / "vendor").mkdir()
        (tmp / "vendor" / "c.txt").write_text(f"{version} c")


def in_a_process_killed_after(counted: str, kill_after: int, work: Callable[[], None]) -> bool:
    """Runs `work` in a process of its own (forked) that SIGKILLs itself right after its `kill_after`th call of the os
    functions `counted`, as `kill -9` would kill it there; whether it was killed (False: it completed first)."""
    pid = os.fork()
    if pid == 0:  # the writer: never returns into the test
        status = 1
        try:
            calls = itertools.count(1)

            def killing(real):
                def call(*args, **kwargs):
                    result = real(*args, **kwargs)
                    if next(calls) == kill_after:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return result
                return call

            for name in counted.split(","):
                setattr(os, name, killing(getattr(os, name)))
            work()
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)  # reaped: its process id is no longer alive for the sweep
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert killed or os.waitstatus_to_exitcode(status) == 0, "the writer failed (its traceback is above)"
    return killed


def killed_write(out: Path, version: str, counted: str, kill_after: int) -> bool:
    return in_a_process_killed_after(counted, kill_after, lambda: write(out, version))


def after_the_next_sweep(parent: Path, scratch: Path) -> dict[str, str] | None:
    """OUT's files once the next write of OUT has swept the killed writer's directories (on a copy: the state the
    kill left is kept for the rest of the test); None: no OUT."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(parent, scratch, symlinks=True)
    outputs.sweep(scratch, "OUT")
    return files(scratch / "OUT") if (scratch / "OUT").is_dir() else None


def temporaries(parent: Path) -> list[str]:
    return [str(p.relative_to(parent)) for p in parent.rglob(".OUT.*")]


@pytest.mark.parametrize("users_file", [False, True], ids=["replaced-whole", "merged-beside-a-users-file"])
def test_a_write_killed_after_any_step_leaves_the_old_or_the_new_output_whole(tmp_path, users_file):
    for step in itertools.count(1):
        parent = tmp_path / f"killed-after-{step}"
        out = old_output(parent, users_file)
        killed = killed_write(out, "new", EVERY_STEP, step)
        after = after_the_next_sweep(parent, tmp_path / "swept")
        assert after in (content("old", users_file), content("new", users_file)), f"killed after step {step}: {after}"
        if not killed:  # this write ran to its end: every step before it was a kill point
            assert after == content("new", users_file) and not temporaries(parent)
            break
        write(out, "newer")  # the next write completes, whatever the kill left
        assert files(out) == content("newer", users_file), f"killed after step {step}"
        assert not temporaries(parent), f"killed after step {step}"
    assert step > 3


@pytest.mark.parametrize("users_file", [False, True], ids=["replaced-whole", "merged-beside-a-users-file"])
def test_a_second_write_killed_after_a_first_one_still_finds_the_old_output(tmp_path, users_file):
    """The first write is killed right after its first rename (OUT moved aside, the new one not yet in its place); the
    second, whose sweep finds that, is killed after each of its own steps in turn; the old output is never lost."""
    first = tmp_path / "first"
    old_output(first, users_file)
    assert killed_write(first / "OUT", "new", "replace", 1)
    if not users_file:
        assert not (first / "OUT").exists()  # the moment between the two renames
    assert after_the_next_sweep(first, tmp_path / "swept") == content("old", users_file)
    for step in itertools.count(1):
        parent = tmp_path / f"second-killed-after-{step}"
        shutil.copytree(first, parent, symlinks=True)
        killed = killed_write(parent / "OUT", "newer", EVERY_STEP, step)
        after = after_the_next_sweep(parent, tmp_path / "swept")
        assert after in (content("old", users_file), content("newer", users_file)), f"second write killed after step {step}: {after}"
        if not killed:
            assert after == content("newer", users_file)
            break
        write(parent / "OUT", "newest")
        assert files(parent / "OUT") == content("newest", users_file) and not temporaries(parent)


def test_the_next_write_puts_a_killed_writer_s_old_output_back_before_its_checks(tmp_path):
    """Killed between its renames, a write leaves no OUT: the next write without --force is refused as for any
    existing OUT (before its work, not at its end), and the old output is back in place."""
    out = old_output(tmp_path, users_file=False)
    assert killed_write(out, "new", "replace", 1)
    with pytest.raises(outputs.UsageError, match="already exists; use --force"):
        outputs.prepare(out, option="--to-hf", sources=[], force=False, owned=lambda d: TK_ENTRIES, what="a test output",
                       keep_foreign=True)
    assert files(out) == content("old", False)


def test_a_conversion_killed_before_its_manifest_lists_its_files_leaves_the_files_the_manifest_lists(tmp_path):
    model = tmp_path / "M"
    model.mkdir()
    (model / "manifest.json").write_text('{"decoder.onnx": "old graph"}')
    (model / "decoder.onnx").write_text("old graph")

    def convert() -> None:  # its new graph stored, then killed in `record`, before the manifest lists it
        tmp = outputs.temporary_directory(model, "tk-variants")
        (tmp / "decoder.onnx").write_text("new graph")
        outputs.store(tmp, model, lambda: os.kill(os.getpid(), signal.SIGKILL))

    assert in_a_process_killed_after("replace", 0, convert)  # 0: no kill but the one in `record`
    outputs.sweep(model, "tk-variants")  # what the next conversion of M does first, under M's lock
    assert (model / "decoder.onnx").read_text() == "old graph"
    assert sorted(p.name for p in model.iterdir()) == ["decoder.onnx", "manifest.json"]
