"""`tk translate`: streaming, length-batched translation with the exported graphs alone.

Imports onnxruntime, numpy and sentencepiece; never torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

from toolkit.core import manifest as manifest_mod
from toolkit.core import placeholders, textprep
from toolkit.core.atomic import AtomicWriter, check_output_path
from toolkit.core.batching import DecodeOptions, decode_ids, default_request_threads, default_threads, fitting_streams
from toolkit.core.errors import DataError, UsageError, describe_os_error
from toolkit.core.textprep import TextOptions
from toolkit.core.tokenizer import Tokenizer
from toolkit.core.tokenizers import MarianTokenizer, open_tokenizer
from toolkit.core.variants import FAST_PLAIN, PLAIN
from toolkit.runtimes import onnxruntime as ort_runtime

CHUNK_LINES = 2048  # lines read, sorted and translated at a time: bounds memory on any input size


@dataclass
class TranslationModel:
    """An exported model directory, loaded for translation on one backend."""

    manifest: manifest_mod.Manifest
    tokenizer: Tokenizer | MarianTokenizer
    backend: Callable[[], object]  # a fresh step backend for the shared decoding loop
    provider: str  # "cpu" or "cuda" for ONNX Runtime, "torch" for the PyTorch reference
    startup_s: float
    built_s: float = 0.0  # of startup_s, the time spent building a variant the directory does not store
    runtime: str = "onnxruntime"  # which engine runs the graphs (toolkit.runtimes); "torch" for the reference
    threads: int | None = None  # intra-op threads of each CPU session (None: not a CPU ONNX Runtime session)
    variant: str = "fp32"  # the graphs it runs (toolkit.core.variants)

    @property
    def where(self) -> str:
        """Device and runtime, as output states them: 'cpu (onnxruntime 1.31.0)'."""
        from toolkit import runtimes

        return self.provider if self.runtime == "torch" else f"{self.provider} ({runtimes.label(self.runtime)})"


def open_model(directory: str | Path, provider: str | None = None, variant: str | None = "fp32",
               allow_fallback: bool = False, threads: int | None = None, backend: str = "onnxruntime",
               runtime: str = "onnxruntime") -> TranslationModel:
    """Loads and checks a model directory. provider None: CUDA if it truly loads, else CPU
    (on ONNX Runtime; OpenVINO runs on its CPU plugin). variant None: the fastest graphs that compute
    what the fp32 graphs compute on that provider (variants.FAST_PLAIN: the attention-fused
    "optimized" graphs on CPU, built once and kept in the start-up cache).

    backend "torch" decodes with the PyTorch model through the same loop (for comparison; it needs torch and the
    model code, which the ONNX Runtime path never imports: import toolkit.pytorch.torch_backend first, which puts
    it behind toolkit.runtimes.load).
    """
    from toolkit import runtimes

    runtimes.check(runtime)
    if backend == "torch" and runtime != "onnxruntime":
        raise UsageError(f"--backend torch decodes with PyTorch, not with a runtime; drop --runtime {runtime} or --backend torch")
    start = time.perf_counter()
    m = manifest_mod.load(directory)
    m.translation_tokenizer()
    m.check_files(cached=True)
    tokenizer = open_tokenizer(m)
    if backend == "torch":  # registered by toolkit.pytorch.torch_backend, which the caller imports (the torch side)
        loaded = runtimes.load(m, "torch")
        return TranslationModel(m, tokenizer, loaded.backend, "torch", time.perf_counter() - start, runtime="torch")
    if provider is None:
        provider = "cuda" if runtime == "onnxruntime" and ort_runtime.cuda_available() else "cpu"
    if variant is None:
        # Same translations as fp32 (verify demands it of "optimized"); fewer nodes a step: one sentence
        # per call, first 200 Tatoeba Challenge sentences, 12.9 ms -> 11.7 ms; a 2,000-line file 3.03 -> 2.96 s.
        variant = FAST_PLAIN[provider] if runtime == "onnxruntime" else PLAIN
    request_threads = None
    if threads is None and provider == "cpu" and runtime == "onnxruntime":
        threads = default_threads()  # never all cores per session: the default streams share them
        request_threads = default_request_threads()  # a call of one batch has the cores to itself
    loaded = runtimes.load(m, runtime, provider, variant, allow_fallback, threads, cache=True, request_threads=request_threads)
    specs = m.specs()
    for name, session in loaded.sessions.items():  # none where a runtime reads a converted copy (CTranslate2)
        spec = specs[name]
        got = [i.name for i in session.get_inputs()]
        if got != spec.input_names:
            raise UsageError(f"{name} graph inputs {got} do not match manifest.json {spec.input_names}; re-export {directory}")
        # Outputs too: another model's graph can take the same inputs (a GRU encoder in a Transformer's place).
        outputs = [o.name for o in session.get_outputs()] if hasattr(session, "get_outputs") else None
        if outputs is not None and outputs != spec.output_names:
            raise UsageError(f"{name} graph outputs {outputs} do not match manifest.json {spec.output_names}; re-export {directory}")
    return TranslationModel(m, tokenizer, loaded.backend, loaded.provider, time.perf_counter() - start, loaded.built_s, runtime,
                            threads if loaded.provider == "cpu" and runtime == "onnxruntime" else None, variant)


@dataclass
class Stats:
    lines: int = 0
    sentences: int = 0
    target_tokens: int = 0
    truncated: list[int] = field(default_factory=list)  # line numbers whose input was cut to the model's maximum
    guarded: list[int] = field(default_factory=list)  # line numbers whose output a length or loop guard ended
    repaired: list[int] = field(default_factory=list)  # line numbers whose protected spans the model did not copy exactly once
    seconds: float = 0.0


def read_lines(stream: BinaryIO) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line; a non-UTF-8 line is an error naming its number."""
    for lineno, raw in enumerate(stream, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"input line {lineno} is not valid UTF-8 (byte {e.start}); convert the file to UTF-8") from None
        yield lineno, text.rstrip("\r\n")


