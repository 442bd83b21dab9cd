"""Plain text (.txt): every line kept with its line ending and indentation, each non-blank line one text; and the
decoding (UTF-8, its byte order mark kept) and the each-text-once list that the other kinds share."""

from __future__ import annotations

import codecs
import re

from toolkit.core.errors import DataError
from toolkit.deploy.files.document import Document
from toolkit.deploy.files.safety import Limits

_LINE_END = re.compile(r"(\r\n|\r|\n)")


def decode(data: bytes, name: str) -> tuple[str, bytes]:
    """The file's text and its byte order mark (kept on output); invalid UTF-8 is a DataError naming its line."""
    bom = codecs.BOM_UTF8 if data.startswith(codecs.BOM_UTF8) else b""
    try:
        return data[len(bom):].decode("utf-8"), bom
    except UnicodeDecodeError as e:
        start = e.start + len(bom)
        line = data[:start].count(b"\n") + 1
        raise DataError(f"{name} line {line} is not valid UTF-8 (byte {start}); convert the file to UTF-8") from None


def unique(texts: list[str], places: list[str]) -> tuple[list[str], list[str]]:
    """Each text once (the first place it comes from)."""
    first: dict[str, str] = {}
    for t, p in zip(texts, places):
        first.setdefault(t, p)
    return list(first), list(first.values())


def read_txt(data: bytes, name: str, limits: Limits) -> Document:
    text, bom = decode(data, name)
    parts = _LINE_END.split(text)  # line, ending, line, ending, ..., last line
    lines = parts[0::2]
    texts, places = unique([x.strip() for x in lines if x.strip()], [f"line {k}" for k, x in enumerate(lines, 1) if x.strip()])

    def write(translated: dict[str, str]) -> bytes:
        out = []
        for k, part in enumerate(parts):
            if k % 2 or not part.strip():  # a line ending, or a blank line
                out.append(part)
            else:
                lead, trail = part[: len(part) - len(part.lstrip())], part[len(part.rstrip()):]
                out.append(lead + translated[part.strip()] + trail)
        return bom + "".join(out).encode("utf-8")

    return Document(name, "txt", texts, places, write)
