"""The one registry of models: config, builder, and exportable graphs of each.

Adding a model means adding a class to models/ and one `@register` entry here;
`tk train`, `tk export`, `tk verify` and `tk translate` all work from it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from toolkit.core.errors import UsageError
from toolkit.core.graphs import FLOAT, INT, SRC, GraphSpec, TensorSpec, decoder_graph, encoder_decoder_graphs
from toolkit.core.manifest import SIZES, size_problem
from toolkit.models.attention import AdditiveAttention, DotProductAttention, MultiHeadAttention, masked_softmax
from toolkit.models.kernel_regression import NWKernelRegression
from toolkit.models.seq2seq import Seq2SeqAttention, Seq2SeqConfig
from toolkit.models.transformer import Transformer, TransformerConfig, layer_key
from toolkit.pytorch import hf_m2m100, hf_mbart, hf_t5
from toolkit.pytorch.adapter import AdapterSettings
from toolkit.pytorch.adapter import build as adapter_build
from toolkit.pytorch.hf_marian import MarianSettings
from toolkit.pytorch.hf_marian import build as hf_build


@dataclass
class ModelEntry:
    name: str
    kind: str  # "seq2seq": encoder + decoder step graphs; "module": one standalone graph
    config_cls: type
    build: Callable[[object], nn.Module]
    graphs: Callable[[object], list[GraphSpec]]
    # For "module" entries: model, *inputs -> outputs in declared order.
    run: Callable[..., tuple] | None = None
    # Its training task (a name in toolkit.pytorch.train.TASKS, which owns the training code); None: none.
    train: str | None = None
    # The attention variant: graph name -> extra outputs (the masked attention probabilities, in the
    # order the graph computes them), and how to read the same weights off the PyTorch model after a call.
    attention: Callable[[object], dict[str, tuple[TensorSpec, ...]]] | None = None
    read_attention: Callable[[nn.Module, str, int], list] | None = None
    # Whether `build(config)` makes the model (with random weights): not for an adapter, whose code only its user names.
    random_init: bool = True

    def config(self, **overrides) -> object:
        known = {f.name for f in dataclasses.fields(self.config_cls)}
        return self.config_cls(**{k: v for k, v in overrides.items() if k in known})

    def field_types(self) -> dict[str, type]:
        """Each config field's type: its default's, or for an optional field (default None) the type it holds."""
        return {f.name: type(f.default) if f.default is not None else _optional_type(self.config_cls, f.name)
                for f in dataclasses.fields(self.config_cls)}

    def checked_config(self, values: dict, where: str) -> object:
        """The config from stored values (a checkpoint's), refusing unknown keys, wrong types and impossible sizes."""
        types = self.field_types()
        unknown = sorted(set(values) - set(types))
        if unknown:
            raise UsageError(f"{where}: '{unknown[0]}' is not a {self.name} config field (known: {', '.join(types)})")
        for key, value in values.items():
            if not _fits(value, types[key]):
                raise UsageError(f"{where}: config {key}={value!r} is not {'an integer' if types[key] is int else 'a ' + types[key].__name__}; "
                                 "retrain or restore it")
        cfg = self.config_cls(**values)
        check_config(self.name, cfg, where)
        return cfg

    def parse_overrides(self, items: dict[str, object], settings: dict[str, type]) -> dict:
        """`--set KEY=VALUE` values parsed per field: config fields of this model, or the training `settings`.

        Strings are parsed by the field's type (bool: true/false); an unknown key is an error listing the known ones.
        """
        types = {**self.field_types(), **settings}
        out = {}
        for key, raw in items.items():
            if key not in types:
                raise UsageError(f"--set {key}: not a setting of {self.name}; known: {', '.join(sorted(types))}")
            out[key] = parse_value(key, raw, types[key])
        return out


def _optional_type(cls: type, name: str) -> type:
    """int for a field annotated `int | None` (TransformerConfig.decoder_layers)."""
    kinds = [k for k in typing.get_args(typing.get_type_hints(cls)[name]) if k is not type(None)]
    return kinds[0] if len(kinds) == 1 else object


def _fits(value, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def parse_value(key: str, raw: object, kind: type):
    if not isinstance(raw, str):
        if _fits(raw, kind):
            return raw
        raise UsageError(f"--set {key}={raw!r}: expected {'an integer' if kind is int else 'a ' + kind.__name__}")
    text = raw.strip()
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return text.lower() in ("true", "1", "yes")
        value = kind(text)
    except ValueError:
        hint = {bool: "true or false", int: "an integer", float: "a number"}.get(kind, f"a {kind.__name__}")
        raise UsageError(f"--set {key}={raw}: expected {hint}") from None
    if kind is float and not math.isfinite(value):
        raise UsageError(f"--set {key}={raw}: expected a finite number")
    return value


def check_config(model: str, cfg: object, where: str = "config") -> None:
    """Sizes a model can actually be built and trained with, each within the bounds a manifest accepts
    (manifest.SIZES); checked before any work starts and before anything is allocated (`--set num_layers=1e20`
    grew memory at 170 MB/s, `--set max_len=100000000` asked for a 25 GB table)."""
    values = dataclasses.asdict(cfg)
    for key, value in values.items():
        if key == "pad_id":
            if value != 0:
                raise UsageError(f"{where}: pad_id must be 0 (the tokenizer's padding id), got {value}")
        elif key in SIZES:
            problem = size_problem(key, value)
            if problem:
                raise UsageError(f"{where}: {problem}")
        elif isinstance(value, int) and not isinstance(value, bool) and value < 1:  # every int field is in SIZES (tested)
            raise UsageError(f"{where}: {key} must be at least 1, got {value}")
    if "dropout" in values and not 0.0 <= values["dropout"] < 1.0:
        raise UsageError(f"{where}: dropout must be in [0, 1), got {values['dropout']}")
    if "num_heads" in values and values.get("num_hiddens", 0) % values["num_heads"]:
        raise UsageError(f"{where}: num_heads ({values['num_heads']}) must divide num_hiddens ({values['num_hiddens']}); "
                         f"try num_heads={_divisor_near(values['num_hiddens'], values['num_heads'])}")


def _divisor_near(n: int, k: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - k))


REGISTRY: dict[str, ModelEntry] = {}


def trainable() -> list[str]:
    """The registered models that `tk train` can train."""
    return [name for name, e in REGISTRY.items() if e.train is not None]


def register(entry: ModelEntry) -> ModelEntry:
    REGISTRY[entry.name] = entry
    return entry


def get(name: str) -> ModelEntry:
    if name not in REGISTRY:
        raise UsageError(f"unknown model '{name}'; choose one of: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


# ---- seq2seq models: an encoder graph and a one-step decoder graph (toolkit.core.graphs) -------

def transformer_graphs(cfg: TransformerConfig) -> list[GraphSpec]:
    return encoder_decoder_graphs(cfg.num_hiddens, cfg.decoder_layers, cfg.num_heads, cfg.vocab_size)


def marian_graphs(cfg: MarianSettings) -> list[GraphSpec]:
    return encoder_decoder_graphs(cfg.d_model, cfg.decoder_layers, cfg.decoder_attention_heads, cfg.decoder_vocab_size)


def hf_graphs(cfg) -> list[GraphSpec]:
    """An imported encoder-decoder's graphs in tk's cache layout (toolkit.core.architectures' "hf" entries)."""
    return encoder_decoder_graphs(cfg.d_model, cfg.decoder_layers, cfg.decoder_attention_heads, cfg.vocab_size)


def seq2seq_graphs(cfg: Seq2SeqConfig) -> list[GraphSpec]:
    memory = TensorSpec("memory", FLOAT, ("batch", "src_len", cfg.num_hiddens))
    state = TensorSpec("state", FLOAT, (cfg.num_layers, "batch", cfg.num_hiddens))
    encoder = GraphSpec("encoder", SRC, (memory, state))
    decoder = decoder_graph((state,), (memory,), cfg.vocab_size)
    return [encoder, decoder]


def transformer_attention(cfg: TransformerConfig) -> dict[str, tuple[TensorSpec, ...]]:
    """Encoder self-attention per layer over the source; per decoder step, each layer's self-attention
    over the target prefix (the cache plus the new position) and its cross-attention over the source."""
    h = cfg.num_heads
    encoder = tuple(TensorSpec(layer_key("encoder_attention", i), FLOAT, ("batch", h, "src_len", "src_len")) for i in range(cfg.num_layers))
    decoder = tuple(TensorSpec(layer_key(n, i), FLOAT, ("batch", h, k)) for i in range(cfg.decoder_layers)
                    for n, k in (("self_attention", "past_len+1"), ("cross_attention", "src_len")))
    return {"encoder": encoder, "decoder": decoder}


def read_transformer_attention(model: Transformer, graph: str, batch: int) -> list:
    if graph == "encoder":
        return list(model.encoder_attention_weights)
    return [att.attention.attention_weights.reshape(batch, model.cfg.num_heads, -1) for block in model.decoder_blocks
            for att in (block.self_attention, block.cross_attention)]


def seq2seq_attention(cfg: Seq2SeqConfig) -> dict[str, tuple[TensorSpec, ...]]:
    """Bahdanau attention of each decoder step over the source."""
    return {"encoder": (), "decoder": (TensorSpec("cross_attention", FLOAT, ("batch", "src_len")),)}


def read_seq2seq_attention(model: Seq2SeqAttention, graph: str, batch: int) -> list:
    return [] if graph == "encoder" else [model.decoder.attention.attention_weights.reshape(batch, -1)]


# The encoder-decoder Transformer (post-LN; --pre-ln for pre-LN).
register(ModelEntry("transformer", "seq2seq", TransformerConfig, Transformer, transformer_graphs, train="translation",
                    attention=transformer_attention, read_attention=read_transformer_attention))
# Hugging Face MarianMTModel (the OPUS-MT family), imported with `tk export hf:DIR` (toolkit.pytorch.hf_marian).
register(ModelEntry("marian", "seq2seq", MarianSettings, hf_build, marian_graphs))
# Hugging Face M2M100ForConditionalGeneration (M2M-100, NLLB-200), imported with `tk export hf:DIR` (toolkit.pytorch.hf_m2m100).
register(ModelEntry("m2m100", "seq2seq", hf_m2m100.M2M100Settings, hf_m2m100.build, hf_graphs))
# Hugging Face MBartForConditionalGeneration (mBART-cc25, mBART-50), imported with `tk export hf:DIR` (toolkit.pytorch.hf_mbart).
register(ModelEntry("mbart", "seq2seq", hf_mbart.MBartSettings, hf_mbart.build, hf_graphs))
# Hugging Face T5ForConditionalGeneration (T5, Flan-T5, mT5), imported with `tk export hf:DIR` (toolkit.pytorch.hf_t5): its
# own graph declaration, since T5's per-head size d_kv is not d_model / heads.
register(ModelEntry("t5", "seq2seq", hf_t5.T5Settings, hf_t5.build, hf_t5.graphs))
# Your own encoder-decoder, exported with `tk export MODULE:FUNCTION` (toolkit.pytorch.adapter): its graphs as it declared them.
register(ModelEntry("adapter", "seq2seq", AdapterSettings, adapter_build, lambda cfg: cfg.specs(), random_init=False))
# GRU encoder + Bahdanau-attention GRU decoder.
register(ModelEntry("seq2seq", "seq2seq", Seq2SeqConfig, Seq2SeqAttention, seq2seq_graphs, train="translation",
                    attention=seq2seq_attention, read_attention=read_seq2seq_attention))


# ---- standalone attention modules: one graph each --------------------------------------------

@dataclass
class AttentionConfig:
    query_size: int = 8
    key_size: int = 8
    value_size: int = 6
    num_hiddens: int = 16
    num_heads: int = 4


@dataclass
class KernelRegressionConfig:
    learn_width: bool = True


def _qkv(q: int, k: int, v: int) -> tuple[TensorSpec, ...]:
    return (TensorSpec("queries", FLOAT, ("batch", "n_q", q)), TensorSpec("keys", FLOAT, ("batch", "n_kv", k)),
            TensorSpec("values", FLOAT, ("batch", "n_kv", v)), TensorSpec("valid_lens", INT, ("batch", "n_q"), "lengths:n_kv"))


def _attention_outputs(v: int, weight_dims: tuple) -> tuple[TensorSpec, ...]:
    return (TensorSpec("output", FLOAT, ("batch", "n_q", v)), TensorSpec("attention_weights", FLOAT, weight_dims))


def _module_graph(inputs, outputs) -> list[GraphSpec]:
    return [GraphSpec("model", tuple(inputs), tuple(outputs))]


def _with_weights(model, *inputs):
    out = model(*inputs)
    return out, model.attention_weights


class _MaskedSoftmax(nn.Module):
    """masked_softmax has no parameters; a module gives it the same export path as the rest."""

    def forward(self, scores, valid_lens):
        return masked_softmax(scores, valid_lens)


register(ModelEntry(
    "masked_softmax", "module", AttentionConfig, lambda c: _MaskedSoftmax(),
    lambda c: _module_graph(
        (TensorSpec("scores", FLOAT, ("batch", "n_q", "n_kv")), TensorSpec("valid_lens", INT, ("batch", "n_q"), "lengths:n_kv")),
        (TensorSpec("weights", FLOAT, ("batch", "n_q", "n_kv")),)),
    run=lambda m, s, v: (m(s, v),)))

register(ModelEntry(
    "dot_attention", "module", AttentionConfig, lambda c: DotProductAttention(dropout=0.0),
    lambda c: _module_graph(_qkv(c.query_size, c.query_size, c.value_size),
                            _attention_outputs(c.value_size, ("batch", "n_q", "n_kv"))),
    run=_with_weights))

register(ModelEntry(
    "additive_attention", "module", AttentionConfig,
    lambda c: AdditiveAttention(c.query_size, c.key_size, c.num_hiddens, dropout=0.0),
    lambda c: _module_graph(_qkv(c.query_size, c.key_size, c.value_size),
                            _attention_outputs(c.value_size, ("batch", "n_q", "n_kv"))),
    run=_with_weights))


def _mha_run(model: MultiHeadAttention, q, k, v, valid_lens):
    out = model(q, k, v, valid_lens)
    w = model.attention.attention_weights
    return out, w.reshape(q.shape[0], model.num_heads, *w.shape[1:])


register(ModelEntry(
    "multihead_attention", "module", AttentionConfig,
    lambda c: MultiHeadAttention(c.num_hiddens, c.num_heads, dropout=0.0),
    lambda c: _module_graph(_qkv(c.num_hiddens, c.num_hiddens, c.num_hiddens),
                            _attention_outputs(c.num_hiddens, ("batch", c.num_heads, "n_q", "n_kv"))),
    run=_mha_run))

register(ModelEntry(
    "nw", "module", KernelRegressionConfig, lambda c: NWKernelRegression(c.learn_width),
    lambda c: _module_graph(
        (TensorSpec("queries", FLOAT, ("n_q",)), TensorSpec("keys", FLOAT, ("n_q", "n_kv")), TensorSpec("values", FLOAT, ("n_q", "n_kv"))),
        (TensorSpec("output", FLOAT, ("n_q",)), TensorSpec("attention_weights", FLOAT, ("n_q", "n_kv")))),
    run=_with_weights, train="regression"))


# ---- graph wrappers: the modules that torch.onnx.export traces ------------------------------
# Each takes `*inputs` in declared order, so one dynamic_shapes layout fits them all.

class EncoderGraph(nn.Module):
    """src, src_len -> the encoder outputs named in the declaration, in order."""

    def __init__(self, model: nn.Module, spec: GraphSpec):
        super().__init__()
        self.model, self.names = model, spec.output_names

    def forward(self, *inputs):
        out = self.model.encode(*inputs)
        return _distinct(tuple(out[n] for n in self.names), inputs)


class DecoderGraph(nn.Module):
    """token, *cache and context -> log_probs, *updated cache, as declared."""

    def __init__(self, model: nn.Module, spec: GraphSpec):
        super().__init__()
        self.model, self.state_names, self.updates = model, spec.input_names[1:], spec.updates

    def forward(self, *inputs):
        token, state = inputs[0], inputs[1:]
        log_probs, cache = self.model.decode_step(token, dict(zip(self.state_names, state)))
        return _distinct((log_probs, *(cache[src] for src in self.updates.values())), inputs)


def _distinct(outputs: tuple, inputs: tuple) -> tuple:
    """The outputs, each a value of its own: an input returned as it is (d2l's valid lengths passed through the
    encoder, a state a step leaves as it was) would make the exporter name the graph's input after the output."""
    return tuple(o.clone() if any(o is i for i in inputs) else o for o in outputs)


class ModuleGraph(nn.Module):
    def __init__(self, model: nn.Module, run: Callable[..., tuple]):
        super().__init__()
        self.model, self.run = model, run

    def forward(self, *inputs):
        return tuple(self.run(self.model, *inputs))


class AttentionGraph(nn.Module):
    """A graph's module with the attention weights of the same call appended to its outputs."""

    def __init__(self, entry: ModelEntry, model: nn.Module, spec: GraphSpec):
        super().__init__()
        self.inner, self.model, self.graph, self.read = graph_module(entry, model, spec), model, spec.name, entry.read_attention

    def forward(self, *inputs):
        return (*self.inner(*inputs), *self.read(self.model, self.graph, inputs[0].shape[0]))


def attention_module(entry: ModelEntry, model: nn.Module, spec: GraphSpec) -> nn.Module:
    """The PyTorch reference of the attention variant of `spec` (the base spec, without the extra outputs)."""
    return AttentionGraph(entry, model, spec)


def graph_module(entry: ModelEntry, model: nn.Module, spec: GraphSpec) -> nn.Module:
    """The nn.Module whose forward is exactly the graph `spec` declares."""
    if entry.kind == "module":
        return ModuleGraph(model, entry.run)
    return EncoderGraph(model, spec) if spec.name == "encoder" else DecoderGraph(model, spec)
