"""`tk attention`: attention heatmaps from the exported graphs."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.commands.options import TakesModel, provider_option
from toolkit.core import architectures
from toolkit.core.errors import UsageError


@click.command(cls=TakesModel)
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.argument("text", nargs=-1)
@click.option("-o", "--output", "output_path", type=click.Path(path_type=Path),
              help="PNG to write [default: attention-MODEL.png]; the Transformer writes PNG-encoder, -decoder-self and -cross.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Also write the weights and tokens as JSON.")
@provider_option("cpu")
def attention(model_dir, text, output_path, json_path, provider):
    """Draw attention heatmaps from the exported graphs (no PyTorch needed; needs the plot extra).

    Translation models translate the sentence with the attention variant of their graphs and draw
    each output piece's attention; exported/nw draws its attention weights and regression fit.

    \b
    Example: tk attention exported/transformer "I'm home." -o docs/attention.png
             tk attention exported/nw -o docs/nw.png
    """
    import json

    from toolkit.cli.commands.options import writable_file
    from toolkit.core import manifest
    from toolkit.core.atomic import write_atomic
    from toolkit.deploy import attention_graphs, pictures

    m = manifest.load(model_dir)
    out = output_path or Path(f"attention-{m.model}.png")
    pictures.check_picture_path(out, "-o")
    writable_file(json_path, "--json")
    if architectures.get(m.model).figure == "kernel":
        if text:
            raise UsageError("exported/nw takes no sentence: it draws its test grid's attention over its training points")
        nw = attention_graphs.nadaraya_watson(model_dir)
        drawn = [pictures.nadaraya_watson_figure(nw, out)]
        payload = {k: v.tolist() for k, v in nw.items()}
    else:
        if len(text) != 1:
            raise UsageError("give one English sentence, in quotes: tk attention exported/transformer \"I'm home.\"")
        result = attention_graphs.translate(model_dir, list(text), provider)[0]
        click.echo(f"{result.sentence} -> {result.translation}", err=True)
        for piece, source, weight in attention_graphs.alignment(result):
            click.echo(f"  {piece:<16} <- {source:<16} {weight:.2f}", err=True)
        drawn = pictures.translation_figures(result, out)
        payload = result.to_json()
    if json_path:
        write_atomic(json_path, (json.dumps(payload) + "\n").encode("utf-8"), user_path=True)  # a FIFO or device: written through
        drawn.append(json_path)
    for path in drawn:
        click.echo(f"wrote {path} ({path.stat().st_size / 1024:,.0f} KiB)")
