"""Hugging Face MBartForConditionalGeneration in: `tk export hf:DIR`, verify, translate with languages, localize.

Two tiny mBARTs built here from MBartConfig (no download), trained en -> fr for a few dozen steps so that outputs end
at lengths of their own: an mBART-50 (MBart50Tokenizer's `[en_XX] text </s>`, decoder start </s>, `fr_XX` forced first)
with its tokenizer.json, and an mBART-cc25 (MBartTokenizer's `text </s> en_XX`, the decoder started with `fr_XX`, no
decoder_start_token_id in its config, as mbart-large-cc25's) with its sentencepiece.bpe.model alone. Both carry a
non-zero final_logits_bias (the released checkpoints' is zeros, so an exporter that drops it passes on them). Held-out
sentences must be translated to generate's tokens, greedy and beam 4.
"""

from __future__ import annotations

import io
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
from conftest import built_once
from helpers import check_int8_and_openvino, one_line_error
from hf_marian_fixture import fra_eng_lines
from hf_seq2seq_fixture import train
from onnx import numpy_helper
from verify.test_localize import _edit_decoder

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]
STYLES = ("mbart50", "cc25")


def _spm(lines: list[str], vocab_size: int) -> bytes:
    """A SentencePiece model as fairseq's mBART has one: <unk> 0, <s> 1, </s> 2, then the pieces."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=vocab_size, model_type="unigram",
                                   character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2)
    return out.getvalue()


def _tokenizer_class(style: str):
    from transformers import MBart50Tokenizer, MBartTokenizer

    return MBart50Tokenizer if style == "mbart50" else MBartTokenizer


def mbart_directory(path: Path, pairs: list[tuple[str, str]], style: str, *, steps: int = 150, seed: int = 0) -> Path:
    """Writes a tiny MBartForConditionalGeneration and its tokenizer (en_XX -> fr_XX) into `path`; returns `path`."""
    from transformers import MBartConfig, MBartForConditionalGeneration

    path.mkdir(parents=True, exist_ok=True)
    (path / "sentencepiece.bpe.model").write_bytes(_spm([e for e, _ in pairs] + [f for _, f in pairs], 200))
    cls = _tokenizer_class(style)
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": cls.__name__, "src_lang": "en_XX", "tgt_lang": "fr_XX"}))
    tokenizer = cls.from_pretrained(path, src_lang="en_XX", tgt_lang="fr_XX")  # transformers' own reading of the .model
    tokenizer.save_pretrained(path)
    if style == "cc25":  # the .model alone: tk's own "mbart" tokenizer kind
        (path / "tokenizer.json").unlink(missing_ok=True)
    elif not (path / "tokenizer.json").is_file():  # transformers 4's MBart50Tokenizer is the slow one: the fast one's file
        from transformers import MBart50TokenizerFast

        MBart50TokenizerFast.from_pretrained(path, src_lang="en_XX", tgt_lang="fr_XX").save_pretrained(path)
    torch.manual_seed(seed)
    config = MBartConfig(vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                         decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="gelu",
                         max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2, forced_eos_token_id=2,
                         decoder_start_token_id=2 if style == "mbart50" else None, dropout=0.0, attention_dropout=0.0,
                         init_std=0.1, scale_embedding=True)
    model = MBartForConditionalGeneration(config)
    with torch.no_grad():  # a bias the model learns around: dropping it changes the translations
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=torch.Generator().manual_seed(seed)))
    train(model, tokenizer, pairs, steps, seed)
    model.generation_config.max_length = 24
    model.generation_config.num_beams = 4
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    return fra_eng_lines(corpus_zip, 2000)


@pytest.fixture(scope="module", params=STYLES)
def mbart(request, tmp_path_factory, pairs) -> tuple[str, Path, Path]:
    """(style, Hugging Face directory, tk model directory exported with `tk export hf:DIR`), built once per run."""
    from click.testing import CliRunner

    from toolkit.cli import main

    def build(root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mbart_directory(root / "hf", pairs[:400], request.param)
        result = CliRunner().invoke(main, ["export", f"hf:{root / 'hf'}", "--out", str(root / "tk")])
        assert result.exit_code == 0, result.output

    root = built_once(tmp_path_factory, f"hf-mbart-{request.param}", build)
    return request.param, root / "hf", root / "tk"


def _held_out(pairs, n: int = 40) -> list[str]:
    return [e for e, _ in pairs[1000: 1000 + n]]


def _generate(style: str, hf: Path, english: list[str], beam: int, target: str = "fr_XX") -> tuple[list[str], list[bool]]:
    """generate's text for en_XX -> `target`, as the model card calls it (mBART-50: the target's code forced first;
    cc25: the decoder started with it), and whether each output ended before the limit."""
    from transformers import MBartForConditionalGeneration

    tokenizer = _tokenizer_class(style).from_pretrained(hf, src_lang="en_XX")
    model = MBartForConditionalGeneration.from_pretrained(hf).eval()
    code = tokenizer.convert_tokens_to_ids(target)
    batch = tokenizer(english, return_tensors="pt", padding=True)
    how = {"forced_bos_token_id": code} if style == "mbart50" else {"decoder_start_token_id": code}
    with torch.inference_mode():
        out = model.generate(**batch, num_beams=beam, do_sample=False, **how)
    out = out[:, 2:] if style == "mbart50" else out[:, 1:]  # the start token, and the forced code: no part of the text
    ended = [bool((row == tokenizer.eos_token_id).any()) for row in out]
    # A trailing "▁" piece decodes to a trailing space in transformers; tk strips it (the tokens are the same).
    return [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)], ended


def _translate(out: Path, english: list[str], beam: int, source: str = "en", target: str = "fr") -> list[str]:
    from toolkit import Translator

    return Translator(out).translate(english, beam=beam, raw=True, loop_guard=False, max_len_a=None, source_lang=source,
                                     target_lang=target)


@pytest.mark.transformers_lines
def test_the_tokenizer_gives_the_models_tokenizer_ids(mbart, pairs):
    from toolkit.core import manifest
    from toolkit.core.tokenizers import open_tokenizer, with_languages

    style, hf, out = mbart
    m = manifest.load(out)
    assert m.declared().tokenizer.kind == ("tokenizer.json" if style == "mbart50" else "mbart")
    texts = [e for e, _ in pairs[:300]] + [f for _, f in pairs[:300]]
    for code in ("en_XX", "de_DE"):
        _, ours = with_languages(m, open_tokenizer(m), code, "fr")
        theirs = _tokenizer_class(style).from_pretrained(hf, src_lang=code)
        assert ours.encode(texts) == [theirs(t)["input_ids"] for t in texts]
    ids = theirs(texts[:50])["input_ids"]
    assert ours.decode(ids) == theirs.batch_decode(ids, skip_special_tokens=True)


@pytest.mark.transformers_lines
@pytest.mark.parametrize("beam", [1, 4])
def test_translations_are_generates(mbart, pairs, beam):
    style, hf, out = mbart
    english = _held_out(pairs)
    want, ended = _generate(style, hf, english, beam)
    got = _translate(out, english, beam)
    compared = [(a, b) for a, b, e in zip(got, want, ended) if e]
    assert len(compared) >= 0.8 * len(english) and len(set(want)) > 5  # outputs end, at lengths of their own
    assert sum(a == b for a, b in compared) >= (0.97 if beam == 1 else 0.9) * len(compared)
    assert sum(a == b for a, b in zip(got, want)) >= len(english) - 1  # all, but a near-tie this CPU may break either way


def test_another_target_language_is_generates_too(mbart, pairs):
    """de_DE chosen at translation time: forced first (mBART-50) or the decoder's start (cc25), as generate does it."""
    style, hf, out = mbart
    english = _held_out(pairs, 12)
    want, _ = _generate(style, hf, english, 1, "de_DE")
    assert _translate(out, english, 1, "en_XX", "de_DE") == want
    assert _translate(out, english, 1, "en", "de") == want


