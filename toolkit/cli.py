"""The `tk` command line. Thin: parse options, call one library function, print.

Heavy imports (torch, onnxruntime) live inside the commands so `tk --help` is
instant and `tk translate` never loads torch.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from toolkit import __version__
from toolkit.errors import ToolkitError, UsageError, first_line
from toolkit.variants import BUILT, NAMES

# Mirrors toolkit.batching.GUARDED (imported lazily there, so `tk --help` stays instant).
GUARDED = {"max_len_a": 2.0, "max_len_b": 10, "loop_guard": True}
DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "exported" / "transformer"


class Group(click.Group):
    """Turns every ToolkitError into one line on stderr and its exit code, never a traceback.

    Ctrl-C and SIGTERM exit 130; an OS error (a full disk, a vanished file) is one line and exit 1;
    anything else is a bug in tk, reported in one line as such (TK_DEBUG=1 shows the traceback).
    """

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ToolkitError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        except click.exceptions.UsageError as e:
            # One line, like every other error: click's default adds the usage and a hint around it.
            click.echo(f"error: {e.format_message()} (see tk {ctx.invoked_subcommand or ''} --help)".replace("  ", " "), err=True)
            sys.exit(e.exit_code)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except OSError as e:
            if os.environ.get("TK_DEBUG"):
                raise
            where = f": {e.filename}" if e.filename else ""
            click.echo(f"error: {e.strerror or e}{where}; free space or choose another path and retry", err=True)
            sys.exit(1)
        except Exception as e:
            if os.environ.get("TK_DEBUG"):
                raise
            first = first_line(e)
            click.echo(f"error: internal error in tk ({type(e).__name__}: {first}); please report it (TK_DEBUG=1 shows the traceback)",
                       err=True)
            sys.exit(1)


class FiniteFloat(click.FloatRange):
    """A float within a range that is also finite: click's FloatRange lets NaN through (NaN < min is False)."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if rv != rv or rv in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


# Declared ranges of the numeric options. Beam and threads are capped where a larger value only burns
# memory and time (beam 5000 took a minute and 3 GB for one sentence); batch at the graphs' batch bound.
POSITIVE = click.IntRange(min=1)
SEED = click.IntRange(0, 2**32 - 1)
BEAM = click.IntRange(1, 64)
BATCH = click.IntRange(1, 4096)
THREADS = click.IntRange(1, 256)
STREAMS = click.IntRange(1, 64)
# One search for the corpus in every command (toolkit.data.find); each command names the file it used.
DATA_OPTION = click.option("--data", "data_path", metavar="PATH",
                           help="fra-eng.zip or fra.txt [default: $TK_DATA, else ../shared/data/fra-eng.zip, else the cache "
                                "(tk train downloads into it)].")
TOLERANCE = FiniteFloat(min=0.0)


def writable_file(path: Path | None, option: str) -> None:
    """Checks an output file path before any work, so a long run never fails at its very end."""
    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"{option} {path} is a directory; give a file name")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: directory {parent} does not exist; create it or choose another path")
    if not os.access(parent if not path.exists() else path, os.W_OK):
        raise UsageError(f"{option} {path} is not writable; choose another path")


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No garbage collection inside the block, and what it allocated is then left out of later ones.

    Loading the modules and the model allocates much and frees little: the ~35 collections it
    triggered cost 10 ms of CPU in `tk translate`'s start and found next to nothing. Merely pausing
    would hand the whole heap to the first collection after the block; gc.freeze() moves it out of
    the collector's reach instead (those objects live as long as the process; refcounting still
    frees them).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def command_line() -> str:
    return "tk " + shlex.join(sys.argv[1:])


@click.group(cls=Group)
@click.version_option(__version__, prog_name="tk")
def main() -> None:
    """tk: train attention models, export them to ONNX, verify parity, translate with the graphs alone."""


@main.command()
@click.argument("model")
@click.option("--out", type=click.Path(path_type=Path), help="Run directory for checkpoint.pt [default: runs/MODEL].")
@DATA_OPTION
@click.option("--exclude", type=click.Path(exists=True, dir_okay=False),
              help="A public test set (eng<TAB>fra<TAB>English<TAB>French) whose English sentences are kept out of training.")
@click.option("--preset", type=click.Choice(["tiny", "base"]), default="base", show_default=True,
              help="Size preset: tiny (a few hundred pairs, about a minute) or base (the shipped models).")
@click.option("--pre-ln", is_flag=True, help="Transformer with pre-LN blocks and a final LayerNorm.")
@click.option("--epochs", type=POSITIVE, help="Passes over the training pairs [preset].")
@click.option("--lr", type=FiniteFloat(min=0.0, min_open=True), help="Peak learning rate [preset].")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--resume", is_flag=True, help="Continue the checkpoint in --out.")
@click.option("--limit-pairs", type=POSITIVE, help="Train on a random sample of this many pairs.")
@click.option("--max-minutes", type=FiniteFloat(min=0.0, min_open=True), help="Stop with a checkpoint after this many minutes.")
@click.option("--threads", type=THREADS, help="Torch CPU threads [default: all cores].")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16"]), default="auto", show_default=True,
              help="bf16 autocast halves CPU training time where the CPU has native bf16; weights stay fp32.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: a CUDA GPU when torch sees one, else the CPU.")
