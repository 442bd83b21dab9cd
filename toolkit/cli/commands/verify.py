"""`tk verify`."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.commands.options import (
    DATA_OPTION,
    DEFAULT_RUNTIME,
    LANGUAGES,
    SEED,
    TOLERANCE,
    TakesModel,
    provider_option,
    runtime_option,
    writable_file,
)
from toolkit.core.errors import UsageError
from toolkit.core.variants import NAMES


# Over 60 lines: one command routing to three checks (the graphs', --to-hf's and --shortlist's) with every option
# declared on it; split, each piece would take most of its arguments.
@click.command(cls=TakesModel)
@click.argument("model_dir", type=click.Path(path_type=Path))
@provider_option("cpu", also=("all",))
@runtime_option()
@click.option("--variant", "variants", multiple=True, type=click.Choice([*NAMES, "attention"]),
              help="Graph variants to check [default: every variant in the directory, and attention where declared].")
@click.option("--atol", type=TOLERANCE, help="Absolute tolerance [default: per variant, see README].")
@click.option("--rtol", type=TOLERANCE, help="Relative tolerance [default: per variant].")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the random sweep inputs.")
@click.option("--sentences", type=click.IntRange(0, 10000),
              help="Test-split sentences to decode [default: 16; 4 for a model over 20M weights unless --full].")
@click.option("--max-len", type=click.IntRange(1, 4096),
              help="Tokens each decode runs to at most [default: 64, or the model's own limit with --full; never beyond the model's].")
@click.option("--full", is_flag=True,
              help="Everything, at any size: decodes to the model's own limit, and what the default leaves out for a large model "
                   "(it names what on stderr).")
@DATA_OPTION
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the full report as JSON.")
@click.option("--record", is_flag=True, help="Store a summary of the verdict in the directory's manifest.json.")
@click.option("--checkpoint", "checkpoint_path", type=click.Path(path_type=Path),
              help="Compare against this checkpoint (its weights digest must match the graphs' weights): a tk checkpoint, "
                   "hf:DIR for a model imported from Hugging Face, MODULE:FUNCTION for your own (tk never imports it unasked).")
@click.option("--localize/--no-localize", default=None,
              help="Name the first node (and PyTorch module) where the graph parts from PyTorch [default: when a check fails].")
@click.option("--localize-against", metavar="RUNTIME/PROVIDER/VARIANT",
              help="Localize against another execution of the graphs instead of PyTorch, e.g. onnxruntime/cpu/fp32 "
                   "(CUDA against CPU, int8 against fp32, OpenVINO against ONNX Runtime); implies --localize.")
@click.option("--localize-plot", type=click.Path(path_type=Path), metavar="PNG",
              help="Draw each intermediate tensor's error of the localized case (needs the plot extra).")
@click.option("--int8-layers", is_flag=True,
              help="Also rank the int8 layers: each quantised alone, its error in the log-probabilities along fp32's translations.")
@click.option("--strict", is_flag=True,
              help="Fail when transformers' own generate cannot run on an imported model (by default a warning: the checks that "
                   "ran decide, tk's decode held to PyTorch's in its place).")
@click.option("--expect-digest", help="Fail unless the graphs' weights have this weights_sha256 (from the checkpoint or a trusted manifest).")
@click.option("--to-hf", "hf_dir", type=click.Path(path_type=Path), metavar="DIR",
              help="Instead: check the Hugging Face MarianMTModel directory that `tk export MODEL_DIR --to-hf DIR` wrote against "
                   "the fp32 graphs (transformers' log-probabilities, tokenizer and greedy generate; needs the hf extra).")
@click.option("--shortlist", is_flag=True,
              help="Instead: check the directory's shortlist: held-out sentences (--sentences, default 1,000) translated greedily with "
                   "and without it on --variant (default fp32); refused, exit 1, when under --min-identical of them are identical or "
                   "BLEU or chrF drop more than 0.5. Names the sentences that differ.")
@click.option("--min-identical", type=click.FloatRange(0.0, 1.0), default=0.995, show_default=True,
              help="With --shortlist: the share of translations it must leave identical.")
@LANGUAGES
def verify(model_dir, provider, runtime, variants, atol, rtol, seed, sentences, max_len, full, data_path, json_path, record, checkpoint_path,
           int8_layers, expect_digest, localize, localize_against, localize_plot, hf_dir, shortlist, min_identical, languages, strict):
    """Measure parity between PyTorch and ONNX Runtime (or OpenVINO); exit 1 on any failure (an imported model's
    generate that fails inside transformers: a warning, the checks that ran decide; --strict fails).

    \b
    Example: tk verify exported/transformer --provider all --json report.json
             tk verify exported/transformer --runtime openvino
    """
    import time

    from toolkit.verify.record import raise_on_failure, record_summary, write_json
    from toolkit.verify.render import render
    from toolkit.verify.run import is_digest
    from toolkit.verify.run import verify as run_verify

    writable_file(json_path, "--json")
    writable_file(localize_plot, "--localize-plot")
    if shortlist:
        return _verify_shortlist(model_dir, variants, sentences, data_path, min_identical, hf_dir, record)
    if hf_dir is not None:
        if max_len is not None or full:
            raise UsageError("--to-hf runs its own checks; drop --max-len and --full")
        _alone_with_hf(provider, runtime, variants, record, checkpoint_path, int8_layers, expect_digest, localize, localize_against, localize_plot,
                       any(v is not None for v in languages.values()), strict)
        return _verify_hf(model_dir, hf_dir, atol, rtol, seed, 16 if sentences is None else sentences, data_path, json_path)
    if expect_digest is not None and not is_digest(expect_digest):
        raise UsageError(f"--expect-digest must be 64 hex digits (a weights_sha256), got {expect_digest!r}")
    against = None
    if localize_against:
        from toolkit.verify.localize import Side

        against = Side.parse(localize_against)
        localize = True if localize is None else localize
    start = time.time()
    report = run_verify(model_dir, provider, list(variants) or None, atol, rtol, seed, sentences,
                      echo=lambda m: click.echo(m, err=True), checkpoint=checkpoint_path, expect_digest=expect_digest,
                      runtime=runtime, data=data_path, localize=localize, localize_against=against, max_len=max_len, full=full,
                      languages=languages, strict=strict)
    click.echo(render(report))
    if report.localization is not None:
        from toolkit.verify import localize as localization

        click.echo("\n".join(localization.render(report.localization)))
        if localize_plot:
            click.echo(f"wrote {localization.plot(report.localization, localize_plot)}", err=True)
    if int8_layers:
        report.int8_layers = _int8_layers(model_dir, data_path)
    for p, why in report.skipped.items():
        click.echo(f"skipped provider {p}: {why}", err=True)
    if json_path:
        write_json(report, json_path)
    for line in report.warnings:
        click.echo(f"warning: {line}", err=True)
    n = len(report.rows)
    seconds = time.time() - start
    click.echo(f"what passing proves ({report.reference_kind} reference): {report.reference_proves}", err=True)
    click.echo(f"{n - len(report.failures)}/{n} checks passed in {seconds:.1f}s (seed {seed}, {report.runtime})", err=True)
    if record:
        keys = record_summary(report, model_dir, seconds)
        click.echo(f"recorded {', '.join(keys)} in {Path(model_dir) / 'manifest.json'} (other runtimes' and providers' records kept)", err=True)
    raise_on_failure(report)


def _verify_shortlist(model_dir: Path, variants: tuple[str, ...], sentences: int | None, data_path, min_identical: float,
                      hf_dir: Path | None, record: bool = False) -> None:
    from toolkit.verify import shortlist

    if len(variants) > 1 or hf_dir is not None:
        raise UsageError("--shortlist checks the shortlist on one variant; give at most one --variant, without --to-hf")
    verdict = shortlist.check(model_dir, variants[0] if variants else "fp32", shortlist.SENTENCES if sentences is None else sentences,
                              data_path, min_identical)
    for line in shortlist.render(verdict):
        click.echo(line)
    if record:
        key = shortlist.record(model_dir, verdict)
        click.echo(f"recorded the shortlist's verdict on {key} in {Path(model_dir) / 'manifest.json'}", err=True)
    if verdict.problems:
        raise SystemExit(1)


def _alone_with_hf(provider, runtime, variants, record, checkpoint_path, int8_layers, expect_digest, localize, localize_against,
                   localize_plot, languages: bool = False, strict: bool = False) -> None:
    """--to-hf runs its own checks: the options of the graphs' checks are refused beside it, not ignored."""
    others = [name for name, given in (("--provider", provider != "cpu"), ("--runtime", runtime != DEFAULT_RUNTIME), ("--variant", variants),
                                       ("--record", record), ("--checkpoint", checkpoint_path), ("--int8-layers", int8_layers),
                                       ("--expect-digest", expect_digest), ("--localize", localize is not None),
                                       ("--localize-against", localize_against), ("--localize-plot", localize_plot),
                                       ("--source-lang/--target-lang", languages), ("--strict", strict)) if given]
    if others:
        raise UsageError(f"--to-hf compares a Hugging Face directory with the fp32 graphs on ONNX Runtime's CPU; drop {', '.join(others)}")


