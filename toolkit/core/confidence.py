"""How far to trust a translation: a confidence in [0, 1] that tells a translator which lines to check first.

A translation's confidence is the probability that it scores a sentence chrF of at least `threshold` (50 unless a
calibration says otherwise) against a human reference, estimated from what the decoder already knows of it (its
Signals): the length-normalised log-probability of the hypothesis, whether a decoding guard cut it, how much of the
source it copied untranslated, and whether its protected spans (numbers, URLs, kept terms) had to be repaired.

The probability comes from a logistic map of the score and the copied share. `tk evaluate DIR --calibrate` fits that
map on the model's own held-out sentences (the corpus's valid split, every Tatoeba Challenge test sentence left out) and
stores it in the directory's manifest.json; a directory without one gets DEFAULT, a fixed map that is monotone in both
(a higher score means a higher confidence, copying more of the source a lower one). Held-out data holds too few cut,
untranslated or repaired sentences to fit their weight, and each is a line a translator must look at whatever else the
model says, so each caps the confidence instead (GUARDED_MAX, UNTRANSLATED_MAX, REPAIRED_MAX).

Standard library only at import: manifest.py reads it, and the CLI imports that before numpy. Fitting and the rank
statistics import numpy when they run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from toolkit.core.errors import UsageError

THRESHOLD = 50.0  # sentence chrF the confidence is the probability of reaching
FEATURES = ("score", "copied")  # the inputs of the logistic map, in order
SIGNS = (1, -1)  # the sign each weight may have: a better score never lowers a confidence, copying more never raises it
SCORE_FLOOR = -10.0  # scores below it are taken as it: one runaway sentence cannot pull a fitted weight about
# Caps for what held-out data holds too few of to fit (see the module's docstring).
GUARDED_MAX = 0.1  # a guard cut the translation, and a wider beam ran away too
UNTRANSLATED_MAX = 0.1  # the output repeats the source's words: an untranslated copy
REPAIRED_MAX = 0.3  # the model did not copy every protected span exactly once; the fallback put them back
FAILED = 0.0  # tk failed on the line (an internal error): what it gives is a fallback's or an empty translation
UNTRANSLATED_SHARE = 0.8  # of the source's words found in the output, over at least UNTRANSLATED_WORDS of them
UNTRANSLATED_WORDS = 2

# A word: letters, with an inner apostrophe ("don't", "l'homme"); digits and placeholders are no words here.
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")


@dataclass(frozen=True)
class Signals:
    """What a translation's confidence is computed from."""

    score: float  # log-probability, length-normalised as the hypothesis was ranked
    copied: float = 0.0  # share of the source's words (names aside) that the output repeats
    untranslated: bool = False  # the output is a copy of the source (see copy_signals)
    guarded: str = ""  # "loop" or "length": a guard cut it (after a retry at a wider beam also ran away)
    repaired: bool = False  # its protected spans were put back by the fallback

    def features(self) -> tuple[float, ...]:
        """The logistic map's inputs, in FEATURES' order."""
        return (max(self.score, SCORE_FLOOR), self.copied)


def source_words(text: str) -> list[str]:
    """The words of a source sentence whose copy into the output means it was not translated: every word but the
    capitalised ones after the first (names, which a translation keeps: "Tom", "Boston"), case-folded."""
    return _source_words(_WORD.findall(text))


def _source_words(words: list[str]) -> list[str]:
    return [w.casefold() for k, w in enumerate(words) if k == 0 or not w[:1].isupper()]


def copy_signals(source: str, output: str) -> tuple[float, bool]:
    """(share of the source's words the output repeats, whether the output is an untranslated copy): at least
    UNTRANSLATED_WORDS words and UNTRANSLATED_SHARE of them repeated, or the same words in the same order."""
    # Each text's words are found once: this runs for every sentence of a file, after its decoding, on one core.
    found = _WORD.findall(source)
    words = _source_words(found)
    if not words:
        return 0.0, False
    written = [w.casefold() for w in _WORD.findall(output)]
    seen = set(written)
    share = len([w for w in words if w in seen]) / len(words)
    same = [w.casefold() for w in found] == written
    return share, len(words) >= UNTRANSLATED_WORDS and (share >= UNTRANSLATED_SHARE or same)


def signals(source: str, output: str, score: float, guarded: str = "") -> Signals:
    """The Signals of one sentence's translation (`guarded`: what stopped it, Hypothesis.stopped)."""
    copied, untranslated = copy_signals(source, output)
    return Signals(score, copied, untranslated, guarded)


