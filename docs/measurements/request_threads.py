"""Wall time of tk's API one sentence per call, the decoder on tk's default threads for a single request against one
thread: the measurement behind batching.SMALL_INT8_WEIGHTS.

    python docs/measurements/request_threads.py [--variant int8|fp32] [--beam 4] [--model DIR] [--only every|one]

fp32 is tk's default graphs (the optimized ones on CPU). It prints the median of --repeat passes over --requests
Tatoeba Challenge sentences for each setting, passes of the two taken in turns, and whether both gave the same text.
Run it on a quiet machine: spinning threads lose a busy machine's cores. Two spinning threads can run at one speed in
one process and another in the next (where the OS puts them): to see that, run `--only every` and `--only one` in
turns, each a process of its own.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    from toolkit.bench.text import read_text
    from toolkit.core.batching import default_request_threads
    from toolkit.core.manifest import load
    from toolkit.deploy.api import Translator
    from toolkit.runtimes.onnxruntime.runtime import weights_bytes

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "exported" / "transformer"))
    p.add_argument("--text", default=str(REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt"))
    p.add_argument("--variant", default="int8")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", choices=["every", "one"], help="time one setting only, in this process")
    a = p.parse_args()
    lines = read_text(Path(a.text))[0][: a.requests]
    variant = None if a.variant == "fp32" else a.variant
    weights = weights_bytes(load(a.model)) // 4
    every = default_request_threads("fp32", weights)
    translators = {}
    if a.only != "one":
        translators[f"every core ({every}), spinning"] = _every_core(a.model, variant)
    if a.only != "every":
        translators["one thread"] = Translator(a.model, provider="cpu", variant=variant, threads=1)
    default = default_request_threads(variant or "optimized", weights)
    print(f"tk's default for this model and variant: {'one thread' if default == 1 else f'every core ({default}), spinning'}")
    outputs: dict[str, list[str]] = {}
    seconds: dict[str, list[float]] = {name: [] for name in translators}
    for t in translators.values():
        t.translate(["Hello."], beam=a.beam)
    for _ in range(a.repeat):
        for name, t in translators.items():
            start = time.perf_counter()
            outputs[name] = [t.translate([s], beam=a.beam)[0] for s in lines]
            seconds[name].append(time.perf_counter() - start)
    print(f"{a.variant}, beam {a.beam}, {weights / 1e6:.1f}M weights, {len(lines)} sentences one per call:")
    for name, s in seconds.items():
        print(f"  {name:<28} {1000 * statistics.median(s) / len(lines):6.2f} ms a request")
    print(f"  same translations: {len({tuple(o) for o in outputs.values()}) == 1}")


def _every_core(model: str, variant: str | None):
    """A Translator whose single requests decode on every core (up to 4) whatever the variant and size: tk's rule for
    every model before SMALL_INT8_WEIGHTS, and still for the float graphs and large models."""
    from toolkit.core import batching
    from toolkit.deploy.api import Translator

    kept, batching.SMALL_INT8_WEIGHTS = batching.SMALL_INT8_WEIGHTS, 0
    try:
        return Translator(model, provider="cpu", variant=variant)
    finally:
        batching.SMALL_INT8_WEIGHTS = kept


if __name__ == "__main__":
    main()
