"""What every loader of the ONNX graphs checks before a graph runs: each graph takes the inputs, and gives the
outputs, that manifest.json declares. A graph swapped for another model's can take the same inputs (a GRU encoder in
a Transformer's place), so outputs are checked too where the runtime keeps the graph's output names."""

from __future__ import annotations

from toolkit.core.errors import UsageError
from toolkit.core.manifest import Manifest


def check_runners(m: Manifest, runners: dict, outputs: bool = True) -> None:
    """One line naming the first graph whose inputs (or, with `outputs`, outputs) differ from the declaration;
    `runners`: graph name -> its toolkit.runtimes.GraphRunner."""
    specs = m.specs()
    for name, runner in runners.items():
        spec = specs[name]
        if runner.input_names != spec.input_names:
            raise UsageError(f"{name} graph inputs {runner.input_names} do not match manifest.json {spec.input_names}; re-export {m.directory}")
        for declared, shape in zip(spec.inputs, getattr(runner, "input_shapes", None) or ()):
            if _disagree(declared.dims, shape):
                raise UsageError(f"{name} graph input {declared.name} has the shape {_shape(shape)}, manifest.json declares "
                                 f"{_shape(declared.dims)}; re-export {m.directory}")
        names = runner.output_names if outputs else spec.output_names
        if names != spec.output_names:
            raise UsageError(f"{name} graph outputs {names} do not match manifest.json {spec.output_names}; re-export {m.directory}")


def _disagree(declared, shape) -> bool:
    """A declared shape the graph's input cannot take: another rank, or a fixed size where the graph fixes another (tk
    feeds arrays of the declared sizes; an edited manifest's 0 heads failed inside ONNX Runtime). A named axis on
    either side takes any size."""
    if not isinstance(shape, (list, tuple)):
        return False
    if len(shape) != len(declared):
        return True
    return any(type(d) is int and type(g) is int and d != g for d, g in zip(declared, shape))


def _shape(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"
