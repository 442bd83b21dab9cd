"""Translating the text of an HTML fragment while keeping its markup in place (`format="html"`).

Markup comes back exactly as it was written, byte for byte: the fragment is cut into tokens as a browser's tokenizer
cuts it (_tokens), each token the very text it was in the fragment, and only text tokens are ever rewritten. What a
browser reads to the fragment's end is kept to the end as written, untranslated: the content of an unclosed <script>,
an unterminated comment, a tag that never ends. Cutting takes one pass (time linear in the fragment's size, however
deep its elements nest or however many stray end tags it has). Only text is translated. The fragment is cut into
blocks at every tag that is not an inline element (p, li, td, br, img, ...), and each block's text is translated
whole, so a sentence keeps its words together across `<b>` or `<a>`. The inline elements of a block (each holding text
only) are put back around their own words: each one's text is translated alone too, and found in the block's
translation (in any order; in their written order where a block has more than FREE_ORDER of them). Where one is not
found there, as written or as a run of the block translation's words that holds each of its words and no other (a
word translated alone may come out repeated: "le monde monde le monde" is found as "le monde"), or inline elements
nest, the block is translated text run by text run instead, which keeps every element in place at some cost to the
translation. The content of script, style, code, kbd,
samp, var, pre and textarea, and of any element marked translate="no" (HTML's own attribute) or class="notranslate",
is not translated; attributes are never translated. Entities are decoded for translation and a translation is escaped
again (`&amp;` stays `&amp;`; a named character such as `&eacute;` comes back as the character itself, which is the
same HTML); a text whose translation is itself (a number, a name the model kept) comes back as it was written.

Translation is the caller's: `plan(fragment)` lists the texts to translate, `render(plan, translated)` writes the
fragment back from their translations, and translate_html does both with one callable. Torch-free.
"""

from __future__ import annotations

import html
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

# Elements that flow inside a sentence: their text belongs to the surrounding block's text.
INLINE = frozenset({"a", "abbr", "b", "bdi", "bdo", "cite", "data", "dfn", "em", "font", "i", "ins", "del", "mark", "q",
                    "s", "small", "span", "strong", "sub", "sup", "time", "u", "label"})
# Elements whose content is not prose to translate.
VERBATIM = frozenset({"script", "style", "code", "kbd", "samp", "var", "pre", "textarea"})
# Elements with no end tag: never open (a stray </br> closes nothing).
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"})
SPACES = re.compile(r"\s+")


@dataclass
class _Run:
    """A text node of a block: its text, as written (character references and all), and the inline element it is in
    (None: directly in the block)."""

    text: str
    raw: str
    element: int | None = None


@dataclass
class _Tag:
    """A start or end tag of an inline element inside a block, as written."""

    raw: str
    element: int
    closing: bool = False


@dataclass
class _Block:
    """Consecutive text and inline elements between two other tags: the unit translated as one text."""

    items: list[_Tag | _Run] = field(default_factory=list)  # its inline elements' tags and its text runs, in order
    nested: bool = False  # an inline element inside another: only the run-by-run translation keeps that

    def runs(self) -> list[_Run]:
        return [i for i in self.items if isinstance(i, _Run)]

    def text(self) -> str:
        return _clean("".join(r.text for r in self.runs()))

    def source(self) -> str:
        """The block as the fragment wrote it."""
        return "".join(i.raw for i in self.items)

    def elements(self) -> dict[int, str]:
        """Each inline element's text (the runs inside it, joined)."""
        out: dict[int, str] = {}
        for r in self.runs():
            if r.element is not None:
                out[r.element] = out.get(r.element, "") + r.text
        return out


@dataclass
class Plan:
    """A fragment cut into what stays (raw markup, untranslated text) and blocks to translate."""

    parts: list[str | _Block]

    def texts(self) -> list[str]:
        """Every text this fragment needs translated, each once, in order: each block's text, then its runs'."""
        seen: dict[str, None] = {}
        for b in self.parts:
            if isinstance(b, _Block) and prose(b.text()):
                seen[b.text()] = None
                for r in b.runs():
                    if prose(r.text):
                        seen[_clean(r.text)] = None
        return list(seen)


