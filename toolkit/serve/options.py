"""tk serve's options, declared once: `tk serve`'s click options (toolkit.cli.commands.serve) and the arguments a RayService
gives toolkit.serve.ray_app:app_builder are made from these, and BatchPolicy's and ServeConfig's defaults are theirs.

Standard library only: the CLI imports it at start-up (`tk --help` stays instant), without the serve extra.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServeOption:
    """One option of tk serve: --name (dashed) on the command line, `name` in app_builder's dict."""

    name: str
    kind: type  # int, float, str, or tuple (a list: repeatable on the command line)
    default: object = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # the range excludes `low` (a timeout of 0 is none)
    help: str = ""
    into: str = ""  # the field its value goes into: "policy.FIELD" (BatchPolicy) or "config.FIELD" (ServeConfig)
    per: int = 1  # the field's unit is `per` of the option's (milliseconds to seconds: 1000)
    ray: bool = True  # a RayService's app_builder takes it

    def value(self, given: object) -> object:
        """The field's value for the option's value."""
        return given / self.per if self.per != 1 else given


# Every numeric option has a declared range: past it a value is a typo or an attack, not a setting (--max-delay-ms 1e15
# overflowed the worker's wait and killed it). The body limit follows from --max-sentences x --max-chars, so their caps
# bound it (about 41 MB).
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
# What a RayService gives besides the limits: the models and replicas, and tk serve's own options of the same names
# (the CLI declares those with the commands that share them: --threads, --provider, --variant, --runtime, the languages).
LOADING = ("models", "replicas", "threads", "provider", "variant", "runtime", "source_lang", "target_lang", "allow_hosts")
DECLARED = {o.name: o for o in LIMITS}


def default(field: str) -> object:
    """The declared default of the option whose value goes into `field` ("policy.max_tokens"): BatchPolicy's and
    ServeConfig's defaults, so that tk serve, a RayService and the Python API leave out the same values."""
    (option,) = [o for o in LIMITS if o.into == field]
    return option.value(option.default)


def ray_arguments() -> tuple[str, ...]:
    """The arguments app_builder takes: the loading ones and the limits a RayService may set."""
    return (*LOADING, *(o.name for o in LIMITS if o.ray))


def fields(given: dict, where: str) -> dict:
    """The BatchPolicy ("policy") or ServeConfig ("config") fields of the declared options in `given` (by option name;
    one left out keeps the field's default)."""
    return {o.into.split(".")[1]: o.value(given[o.name]) for o in LIMITS if o.into.startswith(where + ".") and o.name in given}
