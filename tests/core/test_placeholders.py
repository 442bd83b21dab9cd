"""Protected spans (numbers, URLs, e-mail addresses, --keep terms) come back exactly once, whatever the model does.

The guarantee (placeholders.restore, textprep.prepare): each span of a line is put in its translation exactly as
many times as it occurs in the line, verbatim; a placeholder the model dropped, repeated, invented or broke is
repaired and reported (a one-line warning naming the line in `tk translate`). What the model writes between
placeholders is its own. Most tests here use a fake model, so they hold whatever the shipped one would write.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections import Counter
from pathlib import Path

import pytest
from helpers import Scripted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.core import placeholders, textprep
from toolkit.core.batching import GUARDED, DecodeOptions

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"


# ---- restore: each span exactly once ------------------------------------------------------

@pytest.mark.parametrize("model_output, spans, expected, kinds", [
    ("Appelle ⦅0⦆, ⦅1⦆.", ["555 0199", "555 0200"], "Appelle 555 0199, 555 0200.", []),
    ("⦅0⦆ ⦅0⦆", ["123"], "123", ["repeated"]),  # the shipped model doubles a lone placeholder
    ("⦅0⦆ ⦅1⦆ ⦅1⦆ à la vitesse", ["1", "2", "3"], "1 2 3 à la vitesse", ["dropped"]),  # a wrong number takes the missing span
    ("Appelle ⦅0⦆, ⦅1⦆, la valeur.", ["a", "b", "c"], "Appelle a, b, la valeur c.", ["dropped"]),  # before the final period
    ("Où est la gare ?", ["42"], "Où est la gare 42 ?", ["dropped"]),
    ("Demande à ⦅0⦆ ⦅7⦆ pour ⦅1⦆.", ["TK-9000 Pro", "42"], "Demande à TK-9000 Pro pour 42.", ["invented"]),
    ("⦅1⦆ puis ⦅0⦆.", ["7:30", "8:30"], "8:30 puis 7:30.", []),  # reordering is the model's right
    ("Va ⦅1 vite ⦆ ⦅0⦆.", ["x", "y"], "Va vite x y.", ["broken", "broken", "dropped"]),
    ("", ["https://x.org"], "https://x.org", ["dropped"]),
    ("Voir ⦅0⦆.", ["Foo (Bar)."], "Voir Foo (Bar)..", []),  # a span's own punctuation is never cut into
    ("Voir ⦅0⦆", ["Foo (Bar)", "9"], "Voir Foo (Bar) 9", ["dropped"]),
])
def test_restore_puts_each_span_back_exactly_once_and_reports_what_it_repaired(model_output, spans, expected, kinds):
    report: list[placeholders.Repair] = []
    assert placeholders.restore(model_output, spans, report) == expected
    assert [r.kind for r in report] == kinds
    assert all(str(r) for r in report)  # each reads as a phrase of the warning


def test_restore_leaves_a_sentence_without_placeholders_as_it_is():
    report: list[placeholders.Repair] = []
    assert placeholders.restore("Il fait  beau.", [], report) == "Il fait  beau." and report == []


# ---- the invariant, for any model output --------------------------------------------------

# Spans none of which holds another, so counting each in the output counts that span alone.
POOL = ["555 0199", "555 0200", "42", "3.14", "7:30", "https://tatoeba.org/fr", "bob.x@mail.example.org", "2024-05-01",
        "TK-9000 Pro", "Grünwald GmbH", "⦅3⦆", "www.example.com"]
KEEP = ("TK-9000 Pro", "Grünwald  GmbH")  # a double space in the term: matched all the same
ENGLISH = ["call", "me", "at", "and", "or", "the", "room", "is", "on", "floor", ",", ".", "?", "WHERE", "Is", "It"]
FRENCH = ["appelle", "moi", "et", "ou", "la", "chambre", "est", ",", "."]  # the fake model's words: no span among them
FRAGMENTS = ["⦅", "⦆", "⦅1", "2⦆", "⦅12"]


def _fake_translation(data, segment: textprep.Segment) -> tuple[str, bool]:
    """What a model might make of a segment: its words, each placeholder 0 to 3 times, invented and broken ones,
    in any order; and whether that was exactly each placeholder once and nothing else."""
    words = data.draw(st.lists(st.sampled_from(FRENCH), max_size=6))
    copies = [data.draw(st.integers(0, 3)) for _ in segment.spans]
    symbols = [placeholders.SYMBOLS[i] for i, n in enumerate(copies) for _ in range(n)]
    extra = data.draw(st.lists(st.sampled_from([*placeholders.SYMBOLS[len(segment.spans):], *FRAGMENTS]), max_size=2))
    return " ".join(data.draw(st.permutations(words + symbols + extra))), all(n == 1 for n in copies) and not extra


@settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=st.lists(st.one_of(st.sampled_from(ENGLISH), st.sampled_from(POOL)), max_size=24), data=st.data())
def test_every_span_comes_back_exactly_as_often_as_in_the_line_whatever_the_model_does(tokens, data):
    line = " ".join(tokens)
    segments = textprep.prepare(line, KEEP)
    assert all(len(s.spans) <= placeholders.PER_INPUT for s in segments)  # no model input carries more than it copies
    out = []
    for segment in segments:
        fake, exact = _fake_translation(data, segment)
        report: list[placeholders.Repair] = []
        out.append(textprep.finish(segment, fake, report))
        assert (report == []) == exact, (fake, report)  # a repair is reported exactly when one was needed
    out = textprep.join(out)
    for span in POOL:
        assert out.count(span) == line.count(span), (line, out, span)
    assert not re.search(r"⦅\d*|\d*⦆", out.replace("⦅3⦆", "")), out  # no placeholder or piece of one is left


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(tokens=st.lists(st.one_of(st.sampled_from(ENGLISH), st.sampled_from(POOL)), max_size=24))
def test_a_model_that_copies_every_placeholder_once_needs_no_repair(tokens):
    line = " ".join(tokens)
    report: list[placeholders.Repair] = []
    segments = textprep.prepare(line, KEEP)
    out = textprep.join([textprep.finish(s, s.text, report) for s in segments])
    assert report == []
    assert Counter(re.findall(r"\d+", out)) == Counter(re.findall(r"\d+", line))


# ---- how a line is cut into model inputs ---------------------------------------------------

def test_a_list_of_numbers_is_one_placeholder():
    assert placeholders.protect_terms("Call 555 0199, 555 0200, 555 0201.")[:2] == ("Call ⦅0⦆.", ["555 0199, 555 0200, 555 0201"])
    assert placeholders.protect_terms("1 2 3")[:2] == ("⦅0⦆", ["1 2 3"])
    codes = "The codes are 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and 12."
    assert [s.text for s in textprep.prepare(codes)] == ["The codes are ⦅0⦆ and ⦅1⦆."]
    # Training's substitution is as it was: one symbol a span, at most ten.
    assert placeholders.protect("Call 555 0199, 555 0200.") == ("Call ⦅0⦆, ⦅1⦆.", ["555 0199", "555 0200"])


def test_a_sentence_with_more_spans_than_the_model_copies_is_translated_in_pieces():
    segments = textprep.prepare("Room 12 is on floor 3 and room 40 on floor 5.")
    assert [(s.text, s.spans) for s in segments] == [("Room ⦅0⦆ is on floor ⦅1⦆", ["12", "3"]),
                                                     ("and room ⦅0⦆ on floor ⦅1⦆.", ["40", "5"])]
    pets = textprep.prepare("I have 2 cats, 3 dogs, 4 birds, 5 fish and 6 cows.")
    assert [s.text for s in pets] == ["I have ⦅0⦆ cats, ⦅1⦆ dogs,", "⦅0⦆ birds, ⦅1⦆ fish", "and ⦅0⦆ cows."]
    # Capitals: a shouted sentence stays shouted in every piece, a Title Case one gets one capital, at its start.
    shouted = textprep.prepare("ROOM 12 IS ON FLOOR 3 AND ROOM 40 ON FLOOR 5.")
    assert [s.case for s in shouted] == ["upper", "upper"]
    titled = textprep.prepare("Room 12 Is On Floor 3 And Room 40 On Floor 5.")
    assert [s.case for s in titled] == ["title", ""]


def test_twenty_keep_terms_all_survive_and_whitespace_does_not_matter():
    terms = tuple(f"Term{c}X" for c in "ABCDEFGHIJKLMNOPQRST")
    line = "I met " + " and ".join(terms) + "."
    segments = textprep.prepare(line, terms)
    out = textprep.join([textprep.finish(s, s.text) for s in segments])
    assert all(out.count(t) == 1 for t in terms)
    for term, text in [("Grünwald  GmbH", "I work for Grünwald GmbH."), ("Grünwald GmbH", "I work for Grünwald  GmbH."),
                       ("Grünwald\tGmbH", "I work for Grünwald\u00a0GmbH."), ("Cafe\u0301 Noir", "At Café Noir.")]:
        [segment] = textprep.prepare(text, (term,))
        assert len(segment.spans) == 1 and "⦅0⦆" in segment.text, (term, text, segment)


# ---- format characters and caseless scripts -------------------------------------------------

@pytest.mark.parametrize("line", ["\u200eHello.", "Hel\u00adlo.", "\u200bHello.\u200b", "\ufeffHello.", "\u202bHello.\u202c",
                                  "Hello\u2060.", "\u2066Hello.\u2069"])
def test_format_characters_never_reach_the_model(line):
    assert [s.text for s in textprep.prepare(line)] == ["Hello."]


def test_a_keep_term_keeps_its_own_format_characters_verbatim():
    family = "Team \U0001f468\u200d\U0001f469\u200d\U0001f467"  # joined by zero-width joiners: one emoji, not three
    [segment] = textprep.prepare(f"\u200eI love {family} a lot.", (family,))
    assert segment.spans == [family] and not placeholders.FORMAT_RE.search(segment.text)
    assert textprep.finish(segment, "J'adore ⦅0⦆.") == f"J'adore {family}."
    # A term typed with a mark matches the text without it, and the other way round.
    assert textprep.prepare("I work for Grünwald.", ("\u200eGrünwald",))[0].spans == ["Grünwald"]
    assert textprep.prepare("I work for Grün\u00adwald.", ("Grünwald",))[0].spans == ["Grünwald"]


def test_the_format_class_is_unicodes_category_cf():
    every = "".join(map(chr, range(0x110000)))
    stripped = set(placeholders.FORMAT_RE.findall(every))
    assert not [hex(ord(c)) for c in every if unicodedata.category(c) == "Cf" and c not in stripped]
    # Every character it strips is one (or not yet assigned in this Python's Unicode tables).
    assert {unicodedata.category(c) for c in stripped} <= {"Cf", "Cn"}


@pytest.mark.parametrize("line", ["مرحبا بكم في المدينة", "שלום עולם ומלואו", "你好世界", "こんにちは世界", "OK 你好世界", "12 345"])
def test_caseless_scripts_are_never_all_caps(line):
    assert not textprep.is_all_caps(line) and not textprep.is_title_case(line)
    assert all(s.case == "" for s in textprep.prepare(line))


def test_capitals_with_caseless_letters_beside_them():
    assert textprep.is_all_caps("WHERE IS 東京?") and textprep.prepare("WHERE IS 東京?")[0].case == "upper"
    assert textprep.is_title_case("Where Is 東京 Station?")
    assert not textprep.is_all_caps("ǅEMAL KOJI")  # a titlecase letter is not a capital


# ---- the warning, through translate_batch ----------------------------------------------------


@pytest.fixture(scope="module")
def shipped():
    from toolkit.deploy.translate import open_model

    return open_model(SHIPPED, "cpu")


def scripted(model, french: str):
    """The shipped model's tokenizer with a decoder that always writes `french`."""
    tokens = model.tokenizer.encode([french])[0]
    return dataclasses.replace(model, backend=lambda: Scripted(tokens, model.tokenizer.vocab_size), threads=None)


