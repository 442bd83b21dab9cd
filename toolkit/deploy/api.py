"""The public Python API: translate with an exported model directory from your own code.

    from toolkit import Translator
    Translator("exported/transformer").translate(["Hello."], beam=4)

Torch-free, like `tk translate`, which calls the same functions: the same options give the same output.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

from toolkit.core.decode_options import MAX_THREADS, DecodeOptions, count_problem, declared, shown
from toolkit.core.engines import PROVIDERS
from toolkit.core.errors import UsageError
from toolkit.core.glossary import Glossary
from toolkit.core.glossary import from_mapping as glossary_from
from toolkit.core.manifest import Manifest
from toolkit.core.shipped import default_model
from toolkit.core.textprep import TextOptions
from toolkit.deploy import markup
from toolkit.deploy.translate import Translation, failure_notes, open_model, translate_batch
from toolkit.runtimes import DEFAULT_RUNTIME, names

_SURROGATE = re.compile("[\ud800-\udfff]")
FORMATS = ("text", "html")  # what a text is: plain text, or an HTML fragment whose markup is kept (toolkit.deploy.markup)
# The keywords of translate and translate_batch beyond beam and n_best: the declared decoding options the API takes.
OPTIONS = tuple(o.name for o in declared("api") if o.name not in ("beam", "n_best"))


def _check_model_arguments(provider: object, variant: object, threads: object, allow_cpu_fallback: object) -> None:
    """Translator's own arguments, checked before anything loads: a provider of 'tpu' was a KeyError, threads of '2'
    an ONNX Runtime message that blamed the model, threads of 0 were taken."""
    if provider is not None and provider not in PROVIDERS:
        raise UsageError(f"provider must be {', '.join(map(repr, PROVIDERS))} or None for CUDA where it truly loads (got {shown(provider)})")
    if variant is not None and not isinstance(variant, str):
        raise UsageError(f"variant must be a variant name (a str) or None for the fastest (got {shown(variant)})")
    if threads is not None:
        problem = count_problem("threads", threads, 1, MAX_THREADS, "leave it out for the default")
        if problem:
            raise UsageError(problem)
    _check_flag("allow_cpu_fallback", allow_cpu_fallback)


def _check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False (got {shown(value)})")


def _texts(texts: object) -> list[str]:
    """The texts to translate as a list of str, or a one-line error naming the first that is not one."""
    if isinstance(texts, str):
        raise UsageError("translate takes a list of texts; wrap a single sentence in a list: [\"Hello.\"]")
    if isinstance(texts, (Mapping, AbstractSet, bytes, bytearray)) or not isinstance(texts, Iterable):
        # A dict iterates over its keys and a set in no set order: the answer would translate the wrong thing silently.
        raise UsageError(f"translate takes a list of texts (str), not a {type(texts).__name__} (got {shown(texts)}); "
                         "give a list, e.g. list(d.values()) for a dict's texts")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise UsageError(f"texts[{i}] is {shown(text)}, not a str; give every text as a str (\"\" for an empty line)")
        if found := _SURROGATE.search(text):
            # A lone UTF-16 surrogate is no character: the tokenizer cannot encode it (as tk serve answers 400).
            raise UsageError(f"texts[{i}] has a lone surrogate (\\u{ord(found.group()):04x} at {found.start()}), which is not "
                             "Unicode text; decode the input with errors='replace' or fix it")
    return texts


def _keep(keep: object) -> tuple[str, ...]:
    """The terms to copy verbatim. A single str is one term: iterated, "Paris" was kept letter by letter."""
    if keep is None or isinstance(keep, str):
        return (keep,) if keep else ()
    terms = tuple(keep) if isinstance(keep, Iterable) else None
    if terms is None or not all(isinstance(term, str) for term in terms):
        raise UsageError(f"keep must be a list of terms (str), or one term (got {shown(keep)})")
    return terms


class SpanRepairWarning(UserWarning):
    """A translation's protected spans were put back by the fallback (the model dropped, repeated or invented one)."""


class ShortlistWarning(UserWarning):
    """The directory's shortlist was refused by `tk verify --shortlist` on this variant, or never checked there."""


class TextFailedWarning(UserWarning):
    """tk failed on one of the texts (an internal error): it was translated as plain text without placeholders, or
    given an empty translation; the other texts are translated as usual."""


