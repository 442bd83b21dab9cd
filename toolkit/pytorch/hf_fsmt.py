"""Hugging Face FSMTForConditionalGeneration in (fairseq's WMT19 translation models, facebook/wmt19-en-de and its
siblings): `tk export hf:DIR --out OUT`, the builder of toolkit.core.entries.fsmt. Its settings are the BART family's
(toolkit.pytorch.bart_family.FamilySettings, two vocabularies as Marian's); its computation is its own.

`FsmtForTk` computes tk's graphs with the model's own modules and layers (transformers' attention code runs each step
over tk's cache, so the exported nodes carry transformers' module paths): two vocabularies (the encoder embeds the
source's, the decoder embeds and predicts the target's, through its own `output_projection`), scaled embeddings,
fairseq's sinusoidal positions counted from padding_idx + 1 (the padding's own row zero), post-LN layers with no final
layer norm, layers that run time-major. Decoding follows generate: the decoder started with </s>
(decoder_start_token_id), </s> forced at the length limit, the generation config's beam rule.

The two transformers lines decode apart, and tk follows the installed one: transformers 5 gives each decoder step the
position after the ones before it; 4.x's cached generate gives every step the first position (its decoder counts
positions over the one new token it is given). The setting is recorded (`step_positions`), so verify refuses to hold
a model exported under one line to `generate` under the other. 4.x also ties the output projection to the decoder's
embedding whatever the config says; 5.x only with tie_word_embeddings (a saved directory holds a tied pair once).

Tokenizer: FSMTTokenizer's merges.txt, vocab-src.json and vocab-tgt.json and its language pair (tokenizer_config.json
`langs`), run without transformers by toolkit.core.fsmt_tokenizer.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from toolkit.core.declaration import DecodingRules, TokenizerDeclaration, layer_key
from toolkit.core.errors import UsageError
from toolkit.pytorch import bart_family, hf_files
from toolkit.pytorch.bart_family import FamilySettings, HfSource
from toolkit.pytorch.hf_files import check_weights, inside, meta_shapes
from toolkit.pytorch.hf_layers import call_layer
from toolkit.pytorch.registry import ModelEntry

# Computed at load, never saved.
COMPUTED = {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}


@dataclass
class FsmtSettings(FamilySettings):
    """What tk keeps of an FSMTConfig (FamilySettings' fields, FSMT's defaults, its target vocabulary, and how the
    installed transformers line positions a decoder step)."""

    decoder_vocab_size: int = 128  # the target vocabulary (tgt_vocab_size; vocab_size is src_vocab_size)
    activation_function: str = "relu"
    scale_embedding: bool = True
    tie_word_embeddings: bool = False
    step_positions: bool = True  # each step's position counts the steps before it (transformers 5; 4.x: False)

    OWN = ("max_len", "suppress_tokens", "step_positions")
    LINE_DEPENDENT = ("step_positions",)  # the installed transformers line decides it
    CONFIG, MODEL_CLASS = "FSMTConfig", "FSMTForConditionalGeneration"
    OUTPUT_VOCAB = ("decoder_vocab_size", "target vocabulary")

    def hf_config(self):
        from transformers import FSMTConfig

        keep = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in (*self.OWN, "vocab_size", "decoder_vocab_size")}
        return FSMTConfig(**keep, src_vocab_size=self.vocab_size, tgt_vocab_size=self.decoder_vocab_size,
                          forced_eos_token_id=self.eos_token_id, attention_dropout=0.0, activation_dropout=0.0,
                          encoder_layerdrop=0.0, decoder_layerdrop=0.0)


def counts_steps() -> bool:
    """Whether the installed transformers gives a cached decoder step the position after the ones before it (5.x's
    positional embedding takes the cache's length; 4.x's counts over the tokens it is given, one per cached step)."""
    from transformers.models.fsmt.modeling_fsmt import SinusoidalPositionalEmbedding

    return "cache_length" in inspect.signature(SinusoidalPositionalEmbedding.forward).parameters


def _positions(table: nn.Module, ids: torch.Tensor, past) -> torch.Tensor:
    """The sinusoidal rows of `ids` by the module's own rule (from padding_idx + 1, padding at padding_idx), `past`
    steps on, without the forward's branch that grows the table (tk's max_len stays within it)."""
    rows = table.make_positions(ids, table.padding_idx) + past
    return table.weight.index_select(0, rows.reshape(-1)).view(*ids.shape, -1)


@cache
def _step_cache_class() -> type:
    from transformers.cache_utils import EncoderDecoderCache

    class StepCache(EncoderDecoderCache):
        """What FSMT's attention takes as `layer_state`, over tk's per-layer tensors (an EncoderDecoderCache by type,
        as it asks): self-attention appends the new position's keys/values to the past ones; cross-attention finds
        the encoder graph's, marked computed."""

        def __init__(self, past: list[tuple[torch.Tensor, torch.Tensor]], cross: list[tuple[torch.Tensor, torch.Tensor]]):
            self.past, self.new = past, {}
            self.is_updated = dict.fromkeys(range(len(cross)), True)
            self.self_attention_cache = self
            self.cross_attention_cache = SimpleNamespace(layers=[SimpleNamespace(keys=k, values=v) for k, v in cross])

        def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
            k, v = self.past[layer_idx]
            self.new[layer_idx] = torch.cat([k, keys], dim=2), torch.cat([v, values], dim=2)
            return self.new[layer_idx]

    return StepCache


