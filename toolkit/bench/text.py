"""`tk bench --text FILE`: tk as a user meets it against CTranslate2 at its best setting, text in and text out.

tk's side is the public API with its defaults: `Translator(dir, variant=v).translate(lines, beam=b)`.
CTranslate2's side is `ctranslate2.Translator.translate_batch` over the same weights (read from the
fp32 graphs), with the same SentencePiece model around it, at the (intra, inter) threads that were
fastest for it here. Rows are timed in turns and the median kept; BLEU of both outputs sits beside
each row. Cold start runs each side's minimal script in a fresh process, in pairs.
Torch-free: it needs the ct2 extra and nothing of the build side.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.core.errors import DataError, UsageError
from toolkit.runtimes.ctranslate2.engine import RUNTIME as CT2

COMPUTE = {"fp32": "float32", "int8": "int8"}  # CTranslate2's compute type for each variant timed
FILE_BATCH = 64  # CTranslate2's max_batch_size, and tk's default batch size
REQUEST_BEAM = 1


@dataclass
class Engine:
    """One engine's time on one row, and how its translations compare with tk's (its API, ONNX Runtime, defaults)."""

    name: str  # "tk", "tk on ctranslate2", "ctranslate2", "transformers", "optimum"
    seconds: float  # median seconds for the file, or per request / per start
    threads: str = ""  # how it ran: "2 x 1" (intra x inter) or "torch 2 threads"
    same: float | None = None  # share of translations identical to tk's
    bleu: float | None = None
    version: str = ""
    backend: dict | None = None  # CTranslate2's CPU backend, on its rows (engine.choose_gemm: which, and the probe's figures)


@dataclass
class TextRow:
    row: str  # "file, greedy", "file, beam 4", "requests, greedy", "cold start"
    variant: str  # tk's variant; CTranslate2 runs the matching compute type; the Hugging Face peers run fp32
    sentences: int
    engines: list[Engine] = field(default_factory=list)

    def speedup(self, engine: Engine) -> float:
        """How many times faster tk (the first engine) is than `engine` on this row (below 1: slower)."""
        return engine.seconds / self.engines[0].seconds


def read_text(path: Path, reference: Path | None = None, option: str = "--text") -> tuple[list[str], list[str] | None]:
    """Source lines and their references: a Tatoeba Challenge file ('eng<TAB>fra<TAB>English<TAB>French')
    carries both; a plain file one sentence per line, with references from `reference` if given. `option`: how its
    errors name the file's option."""
    def lines_of(p: Path, what: str) -> list[str]:
        try:
            return p.read_bytes().decode("utf-8").splitlines()
        except OSError as e:
            raise UsageError(f"cannot read {what} {p} ({e.strerror})") from None
        except UnicodeDecodeError as e:
            raise DataError(f"{what} {p} is not UTF-8 (byte {e.start}); convert it to UTF-8") from None

    lines = [x for x in lines_of(path, option) if x.strip()]
    if not lines:
        raise UsageError(f"{option} {path} has no sentences; give a file with one sentence per line")
    cols = [x.split("\t") for x in lines]
    if reference is None and all(len(c) >= 4 and len(c[0]) <= 3 and len(c[1]) <= 3 for c in cols):
        return [c[2] for c in cols], [c[3] for c in cols]
    refs = None
    if reference is not None:
        refs = [x for x in lines_of(reference, "--reference") if x.strip()]
        if len(refs) != len(lines):
            raise UsageError(f"--reference has {len(refs)} sentences but {option} has {len(lines)}; give one reference per line")
    return lines, refs


class Ct2Text:
    """CTranslate2 with tk's SentencePiece model around it: text in, text out."""

    def __init__(self, model_dir: str, tokenizer_path: Path, compute_type: str, max_len: int):
        from toolkit.core.tokenizer import Tokenizer

        self.model_dir, self.compute_type, self.max_len = model_dir, compute_type, max_len
        self.tokenizer = Tokenizer.load(tokenizer_path)

    def translate(self, tr, lines: list[str], beam: int) -> list[str]:
        src = [s[: self.max_len] for s in self.tokenizer.encode(lines)]
        return self.tokenizer.decode(tr.translate_ids(src, beam, self.max_len, FILE_BATCH))


