"""Issue 41's GPU lease, stage by stage: train the student recipe, export, verify, evaluate, decide, ship.

    python3 docs/lease41.py STAGE [options]

Stages that need the GPU (run on the lent machine, each one call of at most 10 minutes; rerun a stage to continue):
  env                     what the machine has: torch with CUDA, ONNX Runtime's providers, tk importable, the data
  train [--minutes 8]     start or resume runs/student41 (`tk train transformer --preset student ... --resume`) for at
                          most that many minutes of training; says "training: done" or what is left
  finish                  the final weights as a slim checkpoint (no optimizer), `tk export` to runs/student41/export,
                          `tk verify` on CPU and, where ONNX Runtime's CUDA provider loads, `--provider cuda` (recorded)
  pack OUT [--resume-state] [--parts A-B]
                          the export and the slim checkpoint (or the state a later lease resumes from) as parts of at
                          most 15 MiB, with their sha256, in OUT (the device tool returns 8 files of 16 MiB at most)
  unpack DIR DEST         joins the parts in DIR (sha256 checked) and extracts them under DEST

Stages that need a CPU only (any machine with the dev install; the figures that decide are CPU figures):
  evaluate                `tk evaluate` of the export: Tatoeba Challenge set and held-out split, greedy and beam 4,
                          robustness, and the unseen names (docs/names-test.tsv), each recorded in its manifest
  bench [--rounds 2]      `tk bench --text` on the first 2,000 Challenge lines, the shipped model and the student in
                          alternate turns
  decide                  the ship rule (below), condition by condition; exit 0: ship, exit 1: do not
  ship                    the export replaces exported/transformer (refused unless decide passes)

The ship rule (issue 41): the student beats the shipped Transformer on the Tatoeba Challenge set and on the held-out
split (beam 4; greedy not lower), scores at least 45.0 BLEU on the Challenge set (beam 4), has at most 10M parameters,
copies at least 9 in 10 unseen names verbatim, decodes on CPU at least as fast (every `tk bench --text` row of tk's
fp32 API), passes `tk verify` on CPU and CUDA, and keeps exported/ within its 40 MiB budget.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RUN = Path("runs/student41")
EXPORT = RUN / "export"
SLIM = RUN / "student41.pt"
SHIPPED = Path("exported/transformer")
TOKENIZER = SHIPPED / "tokenizer.model"  # the shipped 6,000-piece vocabulary, shared with the GRU
NAMES = Path("docs/names-test.tsv")
PART_BYTES = 15 * 2**20
SIZE_BUDGET = 40 * 2**20  # tests/test_shipped.py
MAX_PARAMETERS = 10_000_000
MIN_CHALLENGE_BLEU = 45.0
MIN_NAMES_SHARE = 0.9
BENCH_LINES = 2000


def data_file(name: str) -> Path | None:
    """runs/data/NAME (carried to the lent machine), else ../shared/data/NAME beside the clone."""
    for p in (Path("runs/data") / name, REPO.parent / "shared" / "data" / name):
        if p.is_file():
            return p
    return None


def tk(*args, check: bool = True) -> int:
    cmd = [sys.executable, "-m", "toolkit.cli", *map(str, args)]
    print("$ tk " + " ".join(map(str, args)), flush=True)
    done = subprocess.run(cmd, cwd=REPO)
    if check and done.returncode:
        sys.exit(f"lease41: `tk {args[0]}` failed (exit {done.returncode})")
    return done.returncode


def data_args() -> list[str]:
    corpus = data_file("fra-eng.zip")
    return ["--data", str(corpus)] if corpus else []


def challenge() -> Path:
    path = data_file("tatoeba-test-eng-fra.txt")
    if path is None:
        sys.exit("lease41: no tatoeba-test-eng-fra.txt in runs/data or ../shared/data")
    return path


# ---- sizes -----------------------------------------------------------------------------------------

def parameters(cfg: dict) -> int:
    """Parameters of tk's Transformer (models/transformer.py): the tied embedding, bias-free attention projections,
    FFNs with biases, a LayerNorm per sublayer (and one per stack when pre-LN)."""
    d, f, v = cfg["num_hiddens"], cfg["ffn_num_hiddens"], cfg["vocab_size"]
    enc, dec = cfg["num_layers"], cfg.get("decoder_layers") or cfg["num_layers"]
    ffn, norm, attention = 2 * d * f + f + d, 2 * d, 4 * d * d
    final = 2 * norm if cfg.get("pre_ln") else 0
    return v * d + enc * (attention + ffn + 2 * norm) + dec * (2 * attention + ffn + 3 * norm) + final


def weights_bytes(cfg: dict) -> int:
    """weights.bin: every parameter and the positional table (max_len x d_model), float32."""
    return 4 * (parameters(cfg) + cfg.get("max_len", 64) * cfg["num_hiddens"])


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def exported_bytes_with(model_dir: Path) -> int:
    """exported/ as it would be with `model_dir` in place of exported/transformer."""
    root = REPO / "exported"
    return tree_bytes(root) - tree_bytes(root / "transformer") + tree_bytes(model_dir)


# ---- GPU stages ------------------------------------------------------------------------------------

def stage_env(_args) -> None:
    problems = []
    try:
        import torch

        cuda = torch.cuda.is_available()
        print(f"torch {torch.__version__}, CUDA {'available: ' + torch.cuda.get_device_name(0) if cuda else 'not available'}")
        if not cuda:
            problems.append("torch sees no CUDA GPU")
    except ImportError:
        problems.append("no torch")
    try:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
        print(f"onnxruntime {onnxruntime.__version__}: {', '.join(providers)}")
        if "CUDAExecutionProvider" not in providers:
            print("  (no CUDA provider: `finish` verifies on CPU only; `tk verify --provider cuda` needs onnxruntime-gpu)")
    except ImportError:
        problems.append("no onnxruntime")
    try:
        import toolkit.models.transformer  # noqa: F401  (an install maps models/ to toolkit.models)
    except ImportError:
        # Not installed (the lent machine: nothing can be fetched there, and nothing needs to be): a link does the same.
        link = REPO / "toolkit" / "models"
        if not link.exists():
            link.symlink_to(Path("..") / "models")
            print("toolkit/models -> ../models linked (tk is not installed here)")
        importlib.invalidate_caches()
        try:
            import toolkit.models.transformer  # noqa: F401,F811
        except ImportError as e:
            problems.append(f"toolkit.models does not import ({e})")
    for name in ("fra-eng.zip", "tatoeba-test-eng-fra.txt"):
        found = data_file(name)
        print(f"{name}: {found or 'missing (copy ../shared/data/* into runs/data and carry runs/data)'}")
        if not found:
            problems.append(f"no {name}")
    if problems:
        sys.exit("lease41 env: " + "; ".join(problems))
    print("lease41 env: ready")


def progress() -> dict | None:
    """The run's checkpoint progress (epoch, epochs, step, elapsed), or None before the first checkpoint."""
    path = REPO / RUN / "checkpoint.pt"
    if not path.is_file():
        return None
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    p = ckpt["progress"]
    return {"epoch": p["epoch"], "epochs": ckpt["train"]["recipe"]["epochs"], "step": p["step"],
            "elapsed_s": round(p["elapsed"]), "finished": bool(ckpt.get("metrics")), "metrics": ckpt.get("metrics")}


