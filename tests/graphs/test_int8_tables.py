"""The int8 variant keeps one int8 copy of a table that the decoder both looks up and multiplies by (an embedding tied
to its output layer), and the lookup still returns that table's rows."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from toolkit.graphs.variants import int8_graph

pytestmark = pytest.mark.timeout(120)

VOCAB, WIDTH = 300, 32


def _decoder_like(path, table: np.ndarray, weight: np.ndarray) -> None:
    """ids (batch, 1) -> their rows of `table`; hidden (batch, width) -> hidden @ weight (the output layer)."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], name="lookup"),
         helper.make_node("MatMul", ["hidden", "weight"], ["logits"], name="output_layer")],
        "decoder_like",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 1]),
         helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["batch", 1, WIDTH]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", VOCAB])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(weight, "weight")])
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)


def _table_copies(path) -> int:
    return sum(int(np.prod(i.dims)) == VOCAB * WIDTH for i in onnx.load(path).graph.initializer)


def _optimized_ops(path, tmp_path) -> list[str]:
    """The op types of the graph as ONNX Runtime's CPU session runs it."""
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "as_run.onnx")
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(tmp_path / "as_run.onnx").graph.node]


def test_a_tied_table_is_stored_once_and_looked_up_per_row(tmp_path):
    rng = np.random.default_rng(0)
    # Rows of very different sizes: one scale for the whole table would round the small rows to nothing.
    table = (rng.standard_normal((VOCAB, WIDTH)) * rng.uniform(0.01, 3.0, (VOCAB, 1))).astype(np.float32)
    src, dst = tmp_path / "tied.onnx", tmp_path / "tied.int8.onnx"
    _decoder_like(src, table, np.ascontiguousarray(table.T))
    int8_graph(src, dst)
    assert _table_copies(dst) == 1
    # Stored vocabulary-major and looked up whole rows at a time: stored the output layer's way round, each id read
    # one byte from each of d_model places (1.8 ms of a 37 ms opus-mt-sized step at 64 rows, against 0.04 ms).
    graph = onnx.load(dst).graph
    (stored,) = [i for i in graph.initializer if int(np.prod(i.dims)) == VOCAB * WIDTH]
    assert tuple(stored.dims) == (VOCAB, WIDTH)
    lookups = [n for n in graph.node if n.op_type == "Gather" and n.input[0] == stored.name]
    assert len(lookups) == 1 and all(a.i == 0 for a in lookups[0].attribute if a.name == "axis")
    # The output layer multiplies by the table's Transpose, which the session folds into a constant once: a Transpose
    # left in the graph as run would transpose the whole table at every decoder step.
    assert "Transpose" not in _optimized_ops(dst, tmp_path)

    session = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    ids = rng.integers(0, VOCAB, (16, 1))
    hidden = rng.standard_normal((16, WIDTH)).astype(np.float32)
    rows, logits = session.run(None, {"ids": ids, "hidden": hidden})
    want = table[ids]
    # Per row, 7-bit: each value within half a step of its row's own scale (max |row| / 63).
    step = np.abs(want).max(axis=-1, keepdims=True) / 63
    assert rows.shape == want.shape and np.all(np.abs(rows - want) <= step / 2 + 1e-6)
    # The output layer still multiplies by the table (transposed), to int8's precision.
    exact = hidden @ table.T
    assert np.abs(logits - exact).max() < 0.05 * np.abs(exact).max()


def test_a_table_that_is_not_the_output_layer_keeps_its_own_copy(tmp_path):
    rng = np.random.default_rng(1)
    table = rng.standard_normal((VOCAB, WIDTH)).astype(np.float32)
    weight = np.ascontiguousarray(table.T)
    weight[3, 7] += 1e-3  # untied (opus-mt-tc-big's separate embeddings): the lookup must not read the output layer
    src, dst = tmp_path / "untied.onnx", tmp_path / "untied.int8.onnx"
    _decoder_like(src, table, weight)
    int8_graph(src, dst)
    assert _table_copies(dst) == 2
    session = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    rows, _ = session.run(None, {"ids": np.array([[5], [9]]), "hidden": np.zeros((2, WIDTH), np.float32)})
    assert np.abs(rows - table[[[5], [9]]]).max() < np.abs(table).max() / 100


def test_two_tables_tied_to_one_output_layer_both_read_its_one_copy(tmp_path):
    rng = np.random.default_rng(2)
    table = rng.standard_normal((VOCAB, WIDTH)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], name="lookup"),
         helper.make_node("Gather", ["same_table", "ids"], ["rows_again"], name="second_lookup"),
         helper.make_node("MatMul", ["hidden", "weight"], ["logits"], name="output_layer")],
        "two_lookups",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 1]),
         helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["batch", 1, WIDTH]),
         helper.make_tensor_value_info("rows_again", TensorProto.FLOAT, ["batch", 1, WIDTH]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", VOCAB])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(table.copy(), "same_table"),
         numpy_helper.from_array(np.ascontiguousarray(table.T), "weight")])
    src, dst = tmp_path / "two.onnx", tmp_path / "two.int8.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), src)
    int8_graph(src, dst)
    assert _table_copies(dst) == 1
    session = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    ids = rng.integers(0, VOCAB, (8, 1))
    rows, rows_again, _ = session.run(None, {"ids": ids, "hidden": np.zeros((8, WIDTH), np.float32)})
    step = np.abs(table[ids]).max(axis=-1, keepdims=True) / 63
    assert np.array_equal(rows, rows_again) and np.all(np.abs(rows - table[ids]) <= step / 2 + 1e-6)
