"""Confidence: every translation says how far to trust it, in [0, 1], so a translator knows which lines to check.

Scripted models (a backend that writes what the test says) make the cases hold by construction: a translation the
loop guard cuts at every beam, an untranslated copy of the source, a sentence whose greedy path runs away while a wider
beam's ends. The shipped model checks the real paths (the API, the CLI column) on a few sentences.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import Scripted, one_line_error

from toolkit.core import confidence as conf
from toolkit.core import data
from toolkit.core import manifest as manifest_mod
from toolkit.core.decode_options import DecodeOptions
from toolkit.core.decoding import StepBackend
from toolkit.core.tokenizers import open_tokenizer
from toolkit.deploy.api import Translator
from toolkit.deploy.translate import TranslationModel, translate_batch

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "exported" / "transformer"
SENTENCES = ["I'm home.", "Where is the station?", "Tell me. I gave up.", "", "Room 12 costs 45 dollars."]
FRENCH = "Le chat dort sur le tapis."
SOURCE = "The cat sleeps on the mat."


@pytest.fixture(scope="module")
def shipped() -> tuple[manifest_mod.Manifest, object]:
    m = manifest_mod.load(SHIPPED)
    return m, open_tokenizer(m)


def scripted(shipped, backend: StepBackend) -> TranslationModel:
    """The shipped model's manifest and tokenizer, decoding with `backend`."""
    m, tokenizer = shipped
    return TranslationModel(m, tokenizer, lambda: backend, "cpu", 0.0)


class PerSource(StepBackend):
    """Writes the source's own tokens back (an untranslated copy) for a source that begins with `copy_first`, and
    `script` for any other, each token at a log-probability of -0.01, then the end token."""

    def __init__(self, script: list[int], copy_first: int, vocab: int, end: int):
        self.script, self.copy_first, self.vocab, self.end = script, copy_first, vocab, end

    def encode(self, src, src_len):
        scripts = [list(row[:n]) if row[0] == self.copy_first else self.script for row, n in zip(src.tolist(), src_len.tolist())]
        return {"scripts": scripts, "t": 0}

    def step(self, token, state):
        logp = np.full((len(state["scripts"]), self.vocab), -20.0, dtype=np.float32)
        t = state["t"]
        for r, script in enumerate(state["scripts"]):
            logp[r, script[t] if t < len(script) else self.end] = -0.01
        return logp, {**state, "t": t + 1}

    def select(self, state, rows):
        return {**state, "scripts": [state["scripts"][i] for i in rows]}


class Branching(StepBackend):
    """A model whose best first token leads into a loop and whose second best into a sentence that ends: greedy runs
    away, a beam of 4 finds the sentence. first: {token: log-probability}; loops: token -> the token it repeats
    (at -1.0 a step); ends: token -> the tokens that follow it (at -0.01 each), then the end token. Every other token
    is at -20, and the end token elsewhere at -30: no other hypothesis ends."""

    def __init__(self, first: dict[int, float], loops: dict[int, int], ends: dict[int, list[int]], vocab: int, end: int):
        self.first, self.loops, self.ends, self.vocab, self.end = first, loops, ends, vocab, end

    def encode(self, src, src_len):
        return {"prefix": [() for _ in range(len(src))], "t": 0}

    def next_tokens(self, prefix: tuple[int, ...]) -> dict[int, float]:
        if not prefix:
            return self.first
        if prefix[0] in self.loops:
            return {self.loops[prefix[0]]: -1.0}
        if prefix[0] not in self.ends:
            return {}
        rest = self.ends[prefix[0]]
        return {rest[len(prefix) - 1] if len(prefix) - 1 < len(rest) else self.end: -0.01}

    def step(self, token, state):
        prefixes = [p + (int(k),) for p, k in zip(state["prefix"], token)] if state["t"] else list(state["prefix"])
        logp = np.full((len(prefixes), self.vocab), -20.0, dtype=np.float32)
        logp[:, self.end] = -30.0
        for r, p in enumerate(prefixes):
            for k, lp in self.next_tokens(p).items():
                logp[r, k] = lp
        return logp, {"prefix": prefixes, "t": state["t"] + 1}

    def select(self, state, rows):
        return {**state, "prefix": [state["prefix"][i] for i in rows]}


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode([text])[0]


