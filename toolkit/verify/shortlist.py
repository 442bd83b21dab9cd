"""`tk verify DIR --shortlist`: the guard of a stored shortlist (toolkit.core.shortlist), as the int8 variant is guarded.

Held-out sentences are translated with and without the shortlist, on the same graphs; the shortlist is refused when
fewer than MIN_IDENTICAL of the translations are identical, or when its BLEU or chrF falls more than WITHIN below the
output's without it. The sentences that differ are named, so a user sees what the shortlist changed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MIN_IDENTICAL = 0.995  # share of held-out translations the shortlist must leave as they are
WITHIN = 0.5  # BLEU and chrF points the shortlist may lose against the output without it
SENTENCES = 1000  # held-out sentences translated (from the start of the test split)
SHOWN = 10  # differing sentences named in the report


@dataclass
class ShortlistVerdict:
    origin: str  # where the sentences came from
    variant: str
    sentences: int
    identical: int
    min_identical: float
    plain: dict  # BLEU and chrF without the shortlist
    shortlisted: dict  # and with it
    differing: list[tuple[int, str, str, str]] = field(default_factory=list)  # (1-based index, source, without, with)
    candidates: float = 0.0  # mean candidates a sentence decodes over
    vocab: int = 0  # of the output layer they are drawn from

    @property
    def share(self) -> float:
        return self.identical / max(self.sentences, 1)

    @property
    def problems(self) -> list[str]:
        out = []
        if self.share < self.min_identical:
            out.append(f"{self.share:.1%} of translations identical, under the {self.min_identical:.1%} required")
        for metric in ("bleu", "chrf"):
            if self.shortlisted[metric] < self.plain[metric] - WITHIN:
                out.append(f"{metric} {self.shortlisted[metric]:.2f}, more than {WITHIN} below {self.plain[metric]:.2f} without it")
        return out


def check(model_dir: str | Path, variant: str = "fp32", sentences: int = SENTENCES, data: str | Path | None = None,
          min_identical: float = MIN_IDENTICAL) -> ShortlistVerdict:
    """Greedy translations of the first `sentences` held-out sentences (with references), with and without the shortlist."""
    from toolkit.core import data as data_mod
    from toolkit.core.scoring import bleu_chrf
    from toolkit.deploy.api import Translator

    corpus = data_mod.load_corpus(data, download=False)
    english, references = data_mod.references(corpus.splits["test"])
    english, references = english[:sentences], references[:sentences]
    with warnings.catch_warnings():  # a span the model did not copy is put back in both; the report compares what is left
        warnings.simplefilter("ignore")
        plain = Translator(model_dir, provider="cpu", variant=variant).translate(english)
        translator = Translator(model_dir, provider="cpu", variant=variant, shortlist=True)
        shortlisted = translator.translate(english)
    differing = [(i + 1, s, a, b) for i, (s, a, b) in enumerate(zip(english, plain, shortlisted)) if a != b]
    candidates, vocab = _sizes(translator, english)
    return ShortlistVerdict(f"test split of {data_mod.describe(corpus)}", variant, len(english), len(english) - len(differing),
                            min_identical, bleu_chrf(plain, references), bleu_chrf(shortlisted, references), differing,
                            candidates, vocab)


def record(model_dir: str | Path, verdict: ShortlistVerdict) -> str:
    """Stores the verdict in the shortlist's record of manifest.json (`tk verify --shortlist --record`), where tk translate,
    tk serve and Translator read it when they decode with the shortlist (toolkit.core.shortlist.unguarded_note); returns
    the variant it is recorded for. A shortlist exported again starts without one."""
    from toolkit.core import manifest as manifest_mod
    from toolkit.core.shortlist import checked_as

    key = checked_as(verdict.variant)
    with manifest_mod.updating(model_dir) as m:
        m.shortlist.checked = {**(m.shortlist.checked or {}), key: {
            "accepted": not verdict.problems, "identical": round(verdict.share, 4), "sentences": verdict.sentences,
            "bleu": [verdict.plain["bleu"], verdict.shortlisted["bleu"]], "chrf": [verdict.plain["chrf"], verdict.shortlisted["chrf"]]}}
    return key


def _sizes(translator, english: list[str]) -> tuple[float, int]:
    """The mean number of candidates the sentences decode over, and the output layer's size: what the shortlist saves."""
    from toolkit.core import shortlist as table_mod
    from toolkit.graphs.shortlist import OUTPUT

    m = translator.loaded.manifest
    vocab = next(t.dims[-1] for t in m.specs()["decoder"].outputs if t.name == OUTPUT)
    table = table_mod.load(m.directory / m.shortlist.file)
    sizes = [len(table.candidates(np.array([ids[: m.max_len]]), np.array([len(ids[: m.max_len])]))[0])
             for ids in translator.loaded.tokenizer.encode(english)]
    return float(np.mean(sizes)), int(vocab)


def render(v: ShortlistVerdict) -> list[str]:
    """The report's lines: the verdict, the scores, then the sentences that differ (the first SHOWN)."""
    verdict = "refused: " + "; ".join(v.problems) if v.problems else "accepted"
    lines = [f"shortlist on {v.variant}, {v.sentences:,} sentences ({v.origin}): {v.identical:,} identical ({v.share:.1%}); "
             f"BLEU {v.plain['bleu']:.2f} -> {v.shortlisted['bleu']:.2f}, chrF {v.plain['chrf']:.2f} -> {v.shortlisted['chrf']:.2f}; "
             f"{v.candidates:,.0f} candidates a sentence on average, of {v.vocab:,}",
             f"shortlist {verdict}"]
    for n, source, without, with_ in v.differing[:SHOWN]:
        lines.append(f"  sentence {n}: {source!r}: {without!r} -> {with_!r}")
    if len(v.differing) > SHOWN:
        lines.append(f"  ... and {len(v.differing) - SHOWN} more")
    return lines
