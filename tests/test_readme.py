"""The README's shell examples, run as a user on a fresh clone would run them: from a copy of the repository's
files (no runs/, no cache, no leftovers) with ../shared beside it. A README example that stops working fails here.

Every ```bash and ```python block is executed, in the README's order, in one copy, as a user reading top to bottom
would, and none may change a tracked file or leave an untracked one that .gitignore does not cover. The two
fresh-machine commands are run without their install steps (they need the package index, and what they install is
what this suite runs in) and without the test command itself; what is left of them (`tk translate "I'm home."`)
runs like any other example.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


EXAMPLES = examples()


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
