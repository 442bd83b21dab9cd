"""Declarations of exported graphs: names, dtypes and named dimensions of every input and output.

This module imports neither torch nor onnxruntime. The registry builds these
declarations once per model; export writes them into manifest.json; verify and
translate read them back from there. Nothing else describes a graph's interface.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property

import numpy as np

from toolkit.core.declaration import layer_key

Dim = str | int  # a named (dynamic) axis, or a fixed size such as a head count


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output.

    fill says how to generate a valid example value: "normal" floats, "tokens"
    ids below the vocabulary size, "lengths:<dim>" lengths in 1..size of <dim>,
    or "empty" for a cache that starts with zero positions.
    """

    name: str
    dtype: str  # "float32" or "int64"
    dims: tuple[Dim, ...]
    fill: str = "normal"

    def shape(self, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else eval_dim(d, sizes) for d in self.dims)


def eval_dim(dim: str, sizes: dict[str, int]) -> int:
    """Size of a named dim; "past_len+1" style names add a constant to a named size."""
    base, _, plus = dim.partition("+")
    if base not in sizes:  # a name the manifest's schema let through that the model has no size for (once: "", a KeyError)
        from toolkit.core.errors import UsageError

        raise UsageError(f"manifest.json declares an axis {dim!r} that is none of the model's ({', '.join(sorted(sizes))}); "
                         "re-export the model directory")
    return sizes[base] + (int(plus) if plus else 0)


@dataclass(frozen=True)
class GraphSpec:
    """One ONNX graph: its file stem and its inputs and outputs in order."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # Output name -> the input it replaces on the next decoding step (the cache).
    updates: dict[str, str] = field(default_factory=dict)

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def next_state(self, state: dict, outputs: dict) -> dict:
        """The next step's state: this step's inputs with each cache input replaced by the output that updates it."""
        return {**state, **{inp: outputs[out] for out, inp in self.updates.items()}}

    @cached_property  # read at every beam step
    def constant_inputs(self) -> frozenset[str]:
        """Of a decoder's state (its inputs after the step's token), what no output replaces: the same on
        every step (the encoder's outputs, the source lengths)."""
        return frozenset(self.input_names[1:]) - set(self.updates.values())

    def symbolic_dims(self) -> set[str]:
        return {d for t in self.inputs + self.outputs for d in t.dims if isinstance(d, str)}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GraphSpec:
        tensors = lambda items: tuple(TensorSpec(t["name"], t["dtype"], tuple(t["dims"]), t["fill"]) for t in items)  # noqa: E731
        return cls(d["name"], tensors(d["inputs"]), tensors(d["outputs"]), dict(d.get("updates", {})))


def with_outputs(spec: GraphSpec, extra: tuple[TensorSpec, ...]) -> GraphSpec:
    """The same graph with more outputs after the declared ones (the attention variant)."""
    return GraphSpec(spec.name, spec.inputs, (*spec.outputs, *extra), dict(spec.updates))


def make_inputs(spec: GraphSpec, sizes: dict[str, int], rng: np.random.Generator, vocab_size: int = 2) -> dict[str, np.ndarray]:
    """Random inputs that are valid for the graph at the given dim sizes.

    Lengths are drawn in 1..n per row, with the first row at full length, so a
    sweep always covers both the unpadded and the ragged case.
    """
    feeds = {}
    for t in spec.inputs:
        shape = t.shape(sizes)
        if t.fill == "tokens" or (t.fill == "empty" and t.dtype == "int64"):  # an integer cache holds token ids
            feeds[t.name] = rng.integers(4 if vocab_size > 4 else 0, vocab_size, size=shape, dtype=np.int64)
        elif t.fill.startswith("lengths:"):
            n = sizes[t.fill.split(":", 1)[1]]
            lens = rng.integers(1, n + 1, size=shape, dtype=np.int64)
            lens.reshape(-1)[: max(1, lens.size // max(shape[0], 1))] = n
            feeds[t.name] = lens
        else:
            feeds[t.name] = rng.standard_normal(shape).astype(t.dtype)
    return feeds


NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64}


# ---- translation models: an encoder graph and a one-step decoder graph ------------------------------------------
# Declared here, torch-free, for every model that translates: tk's (toolkit.pytorch.registry), an imported Marian's
# and an adapter's (toolkit.pytorch.hf_marian, toolkit.pytorch.adapter).

FLOAT, INT = "float32", "int64"

SRC = (TensorSpec("src", INT, ("batch", "src_len"), "tokens"), TensorSpec("src_len", INT, ("batch",), "lengths:src_len"))


def decoder_graph(cache: tuple[TensorSpec, ...], context: tuple[TensorSpec, ...], vocab: int) -> GraphSpec:
    """token + cache + encoder context -> log_probs + the cache one step on."""
    grown = tuple(TensorSpec(f"new_{t.name}", t.dtype, tuple("past_len+1" if d == "past_len" else d for d in t.dims)) for t in cache)
    return GraphSpec(
        "decoder",
        inputs=(TensorSpec("token", INT, ("batch",), "tokens"), *cache, *context, SRC[1]),
        outputs=(TensorSpec("log_probs", FLOAT, ("batch", vocab)), *grown),
        updates={f"new_{t.name}": t.name for t in cache},
    )


def encoder_decoder_graphs(d_model: int, decoder_layers: int, heads: int, vocab: int) -> list[GraphSpec]:
    """Any attention encoder-decoder in tk's cache layout: the encoder graph computes the memory and every decoder
    layer's cross-attention keys/values once; the decoder graph takes one token and a self-attention key and value
    tensor per layer (batch, heads, past_len, d_head), and returns them one position longer."""
    layers, dh = range(decoder_layers), d_model // heads
    cross = tuple(TensorSpec(layer_key(n, i), FLOAT, ("batch", heads, "src_len", dh)) for i in layers for n in ("cross_k", "cross_v"))
    past = tuple(TensorSpec(layer_key(n, i), FLOAT, ("batch", heads, "past_len", dh), "empty") for i in layers for n in ("self_k", "self_v"))
    encoder = GraphSpec("encoder", SRC, (TensorSpec("memory", FLOAT, ("batch", "src_len", d_model)), *cross))
    return [encoder, decoder_graph(past, cross, vocab)]
