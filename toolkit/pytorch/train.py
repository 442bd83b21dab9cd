"""Training: kernel regression on synthetic data, seq2seq models on fra-eng; atomic, resumable checkpoints."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
import lzma
import math
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from toolkit.core import data, history
from toolkit.core.batching import DecodeOptions, translate_texts
from toolkit.core.errors import ToolkitError, UsageError, first_line
from toolkit.core.noise import NoiseConfig
from toolkit.core.tokenizer import BOS, EOS, PAD, Tokenizer
from toolkit.pytorch import checkpoint, registry
from toolkit.pytorch.epoch_data import EpochData

PRESETS = {
    # A few hundred pairs and a small model: the loss visibly falls in about a minute on 2 cores.
    "tiny": dict(limit_pairs=400, vocab_size=600, num_hiddens=64, ffn_num_hiddens=128, num_heads=4, num_layers=2,
                 embed_size=64, epochs=12, max_tokens=1500, lr=3e-3, warmup=30, eval_sentences=50),
    # The shipped models: sized for a few hours on 2 CPU cores.
    "base": dict(vocab_size=6000, num_hiddens=256, ffn_num_hiddens=1024, num_heads=4, num_layers=3,
                 embed_size=256, epochs=12, max_tokens=6000, lr=1e-3, warmup=1500, eval_sentences=500,
                 noise=True, average_last=1),
    # The student, the shipped Transformer's recipe, trained in minutes on a rented GPU (docs/models.md#the-student-recipe):
    # a deep encoder over a shallow decoder (6 + 2; Kasai et al. 2021, Bergamot's tiny students), tied embeddings, label
    # smoothing, the robustness noise, copy pairs that teach names (toolkit.core.copydata), longer training and the mean
    # of the last 6 epochs.
    # 7.32M parameters: the exported/ size budget (40 MiB) caps an fp32 Transformer beside the GRU at about 7.5M.
    "student": dict(vocab_size=6000, num_hiddens=256, ffn_num_hiddens=768, num_heads=4, num_layers=6, decoder_layers=2,
                    epochs=32, max_tokens=6000, lr=1e-3, warmup=2000, eval_sentences=500, noise=True, average_last=6,
                    label_smoothing=0.1, copy_rate=0.08),
}
# What differs per model from the size preset, and the presets that are one model's recipe alone, are its builder's
# (registry.ModelEntry.presets and .recipes).
# Training settings `--set` accepts besides the model's config fields, with their types.
SETTINGS = {"epochs": int, "max_tokens": int, "lr": float, "warmup": int, "eval_sentences": int, "limit_pairs": int,
            "average_last": int, "patience": int, "label_smoothing": float, "copy_rate": float,
            # Fast training on a GPU (all off unless set; tools/student_gpu.py sets them to train the student in minutes):
            # batch_tokens: larger training batches, the recipe's rate and warm-up scaled to them (batch_recipe);
            # compile: torch.compile the forward pass and loss; data_workers: processes making the next epochs;
            # finish_minutes: end the run, averaged and evaluated, within this many minutes (fewer epochs if need be).
            "batch_tokens": int, "compile": bool, "data_workers": int, "finish_minutes": float}
# Settings whose 0 means "off" and whose bounds are [0, high]; every other setting must be positive.
FRACTIONS = {"label_smoothing": 0.5, "copy_rate": 1.0}
LABEL_SMOOTHING = 0.1  # unless a preset or --set says otherwise


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
    precision: str = "auto"  # "auto": bf16 autocast where the device has fast bf16, else fp32
    device: str = "auto"  # "auto": cuda when torch sees a GPU, else cpu
    noise: bool | None = None  # robustness noise on the training pairs [preset]
    tokenizer: str | None = None  # reuse this SentencePiece model (or train it and write it there)
    overrides: dict = dataclasses.field(default_factory=dict)  # config fields from the command line
    command: str = ""

    def setting(self, key: str):
        value = {"epochs": self.epochs, "lr": self.lr, "limit_pairs": self.limit_pairs, "noise": self.noise}.get(key)
        if value is None:
            preset = {**PRESETS[self.preset], **registry.get(self.model).presets.get(self.preset, {})}
            value = self.overrides.get(key, preset.get(key))
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
        if isinstance(value, bool):
            continue
        if value is not None and key in FRACTIONS and not 0 <= value <= FRACTIONS[key]:
            raise UsageError(f"{key} must be from 0 to {FRACTIONS[key]}, got {value}")
        if value is not None and key not in FRACTIONS and value <= 0:
            raise UsageError(f"{key} must be positive, got {value}")
    registry.check_config(opts.model, entry.config(**config_fields(opts, entry)), "--set")


def config_fields(opts: TrainOptions, entry: registry.ModelEntry) -> dict:
    """The model's config fields that the preset, the model's preset or --set give a value."""
    return {k: v for k in entry.field_types() if (v := opts.setting(k)) is not None}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def bf16_is_fast() -> bool:
    """True on CPUs with native bf16 matmuls (AVX512-BF16 or AMX), where autocast halves training time."""
    check = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(check and check())


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA GPU (torch " + torch.__version__ + "); use --device cpu")
    return torch.device(name)


def hardware(device: torch.device | None = None) -> str:
    where = f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    if device is not None and device.type == "cuda":
        where += f", {torch.cuda.get_device_name(device)}"
    return where


def train(opts: TrainOptions, echo=print) -> dict:
    """Runs training as configured; returns the final metrics."""
    if opts.preset not in PRESETS:
        raise UsageError(f"unknown preset '{opts.preset}'; choose one of: {', '.join(PRESETS)}")
    owners = [e.name for e in registry.entries() if opts.preset in e.recipes]
    if owners and opts.model not in owners:
        raise UsageError(f"--preset {opts.preset} is a recipe for {' and '.join(owners)} only; use --preset tiny or base")
    entry = registry.get(opts.model)
    if entry.train is None:
        raise UsageError(f"model '{opts.model}' has no training task; train one of: {', '.join(e.name for e in registry.entries() if e.train)}")
    check_settings(opts, entry)
    check_out_dir(opts.out)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    seed_everything(opts.seed)
    return TASKS[entry.train](opts, entry, echo)


def train_kernel_regression(opts: TrainOptions, entry: registry.ModelEntry, echo) -> dict:
    from toolkit.models.kernel_regression import fit, synthetic_data, test_mse

    ckpt_path = opts.out / "checkpoint.pt"
    if opts.resume:
        raise UsageError(f"--resume: '{entry.name}' trains in seconds and keeps no state to continue; run it again without --resume")
    if ckpt_path.exists():
        raise UsageError(f"{ckpt_path} already exists; choose another --out or remove it")
    cfg = entry.config()
    model = entry.build(cfg)
    x_train, y_train, x_test, y_truth = synthetic_data(seed=opts.seed)
    baseline = test_mse(entry.build(entry.config(learn_width=False)), x_train, y_train, x_test, y_truth)
    epochs = opts.epochs or 5
    epochs_seen = []
    for epoch, loss in fit(model, x_train, y_train, epochs=epochs, lr=opts.lr or 0.5):
        echo(f"epoch {epoch + 1}/{epochs}  loss {loss:.4f}  w {model.w.item():.3f}")
        epochs_seen.append({"epoch": epoch + 1, "train_loss": loss, "w": model.w.item()})
        history.write(opts.out, entry.name, epochs_seen)  # for `tk plot`
    mse = test_mse(model, x_train, y_train, x_test, y_truth)
    metrics = {"test_mse": mse, "test_mse_nonparametric": baseline, "w": model.w.item()}
    checkpoint.save({
        "model": entry.name, "config": dataclasses.asdict(cfg), "state_dict": model.state_dict(), "metrics": metrics,
        "train": {"command": opts.command, "seed": opts.seed, "hardware": hardware()},
        "data": {"x_train": x_train.tolist(), "y_train": y_train.tolist(), "source": "synthetic 2 sin(x) + x^0.8 + N(0, 0.5)"},
    }, ckpt_path)
    echo(f"done: test MSE {mse:.4f} (non-parametric: {baseline:.4f}), learned w {model.w.item():.3f}; checkpoint {ckpt_path}")
    return metrics


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


def dense_label_smoothed_nll(log_probs: torch.Tensor, target: torch.Tensor, eps: float) -> torch.Tensor:
    """label_smoothed_nll's smoothed loss with the pad positions zeroed instead of selected: the same sum (in another
    order), and no tensor whose size depends on the data, so torch.compile keeps it in one graph."""
    nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -log_probs.mean(-1)
    return torch.where(target != PAD, (1 - eps) * nll + eps * smooth, 0.0).sum()


def batch_recipe(max_tokens: int, lr: float, warmup: int, batch_tokens: int | None) -> tuple[int, float, int]:
    """(padded tokens per training batch, peak learning rate, warm-up steps) for batches of `batch_tokens`.

    The square-root rule for Adam (Malladi et al. 2022; Granziol et al. 2022): k = batch_tokens / max_tokens times the
    tokens per step takes sqrt(k) times the rate, and the warm-up spans the same tokens (warm-up / k steps). Under the
    inverse-square-root schedule the whole run's rate is then sqrt(k) times the recipe's at every count of tokens seen.
    """
    if not batch_tokens or batch_tokens == max_tokens:
        return max_tokens, lr, warmup
    k = batch_tokens / max_tokens
    return batch_tokens, lr * math.sqrt(k), max(1, round(warmup / k))


class EpochTensors:
    """One epoch's examples as padded id matrices on the training device, so a batch is two index operations there
    instead of padding Python lists per step (a large batch holds a thousand sentences). A batch's tensors equal
    to_tensors' (padded to the batch's longest sentence), or are padded further to a multiple of `pad_multiple`
    positions so a compiled model sees few shapes; padding changes no loss (pad keys are masked, pad targets ignored,
    and the decoder's causal mask keeps trailing positions out of earlier ones)."""

    def __init__(self, examples, device: torch.device, pad_multiple: int = 1):
        self.src_len = np.fromiter((len(s) for s, _ in examples), np.int64, len(examples))
        self.tgt_len = np.fromiter((len(t) + 1 for _, t in examples), np.int64, len(examples))  # with BOS or EOS
        self.multiple, self.device = pad_multiple, device
        self.src = self._matrix(self.src_len, (s for s, _ in examples))
        self.tgt_in = self._matrix(self.tgt_len, ([BOS, *t] for _, t in examples))
        self.tgt_out = self._matrix(self.tgt_len, ([*t, EOS] for _, t in examples))
        self.src_len_t = torch.from_numpy(self.src_len).to(device)

    def _width(self, n: int) -> int:
        return -(-n // self.multiple) * self.multiple

    def _matrix(self, lengths: np.ndarray, rows) -> torch.Tensor:
        # int32 halves the memory; batch() widens to the int64 the model's embedding takes.
        out = np.full((len(lengths), self._width(int(lengths.max(initial=1)))), PAD, np.int32)
        out[np.arange(out.shape[1]) < lengths[:, None]] = np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lengths.sum()))
        return torch.from_numpy(out).to(self.device)

    def batch(self, idx: list[int]) -> tuple[tuple[torch.Tensor, ...], int, int]:
        """((src, src_len, tgt_in, tgt_out), target tokens, source tokens); the counts come from the host's lengths,
        so reading them never waits for the GPU."""
        rows = np.asarray(idx)
        ls, lt = self._width(int(self.src_len[rows].max())), self._width(int(self.tgt_len[rows].max()))
        index = torch.from_numpy(rows).to(self.device, non_blocking=True)
        tensors = (self.src[:, :ls].index_select(0, index).long(), self.src_len_t.index_select(0, index),
                   self.tgt_in[:, :lt].index_select(0, index).long(), self.tgt_out[:, :lt].index_select(0, index).long())
        return tensors, int(self.tgt_len[rows].sum()), int(self.src_len[rows].sum())


