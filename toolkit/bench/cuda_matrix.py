"""Every GPU measurement in one run, for a machine that is lent for minutes: verify (fp32 and fp16) for each
shipped model and the attention modules, translation of Tatoeba Challenge sentences on the GPU against the
CPU (identical fraction, BLEU), greedy token ids against PyTorch on the same GPU, `tk bench` on the GPU with
PyTorch on the GPU beside it, device memory per backend, ONNX Runtime's profile of host-device copies per
decode step, and `tk serve` under concurrent clients. Writes OUT/results.json and OUT/table.md (the README's
runtime-matrix rows); the verify records go into each model's manifest.json beside the CPU ones.

    python -m toolkit.bench.cuda_matrix OUT [--provider cuda] [--sentences 2000] [--bench-sentences 256]

`--provider cpu` runs the same matrix on the CPU: how the script itself is tested on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from toolkit.core import architectures
from toolkit.core.engines import PROVIDERS
from toolkit.core.errors import ToolkitError
from toolkit.core.shipped import DEFAULT

REPO = Path(__file__).resolve().parents[2]
EXPORTED = REPO / "exported"
SHIPPED = tuple(architectures.shipped("default") + architectures.shipped("example"))
MODULES = tuple(a.name for a in architectures.ARCHITECTURES.values() if a.kind == architectures.MODULE and not a.shipped)
PARTS = ("verify", "translation", "token_parity", "bench", "memory", "copy_profile", "serve")


def precisions(provider: str) -> list[str]:
    """fp32 everywhere; fp16 is the GPU's variant (on CPU, ONNX Runtime runs it through casts, slowly)."""
    return ["fp32", "fp16"] if provider == "cuda" else ["fp32"]


def run_verify(provider: str, sentences: int, echo, exported: Path = EXPORTED) -> dict:
    from toolkit.pytorch.export import ExportOptions, export
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


CHALLENGE = "tatoeba-test-eng-fra.txt"


def challenge_path(given: Path | None = None) -> Path:
    """The Tatoeba Challenge test set: given, else beside the corpus named by $TK_DATA, else ../shared/data."""
    candidates = [given] if given else [*([Path(os.environ["TK_DATA"]).parent / CHALLENGE] if os.environ.get("TK_DATA") else []),
                                        REPO.parent / "shared" / "data" / CHALLENGE]
    for path in candidates:
        if path.is_file():
            return path
    raise ToolkitError(f"no Tatoeba Challenge test set at {', '.join(map(str, candidates))}; pass --challenge PATH")


def challenge_english(sentences: int, given: Path | None = None) -> tuple[list[str], list[list[str]]]:
    from toolkit.core.data import read_challenge_test

    pairs = read_challenge_test(challenge_path(given))[:sentences]
    return [en for en, _ in pairs], [[fr] for _, fr in pairs]


def run_translation(provider: str, sentences: int, echo, exported: Path = EXPORTED, challenge: Path | None = None) -> dict:
    from toolkit.core.scoring import bleu_chrf
    from toolkit.deploy.api import Translator

    english, refs = challenge_english(sentences, challenge)
    model = exported / DEFAULT
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


def source_ids(m, english: list[str]) -> list[list[int]]:
    """The model's token ids of each sentence, cut at its longest source, as every command feeds them."""
    from toolkit.core.tokenizers import open_tokenizer

    return [ids[: m.max_len] for ids in open_tokenizer(m).encode(english)]


def run_token_parity(provider: str, sentences: int, echo, exported: Path = EXPORTED, challenge: Path | None = None) -> dict:
    """Greedy token ids of each variant on the provider, through the one decoding loop, against PyTorch on the
    same device and on the CPU and against ONNX Runtime fp32 on the CPU: the fraction of identical sentences."""
    import torch

    from toolkit.core import manifest as manifest_mod
    from toolkit.core.batching import DecodeOptions, decode_ids
    from toolkit.pytorch.reference import load_reference
    from toolkit.pytorch.torch_backend import TorchBackend
    from toolkit.runtimes.onnxruntime.loading import load_sessions

    m = manifest_mod.load(exported / DEFAULT)
    _, _, model, _ = load_reference(m)
    specs = m.specs()
    english, _ = challenge_english(sentences, challenge)
    src = source_ids(m, english)
    opts = DecodeOptions.bare(beam=1, batch_size=64, max_len=m.max_len)
    ids = lambda backend: [h[0].tokens for h in decode_ids(backend, src, opts)]
    refs = {"pytorch cpu": ids(TorchBackend(model, specs["encoder"], specs["decoder"])),
            "onnxruntime cpu fp32": ids(load_sessions(m, "cpu", "fp32").backend())}
    if provider != "cpu" and torch.cuda.is_available():
        refs[f"pytorch {provider}"] = ids(TorchBackend(model, specs["encoder"], specs["decoder"], device=provider))
    out: dict = {"sentences": len(src), "search": "greedy, batch 64"}
    for variant in precisions(provider):
        got = ids(load_sessions(m, provider, variant).backend())
        out[f"onnxruntime {provider} {variant}"] = {f"identical_to_{k.replace(' ', '_')}": round(sum(a == b for a, b in zip(got, r)) / len(r), 4)
                                                   for k, r in refs.items()}
        echo(f"token parity {provider} {variant}: " + ", ".join(f"{v:.1%} {k}" for k, v in out[f"onnxruntime {provider} {variant}"].items()))
    return out


