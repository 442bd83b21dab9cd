"""tk serve's ASGI middleware: the Host names served, request bodies read within their size and time limits, a request
cancelled when its client goes away, and one log line per request; and the one reader of request bodies."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from toolkit.core.tokenizers import rust_panic
from toolkit.serve.metrics import Metrics

log = logging.getLogger("tk.serve")
# Names a browser on this machine uses for a loopback server; with the bound address and --allow-host
# names they are the Host headers served, so a page elsewhere cannot reach the API by DNS rebinding.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
SURROGATES = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    """Text that encodes as UTF-8: lone surrogates (a directory name's undecodable bytes after
    os.fsdecode, or a client's JSON escapes) become U+FFFD."""
    return SURROGATES.sub("\ufffd", text)


def host_name(value: str) -> str:
    """The name in a Host header or an --allow-host value: no port, no brackets, lower case, no
    trailing dot; "" for a malformed bracketed address, which no entry matches."""
    v = value.strip().lower()
    if v.startswith("["):
        address, closed, rest = v[1:].partition("]")
        return address if closed and (not rest or rest[0] == ":" and rest[1:].isdigit()) else ""
    if v.count(":") == 1:
        v = v.split(":")[0]
    return v.rstrip(".")


class Refused(Exception):
    """A request answered with an error status and one line: by the middleware itself, before the app sees it (unread: the
    client may still be sending a body the answer should not be lost under), or by a route (headers: its answer's)."""

    def __init__(self, status: int, message: str, headers: dict | None = None, unread: bool = False):
        super().__init__(message)
        self.status, self.headers, self.unread = status, headers, unread


class ClientGone(Exception):
    """The client closed its connection before the request was answered."""


# Closing a connection with request bytes unread makes the kernel reset it, and a client still sending
# may then lose the answer (a third of 100 kB bodies refused on Content-Length did, on loopback). So the
# rest of a refused body is read and dropped first, within these bounds (as nginx's lingering close).
DRAIN_BYTES = 1 << 20
DRAIN_S = 2.0


async def reply(send, status: int, message: str, drain=None) -> None:
    """A JSON error that closes the connection; with drain (the request's receive), the unread rest of
    the body is read and dropped, within DRAIN_BYTES and DRAIN_S, before the connection closes."""
    body = json.dumps({"error": message}).encode()  # ensure_ascii: a client's lone surrogates stay escapes
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body, "more_body": drain is not None})
    if drain is None:
        return
    loop = asyncio.get_running_loop()
    deadline, dropped = loop.time() + DRAIN_S, 0
    try:
        while dropped < DRAIN_BYTES:
            message = await asyncio.wait_for(drain(), max(deadline - loop.time(), 0))
            dropped += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body"):
                break
    except asyncio.TimeoutError:
        pass
    await send({"type": "http.response.body", "body": b""})


def sending_body(scope, at_most: int) -> bool:
    """Whether the client is sending a body of at most at_most bytes (or chunked) that nothing has read yet.
    Not one that waits for "100 Continue": reading it would invite it."""
    headers = dict(scope["headers"])
    if b"100-continue" in headers.get(b"expect", b"").lower():
        return False
    length = headers.get(b"content-length", b"")
    return b"chunked" in headers.get(b"transfer-encoding", b"").lower() or (length.isdigit() and 0 < int(length) <= at_most)


@dataclass(frozen=True)
class BodyLimits:
    """How large a request body may be and how long it may take to arrive, and the words of a refusal."""

    max_bytes: int
    timeout_s: float
    fix: str = "split the request"  # what a client whose body is too large should do
    late: str = "the request body"  # what did not arrive in time
    grouped: bool = False  # sizes with thousands separators


