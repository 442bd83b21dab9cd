"""Ways of doing parts of a decoder step at the shipped model's shape (6,000 tokens, 4 heads of 64, 64 rows: a greedy
file's batch), each timed against the one tk runs, on one ONNX Runtime thread, median of 5 passes in turns:

- ranking: the log-probabilities (LogSoftmax in the graph) and the best token taken by numpy on the host, as tk's
  greedy step does, against the best token and its log-probability computed in the graph (ArgMax and GatherElements
  after LogSoftmax; after Softmax and Log; or from the logits with Exp, ReduceSum and Log), which would hand the host
  two numbers a row instead of 6,000;
- cross-attention of one query position over 15 source positions: com.microsoft.MultiHeadAttention (what tk's CPU
  graphs run, attention_fusion) against the same with batched MatMuls, and with Mul and ReduceSum;
- the step's outputs: InferenceSession.run, which hands numpy arrays back, against an I/O binding whose outputs stay
  ONNX Runtime's (what feeding the caches back as OrtValues would save), on the model's int8 and optimized decoders.

    python docs/measurements/step_alternatives.py [--model exported/transformer]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
ROWS, VOCAB, HEADS, DIM, SOURCE = 64, 6000, 4, 64, 15


def session(nodes, inputs, outputs, initializers=()) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=9)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def timed(ways: dict[str, Callable[[], object]], calls: int) -> dict[str, float]:
    """Microseconds a call of each way, median of 5 passes taken in turns."""
    spent: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(5):
        for name, way in ways.items():
            way()
            start = time.perf_counter()
            for _ in range(calls):
                way()
            spent[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(s) for name, s in spent.items()}


def ranking() -> dict[str, float]:
    x_in = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", VOCAB])
    best = helper.make_tensor_value_info("i", TensorProto.INT64, None)
    value = helper.make_tensor_value_info("v", TensorProto.FLOAT, None)
    node = helper.make_node
    axis = helper.make_tensor("axis", TensorProto.INT64, [1], [-1])
    host = session([node("LogSoftmax", ["x"], ["y"], axis=-1)], [x_in], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    after_log_softmax = session([node("LogSoftmax", ["x"], ["y"], axis=-1), node("ArgMax", ["y"], ["i"], axis=-1, keepdims=1),
                                 node("GatherElements", ["y", "i"], ["v"], axis=-1)], [x_in], [best, value])
    after_softmax = session([node("Softmax", ["x"], ["p"], axis=-1), node("ArgMax", ["x"], ["i"], axis=-1, keepdims=1),
                             node("GatherElements", ["p", "i"], ["q"], axis=-1), node("Log", ["q"], ["v"])], [x_in], [best, value])
    from_logits = session([node("ArgMax", ["x"], ["i"], axis=-1, keepdims=1), node("GatherElements", ["x", "i"], ["m"], axis=-1),
                           node("Sub", ["x", "m"], ["d"]), node("Exp", ["d"], ["e"]), node("ReduceSum", ["e", "axis"], ["s"], keepdims=1),
                           node("Log", ["s"], ["l"]), node("Neg", ["l"], ["v"])], [x_in], [best, value], [axis])
    x = (np.random.default_rng(0).standard_normal((ROWS, VOCAB)) * 3).astype(np.float32)

    def on_the_host():
        y = host.run(None, {"x": x})[0]
        i = y.argmax(-1)
        return i, np.take_along_axis(y, i[:, None], -1)

    want = on_the_host()
    ways = {"LogSoftmax, best token by numpy (tk)": on_the_host,
            "LogSoftmax, ArgMax, GatherElements": lambda: after_log_softmax.run(None, {"x": x}),
            "Softmax, ArgMax, GatherElements, Log": lambda: after_softmax.run(None, {"x": x}),
            "ArgMax, Exp, ReduceSum, Log of the logits": lambda: from_logits.run(None, {"x": x})}
    for name, way in ways.items():  # every way finds the same tokens and log-probabilities
        got = way()
        assert (np.asarray(got[0]).ravel() == want[0]).all(), name
        assert np.allclose(np.asarray(got[1]).ravel(), want[1].ravel(), atol=1e-5), name
    return timed(ways, 300)


def attention() -> dict[str, float]:
    node, vi = helper.make_node, helper.make_tensor_value_info
    q_in, k_in = vi("q", TensorProto.FLOAT, ["b", 1, HEADS * DIM]), vi("k", TensorProto.FLOAT, ["b", HEADS, "s", DIM])
    v_in, out = vi("v", TensorProto.FLOAT, ["b", HEADS, "s", DIM]), vi("o", TensorProto.FLOAT, None)
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [DIM ** -0.5])
    shapes = [helper.make_tensor(n, TensorProto.INT64, [len(v)], v) for n, v in
              (("heads", [0, 1, HEADS, DIM]), ("joined", [0, 1, HEADS * DIM]), ("per_head", [0, HEADS, 1, DIM]), ("column", [0, HEADS, -1, 1]))]
    axes = [helper.make_tensor(n, TensorProto.INT64, [1], [v]) for n, v in (("last", -1), ("second_last", -2))]
    fused = session([node("MultiHeadAttention", ["q", "k", "v", "", "lengths"], ["o"], domain="com.microsoft", num_heads=HEADS,
                          scale=DIM ** -0.5)], [q_in, k_in, v_in, vi("lengths", TensorProto.INT32, ["b"])], [out])
    matmuls = session([node("Reshape", ["q", "heads"], ["q4"]), node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
                       node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), node("MatMul", ["qt", "kt"], ["s0"]),
                       node("Mul", ["s0", "scale"], ["s1"]), node("Add", ["s1", "bias"], ["s2"]), node("Softmax", ["s2"], ["p"], axis=-1),
                       node("MatMul", ["p", "v"], ["c"]), node("Transpose", ["c"], ["ct"], perm=[0, 2, 1, 3]),
                       node("Reshape", ["ct", "joined"], ["o"])],
                      [q_in, k_in, v_in, vi("bias", TensorProto.FLOAT, ["b", 1, 1, "s"])], [out], [scale, *shapes])
    sums = session([node("Reshape", ["q", "per_head"], ["q4"]), node("Mul", ["q4", "k"], ["qk"]),
                    node("ReduceSum", ["qk", "last"], ["s0"], keepdims=0), node("Mul", ["s0", "scale"], ["s1"]),
                    node("Add", ["s1", "bias"], ["s2"]), node("Softmax", ["s2"], ["p"], axis=-1), node("Reshape", ["p", "column"], ["p4"]),
                    node("Mul", ["p4", "v"], ["pv"]), node("ReduceSum", ["pv", "second_last"], ["c"], keepdims=0),
                    node("Reshape", ["c", "joined"], ["o"])],
                   [q_in, k_in, v_in, vi("bias", TensorProto.FLOAT, ["b", 1, "s"])], [out], [scale, *shapes, *axes])
    rng = np.random.default_rng(0)
    q = rng.standard_normal((ROWS, 1, HEADS * DIM), dtype=np.float32)
    k, v = (rng.standard_normal((ROWS, HEADS, SOURCE, DIM), dtype=np.float32) for _ in range(2))
    lengths = rng.integers(5, SOURCE + 1, ROWS).astype(np.int32)
    bias = np.where(np.arange(SOURCE)[None] < lengths[:, None], 0, -1e9).astype(np.float32)
    ways = {"MultiHeadAttention (tk)": lambda: fused.run(None, {"q": q, "k": k, "v": v, "lengths": lengths})[0],
            "MatMul, Softmax, MatMul": lambda: matmuls.run(None, {"q": q, "k": k, "v": v, "bias": bias[:, None, None, :]})[0],
            "Mul, ReduceSum, Softmax, Mul, ReduceSum": lambda: sums.run(None, {"q": q, "k": k, "v": v, "bias": bias[:, None, :]})[0]}
    want = ways["MultiHeadAttention (tk)"]()
    assert all(np.allclose(way(), want, atol=1e-4) for way in ways.values())
    return timed(ways, 500)


def outputs(model: Path, variant: str) -> dict[str, float]:
    from toolkit.core import manifest
    from toolkit.graphs.variants import graph_source
    from toolkit.runtimes.onnxruntime.sessions import create_session

    m = manifest.load(model)
    decoder = create_session(graph_source(m, "decoder", variant)[0], threads=1)
    feeds: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(0)
    for spec in decoder.get_inputs():  # a step at position 15 over 14 source positions, every input by its declared axes
        dims = [{"batch": ROWS, "past_len": 15, "src_len": 14}.get(d, d) for d in spec.shape]
        if spec.type == "tensor(int64)":
            feeds[spec.name] = np.full(dims, 14 if spec.name == "src_len" else 5, np.int64)
        else:
            feeds[spec.name] = rng.standard_normal(dims, dtype=np.float32)
    names = [o.name for o in decoder.get_outputs()]
    binding = decoder.io_binding()

    def bound():
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name in names:
            binding.bind_output(name, "cpu")
        decoder.run_with_iobinding(binding)
        return binding.get_outputs()

    return timed({"run, numpy arrays back (tk)": lambda: decoder.run(names, feeds), "I/O binding, outputs left as OrtValues": bound}, 40)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "exported" / "transformer")
    a = p.parse_args()
    for title, result in ((f"ranking {ROWS} rows of {VOCAB:,} log-probabilities", ranking()),
                          (f"cross-attention, {ROWS} rows, {HEADS} heads of {DIM}, {SOURCE} source positions", attention()),
                          (f"an int8 decoder step of {ROWS} rows", outputs(a.model, "int8")),
                          (f"an optimized (fp32) decoder step of {ROWS} rows", outputs(a.model, "optimized"))):
        print(f"{title}, us a call:")
        for name, us in result.items():
            print(f"  {name:45s} {us:8.0f}")


if __name__ == "__main__":
    main()
