"""Glossaries: a company's terms come out as the company writes them (toolkit.core.glossary).

What a user relies on: each occurrence of a source term (whatever its case, as a whole word, several words, the longest
of overlapping terms, never inside a URL or a number) gives its target term exactly once, spelled as given; a sentence
without any term is translated byte for byte as without the glossary, alone or in a batch; a bad glossary file is one
line naming its line. The model is the shipped Transformer, whose own word for "house" is "maison" and for "bicycle"
"vélo": a glossary asking for "demeure" and "bicyclette" shows in the output only through the glossary.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import one_line_error

from toolkit.core import constrained, glossary, placeholders, textprep
from toolkit.core.errors import DataError, UsageError
from toolkit.core.tokenizers import open_tokenizer
from toolkit.deploy.api import Translator
from toolkit.deploy.translate import segment_lines

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"
TERMS = {"house": "demeure", "bicycle": "bicyclette", "Main Street": "rue Principale"}
WITH_TERMS = ["The house is big.", "HOUSE prices went up.", "This house is bigger than that house.",
              "He is not too poor to buy a bicycle.", "The house at 42 Main Street is for sale."]
WITHOUT_TERMS = ["Where is the station?", "I have 3 houses.", "Visit https://house.example.com today.", "I'm home.",
                 "She doesn't like cold coffee."]


@pytest.fixture(scope="module")
def translator() -> Translator:
    return Translator(SHIPPED, provider="cpu", threads=1)


def occurrences(text: str) -> dict[str, int]:
    """How often each target of TERMS must come out for `text`: its source term's whole-word occurrences, any case."""
    found = glossary.from_mapping(TERMS).find(textprep.clean(text), placeholders.all_spans(textprep.clean(text)))
    return {target: sum(f[2] == target for f in found) for target in TERMS.values()}


# ---- finding terms ------------------------------------------------------------------------

def found(terms: dict[str, str], text: str) -> list[tuple[str, str]]:
    g = glossary.from_mapping(terms)
    return [(text[s:e], target) for s, e, target, _ in g.find(text, placeholders.all_spans(text))]


@pytest.mark.parametrize("text, expected", [
    ("The House, the HOUSE and the house.", [("House", "demeure"), ("HOUSE", "demeure"), ("house", "demeure")]),  # any case
    ("Houses, a greenhouse, house-proud, my house's roof.", [("house", "demeure"), ("house", "demeure")]),  # whole words only
    ("Turn left at main  street.", [("main  street", "rue Principale")]),  # several words, any spacing
    ("Call 555 0199 or visit https://house.example.com/house.", []),  # a term inside a URL is the URL's
])
def test_terms_are_found_whatever_their_case_as_whole_words_and_never_inside_a_url(text, expected):
    assert found({"house": "demeure", "Main Street": "rue Principale"}, text) == expected


def test_of_overlapping_terms_the_longest_is_taken_and_a_number_inside_a_term_is_the_terms():
    terms = {"New York": "NY", "York Times": "Le York Times", "New York Times": "le New York Times", "Windows 10": "Windows 10"}
    assert found(terms, "I read the New York Times in New York.") == [("New York Times", "le New York Times"), ("New York", "NY")]
    assert found(terms, "Windows 10 runs on 10 machines.") == [("Windows 10", "Windows 10")]
    protected, spans, _ = placeholders.protect_terms("Windows 10 runs on 10 machines.", (), glossary.from_mapping(terms))
    assert protected == "⦅0⦆ runs on ⦅1⦆ machines." and spans == ["Windows 10", "10"]


def test_a_line_without_terms_is_prepared_exactly_as_without_the_glossary():
    g = glossary.from_mapping(TERMS)
    for line in WITHOUT_TERMS:
        assert textprep.prepare(line, glossary=g) == textprep.prepare(line)


@pytest.mark.parametrize(("text", "protect", "without"), [
    ("The car on Main Street is red.", True, "The on is red."), ("My Car Is Red.", True, "my is red."),  # folded as the model reads it
    ("I have 3 cars and a car.", True, "I have ⦅0⦆ cars and a ."),  # a number's placeholder stays
    ("The car at 42 Main Street is red.", False, "The at 42 is red.")])  # an import's sentence, as it is