@click.option("--noise/--no-noise", default=None,
              help="Robustness noise on the training pairs: case, final punctuation, names, placeholders [preset: on for base].")
@click.option("--tokenizer", "tokenizer_path", type=click.Path(dir_okay=False),
              help="SentencePiece model to share between models: used if it exists, else trained and written there.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a size, e.g. --set num_layers=2 --set max_tokens=4000.")
def train(model: str, out, data_path, exclude, preset, pre_ln, epochs, lr, seed, resume, limit_pairs, max_minutes, threads, precision,
          device, noise, tokenizer_path, sets):
    """Train MODEL: nw (kernel regression), seq2seq (GRU + Bahdanau) or transformer.

    Example: tk train transformer --preset tiny --out runs/tiny
    """
    from toolkit.train import TrainOptions
    from toolkit.train import train as run

    overrides = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got '{item}'", param_hint="--set")
        overrides[key.strip()] = value  # parsed and checked against the model's config by train()
    opts = TrainOptions(model=model, out=out or Path("runs") / model, data=data_path, exclude=exclude, preset=preset,
                        pre_ln=pre_ln, epochs=epochs, lr=lr, seed=seed, resume=resume, limit_pairs=limit_pairs,
                        max_minutes=max_minutes, threads=threads, precision=precision, device=device, noise=noise,
                        tokenizer=tokenizer_path, overrides=overrides, command=command_line())
    run(opts, echo=lambda m: click.echo(m, err=True))


@main.command()
@click.argument("source")
@click.option("--out", type=click.Path(path_type=Path), help="Model directory to write, e.g. exported/transformer.")
@click.option("--random-init", is_flag=True, help="SOURCE is a model name; export small random weights (for tests).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed for --random-init.")
@click.option("--opset", type=click.IntRange(18, 23), default=18, show_default=True, help="ONNX opset (18 or newer).")
@click.option("--fp16", is_flag=True, help="Also write a float16 copy for the CUDA provider.")
@click.option("--optimize", is_flag=True, help="Also write an ONNX Runtime offline-optimised copy for the CPU provider.")
@click.option("--quantize", type=click.Choice([v for v in BUILT if v.startswith("int")]), help="Also write a dynamic int8 copy for the CPU provider.")
@click.option("--attention", is_flag=True, help="On an exported directory: declare the attention outputs that `tk attention` "
              "and `tk verify` use (new exports declare them already).")
@click.option("--force", is_flag=True, help="Replace an existing exported model directory (one holding a tk manifest.json).")
@click.option("--web", "web_dir", type=click.Path(path_type=Path), metavar="DIR",
              help="On an exported directory: write a static site to DIR that translates in the browser (needs `npm ci --prefix web`; "
              "--force replaces an existing site).")
def export(source, out, random_init, seed, opset, fp16, optimize, quantize, attention, force, web_dir):
    """Export a checkpoint (or, with --random-init, a model name) to ONNX.

    SOURCE may also be an exported model directory: the variants asked for are
    added to it, built from its own fp32 graphs.

    \b
    Example: tk export runs/transformer/checkpoint.pt --out exported/transformer
             tk export exported/transformer --quantize int8
             tk export exported/transformer --web site/  (then: python -m http.server -d site/)
    """
    import time

    is_model_dir = not random_init and (Path(source) / "manifest.json").is_file()
    if web_dir is not None:
        return _export_web(Path(source), web_dir, force, is_model_dir, out or random_init or fp16 or optimize or quantize or attention)

    from toolkit.export import ExportOptions, add_variants
    from toolkit.export import export as run

    if out is None and not is_model_dir:
        raise UsageError("missing --out: say which model directory to write, e.g. --out exported/transformer")
    opts = ExportOptions(out=out or Path(source), checkpoint=None if random_init else source, model=source if random_init else None,
                         random_init=random_init, seed=seed, opset=opset, fp16=fp16, optimize=optimize,
                         quantize=quantize, attention=attention, force=force, command=command_line())
    start = time.time()
    if is_model_dir:
        if out is not None and out.resolve() != Path(source).resolve():
            raise UsageError(f"{source} is an exported model directory; variants are added in place, so drop --out")
        path = add_variants(Path(source), opts, echo=lambda m: click.echo(m, err=True))
    else:
        path = run(opts, echo=lambda m: click.echo(m, err=True))
    files = sorted(p for p in path.iterdir())
    click.echo(f"wrote {path} in {time.time() - start:.1f}s:")
    for f in files:
        click.echo(f"  {f.name:<22} {f.stat().st_size / 1024:>10,.1f} KiB")


