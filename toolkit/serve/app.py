"""The HTTP side of `tk serve`: the served models and their pairs (Routes), the translation routes' work (Service), and
create_app, which puts them on a FastAPI app behind the middleware (toolkit.serve.middleware).

Every error answers `{"error": "one line"}` with its status; no traceback reaches a client.
"""

from __future__ import annotations

import asyncio
import html as html_module
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from toolkit.core import textprep
from toolkit.core.decode_options import SERVE_MAX_BEAM
from toolkit.core.errors import UsageError, first_line
from toolkit.core.glossary import Glossary
from toolkit.core.glossary import from_mapping as glossary_from
from toolkit.deploy import files, markup
from toolkit.deploy.translate import Translation, TranslationModel
from toolkit.serve import languages
from toolkit.serve.batcher import Batcher, BatchPolicy, NotReady, OptionKey, QueueFull, TooLarge
from toolkit.serve.bodies import ErrorBody, Hypothesis, StrictJSONRoute, TranslateRequest, TranslateResponse, error, parse_json, request_fields
from toolkit.serve.detect import LanguageDetector
from toolkit.serve.file_routes import FileRoutesConfig, add_file_routes
from toolkit.serve.keys import ApiKeys, KeyLimits, request_key
from toolkit.serve.languages import Pair
from toolkit.serve.metrics import Metrics
from toolkit.serve.middleware import SURROGATES, BodyLimits, Refused, RequestLog, printable
from toolkit.serve.options import default

log = logging.getLogger("tk.serve")
PAGE = Path(__file__).with_name("page.html")
TRANSLATE = "/v1/translate"
DROP_IN = "/translate"  # LibreTranslate's route, and the corpus-pipeline contract (NeMo Curator) on the same path
# Requests whose bodies the middleware reads within the limits, and those counted as translation requests.
READ_PATHS = (TRANSLATE, DROP_IN, "/detect")
COUNTED = (TRANSLATE, DROP_IN)


@dataclass(frozen=True)
class ServeConfig:
    policy: BatchPolicy = field(default_factory=BatchPolicy)
    # The limits' defaults are tk serve's (toolkit.serve.options, where the options are declared).
    max_sentences: int = default("config.max_sentences")  # per request
    max_chars: int = default("config.max_chars")  # per sentence
    timeout_s: float = default("config.timeout_s")  # per request, queue wait included
    retry_after_s: int = 1  # told to clients refused for a full queue
    description: str = ""  # model, variant and provider, for the page and the log
    body_timeout_s: float = default("config.body_timeout_s")  # the whole request body must arrive within this (408 beyond)
    header_timeout_s: float = default("config.header_timeout_s")  # a request's line and headers must arrive within this (server.BoundedH11Protocol)
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


# source "auto": a request detected as already in its target language at this confidence (percent) or more comes back as
# it is, as LibreTranslate gives it back. Restricted to English and French, the detector gave no English sentence of the
# Tatoeba Challenge's 10,000 as French at 90% or more (4 at 50% or more), and 10,000 French ones as English none.
IN_TARGET = 90.0


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
        """Detection among the served sources translated into `target` and `target` itself (a text may already be in it);
        with no target, among every served language (LibreTranslate's /detect: every installed one). Made once per target."""
        if target not in self.detectors:
            codes = [*(s for s, t in self.by_pair if target is None or t == target), *(t for _, t in self.by_pair if target in (None, t))]
            self.detectors[target] = LanguageDetector(dict.fromkeys(codes))
        return self.detectors[target]

    def detect_source(self, texts: Sequence[str], target: str | None) -> tuple[str, float]:
        """The language of `texts` (detected on their first 2,000 characters, as one text: LibreTranslate gives one
        language to a request) with its confidence in percent: `target` itself where they are in it at IN_TARGET percent
        or more (the caller gives them back as they are), else the served source that translates into `target` most
        likely theirs."""
        if not target:
            raise UsageError("give the target language code with source \"auto\"")
        if not any(t == target for _, t in self.by_pair):
            raise UsageError(f"{printable(str(target))} is not a target served here; served pairs: {self.served()}")
        detector = self.detector(target)
        found = detector.detect("\n".join(texts)[:2000], top=len(detector.codes))
        if found and found[0][0] == target and found[0][1] >= IN_TARGET:
            return found[0]
        sources = [f for f in found if f[0] != target]
        if not sources:
            raise UsageError(f"none of the languages translated into {printable(str(target))} here can be detected; give the source "
                             "language code")
        return sources[0]

    def languages(self) -> list[dict]:
        """LibreTranslate's /languages: every language of a served pair, with the targets served from it."""
        codes = list(dict.fromkeys(c for pair in self.by_pair for c in pair))
        targets: dict[str, list[str]] = {c: [] for c in codes}
        for s, t in self.by_pair:
            targets[s].append(t)
        return [{"code": c, "name": languages.name(c), "targets": sorted(targets[c])} for c in codes]


