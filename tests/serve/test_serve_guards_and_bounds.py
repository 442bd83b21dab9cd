"""Issue 46 and 47, tk serve: the server decodes with tk translate's options (guards on, one builder of decoding options),
one request's failing sentence fails that request alone, every connection's request time is bounded (a header or body
that trickles in, a connection that sends nothing), and sentences, not texts, take turns in the batches. Loopback only;
the bounds are checked against deadlines of half a second with generous slack, never against a measured duration."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed: pip install -e '.[serve]'")
from test_serve import LONG_WAIT, config, metric, running, wait_ready  # noqa: E402

from toolkit.core.decode_options import DecodeOptions  # noqa: E402
from toolkit.deploy.api import Translator  # noqa: E402
from toolkit.deploy.translate import open_model, translate_batch  # noqa: E402
from toolkit.serve.app import ServeConfig  # noqa: E402
from toolkit.serve.batcher import Batcher, BatchPolicy, OptionKey  # noqa: E402
from toolkit.serve.metrics import Metrics  # noqa: E402

POISON = "Tell me."


@pytest.fixture(scope="module")
def model(tiny_export):
    return open_model(tiny_export, "cpu")


@pytest.fixture(scope="module")
def translator(tiny_export):
    return Translator(tiny_export, provider="cpu", variant="fp32")


# ---- decoding options owned once: the server gives tk translate's text -----------------------------------------------


@pytest.mark.filterwarnings("ignore::toolkit.deploy.api.SpanRepairWarning")  # "12345": the guard cut its placeholder
def test_the_server_gives_the_api_s_text_where_the_guards_cut_it(model, translator):
    """The tiny model starts repeating itself on these inputs, so tk's loop guard ends their translations; the server
    decoded with the guards off and said something else. A text of two sentences is joined back from its sentences."""
    texts = ["I try.", "Tell me. I gave up.", "Tom Tom Tom."]
    expected = translator.translate_batch(texts)
    unguarded = translator.translate_batch(texts, max_len_a=None, loop_guard=False)
    # the guards (a cut, or the wider beam a cut asks for) change each translation: what this test is about
    assert all(g[0].text != u[0].text for g, u in zip(expected, unguarded))
    with running(lambda: model, config()) as client:
        wait_ready(client)
        assert client.post("/v1/translate", json={"text": texts}).json()["translations"] == [n[0].text for n in expected]
        # The length guard with options given the same way to both, and alpha above the 5 the server capped it at.
        options = {"beam": 3, "n_best": 2, "alpha": 7.5, "max_len_a": 0.5, "max_len_b": 2}
        got = client.post("/v1/translate", json={"text": texts, **options})
        assert got.status_code == 200, got.text
        want = translator.translate_batch(texts, **options)
        assert [[h["text"] for h in n] for n in got.json()["n_best"]] == [[h.text for h in n] for n in want]
        no_guards = client.post("/v1/translate", json={"text": texts[0], "max_len_a": None, "loop_guard": False}).json()
        assert no_guards["translations"] == translator.translate(texts[:1], max_len_a=None, loop_guard=False)
        refused = client.post("/v1/translate", json={"text": "Hi.", "alpha": 10.5})
        assert refused.status_code == 422 and "alpha" in refused.json()["error"]


# ---- one input fails no other request --------------------------------------------------------------------------------


def test_a_sentence_whose_decode_fails_fails_its_own_request_only(model, monkeypatch):
    """Four single-sentence requests fill one batch (it leaves only when full); decoding POISON raises. Its request
    gets a 500, the three others their translations."""
    import toolkit.deploy.translate as translate_mod

    poison = model.tokenizer.encode([POISON])[0]
    real = translate_mod.decode_ids

    def failing(backend, src, opts, done=None, finish=None):
        if poison in src:
            raise RuntimeError("an internal failure on this one sentence")
        return real(backend, src, opts, done, finish)

    texts = ["I try.", POISON, "I gave up.", "Hang on tight."]
    with running(lambda: model, config(max_sentences=4, max_delay_s=LONG_WAIT)) as client:
        wait_ready(client)
        monkeypatch.setattr(translate_mod, "decode_ids", failing)
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda s: client.post("/v1/translate", json={"text": s}), texts))
        assert metric(client, "tk_batch_sentences_sum") >= 4 and metric(client, "tk_batch_sentences_count") >= 1
        monkeypatch.setattr(translate_mod, "decode_ids", real)
    statuses = [r.status_code for r in answers]
    assert statuses == [200, 500, 200, 200], [r.text for r in answers]
    assert "\n" not in answers[1].json()["error"] and "Traceback" not in answers[1].text
    options = DecodeOptions.for_manifest(model.manifest)
    for text, r in zip(texts, answers):
        if r.status_code == 200:
            assert r.json()["translations"] == [translate_batch(model, [text], options)[0][0].text]


def test_a_text_whose_preparation_fails_takes_no_other_request_with_it(model, monkeypatch):
    """Text preparation raising on one text (as '(11)(22)...(122)' did) left every request batched with it a 500.
    That text gets what tk translate gives it (it is prepared with its request, never in a batch); the three others
    fill one batch (it leaves only when full) and get their translations."""
    import toolkit.core.textprep as textprep

    real = textprep.prepare

    def failing(line, *args, **kwargs):
        if line == POISON:
            raise IndexError("list index out of range")
        return real(line, *args, **kwargs)

    texts = ["I try.", POISON, "I gave up.", "Hang on tight."]
    with running(lambda: model, config(max_sentences=3, max_delay_s=LONG_WAIT)) as client:
        wait_ready(client)
        monkeypatch.setattr(textprep, "prepare", failing)
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda s: client.post("/v1/translate", json={"text": s}), texts))
        expected = [n[0].text for n in translate_batch(model, texts, DecodeOptions.for_manifest(model.manifest))]
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
    assert [r.json()["translations"][0] for r in answers] == expected


# ---- every connection's request time is bounded ----------------------------------------------------------------------


def closed_within(s: socket.socket, seconds: float, trickle: bytes = b"") -> bytes:
    """What the server sent before closing the connection, sending one byte of `trickle` every 0.1 s meanwhile;
    fails if the connection is still open after `seconds`."""
    s.settimeout(0.1)
    answer, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            chunk = s.recv(4096)
        except TimeoutError:
            if trickle:
                try:
                    s.sendall(trickle[:1])
                except OSError:  # closed under us: what is read next says so
                    pass
                trickle = trickle[1:] or trickle
            continue
        except ConnectionResetError:
            return answer
        if not chunk:
            return answer
        answer += chunk
    raise AssertionError(f"connection still open after {seconds}s (got {answer[:80]!r})")


@pytest.mark.slow
def test_every_connection_s_header_and_body_time_is_bounded(tmp_path):
    """Half-second bounds: a request head that trickles in a byte at a time gets 408 and is closed, a connection that
    sends nothing is closed, a body that trickles in to /health (which reads none) is closed, and a head trickled
    after a first answer on a kept-alive connection too; a normal request is answered."""
    cfg = ServeConfig(header_timeout_s=0.5, body_timeout_s=0.5)
    # The model fails to load (an empty directory): the bounds hold before the app, ready or not.
    with running(lambda: open_model(tmp_path, "cpu"), cfg) as client:
        assert client.get("/health").json() == {"status": "alive"}
        assert client.get("/health").status_code == 200  # the same kept-alive connection
        address = str(client.base_url).removeprefix("http://").rstrip("/").split(":")
        address = (address[0], int(address[1]))
        with socket.create_connection(address) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            answer = closed_within(s, 10, b"abcdefghij" * 20)
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5s" in answer
        with socket.create_connection(address) as s:
            assert closed_within(s, 10) == b""  # nothing asked, nothing answered
        with socket.create_connection(address) as s:
            s.sendall(b"POST /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
            answer = closed_within(s, 10, b" " * 900)
        assert answer.startswith(b"HTTP/1.1 405")  # answered at once; then closed, its body never complete
        with socket.create_connection(address) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            s.settimeout(10)
            first = b""
            while b"alive" not in first:
                first += s.recv(4096)
            assert first.startswith(b"HTTP/1.1 200")
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            assert closed_within(s, 10, b"abcdefghij" * 20).startswith(b"HTTP/1.1 408")
        # A whole request sent at once is unaffected, and so is one whose answer takes longer than the bounds.
        assert client.get("/health").status_code == 200
        slow = client.post("/v1/translate", json={"text": "Hi."})
        assert slow.status_code == 503 and "failed to load" in slow.json()["error"]


def test_the_header_timeout_is_an_option_with_a_declared_range(cli, tmp_path):
    r = cli("serve", tmp_path, "--header-timeout-s", "0")  # refused before the (missing) model is opened
    assert r.exit_code == 2 and "--header-timeout-s" in r.output and "range" in r.output and r.output.count("\n") == 1, r.output


# ---- head-of-line: sentences, not texts, take turns ------------------------------------------------------------------


def test_a_text_of_many_sentences_holds_a_later_request_for_one_batch_at_most(model, monkeypatch):
    """A request of 8 texts of 250 sentences each, then a one-sentence request: the short request's sentence is in the
    first decode after the one in flight, not behind a whole text of 250 sentences. Counted by construction: every
    decode's source sentences are recorded (toolkit.deploy.translate.decode_ids)."""
    import toolkit.deploy.translate as translate_mod

    real = translate_mod.decode_ids
    wait_ids, short_ids = model.tokenizer.encode(["Wait.", "Where is the station?"])
    calls: list[list[list[int]]] = []
    gate = threading.Event()

    def recording(backend, src, opts, done=None, finish=None):
        calls.append([list(s) for s in src])
        if wait_ids in calls[-1]:
            gate.wait(60)
        return real(backend, src, opts, done, finish)

    monkeypatch.setattr(translate_mod, "decode_ids", recording)
    policy = BatchPolicy(max_sentences=64, max_delay_s=0)
    batcher = Batcher(lambda: model, policy, Metrics())
    batcher.start()
    assert batcher.ready.wait(120)
    key = OptionKey.of(max_len=model.manifest.max_output_len)

    async def settle(check) -> None:
        for _ in range(6000):
            if check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition never held")

    async def scenario():
        held = asyncio.ensure_future(batcher.translate(["Wait."], key))
        await settle(lambda: calls and wait_ids in calls[-1])
        big = asyncio.ensure_future(batcher.translate(["Hi. " * 250] * 8, key))
        await settle(lambda: batcher.depth == 8)
        short = asyncio.ensure_future(batcher.translate(["Where is the station?"], key))
        await settle(lambda: batcher.depth == 9)
        gate.set()
        await held
        answer = await short
        big.cancel()  # its other sentences are dropped, not decoded
        await asyncio.gather(big, return_exceptions=True)
        return answer

    try:
        answer = asyncio.run(scenario())
    finally:
        gate.set()
        batcher.close(120)
    # after the batch in flight ("Wait.", decoded again with a wider beam where a guard cut it, in the same batch)
    after = calls[max(k for k, c in enumerate(calls) if wait_ids in c) + 1:]
    assert short_ids in after[0], [len(c) for c in after]  # the first decode after the one in flight
    assert all(len(c) <= policy.max_sentences for c in after)
    assert answer[0][0].text == translate_batch(model, ["Where is the station?"], DecodeOptions.for_manifest(model.manifest))[0][0].text
