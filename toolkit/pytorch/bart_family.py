"""The base every Hugging Face builder of the BART family extends (Marian, M2M100/NLLB, mBART; BART itself): one
encoder-decoder of transformers' own layers, computed as tk's graphs are, and the reading of its directory.

`FamilyForTk` computes tk's graphs (an encoder graph that also computes every decoder layer's cross-attention keys
and values once, a one-step decoder over per-layer self-attention caches) with the model's own modules, so the
exported nodes carry transformers' module paths (model.decoder.layers.1.fc1) and `tk verify --localize` names them. A
member says only what differs: its settings (`FamilySettings`: the config fields its computation depends on), its
embedding (`embed`) and its transformers classes; each stack's final layer norm and the output bias final_logits_bias
are used where the model has them.

A Hugging Face directory is untrusted input: weights come from safetensors only (hf_files.read_weights), no code from
the directory runs (the model is transformers' own class, whatever config.json names), no file outside it is read,
and whatever would pass export and fail later is refused at export in one line naming the file and the field.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from toolkit.core.declaration import HF, Declaration, DecodingRules, TokenizerDeclaration, layer_key
from toolkit.core.digests import file_sha256
from toolkit.core.errors import UsageError
from toolkit.core.graphs import GraphSpec, encoder_decoder_graphs
from toolkit.pytorch import hf_files
from toolkit.pytorch.hf_files import check_weights, forbidden, generation_fields, inside, meta_shapes
from toolkit.pytorch.hf_layers import call_layer

ACTIVATIONS = ("swish", "silu", "gelu", "relu", "gelu_new", "gelu_fast", "tanh", "sigmoid")


@dataclass
class FamilySettings:
    """What tk keeps of a BART-family config: every field its computation depends on (the manifest's "config"). A
    member redeclares the defaults that differ and names its transformers classes (CONFIG, MODEL_CLASS)."""

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
    tie_word_embeddings: bool = True  # the output layer is the shared embedding
    max_position_embeddings: int = 64
    pad_token_id: int = 1
    eos_token_id: int = 2
    decoder_start_token_id: int = 2
    max_len: int = 64  # tk's positions bound: max_position_embeddings
    suppress_tokens: str = ""  # comma-separated ids the decoder graph gives -inf (the generation config's bad words)
    dropout: float = 0.0

    OWN = ("max_len", "suppress_tokens")  # tk's own fields, not the config's
    CONFIG = "BartConfig"
    MODEL_CLASS = "BartForConditionalGeneration"
    OUTPUT_VOCAB = ("vocab_size", "vocabulary")  # the output layer's size field, and its name in messages

    def hf_config(self):
        import transformers

        keep = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.OWN}
        config = getattr(transformers, self.CONFIG)(**keep, forced_eos_token_id=self.eos_token_id, attention_dropout=0.0,
                                                    activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0)
        config._attn_implementation = "eager"
        return config

    def hf_model(self) -> nn.Module:
        """transformers' model of these settings, randomly initialised (the weights are loaded after)."""
        import transformers

        self.check("config")
        return getattr(transformers, self.MODEL_CLASS)(self.hf_config())

    def suppressed(self) -> list[int]:
        return [int(t) for t in self.suppress_tokens.split(",") if t]

    def check(self, where: str) -> None:
        """Refuses, before anything is allocated, a config tk cannot build (hf_files.check_sizes), an activation tk
        does not export, heads that do not divide d_model."""
        hf_files.check_sizes(self, where, getattr(self, self.OUTPUT_VOCAB[0]), self.OUTPUT_VOCAB[1])
        if self.activation_function not in ACTIVATIONS:
            raise UsageError(f"{where}: activation_function {self.activation_function!r} is not one tk exports ({', '.join(ACTIVATIONS)})")
        for heads in (self.encoder_attention_heads, self.decoder_attention_heads):
            if self.d_model % heads:
                raise UsageError(f"{where}: d_model {self.d_model} is not divisible by {heads} attention heads")

    def graphs(self) -> list[GraphSpec]:
        """Its graphs in tk's cache layout (toolkit.core.graphs)."""
        return encoder_decoder_graphs(self.d_model, self.decoder_layers, self.decoder_attention_heads,
                                      getattr(self, self.OUTPUT_VOCAB[0]))


class LayerCache:
    """What the family's attention modules take as `cache`, over tk's per-layer tensors: a decoder layer calls
    `update` twice, its self-attention first (the new position's keys/values are appended to the past ones) and its
    cross-attention second (the encoder's keys/values, computed once by the encoder graph, are returned as they are).
    So every step runs transformers' own layer code, attention included, and not a copy of it."""

    def __init__(self, past_k: torch.Tensor, past_v: torch.Tensor, cross_k: torch.Tensor, cross_v: torch.Tensor):
        self.past_k, self.past_v, self.cross_k, self.cross_v = past_k, past_v, cross_k, cross_v
        self.new_k = self.new_v = None

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        if self.new_k is None:  # self-attention: one position more
            self.new_k, self.new_v = torch.cat([self.past_k, keys], dim=2), torch.cat([self.past_v, values], dim=2)
            return self.new_k, self.new_v
        return self.cross_k, self.cross_v  # cross-attention: the encoder's, not the projections of the dummy states


def heads(att: nn.Module, x: torch.Tensor, proj: nn.Module) -> torch.Tensor:
    b, n, _ = x.shape
    return proj(x).view(b, n, -1, att.head_dim).transpose(1, 2)


def source_mask(src_len: torch.Tensor, n: int) -> torch.Tensor:
    """(batch, 1, 1, n): 0 over a source's tokens, the float minimum over its padding (transformers' eager mask)."""
    keep = torch.arange(n, device=src_len.device)[None, :] < src_len[:, None]
    return torch.where(keep, 0.0, torch.finfo(torch.float32).min)[:, None, None, :]


def suppress_mask(hf: nn.Module, settings) -> torch.Tensor:
    """0 per output token, -inf for the tokens the generation config forbids (settings.suppressed())."""
    mask = torch.zeros(hf.lm_head.out_features)
    mask[settings.suppressed()] = float("-inf")
    return mask


class FamilyForTk(nn.Module):
    """A BART-family model's computation split as tk's graphs are: `encode` (source -> memory and every decoder
    layer's cross keys/values) and `decode_step` (one token against the self-attention cache). Holds the Hugging Face
    model's own modules under its own names (model, lm_head, final_logits_bias where it has one), so parameter names
    are transformers', and runs its encoder and decoder layers themselves."""

    def __init__(self, hf: nn.Module, settings: FamilySettings):
        super().__init__()
        self.model, self.lm_head = hf.model, hf.lm_head
        # The same tensor as the model's buffer: loading the directory's weights into `hf` sets it here too.
        self.bias = getattr(hf, "final_logits_bias", None) is not None
        if self.bias:
            self.register_buffer("final_logits_bias", hf.final_logits_bias)
        self.settings = settings
        self.register_buffer("suppress", suppress_mask(hf, settings), persistent=False)
        object.__setattr__(self, "hf", hf)  # the whole model, for generate(); not a second submodule

    @classmethod
    def build(cls, settings: FamilySettings) -> FamilyForTk:
        """The model of these settings, randomly initialised (the weights are loaded after), wrapped for tk."""
        return cls(settings.hf_model().eval(), settings)

    def embed(self, stack: nn.Module, ids: torch.Tensor, past: int) -> torch.Tensor:
        """The stack's input for `ids`, `past` positions in: BART's and mBART's learned positions (their offset of 2
        added by the table itself) and the layer norm over embeddings and positions."""
        return stack.layernorm_embedding(stack.embed_tokens(ids) + stack.embed_positions(ids, past))

    @staticmethod
    def final_norm(stack: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The stack's final layer norm where it has one (pre-LN members: M2M100, mBART)."""
        norm = getattr(stack, "layer_norm", None)
        return x if norm is None else norm(x)

    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> dict[str, torch.Tensor]:
        enc = self.model.encoder
        x = self.embed(enc, src, 0)
        mask = source_mask(src_len, src.shape[1])
        for layer in enc.layers:
            x = call_layer(layer, x, mask)
        x = self.final_norm(enc, x)
        return {"memory": x, "src_len": src_len, **cross_cache(self.model.decoder.layers, x)}

    def decode_step(self, token: torch.Tensor, cache: dict[str, torch.Tensor]):
        dec = self.model.decoder
        past = cache[layer_key("self_k", 0)].shape[2]
        x = self.embed(dec, token[:, None], past)
        cross_mask = source_mask(cache["src_len"], cache[layer_key("cross_k", 0)].shape[2])
        new = {}
        for i, layer in enumerate(dec.layers):
            sk, sv, ck, cv = (layer_key(name, i) for name in ("self_k", "self_v", "cross_k", "cross_v"))
            layer_cache = LayerCache(cache[sk], cache[sv], cache[ck], cache[cv])
            # No causal mask: the cache holds only earlier positions. The encoder states passed are a stand-in (the
            # cache returns the encoder graph's keys/values); their unused projections are dropped from the graph.
            x = call_layer(layer, x, None, x, encoder_attention_mask=cross_mask, layer_cache=layer_cache)
            new[sk], new[sv] = layer_cache.new_k, layer_cache.new_v
        logits = self.lm_head(self.final_norm(dec, x)[:, 0])
        if self.bias:
            logits = logits + self.final_logits_bias
        # As generate: log-softmax first, then the forbidden tokens at -inf (the others are not renormalised).
        return torch.log_softmax(logits, dim=-1) + self.suppress, {**cache, **new}


# ---- reading a Hugging Face directory -----------------------------------------------------------------------------

def read_configs(source: str | Path, what: str) -> tuple[Path, dict, dict, dict]:
    """(directory, config.json, generation_config.json, tokenizer_config.json) of `hf:DIR` (or DIR)."""
    directory = hf_files.directory_of(source)
    config = hf_files.read_json(directory, "config.json", what=what)
    generation = hf_files.read_json(directory, "generation_config.json", required=False) or {}
    return directory, config, generation, hf_files.read_json(directory, "tokenizer_config.json", required=False) or {}


def settings_from(cls: type[FamilySettings], config: dict, generation: dict, where: Path, fallback=None,
                  gen: dict | None = None) -> tuple[FamilySettings, DecodingRules, int | None]:
    """tk's settings, the end rules and the configured forced first token (None: none) from the two configs
    (`gen`: their generation fields, where the member has already read them; `fallback`: hf_files.config_values')."""
    gen = generation_fields(config, generation) if gen is None else gen
    values = hf_files.config_values(cls, config, gen, where, cls.OWN, fallback)
    origin = lambda key: f"{where}/{'generation_config.json' if key in generation else 'config.json'}"  # noqa: E731
    settings = cls(**values, max_len=min(values["max_position_embeddings"], 1024),
                   suppress_tokens=forbidden(gen, origin))
    settings.check(f"{where}/config.json")
    first = gen.get("forced_bos_token_id")
    if first is not None and (type(first) is not int or not 0 <= first < settings.vocab_size):
        raise UsageError(f"{origin('forced_bos_token_id')}: forced_bos_token_id must be a token id below {settings.vocab_size}, got {first!r:.40}")
    return settings, hf_files.end_rules(settings, config, gen, origin, where), first


def load_weights(wrapper: type[FamilyForTk], settings: FamilySettings, directory: Path, optional: set[str],
                 tie: bool = True) -> tuple[FamilyForTk, list[Path]]:
    """The model with the directory's weights, checked against transformers' own shapes first (on the meta device);
    `optional`: the entries a saved directory may leave out. `tie`: the embeddings are model.shared, saved once under
    one of the tied names (model.shared itself where it is absent), and tied again after loading."""
    state, origin, files = hf_files.read_weights(directory, settings.MODEL_CLASS)
    if tie and "model.shared.weight" not in state:
        optional = optional | {"model.shared.weight"}
    check_weights(meta_shapes(settings.hf_model), optional, state, origin, directory, settings.MODEL_CLASS)
    model = wrapper.build(settings)
    model.hf.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if tie:
        model.hf.tie_weights()
    return model.eval(), files


def tied(settings: FamilySettings) -> set[str]:
    """The entries tied to model.shared, which a saved directory holds once: the stacks' embeddings, and the output
    layer when tied."""
    return {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"} | (
        {"lm_head.weight"} if settings.tie_word_embeddings else set())


def beams(config: dict, generation: dict) -> int:
    value = generation.get("num_beams", config.get("num_beams", 1))
    return value if type(value) is int and value >= 1 else 1


# ---- the multilingual members' language codes (M2M100/NLLB, mBART) ------------------------------------------------

LANGUAGE_TOKEN = re.compile(r"__([a-z]{2,3}(?:_[A-Za-z]+)?)__|([a-z]{2,3}_[A-Z][A-Za-z]{1,3})")


def language_codes(tokens: dict[int, str], size: int, where: Path) -> dict[str, int]:
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


def default_language(tok_config: dict, key: str, codes: dict[str, int], fallback: int | None) -> str:
    """The language the model's own files name (tokenizer_config.json's src_lang/tgt_lang, or the forced token)."""
    value = tok_config.get(key)
    if isinstance(value, str):
        value = value.strip("_") if value.strip("_") in codes else value
        if value in codes:
            return value
    by_id = {i: c for c, i in codes.items()}
    return by_id.get(fallback) or ("en" if "en" in codes else "eng_Latn" if "eng_Latn" in codes else sorted(codes)[0])


def saved_language_tokens(tok_config: dict) -> dict[int, str] | None:
    """The added tokens tokenizer_config.json saves (added_tokens_decoder), where some spell a language; else None."""
    saved = tok_config.get("added_tokens_decoder")
    if isinstance(saved, dict):
        found = {int(i): t.get("content") for i, t in saved.items() if str(i).isdigit() and isinstance(t, dict)}
        if any(isinstance(c, str) and LANGUAGE_TOKEN.fullmatch(c) for c in found.values()):
            return found
    return None


def multilingual_tokenizer(directory: Path, tok_config: dict, settings: FamilySettings, forced: int | None,
                           files_of=None) -> tuple[TokenizerDeclaration, str]:
    """A multilingual member's tokenizer, checked: tokenizer.json where the model ships one (its language codes as
    added tokens), else `files_of(directory, tok_config, settings)`'s (kind, files, pieces -> ids, language tokens,
    note); the default languages are those its files name (the target: the forced token's)."""
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
        kind, files, unk_piece, added, note = files_of(directory, tok_config, settings)
    codes = language_codes(added, settings.vocab_size, directory)
    unk = unk_piece.get("<unk>")
    if unk is None:
        raise UsageError(f"{directory}: the tokenizer has no <unk> token")
    suffix = bool(tok_config.get("legacy_behaviour", False))
    declared = TokenizerDeclaration(kind=kind, **files, unk=unk, languages=codes, lang_suffix=suffix,
                                    source_lang=default_language(tok_config, "src_lang", codes, None),
                                    target_lang=default_language(tok_config, "tgt_lang", codes, forced))
    return declared, note


@dataclass
class HfSource:
    """A Hugging Face directory, read: the model wrapped for tk, its rules and the files it came from."""

    directory: Path
    settings: object
    rules: DecodingRules
    model: nn.Module
    weight_files: list[Path]
    tokenizer: TokenizerDeclaration
    num_beams: int
    architecture: str  # its entry in toolkit.core.architectures
    tokenizer_type: str

    def record(self, weights_sha256: str) -> dict:
        """The manifest's checkpoint section: where the weights came from and their digests."""
        digest = file_sha256(self.weight_files[0]) if len(self.weight_files) == 1 else None
        return {"path": self.directory.name, "sha256": digest, "weights_sha256": weights_sha256}


def write_files(source: HfSource, tmp: Path) -> dict:
    """Copies the tokenizer files into the model directory; returns the manifest sections they and the rules make."""
    extra = []
    for name in source.tokenizer.files():
        shutil.copyfile(source.directory / name, tmp / name)
        extra.append({"file": name, "sha256": file_sha256(tmp / name)})
    declaration = Declaration(source.rules, source.tokenizer, origin=HF, placeholders=False)
    return {"declaration": declaration.to_dict(), "extra_files": extra,
            "tokenizer": {"file": extra[0]["file"], "sha256": extra[0]["sha256"], "type": source.tokenizer_type},
            "special_tokens": {"pad": source.settings.pad_token_id, "unk": source.tokenizer.unk, "bos": source.rules.start,
                               "eos": source.rules.end},
            "training": {"options": {"imported_from": "huggingface", "num_beams": source.num_beams,
                                     "settings": asdict(source.settings)}}}


def cross_cache(layers, memory: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each decoder layer's cross-attention keys and values over the encoder's output, computed once per sentence."""
    out = {}
    for i, layer in enumerate(layers):
        att = layer.encoder_attn
        out[layer_key("cross_k", i)], out[layer_key("cross_v", i)] = heads(att, memory, att.k_proj), heads(att, memory, att.v_proj)
    return out
