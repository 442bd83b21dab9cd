"""What tk adds around CTranslate2: `Translator(DIR, runtime="ctranslate2").translate(lines, beam=B)` (tk's text
handling, guards and hypotheses around CTranslate2's translate_batch) against CTranslate2's own translate_batch with the
same SentencePiece model at 1 x 2 threads (its fastest for a file on 2 cores), each in a process of its own, so that no
other translator's OpenMP threads share the cores. Best of 3 passes over the first 2,000 Tatoeba Challenge sentences.

    python docs/measurements/ct2_overhead.py tk|ct2 --model DIR [--beam 4]

DIR must store a CTranslate2 model (tk export DIR --ctranslate2). Run the two sides alternately, a few times each.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("side", choices=["tk", "ct2"])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--challenge", type=Path, default=REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt")
    args = parser.parse_args()
    lines = [x.split("\t")[2] for x in args.challenge.read_text(encoding="utf-8").splitlines()[:2000]]

    def best(fn) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    if args.side == "tk":
        from toolkit import Translator

        tr = Translator(args.model, runtime="ctranslate2")
        tr.translate(lines[:100], beam=args.beam)
        print(f"tk on ctranslate2, beam {args.beam}: {best(lambda: tr.translate(lines, beam=args.beam)):.2f} s")
        return
    from toolkit.bench.text import Ct2Text
    from toolkit.core.manifest import load
    from toolkit.runtimes.ctranslate2.engine import Ct2Translator
    from toolkit.runtimes.ctranslate2.spec import convert

    m = load(args.model)
    with tempfile.TemporaryDirectory() as work:
        convert(m, work)
        engine = Ct2Text(work, m.translation_tokenizer(), "float32", m.max_len)
        with Ct2Translator(work, "float32", 1, 2) as t:
            engine.translate(t, lines[:100], args.beam)
            print(f"ctranslate2 translate_batch, beam {args.beam}: {best(lambda: engine.translate(t, lines, args.beam)):.2f} s")


if __name__ == "__main__":
    main()
