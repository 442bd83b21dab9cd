"""The GPU measurement script, run on the CPU (the same code with --provider cpu): one call writes every result."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Minutes of work in all: left out of the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_matrix_writes_verify_translation_and_bench_results_and_records_verify_per_provider(tmp_path):
    exported = tmp_path / "exported"
    shutil.copytree(REPO / "exported", exported)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "toolkit.bench.cuda_matrix", out, "--provider", "cpu", "--sentences", "16",
                           "--bench-sentences", "4", "--verify-sentences", "2", "--serve-sentences", "8", "--exported", exported],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results["verify"]) == {"transformer", "seq2seq", "nw", "masked_softmax", "dot_attention", "additive_attention",
                                      "multihead_attention"}
    assert all(v["passed"] for v in results["verify"].values())
    assert results["translation"]["sentences"] == 16 and results["translation"]["cpu fp32"]["identical_to_cpu_fp32"] == 1.0
    backends = {(r["backend"], r["search"], r["batch"]) for r in results["bench"]}
    assert ("onnxruntime cpu", "beam 4", 4) in backends and ("pytorch cached", "greedy", 1) in backends
    # Greedy token ids through the one decoding loop, against PyTorch and ONNX Runtime fp32 on the CPU.
    assert results["token_parity"]["onnxruntime cpu fp32"] == {"identical_to_pytorch_cpu": 1.0, "identical_to_onnxruntime_cpu_fp32": 1.0}
    assert results["memory"] == {"skipped": "device memory is measured on cuda only"}
    assert {r["mode"] for r in results["serve"]} == {"dynamic batching", "batching off"} and all(r["errors"] == 0 for r in results["serve"])
    assert results["copy_profile"]["fp32 io_binding=on"]["decoder_runs"] > 0
    table = (out / "table.md").read_text()
    assert "| verify seq2seq | pass" in table and "| onnxruntime cpu | greedy | 1 |" in table
    # The verify records went to the models' manifests, one per runtime and provider.
    recorded = json.loads((exported / "transformer" / "manifest.json").read_text())["verify"]
    assert recorded["onnxruntime/cpu"]["passed"]


def test_without_cuda_the_matrix_stops_in_one_line_before_measuring(tmp_path):
    """CUDA_VISIBLE_DEVICES='' hides any GPU, as on a machine without one."""
    proc = subprocess.run([sys.executable, "-m", "toolkit.bench.cuda_matrix", tmp_path / "out"], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 1 and proc.stdout.startswith("error: ONNX Runtime could not load its CUDA provider")
    assert not (tmp_path / "out").exists()


def test_a_part_rerun_with_only_keeps_the_others_and_an_unknown_part_is_one_line(tmp_path):
    """A GPU machine is lent for minutes: a part re-run with --only keeps what was measured before."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"verify": {"nw": {"passed": True, "checks": 3, "failures": 0, "worst_max_abs": {}}}}))
    proc = subprocess.run([sys.executable, "-m", "toolkit.bench.cuda_matrix", out, "--provider", "cpu", "--only", "memory"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["verify"]["nw"]["passed"] and results["memory"]["skipped"]
    bad = subprocess.run([sys.executable, "-m", "toolkit.bench.cuda_matrix", out, "--provider", "cpu", "--only", "speed"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout.startswith("error: --only speed: choose from verify,") and "Traceback" not in bad.stderr


def test_the_bench_compares_each_provider_with_pytorch_on_the_same_device():
    """An ONNX Runtime CUDA row is held to PyTorch on CUDA, a CPU row to PyTorch on the CPU."""
    from toolkit.bench.backends import Result, row_provider, table, torch_row

    rows = [Result("pytorch cached", "greedy", 64, 4.0, 64, 640, 0.0, [[1]] * 64),
            Result("pytorch cached cuda", "greedy", 64, 1.0, 64, 640, 0.0, [[1]] * 64),
            Result("onnxruntime cuda fp16", "greedy", 64, 0.5, 64, 640, 0.0, [[1]] * 64),
            Result("onnxruntime cpu", "greedy", 64, 2.0, 64, 640, 0.0, [[1]] * 64)]
    assert [torch_row(row_provider(r.backend)) for r in rows] == ["pytorch cached", "pytorch cached cuda", "pytorch cached cuda", "pytorch cached"]
    lines = {line.split("  ")[0]: line for line in table(rows).splitlines()}
    assert " 2.00x " in lines["onnxruntime cuda fp16"] and " 2.00x " in lines["onnxruntime cpu"]


def test_bench_on_cuda_without_it_is_one_line_and_cpu_runs_alone(tmp_path):
    """`tk bench --provider cuda` names why CUDA cannot load instead of timing the CPU; --provider cpu times no CUDA row."""
    env = {"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "", "TK_CACHE_DIR": str(tmp_path / "cache")}
    tk = [sys.executable, "-m", "toolkit.cli", "bench", "--sentences", "2", "--batch-size", "1", "--beam", "1", "--repeat", "1",
          "--no-textbook", "--no-ct2", "--threads", "1", "--streams", "1"]
    cuda = subprocess.run([*tk, "--provider", "cuda"], capture_output=True, text=True, timeout=120, env=env)
    assert cuda.returncode == 1 and "Traceback" not in cuda.stderr
    assert cuda.stderr.strip().splitlines()[-1].startswith("error: ONNX Runtime could not load its CUDA provider")
    text = subprocess.run([*tk, "--provider", "cuda", "--text", str(REPO / "README.md")], capture_output=True, text=True, timeout=120, env=env)
    assert text.returncode == 2 and "drop --provider cuda" in text.stderr and "Traceback" not in text.stderr
    cpu = subprocess.run([*tk, "--provider", "cpu", "--json", str(tmp_path / "rows.json")], capture_output=True, text=True, timeout=240, env=env)
    assert cpu.returncode == 0, cpu.stderr[-2000:]
    backends = {r["backend"] for r in json.loads((tmp_path / "rows.json").read_text())}
    assert "pytorch cached" in backends and not any("cuda" in b for b in backends)
