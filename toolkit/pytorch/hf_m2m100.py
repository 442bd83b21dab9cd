"""Hugging Face M2M100ForConditionalGeneration in (M2M-100 and NLLB-200, which is the same architecture):
`tk export hf:DIR --out OUT`, the builder of architecture "m2m100" (toolkit.core.architectures).

`M2M100ForTk` computes tk's graphs (an encoder graph with every decoder layer's cross keys/values, a one-step decoder
over per-layer self-attention caches) with the model's own modules, so the exported nodes carry transformers' module
paths and `tk verify --localize` names them: its scaled embeddings (M2M100ScaledWordEmbedding scales itself), its
sinusoidal positions counted from padding_idx + 1 (the table M2M100SinusoidalPositionalEmbedding holds, offset 2, the
padding's own position a zero row), its pre-LN layers and the final layer norms of encoder and decoder, the tied output
layer. Decoding follows generate: decoder_start_token_id (</s>), the target language's token forced first
(forced_bos_token_id), </s> forced at the length limit.

Tokenizers: M2M100Tokenizer's sentencepiece.bpe.model + vocab.json (its `__en__` codes after the vocabulary), or a
tokenizer.json (NLLB's, run by the `tokenizers` library) with its `eng_Latn` codes as added tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn

from toolkit.core.declaration import DecodingRules, TokenizerDeclaration, layer_key
from toolkit.core.errors import UsageError
from toolkit.pytorch import hf_files
from toolkit.pytorch.hf_files import check_weights, forbidden, generation_fields, inside, meta_shapes
from toolkit.pytorch.hf_layers import call_layer
from toolkit.pytorch.hf_marian import ACTIVATIONS, HfSource, _heads, _LayerCache, write_files

__all__ = ["M2M100Settings", "M2M100ForTk", "build", "read", "write_files"]
MODEL_CLASS = "M2M100ForConditionalGeneration"


@dataclass
class M2M100Settings:
    """What tk keeps of an M2M100Config: every field its computation depends on (the manifest's "config")."""

    vocab_size: int = 128
    d_model: int = 32
    encoder_layers: int = 2
    decoder_layers: int = 2
    encoder_attention_heads: int = 4
    decoder_attention_heads: int = 4
    encoder_ffn_dim: int = 64
    decoder_ffn_dim: int = 64
    activation_function: str = "relu"
    scale_embedding: bool = True
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 64
    pad_token_id: int = 1
    eos_token_id: int = 2
    decoder_start_token_id: int = 2
    max_len: int = 64  # tk's positions bound: max_position_embeddings
    suppress_tokens: str = ""  # comma-separated ids the decoder graph gives -inf
    dropout: float = 0.0

    # tk's own fields, not M2M100Config's
    OWN = ("max_len", "suppress_tokens")

    def hf_config(self):
        from transformers import M2M100Config

        keep = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.OWN}
        config = M2M100Config(**keep, forced_eos_token_id=self.eos_token_id, attention_dropout=0.0, activation_dropout=0.0,
                              encoder_layerdrop=0.0, decoder_layerdrop=0.0)
        config._attn_implementation = "eager"
        return config

    def suppressed(self) -> list[int]:
        return [int(t) for t in self.suppress_tokens.split(",") if t]


def _check(settings: M2M100Settings, where: str) -> None:
    """Refuses, before anything is allocated, a config tk cannot build (hf_files.check_sizes: one shared vocabulary)."""
    hf_files.check_sizes(settings, where, ACTIVATIONS, settings.vocab_size, "vocabulary")


def build(settings: M2M100Settings) -> M2M100ForTk:
    """An M2M100ForConditionalGeneration of these settings, randomly initialised (weights are loaded after), for tk."""
    from transformers import M2M100ForConditionalGeneration

    _check(settings, "config")
    return M2M100ForTk(M2M100ForConditionalGeneration(settings.hf_config()).eval(), settings)


def _positions(table: nn.Module, ids: torch.Tensor, past) -> torch.Tensor:
    """M2M100SinusoidalPositionalEmbedding's rows for `ids`, `past` positions in: its own position rule (counting
    from padding_idx + 1, padding at padding_idx) over its own table, without the forward's branch that grows the
    table (a data-dependent size the exporter cannot keep dynamic; tk's max_len stays within the table)."""
    # transformers 5 made the position rule a static method; 4.x has it as the module's function (same arguments).
    rule = getattr(table, "create_position_ids_from_input_ids", None)
    if rule is None:
        from transformers.models.m2m_100.modeling_m2m_100 import create_position_ids_from_input_ids as rule
    ids_pos = rule(ids, table.padding_idx, past)
    return table.weights.index_select(0, ids_pos.reshape(-1)).view(*ids.shape, -1)


