"""What a weight fed as an input costs ONNX Runtime against the same weight as an initializer: one Gemm of 32 rows by
512 over N output columns, one intra-op thread, ms a run (median of 10 after 3 warm-up runs). An initializer is packed
for the kernels once, at load; an input is packed at every run. The weight as rows (transB=1, as an output layer's
rows) and as columns. With --left, the fed rows are instead the product's left operand, which ONNX Runtime's kernels
read without packing: the rows' transpose times the weight's, transposed back (W x^T, then ^T), at each of --rows.

    python docs/measurements/fed_weight_gemm.py [--columns 59514,44122,12000]
    python docs/measurements/fed_weight_gemm.py --left --rows 4,8,16,32,64,128 --columns 3500,8641,44122
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _ms(columns: int, rows_layout: bool, initializer: bool, m: int = 32, k: int = 512) -> float:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((columns, k) if rows_layout else (k, columns)).astype(np.float32)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])]
    if not initializer:
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, list(weight.shape)))
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "W"], ["y"], transB=int(rows_layout))], "gemm", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, columns])],
                              [numpy_helper.from_array(weight, "W")] if initializer else [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return median_ms(session, {"x": rng.standard_normal((m, k)).astype(np.float32), **({} if initializer else {"W": weight})})


def _left_ms(columns: int, m: int, k: int = 512) -> float:
    """The fed rows W (columns, k) as the left operand: (W x^T)^T, the same numbers as Gemm(x, W, transB=1)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((columns, k)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]), helper.make_node("MatMul", ["W", "xt"], ["yt"]),
             helper.make_node("Transpose", ["yt"], ["y"], perm=[1, 0])]
    graph = helper.make_graph(nodes, "left", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k]),
                                              helper.make_tensor_value_info("W", TensorProto.FLOAT, [columns, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, columns])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return median_ms(session, {"x": rng.standard_normal((m, k)).astype(np.float32), "W": weight})


def median_ms(session, feeds: dict[str, np.ndarray]) -> float:
    """The median of 10 runs of `session` on `feeds` after 3 warm-up runs, in ms."""
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--columns", default="59514,44122,12000")
    p.add_argument("--left", action="store_true", help="the fed rows as the left operand, beside Gemm's two forms")
    p.add_argument("--rows", default="32", help="with --left: the rows (a decoder step's) to time, comma-separated")
    a = p.parse_args()
    if a.left:
        for n in (int(c) for c in a.columns.split(",")):
            for m in (int(r) for r in a.rows.split(",")):
                init, fed, left = _ms(n, True, True, m), _ms(n, True, False, m), _left_ms(n, m)
                print(f"{m} rows x {n} columns: as an initializer {init:.3f} ms; fed rows (transB=1) {fed:.3f} ms "
                      f"({fed / init:.2f}x); fed rows on the left {left:.3f} ms ({left / init:.2f}x)")
        return
    for n in (int(c) for c in a.columns.split(",")):
        print(f"{n} columns: rows as an initializer {_ms(n, True, True):.2f} ms, fed {_ms(n, True, False):.2f} ms; "
              f"columns as an initializer {_ms(n, False, True):.2f} ms, fed {_ms(n, False, False):.2f} ms")


if __name__ == "__main__":
    main()
