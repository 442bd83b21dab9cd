"""Would a shortlisted output layer made once per batch pay? One product of M rows by 512 over N gathered columns, then
LogSoftmax, one intra-op thread: fed its weights at every run (as tk's shortlisted decoder is) against a session made
for the batch with them as initializers (packed once, at load), and how many runs the making takes to pay back.
fp32 is a Gemm over the rows; int8 is ONNX Runtime's DynamicQuantizeMatMul (what the int8 graph's product fuses to).
N and M as the opus-mt bench's batches gather them: 8,641 x 32 (real, greedy), 7,900 x 64 (real, beam 4), 44,417 x 32
(random, greedy), 3,460 x 1 (one sentence).

    python docs/measurements/output_layer_per_batch.py
"""

from __future__ import annotations

import time

import numpy as np
from fed_weight_gemm import median_ms  # beside this script

K = 512
CASES = ((8641, 32), (7900, 64), (44417, 32), (3460, 1))


def _model(n: int, m: int, int8: bool, initializer: bool):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if int8:
        arrays = {"W": rng.integers(-63, 63, size=(K, n), dtype=np.int8),
                  "s": (rng.random(n) / 100).astype(np.float32), "z": np.zeros(n, np.int8)}
        product = helper.make_node("DynamicQuantizeMatMul", ["x", "W", "s", "z"], ["y"], domain="com.microsoft")
    else:
        arrays = {"W": rng.standard_normal((n, K)).astype(np.float32)}
        product = helper.make_node("Gemm", ["x", "W"], ["y"], transB=1)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, K])]
    tables = [numpy_helper.from_array(a, name) for name, a in arrays.items()] if initializer else []
    if not initializer:
        inputs += [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                   for name, a in arrays.items()]
    graph = helper.make_graph([product, helper.make_node("LogSoftmax", ["y"], ["out"], axis=-1)], "layer", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [m, n])], tables)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9), arrays


def _case(n: int, m: int, int8: bool) -> str:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    x = np.random.default_rng(1).standard_normal((m, K)).astype(np.float32)
    run_ms, made_ms = {}, {}
    for initializer in (False, True):
        model, arrays = _model(n, m, int8, initializer)
        start = time.perf_counter()
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        made_ms[initializer] = (time.perf_counter() - start) * 1000
        run_ms[initializer] = median_ms(session, {"x": x, **({} if initializer else arrays)})
    saved = max(run_ms[False] - run_ms[True], 1e-9)
    return (f"{'int8' if int8 else 'fp32'} {n} x {m}: fed {run_ms[False]:.2f} ms a run; as initializers {run_ms[True]:.2f} ms, "
            f"the session made in {made_ms[True]:.1f} ms: paid back after {made_ms[True] / saved:.0f} runs")


def main() -> None:
    for int8 in (False, True):
        for n, m in CASES:
            print(_case(n, m, int8))


if __name__ == "__main__":
    main()
