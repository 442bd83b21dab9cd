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

import dataclasses
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
# Where a sentence too long for the model is cut (see fitted), best first: after a sentence's end (a line translated
# whole, --no-split or in the browser, may hold several), after a clause's punctuation (Latin or CJK), before a
# conjunction, at a space; a text with none of these (CJK, a run of letters) at a character.
_SENTENCE_END = re.compile(r"[.!?…][\"'»”’)\]]*(?=\s|$)|[。！？]")
_CUT_AFTER = re.compile(r"[,;:，；：、](?=\s|$)|[，；：、]")
# A piece of an over-long sentence holds at most this share of the model's positions: its translation, often longer
# than its source (French runs about a fifth longer than English), must fit the same positions.
PIECE_SHARE = 0.75


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
    # The tokens of the sentence this input is a piece of, where that sentence was too long for the model (fitted); 0
    # for a whole sentence.
    cut_from: int = 0
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
            glossary: Glossary | None = None, tokens: Callable[[str], int] | None = None, limit: int = 0) -> list[Segment]:
    """The model inputs of one input line, in order ([] for an empty line): one per sentence, or several
    for a sentence with more than placeholders.PER_INPUT spans. protect False (a model not trained on tk's
    placeholders and case folding): the cleaned sentences as they are. glossary: its terms' occurrences are spans
    whose target terms are put back (placeholders.protect_terms), and a sentence holding some also has its form with
    the terms as written (Segment.forced), which the decoder translates with their targets forced in where it can.
    tokens (a model input's token count) and limit (the model's positions): a sentence of more tokens is translated in
    pieces (fitted) rather than cut short; without them, or enabled False (the line as it is), the decoder truncates."""
    keep = tuple(keep)
    text = clean(line, keep)
    if not text:
        return []
    if not enabled:
        return [Segment(line)]
    if not protect:
        out = []
        for s in split_sentences(text) if split else [text]:
            pieces, whole = fitted(s, tokens, limit) if tokens else ([s], 0)
            out.extend(dataclasses.replace(_as_written(piece, glossary), cut_from=whole) for piece in pieces)
        return out
    # Spans are protected before splitting: a period inside an address is no sentence end.
    protected, spans, sources = placeholders.protect_terms(text, keep, glossary)
    out = []
    for sentence in split_sentences(protected) if split else [protected]:
        case = "upper" if is_all_caps(sentence) else "title" if is_title_case(sentence) else ""
        pieces, whole = _pieces(sentence) if "⦅" in sentence else [sentence], 0
        if tokens:  # measured as the model will see it: placeholders numbered from 0, capitals folded
            def measure(p: str, fold: bool = bool(case)) -> int:
                text = _renumber(p, spans)[0]
                return tokens(text.lower() if fold else text)

            cut = [fitted(p, measure, limit) for p in pieces]
            pieces, whole = [q for qs, _ in cut for q in qs], max(w for _, w in cut)
        for k, piece in enumerate(pieces):
            local_piece, local = _renumber(piece, spans)
            # A later piece is mid-sentence: it keeps capitals, but gets no capital first letter.
            segment = Segment(local_piece.lower() if case else local_piece, local, case if k == 0 or case == "upper" else "",
                              cut_from=whole)
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


def fitted(sentence: str, tokens: Callable[[str], int], limit: int) -> tuple[list[str], int]:
    """The sentence as one piece if its tokens fit the model's `limit` positions; else cut into the fewest pieces of at
    most PIECE_SHARE of them, each cut near its share of the characters at the best place there (after a sentence's
    end, after a clause's punctuation, before a conjunction, at a space, else between two characters outside a
    placeholder), so that none of it is lost to truncation. Returns the pieces and the sentence's tokens where it was cut (0 where it was not).
    A piece with no place to cut (a run of combining marks) is kept whole: the decoder truncates it, with its warning."""
    count = tokens(sentence)
    if count <= limit or limit < 2:
        return [sentence], 0
    cap = max(1, int(limit * PIECE_SHARE))

    def cut(text: str, n_tokens: int) -> list[str]:
        # Cut into pieces of `cap` tokens on average; a piece is cut again only where it is still too long to fit.
        if n_tokens <= limit:
            return [text]
        n = -(-n_tokens // cap)
        bounds, start = [], 0
        for k in range(1, n):
            at = _cut_near(text, start, round(k * len(text) / n), len(text) / (2 * n))
            if at is not None and start < at < len(text):
                bounds.append(at)
                start = at
        if not bounds:
            return [text]
        parts = [p.strip() for p in (text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])) if p.strip()]
        if len(parts) < 2:
            return [text]
        return [q for p in parts for q in cut(p, tokens(p))]

    return cut(sentence, count), count


def _cut_near(text: str, start: int, target: int, reach: float) -> int | None:
    """Where to end a piece of `text` begun at `start`, near `target` (within `reach` characters): the best kind of
    place there (see fitted), the nearest to `target` of that kind; None where no place lies after `start`."""
    lo, hi = max(start + 1, int(target - reach)), min(len(text) - 1, int(target + reach))
    inside = _inside_symbols(text, lo, hi)
    # Each kind is looked for only where no better kind lies in reach.
    kinds = (lambda: (m.end() for m in _SENTENCE_END.finditer(text, lo, hi + 1)),
             lambda: (m.end() for m in _CUT_AFTER.finditer(text, lo, hi + 1)),
             lambda: (m.start() + 1 for m in _CONJUNCTION.finditer(text, lo, hi + 1)),
             lambda: (lo + m.start() for m in re.finditer(r"\s", text[lo:hi + 1])),
             lambda: (i for i in range(lo, hi + 1) if not _joins(text, i)))
    for places in kinds:
        found = [p for p in places() if start < p < len(text) and p not in inside]
        if found:
            return min(found, key=lambda p: abs(p - target))
    return None


def _inside_symbols(text: str, lo: int, hi: int) -> set[int]:
    """The positions between `lo` and `hi` inside a placeholder symbol (after its first character, up to its last),
    where no cut may fall."""
    start = text.rfind("⦅", 0, lo + 1)
    if start < 0 and "⦅" not in text[lo:hi + 1]:
        return set()
    return {i for m in placeholders.SYMBOL_RE.finditer(text, max(0, start), hi + 1) for i in range(m.start() + 1, m.end())}


def _joins(text: str, i: int) -> bool:
    """Whether a cut before text[i] would part a character from what belongs to it: a mark (combining or not: a Thai
    vowel sign's combining class is 0), a joiner, a variation selector, the low half of a flag or a skin tone."""
    c = text[i]
    return (unicodedata.category(c)[0] == "M" or c in "\u200c\u200d" or "\ufe00" <= c <= "\ufe0f" or "\U0001f3fb" <= c <= "\U0001f3ff"
            or ("\U0001f1e6" <= c <= "\U0001f1ff" and i > 0 and "\U0001f1e6" <= text[i - 1] <= "\U0001f1ff"))


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
