"""The int8 layer table (`tk verify --int8-layers`) and accuracy-guarded int8 (`tk export --quantize int8 --keep-fp32 auto`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from toolkit.core import manifest
from toolkit.graphs.variants import float_layers as weight_layers
from toolkit.graphs.variants import fold_for_int8, int8_graph, int8_layers
from toolkit.verify import int8_layers as layers

# Minutes of work in all: left out of the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

SHIPPED = Path(__file__).resolve().parents[2] / "exported"
SENTENCES = ["I'm home.", "Where is the station?", "The cat is sleeping.", "We have to go now.", "It is raining.",
             "She reads a book.", "Call me tomorrow.", "I like apples."]


@pytest.fixture()
def seq2seq(tmp_path) -> Path:
    out = tmp_path / "seq2seq"
    shutil.copytree(SHIPPED / "seq2seq", out)
    return out


def folded_graph(directory: Path, graph: str, tmp: Path) -> tuple[Path, Path]:
    whole = tmp / f"{graph}.whole.onnx"
    onnx.save_model(onnx.load(str(directory / f"{graph}.onnx")), whole)
    return whole, fold_for_int8(whole, tmp / f"{graph}.folded.onnx")


def float_layers(path: Path) -> set[str]:
    """The quantisable layers of a graph that are still float (a quantised Gather stays a Gather, on int8 data)."""
    return {n for n, _ in weight_layers(path)}


def test_kept_layers_stay_float_and_the_others_become_int8(seq2seq, tmp_path):
    whole, folded = folded_graph(seq2seq, "decoder", tmp_path)
    names = [n for n, _ in int8_layers(folded)]
    assert len(names) >= 3
    keep = names[0]
    int8_graph(whole, tmp_path / "plain.onnx", folded=folded)
    untouched = float_layers(tmp_path / "plain.onnx")  # what the quantiser passes over in every variant
    assert not untouched & set(names)
    int8_graph(whole, tmp_path / "keep.onnx", keep_fp32=[keep], folded=folded)
    assert float_layers(tmp_path / "keep.onnx") == untouched | {keep}
    int8_graph(whole, tmp_path / "only.onnx", only=[keep], folded=folded)
    assert float_layers(tmp_path / "only.onnx") == untouched | (set(names) - {keep})


def test_module_names_of_fused_projections():
    assert layers._join_modules(["d.0.self.W_k", "d.0.self.W_v", "d.0.self.W_q"]) == "d.0.self.W_k+W_v+W_q"
    assert layers._join_modules(["d.0.cross.W_k", "d.0.cross.W_v", "d.1.cross.W_k", "d.1.cross.W_v"]) == "d.*.cross.W_k+W_v"
    assert layers._join_modules(["e.ffn.dense1"]) == "e.ffn.dense1"
    assert layers._join_modules(["embedding"]) == "embedding"


def test_the_table_ranks_a_layer_with_planted_outliers_first(seq2seq):
    """Outliers in every row of one weight make its per-channel int8 scale coarse for everything else in the row:
    that layer must top the table, named by its PyTorch module."""
    path = seq2seq / "decoder.onnx"
    model = onnx.load(str(path))
    init = next(i for i in model.graph.initializer if i.name == "model.decoder.attention.W_q.weight")
    w = numpy_helper.to_array(init).copy()
    w[:, 0] = 40 * np.abs(w).max()  # one huge input weight per output unit, on an input that is often near zero
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    onnx.save_model(model, str(path))  # self-contained; the table reads the graphs, not their digests
    table = layers.layer_table(manifest.load(seq2seq), SENTENCES)
    assert table[0].module == "decoder.attention.W_q" and table[0].graph == "decoder"
    assert [r.mean_abs for r in table] == sorted((r.mean_abs for r in table), reverse=True)
    assert {r.module for r in table} >= {"encoder.embedding", "decoder.embedding", "decoder.attention.W_k"}


def test_auto_keep_takes_the_fewest_worst_layers_that_pass():
    table = [layers.LayerError("decoder", f"n{i}", f"m{i}", 1.0 / (i + 1), 0.0, 0.0) for i in range(5)]
    tried = []

    def accept(plan):
        tried.append(sorted(plan.get("decoder", [])))
        return len(tried) == 3

    assert layers.auto_keep(table, accept) == {"decoder": ["n0", "n1"]}
    assert tried == [[], ["n0"], ["n0", "n1"]]
    assert layers.auto_keep(table, lambda plan: False) == {"decoder": [f"n{i}" for i in range(5)]}


@pytest.mark.timeout(300)
def test_guarded_int8_export_keeps_what_it_says_and_passes_verify(cli, seq2seq, tmp_path):
    """With no BLEU to spare, the guarded export stores int8 graphs whose kept layers are float, says which in
    the manifest, and those graphs pass `tk verify --variant int8`."""
    result = cli("export", seq2seq, "--quantize", "int8", "--keep-fp32", "auto", "--bleu-within", "0")
    assert result.exit_code == 0, result.output
    note = manifest.load(seq2seq).stored["int8"].note
    assert "--keep-fp32 auto" in note
    _, folded = folded_graph(seq2seq, "decoder", tmp_path)
    labels = layers._labels(folded, json.loads((seq2seq / "decoder.nodes.json").read_text()))
    int8_graph(folded, tmp_path / "plain.onnx", folded=folded)
    untouched = float_layers(tmp_path / "plain.onnx")
    assert float_layers(seq2seq / "decoder.int8.onnx") == untouched | {node for node, module in labels.items() if module in note}
    verified = cli("verify", seq2seq, "--variant", "int8", "--sentences", "4", "--no-localize")
    assert verified.exit_code == 0, verified.output


def test_keep_fp32_needs_int8_on_an_exported_directory(cli, seq2seq):
    result = cli("export", seq2seq, "--keep-fp32", "auto")
    assert result.exit_code == 2 and "--quantize int8 --keep-fp32 auto" in result.output and "Traceback" not in result.output


@pytest.mark.timeout(300)
def test_verify_prints_and_writes_the_int8_layer_table(cli, seq2seq, tmp_path):
    out = tmp_path / "report.json"
    result = cli("verify", seq2seq, "--variant", "int8", "--int8-layers", "--sentences", "2", "--json", out)
    assert result.exit_code == 0, result.output
    assert "decoder.attention.W_q" in result.output and "all int8" in result.output
    table = json.loads(out.read_text())["int8_layers"]
    assert len(table["layers"]) >= 5 and table["all_int8"]["mean_abs"] > 0
