"""Issue 36, tk serve under attack: Host allow-list (DNS rebinding), an escaped page, body size and time
limits enforced on the bytes read, bounded numeric options, a dead decoding worker made visible, fair
batches, dropped work nobody waits for, a request larger than the queue, lone surrogates and a model
directory whose name is not UTF-8. Loopback only; nothing waits on a clock it asserts."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed: pip install -e '.[serve]'")
from fastapi.testclient import TestClient  # noqa: E402
from test_serve import LONG_WAIT, config, metric, running, start_cli_server, until, wait_ready  # noqa: E402

from toolkit.deploy.translate import decode_sentences, open_model  # noqa: E402
from toolkit.serve.app import ServeConfig, create_app  # noqa: E402
from toolkit.serve.batcher import Batcher, BatchPolicy, OptionKey  # noqa: E402
from toolkit.serve.metrics import Metrics  # noqa: E402
from toolkit.serve.middleware import DRAIN_BYTES  # noqa: E402
from toolkit.serve.server import bound_config  # noqa: E402

LOOPBACK = "http://127.0.0.1"


@pytest.fixture(scope="module")
def model(tiny_export):
    return open_model(tiny_export, "cpu")


@contextmanager
def served(model, cfg: ServeConfig) -> Iterator[TestClient]:
    """The app in process, its model loaded and warmed up; server errors come back as responses."""
    with TestClient(create_app(lambda: model, cfg), base_url=LOOPBACK, raise_server_exceptions=False) as client:
        wait_ready(client)
        yield client


def one_line_error(r, status: int, *words: str) -> str:
    assert r.status_code == status, (status, r.status_code, r.text)
    message = r.json()["error"]
    assert "\n" not in message and "Traceback" not in message
    for w in words:
        assert w in message, (w, message)
    return message


# ---- Host allow-list -------------------------------------------------------------------------------------


def test_only_loopback_names_and_allowed_hosts_are_answered():
    """A page on evil.example that rebinds its name to 127.0.0.1 sends Host: evil.example; it gets 421."""
    app = create_app(lambda: None, ServeConfig())  # the model is never loaded: no lifespan runs
    client = TestClient(app, base_url=LOOPBACK)
    for host in ("localhost", "localhost:8000", "127.0.0.1:8000", "[::1]:8000", "[::1]", "LocalHost."):
        assert client.get("/health", headers={"host": host}).status_code == 200, host
    for host in ("evil.example", "evil.example:8000", "localhost.evil.example", "[::1", "127.0.0.1.evil.example"):
        one_line_error(client.get("/health", headers={"host": host}), 421, "--allow-host")
    one_line_error(client.post("/v1/translate", json={"text": "Hi."}, headers={"host": "evil.example"}), 421, "evil.example")

    named = TestClient(create_app(lambda: None, ServeConfig(allowed_hosts=("tk.example",))), base_url=LOOPBACK)
    assert named.get("/health", headers={"host": "tk.example:8000"}).status_code == 200
    assert named.get("/health", headers={"host": "evil.example"}).status_code == 421
    anyone = TestClient(create_app(lambda: None, ServeConfig(allowed_hosts=("*",))), base_url=LOOPBACK)
    assert anyone.get("/health", headers={"host": "evil.example"}).status_code == 200
    # tk serve --host 192.0.2.7 answers the address it listens on as well (nothing binds it here).
    bound = TestClient(create_app(lambda: None, bound_config(ServeConfig(), "192.0.2.7")), base_url=LOOPBACK)
    assert bound.get("/health", headers={"host": "192.0.2.7:8000"}).status_code == 200
    assert bound.get("/health", headers={"host": "192.0.2.8:8000"}).status_code == 421


# ---- the page and the model's name -----------------------------------------------------------------------


def test_the_page_escapes_the_model_name_and_an_undecodable_one_is_served(model):
    # os.fsdecode turns a directory name's non-UTF-8 bytes into lone surrogates, which UTF-8 cannot encode.
    name = os.fsdecode(b"m\xff") + '<script>alert("x")</script>'
    with served(model, ServeConfig(description=name)) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert "<script>alert" not in page.text and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page.text
        assert "m\ufffd" in page.text
        ready = client.get("/ready")
        assert ready.status_code == 200 and ready.json()["model"] == "m\ufffd" + '<script>alert("x")</script>'


def test_the_cli_serves_allow_host_names_and_escapes_the_directory_name(tiny_export, tmp_path):
    # (ONNX Runtime cannot open a path that is not UTF-8 at all; the test above covers such a name in the page.)
    odd = tmp_path / "tiny<b>"
    shutil.copytree(tiny_export, odd)
    proc, url = start_cli_server(odd, "--allow-host", "tk.example")
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            wait_ready(client)
            assert "tiny&lt;b&gt;" in client.get("/").text
            assert client.get("/health", headers={"host": "tk.example"}).status_code == 200
            assert client.get("/health", headers={"host": "evil.example"}).status_code == 421
    finally:
        proc.terminate()
        proc.wait(60)


# ---- body size and time ----------------------------------------------------------------------------------


def call(app, headers: list[tuple[bytes, bytes]], chunks: int, chunk: bytes = b" " * 1000) -> tuple[list[dict], list[int]]:
    """POSTs a body of `chunks` chunks straight to the ASGI app; returns what it sent and, for each
    message sent, how many chunks it had read by then."""
    pulled, sent, pulled_at = 0, [], []

    async def receive():
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": chunk, "more_body": pulled < chunks}

    async def send(message):
        sent.append(message)
        pulled_at.append(pulled)

    scope = {"type": "http", "method": "POST", "path": "/v1/translate", "raw_path": b"/v1/translate", "query_string": b"",
             "headers": [(b"content-type", b"application/json"), *headers], "http_version": "1.1", "scheme": "http",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 9), "root_path": ""}
    asyncio.run(app(scope, receive, send))
    return sent, pulled_at


def test_a_chunked_body_is_refused_at_the_limit_and_the_rest_only_dropped():
    """No Content-Length to check first: the answer comes at the first chunk past the limit, and of a
    10 MB body at most DRAIN_BYTES more are read (and dropped, see below), never the whole."""
    cfg = ServeConfig(max_sentences=2, max_chars=100)  # a body limit of a few kB
    sent, pulled_at = call(create_app(lambda: None, cfg), [(b"host", b"127.0.0.1"), (b"transfer-encoding", b"chunked")], 10_000)
    assert sent[0]["status"] == 413 and b"split the request" in sent[1]["body"]
    assert pulled_at[0] * 1000 <= cfg.max_body_bytes + 1000  # answered at the first chunk past the limit
    assert pulled_at[-1] * 1000 <= cfg.max_body_bytes + DRAIN_BYTES + 2000


def test_a_refused_body_is_read_and_dropped_before_the_connection_closes():
    """Closing with request bytes unread makes the kernel reset the connection, and a client still
    sending can lose the answer to the reset (it did under load). The answer goes first, then the rest
    of the body is read and dropped, then the connection closes; not a body far over DRAIN_BYTES, nor
    one that waits for "100 Continue"."""
    app = create_app(lambda: None, ServeConfig(max_sentences=2, max_chars=100))
    length = [(b"content-length", b"100000")]
    for headers, status in (([(b"host", b"127.0.0.1"), *length], 413), ([(b"host", b"evil.example"), *length], 421)):
        sent, pulled_at = call(app, headers, 100)
        assert sent[0]["status"] == status and pulled_at[:2] == [0, 0]  # answered before reading
        assert pulled_at[-1] == 100 and sent[-1] == {"type": "http.response.body", "body": b""}  # closed once all is read
    for headers in ([(b"host", b"127.0.0.1"), (b"content-length", b"100000000")],
                    [(b"host", b"127.0.0.1"), *length, (b"expect", b"100-continue")]):
        sent, pulled_at = call(app, headers, 100)
        assert sent[0]["status"] == 413 and pulled_at[-1] == 0


def test_a_slow_body_gets_408_and_its_connection_is_closed(tmp_path):
    # The model fails to load (an empty directory): the limit holds before the app, ready or not.
    with running(lambda: open_model(tmp_path, "cpu"), ServeConfig(body_timeout_s=0.5)) as client:
        host, port = str(client.base_url).removeprefix("http://").rstrip("/").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"te")
            answer = b""
            while chunk := s.recv(4096):  # ends when the server closes the connection
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5s" in answer


# ---- options ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option, value", [
    ("--max-delay-ms", "1e15"), ("--max-delay-ms", "nan"), ("--timeout-s", "inf"), ("--body-timeout-s", "1e9"),
    ("--max-batch-tokens", "1000000000"), ("--max-batch-sentences", "1000000"), ("--queue-size", "1000000000"),
    ("--max-sentences", "100000"), ("--max-chars", "100000000"),
])
def test_every_numeric_serve_option_has_a_declared_range(cli, tmp_path, option, value):
    r = cli("serve", tmp_path, option, value)  # refused before the (missing) model is opened
    assert r.exit_code == 2 and r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    assert option in r.output and ("range" in r.output or "finite" in r.output) and "Traceback" not in r.output


def test_allow_host_refuses_what_is_not_a_host_name(cli, tmp_path):
    r = cli("serve", tmp_path, "--allow-host", "http://evil.example/")
    assert r.exit_code == 2 and "--allow-host" in r.output and "not a host name" in r.output and r.output.count("\n") == 1


# ---- the decoding worker ---------------------------------------------------------------------------------


def test_a_dead_decoding_worker_makes_ready_503_and_the_log_says_so(model, monkeypatch, caplog):
    log = logging.getLogger("tk.serve")
    log.addHandler(caplog.handler)
    try:
        with running(lambda: model, config(timeout_s=20.0)) as client:
            wait_ready(client)

            def bug(self, batch, backend):
                raise OverflowError("timeout value is too large")

            monkeypatch.setattr(Batcher, "_decode", bug)
            one_line_error(client.post("/v1/translate", json={"text": "Hi."}), 503, "decoding worker stopped")
            one_line_error(client.get("/ready"), 503, "decoding worker stopped", "restart")
            one_line_error(client.post("/v1/translate", json={"text": "Go."}), 503, "decoding worker stopped")
            assert metric(client, "tk_ready") == 0
    finally:
        log.removeHandler(caplog.handler)
    assert any(r.levelno >= logging.ERROR and "decoding worker stopped" in r.getMessage() for r in caplog.records)


@contextmanager
def gated(model, policy: BatchPolicy, monkeypatch) -> Iterator[tuple[Batcher, list, threading.Event]]:
    """A started batcher whose decode of "Wait." holds the worker until the gate opens; every decode is
    recorded as (texts, beam)."""
    decoded: list[tuple[list[str], int]] = []
    gate = threading.Event()

    def recording(translator, texts, opts, **kwargs):
        decoded.append((list(texts), opts.beam))
        if list(texts) == ["Wait."]:
            gate.wait(60)
        return decode_sentences(translator, texts, opts, **kwargs)

    monkeypatch.setattr("toolkit.serve.batcher.decode_sentences", recording)
    batcher = Batcher(lambda: model, policy, Metrics())
    batcher.start()
    assert batcher.ready.wait(60)
    try:
        yield batcher, decoded, gate
    finally:
        gate.set()
        batcher.close(60)


async def settle(check) -> None:
    for _ in range(3000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


def key(model, beam: int = 1) -> OptionKey:
    return OptionKey.of(beam=beam, alpha=0.6, max_len=model.manifest.max_len)


def test_a_big_request_takes_turns_with_later_requests_instead_of_holding_them(model, monkeypatch):
    """Six beam-2 sentences, then one beam-2 and one greedy sentence: the later two go into the next two
    decodes (the first shared with the big request), not behind all six."""
    big = [f"I see {n} cats." for n in ("one", "two", "three", "four", "five", "six")]
    with gated(model, BatchPolicy(max_sentences=2, max_delay_s=0), monkeypatch) as (batcher, decoded, gate):
        async def scenario():
            held = asyncio.ensure_future(batcher.translate(["Wait."], key(model)))
            await settle(lambda: decoded[-1][0] == ["Wait."])
            # One request at a time into the queue: each prepares off the event loop, so three started together
            # could enqueue in any order; the order is what this test is about.
            requests = [asyncio.ensure_future(batcher.translate(big, key(model, 2)))]
            await settle(lambda: batcher.depth == 6)
            requests.append(asyncio.ensure_future(batcher.translate(["Small."], key(model, 2))))
            await settle(lambda: batcher.depth == 7)
            requests.append(asyncio.ensure_future(batcher.translate(["Other."], key(model))))
            await settle(lambda: batcher.depth == 8)
            gate.set()
            return await asyncio.gather(held, *requests)

        answers = asyncio.run(scenario())
    after = decoded[decoded.index((["Wait."], 1)) + 1:]
    assert after[:2] == [([big[0], "Small."], 2), (["Other."], 1)]
    assert sorted(t for texts, _ in after for t in texts) == sorted(big + ["Small.", "Other."])  # each decoded once
    assert [len(a) for a in answers] == [1, 6, 1, 1]


def test_a_batch_s_work_counts_the_beam(model, monkeypatch):
    """Four equal sentences fit one greedy decode's budget exactly; at beam 4 each is a decode of its own."""
    text = "The cat is sleeping on the sofa."
    tokens = len(model.tokenizer.encode([text])[0])
    with gated(model, BatchPolicy(max_tokens=4 * tokens, max_delay_s=0), monkeypatch) as (batcher, decoded, gate):
        gate.set()

        async def scenario():
            await batcher.translate([text] * 4, key(model))
            await batcher.translate([text] * 4, key(model, 4))

        asyncio.run(scenario())
    assert [(len(texts), beam) for texts, beam in decoded[1:]] == [(4, 1), (1, 4), (1, 4), (1, 4), (1, 4)]


