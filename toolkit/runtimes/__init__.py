"""The runtimes that run the exported graphs, one module each: onnxruntime (CPU and CUDA), openvino (its CPU
plugin), web (onnxruntime-web in a browser, exported as a static site) and ctranslate2 (tk bench's comparison).
`load` gives what every runtime loads a model directory into: a LoadedRuntime.

Torch-free; a runtime's package is imported only when it is chosen.
"""

from __future__ import annotations

from typing import Protocol

from toolkit.core.decoding import StepBackend
from toolkit.core.errors import UsageError
from toolkit.core.manifest import Manifest


class LoadedRuntime(Protocol):
    """A model directory loaded on one runtime: its sessions, what they run on, and step backends over them
    for the one decoding loop (toolkit.core.decoding), each fresh from `backend()`."""

    manifest: Manifest
    sessions: dict  # graph name -> the runtime's session (run(None, feeds), get_inputs())
    provider: str  # "cpu" or "cuda"
    built_s: float  # seconds spent building a variant the directory does not store

    def backend(self) -> StepBackend: ...


RUNTIMES = ("onnxruntime", "openvino")


def check(runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise UsageError(f"unknown runtime '{runtime}'; choose {' or '.join(RUNTIMES)}")


def version(runtime: str) -> str:
    if runtime == "openvino":
        from toolkit.runtimes import openvino

        return openvino.version()
    import onnxruntime

    return onnxruntime.__version__


def label(runtime: str) -> str:
    """How output names the runtime in use: 'onnxruntime 1.31.0', 'openvino 2026.4.1'."""
    return f"{runtime} {version(runtime)}"


def load(m: Manifest, runtime: str = "onnxruntime", provider: str = "cpu", variant: str = "fp32",
         allow_fallback: bool = False, threads: int | None = None, unverified: bool = False, cache: bool = False,
         request_threads: int | None = None) -> LoadedRuntime:
    """Sessions and a step-backend factory (`.backend()`) for every graph of the directory on `runtime`.
    `unverified`: also load a variant the runtime is known to compute outside its tolerance (for verify).
    `cache`: ONNX Runtime on CPU loads the user cache's optimised graphs (toolkit.runtimes.onnxruntime.graph_cache).
    `request_threads`: ONNX Runtime on CPU decodes a call of one batch on this many threads, and concurrent
    streams on `threads` each (toolkit.runtimes.onnxruntime.load_sessions)."""
    check(runtime)
    if runtime == "openvino":
        from toolkit.runtimes import openvino

        return openvino.load(m, provider, variant, threads, unverified)
    from toolkit.runtimes import onnxruntime as ort_runtime

    return ort_runtime.load_sessions(m, provider, variant, allow_fallback=allow_fallback, threads=threads, cache=cache,
                                     request_threads=request_threads)
