"""format html through tk serve (LibreTranslate's /translate): the markup comes back as it was sent, and cutting a
fragment into texts runs off the event loop, so a large fragment never holds the server's other requests.
The shipped Transformer translates; every answer is compared with the Python API's. Loopback only."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed: pip install -e '.[serve]'")
from test_serve import config, running, wait_ready  # noqa: E402

from toolkit.deploy import markup  # noqa: E402


def html(client: httpx.Client, q: str | list[str], **options) -> httpx.Response:
    return client.post("/translate", json={"q": q, "source": "en", "target": "fr", "format": "html", **options})


def test_what_follows_an_unclosed_script_or_comment_comes_back_untranslated(french):
    hello = french[1].translate(["Hello."])[0]
    fragments = ["<p>Hello.</p><script>I am home.", "<p>Hello.</p><!-- I am home.", "<![CDATA[I am home.]]><p>Hello.</p>",
                 '<!DOCTYPE x [ <!ENTITY h "I am home."> ]><p>Hello.</p>']
    with running(lambda: french[0], config()) as client:
        wait_ready(client)
        r = html(client, fragments)
        assert r.status_code == 200, r.text
        assert r.json()["translatedText"] == french[1].translate(fragments, format="html")
        assert r.json()["translatedText"] == [f"<p>{hello}</p><script>I am home.", f"<p>{hello}</p><!-- I am home.",
                                              f"<![CDATA[I am home.]]><p>{hello}</p>", f'<!DOCTYPE x [ <!ENTITY h "I am home."> ]><p>{hello}</p>']


def test_cutting_html_leaves_the_server_answering_other_requests(french, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    real = markup.plan

    def held(fragment: str) -> markup.Plan:  # a fragment that takes as long as the test says to cut
        entered.set()
        release.wait(60)
        return real(fragment)

    monkeypatch.setattr(markup, "plan", held)
    with running(lambda: french[0], config()) as client:
        wait_ready(client)
        with httpx.Client(base_url=client.base_url, timeout=90) as other, ThreadPoolExecutor(1) as pool:
            pending = pool.submit(html, other, "<p>Hello.</p>")
            assert entered.wait(60)
            try:
                health = client.get("/health", timeout=20)
                translated = client.post("/v1/translate", json={"text": "Hello."}, timeout=20)
            finally:
                release.set()
            assert health.status_code == 200 and translated.status_code == 200
            assert translated.json()["translations"] == french[1].translate(["Hello."])
            assert pending.result().status_code == 200


def test_deeply_nested_fragments_at_the_size_limit_are_translated(french):
    fragment = "<div>" * 1110 + "Hello." + "</p>" * 1110
    hello = french[1].translate(["Hello."])[0]
    with running(lambda: french[0], config(max_chars=10000)) as client:
        wait_ready(client)
        r = html(client, [fragment] * 64)
        assert r.status_code == 200, r.text
        assert r.json()["translatedText"] == ["<div>" * 1110 + hello + "</p>" * 1110] * 64


def test_html_holding_more_texts_than_the_queue_is_refused_in_one_line(french):
    fragment = "".join(f"<p>Sentence {k}.</p>" for k in range(20))
    with running(lambda: french[0], config(queue_size=8)) as client:
        wait_ready(client)
        r = html(client, fragment)
        assert r.status_code == 400
        message = r.json()["error"]
        assert "\n" not in message and "HTML" in message and "20 texts" in message and "--queue-size" in message
        assert html(client, fragment[:60]).status_code == 200
