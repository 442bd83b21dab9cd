"""The forbidden-token mask as the graphs add it (LogSoftmax, then an Add of a vocabulary-wide 0/-inf vector) against
the LogSoftmax alone with the mask written in place on the host (only the forbidden columns), at the opus-mt shape's
59,514 entries: same values bit for bit; median ms of each, in turns, one thread.

    python docs/measurements/int8-beam-tail/mask_in_place.py [ROWS]
"""

from __future__ import annotations

import sys

import numpy as np
from common import alternate
from onnx import TensorProto, helper, numpy_helper

from toolkit.runtimes.onnxruntime.sessions import create_session

VOCAB, WIDTH = 59_514, 8


def graph(with_mask: bool) -> bytes:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["h", "w"], ["x"]),
             helper.make_node("LogSoftmax", ["x"], ["lsm" if with_mask else "log_probs"], axis=-1)]
    inits = [numpy_helper.from_array(rng.standard_normal((WIDTH, VOCAB)).astype(np.float32), "w")]
    if with_mask:
        mask = np.zeros(VOCAB, np.float32)
        mask[VOCAB - 1] = -np.inf
        nodes.append(helper.make_node("Add", ["lsm", "mask"], ["log_probs"]))
        inits.append(numpy_helper.from_array(mask, "mask"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["r", WIDTH])],
                          [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["r", VOCAB])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    return m.SerializeToString()


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    in_graph, alone = create_session(graph(True), "cpu", threads=1), create_session(graph(False), "cpu", threads=1)
    h = np.random.default_rng(1).standard_normal((rows, WIDTH)).astype(np.float32)
    forbidden = np.array([VOCAB - 1])

    def add_in_graph() -> np.ndarray:
        return in_graph.run(None, {"h": h})[0]

    def in_place() -> np.ndarray:
        x = alone.run(None, {"h": h})[0]
        x[:, forbidden] = -np.inf
        return x

    assert np.array_equal(add_in_graph(), in_place())
    for _ in range(3):
        a, b = alternate(add_in_graph, in_place, 40)
        print(f"{rows} rows: LogSoftmax + mask Add {a * 1e3:.2f} ms, LogSoftmax + mask in place {b * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