class Service:
    """The translation routes' work over one app's models, limits, keys and metrics: each route is a thin call of one
    method here (registered by create_app), so the routes of `tk serve` and `tk serve --ray` are the same code."""

    def __init__(self, routes: Routes, config: ServeConfig, metrics: Metrics, description: str):
        self.routes, self.config, self.metrics, self.description = routes, config, metrics, description
        self.keys = ApiKeys(dict(config.api_keys)) if config.api_keys is not None else None
        # Cutting HTML and writing it back take time in proportion to the fragments' size: on a worker thread, so the event
        # loop answers every other request (and /health) meanwhile, and one request's at a time, since threads cutting side
        # by side would only take turns at the interpreter lock, slowing the decoding worker's share of it too.
        self.markup_turn = asyncio.Semaphore(1)

    def admit(self, key: str | None, q: object) -> None:
        """tk serve --api-keys: the request's key is valid and within its limits, else a Refused (403; 429 with Retry-After;
        400 over its characters per request). LibreTranslate's order: the key before the request's own checks."""
        if self.keys is None:
            return
        chars = len(q) if isinstance(q, str) else sum(len(t) for t in q if isinstance(t, str)) if isinstance(q, list) else 0
        self.keys.admit(key, chars)

    def detected_source(self, texts: Sequence[str], target: object) -> tuple[str, dict]:
        """source "auto": the served source language of texts that translates into target, and LibreTranslate's
        detectedLanguage for it; a 400 Refused where none can be detected."""
        try:
            source, confidence = self.routes.detect_source(texts, target if isinstance(target, str) else None)
        except UsageError as e:
            raise Refused(400, str(e)) from None
        return source, {"confidence": confidence, "language": source}

    def pick(self, source: object, target: object, source_name: str, target_name: str) -> tuple[Batcher, Pair | None]:
        if not isinstance(source, str) or not isinstance(target, str) or not source or not target:
            raise Refused(400, f"Invalid request: give {source_name} and {target_name} as language codes; served pairs: {self.routes.served()}")
        try:
            return self.routes.find(source, target)
        except UsageError as e:
            raise Refused(400, str(e)) from None

    def check_texts(self, texts: list[str], too_large: int, what: str = "sentence") -> None:
        """The request limits, each a Refused naming the text at fault; too_large: the status of a limit (LibreTranslate
        answers 400 for its own limits, /v1/translate 413)."""
        config = self.config
        if len(texts) > config.max_sentences:
            raise Refused(too_large, f"{len(texts)} {what}s in one request, limit {config.max_sentences}; split the request")
        for k, t in enumerate(texts):
            if len(t) > config.max_chars:
                raise Refused(too_large, f"{what} {k} has {len(t)} characters, limit {config.max_chars}; split it into shorter ones")
            if found := SURROGATES.search(t):
                # JSON lets "\ud800" through, but it is no character: the tokenizer and the answer's UTF-8 would fail on it.
                raise Refused(400, f"{what} {k} has a lone UTF-16 surrogate (\\u{ord(found.group()):04x} at {found.start()}), "
                                   "which is not text; send valid Unicode")

    async def decoded(self, b: Batcher, texts: list[str], key: OptionKey, too_large: int = 413) -> list[list[Translation]]:
        """The n-best of texts from a model's batcher, every refusal a Refused with its status."""
        config = self.config
        try:
            return await asyncio.wait_for(b.translate(texts, key, time.monotonic() + config.timeout_s), config.timeout_s)
        except UsageError as e:
            raise Refused(422 if too_large == 413 else 400, str(e)) from None
        except TooLarge as e:
            raise Refused(too_large, str(e)) from None
        except QueueFull as e:
            raise Refused(503, f"server busy: {e}; retry after {config.retry_after_s}s", {"Retry-After": str(config.retry_after_s)}) from None
        except NotReady as e:
            raise Refused(503, f"not ready: {e}", {"Retry-After": str(config.retry_after_s)}) from None
        except asyncio.TimeoutError:
            raise Refused(504, f"not translated within {config.timeout_s:g}s; send fewer sentences or retry later") from None

    async def html(self, b: Batcher, fragments: list[str], key: OptionKey, confidences: list[float] | None = None) -> list[str]:
        """HTML fragments with their text translated, markup in place: toolkit.deploy.markup, as tk translate --format html.
        confidences: each fragment's confidence is appended to it (its least trusted text's; 1 for one with no text)."""
        def cut() -> tuple[list[markup.Plan], list[str]]:
            plans = [markup.plan(f) for f in fragments]
            return plans, list(dict.fromkeys(t for p in plans for t in p.texts()))

        async with self.markup_turn:
            plans, texts = await asyncio.to_thread(cut)
        if len(texts) > b.policy.queue_size:  # one request's markup cannot fill the queue that every client shares
            raise Refused(400, f"the HTML in this request holds {len(texts)} texts to translate (blocks and their inline elements), more "
                               f"than the whole queue holds ({b.policy.queue_size}, --queue-size); send fewer or smaller fragments")
        results = await self.decoded(b, texts, key, 400) if texts else []
        translated = {t: n[0].text for t, n in zip(texts, results)}
        if confidences is not None:
            trust = {t: n[0].confidence for t, n in zip(texts, results)}
            confidences.extend(round(min((trust[t] for t in p.texts()), default=1.0), 4) for p in plans)
        async with self.markup_turn:
            return await asyncio.to_thread(lambda: [markup.render(p, translated) for p in plans])

    async def translate(self, req: TranslateRequest, request: Request):
        """Translates (the first served pair unless source and target say otherwise). Sentences of concurrent requests are
        decoded together."""
        start = time.perf_counter()
        texts = [req.text] if isinstance(req.text, str) else req.text
        request.state.sentences = len(texts)
        if not texts:
            return error(422, "text: give at least one sentence")
        self.admit(req.api_key or request_key({}, request.headers), texts)
        source, detected = self.detected_source(texts, req.target) if req.source == "auto" else (req.source, None)
        if detected is not None and source == req.target:  # already in the target language: given back as it is
            self.check_texts(texts, 413)
            return TranslateResponse(translations=list(texts), scores=[0.0] * len(texts), confidences=[1.0] * len(texts),
                                     n_best=[[Hypothesis(text=t, score=0.0, confidence=1.0)] for t in texts] if req.n_best > 1 else None,
                                     detected_language=detected, latency_ms=round(1000 * (time.perf_counter() - start), 1))
        try:
            b, codes = self.routes.find(source, req.target)
        except UsageError as e:
            return error(400, str(e))
        self.check_texts(texts, 413)
        key = OptionKey.of(codes, await self.request_glossary(req.glossary, 422), **req.decoding())
        results = await self.decoded(b, texts, key)
        self.metrics.sentences.inc(len(texts))
        latency = time.perf_counter() - start
        self.metrics.latency.observe(latency)
        return TranslateResponse(
            translations=[n[0].text for n in results], scores=[round(n[0].score, 4) for n in results],
            confidences=[round(n[0].confidence, 4) for n in results],
            n_best=[[Hypothesis(text=h.text, score=round(h.score, 4), confidence=round(h.confidence, 4)) for h in n] for n in results]
            if req.n_best > 1 else None,
            detected_language=detected, latency_ms=round(1000 * latency, 1))

    async def drop_in(self, request: Request) -> JSONResponse:
        """LibreTranslate's POST /translate (JSON or form: q, source, target, format text|html, alternatives; answers
        translatedText), and the corpus-pipeline contract on the same path (JSON texts, src_lang, tgt_lang; answers
        translations in order)."""
        start = time.perf_counter()
        body = await request_fields(request)
        if "texts" in body or "src_lang" in body or "tgt_lang" in body:
            answer = await self.corpus_call(body, request)
        else:
            answer = await self.libretranslate_call(body, request)
        self.metrics.latency.observe(time.perf_counter() - start)
        return JSONResponse(answer)

    async def corpus_call(self, body: dict, request: Request) -> dict:
        texts = body.get("texts")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise Refused(400, "texts must be a list of strings, with src_lang and tgt_lang: "
                               '{"texts": ["I\'m home."], "src_lang": "en", "tgt_lang": "fr"}')
        request.state.sentences = len(texts)
        self.admit(request_key(body, request.headers), texts)
        b, codes = self.pick(body.get("src_lang"), body.get("tgt_lang"), "src_lang", "tgt_lang")
        self.check_texts(texts, 400, "text")
        key = OptionKey.of(codes, await self.request_glossary(body.get("glossary"), 400))
        results = await self.decoded(b, texts, key, 400) if texts else []
        self.metrics.sentences.inc(len(texts))
        return {"translations": [n[0].text for n in results]}

    async def libretranslate_call(self, body: dict, request: Request) -> dict:
        q = body.get("q")
        self.admit(request_key(body, request.headers), q)
        if q is None or q == "" or q == []:
            raise Refused(400, "Invalid request: missing q parameter")
        for name in ("source", "target"):
            if not body.get(name):
                raise Refused(400, f"Invalid request: missing {name} parameter")
        if not (isinstance(q, str) or isinstance(q, list) and all(isinstance(t, str) for t in q)):
            raise Refused(400, "Invalid request: q must be a string or a list of strings")
        texts = q if isinstance(q, list) else [q]
        request.state.sentences = len(texts)
        fmt = body.get("format") or "text"
        if fmt not in ("text", "html"):
            raise Refused(400, f"{printable(str(fmt))} format is not supported; give text or html")
        alternatives = body.get("alternatives", 0)
        try:
            alternatives = max(0, int(alternatives))
        except (TypeError, ValueError):
            raise Refused(400, "Invalid request: alternatives parameter is not a number") from None
        if alternatives > SERVE_MAX_BEAM - 1:
            raise Refused(400, f"Invalid request: alternatives parameter must be <= {SERVE_MAX_BEAM - 1}")
        source, detected = self.detected_source(texts, body.get("target")) if body.get("source") == "auto" else (body.get("source"), None)
        unchanged = detected is not None and source == body.get("target")  # already in the target language: given back as it is
        b, codes = (None, None) if unchanged else self.pick(source, body.get("target"), "source", "target")
        self.check_texts(texts, 400, "text")
        # LibreTranslate asks its beam search for alternatives + 1 hypotheses: tk translate --beam N --n-best N, N = that.
        n = alternatives + 1
        key = OptionKey.of(codes, await self.request_glossary(body.get("glossary"), 400), beam=n, n_best=n if fmt == "text" else 1)
        trust: list[float] = []  # tk's extension: each text's confidence (toolkit.core.confidence)
        if unchanged:
            out, others, trust = list(texts), [[] for _ in texts], [1.0] * len(texts)
        elif fmt == "html":  # LibreTranslate gives no alternatives for html either
            out, others = await self.html(b, texts, key, trust), [[] for _ in texts]
        else:
            results = await self.decoded(b, texts, key, 400)
            out = [r[0].text for r in results]
            others = [list(dict.fromkeys(h.text for h in r[1:] if h.text != r[0].text)) for r in results]
            trust = [round(r[0].confidence, 4) for r in results]
        self.metrics.sentences.inc(len(texts))
        listed = isinstance(q, list)
        answer: dict = {"translatedText": out if listed else out[0], "confidence": trust if listed else trust[0]}
        if alternatives > 0:
            answer["alternatives"] = others if listed else others[0]
        if detected is not None:
            answer["detectedLanguage"] = [detected] * len(texts) if listed else detected
        return answer

    async def request_glossary(self, value: object, status: int) -> Glossary | None:
        """A request's glossary (a JSON object of source term -> target term; in a form, that object as a JSON string),
        built off the event loop (thousands of terms take milliseconds), or a Refused naming what is wrong with it."""
        if value is None:
            return None
        try:
            if isinstance(value, str):
                value = parse_json(value)
            return await asyncio.to_thread(glossary_from, value)
        except ValueError as e:
            raise Refused(status, f"Invalid request: glossary is not JSON ({first_line(e)}); give a JSON object of source term -> "
                                  'target term, e.g. {"house": "demeure"}') from None
        except UsageError as e:
            raise Refused(status, f"Invalid request: {e}" if status == 400 else str(e)) from None

    async def detect(self, request: Request) -> list[dict]:
        """LibreTranslate's language detection (JSON or form q): the served source languages the text is most likely in,
        best first, as [{"language", "confidence"}] (percent), detected offline among the served languages only."""
        body = await request_fields(request)
        q = body.get("q")
        self.admit(request_key(body, request.headers), q)
        if isinstance(q, list) and all(isinstance(t, str) for t in q):
            q = "\n".join(q)
        if not isinstance(q, str) or not q:
            raise Refused(400, "Invalid request: missing q parameter")
        self.check_texts([q], 400, "text")
        return [{"confidence": c, "language": code} for code, c in self.routes.detector().detect(q)]

    async def served_languages(self) -> list[dict]:
        """LibreTranslate's language list: each language of a served pair, with the targets served from it."""
        return self.routes.languages()

    async def frontend_settings(self) -> dict:
        """LibreTranslate's settings for its web page and clients, as far as they apply to tk serve."""
        source, target = self.routes.default
        keyed = self.keys is not None
        return {"charLimit": self.config.max_chars, "frontendTimeout": int(1000 * self.config.timeout_s), "apiKeys": keyed,
                "keyRequired": keyed, "suggestions": False, "filesTranslation": True, "supportedFilesFormat": list(files.SUPPORTED),
                "language": {"source": {"code": source, "name": languages.name(source)},
                             "target": {"code": target, "name": languages.name(target)}}}

    async def file_texts(self, texts: list[str], source: str, target: str, api_key: str | None) -> list[str]:
        """A file's texts for /translate_file, in the request limits' batches; the key counted once for the file."""
        self.admit(api_key, texts)
        if source == "auto":
            source, _ = self.detected_source(texts, target)
            if source == target:  # already in the target language: given back as it is
                return list(texts)
        b, codes = self.pick(source, target, "source", "target")
        out: list[str] = []
        step = self.config.max_sentences
        for at in range(0, len(texts), step):
            out += [n[0].text for n in await self.decoded(b, texts[at:at + step], OptionKey.of(codes), 400)]
        return out