MEMORY_PROBE = """
import json, os, subprocess, sys
from pathlib import Path
from toolkit.bench.cuda_matrix import probe_backend
backend, batch = probe_backend(Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]))
row = {"torch_max_allocated_mib": None}
if sys.argv[2] == "pytorch":
    import torch
    row["torch_max_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    row["torch_reserved_mib"] = round(torch.cuda.memory_reserved() / 2**20, 1)
q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], capture_output=True, text=True)
mine = [int(u) for p, u in (l.split(",") for l in q.stdout.splitlines() if "," in l) if int(p) == os.getpid()]
total = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True)
row["process_mib"] = mine[0] if mine else None
row["device_used_mib"] = int(total.stdout.split()[0]) if total.returncode == 0 else None
print("MEMORY " + json.dumps(row))
"""


def probe_backend(model_dir: Path, engine: str, variant: str, batch: int):
    """Loads one backend and runs one greedy pass over `batch` held-out sentences at that batch size (the memory probe)."""
    from toolkit.core import manifest as manifest_mod
    from toolkit.core.batching import DecodeOptions, decode_ids
    from toolkit.pytorch.reference import load_reference
    from toolkit.pytorch.torch_backend import TorchBackend
    from toolkit.runtimes.onnxruntime.loading import load_sessions
    from toolkit.verify.checks import held_out_sentences

    m = manifest_mod.load(model_dir)
    if engine == "pytorch":
        _, _, model, _ = load_reference(m)
        backend = TorchBackend(model, m.specs()["encoder"], m.specs()["decoder"], device="cuda")
    else:
        backend = load_sessions(m, "cuda", variant).backend()
    english, _ = held_out_sentences(batch)
    src = source_ids(m, english)
    decode_ids(backend, src, DecodeOptions.bare(beam=1, batch_size=batch, max_len=m.max_len))
    return backend, batch


def run_memory(provider: str, echo, exported: Path = EXPORTED, batch: int = 64) -> dict:
    """Device memory of each backend alone, in a process of its own (one process's allocators would mix),
    after one greedy pass at `batch`: the CUDA context and every arena or cache the backend keeps."""
    if provider != "cuda":
        return {"skipped": "device memory is measured on cuda only"}
    out = {}
    for engine, variant in [("pytorch", "fp32"), *[("onnxruntime", v) for v in precisions(provider)]]:
        run = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(exported / DEFAULT), engine, variant, str(batch)],
                             capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        line = next((ln for ln in run.stdout.splitlines() if ln.startswith("MEMORY ")), None)
        out[f"{engine} {variant}"] = json.loads(line[7:]) if line else {"error": (run.stderr.strip().splitlines() or ["no output"])[-1]}
        echo(f"memory {engine} {variant} at batch {batch}: {out[f'{engine} {variant}']}")
    return out


