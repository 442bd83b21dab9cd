"""From a line as a person typed it to the sentences the model translates, and back.

One line -> Unicode NFC, no byte-order mark or control characters -> sentences
(sentencex, Wikimedia's rule-based segmenter: a line of three sentences is three
short translations, each of the kind the model was trained on) -> per sentence,
ALL CAPS and Title Case folded to lowercase (the model was trained on lowercase text, not on
capitals)
and protected spans replaced by placeholder symbols. After decoding, each sentence
gets its spans back and its capitals, and the sentences are joined on one line.
Torch-free.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

from toolkit.core import placeholders

# C0/C1 controls other than tab (NUL-only lines would otherwise be "translated" into invented text).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u200b\ufeff]")


@dataclass(frozen=True)
class TextOptions:
    """How input lines are turned into model inputs (see the module docstring)."""

    keep: tuple[str, ...] = ()  # user terms copied verbatim, like URLs and numbers
    split: bool = True  # translate each sentence of a line on its own
    enabled: bool = True  # False: the line goes to the tokenizer as it is (no splitting, caps or placeholders)


@dataclass
class Segment:
    """One sentence as the model sees it, with what is needed to give it back."""

    text: str  # model input: placeholders in, capitals folded
    spans: list[str] = field(default_factory=list)
    case: str = ""  # "upper" or "title" when the sentence was folded to lowercase for the model


def clean(line: str) -> str:
    """NFC, byte-order marks and control characters removed, runs of whitespace collapsed."""
    return " ".join(_CONTROL.sub(" ", unicodedata.normalize("NFC", line)).split())


def is_all_caps(text: str) -> bool:
    """At least three letters and no lowercase one: shouted text, not an acronym in a sentence."""
    if any(c.islower() and c.isalpha() for c in text):  # most sentences: stops at their second letter
        return False
    return sum(c.isalpha() for c in text) >= 3


def is_title_case(text: str) -> bool:
    """Three or more words, every one capitalised ("Where Is The Station?"): the model saw few
    such lines, but translates their lowercase form as well as the original."""
    split = text.split()
    if len(split) < 3 or any(w[0].islower() and w[0].isalpha() for w in split):  # most sentences: a word starts in lowercase
        return False
    words = [w for w in split if any(c.isalpha() for c in w)]
    return len(words) >= 3 and all(next(c for c in w if c.isalpha()).isupper() for w in words) and not is_all_caps(text)


def split_sentences(text: str) -> list[str]:
    from sentencex import segment

    return [s.strip() for s in segment("en", text) if s.strip()] or ([text] if text else [])


def prepare(line: str, keep: Iterable[str] = (), split: bool = True, enabled: bool = True) -> list[Segment]:
    """The sentences of one input line, ready for the model; [] for an empty line."""
    text = clean(line)
    if not text:
        return []
    if not enabled:
        return [Segment(line)]
    # Spans are protected before splitting: a period inside an address is no sentence end.
    protected, spans = placeholders.protect(text, keep)
    out = []
    for sentence in split_sentences(protected) if split else [protected]:
        sentence, local = _renumber(sentence, spans)
        case = "upper" if is_all_caps(sentence) else "title" if is_title_case(sentence) else ""
        out.append(Segment(sentence.lower() if case else sentence, local, case))
    return out


def _renumber(sentence: str, spans: list[str]) -> tuple[str, list[str]]:
    """Each sentence numbers its placeholders from 0, as in training; returns its own spans."""
    local: list[str] = []

    def put(m) -> str:
        local.append(spans[int(m.group(1))])
        return placeholders.SYMBOLS[len(local) - 1]

    return placeholders.SYMBOL_RE.sub(put, sentence), local


def finish(segment: Segment, translation: str) -> str:
    """A sentence's translation with its spans restored (verbatim, after any case change)."""
    if segment.case == "upper":
        translation = translation.upper()
    elif segment.case == "title":
        translation = translation[:1].upper() + translation[1:]
    return placeholders.restore(translation, segment.spans)


def join(sentences: list[str]) -> str:
    return " ".join(s for s in sentences if s)
