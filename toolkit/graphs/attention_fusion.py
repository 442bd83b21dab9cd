"""Fused attention for the CPU graphs: each exported attention core becomes one MultiHeadAttention.

The exporter writes every attention block as a chain of about 15 small nodes (Reshape, Transpose,
batched MatMul, Div, Where, Softmax, Mul, ...); at batch 1 the decoder step spends more time in
them and in the executor's per-node overhead than in the matrix work. ONNX Runtime's contrib
operator com.microsoft.MultiHeadAttention has a CPU kernel that does the same in one node, and
projections that read the same input (Q/K/V, or every layer's cross keys/values) become one
MatMul and a Split, so each activation is read (and, in the int8 graphs, quantised) once.

The rewrite matches the exported pattern exactly and changes nothing it does not recognise: the
graph's inputs and outputs (names, shapes, the per-layer cache outputs) stay as they are, and a
graph without the pattern (the GRU) or whose attention weights are graph outputs (the attention
variant) comes back unchanged. onnx and numpy only (the deploy path builds variants without torch).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"


class _Graph:
    """Index of one graph: who produces and who consumes each tensor, and its constants."""

    def __init__(self, graph: onnx.GraphProto):
        self.g = graph
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in graph.node:
            for i in n.input:
                self.consumers[i].append(n)
        self.inits = {i.name: i for i in graph.initializer}
        self.outputs = {o.name for o in graph.output}
        self.inputs = {i.name: i for i in graph.input}

    def node(self, name: str, op: str) -> onnx.NodeProto | None:
        n = self.producer.get(name)
        return n if n is not None and n.op_type == op else None

    def const(self, name: str) -> np.ndarray | None:
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        n = self.node(name, "Constant")
        if n is not None and n.attribute and n.attribute[0].name == "value":
            return numpy_helper.to_array(n.attribute[0].t)
        return None

    def shape_ints(self, name: str) -> list[int | None] | None:
        """A shape tensor's entries where they are constants (a Concat of pieces may be partly dynamic)."""
        c = self.const(name)
        if c is not None:
            return [int(v) for v in c.reshape(-1)]
        n = self.node(name, "Concat")
        if n is None:
            return None
        out: list[int | None] = []
        for piece in n.input:
            c = self.const(piece)
            out += [int(v) for v in c.reshape(-1)] if c is not None else [None]  # a dynamic piece is one entry here
        return out


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _perm(g: _Graph, name: str, perm: list[int]) -> onnx.NodeProto | None:
    n = g.node(name, "Transpose")
    return n if n is not None and list(_attr(n, "perm", [])) == perm else None


def _split_heads(g: _Graph, name: str) -> tuple[str, int, int] | None:
    """Reshape(x, (B, L, H, d)) -> Transpose(0, 2, 1, 3): (x, H, d) for x in (B, L, H*d)."""
    t = _perm(g, name, [0, 2, 1, 3])
    r = g.node(t.input[0], "Reshape") if t is not None else None
    shape = g.shape_ints(r.input[1]) if r is not None else None
    if shape is None or len(shape) != 4 or shape[2] is None or shape[3] is None:
        return None
    return r.input[0], shape[2], shape[3]


def _key_lengths(g: _Graph, less: onnx.NodeProto) -> str | None:
    """The 1-D graph input whose entries are the valid key counts, if `less` is arange(S) < lengths (broadcast)."""
    rng = g.node(less.input[0], "Range")
    if rng is None or g.const(rng.input[0]) is None or int(g.const(rng.input[0])) != 0 \
            or g.const(rng.input[2]) is None or int(g.const(rng.input[2])) != 1:
        return None
    name = less.input[1]
    while name not in g.inputs:  # repeat_interleave over the heads and the query axis: shape only, no arithmetic
        n = g.producer.get(name)
        if n is None or n.op_type not in ("Unsqueeze", "Expand", "Reshape"):
            return None
        name = n.input[0]
    dims = g.inputs[name].type.tensor_type.shape.dim
    return name if len(dims) == 1 else None


