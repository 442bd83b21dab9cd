"""The runtimes that run the exported graphs, one package each: onnxruntime (CPU and CUDA), openvino (its CPU plugin)
and ctranslate2 (a converted copy of the weights that the directory stores, decoded in CTranslate2's own loop); the
browser's onnxruntime-web is an export (`tk export --web`), not a runtime of this machine.
Each package declares itself (its runtime.py: RUNTIME, a registry.RuntimeSpec) and is registered in one line of
registry.TABLE; `load` gives what every runtime loads a model directory into: a LoadedRuntime. Every --runtime choice,
the Python API, deploy, serve, corpus, verify and bench ask the registry and never compare a runtime's name.

Torch-free, and light: a runtime's package is imported only when it is chosen. The PyTorch reference (`tk translate
--backend torch`) loads through `load` too, but lives on the torch side: toolkit.pytorch.torch_backend registers its
loader when imported, so nothing here or below imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from toolkit.core.errors import UsageError
from toolkit.runtimes import registry
from toolkit.runtimes.registry import DEFAULT as DEFAULT_RUNTIME
from toolkit.runtimes.registry import RuntimeSpec, check, get, names

if TYPE_CHECKING:
    from toolkit.core.decoding import StepBackend
    from toolkit.core.manifest import Manifest

__all__ = ["DEFAULT_RUNTIME", "LoadedRuntime", "RuntimeSpec", "check", "get", "label", "load", "names", "register", "version"]


class LoadedRuntime(Protocol):
    """A model directory loaded on one runtime: its sessions, what they run on, and step backends over them
    for the one decoding loop (toolkit.core.decoding), each fresh from `backend()`. A runtime whose sessions
    take tk's thread settings also has `threads`: the intra-op threads of each CPU session (absent or None: none)."""

    manifest: Manifest
    sessions: dict  # graph name -> the runtime's session (run(None, feeds), get_inputs())
    provider: str  # "cpu" or "cuda"
    built_s: float  # seconds spent building a variant the directory does not store

    def backend(self) -> StepBackend: ...


# Loaders registered by the sides that this package may not import: "torch" (toolkit.pytorch.torch_backend). They are
# backends reached by `load`, not --runtime choices.
_LOADERS: dict[str, Callable[..., LoadedRuntime]] = {}
# Where each such loader lives, for the error that names it (a name, not an import).
_LOADERS_BY = {"torch": "toolkit.pytorch.torch_backend"}


def register(name: str, where: str | Callable[..., LoadedRuntime]) -> None:
    """`register(name, "package.module")`: a runtime declared by that module's RUNTIME (a RuntimeSpec), offered
    everywhere a runtime is chosen from then on. `register(name, loader)`: a backend that a side above the deploy
    path puts behind `load` (the PyTorch reference) without the deploy path importing it; `load(m, name, ...)` calls
    `loader(m, provider=..., variant=..., allow_fallback=..., threads=...)`."""
    if callable(where):
        _LOADERS[name] = where
    else:
        registry.register(name, where)


def version(runtime: str) -> str:
    return get(runtime).version()


def label(runtime: str) -> str:
    """How output names the runtime in use: 'onnxruntime 1.31.0', 'openvino 2026.4.1'."""
    return get(runtime).label()


def load(m: Manifest, runtime: str = DEFAULT_RUNTIME, provider: str = "cpu", variant: str = "fp32",
         allow_fallback: bool = False, threads: int | None = None, cache: bool = False,
         request_threads: int | None = None, check_io: bool = True) -> LoadedRuntime:
    """Sessions and a step-backend factory (`.backend()`) for every graph of the directory on `runtime`.
    `cache`: ONNX Runtime on CPU loads the user cache's optimised graphs (toolkit.runtimes.onnxruntime.graph_cache).
    `request_threads`: ONNX Runtime on CPU decodes a call of one batch on this many threads, and concurrent
    streams on `threads` each (toolkit.runtimes.onnxruntime.load_sessions). `check_io`: the loader refuses sessions
    whose inputs or outputs differ from manifest.json (verify, which reports that as a row, turns it off).
    A backend registered with a loader ("torch") is loaded by it."""
    if runtime in _LOADERS_BY or runtime in _LOADERS:
        if runtime not in _LOADERS:
            raise UsageError(f"the {runtime} backend is not loaded; import {_LOADERS_BY[runtime]} first (it needs the {runtime} extra)")
        return _LOADERS[runtime](m, provider=provider, variant=variant, allow_fallback=allow_fallback, threads=threads)
    return registry.load(m, runtime, provider, variant, allow_fallback, threads, cache, request_threads, check_io)