def test_a_sentence_holding_terms_also_has_its_text_without_them(text, protect, without):
    """What the model says without the terms tells which of its words translate them (constrained.term_swaps)."""
    g = glossary.from_mapping({"car": "automobile", "Main Street": "rue Principale"})
    [segment] = textprep.prepare(text, glossary=g, protect=protect)
    assert segment.forced.without_terms == without


def test_a_glossary_of_ten_thousand_terms_finds_each_term_and_loads_in_one_pass(tmp_path):
    entries = {f"term{k} word{k}": f"cible{k}" for k in range(10_000)}
    path = tmp_path / "big.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in entries.items()), encoding="utf-8")
    g = glossary.load(path)
    assert len(g) == 10_000
    text = "Compare TERM7 word7 with term9999   word9999, not term7 word8."
    assert [(text[s:e], t) for s, e, t, _ in g.find(text)] == [("TERM7 word7", "cible7"), ("term9999   word9999", "cible9999")]
    # Matching walks the line's words over a trie, so a line costs the same whatever the glossary's size: measured by
    # docs/measurements/glossary/measure.py (43 us a sentence with 10,000 terms), not timed here.


# ---- bad glossaries -----------------------------------------------------------------------

@pytest.mark.parametrize("content, words", [
    (b"house\tdemeure\nbicycle bicyclette\n", "line 2 has no TAB"),
    (b"house\tdemeure\n\t\tx\n", "line 2 has 2 TABs"),
    (b"house\tdemeure\ncar\t \n", "line 2: its target term is empty"),
    (b"\tdemeure\n", "line 1: its source term is empty"),
    (b"house\tdemeure\n\nHouse\tmaison\n", "line 3: its source term 'House' is the term 'house' of line 1"),
    (b"house\tdemeure\ncaf\xe9\tcaf\xe9\n", "line 2 is not valid UTF-8"),
    (b"\n\n", "has no terms"),
    # tk's placeholder symbols: a target holding one was read back as a span ("Mon ⦅1⦆ demeure a des chambres 3").
    ("house\tdemeure\nhouse boat\t⦅1⦆ péniche\n".encode(), "line 2: its target term holds ⦅, which tk keeps for the spans it copies"),
    ("⦆0\tx\n".encode(), "line 1: its source term holds ⦆"),
])
def test_a_bad_glossary_file_is_one_line_naming_its_line(cli, tmp_path, content, words):
    path = tmp_path / "terms.tsv"
    path.write_bytes(content)
    with pytest.raises(DataError, match=words):
        glossary.load(path)
    error = one_line_error(cli("translate", "--model", SHIPPED, "--glossary", path, "Hello."), 2)
    assert words in error and str(path) in error


def test_a_glossary_file_too_large_is_refused_before_it_is_read(cli, tmp_path, monkeypatch):
    path = tmp_path / "huge.tsv"
    path.write_bytes(b"house\tdemeure\n" * 100)
    monkeypatch.setattr(glossary, "MAX_FILE_BYTES", 1000)
    assert "has 1,400 bytes, more than the 1,000 tk reads" in one_line_error(cli("translate", "--model", SHIPPED, "--glossary", path, "Hi."), 2)
    assert "cannot read glossary" in one_line_error(cli("translate", "--model", SHIPPED, "--glossary", tmp_path / "no.tsv", "Hi."), 2)


def test_a_duplicate_term_with_the_same_target_is_one_entry_and_a_case_variant_with_another_is_refused():
    assert len(glossary.parse(b"house\tdemeure\nHouse\tdemeure\n", "t.tsv")) == 1
    with pytest.raises(UsageError, match="terms match whatever their case"):
        glossary.from_mapping({"house": "demeure", "HOUSE": "maison"})
    with pytest.raises(UsageError, match="must be a dict"):
        glossary.from_mapping(["house", "demeure"])


def test_a_model_forcing_its_first_token_or_raw_text_refuses_a_glossary_rather_than_drop_it():
    """An import that forces a first token (a target language) gets no constrained search, and no placeholders."""
    g = glossary.from_mapping(TERMS)
    imported = SimpleNamespace(model="m2m100", declared=lambda: SimpleNamespace(placeholders=False),
                               rules=lambda: SimpleNamespace(forced_first=7))
    with pytest.raises(UsageError, match="forced first token"):
        segment_lines(imported, ["The house."], textprep.TextOptions(glossary=g))
    tk_model = SimpleNamespace(model="transformer", declared=lambda: SimpleNamespace(placeholders=True))
    with pytest.raises(UsageError, match="drop --raw"):
        segment_lines(tk_model, ["The house."], textprep.TextOptions(glossary=g, enabled=False))