def test_a_repaired_line_is_warned_about_by_number_and_counted(shipped):
    from toolkit.deploy.translate import translate_batch

    warnings: list[str] = []
    repaired: list[int] = []
    # (A line of nothing but spans, "123", is its own translation: it never reaches the model.)
    out = translate_batch(scripted(shipped, "⦅0⦆ ⦅0⦆"), ["Go.", "Call 123", "See https://tatoeba.org"], DecodeOptions.bare(max_len=64, **GUARDED),
                          warn=warnings.append, first_lineno=7, repaired=repaired)
    assert [n[0].text for n in out] == ["", "123", "https://tatoeba.org"]
    assert repaired == [7, 8, 9]
    assert len(warnings) == 3 and "line 7:" in warnings[0] and "'123' repeated" in warnings[1] and "line 9:" in warnings[2]


def test_a_line_with_no_letter_outside_its_spans_is_its_own_translation_whatever_the_model_writes(shipped):
    """A number, an emoji or a run of phone numbers alone: the model is not asked (given a lone placeholder the shipped
    model wrote it twice, and each such line was warned about and capped at confidence 0.3)."""
    from toolkit.deploy.translate import translate_batch

    warnings: list[str] = []
    lines = ["2019", "👍", "555 0199, 555 0200", "3.14 !"]
    out = translate_batch(scripted(shipped, "Appelle ⦅0⦆ ⦅0⦆ ⦅1⦆."), lines, DecodeOptions.bare(max_len=64, **GUARDED), warn=warnings.append)
    assert [n[0].text for n in out] == lines and warnings == []
    assert all(n[0].confidence == 1.0 for n in out)