@dataclass(frozen=True)
class Calibration:
    """A logistic map from Signals to P(sentence chrF >= threshold), and what it was fitted on."""

    bias: float
    weights: tuple[float, ...]  # one per FEATURES entry
    threshold: float = THRESHOLD
    fitted: dict | None = field(default=None, compare=False)  # None: DEFAULT, fitted on nothing

    @property
    def calibrated(self) -> bool:
        return self.fitted is not None

    def probability(self, s: Signals) -> float:
        """The logistic map alone, without the caps."""
        total = 0.0  # summed in sum()'s order, without a generator: this runs for every sentence translated
        for w, x in zip(self.weights, s.features()):
            total += w * x
        z = self.bias + total
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    def confidence(self, s: Signals) -> float:
        """The confidence of a translation with these Signals, in [0, 1]."""
        p = self.probability(s)
        if s.guarded:
            p = min(p, GUARDED_MAX)
        if s.untranslated:
            p = min(p, UNTRANSLATED_MAX)
        if s.repaired:
            p = min(p, REPAIRED_MAX)
        return p

    def describe(self) -> str:
        """One line saying which map gives the confidences, for tk translate's stderr."""
        if not self.calibrated:
            return ("confidence: the uncalibrated default map (calibrate the model's with `tk evaluate DIR --calibrate "
                    "--challenge FILE`)")
        f = self.fitted
        count = f"{f['sentences']:,}" if isinstance(f.get("sentences"), int) else "its"
        return f"confidence: P(sentence chrF >= {self.threshold:g}), calibrated on {count} held-out sentences ({f.get('split', '?')} split)"

    def to_dict(self) -> dict:
        return {"kind": "logistic", "features": list(FEATURES), "bias": self.bias, "weights": list(self.weights),
                "threshold": self.threshold, "fitted": self.fitted or {}}

    @classmethod
    def from_dict(cls, data: object, where: str = "manifest.json") -> Calibration:
        """A stored calibration; a malformed one is a UsageError naming it and the fix."""
        problem = calibration_problem(data)
        if problem:
            raise UsageError(f"{where}: confidence {problem}; run `tk evaluate DIR --calibrate --challenge FILE` again")
        return cls(float(data["bias"]), tuple(float(w) for w in data["weights"]), float(data["threshold"]), dict(data["fitted"]))


# The uncalibrated map: P(chrF >= 50) from the score as the shipped Transformer's 1,125 held-out sentences show it (fitted
# once and rounded; 78% of them reach 50: a score of -1.0, their median, gives 0.84, and -3.4, their worst 5%, 0.40), and
# a copied share that lowers it. Monotone (SIGNS), whatever the model.
DEFAULT = Calibration(bias=2.5, weights=(0.85, -1.0))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def calibration_problem(data: object) -> str | None:
    """What is wrong with a stored calibration (manifest.json's `confidence`), or None."""
    if not isinstance(data, dict):
        return "must be a JSON object"
    if data.get("kind") != "logistic" or data.get("features") != list(FEATURES):
        return f"must be a logistic map of the features {list(FEATURES)} (a newer tk wrote it?)"
    weights = data.get("weights")
    if not isinstance(weights, list) or len(weights) != len(FEATURES) or not all(map(_number, weights)):
        return f"weights must be {len(FEATURES)} finite numbers"
    if not _number(data.get("bias")) or not _number(data.get("threshold")):
        return "bias and threshold must be finite numbers"
    if not isinstance(data.get("fitted"), dict):
        return "fitted must be a JSON object saying what it was fitted on"
    return None


def for_manifest(m: object) -> Calibration:
    """The calibration of a model directory's manifest (toolkit.core.manifest.Manifest), DEFAULT without one; read
    once per manifest (decode_sentences asks at every call, a single request included)."""
    stored = getattr(m, "confidence", None)
    cached = m.__dict__.get("_calibration")
    if cached is None or cached[0] is not stored:
        parsed = DEFAULT if stored is None else Calibration.from_dict(stored, str(m.directory / "manifest.json"))
        cached = m.__dict__["_calibration"] = (stored, parsed)
    return cached[1]


# ---- fitting and measuring (numpy) ----------------------------------------------------------------------------------


