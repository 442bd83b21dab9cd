"""Hugging Face MBartForConditionalGeneration in (mBART-cc25 and its fine-tunes, mBART-50): `tk export hf:DIR --out
OUT`, the builder of architecture "mbart" (toolkit.core.architectures).

`MBartForTk` computes tk's graphs (an encoder graph with every decoder layer's cross keys/values, a one-step decoder
over per-layer self-attention caches) with the model's own modules, so the exported nodes carry transformers' module
paths and `tk verify --localize` names them: its scaled embeddings (MBartScaledWordEmbedding scales itself), its learned
positions (MBartLearnedPositionalEmbedding, rows offset by 2), `layernorm_embedding` after embeddings and positions, its
pre-LN layers, the final `layer_norm` of encoder and decoder, the tied output layer and its `final_logits_bias` (zeros
in the released checkpoints, so an exporter that drops it goes unnoticed until a fine-tune sets it).

The two tokenizers place the language codes differently, and the decoder starts accordingly:
- MBart50Tokenizer (mBART-50): source `[en_XX] text </s>`; decoder start </s> (decoder_start_token_id), the target
  language's token forced first (forced_bos_token_id), as M2M100 does.
- MBartTokenizer (mBART-cc25, mbart-large-en-ro): source `text </s> en_XX`; the decoder starts with the target
  language's token itself (its training shifts `text </s> ro_RO` right, so the code comes first), nothing forced.
Both end with </s> forced at the length limit and follow generate's beam rule.

Tokenizer files: a tokenizer.json (run by the `tokenizers` library, as transformers 5 runs it), else the
sentencepiece.bpe.model (tk's "mbart" kind: fairseq's ids, the SentencePiece model's shifted by one, the language codes
after the SentencePiece vocabulary, then <mask>). BART (post-LN, no final layer norms, GPT-2 byte-level BPE, no
languages) is not imported: its model_type is refused in one line naming what tk imports.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn

from toolkit.core.declaration import DecodingRules, TokenizerDeclaration, layer_key
from toolkit.core.errors import UsageError
from toolkit.pytorch import hf_files
from toolkit.pytorch.hf_files import check_weights, forbidden, generation_fields, inside, meta_shapes
from toolkit.pytorch.hf_layers import call_layer
from toolkit.pytorch.hf_m2m100 import LANGUAGE_TOKEN, _default, _language_codes
from toolkit.pytorch.hf_m2m100 import _tokenizer as _json_tokenizer
from toolkit.pytorch.hf_marian import ACTIVATIONS, HfSource, _heads, _LayerCache, write_files

__all__ = ["MBartSettings", "MBartForTk", "build", "read", "write_files"]
MODEL_CLASS = "MBartForConditionalGeneration"
# The tokenizer classes that put the source's code first (mBART-50); every other mBART tokenizer puts it last.
PREFIX_CLASSES = ("MBart50Tokenizer", "MBart50TokenizerFast")


@dataclass
class MBartSettings:
    """What tk keeps of an MBartConfig: every field its computation depends on (the manifest's "config")."""

    vocab_size: int = 128
    d_model: int = 32
    encoder_layers: int = 2
    decoder_layers: int = 2
    encoder_attention_heads: int = 4
    decoder_attention_heads: int = 4
    encoder_ffn_dim: int = 64
    decoder_ffn_dim: int = 64
    activation_function: str = "gelu"
    scale_embedding: bool = False
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 64
    pad_token_id: int = 1
    eos_token_id: int = 2
    decoder_start_token_id: int = 2  # the decoder's first input tk uses by default (see read: cc25's is a language code)
    max_len: int = 64  # tk's positions bound: max_position_embeddings
    suppress_tokens: str = ""  # comma-separated ids the decoder graph gives -inf
    dropout: float = 0.0

    # tk's own fields, not MBartConfig's
    OWN = ("max_len", "suppress_tokens")

    def hf_config(self):
        from transformers import MBartConfig

        keep = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.OWN}
        config = MBartConfig(**keep, forced_eos_token_id=self.eos_token_id, attention_dropout=0.0, activation_dropout=0.0,
                             encoder_layerdrop=0.0, decoder_layerdrop=0.0)
        config._attn_implementation = "eager"
        return config

    def suppressed(self) -> list[int]:
        return [int(t) for t in self.suppress_tokens.split(",") if t]