def _median_turns(runs: list[Callable[[], float]], repeat: int) -> list[float]:
    """Each run's median seconds over `repeat` turns taken in order, so drift hits every run alike."""
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeat):
        for i, run in enumerate(runs):
            times[i].append(run())
    return [statistics.median(t) for t in times]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_text(model_dir: Path, sources: list[str], references: list[str] | None, variants=("fp32", "int8"),
               beams=(1, 4), requests: int = 200, repeat: int = 3, cold_starts: int = 5, peers: tuple[str, ...] = (),
               peer_python: str | None = None, echo: Callable[[str], None] = print, glossary=None,
               ct2_backend: str = "auto") -> list[TextRow]:
    """Every row for every variant: the file at each beam, single-sentence requests, cold start. Engines: tk's API
    (ONNX Runtime, defaults), tk's API on its CTranslate2 model, CTranslate2's own translate_batch at its fastest
    threads, and the Hugging Face `peers` (fp32 rows only; toolkit.bench.hf_peers) run by `peer_python`. With a
    `glossary` (toolkit.core.glossary), each file row is followed by tk's API with it against without it.
    `ct2_backend`: CTranslate2's CPU backend for the whole run (auto: the faster in a probe over the variants' compute
    types; engine.choose_gemm), set before its first load here: it reads the choice once per process."""
    import shutil
    import tempfile

    from toolkit.convert import convert, ctranslate2
    from toolkit.core.manifest import load
    from toolkit.runtimes.ctranslate2 import engine as ct2
    from toolkit.runtimes.ctranslate2.spec import convert as ct2_convert
    from toolkit.runtimes.onnxruntime import native

    if not ct2.available():
        raise UsageError(f"--text compares tk with CTranslate2; {ct2.INSTALL_HINT}")
    m = load(model_dir)
    rows: list[TextRow] = []
    with tempfile.TemporaryDirectory(prefix="tk-text-bench-") as work, ExitStack() as stack:
        ct2_dir = Path(work) / "ct2"
        ct2_convert(m, ct2_dir)
        gemm = ct2.choose_gemm(ct2_dir, [COMPUTE[v] for v in variants], ct2_backend)
        echo(ct2.describe_gemm(gemm))
        echo(native.status())
        stack.enter_context(ct2.gemm_environment(gemm["backend"]))
        tk_ct2_dir = model_dir
        if ctranslate2.RUNTIME not in (m.converted or {}):  # tk's own CTranslate2 model, made in a copy: the directory stays as it was
            tk_ct2_dir = Path(work) / "model"
            shutil.copytree(model_dir, tk_ct2_dir)
            convert(ctranslate2.WRITER, tk_ct2_dir)
        hf = _run_peers(m, Path(work), sources, beams, requests, repeat, peers, peer_python, echo) if peers else {}
        for variant in variants:
            pair = _Pair(m, model_dir, tk_ct2_dir, str(ct2_dir), variant)
            pair.choose_threads(sources[:256], echo)
            for beam in beams:
                row = pair.file_row(sources, references, beam, repeat, echo)
                if variant == "fp32":
                    row.engines += _peer_engines(hf, str(beam), pair.outputs, references)
                rows.append(row)
                if glossary is not None:
                    rows.append(pair.glossary_row(sources, references, beam, repeat, glossary, echo))
            row = pair.request_row(sources[:requests], repeat, echo)
            if variant == "fp32":
                row.engines += _peer_engines(hf, "requests", None, None)
            rows.append(row)
            tk_s, ct2_s = cold_start(model_dir, str(ct2_dir), variant, pair.compute, pair.request_threads, cold_start_sentence(sources),
                                     cold_starts)
            rows.append(TextRow("cold start", variant, 1, [Engine("tk", tk_s), Engine(CT2, ct2_s, _threads(pair.request_threads))]))
    for e in (e for r in rows for e in r.engines if e.name in (CT2, "tk on ctranslate2")):
        e.backend = gemm
    return rows


def _threads(threads: tuple[int, int]) -> str:
    return f"{threads[0]} x {threads[1]}"


