"""`tk serve --ray`: the same HTTP app, its models served by Ray Serve replicas across a cluster.

An ingress deployment runs create_app, the routes of `tk serve` unchanged, with one RemoteBatcher per model in place of
the local Batcher; each model is a deployment of its own whose replicas each load the model and batch the sentences of
the requests they get across requests (a local Batcher per replica), autoscaled on the requests waiting on them.
A replica that dies while translating a request costs that request a retry on another replica, or a 503 with
Retry-After once the retries are spent: never a 500. Torch-free: the replicas load models as `tk translate` does.

KubeRay's RayService (and `serve run`) build the application from `toolkit.serve.ray_app:app_builder` with the
arguments of `tk serve` as a dict (docs/deployment.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ray
from ray import serve
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

from toolkit.core.errors import UsageError
from toolkit.deploy.translate import Translation, TranslationModel
from toolkit.serve.app import ModelSpec, ServeConfig, create_app
from toolkit.serve.batcher import Batcher, BatchPolicy, NotReady, OptionKey, QueueFull, TooLarge
from toolkit.serve.metrics import Metrics
from toolkit.serve.options import RAY_ARGUMENTS, SETTINGS, default, fields

log = logging.getLogger("tk.serve")

APP_NAME = "tk"
INGRESS = "ingress"
REPLICA_HEADER = "X-TK-Replica"  # which model replicas (deployment:replica@node) translated a request
# A replica's process or node went away with the request on it: the request is sent again, to a live replica.
REPLICA_GONE = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.ObjectLostError, ray.exceptions.LocalRayletDiedError, DeploymentUnavailableError, ReplicaUnavailableError)
RETRIES = 2  # sends of a request after the first when its replica dies; then 503 with Retry-After
PING_S = 2.0  # how often the ingress asks a model deployment whether a replica answers (/ready)
PING_TIMEOUT_S = 5.0
LOAD_TIMEOUT_S = 600.0  # a replica whose model is not loaded and warmed up by then is failed (and replaced)

# Autoscaling between --replicas MIN:MAX. A replica is asked for more when over TARGET_ONGOING requests wait on it on
# average (its batcher decodes them together, so a few waiting is what batching needs; many is a queue). Translation
# replicas load in seconds, so the autoscaler reacts within seconds rather than Ray's defaults of 30 s up and 10 min
# down (--downscale-delay-s, 30 s by default), looking back far enough that one burst does not flap it.
TARGET_ONGOING = 16
AUTOSCALING = {"upscale_delay_s": 3.0, "look_back_period_s": 10.0, "metrics_interval_s": 1.0}
INGRESS_TARGET_ONGOING = 256  # the ingress only parses and forwards: it scales on many more concurrent requests
HEALTH_CHECK_PERIOD_S = 2.0  # a replica whose decoding worker stopped is replaced within seconds
HEALTH_CHECK_TIMEOUT_S = 10.0

# Ray Serve's own logs are kept to warnings (no access line per request, no line per deployment step): tk's ingress
# logs one line per request itself, as tk serve does.
SERVE_LOGGING = {"log_level": "WARNING", "enable_access_log": False}

_served_by: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("tk_served_by", default=None)


@dataclass(frozen=True)
class LoadModel:
    """How a replica loads its model (a ModelSpec's load that travels to the replica: a model directory at the same path
    on every node, opened as tk translate opens it, with the replica's CPUs as its threads)."""

    directory: str
    provider: str | None
    variant: str | None
    threads: int
    runtime: str

    def __call__(self) -> TranslationModel:
        from toolkit.deploy.translate import open_model

        return open_model(self.directory, self.provider, self.variant, threads=self.threads, runtime=self.runtime)


@dataclass(frozen=True)
class Replicas:
    """--replicas MIN:MAX: each model's replicas, autoscaled between the two on the requests waiting on them."""

    min: int = 1
    max: int = 1
    downscale_delay_s: float = default("scaling.downscale_delay_s")

    @classmethod
    def parse(cls, text: str, **scaling: float) -> Replicas:
        """--replicas's text, with the Replicas fields of the scaling options (toolkit.serve.options.SCALING)."""
        found = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
        if not found:
            raise UsageError(f"--replicas {text!r} is not N or MIN:MAX; give e.g. 2, or 1:4 to autoscale between 1 and 4")
        low = int(found.group(1))
        high = int(found.group(2)) if found.group(2) is not None else low
        if low < 1 or high > 1024 or low > high:
            raise UsageError(f"--replicas {text}: give 1 <= MIN <= MAX <= 1024 (MIN:MAX autoscales between them, N is fixed)")
        return cls(low, high, **scaling)

    def scaling(self, target: float) -> dict:
        """A deployment's options for these replicas: a fixed count, or autoscaling on ongoing requests."""
        if self.min == self.max:
            return {"num_replicas": self.min}
        return {"autoscaling_config": {"min_replicas": self.min, "max_replicas": self.max, "target_ongoing_requests": target,
                                       "downscale_delay_s": self.downscale_delay_s, **AUTOSCALING}}


# The model side: a replica of one model's deployment.

class ModelReplica:
    """One replica of a model: loads it, warms it up, and translates the requests it gets with a local Batcher (sentences
    of concurrent requests decoded together, as in tk serve on one machine). Tells Ray Serve it is unhealthy once its
    decoding worker has stopped, so it is replaced."""

    async def __init__(self, spec: ModelSpec, policy: BatchPolicy, timeout_s: float):
        from toolkit.serve.server import setup_logging

        setup_logging()
        self.batcher = Batcher(spec.load, policy, Metrics())
        self.batcher.start()
        await asyncio.to_thread(self._wait_loaded)
        if not self.batcher.healthy:  # the replica fails to start, saying why; Ray Serve tries again
            raise RuntimeError(self.batcher.not_ready_reason())
        self.timeout_s = timeout_s
        context = serve.get_replica_context()
        self.name = f"{context.deployment}:{context.replica_id.unique_id}@{ray.get_runtime_context().get_node_id()[:12]}"
        log.info("replica %s ready: %s", self.name, spec.description)

    def _wait_loaded(self) -> None:
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while not self.batcher.ready.wait(0.1):
            if self.batcher.failed is not None or time.monotonic() > deadline:
                return

    async def translate(self, texts: list[str], key: OptionKey, seconds: float | None) -> dict:
        """The batcher's answer as data: {"translations", "replica"}, or {"error": kind, "message"} for the refusals the
        ingress answers with a status. The deadline travels as seconds left: two machines' monotonic clocks differ."""
        deadline = time.monotonic() + seconds if seconds is not None else math.inf
        try:
            return {"translations": await self.batcher.translate(texts, key, deadline), "replica": self.name}
        except (TooLarge, QueueFull, NotReady, UsageError, TimeoutError) as e:
            kind = "UsageError" if isinstance(e, UsageError) else type(e).__name__
            return {"error": kind, "message": str(e), "replica": self.name}

    async def ready(self) -> bool:
        return self.batcher.healthy

    def check_health(self) -> None:
        if not self.batcher.healthy:
            raise RuntimeError(self.batcher.not_ready_reason())

    def __del__(self) -> None:
        # Ray Serve calls this once the replica's requests are answered (graceful shutdown): stop the decoding worker.
        batcher = getattr(self, "batcher", None)
        if batcher is not None:
            batcher.close(getattr(self, "timeout_s", 30.0))


# The ingress side: what create_app's routes call for a model.

ERRORS = {"TooLarge": TooLarge, "QueueFull": QueueFull, "NotReady": NotReady, "UsageError": UsageError, "TimeoutError": TimeoutError}


class RemoteBatcher:
    """A model's batcher for create_app, its sentences translated by the model's Ray Serve deployment: Batcher's
    interface (translate, start, close, healthy, not_ready_reason, depth, policy), each request one call on a replica.
    A replica that dies with the request on it: the request goes to another, RETRIES times, then NotReady (503 with
    Retry-After). Ray Serve's own back-pressure is QueueFull (503 with Retry-After too)."""

    def __init__(self, handle, policy: BatchPolicy, name: str):
        self.handle = handle
        self.policy = policy
        self.name = name
        self._in_flight = 0
        self._healthy = False
        self._reason = "no replica has answered yet (the model is still loading)"
        self._watch: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False

    @property
    def depth(self) -> int:
        """Texts this ingress has sent to the model's replicas and not yet had back."""
        return self._in_flight

    @property
    def healthy(self) -> bool:
        return self._healthy and not self._closing

    def not_ready_reason(self) -> str:
        return "shutting down" if self._closing else self._reason

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._watch = self._loop.create_task(self._ping())

    def close(self, timeout: float | None = None) -> None:
        self._closing = True
        if self._watch is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._watch.cancel)

    async def _ping(self) -> None:
        """Keeps `healthy` current: whether a replica of the model answers, and is loaded, within PING_TIMEOUT_S."""
        while not self._closing:
            response = self.handle.ready.remote()
            try:
                self._healthy = await asyncio.wait_for(_awaited(response), PING_TIMEOUT_S)
                self._reason = "" if self._healthy else "the model's replicas are loading"
            except asyncio.TimeoutError:
                response.cancel()  # pings must not pile up where no replica takes them
                self._healthy, self._reason = False, f"no replica of {self.name} answered within {PING_TIMEOUT_S:g}s"
            except Exception as e:  # noqa: BLE001 - any failure to reach a replica is "not ready", said in one line
                self._healthy, self._reason = False, f"{self.name}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            await asyncio.sleep(PING_S)

    async def translate(self, texts: list[str], key: OptionKey, deadline: float = math.inf) -> list[list[Translation]]:
        """As Batcher.translate, on a replica of the model's deployment."""
        self.policy.admit(len(texts))
        if self._closing:
            raise NotReady("shutting down")
        self._in_flight += len(texts)
        try:
            answer = await self._sent(texts, key, deadline)
        finally:
            self._in_flight -= len(texts)
        served = _served_by.get()
        if served is not None:
            served.append(answer["replica"])
        if "error" in answer:
            raise ERRORS[answer["error"]](answer["message"])
        return answer["translations"]

    async def _sent(self, texts: list[str], key: OptionKey, deadline: float) -> dict:
        """The replica's answer. A replica that dies with the request, or that is not ready for it (stopping in a rolling
        update, or its decoding worker stopped), has the request sent to another, RETRIES times at most."""
        why = ""
        for attempt in range(RETRIES + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("deadline passed before a replica took the request")
            response = self.handle.translate.remote(texts, key, None if math.isinf(left) else left)
            try:
                answer = await response
            except asyncio.CancelledError:
                response.cancel()  # timed out, or its client went away: its sentences leave the replica's queue too
                raise
            except BackPressureError as e:
                raise QueueFull(f"every replica of {self.name} is full ({str(e).splitlines()[0][:160]})") from None
            except REPLICA_GONE as e:
                why = f"a replica went away with it ({type(e).__name__})"
            else:
                if answer.get("error") != "NotReady":
                    return answer
                why = f"a replica was not ready ({answer['message']})"
            log.warning("a request to %s: %s; %s", self.name, why, "sending it again" if attempt < RETRIES else "answering 503")
        raise NotReady(f"{self.name}: {why}, {RETRIES + 1} times; retry")


async def _awaited(response):
    return await response


class ReplicaHeader:
    """ASGI middleware naming, in the X-TK-Replica header of each translation's answer, the model replicas (deployment,
    replica and node) that translated it: which machine answered, for operators and load tests."""

    def __init__(self, app):
        self.app = app

    def __getattr__(self, name):  # Ray Serve and tests reach the FastAPI app through here, as through RequestLog
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        served: list[str] = []
        token = _served_by.set(served)  # tasks the app starts copy the context: they append to this same list

        async def send_named(message):
            if message["type"] == "http.response.start" and served:
                named = ", ".join(dict.fromkeys(served)).encode()
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER.lower().encode(), named)]}
            await send(message)

        try:
            await self.app(scope, receive, send_named)
        finally:
            _served_by.reset(token)


