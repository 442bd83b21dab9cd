"""The test command's own limits: a test that runs too long fails by itself, and never hangs or kills the run.

These run pytest on small throw-away test files under this project's pytest settings (pyproject.toml), with the
limits shortened so the checks take seconds.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO, built_once

# Minutes of work in all: left out of the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

HANGS = {
    "test_a.py": """
        import time
        def test_too_slow():
            time.sleep(60)
        def test_after_a_timeout():
            pass
    """,
    # A test stuck where no signal handler runs: the backstop dumps the stacks and ends its worker.
    "test_b.py": """
        import signal, time
        def test_stuck_in_c():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(60)
    """,
    "test_c.py": """
        def test_other_file():
            pass
    """,
}


@pytest.mark.timeout(90)
def test_the_test_command_ends_when_tests_hang(tmp_path: Path) -> None:
    for name, body in HANGS.items():
        (tmp_path / name).write_text(textwrap.dedent(body))
    start = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
         "-q", "-n", "2", "--dist", "loadfile", "--max-worker-restart=0", "-o", "timeout=2", "-o", "faulthandler_timeout=6",
         str(tmp_path)],
        capture_output=True, text=True, timeout=80, cwd=tmp_path)
    took = time.monotonic() - start
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert took < 60, f"the run took {took:.0f} s"
    # the timed-out test failed by itself and its worker went on to the next test in that file
    assert "FAILED test_a.py::test_too_slow - Failed: Timeout" in out, out
    assert "1 failed" not in out and "test_after_a_timeout" not in out.split("short test summary")[-1], out
    # the test stuck in C code is named, not lost in a hang
    assert "test_b.py::test_stuck_in_c" in out, out


@pytest.mark.timeout(2)
def test_a_shared_build_does_not_eat_the_asking_tests_time_limit(tmp_path_factory) -> None:
    # the build takes longer than this test's whole limit; only the test's own work counts against it
    folder = built_once(tmp_path_factory, "slow-build-probe", lambda out: (time.sleep(3), (out / "made").touch()))
    assert (folder / "made").is_file()
