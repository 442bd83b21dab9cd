"""ONNX Runtime sessions: providers, visible CUDA fallback detection, and the step backend.

Imports onnxruntime and numpy, never torch: this is the deployment path.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from toolkit.core.decoding import StepBackend, empty_cache, take_rows, top_k_rows
from toolkit.core.errors import ProviderError, UsageError, first_line
from toolkit.core.graphs import GraphSpec
from toolkit.core.manifest import Manifest
from toolkit.core.ort_options import CPU_DISABLED_OPTIMIZERS, session_options
from toolkit.core.variants import describe, graph_source

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
CUDA_FIX = ("ONNX Runtime could not load its CUDA provider and fell back to CPU; install the CUDA 13 and cuDNN 9 "
            "runtime libraries (or call onnxruntime.preload_dlls() with a CUDA build of torch installed), "
            "or use --provider cpu")
# fp32 means fp32: the CUDA provider rounds float32 matrix products to TF32 (10-bit mantissa) by default on
# Ampere and later. Measured on an H100 with the shipped Transformer: TF32 gives errors of 6e-3 to 8e-3
# against PyTorch (verify fails 126 of 356 checks), where the fp32 tolerance is 1e-4; the fp16 variant is the
# fast reduced-precision choice, and it is verified as such.
CUDA_OPTIONS = {"use_tf32": "0"}
CUDA_INSTALL = "pip install -e '.[cuda]' (onnxruntime-gpu with its CUDA and cuDNN pip packages)"

# ONNX Runtime prints a multi-line warning when CUDA libraries are missing; tk reports it in one line instead.
ort.set_default_logger_severity(4)


def cuda_available() -> bool:
    """True only if a session really runs on CUDA, not merely if the provider is compiled in."""
    return PROVIDERS["cuda"] in ort.get_available_providers() and not _no_nvidia_device() and _probe_cuda()


_preloaded = False


def preload_cuda_libraries() -> None:
    """Loads the CUDA and cuDNN libraries of the nvidia-* pip packages (the cuda extra), so the CUDA
    provider finds them without LD_LIBRARY_PATH. Once per process; a no-op where ONNX Runtime lacks it."""
    global _preloaded
    if _preloaded or not hasattr(ort, "preload_dlls"):
        return
    _preloaded = True
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # its notes go to stdout, where translations go
        try:
            ort.preload_dlls()
        except Exception:  # what is still missing is named by cuda_problem()
            pass


def cuda_problem() -> str:
    """Why ONNX Runtime's CUDA provider cannot run here, in one clause with its fix ("" if nothing is found)."""
    if PROVIDERS["cuda"] not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} is a build without the CUDA provider; {CUDA_INSTALL}"
    if _no_nvidia_device():
        return "no NVIDIA GPU or driver is visible (/dev/nvidiactl is missing)"
    preload_cuda_libraries()
    missing = _missing_cuda_library()
    if missing:
        return f"the CUDA provider needs {missing}, which is not found; {CUDA_INSTALL}, or put its directory on LD_LIBRARY_PATH"
    return ""