def test_an_unknown_language_is_one_line_listing_the_models_codes(mbart, cli):
    from toolkit import Translator
    from toolkit.core.errors import UsageError

    _, _, out = mbart
    with pytest.raises(UsageError, match=r"unknown target language 'xx'; this model's codes: .*\bfr_XX\b"):
        Translator(out).translate(["Hello."], target_lang="xx")
    assert "unknown source language 'klingon'" in one_line_error(cli("translate", "--model", out, "--source-lang", "klingon", "Hi."), 2)


@pytest.mark.transformers_lines
def test_verify_holds_the_graphs_to_generate(cli, mbart, tmp_path):
    _, hf, out = mbart
    report = tmp_path / "report.json"
    result = cli("verify", out, "--checkpoint", f"hf:{hf}", "--sentences", 12, "--json", report)
    assert result.exit_code == 0, result.output
    rows = [r for r in json.loads(report.read_text())["rows"] if r["check"] == "generate"]
    assert {r["output"] for r in rows} == {"greedy tokens", "beam 4 tokens"} and all(r["ok"] for r in rows)


def _drop_final_logits_bias(graph) -> str:
    """The known exporter bug planted: the decoder's Add of final_logits_bias fed zeros instead (its data stays in
    weights.bin, so the zeros are a new initializer of its shape)."""
    bias = [t for t in graph.initializer if t.name.endswith("final_logits_bias")]
    assert len(bias) == 1, "final_logits_bias is not in the decoder graph"
    graph.initializer.append(numpy_helper.from_array(np.zeros(tuple(bias[0].dims), np.float32), name="planted_zero_bias"))
    users = [n for n in graph.node if bias[0].name in n.input]
    assert [n.op_type for n in users] == ["Add"]
    users[0].input[list(users[0].input).index(bias[0].name)] = "planted_zero_bias"
    return users[0].name


