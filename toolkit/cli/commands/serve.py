"""`tk serve`."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.commands.options import BATCH, DEFAULT_FAST_VARIANT, PROVIDER, THREADS, FiniteFloat, TakesModel, runtime_option
from toolkit.core.errors import UsageError

# Every numeric option has a declared range: past it a value is a typo or an attack, not a setting
# (--max-delay-ms 1e15 overflowed the worker's wait and killed it). The body limit follows from
# --max-sentences x --max-chars, so their caps bound it (about 41 MB).
DELAY_MS = FiniteFloat(0, 60_000)
BATCH_TOKENS = click.IntRange(1, 65_536)
QUEUE = click.IntRange(1, 100_000)
REQUEST_SENTENCES = click.IntRange(1, 1024)
CHARS = click.IntRange(1, 10_000)
TIMEOUT_S = FiniteFloat(0, 3600, min_open=True)
BODY_TIMEOUT_S = FiniteFloat(0, 600, min_open=True)
HEADER_TIMEOUT_S = FiniteFloat(0, 600, min_open=True)


@click.command(cls=TakesModel)
@click.argument("models", nargs=-1, metavar="[DIR[:SOURCE-TARGET]]...")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@PROVIDER
@DEFAULT_FAST_VARIANT
@runtime_option()
@click.option("--threads", type=THREADS, help="ONNX Runtime intra-op threads [default: all cores].")
@click.option("--max-delay-ms", type=DELAY_MS, default=10.0, show_default=True,
              help="How long the oldest queued sentence waits for others to share its decode.")
@click.option("--max-batch-tokens", type=BATCH_TOKENS, default=1024, show_default=True,
              help="Work per decode: padded source tokens x beam (longest sentence x sentences x beam).")
@click.option("--max-batch-sentences", type=BATCH, default=64, show_default=True, help="Sentences per decode.")
@click.option("--no-batching", is_flag=True, help="Decode one sentence at a time (the baseline for comparisons).")
@click.option("--queue-size", type=QUEUE, default=1024, show_default=True,
              help="Sentences waiting over all requests; beyond it requests get 503 with Retry-After (413 for a request larger than it).")
@click.option("--max-sentences", type=REQUEST_SENTENCES, default=64, show_default=True, help="Sentences per request (413 beyond).")
@click.option("--max-chars", type=CHARS, default=1000, show_default=True, help="Characters per sentence (413 beyond).")
@click.option("--timeout-s", type=TIMEOUT_S, default=30.0, show_default=True,
              help="Per-request limit, queueing included (504 beyond).")
@click.option("--body-timeout-s", type=BODY_TIMEOUT_S, default=10.0, show_default=True,
              help="The whole request body must arrive within this (408 beyond).")
@click.option("--header-timeout-s", type=HEADER_TIMEOUT_S, default=10.0, show_default=True,
              help="A request's line and headers must arrive within this of the connection's opening or its previous answer "
                   "(408 and the connection closed beyond; a connection that sends nothing is closed).")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="Also answer requests whose Host header names NAME (repeatable; '*' for any). By default only localhost, "
                   "127.0.0.1, [::1] and the --host address are answered (421 otherwise), against DNS rebinding.")
def serve(models, host, port, provider, variant, runtime, threads, max_delay_ms, max_batch_tokens, max_batch_sentences, no_batching,
          queue_size, max_sentences, max_chars, timeout_s, body_timeout_s, header_timeout_s, allow_hosts):
    """Serve translations over HTTP: POST /v1/translate, LibreTranslate's API (POST /translate, GET /languages),
    a web page at /, /health, /ready, /metrics.

    Sentences of concurrent requests are decoded together, one worker per model. Needs the serve
    extra: pip install -e '.[serve]'.

    Each DIR is a model directory, given its language pair after a colon (DIR:en-de); a model tk
    trained translates en-fr without one. Without DIR: $TK_MODEL, else the model installed with tk.

    Example: tk serve exported/transformer imported/opus-mt-en-de:en-de --port 8000
    """
    try:
        from toolkit.serve.app import ModelSpec, ServeConfig
        from toolkit.serve.batcher import BatchPolicy
        from toolkit.serve.server import serve as run
    except ImportError as e:
        raise UsageError(f"tk serve needs {e.name}; install the serve extra: pip install -e '.[serve]'") from None

    for name in allow_hosts:
        if not name.strip() or any(c.isspace() or c in "/?#@" for c in name.strip()):
            raise UsageError(f"--allow-host {name!r} is not a host name; give a name such as example.com, an address, or '*'")
    if not models:
        from toolkit.core.shipped import default_model

        models = (str(default_model()),)
    loaded = open_models(models, provider, variant, threads, runtime)
    policy = BatchPolicy(max_tokens=max_batch_tokens, max_sentences=max_batch_sentences, max_delay_s=max_delay_ms / 1000,
                         queue_size=queue_size, batching=not no_batching)
    specs = [ModelSpec((lambda t=t: t), pairs, f"{Path(d).name} ({t.manifest.model}, {t.variant}) on {t.where}, {'/'.join(map('-'.join, pairs))}"
                       + (", batching off" if no_batching else "")) for d, pairs, t in loaded]
    config = ServeConfig(policy=policy, max_sentences=max_sentences, max_chars=max_chars, timeout_s=timeout_s,
                         description="; ".join(s.description for s in specs),
                         body_timeout_s=body_timeout_s, header_timeout_s=header_timeout_s, allowed_hosts=tuple(allow_hosts))
    run(specs, host, port, config)


def open_models(arguments: tuple[str, ...], provider, variant, threads, runtime) -> list:
    """(directory, pairs, loaded model) for each DIR[:SOURCE-TARGET], the pairs checked before any model loads and the
    models opened at the same time (ONNX Runtime builds sessions outside the GIL), so one slow load holds no other
    back; the first that fails is the one-line error."""
    from concurrent.futures import ThreadPoolExecutor

    from toolkit.core import manifest as manifest_mod
    from toolkit.deploy.translate import open_model
    from toolkit.serve import languages

    wanted: dict[tuple[str, str], str] = {}
    planned = []
    for argument in arguments:
        directory, pair = languages.split_argument(argument)
        if pair is None:
            m = manifest_mod.load(directory)
            pair = languages.stated_pair(m.declared().tokenizer) or languages.default_pair(m.declared().origin, directory)
        if pair in wanted:
            raise UsageError(f"{argument} and {wanted[pair]} both translate {languages.shown(pair)}; serve one model per language pair")
        wanted[pair] = argument
        planned.append((directory, (pair,)))
    with ThreadPoolExecutor(len(planned)) as pool:
        futures = [pool.submit(open_model, d, provider, variant, threads=threads, runtime=runtime) for d, _ in planned]
        return [(d, pairs, f.result()) for (d, pairs), f in zip(planned, futures)]
