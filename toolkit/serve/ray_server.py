"""`tk serve --ray`: deploys the server on Ray Serve, on a Ray cluster it joins (--ray-address) or a local one it starts,
then waits: SIGHUP deploys the model directories again (a rolling update: new replicas load the new export while the
old ones finish their requests), SIGTERM or Ctrl-C take the application down and leave the cluster as it was found.

HTTP is served by Ray Serve's proxy on the cluster's head node, at --host and --port. A model directory must be at the
same path on every node (a shared volume, or the image).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from toolkit.core import signals
from toolkit.core.errors import ToolkitError, UsageError, first_line
from toolkit.serve.app import ModelSpec, ServeConfig
from toolkit.serve.middleware import printable
from toolkit.serve.ray_app import APP_NAME, SERVE_LOGGING, Replicas, plan_specs
from toolkit.serve.server import bind, bound_config, setup_logging

log = logging.getLogger("tk.serve")
CONNECT_TIMEOUT_S = 5.0
WATCH_S = 5.0  # how often the driver checks that its application still runs


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None  # None: start a local Ray for the life of the server
    replicas: Replicas = Replicas()
    cpus: int = 1  # CPUs each model replica reserves (its model's threads)


@dataclass(frozen=True)
class RayPlan:
    """tk serve --ray's arguments: what to deploy (read again from the directories on SIGHUP) and where."""

    arguments: tuple[str, ...]
    provider: str | None
    variant: str | None
    runtime: str
    languages: dict
    no_batching: bool
    options: RayOptions

    @classmethod
    def from_options(cls, arguments: tuple[str, ...], provider: str | None, variant: str | None, threads: int | None, runtime: str,
                     languages: dict, no_batching: bool, address: str | None, replicas: str | None, scaling: dict) -> RayPlan:
        check_address(address)
        options = RayOptions(address, Replicas.parse(replicas if replicas is not None else "1", **scaling), threads or 1)
        return cls(arguments, provider, variant, runtime, languages, no_batching, options)

    def specs(self) -> tuple[list[ModelSpec], tuple[str, str] | None]:
        return plan_specs(self.arguments, self.provider, self.variant, self.options.cpus, self.runtime, self.languages, self.no_batching)

    def serve(self, specs: Sequence[ModelSpec], host: str, port: int, config: ServeConfig) -> None:
        serve_on_ray(specs, host, port, config, self.options, self.specs)


