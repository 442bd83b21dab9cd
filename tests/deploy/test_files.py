"""Translating whole files (toolkit.deploy.files, tk translate -i FILE): each kind comes back with its structure and only
its text translated, checked by opening the output with the same library that reads the input. Stand-in translators
whose output follows from their input (upper case, reversed words) make every expected text hold by construction; the
shipped model then translates through the CLI. Hostile files are refused in one line, before any heavy work, with
nothing written."""

from __future__ import annotations

import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from toolkit.core.errors import DataError, UsageError
from toolkit.deploy import files
from toolkit.deploy.files import reading

docx = pytest.importorskip("docx", reason="the files extra is not installed: pip install -e '.[files]'")
srt = pytest.importorskip("srt", reason="the files extra is not installed: pip install -e '.[files]'")
from docx.opc.constants import RELATIONSHIP_TYPE as RT  # noqa: E402
from docx.oxml import OxmlElement  # noqa: E402
from docx.oxml.ns import qn  # noqa: E402
from helpers import one_line_error  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"


def upper(texts: list[str]) -> list[str]:
    return [t.upper() for t in texts]


def reversed_words(texts: list[str]) -> list[str]:
    return [" ".join(reversed(t.split())) for t in texts]


# Plain text and HTML -----------------------------------------------------------------------------------------------

def test_a_text_file_keeps_its_lines_line_endings_and_indentation(tmp_path):
    src, dst = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_bytes(b"\xef\xbb\xbfHello world.\r\n\r\n   Indented line.\n\nLast line without an end")
    files.translate_file(src, dst, upper)
    assert dst.read_bytes() == b"\xef\xbb\xbfHELLO WORLD.\r\n\r\n   INDENTED LINE.\n\nLAST LINE WITHOUT AN END"


def tags(document: str) -> list[tuple]:
    found: list[tuple] = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append(("start", tag, tuple(attrs)))

        def handle_endtag(self, tag):
            found.append(("end", tag))

        def handle_comment(self, data):
            found.append(("comment", data))

    Tags().feed(document)
    return found


def test_an_html_document_keeps_its_markup_and_translates_its_text(tmp_path):
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>My page</title>"
            "<script>var greeting = 'do not touch';</script></head>\n<body><!-- a comment -->\n"
            "<h1 class=\"big\">Welcome home</h1>\n<p>This is <b>bold</b> and <a href=\"/x?a=1&amp;b=2\">a link</a>.</p>\n"
            "<p translate=\"no\">Brand name</p></body></html>\n")
    src, dst = tmp_path / "page.html", tmp_path / "out.html"
    src.write_text(page, encoding="utf-8")
    files.translate_file(src, dst, upper)
    out = dst.read_text(encoding="utf-8")
    assert tags(out) == tags(page)
    for translated in ("<title>MY PAGE</title>", "WELCOME HOME", "THIS IS <b>BOLD</b> AND <a href=\"/x?a=1&amp;b=2\">A LINK</a>."):
        assert translated in out
    assert "var greeting = 'do not touch';" in out and "Brand name" in out


# Subtitles ---------------------------------------------------------------------------------------------------------

SUBTITLES = (
    "1\n00:00:01,000 --> 00:00:02,500\nHello there,\nhow are you?\n\n"
    "2\n00:00:03,000 --> 00:00:04,000 X1:10 X2:50\n- Where is it?\n- Over here.\n\n"
    "3\n00:00:05,000 --> 00:00:06,000\n<i>It is late.</i>\n\n"
    "4\n00:00:07,000 --> 00:00:08,000\n{\\an8}Tom & Jerry\n\n"
    "5\n00:00:09,000 --> 00:00:10,000\n1984\n"
)
EXPECTED = ["HELLO THERE,\nHOW ARE YOU?", "- WHERE IS IT?\n- OVER HERE.", "<i>IT IS LATE.</i>", "{\\an8}TOM & JERRY", "1984"]


