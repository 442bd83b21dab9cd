"""Adds of an all-zero bias after a matrix product, dropped from the CPU variants' graphs.

Marian's `final_logits_bias` is a buffer of zeros that no training changes; the exported graph adds it to the
output layer's 59,514 logits of every row at every step, a pass over the largest tensor of the step (2 ms of an
86 ms fp32 decoder step at 64 rows, opus-mt shape, one thread). Adding +0.0 changes no value but the sign of a
-0.0, which no later op (LogSoftmax, a comparison) tells apart, so the graph without it computes the same
log-probabilities. Only an Add whose other operand is a MatMul's or Gemm's output, with a constant bias of that
product's own width (1 x width or width), goes: the sum then has the product's shape, so nothing downstream sees a
different shape. onnx and numpy only.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


def _width(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> int | None:
    """The output width of a MatMul or Gemm by a constant weight, or None."""
    if len(node.input) < 2 or node.input[1] not in inits:
        return None
    dims = list(inits[node.input[1]].dims)
    if len(dims) != 2:
        return None
    trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0) if node.op_type == "Gemm" else 0
    return dims[0] if trans_b else dims[1]


def drop_zero_biases(model: onnx.ModelProto) -> int:
    """Removes each Add of an all-zero constant bias to a MatMul/Gemm output (see the module); returns how many."""
    graph = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return 0  # a subgraph may read an Add's output by name; such graphs (none of tk's CPU graphs) stay as they are
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    outputs = {o.name for o in graph.output}
    rename: dict[str, str] = {}
    keep = []
    for node in graph.node:
        if node.op_type == "Add" and len(node.input) == 2 and node.output[0] not in outputs:
            for product, bias in (node.input, node.input[::-1]):
                maker = producer.get(product)
                if bias not in inits or maker is None or maker.op_type not in ("MatMul", "Gemm") or product in outputs:
                    continue
                dims, width = list(inits[bias].dims), _width(maker, inits)
                rank_ok = len(dims) == 1 or (len(dims) == 2 and maker.op_type == "Gemm")  # a Gemm's output is 2-D
                if (width is None or not rank_ok or dims[-1] != width or any(d != 1 for d in dims[:-1])
                        or np.any(numpy_helper.to_array(inits[bias]))):
                    continue
                rename[node.output[0]] = product
                break
            if node.output[0] in rename:
                continue
        keep.append(node)
    if not rename:
        return 0
    for node in keep:
        for i, name in enumerate(node.input):
            while name in rename:
                name = rename[name]
            node.input[i] = name
    del graph.node[:]
    graph.node.extend(keep)
    used = {i for n in keep for i in n.input}
    still = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(still)
    hints = [v for v in graph.value_info if v.name not in rename]
    del graph.value_info[:]
    graph.value_info.extend(hints)
    return len(rename)
