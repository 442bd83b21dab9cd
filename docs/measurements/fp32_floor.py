"""The fastest any fp32 engine on ONNX Runtime's CPU kernels could decode a `tk bench --scale` row: the time of the
model's weight matrix products alone, at the row's shapes, with nothing else (no attention, no layer norms, no softmax,
no cache, no Python).

Each product is the one the model computes: per decoder step, every layer's self-attention Q, K, V and output
projections, cross-attention Q and output projections and both feed-forward layers, then the output layer
(d_model x vocabulary), at `rows` rows (sentences x beam); per batch, the encoder's projections and feed-forward layers
over every source token and the decoder layers' cross-attention keys and values. They run as one ONNX graph of chained
MatMuls (random weights, fp32), timed with 2 intra-op threads (the bench's), median of --repeat runs. The upper bound of
a row's tokens/s is then its tokens divided by (encoder products + steps x step products) for each batch.

    python docs/measurements/fp32_floor.py [--shape opus-mt] [--threads 2] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def chain(width: int, ffn: int, layers: int, projections: int, vocab: int | None):
    """An ONNX graph x (rows, width) -> the products of `layers` layers (`projections` width x width products, then
    width x ffn and ffn x width), then width x vocab when `vocab`."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    shapes = [(width, width)] * projections + [(width, ffn), (ffn, width)]
    shapes = shapes * layers + ([(width, vocab)] if vocab else [])
    x = "x"
    for k, shape in enumerate(shapes):  # each product takes the previous one's output
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.02).astype(np.float32), f"w{k}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{k}"], [f"y{k}"]))
        x = f"y{k}"
    graph = helper.make_graph(nodes, "floor", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", width])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def timed(model, rows: int, width: int, threads: int, repeat: int) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((rows, width)).astype(np.float32)
    session.run(None, {"x": x})
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.run(None, {"x": x})
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    from toolkit.bench.scale_model import SHAPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="opus-mt", choices=sorted(SHAPES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--source-len", type=int, default=25)
    args = parser.parse_args()
    s = SHAPES[args.shape]
    # (row, sentences per batch, beam): the bench's file rows and its one-sentence row
    rows = [("128 sentences, batches of 32, greedy", 32, 1), ("32 sentences, batches of 16, beam 4", 16, 4),
            ("8 sentences, one per call, greedy", 1, 1)]
    step = chain(s.d_model, s.ffn, s.layers, 6, s.vocab)  # self Q, K, V, out; cross Q, out
    encoder = chain(s.d_model, s.ffn, s.layers, 4, None)  # Q, K, V, out
    cross = chain(s.d_model, s.d_model, s.layers, 0, None)  # each decoder layer's cross K and V (as two chained products)
    print(f"{args.shape}: d_model {s.d_model}, {s.layers}+{s.layers} layers, FFN {s.ffn}, vocabulary {s.vocab}; "
          f"{args.threads} threads, median of {args.repeat}")
    for name, batch, beam in rows:
        source_tokens = batch * args.source_len
        t_step = timed(step, batch * beam, s.d_model, args.threads, args.repeat)
        t_enc = timed(encoder, source_tokens, s.d_model, args.threads, args.repeat)
        t_cross = timed(cross, source_tokens, s.d_model, args.threads, args.repeat)
        per_batch = t_enc + t_cross + args.tokens * t_step
        print(f"{name}: step products {t_step * 1e3:.2f} ms at {batch * beam} rows, encoder products "
              f"{(t_enc + t_cross) * 1e3:.1f} ms; at most {batch * args.tokens / per_batch:,.0f} tokens/s")


if __name__ == "__main__":
    main()
