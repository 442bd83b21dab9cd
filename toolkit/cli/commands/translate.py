"""`tk translate`."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import click

from toolkit.cli.commands.options import (
    DECODING,
    DEFAULT_FAST_VARIANT,
    DEFAULT_MODEL,
    DEFAULT_RUNTIME,
    LANGUAGES,
    PROVIDER,
    TEXT,
    THREADS,
    FiniteFloat,
    declared_option,
    paused_gc,
    plural,
    read_glossary,
    runtime_option,
    shortlist_option,
)
from toolkit.core.decode_options import DECLARED
from toolkit.core.errors import UsageError


# Over 60 lines: a command's checks of its 26 options come before any model loads (one-line errors in a second),
# then one streaming run whose output file is committed or removed in the same frame.
@click.command()
@click.argument("text", nargs=-1)
@click.option("-i", "--input", "input_path", type=click.Path(path_type=Path),
              help="Read sentences from FILE, one per line ('-': standard input); a .docx, .srt or .html FILE is translated whole, "
                   "its structure kept.")
@click.option("-o", "--output", "output_path", type=click.Path(path_type=Path), help="Write translations to FILE ('-': standard output).")
@click.option("--model", "model_dir", type=click.Path(path_type=Path), envvar="TK_MODEL", default=DEFAULT_MODEL,
              show_default="exported/transformer", help="Exported model directory (or $TK_MODEL).")
@PROVIDER
@click.option("--allow-cpu-fallback", is_flag=True, help="With --provider cuda, run on CPU instead of failing.")
@DEFAULT_FAST_VARIANT
@click.option("--backend", type=click.Choice([DEFAULT_RUNTIME, "torch"]), default=DEFAULT_RUNTIME, show_default=True,
              help="torch: decode with the PyTorch model through the same loop (needs torch; for comparison).")
@runtime_option()
@DECODING
@TEXT
@declared_option(DECLARED["n_best"], "translate")
@click.option("--reference", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Score the output against this file (one reference per line) with sacrebleu.")
@click.option("--threads", type=THREADS, help="ONNX Runtime intra-op threads per session [default: the cores / the default streams].")
@declared_option(DECLARED["streams"], "translate")
@click.option("--format", "text_format", type=click.Choice(["text", "html"]), default="text", show_default=True,
              help="html: each line is an HTML fragment; its text is translated and its markup kept in place.")
@click.option("-q", "--quiet", is_flag=True, help="No progress, provider or throughput lines on stderr.")
@click.option("--confidence", is_flag=True,
              help="Print each translation's confidence after a tab (with --n-best, after ' ||| '): 0 to 1, the estimated chance "
                   "that it scores chrF 50 or more against a human translation; low: a line to check. From the model "
                   "directory's calibration (`tk evaluate DIR --calibrate`), else a fixed uncalibrated map; stderr says which.")
@click.option("--min-confidence", type=FiniteFloat(0.0, 1.0), metavar="X",
              help="Name on stderr, in one warning line, the lines whose confidence is below X (0 to 1); the output is unchanged.")
@shortlist_option()
@LANGUAGES
def translate(text, input_path, output_path, model_dir, provider, allow_cpu_fallback, variant, backend, runtime, decoding, keep, glossary,
              split, raw, strict, n_best, reference, threads, streams, text_format, quiet, confidence, min_confidence, shortlist, languages):
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
        from toolkit.core.decode_options import DecodeOptions, max_len_problem
        from toolkit.core.textprep import TextOptions
        from toolkit.deploy.translate import AtomicOutput, open_model, read_lines, read_references, score_file, translate_lines

    say = (lambda m: None) if quiet else (lambda m: click.echo(m, err=True))
    if input_path is not None and str(input_path) == "-":
        input_path = None  # '-' is standard input, as for every Unix tool
    if output_path is not None and str(output_path) == "-":
        output_path = None
    if text and input_path:
        raise UsageError("give sentences as arguments or with -i FILE, not both")
    for i, sentence in enumerate(text, 1):
        if _undecodable(sentence):  # the shell passed bytes that are not UTF-8 (Python keeps them as surrogates)
            raise UsageError(f"argument {i} is not valid UTF-8 text; pass UTF-8, or the lines in a UTF-8 file with -i FILE")
    if text_format == "html" and n_best > 1:
        raise UsageError("--n-best gives several translations of a sentence, which an HTML fragment cannot hold; "
                         "drop --n-best or --format html")
    if not text and not input_path and sys.stdin is None:
        raise UsageError("standard input is closed; give sentences as arguments or with -i FILE")
    # Every decoding option checked before the model loads (--n-best above --beam fails in a second); built for the model below.
    DecodeOptions.for_model(1, n_best=n_best, streams=streams, **decoding)
    terms = read_glossary(glossary, raw)
    if input_path and not input_path.is_file():
        what = "is a directory" if input_path.is_dir() else "is not a regular file" if input_path.exists() else "does not exist"
        raise UsageError(f"input file {input_path} {what}; give a file of sentences, one per line")
    AtomicOutput.check(output_path)
    # A .docx, .srt or .html file is translated whole, its structure kept: checked and cut before the model loads.
    document = _document(input_path, output_path, n_best, reference)
    if (confidence or min_confidence is not None) and (document is not None or text_format == "html"):
        what = "--confidence" if confidence else "--min-confidence"
        raise UsageError(f"{what} rates lines of text; HTML and documents are translated in pieces: drop {what} or --format html"
                         if document is None else f"{what} rates lines of text; {input_path} is translated whole as a document: drop {what}")
    # Read (and decode) the references before translating, so a bad file fails in a second, not after the run.
    references = read_references(reference) if reference else None
    reference_backends = None
    if backend != DEFAULT_RUNTIME:  # the PyTorch model through the same loop, on the torch side
        if runtime != DEFAULT_RUNTIME:
            raise UsageError(f"--backend torch decodes with PyTorch, not with a runtime; drop --runtime {runtime} or --backend torch")
        from toolkit.pytorch.torch_backend import reference_backends
    with paused_gc():
        t = open_model(model_dir, provider, variant, allow_cpu_fallback, threads, runtime, reference_backends, shortlist=shortlist)
    if provider == "cuda" and t.provider != "cuda":
        say("warning: CUDA unavailable, running on CPU (--allow-cpu-fallback)")
    say(f"model {model_dir} ({t.manifest.model}, {t.variant}{', shortlist' if shortlist else ''}) on {t.where}; ready in {t.startup_s:.2f}s")
    if t.note:
        click.echo(f"warning: {t.note}", err=True)
    t = t.for_languages(**languages)  # the source code on each sentence, the target forced first
    if t.built_s:
        from toolkit.core.variants import export_flag

        say(f"built the {t.variant} graphs in memory from the fp32 graphs in {t.built_s:.2f}s, kept for later starts "
            f"(`tk export {model_dir} {export_flag(t.variant)}` stores them)")
    problem = max_len_problem(decoding["max_len"], t.manifest.max_len)
    if problem:
        raise UsageError(problem)
    opts = DecodeOptions.for_manifest(t.manifest, t.provider, n_best=n_best, streams=streams, **decoding)
    text_opts = TextOptions(keep=tuple(keep), split=split, enabled=not raw, glossary=terms)
    if document is not None:
        _translate_document(t, document, output_path, opts, strict, text_opts, say)
        return
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
    # Ctrl-C and SIGTERM (toolkit.core.signals) raise KeyboardInterrupt: the temporary output is removed, exit 130.
    out = AtomicOutput(output_path) if output_path else None
    collected: list[str] = []

    def write(line: str) -> None:
        if reference:
            collected.append(line.rpartition("\t")[0] if confidence else line)  # scored without the confidence column
        if out:
            out.write(line)
        else:
            click.echo(line)

    bar = None
    # A file's bar knows its total; standard input's counts lines as they go (shown to a person at a terminal only, so a
    # pipeline's stderr stays free of it).
    if not quiet and (input_path or (not text and sys.stderr.isatty())):
        from tqdm import tqdm

        bar = tqdm(total=total, unit="line", file=sys.stderr, dynamic_ncols=True, leave=False)
    try:
        # With a progress bar on stderr, warnings go above it instead of through it.
        warn = (lambda m: bar.write(m, file=sys.stderr)) if bar else say
        if text_format == "html":
            from toolkit.deploy.markup import translate_html_lines as translate_lines
        rated = {"confidence": confidence, "min_confidence": min_confidence} if confidence or min_confidence is not None else {}
        if rated:
            from toolkit.core.confidence import for_manifest

            warn(for_manifest(t.manifest).describe())
        stats = translate_lines(t, lines, write, opts, strict, warn=warn, progress=bar.update if bar else lambda n: None, text=text_opts,
                                **rated)
    except BaseException:
        if out:
            out.abort()
        raise
    finally:
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
        + (f"; {plural(len(stats.guarded), 'line')} ended by a guard" if stats.guarded else "")
        + (f"; {plural(len(stats.repaired), 'line')} with protected spans put back by the fallback" if stats.repaired else "")
        + (f"; {plural(len(stats.failed), 'line')} that tk failed on, each named above" if stats.failed else ""))
    if reference:
        click.echo(f"BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({scores['signature']})", err=True)
    if stats.low_confidence:  # asked for by name: said even with --quiet
        click.echo(f"warning: {plural(len(stats.low_confidence), 'line')} with a confidence below {min_confidence:g}, to check: "
                   f"{', '.join(map(str, stats.low_confidence))}", err=True)


def _document(input_path: Path | None, output_path: Path | None, n_best: int, reference: Path | None):
    """The input file checked and cut into a files.Document where it is one translated whole (a .docx; a .srt or .html
    unless --format says how to read its lines), else None: lines, as any other file."""
    if input_path is None:
        return None
    from toolkit.deploy import files

    kind = files.KINDS.get(input_path.suffix.lower())
    explicit = click.get_current_context().get_parameter_source("text_format") != click.core.ParameterSource.DEFAULT
    if kind == "docx" and explicit:
        raise UsageError(f"--format reads lines; {input_path} is a Word document, translated whole: drop --format")
    if kind not in ("docx", "srt", "html") or explicit:
        return None
    if n_best > 1 or reference:
        raise UsageError(f"--n-best and --reference work on lines; {input_path} is translated whole as a .{kind} file: drop them")
    if kind == "docx" and output_path is None:
        raise UsageError(f"the translation of {input_path} is a .docx file, not text for a terminal: give -o FILE.docx")
    if output_path is not None:
        files.check_destination(input_path, output_path)
    return files.read_file(input_path, kind)


def _translate_document(t, document, output_path: Path | None, opts, strict: bool, text_opts, say) -> None:
    """Translates a files.Document's texts in one length-sorted batch (warnings name each text's place in the file) and
    writes the file to output_path, or to standard output."""
    from toolkit.deploy.translate import Stats, translate_batch

    stats, start = Stats(), time.perf_counter()

    def warn(message: str) -> None:  # translate_batch numbers its texts as lines from 1: name their places instead
        say(re.sub(r"^warning: line (\d+)", lambda m: f"warning: {document.name} {document.places[int(m.group(1)) - 1]}", message))

    results = translate_batch(t, document.texts, opts, None, warn, strict, 1, stats.truncated, text_opts, stats.guarded,
                              stats.repaired, stats.failed) if document.texts else []
    translations = [n[0].text for n in results]
    if output_path is not None:
        document.save(output_path, translations)
    else:
        sys.stdout.flush()  # what was written as text goes out first
        sys.stdout.buffer.write(document.render(translations))
        sys.stdout.buffer.flush()
    seconds = time.perf_counter() - start
    say(f"{document.name}: {plural(len(document.texts), 'text')}, {plural(sum(n[0].sentences for n in results), 'sentence')} "
        f"in {seconds:.2f}s on {t.where}" + (f"; {plural(len(stats.truncated), 'text')} truncated" if stats.truncated else ""))


def _undecodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
