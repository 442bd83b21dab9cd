"""`tk verify` for the attention variant: its weights against PyTorch's, and what makes them probabilities.

For each provider: the interface against the declaration; the sweep's random inputs and a real
greedy decode, every output (the attention weights included) compared with PyTorch; every
attention row summing to 1 over the valid keys with exactly zero weight on masked ones; and
greedy translations token-for-token identical to the plain fp32 graphs'.
"""

from __future__ import annotations

import numpy as np
import torch

from toolkit.core.decoding import greedy
from toolkit.core.errors import first_line
from toolkit.core.graphs import GraphSpec, TensorSpec
from toolkit.core.manifest import Manifest
from toolkit.deploy import attention_graphs
from toolkit.pytorch import registry
from toolkit.runtimes.onnxruntime.loading import load_sessions
from toolkit.runtimes.onnxruntime.sessions import OrtRunner
from toolkit.verify.checks import ParityBackend, case_label, static_check, sweep_cases, sweep_inputs
from toolkit.verify.compare import RunFailure, compare_outputs, failed_run, run_graph, run_torch, tolerance
from toolkit.verify.report import Report, Row

VARIANT = "attention"
SUM_TOL = 1e-5  # float32 softmax rows sum to 1 within a few ulps per key


def probability_check(rows: list[Row], check: str, spec: GraphSpec, extra: tuple[TensorSpec, ...], provider: str, case: str,
                      feeds: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> None:
    """Each attention row sums to 1 over its valid keys, and masked keys get exactly zero weight."""
    for t in extra:
        w = got[t.name].astype(np.float64)
        keys = w.shape[-1]
        if t.dims[-1] == "src_len":
            valid = np.arange(keys)[None, :] < feeds["src_len"][:, None]  # (batch, keys)
            valid = valid.reshape(valid.shape[0], *([1] * (w.ndim - 2)), keys)
        else:  # self-attention over the decoder's own prefix: every key is valid
            valid = np.ones((1,) * w.ndim, dtype=bool)
        valid = np.broadcast_to(valid, w.shape)
        sums = np.where(valid, w, 0.0).sum(-1)
        masked = np.abs(np.where(valid, 0.0, w)).max(initial=0.0)
        off = np.abs(sums - 1)
        worst = float(off.max(initial=0.0))
        problems = [f"a row sums to {float(sums.flat[off.argmax()]):.6f} over the valid keys"] if worst > SUM_TOL else []
        if masked != 0.0:
            problems.append(f"masked keys get weight {masked:.3g}, not exactly 0")
        rows.append(Row(f"{check} sums", spec.name, VARIANT, provider, case, t.name, max_abs=max(worst, masked),
                        ok=not problems, detail="; ".join(problems)))


class AttentionParity(ParityBackend):
    """The real-sentence decode of verify, with the attention weights compared and checked at every step."""

    def __init__(self, torch_backend, model, entry, extra, *args):
        super().__init__(torch_backend, *args)
        self.model, self.entry, self.extra = model, entry, extra

    def extra_reference(self, graph: str, batch: int) -> dict[str, np.ndarray]:
        weights = self.entry.read_attention(self.model, graph, batch)
        return {t.name: w.detach().numpy() for t, w in zip(self.extra[graph], weights)}

    def extra_checks(self, graph: str, feeds: dict[str, np.ndarray], got: dict[str, np.ndarray], case: str) -> None:
        probability_check(self.rows, "decode", self.specs[graph], self.extra[graph], self.provider, case, feeds, got)


def verify_attention(m: Manifest, entry: registry.ModelEntry, model: torch.nn.Module, cfg, report: Report, providers: list[str],
                     seed: int, src_ids: list[list[int]], atol: float | None, rtol: float | None, echo=print) -> None:
    extra = attention_graphs.declared(m)
    declared = entry.attention(cfg) if entry.attention else {}
    if declared != extra:
        report.rows.append(Row("static", "attention", VARIANT, "-", "-", "declaration", ok=False,
                               detail="manifest attention declaration differs from the model registry's; re-export"))
        return
    specs, base = attention_graphs.specs(m), m.specs()
    tol = tolerance("fp32", atol, rtol)
    for name, spec in specs.items():
        report.rows += static_check(attention_graphs.graph_source(m, name), spec, VARIANT)
    modules = {name: registry.AttentionGraph(entry, model, base[name]) for name in specs}
    vocab, max_len = getattr(cfg, "vocab_size", 2), getattr(cfg, "max_len", 64)
    for provider in providers:
        sessions = attention_graphs.load_sessions(m, provider)
        runners = {name: OrtRunner(s) for name, s in sessions.items()}
        rng = np.random.default_rng(seed)
        for i, sizes in enumerate(sweep_cases(max_len)):
            for name, spec in specs.items():
                feeds = sweep_inputs(spec, sizes, rng, vocab, i)
                ref = run_torch(modules[name], spec, feeds)
                case = case_label(spec, sizes)
                try:
                    got = run_graph(runners[name], spec, feeds)
                except RunFailure as e:
                    failed_run(report.rows, "sweep", spec, VARIANT, provider, case, e)
                    continue
                compare_outputs(report.rows, "sweep", spec, VARIANT, provider, case, ref, got, tol)
                probability_check(report.rows, "sweep", spec, extra[name], provider, case, feeds, got)
        if not src_ids:
            continue
        from toolkit.pytorch.torch_backend import TorchBackend

        ref_backend = TorchBackend(model, base["encoder"], base["decoder"])
        parity = AttentionParity(ref_backend, model, entry, extra, runners, specs, VARIANT, provider, tol, report.rows)
        plain = load_sessions(m, provider).backend()
        recorder = attention_graphs.recorder(sessions, specs, extra)
        try:
            greedy(parity, src_ids, max_len)
            want, got = greedy(plain, src_ids, max_len), greedy(recorder, src_ids, max_len)
        except Exception as e:  # ONNX Runtime refusing a real sentence is a verdict, reported like any other
            failed_run(report.rows, "decode", specs["decoder"], VARIANT, provider, f"{len(src_ids)} sentences", RunFailure(first_line(e)))
            continue
        same = sum(a.tokens == b.tokens for a, b in zip(want, got))
        report.rows.append(Row("translation", "encoder+decoder", VARIANT, provider, f"{len(src_ids)} sentences", "tokens vs fp32",
                               outside=1 - same / len(src_ids), ok=same == len(src_ids),
                               detail=f"{same}/{len(src_ids)} identical to the fp32 graphs'"))