# Over 60 lines: it walks one exported pattern node by node, each step a guard that returns None;
# split, the pieces would pass the half-matched chain between them.
def _match(g: _Graph, softmax: onnx.NodeProto) -> dict | None:
    """The attention core around one Softmax, as MultiHeadAttention's inputs, or None if it is not the exported pattern."""
    if _attr(softmax, "axis", -1) not in (-1, 2):
        return None
    chain = [softmax]
    scores, lengths, less = softmax.input[0], None, None
    where = g.node(scores, "Where")
    if where is not None:  # padded keys: Where(Not(arange < src_len), -big, scores)
        inv = g.node(where.input[0], "Not")
        less = g.node(inv.input[0], "Less") if inv is not None else None
        fill = g.const(where.input[1])
        if less is None or fill is None or fill.size != 1 or float(fill) > -1e4:
            return None
        lengths = _key_lengths(g, less)
        if lengths is None:
            return None
        chain += [where]  # the mask nodes (Not, Less, Cast) may be shared by every layer
        scores = where.input[2]
    div = g.node(scores, "Div")
    c = g.const(div.input[1]) if div is not None else None
    if c is None or c.size != 1:
        return None
    bmm = g.node(div.input[0], "MatMul")
    if bmm is None:
        return None
    chain += [div, bmm]
    qr = g.node(bmm.input[0], "Reshape")
    kt = _perm(g, bmm.input[1], [0, 2, 1])
    kr = g.node(kt.input[0], "Reshape") if kt is not None else None
    q = _split_heads(g, qr.input[0]) if qr is not None else None
    if q is None or kr is None:
        return None
    chain += [kt]
    query, heads, head_size = q

    probs = softmax.output[0]
    users = g.consumers[probs]
    if len(users) == 1 and users[0].op_type == "Mul" and less is not None:  # zeroes fully masked rows
        mul = users[0]
        cast = g.node(mul.input[1], "Cast")
        if cast is None or cast.input[0] != less.output[0]:
            return None
        chain += [mul]
        probs = mul.output[0]
        users = g.consumers[probs]
    if len(users) != 1 or users[0].op_type != "MatMul" or users[0].input[0] != probs:
        return None
    bmm_v = users[0]
    vr = g.node(bmm_v.input[1], "Reshape")
    merge = g.consumers[bmm_v.output[0]]
    o4 = merge[0] if len(merge) == 1 and merge[0].op_type == "Reshape" else None
    t = g.consumers[o4.output[0]] if o4 is not None else []
    ot = t[0] if len(t) == 1 and list(_attr(t[0], "perm", [])) == [0, 2, 1, 3] else None
    o3 = g.consumers[ot.output[0]] if ot is not None else []
    if vr is None or len(o3) != 1 or o3[0].op_type != "Reshape":
        return None
    chain += [bmm_v, o4, ot]
    # Every intermediate must be private to the chain: attention weights that are graph outputs
    # (the attention variant) or read elsewhere keep the graph as it is.
    inside = {n.output[0] for n in chain} | {o3[0].output[0]}
    for n in chain:
        for o in n.output:
            if o in g.outputs or any(u.output[0] not in inside for u in g.consumers[o]):
                return None

    key, value = kr.input[0], vr.input[0]
    # Keys/values still in (B, L, H*d) form are passed as such (BSD), so their split-heads nodes go
    # too; the cache and the encoder's cross keys are already (B, H, L, d) (BNSH) and stay so.
    past = _cache(g, key, kr), _cache(g, value, vr)
    if past[0] is not None and past[1] is not None:  # decoder self-attention: the op appends to the cache itself
        (k3, past_k, cat_k), (v3, past_v, cat_v) = past
        return {"query": query, "key": k3, "value": v3, "past": [past_k, past_v], "present": [key, value],
                "drop": [cat_k, cat_v], "lengths": lengths, "heads": heads, "scale": 1.0 / float(c), "output": o3[0]}
    k3, v3 = _split_heads(g, key), _split_heads(g, value)
    if k3 is not None and v3 is not None and all(len(g.consumers[x]) == 1 for x in (key, value)):
        key, value = k3[0], v3[0]
    return {"query": query, "key": key, "value": value, "past": [], "present": [], "drop": [],
            "lengths": lengths, "heads": heads, "scale": 1.0 / float(c), "output": o3[0]}


def _cache(g: _Graph, name: str, reader: onnx.NodeProto) -> tuple[str, str, onnx.NodeProto] | None:
    """Concat(past, split_heads(x), axis=2) whose result only the graph's output and this attention read:
    (x, past, the Concat), so that MultiHeadAttention's present output can take the Concat's place."""
    cat = g.node(name, "Concat")
    if cat is None or len(cat.input) != 2 or _attr(cat, "axis") not in (2, -2) or cat.input[0] not in g.inputs:
        return None
    new = _split_heads(g, cat.input[1])
    if new is None or len(g.consumers[cat.input[1]]) != 1 or len(g.consumers[new[0]]) != 1:
        return None
    if any(u.output[0] != reader.output[0] for u in g.consumers[name]):
        return None
    return new[0], cat.input[0], cat


