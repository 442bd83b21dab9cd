"""A whole file translated: the output checked not to be the input, the texts translated a chunk at a time, the
translation written atomically."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from toolkit.core.errors import UsageError
from toolkit.deploy.files.document import Document
from toolkit.deploy.files.reading import read_file
from toolkit.deploy.files.safety import Limits

CHUNK_TEXTS = 256  # texts handed to the translate callable at a time by translate_file


def check_destination(src: str | Path, dst: str | Path) -> None:
    """Refuses an output that is the input file itself: a failed or partial translation must never cost the original."""
    try:
        same = os.path.samefile(src, dst)
    except OSError:  # the output does not exist yet
        same = os.path.realpath(src) == os.path.realpath(dst)
    if same:
        raise UsageError(f"the output {dst} is the input file; write the translation to another file")


def translate_all(texts: Sequence[str], translate: Callable[[list[str]], list[str]], chunk: int = CHUNK_TEXTS) -> list[str]:
    """Every text's translation, asking `translate` for `chunk` texts at a time."""
    out: list[str] = []
    for at in range(0, len(texts), chunk):
        part = list(texts[at:at + chunk])
        got = list(translate(part))
        if len(got) != len(part):
            raise ValueError(f"the translator gave {len(got)} translations for {len(part)} texts")
        out += got
    return out


def translate_file(src: str | Path, dst: str | Path, translate: Callable[[list[str]], list[str]], kind: str | None = None,
                   limits: Limits = Limits()) -> Document:
    """Translates file src into dst with `translate` (texts in, their translations out, in order), keeping its structure;
    the kind is src's extension unless given. Returns the Document translated (its texts and their places)."""
    check_destination(src, dst)
    document = read_file(src, kind, limits)
    document.save(dst, translate_all(document.texts, translate))
    return document
