"""Shared fixtures: the corpus beside the repository, a tiny trained transformer, and its export.

Everything here is built once per test run and never touches the network: with the suite spread over worker processes
(pytest-xdist), the first worker to ask builds a model and the others wait for it and use the same files.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


# The cores this run may use, before a worker narrows itself to one of them (_a_core_per_worker).
RUN_CORES: set[int] | None = None


def _a_core_per_worker() -> None:
    """With one xdist worker per core (the README's and CI's `-n 2` on 2 cores), each worker runs on a core of its own.
    Otherwise every worker's ONNX Runtime sessions take every core (tk's default: the process's cores), their threads
    spinning while the other worker waits for a core. Subprocesses started by a test inherit the core."""
    global RUN_CORES
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity masks (macOS, Windows)
        return
    RUN_CORES = set(allowed)
    if worker.startswith("gw") and count > 1 and count == len(allowed):
        os.sched_setaffinity(0, {allowed[int(worker[2:]) % count]})


_a_core_per_worker()


@contextmanager
def on_every_core() -> Iterator[None]:
    """Processes started inside the block may run on every core of the run, not only this worker's: a Ray instance is a
    dozen processes (GCS, raylets, agents, controller, replicas) whose starts and redeploys queue behind each other on
    one core: tests/serve/test_serve_ray.py beside a core kept busy took 177 s with Ray on one core, 121 s on both.
    Linux sets a thread's mask: the calling thread's is widened for the block and put back, and what it starts
    meanwhile keeps the wide one."""
    if RUN_CORES is None:
        yield
        return
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, RUN_CORES)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)

# The files of fewest tests and most seconds (2-core AVX2 EPYC, two workers: `pytest -n 2 --dist loadfile --durations=50`),
# longest first. With --dist loadfile a file runs whole on one worker, and xdist hands files out most tests first, so
# these came out among the last and one of them could run alone while the other worker had nothing left. Handed out
# first instead, the hundred short files after them even out where the two workers end.
LONG_FILES = ("serve/test_serve_ray.py", "pytorch/test_textbook_adapters.py", "test_readme.py", "pytorch/test_hf_t5.py",
              "verify/test_verify.py", "pytorch/test_hf_marian.py", "bench/test_scale_bench.py", "corpus/test_corpus.py",
              "pytorch/test_hf_marian_family.py", "bench/test_scale_work_dir.py")


def pytest_configure(config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: the order of pytest_collection_modifyitems below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items) -> None:
    """LONG_FILES first, in their order; then the rest as xdist would order them (most tests first). A file's tests keep
    their own order."""
    tests = Path(__file__).parent
    per_file = Counter(item.path for item in items)

    def rank(item) -> tuple[int, int]:
        name = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        return (LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES), -per_file[item.path])

    items.sort(key=rank)


@pytest.fixture(scope="session", autouse=True)
def user_cache(tmp_path_factory) -> Path:
    """tk's start-up cache (toolkit.core.load_cache) goes to a fresh directory, not the user's, for every test run
    (set in the environment, so subprocesses started by tests use it too)."""
    path = tmp_path_factory.mktemp("user-cache")
    previous = os.environ.get("TK_CACHE_DIR")
    os.environ["TK_CACHE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("TK_CACHE_DIR", None)
    else:
        os.environ["TK_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def corpus_zip() -> Path:
    path = Path(os.environ.get("TK_DATA", SHARED_DATA / "fra-eng.zip"))
    assert path.is_file(), f"tests need the corpus at {path} (../shared/data/fra-eng.zip or $TK_DATA)"
    return path


@pytest.fixture(scope="session")
def challenge_test() -> Path:
    return SHARED_DATA / "tatoeba-test-eng-fra.txt"


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name`, made by `build(folder)` once per test run: by this process, or by whichever xdist worker
    asked first (the others wait on a lock and reuse it). Tests copy what they change, as they always have."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this run
    folder, done = root / f"shared-{name}", root / f"shared-{name}.done"
    with _own_time_limit(name), FileLock(str(root / f"shared-{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            build(folder)
            done.touch()
    return folder


# A shared build (or the wait for another worker's) may take minutes on a loaded 2-core machine; it has this limit
# of its own instead of eating the time limit of the test that happened to ask first.
SHARED_BUILD_LIMIT_S = 600


@contextmanager
def _own_time_limit(name: str) -> Iterator[None]:
    """Runs the block under SHARED_BUILD_LIMIT_S, then gives the asking test back the time it had left.
    pytest-timeout's signal method arms ITIMER_REAL for each test; its handler fails the test when it fires."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    left, _ = signal.getitimer(signal.ITIMER_REAL)
    if left <= 0:  # no limit armed (pytest-timeout off): nothing to lend
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, SHARED_BUILD_LIMIT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, left)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, corpus_zip) -> Path:
    """A transformer trained for a few seconds on a few hundred pairs: real tokenizer, real sentences."""
    from toolkit.pytorch.train import TrainOptions, train

    def build(out: Path) -> None:
        train(TrainOptions(model="transformer", out=out, data=str(corpus_zip), preset="tiny", epochs=8, seed=0),
              echo=lambda m: None)

    return built_once(tmp_path_factory, "tiny-run", build) / "checkpoint.pt"


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory, tiny_checkpoint) -> Path:
    from toolkit.pytorch.export import ExportOptions, export

    def build(out: Path) -> None:
        export(ExportOptions(out=out / "transformer", checkpoint=str(tiny_checkpoint)), echo=lambda m: None)

    return built_once(tmp_path_factory, "tiny-export", build) / "transformer"


