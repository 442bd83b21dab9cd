"""The typed manifest: the shipped (version 1) manifests load and save unchanged, and a malformed one
is one error naming the file and the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from toolkit.core import manifest
from toolkit.core.errors import UsageError

SHIPPED = Path(__file__).resolve().parents[2] / "exported"


def _manifest_only(name: str, tmp_path: Path) -> tuple[Path, dict]:
    """A copy of a shipped manifest.json (loading reads only the manifest; the graphs stay where they are)."""
    directory = tmp_path / name
    directory.mkdir()
    shutil.copy(SHIPPED / name / manifest.NAME, directory / manifest.NAME)
    return directory, json.loads((directory / manifest.NAME).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["transformer", "seq2seq", "nw"])
def test_a_shipped_manifest_loads_typed_and_saves_with_the_same_contents(name, tmp_path):
    directory, raw = _manifest_only(name, tmp_path)
    m = manifest.load(directory)
    assert m.version == manifest.VERSION == raw["version"] == 3
    assert m.checkpoint.weights_sha256 == raw["checkpoint"]["weights_sha256"]
    assert {k: r.passed for k, r in m.verification.items()} == {k: v["passed"] for k, v in raw["verify"].items()}
    assert m.training.command == raw["training"]["command"]
    m.save()
    saved = json.loads((directory / manifest.NAME).read_text(encoding="utf-8"))
    # Every section survives the round trip (nw's "tokenizer": null means absent).
    assert saved == {k: v for k, v in raw.items() if v is not None}
    assert manifest.load(directory).to_dict() == saved


def test_a_version_2_manifest_gets_one_verification_record_per_provider(tmp_path):
    """Version 2 held one record for every provider of a run; version 3 keeps one per runtime and provider."""
    directory, raw = _manifest_only("transformer", tmp_path)
    old = {**raw["verify"]["onnxruntime/cpu"]}
    old["worst"] = {**old["worst"], "sweep/fp16/cuda": {"max_abs": 0.002, "checks": 70, "failed": 1}}
    old["environment"] = {**old["environment"], "providers": ["cpu", "cuda"]}
    raw = {**raw, "version": 2, "verify": old}
    (directory / manifest.NAME).write_text(json.dumps(raw), encoding="utf-8")
    m = manifest.load(directory)
    assert set(m.verification) == {"onnxruntime/cpu", "onnxruntime/cuda"}
    assert m.verification["onnxruntime/cpu"].passed and not m.verification["onnxruntime/cuda"].passed
    assert list(m.verification["onnxruntime/cuda"].worst) == ["sweep/fp16/cuda"]
    assert m.verification["onnxruntime/cuda"].failures == 1


@pytest.mark.parametrize("edit,field", [
    (lambda d: d["graphs"]["encoder"].update(colour="blue"), "graphs.encoder.colour"),
    (lambda d: d.update(verdict=True), "verdict"),
    (lambda d: d["verify"]["onnxruntime/cpu"].pop("passed"), "verify.onnxruntime/cpu.passed"),
    (lambda d: d["checkpoint"].update(seed="7"), "checkpoint.seed"),
    (lambda d: d["training"].update(history={}), "training.history"),
    (lambda d: d["variants"].update(int8={"graphs": {"encoder": {"file": "e.onnx", "sha256": "0" * 64, "size": 1},
                                                      "decoder": {"file": "d.onnx", "sha256": "0" * 64}}}),
     "variants.int8.graphs.encoder.size"),
])
def test_an_unknown_missing_or_mistyped_field_is_one_error_naming_the_file_and_field(edit, field, tmp_path):
    directory, raw = _manifest_only("transformer", tmp_path)
    edit(raw)
    (directory / manifest.NAME).write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(UsageError) as e:
        manifest.load(directory)
    message = str(e.value)
    assert f"'{field}'" in message and str(directory / manifest.NAME) in message and "\n" not in message


def test_a_manifest_from_a_newer_tk_is_refused_with_the_fix(tmp_path):
    directory, raw = _manifest_only("nw", tmp_path)
    (directory / manifest.NAME).write_text(json.dumps({**raw, "version": 4}), encoding="utf-8")
    with pytest.raises(UsageError, match="manifest version 4, this tk reads up to 3; upgrade tk"):
        manifest.load(directory)


def test_record_metric_keeps_every_other_section_and_names_the_variant(tmp_path):
    directory, raw = _manifest_only("transformer", tmp_path)
    manifest.record_metric(directory, "evaluation", "int8", {"bleu": 1.0})
    manifest.record_metric(directory, "evaluation", "fp32", {"bleu": 2.0})
    saved = json.loads((directory / manifest.NAME).read_text(encoding="utf-8"))
    assert saved["metrics"]["evaluation_int8"] == {"bleu": 1.0} and saved["metrics"]["evaluation"] == {"bleu": 2.0}
    assert {k: v for k, v in saved.items() if k != "metrics"} == {k: v for k, v in raw.items() if k != "metrics"}
    assert not list(directory.glob(".*.tmp"))  # the atomic write left no temporary file behind


def test_save_refuses_to_write_a_manifest_that_would_not_load(tmp_path):
    directory, raw = _manifest_only("transformer", tmp_path)
    m = manifest.load(directory)
    del m.graphs["decoder"]
    with pytest.raises(ValueError, match="refusing to write"):
        m.save()
    assert json.loads((directory / manifest.NAME).read_text(encoding="utf-8")) == raw


def test_verify_record_stores_the_verdict_it_printed_and_keeps_every_other_section(cli, random_export, tmp_path):
    directory = tmp_path / "model"
    shutil.copytree(random_export("dot_attention"), directory)
    before = manifest.load(directory).to_dict()
    result = cli("verify", directory, "--record")
    assert result.exit_code == 0, result.output
    m = manifest.load(directory)
    passed, total = (int(n) for n in result.output.split(" checks passed")[0].split()[-1].split("/"))
    record = m.verification["onnxruntime/cpu"]
    assert record.passed and (record.checks, record.failures) == (total, total - passed)
    assert record.reference.startswith("random init")
    assert "recorded onnxruntime/cpu in" in result.output
    assert {k: v for k, v in m.to_dict().items() if k != "verify"} == {k: v for k, v in before.items() if k != "verify"}


def test_a_cpu_verify_record_keeps_the_cuda_and_openvino_records(cli, random_export, tmp_path):
    """Verifying on a machine without a GPU must not erase the evidence a GPU machine recorded."""
    directory = tmp_path / "model"
    shutil.copytree(random_export("dot_attention"), directory)
    assert cli("verify", directory, "--record").exit_code == 0
    m = manifest.load(directory)
    cpu = m.verification["onnxruntime/cpu"]
    gpu = manifest.VerificationRecord(**{**cpu.__dict__, "environment": {"gpu": "NVIDIA H100 80GB HBM3", "providers": ["cuda"]},
                                         "worst": {"sweep/fp16/cuda": {"max_abs": 0.001, "checks": 5, "failed": 0}}})
    m.verification["onnxruntime/cuda"] = gpu
    m.verification["openvino/cpu"] = cpu
    m.save()
    result = cli("verify", directory, "--record")
    assert result.exit_code == 0, result.output
    after = manifest.load(directory).verification
    assert set(after) == {"onnxruntime/cpu", "onnxruntime/cuda", "openvino/cpu"}
    assert after["onnxruntime/cuda"] == gpu and after["openvino/cpu"] == cpu
    assert after["onnxruntime/cpu"].seconds >= 0 and after["onnxruntime/cpu"].environment["providers"] == ["cpu"]