class FsmtForTk(nn.Module):
    """FSMT's computation split as tk's graphs are (see the module's docstring); holds the Hugging Face model's own
    modules under their own names (model), so parameter names are transformers'."""

    def __init__(self, hf: nn.Module, settings: FsmtSettings):
        super().__init__()
        self.model, self.settings = hf.model, settings
        suppress = torch.zeros(settings.decoder_vocab_size)
        suppress[settings.suppressed()] = float("-inf")
        self.register_buffer("suppress", suppress, persistent=False)
        object.__setattr__(self, "hf", hf)  # the whole model, for generate(); not a second submodule

    @classmethod
    def build(cls, settings: FsmtSettings) -> FsmtForTk:
        """The model of these settings, randomly initialised (the weights are loaded after), wrapped for tk."""
        return cls(settings.hf_model().eval(), settings)

    @staticmethod
    def _padding(src_len: torch.Tensor, n: int) -> torch.Tensor:
        """(batch, n): True over a source's padding (FSMT's attention fills those scores with the float minimum)."""
        return torch.arange(n, device=src_len.device)[None, :] >= src_len[:, None]

    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> dict[str, torch.Tensor]:
        enc = self.model.encoder
        x = (enc.embed_tokens(src) * enc.embed_scale + _positions(enc.embed_positions, src, 0)).transpose(0, 1)
        padding = self._padding(src_len, src.shape[1])
        for layer in enc.layers:
            x = call_layer(layer, x, padding)
        x = x.transpose(0, 1)
        return {"memory": x, "src_len": src_len, **bart_family.cross_cache(self.model.decoder.layers, x)}

    def decode_step(self, token: torch.Tensor, cache: dict[str, torch.Tensor]):
        dec = self.model.decoder
        layers = range(len(dec.layers))
        past = cache[layer_key("self_k", 0)].shape[2] if self.settings.step_positions else 0
        ids = token[:, None]
        x = (dec.embed_tokens(ids) * dec.embed_scale + _positions(dec.embed_positions, ids, past)).transpose(0, 1)
        state = _step_cache_class()([(cache[layer_key("self_k", i)], cache[layer_key("self_v", i)]) for i in layers],
                                    [(cache[layer_key("cross_k", i)], cache[layer_key("cross_v", i)]) for i in layers])
        padding = self._padding(cache["src_len"], cache[layer_key("cross_k", 0)].shape[2])
        for layer in dec.layers:
            # No causal mask: the cache holds only earlier positions. The encoder states passed are a stand-in (the
            # cache gives the encoder graph's keys/values); their unused projections are dropped from the graph.
            x = call_layer(layer, x, x, encoder_attn_mask=padding, layer_state=state)
        new = {layer_key(f"self_{kv}", i): state.new[i][j] for i in layers for j, kv in enumerate("kv")}
        logits = dec.output_projection(x[0])
        # As generate: log-softmax first, then the forbidden tokens at -inf (the others are not renormalised).
        return torch.log_softmax(logits, dim=-1) + self.suppress, {**cache, **new}


