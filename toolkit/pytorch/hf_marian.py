"""Hugging Face MarianMTModel in: a `save_pretrained` directory as a tk translation model (`tk export hf:DIR --out OUT`).

The exported graphs follow tk's cache layout, not transformers': an encoder graph that also computes every decoder
layer's cross-attention keys and values once, and a one-step decoder graph with one self-attention key and value
tensor per layer. `MarianForTk` computes each step with Marian's own modules (its projections, layer norms,
activation and output layer are called, so the exported nodes carry their module paths, model.decoder.layers.1.fc1,
and `tk verify --localize` names them) and Marian's rules: scaled embeddings when the config says so, its sinusoidal
positions (sines in the first half, cosines in the second), post-LN layers, the output bias final_logits_bias, the
start token (decoder_start_token_id, the pad id) and the tokens the generation config forbids.

A Hugging Face directory is untrusted input: weights come from model.safetensors (or its shards), never from an
unpickled pytorch_model.bin (hf_files.read_weights); no code from the directory runs (the model is built from
transformers' own MarianMTModel, whatever config.json names), and no file outside it is read. Whatever would pass
export and fail (or translate to nothing) later is refused at export in one line naming the file and the field or
tensor: ill-typed generation fields, tensors that are not dense floating-point weights or hold NaN or infinities,
shapes other than the config's (checked on a model built on the meta device, before anything is allocated), vocabulary
ids outside the embedding, SentencePiece models that do not load.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from toolkit.core.declaration import Declaration, DecodingRules, TokenizerDeclaration, layer_key
from toolkit.core.digests import file_sha256
from toolkit.core.errors import UsageError
from toolkit.pytorch import hf_files
from toolkit.pytorch.hf_files import PREFIX, check_weights, forbidden, generation_fields, inside, meta_shapes
from toolkit.pytorch.hf_layers import call_layer

__all__ = ["PREFIX", "MarianSettings", "MarianForTk", "build", "read", "write_files"]
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "target_vocab.json")
# transformers' MarianMTModel leaves these out of what it saves: it computes them at load.
COMPUTED = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


@dataclass
class MarianSettings:
    """What tk keeps of a MarianConfig: every field its computation depends on (the manifest's "config")."""

    vocab_size: int = 128
    decoder_vocab_size: int = 128
    d_model: int = 32
    encoder_layers: int = 2
    decoder_layers: int = 2
    encoder_attention_heads: int = 4
    decoder_attention_heads: int = 4
    encoder_ffn_dim: int = 64
    decoder_ffn_dim: int = 64
    activation_function: str = "swish"
    scale_embedding: bool = True
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True  # the output layer is the decoder's embedding
    max_position_embeddings: int = 64
    pad_token_id: int = 1
    eos_token_id: int = 0
    decoder_start_token_id: int = 1
    max_len: int = 64  # tk's positions bound: max_position_embeddings
    suppress_tokens: str = ""  # comma-separated ids the decoder graph gives -inf (the generation config's bad words)
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.share_encoder_decoder_embeddings:  # one vocabulary: the decoder's is the encoder's
            self.decoder_vocab_size = self.vocab_size

    def marian_config(self):
        from transformers import MarianConfig

        keep = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("max_len", "suppress_tokens")}
        config = MarianConfig(**keep, forced_eos_token_id=self.eos_token_id, attention_dropout=0.0, activation_dropout=0.0)
        config._attn_implementation = "eager"
        return config

    def suppressed(self) -> list[int]:
        return [int(t) for t in self.suppress_tokens.split(",") if t]


ACTIVATIONS = ("swish", "silu", "gelu", "relu", "gelu_new", "gelu_fast", "tanh", "sigmoid")


def _check(settings: MarianSettings, where: str) -> None:
    """Refuses, before anything is allocated, a config tk cannot build (hf_files.check_sizes, on the target vocabulary)."""
    hf_files.check_sizes(settings, where, ACTIVATIONS, settings.decoder_vocab_size, "target vocabulary")


def build(settings: MarianSettings) -> MarianForTk:
    """A MarianMTModel of these settings, randomly initialised (the weights are loaded after), wrapped for tk."""
    from transformers import MarianMTModel

    _check(settings, "config")
    hf = MarianMTModel(settings.marian_config()).eval()
    return MarianForTk(hf, settings)


