"""One int8 copy of a table that a decoder both looks up and multiplies by (an embedding tied to its output layer).

Dynamic quantisation makes two int8 copies of such a table: the output layer's weight (d_model x vocab, one scale per
vocabulary entry, symmetric) and the lookup's (vocab x d_model, one scale for the whole table). At NLLB's 256,206 x 1,024
that second copy is 262 MB of an 1.1 GB decoder. The output layer's copy holds every row the lookup needs, with a scale
of its own per row, so the lookup is rewritten to read columns of it:

    Gather(table_q, ids) -> DequantizeLinear(table_scale, table_zero_point)
    becomes
    Gather(weight_q, ids, axis=1) -> Transpose -> Cast -> Mul(Gather(weight_scale, ids))

and the lookup's copy goes. The rows the lookup returns are then quantised per row (7-bit, as every int8 weight of
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
    rewritten = 0
    for table, weight in pairs.items():
        t_q, w_q, w_scale, w_zero = f"{table}_quantized", f"{weight}_quantized", f"{weight}_scale", f"{weight}_zero_point"
        if not all(n in inits for n in (t_q, w_q, w_scale, w_zero)):
            continue
        vocab = inits[w_q].dims[1] if len(inits[w_q].dims) == 2 else None
        if (inits[w_q].data_type != TensorProto.INT8 or tuple(inits[w_scale].dims) != (vocab,) or inits[t_q].dims[0] != vocab
                or np.any(numpy_helper.to_array(inits[w_zero]))):
            continue
        for gather in [n for n in consumers.get(t_q, []) if n.op_type == "Gather"]:
            after = consumers.get(gather.output[0], [])
            if len(after) != 1 or after[0].op_type != "DequantizeLinear":
                continue
            dequant, ids, base = after[0], gather.input[1], f"{gather.name}/tied"
            new = [
                helper.make_node("Reshape", [ids, f"{base}/flat_shape"], [f"{base}/flat_ids"], name=f"{base}/flatten"),
                helper.make_node("Gather", [w_q, f"{base}/flat_ids"], [f"{base}/columns"], name=f"{base}/columns", axis=1),
                helper.make_node("Transpose", [f"{base}/columns"], [f"{base}/rows_q"], name=f"{base}/rows", perm=[1, 0]),
                helper.make_node("Cast", [f"{base}/rows_q"], [f"{base}/rows_f"], name=f"{base}/cast", to=TensorProto.FLOAT),
                helper.make_node("Gather", [w_scale, f"{base}/flat_ids"], [f"{base}/scales"], name=f"{base}/scales", axis=0),
                helper.make_node("Unsqueeze", [f"{base}/scales", f"{base}/last_axis"], [f"{base}/scales_col"], name=f"{base}/scales_col"),
                helper.make_node("Mul", [f"{base}/rows_f", f"{base}/scales_col"], [f"{base}/rows"], name=f"{base}/dequantize"),
                helper.make_node("Shape", [ids], [f"{base}/ids_shape"], name=f"{base}/ids_shape"),
                helper.make_node("Concat", [f"{base}/ids_shape", f"{base}/width"], [f"{base}/out_shape"], name=f"{base}/out_shape", axis=0),
                helper.make_node("Reshape", [f"{base}/rows", f"{base}/out_shape"], [dequant.output[0]], name=f"{base}/unflatten"),
            ]
            model.graph.initializer.extend([
                numpy_helper.from_array(np.array([-1], np.int64), f"{base}/flat_shape"),
                numpy_helper.from_array(np.array([1], np.int64), f"{base}/last_axis"),
                numpy_helper.from_array(np.array([inits[w_q].dims[0]], np.int64), f"{base}/width"),
            ])
            nodes = list(model.graph.node)
            at = nodes.index(gather)
            nodes = [n for n in nodes if n is not gather and n is not dequant]
            nodes[at:at] = new
            del model.graph.node[:]
            model.graph.node.extend(nodes)
            rewritten += 1
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
