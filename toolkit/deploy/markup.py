"""Translating the text of an HTML fragment while keeping its markup in place (`format="html"`).

Parsed with Python's own html.parser (the standard library's HTML tokenizer, kept with CPython; no dependency to add):
start tags, comments and declarations are put back exactly as they came (get_starttag_text), end tags as `</name>`.
Only text is translated. The fragment is cut into blocks at every tag that is not an inline element (p, li, td, br,
img, ...), and each block's text is translated whole, so a sentence keeps its words together across `<b>` or `<a>`.
The inline elements of a block (each holding text only) are put back around their own words: each one's text is
translated alone too, and found in the block's translation. Where one is not found there (the model put it otherwise),
or inline elements nest, the block is translated text run by text run instead, which keeps every element in place at
some cost to the translation. The content of script, style, code, kbd, samp, var, pre and textarea, and of any
element marked translate="no" (HTML's own attribute) or class="notranslate", is not translated; attributes are
never translated. Entities are decoded for translation and the output is escaped again (`&amp;` stays `&amp;`; a
named character such as `&eacute;` comes back as the character itself, which is the same HTML).

Translation is the caller's: `plan(fragment)` lists the texts to translate, `render(plan, translated)` writes the
fragment back from their translations, and translate_html does both with one callable. Torch-free.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser

# Elements that flow inside a sentence: their text belongs to the surrounding block's text.
INLINE = frozenset({"a", "abbr", "b", "bdi", "bdo", "cite", "data", "dfn", "em", "font", "i", "ins", "del", "mark", "q",
                    "s", "small", "span", "strong", "sub", "sup", "time", "u", "label"})
# Elements whose content is not prose to translate.
VERBATIM = frozenset({"script", "style", "code", "kbd", "samp", "var", "pre", "textarea"})
# Elements with no end tag (html.parser reports no end tag for <br>; a stray </br> would close nothing).
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"})
SPACES = re.compile(r"\s+")


@dataclass
class _Run:
    """A text node of a block: its text, and the inline element it is in (None: directly in the block)."""

    text: str
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
            if isinstance(b, _Block) and _prose(b.text()):
                seen[b.text()] = None
                for r in b.runs():
                    if _prose(r.text):
                        seen[_clean(r.text)] = None
        return list(seen)


class _Cutter(HTMLParser):
    """Turns html.parser's events into a Plan's parts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str | _Block] = []
        self.block: _Block | None = None
        self.open: list[tuple[str, bool]] = []  # elements open, each with whether it (or an ancestor) is left untranslated
        self.inline: list[tuple[str, int]] = []  # inline elements open in the current block, with their numbers
        self.count = 0

    @property
    def verbatim(self) -> bool:
        return bool(self.open) and self.open[-1][1]

    def raw(self, text: str) -> None:
        self.end_block()
        self.parts.append(text)

    def end_block(self) -> None:
        if self.block is not None:
            self.parts.append(self.block)
        self.block = None
        self.inline = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        raw = self.get_starttag_text() or f"<{tag}>"
        attributes = dict(attrs)
        skip = (self.verbatim or tag in VERBATIM or (attributes.get("translate") or "").lower() == "no"
                or "notranslate" in (attributes.get("class") or "").split())
        if tag in INLINE and not skip and not self.verbatim:
            if self.block is None:
                self.block = _Block()
            self.block.nested = self.block.nested or bool(self.inline)
            self.count += 1
            self.inline.append((tag, self.count))
            self.block.items.append(_Tag(raw, self.count))
        else:
            self.raw(raw)
        if tag not in VOID:
            self.open.append((tag, skip))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.raw(self.get_starttag_text() or f"<{tag}/>")

    def handle_endtag(self, tag: str) -> None:
        if not any(name == tag for name, _ in self.open):
            self.raw(f"</{tag}>")  # a stray end tag: kept, closing nothing
            return
        while self.open:  # an end tag closes the elements left open inside it, as a browser does
            name, _ = self.open.pop()
            if name == tag:
                break
        if self.inline and self.inline[-1][0] == tag and self.block is not None:
            self.block.items.append(_Tag(f"</{tag}>", self.inline.pop()[1], closing=True))
        else:
            self.inline = [(n, k) for n, k in self.inline if n != tag]
            self.raw(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        if self.verbatim:
            last = self.open[-1][0]
            self.raw(data if last in ("script", "style") else html.escape(data, quote=False))
            return
        if self.block is None:
            if not data.strip():
                self.parts.append(html.escape(data, quote=False))
                return
            self.block = _Block()
        self.block.items.append(_Run(data, self.inline[-1][1] if self.inline else None))

    def handle_comment(self, data: str) -> None:
        self.raw(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.raw(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self.raw(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self.raw(f"<![{data}]>")


def plan(fragment: str) -> Plan:
    """The fragment cut into markup kept as it is and blocks of text to translate."""
    cutter = _Cutter()
    cutter.feed(fragment)
    cutter.close()
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


def _prose(text: str) -> bool:
    """Whether a text has words to translate: one with no letter (punctuation, a number) is kept as it is."""
    return any(c.isalpha() for c in text)


def _translation(text: str, translated: dict[str, str]) -> str:
    """A text's translation, or the text itself (cleaned) where it has no words."""
    return translated.get(_clean(text), "") if _prose(text) else _clean(text)


def _clean(text: str) -> str:
    """A text as the model should see it: HTML's runs of white space are one space."""
    return SPACES.sub(" ", text).strip()


def _padded(text: str, translation: str) -> str:
    """The translation of a text node with the node's own leading and trailing white space, escaped as HTML text."""
    lead = text[: len(text) - len(text.lstrip())]
    trail = text[len(text.rstrip()):] if text.strip() else ""
    return lead + html.escape(translation, quote=False) + trail


def _block(b: _Block, translated: dict[str, str]) -> str:
    whole = _whole(b, translated)
    return whole if whole is not None else _run_by_run(b, translated)


def _whole(b: _Block, translated: dict[str, str]) -> str | None:
    """The block's translation with its inline elements around their own words, or None where that cannot be done."""
    tags = _element_tags(b)
    if b.nested or any(not end for _, end in tags.values()):  # an element left open runs on past the block
        return None
    runs = b.runs()
    target = _translation(b.text(), translated)
    spans: list[tuple[int, int, int]] = []  # (start, end, element) in the block's translation
    for element, text in b.elements().items():
        if not _clean(text):
            continue
        words = _translation(text, translated).strip()
        found = _find(target, words, spans)
        if found is None:
            return None
        spans.append((*found, element))
    out, at = [], 0
    for start, end, element in sorted(spans):
        out += [html.escape(target[at:start], quote=False), tags[element][0], html.escape(target[start:end], quote=False), tags[element][1]]
        at = end
    out.append(html.escape(target[at:], quote=False))
    full = "".join(r.text for r in runs)
    lead = full[: len(full) - len(full.lstrip())]
    trail = full[len(full.rstrip()):]
    # An inline element with no text of its own (<a name="x"></a>) keeps its place at the start of the block.
    placed = {s[2] for s in spans}
    empty = "".join(start + end for k, (start, end) in tags.items() if k not in placed)
    return lead + empty + "".join(out) + trail


def _find(target: str, words: str, taken: list[tuple[int, int, int]]) -> tuple[int, int] | None:
    """Where words first occur in target outside the spans taken (exactly, else ignoring case)."""
    if not words:
        return None
    for haystack, needle in ((target, words), (target.casefold(), words.casefold())):
        if len(haystack) != len(target):  # casefold changed the length (ß -> ss): positions would not map back
            return None
        start = haystack.find(needle)
        while start >= 0:
            end = start + len(needle)
            if all(end <= s or start >= e for s, e, _ in taken):
                return start, end
            start = haystack.find(needle, start + 1)
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
        elif _prose(item.text):
            out.append(_padded(item.text, _translation(item.text, translated)))
        else:
            out.append(html.escape(item.text, quote=False))
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
