"""A decoder graph whose cross-attention reads the encoder's keys and values once per sentence, not once per row.

At beam 4 a decoder step has four rows per sentence, and each row's cross-attention read its own copy of the
sentence's keys and values (the state was replicated by row). Regrouped, the rows of a sentence are the query
positions of one attention over the sentence's keys and values: the same attention (every query position attends to
all of them, masked by the source length), with a quarter of the memory read and the copies never made.

The graph finds the group size from its inputs' shapes: rows = token's rows, sentences = the cross keys' rows, each
sentence's rows next to each other (the row-selection in toolkit.core.decoding.take_sentence_rows keeps that order).
Fed one row of keys and values per row, as before, every group is one row and the graph computes what it did.
"""

from __future__ import annotations

from pathlib import Path

# The decoder graph's metadata entry saying its cross-attention is per sentence (the backend reads it from the session,
# whose saved optimised copy in the start-up cache keeps it).
MARK = ("tk.cross_attention", "per sentence")
TOKEN = "token"  # the decoder's input of one token a row: its rows are the step's


def cross_per_sentence(graph: Path | bytes, constants: frozenset[str]) -> bytes | None:
    """The decoder `graph` with its cross-attention regrouped per sentence (module docstring), marked with MARK; None
    where that does not apply: no fused cross-attention, a constant input (`constants`: the encoder's outputs and the
    source lengths) read by anything else but a Shape of its rows (its rows would no longer match the step's rows), or
    weights stored outside the graph (not rewritten in memory), or a graph that does not parse (ONNX Runtime's load then
    says what is wrong with it, as for any other graph)."""
    import numpy as np
    from onnx import helper, numpy_helper

    from toolkit.graphs.graph_files import rewritable

    model = rewritable(graph)
    if model is None:
        return None
    nodes = list(model.graph.node)  # one wrapper per node: they are told apart by id below
    # A cross-attention: MultiHeadAttention whose keys and values are constant inputs, its mask (slot 4) a Cast of one.
    casts = {n.output[0]: n for n in nodes if n.op_type == "Cast" and n.input[0] in constants}
    cross = [n for n in nodes if n.op_type == "MultiHeadAttention" and len(n.input) > 4 and n.input[1] in constants
             and n.input[2] in constants and n.input[4] in casts and not any(n.input[3:4]) and not any(n.input[5:])]
    # A read of a constant input's row count (Shape, its first axis only; M2M100's decoder sizes its positions by
    # src_len's rows) meant the step's rows, which it equalled while the constants had a row per row: it reads the
    # token's rows instead.
    rows_reads = [n for n in nodes if n.op_type == "Shape" and n.input[0] in constants and _first_axis(n)]
    token = next((i.name for i in model.graph.input if i.name == TOKEN), None)
    regrouped = {id(n) for n in cross}
    allowed = ({(id(n), slot) for n in cross for slot in (1, 2, 4)} | {(id(c), 0) for c in casts.values()}
               | ({(id(n), 0) for n in rows_reads} if token else set()))
    reads = [(id(n), slot) for n in nodes for slot, name in enumerate(n.input) if name in constants or name in casts]
    if not cross or any(r not in allowed for r in reads) or any(o.name in constants for o in model.graph.output):
        return None
    for node in rows_reads:
        node.input[0] = token
    # [sentences, -1, 0]: the rows of each sentence as query positions, the model width kept (Reshape's 0).
    first = cross[0].input[1]
    prefix = "tk_sentence_cross"
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1, 0], np.int64), f"{prefix}/rest"))
    head = [helper.make_node("Shape", [first], [f"{prefix}/sentences"], start=0, end=1),
            helper.make_node("Concat", [f"{prefix}/sentences", f"{prefix}/rest"], [f"{prefix}/grouped"], axis=0)]
    rewritten = []
    for node in nodes:
        if id(node) not in regrouped:
            rewritten.append(node)
            continue
        query, out = node.input[0], node.output[0]
        rewritten += [helper.make_node("Shape", [query], [f"{prefix}/{out}/shape"]),
                      helper.make_node("Reshape", [query, f"{prefix}/grouped"], [f"{prefix}/{out}/query"])]
        node.input[0], node.output[0] = f"{prefix}/{out}/query", f"{prefix}/{out}"
        rewritten += [node, helper.make_node("Reshape", [f"{prefix}/{out}", f"{prefix}/{out}/shape"], [out])]
    del model.graph.node[:]
    model.graph.node.extend(head + rewritten)
    helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, MARK[0]: MARK[1]})
    return model.SerializeToString()


def _first_axis(node) -> bool:
    """A Shape node that reads its input's first axis alone (start 0, end 1)."""
    from onnx import helper

    bounds = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return bounds.get("start", 0) == 0 and bounds.get("end") == 1


def digest() -> str:
    """What the start-up cache adds to a regrouped decoder's key: this module's CRC-32 (a changed rewrite, a new entry)."""
    import zlib

    return f"sentence-cross {zlib.crc32(Path(__file__).read_bytes()):08x}"
