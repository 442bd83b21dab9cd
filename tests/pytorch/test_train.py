"""`tk train` end to end through the CLI: checkpoints, resume, Ctrl-C, and one-line errors for bad input."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

import toolkit.pytorch.train
from toolkit.cli import main
from toolkit.core import data
from toolkit.pytorch import checkpoint

# Minutes of work in all: left out of the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

CORPUS_ZIP = Path(os.environ.get("TK_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data" / "fra-eng.zip")
# The tiny preset on one thread, so the tests stay quick and leave the other core alone.
TINY = ["--preset", "tiny", "--data", str(CORPUS_ZIP), "--threads", "1"]


def tk(*args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_usage_error(result, *fragments: str) -> str:
    """Exit 2 through SystemExit, with one 'error: ...' line and no traceback."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def assert_only_checkpoint(out: Path) -> None:
    """No temporary files (*.tmp, partial downloads, write probes) left in the run directory;
    history.json (the per-epoch record `tk plot` draws) and the last epoch's weights (kept for
    checkpoint averaging) once an epoch has finished."""
    kept = {"history.json"} | {p.name for p in out.glob("weights-epoch[0-9][0-9][0-9].pt")}
    assert sorted(p.name for p in out.iterdir() if p.name not in kept) == ["checkpoint.pt"]


def count_calls(monkeypatch, should_interrupt):
    """Wraps the training loss so that it raises KeyboardInterrupt when should_interrupt(n, eps) is true."""
    original = toolkit.pytorch.train.label_smoothed_nll
    calls = {"n": 0}

    def wrapper(log_probs, target, eps):
        calls["n"] += 1
        if should_interrupt(calls["n"], eps):
            raise KeyboardInterrupt
        return original(log_probs, target, eps)

    monkeypatch.setattr(toolkit.pytorch.train, "label_smoothed_nll", wrapper)
    return calls


# ---- kernel regression --------------------------------------------------------------------------


def test_train_nw_learns_a_better_kernel(tmp_path):
    out = tmp_path / "nw"
    result = tk("train", "nw", "--out", out)
    assert result.exit_code == 0, result.output
    assert "test MSE" in result.output
    assert_only_checkpoint(out)
    ckpt = checkpoint.load(out / "checkpoint.pt")
    assert ckpt["model"] == "nw"
    metrics = ckpt["metrics"]
    assert metrics["test_mse"] < metrics["test_mse_nonparametric"]
    assert metrics["w"] != 1.0
    # The checkpoint rebuilds the learned model.
    _, _, model = checkpoint.build_model(ckpt)
    assert model.w.item() == pytest.approx(metrics["w"])


# ---- tiny transformer ---------------------------------------------------------------------------


