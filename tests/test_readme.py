"""The README's shell examples, run as a user on a fresh clone would run them: from a copy of the repository's
files (no runs/, no cache, no leftovers) with ../shared beside it. A README example that stops working fails here.

Every ```bash and ```python block is executed, in the README's order, in one copy, as a user reading top to bottom
would, and none may change a tracked file or leave an untracked one that .gitignore does not cover. Where the README
shows what a block prints (a line ending "prints:" right before a ```text block: "The first command prints:", "The
last command prints:", or the whole block's output), the block must print exactly that. The two
fresh-machine commands are run without their install steps (they need the package index, and what they install is
what this suite runs in) and without the test command itself; what is left of them (`tk translate "I'm home."`)
runs like any other example.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import tomllib

# Minutes of work in all: left out of the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
ANY_BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.S | re.M)
# Steps of the fresh-machine commands that install, or that are this test suite.
NOT_RUN = ("python3 -m venv", ". .venv/bin/activate", "pip install", "apt-get", "command -v chromium", "npm ci",
           "ruff check", "python -m pytest")


def bash_blocks() -> list[str]:
    return [b.strip() for b in BLOCK.findall(README.read_text(encoding="utf-8"))]


def runnable(block: str) -> str:
    """The block without its install and test steps (each `&&`-joined step that names one is dropped)."""
    lines = []
    for line in block.splitlines():
        steps = [s for s in line.split(" && ") if not any(marker in s for marker in NOT_RUN)]
        if steps:
            lines.append(" && ".join(steps))
    return "\n".join(lines)


def test_the_readme_holds_the_install_and_test_commands_and_ci_runs_the_same_tests():
    blocks = bash_blocks()
    install = next(b for b in blocks if "pip install -e . " in b)
    tests = next(b for b in blocks if "python -m pytest" in b)
    assert install.startswith("python3 -m venv .venv") and runnable(install) == 'tk translate "I\'m home."'
    # Translating needs the deploy side only: no torch in the install command; the tests pin torch's CPU build first.
    assert "torch" not in install
    assert tests.index("pip install torch==2.13.0") < tests.index("pip install -e '.[dev]'")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    # .ci/run installs the CPU torch pin and the dev extra, then runs the README's checks word for word.
    for readme_step, ci_step in (("pip install -e '.[dev]'", "-e '.[dev]'"), ("ruff check .", "\nruff check .\n"),
                                 ("python -m pytest -q", "\npython -m pytest -q"), ("npm ci --prefix toolkit/web", "npm ci --prefix toolkit/web")):
        assert readme_step in tests and ci_step in ci, readme_step
    assert "torch==2.13.0" in ci


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory) -> Path:
    """The repository's files as a clone has them (tracked, plus new files not ignored), ../shared beside it."""
    root = tmp_path_factory.mktemp("fresh")
    clone = root / "tk"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, clone / rel)
    (root / "shared").symlink_to(REPO.parent / "shared", target_is_directory=True)
    assert not (clone / "runs").exists()
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=clone, check=True, capture_output=True)
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "fresh clone")
    return clone


def examples() -> list[tuple[str, str]]:
    """(language, code) of every block that runs, in the README's order."""
    found = [(lang, runnable(b.strip()) if lang == "bash" else b.strip()) for lang, b in ANY_BLOCK.findall(README.read_text(encoding="utf-8"))]
    return [(lang, code) for lang, code in found if code]


class Shown(NamedTuple):
    """What the README shows a block printing: `which` is "first" (its first command's output, the first lines of
    stdout), "last" (its last command's, the last lines) or "all" (all of stdout)."""

    which: str
    lines: list[str]


# A ```text block right after a line that ends "prints:" shows the output of the runnable block before it.
BLOCK_OR_OUTPUT = re.compile(r"^(?:(?P<lead>[^\n]*prints:)\n\n?)?```(?P<lang>bash|python|text)\n(?P<body>.*?)^```", re.S | re.M)


def shown_outputs(text: str) -> dict[str, Shown]:
    """Runnable code (as `examples()` gives it) -> what the README shows it printing."""
    shown, last = {}, None
    for m in BLOCK_OR_OUTPUT.finditer(text):
        body = m.group("body").strip()
        if m.group("lang") != "text":
            last = runnable(body) if m.group("lang") == "bash" else body
        elif m.group("lead"):
            assert last, f"{m.group('lead')!r} follows no runnable block"
            which = "first" if "first command" in m.group("lead") else "last" if "last command" in m.group("lead") else "all"
            shown[last] = Shown(which, body.splitlines())
    return shown


