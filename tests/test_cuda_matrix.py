"""The GPU measurement script, run on the CPU (the same code with --provider cpu): one call writes every result."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_the_matrix_writes_verify_translation_and_bench_results_and_records_verify_per_provider(tmp_path):
    exported = tmp_path / "exported"
    shutil.copytree(REPO / "exported", exported)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "toolkit.build.cuda_matrix", out, "--provider", "cpu", "--sentences", "16",
                           "--bench-sentences", "4", "--verify-sentences", "2", "--exported", exported],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results["verify"]) == {"transformer", "seq2seq", "nw", "masked_softmax", "dot_attention", "additive_attention",
                                      "multihead_attention"}
    assert all(v["passed"] for v in results["verify"].values())
    assert results["translation"]["sentences"] == 16 and results["translation"]["cpu fp32"]["identical_to_cpu_fp32"] == 1.0
    backends = {(r["backend"], r["search"], r["batch"]) for r in results["bench"]}
    assert ("onnxruntime cpu", "beam 4", 4) in backends and ("pytorch cached", "greedy", 1) in backends
    table = (out / "table.md").read_text()
    assert "| verify seq2seq | pass" in table and "| onnxruntime cpu | greedy | 1 |" in table
    # The verify records went to the models' manifests, one per runtime and provider.
    recorded = json.loads((exported / "transformer" / "manifest.json").read_text())["verify"]
    assert recorded["onnxruntime/cpu"]["passed"]


def test_without_cuda_the_matrix_stops_in_one_line_before_measuring(tmp_path):
    """CUDA_VISIBLE_DEVICES='' hides any GPU, as on a machine without one."""
    proc = subprocess.run([sys.executable, "-m", "toolkit.build.cuda_matrix", tmp_path / "out"], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 1 and proc.stdout.startswith("error: ONNX Runtime could not load its CUDA provider")
    assert not (tmp_path / "out").exists()
