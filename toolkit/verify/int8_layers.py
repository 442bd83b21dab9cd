"""Which layers of the int8 variant cost the most accuracy, and the int8 graphs that keep those in float.

Each quantisable layer (a MatMul by a weight, an embedding lookup) is quantised alone, every other layer left in float, and the
decoder's log-probabilities are compared with fp32's along fp32's own greedy translations of held-out sentences.
Both graphs are fed the same prefix (teacher forcing), so each error is the layer's own, not that of a translation
that went another way. The error is taken over the 8 tokens fp32 ranks highest at each position: the ones that
decide the output. `tk verify --variant int8 --int8-layers` prints the table; `tk export --quantize int8
--keep-fp32 auto` keeps the worst layers in float until `tk verify` passes and BLEU is within a budget of fp32's.
Runs the exported graphs on ONNX Runtime's CPU provider; no torch.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.core.declaration import TK_RULES, DecodingRules
from toolkit.core.decoding import pad_batch
from toolkit.core.manifest import Manifest
from toolkit.core.tokenizers import open_tokenizer

TOP = 8  # tokens per position whose log-probabilities are compared
PROBE = 128  # held-out sentences translated for the table


@dataclass
class LayerError:
    """One quantisable layer: the error in the log-probabilities when it alone is int8."""

    graph: str
    node: str  # the MatMul's name in the graph the quantiser reads
    module: str  # PyTorch module path(s) it computes
    mean_abs: float  # mean abs error of the top-8 log-probabilities, over every position
    max_abs: float
    flips: float  # share of positions whose best token changes


@dataclass
class Int8Error:
    """The same measure for a whole graph pair (plain int8, or int8 with some layers kept in float)."""

    mean_abs: float
    max_abs: float
    flips: float


def _sessions(m: Manifest, sources: dict[str, Path | bytes]):
    from toolkit.runtimes.onnxruntime.backend import OrtBackend
    from toolkit.runtimes.onnxruntime.sessions import create_session

    specs = m.specs()
    return OrtBackend(create_session(sources["encoder"], "cpu"), create_session(sources["decoder"], "cpu"),
                      specs["encoder"], specs["decoder"])


def forced_log_probs(backend, src: list[list[int]], targets: list[list[int]], rules: DecodingRules = TK_RULES) -> np.ndarray:
    """Log-probabilities at every position of each target (its end token included), all rows fed the target's tokens:
    (positions, vocab), rows one after another."""
    EOS, BOS = rules.end, rules.start
    ids, lens = pad_batch(src, rules.pad)
    state = backend.encode(ids, lens)
    steps = max(len(t) for t in targets) + 1
    fed = np.full((len(src), steps), EOS, dtype=np.int64)
    fed[:, 0] = BOS
    for i, t in enumerate(targets):
        fed[i, 1 : len(t) + 1] = t
    out = []
    for step in range(steps):
        log_probs, state = backend.step(fed[:, step], state)
        out.append(log_probs)
    stacked = np.stack(out, 1)  # (rows, steps, vocab)
    return np.concatenate([stacked[i, : len(t) + 1] for i, t in enumerate(targets)])


def error(reference: np.ndarray, got: np.ndarray) -> Int8Error:
    """The error of `got` against fp32's log-probabilities, over fp32's TOP best tokens of each position."""
    top = np.argpartition(-reference, TOP - 1, axis=1)[:, :TOP]
    diff = np.abs(np.take_along_axis(reference, top, 1) - np.take_along_axis(got, top, 1))
    return Int8Error(float(diff.mean()), float(diff.max()), float(np.mean(reference.argmax(1) != got.argmax(1))))


class Probe:
    """fp32's greedy translations of some sentences, and its log-probabilities along them: what every
    candidate graph pair is compared with."""

    def __init__(self, m: Manifest, sentences: Sequence[str]):
        from toolkit.core.batching import DecodeOptions, decode_ids
        from toolkit.graphs.variants import graph_source

        self.m = m
        self.fp32 = {g: graph_source(m, g, "fp32")[0] for g in m.graphs}
        backend = _sessions(m, self.fp32)
        rules = m.rules()
        self.src = [s[: m.max_len] or [rules.end] for s in open_tokenizer(m).encode(list(sentences))]
        hyps = decode_ids(backend, self.src, DecodeOptions.bare(max_len=m.max_output_len - 1, rules=rules))
        self.targets = [h[0].tokens for h in hyps]
        self.reference = forced_log_probs(backend, self.src, self.targets, rules)

    def measure(self, sources: dict[str, Path | bytes]) -> Int8Error:
        """The error of a graph pair; a graph missing from `sources` is fp32's."""
        return error(self.reference, forced_log_probs(_sessions(self.m, {**self.fp32, **sources}), self.src, self.targets, self.m.rules()))