def _verify_hf(model_dir: Path, hf_dir: Path, atol, rtol, seed: int, sentences: int, data_path, json_path) -> None:
    import time

    from toolkit.convert.to_hf_parity import verify_hf
    from toolkit.verify.record import raise_on_failure, write_json
    from toolkit.verify.render import render

    start = time.time()
    report = verify_hf(model_dir, hf_dir, atol, rtol, seed, sentences, data_path, echo=lambda m: click.echo(m, err=True))
    click.echo(render(report))
    if json_path:
        write_json(report, json_path)
    n = len(report.rows)
    click.echo(f"what passing proves ({report.reference_kind} reference): {report.reference_proves}", err=True)
    click.echo(f"{n - len(report.failures)}/{n} checks passed in {time.time() - start:.1f}s (seed {seed}, {report.runtime})", err=True)
    raise_on_failure(report)


def _int8_layers(model_dir: Path, data_path) -> dict:
    from toolkit.core.manifest import load
    from toolkit.graphs.variants import graph_source
    from toolkit.verify import int8_layers as layers
    from toolkit.verify.checks import held_out_sentences

    m = load(model_dir)
    m.translation_tokenizer()  # a usage error for a model that does not translate
    english, origin = held_out_sentences(layers.PROBE, data_path)
    click.echo(f"int8 layers: each quantised alone, {len(english)} sentences from the {origin}, "
               f"error of fp32's {layers.TOP} best log-probabilities at each position of its greedy translation", err=True)
    probe = layers.Probe(m, english)
    whole = probe.measure({g: graph_source(m, g, "int8")[0] for g in m.graphs})
    table = layers.layer_table(m, english, probe=probe)
    click.echo(layers.render(table, whole))
    return {"layers": [r.__dict__ for r in table], "all_int8": whole.__dict__}
