"""tk's own CPU attention kernels (kernels/attention.c), built for the machine that runs them and registered with
ONNX Runtime as custom operators (domain `tk.kernels`); toolkit.graphs.native_attention puts them in a CPU decoder, and
a CPU beam search ranks each step's log-probabilities with the library's TopK (toolkit.graphs.helper_graphs).

Built once per machine with the C compiler (`$CC`, else `cc`): `-march=native`, so the library is kept in the start-up
cache under a key of its source, the compiler and the CPU (toolkit.core.load_cache; a per-process temporary directory
when the cache is off). Where there is no compiler, the build fails or `TK_NATIVE_KERNELS=0` is set, the decoders keep
ONNX Runtime's MultiHeadAttention: the same translations, slower at a decoder step; `status()` says which and why
(`tk bench` prints it). A failed build is remembered in the cache, so later starts do not try again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import zlib
from pathlib import Path

SOURCE = Path(__file__).with_name("kernels") / "attention.c"
DOMAIN = "tk.kernels"
LIBRARY = "libtk_attention.so"
FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fPIC", "-shared"]
BUILD_TIMEOUT_S = 120

_lock = threading.Lock()
_built: tuple[Path | None, str] | None = None  # (the library, or None; what was found), once per process


def status() -> str:
    """One line: whether the kernels are in use, and if not why not."""
    path, why = _library()
    return f"tk attention kernels: {'on' if path else 'off'} ({why})"


def library() -> Path | None:
    """The built library, building it if this machine has none yet; None where it cannot be used (status() says why)."""
    return _library()[0]


def digest() -> str:
    """What a decoder rewritten for the kernels adds to its start-up cache key: the kernels' source (a changed kernel,
    a new entry)."""
    return f"tk-kernels {zlib.crc32(SOURCE.read_bytes()):08x}"


def register(options) -> None:
    """Registers the kernels with a session's options (an onnxruntime.SessionOptions), where they are built."""
    path = library()
    if path is not None:
        options.register_custom_ops_library(str(path))


def _library() -> tuple[Path | None, str]:
    global _built
    with _lock:
        if _built is None:
            _built = _build()
        return _built


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc")


def _build() -> tuple[Path | None, str]:
    if os.environ.get("TK_NATIVE_KERNELS", "") == "0":
        return None, "TK_NATIVE_KERNELS=0"
    compiler = _compiler()
    if compiler is None:
        return None, f"no C compiler ({os.environ.get('CC') or 'cc'}) to build them: ONNX Runtime's attention is used"
    from toolkit.runtimes.onnxruntime.graph_cache import cpu_description

    # Keyed by the compiler's file as it stands (path, size, mtime), not its --version: no process started at each start.
    try:
        st = os.stat(compiler)
    except OSError as e:
        return None, f"the C compiler {compiler} cannot be read ({e.strerror}): ONNX Runtime's attention is used"
    parts = [SOURCE.read_text(), compiler, str(st.st_size), str(st.st_mtime_ns), " ".join(FLAGS), cpu_description()]
    key = f"{zlib.crc32('|'.join(parts).encode()):08x}"
    folder = _folder(key)
    if folder is None:
        return None, "no private directory to build them in: ONNX Runtime's attention is used"
    target, failed, built_with = folder / LIBRARY, folder / "failed.txt", folder / "compiler.txt"
    if target.is_file():
        return target, f"built with {built_with.read_text(errors='replace').strip() if built_with.is_file() else compiler}"
    if failed.is_file():
        return None, failed.read_text(errors="replace").strip()
    tmp = folder / f".{LIBRARY}.{os.getpid()}.{threading.get_ident()}"
    try:
        done = subprocess.run([compiler, *FLAGS, "-o", str(tmp), str(SOURCE), "-lm"], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            why = f"the build failed ({compiler}: {first}): ONNX Runtime's attention is used"
            failed.write_text(why + "\n")
            return None, why
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout.split("\n")[0]
        built_with.write_text(version + "\n")
        os.replace(tmp, target)  # whole or not at all: another process may load it at once
        return target, f"built with {version}"
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"the build failed ({type(e).__name__}: {e}): ONNX Runtime's attention is used"
    finally:
        tmp.unlink(missing_ok=True)


def _folder(key: str) -> Path | None:
    from toolkit.core.load_cache import directory

    root = directory()
    if root is None:  # the cache is off or untrusted: a directory of this process's own, removed at its exit
        import atexit
        import tempfile

        root = Path(tempfile.mkdtemp(prefix="tk-kernels-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    folder = root / "kernels" / key
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return folder