def chunks(lines: Iterable[tuple[int, str]], size: int) -> Iterator[list[tuple[int, str]]]:
    chunk = []
    for item in lines:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@dataclass
class Translation:
    """One hypothesis for one input text."""

    text: str
    score: float  # log-probability, length-normalised with the options' alpha
    tokens: int  # target subword tokens
    source_tokens: int  # after truncation to the model's maximum; 0 for an empty line
    sentences: int = 0  # sentences decoded for it (a line may hold several; an empty one none)
    stopped: str = ""  # "length" or "loop" when a guard ended one of its sentences (decoding.Hypothesis.stopped)


def translate_batch(t: TranslationModel, texts: list[str], opts: DecodeOptions, backend: object | None = None,
                    warn: Callable[[str], None] = lambda s: None, strict: bool = False,
                    first_lineno: int = 1, truncated: list[int] | None = None,
                    text: TextOptions = TextOptions(), guarded: list[int] | None = None,
                    repaired: list[int] | None = None) -> list[list[Translation]]:
    """The n-best translations of each text, in input order: the one entry point from text to text that `tk translate`,
    `tk evaluate`, the server and corpus translation share.

    Each line is cleaned and split into sentences (toolkit.core.textprep), all sentences of all lines are decoded in one
    length-sorted batch, and each line's sentences are joined back. A sentence longer than the model's maximum is
    truncated with a warning naming its line (its number is appended to `truncated`), or refused with strict. A best
    translation that a length or loop guard ended is warned about the same way (its line number appended to `guarded`),
    and so is a best translation whose protected spans (numbers, URLs, e-mail addresses, kept terms) the model did not
    copy exactly once: each is put back exactly once all the same (placeholders.restore), its line number in `repaired`.
    """
    backend = backend or t.backend()
    limit = t.manifest.max_len
    # The model's own rules, however opts were made; sources cut to its positions (by decode_ids, there only); no more
    # busy threads than cores, whatever streams were asked for.
    rules = t.manifest.rules()
    opts = dataclasses.replace(opts, max_src_len=min(opts.max_src_len or limit, limit), rules=rules,
                               streams=fitting_streams(opts.streams, t.threads) if t.threads else opts.streams)
    alpha = rules.alpha if opts.alpha is None else opts.alpha
    segments = _segments(t.manifest, texts, text)
    flat = [(i, seg) for i, segs in enumerate(segments) for seg in segs]
    ids = t.tokenizer.encode([seg.text for _, seg in flat])
    for k, seq in enumerate(ids):
        if len(seq) > limit:
            lineno = first_lineno + flat[k][0]
            if strict:
                raise DataError(f"input line {lineno} has a sentence of {len(seq)} tokens, more than the model's {limit}; "
                                "split it or drop --strict to truncate")
            warn(f"warning: line {lineno} has a sentence of {len(seq)} tokens; truncated to the model's maximum of {limit}")
            if truncated is not None and lineno not in truncated:
                truncated.append(lineno)
    per_line: list[list[tuple[textprep.Segment, list[Translation]]]] = [[] for _ in texts]
    results = decode_ids(backend, ids, opts)
    # One SentencePiece call for every hypothesis: one per sentence cost 3% of a 2,000-line file.
    texts_out = iter(t.tokenizer.decode([h.tokens for nbest in results for h in nbest]))
    for (i, seg), seq, nbest in zip(flat, ids, results):
        decoded = [next(texts_out) for _ in nbest]
        source_tokens = min(len(seq), opts.max_src_len)  # as decode_ids cut it
        if nbest[0].stopped and seq:
            lineno = first_lineno + i
            warn(f"warning: line {lineno}: {guard_note(nbest[0], source_tokens, opts)}")
            if guarded is not None and lineno not in guarded:
                guarded.append(lineno)
        per_line[i].append((seg, [Translation(out, rules.normalized(h.score, len(h.tokens), alpha, not h.stopped), len(h.tokens), source_tokens,
                                              int(bool(seq)), h.stopped)
                                  for h, out in zip(nbest, decoded)]))
    out = []
    for i, parts in enumerate(per_line):
        report: list[placeholders.Repair] = []
        out.append(_join_line(parts, opts.n_best, report))
        if report:
            lineno = first_lineno + i
            warn(f"warning: line {lineno}: {repair_note(report)}")
            if repaired is not None and lineno not in repaired:
                repaired.append(lineno)
    return out


