"""CTranslate2 as a runtime: the converted copy a model directory stores (`tk export DIR --ctranslate2`), loaded
into a `ctranslate2.Translator` that decodes whole sentences in CTranslate2's own loop.

tk's text handling (cleaning, splitting, capitals, placeholders) and its guards run around it unchanged: sentences go
in as tk's token ids, results come back as `Hypothesis` lists like the ONNX Runtime loop's. Greedy decoding is exact
by construction: a greedy prefix does not depend on how long decoding may run, so every sentence is decoded to the
longest limit of the call and then cut where tk's length limit or loop guard would have stopped it. Beam search is
CTranslate2's own, with its length penalty (score / length^alpha, not tk's GNMT rule), decoded to the call's longest
limit and cut the same way. Imports numpy and (lazily) ctranslate2; never torch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from toolkit.core.decode_options import DecodeOptions, cores
from toolkit.core.decoding import SHORTEST_LOOP, WIDEST_GROUP, Hypothesis, length_limits, loop_cut
from toolkit.core.errors import ProviderError, UsageError, first_line
from toolkit.core.manifest import Manifest
from toolkit.core.variants import PLAIN

INSTALL_HINT = "install the ct2 extra: pip install 'tk-onnx-deploy[ct2]' (or pip install ctranslate2)"
RUNTIME = "ctranslate2"
# tk's variants as CTranslate2 compute types, per device: weights are stored in float32 and quantised at load.
COMPUTE = {"cpu": {"fp32": "float32", "optimized": "float32", "int8": "int8"},
           "cuda": {"fp32": "float32", "fp16": "float16", "int8": "int8_float16"}}


def available() -> bool:
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return False
    return True


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise UsageError(f"--runtime ctranslate2 needs the ctranslate2 package; {INSTALL_HINT}") from None
    return ctranslate2


def version() -> str:
    return _ctranslate2().__version__


# What CTranslate2 reports of its CPU backend when CT2_VERBOSE is set, line by line.
_REPORTED = re.compile(r"- (Selected ISA|SGEMM backend|GEMM_S8 backend): (\S+)")


def gemm_backends(model_dir: str | Path, compute_type: str = "default") -> str:
    """Which matrix products CTranslate2 runs on this CPU, as it reports them itself: "SGEMM DNNL, int8 DNNL, AVX2".
    It chooses once per process, from the CPU's vendor and CT2_USE_MKL (MKL's packed GEMM on Intel, oneDNN on AMD
    unless CT2_USE_MKL=1), so a child process with this one's environment loads the model and is asked; a benchmark
    row states it beside the version. "" where CTranslate2 does not say."""
    code = "import sys, ctranslate2; ctranslate2.Translator(sys.argv[1], device='cpu', compute_type=sys.argv[2])"
    try:
        done = subprocess.run([sys.executable, "-c", code, str(model_dir), compute_type], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "CT2_VERBOSE": "1"})
    except (OSError, subprocess.SubprocessError):
        return ""
    return reported_backends(done.stdout + done.stderr)


def reported_backends(log: str) -> str:
    said = dict(_REPORTED.findall(log))
    parts = [f"SGEMM {said['SGEMM backend']}" if "SGEMM backend" in said else "",
             f"int8 {said['GEMM_S8 backend']}" if "GEMM_S8 backend" in said else "", said.get("Selected ISA", "")]
    return ", ".join(p for p in parts if p)


# CTranslate2's two CPU matrix-product libraries, by the CT2_USE_MKL value that selects each. It reads the variable once
# per process, at its first model load (unset: MKL on Intel, oneDNN on AMD), so each is timed in a process of its own
# and a bench sets it before its first load (in its own environment, or in the environment of the workers it starts).
GEMM = {"mkl": "1", "dnnl": "0"}
GEMM_CHOICES = ("auto", *GEMM)
# A short fixed-work decode: 32 sentences of 24 tokens of the model's own vocabulary in batches of 16, exactly 32 tokens
# each, greedy; the best of three calls after a warm-up, loaded as load_translator loads, at both of the bench's thread
# ways (intra x 1 and 1 x inter), the faster kept: the backends' order turns with them (opus-mt shape, fp32, 2 cores:
# MKL 486 and oneDNN 431 tokens/s at 2 x 1, 558 and 894 at 1 x 2; at 2 x 1 alone the probe chose MKL, and the bench's
# rows, which take the faster thread way, ran 0.66x oneDNN's). Prints its seconds; CT2_VERBOSE makes CTranslate2 say what it ran.
_PROBE = """import json, os, sys, threading, time, ctranslate2
model, compute, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
name = next(n for n in ("shared_vocabulary.json", "source_vocabulary.json") if os.path.exists(os.path.join(model, n)))
vocab = json.load(open(os.path.join(model, name), encoding="utf-8"))
n = min(len(vocab) - 4, 500)
src = [[vocab[4 + (7 * i + 13 * j) % n] for j in range(24)] for i in range(32)]
best = float("inf")
for intra, inter in {(threads, 1), (1, threads)}:
    loaded = []  # from a short-lived thread, as load_translator loads (why: there)
    loader = threading.Thread(target=lambda: loaded.append(ctranslate2.Translator(
        model, device="cpu", compute_type=compute, intra_threads=intra, inter_threads=inter)))
    loader.start(); loader.join()
    t = loaded.pop()
    go = lambda: t.translate_batch(src, max_batch_size=16, beam_size=1, min_decoding_length=32, max_decoding_length=32)
    go()
    for _ in range(3):
        start = time.perf_counter(); go(); best = min(best, time.perf_counter() - start)
    del t, go
