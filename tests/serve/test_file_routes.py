"""LibreTranslate's file translation (toolkit.serve.file_routes): a file posted to /translate_file comes back from its
translatedFileUrl, once, with its structure kept; clients never name a path on the server, uploads are bounded, stored
files expire and their total is capped. A minimal app with an upper-casing translator stands in for tk serve's."""

from __future__ import annotations

import io
import urllib.parse
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("python_multipart", reason="the serve extra is not installed: pip install -e '.[serve]'")
docx = pytest.importorskip("docx", reason="the files extra is not installed: pip install -e '.[files]'")
srt = pytest.importorskip("srt", reason="the files extra is not installed: pip install -e '.[files]'")
from fastapi import FastAPI  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from toolkit.deploy import files  # noqa: E402
from toolkit.serve.file_routes import FileRoutesConfig, FileStore, add_file_routes, safe_name  # noqa: E402

SUBTITLES = b"1\r\n00:00:01,000 --> 00:00:02,000\r\nHello there,\r\nmy friend.\r\n\r\n2\r\n00:00:03,000 --> 00:00:04,000\r\n<i>Good night.</i>\r\n"


class PairRefused(Exception):
    """The app's own refusal of a request (tk serve's Refusal), answered by its own handler."""


def served(config: FileRoutesConfig | None = None) -> tuple[TestClient, FileStore, list]:
    calls: list = []

    async def upper(texts: list[str], source: str, target: str, api_key: str | None) -> list[str]:
        calls.append((list(texts), source, target, api_key))
        if (source, target) != ("en", "fr"):
            raise PairRefused(f"{source}-{target} is not served here")
        return [t.upper() for t in texts]

    app = FastAPI()
    app.add_exception_handler(PairRefused, lambda request, e: JSONResponse({"error": str(e)}, status_code=400))
    store = add_file_routes(app, upper, config)
    return TestClient(app), store, calls


def upload(client: TestClient, name: str, data: bytes, **fields):
    return client.post("/translate_file", files={"file": (name, data)}, data={"source": "en", "target": "fr", **fields})


def downloaded(client: TestClient, answer) -> tuple[str, bytes]:
    """The attachment's file name and bytes, from the URL a /translate_file answer gives."""
    assert answer.status_code == 200, answer.text
    url = answer.json()["translatedFileUrl"]
    assert url.startswith("http://testserver/download_file/")
    got = client.get(urllib.parse.urlsplit(url).path)
    assert got.status_code == 200, got.text
    disposition = got.headers["content-disposition"]
    assert disposition.startswith("attachment;") and got.headers["x-content-type-options"] == "nosniff"
    return disposition.split("filename=")[1].strip('"'), got.content


def test_a_subtitle_file_goes_up_and_comes_back_translated_once(tmp_path):
    client, store, calls = served()
    answer = upload(client, "film.srt", SUBTITLES, api_key="secret")
    name, data = downloaded(client, answer)
    assert name == "film.srt"
    out = data.decode("utf-8")
    assert [(s.index, s.start, s.end) for s in srt.parse(out)] == [(s.index, s.start, s.end) for s in srt.parse(SUBTITLES.decode())]
    assert [s.content for s in srt.parse(out)] == ["HELLO THERE,\nMY FRIEND.", "<i>GOOD NIGHT.</i>"]
    assert out.count("\r\n") == SUBTITLES.count(b"\r\n")
    assert calls == [(["Hello there, my friend.", "Good night."], "en", "fr", "secret")]
    # Sent once, then gone from the server's directory.
    assert client.get(urllib.parse.urlsplit(answer.json()["translatedFileUrl"]).path).status_code == 404
    assert list(store.root.iterdir()) == [] and store.stored_bytes == 0


def test_a_word_document_keeps_its_bold_run_through_the_server(tmp_path):
    d = docx.Document()
    p = d.add_paragraph("Hello ")
    p.add_run("bold").bold = True
    p.add_run(" world.")
    buffer = io.BytesIO()
    d.save(buffer)
    client, _, _ = served()
    name, data = downloaded(client, upload(client, "letter.docx", buffer.getvalue()))
    runs = [(r.text, bool(r.bold)) for r in docx.Document(io.BytesIO(data)).paragraphs[0].runs]
    assert name == "letter.docx" and runs == [("HELLO ", False), ("BOLD", True), (" WORLD.", False)]


def test_a_client_file_name_never_becomes_a_path(tmp_path):
    client, store, _ = served()
    answer = upload(client, "../../../tmp/evil name?.srt", SUBTITLES)
    url = answer.json()["translatedFileUrl"]
    assert ".." not in url and url.endswith(".evil_name_.srt")
    assert [p.parent for p in store.root.iterdir()] == [store.root]
    assert not (store.root.parent / "evil name?.srt").exists()
    token = urllib.parse.urlsplit(url).path.rsplit("/", 1)[1].split(".")[0]
    for path in ("/download_file/..%2F..%2Fetc%2Fpasswd", "/download_file/../../etc/passwd", f"/download_file/{token}.../../etc/passwd",
                 f"/download_file/{token}.other.srt", f"/download_file/{'A' * 32}.evil_name_.srt", "/download_file/%2Fetc%2Fpasswd"):
        assert client.get(path).status_code == 404, path
    assert downloaded(client, answer)[0] == "evil_name_.srt"  # the refused guesses took nothing away


