"""The decoding options are declared once (toolkit.core.decode_options.OPTIONS): tk translate's and translate-corpus's
options, tk serve's /v1/translate fields and the API's keywords are each made from that declaration, with its names,
defaults and ranges, so the three surfaces cannot drift apart."""

from __future__ import annotations

import pytest

from toolkit.core.decode_options import DECLARED, GUARDED, OPTIONS, DecodeOptions, declared
from toolkit.core.errors import UsageError

# What users give today, surface by surface: the contract the declaration must keep.
CLI = {"beam", "alpha", "max_len", "batch_size", "max_tokens", "max_len_a", "max_len_b", "loop_guard"}
TRANSLATE = CLI | {"n_best", "streams"}
SERVE = {"beam", "n_best", "alpha", "max_len", "max_len_a", "max_len_b", "loop_guard"}
API = {"beam", "n_best", "alpha", "max_len", "batch_size", "max_tokens", "max_len_a", "max_len_b", "loop_guard", "streams"}
TEXT_KEYWORDS = {"keep", "split", "raw", "strict", "source_lang", "target_lang", "glossary"}


def cli_options(command) -> dict:
    """The decoding options a click command takes: parameter name -> (its flags, default, range)."""
    out = {}
    for p in command.params:
        if p.name in DECLARED:
            kind = p.type
            out[p.name] = (tuple(p.opts + p.secondary_opts), p.default, getattr(kind, "min", None), getattr(kind, "max", None))
    return out


def serve_options() -> dict:
    pytest.importorskip("fastapi")
    from toolkit.serve.bodies import TranslateRequest

    out = {}
    for name, f in TranslateRequest.model_fields.items():
        if name in {"text", "source", "target", "api_key", "glossary"}:
            continue
        bounds = {type(m).__name__: getattr(m, type(m).__name__.lower()) for m in f.metadata}
        out[name] = (f.default, bounds.get("Ge"), bounds.get("Le"))
    return out


def api_keywords() -> set[str]:
    """The keywords Translator.translate_batch takes, as its own error lists them (checked before any model is needed)."""
    from toolkit.deploy.api import Translator

    with pytest.raises(UsageError) as e:
        Translator.translate_batch(object.__new__(Translator), ["Hi."], no_such_option=1)
    listed = {name.strip() for name in str(e.value).split("its options:")[1].split(",")}
    return listed - TEXT_KEYWORDS


def test_the_declaration_holds_each_surfaces_options():
    assert {o.name for o in declared("cli")} == CLI
    assert {o.name for o in (*declared("cli"), *declared("translate"))} == TRANSLATE
    assert {o.name for o in declared("serve")} == SERVE
    assert {o.name for o in declared("api")} == API
    assert GUARDED == {"max_len_a": 2.0, "max_len_b": 10, "loop_guard": True}  # the one default regime: guards on


def test_the_cli_the_server_and_the_api_take_the_declared_options_with_their_defaults_and_ranges():
    from toolkit.cli.commands.translate import translate
    from toolkit.cli.commands.translate_corpus import translate_corpus

    corpus, single = cli_options(translate_corpus), cli_options(translate)
    assert set(corpus) == CLI and set(single) == TRANSLATE
    for name, (flags, default, low, high) in single.items():
        o = DECLARED[name]
        assert flags[0] == "--" + name.replace("_", "-") and default == o.default, name
        assert (low, high) == ((None, None) if o.kind is bool else (o.low, o.high_on("cli"))), name
    assert single["loop_guard"][0] == ("--loop-guard", "--no-loop-guard")

    fields = serve_options()
    assert set(fields) == SERVE
    for name, (default, low, high) in fields.items():
        o = DECLARED[name]
        assert default == o.default and low == (None if o.kind is bool else o.low) and high == o.high_on("serve"), name
    assert fields["beam"][2] == fields["n_best"][2] == 16  # tk serve's own cap

    assert api_keywords() == API


def test_every_declared_option_reaches_for_model_and_nothing_else_does():
    given = {"beam": 2, "n_best": 2, "alpha": 0.5, "max_len": 9, "batch_size": 3, "max_tokens": 99, "max_len_a": 1.0,
             "max_len_b": 4, "loop_guard": False, "streams": 2}
    assert set(given) == {o.name for o in OPTIONS}
    opts = DecodeOptions.for_model(64, **given)
    assert {k: getattr(opts, k) for k in given} == given
    left_out = DecodeOptions.for_model(64)
    assert (left_out.beam, left_out.n_best, left_out.alpha) == (1, 1, None)
    assert {k: getattr(left_out, k) for k in GUARDED} == GUARDED
    with pytest.raises(TypeError, match="unexpected keyword argument 'beams'"):
        DecodeOptions.for_model(64, beams=2)
