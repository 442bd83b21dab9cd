"""`tk translate` start-up: one sentence, greedy, imports neither torch nor onnx (a fifth of the cold start)."""

import subprocess
import sys
from pathlib import Path

import pytest

CODE = """
import sys
from toolkit.cli import main
sys.argv = ['tk', 'translate', '-q', *{args!r}, "I'm home."]
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
print(sorted(m for m in ('torch', 'onnx') if m in sys.modules))
"""


@pytest.mark.parametrize("args", [["--provider", "cpu"], []])
def test_one_sentence_translation_loads_no_graph_building_code(args):
    if not args and Path("/dev/nvidiactl").exists():
        pytest.skip("with an NVIDIA device the default provider probes CUDA, which builds a probe graph")
    # The first start builds the default (attention-fused) graphs and keeps them; every later start loads them.
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", CODE.format(args=args)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    translation, imported = proc.stdout.strip().splitlines()
    assert translation and imported == "[]"


API_CODE = """
import sys
from toolkit import Translator
print(Translator(sys.argv[1], variant="int8").translate(["I'm home."])[0])
print(sorted(m for m in ('torch', 'onnx', 'concurrent.futures', 'logging', 'hashlib') if m in sys.modules))
"""


def test_one_sentence_through_the_api_starts_no_stream_pool(tmp_path):
    """A single request decodes one batch: the thread pool that runs concurrent streams (and the logging
    that concurrent.futures brings) is 7 ms of a 190 ms cold start, paid only by calls with several batches.
    A start whose file digests are cached hashes nothing either (hashlib's OpenSSL: 2.5 ms)."""
    model = Path(__file__).resolve().parents[2] / "exported" / "transformer"
    for _ in range(2):  # the first start builds the int8 graphs and keeps them
        proc = subprocess.run([sys.executable, "-c", API_CODE, str(model)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    translation, imported = proc.stdout.strip().splitlines()
    assert translation.startswith("Je") and imported == "[]"
