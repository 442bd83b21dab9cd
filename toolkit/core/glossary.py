"""Glossaries: a company's terms translated as the company writes them.

A glossary maps source terms to target terms: a TSV file of `source term<TAB>target term` lines (`tk translate
--glossary FILE.tsv`), a dict in Python (`Translator.translate(texts, glossary={"house": "demeure"})`) or a JSON object
on tk serve. Each occurrence of a source term in a line gives its target term in the translation exactly once, spelled
as written. A sentence holding terms is translated as written with the targets forced into the output where tk's own
decoding loop runs (toolkit.core.constrained; the words around a term then agree with it), checked with holds and
tacked_on; else, and where that fails, each occurrence is one of tk's placeholder symbols, which the model copies as it
copies a number and which is put back as the target, exactly once whatever the model did with it
(toolkit.core.placeholders). A line holding no term is prepared exactly as it is without the glossary, so its
translation is the same, byte for byte. docs/glossary.md has the measurements behind this choice.

How terms are found (Glossary.find): whatever their case ("House", "HOUSE" and "house" are one term; the target is
written as given), as whole words (not "house" in "houses" or "greenhouse"; in scripts written without spaces, anywhere),
several words with any run of spaces between them, and where terms overlap, the longest first. A term inside a number,
a URL, an e-mail address or a --keep term is left to that span (copied verbatim). Lines are matched word by word over a
trie of the terms' words: a line costs the same whatever the glossary's size.

Torch-free: the deploy path (translate, serve, corpus) imports it.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from toolkit.core import placeholders
from toolkit.core.errors import DataError, UsageError

MAX_FILE_BYTES = 64 * 2**20  # a glossary file larger than this is refused before it is read (about a million terms)
MAX_TERM_CHARS = 500  # a term longer than this is no term: most likely a line whose TAB is misplaced
# Scripts written without spaces between words (placeholders' own list): each character there is a word of its own.
_UNSPACED = placeholders._UNSPACED.pattern[1:-1]
# A line's words: a run of letters and digits, one punctuation mark, or one character of a script without spaces.
_WORD = re.compile(f"[{_UNSPACED}]|[^\\W{_UNSPACED}]+|[^\\w\\s]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_BRACKETS = re.compile("[⦅⦆]")  # placeholders' symbols are ⦅N⦆
_WORDS = re.compile(r"\w+")
_END = ""  # the key of a trie node that ends a term (never a word: words are never empty)

Key = tuple[tuple[str, bool], ...]  # a term's words, case-folded, each with whether a space comes before it


@dataclass(frozen=True, eq=False)
class Glossary:
    """Source terms -> target terms, ready to be found in lines (build one with load, parse or from_mapping)."""

    terms: Mapping[str, str]  # each source term as first written -> its target term
    trie: dict  # (word, spaced) -> node; a node's _END entry: (target, source as written) of the term ending there
    digest: str  # sha256 of the terms, which a corpus run records (another glossary is another translation)

    def __len__(self) -> int:
        return len(self.terms)

    def find(self, text: str, spans: Iterable[tuple[int, int]] = ()) -> list[tuple[int, int, str, str]]:
        """(start, end, target term, source term as the glossary writes it) of each term occurrence in text, left to
        right, none overlapping another: of overlapping occurrences the longest is taken (the leftmost of equal ones).
        An occurrence that overlaps one of `spans` (numbers, URLs, kept terms) without holding it whole is left to the span."""
        words = [(m.start(), m.end(), m.group().casefold()) for m in _WORD.finditer(text)]
        found = []
        for i, (start, _, word) in enumerate(words):
            node = self.trie.get((word, False))
            j = i
            while node is not None:
                if _END in node:
                    found.append((start, words[j][1], *node[_END]))
                j += 1
                if j == len(words):
                    break
                node = node.get((words[j][2], words[j][0] > words[j - 1][1]))
        if not found:
            return []
        spans = list(spans)
        taken: list[tuple[int, int, str, str]] = []
        for start, end, *entry in sorted(found, key=lambda f: (f[0] - f[1], f[0])):
            if any(s < end and start < e for s, e, *_ in taken):
                continue
            if any(s < end and start < e and not (start <= s and e <= end) for s, e in spans):
                continue
            taken.append((start, end, *entry))
        return sorted(taken)


def holds(text: str, targets: list[str]) -> bool:
    """Whether a translation holds each target term exactly as often as `targets` lists it: as written, as whole words."""
    return all(count(text, target) == n for target, n in Counter(targets).items())


def tacked_on(text: str, own: str, targets: list[str]) -> bool:
    """Whether a translation with the targets forced in is the model's own translation (`own`) with the targets added
    rather than in place of its words: every word of `own` is still there ("Vide ton sac cartable !" for "Vide ton sac !").
    Then the model wrote its own word for the term, and the target is a second one."""
    rest = Counter(_WORDS.findall(text.casefold()))
    rest.subtract(w for target in targets for w in _WORDS.findall(target.casefold()))
    return not Counter(_WORDS.findall(own.casefold())) - rest


def count(text: str, target: str) -> int:
    """How often `target` stands in `text` as written, as a whole word (placeholders.whole_word)."""
    n, at = 0, text.find(target)
    while at >= 0:
        n += placeholders.whole_word(text, at, at + len(target))
        at = text.find(target, at + 1)
    return n


def term_key(term: str) -> Key:
    """What a term is matched by: its words (NFC, without format characters, case-folded), each with whether a space
    comes before it ("e-mail" is not "e - mail")."""
    text = placeholders.FORMAT_RE.sub("", unicodedata.normalize("NFC", term))
    out, last = [], None
    for m in _WORD.finditer(text):
        out.append((m.group().casefold(), last is not None and m.start() > last))
        last = m.end()
    return tuple(out)


def _term_problem(term: str, side: str) -> str | None:
    """What is wrong with one side of an entry, or None."""
    if not term.strip() or (side == "source" and not term_key(term)):
        return f"its {side} term is empty"
    if len(term) > MAX_TERM_CHARS:
        return f"its {side} term has {len(term)} characters, more than {MAX_TERM_CHARS}"
    bad = _CONTROL.search(term)
    if bad:
        return f"its {side} term holds a control character (U+{ord(bad.group()):04X})"
    bracket = _BRACKETS.search(term)
    if bracket:  # ⦅0⦆ is how tk marks a span for the model to copy: a target holding one would be read back as a span
        return f"its {side} term holds {bracket.group()}, which tk keeps for the spans it copies; write the term without it"
    return None


class _Builder:
    """Entries added one at a time, each checked (where: how an error names the entry), then the Glossary."""

    def __init__(self) -> None:
        self.terms: dict[str, str] = {}
        self.trie: dict = {}
        self.seen: dict[Key, tuple[str, str, str]] = {}  # key -> (source as written, target, where it was given)

    def add(self, source: str, target: str, where: str) -> str | None:
        """Adds an entry; returns what is wrong with it instead, if anything."""
        target = " ".join(unicodedata.normalize("NFC", target).split())
        problem = _term_problem(source, "source") or _term_problem(target, "target")
        if problem:
            return problem
        key = term_key(source)
        if key in self.seen:
            first, first_target, first_where = self.seen[key]
            if first_target == target:
                return None
            return (f"its source term {source!r} is the term {first!r} of {first_where} (terms match whatever their case), "
                    f"with another target ({first_target!r} there, {target!r} here); keep one")
        self.seen[key] = (source, target, where)
        self.terms[source] = target
        node = self.trie
        for word in key:
            node = node.setdefault(word, {})
        node[_END] = (target, " ".join(placeholders.FORMAT_RE.sub("", unicodedata.normalize("NFC", source)).split()))
        return None

    def glossary(self) -> Glossary:
        import hashlib  # here: a translation that loads no glossary hashes nothing (hashlib's OpenSSL costs a cold start 2.5 ms)

        digest = hashlib.sha256("\n".join(f"{' '.join(w for w, _ in k)}\t{v[1]}" for k, v in sorted(self.seen.items())).encode()).hexdigest()
        return Glossary(self.terms, self.trie, digest)


def parse(data: bytes, name: str) -> Glossary:
    """A glossary from a TSV file's bytes (name: how errors name the file): one `source term<TAB>target term` a line,
    UTF-8; blank lines are skipped. A bad line is a DataError naming the file, the line and the fix."""
    builder = _Builder()
    start = 3 if data.startswith(b"\xef\xbb\xbf") else 0  # a byte-order mark, as spreadsheet programs write
    for lineno, raw in enumerate(data[start:].split(b"\n"), 1):
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            raise DataError(f"glossary {name} line {lineno} is not valid UTF-8 (byte {e.start}); save the file as UTF-8") from None
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            what = "has no TAB" if len(fields) == 1 else f"has {len(fields) - 1} TABs"
            raise DataError(f"glossary {name} line {lineno} {what}; write each line as source term, TAB, target term")
        problem = builder.add(fields[0], fields[1], f"line {lineno}")
        if problem:
            raise DataError(f"glossary {name} line {lineno}: {problem}")
    if not builder.terms:
        raise DataError(f"glossary {name} has no terms; write one a line as source term, TAB, target term")
    return builder.glossary()


def load(path: str | Path) -> Glossary:
    """A glossary from a TSV file (see parse); a file that cannot be read, or is too large, is a one-line error."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise DataError(f"glossary {path} is not a file; give a TSV file of source term, TAB, target term lines")
        if size > MAX_FILE_BYTES:
            raise DataError(f"glossary {path} has {size:,} bytes, more than the {MAX_FILE_BYTES:,} tk reads; "
                            "split it, or keep the terms your texts use")
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read glossary {path} ({e.strerror}); give a readable TSV file") from None
    return parse(data, str(path))


def from_mapping(mapping: object, name: str = "glossary") -> Glossary | None:
    """A glossary from a dict of source term -> target term (the API's and tk serve's form); None for an empty one or
    None. A Glossary is taken as it is. Anything else, or a bad entry, is a UsageError naming it."""
    if mapping is None or isinstance(mapping, Glossary):
        return mapping
    if not isinstance(mapping, Mapping):
        raise UsageError(f"{name} must be a dict of source term -> target term, e.g. {{\"house\": \"demeure\"}} "
                         f"(got {type(mapping).__name__}); load a TSV file with toolkit.core.glossary.load")
    if not mapping:
        return None
    builder = _Builder()
    for source, target in mapping.items():
        if not isinstance(source, str) or not isinstance(target, str):
            raise UsageError(f"{name}: each term must be a str (got {source!r}: {target!r})")
        problem = builder.add(source, target, f"entry {source!r}")
        if problem:
            raise UsageError(f"{name} entry {source!r}: {problem}")
    return builder.glossary()