def fit(signals_list: Sequence[Signals], chrf: Sequence[float], threshold: float = THRESHOLD, fitted: dict | None = None,
        l2: float = 1e-2) -> Calibration:
    """Logistic regression of [chrF >= threshold] on the Signals' features, by Newton's method, with a small L2 penalty on
    the weights so that a feature constant in the data (no sentence copied anything) keeps its weight at 0 instead of
    failing. A weight of the wrong sign (SIGNS) is held at 0 and the others fitted again: the map stays monotone. Only
    sentences no cap applies to are fitted: the caps stand for the others. `fitted`: what the data was, stored with it."""
    import numpy as np

    usable = [(s, c) for s, c in zip(signals_list, chrf) if not (s.guarded or s.untranslated or s.repaired)]
    if len(usable) < 20:
        raise UsageError(f"calibrating needs at least 20 held-out sentences, got {len(usable)}; give a larger corpus")
    x = np.array([s.features() for s, _ in usable], dtype=np.float64)
    y = np.array([c >= threshold for _, c in usable], dtype=np.float64)
    if y.min() == y.max():
        raise UsageError(f"every held-out sentence is on one side of chrF {threshold:g}: nothing to calibrate against; "
                         "give a larger corpus")
    free = list(range(len(FEATURES)))
    while True:
        w = _logistic(x[:, free], y, l2)
        weights = dict(zip(free, w[1:]))
        wrong = [j for j in free if weights[j] * SIGNS[j] < 0]
        if not wrong:
            break
        free = [j for j in free if j not in wrong]
    info = {**(fitted or {}), "sentences": len(usable), "positives": int(y.sum())}
    return Calibration(round(float(w[0]), 6), tuple(round(float(weights.get(j, 0.0)), 6) for j in range(len(FEATURES))),
                       threshold, info)


def _logistic(x, y, l2: float):
    """Bias and weights of a logistic regression of y on the columns of x (Newton's method: it converges in a few steps)."""
    import numpy as np

    a = np.hstack([np.ones((len(x), 1)), x])
    penalty = np.diag([0.0] + [l2 * len(x)] * x.shape[1])
    w = np.zeros(a.shape[1])
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(a @ w)))
        step = np.linalg.solve((a * (p * (1 - p))[:, None]).T @ a + penalty, a.T @ (y - p) - penalty @ w)
        w += step
        if np.abs(step).max() < 1e-9:
            break
    return w


def ranks(values: Sequence[float]):
    """Ranks from 0, ties given their mean rank (as Spearman's correlation needs)."""
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(v, kind="stable")
    sorted_v = v[order]
    # Each run of equal values shares the mean of the positions it spans.
    starts = np.flatnonzero(np.r_[True, sorted_v[1:] != sorted_v[:-1]])
    ends = np.r_[starts[1:], len(v)]
    mean_rank = (starts + ends - 1) / 2.0
    out = np.empty(len(v))
    out[order] = np.repeat(mean_rank, ends - starts)
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson's of the ranks); 0 where either side is constant."""
    import numpy as np

    ra, rb = ranks(a), ranks(b)
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


LOW_SHARE = 0.10  # the share of sentences with the lowest confidence that `tk evaluate` compares with the rest


def report(confidences: Sequence[float], chrf: Sequence[float], threshold: float = THRESHOLD) -> dict:
    """How well confidences single out the bad translations: the mean sentence chrF of the LOW_SHARE of sentences with
    the lowest confidence against the rest's (the gap: how much worse the flagged lines are), Spearman's correlation of
    confidence and sentence chrF, and the mean confidence beside the share of sentences that reach `threshold` (what
    a calibrated mean confidence estimates)."""
    import numpy as np

    c, q = np.asarray(confidences, dtype=np.float64), np.asarray(chrf, dtype=np.float64)
    if len(c) < 2:
        raise UsageError("measuring confidence needs at least 2 sentences")
    k = max(1, int(round(LOW_SHARE * len(c))))
    order = np.argsort(c, kind="stable")
    low, rest = q[order[:k]].mean(), q[order[k:]].mean()
    return {"sentences": len(c), "low_share": LOW_SHARE, "low_chrf": round(float(low), 2), "rest_chrf": round(float(rest), 2),
            "gap": round(float(rest - low), 2), "spearman": round(spearman(c, q), 4), "mean_confidence": round(float(c.mean()), 4),
            "threshold": threshold, "reaching_threshold": round(float((q >= threshold).mean()), 4)}


def held_out(pairs: Sequence[tuple[str, str]], challenge_english: Sequence[str]) -> list[tuple[str, str]]:
    """The (English, French) pairs a calibration is fitted on: a held-out split's, every English sentence of the Tatoeba
    Challenge test set left out (its scores are what `tk evaluate` reports, and a map tuned on them would flatter them)."""
    banned = set(challenge_english)
    return [(en, fr) for en, fr in pairs if en not in banned]
