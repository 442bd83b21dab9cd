"""`tk bench`: decoding speed of every backend, measured side by side in one run on the same sentences."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from toolkit.bench.text import timed
from toolkit.core import architectures
from toolkit.core.batching import DecodeOptions, decode_ids
from toolkit.core.declaration import TK
from toolkit.core.decode_options import cores
from toolkit.core.decoding import Hypothesis, pad_batch
from toolkit.core.engines import PROVIDERS
from toolkit.core.errors import ProviderError, UsageError, first_line
from toolkit.core.tokenizer import BOS, EOS
from toolkit.core.tokenizers import open_tokenizer
from toolkit.runtimes import registry
from toolkit.runtimes.ctranslate2.engine import fastest, thread_candidates


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
    ct2_backend: dict | None = None  # on CTranslate2's rows: its CPU backend (engine.choose_gemm)


def run_interleaved(runs: list[tuple[str, str, int, Callable[[], list[list[int]]]]], sentences: int,
                    repeat: int) -> list[Result]:
    """Time each run `repeat` times, taking turns, and keep the median.

    Taking turns means a slow spell of the machine hits every backend alike, so
    the ratios between them stay fair even when absolute numbers drift.
    A run's function may carry a `loaded` context manager factory (CTranslate2): it is entered,
    untimed, around each of that run's passes, so only one such engine is alive at a time.
    """
    for *_, fn in runs:
        with getattr(fn, "loaded", nullcontext)():
            fn()  # one warm-up pass so one-off allocations and kernel selection are not timed
    times: list[list[float]] = [[] for _ in runs]
    peaks = [0.0] * len(runs)
    outputs: list[list[list[int]]] = [[] for _ in runs]
    for _ in range(repeat):
        for i, (*_, fn) in enumerate(runs):
            with getattr(fn, "loaded", nullcontext)(), PeakMemory() as mem:
                start = time.perf_counter()
                outputs[i] = fn()
                times[i].append(time.perf_counter() - start)
            peaks[i] = max(peaks[i], mem.extra / 2**20)
    return [Result(name, search, batch, float(np.median(t)), sentences, sum(len(o) + 1 for o in out), peak, out)
            for (name, search, batch, _), t, peak, out in zip(runs, times, peaks, outputs)]


# Over 60 lines: the rows of one run are timed in turns (run_interleaved) so every backend must be loaded here
# first; the loading, the settings search and the CTranslate2 conversion are helpers.
def bench(model_dir, sentences: int = 64, batch_sizes=(1, 64), beams=(1, 4), providers=PROVIDERS,
          textbook: bool = True, repeat: int = 3, variants: list[str] | None = None, echo=print,
          runtimes: list[str] = (registry.DEFAULT,), threads: int | None = None, ct2: bool | None = None,
          ct2_threads: tuple[int, int] | None = None, notes: list[str] | None = None, streams: int | None = None,
          data: str | None = None, ct2_backend: str = "auto") -> list[Result]:
    """`variants`: which graph variants to time on each runtime [default: see bench_variants].

    `runtimes`: the registered runtimes that read the graphs (onnxruntime on every provider, openvino on its CPU
    plugin), each on the providers it declares, timed in the same turns.
    `threads`, `streams`: the default runtime's intra-op threads and concurrent decoding streams (None for
    both: the fastest pair measured here, from the same candidates as CTranslate2's intra/inter), which every
    runtime whose backends decode streams side by side (RuntimeSpec.streams) runs with.
    `ct2`: add CTranslate2 float32 and int8 rows (None: when ctranslate2 is installed and the
    model is a post-LN Transformer); `ct2_threads`: its (intra, inter) threads (None: measured); `ct2_backend`: its
    CPU backend for the run (auto: the faster in a probe over float32 and int8; engine.choose_gemm).
    `notes`: receives the roofline line (achieved GFLOP/s of fp32 greedy at the largest batch against sgemm peak).
    """
    from toolkit.core import manifest as manifest_mod
    from toolkit.pytorch.reference import load_reference
    from toolkit.pytorch.torch_backend import TorchBackend
    from toolkit.runtimes.ctranslate2 import engine as ct2_engine
    from toolkit.runtimes.ctranslate2.spec import convert
    from toolkit.verify.checks import held_out_sentences

    m = manifest_mod.load(model_dir)
    tokenizer_path = m.translation_tokenizer()  # before the reference is built: bench times translation models only
    entry, cfg, model, _ = load_reference(m)
    specs = m.specs()
    tokenizer = open_tokenizer(m) if tokenizer_path else None
    english, origin = held_out_sentences(sentences, data)
    src = [s[: m.max_len] for s in tokenizer.encode(english)]
    echo(f"{len(src)} sentences from the {origin}; torch {torch.__version__} with {torch.get_num_threads()} threads; "
         f"median of {repeat} timed runs per row")
    ran = sorted({min(b, len(src)) for b in batch_sizes})
    if ran != sorted(set(batch_sizes)):
        # A batch larger than the sentences decoded would be timed as a smaller one: report what runs.
        echo(f"batch sizes {', '.join(map(str, sorted(set(batch_sizes))))} run as {', '.join(map(str, ran))}: "
             f"only {len(src)} sentences (--sentences, --data)")
    batch_sizes = ran
    # PyTorch through the same loop on each device timed: ONNX Runtime on CUDA is compared with PyTorch on CUDA.
    chosen = [registry.get(r) for r in runtimes]
    devices = [p for p in dict.fromkeys(providers) if p == "cpu" or (torch.cuda.is_available() and any(p in s.providers for s in chosen))]
    if "cuda" in providers and "cuda" not in devices:
        echo("pytorch cached cuda: skipped, this torch build sees no CUDA device")
    backends = {torch_row(p): TorchBackend(model, specs["encoder"], specs["decoder"], device=p) for p in devices or ["cpu"]}
    loads: dict[tuple, object] = {}

    def load(p: str, v: str, t: int | None, name: str = registry.DEFAULT):
        if (name, p, v, t) not in loads:
            loads[name, p, v, t] = registry.load(m, name, p, v, threads=t)
        return loads[name, p, v, t]

    given = (threads or max(1, cores() // (streams or 1)), streams or 1) if threads or streams else None
    tk_setting = best_settings(batch_sizes, given, lambda c, b: _time_tk(
        load("cpu", "fp32", c[0]).backend(), src[: probe_size(b)], [b], m.max_len, c[1]))
    echo(f"{registry.DEFAULT}: " + describe_settings(tk_setting, "intra-op threads", "decoding streams")
         + f" ({'given' if given else 'the fastest measured'}; --threads and --streams set them)")
    if ct2 is None:
        ct2 = ct2_engine.available() and own_transformer(m) and not m.config.get("pre_ln")
    ct2_dir = None
    if ct2:
        if not ct2_engine.available():
            raise UsageError(f"--ct2 needs ctranslate2; {ct2_engine.INSTALL_HINT}")
        ct2_dir = tempfile.TemporaryDirectory(prefix="tk-ct2-")
        convert(m, ct2_dir.name)
        gemm = ct2_engine.choose_gemm(ct2_dir.name, ["float32", "int8"], ct2_backend)
        echo(ct2_engine.describe_gemm(gemm))
        gemm_env = ct2_engine.gemm_environment(gemm["backend"])  # before its first load here, to the end of the run
        gemm_env.__enter__()
        ct2_setting = best_settings(batch_sizes, ct2_threads, lambda c, b: _time_ct2(
            ct2_dir.name, c, src[: probe_size(b)], [b], m.max_len))
        ct2_gemm = ct2_engine.gemm_backends(ct2_dir.name) or "backend not reported"  # MKL or oneDNN, as it says itself
        echo(f"ctranslate2 {ct2_engine.version()} ({ct2_gemm}): " + describe_settings(ct2_setting, "intra_threads", "inter_threads")
             + f" ({'given' if ct2_threads else 'the fastest measured'}; --ct2-threads sets them)")
    ort_backends: dict[str, dict[int, object]] = {}  # name -> intra-op threads -> backend
    for spec in chosen:
        _load_rows(spec, m, [p for p in providers if p in spec.providers], variants, sorted({t for t, _ in tk_setting.values()}),
                   load, ort_backends if spec.streams else backends, echo)
    results = []
    for batch in batch_sizes:
        for beam in beams:
            search = "greedy" if beam == 1 else f"beam {beam}"
            runs = []
            if textbook and beam == 1 and hasattr(model, "decode_full"):
                fn = lambda b=batch: [h.tokens for i in range(0, len(src), b) for h in textbook_greedy(model, src[i : i + b], m.max_len)]
                runs.append(("pytorch textbook (full prefix)", search, batch, fn))
            t, n_streams = tk_setting[batch]
            torch_rows = [(n, b, 1) for n, b in backends.items() if n.startswith("pytorch cached")]
            others = [(n, b, 1) for n, b in backends.items() if not n.startswith("pytorch cached")]
            for name, backend, k in [*torch_rows, *[(n, b[t], n_streams) for n, b in ort_backends.items()], *others]:
                opts = DecodeOptions.bare(beam=beam, batch_size=batch, max_len=m.max_output_len, streams=k, rules=m.rules())
                fn = lambda be=backend, o=opts: [h[0].tokens for h in decode_ids(be, src, o)]
                runs.append((name, search, batch, fn))
            if ct2_dir is not None:
                for compute_type in ("float32", "int8"):
                    runs.append((f"ctranslate2 {compute_type}", search, batch,
                                 Ct2Run(ct2_dir.name, compute_type, ct2_setting[batch], src, beam, batch, m.max_len)))
            for r in run_interleaved(runs, len(src), repeat):
                results.append(r)
                echo(_line(r))
    if ct2_dir is not None:
        ct2_dir.cleanup()
        gemm_env.__exit__(None, None, None)
        for r in results:
            if r.backend.startswith(ct2_engine.RUNTIME):  # its own rows and tk's on it (--runtime ctranslate2)
                r.ct2_backend = gemm
    row = next((r for r in results if r.backend == f"{registry.DEFAULT} cpu" and r.search == "greedy" and r.batch == max(batch_sizes)), None)
    if notes is not None and row is not None and own_transformer(m):
        per_src, per_tgt = matmul_flops_per_token(m.config)
        flops = per_src * sum(len(s) for s in src) + per_tgt * row.tokens
        peak = sgemm_peak_gflops()
        notes.append(f"roofline: onnxruntime cpu fp32 greedy at batch {row.batch}: {flops / row.seconds / 1e9:.1f} GFLOP/s "
                     f"({per_tgt / 1e6:.2f} MFLOP per target token, {per_src / 1e6:.2f} per source token, matrix multiplies only) "
                     f"against a measured sgemm peak of {peak:.1f} GFLOP/s: {flops / row.seconds / 1e9 / peak:.1%}")
    return results


def _load_rows(spec: registry.RuntimeSpec, m, providers: list[str], variants: list[str] | None, threads: list[int], load,
               rows: dict, echo) -> None:
    """Backends for each (provider, variant) row of one runtime, into `rows`: per intra-op thread count for a
    runtime whose backends decode streams side by side, one (its own threads) for another. A provider that cannot
    load, or a variant the runtime cannot compile, is reported, not fatal."""
    if not spec.streams:
        echo(f"{spec.label()} on {', '.join(providers)}")
    for p in providers:
        for v in bench_variants(m, p, variants):
            name = f"{spec.name} {p}" + ("" if v == "fp32" else f" {v}")
            try:
                for t in threads if spec.streams else [None]:
                    loaded = load(p, v, t, spec.name)
                    backend = loaded.backend()
                    if spec.streams:
                        rows.setdefault(name, {})[t] = backend
                    else:
                        rows[name] = backend
            except Exception as e:
                echo(f"skipping {spec.name} {p} {v}: {first_line(e)}")
                rows.pop(name, None)
                if isinstance(e, ProviderError):
                    break
                continue
            if loaded.built_s:
                echo(f"{spec.name} {p} {v}: graphs built in memory from the fp32 graphs in {loaded.built_s:.2f}s")


def own_transformer(m) -> bool:
    """Whether the model is tk's own Transformer: the entry of tk's training that CTranslate2 runs (the one the
    FLOPs count below and CTranslate2's default place in the bench are for)."""
    from toolkit.runtimes.ctranslate2.runtime import RUNTIME as CT2

    arch = architectures.ARCHITECTURES.get(m.model)
    return arch is not None and arch.origin == TK and arch.supports(CT2.name)


def matmul_flops_per_token(cfg: dict) -> tuple[float, float]:
    """Multiply-add FLOPs of the weight matrices per source and per target token (attention scores left out)."""
    from toolkit.core.declaration import transformer_layers

    d, ff, vocab = cfg["num_hiddens"], cfg["ffn_num_hiddens"], cfg["vocab_size"]
    encoder, decoder = transformer_layers(cfg)
    ffn = 2 * 2 * d * ff
    # Source: encoder Q, K, V, O and FFN, plus each decoder layer's cross-attention K and V.
    per_src = encoder * (2 * 4 * d * d + ffn) + decoder * 2 * 2 * d * d
    # Target: self-attention Q, K, V, O, cross-attention Q and O, FFN, and the output projection.
    per_tgt = decoder * (2 * 6 * d * d + ffn) + 2 * d * vocab
    return float(per_src), float(per_tgt)


def sgemm_peak_gflops(n: int = 1024, repeat: int = 5) -> float:
    """Best float32 GEMM rate of this machine (numpy's BLAS, all cores), measured now."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = min(timed(lambda: a @ a) for _ in range(repeat))
    return 2 * n**3 / best / 1e9


class Ct2Run:
    """One CTranslate2 row: the translator is loaded (untimed) around each pass, so that only
    one is alive at a time; two alive at once slow it 2 to 5x on 2 cores (see ct2_engine)."""

    def __init__(self, model_dir: str, compute_type: str, threads: tuple[int, int], src: list[list[int]],
                 beam: int, batch: int, max_len: int):
        self.model_dir, self.compute_type, self.threads = model_dir, compute_type, threads
        self.src, self.beam, self.batch, self.max_len = src, beam, batch, max_len
        self.translator = None

    @contextmanager
    def loaded(self):
        from toolkit.runtimes.ctranslate2.engine import Ct2Translator

        with Ct2Translator(self.model_dir, self.compute_type, *self.threads) as tr:
            tr.translate_ids(self.src[:4], self.beam, self.max_len, self.batch)  # first-call allocations
            self.translator = tr
            try:
                yield
            finally:
                self.translator = None

    def __call__(self) -> list[list[int]]:
        return self.translator.translate_ids(self.src, self.beam, self.max_len, self.batch)


def probe_size(batch: int) -> int:
    """Sentences timed to choose a batch size's threads: at least two batches, so that
    concurrent streams have something to run side by side."""
    return max(32, 2 * batch)


def best_settings(batch_sizes, given: tuple[int, int] | None,
                  seconds: Callable[[tuple[int, int], int], float]) -> dict[int, tuple[int, int]]:
    """(intra, inter) threads for each batch size: the given pair, else the fastest candidate
    measured at that batch size (one core per stream pays at batch 1, all cores in one batch at 64)."""
    if given:
        return {b: tuple(given) for b in batch_sizes}
    return {b: fastest(thread_candidates(), lambda c, b=b: seconds(c, b)) for b in batch_sizes}


def describe_settings(settings: dict[int, tuple[int, int]], intra: str, inter: str) -> str:
    return "; ".join(f"batch {b}: {i} {intra} x {k} {inter}" for b, (i, k) in settings.items())


def _time_tk(backend, src: list[list[int]], batch_sizes, max_len: int, streams: int = 1) -> float:
    start = time.perf_counter()
    for b in batch_sizes:
        decode_ids(backend, src, DecodeOptions.bare(beam=1, batch_size=b, max_len=max_len, streams=streams))
    return time.perf_counter() - start


def _time_ct2(model_dir: str, threads: tuple[int, int], src: list[list[int]], batch_sizes, max_len: int) -> float:
    from toolkit.runtimes.ctranslate2.engine import Ct2Translator

    with Ct2Translator(model_dir, "float32", *threads) as tr:
        tr.translate_ids(src[:4], 1, max_len, 1)
        start = time.perf_counter()
        for b in batch_sizes:
            tr.translate_ids(src, 1, max_len, b)
        return time.perf_counter() - start


def ct2_table(results: list[Result]) -> str:
    """CTranslate2 against tk's ONNX Runtime CPU rows, fp32 with float32 and int8 with int8: sentences/s and ratios
    ("": no pair of rows to compare). tk's fp32 column is the faster of its exported and offline-optimised graphs (both
    float32), named in `graph`."""
    from toolkit.core.variants import FAST_PLAIN

    rate = {(r.backend, r.search, r.batch): r.sentences / r.seconds for r in results}
    outs = {(r.backend, r.search, r.batch): r.outputs for r in results}
    header = (f"{'search':<7} {'batch':>5} {'tk fp32':>8} {'graph':>9} {'ct2 float32':>11} {'CT2/tk':>6} {'tk int8':>8} "
              f"{'ct2 int8':>8} {'CT2/tk':>6} {'same as tk fp32':>15}")
    lines = [header, "-" * len(header)]
    fast = f"onnxruntime cpu {FAST_PLAIN['cpu']}"
    for search, batch in dict.fromkeys((r.search, r.batch) for r in results):
        graph = "exported"
        tk32, c32 = rate.get(("onnxruntime cpu", search, batch)), rate.get(("ctranslate2 float32", search, batch))
        if tk32 is not None and rate.get((fast, search, batch), 0) > tk32:
            tk32, graph = rate[fast, search, batch], FAST_PLAIN["cpu"]
        tk8, c8 = rate.get(("onnxruntime cpu int8", search, batch)), rate.get(("ctranslate2 int8", search, batch))
        if tk32 is None or c32 is None:
            continue
        same = np.mean([a == b for a, b in zip(outs[("onnxruntime cpu", search, batch)], outs[("ctranslate2 float32", search, batch)])])
        ratio8 = f"{c8 / tk8:.2f}" if tk8 and c8 else ""
        lines.append(f"{search:<7} {batch:>5} {tk32:>8.1f} {graph:>9} {c32:>11.1f} {c32 / tk32:>6.2f} {tk8 or 0:>8.1f} {c8 or 0:>8.1f} "
                     f"{ratio8:>6} {same:>15.0%}")
    return "\n".join(lines) if len(lines) > 2 else ""


def bench_variants(m, provider: str, wanted: list[str] | None) -> list[str]:
    """fp32, the provider's fastest fp32-precision and speed variants, and every variant the directory stores for it; or `wanted`."""
    if wanted is not None:
        return list(wanted)
    from toolkit.core.architectures import ARCHITECTURES
    from toolkit.core.variants import FAST_PLAIN, PLAIN, SPEED

    # The fast variants are built from the fp32 graphs at load time when the directory does not store them; a variant
    # the architecture refuses (T5 in float16) is left out of the default set (asked for by name, it is refused).
    refused = ARCHITECTURES[m.model].refused_variants if m.model in ARCHITECTURES else {}
    return [v for v in dict.fromkeys([PLAIN, FAST_PLAIN[provider], *m.variants_for(provider), SPEED[provider]]) if v not in refused]