@dataclass
class _Token:
    """A piece of a fragment exactly as it is written there: joined, a fragment's tokens are the fragment."""

    # "text", "start" (tag), "end" (tag), "empty" (a self-closed start tag), "raw text" (a script's content) or "markup":
    # a comment, declaration, CDATA section or processing instruction, or a construct the fragment leaves unterminated.
    kind: str
    raw: str
    name: str = ""  # a tag's element name, lower case


_WS = "\t\n\f\r "  # HTML's white space (Python's \s would take U+00A0 and others, which HTML keeps in a tag's name)
# A start or end tag: a quoted attribute value may hold ">". Each character has one way to match, so a tag that never
# ends fails in one pass over the rest of the fragment, without backtracking.
_TAG = re.compile(rf"""</?[A-Za-z](?:[^"'>=]|=[{_WS}]*"[^"]*"|=[{_WS}]*'[^']*'|=(?![{_WS}]*["'])|["'])*>""")
_NAME = re.compile(rf"</?([A-Za-z][^{_WS}/>]*)")
_ATTRIBUTE = re.compile(rf"""([^{_WS}/>][^{_WS}/>=]*)(?:[{_WS}]*=[{_WS}]*(?:"([^"]*)"|'([^']*)'|([^{_WS}>]*)))?""")
_DOCTYPE = re.compile("<!doctype", re.IGNORECASE)
_SUBSET_END = re.compile(rf"][{_WS}]*>")
_COMMENT_END = re.compile("--!?>")
# Elements whose content is text up to their own end tag, never markup: a browser reads `<script>a <b> c` to the end as
# script. title's and textarea's content has character references (it is text); the others' is kept as it is.
# plaintext has no end tag: all that follows it is its content.
_ESCAPABLE_RAW_TEXT = frozenset({"title", "textarea"})
_RAW_TEXT = frozenset({"script", "style", "xmp", "iframe", "noembed", "noframes", "plaintext"}) | _ESCAPABLE_RAW_TEXT
_RAW_TEXT_END = {name: re.compile(rf"</{name}[{_WS}/>]", re.IGNORECASE) for name in _RAW_TEXT - {"plaintext"}}


def _tokens(fragment: str) -> Iterator[_Token]:
    """The fragment cut as a browser's tokenizer cuts it, in one pass. What a browser would read to the fragment's end (an
    unclosed script or comment, a tag that never ends) is one token to the end, so no byte is ever left out."""
    at = text_from = 0
    while (lt := fragment.find("<", at)) >= 0:
        token = _construct(fragment, lt)
        if token is None:  # a "<" that starts no markup ("a < b") is text
            at = lt + 1
            continue
        if text_from < lt:
            yield _Token("text", fragment[text_from:lt])
        yield token
        at = text_from = lt + len(token.raw)
        if token.kind == "start" and token.name in _RAW_TEXT:
            closing = _RAW_TEXT_END.get(token.name)
            match = closing.search(fragment, at) if closing else None
            end = match.start() if match else len(fragment)
            if at < end:
                yield _Token("text" if token.name in _ESCAPABLE_RAW_TEXT else "raw text", fragment[at:end])
            at = text_from = end
    if text_from < len(fragment):
        yield _Token("text", fragment[text_from:])