# ---- translating with the shipped model ---------------------------------------------------

def test_the_model_alone_never_writes_the_glossarys_targets(translator):
    """What makes the tests below fail without a glossary: the shipped model's own words are others."""
    own = " ".join(translator.translate(WITH_TERMS))
    assert all(glossary.count(own, target) == 0 for target in TERMS.values())


@pytest.mark.parametrize("beam", [1, 4])
def test_each_term_comes_out_as_its_target_exactly_once_per_occurrence(translator, beam):
    for text, out in zip(WITH_TERMS, translator.translate(WITH_TERMS, beam=beam, glossary=TERMS)):
        for target, n in occurrences(text).items():
            assert glossary.count(out, target) == n, (text, out)


def test_placeholders_put_each_target_back_exactly_once_where_constrained_decoding_is_not_used(translator, monkeypatch):
    """The runtimes without tk's own loop (CTranslate2), and every sentence whose constrained translation failed its
    checks, get the targets through placeholders: the same guarantee."""
    monkeypatch.setattr(constrained, "can_constrain", lambda backend, rules: False)
    for text, out in zip(WITH_TERMS, translator.translate(WITH_TERMS, glossary=TERMS)):
        for target, n in occurrences(text).items():
            assert glossary.count(out, target) == n, (text, out)


def test_the_words_around_a_term_agree_with_it(translator):
    """Constrained decoding lets the model write the article for the target ("une bicyclette"); a placeholder in the
    term's place left it the article of its own word ("un vélo" -> "un bicyclette")."""
    assert translator.translate(["He is not too poor to buy a bicycle."])[0].endswith("un vélo.")
    out = translator.translate(["He is not too poor to buy a bicycle."], glossary={"bicycle": "bicyclette"})[0]
    assert out.endswith("une bicyclette.")


@pytest.mark.parametrize("text", ["I know where the money is.", "Tom has never asked me for money.", "She argued with him about money."])
def test_a_target_that_takes_no_elision_never_follows_an_elided_article(translator, text):
    """The model writes "l'argent" or "d'argent"; the search used to put "fric" after the elided article ("Je sais où est
    l' fric."). After an apostrophe only a target's glued form may begin, and only a target that takes elision has one."""
    out = translator.translate([text], glossary={"money": "fric"})[0]
    assert glossary.count(out, "fric") == 1 and not re.search(r"['’] ?fric", out), out
    tokenizer, end = open_tokenizer(translator.manifest), translator.manifest.rules().end
    assert [len(constrained.term_forms(tokenizer, t, end)) for t in ("fric", "automobile", "hôtel")] == [1, 2, 2]


@pytest.mark.parametrize(("text", "terms", "written"), [
    ("I know where the money is.", {"money": "fric"}, "est le fric."),  # l'argent
    ("Tom has more money than he needs.", {"money": "fric"}, "plus de fric"),  # d'argent
    ("Tom has already gone to school.", {"school": "lycée"}, "allé au lycée."),  # à l'école
    ("Have you ever given money to a beggar?", {"money": "fric"}, "donné du fric"),  # de l'argent
    ("Tom noticed Mary's mistake.", {"mistake": "faute"}, "la faute de Mary"),  # l'erreur
])
def test_a_swapped_in_target_that_takes_no_elision_gets_the_elided_word_back_whole(translator, text, terms, written):
    """Where the model's own word came with an elided article or preposition ("l'argent") and is swapped for a target
    that takes no elision, the article comes back whole, in the gender the model scores best, contracted as French
    writes it ("au lycée"); it used to be dropped with the word ("Je sais où est fric.", "allé à lycée")."""
    out = translator.translate([text], glossary=terms)[0]
    assert written in out, out


def test_a_word_that_elides_before_a_target_that_takes_elision_is_written_elided(translator):
    """The search writes the article before it knows the target follows: "Prendras-tu le emploi ?". Before a target
    beginning with a vowel only the article's elided form may stand (constrained.agreeing)."""
    out = translator.translate(["Will you take the job?"], glossary={"job": "emploi"})[0]
    assert "l'emploi" in out and "le emploi" not in out, out