class Ingress:
    """The HTTP side on Ray Serve: create_app's routes with a RemoteBatcher per model (built on the replica, where the
    deployment handles are live), behind ReplicaHeader; GET /replicas says how many replicas each model runs."""

    def __init__(self, specs: Sequence[ModelSpec], config: ServeConfig, names: Sequence[str], *handles):
        self.specs, self.config, self.names, self.handles = list(specs), config, list(names), handles

    def __serve_build_asgi_app__(self):
        from toolkit.serve.server import setup_logging

        setup_logging()
        batchers = [RemoteBatcher(h, self.config.policy, name) for h, name in zip(self.handles, self.names)]
        app = create_app(self.specs, self.config, batchers=batchers)
        names, app_name = self.names, serve.get_replica_context().app_name  # tk's, or the name a RayService gave it

        @app.app.get("/replicas")
        async def replicas():
            """The replicas of each model's deployment on the Ray cluster, by state (RUNNING, STARTING, ...)."""
            status = await asyncio.to_thread(serve.status)
            deployments = status.applications[app_name].deployments if app_name in status.applications else {}
            return {name: {str(getattr(s, "value", s)): n for s, n in deployments[name].replica_states.items()} if name in deployments else {}
                    for name in names}

        return ReplicaHeader(app)


def deployment_name(index: int, spec: ModelSpec) -> str:
    """A model's deployment name: its place and its directory's name, in the characters Ray's names allow."""
    directory = getattr(spec.load, "directory", "") or f"model{index}"
    return f"model-{index}-" + (re.sub(r"[^A-Za-z0-9_-]+", "_", Path(directory).name)[:40] or "model")


