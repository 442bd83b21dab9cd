"""Two builds of one decoder graph side by side: the same step (random tokens, a past of --past positions, a source
of --source) on each, one intra-op thread. Prints whether every output is bit for bit the same, then per round the
median step time of each, each graph timed in a process of its own (the two processes in turns, the first of a round
alternating), with the resident memory its session added. In one process the two sessions' times depended on which
was made first (up to 7% at one row), so each gets a process to itself.

    python docs/measurements/decoder_step_ab.py BEFORE.onnx AFTER.onnx [--rows 64] [--past 16] [--rounds 4]

BEFORE and AFTER: e.g. a copy of WORK/tk/decoder.int8.onnx made with the previous tree and the one `tk export WORK/tk
--quantize int8 --force` writes now (WORK: the `tk bench --scale` work directory). The cache's names and shapes are
read from AFTER's inputs (self_k_0 ... and cross_k_0 ..., batch x heads x positions x head width).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for tk's own session options


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _feeds(session, rows: int, past: int, source: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in session.get_inputs():
        if spec.name == "token":
            feeds[spec.name] = rng.integers(10, 1000, rows).astype(np.int64)
        elif spec.name == "src_len":
            feeds[spec.name] = np.full(rows, source, np.int64)
        elif spec.name.startswith(("self_", "cross_")):
            heads, width = spec.shape[1], spec.shape[3]
            positions = past if spec.name.startswith("self_") else source
            feeds[spec.name] = rng.standard_normal((rows, heads, positions, width), dtype=np.float32)
        else:
            raise SystemExit(f"unexpected decoder input {spec.name}; this script knows tk's decoder graphs")
    return feeds


def _time_one(args) -> None:
    """In a process of its own: one session, a warm-up, then the median of --steps steps (ms) and the memory it added."""
    from toolkit.runtimes.onnxruntime.sessions import create_session

    start = _rss()
    session = create_session(args.time_one, "cpu", threads=1)
    grown = _rss() - start
    feeds = _feeds(session, args.rows, args.past, args.source)
    names = [o.name for o in session.get_outputs()]
    for _ in range(3):
        session.run(names, feeds)
    times = []
    for _ in range(args.steps):
        start_t = time.perf_counter()
        session.run(names, feeds)
        times.append(time.perf_counter() - start_t)
    print(json.dumps({"ms": float(np.median(times)) * 1e3, "rss_mib": grown / 2**20}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, nargs="?")
    parser.add_argument("after", type=Path, nargs="?")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--past", type=int, default=16)
    parser.add_argument("--source", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per graph per round")
    parser.add_argument("--time-one", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time_one:
        return _time_one(args)
    from toolkit.runtimes.onnxruntime.sessions import create_session

    sessions = [create_session(path, "cpu", threads=1) for path in (args.before, args.after)]
    feeds = _feeds(sessions[1], args.rows, args.past, args.source)
    outputs = [s.run([o.name for o in s.get_outputs()], feeds) for s in sessions]
    print(f"every output bit for bit the same: {all(np.array_equal(a, b) for a, b in zip(*outputs))}")
    del sessions, outputs
    common = ["--rows", str(args.rows), "--past", str(args.past), "--source", str(args.source), "--steps", str(args.steps)]
    for r in range(args.rounds):
        got = {}
        for which in (("before", "after") if r % 2 == 0 else ("after", "before")):
            out = subprocess.run([sys.executable, __file__, "--time-one", str(getattr(args, which)), *common],
                                 check=True, capture_output=True, text=True).stdout
            got[which] = json.loads(out.strip().splitlines()[-1])
        b, a = got["before"], got["after"]
        print(f"round {r + 1}: {args.rows} rows, past {args.past}: before {b['ms']:.2f} ms (+{b['rss_mib']:.0f} MiB), "
              f"after {a['ms']:.2f} ms (+{a['rss_mib']:.0f} MiB), {b['ms'] / a['ms']:.3f}x")


if __name__ == "__main__":
    main()
