"""Cross-attention of one decoding step, 64 rows, one thread: ONNX Runtime's MultiHeadAttention (keys and values
[batch, heads, source, 64], the source lengths as its mask) against MatMul + Softmax + MatMul with the keys stored
transposed. Usage: python cross_attention_matmul.py [SOURCE_LENGTH]"""

from __future__ import annotations

import sys

import numpy as np
from common import alternate, model
from onnx import TensorProto as T
from onnx import helper

from toolkit.runtimes.onnxruntime.sessions import create_session

B, N, H = 64, 8, 64
L = int(sys.argv[1]) if len(sys.argv) > 1 else 25
D = N * H
vi = helper.make_tensor_value_info


def const(name: str, dims: list, values: list, kind: int = T.INT64):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, kind, dims, values))


fused = model([helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "len32"], ["o"], domain="com.microsoft",
                                num_heads=N, scale=0.125)],
              [vi("q", T.FLOAT, [B, 1, D]), vi("k", T.FLOAT, [B, N, L, H]), vi("v", T.FLOAT, [B, N, L, H]),
               vi("len32", T.INT32, [B])], [vi("o", T.FLOAT, [B, 1, D])])
plain = model([const("s4", [4], [B, 1, N, H]), const("s3", [3], [B, 1, D]), const("sc", [], [0.125], T.FLOAT),
               helper.make_node("Reshape", ["q", "s4"], ["q4"]),
               helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
               helper.make_node("Mul", ["qt", "sc"], ["qs"]), helper.make_node("MatMul", ["qs", "kt"], ["scores"]),
               helper.make_node("Add", ["scores", "bias"], ["masked"]),
               helper.make_node("Softmax", ["masked"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["ctx"]),
               helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
               helper.make_node("Reshape", ["ctxt", "s3"], ["o"])],
              [vi("q", T.FLOAT, [B, 1, D]), vi("kt", T.FLOAT, [B, N, H, L]), vi("v", T.FLOAT, [B, N, L, H]),
               vi("bias", T.FLOAT, [B, 1, 1, L])], [vi("o", T.FLOAT, [B, 1, D])])
rng = np.random.default_rng(0)
q = rng.standard_normal((B, 1, D), dtype=np.float32)
k = rng.standard_normal((B, N, L, H), dtype=np.float32)
v = rng.standard_normal((B, N, L, H), dtype=np.float32)
lens = rng.integers(L // 2, L + 1, B)
bias = np.where(np.arange(L)[None, :] < lens[:, None], 0, -np.inf).astype(np.float32)[:, None, None, :]
a, b = create_session(fused, "cpu", threads=1), create_session(plain, "cpu", threads=1)
fa = {"q": q, "k": k, "v": v, "len32": lens.astype(np.int32)}
fb = {"q": q, "kt": np.ascontiguousarray(k.transpose(0, 1, 3, 2)), "v": v, "bias": bias}
print("largest difference", np.abs(a.run(None, fa)[0] - b.run(None, fb)[0]).max())
ta, tb = alternate(lambda: a.run(None, fa), lambda: b.run(None, fb), 200)
print(f"source {L}: MultiHeadAttention {ta * 1e3:.3f} ms, MatMul {tb * 1e3:.3f} ms, ratio {ta / tb:.2f}")