class Translator:
    """An exported translation model loaded on ONNX Runtime (model_dir None: $TK_MODEL, else the model installed
    with tk; provider None: CUDA if it truly loads, else CPU; variant None: the fastest graphs with fp32's output
    there, the attention-fused "optimized" ones on CPU). runtime "openvino" runs the graphs on OpenVINO's CPU plugin,
    "ctranslate2" the directory's CTranslate2 model (`tk export DIR --ctranslate2`). shortlist: each sentence decodes
    over its own candidates of the directory's shortlist (`tk export DIR --shortlist FILE`), the same alone or in a batch."""

    def __init__(self, model_dir: str | Path | None = None, provider: str | None = None, variant: str | None = None,
                 threads: int | None = None, allow_cpu_fallback: bool = False, runtime: str = DEFAULT_RUNTIME,
                 shortlist: bool = False) -> None:
        if model_dir is not None and not isinstance(model_dir, (str, os.PathLike)):
            raise UsageError(f"model_dir must be a model directory's path (a str or pathlib.Path), or None for the default "
                             f"model (got {shown(model_dir)})")
        _check_model_arguments(provider, variant, threads, allow_cpu_fallback)
        _check_flag("shortlist", shortlist)
        if runtime not in names():
            raise UsageError(f"runtime must be one of {', '.join(map(repr, names()))} (got {shown(runtime)})")
        if model_dir is None:
            model_dir = default_model()
        self.model_dir = Path(model_dir)
        self.loaded = open_model(model_dir, provider, variant, allow_cpu_fallback, threads, runtime=runtime, shortlist=shortlist)
        if self.loaded.note:
            warnings.warn(self.loaded.note, ShortlistWarning, stacklevel=2)
        self.variant = self.loaded.variant
        self._backend = self.loaded.backend()

    @property
    def provider(self) -> str:
        """The ONNX Runtime provider the graphs run on: "cpu" or "cuda"."""
        return self.loaded.provider

    @property
    def manifest(self) -> Manifest:
        return self.loaded.manifest

    def translate_batch(self, texts: Sequence[str], beam: int = 1, n_best: int = 1, keep: Sequence[str] = (),
                        split: bool = True, raw: bool = False, strict: bool = False, source_lang: str | None = None,
                        target_lang: str | None = None, glossary: Mapping[str, str] | Glossary | None = None,
                        **options) -> list[list[Translation]]:
        """The n-best translations (text, score, token counts, confidence) of each text, in input order. A translation's
        `confidence` (0 to 1; toolkit.core.confidence) says how far to trust it: low marks a line a person should check.

        `options` are the other declared decoding options (OPTIONS: alpha, max_len, batch_size, max_tokens, max_len_a,
        max_len_b, loop_guard, streams; toolkit.core.decode_options), each default as `tk translate`'s;
        keep/split/raw/strict mean what `tk translate --keep/--no-split/--raw/--strict` mean (keep: a list of terms,
        or one term as a str). A bad value of any of them is a UsageError naming it, the value and what is accepted.
        glossary: source term -> target term ({"house": "demeure"}), or toolkit.core.glossary.load("terms.tsv"), as
        `tk translate --glossary`: each occurrence of a source term comes out as its target term, exactly once.
        """
        texts = _texts(texts)
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            known = ", ".join(("beam", "n_best", "keep", "split", "raw", "strict", "source_lang", "target_lang", "glossary", *OPTIONS))
            raise UsageError(f"translate has no option {shown(unknown[0])}; its options: {known}")
        for name, flag in (("split", split), ("raw", raw), ("strict", strict)):
            _check_flag(name, flag)
        terms = glossary_from(glossary)
        # A multilingual model's languages (None: its own defaults): the source code on each sentence, the target forced first.
        loaded = self.loaded.for_languages(source_lang, target_lang)
        m = loaded.manifest
        opts = DecodeOptions.for_manifest(m, self.provider, beam=beam, n_best=n_best, **options)
        repaired: list[int] = []
        said: list[str] = []
        failed: list[int] = []  # texts tk failed on (1-based): each got a fallback's or an empty translation
        out = translate_batch(loaded, texts, opts, self._backend, strict=strict,
                              text=TextOptions(keep=_keep(keep), split=split, enabled=not raw, glossary=terms), repaired=repaired,
                              warn=said.append, failed=failed)
        for n, note in failure_notes(said, failed):  # one text cannot fail the others: it is named, they are translated
            warnings.warn(f"texts[{n - 1}]: {note}", TextFailedWarning, stacklevel=3)
        if repaired:
            # Visible, as tk translate's warning is: a number or kept term had to be put back by the fallback.
            positions = ", ".join(str(i - 1) for i in repaired[:5]) + (" ..." if len(repaired) > 5 else "")
            warnings.warn(f"the model did not copy every protected span (number, URL, e-mail, kept or glossary term) exactly once in "
                          f"texts[{positions}]; each was put back once by the fallback", SpanRepairWarning, stacklevel=3)
        return out

    def translate(self, texts: Sequence[str], beam: int = 1, format: str = "text", **options) -> list[str]:
        """The best translation of each text, in input order. format "html": each text is an HTML fragment whose text is
        translated and whose markup is kept in place (toolkit.deploy.markup; `tk translate --format html`)."""
        if format not in FORMATS:
            raise UsageError(f"format must be {' or '.join(map(repr, FORMATS))} (got {shown(format)})")
        if format == "html":
            return markup.translate_html(_texts(texts), lambda xs: [n[0].text for n in self.translate_batch(xs, beam=beam, **options)])
        return [nbest[0].text for nbest in self.translate_batch(texts, beam=beam, **options)]
