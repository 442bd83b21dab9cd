"""The student recipe on a rented GPU in two timed steps, resumable, and the decision to ship it, on the CPU.

    python3 tools/student_gpu.py STAGE [options]

A GPU rented by the minute, with a time limit per command and a limit on what goes to and comes back from the machine
(the limits below: 15 minutes in all, 10 a command, 64 MiB sent, 8 files of 16 MiB back), trains the student
(`tk train transformer --preset student`, docs/models.md#the-student-recipe) in about 5 minutes where the CPU needs
days. Set the limits to your provider's; every step can be rerun, and an interrupted run resumes on any machine.

Before renting, here (CPU, no GPU time):
  prepare [--epochs K]    the corpus and the Challenge set into runs/student-data, the first K epochs' examples tokenized
                          into runs/student/epochs (the run reads them instead of making them), and what is sent
                          checked against what one command takes
  plan                    the schedule (machine start + each step's minutes, checked against the rental) and the two
                          commands to run on the GPU machine: command line, paths to send, time limit

On the GPU machine, one command per step, back to back (a machine left idle is handed back after 30 s):
  call1                   check the machine, then train for at most FINISH minutes (resumable, checkpointed each epoch;
                          `finish_minutes` ends the run averaged and evaluated in time, fewer epochs if it must), and
                          pack under $OUT (the folder that comes back) what a later step needs: the finished run's slim
                          checkpoint (2 parts), or if training did not finish, a compact resume state (4 parts)
  call2                   train on if step 1 did not finish, then the slim checkpoint, `tk export`, `tk verify` on CPU
                          and `--provider cuda` (recorded), and the export packed under $OUT

Back here (CPU): unpack, export (when only step 1's files came back), evaluate, bench, decide, ship;
train [--device cpu] resumes a compact resume state anywhere.

Environment: STUDENT_TRAIN_MIN, step 1's training box in minutes; STUDENT_SET="epochs=40 ...", recipe settings the run
changes (`tk train --set` pairs); STUDENT_COMPILE=true, the compiled step.

The ship rule: the student replaces the shipped Transformer only if it beats it on the Tatoeba Challenge set and on
the held-out split (beam 4; greedy not lower), decodes on CPU at least as fast (every `tk bench --text` row of tk's
fp32 API), passes `tk verify` on CPU and keeps exported/ within its 40 MiB budget. The recipe's goals, printed beside
it: at least 45.0 BLEU on the Challenge set (beam 4), at most 10M parameters, 9 in 10 unseen names copied verbatim, and
`tk verify --provider cuda` passing.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RUN = Path("runs/student")
DATA = Path("runs/student-data")  # sent to the GPU machine with step 1
SHIPPED = Path("exported/transformer")
TOKENIZER = SHIPPED / "tokenizer.model"  # the shipped 6,000-piece vocabulary, shared with the GRU
NAMES = Path("docs/names-test.tsv")
CORPUS, CHALLENGE = "fra-eng.zip", "tatoeba-test-eng-fra.txt"
PART_BYTES = 15 * 2**20


def export_dir() -> Path:
    return RUN / "export"


def slim_path() -> Path:
    """The finished run's final weights without the optimizer (write_slim)."""
    return RUN / "student.pt"

SIZE_BUDGET = 40 * 2**20  # tests/deploy/test_shipped.py
MAX_PARAMETERS = 10_000_000
MIN_CHALLENGE_BLEU = 45.0
MIN_NAMES_SHARE = 0.9
BENCH_LINES = 2000

# ---- the plan: the rented GPU's limits, and each step's minutes -------------------------------------------------------

BUDGET_MIN = 15.0  # the rental's GPU time in all: the machine's start, the commands, the idle waits
PLAN_MAX_MIN = 12.0  # this plan's ceiling, start included, leaving 3 minutes of the rental unspent
CALL_MAX_MIN = 10.0  # the longest one command may run on the machine
NO_START_BELOW_MIN = 4.0  # no machine is started with less time than this left
START_MIN = 3.0  # a fresh machine: a minute or more to start, then the ~45 MiB working tree and the data copied in
WARM_GAP_MIN = 0.5  # a machine left idle is handed back after 30 s: step 2 must follow step 1 at once
CARRY_LIMIT = 64 * 2**20  # what one command takes with it: the working tree and the paths sent
RETURN_LIMIT = (8, 16 * 2**20, 64 * 2**20)  # what comes back from $OUT: files, bytes each, bytes together