def check_address(address: str | None) -> None:
    """--ray-address is HOST:PORT, auto or ray://HOST:PORT: anything else is one line before anything starts."""
    if address is None or address == "auto" or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--ray-address {address} is not HOST:PORT (the head's GCS port, 6379 by default), auto, or ray://HOST:PORT")


def reachable(address: str | None) -> None:
    """A HOST:PORT address is tried once before Ray is: Ray retries an unreachable one for minutes."""
    check_address(address)
    if address is None or address == "auto" or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        why = f"no answer within {CONNECT_TIMEOUT_S:.0f} s" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise UsageError(f"cannot reach a Ray cluster at {address} ({why}); check --ray-address and that the cluster is up") from None


def connect(address: str | None):
    """Joins the cluster at `address`, or starts a local Ray (never another process's: address "local") whose processes
    end with this one however it ends (toolkit.core.reaper)."""
    import ray

    from toolkit.core import reaper

    os.environ.setdefault("RAY_worker_niceness", "0")  # Ray starts workers at nice 15: replicas would get what is left of the CPU
    reachable(address)
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the driver's "started Serve", "app ready": tk logs its own
    if not address:
        reaper.watch_descendants()
    try:
        # A local Ray's replicas log to this process, as tk serve does; a cluster's stay on their nodes, in Ray's log files.
        ray.init(address=address or "local", logging_level=logging.ERROR, log_to_driver=not address, include_dashboard=False)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise UsageError(f"cannot reach a Ray cluster at {address} ({str(e).splitlines()[0][:160]}); check --ray-address") from None
    return ray


def serve_running() -> bool:
    """Whether Ray Serve already runs on the cluster (its controller actor exists)."""
    import ray

    try:
        ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    except ValueError:
        return False
    return True


def start_serve(host: str, port: int) -> None:
    """Starts Ray Serve's HTTP proxy on the head node at host:port; where Serve already runs on another address (its
    options cannot change while it runs) that is one line naming it."""
    from ray import serve
    from ray.serve.context import _get_global_client

    serve.start(http_options={"host": host, "port": port}, proxy_location="HeadOnly", logging_config=SERVE_LOGGING)
    http = _get_global_client().http_config
    if (http.host, http.port) != (host, port):
        raise UsageError(f"Ray Serve already runs on this cluster at {http.host}:{http.port}; start tk serve --ray with --host {http.host} "
                         f"--port {http.port}, or stop Serve first (serve shutdown)")


def refuse_another_tk() -> None:
    """One tk application per cluster (Serve has one HTTP address): another tk serve --ray's is not taken over."""
    from ray import serve

    if APP_NAME in serve.status().applications:
        raise UsageError(f"a tk application already runs on this Ray cluster (another tk serve --ray); stop that one first, or, if it is "
                         f"gone, delete the application: serve.delete('{APP_NAME}') from Python on the cluster")


def deploy(specs: Sequence[ModelSpec], config: ServeConfig, options: RayOptions) -> None:
    """Deploys (or redeploys: a rolling update) the application and waits until it runs; a deployment that cannot start
    (a model that does not load on its replicas) is one line saying why."""
    from ray import serve

    from toolkit.serve.ray_app import build_application

    try:
        serve.run(build_application(specs, config, options.replicas, options.cpus), name=APP_NAME, route_prefix="/",
                  logging_config=SERVE_LOGGING)
    except RuntimeError as e:  # Ray Serve says "Failed to update the deployments [...]": each deployment's status says why
        raise ToolkitError(f"tk serve --ray could not start its replicas: {why_failed() or first_line(e)}") from None


def why_failed() -> str:
    """What each failed deployment of the application died of: the last line of its status (its exception)."""
    from ray import serve

    with contextlib.suppress(Exception):
        app = serve.status().applications.get(APP_NAME)
        failed = [(name, [line.strip() for line in d.message.splitlines() if line.strip()]) for name, d in (app.deployments.items() if app else ())
                  if str(d.status).endswith(("UNHEALTHY", "DEPLOY_FAILED"))]
        return "; ".join(f"{name}: {re.sub(r'^[A-Za-z_.]*(Error|Exception): ', '', lines[-1])}" for name, lines in failed if lines)
    return ""


def free_port(host: str) -> int:
    sock = bind(host, 0)
    port = sock.getsockname()[1]
    sock.close()
    return port


def serve_on_ray(specs: Sequence[ModelSpec], host: str, port: int, config: ServeConfig, options: RayOptions,
                 replan: Callable[[], tuple[list[ModelSpec], tuple[str, str] | None]]) -> None:
    """Serves on Ray until SIGTERM (exit 0) or Ctrl-C (exit 130); SIGHUP reads the model directories again and
    redeploys them (replan gives their specs). models: as create_app takes them."""
    setup_logging()
    local = options.address is None
    if local:  # the proxy binds on this machine: a taken port is one line here, not a failed proxy actor
        port = port or free_port(host)
        bind(host, port).close()
    elif port == 0:
        raise UsageError("--port 0 picks a free port on this machine, but Ray Serve listens on the cluster's head node; give --port")
    config = bound_config(config, host)
    ray = connect(options.address)
    found_serve, ours, code = serve_running(), False, 0
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a redeploy before the first deploy is done has nothing to update
    try:
        start_serve(host, port)
        refuse_another_tk()
        ours = True
        log.info("deploying %s on Ray %s: replicas %d:%d per model, %d CPU each", printable(config.description), ray.__version__,
                 options.replicas.min, options.replicas.max, options.cpus)
        deploy(specs, config, options)
        shown = f"[{host}]" if ":" in host else host
        log.info("serving %s on http://%s:%d (Ray Serve; page /, API /v1/translate, LibreTranslate's /translate and /languages, "
                 "replicas /replicas; SIGHUP redeploys the models)", printable(config.description), shown, port)
        code = wait(lambda: redeploy(config, options, replan))
    finally:
        signals.exit_at_once()  # a second signal while the application drains: stop now
        stop(found_serve, local, ours)
    if code:
        raise SystemExit(code)


def redeploy(config: ServeConfig, options: RayOptions, replan: Callable) -> None:
    """SIGHUP: the model directories read again and deployed as a rolling update; a directory that no longer reads is one
    line in the log, and the running models go on serving."""
    try:
        specs, default = replan()
    except UsageError as e:
        log.error("not redeployed: %s; still serving the models deployed before", e)
        return
    config = replace(config, description="; ".join(s.description for s in specs), default_pair=default)
    log.info("redeploying %s (rolling update)", printable(config.description))
    start = time.perf_counter()
    try:
        deploy(specs, config, options)
    except Exception as e:  # noqa: BLE001 - a failed redeploy is reported; the server stays up with what Ray Serve runs
        log.error("redeploy failed (%s: %s); Ray Serve keeps what it could run", type(e).__name__, str(e).splitlines()[0][:300])
        return
    log.info("redeployed in %.1f s", time.perf_counter() - start)


def wait(redeploy: Callable[[], None]) -> int:
    """Waits for SIGTERM (0), Ctrl-C (130) or the application's end (1); SIGHUP runs redeploy."""
    from ray import serve

    woken = threading.Event()
    got: dict[str, int] = {}

    def on(name: str, code: int | None):
        def handler(signum, frame):
            got[name] = code if code is not None else got.get(name, 0)
            woken.set()
        return handler

    signal.signal(signal.SIGTERM, on("stop", 0))
    signal.signal(signal.SIGINT, on("stop", 130))
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, on("reload", None))
    checked = time.monotonic()
    while "stop" not in got:
        woken.wait(1.0)
        woken.clear()
        if got.pop("reload", None) is not None:
            redeploy()
        if time.monotonic() - checked > WATCH_S:
            checked = time.monotonic()
            with contextlib.suppress(Exception):  # a slow controller is no reason to stop serving
                if APP_NAME not in serve.status().applications:
                    log.error("the %s application was deleted from the Ray cluster; stopping", APP_NAME)
                    return 1
    return got["stop"]


def stop(found_serve: bool, local: bool, ours: bool) -> None:
    """Takes the application down where this process deployed it (Ray Serve lets its replicas answer what they hold), and
    Serve itself where this process started it; a local Ray stops with it."""
    import ray
    from ray import serve

    try:
        if ours:
            with contextlib.suppress(Exception):
                serve.delete(APP_NAME)
        if not found_serve and not local:  # a local Ray's Serve ends with it
            with contextlib.suppress(Exception):
                serve.shutdown()
    finally:
        ray.shutdown()
    log.info("shut down cleanly: in-flight requests answered, replicas stopped%s", ", local Ray stopped" if local else "")