def _labels(folded: Path, node_map: dict[str, list[str]]) -> dict[str, str]:
    """Module path(s) of each quantisable MatMul: from the export's node map, and for a fused projection from
    the nodes it replaced (its doc string names them)."""
    import onnx

    from toolkit.graphs.variants import int8_layers

    docs = {n.name: n.doc_string for n in onnx.load(folded).graph.node}
    labels = {}
    for node, _ in int8_layers(folded):
        base = node.split("/")[0]  # the quantiser's own optimisations may rename a node "X/..."
        members = docs[base][len("fuses "):].split() if docs.get(base, "").startswith("fuses ") else [base]
        modules = [node_map.get(n, [""])[0] for n in members]
        labels[node] = _join_modules(modules) if all(modules) else ("output projection" if base == "node_matmul" else node)
    return labels


def _join_modules(modules: list[str]) -> str:
    """decoder_blocks.0.self_attention.W_q, .W_k, .W_v -> decoder_blocks.0.self_attention.W_q+W_k+W_v; the cross
    keys and values of every layer -> decoder_blocks.*.cross_attention.W_k+W_v."""
    import re

    if len(modules) == 1 or not all("." in x for x in modules):
        return " + ".join(modules)
    stems = {re.sub(r"\.\d+\.", ".*.", x.rsplit(".", 1)[0]) for x in modules}
    if len(stems) == 1:
        exact = {x.rsplit(".", 1)[0] for x in modules}
        stem = exact.pop() if len(exact) == 1 else stems.pop()
        return stem + "." + "+".join(dict.fromkeys(x.rsplit(".", 1)[1] for x in modules))
    return " + ".join(modules)


def layer_table(m: Manifest, sentences: Sequence[str], echo: Callable[[str], None] = lambda s: None,
                probe: Probe | None = None) -> list[LayerError]:
    """Every quantisable layer of every graph, worst first."""
    import onnx

    from toolkit.core.node_map import node_origins
    from toolkit.graphs.variants import fold_for_int8, int8_graph, int8_layers

    probe = probe or Probe(m, sentences)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tk-int8-layers-") as tmp:
        for graph in m.graphs:
            whole = Path(tmp) / f"{graph}.onnx"
            onnx.save_model(onnx.load(str(m.graph_path(graph))), whole)  # self-contained: weights inside
            folded = fold_for_int8(whole, Path(tmp) / f"{graph}.folded.onnx")
            labels = _labels(folded, node_origins(m, graph))
            layers = int8_layers(folded)
            for i, (node, _) in enumerate(layers, 1):
                one = Path(tmp) / f"{graph}.{i}.onnx"
                int8_graph(whole, one, only=[node], folded=folded)
                e = probe.measure({graph: one})
                one.unlink()
                rows.append(LayerError(graph, node, labels[node], e.mean_abs, e.max_abs, e.flips))
                echo(f"  {graph} {i}/{len(layers)} {labels[node]}: mean {e.mean_abs:.4f}, max {e.max_abs:.3f}")
    return sorted(rows, key=lambda r: -r.mean_abs)


def render(table: list[LayerError], whole: Int8Error | None = None) -> str:
    """The table as text: each layer's error when it alone is int8, worst first."""
    lines = [f"{'graph':<8} {'layer (PyTorch module)':<52} {'mean abs':>9} {'max abs':>8} {'flips':>6}"]
    for r in table:
        lines.append(f"{r.graph:<8} {r.module[:52]:<52} {r.mean_abs:>9.4f} {r.max_abs:>8.3f} {r.flips:>6.1%}")
    if whole is not None:
        lines.append(f"{'all int8':<61} {whole.mean_abs:>9.4f} {whole.max_abs:>8.3f} {whole.flips:>6.1%}")
    return "\n".join(lines)


def keep_plan(table: list[LayerError], count: int) -> dict[str, list[str]]:
    """The `count` worst layers, per graph: what int8_graph's keep_fp32 takes."""
    plan: dict[str, list[str]] = {g: [] for g in {r.graph for r in table}}
    for r in table[:count]:
        plan[r.graph].append(r.node)
    return plan


def auto_keep(table: list[LayerError], accept: Callable[[dict[str, list[str]]], bool],
              echo: Callable[[str], None] = lambda s: None) -> dict[str, list[str]]:
    """The fewest worst layers kept in float for which `accept` holds (plain int8 first); all float if none."""
    for count in range(len(table) + 1):
        plan = keep_plan(table, count)
        echo(f"int8 with {count} layer(s) kept in float: " + (", ".join(r.module for r in table[:count]) or "none"))
        if accept(plan):
            return plan
    return keep_plan(table, len(table))
