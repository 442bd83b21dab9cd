"""The one place ONNX Runtime sessions are made, and their options: the sessions that run the graphs, the helper
graphs' sessions, the CUDA probe and the sessions that write the start-up cache's optimised graphs (the variants'
offline optimiser is a graph tool: toolkit.graphs.optimize, whose disabled optimisers every CPU session shares)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from toolkit.core.errors import ProviderError, UsageError, first_line
from toolkit.core.variants import describe
from toolkit.graphs import optimize
from toolkit.graphs.helper_graphs import probe_graph
from toolkit.graphs.native_attention import ROWS
from toolkit.graphs.optimize import CPU_DISABLED_OPTIMIZERS
from toolkit.runtimes.onnxruntime import cuda
from toolkit.runtimes.onnxruntime.cuda import PROVIDERS

# fp32 means fp32: the CUDA provider rounds float32 matrix products to TF32 (10-bit mantissa) by default on
# Ampere and later. Measured on an H100 with the shipped Transformer: TF32 gives errors of 6e-3 to 8e-3
# against PyTorch (verify fails 126 of 356 checks), where the fp32 tolerance is 1e-4; the fp16 variant is the
# fast reduced-precision choice, and it is verified as such.
CUDA_OPTIONS = {"use_tf32": "0"}

# ONNX Runtime prints a multi-line warning when CUDA libraries are missing; tk reports it in one line instead.
ort.set_default_logger_severity(4)


def session_options(optimization: str = "all", threads: int | None = None, spin: bool = True) -> ort.SessionOptions:
    so = optimize.options(optimization)
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        so.intra_op_num_threads = threads
    return so


def _new(graph: Path | bytes, options: ort.SessionOptions, providers: list, disabled: Sequence[str] = ()) -> ort.InferenceSession:
    """Every session tk makes is made here (tests stand in for ort.InferenceSession, and see them all)."""
    return ort.InferenceSession(graph if isinstance(graph, bytes) else str(graph), options, providers=providers,
                                disabled_optimizers=list(disabled))


def cuda_available() -> bool:
    """True only if a session really runs on CUDA, not merely if the provider is compiled in."""
    return PROVIDERS["cuda"] in ort.get_available_providers() and not cuda.no_nvidia_device() and _probe_cuda()


_cuda_probe: bool | None = None


def _probe_cuda() -> bool:
    global _cuda_probe
    if _cuda_probe is None:
        cuda.preload_cuda_libraries()
        try:
            s = _new(probe_graph(), session_options(), [PROVIDERS["cuda"], PROVIDERS["cpu"]])
            _cuda_probe = s.get_providers()[0] == PROVIDERS["cuda"]
        except Exception:
            _cuda_probe = False
    return _cuda_probe


def create_session(path: Path | bytes, provider: str = "cpu", optimization: str = "all", threads: int | None = None,
                   allow_fallback: bool = False, configure: Callable[[ort.SessionOptions], None] | None = None,
                   spin: bool = False) -> ort.InferenceSession:
    """A session on the requested provider, from a graph file or serialized bytes;
    raises ProviderError if CUDA silently became CPU. `configure` may add settings to the session options;
    spin: a CPU session's worker threads spin between runs (they always do on CUDA)."""
    if provider not in PROVIDERS:
        raise UsageError(f"unknown provider '{provider}'; choose cpu or cuda")
    providers = [(PROVIDERS["cuda"], CUDA_OPTIONS), PROVIDERS["cpu"]] if provider == "cuda" else [PROVIDERS["cpu"]]
    cpu = provider == "cpu"
    if not cpu:
        cuda.preload_cuda_libraries()
    try:
        # CPU: worker threads sleep between runs instead of spinning. The encoder, decoder and row
        # selection sessions each own a thread pool, and the decoding loop's host work runs between
        # their runs; on 2 cores, spinning workers take the cores those need. Measured on the shipped
        # Transformer, greedy over 256 sentences: batch 64 fp32 725 -> 960 sentences/s, int8 1248 ->
        # 1593; batch 1 unchanged (118 vs 122, 272 vs 267).
        options = session_options(optimization, threads, spin=spin or not cpu)
        if configure:
            configure(options)
        session = _new(path, options, providers, CPU_DISABLED_OPTIMIZERS if cpu else ())
    except Exception as e:
        first = first_line(e)
        raise UsageError(f"cannot load {describe(path)}: {first}; re-export the model directory") from None
    if provider == "cuda" and session.get_providers()[0] != PROVIDERS["cuda"] and not allow_fallback:
        raise ProviderError(cuda.cuda_fix())
    return session


def helper_session(graph: bytes, like: ort.InferenceSession, threads: int | None, spin: bool,
                   configure: Callable[[ort.SessionOptions], None] | None = None) -> ort.InferenceSession:
    """A session of one of tk's helper graphs (toolkit.graphs.helper_graphs) on the providers of `like`; `configure` may
    add settings to its options (tk's kernels)."""
    options = session_options(threads=threads, spin=spin)
    if configure:
        configure(options)
    return _new(graph, options, like.get_providers())


def session_provider(session: ort.InferenceSession) -> str:
    return "cuda" if session.get_providers()[0] == PROVIDERS["cuda"] else "cpu"


class OrtRunner:
    """An ONNX Runtime session as tk's GraphRunner (toolkit.runtimes.GraphRunner): the session itself stays
    ONNX Runtime's, for the step backend's I/O binding. A decoder on tk's kernels that takes its caches' rows
    (toolkit.graphs.native_attention.ROWS) runs here as the manifest declares it: those rows fed in order."""

    def __init__(self, session: ort.InferenceSession):
        self.session = session
        inputs = [i for i in session.get_inputs() if i.name != ROWS]
        self._rows = len(inputs) < len(session.get_inputs())
        self.input_names = [i.name for i in inputs]
        self.input_shapes = [i.shape for i in inputs]  # sizes as numbers, named axes as names (or None)
        self.output_names = [o.name for o in session.get_outputs()]
        self.provider = session_provider(session)

    def run(self, feeds: dict) -> list:
        if self._rows and ROWS not in feeds:
            feeds = {**feeds, ROWS: np.arange(len(feeds[self.input_names[0]]), dtype=np.int64)}
        return self.session.run(None, feeds)