def resources(spec: ModelSpec, cpus: float) -> dict:
    """What one replica of a model reserves: its threads' CPUs, and one GPU where it decodes on CUDA (Ray then gives it
    that GPU alone)."""
    return {"num_cpus": cpus, **({"num_gpus": 1} if getattr(spec.load, "provider", None) == "cuda" else {})}


def build_application(specs: Sequence[ModelSpec], config: ServeConfig, replicas: Replicas, cpus: float = 1.0):
    """The Ray Serve application: an ingress (no CPU of its own: it parses and forwards) and one deployment per model,
    each replica reserving `cpus` CPUs (its model's threads), and a GPU for --provider cuda, so replicas spread over the
    nodes that have them."""
    with warnings.catch_warnings():
        # metrics_interval_s is to become environment variables set on every node, which tk cannot do from here; until
        # then it is what makes the autoscaler see the load within a second rather than ten.
        warnings.filterwarnings("ignore", message=".*metrics_interval_s", category=DeprecationWarning)
        return _built(specs, config, replicas, cpus)


def _built(specs: Sequence[ModelSpec], config: ServeConfig, replicas: Replicas, cpus: float):
    names = [deployment_name(i, s) for i, s in enumerate(specs)]
    # Ray Serve queues requests beyond max_ongoing_requests outside the replica, where tk's batcher cannot batch them:
    # tk's own queue (--queue-size sentences, 503 beyond) is the limit that counts.
    ongoing = max(64, config.policy.queue_size)
    shutdown = {"graceful_shutdown_timeout_s": config.timeout_s + 5, "graceful_shutdown_wait_loop_s": 0.5}
    models = [serve.deployment(ModelReplica).options(
        name=name, ray_actor_options=resources(spec, cpus), max_ongoing_requests=ongoing, health_check_period_s=HEALTH_CHECK_PERIOD_S,
        health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S, **replicas.scaling(TARGET_ONGOING), **shutdown).bind(spec, config.policy, config.timeout_s)
        for name, spec in zip(names, specs)]
    ingress = serve.deployment(serve.ingress()(Ingress)).options(
        name=INGRESS, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=ongoing, **replicas.scaling(INGRESS_TARGET_ONGOING), **shutdown)
    return ingress.bind(specs, config, names, *models)


