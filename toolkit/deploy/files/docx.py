"""Word documents (.docx, read by python-docx): every paragraph of the body, its tables, text boxes, headers, footers,
footnotes and endnotes. A paragraph's runs are written as inline elements of an HTML fragment for markup.plan/render,
so a bold or italic run stays on the words it is the translation of; what is not text stays where it was."""

from __future__ import annotations

import copy
import html
import io
import itertools
import re

from toolkit.core.errors import DataError, UsageError, first_line
from toolkit.deploy import markup
from toolkit.deploy.files.document import Document
from toolkit.deploy.files.kinds import INSTALL
from toolkit.deploy.files.safety import Limits, check_package
from toolkit.deploy.files.text import unique

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
P, R, T, RPR, PPR = _W + "p", _W + "r", _W + "t", _W + "rPr", _W + "pPr"
# What a run holds that is text (a rendered page break is a layout cache Word rewrites; a soft hyphen a place to break a
# word that the translation no longer has: both are dropped from a translated run).
_TEXT = {T, _W + "lastRenderedPageBreak", _W + "softHyphen"}
# Elements that wrap runs inside a paragraph and whose text flows with it: a link, a simple field, a smart tag, a tracked
# insertion, custom XML, a direction override. Each becomes an inline element of the paragraph's fragment.
_CONTAINERS = {_W + n for n in ("hyperlink", "fldSimple", "smartTag", "ins", "customXml", "dir", "bdo")}
_CONTAINER_PROPERTIES = {_W + n for n in ("smartTagPr", "customXmlPr")}
# Marks with no text of their own (bookmarks, comment ranges, spelling marks): they do not cut a sentence.
_MARKS = {_W + n for n in ("bookmarkStart", "bookmarkEnd", "proofErr", "commentRangeStart", "commentRangeEnd", "permStart", "permEnd",
                           "moveFromRangeStart", "moveFromRangeEnd", "moveToRangeStart", "moveToRangeEnd")}
_SDT, _SDT_CONTENT = _W + "sdt", _W + "sdtContent"
_CONTENT_TYPES = ("document.main+xml", "header+xml", "footer+xml", "footnotes+xml", "endnotes+xml")
_PIECE = re.compile(r'<span id="(r\d+)">|</span>|<a id="(c\d+)">|</a>')
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")  # characters XML 1.0 cannot hold


def _import_docx():
    try:
        import docx
        from docx.opc.part import PartFactory, XmlPart
    except ImportError:
        raise UsageError(f"translating a .docx needs python-docx; install it: {INSTALL}") from None
    # Footnotes and endnotes are parsed into XML (python-docx keeps them as bytes otherwise), so their text is translated.
    from docx.opc.constants import CONTENT_TYPE as CT

    for content_type in (CT.WML_FOOTNOTES, CT.WML_ENDNOTES):
        PartFactory.part_type_for.setdefault(content_type, XmlPart)
    return docx


def read_docx(data: bytes, name: str, limits: Limits) -> Document:
    docx = _import_docx()
    check_package(data, name, limits)
    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as e:  # python-docx raises KeyError, ValueError, lxml's errors and its own on a broken package
        raise DataError(f"{name} is not a readable .docx ({type(e).__name__}: {first_line(e)}); save it again from Word as .docx") from None
    blocks: list[tuple[_Block, str]] = []
    for part in document.part.package.iter_parts():
        if part.content_type.endswith(_CONTENT_TYPES) and hasattr(part, "element"):
            for n, paragraph in enumerate(list(part.element.iter(P)), 1):
                blocks += [(b, f"{part.partname.lstrip('/')} paragraph {n}") for b in _blocks(paragraph)]
    texts, places = unique([t for b, _ in blocks for t in b.plan.texts()], [p for b, p in blocks for _ in b.plan.texts()])

    def write(translated: dict[str, str]) -> bytes:
        for block, _ in blocks:
            block.apply(translated)
        out = io.BytesIO()
        document.save(out)
        return out.getvalue()

    return Document(name, "docx", texts, places, write)


def _is_text_run(run) -> bool:
    return all(c.tag in _TEXT or c.tag == RPR for c in run)


def _run_text(run) -> str:
    return "".join(t.text or "" for t in run.findall(T))


def _key(run) -> bytes:
    """A run's formatting: runs of equal formatting are one span of the fragment."""
    from lxml import etree

    properties = run.find(RPR)
    return b"" if properties is None else etree.tostring(properties)


def _split_mixed(run) -> list:
    """A run that holds text and something else (a tab, a break, a picture) cut into runs of one or the other, each with the
    run's formatting, in place: only the text is translated, the rest stays where it was."""
    content = [c for c in run if c.tag != RPR]
    groups = [(is_text, list(g)) for is_text, g in itertools.groupby(content, lambda c: c.tag in _TEXT)]
    if len(groups) < 2:
        return [run]
    properties, parent = run.find(RPR), run.getparent()
    at = parent.index(run)
    pieces = []
    for _, children in groups:
        piece = run.makeelement(run.tag, run.attrib)
        if properties is not None:
            piece.append(copy.deepcopy(properties))
        piece.extend(children)  # moved, not copied: a text box's paragraphs inside a drawing stay the same elements
        pieces.append(piece)
    parent.remove(run)
    for k, piece in enumerate(pieces):
        parent.insert(at + k, piece)
    return pieces


