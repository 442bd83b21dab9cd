"""One int8 copy of a table that a decoder both looks up and multiplies by (an embedding tied to its output layer).

Dynamic quantisation makes two int8 copies of such a table: the output layer's weight (d_model x vocab, one scale per
vocabulary entry, symmetric) and the lookup's (vocab x d_model, one scale for the whole table). At NLLB's 256,206 x 1,024
that second copy is 262 MB of an 1.1 GB decoder. The output layer's copy holds every row the lookup needs, with a scale
of its own per row, so the lookup `Gather(table_q, ids) -> DequantizeLinear(table_scale, table_zero_point)` is
rewritten to read the output layer's int8 copy, scaled per row by that layer's own scales, and the lookup's copy
goes. The one copy is stored the lookup's way round (vocab x d_model, `WEIGHT_quantized_rows`),
and the output layer multiplies by its Transpose, which ONNX Runtime (and OpenVINO) fold into a constant when the
session is made, before packing it for their int8 matrix products:

    Transpose(rows_q) -> WEIGHT_quantized, the output layer's weight as before
    Gather(rows_q, ids) -> Cast -> Mul(Gather(weight_scale, ids)), each row whole

Stored d_model x vocab, a lookup of 64 ids read one byte from each of 512 places per id (NLLB: 1,024): 1.8 ms of a
37 ms int8 decoder step at 64 rows (opus-mt shape, one thread), against 0.04 ms for whole rows; the same values.
Loaded from the start-up cache the folded copy is never read again (the packed one is), so the resident memory is no
larger than with the columns. The rows the lookup returns are quantised per row (7-bit, as every int8 weight of
tk's graphs) instead of with one scale for the table: `tk verify --variant int8` holds the result to int8's tolerance as
before.
"""

from __future__ import annotations

from pathlib import Path


def tied_tables(folded: Path) -> dict[str, str]:
    """{lookup table: the MatMul weight it is the transpose of} in the float graph at `folded` (its weights beside it)
    about to be quantised: a Gather's table equal, element for element, to a MatMul weight transposed. Only the tensors
    whose shapes pair up are read (an NLLB-1.3B decoder's other 3 GB of weights are not)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(folded, load_external_data=False).graph
    inits = {i.name: i for i in graph.initializer}
    looked_up = {n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[0] in inits}
    # (weight, stored as vocab x d_model): a MatMul's weight is d_model x vocab; a Gemm's with transB=1 is the table's way
    # round (the quantiser transposes it to MatMul's).
    multiplied = {}
    for n in graph.node:
        if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] in inits:
            trans_b = next((a.i for a in n.attribute if a.name == "transB"), 0)
            multiplied[n.input[1]] = n.op_type == "Gemm" and trans_b == 1

    def array(name: str) -> np.ndarray:
        return numpy_helper.to_array(inits[name], base_dir=str(Path(folded).parent))

    pairs = {}
    for table in looked_up:
        rows = tuple(inits[table].dims)
        for weight, as_table in multiplied.items():
            dims = tuple(inits[weight].dims)
            if len(rows) != 2 or table == weight or (dims if as_table else dims[::-1]) != rows:
                continue
            w = array(weight)
            if np.array_equal(array(table), w if as_table else w.T):
                pairs[table] = weight
                break
    return pairs


def share_tied_tables(model, pairs: dict[str, str]) -> int:
    """Rewrites, in the quantised graph `model` (onnx.ModelProto, weights loaded), each lookup of a table in `pairs`
    to read the int8 copy of the weight it is tied to (see the module's docstring); returns how many it rewrote. A
    pair whose weight was left in float (--keep-fp32) or not quantised per vocabulary entry stays as it is."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    rewritten, stored_as_rows = 0, set()
    for table, weight in pairs.items():
        t_q, w_q, w_scale, w_zero = f"{table}_quantized", f"{weight}_quantized", f"{weight}_scale", f"{weight}_zero_point"
        if not all(n in inits for n in (t_q, w_q, w_scale, w_zero)):
            continue
        vocab = inits[w_q].dims[1] if len(inits[w_q].dims) == 2 else None
        if (inits[w_q].data_type != TensorProto.INT8 or tuple(inits[w_scale].dims) != (vocab,) or inits[t_q].dims[0] != vocab
                or np.any(numpy_helper.to_array(inits[w_zero]))):
            continue
        lookups = [n for n in consumers.get(t_q, []) if n.op_type == "Gather"
                   and [c.op_type for c in consumers.get(n.output[0], [])] == ["DequantizeLinear"]]
        if not lookups:
            continue
        rows_q = f"{w_q}_rows"
        nodes = []
        if w_q not in stored_as_rows:  # a second table tied to the same weight reads the rows already stored
            stored_as_rows.add(w_q)
            weight_q = inits[w_q]
            model.graph.initializer.remove(weight_q)
            model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(weight_q).T), rows_q))
            # First in the node list: the output layer's weight is this Transpose's output now, no longer an initializer.
            nodes.append(helper.make_node("Transpose", [rows_q], [w_q], name=f"{w_q}/from_rows", perm=[1, 0]))
        looked_up = {g.output[0]: g for g in lookups}
        for node in model.graph.node:
            if node.op_type == "DequantizeLinear" and node.input[0] in looked_up:
                continue  # replaced with its lookup, below
            gather = looked_up.get(node.output[0]) if node.op_type == "Gather" else None
            if gather is None:
                nodes.append(node)
                continue
            dequant, ids, base = consumers[gather.output[0]][0], gather.input[1], f"{gather.name}/tied"
            nodes += [
                helper.make_node("Gather", [rows_q, ids], [f"{base}/rows_q"], name=f"{base}/rows", axis=0),
                helper.make_node("Cast", [f"{base}/rows_q"], [f"{base}/rows_f"], name=f"{base}/cast", to=TensorProto.FLOAT),
                helper.make_node("Gather", [w_scale, ids], [f"{base}/scales"], name=f"{base}/scales", axis=0),
                helper.make_node("Unsqueeze", [f"{base}/scales", f"{base}/last_axis"], [f"{base}/scales_col"], name=f"{base}/scales_col"),
                helper.make_node("Mul", [f"{base}/rows_f", f"{base}/scales_col"], [dequant.output[0]], name=f"{base}/dequantize"),
            ]
            model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), f"{base}/last_axis"))
            rewritten += 1
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    keep = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    return rewritten


def share_in_file(path: Path, pairs: dict[str, str]) -> int:
    """share_tied_tables on the self-contained quantised graph at `path`, saved back in place when it changed."""
    import onnx

    if not pairs:
        return 0
    model = onnx.load(path)
    done = share_tied_tables(model, pairs)
    if done:
        onnx.save_model(model, path)
    return done
