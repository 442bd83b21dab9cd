"""The runtimes that run the exported graphs: ONNX Runtime (toolkit.runtime) and OpenVINO
(toolkit.runtimes.openvino), each giving sessions and a step backend for the one decoding loop.

Torch-free; a runtime's package is imported only when it is chosen.
"""

from __future__ import annotations

from toolkit.errors import UsageError
from toolkit.manifest import Manifest

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
         allow_fallback: bool = False, threads: int | None = None, unverified: bool = False, cache: bool = False):
    """Sessions and a step-backend factory (`.backend()`) for every graph of the directory on `runtime`.
    `unverified`: also load a variant the runtime is known to compute outside its tolerance (for verify).
    `cache`: ONNX Runtime on CPU loads the user cache's optimised graphs (toolkit.load_cache)."""
    check(runtime)
    if runtime == "openvino":
        from toolkit.runtimes import openvino

        return openvino.load(m, provider, variant, threads, unverified)
    from toolkit import runtime as ort_runtime

    return ort_runtime.load_sessions(m, provider, variant, allow_fallback=allow_fallback, threads=threads, cache=cache)