def _check(settings: MBartSettings, where: str) -> None:
    """Refuses, before anything is allocated, a config tk cannot build (hf_files.check_sizes: one shared vocabulary)."""
    hf_files.check_sizes(settings, where, ACTIVATIONS, settings.vocab_size, "vocabulary")


def build(settings: MBartSettings) -> MBartForTk:
    """An MBartForConditionalGeneration of these settings, randomly initialised (weights are loaded after), for tk."""
    from transformers import MBartForConditionalGeneration

    _check(settings, "config")
    return MBartForTk(MBartForConditionalGeneration(settings.hf_config()).eval(), settings)


class MBartForTk(nn.Module):
    """MBart's computation split as tk's graphs are (see the module's docstring); holds the Hugging Face model's own
    modules under their own names (model, lm_head, final_logits_bias), so parameter names are transformers'."""

    def __init__(self, hf: nn.Module, settings: MBartSettings):
        super().__init__()
        self.model, self.lm_head = hf.model, hf.lm_head
        # The same tensor as the model's buffer: loading the directory's weights into `hf` sets it here too.
        self.register_buffer("final_logits_bias", hf.final_logits_bias)
        self.settings = settings
        mask = torch.zeros(hf.lm_head.out_features)
        mask[settings.suppressed()] = float("-inf")
        self.register_buffer("suppress", mask, persistent=False)
        object.__setattr__(self, "hf", hf)  # the whole model, for generate(); not a second submodule

    @staticmethod
    def _mask(src_len: torch.Tensor, n: int) -> torch.Tensor:
        """(batch, 1, 1, n): 0 over a source's tokens, the float minimum over its padding (transformers' eager mask)."""
        keep = torch.arange(n, device=src_len.device)[None, :] < src_len[:, None]
        return torch.where(keep, 0.0, torch.finfo(torch.float32).min)[:, None, None, :]

    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> dict[str, torch.Tensor]:
        enc = self.model.encoder
        # Positions count from 0 whatever the padding (MBartLearnedPositionalEmbedding adds its offset of 2 itself).
        x = enc.layernorm_embedding(enc.embed_tokens(src) + enc.embed_positions(src))
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
        x = dec.layernorm_embedding(dec.embed_tokens(ids) + dec.embed_positions(ids, past))
        cross_mask = self._mask(cache["src_len"], cache[layer_key("cross_k", 0)].shape[2])
        new = {}
        for i, layer in enumerate(dec.layers):
            sk, sv, ck, cv = (layer_key(name, i) for name in ("self_k", "self_v", "cross_k", "cross_v"))
            layer_cache = _LayerCache(cache[sk], cache[sv], cache[ck], cache[cv])
            # No causal mask: the cache holds only earlier positions; the encoder states are a stand-in (the cache
            # returns the encoder graph's keys/values).
            x = call_layer(layer, x, None, x, encoder_attention_mask=cross_mask, layer_cache=layer_cache)
            new[sk], new[sv] = layer_cache.new_k, layer_cache.new_v
        logits = self.lm_head(dec.layer_norm(x)[:, 0]) + self.final_logits_bias
        # As generate: log-softmax first, then the forbidden tokens at -inf (the others are not renormalised).
        return torch.log_softmax(logits, dim=-1) + self.suppress, {**cache, **new}


# ---- reading a Hugging Face directory -----------------------------------------------------------------------------

def _start_fallback(name: str, config: dict) -> object:
    """generate's decoder start when the configs give none: bos_token_id (MBartConfig's default 0)."""
    return config.get("bos_token_id", 0) if name == "decoder_start_token_id" else None