def stage_train(args) -> None:
    state = progress()
    if state and state["finished"]:
        print(f"training: done ({state['epoch']} epochs, {state['elapsed_s']} s); metrics {state['metrics']}")
        return
    device = args.device
    cmd = ["train", "transformer", "--preset", "student", "--out", RUN, *data_args(), "--exclude", challenge(),
           "--tokenizer", TOKENIZER, "--device", device, "--max-minutes", args.minutes,
           *(["--epochs", args.epochs] if args.epochs else [])]
    tk(*cmd, *(["--resume"] if state else []))
    state = progress()
    if state is None:
        sys.exit(f"lease41 train: no checkpoint in {RUN} after `tk train`")
    if state["finished"]:
        print(f"training: done ({state['epoch']} epochs, {state['elapsed_s']} s of training)")
    else:
        per_epoch = state["elapsed_s"] / max(state["epoch"], 1)
        left = (state["epochs"] - state["epoch"]) * per_epoch / 60
        print(f"training: epoch {state['epoch']} of {state['epochs']} after {state['elapsed_s']} s (about {per_epoch:.0f} s "
              f"per epoch, {left:.1f} min to go); run `train` again (`--epochs N` ends it sooner)")


def write_slim(source: Path, out: Path) -> dict:
    """The finished run's checkpoint without what only training needs (optimizer, live weights, RNG): the final
    (averaged) weights with their config, tokenizer and provenance, a third of the size, for export and for the
    trip back through the device tool."""
    from toolkit.pytorch import checkpoint

    ckpt = checkpoint.load(source)
    slim = {k: v for k, v in ckpt.items() if k not in ("optimizer", "train_state_dict", "rng", "path", "format", "weights_sha256")}
    checkpoint.save(slim, out)
    return ckpt