class _LayerCache:
    """What Marian's attention modules take as `cache`, over tk's per-layer tensors: a decoder layer calls `update`
    twice, its self-attention first (the new position's keys/values are appended to the past ones) and its
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


def _heads(att: nn.Module, x: torch.Tensor, proj: nn.Module) -> torch.Tensor:
    b, n, _ = x.shape
    return proj(x).view(b, n, -1, att.head_dim).transpose(1, 2)


class MarianForTk(nn.Module):
    """MarianMTModel's computation split as tk's graphs are: `encode` (source -> memory and every decoder layer's
    cross keys/values) and `decode_step` (one token against the self-attention cache). Holds the Hugging Face model's
    own modules under its own names (model, lm_head, final_logits_bias), so parameter names are transformers', and
    runs its encoder and decoder layers themselves."""

    def __init__(self, hf: nn.Module, settings: MarianSettings):
        super().__init__()
        self.model, self.lm_head = hf.model, hf.lm_head
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
        x = enc.embed_tokens(src) * enc.embed_scale + enc.embed_positions(src.shape)
        mask = self._mask(src_len, src.shape[1])
        for layer in enc.layers:
            x = call_layer(layer, x, mask)
        out = {"memory": x, "src_len": src_len}
        for i, layer in enumerate(self.model.decoder.layers):
            att = layer.encoder_attn
            out[layer_key("cross_k", i)], out[layer_key("cross_v", i)] = _heads(att, x, att.k_proj), _heads(att, x, att.v_proj)
        return out

    def decode_step(self, token: torch.Tensor, cache: dict[str, torch.Tensor]):
        dec = self.model.decoder
        past = cache[layer_key("self_k", 0)].shape[2]
        x = dec.embed_tokens(token[:, None]) * dec.embed_scale + dec.embed_positions((token.shape[0], 1), past)
        cross_mask = self._mask(cache["src_len"], cache[layer_key("cross_k", 0)].shape[2])
        new = {}
        for i, layer in enumerate(dec.layers):
            sk, sv, ck, cv = (layer_key(name, i) for name in ("self_k", "self_v", "cross_k", "cross_v"))
            layer_cache = _LayerCache(cache[sk], cache[sv], cache[ck], cache[cv])
            # No causal mask: the cache holds only earlier positions. The encoder states passed are a stand-in (the
            # cache returns the encoder graph's keys/values); their unused projections are dropped from the graph.
            x = call_layer(layer, x, None, x, encoder_attention_mask=cross_mask, layer_cache=layer_cache)
            new[sk], new[sv] = layer_cache.new_k, layer_cache.new_v
        logits = self.lm_head(x[:, 0]) + self.final_logits_bias
        # As generate: log-softmax first, then the forbidden tokens at -inf (the others are not renormalised).
        return torch.log_softmax(logits, dim=-1) + self.suppress, {**cache, **new}


def settings_from(config: dict, generation: dict, where: Path) -> tuple[MarianSettings, DecodingRules]:
    """tk's settings and decoding rules from config.json and generation_config.json."""
    if config.get("model_type") != "marian":  # the architecture table names what tk imports
        from toolkit.core.architectures import for_hf_model_type

        for_hf_model_type(config.get("model_type"), f"{where}/config.json")
    gen = generation_fields(config, generation)
    # A Marian without decoder_vocab_size (or with null) shares its one vocabulary.
    values = hf_files.config_values(MarianSettings, config, gen, where, ("max_len", "suppress_tokens"),
                                    lambda name, c: c.get("vocab_size", MarianSettings().vocab_size) if name == "decoder_vocab_size" else None)
    if config.get("normalize_before") or config.get("add_final_layer_norm") or config.get("normalize_embedding"):
        raise UsageError(f"{where}/config.json asks for layer norms MarianMTModel does not have; is it a Marian model?")
    origin = lambda key: f"{where}/{'generation_config.json' if key in generation else 'config.json'}"  # noqa: E731
    suppress = forbidden(gen, origin)
    settings = MarianSettings(**values, max_len=min(values["max_position_embeddings"], 1024),
                              suppress_tokens=",".join(str(t) for t in sorted(set(suppress))))
    _check(settings, f"{where}/config.json")
    rules = hf_files.end_rules(settings, config, gen, origin, where)
    return settings, rules


