"""`tk serve`."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.commands.options import (
    DEFAULT_FAST_VARIANT,
    LANGUAGES,
    PROVIDER,
    THREADS,
    TakesModel,
    declared_option,
    option_group,
    runtime_option,
    shortlist_option,
)
from toolkit.core.errors import UsageError
from toolkit.serve.options import SCALING, SETTINGS, fields

# The batching and request limits and --ray's scaling, handed to the command as one dict `limits` (by option name).
LIMIT_OPTIONS = option_group(*(declared_option(o, "tk-serve") for o in SETTINGS), into="limits")


@click.command(cls=TakesModel)
@click.argument("models", nargs=-1, metavar="[DIR[:SOURCE-TARGET]]...")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@PROVIDER
@DEFAULT_FAST_VARIANT
@runtime_option()
@click.option("--threads", type=THREADS, help="ONNX Runtime intra-op threads [default: all cores].")
@click.option("--no-batching", is_flag=True, help="Decode one sentence at a time (the baseline for comparisons).")
@LIMIT_OPTIONS
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="Also answer requests whose Host header names NAME (repeatable; '*' for any). By default only localhost, "
                   "127.0.0.1, [::1] and the --host address are answered (421 otherwise), against DNS rebinding.")
@LANGUAGES
@click.option("--api-keys", "api_keys", type=click.Path(dir_okay=False), metavar="FILE",
              help="Answer translation and detection requests only with a key of FILE (one per line, optionally followed by its "
                   "requests per minute and characters per request), sent as api_key or Authorization: Bearer: 403 without one, "
                   "429 with Retry-After over its rate.")
@click.option("--ray", "on_ray", is_flag=True,
              help="Serve on Ray Serve, beyond one machine: each model a deployment of --replicas replicas, each batching across "
                   "requests with --threads CPUs [default: 1], on a local Ray or the cluster at --ray-address; HTTP on its head node "
                   "at --host:--port; SIGHUP redeploys the models (a rolling update). Needs the serve and ray extras.")
@click.option("--ray-address", metavar="ADDR", help="With --ray: join the Ray cluster at ADDR (HEAD:PORT, auto, or ray://HEAD:10001) "
                                                    "instead of starting a local Ray; every DIR must be at the same path on its nodes.")
@click.option("--replicas", metavar="N|MIN:MAX",
              help="With --ray: replicas per model, N, or autoscaled between MIN and MAX on the requests waiting on them [default: 1].")
@shortlist_option()
def serve(models, host, port, provider, variant, runtime, threads, no_batching, limits, allow_hosts, languages, api_keys=None,
          on_ray=False, ray_address=None, replicas=None, shortlist=False):
    """Serve translations over HTTP: POST /v1/translate, LibreTranslate's API (POST /translate, GET /languages),
    a web page at /, /health, /ready, /metrics.

    Sentences of concurrent requests are decoded together, one worker per model. Needs the serve
    extra: pip install 'tk-onnx-deploy[serve]'.

    Each DIR is a model directory, given its language pair after a colon (DIR:en-de); a model tk
    trained translates en-fr without one, and a multilingual one (M2M100, NLLB) every pair of its
    languages, a request's source and target routed to its codes. --source-lang/--target-lang pick
    the pair of a request that names none [default: the first model's]. Without DIR: $TK_MODEL,
    else the model installed with tk.

    Example: tk serve exported/transformer imported/opus-mt-en-de:en-de --port 8000
    """
    try:
        from toolkit.serve.app import ServeConfig
        from toolkit.serve.batcher import BatchPolicy
        from toolkit.serve.keys import read_keys
        from toolkit.serve.server import serve as run
    except ImportError as e:
        raise UsageError(f"tk serve needs {e.name}; install the serve extra: pip install 'tk-onnx-deploy[serve]'") from None

    for name in allow_hosts:
        if not name.strip() or any(c.isspace() or c in "/?#@" for c in name.strip()):
            raise UsageError(f"--allow-host {name!r} is not a host name; give a name such as example.com, an address, or '*'")
    if not models:
        from toolkit.core.shipped import default_model

        models = (str(default_model()),)
    if shortlist and on_ray:
        raise UsageError("--shortlist serves on this machine; drop --ray or --shortlist")
    on_ray = ray_plan(on_ray, ray_address, replicas, models, provider, variant, threads, runtime, languages, no_batching,
                      fields(limits, "scaling"))
    specs, default = on_ray.specs() if on_ray else served_models(models, provider, variant, threads, runtime, languages, no_batching,
                                                                 shortlist)
    policy = BatchPolicy(**fields(limits, "policy"), batching=not no_batching)
    config = ServeConfig(policy=policy, **fields(limits, "config"), description="; ".join(s.description for s in specs),
                         allowed_hosts=tuple(allow_hosts), default_pair=default, api_keys=read_keys(api_keys) if api_keys else None)
    if on_ray:
        on_ray.serve(specs, host, port, config)
    else:
        run(specs, host, port, config)


def ray_plan(on_ray: bool, address: str | None, replicas: str | None, models: tuple[str, ...], provider, variant, threads, runtime,
             languages: dict, no_batching: bool, scaling: dict):
    """tk serve --ray's plan (toolkit.serve.ray_server.RayPlan), its options checked before anything starts; None without --ray.
    scaling: the Replicas fields of the scaling options (toolkit.serve.options.SCALING)."""
    if not on_ray:
        changed = [f"--{o.name.replace('_', '-')}" for o in SCALING if scaling[o.into.split(".")[1]] != o.value(o.default)]
        given = ["--ray-address"] * (address is not None) + ["--replicas"] * (replicas is not None) + changed
        if given:
            raise UsageError(f"{given[0]} is an option of tk serve --ray; add --ray")
        return None
    try:
        from toolkit.serve.ray_server import RayPlan
    except ImportError as e:
        raise UsageError(f"tk serve --ray needs {e.name} (Ray Serve); install the ray extra: pip install 'tk-onnx-deploy[serve,ray]'") from None
    return RayPlan.from_options(models, provider, variant, threads, runtime, languages, no_batching, address, replicas, scaling)


def served_models(arguments: tuple[str, ...], provider: str | None, variant: str | None, threads: int | None, runtime: str,
                  languages: dict, no_batching: bool = False, shortlist: bool = False) -> tuple[list, tuple[str, str] | None]:
    """The ModelSpecs tk serve runs for its model arguments, and the pair a request naming none gets (None: the first
    model's); every pair and code checked before any model loads."""
    from toolkit.serve.app import ModelSpec
    from toolkit.serve.plan import default_pair, plan_models

    planned = plan_models(arguments)
    default = default_pair(planned, **languages)  # an unknown code is one line, before any model loads
    loaded = open_models(planned, provider, variant, threads, runtime, shortlist)
    for _, t in loaded:
        if t.note:
            click.echo(f"warning: {t.note}", err=True)
    specs = [ModelSpec((lambda t=t: t), plan.pairs, f"{Path(plan.directory).name} ({t.manifest.model}, {t.variant}"
                       f"{', shortlist' if shortlist else ''}) on {t.where}, "
                       + plan.shown() + (", batching off" if no_batching else ""), plan.codes, plan.fills) for plan, t in loaded]
    return specs, default


def open_models(planned: list, provider, variant, threads, runtime, shortlist: bool = False) -> list:
    """(plan, loaded model) for each planned model, opened at the same time (ONNX Runtime builds sessions outside the
    GIL), so one slow load holds no other back; the first that fails is the one-line error."""
    from concurrent.futures import ThreadPoolExecutor

    from toolkit.deploy.translate import open_model

    with ThreadPoolExecutor(len(planned)) as pool:
        futures = [pool.submit(open_model, p.directory, provider, variant, threads=threads, runtime=runtime, shortlist=shortlist)
                   for p in planned]
        return [(p, f.result()) for p, f in zip(planned, futures)]