def _missing_cuda_library() -> str:
    """The first shared library the CUDA provider cannot load (Linux; '' elsewhere or when it loads)."""
    import ctypes
    import re

    if sys.platform != "linux":
        return ""
    capi = Path(ort.__file__).parent / "capi"
    try:
        ctypes.CDLL(str(capi / "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(capi / "libonnxruntime_providers_cuda.so"))
    except OSError as e:
        found = re.search(r"(lib[\w.+-]+\.so[\w.]*)", str(e))
        return found.group(1) if found else first_line(e)
    return ""


def gpu_environment() -> dict:
    """The GPU a CUDA result was measured on: its name, the driver and the CUDA runtime versions (what is found)."""
    import ctypes
    import shutil
    import subprocess

    env: dict = {}
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
            if out:
                name, driver, memory = (x.strip() for x in out[0].split(",")[:3])
                env.update(gpu=name, gpu_driver=driver, gpu_memory=memory)
        except (OSError, subprocess.SubprocessError, ValueError):
            pass  # informational: the record still names the provider
    preload_cuda_libraries()
    for lib in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            version = ctypes.c_int()
            ctypes.CDLL(lib).cudaRuntimeGetVersion(ctypes.byref(version))
            env["cuda_runtime"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
            break
        except (OSError, AttributeError):
            continue
    return env


def cuda_fix() -> str:
    """The one-line error for a CUDA session that fell back to CPU: the reason found, then the way out."""
    problem = cuda_problem()
    if not problem:
        return CUDA_FIX
    return f"ONNX Runtime could not load its CUDA provider: {problem}; or use --provider cpu (--allow-cpu-fallback runs on CPU)"


def _no_nvidia_device() -> bool:
    # The probe imports onnx and creates a session (a third of `tk translate`'s start-up on a
    # CPU-only machine); without the driver's device node on Linux, CUDA cannot load anyway.
    return sys.platform == "linux" and not Path("/dev/nvidiactl").exists()


_cuda_probe: bool | None = None


def _probe_cuda() -> bool:
    global _cuda_probe
    if _cuda_probe is None:
        from onnx import TensorProto, helper

        preload_cuda_libraries()

        probe = _serialized([helper.make_node("Identity", ["x"], ["y"])], "probe",
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        try:
            s = ort.InferenceSession(probe, session_options(), providers=[PROVIDERS["cuda"], PROVIDERS["cpu"]])
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
        preload_cuda_libraries()
    disabled = list(CPU_DISABLED_OPTIMIZERS) if cpu else []
    try:
        # CPU: worker threads sleep between runs instead of spinning. The encoder, decoder and row
        # selection sessions each own a thread pool, and the decoding loop's host work runs between
        # their runs; on 2 cores, spinning workers take the cores those need. Measured on the shipped
        # Transformer, greedy over 256 sentences: batch 64 fp32 725 -> 960 sentences/s, int8 1248 ->
        # 1593; batch 1 unchanged (118 vs 122, 272 vs 267).
        options = session_options(optimization, threads, spin=spin or not cpu)
        if configure:
            configure(options)
        session = ort.InferenceSession(path if isinstance(path, bytes) else str(path), options, providers=providers,
                                       disabled_optimizers=disabled)
    except Exception as e:
        first = first_line(e)
        raise UsageError(f"cannot load {describe(path)}: {first}; re-export the model directory") from None
    if provider == "cuda" and session.get_providers()[0] != PROVIDERS["cuda"] and not allow_fallback:
        raise ProviderError(cuda_fix())
    return session


def session_provider(session: ort.InferenceSession) -> str:
    return "cuda" if session.get_providers()[0] == PROVIDERS["cuda"] else "cpu"


def selection_graph(decoder_spec: GraphSpec, batch_axis: dict[str, int]) -> bytes:
    """A graph that Gathers the given rows of every decoder state tensor along its batch axis.

    Run on the decoder's own device, it lets finished rows leave the batch and beams be
    reordered without the cache ever leaving GPU memory.
    """
    from onnx import TensorProto, helper

    types = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}
    state = decoder_spec.inputs[1:]
    rows = helper.make_tensor_value_info("rows", TensorProto.INT64, ["rows"])
    inputs = [helper.make_tensor_value_info(t.name, types[t.dtype], [d if isinstance(d, int) else None for d in t.dims])
              for t in state]
    outputs = [helper.make_tensor_value_info(f"{t.name}.rows", types[t.dtype], [None] * len(t.dims)) for t in state]
    nodes = [helper.make_node("Gather", [t.name, "rows"], [f"{t.name}.rows"], axis=batch_axis[t.name]) for t in state]
    return _serialized(nodes, "select_rows", [*inputs, rows], outputs)


def _serialized(nodes, name: str, inputs, outputs) -> bytes:
    from onnx import helper

    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = min(model.ir_version, 10)
    return model.SerializeToString()


def top_k_graph() -> bytes:
    """log_probs (rows, vocab), k (1,) -> the k best values of each row, largest first, and their ids."""
    from onnx import TensorProto, helper

    return _serialized([helper.make_node("TopK", ["log_probs", "k"], ["values", "indices"], axis=-1, largest=1, sorted=1)],
                       "top_k", [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["rows", "vocab"]),
                                 helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
                       [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["rows", "k"]),
                        helper.make_tensor_value_info("indices", TensorProto.INT64, ["rows", "k"])])


def direct_run(session: ort.InferenceSession) -> Callable[[list[str], dict], list]:
    """The session's run without the Python wrapper's checks of the feed: the decoding loop builds every feed
    itself, and the native run still refuses a missing or mistyped input. The wrapper's checks cost 12 us of
    every decoder step, 3% of a single request (int8, 2 cores). Any other session-like object runs as it is."""
    native = getattr(session, "_sess", None)
    # A session whose run is its own (a wrapper set on it, a stand-in) keeps it.
    if native is None or "run" in vars(session) or getattr(type(session), "run", None) is not _SESSION_RUN:
        return session.run
    return lambda names, feeds: native.run(names, feeds, None)


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
        self.stream_sessions = stream_sessions  # see LoadedOnnxRuntime
        self._streams_backend: OrtBackend | None = None
        self.encoder_spec, self.decoder_spec = encoder_spec, decoder_spec
        self.state_names = decoder_spec.input_names[1:]
        self.output_names = decoder_spec.output_names  # built once: a single request runs the decoder a dozen times
        self._run_decoder = direct_run(decoder)
        self.batch_axis = {t.name: t.dims.index("batch") for t in decoder_spec.inputs[1:]}
        self.device = session_provider(decoder)
        self.io_binding = self.device != "cpu" if io_binding is None else io_binding
        self._helpers: dict[str, ort.InferenceSession] = {}  # the ranking and row-selection sessions
        self._helpers_lock = threading.Lock()

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
        return self._helper("ranker", top_k_graph, threads=self._decoder_threads())

    def _decoder_threads(self) -> int | None:
        """The decoder session's intra-op threads; None where it has ONNX Runtime's default."""
        options = getattr(self.decoder, "get_session_options", None)
        return (options().intra_op_num_threads or None) if options else None

    def _helper(self, name: str, graph, threads: int | None = None) -> ort.InferenceSession:
        with self._helpers_lock:
            if name not in self._helpers:
                self._helpers[name] = ort.InferenceSession(graph(), session_options(threads=threads, spin=self.device != "cpu"),
                                                           providers=self.decoder.get_providers())
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
        return twin

    def _to_device(self, value: np.ndarray) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value), self.device, 0)

    def encode(self, src: np.ndarray, src_len: np.ndarray) -> dict[str, ort.OrtValue | np.ndarray]:
        outputs = dict(zip(self.encoder_spec.output_names, self.encoder.run(None, {"src": src, "src_len": src_len})))
        outputs.update(src=src, src_len=src_len)
        self.record("encoder", outputs)
        outputs.update(empty_cache(self.decoder_spec, outputs, len(src)))
        if not self.io_binding:
            return {n: outputs[n] for n in self.state_names}
        return {n: self._to_device(outputs[n]) for n in self.state_names}

    def _run_host(self, token: np.ndarray, state: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        named = dict(zip(self.output_names, self._run_decoder(self.output_names, {"token": token, **state})))
        if self.recorded:
            self.record("decoder", {n: named[n] for n in self.recorded})
        return named["log_probs"], self.decoder_spec.next_state(state, named)

    def _run_step(self, token: np.ndarray, state: dict[str, ort.OrtValue], log_probs_on: str):
        binding = self.decoder.io_binding()
        binding.bind_cpu_input("token", token)
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
            return take_rows(state, rows, self.batch_axis, keep=self.decoder_spec.constant_inputs)
        return self.select(state, rows)

    def select(self, state: dict, rows: np.ndarray) -> dict:
        if not self.io_binding:
            return take_rows(state, rows, self.batch_axis)
        binding = self.selector.io_binding()
        for name, value in state.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_cpu_input("rows", np.ascontiguousarray(rows, dtype=np.int64))
        for name in state:
            binding.bind_output(f"{name}.rows", self.device, 0)
        self.selector.run_with_iobinding(binding)
        return dict(zip(state, binding.get_outputs()))


@dataclass
class LoadedOnnxRuntime:
    manifest: Manifest
    sessions: dict[str, ort.InferenceSession]
    provider: str
    built_s: float = 0.0  # seconds spent building a variant the directory does not store (0: stored)
    # With request threads (load_sessions), `sessions` serve a call of one batch with every core, and concurrent
    # streams decode on sessions of their own, made by this at their first use.
    stream_maker: Callable[[], dict[str, ort.InferenceSession]] | None = None
    _stream_sessions: dict[str, ort.InferenceSession] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def backend(self) -> OrtBackend:
        specs = self.manifest.specs()
        return OrtBackend(self.sessions["encoder"], self.sessions["decoder"], specs["encoder"], specs["decoder"],
                          stream_sessions=self._streams if self.stream_maker else None)

    def _streams(self) -> dict[str, ort.InferenceSession]:
        with self._lock:
            if not self._stream_sessions:
                self._stream_sessions.update(self.stream_maker())
            return self._stream_sessions


def load_sessions(m: Manifest, provider: str = "cpu", variant: str = "fp32", allow_fallback: bool = False, threads: int | None = None,
                  cache: bool = False, request_threads: int | None = None) -> LoadedOnnxRuntime:
    """Sessions for every graph of the directory; a variant it does not store is built in memory.

    cache: on CPU, load each stored graph from the user cache's optimised copy (toolkit.core.load_cache);
    only for a directory whose files were just checked against the manifest's sha256.
    request_threads: on CPU, the decoder session gets that many intra-op threads, spinning between the steps of a
    call, for calls of one batch (a single request, a short list); the other graphs keep `threads`, and only the
    decoder spins (two sessions' spinning workers take the cores from each other). Concurrent streams get sessions
    of `threads` threads each, made at their first use: one pool shared by several streams oversubscribes the cores.
    """
    requests = bool(request_threads) and provider == "cpu"

    def create(path, *args, graph: str = "", **kw) -> ort.InferenceSession:
        if requests and graph == "decoder":
            kw.update(threads=request_threads, spin=True)
        return create_session(path, *args, **kw)

    makers, built = {}, {}
    for name in m.graphs:
        def source(name: str = name) -> Path | bytes:
            graph, built[name] = graph_source(m, name, variant)
            return graph

        if cache and provider == "cpu":
            from toolkit.core.load_cache import cached_session

            # A variant the directory does not store is built only when the cache has no copy of it.
            makers[name] = functools.partial(cached_session, source, _graph_identity(m, name, variant),
                                             functools.partial(create, graph=name), threads)
        else:
            makers[name] = lambda name=name: create(source(name), provider, threads=threads, allow_fallback=allow_fallback, graph=name)
    sessions = _concurrently(makers)
    used = session_provider(next(iter(sessions.values())))
    loaded = LoadedOnnxRuntime(m, sessions, used, max(built.values(), default=0.0))  # built side by side
    if requests:
        loaded.stream_maker = lambda: load_sessions(m, provider, variant, allow_fallback, threads, cache).sessions
    return loaded


def _concurrently(makers: dict[str, Callable[[], ort.InferenceSession]]) -> dict[str, ort.InferenceSession]:
    """Creates the sessions in one thread each: ONNX Runtime releases the GIL while it loads a graph
    and prepacks its weights, so the encoder's and decoder's creations overlap."""
    import threading

    results: dict[str, ort.InferenceSession | BaseException] = {}

    def make(name: str) -> None:
        try:
            results[name] = makers[name]()
        except BaseException as e:  # re-raised in the caller's thread below
            results[name] = e

    workers = [threading.Thread(target=make, args=(name,), name=f"tk-load-{name}") for name in list(makers)[1:]]
    for w in workers:
        w.start()
    make(next(iter(makers)))
    for w in workers:
        w.join()
    for name in makers:
        if isinstance(results[name], BaseException):
            raise results[name]
    return {name: results[name] for name in makers}


def _graph_identity(m: Manifest, graph: str, variant: str) -> str:
    """The sha256 of a stored graph and of the weights it reads; for a variant built in memory, also
    its name and the digest of the code that builds it (an upgraded builder makes a new entry)."""
    from toolkit.core.variants import PLAIN, builder_digest

    if variant in m.stored:
        return m.stored[variant].graphs[graph].sha256
    record = m.graphs[graph]
    identity = f"{record.sha256} {record.weights.sha256 if record.weights else ''}"
    return identity if variant == PLAIN else f"{identity} {variant} {builder_digest()}"
