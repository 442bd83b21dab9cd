import sys, time, numpy as np
from onnx import helper, TensorProto as T
sys.path.insert(0, "/work/main")
from toolkit.runtimes.onnxruntime.sessions import create_session
B, N, P, H = 64, 8, int(sys.argv[1]), 64
D = N * H
def model(nodes, inputs, outputs):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m.SerializeToString()
vi = helper.make_tensor_value_info
a = model([helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"], ["o", "nk", "nv"], domain="com.microsoft", num_heads=N, scale=0.125)],
          [vi("q", T.FLOAT, [B, 1, D]), vi("k", T.FLOAT, [B, 1, D]), vi("v", T.FLOAT, [B, 1, D]), vi("pk", T.FLOAT, [B, N, P, H]), vi("pv", T.FLOAT, [B, N, P, H])],
          [vi("o", T.FLOAT, [B, 1, D]), vi("nk", T.FLOAT, [B, N, P + 1, H]), vi("nv", T.FLOAT, [B, N, P + 1, H])])
C = lambda name, dims, vals, t=T.INT64: helper.make_node("Constant", [], [name], value=helper.make_tensor(name, t, dims, vals))
nodes = [C("s4", [4], [B, 1, N, H]), C("s4t", [4], [B, N, H, 1]), C("s3", [3], [B, 1, D]), C("sc", [], [0.125], T.FLOAT),
         helper.make_node("Reshape", ["q", "s4"], ["q4"]), helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
         helper.make_node("Mul", ["qt", "sc"], ["qs"]),
         helper.make_node("Reshape", ["k", "s4t"], ["kcol"]),  # [B,1,D] -> [B,N,H,1]: one new column of K^T
         helper.make_node("Concat", ["pkt", "kcol"], ["nkt"], axis=3),
         helper.make_node("Reshape", ["v", "s4"], ["v4"]), helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
         helper.make_node("Concat", ["pv", "vt"], ["nv"], axis=2),
         helper.make_node("MatMul", ["qs", "nkt"], ["sco"]), helper.make_node("Softmax", ["sco"], ["p"], axis=-1),
         helper.make_node("MatMul", ["p", "nv"], ["ctx"]), helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
         helper.make_node("Reshape", ["ctxt", "s3"], ["o"])]
b = model(nodes, [vi("q", T.FLOAT, [B, 1, D]), vi("k", T.FLOAT, [B, 1, D]), vi("v", T.FLOAT, [B, 1, D]), vi("pkt", T.FLOAT, [B, N, H, P]), vi("pv", T.FLOAT, [B, N, P, H])],
          [vi("o", T.FLOAT, [B, 1, D]), vi("nkt", T.FLOAT, [B, N, H, P + 1]), vi("nv", T.FLOAT, [B, N, P + 1, H])])
rng = np.random.default_rng(0)
r = lambda *s: rng.standard_normal(s, dtype=np.float32)
q, k, v, pk, pv = r(B, 1, D), r(B, 1, D), r(B, 1, D), r(B, N, P, H), r(B, N, P, H)
sa, sb = create_session(a, "cpu", threads=1), create_session(b, "cpu", threads=1)
fa = {"q": q, "k": k, "v": v, "pk": pk, "pv": pv}
fb = {"q": q, "k": k, "v": v, "pkt": np.ascontiguousarray(pk.transpose(0, 1, 3, 2)), "pv": pv}
oa, ob = sa.run(None, fa), sb.run(None, fb)
print("diff o", np.abs(oa[0] - ob[0]).max(), "k", np.abs(oa[1] - ob[1].transpose(0, 1, 3, 2)).max())
ta, tb = [], []
for _ in range(200):
    t = time.perf_counter(); sa.run(None, fa); ta.append(time.perf_counter() - t)
    t = time.perf_counter(); sb.run(None, fb); tb.append(time.perf_counter() - t)
print(f"P={P}: MHA {np.median(ta)*1e3:.3f} ms, MatMul {np.median(tb)*1e3:.3f} ms, ratio {np.median(ta)/np.median(tb):.2f}")
