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
    """The first line of an exception's message for a one-line error; its type name when the message is empty."""
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else type(e).__name__