def create_app(models: Callable[[], TranslationModel] | Sequence[ModelSpec], config: ServeConfig | None = None,
               batchers: Sequence[Batcher] | None = None) -> RequestLog:
    """The server's ASGI app. `models`: one ModelSpec per served model, or one load function (use translate.open_model)
    for a single English-French model; each model is loaded on its own decoding worker, all at the same time.
    batchers: one per model in place of the local ones, anything with Batcher's translate, start, close, healthy,
    not_ready_reason, depth and policy (tk serve --ray's RemoteBatcher)."""
    config = config or ServeConfig()
    metrics = Metrics()
    specs = [ModelSpec(models, description=config.description)] if callable(models) else list(models)
    routes = Routes(specs, config.policy, metrics, config.default_pair, batchers)
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

    app = FastAPI(title="tk serve", version="1", lifespan=lifespan,
                  description=f"Translation ({routes.served()}) with the exported ONNX graphs, batched across requests; LibreTranslate's "
                              "API at /translate and /languages.")
    app.router.route_class = StrictJSONRoute  # the routes declared below read JSON bodies with parse_json
    service = Service(routes, config, metrics, printable(config.description or "; ".join(m.description for m in specs if m.description)))
    add_error_handlers(app)
    add_routes(app, service)
    add_file_routes(app, service.file_texts, FileRoutesConfig())
    return RequestLog(app, BodyLimits(config.max_body_bytes, config.body_timeout_s), config.allowed_hosts, metrics, READ_PATHS, COUNTED)


