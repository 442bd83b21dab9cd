"""tk serve's glossaries: a `glossary` object on /v1/translate and on LibreTranslate's /translate (JSON, or a form's JSON
string). Each request's terms come out as its own targets, exactly once per occurrence, even where its sentences share
a decode with another request's under another glossary; its sentences without terms come out as without a glossary.
The shipped Transformer writes "maison" for "house" on its own. Loopback only."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed: pip install -e '.[serve]'")
from test_serve import LONG_WAIT, REPO, config, metric, running, wait_ready  # noqa: E402

from toolkit.core import glossary  # noqa: E402
from toolkit.deploy.api import Translator  # noqa: E402
from toolkit.deploy.translate import open_model  # noqa: E402

SHIPPED = REPO / "exported" / "transformer"
TEXTS = ["The house is big.", "Where is the station?", "This house is bigger than that house.", "I'm home."]
TERMS = {"house": "demeure", "station": "gare routière"}


@pytest.fixture(scope="module")
def shipped():
    return open_model(SHIPPED, "cpu")


@pytest.fixture(scope="module")
def api():
    return Translator(SHIPPED, provider="cpu", variant="fp32")


def test_v1_translate_gives_each_target_once_per_occurrence_as_the_api_does(shipped, api):
    with running(lambda: shipped, config()) as client:
        wait_ready(client)
        plain = client.post("/v1/translate", json={"text": TEXTS}).json()["translations"]
        r = client.post("/v1/translate", json={"text": TEXTS, "glossary": TERMS})
        assert r.status_code == 200, r.text
        got = r.json()["translations"]
    assert "maison" in plain[0] and "demeure" not in " ".join(plain)  # the model's own word is another
    assert [glossary.count(t, "demeure") for t in got] == [1, 0, 2, 0]
    assert [glossary.count(t, "gare routière") for t in got] == [0, 1, 0, 0]
    assert got[3] == plain[3]  # a sentence without terms: as without the glossary
    assert got == api.translate(TEXTS, glossary=TERMS)


def test_requests_with_different_glossaries_share_a_decode_and_each_gets_its_own_targets(shipped):
    """Three one-sentence requests fill one batch (it leaves when full): the same sentence under two glossaries and
    under none. Each request's targets are its own; none leaks into another's."""
    asked = [{"house": "demeure"}, {"house": "logis"}, None]
    with running(lambda: shipped, config(max_sentences=3, max_delay_s=LONG_WAIT)) as client:
        wait_ready(client)
        with ThreadPoolExecutor(3) as pool:
            bodies = list(pool.map(lambda g: {"text": "The house is big.", **({"glossary": g} if g else {})}, asked))
            got = list(pool.map(lambda b: client.post("/v1/translate", json=b).json()["translations"][0], bodies))
        assert metric(client, "tk_batch_sentences_count") == 1 and metric(client, "tk_batch_sentences_sum") == 3
    assert glossary.count(got[0], "demeure") == 1 and "logis" not in got[0]
    assert glossary.count(got[1], "logis") == 1 and "demeure" not in got[1]
    assert "maison" in got[2] and "demeure" not in got[2] and "logis" not in got[2]


def test_a_bad_glossary_is_refused_in_one_line(shipped):
    with running(lambda: shipped, config()) as client:
        wait_ready(client)
        cases = [
            ("/v1/translate", {"text": "Hi.", "glossary": {"house": ""}}, 422, "its target term is empty"),
            ("/v1/translate", {"text": "Hi.", "glossary": {"house": "demeure", "HOUSE": "maison"}}, 422, "whatever their case"),
            ("/v1/translate", {"text": "Hi.", "glossary": ["house", "demeure"]}, 422, "glossary"),
            ("/translate", {"q": "Hi.", "source": "en", "target": "fr", "glossary": "{not json"}, 400, "glossary is not JSON"),
            ("/translate", {"q": "Hi.", "source": "en", "target": "fr", "glossary": ["house"]}, 400, "must be a dict"),
        ]
        for path, body, status, words in cases:
            r = client.post(path, json=body)
            assert r.status_code == status, (body, r.text)
            message = r.json()["error"]
            assert words in message and "\n" not in message and "Traceback" not in message


def test_libretranslate_takes_a_glossary_as_a_json_object_or_a_forms_json_string(shipped, api):
    """And the corpus-pipeline contract on the same path ({"texts", "src_lang", "tgt_lang"}) takes it too."""
    with running(lambda: shipped, config()) as client:
        wait_ready(client)
        by_json = client.post("/translate", json={"q": TEXTS, "source": "en", "target": "fr", "glossary": TERMS}).json()
        by_corpus = client.post("/translate", json={"texts": TEXTS, "src_lang": "en", "tgt_lang": "fr", "glossary": TERMS}).json()
        by_form = client.post("/translate", data={"q": TEXTS[2], "source": "en", "target": "fr", "glossary": json.dumps(TERMS)}).json()
        fragment = "<p>The <b>house</b> is big.</p>"
        html = client.post("/translate", json={"q": fragment, "source": "en", "target": "fr", "format": "html", "glossary": TERMS}).json()
    assert by_json["translatedText"] == by_corpus["translations"] == api.translate(TEXTS, glossary=TERMS)
    assert glossary.count(by_form["translatedText"], "demeure") == 2
    assert html["translatedText"] == api.translate([fragment], format="html", glossary=TERMS)[0]
    assert glossary.count(html["translatedText"], "demeure") == 1
