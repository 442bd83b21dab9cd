"""The CPU variants drop an all-zero bias added to a matrix product (Marian's final_logits_bias), and only such a bias:
the graph computes the same values without the pass over every logit."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from toolkit.graphs.zero_bias import drop_zero_biases

pytestmark = pytest.mark.timeout(60)

WIDTH, VOCAB = 8, 50


def _logits_graph(bias: np.ndarray, gemm: bool = True) -> onnx.ModelProto:
    """hidden (rows, WIDTH) -> LogSoftmax(hidden @ W + bias), W stored as Gemm's transB table or as MatMul's weight."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((VOCAB, WIDTH)).astype(np.float32)
    product = (helper.make_node("Gemm", ["hidden", "w"], ["logits"], transB=1) if gemm
               else helper.make_node("MatMul", ["hidden", "w"], ["logits"]))
    graph = helper.make_graph(
        [product, helper.make_node("Add", ["logits", "bias"], ["biased"]),
         helper.make_node("LogSoftmax", ["biased"], ["log_probs"], axis=-1)], "logits",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["rows", WIDTH])],
        [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["rows", VOCAB])],
        [numpy_helper.from_array(w if gemm else np.ascontiguousarray(w.T), "w"), numpy_helper.from_array(bias, "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _run(model: onnx.ModelProto, hidden: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"hidden": hidden})[0]


@pytest.mark.parametrize("gemm", [True, False])
def test_a_zero_bias_goes_and_the_log_probabilities_stay_the_same(gemm):
    hidden = np.random.default_rng(1).standard_normal((5, WIDTH)).astype(np.float32)
    bias = np.zeros((1, VOCAB) if gemm else (VOCAB,), np.float32)
    model = _logits_graph(bias, gemm)
    before = _run(model, hidden)
    assert drop_zero_biases(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Gemm" if gemm else "MatMul", "LogSoftmax"]
    assert "bias" not in {i.name for i in model.graph.initializer}
    assert np.array_equal(_run(model, hidden), before)


def test_a_bias_with_any_value_or_a_shape_that_broadcasts_stays():
    nonzero = np.zeros((1, VOCAB), np.float32)
    nonzero[0, 7] = 1e-30  # one tiny value is still a bias
    model = _logits_graph(nonzero)
    assert drop_zero_biases(model) == 0 and len(model.graph.node) == 3
    # (2, VOCAB) would broadcast a one-row product to two rows: the Add changes the shape, so it is not a no-op.
    model = _logits_graph(np.zeros((2, VOCAB), np.float32))
    assert drop_zero_biases(model) == 0 and len(model.graph.node) == 3
