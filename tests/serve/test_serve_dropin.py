"""Issue 50, tk serve as a drop-in translation service: several models routed by language pair, LibreTranslate's API
(driven with LibreTranslate's own Python client, libretranslatepy), the corpus-pipeline contract (NeMo Curator's
{"texts", "src_lang", "tgt_lang"} -> {"translations"}) on the same path, format html, and the page's pair picker.
Two models: the shipped Transformer as en-fr and the shipped GRU model registered as en-de (it translates into French too,
but differently), so an answer from the wrong model shows.
Every answer is compared with the Python API's for the same input and options. Loopback only."""

from __future__ import annotations

import json
import threading
import urllib.error
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed: pip install -e '.[serve]'")
from deploy.test_markup import skeleton  # noqa: E402
from libretranslatepy import LibreTranslateAPI  # noqa: E402
from test_serve import CHROMIUM, LONG_WAIT, REPO, config, metric, running, until, wait_ready  # noqa: E402

from toolkit.serve.app import ModelSpec  # noqa: E402

TEXTS = ["I'm home.", "Where is the station?", "Tell me. I gave up.", "The cat is sleeping on the sofa."]


def two_models(french, german, **limits):
    specs = [ModelSpec(lambda: french[0], (("en", "fr"),), "tiny"), ModelSpec(lambda: german[0], (("en", "de"),), "random")]
    return running(specs, config(**limits))


def test_libretranslate_s_client_gets_the_api_s_text_from_the_right_model(french, german):
    assert french[1].translate(TEXTS) != german[1].translate(TEXTS)  # the two models tell themselves apart
    with two_models(french, german) as client:
        wait_ready(client)
        lt = LibreTranslateAPI(str(client.base_url))
        for text in TEXTS:
            assert lt.translate(text, "en", "fr") == french[1].translate([text])[0]
            assert lt.translate(text, "en", "de") == german[1].translate([text])[0]
        assert lt.languages() == [{"code": "en", "name": "English", "targets": ["de", "fr"]},
                                  {"code": "fr", "name": "French", "targets": []}, {"code": "de", "name": "German", "targets": []}]
        with pytest.raises(urllib.error.HTTPError) as refused:
            lt.translate("Hi.", "en", "es")
        assert refused.value.code == 400 and "served pairs: en-fr, en-de" in json.loads(refused.value.read())["error"]
        # Every served language is detected; "Hi." is too short to tell them apart, and a tie goes to a source.
        assert lt.detect("Hi.")[0]["language"] == "en" and {d["language"] for d in lt.detect("Hi.")} == {"en", "fr", "de"}
        assert lt.detect("Le chat dort sur le canapé.")[0]["language"] == "fr"


def test_libretranslate_json_lists_alternatives_html_and_errors(french, german):
    with two_models(french, german) as client:
        wait_ready(client)
        r = client.post("/translate", json={"q": TEXTS, "source": "en", "target": "fr", "alternatives": 2, "api_key": "ignored"})
        assert r.status_code == 200, r.text
        nbest = french[1].translate_batch(TEXTS, beam=3, n_best=3)
        assert r.json()["translatedText"] == [n[0].text for n in nbest]
        assert r.json()["alternatives"] == [list(dict.fromkeys(h.text for h in n[1:] if h.text != n[0].text)) for n in nbest]
        one = client.post("/translate", json={"q": TEXTS[0], "source": "en", "target": "de"}).json()
        assert one.pop("confidence") == round(german[1].translate_batch(TEXTS[:1])[0][0].confidence, 4)  # tk's extension field
        assert one == {"translatedText": german[1].translate(TEXTS[:1])[0]}

        fragment = "<p>I'm <b>home</b>.</p>"
        r = client.post("/translate", json={"q": fragment, "source": "en", "target": "fr", "format": "html"})
        assert r.status_code == 200, r.text
        assert r.json()["translatedText"] == french[1].translate([fragment], format="html")[0]
        assert skeleton(r.json()["translatedText"]) == skeleton(fragment)

        cases = [
            ({"source": "en", "target": "fr"}, "missing q"),
            ({"q": "Hi.", "target": "fr"}, "missing source"),
            ({"q": "Hi.", "source": "auto", "target": "es"}, "es is not a target served here"),
            ({"q": "Hi.", "source": "en", "target": "fr", "format": "markdown"}, "markdown format"),
            ({"q": "Hi.", "source": "en", "target": "fr", "alternatives": "many"}, "alternatives"),
            ({"q": ["Hi.", 3], "source": "en", "target": "fr"}, "list of strings"),
            ({"q": ["Hi."] * 65, "source": "en", "target": "fr"}, "65 texts"),
            ({"texts": "Hi.", "src_lang": "en", "tgt_lang": "fr"}, "texts must be a list"),
            ({"texts": ["Hi."], "src_lang": "fr", "tgt_lang": "en"}, "served pairs"),
        ]
        for body, words in cases:
            r = client.post("/translate", json=body)
            assert r.status_code == 400, (body, r.text)
            assert words in r.json()["error"] and "\n" not in r.json()["error"]
        assert "code" in client.get("/frontend/settings").json()["language"]["source"]
        # The existing API routes by pair too, and keeps its own answer.
        r = client.post("/v1/translate", json={"text": TEXTS, "source": "en", "target": "de"})
        assert r.json()["translations"] == german[1].translate(TEXTS)


