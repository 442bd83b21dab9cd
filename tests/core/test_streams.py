"""Concurrent decoding streams (`--streams`): the same translations, decoded in several threads at once."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from toolkit.core.batching import DecodeOptions, decode_ids
from toolkit.core.decoding import StepBackend
from toolkit.core.tokenizer import EOS

MODEL = Path(__file__).resolve().parents[2] / "exported" / "transformer"


class Counting(StepBackend):
    """A deterministic toy model that notes which thread encoded each batch; a source starting
    with 13 makes its step fail, as a runtime error would."""

    def __init__(self, log: list, vocab: int = 9):
        self.log, self.vocab = log, vocab

    def fork(self) -> Counting:
        return Counting(self.log, self.vocab)

    def encode(self, src, src_len):
        self.log.append((threading.get_ident(), int(src[0, 0])))
        time.sleep(0.01)  # a batch takes long enough that a second stream picks up the next one
        return {"src": src[:, 0].copy(), "t": 0}

    def step(self, token, state):
        if (state["src"] == 13).any():
            raise RuntimeError("planted failure")
        logits = np.cos(np.outer(state["src"] + state["t"], np.arange(self.vocab)) + token[:, None])
        logits[:, EOS] += 0.5 * state["t"]
        return (logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)).astype(np.float32), {**state, "t": state["t"] + 1}

    def select(self, state, rows):
        return {"src": state["src"][rows], "t": state["t"]}


SOURCES = [[s, 3, 4][: 1 + s % 3] for s in range(20, 44)]


@pytest.mark.parametrize("beam", [1, 3])
def test_streams_give_the_same_hypotheses_and_really_run_concurrently(beam):
    one_log, three_log = [], []
    opts = dict(beam=beam, batch_size=2, max_len=12)
    one = decode_ids(Counting(one_log), SOURCES, DecodeOptions.bare(**opts))
    three = decode_ids(Counting(three_log), SOURCES, DecodeOptions.bare(**opts, streams=3))
    assert [[(h.tokens, round(h.score, 5)) for h in n] for n in three] == [[(h.tokens, round(h.score, 5)) for h in n] for n in one]
    assert sorted(s for _, s in three_log) == sorted(s for _, s in one_log)  # every batch decoded exactly once
    assert len({t for t, _ in three_log}) > 1 and len({t for t, _ in one_log}) == 1


def test_a_failing_stream_raises_its_error_and_stops_the_others():
    log = []
    with pytest.raises(RuntimeError, match="planted failure"):
        # The failing source is the longest, so its batch is among the first taken.
        decode_ids(Counting(log), [[13, 3, 4, 5]] + SOURCES * 4, DecodeOptions.bare(batch_size=1, max_len=12, streams=2))
    assert len(log) < len(SOURCES) * 4  # the other stream did not go on through all its batches


def test_streams_on_the_shipped_model_translate_as_one_stream_does():
    from toolkit import Translator

    texts = ["I'm home.", "He's calm.", "Where is the station?", "We ate bread.", "She is tired.", "It's raining."]
    t = Translator(MODEL, provider="cpu")
    assert t.translate(texts, batch_size=1, streams=3) == t.translate(texts, batch_size=1)
    assert t.translate(texts, beam=4, batch_size=2, streams=2) == t.translate(texts, beam=4, batch_size=2)


def test_streams_share_the_models_sessions_instead_of_building_their_own():
    from toolkit.core import manifest
    from toolkit.runtimes.onnxruntime.loading import load_sessions

    backend = load_sessions(manifest.load(MODEL), "cpu").backend()
    twin = backend.fork()
    assert twin is not backend and twin.decoder is backend.decoder
    assert twin.ranker is backend.ranker and twin.selector is backend.selector  # made once, on first use


@pytest.mark.parametrize("cpus, streams, threads", [(1, 1, 1), (2, 2, 1), (3, 3, 1), (8, 4, 2), (16, 4, 4)])
def test_default_streams_and_threads_never_oversubscribe_the_cores(monkeypatch, cpus, streams, threads):
    from toolkit.core import batching

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert (batching.default_streams(), batching.default_threads()) == (streams, threads)
    for asked in (1, 2, 4, 64):
        for given in (None, 1, 2, cpus):
            fit = batching.fitting_streams(asked, given)
            assert 1 <= fit <= asked and (fit == 1 or fit * (given or threads) <= cpus)


def test_the_api_defaults_use_one_thread_per_stream_on_this_machine():
    from toolkit import Translator
    from toolkit.core.batching import cores, default_streams

    t = Translator(MODEL, provider="cpu")
    backend = t.loaded.backend().for_streams()
    threads = {s.get_session_options().intra_op_num_threads for s in (backend.encoder, backend.decoder)}
    assert threads == {max(1, cores() // default_streams())}


def test_streams_asked_beyond_the_cores_are_cut_to_fit(monkeypatch):
    from toolkit import Translator
    from toolkit.runtimes.onnxruntime.backend import OrtBackend

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    forks = []
    real = OrtBackend.fork
    monkeypatch.setattr(OrtBackend, "fork", lambda self: forks.append(1) or real(self))
    t = Translator(MODEL, provider="cpu", threads=2)
    many = [f"Sentence number {i} is here." for i in range(40)]
    assert t.translate(many, streams=4, batch_size=4) == Translator(MODEL, provider="cpu", threads=1).translate(many, streams=1, batch_size=4)
    assert forks == []  # 2 threads on 2 cores leave room for one stream


def test_streams_take_the_longest_batches_first_so_the_end_waits_on_short_ones():
    # Each stream takes the next batch when it is free; a long batch left for last keeps the
    # other streams idle while it decodes alone.
    log = []
    sources = [[20 + n] + [3] * n for n in range(8)]  # source n is n + 1 tokens long
    decode_ids(Counting(log), sources, DecodeOptions.bare(batch_size=2, max_len=12, streams=2))
    first_tokens = [s for _, s in log]
    assert first_tokens[:2] == [26, 24] or first_tokens[:2] == [24, 26]  # the two longest batches start first
    assert first_tokens[-1] == 20  # the shortest batch is the last one taken


def test_one_batch_decodes_on_every_core_and_streams_on_sessions_of_their_own():
    # A single request has the cores to itself: its decoder runs on all of them with spinning workers. Streams
    # share the cores, so they decode on other sessions of one thread each, made when a call first needs them.
    from toolkit import Translator
    from toolkit.core.batching import default_request_threads

    t = Translator(MODEL, provider="cpu")
    backend = t._backend
    spin = "session.intra_op.allow_spinning"

    def threads_and_spin(session):
        so = session.get_session_options()
        try:
            spins = so.get_session_config_entry(spin)
        except Exception:  # not set: onnxruntime's default, spinning
            spins = "1"
        return so.intra_op_num_threads, spins

    texts = [f"We have {n} apples." for n in range(70)]
    one = [t.translate([x])[0] for x in texts[:3]]
    assert threads_and_spin(backend.decoder) == (default_request_threads(), "1")
    assert threads_and_spin(backend.encoder) == (1, "0")
    made = backend.stream_sessions.__self__._stream_sessions
    assert made == {}  # single requests made no stream sessions
    assert t.translate(texts, streams=2)[:3] == one
    streams = backend.for_streams()
    assert made and streams.decoder is made["decoder"] and streams.decoder is not backend.decoder
    assert threads_and_spin(streams.decoder) == (1, "0") and threads_and_spin(streams.encoder) == (1, "0")
    assert backend.for_streams() is streams  # made once, with its ranking session


def test_a_small_models_int8_request_decodes_on_one_thread_and_every_other_on_every_core(monkeypatch):
    """A small model's int8 products at one row are too small to share out between threads: the shipped model's int8
    request was never faster on two spinning threads than on one, and at times 1.4x slower. Its float graphs, and a
    large model's int8 ones, still take every core (up to 4) for a call of one batch."""
    from toolkit import Translator
    from toolkit.core import batching
    from toolkit.core.manifest import load
    from toolkit.runtimes.onnxruntime.runtime import weights_bytes

    monkeypatch.setattr(batching, "cores", lambda: 4)  # the test's worker may have one core: say there are four
    shipped = weights_bytes(load(MODEL)) // 4
    assert 7_000_000 < shipped < batching.SMALL_INT8_WEIGHTS
    assert batching.default_request_threads("int8", shipped) == 1
    assert batching.default_request_threads("int8", 75_000_000) == 4
    assert batching.default_request_threads("optimized", shipped) == batching.default_request_threads("fp32", shipped) == 4
    for variant, threads in (("int8", 1), (None, 4)):
        t = Translator(MODEL, provider="cpu", variant=variant)
        assert t._backend.decoder.get_session_options().intra_op_num_threads == threads, variant
        assert t.translate(["I'm home."]) == Translator(MODEL, provider="cpu", variant=variant, threads=1).translate(["I'm home."])


