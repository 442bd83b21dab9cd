"""CTranslate2's two CPU backends, MKL (CT2_USE_MKL=1) and oneDNN (CT2_USE_MKL=0), on the rows of `tk bench --scale`:
four of the bench's own workers (toolkit/bench/scale_worker.py: fp32 and int8 on each backend), each in a process of
its own, taking turns row by row (the order reversed every other round), after a warm-up round on each row's first
batch. After every round each row's median so far is printed with the MKL/oneDNN ratio (above 1: MKL is faster) and
whether the two backends' tokens are identical.

    python docs/measurements/ct2_backends.py [--work DIR] [--rounds 5] [--rows greedy,beam4] [--one-batch] [--threads 2]
        [--json OUT]

The work directory is tk bench --scale's (its ct2/ directory, from CTranslate2's own converter).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    sys.path.insert(0, str(REPO))
    from toolkit.bench.scale import PAUSE_S, ROWS, _Worker, sources
    from toolkit.core.load_cache import default_directory

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=default_directory() / "bench-scale" / "opus-mt")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rows", default="greedy,beam4", help="of greedy, beam4, percall (the bench's three rows)")
    parser.add_argument("--one-batch", action="store_true", help="each row's first batch only (32 sentences greedy, 16 at beam 4)")
    parser.add_argument("--json", type=Path)
    a = parser.parse_args()
    rows = [r for key, r in zip(("greedy", "beam4", "percall"), ROWS) if key in a.rows.split(",")]
    if a.one_batch:
        rows = [dataclasses.replace(r, name=f"{r.batch} sentences, one batch, " + r.name.split(", ")[-1], sentences=r.batch)
                for r in rows]
    config = json.loads((a.work / "hf" / "config.json").read_text(encoding="utf-8"))
    src = sources(128, 24, config["vocab_size"], config["eos_token_id"], config["pad_token_id"])
    workers = {}
    for precision in ("fp32", "int8"):
        for backend, value in (("mkl", "1"), ("dnnl", "0")):
            os.environ["CT2_USE_MKL"] = value  # the worker's environment, read by CTranslate2 once, at its first load
            w = _Worker(f"ct2-{precision}", a.work / "ct2", a.threads, a.tokens, a.work, None)
            print(f"{precision} {backend}: {w.hello.get('version') or w.hello}", file=sys.stderr)
            workers[precision, backend] = w
    seconds = {(k, r.name): [] for k in workers for r in rows}
    outputs = {}
    for i in range(a.rounds + 1):  # round 0 warms up on each row's first batch, not kept
        order = list(workers) if i % 2 == 0 else list(reversed(workers))
        for row in rows:
            for k in order:
                time.sleep(PAUSE_S)
                got = workers[k].run(src[: row.sentences if i else row.batch], row)
                if i:
                    seconds[k, row.name].append(got["seconds"])
                    outputs[k, row.name] = got["outputs"]
        print(f"round {i} done", file=sys.stderr)
        if i:  # the figures so far, after every round
            report(rows, seconds, outputs, a.tokens, a.json)
    for w in workers.values():
        w.close()


def report(rows, seconds: dict, outputs: dict, tokens: int, path: Path | None) -> None:
    result = []
    for precision in ("fp32", "int8"):
        for row in rows:
            rate = {b: row.sentences * tokens / statistics.median(seconds[(precision, b), row.name]) for b in ("mkl", "dnnl")}
            same = sum(x == y for x, y in zip(outputs[(precision, "mkl"), row.name], outputs[(precision, "dnnl"), row.name]))
            result.append({"precision": precision, "row": row.name, "rounds": len(seconds[(precision, "mkl"), row.name]),
                           "mkl_tokens_per_s": round(rate["mkl"]), "dnnl_tokens_per_s": round(rate["dnnl"]),
                           "mkl/dnnl": round(rate["mkl"] / rate["dnnl"], 2), "same_tokens": f"{same}/{row.sentences}"})
            print(f"| {precision} | {row.name} | {rate['mkl']:,.0f} | {rate['dnnl']:,.0f} | {rate['mkl'] / rate['dnnl']:.2f} | "
                  f"{same}/{row.sentences} |", flush=True)
    if path:
        path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
