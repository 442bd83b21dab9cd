"""The Tatoeba English-French corpus: locate, verify, split by English sentence, batch by length."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.core.errors import DataError
from toolkit.core.tokenizer import BOS, EOS, PAD, normalize

CORPUS_URL = "http://d2l-data.s3-accelerate.amazonaws.com/fra-eng.zip"
# sha256 of fra-eng/fra.txt: the zip differs between mirrors, the text does not.
CORPUS_SHA256 = "0bb85dbaa1c896844649094d7eaf2e34bee34e84fe362b26ce7e8f2e12aae104"
ENV_VAR = "TK_DATA"
# Beside a clone of this repository, or beside the working directory: where the project's data lives.
SHARED = Path("shared") / "data" / "fra-eng.zip"
MEMBER = "fra-eng/fra.txt"

# Split by a hash of the English sentence: stable when the corpus grows, and
# all translations of one sentence land together. Per mille of English sentences.
SPLIT_RULE = {"hash": "sha256(english)[:8] mod 1000", "test": [0, 20], "valid": [20, 30], "train": [30, 1000]}


@dataclass
class Corpus:
    """Sentence pairs by split, with what is needed to reproduce the split."""

    splits: dict[str, list[tuple[str, str]]]
    source: str
    sha256: str
    info: dict = field(default_factory=dict)
    origin: str = ""  # how the file was found: "--data", "$TK_DATA", "../shared/data", "the cache" or "downloaded"


def cache_file() -> Path:
    """The downloaded corpus, in tk's user cache directory (TK_CACHE_DIR moves it)."""
    from toolkit.core import load_cache

    return (load_cache.directory() or load_cache.default_directory()) / "fra-eng.zip"


def shared_files() -> list[Path]:
    """../shared/data/fra-eng.zip beside the working directory and beside this repository's clone."""
    roots = [Path.cwd().parent, Path(__file__).resolve().parents[3]]
    found: list[Path] = []
    for root in roots:
        p = root / SHARED
        if p.is_file() and all(p.resolve() != q.resolve() for q in found):
            found.append(p)
    return found


def find(path: str | Path | None = None, download: bool = True) -> tuple[Path, str]:
    """(the corpus file, how it was found), the one search every command uses: an explicit path
    (--data), else $TK_DATA, else ../shared/data/fra-eng.zip when it is there, else the user cache,
    else a download into the cache whose fra.txt must match the published sha256."""
    for candidate, origin in ((path, "--data"), (os.environ.get(ENV_VAR), f"${ENV_VAR}")):
        if candidate:
            p = Path(candidate).expanduser()
            if not p.is_file():
                raise DataError(f"corpus file {p} (from {origin}) does not exist; pass the path of fra-eng.zip or fra.txt")
            return p, origin
    shared = shared_files()
    if shared:
        return shared[0], "../shared/data"
    cache = cache_file()
    if cache.is_file():
        return cache, "the cache"
    if not download:
        raise DataError(f"no corpus found; pass --data PATH, set ${ENV_VAR}, or put fra-eng.zip in ../shared/data or {cache.parent}")
    return fetch(CORPUS_URL, cache), "downloaded"


def locate(path: str | Path | None = None, download: bool = True) -> Path:
    """The corpus file (see find)."""
    return find(path, download)[0]


def fetch(url: str, dest: Path) -> Path:
    """Downloads the zip, checks the sha256 of fra.txt inside it, then moves it into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, suffix=".part", delete=False) as tmp:
        part = Path(tmp.name)
    try:
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as f:
                shutil.copyfileobj(response, f)
        except OSError as e:
            raise DataError(f"could not download the corpus from {url} ({e}); pass --data PATH or set ${ENV_VAR}") from None
        try:
            text = _read_text(part)
        except DataError as e:
            raise DataError(f"{url} is not the fra-eng corpus ({e}); pass --data PATH or set ${ENV_VAR}") from None
        digest = hashlib.sha256(text).hexdigest()
        if digest != CORPUS_SHA256:
            raise DataError(f"downloaded corpus has sha256 {digest}, expected {CORPUS_SHA256}; try again or pass --data PATH")
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return dest


def _read_text(path: Path) -> bytes:
    """Raw bytes of fra.txt from a zip, or of a plain tab-separated text file."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
                member = MEMBER if MEMBER in names else next((n for n in names if n.endswith(".txt") and "about" not in n), None)
                if member is None:
                    raise DataError(f"{path} holds no {MEMBER}; expected the fra-eng.zip corpus")
                return zf.read(member)
        if path.suffix == ".zip":
            raise DataError(f"{path} is not a valid zip file (corrupt or truncated download?); delete it and fetch again")
        return path.read_bytes()
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:
        raise DataError(f"cannot read corpus {path}: {e}") from None


