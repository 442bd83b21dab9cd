"""What the guard retry (toolkit.deploy.translate.retried) gains on the robustness sets: BLEU and chrF with and
without it, and the lines a guard still cuts. docs/confidence.md gives the figures.

    python docs/measurements/guard-retry/measure.py [--model exported/transformer] [--beam 1 --beam 4] [--threads 1]
        [--json OUT]

The sets are `tk evaluate --robustness`'s (toolkit.deploy.robustness.build_sets over the test split, seed 0), translated
as it translates them (tk translate's path, input handling and guards on). "Without" replaces retried with one that
keeps every cut; each set is translated that way first, and its lines a guard cut are translated again with the retry:
the retry touches no other sentence (a sentence's translation does not depend on its batch), so the other lines'
translations are the same either way.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from toolkit.core import data  # noqa: E402
from toolkit.core.batching import DecodeOptions  # noqa: E402
from toolkit.core.textprep import TextOptions  # noqa: E402
from toolkit.deploy import robustness, translate  # noqa: E402


def run(model, backend, sources: list[str], opts, retry: bool) -> tuple[list[str], list[int]]:
    """Each source's best translation, and the (1-based) lines a guard cut."""
    real = translate.retried
    if not retry:
        translate.retried = lambda backend, ids, results, opts: results
    guarded: list[int] = []
    try:
        out = [n[0].text for n in translate.translate_batch(model, sources, opts, backend, text=TextOptions(), guarded=guarded)]
    finally:
        translate.retried = real
    return out, sorted(guarded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=REPO / "exported" / "transformer")
    parser.add_argument("--beam", type=int, action="append")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model = translate.open_model(args.model, "cpu", "fp32", threads=args.threads)
    backend = model.backend()
    corpus = data.load_corpus(None, download=False)
    english, refs = data.references(corpus.splits["test"])
    words = {w.strip(".,!?;:\"'") for en, fr in corpus.splits["train"] for w in f"{en} {fr}".split()}
    sets = robustness.build_sets(english, refs, words, 0)
    out: dict = {"model": args.model.name, "sets": {}}
    for beam in args.beam or [1, 4]:
        opts = DecodeOptions.for_manifest(model.manifest, model.provider, beam=beam)
        for s in sets:
            start = time.perf_counter()
            before, cut = run(model, backend, s.sources, opts, retry=False)
            after = list(before)
            still: list[int] = []
            if cut:
                again, left = run(model, backend, [s.sources[n - 1] for n in cut], opts, retry=True)
                for n, text in zip(cut, again):
                    after[n - 1] = text
                still = [cut[k - 1] for k in left]
            row = {"lines": len(s.sources), "cut_before": len(cut), "cut_after": len(still),
                   "before": robustness.score_set(s, before), "after": robustness.score_set(s, after),
                   "changed": [{"source": s.sources[n - 1], "before": before[n - 1], "after": after[n - 1]} for n in cut],
                   "seconds": round(time.perf_counter() - start, 1)}
            out["sets"][f"{s.name} beam{beam}"] = row
            print(s.name, beam, json.dumps({k: v for k, v in row.items() if k != "changed"}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
