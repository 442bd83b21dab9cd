"""The torch side of every architecture: the ModelEntry its builder module declares (config class, build, graphs,
attention), found through the architecture's entry (toolkit.core.architectures), and the modules the exporter traces.

`tk train`, `tk export`, `tk verify` and `tk translate` all work from `get(name)`; no architecture is named here.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from toolkit.core import architectures
from toolkit.core.architectures import SIZES
from toolkit.core.errors import UsageError
from toolkit.core.graphs import GraphSpec, TensorSpec
from toolkit.core.manifest import size_problem


@dataclass
class ModelEntry:
    name: str
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
    # Training settings per `tk train --preset` (over train.PRESETS' sizes), and the presets that are its recipe alone.
    presets: dict[str, dict] = field(default_factory=dict)
    recipes: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        """Its graphs' layout, as its architecture's entry declares it."""
        return architectures.get(self.name).kind

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
    (architectures.SIZES); checked before any work starts and before anything is allocated (`--set num_layers=1e20`
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


def get(name: str) -> ModelEntry:
    """The ModelEntry of architecture `name`, from the builder module its entry names (MODEL, or MODELS by name)."""
    if name not in architectures.ARCHITECTURES:
        raise UsageError(f"unknown model '{name}'; choose one of: {', '.join(sorted(architectures.ARCHITECTURES))}")
    module = importlib.import_module(architectures.ARCHITECTURES[name].builder)
    return getattr(module, "MODELS", {}).get(name) or module.MODEL


def entries() -> list[ModelEntry]:
    """Every architecture's ModelEntry (imports every builder)."""
    return [get(name) for name in architectures.ARCHITECTURES]


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
    """A graph's module with the attention weights of the same call appended to its outputs: the PyTorch reference of
    the attention variant of `spec` (the base spec, without the extra outputs)."""

    def __init__(self, entry: ModelEntry, model: nn.Module, spec: GraphSpec):
        super().__init__()
        self.inner, self.model, self.graph, self.read = graph_module(entry, model, spec), model, spec.name, entry.read_attention

    def forward(self, *inputs):
        return (*self.inner(*inputs), *self.read(self.model, self.graph, inputs[0].shape[0]))


def graph_module(entry: ModelEntry, model: nn.Module, spec: GraphSpec) -> nn.Module:
    """The nn.Module whose forward is exactly the graph `spec` declares."""
    if entry.kind == architectures.MODULE:
        return ModuleGraph(model, entry.run)
    return EncoderGraph(model, spec) if spec.name == "encoder" else DecoderGraph(model, spec)


def token_bound(cfg: object) -> int:
    """The ids every graph of a model of this config embeds: below the smaller vocabulary where the source and the
    target have their own (random inputs at export and verify stay below it)."""
    return min(getattr(cfg, "vocab_size", 2), getattr(cfg, "decoder_vocab_size", 1 << 30))