def read_pairs(path: Path) -> tuple[list[tuple[str, str]], str]:
    """(English, French) pairs, normalised, and the sha256 of the raw text."""
    raw = _read_text(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start}); expected fra.txt from the fra-eng corpus") from None
    pairs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        cols = line.split("\t")
        if len(cols) < 2:
            if line.strip():
                raise DataError(f"{path}: line {lineno} has no tab; expected 'English<TAB>French'")
            continue
        en, fr = normalize(cols[0]), normalize(cols[1])
        if en and fr:
            pairs.append((en, fr))
    if not pairs:
        raise DataError(f"{path} holds no sentence pairs; expected 'English<TAB>French' lines")
    return pairs, hashlib.sha256(raw).hexdigest()


def read_challenge_test(path: Path) -> list[tuple[str, str]]:
    """The Tatoeba Challenge test set: 'eng<TAB>fra<TAB>English<TAB>French' lines."""
    pairs = []
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start}); give the Tatoeba Challenge test file "
                        "(eng<TAB>fra<TAB>English<TAB>French lines)") from None
    for line in text.splitlines():
        cols = line.split("\t")
        if len(cols) >= 4:
            pairs.append((normalize(cols[2]), normalize(cols[3])))
    if not pairs:
        raise DataError(f"{path} has no eng<TAB>fra<TAB>English<TAB>French lines; give the Tatoeba Challenge test file")
    return pairs


def split_of(english: str) -> str:
    bucket = int(hashlib.sha256(english.encode("utf-8")).hexdigest()[:8], 16) % 1000
    return next(name for name in ("test", "valid", "train") if SPLIT_RULE[name][0] <= bucket < SPLIT_RULE[name][1])


def load_corpus(path: str | Path | None = None, exclude: Path | None = None, download: bool = True) -> Corpus:
    """Loads and splits the corpus; English sentences of `exclude` (a held-out public
    test set) are removed from train and valid so scores on it are honest."""
    source, origin = find(path, download)
    pairs, digest = read_pairs(source)
    banned = {en for en, _ in read_challenge_test(exclude)} if exclude else set()
    splits: dict[str, list[tuple[str, str]]] = {"train": [], "valid": [], "test": []}
    removed = 0
    for en, fr in pairs:
        name = split_of(en)
        if name != "test" and en in banned:
            removed += 1
            continue
        splits[name].append((en, fr))
    test_en = sorted({en for en, _ in splits["test"]})
    info = {
        "rule": SPLIT_RULE,
        "pairs": {k: len(v) for k, v in splits.items()},
        "english_sentences": {k: len({en for en, _ in v}) for k, v in splits.items()},
        "excluded_challenge_pairs": removed,
        "test_english_sha256": hashlib.sha256("\n".join(test_en).encode()).hexdigest(),
    }
    return Corpus(splits, str(Path(source).resolve()), digest, info, origin)


def describe(corpus: Corpus) -> str:
    """How commands name the corpus they read: 'corpus: PATH (from $TK_DATA)'."""
    return f"corpus: {corpus.source} ({corpus.origin})"


def references(pairs: list[tuple[str, str]]) -> tuple[list[str], list[list[str]]]:
    """Distinct English sentences and, for each, every French translation in the pairs."""
    refs: dict[str, list[str]] = {}
    for en, fr in pairs:
        refs.setdefault(en, []).append(fr)
    return list(refs), list(refs.values())


def encode_pairs(tokenizer, pairs: list[tuple[str, str]], max_len: int) -> list[tuple[list[int], list[int]]]:
    """Token ids of both sides; pairs that do not fit in max_len positions (with BOS/EOS) are dropped."""
    src = tokenizer.encode([en for en, _ in pairs])
    tgt = tokenizer.encode([fr for _, fr in pairs])
    return [(s, t) for s, t in zip(src, tgt) if 0 < len(s) <= max_len and len(t) + 1 <= max_len]


def length_batches(examples: list[tuple[list[int], list[int]]], max_tokens: int, seed: int) -> list[list[int]]:
    """Indices grouped into batches of similar length under a padded-token budget.

    Sorting by length (with a little noise so batches vary between epochs) keeps
    padding small: short sentences never pay for long ones.
    """
    rng = random.Random(seed)
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]) + rng.random(), len(examples[i][1])))
    batches, current, longest = [], [], 0
    for i in order:
        n = max(len(examples[i][0]), len(examples[i][1]) + 1)
        if current and max(longest, n) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def pad(seqs: list[list[int]], length: int | None = None) -> list[list[int]]:
    n = length or max(len(s) for s in seqs)
    return [s + [PAD] * (n - len(s)) for s in seqs]


def teacher_forcing(tgt: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """Decoder input (BOS + y) and target (y + EOS), both padded."""
    return pad([[BOS] + t for t in tgt]), pad([t + [EOS] for t in tgt])