# ---- reading a Hugging Face directory -----------------------------------------------------------------------------

def settings_from(config: dict, generation: dict, where: Path) -> tuple[FsmtSettings, DecodingRules]:
    """tk's settings and generate's rules from the two configs (FSMTConfig names the vocabularies src_vocab_size and
    tgt_vocab_size)."""
    sizes = {ours: config[theirs] for ours, theirs in (("vocab_size", "src_vocab_size"), ("decoder_vocab_size", "tgt_vocab_size"))
             if theirs in config}
    settings, rules, forced = bart_family.settings_from(FsmtSettings, {**config, **sizes}, generation, where)
    if forced is not None:
        raise UsageError(f"{where}: forced_bos_token_id is set; fairseq's FSMT models force no first token")
    return dataclasses.replace(settings, step_positions=counts_steps()), rules


def _tokenizer(directory: Path, tok_config: dict, settings: FsmtSettings) -> TokenizerDeclaration:
    """The FSMTTokenizer files, checked: both vocabularies within the model's, the merges readable, the pair named."""
    from toolkit.core.fsmt_tokenizer import FsmtTokenizer

    for name in ("merges.txt", "vocab-src.json", "vocab-tgt.json"):
        if not inside(directory, name).is_file():
            raise UsageError(f"{directory} has no {name}; save the FSMTTokenizer beside the model (tokenizer.save_pretrained(DIR))")
    langs = tok_config.get("langs")
    if not (isinstance(langs, list) and len(langs) == 2 and all(isinstance(c, str) for c in langs)):
        raise UsageError(f"{directory}/tokenizer_config.json: langs must name the source and target languages (['en', 'de']), "
                         f"got {langs!r:.40}")
    if tok_config.get("do_lower_case"):
        raise UsageError(f"{directory}/tokenizer_config.json: do_lower_case is set; tk imports FSMT tokenizers that keep case")
    source = hf_files.vocabulary(directory, "vocab-src.json", settings.vocab_size, "src_vocab_size")
    hf_files.vocabulary(directory, "vocab-tgt.json", settings.decoder_vocab_size, "tgt_vocab_size")
    declared = TokenizerDeclaration(kind="fsmt", source="merges.txt", vocab="vocab-src.json", target_vocab="vocab-tgt.json",
                                    unk=source.get("<unk>", 3), source_lang=langs[0], target_lang=langs[1])
    FsmtTokenizer.load(directory, declared)  # refuses what it cannot run (no <unk>, unreadable merges)
    return declared


def _tied(settings: FsmtSettings) -> list[set[str]]:
    """The parameter names that share one tensor in the model this transformers line builds (on the meta device): a
    saved directory holds each group under one of its names."""
    with torch.device("meta"):
        hf = settings.hf_model()
    groups: dict[int, set[str]] = {}
    for name, p in hf.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), set()).add(name)
    return [g for g in groups.values() if len(g) > 1]


def read(source: str | Path) -> HfSource:
    """Reads `hf:DIR` (or DIR): config, generation config, weights and the FSMTTokenizer files."""
    directory, config, generation, tok_config = bart_family.read_configs(source, "model and FSMTTokenizer")
    settings, rules = settings_from(config, generation, directory)
    tokenizer = _tokenizer(directory, tok_config, settings)
    state, origin, files = hf_files.read_weights(directory, settings.MODEL_CLASS)
    tied = _tied(settings)
    check_weights(meta_shapes(settings.hf_model), COMPUTED.union(*tied), state, origin, directory, settings.MODEL_CLASS)
    absent = next((min(g) for g in tied if not g & set(state)), None)
    if absent is not None:
        raise UsageError(f"{directory}: weight {absent} is missing from the weights ({', '.join(sorted(f.name for f in files))})")
    model = FsmtForTk.build(settings)
    model.hf.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    return HfSource(directory, settings, rules, model.eval(), files, tokenizer, bart_family.beams(config, generation), "fsmt",
                    "FSMTTokenizer (merges.txt, vocab-src.json, vocab-tgt.json)")


MODEL = ModelEntry("fsmt", FsmtSettings, FsmtForTk.build, FsmtSettings.graphs)