def _export_web(source: Path, web_dir: Path, force: bool, is_model_dir: bool, other_options: bool) -> None:
    import time

    from toolkit.web_export import downloads, export_web

    if not is_model_dir:
        raise UsageError(f"--web needs an exported model directory (one with manifest.json), not {source}; export the checkpoint first")
    if other_options:
        raise UsageError("--web writes a site from the directory as it is; run it without --out, --fp16, --optimize, --quantize or --attention")
    start = time.time()
    files = export_web(source, web_dir, force, echo=lambda m: click.echo(m, err=True))
    click.echo(f"wrote {web_dir} in {time.time() - start:.1f}s:")
    for name, size in files.items():
        click.echo(f"  {name:<38} {size / 1024:>10,.1f} KiB")
    sizes = ", ".join(f"{v} {n / 2**20:,.1f} MiB" for v, n in downloads(web_dir).items())
    click.echo(f"download per page load (runtime, tokenizer and one variant's graphs): {sizes} (index.html?variant=int8); "
               f"serve it with any static file server, e.g. python -m http.server -d {web_dir}")


@main.command()
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option("--provider", type=click.Choice(["cpu", "cuda", "all"]), default="cpu", show_default=True)
@click.option("--runtime", type=click.Choice(["onnxruntime", "openvino"]), default="onnxruntime", show_default=True,
              help="Which engine runs the graphs (openvino: its CPU plugin; needs the openvino extra).")
@click.option("--variant", "variants", multiple=True, type=click.Choice([*NAMES, "attention"]),
              help="Graph variants to check [default: every variant in the directory, and attention where declared].")
@click.option("--atol", type=TOLERANCE, help="Absolute tolerance [default: per variant, see README].")
@click.option("--rtol", type=TOLERANCE, help="Relative tolerance [default: per variant].")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the random sweep inputs.")
@click.option("--sentences", type=click.IntRange(0, 10000), default=16, show_default=True, help="Test-split sentences to decode.")
@DATA_OPTION
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the full report as JSON.")
@click.option("--record", is_flag=True, help="Store a summary of the verdict in the directory's manifest.json.")
@click.option("--checkpoint", "checkpoint_path", type=click.Path(path_type=Path),
              help="Compare against this checkpoint (its weights digest must match the graphs' weights).")
@click.option("--expect-digest", help="Fail unless the graphs' weights have this weights_sha256 (from the checkpoint or a trusted manifest).")
def verify(model_dir, provider, runtime, variants, atol, rtol, seed, sentences, data_path, json_path, record, checkpoint_path, expect_digest):
    """Measure parity between PyTorch and ONNX Runtime (or OpenVINO); exit 1 on any failure.

    \b
    Example: tk verify exported/transformer --provider all --json report.json
             tk verify exported/transformer --runtime openvino
    """
    import time

    from toolkit import verify as v

    writable_file(json_path, "--json")
    if expect_digest is not None and not v.is_digest(expect_digest):
        raise UsageError(f"--expect-digest must be 64 hex digits (a weights_sha256), got {expect_digest!r}")
    start = time.time()
    report = v.verify(model_dir, provider, list(variants) or None, atol, rtol, seed, sentences,
                      echo=lambda m: click.echo(m, err=True), checkpoint=checkpoint_path, expect_digest=expect_digest,
                      runtime=runtime, data=data_path)
    click.echo(v.render(report))
    for p, why in report.skipped.items():
        click.echo(f"skipped provider {p}: {why}", err=True)
    if json_path:
        v.write_json(report, json_path)
    n = len(report.rows)
    seconds = time.time() - start
    click.echo(f"reference ({report.reference_kind}): {report.reference_proves}", err=True)
    click.echo(f"{n - len(report.failures)}/{n} checks passed in {seconds:.1f}s (seed {seed}, {report.runtime})", err=True)
    if record:
        keys = v.record_summary(report, model_dir, seconds)
        click.echo(f"recorded {', '.join(keys)} in {Path(model_dir) / 'manifest.json'} (other runtimes' and providers' records kept)", err=True)
    v.raise_on_failure(report)


@main.command()
@click.argument("text", nargs=-1)
@click.option("-i", "--input", "input_path", type=click.Path(path_type=Path), help="Read sentences from FILE, one per line ('-': standard input).")
@click.option("-o", "--output", "output_path", type=click.Path(path_type=Path), help="Write translations to FILE ('-': standard output).")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), envvar="TK_MODEL", default=DEFAULT_MODEL,
              show_default="exported/transformer", help="Exported model directory (or $TK_MODEL).")
@click.option("--provider", type=click.Choice(["cuda", "cpu"]), help="[default: cuda if it truly loads, else cpu]")
@click.option("--allow-cpu-fallback", is_flag=True, help="With --provider cuda, run on CPU instead of failing.")
@click.option("--variant", type=click.Choice(NAMES), default="fp32", show_default=True)
@click.option("--backend", type=click.Choice(["onnxruntime", "torch"]), default="onnxruntime", show_default=True,
              help="torch: decode with the PyTorch model through the same loop (needs torch; for comparison).")