# ---- epochs prepared ahead (tools/student_gpu.py prepare): tokenized where CPU time is free, sent to the GPU machine ---

PREPARED = "epochs"  # the folder under --out


def epochs_key(train_pairs, tokenizer: Tokenizer, max_len: int, noise: NoiseConfig | None, seed: int, copy_rate: float) -> str:
    """What an epoch's examples depend on (EpochData's inputs); prepared epochs made for other inputs are refused."""
    h = hashlib.sha256()
    for en, fr in train_pairs:
        h.update(f"{en}\t{fr}\n".encode())
    h.update(tokenizer.model_proto)
    h.update(json.dumps([max_len, noise.asdict() if noise else None, seed, copy_rate]).encode())
    return h.hexdigest()


def write_prepared_epoch(folder: Path, key: str, epoch: int, examples) -> Path:
    """epoch-NNN.npz.xz: every example's two lengths and their ids end to end (uint16), xz-compressed (2.3 MB for
    160,000 pairs); index.json names the key and each file's sha256. Written atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    lengths = np.array([(len(s), len(t)) for s, t in examples], np.int64).reshape(-1, 2)
    ids = np.fromiter(itertools.chain.from_iterable(s + t for s, t in examples), np.int64, int(lengths.sum()))
    if (len(ids) and int(ids.max()) > np.iinfo(np.uint16).max) or (len(lengths) and int(lengths.max()) > np.iinfo(np.uint16).max):
        raise UsageError("prepared epochs hold ids and lengths below 65,536; train this vocabulary without them")
    lengths, ids = lengths.astype(np.uint16), ids.astype(np.uint16)
    buffer = io.BytesIO()
    np.savez(buffer, lengths=lengths, ids=ids)
    path = folder / f"epoch-{epoch:03d}.npz.xz"
    blob = lzma.compress(buffer.getvalue(), preset=6)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, path)
    index_path = folder / "index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    if index.get("key") != key:
        index = {"key": key, "epochs": {}}
    index["epochs"][str(epoch)] = hashlib.sha256(blob).hexdigest()
    tmp = index_path.with_name("index.json.tmp")
    tmp.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, index_path)
    return path


class PreparedEpochs:
    """EpochData's examples(epoch), read from the files prepared ahead where there is one, made by `source` (its
    worker processes) for the epochs after them. The files come from elsewhere: nothing in them is unpickled, their
    sha256 and key must match, and every id must lie in the vocabulary."""

    def __init__(self, folder: Path, key: str, vocab_size: int, source, start: int = 0):
        self.folder, self.vocab_size, self.source = folder, vocab_size, source
        index = json.loads((folder / "index.json").read_text()) if (folder / "index.json").is_file() else {"key": key, "epochs": {}}
        if index.get("key") != key:
            raise UsageError(f"{folder} holds epochs prepared for other data, tokenizer, noise or seed than this run's; "
                             f"prepare them again for this command (tools/student_gpu.py prepare) or remove {folder}")
        self.files = {int(e): digest for e, digest in index.get("epochs", {}).items()}
        self._last: tuple[int, list] | None = None  # the run asks for an epoch twice (the progress bar, then the loop)
        source.prefetch(next(e for e in itertools.count(start) if e not in self.files))  # the first epoch no file holds

    def examples(self, epoch: int):
        if epoch not in self.files:
            return self.source.examples(epoch)
        if self._last is None or self._last[0] != epoch:
            self._last = (epoch, self._read(epoch))
        return self._last[1]

    def _read(self, epoch: int) -> list:
        path = self.folder / f"epoch-{epoch:03d}.npz.xz"
        blob = path.read_bytes() if path.is_file() else b""
        if hashlib.sha256(blob).hexdigest() != self.files[epoch]:
            raise UsageError(f"{path} is missing or not the file that was prepared (sha256 differs); prepare the epochs again")
        with np.load(io.BytesIO(lzma.decompress(blob)), allow_pickle=False) as arrays:
            lengths, ids = arrays["lengths"].astype(np.int64), arrays["ids"].astype(np.int64)
        if lengths.ndim != 2 or lengths.shape[1] != 2 or int(lengths.sum()) != len(ids) or (len(ids) and int(ids.max()) >= self.vocab_size):
            raise UsageError(f"{path} does not hold token ids of this vocabulary; prepare the epochs again")
        ends = np.cumsum(lengths.reshape(-1))
        pieces = np.split(ids, ends[:-1]) if len(ends) else []
        return [(pieces[2 * i].tolist(), pieces[2 * i + 1].tolist()) for i in range(len(lengths))]

    def close(self) -> None:
        self.source.close()


def to_tensors(examples, idx, device: torch.device | str = "cpu"):
    src = [examples[i][0] for i in idx]
    tgt_in, tgt_out = data.teacher_forcing([examples[i][1] for i in idx])
    return tuple(torch.tensor(x).to(device, non_blocking=True)
                 for x in (data.pad(src), [len(s) for s in src], tgt_in, tgt_out))


def load_tokenizer(opts: TrainOptions, train_pairs, echo) -> Tokenizer:
    """A shared tokenizer file is reused (both translation models then have one vocabulary);
    otherwise one is trained on the training pairs (and written to --tokenizer if given)."""
    path = Path(opts.tokenizer) if opts.tokenizer else None
    if path and path.is_file():
        echo(f"using the tokenizer {path}")
        return Tokenizer.load(path)
    echo(f"training the tokenizer on {len(train_pairs)} training pairs ...")
    tokenizer = Tokenizer.train([s for p in train_pairs for s in p], opts.setting("vocab_size"), opts.seed)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tokenizer.save(tmp)
        os.replace(tmp, path)
    return tokenizer


def build_config(opts: TrainOptions, entry: registry.ModelEntry, tokenizer: Tokenizer):
    """The presets' sizes and any --set field (already parsed and checked), with the tokenizer's vocabulary."""
    fields = config_fields(opts, entry)
    return entry.config(**{**fields, "vocab_size": tokenizer.vocab_size, "pre_ln": opts.pre_ln or bool(fields.get("pre_ln"))})


def average_state_dicts(paths: list[Path]) -> dict:
    """Element-wise mean of the weights saved at the end of several epochs (checkpoint averaging)."""
    states = [torch.load(p, map_location="cpu", weights_only=True) for p in paths]
    return {k: sum(sd[k].float() for sd in states) / len(states) if states[0][k].is_floating_point() else states[-1][k]
            for k in states[0]}


class Schedule:
    """Learning rate per step: the paper's warm-up + inverse square root, or warm-up then a
    constant rate halved whenever validation loss fails to improve (with early stopping)."""

    def __init__(self, kind: str, peak: float, warmup: int, patience: int | None):
        self.kind, self.peak, self.warmup, self.patience = kind, peak, warmup, patience

    def lr(self, step: int, state: dict) -> float:
        if self.kind == "plateau":
            return self.peak * min(1.0, max(step, 1) / self.warmup) * state.get("lr_scale", 1.0)
        return lr_at(step, self.peak, self.warmup)

    def after_epoch(self, valid_loss: float, state: dict) -> bool:
        """Records the epoch's validation loss; True when training should stop early."""
        best = state.get("best_valid_loss")
        if best is None or valid_loss < best - 1e-4:
            state["best_valid_loss"], state["best_epoch"], state["bad_epochs"] = valid_loss, state["epoch"] + 1, 0
            return False
        state["bad_epochs"] = state.get("bad_epochs", 0) + 1
        if self.kind == "plateau":
            state["lr_scale"] = state.get("lr_scale", 1.0) * 0.5
        return bool(self.patience) and state["bad_epochs"] >= self.patience


