"""A fault planted in an imported model's exported decoder (a swapped activation, a dropped bias) fails
`tk verify OUT --checkpoint hf:DIR` (exit 1), and --localize names the transformers module it is in, for every
architecture tk imports from Hugging Face.

Each architecture is one row of ARCHITECTURES: how to build a tiny directory of it (no download), where its last decoder
layer's activation and output projection live in transformers' module tree (T5 has no biases: its activation only).
The directories are the ones the architectures' own test modules build (built_once, shared by name).
The planted node is found through the export's own node map (decoder.nodes.json), the way --localize reads it, so the
test plants exactly where the module's computation is, whatever ops the exporter chose.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import built_once
from hf_marian_fixture import fra_eng_lines
from onnx import numpy_helper
from verify.test_localize import _edit_decoder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass(frozen=True)
class Architecture:
    name: str
    build: Callable[[Path, list], Path]  # writes a trained tiny Hugging Face directory; returns it
    layer: str  # the decoder layer's module path, {i} for its index
    activation: str  # the activation's module under the layer
    bias: str | None  # a Linear under the layer whose bias is dropped (None: the architecture has no biases)


def _marian(path: Path, pairs: list) -> Path:
    from hf_marian_fixture import marian_directory

    return marian_directory(path, pairs[:400])  # swish, as opus-mt's: tests/pytorch/test_hf_marian.py's shared-swish


def _m2m100(path: Path, pairs: list) -> Path:
    from hf_seq2seq_fixture import m2m100_directory

    return m2m100_directory(path, pairs[:400])


def _mbart(path: Path, pairs: list) -> Path:
    from pytorch.test_hf_mbart import mbart_directory

    return mbart_directory(path, pairs[:400], "mbart50")


def _t5(path: Path, pairs: list) -> Path:
    from pytorch.test_hf_t5 import t5_directory

    return t5_directory(path, pairs[:400], mt5=False)


ARCHITECTURES = [
    Architecture("marian", _marian, "model.decoder.layers.{i}", "activation_fn", "fc2"),
    Architecture("m2m100", _m2m100, "model.decoder.layers.{i}", "activation_fn", "fc2"),
    Architecture("mbart", _mbart, "model.decoder.layers.{i}", "activation_fn", "fc2"),
    Architecture("t5", _t5, "decoder.block.{i}.layer.2.DenseReluDense", "act", None),
]
# The directory each is built in: the name its own test module gives it, so one build serves both.
BUILT_AS = {"m2m100": "hf-m2m100", "mbart": "hf-mbart-mbart50", "t5": "hf-t5", "marian": "hf-marian-shared-swish"}
CASES = [pytest.param(a, fault, id=f"{a.name}-{fault}") for a in ARCHITECTURES for fault in ("activation", "bias")
         if fault == "activation" or a.bias is not None]
# What an activation's node becomes: another activation of the same shape, so the graph still runs and only its values
# are wrong (Gelu's "approximate" attribute is dropped with it).
SWAPPED = {"Relu": "Tanh", "Sigmoid": "Tanh", "Erf": "Tanh", "Tanh": "Sigmoid", "Gelu": "Tanh"}


@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    return fra_eng_lines(corpus_zip, 2000)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, pairs):
    """arch -> (Hugging Face directory, tk model directory), each built once per run (m2m100's shared with the other
    modules that build the same directory)."""
    cache: dict[str, tuple[Path, Path]] = {}

    def get(arch: Architecture) -> tuple[Path, Path]:
        if arch.name not in cache:
            cache[arch.name] = exported_directory(tmp_path_factory, pairs, arch)
        return cache[arch.name]

    return get


def exported_directory(tmp_path_factory, pairs, arch: Architecture) -> tuple[Path, Path]:
    """(Hugging Face directory, tk model directory exported from it with `tk export hf:DIR`), built once per run under
    the name the architecture's own test module gives it."""
    from click.testing import CliRunner

    from toolkit.cli import main

    def build(root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arch.build(root / "hf", pairs)
        result = CliRunner().invoke(main, ["export", f"hf:{root / 'hf'}", "--out", str(root / "tk")])
        assert result.exit_code == 0, result.output

    root = built_once(tmp_path_factory, BUILT_AS[arch.name], build)
    return root / "hf", root / "tk"


def _modules(out: Path) -> dict[str, str]:
    """The decoder's node -> the transformers module it computes (the export's node map)."""
    return {node: origin[0] for node, origin in json.loads((out / "decoder.nodes.json").read_text()).items()}


def _last_layer(out: Path, arch: Architecture) -> str:
    return arch.layer.format(i=json.loads((out / "manifest.json").read_text())["config"]["decoder_layers"] - 1)


def swap_activation(module: str, modules: dict[str, str]):
    """The module's activation node turned into another activation."""
    def change(graph) -> str:
        node = next(n for n in graph.node if modules.get(n.name) == module and n.op_type in SWAPPED)
        node.op_type = SWAPPED[node.op_type]
        del node.attribute[:]
        return node.name
    return change


def drop_bias(module: str, modules: dict[str, str]):
    """The module's bias addition given zeros instead of the bias: the Linear computes x W^T alone."""
    def change(graph) -> str:
        shapes = {i.name: tuple(i.dims) for i in graph.initializer}
        node = next(n for n in graph.node if modules.get(n.name) == module and n.op_type == "Add"
                    and any(name.endswith(".bias") and name in shapes for name in n.input))
        k = next(k for k, name in enumerate(node.input) if name.endswith(".bias") and name in shapes)
        graph.initializer.append(numpy_helper.from_array(np.zeros(shapes[node.input[k]], np.float32), name="planted_no_bias"))
        node.input[k] = "planted_no_bias"
        return node.name
    return change


def _verify(cli, directory: Path, hf: Path, report: Path, *args):
    result = cli("verify", directory, "--checkpoint", f"hf:{hf}", "--sentences", 2, "--json", report, *args)
    return result, json.loads(report.read_text())


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: a.name)
def test_the_clean_export_passes(cli, exported, arch, tmp_path):
    """The control: what fails below fails for the planted fault, not for the architecture."""
    hf, out = exported(arch)
    result, report = _verify(cli, out, hf, tmp_path / "report.json")
    assert result.exit_code == 0, result.output
    assert report["passed"] and report["localization"] is None


