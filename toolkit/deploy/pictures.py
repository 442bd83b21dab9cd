"""Pictures of attention and training: labelled heatmaps, the kernel regression fit, loss curves.

matplotlib is an optional extra (`pip install 'tk-onnx-deploy[plot]'`), imported only here, with the
non-interactive Agg backend so a figure renders on a machine without a display. Torch-free:
the weights come from the exported graphs (toolkit.deploy.attention_graphs).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.core import architectures
from toolkit.core.atomic import check_output_path, save_with
from toolkit.core.errors import UsageError

CELL = 0.32  # inches per heatmap cell: piece labels stay readable, long sentences grow the figure
DPI = 90


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("drawing needs matplotlib; install the plot extra: pip install 'tk-onnx-deploy[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """Renders the figure in memory and writes the PNG atomically: a failure leaves an existing file as it was."""
    import io

    import matplotlib.pyplot as plt

    path = Path(path)
    rendered = io.BytesIO()
    try:
        fig.savefig(rendered, format="png", dpi=DPI, bbox_inches="tight")
    finally:
        plt.close(fig)
    # A 256-colour palette: heatmaps of one colour map lose nothing visible, and the file shrinks
    # about threefold (the committed pictures stay small). Pillow comes with matplotlib.
    from PIL import Image

    rendered.seek(0)
    with Image.open(rendered) as image:
        quantized = image.convert("RGB").quantize(256)
    save_with(path, lambda f: quantized.save(f, format="PNG", optimize=True), user_path=True)  # -o: a FIFO or device is written through
    return path


def check_picture_path(path: Path, option: str) -> None:
    """Before any work: tk draws PNG files, into a directory that exists."""
    if Path(path).suffix.lower() != ".png":
        raise UsageError(f"{option} {path}: tk draws PNG pictures; give a file name ending in .png")
    check_output_path(path, option)


def suffixed(path: Path, suffix: str) -> Path:
    """out.png -> out-cross.png: one file per figure of a model that draws several."""
    return path.with_name(f"{path.stem}-{suffix}{path.suffix or '.png'}")


def heatmap_grid(title: str, panels: list[tuple[str, np.ndarray]], ncols: int, rows: list[str], cols: list[str], path: Path) -> Path:
    """A grid of (queries x keys) heatmaps on one colour scale, labelled with the pieces."""
    plt = _pyplot()
    nrows = -(-len(panels) // ncols)
    w, h = max(1.8, CELL * len(cols) + 0.9), max(1.6, CELL * len(rows) + 0.9)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols + 1.2, h * nrows + 0.8), squeeze=False, constrained_layout=True)
    image = None
    for ax, (label, weights) in zip(axes.flat, panels):
        image = ax.imshow(weights, cmap="Reds", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_title(label, fontsize=9)
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=8)
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)


def _heads(name: str, weights: np.ndarray, what: str, layer: int) -> list[tuple[str, np.ndarray]]:
    return [(f"{what}, layer {layer + 1}, head {h + 1}", weights[h]) for h in range(weights.shape[0])]


def translation_figures(att, path: Path) -> list[Path]:
    """The figures of one translated sentence (toolkit.deploy.attention_graphs.Attention)."""
    caption = f"{att.model}: \u201c{att.sentence}\u201d \u2192 \u201c{att.translation}\u201d"
    if architectures.get(att.model).figure == "bahdanau":
        return [heatmap_grid(f"{caption}\nBahdanau attention of each output piece over the source",
                             [("decoder step (rows) over source pieces (columns)", att.weights["cross_attention"])], 1,
                             att.target, att.source, path)]
    heads = att.weights["encoder_attention_0"].shape[0]
    drawn = []
    for suffix, key, what, rows, cols in (
            ("encoder", "encoder_attention", "encoder self-attention", att.source, att.source),
            ("decoder-self", "self_attention", "decoder self-attention", att.target, att.target_inputs),
            ("cross", "cross_attention", "cross-attention", att.target, att.source)):
        # Each stack's own depth: a deep encoder and a shallow decoder (the student's 6 + 2) draw 6 and 2 rows.
        layers = sorted(int(n.rsplit("_", 1)[1]) for n in att.weights if n.startswith(f"{key}_"))
        panels = [p for i in layers for p in _heads(key, att.weights[f"{key}_{i}"], what, i)]
        drawn.append(heatmap_grid(f"{caption}\n{what}: rows attend over columns ({len(layers)} layers x {heads} heads)",
                                  panels, heads, rows, cols, suffixed(path, suffix)))
    return drawn


def nadaraya_watson_figure(nw: dict, path: Path) -> Path:
    """The two attention matrices (test inputs over sorted training inputs) and the regression plot."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)
    extent = (float(nw["x_train"].min()), float(nw["x_train"].max()), float(nw["x_test"].max()), float(nw["x_test"].min()))
    for ax, key, label in ((axes[0], "nonparametric_weights", "non-parametric (w = 1)"),
                           (axes[1], "learned_weights", f"learned width (w = {float(nw['w']):.2f})")):
        image = ax.imshow(nw[key], cmap="Reds", aspect="auto", extent=extent, interpolation="nearest")
        ax.set_title(f"attention weights, {label}", fontsize=10)
        ax.set_xlabel("training inputs (keys)")
        ax.set_ylabel("test inputs (queries)")
        fig.colorbar(image, ax=ax, shrink=0.8)
    ax = axes[2]
    ax.plot(nw["x_test"], nw["truth"], color="black", label="truth: 2 sin(x) + x^0.8")
    ax.plot(nw["x_test"], nw["nonparametric"], "--", label="non-parametric (w = 1)")
    ax.plot(nw["x_test"], nw["learned"], label=f"learned width (w = {float(nw['w']):.2f})")
    ax.plot(nw["x_train"], nw["y_train"], "o", alpha=0.5, markersize=4, label="training points")
    ax.set_title("Nadaraya-Watson regression (exported graph)", fontsize=10)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.legend(fontsize=8)
    fig.suptitle("nw: attention pooling with a Gaussian kernel", fontsize=11)
    return _save(fig, path)


def training_figure(history: list[dict], title: str, path: Path) -> Path:
    """Loss per epoch (training, and validation where recorded); BLEU on a second axis where recorded."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4), constrained_layout=True)
    epochs = [h["epoch"] for h in history]
    translation = any("valid_loss" in h for h in history)
    # Translation models: training loss is label-smoothed (0.1) and a running mean over the epoch's
    # batches with dropout on; validation loss is the plain NLL, so the two curves sit apart.
    train_label = "training loss (label-smoothed, running mean)" if translation else "training loss"
    for key, label in (("train_loss", train_label), ("valid_loss", "validation loss (NLL)")):
        points = [(e, h[key]) for e, h in zip(epochs, history) if h.get(key) is not None]
        if points:
            ax.plot(*zip(*points), marker="o", label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss per token" if translation else "loss")
    bleu = [(e, h["valid_bleu"]) for e, h in zip(epochs, history) if h.get("valid_bleu") is not None]
    if bleu:
        twin = ax.twinx()
        twin.plot(*zip(*bleu), marker="s", color="tab:green", label="validation BLEU")
        twin.set_ylabel("BLEU")
        twin.legend(loc="upper center", fontsize=8)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)
