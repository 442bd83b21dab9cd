"""Training-pair noise that teaches the model how people type.

The Tatoeba pairs are all cased and punctuated and full of Tom and Mary, so a model
trained on them alone falls apart on `thank you`, `HELLO` or an unseen name. Each
function changes one pair the way a user would change the English, and the French
the way it would follow (lowercase both, drop the final punctuation of both), so the
model learns to mirror the input's style rather than to invent punctuation.
Deterministic given the rng; torch-free.
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import asdict, dataclass

from toolkit.core import placeholders

FINAL_PUNCT = re.compile(r"[\s.!?…]+$")
# Tatoeba's stock characters; any of them present on both sides is swapped for a fresh name.
STOCK_NAMES = ("Tom", "Mary", "John", "Alice", "Mike", "Bob", "Jack", "Jane", "Ken", "Emily")


@dataclass(frozen=True)
class NoiseConfig:
    """Probabilities, per training pair and epoch; the rest of the pairs stay as they are."""

    no_punct: float = 0.12  # drop the final punctuation of both sides
    lower_no_punct: float = 0.12  # lowercase both sides and drop their final punctuation
    lower: float = 0.04  # lowercase both sides
    title: float = 0.04  # English in Title Case; French unchanged
    names: float = 0.5  # replace each stock name found on both sides by a generated one
    name_placeholder: float = 0.15  # replace a stock name on both sides by a placeholder symbol
    spans: float = 0.9  # replace numbers found verbatim on both sides by placeholder symbols

    def asdict(self) -> dict:
        return asdict(self)


def strip_final_punct(text: str) -> str:
    return FINAL_PUNCT.sub("", text)


def title_case(text: str) -> str:
    """Every word capitalised ("Where Is The Station?"); str.title would give "I'M"."""
    return " ".join(w[:1].upper() + w[1:] for w in text.split(" "))


_ONSETS = ["", "b", "br", "c", "ch", "d", "dr", "f", "g", "gr", "h", "j", "k", "kl", "l", "m", "n", "p", "r", "s",
           "sh", "st", "t", "th", "tr", "v", "w", "z"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ie", "io", "ou", "y"]
_CODAS = ["", "", "", "l", "n", "r", "s", "th", "nd", "rt", "x", "m", "ck"]


def generate_names(n: int, seed: int) -> list[str]:
    """n distinct pronounceable names of 2 to 3 syllables (Bralin, Thoumex, ...)."""
    rng, names = random.Random(seed), []
    seen: set[str] = set()
    while len(names) < n:
        name = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(rng.choice((2, 2, 3))))
        name = name.capitalize()
        if 4 <= len(name) <= 11 and name not in seen:
            seen.add(name)
            names.append(name)
    return names


def is_held_out_name(name: str) -> bool:
    """One generated name in ten is reserved for evaluation, so the model never sees it in training."""
    return zlib.crc32(name.encode()) % 10 == 0


def training_names(seed: int = 0, n: int = 20000) -> list[str]:
    return [x for x in generate_names(n, seed) if not is_held_out_name(x)]


def evaluation_names(corpus_words: set[str], seed: int = 1, n: int = 20000) -> list[str]:
    return [x for x in generate_names(n, seed) if is_held_out_name(x) and x not in corpus_words]


def _swap_word(text: str, old: str, new: str) -> str:
    return re.sub(rf"\b{re.escape(old)}\b", new, text)


def protect_pair(en: str, fr: str, rng: random.Random, p: float) -> tuple[str, str]:
    """Spans the deploy path would protect in the English that also appear verbatim in the
    French become the same placeholder symbols on both sides (with probability p per pair)."""
    spans = placeholders.find_spans(en)
    if not spans or rng.random() >= p:
        return en, fr
    texts = [en[s:e] for s, e in spans]
    if not all(t in fr for t in texts):
        return en, fr
    en_out, kept = placeholders.protect(en)
    symbol = {t: placeholders.SYMBOLS[i] for i, t in reversed(list(enumerate(kept)))}
    # One pass, longest span first, never inside a longer number: "1" must not match in "10".
    pattern = "|".join(re.escape(t) for t in sorted(symbol, key=len, reverse=True))
    fr = re.sub(rf"(?<![\w⦅])(?:{pattern})(?![\w⦆])", lambda m: symbol[m.group(0)], fr)
    return en_out, fr


class PairNoise:
    """Applies NoiseConfig to pairs; one instance per training run (it holds the name list)."""

    def __init__(self, cfg: NoiseConfig, seed: int = 0):
        self.cfg = cfg
        self.names = training_names(seed)

    def __call__(self, en: str, fr: str, rng: random.Random) -> tuple[str, str]:
        c = self.cfg
        en, fr = protect_pair(en, fr, rng, c.spans)
        present = [n for n in STOCK_NAMES if re.search(rf"\b{n}\b", en) and re.search(rf"\b{n}\b", fr)]
        free = [s for s in placeholders.SYMBOLS if s not in en]
        for name in present:
            if free and rng.random() < c.name_placeholder and not placeholders.SYMBOL_RE.search(en):
                symbol = free.pop(0)
                en, fr = _swap_word(en, name, symbol), _swap_word(fr, name, symbol)
            elif rng.random() < c.names:
                new = rng.choice(self.names)
                en, fr = _swap_word(en, name, new), _swap_word(fr, name, new)
        r = rng.random()
        if r < c.no_punct:
            return strip_final_punct(en), strip_final_punct(fr)
        r -= c.no_punct
        if r < c.lower_no_punct:
            return strip_final_punct(en.lower()), strip_final_punct(fr.lower())
        r -= c.lower_no_punct
        if r < c.lower:
            return en.lower(), fr.lower()
        r -= c.lower
        if r < c.title:
            return title_case(en), fr
        return en, fr

    def pairs(self, pairs: list[tuple[str, str]], seed: int) -> list[tuple[str, str]]:
        """The noised copy of a list of pairs for one epoch (seeded by the epoch)."""
        rng = random.Random(seed)
        out = []
        for en, fr in pairs:
            en2, fr2 = self(en, fr, rng)
            if en2 and fr2:
                out.append((en2, fr2))
        return out
