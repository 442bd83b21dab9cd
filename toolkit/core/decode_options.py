"""Decoding options, checked once: an instance that exists holds values the decoding loop can run with.

Every way in builds one here: `tk translate`, `tk translate-corpus`, `tk evaluate`, `tk bench`, `tk serve` and the
Python API, so a bad value is the same one-line UsageError (its name, the value, what is accepted) wherever it comes
from, and the CLI's declared ranges are read from the bounds below. Standard library only: the CLI imports it at
start-up (`tk --help` stays instant), before numpy.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass

from toolkit.core.errors import UsageError

BEAM_ROWS = 128  # decoder rows (sentences x beam) of a default beam-search batch on CPU
# Twice those for a decoder whose self-attention cache holds at most SMALL_CACHE floats per row and position (tk's 7M
# Transformer: 1,024; the opus-mt shape 6,144): there a step's fixed cost, the search's Python and the runs' overhead,
# is a large share of it, and more rows a step spread it. First 2,000 Tatoeba Challenge sentences, shipped model, beam
# 4, 1 thread x 2 streams, 2-core AVX2 EPYC, median of 4 (`python docs/measurements/per_core.py --lines 2000
# --tk-batch-sizes 32,64 --streams 2 --repeat 4`): fp32 5.66 -> 5.23 s, int8 2.86 -> 2.70 s.
SMALL_CACHE, SMALL_CACHE_ROWS = 2048, 256

# Bounds of the options. Beam is capped where a larger one only burns memory and time (beam 5000 took a minute
# and 3 GB for one sentence); streams beyond the cores only wait. Threads are not a decoding option, but the API
# and the CLI check a session's intra-op threads against the same bound.
MAX_BEAM = 64
MAX_STREAMS = 64
MAX_THREADS = 256
ALPHA = (0.0, 10.0)
MAX_LEN_A = (0.0, 100.0)
MAX_LEN_B = (0, 1000)
SERVE_MAX_BEAM = 16  # tk serve's cap on beam and n_best: a server shares its cores among requests
MAX_CLI_BATCH = 4096  # a batch beyond 4096 sentences gains nothing on one machine; DecodeOptions leaves it open for tk serve's policy


@dataclass(frozen=True)
class Declared:
    """An option as users give it, declared once: a decoding option's CLI option, tk serve request field and API keyword
    are made from it, and DecodeOptions.for_model fills in its default where a user leaves it out; so are tk serve's limits
    (toolkit.serve.options), the options of `tk serve` and a RayService's app_builder."""

    name: str  # the API's keyword and the request's field; the CLI's --name, dashed
    kind: type  # int, float or bool
    default: object  # what a user who leaves it out gets; None: the model's own, or chosen for the beam, provider and cores
    low: float | None = None
    high: float | None = None  # None: no upper bound
    help: str = ""
    takes: tuple[str, ...] = ("cli", "serve", "api")  # "cli": tk translate and translate-corpus; "translate": tk translate
    none: str = ""  # what None means, where a user may give None (the API and the request body)
    caps: tuple[tuple[str, int], ...] = ()  # a surface's tighter upper bound, (surface, high)
    field_help: str = ""  # the request field's description, where the CLI's help does not fit it
    low_open: bool = False  # the range excludes `low` (a timeout of 0 is none)
    into: str = ""  # a tk serve limit's field: "policy.FIELD" (BatchPolicy) or "config.FIELD" (ServeConfig)
    per: int = 1  # the field's unit is `per` of the option's (milliseconds to seconds: 1000)

    def high_on(self, surface: str) -> float | None:
        return dict(self.caps).get(surface, self.high)

    def value(self, given: float) -> float:
        """The field's value of the option's value."""
        return given / self.per if self.per != 1 else given


# The decoding options and their one default regime: guards on (what tk translate, tk serve, the API and DecodeOptions
# use unless told otherwise; DecodeOptions.bare is the model's own decode, for measurements of the model itself).
OPTIONS = (
    Declared("beam", int, 1, 1, MAX_BEAM, "Beam size; 1 is greedy search.", caps=(("serve", SERVE_MAX_BEAM),)),
    Declared("n_best", int, 1, 1, MAX_BEAM, "Print N hypotheses per line as 'index ||| text ||| score'.", ("translate", "serve", "api"),
             caps=(("serve", SERVE_MAX_BEAM),), field_help="Hypotheses returned per sentence, at most beam"),
    Declared("alpha", float, None, *ALPHA, "Length penalty exponent for beam search [default: the model's own: 0.6 for tk's models, "
             "the generation config's length_penalty for an imported one].", none="for the model's own"),
    Declared("max_len", int, None, 1, None, "Longest translation in subword tokens [default: the model's maximum]."),
    Declared("batch_size", int, None, 1, None,
             "Sentences per batch [default: 64; on CPU with --beam, about 128 / beam, 256 / beam for a small decoder].", ("cli", "api"),
             caps=(("cli", MAX_CLI_BATCH),)),
    Declared("max_tokens", int, None, 1, None, "Or a budget of padded source tokens per batch.", ("cli", "api")),
    Declared("max_len_a", float, 2.0, *MAX_LEN_A, "Guard: an output is at most A * source tokens + B long (with --max-len-b).",
             none="for no length guard", field_help="Length guard: a sentence's translation is at most max_len_a x its source tokens + "
             "max_len_b long; null: no length guard (tk translate's --max-len-a)"),
    Declared("max_len_b", int, 10, *MAX_LEN_B, "See --max-len-a.", field_help="See max_len_a"),
    Declared("loop_guard", bool, True, help="Stop a hypothesis whose last token repeats 4 times, or last 2-4 tokens 3 times."),
    Declared("streams", int, None, 1, MAX_STREAMS, "Batches decoded at the same time (CTranslate2's inter_threads); cut to the cores "
             "/ --threads [default: one per core, up to 4].", ("translate", "api")),
)
DECLARED = {o.name: o for o in OPTIONS}
GUARDED = {name: DECLARED[name].default for name in ("max_len_a", "max_len_b", "loop_guard")}


