"""The fra-eng data pipeline: locate, verify, split, tokenise, batch, and fail with clear one-line errors."""

from __future__ import annotations

import hashlib
import os
import random
import zipfile
from pathlib import Path

import pytest

from toolkit.core import data
from toolkit.core.errors import DataError
from toolkit.core.tokenizer import BOS, EOS, PAD, UNK, Tokenizer, normalize

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
CORPUS_ZIP = Path(os.environ.get("TK_DATA") or SHARED / "fra-eng.zip")
CHALLENGE = SHARED / "tatoeba-test-eng-fra.txt"


@pytest.fixture(scope="module")
def corpus():
    return data.load_corpus(CORPUS_ZIP)


@pytest.fixture(scope="module")
def corpus_excluding_challenge():
    return data.load_corpus(CORPUS_ZIP, exclude=CHALLENGE)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    pairs = corpus.splits["train"][:300]
    return Tokenizer.train([s for p in pairs for s in p], vocab_size=500)


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert message and "\n" not in message
    return message


def _write_zip(path: Path, text: bytes, member: str = data.MEMBER) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, text)
    return path


TINY_TEXT = "Go.\tVa !\nHi.\tSalut !\nRun!\tCours\u202f!\nI'm home.\tJe suis à la maison.\n".encode()


# ---- the split ----------------------------------------------------------------------------------


def test_corpus_is_the_published_text(corpus):
    assert corpus.sha256 == data.CORPUS_SHA256
    assert Path(corpus.source) == CORPUS_ZIP.resolve()
    # README: 167,130 pairs, none lost to parsing.
    assert sum(len(v) for v in corpus.splits.values()) == 167_130


def test_no_english_sentence_in_two_splits(corpus):
    english = {name: {en for en, _ in pairs} for name, pairs in corpus.splits.items()}
    assert english["train"].isdisjoint(english["valid"])
    assert english["train"].isdisjoint(english["test"])
    assert english["valid"].isdisjoint(english["test"])
    assert all(len(english[name]) > 0 for name in ("train", "valid", "test"))


def test_split_is_a_pure_function_of_the_english_sentence(corpus):
    for name, pairs in corpus.splits.items():
        for en, _ in pairs[:2000]:
            assert data.split_of(en) == name
    # The rule is sha256 of the English sentence, the same in every process and on every machine
    # (Python's own hash() of a string changes with each interpreter start).
    import hashlib
    import subprocess
    import sys

    sentences = ["I'm home.", "Go.", "Where is the station?", "Tom bought a new car last week."]
    for en in sentences:
        per_mille = int(hashlib.sha256(en.encode()).hexdigest()[:8], 16) % 1000
        assert data.split_of(en) == ("test" if per_mille < 20 else "valid" if per_mille < 30 else "train")
    code = f"from toolkit.core import data; print([data.split_of(s) for s in {sentences!r}])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={**__import__("os").environ, "PYTHONHASHSEED": "12345"})
    assert other.stdout.strip() == str([data.split_of(s) for s in sentences])
    # The per-mille rule gives roughly 2% test, 1% valid.
    total = sum(len(v) for v in corpus.splits.values())
    assert 0.015 < len(corpus.splits["test"]) / total < 0.025
    assert 0.007 < len(corpus.splits["valid"]) / total < 0.013


def test_split_counts_are_recorded(corpus):
    info = corpus.info
    assert info["rule"] == data.SPLIT_RULE
    for name, pairs in corpus.splits.items():
        assert info["pairs"][name] == len(pairs)
        assert info["english_sentences"][name] == len({en for en, _ in pairs})
    assert info["excluded_challenge_pairs"] == 0
    test_en = sorted({en for en, _ in corpus.splits["test"]})
    assert info["test_english_sha256"] == hashlib.sha256("\n".join(test_en).encode()).hexdigest()


