"""Each training epoch's examples: the same pairs (with that epoch's copy pairs, toolkit.core.copydata) and that
epoch's robustness noise, tokenized.

Noising and tokenizing 150,000 pairs takes seconds of Python per epoch, so the next epochs'
examples are prepared in worker processes while the current epoch trains (one by default; a GPU
that finishes an epoch faster than one worker makes one needs more). The workers are spawned
(not forked) so they never inherit a CUDA context; this module imports no torch.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing

from toolkit.core import data
from toolkit.core.copydata import CopyData
from toolkit.core.noise import NoiseConfig, PairNoise
from toolkit.core.tokenizer import Tokenizer

_worker: dict = {}


def _init(pairs, proto: bytes, max_len: int, noise: dict | None, seed: int, copy_rate: float = 0.0) -> None:
    _worker.update(pairs=pairs, tokenizer=Tokenizer(proto), max_len=max_len, seed=seed,
                   noise=PairNoise(NoiseConfig(**noise), seed) if noise is not None else None,
                   copy=CopyData(pairs, copy_rate, seed) if copy_rate else None)


def _examples(epoch: int) -> list[tuple[list[int], list[int]]]:
    w = _worker
    pairs = w["pairs"] + w["copy"].epoch_pairs(epoch) if w["copy"] else w["pairs"]  # copy pairs: names swapped on both sides
    pairs = w["noise"].pairs(pairs, w["seed"] * 1000 + epoch) if w["noise"] else pairs
    return data.encode_pairs(w["tokenizer"], pairs, w["max_len"])


class EpochData:
    """examples(epoch) -> that epoch's (source ids, target ids); deterministic given the seed, so a
    resumed run sees exactly the batches it would have seen."""

    def __init__(self, pairs, tokenizer: Tokenizer, max_len: int, noise: NoiseConfig | None, seed: int, copy_rate: float = 0.0,
                 workers: int = 1):
        args = (pairs, tokenizer.model_proto, max_len, noise.asdict() if noise else None, seed, copy_rate)
        self._pool, self._workers = None, max(1, workers)
        self._cache: dict[int, object] = {}
        if noise is None and not copy_rate:  # the pairs never change: encode once, here
            _init(*args)
            self._fixed = _examples(0)
        else:
            self._fixed = None
            self._pool = concurrent.futures.ProcessPoolExecutor(self._workers, multiprocessing.get_context("spawn"), _init, args)

    def examples(self, epoch: int):
        if self._fixed is not None:
            return self._fixed
        self.prefetch(epoch)
        result = self._cache[epoch].result()
        self.prefetch(epoch + 1)  # prepared while this epoch trains
        return result

    def prefetch(self, epoch: int) -> None:
        """Starts making `epoch` and the epochs after it (one per worker); earlier epochs are forgotten."""
        if self._pool is None:
            return
        self._cache = {e: f for e, f in self._cache.items() if e >= epoch}
        for e in range(epoch, epoch + self._workers):
            if e not in self._cache:
                self._cache[e] = self._pool.submit(_examples, e)

    def close(self) -> None:
        if self._pool:
            self._pool.shutdown(cancel_futures=True)
