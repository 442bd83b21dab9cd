"""Glossaries on an imported model (one not trained on tk's placeholders): the targets are forced in by constrained
decoding alone, and a sentence whose targets could not be put in is reported (a warning naming it, its confidence 0),
never given as if it held them. The model is tk's shipped Transformer written out as a MarianMTModel (`tk export
--to-hf`) and imported back (`tk export hf:DIR`): a trained import, built without a download.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
from hf_seq2seq_fixture import exported_import
from test_glossary import SHIPPED, TERMS, WITH_TERMS, WITHOUT_TERMS, occurrences

from toolkit.core import confidence as conf
from toolkit.core import constrained, glossary
from toolkit.core.errors import UsageError
from toolkit.deploy.api import TextFailedWarning, Translator

pytestmark = pytest.mark.slow  # the import is built once per run (about 25 s)


def _to_hf(path: Path) -> None:
    from click.testing import CliRunner

    from toolkit.cli import main

    result = CliRunner().invoke(main, ["export", str(SHIPPED), "--to-hf", str(path)])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Translator:
    _, model = exported_import(tmp_path_factory, "shipped-as-marian", _to_hf)
    translator = Translator(model, provider="cpu", threads=1)
    assert not translator.manifest.declared().placeholders
    return translator


def translate(translator: Translator, texts: list[str], **options) -> tuple[list, set[int]]:
    """Each text's best translation, and the indices of the texts reported for lacking their targets."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        out = [n[0] for n in translator.translate_batch(texts, **options)]
    reported = {int(str(w.message).split("]")[0].removeprefix("texts[")) for w in said if w.category is TextFailedWarning}
    return out, reported


@pytest.mark.parametrize("beam", [1, 4])
def test_each_term_comes_out_once_per_occurrence_or_the_sentence_is_reported(imported, beam):
    out, reported = translate(imported, WITH_TERMS, beam=beam, glossary=TERMS)
    for i, (text, h) in enumerate(zip(WITH_TERMS, out)):
        held = all(glossary.count(h.text, target) == n for target, n in occurrences(text).items())
        assert held != (i in reported), (text, h.text, reported)
        assert (h.confidence == conf.FAILED) == (i in reported)
    # The model alone writes none of the targets (maison, vélo): these come from the forcing.
    assert len(reported) <= 1, reported
    assert out[0].text == "La demeure est grande." and out[3].text.endswith("une bicyclette.")


@pytest.mark.filterwarnings("ignore::toolkit.deploy.api.TextFailedWarning")
@pytest.mark.parametrize("beam", [1, 4])
def test_sentences_without_terms_are_byte_identical_and_a_sentence_is_the_same_alone_or_batched(imported, beam):
    mixed = [x for pair in zip(WITHOUT_TERMS, WITH_TERMS) for x in pair]
    with_glossary = imported.translate(mixed, beam=beam, glossary=TERMS)
    assert with_glossary[0::2] == imported.translate(WITHOUT_TERMS, beam=beam)
    assert [imported.translate([x], beam=beam, glossary=TERMS)[0] for x in mixed] == with_glossary


@pytest.mark.parametrize(("text", "terms", "word", "target"), [
    ("She was wearing a strange hat.", {"hat": "bonnet"}, "chapeau", "bonnet"),
    ("Some of the money was stolen.", {"money": "fric"}, "de l'argent", "du fric")])  # the elided article comes back whole
def test_a_target_the_search_would_add_beside_the_models_own_word_takes_that_words_place(imported, text, terms, word, target):
    """Constrained decoding alone adds the target beside the model's own word for the term ("Elle portait un chapeau
    étrange bonnet."), refused as tacked on, which left the sentence reported without its target; the model's own
    translation with that word swapped for the target is used instead, the article before it in the form the model
    scores best before the target (constrained.agreeing: this small model writes "une bonnet")."""
    own = imported.translate([text])[0]
    out, reported = translate(imported, [text], glossary=terms)

    def article_aside(sentence: str) -> str:
        return re.sub(rf"\S+ {target}", target, sentence)

    assert word in own and article_aside(out[0].text) == article_aside(own.replace(word, target)) and not reported


def test_a_sentence_whose_targets_cannot_be_forced_in_is_reported_never_passed_off(imported, monkeypatch):
    """No placeholder form to fall back on: the model's own translation, a warning naming the text, confidence 0."""
    own = imported.translate(WITH_TERMS)
    monkeypatch.setattr(constrained, "constrained_searches", lambda backend, tokenizer, items, *a, **k: [[] for _ in items])
    monkeypatch.setattr(constrained, "term_swaps", lambda *a, **k: [])
    out, reported = translate(imported, WITH_TERMS, glossary=TERMS)
    assert [h.text for h in out] == own
    assert reported == set(range(len(WITH_TERMS)))
    assert all(h.confidence == conf.FAILED for h in out)


def test_a_runtime_without_tks_decoding_loop_refuses_the_glossary_in_one_line(imported, monkeypatch):
    monkeypatch.setattr(constrained, "can_constrain", lambda backend, rules: False)
    with pytest.raises(UsageError, match="own decoding loop"):
        imported.translate(["The house is big."], glossary=TERMS)
    assert imported.translate(["Where is the station?"], glossary=TERMS) == imported.translate(["Where is the station?"])


def test_a_target_term_is_forced_as_the_target_vocabularys_ids_without_an_end_token(imported):
    """An import's tokenizer ends each source with its end token, and a Marian model may have a target vocabulary of
    its own (tc-big's): a term forced in is the target side's pieces, with no end token inside it."""
    from toolkit.core.tokenizers import MarianTokenizer

    tok = imported.loaded.tokenizer
    ids = tok.target_ids(["demeure"])[0]
    assert ids and tok.end not in ids and tok.decode([ids]) == ["demeure"]
    shifted = MarianTokenizer(tok.source, tok.target, tok.vocab, {p: i + 7 for p, i in tok.vocab.items()}, tok.unk, tok.end, tok.pad)
    assert shifted.target_ids(["demeure"]) == [[i + 7 for i in ids]]
