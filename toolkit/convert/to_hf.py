"""`tk export DIR --to-hf OUT`: tk's Transformer as a Hugging Face MarianMTModel directory.

The mapping is exact, not an approximation: tk's post-LN Transformer and Marian's layers compute the same function
once three differences are absorbed into the weights and the configuration.

- Positions. tk adds a sinusoid table whose channels interleave sin and cos (P[:, 2j] = sin, P[:, 2j + 1] = cos,
  models/attention.py); Marian's MarianSinusoidalPositionalEmbedding puts every sin first and every cos after. One
  fixed permutation of the d_model channels of the residual stream (`channels`: tk's channel 2j becomes Marian's j,
  2j + 1 becomes d/2 + j) maps one onto the other. It is applied to every weight that reads or writes the residual
  stream: the embedding's columns, the input columns of q, k, v and fc1, the output rows (and biases) of out_proj and
  fc2, every LayerNorm's gamma and beta. It commutes with LayerNorm (a per-row mean and variance over all channels)
  and with the residual adds, and the tied output projection reads the permuted stream through the permuted
  embedding, so the logits are unchanged.
- Biases. tk's attention projections have none: Marian's are written as zeros. The output layer is the tied
  embedding (Marian: shared embeddings, lm_head tied to them, final_logits_bias zero).
- Rules. Embeddings are scaled by sqrt(d_model) (scale_embedding), the activation is ReLU, LayerNorm's eps is 1e-5
  and attention scales by 1 / sqrt(d_head) on both sides. The decoder starts from tk's start token <s> (2), not from
  <pad> as Marian's models do; no end token is forced at the length limit.

The tokenizer. transformers' MarianTokenizer appends </s> to every source, and tk's models were trained without a
source end token, so the directory also holds `tokenizer.json` (a `tokenizers` Unigram model converted from tk's
SentencePiece model, tk's NFKC and whitespace normalisation in front, no post-processor) and a tokenizer_config.json
naming PreTrainedTokenizerFast: `AutoTokenizer.from_pretrained(OUT)(text)` gives tk's ids, and transformers.js and
Optimum read the same file. Marian's own files (source.spm, target.spm, vocab.json) are there too; loaded explicitly,
MarianTokenizer needs add_special_tokens=False.

Torch-free: numpy, json, the ONNX graphs' initializers (read as the CTranslate2 runtime reads them), safetensors and
tokenizers (the hf extra).
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path

import numpy as np

from toolkit.convert.pipeline import NewDirectory, Writer
from toolkit.core import architectures
from toolkit.core import manifest as manifest_mod
from toolkit.core.declaration import transformer_layers
from toolkit.core.errors import UsageError
from toolkit.core.manifest import Manifest
from toolkit.core.tokenizer import BOS, EOS, PAD, UNK

# Writing needs safetensors (the hf extra) and tokenizers (a base dependency, missing only from a broken install).
NEEDED = {"safetensors": "safetensors.numpy", "tokenizers": "tokenizers"}
SPECIALS = {PAD: "<pad>", UNK: "<unk>", BOS: "<s>", EOS: "</s>"}
LEADING = 1 << 20  # tokenizer.json's decoder strips up to this many leading spaces: all of them


# The entry of the Hugging Face architecture this writer maps onto; a model is written only if its entry names it.
MARIAN = next(a for a in architectures.ARCHITECTURES.values() if a.hf_class == "MarianMTModel")


def channels(d: int) -> np.ndarray:
    """Marian's channel c holds tk's channel channels(d)[c]: tk's sine channels (even) first, then its cosines (odd)."""
    return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])


