"""A sentence longer than the model's positions is translated in pieces that fit, never cut short (textprep.fitted).

The cutting is tested with a counter of its own (a token a word, plus the end token), so each check holds by
construction: nothing of the sentence is dropped, no piece is over the limit, the cut falls at the best place near
where the pieces balance, and never inside a placeholder or between a character and its combining mark.
"""

from __future__ import annotations

import math
import unicodedata

import pytest

from toolkit.core import placeholders
from toolkit.core.textprep import PIECE_SHARE, fitted, prepare


def words(text: str) -> int:
    return len(text.split()) + 1


def chars(text: str) -> int:
    return len(text) + 1


def test_a_sentence_that_fits_is_left_whole():
    sentence = " ".join(["word"] * 63)
    assert fitted(sentence, words, 64) == ([sentence], 0)


@pytest.mark.parametrize("n_words", [64, 100, 301, 2000])
def test_a_sentence_too_long_is_cut_into_balanced_pieces_that_fit_and_lose_nothing(n_words):
    sentence = " ".join(f"w{i}" for i in range(n_words))
    pieces, count = fitted(sentence, words, 64)
    assert count == n_words + 1
    assert " ".join(pieces) == sentence  # every word, in order, once
    assert all(words(p) <= 64 for p in pieces)
    # About as few pieces as the share allows (a piece of cap tokens on average; the cuts are placed by characters, so a
    # piece may come out over the limit and be cut once more), none a stub.
    fewest = math.ceil((n_words + 1) / int(64 * PIECE_SHARE))
    assert fewest <= len(pieces) <= fewest + 1
    assert min(words(p) for p in pieces) >= 0.5 * max(words(p) for p in pieces)


def test_the_cut_falls_after_a_clause_near_the_middle_rather_than_between_any_two_words():
    first = " ".join(["alpha"] * 33) + ","
    second = " ".join(["beta"] * 33)
    pieces, _ = fitted(f"{first} {second}", words, 64)
    assert pieces == [first, second]
    # A line of sentences (translated whole: --no-split, the browser) is cut after a sentence's end before a comma.
    pieces, _ = fitted(" ".join(["alpha"] * 30) + ". " + " ".join(["beta"] * 4) + ", " + " ".join(["gamma"] * 32), words, 64)
    assert pieces[0].endswith("alpha.")
    # Without the comma, before the conjunction.
    pieces, _ = fitted(" ".join(["alpha"] * 30) + " and " + " ".join(["beta"] * 36), words, 64)
    assert pieces[1].startswith("and beta")


def test_text_without_spaces_is_cut_between_characters_never_inside_a_placeholder_or_a_character():
    cjk = "我们在火车站见面" * 40
    pieces, _ = fitted(cjk, chars, 64)
    assert "".join(pieces) == cjk and all(chars(p) <= 64 for p in pieces)
    symbols = "".join(f"x{placeholders.SYMBOLS[i % 10]}" for i in range(60))
    pieces, _ = fitted(symbols, chars, 64)
    assert "".join(pieces) == symbols
    assert sum(len(placeholders.SYMBOL_RE.findall(p)) for p in pieces) == 60  # each symbol whole in one piece
    accented = unicodedata.normalize("NFD", "é") * 200 + "👍🏽" * 50
    pieces, _ = fitted(accented, chars, 64)
    assert "".join(pieces) == accented
    assert not any(unicodedata.combining(p[0]) or p[0] == "\U0001f3fd" for p in pieces)
    # A Thai vowel sign is a mark of combining class 0: it stays with its consonant as well.
    thai = "กั" * 200
    pieces, _ = fitted(thai, chars, 64)
    assert "".join(pieces) == thai and len(pieces) > 4
    assert not any(unicodedata.category(p[0]) == "Mn" for p in pieces)


def test_prepare_cuts_as_the_model_reads_its_inputs_and_marks_the_pieces():
    line = " ".join(f"the cat {n} sleeps on the big red sofa in the quiet house" for n in (7, 8)) + " " + \
        " ".join(["and the dog sleeps too"] * 14) + "."
    segments = prepare(line, tokens=words, limit=64)
    assert len(segments) > 1 and all(words(s.text) <= 64 for s in segments)
    assert {s.cut_from for s in segments} == {words(line)}
    # Each number (a protected span) is in exactly one piece, numbered from 0 there as in training.
    assert sorted(int(x) for s in segments for x in s.spans) == [7, 8]
    assert all([m.group() for m in placeholders.SYMBOL_RE.finditer(s.text)] == placeholders.SYMBOLS[: len(s.spans)] for s in segments)
    # A shouted sentence is measured folded, as the model reads it, and every piece is given back in capitals.
    shouted = prepare(line.upper(), tokens=words, limit=64)
    assert len(shouted) == len(segments) and {s.case for s in shouted} == {"upper"}
    # Without a counter (and with the text handling off) nothing is cut: the decoder truncates.
    assert len(prepare(line)) == 1 and len(prepare(line, enabled=False, tokens=words, limit=64)) == 1
    assert [s.cut_from for s in prepare("A short one. " * 3, tokens=words, limit=64)] == [0, 0, 0]