def test_a_dropped_final_logits_bias_fails_verify(cli, mbart, tmp_path):
    """The output bias (non-zero here) is in the decoder graph, and a graph without it fails verify."""
    _, hf, out = mbart
    directory, _ = _edit_decoder(out, tmp_path, _drop_final_logits_bias)
    result = cli("verify", directory, "--checkpoint", f"hf:{hf}", "--sentences", 0)
    assert result.exit_code == 1, result.output


def _erf_to_tanh(graph) -> str:
    """The last decoder layer's activation (gelu: x * 0.5 * (1 + erf(x / sqrt 2))) with its Erf turned into Tanh."""
    node = [n for n in graph.node if n.op_type in ("Erf", "Gelu")][-1]
    node.op_type = "Tanh" if node.op_type == "Erf" else "Relu"
    return node.name


def test_a_swapped_activation_fails_verify_and_localize_names_the_transformers_module(cli, mbart, tmp_path):
    _, hf, out = mbart
    directory, _ = _edit_decoder(out, tmp_path, _erf_to_tanh)
    report = tmp_path / "report.json"
    result = cli("verify", directory, "--checkpoint", f"hf:{hf}", "--sentences", 0, "--localize", "--json", report)
    assert result.exit_code == 1, result.output
    layers = json.loads((out / "manifest.json").read_text())["config"]["decoder_layers"]
    assert json.loads(report.read_text())["localization"]["first"]["module"] == f"model.decoder.layers.{layers - 1}.activation_fn"


def test_a_wrong_shaped_tensor_is_refused_in_one_line_before_building(cli, mbart, tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    from toolkit.pytorch import hf_mbart

    _, hf, _ = mbart
    bad = tmp_path / "bad"
    shutil.copytree(hf, bad)
    state = load_file(str(bad / "model.safetensors"))
    state["model.decoder.layers.1.fc1.weight"] = state["model.decoder.layers.1.fc1.weight"][:, :-1].contiguous()
    save_file(state, str(bad / "model.safetensors"), metadata={"format": "pt"})
    monkeypatch.setattr(hf_mbart.MBartForTk, "build", lambda settings: pytest.fail("built before the shapes were checked"))
    error = one_line_error(cli("export", f"hf:{bad}", "--out", tmp_path / "out"), 2)
    assert "model.decoder.layers.1.fc1.weight has shape (64, 31), the config gives (64, 32)" in error


def test_a_model_type_tk_does_not_import_is_refused_in_one_line_naming_what_it_imports(cli, mbart, tmp_path):
    _, hf, _ = mbart
    bad = tmp_path / "pegasus"
    shutil.copytree(hf, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "pegasus"}))
    error = one_line_error(cli("export", f"hf:{bad}", "--out", tmp_path / "out"), 2)
    assert "has model_type 'pegasus'; tk imports" in error and "MBartForConditionalGeneration (model_type 'mbart')" in error


def test_int8_and_openvino_run_an_imported_mbart(cli, mbart, pairs, tmp_path):
    """Guarded int8 stored beside the graphs and verified (held to its tolerances), and OpenVINO giving ONNX Runtime's
    text with the languages chosen: the paths docs/models.md marks measured for mbart."""
    _, hf, out = mbart
    check_int8_and_openvino(cli, hf, out, _held_out(pairs, 6), tmp_path)


@pytest.mark.parametrize("mbart", ["cc25"], indirect=True)
def test_ctranslate2_converts_verifies_and_translates_an_imported_mbart(cli, mbart, pairs, tmp_path):
    """`--runtime ctranslate2` on mBART-cc25 (the decoder started with the target's code, the converted start; mBART-50
    forces it as M2M100 does, CTranslate2's target prefix, tested there): verified against hf:, generate's greedy text,
    a swapped pair of embedding layer norms (encoder's for decoder's) failing verify, and another target than the
    converted one refused in one line."""
    pytest.importorskip("ctranslate2", reason="the ct2 extra (in dev) installs ctranslate2")
    from helpers import check_ctranslate2

    from toolkit import Translator

    style, hf, out = mbart
    english = _held_out(pairs)
    want, _ = _generate(style, hf, english, 1)
    check_ctranslate2(cli, hf, out, english, want, tmp_path,
                      ("model.encoder.layernorm_embedding.weight", "model.decoder.layernorm_embedding.weight"),
                      source_lang="en", target_lang="fr")
    from toolkit.core.errors import UsageError

    with pytest.raises(UsageError, match="starts its decoder with token .* the target language it was converted for"):
        Translator(tmp_path / "ct2", runtime="ctranslate2").translate(["Hello."], source_lang="en", target_lang="de")
