"""Translating whole files with their structure kept: plain text, HTML, Word documents (.docx) and subtitles (.srt).

`read_file(path)` checks a file and cuts it into a Document: the texts it needs translated (each once, in order, with
where each comes from) and how to write it back; `Document.render(translations)` gives the translated file's bytes and
`Document.save(path, translations)` writes them. `translate_file` does all three around one translate callable (texts in,
their translations out, in order), which is how `tk translate -i FILE` and tk serve's /translate_file use it.

What each kind keeps:
- .txt: every line, its line ending and its indentation; each non-blank line is one text (the line translation splits it
  into sentences).
- .html/.htm: the whole document through toolkit.deploy.markup (markup kept byte for byte, only text translated).
- .docx (python-docx): every paragraph of the body, its tables (nested ones too), text boxes, headers, footers, footnotes
  and endnotes. A paragraph's runs are written as inline elements of an HTML fragment for markup.plan/render, so a bold or
  italic run stays on the words it is the translation of; a hyperlink keeps its link, a field its code, and anything
  that is not text (a tab, a break, a picture, a field's instruction) stays where it was, the text on each side of it
  translated apart.
- .srt (the srt library): each subtitle's text; its index, timing and every byte around the text stay as they were. A
  subtitle of several lines is translated as one sentence and cut back into as many lines, of shares like the original's;
  one whose lines each start with a dash (a dialogue) is translated line by line.

Files are untrusted input, refused with a one-line UsageError before any heavy work: one over its size limit (Limits); a
.docx whose zip directory, read before anything is unpacked, declares too many entries, too many bytes unpacked, or an
entry that unpacks to over Limits.ratio times its packed size (a zip bomb); one with a DTD in any XML part (entity
expansion: a .docx never has one, and no parser here resolves entities or reads the network); one with an external
relationship other than a hyperlink (an attached template or linked picture that Word would fetch on opening the
translation; a hyperlink's address is only kept, never fetched). A file that cannot be read is a DataError naming the file
and the place (the part and line of a .docx, the line of an .srt, the byte of invalid UTF-8). Output is written
atomically (core.atomic), never over the input. Torch-free; python-docx and srt are imported only for their kinds.
"""

from __future__ import annotations

import codecs
import copy
import html
import io
import itertools
import os
import re
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.core.atomic import write_atomic
from toolkit.core.errors import DataError, UsageError, describe_os_error, first_line, os_failure
from toolkit.deploy import markup

MiB = 2**20
KINDS = {".txt": "txt", ".html": "html", ".htm": "html", ".docx": "docx", ".srt": "srt"}
SUPPORTED = tuple(KINDS)  # the file name extensions translated, as LibreTranslate's supportedFilesFormat lists them
MEDIA_TYPES = {"txt": "text/plain; charset=utf-8", "html": "text/html; charset=utf-8", "srt": "application/x-subrip",
               "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document"}
INSTALL = "pip install 'tk-onnx-deploy[files]'"
CHUNK_TEXTS = 256  # texts handed to the translate callable at a time by translate_file


@dataclass(frozen=True)
class Limits:
    """What a file may be before it is refused unread."""

    text_bytes: int = 5 * MiB  # a .txt, .html or .srt file (a feature film's subtitles are about 100 kB)
    docx_bytes: int = 20 * MiB  # a .docx file as stored
    unzipped_bytes: int = 100 * MiB  # all the entries of a .docx, unpacked, as its zip directory declares them
    ratio: float = 100.0  # an entry's unpacked size over its packed size (Word's XML packs about 10 to 1)
    ratio_from: int = 1 * MiB  # the ratio is checked on entries that unpack to more than this
    entries: int = 5000  # entries in a .docx

    def of(self, kind: str) -> int:
        return self.docx_bytes if kind == "docx" else self.text_bytes


