"""A Hugging Face config.json's numbers are read as untrusted input: NaN or an infinity in any number field (Python's
json reads NaN, Infinity and 1e400 from a file) is a one-line error naming the file and the field at `tk export hf:DIR`,
for every field of every architecture tk imports, so that a field added later is covered without a new test."""

from __future__ import annotations

import importlib
import json
import math
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
from helpers import one_line_error
from hf_marian_fixture import untrained_marian

from toolkit.core.architectures import ARCHITECTURES
from toolkit.core.errors import UsageError

# NaN and the infinities, and a whole number past a float's range (float() of it overflows).
NON_FINITE = [math.nan, math.inf, -math.inf, 10**400]


def _settings_class(module) -> type:
    """The builder's settings dataclass: the fields it reads from config.json."""
    return module.MODEL.config_cls


def _float_fields() -> list[tuple[str, str]]:
    """(architecture, field) for every float field each imported architecture's settings read from config.json."""
    out = []
    for arch in ARCHITECTURES.values():
        if arch.origin != "hf":
            continue
        cls = _settings_class(importlib.import_module(arch.builder))
        defaults = cls()
        out += [(arch.name, f.name) for f in fields(cls) if type(getattr(defaults, f.name)) is float and f.name not in getattr(cls, "OWN", ())]
    return out


FLOAT_FIELDS = _float_fields()


def test_every_imported_architecture_has_its_float_fields_covered():
    """The loop below is over something: each architecture tk imports declares at least one float field."""
    assert {a.name for a in ARCHITECTURES.values() if a.origin == "hf"} == {arch for arch, _ in FLOAT_FIELDS}


@pytest.mark.parametrize("value", NON_FINITE, ids=["nan", "inf", "-inf", "10**400"])
@pytest.mark.parametrize("arch, field", FLOAT_FIELDS, ids=[f"{a}-{f}" for a, f in FLOAT_FIELDS])
def test_a_non_finite_float_field_is_refused_naming_it(tmp_path, arch, field, value):
    architecture = ARCHITECTURES[arch]
    builder = importlib.import_module(architecture.builder)
    config = {"model_type": architecture.hf_model_types[0], field: value}
    with pytest.raises(UsageError) as refused:
        builder.settings_from(config, {}, tmp_path)
    where, _, said = str(refused.value).partition(": ")  # the path names the test, whose name says "finite" too
    assert where == f"{tmp_path}/config.json" and "\n" not in said, str(refused.value)
    assert said.startswith(f"{field} must be a finite number"), said


@pytest.mark.parametrize("arch", sorted({a for a, f in FLOAT_FIELDS if f == "dropout"}))
@pytest.mark.parametrize("value", [-0.5, 1.5])
def test_a_dropout_that_is_no_probability_is_refused_naming_it(tmp_path, arch, value):
    architecture = ARCHITECTURES[arch]
    builder = importlib.import_module(architecture.builder)
    with pytest.raises(UsageError, match=f"dropout must be a number from 0 to 1, got {value}"):
        builder.settings_from({"model_type": architecture.hf_model_types[0], "dropout": value}, {}, tmp_path)


@pytest.mark.parametrize("arch", sorted({a for a, _ in FLOAT_FIELDS}))
def test_a_non_finite_whole_number_field_is_refused_naming_it(tmp_path, arch):
    """Infinity where a size belongs is refused as not a whole number, naming the field."""
    architecture = ARCHITECTURES[arch]
    builder = importlib.import_module(architecture.builder)
    with pytest.raises(UsageError, match="d_model must be a whole number"):
        builder.settings_from({"model_type": architecture.hf_model_types[0], "d_model": math.inf}, {}, tmp_path)


@pytest.fixture(scope="module")
def untrained_hf(tmp_path_factory, corpus_zip) -> Path:
    """A tiny MarianMTModel as initialised (no training): only its config.json matters here."""
    return untrained_marian(tmp_path_factory, corpus_zip)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_tk_export_of_a_config_with_a_non_finite_dropout_is_one_line(cli, untrained_hf, tmp_path, text):
    bad = Path(shutil.copytree(untrained_hf, tmp_path / "bad"))
    config = json.loads((bad / "config.json").read_text())
    # As a file written by Python's json.dumps (or by hand) holds it: a bare NaN or Infinity, or a number past a float.
    (bad / "config.json").write_text(json.dumps({**config, "dropout": "@"}).replace('"@"', text))
    line = one_line_error(cli("export", f"hf:{bad}", "--out", tmp_path / "out"), 2)
    assert f"{bad}/config.json: dropout must be a finite number" in line, line
    assert not (tmp_path / "out").exists()
