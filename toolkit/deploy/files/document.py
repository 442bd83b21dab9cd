"""A file cut into the texts it needs translated, and how to write it back with their translations."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.core.atomic import write_atomic
from toolkit.core.errors import describe_os_error, os_failure
from toolkit.deploy.translate import one_line


@dataclass
class Document:
    """A file cut into the texts to translate, and how to write it back with their translations."""

    name: str  # the file as messages name it
    kind: str
    texts: list[str]  # each text to translate once, in order
    places: list[str]  # where texts[k] comes from, for messages ("subtitle 12 (line 40)")
    write: Callable[[dict[str, str]], bytes] = field(repr=False)

    def render(self, translations: Sequence[str]) -> bytes:
        """The translated file: translations[k] is that of texts[k]."""
        if len(translations) != len(self.texts):
            raise ValueError(f"{len(translations)} translations for {len(self.texts)} texts")
        return self.write({t: one_line(x) for t, x in zip(self.texts, translations)})

    def save(self, dst: str | Path, translations: Sequence[str]) -> None:
        """Writes the translated file to dst atomically: dst is the whole translation or what it was before."""
        data = self.render(translations)
        try:
            write_atomic(dst, data, user_path=True)
        except OSError as e:
            raise os_failure(f"cannot write {dst}: {describe_os_error(e)}", e) from None
