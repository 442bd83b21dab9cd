"""One stderr line per finished shard: shards done/total, lines translated, lines/s and the ETA."""

from __future__ import annotations

import time
from collections.abc import Callable


def clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    def __init__(self, shards: int, lines: int, done_shards: int, done_lines: int, say: Callable[[str], None],
                 now: Callable[[], float] = time.perf_counter):
        self.shards, self.lines = shards, lines
        self.done_shards, self.done_lines = done_shards, done_lines
        self.new_lines = 0  # lines translated by this run: the rate leaves out shards done by an earlier one
        self.say, self.now = say, now
        self.start = now()

    def rate(self) -> float:
        elapsed = self.now() - self.start
        return self.new_lines / elapsed if elapsed > 0 else 0.0

    def shard_finished(self, lines: int, failed: bool = False) -> str:
        self.done_shards += 1
        self.done_lines += lines
        self.new_lines += lines
        rate = self.rate()
        left = self.lines - self.done_lines
        eta = clock(left / rate) if rate > 0 else "?"
        line = (f"shards {self.done_shards}/{self.shards}, {self.done_lines:,}/{self.lines:,} lines, {rate:,.1f} lines/s, ETA {eta}"
                + ("  (a shard failed)" if failed else ""))
        self.say(line)
        return line
