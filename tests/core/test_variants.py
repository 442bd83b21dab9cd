"""The variant catalogue is the one place a variant is declared: the CLI, export and verify read it."""

from __future__ import annotations

import shlex

import click
import pytest

from toolkit import cli
from toolkit.core import variants
from toolkit.core.variants import ExportOptions, wanted_variants
from toolkit.verify.compare import tolerance


def _choices(command: click.Command, option: str) -> set[str]:
    param = next(p for p in command.params if p.name == option)
    return set(param.type.choices)


@pytest.mark.parametrize("command,option", [(cli.translate, "variant"), (cli.evaluate, "variant"), (cli.bench, "variants"),
                                            (cli.serve, "variant"), (cli.verify, "variants"), (cli.translate_corpus, "variant")])
def test_every_variant_choice_list_is_the_catalogue(command, option):
    assert _choices(command, option) - {"attention"} == set(variants.NAMES)


@pytest.mark.parametrize("name", variants.BUILT)
def test_each_export_flag_stores_exactly_its_variant(name):
    """The flag the catalogue names (and error messages print) parses with `tk export` and asks for that variant alone."""
    ctx = cli.export.make_context("export", ["exported/x", *shlex.split(variants.get(name).export_flag)])
    p = ctx.params
    opts = ExportOptions(out=p["source"], fp16=p["fp16"], optimize=p["optimize"], quantize=p["quantize"])
    assert wanted_variants(opts) == [name]


def test_verify_tolerance_defaults_come_from_the_catalogue():
    assert tolerance("int8", None, None) == variants.get("int8").tolerance
    assert tolerance("fp16", 1e-3, None) == (1e-3, variants.get("fp16").tolerance[1])


def test_unknown_variant_is_a_usage_error_listing_the_known_ones():
    with pytest.raises(variants.UsageError, match="unknown variant 'bf16'; choose one of fp32, fp16, optimized, int8"):
        variants.get("bf16")


def test_suffixes_are_distinct_so_variants_never_overwrite_each_other():
    suffixes = [v.suffix for v in variants.CATALOGUE.values()]
    assert len(set(suffixes)) == len(suffixes)


def test_every_variant_the_catalogue_builds_has_one_onnx_runtime_builder():
    """The catalogue (core) declares the variants; the ONNX Runtime package builds them: a variant declared without a
    builder would fail only when someone first asks for it."""
    from toolkit.graphs import variants as built

    assert tuple(built.BUILDERS) == variants.BUILT
    with pytest.raises(ValueError, match="nothing to build"):
        built.build(None, None, variants.PLAIN)