def settings_from(config: dict, generation: dict, where: Path) -> tuple[MBartSettings, DecodingRules, int | None]:
    """tk's settings, the end rules and the configured forced first token (None: none) from the two configs."""
    # A null field is an unset one (mbart-large-cc25's config.json writes decoder_start_token_id: null).
    gen = {k: v for k, v in generation_fields(config, generation).items() if v is not None}
    values = hf_files.config_values(MBartSettings, config, gen, where, MBartSettings.OWN, _start_fallback)
    origin = lambda key: f"{where}/{'generation_config.json' if key in generation else 'config.json'}"  # noqa: E731
    suppress = forbidden(gen, origin)
    settings = MBartSettings(**values, max_len=min(values["max_position_embeddings"], 1024),
                             suppress_tokens=",".join(str(t) for t in sorted(set(suppress))))
    _check(settings, f"{where}/config.json")
    first = gen.get("forced_bos_token_id")
    if first is not None and (type(first) is not int or not 0 <= first < settings.vocab_size):
        raise UsageError(f"{origin('forced_bos_token_id')}: forced_bos_token_id must be a token id below {settings.vocab_size}, got {first!r:.40}")
    rules = hf_files.end_rules(settings, config, gen, origin, where)
    return settings, rules, first


def _codes_first(directory: Path, tok_config: dict) -> bool:
    """Whether the source's language code goes before the text (MBart50Tokenizer) or after its </s> (MBartTokenizer):
    the class tokenizer_config.json names (AutoTokenizer's choice), else the template of tokenizer.json's post-processor,
    else MBartTokenizer (AutoTokenizer's tokenizer for model_type mbart)."""
    named = tok_config.get("tokenizer_class")
    if isinstance(named, str) and named.startswith("MBart"):
        return named in PREFIX_CLASSES
    path = inside(directory, "tokenizer.json")
    if path.is_file():
        from toolkit.core.tokenizers import MAX_VOCAB_BYTES, read_json_object

        post = read_json_object(path, MAX_VOCAB_BYTES, "a tokenizer.json").get("post_processor")
        single = post.get("single") if isinstance(post, dict) else None
        if isinstance(single, list) and single and isinstance(single[0], dict):
            return "SpecialToken" in single[0]
    return False


def _fairseq_language_tokens(tok_config: dict, pieces: int, codes_first: bool) -> dict[int, str]:
    """The language tokens of a sentencepiece.bpe.model tokenizer: its saved added_tokens_decoder where it has them,
    else the class's rule (its FAIRSEQ_LANGUAGE_CODES numbered after the SentencePiece pieces, shifted by fairseq's
    offset of 1)."""
    saved = tok_config.get("added_tokens_decoder")
    if isinstance(saved, dict):
        found = {int(i): t.get("content") for i, t in saved.items() if str(i).isdigit() and isinstance(t, dict)}
        if any(isinstance(c, str) and LANGUAGE_TOKEN.fullmatch(c) for c in found.values()):
            return found
    if codes_first:
        from transformers.models.mbart50.tokenization_mbart50 import FAIRSEQ_LANGUAGE_CODES
    else:
        from transformers.models.mbart.tokenization_mbart import FAIRSEQ_LANGUAGE_CODES
    return {pieces + 1 + i: c for i, c in enumerate(FAIRSEQ_LANGUAGE_CODES)}


def _spm_tokenizer(directory: Path, tok_config: dict, settings: MBartSettings, codes_first: bool) -> tuple[TokenizerDeclaration, str]:
    """tk's "mbart" kind over the directory's sentencepiece.bpe.model, checked: it loads, and its ids, language codes
    and <mask> fit the model's vocabulary."""
    path = inside(directory, "sentencepiece.bpe.model")
    if not path.is_file():
        raise UsageError(f"{directory} has no tokenizer.json nor sentencepiece.bpe.model; save the model's tokenizer beside it "
                         "(tokenizer.save_pretrained(DIR))")
    hf_files.sentencepiece(path, "an mBART directory holds MBartTokenizer's sentencepiece.bpe.model")
    import sentencepiece as spm

    pieces = spm.SentencePieceProcessor(model_proto=path.read_bytes()).get_piece_size()
    if pieces + 1 > settings.vocab_size:  # fairseq's ids: every piece one up
        raise UsageError(f"{path}: its {pieces} pieces (ids up to {pieces}) do not fit the model's vocabulary of "
                         f"{settings.vocab_size} (config.json vocab_size)")
    added = _fairseq_language_tokens(tok_config, pieces, codes_first)
    codes = _language_codes(added, settings.vocab_size, directory)
    declared = TokenizerDeclaration(kind="mbart", source="sentencepiece.bpe.model", unk=3, languages=codes,
                                    lang_suffix=not codes_first, source_lang=_default(tok_config, "src_lang", codes, None),
                                    target_lang=_default(tok_config, "tgt_lang", codes, None))
    name = "MBart50Tokenizer" if codes_first else "MBartTokenizer"
    return declared, f"{name} (sentencepiece.bpe.model, fairseq ids)"


