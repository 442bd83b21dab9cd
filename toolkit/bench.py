"""`tk bench`: decoding speed of every backend, measured side by side in one run on the same sentences."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from toolkit.batching import DecodeOptions, decode_ids
from toolkit.decoding import Hypothesis, pad_batch
from toolkit.errors import ProviderError, first_line
from toolkit.tokenizer import BOS, EOS


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """Peak resident memory above the starting point, sampled every 2 ms while the block runs."""

    def __enter__(self):
        self.base = self.peak = rss_bytes()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.extra = max(self.peak - self.base, 0)


@torch.inference_mode()
def textbook_greedy(model, src: list[list[int]], max_len: int) -> list[Hypothesis]:
    """The textbook loop: every step re-runs the decoder over the whole prefix; finished rows keep computing."""
    ids, lens = pad_batch(src)
    cache = model.encode(torch.from_numpy(ids), torch.from_numpy(lens))
    prefix = torch.full((len(src), 1), BOS, dtype=torch.int64)
    finished = torch.zeros(len(src), dtype=torch.bool)
    for _ in range(max_len):
        nxt = model.decode_full(prefix, cache)[:, -1].argmax(-1)
        finished |= nxt == EOS
        prefix = torch.cat([prefix, nxt.unsqueeze(1)], dim=1)
        if finished.all():
            break
    out = []
    for row in prefix[:, 1:].tolist():
        out.append(Hypothesis(row[: row.index(EOS)] if EOS in row else row, 0.0))
    return out


@dataclass
class Result:
    backend: str
    search: str
    batch: int
    seconds: float
    sentences: int
    tokens: int
    peak_mib: float
    outputs: list[list[int]]


def run_interleaved(runs: list[tuple[str, str, int, Callable[[], list[list[int]]]]], sentences: int,
                    repeat: int) -> list[Result]:
    """Time each run `repeat` times, taking turns, and keep the median.

    Taking turns means a slow spell of the machine hits every backend alike, so
    the ratios between them stay fair even when absolute numbers drift.
    """
    for *_, fn in runs:
        fn()  # one warm-up pass so one-off allocations and kernel selection are not timed
    times: list[list[float]] = [[] for _ in runs]
    peaks = [0.0] * len(runs)
    outputs: list[list[list[int]]] = [[] for _ in runs]
    for _ in range(repeat):
        for i, (*_, fn) in enumerate(runs):
            with PeakMemory() as mem:
                start = time.perf_counter()
                outputs[i] = fn()
                times[i].append(time.perf_counter() - start)
            peaks[i] = max(peaks[i], mem.extra / 2**20)
    return [Result(name, search, batch, float(np.median(t)), sentences, sum(len(o) + 1 for o in out), peak, out)
            for (name, search, batch, _), t, peak, out in zip(runs, times, peaks, outputs)]


def bench(model_dir, sentences: int = 64, batch_sizes=(1, 64), beams=(1, 4), providers=("cpu", "cuda"),
          textbook: bool = True, repeat: int = 3, variants: list[str] | None = None, echo=print,
          runtimes: list[str] = ("onnxruntime",)) -> list[Result]:
    """`variants`: which graph variants to time on each runtime [default: see bench_variants].
    `runtimes`: onnxruntime (on every provider) and/or openvino (its CPU plugin), timed in the same turns."""
    from toolkit import manifest as manifest_mod
    from toolkit import runtime
    from toolkit.reference import load_reference
    from toolkit.tokenizer import Tokenizer
    from toolkit.torch_backend import TorchBackend
    from toolkit.verify import test_sentences

    m = manifest_mod.load(model_dir)
    entry, cfg, model, _ = load_reference(m)
    specs = m.specs()
    tokenizer = Tokenizer.load(m.tokenizer_path())
    english, origin = test_sentences(m, sentences)
    src = [s[: m.max_len] for s in tokenizer.encode(english)]
    echo(f"{len(src)} sentences from the {origin}; torch {torch.__version__} with {torch.get_num_threads()} threads; "
         f"median of {repeat} timed runs per row")
    backends = {"pytorch cached": TorchBackend(model, specs["encoder"], specs["decoder"])}
    for p in providers if "onnxruntime" in runtimes else ():
        for v in bench_variants(m, p, variants):
            try:
                loaded = runtime.load_sessions(m, p, v)
            except Exception as e:  # a provider that cannot load is reported, not fatal
                echo(f"skipping onnxruntime {p} {v}: {first_line(e)}")
                if isinstance(e, ProviderError):
                    break
                continue
            if loaded.built_s:
                echo(f"onnxruntime {p} {v}: graphs built in memory from the fp32 graphs in {loaded.built_s:.2f}s")
            backends[f"onnxruntime {p}" + ("" if v == "fp32" else f" {v}")] = loaded.backend()
    if "openvino" in runtimes:
        from toolkit.runtimes import openvino

        echo(f"openvino {openvino.version()} on its CPU plugin")
        for v in bench_variants(m, "cpu", variants):
            try:
                loaded = openvino.load(m, "cpu", v)
            except Exception as e:  # a variant OpenVINO cannot compile is reported, not fatal
                echo(f"skipping openvino cpu {v}: {str(e).splitlines()[0]}")
                continue
            backends["openvino cpu" + ("" if v == "fp32" else f" {v}")] = loaded.backend()
    results = []
    for batch in batch_sizes:
        for beam in beams:
            search = "greedy" if beam == 1 else f"beam {beam}"
            runs = []
            if textbook and beam == 1 and hasattr(model, "decode_full"):
                fn = lambda b=batch: [h.tokens for i in range(0, len(src), b) for h in textbook_greedy(model, src[i : i + b], m.max_len)]
                runs.append(("pytorch textbook (full prefix)", search, batch, fn))
            for name, backend in backends.items():
                opts = DecodeOptions(beam=beam, batch_size=batch, max_len=m.max_len)
                fn = lambda be=backend, o=opts: [h[0].tokens for h in decode_ids(be, src, o)]
                runs.append((name, search, batch, fn))
            for r in run_interleaved(runs, len(src), repeat):
                results.append(r)
                echo(_line(r))
    return results




def bench_variants(m, provider: str, wanted: list[str] | None) -> list[str]:
    """fp32, every variant the directory stores for the provider, and its speed variant; or `wanted`."""
    if wanted is not None:
        return list(wanted)
    from toolkit.variants import PLAIN, SPEED

    # The speed variant is built from the fp32 graphs at load time when the directory does not store it.
    stored = [v for v in m.variants_for(provider) if v != PLAIN]
    return [PLAIN, *stored, *([SPEED[provider]] if SPEED[provider] not in stored else [])]


def _line(r: Result) -> str:
    return f"  {r.backend:<32} {r.search:<7} batch {r.batch:>3}: {r.sentences / r.seconds:8.1f} sent/s"


def table(results: list[Result]) -> str:
    """Sentences/s, tokens/s, speed-up against the textbook loop at batch 1 and against PyTorch cached at the same settings."""
    base = next((r for r in results if r.backend.startswith("pytorch textbook") and r.batch == 1), results[0])
    cached = {(r.search, r.batch): r for r in results if r.backend == "pytorch cached"}
    header = (f"{'backend':<32} {'search':<7} {'batch':>5} {'sent/s':>8} {'tok/s':>8} {'vs textbook b1':>14} "
              f"{'vs torch cached':>15} {'peak MiB':>8} {'same output':>11}")
    lines = [header, "-" * len(header)]
    for r in results:
        ref = cached.get((r.search, r.batch))
        same = "" if ref is None else f"{np.mean([a == b for a, b in zip(r.outputs, ref.outputs)]):.0%}"
        vs_cached = f"{ref.seconds / r.seconds:.2f}x" if ref else ""
        lines.append(f"{r.backend:<32} {r.search:<7} {r.batch:>5} {r.sentences / r.seconds:>8.1f} {r.tokens / r.seconds:>8.0f} "
                     f"{base.seconds / r.seconds:>13.1f}x {vs_cached:>15} {r.peak_mib:>8.1f} {same:>11}")
    return "\n".join(lines)
