"""Spans that must come out verbatim: URLs, e-mail addresses, numbers and user-given terms.

Each span is replaced by a placeholder symbol that the tokenizer holds as one piece
(``⦅0⦆``, ``⦅1⦆``, ... in order of appearance), the model copies the symbol (it was
trained on pairs where the same substitution was made on both sides), and the
original text is put back. OpenNMT calls these ｟placeholders｠; the brackets here
are the NFKC forms of the same characters, so tokenizer normalisation leaves them alone.
Torch-free: used by training (to make the pairs) and by every deploy path.

The deploy path guarantees (`restore`): every span of a model input is put back exactly once,
whatever the model did with its symbol (dropped, repeated, invented, broken); what it had to
repair is reported, so the caller can warn.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

MAX_PLACEHOLDERS = 10  # symbols the tokenizer holds as pieces
# The most one model input is given. The shipped model copies ⦅0⦆ and ⦅1⦆, but given a third it writes
# ⦅1⦆ again or nothing ("Room ⦅0⦆ is on floor ⦅1⦆ and room ⦅2⦆ on floor ⦅3⦆." -> "... du ⦅1⦆ au étage"):
# its pairs seldom hold more than two numbers.
PER_INPUT = 2
SYMBOLS = [f"⦅{i}⦆" for i in range(MAX_PLACEHOLDERS)]
SYMBOL_RE = re.compile(r"⦅(\d+)⦆")

# A URL runs to the next space; what closes it is trimmed by url_end (trailing punctuation, unbalanced brackets).
_URL = r"(?P<url>(?:https?://|www\.)[^\s<>\"]+)"
_EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
# Digits with inner separators (3.14, 7:30, 1,000, 2024-05-01); a space joins groups of
# three or more digits, as phone numbers are written ("555 0199").
_NUMBER = r"(?<![\w⦅])\+?\d+(?:[.,:/-]\d+)*(?: \d{3,}(?:[.,:/-]\d+)*)*(?![\w⦆])"
_LITERAL = r"⦅\d+⦆"  # a placeholder typed by the user is itself kept verbatim
SPAN_RE = re.compile(f"{_URL}|{_EMAIL}|{_LITERAL}|{_NUMBER}")

# Unicode format characters (category Cf: bidirectional marks, soft hyphen, zero-width space and joiners,
# byte-order mark, ...), as of Unicode 15.1; a test checks the running Python's table against it.
FORMAT_RE = re.compile("[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
                       "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
                       "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]")

# Every span the patterns find holds one of these; most sentences hold none, and one search rules them out.
_MAY_SPAN = re.compile(r"[\d@⦅]|www\.|https?://")
# What may stand between spans that are kept as one ("555 0199, 555 0200", "1 2 3", "7:30 - 8:30"): nothing to translate.
# Spans with no space at all between them ("(11)(22)", "1=2") are one too: nothing between them is a word of its own.
_RUN_GAP = re.compile(r"[\s,;/&\-–—]*|\S*")
# Trailing characters that end a sentence around a URL rather than the URL ("see https://x.org.", "(at www.x.org)").
_CLOSING = {")": "(", "]": "[", "}": "{"}
# Scripts written without spaces between words (CJK, kana, Thai, Lao, Myanmar, Khmer): there a --keep term may stand
# next to other letters; elsewhere it must stand as a whole word or number ("55" is not a term inside "555 0199").
_UNSPACED = re.compile("[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u2e80-\u9fff\uf900-\ufaff\U00020000-\U0003ffff]")


@functools.lru_cache(maxsize=64)
def term_patterns(keep: tuple[str, ...]) -> tuple[re.Pattern, ...]:
    """User terms as patterns, longest first: NFC, any run of whitespace where the term has one
    ("Grünwald  GmbH" matches "Grünwald GmbH" and the other way round), and also without the
    term's format characters, so a term typed with a bidirectional mark still matches text without it."""
    forms: set[str] = set()
    for term in keep:
        words = unicodedata.normalize("NFC", term).split()
        forms.add(" ".join(words))
        forms.add(" ".join(FORMAT_RE.sub("", " ".join(words)).split()))
    return tuple(re.compile(r"\s+".join(map(re.escape, form.split(" "))))
                 for form in sorted(forms - {""}, key=lambda f: (-len(f), f)))


