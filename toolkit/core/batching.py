"""Length-sorted batched translation that restores input order; backend-agnostic, torch-free."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from toolkit.core.declaration import TK_RULES

# DecodeOptions, its defaults and GUARDED live in a module of their own, which the CLI imports without numpy;
# they are named here too, where the code that decodes has always found them.
from toolkit.core.decode_options import (  # noqa: F401
    BEAM_ROWS,
    GUARDED,
    DecodeOptions,
    cores,
    default_batch_size,
    default_streams,
)
from toolkit.core.decoding import Hypothesis, StepBackend, length_limits, translate_ids


def default_threads() -> int:
    """ONNX Runtime intra-op threads per session unless told: the cores each default stream can have.

    Every stream's session runs share one intra-op pool, so streams x threads is the number of busy
    threads; more than the cores oversubscribes them. Measured on 2 cores (AVX2), first 2,000 Tatoeba
    Challenge sentences, greedy, seconds: fp32 1 thread x 2 streams 3.28, 2 x 1 3.58, 2 x 2 3.56;
    int8 2.09, 2.43; one sentence per call, ms: fp32 11.7 (1 thread), 11.4 (2); int8 5.8, 7.0.
    """
    return max(1, cores() // default_streams())


# An int8 decoder of fewer weights than this decodes a call of one batch on one thread: its products at one row are
# too small to share out. Measured on 2 cores (AVX-512 VNNI AMD EPYC), 200 Tatoeba Challenge sentences one per call
# (`python docs/measurements/request_threads.py`, each setting in processes of its own, in turns): the shipped 7.3M-weight
# model in int8 took 2.8 to 3.3 ms a request on one thread, and on two spinning threads either as much or 4.1 to 4.6
# ms, from one process to the next (at beam 4 both about 8 ms): never faster, on twice the CPU. Its fp32 graphs are
# faster on two (4.6 against 6.2 ms), and so is opus-mt's shape (74.7M) in int8: one sentence per call, 338 and 316
# tokens/s on two threads, 211 and 241 on one. Where between the two sizes the line lies was not measured.
SMALL_INT8_WEIGHTS = 16_000_000


def default_request_threads(variant: str = "fp32", weights: int = 0) -> int:
    """ONNX Runtime intra-op threads of the decoder for a call of one batch (a single request) unless told: every
    core, up to 4, with workers that spin between the steps, except for an int8 decoder of under SMALL_INT8_WEIGHTS
    `weights` (the model's fp32 weights), which runs on one. Streams, which take the cores between them, decode on
    sessions of default_threads(). Measured on 2 cores (AVX-512), 200 Tatoeba Challenge sentences one per call,
    ms: fp32 10.1 -> 6.9, int8 5.2 -> 4.4 (then). Two threads without spinning: fp32 9.2, int8 5.7; the encoder's
    workers spinning too: 13.2 and 7.5 (each session's spinning workers take the cores from the next one run).
    """
    return 1 if one_request_thread(variant, weights) else min(cores(), 4)


def one_request_thread(variant: str, weights: int) -> bool:
    """Whether a call of one batch decodes on one thread whatever the cores: a small model's int8 decoder."""
    return variant == "int8" and weights < SMALL_INT8_WEIGHTS


def fitting_streams(streams: int, threads: int | None) -> int:
    """The streams that fit the cores beside `threads` intra-op threads each (None: the default)."""
    return max(1, min(streams, cores() // (threads or default_threads())))


def length_sorted_batches(lengths: list[int], batch_size: int, max_tokens: int | None) -> Iterator[list[int]]:
    """Indices in batches of similar source length, so padding stays small."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batch: list[int] = []
    for i in order:
        longest = max([lengths[j] for j in batch] + [lengths[i]])
        if batch and (len(batch) >= batch_size or (max_tokens and longest * (len(batch) + 1) > max_tokens)):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


# What a caller does to each batch's hypotheses in the thread that decoded it, on that thread's backend: (backend, the
# batch's indices in the call's sources, its sources, their hypotheses) -> the hypotheses kept.
Finish = Callable[[StepBackend, list[int], list[list[int]], list[list[Hypothesis]]], list[list[Hypothesis]]]


def decode_ids(backend: StepBackend, src: list[list[int]], opts: DecodeOptions,
               done: Callable[[int], None] | None = None, finish: Finish | None = None) -> list[list[Hypothesis]]:
    """Hypotheses for every source sentence, in input order. Empty sources get no decoding.
    `done(n)` is told after each batch how many sentences it finished (from the decoding threads, one at a time), so a
    progress bar moves per batch, not per call. `finish` runs on each batch's hypotheses where it was decoded (a
    runtime with a loop of its own: on all of them at once), decoding on that stream's backend if it must, so that work
    a batch calls for (the guard's retry, its text) runs beside the other streams' batches, not after all of them on
    one core."""
    if opts.max_src_len:
        src = [s[: opts.max_src_len] for s in src]
    tell = _one_at_a_time(done)
    whole_sentences = getattr(backend, "decode_all", None)
    if whole_sentences is not None:  # a runtime with a loop of its own (CTranslate2) takes every sentence at once
        out_all = whole_sentences(src, opts)
        if finish is not None:
            out_all = finish(backend, list(range(len(src))), src, out_all)
        tell(len(src))
        return out_all
    out: list[list[Hypothesis]] = [[Hypothesis([], 0.0)] for _ in src]
    todo = [i for i, s in enumerate(src) if s]
    # Longest batches first: streams take the next batch as they free up, so the last batches set
    # how long the others wait idle at the end, and short ones leave the least. First 2,000 Tatoeba
    # Challenge sentences, fp32, 1 thread x 2 streams: greedy 1.87 -> 1.74 s, beam 4 7.17 -> 6.40 s.
    batches = [[todo[b] for b in batch]
               for batch in length_sorted_batches([len(src[i]) for i in todo], opts.batch_size, opts.max_tokens)][::-1]

    def decode(be: StepBackend, idx: list[int]) -> None:
        batch_src = [src[i] for i in idx]
        limits = length_limits(batch_src, opts.max_len, opts.max_len_a, opts.max_len_b)
        results = translate_ids(be, batch_src, opts.max_len, opts.beam, opts.alpha, opts.n_best, limits, opts.loop_guard,
                                opts.rules or TK_RULES)
        if finish is not None:
            results = finish(be, idx, batch_src, results)
        for i, hyps in zip(idx, results):
            out[i] = hyps
        tell(len(idx))

    streams = min(opts.streams, len(batches))
    if streams <= 1:
        for idx in batches:
            decode(backend, idx)
    else:
        first = backend.for_streams()
        forks = first.borrow_forks(streams)
        try:
            _decode_concurrently(decode, forks, batches)
        finally:
            first.return_forks(forks)
    return out


def _one_at_a_time(done: Callable[[int], None] | None) -> Callable[[int], None]:
    if done is None:
        return lambda n: None
    lock = threading.Lock()

    def tell(n: int) -> None:
        with lock:
            done(n)

    return tell


def _decode_concurrently(decode: Callable[[StepBackend, list[int]], None], backends: list[StepBackend],
                         batches: list[list[int]]) -> None:
    """Each backend's thread takes the next batch until none is left. On an error or Ctrl-C in
    any thread the others stop after their current batch, and the error is raised here."""
    pending = iter(batches)
    lock, stop = threading.Lock(), threading.Event()

    def work(be: StepBackend) -> None:
        while not stop.is_set():
            with lock:
                idx = next(pending, None)
            if idx is None:
                return
            try:
                decode(be, idx)
            except BaseException:
                stop.set()
                raise

    # Imported here: concurrent.futures brings logging with it (6 ms of every start), and a call that
    # decodes one batch, as a single request does, runs no stream beside it.
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(len(backends), thread_name_prefix="tk-stream")
    try:
        for future in [pool.submit(work, be) for be in backends]:
            future.result()
    except BaseException:
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True)


def translate_texts(backend: StepBackend, tokenizer, texts: list[str], opts: DecodeOptions) -> list[str]:
    """Best translation of each text, in input order."""
    hyps = decode_ids(backend, tokenizer.encode(texts), opts)
    return tokenizer.decode([h[0].tokens for h in hyps])
