"""How `tk verify` compares: tolerances per variant, error statistics of one tensor against its reference,
and running a graph or its PyTorch module on the same inputs (a runtime refusing inputs is a finding, not a crash)."""

from __future__ import annotations

import numpy as np
import torch

from toolkit.core.errors import first_line
from toolkit.core.graphs import GraphSpec
from toolkit.core.variants import CATALOGUE
from toolkit.verify.report import Row


def tolerance(variant: str, atol: float | None, rtol: float | None) -> tuple[float, float]:
    default = CATALOGUE[variant].tolerance
    return (default[0] if atol is None else atol, default[1] if rtol is None else rtol)


def compare(ref: np.ndarray, got: np.ndarray, atol: float, rtol: float) -> dict:
    """Error statistics of `got` against `ref`; NaN or Inf in `got` fails whatever the tolerance, except -inf exactly
    where the reference has -inf too (a token the model's rules forbid: its log-probability is -inf by declaration)."""
    if ref.shape != got.shape:
        return {"ok": False, "detail": f"shape {got.shape}, expected {ref.shape}", "max_abs": float("inf"),
                "max_rel": float("inf"), "outside": 1.0}
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    forbidden = np.isneginf(ref)
    if forbidden.any() and np.array_equal(forbidden, np.isneginf(got)):
        ref, got = ref[~forbidden], got[~forbidden]
    if not np.isfinite(got).all():
        return {"ok": False, "detail": "NaN or Inf in output", "max_abs": float("nan"), "max_rel": float("nan"), "outside": 1.0}
    if ref.size == 0:
        return {"ok": True, "max_abs": 0.0, "max_rel": 0.0, "outside": 0.0}
    diff = np.abs(ref - got)
    scale = np.abs(ref)
    outside = float(np.mean(diff > atol + rtol * scale))
    rel = diff / np.maximum(scale, 1e-6)
    return {"ok": outside == 0.0, "max_abs": float(diff.max()), "max_rel": float(rel.max()), "outside": outside}


def top1(ref: np.ndarray, got: np.ndarray) -> float:
    return float(np.mean(ref.argmax(-1) == got.argmax(-1)))


def run_torch(module: torch.nn.Module, spec: GraphSpec, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        outs = module(*(torch.from_numpy(feeds[n]) for n in spec.input_names))
    return {n: o.numpy() for n, o in zip(spec.output_names, outs)}


class RunFailure(Exception):
    """The runtime refused the inputs (a frozen axis, a broken graph): a parity failure, not a crash."""


def run_graph(runner, spec: GraphSpec, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One run of a toolkit.runtimes.GraphRunner, its outputs named as the manifest declares them (by position)."""
    try:
        return dict(zip(spec.output_names, runner.run(feeds)))
    except Exception as e:
        raise RunFailure(first_line(e)) from None


def failed_run(rows: list[Row], check: str, spec: GraphSpec, variant: str, provider: str, case: str, error: Exception) -> None:
    rows.append(Row(check, spec.name, variant, provider, case, "(run)", float("inf"), float("inf"), 1.0, ok=False,
                    detail=f"the runtime failed: {error}"))


def compare_outputs(rows: list[Row], check: str, spec: GraphSpec, variant: str, provider: str, case: str,
                    ref: dict, got: dict, tol: tuple[float, float], noise: dict | None = None) -> bool:
    """Appends a row per output; whether all of them are within the tolerance."""
    ok = True
    for name in spec.output_names:
        stats = compare(ref[name], got[name], *tol)
        row = Row(check, spec.name, variant, provider, case, name, **stats)
        if name == "log_probs" and ref[name].shape == got[name].shape:
            row.top1 = top1(ref[name], got[name])
        if noise and name in noise:
            row.noise = noise[name]
        rows.append(row)
        ok = ok and row.ok
    return ok
