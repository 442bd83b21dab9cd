"""The shortlisted decoder: a decoder graph whose output layer reads a batch's candidate columns from its inputs.

The exported decoder ends in log_softmax over the whole vocabulary of an output layer: in fp32 hidden @ W + b, in the
int8 variant the same with W's int8 rows, their scales and zero points (an import adds a mask of the tokens it may
never emit after it). Rewritten, every weight of that layer with a vocabulary axis (W, b, the scales, that mask)
becomes an input that takes only a batch's candidate columns, gathered once per
batch, and `shortlist_mask` (rows, k) adds -inf where a row's own sentence may not emit the column, so each row's
log-softmax runs over its own sentence's candidates only (toolkit.core.shortlist). The layer computes what the
variant's own computes, at its precision, on the columns it is given. A weight the graph transposes before its
product (the int8 variant keeps the output layer's rows for the tied embedding's lookup) is fed already transposed:
as an input, the Transpose would run at every step (12 ms of a 40 ms int8 step at the opus-mt shape), where ONNX
Runtime folds it once for an initializer. A decoder whose weights lie in a file beside it keeps them there: the
rewritten graph still refers to that file (a session made from its bytes is told the folder: `folder` below) and the
weights to gather from are mapped from it, not copied (at the NLLB-600M shape the output layer alone is 1 GB in fp32).
Onnx and numpy only: the deploy path builds it at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.core.errors import UsageError

MASK = "shortlist_mask"  # (rows, k): 0 where the row's sentence may emit the column, -inf elsewhere
PREFIX = "shortlist."  # a gathered weight's input: PREFIX + the initializer's name
OUTPUT = "log_probs"


@dataclass(frozen=True)
class Gathered:
    """One weight input of the shortlisted decoder: fed `weight` gathered at the batch's candidates along `axis`,
    then transposed by `perm` (None: as it is)."""

    name: str
    weight: np.ndarray
    axis: int
    perm: tuple[int, ...] | None = None

    def take(self, ids: np.ndarray) -> np.ndarray:
        taken = np.take(self.weight, ids, axis=self.axis)
        return np.ascontiguousarray(taken if self.perm is None else taken.transpose(self.perm))


def shortlisted(source: Path | bytes, vocab: int) -> tuple[bytes, list[Gathered], Path | None]:
    """The decoder graph at `source` (any variant) rewritten as the module docstring says, each new weight input, and
    the folder its weights' file lies in (None: all inside the graph): a session made from the bytes needs it. A decoder
    that does not end in a log-softmax over an output layer with a vocabulary axis is a one-line error."""
    import onnx
    from onnx import helper

    folder = None if isinstance(source, bytes) else Path(source).parent
    model = onnx.load_model_from_string(source) if isinstance(source, bytes) else onnx.load(source, load_external_data=False)
    graph = model.graph
    tables = {t.name: t for t in graph.initializer}
    axis = {name: list(t.dims).index(vocab) for name, t in tables.items() if vocab in t.dims}
    # What depends on a vocabulary-wide weight; a lookup (Gather: the tied embedding) takes rows by token, not the
    # vocabulary, and its output does not.
    wide = set(axis)
    for node in graph.node:
        if node.op_type != "Gather" and any(i in wide for i in node.input):
            wide.update(node.output)
    producer = {o: n for n in graph.node for o in n.output}
    # The output layer: what log_probs reads back to the hidden state (through the tensors a wide weight reaches).
    layer, todo = [], [OUTPUT]
    while todo:
        node = producer.get(todo.pop())
        if node is not None and node not in layer:
            layer.append(node)
            todo.extend(i for i in node.input if i in wide and i not in axis)
    softmax = [n for n in layer if n.op_type == "LogSoftmax"]
    if OUTPUT not in wide or len(softmax) != 1:
        raise UsageError("--shortlist needs a decoder that ends in a log-softmax over its output layer; this one does not")
    # A Transpose of a wide weight alone: its output is fed (gathered, then transposed) in its place.
    transposed = {n.output[0]: (n.input[0], tuple(a.ints)) for n in layer if n.op_type == "Transpose" and n.input[0] in axis
                  for a in n.attribute if a.name == "perm"}
    inputs: list[Gathered] = []
    for node in layer:
        for k, name in enumerate(node.input):
            if name in axis or name in transposed:
                node.input[k] = PREFIX + name
                if all(PREFIX + name != g.name for g in inputs):
                    table, perm = transposed.get(name, (name, None))
                    inputs.append(Gathered(PREFIX + name, _weight(tables[table], folder), axis[table], perm))
    for g in inputs:
        shape = [d if i != g.axis else "shortlist" for i, d in enumerate(g.weight.shape)]
        dims = shape if g.perm is None else [shape[i] for i in g.perm]
        graph.input.append(helper.make_tensor_value_info(g.name, helper.np_dtype_to_tensor_dtype(g.weight.dtype), dims))
    graph.input.append(helper.make_tensor_value_info(MASK, onnx.TensorProto.FLOAT, ["batch", "shortlist"]))
    graph.node.append(helper.make_node("Add", [softmax[0].input[0], MASK], ["shortlist_logits"], name="shortlist_mask_add"))
    softmax[0].input[0] = "shortlist_logits"
    out = next(o for o in graph.output if o.name == OUTPUT)
    out.type.tensor_type.shape.dim[-1].Clear()
    out.type.tensor_type.shape.dim[-1].dim_param = "shortlist"
    _prune(graph)
    if model.ByteSize() >= 2**31:  # one protobuf message holds at most 2 GB
        raise UsageError("--shortlist rewrites the decoder in memory, and this one holds over 2 GB of weights; "
                         "decode it without --shortlist")
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.initializer)
    return model.SerializeToString(), inputs, folder if external else None


def _weight(table, folder: Path | None) -> np.ndarray:
    """An initializer's values: mapped read-only from its weights file where it lies in one (which must be a file
    inside the graph's own folder: a path out of the model directory is refused, never followed), else its own."""
    import onnx
    from onnx import helper, numpy_helper

    if table.data_location != onnx.TensorProto.EXTERNAL:
        return numpy_helper.to_array(table)
    where = {e.key: e.value for e in table.external_data}
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(table.data_type))
    shape = tuple(int(d) for d in table.dims)
    offset, length = int(where.get("offset", 0)), int(where.get("length", int(np.prod(shape)) * dtype.itemsize))
    path = (folder / where.get("location", "")).resolve() if folder is not None else None
    if path is None or not path.is_relative_to(folder.resolve()) or not path.is_file() or \
            length != int(np.prod(shape)) * dtype.itemsize or offset + length > path.stat().st_size:
        raise UsageError(f"the decoder's weight {table.name} names {where.get('location')!r}, not a weights file of its "
                         "own directory that holds it; re-export the model directory")
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def _prune(graph) -> None:
    """Drops the nodes no output needs, then the initializers no node reads; the rest keep their order."""
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
