"""The models `tk bench --scale` builds from config, with random weights and no download: a Hugging Face directory as
`save_pretrained` writes it (model.safetensors, config, generation config, and MarianTokenizer's or M2M100Tokenizer's
files), so each engine imports it with its own tool (`tk export hf:`, CTranslate2's converter, Optimum's exporter, transformers).

Run as a script of its own (`python -m toolkit.bench.scale_model SHAPE DIR`) so its peak memory is measured apart.
The generation config forbids the end token (bad_words_ids): a random model then never stops early in any engine,
and every engine told to decode N tokens decodes exactly N (fixed work). opus-mt's own config forbids <pad> the
same way, so the decoder graph does the same work as a real one's (one -inf mask added to the log-probabilities).
"""

from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from toolkit.core.architectures import Architecture
from toolkit.core.entries import m2m100, marian


@dataclass(frozen=True)
class Shape:
    """A MarianMTModel or M2M100 (NLLB-200's architecture) shape: what the bench's table calls it and its config."""

    name: str
    d_model: int
    layers: int  # encoder and decoder layers each
    heads: int
    ffn: int
    vocab: int  # shared and tied (Marian: <pad> last, as opus-mt's: CTranslate2's converter drops it)
    positions: int = 512
    init_std: float = 0.02
    arch: Architecture = marian.ENTRY  # or m2m100.ENTRY: pre-LN with final layer norms, relu, no final_logits_bias

    def parameters(self) -> int:
        """Weights, the tied embedding counted once (positions are sinusoids, not weights)."""
        d, f = self.d_model, self.ffn
        enc = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d
        dec = 8 * d * d + 8 * d + 2 * d * f + f + d + 6 * d
        if self.arch is m2m100.ENTRY:  # the two stacks' final layer norms; no final_logits_bias
            return self.vocab * d + self.layers * (enc + dec) + 4 * d
        return self.vocab * d + self.layers * (enc + dec) + self.vocab


SHAPES = {
    # Helsinki-NLP/opus-mt-en-fr's config: 74.6M weights.
    "opus-mt": Shape("opus-mt", d_model=512, layers=6, heads=8, ffn=2048, vocab=59514),
    # The harness's smoke test (tests/bench/test_scale_bench.py): the same code path in seconds. Larger initial weights
    # than a trained model's: wide gaps between the best tokens, so float rounding never picks another one.
    "tiny": Shape("tiny", d_model=32, layers=2, heads=4, ffn=64, vocab=400, positions=64, init_std=0.2),
    # facebook/nllb-200-distilled-600M's config (M2M100 architecture): 615M weights, 2.5 GB in fp32.
    "nllb-600m": Shape("nllb-600m", d_model=1024, layers=12, heads=16, ffn=4096, vocab=256206, positions=1024, arch=m2m100.ENTRY),
    # facebook/nllb-200-distilled-1.3B's: 1.37B weights, 5.5 GB in fp32 (beyond protobuf's 2 GB: external data).
    "nllb-1.3b": Shape("nllb-1.3b", d_model=1024, layers=24, heads=16, ffn=8192, vocab=256206, positions=1024, arch=m2m100.ENTRY),
    # The M2M100 path's smoke test.
    "tiny-m2m100": Shape("tiny-m2m100", d_model=32, layers=2, heads=4, ffn=64, vocab=400, positions=64, init_std=0.2,
                         arch=m2m100.ENTRY),
}

# M2M100Tokenizer's tokens after vocab.json: 100 language codes, then 8 made-up words (its num_madeup_words).
M2M100_AFTER_VOCAB = 100 + 8

_WORDS = ("the a house cat dog runs walks sees big small red green blue today tomorrow yesterday we you they "
          "she he it is are was were will would could should have has had do does did not never always often "
          "station train city river mountain book table water coffee tea bread morning evening night").split()


def _lines(n: int = 600) -> list[str]:
    """Word salad for the SentencePiece models: the tokenizer only has to load and encode (sources are given as ids)."""
    import random

    rng = random.Random(0)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def _sentencepiece() -> bytes:
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_lines()), model_writer=out, vocab_size=120, model_type="unigram",
                                   character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2,
                                   bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0)  # as Marian's: vocab.json holds the controls
    return out.getvalue()