def test_train_tiny_transformer_learns(tmp_path):
    out = tmp_path / "run"
    result = tk("train", "transformer", *TINY, "--out", out, "--epochs", 6)
    assert result.exit_code == 0, result.output
    assert "valid BLEU" in result.output
    assert_only_checkpoint(out)
    ckpt = checkpoint.load(out)
    history = ckpt["progress"]["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3, 4, 5, 6]
    assert history[-1]["valid_loss"] < history[0]["valid_loss"]
    metrics = ckpt["metrics"]
    assert {"valid_loss", "valid_bleu", "valid_chrf"} <= set(metrics)
    # Final metrics are of the final weights (the last epoch's: the tiny preset averages one epoch),
    # and the greedy translations behind BLEU/chrF are not empty.
    assert metrics["valid_loss"] == pytest.approx(history[-1]["valid_loss"], rel=1e-6)
    assert metrics["valid_chrf"] > 0.0
    # Provenance: which data, which split, which tokenizer.
    assert ckpt["data"]["sha256"] == data.CORPUS_SHA256
    assert ckpt["tokenizer"] and ckpt["config"]["vocab_size"] > 0
    _, cfg, model = checkpoint.build_model(ckpt)
    assert cfg.num_layers == 2 and not model.training


def test_resume_continues_where_it_stopped(tmp_path):
    out = tmp_path / "run"
    args = ("train", "transformer", *TINY, "--out", out, "--epochs", 2)
    stopped = tk(*args, "--max-minutes", 0.001)
    assert stopped.exit_code == 0, stopped.output
    assert "--resume" in stopped.output
    assert_only_checkpoint(out)
    first = checkpoint.load(out)
    step = first["progress"]["step"]
    assert step >= 1
    assert len(first["progress"]["history"]) < 2
    assert first["metrics"] == {}

    resumed = tk(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "valid BLEU" in resumed.output
    final = checkpoint.load(out)
    assert final["progress"]["step"] > step
    assert [h["epoch"] for h in final["progress"]["history"]] == [1, 2]
    assert "valid_bleu" in final["metrics"]
    assert_only_checkpoint(out)

    again = tk(*args)
    assert_usage_error(again, "--resume", str(out / "checkpoint.pt"))
    assert checkpoint.load(out)["progress"]["step"] == final["progress"]["step"]


def test_resumed_run_equals_an_uninterrupted_one(tmp_path):
    """Stopping and resuming must not skip or repeat batches: same steps, same losses."""
    args = ("train", "transformer", *TINY, "--epochs", 1, "--precision", "fp32")
    straight = tk(*args, "--out", tmp_path / "straight")
    assert straight.exit_code == 0, straight.output
    assert tk(*args, "--out", tmp_path / "split", "--max-minutes", 0.001).exit_code == 0
    assert tk(*args, "--out", tmp_path / "split", "--resume").exit_code == 0
    a, b = checkpoint.load(tmp_path / "straight"), checkpoint.load(tmp_path / "split")
    assert b["progress"]["step"] == a["progress"]["step"]
    assert b["progress"]["history"][0]["valid_loss"] == pytest.approx(a["progress"]["history"][0]["valid_loss"], rel=1e-4)


def test_ctrl_c_saves_a_checkpoint_that_resumes(tmp_path, monkeypatch):
    out = tmp_path / "run"
    args = ("train", "transformer", *TINY, "--out", out, "--epochs", 1)
    count_calls(monkeypatch, lambda n, eps: n == 3)
    result = tk(*args)
    assert result.exit_code == 130, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert "checkpoint saved" in result.output and "--resume" in result.output
    assert_only_checkpoint(out)
    ckpt = checkpoint.load(out / "checkpoint.pt")
    # Two whole batches were done; the interrupted third is not counted.
    assert ckpt["progress"]["step"] == 2

    monkeypatch.undo()
    resumed = tk(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert checkpoint.load(out)["progress"]["step"] > 2


def test_ctrl_c_during_validation_resumes(tmp_path, monkeypatch):
    """Interrupted after an epoch's last batch, while computing the validation loss."""
    out = tmp_path / "run"
    args = ("train", "transformer", *TINY, "--out", out, "--epochs", 1)
    count_calls(monkeypatch, lambda n, eps: eps == 0.0)  # evaluate_loss is the only caller without smoothing
    result = tk(*args)
    assert result.exit_code == 130, result.output
    assert "checkpoint saved" in result.output
    interrupted = checkpoint.load(out)
    assert interrupted["progress"]["history"] == []

    monkeypatch.undo()
    resumed = tk(*args, "--resume")
    assert resumed.exit_code == 0, f"{resumed.output}\n{resumed.exception!r}"
    final = checkpoint.load(out)
    assert final["progress"]["step"] == interrupted["progress"]["step"]  # no batch trained twice
    assert [h["epoch"] for h in final["progress"]["history"]] == [1]
    assert "valid_bleu" in final["metrics"]


# ---- bad input ----------------------------------------------------------------------------------


def test_unknown_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = tk("train", "bogus")
    line = assert_usage_error(result, "unknown model 'bogus'; choose one of: ")
    for name in ("nw", "seq2seq", "transformer"):
        assert name in line
    assert result.output.strip() == line
    assert not (tmp_path / "runs").exists()  # nothing created for a model that does not exist


def test_missing_data_file(tmp_path):
    missing = tmp_path / "no" / "fra-eng.zip"
    result = tk("train", "transformer", "--preset", "tiny", "--data", missing, "--out", tmp_path / "run")
    assert_usage_error(result, str(missing))
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_corrupt_data_file(tmp_path):
    corrupt = tmp_path / "fra-eng.zip"
    corrupt.write_bytes(random.Random(0).randbytes(4096))
    result = tk("train", "transformer", "--preset", "tiny", "--data", corrupt, "--out", tmp_path / "run")
    assert_usage_error(result, str(corrupt))
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


@pytest.mark.parametrize("model", ["nw", "transformer"])
def test_unwritable_out_dir(tmp_path, model):
    blocker = tmp_path / "file"
    blocker.write_text("a regular file, not a directory")
    out = blocker / "run"
    result = tk("train", model, "--preset", "tiny", "--data", CORPUS_ZIP, "--out", out)
    assert_usage_error(result, str(out), "--out")


def test_resume_without_checkpoint(tmp_path):
    out = tmp_path / "run"
    result = tk("train", "transformer", *TINY, "--out", out, "--resume")
    assert_usage_error(result, str(out / "checkpoint.pt"))


def test_resume_of_another_model(tmp_path):
    out = tmp_path / "run"
    assert tk("train", "nw", "--out", out).exit_code == 0
    result = tk("train", "transformer", *TINY, "--out", out, "--resume")
    assert_usage_error(result, "'nw'", "'transformer'")


def test_bad_set_override(tmp_path):
    result = tk("train", "transformer", *TINY, "--out", tmp_path / "run", "--set", "num_layers")
    assert result.exit_code == 2
    assert "KEY=VALUE" in result.output and "Traceback" not in result.output


def test_sigterm_saves_a_checkpoint_and_exits_130(tmp_path):
    """A scheduler's SIGTERM (or `kill`) stops training like Ctrl-C: checkpoint first."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "train", "transformer", "--preset", "tiny", "--data", str(CORPUS_ZIP),
                             "--out", str(out), "--epochs", "500"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "checkpoint.pt").exists():  # the first epoch has ended
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "checkpoint saved" in output and "--resume" in output
    from toolkit.pytorch import checkpoint

    assert checkpoint.load(out / "checkpoint.pt")["progress"]["step"] > 0


# ---- --set, the GRU seq2seq, pre-LN export, the schedule and the loss -----------------------------

@pytest.mark.parametrize("model,extra,key,value", [
    ("transformer", ["--pre-ln"], "num_layers", 1),
    ("seq2seq", [], "num_hiddens", 24),
], ids=["pre-ln-transformer", "gru-seq2seq"])
def test_set_takes_effect_and_the_model_trains_exports_and_verifies(tmp_path, model, extra, key, value):
    out = tmp_path / model
    result = tk("train", model, *TINY, *extra, "--out", out, "--epochs", 1, "--limit-pairs", 64, "--set", f"{key}={value}")
    assert result.exit_code == 0, result.output
    ckpt = checkpoint.load(out)
    _, cfg, _ = checkpoint.build_model(ckpt)
    assert getattr(cfg, key) == value  # the override reached the model that was trained
    assert getattr(cfg, "pre_ln", False) == ("--pre-ln" in extra)
    assert 0 < ckpt["metrics"]["valid_loss"] < float("inf")
    exported = tmp_path / "exported"
    assert tk("export", out / "checkpoint.pt", "--out", exported).exit_code == 0
    verified = tk("verify", exported, "--sentences", 2)
    assert verified.exit_code == 0, verified.output
    assert "translation" in verified.output and "FAIL" not in verified.output


def test_learning_rate_warms_up_linearly_then_decays_as_inverse_square_root():
    peak, warmup = 1e-3, 100
    assert toolkit.pytorch.train.lr_at(1, peak, warmup) == pytest.approx(peak / warmup)
    assert toolkit.pytorch.train.lr_at(50, peak, warmup) == pytest.approx(peak / 2)
    assert toolkit.pytorch.train.lr_at(warmup, peak, warmup) == pytest.approx(peak)
    assert toolkit.pytorch.train.lr_at(4 * warmup, peak, warmup) == pytest.approx(peak / 2)
    assert toolkit.pytorch.train.lr_at(0, peak, warmup) == toolkit.pytorch.train.lr_at(1, peak, warmup)  # step 0 is not a zero rate


def test_label_smoothed_loss_mixes_the_target_nll_with_the_uniform_one_and_skips_padding():
    import torch

    from toolkit.core.tokenizer import PAD

    log_probs = torch.log_softmax(torch.tensor([[[2.0, 0.0, -1.0, 1.0], [0.5, 0.5, 3.0, -2.0], [1.0, 1.0, 1.0, 1.0]]]), -1)
    target = torch.tensor([[3, 2, PAD]])  # the last position is padding
    nll = -(log_probs[0, 0, 3] + log_probs[0, 1, 2])
    uniform = -(log_probs[0, 0].mean() + log_probs[0, 1].mean())
    loss, plain = toolkit.pytorch.train.label_smoothed_nll(log_probs, target, 0.1)
    assert plain.item() == pytest.approx(nll.item())
    assert loss.item() == pytest.approx((0.9 * nll + 0.1 * uniform).item())
    unsmoothed, _ = toolkit.pytorch.train.label_smoothed_nll(log_probs, target, 0.0)
    assert unsmoothed.item() == pytest.approx(nll.item())
