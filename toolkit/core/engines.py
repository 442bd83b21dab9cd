"""The runtimes that run the exported graphs and the providers (devices) they run them on, declared once: every
command's --runtime and --provider choices, the Python API's checks, verify and toolkit.runtimes read these.

Imports nothing: `tk --help` builds its choice lists from it at no cost.
"""

from __future__ import annotations

RUNTIMES: tuple[str, ...] = ("onnxruntime", "openvino")  # each one module or package in toolkit/runtimes/
DEFAULT_RUNTIME = "onnxruntime"
PROVIDERS: tuple[str, ...] = ("cpu", "cuda")