class M2M100ForTk(nn.Module):
    """M2M100's computation split as tk's graphs are (see the module's docstring); holds the Hugging Face model's own
    modules under their own names (model, lm_head), so parameter names are transformers'."""

    def __init__(self, hf: nn.Module, settings: M2M100Settings):
        super().__init__()
        self.model, self.lm_head = hf.model, hf.lm_head
        self.settings = settings
        mask = torch.zeros(hf.lm_head.out_features)
        mask[settings.suppressed()] = float("-inf")
        self.register_buffer("suppress", mask, persistent=False)
        object.__setattr__(self, "hf", hf)  # the whole model, for generate(); not a second submodule

    @staticmethod
    def _mask(src_len: torch.Tensor, n: int) -> torch.Tensor:
        keep = torch.arange(n, device=src_len.device)[None, :] < src_len[:, None]
        return torch.where(keep, 0.0, torch.finfo(torch.float32).min)[:, None, None, :]

    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> dict[str, torch.Tensor]:
        enc = self.model.encoder
        x = enc.embed_tokens(src) + _positions(enc.embed_positions, src, 0)
        mask = self._mask(src_len, src.shape[1])
        for layer in enc.layers:
            x = call_layer(layer, x, mask)
        x = enc.layer_norm(x)
        out = {"memory": x, "src_len": src_len}
        for i, layer in enumerate(self.model.decoder.layers):
            att = layer.encoder_attn
            out[layer_key("cross_k", i)], out[layer_key("cross_v", i)] = _heads(att, x, att.k_proj), _heads(att, x, att.v_proj)
        return out

    def decode_step(self, token: torch.Tensor, cache: dict[str, torch.Tensor]):
        dec = self.model.decoder
        past = cache[layer_key("self_k", 0)].shape[2]
        ids = token[:, None]
        x = dec.embed_tokens(ids) + _positions(dec.embed_positions, ids, past)
        cross_mask = self._mask(cache["src_len"], cache[layer_key("cross_k", 0)].shape[2])
        new = {}
        for i, layer in enumerate(dec.layers):
            sk, sv, ck, cv = (layer_key(name, i) for name in ("self_k", "self_v", "cross_k", "cross_v"))
            layer_cache = _LayerCache(cache[sk], cache[sv], cache[ck], cache[cv])
            # No causal mask: the cache holds only earlier positions; the encoder states are a stand-in (the cache
            # returns the encoder graph's keys/values).
            x = call_layer(layer, x, None, x, encoder_attention_mask=cross_mask, layer_cache=layer_cache)
            new[sk], new[sv] = layer_cache.new_k, layer_cache.new_v
        logits = self.lm_head(dec.layer_norm(x)[:, 0])
        return torch.log_softmax(logits, dim=-1) + self.suppress, {**cache, **new}


# ---- reading a Hugging Face directory -----------------------------------------------------------------------------

def settings_from(config: dict, generation: dict, where: Path) -> tuple[M2M100Settings, DecodingRules, int | None]:
    """tk's settings, the decoding rules and the forced first token (None: none) from the two configs."""
    gen = generation_fields(config, generation)
    values = hf_files.config_values(M2M100Settings, config, gen, where, M2M100Settings.OWN)
    origin = lambda key: f"{where}/{'generation_config.json' if key in generation else 'config.json'}"  # noqa: E731
    suppress = forbidden(gen, origin)
    settings = M2M100Settings(**values, max_len=min(values["max_position_embeddings"], 1024),
                              suppress_tokens=",".join(str(t) for t in sorted(set(suppress))))
    _check(settings, f"{where}/config.json")
    first = gen.get("forced_bos_token_id")
    if first is not None and (type(first) is not int or not 0 <= first < settings.vocab_size):
        raise UsageError(f"{origin('forced_bos_token_id')}: forced_bos_token_id must be a token id below {settings.vocab_size}, got {first!r:.40}")
    rules = hf_files.end_rules(settings, config, gen, origin, where)
    return settings, rules, first


LANGUAGE_TOKEN = re.compile(r"__([a-z]{2,3}(?:_[A-Za-z]+)?)__|([a-z]{2,3}_[A-Z][A-Za-z]{1,3})")


def _language_codes(tokens: dict[int, str], size: int, where: Path) -> dict[str, int]:
    """The code users type -> its token id, from the added special tokens that spell a language (`__en__`, `eng_Latn`)."""
    codes = {}
    for i, text in tokens.items():
        found = LANGUAGE_TOKEN.fullmatch(text) if isinstance(text, str) else None
        if found:
            if not 0 <= i < size:
                raise UsageError(f"{where}: language token {text!r} has id {i}, outside the model's vocabulary of {size}")
            codes[found.group(1) or found.group(2)] = i
    if not codes:
        raise UsageError(f"{where}: no language tokens (such as __en__ or eng_Latn); tk imports multilingual M2M100 and NLLB models")
    return codes


def _default(tok_config: dict, key: str, codes: dict[str, int], fallback: int | None) -> str:
    """The language the model's own files name (tokenizer_config.json's src_lang/tgt_lang, or the forced token)."""
    value = tok_config.get(key)
    if isinstance(value, str):
        value = value.strip("_") if value.strip("_") in codes else value
        if value in codes:
            return value
    by_id = {i: c for c, i in codes.items()}
    return by_id.get(fallback) or ("en" if "en" in codes else "eng_Latn" if "eng_Latn" in codes else sorted(codes)[0])


