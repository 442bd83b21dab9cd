"""The step backend over ONNX Runtime sessions: what the one decoding loop (toolkit.core.decoding) runs on CPU and CUDA.

Imports onnxruntime and numpy, never torch: this is the deployment path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import onnxruntime as ort

from toolkit.core.decoding import (
    HostState,
    ReorderMemory,
    StepBackend,
    empty_cache,
    next_host_state,
    padding_groups,
    reorder_rows,
    take_sentence_rows,
    top_k_rows,
)
from toolkit.core.errors import UsageError
from toolkit.core.graphs import GraphSpec
from toolkit.graphs.helper_graphs import selection_graph, top_k_graph
from toolkit.graphs.native_attention import ROWS, ROWS_METADATA
from toolkit.graphs.sentence_cross import MARK
from toolkit.runtimes.onnxruntime import native
from toolkit.runtimes.onnxruntime.sessions import helper_session, session_provider


def direct_run(session: ort.InferenceSession) -> Callable[[list[str], dict], list]:
    """The session's run without the Python wrapper's checks of the feed: the decoding loop builds every feed
    itself, and the native run still refuses a missing or mistyped input. The wrapper's checks cost 12 us of
    every decoder step, 3% of a single request (int8, 2 cores). Any other session-like object runs as it is."""
    native = getattr(session, "_sess", None)
    # A session whose run is its own (a wrapper set on it, a stand-in) keeps it.
    if native is None or "run" in vars(session) or getattr(type(session), "run", None) is not _SESSION_RUN:
        return session.run
    return lambda names, feeds: native.run(names, feeds, None)


def _length_axes(encoder: GraphSpec, decoder: GraphSpec) -> dict[str, tuple[int, int]] | None:
    """Each encoder output's batch and source-length axes, where rows may be encoded in groups: every output has both,
    the length axis once, and the decoder masks by the source lengths. None otherwise (the batch is encoded whole): an
    output over two source axes (the attention variant's self-attention weights) cannot be padded back from a group's."""
    length = encoder.inputs[0].dims[-1]
    if "src_len" not in decoder.input_names or any("batch" not in t.dims or t.dims.count(length) != 1 for t in encoder.outputs):
        return None
    return {t.name: (t.dims.index("batch"), t.dims.index(length)) for t in encoder.outputs}


def per_sentence_cross(decoder: ort.InferenceSession) -> bool:
    """Whether the decoder session's graph reads the encoder's outputs once per sentence (toolkit.graphs.sentence_cross)."""
    meta = getattr(decoder, "get_modelmeta", None)
    return meta is not None and meta().custom_metadata_map.get(MARK[0]) == MARK[1]


def graph_reordered_caches(decoder: ort.InferenceSession) -> frozenset[str]:
    """The caches whose rows the decoder session's graph itself takes, by its input ROWS
    (toolkit.graphs.native_attention); none for any other graph."""
    meta = getattr(decoder, "get_modelmeta", None)
    names = meta().custom_metadata_map.get(ROWS_METADATA, "") if meta is not None else ""
    return frozenset(n for n in names.split(",") if n)


_SESSION_RUN = ort.InferenceSession.run  # taken at import: tests replace ort.InferenceSession with factories


class OrtBackend(StepBackend):
    """Step backend over an encoder and a decoder session.

    On CUDA every step runs through I/O binding: the decoder's new cache stays an OrtValue in
    GPU memory and is bound as the next step's input; candidates are ranked by a TopK graph and
    rows selected (finished sentences, beam reordering) by a Gather graph on the GPU, so only
    each row's k best log-probabilities come back to the host.

    On CPU the cache is host memory either way, and binding each of the 13 inputs and 7 outputs
    costs more than it saves: plain runs on numpy arrays, numpy's take for the rows and argmax
    for greedy. Measured on the shipped Transformer, int8, greedy, batch 1: 156 -> 222
    sentences/s. `io_binding=True` runs the CUDA path on CPU, so the tests exercise it here.

    A subclass may name extra decoder outputs in `recorded` (the attention weights): they are
    passed to `record` on the host with the encoder's outputs and each step's.
    """

    recorded: tuple[str, ...] = ()

    def record(self, graph: str, outputs: dict[str, np.ndarray]) -> None:
        """Called with every encoder run's outputs and each decoder step's `recorded` outputs."""

    def __init__(self, encoder: ort.InferenceSession, decoder: ort.InferenceSession,
                 encoder_spec: GraphSpec, decoder_spec: GraphSpec, io_binding: bool | None = None,
                 stream_sessions: Callable[[], dict[str, ort.InferenceSession]] | None = None):
        self.encoder, self.decoder = encoder, decoder
        self.stream_sessions = stream_sessions  # see loading.LoadedOnnxRuntime
        self._streams_backend: OrtBackend | None = None
        self.encoder_spec, self.decoder_spec = encoder_spec, decoder_spec
        self.state_names = decoder_spec.input_names[1:]
        self.output_names = decoder_spec.output_names  # built once: a single request runs the decoder a dozen times
        # (position among the outputs, the input it replaces) of each cache output, for greedy_steps
        self._cache_outputs = [(i, decoder_spec.updates[n]) for i, n in enumerate(self.output_names) if n in decoder_spec.updates]
        self._run_decoder = direct_run(decoder)
        unbatched = next((t for t in decoder_spec.inputs[1:] if "batch" not in t.dims), None)
        if unbatched is not None:  # the state is selected and reordered along that axis at every step
            raise UsageError(f"the model's manifest.json declares the decoder input {unbatched.name} as {list(unbatched.dims)}, "
                             "without its 'batch' axis; re-export the model directory")
        self.batch_axis = {t.name: t.dims.index("batch") for t in decoder_spec.inputs[1:]}
        self._reorder_memory = ReorderMemory()  # one per thread of its callers; a fork has its own (fork)
        self.device = session_provider(decoder)
        self.io_binding = self.device != "cpu" if io_binding is None else io_binding
        self._helpers: dict[str, ort.InferenceSession] = {}  # the ranking and row-selection sessions
        self._helpers_lock = threading.Lock()
        self._length_axes = _length_axes(encoder_spec, decoder_spec)
        # The encoder's outputs stay one row per sentence (select below); the CUDA path's row selection takes every
        # input by row, which the graph reads as groups of one.
        self._per_sentence = decoder_spec.constant_inputs if not self.io_binding and per_sentence_cross(decoder) else None
        # A decoder on tk's kernels may take its caches' rows itself (ROWS: the row of the past each row continues):
        # on the host, a select or beam reorder leaves those caches as they are and takes ROWS's rows instead, and each
        # step's new caches are in the step's row order again. Through I/O binding ROWS is fed in order at each step.
        self._graph_reorders = graph_reordered_caches(decoder)
        if self._graph_reorders:
            self.batch_axis[ROWS] = 0

    # Both helper sessions are made on first use (one sentence decoded greedily needs neither, and
    # building them was a fifth of `tk translate`'s start-up), once per backend and its forks:
    # `decode_ids` forks a backend for every call with several streams.
    @property
    def selector(self) -> ort.InferenceSession:
        return self._helper("selector", lambda: selection_graph(self.decoder_spec, self.batch_axis), threads=1)

    @property
    def ranker(self) -> ort.InferenceSession:
        # numpy's partition takes 20 ms for 256 x 6000 log-probabilities, ONNX Runtime's TopK 1.3 ms
        # (and 0.07 against 0.2 ms for 4 x 6000, a beam of 4 at batch 1). It runs on the decoder's threads:
        # with every core's threads, each stream's ranking took the other streams' cores (first 2,000
        # Challenge sentences, int8 beam 4, 1 thread x 2 streams: 3.92 -> 3.82 s, fp32 unchanged).
        # On CPU tk's own kernel ranks in one pass where it is built: 64 x 6000, k = 8, one thread, 208 -> 87 us.
        if self.device == "cpu" and native.library() is not None:
            return self._helper("ranker", lambda: top_k_graph(native=True), threads=self._decoder_threads(),
                                configure=native.register)
        return self._helper("ranker", top_k_graph, threads=self._decoder_threads())

    def _decoder_threads(self) -> int | None:
        """The decoder session's intra-op threads; None where it has ONNX Runtime's default."""
        options = getattr(self.decoder, "get_session_options", None)
        return (options().intra_op_num_threads or None) if options else None

    def _helper(self, name: str, graph, threads: int | None = None, configure=None) -> ort.InferenceSession:
        with self._helpers_lock:
            if name not in self._helpers:
                self._helpers[name] = helper_session(graph(), self.decoder, threads, spin=self.device != "cpu", configure=configure)
            return self._helpers[name]

    def for_streams(self) -> OrtBackend:
        if self.stream_sessions is None or self.recorded:  # a recording backend refuses to fork, as it must
            return self
        if self._streams_backend is None:  # kept, with its ranking session, for every later call with streams
            sessions = self.stream_sessions()
            self._streams_backend = OrtBackend(sessions["encoder"], sessions["decoder"], self.encoder_spec,
                                               self.decoder_spec, self.io_binding)
        return self._streams_backend

    def fork(self) -> OrtBackend:
        # An ONNX Runtime session may run concurrently from several threads and each run binds its own
        # inputs and outputs, so a stream needs only its own backend object, sharing every session.
        if self.recorded:
            raise NotImplementedError("a backend recording attention decodes one stream, in order")
        twin = OrtBackend(self.encoder, self.decoder, self.encoder_spec, self.decoder_spec, self.io_binding, self.stream_sessions)
        twin._helpers, twin._helpers_lock = self._helpers, self._helpers_lock
        twin._reorder_memory = ReorderMemory(per_thread=False)  # a fork decodes one stream at a time (borrow_forks)
        return twin

    def _to_device(self, value: np.ndarray) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), self.device, 0)

    def encode(self, src: np.ndarray, src_len: np.ndarray) -> dict[str, ort.OrtValue | np.ndarray]:
        outputs = self._encoded(src, src_len)
        outputs.update(src=src, src_len=src_len)
        self.record("encoder", outputs)
        outputs.update(empty_cache(self.decoder_spec, outputs, len(src)))
        if not self.io_binding:
            state = {n: outputs[n] for n in self.state_names}
            if self._graph_reorders:
                state[ROWS] = np.arange(len(src), dtype=np.int64)
            return HostState(state, self._reorder_memory.here())
        return {n: self._to_device(outputs[n]) for n in self.state_names}

    def _encoded(self, src: np.ndarray, src_len: np.ndarray) -> dict[str, np.ndarray]:
        """The encoder's outputs for the padded batch. On CPU, rows of very different lengths are encoded in groups
        (padding_groups), each padded to its own longest, and the outputs padded back: the work of the padding is
        skipped (CTranslate2 drops it too), and the decoder masks past each row's length (src_len) as before."""
        groups = padding_groups(src_len) if self._length_axes is not None and not self.io_binding else []
        if len(groups) < 2:
            return dict(zip(self.encoder_spec.output_names, self.encoder.run(None, {"src": src, "src_len": src_len})))
        merged: dict[str, np.ndarray] = {}
        for rows in groups:
            part = self.encoder.run(None, {"src": src[rows, : int(src_len[rows].max())], "src_len": src_len[rows]})
            for name, value in zip(self.encoder_spec.output_names, part):
                batch_axis, length_axis = self._length_axes[name]
                if name not in merged:
                    shape = list(value.shape)
                    shape[batch_axis], shape[length_axis] = len(src), src.shape[1]
                    merged[name] = np.zeros(shape, value.dtype)
                where = [slice(None)] * value.ndim
                where[batch_axis], where[length_axis] = rows, slice(0, value.shape[length_axis])
                merged[name][tuple(where)] = value
        return merged

    def _run_host(self, token: np.ndarray, state: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        named = dict(zip(self.output_names, self._run_decoder(self.output_names, {"token": token, **state})))
        if self.recorded:
            self.record("decoder", {n: named[n] for n in self.recorded})
        return named["log_probs"], self._next_host_state(state, named, len(token))

    def _next_host_state(self, state: dict, named: dict, rows: int) -> dict:
        """The state after a host step: its caches replaced by the step's, which are in the step's row order (so ROWS,
        where the graph takes the caches' rows, is that order again)."""
        new_state = next_host_state(self.decoder_spec, state, named)
        if self._graph_reorders:
            new_state[ROWS] = np.arange(rows, dtype=np.int64)
        return new_state

    def _run_step(self, token: np.ndarray, state: dict[str, ort.OrtValue], log_probs_on: str):
        binding = self.decoder.io_binding()
        binding.bind_cpu_input("token", token)
        if self._graph_reorders:
            binding.bind_cpu_input(ROWS, np.arange(len(token), dtype=np.int64))
        for name, value in state.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_output("log_probs", log_probs_on, 0)
        for out_name in self.decoder_spec.updates:
            binding.bind_output(out_name, self.device, 0)
        for out_name in self.recorded:
            binding.bind_output(out_name, "cpu")
        self.decoder.run_with_iobinding(binding)
        named = dict(zip(["log_probs", *self.decoder_spec.updates, *self.recorded], binding.get_outputs()))
        if self.recorded:
            self.record("decoder", {n: named[n].numpy() for n in self.recorded})
        return named["log_probs"], self.decoder_spec.next_state(state, named)

    def step(self, token: np.ndarray, state: dict) -> tuple[np.ndarray, dict]:
        if not self.io_binding:
            return self._run_host(token, state)
        log_probs, new_state = self._run_step(token, state, "cpu")
        return log_probs.numpy(), new_state

    def greedy_steps(self, state: dict) -> Callable[[int], tuple[int, float]]:
        """On the host: one feed of the decoder's inputs, kept by the search, whose caches each step's outputs replace
        in place, and the next token read off the log-probabilities as a Python number, instead of the arrays step_top_k
        builds at each step (the feed, the next state, the ranking's rows). 200 Tatoeba Challenge sentences one per
        call, int8, one thread, CPU time a request: 4.48 -> 4.06 ms (1.11x); fp32 within noise."""
        if self.io_binding or self.recorded or type(self).step_top_k is not OrtBackend.step_top_k:
            return super().greedy_steps(state)
        feeds = dict(state)
        feeds["token"] = token = np.zeros(1, dtype=np.int64)  # written in place: the next step's token
        run, names, caches, log_probs = self._run_decoder, self.output_names, self._cache_outputs, self.output_names.index("log_probs")

        in_order = np.zeros(1, dtype=np.int64)  # after the first step the caches are this one row's

        def step(last: int) -> tuple[int, float]:
            token[0] = last
            outputs = run(names, feeds)
            for i, name in caches:
                feeds[name] = outputs[i]
            if ROWS in feeds:
                feeds[ROWS] = in_order
            row = outputs[log_probs][0]
            best = int(row.argmax())
            return best, float(row[best])

        return step

    def step_top_k(self, token: np.ndarray, state: dict, k: int):
        """Ranks with a TopK graph on the decoder's device, so only (rows, k) values reach the host
        (on CUDA the log-probabilities never leave the GPU); greedy on CPU takes numpy's argmax of
        the host copy, quicker than another session run."""
        if not self.io_binding:
            log_probs, new_state = self._run_host(token, state)
            if k == 1:
                return (*top_k_rows(log_probs, k), new_state)
            values, indices = self.ranker.run(None, {"log_probs": log_probs, "k": np.array([min(k, log_probs.shape[-1])], dtype=np.int64)})
            return values, indices, new_state
        if k == 1 and self.device == "cpu":
            return super().step_top_k(token, state, k)
        log_probs, new_state = self._run_step(token, state, self.device)
        binding = self.ranker.io_binding()
        binding.bind_ortvalue_input("log_probs", log_probs)
        binding.bind_cpu_input("k", np.array([min(k, log_probs.shape()[-1])], dtype=np.int64))
        binding.bind_output("values", "cpu")
        binding.bind_output("indices", "cpu")
        self.ranker.run_with_iobinding(binding)
        values, indices = binding.get_outputs()
        return values.numpy(), indices.numpy(), new_state

    def reorder_beams(self, state: dict, rows: np.ndarray) -> dict:
        if not self.io_binding:
            return reorder_rows(state, rows, self.batch_axis, keep=self.decoder_spec.constant_inputs | self._graph_reorders)
        return self.select(state, rows)

    def select(self, state: dict, rows: np.ndarray) -> dict:
        if self._per_sentence is not None:
            return take_sentence_rows(state, rows, self.batch_axis, self._per_sentence, keep=self._graph_reorders)
        if not self.io_binding:
            return reorder_rows(state, rows, self.batch_axis, keep=self._graph_reorders)
        binding = self.selector.io_binding()
        for name, value in state.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_cpu_input("rows", np.ascontiguousarray(rows, dtype=np.int64))
        for name in state:
            binding.bind_output(f"{name}.rows", self.device, 0)
        self.selector.run_with_iobinding(binding)
        return dict(zip(state, binding.get_outputs()))
