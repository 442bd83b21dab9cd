"""How `tk translate --runtime ctranslate2` compares with tk on ONNX Runtime: the first N Tatoeba Challenge sentences,
greedy, line by line, through tk's Python API with its defaults (text handling and guards on) and with raw=True (the
model alone), and token by token at the decoding level.

    python docs/measurements/ct2_runtime.py [--sentences 2000] [--model exported/transformer] [--json OUT]

Needs the ct2 extra and ../shared/data/tatoeba-test-eng-fra.txt (or --challenge FILE). It stores the CTranslate2 model
in a temporary copy of the model directory (`tk export COPY --ctranslate2`), so the directory itself is left as it is.
Each line that differs is checked at the token level: the step where the two parted, and ONNX Runtime's own margin
between the two tokens there (a near-tie: under 1e-3).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--model", type=Path, default=REPO / "exported" / "transformer")
    parser.add_argument("--challenge", type=Path, default=REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from toolkit import Translator, runtimes
    from toolkit.core import manifest
    from toolkit.core.batching import decode_ids
    from toolkit.core.decode_options import DecodeOptions
    from toolkit.core.tokenizers import open_tokenizer
    from toolkit.verify.checks import prefix_log_probs

    lines = [x.split("\t")[2] for x in args.challenge.read_text(encoding="utf-8").splitlines()[: args.sentences]]
    with tempfile.TemporaryDirectory(prefix="tk-ct2-measure-") as work:
        model = Path(work) / "model"
        shutil.copytree(args.model, model)
        subprocess.run([sys.executable, "-m", "toolkit.cli", "export", str(model), "--ctranslate2"], check=True,
                       capture_output=True)
        report = {"sentences": len(lines)}
        for name, options in (("defaults", {}), ("raw", {"raw": True})):
            onnx = Translator(model, provider="cpu", variant="fp32").translate(lines, **options)
            ct2 = Translator(model, provider="cpu", runtime="ctranslate2").translate(lines, **options)
            report[name] = {"identical": sum(a == b for a, b in zip(onnx, ct2)),
                            "differ": [(i, a, b) for i, (a, b) in enumerate(zip(onnx, ct2)) if a != b]}
        m = manifest.load(model)
        src = [s[: m.max_len] for s in open_tokenizer(m).encode(lines)]
        opts = DecodeOptions.bare(max_len=m.max_output_len, rules=m.rules())
        onnx_backend = runtimes.load(m, "onnxruntime", "cpu", "fp32").backend()
        onnx = [h[0] for h in decode_ids(onnx_backend, src, opts)]
        ct2 = [h[0] for h in decode_ids(runtimes.load(m, "ctranslate2", "cpu", "fp32").backend(), src, opts)]
        parted = []
        for i, (a, b) in enumerate(zip(onnx, ct2)):
            if a.tokens != b.tokens:
                step = next(k for k, (x, y) in enumerate(zip(a.tokens + [-1], b.tokens + [-1])) if x != y)
                lp = prefix_log_probs(onnx_backend, src[i], a.tokens[:step], m.rules())
                x, y = (t[step] if step < len(t) else m.rules().end for t in (a.tokens, b.tokens))
                parted.append({"sentence": i, "step": step, "onnx_margin": float(lp[x] - lp[y])})
        report["tokens"] = {"identical": len(src) - len(parted), "parted": parted,
                            "max_score_difference": max(abs(a.score - b.score) for a, b in zip(onnx, ct2) if a.tokens == b.tokens)}
    print(f"{len(lines)} sentences: tk defaults {report['defaults']['identical']} identical lines, raw "
          f"{report['raw']['identical']}, greedy tokens {report['tokens']['identical']} identical "
          f"(largest score difference where identical {report['tokens']['max_score_difference']:.2e})")
    for p in parted:
        print(f"  sentence {p['sentence']}: parted at step {p['step']}, ONNX Runtime margin {p['onnx_margin']:.2e}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
