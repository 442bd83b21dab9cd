"""Translation as people type it: placeholders, sentence splitting, case folding, guards, noise."""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from toolkit.core import noise, placeholders, textprep
from toolkit.core.batching import GUARDED, DecodeOptions
from toolkit.core.decoding import StepBackend, beam_search, greedy, length_limits, loop_cut
from toolkit.core.tokenizer import EOS
from toolkit.deploy import robustness
from toolkit.deploy.translate import open_model, translate_batch

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"


@pytest.fixture(scope="module")
def shipped():
    return open_model(SHIPPED, "cpu")


def one(model, text: str, **opts) -> str:
    return translate_batch(model, [text], DecodeOptions.bare(max_len=64, **{**GUARDED, **opts}))[0][0].text


# ---- placeholders -------------------------------------------------------------------------

@pytest.mark.parametrize("text, spans", [
    ("Call me at 555 0199.", ["555 0199"]),
    ("Room 314 is on the 3rd floor.", ["314"]),  # "3rd" is a word, not a number
    ("Meet me at 7:30 or 19:45.", ["7:30", "19:45"]),
    ("Mail bob.x+tk@mail.example.org, see https://a.b/c?d=1.", ["bob.x+tk@mail.example.org", "https://a.b/c?d=1"]),
    ("It costs 1,000.50 euros.", ["1,000.50"]),
    ("Literal ⦅3⦆ stays.", ["⦅3⦆"]),
])
def test_protect_finds_each_span_and_restore_puts_it_back(text, spans):
    protected, kept = placeholders.protect(text)
    assert kept == spans
    assert all(s not in protected or s.startswith("⦅") for s in spans)
    assert placeholders.restore(protected, kept) == text


def test_user_terms_are_protected_first_and_invented_symbols_dropped():
    protected, kept = placeholders.protect("Ask TK-9000 Pro about 42.", keep=["TK-9000 Pro"])
    assert kept == ["TK-9000 Pro", "42"] and protected == "Ask ⦅0⦆ about ⦅1⦆."
    assert placeholders.restore("Demande à ⦅0⦆ ⦅7⦆ pour ⦅1⦆.", kept) == "Demande à TK-9000 Pro pour 42."


@pytest.mark.parametrize("span", ["ñandú.ẞ@例え.jp", "https://ü.example/ŝ?q=𝔘", "42"])
def test_spans_with_characters_the_tokenizer_never_saw_come_out_verbatim(shipped, span):
    source = f"Send it to {span} please." if not span.isdigit() else f"I have {span} cats."
    assert span in one(shipped, source)
    assert span in one(shipped, source, beam=4)


@pytest.mark.parametrize("text, word", [
    ("I love it 👍", "👍"), ("Great job! 🎉🎉", "🎉🎉"), ("The family 👨\u200d👩\u200d👧 is here.", "👨\u200d👩\u200d👧"),
    ("It costs £10.", "£10"), ("Temperature is 20°C.", "20°C"), ("Use C#.", "C#"), ("Tokyo is 東京 in Japanese.", "東京"),
])
def test_a_word_with_characters_the_vocabulary_does_not_spell_comes_out_verbatim_once(shipped, text, word):
    """Emoji, £, °, # and other scripts are not among the shipped tokenizer's characters (the training text's): the
    model met them only as raw bytes, and an emoji derailed the whole sentence ("I love it 👍" -> "J'adore qu'il fasse
    des croyants à la maquette ..."). Kept verbatim as --keep terms are, each comes out exactly once, joiners and all."""
    assert any(c not in shipped.tokenizer.alphabet for c in word)
    for beam in (1, 4):
        out = one(shipped, text, beam=beam)
        assert out.count(word) == 1, out
    assert one(shipped, word) == word  # a line that is nothing but such a word is given back as it is
    assert textprep.unspelled("Where is the station? I'm home.", shipped.tokenizer.alphabet) == ()  # nothing else is kept


def test_keep_terms_come_out_verbatim_from_the_command_line(cli):
    result = cli("translate", "-q", "--keep", "Grünwald ☃Ωmega", "I work for Grünwald ☃Ωmega.")
    assert result.exit_code == 0, result.output
    assert "Grünwald ☃Ωmega" in result.output


def digits(text: str) -> Counter:
    return Counter(re.findall(r"\d+", text))