def _segments(m: manifest_mod.Manifest, texts: list[str], text: TextOptions) -> list[list[textprep.Segment]]:
    """Each line's model inputs: cleaned and split, and protected by placeholders only for a model trained on them."""
    protect = m.declared().placeholders
    if text.keep and not protect:
        raise UsageError(f"--keep protects terms with tk's placeholders, which this {m.model} model was not trained to copy")
    return [textprep.prepare(x, text.keep, text.split, text.enabled, protect) for x in texts]


def repair_note(report: list[placeholders.Repair]) -> str:
    """What restoring a line's protected spans had to put right, in one line."""
    shown = "; ".join(map(str, report[:3])) + (f"; {len(report) - 3} more" if len(report) > 3 else "")
    return f"the model did not copy every protected span (number, URL, e-mail, --keep term) exactly once: {shown}"


def guard_note(h, source_tokens: int, opts: DecodeOptions) -> str:
    """Which guard ended a translation, and how to lift it."""
    from toolkit.core.decoding import length_limits

    if h.stopped == "loop":
        return (f"the loop guard ended its translation after {len(h.tokens)} tokens (it began repeating itself); "
                "--no-loop-guard turns it off")
    limit = int(length_limits([[0] * source_tokens], opts.max_len, opts.max_len_a, opts.max_len_b)[0])
    if opts.max_len_a is not None and limit < opts.max_len:
        return (f"the length guard ended its translation at {limit} tokens ({opts.max_len_a:g} x {source_tokens} source "
                f"tokens + {opts.max_len_b}); it may be cut short: raise --max-len-a or --max-len-b")
    return f"the length limit ended its translation at {limit} tokens; it may be cut short: raise --max-len up to the model's maximum"


def _join_line(parts: list[tuple[textprep.Segment, list[Translation]]], n_best: int,
               report: list[placeholders.Repair] | None = None) -> list[Translation]:
    """A line's n-best: the k-th entry joins each sentence's k-th best (its last, if it has fewer);
    its score is the mean of theirs. What restoring the best one's spans repaired goes to `report`."""
    if not parts:
        return [Translation("", 0.0, 0, 0)]
    out = []
    for k in range(max(1, min(n_best, max(len(h) for _, h in parts)))):
        picks = [(seg, hyps[min(k, len(hyps) - 1)]) for seg, hyps in parts]
        out.append(Translation(textprep.join([textprep.finish(seg, h.text, report if k == 0 else None) for seg, h in picks]),
                               sum(h.score for _, h in picks) / len(picks), sum(h.tokens for _, h in picks),
                               sum(h.source_tokens for _, h in picks), sum(h.sentences for _, h in picks),
                               next((h.stopped for _, h in picks if h.stopped), "")))
    return out


