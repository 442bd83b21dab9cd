"""Copy data (the student recipe's copy pairs): training pairs that teach the model to copy names and rare capitalised
words verbatim.

The Tatoeba pairs name few people and places (Tom, Mary, Boston), so a model learns those as words and guesses at the
pieces of a name it has never seen (`Alexander` -> `Alexleand`). Each epoch, a share of the training pairs that hold a
name on both sides is added once more with every such name replaced, on both sides, by another. A name is a word
capitalised identically in the English (not only as its first word) and in the French of a training pair: Tom,
Boston, Google; London/Londres is not one, and is never replaced. The new names are the corpus's own and generated
ones of several shapes: syllables (Bralin), pieces of two real names joined (Alex + ander), accented letters (Zoëlin),
hyphenated (Mira-Tosh), a Mc/Van prefix (McTorran), random letters (Qexvorb). French elision follows the new name
(`le chien de Tom` -> `le chien d'Ingrid`, `d'Emily` -> `de Bralin`). Everything is seeded by the run's seed and the
epoch, so a resumed run sees the same pairs.

No name that the held-out rule reserves (toolkit.core.noise.is_held_out_name) is ever a substitute, here or in the
robustness noise, so the name test set (docs/names-test.tsv: real names chosen under that rule and absent from the
corpus) and the robustness set's names stay unseen. Torch-free.
"""

from __future__ import annotations

import random
import re
from collections import Counter

from toolkit.core import noise

UPPER, LOWER = "A-ZÀ-ÖØ-Þ", "a-zß-öø-ÿ"
WORD = rf"[{UPPER}][{LOWER}]+"
# A capitalised word, or two joined by a hyphen (Jean-Luc), not inside a longer word; `d'Emily` holds Emily.
NAME = re.compile(rf"(?<![\w-])({WORD}(?:-{WORD})?)(?![\w-])")
VOWELS = set("AEIOUYÀÂÄÉÈÊËÎÏÔÖÙÛÜŸaeiouyàâäéèêëîïôöùûüÿ")
# French words that elide before a vowel: de -> d', que -> qu', lorsque -> lorsqu' ...
ELIDING = ("de", "que", "lorsque", "puisque", "jusque")


def _word(name: str) -> re.Pattern:
    return re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])")


def names_in(en: str, fr: str, known: set[str] | None = None) -> list[str]:
    """The names of one pair, in English order: capitalised words (not the English's first word, unless `known`
    names it) found as whole words on both sides."""
    out = []
    for m in NAME.finditer(en):
        name = m.group(1)
        if name in out or (m.start() == 0 and (known is None or name not in known)):
            continue
        if (known is None or name in known) and _word(name).search(fr):
            out.append(name)
    return out


def corpus_names(pairs: list[tuple[str, str]]) -> Counter:
    """Every name of the pairs (see names_in) and how many pairs hold it."""
    counts: Counter = Counter()
    for en, fr in pairs:
        counts.update(names_in(en, fr))
    return counts


def _starts_with_vowel(word: str) -> bool:
    return word[:1] in VOWELS


def substitute(text: str, old: str, new: str, french: bool = False) -> str:
    """`old` replaced by `new` as a whole word; in French, `de`/`d'` (and que, lorsque ...) follow the new name."""
    if french:
        for full in ELIDING:
            short = full[:-1]
            if _starts_with_vowel(new):  # de Tom -> d'Ingrid
                pattern, tail = rf"(?<![\w-])({full[0]}){full[1:]} (?={re.escape(old)}(?![\w-]))", short[1:] + "'"
            else:  # d'Emily -> de Bralin
                pattern, tail = rf"(?<![\w-])({short[0]}){short[1:]}['’](?={re.escape(old)}(?![\w-]))", full[1:] + " "
            text = re.sub(pattern, lambda m, tail=tail: m.group(1) + tail, text, flags=re.IGNORECASE)
    return _word(old).sub(lambda m: new, text)


# ---- generated names -----------------------------------------------------------------------------

_ACCENTS = {"a": "áàâä", "e": "éèêë", "i": "íïî", "o": "óöô", "u": "üúû", "n": "ñ", "c": "ç"}
_PREFIXES = ("Mc", "Mac", "Van", "De", "Di", "O")
_RARE = "bcdfghjklmnpqrstvwxzaeiouy" + "qxzkjwv"


