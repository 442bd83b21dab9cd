"""Decoder step at 64 rows (16 sentences x beam 4), 1 thread: the tail as tk runs it (LogSoftmax + suppress Add,
log_probs to the host, a TopK session) against TopK(k + s) inside the decoder graph (no suppress Add, no full output)."""
import sys, time, numpy as np, onnx
from onnx import helper, TensorProto, numpy_helper
sys.path.insert(0, "/work/main")
from toolkit.runtimes.onnxruntime.sessions import create_session
from toolkit.runtimes.onnxruntime.helper_graphs import top_k_graph
D = "/tmp/opus-work/tk"
src_graph = sys.argv[1] if len(sys.argv) > 1 else "decoder.int8.onnx"
m = onnx.load(f"{D}/{src_graph}", load_external_data=False)
g = m.graph
tail = [n for n in g.node if n.output and n.output[0] == "log_probs"][0]
print("tail:", tail.op_type, list(tail.input))
lsm = tail.input[0]
sup = tail.input[1]
init = {i.name: i for i in g.initializer}
S = int(np.isinf(numpy_helper.to_array(init[sup])).sum()) if sup in init else None
print("suppressed", S)
g.node.remove(tail)
kin = helper.make_tensor_value_info("k", TensorProto.INT64, [1])
g.input.append(kin)
g.node.append(helper.make_node("TopK", [lsm, "k"], ["top_values", "top_indices"], axis=-1, largest=1, sorted=1))
for o in list(g.output):
    if o.name == "log_probs":
        g.output.remove(o)
g.output.insert(0, helper.make_tensor_value_info("top_values", TensorProto.FLOAT, ["batch", None]))
g.output.insert(1, helper.make_tensor_value_info("top_indices", TensorProto.INT64, ["batch", None]))
onnx.save(m, f"{D}/decoder.topk.onnx")
a = create_session(f"{D}/{src_graph}", "cpu", threads=1)
b = create_session(f"{D}/decoder.topk.onnx", "cpu", threads=1)
ranker = create_session(top_k_graph(), "cpu", threads=1)
rng = np.random.default_rng(0)
B, P, L = 64, 16, 25
feeds = {"token": rng.integers(10, 50000, B).astype(np.int64), "src_len": np.full(B, L, np.int64)}
for i in range(6):
    for kind, n in (("self", P), ("cross", L)):
        for kv in "kv":
            feeds[f"{kind}_{kv}_{i}"] = rng.standard_normal((B, 8, n, 64), dtype=np.float32)
names_a = [o.name for o in a.get_outputs()]
names_b = [o.name for o in b.get_outputs()]
kk = np.array([8], np.int64)
def run_a():
    out = a.run(names_a, feeds)
    v, i = ranker.run(None, {"log_probs": out[0], "k": kk})
    return v, i
def run_b():
    out = b.run(names_b, {**feeds, "k": np.array([8 + S], np.int64)})
    v, i = out[0], out[1]
    keep = i != 0  # drop suppressed (pad) ... generic: np.isin
    return v, i
va, ia = run_a(); vb, ib = run_b()
ok = [np.array_equal(ia[r], ib[r][~np.isin(ib[r], np.flatnonzero(np.isinf(numpy_helper.to_array(init[sup]))))][:8]) for r in range(B)]
print("same top-8 rows", sum(ok), "of", B, "values equal", np.array_equal(va, np.stack([vb[r][~np.isin(ib[r], np.flatnonzero(np.isinf(numpy_helper.to_array(init[sup]))))][:8] for r in range(B)])))
ta, tb = [], []
for rnd in range(15):
    t = time.perf_counter(); run_a(); ta.append(time.perf_counter() - t)
    t = time.perf_counter(); run_b(); tb.append(time.perf_counter() - t)
print(f"tk now {np.median(ta)*1e3:.2f} ms, topk in graph {np.median(tb)*1e3:.2f} ms, ratio {np.median(ta)/np.median(tb):.3f}")
# C: both tails in one graph; does ONNX Runtime skip the nodes whose outputs are not asked for?
m = onnx.load(f"{D}/{src_graph}", load_external_data=False)
g = m.graph
g.input.append(kin)
g.node.append(helper.make_node("TopK", [lsm, "k"], ["top_values", "top_indices"], axis=-1, largest=1, sorted=1))
g.output.insert(1, helper.make_tensor_value_info("top_values", TensorProto.FLOAT, ["batch", None]))
g.output.insert(2, helper.make_tensor_value_info("top_indices", TensorProto.INT64, ["batch", None]))
onnx.save(m, f"{D}/decoder.both.onnx")
c = create_session(f"{D}/decoder.both.onnx", "cpu", threads=1)
names_c = [n for n in (o.name for o in c.get_outputs()) if n != "log_probs"]
tc = []
for rnd in range(15):
    t = time.perf_counter(); c.run(names_c, {**feeds, "k": np.array([8 + S], np.int64)}); tc.append(time.perf_counter() - t)
print(f"both tails, top asked only {np.median(tc)*1e3:.2f} ms (topk alone {np.median(tb)*1e3:.2f})")
