"""The README's shell examples, run as a user on a fresh clone would run them: from a copy of the repository's
files (no runs/, no cache, no leftovers) with ../shared beside it. A README example that stops working fails here.

Every ```bash block is executed. The two fresh-machine commands are run without their install steps (they
need the package index, and what they install is what this suite runs in) and without the test command itself;
what is left of them (`tk translate "I'm home."`) runs like any other example.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
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
                                 ("python -m pytest -q", "\npython -m pytest -q"), ("npm ci --prefix web", "npm ci --prefix web")):
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
    return clone


EXAMPLES = [b for b in bash_blocks() if runnable(b)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", EXAMPLES, ids=[runnable(b).splitlines()[0][:60] for b in EXAMPLES])
def test_readme_example_runs_on_a_fresh_clone(block, fresh_clone, tmp_path):
    env = {**os.environ, "TK_CACHE_DIR": str(tmp_path / "cache"), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("TK_DATA", None)  # the README's commands find the corpus as a user's would
    proc = subprocess.run(["bash", "-eo", "pipefail", "-c", runnable(block)], cwd=fresh_clone, env=env,
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