def printed_as_shown(stdout: str, shown: Shown) -> str | None:
    """None if `stdout` holds what the README shows, else what differs."""
    lines = [line.rstrip() for line in stdout.splitlines()]
    n = len(shown.lines)
    got = lines[:n] if shown.which == "first" else lines[-n:] if shown.which == "last" else lines
    if got == [line.rstrip() for line in shown.lines]:
        return None
    return f"the README shows the {shown.which} output as:\n" + "\n".join(shown.lines) + "\nbut the block printed:\n" + "\n".join(lines)


EXAMPLES = examples()
SHOWN = shown_outputs(README.read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{lang}: {code.splitlines()[0][:60]}" for lang, code in EXAMPLES])
def test_readme_example_runs_on_a_fresh_clone_and_leaves_it_clean(example, fresh_clone, tmp_path):
    lang, code = example
    env = {**os.environ, "TK_CACHE_DIR": str(tmp_path / "cache"), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("TK_DATA", None)  # the README's commands find the corpus as a user's would
    argv = ["bash", "-eo", "pipefail", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
    proc = subprocess.run(argv, cwd=fresh_clone, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if code in SHOWN:
        differs = printed_as_shown(proc.stdout, SHOWN[code])
        assert differs is None, differs
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=fresh_clone, capture_output=True, text=True,
                            check=True).stdout
    assert status == "", f"the example changed the clone (README commands must leave git status clean):\n{status}"


def test_the_readme_is_short_and_runs_every_command_block():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    # every block is run (bash or python) or is a picture of output (text); no other kind hides an unrun command
    kinds = set(re.findall(r"^```(\w+)", text, re.M))
    assert kinds <= {"bash", "python", "text"}, kinds
    for block in re.findall(r"^```text\n(.*?)^```", text, re.S | re.M):
        assert not re.match(r"\s*(tk|python|pip|curl) ", block), f"a command in a text block is never run:\n{block}"


def test_every_output_the_readme_shows_belongs_to_a_block_that_runs():
    """The translations and the corpus's first lines are checked against what the README shows; a "prints:" block
    whose code no longer runs (or was renamed) would silently stop being checked."""
    runs = {code for _, code in EXAMPLES}
    assert set(SHOWN) <= runs
    shown_for = {code.splitlines()[0]: s for code, s in SHOWN.items()}
    assert shown_for['tk translate "I\'m home." "Where is the station?"'].lines == ["Je suis chez moi.", "Où est la gare ?"]
    corpus = next(s for code, s in SHOWN.items() if "tk translate-corpus" in code)
    assert corpus.which == "last" and len(corpus.lines) == 3


def test_a_corpus_of_language_codes_is_caught_by_the_shown_output():
    """The corpus example once cut the language code (`cut -f1`) instead of the English: every line translated `eng`,
    which exits 0 and so passed a check of exit codes alone."""
    corpus = next(s for code, s in SHOWN.items() if "tk translate-corpus" in code)
    assert printed_as_shown("engage\n" * 3, corpus) is not None
    assert printed_as_shown("\n".join(corpus.lines) + "\n", corpus) is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_serve_example_stops_waiting_as_soon_as_the_server_exits_and_shows_why(tmp_path):
    """A server that cannot start (here a `tk` that fails at once, as without the serve extra) used to be waited for
    120 s before the example went on."""
    serve = next(code for lang, code in EXAMPLES if lang == "bash" and "tk serve" in code)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "tk"
    fake.write_text("#!/bin/sh\necho \"error: tk serve needs fastapi; install the serve extra\" >&2\nexit 2\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    start = time.monotonic()
    proc = subprocess.run(["bash", "-eo", "pipefail", "-c", serve.replace("8765", str(_free_port()))], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=100)
    assert time.monotonic() - start < 20, "the example waited for a server that had exited"
    assert proc.returncode != 0 and "tk serve needs fastapi" in proc.stderr, proc.stderr


def test_the_code_has_the_license_the_readme_and_the_package_metadata_name():
    """A user (or a company's license check) finds the code's terms in LICENSE and in the wheel's metadata; the
    Tatoeba data keeps its own attribution beside them."""
    license_text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert license_text.startswith("MIT License\n") and "Permission is hereby granted, free of charge" in license_text
    assert tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["license"] == "MIT"
    section = " ".join(README.read_text(encoding="utf-8").split("## Data and license\n", 1)[1].split("\n## ", 1)[0].split())
    assert "MIT license ([LICENSE](LICENSE))" in section and "CC BY 2.0 FR" in section and "tatoeba.org" in section