def translate_lines(t: TranslationModel, lines: Iterable[tuple[int, str]], write: Callable[[str], None], opts: DecodeOptions,
                    strict: bool = False, warn: Callable[[str], None] = lambda s: None,
                    progress: Callable[[int], None] = lambda n: None, text: TextOptions = TextOptions(),
                    chunk_lines: int = CHUNK_LINES) -> Stats:
    """Translates line by line in input order; one output line (or n-best block) per input line.
    `progress` gets the number of lines of each chunk of `chunk_lines` as it is written."""
    stats = Stats()
    start = time.perf_counter()
    backend = t.backend()
    for chunk in chunks(lines, chunk_lines):
        texts = [text for _, text in chunk]
        results = translate_batch(t, texts, opts, backend, warn, strict, chunk[0][0], stats.truncated, text, stats.guarded,
                                  stats.repaired)
        for (lineno, _), nbest in zip(chunk, results):
            if opts.n_best > 1:
                for h in nbest:
                    write(f"{lineno - 1} ||| {one_line(h.text)} ||| {h.score:.4f}")
            else:
                write(one_line(nbest[0].text))
            stats.sentences += nbest[0].sentences
            stats.target_tokens += nbest[0].tokens
        stats.lines += len(chunk)
        progress(len(chunk))
    stats.seconds = time.perf_counter() - start
    return stats


def one_line(text: str) -> str:
    """A translation as exactly one output line: the tokenizer's byte pieces can spell a line break,
    which would shift every later line against its input."""
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


class AtomicOutput:
    """Where `-o PATH` writes. A regular file (or a new one) is written through core.atomic's AtomicWriter:
    renamed over the old one only on success, so a failed run never truncates it, with the old file's mode.
    A symlink is followed to its target; a FIFO or device is written directly (nothing there to replace)."""

    def __init__(self, path: Path):
        self.path = path
        check_output_path(path, "-o")
        target = Path(os.path.realpath(path))
        self.writer: AtomicWriter | None = None
        try:
            if target.exists() and not target.is_file():
                self.file: TextIO = open(target, "w", encoding="utf-8", newline="\n")
            else:
                self.writer = AtomicWriter(target, text=True).open()
                self.file = self.writer.file
        except OSError as e:
            raise UsageError(f"cannot write -o {path}: {describe_os_error(e)}") from None

    @staticmethod
    def check(path: Path | None) -> None:
        """Refuses, before any work, an output path that cannot be written."""
        if path is not None:
            check_output_path(path, "-o")

    def write(self, line: str) -> None:
        try:
            self.file.write(line + "\n")
        except OSError as e:
            self.abort()
            raise DataError(f"cannot write -o {self.path}: {describe_os_error(e)}; the old file is unchanged") from None

    def commit(self) -> None:
        try:
            if self.writer:
                self.writer.commit()
            else:
                self.file.close()
        except OSError as e:
            self.abort()
            raise DataError(f"cannot write -o {self.path}: {describe_os_error(e)}; the old file is unchanged") from None

    def abort(self) -> None:
        if self.writer:
            self.writer.abort()
        else:
            with contextlib.suppress(OSError):
                self.file.close()


def read_references(path: Path) -> list[str]:
    """One reference per line, decoded up front: a non-UTF-8 file is refused before any translation."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read --reference {path} ({e.strerror})") from None
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(f"--reference {path} line {line} is not valid UTF-8 (byte {e.start}); convert it to UTF-8") from None


def score_file(hyps: list[str], reference: Path, refs: list[str] | None = None) -> dict:
    """BLEU and chrF of translations against a reference file (one line per translation)."""
    from toolkit.core.scoring import bleu_chrf

    refs = refs if refs is not None else read_references(reference)
    if len(refs) != len(hyps):
        raise UsageError(f"--reference has {len(refs)} lines but there are {len(hyps)} translations; give one reference per input line")
    if not hyps:
        raise UsageError("there are no translations to score against --reference")
    return bleu_chrf(hyps, [[r] for r in refs])
