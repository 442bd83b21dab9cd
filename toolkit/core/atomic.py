"""Files that are either complete or absent, and directories that one command writes at a time.

Every file tk writes goes to a temporary file beside the target, is fsynced, then renamed over it
(`AtomicWriter`), so an interrupted or failed write leaves the previous file as it was. The
temporary name carries the writer's process id: a later write to the same target removes the
leftovers of writers that no longer run (a `kill -9`), and never those of one still writing.
Torch-free (the deploy path writes manifests, translations and corpus shards).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

# Only names of exactly this form are ever removed: a user's own dotfiles never match it.
_TEMPORARY = re.compile(r"\..+\.(\d{1,9})-[0-9a-f]{8}\.tmp")


def _umask() -> int:
    """The process's umask, read without setting it where Linux allows (setting it is not thread-safe)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process, or a name that is not a pid: not ours to judge
    return True


_swept: set[str] = set()


def remove_stale_temporaries(directory: Path) -> None:
    """Removes `.NAME.PID-XXXX.tmp` files in `directory` left by writers that have died.
    Once per directory and process: a corpus writes thousands of shards into one directory."""
    key = os.path.realpath(directory)
    if key in _swept:
        return
    _swept.add(key)
    try:
        leftovers = [p for p in directory.iterdir() if (m := _TEMPORARY.fullmatch(p.name)) and not _alive(int(m.group(1)))]
    except OSError:
        return
    for path in leftovers:
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
            if path.is_file() and not path.is_symlink():
                path.unlink()


class AtomicWriter:
    """One file being written: `open()`, write to `.file`, then `commit()` (fsync and rename) or `abort()`.

    The new file keeps the mode of the file it replaces (else the umask's default, not mkstemp's 0600).
    """

    def __init__(self, path: str | Path, text: bool = False):
        self.target = Path(path)
        self.text = text
        self.tmp: Path | None = None
        self.file: IO | None = None

    def open(self) -> AtomicWriter:
        if not self.target.parent.is_dir():
            raise FileNotFoundError(2, "No such file or directory", str(self.target.parent))
        remove_stale_temporaries(self.target.parent)
        mode = (self.target.stat().st_mode & 0o7777) if self.target.is_file() else 0o666 & ~_umask()
        self.tmp = self.target.parent / f".{self.target.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            os.fchmod(fd, mode)
            self.file = os.fdopen(fd, "w", encoding="utf-8", newline="\n") if self.text else os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            self.abort()
            raise
        return self

    def commit(self) -> None:
        """Makes the file the target: on any failure the target is left as it was and the temporary removed."""
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp, self.target)
            self.tmp = None
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()  # the data is being thrown away; a failed flush of it changes nothing
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
        self.tmp = None


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary file that replaces `path` only when the block ends without an exception.
    The directory must exist: a mistyped path never creates directories."""
    writer = AtomicWriter(path).open()
    try:
        yield writer.file
    except BaseException:
        writer.abort()
        raise
    writer.commit()


def write_atomic(path: str | Path, data: bytes) -> None:
    with atomic_file(path) as f:
        f.write(data)


def replace_directory(tmp: Path, out: Path) -> None:
    """Puts the finished directory `tmp` at `out` by renames only, so `out` is at every moment the old directory or the
    new one, whole; the old one is moved aside first and deleted once the new one is in place."""
    import shutil
    import tempfile

    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        os.replace(out, old / out.name)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_output_path(path: str | Path, option: str) -> None:
    """The one check of an output file path, before any work, so a long run never fails at its very end
    and a mistyped path never creates directories: its directory must exist and be writable."""
    from toolkit.core.errors import UsageError

    target = Path(os.path.realpath(path))
    try:
        too_long = len(os.fsencode(target.name)) > os.pathconf(target.parent if target.parent.is_dir() else "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        too_long = False
    if too_long:
        raise UsageError(f"{option} {path}: the file name is too long; choose a shorter one")
    if target.is_dir():
        raise UsageError(f"{option} {path} is a directory; give a file name")
    if not target.parent.is_dir():
        raise UsageError(f"{option} {path}: directory {target.parent} does not exist; create it or choose another path")
    probe = target if target.exists() and not target.is_file() else target.parent
    if not os.access(probe, os.W_OK):
        raise UsageError(f"{option} {path}: {probe} is not writable; check its permissions or choose another path")


def save_with(path: str | Path, write: Callable[[IO[bytes]], None]) -> None:
    """`write(file)` into a temporary file that becomes `path` only if it succeeds (a plot library
    that fails half way through, say, leaves the previous picture intact)."""
    with atomic_file(path) as f:
        write(f)


def _say(message: str) -> None:
    print(message, file=sys.stderr)


@contextlib.contextmanager
def exclusive(directory: str | Path, what: str, echo: Callable[[str], None] | None = None) -> Iterator[None]:
    """Holds an exclusive lock on `directory` for the block (flock on the directory itself, so no lock
    file is left behind): two commands that rewrite one directory's files run one after the other.
    Says so when it has to wait. Where flock is missing (not POSIX), the block runs unlocked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            (echo or _say)(f"waiting for another tk command that is writing {what} ...")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