def _decoding(settings: MBartSettings, rules: DecodingRules, tokenizer: TokenizerDeclaration, codes_first: bool,
              forced: int | None, config: dict, generation: dict) -> tuple[MBartSettings, DecodingRules, TokenizerDeclaration]:
    """The start and forced first token, and the default target language, of the model's tokenizer's convention.

    The decoder starts with the target's code (mBART-cc25: nothing forced; a target language chosen later replaces the
    start token) when the configs start it with a language code, or when an MBartTokenizer model names no start and
    no forced token: generate would start it with <s> (bos), which no mBART was trained to follow, where the model
    card's generate(decoder_start_token_id=lang_code_to_id[...]) gives the code. Otherwise (mBART-50) the configured
    start and the target's code forced first, as M2M100."""
    by_id = {i: c for c, i in tokenizer.languages.items()}
    named = generation.get("decoder_start_token_id") is not None or config.get("decoder_start_token_id") is not None
    if forced is None and (settings.decoder_start_token_id in by_id or (not codes_first and not named)):
        target = by_id.get(settings.decoder_start_token_id, tokenizer.target_lang)
        start = tokenizer.languages[target]
        settings = dataclasses.replace(settings, decoder_start_token_id=start)
        rules = DecodingRules(**{**rules.to_dict(), "start": start, "forced_first": None})
    else:
        target = by_id.get(forced, tokenizer.target_lang)
        rules = DecodingRules(**{**rules.to_dict(), "forced_first": tokenizer.languages[target]})
    return settings, rules, dataclasses.replace(tokenizer, target_lang=target)


def read(source: str | Path) -> HfSource:
    """Reads `hf:DIR` (or DIR): config, generation config, weights and the tokenizer files."""
    directory = hf_files.directory_of(source)
    config = hf_files.read_json(directory, "config.json", what="model and tokenizer")
    generation = hf_files.read_json(directory, "generation_config.json", required=False) or {}
    settings, rules, forced = settings_from(config, generation, directory)
    tok_config = hf_files.read_json(directory, "tokenizer_config.json", required=False) or {}
    codes_first = _codes_first(directory, tok_config)
    if inside(directory, "tokenizer.json").is_file():
        tokenizer, note = _json_tokenizer(directory, tok_config, settings, forced)
        tokenizer = dataclasses.replace(tokenizer, lang_suffix=not codes_first)
        note = f"{'MBart50Tokenizer' if codes_first else 'MBartTokenizer'} ({note})"
    else:
        tokenizer, note = _spm_tokenizer(directory, tok_config, settings, codes_first)
    settings, rules, tokenizer = _decoding(settings, rules, tokenizer, codes_first, forced, config, generation)
    state, origin, files = hf_files.read_weights(directory, MODEL_CLASS)
    from transformers import MBartForConditionalGeneration

    _check(settings, "config")
    own = meta_shapes(lambda: MBartForConditionalGeneration(settings.hf_config()))
    # Tied to model.shared (saved once, under one of the names); the output bias transformers starts at zero when absent.
    optional = {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "final_logits_bias"}
    optional |= {"lm_head.weight"} if settings.tie_word_embeddings else set()
    if "model.shared.weight" not in state:
        optional.add("model.shared.weight")
    check_weights(own, optional, state, origin, directory, MODEL_CLASS)
    model = build(settings)
    model.hf.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    model.hf.tie_weights()
    model.eval()
    beams = generation.get("num_beams", config.get("num_beams", 1))
    return HfSource(directory, settings, rules, model, files, tokenizer, beams if type(beams) is int and beams >= 1 else 1,
                    architecture="mbart", tokenizer_type=note)