print(json.dumps({"seconds": best}))
"""


def probe_gemm(model_dir: str | Path, compute_type: str, threads: int, rounds: int = 2) -> dict[str, dict]:
    """Each backend's probe (_PROBE) in processes of its own, taking turns (MKL first, then oneDNN first): per backend
    {"seconds": the best round's, "reported": what CTranslate2 said it ran} or {"error": why it could not run}."""
    out: dict[str, dict] = {b: {} for b in GEMM}
    for i in range(rounds):
        for backend in list(GEMM) if i % 2 == 0 else list(GEMM)[::-1]:
            if "error" in out[backend]:
                continue
            env = {**os.environ, "CT2_USE_MKL": GEMM[backend], "CT2_VERBOSE": "1"}
            try:
                done = subprocess.run([sys.executable, "-c", _PROBE, str(model_dir), compute_type, str(threads)],
                                      capture_output=True, text=True, timeout=600, env=env)
            except (OSError, subprocess.SubprocessError) as e:
                out[backend] = {"error": first_line(e)}
                continue
            try:
                seconds = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
            except (ValueError, IndexError, KeyError):  # it failed: its last line says why (MKL not built in, ...)
                out[backend] = {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
                continue
            out[backend] = {"seconds": round(min(seconds, out[backend].get("seconds", seconds)), 4),
                            "reported": reported_backends(done.stdout + done.stderr)}
    return out


def check_gemm(value: str) -> str:
    if value not in GEMM_CHOICES:
        raise UsageError(f"--ct2-backend {value!r} is not a CTranslate2 backend; choose one of {', '.join(GEMM_CHOICES)}")
    return value


def choose_gemm(model_dir: str | Path, compute_types: list[str], forced: str = "auto", threads: int = 0) -> dict:
    """The CPU backend CTranslate2's timed rows run on, for one process that runs every one of `compute_types`:
    `forced` (mkl or dnnl), or for "auto" the faster in the probe (summed over the compute types, each as a ratio to
    its faster backend). {"backend": mkl, dnnl or None (neither probe ran: CTranslate2's own choice), "chosen":
    "forced" or "probe", "probe": {compute type: probe_gemm's result}}."""
    if check_gemm(forced) != "auto":
        return {"backend": forced, "chosen": "forced", "probe": {}}
    probe = {c: probe_gemm(model_dir, c, threads or cores()) for c in compute_types}
    ran = [b for b in GEMM if all("seconds" in probe[c][b] for c in compute_types)]
    cost = lambda b: sum(probe[c][b]["seconds"] / min(probe[c][x]["seconds"] for x in ran) for c in compute_types)  # noqa: E731
    return {"backend": min(ran, key=cost) if ran else None, "chosen": "probe", "probe": probe}


def describe_gemm(choice: dict) -> str:
    """One line: the backend the rows ran and why, with each probe's figures."""
    if choice["backend"] is None:
        return "CTranslate2's own backend (neither probe ran: " + "; ".join(
            f"{c} {b}: {r.get('error', '')}" for c, p in choice["probe"].items() for b, r in p.items()) + ")"
    how = "--ct2-backend" if choice["chosen"] == "forced" else "the faster in a probe of 32 sentences x 32 tokens greedy, at both thread ways"
    figures = "; ".join(f"{c}: " + ", ".join(f"{b} {r['seconds']:.3f} s" if "seconds" in r else f"{b} failed ({r['error']})"
                                             for b, r in p.items()) for c, p in choice["probe"].items())
    return f"CTranslate2 on {choice['backend']} ({how}{'; ' + figures if figures else ''})"


@contextmanager
def gemm_environment(backend: str | None):
    """CT2_USE_MKL for `backend` in this process's environment while the block runs (None: left as it is). It selects
    this process's backend only where CTranslate2 loads no model before the block; child processes inherit it."""
    if backend is None:
        yield
        return
    before = os.environ.get("CT2_USE_MKL")
    os.environ["CT2_USE_MKL"] = GEMM[backend]
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CT2_USE_MKL", None)
        else:
            os.environ["CT2_USE_MKL"] = before


def thread_candidates() -> list[tuple[int, int]]:
    """(intra, inter) threads worth trying, for CTranslate2 and for tk's (intra-op threads, streams) alike:
    all cores in one translation, or one core per concurrent batch."""
    n = min(cores(), 4)
    return sorted({(c, 1) for c in range(1, n + 1)} | {(1, n)})


def fastest(candidates: list, seconds):
    """The candidate with the lowest time, each timed twice in turns (best of two)."""
    times = {c: float("inf") for c in candidates}
    for _ in range(2):
        for c in candidates:
            times[c] = min(times[c], seconds(c))
    return min(candidates, key=times.__getitem__)


def load_translator(source: str, files: dict[str, bytes] | None, **args):
    """A ctranslate2.Translator, loaded from a short-lived thread: on 2 cores CTranslate2's OpenMP workers stop
    spinning once the process holds more OpenMP threads than cores, and it then runs 2 to 5 times slower;
    quantising at load on the main thread creates such threads."""
    ctranslate2 = _ctranslate2()
    loaded: list = []
    failed: list[str] = []

    def run() -> None:
        try:
            loaded.append(ctranslate2.Translator(source, files=files, **args))
        except Exception as e:  # noqa: BLE001 - reported below in one line, with the fix
            failed.append(first_line(e))

    loader = threading.Thread(target=run)
    loader.start()
    loader.join()
    if not loaded:
        raise UsageError(f"CTranslate2 could not load {source}: {failed[0] if failed else 'no reason given'}; "
                         "re-export it with tk export DIR --ctranslate2 --force")
    return loaded[0]


class Ct2Translator:
    """One loaded CTranslate2 translator from a converted directory (tk bench's comparison rows); use as a context
    manager so only one is alive at a time."""

    def __init__(self, model_dir: str | Path, compute_type: str = "float32", intra_threads: int = 0,
                 inter_threads: int = 1):
        self.args = dict(device="cpu", compute_type=compute_type, intra_threads=intra_threads,
                         inter_threads=inter_threads)
        self.model_dir = str(model_dir)
        self.translator = None

    def __enter__(self) -> Ct2Translator:
        self.translator = load_translator(self.model_dir, None, **self.args)
        return self

    def __exit__(self, *exc) -> None:
        if self.translator is not None:
            self.translator.unload_model()
        self.translator = None

    def translate_ids(self, src: list[list[int]], beam: int = 1, max_len: int = 64, batch_size: int = 64,
                      alpha: float = 0.6, scores: bool = False) -> list[list[int]] | tuple[list[list[int]], list[float]]:
        """Best output token ids per sentence (EOS excluded), batches of `batch_size` sorted by length."""
        results = self.translator.translate_batch(
            [[str(t) for t in s] for s in src], max_batch_size=batch_size, batch_type="examples", beam_size=beam,
            max_decoding_length=max_len, length_penalty=alpha, return_scores=scores)
        ids = [[int(t) for t in r.hypotheses[0]] for r in results]
        return (ids, [r.scores[0] for r in results]) if scores else ids


def _words(ids: list[int]) -> list[str]:
    """tk's token ids as the converted vocabulary spells them (each id written as a string)."""
    return [str(t) for t in ids]


@dataclass
class Ct2Backend:
    """Decodes whole sentences in CTranslate2: `decode_all` takes the place of tk's step loop (see the module
    docstring for how its results match that loop's)."""

    translator: object  # for a call of one batch: every thread on it (intra_threads)
    end: int  # the model's end token (the converted model ends on it too)
    batches: Callable[[], object] | None = None  # for a call of several batches: one thread per batch, side by side
    forbidden: tuple[int, ...] = ()  # tokens generate never emits (an import's bad_words_ids: Marian's <pad>)
    start: int | None = None  # the decoder start token the conversion stores (mBART-cc25's: its target language's code)
    directory: str = ""  # the model directory, for the one line that refuses another start

    def _check_start(self, opts: DecodeOptions) -> None:
        """CTranslate2 starts every sentence with the converted decoder_start_token; an mBART-cc25 starts with the
        target language's code, so another target than the converted one would decode from the wrong code."""
        wanted = getattr(opts.rules, "start", None)
        if self.start is not None and wanted is not None and wanted != self.start:
            raise UsageError(f"the CTranslate2 model of {self.directory} starts its decoder with token {self.start}, the "
                             f"target language it was converted for, not {wanted}; translate to another target with "
                             "--runtime onnxruntime (the default), or state the pair with tk export DIR --source-lang S "
                             "--target-lang T and convert again with tk export DIR --ctranslate2 --force")

    def decode_all(self, src: list[list[int]], opts: DecodeOptions) -> list[list[Hypothesis]]:
        """Hypotheses for every source sentence, in input order; empty sources get no decoding."""
        self._check_start(opts)
        out: list[list[Hypothesis]] = [[Hypothesis([], 0.0)] for _ in src]
        todo = [i for i, s in enumerate(src) if s]
        if not todo:
            return out
        limits = length_limits([src[i] for i in todo], opts.max_len, opts.max_len_a, opts.max_len_b)
        # One call to the longest limit, each hypothesis then cut at its sentence's own: exact for greedy; for a beam
        # only the rare hypotheses that reach their limit could differ (a call per limit made beam 4 1.3x slower).
        groups = [(todo, limits, int(limits.max()))]
        engine = self.batches() if self.batches is not None and len(todo) > opts.batch_size else self.translator
        forced = getattr(opts.rules, "forced_first", None)
        for idx, lims, longest in groups:
            results = engine.translate_batch(
                [_words(src[i]) for i in idx], max_batch_size=opts.batch_size, batch_type="examples", beam_size=opts.beam,
                num_hypotheses=opts.n_best, max_decoding_length=longest, return_scores=True,
                # Greedy: no length penalty, so each score is the plain sum of log-probabilities, as tk's loop sums it.
                length_penalty=0.0 if opts.beam == 1 else self._alpha(opts),
                # A multilingual model's target language is its first output token, as generate forces it: CTranslate2
                # decodes from it as a prefix (kept in the hypothesis, its log-probability left out of the score, as
                # the forced step's 0 leaves it out of tk's beam scores).
                target_prefix=[[str(forced)] for _ in idx] if forced is not None else None,
                suppress_sequences=[[str(t)] for t in self.forbidden] or None)
            for i, limit, result in zip(idx, lims, results):
                out[i] = [self._hypothesis(src[i], [int(t) for t in words], score, int(limit), longest, opts)
                          for words, score in zip(result.hypotheses, result.scores)]
        return out

    def _alpha(self, opts: DecodeOptions) -> float:
        rules = opts.rules
        return float(opts.alpha if opts.alpha is not None else getattr(rules, "alpha", 0.6))

    def _hypothesis(self, src: list[int], tokens: list[int], score: float, limit: int, longest: int,
                    opts: DecodeOptions) -> Hypothesis:
        """tk's hypothesis for CTranslate2's (decoded for at most `longest` steps): cut at tk's length limit and loop
        guard, its score the sum of the log-probabilities of the steps tk's loop would have taken (EOS's included
        when it ended on EOS)."""
        taken = len(tokens) + (len(tokens) < longest)  # CTranslate2's steps: its tokens, and EOS unless it ran out
        if opts.beam > 1:
            score *= taken ** self._alpha(opts)  # CTranslate2 ranks by score / steps^alpha and reports that
        stopped, keep, steps = "", len(tokens), taken
        if len(tokens) >= limit:
            stopped, keep, steps = "length", limit, limit
        if opts.loop_guard:
            for t in range(SHORTEST_LOOP, keep + 1):  # the first step at which tk's guard sees a loop
                if tokens[t - 1] not in tokens[max(0, t - 1 - WIDEST_GROUP) : t - 1]:
                    continue  # no loop can end here (decoding.may_loop's test)
                cut = int(loop_cut(np.array([tokens[:t]]))[0])
                if cut >= 0:
                    stopped, keep, steps = "loop", cut, t
                    break
        if steps != taken:  # fewer steps than CTranslate2 took: their log-probabilities, summed (a rare case)
            score = sum(self.translator.score_batch([_words(src)], [_words(tokens[:steps])])[0].log_probs[:steps])
        # What the guard cut off goes with it, as from tk's loop: decoding.word_end ends both on a whole word.
        return Hypothesis(tokens[:keep], float(score), stopped, tokens[keep:steps] if stopped == "loop" else [])

    # The decoding loop asks a backend for these when it runs streams; CTranslate2 runs its own (inter_threads).
    def for_streams(self) -> Ct2Backend:
        return self

    def fork(self) -> Ct2Backend:
        return self


@dataclass
class LoadedCt2:
    """A model directory's converted copy, loaded: `backend()` gives the decoder of whole sentences."""

    manifest: Manifest
    translator: object
    provider: str
    compute_type: str
    batch_loader: Callable[[], object] | None = None  # makes the translator for calls of several batches
    start: int | None = None  # the converted decoder start token (Ct2Backend.start)
    runners: dict = field(default_factory=dict)  # no ONNX graphs run
    built_s: float = 0.0
    runtime: str = RUNTIME

    def __post_init__(self) -> None:
        self._batches: object | None = None
        self._lock = threading.Lock()

    def batches(self) -> object:
        """The translator for calls of several batches, loaded at the first such call: a process that only answers
        requests never holds it (its OpenMP threads beside the first translator's cost a request about 15%)."""
        with self._lock:
            if self._batches is None:
                self._batches = self.batch_loader()
            return self._batches

    def backend(self) -> Ct2Backend:
        return Ct2Backend(self.translator, self.manifest.rules().end, self.batches if self.batch_loader else None,
                          forbidden_tokens(self.manifest), self.start, str(self.manifest.directory))


def forbidden_tokens(m: Manifest) -> tuple[int, ...]:
    """The tokens an imported model's generation config forbids (tk's decoder graph gives them -inf); none for tk's own."""
    text = str(m.config.get("suppress_tokens") or "")
    return tuple(int(t) for t in text.split(",") if t.strip().isdigit())


def stored_files(m: Manifest) -> dict[str, bytes]:
    """The converted model's files by CTranslate2's own names, read from the directory (their digests are checked by
    Manifest.check_files before anything loads) and held to what tk writes (spec.check_converted: the digests prove
    nothing of files whose digests were rewritten with them)."""
    from toolkit.runtimes.ctranslate2.spec import check_converted, conversion_problem

    record = (m.converted or {}).get(RUNTIME)
    if record is None:  # advise the conversion only where `tk export DIR --ctranslate2` would make one
        raise UsageError(conversion_problem(m) or
                         f"{m.directory} has no CTranslate2 model; add one with: tk export {m.directory} --ctranslate2")
    files = {}
    for name, entry in record.files.items():
        try:
            files[name] = (m.directory / entry.file).read_bytes()
        except OSError as e:
            raise UsageError(f"cannot read {m.directory / entry.file} ({e.strerror}); re-export it with "
                             f"tk export {m.directory} --ctranslate2 --force") from None
    check_converted(m, files, {name: m.directory / entry.file for name, entry in record.files.items()})
    return files


def load(m: Manifest, provider: str = "cpu", variant: str = PLAIN, threads: int | None = None,
         allow_fallback: bool = False) -> LoadedCt2:
    """The directory's CTranslate2 model on `provider`, its compute type the variant's (COMPUTE). threads: CTranslate2's
    intra_threads, one batch at a time. Unless given, on CPU a call of one batch (a request) runs on every core (up to
    4), and a call of several batches (a file) on a second copy of the model (28 MB for the shipped Transformer) with
    one core per batch, as many batches side by side: CTranslate2's own fastest settings for each on 2 cores (the
    first 2,000 Tatoeba Challenge sentences greedy, fp32: 4.19 s against 4.66 s at 2 x 1 threads; one sentence per
    call 17.7 ms against 35.6 ms at 1 x 2)."""
    ctranslate2 = _ctranslate2()
    if provider == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        if not allow_fallback:
            raise ProviderError("--provider cuda: CTranslate2 sees no CUDA device (none here, or its CUDA libraries are "
                                "missing); use --provider cpu, or --allow-cpu-fallback")
        provider = "cpu"
    if provider not in COMPUTE:
        raise ProviderError(f"CTranslate2 runs on cpu or cuda, not {provider}")
    compute = COMPUTE[provider].get(variant)
    if compute is None:
        raise UsageError(f"--runtime ctranslate2 on {provider} runs the variants {', '.join(COMPUTE[provider])} "
                         f"(quantised at load), not {variant}")
    files = stored_files(m)
    n = threads or min(cores(), 4)
    translator = load_translator(str(m.directory), files, device=provider, compute_type=compute, intra_threads=n)
    loader = None
    if threads is None and provider == "cpu" and n > 1:
        loader = lambda: load_translator(str(m.directory), files, device=provider, compute_type=compute,  # noqa: E731
                                          intra_threads=1, inter_threads=n)
    return LoadedCt2(m, translator, provider, compute, loader, start=_converted_start(files))


def _converted_start(files: dict[str, bytes]) -> int | None:
    """The decoder start token the converted config.json names (an id written as a string; spec.check_converted has
    held the file to what tk writes)."""
    import json

    try:
        return int(json.loads(files["config.json"])["decoder_start_token"])
    except (KeyError, TypeError, ValueError):
        return None
