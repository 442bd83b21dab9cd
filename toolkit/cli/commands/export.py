"""`tk export`."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.commands.options import (
    SEED,
    TOLERANCE,
    command_line,
)
from toolkit.convert import registry
from toolkit.core.errors import UsageError
from toolkit.core.shortlist import PER_TOKEN
from toolkit.core.variants import BUILT


def writer_options(command):
    """An option per writer of toolkit.convert.registry: `--NAME DIR` for one that writes a directory of its own,
    a flag for one that stores into the model directory; the command gets each value as _dest(NAME)."""
    for name, entry in reversed(registry.TABLE.items()):  # decorators apply bottom-up: --help lists them in table order
        kind = {"type": click.Path(path_type=Path), "metavar": "DIR"} if entry.takes_dir else {"is_flag": True}
        command = click.option(f"--{name}", _dest(name), help=entry.help, **kind)(command)
    return command


def _dest(name: str) -> str:
    return "writer_" + name.replace("-", "_")


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
@click.option("--source-lang", metavar="CODE", help="The language the model translates from (e.g. en), recorded in the directory: "
              "tk serve routes requests by it. A multilingual model's default source. With --target-lang.")
@click.option("--target-lang", metavar="CODE", help="The language the model translates into (e.g. de); with --source-lang.")
@click.option("--shortlist", "shortlist_file", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="On an exported directory: store a lexical shortlist estimated from FILE (one source sentence a line, or a "
                   "TSV of pairs) for `tk translate --shortlist`; check it with `tk verify DIR --shortlist`.")
@click.option("--per-token", type=click.IntRange(1, 10000), default=None,
              help=f"With --shortlist: candidates kept per source token (more keep more translations identical, and run slower) "
                   f"[default: {PER_TOKEN}].")
@writer_options
def export(source, out, random_init, seed, opset, fp16, optimize, quantize, keep_fp32, bleu_within, attention, force, source_lang,
           target_lang, shortlist_file, per_token, **writers):
    """Export a checkpoint (or, with --random-init, a model name) to ONNX.

    SOURCE may also be an exported model directory: the variants asked for are
    added to it, built from its own fp32 graphs.

    \b
    Example: tk export runs/transformer/checkpoint.pt --out exported/transformer
             tk export exported/transformer --quantize int8
             tk export exported/transformer --ctranslate2
             tk export exported/transformer --web site/  (then: python -m http.server -d site/)
             tk export exported/transformer --shortlist train.tsv
    """
    import time

    is_model_dir = not random_init and (Path(source) / "manifest.json").is_file()
    if not random_init and not is_model_dir and is_hf_directory(source):
        raise UsageError(f"{source} is a Hugging Face model directory (it has config.json), not a tk checkpoint; "
                         f"export it with the hf: prefix: tk export hf:{source} --out {out or 'DIR'}")
    if shortlist_file is not None:
        return _shortlist(Path(source), shortlist_file, per_token or PER_TOKEN, is_model_dir,
                          any((out, random_init, fp16, optimize, quantize, attention, source_lang, target_lang, *writers.values())))
    if per_token is not None:
        raise UsageError("--per-token sizes a shortlist; use it with --shortlist FILE")
    given = {name: writers[_dest(name)] for name in registry.TABLE}
    asked = {name: None if value is True else value for name, value in given.items() if value}
    if asked:  # the directory, as it is, written for another runtime
        if source_lang or target_lang:
            raise UsageError("--source-lang and --target-lang state a model directory's languages; run them without "
                             + " or ".join(f"--{name}" for name in asked))
        return _convert(Path(source), force, asked, any((out, random_init, fp16, optimize, quantize, attention)))
    pair = _pair(source_lang, target_lang)

    from toolkit.core.variants import ExportOptions

    if keep_fp32 and (quantize != "int8" or not is_model_dir):
        raise UsageError("--keep-fp32 auto chooses int8 layers of an exported directory: "
                         "tk export DIR --quantize int8 --keep-fp32 auto (export the checkpoint first)")
    if out is None and not is_model_dir:
        raise UsageError("missing --out: say which model directory to write, e.g. --out exported/transformer")
    opts = ExportOptions(out=out or Path(source), checkpoint=None if random_init else source, model=source if random_init else None,
                         random_init=random_init, seed=seed, opset=opset, fp16=fp16, optimize=optimize,
                         quantize=None if keep_fp32 else quantize, attention=attention, force=force, command=command_line(),
                         languages=pair)
    start = time.time()
    if is_model_dir:
        if out is not None and out.resolve() != Path(source).resolve():
            raise UsageError(f"{source} is an exported model directory; variants are added in place, so drop --out")
        path = _add_to(Path(source), opts, keep_fp32, bleu_within, languages_only=bool(pair) and not (fp16 or optimize or quantize or attention))
    else:
        from toolkit.pytorch.export import export as run

        path = run(opts, echo=lambda m: click.echo(m, err=True))
    if pair:
        _state_languages(path, *pair)
    files = sorted(p for p in path.iterdir())
    click.echo(f"wrote {path} in {time.time() - start:.1f}s:")
    for f in files:
        click.echo(f"  {f.name:<22} {f.stat().st_size / 1024:>10,.1f} KiB")


def _add_to(directory: Path, opts, keep_fp32: str | None, bleu_within: float, languages_only: bool) -> Path:
    """The variants asked for, added to an exported directory in place (nothing when only its languages are stated)."""
    from toolkit.convert import convert, guarded_int8, variants
    from toolkit.core import manifest

    echo = lambda m: click.echo(m, err=True)  # noqa: E731
    if languages_only:
        return directory
    declared = None
    if opts.attention:  # the model's own declaration of its attention outputs: the torch side
        from toolkit.pytorch.export import attention_declaration

        m = manifest.load(directory)
        declared = attention_declaration(m.model, m.config).get("attention")
    if not keep_fp32 or opts.fp16 or opts.optimize or opts.attention:
        convert(variants.writer(opts, declared), directory, None, opts.force, echo, opts.command)
    if keep_fp32:  # int8 with the layers it hurts most kept in float; the note says which
        convert(guarded_int8.writer(bleu_within), directory, None, opts.force, echo, opts.command)
        echo(manifest.load(directory).stored["int8"].note.rsplit("; ", 1)[1])
    return directory


def _shortlist(directory: Path, file: Path, per_token: int, is_model_dir: bool, other_options: bool) -> None:
    """--shortlist FILE: estimated and stored in an exported directory, alone (it translates FILE with the directory)."""
    if not is_model_dir or other_options:
        raise UsageError("--shortlist FILE stores a shortlist in an exported directory, alone: "
                         "tk export DIR --shortlist FILE (export and add variants first)")
    from toolkit.convert.shortlist import store

    table = store(directory, file, lambda m: click.echo(m, err=True), command_line(), per_token=per_token)
    sizes = table.sizes
    click.echo(f"wrote {directory / 'shortlist.npz'}: {sizes['entries']:,} candidates for {sizes['source_tokens']:,} source tokens, "
               f"{sizes['always']} always allowed")


def is_hf_directory(source: str) -> bool:
    """SOURCE names a directory that save_pretrained wrote (config.json, no tk checkpoint) without the `hf:` prefix
    that `tk export` reads one by: told so at once instead of "checkpoint DIR/checkpoint.pt does not exist"."""
    path = Path(source)
    return not source.startswith("hf:") and (path / "config.json").is_file() and not (path / "checkpoint.pt").exists()


def _pair(source_lang: str | None, target_lang: str | None) -> tuple[str, str] | None:
    """--source-lang and --target-lang, checked before any work: both or neither, each a language code."""
    from toolkit.core.declaration import LANGUAGE_CODE

    if source_lang is None and target_lang is None:
        return None
    if source_lang is None or target_lang is None:
        raise UsageError("--source-lang and --target-lang state the pair together; give both, e.g. --source-lang en --target-lang de")
    for option, code in (("--source-lang", source_lang), ("--target-lang", target_lang)):
        if not LANGUAGE_CODE.fullmatch(code):
            raise UsageError(f"{option} {code!r} is not a language code; write one as en, pt-BR or eng_Latn")
    if source_lang == target_lang:
        raise UsageError(f"--source-lang and --target-lang are both {source_lang}; a model translates between two languages")
    return source_lang, target_lang


def _state_languages(path: Path, source_lang: str, target_lang: str) -> None:
    """Records the pair in the directory's declaration (toolkit.core.tokenizers.declaration_stating: a multilingual
    model's codes are its own, checked against what it knows; a one-pair model's are taken as stated)."""
    from toolkit.core.tokenizers import state_languages

    source_lang, target_lang = state_languages(path, source_lang, target_lang)
    click.echo(f"{path} translates {source_lang} to {target_lang} (recorded in its manifest)", err=True)


def _convert(source: Path, force: bool, asked: dict[str, Path | None], other_options: bool) -> None:
    """--to-hf, --ctranslate2, --web: each is a writer of toolkit.convert.registry, run through the one converter
    pipeline on the directory as it is. `asked`: writer name -> its output directory (None: stored inside SOURCE)."""
    import time

    from toolkit.convert import NewDirectory, convert

    if len(asked) > 1:
        raise UsageError(f"{' and '.join('--' + n for n in asked)} each convert the directory on their own; run one at a time")
    name, out = next(iter(asked.items()))
    writer = registry.get(name)
    if other_options:
        raise UsageError(f"{writer.option} {writer.as_is}; run it without --out, --random-init, --fp16, --optimize, --quantize or --attention")
    start = time.time()
    files = convert(writer, source, out, force, echo=lambda m: click.echo(m, err=True), command=command_line())
    into = out if isinstance(writer.lands, NewDirectory) else source
    what = str(into) if isinstance(writer.lands, NewDirectory) else f"{writer.lands.what} into {source}"
    click.echo(f"wrote {what} in {time.time() - start:.1f}s:")
    width = max(map(len, files), default=0) + 2
    for name, size in files.items():
        click.echo(f"  {name:<{width}} {size / 1024:>10,.1f} KiB")
    if writer.next_step is not None:
        click.echo(writer.next_step(source, into), err=True)
