"""The shortlisted decoder: a decoder graph whose output layer multiplies by weights given as inputs.

The exported decoder ends in log_softmax(hidden @ W + b) over the whole vocabulary. Rewritten, it takes
`shortlist_weight` (hidden size, k): the columns of W of a batch's candidates, gathered once per batch, and
`shortlist_bias` (rows, k): b of those columns where the row's own sentence may emit them, -inf elsewhere, so each row's
log-softmax runs over its own sentence's candidates only (toolkit.core.shortlist). The layers before the output layer
are the variant's own (int8, optimized); the output layer multiplies in float32 by the fp32 graph's weights.
Onnx and numpy only: the deploy path builds it at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.core.errors import UsageError

WEIGHT, BIAS = "shortlist_weight", "shortlist_bias"  # the rewritten decoder's extra inputs
OUTPUT = "log_probs"


@dataclass(frozen=True)
class OutputLayer:
    """Where the fp32 decoder's output layer reads: its input activation, its weight (and whether the graph multiplies
    by its transpose, as a table tied to the embedding is stored) and its bias (None: none)."""

    hidden: str
    weight: str
    transposed: bool
    bias: str | None


def output_layer(model) -> OutputLayer:
    """The output layer of an fp32 decoder graph (an onnx.ModelProto): LogSoftmax(MatMul(hidden, W) [+ b]), W an
    initializer or the Transpose of one. A graph of another shape is a one-line error."""
    producer = {o: n for n in model.graph.node for o in n.output}
    tables = {i.name for i in model.graph.initializer}
    problem = UsageError("--shortlist needs a decoder that ends in log_softmax(hidden @ W + b); this one does not")
    node = producer.get(OUTPUT)
    if node is None or node.op_type != "LogSoftmax":
        raise problem
    node, bias = producer.get(node.input[0]), None
    if node is not None and node.op_type == "Add":
        bias = next((i for i in node.input if i in tables), None)
        node = producer.get(next((i for i in node.input if i not in tables), ""))
    if node is None or node.op_type != "MatMul":
        raise problem
    hidden, weight = node.input
    if weight in tables:
        return OutputLayer(hidden, weight, False, bias)
    flip = producer.get(weight)
    if flip is not None and flip.op_type == "Transpose" and flip.input[0] in tables:
        return OutputLayer(hidden, flip.input[0], True, bias)
    raise problem


def output_weights(fp32: Path, layer: OutputLayer) -> tuple[np.ndarray, np.ndarray]:
    """The output layer's weight as (vocabulary, hidden) float32, rows contiguous (a batch gathers its candidates' rows),
    and its bias (vocabulary,) (zeros where it has none), read from the fp32 graph at `fp32`."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    model = onnx.load(fp32, load_external_data=False)
    arrays = {}
    for tensor in model.graph.initializer:
        if tensor.name in (layer.weight, layer.bias):
            if uses_external_data(tensor):
                load_external_data_for_tensor(tensor, str(fp32.parent))
            arrays[tensor.name] = numpy_helper.to_array(tensor).astype(np.float32)
    weight = arrays[layer.weight] if layer.transposed else arrays[layer.weight].T
    bias = arrays[layer.bias] if layer.bias else np.zeros(len(weight), np.float32)
    return np.ascontiguousarray(weight), bias.reshape(-1)


def shortlisted(source: Path | bytes, layer: OutputLayer) -> bytes:
    """The decoder graph at `source` (any variant of it) with its output layer replaced by one over the given columns
    (module docstring). What only the old output layer read is dropped."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load_model_from_string(source) if isinstance(source, bytes) else onnx.load(source)
    graph = model.graph
    last = next(n for n in graph.node if OUTPUT in n.output)
    if layer.hidden not in {o for n in graph.node for o in n.output}:
        raise UsageError(f"--shortlist cannot find the output layer's input '{layer.hidden}' in this variant; use --variant fp32")
    last.input[0] = "shortlist_logits"
    graph.node.extend([helper.make_node("MatMul", [layer.hidden, WEIGHT], ["shortlist_raw"], name="shortlist_matmul"),
                       helper.make_node("Add", ["shortlist_raw", BIAS], ["shortlist_logits"], name="shortlist_add")])
    graph.input.extend([helper.make_tensor_value_info(WEIGHT, TensorProto.FLOAT, [None, "shortlist"]),
                        helper.make_tensor_value_info(BIAS, TensorProto.FLOAT, ["batch", "shortlist"])])
    out = next(o for o in graph.output if o.name == OUTPUT)
    out.type.tensor_type.shape.dim[-1].Clear()
    out.type.tensor_type.shape.dim[-1].dim_param = "shortlist"
    _prune(graph)
    return model.SerializeToString()


def _prune(graph) -> None:
    """Drops the nodes no output needs, then the initializers no node reads."""
    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output}
    needed, todo = set(), [o.name for o in graph.output]
    while todo:
        i = producer.get(todo.pop())
        if i is not None and i not in needed:
            needed.add(i)
            todo.extend(_reads(nodes[i]))
    kept = [n for i, n in enumerate(nodes) if i in needed]
    read = {name for n in kept for name in _reads(n)}
    tables = [t for t in graph.initializer if t.name in read]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(tables)


def _reads(node) -> list[str]:
    """The tensors a node reads, those its subgraphs (If, Loop) read from the outer scope included."""
    names = [i for i in node.input if i]
    for attr in node.attribute:
        for sub in [attr.g, *attr.graphs]:
            names.extend(i for n in sub.node for i in _reads(n))
    return names
