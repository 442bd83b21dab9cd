"""`tk verify --localize` names the node a planted fault is in, and its PyTorch module; a clean graph, at fp32,
fp16 and int8, has no divergent node."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import rehash
from onnx import helper, numpy_helper

from toolkit.core import manifest

# Minutes of work in all: left out of the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow


def _edit_decoder(source: Path, tmp_path: Path, change) -> tuple[Path, str]:
    """A copy of the model whose decoder.onnx `change(graph)` edited; returns it and the planted node's name."""
    directory = tmp_path / "model"
    shutil.copytree(source, directory)
    model = onnx.load(directory / "decoder.onnx", load_external_data=False)
    planted = change(model.graph)
    onnx.save_model(model, directory / "decoder.onnx")
    rehash(directory)
    return directory, planted


def _localized(cli, directory: Path, tmp_path: Path, *args) -> tuple[object, dict]:
    report = tmp_path / "report.json"
    result = cli("verify", directory, "--sentences", 0, "--json", report, *args)
    return result, json.loads(report.read_text())["localization"]


def _node(graph, op: str, index: int = 0):
    return [n for n in graph.node if n.op_type == op][index]


def _leaky_relu(graph, index: int = 1) -> str:
    """Plants the fault of several tests: the second ReLU turned into a LeakyReLU; returns its node's name."""
    node = _node(graph, "Relu", index)
    node.op_type = "LeakyRelu"
    node.attribute.append(helper.make_attribute("alpha", 0.1))
    return node.name


@pytest.fixture(scope="module")
def model(random_export) -> Path:
    return random_export("transformer")


def test_a_changed_softmax_axis_is_named(cli, model, tmp_path):
    def change(graph):
        node = _node(graph, "Softmax")
        next(a for a in node.attribute if a.name == "axis").i = 1
        return node.name

    directory, planted = _edit_decoder(model, tmp_path, change)
    result, loc = _localized(cli, directory, tmp_path)
    assert result.exit_code == 1
    assert loc["first"]["node"] == planted and loc["first"]["op"] == "Softmax"
    assert loc["first"]["module"].startswith("decoder_blocks.0.self_attention") and loc["first"]["source"].startswith("models/attention.py:")
    line = next(x for x in result.output.splitlines() if x.startswith("first divergent node:"))
    assert f"first divergent node: {planted} (Softmax) in decoder_blocks.0.self_attention" in line
    assert loc["downstream_failed"] > 0


def test_a_relu_turned_leaky_is_named(cli, model, tmp_path):
    directory, planted = _edit_decoder(model, tmp_path, _leaky_relu)
    result, loc = _localized(cli, directory, tmp_path)
    assert result.exit_code == 1
    assert loc["first"]["node"] == planted and loc["first"]["module"] == "decoder_blocks.1.ffn.relu"


def test_a_scale_constant_changed_in_one_attention_layer_is_named(cli, model, tmp_path):
    def change(graph):
        node = _node(graph, "Div", 2)  # the third scaled dot product: the second layer's self-attention
        scale = next(i for i in graph.initializer if i.name == node.input[1])
        changed = numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(1.5), name="planted_scale")
        graph.initializer.append(changed)
        node.input[1] = "planted_scale"
        return node.name

    directory, planted = _edit_decoder(model, tmp_path, change)
    result, loc = _localized(cli, directory, tmp_path)
    assert result.exit_code == 1
    assert loc["first"]["node"] == planted and loc["first"]["op"] == "Div"
    assert loc["first"]["module"].startswith("decoder_blocks.1.self_attention")


def test_a_cache_position_off_by_one_is_named(cli, model, tmp_path, monkeypatch):
    """Exported from a model whose positional encoding was shifted by one, compared with the model as it is."""
    from toolkit.models import attention

    from toolkit.pytorch.export import ExportOptions, export

    real = attention.PositionalEncoding.forward
    monkeypatch.setattr(attention.PositionalEncoding, "forward", lambda self, x, offset=None: real(self, x, None if offset is None else offset + 1))
    shifted = export(ExportOptions(out=tmp_path / "shifted", model="transformer", random_init=True), echo=lambda m: None)
    monkeypatch.setattr(attention.PositionalEncoding, "forward", real)
    result, loc = _localized(cli, shifted, tmp_path)
    assert result.exit_code == 1
    assert loc["graph"] == "decoder" and loc["first"]["module"] == "pos_encoding"


