"""The start-up cache's prepacked weights (toolkit.runtimes.onnxruntime.graph_cache): a cached graph must run, and give
the graph's own outputs, whatever offsets ONNX Runtime chose for the prepacked weights it saved.

onnxruntime 1.31.1 writes a prepacked weight that follows a smaller tensor at an offset that is only 8-byte aligned, and
its matrix kernels, reading it in place from the mapped file, crash the process (an imported tiny Marian with merged
Q/K/V projections did, at its second start). Each start runs in a subprocess here, so such a crash fails the test and
not the test worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from toolkit.runtimes.onnxruntime import graph_cache

pytestmark = pytest.mark.timeout(120)

START = """
import json, sys
import numpy as np
from pathlib import Path
from toolkit.runtimes.onnxruntime import graph_cache
from toolkit.runtimes.onnxruntime.sessions import create_session
graph = Path(sys.argv[1])
session = graph_cache.cached_session(graph, "test-" + graph.stem, create_session)
x = np.random.default_rng(0).standard_normal((40, 64)).astype(np.float32)
print(json.dumps(session.run(None, {"x": x})[0].tolist()))
"""


def _graph(path: Path, width: int) -> Path:
    """x (B, 64) -> x W1 + b -> W2: two prepacked products with a `width`-float bias between them in the data file
    (258 floats: ONNX Runtime 1.31.1 writes W2's packed copy at an offset 8 bytes past a multiple of 64)."""
    rng = np.random.default_rng(width)
    weights = {"W1": (64, width), "b": (width,), "W2": (width, 64)}
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name) for name, shape in weights.items()]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("MatMul", ["hb", "W2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return path


def _start(graph: Path, cache: Path) -> list:
    env = {"TK_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", START, str(graph)], capture_output=True, text=True, env=env, timeout=90,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    return json.loads(result.stdout)


@pytest.mark.parametrize("width", [258, 256])
def test_a_cached_graph_runs_and_computes_what_the_graph_computes(tmp_path, width):
    """The first start saves the optimised graph, the second loads it; both give the uncached session's outputs."""
    graph, cache = _graph(tmp_path / f"g{width}.onnx", width), tmp_path / "cache"
    first = _start(graph, cache)
    entries = list((cache / "graphs").iterdir())
    assert len(entries) == 1 and (entries[0] / graph_cache.GRAPH).exists()
    second = _start(graph, cache)  # from the cache entry
    assert second == first
    saved = graph_cache.prepacked_aligned(entries[0] / graph_cache.GRAPH)
    assert saved, "a cache entry whose prepacked weights its kernels cannot read was kept"


def test_aligned_prepacked_weights_are_kept_in_the_cache(tmp_path):
    """The check refuses only what would crash: where ONNX Runtime aligned every packed weight, the entry keeps them
    (loading them is what the cache is for)."""
    graph, cache = _graph(tmp_path / "g256.onnx", 256), tmp_path / "cache"
    _start(graph, cache)
    (entry,) = (cache / "graphs").iterdir()
    model = onnx.load(entry / graph_cache.GRAPH, load_external_data=False)
    assert any(e.key.startswith("prepacked") for t in model.graph.initializer for e in t.external_data)
