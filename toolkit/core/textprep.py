"""From a line as a person typed it to the sentences the model translates, and back.

One line -> Unicode NFC, no control or format characters (bidirectional marks, soft hyphens,
zero-width spaces, byte-order marks: Unicode category Cf) -> sentences
(sentencex, Wikimedia's rule-based segmenter: a line of three sentences is three
short translations, each of the kind the model was trained on) -> per sentence,
ALL CAPS and Title Case folded to lowercase (the model was trained on lowercase text, not on
capitals)
and protected spans replaced by placeholder symbols, at most placeholders.PER_INPUT per model
input (a sentence with more is translated in pieces). After decoding, each sentence gets its
spans back (each exactly once: placeholders.restore) and its capitals, and the sentences are
joined on one line. A glossary's terms (toolkit.core.glossary) are spans whose targets are put back; a
sentence holding some also keeps its form with the terms as written (Segment.forced), for constrained decoding.
Torch-free.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from toolkit.core import placeholders
from toolkit.core.errors import UsageError
from toolkit.core.glossary import Glossary

# C0/C1 controls other than tab (NUL-only lines would otherwise be "translated" into invented text).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# Either, as one class: one search rules both out of a line that is not ASCII (the format characters' class,
# with code points above U+FFFF, makes a search 3x slower than the controls' own: ASCII lines skip it).
_ODD = re.compile(f"[{_CONTROL.pattern[1:-1]}{placeholders.FORMAT_RE.pattern[1:-1]}]")
_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# Where a sentence with too many spans is cut (see _pieces): after a clause's punctuation, else before a conjunction.
_CLAUSE_END = re.compile(r".*[,;:]", re.S)
_CONJUNCTION = re.compile(r"\s(?:and|or|but|nor|then|plus|while|whereas)\b", re.I)


@dataclass(frozen=True)
class TextOptions:
    """How input lines are turned into model inputs (see the module docstring)."""

    keep: tuple[str, ...] = ()  # user terms copied verbatim, like URLs and numbers
    split: bool = True  # translate each sentence of a line on its own
    enabled: bool = True  # False: the line goes to the tokenizer as it is (no splitting, caps or placeholders)
    glossary: Glossary | None = None  # source terms put in as their target terms (toolkit.core.glossary)


@dataclass
class Segment:
    """One sentence as the model sees it, with what is needed to give it back."""

    text: str  # model input: placeholders in, capitals folded
    spans: list[str] = field(default_factory=list)
    case: str = ""  # "upper" or "title" when the sentence was folded to lowercase for the model
    targets: list[str] = field(default_factory=list)  # glossary target terms to force into its translation, one per occurrence
    # With glossary terms: this input with the terms as written and their targets in `targets`, translated with those
    # forced in (toolkit.core.constrained); this one, whose placeholders put the targets back, is the fallback.
    forced: Segment | None = None
    # A forced segment's text with its source terms taken out: what the model says without them tells which of its own
    # words translate them (constrained.term_swaps).
    without_terms: str = ""


# Punctuation around a word that stays outside a word kept for its characters ("🐱." keeps "🐱", "(©" keeps "©").
AROUND = ".,;:!?¡¿\"'()[]{}«»“”‘’"


# A line of only these is taken as spelled without asking the tokenizer (whose alphabet costs 2 ms to make at a start).
_PLAIN = re.compile(r"[A-Za-z0-9 .,;:!?'\"()\-]*")


def unspelled(line: str, alphabet: frozenset[str] | Callable[[], frozenset[str] | None] | None) -> tuple[str, ...]:
    """The words of `line` holding a character that `alphabet` (the model's tokenizer's: Tokenizer.alphabet) does not
    spell, such as an emoji, ©, ° or £ for the shipped model, without the punctuation around them: copied verbatim as
    --keep terms are. The model met such characters only as raw bytes, if at all; given them, it derailed the whole
    sentence ("I love it 👍" -> "J'adore qu'il fasse des croyants ..."). Control and format characters, spaces (which
    cleaning removes) and combining marks (a stray one beside a letter) make no word kept; a format character inside a
    kept word stays (an emoji's joiners)."""
    if alphabet is None or _PLAIN.fullmatch(line):
        return ()
    alphabet = alphabet() if callable(alphabet) else alphabet
    if alphabet is None or alphabet.issuperset(line):
        return ()
    out = []
    for word in line.split():
        core = word.strip(AROUND)  # quotes the model does not spell around a word it does ("“sting") keep nothing
        if any(c not in alphabet and unicodedata.category(c)[0] not in "CZM" for c in core):
            out.append(core)
    return tuple(dict.fromkeys(out))


def clean(line: str, keep: tuple[str, ...] = ()) -> str:
    """NFC, control characters and format characters removed, runs of whitespace collapsed. Format
    characters are invisible and the model never saw them (a bidirectional mark turns "Hello." into
    nonsense); a `keep` term that holds some keeps them: user terms come out verbatim."""
    text = unicodedata.normalize("NFC", line)
    if (_ASCII_CONTROL if text.isascii() else _ODD).search(text):
        text = _CONTROL.sub(" ", text)
        if placeholders.FORMAT_RE.search(text):
            text = unicodedata.normalize("NFC", _strip_format(text, keep))
    return " ".join(text.split())


def _strip_format(text: str, keep: tuple[str, ...]) -> str:
    """Format characters removed, except inside occurrences of the user's terms."""
    kept = [(m.start(), m.end()) for p in placeholders.term_patterns(keep) for m in p.finditer(text)] if keep else []
    if not kept:
        return placeholders.FORMAT_RE.sub("", text)
    out, last = [], 0
    for start, end in sorted(kept):
        if start >= last:
            out += [placeholders.FORMAT_RE.sub("", text[last:start]), text[start:end]]
            last = end
    out.append(placeholders.FORMAT_RE.sub("", text[last:]))
    return "".join(out)


def is_all_caps(text: str) -> bool:
    """At least three uppercase letters and no other cased letter: shouted text, not an acronym in a
    sentence. Letters of caseless scripts (Arabic, Hebrew, Chinese, ...) are neither: a line of them is not shouted."""
    if any(c.islower() and c.isalpha() for c in text):  # most sentences: stops at their second letter
        return False
    upper = 0
    for c in text:
        if c.isupper():
            upper += c.isalpha()
        elif c.isalpha() and _cased(c):  # a titlecase letter (ǅ): not all capitals
            return False
    return upper >= 3


def _cased(c: str) -> bool:
    return c.isupper() or c.islower() or c.lower() != c.upper()


def is_title_case(text: str) -> bool:
    """Three or more words, every one capitalised ("Where Is The Station?"): the model saw few
    such lines, but translates their lowercase form as well as the original. Words without a
    cased letter (numbers, caseless scripts) neither count nor break it."""
    split = text.split()
    if len(split) < 3 or any(w[0].islower() and w[0].isalpha() for w in split):  # most sentences: a word starts in lowercase
        return False
    firsts = [next((c for c in w if c.isalpha() and _cased(c)), "") for w in split]
    firsts = [c for c in firsts if c]
    return len(firsts) >= 3 and all(c.isupper() for c in firsts) and not is_all_caps(text)


def split_sentences(text: str) -> list[str]:
    try:
        from sentencex import segment
    except ImportError as e:
        # An install problem, not this line's: raised as tk's own error, so that no line is left empty for it.
        raise UsageError(f"{e.name or 'sentencex'} is not installed for {sys.executable} (tk splits lines into "
                         "sentences with it): reinstall tk (pip install tk-onnx-deploy), or translate each line whole "
                         "with --no-split (split=False in Python)") from None

    return [s.strip() for s in segment("en", text) if s.strip()] or ([text] if text else [])


def prepare(line: str, keep: Iterable[str] = (), split: bool = True, enabled: bool = True, protect: bool = True,
            glossary: Glossary | None = None) -> list[Segment]:
    """The model inputs of one input line, in order ([] for an empty line): one per sentence, or several
    for a sentence with more than placeholders.PER_INPUT spans. protect False (a model not trained on tk's
    placeholders and case folding): the cleaned sentences as they are. glossary: its terms' occurrences are spans
    whose target terms are put back (placeholders.protect_terms), and a sentence holding some also has its form with
    the terms as written (Segment.forced), which the decoder translates with their targets forced in where it can."""
    keep = tuple(keep)
    text = clean(line, keep)
    if not text:
        return []
    if not enabled:
        return [Segment(line)]
    if not protect:
        return [_as_written(s, glossary) for s in (split_sentences(text) if split else [text])]
    # Spans are protected before splitting: a period inside an address is no sentence end.
    protected, spans, sources = placeholders.protect_terms(text, keep, glossary)
    out = []
    for sentence in split_sentences(protected) if split else [protected]:
        case = "upper" if is_all_caps(sentence) else "title" if is_title_case(sentence) else ""
        for k, piece in enumerate(_pieces(sentence) if "⦅" in sentence else [sentence]):
            local_piece, local = _renumber(piece, spans)
            # A later piece is mid-sentence: it keeps capitals, but gets no capital first letter.
            segment = Segment(local_piece.lower() if case else local_piece, local, case if k == 0 or case == "upper" else "")
            # A shouted line's translation is put in capitals, its targets with it: only their placeholders keep them as written.
            if any(sources) and case != "upper":
                segment.forced = _with_terms(piece, spans, sources, bool(case), segment.case)
            out.append(segment)
    return out


def _as_written(sentence: str, glossary: Glossary | None) -> Segment:
    """A sentence for a model not trained on tk's placeholders, as it is; with glossary terms, also its form that holds
    their targets in `targets` (Segment.forced). That segment has no placeholder form to fall back on: its `spans` are
    empty, and a translation without the targets is reported, never given as if it held them."""
    segment = Segment(sentence)
    terms = glossary.find(sentence, placeholders.all_spans(sentence, ())) if glossary else []
    if terms:
        cut = "".join(sentence[end:start] for (_, end, *_), (start, *_) in zip([(0, 0), *terms], [*terms, (len(sentence),)]))
        segment.forced = Segment(sentence, targets=[target for _, _, target, _ in terms], without_terms=" ".join(cut.split()))
    return segment


def _with_terms(piece: str, spans: list[str], sources: list[str | None], fold: bool, case: str) -> Segment | None:
    """A model input (numbered as the line's spans) with its glossary terms' placeholders back to the source terms and the
    targets they stand for in `targets`, for decoding with those forced in; None if it holds no term."""
    targets: list[str] = []

    def put(m) -> str:
        i = int(m.group(1))
        if sources[i] is None:
            return m.group()
        targets.append(spans[i])
        return sources[i]

    text = placeholders.SYMBOL_RE.sub(put, piece)
    if not targets:
        return None
    cut = placeholders.SYMBOL_RE.sub(lambda m: m.group() if sources[int(m.group(1))] is None else "", piece)
    text, local = _renumber(text, spans)
    cut = " ".join(_renumber(cut, spans)[0].split())
    return Segment(text.lower() if fold else text, local, case, targets, without_terms=cut.lower() if fold else cut)


def _pieces(sentence: str) -> list[str]:
    """The sentence cut so that no piece holds more than PER_INPUT placeholders, each cut in the words
    between two of them: after a comma, semicolon or colon there, else before a conjunction, else at
    the first space. Pieces translate less well than whole sentences, but the model copies no more
    than PER_INPUT symbols (placeholders.PER_INPUT), and a span it does not copy is only put back at the end."""
    symbols = list(placeholders.SYMBOL_RE.finditer(sentence))
    cap = placeholders.PER_INPUT
    out, start, held = [], 0, 0
    for prev, nxt in zip(symbols, symbols[1:]):
        held += 1
        if held < cap:
            continue
        gap = sentence[prev.end():nxt.start()]
        cut = _cut(gap)
        if cut is None:  # nothing between them to cut at: the piece holds one more
            continue
        out.append(sentence[start:prev.end() + cut].strip())
        start, held = prev.end() + cut, 0
    out.append(sentence[start:].strip())
    return [p for p in out if p]


def _cut(gap: str) -> int | None:
    """Where in the text between two placeholders a piece ends (see _pieces); None where it has no space."""
    clause = _CLAUSE_END.match(gap)
    if clause:
        return clause.end()
    conjunction = _CONJUNCTION.search(gap)
    if conjunction:
        return conjunction.start()
    space = re.search(r"\s", gap)
    return space.start() if space else None


def _renumber(sentence: str, spans: list[str]) -> tuple[str, list[str]]:
    """Each model input numbers its placeholders from 0, as in training; returns its own spans."""
    local: list[str] = []

    def put(m) -> str:
        local.append(spans[int(m.group(1))])
        return placeholders.SYMBOLS[len(local) - 1]

    return placeholders.SYMBOL_RE.sub(put, sentence), local


def finish(segment: Segment, translation: str, report: list[placeholders.Repair] | None = None) -> str:
    """A model input's translation with its spans restored (verbatim, after any case change), each exactly
    once whatever the model did with their symbols; what had to be repaired is appended to `report`."""
    if segment.case == "upper":
        translation = translation.upper()
    elif segment.case == "title":
        translation = translation[:1].upper() + translation[1:]
    return placeholders.restore(translation, segment.spans, report)


def join(sentences: list[str]) -> str:
    return " ".join(s for s in sentences if s)
