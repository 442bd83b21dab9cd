"""`tk bench --scale SHAPE`: tk against CTranslate2, Optimum and transformers on a model of the size users deploy.

The model is built from config with random weights (toolkit.bench.scale_model), saved with save_pretrained, and each
engine takes it through its own tool: `tk export hf:` (and `tk export DIR --quantize int8`; tk fp32 runs the float32
graphs tk runs on CPU by default, attention fused, built when its worker loads the model), CTranslate2's
TransformersConverter, Optimum's exporter, transformers' from_pretrained. The build, export and conversion run once per
work directory, each in a process of its own whose wall time and peak memory are reported.

Rows are fixed work: the model forbids its end token and every engine is told to decode exactly --tokens tokens per
sentence, so each row times the same number of decoder steps in every engine; the table says how many tokens each
engine emitted, and how many of tk fp32's (and CTranslate2 fp32's) sentences are token-identical to transformers'
greedy or beam output. Each engine runs in a process of its own (toolkit.bench.scale_worker) on --threads cores, as
its users run it: tk as `tk translate` does on that many cores (batches side by side, one stream per core, and a call
of one batch on every core); CTranslate2 timed both of its ways on each row, the faster kept (intra_threads =
--threads x inter_threads 1, or intra 1 x inter --threads: its best threads); transformers torch threads = --threads;
Optimum's ONNX Runtime sessions intra-op threads = --threads; OMP/MKL threads = --threads in each. The processes take
turns, row by row, round by round, with a pause between turns so that one engine's spinning threads have gone idle
before the next starts; each row's median over the rounds is reported. Engines that do not fit in memory together
(NLLB-600M's six took 24 GiB and more, and the kernel killed one) run in groups, one group's rounds after another's:
the next engine starts only while the memory available covers every loaded engine growing to twice its size and the
next one (as large as the largest) doing the same. Engines are grouped in the order given.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.bench.scale_model import SHAPES, Shape
from toolkit.bench.scale_worker import COMPUTE, parse
from toolkit.core.atomic import is_temporary, write_atomic
from toolkit.core.decode_options import cores
from toolkit.core.errors import UsageError
from toolkit.runtimes.ctranslate2.engine import GEMM, check_gemm, choose_gemm, describe_gemm
from toolkit.runtimes.ctranslate2.engine import available as ct2_available

ENGINES = ("tk-fp32", "tk-int8", "ct2-fp32", "ct2-int8", "optimum", "transformers",
           # On a GPU (scale_worker says why where CUDA cannot be used): fp32 and half precision.
           "tk-cuda-fp32", "tk-cuda-fp16", "ct2-cuda-fp32", "ct2-cuda-fp16", "transformers-cuda", "transformers-cuda-fp16",
           # Over one vocabulary shortlist (scale_shortlist): tk's, each sentence over its own candidates, and CTranslate2's vmap.
           "tk-fp32-shortlist", "tk-int8-shortlist", "ct2-fp32-vmap", "ct2-int8-vmap")
# The table's ratios and token identities, each shown where both engines ran: (label, engine, against).
RATIOS = (("tk/CT2 fp32", "tk-fp32", "ct2-fp32"), ("tk/CT2 int8", "tk-int8", "ct2-int8"),
          ("tk fp32/Optimum", "tk-fp32", "optimum"), ("tk/CT2 cuda fp32", "tk-cuda-fp32", "ct2-cuda-fp32"),
          ("tk/CT2 cuda fp16", "tk-cuda-fp16", "ct2-cuda-fp16"),
          ("tk/transformers cuda fp32", "tk-cuda-fp32", "transformers-cuda"),
          ("tk/transformers cuda fp16", "tk-cuda-fp16", "transformers-cuda-fp16"),
          ("tk shortlist/tk fp32", "tk-fp32-shortlist", "tk-fp32"), ("tk shortlist/tk int8", "tk-int8-shortlist", "tk-int8"),
          ("tk shortlist/CT2 vmap fp32", "tk-fp32-shortlist", "ct2-fp32-vmap"),
          ("tk shortlist/CT2 vmap int8", "tk-int8-shortlist", "ct2-int8-vmap"))
SAME = (("tk fp32 = transformers", "tk-fp32", "transformers"), ("CT2 fp32 = transformers", "ct2-fp32", "transformers"),
        ("tk cuda fp32 = transformers cuda", "tk-cuda-fp32", "transformers-cuda"),
        ("tk cuda fp32 = transformers (cpu)", "tk-cuda-fp32", "transformers"))
MARKER = "tk-bench-scale.json"  # what this bench wrote in its work directory: the shape and each step's cost
PAUSE_S = 0.3  # between turns: longer than Intel OpenMP's 200 ms spin (CTranslate2's threads) and ONNX Runtime's


@dataclass(frozen=True)
class Row:
    name: str
    sentences: int
    batch: int
    beam: int
    per_call: bool = False
    real: bool = False  # sources: the first lines of the --sources file (varied lengths), not random tokens of one length


ROWS = (Row("128 sentences, batches of 32, greedy", 128, 32, 1),
        Row("32 sentences, batches of 16, beam 4", 32, 16, 4),
        Row("8 sentences, one per call, greedy", 8, 1, 1, per_call=True))
# With --sources: the same batches over real sentences, whose lengths vary within a batch (padding) and between batches.
REAL_ROWS = (Row("128 real sentences, batches of 32, greedy", 128, 32, 1, real=True),
             Row("32 real sentences, batches of 16, beam 4", 32, 16, 4, real=True))


@dataclass
class Step:
    name: str
    seconds: float
    peak_mib: float
    size_mib: float | None = None  # what it wrote on disk


@dataclass
class EngineRun:
    engine: str
    version: str = ""
    threads: str = ""
    error: str | None = None
    seconds: dict[str, list[float]] = field(default_factory=dict)  # row -> each round's seconds
    outputs: dict[str, list[list[int]]] = field(default_factory=dict)  # row -> the last round's tokens
    how: dict[str, list[str]] = field(default_factory=dict)  # row -> each round's faster way (an engine timed two ways)
    # CTranslate2 on the CPU: its backend (engine.choose_gemm's choice) and the CT2_USE_MKL its worker saw
    ct2_backend: dict | None = None
    loaded_mib: float | None = None  # the worker's resident memory once the engine loaded
    peak_mib: float | None = None  # its peak resident memory, loading and every round included (when it ended)

    def memory(self) -> str:
        """'1,297 MiB loaded, peak 2,344 MiB', or '' for an engine that did not run."""
        if self.peak_mib is None:
            return ""
        return (f"{self.loaded_mib:,.0f} MiB loaded, " if self.loaded_mib is not None else "") + f"peak {self.peak_mib:,.0f} MiB"


def _dir_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def _run_step(name: str, cmd: list[str], out: Path, log: Path, echo: Callable[[str], None]) -> Step:
    """Runs one preparation step in a process of its own: its wall time and peak resident memory (wait4's rusage)."""
    echo(f"{name} ...")
    start = time.perf_counter()
    with open(log, "a", encoding="utf-8") as err:
        proc = subprocess.Popen(cmd, stdout=err, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = (log.read_text(encoding="utf-8", errors="replace").strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"{name} failed (exit {proc.returncode}): {tail[:300]}; the whole log is {log}")
    step = Step(name, seconds, usage.ru_maxrss / 1024, _dir_mib(out) if out.exists() else None)
    echo(f"{name}: {seconds:.0f} s, peak {step.peak_mib:,.0f} MiB" + (f", {step.size_mib:,.0f} MiB on disk" if step.size_mib else ""))
    return step


def _work_dir(work: Path, shape: Shape) -> dict:
    """The work directory's record, creating the directory: refuses one this bench did not write, or one of another shape.
    The record is written first, before any step: a run killed while it prepares leaves a directory the next run knows
    as its own, and completes."""
    marker = work / MARKER
    if marker.is_file():
        return _record(work, shape)
    # A run killed while it wrote its first record left only that record's temporary file: the directory counts as empty
    if work.exists() and (not work.is_dir() or any(not is_temporary(p.name) for p in work.iterdir())):
        raise UsageError(f"{work} exists and was not written by tk bench --scale; give a new or empty --work directory")
    work.mkdir(parents=True, exist_ok=True)
    record = {"shape": shape.name, "steps": {}}
    _save(work, record)
    return record


def _record(work: Path, shape: Shape) -> dict:
    try:
        record = json.loads((work / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        record, problem = None, str(e)
    else:
        problem = "not the record of a run"
    if not isinstance(record, dict) or not isinstance(record.get("steps"), dict):
        raise UsageError(f"{work / MARKER} cannot be read ({problem}); remove {work} or give another --work directory")
    if record.get("shape") != shape.name:
        raise UsageError(f"{work} holds the {record.get('shape')} model of tk bench --scale; give another --work for {shape.name}")
    return record


def _save(work: Path, record: dict) -> None:
    """Whole or not at all: a run killed while it writes the record leaves the previous one."""
    write_atomic(work / MARKER, (json.dumps(record, indent=2) + "\n").encode("utf-8"))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def prepare(shape: Shape, work: Path, ct2: bool, echo: Callable[[str], None], int8: bool = True,
            shortlist: bool = False) -> dict[str, Step]:
    """The model in every form the engines read, each step once per work directory: returns every step's cost (a step
    done in an earlier run keeps the figures measured then). `int8`, `ct2`, `shortlist`: whether any engine reads those.
    A step not recorded as done (a run killed in it) is done again: what it writes from nothing is removed first."""
    record = _work_dir(work, shape)
    py, cli = sys.executable, "from toolkit.cli import main; main()"
    hf, tk = work / "hf", work / "tk"
    # (name, command, what it writes, whether it writes that from nothing)
    steps = [("build (random weights, save_pretrained)", [py, "-m", "toolkit.bench.scale_model", shape.name, str(hf)], hf, True),
             ("tk export hf:DIR", [py, "-c", cli, "export", f"hf:{hf}", "--out", str(tk)], tk, True)]
    if int8:
        # --force: a run killed after the variant was stored, before the step was recorded, left it in the directory
        steps.append(("tk export --quantize int8 (size: the directory with both)",
                      [py, "-c", cli, "export", str(tk), "--quantize", "int8", "--force"], tk, False))
    if ct2:
        convert = f"from ctranslate2.converters import TransformersConverter; TransformersConverter({str(hf)!r}).convert({str(work / 'ct2')!r})"
        steps.append(("CTranslate2 TransformersConverter", [py, "-c", convert], work / "ct2", True))
    if shortlist:  # one table for both engines (scale_shortlist); after the copies it is written into
        steps.append((f"synthetic shortlist for tk{' and vmap for CTranslate2' if ct2 else ''}",
                      [py, "-m", "toolkit.bench.scale_shortlist", str(tk), *([str(work / "ct2")] if ct2 else [])], tk, False))
    done = {name: Step(**step) for name, step in record["steps"].items()}  # an earlier run's steps are still reported
    for name, cmd, out, fresh in steps:
        if name not in record["steps"]:
            if fresh:
                _remove(out)  # what a run killed in this step left (the directory is this bench's: its record says so)
            record["steps"][name] = _run_step(name, cmd, out, work / "prepare.log", echo).__dict__
            _save(work, record)
        done[name] = Step(**record["steps"][name])
    return done


def sources(n: int, length: int, vocab: int, end: int, pad: int, seed: int = 0) -> list[list[int]]:
    """`n` source sentences of `length` random tokens and the end token: one length, so no engine's batching or padding
    differs from another's."""
    import random

    rng = random.Random(seed)
    ordinary = [t for t in range(4, min(vocab, 4096)) if t not in (end, pad)]  # no control token of either vocabulary
    return [[rng.choice(ordinary) for _ in range(length)] + [end] for _ in range(n)]


def real_sources(path: Path, n: int, model: Path) -> list[list[int]]:
    """The first `n` sentences of `path` (one a line, or a Tatoeba Challenge file: its source column) as ids of the
    bench's tokenizer, tk's own path (as `tk translate` encodes them, cut at the model's source length). Every engine is
    then fed these same ids, as the random rows feed theirs."""
    from toolkit.bench.text import read_text
    from toolkit.core import manifest
    from toolkit.core.tokenizers import open_tokenizer

    lines = read_text(path, option="--sources")[0]
    if len(lines) < n:
        raise UsageError(f"--sources {path} has {len(lines)} sentences; the real-sentence rows take {n}: give a longer file")
    m = manifest.load(model)
    return [ids[: m.max_len] for ids in open_tokenizer(m).encode(lines[:n])]


class _Worker:
    """One engine's process (toolkit.bench.scale_worker), loaded once."""

    def __init__(self, engine: str, model: Path, threads: int, tokens: int, work: Path, python: str | None,
                 pause: float = PAUSE_S, env: dict[str, str] | None = None):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), **(env or {})}
        script = [python, str(Path(__file__).with_name("scale_worker.py"))] if python else [sys.executable, "-m", "toolkit.bench.scale_worker"]
        self.log = open(work / f"{engine}.log", "a", encoding="utf-8")  # noqa: SIM115 - open while the process runs
        self.proc = subprocess.Popen(script, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.peak_mib: float | None = None  # once the process is reaped (_reap)
        self.hello = self._ask({"engine": engine, "model": str(model), "threads": threads, "tokens": tokens, "work": str(work),
                                "pause": pause})

    def _ask(self, obj: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self._reap()
            code = self.proc.returncode
            if code == -signal.SIGKILL:
                return {"error": f"its process was killed (signal 9, as the kernel kills one when memory runs out); bench "
                                 f"fewer --engines at a time; see {self.log.name}"}
            return {"error": f"its process ended (exit {code}); see {self.log.name}"}
        return json.loads(line)

    def run(self, src: list[list[int]], row: Row) -> dict:
        return self._ask({"src": src, "batch": row.batch, "beam": row.beam, "per_call": row.per_call})

    def close(self) -> float:
        """Ends the worker; its peak resident memory in MiB (wait4's rusage, as _run_step reads a step's)."""
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:  # a dead worker's pipe: what was left to write has nowhere to go
                pass
        self._reap()
        self.log.close()
        return self.peak_mib

    def _reap(self) -> None:
        """Waits for the process, once: a worker that died mid-run is reaped where it is found dead and not again at
        close (wait4 on a reaped process fails with ECHILD, which ended a 13-minute NLLB-600M run and lost every
        engine's rows)."""
        if self.peak_mib is None:
            _, status, usage = os.wait4(self.proc.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
            self.peak_mib = usage.ru_maxrss / 1024


# An engine's memory grows while it decodes (activations, caches, beam copies, arenas it keeps): at the NLLB-600M shape
# tk fp32's worker went from 4 to 6.6 GiB and Optimum's to 6.7 GiB, and with the real-sentence rows tk fp32's from
# 3,935 to 8,468 MiB (2.15x: at 2x, four tk engines started together on 24 GiB and the kernel killed tk fp32's worker);
# its peak later read 3,847 -> 10,013 MiB, pages of its mapped weights file counted, which the kernel may drop.
# So each engine is allowed to grow to this many times its resident memory once loaded: the next engine starts only
# while the memory available covers the loaded engines' growth and the next engine's (taken as large as the largest so
# far).
MEMORY_GROWTH = 2.5


def _meminfo_mib(field_name: str, path: str = "/proc/meminfo") -> float | None:
    """A /proc meminfo-style field in MiB (Linux); None where the file or field is missing."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _available_mib() -> float | None:
    return _meminfo_mib("MemAvailable")


def _rss_mib(pid: int) -> float | None:
    return _meminfo_mib("VmRSS", f"/proc/{pid}/status")


def _models(work: Path) -> dict[str, Path]:
    return {"tk": work / "tk", "ct2": work / "ct2", "transformers": work / "hf", "optimum": work / "hf"}


def run_engines(engines: list[str], work: Path, rows: tuple[Row, ...], src: list[list[int]], tokens: int, threads: int,
                repeat: int, peer_python: str | None, echo: Callable[[str], None],
                unavailable: dict[str, str] | None = None, pause: float = PAUSE_S,
                real: list[list[int]] | None = None, gemm: dict[str, dict] | None = None) -> list[EngineRun]:
    """Every engine's rows, the engines taking turns (see the module docstring). `real`: the real rows' sources (`src`
    the others'). `unavailable`: engines that are reported skipped, with why, and not started. `gemm`: engine ->
    CTranslate2's backend for it (engine.choose_gemm), set in its worker's environment. Engines that do not fit
    in memory together run in groups (each group's rounds, then the next group's), and the output says so."""
    runs = [EngineRun(engine, ct2_backend=(gemm or {}).get(engine)) for engine in engines]
    pending = list(runs)
    groups = 0
    while pending:
        workers, loaded, largest = {}, 0.0, 0.0
        while pending:
            run = pending[0]
            if workers and not _room_for_another(loaded, largest):
                echo(f"memory: {run.engine} and the engines after it wait for {', '.join(workers)} to finish "
                     f"({_available_mib():,.0f} MiB available; the loaded engines hold {loaded:,.0f} MiB, each may "
                     f"grow to {MEMORY_GROWTH:g}x)")
                break
            pending.pop(0)
            worker = _start(run, work, tokens, threads, peer_python, unavailable, pause, echo)
            if worker is not None:
                workers[run.engine] = worker
                run.loaded_mib = _rss_mib(worker.proc.pid)
                held = run.loaded_mib or 0.0
                loaded, largest = loaded + held, max(largest, held)
        if not workers:
            continue
        groups += 1
        group = [r for r in runs if r.engine in workers]
        try:
            for i in range(repeat + 1):  # the first round warms each engine up and is not kept
                for row in rows:
                    for run in group:
                        if run.error is None:
                            _turn(run, workers[run.engine], row, (real if row.real else src)[: row.sentences], keep=i > 0,
                                  pause=pause)
                            if run.error is not None:  # its worker died in this row: said now, not only in the summary
                                echo(f"{run.engine}: {run.error}; the other engines go on")
                echo(f"round {i}{' (warm-up, not kept)' if i == 0 else ''} done"
                     + (f" ({', '.join(workers)})" if groups > 1 or pending else ""))
        finally:
            for run in group:
                run.peak_mib = workers[run.engine].close()
    return runs


def _room_for_another(loaded_mib: float, largest_mib: float) -> bool:
    available = _available_mib()
    return available is None or available >= (MEMORY_GROWTH - 1) * loaded_mib + MEMORY_GROWTH * largest_mib


def _start(run: EngineRun, work: Path, tokens: int, threads: int, peer_python: str | None,
           unavailable: dict[str, str] | None, pause: float, echo: Callable[[str], None]) -> _Worker | None:
    """The engine's worker, loaded; None (its run holding why) when it is unavailable or fails to load."""
    if run.engine in (unavailable or {}):
        run.error = unavailable[run.engine]
        echo(f"{run.engine}: skipped, {run.error}")
        return None
    kind = run.engine.split("-")[0]
    backend = (run.ct2_backend or {}).get("backend")
    worker = _Worker(run.engine, _models(work)[kind], threads, tokens, work, peer_python if run.engine == "optimum" else None,
                     pause, {"CT2_USE_MKL": GEMM[backend]} if backend else None)
    if "error" in worker.hello:
        run.error = worker.hello["error"]
        echo(f"{run.engine}: skipped, {run.error}")
        worker.close()
        return None
    run.version, run.threads = worker.hello["version"], worker.hello["threads"]
    if run.ct2_backend is not None:  # what the process that loaded CTranslate2 was given
        run.ct2_backend["CT2_USE_MKL"] = worker.hello.get("CT2_USE_MKL")
    echo(f"{run.engine}: {run.version}; {run.threads}")
    return worker


def _turn(run: EngineRun, worker: _Worker, row: Row, src: list[list[int]], keep: bool, pause: float = PAUSE_S) -> None:
    time.sleep(pause)
    got = worker.run(src, row)
    if "error" in got:
        run.error = got["error"]
        return
    if keep:
        run.seconds.setdefault(row.name, []).append(got["seconds"])
        run.outputs[row.name] = got["outputs"]
        if "how" in got:
            run.how.setdefault(row.name, []).append(got["how"])


def _rate(run: EngineRun | None, row: Row, tokens: int) -> float | None:
    if run is None or run.error or row.name not in run.seconds:
        return None
    return row.sentences * tokens / statistics.median(run.seconds[row.name])


def _same(a: EngineRun | None, b: EngineRun | None, row: Row) -> str:
    if a is None or b is None or row.name not in a.outputs or row.name not in b.outputs:
        return ""
    same = sum(x == y for x, y in zip(a.outputs[row.name], b.outputs[row.name]))
    return f"{same}/{len(a.outputs[row.name])}"


def emitted(run: EngineRun, row: Row) -> str:
    """The output lengths of one engine's row: '32', or '29-32' when the work was not fixed."""
    lengths = [len(o) for o in run.outputs.get(row.name, [])]
    return "" if not lengths else str(lengths[0]) if min(lengths) == max(lengths) else f"{min(lengths)}-{max(lengths)}"


def table(runs: list[EngineRun], rows: tuple[Row, ...], tokens: int) -> str:
    """The markdown table: tokens/s per engine, tk's ratios, the tokens each engine emitted, token identity (each
    ratio and identity where both of its engines are in the run)."""
    by = {r.engine: r for r in runs}
    shown = [e for e in ENGINES if e in by]
    ran = {r.engine for r in runs if not r.error}
    ratios = [r for r in RATIOS if r[1] in ran and r[2] in ran]
    same = [s for s in SAME if s[1] in ran and s[2] in ran]
    ratio = lambda a, b: f"{a / b:.2f}" if a and b else ""  # noqa: E731
    head = ["row", *shown, *(r[0] for r in ratios), "tokens per sentence", *(s[0] for s in same)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        rate = {e: _rate(by.get(e), row, tokens) for e in ENGINES}
        counts = sorted({emitted(by[e], row) for e in shown if emitted(by[e], row)})
        cells = [row.name, *(f"{rate[e]:,.0f}" if rate[e] else "—" for e in shown), *(ratio(rate[a], rate[b]) for _, a, b in ratios),
                 " / ".join(counts), *(_same(by[a], by[b], row) for _, a, b in same)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bench_scale(shape_name: str, work: Path, engines: list[str], tokens: int = 32, threads: int | None = None,
                repeat: int = 3, peer_python: str | None = None, rows: tuple[Row, ...] = ROWS,
                echo: Callable[[str], None] = print, pause: float = PAUSE_S,
                text: Path | None = None, ct2_backend: str = "auto") -> tuple[dict[str, Step], list[EngineRun]]:
    """Prepares the model (once per `work`) and times `engines` on `rows`; returns the preparation steps and the runs.
    `text`: the file the real rows' sentences come from (required by those rows). `pause`: seconds between turns (the
    tests' tiny shapes take none: no thread of theirs spins for long). `ct2_backend`: CTranslate2's CPU backend (auto:
    the faster in a probe, per compute type; engine.choose_gemm)."""
    shape = SHAPES[shape_name]
    check_gemm(ct2_backend)  # before any work
    if tokens + 1 > shape.positions:
        raise UsageError(f"--tokens {tokens} is beyond the model's {shape.positions} positions; give at most {shape.positions - 1}")
    if any(r.real for r in rows) and text is None:
        raise UsageError("the real-sentence rows read their sentences from a file; give --sources FILE")
    threads = threads or cores()  # taskset's or a container's share, not the host's count
    unavailable = {}
    if any(e.startswith("ct2") for e in engines) and not ct2_available():
        # Its own conversion cannot run either: the other engines' rows go on.
        unavailable = {e: f"ctranslate2 is not installed for {sys.executable} (pip install 'tk-onnx-deploy[ct2]')"
                       for e in engines if e.startswith("ct2")}
    steps = prepare(shape, work, any(e.startswith("ct2") for e in engines) and not unavailable, echo,
                    int8=any(e.startswith("tk-int8") for e in engines),
                    shortlist=any(e.endswith(("-shortlist", "-vmap")) for e in engines))
    config = json.loads((work / "hf" / "config.json").read_text(encoding="utf-8"))
    src = sources(max(r.sentences for r in rows), 24, shape.vocab, config["eos_token_id"], config["pad_token_id"])
    wanted = max((r.sentences for r in rows if r.real), default=0)
    real = real_sources(text, wanted, work / "tk") if text and wanted else None
    lengths = f"; real sentences of {min(map(len, real))} to {max(map(len, real))} tokens" if real else ""
    echo(f"{shape.name}: {shape.parameters() / 1e6:.1f}M weights; {len(src)} sources of 24 tokens{lengths}; every engine "
         f"decodes exactly {tokens} tokens per sentence; {threads} threads each; median of {repeat} rounds after a warm-up round")
    gemm, chosen = {}, {}  # engine -> its backend; compute type -> the choice (one probe each: fp32 and int8 may differ)
    for e in engines:
        if e.startswith("ct2-") and parse(e)[1] == "cpu" and e not in unavailable:
            compute = COMPUTE[parse(e)[2]]
            if compute not in chosen:
                chosen[compute] = choose_gemm(work / "ct2", [compute], ct2_backend, threads)
                echo(f"ct2 {compute}: {describe_gemm(chosen[compute])}")
            gemm[e] = dict(chosen[compute])
    return steps, run_engines(engines, work, rows, src, tokens, threads, repeat, peer_python, echo, unavailable, pause, real, gemm)
