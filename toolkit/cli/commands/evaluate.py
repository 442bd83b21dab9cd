"""`tk evaluate`."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.commands.options import (
    BEAM,
    DATA_OPTION,
    LANGUAGES,
    POSITIVE,
    SEED,
    THREADS,
    TakesModel,
    provider_option,
)
from toolkit.core.variants import NAMES


@click.command(cls=TakesModel)
@click.argument("model_dir", type=click.Path(path_type=Path))
@DATA_OPTION
@click.option("--challenge", type=click.Path(exists=True, dir_okay=False), help="Tatoeba Challenge test file (eng-fra).")
@click.option("--beam", "beams", type=BEAM, multiple=True, help="Beam sizes to score [default: 1 and 4].")
@click.option("--limit", type=POSITIVE, help="Score only the first N sentences of each set.")
@click.option("--record", is_flag=True, help="Store the scores in the directory's manifest.json.")
@click.option("--calibrate", is_flag=True,
              help="First fit the confidence map (tk translate --confidence) on the corpus's valid split, every --challenge "
                   "sentence left out, at the first --beam (default 1), and store it in manifest.json; needs --challenge.")
@click.option("--threads", type=THREADS, help="ONNX Runtime intra-op threads [default: all cores].")
@click.option("--variant", type=click.Choice(NAMES), default="fp32", show_default=True,
              help="Which exported graphs to score (recorded per variant).")
@provider_option("cpu", help="Where ONNX Runtime runs the graphs (the scores and the confidence; --record stores CPU scores only).")
@click.option("--robustness", is_flag=True,
              help="Instead: score the held-out split as people type it (no final punctuation, lowercase, capitals, "
                   "short phrases, names/numbers/URLs, several sentences per line) and the runaway rate.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the robustness sets.")
@click.option("--raw", is_flag=True, help="With --robustness: no input handling (as tk translate --raw), to measure what it adds.")
@click.option("--names", "names_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Instead: how many unseen names come out verbatim (k of n) on a name test set, e.g. docs/names-test.tsv "
                   "[beam: the first --beam, default 4].")
@LANGUAGES
def evaluate(model_dir, data_path, challenge, beams, limit, record, calibrate, threads, variant, provider, robustness, seed, raw,
             names_path, languages):
    """Score an exported model: BLEU and chrF (sacrebleu) on the test split and the Tatoeba Challenge set, and how well
    the translations' confidences pick out the bad ones (the mean sentence chrF of the 10% least confident against the
    rest's, and Spearman's correlation of confidence with sentence chrF).

    Example: tk evaluate exported/transformer --challenge ../shared/data/tatoeba-test-eng-fra.txt
    """
    import json

    from toolkit.core import manifest as manifest_mod
    from toolkit.core.tokenizers import choose_languages
    from toolkit.deploy.evaluate import evaluate_model, evaluate_robustness

    choose_languages(manifest_mod.load(model_dir), **languages)  # an unknown code: one line, before any model loads
    if provider != "cpu" and (record or calibrate or robustness or names_path):
        # The manifest's records are CPU figures that other commands compare against; the other modes score on the CPU.
        raise click.UsageError(f"--provider {provider} scores the test sets only: drop --record, --calibrate, --robustness "
                               "and --names, or run them with --provider cpu")
    if calibrate:
        from toolkit.deploy.evaluate import calibrate_model

        calibrate_model(model_dir, data_path, challenge, beams[0] if beams else 1, limit=limit, threads=threads, variant=variant,
                        echo=lambda m: click.echo(m, err=True), languages=languages)

    if names_path:
        from toolkit.deploy.names import evaluate_names

        results = evaluate_names(model_dir, names_path, beams[0] if beams else 4, threads=threads, variant=variant,
                                 echo=lambda m: click.echo(m, err=True), languages=languages)
        click.echo(json.dumps(results, indent=2, ensure_ascii=False))
        if record:
            manifest_mod.record_metric(model_dir, "names", variant, results)
        return
    if robustness:
        from toolkit.deploy.robustness import table

        results = evaluate_robustness(model_dir, data_path, beams[0] if beams else 4, limit=limit, threads=threads,
                                      variant=variant, seed=seed, raw=raw, echo=lambda m: click.echo(m, err=True),
                                      languages=languages)
        click.echo(table(results))
        if record:
            manifest_mod.record_metric(model_dir, "robustness", variant, results)
        return
    scores = evaluate_model(model_dir, data_path, challenge, beams or (1, 4), limit=limit, threads=threads,
                            variant=variant, provider=provider, echo=lambda m: click.echo(m, err=True), languages=languages)
    click.echo(json.dumps(scores, indent=2))
    if record:
        manifest_mod.record_metric(model_dir, "evaluation", variant, scores)
