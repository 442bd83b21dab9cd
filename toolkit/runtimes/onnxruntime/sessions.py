"""The one place ONNX Runtime sessions are made, and their options: the sessions that run the graphs, the helper
graphs' sessions, the CUDA probe and the sessions that write an optimised graph (the variants built offline,
the start-up cache)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import onnxruntime as ort

from toolkit.core.errors import ProviderError, UsageError, first_line
from toolkit.core.variants import describe
from toolkit.runtimes.onnxruntime import cuda
from toolkit.runtimes.onnxruntime.cuda import PROVIDERS
from toolkit.runtimes.onnxruntime.helper_graphs import probe_graph

# ONNX Runtime's CPU SkipLayerNormalization kernel is slower than the Add + LayerNormalization it
# replaces: measured on the shipped Transformer at batch 64, the encoder runs in 11.9 ms instead of
# 14.4 ms and a decoder step in 2.60 ms instead of 2.85 ms with this fusion off (onnxruntime 1.31).
# FuseFp16InitializerToFp32NodeTransformer (level "all", fp16 graphs on the CPU only) crashes the process while
# the session is made for the fp16 variant of a pre-LN Transformer on nn.MultiheadAttention (a segmentation fault,
# onnxruntime 1.31; the same transform family fails sessions in microsoft/onnxruntime#26717). It only folds fp16
# weights into float ones for a CPU without fp16 arithmetic, so fp32 and int8 graphs never meet it.
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion", "FuseFp16InitializerToFp32NodeTransformer")
# fp32 means fp32: the CUDA provider rounds float32 matrix products to TF32 (10-bit mantissa) by default on
# Ampere and later. Measured on an H100 with the shipped Transformer: TF32 gives errors of 6e-3 to 8e-3
# against PyTorch (verify fails 126 of 356 checks), where the fp32 tolerance is 1e-4; the fp16 variant is the
# fast reduced-precision choice, and it is verified as such.
CUDA_OPTIONS = {"use_tf32": "0"}

# ONNX Runtime prints a multi-line warning when CUDA libraries are missing; tk reports it in one line instead.
ort.set_default_logger_severity(4)


def session_options(optimization: str = "all", threads: int | None = None, spin: bool = True) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                   "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[optimization]
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


def helper_session(graph: bytes, like: ort.InferenceSession, threads: int | None, spin: bool) -> ort.InferenceSession:
    """A session of one of tk's helper graphs (toolkit.runtimes.onnxruntime.helper_graphs) on the providers of `like`."""
    return _new(graph, session_options(threads=threads, spin=spin), like.get_providers())


def save_optimized(src: Path, dst: Path, level: str, weights_file: str | None = None) -> None:
    """Saves the graph as ONNX Runtime's CPU provider would run it after `level` optimisations; with `weights_file`,
    its weights go to that file beside `dst` (past protobuf's 2 GB)."""
    so = session_options(level)
    so.optimized_model_filepath = str(dst)
    if weights_file is not None:
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", weights_file)
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    _new(src, so, [PROVIDERS["cpu"]], CPU_DISABLED_OPTIMIZERS)


def session_provider(session: ort.InferenceSession) -> str:
    return "cuda" if session.get_providers()[0] == PROVIDERS["cuda"] else "cpu"
