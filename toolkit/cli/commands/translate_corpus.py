"""`tk translate-corpus`."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.commands.options import (
    DECODING,
    LANGUAGES,
    TEXT,
    THREADS,
    FiniteFloat,
    TakesModel,
    provider_option,
    read_glossary,
    runtime_option,
)
from toolkit.core.errors import UsageError
from toolkit.core.variants import NAMES


@click.command("translate-corpus", cls=TakesModel)
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.argument("inputs", nargs=-1, required=True)
@click.argument("output_dir", type=click.Path(path_type=Path))
@click.option("--address", help="Ray cluster to run on: auto (the one this node belongs to) or ray://HEAD:10001 "
              "[default: a local Ray instance on this machine].")
@click.option("--workers", type=click.IntRange(1, 4096), default=1, show_default=True, help="Actors, each with its own sessions.")
@click.option("--threads", type=THREADS, help="ONNX Runtime threads per actor [default: a node's cores / its actors].")
@click.option("--shard-lines", type=click.IntRange(1, 10_000_000), default=4096, show_default=True,
              help="Lines per shard (a multiple of 2048 batches lines exactly as tk translate -i does).")
@click.option("--column", help="The text column of Parquet inputs.")
@provider_option("cpu", help="cuda: each actor requests one GPU.")
@click.option("--variant", type=click.Choice(NAMES), default="fp32", show_default=True)
@runtime_option()
@DECODING
@TEXT
@LANGUAGES
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
@click.option("--progress-seconds", type=FiniteFloat(0.1, 3600.0), default=10.0, show_default=True,
              help="Longest wait between two progress lines while shards run.")
def translate_corpus(model_dir, inputs, output_dir, address, workers, threads, shard_lines, column, provider, variant, runtime, decoding,
                     keep, glossary, split, raw, strict, languages, quiet, progress_seconds):
    """Translate a corpus on Ray Data: shards, one ordered output file, resumable.

    INPUTS are text files (one sentence per line), directories or globs of them, or Parquet files
    (with --column). OUTPUT_DIR gets one file per shard, corpus.json (the shards' ranges, digests and
    status) and translations.txt (every line, in input order). Rerunning the same command skips the
    shards already done. Needs the ray extra: pip install 'tk-onnx-deploy[ray]'.

    Example: tk translate-corpus exported/transformer corpus/*.txt out --workers 2
    """
    try:
        import ray.data  # noqa: F401  (only to tell a missing extra apart from any later problem)
    except ImportError as e:
        raise UsageError(f"tk translate-corpus needs {e.name}; install the ray extra: pip install 'tk-onnx-deploy[ray]'") from None
    from toolkit.core import manifest as manifest_mod
    from toolkit.core.decode_options import DecodeOptions, max_len_problem
    from toolkit.corpus.run import CorpusJob
    from toolkit.corpus.run import translate_corpus as run

    say = (lambda m: None) if quiet else (lambda m: click.echo(m, err=True))
    from toolkit.core.tokenizers import choose_languages

    m = manifest_mod.load(model_dir)
    m.translation_tokenizer()
    # The pair checked here, before Ray starts (an unknown code is one line listing the model's codes), and handed to
    # the actors in the model's own codes, which each applies as tk translate does.
    m = choose_languages(m, **languages)
    declared = m.declared().tokenizer
    chosen = {"source_lang": declared.source_lang, "target_lang": declared.target_lang} if declared.languages else {}
    # Before Ray starts: a modified or corrupt model file is one line here, not a traceback from every actor.
    m.check_files(cached=True)
    problem = max_len_problem(decoding["max_len"], m.max_len)
    if problem:
        raise UsageError(problem)
    # One stream per actor: the actors are the parallelism, each on its node's share of the cores.
    decode = DecodeOptions.for_manifest(m, provider, streams=1, **decoding)
    terms = read_glossary(glossary, raw, m)
    text = {"keep": tuple(keep), "split": split, "enabled": not raw, "glossary": terms}
    # What changes a translation: a rerun into the same OUTPUT_DIR must agree on all of it.
    import dataclasses
    import hashlib
    import json

    model_sha256 = hashlib.sha256(json.dumps(m.files(), sort_keys=True).encode()).hexdigest()  # every file's digest
    settings = {"model": str(Path(model_dir).resolve()), "model_files_sha256": model_sha256, "variant": variant,
                "runtime": runtime, **{k: v for k, v in dataclasses.asdict(decode).items() if k != "streams"}, "keep": list(keep),
                "split": split, "raw": raw, "strict": strict, **({"languages": chosen} if chosen else {}),
                **({"glossary_sha256": terms.digest} if terms else {})}
    job = CorpusJob(str(model_dir), list(inputs), output_dir, settings, decode, text, strict, provider, variant, runtime, workers,
                    threads, shard_lines, column, address, progress_seconds, chosen or None)
    result = run(job, say)
    rate = f", {result.lines_per_s:,.1f} lines/s" if result.resumed < result.shards else ""
    say(f"wrote {result.merged}: {result.lines:,} lines from {result.shards} shards ({result.resumed} done earlier) "
        f"in {result.seconds:.1f}s{rate}")
