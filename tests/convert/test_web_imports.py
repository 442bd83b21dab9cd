"""tk export --web for imported models, in headless Chromium (half of the models; the other half is
test_web_import_decoding.py, the shared builds and checks tests/web_import_fixture.py): Marian (opus-mt's shape; tk's
shipped Transformer exported with `tk export --to-hf`, whose SentencePiece model has the identity rule; the tc-big shape,
two vocabularies: the page encodes with the source's and decodes with the target's) and mBART-50. In one page per
model: the page's token ids and text are the directory's Python tokenizer's on 50 sentences, and its greedy and beam-4
tokens are ONNX Runtime CPU's (web_import_fixture.check_page); the int8 graphs the site writes decode within int8's
tolerance; a missing graph is one line in the page."""

from __future__ import annotations

import json

import numpy as np
import pytest
import web_import_fixture
from convert.test_web import CHROMIUM
from web_import_fixture import HYPS, check_page, copied_site, directory, first_step, page_of, python_tokens, site

from toolkit.core.variants import CATALOGUE
from toolkit.deploy.translate import open_model
from toolkit.verify.compare import compare

browser, pairs = web_import_fixture.browser, web_import_fixture.pairs  # the two files' shared module fixtures
pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed: apt-get install -y chromium")]


@pytest.mark.parametrize("model", ["marian", "marian-from-tk", "marian-tc-big", "mbart"])
def test_the_page_tokenizes_and_decodes_an_import_as_python_does(model, browser, tmp_path_factory, pairs):
    check_page(browser, tmp_path_factory, pairs, model)


def test_int8_decodes_an_import_in_the_page_within_int8_s_tolerance(browser, tmp_path_factory, pairs):
    """The int8 graphs the site writes, held as tk's own int8 test holds them: first-step log-probabilities within tk
    verify's int8 tolerance of fp32's; the tokens against ONNX Runtime CPU int8's are counted (a near-tie may flip)."""
    d = directory(tmp_path_factory, pairs, "marian-from-tk")
    model = open_model(d, "cpu")
    m = model.manifest
    ids = model.tokenizer.encode([e for e, _ in pairs[1000:1050]])
    fp32 = first_step(model, ids, m)
    int8 = python_tokens(open_model(d, "cpu", variant="int8"), ids, m, batch_size=16)
    with page_of(browser, site(tmp_path_factory, pairs, "marian-from-tk"), "?variant=int8") as page:
        page.evaluate("tk.ready")
        got = np.array(page.evaluate("ids => tk.firstStep(ids)", ids[:16]), dtype=np.float32).reshape(16, -1)
        stats = compare(fp32, got, *CATALOGUE["int8"].tolerance)
        assert stats["ok"], stats
        tokens = page.evaluate(HYPS, [ids, {"batchSize": 16}])
        assert not page.errors, page.errors
    same = sum(a == b for a, b in zip(tokens, int8))
    print(f"\nint8 in Chromium: first-step log-probs max abs error {stats['max_abs']:.3f} against fp32; "
          f"greedy tokens identical to ONNX Runtime CPU int8 on {same}/50 sentences")
    assert same >= 40, same


def test_a_missing_graph_gives_the_page_a_one_line_error(browser, tmp_path_factory, tmp_path, pairs):
    site_dir = copied_site(tmp_path_factory, pairs, "marian-from-tk", tmp_path / "site")
    graph = json.loads((site_dir / "model.json").read_text())["variants"]["int8"]["graphs"]["decoder"]
    (site_dir / graph).unlink()
    with page_of(browser, site_dir, "?variant=int8") as page:
        page.wait_for_function("document.getElementById('status').textContent.startsWith('error: ')")
        status = page.inner_text("#status")
        assert graph in status and "\n" not in status.strip(), status


def test_the_writer_s_verify_stage_holds_the_target_tokenizer_of_opus_mt_s_shape_to_its_target_ids(tmp_path_factory, pairs,
                                                                                                    monkeypatch):
    """opus-mt's shape writes its output by a target SentencePiece model of its own: the site carries it (a glossary's
    targets' ids in the page), and the writer's verify stage holds it to MarianTokenizer.target_ids."""
    from toolkit.convert import web_tokenizer
    from toolkit.core import manifest as manifest_mod

    m = manifest_mod.load(directory(tmp_path_factory, pairs, "marian"))
    data, entry = web_tokenizer.site_tokenizer(m)
    assert entry["target_ids"] and web_tokenizer.site_tokenizer_problem(m, data, entry) is None
    wrong = {**entry, "target_ids": data}  # the source's model in its place
    monkeypatch.setattr(web_tokenizer, "site_tokenizer", lambda m: (data, wrong))
    assert web_tokenizer.site_tokenizer_problem(m, data, wrong) == "the site's target tokenizer gives other ids than the directory's"
