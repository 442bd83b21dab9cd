"""ONNX Runtime (CPU and CUDA), every piece of it in this package, which core never imports:

- cuda.py         why the CUDA provider cannot run (one line and its fix), the GPU a result was measured on
- sessions.py     the one place sessions are made, and their options (threads, spinning, optimisation level)
- backend.py      OrtBackend: the step backend of the one decoding loop, with I/O binding on CUDA
- loading.py      a model directory loaded: a session per graph, side by side, and backends over them
- graph_cache.py  ONNX Runtime's optimised graphs kept in the user's start-up cache
- runtime.py      its declaration in the runtime registry (toolkit.runtimes.registry)

The graphs it runs (the variants, the attention fusion, tk's helper graphs) are toolkit.graphs'. Imports onnxruntime
and numpy, never torch: this is the deployment path. Importers name the module that holds what they use.
"""