def outside_text(text: str) -> list[str]:
    """Every byte of an .srt file but its subtitles' text: indexes, timings, blank lines."""
    out, at = [], 0
    for m in srt.SRT_REGEX.finditer(text):
        out.append(text[at:m.start(5)])
        at = m.end(5)
    return out + [text[at:]]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_subtitles_keep_their_indexes_and_timings_byte_for_byte(tmp_path, newline):
    source = SUBTITLES.replace("\n", newline)
    src, dst = tmp_path / "film.srt", tmp_path / "out.srt"
    src.write_bytes(source.encode("utf-8"))
    document = files.translate_file(src, dst, upper)
    out = dst.read_bytes().decode("utf-8")
    assert outside_text(out) == outside_text(source)
    got = list(srt.parse(out))
    assert [(s.index, s.start, s.end, s.proprietary) for s in got] == [(s.index, s.start, s.end, s.proprietary) for s in srt.parse(source)]
    assert [s.content for s in got] == EXPECTED
    assert document.places[0] == "subtitle 1 (line 3)"


def test_a_subtitle_of_several_lines_is_one_sentence_cut_back_into_as_many_lines(tmp_path):
    src, dst = tmp_path / "in.srt", tmp_path / "out.srt"
    src.write_text("7\n00:01:00,000 --> 00:01:03,000\nI never said that\nshe stole my money.\n", encoding="utf-8")
    seen: list[str] = []
    files.translate_file(src, dst, lambda texts: seen.extend(texts) or reversed_words(texts))
    assert seen == ["I never said that she stole my money."]
    lines = list(srt.parse(dst.read_text(encoding="utf-8")))[0].content.split("\n")
    assert len(lines) == 2 and " ".join(lines) == "money. my stole she that said never I"


# Word documents ----------------------------------------------------------------------------------------------------

def add_hyperlink(paragraph, url: str, text: str) -> None:
    rid = paragraph.part.relate_to(url, RT.HYPERLINK, is_external=True)
    link = OxmlElement("w:hyperlink")
    link.set(qn("r:id"), rid)
    run, t = OxmlElement("w:r"), OxmlElement("w:t")
    t.text = text
    run.append(t)
    link.append(run)
    paragraph._p.append(link)


def add_simple_field(paragraph, instruction: str, shown: str) -> None:
    field = OxmlElement("w:fldSimple")
    field.set(qn("w:instr"), instruction)
    run, t = OxmlElement("w:r"), OxmlElement("w:t")
    t.text = shown
    run.append(t)
    field.append(run)
    paragraph._p.append(field)


def sample_docx(path: Path) -> Path:
    d = docx.Document()
    p = d.add_paragraph("Hello ")
    p.add_run("big cat").bold = True
    p.add_run(" and a ")
    p.add_run("small dog").italic = True
    p.add_run(".")
    d.add_paragraph("")
    link = d.add_paragraph("Visit ")
    add_hyperlink(link, "https://example.com/a", "our site")
    link.add_run(" today.")
    field = d.add_paragraph("See page ")
    add_simple_field(field, "PAGE", "3")
    field.add_run(" for details.")
    d.add_paragraph().add_run("Name:\tJohn Smith")  # one run: text, a tab, text
    table = d.add_table(rows=2, cols=2)
    table.cell(0, 0).text = "First cell"
    table.cell(0, 1).paragraphs[0].add_run("Bold cell").bold = True
    table.cell(1, 0).text = "Third cell"
    d.sections[0].header.paragraphs[0].text = "The header"
    d.sections[0].footer.paragraphs[0].text = "The footer"
    d.save(path)
    return path


def formatted(paragraph) -> list[tuple[str, bool, bool]]:
    return [(r.text, bool(r.bold), bool(r.italic)) for r in paragraph.runs if r.text]


