"""Shell completion, as docs/commands.md tells a user to turn it on: each line it gives produces a completion script,
and bash, having sourced the script as the documented `eval` line does, completes tk's commands and choices."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TK = Path(sys.executable).parent / "tk"  # the installed command: click names the variable after the program, _TK_COMPLETE


def documented_lines() -> dict[str, str]:
    """Shell -> the line docs/commands.md gives for it."""
    text = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    assert "\n## Shell completion\n" in text, "docs/commands.md does not say how to turn on shell completion"
    section = text.split("\n## Shell completion\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]  # the lines to copy into a start-up file
    return {m.group(1): m.group(0) for m in re.finditer(r"^.*_TK_COMPLETE=(bash|zsh|fish)_source tk.*$", block, re.M)}


def test_the_reference_gives_a_line_for_bash_zsh_and_fish_and_each_makes_a_script():
    lines = documented_lines()
    assert set(lines) == {"bash", "zsh", "fish"}, lines
    for shell in lines:
        made = subprocess.run([str(TK)], env={**os.environ, "_TK_COMPLETE": f"{shell}_source"}, capture_output=True, text=True,
                              timeout=60)
        assert made.returncode == 0 and "_tk_completion" in made.stdout, (shell, made.stderr)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_with_the_documented_line_completes_commands_and_choices():
    eval_line = documented_lines()["bash"].split("#")[0].strip()
    script = (f"{eval_line}\n"
              # bash calls a completion function with the command as $1
              "complete_words() { COMP_WORDS=(\"$@\"); COMP_CWORD=$(($# - 1)); COMPREPLY=(); _tk_completion tk;"
              " printf '%s\\n' \"${COMPREPLY[@]}\"; }\n"
              "complete_words tk tr; echo ---; complete_words tk translate --variant i\n")
    env = {**os.environ, "PATH": f"{TK.parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    commands, variants = done.stdout.split("---\n")
    assert set(commands.split()) == {"train", "translate", "translate-corpus"}, done.stdout
    assert "int8" in variants.split(), done.stdout