@click.option("--runtime", type=click.Choice(["onnxruntime", "openvino"]), default="onnxruntime", show_default=True,
              help="Which engine runs the graphs (openvino: its CPU plugin; needs the openvino extra).")
@click.option("--batch-size", type=BATCH, default=64, show_default=True, help="Sentences per batch.")
@click.option("--max-tokens", type=POSITIVE, help="Or a budget of padded source tokens per batch.")
@click.option("--beam", type=BEAM, default=1, show_default=True, help="Beam size; 1 is greedy search.")
@click.option("--alpha", type=FiniteFloat(0.0, 10.0), default=0.6, show_default=True, help="Length penalty exponent for beam search.")
@click.option("--n-best", type=BEAM, default=1, show_default=True, help="Print N hypotheses per line as 'index ||| text ||| score'.")
@click.option("--max-len", type=POSITIVE, help="Longest translation in subword tokens [default: the model's maximum].")
@click.option("--max-len-a", type=FiniteFloat(0.0, 100.0), default=GUARDED["max_len_a"], show_default=True,
              help="Guard: an output is at most A * source tokens + B long (with --max-len-b).")
@click.option("--max-len-b", type=click.IntRange(0, 1000), default=GUARDED["max_len_b"], show_default=True, help="See --max-len-a.")
@click.option("--loop-guard/--no-loop-guard", default=GUARDED["loop_guard"], show_default=True,
              help="Stop a hypothesis whose last token repeats 4 times, or last 2-4 tokens 3 times.")
@click.option("--keep", multiple=True, metavar="TERM", help="Copy TERM verbatim, like URLs, e-mail addresses and numbers (repeatable).")
@click.option("--split/--no-split", default=True, show_default=True, help="Translate each sentence of a line separately.")
@click.option("--raw", is_flag=True, help="No input handling: no sentence splitting, capitals folding or placeholders.")
@click.option("--strict", is_flag=True, help="Refuse lines longer than the model's maximum instead of truncating them.")
@click.option("--reference", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Score the output against this file (one reference per line) with sacrebleu.")
@click.option("--threads", type=THREADS, help="ONNX Runtime intra-op threads [default: all cores].")
@click.option("--streams", type=STREAMS,
              help="Batches decoded at the same time, one thread each (CTranslate2's inter_threads) [default: one per core, up to 4].")
@click.option("-q", "--quiet", is_flag=True, help="No progress, provider or throughput lines on stderr.")
def translate(text, input_path, output_path, model_dir, provider, allow_cpu_fallback, variant, backend, runtime, batch_size, max_tokens, beam,
              alpha, n_best, max_len, max_len_a, max_len_b, loop_guard, keep, split, raw, strict, reference, threads, streams, quiet):
    """Translate English to French with the exported graphs (no PyTorch needed).

    Sentences come from arguments, -i FILE, or standard input, one per line;
    translations go out in the same order, one line each.

    Example: tk translate "I'm home." "He's calm."
    """
    # numpy's OpenBLAS starts a worker thread per extra core at import, which then busy-waits for
    # work for a while, taking a core from the rest of start-up; translating does no BLAS work.
    # (Only before numpy's import: afterwards it changes nothing here and would reach child processes.)
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    with paused_gc():
        from toolkit.api import decode_options
        from toolkit.textprep import TextOptions
        from toolkit.translate import AtomicOutput, open_model, read_lines, read_references, score_file, translate_lines

    say = (lambda m: None) if quiet else (lambda m: click.echo(m, err=True))
    if input_path is not None and str(input_path) == "-":
        input_path = None  # '-' is standard input, as for every Unix tool
    if output_path is not None and str(output_path) == "-":
        output_path = None
    if text and input_path:
        raise UsageError("give sentences as arguments or with -i FILE, not both")
    if n_best > beam:
        raise UsageError(f"--n-best must be between 1 and --beam (got beam {beam}, n-best {n_best})")  # before the model loads
    if input_path and not input_path.is_file():
        what = "is a directory" if input_path.is_dir() else "is not a regular file" if input_path.exists() else "does not exist"
        raise UsageError(f"input file {input_path} {what}; give a file of sentences, one per line")
    AtomicOutput.check(output_path)
    # Read (and decode) the references before translating, so a bad file fails in a second, not after the run.
    references = read_references(reference) if reference else None
    with paused_gc():
        t = open_model(model_dir, provider, variant, allow_cpu_fallback, threads, backend, runtime)
    if provider == "cuda" and t.provider != "cuda":
        say("warning: CUDA unavailable, running on CPU (--allow-cpu-fallback)")
    say(f"model {model_dir} ({t.manifest.model}, {variant}) on {t.where}; ready in {t.startup_s:.2f}s")
    if t.built_s:
        from toolkit.variants import export_flag

        say(f"built the {variant} graphs in memory from the fp32 graphs in {t.built_s:.2f}s "
            f"(`tk export {model_dir} {export_flag(variant)}` stores them)")
    opts = decode_options(t.manifest, beam=beam, alpha=alpha, n_best=n_best, max_len=max_len, batch_size=batch_size,
                          max_tokens=max_tokens, max_len_a=max_len_a, max_len_b=max_len_b, loop_guard=loop_guard,
                          streams=streams)
    text_opts = TextOptions(keep=tuple(keep), split=split, enabled=not raw)
    total = None
    if text:
        lines = iter(enumerate(text, 1))
        total = len(text)
    elif input_path:
        with open(input_path, "rb") as f:
            total = sum(1 for _ in f)
        stream = open(input_path, "rb")  # closed in the finally below, once streamed
        lines = read_lines(stream)
    else:
        lines = read_lines(sys.stdin.buffer)
    import signal
    import threading

    # SIGTERM stops like Ctrl-C: the temporary output is removed and the exit is 130.
    previous = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() else None
    out = AtomicOutput(output_path) if output_path else None
    collected: list[str] = []

    def write(line: str) -> None:
        if reference:
            collected.append(line)
        if out:
            out.write(line)
        else:
            click.echo(line)

    bar = None
    if not quiet and input_path:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="line", file=sys.stderr, dynamic_ncols=True, leave=False)
    try:
        # With a progress bar on stderr, warnings go above it instead of through it.
        warn = (lambda m: bar.write(m, file=sys.stderr)) if bar else say
        stats = translate_lines(t, lines, write, opts, strict, warn=warn, progress=bar.update if bar else lambda n: None, text=text_opts)
    except BaseException:
        if out:
            out.abort()
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if bar:
            bar.close()
        if input_path:
            stream.close()
    if out:
        out.commit()
    if references is not None:
        scores = score_file(collected, reference, references)
    rate = stats.sentences / stats.seconds if stats.seconds else 0.0
    say(f"{plural(stats.lines, 'line')}, {plural(stats.sentences, 'sentence')} in {stats.seconds:.2f}s: {rate:,.1f} sentences/s, "
        f"{stats.target_tokens / max(stats.seconds, 1e-9):,.0f} target tokens/s on {t.where}"
        + (f"; {plural(len(stats.truncated), 'line')} truncated" if stats.truncated else "")
        + (f"; {plural(len(stats.guarded), 'line')} ended by a guard" if stats.guarded else ""))
    if reference:
        click.echo(f"BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({scores['signature']})", err=True)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@main.command()
