"""The driver of `tk translate-corpus`: plan, resume, a Ray Data actor pool over the pending shards,
each shard's output written atomically as it arrives, then the ordered merge."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from toolkit.core import reaper, signals
from toolkit.core.atomic import write_atomic
from toolkit.core.decode_options import DecodeOptions
from toolkit.core.errors import ToolkitError, UsageError
from toolkit.corpus import shards
from toolkit.corpus.merge import merge
from toolkit.corpus.progress import Progress
from toolkit.corpus.worker import CRASH_ENV, ShardTranslator
from toolkit.runtimes.registry import DEFAULT as DEFAULT_RUNTIME


@dataclass
class CorpusJob:
    model_dir: str
    inputs: list[str]
    out_dir: Path
    settings: dict  # recorded in the manifest: a rerun with other values is refused
    decode: DecodeOptions  # built (and checked) once, by the command
    text: dict  # toolkit.core.textprep.TextOptions fields
    strict: bool = False
    provider: str = "cpu"
    variant: str = "fp32"
    runtime: str = DEFAULT_RUNTIME  # a name registered in toolkit.runtimes.registry
    workers: int = 1
    threads: int | None = None  # ONNX Runtime threads per actor; None: the node's cores shared by its actors
    shard_lines: int = 8192
    column: str | None = None
    address: str | None = None
    progress_seconds: float = 10.0  # the longest wait between two progress lines while shards run
    # A multilingual model's pair in the model's own codes (source_lang, target_lang; None: its default), checked by the
    # command before Ray starts; in `settings` too, since another pair is another translation.
    languages: dict | None = None


@dataclass
class CorpusResult:
    shards: int
    resumed: int
    failed: list[str]
    lines: int
    merged: Path | None
    seconds: float
    lines_per_s: float


class ShardsFailed(ToolkitError):
    exit_code = 1


def connect(address: str | None):
    """Joins the Ray instance this process already runs, the cluster at `address`, or starts a local one."""
    import ray

    if not ray.is_initialized():
        # Ray's C++ core logs warnings (one per actor about restartable constructor arguments) straight to stderr.
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
        # Ray starts its workers at nice 15, so on a machine shared with other work the actors would get what
        # is left of the CPU (measured here: 45 lines/s against 123 for tk translate -i); run them like tk translate.
        os.environ.setdefault("RAY_worker_niceness", "0")
        _reachable(address)
        if not address:
            reaper.watch_descendants()  # the local instance this starts must not outlive a killed driver
        try:
            with _without_native_line(_RAY_LEVEL_NOTE):
                ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, include_dashboard=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise UsageError(f"cannot reach a Ray cluster at {address} ({str(e).splitlines()[0][:160]}); "
                             "check --address (auto, or ray://HEAD:10001)") from None
        finally:
            signals.claim()  # ray.init's own SIGTERM handler exits 15 at once, skipping tk's clean-up
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # tk prints its own progress, one line per shard
    ctx.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    return ray


CONNECT_TIMEOUT_S = 5.0
# Ray's C++ core announces, at every start, the log level it read from RAY_BACKEND_LOG_LEVEL: the one line of its own
# that the setting above cannot silence.
_RAY_LEVEL_NOTE = re.compile(rb"^\[[^\]]*\] logging\.cc:\d+: Set ray log level from environment variable")


@contextlib.contextmanager
def _without_native_line(drop: re.Pattern[bytes]) -> Iterator[None]:
    """Runs the block with the process's stderr (file descriptor 2, where C++ code writes) caught in a file, then writes
    everything caught back to stderr except the lines matching `drop`: an error the block prints is never lost."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = b"".join(line for line in caught if not drop.match(line))
            if kept:
                os.write(2, kept)


def _reachable(address: str | None) -> None:
    """A HOST:PORT address is tried once before Ray is: Ray retries an unreachable one for minutes."""
    if not address or address == "auto" or address.startswith("local"):
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--address {address} is not auto, HOST:PORT or ray://HOST:PORT; check it")
    import socket

    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        why = f"no answer within {CONNECT_TIMEOUT_S:.0f} s" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise UsageError(f"cannot reach a Ray cluster at {address} ({why}); "
                         "check --address (auto, or ray://HEAD:10001) and that the cluster is up") from None


