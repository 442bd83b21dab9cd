"""OpenVINO's declaration in the runtime registry (toolkit.runtimes.registry): its CPU plugin runs every stored or
built variant of the graphs (each passes `tk verify --runtime openvino`), with the plain fp32 graphs by default."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.core.manifest import Manifest
from toolkit.core.variants import NAMES
from toolkit.runtimes.io_check import check_runners
from toolkit.runtimes.openvino.engine import LoadedOpenVINO, compile_graph, version
from toolkit.runtimes.openvino.engine import load as load_compiled
from toolkit.runtimes.registry import GRAPHS, RuntimeSpec


def load(m: Manifest, provider: str, variant: str, *, allow_fallback: bool = False, threads: int | None = None,
         cache: bool = False, request_threads: int | None = None, check_io: bool = True) -> LoadedOpenVINO:
    loaded = load_compiled(m, provider, variant, threads)
    if check_io:
        # Inputs only: OpenVINO may name an output after the node that makes it (the fp16 graphs' output casts).
        check_runners(m, loaded.runners, outputs=False)
    return loaded


def graph_outputs(source: Path | bytes, provider: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    runner = compile_graph(source)
    return dict(zip(runner.output_names, runner.run(feeds)))


RUNTIME = RuntimeSpec(name="openvino", runs=GRAPHS, load=load, version=version, providers=("cpu",), variants=NAMES,
                      graph_outputs=graph_outputs, extra="openvino")
