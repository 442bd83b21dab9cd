"""Every GPU measurement in one run, for a machine that is lent for minutes: verify (fp32 and fp16) for each
shipped model and the attention modules, translation of Tatoeba Challenge sentences on the GPU against the
CPU (identical fraction, BLEU), and `tk bench` on the GPU. Writes OUT/results.json and OUT/table.md (the
README's runtime-matrix rows); the verify records go into each model's manifest.json beside the CPU ones.

    python -m toolkit.build.cuda_matrix OUT [--provider cuda] [--sentences 2000] [--bench-sentences 256]

`--provider cpu` runs the same matrix on the CPU: how the script itself is tested on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from pathlib import Path

from toolkit.core.errors import ToolkitError

REPO = Path(__file__).resolve().parents[2]
EXPORTED = REPO / "exported"
SHIPPED = ("transformer", "seq2seq", "nw")
MODULES = ("masked_softmax", "dot_attention", "additive_attention", "multihead_attention")


def precisions(provider: str) -> list[str]:
    """fp32 everywhere; fp16 is the GPU's variant (on CPU, ONNX Runtime runs it through casts, slowly)."""
    return ["fp32", "fp16"] if provider == "cuda" else ["fp32"]


def run_verify(provider: str, sentences: int, echo, exported: Path = EXPORTED) -> dict:
    from toolkit.build.export import ExportOptions, export
    from toolkit.verify.record import record_summary
    from toolkit.verify.run import verify

    out = {}
    with tempfile.TemporaryDirectory(prefix="tk-modules-") as tmp:
        targets = [(name, exported / name, True) for name in SHIPPED]
        targets += [(name, export(ExportOptions(out=Path(tmp) / name, model=name, random_init=True), echo=lambda m: None), False)
                    for name in MODULES]
        for name, directory, shipped in targets:
            start = time.perf_counter()
            report = verify(directory, provider, precisions(provider), sentences=sentences, echo=lambda m: None)
            seconds = time.perf_counter() - start
            if shipped:
                record_summary(report, directory, seconds)
            worst: dict[str, float] = {}
            for r in report.rows:
                if r.check != "static" and r.max_abs == r.max_abs:  # NaN-free
                    key = f"{r.check}/{r.variant}"
                    worst[key] = max(worst.get(key, 0.0), float(r.max_abs))
            out[name] = {"passed": not report.failures, "checks": len(report.rows), "failures": len(report.failures),
                         "seconds": round(seconds, 1), "worst_max_abs": worst,
                         "first_failure": None if not report.failures else
                         f"{report.failures[0].check} {report.failures[0].graph}/{report.failures[0].output} "
                         f"[{report.failures[0].variant}] {report.failures[0].detail}"}
            echo(f"verify {name} on {provider}: {len(report.rows) - len(report.failures)}/{len(report.rows)} passed in {seconds:.1f}s")
    return out


def run_translation(provider: str, sentences: int, echo, exported: Path = EXPORTED) -> dict:
    from toolkit.core.data import read_challenge_test
    from toolkit.core.scoring import bleu_chrf
    from toolkit.deploy.api import Translator

    pairs = read_challenge_test(REPO.parent / "shared" / "data" / "tatoeba-test-eng-fra.txt")[:sentences]
    english, refs = [en for en, _ in pairs], [[fr] for _, fr in pairs]
    model = exported / "transformer"
    cpu = Translator(model, "cpu").translate(english)
    out = {"sentences": len(english), "cpu fp32": {"bleu": round(bleu_chrf(cpu, refs)["bleu"], 2)}}
    for variant in precisions(provider):
        t = Translator(model, provider, variant)
        start = time.perf_counter()
        got = t.translate(english)
        seconds = time.perf_counter() - start
        same = sum(a == b for a, b in zip(got, cpu)) / len(cpu)
        out[f"{provider} {variant}"] = {"bleu": round(bleu_chrf(got, refs)["bleu"], 2), "identical_to_cpu_fp32": round(same, 4),
                                        "seconds": round(seconds, 2), "sentences_per_s": round(len(got) / seconds, 1)}
        echo(f"translate {provider} {variant}: BLEU {out[f'{provider} {variant}']['bleu']}, {same:.1%} identical to CPU fp32")
    return out