# Batches of 24,000 padded tokens (4x the recipe's 6,000; 159 steps an epoch instead of 582, counted on this data) at
# the recipe's rate scaled by the square-root rule (peak 2e-3, warm-up 500 steps: toolkit.pytorch.train.batch_recipe),
# bf16 autocast (the recipe's on CUDA), eager (see below), six processes making the epochs
# that were not prepared here.
# Eager, not compiled: on the first try (2026-11-26, H100) compiling cost 190 of the 256 s of training (a recompile
# per padded length pair, ~30 s each) and the run ended after 13 of 32 epochs; eager trained all 32 in 247 s
# (~7.5 s an epoch). STUDENT_COMPILE=true brings the compiled step back.
GPU_SETTINGS = {"batch_tokens": 24000, "compile": os.environ.get("STUDENT_COMPILE", "false"), "data_workers": 6}


class Call(NamedTuple):
    """One step: a command run on the GPU machine, its parts timed."""

    name: str
    steps: tuple[tuple[str, float], ...]  # (what, minutes), in order

    @property
    def minutes(self) -> float:
        return round(sum(m for _, m in self.steps), 2)

    @property
    def timeout_s(self) -> int:
        return math.ceil(self.minutes * 60)

    def step(self, what: str) -> float:
        return dict(self.steps)[what]


CALL1 = Call("call1", (
    ("check the machine", 0.15),
    ("start tk train: imports, corpus, model on the GPU", 0.4),
    ("train", 5.0),  # finish_minutes: epochs (compile warm-up included), averaging, final metrics
    ("slim checkpoint or resume state, pack", 0.3),
    ("margin", 0.4),
))
CALL2 = Call("call2", (
    ("start tk train", 0.3),
    ("train", 0.5),  # only when call 1 did not finish; else unspent
    ("slim checkpoint", 0.1),
    ("tk export", 0.5),
    ("tk verify, CPU", 0.5),
    ("tk verify --provider cuda", 0.15),
    ("pack the export", 0.15),
    ("margin", 0.05),
))


def schedule(calls: tuple[Call, ...] = (CALL1, CALL2)) -> dict:
    """The rental's minutes by construction: one machine start, the steps back to back on the same machine."""
    total = START_MIN + sum(c.minutes for c in calls) + WARM_GAP_MIN * (len(calls) - 1)
    after_first = START_MIN + calls[0].minutes + WARM_GAP_MIN
    return {"start_min": START_MIN, "calls": {c.name: {"minutes": c.minutes, "timeout_s": c.timeout_s} for c in calls},
            "gap_min": WARM_GAP_MIN, "total_min": round(total, 2), "budget_min": BUDGET_MIN, "ceiling_min": PLAN_MAX_MIN,
            "left_after_call1_min": round(BUDGET_MIN - after_first, 2),
            "fits": total <= PLAN_MAX_MIN and all(c.minutes <= CALL_MAX_MIN for c in calls)}


def train_args(minutes: float, device: str = "cuda", extra: tuple[str, ...] = ()) -> list[str]:
    """`tk train` on the GPU: the student recipe, the fast settings above, a time box of `minutes` (finish_minutes ends
    the run in time; --max-minutes stops it with a checkpoint should the box be overrun)."""
    sets = [x for k, v in {**GPU_SETTINGS, "finish_minutes": minutes}.items() for x in ("--set", f"{k}={v}")]
    return ["train", "transformer", "--preset", "student", "--out", str(RUN), "--data", str(DATA / CORPUS),
            "--exclude", str(DATA / CHALLENGE), "--tokenizer", str(TOKENIZER), "--device", device,
            "--max-minutes", str(minutes), *sets, *extra]