def mappable(m: Manifest) -> None:
    """A one-line usage error for a model directory this conversion cannot write exactly."""
    if getattr(architectures.ARCHITECTURES.get(m.model), "writes_hf", None) != MARIAN.hf_class:
        raise UsageError(f"{m.directory} holds a '{m.model}' model; --to-hf writes tk's Transformer only "
                         "(exported/transformer or another `tk export` of a transformer checkpoint)")
    if m.config.get("pre_ln"):
        raise UsageError(f"{m.directory} is a pre-LN Transformer; Marian's layers are post-LN, so --to-hf cannot map it exactly")
    if m.config["num_hiddens"] % 2 or m.config["num_hiddens"] % m.config["num_heads"]:
        raise UsageError(f"{m.directory}: d_model {m.config['num_hiddens']} must be even and divisible by the heads for --to-hf")
    if m.rules() != manifest_mod.Declaration().decoding:
        raise UsageError(f"{m.directory} declares decoding rules of its own; --to-hf writes tk's rules only")
    m.translation_tokenizer()  # a usage error for a directory without a tokenizer (a --random-init export)


def marian_tensors(weights: dict[str, np.ndarray], cfg: dict) -> dict[str, np.ndarray]:
    """tk's weights (names of models/transformer.py, as graph_weights reads them) as MarianMTModel's state dict, in the
    names save_pretrained writes (the tied embedding once, as model.shared.weight)."""
    d = cfg["num_hiddens"]
    p = channels(d)
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    zeros = lambda n: np.zeros(n, dtype=np.float32)  # noqa: E731
    out: dict[str, np.ndarray] = {"model.shared.weight": f32(weights["embedding.weight"][:, p]),
                                  "final_logits_bias": zeros((1, cfg["vocab_size"]))}

    def attention(dst: str, src: str) -> None:
        for proj, name in (("q_proj", "W_q"), ("k_proj", "W_k"), ("v_proj", "W_v")):
            w = weights[f"{src}.{name}.weight"]
            out[f"{dst}.{proj}.weight"], out[f"{dst}.{proj}.bias"] = f32(w[:, p]), zeros(w.shape[0])
        out[f"{dst}.out_proj.weight"], out[f"{dst}.out_proj.bias"] = f32(weights[f"{src}.W_o.weight"][p, :]), zeros(d)

    def norm(dst: str, src: str) -> None:
        out[f"{dst}.weight"], out[f"{dst}.bias"] = (f32(weights[f"{src}.addnorm.ln.{k}"][p]) for k in ("weight", "bias"))

    def ffn(dst: str, src: str) -> None:
        out[f"{dst}.fc1.weight"], out[f"{dst}.fc1.bias"] = f32(weights[f"{src}.ffn.dense1.weight"][:, p]), f32(weights[f"{src}.ffn.dense1.bias"])
        out[f"{dst}.fc2.weight"], out[f"{dst}.fc2.bias"] = f32(weights[f"{src}.ffn.dense2.weight"][p, :]), f32(weights[f"{src}.ffn.dense2.bias"][p])

    encoder_layers, decoder_layers = transformer_layers(cfg)
    for i in range(encoder_layers):
        enc = f"model.encoder.layers.{i}"
        attention(f"{enc}.self_attn", f"encoder_blocks.{i}.attention")
        norm(f"{enc}.self_attn_layer_norm", f"encoder_blocks.{i}.sub1")
        ffn(enc, f"encoder_blocks.{i}")
        norm(f"{enc}.final_layer_norm", f"encoder_blocks.{i}.sub2")
    for i in range(decoder_layers):
        dec = f"model.decoder.layers.{i}"
        attention(f"{dec}.self_attn", f"decoder_blocks.{i}.self_attention")
        norm(f"{dec}.self_attn_layer_norm", f"decoder_blocks.{i}.sub1")
        attention(f"{dec}.encoder_attn", f"decoder_blocks.{i}.cross_attention")
        norm(f"{dec}.encoder_attn_layer_norm", f"decoder_blocks.{i}.sub2")
        ffn(dec, f"decoder_blocks.{i}")
        norm(f"{dec}.final_layer_norm", f"decoder_blocks.{i}.sub3")
    return out


