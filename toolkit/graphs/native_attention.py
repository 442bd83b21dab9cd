"""A CPU decoder graph whose step attention runs on tk's own kernels (toolkit/runtimes/onnxruntime/kernels/attention.c)
instead of com.microsoft.MultiHeadAttention.

Two forms are rewritten, both what toolkit.graphs.attention_fusion (and sentence_cross) write for a decoder step:
- self-attention with a cache: MultiHeadAttention(query, key, value, past_key, past_value), no mask or bias, three
  outputs -> tk.kernels.SelfAttention(query, key, value, past_key, past_value);
- cross-attention over the encoder's keys and values: MultiHeadAttention(query, key [G, H, S, D], value, mask = the
  int32 source lengths), one output -> tk.kernels.CrossAttention(query, key, value, lengths).
Anything else (the encoder's attention, a mask of another form, an attention bias) is left as it is; a graph with none
of them, or with weights stored outside it (not rewritten in memory), gives None. onnx only: the deploy path runs it.
"""

from __future__ import annotations

from pathlib import Path

DOMAIN = "tk.kernels"


def native_attention(graph: Path | bytes) -> bytes | None:
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
    rewritten, changed = [], 0
    for node in model.graph.node:
        kind = _kind(node, ranks, lengths)
        if kind is None:
            rewritten.append(node)
            continue
        inputs = list(node.input)
        kept = [inputs[0], inputs[1], inputs[2], inputs[6], inputs[7]] if kind == "SelfAttention" else inputs[:3] + [inputs[4]]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        rewritten.append(helper.make_node(kind, kept, list(node.output), name=node.name, domain=DOMAIN,
                                          num_heads=attrs["num_heads"], scale=float(attrs["scale"])))
        changed += 1
    if not changed:
        return None
    del model.graph.node[:]
    model.graph.node.extend(rewritten)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return model.SerializeToString()


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