def run_calls() -> list[dict]:
    """The two commands to run on the GPU machine: the command line, the paths to send with it (carry), its time limit
    (timeout_s). Step 2 sends nothing: a runs/ path sent again would replace the run that step 1 left on the machine."""
    def command(stage: str) -> str:
        return f"set -o pipefail; export PYTHONUNBUFFERED=1; python3 tools/student_gpu.py {stage} 2>&1 | tee $OUT/{stage}.log"

    resume = [str(RUN / "checkpoint.pt")] if (REPO / RUN / "checkpoint.pt").is_file() else []  # a state unpacked to go on
    return [{"command": command("call1"), "carry": [str(DATA), str(RUN / "epochs"), *resume], "timeout_s": CALL1.timeout_s},
            {"command": command("call2"), "carry": [], "timeout_s": CALL2.timeout_s}]


# ---- sizes -----------------------------------------------------------------------------------------------------------

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


def working_tree_bytes() -> int:
    """What every command sends before the paths it carries: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum((REPO / os.fsdecode(p)).stat().st_size for p in listed if p and (REPO / os.fsdecode(p)).is_file())


def carry_fits(tree: int, carried: int) -> tuple[bool, str]:
    total = tree + carried
    return total <= CARRY_LIMIT, (f"working tree {tree / 2**20:.1f} MiB + carry {carried / 2**20:.1f} MiB = "
                                  f"{total / 2**20:.1f} MiB of the {CARRY_LIMIT // 2**20} MiB a command takes")


# ---- before renting (CPU) --------------------------------------------------------------------------------------------

def shared_data(name: str) -> Path | None:
    """runs/student-data/NAME, else ../shared/data/NAME beside the clone."""
    return next((p for p in (REPO / DATA / name, REPO.parent / "shared" / "data" / name) if p.is_file()), None)


def stage_prepare(args) -> None:
    """The data the GPU machine needs, here: the two data files, and the first epochs tokenized."""
    from toolkit.pytorch.train import TrainOptions, prepare_epochs

    (REPO / DATA).mkdir(parents=True, exist_ok=True)
    for name in (CORPUS, CHALLENGE):
        source = REPO.parent / "shared" / "data" / name
        if not (REPO / DATA / name).is_file():
            if not source.is_file():
                sys.exit(f"student_gpu prepare: no {name} in {DATA} or ../shared/data; copy it into {DATA}")
            shutil.copyfile(source, REPO / DATA / name)
    sets = {**GPU_SETTINGS, "finish_minutes": CALL1.step("train"), "data_workers": 2}  # two cores here
    opts = TrainOptions(model="transformer", out=REPO / RUN, data=str(REPO / DATA / CORPUS), exclude=str(REPO / DATA / CHALLENGE),
                        preset="student", tokenizer=str(REPO / TOKENIZER), overrides={k: str(v) for k, v in sets.items()})
    started = time.time()
    paths = prepare_epochs(opts, list(range(args.epochs)))
    carried = sum(tree_bytes(REPO / p) if (REPO / p).is_dir() else (REPO / p).stat().st_size
                  for p in run_calls()[0]["carry"] if (REPO / p).exists())
    ok, line = carry_fits(working_tree_bytes(), carried)
    print(f"{len(paths)} epochs prepared in {time.time() - started:.0f} s ({sum(p.stat().st_size for p in paths) / 2**20:.1f} MiB); {line}")
    if not ok:
        sys.exit(f"student_gpu prepare: what step 1 sends does not fit; prepare fewer epochs (--epochs {max(args.epochs - 2, 1)})")


def stage_plan(_args) -> None:
    plan = schedule()
    for call in (CALL1, CALL2):
        print(f"{call.name}: {call.minutes} min (timeout_s {call.timeout_s}): " + ", ".join(f"{w} {m}" for w, m in call.steps))
    print(f"plan: start {plan['start_min']} + call1 {plan['calls']['call1']['minutes']} + wait {plan['gap_min']} + call2 "
          f"{plan['calls']['call2']['minutes']} = {plan['total_min']} min of {plan['budget_min']} (ceiling {plan['ceiling_min']}); "
          f"{plan['left_after_call1_min']} min left after call 1")
    for i, call in enumerate(run_calls(), 1):
        print(f"run {i}: " + json.dumps(call))
    if not plan["fits"]:
        sys.exit("student_gpu plan: over the rental's minutes")


# ---- on the GPU ------------------------------------------------------------------------------------------------------

def tk(*args, check: bool = True) -> int:
    print("$ tk " + " ".join(map(str, args)), flush=True)
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", *map(str, args)], cwd=REPO)
    if check and done.returncode:
        sys.exit(f"student_gpu: `tk {args[0]}` failed (exit {done.returncode})")
    return done.returncode


def link_models() -> str | None:
    """toolkit.models importable, or the reason it is not. Where tk is not installed (a GPU machine without network:
    nothing can be fetched there, and nothing needs to be), a link does what an install's mapping of models/ does. Each
    step makes it: a working tree copied in afresh for a later step lacks the link an earlier step made."""
    try:
        import toolkit.models.transformer  # noqa: F401
        return None
    except ImportError:
        link = REPO / "toolkit" / "models"
        if not link.exists():
            link.symlink_to(Path("..") / "models")
            print("toolkit/models -> ../models linked (tk is not installed here)")
        importlib.invalidate_caches()
        try:
            import toolkit.models.transformer  # noqa: F401,F811
            return None
        except ImportError as e:
            return f"toolkit.models does not import ({e})"


def stage_env(_args=None) -> None:
    """What the machine has; stops the step before any training if something it needs is missing."""
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
        import triton  # torch.compile's GPU code generator; without it the run trains eager (slower, still in the box)

        print(f"triton {triton.__version__}")
    except ImportError:
        print("no triton: torch.compile will fail once and the run goes on eager")
    try:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
        print(f"onnxruntime {onnxruntime.__version__}: {', '.join(providers)}")
        if "CUDAExecutionProvider" not in providers:
            print("  (no CUDA provider: call2's `tk verify --provider cuda` records that it could not run)")
    except ImportError:
        problems.append("no onnxruntime")
    problem = link_models()
    if problem:
        problems.append(problem)
    for name in (CORPUS, CHALLENGE):
        if not (REPO / DATA / name).is_file():
            problems.append(f"no {DATA / name} (run `tools/student_gpu.py prepare` here and send {DATA})")
    prepared = sorted((REPO / RUN / "epochs").glob("epoch-*.npz.xz"))
    print(f"{len(prepared)} prepared epochs in {RUN / 'epochs'}; the rest are made by {GPU_SETTINGS['data_workers']} processes")
    if problems:
        sys.exit("student_gpu env: " + "; ".join(problems))
    print("student_gpu env: ready")


def progress(run: Path | None = None) -> dict | None:
    """The run's checkpoint progress, or None before the first checkpoint."""
    path = REPO / (run or RUN) / "checkpoint.pt"
    if not path.is_file():
        return None
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    p = ckpt["progress"]
    return {"epoch": p["epoch"], "epochs": ckpt["train"]["recipe"]["epochs"], "step": p["step"], "cut": p.get("epochs_cut"),
            "elapsed_s": round(p["elapsed"]), "finished": bool(ckpt.get("metrics")), "metrics": ckpt.get("metrics")}


