"""Runs the app on uvicorn: binds the port, logs, and shuts down gracefully on SIGTERM."""

from __future__ import annotations

import logging
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import replace

import uvicorn

from toolkit.core.errors import UsageError
from toolkit.deploy.translate import TranslationModel
from toolkit.serve.app import LOOPBACK_HOSTS, ServeConfig, create_app, host_name, printable

log = logging.getLogger("tk.serve")
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this


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
    # In-flight requests may take up to the request timeout; SIGTERM waits that long for them.
    return uvicorn.Server(uvicorn.Config(app, access_log=False, log_level="info", lifespan="on",
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


def serve(load: Callable[[], TranslationModel], host: str, port: int, config: ServeConfig) -> None:
    """Serves until SIGTERM or Ctrl-C: then it stops accepting connections, finishes the requests
    in flight, stops the decoding worker and exits 0 (130 for Ctrl-C)."""
    sock = bind(host, port)
    setup_logging()
    config = bound_config(config, host)
    app = create_app(load, config)
    server = uvicorn_server(app, config)
    # uvicorn re-raises the signal it caught once it has shut down; these make that a clean exit.
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *a: sys.exit(130))
    shown = f"[{host}]" if ":" in host else host
    log.info("serving %s on http://%s:%d (page /, API /v1/translate, schema /openapi.json)", printable(config.description), shown,
             sock.getsockname()[1])
    server.run(sockets=[sock])
