"""The runtimes that run the exported graphs and the providers (devices) they run them on, declared once: every
command's --runtime and --provider choices, the Python API's checks, verify and toolkit.runtimes read these.

Imports nothing: `tk --help` builds its choice lists from it at no cost.
"""

from __future__ import annotations

RUNTIMES: tuple[str, ...] = ("onnxruntime", "openvino", "ctranslate2")  # each one module or package in toolkit/runtimes/
# The runtimes that do not read the ONNX graphs but a copy of the weights converted for them, which `tk export DIR
# --RUNTIME` writes into the directory (manifest section "converted"). They decode in their own loop.
CONVERTED_RUNTIMES: tuple[str, ...] = ("ctranslate2",)
DEFAULT_RUNTIME = "onnxruntime"
PROVIDERS: tuple[str, ...] = ("cpu", "cuda")
