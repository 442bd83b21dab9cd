"""tk serve's batching and request limits, declared once (toolkit.core.decode_options.Declared): `tk serve`'s click options,
the arguments a RayService gives toolkit.serve.ray_app:app_builder, and BatchPolicy's and ServeConfig's defaults are made
from these. Standard library only: the CLI imports it at start-up."""

from __future__ import annotations

from toolkit.core.decode_options import Declared

RAY_TOO, SERVE_ONLY = ("tk-serve", "ray"), ("tk-serve",)  # a limit a RayService may set too, and one of tk serve alone
# Past its range a value is a typo or an attack, not a setting (--max-delay-ms 1e15 overflowed the worker's wait and
# killed it). The body limit follows from --max-sentences x --max-chars, so their caps bound it (about 41 MB).
LIMITS = (
    Declared("max_delay_ms", float, 10.0, 0, 60_000, "How long the oldest queued sentence waits for others to share its decode.",
             RAY_TOO, into="policy.max_delay_s", per=1000),
    Declared("max_batch_tokens", int, 1024, 1, 65_536, "Work per decode: padded source tokens x beam (longest sentence x sentences x beam).",
             RAY_TOO, into="policy.max_tokens"),
    Declared("max_batch_sentences", int, 64, 1, 4096, "Sentences per decode.", RAY_TOO, into="policy.max_sentences"),
    Declared("queue_size", int, 1024, 1, 100_000, "Sentences waiting over all requests; beyond it requests get 503 with Retry-After (413 "
             "for a request larger than it).", RAY_TOO, into="policy.queue_size"),
    Declared("max_sentences", int, 64, 1, 1024, "Sentences per request (413 beyond).", RAY_TOO, into="config.max_sentences"),
    Declared("max_chars", int, 1000, 1, 10_000, "Characters per sentence (413 beyond).", RAY_TOO, into="config.max_chars"),
    Declared("timeout_s", float, 30.0, 0, 3600, "Per-request limit, queueing included (504 beyond).", RAY_TOO, low_open=True,
             into="config.timeout_s"),
    Declared("body_timeout_s", float, 10.0, 0, 600, "The whole request body must arrive within this (408 beyond).", SERVE_ONLY, low_open=True,
             into="config.body_timeout_s"),
    Declared("header_timeout_s", float, 10.0, 0, 600, "A request's line and headers must arrive within this of the connection's opening "
             "or its previous answer (408 and the connection closed beyond; a connection that sends nothing is closed).", SERVE_ONLY,
             low_open=True, into="config.header_timeout_s"),
)
# How --replicas MIN:MAX scales down (tk serve --ray and a RayService alone): a replica is stopped once the load has stayed
# under what one fewer serves for this long. 30 s rides out a lull between bursts; a cluster that pays for idle replicas
# (or a test) may want less. Ray Serve's own default, 10 minutes, keeps translation replicas that load in seconds idle.
SCALING = (
    Declared("downscale_delay_s", float, 30.0, 0, 3600, "With --ray and --replicas MIN:MAX: seconds the load stays under what one "
             "replica fewer serves before one is stopped.", RAY_TOO, into="scaling.downscale_delay_s"),
)
# What a RayService gives besides the limits: the models, the replicas, and tk serve's options of those names.
LOADING = ("models", "replicas", "threads", "provider", "variant", "runtime", "source_lang", "target_lang", "allow_hosts")
SETTINGS = (*LIMITS, *SCALING)  # every option declared here: tk serve's click options, app_builder's checks
RAY_ARGUMENTS = (*LOADING, *(o.name for o in SETTINGS if "ray" in o.takes))


def default(field: str) -> float:
    """The declared default of the field ("policy.max_tokens"): BatchPolicy's, ServeConfig's and Replicas' defaults are
    tk serve's."""
    (option,) = [o for o in SETTINGS if o.into == field]
    return option.value(option.default)


def fields(given: dict, where: str) -> dict:
    """The BatchPolicy ("policy"), ServeConfig ("config") or Replicas ("scaling") fields of the options in `given` (by
    option name)."""
    return {o.into.split(".")[1]: o.value(given[o.name]) for o in SETTINGS if o.into.startswith(where + ".") and o.name in given}
