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

GUARDED = {"max_len_a": 2.0, "max_len_b": 10, "loop_guard": True}  # what tk translate uses unless told otherwise

# Bounds of the options. Beam is capped where a larger one only burns memory and time (beam 5000 took a minute
# and 3 GB for one sentence); streams beyond the cores only wait. Threads are not a decoding option, but the API
# and the CLI check a session's intra-op threads against the same bound.
MAX_BEAM = 64
MAX_STREAMS = 64
MAX_THREADS = 256
ALPHA = (0.0, 10.0)
MAX_LEN_A = (0.0, 100.0)
MAX_LEN_B = (0, 1000)


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
    # max_len), and a hypothesis that starts repeating itself is stopped. Off in training-time
    # evaluation, so that they never hide what the model itself does.
    max_len_a: float | None = None
    max_len_b: int = 10
    loop_guard: bool = False
    # Batches decoded at the same time, each in its own thread with its own backend over the same
    # sessions (CTranslate2's inter_threads). Small batches leave cores idle between a step's
    # matrix multiplies; a second stream fills them. Results do not depend on it.
    streams: int = 1
    # The model's decoding rules (toolkit.core.declaration.DecodingRules: start and end tokens, length penalty);
    # None: tk's. translate_batch sets them from the model directory, so every way in decodes a model by its own.
    rules: object | None = None

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
                or _number_problem("alpha", self.alpha, ALPHA, "for the model's own")
                or count_problem("max_len", self.max_len, 1, fix="leave it out for the model's maximum")
                or count_problem("batch_size", self.batch_size, 1, fix="leave it out for the default")
                or (None if self.max_tokens is None else count_problem("max_tokens", self.max_tokens, 1, fix="leave it out for no budget"))
                or (None if self.max_src_len is None else count_problem("max_src_len", self.max_src_len, 1))
                or _number_problem("max_len_a", self.max_len_a, MAX_LEN_A, "for no length guard")
                or count_problem("max_len_b", self.max_len_b, *MAX_LEN_B)
                or (None if isinstance(self.loop_guard, bool) else f"loop_guard must be True or False (got {shown(self.loop_guard)})")
                or count_problem("streams", self.streams, 1, MAX_STREAMS, "leave it out for the default"))

    @classmethod
    def for_model(cls, max_positions: int, provider: str = "cpu", *, beam: int = 1, alpha: float | None = None, n_best: int = 1,
                  max_len: int | None = None, batch_size: int | None = None, max_tokens: int | None = None,
                  max_len_a: float | None = GUARDED["max_len_a"], max_len_b: int = GUARDED["max_len_b"],
                  loop_guard: bool = GUARDED["loop_guard"], streams: int | None = None, rules: object | None = None,
                  max_output: int | None = None) -> DecodeOptions:
        """The options as a user gives them (tk translate, translate-corpus, the API) for a model of `max_positions`
        positions: guards on unless told; max_len None: the model's maximum, and any larger one is cut to it; sources
        are cut to it; batch_size None: chosen for the beam and provider (default_batch_size); streams None: one per
        core (default_streams). rules: the model's decoding rules; max_output: its default output limit (None: its positions)."""
        default_len = max_positions if max_output is None else max_output
        opts = cls(beam=beam, alpha=alpha, n_best=n_best, max_len=default_len if max_len is None else max_len,
                   batch_size=1 if batch_size is None else batch_size, max_tokens=max_tokens, max_src_len=max_positions,
                   max_len_a=max_len_a, max_len_b=max_len_b, loop_guard=loop_guard, streams=1 if streams is None else streams,
                   rules=rules)
        # Every given value is checked by now; what is filled in below is valid by construction, and this runs at
        # every call of the API (a single request), so it is set in place instead of checked again.
        opts.max_len = min(opts.max_len, max_positions)
        if batch_size is None:
            opts.batch_size = default_batch_size(beam, provider)
        if streams is None:
            opts.streams = default_streams()
        return opts

    @classmethod
    def for_manifest(cls, m: object, provider: str = "cpu", **given: object) -> DecodeOptions:
        """for_model for the model of manifest `m` (toolkit.core.manifest.Manifest: its positions, default output limit and
        decoding rules), with the options a user gave (for_model's keywords). The one builder of user-facing options:
        `tk serve` decodes with exactly what `tk translate` and the API decode with, guards included."""
        return cls.for_model(m.max_len, provider, rules=m.rules(), max_output=m.max_output_len, **given)


def cores() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or taskset's share), not the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask
        return max(1, os.cpu_count() or 1)


def default_streams() -> int:
    """Concurrent batches unless told: one per core, up to 4 (beyond 4 a stream's batches get too small)."""
    return min(cores(), 4)


BEAM_ROWS = 128  # decoder rows (sentences x beam) of a default beam-search batch on CPU


def default_batch_size(beam: int, provider: str = "cpu") -> int:
    """Sentences per batch unless told: 64, and on CPU under beam search as many as make about 128 decoder rows
    (beam x sentences), so a batch's cache stays small while it is reordered at every step.

    Measured on 2 cores (AVX-512), first 2,000 Tatoeba Challenge sentences, beam 4, 1 thread x 2 streams, seconds:
    fp32 32 sentences 5.44, 64 5.70; int8 3.56, 3.85. Greedy is flat from 48 to 96 (fp32 1.62 to 1.68 s).
    """
    return 64 if beam == 1 or provider != "cpu" else max(1, min(64, BEAM_ROWS // beam))


def max_len_problem(max_len: int | None, max_positions: int, option: str = "--max-len") -> str | None:
    """What is wrong with an output limit the user gave for a model of `max_positions` positions, or None. The model
    writes no more tokens than it has positions: a larger limit was cut to it without a word (for_model still cuts,
    for the API's and the server's callers); the commands refuse it instead, naming the model's maximum."""
    if max_len is None or not whole(max_len) or max_len <= max_positions:
        return None
    return f"{option} {max_len} is more than this model's maximum of {max_positions} tokens; give at most {max_positions}, or leave it out"