def test_a_streams_ranking_runs_on_its_own_threads():
    """Beam search ranks each step's candidates in a helper session: with ONNX Runtime's default (every core)
    it took the other streams' cores, whatever thread count the user gave the decoder."""
    from toolkit import Translator

    t = Translator(Path(__file__).resolve().parents[2] / "exported" / "transformer", provider="cpu", threads=1)
    t.translate(["I'm home.", "It's raining.", "Where is the station?"], beam=4, batch_size=1, streams=2)
    streams = t._backend.for_streams()
    assert streams.ranker.get_session_options().intra_op_num_threads == 1


def test_each_call_borrows_the_same_forks_and_calls_at_once_get_their_own():
    # Stream threads are new at every call; what a stream keeps between searches (its beam reorder memory) goes with
    # its fork, which a call borrows and gives back, so the next call decodes on it again.
    made = []

    class Forking(Counting):
        def fork(self) -> Counting:
            made.append(Counting(self.log, self.vocab))
            return made[-1]

    backend = Forking([])
    opts = DecodeOptions.bare(beam=3, batch_size=2, max_len=12, streams=2)
    first = decode_ids(backend, SOURCES, opts)
    assert decode_ids(backend, SOURCES, opts) == first and len(made) == 2
    # Two calls at the same time never share a fork: the second borrows new ones while the first holds its own.
    held = backend.borrow_forks(2)
    assert len(made) == 2 and set(map(id, held)) == set(map(id, made))
    other = backend.borrow_forks(2)
    assert len(made) == 4 and not set(map(id, other)) & set(map(id, held))
    backend.return_forks(held)
    backend.return_forks(other)
    assert len({id(f) for f in backend.borrow_forks(4)}) == 4 and len(made) == 4


def test_a_second_beam_call_with_streams_reorders_into_the_memory_of_the_first(monkeypatch):
    # Memory made for each search cost an int8 beam row 7% (fresh pages for every larger cache): decoding.ReorderMemory.
    from toolkit import Translator

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # room for two streams of one thread (a test worker has one core)
    t = Translator(MODEL, provider="cpu", threads=1)
    texts = ["I'm home.", "He's calm.", "Where is the station?", "We ate bread."]
    first = t.translate(texts, beam=4, batch_size=2, streams=2)
    streams_backend = t._backend.for_streams()
    memories = [f._reorder_memory.here() for f in streams_backend._spare_forks]
    arrays = {id(a) for m in memories for a, _ in m.values()}
    assert len(memories) == 2 and arrays  # both streams reordered beams into memory their forks keep
    assert t.translate(texts, beam=4, batch_size=2, streams=2) == first
    assert {id(a) for f in streams_backend._spare_forks for a, _ in f._reorder_memory.here().values()} == arrays
