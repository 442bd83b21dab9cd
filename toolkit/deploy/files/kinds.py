"""Which files tk translates whole: a file's kind by its extension (or as named), and the media type each kind is sent as."""

from __future__ import annotations

from pathlib import Path

from toolkit.core.errors import UsageError

KINDS = {".txt": "txt", ".html": "html", ".htm": "html", ".docx": "docx", ".srt": "srt"}
SUPPORTED = tuple(KINDS)  # the file name extensions translated, as LibreTranslate's supportedFilesFormat lists them
MEDIA_TYPES = {"txt": "text/plain; charset=utf-8", "html": "text/html; charset=utf-8", "srt": "application/x-subrip",
               "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document"}
INSTALL = "pip install 'tk-onnx-deploy[files]'"


def kind_of(path: str | Path, kind: str | None = None) -> str:
    """The kind of a file ("txt", "html", "docx", "srt"): `kind` where given, else the file's extension."""
    if kind is not None:
        if kind not in MEDIA_TYPES:
            raise UsageError(f"unknown file kind {kind!r}; give one of {', '.join(sorted(MEDIA_TYPES))}")
        return kind
    suffix = Path(path).suffix.lower()
    if suffix not in KINDS:
        what = f"a {suffix} file" if suffix else "a file without an extension"
        raise UsageError(f"{Path(path).name}: cannot translate {what}; tk translates {', '.join(SUPPORTED)} files")
    return KINDS[suffix]
