"""Intermediate graph files of the variant builders, their weights stored beside them.

A protobuf message cannot exceed 2 GB, and an NLLB-1.3B-shaped decoder holds 3.5 GB of fp32 weights: every graph a
builder writes on its way to a variant keeps its weights in NAME.data beside it (one code path for every size), and
is removed with them.
"""

from __future__ import annotations

from pathlib import Path

# Tensors below this stay inside the graph (shapes, small constants): the same threshold export uses.
INLINE_BYTES = 1024


def beside(path: Path) -> Path:
    """The file holding the weights of the graph at `path`."""
    return path.with_name(f"{path.name}.data")


def save_beside(model, path: Path) -> None:
    """Saves `model` (an onnx.ModelProto whose weights are loaded) at `path`, its weights in beside(path); a weights
    file left by an earlier save there is replaced, not appended to."""
    import onnx

    beside(path).unlink(missing_ok=True)
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=beside(path).name,
                    size_threshold=INLINE_BYTES)


def rewritable(graph: Path | bytes):
    """A graph to rewrite in memory (an onnx.ModelProto), from its bytes or its file (weights outside it not read); None
    where it does not parse (ONNX Runtime's load then says what is wrong with it, as for any other graph) or keeps
    weights outside it (a rewrite in memory would lose them)."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load_model_from_string(graph) if isinstance(graph, bytes) else onnx.load(graph, load_external_data=False)
    except (DecodeError, OSError):
        return None
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        return None
    return model


def remove(path: Path) -> None:
    """Removes an intermediate graph and its weights file."""
    path.unlink(missing_ok=True)
    beside(path).unlink(missing_ok=True)


def inline(path: Path) -> None:
    """The graph at `path` made self-contained (a stored variant is one file): its weights read from beside(path) into
    it, and that file removed."""
    import onnx

    model = onnx.load(path)
    beside(path).unlink(missing_ok=True)
    onnx.save_model(model, path)
