"""tk verify passes on good graphs and, as importantly, fails on broken ones."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from helpers import rehash

from toolkit.core import manifest
from toolkit.core.errors import UsageError
from toolkit.pytorch.export import ExportOptions, export
from toolkit.verify.compare import compare


def test_passes_on_the_tiny_transformer_and_writes_json(cli, tiny_export, tmp_path):
    report_path = tmp_path / "report.json"
    result = cli("verify", tiny_export, "--json", report_path, "--sentences", 6)
    assert result.exit_code == 0, result.output
    assert "translation" in result.output and "6/6 identical" in result.output
    report = json.loads(report_path.read_text())
    assert report["passed"] and report["seed"] == 0
    assert {"torch", "onnx", "onnxruntime"} <= set(report["environment"])
    checks = {r["check"] for r in report["rows"]}
    # The attention variant adds its row-sum and mask checks ("sweep sums", "decode sums"); "batch": the sentences
    # translate the same alone and in one padded batch.
    assert checks == {"static", "sweep", "optimizer", "decode", "translation", "batch", "sweep sums", "decode sums"}
    # The sweep covers batch 1 and 64 and lengths longer than the export's.
    cases = {r["case"] for r in report["rows"] if r["check"] == "sweep"}
    assert any("batch=1 " in c for c in cases) and any("batch=64" in c for c in cases)
    assert any("src_len=13" in c for c in cases)


@pytest.mark.parametrize("name", ["masked_softmax", "dot_attention", "additive_attention", "multihead_attention", "nw"])
def test_passes_on_every_attention_module(cli, random_export, name, tmp_path):
    from toolkit.core import manifest

    result = cli("verify", random_export(name), "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] and not report["failures"]
    # Every output of every graph was compared with PyTorch, over a sweep of sizes.
    specs = manifest.load(random_export(name)).specs()
    swept = {(r["graph"], r["output"]) for r in report["rows"] if r["check"] == "sweep" and r["ok"]}
    assert swept == {(g, o) for g, spec in specs.items() for o in spec.output_names}
    # The smallest and the largest sizes of the free axes (nw has no batch axis).
    cases = {r["case"] for r in report["rows"] if r["check"] == "sweep"}
    sizes = {int(part.split("=")[1]) for c in cases for part in c.split()}
    assert len(cases) >= 5 and min(sizes) == 1 and max(sizes) >= 64


def _failures(cli, directory, tmp_path, *extra):
    report_path = tmp_path / "r.json"
    result = cli("verify", directory, "--json", report_path, "--sentences", 4, *extra)
    return result, json.loads(report_path.read_text())["failures"] if report_path.exists() else []


def _perturb_one_weight(directory):
    graph = onnx.load(directory / "decoder.onnx", load_external_data=False).graph
    init = next(i for i in graph.initializer if i.name == "model.decoder_blocks.0.ffn.dense1.weight")
    offset = int({e.key: e.value for e in init.external_data}["offset"])
    blob = bytearray((directory / "weights.bin").read_bytes())
    value = np.frombuffer(blob, dtype=np.float32, count=1, offset=offset)[0]
    blob[offset : offset + 4] = np.float32(value + 0.05).tobytes()
    (directory / "weights.bin").write_bytes(bytes(blob))
    rehash(directory)


def _point_checkpoint_at(directory, path):
    d = json.loads((directory / "manifest.json").read_text())
    d["checkpoint"]["path"] = str(path)
    (directory / "manifest.json").write_text(json.dumps(d))


def test_a_checkpoint_trained_on_after_export_falls_back_to_the_graph_weights(cli, tiny_export, tmp_path):
    """Training that resumes after an export must not make the exported directory unverifiable."""
    model_dir = tmp_path / "exported"
    shutil.copytree(tiny_export, model_dir)
    moved_on = tmp_path / "checkpoint.pt"
    moved_on.write_bytes(b"a later epoch")
    _point_checkpoint_at(model_dir, moved_on)
    result = cli("verify", model_dir, "--sentences", 2)
    assert result.exit_code == 0, result.output
    assert "reference: weights read from the fp32 graphs (checkpoint changed since export)" in result.output


def test_graph_weights_changed_after_export_fail_without_the_checkpoint(cli, tiny_export, tmp_path):
    """With no checkpoint the reference comes from the graphs themselves, so the export-time weights digest guards it."""
    broken = tmp_path / "perturbed"
    shutil.copytree(tiny_export, broken)
    _perturb_one_weight(broken)
    _point_checkpoint_at(broken, tmp_path / "not-here.pt")
    result = cli("verify", broken, "--sentences", 2)
    assert result.exit_code == 2 and "weights digest mismatch" in result.output, result.output


@pytest.mark.slow
def test_fails_on_one_weight_perturbed_by_a_small_amount(cli, tiny_export, tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_checkpoint.parent)  # where it was trained: the manifest's checkpoint path leads to it
    broken = tmp_path / "perturbed"
    shutil.copytree(tiny_export, broken)
    _perturb_one_weight(broken)
    # The reference must come from the checkpoint, not from the (perturbed) graphs.
    result, failures = _failures(cli, broken, tmp_path)
    assert result.exit_code == 1, result.output
    assert "check(s) failed" in result.output
    assert any(f["check"] in ("sweep", "decode") and f["output"] == "log_probs" for f in failures)


@pytest.mark.slow
def test_fails_on_a_decoder_whose_cache_position_is_off_by_one(cli, tiny_checkpoint, tmp_path, monkeypatch):
    from toolkit.models import attention

    real = attention.PositionalEncoding.forward

    def shifted(self, x, offset=None):
        return real(self, x, None if offset is None else offset + 1)

    monkeypatch.setattr(attention.PositionalEncoding, "forward", shifted)
    out = export(ExportOptions(out=tmp_path / "off-by-one", checkpoint=str(tiny_checkpoint)), echo=lambda m: None)
    monkeypatch.setattr(attention.PositionalEncoding, "forward", real)
    result, failures = _failures(cli, out, tmp_path)
    assert result.exit_code == 1
    # The shifted position changes the next-token distribution itself, not only the cache.
    assert any(f["graph"] == "decoder" and f["output"] == "log_probs" for f in failures)
    assert "decoder/log_probs" in result.output
    assert not any(f["graph"] == "encoder" and f["check"] == "sweep" for f in failures)


@pytest.mark.slow
def test_fails_on_a_sequence_axis_frozen_at_export(cli, tiny_checkpoint, tmp_path, monkeypatch):
    from toolkit.pytorch import export as export_mod

    real = export_mod.dynamic_shapes

    def freeze_src_len(spec, max_len):
        (shapes,) = real(spec, max_len)
        return (tuple({k: v for k, v in (s or {}).items() if v.__name__ != "src_len"} or None for s in shapes),)

    monkeypatch.setattr(export_mod, "dynamic_shapes", freeze_src_len)
    # Export itself refuses it now (it runs every graph at a second size first), naming the graph, input and axis ...
    with pytest.raises(UsageError, match=r"graph 'encoder' refused: input src axis 1 \('src_len'\) is frozen to 7"):
        export(ExportOptions(out=tmp_path / "refused", checkpoint=str(tiny_checkpoint)), echo=lambda m: None)
    assert not (tmp_path / "refused").exists()
    # ... and verify still catches a directory an older tk wrote so.
    monkeypatch.setattr(export_mod, "check_sizes", lambda *args: None)
    out = export(ExportOptions(out=tmp_path / "frozen", checkpoint=str(tiny_checkpoint)), echo=lambda m: None)
    result, failures = _failures(cli, out, tmp_path)
    assert result.exit_code == 1
    frozen = [f for f in failures if f["check"] == "static"]
    assert frozen and "axis 'src_len' is frozen to 7" in frozen[0]["detail"]
    assert any(f["check"] == "sweep" and "src_len=13" in f["case"] for f in failures)


def test_cuda_that_cannot_load_fails_in_one_line(cli, random_export, cuda_falls_back):
    result = cli("verify", random_export("dot_attention"), "--provider", "cuda")
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0
    assert "could not load its CUDA provider" in result.output and "use --provider cpu" in result.output


def test_provider_all_runs_what_loads_and_says_what_it_skipped(cli, random_export, cuda_falls_back):
    result = cli("verify", random_export("dot_attention"), "--provider", "all")
    assert result.exit_code == 0, result.output
    assert "skipped provider cuda: ONNX Runtime could not load its CUDA provider" in result.output


def test_corrupt_graph_is_reported(cli, tiny_export, tmp_path):
    broken = tmp_path / "corrupt"
    shutil.copytree(tiny_export, broken)
    (broken / "encoder.onnx").write_bytes((broken / "encoder.onnx").read_bytes()[:200])
    result = cli("verify", broken)
    assert result.exit_code != 0
    assert "encoder.onnx" in result.output and "Traceback" not in result.output


def test_missing_directory_is_a_usage_error(cli, tmp_path):
    result = cli("verify", tmp_path / "nope")
    assert result.exit_code == 2 and "does not exist" in result.output


def test_nan_fails_whatever_the_tolerance():
    ref = np.zeros((2, 3), np.float32)
    got = ref.copy()
    got[1, 2] = np.nan
    assert not compare(ref, got, atol=1e9, rtol=1e9)["ok"]
    got[1, 2] = np.inf
    assert not compare(ref, got, atol=1e9, rtol=1e9)["ok"]


def test_tolerance_is_applied_elementwise():
    ref = np.array([1.0, 100.0], np.float32)
    stats = compare(ref, ref + np.array([2e-4, 2e-3], np.float32), atol=1e-4, rtol=1e-4)
    assert not stats["ok"] and stats["outside"] == 0.5  # 2e-4 > 1e-4 + 1e-4; 2e-3 < 1e-4 + 1e-2


@pytest.mark.slow
def test_variants_pass_within_their_own_tolerances(cli, tiny_checkpoint, tmp_path):
    out = tmp_path / "variants"
    result = cli("export", tiny_checkpoint, "--out", out, "--fp16", "--optimize", "--quantize", "int8")
    assert result.exit_code == 0, result.output
    m = manifest.load(out)
    assert m.variants() == ["fp32", "fp16", "optimized", "int8"]
    result = cli("verify", out, "--sentences", 4)
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.startswith(("sweep", "decode", "translation"))]
    for v in ("fp16", "optimized", "int8"):
        checked = {r[0] for r in rows if r[2] == v}
        assert checked == {"sweep", "decode", "translation"}, v  # each variant went through every check
        assert all("ok" in r for r in rows if r[2] == v), v
    for graph in ("encoder", "decoder"):
        assert _float_weight_matmuls(out / f"{graph}.int8.onnx") == [], f"{graph}: weights left in float32"


def _float_weight_matmuls(path) -> list[str]:
    """MatMul nodes still multiplying by a stored weight (directly or through Transpose/Reshape)."""
    import onnx

    g = onnx.load(path, load_external_data=False).graph
    weights = {i.name for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}

    def from_weight(name: str) -> bool:
        n = producer.get(name)
        return name in weights or (n is not None and n.op_type in ("Transpose", "Reshape") and from_weight(n.input[0]))

    assert any(n.op_type == "MatMulInteger" for n in g.node)
    return [n.name for n in g.node if n.op_type == "MatMul" and any(from_weight(i) for i in n.input)]


def test_a_gru_model_verifies_without_its_checkpoint(cli, random_export, tmp_path):
    """A fresh clone has no checkpoints; the GRU's biases, which the exporter folds into each
    ONNX GRU node's unnamed bias input, are read back from there (the weights digest proves it)."""
    model_dir = tmp_path / "seq2seq"
    shutil.copytree(random_export("seq2seq"), model_dir)
    d = json.loads((model_dir / "manifest.json").read_text())
    d["checkpoint"] = {"path": str(tmp_path / "not-here.pt"), "sha256": "0", "weights_sha256": d["checkpoint"]["weights_sha256"]}
    (model_dir / "manifest.json").write_text(json.dumps(d))
    result = cli("verify", model_dir, "--sentences", 2)
    assert result.exit_code == 0, result.output
    assert "reference: weights read from the fp32 graphs (checkpoint not on this machine)" in result.output


@pytest.mark.parametrize("name", ["transformer", "seq2seq"])
def test_every_variant_builds_from_the_fp32_graphs_and_verifies(cli, random_export, name):
    """A directory that stores fp32 graphs only (as shipped) still runs and verifies every variant,
    built in memory: the GRU's int8 decoder included, whose folded graph carries stale shapes."""
    result = cli("verify", random_export(name), "--variant", "fp16", "--variant", "optimized", "--variant", "int8")
    assert result.exit_code == 0, result.output
    for v in ("fp16", "optimized", "int8"):
        assert f"{v} graphs: not stored in" in result.output
