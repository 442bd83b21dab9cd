"""ONNX Runtime's declaration in the runtime registry (toolkit.runtimes.registry): what it runs and its defaults."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.core.batching import default_request_threads, default_threads
from toolkit.core.manifest import Manifest
from toolkit.core.variants import FAST_PLAIN, NAMES, PLAIN
from toolkit.runtimes.io_check import check_runners
from toolkit.runtimes.onnxruntime.cuda import PROVIDERS
from toolkit.runtimes.onnxruntime.loading import LoadedOnnxRuntime, load_sessions
from toolkit.runtimes.onnxruntime.sessions import OrtRunner, create_session, cuda_available
from toolkit.runtimes.onnxruntime.shortlisted import prepare
from toolkit.runtimes.registry import GRAPHS, RuntimeSpec


def load(m: Manifest, provider: str, variant: str, *, allow_fallback: bool = False, threads: int | None = None,
         cache: bool = False, request_threads: int | None = None, check_io: bool = True, shortlist: bool = False) -> LoadedOnnxRuntime:
    shortlisting = prepare(m) if shortlist else None
    loaded = load_sessions(m, provider, variant, allow_fallback=allow_fallback, threads=threads, cache=cache,
                           request_threads=request_threads, shortlisting=shortlisting)
    if check_io:
        # The shortlisted decoder is the checked file's graph with two inputs more (toolkit.graphs.shortlist).
        check_runners(m, {n: r for n, r in loaded.runners.items() if not (shortlist and n == "decoder")})
    loaded.threads = threads if loaded.provider == "cpu" else None  # a CUDA fallback's sessions run on CPU too
    return loaded


def version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def default_provider() -> str:
    """CUDA if it truly loads (a probe session runs), else CPU."""
    return "cuda" if cuda_available() else "cpu"


# Weights past this (an NLLB-600M-sized model and up) run the exported graphs unless the fast ones are stored: building
# the optimized copy at the first start took 67 s and 12 GB at NLLB-600M's size (1.8 GB of weights in each graph),
# for no speed there (1.00 and 1.01x: its steps are the matrix products).
LARGE_WEIGHTS_BYTES = 1_500_000_000


def default_variant(provider: str, m: Manifest | None = None) -> str:
    # Same translations as fp32 (verify demands it of "optimized"); fewer nodes a step: one sentence
    # per call, first 200 Tatoeba Challenge sentences, 12.9 ms -> 11.7 ms; a 2,000-line file 3.03 -> 2.96 s.
    fast = FAST_PLAIN[provider]
    if m is not None and fast != PLAIN and fast not in m.stored and weights_bytes(m) > LARGE_WEIGHTS_BYTES:
        return PLAIN
    return fast


def weights_bytes(m: Manifest) -> int:
    """The size of the model's external weights files (a stat each: start-up reads no graph for this)."""
    files = {g.weights.file for g in m.graphs.values() if g.weights is not None}
    return sum((m.directory / f).stat().st_size for f in files if (m.directory / f).is_file())


def threads_for(provider: str, variant: str, m: Manifest) -> tuple[int | None, int | None]:
    """On CPU never all cores per session (the default streams share them); a call of one batch has them all, but a
    small model's int8 decoder (batching.default_request_threads)."""
    if provider != "cpu":
        return None, None
    return default_threads(), default_request_threads(variant, weights_bytes(m) // 4)


def graph_outputs(source: Path | bytes, provider: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    runner = OrtRunner(create_session(source, provider))
    return dict(zip(runner.output_names, runner.run(feeds)))


RUNTIME = RuntimeSpec(
    name="onnxruntime", runs=GRAPHS, load=load, version=version, providers=tuple(PROVIDERS), variants=(*NAMES, "attention"),
    default_provider=default_provider, default_variant=default_variant, default_threads=threads_for, streams=True,
    graph_outputs=graph_outputs, shortlist=True)
