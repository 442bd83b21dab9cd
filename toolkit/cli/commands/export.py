"""`tk export`."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.commands.options import (
    SEED,
    TOLERANCE,
    command_line,
)
from toolkit.core.errors import UsageError
from toolkit.core.variants import BUILT


@click.command()
@click.argument("source")
@click.option("--out", type=click.Path(path_type=Path), help="Model directory to write, e.g. exported/transformer.")
@click.option("--random-init", is_flag=True, help="SOURCE is a model name; export small random weights (for tests).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed for --random-init.")
@click.option("--opset", type=click.IntRange(18, 23), default=18, show_default=True, help="ONNX opset (18 or newer).")
@click.option("--fp16", is_flag=True, help="Also write a float16 copy for the CUDA provider.")
@click.option("--optimize", is_flag=True, help="Also write an ONNX Runtime offline-optimised copy for the CPU provider.")
@click.option("--quantize", type=click.Choice([v for v in BUILT if v.startswith("int")]), help="Also write a dynamic int8 copy for the CPU provider.")
@click.option("--keep-fp32", type=click.Choice(["auto"]),
              help="With --quantize int8 on an exported directory: keep the layers int8 hurts most in float, as few as needed "
                   "for `tk verify --variant int8` to pass and greedy BLEU to stay within --bleu-within of fp32's.")
@click.option("--bleu-within", type=TOLERANCE, default=0.3, show_default=True,
              help="With --keep-fp32 auto: greedy BLEU (1,000 held-out sentences) int8 may lose against fp32.")
@click.option("--attention", is_flag=True, help="On an exported directory: declare the attention outputs that `tk attention` "
              "and `tk verify` use (new exports declare them already).")
@click.option("--force", is_flag=True, help="Replace an existing exported model directory (one holding a tk manifest.json).")
@click.option("--ctranslate2", "ct2", is_flag=True,
              help="On an exported Transformer: also store its weights converted for CTranslate2, for --runtime ctranslate2 "
                   "(float32; int8 is chosen at load; --force converts again).")
@click.option("--web", "web_dir", type=click.Path(path_type=Path), metavar="DIR",
              help="On an exported directory: write a static site to DIR that translates in the browser (needs `npm ci --prefix web`; "
              "--force replaces an existing site).")
@click.option("--to-hf", "hf_dir", type=click.Path(path_type=Path), metavar="DIR",
              help="On an exported Transformer: write it as a Hugging Face MarianMTModel directory DIR (safetensors, "
              "config, generation config, tokenizer.json) that transformers loads with from_pretrained (--force replaces one).")
def export(source, out, random_init, seed, opset, fp16, optimize, quantize, keep_fp32, bleu_within, attention, force, ct2, web_dir, hf_dir):
    """Export a checkpoint (or, with --random-init, a model name) to ONNX.

    SOURCE may also be an exported model directory: the variants asked for are
    added to it, built from its own fp32 graphs.

    \b
    Example: tk export runs/transformer/checkpoint.pt --out exported/transformer
             tk export exported/transformer --quantize int8
             tk export exported/transformer --ctranslate2
             tk export exported/transformer --web site/  (then: python -m http.server -d site/)
    """
    import time

    is_model_dir = not random_init and (Path(source) / "manifest.json").is_file()
    if hf_dir is not None or ct2 or web_dir is not None:  # the directory, as it is, written for another runtime
        return _convert(Path(source), force, is_model_dir, hf_dir, ct2, web_dir,
                        any((out, random_init, fp16, optimize, quantize, attention)))

    from toolkit.deploy.stored_variants import ExportOptions, add_variants

    if keep_fp32 and (quantize != "int8" or not is_model_dir):
        raise UsageError("--keep-fp32 auto chooses int8 layers of an exported directory: "
                         "tk export DIR --quantize int8 --keep-fp32 auto (export the checkpoint first)")
    if out is None and not is_model_dir:
        raise UsageError("missing --out: say which model directory to write, e.g. --out exported/transformer")
    opts = ExportOptions(out=out or Path(source), checkpoint=None if random_init else source, model=source if random_init else None,
                         random_init=random_init, seed=seed, opset=opset, fp16=fp16, optimize=optimize,
                         quantize=None if keep_fp32 else quantize, attention=attention, force=force, command=command_line())
    start = time.time()
    if is_model_dir:
        if out is not None and out.resolve() != Path(source).resolve():
            raise UsageError(f"{source} is an exported model directory; variants are added in place, so drop --out")
        echo = lambda m: click.echo(m, err=True)  # noqa: E731
        declared = None
        if attention:  # the model's own declaration of its attention outputs: the torch side
            from toolkit.core import manifest
            from toolkit.pytorch.export import attention_declaration

            m = manifest.load(source)
            declared = attention_declaration(m.model, m.config).get("attention")
        if keep_fp32:
            from toolkit.verify import guarded_int8

            if fp16 or optimize or attention:
                add_variants(Path(source), opts, echo=echo, attention=declared)
            path = guarded_int8.add(Path(source), bleu_within, force, opts.command, echo=echo)
        else:
            path = add_variants(Path(source), opts, echo=echo, attention=declared)
    else:
        from toolkit.pytorch.export import export as run

        path = run(opts, echo=lambda m: click.echo(m, err=True))
    files = sorted(p for p in path.iterdir())
    click.echo(f"wrote {path} in {time.time() - start:.1f}s:")
    for f in files:
        click.echo(f"  {f.name:<22} {f.stat().st_size / 1024:>10,.1f} KiB")


def _convert(source: Path, force: bool, is_model_dir: bool, hf_dir: Path | None, ct2: bool, web_dir: Path | None,
             other_options: bool) -> None:
    """--to-hf, --ctranslate2 and --web: each converts an exported directory on its own."""
    asked = [flag for flag, given in (("--to-hf", hf_dir is not None), ("--ctranslate2", ct2), ("--web", web_dir is not None)) if given]
    if len(asked) > 1:
        raise UsageError(f"{' and '.join(asked)} each convert the directory on their own; run one at a time")
    if hf_dir is not None:
        return _export_hf(source, hf_dir, force, is_model_dir, other_options)
    if ct2:
        return _export_ct2(source, force, is_model_dir, other_options)
    return _export_web(source, web_dir, force, is_model_dir, other_options)


def _export_ct2(source: Path, force: bool, is_model_dir: bool, other_options: bool) -> None:
    import time

    from toolkit.runtimes.ctranslate2 import stored

    if not is_model_dir:
        raise UsageError(f"--ctranslate2 needs an exported model directory (one with manifest.json), not {source}; "
                         "export the checkpoint first")
    if other_options:
        raise UsageError("--ctranslate2 converts the directory's fp32 weights as they are; run it without --out, --random-init, "
                         "--fp16, --optimize, --quantize or --attention")
    start = time.time()
    stored.add(source, force, command_line(), echo=lambda m: click.echo(m, err=True))
    from toolkit.core import manifest

    record = manifest.load(source).converted["ctranslate2"]
    click.echo(f"wrote the CTranslate2 model into {source} in {time.time() - start:.1f}s:")
    for entry in record.files.values():
        click.echo(f"  {entry.file:<32} {entry.bytes / 1024:>10,.1f} KiB")
    click.echo(f"check it with: tk verify {source} --runtime ctranslate2", err=True)


def _export_web(source: Path, web_dir: Path, force: bool, is_model_dir: bool, other_options: bool) -> None:
    import time

    from toolkit.deploy.web_site import downloads, export_web

    if not is_model_dir:
        raise UsageError(f"--web needs an exported model directory (one with manifest.json), not {source}; export the checkpoint first")
    if other_options:
        raise UsageError("--web writes a site from the directory as it is; run it without --out, --fp16, --optimize, --quantize or --attention")
    start = time.time()
    files = export_web(source, web_dir, force, echo=lambda m: click.echo(m, err=True))
    click.echo(f"wrote {web_dir} in {time.time() - start:.1f}s:")
    for name, size in files.items():
        click.echo(f"  {name:<38} {size / 1024:>10,.1f} KiB")
    sizes = ", ".join(f"{v} {n / 2**20:,.1f} MiB" for v, n in downloads(web_dir).items())
    click.echo(f"download per page load (runtime, tokenizer and one variant's graphs): {sizes} (index.html?variant=int8); "
               f"serve it with any static file server, e.g. python -m http.server -d {web_dir}")


def _export_hf(source: Path, hf_dir: Path, force: bool, is_model_dir: bool, other_options: bool) -> None:
    import time

    from toolkit.deploy.to_hf import write_hf

    if not is_model_dir:
        raise UsageError(f"--to-hf needs an exported model directory (one with manifest.json), not {source}; export the checkpoint first")
    if other_options:
        raise UsageError("--to-hf converts the directory as it is; run it without --out, --random-init, --fp16, --optimize, "
                         "--quantize or --attention")
    start = time.time()
    files = write_hf(source, hf_dir, force, echo=lambda m: click.echo(m, err=True))
    click.echo(f"wrote {hf_dir} in {time.time() - start:.1f}s:")
    for name, size in files.items():
        click.echo(f"  {name:<24} {size / 1024:>10,.1f} KiB")
    click.echo(f"check it with: tk verify {source} --to-hf {hf_dir}", err=True)
