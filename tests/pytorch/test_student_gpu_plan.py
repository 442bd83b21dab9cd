"""The student trained on a rented GPU in two timed steps within the rental's minutes (tools/student_gpu.py), and the
training options that make it fast (toolkit/pytorch/train.py): larger batches with the rate scaled, batches built on
the device, a torch.compile'd step, epochs tokenized ahead, a time box that ends the run in time. All on the CPU at
toy size."""

from __future__ import annotations

import importlib.util
import math
import random
import zipfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from toolkit.models.transformer import Transformer, TransformerConfig

import toolkit.pytorch.train as train_module
from toolkit.cli import main
from toolkit.core import data
from toolkit.core.errors import UsageError
from toolkit.core.noise import NoiseConfig
from toolkit.core.tokenizer import Tokenizer
from toolkit.pytorch import checkpoint
from toolkit.pytorch.epoch_data import EpochData
from toolkit.pytorch.train import (
    EpochTensors,
    PreparedEpochs,
    RunningLoss,
    TrainStep,
    batch_recipe,
    epochs_key,
    label_smoothed_nll,
    lr_at,
    time_boxed_epochs,
    to_tensors,
    write_prepared_epoch,
)

# Minutes of work in all: left out of the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "exported" / "transformer" / "tokenizer.model"


