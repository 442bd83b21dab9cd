"""`tk serve`."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.options import DEFAULT_FAST_VARIANT, PROVIDER, THREADS
from toolkit.core.errors import UsageError


@click.command()
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@PROVIDER
@DEFAULT_FAST_VARIANT
@click.option("--threads", type=THREADS, help="ONNX Runtime intra-op threads [default: all cores].")
@click.option("--max-delay-ms", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="How long the oldest queued sentence waits for others to share its decode.")
@click.option("--max-batch-tokens", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Padded source tokens per decode (longest sentence x sentences).")
@click.option("--max-batch-sentences", type=click.IntRange(min=1), default=64, show_default=True, help="Sentences per decode.")
@click.option("--no-batching", is_flag=True, help="Decode one sentence at a time (the baseline for comparisons).")
@click.option("--queue-size", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Sentences waiting over all requests; beyond it requests get 503 with Retry-After.")
@click.option("--max-sentences", type=click.IntRange(min=1), default=64, show_default=True, help="Sentences per request (413 beyond).")
@click.option("--max-chars", type=click.IntRange(min=1), default=1000, show_default=True, help="Characters per sentence (413 beyond).")
@click.option("--timeout-s", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              help="Per-request limit, queueing included (504 beyond).")
def serve(model_dir, host, port, provider, variant, threads, max_delay_ms, max_batch_tokens, max_batch_sentences, no_batching,
          queue_size, max_sentences, max_chars, timeout_s):
    """Serve translations over HTTP: POST /v1/translate, a web page at /, /health, /ready, /metrics.

    Sentences of concurrent requests are decoded together by one worker. Needs the serve
    extra: pip install -e '.[serve]'.

    Example: tk serve exported/transformer --port 8000
    """
    try:
        from toolkit.serve.app import ServeConfig
        from toolkit.serve.batcher import BatchPolicy
        from toolkit.serve.server import serve as run
    except ImportError as e:
        raise UsageError(f"tk serve needs {e.name}; install the serve extra: pip install -e '.[serve]'") from None
    from toolkit.deploy.translate import open_model

    t = open_model(model_dir, provider, variant, threads=threads)
    policy = BatchPolicy(max_tokens=max_batch_tokens, max_sentences=max_batch_sentences, max_delay_s=max_delay_ms / 1000,
                         queue_size=queue_size, batching=not no_batching)
    desc = f"{Path(model_dir).name} ({t.manifest.model}, {t.variant}) on {t.provider}" + (", batching off" if no_batching else "")
    config = ServeConfig(policy=policy, max_sentences=max_sentences, max_chars=max_chars, timeout_s=timeout_s, description=desc)
    run(lambda: t, host, port, config)