def _through_shape_ops(g: _Graph, name: str) -> str:
    """`name` back through Unsqueeze/Expand/Reshape: nodes that move values, never compute them."""
    while (n := g.producer.get(name)) is not None and n.op_type in ("Unsqueeze", "Expand", "Reshape"):
        name = n.input[0]
    return name


def _padding_mask(g: _Graph, name: str) -> tuple[str, list[onnx.NodeProto]] | None:
    """The key-length input of an additive padding mask Unsqueeze(Where(arange(S) < lengths, 0, -big), [1, 2]) (what
    transformers' encoder-decoders build from the attention mask), and its nodes; None for any other addend (T5's
    position bias, a causal mask)."""
    unsq = g.node(name, "Unsqueeze")
    axes = g.const(unsq.input[1]) if unsq is not None else None
    where = g.node(unsq.input[0], "Where") if axes is not None and [int(a) for a in axes.reshape(-1)] == [1, 2] else None
    less = g.node(where.input[0], "Less") if where is not None else None
    keep, fill = (g.const(where.input[1]), g.const(where.input[2])) if less is not None else (None, None)
    if keep is None or fill is None or keep.size != 1 or float(keep) != 0.0 or fill.size != 1 or float(fill) > -1e4:
        return None
    rng = g.node(_through_shape_ops(g, less.input[0]), "Range")
    if rng is None or g.const(rng.input[0]) is None or int(g.const(rng.input[0])) != 0 \
            or g.const(rng.input[2]) is None or int(g.const(rng.input[2])) != 1:
        return None
    lengths = _through_shape_ops(g, less.input[1])
    if lengths not in g.inputs or len(g.inputs[lengths].type.tensor_type.shape.dim) != 1:
        return None
    return lengths, [unsq, where]


def _width(g: _Graph, name: str) -> int | None:
    """The last axis of a projection's output, Add(MatMul(x, W), bias) or MatMul(x, W), from its weights' dims (their
    values stay unread)."""
    n = g.producer.get(name)
    if n is not None and n.op_type == "Add":
        for operand in n.input:
            if operand in g.inits and len(g.inits[operand].dims) == 1:
                return int(g.inits[operand].dims[0])
        n = next((g.producer[i] for i in n.input if i in g.producer and g.producer[i].op_type == "MatMul"), None)
    if n is None or n.op_type != "MatMul":
        return None
    w, t = n.input[1], _perm(g, n.input[1], [1, 0])
    if w in g.inits and len(g.inits[w].dims) == 2:
        return int(g.inits[w].dims[1])
    if t is not None and t.input[0] in g.inits and len(g.inits[t.input[0]].dims) == 2:
        return int(g.inits[t.input[0]].dims[0])
    return None


def _heads_4d(g: _Graph, name: str, perm: list[int]) -> tuple[str, int, int] | None:
    """Transpose(Reshape(x, (B, L, H or -1, d)), perm): (x, H, d) for x a projection's (B, L, H*d) output."""
    t = _perm(g, name, perm)
    r = g.node(t.input[0], "Reshape") if t is not None else None
    shape = g.shape_ints(r.input[1]) if r is not None else None
    if shape is None or len(shape) != 4 or shape[3] is None or shape[3] <= 0:
        return None
    heads = shape[2] if shape[2] is not None and shape[2] > 0 else None
    if heads is None:  # transformers writes -1 for the heads: the projection's width tells them
        width = _width(g, r.input[0])
        heads = width // shape[3] if width and width % shape[3] == 0 else None
    return (r.input[0], heads, shape[3]) if heads else None


def _hf_keys(g: _Graph, name: str, reader: onnx.NodeProto, transposed: bool) -> dict | None:
    """What the attention reads as keys (transposed: MatMul's right operand, keys transposed) or values, in
    transformers' form: a (B, H, S, d) graph input (the cross cache: bnsh), Concat(past, heads(x)) (the
    self-attention cache) or heads(x) itself; x the (B, L, H*d) projection otherwise."""
    if transposed:
        whole = _heads_4d(g, name, [0, 2, 3, 1])  # the exporter's one transpose of (B, L, H, d) to (B, H, d, L)
        if whole is not None:
            return {"x": whole[0], "bnsh": False}
        t = _perm(g, name, [0, 1, 3, 2])
        if t is None:
            return None
        reader, name = t, t.input[0]
    if name in g.inputs and len(g.inputs[name].type.tensor_type.shape.dim) == 4:
        return {"x": name, "bnsh": True}
    cat = g.node(name, "Concat")
    if cat is not None:
        if len(cat.input) != 2 or _attr(cat, "axis") not in (2, -2) or cat.input[0] not in g.inputs:
            return None
        new = _heads_4d(g, cat.input[1], [0, 2, 1, 3])
        if new is None or any(u is not reader for u in g.consumers[name]) or len(g.consumers[cat.input[1]]) != 1:
            return None
        return {"x": new[0], "bnsh": False, "past": cat.input[0], "present": name, "cat": cat}
    own = _heads_4d(g, name, [0, 2, 1, 3])
    return {"x": own[0], "bnsh": False} if own is not None and len(g.consumers[name]) == 1 else None


