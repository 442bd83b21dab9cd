"""CPU time of tk's API at one intra-op thread, where the session runs happen in the calling thread: one sentence per call
(or a file at --beam with --file), split into the encoder's runs, the decoder's runs and everything else (tk's Python).
Thread CPU time, not wall time: on a shared machine whose load moves by a factor of three between minutes, it still
compares two checkouts. Run two checkouts alternately, a few times each, and compare the medians:

    PYTHONPATH=CHECKOUT python docs/measurements/request_cpu.py --variant int8 [--file --beam 4]

It prints the median of --repeat passes and a digest of the translations (the same digest: the same output).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    from toolkit.bench.text import read_text
    from toolkit.deploy.api import Translator

    p = argparse.ArgumentParser()
    p.add_argument("--model", default=str(REPO / "exported" / "transformer"))
    p.add_argument("--text", default=str(REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt"))
    p.add_argument("--variant", default="fp32")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--file", action="store_true", help="the first 512 lines as one call (one stream) instead")
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    lines = read_text(Path(a.text))[0][: 512 if a.file else a.requests]
    tk = Translator(a.model, provider="cpu", variant=None if a.variant == "fp32" else a.variant, threads=1)
    tk.translate(["Hello.", "How are you?"], beam=a.beam)
    spent = {"encoder": 0.0, "decoder": 0.0}
    backend = tk._backend
    for name in spent:  # every run of the two sessions, timed where it happens
        native = getattr(backend, name)._sess

        class Timed:
            def __init__(self, inner, key: str):
                self.inner, self.key = inner, key

            def __getattr__(self, attr):
                return getattr(self.inner, attr)

            def run(self, *args):
                start = time.thread_time()
                try:
                    return self.inner.run(*args)
                finally:
                    spent[self.key] += time.thread_time() - start

        getattr(backend, name)._sess = Timed(native, name)
    backend._run_decoder = lambda names, feeds: backend.decoder._sess.run(names, feeds, None)
    passes = []
    for _ in range(a.repeat):
        spent.update(encoder=0.0, decoder=0.0)
        start = time.thread_time()
        out = tk.translate(lines, beam=a.beam, streams=1) if a.file else [tk.translate([s], beam=a.beam)[0] for s in lines]
        total = time.thread_time() - start
        passes.append((total, spent["encoder"], spent["decoder"]))
    total, encoder, decoder = (statistics.median(x) for x in zip(*passes))
    per, unit = (1.0, "s a file") if a.file else (1000 / len(lines), "ms a request")
    print(f"{a.variant} beam {a.beam}: {total * per:.3f} {unit} (encoder {encoder * per:.3f}, decoder {decoder * per:.3f}, "
          f"the rest {(total - encoder - decoder) * per:.3f}) {hashlib.md5(repr(out).encode()).hexdigest()[:8]}")


if __name__ == "__main__":
    main()