def test_corpus_text_is_normalised(corpus):
    for pairs in corpus.splits.values():
        for en, fr in pairs:
            assert "\u202f" not in fr and "\xa0" not in fr and "  " not in fr
            assert en == en.strip() and fr == fr.strip()


def test_challenge_test_set_is_kept_out_of_training(corpus, corpus_excluding_challenge):
    banned = {en for en, _ in data.read_challenge_test(CHALLENGE)}
    assert len(banned) > 9000
    excluded = corpus_excluding_challenge
    for name in ("train", "valid"):
        assert banned.isdisjoint(en for en, _ in excluded.splits[name])
    removed = excluded.info["excluded_challenge_pairs"]
    assert removed > 0
    assert removed == sum(len(corpus.splits[n]) - len(excluded.splits[n]) for n in ("train", "valid"))
    # The corpus's own test split does not move, so scores stay comparable.
    assert excluded.splits["test"] == corpus.splits["test"]
    assert excluded.info["test_english_sha256"] == corpus.info["test_english_sha256"]


def test_references_group_translations_by_english():
    english, refs = data.references([("Hi.", "Salut."), ("Run!", "Cours !"), ("Hi.", "Bonjour.")])
    assert english == ["Hi.", "Run!"]
    assert refs == [["Salut.", "Bonjour."], ["Cours !"]]


# ---- normalisation and tokenizer ----------------------------------------------------------------


def test_normalize_folds_no_break_spaces_and_collapses_whitespace():
    assert normalize("Cours\u202f!") == "Cours !"
    assert normalize("Quoi\u00a0?") == "Quoi ?"
    assert normalize("  Je \t suis\n  là.  ") == "Je suis là."
    assert normalize("C'est l'été.") == "C'est l'été."


@pytest.mark.parametrize("text", ["Je suis à la maison !", "C'est l'été.", "Tom, où es-tu ? J'ARRIVE !", "I'm home."])
def test_tokenizer_round_trips_cased_text_with_punctuation(tokenizer, text):
    ids = tokenizer.encode([text])[0]
    assert ids and UNK not in ids
    assert tokenizer.decode([ids]) == [text]


def test_tokenizer_never_has_unknown_characters(tokenizer):
    text = "Il a dit 你好 😀 !"
    ids = tokenizer.encode([text])[0]
    assert UNK not in ids
    assert tokenizer.decode([ids]) == [text]


def test_tokenizer_decode_drops_special_tokens(tokenizer):
    ids = tokenizer.encode(["Je suis à la maison !"])[0]
    assert tokenizer.decode([[BOS, *ids, EOS, PAD, PAD]]) == ["Je suis à la maison !"]


def test_tokenizer_normalises_before_encoding(tokenizer):
    assert tokenizer.encode(["Je suis à la maison\u202f!"]) == tokenizer.encode(["Je suis à la maison !"])


def test_tokenizer_save_load_round_trip(tokenizer, tmp_path):
    path = tmp_path / "tokenizer.model"
    tokenizer.save(path)
    loaded = Tokenizer.load(path)
    assert loaded.vocab_size == tokenizer.vocab_size
    texts = ["C'est l'été.", "Il a dit 你好 😀 !"]
    assert loaded.encode(texts) == tokenizer.encode(texts)
    assert loaded.decode(loaded.encode(texts)) == texts


def test_tokenizer_train_is_deterministic(corpus):
    sentences = [s for p in corpus.splits["train"][:200] for s in p]
    a, b = Tokenizer.train(sentences, 400), Tokenizer.train(sentences, 400)
    assert a.model_proto == b.model_proto


# ---- batching -----------------------------------------------------------------------------------


def _examples(seed=0):
    rng = random.Random(seed)
    ex = [([5] * rng.randint(1, 30), [6] * rng.randint(1, 35)) for _ in range(500)]
    ex += [([5] * 400, [6] * 10), ([5] * 3, [6] * 500)]  # each over the budget on its own
    return ex


def _width(ex) -> int:
    """Padded positions one example needs, as length_batches counts them (target + BOS/EOS)."""
    return max(len(ex[0]), len(ex[1]) + 1)


