"""What a glossary costs and gains with the shipped model: the term rate, the rest of the sentence, the decode time,
and a 10,000-entry glossary's load time and cost per sentence. docs/glossary.md gives the figures.

    python docs/measurements/glossary/measure.py [--model exported/transformer] [--data ../shared/data/fra-eng.zip]
        [--threads 1] [--provider cpu|cuda] [--only terms|time|big] [--split test|valid] [--forced-beam 4] [--json OUT]

The term test sets come from fra-eng.zip's held-out splits (toolkit.core.data: the valid and test English sentences,
which the shipped model never trained on; not the Tatoeba Challenge test set). LEXICON lists English word forms with
French forms that translate them. The model's own choice for each English word is the French form it writes most
often on the valid split (without a glossary). Two sets per split:
- "reference": held-out pairs whose English holds one LEXICON word and whose reference French holds one of its forms
  other than the model's own choice: the glossary asks for that form (as a company's glossary asks for its word);
- "other": pairs whose reference holds the model's own choice: the glossary asks for another form of the word (the
  first LEXICON lists), so the reference's words around it may no longer agree with it (harder on BLEU).
The valid split's sets were used to choose how the glossary works (FORCED_BEAM, FORCED_MARGIN and the checks in
toolkit.deploy.translate._forced); the test split's were used for nothing but these figures.

Each item is translated three ways (MODES): without a glossary (the model alone); by placeholders alone (mechanism
(a): each term a placeholder put back as its target); and by tk's glossary (the terms as written, their targets forced
in by constrained decoding where the model does not write them itself, placeholders where that fails its checks). A
model not trained on placeholders (an import, `--model` of `tk export hf:DIR`) is translated the first and last ways:
its glossary is constrained decoding alone, and "written" counts the sentences that got their targets that way (the
others are reported, the model's own translation).

Figures:
- term rate: items whose output holds the wanted form exactly as often as the English holds the word (whole words,
  as written, a hyphen counting as part of a word);
- BLEU and chrF of the rest of the sentence: every French form of the item's word removed from the output and from the
  references; and of the whole sentence;
- the same, less the article or determiner right before the word too (its form follows the word's gender and first
  letter, so a reference written for the model's own word cannot agree with an asked word of another gender);
- doubled: outputs that hold the asked form and, beside it, the model's own choice for the word (the word said twice,
  which the rest-of-sentence scores cannot see: they remove both);
- wrong article: outputs where an article that cannot stand before the asked form stands right before it, by GENDER
  (a table for this measurement; tk itself leaves gender to the model);
- decode time of the test sets' English, greedy and beam 4, each way, in one run (best of 3, interleaved);
- 10,000 entries: load time of the TSV file, cost per sentence of preparing the lines with and without it (and, for
  scale, of a loop of 10,000 regex searches), and whether every line holding none of its terms is translated byte
  for byte as without it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from toolkit.core import constrained, data, glossary, textprep  # noqa: E402
from toolkit.core.scoring import bleu_chrf  # noqa: E402

# English word form -> French forms that translate it (as Tatoeba's French writes them). Written before any output was
# looked at; forms that never occur in a reference only go unused.
LEXICON = {
    "car": ["voiture", "automobile", "auto", "bagnole"], "cars": ["voitures", "automobiles", "autos", "bagnoles"],
    "job": ["travail", "emploi", "boulot", "poste"], "room": ["chambre", "pièce", "salle"],
    "rooms": ["chambres", "pièces", "salles"], "kids": ["enfants", "gosses", "gamins"], "kid": ["enfant", "gosse", "gamin"],
    "teacher": ["professeur", "enseignant", "enseignante", "instituteur", "institutrice", "prof"],
    "teachers": ["professeurs", "enseignants", "instituteurs", "profs"], "doctor": ["médecin", "docteur"],
    "money": ["argent", "fric", "sous"], "boat": ["bateau", "navire", "barque"], "bike": ["vélo", "bicyclette"],
    "bicycle": ["vélo", "bicyclette"], "store": ["magasin", "boutique"], "shop": ["magasin", "boutique"],
    "dinner": ["dîner", "souper"], "woman": ["femme", "dame"], "mistake": ["erreur", "faute"],
    "mistakes": ["erreurs", "fautes"], "exam": ["examen", "épreuve"], "test": ["examen", "test", "contrôle", "épreuve"],
    "coat": ["manteau", "veste"], "road": ["route", "chemin"], "trip": ["voyage", "excursion", "périple"],
    "gift": ["cadeau", "présent"], "present": ["cadeau", "présent"], "book": ["livre", "bouquin", "ouvrage"],
    "books": ["livres", "bouquins", "ouvrages"], "problem": ["problème", "souci", "ennui"],
    "problems": ["problèmes", "soucis", "ennuis"], "wife": ["femme", "épouse"], "husband": ["mari", "époux"],
    "picture": ["photo", "image", "tableau", "photographie"], "pictures": ["photos", "images", "tableaux", "photographies"],
    "photo": ["photo", "photographie"], "school": ["école", "lycée", "collège"], "story": ["histoire", "récit"],
    "place": ["endroit", "lieu", "place"], "movie": ["film", "long-métrage"], "town": ["ville", "bourg"],
    "city": ["ville", "cité"], "friend": ["ami", "amie", "copain", "copine"], "friends": ["amis", "amies", "copains", "copines"],
    "boss": ["patron", "chef", "patronne"], "meal": ["repas", "plat"], "clothes": ["vêtements", "habits", "fringues"],
    "bag": ["sac", "cartable", "valise"], "house": ["maison", "demeure", "logement"], "work": ["travail", "boulot", "œuvre"],
    "girl": ["fille", "jeune fille", "gamine"], "boy": ["garçon", "gamin", "gars"], "guy": ["type", "mec", "gars", "garçon"],
    "guys": ["types", "mecs", "gars"], "child": ["enfant", "gamin", "gosse"], "children": ["enfants", "gamins", "gosses"],
    "weather": ["temps", "météo"], "answer": ["réponse", "solution"], "computer": ["ordinateur", "ordi"],
    "phone": ["téléphone", "portable", "tél"], "hat": ["chapeau", "bonnet", "casquette"], "plan": ["plan", "projet"],
    "trouble": ["ennuis", "problèmes", "difficultés", "mal"], "luck": ["chance", "veine"], "chance": ["chance", "occasion", "possibilité"],
    "meeting": ["réunion", "rencontre"], "noise": ["bruit", "vacarme", "tapage"], "smart": ["intelligent", "malin", "futé"],
    "stupid": ["stupide", "bête", "idiot"], "beautiful": ["beau", "belle", "magnifique", "superbe"], "quickly": ["vite", "rapidement"],
    "sick": ["malade", "souffrant"], "tired": ["fatigué", "fatiguée", "las"], "angry": ["fâché", "fâchée", "en colère"],
    "scared": ["effrayé", "effrayée", "peur"], "rich": ["riche", "fortuné"], "lazy": ["paresseux", "fainéant"],
}
# The gender of each French noun LEXICON lists ("m", "f", "mf" for either), or "p" for a plural; adjectives are left out.
# For the measurement only (which article may stand before an asked form); tk's glossary leaves gender to the model.
GENDER = {
    **dict.fromkeys("voiture automobile auto bagnole chambre pièce salle enseignante institutrice bicyclette barque boutique "
                    "femme dame erreur faute épreuve veste route excursion épouse photo image photographie école histoire place "
                    "ville cité amie copine patronne valise maison demeure œuvre fille gamine météo réponse solution casquette "
                    "chance veine occasion possibilité réunion rencontre".split(), "f"),
    **dict.fromkeys("travail emploi boulot poste gamin professeur enseignant instituteur médecin docteur argent fric bateau "
                    "navire vélo magasin dîner souper examen test contrôle manteau chemin voyage périple cadeau présent livre "
                    "bouquin ouvrage problème souci ennui mari époux tableau lycée collège récit endroit lieu film long-métrage "
                    "bourg ami copain patron chef repas plat sac cartable logement garçon gars type mec temps ordinateur ordi "
                    "téléphone portable tél chapeau bonnet plan projet mal bruit vacarme tapage".split(), "m"),
    **dict.fromkeys("enfant gosse prof".split(), "mf"),
    **dict.fromkeys("voitures automobiles autos bagnoles chambres pièces salles enfants gosses gamins professeurs enseignants "
                    "instituteurs profs sous erreurs fautes livres bouquins ouvrages problèmes soucis ennuis photos images tableaux "
                    "photographies amis amies copains copines vêtements habits fringues types mecs difficultés".split(), "p"),
    "jeune fille": "f",
}
# The articles, determiners and the preposition "de" whose form follows the noun after them: the genders ("m", "f") and
# number ("p") each may stand before, and where it is written: before a vowel ("v"), a consonant ("c"), or either ("").
ARTICLES = {"le": ("m", "c"), "la": ("f", "c"), "l'": ("mf", "v"), "les": ("p", ""), "un": ("m", ""), "une": ("f", ""),
            "du": ("m", "c"), "de la": ("f", "c"), "de l'": ("mf", "v"), "des": ("p", ""), "au": ("m", "c"), "à la": ("f", "c"),
            "à l'": ("mf", "v"), "aux": ("p", ""), "ce": ("m", "c"), "cet": ("m", "v"), "cette": ("f", ""), "ces": ("p", ""),
            "mon": ("mf", ""), "ma": ("f", "c"), "mes": ("p", ""), "ton": ("mf", ""), "ta": ("f", "c"), "tes": ("p", ""),
            "son": ("mf", ""), "sa": ("f", "c"), "ses": ("p", ""), "quel": ("m", ""), "quelle": ("f", ""), "quels": ("p", ""),
            "quelles": ("p", ""), "de": ("mfp", "c"), "d'": ("mfp", "v")}
ANY_ARTICLE = "|".join(sorted(map(re.escape, ARTICLES), key=len, reverse=True))  # the longest first: "de la" before "de"
VOWELS = constrained.ELIDES.replace("h", "").replace("y", "")  # the first letters an article is always elided before
ARTICLE_BEFORE = {form: re.compile(rf"(?<![\w-])({ANY_ARTICLE})\s*"
                                   rf"{re.escape(form)}(?![\w-])", re.I) for form in GENDER}


def wrong_article(text: str, form: str) -> bool:
    """Whether an article or determiner that cannot stand before `form` stands right before it in `text` ("la lycée",
    "ma automobile", "le emploi"): of another gender or number, or written for a vowel before a consonant or the other
    way round (h and y aside: "le héros", "l'hôtel")."""
    gender, first = GENDER.get(form.casefold()), form[:1].casefold()
    if gender is None:
        return False
    for match in ARTICLE_BEFORE[form.casefold()].finditer(text):
        det = match.group(1).casefold()
        genders, written = ARTICLES[det]
        if det in ("mon", "ton", "son") and first not in constrained.ELIDES:
            genders = "m"  # "mon bourg", "ma ville": before a consonant they are masculine
        if first not in "hy" and written == ("c" if first in VOWELS else "v"):
            return True
        if not set(gender) & set(genders) if gender != "mf" else genders == "p":
            return True
    return False


WORD = {w: re.compile(rf"(?<![\w-]){re.escape(w)}(?![\w-])", re.I) for forms in [LEXICON, *LEXICON.values()] for w in forms}


def count(text: str, form: str, ignore_case: bool = True) -> int:
    if ignore_case:
        return len(WORD[form].findall(text))
    return len(re.findall(rf"(?<![\w-]){re.escape(form)}(?![\w-])", text))


def candidates(pairs: list[tuple[str, str]]) -> list[dict]:
    """Each held-out English holding exactly one LEXICON word, with each French form of that word that its references
    use: {"en", "term", "times", "target", "refs"} (refs: the English sentence's references holding that form)."""
    refs_by_en: dict[str, list[str]] = defaultdict(list)
    for en, fr in pairs:
        refs_by_en[en].append(fr)
    out = []
    for en, refs in sorted(refs_by_en.items()):
        terms = [t for t in LEXICON if count(en, t)]
        if len(terms) != 1:
            continue
        term = terms[0]
        for form in LEXICON[term]:
            with_form = [r for r in refs if count(r, form)]
            if with_form:
                out.append({"en": en, "term": term, "times": count(en, term), "target": form, "refs": with_form})
    return out


def own_choices(translator, items: list[dict]) -> dict[str, str]:
    """The French form the model writes most often for each English word, without a glossary (the valid split's)."""
    english = sorted({i["en"] for i in items})
    outputs = dict(zip(english, translator.translate(english)))
    seen: dict[str, Counter] = defaultdict(Counter)
    for en in english:
        term = next(t for t in LEXICON if count(en, t))
        for form in LEXICON[term]:
            if count(outputs[en], form):
                seen[term][form] += 1
    return {t: c.most_common(1)[0][0] for t, c in seen.items()}


MODES = ("without", "placeholders", "glossary")  # the model alone; the glossary by placeholders alone (mechanism a); tk's


def modes(translator) -> tuple[str, ...]:
    """MODES, less placeholders for a model not trained on them (an import): its glossary is constrained decoding alone."""
    return MODES if translator.manifest.declared().placeholders else ("without", "glossary")


@contextlib.contextmanager
def mode(name: str, counts: Counter):
    """tk's glossary as it is ("glossary": the terms as written, constrained decoding where the model does not write
    the targets itself, placeholders where that fails its checks), or by placeholders alone ("placeholders"). `counts`
    hears how many sentences held terms ("wanted") and how many were translated with the terms as written ("written")."""
    from toolkit.core import constrained
    from toolkit.deploy import translate

    real_can, real_forced = constrained.can_constrain, translate._forced

    def forced(t, segments, *args):
        out = real_forced(t, segments, *args)
        counts["wanted"] += sum(seg.forced is not None for seg in segments)
        counts["written"] += len(out)
        return out

    if name == "placeholders":
        constrained.can_constrain = lambda backend, rules: False
    translate._forced = forced
    try:
        yield
    finally:
        constrained.can_constrain, translate._forced = real_can, real_forced


def translate_items(translator, items: list[dict], how: str, counts: Counter | None = None, **opts) -> list[str]:
    """Each item's translation: without a glossary, or with its one-term glossary by `how` (MODES). Items that ask for
    the same term share a call, whichever way, so the three ways decode the same batches."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for k, i in enumerate(items):
        groups[(i["term"], i["target"])].append(k)
    out = [""] * len(items)
    with mode(how, Counter() if counts is None else counts), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # placeholders the model did not copy: put back all the same, counted by the term rate
        for (term, target), ks in groups.items():
            terms = {term: target} if how != "without" else None
            for k, text in zip(ks, translator.translate([items[k]["en"] for k in ks], glossary=terms, **opts)):
                out[k] = text
    return out


def without_forms(text: str, term: str) -> str:
    """The text without any French form of the English word: what the rest of the sentence is."""
    for form in sorted(LEXICON[term], key=len, reverse=True):
        text = WORD[form].sub(" ", text)
    return " ".join(text.split())


def doubled(item: dict, output: str, own: dict[str, str]) -> bool:
    """Whether the output holds the asked form and, beside it, the model's own choice for the word (`own`): the word
    said twice, once as asked and once as the model would (`dépose l'argent dans une banque fric.`)."""
    rest = WORD[item["target"]].sub(" ", output)
    return count(output, item["target"]) > 0 and count(rest, own[item["term"]]) > 0


def without_forms_and_articles(text: str, term: str) -> str:
    """The text without any French form of the English word and the article or determiner right before it: the rest
    of the sentence, less the words that agree with the word (an asked form of another gender takes another article,
    "l'argent" -> "le fric", which a reference written for the model's own word cannot agree with)."""
    for form in sorted(LEXICON[term], key=len, reverse=True):
        text = re.sub(rf"(?<![\w-])(?:(?:{ANY_ARTICLE})\s*)?"
                      rf"{re.escape(form)}(?![\w-])", " ", text, flags=re.I)
    return " ".join(text.split())


def scores(items: list[dict], outputs: list[str], own: dict[str, str]) -> dict:
    term_ok = sum(count(o, i["target"], ignore_case=False) == i["times"] for i, o in zip(items, outputs))
    twice = sum(doubled(i, o, own) for i, o in zip(items, outputs))
    whole = bleu_chrf(outputs, [i["refs"] for i in items])
    rest = bleu_chrf([without_forms(o, i["term"]) for i, o in zip(items, outputs)],
                     [[without_forms(r, i["term"]) for r in i["refs"]] for i in items])
    bare = bleu_chrf([without_forms_and_articles(o, i["term"]) for i, o in zip(items, outputs)],
                     [[without_forms_and_articles(r, i["term"]) for r in i["refs"]] for i in items])
    articles = sum(wrong_article(o, i["target"]) for i, o in zip(items, outputs))
    return {"term_rate": round(100 * term_ok / len(items), 1), "bleu": whole["bleu"], "chrf": whole["chrf"],
            "rest_bleu": rest["bleu"], "rest_chrf": rest["chrf"], "rest_less_article_bleu": bare["bleu"],
            "rest_less_article_chrf": bare["chrf"], "doubled": twice, "wrong_article": articles}


def term_sets(translator, corpus) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """The model's own choices (valid split) and the term test sets: per split, "reference" (items whose reference
    uses a form the model does not choose; that form asked for) and "other" (items whose reference uses the model's
    own form; another form of the word asked for, the first LEXICON lists that is not the model's)."""
    valid, test = candidates(corpus.splits["valid"]), candidates(corpus.splits["test"])
    own = own_choices(translator, valid)
    sets = {}
    for name, items in (("test", test), ("valid", valid)):
        sets[f"{name}-reference"] = [i for i in items if i["term"] in own and i["target"] != own[i["term"]]]
        other = []
        for i in items:
            if i["term"] in own and i["target"] == own[i["term"]]:
                alternative = next(f for f in LEXICON[i["term"]] if f != own[i["term"]])
                other.append({**i, "target": alternative})
        sets[f"{name}-other"] = other
    return own, sets


def term_set(translator, corpus, only: str = "") -> dict:
    own, sets = term_sets(translator, corpus)
    out: dict = {"model_choices": own}
    for name, kept in sets.items():
        if not name.startswith(only):
            continue
        row: dict = {"items": len(kept), "terms": len({(i["term"], i["target"]) for i in kept})}
        for beam in (1, 4):
            outputs, row[f"beam{beam}"] = {}, {}
            for how in modes(translator):
                counts: Counter = Counter()
                outputs[how] = translate_items(translator, kept, how, counts, beam=beam)
                row[f"beam{beam}"][how] = {**scores(kept, outputs[how], own), **({"written": f"{counts['written']}/{counts['wanted']}"}
                                                                            if how == "glossary" else {})}
            if beam == 1 and name == "test-reference":
                out["examples"] = [{"en": i["en"], "asked": {i["term"]: i["target"]}, **{h: outputs[h][k] for h in modes(translator)},
                                    "reference": i["refs"][0]} for k, i in enumerate(kept[:15])]
        out[name] = row
        print(name, json.dumps(row), flush=True)
    return out


def decode_time(translator, corpus) -> dict:
    """The test split's items (both sets) translated without and with their glossaries (by placeholders alone, and by
    tk's glossary), greedy and beam 4, best of 3, interleaved."""
    _, sets = term_sets(translator, corpus)
    items = sets["test-reference"] + sets["test-other"]
    out = {"sentences": len(items)}
    for beam in (1, 4):
        times: dict[str, list[float]] = {how: [] for how in modes(translator)}
        for _ in range(3):
            for how in modes(translator):
                start = time.perf_counter()
                translate_items(translator, items, how, beam=beam)
                times[how].append(time.perf_counter() - start)
        out[f"beam{beam}"] = {k: round(min(v), 3) for k, v in times.items()}
        print("time", beam, out[f"beam{beam}"], flush=True)
    return out


def big_glossary(corpus, size: int = 10_000) -> list[tuple[str, str]]:
    """`size` entries as a company's glossary might hold: the train split's English words past the 1,500 most common
    (content words, not "the" or "is"), and its most common two-word phrases of such words, each to a made-up target."""
    words = Counter(w for en, _ in corpus.splits["train"] for w in re.findall(r"[a-z]+", en.lower()))
    common = {w for w, _ in words.most_common(1500)}
    singles = [w for w, _ in words.most_common() if w not in common and len(w) > 2][: size * 6 // 10]
    bigrams = Counter()
    for en, _ in corpus.splits["train"]:
        ws = re.findall(r"[a-z]+", en.lower())
        bigrams.update(f"{a} {b}" for a, b in zip(ws, ws[1:]) if a not in common or b not in common)
    phrases = [p for p, _ in bigrams.most_common(size)][: size - len(singles)]
    return [(term, f"T{k:05d}") for k, term in enumerate(singles + phrases)]


def ten_thousand(translator, corpus) -> dict:
    entries = big_glossary(corpus)
    english = sorted({en for en, _ in corpus.splits["test"]})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.tsv"
        path.write_text("".join(f"{s}\t{t}\n" for s, t in entries), encoding="utf-8")
        loads = []
        for _ in range(5):
            start = time.perf_counter()
            g = glossary.load(path)
            loads.append(time.perf_counter() - start)
    prepare = {}
    for name, terms in (("without", None), ("with", g)):
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            for en in english:
                textprep.prepare(en, glossary=terms)
            runs.append(time.perf_counter() - start)
        prepare[name] = round(1e6 * min(runs) / len(english), 1)
    naive = [re.compile(rf"(?<!\w){re.escape(s)}(?!\w)", re.I) for s, _ in entries]
    sample = english[:200]
    start = time.perf_counter()
    for en in sample:
        [p.search(en) for p in naive]
    naive_us = 1e6 * (time.perf_counter() - start) / len(sample)
    holding = [en for en in english if g.find(textprep.clean(en))]
    plain = translator.translate(english)
    forced = translator.translate(english, glossary=g)
    free = [k for k, en in enumerate(english) if not g.find(textprep.clean(en))]
    same = sum(plain[k] == forced[k] for k in free)
    out = {"entries": len(g), "load_s": round(statistics.median(loads), 3), "prepare_us_per_sentence": prepare,
           "naive_10000_regex_us_per_sentence": round(naive_us, 1), "sentences": len(english),
           "sentences_holding_a_term": len(holding), "free_sentences": len(free), "free_identical": same}
    print("10k", json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=REPO / "exported" / "transformer")
    parser.add_argument("--data", type=Path, default=None, help="fra-eng.zip [default: tk's own search, toolkit.core.data.find]")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--provider", choices=["cpu", "cuda"], default="cpu", help="where ONNX Runtime runs the graphs")
    parser.add_argument("--json", type=Path, help="write the figures here (the parts run replace theirs in an existing file)")
    parser.add_argument("--only", choices=["terms", "time", "big"], action="append")
    parser.add_argument("--split", choices=["test", "valid"], default="", help="the term sets of one split only [default: both]")
    parser.add_argument("--forced-beam", type=int, default=4, help="the least beam of constrained decoding (tk's FORCED_BEAM: 4)")
    args = parser.parse_args()
    from toolkit import Translator

    translator = Translator(args.model, provider=args.provider, threads=args.threads)
    corpus = data.load_corpus(args.data, download=False)
    out: dict = {"model": args.model.name, "corpus": Path(corpus.source).name, "provider": args.provider}
    only = set(args.only or ["terms", "time", "big"])
    if "terms" in only:
        from toolkit.deploy import translate

        translate.FORCED_BEAM = args.forced_beam
        out["forced_beam"] = args.forced_beam
        out["terms"] = term_set(translator, corpus, args.split)
    if "time" in only:
        out["time"] = decode_time(translator, corpus)
    if "big" in only:
        out["big"] = ten_thousand(translator, corpus)
    if args.json:  # the parts run replace theirs in an existing file; the others are kept
        old = json.loads(args.json.read_text(encoding="utf-8")) if args.json.exists() else {}
        args.json.write_text(json.dumps({**old, **out}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
