"""Spans that must come out verbatim: URLs, e-mail addresses, numbers and user-given terms.

Each span is replaced by a placeholder symbol that the tokenizer holds as one piece
(``⦅0⦆``, ``⦅1⦆``, ... in order of appearance), the model copies the symbol (it was
trained on pairs where the same substitution was made on both sides), and the
original text is put back. OpenNMT calls these ｟placeholders｠; the brackets here
are the NFKC forms of the same characters, so tokenizer normalisation leaves them alone.
Torch-free: used by training (to make the pairs) and by every deploy path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_PLACEHOLDERS = 10
SYMBOLS = [f"⦅{i}⦆" for i in range(MAX_PLACEHOLDERS)]
SYMBOL_RE = re.compile(r"⦅(\d+)⦆")

# Trailing sentence punctuation is not part of a URL ("see https://x.org.").
_URL = r"(?:https?://|www\.)[^\s<>\"]+?(?=[.,;:!?)\]'\"]*(?:\s|$))"
_EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
# Digits with inner separators (3.14, 7:30, 1,000, 2024-05-01); a space joins groups of
# three or more digits, as phone numbers are written ("555 0199").
_NUMBER = r"(?<![\w⦅])\+?\d+(?:[.,:/-]\d+)*(?: \d{3,}(?:[.,:/-]\d+)*)*(?![\w⦆])"
_LITERAL = r"⦅\d+⦆"  # a placeholder typed by the user is itself kept verbatim
SPAN_RE = re.compile(f"{_URL}|{_EMAIL}|{_LITERAL}|{_NUMBER}")


# Every span the patterns find holds one of these; most sentences hold none, and one search rules them out.
_MAY_SPAN = re.compile(r"[\d@⦅]|www\.|https?://")


def find_spans(text: str, keep: Iterable[str] = ()) -> list[tuple[int, int]]:
    """(start, end) of every protected span, left to right, non-overlapping; user terms first."""
    if not keep and not _MAY_SPAN.search(text):
        return []
    taken: list[tuple[int, int]] = []
    for term in sorted({t for t in keep if t}, key=len, reverse=True):
        for m in re.finditer(re.escape(term), text):
            if not any(s < m.end() and m.start() < e for s, e in taken):
                taken.append((m.start(), m.end()))
    for m in SPAN_RE.finditer(text):
        if not any(s < m.end() and m.start() < e for s, e in taken):
            taken.append((m.start(), m.end()))
    return sorted(taken)[:MAX_PLACEHOLDERS]


def protect(text: str, keep: Iterable[str] = ()) -> tuple[str, list[str]]:
    """Text with each span replaced by its placeholder symbol, and the spans in symbol order."""
    spans = find_spans(text, keep)
    out, last, kept = [], 0, []
    for i, (start, end) in enumerate(spans):
        out += [text[last:start], SYMBOLS[i]]
        kept.append(text[start:end])
        last = end
    out.append(text[last:])
    return "".join(out), kept


def restore(text: str, spans: list[str]) -> str:
    """Placeholder symbols back to their spans; a symbol with no span (the model invented it) is dropped."""
    if not spans and "⦅" not in text:
        return text

    def put(m: re.Match) -> str:
        i = int(m.group(1))
        return spans[i] if i < len(spans) else ""

    return " ".join(SYMBOL_RE.sub(put, text).split())