def _split_points(name: str) -> list[int]:
    """Where a name can be cut between syllables: after a vowel that a consonant follows."""
    return [i + 1 for i in range(1, len(name) - 2) if name[i].lower() in "aeiouy" and name[i + 1].lower() not in "aeiouy"]


def _recombined(rng: random.Random, real: list[str]) -> str:
    a, b = rng.choice(real), rng.choice(real)
    cut_a, cut_b = _split_points(a), _split_points(b)
    if not cut_a or not cut_b:
        return a
    return a[: rng.choice(cut_a)] + b[rng.choice(cut_b):].lower()


def _accented(rng: random.Random, base: str) -> str:
    spots = [i for i, c in enumerate(base) if i and c in _ACCENTS]
    if not spots:
        return base
    i = rng.choice(spots)
    return base[:i] + rng.choice(_ACCENTS[base[i]]) + base[i + 1:]


def _random_letters(rng: random.Random) -> str:
    return "".join(rng.choice(_RARE) for _ in range(rng.randint(4, 10))).capitalize()


def generated_names(real: list[str], n: int, seed: int) -> list[str]:
    """n distinct name-like strings of mixed shapes; none that the held-out rule reserves (noise.is_held_out_name)."""
    rng = random.Random(seed)
    syllables = noise.generate_names(max(n, 100), seed)
    real = [r for r in real if len(r) >= 4 and "-" not in r] or syllables[:50]
    shapes = [
        (0.35, lambda: rng.choice(syllables)),
        (0.30, lambda: _recombined(rng, real)),
        (0.12, lambda: _accented(rng, rng.choice(syllables + real))),
        (0.08, lambda: f"{rng.choice(syllables)}-{rng.choice(syllables + real)}"),
        (0.05, lambda: rng.choice(_PREFIXES) + rng.choice(syllables)),
        (0.10, lambda: _random_letters(rng)),
    ]
    weights = [w for w, _ in shapes]
    seen, out = set(real), []
    for _ in range(50 * n):
        if len(out) == n:
            break
        name = rng.choices(shapes, weights)[0][1]()
        if 3 <= len(name) <= 16 and name not in seen and not noise.is_held_out_name(name):
            seen.add(name)
            out.append(name)
    return out


class CopyData:
    """The copy pairs of each epoch for one run's training pairs (deterministic given the seed and the epoch)."""

    def __init__(self, pairs: list[tuple[str, str]], rate: float, seed: int = 0, pool_size: int | None = None):
        self.pairs, self.rate, self.seed = pairs, rate, seed
        pool_size = pool_size or min(20000, 1000 + 10 * len(pairs))  # 20,000 generated names for the corpus
        counts = corpus_names(pairs)
        self.known = set(counts)
        self.eligible = [i for i, (en, fr) in enumerate(pairs) if names_in(en, fr, self.known)]
        real = sorted(counts, key=lambda k: (-counts[k], k))
        # The corpus's own names as substitutes too: a name is a name wherever it stands.
        self.pool = [r for r in real if not noise.is_held_out_name(r)] + generated_names(real, pool_size, seed)

    def swap(self, en: str, fr: str, rng: random.Random) -> tuple[str, str, dict[str, str]] | None:
        """The pair with each of its names replaced on both sides by a different substitute, and {old: new};
        None if the pair holds no name or a substitute would clash with a word already there."""
        names = names_in(en, fr, self.known)
        if not names:
            return None
        swapped = {}
        for old in names:
            new = rng.choice(self.pool)
            if new == old or _word(new).search(en) or _word(new).search(fr):
                return None
            en, fr = substitute(en, old, new), substitute(fr, old, new, french=True)
            if _word(old).search(en) or _word(old).search(fr) or not (_word(new).search(en) and _word(new).search(fr)):
                return None
            swapped[old] = new
        return en, fr, swapped

    def epoch_pairs(self, epoch: int) -> list[tuple[str, str]]:
        """round(rate x pairs) copy pairs, drawn from the pairs that hold a name (with replacement if need be)."""
        want = round(self.rate * len(self.pairs))
        if not want or not self.eligible:
            return []
        rng = random.Random(self.seed * 1_000_003 + epoch * 7919 + 41)
        out: list[tuple[str, str]] = []
        for _ in range(4 * want):
            if len(out) == want:
                break
            made = self.swap(*self.pairs[rng.choice(self.eligible)], rng)
            if made:
                out.append(made[:2])
        return out