def test_the_corpus_contract_holds_under_64_concurrent_clients_on_mixed_pairs(french, german):
    pairs = {"fr": french[1], "de": german[1]}
    with two_models(french, german) as client:
        wait_ready(client)
        single = {(target, text): client.post("/translate", json={"texts": [text], "src_lang": "en", "tgt_lang": target}).json()
                  ["translations"][0] for target in pairs for text in TEXTS}
        assert single == {(target, text): pairs[target].translate([text])[0] for target in pairs for text in TEXTS}
        assert client.post("/translate", json={"texts": [], "src_lang": "en", "tgt_lang": "fr"}).json() == {"translations": []}

        def call(k: int) -> tuple[int, list[str], list[str]]:
            target = "fr" if k % 2 else "de"
            texts = [TEXTS[(k + j) % len(TEXTS)] for j in range(1 + k % 3)]
            if k % 4 < 2:  # the corpus contract and LibreTranslate's, interleaved
                r = client.post("/translate", json={"texts": texts, "src_lang": "en", "tgt_lang": target})
                got = r.json().get("translations") if r.status_code == 200 else r.text
            else:
                r = client.post("/translate", json={"q": texts, "source": "en", "target": target})
                got = r.json().get("translatedText") if r.status_code == 200 else r.text
            return r.status_code, got, [single[(target, t)] for t in texts]

        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(call, range(64)))
        assert [status for status, _, _ in answers] == [200] * 64
        for _, got, expected in answers:
            assert got == expected


@pytest.mark.slow
def test_a_full_queue_answers_503_with_retry_after_on_the_drop_in_path(french, german):
    # A short request timeout: the held request gives up (504) soon after the check, and the test ends.
    with two_models(french, german, queue_size=2, max_delay_s=LONG_WAIT, timeout_s=3.0) as client:
        wait_ready(client)
        with ThreadPoolExecutor(2) as pool:
            # Two texts fill the en-fr queue and wait there (a batch leaves only when full).
            held = pool.submit(client.post, "/translate", json={"texts": TEXTS[:2], "src_lang": "en", "tgt_lang": "fr"})
            until(lambda: metric(client, "tk_queue_depth") == 2)
            busy = client.post("/translate", json={"q": "Hi.", "source": "en", "target": "fr"})
            assert busy.status_code == 503 and busy.headers["Retry-After"] == "1" and "busy" in busy.json()["error"]
            # The other model has a queue of its own, which takes it.
            other = pool.submit(client.post, "/translate", json={"q": "Hi.", "source": "en", "target": "de"})
            until(lambda: metric(client, "tk_queue_depth") == 3)
            assert held.result().status_code == other.result().status_code == 504


def test_one_model_s_load_holds_no_other_back_and_ready_waits_for_all(french, german):
    release = threading.Event()

    def slow():
        release.wait(60)
        return german[0]

    specs = [ModelSpec(lambda: french[0], (("en", "fr"),), "tiny"), ModelSpec(slow, (("en", "de"),), "random")]
    with running(specs, config()) as client:
        for _ in range(3000):
            if client.post("/translate", json={"q": "Hi.", "source": "en", "target": "fr"}).status_code == 200:
                break
            threading.Event().wait(0.01)
        ready = client.get("/ready")
        assert ready.status_code == 503 and "random: the model is still loading" in ready.json()["error"]
        assert client.post("/translate", json={"q": "Hi.", "source": "en", "target": "de"}).status_code == 503
        release.set()
        wait_ready(client)
        assert client.get("/ready").json()["pairs"] == ["en-fr", "en-de"]


def test_tk_serve_takes_a_pair_per_directory_and_refuses_two_models_for_one(cli):
    from toolkit.serve.languages import split_argument

    assert split_argument("models/a:b:en-pt-BR") == ("models/a:b", ("en", "pt-BR"))
    assert split_argument("models/a:b") == ("models/a:b", None)
    shipped = REPO / "exported" / "transformer"
    r = cli("serve", shipped, f"{shipped}:en-fr")
    assert r.exit_code == 2 and "both translate en-fr" in r.output and "Traceback" not in r.output


@pytest.fixture()
def page_server(french, german):
    with two_models(french, german) as client:
        wait_ready(client)
        yield client


def test_the_page_translates_with_the_chosen_pair(page_server, german):
    from playwright.sync_api import sync_playwright

    assert CHROMIUM, "the page test needs Chromium: apt-get install -y chromium (.ci/run installs it)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(str(page_server.base_url))
            page.wait_for_function("document.getElementById('pair').options.length === 2")
            page.select_option("#pair", "en|de")
            assert page.inner_text("#title") == "English \u2192 German"
            page.fill("#input", "\n".join(TEXTS[:2]))
            page.click("#translate")
            page.wait_for_function("document.getElementById('status').textContent.includes(' ms')")
            assert page.inner_text("#output").splitlines() == german[1].translate(TEXTS[:2])
        finally:
            browser.close()
