"""The HTTP side of `tk serve`: FastAPI routes, limits, error bodies, one log line per request.

Every error answers `{"error": "one line"}` with its status; no traceback reaches a client.
"""

from __future__ import annotations

import asyncio
import html as html_module
import json
import logging
import math
import re
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator
from starlette.exceptions import HTTPException

from toolkit.core import textprep
from toolkit.core.decode_options import SERVE_MAX_BEAM, declared
from toolkit.core.errors import UsageError, first_line
from toolkit.core.glossary import Glossary
from toolkit.core.glossary import from_mapping as glossary_from
from toolkit.core.tokenizers import rust_panic
from toolkit.deploy import files, markup
from toolkit.deploy.translate import Translation, TranslationModel
from toolkit.serve import languages
from toolkit.serve.batcher import Batcher, BatchPolicy, NotReady, OptionKey, QueueFull, TooLarge
from toolkit.serve.detect import LanguageDetector
from toolkit.serve.file_routes import FileRoutesConfig, add_file_routes
from toolkit.serve.keys import ApiKeys, KeyLimits, request_key
from toolkit.serve.keys import Refused as KeyRefused
from toolkit.serve.languages import Pair
from toolkit.serve.metrics import Metrics

log = logging.getLogger("tk.serve")
PAGE = Path(__file__).with_name("page.html")
TRANSLATE = "/v1/translate"
DROP_IN = "/translate"  # LibreTranslate's route, and the corpus-pipeline contract (NeMo Curator) on the same path
# Requests whose bodies the middleware reads within the limits, and those counted as translation requests.
READ_PATHS = (TRANSLATE, DROP_IN, "/detect")
COUNTED = (TRANSLATE, DROP_IN)
# Names a browser on this machine uses for a loopback server; with the bound address and --allow-host
# names they are the Host headers served, so a page elsewhere cannot reach the API by DNS rebinding.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
SURROGATES = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class ServeConfig:
    policy: BatchPolicy = field(default_factory=BatchPolicy)
    max_sentences: int = 64  # per request
    max_chars: int = 1000  # per sentence
    timeout_s: float = 30.0  # per request, queue wait included
    retry_after_s: int = 1  # told to clients refused for a full queue
    description: str = ""  # model, variant and provider, for the page and the log
    body_timeout_s: float = 10.0  # the whole request body must arrive within this (408 beyond)
    header_timeout_s: float = 10.0  # a request's line and headers must arrive within this (server.BoundedH11Protocol)
    allowed_hosts: tuple[str, ...] = ()  # Host names served besides LOOPBACK_HOSTS; "*" serves any
    default_pair: Pair | None = None  # what a request naming no pair gets (tk serve --source-lang/--target-lang); None: the first
    api_keys: Mapping[bytes, KeyLimits] | None = None  # tk serve --api-keys: every translation route needs a key; None: open

    @property
    def max_body_bytes(self) -> int:
        return self.max_sentences * (4 * self.max_chars + 16) + 4096  # UTF-8 and JSON escapes of the largest valid request


@dataclass(frozen=True)
class ModelSpec:
    """One served model: how to load it (on its own decoding worker), the language pairs it translates, and what
    the page and the log call it."""

    load: Callable[[], TranslationModel]
    pairs: tuple[Pair, ...] = (languages.TK_PAIR,)
    description: str = ""
    # A multilingual model: each served pair (the clients' codes) -> the model's own codes, which its batcher translates
    # with (languages.every_pair). None: a model of one pair, translated as it is.
    codes: Mapping[Pair, Pair] | None = None
    # Its pairs fill what the models of one stated pair leave: `tk serve exported/transformer m2m100/` gives en-fr to
    # the first and every other pair to the second.
    fills: bool = False


def decoding_fields() -> dict:
    """The request fields of the declared decoding options tk serve takes (toolkit.core.decode_options.OPTIONS, "serve"):
    each its declared type, default, range (tk serve's cap where it has one) and help."""
    out = {}
    for o in declared("serve"):
        kind = o.kind | None if o.default is None or o.none else o.kind
        bounds = {} if o.kind is bool else {"ge": o.low, **({"le": o.high_on("serve")} if o.high_on("serve") is not None else {})}
        out[o.name] = (kind, Field(o.default, **bounds, description=o.field_help or o.help.removesuffix(".")))
    return out


