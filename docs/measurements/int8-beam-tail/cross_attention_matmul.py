import sys, time, numpy as np
from onnx import helper, TensorProto as T
sys.path.insert(0, "/work/main")
from toolkit.runtimes.onnxruntime.sessions import create_session
B, N, L, H = 64, 8, int(sys.argv[1]) if len(sys.argv) > 1 else 25, 64
D = N * H
def model(nodes, inputs, outputs):
    g = helper.make_graph(nodes, "g", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m.SerializeToString()
vi = helper.make_tensor_value_info
# (a) MultiHeadAttention, K/V BNSH, key padding as lengths
a = model([helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "len32"], ["o"], domain="com.microsoft", num_heads=N, scale=0.125)],
          [vi("q", T.FLOAT, [B, 1, D]), vi("k", T.FLOAT, [B, N, L, H]), vi("v", T.FLOAT, [B, N, L, H]), vi("len32", T.INT32, [B])],
          [vi("o", T.FLOAT, [B, 1, D])])
# (b) MatMul with K stored transposed [B,N,H,L], additive mask bias [B,1,1,L]
shape4 = helper.make_tensor("s4", T.INT64, [4], [B, 1, N, H])
shape3 = helper.make_tensor("s3", T.INT64, [3], [B, 1, D])
sc = helper.make_tensor("sc", T.FLOAT, [], [0.125])
nodes_b = [helper.make_node("Constant", [], ["s4"], value=shape4), helper.make_node("Constant", [], ["s3"], value=shape3),
           helper.make_node("Constant", [], ["sc"], value=sc),
           helper.make_node("Reshape", ["q", "s4"], ["q4"]), helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
           helper.make_node("Mul", ["qt", "sc"], ["qs"]),
           helper.make_node("MatMul", ["qs", "kt"], ["sco"]), helper.make_node("Add", ["sco", "bias"], ["scm"]),
           helper.make_node("Softmax", ["scm"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["ctx"]),
           helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]), helper.make_node("Reshape", ["ctxt", "s3"], ["o"])]
b = model(nodes_b, [vi("q", T.FLOAT, [B, 1, D]), vi("kt", T.FLOAT, [B, N, H, L]), vi("v", T.FLOAT, [B, N, L, H]), vi("bias", T.FLOAT, [B, 1, 1, L])],
          [vi("o", T.FLOAT, [B, 1, D])])
rng = np.random.default_rng(0)
q = rng.standard_normal((B, 1, D), dtype=np.float32)
k = rng.standard_normal((B, N, L, H), dtype=np.float32)
v = rng.standard_normal((B, N, L, H), dtype=np.float32)
lens = rng.integers(L // 2, L + 1, B)
bias = np.where(np.arange(L)[None, :] < lens[:, None], 0, -np.inf).astype(np.float32)[:, None, None, :]
sa, sb = create_session(a, "cpu", threads=1), create_session(b, "cpu", threads=1)
fa = {"q": q, "k": k, "v": v, "len32": lens.astype(np.int32)}
fb = {"q": q, "kt": np.ascontiguousarray(k.transpose(0, 1, 3, 2)), "v": v, "bias": bias}
oa, ob = sa.run(None, fa)[0], sb.run(None, fb)[0]
print("max diff", np.abs(oa - ob).max())
ta, tb = [], []
for _ in range(200):
    t = time.perf_counter(); sa.run(None, fa); ta.append(time.perf_counter() - t)
    t = time.perf_counter(); sb.run(None, fb); tb.append(time.perf_counter() - t)
print(f"L={L}: MHA {np.median(ta)*1e3:.3f} ms, MatMul {np.median(tb)*1e3:.3f} ms, ratio {np.median(ta)/np.median(tb):.2f}")
