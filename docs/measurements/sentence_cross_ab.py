"""The decoder with its cross-attention per sentence (toolkit/graphs/sentence_cross.py) against the same graph as
exported, in one process, in turns: the second batch of 16 of `tk bench --scale opus-mt --sources`'s real beam-4 row
(the longer sentences), decoded at beam 4 to exactly 32 tokens on one thread; each decoder's times, the ratio of the
medians after the first round, and whether the tokens are identical.

    python docs/measurements/sentence_cross_ab.py [--variant optimized|int8] [--rounds 5] [--model DIR] [--sources FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    sys.path.insert(0, str(REPO))
    from toolkit.bench.scale import real_sources
    from toolkit.core import manifest
    from toolkit.core.batching import DecodeOptions, decode_ids
    from toolkit.core.load_cache import default_directory
    from toolkit.graphs.sentence_cross import cross_per_sentence
    from toolkit.graphs.variants import graph_source
    from toolkit.runtimes.onnxruntime.backend import OrtBackend
    from toolkit.runtimes.onnxruntime.sessions import create_session

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=["optimized", "int8"], default="optimized")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", type=Path, default=default_directory() / "bench-scale" / "opus-mt" / "tk")
    parser.add_argument("--sources", type=Path, default=REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt")
    args = parser.parse_args()
    m = manifest.load(args.model)
    specs = m.specs()
    encoder = create_session(graph_source(m, "encoder", args.variant)[0], threads=1)
    graph = graph_source(m, "decoder", args.variant)[0]
    regrouped = cross_per_sentence(graph, specs["decoder"].constant_inputs)
    backends = {"as exported": OrtBackend(encoder, create_session(graph, threads=1), specs["encoder"], specs["decoder"]),
                "per sentence": OrtBackend(encoder, create_session(regrouped, threads=1), specs["encoder"], specs["decoder"])}
    src = sorted(real_sources(args.sources, 32, args.model), key=len)[16:]
    opts = DecodeOptions.bare(beam=4, batch_size=16, max_len=32, streams=1, rules=dataclasses.replace(m.rules(), forced_first=None))
    seconds: dict[str, list[float]] = {name: [] for name in backends}
    tokens: dict[str, list] = {}
    for r in range(args.rounds):
        for name in (list(backends) if r % 2 == 0 else list(backends)[::-1]):
            start = time.perf_counter()
            tokens[name] = [h[0].tokens for h in decode_ids(backends[name], src, opts)]
            seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(v[1:]) for name, v in seconds.items()}
    print(f"{args.variant}: " + "; ".join(f"{n} {', '.join(f'{s:.2f}' for s in v)} s" for n, v in seconds.items())
          + f"; as exported / per sentence {median['as exported'] / median['per sentence']:.3f}x, tokens "
          + ("identical" if tokens["as exported"] == tokens["per sentence"] else "DIFFER"))


if __name__ == "__main__":
    main()
