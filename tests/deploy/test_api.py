"""The public Python API: `from toolkit import Translator`, torch-free, same output as `tk translate`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "exported" / "transformer"
SENTENCES = ["Hello.", "I'm home.", "Where is the station?", "She doesn't like cold coffee."]

API = f"""
import json, sys
from toolkit import Translator
t = Translator({str(MODEL)!r}, provider="cpu")
out = {{"beam4": t.translate({SENTENCES!r}, beam=4), "greedy_short": t.translate({SENTENCES!r}, max_len=2),
        "nbest": [[x.text for x in n] for n in t.translate_batch(["Where is the station?"], beam=4, n_best=2)],
        "torch": "torch" in sys.modules, "provider": t.provider}}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def api_output() -> dict:
    done = subprocess.run([sys.executable, "-c", API], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _tk(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", "translate", "--model", str(MODEL), "--provider", "cpu", "-q", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_api_translates_like_tk_translate_without_importing_torch(api_output):
    assert api_output["torch"] is False and api_output["provider"] == "cpu"
    assert api_output["beam4"] == _tk(*SENTENCES, "--beam", "4")
    assert api_output["beam4"][2] == "Où est la gare ?"


def test_max_len_caps_the_translation_in_the_api_and_the_cli(api_output):
    short = api_output["greedy_short"]
    assert short == _tk(*SENTENCES, "--max-len", "2")
    assert short != _tk(*SENTENCES)  # the cap took effect
    assert all(len(s.split()) <= 2 for s in short)


def test_n_best_gives_distinct_hypotheses_best_first(api_output):
    (nbest,) = api_output["nbest"]
    assert len(nbest) == 2 and nbest[0] != nbest[1] and nbest[0] == "Où est la gare ?"


def test_alpha_changes_the_beam_scores_the_cli_prints():
    def scores(alpha: str) -> list[float]:
        return [float(line.split(" ||| ")[2]) for line in _tk("Where is the station?", "--beam", "4", "--n-best", "2", "--alpha", alpha)]

    plain, penalised = scores("0"), scores("2")
    assert plain != penalised and all(a < b for a, b in zip(plain, penalised))  # dividing log-probs by length^alpha > 1


def test_a_stream_count_outside_its_range_is_refused_with_the_fix():
    from toolkit import Translator
    from toolkit.core.errors import UsageError

    t = Translator(MODEL, provider="cpu")
    for bad in (0, -2, 1.5, 65):
        with pytest.raises(UsageError, match=r"streams must be a whole number from 1 to 64 \(got .*\); leave it out"):
            t.translate(["Hello."], streams=bad)


def test_a_batch_size_below_one_is_refused_with_the_fix():
    # None picks the default for the beam; 0 must not quietly become it.
    from toolkit import Translator
    from toolkit.core.errors import UsageError

    t = Translator(MODEL, provider="cpu")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(UsageError, match=r"batch_size must be a whole number of at least 1.*leave it out"):
            t.translate(["Hello."], batch_size=bad)


def test_a_single_string_is_refused_with_the_fix():
    from toolkit import Translator
    from toolkit.core.errors import UsageError

    t = Translator(MODEL, provider="cpu")
    with pytest.raises(UsageError, match=r"wrap a single sentence in a list"):
        t.translate("Hello.")


def test_default_batches_hold_64_sentences_greedy_and_256_decoder_rows_under_beam_search_for_a_small_decoder():
    # On CPU a beam's cache is reordered at every step: 32 sentences x beam 4 decoded faster than 64 x 4, except where
    # the decoder's cache is small (the shipped model's 1,024 floats a row and position), where a step's fixed cost is
    # spread over twice the rows.
    from toolkit import Translator
    from toolkit.core.decode_options import DecodeOptions, beam_rows

    t = Translator(MODEL, provider="cpu")
    assert t.manifest.cache_width == 2 * 2 * 4 * 64  # two layers' keys and values, 4 heads of 64
    sizes: list[int] = []
    encode = t._backend.encode
    t._backend.encode = lambda src, lens: sizes.append(len(src)) or encode(src, lens)
    texts = [f"I have {n} cats." for n in range(100)]
    t.translate(texts, streams=1)
    greedy, sizes[:] = list(sizes), []
    t.translate(texts, beam=4, streams=1)
    beam4, sizes[:] = list(sizes), []
    t.translate(texts, beam=4, streams=1, batch_size=50)
    assert sorted(greedy) == [36, 64] and sorted(beam4) == [36, 64] and sizes == [50, 50]
    # The opus-mt shape's cache (6 layers' keys and values of 512) keeps about 128 rows: 32 sentences at beam 4.
    assert [DecodeOptions.for_model(64, rows=beam_rows(width), beam=4).batch_size for width in (6144, 2048, None)] == [32, 64, 32]


@pytest.fixture(scope="module")
def translator():
    from toolkit import Translator

    return Translator(MODEL, provider="cpu")


def _refusal(call) -> str:
    """The message of the UsageError `call` raises, asserted to be one line."""
    from toolkit.core.errors import UsageError

    with pytest.raises(UsageError) as e:
        call()
    assert "\n" not in str(e.value)
    return str(e.value)


# Each once gave a raw exception (n_best 0, beam 2.5), or quietly an empty translation (max_len -5, max_len_b -100,
# max_len_a NaN), or was taken as it stood (max_len 0 became the default, loop_guard "no" was true).
@pytest.mark.parametrize("options, expected", [
    ({"n_best": 0}, "n_best must be a whole number from 1 to the beam size 1 (got 0)"),
    ({"beam": 4, "n_best": 5}, "n_best must be a whole number from 1 to the beam size 4 (got 5)"),
    ({"beam": 2.5}, "beam must be a whole number from 1 to 64 (got 2.5)"),
    ({"beam": 65}, "beam must be a whole number from 1 to 64 (got 65)"),
    ({"beam": "4"}, "beam must be a whole number from 1 to 64 (got '4')"),
    ({"max_len": -5}, "max_len must be a whole number of at least 1 (got -5)"),
    ({"max_len": 0}, "max_len must be a whole number of at least 1 (got 0)"),
    ({"max_len_b": -100}, "max_len_b must be a whole number from 0 to 1000 (got -100)"),
    ({"max_len_a": float("nan")}, "max_len_a must be a finite number from 0 to 100, or None for no length guard (got nan)"),
    ({"max_len_a": -1.0}, "max_len_a must be a finite number from 0 to 100"),
    ({"alpha": float("inf")}, "alpha must be a finite number from 0 to 10, or None for the model's own (got inf)"),
    ({"max_tokens": 0}, "max_tokens must be a whole number of at least 1 (got 0)"),
    ({"loop_guard": "no"}, "loop_guard must be True or False (got 'no')"),
    ({"split": None}, "split must be True or False (got None)"),
    ({"beems": 4}, "translate has no option 'beems'"),
])
def test_every_bad_decoding_option_is_one_usage_error_naming_it_the_value_and_the_range(translator, options, expected):
    assert expected in _refusal(lambda: translator.translate(["Hello."], **options))


def test_valid_edges_of_the_ranges_still_translate(translator):
    assert translator.translate(["Hello."], max_len=10_000) == translator.translate(["Hello."])  # capped at the model's maximum
    assert translator.translate(["Hello."], max_len_a=None, max_len_b=0, alpha=0.0, beam=2, n_best=2, max_tokens=1) == ["Salut."]


@pytest.mark.parametrize("arguments, expected", [
    ({"provider": "tpu"}, "provider must be 'cpu', 'cuda' or None"),
    ({"threads": "2"}, "threads must be a whole number from 1 to 256 (got '2')"),
    ({"threads": 0}, "threads must be a whole number from 1 to 256 (got 0)"),
    ({"threads": True}, "threads must be a whole number from 1 to 256 (got True)"),
    ({"allow_cpu_fallback": "yes"}, "allow_cpu_fallback must be True or False (got 'yes')"),
    ({"variant": 8}, "variant must be a variant name"),
])
def test_bad_translator_arguments_are_one_usage_error_before_anything_loads(arguments, expected):
    from toolkit import Translator

    assert expected in _refusal(lambda: Translator(MODEL, **{"provider": "cpu", **arguments}))


def test_a_text_that_is_not_a_string_is_named_by_its_place(translator):
    assert "texts[0] is None, not a str" in _refusal(lambda: translator.translate([None]))
    assert "texts[1] is 3, not a str" in _refusal(lambda: translator.translate(["Hello.", 3]))
    assert "translate takes a list of texts" in _refusal(lambda: translator.translate(7))


def test_a_single_keep_term_given_as_a_string_is_one_term_not_its_letters(translator):
    text = ["Hello Zanzibarx, welcome."]
    as_list = translator.translate(text, keep=["Zanzibarx"])
    assert "Zanzibarx" in as_list[0]
    assert translator.translate(text, keep="Zanzibarx") == as_list
    assert "keep must be a list of terms" in _refusal(lambda: translator.translate(text, keep=[None]))
