"""`tk train`."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.commands.options import (
    DATA_OPTION,
    POSITIVE,
    SEED,
    THREADS,
    FiniteFloat,
    command_line,
)


@click.command()
@click.argument("model")
@click.option("--out", type=click.Path(path_type=Path), help="Run directory for checkpoint.pt [default: runs/MODEL].")
@DATA_OPTION
@click.option("--exclude", type=click.Path(exists=True, dir_okay=False),
              help="A public test set (eng<TAB>fra<TAB>English<TAB>French) whose English sentences are kept out of training.")
@click.option("--preset", type=click.Choice(["tiny", "base", "student"]), default="base", show_default=True,
              help="Size preset: tiny (a few hundred pairs, about a minute), base (the shipped models) or student "
                   "(transformer only: 6 + 2 layers, copy pairs, the shipped Transformer's recipe; docs/models.md).")
@click.option("--pre-ln", is_flag=True, help="Transformer with pre-LN blocks and a final LayerNorm.")
@click.option("--epochs", type=POSITIVE, help="Passes over the training pairs [preset].")
@click.option("--lr", type=FiniteFloat(min=0.0, min_open=True), help="Peak learning rate [preset].")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--resume", is_flag=True, help="Continue the checkpoint in --out.")
@click.option("--limit-pairs", type=POSITIVE, help="Train on a random sample of this many pairs.")
@click.option("--max-minutes", type=FiniteFloat(min=0.0, min_open=True), help="Stop with a checkpoint after this many minutes.")
@click.option("--threads", type=THREADS, help="Torch CPU threads [default: all cores].")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16"]), default="auto", show_default=True,
              help="bf16 autocast halves CPU training time where the CPU has native bf16; weights stay fp32.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: a CUDA GPU when torch sees one, else the CPU.")
@click.option("--noise/--no-noise", default=None,
              help="Robustness noise on the training pairs: case, final punctuation, names, placeholders [preset: on for base].")
@click.option("--tokenizer", "tokenizer_path", type=click.Path(dir_okay=False),
              help="SentencePiece model to share between models: used if it exists, else trained and written there.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a size, e.g. --set num_layers=2 --set max_tokens=4000.")
def train(model: str, out, data_path, exclude, preset, pre_ln, epochs, lr, seed, resume, limit_pairs, max_minutes, threads, precision,
          device, noise, tokenizer_path, sets):
    """Train MODEL: nw (kernel regression), seq2seq (GRU + Bahdanau) or transformer.

    Example: tk train transformer --preset tiny --out runs/tiny
    """
    from toolkit.pytorch.train import TrainOptions
    from toolkit.pytorch.train import train as run

    overrides = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got '{item}'", param_hint="--set")
        overrides[key.strip()] = value  # parsed and checked against the model's config by train()
    opts = TrainOptions(model=model, out=out or Path("runs") / model, data=data_path, exclude=exclude, preset=preset,
                        pre_ln=pre_ln, epochs=epochs, lr=lr, seed=seed, resume=resume, limit_pairs=limit_pairs,
                        max_minutes=max_minutes, threads=threads, precision=precision, device=device, noise=noise,
                        tokenizer=tokenizer_path, overrides=overrides, command=command_line())
    run(opts, echo=lambda m: click.echo(m, err=True))
