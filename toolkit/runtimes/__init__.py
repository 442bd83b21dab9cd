"""The runtimes that run the exported graphs, one package each: onnxruntime (CPU and CUDA), openvino (its CPU plugin)
and ctranslate2 (a converted copy of the weights that the directory stores, decoded in CTranslate2's own loop); the
browser's onnxruntime-web is an export (`tk export --web`), not a runtime of this machine.
Each package declares itself (its runtime.py: RUNTIME, a registry.RuntimeSpec) and is registered in one line of
registry.TABLE; `load` gives what every runtime loads a model directory into: a LoadedRuntime, whose graphs are
GraphRunners. Every --runtime choice, the Python API, deploy, serve, corpus, verify and bench ask the registry and
never compare a runtime's name. The graphs they run, and the tools that make them, are toolkit.graphs'.

Torch-free, and light: a runtime's package is imported only when it is chosen. The PyTorch reference (`tk translate
--backend torch`) is no runtime: the torch side hands open_model its own loader (toolkit.pytorch.torch_backend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from toolkit.runtimes.registry import DEFAULT as DEFAULT_RUNTIME
from toolkit.runtimes.registry import RuntimeSpec, check, get, load, names, register

if TYPE_CHECKING:
    import numpy as np

    from toolkit.core.decoding import StepBackend
    from toolkit.core.manifest import Manifest

__all__ = ["DEFAULT_RUNTIME", "GraphRunner", "LoadedRuntime", "RuntimeSpec", "check", "get", "label", "load", "names", "register",
           "version"]


class GraphRunner(Protocol):
    """One graph loaded on a runtime, as tk's checks ask of it (verify's sweeps, the loader's check against
    manifest.json, localize): its inputs and outputs by name, where it runs, and one run. The decoding loop asks
    the runtime's step backend instead (LoadedRuntime.backend)."""

    input_names: list[str]
    output_names: list[str]  # as the runtime names them (OpenVINO may name one after the node that makes it)
    provider: str  # "cpu" or "cuda"

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...  # the outputs in the graph's order


class LoadedRuntime(Protocol):
    """A model directory loaded on one runtime: its graphs, what they run on, and step backends over them
    for the one decoding loop (toolkit.core.decoding), each fresh from `backend()`. A runtime whose sessions
    take tk's thread settings also has `threads`: the intra-op threads of each CPU session (absent or None: none)."""

    manifest: Manifest
    runners: dict[str, GraphRunner]  # graph name -> the graph loaded (empty for a runtime that runs no ONNX graphs)
    provider: str  # "cpu" or "cuda"
    built_s: float  # seconds spent building a variant the directory does not store

    def backend(self) -> StepBackend: ...


def version(runtime: str) -> str:
    return get(runtime).version()


def label(runtime: str) -> str:
    """How output names the runtime in use: 'onnxruntime 1.31.0', 'openvino 2026.4.1'."""
    return get(runtime).label()