def torch_row(provider: str) -> str:
    """The PyTorch row that a provider's rows are compared with: the same model on the same device."""
    return "pytorch cached" + ("" if provider == "cpu" else f" {provider}")


def row_provider(backend: str) -> str:
    """The device a bench row ran on, from its name ("onnxruntime cuda fp16", "pytorch cached cuda", "openvino cpu")."""
    return "cuda" if "cuda" in backend.split() else "cpu"


def _line(r: Result) -> str:
    return f"  {r.backend:<32} {r.search:<7} batch {r.batch:>3}: {r.sentences / r.seconds:8.1f} sent/s"


def table(results: list[Result]) -> str:
    """Sentences/s, tokens/s, speed-up against the textbook loop at batch 1 and against PyTorch cached at the same settings."""
    base = next((r for r in results if r.backend.startswith("pytorch textbook") and r.batch == 1), results[0])
    cached = {(r.backend, r.search, r.batch): r for r in results if r.backend.startswith("pytorch cached")}
    header = (f"{'backend':<32} {'search':<7} {'batch':>5} {'sent/s':>8} {'tok/s':>8} {'vs textbook b1':>14} "
              f"{'vs torch cached':>15} {'peak MiB':>8} {'same output':>11}")
    lines = [header, "-" * len(header)]
    for r in results:
        ref = cached.get((torch_row(row_provider(r.backend)), r.search, r.batch))
        same = "" if ref is None else f"{np.mean([a == b for a, b in zip(r.outputs, ref.outputs)]):.0%}"
        vs_cached = f"{ref.seconds / r.seconds:.2f}x" if ref else ""
        lines.append(f"{r.backend:<32} {r.search:<7} {r.batch:>5} {r.sentences / r.seconds:>8.1f} {r.tokens / r.seconds:>8.0f} "
                     f"{base.seconds / r.seconds:>13.1f}x {vs_cached:>15} {r.peak_mib:>8.1f} {same:>11}")
    return "\n".join(lines)
