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


@main.command()
@click.argument("source")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Model directory to write, e.g. exported/transformer.")
@click.option("--random-init", is_flag=True, help="SOURCE is a model name; export small random weights (for tests).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --random-init.")
@click.option("--opset", type=int, default=18, show_default=True, help="ONNX opset (18 or newer).")
@click.option("--fp16", is_flag=True, help="Also write a float16 copy for the CUDA provider.")
@click.option("--optimize", is_flag=True, help="Also write an ONNX Runtime offline-optimised copy for the CPU provider.")
@click.option("--quantize", type=click.Choice(["int8"]), help="Also write a dynamic int8 copy for the CPU provider.")
@click.option("--force", is_flag=True, help="Overwrite an existing output directory.")
def export(source, out, random_init, seed, opset, fp16, optimize, quantize, force):
    """Export a checkpoint (or, with --random-init, a model name) to ONNX.

    Example: tk export runs/transformer/checkpoint.pt --out exported/transformer
    """
    import time

    from toolkit.export import ExportOptions
    from toolkit.export import export as run

    opts = ExportOptions(out=out, checkpoint=None if random_init else source, model=source if random_init else None,
                         random_init=random_init, seed=seed, opset=opset, fp16=fp16, optimize=optimize,
                         quantize=quantize, force=force, command=command_line())
    start = time.time()
    path = run(opts, echo=lambda m: click.echo(m, err=True))
    files = sorted(p for p in path.iterdir())
    click.echo(f"wrote {path} in {time.time() - start:.1f}s:")
    for f in files:
        click.echo(f"  {f.name:<22} {f.stat().st_size / 1024:>10,.1f} KiB")


@main.command()
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option("--provider", type=click.Choice(["cpu", "cuda", "all"]), default="cpu", show_default=True)
@click.option("--variant", "variants", multiple=True, type=click.Choice(["fp32", "fp16", "optimized", "int8"]),
              help="Graph variants to check [default: every variant in the directory].")
@click.option("--atol", type=float, help="Absolute tolerance [default: per variant, see README].")
@click.option("--rtol", type=float, help="Relative tolerance [default: per variant].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random sweep inputs.")
@click.option("--sentences", type=int, default=16, show_default=True, help="Test-split sentences to decode.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the full report as JSON.")
def verify(model_dir, provider, variants, atol, rtol, seed, sentences, json_path):
    """Measure parity between PyTorch and ONNX Runtime; exit 1 on any failure.

    Example: tk verify exported/transformer --provider all --json report.json
    """
    import time

    from toolkit import verify as v

    start = time.time()
    report = v.verify(model_dir, provider, list(variants) or None, atol, rtol, seed, sentences,
                      echo=lambda m: click.echo(m, err=True))
    click.echo(v.render(report))
    for p, why in report.skipped.items():
        click.echo(f"skipped provider {p}: {why}", err=True)
    if json_path:
        v.write_json(report, json_path)
    n = len(report.rows)
    click.echo(f"{n - len(report.failures)}/{n} checks passed in {time.time() - start:.1f}s (seed {seed})", err=True)
    v.raise_on_failure(report)


for _name in ("translate", "bench"):
    _not_yet(_name)