def test_length_batches_cover_every_example_once():
    ex = _examples()
    batches = data.length_batches(ex, max_tokens=300, seed=1)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(ex)))


def test_length_batches_respect_the_token_budget():
    ex = _examples()
    batches = data.length_batches(ex, max_tokens=300, seed=1)
    for b in batches:
        padded = max(_width(ex[i]) for i in b) * len(b)
        assert padded <= 300 or len(b) == 1
    singles = [b for b in batches if max(_width(ex[i]) for i in b) > 300]
    assert sorted(i for b in singles for i in b) == [500, 501]


def test_length_batches_group_similar_lengths():
    ex = _examples()
    batches = data.length_batches(ex, max_tokens=300, seed=1)
    spans = sorted((min(len(ex[i][0]) for i in b), max(len(ex[i][0]) for i in b)) for b in batches)
    # Source-length ranges of the batches do not overlap: short sentences never share with long ones.
    for (_, hi), (lo, _) in zip(spans, spans[1:]):
        assert hi <= lo
    # Little padding overall.
    padded = sum(max(len(ex[i][0]) for i in b) * len(b) for b in batches)
    assert padded < 1.1 * sum(len(s) for s, _ in ex)


def test_length_batches_are_reproducible_and_vary_by_seed():
    ex = _examples()
    assert data.length_batches(ex, 300, seed=3) == data.length_batches(ex, 300, seed=3)
    assert data.length_batches(ex, 300, seed=3) != data.length_batches(ex, 300, seed=4)


def test_encode_pairs_and_teacher_forcing(tokenizer):
    pairs = [("I'm home.", "Je suis à la maison."), ("Hi.", "Salut."), ("Go " * 40, "Va !")]
    examples = data.encode_pairs(tokenizer, pairs, max_len=20)
    assert len(examples) == 2  # the over-long source is dropped
    tgt_in, tgt_out = data.teacher_forcing([t for _, t in examples])
    for (_, t), x, y in zip(examples, tgt_in, tgt_out):
        assert x[0] == BOS and x[1 : len(t) + 1] == t
        assert y[: len(t)] == t and y[len(t)] == EOS
        assert set(x[len(t) + 1 :]) <= {PAD} and set(y[len(t) + 1 :]) <= {PAD}
    assert len({len(r) for r in tgt_in + tgt_out}) == 1


# ---- locating, reading and fetching: errors a user can act on ----------------------------------


def test_locate_missing_path_names_it(tmp_path):
    missing = tmp_path / "nowhere" / "fra-eng.zip"
    with pytest.raises(DataError) as err:
        data.locate(missing)
    assert str(missing) in _one_line(err)


def test_locate_honours_env_var_and_explicit_path_wins(tmp_path, monkeypatch):
    env_file = tmp_path / "env.txt"
    env_file.write_bytes(TINY_TEXT)
    explicit = tmp_path / "explicit.txt"
    explicit.write_bytes(TINY_TEXT)
    monkeypatch.setenv("TK_DATA", str(env_file))
    assert data.locate() == env_file
    assert data.locate(explicit) == explicit
    monkeypatch.setenv("TK_DATA", str(tmp_path / "gone.zip"))
    with pytest.raises(DataError) as err:
        data.locate()
    message = _one_line(err)
    assert "gone.zip" in message and "TK_DATA" in message


