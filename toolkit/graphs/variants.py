"""The catalogue's variants (toolkit.core.variants declares them) built from an fp32 graph with onnx and ONNX Runtime.

A variant is a pure function of the fp32 graph and the installed ONNX Runtime, so it can
be stored beside the graphs (`tk export DIR --quantize int8`) or built in memory when a
directory does not store it: the shipped models carry fp32 graphs only (size budget),
and `--variant int8` still works on them, the way CTranslate2 quantises at load time.

Torch-free: the deploy path builds variants with onnx and onnxruntime alone (imported
only when a variant is built, so fp32 start-up does not pay for them).
"""

from __future__ import annotations

import functools
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from toolkit.core import architectures
from toolkit.core.errors import ToolkitError, first_line
from toolkit.core.manifest import Manifest
from toolkit.core.variants import PLAIN, export_flag, get
from toolkit.graphs import graph_files, int8_tables
from toolkit.graphs.optimize import save_optimized


def _fp16(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save_model(convert_float_to_float16(onnx.load(src), keep_io_types=True, disable_shape_infer=False), dst)


def _fused(src: Path, dst: Path) -> Path:
    """The graph with its attention fused (attention_fusion.py), beside `dst`; the caller removes it (graph_files.remove)."""
    from toolkit.graphs.attention_fusion import fuse

    fused = dst.with_name(dst.name + ".fused.onnx")
    fuse(src, fused)
    return fused


def _fused_and_optimized(src: Path, dst: Path, level: str, weights_beside: bool = False) -> None:
    """The graph with its attention fused, then ONNX Runtime's `level` optimisations applied, written to `dst`
    (self-contained, or with its weights in DST.data: an intermediate graph of any size)."""
    fused = _fused(src, dst)
    try:
        # ONNX Runtime writes every weight it did not change as a reference into the fused graph's own weights file,
        # which goes with it below: all of them are written beside dst, then read into it where one file is wanted.
        save_optimized(fused, dst, level, graph_files.beside(dst).name)
    finally:
        graph_files.remove(fused)
    if not weights_beside:
        graph_files.inline(dst)


def int8_graph(src: Path, dst: Path, keep_fp32: Sequence[str] = (), only: Sequence[str] | None = None,
               folded: Path | None = None) -> None:
    """The int8 variant of the fp32 graph `src`, with the MatMuls named in `keep_fp32` left in float (or, with
    `only`, just those quantised). Names are those of int8_layers(); `folded`: a graph made by fold_for_int8 once,
    reused when many variants of one graph are built."""
    import logging  # here, not at the top: fp32 start-up does not pay for it

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The exported graphs multiply by Transpose(W) so that W is stored once, under its PyTorch
    # name; quantize_dynamic only quantises a MatMul whose weight is an initializer, so the
    # transposes are constant-folded first (ONNX Runtime basic level: standard ops only). Attention
    # and same-input projections are fused before that: with one weight scale per output column the
    # merged Q/K/V multiply computes exactly what the three did, its input quantised once instead of
    # three times (greedy at batch 1: 226 -> 258 sentences/s, identical output).
    given = folded is not None
    folded = folded or fold_for_int8(src, dst.with_name(dst.name + ".folded.onnx"))
    keep_fp32 = [*keep_fp32, *float_lookups(folded)]
    root, level = logging.getLogger(), logging.getLogger().level
    root.setLevel(logging.ERROR)  # its "consider pre-processing" advice is about static quantisation
    try:
        # 7-bit weights (reduce_range): x86 CPUs without VNNI multiply u8 x s8 pairs into 16-bit
        # sums that saturate at full range (the cross keys came out wrong by more than 0.5 on an
        # AVX2-only EPYC); one graph that is exact on every CPU rather than one per CPU.
        # onnx's shape inference types no com.microsoft output (the fused attention); everything here is float.
        # Per-channel weight scales (one per output column): with one scale per tensor, `tk verify
        # --variant int8` failed on this AVX2 machine (log-probabilities off by 1.39 at batch 64, against
        # 0.5) and 7% of greedy translations differed from fp32's; per channel, the error is 0.57, 1.6%
        # differ, and speed is within noise at batch 1 (0.85 to 0.96x at batch 64).
        quantize_dynamic(folded, dst, weight_type=QuantType.QInt8, reduce_range=True, per_channel=True,
                         nodes_to_exclude=list(keep_fp32), nodes_to_quantize=list(only) if only is not None else None,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        # One int8 copy of a table both looked up and multiplied by (int8_tables: 262 MB less at NLLB's size).
        int8_tables.share_in_file(dst, int8_tables.tied_tables(folded))
    finally:
        root.setLevel(level)
        if not given:
            graph_files.remove(folded)


def float_lookups(graph: Path) -> list[str]:
    """Gather nodes left in float: lookups in a position table (their indices come from a Range). The quantiser's
    per-channel scales run along the table's rows, which a lookup of a few positions no longer has, and a table of
    fixed sinusoids gains nothing from 8 bits."""
    import onnx

    model = onnx.load(graph, load_external_data=False)
    producer = {o: n for n in model.graph.node for o in n.output}

    def from_range(name: str, hops: int = 4) -> bool:
        node = producer.get(name)
        if node is None or hops == 0:
            return False
        if node.op_type == "Range":
            return True
        passes = ("Unsqueeze", "Reshape", "Cast", "Add", "Expand", "Identity", "Squeeze")
        return node.op_type in passes and any(from_range(i, hops - 1) for i in node.input if i)

    return [n.name for n in model.graph.node
            if n.op_type == "Gather" and len(n.input) > 1 and from_range(n.input[1])]


def fold_for_int8(src: Path, folded: Path) -> Path:
    """The graph the quantiser reads: attention fused, transposed weights constant-folded (see int8_graph), its
    weights beside it (graph_files: the caller removes both)."""
    import onnx

    _fused_and_optimized(src, folded, "basic", weights_beside=True)
    # The folded graph keeps shape annotations the folding made stale (the GRU decoder's output
    # projection), which the quantiser's own shape inference rejects; they are only hints.
    model = onnx.load(folded)
    del model.graph.value_info[:]
    untie_lookups(model)
    graph_files.save_beside(model, folded)
    return folded


def untie_lookups(model) -> None:
    """A table that a Gather looks up and a Gemm or MatMul multiplies by (an embedding tied to the output layer, as
    Marian's) gets a copy of its own for the Gather: the quantiser transposes a Gemm's weight in place, and the lookup
    sharing it then read columns for rows (an imported Marian's int8 decoder failed to load). tk's own Transformer
    multiplies by a folded transpose, a table of its own already."""
    import onnx

    multiplied = {n.input[1] for n in model.graph.node if n.op_type in ("Gemm", "MatMul") and len(n.input) > 1}
    tables = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and node.input[0] in multiplied and node.input[0] in tables:
            copy = onnx.TensorProto()
            copy.CopyFrom(tables[node.input[0]])
            copy.name = f"{node.input[0]}.lookup"
            if copy.name not in tables:
                model.graph.initializer.append(copy)
                tables[copy.name] = copy
            node.input[0] = copy.name


def float_layers(graph: Path) -> list[tuple[str, str]]:
    """(node, its weight's name) for each node of a graph that multiplies by a float weight (MatMul) or looks one
    up (Gather: an embedding table): what dynamic quantisation may make int8."""
    import onnx

    model = onnx.load(graph)
    # A table has rows: a Gather of a vector is no layer (the per-row scales of a tied int8 table, int8_tables).
    weights = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT and len(i.dims) >= 2}
    return [(n.name, n.input[slot]) for n in model.graph.node for op, slot in (("MatMul", 1), ("Gather", 0))
            if n.op_type == op and n.input[slot] in weights]


def int8_layers(folded: Path) -> list[tuple[str, str]]:
    """The layers of a folded graph (fold_for_int8) that the int8 variant makes int8, named as int8_graph's
    keep_fp32 and only take them: the quantiser first optimises the graph itself, which can fold a weight in
    or rename a node ("node_matmul/MatMulAddFusion_MatMul"), so they are read from its own output."""
    with tempfile.TemporaryDirectory(prefix="tk-int8-") as tmp:
        untouched, plain = Path(tmp) / "none.onnx", Path(tmp) / "int8.onnx"
        int8_graph(folded, untouched, only=["tk: no layer"], folded=folded)
        int8_graph(folded, plain, folded=folded)
        left = {n for n, _ in float_layers(plain)}
        return [(n, w) for n, w in float_layers(untouched) if n not in left]


# fp32 graph -> the variant's graph, for each variant the catalogue builds (core.variants.BUILT: all but the exported fp32).
BUILDERS: dict[str, Callable[[Path, Path], None]] = {
    "fp16": _fp16, "optimized": lambda src, dst: _fused_and_optimized(src, dst, "extended"), "int8": int8_graph}


def build(src: Path, dst: Path, variant: str) -> None:
    """Writes `variant` of the fp32 graph `src` to `dst` (self-contained: no external weights)."""
    get(variant)
    if variant not in BUILDERS:
        raise ValueError(f"the {variant} graphs are the exported ones; nothing to build")
    BUILDERS[variant](src, dst)


@functools.lru_cache(maxsize=8)
def _built(src: str, digest: str, variant: str) -> bytes:
    # Keyed by the fp32 graph's sha256 as well as its path, so a re-exported graph is rebuilt.
    import onnx

    with tempfile.TemporaryDirectory(prefix="tk-variant-") as tmp:
        # A self-contained copy first: the graph's external weights file lives beside the
        # original, and the model directory itself may be read-only (an installed package).
        whole, dst = Path(tmp) / "graph.onnx", Path(tmp) / f"graph.{variant}.onnx"
        onnx.save_model(onnx.load(src), whole)
        build(whole, dst, variant)
        return dst.read_bytes()


# One protobuf message holds at most 2 GB: a graph whose weights come near that (an NLLB-1.3B decoder holds 3.5 GB) is
# built in a temporary directory, its weights beside it, instead of in memory.
IN_MEMORY_BYTES = 1_500_000_000
# The builders that write a graph of any size with its weights beside it.
ON_DISK: dict[str, Callable[[Path, Path], None]] = {
    "optimized": lambda src, dst: _fused_and_optimized(src, dst, "extended", weights_beside=True),
    "int8": int8_graph,
}


def weight_bytes(graph: Path) -> int:
    """The bytes of a graph's weights, read from its structure alone (external tensors by their recorded length)."""
    import onnx

    total = 0
    for tensor in onnx.load(graph, load_external_data=False).graph.initializer:
        length = next((e.value for e in tensor.external_data if e.key == "length"), None)
        total += int(length) if length is not None and length.isdigit() else len(tensor.raw_data)
    return total


_on_disk: dict[tuple[str, str, str], Path] = {}
_on_disk_lock = threading.Lock()


def _built_on_disk(src: Path, digest: str, variant: str) -> Path:
    """The variant of the fp32 graph `src` written to a temporary directory of this process (removed at its exit), its
    weights beside it; built once per process, as _built's copies are."""
    import atexit
    import shutil

    with _on_disk_lock:
        key = (str(src), digest, variant)
        if key not in _on_disk:
            tmp = Path(tempfile.mkdtemp(prefix="tk-variant-"))
            atexit.register(shutil.rmtree, tmp, True)
            dst = tmp / f"graph.{variant}.onnx"
            ON_DISK[variant](src, dst)
            _on_disk[key] = dst
        return _on_disk[key]


def graph_source(m: Manifest, graph: str, variant: str) -> tuple[Path | bytes, float]:
    """The variant's graph as stored in the directory (a path), else built in memory (bytes), or in a temporary
    directory (a path) for a graph too large for one protobuf message; with the seconds spent building it (0 when
    stored)."""
    architectures.check_variant(m.model, variant)
    if variant == PLAIN or variant in m.stored:
        return m.graph_path(graph, variant), 0.0
    get(variant)
    start = time.perf_counter()
    large = False
    try:
        src = m.graph_path(graph)
        large = variant in ON_DISK and weight_bytes(src) > IN_MEMORY_BYTES
        if large:
            data: Path | bytes = _built_on_disk(src, m.graphs[graph].sha256, variant)
        else:
            data = _built(str(src), m.graphs[graph].sha256, variant)
    except Exception as e:
        # A large graph's optimized variant cannot be stored (one file each): only the exported graphs are left to name.
        fix = "" if large and variant == "optimized" else f", or store it with `tk export {m.directory} {export_flag(variant)}`"
        raise ToolkitError(f"could not build the {variant} variant of {m.directory}/{graph}: {first_line(e)}; "
                           f"use --variant fp32{fix}") from None
    return data, time.perf_counter() - start


@functools.lru_cache(maxsize=1)
def builder_digest() -> str:
    """A checksum of the code that builds variants (this module, ONNX Runtime's offline optimiser, the attention fusion
    and the graph rewrites beside it), so that a cached copy of a built variant is trusted only while that code is
    unchanged. CRC-32 and the sizes, not sha256: it tells edits apart and guards against no adversary, and hashlib's
    OpenSSL took 2.5 ms of every `tk translate` start, where zlib is loaded already."""
    import zlib

    parts = []
    # Read, not imported: onnx loads slowly.
    for name in ("variants.py", "optimize.py", "attention_fusion.py", "graph_files.py", "int8_tables.py", "zero_bias.py"):
        data = Path(__file__).with_name(name).read_bytes()
        parts.append(f"{zlib.crc32(data):08x}{len(data):x}")
    return "-".join(parts)