def recipe_changes(text: str | None = None) -> tuple[str, ...]:
    """STUDENT_SET="epochs=44 average_last=8": recipe settings this run changes (`--set` pairs), e.g. a longer schedule
    when the rental's box holds more epochs than the recipe's."""
    text = os.environ.get("STUDENT_SET", "") if text is None else text
    return tuple(x for pair in text.split() for x in ("--set", pair))


def stage_train(args) -> dict | None:
    """Starts the run or resumes it, for at most args.minutes of training; nothing when it has finished."""
    state = progress()
    if state and state["finished"]:
        print(f"training: done ({state['epoch']} epochs, {state['elapsed_s']} s); metrics {state['metrics']}")
        return state
    code = tk(*train_args(args.minutes, args.device, tuple(getattr(args, "extra", ()))), *(["--resume"] if state else []), check=False)
    state = progress()
    if state is None:
        sys.exit(f"student_gpu train: no checkpoint in {RUN} after `tk train` (exit {code})")
    if state["finished"]:
        cut = f", ended at epoch {state['cut']['to']} of {state['cut']['from']} to finish in time" if state["cut"] else ""
        print(f"training: done ({state['epoch']} epochs, {state['elapsed_s']} s of training{cut})")
    else:
        print(f"training: epoch {state['epoch']} of {state['epochs']} after {state['elapsed_s']} s; `train` again resumes it")
    return state


