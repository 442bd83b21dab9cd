"""`tk serve`."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.commands.options import BATCH, DEFAULT_FAST_VARIANT, PROVIDER, THREADS, FiniteFloat, runtime_option
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


@click.command()
@click.argument("model_dir", type=click.Path(path_type=Path), required=False)
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
def serve(model_dir, host, port, provider, variant, runtime, threads, max_delay_ms, max_batch_tokens, max_batch_sentences, no_batching,
          queue_size, max_sentences, max_chars, timeout_s, body_timeout_s, header_timeout_s, allow_hosts):
    """Serve translations over HTTP: POST /v1/translate, a web page at /, /health, /ready, /metrics.

    Sentences of concurrent requests are decoded together by one worker. Needs the serve
    extra: pip install -e '.[serve]'.

    MODEL_DIR defaults to $TK_MODEL, else the model installed with tk.

    Example: tk serve exported/transformer --port 8000
    """
    try:
        from toolkit.serve.app import ServeConfig
        from toolkit.serve.batcher import BatchPolicy
        from toolkit.serve.server import serve as run
    except ImportError as e:
        raise UsageError(f"tk serve needs {e.name}; install the serve extra: pip install -e '.[serve]'") from None
    from toolkit.deploy.translate import open_model

    for name in allow_hosts:
        if not name.strip() or any(c.isspace() or c in "/?#@" for c in name.strip()):
            raise UsageError(f"--allow-host {name!r} is not a host name; give a name such as example.com, an address, or '*'")
    if model_dir is None:
        from toolkit.core.shipped import default_model

        model_dir = default_model()
    t = open_model(model_dir, provider, variant, threads=threads, runtime=runtime)
    policy = BatchPolicy(max_tokens=max_batch_tokens, max_sentences=max_batch_sentences, max_delay_s=max_delay_ms / 1000,
                         queue_size=queue_size, batching=not no_batching)
    desc = f"{Path(model_dir).name} ({t.manifest.model}, {t.variant}) on {t.where}" + (", batching off" if no_batching else "")
    config = ServeConfig(policy=policy, max_sentences=max_sentences, max_chars=max_chars, timeout_s=timeout_s, description=desc,
                         body_timeout_s=body_timeout_s, header_timeout_s=header_timeout_s, allowed_hosts=tuple(allow_hosts))
    run(lambda: t, host, port, config)