@click.argument("model_dir", type=click.Path(path_type=Path))
@DATA_OPTION
@click.option("--challenge", type=click.Path(exists=True, dir_okay=False), help="Tatoeba Challenge test file (eng-fra).")
@click.option("--beam", "beams", type=BEAM, multiple=True, help="Beam sizes to score [default: 1 and 4].")
@click.option("--limit", type=POSITIVE, help="Score only the first N sentences of each set.")
@click.option("--record", is_flag=True, help="Store the scores in the directory's manifest.json.")
@click.option("--threads", type=THREADS, help="ONNX Runtime intra-op threads [default: all cores].")
@click.option("--variant", type=click.Choice(NAMES), default="fp32", show_default=True,
              help="Which exported graphs to score (recorded per variant).")
@click.option("--robustness", is_flag=True,
              help="Instead: score the held-out split as people type it (no final punctuation, lowercase, capitals, "
                   "short phrases, names/numbers/URLs, several sentences per line) and the runaway rate.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the robustness sets.")
@click.option("--raw", is_flag=True, help="With --robustness: no input handling (as tk translate --raw), to measure what it adds.")
def evaluate(model_dir, data_path, challenge, beams, limit, record, threads, variant, robustness, seed, raw):
    """Score an exported model: BLEU and chrF (sacrebleu) on the test split and the Tatoeba Challenge set.

    Example: tk evaluate exported/transformer --challenge ../shared/data/tatoeba-test-eng-fra.txt
    """
    import json

    from toolkit import manifest as manifest_mod
    from toolkit.evaluate import evaluate_model, evaluate_robustness

    if robustness:
        from toolkit.robustness import table

        results = evaluate_robustness(model_dir, data_path, beams[0] if beams else 4, limit=limit, threads=threads,
                                      variant=variant, seed=seed, raw=raw, echo=lambda m: click.echo(m, err=True))
        click.echo(table(results))
        if record:
            manifest_mod.record_metric(model_dir, "robustness", variant, results)
        return
    scores = evaluate_model(model_dir, data_path, challenge, beams or (1, 4), limit=limit, threads=threads,
                            variant=variant, echo=lambda m: click.echo(m, err=True))
    click.echo(json.dumps(scores, indent=2))
    if record:
        manifest_mod.record_metric(model_dir, "evaluation", variant, scores)