def _simple(container) -> bool:
    """A container of text runs only (with marks and its own properties): one inline element of the fragment."""
    for child in list(container):
        if child.tag == R:
            _split_mixed(child)
    return any(c.tag == R for c in container) and all(
        (c.tag == R and _is_text_run(c)) or c.tag in _MARKS or c.tag in _CONTAINER_PROPERTIES for c in container)


def _blocks(parent) -> list[_Block]:
    """The paragraph's (or a container's) runs of text between the things that are not text, each a _Block."""
    blocks: list[_Block] = []
    units: list = []

    def close() -> None:
        if any(_run_text(r).strip() for u in units for r in ([u] if u.tag == R else u.iter(R))):
            blocks.append(_Block(list(units)))
        units.clear()

    for child in list(parent):
        if child.tag == R:
            for piece in _split_mixed(child):
                if _is_text_run(piece):
                    units.append(piece)
                else:
                    close()
        elif child.tag in _CONTAINERS and _simple(child):
            units.append(child)
        elif child.tag in _MARKS or child.tag == PPR:
            continue
        else:  # a tab's run, a picture, a field's code, a deletion, a content control: the text on each side stands alone
            close()
            inner = child.find(_SDT_CONTENT) if child.tag == _SDT else child if child.tag in _CONTAINERS else None
            if inner is not None:
                blocks += _blocks(inner)
    close()
    return blocks


def _base_key(runs: list) -> bytes | None:
    """The formatting of most of the runs' text: written as plain text in the fragment, the others as spans."""
    chars: dict[bytes, int] = {}
    for r in runs:
        chars[_key(r)] = chars.get(_key(r), 0) + len(_run_text(r))
    return max(chars, key=chars.get) if chars else None


class _Block:
    """Consecutive runs and containers of one paragraph, as an HTML fragment that markup translates: each run whose
    formatting is not the block's main one is a <span>, each container an <a>; then written back from the rendered
    fragment, each piece of text in a copy of the run (and container) it belongs to."""

    def __init__(self, units: list):
        self.units = units
        self.templates: dict[str, object] = {}
        direct = [u for u in units if u.tag == R]
        base = _base_key(direct)
        plain = next((r for r in direct if _key(r) == base), None)
        self.templates["b"] = plain if plain is not None else next(units[0].iter(R))
        out = []
        for is_run, group in itertools.groupby(units, lambda u: u.tag == R):
            if is_run:
                out.append(self._runs(list(group), base))
                continue
            for container in group:
                ident = f"c{len(self.templates)}"
                runs = container.findall(R)
                inner = _base_key(runs)
                self.templates[ident] = container
                self.templates[ident + "b"] = next(r for r in runs if _key(r) == inner)
                out.append(f'<a id="{ident}">{self._runs(runs, inner)}</a>')
        self.fragment = "".join(out)
        self.plan = markup.plan(self.fragment)

    def _runs(self, runs: list, base: bytes | None) -> str:
        out = []
        for key, group in itertools.groupby(runs, _key):
            group = list(group)
            text = html.escape("".join(_run_text(r) for r in group), quote=False)
            if key == base:
                out.append(text)
            else:
                ident = f"r{len(self.templates)}"
                self.templates[ident] = group[0]
                out.append(f'<span id="{ident}">{text}</span>')
        return "".join(out)

    def apply(self, translated: dict[str, str]) -> None:
        """Replaces the block's runs and containers by their translation."""
        rendered = markup.render(self.plan, translated)
        if rendered == self.fragment:
            return
        new = self._rebuilt(rendered)
        parent = self.units[0].getparent()
        at = parent.index(self.units[0])
        for unit in self.units:
            parent.remove(unit)
        for k, element in enumerate(new):
            parent.insert(at + k, element)

    def _rebuilt(self, rendered: str) -> list:
        out: list = []
        container, container_id, run_id = None, None, None

        def text(s: str) -> None:
            s = html.unescape(s)
            if not s:
                return
            template = self.templates[run_id or (container_id + "b" if container_id else "b")]
            (container if container is not None else out).append(_run_like(template, s))

        at = 0
        for m in _PIECE.finditer(rendered):
            text(rendered[at:m.start()])
            at = m.end()
            if m.group(1):
                run_id = m.group(1)
            elif m.group(2):
                container_id = m.group(2)
                container = _container_like(self.templates[container_id])
                out.append(container)
            elif m.group() == "</span>":
                run_id = None
            else:
                container, container_id = None, None
        text(rendered[at:])
        return out


def _run_like(template, text: str):
    """A run with the template's attributes and formatting, holding text."""
    run = template.makeelement(template.tag, template.attrib)
    properties = template.find(RPR)
    if properties is not None:
        run.append(copy.deepcopy(properties))
    t = run.makeelement(T, {_XML_SPACE: "preserve"})
    t.text = _NOT_XML.sub("", text)
    run.append(t)
    return run


def _container_like(template):
    """A container (a hyperlink, a field) with the template's attributes and properties, and no runs yet."""
    container = template.makeelement(template.tag, template.attrib)
    container.extend(copy.deepcopy(c) for c in template if c.tag in _CONTAINER_PROPERTIES)
    return container
