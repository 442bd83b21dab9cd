"""Training: kernel regression on synthetic data, seq2seq models on fra-eng; atomic, resumable checkpoints."""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from toolkit import checkpoint, data, registry
from toolkit.batching import DecodeOptions, translate_texts
from toolkit.errors import ToolkitError, UsageError
from toolkit.tokenizer import PAD, Tokenizer

PRESETS = {
    # A few hundred pairs and a small model: the loss visibly falls in about a minute on 2 cores.
    "tiny": dict(limit_pairs=400, vocab_size=600, num_hiddens=64, ffn_num_hiddens=128, num_heads=4, num_layers=2,
                 embed_size=64, epochs=12, max_tokens=1500, lr=3e-3, warmup=30, eval_sentences=50),
    # The shipped models: sized for a few hours on 2 CPU cores.
    "base": dict(vocab_size=6000, num_hiddens=256, ffn_num_hiddens=1024, num_heads=4, num_layers=3,
                 embed_size=256, epochs=12, max_tokens=6000, lr=1e-3, warmup=1500, eval_sentences=500),
}
# Training settings `--set` accepts besides the model's config fields, with their types.
SETTINGS = {"epochs": int, "max_tokens": int, "lr": float, "warmup": int, "eval_sentences": int, "limit_pairs": int}


@dataclass
class TrainOptions:
    model: str
    out: Path
    data: str | None = None
    exclude: str | None = None  # a public test set whose English sentences must not be trained on
    preset: str = "base"
    pre_ln: bool = False
    epochs: int | None = None
    lr: float | None = None
    seed: int = 0
    resume: bool = False
    limit_pairs: int | None = None
    max_minutes: float | None = None  # stop cleanly (with a checkpoint) after this long
    save_every: float = 300.0  # seconds between periodic checkpoints
    threads: int | None = None
    precision: str = "auto"  # "auto": bf16 autocast where the CPU has native bf16, else fp32
    overrides: dict = dataclasses.field(default_factory=dict)  # config fields from the command line
    command: str = ""

    def setting(self, key: str):
        value = {"epochs": self.epochs, "lr": self.lr, "limit_pairs": self.limit_pairs}.get(key)
        if value is None:
            value = self.overrides.get(key, PRESETS[self.preset].get(key))
        return value


class Interrupted(ToolkitError):
    exit_code = 130


def check_out_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write to output directory {out} ({e.strerror}); choose another --out") from None


def check_settings(opts: TrainOptions, entry: registry.ModelEntry) -> None:
    """Parses and checks every --set before any work, so a bad size fails now, not after hours of training."""
    opts.overrides = entry.parse_overrides(opts.overrides, SETTINGS)
    for key in SETTINGS:
        value = opts.setting(key)
        if value is not None and value <= 0:
            raise UsageError(f"{key} must be positive, got {value}")
    fields = {k: opts.setting(k) for k in entry.field_types() if opts.setting(k) is not None}
    registry.check_config(opts.model, entry.config(**fields), "--set")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def bf16_is_fast() -> bool:
    """True on CPUs with native bf16 matmuls (AVX512-BF16 or AMX), where autocast halves training time."""
    check = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(check and check())


def hardware() -> str:
    return f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def train(opts: TrainOptions, echo=print) -> dict:
    """Runs training as configured; returns the final metrics."""
    if opts.preset not in PRESETS:
        raise UsageError(f"unknown preset '{opts.preset}'; choose one of: {', '.join(PRESETS)}")
    entry = registry.get(opts.model)
    if opts.model != "nw" and entry.kind != "seq2seq":
        raise UsageError(f"model '{opts.model}' has no training task; train one of: nw, seq2seq, transformer")
    check_settings(opts, entry)
    check_out_dir(opts.out)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    seed_everything(opts.seed)
    if opts.model == "nw":
        return train_kernel_regression(opts, echo)
    return train_seq2seq(opts, entry, echo)


