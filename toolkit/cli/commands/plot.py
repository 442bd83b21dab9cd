"""`tk plot`: the loss curves `tk train` recorded."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", "output_path", type=click.Path(path_type=Path), help="PNG to write [default: RUN_DIR/history.png].")
def plot(run_dir, output_path):
    """Draw the loss curves that `tk train` recorded in RUN_DIR/history.json.

    Example: tk plot runs/tiny
    """
    from toolkit.core import history
    from toolkit.deploy import pictures

    out = output_path or Path(run_dir) / "history.png"
    pictures.check_picture_path(out, "-o")
    data = history.read(run_dir)
    path = pictures.training_figure(data["epochs"], f"{data.get('model', '')}: {run_dir}", out)
    click.echo(f"wrote {path} ({len(data['epochs'])} epochs)")