def test_find_order_data_env_shared_cache(tmp_path, monkeypatch):
    """--data, then $TK_DATA, then ../shared/data beside the working directory, then the cache; each named."""
    work = tmp_path / "clone"
    work.mkdir()
    shared = tmp_path / "shared" / "data" / "fra-eng.zip"
    shared.parent.mkdir(parents=True)
    _write_zip(shared, TINY_TEXT)
    cache = tmp_path / "cache"
    cache.mkdir()
    _write_zip(cache / "fra-eng.zip", TINY_TEXT)
    explicit = tmp_path / "explicit.txt"
    explicit.write_bytes(TINY_TEXT)
    monkeypatch.chdir(work)
    monkeypatch.setenv("TK_CACHE_DIR", str(cache))
    monkeypatch.setenv("TK_DATA", str(explicit))
    assert data.find(explicit) == (explicit, "--data")
    assert data.find() == (explicit, "$TK_DATA")
    monkeypatch.delenv("TK_DATA")
    monkeypatch.setattr(data, "__file__", str(tmp_path / "elsewhere" / "clone" / "toolkit" / "core" / "data.py"))
    assert data.find()[0].resolve() == shared.resolve()
    assert "../shared/data" in data.find()[1]
    shared.unlink()
    assert data.find() == (cache / "fra-eng.zip", "the cache")
    assert data.describe(data.load_corpus()).endswith("(the cache)")


def test_locate_without_any_corpus_and_no_download(tmp_path, monkeypatch):
    monkeypatch.delenv("TK_DATA", raising=False)
    monkeypatch.setenv("TK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(data, "shared_files", lambda: [])
    with pytest.raises(DataError) as err:
        data.locate(download=False)
    message = _one_line(err)
    assert "--data" in message and "TK_DATA" in message


def test_plain_text_corpus_is_read_and_normalised(tmp_path):
    path = tmp_path / "fra.txt"
    path.write_bytes(TINY_TEXT)
    pairs, digest = data.read_pairs(path)
    assert ("Run!", "Cours !") in pairs and len(pairs) == 4
    assert digest == hashlib.sha256(TINY_TEXT).hexdigest()


def test_corrupt_zip_raises_data_error(tmp_path):
    path = tmp_path / "fra-eng.zip"
    path.write_bytes(random.Random(0).randbytes(4096))
    with pytest.raises(DataError) as err:
        data.load_corpus(path)
    assert str(path) in _one_line(err)


def test_truncated_zip_raises_data_error(tmp_path):
    path = tmp_path / "fra-eng.zip"
    path.write_bytes(CORPUS_ZIP.read_bytes()[:100_000])
    with pytest.raises(DataError) as err:
        data.load_corpus(path)
    assert str(path) in _one_line(err)


def test_zip_with_damaged_compressed_data_raises_data_error(tmp_path):
    # Bytes flipped inside the deflate stream of fra.txt: the directory is intact, the data is not.
    raw = bytearray(CORPUS_ZIP.read_bytes())
    raw[5000:5064] = bytes(range(64))
    path = tmp_path / "fra-eng.zip"
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError) as err:
        data.load_corpus(path)
    assert str(path) in _one_line(err)


def test_zip_without_fra_txt_raises_data_error(tmp_path):
    path = _write_zip(tmp_path / "fra-eng.zip", b"about", member="fra-eng/_about.txt")
    with pytest.raises(DataError) as err:
        data.load_corpus(path)
    assert "fra.txt" in _one_line(err)


@pytest.mark.parametrize("where", ["plain", "zip"])
def test_non_utf8_corpus_raises_data_error(tmp_path, where):
    text = b"Go.\tVa !\nCaf\xe9.\tCaf\xe9.\n"  # Latin-1, not UTF-8
    if where == "plain":
        path = tmp_path / "fra.txt"
        path.write_bytes(text)
    else:
        path = _write_zip(tmp_path / "fra-eng.zip", text)
    with pytest.raises(DataError) as err:
        data.load_corpus(path)
    assert "UTF-8" in _one_line(err)


