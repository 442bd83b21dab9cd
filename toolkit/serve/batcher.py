"""Cross-request dynamic batching: sentences from concurrent requests share one decode.

One worker thread owns the model and its step backend; the event loop only enqueues sentences
and awaits futures, so it never blocks on ONNX Runtime. Torch-free.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from toolkit.core.batching import DecodeOptions
from toolkit.deploy.translate import Translation, TranslationModel, translate_batch
from toolkit.serve.metrics import Metrics

log = logging.getLogger("tk.serve")

WARMUP_TEXT = "Hello."


class QueueFull(Exception):
    """More sentences are waiting than the queue holds; the client should retry later."""


class NotReady(Exception):
    """The model is still loading or warming up, or the server is shutting down."""


@dataclass(frozen=True)
class BatchPolicy:
    max_tokens: int = 1024  # padded source tokens per decode (longest sentence x sentences)
    max_sentences: int = 64  # sentences per decode
    max_delay_s: float = 0.010  # how long the oldest sentence may wait for company
    queue_size: int = 1024  # sentences waiting, over all requests
    batching: bool = True  # off: one sentence per decode (the baseline the load test compares with)


@dataclass(frozen=True)
class OptionKey:
    """Decoding options: only sentences with equal options can share a decode."""

    beam: int
    n_best: int
    alpha: float
    max_len: int


@dataclass
class _Item:
    text: str
    tokens: int  # source length, for the batch's token budget
    key: OptionKey
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued_at: float = field(default_factory=time.monotonic)


class Batcher:
    """Queues sentences and decodes them in batches on one worker thread.

    A batch holds sentences with the same options, oldest first, and leaves as soon as it is full
    (token or sentence budget) or its oldest sentence has waited max_delay_s. translate_batch sorts
    it by length and restores the order, so a sentence's translation does not depend on its batch.
    """

    def __init__(self, load: Callable[[], TranslationModel], policy: BatchPolicy, metrics: Metrics):
        self.load = load
        self.policy = policy
        self.metrics = metrics
        self.translator: TranslationModel | None = None
        self.ready = threading.Event()
        self.failed: str | None = None
        self._pending: deque[_Item] = deque()
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
        return len(self._pending)

    def count_tokens(self, text: str) -> int:
        # For sizing batches only; translation itself goes through translate_batch.
        return len(self.translator.tokenizer.encode([text])[0]) if text else 0

    async def translate(self, texts: list[str], key: OptionKey) -> list[list[Translation]]:
        """The n-best translations of texts, in order. Raises QueueFull or NotReady at once."""
        if not self.ready.is_set() or self._closing:
            raise NotReady(self.failed or ("shutting down" if self._closing else "the model is still loading"))
        loop = asyncio.get_running_loop()
        items = [_Item(t, self.count_tokens(t), key, loop.create_future(), loop) for t in texts]
        with self._cond:
            if len(self._pending) + len(items) > self.policy.queue_size:
                raise QueueFull(f"{len(self._pending)} sentences queued, limit {self.policy.queue_size}")
            self._pending.extend(items)
            self.metrics.queue_depth.set(len(self._pending))
            self._cond.notify()
        try:
            return list(await asyncio.gather(*(i.future for i in items)))
        except BaseException:
            self.cancel(items)
            raise

    def cancel(self, items: list[_Item]) -> None:
        """Drops a timed-out or disconnected request's sentences that are still queued."""
        for i in items:
            i.future.cancel()
        with self._cond:
            kept = [i for i in self._pending if not i.future.cancelled()]
            self._pending.clear()
            self._pending.extend(kept)
            self.metrics.queue_depth.set(len(self._pending))

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
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._decode(batch, backend)

    def _next_batch(self) -> list[_Item] | None:
        with self._cond:
            while True:
                while self._pending and self._pending[0].future.cancelled():
                    self._pending.popleft()
                if not self._pending:
                    if self._closing:
                        return None
                    self._cond.wait()
                    continue
                oldest = self._pending[0]
                group = [i for i in self._pending if i.key == oldest.key and not i.future.cancelled()]
                waited = time.monotonic() - oldest.queued_at
                full = len(group) >= self.policy.max_sentences or self._padded(group) >= self.policy.max_tokens
                if self._closing or not self.policy.batching or full or waited >= self.policy.max_delay_s:
                    batch = self._fill(group)
                    taken = {id(i) for i in batch}
                    kept = [i for i in self._pending if id(i) not in taken]
                    self._pending.clear()
                    self._pending.extend(kept)
                    self.metrics.queue_depth.set(len(self._pending))
                    return batch
                self._cond.wait(self.policy.max_delay_s - waited)

    @staticmethod
    def _padded(items: list[_Item]) -> int:
        return max((i.tokens for i in items), default=0) * len(items)

    def _fill(self, group: list[_Item]) -> list[_Item]:
        """Oldest first, while the batch stays within its sentence and padded-token budgets."""
        limit = self.policy.max_sentences if self.policy.batching else 1
        batch = [group[0]]
        for item in group[1:]:
            if len(batch) >= limit or self._padded(batch + [item]) > self.policy.max_tokens:
                break
            batch.append(item)
        return batch

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
