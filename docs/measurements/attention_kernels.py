"""tk's CPU attention kernels against ONNX Runtime's MultiHeadAttention, one node alone, at a decoder step's shapes.

A decoder step's cross-attention (one query position a row, or a beam's four rows sharing their sentence's keys) over S
source positions with the sources' lengths as mask, and its self-attention appending one position to a cache of P;
four heads of 64 (the shipped model's), one thread, microseconds a call (median of 5 passes), and the largest
difference of the outputs.

    python docs/measurements/attention_kernels.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
HEADS, DIM = 4, 64


def session(node, inputs, outputs, kernels: bool) -> ort.InferenceSession:
    from toolkit.runtimes.onnxruntime import native

    graph = helper.make_graph([node], "g", inputs, outputs)
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1),
                                                                   helper.make_opsetid("tk.kernels", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if kernels:
        native.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def timed(run, calls: int = 300) -> float:
    spent = []
    for _ in range(5):
        run()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        spent.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(spent)


def main() -> None:
    from toolkit.runtimes.onnxruntime import native

    print(native.status())
    vi, node = helper.make_tensor_value_info, helper.make_node
    f = TensorProto.FLOAT
    cross_in = [vi("q", f, ["g", "r", HEADS * DIM]), vi("k", f, ["g", HEADS, "s", DIM]), vi("v", f, ["g", HEADS, "s", DIM]),
                vi("lengths", TensorProto.INT32, ["g"])]
    cross = {False: session(node("MultiHeadAttention", ["q", "k", "v", "", "lengths"], ["o"], domain="com.microsoft", num_heads=HEADS,
                                 scale=DIM ** -0.5), cross_in, [vi("o", f, None)], False),
             True: session(node("CrossAttention", ["q", "k", "v", "lengths"], ["o"], domain="tk.kernels", num_heads=HEADS,
                                scale=DIM ** -0.5), cross_in, [vi("o", f, None)], True)}
    self_in = [vi(n, f, ["b", 1, HEADS * DIM]) for n in ("q", "k", "v")] + [vi(n, f, ["b", HEADS, "p", DIM]) for n in ("pk", "pv")]
    self_out = [vi(n, f, None) for n in ("o", "ok", "ov")]
    selfs = {False: session(node("MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"], ["o", "ok", "ov"], domain="com.microsoft",
                                 num_heads=HEADS, scale=DIM ** -0.5), self_in, self_out, False),
             True: session(node("SelfAttention", ["q", "k", "v", "pk", "pv"], ["o", "ok", "ov"], domain="tk.kernels", num_heads=HEADS,
                                scale=DIM ** -0.5), self_in, self_out, True)}
    rng = np.random.default_rng(0)
    print("| node | rows | MultiHeadAttention | tk kernel | ratio | largest difference |")
    print("| --- | --- | --- | --- | --- | --- |")
    for groups, rows, keys in ((1, 1, 10), (64, 1, 10), (64, 1, 20), (64, 4, 10)):
        feeds = {"q": rng.standard_normal((groups, rows, HEADS * DIM), dtype=np.float32),
                 "k": rng.standard_normal((groups, HEADS, keys, DIM), dtype=np.float32),
                 "v": rng.standard_normal((groups, HEADS, keys, DIM), dtype=np.float32),
                 "lengths": rng.integers(keys // 2, keys + 1, groups).astype(np.int32)}
        diff = np.abs(cross[True].run(None, feeds)[0] - cross[False].run(None, feeds)[0]).max()
        mha, tk = (timed(lambda s=cross[k], f=feeds: s.run(None, f)) for k in (False, True))
        print(f"| cross, S = {keys} | {groups} x {rows} | {mha:.0f} us | {tk:.0f} us | {mha / tk:.2f}x | {diff:.1e} |")
    for batch, past in ((1, 8), (64, 4), (64, 10), (64, 20), (256, 10)):
        feeds = {n: rng.standard_normal(shape, dtype=np.float32) for n, shape in
                 (("q", (batch, 1, HEADS * DIM)), ("k", (batch, 1, HEADS * DIM)), ("v", (batch, 1, HEADS * DIM)),
                  ("pk", (batch, HEADS, past, DIM)), ("pv", (batch, HEADS, past, DIM)))}
        diff = np.abs(selfs[True].run(None, feeds)[0] - selfs[False].run(None, feeds)[0]).max()
        mha, tk = (timed(lambda s=selfs[k], f=feeds: s.run(None, f)) for k in (False, True))
        print(f"| self, P = {past} | {batch} | {mha:.0f} us | {tk:.0f} us | {mha / tk:.2f}x | {diff:.1e} |")


if __name__ == "__main__":
    main()
