"""`tk serve`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from toolkit.cli.commands.options import (
    BATCH,
    DEFAULT_FAST_VARIANT,
    LANGUAGES,
    PROVIDER,
    THREADS,
    FiniteFloat,
    TakesModel,
    runtime_option,
)
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
@LANGUAGES
@click.option("--api-keys", "api_keys", type=click.Path(dir_okay=False), metavar="FILE",
              help="Answer translation and detection requests only with a key of FILE (one per line, optionally followed by its "
                   "requests per minute and characters per request), sent as api_key or Authorization: Bearer: 403 without one, "
                   "429 with Retry-After over its rate.")
def serve(models, host, port, provider, variant, runtime, threads, max_delay_ms, max_batch_tokens, max_batch_sentences, no_batching,
          queue_size, max_sentences, max_chars, timeout_s, body_timeout_s, header_timeout_s, allow_hosts, languages,
          api_keys=None):
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
    specs, default = served_models(models, provider, variant, threads, runtime, languages, no_batching)
    policy = BatchPolicy(max_tokens=max_batch_tokens, max_sentences=max_batch_sentences, max_delay_s=max_delay_ms / 1000,
                         queue_size=queue_size, batching=not no_batching)
    config = ServeConfig(policy=policy, max_sentences=max_sentences, max_chars=max_chars, timeout_s=timeout_s,
                         description="; ".join(s.description for s in specs), body_timeout_s=body_timeout_s,
                         header_timeout_s=header_timeout_s, allowed_hosts=tuple(allow_hosts), default_pair=default,
                         api_keys=read_keys(api_keys) if api_keys else None)
    run(specs, host, port, config)


def served_models(arguments: tuple[str, ...], provider: str | None, variant: str | None, threads: int | None, runtime: str,
                  languages: dict, no_batching: bool = False) -> tuple[list, tuple[str, str] | None]:
    """The ModelSpecs tk serve runs for its model arguments, and the pair a request naming none gets (None: the first
    model's); every pair and code checked before any model loads."""
    from toolkit.serve.app import ModelSpec

    planned = plan_models(arguments)
    default = default_pair(planned, **languages)  # an unknown code is one line, before any model loads
    loaded = open_models(planned, provider, variant, threads, runtime)
    specs = [ModelSpec((lambda t=t: t), plan.pairs, f"{Path(plan.directory).name} ({t.manifest.model}, {t.variant}) on {t.where}, "
                       + plan.shown() + (", batching off" if no_batching else ""), plan.codes, plan.fills) for plan, t in loaded]
    return specs, default


@dataclass(frozen=True)
class Planned:
    """One DIR[:SOURCE-TARGET] of tk serve: the pairs it serves (clients' codes), and for a multilingual model the
    model's codes of each (fills: every pair of its languages, after the pairs other models state)."""

    argument: str
    directory: str
    pairs: tuple[tuple[str, str], ...]
    declared: object  # its TokenizerDeclaration
    codes: dict | None = None
    fills: bool = False

    def shown(self) -> str:
        if self.fills:
            return f"any two of {len({c for pair in self.pairs for c in pair})} languages"
        return "/".join(map("-".join, self.pairs))


def plan_models(arguments: tuple[str, ...]) -> list[Planned]:
    """What each model argument serves, read from its manifest before any model loads; two models stating one pair
    are a one-line error (a multilingual model's every-pair yields to a stated pair instead)."""
    from toolkit.core import manifest as manifest_mod
    from toolkit.serve import languages

    wanted: dict[tuple[str, str], str] = {}
    planned = []
    for argument in arguments:
        directory, pair = languages.split_argument(argument)
        problem = languages.malformed_pair(argument) if pair is None else None
        if problem:
            raise UsageError(problem)
        m = manifest_mod.load(directory)
        declared = m.declared().tokenizer
        codes, fills = None, False
        if declared.languages is not None:  # multilingual: its own codes for each pair asked for
            every = languages.every_pair(declared)
            if pair is None:
                codes, fills = every, True
            elif pair in every:
                codes = {pair: every[pair]}
            else:
                raise UsageError(f"{argument}: this model does not translate {languages.shown(pair)}; its codes: "
                                 f"{', '.join(sorted({c for p in every for c in p}))}")
            pairs = tuple(codes)
        else:
            pairs = (pair or languages.stated_pair(declared) or languages.default_pair(m.declared().origin, directory),)
        for p in pairs if not fills else ():
            if p in wanted:
                raise UsageError(f"{argument} and {wanted[p]} both translate {languages.shown(p)}; serve one model per language pair")
            wanted[p] = argument
        planned.append(Planned(argument, directory, pairs, declared, codes, fills))
    return planned


def default_pair(planned: list[Planned], source_lang: str | None, target_lang: str | None) -> tuple[str, str] | None:
    """--source-lang/--target-lang as the served pair a request naming none gets (None: the first model's first pair).
    A code is the clients' (en) or a model's own (eng_Latn, __en__); one no model knows is one line listing the codes."""
    from toolkit.serve import languages

    if source_lang is None and target_lang is None:
        return None
    first = planned[0].pairs[0]
    pair = tuple(_served_code(planned, code, side) if code is not None else fallback
                 for code, side, fallback in ((source_lang, "source", first[0]), (target_lang, "target", first[1])))
    served = {p for plan in planned for p in plan.pairs}
    if pair not in served:
        raise UsageError(f"--source-lang/--target-lang: {languages.shown(pair)} is not a served pair; "
                         f"served: {', '.join(sorted({c for p in served for c in p}))} as source and target")
    return pair


def _served_code(planned: list[Planned], code: str, side: str) -> str:
    """The clients' code of what was typed: a multilingual model's code through its own chooser (language_id), a
    one-pair model's as stated."""
    from toolkit.core.tokenizers import language_id
    from toolkit.serve import languages

    problem = None
    for plan in planned:
        if plan.codes is None:
            if code in {p[0 if side == "source" else 1] for p in plan.pairs}:
                return code
            continue
        try:
            own = language_id(plan.declared, code, side)
        except UsageError as e:
            problem = problem or e
            continue
        back = {model: client for client, model in languages.served_codes(plan.declared).items()}
        return back[own]
    if problem is not None and len(planned) == 1:
        raise problem  # the one model's codes, in its own words
    known = sorted({p[0 if side == "source" else 1] for plan in planned for p in plan.pairs})
    raise UsageError(f"unknown {side} language {code!r}; the served codes: {', '.join(known)}")


def open_models(planned: list[Planned], provider, variant, threads, runtime) -> list:
    """(plan, loaded model) for each planned model, opened at the same time (ONNX Runtime builds sessions outside the
    GIL), so one slow load holds no other back; the first that fails is the one-line error."""
    from concurrent.futures import ThreadPoolExecutor

    from toolkit.deploy.translate import open_model

    with ThreadPoolExecutor(len(planned)) as pool:
        futures = [pool.submit(open_model, p.directory, provider, variant, threads=threads, runtime=runtime) for p in planned]
        return [(p, f.result()) for p, f in zip(planned, futures)]
