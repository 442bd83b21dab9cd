"""Two versions of tk (and optionally a peer) on one row of `tk bench --scale`, in turns: each engine is the bench's own
worker (toolkit/bench/scale_worker.py) in a process of its own, the turns alternate order round by round, and each
row's median after a warm-up round is printed with the ratios and whether the two tk versions' tokens are identical.

    python docs/measurements/scale_turns.py --before TREE [--engine tk-int8] [--row beam4] [--rounds 5] [--peer ct2-int8]
        [--sources FILE]

TREE: a directory holding the other version's `toolkit` package (a copy of the tree with the old files), put first
on PYTHONPATH for the "before" worker; "after" is this checkout. The work directory is tk bench --scale's
($TK_CACHE_DIR/bench-scale/opus-mt by default; its ct2/ for a CTranslate2 peer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROWS = {"greedy": (128, 32, 1, False), "beam4": (32, 16, 4, False), "percall": (8, 1, 1, True)}  # as toolkit.bench.scale


def main() -> None:
    sys.path.insert(0, str(REPO))
    from toolkit.bench.scale import PAUSE_S
    from toolkit.core.load_cache import default_directory

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--engine", default="tk-int8", choices=["tk-int8", "tk-fp32"])
    parser.add_argument("--row", default="beam4", choices=list(ROWS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--peer", choices=["ct2-int8", "ct2-fp32"])
    parser.add_argument("--work", type=Path, default=default_directory() / "bench-scale" / "opus-mt")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--sources", type=Path, help="the row's sentences: the first lines of this file (tk bench --scale --sources)")
    args = parser.parse_args()

    def start(tree: Path, engine: str, model: Path) -> subprocess.Popen:
        env = dict(os.environ, OMP_NUM_THREADS="2", MKL_NUM_THREADS="2", PYTHONPATH=str(tree))
        proc = subprocess.Popen([sys.executable, "-m", "toolkit.bench.scale_worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd="/")
        proc.stdin.write(json.dumps({"engine": engine, "model": str(model), "threads": 2, "tokens": args.tokens,
                                     "pause": PAUSE_S}) + "\n")
        proc.stdin.flush()
        print(engine, tree, proc.stdout.readline().strip(), file=sys.stderr)
        return proc

    workers = {"before": start(args.before, args.engine, args.work / "tk"), "after": start(REPO, args.engine, args.work / "tk")}
    if args.peer:
        workers[args.peer] = start(REPO, args.peer, args.work / "ct2")
    import numpy as np

    rng = np.random.default_rng(1)
    n, batch, beam, per_call = ROWS[args.row]
    src = [[int(t) for t in rng.integers(2, 59000, 24)] + [0] for _ in range(n)]
    if args.sources:
        from toolkit.bench.scale import real_sources

        src = real_sources(args.sources, n, args.work / "tk")
    seconds: dict[str, list[float]] = {k: [] for k in workers}
    outputs: dict[str, list] = {}
    for r in range(args.rounds + 1):
        for name in (list(workers) if r % 2 == 0 else list(workers)[::-1]):
            workers[name].stdin.write(json.dumps({"src": src, "batch": batch, "beam": beam, "per_call": per_call}) + "\n")
            workers[name].stdin.flush()
            result = json.loads(workers[name].stdout.readline())
            seconds[name].append(result["seconds"])
            outputs[name] = result["outputs"]
            time.sleep(PAUSE_S)  # the last engine's spinning threads idle before the next starts, as in the bench
    median = {k: statistics.median(v[1:]) for k, v in seconds.items()}
    line = (f"{args.engine} {args.row}: before {n * args.tokens / median['before']:.0f} tok/s, after "
            f"{n * args.tokens / median['after']:.0f} tok/s, after/before {median['before'] / median['after']:.2f}x, tokens "
            f"{'identical' if outputs['before'] == outputs['after'] else 'DIFFER'}")
    if args.peer:
        line += (f"; against {args.peer}: after {median[args.peer] / median['after']:.2f}x, "
                 f"before {median[args.peer] / median['before']:.2f}x")
    print(line)
    for proc in workers.values():
        proc.stdin.close()
        proc.wait()


if __name__ == "__main__":
    main()
