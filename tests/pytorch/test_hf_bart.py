"""Hugging Face BartForConditionalGeneration in: `tk export hf:DIR`, its tokenizer.json, translations equal to
generate's, greedy and beam 4, verify, and CTranslate2.

A tiny BART built here from BartConfig (no download): a byte-level BPE learnt on fra-eng lines and saved as
BartTokenizerFast saves it (tokenizer.json, `<s> text </s>` by its post-processor), post-LN layers, learned positions,
layernorm_embedding, <s> forced first as bart-large's config forces it, and a non-zero final_logits_bias; trained
en -> fr for a few dozen steps so that outputs end at lengths of their own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_marian_fixture import fra_eng_lines
from hf_seq2seq_fixture import exported_import, train

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


def bart_directory(path: Path, pairs: list[tuple[str, str]], *, steps: int = 150, seed: int = 0) -> Path:
    """Writes a tiny BartForConditionalGeneration and its tokenizer (en -> fr) into `path`; returns `path`."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import BartConfig, BartForConditionalGeneration, BartTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([e for e, _ in pairs] + [f for _, f in pairs], vocab_size=500, show_progress=False,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(path))  # vocab.json and merges.txt, which BartTokenizerFast reads and saves as tokenizer.json
    tokenizer = BartTokenizerFast.from_pretrained(path)
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    config = BartConfig(vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="gelu",
                        max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                        forced_bos_token_id=0, forced_eos_token_id=2, dropout=0.0, attention_dropout=0.0, init_std=0.1)
    model = BartForConditionalGeneration(config)
    with torch.no_grad():  # a bias the model learns around: dropping it changes the translations
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=torch.Generator().manual_seed(seed)))
    train(model, tokenizer, pairs, steps, seed)
    model.generation_config.max_length = 24
    model.generation_config.num_beams = 4
    model.save_pretrained(path)
    return path


# The loop-guard test's case of BART's tokenizer (tests/deploy/test_tokenizer_kinds_guarded.py): byte-level word starts.
TOKENIZER_CASES = {"bart-byte-level-tokenizer.json": ("tokenizer.json", lambda path, pairs: bart_directory(path, pairs, steps=0))}


@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    return fra_eng_lines(corpus_zip, 2000)


@pytest.fixture(scope="module")
def bart(tmp_path_factory, pairs) -> tuple[Path, Path]:
    """(Hugging Face directory, tk model directory exported from it with `tk export hf:DIR`), built once per run."""
    return exported_import(tmp_path_factory, "hf-bart", lambda path: bart_directory(path, pairs[:400]))


def _held_out(pairs, n: int = 40) -> list[str]:
    return [e for e, _ in pairs[1000: 1000 + n]]


def _generate(hf: Path, english: list[str], beam: int) -> tuple[list[str], list[bool]]:
    """generate's text (the start token and the forced <s> are no part of it), and whether each output ended."""
    from transformers import BartForConditionalGeneration, BartTokenizerFast

    tokenizer = BartTokenizerFast.from_pretrained(hf)
    model = BartForConditionalGeneration.from_pretrained(hf).eval()
    batch = tokenizer(english, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**batch, num_beams=beam, do_sample=False)
    assert (out[:, 1] == tokenizer.bos_token_id).all()
    ended = [bool((row[2:] == tokenizer.eos_token_id).any()) for row in out]
    return [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)], ended


@pytest.mark.transformers_lines
def test_the_tokenizer_gives_bart_tokenizer_ids_and_text(bart, pairs):
    from transformers import BartTokenizerFast

    from toolkit.core import manifest
    from toolkit.core.tokenizers import open_tokenizer

    hf, out = bart
    m = manifest.load(out)
    assert m.declared().tokenizer.kind == "tokenizer.json" and m.declared().tokenizer.languages is None
    ours, theirs = open_tokenizer(m), BartTokenizerFast.from_pretrained(hf)
    texts = [e for e, _ in pairs[:300]] + [f for _, f in pairs[:300]] + ["  Spaces  and ünïcödé — dashes!"]
    ids = [theirs(t)["input_ids"] for t in texts]
    assert ours.encode(texts) == ids and all(i[0] == 0 and i[-1] == 2 for i in ids)
    assert ours.decode(ids) == [t.strip() for t in theirs.batch_decode(ids, skip_special_tokens=True)]


@pytest.mark.transformers_lines
@pytest.mark.parametrize("beam", [1, 4])
def test_translations_are_generates(bart, pairs, beam):
    from toolkit import Translator

    hf, out = bart
    english = _held_out(pairs)
    want, ended = _generate(hf, english, beam)
    got = Translator(out).translate(english, beam=beam, raw=True, loop_guard=False, max_len_a=None)
    assert sum(ended) >= 0.8 * len(english) and len(set(want)) > 5  # outputs end, at lengths of their own
    assert sum(a == b for a, b in zip(got, want)) >= len(english) - 1  # all, but a near-tie this CPU may break either way


@pytest.mark.transformers_lines
def test_verify_holds_the_graphs_to_generate(cli, bart, tmp_path):
    hf, out = bart
    report = tmp_path / "report.json"
    result = cli("verify", out, "--checkpoint", f"hf:{hf}", "--sentences", 12, "--json", report)
    assert result.exit_code == 0, result.output
    rows = [r for r in json.loads(report.read_text())["rows"] if r["check"] == "generate"]
    assert {r["output"] for r in rows} == {"greedy tokens", "beam 4 tokens"} and all(r["ok"] for r in rows)


def test_ctranslate2_converts_verifies_and_translates_an_imported_bart(cli, bart, pairs, tmp_path):
    """`--runtime ctranslate2`: post-LN layers under layernorm_embedding, <s> forced first; verified against hf:,
    generate's greedy text, and a swapped pair of embedding layer norms failing verify."""
    pytest.importorskip("ctranslate2", reason="the ct2 extra (in dev) installs ctranslate2")
    from helpers import check_ctranslate2

    hf, out = bart
    english = _held_out(pairs)
    want, _ = _generate(hf, english, 1)
    check_ctranslate2(cli, hf, out, english, want, tmp_path,
                      ("model.encoder.layernorm_embedding.weight", "model.decoder.layernorm_embedding.weight"))


def test_int8_and_openvino_run_an_imported_bart(cli, bart, pairs, tmp_path):
    """Guarded int8 stored beside the graphs and verified against hf: (held to int8's tolerances), and OpenVINO giving
    ONNX Runtime's text."""
    import shutil

    hf, out = bart
    directory = tmp_path / "variants"
    shutil.copytree(out, directory)
    assert cli("export", directory, "--quantize", "int8").exit_code == 0
    result = cli("verify", directory, "--checkpoint", f"hf:{hf}", "--variant", "int8", "--sentences", 8)
    assert result.exit_code == 0, result.output
    args = ("translate", "--model", directory, "--variant", "fp32", "--raw", *_held_out(pairs, 6))
    openvino, onnxruntime = cli(*args, "--runtime", "openvino"), cli(*args)
    assert openvino.exit_code == 0 and onnxruntime.exit_code == 0, openvino.output + onnxruntime.output
    lines = [line for line in openvino.stdout.splitlines() if line]
    assert lines == [line for line in onnxruntime.stdout.splitlines() if line] and len(lines) == 6