def _vocabulary(proto: bytes, size: int) -> dict[str, int]:
    """MarianTokenizer's vocab.json of exactly `size` pieces: </s> 0, <unk> 1, the SentencePiece pieces, fillers, <pad> last."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=proto)
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if piece not in vocab and len(vocab) < size - 1:
            vocab[piece] = len(vocab)
    while len(vocab) < size - 1:
        vocab[f"▁w{len(vocab)}"] = len(vocab)
    vocab["<pad>"] = size - 1
    return vocab


def build(shape: Shape, out: Path, seed: int = 0, forced_end: bool = False) -> Path:
    """Writes the Hugging Face directory of `shape` into `out` (created; must not exist yet); returns `out`.
    `forced_end`: the end token forced at the length limit, as opus-mt's config does (off for the bench: each engine
    then decodes exactly the tokens asked, and no step more)."""
    if shape.arch is m2m100.ENTRY:
        return _build_m2m100(shape, out, seed)
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True)
    proto = _sentencepiece()
    (out / "source.spm").write_bytes(proto)
    (out / "target.spm").write_bytes(proto)
    vocab = _vocabulary(proto, shape.vocab)
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json")).save_pretrained(out)
    pad, end = vocab["<pad>"], vocab["</s>"]
    config = MarianConfig(vocab_size=shape.vocab, decoder_vocab_size=shape.vocab, d_model=shape.d_model,
                          encoder_layers=shape.layers, decoder_layers=shape.layers, encoder_attention_heads=shape.heads,
                          decoder_attention_heads=shape.heads, encoder_ffn_dim=shape.ffn, decoder_ffn_dim=shape.ffn,
                          activation_function="swish", scale_embedding=True, share_encoder_decoder_embeddings=True,
                          tie_word_embeddings=True, max_position_embeddings=shape.positions, pad_token_id=pad,
                          decoder_start_token_id=pad, eos_token_id=end, forced_eos_token_id=end if forced_end else None,
                          init_std=shape.init_std)
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    gen = model.generation_config
    gen.max_length, gen.num_beams = shape.positions, 4  # opus-mt's max_length: 512
    gen.forced_eos_token_id = end if forced_end else None
    gen.bad_words_ids = [[pad], [end]]  # <pad> as opus-mt; the end token: fixed work (module docstring)
    model.save_pretrained(out)
    return out


def _build_m2m100(shape: Shape, out: Path, seed: int) -> Path:
    """An NLLB-shaped M2M100ForConditionalGeneration with M2M100Tokenizer's files (vocab.json filled to the shape's
    vocabulary, the language codes and made-up words after it). No language is forced first: every step of the bench is
    an ordinary decoder step, as in a real NLLB after its first."""
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration, M2M100Tokenizer

    out.mkdir(parents=True)
    proto = _sentencepiece()
    (out / "sentencepiece.bpe.model").write_bytes(proto)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=proto)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    while len(vocab) < shape.vocab - M2M100_AFTER_VOCAB:
        vocab[f"▁w{len(vocab)}"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tokenizer = M2M100Tokenizer(str(out / "vocab.json"), str(out / "sentencepiece.bpe.model"), src_lang="en", tgt_lang="fr")
    tokenizer.save_pretrained(out)
    # The language codes listed as the Hub's M2M100 repositories list them: CTranslate2's converter reads them there
    # (transformers 5 writes none, and the conversion then lacks 100 tokens of the model's vocabulary).
    settings = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    settings["additional_special_tokens"] = list(tokenizer.lang_code_to_token.values())
    if settings.get("extra_special_tokens") == []:  # transformers 4 (Optimum's) cannot read the empty list 5 writes
        del settings["extra_special_tokens"]
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    pad, end = 1, 2
    config = M2M100Config(vocab_size=shape.vocab, d_model=shape.d_model, encoder_layers=shape.layers, decoder_layers=shape.layers,
                          encoder_attention_heads=shape.heads, decoder_attention_heads=shape.heads, encoder_ffn_dim=shape.ffn,
                          decoder_ffn_dim=shape.ffn, activation_function="relu", scale_embedding=True,
                          max_position_embeddings=shape.positions, pad_token_id=pad, bos_token_id=0, eos_token_id=end,
                          decoder_start_token_id=end, init_std=shape.init_std, dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config).eval()
    gen = model.generation_config
    gen.max_length, gen.num_beams, gen.forced_bos_token_id = shape.positions, 4, None
    gen.bad_words_ids = [[end]]  # fixed work (module docstring)
    model.save_pretrained(out)
    return out


def main() -> None:
    shape, out = SHAPES[sys.argv[1]], Path(sys.argv[2])
    build(shape, out)
    print(json.dumps({"parameters": shape.parameters()}))


if __name__ == "__main__":
    main()
