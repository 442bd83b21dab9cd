"""`tk verify --localize`: where two executions of one graph part. For one failing case (a sweep input or a
decode step, with its cache), every intermediate tensor of the exported graph is exposed and run on the
failing side, PyTorch's own value of each operation is captured by re-tracing the model as the exporter
did (torch.export, the exporter's decompositions: the ONNX value names are the traced operations' names),
and both are compared in topological order. The first tensor outside its tolerance is the first divergent
node: every tensor computed before it agreed, so the fault is in the nodes that made it.

Tolerances scale with the variant (its catalogue tolerance) and with each tensor's magnitude, so a clean
fp16 or int8 graph reports no divergent node while a wrong axis, operator or constant does.
"""

from __future__ import annotations

import io
import logging
import re
import warnings
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch

from toolkit.core.manifest import Manifest
from toolkit.core.node_map import node_origins
from toolkit.graphs.variants import graph_source
from toolkit.pytorch import registry


@dataclass
class TensorDiff:
    """One intermediate tensor compared: the node that made it, where it came from in the model, its error."""

    value: str
    node: str
    op: str
    module: str  # PyTorch module path, e.g. decoder_blocks.1.attention2
    source: str  # file:line in the model code
    max_abs: float
    max_rel: float
    outside: float  # fraction of elements outside the tolerance
    ok: bool


@dataclass
class Localization:
    graph: str
    variant: str
    provider: str
    case: str
    against: str = "pytorch"  # the other side: PyTorch, or runtime/provider/variant
    compared: int = 0
    first: TensorDiff | None = None
    downstream_failed: int = 0  # tensors after the first divergent one that also fail
    path: list[str] = field(default_factory=list)  # the nodes between the last agreeing tensors and the first divergent one
    table: list[TensorDiff] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def tensor_tolerance(variant_tol: tuple[float, float], ref: np.ndarray) -> tuple[float, float]:
    """(atol, rtol) for one intermediate tensor: the variant's, the absolute part scaled by the tensor's typical
    magnitude (hidden states grow to tens; their rounding error grows with them)."""
    atol, rtol = variant_tol
    typical = ref[np.abs(ref) < SENTINEL]  # a mask's fill value (-1e6) says nothing of the scale of the rest
    scale = float(np.sqrt(np.mean(np.square(typical, dtype=np.float64)))) if typical.size else 1.0
    return atol * max(1.0, scale), rtol


SENTINEL = 1e4
FP16_MAX = 65504.0


def _comparable(ref: np.ndarray, got: np.ndarray, variant: str) -> tuple[np.ndarray, np.ndarray]:
    """float32 copies to compare. A value beyond float16's range becomes ±inf or the largest float16 (the
    fp16 graphs clamp a mask's fill value): where PyTorch's value is that far out and float16 holds such an
    extreme of the same sign, the two agree; an overflow that
    matters shows where the infinities meet (inf - inf, inf * 0) and become wrong values or NaN."""
    ref, got = ref.astype(np.float32), got.astype(np.float32)
    if variant == "fp16":
        same = (np.abs(ref) > FP16_MAX) & (np.abs(got) >= SENTINEL) & (np.sign(ref) == np.sign(got))
        ref, got = np.where(same, 0, ref), np.where(same, 0, got)
    return ref, got


def expose(model: onnx.ModelProto) -> tuple[bytes, list[tuple[str, onnx.NodeProto]]]:
    """The graph with every node output also a graph output, and (value, producing node) in topological order."""
    graph = model.graph
    have = {o.name for o in graph.output}
    produced = [(o, n) for n in graph.node for o in n.output if o]
    for value, _ in produced:
        if value not in have:
            graph.output.append(onnx.ValueInfoProto(name=value))
    return model.SerializeToString(), produced


def onnx_values(source: Path | bytes, provider: str, runtime: str, feeds: dict[str, np.ndarray]) -> tuple[dict, list]:
    """Every intermediate value of the graph run on `provider` of `runtime`, and the (value, node) order."""
    model = onnx.load_from_string(source) if isinstance(source, bytes) else onnx.load(str(source), load_external_data=True)
    exposed, produced = expose(model)
    from toolkit.core.errors import UsageError
    from toolkit.runtimes import get

    run_graph = get(runtime).graph_outputs
    if run_graph is None:
        raise UsageError(f"--runtime {runtime} runs no ONNX graphs, so no node of them can be localized; drop --localize")
    return run_graph(exposed, provider, feeds), produced


# Traced programs by (model, config, weights digest, graph): tracing takes seconds, running one takes milliseconds.
_TRACED: dict[tuple, torch.fx.GraphModule] = {}