def _tokenizer(directory: Path, tok_config: dict, settings: M2M100Settings, forced: int | None) -> tuple[TokenizerDeclaration, str]:
    """The tokenizer files (tokenizer.json where the model ships one, else sentencepiece.bpe.model + vocab.json), checked."""
    if inside(directory, "tokenizer.json").is_file():
        from toolkit.core.tokenizers import load_tokenizer_json

        path = directory / "tokenizer.json"
        tok = load_tokenizer_json(path, "save the model's tokenizer again (tokenizer.save_pretrained(DIR))")
        vocab = tok.get_vocab(with_added_tokens=True)
        top = max(vocab.values(), default=0)
        if top >= settings.vocab_size:
            raise UsageError(f"{path}: token id {top} is outside the model's vocabulary of {settings.vocab_size} (config.json vocab_size)")
        added = {i: t.content for i, t in tok.get_added_tokens_decoder().items() if t.special}
        kind, files, unk_piece = "tokenizer.json", {"source": "tokenizer.json"}, vocab
        note = "tokenizer.json (the tokenizers library)"
    else:
        for name in ("sentencepiece.bpe.model", "vocab.json"):
            if not inside(directory, name).is_file():
                raise UsageError(f"{directory} has no tokenizer.json nor {name}; save the model's tokenizer beside it "
                                 "(tokenizer.save_pretrained(DIR))")
        unk_piece = hf_files.vocabulary(directory, "vocab.json", settings.vocab_size, "vocab_size")
        hf_files.sentencepiece(directory / "sentencepiece.bpe.model", "an M2M100 directory holds M2M100Tokenizer's sentencepiece.bpe.model")
        added = _m2m100_language_tokens(tok_config, len(unk_piece))
        kind, files = "m2m100", {"source": "sentencepiece.bpe.model", "vocab": "vocab.json"}
        note = "M2M100Tokenizer (sentencepiece.bpe.model, vocab.json)"
    codes = _language_codes(added, settings.vocab_size, directory)
    unk = unk_piece.get("<unk>")
    if unk is None:
        raise UsageError(f"{directory}: the tokenizer has no <unk> token")
    suffix = bool(tok_config.get("legacy_behaviour", False))
    declared = TokenizerDeclaration(kind=kind, **files, unk=unk, languages=codes, lang_suffix=suffix,
                                    source_lang=_default(tok_config, "src_lang", codes, None),
                                    target_lang=_default(tok_config, "tgt_lang", codes, forced))
    return declared, note


def _m2m100_language_tokens(tok_config: dict, vocab_len: int) -> dict[int, str]:
    """M2M100Tokenizer's language tokens: its added_tokens_decoder where saved, else its rule (`__xx__` of the named
    language_codes list, numbered after vocab.json)."""
    saved = tok_config.get("added_tokens_decoder")
    if isinstance(saved, dict):
        found = {int(i): t.get("content") for i, t in saved.items() if str(i).isdigit() and isinstance(t, dict)}
        if any(isinstance(c, str) and LANGUAGE_TOKEN.fullmatch(c) for c in found.values()):
            return found
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    codes = FAIRSEQ_LANGUAGE_CODES.get(tok_config.get("language_codes", "m2m100"), FAIRSEQ_LANGUAGE_CODES["m2m100"])
    return {vocab_len + i: f"__{c}__" for i, c in enumerate(codes)}


def read(source: str | Path) -> HfSource:
    """Reads `hf:DIR` (or DIR): config, generation config, weights and the tokenizer files."""
    directory = hf_files.directory_of(source)
    config = hf_files.read_json(directory, "config.json", what="model and tokenizer")
    generation = hf_files.read_json(directory, "generation_config.json", required=False) or {}
    settings, rules, forced = settings_from(config, generation, directory)
    tok_config = hf_files.read_json(directory, "tokenizer_config.json", required=False) or {}
    tokenizer, note = _tokenizer(directory, tok_config, settings, forced)
    rules = DecodingRules(**{**rules.to_dict(), "forced_first": tokenizer.languages[tokenizer.target_lang]})
    state, origin, files = hf_files.read_weights(directory, MODEL_CLASS)
    from transformers import M2M100ForConditionalGeneration

    _check(settings, "config")
    own = meta_shapes(lambda: M2M100ForConditionalGeneration(settings.hf_config()))
    tied = {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    optional = tied | ({"lm_head.weight"} if settings.tie_word_embeddings else set())
    if "model.shared.weight" not in state:  # saved under one of the tied names instead
        optional.add("model.shared.weight")
    check_weights(own, optional, state, origin, directory, MODEL_CLASS)
    model = build(settings)
    model.hf.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    model.hf.tie_weights()
    model.eval()
    beams = generation.get("num_beams", config.get("num_beams", 1))
    return HfSource(directory, settings, rules, model, files, tokenizer, beams if type(beams) is int and beams >= 1 else 1,
                    architecture="m2m100", tokenizer_type=note)