def train_kernel_regression(opts: TrainOptions, echo) -> dict:
    from models.kernel_regression import fit, synthetic_data, test_mse

    entry = registry.get("nw")
    cfg = entry.config()
    model = entry.build(cfg)
    x_train, y_train, x_test, y_truth = synthetic_data(seed=opts.seed)
    baseline = test_mse(entry.build(entry.config(learn_width=False)), x_train, y_train, x_test, y_truth)
    epochs = opts.epochs or 5
    for epoch, loss in fit(model, x_train, y_train, epochs=epochs, lr=opts.lr or 0.5):
        echo(f"epoch {epoch + 1}/{epochs}  loss {loss:.4f}  w {model.w.item():.3f}")
    mse = test_mse(model, x_train, y_train, x_test, y_truth)
    metrics = {"test_mse": mse, "test_mse_nonparametric": baseline, "w": model.w.item()}
    checkpoint.save({
        "model": "nw", "config": dataclasses.asdict(cfg), "state_dict": model.state_dict(), "metrics": metrics,
        "train": {"command": opts.command, "seed": opts.seed, "hardware": hardware()},
        "data": {"x_train": x_train.tolist(), "y_train": y_train.tolist(), "source": "synthetic 2 sin(x) + x^0.8 + N(0, 0.5)"},
    }, opts.out / "checkpoint.pt")
    echo(f"done: test MSE {mse:.4f} (non-parametric: {baseline:.4f}), learned w {model.w.item():.3f}; checkpoint {opts.out / 'checkpoint.pt'}")
    return metrics


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def lr_at(step: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then inverse square-root decay (the paper's schedule, scaled to a peak)."""
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


def label_smoothed_nll(log_probs: torch.Tensor, target: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(smoothed loss summed, plain NLL summed) over non-pad target tokens."""
    mask = target != PAD
    nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -log_probs.mean(-1)
    loss = ((1 - eps) * nll + eps * smooth)[mask].sum()
    return loss, nll[mask].sum()


def to_tensors(examples, idx):
    src = [examples[i][0] for i in idx]
    tgt_in, tgt_out = data.teacher_forcing([examples[i][1] for i in idx])
    return (torch.tensor(data.pad(src)), torch.tensor([len(s) for s in src]),
            torch.tensor(tgt_in), torch.tensor(tgt_out))


def train_seq2seq(opts: TrainOptions, entry: registry.ModelEntry, echo) -> dict:
    from tqdm import tqdm

    ckpt_path = opts.out / "checkpoint.pt"
    resumed = checkpoint.load(ckpt_path) if opts.resume else None
    if opts.resume and resumed.get("model") != opts.model:
        raise UsageError(f"{ckpt_path} holds a '{resumed.get('model')}' model, not '{opts.model}'")
    if not opts.resume and ckpt_path.exists():
        raise UsageError(f"{ckpt_path} already exists; pass --resume to continue it or choose another --out")

    corpus = data.load_corpus(opts.data, Path(opts.exclude) if opts.exclude else None)
    train_pairs = corpus.splits["train"]
    limit = opts.setting("limit_pairs")
    if limit:
        train_pairs = random.Random(opts.seed).sample(train_pairs, min(limit, len(train_pairs)))
    valid_pairs = corpus.splits["valid"][: max(200, limit or 0)] if limit else corpus.splits["valid"]

    if resumed:
        tokenizer = Tokenizer(resumed["tokenizer"])
        cfg = entry.config(**resumed["config"])
    else:
        echo(f"training the tokenizer on {len(train_pairs)} training pairs ...")
        tokenizer = Tokenizer.train([s for p in train_pairs for s in p], opts.setting("vocab_size"), opts.seed)
        fields = {k: opts.setting(k) for k in ("num_hiddens", "ffn_num_hiddens", "num_heads", "num_layers", "embed_size")}
        fields.update({k: v for k, v in opts.overrides.items() if k in entry.field_types()})
        fields.update(vocab_size=tokenizer.vocab_size, pre_ln=opts.pre_ln or bool(fields.get("pre_ln")))
        cfg = entry.config(**{k: v for k, v in fields.items() if v is not None})
    model = entry.build(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    state = {"epoch": 0, "batch": 0, "step": 0, "elapsed": 0.0, "history": []}
    if resumed:
        model.load_state_dict(resumed["state_dict"])
        optimizer.load_state_dict(resumed["optimizer"])
        state = resumed["progress"]
        torch.set_rng_state(resumed["rng"])

    examples = data.encode_pairs(tokenizer, train_pairs, cfg.max_len)
    valid_examples = data.encode_pairs(tokenizer, valid_pairs, cfg.max_len)
    epochs, peak, warmup = opts.setting("epochs"), opts.setting("lr"), opts.setting("warmup")
    max_tokens = opts.setting("max_tokens")
    use_bf16 = opts.precision == "bf16" or (opts.precision == "auto" and bf16_is_fast())
    n_params = sum(p.numel() for p in model.parameters())
    echo(f"{opts.model}: {n_params / 1e6:.2f}M parameters, vocab {cfg.vocab_size}, {len(examples)} training pairs, "
         f"{len(valid_examples)} validation pairs, {epochs} epochs, {'bf16 autocast' if use_bf16 else 'fp32'}; {hardware()}")

    # The command that started the run stays recorded; each --resume is appended after it.
    provenance = {"command": opts.command, "seed": opts.seed, "hardware": hardware(),
                  "options": {k: str(v) for k, v in dataclasses.asdict(opts).items()}, "resumed_with": []}
    if resumed:
        first = resumed.get("train", {})
        provenance.update(command=first.get("command", opts.command), options=first.get("options", provenance["options"]),
                          resumed_with=[*first.get("resumed_with", []), opts.command])

    def save() -> None:
        checkpoint.save({
            "model": opts.model, "config": dataclasses.asdict(cfg), "state_dict": model.state_dict(),
            "optimizer": optimizer.state_dict(), "progress": state, "rng": torch.get_rng_state(),
            "tokenizer": tokenizer.model_proto,
            "data": {"source": corpus.source, "sha256": corpus.sha256, "split": corpus.info,
                     "train_pairs_used": len(examples), "exclude": opts.exclude},
            "train": {**provenance, "elapsed_s": state["elapsed"]},
            "metrics": state.get("metrics", {}),
        }, ckpt_path)

    batches_per_epoch = len(data.length_batches(examples, max_tokens, opts.seed))
    total = epochs * batches_per_epoch
    done = state["epoch"] * batches_per_epoch + state["batch"]
    started, last_save = time.time(), time.time()
    elapsed0 = state["elapsed"]
    bar = tqdm(total=total, initial=done, unit="batch", dynamic_ncols=True, file=sys.stderr, mininterval=1.0)
    # SIGTERM (a scheduler, `kill`, a background job whose SIGINT is ignored) stops like Ctrl-C: checkpoint first.
    previous = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() else None
    try:
        while state["epoch"] < epochs:
            model.train()
            batches = data.length_batches(examples, max_tokens, opts.seed + state["epoch"])
            window_tokens, window_start = 0, time.time()
            # Resuming mid-epoch (or after its last batch) continues the epoch's running loss.
            loss_avg = state.get("loss_avg") if state["batch"] else None
            for b in range(state["batch"], len(batches)):
                src, src_len, tgt_in, tgt_out = to_tensors(examples, batches[b])
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(state["step"] + 1, peak, warmup)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
                    log_probs = model(src, src_len, tgt_in)
                loss, _ = label_smoothed_nll(log_probs.float(), tgt_out, 0.1)
                n_tokens = int((tgt_out != PAD).sum())
                optimizer.zero_grad(set_to_none=True)
                (loss / n_tokens).backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                state["step"] += 1
                state["batch"] = b + 1
                per_token = loss.item() / n_tokens
                loss_avg = per_token if loss_avg is None else 0.98 * loss_avg + 0.02 * per_token
                state["loss_avg"] = loss_avg
                window_tokens += n_tokens + int(src_len.sum())
                bar.update(1)
                bar.set_postfix_str(f"epoch {state['epoch'] + 1}/{epochs} loss {loss_avg:.3f} "
                                    f"{window_tokens / max(time.time() - window_start, 1e-6):,.0f} tok/s", refresh=False)
                state["elapsed"] = elapsed0 + time.time() - started
                if time.time() - last_save > opts.save_every:
                    save()
                    last_save = time.time()
                if opts.max_minutes and state["elapsed"] - elapsed0 > 60 * opts.max_minutes:
                    save()
                    bar.close()
                    echo(f"stopped after --max-minutes {opts.max_minutes}; checkpoint {ckpt_path}; continue with --resume")
                    return state.get("metrics", {})
            valid_loss = evaluate_loss(model, valid_examples, max_tokens)
            state["history"].append({"epoch": state["epoch"] + 1, "train_loss": loss_avg, "valid_loss": valid_loss,
                                     "elapsed_s": round(state["elapsed"])})
            train_loss = "n/a" if loss_avg is None else f"{loss_avg:.3f}"
            bar.write(f"epoch {state['epoch'] + 1}: train loss {train_loss}, valid loss {valid_loss:.3f}")
            state["epoch"] += 1
            state["batch"] = 0
            save()
    except KeyboardInterrupt:
        bar.close()
        save()
        raise Interrupted(f"interrupted; checkpoint saved to {ckpt_path}; continue with --resume") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    bar.close()
    metrics = final_metrics(model, entry, cfg, tokenizer, valid_pairs, valid_examples, max_tokens, opts.setting("eval_sentences"))
    state["metrics"] = metrics
    save()
    echo(f"done: valid loss {metrics['valid_loss']:.3f}, valid BLEU {metrics['valid_bleu']:.1f} "
         f"(greedy, {metrics['bleu_sentences']} sentences); checkpoint {ckpt_path}")
    return metrics


@torch.no_grad()
def evaluate_loss(model, examples, max_tokens: int) -> float:
    """Mean per-token negative log-likelihood (no smoothing) on held-out pairs."""
    model.eval()
    total, count = 0.0, 0
    for idx in data.length_batches(examples, max_tokens, seed=0):
        src, src_len, tgt_in, tgt_out = to_tensors(examples, idx)
        _, nll = label_smoothed_nll(model(src, src_len, tgt_in), tgt_out, 0.0)
        total += nll.item()
        count += int((tgt_out != PAD).sum())
    model.train()
    return total / max(count, 1)


def final_metrics(model, entry, cfg, tokenizer, valid_pairs, valid_examples, max_tokens, n_sentences) -> dict:
    from toolkit.evaluate import bleu_chrf
    from toolkit.torch_backend import TorchBackend

    model.eval()
    english, refs = data.references(valid_pairs)
    english, refs = english[:n_sentences], refs[:n_sentences]
    backend = TorchBackend(model, *entry.graphs(cfg))
    hyps = translate_texts(backend, tokenizer, english, DecodeOptions(max_len=cfg.max_len, max_src_len=cfg.max_len))
    scores = bleu_chrf(hyps, refs)
    return {"valid_loss": evaluate_loss(model, valid_examples, max_tokens), "valid_bleu": scores["bleu"],
            "valid_chrf": scores["chrf"], "bleu_sentences": len(english)}