def traced_program(module: torch.nn.Module, spec, max_len: int, vocab: int, key: tuple | None) -> torch.fx.GraphModule:
    """The graph as the exporter traced it, from the exporter's example inputs (a size of 1 would be traced as a
    constant): torch.export, then the exporter's own decompositions (they decide the operations, and so the
    value names the ONNX graph carries)."""
    from torch.onnx._internal.exporter import _core, _registration

    from toolkit.core.graphs import make_inputs
    from toolkit.pytorch.export import EXAMPLE_SIZES, dynamic_shapes

    if key is not None and key in _TRACED:
        return _TRACED[key]
    example = make_inputs(spec, EXAMPLE_SIZES, np.random.default_rng(0), vocab)
    args = tuple(torch.from_numpy(example[n]) for n in spec.input_names)
    with warnings.catch_warnings(), redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        logging.getLogger("torch").setLevel(logging.ERROR)
        program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes(spec, max_len), strict=False,
                                      prefer_deferred_runtime_asserts_over_guards=True)
        program = _core._prepare_exported_program_for_export(program, registry=_registration.ONNXRegistry.from_torchlib())
    traced = program.module()
    if key is not None:
        _TRACED[key] = traced
    return traced


def traced_values(module: torch.nn.Module, spec, feeds: dict[str, np.ndarray], max_len: int, vocab: int,
                  key: tuple | None = None) -> tuple[dict, dict]:
    """PyTorch's value of every operation, named as the exporter names them, and each one's (module, source).
    `key`: what identifies the model's computation (a traced program is reused for the same key)."""
    args = tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in spec.input_names)
    traced = traced_program(module, spec, max_len, vocab, key)
    values: dict[str, np.ndarray] = {}
    where: dict[str, tuple[str, str]] = {}

    class Capture(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if isinstance(out, torch.Tensor):
                values[n.name] = out.detach().numpy()
                where[n.name] = _origin(n)
            return out

    with torch.no_grad():
        Capture(traced).run(*args)
    return values, where


def _origin(node) -> tuple[str, str]:
    """(module path, file:line in the model code) of a traced operation."""
    stack = node.meta.get("nn_module_stack") or {}
    module = ""
    if stack:
        path = list(stack.values())[-1][0]
        module = re.sub(r"^L__self__\.?|^L\['self'\]\.?", "", path).replace("._modules['", ".").replace("']", "")
        module = re.sub(r"^model\.", "", module)
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
    mine = [(f, line) for f, line in frames if "/models/" in f or "/toolkit/" in f]
    source = ""
    if mine:
        f, line = mine[-1]
        source = f"{f[f.rfind('/models/') + 1:] if '/models/' in f else f[f.rfind('/toolkit/') + 1:]}:{line}"
    return module, source


@dataclass(frozen=True)
class Side:
    """An execution of an exported graph to compare against instead of PyTorch: runtime, provider, variant."""

    runtime: str
    provider: str
    variant: str

    @classmethod
    def parse(cls, text: str) -> Side:
        """"onnxruntime/cpu/fp32", "openvino/cpu/int8", or a variant alone ("fp32": ONNX Runtime on CPU)."""
        from toolkit.core.engines import PROVIDERS
        from toolkit.core.errors import UsageError
        from toolkit.core.variants import NAMES
        from toolkit.runtimes import DEFAULT_RUNTIME, names

        known = names()

        parts = text.split("/")
        if len(parts) == 1:
            parts = [DEFAULT_RUNTIME, "cpu", *parts]
        if len(parts) != 3 or parts[0] not in known or parts[1] not in PROVIDERS or parts[2] not in NAMES:
            raise UsageError(f"--localize-against {text!r}: give RUNTIME/PROVIDER/VARIANT ({'|'.join(known)} / {'|'.join(PROVIDERS)} / "
                             f"{'|'.join(NAMES)}), e.g. onnxruntime/cpu/fp32, or a variant alone")
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.runtime}/{self.provider}/{self.variant}"


def localize(m: Manifest, entry, model, cfg, graph: str, variant: str, provider: str, runtime: str, case: str,
             feeds: dict[str, np.ndarray], variant_tol: tuple[float, float], against: Side | None = None) -> Localization:
    """The first node of `graph` whose output leaves its tolerance against PyTorch on these inputs, or against
    another execution of the graphs (`against`: another provider, runtime or variant; values compared by name,
    so a variant whose fusions removed a tensor is compared on the tensors both still have)."""
    from toolkit.verify.compare import compare

    spec = m.specs()[graph]
    got, produced = onnx_values(graph_source(m, graph, variant)[0], provider, runtime, feeds)
    if against is None:
        digest = m.checkpoint.weights_sha256 if m.checkpoint else ""
        key = (entry.name, repr(cfg), digest, graph) if digest else None
        ref, where = traced_values(registry.graph_module(entry, model, spec), spec, feeds, getattr(cfg, "max_len", 64),
                                   registry.token_bound(cfg), key)
    else:
        from toolkit.core.variants import get

        ref, _ = onnx_values(graph_source(m, graph, against.variant)[0], against.provider, against.runtime, feeds)
        ref = {k: np.asarray(v) for k, v in ref.items()}
        where = {}
        theirs = get(against.variant).tolerance
        variant_tol = (max(variant_tol[0], theirs[0]), max(variant_tol[1], theirs[1]))
    loc = Localization(graph, variant, provider, case, against=str(against) if against else "pytorch")
    producer = {value: node for value, node in produced}
    origins = node_origins(m, graph)
    for value, node in produced:
        if value not in ref or value not in got or np.shape(ref[value]) != np.shape(got[value]):
            continue
        r, g = ref[value], np.asarray(got[value])
        if r.dtype == np.bool_ or np.issubdtype(r.dtype, np.integer):
            stats = {"ok": bool(np.array_equal(r, g)), "max_abs": float(np.abs(r.astype(np.int64) - g.astype(np.int64)).max(initial=0)),
                     "max_rel": 0.0, "outside": float(np.mean(r != g)) if r.size else 0.0}
        else:
            r, g = _comparable(r, g, variant)
            stats = compare(r, g, *tensor_tolerance(variant_tol, r))
        module, source = where.get(value, ("", ""))
        if node.name in origins:  # written at export from the exporter's own metadata
            module, source = origins[node.name][0] or module, origins[node.name][2] or source
        diff = TensorDiff(value, node.name, node.op_type, module, source, stats["max_abs"], stats["max_rel"], stats["outside"], stats["ok"])
        loc.table.append(diff)
        if not diff.ok:
            if loc.first is None:
                loc.first = diff
                loc.path = _unmatched_path(node, producer, ref)
            else:
                loc.downstream_failed += 1
    loc.compared = len(loc.table)
    return loc


