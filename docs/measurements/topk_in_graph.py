"""A beam step's ranking inside the decoder graph, against tk's way on the CPU: the decoder's run returning the whole
log-probabilities to numpy, then the TopK session (toolkit.graphs.helper_graphs). One thread, the int8 decoder as tk
loads it (per-sentence cross-attention), fed a real beam-4 step of 32 Challenge sentences (128 rows); CPU time per step,
two rounds of each in turns.

    python docs/measurements/topk_in_graph.py [--variant int8] [--steps 300]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "exported" / "transformer")
    p.add_argument("--variant", default="int8")
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from toolkit.bench.text import read_text
    from toolkit.core.manifest import load
    from toolkit.deploy.api import Translator
    from toolkit.graphs import variants
    from toolkit.graphs.sentence_cross import cross_per_sentence

    lines = read_text(REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt")[0][:32]
    t = Translator(a.model, provider="cpu", threads=1, variant=None if a.variant == "fp32" else a.variant)
    backend, captured = t._backend, {}
    run = backend._run_decoder

    def capture(names, feeds):  # the first step with all 128 rows
        if feeds["token"].shape[0] == 128 and not captured:
            captured.update(names=names, feeds=dict(feeds))
        return run(names, feeds)

    backend._run_decoder = capture
    t.translate(lines, beam=4, streams=1)
    names, feeds = captured["names"], captured["feeds"]
    m = load(a.model)
    graph, _ = variants.graph_source(m, "decoder", a.variant)
    graph = cross_per_sentence(graph, m.specs()["decoder"].constant_inputs) or graph
    model = onnx.load_from_string(graph) if isinstance(graph, bytes) else onnx.load(str(graph), load_external_data=True)
    plain = model.SerializeToString()
    model.graph.input.append(helper.make_tensor_value_info("k", TensorProto.INT64, [1]))
    model.graph.node.append(helper.make_node("TopK", ["log_probs", "k"], ["top_values", "top_indices"], axis=-1))
    model.graph.output.extend([helper.make_tensor_value_info("top_values", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("top_indices", TensorProto.INT64, None)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    base = ort.InferenceSession(plain, options, providers=["CPUExecutionProvider"])
    fused = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    k, ranker, others = np.array([8], dtype=np.int64), backend.ranker, [n for n in names if n != "log_probs"]

    def now():
        log_probs = base.run(names, feeds)[names.index("log_probs")]
        return ranker.run(None, {"log_probs": log_probs, "k": k})

    def in_graph():
        return fused.run(["top_values", "top_indices", *others], {**feeds, "k": k})

    assert np.array_equal(now()[1], in_graph()[1])
    times = {"log-probabilities to numpy, then TopK": [], "TopK in the decoder graph": []}
    for _ in range(2):
        for name, step in zip(times, (now, in_graph)):
            start = time.thread_time()
            for _ in range(a.steps):
                step()
            times[name].append((time.thread_time() - start) / a.steps * 1e6)
    for name, us in times.items():
        print(f"{a.variant}, 128 rows: {name}: {min(us):.0f} us a step")


if __name__ == "__main__":
    main()