def training_inputs(opts: TrainOptions, entry: registry.ModelEntry, echo, resumed: dict | None = None):
    """(corpus, training pairs, validation pairs, tokenizer, config) as the run sees them (a resumed run: its own
    tokenizer and config)."""
    corpus = data.load_corpus(opts.data, Path(opts.exclude) if opts.exclude else None)
    echo(data.describe(corpus))
    train_pairs = corpus.splits["train"]
    limit = opts.setting("limit_pairs")
    if limit:
        train_pairs = random.Random(opts.seed).sample(train_pairs, min(limit, len(train_pairs)))
    valid_pairs = corpus.splits["valid"][: max(200, limit or 0)] if limit else corpus.splits["valid"]
    if resumed:
        return corpus, train_pairs, valid_pairs, Tokenizer(resumed["tokenizer"]), entry.config(**resumed["config"])
    tokenizer = load_tokenizer(opts, train_pairs, echo)
    return corpus, train_pairs, valid_pairs, tokenizer, build_config(opts, entry, tokenizer)


def epoch_inputs(opts: TrainOptions) -> tuple[NoiseConfig | None, float]:
    return (NoiseConfig() if opts.setting("noise") else None), (opts.setting("copy_rate") or 0.0)


def open_epochs(opts: TrainOptions, train_pairs, tokenizer: Tokenizer, cfg, start: int):
    """Each epoch's examples: EpochData (with data_workers processes), and the files under OUT/epochs where they were
    prepared ahead."""
    noise_cfg, copy_rate = epoch_inputs(opts)
    made = EpochData(train_pairs, tokenizer, cfg.max_len, noise_cfg, opts.seed, copy_rate, workers=opts.setting("data_workers") or 1)
    folder = opts.out / PREPARED
    if not folder.is_dir():
        return made
    key = epochs_key(train_pairs, tokenizer, cfg.max_len, noise_cfg, opts.seed, copy_rate)
    try:
        return PreparedEpochs(folder, key, cfg.vocab_size, made, start)
    except BaseException:
        made.close()
        raise


