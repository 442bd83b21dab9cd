"""Issues 36 and 37: every size and option a user can set is checked once, with a one-line error naming it, the value
and what is accepted, before anything is allocated: DecodeOptions' own checks, config sizes, a manifest's sizes."""

from __future__ import annotations

import dataclasses

import pytest

from toolkit.core.decode_options import GUARDED, MAX_BEAM, MAX_STREAMS, MAX_THREADS, DecodeOptions
from toolkit.core.errors import UsageError

# ---- DecodeOptions owns its checks ----------------------------------------------------------------


@pytest.mark.parametrize("fields, expected", [
    ({"beam": 0}, "beam must be a whole number from 1 to 64 (got 0)"),
    ({"beam": True}, "beam must be a whole number from 1 to 64 (got True)"),
    ({"beam": 2, "n_best": 3}, "n_best must be a whole number from 1 to the beam size 2 (got 3)"),
    ({"alpha": float("nan")}, "alpha must be a finite number from 0 to 10 (got nan)"),
    ({"max_len": -5}, "max_len must be a whole number of at least 1 (got -5)"),
    ({"batch_size": 0}, "batch_size must be a whole number of at least 1 (got 0)"),
    ({"max_src_len": 0}, "max_src_len must be a whole number of at least 1 (got 0)"),
    ({"max_len_a": float("inf")}, "max_len_a must be a finite number from 0 to 100"),
    ({"max_len_b": 1001}, "max_len_b must be a whole number from 0 to 1000 (got 1001)"),
    ({"loop_guard": 1}, "loop_guard must be True or False (got 1)"),
    ({"streams": 65}, "streams must be a whole number from 1 to 64 (got 65)"),
    ({"beam": 10**60}, "(got 1000000000000000000000000000000000000...)"),  # an absurd value stays one short line
])
def test_decode_options_refuse_what_the_decoding_loop_cannot_run_with_wherever_they_are_built(fields, expected):
    # Built directly, as tk serve, tk bench and tk evaluate build them, not only through the API.
    with pytest.raises(UsageError) as e:
        DecodeOptions(**fields)
    assert expected in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 120
    with pytest.raises(UsageError):  # a copy with a bad value is refused too
        dataclasses.replace(DecodeOptions(), **fields)


def test_for_model_fills_the_defaults_and_caps_max_len_at_the_model():
    opts = DecodeOptions.for_model(64, "cpu", beam=4)
    assert (opts.max_len, opts.max_src_len, opts.batch_size, opts.n_best) == (64, 64, 32, 1)
    assert {k: getattr(opts, k) for k in GUARDED} == GUARDED
    assert DecodeOptions.for_model(64, "cuda", beam=4, max_len=10_000, streams=3).max_len == 64
    assert (DecodeOptions.for_model(64, "cuda", beam=4).batch_size, DecodeOptions.for_model(64, max_len=5).max_len) == (64, 5)
    with pytest.raises(UsageError, match="max_len must be a whole number of at least 1 \\(got 0\\); leave it out for the model's maximum"):
        DecodeOptions.for_model(64, max_len=0)


def test_the_cli_declares_decode_options_own_bounds_and_guards():
    # One truth: the CLI's declared ranges and defaults are read from toolkit.core.decode_options, not copied.
    from toolkit.cli import options
    from toolkit.core import batching

    assert (options.BEAM.max, options.STREAMS.max, options.THREADS.max) == (MAX_BEAM, MAX_STREAMS, MAX_THREADS)
    assert options.GUARDED is GUARDED is batching.GUARDED and batching.DecodeOptions is DecodeOptions


def test_the_cli_option_group_hands_the_command_one_dict_of_for_model_arguments():
    import click
    from click.testing import CliRunner

    from toolkit.cli.options import DECODING

    @click.command()
    @DECODING
    def show(decoding):
        click.echo(repr(DecodeOptions.for_model(64, **decoding)))

    out = CliRunner().invoke(show, ["--beam", "4", "--max-len", "9", "--no-loop-guard"])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == repr(DecodeOptions.for_model(64, beam=4, max_len=9, loop_guard=False))