def all_spans(text: str, keep: Iterable[str] = ()) -> list[tuple[int, int]]:
    """(start, end) of every protected span, left to right, non-overlapping. A user term counts only as a whole word
    (or where its script has no spaces), and spans that overlap become one: a term inside a URL, an e-mail address or a
    number leaves it whole (`--keep example` kept "example" and cut https://example.com/path into pieces)."""
    keep = tuple(keep)
    if not keep and not _MAY_SPAN.search(text):
        return []
    found = [(m.start(), url_end(text, m) if m.lastgroup == "url" else m.end()) for m in SPAN_RE.finditer(text)]
    if not keep:
        return found  # finditer's matches never overlap
    found += [(m.start(), m.end()) for pattern in term_patterns(keep) for m in pattern.finditer(text)
              if whole_word(text, m.start(), m.end())]
    taken: list[tuple[int, int]] = []
    for start, end in sorted(found):
        if taken and start < taken[-1][1]:
            taken[-1] = (taken[-1][0], max(end, taken[-1][1]))
        else:
            taken.append((start, end))
    return taken


def url_end(text: str, m: re.Match) -> int:
    """Where a URL that SPAN_RE found ends: closing punctuation is the sentence's, and so is a closing bracket that
    no bracket in the URL opens; a balanced one is the URL's (https://en.wikipedia.org/wiki/Python_(language))."""
    start, end = m.start(), m.end()
    while end - start > 1 and text[end - 1] in ".,;:!?'\")]}":
        last = text[end - 1]
        opener = _CLOSING.get(last)
        if opener and text.count(opener, start, end) >= text.count(last, start, end):
            break
        end -= 1
    return end


def whole_word(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] is not glued to a letter or digit on either side (in a script written with spaces)."""
    return not (start > 0 and _glued(text[start - 1], text[start])) and not (end < len(text) and _glued(text[end - 1], text[end]))


def _glued(a: str, b: str) -> bool:
    return (a.isalnum() or a == "_") and (b.isalnum() or b == "_") and not (_UNSPACED.match(a) or _UNSPACED.match(b))


def find_spans(text: str, keep: Iterable[str] = ()) -> list[tuple[int, int]]:
    """The first MAX_PLACEHOLDERS of all_spans: what training substitutes (one symbol each, at most ten)."""
    return all_spans(text, keep)[:MAX_PLACEHOLDERS]


def merge_runs(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans with only separators between them ("555 0199, 555 0200, 555 0201") become one: a list of
    numbers is one symbol for the model to copy, not one each (see PER_INPUT). So do spans with no space between
    them ("(11)(22)(33)"): textprep cuts a sentence into model inputs at spaces only, and twelve such spans in one
    input were more symbols than the tokenizer holds (an IndexError)."""
    out: list[tuple[int, int]] = []
    for start, end in spans:
        if out and _RUN_GAP.fullmatch(text, out[-1][1], start):
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def protect(text: str, keep: Iterable[str] = ()) -> tuple[str, list[str]]:
    """Text with each span replaced by its placeholder symbol, and the spans in symbol order (training's form)."""
    return _replace(text, find_spans(text, keep))


class Glossary(Protocol):
    """What protecting a line asks of a glossary (toolkit.core.glossary.Glossary, which imports this module)."""

    def find(self, text: str, spans: Iterable[tuple[int, int]] = ()) -> list[tuple[int, int, str, str]]: ...


def protect_terms(text: str, keep: Iterable[str] = (), glossary: Glossary | None = None) -> tuple[str, list[str], list[str | None]]:
    """The deploy form of protect: every span, runs merged, numbered ⦅0⦆, ⦅1⦆, ... however many there are
    (textprep renumbers each model input from ⦅0⦆ and gives none more than PER_INPUT). With a glossary, each
    occurrence of one of its terms is a span too, put back as the term's target (toolkit.core.glossary); a line holding
    none of its terms gives what it gives without it. Also, for each span, the source term it stands for where it is a
    glossary term's occurrence (None for a number, URL, e-mail address or kept term)."""
    spans = all_spans(text, keep)
    terms = glossary.find(text, spans) if glossary else []
    if terms and keep:  # an occurrence within a kept term, its very words included, is the kept term's: copied verbatim
        verbatim = [(m.start(), m.end()) for p in term_patterns(tuple(keep)) for m in p.finditer(text) if whole_word(text, m.start(), m.end())]
        terms = [t for t in terms if not any(s <= t[0] and t[1] <= e for s, e in verbatim)]
    if not terms:
        protected, kept = _replace(text, merge_runs(text, spans) if len(spans) > 1 else spans)
        return protected, kept, [None] * len(kept)
    # A span inside a term is the term's ("Windows 10"); a term is never merged into a run of numbers, and one that a
    # run took in is left to the run: each term's target is put back for that term alone.
    spans = [s for s in spans if not any(start <= s[0] and s[1] <= end for start, end, *_ in terms)]
    runs = merge_runs(text, spans) if len(spans) > 1 else spans
    terms = [t for t in terms if not any(s < t[1] and t[0] < e for s, e in runs)]
    # The model is shown a term as the glossary writes it, capitalised where the text's occurrence is ("HOUSE" -> "House").
    chosen = sorted([(s, e, text[s:e], None) for s, e in runs]
                    + [(s, e, target, _cased_as(text[s:e], source)) for s, e, target, source in terms])
    protected, kept = _replace(text, [(s, e, put) for s, e, put, _ in chosen])
    return protected, kept, [source for *_, source in chosen]