def declared(surface: str) -> tuple[Declared, ...]:
    """The options users give on `surface` ("cli", "translate", "serve" or "api"), in declaration order."""
    return tuple(o for o in OPTIONS if surface in o.takes)


# The checks run at every call of the API (a single request); the exact-type test first skips the ABC's slower one.
def whole(value: object) -> bool:
    """An integer, numpy's included, and not a bool (True would pass as 1)."""
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def finite(value: object) -> bool:
    return (type(value) is float or (isinstance(value, numbers.Real) and not isinstance(value, bool))) and math.isfinite(value)


def shown(value: object) -> str:
    """A value as a one-line error names it: its repr, cut short, so an absurd value stays one short line
    (and an int of over 4300 digits, which Python refuses to print, by its size)."""
    try:
        text = repr(value)
    except ValueError:
        return f"an integer of {value.bit_length()} bits"
    return text if len(text) <= 40 else text[:37] + "..."


def count_problem(name: str, value: object, low: int, high: int | None = None, fix: str = "", high_is: str = "") -> str | None:
    """What is wrong with a count given as `name` (a whole number from low to high; high None: no upper bound), or None.
    high_is names what the upper bound is, where it is another option's value."""
    if whole(value) and low <= value and (high is None or value <= high):
        return None
    accepted = f"from {low} to {high_is + ' ' if high_is else ''}{high}" if high is not None else f"of at least {low}"
    return f"{name} must be a whole number {accepted} (got {shown(value)}){'; ' + fix if fix else ''}"


def _number_problem(name: str, value: object, bounds: tuple[float, float], none: str = "") -> str | None:
    if (value is None and none) or (finite(value) and bounds[0] <= value <= bounds[1]):
        return None
    return f"{name} must be a finite number from {bounds[0]:g} to {bounds[1]:g}{', or None ' + none if none else ''} (got {shown(value)})"