# Lines an attacker found losing or doubling numbers: every number must come back exactly once, whatever the words.
ATTACKER_LINES = ["Call 555 0199, 555 0200, 555 0201.", "The codes are 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 and 12.", "123", "1 2 3",
                  "Room 12 is on floor 3 and room 40 on floor 5.", "I have 2 cats, 3 dogs, 4 birds, 5 fish and 6 cows.",
                  "CALL 555 0199 OR 555 0200 AT 7:30, 8:30 OR 9:30.", "He was born in 1990 and died in 2020."]


def test_every_number_of_a_line_comes_back_exactly_once_from_the_command_line(cli):
    result = cli("translate", "-q", *ATTACKER_LINES)
    assert result.exit_code == 0, result.output
    outs = result.stdout.splitlines()
    assert len(outs) == len(ATTACKER_LINES)
    for line, out in zip(ATTACKER_LINES, outs):
        assert digits(out) == digits(line), (line, out)
    assert all(outs[0].count(n) == 1 for n in ["555 0199", "555 0200", "555 0201"]) and outs[2].count("123") == 1


def test_a_url_comes_back_once(cli):
    result = cli("translate", "-q", "https://tatoeba.org", "Visit https://tatoeba.org/fr or www.example.com for more.")
    assert result.exit_code == 0, result.output
    lone, both = result.stdout.splitlines()
    assert lone.count("https://tatoeba.org") == 1
    assert both.count("https://tatoeba.org/fr") == 1 and both.count("www.example.com") == 1


def test_twenty_keep_terms_and_a_term_with_a_double_space_all_come_back(cli):
    terms = [f"Term{c}X" for c in "ABCDEFGHIJKLMNOPQRST"]
    result = cli("translate", "-q", *[a for t in terms for a in ("--keep", t)], "--keep", "Grünwald  GmbH",
                 "I met " + " and ".join(terms) + ".", "I work for Grünwald GmbH.")
    assert result.exit_code == 0, result.output
    met, work = result.stdout.splitlines()
    assert [t for t in terms if met.count(t) != 1] == []
    assert work.count("Grünwald GmbH") == 1


def test_format_characters_and_caseless_scripts_from_the_command_line(cli):
    marked = cli("translate", "-q", "\u200eHello.", "Hel\u00adlo\u200b.", "\ufeffHello.\u2069")
    plain = cli("translate", "-q", "Hello.")
    assert marked.exit_code == 0 and marked.stdout.splitlines() == plain.stdout.splitlines() * 3  # the model sees the same line
    lines = ["مرحبا بكم في المدينة", "שלום עולם ומלואו", "你好世界"]
    handled = cli("translate", "-q", *lines)
    # Scripts the shipped model's vocabulary does not spell (textprep.unspelled) are copied as they are: never
    # uppercased as shouting, nor made into French the model invents.
    assert handled.exit_code == 0 and handled.stdout.splitlines() == lines


# ---- input handling -----------------------------------------------------------------------

def test_clean_normalises_and_drops_bom_and_controls():
    assert textprep.clean("\ufeffGo.") == "Go."
    assert textprep.clean("\u200eGo\u00ad\u200b.\u202c") == "Go."  # format characters (Cf) are invisible: removed
    assert textprep.clean("Cafe\u0301 ") == "Café"  # decomposed é composed (NFC)
    assert textprep.clean("\x00\x00") == ""
    assert textprep.prepare("\x00 \x00") == []


def test_several_sentences_on_a_line_translate_as_each_sentence_alone(shipped):
    together = one(shipped, "I'm home. Where is the station? I lost.")
    alone = " ".join(one(shipped, s) for s in ["I'm home.", "Where is the station?", "I lost."])
    assert together == alone


def test_no_split_sends_the_line_whole(shipped):
    from toolkit.core.textprep import TextOptions

    line = "I'm home. Where is the station? I lost."
    whole = translate_batch(shipped, [line], DecodeOptions.bare(max_len=64, **GUARDED), text=TextOptions(split=False))[0][0]
    split = translate_batch(shipped, [line], DecodeOptions.bare(max_len=64, **GUARDED))[0][0]
    assert whole.source_tokens == split.source_tokens  # same pieces, one decode instead of three
    raw = translate_batch(shipped, [line], DecodeOptions.bare(max_len=64, **GUARDED), text=TextOptions(enabled=False))[0][0]
    assert whole.text == raw.text != split.text  # the flag reaches translate_batch: one sentence, decoded whole
    assert len(textprep.prepare(line)) == 3 and len(textprep.prepare(line, split=False)) == 1


