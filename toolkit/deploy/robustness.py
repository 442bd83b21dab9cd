"""Robustness evaluation: the held-out test split as people type it.

Every set is derived from the held-out test split with a seeded generator, so it never
overlaps training and is the same on every machine; the seed and set sizes are recorded.
Scores on the derived sets are computed case-insensitively and ignoring final punctuation
(on hypotheses and references alike), since the input lacked them; the clean set is
reported both ways so the comparison is like for like.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from toolkit.core import noise
from toolkit.core.scoring import bleu_chrf

NUMBER_WORDS = {"two": "deux", "three": "trois", "four": "quatre", "five": "cinq", "six": "six", "seven": "sept",
                "eight": "huit", "nine": "neuf", "ten": "dix", "twenty": "vingt", "thirty": "trente", "hundred": "cent"}
NAME_RE = re.compile(r"\b(Tom|Mary)\b")


@dataclass
class RobustSet:
    name: str
    sources: list[str]
    references: list[list[str]]
    spans: list[list[str]] = field(default_factory=list)  # pass-through: what must appear verbatim
    normalized: bool = True  # score case-insensitively, ignoring final punctuation


def fold(text: str) -> str:
    """What the derived sets are scored on: lowercase, no final punctuation."""
    return noise.strip_final_punct(text.lower())


def _spans_for(kind: str, rng: random.Random, names: list[str]) -> str:
    if kind == "name":
        return rng.choice(names)
    if kind == "email":
        return f"{rng.choice(names).lower()}.{rng.choice(names).lower()}@{rng.choice(['example.com', 'mail.org', 'uni-x.edu'])}"
    if kind == "url":
        return f"https://www.{rng.choice(names).lower()}.{rng.choice(['com', 'org', 'fr'])}/{rng.choice(names).lower()}?id={rng.randint(1, 999)}"
    if kind == "number":
        return str(rng.choice([rng.randint(11, 999), rng.randint(1000, 99999)]))
    return f"{rng.randint(1, 12)}:{rng.choice(['00', '15', '30', '45'])}"  # time


def passthrough_set(english: list[str], refs: list[list[str]], names: list[str], seed: int) -> RobustSet:
    """Held-out sentences with a name slot (Tom, Mary) filled by an unseen name, an e-mail address
    or a URL, and sentences with a number word replaced by digits or a time."""
    rng = random.Random(seed)
    src, out_refs, spans = [], [], []
    for en, rs in zip(english, refs):
        m = NAME_RE.search(en)
        if m and all(m.group(1) in r for r in rs):
            span = _spans_for(rng.choice(["name", "name", "email", "url"]), rng, names)
            src.append(en.replace(m.group(1), span, 1))
            out_refs.append([r.replace(m.group(1), span, 1) for r in rs])
            spans.append([span])
            continue
        words = [w for w in NUMBER_WORDS if re.search(rf"\b{w}\b", en, re.I) and all(re.search(rf"\b{NUMBER_WORDS[w]}\b", r, re.I) for r in rs)]
        if words:
            w = words[0]
            span = _spans_for(rng.choice(["number", "number", "time"]), rng, names)
            src.append(re.sub(rf"\b{w}\b", span, en, count=1, flags=re.I))
            out_refs.append([re.sub(rf"\b{NUMBER_WORDS[w]}\b", span, r, count=1, flags=re.I) for r in rs])
            spans.append([span])
    return RobustSet("pass_through", src, out_refs, spans)


def joined_set(english: list[str], refs: list[list[str]], seed: int, n: int = 500) -> RobustSet:
    """Lines of two or three held-out sentences; references join each sentence's i-th reference."""
    rng = random.Random(seed)
    src, out_refs = [], []
    for _ in range(n):
        idx = rng.sample(range(len(english)), rng.choice((2, 3)))
        src.append(" ".join(english[i] for i in idx))
        width = min(4, max(len(refs[i]) for i in idx))
        out_refs.append([" ".join(refs[i][min(k, len(refs[i]) - 1)] for i in idx) for k in range(width)])
    return RobustSet("joined", src, out_refs, normalized=False)


def build_sets(english: list[str], refs: list[list[str]], corpus_words: set[str], seed: int = 0) -> list[RobustSet]:
    names = noise.evaluation_names(corpus_words, seed=seed + 1)
    short = [(en, rs) for en, rs in zip(english, refs) if len(en.split()) <= 3]
    return [
        RobustSet("clean", english, refs, normalized=False),
        RobustSet("clean_folded", english, refs),
        RobustSet("no_final_punct", [noise.strip_final_punct(e) for e in english], refs),
        RobustSet("lower_no_punct", [fold(e) for e in english], refs),
        RobustSet("all_caps", [e.upper() for e in english], refs),
        RobustSet("title_case", [noise.title_case(e) for e in english], refs),
        RobustSet("short", [e for e, _ in short], [r for _, r in short]),
        RobustSet("short_typed", [fold(e) for e, _ in short], [r for _, r in short]),
        passthrough_set(english, refs, names, seed),
        joined_set(english, refs, seed),
    ]


def is_runaway(source: str, output: str) -> bool:
    """Longer than 3 times the source plus 20 characters, or a word repeated 4 times in a row."""
    if len(output) > 3 * len(source) + 20:
        return True
    words = output.lower().split()
    return any(len(set(words[i : i + 4])) == 1 for i in range(len(words) - 3))


def score_set(s: RobustSet, hyps: list[str]) -> dict:
    if s.normalized:
        scores = bleu_chrf([fold(h) for h in hyps], [[fold(r) for r in rs] for rs in s.references])
    else:
        scores = bleu_chrf(hyps, s.references)
    out = {"sentences": len(hyps), "bleu": scores["bleu"], "chrf": scores["chrf"],
           "scoring": "lowercase, final punctuation ignored" if s.normalized else "cased, as is"}
    if s.name.startswith("short"):
        hits = sum(fold(h) in {fold(r) for r in rs} for h, rs in zip(hyps, s.references))
        out["exact_match"] = round(100 * hits / max(len(hyps), 1), 2)
    if s.spans:
        kept = sum(all(sp in h for sp in spans) for h, spans in zip(hyps, s.spans))
        out["pass_through"] = round(100 * kept / max(len(hyps), 1), 2)
    return out


def table(results: dict) -> str:
    """The robustness report as an aligned text table."""
    head = f"{'set':<16} {'lines':>6} {'BLEU':>6} {'chrF':>6} {'match%':>7} {'kept%':>6} {'runaway% (guards on/off)':>25}"
    rows = [head, "-" * len(head)]
    for name, r in results["sets"].items():
        match = f"{r['exact_match']:.1f}" if "exact_match" in r else ""
        kept = f"{r['pass_through']:.1f}" if "pass_through" in r else ""
        run = f"{r['runaway_guarded']:.2f} / {r['runaway_unguarded']:.2f}"
        rows.append(f"{name:<16} {r['sentences']:>6} {r['bleu']:>6.2f} {r['chrf']:>6.2f} {match:>7} {kept:>6} {run:>25}")
    return "\n".join(rows)