def test_queued_sentences_past_their_deadline_are_dropped_not_decoded(model, monkeypatch):
    with gated(model, BatchPolicy(max_delay_s=0), monkeypatch) as (batcher, decoded, gate):
        async def scenario():
            held = asyncio.ensure_future(batcher.translate(["Wait."], key(model)))
            await settle(lambda: decoded[-1][0] == ["Wait."])
            late = asyncio.ensure_future(batcher.translate(["Late."], key(model, 2), deadline=time.monotonic() + 0.05))
            await settle(lambda: batcher.depth == 1)
            await asyncio.sleep(0.1)  # the deadline passes while the worker is held
            gate.set()
            await held
            with pytest.raises(TimeoutError):
                await late

        asyncio.run(scenario())
    assert all("Late." not in texts for texts, _ in decoded) and batcher.depth == 0


def test_a_request_whose_client_went_away_leaves_the_queue_undecoded(model):
    with running(lambda: model, config(max_delay_s=LONG_WAIT)) as client:
        wait_ready(client)
        host, port = str(client.base_url).removeprefix("http://").rstrip("/").split(":")
        body = b'{"text": "I am home."}'
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            until(lambda: metric(client, "tk_queue_depth") == 1)
        until(lambda: metric(client, "tk_queue_depth") == 0)  # it would wait for company until the 30 s timeout
        until(lambda: metric(client, "tk_requests_total", {"status": "499"}) == 1)
        assert metric(client, "tk_batch_sentences_count") == 0


# ---- requests the queue can never hold, and text that is not text ----------------------------------------


def test_a_request_larger_than_the_whole_queue_gets_413_not_a_retry(model):
    with served(model, config(queue_size=1)) as client:
        one_line_error(client.post("/v1/translate", json={"text": ["Hi.", "Go."]}), 413, "2 sentences", "--queue-size", "at most 1")
        assert client.post("/v1/translate", json={"text": ["Hi."]}).status_code == 200


def test_lone_surrogates_get_400_and_no_traceback(model, caplog):
    log = logging.getLogger("tk.serve")
    log.addHandler(caplog.handler)
    try:
        with served(model, config()) as client:
            for body, where in ((b'{"text": "a\\ud800b"}', "sentence 0"), (b'{"text": ["ok", "\\udcff"], "beam": 2}', "sentence 1"),
                                (b'{"text": "ok", "\\ud800": 1}', "the body")):
                r = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
                one_line_error(r, 400, where, "surrogate")
            assert client.post("/v1/translate", json={"text": "I am home."}).status_code == 200
    finally:
        log.removeHandler(caplog.handler)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
