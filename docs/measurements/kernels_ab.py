"""A file translated with tk's attention kernels and without them, in one process, in turns.

Two Translators of the same model and variant, one loaded with the kernels and one as if they could not be built
(ONNX Runtime's MultiHeadAttention), each with its stream sessions made before the other is loaded; the first N
Tatoeba Challenge sentences, text in and text out with tk's defaults, timed alternately (the order flipped every
round), median of the rounds and each round's ratio.

    python docs/measurements/kernels_ab.py --variant int8 --beam 1 --lines 2000 --rounds 8 [--model DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> None:
    from toolkit import Translator
    from toolkit.runtimes.onnxruntime import native

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="int8")
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--model", type=Path, default=REPO / "exported" / "transformer")
    parser.add_argument("--sources", type=Path, default=REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt")
    args = parser.parse_args()
    src = [line.split("\t")[2] for line in args.sources.read_text(encoding="utf-8").splitlines()[: args.lines]]
    print(native.status())
    on = Translator(args.model, provider="cpu", variant=args.variant)
    on.translate(src[:300], beam=args.beam)  # its stream sessions, made while the kernels are there
    native._built = (None, "turned off for the comparison")
    off = Translator(args.model, provider="cpu", variant=args.variant)
    off.translate(src[:300], beam=args.beam)
    spent: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(args.rounds):
        for name, t in ((("off", off), ("on", on)) if r % 2 == 0 else (("on", on), ("off", off))):
            start = time.perf_counter()
            t.translate(src, beam=args.beam)
            spent[name].append(time.perf_counter() - start)
    m = {k: statistics.median(v) for k, v in spent.items()}
    same = sum(a == b for a, b in zip(on.translate(src, beam=args.beam), off.translate(src, beam=args.beam)))
    print(f"{args.variant}, beam {args.beam}, {len(src)} lines: without {m['off']:.3f} s, with {m['on']:.3f} s, "
          f"with/without {m['on'] / m['off']:.3f}; per round {[round(a / b, 3) for a, b in zip(spent['on'], spent['off'])]}; "
          f"{same} of {len(src)} translations identical")


if __name__ == "__main__":
    main()
