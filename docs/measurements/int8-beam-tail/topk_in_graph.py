"""One int8 decoder step at 64 rows (16 sentences x beam 4), one thread: the tail as tk runs it (LogSoftmax, the
forbidden tokens' -inf added, the log-probabilities to the host, a TopK session) against TopK(k + forbidden) inside the
decoder graph, the forbidden ids dropped on the host. Then one graph holding both tails, asked for the ranking alone.
Usage: python topk_in_graph.py MODEL_DIR (a directory with decoder.int8.onnx: `tk bench --scale opus-mt --work WORK`
leaves WORK/tk)"""

from __future__ import annotations

import sys

import numpy as np
import onnx
from common import alternate
from onnx import TensorProto, helper, numpy_helper

from toolkit.graphs.helper_graphs import top_k_graph
from toolkit.runtimes.onnxruntime.sessions import create_session

directory = sys.argv[1]
original = onnx.load(f"{directory}/decoder.int8.onnx", load_external_data=False)
tail = next(n for n in original.graph.node if n.output and n.output[0] == "log_probs")
log_softmax, mask_name = tail.input
mask = numpy_helper.to_array(next(i for i in original.graph.initializer if i.name == mask_name))
forbidden = np.flatnonzero(np.isinf(mask))
K = 8


def with_ranking(keep_log_probs: bool) -> str:
    m = onnx.load(f"{directory}/decoder.int8.onnx", load_external_data=False)
    g = m.graph
    if not keep_log_probs:
        g.node.remove(next(n for n in g.node if n.output and n.output[0] == "log_probs"))
        g.output.remove(next(o for o in g.output if o.name == "log_probs"))
    g.input.append(helper.make_tensor_value_info("k", TensorProto.INT64, [1]))
    g.node.append(helper.make_node("TopK", [log_softmax, "k"], ["top_values", "top_indices"], axis=-1, largest=1, sorted=1))
    g.output.extend([helper.make_tensor_value_info("top_values", TensorProto.FLOAT, ["batch", None]),
                     helper.make_tensor_value_info("top_indices", TensorProto.INT64, ["batch", None])])
    path = f"{directory}/decoder.{'both' if keep_log_probs else 'topk'}.onnx"  # beside it: the weights file is shared
    onnx.save(m, path)
    return path


now = create_session(f"{directory}/decoder.int8.onnx", "cpu", threads=1)
ranked = create_session(with_ranking(False), "cpu", threads=1)
both = create_session(with_ranking(True), "cpu", threads=1)
ranker = create_session(top_k_graph(), "cpu", threads=1)
rng = np.random.default_rng(0)
B, P, L = 64, 16, 25
feeds = {"token": rng.integers(10, 50000, B).astype(np.int64), "src_len": np.full(B, L, np.int64)}
for i in range(6):
    for kind, n in (("self", P), ("cross", L)):
        for kv in "kv":
            feeds[f"{kind}_{kv}_{i}"] = rng.standard_normal((B, 8, n, 64), dtype=np.float32)
wide = {**feeds, "k": np.array([K + len(forbidden)], np.int64)}
now_names = [o.name for o in now.get_outputs()]
ranked_names = [o.name for o in ranked.get_outputs()]
both_names = [o.name for o in both.get_outputs() if o.name != "log_probs"]


def run_now():
    return ranker.run(None, {"log_probs": now.run(now_names, feeds)[0], "k": np.array([K], np.int64)})


def run_ranked():
    out = dict(zip(ranked_names, ranked.run(ranked_names, wide)))
    keep = ~np.isin(out["top_indices"], forbidden)
    values = np.stack([row[ok][:K] for row, ok in zip(out["top_values"], keep)])
    return values, np.stack([row[ok][:K] for row, ok in zip(out["top_indices"], keep)])


(va, ia), (vb, ib) = run_now(), run_ranked()
print("same top", K, "on", int((ia == ib).all(1).sum()), "of", B, "rows; same values:", np.array_equal(va, vb))
ta, tb = alternate(run_now, run_ranked, 15)
print(f"tk now {ta * 1e3:.2f} ms, ranking in the graph {tb * 1e3:.2f} ms, ratio {ta / tb:.3f}")
tc, tb = alternate(lambda: both.run(both_names, wide), run_ranked, 15)
print(f"both tails, the ranking asked for alone {tc * 1e3:.2f} ms (the ranking tail alone {tb * 1e3:.2f} ms)")