def kind_of(path: str | Path, kind: str | None = None) -> str:
    """The kind of a file ("txt", "html", "docx", "srt"): `kind` where given, else the file's extension."""
    if kind is not None:
        if kind not in MEDIA_TYPES:
            raise UsageError(f"unknown file kind {kind!r}; give one of {', '.join(sorted(MEDIA_TYPES))}")
        return kind
    suffix = Path(path).suffix.lower()
    if suffix not in KINDS:
        what = f"a {suffix} file" if suffix else "a file without an extension"
        raise UsageError(f"{Path(path).name}: cannot translate {what}; tk translates {', '.join(SUPPORTED)} files")
    return KINDS[suffix]


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
        return self.write({t: _one_line(x) for t, x in zip(self.texts, translations)})

    def save(self, dst: str | Path, translations: Sequence[str]) -> None:
        """Writes the translated file to dst atomically: dst is the whole translation or what it was before."""
        data = self.render(translations)
        try:
            write_atomic(dst, data, user_path=True)
        except OSError as e:
            raise os_failure(f"cannot write {dst}: {describe_os_error(e)}", e) from None


def read_file(src: str | Path, kind: str | None = None, limits: Limits = Limits(), name: str | None = None) -> Document:
    """The file checked and cut into a Document. `name`: how messages call the file (a server names the client's upload,
    not its own copy)."""
    src = Path(src)
    name = name or str(src)
    kind = kind_of(name if kind is None else src, kind)
    try:
        size = os.stat(src).st_size
        if not src.is_file():
            raise UsageError(f"{name} is not a regular file; give a file")
    except OSError as e:
        raise os_failure(f"cannot read {name}: {describe_os_error(e)}", e) from None
    limit = limits.of(kind)
    if size > limit:
        raise UsageError(f"{name} is {size:,} bytes, over the {limit:,}-byte limit for .{kind} files; split it into smaller files")
    try:
        with open(src, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise os_failure(f"cannot read {name}: {describe_os_error(e)}", e) from None
    if len(data) > limit:  # it grew since the stat
        raise UsageError(f"{name} is over the {limit:,}-byte limit for .{kind} files; split it into smaller files")
    return _READERS[kind](data, name, limits)


def check_destination(src: str | Path, dst: str | Path) -> None:
    """Refuses an output that is the input file itself: a failed or partial translation must never cost the original."""
    try:
        same = os.path.samefile(src, dst)
    except OSError:  # the output does not exist yet
        same = os.path.realpath(src) == os.path.realpath(dst)
    if same:
        raise UsageError(f"the output {dst} is the input file; write the translation to another file")


def translate_all(texts: Sequence[str], translate: Callable[[list[str]], list[str]], chunk: int = CHUNK_TEXTS) -> list[str]:
    """Every text's translation, asking `translate` for `chunk` texts at a time."""
    out: list[str] = []
    for at in range(0, len(texts), chunk):
        part = list(texts[at:at + chunk])
        got = list(translate(part))
        if len(got) != len(part):
            raise ValueError(f"the translator gave {len(got)} translations for {len(part)} texts")
        out += got
    return out


def translate_file(src: str | Path, dst: str | Path, translate: Callable[[list[str]], list[str]], kind: str | None = None,
                   limits: Limits = Limits()) -> Document:
    """Translates file src into dst with `translate` (texts in, their translations out, in order), keeping its structure;
    the kind is src's extension unless given. Returns the Document translated (its texts and their places)."""
    check_destination(src, dst)
    document = read_file(src, kind, limits)
    document.save(dst, translate_all(document.texts, translate))
    return document


# Text --------------------------------------------------------------------------------------------------------------

_LINE_END = re.compile(r"(\r\n|\r|\n)")
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")  # characters XML 1.0 cannot hold


def _one_line(text: str) -> str:
    """A translation as one line: a tokenizer's byte pieces can spell a line break, which would break a file's structure."""
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def _decode(data: bytes, name: str) -> tuple[str, bytes]:
    """The file's text and its byte order mark (kept on output); invalid UTF-8 is a DataError naming its line."""
    bom = codecs.BOM_UTF8 if data.startswith(codecs.BOM_UTF8) else b""
    try:
        return data[len(bom):].decode("utf-8"), bom
    except UnicodeDecodeError as e:
        start = e.start + len(bom)
        line = data[:start].count(b"\n") + 1
        raise DataError(f"{name} line {line} is not valid UTF-8 (byte {start}); convert the file to UTF-8") from None


def _unique(texts: list[str], places: list[str]) -> tuple[list[str], list[str]]:
    """Each text once (the first place it comes from)."""
    first: dict[str, str] = {}
    for t, p in zip(texts, places):
        first.setdefault(t, p)
    return list(first), list(first.values())


def _read_txt(data: bytes, name: str, limits: Limits) -> Document:
    text, bom = _decode(data, name)
    parts = _LINE_END.split(text)  # line, ending, line, ending, ..., last line
    lines = parts[0::2]
    texts, places = _unique([x.strip() for x in lines if x.strip()], [f"line {k}" for k, x in enumerate(lines, 1) if x.strip()])

    def write(translated: dict[str, str]) -> bytes:
        out = []
        for k, part in enumerate(parts):
            if k % 2 or not part.strip():  # a line ending, or a blank line
                out.append(part)
            else:
                lead, trail = part[: len(part) - len(part.lstrip())], part[len(part.rstrip()):]
                out.append(lead + translated[part.strip()] + trail)
        return bom + "".join(out).encode("utf-8")

    return Document(name, "txt", texts, places, write)


def _read_html(data: bytes, name: str, limits: Limits) -> Document:
    text, bom = _decode(data, name)
    plan = markup.plan(text)
    texts = plan.texts()
    return Document(name, "html", texts, [f"text {k}" for k in range(1, len(texts) + 1)],
                    lambda translated: bom + markup.render(plan, translated).encode("utf-8"))


# Subtitles ---------------------------------------------------------------------------------------------------------

_DASH = re.compile(r"^\s*[-\u2013\u2014]\s*")  # a dialogue line's speaker dash
_CODES = re.compile(r"^(?:\{\\[^}]*\})+")  # leading positioning codes such as {\an8}
_TAG = re.compile(r"</?[A-Za-z][^>]*>")


def _import_srt():
    try:
        import srt
    except ImportError:
        raise UsageError(f"translating .srt subtitles needs the srt library; install it: {INSTALL}") from None
    return srt


class _Subtitle:
    """A subtitle's text: its units (one text of one or several lines, or each line of a dialogue) cut by markup (a
    subtitle may hold <i> and <font> tags), and the same text written back from their translations."""

    def __init__(self, content: str):
        self.sep = "\r\n" if "\r\n" in content else "\n"
        self.lines = content.split(self.sep)
        self.content = content
        filled = [x for x in self.lines if x.strip()]
        dialogue = len(filled) > 1 and all(_DASH.match(x) for x in filled)
        # One sentence runs over a subtitle's lines; a dialogue's lines (or lines a blank one parts) each stand alone.
        self.joined = len(filled) > 1 and not dialogue and len(filled) == len(self.lines)
        units = [" ".join(x.strip() for x in self.lines)] if self.joined else self.lines
        self.units = [self._unit(u) for u in units]

    @staticmethod
    def _unit(line: str) -> tuple[str, str, markup.Plan | None, str]:
        """(prefix kept as it is, the text, its markup plan where it has tags, the line as written)."""
        head = _DASH.match(line)
        prefix = head.group() if head else ""
        codes = _CODES.match(line, len(prefix))
        if codes:
            prefix += codes.group()
        body = line[len(prefix):].strip()
        return prefix, body, markup.plan(body) if "<" in body else None, line

    def texts(self) -> list[str]:
        out = []
        for _, body, plan, _ in self.units:
            if plan is not None:
                out += plan.texts()
            elif _prose(body):
                out.append(markup.SPACES.sub(" ", body))
        return out

    def render(self, translated: dict[str, str]) -> str:
        out = []
        for prefix, body, plan, line in self.units:
            if plan is not None:
                text = _subtitle_text(markup.render(plan, translated))
            else:
                text = translated[markup.SPACES.sub(" ", body)].strip() if _prose(body) else body
            out.append(prefix + text if text or not line.strip() else line)  # an empty translation keeps the line
        if self.joined:
            out = _cut(out[0], [len(x.strip()) for x in self.lines])
        return self.sep.join(out)


def _prose(text: str) -> bool:
    """Whether a text has words to translate (as markup judges it): one without a letter stays as it is."""
    return any(c.isalpha() for c in text)


def _subtitle_text(rendered: str) -> str:
    """Rendered HTML back to subtitle text: markup escapes the text it writes (&amp;), which a player shows as it is."""
    out, at = [], 0
    for m in _TAG.finditer(rendered):
        out += [html.unescape(rendered[at:m.start()]), m.group()]
        at = m.end()
    out.append(html.unescape(rendered[at:]))
    return "".join(out).strip()


def _cut(text: str, shares: list[int]) -> list[str]:
    """text cut at spaces (never inside a tag) into len(shares) lines whose lengths follow shares as closely as the words
    allow; fewer lines where there are fewer words."""
    inside = [False] * len(text)
    for m in _TAG.finditer(text):
        inside[m.start():m.end()] = [True] * (m.end() - m.start())
    spaces = [k for k, c in enumerate(text) if c == " " and not inside[k]]
    total, done, cuts = max(sum(shares), 1), 0, []
    for share in shares[:-1]:
        done += share
        ideal = len(text) * done / total
        later = [k for k in spaces if not cuts or k > cuts[-1]]
        if not later:
            break
        cuts.append(min(later, key=lambda k: abs(k - ideal)))
    bounds = [0, *cuts, len(text)]
    return [x for x in (text[a:b].strip() for a, b in zip(bounds, bounds[1:])) if x]


def _read_srt(data: bytes, name: str, limits: Limits) -> Document:
    srt = _import_srt()
    text, bom = _decode(data, name)
    try:
        subtitles = list(srt.parse(text))  # the srt library's checks: every block an index, a timing and its text
    except srt.SRTParseError as e:
        raise DataError(_srt_problem(name, text, e.expected_start, e.unmatched_content)) from None
    except (ValueError, OverflowError) as e:
        raise DataError(f"{name}: a subtitle's timing cannot be read ({first_line(e)}); fix it") from None
    matches = list(srt.SRT_REGEX.finditer(text))
    assert len(matches) == len(subtitles)  # the same expression, on the same text
    units, texts, places = [], [], []
    line, counted = 1, 0  # the line at offset `counted`, counted on as the subtitles go
    for number, m in enumerate(matches, 1):
        start = m.start(5)
        line += text.count("\n", counted, start)
        counted = start
        _check_content(name, line, m.group(5))
        unit = _Subtitle(m.group(5))
        units.append((m.span(5), unit))
        own = unit.texts()
        texts += own
        places += [f"subtitle {number} (line {line})"] * len(own)
    texts, places = _unique(texts, places)

    def write(translated: dict[str, str]) -> bytes:
        out, at = [], 0
        for (a, b), unit in units:
            out += [text[at:a], unit.render(translated)]
            at = b
        out.append(text[at:])
        return bom + "".join(out).encode("utf-8")

    return Document(name, "srt", texts, places, write)


def _check_content(name: str, first_line_number: int, content: str) -> None:
    """A subtitle's text holding a timing line: the srt library reads a subtitle whose timing it cannot read as text of the
    one before (it allows blank lines in a subtitle), so such a subtitle is named here."""
    at = content.find("-->")
    if at >= 0:
        line = first_line_number + content.count("\n", 0, at)
        shown = content[content.rfind("\n", 0, at) + 1:].split("\n")[0].strip()[:80]
        raise DataError(f"{name} line {line}: the timing {shown!r} cannot be read; write it as HH:MM:SS,mmm --> HH:MM:SS,mmm")


def _srt_problem(name: str, text: str, at: int, unmatched: str) -> str:
    """The line where the srt library stopped reading: the timing there, if one is, else the first line it could not read."""
    timing = unmatched.find("-->")
    if timing >= 0:
        start = unmatched.rfind("\n", 0, timing) + 1
        line = text.count("\n", 0, at + start) + 1
        shown = unmatched[start:].split("\n")[0].strip()[:80]
        return f"{name} line {line}: the timing {shown!r} cannot be read; write it as HH:MM:SS,mmm --> HH:MM:SS,mmm"
    at += len(unmatched) - len(unmatched.lstrip())
    line = text.count("\n", 0, at) + 1
    shown = unmatched.strip().split("\n")[0].strip()[:80]
    return (f"{name} line {line}: {shown!r} is not a subtitle (an index line, then a timing HH:MM:SS,mmm --> HH:MM:SS,mmm, "
            "then its text); fix that subtitle")


# Word documents ----------------------------------------------------------------------------------------------------

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_REL = "{http://schemas.openxmlformats.org/package/2006/relationships}"
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


def _safe_parser():
    from lxml import etree

    # No entity is ever resolved, no DTD loaded, nothing fetched from the network, no tree past libxml2's default bounds.
    return etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, dtd_validation=False, huge_tree=False)