def stage_finish(_args) -> None:
    state = progress()
    if not state or not state["finished"]:
        sys.exit("lease41 finish: training has not finished; run `train` until it says done")
    ckpt = write_slim(REPO / RUN / "checkpoint.pt", REPO / SLIM)
    print(f"{SLIM}: the final weights ({ckpt['progress'].get('final_weights')}), {parameters(ckpt['config']):,} parameters")
    tk("export", SLIM, "--out", EXPORT, "--force")
    tk("verify", EXPORT, *data_args(), "--record")
    if tk("verify", EXPORT, *data_args(), "--provider", "cuda", "--record", check=False):
        print("lease41 finish: `tk verify --provider cuda` did not pass or could not run (see above); decide will say so")
    print(f"export: {EXPORT}, {tree_bytes(REPO / EXPORT):,} bytes; exported/ with it: {exported_bytes_with(REPO / EXPORT):,} "
          f"(budget {SIZE_BUDGET:,})")


# ---- moving files through the device tool -------------------------------------------------------------

def _tar(paths: list[Path], tar_path: Path) -> None:
    """A tar of `paths` whose bytes depend on their content only (names, sizes, data), so parts made in two calls
    of the same state fit together."""
    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        return info

    tar_path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(paths):
            tar.add(p, arcname=str(p), filter=clean)