def add_error_handlers(app: FastAPI) -> None:
    """Every error as `{"error": "one line"}` with its status: a body the request model refuses, a Refused, anything else
    (logged, a 500 that names no internals)."""

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

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused):
        return error(exc.status, str(exc), exc.headers)

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception):
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return error(500, "internal error; the server log has the details")


def add_routes(app: FastAPI, service: Service) -> None:
    """The translation routes (/v1/translate; LibreTranslate's /translate, with the corpus-pipeline contract on it, /detect
    and /languages), the page, LibreTranslate's frontend settings, /health, /ready and /metrics."""
    errors = {status: {"model": ErrorBody} for status in (400, 408, 413, 421, 422, 503, 504)}
    app.post(TRANSLATE, response_model=TranslateResponse, responses=errors, response_model_exclude_none=True)(service.translate)
    app.post(DROP_IN, responses={status: {"model": ErrorBody} for status in (400, 503, 504)})(service.drop_in)
    app.post("/detect", responses={status: {"model": ErrorBody} for status in (400, 403, 429)})(service.detect)
    app.get("/languages")(service.served_languages)
    app.get("/frontend/settings")(service.frontend_settings)
    routes = service.routes

    @app.get("/health", responses={200: {"content": {"application/json": {"example": {"status": "alive"}}}}})
    async def health():
        """Liveness: the process answers."""
        return {"status": "alive"}

    @app.get("/ready", responses={503: {"model": ErrorBody}})
    async def ready():
        """Readiness: every model is loaded, a warm-up translation is done and its decoding worker runs."""
        if routes.healthy:
            return {"status": "ready", "model": service.description, "pairs": [languages.shown(p) for p in routes.by_pair]}
        return error(503, f"not ready: {routes.not_ready_reason()}")

    @app.get("/metrics", response_class=Response)
    async def prometheus():
        """Prometheus text format."""
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(PAGE.read_text(encoding="utf-8").replace("{{MODEL}}", html_module.escape(service.description or "tk")))
