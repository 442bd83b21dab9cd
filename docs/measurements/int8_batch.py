"""How many translations change with the batch they are in: the first --sentences Tatoeba Challenge sentences, greedy,
each alone and in batches of --batch, with one variant's graphs after another (one stream, ONNX Runtime CPU).

    python docs/measurements/int8_batch.py [--model exported/transformer] [--variants fp32,int8] [--batch 64]

int8's DynamicQuantizeLinear takes one scale for a step's whole batch of activations, so its rows depend on each other.
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    from toolkit.bench.text import read_text
    from toolkit.deploy.api import Translator

    p = argparse.ArgumentParser()
    p.add_argument("--model", default=str(REPO / "exported" / "transformer"))
    p.add_argument("--text", default=str(REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt"))
    p.add_argument("--variants", default="fp32,int8")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args()
    lines = read_text(Path(a.text), option="--text")[0][: a.sentences]
    for variant in a.variants.split(","):
        t = Translator(a.model, provider="cpu", variant=variant)
        alone = [t.translate_batch([s], beam=1, streams=1)[0][0].text for s in lines]
        together = [n[0].text for n in t.translate_batch(lines, beam=1, batch_size=a.batch, streams=1)]
        changed = [(s, x, y) for s, x, y in zip(lines, alone, together) if x != y]
        print(f"{variant}: {len(changed)} of {len(lines)} translations differ alone and in batches of {a.batch}")
        for s, x, y in changed[:3]:
            print(f"  {s!r}: alone {x!r}, in a batch {y!r}")


if __name__ == "__main__":
    main()