def plan_specs(arguments: tuple[str, ...], provider: str | None, variant: str | None, threads: int, runtime: str, languages: dict,
               no_batching: bool = False) -> tuple[list[ModelSpec], tuple[str, str] | None]:
    """The ModelSpecs of tk serve's model arguments for Ray replicas, read from the manifests (the driver loads no model:
    each replica loads its own), and the pair a request naming none gets; every pair and code checked as tk serve does."""
    from toolkit.core import manifest as manifest_mod
    from toolkit.serve.plan import default_pair, plan_models

    planned = plan_models(arguments)
    default = default_pair(planned, **languages)
    specs = [ModelSpec(LoadModel(p.directory, provider, variant, threads, runtime), p.pairs,
                       f"{Path(p.directory).name} ({manifest_mod.load(p.directory).model}) on Ray Serve replicas, {p.shown()}"
                       + (", batching off" if no_batching else ""), p.codes, p.fills) for p in planned]
    return specs, default


def listed(value: str | Sequence[str]) -> tuple[str, ...]:
    """A list argument as YAML gives it, or as `serve run`'s key=value gives it: one string, comma-separated."""
    return tuple(v.strip() for v in value.split(",") if v.strip()) if isinstance(value, str) else tuple(value)


def limits_given(args: dict) -> dict:
    """The declared options of tk serve in `args` (toolkit.serve.options.SETTINGS: its limits and scaling), each as its type and within its range
    (as `tk serve` takes them); one that is not is one line naming it."""
    out = {}
    for o in SETTINGS:
        if o.name not in args:
            continue
        try:
            value = o.kind(args[o.name])
        except (TypeError, ValueError):
            raise UsageError(f"{o.name} must be a number, got {args[o.name]!r:.40}") from None
        if not (o.low < value if o.low_open else o.low <= value) or value > o.high or value != value:
            raise UsageError(f"{o.name} must be from {o.low:g} to {o.high:g}{' (not 0)' if o.low_open else ''}, got {args[o.name]!r:.40}")
        out[o.name] = value
    return out