def prepare_epochs(opts: TrainOptions, epochs: list[int], echo=print) -> list[Path]:
    """Writes the examples of `epochs` that `tk train` with these options would make into OUT/epochs (read by the run
    in place of making them), so a GPU machine spends no time tokenizing them."""
    entry = registry.get(opts.model)
    check_settings(opts, entry)
    check_out_dir(opts.out)
    _, train_pairs, _, tokenizer, cfg = training_inputs(opts, entry, echo)
    noise_cfg, copy_rate = epoch_inputs(opts)
    key = epochs_key(train_pairs, tokenizer, cfg.max_len, noise_cfg, opts.seed, copy_rate)
    made = EpochData(train_pairs, tokenizer, cfg.max_len, noise_cfg, opts.seed, copy_rate, workers=opts.setting("data_workers") or 1)
    try:
        return [write_prepared_epoch(opts.out / PREPARED, key, e, made.examples(e)) for e in epochs]
    finally:
        made.close()


COMPILE_PAD = 8  # sentence lengths padded to a multiple of this under compile: a few shapes, not one per length


class TrainStep:
    """One step's forward pass, smoothed loss and backward (the loss scaled per target token); with compile the
    forward and loss run torch.compile'd. A compile that fails (an unsupported operation, a missing compiler) is said
    once and the run goes on eager, rather than losing a rented GPU's minutes to a traceback."""

    def __init__(self, model: nn.Module, smoothing: float, use_bf16: bool, device: torch.device, compile_: bool, echo,
                 backend: str = "inductor"):
        self.model, self.smoothing, self.use_bf16, self.device, self.echo = model, smoothing, use_bf16, device, echo
        # backend: "inductor" generates the kernels (Triton on a GPU); the tests trace with "aot_eager", which checks the
        # captured forward and backward without minutes of C++ compilation on a CPU.
        self.compiled = torch.compile(self.dense_loss, backend=backend) if compile_ else None

    def _log_probs(self, src, src_len, tgt_in) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.use_bf16):
            return self.model(src, src_len, tgt_in).float()

    def eager_loss(self, src, src_len, tgt_in, tgt_out) -> torch.Tensor:
        return label_smoothed_nll(self._log_probs(src, src_len, tgt_in), tgt_out, self.smoothing)[0]

    def dense_loss(self, src, src_len, tgt_in, tgt_out) -> torch.Tensor:
        return dense_label_smoothed_nll(self._log_probs(src, src_len, tgt_in), tgt_out, self.smoothing)

    def __call__(self, batch: tuple[torch.Tensor, ...], n_tokens: int) -> torch.Tensor:
        """The batch's smoothed loss (summed), after its gradients (of the loss per token) are accumulated."""
        if self.compiled is not None:
            try:
                loss = self.compiled(*batch)
                (loss / n_tokens).backward()
                return loss.detach()
            except Exception as e:  # KeyboardInterrupt is no Exception: Ctrl-C still checkpoints
                self.echo(f"torch.compile failed ({type(e).__name__}: {first_line(e)}); training goes on eager")
                self.compiled = None
                self.model.zero_grad(set_to_none=True)
        loss = self.eager_loss(*batch)
        (loss / n_tokens).backward()
        return loss.detach()