# Articles and determiners written only before a consonant (French): none may stand right before "automobile".
BEFORE_A_CONSONANT = re.compile(r"(?<![\w'’])(le|la|ma|ta|sa|ce|de|que)\s+automobile", re.I)


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("text", ["I didn't see your car outside.", "My car was stolen last night.",
                                  "They told me to stay in the car.", "The car is old, but in good condition."])
def test_the_article_before_a_target_is_one_that_may_stand_before_it(translator, text, beam):
    """The model's own word was "voiture", and its article stayed when the target took its place, by the search or the
    swap: "ta automobile", "Ma automobile", "la automobile". The article is now written in each form of its kind that
    may stand before the target (ton, mon, l') and the model's score picks."""
    out = translator.translate([text], glossary={"car": "automobile"}, beam=beam)[0]
    assert glossary.count(out, "automobile") == 1 and not BEFORE_A_CONSONANT.search(out), out


@pytest.mark.parametrize(("written", "target", "ways"), [
    ("Je n'ai pas vu ta automobile dehors.", "automobile", ["Je n'ai pas vu ton automobile dehors."]),  # "ta" never before a vowel
    ("Cette lycée est loin.", "lycée", ["Cette lycée est loin.", "Ce lycée est loin."]),  # gender is the model's to know
    ("Il tient au habits.", "habits", ["Il tient au habits.", "Il tient à la habits.", "Il tient aux habits.", "Il tient à l'habits."]),
    ("Tout dépend du météo.", "météo", ["Tout dépend du météo.", "Tout dépend de la météo."]),  # no plural before "météo"
    ("Prendras-tu le emploi ?", "emploi", ["Prendras-tu l'emploi ?"]),
    ("Il a une voiture.", "voiture", ["Il a une voiture.", "Il a un voiture."]),
    ("Il dort dans sa voiture.", "voiture", ["Il dort dans sa voiture.", "Il dort dans son voiture."]),
    ("Il aime la maison.", "maison", ["Il aime la maison.", "Il aime le maison."]),
])
def test_the_ways_of_writing_the_article_before_a_target(translator, written, target, ways):
    """constrained.agreeing: the sentence itself first where its article may stand before the target, then the article in
    each other form of its kind that may (for a vowel or a consonant, both before an h; plural forms only before a
    target ending as a plural does)."""
    tokenizer, end = open_tokenizer(translator.manifest), translator.manifest.rules().end
    tokens = [tok for tok in tokenizer.target_ids([written])[0] if tok != end]
    found = constrained.agreeing(tokenizer, tokens, [constrained.term_forms(tokenizer, target, end)], [target], end)
    assert tokenizer.decode(found) == ways
    assert (found[0] == tokens) == (ways[0] == written)


def test_a_target_the_search_would_add_beside_the_models_own_word_takes_that_words_place(translator):
    """Constrained decoding alone keeps the model's "bruit" and adds the target after it, refused as tacked on, which
    left the sentence to its placeholder ("... accustom seul à l'accompagner vacarme."); the model's own translation with
    its word for "noise" swapped for the target is used instead."""
    text = "It took a long time to accustom myself to the noise."
    own = translator.translate([text])[0]
    assert own == "Il m'a fallu longtemps pour m'accompagner au bruit."
    assert translator.translate([text], glossary={"noise": "vacarme"})[0] == own.replace("bruit", "vacarme")


