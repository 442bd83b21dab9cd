"""tk export --web's glossary, in headless Chromium: the page puts a glossary's targets into tk's shipped model's
translations as `Translator.translate(..., glossary=...)` does on ONNX Runtime CPU (the same text for every sentence,
greedy and beam 4, by each of the three ways: the model alone, the targets forced in, placeholders), each target as
often as its term occurs, and a sentence without terms byte for byte as without the glossary; on an import (tk's
Transformer as a Marian) by constrained decoding alone, its page naming the sentences whose targets could not be forced
in, as Python warns of them; a bad glossary line, and a line the page does not handle, are one line in its status.

The glossary is docs/measurements/glossary/bench-terms.tsv (common words to a form other than the model's own: `car`
to `automobile`); the sentences are held-out ones holding its terms."""

from __future__ import annotations

import re
import warnings
from collections import Counter

import pytest
import web_import_fixture
from conftest import REPO
from convert.test_web import CHROMIUM, SHIPPED
from web_import_fixture import directory, page_of, shipped_site, site

from toolkit.core import data, glossary, textprep
from toolkit.core.errors import DataError, UsageError
from toolkit.deploy.api import Translator

browser, pairs = web_import_fixture.browser, web_import_fixture.pairs
pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed: apt-get install -y chromium")]

TERMS_FILE = REPO / "docs" / "measurements" / "glossary" / "bench-terms.tsv"
TERMS = dict(line.split("\t") for line in TERMS_FILE.read_text(encoding="utf-8").splitlines())
TRANSLATE = "([texts, opts]) => tk.translate(texts, opts)"


@pytest.fixture(scope="module")
def sentences(corpus_zip) -> tuple[list[str], list[str]]:
    """24 held-out English sentences holding terms, each one sentence without numbers or capitals (what the page
    handles; textprep's own verdict), and 8 holding none."""
    g = glossary.from_mapping(TERMS)
    english = list(dict.fromkeys(e for e, _ in data.load_corpus(corpus_zip).splits["test"]))

    def handled(text: str) -> bool:
        segments = textprep.prepare(text, glossary=g)
        return len(segments) == 1 and segments[0].forced is not None and not segments[0].case and not segments[0].forced.spans

    return [e for e in english if handled(e)][:24], [e for e in english if not g.find(textprep.clean(e))][:8]


@pytest.fixture(scope="module")
def shipped_page(browser, tmp_path_factory):
    with page_of(browser, shipped_site(tmp_path_factory)) as page:
        page.wait_for_function("!document.getElementById('translate').disabled")
        yield page


def click(page) -> str:
    """The page's status once its Translate button has done its work."""
    page.click("#translate")
    page.wait_for_function("!document.getElementById('status').textContent.startsWith('translating')")
    return page.inner_text("#status")


@pytest.mark.parametrize("beam", [1, 4])
def test_the_page_puts_a_glossary_s_targets_in_as_tk_translate_does(beam, shipped_page, sentences):
    holding, without = sentences
    texts = holding + without
    python = Translator(SHIPPED, provider="cpu", threads=1).translate(texts, beam=beam, glossary=TERMS)
    got = shipped_page.evaluate(TRANSLATE, [texts, {"beam": beam, "glossary": TERMS}])
    wrong = [(t, p, g["text"], g.get("glossary")) for t, p, g in zip(texts, python, got) if p != g["text"]]
    assert not wrong, f"{len(wrong)} of {len(texts)} sentences differ from Python's, e.g. {wrong[:3]}"
    g = glossary.from_mapping(TERMS)
    short = [(t, o["text"]) for t, o in zip(holding, got) if not glossary.holds(o["text"], [f[2] for f in g.find(t)])]
    assert not short, f"targets not each as often as asked: {short}"
    # A sentence without terms: byte for byte (its text and its tokens) as the page gives it without a glossary.
    assert got[len(holding):] == shipped_page.evaluate(TRANSLATE, [without, {"beam": beam}])
    ways = Counter(o["glossary"] for o in got[: len(holding)])
    assert set(ways) == {"model", "forced", "placeholders"}, ways  # each step of the method is held to Python's


def test_an_import_s_page_forces_targets_in_and_names_the_sentences_it_could_not(browser, tmp_path_factory, pairs, sentences):
    holding, _ = sentences
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        python = Translator(directory(tmp_path_factory, pairs, "marian-from-tk"), provider="cpu", threads=1).translate(holding, glossary=TERMS)
    missed = [int(re.search(r"texts\[(\d+)\]", str(w.message)).group(1)) + 1 for w in caught if "could not be forced" in str(w.message)]
    assert missed  # Python reports some: the page must name the same
    with page_of(browser, site(tmp_path_factory, pairs, "marian-from-tk")) as page:
        page.wait_for_function("!document.getElementById('translate').disabled")
        page.fill("#input", "\n".join(holding))
        page.fill("#glossary", TERMS_FILE.read_text(encoding="utf-8"))
        page.select_option("#beam", "1")
        status = click(page)
        output = page.inner_text("#output").split("\n")
        got = page.evaluate(TRANSLATE, [holding, {"glossary": TERMS}])
    assert output == python
    assert [i + 1 for i, o in enumerate(got) if o["glossary"] == "missed"] == missed
    assert {o["glossary"] for o in got} == {"model", "forced", "missed"}
    assert re.fullmatch(rf"\d+ sentences in \d+ ms; warning: line {missed[0]}: its glossary targets \(.*\) could not be forced "
                        rf"into its translation .*without them( \(and {len(missed) - 1} more lines\))?", status), status


BAD = ["house\tdemeure\nbicycle bicyclette\n", "house\tdemeure\tmaison\n", "house\tdemeure\n\nHOUSE\tmaison\n", "house\t \n",
       "ho\x01use\tdemeure\n", "x" * 501 + "\tdemeure\n"]


def test_a_bad_glossary_line_is_one_line_in_the_page_s_status_in_tk_s_words(shipped_page):
    shipped_page.fill("#input", "The house is big.")
    for tsv in BAD:
        with pytest.raises(DataError) as e:
            glossary.parse(tsv.encode(), "terms")
        shipped_page.fill("#glossary", tsv)
        assert click(shipped_page) == f"error: {e.value}", tsv
    with pytest.raises(UsageError) as e:
        glossary.from_mapping({"house": "demeure", "House": "maison"})
    error = "(g) => tk.translate(['The house is big.'], {glossary: g}).then(() => 'no error', (e) => e.message)"
    assert shipped_page.evaluate(error, {"house": "demeure", "House": "maison"}) == str(e.value)
    # A line holding terms that the page does not prepare as Python would is refused, never translated without them.
    shipped_page.fill("#input", "The house has 3 rooms.")
    shipped_page.fill("#glossary", "house\tdemeure")
    assert click(shipped_page) == ("error: line 1 holds glossary terms and a number, URL or e-mail address, which the page "
                                   "does not handle; translate it with tk translate --glossary")
