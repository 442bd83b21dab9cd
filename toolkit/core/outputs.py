"""The one way tk writes an output directory: `tk export --out`, `--to-hf`, `--web`, and the temporary directories
that `--ctranslate2` and stored variants fill inside a model directory (toolkit.convert.pipeline runs every writer
through it; `store` lands the files of the latter, with the manifest as the commit).

1. `prepare`, before any work: a source inside (or equal to) the output is refused (replacing the output would
   delete it), and so is an output tk may not replace: not a directory, not empty without --force, or not of the
   kind this writer makes (`owned` says which of its entries tk wrote; None: it is no such directory). Entries tk
   did not write (a git clone's .git, a user's notes) are refused by name (a model directory) or kept (--to-hf, --web).
2. The writer fills `.OUT.new.PID-XXXXXXXX` beside OUT, made like every directory tk writes: 0777 less the umask
   (0755 usually; mkdtemp's 0700 would keep a service account out).
3. `finish`, under a lock on OUT's parent, checks again (another command may have written OUT meanwhile) and moves
   the new directory into place by renames: whole when OUT held only tk's entries, else entry by entry, the rest left.

Temporary directories carry the writer's process id: a later write of the same OUT cleans up after writers that died
(kill -9), never after one still running, nor touches anything whose name is not exactly of tk's form. It first, under
the lock, puts back what such a writer had moved aside, so that a kill at any point, and another kill of the next write,
loses neither the old OUT nor the user's entries in it: `.OUT.old.*` (the previous OUT, moved aside whole) goes back
where OUT is missing; `.NAME.aside.*` (entries moved aside one by one, by a merge into OUT or a store into a model
directory) go back into the directory holding it, in place of the new entries that took their names. A directory
moved aside is renamed `.NAME.gone.*` before it is deleted, so a kill half way through the deletion leaves nothing
that would be put back.
Torch-free: the PyTorch export (`--out`) and every writer of toolkit.convert write through it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.core.atomic import exclusive, is_temporary, pid_alive
from toolkit.core.errors import UsageError, describe_os_error

# Only names of exactly this form are ever removed or moved: `.NAME.ROLE.PID-XXXXXXXX`, ROLE one of
#   new    being written;
#   old    holds the previous OUT, moved aside whole until the new one is in place (`.OUT.old.PID-XXXXXXXX/OUT`);
#   aside  holds entries of the directory it lies in, moved aside one by one until the new ones are in place;
#   gone   an old or aside directory no longer needed, being deleted.
_DIRECTORY = re.compile(r"\.(?P<name>.+)\.(?P<role>new|old|aside|gone)\.(?P<pid>\d{1,9})-(?P<tag>[0-9a-f]{8})")
_NAME_BYTES = 200  # of OUT's name in a temporary's name: the whole stays within a file name's 255 bytes
_LISTED = 5  # foreign entries named in a refusal


def _short(name: str) -> str:
    raw = os.fsencode(name)
    return name if len(raw) <= _NAME_BYTES else os.fsdecode(raw[:_NAME_BYTES])


def is_temporary_directory(name: str) -> bool:
    return _DIRECTORY.fullmatch(name) is not None


def sweep(parent: Path, name: str) -> None:
    """Cleans up after the writers of `parent/name` that no longer run: what they had moved aside is put back first
    (see the module's docstring), what they were writing or deleting is removed. It moves entries of `parent` and of
    `parent/name`: run it under the lock on `parent` that the writers of `name` take."""
    for path, role in _dead_writers(parent, name, ("old", "aside", "new", "gone")):
        with contextlib.suppress(OSError):  # what could not be put back stays where it is, for a later sweep
            if role == "old":
                _put_back_directory(path, parent / name)
            elif role == "aside":
                _put_back_entries(path, parent)
            else:
                shutil.rmtree(path, ignore_errors=True)
    inside = parent / name  # a merge moves OUT's entries aside within OUT
    if inside.is_dir() and not inside.is_symlink():
        for path, role in _dead_writers(inside, name, ("aside", "gone")):
            with contextlib.suppress(OSError):
                if role == "aside":
                    _put_back_entries(path, inside)
                else:
                    shutil.rmtree(path, ignore_errors=True)


def _dead_writers(directory: Path, name: str, roles: tuple[str, ...]) -> list[tuple[Path, str]]:
    """The temporary directories of `name` in `directory` whose writer no longer runs, with their roles, in `roles`' order."""
    short = _short(name)
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return []
    found = []
    for path in entries:
        m = _DIRECTORY.fullmatch(path.name)
        if m and m["name"] == short and m["role"] in roles and path.is_dir() and not path.is_symlink() and not pid_alive(int(m["pid"])):
            found.append((path, m["role"]))
    return sorted(found, key=lambda found: roles.index(found[1]))


def _put_back_directory(old: Path, out: Path) -> None:
    """A dead writer's `.OUT.old.*`: its OUT goes back in place where OUT is missing (the writer died between its two
    renames); where OUT is there, the new one took its place (the second rename) and the old one is deleted."""
    previous = old / out.name
    if (previous.exists() or previous.is_symlink()) and not (out.exists() or out.is_symlink()):
        os.replace(previous, out)
    _delete(old)


def _put_back_entries(aside: Path, directory: Path) -> None:
    """A dead writer's `.NAME.aside.*`: each entry goes back into `directory`, in place of the new one that took its
    name (the writer died before its output was whole); the aside is removed only once empty."""
    for entry in sorted(aside.iterdir()):
        target = directory / entry.name
        # A rename replaces a file or a link, not a directory, nor a file by a directory: the new entry goes first.
        # Killed while it goes, the old entry is still aside, and the next sweep finishes the job.
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif entry.is_dir() and not entry.is_symlink() and (target.exists() or target.is_symlink()):
            target.unlink()
        os.replace(entry, target)
    aside.rmdir()


def _delete(path: Path) -> None:
    """Deletes an old or aside directory no longer needed: renamed `gone` first, so that a kill half way through the
    deletion leaves no part of it that a sweep would put back."""
    m = _DIRECTORY.fullmatch(path.name)
    if m is not None and m["role"] != "gone":
        gone = path.with_name(f".{m['name']}.gone.{m['pid']}-{m['tag']}")
        with contextlib.suppress(OSError):
            os.replace(path, gone)
            path = gone
    shutil.rmtree(path, ignore_errors=True)


def temporary_directory(parent: Path, name: str, role: str = "new") -> Path:
    """A new, empty `.NAME.ROLE.PID-XXXXXXXX` in `parent`, after sweeping the dead writers' ones of NAME (which puts
    back what they had moved aside: call it under the lock on `parent` that the writers of NAME take)."""
    sweep(parent, name)
    while True:
        path = parent / f".{_short(name)}.{role}.{os.getpid()}-{os.urandom(4).hex()}"
        try:
            os.mkdir(path, 0o777)  # the umask decides, as for every directory tk writes
        except FileExistsError:
            continue
        return path


def _resolved(source: Path) -> list[Path]:
    """Where a source lies: itself and, for a directory, what its entries point at (a link into OUT counts)."""
    paths = [Path(os.path.abspath(source)), Path(os.path.realpath(source))]
    if paths[1].is_dir():
        with contextlib.suppress(OSError):
            paths += [Path(os.path.realpath(p)) for p in source.iterdir() if p.is_symlink()]
    return paths


def refuse_source_inside(out: Path, sources: Iterable[str | Path], option: str) -> None:
    """A source equal to OUT or inside it would be deleted by replacing OUT: refused before any work."""
    targets = {Path(os.path.abspath(out)), Path(os.path.realpath(out))}
    for source in sources:
        for path in _resolved(Path(source)):
            if any(path == target or target in path.parents for target in targets):
                raise UsageError(f"{option} {out} holds {source}, which this command reads; replacing {out} would delete it: "
                                 "choose an output directory outside the source")


def replace_directory(tmp: Path, out: Path) -> None:
    """Puts the finished directory `tmp` at `out` by renames only, so `out` is at every moment the old directory or the
    new one, whole; the old one is moved aside first and deleted once the new one is in place. Killed between the two
    renames, it leaves the old one in `.OUT.old.*`, which the next write of OUT puts back first (`sweep`)."""
    old = None
    if out.exists() or out.is_symlink():
        old = temporary_directory(out.parent, out.name, "old")
        os.replace(out, old / out.name)
    try:
        os.replace(tmp, out)
    except BaseException:
        if old is not None:  # the old directory back where it was; never deleted unless the new one is in place
            os.replace(old / out.name, out)
            old.rmdir()
        raise
    if old is not None:
        _delete(old)


def _merge(tmp: Path, out: Path, replaced: frozenset[str], kept: frozenset[str]) -> list[str]:
    """OUT holds entries tk did not write: tk's own are replaced one by one and the others left as they are (a new
    entry whose name is taken by one of them is not written). Undone on failure, and after a kill by the next write of
    OUT: the entries replaced wait in `.OUT.aside.*` within OUT until every new one is in place. Returns the new
    entries not written."""
    old = temporary_directory(out, out.name, "aside")
    aside: list[str] = []
    placed: list[str] = []
    new = sorted(p.name for p in tmp.iterdir())
    try:
        # tk's entries the new output lacks go too; a writer's temporary is left to that writer (or to the sweep)
        stale = sorted(n for n in replaced - set(new) if not (is_temporary(n) or is_temporary_directory(n)))
        for name in [n for n in new if n not in kept] + stale:
            if (out / name).exists() or (out / name).is_symlink():
                os.replace(out / name, old / name)
                aside.append(name)
            if name in new:
                os.replace(tmp / name, out / name)
                placed.append(name)
    except BaseException:
        _put_back(out, tmp, old, placed, aside)
        raise
    _delete(old)
    return [n for n in new if n in kept]


def store(tmp: Path, directory: Path, record: Callable[[], None]) -> None:
    """Moves the files of `tmp` into the model directory `directory` under their names, then calls `record` (which
    rewrites the manifest to list them): the manifest is the commit. Until `record` returns, a failure leaves the
    directory as it was: the new files are taken out again and the files they replaced, moved aside meanwhile into
    `.NAME.aside.PID-XXXXXXXX`, put back; never deleted before the manifest no longer lists them. A kill there leaves
    them aside, and the next conversion of the directory puts them back (`sweep`, from `temporary_directory`)."""
    staged = _DIRECTORY.fullmatch(tmp.name)
    aside = temporary_directory(directory, staged["name"] if staged else tmp.name, "aside")
    moved: list[str] = []
    placed: list[str] = []
    try:
        for path in sorted(tmp.iterdir()):
            final = directory / path.name
            if final.exists() or final.is_symlink():
                os.replace(final, aside / path.name)
                moved.append(path.name)
            os.replace(path, final)
            placed.append(path.name)
        record()
    except BaseException:
        _put_back(directory, tmp, aside, placed, moved)
        raise
    _delete(aside)


def _put_back(out: Path, tmp: Path, aside: Path, placed: list[str], moved: list[str]) -> None:
    """Undoes a partial move into `out`: the new entries `placed` go back to `tmp`, the old ones `moved` aside come back
    from `aside`, newest first; `aside` is removed only once empty, so what could not be put back stays there, not deleted."""
    for name in reversed(placed):
        with contextlib.suppress(OSError):
            os.replace(out / name, tmp / name)
    for name in reversed(moved):
        with contextlib.suppress(OSError):
            os.replace(aside / name, out / name)
    with contextlib.suppress(OSError):
        aside.rmdir()


@dataclass
class Output:
    """An output directory being written; made by `prepare`."""

    out: Path
    option: str  # names OUT in messages: "--out", "--to-hf", "--web"
    force: bool
    owned: Callable[[Path], set[str] | None]  # OUT's entries tk wrote; None: OUT is not a directory this writer makes
    what: str  # what this writer makes, for "is not ...": "an exported tk model directory (no tk manifest.json)"
    keep_foreign: bool  # entries tk did not write: kept (True) or refused by name (False)
    tmp: Path | None = None
    kept: frozenset[str] = field(default_factory=frozenset)
    replaced: frozenset[str] = field(default_factory=frozenset)

    def check(self) -> None:
        out, option = self.out, self.option
        self.kept = self.replaced = frozenset()
        if not (out.exists() or out.is_symlink()):
            return
        if out.is_symlink() or not out.is_dir():
            raise UsageError(f"{option} {out} exists and is not a directory; choose another path")
        entries = {p.name for p in out.iterdir()}
        if not entries:
            return
        if not self.force:
            raise UsageError(f"{option} {out} already exists; use --force to replace it")
        owned = self.owned(out)
        if owned is None:
            raise UsageError(f"{option} {out} is not {self.what}; --force will not delete it: choose another directory or remove it yourself")
        foreign = {e for e in entries - owned if not (is_temporary(e) or is_temporary_directory(e))}
        if foreign and not self.keep_foreign:
            listed = ", ".join(sorted(foreign)[:_LISTED]) + (f" and {len(foreign) - _LISTED} more" if len(foreign) > _LISTED else "")
            raise UsageError(f"{option} {out} holds entries tk did not write ({listed}); --force will not delete them: "
                             "move them out or choose another directory")
        self.kept, self.replaced = frozenset(foreign), frozenset(entries - foreign)

    def recover(self) -> None:
        """Puts back what a writer of OUT killed half way through had moved aside (`sweep`, under the lock the writers
        take), so that the checks see the OUT it left whole, not a missing one."""
        parent = self.out.parent
        if not parent.is_dir():
            return
        try:
            with exclusive(parent, str(parent)):
                sweep(parent, self.out.name)
        except OSError as e:
            raise UsageError(f"cannot write to {parent} ({describe_os_error(e)}); choose another {self.option}") from None

    def start(self) -> Path:
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            with exclusive(self.out.parent, str(self.out.parent)):  # its sweep moves what dead writers left
                self.tmp = temporary_directory(self.out.parent, self.out.name)
        except OSError as e:
            raise UsageError(f"cannot write to {self.out.parent} ({describe_os_error(e)}); choose another {self.option}") from None
        return self.tmp

    def finish(self) -> list[str]:
        """Moves the written directory into place; returns the names left to entries tk did not write."""
        with exclusive(self.out.parent, str(self.out.parent)):
            sweep(self.out.parent, self.out.name)  # a writer killed meanwhile: its old OUT back before the check
            self.check()  # again, under the lock: another command may have written OUT meanwhile
            skipped = _merge(self.tmp, self.out, self.replaced, self.kept) if self.kept else []
            if not self.kept:
                replace_directory(self.tmp, self.out)
        self.discard()
        return skipped

    def discard(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def prepare(out: Path, *, option: str, sources: Iterable[str | Path], force: bool, owned: Callable[[Path], set[str] | None],
            what: str, keep_foreign: bool) -> Output:
    """Every check of an output directory, before any work (see the module's docstring)."""
    refuse_source_inside(out, sources, option)
    output = Output(out, option, force, owned, what, keep_foreign)
    output.recover()
    output.check()
    return output


@contextlib.contextmanager
def writing(output: Output, skipped: Callable[[list[str]], None] = lambda names: None) -> Iterator[Path]:
    """The temporary directory to fill; moved into place when the block ends without an exception, else removed.
    `skipped` hears the names of new entries not written because an entry tk did not write holds the name."""
    tmp = output.start()
    try:
        yield tmp
        names = output.finish()
    finally:
        output.discard()
    if names:
        skipped(names)