def test_every_translation_of_the_api_carries_a_confidence_in_0_1(shipped):
    translator = Translator(SHIPPED, provider="cpu", variant="fp32")
    for beam, n_best in ((1, 1), (3, 3)):
        for nbest in translator.translate_batch(SENTENCES, beam=beam, n_best=n_best):
            for h in nbest:
                assert 0.0 <= h.confidence <= 1.0, h
    [[empty]] = translator.translate_batch([""])
    assert empty.text == "" and empty.confidence == 1.0  # nothing to translate, nothing to check


def test_a_translation_the_loop_guard_cuts_at_every_beam_gets_a_low_confidence(shipped):
    m, tokenizer = shipped
    word = ids(tokenizer, "bonjour")
    looping = scripted(shipped, Scripted(word * 12, tokenizer.vocab_size))
    ending = scripted(shipped, Scripted(ids(tokenizer, FRENCH), tokenizer.vocab_size))

    guarded: list[int] = []
    [[cut]] = translate_batch(looping, [SOURCE], DecodeOptions.for_manifest(m), guarded=guarded)
    [[whole]] = translate_batch(ending, [SOURCE], DecodeOptions.for_manifest(m))

    assert cut.stopped == "loop" and guarded == [1]  # the retry at beam 4 loops too: the guard's cut is kept
    assert conf.for_manifest(m).probability(cut.signals) > 0.5  # the model is sure of its loop ...
    assert cut.confidence <= conf.GUARDED_MAX < 0.5 < whole.confidence  # ... and the cut is still the line to check


def test_an_untranslated_copy_of_the_source_gets_a_low_confidence(shipped):
    m, tokenizer = shipped
    backend = PerSource(ids(tokenizer, FRENCH), ids(tokenizer, SOURCE)[0], tokenizer.vocab_size, m.rules().end)
    copy, translated = translate_batch(scripted(shipped, backend), [SOURCE, "A cat sleeps on the mat."], DecodeOptions.for_manifest(m))

    assert copy[0].text == SOURCE and translated[0].text == FRENCH
    assert copy[0].signals.untranslated and copy[0].signals.copied == 1.0
    assert copy[0].confidence <= conf.UNTRANSLATED_MAX < 0.5 < translated[0].confidence


def test_a_line_whose_protected_spans_were_repaired_gets_a_low_confidence(shipped):
    m, tokenizer = shipped
    assert m.declared().placeholders  # the shipped model writes numbers as placeholders, which this one drops
    backend = PerSource(ids(tokenizer, "La salle est ouverte."), -1, tokenizer.vocab_size, m.rules().end)
    repaired: list[int] = []

    [[best]] = translate_batch(scripted(shipped, backend), ["Room 12 is open."], DecodeOptions.for_manifest(m), repaired=repaired)

    assert "12" in best.text and repaired == [1]  # put back by the fallback
    assert best.signals.repaired and best.confidence <= conf.REPAIRED_MAX < conf.for_manifest(m).probability(best.signals)


def test_names_and_shared_words_are_no_untranslated_copy():
    assert conf.copy_signals("Tom loves Mary.", "Tom aime Mary.") == (0.5, False)  # "Mary" is a name, not counted
    assert conf.copy_signals("That's impossible.", "C'est impossible.")[1] is False
    assert conf.copy_signals("Where is the station?", "Where is the station?") == (1.0, True)
    assert conf.copy_signals("Boston.", "Boston.") == (1.0, False)  # one word: a name as often as not


def test_a_sentence_that_runs_away_greedily_is_retried_at_beam_4_and_comes_out_whole(shipped):
    m, tokenizer = shipped
    sentence = ids(tokenizer, FRENCH)
    loop_start, loop_word = ids(tokenizer, "bonjour")[0], ids(tokenizer, "merci")[0]
    backend = Branching({loop_start: -0.5, sentence[0]: -0.9}, {loop_start: loop_word}, {sentence[0]: sentence[1:]},
                        tokenizer.vocab_size, m.rules().end)
    said: list[str] = []
    guarded: list[int] = []

    [[best]] = translate_batch(scripted(shipped, backend), [SOURCE], DecodeOptions.for_manifest(m), warn=said.append, guarded=guarded)

    assert best.text == FRENCH and best.stopped == ""
    assert guarded == [] and not any("guard" in s for s in said)
    assert best.confidence > conf.GUARDED_MAX