async def read_body(scope, receive, limits: BodyLimits) -> bytes:
    """A request's whole body, read as it arrives, for every route that reads one (the translation routes through RequestLog,
    /translate_file itself, each within its own limits): Refused with 413 once it passes the size limit (by its
    Content-Length first; a chunked body has none to check), 408 when it is not all there within the time limit;
    ClientGone when the client goes away."""
    limit, timeout, sep = limits.max_bytes, limits.timeout_s, "," if limits.grouped else ""
    length = dict(scope["headers"]).get(b"content-length")
    if length and length.isdigit() and int(length) > limit:
        raise Refused(413, f"request body of {int(length):{sep}} bytes, limit {limit:{sep}}; {limits.fix}",
                      unread=sending_body(scope, DRAIN_BYTES))
    chunks, size = [], 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0))
        except asyncio.TimeoutError:
            raise Refused(408, f"{limits.late} did not arrive within {timeout:g}s; send it whole at once") from None
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            raise Refused(413, f"request body over {limit:{sep}} bytes, the limit; {limits.fix}", unread=message.get("more_body", False))
        if not message.get("more_body"):
            return b"".join(chunks)


class RequestLog:
    """Pure ASGI middleware: serves only allowed Host names, reads a translation request's body
    within its size and time limits, cancels the request when its client goes away, counts
    translation requests by status and logs one line per request (uvicorn's access log is off)."""

    def __init__(self, app, limits: BodyLimits, allowed_hosts: Sequence[str], metrics: Metrics, reads: Sequence[str] = (),
                 counted: Sequence[str] = ()):
        self.app = app
        self.limits = limits  # of the bodies of the POST requests to the paths in `reads`, which this reads itself
        self.metrics = metrics
        self.reads, self.counted = tuple(reads), tuple(counted)  # counted: the translation requests, in tk_requests_total
        self.any_host = "*" in allowed_hosts
        self.hosts = {host_name(h) for h in (*LOOPBACK_HOSTS, *allowed_hosts)} - {""}

    def __getattr__(self, name):  # tests and uvicorn reach the FastAPI app's state and routes through here
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500
        started = False
        scope.setdefault("state", {})

        async def send_status(message):
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
            await send(message)

        path = scope["path"]
        try:
            self.check_host(scope)
            if path in self.reads and scope["method"] == "POST":
                body = await read_body(scope, receive, self.limits)
                await self.run_watched(scope, body, receive, send_status)
            else:
                await self.app(scope, receive, send_status)
        except Refused as e:
            await reply(send_status, e.status, printable(str(e)), receive if e.unread else None)
        except ClientGone:
            status = 499  # nginx's "client closed request": nobody reads an answer
        except BaseException as e:
            # A Rust extension's panic (pyo3's PanicException) derives from BaseException: the app's `except Exception`
            # handlers miss it, and uvicorn would answer a plain-text 500. This request gets the JSON error instead.
            if not rust_panic(e) or started:
                raise
            log.error("internal error on %s %s", scope["method"], printable(path), exc_info=e)
            await reply(send_status, 500, "internal error; the server log has the details")
        finally:
            ms = 1000 * (time.perf_counter() - start)
            n = scope["state"].get("sentences")
            if path in self.counted:
                self.metrics.requests.labels(str(status)).inc()
            log.info("%s %s %d %s%.1f ms", scope["method"], printable(path), status, f"{n} sentence{'s' * (n != 1)} " if n is not None else "",
                     ms)

    def check_host(self, scope) -> None:
        if self.any_host:
            return
        header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if host_name(header) not in self.hosts:
            shown = json.dumps(header[:100])
            raise Refused(421, f"Host {shown} is not served here (a DNS-rebinding guard); to serve it, start tk serve with "
                               f"--allow-host {host_name(header) or 'NAME'}", unread=sending_body(scope, DRAIN_BYTES))

    async def run_watched(self, scope, body: bytes, receive, send) -> None:
        """Runs the app on the body read while watching the connection: a client that goes away
        cancels its request, so its queued sentences are dropped instead of decoded."""
        gone = asyncio.Event()
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def watch():
            # Once the body is read, uvicorn's receive returns only when the client disconnects or the answer is sent.
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        app = asyncio.ensure_future(self.app(scope, replay, send))
        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({app, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not app.done():
                app.cancel()
                await asyncio.gather(app, return_exceptions=True)
                raise ClientGone
            app.result()
        finally:
            app.cancel()
            watcher.cancel()
