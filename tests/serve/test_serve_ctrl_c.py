"""Ctrl-C on `tk serve` shuts down as cleanly as SIGTERM but exits 130, as a shell reports an interrupted command (a
script that runs the server in the foreground can tell an interruption from a normal stop), and docs/deployment.md
says so rather than "exits 0"."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the serve extra is not installed: pip install 'tk-onnx-deploy[serve]'")

REPO = Path(__file__).resolve().parents[2]


def serve_section() -> str:
    text = (REPO / "docs" / "deployment.md").read_text(encoding="utf-8")
    return " ".join(text[text.index("\n## tk serve"):text.index("\n## tk translate-corpus")].split())


def test_the_deployment_guide_gives_ctrl_c_its_own_exit_code():
    sentences = [s for s in re.split(r"(?<=[.;])\s", serve_section()) if "Ctrl-C" in s]
    assert sentences, "the tk serve section no longer says what Ctrl-C does"
    assert all("130" in s and "exits 0" not in s for s in sentences), sentences


def test_ctrl_c_shuts_the_server_down_cleanly_and_exits_130():
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "serve", str(REPO / "exported" / "transformer"), "--port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = next(m.group(1) for line in proc.stderr if (m := re.search(r"on (http://127\.0\.0\.1:\d+)", line)))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/ready", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
        log = proc.stderr.read()
        assert "shut down cleanly" in log and "Traceback" not in log, log
    finally:
        if proc.poll() is None:
            proc.kill()