def _unmatched_path(node: onnx.NodeProto, producer: dict, ref: dict) -> list[str]:
    """The node and the nodes feeding it back to the nearest tensors PyTorch also has (they agreed)."""
    path, todo, seen = [], [node], set()
    while todo:
        n = todo.pop()
        if n.name in seen:
            continue
        seen.add(n.name)
        path.append(f"{n.name} ({n.op_type})")
        todo += [producer[i] for i in n.input if i in producer and i not in ref]
    return path


def render(loc: dict) -> list[str]:
    """The report's lines for a Localization (as JSON); one starts with `first divergent node:`."""
    where = f"{loc['graph']} [{loc['variant']}, {loc['provider']}, {loc['case']}]"
    if loc.get("against", "pytorch") != "pytorch":
        where += f" against {loc['against']}"
    f = loc["first"]
    if f is None:
        return [f"localize {where}: no divergent node ({loc['compared']} intermediate tensors within their tolerances)"]
    lines = [f"first divergent node: {f['node']} ({f['op']}) in {f['module'] or 'the model'}"
             + (f" at {f['source']}" if f["source"] else "") + f"; {where}",
             f"  its output {f['value']}: max abs {f['max_abs']:.3g}, max rel {f['max_rel']:.3g}, {f['outside']:.1%} of elements "
             f"outside the tolerance; every tensor computed before it agreed ({loc['compared']} compared in all); "
             f"{loc['downstream_failed']} tensors after it fail too"]
    if len(loc["path"]) > 1:
        lines.append("  computed by: " + " <- ".join(loc["path"][:6]) + (" ..." if len(loc["path"]) > 6 else ""))
    return lines


def plot(loc: dict, path: Path) -> Path:
    """Error of every compared tensor in graph order, against its tolerance, the first divergent one marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = loc["table"]
    steps = loc.get("step_errors") or []
    fig, axes = plt.subplots(1, 2 if steps else 1, figsize=(14 if steps else 11, 3.6), dpi=110,
                             gridspec_kw={"width_ratios": [3, 1]} if steps else None, squeeze=False)
    ax = axes[0][0]
    xs = np.arange(len(table))
    errors = [max(t["max_abs"], 1e-12) if np.isfinite(t["max_abs"]) else 1e12 for t in table]
    other = "PyTorch" if loc.get("against", "pytorch") == "pytorch" else loc["against"]
    ax.semilogy(xs, errors, ".-", lw=0.8, ms=3, color="#4477aa", label=f"max abs error against {other}")
    bad = [i for i, t in enumerate(table) if not t["ok"]]
    ax.semilogy(bad, [errors[i] for i in bad], "o", ms=4, color="#cc6677", label="outside its tolerance")
    if loc["first"] is not None:
        i = next(i for i, t in enumerate(table) if t["value"] == loc["first"]["value"])
        ax.axvline(i, color="#cc6677", lw=1, ls="--")
        ax.annotate(f"{loc['first']['node']}\n{loc['first']['module']}", (i, errors[i]), xytext=(6, 6), textcoords="offset points",
                    fontsize=8)
    ax.set_xlabel(f"intermediate tensors of {loc['graph']}, in graph order")
    ax.set_ylabel("max abs error")
    ax.set_title(f"tk verify --localize: {loc['graph']} [{loc['variant']}, {loc['provider']}]", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    if steps:  # the decode as a whole: how the log-probabilities' error grows along the steps
        right = axes[0][1]
        right.semilogy(range(len(steps)), [max(e, 1e-12) if np.isfinite(e) else 1e12 for e in steps], "o-", ms=3, color="#4477aa")
        right.set_xlabel("decode step")
        right.set_ylabel("max abs error of log_probs")
        right.set_title("every decode step, against PyTorch", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