def _bleu(outputs: list[str], references: list[str] | None) -> float | None:
    from toolkit.core.scoring import bleu_chrf

    return round(bleu_chrf(outputs, [[r] for r in references])["bleu"], 1) if references else None


def _same(outputs: list[str], tk: list[str]) -> float:
    return sum(a == b for a, b in zip(outputs, tk)) / max(1, len(tk))


class _Pair:
    """tk (its API, defaults; and on its CTranslate2 model) and CTranslate2 (a compute type, its fastest threads) over
    one variant's weights."""

    def __init__(self, m, model_dir: Path, tk_ct2_dir: Path, ct2_dir: str, variant: str):
        from toolkit.deploy.api import Translator

        self.max_len, self.ct2_dir, self.variant = m.max_len, ct2_dir, variant
        self.compute = COMPUTE[variant]
        self.engine = Ct2Text(ct2_dir, m.translation_tokenizer(), self.compute, m.max_len)
        # fp32 is tk's default (None: the fastest graphs with fp32's output); int8 must be asked for.
        self.tk = Translator(model_dir, provider="cpu", variant=None if variant == "fp32" else variant)
        self.tk_ct2 = Translator(tk_ct2_dir, provider="cpu", variant=variant, runtime=CT2)
        for t in (self.tk, self.tk_ct2):
            t.translate(["Hello.", "How are you?"])  # first-call allocations, as CTranslate2's warm-up below
        self.file_threads = self.request_threads = (1, 1)
        self.outputs: list[str] = []  # tk's translations of the last file row

    def ct2_seconds(self, threads: tuple[int, int], fn: Callable[[object], object]) -> float:
        """One timed pass; the CTranslate2 translator is loaded (untimed) around it, so only one is alive at a time."""
        from toolkit.runtimes.ctranslate2.engine import Ct2Translator

        with Ct2Translator(self.ct2_dir, self.compute, *threads) as tr:
            tr.translate_ids([[4, 5, 3]], 1, self.max_len, 1)
            return timed(lambda: fn(tr))

    def choose_threads(self, probe: list[str], echo: Callable[[str], None]) -> None:
        from toolkit.runtimes.ctranslate2 import engine as ct2_engine
        from toolkit.runtimes.ctranslate2.engine import fastest, thread_candidates

        self.file_threads = fastest(thread_candidates(), lambda c: self.ct2_seconds(c, lambda tr: self.engine.translate(tr, probe, 1)))
        self.request_threads = fastest([c for c in thread_candidates() if c[1] == 1], lambda c: self.ct2_seconds(
            c, lambda tr: [self.engine.translate(tr, [s], REQUEST_BEAM) for s in probe[:32]]))
        backends = ct2_engine.gemm_backends(self.ct2_dir, self.compute) or "backend not reported"
        echo(f"{self.variant}: CTranslate2 {ct2_engine.version()} ({backends}) {self.compute} fastest here at intra x inter "
             f"{self.file_threads[0]} x {self.file_threads[1]} for a file, {self.request_threads[0]} x 1 for single requests")

    def file_row(self, sources: list[str], references: list[str] | None, beam: int, repeat: int,
                 echo: Callable[[str], None]) -> TextRow:
        out: dict[str, list[str]] = {}
        tk_s, tk_ct2_s, ct2_s = _median_turns([
            lambda: timed(lambda: out.__setitem__("tk", self.tk.translate(sources, beam=beam))),
            lambda: timed(lambda: out.__setitem__("tk_ct2", self.tk_ct2.translate(sources, beam=beam))),
            lambda: self.ct2_seconds(self.file_threads, lambda tr: out.__setitem__("ct2", self.engine.translate(tr, sources, beam)))],
            repeat)
        name = "greedy" if beam == 1 else f"beam {beam}"
        echo(f"{self.variant} file, {name}: tk {tk_s:.2f} s, tk on CTranslate2 {tk_ct2_s:.2f} s, CTranslate2 {ct2_s:.2f} s")
        self.outputs = out["tk"]
        return TextRow(f"file, {name}", self.variant, len(sources), [
            Engine("tk", tk_s, "defaults", 1.0, _bleu(out["tk"], references)),
            Engine("tk on ctranslate2", tk_ct2_s, "defaults", _same(out["tk_ct2"], out["tk"]), _bleu(out["tk_ct2"], references)),
            Engine(CT2, ct2_s, _threads(self.file_threads), _same(out["ct2"], out["tk"]), _bleu(out["ct2"], references))])

    def glossary_row(self, sources: list[str], references: list[str] | None, beam: int, repeat: int, glossary,
                     echo: Callable[[str], None]) -> TextRow:
        """tk's API on the file with the glossary against without it, timed in turns; "same as tk": the share of lines
        the glossary left as they were."""
        out: dict[str, list[str]] = {}
        with_s, without_s = _median_turns([
            lambda: timed(lambda: out.__setitem__("with", self.tk.translate(sources, beam=beam, glossary=glossary))),
            lambda: timed(lambda: out.__setitem__("without", self.tk.translate(sources, beam=beam)))], repeat)
        name = "greedy" if beam == 1 else f"beam {beam}"
        holding = sum(bool(glossary.find(s)) for s in sources)
        echo(f"{self.variant} file, {name}, glossary of {len(glossary)} terms ({holding} of {len(sources)} lines hold one): "
             f"tk {with_s:.2f} s with it, {without_s:.2f} s without")
        return TextRow(f"file, {name}, glossary", self.variant, len(sources), [
            Engine("tk", with_s, "defaults", 1.0, _bleu(out["with"], references)),
            Engine("tk, no glossary", without_s, "defaults", _same(out["without"], out["with"]), _bleu(out["without"], references))])

    def request_row(self, asked: list[str], repeat: int, echo: Callable[[str], None]) -> TextRow:
        tk_s, tk_ct2_s, ct2_s = _median_turns([
            lambda: timed(lambda: [self.tk.translate([s], beam=REQUEST_BEAM) for s in asked]),
            lambda: timed(lambda: [self.tk_ct2.translate([s], beam=REQUEST_BEAM) for s in asked]),
            lambda: self.ct2_seconds(self.request_threads, lambda tr: [self.engine.translate(tr, [s], REQUEST_BEAM) for s in asked])],
            repeat)
        n = len(asked)
        echo(f"{self.variant} requests: tk {1000 * tk_s / n:.2f} ms, tk on CTranslate2 {1000 * tk_ct2_s / n:.2f} ms, "
             f"CTranslate2 {1000 * ct2_s / n:.2f} ms")
        return TextRow("requests, greedy", self.variant, n, [Engine("tk", tk_s / n, "defaults"),
                                                              Engine("tk on ctranslate2", tk_ct2_s / n, "defaults"),
                                                              Engine(CT2, ct2_s / n, _threads(self.request_threads))])