def write_slim(source: Path, out: Path) -> dict:
    """The finished run's checkpoint without what only training needs (optimizer, live weights, RNG): the final
    (averaged) weights with their config, tokenizer and provenance, a third of the size."""
    from toolkit.pytorch import checkpoint

    ckpt = checkpoint.load(source)
    slim = {k: v for k, v in ckpt.items() if k not in ("optimizer", "train_state_dict", "rng", "path", "format", "weights_sha256")}
    checkpoint.save(slim, out)
    return ckpt


def write_resume_state(source: Path, out: Path) -> None:
    """An unfinished run's checkpoint small enough to come back from one command (64 MiB): the weights in float32, Adam's
    moments in bfloat16 (its state_dict load casts them back to float32; a relative error of 2^-8 in each moment),
    the progress and RNG. The kept epoch weights stay behind: a resumed run averages the epochs it trains from here."""
    import torch

    from toolkit.pytorch import checkpoint

    ckpt = checkpoint.load(source)
    optimizer = ckpt["optimizer"]
    optimizer["state"] = {i: {k: v.to(torch.bfloat16) if k != "step" and v.is_floating_point() else v for k, v in s.items()}
                          for i, s in optimizer["state"].items()}
    checkpoint.save({k: v for k, v in ckpt.items() if k not in ("path", "format", "weights_sha256")}, out)


def pack_run(out: Path, finished: bool) -> dict:
    """The slim checkpoint (finished), else the compact resume state, in parts under `out`."""
    if finished:
        write_slim(REPO / RUN / "checkpoint.pt", REPO / slim_path())
        files, name = [slim_path(), RUN / "history.json"], "student-slim"
    else:
        resume = RUN / "resume" / "checkpoint.pt"
        (REPO / resume).parent.mkdir(parents=True, exist_ok=True)
        write_resume_state(REPO / RUN / "checkpoint.pt", REPO / resume)
        files, name = [resume, RUN / "history.json"], "student-resume"
    return pack_files([f for f in files if (REPO / f).is_file()], out, name)


def stage_call1(args) -> None:
    stage_env()
    minutes = float(os.environ.get("STUDENT_TRAIN_MIN", CALL1.step("train")))  # a shorter or longer box for a rental's leftover
    state = stage_train(argparse.Namespace(minutes=minutes, device="cuda", extra=recipe_changes()))
    index = pack_run(Path(args.out), state["finished"])
    print(f"call1: {index['name']} packed ({index['bytes'] / 2**20:.1f} MiB, {len(index['parts'])} parts); "
          + ("now call2, at once" if state["finished"] else "call2 at once trains on; if it never comes, resume from this"))


def stage_call2(args) -> None:
    problem = link_models()
    if problem:
        sys.exit(f"student_gpu call2: {problem}")
    state = progress()
    if state is None:
        sys.exit(f"student_gpu call2: no run in {RUN}: this machine is not step 1's (it was handed back); finish on the CPU "
                 "from step 1's files instead: `tools/student_gpu.py unpack DIR` then `tools/student_gpu.py export`")
    if not state["finished"]:
        stage_env()
        state = stage_train(argparse.Namespace(minutes=CALL2.step("train"), device="cuda", extra=recipe_changes()))
        if not state["finished"]:
            index = pack_run(Path(args.out), finished=False)
            sys.exit(f"student_gpu call2: training is not done; {index['name']} packed under $OUT: unpack it and resume "
                     "(train --device cpu here, or call1 on a GPU)")
    finish()
    index = pack_files([p.relative_to(REPO) for p in (REPO / export_dir()).rglob("*") if p.is_file()], Path(args.out), "student-export")
    print(f"call2: {index['name']} packed ({index['bytes'] / 2**20:.1f} MiB, {len(index['parts'])} parts)")