def test_a_files_batches_are_finished_by_the_streams_that_decoded_them_as_each_sentence_alone(monkeypatch):
    """Each batch's runaways are decoded again at beam 4, and its text and confidences written, in the stream that decoded
    the batch, beside the other stream, not after every batch on one core (the retry took 25 to 100 ms and the text
    35 ms of a 2,000-line file's 1.1 s that way). The shipped model's greedy decode runs away on RUNAWAY ("Ils
    représentententent ..."); retried, it ends of its own accord."""
    import threading

    from toolkit.core import batching, decode_options
    from toolkit.deploy import translate as translate_mod

    # Two streams whatever cores this test runs on (an xdist worker has one of its own).
    monkeypatch.setattr(decode_options, "cores", lambda: 2)
    monkeypatch.setattr(batching, "cores", lambda: 2)
    runaway = "They represent not only themselves but this institution as well."
    lines = [f"I see {n} cats." for n in ("two", "three", "four", "five", "six", "seven")] + [runaway, "Where is it?"]
    translator = Translator(SHIPPED, provider="cpu", variant="fp32", threads=1)
    alone = [translator.translate_batch([line])[0] for line in lines]
    retried_in: list[str] = []
    written_in: list[str] = []
    retried, signals = translate_mod.retried, conf.signals

    def recorded_retry(backend, ids, results, opts, **kwargs):
        if any(nbest[0].stopped for nbest in results):
            retried_in.append(threading.current_thread().name)
        return retried(backend, ids, results, opts, **kwargs)

    def recorded_signals(*args):
        written_in.append(threading.current_thread().name)
        return signals(*args)

    monkeypatch.setattr(translate_mod, "retried", recorded_retry)
    monkeypatch.setattr(conf, "signals", recorded_signals)
    in_file = translator.translate_batch(lines, streams=2, batch_size=2)

    runaway_alone = alone[lines.index(runaway)]
    assert runaway_alone[0].stopped == "" and runaway_alone[0].confidence > conf.GUARDED_MAX  # retried, it ended by itself
    assert [[(t.text, t.score, t.confidence) for t in n] for n in in_file] == [[(t.text, t.score, t.confidence) for t in n] for n in alone]
    assert len(retried_in) == 1 and retried_in[0].startswith("tk-stream"), retried_in
    assert len(written_in) == len(lines) and all(name.startswith("tk-stream") for name in written_in), written_in


def test_a_line_s_confidence_is_its_weakest_sentence_s(shipped):
    translator = Translator(SHIPPED, provider="cpu", variant="fp32")
    line, first, second = translator.translate_batch(["I am at home now. Where is the train station?", "I am at home now.",
                                                      "Where is the train station?"])
    assert line[0].sentences == 2
    assert line[0].confidence == min(first[0].confidence, second[0].confidence)


def test_the_cli_confidence_column_holds_each_line_s_confidence(cli, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    want = Translator(SHIPPED, provider="cpu", variant="fp32").translate_batch(SENTENCES)

    result = cli("translate", "--model", SHIPPED, "--variant", "fp32", "-i", source, "--confidence")

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split("\t") for line in lines] == [[n[0].text, f"{n[0].confidence:.3f}"] for n in want]
    assert all(0.0 <= float(line.split("\t")[1]) <= 1.0 for line in lines)
    assert "confidence: " in result.stderr  # which map gave them: the calibrated one or the default


def test_min_confidence_names_the_low_lines_on_stderr_and_leaves_stdout_alone(cli, tmp_path, shipped, monkeypatch):
    from toolkit.deploy import translate

    m, tokenizer = shipped
    backend = PerSource(ids(tokenizer, FRENCH), ids(tokenizer, SOURCE)[0], tokenizer.vocab_size, m.rules().end)
    monkeypatch.setattr(translate, "open_model", lambda *args, **kwargs: scripted(shipped, backend))
    source = tmp_path / "in.txt"
    # Lines 2 and 4 begin as SOURCE does: the scripted model copies them untranslated.
    source.write_text("I'm home.\nThe cat sleeps on the mat.\nWhere is the station?\nThe dog runs in the garden.\n", encoding="utf-8")

    plain = cli("translate", "-i", source)
    marked = cli("translate", "-i", source, "--min-confidence", 0.5)
    quiet = cli("translate", "-q", "-i", source, "--min-confidence", 0.5)

    assert plain.exit_code == marked.exit_code == quiet.exit_code == 0, marked.output
    assert marked.stdout_bytes == plain.stdout_bytes == quiet.stdout_bytes
    warned = [line for line in marked.stderr.splitlines() if "confidence below" in line]
    assert warned == ["warning: 2 lines with a confidence below 0.5, to check: 2, 4"]
    assert quiet.stderr.splitlines() == warned  # asked for by name: said even with -q