def test_the_command_line_summary_counts_repaired_lines(cli, shipped, monkeypatch):
    from toolkit.deploy import translate

    monkeypatch.setattr(translate, "open_model", lambda *a, **k: scripted(shipped, "Appelle ⦅0⦆."))
    result = cli("translate", "Call 555 0199, then 555 0200 and 555 0201, or 555 0202.", "Go.")
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert all(first.count(n) == 1 for n in ["555 0199", "555 0200", "555 0201", "555 0202"]), first
    assert "warning: line 1: the model did not copy every protected span" in result.output
    assert "warning: line 2" in result.output  # "Go." has no span, but the fake model wrote one
    assert "2 lines with protected spans put back by the fallback" in result.output


def test_the_api_warns_when_the_fallback_put_a_span_back(shipped, monkeypatch):
    import warnings

    from toolkit import SpanRepairWarning, Translator

    translator = Translator.__new__(Translator)  # the shipped model with a decoder that drops the span
    translator.loaded = scripted(shipped, "Appelle.")
    translator._backend = translator.loaded.backend()
    with pytest.warns(SpanRepairWarning, match=r"texts\[1\]"):
        out = translator.translate(["Go.", "Call 555 0199."])
    assert out[1].count("555 0199") == 1
    translator.loaded = scripted(shipped, "Appelle ⦅0⦆.")
    translator._backend = translator.loaded.backend()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpanRepairWarning)
        assert translator.translate(["Call 555 0199."]) == ["Appelle 555 0199."]