def _construct(fragment: str, at: int) -> _Token | None:
    """The markup starting with the "<" at `at`, or None where that "<" is text."""
    after = fragment[at + 1:at + 2]
    if after in ("!", "?"):
        return _Token("markup", fragment[at:_markup_end(fragment, at)])
    tag = _TAG.match(fragment, at)
    if tag is not None:
        raw = tag.group()
        name = _NAME.match(raw).group(1).lower()
        # A browser ignores "/>" on a raw text element: its content follows in any case.
        kind = "end" if after == "/" else "empty" if raw.endswith("/>") and name not in _RAW_TEXT else "start"
        return _Token(kind, raw, name)
    if _NAME.match(fragment, at):  # a tag that never ends: a browser reads it to the fragment's end
        return _Token("markup", fragment[at:])
    if after == "/" and at + 2 < len(fragment):  # "</>" (ignored by a browser) or "</3" (a bogus comment), up to ">"
        return _Token("markup", fragment[at:_past(fragment, ">", at + 2)])
    return None


def _markup_end(fragment: str, at: int) -> int:
    """Where the comment, declaration, CDATA section or processing instruction starting at `at` ("<!" or "<?") ends: the
    fragment's end where it is not closed."""
    if fragment.startswith("<!--", at):
        if fragment.startswith(("<!-->", "<!--->"), at):  # HTML's shortest comments
            return at + (5 if fragment.startswith("<!-->", at) else 6)
        found = _COMMENT_END.search(fragment, at + 4)
        return found.end() if found else len(fragment)
    if fragment.startswith("<![CDATA[", at):
        return _past(fragment, "]]>", at + 9)
    if _DOCTYPE.match(fragment, at):  # an internal subset ("[ <!ENTITY ...> ]") is part of the declaration
        gt = fragment.find(">", at)
        bracket = fragment.find("[", at, gt) if gt >= 0 else -1
        if bracket < 0:
            return gt + 1 if gt >= 0 else len(fragment)
        found = _SUBSET_END.search(fragment, bracket)
        return found.end() if found else len(fragment)
    return _past(fragment, ">", at + 2)  # a bogus comment, as a browser reads it


def _past(fragment: str, closing: str, at: int) -> int:
    """Just past the first `closing` from `at`, or the fragment's end."""
    found = fragment.find(closing, at)
    return found + len(closing) if found >= 0 else len(fragment)


def _skipped(raw: str) -> bool:
    """Whether a start tag marks its content as not to translate: translate="no" or class="notranslate"."""
    if "translate" not in raw.lower():  # most tags: no attribute to read
        return False
    attributes: dict[str, str] = {}
    for m in _ATTRIBUTE.finditer(raw, len(_NAME.match(raw).group())):
        value = next((v for v in m.groups()[1:] if v is not None), "")
        attributes.setdefault(m.group(1).lower(), html.unescape(value))
    return attributes.get("translate", "").strip().lower() == "no" or "notranslate" in attributes.get("class", "").split()