def _cased_as(occurrence: str, term: str) -> str:
    return term[:1].upper() + term[1:] if occurrence[:1].isupper() else term


def _replace(text: str, spans: list[tuple[int, int]] | list[tuple[int, int, str]]) -> tuple[str, list[str]]:
    """Each span (start, end), or (start, end, what is put back for it), replaced by its symbol."""
    out, last, kept = [], 0, []
    for i, (start, end, *put) in enumerate(spans):
        out += [text[last:start], f"⦅{i}⦆"]
        kept.append(put[0] if put else text[start:end])
        last = end
    out.append(text[last:])
    return "".join(out), kept


@dataclass(frozen=True)
class Repair:
    """One thing restore put right: kind is "dropped" (the model left a span's symbol out: the span is put
    where the model wrote a repeated or invented symbol, else at the end of the sentence), "repeated"
    (a copy removed), "invented" (a symbol the input did not have, removed) or "broken" (part of a symbol, removed)."""

    kind: str
    span: str  # the span concerned ("" for an invented or broken symbol)
    where: str = ""  # for "dropped": "end" or "where it wrote a wrong symbol"

    def __str__(self) -> str:
        shown = self.span if len(self.span) <= 40 else self.span[:37] + "..."
        if self.kind == "dropped":
            return f"{shown!r} left out by the model, put back {'at the end of its sentence' if self.where == 'end' else self.where}"
        if self.kind == "repeated":
            return f"{shown!r} repeated by the model, kept once"
        return f"a {'placeholder the input did not have' if self.kind == 'invented' else 'broken placeholder'} removed"


_FRAGMENT = re.compile(r"⦅\d*|\d*⦆")
# Where a left-out span goes: before the sentence's closing punctuation.
_TAIL = re.compile(r"[\s.!?…:;»\"')\]]*$")


def restore(text: str, spans: list[str], report: list[Repair] | None = None) -> str:
    """Placeholder symbols back to their spans, each span exactly once: a repeated symbol's copies are removed,
    an invented or broken one is removed, and a span whose symbol is missing takes the place of a removed
    copy or invented symbol (in order), or else goes at the end of the sentence, before its closing
    punctuation. What was repaired is appended to `report`."""
    if not spans and "⦅" not in text and "⦆" not in text:
        return text
    report = [] if report is None else report
    parts = SYMBOL_RE.split(text)  # words, symbol index, words, ..., words
    words = [_drop_fragments(w, report) for w in parts[0::2]]
    given: list[int | None] = []  # per symbol the model wrote: the span it stands for, None for a wrong one
    wrong: list[tuple[int, int]] = []
    for k, i in enumerate(map(int, parts[1::2])):
        fresh = i < len(spans) and i not in given
        given.append(i if fresh else None)
        if not fresh:
            wrong.append((k, i))
    missing = [i for i in range(len(spans)) if i not in given]
    for k, i in wrong:
        if missing:  # most likely the left-out one, written with a wrong number ("⦅0⦆ ⦅1⦆ ⦅1⦆" for three spans)
            given[k] = missing.pop(0)
            report.append(Repair("dropped", spans[given[k]], "where it wrote a wrong symbol"))
        else:
            report.append(Repair("repeated", spans[i]) if i < len(spans) else Repair("invented", ""))
    if missing:
        # Into the model's words after the last symbol, never into a span: a span may end in punctuation too.
        report.extend(Repair("dropped", spans[i], "end") for i in missing)
        tail = _TAIL.search(words[-1]).start()
        words[-1] = f"{words[-1][:tail]} {' '.join(spans[i] for i in missing)}{words[-1][tail:]}"
    out = [words[0]]
    for i, w in zip(given, words[1:]):
        out += [spans[i] if i is not None else "", w]
    return " ".join("".join(out).split())


def _drop_fragments(words: str, report: list[Repair]) -> str:
    if "⦅" not in words and "⦆" not in words:
        return words
    report.extend(Repair("broken", "") for _ in _FRAGMENT.findall(words))
    return _FRAGMENT.sub(" ", words)
