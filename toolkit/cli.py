"""The `tk` command line. Thin: parse options, call one library function, print.

Heavy imports (torch, onnxruntime) live inside the commands so `tk --help` is
instant and `tk translate` never loads torch.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from toolkit import __version__
from toolkit.errors import ToolkitError

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "exported" / "transformer"


class Group(click.Group):
    """Turns every ToolkitError into one line on stderr and its exit code, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ToolkitError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)


def command_line() -> str:
    return "tk " + shlex.join(sys.argv[1:])


@click.group(cls=Group)
@click.version_option(__version__, prog_name="tk")
def main() -> None:
    """tk: train attention models, export them to ONNX, verify parity, translate with the graphs alone."""


@main.command()
@click.argument("model")
@click.option("--out", type=click.Path(path_type=Path), help="Run directory for checkpoint.pt [default: runs/MODEL].")
@click.option("--data", "data_path", help="fra-eng.zip or fra.txt [default: $TK_DATA, the cache, or a download].")
@click.option("--exclude", type=click.Path(exists=True, dir_okay=False),
              help="A public test set (eng<TAB>fra<TAB>English<TAB>French) whose English sentences are kept out of training.")
@click.option("--preset", type=click.Choice(["tiny", "base"]), default="base", show_default=True,
              help="Size preset: tiny (a few hundred pairs, about a minute) or base (the shipped models).")
@click.option("--pre-ln", is_flag=True, help="Transformer with pre-LN blocks and a final LayerNorm.")
@click.option("--epochs", type=int, help="Passes over the training pairs [preset].")
@click.option("--lr", type=float, help="Peak learning rate [preset].")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--resume", is_flag=True, help="Continue the checkpoint in --out.")
@click.option("--limit-pairs", type=int, help="Train on a random sample of this many pairs.")
@click.option("--max-minutes", type=float, help="Stop with a checkpoint after this many minutes.")
@click.option("--threads", type=int, help="Torch CPU threads [default: all cores].")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16"]), default="auto", show_default=True,
              help="bf16 autocast halves CPU training time where the CPU has native bf16; weights stay fp32.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a size, e.g. --set num_layers=2 --set max_tokens=4000.")
def train(model: str, out, data_path, exclude, preset, pre_ln, epochs, lr, seed, resume, limit_pairs, max_minutes, threads, precision, sets):
    """Train MODEL: nw (kernel regression), seq2seq (GRU + Bahdanau) or transformer.

    Example: tk train transformer --preset tiny --out runs/tiny
    """
    from toolkit.train import TrainOptions
    from toolkit.train import train as run

    overrides = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got '{item}'", param_hint="--set")
        overrides[key] = float(value) if "." in value else int(value)
    opts = TrainOptions(model=model, out=out or Path("runs") / model, data=data_path, exclude=exclude, preset=preset,
                        pre_ln=pre_ln, epochs=epochs, lr=lr, seed=seed, resume=resume, limit_pairs=limit_pairs,
                        max_minutes=max_minutes, threads=threads, precision=precision, overrides=overrides, command=command_line())
    run(opts, echo=lambda m: click.echo(m, err=True))


def _not_yet(name: str):
    @main.command(name=name, context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def stub(args):
        click.echo(f"error: tk {name} is not yet implemented", err=True)
        sys.exit(2)

    stub.__doc__ = f"(not yet implemented) tk {name}"
    return stub


for _name in ("export", "verify", "translate", "bench"):
    _not_yet(_name)
