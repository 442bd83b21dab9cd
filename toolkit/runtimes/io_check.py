"""What every loader of the ONNX graphs checks before a session runs: each graph takes the inputs, and gives the
outputs, that manifest.json declares. A graph swapped for another model's can take the same inputs (a GRU encoder in
a Transformer's place), so outputs are checked too where the runtime keeps the graph's output names."""

from __future__ import annotations

from toolkit.core.errors import UsageError
from toolkit.core.manifest import Manifest


def check_sessions(m: Manifest, sessions: dict, outputs: bool = True) -> None:
    """One line naming the first graph whose inputs (or, with `outputs`, outputs) differ from the declaration."""
    specs = m.specs()
    for name, session in sessions.items():
        spec = specs[name]
        got = [i.name for i in session.get_inputs()]
        if got != spec.input_names:
            raise UsageError(f"{name} graph inputs {got} do not match manifest.json {spec.input_names}; re-export {m.directory}")
        names = [o.name for o in session.get_outputs()] if outputs else spec.output_names
        if names != spec.output_names:
            raise UsageError(f"{name} graph outputs {names} do not match manifest.json {spec.output_names}; re-export {m.directory}")