def test_malformed_lines_raise_data_error(tmp_path):
    path = tmp_path / "fra.txt"
    path.write_text("Go.\tVa !\nthis line has no tab\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        data.load_corpus(path)
    assert "line 2" in _one_line(err)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        data.load_corpus(empty)
    assert "no sentence pairs" in _one_line(err)


def test_fetch_rejects_wrong_checksum_and_leaves_nothing(tmp_path):
    source = _write_zip(tmp_path / "mirror.zip", TINY_TEXT)
    dest = tmp_path / "cache" / "fra-eng.zip"
    with pytest.raises(DataError) as err:
        data.fetch(source.as_uri(), dest)
    assert "sha256" in _one_line(err)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []  # no partial download left behind


def test_fetch_of_a_non_corpus_zip_leaves_nothing(tmp_path):
    source = _write_zip(tmp_path / "mirror.zip", b"about", member="fra-eng/_about.txt")
    dest = tmp_path / "cache" / "fra-eng.zip"
    with pytest.raises(DataError) as err:
        data.fetch(source.as_uri(), dest)
    _one_line(err)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []


def test_fetch_unreachable_url_raises_data_error(tmp_path):
    dest = tmp_path / "cache" / "fra-eng.zip"
    url = (tmp_path / "missing.zip").as_uri()
    with pytest.raises(DataError) as err:
        data.fetch(url, dest)
    assert url in _one_line(err)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []


def test_fetch_verifies_and_moves_into_place(tmp_path, monkeypatch):
    source = _write_zip(tmp_path / "mirror.zip", TINY_TEXT)
    monkeypatch.setattr(data, "CORPUS_SHA256", hashlib.sha256(TINY_TEXT).hexdigest())
    dest = tmp_path / "cache" / "fra-eng.zip"
    assert data.fetch(source.as_uri(), dest) == dest
    assert dest.read_bytes() == source.read_bytes()
    assert list(dest.parent.iterdir()) == [dest]
    loaded = data.load_corpus(dest)
    assert loaded.sha256 == data.CORPUS_SHA256
    assert sum(len(v) for v in loaded.splits.values()) == 4


def test_locate_downloads_into_the_cache_when_nothing_else_is_found(tmp_path, monkeypatch):
    source = _write_zip(tmp_path / "mirror.zip", TINY_TEXT)
    cache = tmp_path / "cache" / "fra-eng.zip"
    monkeypatch.delenv("TK_DATA", raising=False)
    monkeypatch.setenv("TK_CACHE_DIR", str(cache.parent))
    monkeypatch.setattr(data, "shared_files", lambda: [])
    monkeypatch.setattr(data, "CORPUS_URL", source.as_uri())
    monkeypatch.setattr(data, "CORPUS_SHA256", hashlib.sha256(TINY_TEXT).hexdigest())
    assert data.locate() == cache
    assert cache.is_file()
    # The second time the cache is used without downloading.
    source.unlink()
    assert data.locate() == cache


def test_tokenizer_gives_the_same_ids_and_text_for_short_and_long_lists(tokenizer):
    # Short lists go one string at a time (SentencePiece's list call starts a thread pool, a single request's
    # largest fixed cost after the graphs); long ones in one list call. Either way, the same result.
    texts = [f"Il a {n} ans, n'est-ce pas ?" if n % 2 else f"Je suis à la maison\u202f! ({n})" for n in range(40)]
    one_by_one = [tokenizer.encode([t])[0] for t in texts]
    assert tokenizer.encode(texts) == one_by_one and tokenizer.encode(texts[:3]) == one_by_one[:3]
    one_text = [tokenizer.decode([i])[0] for i in one_by_one]
    assert tokenizer.decode(one_by_one) == one_text == tokenizer.decode(one_by_one[:3]) + tokenizer.decode(one_by_one[3:])


def test_a_single_request_is_tokenised_without_sentencepieces_list_call(tokenizer, monkeypatch):
    calls = []
    for name in ("encode", "decode"):
        real = getattr(tokenizer.sp, name)
        monkeypatch.setattr(tokenizer.sp, name, lambda x, *a, _real=real, **k: calls.append(type(x[0] if x else None)) or _real(x, *a, **k))
    tokenizer.decode(tokenizer.encode(["I'm home."]))
    assert calls == [str, int]  # one string encoded, one id list decoded; no list of them
