"""The HTTP side of `tk serve`: FastAPI routes, limits, error bodies, one log line per request.

Every error answers `{"error": "one line"}` with its status; no traceback reaches a client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException

from toolkit.deploy.translate import TranslationModel
from toolkit.serve.batcher import Batcher, BatchPolicy, NotReady, OptionKey, QueueFull
from toolkit.serve.metrics import Metrics

log = logging.getLogger("tk.serve")
PAGE = Path(__file__).with_name("page.html")
MAX_BEAM = 16


@dataclass(frozen=True)
class ServeConfig:
    policy: BatchPolicy = field(default_factory=BatchPolicy)
    max_sentences: int = 64  # per request
    max_chars: int = 1000  # per sentence
    timeout_s: float = 30.0  # per request, queue wait included
    retry_after_s: int = 1  # told to clients refused for a full queue
    description: str = ""  # model, variant and provider, for the page and the log

    @property
    def max_body_bytes(self) -> int:
        return self.max_sentences * (4 * self.max_chars + 16) + 4096  # UTF-8 and JSON escapes of the largest valid request


class TranslateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str | list[str] = Field(description="One English sentence, or a list of them", examples=["I'm home."])
    beam: int = Field(1, ge=1, le=MAX_BEAM, description="Beam size; 1 is greedy search")
    n_best: int = Field(1, ge=1, le=MAX_BEAM, description="Hypotheses returned per sentence, at most beam")
    alpha: float = Field(0.6, ge=0.0, le=5.0, description="Length penalty exponent for beam search")
    max_len: int | None = Field(None, ge=1, description="Longest translation in subword tokens [default: the model's maximum]")

    @model_validator(mode="after")
    def _n_best_within_beam(self):
        if self.n_best > self.beam:
            raise ValueError(f"n_best ({self.n_best}) must not exceed beam ({self.beam})")
        return self


class Hypothesis(BaseModel):
    text: str
    score: float


class TranslateResponse(BaseModel):
    translations: list[str] = Field(description="The best translation of each input sentence, in input order")
    scores: list[float] = Field(description="Length-normalised log-probability of each best translation")
    n_best: list[list[Hypothesis]] | None = Field(None, description="With n_best > 1: every hypothesis of each sentence, best first")
    latency_ms: float


class ErrorBody(BaseModel):
    error: str


def error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


# Over 60 lines: FastAPI routes are closures over this app's batcher, limits and metrics, declared inside the factory.
def create_app(load: Callable[[], TranslationModel], config: ServeConfig | None = None) -> FastAPI:
    """The server's ASGI app; `load` opens the model on the decoding worker (use translate.open_model)."""
    config = config or ServeConfig()
    metrics = Metrics()
    batcher = Batcher(load, config.policy, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        yield
        # uvicorn has already finished the in-flight requests; this stops the worker.
        await asyncio.to_thread(batcher.close, config.timeout_s)
        log.info("shut down cleanly: in-flight requests answered, decoding worker stopped")

    app = FastAPI(title="tk serve", version="1", lifespan=lifespan,
                  description="English to French translation with the exported ONNX graphs, batched across requests.")
    app.state.batcher = batcher
    app.state.metrics = metrics
    errors = {400: {"model": ErrorBody}, 413: {"model": ErrorBody}, 422: {"model": ErrorBody}, 503: {"model": ErrorBody},
              504: {"model": ErrorBody}}

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        if first.get("type") == "json_invalid":
            return error(400, f"malformed JSON: {first.get('ctx', {}).get('error', 'cannot parse the body')}; send a JSON object like "
                              '{"text": "I\'m home."}')
        if tuple(first.get("loc", ())) == ("body",) and "json" not in request.headers.get("content-type", "json"):
            return error(400, f"the body is {request.headers['content-type']}, not JSON; send JSON with Content-Type: application/json")
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        if first.get("type") == "value_error":  # from our own validator, whose message names the fields
            return error(422, first.get("msg", "invalid").removeprefix("Value error, "))
        return error(422, f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception):
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return error(500, "internal error; the server log has the details")

    @app.post("/v1/translate", response_model=TranslateResponse, responses=errors, response_model_exclude_none=True)
    async def translate(req: TranslateRequest, request: Request):
        """Translates English to French. Sentences of concurrent requests are decoded together."""
        start = time.perf_counter()
        texts = [req.text] if isinstance(req.text, str) else req.text
        request.state.sentences = len(texts)
        if not texts:
            return error(422, "text: give at least one sentence")
        if len(texts) > config.max_sentences:
            return error(413, f"{len(texts)} sentences in one request, limit {config.max_sentences}; split the request")
        for k, t in enumerate(texts):
            if len(t) > config.max_chars:
                return error(413, f"sentence {k} has {len(t)} characters, limit {config.max_chars}; split it into sentences")
        t = batcher.translator
        max_len = min(req.max_len or t.manifest.max_len, t.manifest.max_len) if t else 0
        key = OptionKey(req.beam, req.n_best, req.alpha, max_len)
        try:
            results = await asyncio.wait_for(batcher.translate(texts, key), config.timeout_s)
        except QueueFull as e:
            return error(503, f"server busy: {e}; retry after {config.retry_after_s}s", {"Retry-After": str(config.retry_after_s)})
        except NotReady as e:
            return error(503, f"not ready: {e}", {"Retry-After": str(config.retry_after_s)})
        except asyncio.TimeoutError:
            return error(504, f"not translated within {config.timeout_s:g}s; send fewer sentences or retry later")
        metrics.sentences.inc(len(texts))
        latency = time.perf_counter() - start
        metrics.latency.observe(latency)
        return TranslateResponse(
            translations=[n[0].text for n in results], scores=[round(n[0].score, 4) for n in results],
            n_best=[[Hypothesis(text=h.text, score=round(h.score, 4)) for h in n] for n in results] if req.n_best > 1 else None,
            latency_ms=round(1000 * latency, 1))

    @app.get("/health", responses={200: {"content": {"application/json": {"example": {"status": "alive"}}}}})
    async def health():
        """Liveness: the process answers."""
        return {"status": "alive"}

    @app.get("/ready", responses={503: {"model": ErrorBody}})
    async def ready():
        """Readiness: the model is loaded and a warm-up translation is done."""
        if batcher.ready.is_set():
            return {"status": "ready", "model": config.description}
        return error(503, f"not ready: {batcher.failed or 'the model is still loading'}")

    @app.get("/metrics", response_class=Response)
    async def prometheus():
        """Prometheus text format."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(PAGE.read_text(encoding="utf-8").replace("{{MODEL}}", config.description or "tk"))

    return RequestLog(app, config, metrics)


class RequestLog:
    """Pure ASGI middleware: refuses oversized bodies, counts translation requests by status and
    logs one line per request (the access log of uvicorn is turned off)."""

    def __init__(self, app: FastAPI, config: ServeConfig, metrics: Metrics):
        self.app = app
        self.config = config
        self.metrics = metrics

    def __getattr__(self, name):  # tests and uvicorn reach the FastAPI app's state and routes through here
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500
        scope.setdefault("state", {})

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        path = scope["path"]
        length = dict(scope["headers"]).get(b"content-length")
        try:
            if path == "/v1/translate" and length and length.isdigit() and int(length) > self.config.max_body_bytes:
                body = json.dumps({"error": f"request body of {int(length)} bytes, limit {self.config.max_body_bytes}; split the request"})
                await send_status({"type": "http.response.start", "status": 413,
                                   "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
                await send_status({"type": "http.response.body", "body": body.encode()})
            else:
                await self.app(scope, receive, send_status)
        finally:
            ms = 1000 * (time.perf_counter() - start)
            n = scope["state"].get("sentences")
            if path == "/v1/translate":
                self.metrics.requests.labels(str(status)).inc()
            log.info("%s %s %d %s%.1f ms", scope["method"], path, status, f"{n} sentence{'s' * (n != 1)} " if n is not None else "", ms)
