"""tk against CTranslate2 on one core: a file of Tatoeba Challenge lines translated by tk's API on one ONNX Runtime
thread and one stream, and by CTranslate2's translate_batch on one thread (intra 1 x inter 1), each timed by the CPU
time of the process, best of --repeat. It tells how much of the file rows' gap in `tk bench --text` (two cores: tk's
two streams against CTranslate2's two inter threads) is each engine's work on a core, and how much is the two cores.

    python docs/measurements/per_core.py [--model exported/transformer] [--lines 512] [--repeat 3]
    python docs/measurements/per_core.py --lines 1024 --tk-batch-sizes 16,32,64,128   # tk alone, at each batch size
    python docs/measurements/per_core.py --lines 2000 --tk-batch-sizes 32,64 --streams 2   # wall time, two streams

CTranslate2 reads the model as tk bench --text converts it (in a temporary directory), in batches of 64
sentences as tk bench gives it; tk decodes with its defaults (batches of 64 greedy, 32 at beam 4).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def best_cpu(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=REPO / "exported" / "transformer")
    p.add_argument("--text", type=Path, default=REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt")
    p.add_argument("--lines", type=int, default=512)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tk-batch-sizes", help="instead: tk alone at each of these batch sizes (comma-separated)")
    p.add_argument("--streams", type=int, default=1, help="with --tk-batch-sizes: tk's streams of one thread each; "
                   "above 1, the median wall time of --repeat runs taken in turns instead of CPU time")
    a = p.parse_args()

    from toolkit.bench.text import FILE_BATCH, read_text
    from toolkit.core.manifest import load
    from toolkit.core.tokenizers import open_tokenizer
    from toolkit.deploy.api import Translator
    from toolkit.runtimes.ctranslate2.engine import Ct2Translator
    from toolkit.runtimes.ctranslate2.spec import convert

    lines = read_text(a.text)[0][: a.lines]
    if a.tk_batch_sizes:
        sizes = [int(x) for x in a.tk_batch_sizes.split(",")]
        for variant in ("fp32", "int8"):
            translator = Translator(a.model, provider="cpu", variant=None if variant == "fp32" else variant, threads=1)
            for beam in (1, 4):
                translator.translate(lines[:32], beam=beam, streams=a.streams)
                runs = {n: (lambda tr=translator, b=beam, n=n: tr.translate(lines, beam=b, streams=a.streams, batch_size=n)) for n in sizes}
                if a.streams == 1:
                    seconds = {n: best_cpu(run, a.repeat) for n, run in runs.items()}
                else:
                    walls: dict[int, list[float]] = {n: [] for n in sizes}
                    for _ in range(a.repeat):
                        for n, run in runs.items():
                            start = time.perf_counter()
                            run()
                            walls[n].append(time.perf_counter() - start)
                    seconds = {n: statistics.median(w) for n, w in walls.items()}
                search = "greedy" if beam == 1 else f"beam {beam}"
                print(f"  {variant} {search}, {a.streams} stream(s): " + ", ".join(f"batches of {n} {s:.3f} s" for n, s in seconds.items()),
                      flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        m = load(a.model)
        ct2_dir = convert(m, Path(tmp) / "ct2")  # as tk bench --text converts it, in CTranslate2's own file names
        tokenizer = open_tokenizer(m)
        src = [s[: m.max_len] for s in tokenizer.encode(lines)]
        print(f"{len(lines)} lines, CPU seconds of one core, best of {a.repeat}:")
        for variant, compute in (("fp32", "float32"), ("int8", "int8")):
            translator = Translator(a.model, provider="cpu", variant=None if variant == "fp32" else variant, threads=1)
            with Ct2Translator(str(ct2_dir), compute, 1, 1) as ct2:
                for beam in (1, 4):
                    translator.translate(lines[:32], beam=beam, streams=1)
                    ct2.translate_ids(src[:32], beam, m.max_len, FILE_BATCH)
                    tk_s = best_cpu(lambda tr=translator, b=beam: tr.translate(lines, beam=b, streams=1), a.repeat)
                    ct2_s = best_cpu(lambda b=beam: ct2.translate_ids(src, b, m.max_len, FILE_BATCH), a.repeat)
                    search = "greedy" if beam == 1 else f"beam {beam}"
                    print(f"  {variant} {search}: tk {tk_s:.3f} s (text in, text out), CTranslate2 {ct2_s:.3f} s (ids in, ids out): "
                          f"tk/CT2 speed {ct2_s / tk_s:.2f}", flush=True)


if __name__ == "__main__":
    main()
