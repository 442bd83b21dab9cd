"""How tk's file translation and CTranslate2's scale from one core to two: wall seconds of a file of Tatoeba Challenge
lines on one stream (tk: one ONNX Runtime thread; CTranslate2: intra 1 x inter 1) and on two (tk: two streams of one
thread each, its default on 2 cores; CTranslate2: intra 1 x inter 2), medians of --repeat runs taken in turns. Then
where the wall time of tk's two-stream call goes: before the first batch (text preparation, tokenizing), each stream's
batches, and after the last one (joining lines); the gap between one stream's time and half of it is what the two
cores lose.

    python docs/measurements/stream_scaling.py [--model exported/transformer] [--lines 2000] [--repeat 3]

tk translates text in and text out with its defaults; CTranslate2 ids in and ids out, in batches of 64 sentences as
tk bench gives it, the model as tk bench --text converts it (in a temporary directory).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "exported" / "transformer")
    p.add_argument("--text", type=Path, default=REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt")
    p.add_argument("--lines", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()

    from toolkit.bench.text import FILE_BATCH, read_text
    from toolkit.core.manifest import load
    from toolkit.core.tokenizers import open_tokenizer
    from toolkit.deploy.api import Translator
    from toolkit.runtimes.ctranslate2.engine import Ct2Translator
    from toolkit.runtimes.ctranslate2.spec import convert

    lines = read_text(a.text)[0][: a.lines]
    with tempfile.TemporaryDirectory() as tmp:
        m = load(a.model)
        ct2_dir = convert(m, Path(tmp) / "ct2")  # as tk bench --text converts it, in CTranslate2's own file names
        src = [s[: m.max_len] for s in open_tokenizer(m).encode(lines)]
        print(f"{len(lines)} lines, greedy, wall seconds, median of {a.repeat} in turns:")
        for variant, compute in (("fp32", "float32"), ("int8", "int8")):
            translator = Translator(a.model, provider="cpu", variant=None if variant == "fp32" else variant, threads=1)
            with Ct2Translator(str(ct2_dir), compute, 1, 1) as one, Ct2Translator(str(ct2_dir), compute, 1, 2) as two:
                runs = {"CTranslate2 1 x 1": lambda c=one: c.translate_ids(src, 1, m.max_len, FILE_BATCH),
                        "CTranslate2 1 x 2": lambda c=two: c.translate_ids(src, 1, m.max_len, FILE_BATCH),
                        "tk 1 stream": lambda tr=translator: tr.translate(lines, streams=1),
                        "tk 2 streams": lambda tr=translator: tr.translate(lines, streams=2)}
                for run in runs.values():  # warm-up
                    run()
                walls: dict[str, list[float]] = {name: [] for name in runs}
                for _ in range(a.repeat):
                    for name, run in runs.items():
                        start = time.perf_counter()
                        run()
                        walls[name].append(time.perf_counter() - start)
                s = {name: statistics.median(w) for name, w in walls.items()}
                print(f"  {variant}: " + ", ".join(f"{name} {t:.3f} s" for name, t in s.items()))
                print(f"    one core to two: CTranslate2 {s['CTranslate2 1 x 1'] / s['CTranslate2 1 x 2']:.2f}x, "
                      f"tk {s['tk 1 stream'] / s['tk 2 streams']:.2f}x; tk/CT2 speed on one core "
                      f"{s['CTranslate2 1 x 1'] / s['tk 1 stream']:.2f}, on two {s['CTranslate2 1 x 2'] / s['tk 2 streams']:.2f}")
                print(f"    tk's two-stream call: {phases(translator, lines)}")


def phases(translator, lines: list[str]) -> str:
    """Where one two-stream call's wall time goes: before the first batch's decode, each thread's batches (wall and
    thread CPU; a decode in the calling thread, MainThread, runs while no stream does), and after the last batch."""
    from toolkit.core import batching

    spans: list[tuple[str, float, float, float]] = []
    decode = batching.translate_ids

    def timed(*args, **kwargs):
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return decode(*args, **kwargs)
        finally:
            spans.append((threading.current_thread().name, start, time.perf_counter(), time.thread_time() - cpu))

    batching.translate_ids = timed
    try:
        start = time.perf_counter()
        translator.translate(lines, streams=2)
        end = time.perf_counter()
    finally:
        batching.translate_ids = decode
    first, last = min(s[1] for s in spans), max(s[2] for s in spans)
    streams = sorted({s[0] for s in spans})
    busy = [sum(s[2] - s[1] for s in spans if s[0] == t) for t in streams]
    cpu = [sum(s[3] for s in spans if s[0] == t) for t in streams]
    return (f"{end - start:.3f} s: {1000 * (first - start):.0f} ms before the first batch, "
            + ", ".join(f"{t}'s batches {b:.3f} s ({c:.3f} s of its CPU)" for t, b, c in zip(streams, busy, cpu))
            + f", {1000 * (end - last):.0f} ms after the last")


if __name__ == "__main__":
    main()