def threads_per_actor(ray, workers: int, provider: str) -> int:
    """Spreads each node's cores over the actors it will hold, so actors x threads never oversubscribes a node."""
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU")]
    if not nodes:
        return 1
    cores = min(int(n["Resources"]["CPU"]) for n in nodes)
    per_node = -(-workers // len(nodes))
    return max(1, cores // per_node)


def translate_corpus(job: CorpusJob, say: Callable[[str], None] = lambda m: None) -> CorpusResult:
    import time

    from toolkit.corpus.inputs import find_sources

    sources = find_sources(job.inputs, job.column)
    if job.out_dir.exists() and not job.out_dir.is_dir():
        raise UsageError(f"OUTPUT_DIR {job.out_dir} is a file; give a directory")
    p = shards.plan(sources, job.settings, job.shard_lines)
    resumed = shards.resume(p, job.out_dir)
    (job.out_dir / shards.SHARD_DIR).mkdir(parents=True, exist_ok=True)  # the shards are written atomically into it
    shards.save(p, job.out_dir)
    pending = [s for s in p.shards if s.status != "done"]
    say(f"{len(sources)} input file(s), {p.total_lines:,} lines in {len(p.shards)} shards of {job.shard_lines:,}; "
        f"{resumed} already done" + (f", {len(pending)} to translate" if pending else ""))
    start = time.perf_counter()
    progress = Progress(len(p.shards), p.total_lines, resumed, sum(s.lines for s in p.shards if s.status == "done"), say,
                        every=job.progress_seconds)
    if pending:
        _run_pool(job, p, pending, progress, say)
    seconds = time.perf_counter() - start
    failed = [s for s in p.shards if s.status == "failed"]
    result = CorpusResult(len(p.shards), resumed, [f"{s.describe(sources)}: {s.error}" for s in failed], p.total_lines,
                          None, seconds, progress.rate())
    if failed:
        for line in result.failed:
            say(f"failed: {line}")
        raise ShardsFailed(f"{len(failed)} of {len(p.shards)} shards failed (first: {result.failed[0]}); "
                           f"fix the input and rerun the same command: the {len(p.shards) - len(failed)} done shards are kept")
    result.merged, lines = merge(p, job.out_dir)
    if job.decode.n_best == 1 and lines != p.total_lines:
        raise ShardsFailed(f"{result.merged} has {lines} lines for {p.total_lines} input lines; rerun in a new OUTPUT_DIR")
    return result


def worker_count(requested: int, pending: list[shards.Shard], shard_lines: int, resuming: bool) -> tuple[int, str | None]:
    """The actors to start, at most one per pending shard (a shard is one actor's work), and, when that is fewer than
    --workers asked for, the one line that says so and, on a fresh run, the shard size that gives every worker one."""
    workers = min(requested, len(pending))
    if workers == requested:
        return workers, None
    shards_left = f"{len(pending)} shard{'s' if len(pending) != 1 else ''}"
    runs = f"{workers} worker{' runs' if workers == 1 else 's run'}"
    if resuming:
        return workers, f"note: --workers {requested}, but {shards_left} {'is' if len(pending) == 1 else 'are'} left to translate, so {runs}"
    lines = sum(s.lines for s in pending)
    fix = f"; --shard-lines {-(-lines // requested):,} into a new OUTPUT_DIR gives each worker a shard" if lines >= requested else ""
    return workers, f"note: --workers {requested}, but the input is {shards_left} (--shard-lines {shard_lines:,}), so {runs}{fix}"


def _run_pool(job: CorpusJob, p: shards.Plan, pending: list[shards.Shard], progress: Progress, say: Callable[[str], None]) -> None:
    workers, note = worker_count(job.workers, pending, job.shard_lines, resuming=len(pending) < len(p.shards))
    if note:  # said before Ray's start, which takes seconds
        say(note)
    ray = connect(job.address)
    threads = job.threads or threads_per_actor(ray, workers, job.provider)
    resources = {"num_gpus": 1, "num_cpus": 1} if job.provider == "cuda" else {"num_cpus": threads}
    say(f"{workers} worker(s) x {threads} thread(s) on {job.provider}, Ray {ray.__version__}")
    rows = [{"shard": s.id, "path": p.sources[s.source].path, "kind": p.sources[s.source].kind,
             "column": p.sources[s.source].column or "", "first_line": s.first_line, "lines": s.lines, "offset": s.offset,
             "input_sha256": s.input_sha256} for s in pending]
    counter = ray.remote(num_cpus=0)(LineCounter).remote()
    ds = ray.data.from_items(rows, override_num_blocks=len(rows))
    # batch_size=1: a shard per call, so a shard's output reaches the driver (and its file) as soon as it is done.
    ds = ds.map_batches(ShardTranslator, batch_size=1, concurrency=workers, **resources,
                        fn_constructor_kwargs={"model_dir": str(Path(job.model_dir).resolve()), "provider": job.provider,
                                               "variant": job.variant, "runtime": job.runtime, "threads": threads, "decode": job.decode,
                                               "text": job.text, "strict": job.strict, "languages": job.languages,
                                               "crash_once": os.environ.get(CRASH_ENV), "counter": counter})
    by_id = {s.id: s for s in pending}
    watcher = _watch(counter, progress, min(2.0, job.progress_seconds))
    try:
        _collect(ds, by_id, p, job.out_dir, progress)
    except ray.exceptions.RayError as e:
        # Actors are restarted and their shard retried without limit; this is the cluster itself failing.
        done = sum(s.status == "done" for s in p.shards)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ShardsFailed(f"the Ray run stopped ({type(e).__name__}: {first}); rerun the same command to resume "
                           f"({done} of {len(p.shards)} shards are done and kept)") from None
    finally:
        watcher.set()
        ray.kill(counter)


class LineCounter:
    """Lines translated by every worker of a run, so the driver can report progress inside shards."""

    def __init__(self):
        self.lines = 0

    def add(self, lines: int) -> None:
        self.lines += lines

    def total(self) -> int:
        return self.lines


def _watch(counter, progress: Progress, every: float = 2.0):
    """A daemon thread that polls the counter and passes it to progress; set the returned event to stop it."""
    import threading

    import ray

    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(every):
            try:
                progress.translating(ray.get(counter.total.remote(), timeout=every))
            except Exception:  # progress is best effort; the run's own errors surface in _collect
                continue

    threading.Thread(target=poll, name="tk-corpus-progress", daemon=True).start()
    return stop


def _collect(ds, by_id: dict[int, shards.Shard], p: shards.Plan, out_dir: Path, progress: Progress) -> None:
    """Writes each shard's output as it arrives, then records it in the manifest."""
    for row in ds.iter_rows():
        s = by_id[int(row["shard"])]
        if row["status"] == "done":
            data = str(row["text"]).encode("utf-8")
            write_atomic(out_dir / s.output_name, data)
            s.status, s.output_sha256, s.error = "done", hashlib.sha256(data).hexdigest(), None
            for note in filter(None, str(row["error"]).split("\n")):  # lines tk failed on: a fallback's or an empty output
                progress.say(f"warning: {note}")
        else:
            s.status, s.error = "failed", str(row["error"])
        shards.save(p, out_dir)
        progress.shard_finished(s.lines, failed=s.status == "failed")
