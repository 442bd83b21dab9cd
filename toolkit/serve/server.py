"""Runs the app on uvicorn: binds the port, logs, bounds every connection's request time, and shuts down
gracefully on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from toolkit.core.errors import UsageError
from toolkit.deploy.translate import TranslationModel
from toolkit.serve.app import ModelSpec, ServeConfig, create_app
from toolkit.serve.middleware import LOOPBACK_HOSTS, host_name, printable

log = logging.getLogger("tk.serve")
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this
# The connection's body bound is the app's --body-timeout-s plus this, so that a translation request's slow body gets
# the app's own 408, which says what to do, and the protocol's bound catches the bodies no route reads (POST /health).
BODY_GRACE_S = 1.0


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request, which uvicorn lacks (its keep-alive timer
    starts only after a first answer and is reset by every byte, so a connection that sends nothing, or a header one
    byte every 5 s, stayed open for good: uvicorn issue #157 proposes this very pair of timeouts).

    From the connection's opening, or the end of its previous answer, the request line and headers must be all
    there within header_timeout_s; from then its body within body_timeout_s. Past either the connection is closed,
    after a 408 where the client had begun a request that nobody answered yet. No deadline runs while the app works
    on a request whose bytes are all read (--timeout-s bounds that). Absolute deadlines, not idle timers: a trickle
    of bytes does not extend them."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0 + BODY_GRACE_S

    def connection_made(self, transport) -> None:  # noqa: ANN001 (asyncio's signature)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None
        super().connection_made(transport)
        self._track()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()  # a kept-alive connection begins its next request's deadline (a pipelined one may be read already)

    def connection_lost(self, exc: Exception | None) -> None:
        self._arm(None)
        super().connection_lost(exc)

    def _track(self) -> None:
        """The deadline of where the client is in its request: its head (IDLE), its body (SEND_BODY), or none (all read)."""
        state = self.conn.their_state
        phase = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if phase != self._phase:
            self._arm(phase)

    def _arm(self, phase: str | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = phase
        if phase is not None and not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.header_timeout_s if phase == "head" else self.body_timeout_s, self._expired)

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        begun = bool(self.conn.trailing_data[0]) if self._phase == "head" else not (self.cycle and self.cycle.response_started)
        if begun:  # raw bytes: h11 cannot answer a request whose head it has not parsed
            what = "request line and headers" if self._phase == "head" else "request body"
            seconds = self.header_timeout_s if self._phase == "head" else self.body_timeout_s
            body = f'{{"error": "the {what} did not arrive within {seconds:g}s; send the whole request at once"}}'.encode()
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
        log.debug("closed a connection whose %s did not arrive in time", self._phase)
        self.transport.close()


def bounded_protocol(header_timeout_s: float, body_timeout_s: float) -> type[BoundedH11Protocol]:
    """The protocol class for uvicorn.Config(http=...) with these bounds (uvicorn builds one instance per connection)."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s})


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, so a taken port is one clear error instead of a uvicorn traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port or --host") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def uvicorn_server(app, config: ServeConfig) -> uvicorn.Server:
    # In-flight requests may take up to the request timeout; SIGTERM waits that long for them. h11 with the request
    # deadlines (httptools, uvicorn's other parser, would need the same subclass); no WebSocket upgrade, which would
    # hand the connection to a protocol without them (the app has no WebSocket route).
    http = bounded_protocol(config.header_timeout_s, config.body_timeout_s + BODY_GRACE_S)
    return uvicorn.Server(uvicorn.Config(app, access_log=False, log_level="info", lifespan="on", http=http, ws="none",
                                         timeout_graceful_shutdown=config.timeout_s + 5, timeout_keep_alive=KEEP_ALIVE_S))


def bound_config(config: ServeConfig, host: str) -> ServeConfig:
    """The config that also serves the Host name of the address it listens on, saying in the log
    which names it serves when that is not a loopback one, and which requests the queue cannot hold."""
    config = replace(config, allowed_hosts=(*config.allowed_hosts, host))
    if host_name(host) not in LOOPBACK_HOSTS and "*" not in config.allowed_hosts:
        log.info("answering only the Host names %s and %s; name the others clients use with --allow-host NAME",
                 ", ".join(LOOPBACK_HOSTS), ", ".join(config.allowed_hosts))
    if config.max_sentences > config.policy.queue_size:
        log.warning("--max-sentences %d is more than --queue-size %d: requests of more than %d sentences get 413",
                    config.max_sentences, config.policy.queue_size, config.policy.queue_size)
    return config


def serve(models: Callable[[], TranslationModel] | Sequence[ModelSpec], host: str, port: int, config: ServeConfig) -> None:
    """Serves until SIGTERM or Ctrl-C: then it stops accepting connections, finishes the requests
    in flight, stops the decoding workers and exits 0 (130 for Ctrl-C). models: as create_app takes them."""
    sock = bind(host, port)
    setup_logging()
    config = bound_config(config, host)
    app = create_app(models, config)
    server = uvicorn_server(app, config)
    # uvicorn re-raises the signal it caught once it has shut down; these make that a clean exit.
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *a: sys.exit(130))
    shown = f"[{host}]" if ":" in host else host
    log.info("serving %s on http://%s:%d (page /, API /v1/translate, LibreTranslate's /translate and /languages, schema /openapi.json)",
             printable(config.description), shown,
             sock.getsockname()[1])
    server.run(sockets=[sock])
