"""Shared fixtures: the corpus beside the repository, a tiny trained transformer, and its export.

Everything here is built once per test session and never touches the network.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


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


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, corpus_zip) -> Path:
    """A transformer trained for a few seconds on a few hundred pairs: real tokenizer, real sentences."""
    from toolkit.pytorch.train import TrainOptions, train

    out = tmp_path_factory.mktemp("tiny-run")
    train(TrainOptions(model="transformer", out=out, data=str(corpus_zip), preset="tiny", epochs=8, seed=0),
          echo=lambda m: None)
    return out / "checkpoint.pt"


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory, tiny_checkpoint) -> Path:
    from toolkit.pytorch.export import ExportOptions, export

    out = tmp_path_factory.mktemp("tiny-export") / "transformer"
    export(ExportOptions(out=out, checkpoint=str(tiny_checkpoint)), echo=lambda m: None)
    return out


@pytest.fixture(scope="session")
def random_export(tmp_path_factory):
    """Exports a registry model with small random weights, once per model per session."""
    from toolkit.pytorch.export import ExportOptions, export

    root = tmp_path_factory.mktemp("random-exports")
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = export(ExportOptions(out=root / name, model=name, random_init=True), echo=lambda m: None)
        return cache[name]

    return get


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
    from toolkit.runtimes import onnxruntime as runtime
    from toolkit.runtimes.onnxruntime import sessions

    real = runtime.ort.InferenceSession

    def cpu_only(path, options=None, providers=None, **kwargs):
        return real(path, options, providers=["CPUExecutionProvider"], **kwargs)

    monkeypatch.setattr(runtime.ort, "InferenceSession", cpu_only)
    monkeypatch.setattr(sessions, "_cuda_probe", None)
