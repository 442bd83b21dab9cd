"""Files that are either complete or absent, and directories that one command writes at a time.

Every file tk writes goes to a temporary file beside the target, is fsynced, then renamed over it
(`AtomicWriter`), so an interrupted or failed write leaves the previous file as it was. The
temporary name carries the writer's process id: a later write to the same target removes the
leftovers of writers that no longer run (a `kill -9`), and never those of one still writing.
An output the user names that is a FIFO or a device (`--json /dev/null`, `-o /dev/stdout`) is written
through instead: renaming over it would replace the device with a regular file.
Torch-free (the deploy path writes manifests, translations and corpus shards).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

# Only names of exactly this form are ever removed: a user's own dotfiles never match it.
_TEMPORARY = re.compile(r"\..+\.(\d{1,9})-[0-9a-f]{8}\.tmp")
# This process's writers whose temporary may exist, neither committed nor aborted. A signal turned into
# KeyboardInterrupt is delivered as a call returns: as os.open returns the new file, or as open() returns the writer,
# before any owner holds it to abort. The command's end (toolkit.cli) aborts what is left here (abort_unfinished).
_UNFINISHED: set[AtomicWriter] = set()


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


def is_temporary(name: str) -> bool:
    """A name of exactly the form of tk's temporary files (`.NAME.PID-XXXXXXXX.tmp`)."""
    return _TEMPORARY.fullmatch(name) is not None


def pid_alive(pid: int) -> bool:
    """Whether the writer with this process id may still run (another user's process counts as running)."""
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
        leftovers = [p for p in directory.iterdir() if (m := _TEMPORARY.fullmatch(p.name)) and not pid_alive(int(m.group(1)))]
    except OSError:
        return
    for path in leftovers:
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
            if path.is_file() and not path.is_symlink():
                path.unlink()


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_a_file(path: Path) -> str | None:
    """What `path` is where it exists and is not a regular file ("a FIFO", "a character device", "a directory"), links
    followed as reading it would follow them; None for a regular file or nothing there. Asked with stat alone: opening
    a FIFO to find out would block."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((name for test, name in _KINDS if test(mode)), None)


def _special(path: Path) -> str | None:
    """What a path that exists but is neither a regular file nor a directory is ("a FIFO", "a character device", ...),
    following links (/dev/stdout is a link to /proc/self/fd/1, itself a link to a pipe); None for anything else."""
    kind = not_a_file(path)
    return None if kind == "a directory" else kind


class AtomicWriter:
    """One file being written: `open()`, write to `.file`, then `commit()` (fsync and rename) or `abort()`.

    The new file keeps the mode of the file it replaces (else the umask's default, not mkstemp's 0600).
    `user_path`: the path was named by the user (--json, -o). A link is followed to its target, and a FIFO or a
    device (/dev/null, /dev/stdout) is written through: there is no file to replace, and renaming over it would
    destroy it (as root, /dev/null itself). tk's own files (a manifest, a shard) sit in directories that may come from
    elsewhere: a link there is replaced, never followed, and a FIFO or device in their place is refused.
    """

    def __init__(self, path: str | Path, text: bool = False, user_path: bool = False):
        self.target = Path(path)
        self.text = text
        self.user_path = user_path
        self.through = False
        self.tmp: Path | None = None
        self.file: IO | None = None

    def open(self) -> AtomicWriter:
        special = _special(self.target) if self.user_path or not self.target.is_symlink() else None
        if special is not None:
            return self._open_through(special)
        if self.user_path:
            self.target = Path(os.path.realpath(self.target))
        if not self.target.parent.is_dir():
            raise FileNotFoundError(2, "No such file or directory", str(self.target.parent))
        remove_stale_temporaries(self.target.parent)
        mode = (self.target.stat().st_mode & 0o7777) if self.target.is_file() else 0o666 & ~_umask()
        self.tmp = self.target.parent / f".{self.target.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
        self.pid = os.getpid()
        _UNFINISHED.add(self)  # before the file exists: an interrupt as it is made still finds it
        try:
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        except FileExistsError:
            self.tmp = None  # another's file of that name: never removed
            _UNFINISHED.discard(self)
            raise
        try:
            os.fchmod(fd, mode)
            self.file = os.fdopen(fd, "w", encoding="utf-8", newline="\n") if self.text else os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            self.abort()
            raise
        return self

    def _open_through(self, special: str) -> AtomicWriter:
        """Opens a FIFO or device named by the user for writing, as the shell's `>` would."""
        if not self.user_path:
            from toolkit.core.errors import UsageError

            raise UsageError(f"{self.target} is {special}, not a file; tk writes it only as a regular file: remove it and retry")
        try:
            self.file = open(self.target, "w", encoding="utf-8", newline="\n") if self.text else open(self.target, "wb")  # noqa: SIM115
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(self.target)) from None
        self.through = True
        return self

    def commit(self) -> None:
        """Makes the file the target: on any failure the target is left as it was and the temporary removed.
        Written through (a FIFO, a device): flushed, so an error (ENOSPC from /dev/full) is raised here, naming the path."""
        if self.through:
            try:
                self.file.close()
            except OSError as e:
                raise OSError(e.errno, e.strerror, str(self.target)) from None
            return
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp, self.target)
            self.tmp = None
            _UNFINISHED.discard(self)
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
        _UNFINISHED.discard(self)


def abort_unfinished() -> None:
    """Removes the temporary file of each writer of this process that was neither committed nor aborted (_UNFINISHED):
    what a command interrupted as it opened its output leaves. A forked child's copies of its parent's are not its own."""
    for writer in list(_UNFINISHED):
        if writer.pid == os.getpid():
            writer.abort()


@contextlib.contextmanager
def atomic_file(path: str | Path, user_path: bool = False) -> Iterator[IO[bytes]]:
    """A binary file that replaces `path` only when the block ends without an exception.
    The directory must exist: a mistyped path never creates directories. `user_path`: see AtomicWriter."""
    writer = AtomicWriter(path, user_path=user_path).open()
    try:
        yield writer.file
    except OSError as e:
        writer.abort()
        if writer.through and e.filename is None:  # a write to a device (ENOSPC from /dev/full): say which output
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise
    except BaseException:
        writer.abort()
        raise
    writer.commit()


def write_atomic(path: str | Path, data: bytes, user_path: bool = False) -> None:
    with atomic_file(path, user_path) as f:
        f.write(data)


def check_output_path(path: str | Path, option: str) -> None:
    """The one check of an output file path, before any work, so a long run never fails at its very end
    and a mistyped path never creates directories: its directory must exist and be writable. A FIFO or a
    device (/dev/null, /dev/stdout, even through a link) is written through: it must be writable itself."""
    from toolkit.core.errors import UsageError

    special = _special(Path(path))
    if special is not None:
        if not os.access(path, os.W_OK):
            raise UsageError(f"{option} {path} is {special} that is not writable; check its permissions or choose another path")
        return
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
    if not os.access(target.parent, os.W_OK):
        raise UsageError(f"{option} {path}: {target.parent} is not writable; check its permissions or choose another path")


def save_with(path: str | Path, write: Callable[[IO[bytes]], None], user_path: bool = False) -> None:
    """`write(file)` into a temporary file that becomes `path` only if it succeeds (a plot library
    that fails half way through, say, leaves the previous picture intact). `user_path`: see AtomicWriter."""
    with atomic_file(path, user_path) as f:
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
