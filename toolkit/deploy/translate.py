"""`tk translate`: streaming, length-batched translation with the exported graphs alone.

Imports onnxruntime, numpy and sentencepiece; never torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TextIO

from toolkit.core import confidence as conf
from toolkit.core import manifest as manifest_mod
from toolkit.core import placeholders, textprep
from toolkit.core.atomic import AtomicWriter, check_output_path
from toolkit.core.batching import BEAM_ROWS, DecodeOptions, decode_ids, fitting_streams
from toolkit.core.decode_options import MAX_BEAM
from toolkit.core.decoding import Hypothesis, length_limits, word_end
from toolkit.core.errors import DataError, ToolkitError, UsageError, describe_os_error, first_line, os_failure
from toolkit.core.shortlist import unguarded_note
from toolkit.core.textprep import TextOptions
from toolkit.core.tokenizer import Tokenizer
from toolkit.core.tokenizers import MarianTokenizer, open_tokenizer, with_languages
from toolkit.runtimes import DEFAULT_RUNTIME

if TYPE_CHECKING:
    from toolkit.core.constrained import TermWord

CHUNK_LINES = 2048  # lines read, sorted and translated at a time: bounds memory on any input size


@dataclass
class TranslationModel:
    """An exported model directory, loaded for translation on one backend."""

    manifest: manifest_mod.Manifest
    tokenizer: Tokenizer | MarianTokenizer
    backend: Callable[[], object]  # a fresh step backend for the shared decoding loop
    provider: str  # "cpu" or "cuda"; "torch" for a reference (open_model's `reference`)
    startup_s: float
    built_s: float = 0.0  # of startup_s, the time spent building a variant the directory does not store
    runtime: str | None = DEFAULT_RUNTIME  # which engine runs the graphs (toolkit.runtimes); None for a reference
    threads: int | None = None  # intra-op threads of each CPU session (None: not a CPU ONNX Runtime session)
    variant: str = "fp32"  # the graphs it runs (toolkit.core.variants)
    note: str | None = None  # a warning for whoever loaded it: a shortlist tk verify refused or never checked

    @property
    def where(self) -> str:
        """Device and runtime, as output states them: 'cpu (onnxruntime 1.31.0)'."""
        from toolkit.runtimes import label

        return self.provider if self.runtime is None else f"{self.provider} ({label(self.runtime)})"

    def for_languages(self, source_lang: str | None = None, target_lang: str | None = None) -> TranslationModel:
        """This model translating from `source_lang` into `target_lang` (None: its default): the same sessions, the
        source code on every sentence and the target forced first (toolkit.core.tokenizers.choose_languages, the one
        place a pair is chosen). A code the model does not know is one line listing its codes."""
        chosen, tokenizer = with_languages(self.manifest, self.tokenizer, source_lang, target_lang)
        return self if chosen is self.manifest else dataclasses.replace(self, manifest=chosen, tokenizer=tokenizer)


def open_model(directory: str | Path, provider: str | None = None, variant: str | None = "fp32",
               allow_fallback: bool = False, threads: int | None = None, runtime: str = DEFAULT_RUNTIME,
               reference: Callable[[manifest_mod.Manifest], Callable[[], object]] | None = None,
               shortlist: bool = False) -> TranslationModel:
    """Loads and checks a model directory on `runtime` (toolkit.runtimes.registry), whose declaration picks what is
    not given: provider None, its default (ONNX Runtime: CUDA if it truly loads, else CPU); variant None, its fastest
    graphs that compute what the fp32 graphs compute on that provider (ONNX Runtime on CPU: the attention-fused
    "optimized" graphs, built once and kept in the start-up cache); threads None, its own. Its loader checks the
    sessions against manifest.json.

    `reference(m)`: step backends of the caller's own in place of a runtime's, through the same loop (`tk translate
    --backend torch`: toolkit.pytorch.torch_backend.reference_backends, which the deploy path never imports).
    shortlist: decode each sentence over its own candidates of the directory's shortlist (toolkit.core.shortlist).
    """
    from toolkit.runtimes import check, get, load

    check(runtime)
    start = time.perf_counter()
    m = manifest_mod.load(directory)
    m.translation_tokenizer()
    m.check_files(cached=True)
    tokenizer = open_tokenizer(m)
    if reference is not None:
        if shortlist:
            raise UsageError("--shortlist decodes with the exported graphs; drop --backend torch")
        return TranslationModel(m, tokenizer, reference(m), "torch", time.perf_counter() - start, runtime=None)
    spec = get(runtime)
    if provider is None:  # the shortlist decodes on CPU (toolkit.runtimes.onnxruntime.shortlisted)
        provider = "cpu" if shortlist else spec.default_provider()
    variant = spec.default_variant(provider, m) if variant is None else variant
    request_threads = None
    if threads is None:
        threads, request_threads = spec.default_threads(provider, variant, m)
    loaded = load(m, runtime, provider, variant, allow_fallback, threads, cache=True, request_threads=request_threads,
                  shortlist=shortlist)
    note = unguarded_note(m.directory, m.shortlist.checked, variant) if shortlist and m.shortlist is not None else None
    return TranslationModel(m, tokenizer, loaded.backend, loaded.provider, time.perf_counter() - start, loaded.built_s, runtime,
                            getattr(loaded, "threads", None), variant, note)


@dataclass
class Stats:
    lines: int = 0
    sentences: int = 0
    target_tokens: int = 0
    truncated: list[int] = field(default_factory=list)  # line numbers whose input was cut to the model's maximum
    guarded: list[int] = field(default_factory=list)  # line numbers whose output a length or loop guard ended
    repaired: list[int] = field(default_factory=list)  # line numbers whose protected spans the model did not copy exactly once
    failed: list[int] = field(default_factory=list)  # line numbers whose processing raised: a fallback's output, or an empty line
    low_confidence: list[int] = field(default_factory=list)  # line numbers whose confidence is below translate_lines' min_confidence
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
    # How far to trust it, in [0, 1] (toolkit.core.confidence): the estimated probability that it scores a sentence chrF of
    # 50 or more against a human reference; a line's is its weakest sentence's. Low: a line a translator should check.
    confidence: float = 1.0
    signals: conf.Signals | None = field(default=None, repr=False, compare=False)  # what the confidence was computed from


def translate_batch(t: TranslationModel, texts: list[str], opts: DecodeOptions, backend: object | None = None,
                    warn: Callable[[str], None] = lambda s: None, strict: bool = False,
                    first_lineno: int = 1, truncated: list[int] | None = None,
                    text: TextOptions = TextOptions(), guarded: list[int] | None = None,
                    repaired: list[int] | None = None, failed: list[int] | None = None,
                    progress: Callable[[float], None] | None = None) -> list[list[Translation]]:
    """The n-best translations of each text, in input order: the one entry point from text to text that `tk translate`,
    `tk evaluate`, the API and corpus translation share (the server runs its parts: segment_lines, decode_sentences,
    join_line).

    Each line is cleaned and split into sentences (toolkit.core.textprep), all sentences of all lines are decoded in one
    length-sorted batch, and each line's sentences are joined back. A sentence longer than the model's maximum is
    truncated with a warning naming its line (its number is appended to `truncated`), or refused with strict. A best
    translation that a length or loop guard ended is warned about the same way (its line number appended to `guarded`),
    and so is a best translation whose protected spans (numbers, URLs, e-mail addresses, kept terms) the model did not
    copy exactly once: each is put back exactly once all the same (placeholders.restore), its line number in `repaired`.

    No line fails another: a line whose processing raises an unexpected error (not one of tk's own, which are the
    caller's to see) is translated as plain text without placeholders, or else gets an empty translation, with a
    warning naming it and its number in `failed`. Only when every line of the call fails is the error raised.

    `progress(x)` hears, after each decoded batch, the share of the texts it stands for (x texts' worth, a fraction
    when a batch holds some of a text's sentences), so a bar over a long call moves while it decodes.
    """
    backend = backend or t.backend()
    failing: set[int] = set()  # the texts tk failed on: their translations get no confidence (conf.FAILED)

    def fail(i: int, e: Exception, outcome: str = "its output is an empty line") -> None:
        failing.add(i)
        lineno = first_lineno + i
        warn(f"warning: line {lineno}: {type(e).__name__} in tk ({first_line(e, 120)}); {outcome}")
        if failed is not None and lineno not in failed:
            failed.append(lineno)

    # With strict a sentence too long is refused (by the decoder), not cut into pieces.
    segments = segment_lines(t.manifest, texts, text, fail, lambda: t.tokenizer.alphabet, None if strict else t.tokenizer)
    for note in split_notes(segments, t.manifest.max_len, first_lineno):
        warn(note)
    notes: list[str] = []  # the decode's warnings, said once it succeeded (not again for a retry line by line)

    def decode(lines: list[int]) -> list[list[tuple[textprep.Segment, list[Translation]]]]:
        said: list[str] = []
        sentences = sum(len(segments[i]) for i in lines)
        done = (lambda n: progress(n * len(lines) / sentences)) if progress and sentences else None
        flat = decode_segments(t, [seg for i in lines for seg in segments[i]], opts, backend, said.append, strict,
                               [first_lineno + i for i in lines for _ in segments[i]], truncated, guarded, done,
                               missed=failed)
        notes.extend(said)
        return _regroup(flat, [segments[i] for i in lines])

    decoded = _isolated(decode, [i for i, segs in enumerate(segments) if segs], fail)
    for note in notes:
        warn(note)
    out = _joined(segments, decoded, opts.n_best, fail, warn, first_lineno, repaired)
    for i in failing:
        out[i] = [dataclasses.replace(h, confidence=conf.FAILED) for h in out[i]]
    return out


def _joined(segments: list[list[textprep.Segment]], decoded: dict, n_best: int, fail: Callable[[int, Exception], None],
            warn: Callable[[str], None], first_lineno: int, repaired: list[int] | None) -> list[list[Translation]]:
    """Each line's translations joined back from its sentences' (translate_batch's last step; `decoded`: per line, each
    sentence's segment as decoded and its n-best): a line whose spans cannot be put back fails alone (`fail`), and a
    line whose spans were repaired is warned about and listed in `repaired`."""
    out = []
    for i in range(len(segments)):
        report: list[placeholders.Repair] = []
        try:
            out.append(join_line(decoded.get(i, []), n_best, report))
        except ToolkitError:
            raise
        except Exception as e:  # noqa: BLE001 - one line's spans cannot fail the others
            fail(i, e)
            out.append(join_line([], n_best))
            continue
        if report:
            lineno = first_lineno + i
            warn(f"warning: line {lineno}: {repair_note(report)}")
            if repaired is not None and lineno not in repaired:
                repaired.append(lineno)
    return out


def check_glossary(m: manifest_mod.Manifest | None, enabled: bool = True) -> None:
    """Refuses a glossary that could not be put in (a UsageError saying why), rather than drop it in silence: with --raw
    (no text handling to find its terms), or with a model not trained on tk's placeholders whose first output token is
    forced (a target language), where constrained decoding, its one way in, does not run. m None: not known yet."""
    if not enabled:
        raise UsageError("--glossary finds its terms in tk's text handling, which --raw turns off; drop --raw")
    if m is not None and not m.declared().placeholders and m.rules().forced_first is not None:
        raise UsageError(f"--glossary forces its terms into this {m.model} model's output, which its forced first token (a "
                         "target language) does not allow; translate without --glossary")


def segment_lines(m: manifest_mod.Manifest, texts: list[str], text: TextOptions,
                  fail: Callable[[int, Exception, str], None] | None = None,
                  alphabet: Callable[[], frozenset[str] | None] | None = None,
                  tokenizer: Tokenizer | MarianTokenizer | None = None) -> list[list[textprep.Segment]]:
    """Each line's model inputs: cleaned and split, and protected by placeholders only for a model trained on them,
    which also keep verbatim the words holding a character `alphabet()` (its tokenizer's, made only when a line needs it)
    does not spell (textprep.unspelled). With the model's `tokenizer`, a sentence longer than the model's positions is
    cut into pieces that fit (textprep.fitted) rather than truncated by the decoder.
    With `fail`, a line whose preparation raises an unexpected error is prepared again as plain sentences (no
    placeholders or capitals folding: what the model makes of the text itself), else it has none (an empty
    translation), and `fail(index, error, what became of it)` is told; without, the error is raised."""
    protect = m.declared().placeholders
    if text.keep and not protect:
        raise UsageError(f"--keep protects terms with tk's placeholders, which this {m.model} model was not trained to copy")
    if text.glossary:
        check_glossary(m, text.enabled)
    tokens = token_count(tokenizer, m.max_len) if tokenizer is not None else None
    out = []
    for i, x in enumerate(texts):
        try:
            keep = (*text.keep, *textprep.unspelled(x, alphabet)) if protect and text.enabled else text.keep
            out.append(textprep.prepare(x, keep, text.split, text.enabled, protect, text.glossary, tokens, m.max_len))
            continue
        except ToolkitError:
            raise
        except Exception as e:  # noqa: BLE001 - one line's text cannot fail the others
            if fail is None:
                raise
            error = e
        try:
            out.append(textprep.prepare(x, text.keep, text.split, text.enabled, protect=False, tokens=tokens, limit=m.max_len))
            fail(i, error, "translated as plain text, without protecting its numbers, URLs, e-mail addresses and kept terms"
                           + (" or putting in its glossary terms" if text.glossary else ""))
        except ToolkitError:
            raise
        except Exception:  # noqa: BLE001 - the plain form fails too: the line is left empty
            out.append([])
            fail(i, error, "its output is an empty line")
    return out


def token_count(tokenizer: Tokenizer | MarianTokenizer, limit: int) -> Callable[[str], int]:
    """A model input's tokens as the tokenizer makes them (its added tokens included), for textprep.fitted. A text of
    few bytes is not tokenized: tk's tokenizers make at most a token a byte (FSMT's escaped characters aside), plus a
    word-start piece and the tokens they add to every input, so such a text fits `limit` (returned as 0). Where the
    count is too low, the decoder truncates the input with its warning, as it does any input too long."""
    slack = len(tokenizer.encode([""])[0]) + 1

    def count(text: str) -> int:
        if len(text.encode("utf-8")) + slack <= limit:
            return 0
        return len(tokenizer.encode([text])[0])

    return count


def split_notes(segments: list[list[textprep.Segment]], limit: int, first_lineno: int = 1) -> list[str]:
    """A warning for each line holding a sentence longer than the model's `limit` positions, which was translated in
    pieces (textprep.fitted): its translation may read less well where the pieces meet."""
    notes = []
    for i, segs in enumerate(segments):
        cut = [s.cut_from for s in segs if s.cut_from]
        if cut:
            notes.append(f"warning: line {first_lineno + i} has a sentence of {max(cut)} tokens, more than the model's {limit}; "
                         f"translated in {len(cut)} pieces, cut between clauses or words")
    return notes


def decode_sentences(t: TranslationModel, texts: list[str], opts: DecodeOptions, backend: object | None = None,
                     warn: Callable[[str], None] = lambda s: None, strict: bool = False, lines: list[int] | None = None,
                     truncated: list[int] | None = None, guarded: list[int] | None = None,
                     done: Callable[[int], None] | None = None) -> list[list[Translation]]:
    """The n-best of each model input (a Segment's text), in order, decoded in one length-sorted batch by the model's
    own rules; `done(n)` hears of each decoded batch's n inputs (batching.decode_ids). lines: each input's line number,
    for the warnings (truncated to the model's maximum, refused with strict; ended by a guard) and the `truncated` and
    `guarded` lists. A sentence whose best hypothesis a guard cut is decoded again with a wider beam (retried), and
    keeps the cut only where that runs away too. A hypothesis the loop guard stopped ends on a whole word
    (decoding.word_end). Each translation carries its confidence (toolkit.core.confidence, by the model's calibration)."""
    backend = backend or t.backend()
    limit = t.manifest.max_len
    lines = lines if lines is not None else [1] * len(texts)
    # The model's own rules, however opts were made; sources cut to its positions (by decode_ids, there only); no more
    # busy threads than cores, whatever streams were asked for.
    rules = t.manifest.rules()
    opts = dataclasses.replace(opts, max_src_len=min(opts.max_src_len or limit, limit), rules=rules,
                               streams=fitting_streams(opts.streams, t.threads) if t.threads else opts.streams)
    alpha = rules.alpha if opts.alpha is None else opts.alpha
    ids = t.tokenizer.encode(texts)
    _too_long(ids, lines, limit, strict, warn, truncated)
    boundary = t.tokenizer.boundary  # every kind of tokenizer answers it from its own pieces (TextTokenizer)
    calibration = conf.for_manifest(t.manifest)
    translations: dict[int, list[Translation]] = {}

    def written(indices: list[int], results: list[list[Hypothesis]]) -> list[list[Hypothesis]]:
        """These inputs' hypotheses ended on whole words, and their Translations (text, score, confidence) put in
        `translations`. One tokenizer call for all of them: one per sentence cost 3% of a 2,000-line file."""
        results = [[dataclasses.replace(h, tokens=word_end(h.tokens, h.rest, boundary)) if h.rest else h for h in nbest]
                   for nbest in results]
        texts_out = iter(t.tokenizer.decode([h.tokens for nbest in results for h in nbest]))
        for i, nbest in zip(indices, results):
            source, seq = texts[i], ids[i]
            source_tokens = min(len(seq), opts.max_src_len)  # as decode_ids cut it
            hyps = []
            for h in nbest:
                text, score = next(texts_out), rules.normalized(h.score, len(h.tokens), alpha, not h.stopped)
                signals = conf.signals(source, text, score, h.stopped)
                hyps.append(Translation(text, score, len(h.tokens), source_tokens, int(bool(seq)), h.stopped,
                                        calibration.confidence(signals), signals))
            translations[i] = hyps
        return results

    # Each batch is finished in the stream that decoded it, beside the other streams' batches rather than after all of
    # them on one core: its runaways decoded again on that stream's backend (one stream each), then its text written.
    results = decode_ids(backend, ids, opts, done,
                         lambda be, indices, batch, hyps: written(indices, retried(be, batch, hyps, opts, streams=1)))
    undecoded = [i for i in range(len(ids)) if i not in translations]  # empty inputs
    if undecoded:
        written(undecoded, [results[i] for i in undecoded])
    out = []
    for i, (lineno, seq, nbest) in enumerate(zip(lines, ids, results)):
        if nbest[0].stopped and seq:
            warn(f"warning: line {lineno}: {guard_note(nbest[0], min(len(seq), opts.max_src_len), opts, limit)}")
            if guarded is not None and lineno not in guarded:
                guarded.append(lineno)
        out.append(translations[i])
    return out


def _too_long(ids: list[list[int]], lines: list[int], limit: int, strict: bool, warn: Callable[[str], None],
              truncated: list[int] | None) -> None:
    """Warns of each input longer than the model's `limit` positions (decode_ids cuts it) and lists its line in
    `truncated`; with `strict`, refuses it instead."""
    for lineno, seq in zip(lines, ids):
        if len(seq) > limit:
            if strict:
                raise DataError(f"input line {lineno} has a sentence of {len(seq)} tokens, more than the model's {limit}; "
                                "split it, or drop --strict to translate it in pieces")
            warn(f"warning: line {lineno} has a sentence of {len(seq)} tokens; truncated to the model's maximum of {limit}")
            if truncated is not None and lineno not in truncated:
                truncated.append(lineno)


RETRY_BEAM = 4  # the beam a sentence whose best hypothesis a guard cut is decoded again with (twice the beam asked for, if wider)


def retried(backend: object, ids: list[list[int]], results: list[list[Hypothesis]], opts: DecodeOptions,
            streams: int | None = None) -> list[list[Hypothesis]]:
    """`results` (decode_ids' for `ids` with `opts`), where a guard cut a sentence's best hypothesis, decoded again with a
    wider beam (RETRY_BEAM, or twice the beam asked for when that is already as wide) keeping every hypothesis it
    finished: those that ended of their own accord first, best first, then the cut ones (so an n-best list leads with
    the translation the 1-best gives).
    A runaway is often one path's alone: greedy writes "Ils représentententent ..." for "They represent not only
    themselves but this institution as well.", which the loop guard cuts to "Ils"; beam 4 ranks that cut first too, but
    its next hypothesis ends ("Ils ne représent pas seulement par eux-mêmes que cette institution."). Only where every
    hypothesis of the wider beam was cut too is the first cut kept (its confidence capped: conf.GUARDED_MAX). A
    hypothesis that reached its length limit counts as cut, whatever token ends it: a model whose rule forces the end
    token there (Hugging Face's forced_eos_token_id) ends every hypothesis at its limit. With both guards off nothing
    is decoded again: the user asked for the model's own decode. `streams`: the retry's streams, if not opts'."""
    if not opts.loop_guard and opts.max_len_a is None:
        return results  # the guards off: the decode asked for (generate's, for an import), runaways and all
    cut = [i for i, nbest in enumerate(results) if nbest[0].stopped and ids[i]]
    if not cut or isinstance(backend, _Decoded):  # hypotheses found already (a glossary's, its targets forced in) are kept
        return results
    beam = RETRY_BEAM if opts.beam < RETRY_BEAM else min(2 * opts.beam, MAX_BEAM)
    wider = dataclasses.replace(opts, beam=beam, n_best=beam, batch_size=max(1, min(opts.batch_size, BEAM_ROWS // beam)),
                                streams=opts.streams if streams is None else streams)
    sources = [ids[i][: opts.max_src_len] if opts.max_src_len else ids[i] for i in cut]
    limits = length_limits(sources, opts.max_len, opts.max_len_a, opts.max_len_b)
    out = list(results)
    for i, limit, nbest in zip(cut, limits, decode_ids(backend, sources, wider)):
        ended = [h for h in nbest if not h.stopped and len(h.tokens) < limit]
        if ended:
            out[i] = (ended + [h for h in nbest if h.stopped or len(h.tokens) >= limit])[: opts.n_best]
    return out


FORCED_BEAM = 4  # the least beam a sentence holding glossary terms is decoded with, their targets forced in
# How much lower (length-normalised log-probability) a translation with the targets forced in may score than the model's
# own translation of the same sentence; below, the forcing wrecked the sentence and the placeholders do better. Chosen
# on the valid split of the glossary term set (docs/glossary.md): every forced translation scoring 10 or more below was
# a term tacked on or words broken ("Il vit dans la prochaine bourse bourde bourg ville."); sound ones scored up to 8.
FORCED_MARGIN = 10.0
# Where the search's best fails those checks (most often it kept the model's own word and added the target beside it:
# "Il s'est plaint du bruit vacarme."), the model's own translation with its word for the term swapped for the target is
# tried, by the same checks ("Il s'est plaint du vacarme."): the word the source term accounts for most
# (constrained.term_swaps). Only that word: on the valid split of the glossary term set, swapping the best of the next
# few words too ("Il s'est vacarme à propos du bruit.") put more targets in and read worse.


def decode_segments(t: TranslationModel, segments: list[textprep.Segment], opts: DecodeOptions, backend: object | None = None,
                    warn: Callable[[str], None] = lambda s: None, strict: bool = False, lines: list[int] | None = None,
                    truncated: list[int] | None = None, guarded: list[int] | None = None, done: Callable[[int], None] | None = None,
                    decode: Callable[..., list[list[Translation]]] | None = None,
                    missed: list[int] | None = None) -> list[tuple[textprep.Segment, list[Translation]]]:
    """Each model input's n-best (`decode`'s, decode_sentences unless told, in order) with the segment it was decoded
    from. A segment holding glossary terms (Segment.forced) is translated with the terms as written where tk's own loop
    decodes it (not CTranslate2's) and the translation holds each target exactly as often as asked (_forced); else as
    its placeholder form, whose placeholders put each target back exactly once. A segment without terms is decoded as
    it is without a glossary."""
    backend = backend or t.backend()
    decode = decode or decode_sentences
    lines = lines if lines is not None else [1] * len(segments)
    forced = _forced(t, segments, opts, backend, decode, lines)
    # A model input with no letter outside its placeholders ("2019", "👍", "555 0199, 555 0200", a glossary term alone) is
    # its own translation: the model given a lone placeholder wrote it twice or not at all, and the fallback's repair
    # then warned and capped the confidence of a line copied right.
    copied = {k for k in range(len(segments)) if k not in forced and _its_own_translation(segments[k])}
    plain = [k for k in range(len(segments)) if k not in forced and k not in copied]
    # A segment of a model not trained on placeholders has no placeholder form: where its terms could not be forced in,
    # its translation is the model's own, reported in a warning naming its line, listed in `missed`, its confidence FAILED.
    out: list = [None] * len(segments)
    if plain:
        decoded = decode(t, [segments[k].text for k in plain], opts, backend=backend, warn=warn, strict=strict,
                         lines=[lines[k] for k in plain], truncated=truncated, guarded=guarded, done=done)
        for k, nbest in zip(plain, decoded):
            out[k] = (segments[k], nbest)
    for k in plain:
        seg, lineno = segments[k], lines[k]
        if not _unprotected(seg) or _holds(seg, out[k][1][0]):
            continue
        out[k] = (seg, [dataclasses.replace(h, confidence=conf.FAILED) for h in out[k][1]])
        terms = ", ".join(repr(x) for x in dict.fromkeys(seg.forced.targets))
        warn(f"warning: line {lineno}: its glossary targets ({terms}) could not be forced into its translation (this model "
             "was not trained on tk's placeholders, which would put them back); its output is the model's own translation without them")
        if missed is not None and lineno not in missed:
            missed.append(lineno)
    if done and forced:
        done(len(forced))
    for k, nbest in forced.items():
        out[k] = (segments[k].forced, nbest)
    for k in copied:
        out[k] = (segments[k], [Translation(segments[k].text, 0.0, 0, 0, 1)])
    if done and copied:
        done(len(copied))
    return out


def _its_own_translation(segment: textprep.Segment) -> bool:
    """Whether a model input is its own translation: placeholders with no letter outside them (decode_segments)."""
    return bool(segment.spans) and not any(c.isalpha() for c in placeholders.SYMBOL_RE.sub("", segment.text))


class _Decoded:
    """A backend that answers decode_ids with hypotheses already found (decode_all: a runtime with a loop of its own)."""

    def __init__(self, hypotheses: list[list[Hypothesis]]):
        self.hypotheses = hypotheses  # each sentence's, best first

    def decode_all(self, src: list[list[int]], opts: DecodeOptions) -> list[list[Hypothesis]]:
        return [list(nbest) for nbest in self.hypotheses]


def _forced(t: TranslationModel, segments: list[textprep.Segment], opts: DecodeOptions, backend: object, decode: Callable,
            lines: list[int]) -> dict[int, list[Translation]]:
    """By index, the translation of each segment with glossary terms, its terms as written (Segment.forced): the model's
    own where that holds each target exactly as often as asked (glossary.holds); else the best with the targets forced
    in (toolkit.core.constrained), unless it does not hold them either, only tacks them onto the model's own
    (glossary.tacked_on), or scores FORCED_MARGIN below it; else the model's own with its word for a target swapped for
    it (_swapped), by the same checks. With opts.n_best, every hypothesis given holds the targets: the model's own that
    lack them are left out, the search's that pass the checks take their places, and a segment may get fewer than
    asked. A segment left out is translated as its placeholder form; so is a sentence longer than the model's maximum,
    which that form says was truncated."""
    from toolkit.core import constrained, glossary

    rules = t.manifest.rules()
    if not constrained.can_constrain(backend, rules):
        if any(map(_unprotected, segments)):
            raise UsageError(f"--glossary forces its terms into this {t.manifest.model} model's output in tk's own decoding loop, "
                             "which CTranslate2 does not run; translate with --runtime onnxruntime")
        return {}
    # Not a segment of nothing but terms ("House", a list item): its placeholder form is its translation (decode_segments).
    wanted = [k for k, seg in enumerate(segments) if seg.forced is not None and not _its_own_translation(seg)]
    ids = dict(zip(wanted, t.tokenizer.encode([segments[k].forced.text for k in wanted])))
    wanted = [k for k in wanted if 0 < len(ids[k]) <= t.manifest.max_len]
    if not wanted:
        return {}
    # The model's own translations (no warnings: the placeholder form, should it be used, gives its own).
    own = dict(zip(wanted, decode(t, [segments[k].forced.text for k in wanted], opts, backend=backend, lines=[lines[k] for k in wanted])))
    out = {}  # by index: the translations given
    # Where the model's own translation lacks the targets, its word for the terms, read for all such segments at once.
    lacking = [k for k in wanted if own[k][0].stopped or not glossary.holds(textprep.finish(segments[k].forced, own[k][0].text),
                                                                               segments[k].forced.targets)]
    words = dict(zip(lacking, _own_words(t, [(ids[k], segments[k].forced, own[k][0].text) for k in lacking], backend, rules)))
    for k in wanted:
        seg = segments[k].forced
        if k not in lacking:
            # With --n-best, only the model's hypotheses that hold the targets; the search's fill the places of the others.
            out[k] = [h for h in own[k] if not h.stopped and glossary.holds(textprep.finish(seg, h.text), seg.targets)]
    found = _searched(t, segments, wanted, ids, own, out, words, opts, backend)
    held = [k for k in sorted(found) if found[k]]
    if held:
        # Their hypotheses become translations as every other's do (scores, confidence), through the same decode.
        decoded = decode(t, [segments[k].forced.text for k in held], opts, backend=_Decoded([found[k] for k in held]),
                         lines=[lines[k] for k in held])
        for k, nbest in zip(held, decoded):
            given = {h.text for h in out.get(k, [])}
            merged = out.get(k, []) + [h for h in nbest if h.text not in given]
            # The model's own best first where it holds the targets, then best-scored first.
            out[k] = merged[:1] + sorted(merged[1:], key=lambda h: -h.score) if k in out else merged
            out[k] = out[k][:opts.n_best]
    return out


def _searched(t: TranslationModel, segments: list[textprep.Segment], wanted: list[int], ids: dict, own: dict, out: dict,
              words: dict, opts: DecodeOptions, backend: object) -> dict[int, list[Hypothesis]]:
    """_forced's hypotheses with the targets forced in, by index, best first: for a segment whose own translation lacks
    its targets (not in `out`), _search_or_swap's; for one whose own n-best lost hypotheses that lacked them (`out`
    shorter than `own`), the search's that pass the checks. Every search of the call side by side (one decoder step
    for many sentences: constrained.constrained_searches), each as it would be alone."""
    from toolkit.core import constrained

    rules = t.manifest.rules()
    searching = {}  # by index: the terms' forms of each segment whose targets are searched for
    for k in wanted:
        if k in out and len(out[k]) == len(own[k]):
            continue
        terms = [constrained.term_forms(t.tokenizer, target, rules.end) for target in segments[k].forced.targets]
        if all(forms[0] for forms in terms):
            searching[k] = terms
    searched = _constrained(t, [(ids[k], terms, segments[k].forced.targets) for k, terms in searching.items()], opts, backend, rules)
    found = {}
    for (k, terms), hyps in zip(searching.items(), searched):
        seg, mine = segments[k].forced, own[k][0]
        if k in out:
            found[k] = [h for h in hyps if _passes(t, seg, h, mine, opts)]
        else:
            found[k] = _search_or_swap(t, ids[k], seg, terms, mine, opts, backend, rules, words.get(k), hyps)
    return found


def _search_or_swap(t: TranslationModel, src: list[int], segment: textprep.Segment, terms: list[list[list[int]]], mine: Translation,
                    opts: DecodeOptions, backend: object, rules, where: tuple[list[int], TermWord] | None,
                    hyps: list[Hypothesis]) -> list[Hypothesis]:
    """A segment's translations with its targets forced in that pass the checks (_passes), best first: the search's
    (_constrained's `hyps`); where they fail, the model's own translation `mine` with its word for the term swapped for the
    target (_swapped; `where`: _own_words'). Where the search's best keeps that word as often as `mine` does, the target took another word's
    place ("Il vendit sa propre voiture sans automobile.", "dépose l'argent dans une banque fric."), and the swap comes
    first if it passes, whatever the two score: the word said twice is the worse mistake ("Veuillez déposer le fric dans
    une banque."; on the valid split's term sets 7 of 138 outputs said it twice greedy, 3 with the swap first whatever
    its score)."""
    passing = [h for h in hyps if _passes(t, segment, h, mine, opts)] if hyps and _passes(t, segment, hyps[0], mine, opts) else []
    if passing and (where is None or not _kept_own_word(t, passing[0], mine.text, where[1].text, segment.targets)):
        return passing
    h = _swapped(t, src, segment, terms, backend, rules, mine.text, opts, where)
    if not _passes(t, segment, h, mine, opts):
        return passing
    return [h] + [x for x in passing if not _kept_own_word(t, x, mine.text, where[1].text, segment.targets)]


def _passes(t: TranslationModel, segment: textprep.Segment, h: Hypothesis | None, own: Translation, opts: DecodeOptions) -> bool:
    """Whether a translation with the targets forced in (h) may stand for the segment (_forced's checks against the
    model's own translation `own`): it holds each target as often as asked, does not merely add them to the model's
    words, and scores no more than FORCED_MARGIN below it."""
    from toolkit.core import glossary

    if h is None:
        return False
    rules = t.manifest.rules()
    text, own_text = (textprep.finish(segment, x) for x in (t.tokenizer.decode([h.tokens])[0], own.text))
    score = rules.normalized(h.score, len(h.tokens), rules.alpha if opts.alpha is None else opts.alpha)
    return (glossary.holds(text, segment.targets) and not glossary.tacked_on(text, own_text, segment.targets)
            and score > own.score - FORCED_MARGIN)


def _holds(segment: textprep.Segment, h: Translation) -> bool:
    """Whether a translation holds each of its segment's glossary targets exactly as often as asked (glossary.holds)."""
    from toolkit.core import glossary

    return not h.stopped and glossary.holds(textprep.finish(segment, h.text), segment.forced.targets)


def _unprotected(segment: textprep.Segment) -> bool:
    """Whether a segment holds glossary terms but no placeholders to put them back (a model not trained on them)."""
    return segment.forced is not None and not segment.spans


def _constrained(t: TranslationModel, items: list[tuple[list[int], list[list[list[int]]], list[str]]], opts: DecodeOptions,
                 backend: object, rules) -> list[list[Hypothesis]]:
    """For each (src, terms, targets): the best translations of src holding each term (its forms' ids:
    constrained.term_forms; `targets`, their text), up to opts.n_best, best first, by toolkit.core.constrained at
    FORCED_BEAM or the beam asked for (the sentences searched side by side), each with the article or determiner before
    a term in the form the model scores best of those that may stand there (constrained.agreeing: "ce lycée", not
    "cette lycée"; "l'automobile", not "la automobile")."""
    from toolkit.core import constrained

    alpha = rules.alpha if opts.alpha is None else opts.alpha
    limits = [int(length_limits([src], min(opts.max_len, t.manifest.max_len), opts.max_len_a, opts.max_len_b)[0]) for src, _, _ in items]
    found = constrained.constrained_searches(backend, t.tokenizer, [(src, terms, limit) for (src, terms, _), limit in zip(items, limits)],
                                             max(opts.beam, FORCED_BEAM), alpha, rules, opts.n_best)
    ways = {(k, j): w for k, ((src, terms, targets), hyps) in enumerate(zip(items, found)) for j, h in enumerate(hyps)
            if (w := constrained.agreeing(t.tokenizer, h.tokens, terms, targets, rules.end)) and w != [list(h.tokens)]}
    other = [(k, j, w) for (k, j), each in ways.items() for w in each if w != list(found[k][j].tokens)]
    read: dict[tuple[int, int], list[Hypothesis]] = {}
    for (k, j, _), h in zip(other, constrained.scored_each(backend, [(items[k][0], w) for k, _, w in other], rules)):
        read.setdefault((k, j), []).append(h)
    # The search's own way where its article may stand before the term, else only the others.
    return [[h if (k, j) not in ways else _best_scored(([h] if ways[k, j][0] == list(h.tokens) else []) + read.get((k, j), []), rules, alpha)
             for j, h in enumerate(hyps)] for k, hyps in enumerate(found)]


def _swapped(t: TranslationModel, src: list[int], segment: textprep.Segment, terms: list[list[list[int]]], backend: object, rules,
             own: str, opts: DecodeOptions, where: tuple[list[int], TermWord] | None) -> Hypothesis | None:
    """The model's own translation `own` of src (the segment's ids) with the word that the segment's source terms
    account for most (`where`: _own_words') swapped for a term (constrained.term_swaps), its article or determiner in
    each form that may stand before the term (constrained.agreeing: "ton automobile" for "ta voiture"), the way of
    writing it the model scores best (by the normalised score the checks compare); None if there is none."""
    from toolkit.core import constrained

    found = where
    if found is None:
        return None
    swaps = constrained.term_swaps(t.tokenizer, found[0], found[1], terms, segment.targets[0], rules)
    swaps = list(dict.fromkeys(tuple(way) for swap in swaps
                               for way in constrained.agreeing(t.tokenizer, list(swap), terms, segment.targets, rules.end)))
    alpha = rules.alpha if opts.alpha is None else opts.alpha
    return _best_scored(constrained.scored_each(backend, [(src, list(swap)) for swap in swaps], rules), rules, alpha)


def _own_words(t: TranslationModel, items: list[tuple[list[int], textprep.Segment, str]], backend: object,
               rules) -> list[tuple[list[int], TermWord] | None]:
    """For each (src, segment, own): the model's own translation `own` as ids, and where in it stands its word for the
    segment's terms (constrained.term_words, all read together); None where the source is nothing but terms or the
    translation has no word."""
    from toolkit.core import constrained

    owns = [t.tokenizer.target_ids([own])[0] for _, _, own in items]
    owns = [ids[:-1] if ids[-1:] == [rules.end] else ids for ids in owns]
    withouts = t.tokenizer.encode([segment.without_terms for _, segment, _ in items]) if items else []
    readable = [k for k, without in enumerate(withouts) if without]
    found = constrained.term_words(backend, t.tokenizer, [(items[k][0], owns[k], withouts[k]) for k in readable], rules)
    out: list[tuple[list[int], TermWord] | None] = [None] * len(items)
    for k, word in zip(readable, found):
        out[k] = None if word is None else (owns[k], word)
    return out


def _kept_own_word(t: TranslationModel, h: Hypothesis, own: str, word: str, targets: list[str]) -> bool:
    """Whether a translation with the targets forced in (h) still holds the model's own word for the term (`word`, in
    its own translation `own`) as often as that translation does, the targets' own words aside ("fille" in "jeune
    fille"): then the target took another word's place."""
    from toolkit.core import glossary

    def outside_targets(text: str) -> int:
        return glossary.count(text, word) - sum(glossary.count(text, x) * glossary.count(x, word) for x in set(targets))

    n = outside_targets(own)
    return n > 0 and outside_targets(t.tokenizer.decode([h.tokens])[0]) >= n


def _best_scored(hyps: list[Hypothesis], rules, alpha: float) -> Hypothesis | None:
    """Of ways of writing one translation, the one the model scores best by the normalised score _passes compares (the
    first of equals); None if there is none."""
    return max(hyps, key=lambda h: rules.normalized(h.score, len(h.tokens), alpha), default=None)


def failure_notes(messages: list[str], failed: list[int]) -> list[tuple[int, str]]:
    """Of translate_batch's warnings, those about the lines in `failed` (the lines tk failed on): (line, what it says)."""
    lines = set(failed)
    out = []
    for m in messages:
        n = re.match(r"warning: line (\d+): ", m)
        if n and int(n.group(1)) in lines:
            out.append((int(n.group(1)), m[n.end():]))
    return out


def _isolated(run: Callable[[list[int]], list], lines: list[int], fail: Callable[[int, Exception], None]) -> dict[int, object]:
    """run(lines) gives one result per line; by line. Should it raise an unexpected error, each line is run alone, and a
    line that still raises is left out (`fail` is told): one input cannot fail the others. When every line fails, the
    first error is raised: then no single input is to blame (a broken model or device)."""
    if not lines:
        return {}
    try:
        return dict(zip(lines, run(lines)))
    except ToolkitError:
        raise
    except Exception as e:  # noqa: BLE001 - retried line by line below
        if len(lines) == 1:
            raise
        error = e
    out, errors = {}, {}
    for i in lines:
        try:
            out[i] = run([i])[0]
        except ToolkitError:
            raise
        except Exception as e:  # noqa: BLE001 - this line alone fails
            errors[i] = e
    if not out:
        raise error
    for i, e in errors.items():
        fail(i, e)
    return out


def _regroup(flat: list, lines: list[list]) -> list[list]:
    """A flat list of one item per model input, back into one list per line."""
    items = iter(flat)
    return [[next(items) for _ in segs] for segs in lines]


def repair_note(report: list[placeholders.Repair]) -> str:
    """What restoring a line's protected spans had to put right, in one line."""
    shown = "; ".join(map(str, report[:3])) + (f"; {len(report) - 3} more" if len(report) > 3 else "")
    return f"the model did not copy every protected span (number, URL, e-mail, --keep or glossary term) exactly once: {shown}"


def guard_note(h, source_tokens: int, opts: DecodeOptions, model_max: int | None = None) -> str:
    """Which guard ended a translation, and how to lift it (model_max: the model's positions, which nothing lifts)."""
    if h.stopped == "loop":
        return (f"the loop guard ended its translation after {len(h.tokens)} tokens (it began repeating itself); "
                "--no-loop-guard turns it off")
    limit = int(length_limits([[0] * source_tokens], opts.max_len, opts.max_len_a, opts.max_len_b)[0])
    if opts.max_len_a is not None and limit < opts.max_len:
        return (f"the length guard ended its translation at {limit} tokens ({opts.max_len_a:g} x {source_tokens} source "
                f"tokens + {opts.max_len_b}); it may be cut short: raise --max-len-a or --max-len-b")
    if model_max is not None and limit >= model_max:
        return (f"its translation reached the model's maximum of {model_max} tokens and may be cut short; "
                "split the sentence into shorter ones")
    return f"the length limit ended its translation at {limit} tokens; it may be cut short: raise --max-len up to the model's maximum"


def join_line(parts: list[tuple[textprep.Segment, list[Translation]]], n_best: int,
              report: list[placeholders.Repair] | None = None) -> list[Translation]:
    """A line's n-best: the k-th entry joins each sentence's k-th best (its last, if it has fewer);
    its score is the mean of theirs, its confidence the lowest of theirs (and at most conf.REPAIRED_MAX where its spans
    had to be repaired). What restoring the best one's spans repaired goes to `report`."""
    if not parts:
        return [Translation("", 0.0, 0, 0)]
    out = []
    for k in range(max(1, min(n_best, max(len(h) for _, h in parts)))):
        picks = [hyps[min(k, len(hyps) - 1)] for _, hyps in parts]
        repairs: list[placeholders.Repair] = []
        text = textprep.join([textprep.finish(seg, h.text, repairs) for (seg, _), h in zip(parts, picks)])
        out.append(_line_of(text, picks, bool(repairs)))
        if k == 0 and report is not None:
            report.extend(repairs)
    return out


def _line_of(text: str, sentences: list[Translation], repaired: bool) -> Translation:
    """The line `text` made of these sentences' translations: its score their mean, its confidence its weakest
    sentence's, capped where its protected spans were repaired. Built once, not copied: it runs for every line of a
    file after the decoding, on one core."""
    weakest = min(sentences, key=lambda h: h.confidence) if len(sentences) > 1 else sentences[0]
    confidence, signals = weakest.confidence, weakest.signals
    if repaired:
        confidence = min(confidence, conf.REPAIRED_MAX)
        signals = dataclasses.replace(signals, repaired=True) if signals is not None else None
    if len(sentences) == 1:
        h = sentences[0]
        return Translation(text, h.score, h.tokens, h.source_tokens, h.sentences, h.stopped, confidence, signals)
    return Translation(text, sum(h.score for h in sentences) / len(sentences), sum(h.tokens for h in sentences),
                       sum(h.source_tokens for h in sentences), sum(h.sentences for h in sentences),
                       next((h.stopped for h in sentences if h.stopped), ""), confidence, signals)


def translate_lines(t: TranslationModel, lines: Iterable[tuple[int, str]], write: Callable[[str], None], opts: DecodeOptions,
                    strict: bool = False, warn: Callable[[str], None] = lambda s: None,
                    progress: Callable[[int], None] = lambda n: None, text: TextOptions = TextOptions(),
                    chunk_lines: int = CHUNK_LINES, confidence: bool = False, min_confidence: float | None = None) -> Stats:
    """Translates line by line in input order; one output line (or n-best block) per input line.
    `progress(n)` gets whole lines as their batches are decoded (a chunk of `chunk_lines` is decoded in many batches),
    and never more than the lines read: a bar moves during a chunk and ends at the line count. confidence: each line
    carries its translation's confidence after a tab (an n-best line after ' ||| '); min_confidence: the numbers of the
    lines whose best translation's confidence is below it go to `stats.low_confidence`."""
    stats = Stats()
    start = time.perf_counter()
    backend = t.backend()
    for chunk in chunks(lines, chunk_lines):
        texts = [text for _, text in chunk]
        shown = _LineProgress(progress, len(chunk))
        results = translate_batch(t, texts, opts, backend, warn, strict, chunk[0][0], stats.truncated, text, stats.guarded,
                                  stats.repaired, stats.failed, shown.add)
        shown.finish()
        for (lineno, _), nbest in zip(chunk, results):
            if opts.n_best > 1:
                for h in nbest:
                    write(f"{lineno - 1} ||| {one_line(h.text)} ||| {h.score:.4f}" + (f" ||| {h.confidence:.3f}" if confidence else ""))
            else:
                write(one_line(nbest[0].text) + (f"\t{nbest[0].confidence:.3f}" if confidence else ""))
            if min_confidence is not None and nbest[0].confidence < min_confidence:
                stats.low_confidence.append(lineno)
            stats.sentences += nbest[0].sentences
            stats.target_tokens += nbest[0].tokens
        stats.lines += len(chunk)
    stats.seconds = time.perf_counter() - start
    return stats


class _LineProgress:
    """Turns a chunk's decoded shares (fractions of lines, per batch) into whole lines for a progress bar; a line retried
    alone after a failed batch is never counted twice."""

    def __init__(self, progress: Callable[[int], None], lines: int):
        self.progress, self.lines, self.share, self.shown = progress, lines, 0.0, 0

    def add(self, share: float) -> None:
        self.share = min(self.share + share, self.lines)
        whole = int(self.share + 1e-9)
        if whole > self.shown:
            self.progress(whole - self.shown)
            self.shown = whole

    def finish(self) -> None:
        if self.shown < self.lines:
            self.progress(self.lines - self.shown)
            self.shown = self.lines


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
            raise os_failure(f"cannot write -o {path}: {describe_os_error(e)}", e) from None

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
            raise self._failed(e) from None

    def commit(self) -> None:
        try:
            if self.writer:
                self.writer.commit()
            else:
                self.file.close()
        except OSError as e:
            self.abort()
            raise self._failed(e) from None

    def _failed(self, e: OSError) -> ToolkitError:
        # A full disk exits 1 as in every command (errors.os_failure); only a replaced file had an old version to keep.
        kept = "; the old file is unchanged" if self.writer else ""
        return os_failure(f"cannot write -o {self.path}: {describe_os_error(e)}{kept}", e)

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