@main.command()
@click.option("--model", "model_dir", type=click.Path(path_type=Path), default=DEFAULT_MODEL, show_default="exported/transformer")
@click.option("--sentences", type=click.IntRange(1, 100000), default=64, show_default=True, help="Held-out test sentences to decode.")
@click.option("--batch-size", "batch_sizes", type=BATCH, multiple=True, help="Batch sizes [default: 1 and 64].")
@click.option("--beam", "beams", type=BEAM, multiple=True, help="Beam sizes [default: 1 (greedy) and 4].")
@click.option("--no-textbook", is_flag=True, help="Skip the slow full-prefix PyTorch loop.")
@click.option("--repeat", type=click.IntRange(1, 1000), default=3, show_default=True,
              help="Timed runs per row, taken in turns across backends; the median is reported.")
@click.option("--variant", "variants", multiple=True, type=click.Choice(NAMES),
              help="Graph variants to time [default: fp32, the stored ones, and int8 on CPU / fp16 on CUDA, built in memory if not stored].")
@click.option("--runtime", "runtimes", multiple=True, type=click.Choice(["onnxruntime", "openvino"]),
              help="Runtimes to time, interleaved in one run (repeatable) [default: onnxruntime].")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the results as JSON.")
@click.option("--serve", is_flag=True, help="Load-test `tk serve` instead: --clients concurrent clients on loopback, dynamic batching vs off.")
@click.option("--clients", type=click.IntRange(min=1), default=32, show_default=True, help="With --serve: concurrent clients.")
@DATA_OPTION
@click.option("--threads", type=THREADS, help="ONNX Runtime intra-op threads [default: with --streams, measured first].")
@click.option("--streams", type=STREAMS, help="tk's concurrent decoding streams [default: the fastest (threads, streams) pair, measured first].")
@click.option("--ct2/--no-ct2", default=None, help="CTranslate2 float32 and int8 rows [default: when ctranslate2 is installed; the ct2 extra].")
@click.option("--ct2-threads", type=(THREADS, THREADS), metavar="INTRA INTER",
              help="CTranslate2 intra and inter threads [default: the fastest measured first].")
def bench(model_dir, sentences, batch_sizes, beams, no_textbook, repeat, variants, runtimes, json_path, serve, clients, data_path,
          threads, streams, ct2, ct2_threads):
    """Measure decoding speed of PyTorch (textbook and cached), ONNX Runtime (CPU, CUDA), OpenVINO and CTranslate2 side by side.

    With --serve: throughput and latency percentiles of `tk serve` under concurrent single-sentence
    requests, with dynamic batching and with batching off.

    \b
    Example: tk bench --model exported/transformer --sentences 64
             tk bench --serve --clients 32 --sentences 2048
    """
    import json
    import platform

    if serve and set(runtimes) - {"onnxruntime"}:
        raise UsageError("--serve load-tests `tk serve`, which runs on onnxruntime only; drop --runtime openvino")
    if serve:
        from toolkit.data import describe, load_corpus, references
        from toolkit.serve.load import bench_serve
        from toolkit.serve.load import table as load_table

        corpus = load_corpus(data_path, download=False)
        click.echo(describe(corpus), err=True)
        english, _ = references(corpus.splits["test"])
        args = [a for v in variants[:1] for a in ("--variant", v)]
        results = bench_serve(model_dir, english[:sentences], clients, (beams or (1,))[0], args, echo=lambda m: click.echo(m, err=True))
        click.echo(f"machine: {platform.machine()}, {os.cpu_count()} cores; clients and server share them; loopback")
        click.echo(load_table(results))
        if json_path:
            rows = [{**r.__dict__, "throughput": r.throughput} for r in results]
            json_path.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        return

    from toolkit import bench as b

    writable_file(json_path, "--json")
    notes: list[str] = []
    results = b.bench(model_dir, sentences, batch_sizes or (1, 64), beams or (1, 4), textbook=not no_textbook,
                      repeat=repeat, variants=list(variants) or None, echo=lambda m: click.echo(m, err=True),
                      runtimes=list(runtimes) or ["onnxruntime"], threads=threads, ct2=ct2, ct2_threads=ct2_threads, notes=notes, streams=streams,
                      data=data_path)
    for note in notes:
        click.echo(note)
    click.echo(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.system()}")
    click.echo(b.table(results))
    if any(r.backend.startswith("ctranslate2") for r in results):
        click.echo("\nCTranslate2 against tk (ONNX Runtime CPU), sentences/s:")
        click.echo(b.ct2_table(results))
    if json_path:
        rows = [{k: v for k, v in r.__dict__.items() if k != "outputs"} for r in results]
        json_path.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


@main.command()
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.argument("text", nargs=-1)
@click.option("-o", "--output", "output_path", type=click.Path(path_type=Path),
              help="PNG to write [default: attention-MODEL.png]; the Transformer writes PNG-encoder, -decoder-self and -cross.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Also write the weights and tokens as JSON.")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
