"""What the commands share: argument types with declared ranges, the corpus option, the model default,
and helpers for output paths, start-up and wording."""

from __future__ import annotations

import contextlib
import functools
import gc
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from toolkit.core.atomic import check_output_path
from toolkit.core.decode_options import MAX_BEAM, MAX_CLI_BATCH, MAX_STREAMS, MAX_THREADS, Declared, declared
from toolkit.core.engines import PROVIDERS
from toolkit.core.shipped import default_model
from toolkit.core.variants import NAMES
from toolkit.runtimes.registry import DEFAULT as DEFAULT_RUNTIME
from toolkit.runtimes.registry import names as runtime_names

DEFAULT_MODEL = default_model  # a callable default: click asks for it only when no model is given


class FiniteFloat(click.FloatRange):
    """A float within a range that is also finite: click's FloatRange lets NaN through (NaN < min is False)."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if rv != rv or rv in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


# Declared ranges of the numeric options, so that click names a bad value and its option before anything runs.
# Those of decoding are the declared options' (toolkit.core.decode_options.OPTIONS), which DecodeOptions checks every way
# in again.
POSITIVE = click.IntRange(min=1)
SEED = click.IntRange(0, 2**32 - 1)
BEAM = click.IntRange(1, MAX_BEAM)
BATCH = click.IntRange(1, MAX_CLI_BATCH)
THREADS = click.IntRange(1, MAX_THREADS)
STREAMS = click.IntRange(1, MAX_STREAMS)
# One search for the corpus in every command (toolkit.core.data.find); each command names the file it used.
DATA_OPTION = click.option("--data", "data_path", metavar="PATH",
                           help="fra-eng.zip or fra.txt [default: $TK_DATA, else ../shared/data/fra-eng.zip, else the cache "
                                "(tk train downloads into it)].")
TOLERANCE = FiniteFloat(min=0.0)


# For the commands that translate: without --variant, open_model picks the fastest graphs with fp32's translations.
DEFAULT_FAST_VARIANT = click.option("--variant", type=click.Choice(NAMES),
                                    help="Graphs to run [default: the fastest with fp32's translations: optimized "
                                         "(attention fused) on CPU, fp32 on CUDA].")


def option_group(*options, into: str | None = None):
    """Several click options as one decorator, applied in the order given (as Polygraphy's argument groups).
    into: the command gets their values as one dict argument of that name (keyed by parameter name) instead."""
    def decorate(f):
        if into:
            names = [option(lambda: None).__click_params__[0].name for option in options]
            inner = f

            @functools.wraps(inner)
            def f(*args, **kwargs):
                return inner(*args, **{into: {n: kwargs.pop(n) for n in names}}, **kwargs)

        for option in reversed(options):
            f = option(f)
        return f
    return decorate


def declared_option(o: Declared, surface: str = "cli"):
    """The click option of a declared option (a decoding option, toolkit.core.decode_options.OPTIONS, or a limit of tk
    serve, toolkit.serve.options.LIMITS): --name, its type and range, default and help as declared."""
    flag = "--" + o.name.replace("_", "-")
    show = o.default is not None
    if o.kind is bool:
        return click.option(f"{flag}/--no-{flag[2:]}", default=o.default, show_default=show, help=o.help)
    high = o.high_on(surface)
    kind = click.IntRange(o.low, high) if o.kind is int else FiniteFloat(o.low, high, min_open=o.low_open)
    return click.option(flag, type=kind, default=o.default, show_default=show, help=o.help)


# How a translation is searched for and where it stops: the declared options of the "cli" surface, the same for tk translate
# and tk translate-corpus, handed to the command as one dict `decoding` of DecodeOptions.for_model's arguments, which checks
# them and builds the options.
DECODING = option_group(*(declared_option(o) for o in declared("cli")), into="decoding")
# How typed text becomes model input and back.
TEXT = option_group(
    click.option("--keep", multiple=True, metavar="TERM", help="Copy TERM verbatim, like URLs, e-mail addresses and numbers (repeatable)."),
    click.option("--glossary", type=click.Path(path_type=Path), metavar="FILE.tsv",
                 help="Translate each source term of FILE (source term, TAB, target term per line) as its target term, exactly once."),
    click.option("--split/--no-split", default=True, show_default=True, help="Translate each sentence of a line separately."),
    click.option("--raw", is_flag=True, help="No input handling: no sentence splitting, capitals folding or placeholders."),
    click.option("--strict", is_flag=True, help="Refuse a line longer than the model's maximum instead of translating it in pieces "
                                                "(translate-corpus: fail its shard)."),
)

def read_glossary(path: Path | None, raw: bool, m=None):
    """The --glossary file (TEXT's), read and checked before the model loads or Ray starts (a bad line is one line naming
    it), or None; m: the model's manifest, where it is known by then (tk translate-corpus), checked as translation
    checks it (toolkit.deploy.translate.check_glossary)."""
    if path is None:
        return None
    from toolkit.core import glossary
    from toolkit.deploy.translate import check_glossary

    check_glossary(m, not raw)

    return glossary.load(path)


# A multilingual model's pair, for every command that translates (tk translate, translate-corpus, evaluate, verify, serve):
# the codes users know (en, fr; eng_Latn, fr_XX where the model uses them), checked by the one chooser
# (toolkit.core.tokenizers.choose_languages), handed to the command as one dict `languages` (source_lang, target_lang).
LANGUAGES = option_group(
    click.option("--source-lang", help="A multilingual model's source language code (en, eng_Latn) [default: the model's own, "
                                       "or what tk export --source-lang recorded]."),
    click.option("--target-lang", help="A multilingual model's target language code (fr, fra_Latn) [default: the model's own, "
                                       "or what tk export --target-lang recorded]."),
    into="languages",
)


def provider_option(default: str | None = None, also: tuple[str, ...] = (), help: str | None = None):
    """--provider, its choices the declared providers (toolkit.core.engines.PROVIDERS) and `also` (verify's "all")."""
    return click.option("--provider", type=click.Choice([*PROVIDERS, *also]), default=default, show_default=default is not None,
                        help=help)


class RuntimeChoice(click.Choice):
    """The registered runtimes (toolkit.runtimes.registry), read each time click asks: a runtime registered after the
    commands were built is a choice too."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        return runtime_names()

    @choices.setter
    def choices(self, value) -> None:
        pass  # click.Choice.__init__ stores its list; this one is the registry's


def shortlist_option(help: str = "Decode each sentence over its own candidates of the model's lexical shortlist (`tk export "
                     "DIR --shortlist FILE`): the same output alone or in any batch; `tk verify DIR --shortlist` says how "
                     "far it keeps the output."):
    """--shortlist, as tk translate and tk serve take it."""
    return click.option("--shortlist", is_flag=True, help=help)


def runtime_option(multiple: bool = False, help: str = "Which engine runs the graphs (openvino: its CPU plugin; needs the openvino extra)."):
    """--runtime, its choices the registered runtimes (toolkit.runtimes.registry); `multiple`: repeatable, into `runtimes`."""
    if multiple:
        return click.option("--runtime", "runtimes", multiple=True, type=RuntimeChoice(), help=help)
    return click.option("--runtime", type=RuntimeChoice(), default=DEFAULT_RUNTIME, show_default=True, help=help)


# Where the graphs run, for the commands that translate.
PROVIDER = provider_option(help="[default: cuda if it truly loads, else cpu]")


def writable_file(path: Path | None, option: str) -> None:
    """Checks an output file path before any work (core.atomic.check_output_path, the one check)."""
    if path is not None:
        check_output_path(path, option)


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No garbage collection inside the block, and what it allocated is then left out of later ones.

    Loading the modules and the model allocates much and frees little: the ~35 collections it
    triggered cost 10 ms of CPU in `tk translate`'s start and found next to nothing. Merely pausing
    would hand the whole heap to the first collection after the block; gc.freeze() moves it out of
    the collector's reach instead (those objects live as long as the process; refcounting still
    frees them).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def command_line() -> str:
    return "tk " + shlex.join(sys.argv[1:])


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class TakesModel(click.Command):
    """A command whose first argument is the model directory also takes it as `--model DIR`, the form `tk translate`
    and `tk bench` use, so one way of naming the model works in every command (the positional form keeps working).
    `--model DIR` is moved to the front of the arguments before click parses them; given several times (tk serve), each
    is a model in the order given."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest, models, i = [], [], 0
        while i < len(args):
            a = args[i]
            if a == "--":
                rest += args[i:]
                break
            if a == "--model":
                if i + 1 == len(args):
                    raise click.UsageError("--model needs a model directory: --model DIR", ctx)
                models.append(args[i + 1])
                i += 2
                continue
            if a.startswith("--model="):
                models.append(a.split("=", 1)[1])
            else:
                rest.append(a)
            i += 1
        return super().parse_args(ctx, models + rest)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_usage(ctx, formatter)
        formatter.write_text("The model directory may also be given as --model DIR, as in tk translate.")
