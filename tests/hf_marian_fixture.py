"""Hugging Face Marian directories built in the test, as `save_pretrained` writes them: no download.

SentencePiece models trained on a few hundred fra-eng lines and saved in MarianTokenizer's layout (source.spm,
target.spm, vocab.json, and target_vocab.json when the vocabularies are separate), and a MarianMTModel
trained for 80 steps (about 7 s on 2 cores) on those lines: enough that hypotheses end at lengths of their own, so
that beam search's finishing rules are exercised (a random model repeats one token to the length limit).
"""

from __future__ import annotations

import io
import json
from contextlib import contextmanager
from pathlib import Path

import sentencepiece as spm


def fra_eng_lines(corpus_zip: Path, n: int = 400) -> list[tuple[str, str]]:
    from toolkit.core import data

    pairs, _ = data.read_pairs(corpus_zip)
    step = max(1, len(pairs) // n)
    return pairs[::step][:n]


def _spm(lines: list[str], vocab_size: int) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=vocab_size, model_type="unigram",
                                   character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2,
                                   # Marian's SentencePiece models carry no control pieces of their own: vocab.json has them
                                   bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0)
    return out.getvalue()


def _vocab(protos: list[bytes]) -> dict[str, int]:
    """MarianTokenizer's vocab.json: </s> 0, <unk> 1, then every piece of the models, <pad> last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for proto in protos:
        sp = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if piece not in vocab and piece != "<unk>":
                vocab[piece] = len(vocab)
    vocab["<pad>"] = len(vocab)
    return vocab


def marian_directory(path: Path, pairs: list[tuple[str, str]], *, separate: bool = False, activation: str = "swish",
                     d_model: int = 64, layers: tuple[int, int] = (2, 2), heads: int = 4, ffn: int = 128, scale: bool = True,
                     max_length: int = 24, seed: int = 0, steps: int = 80, pieces: tuple[int, int] = (300, 300)) -> Path:
    """Writes a MarianMTModel and its MarianTokenizer files into `path` with save_pretrained; returns `path`.
    `pieces`: the SentencePiece models' sizes (source, target); with `separate`, two sizes give two vocabulary sizes."""
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    path.mkdir(parents=True, exist_ok=True)
    english, french = [e for e, _ in pairs], [f for _, f in pairs]
    src = _spm(english, pieces[0])
    tgt = _spm(french, pieces[1])
    (path / "source.spm").write_bytes(src)
    (path / "target.spm").write_bytes(tgt)
    if separate:
        src_vocab, tgt_vocab = _vocab([src]), _vocab([tgt])
        (path / "vocab.json").write_text(json.dumps(src_vocab), encoding="utf-8")
        (path / "target_vocab.json").write_text(json.dumps(tgt_vocab), encoding="utf-8")
        tokenizer = MarianTokenizer(str(path / "source.spm"), str(path / "target.spm"), str(path / "vocab.json"),
                                    target_vocab_file=str(path / "target_vocab.json"), separate_vocabs=True)
        vocab_size, decoder_vocab_size, pad = len(src_vocab), len(tgt_vocab), src_vocab["<pad>"]
    else:
        vocab = _vocab([src, tgt])
        (path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
        tokenizer = MarianTokenizer(str(path / "source.spm"), str(path / "target.spm"), str(path / "vocab.json"))
        vocab_size = decoder_vocab_size = len(vocab)
        pad = vocab["<pad>"]
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    config = MarianConfig(vocab_size=vocab_size, decoder_vocab_size=decoder_vocab_size, d_model=d_model,
                          encoder_layers=layers[0], decoder_layers=layers[1], encoder_attention_heads=heads,
                          decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, activation_function=activation,
                          scale_embedding=scale, share_encoder_decoder_embeddings=not separate, max_position_embeddings=64,
                          pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
                          init_std=0.1, tie_word_embeddings=not separate)
    model = MarianMTModel(config)
    train_briefly(model, tokenizer, [e for e, _ in pairs], [f for _, f in pairs], steps, seed)
    with torch.no_grad():  # a buffer training leaves at zero: given values, so that an exporter that drops it fails
        model.final_logits_bias.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(seed))
    model.generation_config.max_length = max_length
    model.generation_config.num_beams = 4
    model.generation_config.bad_words_ids = [[pad]]  # as opus-mt's configs: never emit <pad>
    model.save_pretrained(path)
    return path


@contextmanager
def single_thread():
    """torch on one thread while a tiny model trains: more threads only contend, the more on a shared machine (a
    fixture built 1.8x faster on 2 cores, 10x measured on a busy one)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_briefly(model, tokenizer, sources: list[str], targets: list[str], steps: int, seed: int) -> None:
    """Every Hugging Face fixture's training: Adam, batches of 32 drawn from `seed`, on one thread."""
    import torch

    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    # Tokenized once: the tokenizer's Python side costs more than the tiny model's steps.
    whole = tokenizer(sources, text_target=targets, return_tensors="pt", padding=True)
    whole["labels"][whole["labels"] == tokenizer.pad_token_id] = -100
    with single_thread():
        for _ in range(steps):
            idx = torch.randint(0, len(sources), (32,), generator=g)
            loss = model(**{k: v[idx] for k, v in whole.items()}).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()


def untrained_marian(tmp_path_factory, corpus_zip: Path) -> Path:
    """A tiny MarianMTModel as initialised (no training: every bias zero, every LayerNorm weight one), built once per run
    for every module that asks (tests copy what they change)."""
    import warnings

    from conftest import built_once

    def build(folder: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            marian_directory(folder / "hf", fra_eng_lines(corpus_zip, 400), d_model=16, layers=(1, 1), heads=2, ffn=32, steps=0)

    return built_once(tmp_path_factory, "hf-marian-untrained", build) / "hf"