@dataclass
class HfSource:
    """A Hugging Face Marian directory, read: the model wrapped for tk, its rules and the files it came from."""

    directory: Path
    settings: MarianSettings
    rules: DecodingRules
    model: MarianForTk
    weight_files: list[Path]
    tokenizer: TokenizerDeclaration
    num_beams: int
    architecture: str = "marian"  # its entry in toolkit.core.architectures
    tokenizer_type: str = "MarianTokenizer (source.spm, target.spm, vocab.json)"

    def record(self, weights_sha256: str) -> dict:
        """The manifest's checkpoint section: where the weights came from and their digests."""
        digest = file_sha256(self.weight_files[0]) if len(self.weight_files) == 1 else None
        return {"path": self.directory.name, "sha256": digest, "weights_sha256": weights_sha256}


def _expected(settings: MarianSettings) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """MarianMTModel's state dict for these settings (shapes), and the entries a saved directory may leave out: the
    tied ones (saved once, as the embedding they share), the output bias (transformers starts a missing one at zero)
    and the positions transformers computes at load."""
    from transformers import MarianMTModel

    _check(settings, "config")
    own = meta_shapes(lambda: MarianMTModel(settings.marian_config()))
    optional = {"final_logits_bias", *COMPUTED} | ({"lm_head.weight"} if settings.tie_word_embeddings else set())
    if settings.share_encoder_decoder_embeddings:
        optional |= {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    return own, optional


SPM_HINT = "a Hugging Face Marian directory holds MarianTokenizer's source.spm and target.spm (tokenizer.save_pretrained)"


def read(source: str | Path) -> HfSource:
    """Reads `hf:DIR` (or DIR): config, generation config, weights and MarianTokenizer files."""
    directory = hf_files.directory_of(source)
    config = hf_files.read_json(directory, "config.json", what="model and MarianTokenizer")
    generation = hf_files.read_json(directory, "generation_config.json", required=False) or {}
    settings, rules = settings_from(config, generation, directory)
    tok_config = hf_files.read_json(directory, "tokenizer_config.json", required=False) or {}
    separate = bool(tok_config.get("separate_vocabs", False))
    for name in ("source.spm", "target.spm", "vocab.json") + (("target_vocab.json",) if separate else ()):
        if not inside(directory, name).is_file():
            raise UsageError(f"{directory} has no {name}; save the MarianTokenizer beside the model (tokenizer.save_pretrained(DIR))")
    vocab = hf_files.vocabulary(directory, "vocab.json", settings.vocab_size, "vocab_size")
    if separate:
        hf_files.vocabulary(directory, "target_vocab.json", settings.decoder_vocab_size, "decoder_vocab_size")
    for name in ("source.spm", "target.spm"):
        hf_files.sentencepiece(directory / name, SPM_HINT)
    unk = vocab.get(tok_config.get("unk_token", "<unk>") if isinstance(tok_config.get("unk_token", "<unk>"), str) else "<unk>")
    if unk is None:
        raise UsageError(f"{directory}/vocab.json has no <unk> piece")
    tokenizer = TokenizerDeclaration(kind="marian", source="source.spm", target="target.spm", vocab="vocab.json",
                                     target_vocab="target_vocab.json" if separate else None, unk=unk)
    state, origin, files = hf_files.read_weights(directory, "MarianMTModel")
    check_weights(*_expected(settings), state, origin, directory, "MarianMTModel")
    model = build(settings)
    model.hf.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    model.eval()
    beams = generation.get("num_beams", config.get("num_beams", 1))
    return HfSource(directory, settings, rules, model, files, tokenizer, beams if type(beams) is int and beams >= 1 else 1)


def write_files(source: HfSource, tmp: Path) -> dict:
    """Copies the tokenizer files into the model directory; returns the manifest sections they and the rules make."""
    extra = []
    for name in source.tokenizer.files():
        shutil.copyfile(source.directory / name, tmp / name)
        extra.append({"file": name, "sha256": file_sha256(tmp / name)})
    declaration = Declaration(source.rules, source.tokenizer, origin="hf", placeholders=False)
    return {"declaration": declaration.to_dict(), "extra_files": extra,
            "tokenizer": {"file": extra[0]["file"], "sha256": extra[0]["sha256"], "type": source.tokenizer_type},
            "special_tokens": {"pad": source.settings.pad_token_id, "unk": source.tokenizer.unk, "bos": source.rules.start,
                               "eos": source.rules.end},
            "training": {"options": {"imported_from": "huggingface", "num_beams": source.num_beams,
                                     "settings": asdict(source.settings)}}}
