"""A file checked against the size limit of its kind, read, and cut into a Document by the reader of its kind."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from toolkit.core.errors import UsageError, describe_os_error, os_failure
from toolkit.deploy.files.document import Document
from toolkit.deploy.files.docx import read_docx
from toolkit.deploy.files.html import read_html
from toolkit.deploy.files.kinds import kind_of
from toolkit.deploy.files.safety import Limits
from toolkit.deploy.files.srt import read_srt
from toolkit.deploy.files.text import read_txt


def read_file(src: str | Path, kind: str | None = None, limits: Limits = Limits(), name: str | None = None) -> Document:
    """The file checked and cut into a Document. `name`: how messages call the file (a server names the client's upload,
    not its own copy)."""
    src = Path(src)
    name = name or str(src)
    kind = kind_of(name if kind is None else src, kind)
    try:
        size = os.stat(src).st_size
        if not src.is_file():
            raise UsageError(f"{name} is not a regular file; give a file")
    except OSError as e:
        raise os_failure(f"cannot read {name}: {describe_os_error(e)}", e) from None
    limit = limits.of(kind)
    if size > limit:
        raise UsageError(f"{name} is {size:,} bytes, over the {limit:,}-byte limit for .{kind} files; split it into smaller files")
    try:
        with open(src, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise os_failure(f"cannot read {name}: {describe_os_error(e)}", e) from None
    if len(data) > limit:  # it grew since the stat
        raise UsageError(f"{name} is over the {limit:,}-byte limit for .{kind} files; split it into smaller files")
    return _READERS[kind](data, name, limits)


_READERS: dict[str, Callable[[bytes, str, Limits], Document]] = {"txt": read_txt, "html": read_html, "srt": read_srt, "docx": read_docx}