def finish() -> None:
    """The slim checkpoint, its export, and `tk verify` on CPU and CUDA, recorded in the export's manifest."""
    if not (REPO / slim_path()).is_file():
        write_slim(REPO / RUN / "checkpoint.pt", REPO / slim_path())
    tk("export", slim_path(), "--out", export_dir(), "--force")
    tk("verify", export_dir(), "--data", DATA / CORPUS, "--record")
    if tk("verify", export_dir(), "--data", DATA / CORPUS, "--provider", "cuda", "--record", check=False):
        print("student_gpu: `tk verify --provider cuda` did not pass or could not run (see above); decide will say so")
    print(f"export: {export_dir()}, {tree_bytes(REPO / export_dir()):,} bytes; exported/ with it: {exported_bytes_with(REPO / export_dir()):,} "
          f"(budget {SIZE_BUDGET:,})")


# ---- moving files to and from the GPU machine: parts small enough to come back, each with its sha256 ---------------

def _tar(paths: list[Path], tar_path: Path) -> None:
    """A tar of `paths` whose bytes depend on their content only (names, sizes, data)."""
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
    tar's sha256 and every part's) into `out`; paths are relative to the current directory."""
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


def pack_files(files: list[Path], out: Path, name: str) -> dict:
    """pack() from the repository root (the files' paths are relative to it); refuses what $OUT could not return."""
    out = out if out.is_absolute() else Path.cwd() / out
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        index = pack(files, out, name, work=REPO / RUN / "pack")
    finally:
        os.chdir(cwd)
    count, _, together = RETURN_LIMIT
    if len(index["parts"]) + 2 > count or index["bytes"] > together - 2**20:
        print(f"student_gpu: warning: {name} is {index['bytes'] / 2**20:.1f} MiB in {len(index['parts'])} parts, more than one command returns")
    return index


def unpack(directory: Path, dest: Path, name: str) -> list[str]:
    """Joins DIRECTORY/NAME.part* (each and the whole checked against NAME.json) and extracts the files under DEST."""
    index = json.loads((directory / f"{name}.json").read_text())
    whole = bytearray()
    for part in index["parts"]:
        chunk = (directory / part["file"]).read_bytes()
        if hashlib.sha256(chunk).hexdigest() != part["sha256"]:
            raise SystemExit(f"student_gpu unpack: {part['file']} is not the part that was packed (sha256 differs)")
        whole += chunk
    if hashlib.sha256(whole).hexdigest() != index["sha256"]:
        raise SystemExit(f"student_gpu unpack: the joined {name} differs from what was packed")
    tar_path = dest / f".{name}.tar"
    dest.mkdir(parents=True, exist_ok=True)
    tar_path.write_bytes(bytes(whole))
    try:
        with tarfile.open(tar_path) as tar:
            names = tar.getnames()
            tar.extractall(dest, filter="data")  # never a path out of DEST, never a link
    finally:
        tar_path.unlink()
    return names


def stage_unpack(args) -> None:
    """Step 1's or step 2's files into the run; a resume state becomes the run's checkpoint (the one there, if any,
    is kept beside it)."""
    directory = Path(args.dir)
    for index in sorted(directory.glob("student-*.json")):
        names = unpack(directory, REPO, index.stem)
        print(f"{index.stem}: {len(names)} files under {RUN}")
    resume = REPO / RUN / "resume" / "checkpoint.pt"
    if resume.is_file():
        current = REPO / RUN / "checkpoint.pt"
        if current.is_file():
            os.replace(current, current.with_name(f"checkpoint-before-{time.strftime('%Y%m%d-%H%M%S')}.pt"))
        os.replace(resume, current)
        print(f"the resume state is {current}: `tools/student_gpu.py train --device cpu` (or call1 on a GPU) continues it")


# ---- back from the GPU (CPU) -----------------------------------------------------------------------------------------

def stage_export(_args) -> None:
    """What step 2 would have done, on the CPU, from step 1's slim checkpoint (all but `--provider cuda`)."""
    if not (REPO / slim_path()).is_file():
        sys.exit(f"student_gpu export: no {slim_path()}; unpack step 1's files first")
    tk("export", slim_path(), "--out", export_dir(), "--force")
    tk("verify", export_dir(), "--data", shared_data(CORPUS) or DATA / CORPUS, "--record")


def challenge() -> Path:
    path = shared_data(CHALLENGE)
    if path is None:
        sys.exit(f"student_gpu: no {CHALLENGE} in {DATA} or ../shared/data")
    return path


def stage_evaluate(args) -> None:
    data_args = ["--data", shared_data(CORPUS)] if shared_data(CORPUS) else []
    tk("evaluate", export_dir(), *data_args, "--challenge", challenge(), "--beam", 1, "--beam", 4, "--record")
    if not args.skip_robustness:
        tk("evaluate", export_dir(), *data_args, "--robustness", "--record")
    tk("evaluate", export_dir(), "--names", NAMES, "--beam", 4, "--record")
    print("the shipped model on the same names, for comparison (not recorded):")
    tk("evaluate", SHIPPED, "--names", NAMES, "--beam", 4)


def stage_bench(args) -> None:
    """tk's fp32 rows of `tk bench --text`, the shipped model and the student in alternate turns (one JSON per turn)."""
    for turn in range(args.rounds):
        for label, model in (("shipped", SHIPPED), ("student", export_dir())):
            out = RUN / f"bench-{label}-{turn}.json"
            # --no-ct2: the rule compares tk's own rows of the two models; CTranslate2's rows would triple the time.
            tk("bench", "--text", challenge(), "--lines", BENCH_LINES, "--model", model, "--variant", "fp32", "--no-ct2", "--json", out)


def bench_seconds(label: str) -> dict[str, float]:
    """Median seconds of tk's own engine per `tk bench --text` row over the turns of one model."""
    rows: dict[str, list[float]] = {}
    for path in sorted((REPO / RUN).glob(f"bench-{label}-*.json")):
        for row in json.loads(path.read_text()):
            tk_engine = next(e for e in row["engines"] if e["name"] == "tk")
            rows.setdefault(f"{row['row']} ({row['variant']})", []).append(tk_engine["seconds"])
    return {k: statistics.median(v) for k, v in rows.items()}


SHIP, TARGET = "ship rule", "recipe goal"


def conditions(student: dict, shipped: dict, bench: tuple[dict, dict] | None, exported_bytes: int) -> list[tuple[str, str, bool, str]]:
    """(kind, condition, met, the figures) for each condition; `student`/`shipped`: manifest.json contents; `bench`:
    (shipped, student) seconds per bench row; `exported_bytes`: exported/ with the student in it.

    Two kinds. SHIP, the decision rule: the student replaces the shipped model only if it beats it on the Challenge set
    and the held-out split (beam 4; greedy not lower), decodes on CPU at least as fast, passes `tk verify` on CPU and
    keeps exported/ in its budget: a user is then better off. TARGET, the recipe's goals: 45.0 BLEU, at most 10M
    parameters, 9 in 10 names, `tk verify --provider cuda`; a student can ship while a goal is still missed."""
    out = []
    ev_s, ev_0 = student.get("metrics", {}).get("evaluation", {}), shipped.get("metrics", {}).get("evaluation", {})

    def figure(ev: dict, key: str, field: str) -> float | None:
        return (ev.get(key) or {}).get(field)

    for key, field, what in (("tatoeba_challenge_beam4", "bleu", "Tatoeba Challenge BLEU, beam 4"),
                             ("test_split_beam4", "bleu_multi_ref", "held-out split BLEU (all references), beam 4")):
        new, old = figure(ev_s, key, field), figure(ev_0, key, field)
        out.append((SHIP, f"{what}: beats the shipped model", new is not None and old is not None and new > old, f"{new} vs {old}"))
    for key, field, what in (("tatoeba_challenge_greedy", "bleu", "Tatoeba Challenge BLEU, greedy"),
                             ("test_split_greedy", "bleu_multi_ref", "held-out split BLEU (all references), greedy")):
        new, old = figure(ev_s, key, field), figure(ev_0, key, field)
        out.append((SHIP, f"{what}: not lower", new is not None and old is not None and new >= old, f"{new} vs {old}"))
    if bench:
        old_s, new_s = bench
        common = sorted(set(old_s) & set(new_s))
        slower = [f"{r}: {new_s[r]:.3f} s vs {old_s[r]:.3f} s" for r in common if new_s[r] > old_s[r]]
        out.append((SHIP, "CPU decoding at least as fast (tk bench --text, every row of tk's API)", bool(common) and not slower,
                    "; ".join(slower) or ", ".join(f"{r}: {old_s[r] / new_s[r]:.2f}x" for r in common)))
    else:
        out.append((SHIP, "CPU decoding at least as fast (tk bench --text)", False, "not measured (run bench)"))
    verify = student.get("verify", {})
    for kind, record in ((SHIP, "onnxruntime/cpu"), (TARGET, "onnxruntime/cuda")):
        passed = (verify.get(record) or {}).get("passed")
        out.append((kind, f"tk verify passes ({record})", passed is True, "passed" if passed else "failed" if passed is False else "not recorded"))
    out.append((SHIP, f"exported/ within {SIZE_BUDGET // 2**20} MiB", exported_bytes <= SIZE_BUDGET, f"{exported_bytes / 2**20:.2f} MiB"))
    challenge4 = figure(ev_s, "tatoeba_challenge_beam4", "bleu")
    out.append((TARGET, f"Tatoeba Challenge BLEU, beam 4, at least {MIN_CHALLENGE_BLEU}",
                challenge4 is not None and challenge4 >= MIN_CHALLENGE_BLEU, f"{challenge4}"))
    n_params = parameters(student["config"])
    out.append((TARGET, f"at most {MAX_PARAMETERS:,} parameters", n_params <= MAX_PARAMETERS, f"{n_params:,}"))
    names = student.get("metrics", {}).get("names")
    out.append((TARGET, f"unseen names copied verbatim: at least {MIN_NAMES_SHARE:.0%}", bool(names) and names["share"] >= MIN_NAMES_SHARE,
                f"{names['copied']} of {names['total']}" if names else "not measured (run evaluate)"))
    return out


def stage_decide(_args) -> bool:
    student = json.loads((REPO / export_dir() / "manifest.json").read_text())
    shipped = json.loads((REPO / SHIPPED / "manifest.json").read_text())
    bench = (bench_seconds("shipped"), bench_seconds("student"))
    results = conditions(student, shipped, bench if all(bench) else None, exported_bytes_with(REPO / export_dir()))
    for kind, what, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  [{kind}] {what}: {detail}")
    ship = all(ok for kind, _, ok, _ in results if kind == SHIP)
    done = all(ok for _, _, ok, _ in results)
    print("decision: " + ("SHIP the student as exported/transformer" if ship else "do not ship; the shipped model stays")
          + ("; every recipe goal met" if done else "; recipe goals not all met (see FAIL [recipe goal])"))
    return ship


def stage_ship(_args) -> None:
    if not stage_decide(_args):
        sys.exit(1)
    target, staging = REPO / SHIPPED, REPO / RUN / "ship"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(REPO / export_dir(), staging)
    old = REPO / RUN / f"transformer-before-{time.strftime('%Y%m%d-%H%M%S')}"
    os.replace(target, old)
    os.replace(staging, target)
    print(f"exported/transformer is now the student (the previous one moved to {old}). Next: python tools/make_pictures.py; "
          "update the scores in README.md and docs/models.md; run the whole test suite; commit exported/transformer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--epochs", type=int, default=4, help="epochs to tokenize here (2.3 MB each, xz)")
    sub.add_parser("plan")
    sub.add_parser("env")
    for name in ("call1", "call2"):
        p = sub.add_parser(name)
        p.add_argument("--out", default=os.environ.get("OUT", "runs/student-out"), help="where the packed files go [$OUT]")
    p = sub.add_parser("train")
    p.add_argument("--minutes", type=float, default=CALL1.step("train"))
    p.add_argument("--device", default="cuda")
    p = sub.add_parser("unpack")
    p.add_argument("dir")
    sub.add_parser("export")
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