def test_confidence_options_refuse_what_they_cannot_rate(cli, tmp_path):
    assert "--confidence rates lines of text" in one_line_error(cli("translate", "--format", "html", "--confidence", "<p>Hi</p>"), 2)
    assert "--min-confidence" in one_line_error(cli("translate", "--min-confidence", 1.5, "Hi."), 2)
    # Without the Challenge file its sentences cannot be left out of the calibration: refused before any model loads.
    assert "give --challenge FILE" in one_line_error(cli("evaluate", SHIPPED, "--calibrate", "--limit", 5), 2)


def test_rank_statistics():
    assert conf.ranks([3.0, 1.0, 2.0, 1.0]).tolist() == [3.0, 0.5, 2.0, 0.5]  # ties share their mean rank
    assert conf.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert conf.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    chrf = [10.0] + [80.0] * 9
    rated = conf.report([0.1] + [0.9] * 9, chrf)  # the least confident tenth is the bad sentence
    assert (rated["low_chrf"], rated["rest_chrf"], rated["gap"]) == (10.0, 80.0, 70.0)


def test_a_fitted_map_is_monotone_and_predicts_the_held_out_rate():
    rng = np.random.default_rng(0)
    scores = rng.uniform(-5, 0, 2000)
    good = rng.random(2000) < 1 / (1 + np.exp(-(2.0 + 1.5 * scores)))  # the truth: P = logistic(2 + 1.5 score)
    fitted = conf.fit([conf.Signals(float(s), copied=float(rng.random())) for s in scores], [80.0 if g else 20.0 for g in good],
                      fitted={"split": "synthetic"})
    assert fitted.bias == pytest.approx(2.0, abs=0.3) and fitted.weights[0] == pytest.approx(1.5, abs=0.3)
    assert fitted.weights[1] <= 0  # copying never raises a confidence, whatever the data's noise says
    again = conf.Calibration.from_dict(json.loads(json.dumps(fitted.to_dict())))
    assert again == fitted and again.calibrated and not conf.DEFAULT.calibrated


def test_the_calibration_is_fitted_on_held_out_sentences_without_the_challenge_test_set(corpus_zip, challenge_test):
    from toolkit.deploy.evaluate import calibration_set

    corpus = data.load_corpus(corpus_zip)
    challenge = {en for en, _ in data.read_challenge_test(challenge_test)}
    valid = {en for en, _ in corpus.splits["valid"]}
    assert valid & challenge  # the split holds Challenge sentences: leaving them out is the calibration's doing

    english, refs, info = calibration_set(corpus, challenge_test)

    assert set(english) == valid - challenge and len(refs) == len(english)
    assert not set(english) & {en for en, _ in corpus.splits["train"]}  # held out from training too
    assert info["split"] == "valid" and info["challenge_sentences_left_out"] == len(valid & challenge)


def test_tk_evaluate_calibrate_stores_the_map_that_translate_then_uses(cli, tmp_path, challenge_test):
    copy = tmp_path / "model"
    shutil.copytree(SHIPPED, copy)
    m = manifest_mod.load(copy)
    m.confidence = None  # as a model directory before any calibration
    m.save()
    before = cli("translate", "--model", copy, "--confidence", "Where is the station?")
    assert "uncalibrated" in before.stderr

    result = cli("evaluate", copy, "--challenge", challenge_test, "--calibrate", "--beam", 1, "--limit", 120)

    assert result.exit_code == 0, result.output
    stored = manifest_mod.load(copy).confidence
    assert stored["fitted"]["split"] == "valid" and stored["fitted"]["challenge_sentences_left_out"] > 0
    assert stored["fitted"]["sentences"] <= 120 and stored["weights"][0] > 0
    scores = json.loads(result.stdout)
    for key in ("test_split_greedy", "tatoeba_challenge_greedy"):
        rated = scores[key]["confidence"]
        assert rated["calibrated"] and rated["sentences"] == 120 and -1 <= rated["spearman"] <= 1
    assert "least confident translations average chrF" in result.stderr
    after = cli("translate", "--model", copy, "--confidence", "Where is the station?")
    assert "calibrated on" in after.stderr and after.stdout != ""


def test_a_malformed_stored_calibration_is_one_line_naming_it(cli, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(SHIPPED, copy)
    raw = json.loads((copy / manifest_mod.NAME).read_text())
    raw["confidence"] = {"kind": "logistic", "features": list(conf.FEATURES), "bias": 1.0, "weights": [1.0], "threshold": 50, "fitted": {}}
    (copy / manifest_mod.NAME).write_text(json.dumps(raw))

    line = one_line_error(cli("translate", "--model", copy, "Hi."), 2)

    assert "confidence weights must be 2 finite numbers" in line
