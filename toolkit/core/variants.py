"""Precision and optimisation variants of an exported graph, declared once: every command, check and choice list
reads this catalogue. Each is built from the fp32 graph alone, with ONNX Runtime
(toolkit.graphs.variants builds them; stored beside the graphs or built in memory at load).

No runtime is imported here: `tk --help` and the choice lists read the catalogue at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolkit.core.errors import UsageError


@dataclass(frozen=True)
class Variant:
    """One precision/optimisation variant, declared once: every command, check and choice list reads it."""

    name: str
    suffix: str  # of its graph files: encoder{suffix}.onnx
    provider: str | None  # the provider it is meant for; None: every provider
    tolerance: tuple[float, float]  # verify's default (atol, rtol), measured on the shipped models (see README)
    exact_translation: bool  # verify demands token-for-token the fp32 translations
    export_option: tuple[str, object] | None  # (ExportOptions field, value) that stores it; None: always written
    export_flag: str  # the `tk export` option that stores it
    note: str

    def record(self) -> dict:
        """What manifest.json says about a stored copy of this variant."""
        return {"provider": self.provider, "note": self.note}


# The catalogue. fp16/int8 change the model enough that near-ties may flip, so their translations
# may differ from fp32's; the offline-optimised graph computes the same function.
CATALOGUE: dict[str, Variant] = {v.name: v for v in (
    Variant("fp32", "", None, (1e-4, 1e-4), True, None, "", "the exported float32 graphs"),
    Variant("fp16", ".fp16", "cuda", (5e-2, 2e-2), False, ("fp16", True), "--fp16",
            "float16 weights and compute; inputs and outputs stay int64/float32"),
    Variant("optimized", ".opt", "cpu", (1e-4, 1e-4), True, ("optimize", True), "--optimize",
            "attention fused (com.microsoft.MultiHeadAttention), same-input projections merged, then ONNX Runtime "
            "extended graph optimisations applied offline for the CPU provider"),
    Variant("int8", ".int8", "cpu", (0.5, 0.1), False, ("quantize", "int8"), "--quantize int8",
            "attention fused (com.microsoft.MultiHeadAttention), same-input projections merged, then dynamic int8 quantisation of MatMul weights "
            "(per channel) for the CPU provider"),
)}
NAMES: tuple[str, ...] = tuple(CATALOGUE)
PLAIN = "fp32"  # the exported graphs every other variant is built from
# Built from the fp32 graphs (by toolkit.graphs.variants), stored or in memory.
BUILT: tuple[str, ...] = tuple(n for n in CATALOGUE if n != PLAIN)
# The variant that trades exactness for speed on each provider (`tk bench` times it by default).
SPEED = {"cpu": "int8", "cuda": "fp16"}
# The fastest graphs of fp32 precision on each provider (the ones to hold against other engines' float32).
FAST_PLAIN = {"cpu": "optimized", "cuda": PLAIN}


@dataclass
class ExportOptions:

    out: Path
    checkpoint: str | None = None
    model: str | None = None  # with random_init: a registry name
    random_init: bool = False
    seed: int = 0
    opset: int = 18
    fp16: bool = False
    optimize: bool = False
    quantize: str | None = None  # a quantised variant's name
    attention: bool = False  # on an exported directory: record the attention variant's declaration
    force: bool = False
    command: str = ""
    languages: tuple[str, str] | None = None  # --source-lang/--target-lang: checked against an import before it exports


def wanted_variants(opts: ExportOptions) -> list[str]:
    """The variants whose export option (declared in the catalogue) is set."""
    return [v for v in BUILT if getattr(opts, CATALOGUE[v].export_option[0]) == CATALOGUE[v].export_option[1]]


def get(name: str) -> Variant:
    """The catalogue entry; an unknown name is a usage error listing the known ones."""
    try:
        return CATALOGUE[name]
    except KeyError:
        raise UsageError(f"unknown variant {name!r}; choose one of {', '.join(NAMES)}") from None


def export_flag(variant: str) -> str:
    """The `tk export` option that stores this variant in a directory."""
    return get(variant).export_flag


def describe(source: Path | bytes) -> str:
    """How error messages name a graph: its file, or that it was built in memory."""
    return "in-memory graph" if isinstance(source, bytes) else f"ONNX graph {source}"


def load_proto(source: Path | bytes):
    """The graph (an onnx.ModelProto) without its external weights: enough to read its interface."""
    import onnx

    if isinstance(source, bytes):
        return onnx.load_model_from_string(source)
    return onnx.load(source, load_external_data=False)
