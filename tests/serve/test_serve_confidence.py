"""tk serve answers each translation's confidence (toolkit.core.confidence): `confidences` beside `scores` on
/v1/translate, and tk's extension field `confidence` on LibreTranslate's /translate (a list for a list q), the same
numbers the Python API gives. Loopback only."""

from __future__ import annotations

from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed: pip install -e '.[serve]'")
from helpers import Scripted  # noqa: E402
from test_serve import config, running, wait_ready  # noqa: E402

from toolkit.core import confidence as conf  # noqa: E402
from toolkit.core.batching import DecodeOptions  # noqa: E402
from toolkit.deploy.translate import TranslationModel, open_model, translate_batch  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"
TEXTS = ["I'm home.", "Where is the station?", "I am at home now. Where is the train station?", ""]


@pytest.fixture(scope="module")
def model():
    return open_model(SHIPPED, "cpu", "fp32")


def api(model, texts: list[str], beam: int = 1, n_best: int = 1):
    return translate_batch(model, texts, DecodeOptions.for_manifest(model.manifest, beam=beam, n_best=n_best, batch_size=1))


def test_v1_translate_answers_each_text_s_confidence(model):
    want = api(model, TEXTS)
    with running(lambda: model, config()) as client:
        wait_ready(client)
        r = client.post("/v1/translate", json={"text": TEXTS})
        assert r.status_code == 200, r.text
        assert r.json()["confidences"] == [round(n[0].confidence, 4) for n in want]
        assert all(0.0 <= c <= 1.0 for c in r.json()["confidences"])

        r = client.post("/v1/translate", json={"text": TEXTS[:2], "beam": 3, "n_best": 3})
        assert r.status_code == 200, r.text
        nbest = api(model, TEXTS[:2], beam=3, n_best=3)
        assert [[h["confidence"] for h in n] for n in r.json()["n_best"]] == [[round(h.confidence, 4) for h in n] for n in nbest]


def test_libretranslate_translate_answers_confidence_as_q_is_given(model):
    want = api(model, TEXTS[:3])
    with running(lambda: model, config()) as client:
        wait_ready(client)
        listed = client.post("/translate", json={"q": TEXTS[:3], "source": "en", "target": "fr"})
        one = client.post("/translate", data={"q": TEXTS[0], "source": "en", "target": "fr"})
        html = client.post("/translate", json={"q": ["<p>I'm <b>home</b>.</p>", "<br>"], "source": "en", "target": "fr", "format": "html"})
        assert listed.status_code == one.status_code == html.status_code == 200, listed.text + one.text + html.text
        assert listed.json()["confidence"] == [round(n[0].confidence, 4) for n in want]
        assert one.json()["confidence"] == round(want[0][0].confidence, 4)
        confidences = html.json()["confidence"]
        assert len(confidences) == 2 and 0.0 <= confidences[0] <= 1.0 and confidences[1] == 1.0  # no text: nothing to check


def test_a_runaway_the_server_cuts_comes_with_a_low_confidence(model):
    tokenizer = model.tokenizer
    looping = TranslationModel(model.manifest, tokenizer, lambda: Scripted(tokenizer.encode(["bonjour"])[0] * 12, tokenizer.vocab_size),
                               "cpu", 0.0)
    with running(lambda: looping, config()) as client:
        wait_ready(client)
        r = client.post("/v1/translate", json={"text": ["The cat sleeps on the mat."]})
        lt = client.post("/translate", json={"q": "The cat sleeps on the mat.", "source": "en", "target": "fr"})
    assert r.status_code == lt.status_code == 200, r.text + lt.text
    assert r.json()["confidences"][0] <= conf.GUARDED_MAX
    assert lt.json()["confidence"] <= conf.GUARDED_MAX
