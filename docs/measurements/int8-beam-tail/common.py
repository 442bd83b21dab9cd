"""What the three measurements share: the repository on the path, a graph from nodes, and alternating timings."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository, for tk's own session options


def model(nodes: list, inputs: list, outputs: list) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    return m.SerializeToString()


def alternate(first, second, rounds: int) -> tuple[float, float]:
    """Median seconds of each of two calls, timed in turns so that the machine's drift falls on both."""
    a, b = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        first()
        a.append(time.perf_counter() - t)
        t = time.perf_counter()
        second()
        b.append(time.perf_counter() - t)
    return float(np.median(a)), float(np.median(b))
