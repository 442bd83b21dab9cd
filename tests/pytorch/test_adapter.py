"""Your own PyTorch model in: the worked example (docs/examples/nn_transformer.py, torch.nn.Transformer layers) trained
briefly on fra-eng, exported with `tk export FILE.py:build`, verified, translated, served; and the contract's refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import one_line_error
from verify.test_localize import _edit_decoder, _leaky_relu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "nn_transformer.py"


def _example():
    import importlib.util

    spec = importlib.util.spec_from_file_location("nn_transformer_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus_zip) -> Path:
    """The example trained for 4 s on 4,000 pairs (the docs train it for a minute on all of them)."""
    out = tmp_path_factory.mktemp("nn-transformer") / "run"
    _example().train(out, corpus_zip, seconds=4, d=64, vocab=800, limit=4000)
    return out


@pytest.fixture()
def target(run, monkeypatch) -> str:
    monkeypatch.setenv("TK_EXAMPLE_RUN", str(run))
    return f"{EXAMPLE}:build"


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory) -> Path:
    """Exported with the Python API (the README's example runs `tk export FILE.py:build` itself)."""
    import os

    from toolkit import export_model

    out = tmp_path_factory.mktemp("exported") / "nn-transformer"
    old = os.environ.get("TK_EXAMPLE_RUN")
    os.environ["TK_EXAMPLE_RUN"] = str(run)
    try:
        assert export_model(f"{EXAMPLE}:build", out) == out
    finally:
        if old is None:
            del os.environ["TK_EXAMPLE_RUN"]
        else:
            os.environ["TK_EXAMPLE_RUN"] = old
    return out


def test_verify_passes_with_the_reference_given(cli, target, exported, tmp_path):
    report = tmp_path / "report.json"
    result = cli("verify", exported, "--checkpoint", target, "--json", report)
    assert result.exit_code == 0, result.output
    rows = json.loads(report.read_text())["rows"]
    assert {r["check"] for r in rows} >= {"static", "sweep", "decode", "translation"} and all(r["ok"] for r in rows)


def test_verify_without_the_reference_imports_nothing_and_says_what_to_give(cli, exported, tmp_path):
    """A manifest names the function it came from; tk never imports it on the manifest's word."""
    marker = tmp_path / "imported"
    spy = tmp_path / "spy.py"
    spy.write_text(f"from pathlib import Path\nPath({str(marker)!r}).touch()\n\ndef build():\n    pass\n")
    directory = tmp_path / "named"
    shutil.copytree(exported, directory)
    data = json.loads((directory / "manifest.json").read_text())
    data["config"]["target"] = data["checkpoint"]["path"] = f"{spy}:build"
    (directory / "manifest.json").write_text(json.dumps(data))
    for command in (("verify", directory), ("translate", "--model", directory, "--backend", "torch", "Hello.")):
        assert f"give it yourself with --checkpoint {spy}:build" in one_line_error(cli(*command), 2)
    assert not marker.exists()


def test_a_planted_fault_fails_verify_and_localize_names_your_module(cli, target, exported, tmp_path):
    # The last ReLU of the decoder: its last layer's feed-forward activation.
    directory, planted = _edit_decoder(exported, tmp_path, lambda graph: _leaky_relu(graph, -1))
    report = tmp_path / "report.json"
    result = cli("verify", directory, "--checkpoint", target, "--sentences", 4, "--json", report)
    assert result.exit_code == 1, result.output
    first = json.loads(report.read_text())["localization"]["first"]
    assert first["node"] == planted and first["module"].startswith("decoder.layers.1")


def test_it_translates_torch_free_and_serves(exported, assert_torch_free, tmp_path):
    import httpx  # noqa: F401 (the serve extra)

    from toolkit.deploy.translate import open_model
    from toolkit.serve.app import ServeConfig

    source = tmp_path / "in.txt"
    source.write_text("I'm home.\nWhere is the station?\n", encoding="utf-8")
    assert_torch_free("translate", "--model", exported, "-i", source, "-o", tmp_path / "fr.txt", "--beam", 4)
    french = (tmp_path / "fr.txt").read_text(encoding="utf-8").splitlines()
    assert len(french) == 2 and all(french)
    from serve.test_serve import running, wait_ready

    model = open_model(exported, "cpu")
    with running(lambda: model, ServeConfig()) as client:
        wait_ready(client)
        answer = client.post("/v1/translate", json={"text": ["I'm home.", "Where is the station?"], "beam": 4})
    assert answer.status_code == 200 and answer.json()["translations"] == french


@pytest.mark.parametrize("body, expected", [
    ("def build():\n    return 42\n", "returned int, not a toolkit.Seq2SeqAdapter"),
    ("raise ImportError('no module named my_dependency')\n", "cannot import"),
    ("def build():\n    raise RuntimeError('weights not found')\n", "build() failed: RuntimeError: weights not found"),
    ("import torch\nfrom toolkit import Seq2SeqAdapter\n"
     "def build():\n    return Seq2SeqAdapter(torch.nn.Linear(2, 2), 't.model', {'memory': ('batch', 'src_len', 2)}, {'p': ('batch', 2)}, 8, 8)\n",
     "the model has no encode method"),
])
def test_a_function_that_breaks_the_contract_is_one_line(cli, tmp_path, body, expected):
    module = tmp_path / "mine.py"
    module.write_text(body)
    assert expected in one_line_error(cli("export", f"{module}:build", "--out", tmp_path / "out"), 2)
    assert not (tmp_path / "out").exists()


def test_a_prefix_declared_fixed_is_refused_with_its_shapes(cli, tmp_path, run, monkeypatch):
    """Fixed-shape states are accepted (an RNN's hidden state, tests/pytorch/test_textbook_adapters.py); a prefix
    declared as one still grows, and the example batch says so."""
    module = tmp_path / "flat.py"
    module.write_text(EXAMPLE.read_text().replace('decoder_state={"prefix": ("batch", "past_len")}', 'decoder_state={"prefix": ("batch", 4)}'))
    monkeypatch.setenv("TK_EXAMPLE_RUN", str(run))
    line = one_line_error(cli("export", f"{module}:build", "--out", tmp_path / "o"), 2)
    assert "returned prefix of shape (3, 5) on an example batch, expected (batch=3, 4)" in line


def test_openvino_translates_as_onnx_runtime(cli, exported):
    """docs/models.md's OpenVINO cell for your own model: OpenVINO's CPU plugin gives ONNX Runtime's text."""
    pytest.importorskip("openvino", reason="the openvino extra (in dev) installs it")
    args = ("translate", "--model", exported, "--variant", "fp32", "I'm home.", "Where is the station?", "He's calm.")
    openvino, onnxruntime = cli(*args, "--runtime", "openvino"), cli(*args)
    assert openvino.exit_code == 0 and onnxruntime.exit_code == 0, openvino.output + onnxruntime.output
    # One line per input (a briefly trained model may translate one to nothing): the same on both runtimes.
    assert openvino.stdout.splitlines() == onnxruntime.stdout.splitlines() and len(onnxruntime.stdout.splitlines()) == 3
