"""How many of the first N Tatoeba Challenge sentences transformers translates, greedy, exactly as tk does, once
`tk export exported/transformer --to-hf DIR` has written the model as a MarianMTModel directory.

    python docs/measurements/to_hf_parity.py [--sentences 2000] [--model exported/transformer] [--json OUT]

Needs the hf extra (transformers, torch) and ../shared/data/tatoeba-test-eng-fra.txt (or --challenge FILE). It writes
the directory to a temporary folder with the command itself, translates the English column with
AutoTokenizer(DIR) + MarianMTModel.generate (greedy, the directory's generation config, batches of 64 in input order,
truncation=True, --threads torch threads), and compares the text, line by line, with three runs of
`tk translate -i FILE` on the same file:

- `--raw --max-len-a 100 --no-loop-guard`: the model alone (no text handling, no guard: what generate does);
- `--raw`: the model with tk's length and loop guards;
- defaults: what `tk translate` prints (sentence splitting, capitals folding, placeholders, guards).

Each line that differs is put down to what tk did to it: text handling (textprep.prepare changes it), a guard (the raw
run with guards differs from the one without), or neither (a near-tie broken the other way by PyTorch's and ONNX
Runtime's rounding). Then beam 4 on the first --beam-sentences: `tk translate --raw --beam 4` without guards against
generate(num_beams=4) with length_penalty 0.6 and 1.0 (the rules differ; docs/models.md#out-to-hugging-face).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNS = {"raw, no guards": ["--raw", "--max-len-a", "100", "--no-loop-guard"], "raw": ["--raw"], "defaults": []}


def tk(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "toolkit.cli", *args], check=True, cwd=REPO)


def generate(hf: Path, english: list[str], batch: int = 64, **options) -> list[str]:
    import torch
    from transformers import AutoTokenizer, MarianMTModel

    tokenizer = AutoTokenizer.from_pretrained(hf)
    model = MarianMTModel.from_pretrained(hf).eval()
    out: list[str] = []
    with torch.inference_mode():
        for i in range(0, len(english), batch):
            inputs = tokenizer(english[i : i + batch], return_tensors="pt", padding=True, truncation=True)
            out += tokenizer.batch_decode(model.generate(**inputs, **options), skip_special_tokens=True)
    return out


def random_texts(n: int, seed: int = 0) -> list[str]:
    """Strings of vocabulary pieces (spaces for their "▁"), whitespace, control and format characters, emoji, "<" and
    the placeholder symbols: what a converted tokenizer gets wrong first."""
    import random

    from toolkit.core.tokenizer import Tokenizer

    tk = Tokenizer.load(REPO / "exported" / "transformer" / "tokenizer.model")
    pieces = [tk.sp.id_to_piece(i).replace("▁", " ") for i in range(tk.vocab_size)]
    chars = [*"abc XYZ éàü€ ▁⦅⦆0123456789<>/\t\n\u00a0\u3000\u200b\ufeff🙂中文", "⦅0⦆", "</s>", "<unk>", "<0x41>"]
    rng = random.Random(seed)
    return ["".join(rng.choice(chars) if rng.random() < 0.5 else rng.choice(pieces) for _ in range(rng.randint(0, 8)))
            for _ in range(n)]


def tokenizer_parity(hf: Path, model: str, english: list[str], french: list[str], fuzz: int) -> dict:
    """AutoTokenizer(DIR) against tk's tokenizer: ids of the English sentences and of `fuzz` random strings, and the
    decoding of tk's ids of the French sentences."""
    from transformers import AutoTokenizer

    from toolkit.core.tokenizer import Tokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf)
    tk = Tokenizer.load(REPO / model / "tokenizer.model")
    same = lambda texts: sum(a == b for a, b in zip(tokenizer(texts)["input_ids"], tk.encode(texts)))  # noqa: E731
    ids = tk.encode(french)
    return {"english_ids": same(english), "french_decoded": sum(a == b for a, b in zip(tokenizer.batch_decode(ids, skip_special_tokens=True),
                                                                                      tk.decode(ids))),
            "random_strings_ids": same(random_texts(fuzz)), "random_strings": fuzz}


