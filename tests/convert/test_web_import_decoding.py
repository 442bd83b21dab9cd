"""tk export --web for the imported architectures (Marian, M2M100/NLLB, mBART, T5, BART): the page decodes by the
model's own declared rules (start and end tokens, pad, generate's beam rule and length penalty, the forced first token,
the output limit), so that its greedy and beam-4 tokens in headless Chromium are ONNX Runtime CPU's (decode_ids with the
model's own DecodeOptions, as tk translate decodes) on 50 held-out sentences. Token ids come from the Python tokenizer:
the decoding is tested alone."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import REPO, built_once
from convert.test_web import CHROMIUM, static_server
from hf_marian_fixture import fra_eng_lines
from hf_seq2seq_fixture import exported_import, nllb_directory

from toolkit.cli import main
from toolkit.core import manifest
from toolkit.core.batching import DecodeOptions, decode_ids
from toolkit.core.decoding import pad_batch
from toolkit.core.tokenizers import choose_languages
from toolkit.core.variants import CATALOGUE
from toolkit.deploy.translate import open_model
from toolkit.verify.compare import compare

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed: apt-get install -y chromium")]

HYPS = "async ([ids, opts]) => (await tk.translateIds(ids, opts)).map((n) => n[0].tokens)"


@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    return fra_eng_lines(corpus_zip, 2000)


def _marian(tmp_path_factory) -> Path:
    """tk's shipped model written as a MarianMTModel and imported back: a trained Marian that says varied things."""

    def build(root: Path) -> None:
        for args in (["--to-hf", root / "hf"], ["--out", root / "tk"]):
            source = REPO / "exported" / "transformer" if args[0] == "--to-hf" else f"hf:{root / 'hf'}"
            result = CliRunner().invoke(main, ["export", str(source), *map(str, args)])
            assert result.exit_code == 0, result.output

    return built_once(tmp_path_factory, "web-marian", build) / "tk"