@pytest.mark.parametrize(("text", "terms", "own_word"), [
    ("Please deposit the money in a bank.", {"money": "fric"}, "argent"),
    ("The child came aboard the plane in a good mood.", {"child": "gamin"}, "enfant"),
    # The search's translation scores better than the swap here, and still says the word twice.
    ("We've got a really big problem here.", {"problem": "souci"}, "problème"),
    ("My car broke down this morning and won't be repaired until Friday.", {"car": "automobile"}, "voiture"),
])
def test_a_target_the_search_puts_in_another_words_place_gives_way_to_the_models_word_swapped(translator, text, terms, own_word):
    """The search's best held the target but in place of another word, beside the model's own word for the term ("S'il
    vous plaît, dépose l'argent dans une banque fric.", "Nous avons un souci ici vraiment grand problème, ici.", "Ma
    voiture ... ne sera automobile jusqu'à vendredi."). The model's own translation with that word swapped passes the
    checks, so it is the translation, whatever the two score: the target where the model's word was."""
    own = translator.translate([text])[0]
    assert own_word in own, own
    out = translator.translate([text], glossary=terms)[0]
    target = next(iter(terms.values()))
    assert glossary.count(out, target) == 1 and own_word not in out, out


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize(("text", "terms", "own_word"), [
    ("I forgot to give you my phone number.", {"phone": "portable"}, "téléphone"),  # "mon numéro de téléphone"
    ("How many times do I have to tell you not to eat candy just before dinner?", {"dinner": "souper"}, "dîner"),
    ("I canceled my hotel reservations and stayed with friends.", {"friends": "amies"}, "amis"),
])
def test_the_models_word_for_a_term_is_never_the_article_before_it(translator, text, terms, own_word, beam):
    """Where the term's word has a gender, the article before it falls with it when the model reads the source without
    the term, at times more: the word found as the model's was "de", "le", "des", and swapping it for the target wrote
    the word twice ("mon numéro portable téléphone", "avant souper dîner", "avec amies amis"). An article is never
    taken for the term's word (constrained.NOT_A_TERMS_WORD)."""
    assert own_word in translator.translate([text], beam=beam)[0]
    out = translator.translate([text], glossary=terms, beam=beam)[0]
    assert glossary.count(out, next(iter(terms.values()))) == 1 and not glossary.count(out, own_word), out


@pytest.mark.parametrize("beam", [1, 4])
def test_a_term_never_follows_a_word_only_written_elided(translator, beam):
    """The search wrote "l" (whose apostrophe the tokenizer writes as a token of its own) and then the target as a word
    of its own: "Veuillez déposer l fric dans une banque." After such a word only a term's glued form may begin."""
    out = translator.translate(["Please deposit the money in a bank."], glossary={"money": "fric", "bank": "banque"}, beam=beam)[0]
    assert not re.search(r"(?<![\w'’])[ld] fric", out) and glossary.count(out, "fric") == 1, out


@pytest.mark.parametrize("beam", [1, 4])
def test_sentences_without_terms_are_byte_identical_with_and_without_the_glossary_alone_or_batched(translator, beam):
    mixed = [x for pair in zip(WITHOUT_TERMS, WITH_TERMS) for x in pair]
    with_glossary = translator.translate(mixed, beam=beam, glossary=TERMS)
    without = translator.translate(WITHOUT_TERMS, beam=beam)
    assert with_glossary[0::2] == without
    assert [translator.translate([x], beam=beam, glossary=TERMS)[0] for x in mixed] == with_glossary


def test_a_line_of_several_sentences_holds_each_target(translator):
    line = "I sold the house. He bought a bicycle for the house."
    out = translator.translate([line], glossary=TERMS)[0]
    assert glossary.count(out, "demeure") == 2 and glossary.count(out, "bicyclette") == 1


def test_a_line_that_is_nothing_but_a_term_is_its_target(translator):
    """A list item or a button label ("House"): the search had forced the target into the tiny model's poor translation
    of a lone word ("Hon demeure chez lui"); the placeholder form gives the target as it is."""
    for text, target in [("House", "demeure"), ("house!", "demeure"), ("Bicycle.", "bicyclette"), ("Main Street", "rue Principale")]:
        out = translator.translate([text], glossary=TERMS)[0]
        assert [w for w in re.findall(r"\w+", out)] == target.split(), (text, out)


def test_a_kept_term_is_copied_verbatim_where_a_glossary_term_has_the_same_words(translator):
    """--keep Apple (the brand) and a glossary's apple -> pomme: the glossary matches any case, the kept term as typed."""
    out = translator.translate(["Apple sells phones. I ate an apple."], keep=["Apple"], glossary={"apple": "pomme"})[0]
    assert glossary.count(out, "Apple") == 1 and glossary.count(out, "pomme") == 1, out


