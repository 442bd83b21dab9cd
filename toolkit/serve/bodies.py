"""The bodies of tk serve's routes: /v1/translate's request (the declared decoding options' fields among them) and answer
as the OpenAPI schema shows them, every error's `{"error": "one line"}`, and a request's fields read from its JSON
(strictly: no NaN, no numbers past a float's range, no deep nesting), a form, or the query string, as LibreTranslate
reads them."""

from __future__ import annotations

import json
import math
import urllib.parse
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from toolkit.core.decode_options import declared
from toolkit.core.errors import first_line
from toolkit.serve.middleware import Refused, printable


def error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    """Every error's answer: `{"error": "one line"}` with its status."""
    return JSONResponse({"error": printable(message)}, status_code=status, headers=headers)


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


def form_fields(text: str, where: str) -> dict:
    """Form or query fields as LibreTranslate reads them: each field's first value, but every value of a repeated `q`
    (a list of texts, as libretranslate-aio sends one)."""
    try:
        fields = urllib.parse.parse_qs(text, keep_blank_values=True, strict_parsing=False, max_num_fields=1000)
    except ValueError as e:
        raise Refused(400, f"the {where} cannot be read ({first_line(e)}); send UTF-8 form fields or JSON") from None
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
            raise Refused(400, f"the form body cannot be read ({first_line(e)}); send UTF-8 form fields or JSON") from None
        return {**query, **form_fields(text, "form body")}
    if not raw.strip() and kind in ("", "application/json", "text/plain"):
        return query  # fields in the query string alone
    if kind not in ("application/json", "") and not kind.endswith("+json"):
        raise Refused(400, f"the body is {printable(kind)}; send JSON (Content-Type: application/json) or a form "
                           "(application/x-www-form-urlencoded)")
    try:
        body = parse_json(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise Refused(400, f"malformed JSON: {first_line(e)}; send a JSON object like "
                           '{"q": "I\'m home.", "source": "en", "target": "fr"}') from None
    if not isinstance(body, dict):
        raise Refused(400, "the body must be a JSON object, like {\"q\": \"I'm home.\", \"source\": \"en\", \"target\": \"fr\"}")
    return {**query, **body}


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
