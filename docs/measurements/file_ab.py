"""Wall seconds of one checkout's `Translator.translate` on a file of Tatoeba Challenge lines with tk's defaults (two
streams on 2 cores), the median of --repeat after a warm-up. Two checkouts compare when run alternately, each in a
process of its own, a few pairs, and the pairs' medians compared (a quiet machine's runs still drift by 5 to 10%):

    for i in 1 2 3 4 5 6; do
        PYTHONPATH=BEFORE python docs/measurements/file_ab.py --variant int8
        PYTHONPATH=AFTER python docs/measurements/file_ab.py --variant int8
    done

The toolkit imported is the one PYTHONPATH names (it prints its path), the model and lines the same for both.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "exported" / "transformer"))
    p.add_argument("--text", default=str(REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt"))
    p.add_argument("--variant", default="fp32")
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--lines", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    import toolkit
    from toolkit.bench.text import read_text
    from toolkit.deploy.api import Translator

    lines = read_text(Path(a.text))[0][: a.lines]
    translator = Translator(a.model, variant=None if a.variant == "fp32" else a.variant)
    translator.translate(lines[:300], beam=a.beam)
    walls = []
    for _ in range(a.repeat):
        start = time.perf_counter()
        translator.translate(lines, beam=a.beam)
        walls.append(time.perf_counter() - start)
    print(f"{statistics.median(walls):.4f} s  {a.variant} beam {a.beam}, {len(lines)} lines  ({Path(toolkit.__file__).parent})")


if __name__ == "__main__":
    main()
