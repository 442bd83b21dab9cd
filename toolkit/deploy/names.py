"""Names copied verbatim: how many names a model has never seen come out of it unchanged (the student recipe's goal).

The test set (docs/names-test.tsv, made by tools/names_test_set.py) holds real first names that occur nowhere in the
corpus and that the held-out rule (toolkit.core.noise.is_held_out_name) keeps out of every substitution made in
training, each put into a sentence of the held-out test split in the place of Tatoeba's stock name (Tom, Mary, ...),
on both sides. Nothing in it is used to train or to choose a model. A name counts as copied when the translation holds
it as a whole word (`d'Ingrid` holds Ingrid; `Ingride` does not), through tk translate's own path (input handling and
decoding guards on). Torch-free.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from toolkit.core.errors import DataError

DEFAULT_SET = Path(__file__).resolve().parents[2] / "docs" / "names-test.tsv"


@dataclass(frozen=True)
class NameCase:
    name: str  # the unseen name
    stock: str  # the corpus's name it replaced (Tom, Mary, ...)
    english: str
    french: str  # the held-out pair's French with the same replacement (a reference, not what is scored)


def read_cases(path: str | Path = DEFAULT_SET) -> list[NameCase]:
    """The cases of a name test set: 'name<TAB>stock<TAB>English<TAB>French' lines; '#' lines are comments."""
    path = Path(path)
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except OSError as e:
        raise DataError(f"cannot read the name test set {path} ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"the name test set {path} is not UTF-8 (byte {e.start})") from None
    cases = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 4 or not all(c.strip() for c in cols):
            raise DataError(f"{path}:{number}: expected name<TAB>stock<TAB>English<TAB>French")
        case = NameCase(*cols)
        if not copied(case.name, case.english):
            raise DataError(f"{path}:{number}: the English does not hold the name {case.name!r}")
        cases.append(case)
    if not cases:
        raise DataError(f"{path} holds no name cases")
    return cases


def copied(name: str, text: str) -> bool:
    """Whether `text` holds `name` verbatim as a whole word (case and accents as given)."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def score(cases: list[NameCase], outputs: list[str]) -> dict:
    """'names copied verbatim: k of n', with every miss and what came out instead."""
    if len(outputs) != len(cases):
        raise ValueError(f"{len(outputs)} outputs for {len(cases)} cases")
    missed = [{"name": c.name, "english": c.english, "output": o} for c, o in zip(cases, outputs) if not copied(c.name, o)]
    k, n = len(cases) - len(missed), len(cases)
    return {"copied": k, "total": n, "share": round(k / n, 4), "missed": missed}


def describe(result: dict) -> str:
    return f"names copied verbatim: {result['copied']} of {result['total']} ({100 * result['share']:.0f}%)"


def evaluate_names(directory, path: str | Path = DEFAULT_SET, beam: int = 4, threads: int | None = None,
                   variant: str = "fp32", echo=print, languages: dict | None = None) -> dict:
    """Translates every case's English as `tk translate --beam BEAM` would and scores the names (see score).
    `languages`: a multilingual model's source_lang and target_lang (None: its default pair)."""
    from toolkit.core.batching import DecodeOptions
    from toolkit.core.scoring import bleu_chrf
    from toolkit.deploy.translate import open_model, translate_batch

    cases = read_cases(path)
    model = open_model(directory, "cpu", variant, threads=threads).for_languages(**(languages or {}))
    start = time.perf_counter()
    opts = DecodeOptions.for_manifest(model.manifest, model.provider, beam=beam)
    outputs = [n[0].text for n in translate_batch(model, [c.english for c in cases], opts)]
    result = score(cases, outputs)
    bleu = bleu_chrf(outputs, [[c.french] for c in cases])
    result.update(search="greedy" if beam == 1 else f"beam{beam}", variant=variant, set=Path(path).name,
                  bleu=bleu["bleu"], chrf=bleu["chrf"], seconds=round(time.perf_counter() - start, 1))
    echo(describe(result))
    for miss in result["missed"]:
        echo(f"  missed {miss['name']}: {miss['english']} -> {miss['output']}")
    return result