def test_a_layer_whose_fp16_values_overflow_is_named(cli, tiny_export, tmp_path):
    """Weights scaled until one layer's outputs exceed float16's range: fp32 passes, fp16 fails at that layer.
    (A trained model: every weight is a named initializer, so the reference is rebuilt from the graphs.)"""
    from toolkit.pytorch import checkpoint, registry
    from toolkit.pytorch.reference import weights_from_graphs

    directory = tmp_path / "big"
    shutil.copytree(tiny_export, directory)
    graph = onnx.load(directory / "decoder.onnx", load_external_data=False).graph
    weight = next(i for i in graph.initializer if i.name == "model.decoder_blocks.0.ffn.dense1.weight")
    offset, length = (int({e.key: e.value for e in weight.external_data}[k]) for k in ("offset", "length"))
    blob = bytearray((directory / "weights.bin").read_bytes())
    blob[offset: offset + length] = (np.frombuffer(blob, np.float32, length // 4, offset) * np.float32(2_000_000)).tobytes()
    (directory / "weights.bin").write_bytes(bytes(blob))
    rehash(directory)
    d = json.loads((directory / "manifest.json").read_text())
    m = manifest.load(directory)
    entry = registry.get("transformer")
    d["checkpoint"] = {"weights_sha256": checkpoint.weights_sha256(weights_from_graphs(m, entry, entry.config(**d["config"])))}
    (directory / "manifest.json").write_text(json.dumps(d))
    assert cli("verify", directory, "--sentences", 0, "--variant", "fp32").exit_code == 0
    result, loc = _localized(cli, directory, tmp_path, "--variant", "fp16")
    assert result.exit_code == 1
    assert loc["variant"] == "fp16" and loc["first"]["module"].startswith("decoder_blocks.0.ffn")
    assert not np.isfinite(loc["first"]["max_abs"]) or loc["first"]["max_abs"] > 100


@pytest.mark.parametrize("variant", ["fp32", "fp16", "int8"])
def test_a_clean_graph_has_no_divergent_node(cli, model, tmp_path, variant):
    result, loc = _localized(cli, model, tmp_path, "--variant", variant, "--localize")
    assert result.exit_code == 0, result.output
    assert loc["first"] is None and loc["variant"] == variant and loc["compared"] >= 20
    assert "no divergent node" in result.output


def test_no_localize_turns_it_off_and_the_picture_is_drawn(cli, model, tmp_path):
    directory, _ = _edit_decoder(model, tmp_path, lambda graph: _leaky_relu(graph, 0))
    result, loc = _localized(cli, directory, tmp_path, "--no-localize")
    assert result.exit_code == 1 and loc is None and "first divergent node" not in result.output
    picture = tmp_path / "loc.png"
    result, loc = _localized(cli, directory, tmp_path, "--localize-plot", picture)
    assert result.exit_code == 1 and picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_when_localizing_fails_the_verdict_stands_and_says_why(cli, model, tmp_path, monkeypatch):
    from toolkit.verify import localize

    def cannot_trace(*args, **kwargs):
        raise RuntimeError("torch.export could not trace this model")

    monkeypatch.setattr(localize, "traced_program", cannot_trace)
    directory, _ = _edit_decoder(model, tmp_path, lambda graph: _leaky_relu(graph, 0))
    result, loc = _localized(cli, directory, tmp_path)
    assert result.exit_code == 1 and loc is None and "Traceback" not in result.output
    assert "localize: not available for this case (torch.export could not trace this model)" in result.output


def test_a_fault_in_one_variant_is_named_against_another_without_pytorch(cli, model, tmp_path, monkeypatch):
    """--localize-against compares two executions of the graphs (here the stored optimized graphs against the
    fp32 ones on ONNX Runtime), node by node, with no PyTorch trace at all."""
    from toolkit.verify import localize

    directory = tmp_path / "model"
    shutil.copytree(model, directory)
    assert cli("export", directory, "--optimize").exit_code == 0
    optimized = directory / "decoder.opt.onnx"
    graph = onnx.load(optimized)
    node = _node(graph.graph, "Relu", 1)
    node.op_type = "LeakyRelu"
    node.attribute.append(helper.make_attribute("alpha", 0.1))
    onnx.save_model(graph, optimized)
    rehash(directory)
    monkeypatch.setattr(localize, "traced_program", lambda *a, **k: pytest.fail("PyTorch was traced"))
    result, loc = _localized(cli, directory, tmp_path, "--variant", "optimized", "--localize-against", "onnxruntime/cpu/fp32")
    assert result.exit_code == 1
    assert loc["against"] == "onnxruntime/cpu/fp32" and loc["first"]["node"] == node.name and loc["first"]["op"] == "LeakyRelu"
    assert "sha256" not in result.output  # the files check passed: only the numbers reveal the fault
    line = next(x for x in result.output.splitlines() if x.startswith("first divergent node:"))
    assert "against onnxruntime/cpu/fp32" in line


def test_clean_int8_against_fp32_has_no_divergent_node(cli, model, tmp_path):
    result, loc = _localized(cli, model, tmp_path, "--variant", "int8", "--localize-against", "fp32")
    assert result.exit_code == 0, result.output
    assert loc["first"] is None and loc["against"] == "onnxruntime/cpu/fp32" and loc["compared"] >= 10


def test_a_bad_localize_against_is_one_line(cli, model):
    result = cli("verify", model, "--localize-against", "tensorrt/gpu/fp32")
    assert result.exit_code == 2 and "RUNTIME/PROVIDER/VARIANT" in result.output and "Traceback" not in result.output


def test_the_report_carries_the_error_of_every_decode_step(cli, tmp_path):
    """Along real decodes, the log-probabilities' error at each step goes with the localization (and its
    picture's second panel): small at every step for a clean model, large for one with a leaky ReLU."""
    shipped = Path(__file__).resolve().parents[2] / "exported" / "transformer"
    report = tmp_path / "clean.json"
    result = cli("verify", shipped, "--sentences", 2, "--localize", "--json", report)
    assert result.exit_code == 0, result.output
    clean = json.loads(report.read_text())["localization"]["step_errors"]
    assert len(clean) >= 3 and max(clean) < 1e-3

    directory, _ = _edit_decoder(shipped, tmp_path, _leaky_relu)
    picture = tmp_path / "steps.png"
    report = tmp_path / "leaky.json"
    result = cli("verify", directory, "--sentences", 2, "--json", report, "--localize-plot", picture)
    assert result.exit_code == 1
    leaky = json.loads(report.read_text())["localization"]["step_errors"]
    assert len(leaky) >= 1 and max(leaky) > 0.01 and picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
