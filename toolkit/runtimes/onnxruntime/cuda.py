"""Why ONNX Runtime's CUDA provider cannot run here, in one line with its fix, and the GPU a result was measured on.

Whether CUDA truly runs takes a session (toolkit.runtimes.onnxruntime.sessions.cuda_available); this module only
names the reason when it does not: a build without the provider, no driver, a library that cannot load.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnxruntime as ort

from toolkit.core.errors import first_line

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
CUDA_FIX = ("ONNX Runtime could not load its CUDA provider and fell back to CPU; install the CUDA 13 and cuDNN 9 "
            "runtime libraries (or call onnxruntime.preload_dlls() with a CUDA build of torch installed), "
            "or use --provider cpu")
CUDA_INSTALL = "pip install 'tk-onnx-deploy[cuda]' (onnxruntime-gpu with its CUDA and cuDNN pip packages)"

_preloaded = False


def preload_cuda_libraries() -> None:
    """Loads the CUDA and cuDNN libraries of the nvidia-* pip packages (the cuda extra), so the CUDA
    provider finds them without LD_LIBRARY_PATH. Once per process; a no-op where ONNX Runtime lacks it."""
    global _preloaded
    if _preloaded or not hasattr(ort, "preload_dlls"):
        return
    _preloaded = True
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # its notes go to stdout, where translations go
        try:
            ort.preload_dlls()
        except Exception:  # what is still missing is named by cuda_problem()
            pass


def cuda_problem() -> str:
    """Why ONNX Runtime's CUDA provider cannot run here, in one clause with its fix ("" if nothing is found)."""
    if PROVIDERS["cuda"] not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} is a build without the CUDA provider; {CUDA_INSTALL}"
    if no_nvidia_device():
        return "no NVIDIA GPU or driver is visible (/dev/nvidiactl is missing)"
    preload_cuda_libraries()
    missing = _missing_cuda_library()
    if missing:
        return f"the CUDA provider needs {missing}, which is not found; {CUDA_INSTALL}, or put its directory on LD_LIBRARY_PATH"
    return ""


def _missing_cuda_library() -> str:
    """The first shared library the CUDA provider cannot load (Linux; '' elsewhere or when it loads)."""
    import ctypes
    import re

    if sys.platform != "linux":
        return ""
    capi = Path(ort.__file__).parent / "capi"
    try:
        ctypes.CDLL(str(capi / "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(capi / "libonnxruntime_providers_cuda.so"))
    except OSError as e:
        found = re.search(r"(lib[\w.+-]+\.so[\w.]*)", str(e))
        return found.group(1) if found else first_line(e)
    return ""


def gpu_environment() -> dict:
    """The GPU a CUDA result was measured on: its name, the driver and the CUDA runtime versions (what is found)."""
    import ctypes
    import shutil
    import subprocess

    env: dict = {}
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
            if out:
                name, driver, memory = (x.strip() for x in out[0].split(",")[:3])
                env.update(gpu=name, gpu_driver=driver, gpu_memory=memory)
        except (OSError, subprocess.SubprocessError, ValueError):
            pass  # informational: the record still names the provider
    preload_cuda_libraries()
    for lib in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            version = ctypes.c_int()
            ctypes.CDLL(lib).cudaRuntimeGetVersion(ctypes.byref(version))
            env["cuda_runtime"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
            break
        except (OSError, AttributeError):
            continue
    return env


def cuda_fix() -> str:
    """The one-line error for a CUDA session that fell back to CPU: the reason found, then the way out."""
    problem = cuda_problem()
    if not problem:
        return CUDA_FIX
    return f"ONNX Runtime could not load its CUDA provider: {problem}; or use --provider cpu (--allow-cpu-fallback runs on CPU)"


def no_nvidia_device() -> bool:
    # The probe imports onnx and creates a session (a third of `tk translate`'s start-up on a
    # CPU-only machine); without the driver's device node on Linux, CUDA cannot load anyway.
    return sys.platform == "linux" and not Path("/dev/nvidiactl").exists()
