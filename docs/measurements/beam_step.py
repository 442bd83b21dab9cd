"""A beam step's ranking and reorder: ONNX Runtime's TopK against tk's ranking kernel alone, and where a beam-search
file's time goes with the checkout's toolkit.

The ranking node alone: the k = 8 best of each row of log-probabilities over the shipped model's 6,000 ids (log-softmax
of random logits), one thread, microseconds a call (median of 5 passes), and whether both give the same values and ids.
The file: the first N Tatoeba Challenge sentences with `Translator.translate` on one stream and one thread (so each
part's time is its own), the search's parts timed around the backend's methods: the encoder, the decoder's runs, the
ranking, and the selects and beam reorders of the decoder's state.

    python docs/measurements/beam_step.py [--variant int8] [--beam 4] [--lines 2000]
    PYTHONPATH=OTHER_CHECKOUT python docs/measurements/beam_step.py    # the same on another tree
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
from attention_kernels import timed  # the same timing as the attention nodes': median of 5 passes, microseconds a call

REPO = Path(__file__).resolve().parents[2]


def ranking_alone() -> None:
    from toolkit.graphs.helper_graphs import top_k_graph
    from toolkit.runtimes.onnxruntime import native

    print(native.status())
    if "native" not in top_k_graph.__code__.co_varnames:
        print("(this checkout ranks on ONNX Runtime's TopK only)")
        return
    sessions = {}
    for kernel in (False, True):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        if kernel:
            native.register(options)
        sessions[kernel] = ort.InferenceSession(top_k_graph(native=kernel), options, providers=["CPUExecutionProvider"])
    print("| rows | ONNX Runtime TopK | tk TopK | ratio | same values and ids |\n| --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    for rows in (4, 64, 140, 256):
        logits = rng.standard_normal((rows, 6000)).astype(np.float32) * 3
        log_probs = (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(np.float32)
        feed = {"log_probs": log_probs, "k": np.array([8], dtype=np.int64)}
        want, got = sessions[False].run(None, feed), sessions[True].run(None, feed)
        same = np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1])
        plain, kernel = (timed(lambda s=sessions[k], f=feed: s.run(None, f)) for k in (False, True))
        print(f"| {rows} | {plain:.0f} us | {kernel:.0f} us | {plain / kernel:.2f}x | {same} |")


def file_parts(model: str, text: str, variant: str, beam: int, lines: int) -> None:
    import toolkit
    from toolkit import Translator
    from toolkit.runtimes.onnxruntime.backend import OrtBackend

    sources = [line.split("\t")[2] for line in Path(text).read_text(encoding="utf-8").splitlines()[:lines]]
    translator = Translator(model, variant=variant, threads=1)
    translator.translate(sources[:200], beam=beam, streams=1)
    spent: Counter = Counter()
    for name in ("encode", "_run_host", "step_top_k", "select", "reorder_beams"):
        method = getattr(OrtBackend, name)

        def wrapped(self, *args, _method=method, _name=name):
            start = time.perf_counter()
            try:
                return _method(self, *args)
            finally:
                spent[_name] += time.perf_counter() - start

        setattr(OrtBackend, name, wrapped)
    start = time.perf_counter()
    translator.translate(sources, beam=beam, streams=1)
    total = time.perf_counter() - start
    print(f"{variant} beam {beam}, {lines} lines, one stream, one thread ({Path(toolkit.__file__).parent}): {total:.3f} s; "
          f"encoder {spent['encode']:.3f} s, decoder runs {spent['_run_host']:.3f} s, "
          f"ranking {spent['step_top_k'] - spent['_run_host']:.3f} s, selects {spent['select']:.3f} s, "
          f"beam reorders {spent['reorder_beams']:.3f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "exported" / "transformer"))
    p.add_argument("--text", default=str(REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt"))
    p.add_argument("--variant", default="int8")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--lines", type=int, default=2000)
    args = p.parse_args()
    ranking_alone()
    file_parts(args.model, args.text, args.variant, args.beam, args.lines)


if __name__ == "__main__":
    main()
