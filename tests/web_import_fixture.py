"""The imported models' browser tests' shared builds: each model directory once per run (under the name the
architecture's own test module builds it, so the suite trains each model once), its site once per run (`tk export DIR
--web SITE`, as users run it), and the checks a page of it answers.

tests/convert/test_web_imports.py and tests/convert/test_web_import_decoding.py each hold half of the models (two files
of about equal time for pytest-xdist's --dist loadfile); each model's tokenizer and decoding are checked in one page.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, built_once
from convert.test_web import CHROMIUM, static_server
from hf_marian_fixture import fra_eng_lines
from hf_seq2seq_fixture import exported_import

from toolkit.convert import web
from toolkit.core import manifest as manifest_mod
from toolkit.core.batching import DecodeOptions, decode_ids
from toolkit.core.textprep import TextOptions
from toolkit.core.tokenizers import choose_languages, open_tokenizer, with_languages
from toolkit.deploy.translate import open_model, translate_batch

HYPS = "async ([ids, opts]) => (await tk.translateIds(ids, opts)).map((n) => n[0].tokens)"


def _marian(path: Path, pairs: list) -> None:
    from hf_marian_fixture import marian_directory

    marian_directory(path, pairs[:400])  # swish, as opus-mt's: test_hf_marian.py's shared-swish


def _marian_tc_big(path: Path, pairs: list) -> None:
    from hf_marian_fixture import marian_directory
    from pytorch.test_hf_marian_family import TC_BIG

    marian_directory(path, pairs[:400], **TC_BIG)  # two vocabularies: test_hf_marian_family.py's


def _marian_from_tk(path: Path, pairs: list) -> None:
    """tk's shipped Transformer as a MarianMTModel (`tk export --to-hf`): a trained Marian that says varied things, whose
    SentencePiece model has the identity rule (the others' have nmt_nfkc)."""
    from click.testing import CliRunner

    from toolkit.cli import main

    result = CliRunner().invoke(main, ["export", str(REPO / "exported" / "transformer"), "--to-hf", str(path)])
    assert result.exit_code == 0, result.output


def _m2m100(path: Path, pairs: list) -> None:
    from hf_seq2seq_fixture import m2m100_directory

    m2m100_directory(path, pairs[:400])


def _nllb(path: Path, pairs: list) -> None:
    from hf_seq2seq_fixture import nllb_directory

    nllb_directory(path, pairs[:400])


def _mbart(style: str) -> Callable[[Path, list], None]:
    def build(path: Path, pairs: list) -> None:
        from pytorch.test_hf_mbart import mbart_directory

        mbart_directory(path, pairs[:400], style)  # mBART-50 forces the target's code first; cc25 starts the decoder with it

    return build


def _t5(path: Path, pairs: list) -> None:
    from pytorch.test_hf_t5 import t5_directory

    t5_directory(path, pairs[:400], mt5=False)


def _bart(path: Path, pairs: list) -> None:
    from pytorch.test_hf_bart import bart_directory

    bart_directory(path, pairs[:400])


# model -> (the name its own test module builds it under, its builder)
BUILDS = {
    "marian": ("hf-marian-shared-swish", _marian), "marian-tc-big": ("hf-marian-tc-big", _marian_tc_big),
    "marian-from-tk": ("shipped-as-marian", _marian_from_tk), "m2m100": ("hf-m2m100", _m2m100), "nllb": ("hf-nllb", _nllb),
    "mbart": ("hf-mbart-mbart50", _mbart("mbart50")), "mbart-cc25": ("hf-mbart-cc25", _mbart("cc25")), "t5": ("hf-t5", _t5),
    "bart": ("hf-bart", _bart),
}


def directory(tmp_path_factory, pairs, model: str) -> Path:
    """The tk model directory of `model` (`tk export hf:DIR`), built once per run."""
    name, build = BUILDS[model]
    return exported_import(tmp_path_factory, name, lambda path: build(path, pairs))[1]


def site(tmp_path_factory, pairs, model: str) -> Path:
    """`tk export DIR --web SITE` of `model`, as users run it (the writer's verify stage included), once per run.
    A test that changes a file copies the site first (copied_site)."""
    from click.testing import CliRunner

    from toolkit.cli import main

    source = directory(tmp_path_factory, pairs, model)

    def build(root: Path) -> None:
        r = CliRunner().invoke(main, ["export", str(source), "--web", str(root / "site")])
        assert r.exit_code == 0, r.output

    return built_once(tmp_path_factory, f"web-site-{model}", build) / "site"


def shipped_site(tmp_path_factory) -> Path:
    """`tk export exported/transformer --web SITE`, tk's shipped model, once per run (the WebGPU and glossary tests')."""
    from click.testing import CliRunner

    from toolkit.cli import main

    def build(root: Path) -> None:
        r = CliRunner().invoke(main, ["export", str(REPO / "exported" / "transformer"), "--web", str(root / "site")])
        assert r.exit_code == 0, r.output

    return built_once(tmp_path_factory, "web-site", build) / "site"


def copied_site(tmp_path_factory, pairs, model: str, to: Path) -> Path:
    shutil.copytree(site(tmp_path_factory, pairs, model), to)
    return to


@contextmanager
def chromium() -> Iterator:
    """One headless Chromium for a test module; each page in a context of its own (nothing cached across sites)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def page_of(browser, site_dir: Path, query: str = "") -> Iterator:
    """A page of the site (served by a static file server), with the errors it throws in `page.errors`."""
    with static_server(site_dir) as url:
        context = browser.new_context()
        try:
            page = context.new_page()
            page.errors = []
            page.on("pageerror", lambda e: page.errors.append(str(e)))
            page.goto(url + query)
            yield page
        finally:
            context.close()


def python_tokens(model, ids: list[list[int]], m: manifest_mod.Manifest, **given) -> list[list[int]]:
    """ONNX Runtime CPU's tokens: decode_ids with the options tk translate builds for the model (its rules, its limits,
    the guards)."""
    return [n[0].tokens for n in decode_ids(model.backend(), ids, DecodeOptions.for_manifest(m, **given))]


# Whitespace runs and kinds, NBSP, accents composed and not, NFKC's characters, emoji (with a joiner), CJK: 20 of the
# 50 sentences; the other 30 are corpus lines, English and French.
AWKWARD = [
    "two  spaces,   three,\t\ttabs\nand a line break", "  leading and trailing  ", "\u00a0no-break\u00a0space\u202fnarrow",
    "ideographic\u3000space\u2009thin\u2028line", "café crème brûlée", "Zoë's naïve façade", "ÉCOLE À PARIS",
    "e\u0301te\u0301 decomposed", "I ❤️ Paris 😀👍🏽 🇫🇷", "family 👨\u200d👩\u200d👧 joined", "中文字符 日本語のテキスト 한국어",
    "Ωμέγα and עברית", "ﬁnancial ① ２ Ⅻ ㎞ ½", "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ", "tilde ～ and ~", "soft\u00adhyphen, zero\u200bwidth",
    "▁ already ▁▁ escaped", "ALL CAPS SENTENCE.", "x" * 80, "a",
]

# The models whose decoding the page is held to (greedy, beam 4, a tight length guard), and those whose other target
# language chosen in the page is checked: one of each way a target is set (forced first token; decoder start).
DECODED = {"marian-from-tk", "marian-tc-big", "nllb", "mbart", "t5", "bart"}
OTHER_TARGET = {"nllb": "deu_Latn", "mbart-cc25": "de_DE"}


def texts_of(pairs) -> list[str]:
    lines = [e for e, _ in pairs[1000:1015]] + [f for _, f in pairs[1000:1015]]
    assert len(lines + AWKWARD) == 50
    return lines + AWKWARD


def check_page(browser, tmp_path_factory, pairs, model: str) -> None:  # Over 60 lines: one page's checks, in order
    """`model`'s site in one page: its tokenizer's ids and text are the directory's Python tokenizer's (open_tokenizer)
    on 50 sentences (and another source language's, where the model has one); for DECODED models the page's greedy,
    beam-4 and tightly guarded tokens are ONNX Runtime CPU's (decode_ids with the model's own DecodeOptions, as tk
    translate decodes) on 50 held-out sentences, the decoded text is the Python tokenizer's, and tk.translate's text is
    tk translate's (a sentence a guard cut decoded again with a wider beam, a loop guard's cut ended on a whole word,
    each by the tokenizer's own pieces); for OTHER_TARGET, the
    page offers the languages with the export's pair chosen, and a target chosen in it is tk translate --target-lang's."""
    site_dir, d = site(tmp_path_factory, pairs, model), directory(tmp_path_factory, pairs, model)
    m = manifest_mod.load(d)
    entry = json.loads((site_dir / "model.json").read_text(encoding="utf-8"))["tokenizer"]
    assert entry["kind"] == "tokenizers" and (site_dir / "vendor" / "tokenizers.min.mjs").is_file()
    texts = texts_of(pairs)
    tokenizer = open_tokenizer(m)
    want = tokenizer.encode(texts)
    # another source language (a T5: a pair and its task prefix), as tk translate --source-lang/--target-lang takes it
    codes = sorted(c for c in entry["languages"] or {} if c != entry["source_lang"])
    pair = {"sourceLang": codes[0]} if codes else {}
    if entry["prefixes"]:
        pair = dict(zip(("sourceLang", "targetLang"), max(entry["prefixes"]).split("-")))
    want_other = with_languages(m, tokenizer, pair["sourceLang"], pair.get("targetLang"))[1].encode(texts) if pair else None
    # The sentences reach the end token and the rest of what goes around the pieces.
    assert all(ids[-1] in (m.rules().end, *(entry["languages"] or {}).values()) for ids in want)
    # output ids to decode: the target vocabulary's where it is another (a Marian of two vocabularies)
    outputs = tokenizer.target_ids(texts) if entry.get("target") else want
    if model in DECODED or model in OTHER_TARGET:
        translator = open_model(d, "cpu")
        ids = tokenizer.encode([e for e, _ in pairs[1000:1050]])
    if model in DECODED:
        greedy = python_tokens(translator, ids, m, batch_size=16)
        beam = python_tokens(translator, ids, m, beam=4, batch_size=16)
        # a model that says different things (the tc-big shape, trained as briefly as its own tests need: 24 of 50)
        assert len({tuple(t) for t in greedy}) > (20 if model == "marian-tc-big" else 25) and greedy != beam
        # A tight length guard (0.4 x source + 1): most hypotheses meet their limit, where a forced end token (mBART's)
        # ends them.
        tight = python_tokens(translator, ids, m, beam=4, batch_size=16, max_len_a=0.4, max_len_b=1)
        assert sum(len(t) < len(b) for t, b in zip(tight, beam)) >= 5  # T5: 10 of 50 (its task prefix lengthens every source)
        sources = [e for e, _ in pairs[1000:1050]]
        translated = [n[0].text for n in translate_batch(translator, sources, DecodeOptions.for_manifest(m, batch_size=16),
                                                          text=TextOptions(enabled=False))]
    if model in OTHER_TARGET:
        target = OTHER_TARGET[model]
        default = python_tokens(translator, ids, m, batch_size=16)
        other = python_tokens(translator, ids, choose_languages(m, None, target), batch_size=16)
        assert sum(a != b for a, b in zip(default, other)) >= 40
    with page_of(browser, site_dir) as page:
        got = page.evaluate("texts => tk.encode(texts)", texts)
        back = page.evaluate("ids => tk.decode(ids)", outputs)
        got_other = page.evaluate("([texts, pair]) => tk.encode(texts, pair)", [texts, pair]) if pair else None
        if model in DECODED or model in OTHER_TARGET:
            page.evaluate("tk.ready")
        if model in DECODED:
            assert page.evaluate(HYPS, [ids, {"batchSize": 16}]) == greedy
            assert page.evaluate(HYPS, [ids, {"batchSize": 16, "beam": 4}]) == beam
            assert page.evaluate(HYPS, [ids, {"batchSize": 16, "beam": 4, "maxLenA": 0.4, "maxLenB": 1}]) == tight
            assert page.evaluate("ids => tk.decode(ids)", greedy) == tokenizer.decode(greedy)
            assert [o["text"] for o in page.evaluate("texts => tk.translate(texts, {batchSize: 16})", sources)] == translated
        if model in OTHER_TARGET:
            assert page.is_visible("#target") and target in page.eval_on_selector_all("#target option", "os => os.map((o) => o.value)")
            declared = m.declared().tokenizer
            assert (page.input_value("#source"), page.input_value("#target")) == (declared.source_lang, declared.target_lang)
            assert page.evaluate(HYPS, [ids, {"batchSize": 16, "targetLang": target}]) == other
            assert page.evaluate(HYPS, [ids, {"batchSize": 16}]) == default
        assert not page.errors, page.errors
    wrong = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
    assert not wrong, f"{len(wrong)} of {len(texts)} texts get other ids in the page, e.g. {wrong[:2]}"
    assert back == tokenizer.decode(outputs)
    assert got_other == want_other and (want_other is None or want_other != want)
    assert sum(bool(t.strip()) for t in back) >= 45  # the ids decode to words
    print(f"\n{model}: {len(json.loads((site_dir / entry['file']).read_text())['model']['vocab'])} pieces, tokenizer.json "
          f"{(site_dir / entry['file']).stat().st_size / 1024:.1f} KiB, library "
          f"{(site_dir / 'vendor' / 'tokenizers.min.mjs').stat().st_size / 1024:.1f} KiB; download per page load "
          + ", ".join(f"{v} {n / 2**20:.2f} MiB" for v, n in web.downloads(site_dir).items()))


def first_step(model, ids: list[list[int]], m: manifest_mod.Manifest) -> np.ndarray:
    """fp32's first-step log-probabilities of 16 sources in ONNX Runtime CPU."""
    from toolkit.core.decoding import pad_batch

    backend = model.backend()
    state = backend.encode(*pad_batch(ids[:16], m.rules().pad))
    return backend.step(np.full(16, m.rules().start), state)[0]


# Module fixtures of both browser test files (each file gets its own instance).
@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    return fra_eng_lines(corpus_zip, 2000)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b