def test_a_word_document_keeps_its_paragraphs_runs_tables_links_and_fields(tmp_path):
    src, dst = sample_docx(tmp_path / "letter.docx"), tmp_path / "out.docx"
    files.translate_file(src, dst, upper)
    before, after = docx.Document(src), docx.Document(dst)
    assert len(after.paragraphs) == len(before.paragraphs)
    p = after.paragraphs
    assert formatted(p[0]) == [("HELLO ", False, False), ("BIG CAT", True, False), (" AND A ", False, False), ("SMALL DOG", False, True),
                               (".", False, False)]
    assert p[1].text == ""
    assert p[2].text == "VISIT OUR SITE TODAY." and [(h.url, h.text) for h in p[2].hyperlinks] == [("https://example.com/a", "OUR SITE")]
    fields = p[3]._p.findall(qn("w:fldSimple"))
    assert len(fields) == 1 and fields[0].get(qn("w:instr")) == "PAGE"
    assert "".join(t.text for t in p[3]._p.iter(qn("w:t"))) == "SEE PAGE 3 FOR DETAILS."
    assert p[4].text == "NAME:\tJOHN SMITH"
    table = after.tables[0]
    assert [[c.text for c in row.cells] for row in table.rows] == [["FIRST CELL", "BOLD CELL"], ["THIRD CELL", ""]]
    assert formatted(table.cell(0, 1).paragraphs[0]) == [("BOLD CELL", True, False)]
    assert after.sections[0].header.paragraphs[0].text == "THE HEADER"
    assert after.sections[0].footer.paragraphs[0].text == "THE FOOTER"


def test_bold_and_italic_stay_on_their_own_words_when_the_translation_reorders_them(tmp_path):
    src, dst = sample_docx(tmp_path / "letter.docx"), tmp_path / "out.docx"
    files.translate_file(src, dst, reversed_words)
    runs = formatted(docx.Document(dst).paragraphs[0])
    assert [t for t, bold, _ in runs if bold] == ["cat big"]
    assert [t for t, _, italic in runs if italic] == ["dog small"]
    assert sorted("".join(t for t, _, _ in runs).replace(".", " ").split()) == sorted("Hello big cat and a small dog".split())


def test_a_complex_field_keeps_its_code_and_its_result(tmp_path):
    d = docx.Document()
    p = d.add_paragraph("Page ")
    for kind in ("begin", None, "separate", "7", "end"):
        run = OxmlElement("w:r")
        if kind in ("begin", "separate", "end"):
            child = OxmlElement("w:fldChar")
            child.set(qn("w:fldCharType"), kind)
        elif kind is None:
            child = OxmlElement("w:instrText")
            child.text = " PAGE "
        else:
            child = OxmlElement("w:t")
            child.text = kind
        run.append(child)
        p._p.append(run)
    p.add_run(" of the report")
    src, dst = tmp_path / "in.docx", tmp_path / "out.docx"
    d.save(src)
    files.translate_file(src, dst, upper)
    out = docx.Document(dst).paragraphs[0]._p
    assert [c.get(qn("w:fldCharType")) for c in out.iter(qn("w:fldChar"))] == ["begin", "separate", "end"]
    assert [c.text for c in out.iter(qn("w:instrText"))] == [" PAGE "]
    assert "".join(t.text for t in out.iter(qn("w:t"))) == "PAGE 7 OF THE REPORT"


# Hostile and broken files ------------------------------------------------------------------------------------------

