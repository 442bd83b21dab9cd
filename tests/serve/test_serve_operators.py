"""tk serve as operators run a LibreTranslate replacement: API keys and their limits, language detection and
source "auto", and the LibreTranslate clients people already use (deep-translator sends its fields as a query string,
libretranslate-aio a list as repeated form fields). Loopback only; every answer is compared with the Python API's."""

from __future__ import annotations

import dataclasses
import logging

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed: pip install 'tk-onnx-deploy[serve]'")
from test_serve import REPO, config, running, wait_ready  # noqa: E402

from toolkit.serve.app import ModelSpec  # noqa: E402
from toolkit.serve.keys import parse_keys  # noqa: E402

TEXTS = ["I'm home.", "Where is the station?", "The cat is sleeping on the sofa."]
FRENCH = ["Je suis chez moi.", "Où est la gare ?", "Le chat dort sur le canapé."]
KEYS = "team-a-key-1 3\nbatch-key-22 - 40\n"


def two_sources(french, german, **options):
    """The Transformer serves en-fr; the GRU model is stated as fr-en (it reads anything as English and writes French,
    so only the routing is checked: an answer from the other model shows)."""
    specs = [ModelSpec(lambda: french[0], (("en", "fr"),), "tiny"), ModelSpec(lambda: german[0], (("fr", "en"),), "gru")]
    return running(specs, dataclasses.replace(config(), **options))


def test_source_auto_routes_each_request_to_the_pair_of_its_detected_language(french, german):
    assert french[1].translate(FRENCH) != german[1].translate(FRENCH)
    with two_sources(french, german) as client:
        wait_ready(client)
        r = client.post("/translate", json={"q": FRENCH[2], "source": "auto", "target": "en"})
        assert r.status_code == 200, r.text
        assert r.json()["translatedText"] == german[1].translate([FRENCH[2]])[0]
        assert r.json()["detectedLanguage"]["language"] == "fr" and r.json()["detectedLanguage"]["confidence"] > 90
        r = client.post("/translate", json={"q": TEXTS, "source": "auto", "target": "fr"})
        assert r.json()["translatedText"] == french[1].translate(TEXTS)
        assert [d["language"] for d in r.json()["detectedLanguage"]] == ["en"] * 3
        r = client.post("/v1/translate", json={"text": TEXTS[0], "source": "auto", "target": "fr"})
        assert r.json()["translations"] == french[1].translate(TEXTS[:1]) and r.json()["detected_language"]["language"] == "en"
        # /detect chooses among every served language, best first, in percent
        found = client.post("/detect", data={"q": "Le chat dort sur le canapé depuis ce matin."}).json()
        assert found[0]["language"] == "fr" and found[0]["confidence"] > 50
        assert {d["language"] for d in found} == {"en", "fr"}
        r = client.post("/translate", json={"q": "Hi.", "source": "auto", "target": "de"})
        assert r.status_code == 400 and "de is not a target served here" in r.json()["error"]


def test_a_text_already_in_the_target_language_comes_back_as_it_is_and_detect_ranks_every_served_language(french):
    """An en-fr server given French with source "auto": LibreTranslate gives it back as it is and /detect names French;
    tk used to detect among the sources alone (English, at 100%) and translate French as if it were English."""
    with running([ModelSpec(lambda: french[0], (("en", "fr"),), "tiny")], config()) as client:
        wait_ready(client)
        found = client.post("/detect", data={"q": "Le chat dort sur le canapé depuis ce matin."}).json()
        assert found[0]["language"] == "fr" and found[0]["confidence"] > 90 and {d["language"] for d in found} == {"en", "fr"}
        r = client.post("/translate", json={"q": FRENCH, "source": "auto", "target": "fr", "alternatives": 1})
        assert r.json()["translatedText"] == FRENCH and [d["language"] for d in r.json()["detectedLanguage"]] == ["fr"] * 3
        r = client.post("/v1/translate", json={"text": FRENCH[:1], "source": "auto", "target": "fr"})
        assert r.json()["translations"] == FRENCH[:1] and r.json()["detected_language"]["language"] == "fr"
        upload = {"file": ("lettre.txt", "\n".join(FRENCH).encode(), "text/plain")}
        url = client.post("/translate_file", data={"source": "auto", "target": "fr"}, files=upload).json()["translatedFileUrl"]
        assert client.get(url[url.index("/download_file"):]).text == "\n".join(FRENCH)
        # English is still translated, as from source "en"
        r = client.post("/translate", json={"q": TEXTS, "source": "auto", "target": "fr"})
        assert r.json()["translatedText"] == french[1].translate(TEXTS)