def test_all_caps_is_translated_lowercase_and_given_back_in_capitals(shipped):
    assert textprep.prepare("WHERE IS THE STATION?")[0].text == "where is the station?"
    out = one(shipped, "WHERE IS THE STATION?")
    assert out == out.upper() and out.lower() == one(shipped, "where is the station?").lower()
    assert textprep.prepare("I saw the BBC.")[0].case == ""  # an acronym does not make a line shouted


def test_bom_and_nul_lines_from_a_file(cli, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_bytes("\ufeffGo.\n\x00\x00\nI lost.\n".encode())
    result = cli("translate", "-q", "-i", src, "-o", out)
    assert result.exit_code == 0, result.output
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 3 and lines[1] == ""
    assert lines[0] == cli("translate", "-q", "Go.").output.strip()


# ---- guards -------------------------------------------------------------------------------

class Stuck(StepBackend):
    """Emits a fixed cycle of tokens forever (never EOS): a model that runs away."""

    def __init__(self, cycle):
        self.cycle = cycle

    def encode(self, src, src_len):
        return {"rows": np.arange(len(src)), "t": 0}

    def step(self, token, state):
        logp = np.full((len(state["rows"]), 20), -10.0, dtype=np.float32)
        logp[:, self.cycle[state["t"] % len(self.cycle)]] = -0.1
        logp[:, EOS] = -50.0
        return logp, {**state, "t": state["t"] + 1}

    def select(self, state, rows):
        return {**state, "rows": state["rows"][rows]}


def test_loop_cut_finds_repeats_and_keeps_one_copy():
    rows = np.array([[5, 7, 7, 7, 7, 7], [4, 5, 6, 4, 5, 6], [8, 9, 8, 9, 8, 9], [1, 2, 3, 4, 5, 6]])
    assert loop_cut(rows).tolist() == [2, -1, 2, -1]


@pytest.mark.parametrize("cycle, expected", [([7], [7]), ([8, 9], [8, 9])])
def test_loop_guard_stops_a_runaway_greedy_and_beam_hypothesis(cycle, expected):
    src = [[4, 5, 6]]
    assert len(greedy(Stuck(cycle), src, 64)[0].tokens) == 64  # unguarded: runs to the cap
    assert greedy(Stuck(cycle), src, 64, loop_guard=True)[0].tokens == expected
    assert beam_search(Stuck(cycle), src, 64, beam=2, loop_guard=True)[0][0].tokens == expected


def test_length_limit_follows_the_source_length():
    src = [[4] * 3, [4] * 20]
    limits = length_limits(src, 64, 2.0, 10)
    assert limits.tolist() == [16, 50]
    out = greedy(Stuck([7, 8, 9, 10, 11]), src, 64, limits)
    assert [len(h.tokens) for h in out] == [16, 50]
    assert [len(h[0].tokens) for h in beam_search(Stuck([7, 8, 9, 10, 11]), src, 64, 2, limits=limits)] == [16, 50]
    assert length_limits(src, 64, None, 10).tolist() == [64, 64]


# ---- training noise -----------------------------------------------------------------------

def always(**fields) -> noise.NoiseConfig:
    zero = {f: 0.0 for f in noise.NoiseConfig().asdict()}
    return noise.NoiseConfig(**{**zero, **fields})


def test_noise_lowercases_and_drops_final_punctuation_on_both_sides():
    n = noise.PairNoise(always(lower_no_punct=1.0))
    assert n("Where is Tom?", "Où est Tom ?", random.Random(0)) == ("where is tom", "où est tom")
    n = noise.PairNoise(always(no_punct=1.0))
    assert n("I'm home.", "Je suis chez moi.", random.Random(0)) == ("I'm home", "Je suis chez moi")
    n = noise.PairNoise(always(title=1.0))
    assert n("where is the station?", "Où est la gare ?", random.Random(0)) == ("Where Is The Station?", "Où est la gare ?")


def test_noise_swaps_stock_names_on_both_sides_for_unseen_ones():
    n = noise.PairNoise(always(names=1.0))
    en, fr = n("Tom and Mary left.", "Tom et Mary sont partis.", random.Random(0))
    new = en.split()[0]
    assert "Tom" not in en + fr and "Mary" not in en + fr
    assert fr.startswith(new) and new in n.names and not noise.is_held_out_name(new)
    held_out = noise.evaluation_names(set())
    assert held_out and not set(held_out) & set(n.names)


def test_noise_turns_shared_numbers_into_the_same_placeholders():
    n = noise.PairNoise(always(spans=1.0))
    assert n("I was born in 1990 and I have 10 cats, not 1.", "Je suis né en 1990 et j'ai 10 chats, pas 1.", random.Random(0)) == (
        "I was born in ⦅0⦆ and I have ⦅1⦆ cats, not ⦅2⦆.", "Je suis né en ⦅0⦆ et j'ai ⦅1⦆ chats, pas ⦅2⦆.")
    # A number the French spells out stays as it is (it can't be copied).
    assert n("I have 2 dogs.", "J'ai deux chiens.", random.Random(0)) == ("I have 2 dogs.", "J'ai deux chiens.")


def test_epoch_noise_is_seeded():
    pairs = [("Tom is 30.", "Tom a 30 ans."), ("I'm home.", "Je suis chez moi.")] * 50
    n = noise.PairNoise(noise.NoiseConfig())
    assert n.pairs(pairs, 3) == n.pairs(pairs, 3) != n.pairs(pairs, 4)


# ---- the evaluation -----------------------------------------------------------------------

def test_robustness_sets_are_seeded_and_pass_through_spans_are_in_the_sources():
    english = ["Tom is here.", "Give it to Mary.", "I have three cats.", "Go.", "Where is the station?"] * 4
    refs = [["Tom est là."], ["Donne-le à Mary."], ["J'ai trois chats."], ["Va !"], ["Où est la gare ?"]] * 4
    a = {s.name: s for s in robustness.build_sets(english, refs, {"Tom"}, seed=0)}
    b = {s.name: s for s in robustness.build_sets(english, refs, {"Tom"}, seed=0)}
    assert a["pass_through"].sources == b["pass_through"].sources and a["joined"].sources == b["joined"].sources
    pt = a["pass_through"]
    assert len(pt.sources) == 12 and all(sp[0] in s for s, sp in zip(pt.sources, pt.spans))
    assert all(sp[0] in r[0] for r, sp in zip(pt.references, pt.spans))
    assert a["lower_no_punct"].sources[0] == "tom is here" and a["all_caps"].sources[0] == "TOM IS HERE."
    assert all(len(s.split()) <= 3 for s in a["short"].sources)


def test_runaway_detection():
    assert robustness.is_runaway("hello", "bonjour bonjour bonjour bonjour")
    assert robustness.is_runaway("yes", "oui, " * 10)
    assert not robustness.is_runaway("I'm home.", "Je suis chez moi.")


def test_scores_fold_case_and_final_punctuation_only_for_derived_sets():
    s = robustness.RobustSet("lower_no_punct", ["go"], [["Va !"]])
    assert robustness.score_set(s, ["va"])["bleu"] == robustness.score_set(s, ["Va !"])["bleu"]
    clean = robustness.RobustSet("clean", ["Go."], [["Va !"]], normalized=False)
    assert robustness.score_set(clean, ["va"])["chrf"] < robustness.score_set(clean, ["Va !"])["chrf"]


def _loop_cut_by_the_rules(tokens):
    """loop_cut without its shortcut: every rule tried on every row."""
    import numpy as np

    from toolkit.core.decoding import LOOP_RULES

    rows, t = tokens.shape
    cut = np.full(rows, -1, dtype=np.int64)
    for n, reps in LOOP_RULES:
        for row in range(rows):
            if t >= n * reps and cut[row] < 0 and all((tokens[row, t - (k + 1) * n : t - k * n] == tokens[row, t - n :]).all()
                                                      for k in range(reps)):
                start = t - n * reps
                while start >= n and (tokens[row, start - n : start] == tokens[row, t - n :]).all():
                    start -= n
                cut[row] = start + n
    return cut


@pytest.mark.parametrize("seed", range(30))
def test_loop_cut_shortcut_finds_every_loop_the_rules_find(seed):
    import numpy as np

    from toolkit.core.decoding import loop_cut

    rng = np.random.default_rng(seed)
    for t in range(0, 14):
        tokens = rng.integers(4, 4 + int(rng.integers(1, 4)), size=(int(rng.integers(1, 9)), t))
        assert loop_cut(tokens).tolist() == _loop_cut_by_the_rules(tokens).tolist()
