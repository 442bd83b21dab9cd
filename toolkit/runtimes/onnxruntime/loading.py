"""A model directory loaded on ONNX Runtime: a session per graph, made side by side, from the directory's files,
a variant built in memory, or the start-up cache's optimised copy; and step backends over them."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnxruntime as ort

from toolkit.core import architectures
from toolkit.core.errors import UsageError
from toolkit.core.manifest import Manifest
from toolkit.core.variants import PLAIN
from toolkit.graphs import variants
from toolkit.graphs.native_attention import native_attention
from toolkit.graphs.sentence_cross import cross_per_sentence
from toolkit.graphs.sentence_cross import digest as sentence_cross_digest
from toolkit.runtimes.onnxruntime import native
from toolkit.runtimes.onnxruntime.backend import OrtBackend
from toolkit.runtimes.onnxruntime.graph_cache import cached_session
from toolkit.runtimes.onnxruntime.sessions import OrtRunner, create_session, session_provider
from toolkit.runtimes.onnxruntime.shortlisted import ShortlistBackend, Shortlisting


@dataclass
class LoadedOnnxRuntime:
    manifest: Manifest
    sessions: dict[str, ort.InferenceSession]
    provider: str
    built_s: float = 0.0  # seconds spent building a variant the directory does not store (0: stored)
    # With request threads (load_sessions), `sessions` serve a call of one batch with every core, and concurrent
    # streams decode on sessions of their own, made by this at their first use.
    stream_maker: Callable[[], dict[str, ort.InferenceSession]] | None = None
    threads: int | None = None  # intra-op threads of each CPU session, set by the registry's loader (None: not given, or CUDA)
    shortlisting: Shortlisting | None = None  # decode over the directory's shortlist (shortlisted.py)
    _stream_sessions: dict[str, ort.InferenceSession] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def runners(self) -> dict[str, OrtRunner]:
        return {name: OrtRunner(s) for name, s in self.sessions.items()}

    def backend(self) -> OrtBackend:
        specs = self.manifest.specs()
        if self.shortlisting is not None:
            return ShortlistBackend(self.sessions["encoder"], self.sessions["decoder"], specs["encoder"], specs["decoder"],
                                    self.shortlisting, stream_sessions=self._streams if self.stream_maker else None)
        return OrtBackend(self.sessions["encoder"], self.sessions["decoder"], specs["encoder"], specs["decoder"],
                          stream_sessions=self._streams if self.stream_maker else None)

    def _streams(self) -> dict[str, ort.InferenceSession]:
        with self._lock:
            if not self._stream_sessions:
                self._stream_sessions.update(self.stream_maker())
            return self._stream_sessions


def load_sessions(m: Manifest, provider: str = "cpu", variant: str = "fp32", allow_fallback: bool = False, threads: int | None = None,
                  cache: bool = False, request_threads: int | None = None, shortlisting: Shortlisting | None = None) -> LoadedOnnxRuntime:
    """Sessions for every graph of the directory; a variant it does not store is built in memory.

    cache: on CPU, load each stored graph from the user cache's optimised copy (graph_cache);
    only for a directory whose files were just checked against the manifest's sha256.
    request_threads: on CPU, the decoder session gets that many intra-op threads, spinning between the steps of a
    call, for calls of one batch (a single request, a short list); the other graphs keep `threads`, and only the
    decoder spins (two sessions' spinning workers take the cores from each other). Concurrent streams get sessions
    of `threads` threads each, made at their first use: one pool shared by several streams oversubscribes the cores.
    shortlisting: the decoder is the shortlisted one (built here, at each load: the start-up cache holds plain graphs).
    """
    if provider == "cuda":
        architectures.get(m.model).check("cuda")
        if shortlisting is not None:
            raise UsageError("--shortlist runs on the CPU provider; drop it or use --provider cpu")
    requests = bool(request_threads) and provider == "cpu"

    # On the CPU the decoder's step attention runs on tk's own kernels where this machine can build them
    # (toolkit.runtimes.onnxruntime.native; its sessions register them).
    kernels = provider == "cpu" and native.library() is not None

    def create(path, *args, graph: str = "", **kw) -> ort.InferenceSession:
        if requests and graph == "decoder":
            kw.update(threads=request_threads, spin=True)
        if kernels and graph == "decoder":
            kw["configure"] = _also(native.register, kw.get("configure"))
        return create_session(path, *args, **kw)

    makers, built = {}, {}
    specs = m.specs()
    # On the CPU the decoder's cross-attention reads each sentence's encoder outputs once, not once per beam
    # (toolkit.graphs.sentence_cross; the backend sees it in the session's metadata).
    per_sentence = provider == "cpu"
    for name in m.graphs:
        def source(name: str = name) -> Path | bytes:
            graph, built[name] = variants.graph_source(m, name, variant)
            if per_sentence and name == "decoder":
                graph = cross_per_sentence(graph, specs[name].constant_inputs) or graph
            if shortlisting is not None and name == "decoder":
                graph = shortlisting.graph(graph)
            # The graph takes its caches' rows at a beam step (native_attention's ROWS; the backends' select and reorder).
            return (native_attention(graph, beam_rows=True) or graph) if kernels and name == "decoder" else graph

        if cache and provider == "cpu" and not (shortlisting is not None and name == "decoder"):
            # A variant the directory does not store is built only when the cache has no copy of it.
            identity = _graph_identity(m, name, variant) + (f" {sentence_cross_digest()}" if name == "decoder" else "")
            identity += f" {native.digest()} past-rows" if kernels and name == "decoder" else ""
            makers[name] = functools.partial(cached_session, source, identity,
                                             functools.partial(create, graph=name), threads)
        else:
            # The shortlisted decoder's configure (its weights file's folder) is read after source() has rewritten it.
            makers[name] = lambda name=name: create(source(name), provider, threads=threads, allow_fallback=allow_fallback, graph=name,
                                                    configure=shortlisting.configure if shortlisting is not None and name == "decoder" else None)
    sessions = _concurrently(makers)
    used = session_provider(next(iter(sessions.values())))
    loaded = LoadedOnnxRuntime(m, sessions, used, max(built.values(), default=0.0), shortlisting=shortlisting)  # built side by side
    if requests:
        loaded.stream_maker = lambda: load_sessions(m, provider, variant, allow_fallback, threads, cache, shortlisting=shortlisting).sessions
    return loaded


def _also(first: Callable[[ort.SessionOptions], None],
          then: Callable[[ort.SessionOptions], None] | None) -> Callable[[ort.SessionOptions], None]:
    def both(options: ort.SessionOptions) -> None:
        first(options)
        if then is not None:
            then(options)

    return both


def _concurrently(makers: dict[str, Callable[[], ort.InferenceSession]]) -> dict[str, ort.InferenceSession]:
    """Creates the sessions in one thread each: ONNX Runtime releases the GIL while it loads a graph
    and prepacks its weights, so the encoder's and decoder's creations overlap."""
    results: dict[str, ort.InferenceSession | BaseException] = {}
    done = {name: threading.Event() for name in makers}

    def make(name: str) -> None:
        try:
            results[name] = makers[name]()
        except BaseException as e:  # re-raised in the caller's thread below
            results[name] = e
        finally:
            done[name].set()

    workers = [threading.Thread(target=make, args=(name,), name=f"tk-load-{name}") for name in list(makers)[1:]]
    for w in workers:
        w.start()
    try:
        make(next(iter(makers)))
    finally:
        # Waited for even when Ctrl-C or SIGTERM interrupts this thread: a process that exits while a loader thread
        # is still inside ONNX Runtime aborts ("terminate called without an active exception", exit 134).
        _wait(list(done.values()))
    for name in makers:
        if isinstance(results[name], BaseException):
            raise results[name]
    return {name: results[name] for name in makers}


def _wait(events: list[threading.Event]) -> None:
    """Waits until every event is set; a KeyboardInterrupt that arrives while waiting is raised after that. Events, not
    Thread.join: a join that KeyboardInterrupt breaks can leave is_alive() False while the thread still runs (Python 3.11)."""
    interrupted: BaseException | None = None
    for event in events:
        while not event.is_set():
            try:
                event.wait()
            except KeyboardInterrupt as e:
                interrupted = e
    if interrupted is not None:
        raise interrupted


def _graph_identity(m: Manifest, graph: str, variant: str) -> str:
    """The sha256 of a stored graph and of the weights it reads; for a variant built in memory, also
    its name and the digest of the code that builds it (an upgraded builder makes a new entry)."""
    if variant in m.stored:
        return m.stored[variant].graphs[graph].sha256
    record = m.graphs[graph]
    identity = f"{record.sha256} {record.weights.sha256 if record.weights else ''}"
    return identity if variant == PLAIN else f"{identity} {variant} {variants.builder_digest()}"
