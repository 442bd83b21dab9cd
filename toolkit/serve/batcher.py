"""Cross-request dynamic batching: sentences from concurrent requests share one decode.

One worker thread owns the model and its step backend; the event loop only enqueues sentences
and awaits futures, so it never blocks on ONNX Runtime. Torch-free.
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

from toolkit.core.batching import DecodeOptions
from toolkit.core.errors import first_line
from toolkit.deploy.translate import Translation, TranslationModel, translate_batch
from toolkit.serve.metrics import Metrics

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
    max_tokens: int = 1024  # padded source tokens x beam per decode (longest sentence x sentences x beam)
    max_sentences: int = 64  # sentences per decode
    max_delay_s: float = 0.010  # how long the oldest sentence may wait for company
    queue_size: int = 1024  # sentences waiting, over all requests
    batching: bool = True  # off: one sentence per decode (the baseline the load test compares with)


@dataclass(frozen=True)
class OptionKey:
    """Decoding options: only sentences with equal options can share a decode."""

    beam: int
    n_best: int
    alpha: float | None
    max_len: int


@dataclass
class _Item:
    text: str
    tokens: int  # source length, for the batch's token budget
    key: OptionKey
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    deadline: float = math.inf  # time.monotonic() past which nobody waits for it
    queued_at: float = field(default_factory=time.monotonic)


class Batcher:
    """Queues sentences and decodes them in batches on one worker thread.

    Each request has its own lane; lanes take turns, so a request of many long sentences holds
    another request for one batch at most, never for all its sentences. A batch is led by the lane
    whose turn it is and filled round-robin from the lanes with the same options, within the
    sentence and the work budget (padded source tokens x beam). It leaves as soon as it is full or
    its oldest sentence has waited max_delay_s. translate_batch sorts it by length and restores the
    order, so a sentence's translation does not depend on its batch. Sentences whose request was
    cancelled (timed out, client gone) or whose deadline passed are dropped, not decoded.
    """

    def __init__(self, load: Callable[[], TranslationModel], policy: BatchPolicy, metrics: Metrics):
        self.load = load
        self.policy = policy
        self.metrics = metrics
        self.translator: TranslationModel | None = None
        self.ready = threading.Event()
        self.failed: str | None = None
        self._lanes: OrderedDict[int, deque[_Item]] = OrderedDict()  # one per request, in turn order
        self._depth = 0  # sentences in the lanes
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
        """Sentences waiting in the lanes (what the queue limit counts)."""
        return self._depth

    @property
    def healthy(self) -> bool:
        """Loaded, warmed up, and the decoding worker is still running."""
        return self.ready.is_set() and self.failed is None and self._thread.is_alive() and not self._closing

    def not_ready_reason(self) -> str:
        return self.failed or ("shutting down" if self._closing or self.ready.is_set() else "the model is still loading")

    def count_tokens(self, text: str) -> int:
        # For sizing batches only; translation itself goes through translate_batch.
        return len(self.translator.tokenizer.encode([text])[0]) if text else 0

    async def translate(self, texts: list[str], key: OptionKey, deadline: float = math.inf) -> list[list[Translation]]:
        """The n-best translations of texts, in order. Raises TooLarge, QueueFull or NotReady at once,
        TimeoutError once time.monotonic() passes deadline with sentences still queued."""
        if len(texts) > self.policy.queue_size:
            raise TooLarge(f"{len(texts)} sentences in one request, more than the whole queue holds ({self.policy.queue_size}, "
                           f"--queue-size); send at most {self.policy.queue_size} per request")
        if not self.healthy:
            raise NotReady(self.not_ready_reason())
        loop = asyncio.get_running_loop()
        items = [_Item(t, self.count_tokens(t), key, loop.create_future(), loop, deadline) for t in texts]
        with self._cond:
            if self._depth + len(items) > self.policy.queue_size:
                raise QueueFull(f"{self._depth} sentences queued, limit {self.policy.queue_size}")
            lane = next(self._ids)
            self._lanes[lane] = deque(items)
            self._set_depth(self._depth + len(items))
            self._cond.notify()
        try:
            return list(await asyncio.gather(*(i.future for i in items)))
        except BaseException:
            self.cancel(lane)
            raise

    def cancel(self, lane: int) -> None:
        """Drops a timed-out or disconnected request's sentences that are still queued."""
        with self._cond:
            items = self._lanes.pop(lane, ())
            for i in items:
                i.future.cancel()
            self._set_depth(self._depth - len(items))

    def _set_depth(self, depth: int) -> None:
        self._depth = depth
        self.metrics.queue_depth.set(depth)

    # The worker thread.

    def _run(self) -> None:
        try:
            self.translator = self.load()
            backend = self.translator.backend()
            start = time.perf_counter()
            translate_batch(self.translator, [WARMUP_TEXT], self._options(OptionKey(1, 1, 0.6, self.translator.manifest.max_len), 1),
                            backend=backend)
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
            i.loop.call_soon_threadsafe(_settle, i.future, None, error)

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
                    i.loop.call_soon_threadsafe(_settle, i.future, None, TimeoutError("deadline passed while queued"))
            if len(kept) != len(lane):
                self._set_depth(self._depth - (len(lane) - len(kept)))
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
        self._set_depth(self._depth - len(batch))
        return batch

    @staticmethod
    def _padded(items: list[_Item]) -> int:
        return max((i.tokens for i in items), default=0) * len(items)

    def _options(self, key: OptionKey, n: int) -> DecodeOptions:
        return DecodeOptions(beam=key.beam, alpha=key.alpha, n_best=key.n_best, max_len=key.max_len, batch_size=max(n, 1),
                             max_tokens=self.policy.max_tokens, max_src_len=self.translator.manifest.max_len)

    def _decode(self, batch: list[_Item], backend: object) -> None:
        m = self.metrics
        now = time.monotonic()
        for i in batch:
            m.queue_wait.observe(now - i.queued_at)
        m.batch_sentences.observe(len(batch))
        m.batch_tokens.observe(self._padded(batch))
        start = time.perf_counter()
        try:
            results = translate_batch(self.translator, [i.text for i in batch], self._options(batch[0].key, len(batch)), backend=backend,
                                      warn=log.warning)
        except Exception as e:
            log.exception("decode of %d sentences failed", len(batch))
            for i in batch:
                i.loop.call_soon_threadsafe(_settle, i.future, None, e)
            return
        m.decode_seconds.observe(time.perf_counter() - start)
        for i, nbest in zip(batch, results):
            m.source_tokens.inc(nbest[0].source_tokens)
            m.target_tokens.inc(nbest[0].tokens if nbest[0].source_tokens else 0)
            i.loop.call_soon_threadsafe(_settle, i.future, nbest, None)


def _settle(future: asyncio.Future, result: object, error: BaseException | None) -> None:
    if future.done():  # the request timed out or went away meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