def test_a_key_is_required_read_from_every_place_clients_send_it_and_limited(french, german, caplog):
    caplog.set_level(logging.INFO)
    with two_sources(french, german, api_keys=parse_keys(KEYS)) as client:
        wait_ready(client)
        body = {"q": TEXTS[0], "source": "en", "target": "fr"}
        keyless = [client.post("/translate", json=body), client.post("/v1/translate", json={"text": "Hi."}),
                   client.post("/detect", data={"q": "Hi."})]
        for r in keyless:
            assert r.status_code == 403 and "API key" in r.json()["error"]
        r = client.post("/translate", json={**body, "api_key": "team-a-key-2"})
        assert (r.status_code, r.json()) == (403, {"error": "Invalid API key"})
        ok = [client.post("/translate", json={**body, "api_key": "team-a-key-1"}),
              client.post("/translate", data={**body, "api_key": "team-a-key-1"}),
              client.post("/translate", params={**body, "api_key": "team-a-key-1"})]
        assert [r.status_code for r in ok] == [200, 200, 200]
        assert {r.json()["translatedText"] for r in ok} == {french[1].translate(TEXTS[:1])[0]}
        slow = client.post("/translate", json={**body, "api_key": "team-a-key-1"})  # the fourth in a minute, limit 3
        assert slow.status_code == 429 and slow.json()["error"].startswith("Slowdown:")
        assert 1 <= int(slow.headers["Retry-After"]) <= 60
        bearer = {"Authorization": "Bearer batch-key-22"}
        assert client.post("/v1/translate", json={"text": TEXTS[:2]}, headers=bearer).json()["translations"] == french[1].translate(TEXTS[:2])
        large = client.post("/translate", json={"q": TEXTS, "source": "en", "target": "fr"}, headers=bearer)  # 62 characters, limit 40
        assert large.status_code == 400 and "exceeds text limit (40)" in large.json()["error"]
        settings = client.get("/frontend/settings").json()
        assert settings["apiKeys"] is True and settings["keyRequired"] is True
        metrics = client.get("/metrics").text
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith(("tk", "uvicorn")))  # the server's, not the client's
    assert "POST /translate 429" in logged
    for key in ("team-a-key-1", "team-a-key-2", "batch-key-22"):
        assert key not in logged and key not in metrics


def test_deep_translator_sends_a_query_string_and_gets_the_translation(french, german):
    from deep_translator import LibreTranslator

    with two_sources(french, german) as client:
        wait_ready(client)
        translator = LibreTranslator(source="en", target="fr", api_key="unused-key", custom_url=f"{client.base_url}/")
        assert [translator.translate(t) for t in TEXTS] == french[1].translate(TEXTS)


def test_libretranslate_aio_sends_a_list_as_repeated_form_fields_and_gets_every_translation(french, german):
    from libretranslate_aio import LibreTranslate

    with two_sources(french, german) as client:
        wait_ready(client)
        with LibreTranslate(str(client.base_url)) as lt:
            assert lt.translate(TEXTS, source="en", target="fr").translated_text == french[1].translate(TEXTS)
            assert lt.detect(FRENCH[0])[0].language == "fr"
        # Weblate's LibreTranslate backend: one form per text, the key as a form field
        r = client.post("/translate", data={"q": TEXTS[1], "source": "en", "target": "fr", "api_key": "", "format": "text"})
        assert {k: v for k, v in r.json().items() if k != "confidence"} == {"translatedText": french[1].translate(TEXTS[1:2])[0]}


def test_a_subtitle_file_goes_through_the_served_model_with_a_key(french, german):
    srt = "1\n00:00:01,000 --> 00:00:02,500\nI'm home.\n\n2\n00:00:03,000 --> 00:00:04,000\nWhere is the station?\n\n"
    with two_sources(french, german, api_keys=parse_keys(KEYS)) as client:
        wait_ready(client)
        upload = {"file": ("talk.srt", srt.encode(), "application/x-subrip")}
        refused = client.post("/translate_file", data={"source": "en", "target": "fr"}, files=upload)
        assert refused.status_code == 403
        r = client.post("/translate_file", data={"source": "auto", "target": "fr", "api_key": "batch-key-22"}, files=upload)
        assert r.status_code == 200, r.text
        url = r.json()["translatedFileUrl"]
        got = client.get(url[url.index("/download_file"):]).text
        assert got == srt.replace("I'm home.", FRENCH[0]).replace("Where is the station?", FRENCH[1])
        assert client.get("/frontend/settings").json()["supportedFilesFormat"] == [".txt", ".html", ".htm", ".docx", ".srt"]


NPM_CLIENT = REPO / "tests" / "serve" / "npm"


def test_the_npm_libretranslate_client_with_its_default_source_auto_and_its_key_gets_the_translation(french, german):
    import json
    import os
    import subprocess

    assert (NPM_CLIENT / "node_modules" / "libretranslate").is_dir(), "run: npm ci --prefix tests/serve/npm"
    with two_sources(french, german, api_keys=parse_keys(KEYS)) as client:
        wait_ready(client)
        run = subprocess.run(["node", str(NPM_CLIENT / "translate.mjs"), str(client.base_url), "-", "fr", *TEXTS[:2]],
                             capture_output=True, text=True, timeout=60, env={**os.environ, "API_KEY": "batch-key-22"})
        assert run.returncode == 0, run.stderr
        assert [json.loads(line) for line in run.stdout.splitlines()] == french[1].translate(TEXTS[:2])
