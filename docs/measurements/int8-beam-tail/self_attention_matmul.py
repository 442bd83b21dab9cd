"""Self-attention of one decoding step with its cache, 64 rows, one thread: ONNX Runtime's MultiHeadAttention (past
and present keys and values [batch, heads, length, 64]) against Concat + MatMul + Softmax + MatMul with the key cache
stored transposed. Usage: python self_attention_matmul.py PAST_LENGTH"""

from __future__ import annotations

import sys

import numpy as np
from common import alternate, model
from onnx import TensorProto as T
from onnx import helper

from toolkit.runtimes.onnxruntime.sessions import create_session

B, N, H = 64, 8, 64
P = int(sys.argv[1])
D = N * H
vi = helper.make_tensor_value_info


def const(name: str, dims: list, values: list, kind: int = T.INT64):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, kind, dims, values))


step_in = [vi("q", T.FLOAT, [B, 1, D]), vi("k", T.FLOAT, [B, 1, D]), vi("v", T.FLOAT, [B, 1, D])]
fused = model([helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"], ["o", "nk", "nv"],
                                domain="com.microsoft", num_heads=N, scale=0.125)],
              [*step_in, vi("pk", T.FLOAT, [B, N, P, H]), vi("pv", T.FLOAT, [B, N, P, H])],
              [vi("o", T.FLOAT, [B, 1, D]), vi("nk", T.FLOAT, [B, N, P + 1, H]), vi("nv", T.FLOAT, [B, N, P + 1, H])])
plain = model([const("s4", [4], [B, 1, N, H]), const("s4t", [4], [B, N, H, 1]), const("s3", [3], [B, 1, D]),
               const("sc", [], [0.125], T.FLOAT),
               helper.make_node("Reshape", ["q", "s4"], ["q4"]),
               helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
               helper.make_node("Mul", ["qt", "sc"], ["qs"]),
               helper.make_node("Reshape", ["k", "s4t"], ["kcol"]),  # the new key as one column of K^T
               helper.make_node("Concat", ["pkt", "kcol"], ["nkt"], axis=3),
               helper.make_node("Reshape", ["v", "s4"], ["v4"]),
               helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
               helper.make_node("Concat", ["pv", "vt"], ["nv"], axis=2),
               helper.make_node("MatMul", ["qs", "nkt"], ["scores"]),
               helper.make_node("Softmax", ["scores"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "nv"], ["ctx"]),
               helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
               helper.make_node("Reshape", ["ctxt", "s3"], ["o"])],
              [*step_in, vi("pkt", T.FLOAT, [B, N, H, P]), vi("pv", T.FLOAT, [B, N, P, H])],
              [vi("o", T.FLOAT, [B, 1, D]), vi("nkt", T.FLOAT, [B, N, H, P + 1]), vi("nv", T.FLOAT, [B, N, P + 1, H])])
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((B, 1, D), dtype=np.float32) for _ in range(3))
pk, pv = (rng.standard_normal((B, N, P, H), dtype=np.float32) for _ in range(2))
a, b = create_session(fused, "cpu", threads=1), create_session(plain, "cpu", threads=1)
fa = {"q": q, "k": k, "v": v, "pk": pk, "pv": pv}
fb = {"q": q, "k": k, "v": v, "pkt": np.ascontiguousarray(pk.transpose(0, 1, 3, 2)), "pv": pv}
print("largest difference", np.abs(a.run(None, fa)[0] - b.run(None, fb)[0]).max())
ta, tb = alternate(lambda: a.run(None, fa), lambda: b.run(None, fb), 200)
print(f"past {P}: MultiHeadAttention {ta * 1e3:.3f} ms, MatMul {tb * 1e3:.3f} ms, ratio {ta / tb:.2f}")
