"""tk export --web for imported models, in headless Chromium (the other half of the models beside test_web_imports.py;
the shared builds and checks are tests/web_import_fixture.py): M2M100, NLLB-200's layout (tokenizer.json, eng_Latn-style
codes, the target's code forced first), mBART-cc25 (the decoder starts with the target's code), T5 and BART. In one page per
model: the page's token ids and text are the directory's Python tokenizer's on 50 sentences, its greedy and beam-4
tokens ONNX Runtime CPU's (the page decodes by the model's declared rules: start and end tokens, pad, generate's beam
rule and length penalty, the forced first token, the output limit), and another target language chosen in the page is
tk translate --target-lang's. A hostile tokenizer file in the site is one line in the page; the writer's verify stage
holds the site's normaliser to the directory's tokenizer. A forced-first import's page refuses a glossary in one line."""

from __future__ import annotations

import json

import pytest
import web_import_fixture
from convert.test_web import CHROMIUM
from web_import_fixture import check_page, copied_site, directory, page_of, site

from toolkit.convert import web
from toolkit.core import manifest as manifest_mod
from toolkit.core.errors import UsageError
from toolkit.deploy.translate import check_glossary

browser, pairs = web_import_fixture.browser, web_import_fixture.pairs  # the two files' shared module fixtures
pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed: apt-get install -y chromium")]


@pytest.mark.parametrize("model", ["m2m100", "nllb", "mbart-cc25", "t5", "bart"])
def test_the_page_tokenizes_and_decodes_an_import_as_python_does(model, browser, tmp_path_factory, pairs):
    check_page(browser, tmp_path_factory, pairs, model)


HOSTILE = {
    "not JSON": "{\"model\": ",
    "a model the library does not know": json.dumps({"normalizer": None, "pre_tokenizer": None, "post_processor": None,
                                                     "decoder": None, "added_tokens": [], "model": {"type": "Evil"}}),
    "no vocabulary": json.dumps({"normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
                                 "added_tokens": [], "model": {"type": "Unigram", "vocab": 7}}),
    "a JSON array": "[1, 2, 3]",
}


def test_a_hostile_tokenizer_file_in_the_site_is_one_line_in_the_page(browser, tmp_path_factory, tmp_path, pairs):
    site_dir = copied_site(tmp_path_factory, pairs, "nllb", tmp_path / "site")
    file = json.loads((site_dir / "model.json").read_text())["tokenizer"]["file"]
    shown = {}
    for name, content in HOSTILE.items():
        (site_dir / file).write_text(content, encoding="utf-8")
        with page_of(browser, site_dir) as page:  # a context of its own: nothing cached from the last file
            page.wait_for_function("document.getElementById('status').textContent.startsWith('error')")
            shown[name] = page.inner_text("#status")
    for name, status in shown.items():
        assert status.startswith("error: the tokenizer tokenizer.json does not load: ") and "\n" not in status, (name, status)


def test_the_writer_s_verify_stage_holds_the_site_s_normaliser_to_the_directory_s_tokenizer(tmp_path_factory, tmp_path, pairs,
                                                                                            monkeypatch):
    """A site tokenizer.json without the nmt_nfkc steps (fullwidth letters, NBSP) fails the writer's check, in words."""
    m = manifest_mod.load(directory(tmp_path_factory, pairs, "m2m100"))
    monkeypatch.setattr("toolkit.convert.web_tokenizer._nmt_nfkc", lambda: [])
    (tmp_path / "site").mkdir()
    model = web.WRITER.write(m, tmp_path / "site", lambda line: None)
    assert web.WRITER.verify(m, tmp_path / "site", model) == "the site's tokenizer gives other ids than the directory's (tabs and newlines)"


def test_a_page_of_an_import_that_forces_its_first_token_refuses_a_glossary_in_tk_translate_s_words(browser, tmp_path_factory,
                                                                                                     pairs):
    """NLLB's target language is forced first, which constrained decoding (an import's one way in) does not allow."""
    with pytest.raises(UsageError) as e:
        check_glossary(manifest_mod.load(directory(tmp_path_factory, pairs, "nllb")))
    with page_of(browser, site(tmp_path_factory, pairs, "nllb")) as page:
        page.wait_for_function("!document.getElementById('translate').disabled")
        page.fill("#input", "The house is big.")
        page.fill("#glossary", "house\tdemeure")
        page.click("#translate")
        page.wait_for_function("document.getElementById('status').textContent.startsWith('error')")
        assert page.inner_text("#status") == f"error: {e.value}"
