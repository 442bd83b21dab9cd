"""The training recipe of the shipped models: noise per epoch, checkpoint averaging, the GRU's schedule."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolkit.core.noise import NoiseConfig
from toolkit.core.tokenizer import Tokenizer
from toolkit.pytorch import checkpoint
from toolkit.pytorch.epoch_data import EpochData
from toolkit.pytorch.train import Schedule, TrainOptions, train

SHIPPED_TOKENIZER = Path(__file__).resolve().parents[2] / "exported" / "transformer" / "tokenizer.model"


def test_each_epoch_gets_its_own_seeded_noise():
    pairs = [("Tom is 30 years old.", "Tom a 30 ans."), ("Where is the station?", "Où est la gare ?")] * 40
    tok = Tokenizer.load(SHIPPED_TOKENIZER)
    noisy, again = EpochData(pairs, tok, 64, NoiseConfig(), seed=0), EpochData(pairs, tok, 64, NoiseConfig(), seed=0)
    try:
        assert noisy.examples(0) == again.examples(0)  # a resumed run sees the same batches
        assert noisy.examples(1) != noisy.examples(0)
        clean = tok.encode([en for en, _ in pairs])
        assert [s for s, _ in noisy.examples(0)] != clean
    finally:
        noisy.close()
        again.close()
    fixed = EpochData(pairs, tok, 64, None, seed=0)
    assert [s for s, _ in fixed.examples(3)] == clean


def test_placeholder_symbols_are_single_pieces_of_the_shipped_tokenizer():
    tok = Tokenizer.load(SHIPPED_TOKENIZER)
    ids = tok.encode(["Call ⦅0⦆ at ⦅1⦆."])[0]
    assert tok.sp.piece_to_id("⦅0⦆") in ids and tok.sp.piece_to_id("⦅1⦆") in ids
    assert tok.decode([ids]) == ["Call ⦅0⦆ at ⦅1⦆."]


def test_plateau_schedule_halves_the_rate_and_stops_early():
    s = Schedule("plateau", 1e-3, warmup=10, patience=2)
    state = {"epoch": 0}
    assert s.lr(5, state) == pytest.approx(5e-4) and s.lr(100, state) == pytest.approx(1e-3)
    assert not s.after_epoch(2.0, state)
    state["epoch"] = 1
    assert not s.after_epoch(2.5, state) and s.lr(100, state) == pytest.approx(5e-4)
    state["epoch"] = 2
    assert s.after_epoch(2.1, state) and state["best_epoch"] == 1


@pytest.mark.slow
def test_checkpoint_holds_the_mean_of_the_last_epochs_and_resumes_from_the_live_weights(corpus_zip, tmp_path):
    out = tmp_path / "run"
    train(TrainOptions(model="transformer", out=out, data=str(corpus_zip), preset="tiny", epochs=3, noise=True,
                       overrides={"average_last": 2}), echo=lambda m: None)
    ck = checkpoint.load(out)
    epochs = [torch.load(out / f"weights-epoch00{e}.pt", weights_only=True) for e in (2, 3)]
    name = "encoder_blocks.0.ffn.dense1.weight"
    assert torch.allclose(ck["state_dict"][name], (epochs[0][name] + epochs[1][name]) / 2)
    assert torch.equal(ck["train_state_dict"][name], epochs[1][name])
    assert ck["progress"]["final_weights"] == "mean of epochs 2-3"
    assert ck["train"]["noise"] == NoiseConfig().asdict() and ck["train"]["recipe"]["average_last"] == 2
    assert not (out / "weights-epoch001.pt").exists()


def test_tied_gru_projects_through_its_embedding():
    from toolkit.models.seq2seq import Seq2SeqAttention, Seq2SeqConfig

    tied = Seq2SeqAttention(Seq2SeqConfig(vocab_size=50, embed_size=16, num_hiddens=16, num_layers=1, tie_embeddings=True)).eval()
    untied = Seq2SeqAttention(Seq2SeqConfig(vocab_size=50, embed_size=16, num_hiddens=16, num_layers=1)).eval()
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == 16 * 50
    src, lens = torch.tensor([[4, 5, 6]]), torch.tensor([3])
    before = tied(src, lens, torch.tensor([[2, 7]]))
    with torch.no_grad():
        tied.encoder.embedding.weight[9] += 1.0  # token 9 never appears in the input
    assert not torch.allclose(before[..., 9], tied(src, lens, torch.tensor([[2, 7]]))[..., 9])
    with pytest.raises(ValueError, match="embed_size == num_hiddens"):
        Seq2SeqAttention(Seq2SeqConfig(embed_size=8, num_hiddens=16, tie_embeddings=True))


def test_resuming_a_finished_run_drops_its_stale_metrics(corpus_zip, tmp_path):
    out = tmp_path / "run"
    train(TrainOptions(model="transformer", out=out, data=str(corpus_zip), preset="tiny", epochs=1), echo=lambda m: None)
    assert checkpoint.load(out)["metrics"]
    # Continue for more epochs but stop at once: the checkpoint is mid-training, with no final metrics.
    train(TrainOptions(model="transformer", out=out, data=str(corpus_zip), preset="tiny", epochs=3, resume=True,
                       max_minutes=1e-6), echo=lambda m: None)
    ck = checkpoint.load(out)
    assert ck["metrics"] == {} and "final_weights" not in ck["progress"]
