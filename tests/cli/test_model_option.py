"""The model directory is given the same way in every command: `--model DIR` (as tk translate and tk bench take it)
works wherever a positional MODEL_DIR does, and the positional form keeps working."""

from __future__ import annotations

import pytest
from conftest import REPO

COMMANDS = [
    ("verify", []),
    ("evaluate", []),
    ("attention", ["Hello."]),
    ("translate-corpus", ["{tmp}/in.txt", "{tmp}/out"]),
    ("serve", []),
]


@pytest.mark.parametrize("command,rest", COMMANDS, ids=[c for c, _ in COMMANDS])
def test_model_option_and_positional_model_dir_are_the_same(cli, tmp_path, command, rest):
    (tmp_path / "in.txt").write_text("Hello.\n", encoding="utf-8")
    missing = tmp_path / "no-such-model"
    rest = [r.format(tmp=tmp_path) for r in rest]
    positional = cli(command, missing, *rest)
    option = cli(command, "--model", missing, *rest)
    option_eq = cli(command, f"--model={missing}", *rest)
    # the same model directory reached the command: the same one-line refusal naming it, the same exit code
    assert positional.exit_code == option.exit_code == option_eq.exit_code != 0, positional.output
    assert str(missing) in positional.output
    assert positional.output == option.output == option_eq.output


def test_model_option_without_a_value_is_one_line(cli):
    result = cli("verify", "--model")
    assert result.exit_code == 2 and "--model needs a model directory" in result.output


def test_the_option_works_on_a_real_model(cli):
    result = cli("verify", "--model", REPO / "exported" / "nw", "--sentences", "1")
    assert result.exit_code == 0, result.output
