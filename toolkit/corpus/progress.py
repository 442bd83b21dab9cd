"""Progress of a corpus run on stderr: a line per finished shard (shards done/total, lines, lines/s, ETA),
and between them, at most every `every` seconds, the lines the running shards have translated so far."""

from __future__ import annotations

import time
from collections.abc import Callable


def clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    def __init__(self, shards: int, lines: int, done_shards: int, done_lines: int, say: Callable[[str], None],
                 now: Callable[[], float] = time.perf_counter, every: float = 10.0):
        self.shards, self.lines = shards, lines
        self.done_shards, self.done_lines = done_shards, done_lines
        self.new_lines = 0  # lines translated by this run: the rate leaves out shards done by an earlier one
        self.in_flight = 0  # lines the unfinished shards have translated so far
        self.worker_lines = 0
        self.say, self.now, self.every = say, now, every
        self.start = self.last_said = now()

    def rate(self) -> float:
        elapsed = self.now() - self.start
        return (self.new_lines + self.in_flight) / elapsed if elapsed > 0 else 0.0

    def _line(self, suffix: str = "") -> str:
        rate = self.rate()
        done = self.done_lines + self.in_flight
        eta = clock((self.lines - done) / rate) if rate > 0 else "?"
        line = f"shards {self.done_shards}/{self.shards}, {done:,}/{self.lines:,} lines, {rate:,.1f} lines/s, ETA {eta}" + suffix
        self.say(line)
        self.last_said = self.now()
        return line

    def translating(self, worker_lines: int) -> str | None:
        """`worker_lines`: every line the workers of this run have translated so far, finished shards included.
        Says a line at most every `every` seconds."""
        self.worker_lines = worker_lines
        self.in_flight = max(0, worker_lines - self.new_lines)
        if not self.in_flight or self.now() - self.last_said < self.every:
            return None
        return self._line(" (shards running)")

    def shard_finished(self, lines: int, failed: bool = False) -> str:
        self.done_shards += 1
        self.done_lines += lines
        self.new_lines += lines
        self.in_flight = max(0, self.worker_lines - self.new_lines)
        return self._line("  (a shard failed)" if failed else "")
