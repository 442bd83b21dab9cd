"""The runtimes that run the exported graphs, one module or package each: onnxruntime (CPU and CUDA), openvino (its CPU
plugin), web (onnxruntime-web in a browser, exported as a static site) and ctranslate2 (a converted copy of the
weights that the directory stores, decoded in CTranslate2's own loop).
`load` gives what every runtime loads a model directory into: a LoadedRuntime. Which runtimes there are is declared
once, in toolkit.core.engines (RUNTIMES), and every --runtime choice reads it.

Torch-free; a runtime's package is imported only when it is chosen. The PyTorch reference (`tk translate --backend
torch`) loads through `load` too, but lives on the torch side: toolkit.pytorch.torch_backend registers it when imported,
so nothing here or below imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from toolkit.core.decoding import StepBackend
from toolkit.core.engines import DEFAULT_RUNTIME, RUNTIMES
from toolkit.core.errors import UsageError
from toolkit.core.manifest import Manifest

__all__ = ["DEFAULT_RUNTIME", "RUNTIMES", "LoadedRuntime", "check", "label", "load", "register", "version"]


class LoadedRuntime(Protocol):
    """A model directory loaded on one runtime: its sessions, what they run on, and step backends over them
    for the one decoding loop (toolkit.core.decoding), each fresh from `backend()`."""

    manifest: Manifest
    sessions: dict  # graph name -> the runtime's session (run(None, feeds), get_inputs())
    provider: str  # "cpu" or "cuda"
    built_s: float  # seconds spent building a variant the directory does not store

    def backend(self) -> StepBackend: ...


# Loaders registered by the sides that this package may not import: "torch" (toolkit.pytorch.torch_backend).
_REGISTERED: dict[str, Callable[..., LoadedRuntime]] = {}
# Where each registrable loader lives, for the error that names it (a name, not an import).
_REGISTERED_BY = {"torch": "toolkit.pytorch.torch_backend"}


def register(name: str, loader: Callable[..., LoadedRuntime]) -> None:
    """Makes `load(m, name, ...)` call `loader(m, provider=..., variant=..., ...)`: how a side above the deploy path
    (the PyTorch reference) puts its backend behind the same interface without the deploy path importing it."""
    _REGISTERED[name] = loader


def check(runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise UsageError(f"unknown runtime '{runtime}'; choose {' or '.join(RUNTIMES)}")


def version(runtime: str) -> str:
    if runtime == "openvino":
        from toolkit.runtimes import openvino

        return openvino.version()
    if runtime == "ctranslate2":
        from toolkit.runtimes import ctranslate2

        return ctranslate2.version()
    import onnxruntime

    return onnxruntime.__version__


def label(runtime: str) -> str:
    """How output names the runtime in use: 'onnxruntime 1.31.0', 'openvino 2026.4.1'."""
    return f"{runtime} {version(runtime)}"


def load(m: Manifest, runtime: str = "onnxruntime", provider: str = "cpu", variant: str = "fp32",
         allow_fallback: bool = False, threads: int | None = None, cache: bool = False,
         request_threads: int | None = None) -> LoadedRuntime:
    """Sessions and a step-backend factory (`.backend()`) for every graph of the directory on `runtime`.
    `cache`: ONNX Runtime on CPU loads the user cache's optimised graphs (toolkit.runtimes.onnxruntime.graph_cache).
    `request_threads`: ONNX Runtime on CPU decodes a call of one batch on this many threads, and concurrent
    streams on `threads` each (toolkit.runtimes.onnxruntime.load_sessions).
    A runtime registered with `register` ("torch") is loaded by its own loader."""
    if runtime in _REGISTERED_BY:
        if runtime not in _REGISTERED:
            raise UsageError(f"the {runtime} backend is not loaded; import {_REGISTERED_BY[runtime]} first (it needs the {runtime} extra)")
        return _REGISTERED[runtime](m, provider=provider, variant=variant, allow_fallback=allow_fallback, threads=threads)
    check(runtime)
    if runtime == "openvino":
        from toolkit.runtimes import openvino

        return openvino.load(m, provider, variant, threads)
    if runtime == "ctranslate2":
        from toolkit.runtimes import ctranslate2

        return ctranslate2.load(m, provider, variant, threads, allow_fallback)
    from toolkit.runtimes import onnxruntime as ort_runtime

    return ort_runtime.load_sessions(m, provider, variant, allow_fallback=allow_fallback, threads=threads, cache=cache,
                                     request_threads=request_threads)
