"""Assertions several test modules share."""

from __future__ import annotations


def one_line_error(result, code: int) -> str:
    """The click result failed with `code` and said so in one `error:` line, with no traceback."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]
