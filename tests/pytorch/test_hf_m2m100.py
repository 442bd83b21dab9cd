"""Hugging Face M2M100ForConditionalGeneration in: `tk export hf:DIR`, verify, translate with languages, localize.

A tiny M2M100 built here (tests/hf_seq2seq_fixture.py, no download): pre-LN layers with final layer norms, sinusoidal
positions from padding_idx + 1, scaled embeddings, `__en__` on the source, `__fr__` forced first. Held-out sentences
must be translated to generate's tokens, greedy and beam 4.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import check_int8_and_openvino, one_line_error
from hf_marian_fixture import fra_eng_lines
from hf_seq2seq_fixture import exported_import, m2m100_directory
from verify.test_localize import _edit_decoder

from toolkit.core.architectures import ARCHITECTURES

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    return fra_eng_lines(corpus_zip, 2000)


@pytest.fixture(scope="module")
def m2m100(tmp_path_factory, pairs) -> tuple[Path, Path]:
    """(Hugging Face directory, tk model directory exported from it with `tk export hf:DIR`), built once per run."""
    return exported_import(tmp_path_factory, "hf-m2m100", lambda path: m2m100_directory(path, pairs[:400]))


def _held_out(pairs, n: int = 40) -> list[str]:
    return [e for e, _ in pairs[1000: 1000 + n]]


def _generate(hf: Path, english: list[str], beam: int) -> list[str]:
    """generate's text for en -> fr. transformers 5's M2M100Tokenizer keeps the `__fr__` code in skip_special_tokens
    text; the code is no part of the translation, so it is dropped with the start token before decoding."""
    from transformers import M2M100ForConditionalGeneration, M2M100Tokenizer

    tokenizer = M2M100Tokenizer.from_pretrained(hf, src_lang="en")
    model = M2M100ForConditionalGeneration.from_pretrained(hf).eval()
    batch = tokenizer(english, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**batch, num_beams=beam, do_sample=False, forced_bos_token_id=tokenizer.get_lang_id("fr"))
    assert (out[:, 1] == tokenizer.get_lang_id("fr")).all()
    return tokenizer.batch_decode(out[:, 2:], skip_special_tokens=True)


@pytest.mark.transformers_lines
def test_the_tokenizer_gives_m2m100_tokenizer_ids(m2m100, pairs):
    from transformers import M2M100Tokenizer

    from toolkit.core import manifest
    from toolkit.core.tokenizers import open_tokenizer, with_languages

    hf, out = m2m100
    m = manifest.load(out)
    english = [e for e, _ in pairs[:300]]
    _, ours = with_languages(m, open_tokenizer(m), "en", "fr")
    assert ours.encode(english) == [M2M100Tokenizer.from_pretrained(hf, src_lang="en")(e)["input_ids"] for e in english]
    _, ours = with_languages(m, ours, "de", "fr")  # another source code, the same text
    assert ours.encode(english[:20]) == [M2M100Tokenizer.from_pretrained(hf, src_lang="de")(e)["input_ids"] for e in english[:20]]
    assert m.declared().tokenizer.served()["target"][:3] == sorted(m.declared().tokenizer.languages)[:3]


@pytest.mark.transformers_lines
@pytest.mark.parametrize("beam", [1, 4])
def test_translations_are_generates(m2m100, pairs, beam):
    from toolkit import Translator

    hf, out = m2m100
    english = _held_out(pairs)
    want = _generate(hf, english, beam)
    got = Translator(out).translate(english, beam=beam, raw=True, loop_guard=False, max_len_a=None, source_lang="en", target_lang="fr")
    assert sum(a != b for a, b in zip(got, want)) <= 1  # one near-tie that this CPU's rounding may break either way
    assert len(set(want)) > 5  # the model says different things, which end at lengths of their own


def test_beam_search_reads_one_copy_of_a_sentence_s_encoder_outputs(m2m100, pairs):
    """M2M100's decoder sizes its positions by src_len's rows. The per-sentence cross-attention
    (toolkit.graphs.sentence_cross) once refused that graph, and every beam row read a copy of its sentence's encoder
    outputs (at the NLLB-600M shape, int8 beam 4: 9% of a batch's time). That read now takes the step's rows, and the
    graph is regrouped. Each variant then translates as it does with one copy per row."""
    from toolkit import Translator

    english = _held_out(pairs, 12)
    for variant in (None, "int8"):
        translator = Translator(m2m100[1], provider="cpu", variant=variant)
        b = translator._backend
        b = getattr(b, "inner", b)  # the forced first token's wrapper
        assert b._per_sentence == b.decoder_spec.constant_inputs, variant
        shared = translator.translate(english, beam=4, streams=1, batch_size=4, source_lang="en", target_lang="fr")
        b._per_sentence = None  # one copy per row, as before the regrouping
        assert translator.translate(english, beam=4, streams=1, batch_size=4, source_lang="en", target_lang="fr") == shared, variant


def test_an_unknown_language_is_one_line_listing_the_models_codes(m2m100, cli):
    from toolkit import Translator
    from toolkit.core.errors import UsageError

    _, out = m2m100
    with pytest.raises(UsageError, match=r"unknown target language 'xx'; this model's codes: .*\bfr\b"):
        Translator(out).translate(["Hello."], target_lang="xx")
    assert "unknown source language 'klingon'" in one_line_error(cli("translate", "--model", out, "--source-lang", "klingon", "Hi."), 2)


@pytest.mark.transformers_lines
def test_verify_holds_the_graphs_to_generate(cli, m2m100, tmp_path):
    hf, out = m2m100
    report = tmp_path / "report.json"
    result = cli("verify", out, "--checkpoint", f"hf:{hf}", "--sentences", 16, "--json", report)
    assert result.exit_code == 0, result.output
    rows = [r for r in json.loads(report.read_text())["rows"] if r["check"] == "generate"]
    assert {r["output"] for r in rows} == {"greedy tokens", "beam 4 tokens"} and all(r["ok"] for r in rows)


def _relu_to_tanh(graph) -> str:
    """The last decoder layer's activation (relu) turned into Tanh."""
    node = [n for n in graph.node if n.op_type == "Relu"][-1]
    node.op_type = "Tanh"
    return node.name


def test_a_swapped_activation_fails_verify_and_localize_names_the_transformers_module(cli, m2m100, tmp_path):
    hf, out = m2m100
    directory, _ = _edit_decoder(out, tmp_path, _relu_to_tanh)
    report = tmp_path / "report.json"
    result = cli("verify", directory, "--checkpoint", f"hf:{hf}", "--sentences", 4, "--json", report)
    assert result.exit_code == 1, result.output
    layers = json.loads((out / "manifest.json").read_text())["config"]["decoder_layers"]
    assert json.loads(report.read_text())["localization"]["first"]["module"] == f"model.decoder.layers.{layers - 1}.activation_fn"


def test_a_directory_of_another_architecture_is_refused_in_one_line(cli, m2m100, tmp_path):
    import shutil

    hf, _ = m2m100
    bad = tmp_path / "bad"
    shutil.copytree(hf, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "pegasus"}))
    error = one_line_error(cli("export", f"hf:{bad}", "--out", tmp_path / "out"), 2)
    assert "has model_type 'pegasus'; tk imports " in error and all(a.hf_class in error for a in ARCHITECTURES.values() if a.hf_class)


def test_int8_and_openvino_run_an_imported_m2m100(cli, m2m100, pairs, tmp_path):
    """Guarded int8 stored beside the graphs and verified (held to its tolerances), and OpenVINO translating with the
    languages chosen: the paths docs/models.md marks measured for m2m100."""
    hf, out = m2m100
    check_int8_and_openvino(cli, hf, out, _held_out(pairs, 6), tmp_path)


def test_ctranslate2_converts_verifies_and_translates_an_imported_m2m100(cli, m2m100, pairs, tmp_path):
    """`--runtime ctranslate2` on an M2M100 (pre-LN, offset sinusoidal positions, the target language forced first as
    CTranslate2's target prefix): verified against hf:, generate's greedy text, and a swapped cross-attention key/value
    weight pair fails verify."""
    pytest.importorskip("ctranslate2", reason="the ct2 extra (in dev) installs ctranslate2")
    from helpers import check_ctranslate2

    hf, out = m2m100
    english = _held_out(pairs)
    layer = "model.decoder.layers.0.encoder_attn"
    check_ctranslate2(cli, hf, out, english, _generate(hf, english, 1), tmp_path,
                      (f"{layer}.k_proj.weight", f"{layer}.v_proj.weight"), source_lang="en", target_lang="fr")
