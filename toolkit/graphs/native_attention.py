"""A CPU decoder graph whose step attention runs on tk's own kernels (toolkit/runtimes/onnxruntime/kernels/attention.c)
instead of com.microsoft.MultiHeadAttention.

Two forms are rewritten, both what toolkit.graphs.attention_fusion (and sentence_cross) write for a decoder step:
- self-attention with a cache: MultiHeadAttention(query, key, value, past_key, past_value), no mask or bias, three
  outputs -> tk.kernels.SelfAttention(query, key, value, past_key, past_value);
- cross-attention over the encoder's keys and values: MultiHeadAttention(query, key [G, H, S, D], value, mask = the
  int32 source lengths), one output -> tk.kernels.CrossAttention(query, key, value, lengths).
Anything else (the encoder's attention, a mask of another form, an attention bias) is left as it is; a graph with none
of them, or with weights stored outside it (not rewritten in memory), gives None. onnx only: the deploy path runs it.

With beam_rows, where every cache the self-attentions read is a graph input no other node reads, they become
tk.kernels.SelfAttentionRows with one more graph input, ROWS (int64 [batch]): the row of the past caches each row
continues. A beam step's reorder then leaves the caches as they are and changes ROWS only, and the kernel's copy of the
cache into its present output is the reorder (one copy of every cache a step, not two). The metadata entry
ROWS_METADATA names those caches (the backend's select and reorder leave them to the graph).
"""

from __future__ import annotations

from pathlib import Path

DOMAIN = "tk.kernels"
ROWS = "tk_past_rows"
ROWS_METADATA = "tk.past_rows_for"


def native_attention(graph: Path | bytes, beam_rows: bool = False) -> bytes | None:
    """The graph with its decoder-step attention on tk's kernels (module docstring), or None where nothing changes."""
    import onnx
    from onnx import helper

    from toolkit.graphs.graph_files import rewritable

    model = rewritable(graph)
    if model is None:
        return None
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in model.graph.input if v.type.tensor_type.HasField("shape")}
    # Masks that are source lengths: a Cast to int32 of a graph input of one axis.
    lengths = {n.output[0] for n in model.graph.node if n.op_type == "Cast" and ranks.get(n.input[0]) == 1
               and any(a.name == "to" and a.i == onnx.TensorProto.INT32 for a in n.attribute)}
    kinds = [_kind(node, ranks, lengths) for node in model.graph.node]
    caches = [name for node, kind in zip(model.graph.node, kinds) if kind == "SelfAttention" for name in node.input[6:8]]
    # Other readers of a cache may only read its length (a Shape from axis 1 on: the decoder's position), which a
    # reorder does not change; its rows are the past's, not the step's.
    readers = [name for node in model.graph.node if not _length_only(node) for name in node.input]
    graph_inputs = {v.name for v in model.graph.input}
    with_rows = (beam_rows and bool(caches) and all(c in graph_inputs and readers.count(c) == 1 for c in caches)
                 and not {o.name for o in model.graph.output} & set(caches))
    rewritten, changed = [], 0
    for node, kind in zip(model.graph.node, kinds):
        if kind is None:
            rewritten.append(node)
            continue
        inputs = list(node.input)
        kept = [inputs[0], inputs[1], inputs[2], inputs[6], inputs[7]] if kind == "SelfAttention" else inputs[:3] + [inputs[4]]
        if kind == "SelfAttention" and with_rows:
            kind, kept = "SelfAttentionRows", [*kept, ROWS]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        rewritten.append(helper.make_node(kind, kept, list(node.output), name=node.name, domain=DOMAIN,
                                          num_heads=attrs["num_heads"], scale=float(attrs["scale"])))
        changed += 1
    if not changed:
        return None
    del model.graph.node[:]
    model.graph.node.extend(rewritten)
    if with_rows:
        model.graph.input.append(helper.make_tensor_value_info(ROWS, onnx.TensorProto.INT64, ["batch"]))
        helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props}, ROWS_METADATA: ",".join(caches)})
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return model.SerializeToString()


def _length_only(node) -> bool:
    """A Shape node that leaves out the batch axis of a tensor of 4 axes (a cache's [B, H, P, D])."""
    if node.op_type != "Shape" or node.domain not in ("", "ai.onnx"):
        return False
    start = next((a.i for a in node.attribute if a.name == "start"), 0)
    return start >= 1 or -3 <= start < 0


def _kind(node, ranks: dict[str, int], lengths: set[str]) -> str | None:
    """Which of tk's kernels computes this node, or None."""
    if node.op_type != "MultiHeadAttention" or node.domain != "com.microsoft":
        return None
    attrs = {a.name for a in node.attribute}
    if not {"num_heads", "scale"} <= attrs or attrs - {"num_heads", "scale", "unidirectional"}:
        return None
    if any(a.name == "unidirectional" and a.i for a in node.attribute):
        return None
    slots = list(node.input) + [""] * (8 - len(node.input))
    query, key, value, bias, mask, attention_bias, past_key, past_value = slots[:8]
    if not (query and key and value) or bias or attention_bias or len(slots) > 8:
        return None
    if past_key and past_value and not mask and len(node.output) == 3:
        return "SelfAttention"
    # Cross-attention: the keys and values are graph inputs of 4 axes (the encoder's [G, H, S, D]), the mask the
    # source lengths.
    if (not past_key and not past_value and mask in lengths and len(node.output) == 1
            and ranks.get(key) == 4 and ranks.get(value) == 4):
        return "CrossAttention"
    return None