@pytest.mark.parametrize("name, safe", [("a/b\\c.srt", "c.srt"), ("..", "file"), (".bashrc", "bashrc"), ("x" * 300 + ".docx", "x" * 95 + ".docx"),
                                        ("été.txt", "_t_.txt"), ("", "file")])
def test_safe_names(name, safe):
    assert safe_name(name) == safe


def test_requests_that_cannot_be_translated_are_refused_in_one_line(tmp_path):
    client, store, _ = served()
    cases = [
        (upload(client, "slides.pptx", b"x"), 400, "cannot translate a .pptx file"),
        (client.post("/translate_file", data={"source": "en", "target": "fr"}), 400, "missing file parameter"),
        (client.post("/translate_file", files={"file": ("a.srt", SUBTITLES)}, data={"source": "en"}), 400, "missing target parameter"),
        (client.post("/translate_file", json={"file": "x"}), 400, "multipart/form-data"),
        (upload(client, "a.srt", SUBTITLES, target="de"), 400, "en-de is not served here"),
        (upload(client, "bad.srt", b"1\n00:00:0x,000 --> 00:00:02,000\nHello.\n"), 400, "bad.srt line 2: the timing"),
    ]
    for answer, status, words in cases:
        assert answer.status_code == status and words in answer.json()["error"], answer.text
        assert "\n" not in answer.json()["error"] and str(store.root) not in answer.json()["error"]
    assert list(store.root.iterdir()) == [] and store.stored_bytes == 0


def test_a_zip_bomb_upload_is_refused_without_naming_the_servers_files(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("word/document.xml", bytes(2 * 2**20))
    client, store, _ = served(FileRoutesConfig(limits=files.Limits(unzipped_bytes=2**20)))
    answer = upload(client, "report.docx", buffer.getvalue())
    assert answer.status_code == 400 and answer.json()["error"].startswith("report.docx would unpack to 2,097,152 bytes")
    assert list(store.root.iterdir()) == []


def test_an_upload_over_the_limit_is_refused_before_it_is_parsed(tmp_path):
    config = FileRoutesConfig(limits=files.Limits(text_bytes=1000, docx_bytes=1000))
    client, store, calls = served(config)
    answer = upload(client, "big.srt", b"x" * (config.max_body_bytes + 1))
    assert answer.status_code == 413 and "limit" in answer.json()["error"]
    small = FileRoutesConfig(limits=files.Limits(text_bytes=100, docx_bytes=2**20))  # the body fits, the .srt does not
    client, store, calls = served(small)
    answer = upload(client, "big.srt", SUBTITLES * 4)
    assert answer.status_code == 400 and "over the 100-byte limit for .srt files" in answer.json()["error"]
    assert calls == [] and list(store.root.iterdir()) == []


def test_translations_expire_and_their_total_is_capped(tmp_path):
    client, store, _ = served(FileRoutesConfig(ttl_s=60, max_stored_bytes=3 * len(SUBTITLES)))
    now = [1000.0]
    store.clock = lambda: now[0]
    first = upload(client, "a.srt", SUBTITLES)
    assert first.status_code == 200 and len(list(store.root.iterdir())) == 1
    full = upload(client, "b.srt", SUBTITLES * 3)
    assert full.status_code == 503 and "retry once translations are downloaded" in full.json()["error"]
    now[0] += 61
    assert client.get(urllib.parse.urlsplit(first.json()["translatedFileUrl"]).path).status_code == 404
    assert list(store.root.iterdir()) == [] and store.stored_bytes == 0
    assert upload(client, "b.srt", SUBTITLES * 3).status_code == 200  # room again


def test_the_store_directory_is_the_servers_own(tmp_path):
    client, store, _ = served()
    assert store.root.is_dir() and store.root.name.startswith("tk-serve-files-")
    store.close()
    assert not store.root.exists()


def test_no_file_is_left_when_the_translation_is_refused(tmp_path):
    client, store, _ = served()
    assert upload(client, "a.srt", SUBTITLES, source="de").status_code == 400
    assert list(store.root.iterdir()) == [] and store.stored_bytes == 0


def test_an_upload_is_written_where_the_token_says(tmp_path):
    client, store, _ = served()
    answer = upload(client, "a.srt", SUBTITLES)
    [stored] = list(store.root.iterdir())
    token = urllib.parse.urlsplit(answer.json()["translatedFileUrl"]).path.rsplit("/", 1)[1].split(".")[0]
    assert stored == store.root / f"{token}.out.srt" and len(token) == 32
    assert Path(store.entries[token].path) == stored


def test_a_missing_form_parser_is_named_when_the_routes_are_added(monkeypatch):
    import sys

    from toolkit.core.errors import UsageError

    monkeypatch.setitem(sys.modules, "python_multipart", None)
    with pytest.raises(UsageError, match=r"pip install 'tk-onnx-deploy\[serve\]'"):
        add_file_routes(FastAPI(), lambda *a: None)