def run_bench(provider: str, sentences: int, echo, exported: Path = EXPORTED) -> list[dict]:
    from toolkit.build.bench import bench

    results = bench(exported / "transformer", sentences, (1, 64, 256), (1, 4), providers=(provider,), textbook=False,
                    variants=precisions(provider), echo=echo, ct2=False)
    return [{k: v for k, v in r.__dict__.items() if k != "outputs"} | {"sentences_per_s": round(r.sentences / r.seconds, 1)}
            for r in results]


def table(results: dict) -> str:
    """The README's rows: verify verdicts, translation quality and speed, and bench against PyTorch on the same device."""
    env = results["environment"]
    lines = [f"Measured {results['date']} on {env.get('gpu', results['provider'])}"
             + (f" (driver {env['gpu_driver']}, CUDA runtime {env.get('cuda_runtime', '?')})" if "gpu_driver" in env else "")
             + f", onnxruntime {env.get('onnxruntime', '?')}.", "",
             "| check | result |", "|---|---|"]
    for name, v in results["verify"].items():
        worst = ", ".join(f"{k} {x:.1e}" for k, x in v["worst_max_abs"].items() if k.startswith(("sweep", "decode")))
        lines.append(f"| verify {name} | {'pass' if v['passed'] else 'FAIL'} {v['checks'] - v['failures']}/{v['checks']}; {worst} |")
    tr = results["translation"]
    for key, v in tr.items():
        if isinstance(v, dict):
            extra = f", {v['identical_to_cpu_fp32']:.1%} identical to CPU fp32, {v['sentences_per_s']} sentences/s" if "seconds" in v else ""
            lines.append(f"| translate {tr['sentences']} Tatoeba Challenge sentences, {key} | BLEU {v['bleu']}{extra} |")
    lines += ["", "| backend | search | batch | sentences/s | vs PyTorch cached |", "|---|---|---|---|---|"]
    base = {(r["search"], r["batch"]): r["sentences_per_s"] for r in results["bench"] if r["backend"] == "pytorch cached"}
    for r in results["bench"]:
        ratio = r["sentences_per_s"] / base[(r["search"], r["batch"])] if (r["search"], r["batch"]) in base else float("nan")
        lines.append(f"| {r['backend']} | {r['search']} | {r['batch']} | {r['sentences_per_s']} | {ratio:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.build.cuda_matrix", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for results.json and table.md")
    parser.add_argument("--provider", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--sentences", type=int, default=2000, help="Tatoeba Challenge sentences to translate")
    parser.add_argument("--bench-sentences", type=int, default=256)
    parser.add_argument("--verify-sentences", type=int, default=16)
    parser.add_argument("--exported", type=Path, default=EXPORTED, help="the shipped models (their manifests get the verify records)")
    args = parser.parse_args(argv)
    from toolkit.runtimes.onnxruntime import cuda_available, cuda_fix, gpu_environment
    from toolkit.verify.run import environment

    if args.provider == "cuda" and not cuda_available():
        print(f"error: {cuda_fix()}")
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    echo = lambda m: print(m, flush=True)
    results: dict = {"date": datetime.date.today().isoformat(), "provider": args.provider,
                     "environment": {**environment([args.provider]), **(gpu_environment() if args.provider == "cuda" else {})}}
    # Each part is written as soon as it is done: a machine taken back mid-run still leaves what was measured.
    for part, run in (("verify", lambda: run_verify(args.provider, args.verify_sentences, echo, args.exported)),
                      ("translation", lambda: run_translation(args.provider, args.sentences, echo, args.exported)),
                      ("bench", lambda: run_bench(args.provider, args.bench_sentences, echo, args.exported))):
        try:
            results[part] = run()
        except ToolkitError as e:
            results[part] = {"error": str(e)}
            echo(f"{part} failed: {e}")
        (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    if all(isinstance(results.get(p), (dict, list)) and "error" not in results[p] for p in ("verify", "translation", "bench")):
        (args.out / "table.md").write_text(table(results), encoding="utf-8")
        print(table(results))
    return 0 if all(v.get("passed") for v in results.get("verify", {}).values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