def _student_gpu():
    spec = importlib.util.spec_from_file_location("student_gpu", REPO / "tools" / "student_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


student_gpu = _student_gpu()


# ---- the plan fits the rental by construction -------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_the_two_steps_fit_the_rental_with_the_start_and_the_wait():
    plan = student_gpu.schedule()
    calls = (student_gpu.CALL1, student_gpu.CALL2)
    assert len(calls) == len(plan["calls"]) == 2
    assert all(c.minutes <= student_gpu.CALL_MAX_MIN and c.timeout_s <= 600 for c in calls)
    total = student_gpu.START_MIN + sum(c.minutes for c in calls) + student_gpu.WARM_GAP_MIN
    assert plan["total_min"] == pytest.approx(total) and total <= student_gpu.PLAN_MAX_MIN <= 12 and plan["fits"]
    assert student_gpu.START_MIN >= 2 and student_gpu.WARM_GAP_MIN >= 0.5  # a start of minutes, the warm machine's 30 s
    # After call 1 a fresh machine could still start (the rule: none with under 4 minutes left).
    assert plan["left_after_call1_min"] >= student_gpu.NO_START_BELOW_MIN
    # Training's time box sits inside call 1 with the work around it, and the call's timeout covers the sum.
    assert student_gpu.CALL1.step("train") < student_gpu.CALL1.minutes and student_gpu.CALL1.timeout_s >= 60 * student_gpu.CALL1.minutes
    # A plan of three calls, or a longer one, is refused.
    assert not student_gpu.schedule((student_gpu.CALL1, student_gpu.CALL1, student_gpu.CALL2))["fits"]


@pytest.mark.timeout(30)
def test_the_run_calls_are_short_commands_and_call2_carries_nothing():
    calls = student_gpu.run_calls()
    assert [c["timeout_s"] for c in calls] == [student_gpu.CALL1.timeout_s, student_gpu.CALL2.timeout_s]
    assert all(len(c["command"]) < 2000 and "$OUT" in c["command"] and "pipefail" in c["command"] for c in calls)
    assert "tools/student_gpu.py call1" in calls[0]["command"] and "tools/student_gpu.py call2" in calls[1]["command"]
    assert str(student_gpu.DATA) in calls[0]["carry"] and len(calls[0]["carry"]) <= 8
    assert calls[1]["carry"] == []  # a carried runs/ path would replace the run call 1 left on the machine
    args = student_gpu.train_args(student_gpu.CALL1.step("train"))
    assert args[args.index("--max-minutes") + 1] == str(student_gpu.CALL1.step("train"))
    assert f"finish_minutes={student_gpu.CALL1.step('train')}" in args and "batch_tokens=24000" in args and "compile=false" in args
    # STUDENT_SET's recipe changes (a longer schedule for a longer box) reach tk train as --set pairs
    changed = student_gpu.train_args(5.5, extra=student_gpu.recipe_changes("epochs=40 average_last=8"))
    assert changed[-4:] == ["--set", "epochs=40", "--set", "average_last=8"] and student_gpu.recipe_changes("") == ()
    fits, line = student_gpu.carry_fits(40 * 2**20, 20 * 2**20)
    assert fits and "60.0 MiB" in line
    assert not student_gpu.carry_fits(40 * 2**20, 25 * 2**20)[0]


# ---- larger batches, the same run per token -------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_batch_tokens_scale_the_rate_by_the_square_root_rule_over_the_same_tokens():
    assert batch_recipe(6000, 1e-3, 2000, None) == (6000, 1e-3, 2000)  # unset: the recipe as it was
    tokens, lr, warmup = batch_recipe(6000, 1e-3, 2000, 24000)
    assert tokens == 24000 and lr == pytest.approx(2e-3) and warmup == 500
    # At every count of tokens seen, the scaled schedule is sqrt(k) times the recipe's (warm-up and decay alike).
    k = 4
    for small_steps in (100, 500, 2000, 2400, 8000, 40000):
        assert lr_at(small_steps // k, lr, warmup) == pytest.approx(math.sqrt(k) * lr_at(small_steps, 1e-3, 2000))


@pytest.mark.timeout(30)
def test_device_batches_are_the_padded_lists_or_pad_further_without_changing_the_loss():
    rng = random.Random(0)
    examples = [([rng.randrange(4, 50) for _ in range(rng.randrange(1, 12))], [rng.randrange(4, 50) for _ in range(rng.randrange(0, 9))])
                for _ in range(40)]
    tensors = EpochTensors(examples, torch.device("cpu"))
    padded = EpochTensors(examples, torch.device("cpu"), pad_multiple=8)
    model = Transformer(TransformerConfig(vocab_size=50, num_hiddens=16, ffn_num_hiddens=32, num_heads=2, num_layers=2, dropout=0.0))
    for idx in data.length_batches(examples, 120, seed=1):
        batch, n_tokens, n_source = tensors.batch(idx)
        expected = to_tensors(examples, idx)
        assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(batch, expected))
        assert n_tokens == int((expected[3] != 0).sum()) and n_source == int(expected[1].sum())
        wide, _, _ = padded.batch(idx)
        assert wide[0].shape[1] % 8 == 0 and wide[2].shape[1] % 8 == 0
        with torch.no_grad():
            a = label_smoothed_nll(model(*batch[:3]), batch[3], 0.1)[0]
            b = label_smoothed_nll(model(*wide[:3]), wide[3], 0.1)[0]
        assert torch.allclose(a, b, rtol=1e-5)


@pytest.mark.timeout(30)
def test_the_running_loss_read_every_few_steps_is_the_one_read_every_step():
    values = [(torch.tensor(float(v)), n) for v, n in zip(range(30, 90, 3), range(5, 25))]
    state = {}
    running = RunningLoss(state)
    running.start_epoch(2.5)
    expected = 2.5
    for loss, n in values:
        running.add(loss, n)
        expected = 0.98 * expected + 0.02 * (loss.item() / n)
    assert running.read() == expected == state["loss_avg"]


# ---- the compiled step ----------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_compiled_step_gives_the_eager_loss_and_gradients():
    """torch.compile'd forward and loss (the dense form) against the eager step, on three batches of three shapes."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=60, num_hiddens=16, ffn_num_hiddens=32, num_heads=2, num_layers=2, decoder_layers=1, dropout=0.0)
    eager_model = Transformer(cfg)
    compiled_model = Transformer(cfg)
    compiled_model.load_state_dict(eager_model.state_dict())
    messages = []
    eager = TrainStep(eager_model, 0.1, False, torch.device("cpu"), False, messages.append)
    # aot_eager: the graphs torch.compile captures (forward, and backward through AOTAutograd) run by eager kernels;
    # inductor's C++ code generation takes minutes on two CPU cores, and a GPU runs Triton's instead.
    compiled = TrainStep(compiled_model, 0.1, False, torch.device("cpu"), True, messages.append, backend="aot_eager")
    rng = random.Random(1)
    examples = [([rng.randrange(4, 60) for _ in range(rng.randrange(2, 14))], [rng.randrange(4, 60) for _ in range(rng.randrange(1, 12))])
                for _ in range(24)]
    tensors = EpochTensors(examples, torch.device("cpu"), pad_multiple=8)
    for idx in (list(range(0, 8)), list(range(8, 20)), list(range(20, 24))):
        batch, n_tokens, _ = tensors.batch(idx)
        for m in (eager_model, compiled_model):
            m.zero_grad(set_to_none=True)
        a, b = eager(batch, n_tokens), compiled(batch, n_tokens)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4), (a, b)
        for (name, p), q in zip(eager_model.named_parameters(), compiled_model.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-5), name
    assert compiled.compiled is not None and messages == []  # it compiled, and never fell back to eager


@pytest.mark.timeout(30)
def test_a_compile_that_fails_is_said_once_and_the_step_goes_on_eager():
    model = Transformer(TransformerConfig(vocab_size=30, num_hiddens=8, ffn_num_hiddens=16, num_heads=2, num_layers=1, dropout=0.0))
    messages = []
    step = TrainStep(model, 0.1, False, torch.device("cpu"), True, messages.append)

    def broken(*_):
        raise RuntimeError("no C++ compiler found\nmore detail")

    step.compiled = broken
    batch, n_tokens, _ = EpochTensors([([5, 6, 7], [8, 9])], torch.device("cpu")).batch([0])
    loss = step(batch, n_tokens)
    assert step.compiled is None and len(messages) == 1 and "no C++ compiler found" in messages[0] and "eager" in messages[0]
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


# ---- epochs tokenized ahead, and the time box --------------------------------------------------------------------

PAIRS = [("Tom is here.", "Tom est ici."), ("I love London.", "J'adore Londres."), ("Mary has 3 cats.", "Mary a 3 chats."),
         ("Where is the station?", "Où est la gare ?"), ("I saw Emily yesterday.", "J'ai vu Emily hier.")] * 8


@pytest.mark.timeout(60)
def test_prepared_epochs_are_the_epochs_the_run_would_make_and_others_are_refused(tmp_path):
    tok = Tokenizer.load(TOKENIZER)
    noise = NoiseConfig()
    key = epochs_key(PAIRS, tok, 64, noise, 0, 0.25)
    made = EpochData(PAIRS, tok, 64, noise, seed=0, copy_rate=0.25)
    try:
        expected = [made.examples(e) for e in range(3)]
        for e in (0, 1):
            write_prepared_epoch(tmp_path / "epochs", key, e, expected[e])
    finally:
        made.close()
    source = EpochData(PAIRS, tok, 64, noise, seed=0, copy_rate=0.25, workers=2)
    prepared = PreparedEpochs(tmp_path / "epochs", key, tok.vocab_size, source)
    try:
        assert [prepared.examples(e) for e in range(3)] == expected  # two from the files, the third made
    finally:
        prepared.close()
    other = epochs_key(PAIRS, tok, 64, noise, 1, 0.25)  # another seed
    with pytest.raises(UsageError, match="prepared for other data"):
        PreparedEpochs(tmp_path / "epochs", other, tok.vocab_size, EpochData(PAIRS, tok, 64, None, 0))
    damaged = tmp_path / "epochs" / "epoch-001.npz.xz"
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"x")
    with pytest.raises(UsageError, match="not the file that was prepared"):
        PreparedEpochs(tmp_path / "epochs", key, tok.vocab_size, EpochData(PAIRS, tok, 64, None, 0)).examples(1)


@pytest.mark.timeout(30)
def test_the_time_box_ends_the_run_at_the_epochs_that_fit_and_undoes_a_slow_first_guess():
    said = []
    state = {"epoch": 3}
    # The first epoch of a process (compile, data start) decides nothing.
    assert time_boxed_epochs(32, state, [90.0], 90.0, 300.0, said.append) == 32 and not said
    # 10 s an epoch with 200 s used of 300: keep 10 s and the reserve, so 6 more epochs.
    assert time_boxed_epochs(32, state, [90.0, 10.0], 200.0, 300.0, said.append) == 3 + int((300 - 200 - 10 - 30) // 10)
    assert state["epochs_cut"]["to"] == 9 and len(said) == 1
    assert time_boxed_epochs(32, {"epoch": 3, **state}, [90.0, 1.0], 20.0, 300.0, said.append) == 32  # faster: the recipe again
    assert time_boxed_epochs(32, {"epoch": 5}, [10.0, 500.0], 400.0, 300.0, said.append) == 5  # over already: end now


# ---- a toy run on the CPU: call 1 stops, its packed state resumes elsewhere -----------------------------------------

TOY = ("--set", "vocab_size=500", "--set", "num_hiddens=32", "--set", "ffn_num_hiddens=64", "--set", "num_layers=2",
       "--set", "decoder_layers=1", "--set", "max_tokens=400", "--set", "warmup=20", "--set", "lr=0.003",
       "--set", "eval_sentences=2", "--set", "average_last=2", "--set", "copy_rate=0.2", "--limit-pairs", "120",
       "--epochs", "4", "--precision", "fp32", "--threads", "1")


@pytest.fixture()
def toy_data(tmp_path, corpus_zip, challenge_test):
    lines = zipfile.ZipFile(corpus_zip).read(data.MEMBER).decode("utf-8").splitlines()
    folder = tmp_path / "data"
    folder.mkdir()
    with zipfile.ZipFile(folder / student_gpu.CORPUS, "w") as z:
        z.writestr(data.MEMBER, "\n".join(lines[::80]) + "\n")
    (folder / student_gpu.CHALLENGE).write_bytes(Path(challenge_test).read_bytes())
    return folder


@pytest.mark.timeout(240)
def test_a_toy_run_call1_interrupted_packs_a_state_that_call2_elsewhere_finishes(tmp_path, toy_data, monkeypatch):
    """Call 1 trains (in process, on the CPU, the GPU settings at toy size) and is interrupted; what it packs is
    unpacked into another tree (another machine) and trained to the end there."""
    def in_process(*args, check=True):
        result = CliRunner().invoke(main, [str(a) for a in args])
        if check and result.exit_code:
            raise AssertionError(result.output)
        return result.exit_code

    first, second = tmp_path / "machine-a", tmp_path / "machine-b"
    for tree in (first, second):
        tree.mkdir()
    monkeypatch.setattr(student_gpu, "tk", in_process)
    monkeypatch.setattr(student_gpu, "DATA", toy_data)
    monkeypatch.setattr(student_gpu, "TOKENIZER", TOKENIZER)
    monkeypatch.setattr(student_gpu, "GPU_SETTINGS", {**student_gpu.GPU_SETTINGS, "compile": "false", "data_workers": 2, "batch_tokens": 800})
    monkeypatch.setattr(student_gpu, "RUN", Path("run"))
    monkeypatch.setattr(student_gpu, "REPO", first)  # the GPU machine's tree
    monkeypatch.chdir(first)
    original, calls = train_module.label_smoothed_nll, {"n": 0}

    def interrupting(log_probs, target, eps):
        calls["n"] += eps > 0
        if eps > 0 and calls["n"] == 7:
            raise KeyboardInterrupt  # Ctrl-C's path, as a call's end would stop it: a checkpoint first
        return original(log_probs, target, eps)

    monkeypatch.setattr(train_module, "label_smoothed_nll", interrupting)
    args = type("Args", (), {"minutes": 5.0, "device": "cpu", "extra": TOY})()
    state = student_gpu.stage_train(args)
    assert not state["finished"] and state["step"] == 6
    stopped = checkpoint.load(first / "run" / "checkpoint.pt")
    assert stopped["train"]["recipe"]["batch_tokens"] == 800 and stopped["train"]["recipe"]["scaled"]["warmup"] == 10
    index = student_gpu.pack_run(first / "out", finished=False)
    assert index["name"] == "student-resume" and len(index["parts"]) <= 4
    monkeypatch.setattr(train_module, "label_smoothed_nll", original)

    # Another machine: another tree, the packed files unpacked into it, training resumed to the end.
    monkeypatch.setattr(student_gpu, "REPO", second)
    monkeypatch.chdir(second)
    student_gpu.stage_unpack(type("Args", (), {"dir": str(first / "out")})())
    resumed = checkpoint.load(second / "run" / "checkpoint.pt")
    assert resumed["progress"]["step"] == 6 and resumed["optimizer"]["state"][0]["exp_avg"].dtype == torch.bfloat16
    state = student_gpu.stage_train(args)
    assert state["finished"] and state["epoch"] == 4 and state["step"] > 6
    final = checkpoint.load(second / "run" / "checkpoint.pt")
    assert len(final["train"]["resumed_with"]) == 1 and final["metrics"]["valid_loss"] > 0
    index = student_gpu.pack_run(second / "out", finished=True)
    assert index["name"] == "student-slim"


# ---- the decision ----------------------------------------------------------------------------------------------------

def _manifest(challenge4: float, names: int, cuda: bool | None) -> dict:
    ev = {"tatoeba_challenge_beam4": {"bleu": challenge4}, "test_split_beam4": {"bleu_multi_ref": 56.7},
          "tatoeba_challenge_greedy": {"bleu": 43.5}, "test_split_greedy": {"bleu_multi_ref": 55.7}}
    verify = {"onnxruntime/cpu": {"passed": True}, **({"onnxruntime/cuda": {"passed": cuda}} if cuda is not None else {})}
    cfg = {"vocab_size": 6000, "num_hiddens": 256, "ffn_num_hiddens": 1024, "num_layers": 6, "decoder_layers": 2}
    return {"metrics": {"evaluation": ev, "names": {"copied": names, "total": 79, "share": names / 79}}, "verify": verify,
            "config": cfg}


def test_a_student_that_beats_the_shipped_model_ships_while_a_recipe_goal_is_missed():
    """The ship rule and the recipe's goals are separate: better on every score, as fast and in budget ships; 45.0
    BLEU and CUDA verify are goals. Fails if a missed goal blocks the ship or counts as met."""
    shipped = {"metrics": {"evaluation": {"tatoeba_challenge_beam4": {"bleu": 43.66}, "test_split_beam4": {"bleu_multi_ref": 56.27},
                                          "tatoeba_challenge_greedy": {"bleu": 42.81}, "test_split_greedy": {"bleu_multi_ref": 55.28}}}}
    bench = ({"file (fp32)": 2.0}, {"file (fp32)": 1.5})
    results = student_gpu.conditions(_manifest(44.33, 74, None), shipped, bench, 39 * 2**20)
    ship = [ok for kind, _, ok, _ in results if kind == student_gpu.SHIP]
    targets = {what: ok for kind, what, ok, _ in results if kind == student_gpu.TARGET}
    assert ship and all(ship)
    assert targets["Tatoeba Challenge BLEU, beam 4, at least 45.0"] is False
    assert targets["tk verify passes (onnxruntime/cuda)"] is False
    assert targets["unseen names copied verbatim: at least 90%"] is True
    # Slower on one row, or lower on the Challenge set: no ship.
    slower = student_gpu.conditions(_manifest(44.33, 74, None), shipped, ({"file (fp32)": 1.0}, {"file (fp32)": 1.5}), 39 * 2**20)
    assert not all(ok for kind, _, ok, _ in slower if kind == student_gpu.SHIP)
    worse = student_gpu.conditions(_manifest(43.0, 74, None), shipped, bench, 39 * 2**20)
    assert not all(ok for kind, _, ok, _ in worse if kind == student_gpu.SHIP)
