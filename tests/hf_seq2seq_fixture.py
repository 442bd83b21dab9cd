"""Hugging Face multilingual directories built in the test, as `save_pretrained` writes them: no download.

A tiny M2M100ForConditionalGeneration with M2M100Tokenizer's files (a SentencePiece model trained on a few hundred
fra-eng lines, its vocab.json, the `__en__` codes after it), trained en -> fr for a few dozen steps so that outputs end
at lengths of their own (a random model repeats one token to the length limit).
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Callable
from pathlib import Path

import sentencepiece as spm
from hf_marian_fixture import train_briefly


def _spm(lines: list[str], vocab_size: int) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=vocab_size, model_type="unigram",
                                   character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2,
                                   bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0)
    return out.getvalue()


def _m2m100_vocab(proto: bytes) -> dict[str, int]:
    """M2M100Tokenizer's vocab.json: <s> 0, <pad> 1, </s> 2, <unk> 3, then the SentencePiece model's pieces."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    sp = spm.SentencePieceProcessor(model_proto=proto)
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    return vocab


def m2m100_directory(path: Path, pairs: list[tuple[str, str]], *, d_model: int = 32, layers: tuple[int, int] = (2, 2),
                     heads: int = 4, ffn: int = 64, activation: str = "relu", max_length: int = 24, seed: int = 0,
                     steps: int = 120) -> Path:
    """Writes an M2M100ForConditionalGeneration and its M2M100Tokenizer (en -> fr) into `path`; returns `path`."""
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer

    path.mkdir(parents=True, exist_ok=True)
    proto = _spm([e for e, _ in pairs] + [f for _, f in pairs], 200)
    (path / "sentencepiece.bpe.model").write_bytes(proto)
    vocab = _m2m100_vocab(proto)
    (path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tokenizer = M2M100Tokenizer(str(path / "vocab.json"), str(path / "sentencepiece.bpe.model"), src_lang="en", tgt_lang="fr")
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    config = M2M100Config(vocab_size=len(vocab) + 100 + 8, d_model=d_model, encoder_layers=layers[0], decoder_layers=layers[1],
                          encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
                          activation_function=activation, max_position_embeddings=64, pad_token_id=1, bos_token_id=0,
                          eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2, dropout=0.0, attention_dropout=0.0,
                          init_std=0.1, scale_embedding=True)
    model = M2M100ForConditionalGeneration(config)
    train(model, tokenizer, pairs, steps, seed)
    model.generation_config.max_length = max_length
    model.generation_config.num_beams = 4
    model.generation_config.forced_bos_token_id = tokenizer.get_lang_id("fr")
    model.save_pretrained(path)
    return path


def nllb_directory(path: Path, pairs: list[tuple[str, str]], *, seed: int = 0, steps: int = 120) -> Path:
    """Writes an NLLB-200-style model into `path`: M2M100ForConditionalGeneration with NllbTokenizer's tokenizer.json as
    the Hub's NLLB repositories ship it (a SentencePiece BPE model's pieces and merges at fairseq's ids, <s> 0 <pad> 1
    </s> 2 <unk> 3, the 202 `eng_Latn`-style codes after them, `eng_Latn text </s>` on the source), trained
    eng_Latn -> fra_Latn with fra_Latn forced first. transformers 5 only: its NllbTokenizer builds from pieces and
    merges. Returns `path`."""
    import torch
    from tokenizers.models import BPE
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    path.mkdir(parents=True, exist_ok=True)
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter([e for e, _ in pairs] + [f for _, f in pairs]), model_writer=out,
                                   vocab_size=200, model_type="bpe", character_coverage=1.0, hard_vocab_limit=False,
                                   num_threads=1, minloglevel=2)
    model_file = path.parent / f"{path.name}.spm"
    model_file.write_bytes(out.getvalue())
    pieces = SentencePieceExtractor(str(model_file)).extract(BPE)
    model_file.unlink()
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({piece: i + 1 for piece, i in pieces["vocab"].items() if i >= 3})  # fairseq's offset of one
    tokenizer = NllbTokenizer(vocab=vocab, merges=pieces["merges"], _spm_precompiled_charsmap=pieces["_spm_precompiled_charsmap"],
                              src_lang="eng_Latn", tgt_lang="fra_Latn")
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    config = M2M100Config(vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="relu",
                          max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                          decoder_start_token_id=2, forced_eos_token_id=2, dropout=0.0, attention_dropout=0.0, init_std=0.1,
                          scale_embedding=True)
    model = M2M100ForConditionalGeneration(config)
    train(model, tokenizer, pairs, steps, seed)
    model.generation_config.max_length = 24
    model.generation_config.num_beams = 4
    model.generation_config.forced_bos_token_id = tokenizer.convert_tokens_to_ids("fra_Latn")
    model.save_pretrained(path)
    return path


def train(model, tokenizer, pairs: list[tuple[str, str]], steps: int, seed: int) -> None:
    train_briefly(model, tokenizer, [e for e, _ in pairs], [f for _, f in pairs], steps, seed)


def exported_import(tmp_path_factory, name: str, make: Callable[[Path], object]) -> tuple[Path, Path]:
    """(Hugging Face directory that `make(path)` writes, tk model directory exported from it with `tk export hf:DIR`),
    built once per run under `name`."""
    from click.testing import CliRunner
    from conftest import built_once

    from toolkit.cli import main

    def build(root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make(root / "hf")
        result = CliRunner().invoke(main, ["export", f"hf:{root / 'hf'}", "--out", str(root / "tk")])
        assert result.exit_code == 0, result.output

    root = built_once(tmp_path_factory, name, build)
    return root / "hf", root / "tk"