def app_builder(args: dict):
    """The application from tk serve's arguments as a dict, for a RayService's serveConfigV2 (import_path
    toolkit.serve.ray_app:app_builder) or `serve run`: models (DIR[:SOURCE-TARGET] list, or one string of them separated
    by commas), replicas ("N" or "MIN:MAX"), and optionally the others of toolkit.serve.options.RAY_ARGUMENTS (threads,
    provider, variant, runtime, source_lang, target_lang, allow_hosts, the batching and request limits and downscale_delay_s, by
    tk serve's option names). What it leaves out takes tk serve's defaults."""
    unknown = sorted(set(args) - set(RAY_ARGUMENTS))
    if unknown:
        raise UsageError(f"unknown argument(s) {', '.join(unknown)} for toolkit.serve.ray_app:app_builder; known: {', '.join(sorted(RAY_ARGUMENTS))}")
    if not args.get("models"):
        raise UsageError("give models: a list of model directories (DIR or DIR:SOURCE-TARGET), at the same path on every node")
    from toolkit.runtimes.registry import DEFAULT as DEFAULT_RUNTIME

    try:
        threads = int(args.get("threads") or 1)
    except (TypeError, ValueError):
        raise UsageError(f"threads must be a number, got {args['threads']!r:.40}") from None
    limits = limits_given(args)
    specs, default = plan_specs(listed(args["models"]), args.get("provider"), args.get("variant"), threads, args.get("runtime") or DEFAULT_RUNTIME,
                                {"source_lang": args.get("source_lang"), "target_lang": args.get("target_lang")})
    config = ServeConfig(policy=BatchPolicy(**fields(limits, "policy")), description="; ".join(s.description for s in specs),
                         allowed_hosts=listed(args.get("allow_hosts", ())), default_pair=default, **fields(limits, "config"))
    return build_application(specs, config, Replicas.parse(str(args.get("replicas", "1")), **fields(limits, "scaling")), threads)
