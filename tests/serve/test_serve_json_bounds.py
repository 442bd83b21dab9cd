"""tk serve reads JSON as JSON is written: NaN, Infinity and numbers past a float's range (which Python's json takes)
and bodies nested past what the parser reads are a 400 with the route's one-line error, never a 500 and a traceback
in the log, on every route that takes a JSON body (LibreTranslate's and the corpus contract's /translate,
/v1/translate)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="the serve extra is not installed: pip install -e '.[serve]'")
from fastapi.testclient import TestClient  # noqa: E402
from test_serve import config, wait_ready  # noqa: E402

from toolkit.deploy.translate import open_model  # noqa: E402
from toolkit.serve.app import create_app  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"
JSON = {"content-type": "application/json"}
LIBRE = b'{"q": "I am home.", "source": "en", "target": "fr", "alternatives": %s}'
CORPUS = b'{"texts": ["I am home."], "src_lang": "en", "tgt_lang": "fr", "batch": %s}'
OWN = b'{"text": "I am home.", "beam": 2, "alpha": %s}'
# Deeper than any parser's recursion limit, and inside the default body limit (about 261 kB).
DEEP_ARRAY = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 40_000 + b"1" + b"}" * 40_000


class Errors(logging.Handler):
    """The server log's errors: an internal error (a 500) is logged with its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[TestClient, Errors]]:
    """The app in process with the shipped model, ready; server errors come back as responses."""
    model = open_model(SHIPPED, "cpu")
    errors, log = Errors(), logging.getLogger("tk.serve")
    log.addHandler(errors)
    try:
        with TestClient(create_app(lambda: model, config()), base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
            wait_ready(client)
            yield client, errors
    finally:
        log.removeHandler(errors)


@pytest.fixture()
def client(served) -> Iterator[TestClient]:
    """The served app's client; the test fails if the server logged an error meanwhile."""
    client, errors = served
    errors.records.clear()
    yield client
    assert not errors.records, [r.getMessage() for r in errors.records]


def refused(response, *words: str) -> str:
    """A 400 with the one-line {"error": ...} body every route answers, naming each of words."""
    assert response.status_code == 400, (response.status_code, response.text)
    message = response.json()["error"]
    assert "\n" not in message and "Traceback" not in message and "internal error" not in message, message
    for w in words:
        assert w in message, (w, message)
    return message


@pytest.mark.parametrize("number", [b"Infinity", b"-Infinity", b"NaN", b"1e400", b"-1e400"])
@pytest.mark.parametrize("route", ["libretranslate", "corpus", "v1"])
def test_a_number_json_does_not_have_is_a_400_naming_it(client, route, number):
    path, template = {"libretranslate": ("/translate", LIBRE), "corpus": ("/translate", CORPUS), "v1": ("/v1/translate", OWN)}[route]
    message = refused(client.post(path, content=template % number, headers=JSON), number.decode().lstrip("-"))
    assert "finite" in message
    # The same request with a number JSON has is translated: only the number was at fault.
    ok = client.post(path, content=template % b"1", headers=JSON)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("route", ["libretranslate", "corpus", "v1"])
@pytest.mark.parametrize("nested", [DEEP_ARRAY, DEEP_OBJECT], ids=["arrays", "objects"])
def test_json_nested_deeper_than_a_request_is_a_400_naming_the_nesting(client, route, nested):
    path, body = {"libretranslate": ("/translate", b'{"q": %s, "source": "en", "target": "fr"}'),
                  "corpus": ("/translate", b'{"texts": %s, "src_lang": "en", "tgt_lang": "fr"}'),
                  "v1": ("/v1/translate", b'{"text": %s}')}[route]
    refused(client.post(path, content=body % nested, headers=JSON), "nest")