class _Cutter:
    """Turns a fragment's tokens into a Plan's parts, in one pass: every step's work is bounded by its token's size."""

    def __init__(self) -> None:
        self.parts: list[str | _Block] = []
        self.block: _Block | None = None
        self.open: list[tuple[str, bool]] = []  # elements open, each with whether it (or an ancestor) is left untranslated
        self.opened: Counter[str] = Counter()  # how many of each element are open: a stray end tag is known without a scan
        self.inline: list[tuple[str, int]] = []  # inline elements open in the current block, with their numbers
        self.count = 0

    @property
    def verbatim(self) -> bool:
        return bool(self.open) and self.open[-1][1]

    def feed(self, fragment: str) -> None:
        for token in _tokens(fragment):
            if token.kind == "text":
                self.text(token.raw)
            elif token.kind == "start":
                self.start(token)
            elif token.kind == "end":
                self.end(token)
            else:  # markup, a script's content, a self-closed tag: kept as written
                self.raw(token.raw)

    def raw(self, text: str) -> None:
        self.end_block()
        self.parts.append(text)

    def end_block(self) -> None:
        if self.block is not None:
            self.parts.append(self.block)
        self.block = None
        self.inline = []

    def start(self, token: _Token) -> None:
        tag = token.name
        skip = self.verbatim or tag in VERBATIM or _skipped(token.raw)
        if tag in INLINE and not skip:
            if self.block is None:
                self.block = _Block()
            self.block.nested = self.block.nested or bool(self.inline)
            self.count += 1
            self.inline.append((tag, self.count))
            self.block.items.append(_Tag(token.raw, self.count))
        else:
            self.raw(token.raw)
        if tag not in VOID:
            self.open.append((tag, skip))
            self.opened[tag] += 1

    def end(self, token: _Token) -> None:
        tag = token.name
        if not self.opened[tag]:
            self.raw(token.raw)  # a stray end tag: kept, closing nothing
            return
        while self.open:  # an end tag closes the elements left open inside it, as a browser does
            name, _ = self.open.pop()
            self.opened[name] -= 1
            if name == tag:
                break
        if self.inline and self.inline[-1][0] == tag and self.block is not None:
            self.block.items.append(_Tag(token.raw, self.inline.pop()[1], closing=True))
        else:
            self.raw(token.raw)  # ends the block, and with it the inline elements this tag closed

    def text(self, raw: str) -> None:
        if self.verbatim:
            self.raw(raw)
            return
        if self.block is None:
            if not raw.strip():
                self.parts.append(raw)
                return
            self.block = _Block()
        self.block.items.append(_Run(html.unescape(raw), raw, self.inline[-1][1] if self.inline else None))


def plan(fragment: str) -> Plan:
    """The fragment cut into markup kept as it is and blocks of text to translate."""
    cutter = _Cutter()
    cutter.feed(fragment)
    cutter.end_block()
    return Plan(cutter.parts)


def render(p: Plan, translated: dict[str, str]) -> str:
    """The fragment with each block's text replaced by its translation (`translated`: text -> translation, for
    every text of p.texts())."""
    out = []
    for part in p.parts:
        out.append(part if isinstance(part, str) else _block(part, translated))
    return "".join(out)


def translate_html(fragments: Sequence[str], translate: Callable[[list[str]], list[str]]) -> list[str]:
    """Each fragment with its text translated; `translate` gets every text of every fragment once, in one call, and
    gives their translations in order."""
    plans = [plan(f) for f in fragments]
    texts = list(dict.fromkeys(t for p in plans for t in p.texts()))
    translated = dict(zip(texts, translate(texts))) if texts else {}
    return [render(p, translated) for p in plans]


def prose(text: str) -> bool:
    """Whether a text has words to translate: one with no letter (punctuation, a number) is kept as it is."""
    return any(c.isalpha() for c in text)


def _translation(text: str, translated: dict[str, str]) -> str:
    """A text's translation, or the text itself (cleaned) where it has no words."""
    return translated.get(_clean(text), "") if prose(text) else _clean(text)


def _clean(text: str) -> str:
    """A text as the model should see it: HTML's runs of white space are one space."""
    return SPACES.sub(" ", text).strip()


def _padded(text: str, translation: str) -> str:
    """The translation of a text node with the node's own leading and trailing white space, escaped as HTML text."""
    lead = text[: len(text) - len(text.lstrip())]
    trail = text[len(text.rstrip()):] if text.strip() else ""
    return lead + html.escape(translation, quote=False) + trail


def _block(b: _Block, translated: dict[str, str]) -> str:
    if _translation(b.text(), translated) == b.text():  # nothing to change: its character references and spacing stay
        return b.source()
    whole = _whole(b, translated)
    return whole if whole is not None else _run_by_run(b, translated)