def _built(tmp_path_factory, pairs, name: str, make) -> Path:
    def build(root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make(root / "hf")
        result = CliRunner().invoke(main, ["export", f"hf:{root / 'hf'}", "--out", str(root / "tk")])
        assert result.exit_code == 0, result.output

    return built_once(tmp_path_factory, name, build) / "tk"


def imported(which: str, tmp_path_factory, pairs) -> Path:
    """The tk model directory of a briefly trained import (the fixtures the import tests build, shared with them)."""
    if which == "marian":
        return _marian(tmp_path_factory)
    if which == "m2m100":  # NLLB-200's layout: tokenizer.json, eng_Latn-style codes, the target's code forced first
        return exported_import(tmp_path_factory, "hf-nllb", lambda path: nllb_directory(path, pairs[:400]))[1]
    if which in ("mbart", "cc25"):  # mBART-50 forces the target's code first; mBART-cc25 starts the decoder with it
        from pytorch.test_hf_mbart import mbart_directory

        style = "mbart50" if which == "mbart" else which
        return _built(tmp_path_factory, pairs, f"hf-mbart-{style}", lambda path: mbart_directory(path, pairs[:400], style))
    if which == "bart":
        from pytorch.test_hf_bart import bart_directory

        return exported_import(tmp_path_factory, "hf-bart", lambda path: bart_directory(path, pairs[:400]))[1]
    from pytorch.test_hf_t5 import t5_directory

    return _built(tmp_path_factory, pairs, "hf-t5", lambda path: t5_directory(path, pairs[:400], mt5=False))


@pytest.fixture()
def site_of(cli, tmp_path):
    """`tk export DIR --web SITE` of a model directory, as users run it (the model's own tokenizer in the page)."""

    def write(model: Path) -> Path:
        site = tmp_path / "site"
        r = cli("export", model, "--web", site)
        assert r.exit_code == 0, r.output
        return site

    return write


def python_tokens(model, ids: list[list[int]], m: manifest.Manifest, **given) -> list[list[int]]:
    """ONNX Runtime CPU's tokens: decode_ids with the options tk translate builds for the model (its rules, its limits,
    the guards)."""
    return [n[0].tokens for n in decode_ids(model.backend(), ids, DecodeOptions.for_manifest(m, **given))]


def open_page(p, url: str):
    browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    return browser, page, errors


@pytest.mark.parametrize("which", ["marian", "m2m100", "mbart", "t5", "bart"])
def test_the_page_decodes_an_import_with_onnx_runtime_s_greedy_and_beam_tokens(which, tmp_path_factory, pairs, site_of):
    from playwright.sync_api import sync_playwright

    directory = imported(which, tmp_path_factory, pairs)
    site = site_of(directory)
    model = open_model(directory, "cpu")
    english = [e for e, _ in pairs[1000:1050]]
    ids = model.tokenizer.encode(english)
    m = model.manifest
    greedy = python_tokens(model, ids, m, batch_size=16)
    beam = python_tokens(model, ids, m, beam=4, batch_size=16)
    assert len({tuple(t) for t in greedy}) > 25 and greedy != beam  # a model that says different things
    # A tight length guard (0.4 x source + 1): most hypotheses meet their limit, where a forced end token (mBART's) ends them.
    tight = python_tokens(model, ids, m, beam=4, batch_size=16, max_len_a=0.4, max_len_b=1)
    assert sum(len(t) < len(b) for t, b in zip(tight, beam)) >= 5  # T5: 10 of 50 (its task prefix lengthens every source)
    with static_server(site) as url, sync_playwright() as p:
        browser, page, errors = open_page(p, url)
        try:
            page.goto(url)
            page.evaluate("tk.ready")
            assert page.evaluate(HYPS, [ids, {"batchSize": 16}]) == greedy
            assert page.evaluate(HYPS, [ids, {"batchSize": 16, "beam": 4}]) == beam
            assert page.evaluate(HYPS, [ids, {"batchSize": 16, "beam": 4, "maxLenA": 0.4, "maxLenB": 1}]) == tight
            assert not errors, errors
        finally:
            browser.close()


@pytest.mark.parametrize("which, target", [("m2m100", "deu_Latn"), ("cc25", "de_DE")])
def test_another_target_language_chosen_in_the_page_is_tk_translate_s(which, target, tmp_path_factory, pairs, site_of):
    """The page offers the model's languages with the export's pair chosen, and a target chosen in it forces that
    target's token first (mBART-cc25: starts the decoder with it), as tk translate --target-lang does."""
    from playwright.sync_api import sync_playwright

    directory = imported(which, tmp_path_factory, pairs)
    site = site_of(directory)
    model = open_model(directory, "cpu")
    ids = model.tokenizer.encode([e for e, _ in pairs[1000:1050]])
    default = python_tokens(model, ids, model.manifest, batch_size=16)
    other = python_tokens(model, ids, choose_languages(model.manifest, None, target), batch_size=16)
    assert sum(a != b for a, b in zip(default, other)) >= 40
    with static_server(site) as url, sync_playwright() as p:
        browser, page, errors = open_page(p, url)
        try:
            page.goto(url)
            page.evaluate("tk.ready")
            assert page.is_visible("#target") and target in page.eval_on_selector_all("#target option", "os => os.map((o) => o.value)")
            declared = model.manifest.declared().tokenizer
            assert (page.input_value("#source"), page.input_value("#target")) == (declared.source_lang, declared.target_lang)
            assert page.evaluate(HYPS, [ids, {"batchSize": 16, "targetLang": target}]) == other
            assert page.evaluate(HYPS, [ids, {"batchSize": 16}]) == default
            assert not errors, errors
        finally:
            browser.close()


def test_int8_decodes_an_import_in_the_page_within_int8_s_tolerance(tmp_path_factory, pairs, site_of):
    """The int8 graphs the site writes, held as tk's own int8 test holds them: first-step log-probabilities within tk
    verify's int8 tolerance of fp32's; the tokens against ONNX Runtime CPU int8's are counted (a near-tie may flip)."""
    from playwright.sync_api import sync_playwright

    directory = imported("marian", tmp_path_factory, pairs)
    site = site_of(directory)
    model = open_model(directory, "cpu")
    m = model.manifest
    ids = model.tokenizer.encode([e for e, _ in pairs[1000:1050]])
    backend = model.backend()
    state = backend.encode(*pad_batch(ids[:16], m.rules().pad))
    first_step, _ = backend.step(np.full(16, m.rules().start), state)
    int8 = python_tokens(open_model(directory, "cpu", variant="int8"), ids, m, batch_size=16)
    with static_server(site) as url, sync_playwright() as p:
        browser, page, errors = open_page(p, url)
        try:
            page.goto(url + "?variant=int8")
            page.evaluate("tk.ready")
            got = np.array(page.evaluate("ids => tk.firstStep(ids)", ids[:16]), dtype=np.float32).reshape(16, -1)
            stats = compare(first_step, got, *CATALOGUE["int8"].tolerance)
            assert stats["ok"], stats
            tokens = page.evaluate(HYPS, [ids, {"batchSize": 16}])
            assert not errors, errors
        finally:
            browser.close()
    same = sum(a == b for a, b in zip(tokens, int8))
    print(f"\nint8 in Chromium: first-step log-probs max abs error {stats['max_abs']:.3f} against fp32; "
          f"greedy tokens identical to ONNX Runtime CPU int8 on {same}/50 sentences")
    assert same >= 40, same


def test_a_missing_graph_gives_the_page_a_one_line_error(tmp_path_factory, pairs, site_of):
    from playwright.sync_api import sync_playwright

    site = site_of(imported("marian", tmp_path_factory, pairs))
    graph = json.loads((site / "model.json").read_text())["variants"]["int8"]["graphs"]["decoder"]
    (site / graph).unlink()
    with static_server(site) as url, sync_playwright() as p:
        browser, page, errors = open_page(p, url)
        try:
            page.goto(url + "?variant=int8")
            page.wait_for_function("document.getElementById('status').textContent.startsWith('error: ')")
            status = page.inner_text("#status")
            assert graph in status and "\n" not in status.strip(), status
        finally:
            browser.close()