@pytest.fixture(scope="session")
def random_export(tmp_path_factory):
    """Exports a registry model with small random weights, once per model per session."""
    from toolkit.pytorch.export import ExportOptions, export

    def get(name: str) -> Path:
        return built_once(tmp_path_factory, f"random-{name}",
                          lambda out: export(ExportOptions(out=out / name, model=name, random_init=True), echo=lambda m: None)) / name

    return get


@pytest.fixture()
def tiny_bench_work(tmp_path_factory, tmp_path) -> Path:
    """A copy of `tk bench --scale tiny`'s work directory with every step prepared (the model in every form the engines
    read: 20 s of exports and conversions), made once per run; the copy is the test's own to run the bench in."""
    from toolkit.bench import scale

    def build(out: Path) -> None:
        scale.prepare(scale.SHAPES["tiny"], out / "work", ct2=True, echo=lambda m: None, int8=True, shortlist=True)

    work = tmp_path / "work"
    shutil.copytree(built_once(tmp_path_factory, "bench-tiny", build) / "work", work)
    return work


@pytest.fixture()
def cli():
    """Runs `tk ...` in-process; returns the click Result (stderr mixed into output)."""
    from click.testing import CliRunner

    from toolkit.cli import main

    runner = CliRunner()
    return lambda *args: runner.invoke(main, [str(a) for a in args])


@pytest.fixture()
def assert_torch_free():
    """Runs `tk ARGS...` in a fresh interpreter; asserts it succeeded without importing torch."""
    import subprocess
    import sys

    def run(*argv) -> None:
        code = (
            "import sys\n"
            "from toolkit.cli import main\n"
            f"sys.argv = ['tk', *{[str(a) for a in argv]!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "print('torch-free')\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().endswith("torch-free")

    return run


@pytest.fixture()
def cuda_falls_back(monkeypatch):
    """ONNX Runtime as it behaves where its CUDA provider cannot load: every session quietly runs on CPU."""
    import onnxruntime as ort

    from toolkit.runtimes.onnxruntime import sessions

    real = ort.InferenceSession

    def cpu_only(path, options=None, providers=None, **kwargs):
        return real(path, options, providers=["CPUExecutionProvider"], **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", cpu_only)
    monkeypatch.setattr(sessions, "_cuda_probe", None)


@pytest.fixture(scope="module")
def french():
    """The shipped Transformer (English to French), opened as the server and as the Python API open it."""
    from toolkit.deploy.api import Translator
    from toolkit.deploy.translate import open_model

    directory = REPO / "exported" / "transformer"
    return open_model(directory, "cpu"), Translator(directory, provider="cpu", variant="fp32")


@pytest.fixture(scope="module")
def german():
    """The shipped GRU model, which the serve tests state as another pair (it translates into French too, differently)."""
    from toolkit.deploy.api import Translator
    from toolkit.deploy.translate import open_model

    directory = REPO / "exported" / "seq2seq"
    return open_model(directory, "cpu"), Translator(directory, provider="cpu", variant="fp32")


@pytest.fixture(scope="module")
def ray_address():
    """Ray starts in seconds, not milliseconds: one local instance for a module, and its address for subprocesses."""
    import logging

    ray = pytest.importorskip("ray", reason="the ray extra: pip install 'tk-onnx-deploy[ray]'")
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    if ray.is_initialized():  # a Ray another module's test left in this worker process: this module's own instead
        ray.shutdown()
    with on_every_core():
        ctx = ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield ctx.address_info["gcs_address"]
    ray.shutdown()
