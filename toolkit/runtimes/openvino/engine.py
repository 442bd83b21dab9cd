"""OpenVINO: the exported .onnx graphs (external weights included) read by `openvino.Core().read_model`,
compiled for the CPU plugin with dynamic shapes, behind the same step-backend interface as ONNX Runtime.

Imports openvino and numpy, never torch: this is a deployment path.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.core import architectures
from toolkit.core.decoding import HostState, ReorderMemory, StepBackend, empty_cache, next_host_state, reorder_rows, take_rows
from toolkit.core.errors import ProviderError, UsageError, first_line
from toolkit.core.graphs import GraphSpec
from toolkit.core.manifest import Manifest
from toolkit.core.variants import describe
from toolkit.graphs.variants import graph_source

INSTALL = "pip install 'tk-onnx-deploy[openvino]' (or pip install openvino), or use --runtime onnxruntime"

# f32 explicitly: on a CPU with bf16 units the plugin would otherwise compute in bf16 by default, and
# the graphs would no longer be the ones checked against PyTorch. Snippets off: with them (OpenVINO
# 2026.4.1), the decoder's attention, fused into a "Subgraph" kernel, returns log-probabilities wrong
# by about 10 once the cache reaches 7 positions on an infer request that ran shorter steps before
# (every real decode): 53/64 greedy translations matched ONNX Runtime's; with them off, 64/64.
CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "SNIPPETS_MODE": "DISABLE", "PERFORMANCE_HINT": "LATENCY"}


def _openvino():
    try:
        import openvino
    except ImportError:
        raise UsageError(f"--runtime openvino needs the openvino package; {INSTALL}") from None
    return openvino


def version() -> str:
    return _openvino().__version__.split("-")[0]


class OvSession:
    """One compiled graph, as tk's GraphRunner (toolkit.runtimes.GraphRunner): `run(feeds)` gives the outputs in the
    graph's order; the output names are OpenVINO's, which may be those of the node that makes one.

    Forks share the compiled graph and one lock: at most one inference of a compiled graph runs at a
    time. Sibling infer requests of one compiled model, run synchronously from several decoding threads
    at once, hung for good under load (OpenVINO 2026.4, CPU plugin, dynamic shapes, one CPU stream:
    every request shares the stream's graph and its TBB arena; the test suite stopped with two threads
    inside InferRequest.infer). The lock removes that interleaving; streams still overlap the numpy work
    between steps, and each inference already uses every core the plugin was given."""

    def __init__(self, compiled, input_names: list[str], lock: threading.Lock | None = None):
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.input_names = input_names
        self.output_names = [port.get_any_name() for port in compiled.outputs]
        self.provider = "cpu"
        self.lock = lock or threading.Lock()

    def fork(self) -> OvSession:
        """The same compiled graph with its own infer request, behind the same lock."""
        return OvSession(self.compiled, self.input_names, self.lock)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        # By position, not by name: a graph's outputs keep the ONNX order, while OpenVINO may name
        # them after the node that makes them (the fp16 graphs' output casts).
        inputs = {n: np.ascontiguousarray(v) for n, v in feeds.items()}
        with self.lock:
            result = self.request.infer(inputs)
            # Copied inside the lock: the result views the request's own output memory.
            return [np.array(result[out]) for out in self.compiled.outputs]


def compile_graph(source: Path | bytes, threads: int | None = None) -> OvSession:
    ov = _openvino()
    core = ov.Core()
    config = dict(CONFIG)
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    try:
        model = core.read_model(source, b"") if isinstance(source, bytes) else core.read_model(str(source))
        compiled = core.compile_model(model, "CPU", config)
    except Exception as e:
        first = first_line(e)
        raise UsageError(f"OpenVINO cannot run {describe(source)}: {first}; use --runtime onnxruntime") from None
    declared = _onnx_inputs(source)
    return OvSession(compiled, [_graph_input_name(port, declared) for port in compiled.inputs])


def _graph_input_name(port, declared: frozenset[str]) -> str:
    """The ONNX graph's own name of an input port: OpenVINO merges a tensor's names when it removes a node that only
    renames it (a Reshape of the token ids to their own shape in the int8 graphs), and any name may then come first."""
    return next((n for n in sorted(port.get_names()) if n in declared), port.get_any_name())


def _onnx_inputs(source: Path | bytes) -> frozenset[str]:
    from toolkit.core.variants import load_proto

    graph = load_proto(source).graph
    weights = {i.name for i in graph.initializer}
    return frozenset(i.name for i in graph.input if i.name not in weights)


class OvBackend(StepBackend):
    """Step backend over an encoder and a decoder compiled by OpenVINO. The cache is numpy on the
    host (the CPU plugin's memory is the host's), so selecting rows is a numpy take along each
    state tensor's batch axis, and ranking is numpy's, the equivalents of ONNX Runtime's Gather and
    TopK graphs."""

    def __init__(self, encoder: OvSession, decoder: OvSession, encoder_spec: GraphSpec, decoder_spec: GraphSpec):
        self.encoder, self.decoder = encoder, decoder
        self.encoder_spec, self.decoder_spec = encoder_spec, decoder_spec
        self.state_names = decoder_spec.input_names[1:]
        self.batch_axis = {t.name: t.dims.index("batch") for t in decoder_spec.inputs[1:]}
        self._reorder_memory = ReorderMemory()  # one per thread of its callers; a fork has its own (fork)

    def fork(self) -> OvBackend:
        twin = OvBackend(self.encoder.fork(), self.decoder.fork(), self.encoder_spec, self.decoder_spec)
        twin._reorder_memory = ReorderMemory(per_thread=False)  # a fork decodes one stream at a time (borrow_forks)
        return twin

    def encode(self, src: np.ndarray, src_len: np.ndarray) -> dict[str, np.ndarray]:
        outputs = dict(zip(self.encoder_spec.output_names, self.encoder.run({"src": src, "src_len": src_len})))
        outputs.update(src=src, src_len=src_len)
        outputs.update(empty_cache(self.decoder_spec, outputs, len(src)))
        return HostState({n: outputs[n] for n in self.state_names}, self._reorder_memory.here())

    def step(self, token: np.ndarray, state: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        named = dict(zip(self.decoder_spec.output_names, self.decoder.run({"token": token, **state})))
        return named["log_probs"], next_host_state(self.decoder_spec, state, named)

    def reorder_beams(self, state: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
        return reorder_rows(state, rows, self.batch_axis, keep=self.decoder_spec.constant_inputs)

    def select(self, state: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
        return take_rows(state, rows, self.batch_axis)


@dataclass
class LoadedOpenVINO:
    manifest: Manifest
    runners: dict[str, OvSession]
    provider: str = "cpu"
    built_s: float = 0.0

    def backend(self) -> OvBackend:
        specs = self.manifest.specs()
        return OvBackend(self.runners["encoder"], self.runners["decoder"], specs["encoder"], specs["decoder"])


def load(m: Manifest, provider: str = "cpu", variant: str = "fp32", threads: int | None = None) -> LoadedOpenVINO:
    """Every graph of the directory compiled for OpenVINO's CPU plugin; a variant it does not store is built
    in memory. (Each variant passes `tk verify --runtime openvino`; int8 since its weights got one scale per channel.)"""
    if provider not in ("cpu", None):
        raise ProviderError(f"--runtime openvino runs on OpenVINO's CPU plugin only, not provider {provider}; "
                            "use --provider cpu, or --runtime onnxruntime for CUDA")
    architectures.get(m.model).check("openvino")
    _openvino()
    runners, built = {}, 0.0
    for name in m.graphs:
        source, seconds = graph_source(m, name, variant)
        runners[name] = compile_graph(source, threads)
        built += seconds
    return LoadedOpenVINO(m, runners, "cpu", built)
