"""Cross-request dynamic batching: sentences from concurrent requests share one decode.

A request's texts are prepared as `tk translate` prepares a line (deploy.translate.segment_lines: cleaned, split
into sentences, spans protected) and each sentence is one queue item, so a text of 250 sentences takes turns with
other requests' sentences instead of holding them for its whole decode; each text is joined back from its
sentences (join_line) when all are decoded. One worker thread owns the model and its step backend; the event loop
only enqueues sentences and awaits futures, so it never blocks on ONNX Runtime. Torch-free.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from toolkit.core import placeholders, textprep
from toolkit.core.decode_options import DECLARED, DecodeOptions, declared
from toolkit.core.errors import ToolkitError, first_line
from toolkit.core.glossary import Glossary
from toolkit.core.textprep import TextOptions
from toolkit.deploy.translate import (
    Translation,
    TranslationModel,
    decode_segments,
    decode_sentences,
    join_line,
    repair_note,
    segment_lines,
)
from toolkit.serve.metrics import Metrics
from toolkit.serve.options import default

log = logging.getLogger("tk.serve")

WARMUP_TEXT = "Hello."


class QueueFull(Exception):
    """More sentences are waiting than the queue holds; the client should retry later."""


class TooLarge(Exception):
    """A request has more sentences than the whole queue holds: no retry could ever admit it."""


class NotReady(Exception):
    """The model is still loading or warming up, the server is shutting down, or the decoding worker stopped."""


@dataclass(frozen=True)
class BatchPolicy:
    # The defaults are tk serve's (toolkit.serve.options, where the options are declared).
    max_tokens: int = default("policy.max_tokens")  # padded source tokens x beam per decode (longest sentence x sentences x beam)
    max_sentences: int = default("policy.max_sentences")  # sentences per decode
    max_delay_s: float = default("policy.max_delay_s")  # how long the oldest sentence may wait for company
    queue_size: int = default("policy.queue_size")  # texts (a request's "sentences") waiting, over all requests
    batching: bool = True  # off: one sentence per decode (the baseline the load test compares with)

    def admit(self, texts: int) -> None:
        """Refuses (TooLarge) a request of more texts than the whole queue holds: no retry could ever admit it."""
        if texts > self.queue_size:
            raise TooLarge(f"{texts} sentences in one request, more than the whole queue holds ({self.queue_size}, "
                           f"--queue-size); send at most {self.queue_size} per request")


@dataclass(frozen=True)
class OptionKey:
    """A request's decoding options as it gives them (the declared options tk serve takes, toolkit.core.decode_options;
    one left out is its declared default: guards on, as in `tk translate`), its pair and its glossary. Batcher.options,
    through the one builder, turns them into what decodes, once per request. Only sentences with equal keys share a decode."""

    given: tuple[tuple[str, object], ...]  # (name, value) of every declared "serve" option, in declaration order
    # A multilingual model's pair in its own codes (None: the model's default): another pair is another tokenization
    # and another forced first token, so only sentences of one pair share a decode.
    languages: tuple[str, str] | None = None
    # A request's glossary is applied to each of its texts as they are prepared (each sentence carries its own terms'
    # targets and spans: decode_segments forces them into its translation alone), so sentences of requests with
    # different glossaries share a decode and get the same translation as alone: it takes no part in which share one.
    glossary: Glossary | None = field(default=None, compare=False)

    @classmethod
    def of(cls, languages: tuple[str, str] | None = None, glossary: Glossary | None = None, **given: object) -> OptionKey:
        """The key of a request giving `given` (declared names); the others take their declared defaults."""
        names = [o.name for o in declared("serve")]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise TypeError(f"OptionKey.of() got an unexpected keyword argument {unknown[0]!r}")
        return cls(tuple((n, given.get(n, DECLARED[n].default)) for n in names), languages, glossary)

    @property
    def beam(self) -> int:
        return dict(self.given)["beam"]

    @property
    def n_best(self) -> int:
        return dict(self.given)["n_best"]


@dataclass
class _Item:
    """One sentence (a model input of segment_lines) of one text of one request."""

    text: str
    tokens: int  # source length, for the batch's token budget
    key: OptionKey
    opts: DecodeOptions  # what its request decodes with, built once for the request (Batcher.options)
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    deadline: float = math.inf  # time.monotonic() past which nobody waits for it
    line: int = 1  # its text's place in the request (from 1), which the log's warnings name
    last: bool = True  # the last sentence of its text: the text leaves the queue's count when this one is taken
    queued_at: float = field(default_factory=time.monotonic)
    # The sentence as prepared: its text's own spans, and its glossary terms' targets (decode_segments forces them in).
    segment: textprep.Segment | None = None


class Batcher:
    """Queues sentences and decodes them in batches on one worker thread.

    Each request has its own lane of sentences (its texts split as tk translate splits a line); lanes
    take turns, so a request of many long sentences, or of texts of many sentences, holds another
    request for one batch at most, never for all its sentences. A batch is led by the lane
    whose turn it is and filled round-robin from the lanes with the same options, within the
    sentence and the work budget (padded source tokens x beam). It leaves as soon as it is full or
    its oldest sentence has waited max_delay_s. decode_sentences sorts it by length and restores the
    order, so a sentence's translation does not depend on its batch. Sentences whose request was
    cancelled (timed out, client gone) or whose deadline passed are dropped, not decoded. A batch
    that fails is decoded again one sentence at a time, so one bad input fails its own request only.
    """

    def __init__(self, load: Callable[[], TranslationModel], policy: BatchPolicy, metrics: Metrics):
        self.load = load
        self.policy = policy
        self.metrics = metrics
        self.translator: TranslationModel | None = None
        self._pairs: dict[tuple[str, str], TranslationModel] = {}  # a multilingual model's views, per pair asked for
        self.ready = threading.Event()
        self.failed: str | None = None
        self._lanes: OrderedDict[int, deque[_Item]] = OrderedDict()  # one per request, in turn order
        self._depth = 0  # texts with sentences in the lanes (what --queue-size limits)
        self._decoding: list[_Item] = []
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="tk-decoder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float | None = None) -> None:
        """Refuses new sentences, decodes the queued ones, then stops the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    @property
    def depth(self) -> int:
        """Texts with sentences waiting in the lanes (what the queue limit counts)."""
        return self._depth

    @property
    def healthy(self) -> bool:
        """Loaded, warmed up, and the decoding worker is still running."""
        return self.ready.is_set() and self.failed is None and self._thread.is_alive() and not self._closing

    def not_ready_reason(self) -> str:
        return self.failed or ("shutting down" if self._closing or self.ready.is_set() else "the model is still loading")

    def options(self, key: OptionKey) -> DecodeOptions:
        """What a request decodes with, built once for it: its options through the one builder of user-facing options (so
        the same text as `tk translate` and the API), batches within the policy's sentence and work budgets, one stream
        (the server's concurrency is its batches). A bad value is a UsageError naming it."""
        t = self.chosen(key)
        return DecodeOptions.for_manifest(t.manifest, t.provider, **dict(key.given), batch_size=self.policy.max_sentences,
                                          max_tokens=self.policy.max_tokens, streams=1)

    def chosen(self, key: OptionKey) -> TranslationModel:
        """The model translating the key's pair (TranslationModel.for_languages, as tk translate --source-lang chooses
        it; a view of the one loaded model, kept per pair)."""
        if key.languages is None:
            return self.translator
        view = self._pairs.get(key.languages)
        if view is None:
            view = self._pairs[key.languages] = self.translator.for_languages(*key.languages)
        return view

    def prepare(self, texts: list[str], key: OptionKey | None = None) -> tuple[list[list[textprep.Segment]], list[int]]:
        """Each text's sentences as tk translate prepares a line, and each sentence's source tokens for the batch budget
        (cut to the model's maximum, as decoding cuts them)."""
        t = self.chosen(key) if key is not None else self.translator
        segments = segment_lines(t.manifest, texts, TextOptions(glossary=key.glossary if key is not None else None), _fallback,
                                 lambda: t.tokenizer.alphabet, t.tokenizer)
        ids = t.tokenizer.encode([seg.text for segs in segments for seg in segs])
        return segments, [min(len(i), t.manifest.max_len) for i in ids]

    async def translate(self, texts: list[str], key: OptionKey, deadline: float = math.inf) -> list[list[Translation]]:
        """The n-best translations of texts, in order. Raises TooLarge, QueueFull, NotReady or UsageError (a bad option)
        at once, TimeoutError once time.monotonic() passes deadline with sentences still queued, and whatever preparing
        or decoding one of its own sentences raised: never another request's."""
        self.policy.admit(len(texts))
        if not self.healthy:
            raise NotReady(self.not_ready_reason())
        opts = self.options(key)  # checked before any work
        # Off the event loop: splitting and tokenising 64 texts of 1,000 characters takes tens of milliseconds.
        segments, tokens = await asyncio.to_thread(self.prepare, texts, key)
        loop = asyncio.get_running_loop()
        counts = iter(tokens)
        items = [_Item(seg.text, next(counts), key, opts, loop.create_future(), loop, deadline, line, k == len(segs) - 1, segment=seg)
                 for line, segs in enumerate(segments, 1) for k, seg in enumerate(segs)]
        queued = sum(1 for i in items if i.last)
        with self._cond:
            if self._depth + queued > self.policy.queue_size:
                raise QueueFull(f"{self._depth} sentences queued, limit {self.policy.queue_size}")
            lane = next(self._ids)
            if items:
                self._lanes[lane] = deque(items)
                self._set_depth(self._depth + queued)
                self._cond.notify()
        try:
            decoded = iter(await asyncio.gather(*(i.future for i in items)))
        except BaseException:
            self.cancel(lane)
            raise
        # Each sentence comes back with the segment it was decoded from (decode_segments), whose spans its text restores.
        return [self._joined(line, [next(decoded) for _ in segs], key.n_best) for line, segs in enumerate(segments, 1)]

    @staticmethod
    def _joined(line: int, parts: list[tuple[textprep.Segment, list[Translation]]], n_best: int) -> list[Translation]:
        """One text's n-best from its sentences' (as translate_batch joins a line), its protected spans put back; as there,
        a text whose spans cannot be put back gets an empty translation and a warning."""
        report: list[placeholders.Repair] = []
        try:
            out = join_line(parts, n_best, report)
        except ToolkitError:
            raise
        except Exception as e:  # noqa: BLE001 - one text's spans cannot fail its request's other texts
            _fallback(line - 1, e, "its output is an empty line")
            return join_line([], n_best)
        if report:
            log.warning("warning: line %d: %s", line, repair_note(report))
        return out

    def cancel(self, lane: int) -> None:
        """Drops a timed-out or disconnected request's sentences that are still queued."""
        with self._cond:
            items = self._lanes.pop(lane, ())
            for i in items:
                i.future.cancel()
            self._set_depth(self._depth - sum(i.last for i in items))

    def _set_depth(self, depth: int) -> None:
        self._depth = depth
        self.metrics.queue_depth.set(depth)

    # The worker thread.

    def _run(self) -> None:
        try:
            self.translator = self.load()
            backend = self.translator.backend()
            start = time.perf_counter()
            decode_sentences(self.translator, [WARMUP_TEXT], self.options(OptionKey.of()), backend=backend)
            log.info("ready: %s on %s, warm-up translation in %.0f ms", self.translator.manifest.model, self.translator.provider,
                     1000 * (time.perf_counter() - start))
        except Exception as e:  # a failed load leaves the server alive and not ready, saying why
            self.failed = f"model failed to load: {e}"
            log.error(self.failed)
            return
        self.metrics.ready.set(1)
        self.ready.set()
        try:
            while (batch := self._next_batch()) is not None:
                self._decoding = batch
                self._decode(batch, backend)
                self._decoding = []
        except BaseException as e:  # a bug: say so, answer 503 from now on, and fail every waiting request at once
            self.failed = f"the decoding worker stopped ({type(e).__name__}: {first_line(e)}); restart tk serve"
            log.critical("%s; /ready answers 503 and every request 503 from now on", self.failed, exc_info=e)
            self.metrics.ready.set(0)
            self._fail_all(NotReady(self.failed))

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            items = [*self._decoding, *(i for lane in self._lanes.values() for i in lane)]
            self._lanes.clear()
            self._set_depth(0)
        for i in items:
            _answer(i, None, error)

    def _next_batch(self) -> list[_Item] | None:
        with self._cond:
            while True:
                self._drop_dead()
                if not self._lanes:
                    if self._closing:
                        return None
                    self._cond.wait()
                    continue
                key = next(iter(self._lanes.values()))[0].key
                group = [lane for lane in self._lanes.values() if lane[0].key == key]
                sentences = sum(len(lane) for lane in group)
                longest = max(i.tokens for lane in group for i in lane)
                waited = time.monotonic() - min(lane[0].queued_at for lane in group)
                full = sentences >= self.policy.max_sentences or longest * sentences * key.beam >= self.policy.max_tokens
                if self._closing or not self.policy.batching or full or waited >= self.policy.max_delay_s:
                    return self._take(key)
                self._cond.wait(min(self.policy.max_delay_s - waited, threading.TIMEOUT_MAX))

    def _drop_dead(self) -> None:
        """Drops sentences nobody waits for any more: their request was cancelled or its deadline passed."""
        now = time.monotonic()
        for lane_id, lane in list(self._lanes.items()):
            kept = deque(i for i in lane if not i.future.cancelled() and i.deadline > now)
            for i in lane:
                if not i.future.cancelled() and i.deadline <= now:
                    _answer(i, None, TimeoutError("deadline passed while queued"))
            if len(kept) != len(lane):
                self._set_depth(self._depth - (sum(i.last for i in lane) - sum(i.last for i in kept)))
                if kept:
                    self._lanes[lane_id] = kept
                else:
                    del self._lanes[lane_id]

    def _take(self, key: OptionKey) -> list[_Item]:
        """Round-robin over the lanes with these options, in turn order, while the batch stays within
        its sentence and work budgets (always at least one sentence). Lanes served go to the back."""
        limit = self.policy.max_sentences if self.policy.batching else 1
        lanes = [(lane_id, lane) for lane_id, lane in self._lanes.items() if lane[0].key == key]
        batch: list[_Item] = []
        served: dict[int, None] = {}
        longest = 0
        while any(lane for _, lane in lanes):
            for lane_id, lane in lanes:
                if not lane:
                    continue
                tokens = max(longest, lane[0].tokens)
                if batch and (len(batch) >= limit or tokens * (len(batch) + 1) * key.beam > self.policy.max_tokens):
                    return self._served(batch, served)
                batch.append(lane.popleft())
                longest = tokens
                served[lane_id] = None
        return self._served(batch, served)

    def _served(self, batch: list[_Item], served: dict[int, None]) -> list[_Item]:
        for lane_id in served:
            if self._lanes[lane_id]:
                self._lanes.move_to_end(lane_id)
            else:
                del self._lanes[lane_id]
        self._set_depth(self._depth - sum(i.last for i in batch))
        return batch

    @staticmethod
    def _padded(items: list[_Item]) -> int:
        return max((i.tokens for i in items), default=0) * len(items)

    def _decode(self, batch: list[_Item], backend: object) -> None:
        m = self.metrics
        now = time.monotonic()
        for i in batch:
            m.queue_wait.observe(now - i.queued_at)
        m.batch_sentences.observe(len(batch))
        m.batch_tokens.observe(self._padded(batch))
        start = time.perf_counter()
        try:
            results = decode_segments(self.chosen(batch[0].key), [i.segment or textprep.Segment(i.text) for i in batch],
                                      batch[0].opts, backend=backend, warn=log.warning, lines=[i.line for i in batch],
                                      decode=decode_sentences)
        except Exception as e:
            if len(batch) > 1:
                # Which sentence failed is unknown: each is decoded alone, so the others' requests get their translations.
                log.warning("decode of %d sentences failed (%s: %s); decoding them one at a time", len(batch), type(e).__name__, first_line(e))
                for i in batch:
                    self._decode([i], backend)
                return
            log.exception("decode of a sentence failed")
            _answer(batch[0], None, e)
            return
        m.decode_seconds.observe(time.perf_counter() - start)
        for i, (segment, nbest) in zip(batch, results):
            m.source_tokens.inc(nbest[0].source_tokens)
            m.target_tokens.inc(nbest[0].tokens if nbest[0].source_tokens else 0)
            _answer(i, (segment, nbest), None)


def _fallback(i: int, e: Exception, outcome: str) -> None:
    """segment_lines' word on a text whose preparation failed (it is translated as tk translate translates it)."""
    log.warning("warning: line %d: %s in tk (%s); %s", i + 1, type(e).__name__, first_line(e, 120), outcome)


def _answer(item: _Item, result: object, error: BaseException | None) -> None:
    """Settles a sentence's future on its request's event loop, from the worker thread. A loop already closed has
    nobody waiting on it (its requests ended): that is no reason for the worker to stop."""
    try:
        item.loop.call_soon_threadsafe(_settle, item.future, result, error)
    except RuntimeError:
        if not item.loop.is_closed():
            raise


def _settle(future: asyncio.Future, result: object, error: BaseException | None) -> None:
    if future.done():  # the request timed out or went away meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