def attention(model_dir, text, output_path, json_path, provider):
    """Draw attention heatmaps from the exported graphs (no PyTorch needed; needs the plot extra).

    Translation models translate the sentence with the attention variant of their graphs and draw
    each output piece's attention; exported/nw draws its attention weights and regression fit.

    \b
    Example: tk attention exported/transformer "I'm home." -o docs/attention.png
             tk attention exported/nw -o docs/nw.png
    """
    import json

    from toolkit import attention_graphs, manifest, pictures

    m = manifest.load(model_dir)
    out = output_path or Path(f"attention-{m.model}.png")
    if m.model == "nw":
        if text:
            raise UsageError("exported/nw takes no sentence: it draws its test grid's attention over its training points")
        nw = attention_graphs.nadaraya_watson(model_dir)
        drawn = [pictures.nadaraya_watson_figure(nw, out)]
        payload = {k: v.tolist() for k, v in nw.items()}
    else:
        if len(text) != 1:
            raise UsageError("give one English sentence, in quotes: tk attention exported/transformer \"I'm home.\"")
        result = attention_graphs.translate(model_dir, list(text), provider)[0]
        click.echo(f"{result.sentence} -> {result.translation}", err=True)
        for piece, source, weight in attention_graphs.alignment(result):
            click.echo(f"  {piece:<16} <- {source:<16} {weight:.2f}", err=True)
        drawn = pictures.translation_figures(result, out)
        payload = result.to_json()
    if json_path:
        json_path.write_text(json.dumps(payload) + "\n", encoding="utf-8")
        drawn.append(json_path)
    for path in drawn:
        click.echo(f"wrote {path} ({path.stat().st_size / 1024:,.0f} KiB)")


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", "output_path", type=click.Path(path_type=Path), help="PNG to write [default: RUN_DIR/history.png].")
def plot(run_dir, output_path):
    """Draw the loss curves that `tk train` recorded in RUN_DIR/history.json.

    Example: tk plot runs/tiny
    """
    from toolkit import history, pictures

    data = history.read(run_dir)
    path = pictures.training_figure(data["epochs"], f"{data.get('model', '')}: {run_dir}", output_path or Path(run_dir) / "history.png")
    click.echo(f"wrote {path} ({len(data['epochs'])} epochs)")


