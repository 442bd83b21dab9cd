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
