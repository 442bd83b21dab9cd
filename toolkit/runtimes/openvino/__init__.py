"""OpenVINO (its CPU plugin), every piece of it in this package:

- engine.py   the exported graphs compiled by OpenVINO, behind the same step-backend interface as ONNX Runtime
- runtime.py  its declaration in the runtime registry (toolkit.runtimes.registry)

Imports numpy and (lazily) openvino, never torch: this is a deployment path. The names below are the package's
interface.
"""

from toolkit.runtimes.openvino.engine import (
    CONFIG,
    INSTALL,
    LoadedOpenVINO,
    OvBackend,
    OvSession,
    compile_graph,
    load,
    version,
)

__all__ = ["CONFIG", "INSTALL", "LoadedOpenVINO", "OvBackend", "OvSession", "compile_graph", "load", "version"]