@pytest.mark.parametrize("text, terms", [
    ("The house is big.", {"house": "demeure"}),  # the model's own best lacks the target: the search's n-best, not its best alone
    ("I like my car.", {"car": "voiture"}),  # the model's own best holds it, its third ("J'aime mon véhicule.") does not
])
def test_every_hypothesis_of_the_n_best_holds_the_target_and_the_first_is_the_single_translation(translator, text, terms):
    (target,) = terms.values()
    nbest = translator.translate_batch([text], beam=4, n_best=3, glossary=terms)[0]
    assert 1 < len(nbest) <= 3, nbest
    assert all(glossary.count(h.text, target) == 1 for h in nbest), [h.text for h in nbest]
    assert len({h.text for h in nbest}) == len(nbest)
    assert nbest[0].text == translator.translate([text], beam=4, glossary=terms)[0]
    if target == "voiture":  # what the guarantee guards against: a lower hypothesis of the model's own without the target
        assert any(glossary.count(h.text, target) != 1 for h in translator.translate_batch([text], beam=4, n_best=3)[0])


def test_the_api_refuses_a_glossary_that_is_not_a_dict_of_terms(translator):
    with pytest.raises(UsageError, match="glossary must be a dict"):
        translator.translate(["Hi."], glossary="terms.tsv")
    with pytest.raises(UsageError, match="its target term is empty"):
        translator.translate(["Hi."], glossary={"house": ""})


def test_tk_translate_glossary_file_gives_each_target_once(cli, tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in TERMS.items()), encoding="utf-8")
    result = cli("translate", "--model", SHIPPED, "--provider", "cpu", "-q", "--glossary", path, *WITH_TERMS)
    assert result.exit_code == 0, result.output
    for text, out in zip(WITH_TERMS, result.output.splitlines()):
        for target, n in occurrences(text).items():
            assert glossary.count(out, target) == n, (text, out)
    assert "drop --raw" in one_line_error(cli("translate", "--model", SHIPPED, "--raw", "--glossary", path, "Hi."), 2)


def test_ctranslate2_gives_each_target_once_through_placeholders(tmp_path, cli):
    pytest.importorskip("ctranslate2")
    import shutil

    model = tmp_path / "transformer"
    shutil.copytree(SHIPPED, model)
    assert cli("export", model, "--ctranslate2").exit_code == 0
    ct2 = Translator(model, provider="cpu", runtime="ctranslate2", threads=1)
    for text, out in zip(WITH_TERMS, ct2.translate(WITH_TERMS, glossary=TERMS)):
        for target, n in occurrences(text).items():
            assert glossary.count(out, target) == n, (text, out)


def test_sentences_searched_side_by_side_get_what_each_gets_alone_in_one_decoder_step_a_token(translator):
    """The constrained searches of a call's sentences share each decoder step (their hypotheses are rows of one batch):
    a sentence gets the hypotheses it gets searched alone, whatever the others' lengths, terms and end; and the batch
    takes one decoder run a step, not one per sentence."""
    from toolkit.deploy.translate import FORCED_BEAM

    model = translator.loaded
    backend, rules, tok = model.backend(), model.manifest.rules(), model.tokenizer
    asks = [("The house is big.", ["demeure"]), ("He is not too poor to buy a bicycle, and his house is small.", ["bicyclette", "demeure"]),
            ("Go.", ["demeure"]), ("This house is bigger than that house over there by the old river.", ["demeure", "demeure"])]
    items = [(tok.encode([en])[0], [constrained.term_forms(tok, target, rules.end) for target in targets], 40) for en, targets in asks]
    alpha = rules.alpha
    alone = [constrained.constrained_search(backend, tok, src, terms, limit, FORCED_BEAM, alpha, rules, n_best=2)
             for src, terms, limit in items]
    steps = []
    real = backend.step
    backend.step = lambda token, state: steps.append(len(token)) or real(token, state)
    try:
        together = constrained.constrained_searches(backend, tok, items, FORCED_BEAM, alpha, rules, n_best=2)
    finally:
        backend.step = real
    # The same tokens; the scores as fp32 rows of another batch round them (a padded row's sums run in another order),
    # as in tk's beam search over a batch of sentences.
    assert [[h.tokens for h in hs] for hs in together] == [[h.tokens for h in hs] for hs in alone]
    assert [[h.score for h in hs] for hs in together] == [[pytest.approx(h.score, rel=1e-6) for h in hs] for hs in alone]
    assert all(hs for hs in alone)  # each found its targets: the comparison is of real searches
    assert steps[0] == len(items) and max(steps) > FORCED_BEAM + 1 and len(steps) <= 40, steps