@dataclass
class DecodeOptions:
    beam: int = 1
    alpha: float | None = None  # length penalty exponent for beam search; None: the model's (tk's 0.6)
    n_best: int = 1
    max_len: int = 64  # longest output, in subword tokens
    batch_size: int = 64  # sentences per batch
    max_tokens: int | None = None  # or a budget of padded source tokens per batch
    max_src_len: int | None = None  # sources longer than the model's positions are cut to this (in decode_ids, only there)
    # Guards: each output is at most max_len_a * source tokens + max_len_b long (None: only
    # max_len), and a hypothesis that starts repeating itself is stopped. On by default, as declared above;
    # `bare` turns them off for what measures the model itself (verify, bench, training-time evaluation).
    max_len_a: float | None = DECLARED["max_len_a"].default
    max_len_b: int = DECLARED["max_len_b"].default
    loop_guard: bool = DECLARED["loop_guard"].default
    # Batches decoded at the same time, each in its own thread with its own backend over the same
    # sessions (CTranslate2's inter_threads). Small batches leave cores idle between a step's
    # matrix multiplies; a second stream fills them. Results do not depend on it.
    streams: int = 1
    # The model's decoding rules (toolkit.core.declaration.DecodingRules: start and end tokens, length penalty);
    # None: tk's. translate_batch sets them from the model directory, so every way in decodes a model by its own.
    rules: object | None = None

    @classmethod
    def bare(cls, **given: object) -> DecodeOptions:
        """The model's own decode, no length or loop guard (unless given): what verify, the benchmarks and training-time
        evaluation run, so that a guard never hides what the model itself does."""
        return cls(**{"max_len_a": None, "loop_guard": False, **given})

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise UsageError(problem)

    def problem(self) -> str | None:
        """The first value the decoding loop cannot run with, said in one line, or None.

        Without it a beam of 2.5 or an n_best of 0 ended in a raw TypeError or IndexError, and a negative max_len
        or max_len_b or a NaN max_len_a quietly gave every sentence an empty translation.
        """
        return (count_problem("beam", self.beam, 1, MAX_BEAM)
                or count_problem("n_best", self.n_best, 1, self.beam, high_is="the beam size")
                or _number_problem("alpha", self.alpha, ALPHA, DECLARED["alpha"].none)
                or count_problem("max_len", self.max_len, 1, fix="leave it out for the model's maximum")
                or count_problem("batch_size", self.batch_size, 1, fix="leave it out for the default")
                or (None if self.max_tokens is None else count_problem("max_tokens", self.max_tokens, 1, fix="leave it out for no budget"))
                or (None if self.max_src_len is None else count_problem("max_src_len", self.max_src_len, 1))
                or _number_problem("max_len_a", self.max_len_a, MAX_LEN_A, DECLARED["max_len_a"].none)
                or count_problem("max_len_b", self.max_len_b, *MAX_LEN_B)
                or (None if isinstance(self.loop_guard, bool) else f"loop_guard must be True or False (got {shown(self.loop_guard)})")
                or count_problem("streams", self.streams, 1, MAX_STREAMS, "leave it out for the default"))

    @classmethod
    def for_model(cls, max_positions: int, provider: str = "cpu", *, rules: object | None = None, max_output: int | None = None,
                  rows: int = BEAM_ROWS, **given: object) -> DecodeOptions:
        """The options as a user gives them (`given`: the declared OPTIONS, by name; one left out is its declared default:
        guards on, max_len the model's maximum, and any larger one cut to it, batch_size chosen for the beam and provider
        (default_batch_size), streams one per core (default_streams)) for a model of `max_positions` positions, whose
        sources are cut to it. rules: the model's decoding rules; max_output: its default output limit (None: its positions);
        rows: the decoder rows of a default beam-search batch on CPU (beam_rows)."""
        unknown = sorted(set(given) - set(DECLARED))
        if unknown:
            raise TypeError(f"for_model() got an unexpected keyword argument {unknown[0]!r}")
        v = {o.name: given.get(o.name, o.default) for o in OPTIONS}
        default_len = max_positions if max_output is None else max_output
        opts = cls(**{**v, "max_len": default_len if v["max_len"] is None else v["max_len"],
                      "batch_size": 1 if v["batch_size"] is None else v["batch_size"], "streams": 1 if v["streams"] is None else v["streams"]},
                   max_src_len=max_positions, rules=rules)
        # Every given value is checked by now; what is filled in below is valid by construction, and this runs at
        # every call of the API (a single request), so it is set in place instead of checked again.
        opts.max_len = min(opts.max_len, max_positions)
        if v["batch_size"] is None:
            opts.batch_size = default_batch_size(opts.beam, provider, rows)
        if v["streams"] is None:
            opts.streams = default_streams()
        return opts

    @classmethod
    def for_manifest(cls, m: object, provider: str = "cpu", **given: object) -> DecodeOptions:
        """for_model for the model of manifest `m` (toolkit.core.manifest.Manifest: its positions, default output limit and
        decoding rules), with the options a user gave (for_model's keywords). The one builder of user-facing options:
        `tk serve` decodes with exactly what `tk translate` and the API decode with, guards included."""
        return cls.for_model(m.max_len, provider, rules=m.rules(), max_output=m.max_output_len, rows=beam_rows(m.cache_width),
                             **given)


def cores() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or taskset's share), not the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask
        return max(1, os.cpu_count() or 1)


def default_streams() -> int:
    """Concurrent batches unless told: one per core, up to 4 (beyond 4 a stream's batches get too small)."""
    return min(cores(), 4)


def beam_rows(cache_width: int | None) -> int:
    """Decoder rows of a default beam-search batch on CPU for a decoder whose self-attention cache holds `cache_width`
    floats per row and position (None: not known)."""
    return SMALL_CACHE_ROWS if cache_width is not None and cache_width <= SMALL_CACHE else BEAM_ROWS


def default_batch_size(beam: int, provider: str = "cpu", rows: int = BEAM_ROWS) -> int:
    """Sentences per batch unless told: 64, and on CPU under beam search as many as make about `rows` decoder rows
    (beam x sentences; beam_rows), so a batch's cache stays small while it is reordered at every step.

    Measured on 2 cores (AVX-512), first 2,000 Tatoeba Challenge sentences, beam 4, 1 thread x 2 streams, seconds,
    before the decoder read the encoder's outputs once per sentence: fp32 32 sentences 5.44, 64 5.70; int8 3.56, 3.85.
    Greedy is flat from 48 to 96 (fp32 1.62 to 1.68 s).
    """
    return 64 if beam == 1 or provider != "cpu" else max(1, min(64, rows // beam))


def max_len_problem(max_len: int | None, max_positions: int, option: str = "--max-len") -> str | None:
    """What is wrong with an output limit the user gave for a model of `max_positions` positions, or None. The model
    writes no more tokens than it has positions: a larger limit was cut to it without a word (for_model still cuts,
    for the API's and the server's callers); the commands refuse it instead, naming the model's maximum."""
    if max_len is None or not whole(max_len) or max_len <= max_positions:
        return None
    return f"{option} {max_len} is more than this model's maximum of {max_positions} tokens; give at most {max_positions}, or leave it out"