def pack(paths: list[Path], out: Path, name: str, part_bytes: int = PART_BYTES, parts: tuple[int, int] | None = None,
         work: Path | None = None) -> dict:
    """Writes NAME.partNN files of at most part_bytes (those numbered in `parts`, else all) and NAME.json (the whole
    tar's sha256 and every part's) into `out`."""
    tar_path = (work or out) / f"{name}.tar"
    if not tar_path.is_file() or parts is None or parts[0] == 0:
        _tar(paths, tar_path)
    size = tar_path.stat().st_size
    count = max(1, -(-size // part_bytes))
    index = {"name": name, "bytes": size, "sha256": hashlib.sha256(tar_path.read_bytes()).hexdigest(), "parts": []}
    out.mkdir(parents=True, exist_ok=True)
    with open(tar_path, "rb") as f:
        for i in range(count):
            chunk = f.read(part_bytes)
            index["parts"].append({"file": f"{name}.part{i:02d}", "sha256": hashlib.sha256(chunk).hexdigest()})
            if parts is None or parts[0] <= i <= parts[1]:
                (out / f"{name}.part{i:02d}").write_bytes(chunk)
    (out / f"{name}.json").write_text(json.dumps(index, indent=1) + "\n")
    if work is None:
        tar_path.unlink()
    return index


def unpack(directory: Path, dest: Path, name: str) -> list[str]:
    """Joins DIRECTORY/NAME.part* (each and the whole checked against NAME.json) and extracts the files under DEST."""
    index = json.loads((directory / f"{name}.json").read_text())
    whole = bytearray()
    for part in index["parts"]:
        chunk = (directory / part["file"]).read_bytes()
        if hashlib.sha256(chunk).hexdigest() != part["sha256"]:
            raise SystemExit(f"lease41 unpack: {part['file']} is not the part that was packed (sha256 differs)")
        whole += chunk
    if hashlib.sha256(whole).hexdigest() != index["sha256"]:
        raise SystemExit(f"lease41 unpack: the joined {name} differs from what was packed")
    tar_path = dest / f".{name}.tar"
    dest.mkdir(parents=True, exist_ok=True)
    tar_path.write_bytes(bytes(whole))
    try:
        with tarfile.open(tar_path) as tar:
            names = tar.getnames()
            tar.extractall(dest, filter="data")
    finally:
        tar_path.unlink()
    return names


def stage_pack(args) -> None:
    out = Path(args.out)
    if args.resume_state:
        run = REPO / RUN
        files = [p.relative_to(REPO) for p in (run / "checkpoint.pt", run / "history.json", *run.glob("weights-epoch*.pt")) if p.is_file()]
        name = "resume41"
    else:
        files = [p.relative_to(REPO) for p in (REPO / EXPORT).rglob("*") if p.is_file()] + [SLIM]
        name = "student41"
    parts = tuple(int(x) for x in args.parts.split("-")) if args.parts else None
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        index = pack(files, out if out.is_absolute() else Path(cwd) / out, name, parts=parts, work=REPO / RUN / "pack")
    finally:
        os.chdir(cwd)
    print(f"{name}: {index['bytes']:,} bytes in {len(index['parts'])} parts of at most {PART_BYTES // 2**20} MiB "
          f"({'parts ' + args.parts if args.parts else 'all'} written to {out})")


def stage_unpack(args) -> None:
    directory = Path(args.dir)
    for index in sorted(directory.glob("*.json")):
        names = unpack(directory, Path(args.dest), index.stem)
        print(f"{index.stem}: {len(names)} files under {args.dest}")


# ---- CPU stages --------------------------------------------------------------------------------------

def stage_evaluate(args) -> None:
    tk("evaluate", EXPORT, *data_args(), "--challenge", challenge(), "--beam", 1, "--beam", 4, "--record")
    if not args.skip_robustness:
        tk("evaluate", EXPORT, *data_args(), "--robustness", "--record")
    tk("evaluate", EXPORT, "--names", NAMES, "--beam", 4, "--record")
    print("the shipped model on the same names, for comparison (not recorded):")
    tk("evaluate", SHIPPED, "--names", NAMES, "--beam", 4)


def stage_bench(args) -> None:
    """tk's fp32 rows of `tk bench --text`, the shipped model and the student in alternate turns (one JSON per turn)."""
    for turn in range(args.rounds):
        for label, model in (("shipped", SHIPPED), ("student", EXPORT)):
            out = RUN / f"bench-{label}-{turn}.json"
            tk("bench", "--text", challenge(), "--lines", BENCH_LINES, "--model", model, "--variant", "fp32", "--json", out)


def bench_seconds(label: str) -> dict[str, float]:
    """Median seconds of tk's own engine per `tk bench --text` row over the turns of one model."""
    rows: dict[str, list[float]] = {}
    for path in sorted((REPO / RUN).glob(f"bench-{label}-*.json")):
        for row in json.loads(path.read_text()):
            tk_engine = next(e for e in row["engines"] if e["name"] == "tk")
            rows.setdefault(f"{row['row']} ({row['variant']})", []).append(tk_engine["seconds"])
    return {k: statistics.median(v) for k, v in rows.items()}


def conditions(student: dict, shipped: dict, bench: tuple[dict, dict] | None, exported_bytes: int) -> list[tuple[str, bool, str]]:
    """(condition, met, the figures) for each part of the ship rule; `student`/`shipped`: manifest.json contents;
    `bench`: (shipped, student) seconds per bench row; `exported_bytes`: exported/ with the student in it."""
    out = []
    ev_s, ev_0 = student.get("metrics", {}).get("evaluation", {}), shipped.get("metrics", {}).get("evaluation", {})

    def figure(ev: dict, key: str, field: str) -> float | None:
        return (ev.get(key) or {}).get(field)

    for key, field, what in (("tatoeba_challenge_beam4", "bleu", "Tatoeba Challenge BLEU, beam 4"),
                             ("test_split_beam4", "bleu_multi_ref", "held-out split BLEU (all references), beam 4")):
        new, old = figure(ev_s, key, field), figure(ev_0, key, field)
        out.append((f"{what}: beats the shipped model", new is not None and old is not None and new > old, f"{new} vs {old}"))
    for key, field, what in (("tatoeba_challenge_greedy", "bleu", "Tatoeba Challenge BLEU, greedy"),
                             ("test_split_greedy", "bleu_multi_ref", "held-out split BLEU (all references), greedy")):
        new, old = figure(ev_s, key, field), figure(ev_0, key, field)
        out.append((f"{what}: not lower", new is not None and old is not None and new >= old, f"{new} vs {old}"))
    challenge4 = figure(ev_s, "tatoeba_challenge_beam4", "bleu")
    out.append((f"Tatoeba Challenge BLEU, beam 4, at least {MIN_CHALLENGE_BLEU}", challenge4 is not None and challenge4 >= MIN_CHALLENGE_BLEU,
                f"{challenge4}"))
    n_params = parameters(student["config"])
    out.append((f"at most {MAX_PARAMETERS:,} parameters", n_params <= MAX_PARAMETERS, f"{n_params:,}"))
    names = student.get("metrics", {}).get("names")
    out.append((f"unseen names copied verbatim: at least {MIN_NAMES_SHARE:.0%}", bool(names) and names["share"] >= MIN_NAMES_SHARE,
                f"{names['copied']} of {names['total']}" if names else "not measured (run evaluate)"))
    if bench:
        old_s, new_s = bench
        common = sorted(set(old_s) & set(new_s))
        slower = [f"{r}: {new_s[r]:.3f} s vs {old_s[r]:.3f} s" for r in common if new_s[r] > old_s[r]]
        out.append(("CPU decoding at least as fast (tk bench --text, every row of tk's API)", bool(common) and not slower,
                    "; ".join(slower) or ", ".join(f"{r}: {old_s[r] / new_s[r]:.2f}x" for r in common)))
    else:
        out.append(("CPU decoding at least as fast (tk bench --text)", False, "not measured (run bench)"))
    verify = student.get("verify", {})
    for record in ("onnxruntime/cpu", "onnxruntime/cuda"):
        passed = (verify.get(record) or {}).get("passed")
        out.append((f"tk verify passes ({record})", passed is True, "passed" if passed else "failed" if passed is False else "not recorded"))
    out.append((f"exported/ within {SIZE_BUDGET // 2**20} MiB", exported_bytes <= SIZE_BUDGET, f"{exported_bytes / 2**20:.2f} MiB"))
    return out


def stage_decide(_args) -> bool:
    student = json.loads((REPO / EXPORT / "manifest.json").read_text())
    shipped = json.loads((REPO / SHIPPED / "manifest.json").read_text())
    bench = (bench_seconds("shipped"), bench_seconds("student"))
    results = conditions(student, shipped, bench if all(bench) else None, exported_bytes_with(REPO / EXPORT))
    for what, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {what}: {detail}")
    ship = all(ok for _, ok, _ in results)
    print("decision: " + ("SHIP the student as exported/transformer" if ship else "do not ship; the shipped model stays"))
    return ship


def stage_ship(_args) -> None:
    if not stage_decide(_args):
        sys.exit(1)
    target, staging = REPO / SHIPPED, REPO / RUN / "ship"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(REPO / EXPORT, staging)
    old = REPO / RUN / f"transformer-before-{time.strftime('%Y%m%d-%H%M%S')}"
    os.replace(target, old)
    os.replace(staging, target)
    print(f"exported/transformer is now the student (the previous one moved to {old}). Next: python docs/make_pictures.py; "
          "update the scores in README.md and docs/models.md; run the whole test suite; commit exported/transformer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    sub.add_parser("env")
    p = sub.add_parser("train")
    p.add_argument("--minutes", type=float, default=8.0, help="training minutes in this call (the call also loads data)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--epochs", type=int, help="end the run at this epoch instead of the recipe's (when a lease runs short)")
    sub.add_parser("finish")
    p = sub.add_parser("pack")
    p.add_argument("out")
    p.add_argument("--resume-state", action="store_true", help="the checkpoint and kept epoch weights, to resume in a later lease")
    p.add_argument("--parts", help="A-B: write only parts A to B (0-based), to fetch a large state over several calls")
    p = sub.add_parser("unpack")
    p.add_argument("dir")
    p.add_argument("dest")
    p = sub.add_parser("evaluate")
    p.add_argument("--skip-robustness", action="store_true")
    p = sub.add_parser("bench")
    p.add_argument("--rounds", type=int, default=2)
    sub.add_parser("decide")
    sub.add_parser("ship")
    args = parser.parse_args()
    os.chdir(REPO)
    if args.stage == "decide":
        sys.exit(0 if stage_decide(args) else 1)
    globals()[f"stage_{args.stage}"](args)


if __name__ == "__main__":
    main()