# Over 60 lines: one exported pattern walked node by node, each step a guard that returns None.
def _match_hf(g: _Graph, softmax: onnx.NodeProto) -> dict | None:
    """The attention core around one Softmax in transformers' form (BART, Marian, M2M100/NLLB, mBART, exported by
    torch.export): Softmax(MatMul(heads(q), keys^T) * scale [+ padding mask]) @ values, heads merged by
    Transpose + Reshape. None for anything else (T5 has no scale and adds a position bias)."""
    if _attr(softmax, "axis", -1) != -1:
        return None
    chain, lengths = [softmax], None
    scores = g.producer.get(softmax.input[0])
    if scores is not None and scores.op_type == "Add":
        for k in (0, 1):
            mask = _padding_mask(g, scores.input[k])
            if mask is not None and g.node(scores.input[1 - k], "Mul") is not None:
                lengths, _ = mask
                chain.append(scores)
                scores = g.producer[scores.input[1 - k]]
                break
        else:
            return None
    if scores is None or scores.op_type != "Mul":
        return None
    c = g.const(scores.input[1])
    bmm = g.node(scores.input[0], "MatMul")
    q = _heads_4d(g, bmm.input[0], [0, 2, 1, 3]) if bmm is not None and c is not None and c.size == 1 else None
    keys = _hf_keys(g, bmm.input[1], bmm, transposed=True) if q is not None else None
    users = g.consumers[softmax.output[0]]
    if keys is None or len(users) != 1 or users[0].op_type != "MatMul" or users[0].input[0] != softmax.output[0]:
        return None
    bmm_v = users[0]
    values = _hf_keys(g, bmm_v.input[1], bmm_v, transposed=False)
    merge = g.consumers[bmm_v.output[0]]
    ot = merge[0] if len(merge) == 1 and list(_attr(merge[0], "perm", []) or []) == [0, 2, 1, 3] else None
    o3 = g.consumers[ot.output[0]] if ot is not None else []
    if values is None or len(o3) != 1 or o3[0].op_type != "Reshape" or ("past" in keys) != ("past" in values) \
            or keys["bnsh"] != values["bnsh"]:  # the op takes keys and values in one layout
        return None
    chain += [scores, bmm, g.producer[bmm.input[0]], bmm_v, ot]
    inside = {n.output[0] for n in chain} | {o3[0].output[0]}
    for n in chain:
        if any(o in g.outputs or any(u.output[0] not in inside for u in g.consumers[o]) for o in n.output):
            return None
    query, heads, _ = q
    common = {"query": query, "lengths": lengths, "heads": heads, "scale": float(c), "output": o3[0]}
    if "past" in keys:  # decoder self-attention: the op appends to the cache itself (its present replaces the Concat)
        return {**common, "key": keys["x"], "value": values["x"], "past": [keys["past"], values["past"]],
                "present": [keys["present"], values["present"]], "drop": [keys["cat"], values["cat"]]}
    return {**common, "key": keys["x"], "value": values["x"], "past": [], "present": [], "drop": []}


def fuse_attention(model: onnx.ModelProto) -> int:
    """Replaces each exported attention core by com.microsoft.MultiHeadAttention; returns how many."""
    g = _Graph(model.graph)
    found = [m for s in list(model.graph.node) if s.op_type == "Softmax"
             and (m := _match(g, s) or _match_hf(g, s)) is not None]
    if not found:
        return 0
    casts: dict[str, str] = {}
    new_first: list[onnx.NodeProto] = []
    for k, m in enumerate(found):
        mask = ""
        if m["lengths"] is not None:
            if m["lengths"] not in casts:  # the op reads key lengths as int32 (its 1-D key_padding_mask form)
                casts[m["lengths"]] = f"{m['lengths']}_int32_fused"
                new_first.append(helper.make_node("Cast", [m["lengths"]], [casts[m["lengths"]]], to=onnx.TensorProto.INT32,
                                                  name=f"{m['lengths']}_to_int32_fused"))
            mask = casts[m["lengths"]]
        out = m["output"]
        inputs = [m["query"], m["key"], m["value"], "", mask, *(["", *m["past"]] if m["past"] else [])]
        mha = helper.make_node("MultiHeadAttention", inputs, [out.output[0], *m["present"]],
                               name=f"fused_attention_{k}", domain=MS_DOMAIN, num_heads=m["heads"], scale=m["scale"])
        nodes = model.graph.node
        replaced = {out.output[0], *(n.output[0] for n in m["drop"])}  # the op now produces these tensors
        idx = next(i for i, n in enumerate(nodes) if n.output[0] == out.output[0])
        idx -= sum(1 for n in nodes[:idx] if n.output[0] in replaced)
        keep = [n for n in nodes if n.output[0] not in replaced]
        del nodes[:]
        nodes.extend(keep)
        nodes.insert(idx, mha)
    for n in reversed(new_first):
        model.graph.node.insert(0, n)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    remove_dead(model)
    return len(found)