def check_positions(weights: dict[str, np.ndarray], cfg: dict) -> None:
    """tk's stored sinusoid table, permuted, is Marian's (which transformers recomputes at load): the premise of the
    mapping, checked on the weights themselves rather than assumed."""
    d, n = cfg["num_hiddens"], cfg["max_len"]
    table = weights.get("pos_encoding.P")
    if table is None or table.shape != (n, d):
        raise UsageError(f"the encoder graph holds no {n} x {d} positional table (pos_encoding.P); re-export the model directory")
    pos = np.arange(n, dtype=np.float64)[:, None] / np.power(10000, 2 * np.arange(d // 2) / d)[None, :]
    marian = np.concatenate([np.sin(pos), np.cos(pos)], axis=1)
    err = float(np.abs(table[:, channels(d)] - marian).max())
    if err > 1e-4:
        raise UsageError(f"the positional table differs from Marian's sinusoids by {err:.2g} after the channel permutation; "
                         "--to-hf maps tk's standard table only")


def marian_config(cfg: dict) -> dict:
    (encoder_layers, decoder_layers), heads, ffn = transformer_layers(cfg), cfg["num_heads"], cfg["ffn_num_hiddens"]
    return {
        "architectures": [MARIAN.hf_class], "model_type": MARIAN.hf_model_types[0],
        "vocab_size": cfg["vocab_size"], "decoder_vocab_size": cfg["vocab_size"], "d_model": cfg["num_hiddens"],
        "encoder_layers": encoder_layers, "decoder_layers": decoder_layers, "encoder_attention_heads": heads, "decoder_attention_heads": heads,
        "encoder_ffn_dim": ffn, "decoder_ffn_dim": ffn, "activation_function": "relu",
        "max_position_embeddings": cfg["max_len"], "scale_embedding": True,
        "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
        "dropout": cfg.get("dropout", 0.1), "attention_dropout": 0.0, "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "init_std": 0.02,
        "pad_token_id": PAD, "bos_token_id": BOS, "eos_token_id": EOS, "decoder_start_token_id": BOS,
        "forced_eos_token_id": None, "is_encoder_decoder": True, "use_cache": True, "dtype": "float32",
    }


BEAM_RULE = ("greedy (num_beams 1) gives tk's translations. tk's beam search ranks finished hypotheses by "
             "score / ((5 + n + 1) / 6) ** 0.6 (GNMT) and stops at the first num_beams finished; generate's by "
             "score / n ** length_penalty with its own stopping rule, so with num_beams > 1 the translations can differ "
             "(length_penalty=0.6 comes nearest)")


def generation_config(m: Manifest) -> dict:
    """Greedy, to tk's output limit (generate's max_length counts the start token). The difference of the beam rules
    is said in the file itself ("tk_beam_rule": transformers keeps a key it does not know, and save_pretrained writes
    it back); a length_penalty here would make every greedy generate warn that it is ignored."""
    rules = m.rules()
    return {"decoder_start_token_id": rules.start, "bos_token_id": BOS, "eos_token_id": rules.end, "pad_token_id": rules.pad,
            "forced_eos_token_id": None, "max_length": m.max_output_len + 1, "num_beams": 1, "do_sample": False,
            "tk_beam_rule": BEAM_RULE}


def tokenizer_json(proto_bytes: bytes, max_len: int) -> str:
    """tk's SentencePiece unigram model as a `tokenizers` tokenizer that gives toolkit.core.tokenizer.Tokenizer's ids:
    tk's normalisation (NFKC, runs of whitespace as Python's str.split sees it to one space, stripped), SentencePiece's
    dummy prefix and escaped spaces (Metaspace, prepended once), user-defined symbols (⦅0⦆ ...) kept whole, byte
    fallback, and no post-processor (no end token on the source). Decoding drops <pad>, <unk>, <s> and </s> (all
    special), as tk's does."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import Unigram

    proto = pb.ModelProto()
    proto.ParseFromString(proto_bytes)
    spec, norm = proto.trainer_spec, proto.normalizer_spec
    if spec.model_type != pb.TrainerSpec.UNIGRAM or norm.precompiled_charsmap or not norm.add_dummy_prefix or not norm.escape_whitespaces:
        raise UsageError("the tokenizer is not tk's (a unigram model with the identity rule, a dummy prefix and escaped "
                         "spaces); --to-hf converts tk's tokenizer only")
    user = [p.piece for p in proto.pieces if p.type == pb.ModelProto.SentencePiece.USER_DEFINED]
    tok = Tokenizer(Unigram([(p.piece, p.score) for p in proto.pieces], unk_id=spec.unk_id, byte_fallback=spec.byte_fallback))
    space = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())  # what str.split() splits on
    space_class = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in space) + "]+"
    # SentencePiece strips trailing "▁" typed in the text with the trailing spaces, and adds the dummy prefix even before
    # a leading "▁", which Metaspace would not: the first is removed, the second doubled.
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(space_class), " "), normalizers.Strip(),
                                           normalizers.Replace(Regex("[ ▁]+\\z"), ""), normalizers.Replace(Regex("\\A▁"), "▁▁")])
    # "always", on the whole text (split=False: one chunk): "first" would skip the prefix when the text had leading
    # whitespace, which the normaliser strips (it prepends only to a chunk at original offset 0).
    steps = [pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)]
    # SentencePiece emits a user-defined piece whole wherever it appears, and never matches a control, unknown or byte
    # piece ("</s>", "<unk>", "<0xE2>") in the text, which the Unigram model would. Those all start with "<", which no
    # other piece holds (tk's "<" is a byte-fallback character): isolating "<" keeps them out of reach, and changes
    # nothing else (no piece SentencePiece may match spans a "<").
    kind = pb.ModelProto.SentencePiece
    unmatched = [p.piece for p in proto.pieces if p.type in (kind.CONTROL, kind.UNKNOWN, kind.BYTE)]
    isolate = sorted(user, key=len, reverse=True)
    if all(u.startswith("<") for u in unmatched) and not any("<" in p.piece for p in proto.pieces if p.piece not in unmatched):
        isolate.append("<")
    if isolate:
        steps.append(pre_tokenizers.Split(Regex("|".join(re.escape(u) for u in isolate)), behavior="isolated"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    # SentencePiece's decoder drops every leading space (the dummy prefix and any "▁" pieces before the first character).
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", LEADING, 0)])
    tok.add_special_tokens([AddedToken(SPECIALS[i], special=True, normalized=False) for i in sorted(SPECIALS)])
    tok.enable_truncation(max_len)
    return tok.to_str(pretty=True)


def tokenizer_files(m: Manifest) -> dict[str, bytes]:
    """tokenizer.json and its config for AutoTokenizer, and Marian's layout (source.spm, target.spm, vocab.json)."""
    import sentencepiece as spm

    proto = m.translation_tokenizer().read_bytes()
    sp = spm.SentencePieceProcessor(model_proto=proto)
    for i, piece in SPECIALS.items():
        if sp.id_to_piece(i) != piece:
            raise UsageError(f"{m.directory}'s tokenizer has {sp.id_to_piece(i)!r} at id {i}, not {piece!r}; --to-hf converts tk's tokenizer only")
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    specials = {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **specials, "model_max_length": m.max_len,
              "padding_side": "right", "truncation_side": "right", "clean_up_tokenization_spaces": False,
              "split_special_tokens": True,  # "</s>" typed in the text is text, as for SentencePiece
              "model_input_names": ["input_ids", "attention_mask"], "source_lang": "en", "target_lang": "fr",
              "separate_vocabs": False}
    dump = lambda d: (json.dumps(d, indent=2, ensure_ascii=False) + "\n").encode("utf-8")  # noqa: E731
    return {"tokenizer.json": tokenizer_json(proto, m.max_len).encode("utf-8"), "tokenizer_config.json": dump(config),
            "special_tokens_map.json": dump(specials), "source.spm": proto, "target.spm": proto, "vocab.json": dump(vocab)}


def model_card(m: Manifest) -> bytes:
    """README.md, signed (CARD_MARK) so that a later --force can tell tk's card, which it replaces, from a user's edit."""
    return signed_card(f"""# {m.model} (tk), as a Hugging Face MarianMTModel

English to French: tk's post-LN Transformer, {' + '.join(map(str, transformer_layers(m.config)))} layers, d_model {m.config['num_hiddens']},
a shared SentencePiece vocabulary of {m.config['vocab_size']}. Written by `tk export {m.directory} --to-hf DIR` from
tk's exported graphs; `tk verify {m.directory} --to-hf DIR` compares the two.

```python
from transformers import AutoTokenizer, MarianMTModel
path = "path/to/this/directory"
tokenizer = AutoTokenizer.from_pretrained(path)  # tokenizer.json: tk's ids, no end token on the source
model = MarianMTModel.from_pretrained(path)
batch = tokenizer(["I'm home."], return_tensors="pt", padding=True, truncation=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

- The model was trained without an end token on the source. `MarianTokenizer.from_pretrained(path)` appends one to
  every source: call it with `add_special_tokens=False` (it also skips tk's NFKC normalisation).
- Greedy `generate` gives tk's greedy translations without text handling (`tk translate --raw`; its length and
  loop guards may end a runaway translation sooner). Beam search differs by rule: tk ranks
  finished hypotheses by GNMT's length penalty, score / ((5 + n + 1) / 6) ** 0.6, generate by score / n ** length_penalty;
  with `num_beams=4`, pass `length_penalty=0.6` for the nearest.
- Truncate sources to the model's positions (`truncation=True`): a longer source is an index error in the model.
- `tk translate` also handles the text around the model (sentence splitting, ALL CAPS and Title Case folding,
  placeholders for numbers and URLs); generate sees the text as it is.
- Positions: {m.max_len} (sources are truncated to {m.max_len} tokens, outputs stop at {m.max_output_len}).
""".encode())


CARD_MARK = b"<!-- written by tk export --to-hf, sha256 "


def signed_card(body: bytes) -> bytes:
    import hashlib

    return body + CARD_MARK + hashlib.sha256(body).hexdigest().encode() + b" -->\n"


def is_tk_card(path: Path) -> bool:
    """README.md as tk wrote it: the card it signed, unedited (a user's README, or tk's card edited, is theirs)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    body, mark, _ = data.rpartition(CARD_MARK)
    return bool(mark) and signed_card(body) == data


# Every file --to-hf writes: the only entries of an existing MarianMTModel directory that --force replaces.
WRITTEN = frozenset({"model.safetensors", "config.json", "generation_config.json", "README.md", "tokenizer.json",
                     "tokenizer_config.json", "special_tokens_map.json", "source.spm", "target.spm", "vocab.json"})


def hf_entries(out: Path) -> set[str] | None:
    """What --force replaces in an existing directory: tk's files in a MarianMTModel directory, its README.md only while
    it is tk's unedited card; None for any other directory (--force will not touch it)."""
    if not is_hf_directory(out):
        return None
    return set(WRITTEN) - (set() if is_tk_card(out / "README.md") else {"README.md"})


def _requirements(m: Manifest) -> None:
    """validate: the directory maps exactly, and the hf extra's safetensors and tokenizers are installed."""
    mappable(m)
    if missing := missing_packages():
        raise UsageError(f"--to-hf needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed; "
                         f"install the hf extra: pip install 'tk-onnx-deploy[hf]' (or pip install {' '.join(missing)})")


def missing_packages() -> list[str]:
    """The packages --to-hf writes with that do not import, by their pip names: the error names only those."""
    missing = []
    for package, module in NEEDED.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    return missing


def _write(m: Manifest, tmp: Path, echo: Callable[[str], None]) -> dict[str, np.ndarray]:
    """write: the MarianMTModel directory's files into `tmp` (moved into place by toolkit.convert.convert); returns
    the tensors written, for the check."""
    from safetensors.numpy import save_file

    from toolkit.runtimes.ctranslate2.spec import graph_weights

    echo(f"reading the weights of {m.directory}'s fp32 graphs ...")
    weights = graph_weights(m)
    check_positions(weights, m.config)
    tensors = marian_tensors(weights, m.config)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    dump = lambda d: (json.dumps(d, indent=2) + "\n").encode("utf-8")  # noqa: E731
    files = {**tokenizer_files(m), "config.json": dump(marian_config(m.config)), "generation_config.json": dump(generation_config(m)),
             "README.md": model_card(m)}
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    return tensors


# Text on which tk's normalize (NFKC; runs of whitespace, as str.split sees it, to one space; stripped) changes what
# the tokenizer sees. Corpus sentences tokenize alike with or without a normalizer, so only text like this shows a
# tokenizer.json whose normalizer was dropped or changed. Each kind is named in the report; none holds the quotes,
# dashes, brackets or colons sacremoses (when installed) would rewrite for MarianTokenizer.
NORMALIZATION_TEXTS = (
    ("whitespace runs", "I  am   home."),
    ("leading and trailing spaces", "  Go home now.  "),
    ("tabs and newlines", "Tom\tis\there.\r\n"),
    ("no-break and other spaces", "Wait\u00a0 here,\u2009\u2009please \u3000now\u2028sir\u202f!"),  # NFKC alone leaves runs
    ("fullwidth letters", "Ｉ ａｍ ｈｏｍｅ．"),
    ("fullwidth digits", "Room １２３, floor ４."),
    ("ligatures", "The ﬁrst ﬂight was ﬁne."),
    ("superscripts and fractions", "Add ½ cup, x² times."),
    ("composed accents", "Café crème à Noël."),
    ("decomposed accents", unicodedata.normalize("NFD", "Café crème à Noël.")),
    ("emoji", "I love it 🙂👍🏽!"),
    ("empty", ""),
    ("spaces only", "   "),
    ("whitespace only", "\t\n\u00a0\u3000"),
)


def _verify(m: Manifest, tmp: Path, tensors: dict[str, np.ndarray]) -> str | None:
    """verify: model.safetensors, reloaded, holds the graphs' weights as mapped; the configs read back as written;
    tokenizer.json gives tk's ids on NORMALIZATION_TEXTS (`tk verify --to-hf` runs the model itself in transformers)."""
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    from toolkit.core.tokenizers import open_tokenizer

    labels, texts = zip(*NORMALIZATION_TEXTS)
    configs = {"config.json": marian_config(m.config), "generation_config.json": generation_config(m)}
    got = load_file(str(tmp / "model.safetensors"))
    changed = [name for name, want in configs.items() if json.loads((tmp / name).read_text(encoding="utf-8")) != want]
    ids = [e.ids for e in Tokenizer.from_file(str(tmp / "tokenizer.json")).encode_batch(list(texts))]
    wrong = sorted(set(tensors) ^ set(got)) or [k for k in tensors if not np.array_equal(tensors[k], got[k])]
    if wrong or changed:
        return f"model.safetensors does not hold the graphs' weights ({wrong[0]})" if wrong else f"{changed[0]} does not read back as written"
    differ = [label for label, a, b in zip(labels, open_tokenizer(m).encode(list(texts)), ids) if a != b]
    return f"tokenizer.json does not give tk's ids ({differ[0]})" if differ else None


# `tk export DIR --to-hf OUT`. With --force in a MarianMTModel directory that holds more (a git clone: .git, a
# user's README), only tk's files are replaced and the rest is kept.
WRITER = Writer("to-hf", lands=NewDirectory(owned=lambda out, m: hf_entries(out), keep_foreign=True,
                                            what="a Hugging Face MarianMTModel directory (no marian config.json)"),
                validate=_requirements, write=_write, verify=_verify,
                next_step=lambda source, out: f"check it with: tk verify {source} --to-hf {out}")


def is_hf_directory(path: Path) -> bool:
    """A directory --to-hf may replace: one holding a MarianMTModel config.json."""
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("model_type") in MARIAN.hf_model_types