def run_copy_profile(provider: str, echo, exported: Path = EXPORTED, sentences: int = 64) -> dict:
    """ONNX Runtime's own profile of the decoder during a greedy decode, with I/O binding (the default on CUDA)
    and without: copy nodes (Memcpy*) per decoder run and the time of a run. With binding the cache never
    leaves the device: only the token goes in and the log-probabilities come out each step."""
    from toolkit.core import manifest as manifest_mod
    from toolkit.core.batching import DecodeOptions, decode_ids
    from toolkit.graphs.variants import graph_source
    from toolkit.runtimes.onnxruntime.backend import OrtBackend
    from toolkit.runtimes.onnxruntime.sessions import create_session
    from toolkit.verify.checks import held_out_sentences

    m = manifest_mod.load(exported / DEFAULT)
    specs = m.specs()
    english, _ = held_out_sentences(sentences)
    src = source_ids(m, english)
    out = {}
    with tempfile.TemporaryDirectory(prefix="tk-profile-") as tmp:
        for variant in precisions(provider):
            for binding in (True, False):
                def configure(options, prefix=f"{tmp}/{variant}-{binding}"):
                    options.enable_profiling = True
                    options.profile_file_prefix = prefix
                encoder = create_session(graph_source(m, "encoder", variant)[0], provider)
                decoder = create_session(graph_source(m, "decoder", variant)[0], provider, configure=configure)
                backend = OrtBackend(encoder, decoder, specs["encoder"], specs["decoder"], io_binding=binding)
                decode_ids(backend, src, DecodeOptions.bare(beam=1, batch_size=sentences, max_len=m.max_len))
                events = json.loads(Path(decoder.end_profiling()).read_text())
                runs = [e for e in events if e.get("name") == "model_run"]
                copies: dict[str, int] = {}
                for e in events:
                    op = e.get("args", {}).get("op_name", "")
                    if e.get("cat") == "Node" and op.startswith("Memcpy") and e.get("name", "").endswith("kernel_time"):
                        copies[op] = copies.get(op, 0) + 1
                key = f"{variant} io_binding={'on' if binding else 'off'}"
                out[key] = {"decoder_runs": len(runs), "memcpy_nodes_per_run": {k: round(v / max(len(runs), 1), 2) for k, v in copies.items()},
                            "mean_run_us": round(sum(e.get("dur", 0) for e in runs) / max(len(runs), 1), 1)}
                echo(f"profile {provider} {key}: {out[key]}")
    return out


