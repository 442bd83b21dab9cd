"""Language pairs of the served models: how a model directory states its pair, and the names /languages gives.

A pair is written SOURCE-TARGET with LibreTranslate's codes (ISO 639-1, with a script or region subtag where one is
needed: en-fr, en-pt-BR, zh-Hans-en). `tk serve DIR:en-de` states a directory's pair; a bare DIR is tk's own model
and translates English to French, the only pair tk trains. An imported model states its pair when it was exported
with --source-lang/--target-lang (or later: tk export DIR --source-lang en --target-lang de); else it must be given one.
"""

from __future__ import annotations

import os
import re

from toolkit.core.errors import UsageError

Pair = tuple[str, str]
TK_PAIR: Pair = ("en", "fr")  # what tk trains: the Tatoeba English-French pairs
CODE = r"[a-z]{2,3}(?:-(?:[A-Z][a-z]{3}|[A-Z]{2}))?"  # en, pt-BR, zh-Hans
PAIR = re.compile(rf"({CODE})-({CODE})")
NAMES = {
    "ar": "Arabic", "az": "Azerbaijani", "bg": "Bulgarian", "bn": "Bengali", "ca": "Catalan", "cs": "Czech", "da": "Danish",
    "de": "German", "el": "Greek", "en": "English", "eo": "Esperanto", "es": "Spanish", "et": "Estonian", "eu": "Basque",
    "fa": "Persian", "fi": "Finnish", "fr": "French", "ga": "Irish", "gl": "Galician", "he": "Hebrew", "hi": "Hindi",
    "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian",
    "lv": "Latvian", "ms": "Malay", "nb": "Norwegian", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
    "pt-BR": "Portuguese (Brazil)", "ro": "Romanian", "ru": "Russian", "sk": "Slovak", "sl": "Slovenian", "sq": "Albanian",
    "sv": "Swedish", "th": "Thai", "tl": "Tagalog", "tr": "Turkish", "uk": "Ukrainian", "ur": "Urdu", "vi": "Vietnamese",
    "zh": "Chinese", "zh-Hans": "Chinese (Simplified)", "zh-Hant": "Chinese (Traditional)",
}


def name(code: str) -> str:
    """A language's English name, or its code where tk does not know the name."""
    return NAMES.get(code, code)


def shown(pair: Pair) -> str:
    return f"{pair[0]}-{pair[1]}"


def parse_pair(text: str, where: str) -> Pair:
    """SOURCE-TARGET as a pair, or a one-line error naming `where` and the form."""
    m = PAIR.fullmatch(text)
    if not m or m.group(1) == m.group(2):
        raise UsageError(f"{where}: {text!r} is not a language pair; write SOURCE-TARGET with two different codes, "
                         "e.g. en-fr or en-pt-BR")
    return m.group(1), m.group(2)


def split_argument(argument: str) -> tuple[str, Pair | None]:
    """A `tk serve` model argument, DIR or DIR:SOURCE-TARGET, as the directory and the pair it states (None: none).
    Only a suffix that is a pair is taken as one, so a directory whose name has a colon still works."""
    directory, colon, suffix = argument.rpartition(":")
    if colon and directory and PAIR.fullmatch(suffix):
        return directory, parse_pair(suffix, argument)
    return argument, None


def malformed_pair(argument: str) -> str | None:
    """Why a `tk serve` argument that split_argument took whole is a mistyped DIR:SOURCE-TARGET (DIR:en, DIR:en-fr-de,
    DIR:), or None: it has a colon and is no path that exists (a directory whose name has a colon is taken whole)."""
    directory, colon, suffix = argument.rpartition(":")
    if not colon or os.path.exists(argument):
        return None
    missing = "" if directory and os.path.isdir(directory) else f"; and neither {directory or repr('')} nor {argument} exists"
    return (f"{argument}: malformed pair {suffix!r}, expected DIR:SRC-TGT with two language codes, e.g. {directory or 'DIR'}:en-fr"
            + missing)


def stated_pair(tokenizer: object) -> Pair | None:
    """The pair a model directory states (toolkit.core.declaration.TokenizerDeclaration: `tk export ... --source-lang en
    --target-lang de`, or a multilingual model's default pair), None where it states none."""
    source, target = getattr(tokenizer, "source_lang", None), getattr(tokenizer, "target_lang", None)
    if source is None or target is None:
        return None
    return client_code(source), client_code(target)


def client_code(code: str) -> str:
    """A model's code as LibreTranslate's clients send it: eng_Latn -> en (through its first two letters where the
    name table knows them), pt-BR and en as they are."""
    from toolkit.core.tokenizers import ISO3

    if re.fullmatch(CODE, code):
        return code
    base = code.split("_")[0]
    two = {three: two for two, three in ISO3.items()}.get(base, base)
    return two if re.fullmatch(CODE, two) else code


def served_codes(declared: object) -> dict[str, str]:
    """A multilingual model's codes as LibreTranslate's clients send them (en, zh-Hans) -> the model's own (M2M100's
    "en", NLLB's "eng_Latn", mBART's "en_XX"); where two of the model's codes would give one client code (zho_Hans and
    zho_Hant), each keeps its script (zh-Hans, zh-Hant). Empty for a model of one pair."""
    codes = getattr(declared, "languages", None) or {}
    plain = {code: client_code(code) for code in sorted(codes)}
    taken: dict[str, int] = {}
    for short in plain.values():
        taken[short] = taken.get(short, 0) + 1
    out: dict[str, str] = {}
    for code, short in plain.items():
        if taken[short] > 1:  # ambiguous: the script or region subtag tells them apart, else the model's own code
            parts = code.strip("_").split("_")
            short = f"{short}-{parts[1]}" if len(parts) == 2 and re.fullmatch(CODE, f"{short}-{parts[1]}") else code
        out.setdefault(short, code)
    return out


def every_pair(declared: object) -> dict[Pair, Pair]:
    """Every pair a multilingual model translates, in client codes -> the model's codes; its default pair (what its files
    say, or what tk export --source-lang/--target-lang recorded) first, so a request that names none gets it."""
    codes = served_codes(declared)
    own = {model: client for client, model in codes.items()}
    default = (own[declared.source_lang], own[declared.target_lang])
    pairs = {default: (declared.source_lang, declared.target_lang)}
    pairs.update({(s, t): (codes[s], codes[t]) for s in codes for t in codes if s != t and (s, t) != default})
    return pairs


def default_pair(origin: str, directory: str) -> Pair:
    """The pair of a model directory given without one: tk's own models translate English to French; an imported
    model records no languages, so it is an error that says how to state them."""
    if origin == "tk":
        return TK_PAIR
    raise UsageError(f"{directory} is an imported model ({origin}), whose directory does not record its languages; "
                     f"give them after a colon, tk serve {directory}:SOURCE-TARGET (e.g. {directory}:en-de), or record them once: "
                     f"tk export {directory} --source-lang en --target-lang de")
