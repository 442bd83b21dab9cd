"""tk serve's batching and request limits, declared once: `tk serve`'s click options, the arguments a RayService gives
toolkit.serve.ray_app:app_builder, and BatchPolicy's and ServeConfig's defaults are made from these. Standard library
only: the CLI imports it at start-up."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServeOption:
    """A limit of tk serve: --name (dashed) on the command line, `name` in app_builder's dict."""

    name: str
    kind: type  # int or float
    default: float
    low: float
    high: float
    low_open: bool = False  # the range excludes `low` (a timeout of 0 is none)
    help: str = ""
    into: str = ""  # the field its value goes into: "policy.FIELD" (BatchPolicy) or "config.FIELD" (ServeConfig)
    per: int = 1  # the field's unit is `per` of the option's (milliseconds to seconds: 1000)
    ray: bool = True  # a RayService's app_builder takes it

    def value(self, given: float) -> float:
        return given / self.per if self.per != 1 else given


# Past its range a value is a typo or an attack, not a setting (--max-delay-ms 1e15 overflowed the worker's wait and
# killed it). The body limit follows from --max-sentences x --max-chars, so their caps bound it (about 41 MB).
LIMITS = (
    ServeOption("max_delay_ms", float, 10.0, 0, 60_000, help="How long the oldest queued sentence waits for others to share its decode.",
                into="policy.max_delay_s", per=1000),
    ServeOption("max_batch_tokens", int, 1024, 1, 65_536, into="policy.max_tokens",
                help="Work per decode: padded source tokens x beam (longest sentence x sentences x beam)."),
    ServeOption("max_batch_sentences", int, 64, 1, 4096, help="Sentences per decode.", into="policy.max_sentences"),
    ServeOption("queue_size", int, 1024, 1, 100_000, into="policy.queue_size",
                help="Sentences waiting over all requests; beyond it requests get 503 with Retry-After (413 for a request larger than it)."),
    ServeOption("max_sentences", int, 64, 1, 1024, help="Sentences per request (413 beyond).", into="config.max_sentences"),
    ServeOption("max_chars", int, 1000, 1, 10_000, help="Characters per sentence (413 beyond).", into="config.max_chars"),
    ServeOption("timeout_s", float, 30.0, 0, 3600, True, "Per-request limit, queueing included (504 beyond).", "config.timeout_s"),
    ServeOption("body_timeout_s", float, 10.0, 0, 600, True, "The whole request body must arrive within this (408 beyond).",
                "config.body_timeout_s", ray=False),
    ServeOption("header_timeout_s", float, 10.0, 0, 600, True,
                "A request's line and headers must arrive within this of the connection's opening or its previous answer "
                "(408 and the connection closed beyond; a connection that sends nothing is closed).", "config.header_timeout_s", ray=False),
)
# What a RayService gives besides the limits: the models, the replicas, and tk serve's options of those names.
LOADING = ("models", "replicas", "threads", "provider", "variant", "runtime", "source_lang", "target_lang", "allow_hosts")
RAY_ARGUMENTS = (*LOADING, *(o.name for o in LIMITS if o.ray))


def default(field: str) -> float:
    """The declared default of the field ("policy.max_tokens"): BatchPolicy's and ServeConfig's defaults are tk serve's."""
    (option,) = [o for o in LIMITS if o.into == field]
    return option.value(option.default)


def fields(given: dict, where: str) -> dict:
    """The BatchPolicy ("policy") or ServeConfig ("config") fields of the limits in `given` (by option name)."""
    return {o.into.split(".")[1]: o.value(given[o.name]) for o in LIMITS if o.into.startswith(where + ".") and o.name in given}