class RequestChecks(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _n_best_within_beam(self):
        if self.n_best > self.beam:
            raise ValueError(f"n_best ({self.n_best}) must not exceed beam ({self.beam})")
        return self

    def decoding(self) -> dict:
        """The request's decoding options, by declared name."""
        return {o.name: getattr(self, o.name) for o in declared("serve")}


TranslateRequest = create_model(
    "TranslateRequest", __base__=RequestChecks,
    text=(str | list[str], Field(description="One sentence (or text), or a list of them", examples=["I'm home."])),
    source=(str | None, Field(None, description="Source language code, or \"auto\" to detect it [default: the first served pair's]",
                              examples=["en"])),
    target=(str | None, Field(None, description="Target language code [default: the first served pair's]", examples=["fr"])),
    **decoding_fields(),
    api_key=(str | None, Field(None, description="The client's API key where the server has --api-keys (or Authorization: Bearer)")),
    glossary=(dict[str, str] | None, Field(None, description="Source term -> target term: each occurrence of a source term (whatever "
                                           "its case, as a whole word) comes out as its target term, exactly once (tk translate's --glossary)",
                                           examples=[{"house": "demeure"}])),
)


CONFIDENCE = ("How far to trust each translation, 0 to 1: the estimated chance that it scores a sentence chrF of 50 or more "
              "against a human translation (tk translate --confidence); low: a translation a person should check")


class Hypothesis(BaseModel):
    text: str
    score: float
    confidence: float = Field(description=CONFIDENCE)


class TranslateResponse(BaseModel):
    translations: list[str] = Field(description="The best translation of each input sentence, in input order")
    scores: list[float] = Field(description="Length-normalised log-probability of each best translation")
    confidences: list[float] = Field(description=CONFIDENCE)
    n_best: list[list[Hypothesis]] | None = Field(None, description="With n_best > 1: every hypothesis of each sentence, best first")
    detected_language: dict | None = Field(None, description='With source "auto": {"language", "confidence"} (percent), as LibreTranslate')
    latency_ms: float


class ErrorBody(BaseModel):
    error: str


def printable(text: str) -> str:
    """Text that encodes as UTF-8: lone surrogates (a directory name's undecodable bytes after
    os.fsdecode, or a client's JSON escapes) become U+FFFD."""
    return SURROGATES.sub("\ufffd", text)


def error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": printable(message)}, status_code=status, headers=headers)


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


class Routes:
    """The served models and the pair each request goes to: one batcher (and decoding worker) per model; a multilingual
    model's batcher serves every pair it translates, each request carrying the pair in the model's codes."""

    def __init__(self, models: Sequence[ModelSpec], policy: BatchPolicy, metrics: Metrics, default: Pair | None = None,
                 batchers: Sequence[Batcher] | None = None):
        if not models:
            raise UsageError("tk serve needs at least one model directory")
        textprep.split_sentences("Hello. Goodbye.")  # a missing sentence splitter is refused at start, not per request
        # batchers: one per model, in order, in place of local ones (tk serve --ray's, which send to the model's replicas)
        self.batchers = list(batchers) if batchers is not None else [Batcher(m.load, policy, metrics) for m in models]
        self.models = list(models)
        self.by_pair: dict[Pair, Batcher] = {}
        self.codes: dict[Pair, Pair | None] = {}  # a pair -> the model's codes for it (None: a model of one pair)
        stated = [(m, b) for m, b in zip(models, self.batchers) if not m.fills]
        for m, b in stated + [(m, b) for m, b in zip(models, self.batchers) if m.fills]:
            for pair in m.pairs:
                if pair in self.by_pair:
                    if m.fills:
                        continue  # a stated pair, or an earlier multilingual model's, comes first
                    raise UsageError(f"two models are given for {languages.shown(pair)}; serve one model per language pair")
                self.by_pair[pair] = b
                self.codes[pair] = m.codes[pair] if m.codes is not None else None
        first = next(iter(self.by_pair))
        if default is not None and default not in self.by_pair:
            raise UsageError(f"{languages.shown(default)} is not served here; served pairs: {self.served()}")
        self.default = default or (models[0].pairs[0] if models[0].pairs[0] in self.by_pair else first)
        self.detectors: dict[str | None, LanguageDetector] = {}

    @property
    def healthy(self) -> bool:
        return all(b.healthy for b in self.batchers)

    def not_ready_reason(self) -> str:
        reasons = [f"{m.description or languages.shown(m.pairs[0])}: {b.not_ready_reason()}" if len(self.batchers) > 1
                   else b.not_ready_reason() for m, b in zip(self.models, self.batchers) if not b.healthy]
        return "; ".join(reasons)

    def served(self) -> str:
        """The served pairs, in one line: a multilingual model's as "any two of" its codes, not thousands of pairs."""
        out = []
        for m, b in zip(self.models, self.batchers):
            if m.codes is not None and len(m.pairs) > 1:
                out.append(f"any two of {', '.join(sorted({c for pair in m.pairs for c in pair}))}")
            else:
                out += [languages.shown(p) for p in m.pairs if self.by_pair.get(p) is b]
        return ", ".join(out)

    def find(self, source: str | None, target: str | None) -> tuple[Batcher, Pair | None]:
        """The batcher of a pair and the model's codes for it (None: a model of one pair, translated as it is); a pair
        no model serves is a UsageError naming the served pairs."""
        if source is None and target is None:
            source, target = self.default
        if source == "auto":
            raise UsageError("source \"auto\" is detected from the text: call detect_source first")
        if not source or not target:
            raise UsageError("give both source and target language codes")
        pair = (source, target)
        if pair not in self.by_pair:
            raise UsageError(f"{printable(str(source))}-{printable(str(target))} is not served here; served pairs: {self.served()}")
        return self.by_pair[pair], self.codes[pair]

    def detector(self, target: str | None = None) -> LanguageDetector:
        """Detection among the served sources (those translated into `target`, where given), made once per target."""
        if target not in self.detectors:
            self.detectors[target] = LanguageDetector(dict.fromkeys(s for s, t in self.by_pair if target is None or t == target))
        return self.detectors[target]

    def detect_source(self, texts: Sequence[str], target: str | None) -> tuple[str, float]:
        """The served source language of `texts` (detected on their first 2,000 characters, as one text: LibreTranslate
        gives one language to a request) that translates into `target`, with its confidence in percent."""
        if not target:
            raise UsageError("give the target language code with source \"auto\"")
        found = self.detector(target).detect("\n".join(texts)[:2000], top=1)
        if not found:
            if not any(t == target for _, t in self.by_pair):
                raise UsageError(f"{printable(str(target))} is not a target served here; served pairs: {self.served()}")
            raise UsageError(f"none of the languages translated into {printable(str(target))} here can be detected; give the source "
                             "language code")
        return found[0]

    def languages(self) -> list[dict]:
        """LibreTranslate's /languages: every language of a served pair, with the targets served from it."""
        codes = list(dict.fromkeys(c for pair in self.by_pair for c in pair))
        targets: dict[str, list[str]] = {c: [] for c in codes}
        for s, t in self.by_pair:
            targets[s].append(t)
        return [{"code": c, "name": languages.name(c), "targets": sorted(targets[c])} for c in codes]


class Refusal(Exception):
    """A request the translation routes answer with an error status and one line."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers


class BodyProblem(ValueError):
    """A body Python's json would read but a request must not be: a number JSON does not have, or nesting past what
    the parser reads."""


def _not_a_number(name: str) -> float:
    raise BodyProblem(f"{name} is not a JSON number: JSON numbers are finite (no NaN or Infinity)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: float() gives inf, which int() of a route's field then overflows on
        raise BodyProblem(f"{text[:40]} is past the largest finite number tk serve reads (a 64-bit float's)")
    return value


def parse_json(raw: bytes | str) -> object:
    """A request body's JSON, refusing what JSON does not have though Python's json reads it (NaN, Infinity, a number
    past a float's range) and nesting past the parser's recursion limit (no request nests over two levels): each a
    BodyProblem (a ValueError) naming it."""
    try:
        return json.loads(raw, parse_constant=_not_a_number, parse_float=_finite)
    except RecursionError:
        raise BodyProblem("the body nests deeper than tk serve reads (a request nests two levels at most)") from None


class StrictJSONRequest(Request):
    """A request whose JSON body is read by parse_json (FastAPI reads a route's model with json.loads as it is)."""

    async def json(self) -> object:
        if not hasattr(self, "_json"):
            try:
                self._json = parse_json(await self.body())
            except BodyProblem as e:
                # FastAPI answers a JSONDecodeError as malformed JSON, through the app's handler: a 400 naming e.msg.
                raise json.JSONDecodeError(str(e), "", 0) from None
        return self._json


class StrictJSONRoute(APIRoute):
    """A route that reads its JSON body with parse_json."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict


# Over 60 lines: FastAPI routes are closures over this app's batchers, limits and metrics, declared inside the factory.
def create_app(models: Callable[[], TranslationModel] | Sequence[ModelSpec], config: ServeConfig | None = None,
               batchers: Sequence[Batcher] | None = None) -> FastAPI:
    """The server's ASGI app. `models`: one ModelSpec per served model, or one load function (use translate.open_model)
    for a single English-French model; each model is loaded on its own decoding worker, all at the same time.
    batchers: one per model in place of the local ones, anything with Batcher's translate, start, close, healthy,
    not_ready_reason, depth and policy (tk serve --ray's RemoteBatcher)."""
    config = config or ServeConfig()
    metrics = Metrics()
    specs = [ModelSpec(models, description=config.description)] if callable(models) else list(models)
    routes = Routes(specs, config.policy, metrics, config.default_pair, batchers)
    batcher = routes.batchers[0]
    # Server-wide gauges over every model: the queue holds all their sentences; ready once every model is.
    metrics.queue_depth.set_function(lambda: sum(b.depth for b in routes.batchers))
    metrics.ready.set_function(lambda: float(routes.healthy))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        for b in routes.batchers:  # each worker loads its own model: one slow load holds no other model back
            b.start()
        yield
        # uvicorn has already finished the in-flight requests; this stops the workers.
        await asyncio.gather(*(asyncio.to_thread(b.close, config.timeout_s) for b in routes.batchers))
        log.info("shut down cleanly: in-flight requests answered, decoding workers stopped")

    pairs = routes.served()
    app = FastAPI(title="tk serve", version="1", lifespan=lifespan,
                  description=f"Translation ({pairs}) with the exported ONNX graphs, batched across requests; LibreTranslate's "
                              "API at /translate and /languages.")
    app.router.route_class = StrictJSONRoute  # the routes declared below read JSON bodies with parse_json
    app.state.batcher = batcher
    app.state.routes = routes
    app.state.metrics = metrics
    errors = {400: {"model": ErrorBody}, 408: {"model": ErrorBody}, 413: {"model": ErrorBody}, 421: {"model": ErrorBody},
              422: {"model": ErrorBody}, 503: {"model": ErrorBody}, 504: {"model": ErrorBody}}
    description = printable(config.description or "; ".join(m.description for m in specs if m.description))
    keys = ApiKeys(dict(config.api_keys)) if config.api_keys is not None else None

    def admit(key: str | None, q: object) -> None:
        """tk serve --api-keys: the request's key is valid and within its limits, else a Refusal (403; 429 with Retry-After;
        400 over its characters per request). LibreTranslate's order: the key before the request's own checks."""
        if keys is None:
            return
        chars = len(q) if isinstance(q, str) else sum(len(t) for t in q if isinstance(t, str)) if isinstance(q, list) else 0
        try:
            keys.admit(key, chars)
        except KeyRefused as e:
            raise Refusal(e.status, str(e), {"Retry-After": str(e.retry_after_s)} if e.retry_after_s else None) from None

    def detected_source(texts: Sequence[str], target: object) -> tuple[str, dict]:
        """source "auto": the served source language of texts that translates into target, and LibreTranslate's
        detectedLanguage for it; a 400 Refusal where none can be detected."""
        try:
            source, confidence = routes.detect_source(texts, target if isinstance(target, str) else None)
        except UsageError as e:
            raise Refusal(400, str(e)) from None
        return source, {"confidence": confidence, "language": source}

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        if first.get("type") == "json_invalid":
            return error(400, f"malformed JSON: {first.get('ctx', {}).get('error', 'cannot parse the body')}; send a JSON object like "
                              '{"text": "I\'m home."}')
        if first.get("type") == "string_unicode":  # a lone surrogate escape where pydantic's JSON parser wants a string
            return error(400, "the body has a lone UTF-16 surrogate escape (such as \\ud800), which is not text; send valid Unicode")
        if tuple(first.get("loc", ())) == ("body",) and "json" not in request.headers.get("content-type", "json"):
            return error(400, f"the body is {request.headers['content-type']}, not JSON; send JSON with Content-Type: application/json")
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        if first.get("type") == "value_error":  # from our own validator, whose message names the fields
            return error(422, first.get("msg", "invalid").removeprefix("Value error, "))
        return error(422, f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Refusal)
    async def refused(request: Request, exc: Refusal):
        return error(exc.status, str(exc), exc.headers)

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception):
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return error(500, "internal error; the server log has the details")

    def check_texts(texts: list[str], too_large: int, what: str = "sentence") -> None:
        """The request limits, each a Refusal naming the text at fault; too_large: the status of a limit (LibreTranslate
        answers 400 for its own limits, /v1/translate 413)."""
        if len(texts) > config.max_sentences:
            raise Refusal(too_large, f"{len(texts)} {what}s in one request, limit {config.max_sentences}; split the request")
        for k, t in enumerate(texts):
            if len(t) > config.max_chars:
                raise Refusal(too_large, f"{what} {k} has {len(t)} characters, limit {config.max_chars}; split it into shorter ones")
            if found := SURROGATES.search(t):
                # JSON lets "\ud800" through, but it is no character: the tokenizer and the answer's UTF-8 would fail on it.
                raise Refusal(400, f"{what} {k} has a lone UTF-16 surrogate (\\u{ord(found.group()):04x} at {found.start()}), "
                                   "which is not text; send valid Unicode")

    async def decoded(b: Batcher, texts: list[str], key: OptionKey, too_large: int = 413) -> list[list[Translation]]:
        """The n-best of texts from a model's batcher, every refusal a Refusal with its status."""
        try:
            return await asyncio.wait_for(b.translate(texts, key, time.monotonic() + config.timeout_s), config.timeout_s)
        except UsageError as e:
            raise Refusal(422 if too_large == 413 else 400, str(e)) from None
        except TooLarge as e:
            raise Refusal(too_large, str(e)) from None
        except QueueFull as e:
            raise Refusal(503, f"server busy: {e}; retry after {config.retry_after_s}s", {"Retry-After": str(config.retry_after_s)}) from None
        except NotReady as e:
            raise Refusal(503, f"not ready: {e}", {"Retry-After": str(config.retry_after_s)}) from None
        except asyncio.TimeoutError:
            raise Refusal(504, f"not translated within {config.timeout_s:g}s; send fewer sentences or retry later") from None

    # Cutting HTML and writing it back take time in proportion to the fragments' size: on a worker thread, so the event
    # loop answers every other request (and /health) meanwhile, and one request's at a time, since threads cutting side by
    # side would only take turns at the interpreter lock, slowing the decoding worker's share of it too.
    markup_turn = asyncio.Semaphore(1)

    async def markup_work(work: Callable):
        async with markup_turn:
            return await asyncio.to_thread(work)

    async def html(b: Batcher, fragments: list[str], key: OptionKey, confidences: list[float] | None = None) -> list[str]:
        """HTML fragments with their text translated, markup in place: toolkit.deploy.markup, as tk translate --format html.
        confidences: each fragment's confidence is appended to it (its least trusted text's; 1 for one with no text)."""
        def cut() -> tuple[list[markup.Plan], list[str]]:
            plans = [markup.plan(f) for f in fragments]
            return plans, list(dict.fromkeys(t for p in plans for t in p.texts()))

        plans, texts = await markup_work(cut)
        if len(texts) > b.policy.queue_size:  # one request's markup cannot fill the queue that every client shares
            raise Refusal(400, f"the HTML in this request holds {len(texts)} texts to translate (blocks and their inline elements), more "
                               f"than the whole queue holds ({b.policy.queue_size}, --queue-size); send fewer or smaller fragments")
        results = await decoded(b, texts, key, 400) if texts else []
        translated = {t: n[0].text for t, n in zip(texts, results)}
        if confidences is not None:
            trust = {t: n[0].confidence for t, n in zip(texts, results)}
            confidences.extend(round(min((trust[t] for t in p.texts()), default=1.0), 4) for p in plans)
        return await markup_work(lambda: [markup.render(p, translated) for p in plans])

    @app.post(TRANSLATE, response_model=TranslateResponse, responses=errors, response_model_exclude_none=True)
    async def translate(req: TranslateRequest, request: Request):
        """Translates (the first served pair unless source and target say otherwise). Sentences of concurrent requests are
        decoded together."""
        start = time.perf_counter()
        texts = [req.text] if isinstance(req.text, str) else req.text
        request.state.sentences = len(texts)
        if not texts:
            return error(422, "text: give at least one sentence")
        admit(req.api_key or request_key({}, request.headers), texts)
        source, detected = detected_source(texts, req.target) if req.source == "auto" else (req.source, None)
        try:
            b, codes = routes.find(source, req.target)
        except UsageError as e:
            return error(400, str(e))
        check_texts(texts, 413)
        key = OptionKey.of(codes, await request_glossary(req.glossary, 422), **req.decoding())
        results = await decoded(b, texts, key)
        metrics.sentences.inc(len(texts))
        latency = time.perf_counter() - start
        metrics.latency.observe(latency)
        return TranslateResponse(
            translations=[n[0].text for n in results], scores=[round(n[0].score, 4) for n in results],
            confidences=[round(n[0].confidence, 4) for n in results],
            n_best=[[Hypothesis(text=h.text, score=round(h.score, 4), confidence=round(h.confidence, 4)) for h in n] for n in results]
            if req.n_best > 1 else None,
            detected_language=detected, latency_ms=round(1000 * latency, 1))

    @app.post(DROP_IN, responses={400: {"model": ErrorBody}, 503: {"model": ErrorBody}, 504: {"model": ErrorBody}})
    async def drop_in(request: Request):
        """LibreTranslate's POST /translate (JSON or form: q, source, target, format text|html, alternatives; answers
        translatedText), and the corpus-pipeline contract on the same path (JSON texts, src_lang, tgt_lang; answers
        translations in order)."""
        start = time.perf_counter()
        body = await request_fields(request)
        if "texts" in body or "src_lang" in body or "tgt_lang" in body:
            answer = await corpus_call(body, request)
        else:
            answer = await libretranslate_call(body, request)
        metrics.latency.observe(time.perf_counter() - start)
        return JSONResponse(answer)

    async def corpus_call(body: dict, request: Request) -> dict:
        texts = body.get("texts")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise Refusal(400, "texts must be a list of strings, with src_lang and tgt_lang: "
                               '{"texts": ["I\'m home."], "src_lang": "en", "tgt_lang": "fr"}')
        request.state.sentences = len(texts)
        admit(request_key(body, request.headers), texts)
        b, codes = pick(body.get("src_lang"), body.get("tgt_lang"), "src_lang", "tgt_lang")
        check_texts(texts, 400, "text")
        key = OptionKey.of(codes, await request_glossary(body.get("glossary"), 400))
        results = await decoded(b, texts, key, 400) if texts else []
        metrics.sentences.inc(len(texts))
        return {"translations": [n[0].text for n in results]}

    async def libretranslate_call(body: dict, request: Request) -> dict:
        q = body.get("q")
        admit(request_key(body, request.headers), q)
        if q is None or q == "" or q == []:
            raise Refusal(400, "Invalid request: missing q parameter")
        for name in ("source", "target"):
            if not body.get(name):
                raise Refusal(400, f"Invalid request: missing {name} parameter")
        if not (isinstance(q, str) or isinstance(q, list) and all(isinstance(t, str) for t in q)):
            raise Refusal(400, "Invalid request: q must be a string or a list of strings")
        texts = q if isinstance(q, list) else [q]
        request.state.sentences = len(texts)
        fmt = body.get("format") or "text"
        if fmt not in ("text", "html"):
            raise Refusal(400, f"{printable(str(fmt))} format is not supported; give text or html")
        alternatives = body.get("alternatives", 0)
        try:
            alternatives = max(0, int(alternatives))
        except (TypeError, ValueError):
            raise Refusal(400, "Invalid request: alternatives parameter is not a number") from None
        if alternatives > SERVE_MAX_BEAM - 1:
            raise Refusal(400, f"Invalid request: alternatives parameter must be <= {SERVE_MAX_BEAM - 1}")
        source, detected = detected_source(texts, body.get("target")) if body.get("source") == "auto" else (body.get("source"), None)
        b, codes = pick(source, body.get("target"), "source", "target")
        check_texts(texts, 400, "text")
        # LibreTranslate asks its beam search for alternatives + 1 hypotheses: tk translate --beam N --n-best N, N = that.
        n = alternatives + 1
        key = OptionKey.of(codes, await request_glossary(body.get("glossary"), 400), beam=n, n_best=n if fmt == "text" else 1)
        trust: list[float] = []  # tk's extension: each text's confidence (toolkit.core.confidence)
        if fmt == "html":  # LibreTranslate gives no alternatives for html either
            out, others = await html(b, texts, key, trust), [[] for _ in texts]
        else:
            results = await decoded(b, texts, key, 400)
            out = [r[0].text for r in results]
            others = [list(dict.fromkeys(h.text for h in r[1:] if h.text != r[0].text)) for r in results]
            trust = [round(r[0].confidence, 4) for r in results]
        metrics.sentences.inc(len(texts))
        answer: dict = {"translatedText": out if isinstance(q, list) else out[0], "confidence": trust if isinstance(q, list) else trust[0]}
        if alternatives > 0:
            answer["alternatives"] = others if isinstance(q, list) else others[0]
        if detected is not None:
            answer["detectedLanguage"] = [detected] * len(texts) if isinstance(q, list) else detected
        return answer

    async def request_glossary(value: object, status: int) -> Glossary | None:
        """A request's glossary (a JSON object of source term -> target term; in a form, that object as a JSON string),
        built off the event loop (thousands of terms take milliseconds), or a Refusal naming what is wrong with it."""
        if value is None:
            return None
        try:
            if isinstance(value, str):
                value = parse_json(value)
            return await asyncio.to_thread(glossary_from, value)
        except ValueError as e:
            raise Refusal(status, f"Invalid request: glossary is not JSON ({first_line(e)}); give a JSON object of source term -> "
                                  'target term, e.g. {"house": "demeure"}') from None
        except UsageError as e:
            raise Refusal(status, f"Invalid request: {e}" if status == 400 else str(e)) from None

    def pick(source: object, target: object, source_name: str, target_name: str) -> tuple[Batcher, Pair | None]:
        if not isinstance(source, str) or not isinstance(target, str) or not source or not target:
            raise Refusal(400, f"Invalid request: give {source_name} and {target_name} as language codes; served pairs: {routes.served()}")
        try:
            return routes.find(source, target)
        except UsageError as e:
            raise Refusal(400, str(e)) from None

    @app.get("/languages")
    async def served_languages():
        """LibreTranslate's language list: each language of a served pair, with the targets served from it."""
        return routes.languages()

    @app.post("/detect", responses={400: {"model": ErrorBody}, 403: {"model": ErrorBody}, 429: {"model": ErrorBody}})
    async def detect(request: Request):
        """LibreTranslate's language detection (JSON or form q): the served source languages the text is most likely in,
        best first, as [{"language", "confidence"}] (percent), detected offline among the served languages only."""
        body = await request_fields(request)
        q = body.get("q")
        admit(request_key(body, request.headers), q)
        if isinstance(q, list) and all(isinstance(t, str) for t in q):
            q = "\n".join(q)
        if not isinstance(q, str) or not q:
            raise Refusal(400, "Invalid request: missing q parameter")
        check_texts([q], 400, "text")
        return [{"confidence": c, "language": code} for code, c in routes.detector().detect(q)]

    @app.get("/frontend/settings")
    async def frontend_settings():
        """LibreTranslate's settings for its web page and clients, as far as they apply to tk serve."""
        source, target = routes.default
        return {"charLimit": config.max_chars, "frontendTimeout": int(1000 * config.timeout_s), "apiKeys": keys is not None,
                "keyRequired": keys is not None, "suggestions": False, "filesTranslation": True, "supportedFilesFormat": list(files.SUPPORTED),
                "language": {"source": {"code": source, "name": languages.name(source)},
                             "target": {"code": target, "name": languages.name(target)}}}

    @app.get("/health", responses={200: {"content": {"application/json": {"example": {"status": "alive"}}}}})
    async def health():
        """Liveness: the process answers."""
        return {"status": "alive"}

    @app.get("/ready", responses={503: {"model": ErrorBody}})
    async def ready():
        """Readiness: every model is loaded, a warm-up translation is done and its decoding worker runs."""
        if routes.healthy:
            return {"status": "ready", "model": description, "pairs": [languages.shown(p) for p in routes.by_pair]}
        return error(503, f"not ready: {routes.not_ready_reason()}")

    @app.get("/metrics", response_class=Response)
    async def prometheus():
        """Prometheus text format."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(PAGE.read_text(encoding="utf-8").replace("{{MODEL}}", html_module.escape(description or "tk")))

    async def file_texts(texts: list[str], source: str, target: str, api_key: str | None) -> list[str]:
        """A file's texts for /translate_file, in the request limits' batches; the key counted once for the file."""
        admit(api_key, texts)
        if source == "auto":
            source, _ = detected_source(texts, target)
        b, codes = pick(source, target, "source", "target")
        out: list[str] = []
        for at in range(0, len(texts), config.max_sentences):
            out += [n[0].text for n in await decoded(b, texts[at:at + config.max_sentences], OptionKey.of(codes), 400)]
        return out

    add_file_routes(app, file_texts, FileRoutesConfig())
    return RequestLog(app, config, metrics)


def form_fields(text: str, where: str) -> dict:
    """Form or query fields as LibreTranslate reads them: each field's first value, but every value of a repeated `q`
    (a list of texts, as libretranslate-aio sends one)."""
    try:
        fields = urllib.parse.parse_qs(text, keep_blank_values=True, strict_parsing=False, max_num_fields=1000)
    except ValueError as e:
        raise Refusal(400, f"the {where} cannot be read ({first_line(e)}); send UTF-8 form fields or JSON") from None
    return {k: v if k == "q" and len(v) > 1 else v[0] for k, v in fields.items()}


async def request_fields(request: Request) -> dict:
    """A LibreTranslate-style request's fields: a JSON object, or a form (application/x-www-form-urlencoded, as
    LibreTranslate's own clients send), over the query string's values (deep-translator sends its fields there, with no
    body), as LibreTranslate reads them alike."""
    query = form_fields(request.url.query, "query string") if request.url.query else {}
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    raw = await request.body()
    if kind == "application/x-www-form-urlencoded":
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Refusal(400, f"the form body cannot be read ({first_line(e)}); send UTF-8 form fields or JSON") from None
        return {**query, **form_fields(text, "form body")}
    if not raw.strip() and kind in ("", "application/json", "text/plain"):
        return query  # fields in the query string alone
    if kind not in ("application/json", "") and not kind.endswith("+json"):
        raise Refusal(400, f"the body is {printable(kind)}; send JSON (Content-Type: application/json) or a form "
                           "(application/x-www-form-urlencoded)")
    try:
        body = parse_json(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise Refusal(400, f"malformed JSON: {first_line(e)}; send a JSON object like "
                           '{"q": "I\'m home.", "source": "en", "target": "fr"}') from None
    if not isinstance(body, dict):
        raise Refusal(400, "the body must be a JSON object, like {\"q\": \"I'm home.\", \"source\": \"en\", \"target\": \"fr\"}")
    return {**query, **body}


class Refused(Exception):
    """A request answered by the middleware itself, before the app sees it; unread: the client may still
    be sending a body the answer should not be lost under."""

    def __init__(self, status: int, message: str, unread: bool = False):
        super().__init__(message)
        self.status = status
        self.unread = unread


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


class RequestLog:
    """Pure ASGI middleware: serves only allowed Host names, reads a translation request's body
    within its size and time limits, cancels the request when its client goes away, counts
    translation requests by status and logs one line per request (uvicorn's access log is off)."""

    def __init__(self, app: FastAPI, config: ServeConfig, metrics: Metrics):
        self.app = app
        self.config = config
        self.metrics = metrics
        self.any_host = "*" in config.allowed_hosts
        self.hosts = {host_name(h) for h in (*LOOPBACK_HOSTS, *config.allowed_hosts)} - {""}

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
            if path in READ_PATHS and scope["method"] == "POST":
                body = await self.read_body(scope, receive)
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
            if path in COUNTED:
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

    async def read_body(self, scope, receive) -> bytes:
        """The whole body, read as it arrives: refused once it passes the size limit (a chunked body
        has no Content-Length to check first) or when it is not all there within body_timeout_s."""
        limit, timeout = self.config.max_body_bytes, self.config.body_timeout_s
        length = dict(scope["headers"]).get(b"content-length")
        if length and length.isdigit() and int(length) > limit:
            raise Refused(413, f"request body of {int(length)} bytes, limit {limit}; split the request", unread=sending_body(scope, DRAIN_BYTES))
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - asyncio.get_running_loop().time(), 0))
            except asyncio.TimeoutError:
                raise Refused(408, f"the request body did not arrive within {timeout:g}s; send it whole at once") from None
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                raise Refused(413, f"request body over {limit} bytes, the limit; split the request", unread=message.get("more_body", False))
            if not message.get("more_body"):
                return b"".join(chunks)

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
