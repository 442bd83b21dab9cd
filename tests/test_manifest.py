"""The typed manifest: the shipped (version 1) manifests load and save unchanged, and a malformed one
is one error naming the file and the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from toolkit import manifest
from toolkit.errors import UsageError

SHIPPED = Path(__file__).resolve().parents[1] / "exported"


def _manifest_only(name: str, tmp_path: Path) -> tuple[Path, dict]:
    """A copy of a shipped manifest.json (loading reads only the manifest; the graphs stay where they are)."""
    directory = tmp_path / name
    directory.mkdir()
    shutil.copy(SHIPPED / name / manifest.NAME, directory / manifest.NAME)
    return directory, json.loads((directory / manifest.NAME).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["transformer", "seq2seq", "nw"])
def test_a_shipped_version_1_manifest_loads_typed_and_saves_as_version_2_with_the_same_contents(name, tmp_path):
    directory, raw = _manifest_only(name, tmp_path)
    assert "version" not in raw  # the layout the shipped models were exported with
    m = manifest.load(directory)
    assert m.version == manifest.VERSION == 2
    assert m.checkpoint.weights_sha256 == raw["checkpoint"]["weights_sha256"]
    assert m.verification.passed is raw["verify"]["passed"]
    assert m.training.command == raw["training"]["command"]
    m.save()
    saved = json.loads((directory / manifest.NAME).read_text(encoding="utf-8"))
    # Every section survives the round trip; only the version is new (and nw's "tokenizer": null, which means absent).
    assert saved == {**{k: v for k, v in raw.items() if v is not None}, "version": 2}
    assert manifest.load(directory).to_dict() == saved


@pytest.mark.parametrize("edit,field", [
    (lambda d: d["graphs"]["encoder"].update(colour="blue"), "graphs.encoder.colour"),
    (lambda d: d.update(verdict=True), "verdict"),
    (lambda d: d["verify"].pop("passed"), "verify.passed"),
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
    (directory / manifest.NAME).write_text(json.dumps({**raw, "version": 3}), encoding="utf-8")
    with pytest.raises(UsageError, match="manifest version 3, this tk reads up to 2; upgrade tk"):
        manifest.load(directory)


def test_record_metric_keeps_every_other_section_and_names_the_variant(tmp_path):
    directory, raw = _manifest_only("transformer", tmp_path)
    manifest.record_metric(directory, "evaluation", "int8", {"bleu": 1.0})
    manifest.record_metric(directory, "evaluation", "fp32", {"bleu": 2.0})
    saved = json.loads((directory / manifest.NAME).read_text(encoding="utf-8"))
    assert saved["metrics"]["evaluation_int8"] == {"bleu": 1.0} and saved["metrics"]["evaluation"] == {"bleu": 2.0}
    assert {k: v for k, v in saved.items() if k not in ("metrics", "version")} == {k: v for k, v in raw.items() if k != "metrics"}
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
    assert m.verification.passed and (m.verification.checks, m.verification.failures) == (total, total - passed)
    assert m.verification.reference.startswith("random init")
    assert {k: v for k, v in m.to_dict().items() if k != "verify"} == {k: v for k, v in before.items() if k != "verify"}