def _weight(g: _Graph, name: str) -> np.ndarray | None:
    """A MatMul's constant right operand (an initializer, or the exporter's Transpose of one), as (in, out)."""
    w = g.const(name)
    if w is None:
        t = _perm(g, name, [1, 0])
        w = g.const(t.input[0]).T if t is not None and g.const(t.input[0]) is not None else None
    return w if w is not None and w.ndim == 2 and w.dtype == np.float32 else None


def fuse_projections(model: onnx.ModelProto) -> int:
    """MatMuls of one input by constant weights (Q/K/V, every layer's cross K/V) -> one MatMul + Split; returns groups fused."""
    g = _Graph(model.graph)
    groups: dict[str, list[tuple[onnx.NodeProto, np.ndarray]]] = defaultdict(list)
    for n in model.graph.node:
        if n.op_type == "MatMul" and n.output[0] not in g.outputs:
            w = _weight(g, n.input[1])
            if w is not None:
                groups[n.input[0]].append((n, w))
    fused = 0
    for x, members in groups.items():
        members = [m for m in members if m[1].shape[0] == members[0][1].shape[0]]
        if len(members) < 2:
            continue
        name = f"fused_projection_{fused}"
        model.graph.initializer.extend([
            numpy_helper.from_array(np.concatenate([w for _, w in members], axis=1), f"{name}.weight"),
            numpy_helper.from_array(np.array([w.shape[1] for _, w in members], np.int64), f"{name}.split")])
        # The nodes it replaces, by name: how reports (the int8 layer table) say which layers it holds.
        matmul = helper.make_node("MatMul", [x, f"{name}.weight"], [f"{name}.out"], name=name,
                                  doc_string="fuses " + " ".join(n.name for n, _ in members))
        split = helper.make_node("Split", [f"{name}.out", f"{name}.split"], [n.output[0] for n, _ in members],
                                 name=f"{name}_split", axis=-1)
        nodes = model.graph.node
        gone = {n.output[0] for n, _ in members}
        first = min(i for i, n in enumerate(nodes) if n.output[0] in gone)
        keep = [n for n in nodes if n.output[0] not in gone]
        del nodes[:]
        nodes.extend(keep)
        nodes.insert(first, split)
        nodes.insert(first, matmul)
        fused += 1
    if fused:
        remove_dead(model)
    return fused


def remove_dead(model: onnx.ModelProto) -> None:
    """Drops nodes none of whose outputs is needed, and initializers nothing reads."""
    graph = model.graph
    needed = {o.name for o in graph.output}
    keep = []
    for n in reversed(graph.node):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(i for i in n.input if i)
            for a in n.attribute:  # subgraphs (If/Loop) read outer names too
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    needed.update(i for sn in sub.node for i in sn.input)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    used = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(used)
    vi = [v for v in graph.value_info if v.name in needed or v.name in {o for n in keep for o in n.output}]
    del graph.value_info[:]
    graph.value_info.extend(vi)


def fuse(src: Path, dst: Path) -> int:
    """Writes `src` with its attention and same-input projections fused and its all-zero biases dropped (zero_bias.py)
    to `dst`, its weights beside it in DST.data (one protobuf message cannot hold 2 GB: an NLLB-1.3B-shaped decoder
    holds 3.5); returns the attention cores fused."""
    from toolkit.graphs.graph_files import save_beside
    from toolkit.graphs.zero_bias import drop_zero_biases

    model = onnx.load(src)
    n = fuse_attention(model)
    if n:  # a graph without attention (the GRU) keeps its projections as they were
        fuse_projections(model)
    drop_zero_biases(model)
    save_beside(model, dst)
    return n
