"""Language detection among the served languages, and API keys with their limits (toolkit/serve/detect.py, keys.py)."""

from __future__ import annotations

import pytest

from toolkit.core.errors import UsageError
from toolkit.serve.detect import LanguageDetector
from toolkit.serve.keys import ApiKeys, parse_keys, read_keys, request_key
from toolkit.serve.middleware import Refused


def sentences(path, column: int, n: int) -> list[str]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split("\t")[column]
        if len(text.split()) >= 3 and text not in out:
            out.append(text)
        if len(out) == n:
            break
    return out


def test_detection_names_the_language_of_2000_english_and_2000_french_sentences(challenge_test):
    detector = LanguageDetector(["en", "fr"])
    data = [(s, "en") for s in sentences(challenge_test, 2, 2000)] + [(s, "fr") for s in sentences(challenge_test, 3, 2000)]
    assert len(data) == 4000
    right = sum(detector.detect(s)[0][0] == want for s, want in data)
    assert right / len(data) >= 0.98, f"{right} of {len(data)} detected"


def test_detection_answers_served_codes_with_percent_confidences_best_first():
    detector = LanguageDetector(["en", "fr", "de", "pt-BR"])
    found = detector.detect("Eu gosto muito de ler livros à noite.")
    assert found[0][0] == "pt-BR"  # the served code, not the detector's label
    assert [c for c, _ in found] == sorted([c for c, _ in found], key=dict(found).get, reverse=True)
    assert all(0.0 <= p <= 100.0 for _, p in found) and found[0][1] > 50


def test_one_served_language_is_every_texts_and_unknown_codes_are_named():
    assert LanguageDetector(["en"]).detect("anything") == [("en", 100.0)]
    nllb = LanguageDetector(["eng_Latn", "fr"])
    assert nllb.undetectable == ["eng_Latn"]
    assert nllb.detect("Je suis chez moi.") == [("fr", 100.0)]
    assert LanguageDetector(["xx"]).detect("text") == []


def test_text_without_letters_gets_no_confident_language():
    assert all(p == 0.0 for _, p in LanguageDetector(["en", "fr"]).detect("12:30 -- 42 !"))


def test_a_valid_key_is_admitted_and_counted_per_minute():
    now = [1000.0]
    keys = ApiKeys(parse_keys("team-a-key-1 2 50\nbatch-key-22\n"), clock=lambda: now[0])
    keys.admit("team-a-key-1", 10)
    keys.admit("team-a-key-1", 10)
    with pytest.raises(Refused) as over:
        keys.admit("team-a-key-1", 10)
    assert over.value.status == 429 and over.value.headers == {"Retry-After": "60"}
    assert "team-a-key-1" not in str(over.value)
    now[0] += 30
    with pytest.raises(Refused) as still:
        keys.admit("team-a-key-1", 10)
    assert still.value.headers == {"Retry-After": "30"}
    now[0] += 30.5  # the first two have left the minute
    keys.admit("team-a-key-1", 10)
    for _ in range(500):  # a key without a rate limit is never slowed down
        keys.admit("batch-key-22", 10_000)


def test_missing_wrong_and_oversized_requests_are_refused_without_naming_the_key():
    keys = ApiKeys(parse_keys("team-a-key-1 - 50\n"))
    for key, status in ((None, 403), ("", 403), ("team-a-key-2", 403)):
        with pytest.raises(Refused) as refused:
            keys.admit(key, 1)
        assert refused.value.status == status
    with pytest.raises(Refused) as large:
        keys.admit("team-a-key-1", 51)
    assert large.value.status == 400 and "team-a-key-1" not in str(large.value)


@pytest.mark.parametrize("text, problem", [
    ("", "has no key"), ("# only a comment\n\n", "has no key"), ("short 1\n", "line 1: a key of 5 characters"),
    ("good-key-1\ngood-key-1 5\n", "line 2: the key is already given"), ("good-key-1 0\n", "line 1: the requests per minute"),
    ("good-key-1 5 ten\n", "line 1: the characters per request"), ("good-key-1 5 5 5\n", "line 1: 4 fields"),
])
def test_a_bad_keys_file_is_one_line_naming_the_line_never_the_key(text, problem):
    with pytest.raises(UsageError) as bad:
        parse_keys(text)
    assert problem in str(bad.value) and "\n" not in str(bad.value)
    assert "good-key-1" not in str(bad.value)


def test_keys_file_comments_and_a_key_holding_a_hash(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text("# operators' keys\nab#cdefgh 10  # team b\n\n", encoding="utf-8")
    keys = ApiKeys(read_keys(path))
    assert keys.admit("ab#cdefgh", 1).requests_per_minute == 10
    with pytest.raises(UsageError, match="not a file"):
        read_keys(tmp_path)
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9-key-123\n")
    with pytest.raises(UsageError, match="not UTF-8"):
        read_keys(tmp_path / "latin1.txt")


def test_key_comes_from_the_fields_then_a_bearer_header():
    assert request_key({"api_key": "k-from-field"}, {"authorization": "Bearer k-from-header"}) == "k-from-field"
    assert request_key({}, {"authorization": "Bearer k-from-header"}) == "k-from-header"
    assert request_key({}, {"authorization": "Basic dXNlcjpwYXNz"}) is None
    assert request_key({"api_key": ["a", "b"]}, {}) is None
