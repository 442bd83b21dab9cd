"""Regenerates every picture under docs/ from the shipped models in exported/.

    python tools/make_pictures.py

Run it after replacing a shipped model (a retrained one, say). Each picture is one `tk` command,
printed as it runs; a model directory exported before tk declared attention outputs gets them
first (`tk export DIR --attention`, which leaves its graphs as they are). Needs the plot extra.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SENTENCE = "Tom bought a new car last week."
COMMANDS = [
    ["attention", "exported/transformer", SENTENCE, "-o", "docs/attention-transformer.png"],
    ["attention", "exported/seq2seq", SENTENCE, "-o", "docs/attention-seq2seq.png"],
    ["attention", "exported/nw", "-o", "docs/nw.png"],
    ["plot", "exported/transformer", "-o", "docs/training-transformer.png"],
]


def tk(*args: str) -> None:
    print("$ tk " + " ".join(f'"{a}"' if " " in a else a for a in args), flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-m", "toolkit.cli", *args], cwd=REPO, env=env, check=True)


def main() -> None:
    for name in ("transformer", "seq2seq"):
        manifest = json.loads((REPO / "exported" / name / "manifest.json").read_text(encoding="utf-8"))
        if "attention" not in manifest:
            tk("export", f"exported/{name}", "--attention")
    for args in COMMANDS:
        tk(*args)


if __name__ == "__main__":
    main()