@main.command()
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--provider", type=click.Choice(["cuda", "cpu"]), help="[default: cuda if it truly loads, else cpu]")
@click.option("--variant", type=click.Choice(NAMES), default="fp32", show_default=True)
@click.option("--threads", type=int, help="ONNX Runtime intra-op threads [default: all cores].")
@click.option("--max-delay-ms", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="How long the oldest queued sentence waits for others to share its decode.")
@click.option("--max-batch-tokens", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Padded source tokens per decode (longest sentence x sentences).")
@click.option("--max-batch-sentences", type=click.IntRange(min=1), default=64, show_default=True, help="Sentences per decode.")
@click.option("--no-batching", is_flag=True, help="Decode one sentence at a time (the baseline for comparisons).")
@click.option("--queue-size", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Sentences waiting over all requests; beyond it requests get 503 with Retry-After.")
@click.option("--max-sentences", type=click.IntRange(min=1), default=64, show_default=True, help="Sentences per request (413 beyond).")
@click.option("--max-chars", type=click.IntRange(min=1), default=1000, show_default=True, help="Characters per sentence (413 beyond).")
@click.option("--timeout-s", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              help="Per-request limit, queueing included (504 beyond).")
def serve(model_dir, host, port, provider, variant, threads, max_delay_ms, max_batch_tokens, max_batch_sentences, no_batching,
          queue_size, max_sentences, max_chars, timeout_s):
    """Serve translations over HTTP: POST /v1/translate, a web page at /, /health, /ready, /metrics.

    Sentences of concurrent requests are decoded together by one worker. Needs the serve
    extra: pip install -e '.[serve]'.

    Example: tk serve exported/transformer --port 8000
    """
    try:
        from toolkit.serve.app import ServeConfig
        from toolkit.serve.batcher import BatchPolicy
        from toolkit.serve.server import serve as run
    except ImportError as e:
        raise UsageError(f"tk serve needs {e.name}; install the serve extra: pip install -e '.[serve]'") from None
    from toolkit.translate import open_model

    t = open_model(model_dir, provider, variant, threads=threads)
    policy = BatchPolicy(max_tokens=max_batch_tokens, max_sentences=max_batch_sentences, max_delay_s=max_delay_ms / 1000,
                         queue_size=queue_size, batching=not no_batching)
    desc = f"{Path(model_dir).name} ({t.manifest.model}, {variant}) on {t.provider}" + (", batching off" if no_batching else "")
    config = ServeConfig(policy=policy, max_sentences=max_sentences, max_chars=max_chars, timeout_s=timeout_s, description=desc)
    run(lambda: t, host, port, config)


@main.command("translate-corpus")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.argument("inputs", nargs=-1, required=True)
@click.argument("output_dir", type=click.Path(path_type=Path))
@click.option("--address", help="Ray cluster to run on: auto (the one this node belongs to) or ray://HEAD:10001 "
              "[default: a local Ray instance on this machine].")
@click.option("--workers", type=click.IntRange(1, 4096), default=1, show_default=True, help="Actors, each with its own sessions.")
@click.option("--threads", type=THREADS, help="ONNX Runtime threads per actor [default: a node's cores / its actors].")
@click.option("--shard-lines", type=click.IntRange(1, 10_000_000), default=4096, show_default=True,
              help="Lines per shard (a multiple of 2048 batches lines exactly as tk translate -i does).")
@click.option("--column", help="The text column of Parquet inputs.")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: each actor requests one GPU.")
@click.option("--variant", type=click.Choice(["fp32", "fp16", "optimized", "int8"]), default="fp32", show_default=True)
@click.option("--batch-size", type=BATCH, default=64, show_default=True, help="Sentences per batch.")
@click.option("--max-tokens", type=POSITIVE, help="Or a budget of padded source tokens per batch.")
@click.option("--beam", type=BEAM, default=1, show_default=True, help="Beam size; 1 is greedy search.")
@click.option("--alpha", type=FiniteFloat(0.0, 10.0), default=0.6, show_default=True, help="Length penalty exponent for beam search.")
@click.option("--max-len", type=POSITIVE, help="Longest translation in subword tokens [default: the model's maximum].")
@click.option("--max-len-a", type=FiniteFloat(0.0, 100.0), default=GUARDED["max_len_a"], show_default=True,
              help="Guard: an output is at most A * source tokens + B long (with --max-len-b).")
@click.option("--max-len-b", type=click.IntRange(0, 1000), default=GUARDED["max_len_b"], show_default=True, help="See --max-len-a.")
@click.option("--loop-guard/--no-loop-guard", default=GUARDED["loop_guard"], show_default=True, help="As for tk translate.")
@click.option("--keep", multiple=True, metavar="TERM", help="Copy TERM verbatim (repeatable).")
@click.option("--split/--no-split", default=True, show_default=True, help="Translate each sentence of a line separately.")
@click.option("--raw", is_flag=True, help="No input handling, as tk translate --raw.")
@click.option("--strict", is_flag=True, help="Fail the shard of a line longer than the model's maximum instead of truncating it.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")
@click.option("--progress-seconds", type=FiniteFloat(0.1, 3600.0), default=10.0, show_default=True,
              help="Longest wait between two progress lines while shards run.")
def translate_corpus(model_dir, inputs, output_dir, address, workers, threads, shard_lines, column, provider, variant, batch_size,
                     max_tokens, beam, alpha, max_len, max_len_a, max_len_b, loop_guard, keep, split, raw, strict, quiet, progress_seconds):
    """Translate a corpus on Ray Data: shards, one ordered output file, resumable.

    INPUTS are text files (one sentence per line), directories or globs of them, or Parquet files
    (with --column). OUTPUT_DIR gets one file per shard, corpus.json (the shards' ranges, digests and
    status) and translations.txt (every line, in input order). Rerunning the same command skips the
    shards already done. Needs the ray extra: pip install -e '.[ray]'.

    Example: tk translate-corpus exported/transformer corpus/*.txt out --workers 2
    """
    try:
        import ray.data  # noqa: F401  (only to tell a missing extra apart from any later problem)
    except ImportError as e:
        raise UsageError(f"tk translate-corpus needs {e.name}; install the ray extra: pip install -e '.[ray]'") from None
    from toolkit import manifest as manifest_mod
    from toolkit.corpus.run import CorpusJob
    from toolkit.corpus.run import translate_corpus as run

    say = (lambda m: None) if quiet else (lambda m: click.echo(m, err=True))
    m = manifest_mod.load(model_dir)
    m.translation_tokenizer()
    decode = {"beam": beam, "alpha": alpha, "n_best": 1, "max_len": min(max_len or m.max_len, m.max_len), "batch_size": batch_size,
              "max_tokens": max_tokens, "max_src_len": m.max_len, "max_len_a": max_len_a, "max_len_b": max_len_b,
              "loop_guard": loop_guard}
    text = {"keep": tuple(keep), "split": split, "enabled": not raw}
    # What changes a translation: a rerun into the same OUTPUT_DIR must agree on all of it.
    import hashlib
    import json

    model_sha256 = hashlib.sha256(json.dumps(m.files(), sort_keys=True).encode()).hexdigest()  # every file's digest
    settings = {"model": str(Path(model_dir).resolve()), "model_files_sha256": model_sha256, "variant": variant,
                **{k: v for k, v in decode.items()}, "keep": list(keep), "split": split, "raw": raw, "strict": strict}
    job = CorpusJob(str(model_dir), list(inputs), output_dir, settings, decode, text, strict, provider, variant, workers, threads,
                    shard_lines, column, address, progress_seconds)
    result = run(job, say)
    rate = f", {result.lines_per_s:,.1f} lines/s" if result.resumed < result.shards else ""
    say(f"wrote {result.merged}: {result.lines:,} lines from {result.shards} shards ({result.resumed} done earlier) "
        f"in {result.seconds:.1f}s{rate}")


if __name__ == "__main__":
    main()