def rewritten(src: Path, dst: Path, replace: dict[str, bytes] | None = None, add: dict[str, bytes] | None = None) -> Path:
    """A copy of a .docx with some parts replaced and some added."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, (replace or {}).get(info.filename, zin.read(info)))
        for name, data in (add or {}).items():
            zout.writestr(name, data)
    return dst


def refused(cli, src: Path, tmp_path: Path, *words: str, code: int = 2) -> str:
    """tk translate -i src refused in one line naming src and every word, exit `code`, no output written."""
    out = tmp_path / "out.docx"
    line = one_line_error(cli("translate", "--model", SHIPPED, "-i", src, "-o", out), code)
    assert src.name in line and all(w in line for w in words), line
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    return line


def test_a_zip_bomb_is_refused_from_its_zip_directory_without_unpacking_it(cli, tmp_path, monkeypatch):
    bomb = tmp_path / "bomb.docx"
    with zipfile.ZipFile(rewritten(sample_docx(tmp_path / "a.docx"), bomb), "a", zipfile.ZIP_DEFLATED) as z, \
            z.open("word/media/zeros.bin", "w", force_zip64=True) as f:
        chunk = bytes(2**20)
        for _ in range(150):  # 150 MiB of zeros: about 150 kB packed
            f.write(chunk)
    assert bomb.stat().st_size < 2 * 2**20
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda *a, **k: pytest.fail("an entry was unpacked"))
    refused(cli, bomb, tmp_path, "would unpack to 158,117,338 bytes", "zip bomb")


def test_an_entry_packed_far_past_any_document_and_too_many_entries_are_refused(tmp_path):
    source = sample_docx(tmp_path / "a.docx")
    dense = rewritten(source, tmp_path / "dense.docx", add={"word/media/zeros.bin": bytes(5 * 2**20)})
    with pytest.raises(UsageError, match=r"zeros\.bin' would unpack .* times its packed size"):
        files.read_file(dense)
    many = rewritten(source, tmp_path / "many.docx", add={f"customXml/item{k}.bin": b"" for k in range(5001)})
    with pytest.raises(UsageError, match="zip entries, over the limit of 5,000"):
        files.read_file(many)


def test_a_document_that_links_an_outside_file_is_refused(cli, tmp_path):
    d = docx.Document()
    d.add_paragraph("Hello.")
    d.part.relate_to("https://attacker.example/template.dotm", f"{RT.HYPERLINK.rsplit('/', 1)[0]}/attachedTemplate", is_external=True)
    d.save(tmp_path / "linked.docx")
    refused(cli, tmp_path / "linked.docx", tmp_path, "attachedTemplate", "attacker.example", "refused")


def test_xml_entity_expansion_is_refused(cli, tmp_path):
    source = sample_docx(tmp_path / "a.docx")
    body = zipfile.ZipFile(source).read("word/document.xml").decode("utf-8")
    root_at = body.index("<w:document")
    laughs = ('<!DOCTYPE w:document [<!ENTITY a "ha"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
              '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>')
    bomb = body[:root_at] + laughs + body[root_at:].replace("Hello ", "&c;", 1)
    rewritten(source, tmp_path / "laughs.docx", replace={"word/document.xml": bomb.encode("utf-8")})
    refused(cli, tmp_path / "laughs.docx", tmp_path, "word/document.xml", "DTD")


def test_a_corrupt_document_is_named_with_the_place_it_breaks(cli, tmp_path):
    source = sample_docx(tmp_path / "a.docx")
    (tmp_path / "cut.docx").write_bytes(source.read_bytes()[:3000])
    refused(cli, tmp_path / "cut.docx", tmp_path, "not a readable .docx")
    body = zipfile.ZipFile(source).read("word/document.xml").replace(b"</w:body>", b"</w:bod>")
    rewritten(source, tmp_path / "broken.docx", replace={"word/document.xml": body})
    refused(cli, tmp_path / "broken.docx", tmp_path, "word/document.xml", "line")


def test_a_subtitle_whose_timing_cannot_be_read_is_named_by_its_line(cli, tmp_path):
    bad = tmp_path / "bad.srt"
    bad.write_text("1\n00:00:01,000 --> 00:00:02,000\nHello.\n\n2\n00:00:0x,000 --> 00:00:03,000\nWorld.\n", encoding="utf-8")
    refused(cli, bad, tmp_path, "line 6", "00:00:0x,000")
    garbage = tmp_path / "garbage.srt"
    garbage.write_text("\nthis is not\na subtitle\n\n1\n00:00:01,000 --> 00:00:02,000\nHello.\n", encoding="utf-8")
    with pytest.raises(DataError, match="garbage.srt line 2: 'this is not' is not a subtitle"):
        files.read_file(garbage)
    latin = tmp_path / "latin.srt"
    latin.write_bytes("1\n00:00:01,000 --> 00:00:02,000\nCafé\n".encode("latin-1"))
    refused(cli, latin, tmp_path, "line 3 is not valid UTF-8")


def test_a_file_over_its_size_limit_is_refused_unread(cli, tmp_path, monkeypatch):
    big = tmp_path / "big.srt"
    with open(big, "wb") as f:
        f.truncate(10 * 2**20)
    monkeypatch.setitem(reading._READERS, "srt", lambda *a: pytest.fail("the file was read"))
    refused(cli, big, tmp_path, "10,485,760 bytes", "5,242,880-byte limit")


def test_the_input_is_never_written_over(cli, tmp_path):
    src = sample_docx(tmp_path / "a.docx")
    data = src.read_bytes()
    line = one_line_error(cli("translate", "--model", SHIPPED, "-i", src, "-o", src), 2)
    assert "is the input file" in line and src.read_bytes() == data
    with pytest.raises(UsageError, match="is the input file"):
        files.translate_file(src, tmp_path / "." / "a.docx", upper)
    assert src.read_bytes() == data


def test_a_word_document_needs_an_output_file(cli, tmp_path):
    line = one_line_error(cli("translate", "--model", SHIPPED, "-i", sample_docx(tmp_path / "a.docx")), 2)
    assert "give -o FILE.docx" in line


def test_a_missing_library_names_the_extra_to_install(tmp_path, monkeypatch):
    src = sample_docx(tmp_path / "a.docx")
    monkeypatch.setitem(sys.modules, "docx", None)
    with pytest.raises(UsageError, match=r"pip install 'tk-onnx-deploy\[files\]'"):
        files.read_file(src)


def test_an_unknown_extension_is_refused_with_the_kinds_translated(tmp_path):
    (tmp_path / "slides.pptx").write_bytes(b"")
    with pytest.raises(UsageError, match=r"cannot translate a \.pptx file; tk translates \.txt, \.html, \.htm, \.docx, \.srt files"):
        files.read_file(tmp_path / "slides.pptx")
    assert files.read_file(tmp_path / "slides.pptx", kind="txt").texts == []


# The shipped model through tk translate ----------------------------------------------------------------------------

def test_the_shipped_model_translates_text_and_subtitle_files_through_the_cli(cli, tmp_path):
    sentences = ["I'm home.", "He is calm.", "Where is the station?"]
    txt, txt_out = tmp_path / "in.txt", tmp_path / "out.txt"
    txt.write_text(f"{sentences[0]}\n\n{sentences[1]}\n{sentences[2]}\n", encoding="utf-8")
    assert cli("translate", "--model", SHIPPED, "-q", "-i", txt, "-o", txt_out).exit_code == 0
    one_by_one = cli("translate", "--model", SHIPPED, "-q", *sentences).output.splitlines()
    assert txt_out.read_text(encoding="utf-8").split("\n") == [one_by_one[0], "", one_by_one[1], one_by_one[2], ""]

    source = "".join(f"{k}\n00:00:0{k},000 --> 00:00:0{k},900\n{s}\n\n" for k, s in enumerate(sentences, 1))
    sub, sub_out = tmp_path / "in.srt", tmp_path / "out.srt"
    sub.write_text(source, encoding="utf-8")
    result = cli("translate", "--model", SHIPPED, "-i", sub, "-o", sub_out)
    assert result.exit_code == 0, result.output
    out = sub_out.read_text(encoding="utf-8")
    assert outside_text(out) == outside_text(source)
    assert [s.content for s in srt.parse(out)] == one_by_one  # each subtitle its sentence's own translation
    assert cli("translate", "--model", SHIPPED, "-q", "-i", sub).output == out  # without -o: to standard output


def test_the_shipped_model_translates_a_word_document_with_its_runs_kept(cli, tmp_path):
    src, dst = sample_docx(tmp_path / "letter.docx"), tmp_path / "out.docx"
    result = cli("translate", "--model", SHIPPED, "-i", src, "-o", dst)
    assert result.exit_code == 0, result.output
    after = docx.Document(dst)
    assert len(after.paragraphs) == len(docx.Document(src).paragraphs)
    runs = formatted(after.paragraphs[0])
    assert any(bold for _, bold, _ in runs) and any(italic for _, _, italic in runs)
    assert after.paragraphs[0].text != docx.Document(src).paragraphs[0].text
    assert [h.url for h in after.paragraphs[2].hyperlinks] == ["https://example.com/a"]


def test_translating_a_file_never_imports_torch(tmp_path, assert_torch_free):
    sub = tmp_path / "in.srt"
    sub.write_text("1\n00:00:01,000 --> 00:00:02,000\nHello.\n", encoding="utf-8")
    assert_torch_free("translate", "--model", SHIPPED, "-q", "-i", sub, "-o", tmp_path / "out.srt")


def test_the_kind_is_the_extension_unless_named():
    assert files.kind_of("Notes.HTM") == "html" and files.kind_of("film.SRT") == "srt" and files.kind_of("x", kind="srt") == "srt"
