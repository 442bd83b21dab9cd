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
    ({"alpha": float("nan")}, "alpha must be a finite number from 0 to 10, or None for the model's own (got nan)"),
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
        DecodeOptions.bare(**fields)
    assert expected in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 120
    with pytest.raises(UsageError):  # a copy with a bad value is refused too
        dataclasses.replace(DecodeOptions.bare(), **fields)


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
    from toolkit.cli.commands import options
    from toolkit.core import batching

    assert (options.BEAM.max, options.STREAMS.max, options.THREADS.max) == (MAX_BEAM, MAX_STREAMS, MAX_THREADS)
    assert GUARDED is batching.GUARDED and batching.DecodeOptions is DecodeOptions


def test_the_cli_option_group_hands_the_command_one_dict_of_for_model_arguments():
    import click
    from click.testing import CliRunner

    from toolkit.cli.commands.options import DECODING

    @click.command()
    @DECODING
    def show(decoding):
        click.echo(repr(DecodeOptions.for_model(64, **decoding)))

    out = CliRunner().invoke(show, ["--beam", "4", "--max-len", "9", "--no-loop-guard"])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == repr(DecodeOptions.for_model(64, beam=4, max_len=9, loop_guard=False))


# ---- model sizes: a config (tk train --set, a checkpoint) and a manifest ----------------------------

def _one_line_error(result, code: int) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    return line


@pytest.mark.parametrize("setting, expected", [
    # num_layers grew memory at 170 MB/s; max_len ended in an internal error after asking for 25 GB.
    ("num_layers=99999999999999999999", "num_layers must be at most 48 (the largest tk builds), got 99999999999999999999"),
    ("max_len=100000000", "max_len must be at most 1024 (the largest tk builds), got 100000000"),
    ("num_hiddens=1000000000000", "num_hiddens must be at most 1024"),
    ("ffn_num_hiddens=100000", "ffn_num_hiddens must be at most 4096"),
    ("vocab_size=10000000", "vocab_size must be at most 262144"),
    ("num_heads=128", "num_heads must be at most 64"),
    ("vocab_size=4", "vocab_size must be at least 5"),
])
def test_a_config_size_beyond_its_bound_is_one_line_before_anything_is_allocated(cli, tmp_path, setting, expected):
    out = tmp_path / "run"
    line = _one_line_error(cli("train", "transformer", "--preset", "tiny", "--out", out, "--set", setting), 2)
    assert expected in line, line
    assert not out.exists()


def test_every_size_of_every_registered_model_has_a_bound_its_defaults_keep():
    from toolkit.core.architectures import SIZES
    from toolkit.pytorch import registry

    for entry in registry.entries():
        name = entry.name
        sizes = [f.name for f in dataclasses.fields(entry.config_cls) if type(f.default) is int and f.name != "pad_id"]
        assert set(sizes) <= set(SIZES), (name, set(sizes) - set(SIZES))
        registry.check_config(name, entry.config())


def test_a_checkpoint_config_beyond_the_bounds_is_refused_before_the_model_is_built():
    from toolkit.pytorch import registry

    with pytest.raises(UsageError, match=r"^ckpt: num_layers must be at most 48 \(the largest tk builds\), got 1000000$"):
        registry.get("transformer").checked_config({"num_layers": 10**6}, "ckpt")
    with pytest.raises(UsageError, match=r"embed_size must be at most 1024 .*got an integer of 16610 bits"):
        registry.get("seq2seq").checked_config({"embed_size": 10**5000}, "ckpt")  # too long for Python to print


SHIPPED = "exported/transformer/manifest.json"


def _manifest_dir(tmp_path, text: str):
    (tmp_path / "manifest.json").write_text(text)
    return tmp_path


@pytest.mark.parametrize("key, value, expected", [
    ("max_len", 100000, "config.max_len must be at most 1024 (the largest tk builds), got 100000"),
    ("max_len", 1, "config.max_len must be at least 2, got 1"),
    ("num_layers", 10**9, "config.num_layers must be at most 48"),
    ("vocab_size", 2**40, "config.vocab_size must be at most 262144"),
    ("num_hiddens", "256", "config.num_hiddens must be a whole number from 1 to 1024, got '256'"),
])
def test_a_manifest_stating_a_size_beyond_its_bound_is_corrupt_in_one_line(cli, tmp_path, key, value, expected):
    import json
    from pathlib import Path

    from toolkit.core import manifest

    data = json.loads((Path(__file__).resolve().parents[2] / SHIPPED).read_text())
    data["config"][key] = value
    model = _manifest_dir(tmp_path, json.dumps(data))
    with pytest.raises(UsageError) as e:
        manifest.load(model)
    assert f"manifest.json is corrupt or not a tk manifest: {expected}" in str(e.value) and "\n" not in str(e.value)
    assert expected in _one_line_error(cli("translate", "Go.", "--model", model), 2)


def test_a_manifest_nested_100k_deep_is_one_line_not_a_recursion_error(cli, tmp_path):
    from toolkit.core import manifest
    from toolkit.pytorch.export import tk_entries

    model = _manifest_dir(tmp_path, '{"format": "tk-export/1", "metrics": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(UsageError, match="manifest.json is corrupt: its JSON nests too deeply to read; re-export"):
        manifest.load(model)
    assert "nests too deeply" in _one_line_error(cli("translate", "Go.", "--model", model), 2)
    assert tk_entries(model) is None  # export --force treats it as no tk model directory, without a traceback
