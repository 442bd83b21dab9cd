"""The JSON bodies of tk serve's /v1/translate: its request (the declared decoding options' fields among them), its
answer and its errors, as the OpenAPI schema shows them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from toolkit.core.decode_options import declared


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
