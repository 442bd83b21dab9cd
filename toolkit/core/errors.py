"""Typed errors. Library code raises these; only the CLI turns them into one-line messages."""


class ToolkitError(Exception):
    """A problem the user can fix; the message says what was expected and what to do."""

    exit_code = 1


class UsageError(ToolkitError):
    """Bad arguments or inputs: wrong path, unknown model, unreadable file."""

    exit_code = 2


class DataError(UsageError):
    """The corpus or an input file is missing, corrupt or not what it should be."""


class ParityError(ToolkitError):
    """Exported graphs disagree with PyTorch beyond tolerance."""

    exit_code = 1


class ProviderError(ToolkitError):
    """The requested ONNX Runtime execution provider could not be used."""

    exit_code = 1


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message for a one-line error; its type name when the message is empty.
    Another library's message is cut at `limit`; tk's own are written as one line and kept whole (their fix is at the end)."""
    text = str(e).strip()
    if not text:
        return type(e).__name__
    return text.splitlines()[0] if isinstance(e, ToolkitError) else text.splitlines()[0][:limit]


# What to do about an OS error, by its errno: "free space" only when space is what ran out.
_OS_FIXES = {
    "ENOSPC": "the disk is full; free space or choose another path",
    "EDQUOT": "the disk quota is used up; free space or choose another path",
    "EACCES": "permission denied; check the permissions or choose another path",
    "EPERM": "operation not permitted; check the permissions or choose another path",
    "EROFS": "the file system is read-only; choose another path",
    "ENAMETOOLONG": "the file name is too long; choose a shorter one",
    "ENOENT": "no such file or directory; check the path",
    "ENOTDIR": "a part of the path is not a directory; check the path",
    "EISDIR": "it is a directory; give a file name",
    "EEXIST": "it already exists; choose another path",
    "EIO": "an input/output error on the device; check the disk",
    "EMFILE": "too many open files; raise the limit (ulimit -n) and retry",
    "EBADF": "the file descriptor is closed (an output redirected to a closed stream?); give a file with -o",
}


def describe_os_error(e: OSError) -> str:
    """`PATH: what happened; what to do`, naming the real cause (errno), for one-line errors."""
    import errno

    name = errno.errorcode.get(e.errno or 0, "")
    where = f"{e.filename}: " if e.filename else ""
    return where + _OS_FIXES.get(name, f"{(e.strerror or str(e) or type(e).__name__).lower()}; check the path and retry")


# Errors in a path the user gave (it cannot be read, does not exist, is the wrong kind of file): usage problems, exit 2 as
# docs/commands.md says. The others (a full disk, a failing device, too many open files) are the machine's: exit 1.
_PATH_ERRORS = frozenset({"EACCES", "EPERM", "ENOENT", "ENOTDIR", "EISDIR", "ENAMETOOLONG", "EROFS", "EEXIST", "ELOOP"})


def os_error_exit_code(e: OSError) -> int:
    """The exit code of an OS error: 2 where the path given is at fault (permission denied included), else 1."""
    import errno

    return 2 if errno.errorcode.get(e.errno or 0, "") in _PATH_ERRORS else 1


def os_failure(message: str, e: OSError) -> ToolkitError:
    """A one-line error for OS error `e`, met doing what `message` says, with the exit code the CLI gives that OS error
    itself (os_error_exit_code): a UsageError (2) where the path given is at fault, a ToolkitError (1) where the machine
    is (a full disk), so that every command exits alike on it."""
    return UsageError(message) if os_error_exit_code(e) == 2 else ToolkitError(message)


def path_problem(path: object, what: str) -> str | None:
    """Why `path` cannot be used by ONNX, ONNX Runtime or a manifest, or None: a name with bytes that are not UTF-8
    (Python keeps them as lone surrogates, which those libraries cannot take)."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} {str(path)!r} is not a valid UTF-8 path (ONNX cannot write or read such a name); choose a UTF-8 name"
    return None