def run_serve(provider: str, sentences: int, echo, exported: Path = EXPORTED, challenge: Path | None = None,
              clients: int = 32) -> list[dict] | dict:
    """`tk serve --provider` under `clients` concurrent single-sentence clients, dynamic batching on and off."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        return {"skipped": f"tk serve needs the serve extra (fastapi, uvicorn): {e}"}
    from toolkit.bench.serve_load import bench_serve

    english, _ = challenge_english(sentences, challenge)
    results = bench_serve(exported / DEFAULT, english, clients, 1, ["--provider", provider], echo=echo)
    rows = [{**r.__dict__, "throughput": round(r.throughput, 1)} for r in results]
    for r in rows:
        echo(f"serve {provider} {r['mode']}: {r['throughput']} sentences/s, p99 {r['p99_ms']:.1f} ms, mean batch {r['mean_batch']:.1f}")
    return rows


def run_bench(provider: str, sentences: int, echo, exported: Path = EXPORTED) -> list[dict]:
    from toolkit.bench.backends import bench

    results = bench(exported / DEFAULT, sentences, (1, 64, 256), (1, 4), providers=(provider,), textbook=False,
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
    for name, v in results.get("verify", {}).items():
        if not isinstance(v, dict) or "checks" not in v:
            continue
        worst = ", ".join(f"{k} {x:.1e}" for k, x in v["worst_max_abs"].items() if k.startswith(("sweep", "decode")))
        lines.append(f"| verify {name} | {'pass' if v['passed'] else 'FAIL'} {v['checks'] - v['failures']}/{v['checks']}; {worst} |")
    tr = results.get("translation", {})
    for key, v in tr.items():
        if isinstance(v, dict) and "bleu" in v:
            extra = f", {v['identical_to_cpu_fp32']:.1%} identical to CPU fp32, {v['sentences_per_s']} sentences/s" if "seconds" in v else ""
            lines.append(f"| translate {tr['sentences']} Tatoeba Challenge sentences, {key} | BLEU {v['bleu']}{extra} |")
    parity = results.get("token_parity", {})
    for key, v in parity.items():
        if isinstance(v, dict) and "sentences" in parity:
            same = ", ".join(f"{x:.1%} vs {k.removeprefix('identical_to_').replace('_', ' ')}" for k, x in v.items())
            lines.append(f"| greedy token ids, {parity['sentences']} sentences, {key} | identical: {same} |")
    for key, v in results.get("memory", {}).items():
        if isinstance(v, dict) and v.get("process_mib") is not None:
            lines.append(f"| device memory, {key}, greedy batch 64 | {v['process_mib']} MiB in the process (CUDA context included) |")
    for key, v in results.get("copy_profile", {}).items():
        if not isinstance(v, dict) or "memcpy_nodes_per_run" not in v:
            continue
        copies = ", ".join(f"{k} {n}" for k, n in v["memcpy_nodes_per_run"].items()) or "none"
        lines.append(f"| decoder profile, {key} | copy nodes per step: {copies}; {v['mean_run_us']} us per step |")
    serve = results.get("serve")
    if isinstance(serve, list):
        for r in serve:
            lines.append(f"| tk serve, {r['clients']} clients, {r['mode']} | {r['throughput']} sentences/s, p50 {r['p50_ms']:.1f} ms, "
                         f"p99 {r['p99_ms']:.1f} ms, mean batch {r['mean_batch']:.1f} |")
    from toolkit.bench.backends import row_provider, torch_row

    lines += ["", "| backend | search | batch | sentences/s | vs PyTorch cached, same device |", "|---|---|---|---|---|"]
    bench = results.get("bench") if isinstance(results.get("bench"), list) else []
    base = {(r["backend"], r["search"], r["batch"]): r["sentences_per_s"] for r in bench if r["backend"].startswith("pytorch cached")}
    for r in bench:
        ref = base.get((torch_row(row_provider(r["backend"])), r["search"], r["batch"]))
        ratio = f"{r['sentences_per_s'] / ref:.2f}x" if ref else "n/a"
        lines.append(f"| {r['backend']} | {r['search']} | {r['batch']} | {r['sentences_per_s']} | {ratio} |")
    return "\n".join(lines) + "\n"


def positive(text: str) -> int:
    """A count of at least 1 (argparse names the option and exits 2 otherwise)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.bench.cuda_matrix", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for results.json and table.md")
    parser.add_argument("--provider", choices=PROVIDERS, default="cuda")
    parser.add_argument("--sentences", type=positive, default=2000, help="Tatoeba Challenge sentences to translate")
    parser.add_argument("--bench-sentences", type=positive, default=256)
    parser.add_argument("--verify-sentences", type=positive, default=16)
    parser.add_argument("--exported", type=Path, default=EXPORTED, help="the shipped models (their manifests get the verify records)")
    parser.add_argument("--challenge", type=Path, default=None, help=f"the Tatoeba Challenge test set [default: {CHALLENGE} beside $TK_DATA, "
                        "else ../shared/data]")
    parser.add_argument("--serve-sentences", type=positive, default=1024)
    parser.add_argument("--only", default=None, help="comma-separated parts to run [default: all]: " + ", ".join(PARTS))
    args = parser.parse_args(argv)
    from toolkit.runtimes.onnxruntime.cuda import cuda_fix, gpu_environment
    from toolkit.runtimes.onnxruntime.sessions import cuda_available
    from toolkit.verify.report import environment

    if args.provider == "cuda" and not cuda_available():
        print(f"error: {cuda_fix()}")
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    echo = lambda m: print(m, flush=True)
    results: dict = {"date": datetime.date.today().isoformat(), "provider": args.provider,
                     "environment": {**environment([args.provider]), **(gpu_environment() if args.provider == "cuda" else {})}}
    # Each part is written as soon as it is done: a machine taken back mid-run still leaves what was measured.
    parts = {"verify": lambda: run_verify(args.provider, args.verify_sentences, echo, args.exported),
             "translation": lambda: run_translation(args.provider, args.sentences, echo, args.exported, args.challenge),
             "token_parity": lambda: run_token_parity(args.provider, args.sentences, echo, args.exported, args.challenge),
             "bench": lambda: run_bench(args.provider, args.bench_sentences, echo, args.exported),
             "memory": lambda: run_memory(args.provider, echo, args.exported),
             "copy_profile": lambda: run_copy_profile(args.provider, echo, args.exported),
             "serve": lambda: run_serve(args.provider, args.serve_sentences, echo, args.exported, args.challenge)}
    wanted = args.only.split(",") if args.only else list(PARTS)
    if set(wanted) - set(PARTS):
        print(f"error: --only {args.only}: choose from {', '.join(PARTS)}")
        return 2
    previous = args.out / "results.json"
    if args.only and previous.is_file():  # a part re-run keeps the others measured before
        results = {**json.loads(previous.read_text(encoding="utf-8")), **results}
    for part in wanted:
        start = time.perf_counter()
        try:
            results[part] = parts[part]()
        except Exception as e:  # one part that breaks on a GPU must not cost the others' measurements
            results[part] = {"error": f"{type(e).__name__}: {e}"}
            echo(f"{part} failed: {type(e).__name__}: {e}")
        echo(f"[{part}: {time.perf_counter() - start:.0f}s]")
        (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    if any(isinstance(results.get(p), (dict, list)) for p in PARTS):
        (args.out / "table.md").write_text(table(results), encoding="utf-8")
        print(table(results))
    return 0 if all(v.get("passed") for v in results.get("verify", {}).values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
