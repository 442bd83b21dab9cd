"""A model directory states the language pair it translates (`tk export ... --source-lang en --target-lang de`, at export or
later), and tk serve routes by it without a DIR:PAIR suffix; tk translate's --source-lang/--target-lang accept that pair
and refuse another in one line."""

from __future__ import annotations

import shutil

import pytest
from conftest import REPO

from toolkit.core import manifest


@pytest.fixture()
def german(tmp_path):
    copy = tmp_path / "seq2seq"
    shutil.copytree(REPO / "exported" / "seq2seq", copy)
    return copy


def test_a_stated_pair_is_recorded_and_served_without_a_suffix(cli, german):
    r = cli("export", german, "--source-lang", "en", "--target-lang", "de")
    assert r.exit_code == 0, r.output
    assert manifest.load(german).declared().tokenizer.served() == {"source": ["en"], "target": ["de"]}
    assert manifest.load(german).check_files() is None  # the directory is still whole
    # tk serve read the pair from the directory: a second model stated for en-de is the same pair
    shipped = REPO / "exported" / "transformer"
    r = cli("serve", german, f"{shipped}:en-de")
    assert r.exit_code == 2 and "both translate en-de" in r.output, r.output


def test_translate_takes_the_stated_pair_and_refuses_another(cli, german):
    assert cli("export", german, "--source-lang", "en", "--target-lang", "de").exit_code == 0
    plain = cli("translate", "--model", german, "-q", "I'm home.")
    named = cli("translate", "--model", german, "-q", "--source-lang", "en", "--target-lang", "de", "I'm home.")
    assert plain.exit_code == named.exit_code == 0 and plain.output == named.output
    other = cli("translate", "--model", german, "-q", "--target-lang", "fr", "I'm home.")
    assert other.exit_code == 2 and "one language pair (en to de)" in other.output
    assert len(other.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args,expected", [
    (["--source-lang", "en"], "give both"),
    (["--source-lang", "en", "--target-lang", "en"], "are both en"),
    (["--source-lang", "English", "--target-lang", "de"], "is not a language code"),
    (["--source-lang", "en", "--target-lang", "de", "--to-hf", "x"], "run them without --to-hf"),
])
def test_a_bad_pair_is_one_line_and_changes_nothing(cli, german, args, expected):
    before = (german / "manifest.json").read_bytes()
    r = cli("export", german, *args)
    assert r.exit_code == 2 and expected in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert (german / "manifest.json").read_bytes() == before