def _check_package(data: bytes, name: str, limits: Limits) -> None:
    """Refuses a .docx by its zip directory before anything is unpacked (entries, unpacked bytes, packing ratio), then one
    whose XML parts hold a DTD or cannot be parsed, or that links to outside files other than by hyperlinks."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as e:
        raise DataError(f"{name} is not a readable .docx ({first_line(e)}); save it again from Word as .docx") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > limits.entries:
            raise UsageError(f"{name} holds {len(infos):,} zip entries, over the limit of {limits.entries:,}; refused as it is")
        unpacked = sum(i.file_size for i in infos)
        if unpacked > limits.unzipped_bytes:
            raise UsageError(f"{name} would unpack to {unpacked:,} bytes, over the {limits.unzipped_bytes:,}-byte limit "
                             "(a zip bomb?); refused without unpacking it")
        for i in infos:
            if i.file_size > limits.ratio_from and i.file_size > limits.ratio * max(i.compress_size, 1):
                raise UsageError(f"{name}: entry {i.filename!r} would unpack {i.file_size / max(i.compress_size, 1):,.0f} times its "
                                 f"packed size, over the limit of {limits.ratio:g} (a zip bomb?); refused without unpacking it")
        for i in infos:
            if i.filename.lower().endswith((".xml", ".rels")):
                _check_part(archive, i, name)


def _check_part(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> None:
    from lxml import etree

    try:
        data = archive.read(info)
    except (zipfile.BadZipFile, RuntimeError, NotImplementedError, zlib.error, EOFError, ValueError) as e:
        raise DataError(f"{name}: part {info.filename} cannot be unpacked ({first_line(e)}); save the document again from Word") from None
    shown = data.decode("utf-16", "replace").encode("utf-8") if data.startswith((b"\xff\xfe", b"\xfe\xff")) else data
    if b"<!DOCTYPE" in shown or b"<!ENTITY" in shown:
        raise UsageError(f"{name}: part {info.filename} declares a DTD, which no Word document has (entity expansion); refused")
    try:
        root = etree.fromstring(data, _safe_parser())
    except etree.XMLSyntaxError as e:
        raise DataError(f"{name}: part {info.filename} is not well-formed XML ({first_line(e)}); save the document again from Word") from None
    if info.filename.lower().endswith(".rels"):
        for rel in root.iter(_REL + "Relationship"):
            kind = rel.get("Type", "").rsplit("/", 1)[-1]
            if rel.get("TargetMode") == "External" and kind != "hyperlink":
                raise UsageError(f"{name}: {info.filename} links an outside file ({kind} {rel.get('Target', '')[:80]!r}), which Word "
                                 "would fetch on opening the translation; refused (remove the link, or embed the file)")


def _read_docx(data: bytes, name: str, limits: Limits) -> Document:
    docx = _import_docx()
    _check_package(data, name, limits)
    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as e:  # python-docx raises KeyError, ValueError, lxml's errors and its own on a broken package
        raise DataError(f"{name} is not a readable .docx ({type(e).__name__}: {first_line(e)}); save it again from Word as .docx") from None
    blocks: list[tuple[_Block, str]] = []
    for part in document.part.package.iter_parts():
        if part.content_type.endswith(_CONTENT_TYPES) and hasattr(part, "element"):
            for n, paragraph in enumerate(list(part.element.iter(P)), 1):
                blocks += [(b, f"{part.partname.lstrip('/')} paragraph {n}") for b in _blocks(paragraph)]
    texts, places = _unique([t for b, _ in blocks for t in b.plan.texts()], [p for b, p in blocks for _ in b.plan.texts()])

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


_READERS: dict[str, Callable[[bytes, str, Limits], Document]] = {"txt": _read_txt, "html": _read_html, "srt": _read_srt, "docx": _read_docx}