def _run_peers(m, work: Path, sources: list[str], beams, requests: int, repeat: int, peers: tuple[str, ...],
               peer_python: str | None, echo: Callable[[str], None]) -> dict:
    """The Hugging Face peers' results (toolkit.bench.hf_peers), over the model written with --to-hf."""
    import json

    from toolkit.convert import convert, to_hf

    hf_dir = work / "hf"
    convert(to_hf.WRITER, m.directory, hf_dir)
    python = peer_python or sys.executable
    echo(f"Hugging Face peers ({', '.join(peers)}) on {python}, over the model written with --to-hf ...")
    request = {"hf_dir": str(hf_dir), "sources": sources, "beams": list(beams), "requests": requests, "repeat": repeat,
               "engines": list(peers), "batch": FILE_BATCH}
    try:
        done = subprocess.run([python, str(Path(__file__).with_name("hf_peers.py"))], input=json.dumps(request),
                              capture_output=True, text=True, timeout=7200)
    except OSError as e:
        raise UsageError(f"--peer-python {python} cannot run ({e.strerror}); give a Python interpreter") from None
    if done.returncode != 0:
        raise UsageError(f"the peers' script failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    results = json.loads(done.stdout)
    for engine, r in results.items():
        echo(f"{engine}: {r['error']}" if "error" in r else f"{engine}: {r['version']}, torch {r['threads']} threads")
    return results


def _peer_engines(hf: dict, key: str, tk: list[str] | None, references: list[str] | None) -> list[Engine]:
    """The peers' engines for a file row (key: the beam) or the requests row (key "requests")."""
    out = []
    for name, r in hf.items():
        if "error" in r:
            continue
        entry = r["requests"] if key == "requests" else r["file"].get(key)
        if entry is None:
            continue
        outputs = entry.get("outputs")
        out.append(Engine(name, statistics.median(entry["seconds"]), f"torch {r['threads']} threads",
                          _same(outputs, tk) if outputs and tk else None, _bleu(outputs, references) if outputs else None,
                          r["version"]))
    return out


TK_SCRIPT = ("import sys\nfrom toolkit import Translator\n"
             "print(Translator(sys.argv[1], variant=sys.argv[2] or None).translate([sys.argv[3]])[0])\n")
# CTranslate2's minimal script: its translator and SentencePiece, nothing else.
CT2_SCRIPT = """import sys
import ctranslate2, sentencepiece
sp = sentencepiece.SentencePieceProcessor(model_file=sys.argv[2])
t = ctranslate2.Translator(sys.argv[1], device="cpu", compute_type=sys.argv[3], intra_threads=int(sys.argv[4]))
out = t.translate_batch([[str(i) for i in sp.encode(sys.argv[5])]], beam_size=1)
print(sp.decode([int(x) for x in out[0].hypotheses[0]]))
"""


def cold_start_sentence(sources: list[str]) -> str:
    """The sentence the cold-start scripts translate: the first a command line can carry (an argument holds no NUL;
    a file whose first line held one failed the whole bench at its end)."""
    return next((x for x in sources if "\x00" not in x), "Hello.")


def cold_start(model_dir: Path, ct2_dir: str, variant: str, compute: str, threads: tuple[int, int], sentence: str,
               pairs: int) -> tuple[float, float]:
    """Median wall time from a fresh Python process to one translated sentence, tk's and CTranslate2's
    scripts run in pairs (after one untimed run each, so both read the model from the page cache, tk's
    start-up cache holds its optimised graphs and both sides' modules have their bytecode, as on any
    start after the first)."""
    from toolkit.core.manifest import load

    m = load(model_dir)
    tk_cmd = [sys.executable, "-c", TK_SCRIPT, str(model_dir), "" if variant == "fp32" else variant, sentence]
    ct2_cmd = [sys.executable, "-c", CT2_SCRIPT, ct2_dir, str(m.translation_tokenizer()), compute,
               str(threads[0]), sentence]

    def run(cmd: list[str], env: dict | None = None) -> float:
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise UsageError(f"the cold-start script failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
        return seconds

    # The untimed first runs may write bytecode even where PYTHONDONTWRITEBYTECODE is set (as a shell or container
    # may set it): an installed CTranslate2 has its bytecode from pip, and tk would otherwise compile its own
    # modules at every start (15 ms and more here), which no start after the first does on a usual install.
    import os

    first = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    run(tk_cmd, first), run(ct2_cmd, first)
    tk_s, ct2_s = _median_turns([lambda: run(tk_cmd), lambda: run(ct2_cmd)], pairs)
    return tk_s, ct2_s


def table(rows: list[TextRow]) -> str:
    """One line per engine and row: its speed, how many times faster tk is (above 1: tk is faster), the share of its
    translations identical to tk's, BLEU."""
    out = [f"{'row':<25} {'variant':<7} {'engine':<18} {'speed':>13} {'threads':>15} {'tk is':>8} {'same as tk':>10} {'BLEU':>5}"]
    for r in rows:
        for i, e in enumerate(r.engines):
            speed = f"{r.sentences / e.seconds:,.0f} sent/s" if r.row.startswith("file") else f"{1000 * e.seconds:.1f} ms"
            same = "" if e.same is None else f"{100 * e.same:.0f}%"
            bleu = "" if e.bleu is None else f"{e.bleu:.1f}"
            lead = f"{r.row:<25} {r.variant:<7}" if i == 0 else " " * 33
            out.append(f"{lead} {e.name:<18} {speed:>13} {e.threads:>15} {r.speedup(e):>7.2f}x {same:>10} {bleu:>5}")
    return "\n".join(out)