def _whole(b: _Block, translated: dict[str, str]) -> str | None:
    """The block's translation with its inline elements around their own words, or None where that cannot be done."""
    tags = _element_tags(b)
    if b.nested or any(not end for _, end in tags.values()):  # an element left open runs on past the block
        return None
    target = _translation(b.text(), translated)
    wanted = [(element, _translation(text, translated).strip()) for element, text in b.elements().items() if _clean(text)]
    spans = _placed(target, wanted)
    if spans is None:
        return None
    out, at = [], 0
    for start, end, element in sorted(spans):
        out += [html.escape(target[at:start], quote=False), tags[element][0], html.escape(target[start:end], quote=False), tags[element][1]]
        at = end
    out.append(html.escape(target[at:], quote=False))
    # What comes before the block's first word and after its last (white space, an inline element with no text of its own
    # such as <a name="x"></a>) stays there as written; such an element between words goes before the translated words.
    placed = {s[2] for s in spans}
    words = [k for k, item in enumerate(b.items) if isinstance(item, _Run) and item.text.strip()]
    head, tail = b.items[: words[0]], b.items[words[-1] + 1:]
    edges = {i.element for i in head + tail if isinstance(i, _Tag)}
    empty = "".join(start + end for k, (start, end) in tags.items() if k not in placed and k not in edges)
    first, last = b.items[words[0]].text, b.items[words[-1]].text
    lead, trail = first[: len(first) - len(first.lstrip())], last[len(last.rstrip()):]
    return _unplaced(head, placed) + empty + lead + "".join(out) + trail + _unplaced(tail, placed)


def _unplaced(items: list[_Tag | _Run], placed: set[int]) -> str:
    """Items as written, less the tags of the elements placed around their words."""
    return "".join(i.raw for i in items if isinstance(i, _Run) or i.element not in placed)


# Up to this many inline elements of a block are looked for in the translation in any order (a translation may swap two
# of them); beyond, in their written order, one pass over the translation, so that a block of thousands costs linear time.
FREE_ORDER = 8


def _placed(target: str, wanted: list[tuple[int, str]]) -> list[tuple[int, int, int]] | None:
    """(start, end, element) of each inline element's words (wanted: each element with its translation) in the block's
    translation, or None where one is not found."""
    folded = target.casefold()
    if len(folded) != len(target):  # casefold changed the length (ß -> ss): positions would not map back
        folded = None
    if len(wanted) > FREE_ORDER:
        return _in_order(target, folded, wanted)
    spans: list[tuple[int, int, int]] = []
    for element, words in wanted:
        found = _find(target, folded, words, spans)
        if found is None:
            return None
        spans.append((*found, element))
    return spans


def _in_order(target: str, folded: str | None, wanted: list[tuple[int, str]]) -> list[tuple[int, int, int]] | None:
    """Each element's words found after the previous element's (ignoring case where that keeps positions)."""
    haystack = target if folded is None else folded
    spans, at = [], 0
    for element, words in wanted:
        needle = words if folded is None else words.casefold()
        start = haystack.find(needle, at) if needle else -1
        if start < 0:
            return None
        at = start + len(needle)
        spans.append((start, at, element))
    return spans


def _find(target: str, folded: str | None, words: str, taken: list[tuple[int, int, int]]) -> tuple[int, int] | None:
    """Where words first occur in target outside the spans taken (exactly, else ignoring case: folded is target.casefold(),
    None where that has another length), else where their words do (_same_words)."""
    if not words:
        return None
    for haystack, needle in ((target, words), (folded, words.casefold())):
        if haystack is None:
            break
        start = haystack.find(needle)
        while start >= 0:
            end = start + len(needle)
            if all(end <= s or start >= e for s, e, _ in taken):
                return start, end
            start = haystack.find(needle, start + 1)
    return _same_words(target, words, taken)


_WORD = re.compile(r"\w+")


