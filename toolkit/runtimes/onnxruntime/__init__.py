"""ONNX Runtime (CPU and CUDA), every piece of it in this package, which core never imports:

- cuda.py           why the CUDA provider cannot run (one line and its fix), the GPU a result was measured on
- sessions.py       the one place sessions are made, and their options (threads, spinning, optimisation level)
- helper_graphs.py  the graphs tk builds to run beside the exported ones (CUDA probe, TopK ranking, row selection)
- backend.py        OrtBackend: the step backend of the one decoding loop, with I/O binding on CUDA
- loading.py        a model directory loaded: a session per graph, side by side, and backends over them
- graph_cache.py    ONNX Runtime's optimised graphs kept in the user's start-up cache
- variants.py       the catalogue's variants (toolkit.core.variants) built from the fp32 graphs
- attention_fusion.py  the CPU variants' rewrite: each attention core -> com.microsoft.MultiHeadAttention

Imports onnxruntime and numpy, never torch: this is the deployment path. The names below are the package's
interface; the modules' other names are theirs (tests that stand in for one patch it in its module).
"""

from __future__ import annotations

import onnxruntime as ort

from toolkit.runtimes.onnxruntime.backend import OrtBackend, direct_run
from toolkit.runtimes.onnxruntime.cuda import CUDA_FIX, CUDA_INSTALL, PROVIDERS, cuda_fix, cuda_problem, gpu_environment
from toolkit.runtimes.onnxruntime.helper_graphs import selection_graph, top_k_graph
from toolkit.runtimes.onnxruntime.loading import LoadedOnnxRuntime, load_sessions
from toolkit.runtimes.onnxruntime.sessions import create_session, cuda_available, session_options, session_provider
from toolkit.runtimes.onnxruntime.variants import graph_source

__all__ = ["CUDA_FIX", "CUDA_INSTALL", "PROVIDERS", "LoadedOnnxRuntime", "OrtBackend", "create_session", "cuda_available",
           "cuda_fix", "cuda_problem", "direct_run", "gpu_environment", "graph_source", "load_sessions", "ort", "selection_graph",
           "session_options", "session_provider", "top_k_graph"]