class RunningLoss:
    """The running training loss per token (0.98 x before + 0.02 x this step), folded in from the steps' loss tensors
    when read, so the GPU is waited for every few steps rather than every step; the same figures as reading each."""

    EVERY = 25

    def __init__(self, state: dict):
        self.state, self.pending, self.avg = state, [], None

    def start_epoch(self, avg: float | None) -> None:
        self.avg, self.pending = avg, []

    def add(self, loss: torch.Tensor, n_tokens: int) -> None:
        self.pending.append((loss, n_tokens))

    def due(self) -> bool:
        return len(self.pending) >= self.EVERY

    def read(self) -> float | None:
        if self.pending:
            for value, n in zip(torch.stack([loss for loss, _ in self.pending]).tolist(), [n for _, n in self.pending]):
                per_token = value / n
                self.avg = per_token if self.avg is None else 0.98 * self.avg + 0.02 * per_token
            self.pending = []
            self.state["loss_avg"] = self.avg
        return self.avg


FINISH_RESERVE_S = 30.0  # the final metrics: 500 sentences decoded greedily on the CPU, the validation loss


def time_boxed_epochs(recipe_epochs: int, state: dict, epoch_seconds: list[float], used_s: float, budget_s: float, echo) -> int:
    """The epochs the run ends at so that it ends, averaged and evaluated, within budget_s of this process: the
    recipe's, or fewer when the epochs left would not fit at the pace of this process's latest epoch (the first is
    not trusted: it holds the compile and the data's start). One epoch's time and FINISH_RESERVE_S are kept for the
    final averaging and metrics. Decided again after every epoch, so a slow first estimate is undone by a faster pace."""
    if len(epoch_seconds) < 2:
        return recipe_epochs
    pace = epoch_seconds[-1]
    fit = state["epoch"] + max(0, int((budget_s - used_s - pace - FINISH_RESERVE_S) // pace))
    epochs = max(state["epoch"], min(recipe_epochs, fit))
    previous = state.get("epochs_cut", {}).get("to", recipe_epochs)
    if epochs < recipe_epochs:
        state["epochs_cut"] = {"from": recipe_epochs, "to": epochs, "pace_s": round(pace, 2)}
    else:
        state.pop("epochs_cut", None)
    if epochs != previous:
        echo(f"finish_minutes {budget_s / 60:g}: {pace:.1f} s an epoch, so the run ends at epoch {epochs} of {recipe_epochs}")
    return epochs


# Over 60 lines: one training run's mutable state (model, optimizer, schedule, averaging, RNG, progress, the
# signal flag) lives in this frame so that every checkpoint saves all of it at once.
def train_seq2seq(opts: TrainOptions, entry: registry.ModelEntry, echo) -> dict:
    ckpt_path = opts.out / "checkpoint.pt"
    resumed = checkpoint.load(ckpt_path) if opts.resume else None
    if opts.resume and resumed.get("model") != opts.model:
        raise UsageError(f"{ckpt_path} holds a '{resumed.get('model')}' model, not '{opts.model}'")
    if not opts.resume and ckpt_path.exists():
        raise UsageError(f"{ckpt_path} already exists; pass --resume to continue it or choose another --out")
    device = pick_device(opts.device)
    corpus, train_pairs, valid_pairs, tokenizer, cfg = training_inputs(opts, entry, echo, resumed)
    model = entry.build(cfg).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    state = {"epoch": 0, "batch": 0, "step": 0, "elapsed": 0.0, "history": []}
    if resumed:
        model.load_state_dict(resumed.get("train_state_dict") or resumed["state_dict"])
        optimizer.load_state_dict(resumed["optimizer"])
        state = resumed["progress"]
        torch.set_rng_state(resumed["rng"])
        if state["epoch"] < opts.setting("epochs"):
            # Training goes on: the finished run's metrics and averaged weights no longer describe it.
            for key in ("metrics", "final_weights"):
                state.pop(key, None)

    noise_cfg, copy_rate = epoch_inputs(opts)
    smoothing = LABEL_SMOOTHING if opts.setting("label_smoothing") is None else opts.setting("label_smoothing")
    epochs_data = open_epochs(opts, train_pairs, tokenizer, cfg, state["epoch"])
    valid_examples = data.encode_pairs(tokenizer, valid_pairs, cfg.max_len)
    epochs, max_tokens = opts.setting("epochs"), opts.setting("max_tokens")
    batch_tokens, peak_lr, warmup = batch_recipe(max_tokens, opts.setting("lr"), opts.setting("warmup"), opts.setting("batch_tokens"))
    schedule = Schedule(opts.setting("schedule") or "inverse_sqrt", peak_lr, warmup, opts.setting("patience"))
    average_last = opts.setting("average_last") or 1
    use_bf16 = opts.precision == "bf16" or (opts.precision == "auto" and (device.type == "cuda" or bf16_is_fast()))
    n_params = sum(p.numel() for p in model.parameters())
    echo(f"{opts.model}: {n_params / 1e6:.2f}M parameters, vocab {cfg.vocab_size}, {len(train_pairs)} training pairs, "
         f"{len(valid_examples)} validation pairs, {epochs} epochs, {'bf16 autocast' if use_bf16 else 'fp32'}, "
         f"noise {'on' if noise_cfg else 'off'}{f', copy pairs {copy_rate:g} per pair' if copy_rate else ''}; {hardware(device)}")
    if batch_tokens != max_tokens:
        echo(f"batches of {batch_tokens} tokens ({batch_tokens / max_tokens:g}x the recipe's {max_tokens}): peak rate {peak_lr:.3g}, "
             f"warm-up {warmup} steps (square-root rule)")
    step = TrainStep(model, smoothing, use_bf16, device, bool(opts.setting("compile")), echo)

    # The command that started the run stays recorded; each --resume is appended after it.
    provenance = {"command": opts.command, "seed": opts.seed, "hardware": hardware(device),
                  "options": {k: str(v) for k, v in dataclasses.asdict(opts).items()}, "resumed_with": [],
                  "noise": noise_cfg.asdict() if noise_cfg else None,
                  "recipe": {**{k: opts.setting(k) for k in ("epochs", "lr", "warmup", "max_tokens", "schedule", "patience", "average_last")},
                             "label_smoothing": smoothing, "copy_rate": copy_rate,
                             # Only when set, so the records of runs without them read as before.
                             **{k: opts.setting(k) for k in ("batch_tokens", "compile", "finish_minutes") if opts.setting(k)},
                             **({"scaled": {"lr": peak_lr, "warmup": warmup}} if batch_tokens != max_tokens else {})}}
    if resumed:
        first = resumed.get("train", {})
        provenance.update(command=first.get("command", opts.command), options=first.get("options", provenance["options"]),
                          noise=first.get("noise", provenance["noise"]), recipe=first.get("recipe", provenance["recipe"]),
                          resumed_with=[*first.get("resumed_with", []), opts.command])

    def save(final_state: dict | None = None) -> None:
        live = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        checkpoint.save({
            "model": opts.model, "config": dataclasses.asdict(cfg),
            # state_dict is the model to use (averaged at the end); train_state_dict the weights training continues from.
            "state_dict": final_state or live, "train_state_dict": live if final_state else None,
            "optimizer": optimizer.state_dict(), "progress": state, "rng": torch.get_rng_state(),
            "tokenizer": tokenizer.model_proto,
            "data": {"source": Path(corpus.source).name, "sha256": corpus.sha256, "split": corpus.info,
                     "train_pairs_used": len(train_pairs), "exclude": opts.exclude},
            "train": {**provenance, "elapsed_s": state["elapsed"]},
            "metrics": state.get("metrics", {}),
        }, ckpt_path)

    started, last_save = time.time(), time.time()
    elapsed0 = state["elapsed"]
    stopped_early = False
    bar = _progress_bar(epochs, len(data.length_batches(epochs_data.examples(state["epoch"]), batch_tokens, opts.seed)), state)
    losses = RunningLoss(state)
    epoch_seconds: list[float] = []  # this process's epochs, for finish_minutes
    # SIGTERM (a scheduler, `kill`) stops like Ctrl-C (toolkit.core.signals raises KeyboardInterrupt): checkpoint first.
    try:
        while state["epoch"] < epochs and not state.get("stopped_early"):
            model.train()
            epoch_started = time.time()
            examples = epochs_data.examples(state["epoch"])
            batches = data.length_batches(examples, batch_tokens, opts.seed + state["epoch"])
            tensors = EpochTensors(examples, device, COMPILE_PAD if step.compiled else 1)
            window_tokens, window_start = 0, time.time()
            # Resuming mid-epoch (or after its last batch) continues the epoch's running loss.
            losses.start_epoch(state.get("loss_avg") if state["batch"] else None)
            for b in range(state["batch"], len(batches)):
                batch, n_tokens, n_source = tensors.batch(batches[b])
                for group in optimizer.param_groups:
                    group["lr"] = schedule.lr(state["step"] + 1, state)
                optimizer.zero_grad(set_to_none=True)
                losses.add(step(batch, n_tokens), n_tokens)
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                state["step"] += 1
                state["batch"] = b + 1
                window_tokens += n_tokens + n_source
                bar.update(1)
                if losses.due():  # reading the losses waits for the GPU: every few steps, not every step
                    bar.set_postfix_str(f"epoch {state['epoch'] + 1}/{epochs} loss {losses.read():.3f} "
                                        f"{window_tokens / max(time.time() - window_start, 1e-6):,.0f} tok/s", refresh=False)
                state["elapsed"] = elapsed0 + time.time() - started
                if time.time() - last_save > opts.save_every:
                    losses.read()
                    save()
                    last_save = time.time()
                if opts.max_minutes and state["elapsed"] - elapsed0 > 60 * opts.max_minutes:
                    losses.read()
                    save()
                    bar.close()
                    echo(f"stopped after --max-minutes {opts.max_minutes}; checkpoint {ckpt_path}; continue with --resume")
                    return state.get("metrics", {})
            loss_avg = losses.read()
            valid_loss = evaluate_loss(model, valid_examples, max_tokens, device)
            _save_epoch_weights(model, opts.out, state["epoch"] + 1, max(average_last, 1))
            state["history"].append({"epoch": state["epoch"] + 1, "train_loss": loss_avg, "valid_loss": valid_loss,
                                     "lr": optimizer.param_groups[0]["lr"], "elapsed_s": round(state["elapsed"])})
            history.write(opts.out, opts.model, state["history"])  # for `tk plot`
            train_loss = "n/a" if loss_avg is None else f"{loss_avg:.3f}"
            bar.write(f"epoch {state['epoch'] + 1}: train loss {train_loss}, valid loss {valid_loss:.3f}")
            state["stopped_early"] = schedule.after_epoch(valid_loss, state)
            state["epoch"] += 1
            state["batch"] = 0
            save()
            epoch_seconds.append(time.time() - epoch_started)
            if opts.setting("finish_minutes"):
                epochs = time_boxed_epochs(opts.setting("epochs"), state, epoch_seconds, time.time() - started,
                                           60 * opts.setting("finish_minutes"), echo)
            if state["stopped_early"]:
                bar.write(f"valid loss has not improved for {state['bad_epochs']} epochs; stopping early "
                          f"(best: epoch {state['best_epoch']})")
                stopped_early = True
    except KeyboardInterrupt:
        bar.close()
        losses.read()
        save()
        raise Interrupted(f"interrupted; checkpoint saved to {ckpt_path}; continue with --resume") from None
    finally:
        epochs_data.close()
    bar.close()
    final = _final_weights(opts.out, state, average_last, stopped_early or schedule.kind == "plateau")
    state["final_weights"] = final["how"]
    live = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(final["state_dict"])
    model.cpu()
    metrics = final_metrics(model, entry, cfg, tokenizer, valid_pairs, valid_examples, max_tokens, opts.setting("eval_sentences"))
    state["metrics"] = metrics
    model.load_state_dict(live)
    save(final_state={k: v.cpu() for k, v in final["state_dict"].items()})
    echo(f"done: valid loss {metrics['valid_loss']:.3f}, valid BLEU {metrics['valid_bleu']:.1f} "
         f"(greedy, {metrics['bleu_sentences']} sentences, {final['how']}); checkpoint {ckpt_path}")
    return metrics


def _progress_bar(epochs: int, batches_per_epoch: int, state: dict):
    from tqdm import tqdm

    # Noise changes each epoch's batch count a little; the bar's total is an estimate.
    return tqdm(total=epochs * batches_per_epoch, initial=state["epoch"] * batches_per_epoch + state["batch"], unit="batch",
                dynamic_ncols=True, file=sys.stderr, mininterval=1.0)


def _epoch_path(out: Path, epoch: int) -> Path:
    return out / f"weights-epoch{epoch:03d}.pt"


def _save_epoch_weights(model: nn.Module, out: Path, epoch: int, keep: int) -> None:
    """Weights at the end of each epoch (fp32, no optimizer), the last `keep` of them, for
    checkpoint averaging and for early stopping's best epoch."""
    path = _epoch_path(out, epoch)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, tmp)
    os.replace(tmp, path)
    for old in sorted(out.glob("weights-epoch*.pt"))[:-max(keep, 1)]:
        old.unlink()


def _final_weights(out: Path, state: dict, average_last: int, use_best: bool) -> dict:
    """The weights to ship: the best epoch by validation loss (plateau schedule or early stop),
    else the mean of the last `average_last` epochs' weights."""
    if use_best and state.get("best_epoch") and _epoch_path(out, state["best_epoch"]).is_file():
        epoch = state["best_epoch"]
        return {"state_dict": torch.load(_epoch_path(out, epoch), weights_only=True), "how": f"best epoch {epoch}"}
    last = state["epoch"]
    paths = [_epoch_path(out, e) for e in range(max(1, last - average_last + 1), last + 1) if _epoch_path(out, e).is_file()]
    if not paths:
        raise UsageError(f"no epoch weights in {out}; the run finished no epoch")
    how = f"mean of epochs {last - len(paths) + 1}-{last}" if len(paths) > 1 else f"epoch {last}"
    return {"state_dict": average_state_dicts(paths), "how": how}


@torch.no_grad()
def evaluate_loss(model, examples, max_tokens: int, device: torch.device | str = "cpu") -> float:
    """Mean per-token negative log-likelihood (no smoothing) on held-out pairs."""
    model.eval()
    total, count = 0.0, 0
    for idx in data.length_batches(examples, max_tokens, seed=0):
        src, src_len, tgt_in, tgt_out = to_tensors(examples, idx, device)
        _, nll = label_smoothed_nll(model(src, src_len, tgt_in), tgt_out, 0.0)
        total += nll.item()
        count += int((tgt_out != PAD).sum())
    model.train()
    return total / max(count, 1)


def final_metrics(model, entry, cfg, tokenizer, valid_pairs, valid_examples, max_tokens, n_sentences) -> dict:
    from toolkit.core.scoring import bleu_chrf
    from toolkit.pytorch.torch_backend import TorchBackend

    model.eval()
    english, refs = data.references(valid_pairs)
    english, refs = english[:n_sentences], refs[:n_sentences]
    backend = TorchBackend(model, *entry.graphs(cfg))
    hyps = translate_texts(backend, tokenizer, english, DecodeOptions.bare(max_len=cfg.max_len, max_src_len=cfg.max_len))
    scores = bleu_chrf(hyps, refs)
    return {"valid_loss": evaluate_loss(model, valid_examples, max_tokens), "valid_bleu": scores["bleu"],
            "valid_chrf": scores["chrf"], "bleu_sentences": len(english)}


# The training code of each task a registry entry names (registry.ModelEntry.train).
TASKS: dict[str, Callable[..., dict]] = {"translation": train_seq2seq, "regression": train_kernel_regression}