@pytest.mark.parametrize("arch, fault", CASES)
def test_a_planted_fault_fails_verify_and_localize_names_its_module(cli, exported, arch, fault, tmp_path):
    hf, out = exported(arch)
    modules = _modules(out)
    module = f"{_last_layer(out, arch)}.{arch.activation if fault == 'activation' else arch.bias}"
    plant = (swap_activation if fault == "activation" else drop_bias)(module, modules)
    directory, planted = _edit_decoder(out, tmp_path, plant)
    assert modules[planted] == module  # planted where the module's computation is
    result, report = _verify(cli, directory, hf, tmp_path / "report.json", "--localize")
    assert result.exit_code == 1, result.output
    assert not report["passed"] and report["failures"]
    first = report["localization"]["first"]
    assert first["module"] == module, first
    assert modules[first["node"]] == module  # the node named is one of that module's
    assert f"first divergent node: {first['node']}" in result.output


def test_a_generate_that_fails_is_a_failed_row_naming_transformers_not_an_internal_error(cli, exported, tmp_path, monkeypatch):
    """transformers 5.17's beam search failed on a Marian model of two vocabularies (a reshape by vocab_size, seen on
    an H100 lease): verify must say that the reference could not be computed, not crash as tk's own error."""
    import transformers
    from transformers.generation.utils import GenerationMixin

    hf, out = exported(ARCHITECTURES[0])
    real = GenerationMixin.generate

    def failing(self, *args, **kwargs):
        if kwargs.get("num_beams", 1) > 1:
            raise RuntimeError("shape '[8, 1128]' is invalid for input of size 1288")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", failing)
    result, report = _verify(cli, out, hf, tmp_path / "report.json")
    assert result.exit_code == 1, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    failed = [r for r in report["rows"] if not r["ok"]]
    assert [r["output"] for r in failed] == ["beam 4 tokens"], failed
    assert f"transformers {transformers.__version__}'s generate(num_beams=4) failed" in failed[0]["detail"]
    greedy = [r for r in report["rows"] if r["check"] == "generate" and r["output"] == "greedy tokens"]
    assert greedy and all(r["ok"] for r in greedy)  # the greedy comparison still ran