def why(run: str, line: str, raw: str, raw_unguarded: str) -> str:
    """What tk did to a line that `run` translated otherwise than generate."""
    from toolkit.core import textprep

    if run == "defaults":
        segments = textprep.prepare(line)
        kinds = [k for k, on in (("split into sentences", len(segments) > 1), ("placeholders", any(s.spans for s in segments)),
                                 ("capitals folded", any(s.case for s in segments))) if on]
        if kinds or [s.text for s in segments] != [line]:
            return "text handling (" + (", ".join(kinds) or "cleaned") + ")"
    if run != "raw, no guards" and raw != raw_unguarded:
        return "a guard"
    return "neither (rounding at a near-tie)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="exported/transformer")
    ap.add_argument("--sentences", type=int, default=2000)
    ap.add_argument("--challenge", type=Path, default=REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt")
    ap.add_argument("--json", type=Path, help="Also write the figures and every differing line as JSON.")
    ap.add_argument("--beam-sentences", type=int, default=500, help="Also compare beam 4 on the first N sentences: tk's "
                    "rule against generate(num_beams=4) with length_penalty 0.6 and 1.0 (0: skip).")
    ap.add_argument("--fuzz", type=int, default=20000, help="Random strings whose ids AutoTokenizer must give as tk does.")
    ap.add_argument("--threads", type=int, default=1, help="torch's threads for generate (on 2 busy cores, 2 threads "
                    "spinning for each other made it 10x slower).")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    rows = [line.rstrip("\n").split("\t") for line in args.challenge.open(encoding="utf-8")][: args.sentences]
    english, french = [r[2] for r in rows], [r[3] for r in rows]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "en.txt").write_text("".join(e + "\n" for e in english), encoding="utf-8")
        tk("export", args.model, "--to-hf", str(tmp / "hf"))
        tokens = tokenizer_parity(tmp / "hf", args.model, english, french, args.fuzz)
        start = time.time()
        hf = generate(tmp / "hf", english)
        hf_s = time.time() - start
        tk_out = {}
        for name, opts in RUNS.items():
            tk("translate", "--model", args.model, "-i", str(tmp / "en.txt"), "-o", str(tmp / "fr.txt"), "-q", *opts)
            tk_out[name] = (tmp / "fr.txt").read_text(encoding="utf-8").splitlines()
        beam = {}
        if args.beam_sentences:
            n = min(args.beam_sentences, len(english))
            (tmp / "en.txt").write_text("".join(e + "\n" for e in english[:n]), encoding="utf-8")
            tk("translate", "--model", args.model, "-i", str(tmp / "en.txt"), "-o", str(tmp / "fr.txt"), "-q", "--beam", "4",
               *RUNS["raw, no guards"])
            tk_beam = (tmp / "fr.txt").read_text(encoding="utf-8").splitlines()
            for penalty in (0.6, 1.0):
                got = generate(tmp / "hf", english[:n], num_beams=4, length_penalty=penalty)
                beam[f"length_penalty {penalty}"] = sum(a == b for a, b in zip(got, tk_beam))
    report = {"sentences": len(english), "generate_seconds": round(hf_s, 1), "identical": {}, "differing": {},
              "beam4_identical": beam, "beam4_sentences": min(args.beam_sentences, len(english)), "tokenizer": tokens}
    for name, lines in tk_out.items():
        differ = [i for i, (a, b) in enumerate(zip(hf, lines)) if a != b]
        report["identical"][name] = len(english) - len(differ)
        report["differing"][name] = [{"line": i + 1, "english": english[i], "generate": hf[i], "tk": lines[i],
                                      "why": why(name, english[i], tk_out["raw"][i], tk_out["raw, no guards"][i])} for i in differ]
    print(f"AutoTokenizer: ids of {tokens['english_ids']}/{len(english)} English sentences and {tokens['random_strings_ids']}/"
          f"{tokens['random_strings']} random strings are tk's; {tokens['french_decoded']}/{len(french)} French ones decode to tk's text")
    print(f"{len(english)} Tatoeba Challenge sentences, greedy; transformers' generate on the --to-hf directory "
          f"({hf_s:.1f}s) against tk translate:")
    for name in RUNS:
        reasons: dict[str, int] = {}
        for d in report["differing"][name]:
            reasons[d["why"]] = reasons.get(d["why"], 0) + 1
        print(f"  {name:<16} identical {report['identical'][name]}/{len(english)}"
              + (f"; differing: {', '.join(f'{n} {w}' for w, n in sorted(reasons.items()))}" if reasons else ""))
    for rule, same in beam.items():
        print(f"  beam 4 ({report['beam4_sentences']} sentences, tk --raw --beam 4 without guards): generate(num_beams=4, {rule}) "
              f"identical {same}/{report['beam4_sentences']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