def _same_words(target: str, words: str, taken: list[tuple[int, int, int]]) -> tuple[int, int] | None:
    """The first run of target's words, outside the spans taken, that holds each word of `words` and no other (any case,
    any order, repeats aside); None if there is none. A word or two translated alone can come out repeated or
    reordered ("world" -> "le monde monde monde le monde", "red" -> "rouge rouge rouge") where the whole sentence
    translates well ("Salut le monde."): the element then goes around "le monde" rather than the block being translated
    text node by text node, with the repeats."""
    mine = {w.casefold() for w in _WORD.findall(words)}
    found = [(m.start(), m.end(), m.group().casefold()) for m in _WORD.finditer(target)]
    i = 0
    while i < len(found):
        j = i
        # A run's words follow one another with nothing but spaces, apostrophes or hyphens between them ("dog. small",
        # across a full stop, is two runs).
        while j < len(found) and found[j][2] in mine and (j == i or not target[found[j - 1][1]:found[j][0]].strip(" '’-")):
            j += 1
        start, end = (found[i][0], found[j - 1][1]) if j > i else (0, 0)
        if j > i and {w for *_, w in found[i:j]} == mine and all(end <= s or start >= e for s, e, _ in taken):
            return start, end
        i = max(j, i + 1)
    return None


def _element_tags(b: _Block) -> dict[int, tuple[str, str]]:
    """Each inline element's raw start tag and its end tag ("" where the fragment left it open)."""
    out: dict[int, tuple[str, str]] = {}
    for item in b.items:
        if isinstance(item, _Tag):
            start, end = out.get(item.element, ("", ""))
            out[item.element] = (start, item.raw) if item.closing else (item.raw, end)
    return out


def _run_by_run(b: _Block, translated: dict[str, str]) -> str:
    """Every text node translated alone, between the block's tags as they were."""
    out = []
    for item in b.items:
        if isinstance(item, _Tag):
            out.append(item.raw)
            continue
        translation = _translation(item.text, translated)
        # A text left as it was (no words, or the model kept it) keeps its spelling too.
        out.append(item.raw if translation == _clean(item.text) else _padded(item.text, translation))
    return "".join(out)


def translate_html_lines(t, lines: Iterable[tuple[int, str]], write: Callable[[str], None], opts, strict: bool = False,
                         warn: Callable[[str], None] = lambda s: None, progress: Callable[[int], None] = lambda n: None,
                         text=None, chunk_lines: int = 256):
    """translate_lines for HTML fragments, one per line (`tk translate --format html`): each chunk's texts are translated
    in one translate_batch, and its warnings and counts name the input line a text came from."""
    from toolkit.deploy.translate import Stats, TextOptions, chunks, one_line, translate_batch

    stats = Stats()
    start = time.perf_counter()
    backend = t.backend()
    for chunk in chunks(lines, chunk_lines):
        plans = [plan(fragment) for _, fragment in chunk]
        owner: dict[str, int] = {}
        for (lineno, _), p in zip(chunk, plans):
            for x in p.texts():
                owner.setdefault(x, lineno)
        texts = list(owner)
        source = list(owner.values())  # texts[k]'s input line
        found: dict[str, list[int]] = {"truncated": [], "guarded": [], "repaired": [], "failed": []}

        results = translate_batch(t, texts, opts, backend, _renumbered(warn, source), strict, 1, found["truncated"], text or TextOptions(),
                                  found["guarded"], found["repaired"], found["failed"]) if texts else []
        for name, numbers in found.items():
            getattr(stats, name).extend(sorted({source[k - 1] for k in numbers} - set(getattr(stats, name))))
        translated = {x: nbest[0].text for x, nbest in zip(texts, results)}
        for p in plans:
            write(one_line(render(p, translated)))
        stats.sentences += sum(nbest[0].sentences for nbest in results)
        stats.target_tokens += sum(nbest[0].tokens for nbest in results)
        stats.lines += len(chunk)
        progress(len(chunk))
    stats.seconds = time.perf_counter() - start
    return stats


def _renumbered(warn: Callable[[str], None], source: list[int]) -> Callable[[str], None]:
    """translate_batch's warnings, which number its texts from 1, naming the input line each text came from."""
    return lambda message: warn(re.sub(r"^warning: line (\d+)", lambda m: f"warning: line {source[int(m.group(1)) - 1]}", message))
