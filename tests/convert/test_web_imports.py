"""The web site's tokenizer for imported models: in headless Chromium, the page's token ids and text are the model
directory's Python tokenizer's (open_tokenizer) for a briefly trained Marian, M2M100, NLLB-style tokenizer.json, mBART
(its SentencePiece model, and mBART-50's tokenizer.json) and T5, and for tk's shipped Transformer imported back from
`tk export --to-hf` (byte fallback, the identity rule), on the same 50 sentences; a hostile tokenizer file in
the site is one line in the page. The sites are written by the web writer's own write and verify stages (its validate
stage is the command's; the page's tokenizer does not need the graphs to answer)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from convert.test_web import CHROMIUM, SHIPPED, static_server
from hf_marian_fixture import fra_eng_lines
from hf_seq2seq_fixture import exported_import
from verify.test_planted_faults_hf import ARCHITECTURES, BUILT_AS

from toolkit.convert import web
from toolkit.core import manifest as manifest_mod
from toolkit.core.tokenizers import open_tokenizer, with_languages

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed: apt-get install -y chromium")]


def _nllb(path: Path, pairs: list) -> Path:
    from hf_seq2seq_fixture import nllb_directory

    return nllb_directory(path, pairs[:400])


def _mbart_cc25(path: Path, pairs: list) -> Path:
    from pytorch.test_hf_mbart import mbart_directory

    return mbart_directory(path, pairs[:400], "cc25")


def _marian_from_tk(path: Path, pairs: list) -> Path:
    """tk's shipped Transformer as a MarianMTModel (`tk export --to-hf`): a trained Marian whose SentencePiece model has
    the identity rule (the others' have nmt_nfkc)."""
    from click.testing import CliRunner

    from toolkit.cli import main

    result = CliRunner().invoke(main, ["export", str(SHIPPED), "--to-hf", str(path)])
    assert result.exit_code == 0, result.output
    return path


# Each built under the name the architecture's own test module gives it (one build serves both).
BUILDS = {a.name: (BUILT_AS[a.name], a.build) for a in ARCHITECTURES} | {
    "nllb": ("hf-nllb", _nllb), "mbart-cc25": ("hf-mbart-cc25", _mbart_cc25), "marian-from-tk": ("web-marian-from-tk", _marian_from_tk)}


def exported(tmp_path_factory, pairs, arch: str) -> manifest_mod.Manifest:
    name, build = BUILDS[arch]
    return manifest_mod.load(exported_import(tmp_path_factory, name, lambda path: build(path, pairs))[1])

# Whitespace runs and kinds, NBSP, accents composed and not, NFKC's characters, emoji (with a joiner), CJK: 20 of the
# 50 sentences; the other 30 are corpus lines, English and French.
AWKWARD = [
    "two  spaces,   three,\t\ttabs\nand a line break", "  leading and trailing  ", "\u00a0no-break\u00a0space\u202fnarrow",
    "ideographic\u3000space\u2009thin\u2028line", "café crème brûlée", "Zoë's naïve façade", "ÉCOLE À PARIS",
    "e\u0301te\u0301 decomposed", "I ❤️ Paris 😀👍🏽 🇫🇷", "family 👨\u200d👩\u200d👧 joined", "中文字符 日本語のテキスト 한국어",
    "Ωμέγα and עברית", "ﬁnancial ① ２ Ⅻ ㎞ ½", "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ", "tilde ～ and ~", "soft\u00adhyphen, zero\u200bwidth",
    "▁ already ▁▁ escaped", "ALL CAPS SENTENCE.", "x" * 80, "a",
]


@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    return fra_eng_lines(corpus_zip, 2000)


@pytest.fixture(scope="module")
def texts(pairs) -> list[str]:
    lines = [e for e, _ in pairs[1000:1015]] + [f for _, f in pairs[1000:1015]]
    assert len(lines + AWKWARD) == 50
    return lines + AWKWARD


def write_site(m: manifest_mod.Manifest, site: Path) -> dict:
    """`tk export DIR --web SITE` of `m`, as users run it (the writer's verify stage included); model.json's content."""
    from click.testing import CliRunner

    from toolkit.cli import main

    r = CliRunner().invoke(main, ["export", str(m.directory), "--web", str(site)])
    assert r.exit_code == 0, r.output
    return json.loads((site / "model.json").read_text(encoding="utf-8"))


@contextmanager
def page_of(site: Path) -> Iterator:
    from playwright.sync_api import sync_playwright

    with static_server(site) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(url)
            yield page
        finally:
            browser.close()


@pytest.mark.parametrize("arch", ["marian", "marian-from-tk", "m2m100", "nllb", "mbart-cc25", "mbart", "t5"])
def test_the_page_tokenizes_an_import_as_its_python_tokenizer_does(arch, tmp_path_factory, tmp_path, pairs, texts):
    m = exported(tmp_path_factory, pairs, arch)
    model = write_site(m, tmp_path / "site")
    entry = model["tokenizer"]
    assert entry["kind"] == "tokenizers" and (tmp_path / "site" / "vendor" / "tokenizers.min.mjs").is_file()
    tokenizer = open_tokenizer(m)
    want = tokenizer.encode(texts)
    # another source language (a T5: a pair and its task prefix), as tk translate --source-lang/--target-lang takes it
    codes = sorted(c for c in entry["languages"] or {} if c != entry["source_lang"])
    pair = {"sourceLang": codes[0]} if codes else {}
    if entry["prefixes"]:
        pair = dict(zip(("sourceLang", "targetLang"), max(entry["prefixes"]).split("-")))
    want_other = with_languages(m, tokenizer, pair["sourceLang"], pair.get("targetLang"))[1].encode(texts) if pair else None
    with page_of(tmp_path / "site") as page:
        got = page.evaluate("texts => tk.encode(texts)", texts)
        back = page.evaluate("ids => tk.decode(ids)", want)
        got_other = page.evaluate("([texts, pair]) => tk.encode(texts, pair)", [texts, pair]) if pair else None
    wrong = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
    assert not wrong, f"{len(wrong)} of {len(texts)} texts get other ids in the page, e.g. {wrong[:2]}"
    assert back == tokenizer.decode(want)
    assert got_other == want_other and (want_other is None or want_other != want)
    # The sentences reach the end token and the rest of what goes around the pieces, and decode to words.
    assert all(ids[-1] in (m.rules().end, *(entry["languages"] or {}).values()) for ids in want)
    assert sum(bool(t.strip()) for t in back) >= 45
    site = tmp_path / "site"
    sizes = ", ".join(f"{v} {n / 2**20:.2f} MiB" for v, n in web.downloads(site).items())
    print(f"\n{arch}: {len(json.loads((site / entry['file']).read_text())['model']['vocab'])} pieces, tokenizer.json "
          f"{(site / entry['file']).stat().st_size / 1024:.1f} KiB, library "
          f"{(site / 'vendor' / 'tokenizers.min.mjs').stat().st_size / 1024:.1f} KiB; "
          f"download per page load {sizes}")


HOSTILE = {
    "not JSON": "{\"model\": ",
    "a model the library does not know": json.dumps({"normalizer": None, "pre_tokenizer": None, "post_processor": None,
                                                     "decoder": None, "added_tokens": [], "model": {"type": "Evil"}}),
    "no vocabulary": json.dumps({"normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
                                 "added_tokens": [], "model": {"type": "Unigram", "vocab": 7}}),
    "a JSON array": "[1, 2, 3]",
}


def test_a_hostile_tokenizer_file_in_the_site_is_one_line_in_the_page(tmp_path_factory, tmp_path, pairs):
    site = tmp_path / "site"
    model = write_site(exported(tmp_path_factory, pairs, "nllb"), site)
    from playwright.sync_api import sync_playwright

    shown = {}
    with static_server(site) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for name, content in HOSTILE.items():
                (site / model["tokenizer"]["file"]).write_text(content, encoding="utf-8")
                page = browser.new_context().new_page()  # a context of its own: nothing cached from the last file
                page.goto(url)
                page.wait_for_function("document.getElementById('status').textContent.startsWith('error')")
                shown[name] = page.inner_text("#status")
        finally:
            browser.close()
    for name, status in shown.items():
        assert status.startswith("error: the tokenizer tokenizer.json does not load: ") and "\n" not in status, (name, status)


def test_the_writer_s_verify_stage_holds_the_site_s_normaliser_to_the_directory_s_tokenizer(tmp_path_factory, tmp_path, pairs,
                                                                                            monkeypatch):
    """A site tokenizer.json without the nmt_nfkc steps (fullwidth letters, NBSP) fails the writer's check, in words."""
    m = exported(tmp_path_factory, pairs, "m2m100")
    monkeypatch.setattr("toolkit.convert.web_tokenizer._nmt_nfkc", lambda: [])
    (tmp_path / "site").mkdir()
    model = web.WRITER.write(m, tmp_path / "site", lambda line: None)
    assert web.WRITER.verify(m, tmp_path / "site", model) == "the site's tokenizer gives other ids than the directory's (tabs and newlines)"
