"""Subtitles (.srt, read by the srt library): each subtitle's text translated; its index, timing and every byte around
the text kept as they were. A subtitle of several lines is one sentence cut back into as many lines; a dialogue's
lines (each starting with a dash) are translated one by one."""

from __future__ import annotations

import html
import re

from toolkit.core.errors import DataError, UsageError, first_line
from toolkit.deploy import markup
from toolkit.deploy.files.document import Document
from toolkit.deploy.files.kinds import INSTALL
from toolkit.deploy.files.safety import Limits
from toolkit.deploy.files.text import decode, unique

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
            elif markup.prose(body):
                out.append(markup.SPACES.sub(" ", body))
        return out

    def render(self, translated: dict[str, str]) -> str:
        out = []
        for prefix, body, plan, line in self.units:
            if plan is not None:
                text = _subtitle_text(markup.render(plan, translated))
            else:
                text = translated[markup.SPACES.sub(" ", body)].strip() if markup.prose(body) else body
            out.append(prefix + text if text or not line.strip() else line)  # an empty translation keeps the line
        if self.joined:
            out = _cut(out[0], [len(x.strip()) for x in self.lines])
        return self.sep.join(out)


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


def read_srt(data: bytes, name: str, limits: Limits) -> Document:
    srt = _import_srt()
    text, bom = decode(data, name)
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
    texts, places = unique(texts, places)

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
