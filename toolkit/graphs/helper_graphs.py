"""The small graphs tk builds itself to run beside the exported ones: the CUDA probe, the ranking (TopK) and
the row selection (Gather) that keep the decoder's cache on its device. onnx is imported only when one is built."""

from __future__ import annotations

from toolkit.core.graphs import GraphSpec


def serialized(nodes, name: str, inputs, outputs, domains: tuple[str, ...] = ()) -> bytes:
    from onnx import helper

    opsets = [helper.make_opsetid("", 18), *(helper.make_opsetid(d, 1) for d in domains)]
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs), opset_imports=opsets)
    model.ir_version = min(model.ir_version, 10)
    return model.SerializeToString()


def probe_graph() -> bytes:
    """x -> y, one Identity: the smallest graph a session can be made of, to see which provider it gets."""
    from onnx import TensorProto, helper

    return serialized([helper.make_node("Identity", ["x"], ["y"])], "probe",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])


def selection_graph(decoder_spec: GraphSpec, batch_axis: dict[str, int]) -> bytes:
    """A graph that Gathers the given rows of every decoder state tensor along its batch axis.

    Run on the decoder's own device, it lets finished rows leave the batch and beams be
    reordered without the cache ever leaving GPU memory.
    """
    from onnx import TensorProto, helper

    types = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}
    state = decoder_spec.inputs[1:]
    rows = helper.make_tensor_value_info("rows", TensorProto.INT64, ["rows"])
    inputs = [helper.make_tensor_value_info(t.name, types[t.dtype], [d if isinstance(d, int) else None for d in t.dims])
              for t in state]
    outputs = [helper.make_tensor_value_info(f"{t.name}.rows", types[t.dtype], [None] * len(t.dims)) for t in state]
    nodes = [helper.make_node("Gather", [t.name, "rows"], [f"{t.name}.rows"], axis=batch_axis[t.name]) for t in state]
    return serialized(nodes, "select_rows", [*inputs, rows], outputs)


def top_k_graph(native: bool = False) -> bytes:
    """log_probs (rows, vocab), k (1,) -> the k best values of each row, largest first, and their ids (equal values in
    id order). native: on tk's own CPU kernel (toolkit.runtimes.onnxruntime.native), the same ranking in one pass."""
    from onnx import TensorProto, helper

    if native:
        node = helper.make_node("TopK", ["log_probs", "k"], ["values", "indices"], domain="tk.kernels")
    else:
        node = helper.make_node("TopK", ["log_probs", "k"], ["values", "indices"], axis=-1, largest=1, sorted=1)
    return serialized([node],
                      "top_k", [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["rows", "vocab"]),
                                helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
                      [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["rows", "k"]),
                       helper.make_tensor_value_info("indices", TensorProto.INT64, ["rows", "k"])],
                      ("tk.kernels",) if native else ())
