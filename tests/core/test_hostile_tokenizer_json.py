"""A tokenizer.json is untrusted input: its regular expressions are refused where they can take the tokenizers library
exponential time, and a panic of the library's Rust code on one input is one line for that input.

The library runs a normalizer's or decoder's Replace and a pre-tokenizer's Split with Oniguruma, which backtracks: a
group repeated around an alternation (`(a|aa)+$`) tries every split of a run of text, until Oniguruma's retry limit
makes the library panic (pyo3's PanicException, a BaseException that `except Exception` misses). Such a pattern is
refused when tk reads the file (tk export hf:DIR, and every load of a model directory); one it lets through that still
exhausts the limit on some text (`\\w*\\w*...!` on a long word) fails that text alone, in one line: tk translate and the
API raise tk's error, tk serve answers that request with a JSON error and goes on serving.
"""

from __future__ import annotations

import json
import logging
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import Scripted, one_line_error

from toolkit.core import manifest as manifest_mod
from toolkit.core.declaration import Declaration, DecodingRules, TokenizerDeclaration
from toolkit.core.decode_options import DecodeOptions
from toolkit.core.digests import file_sha256
from toolkit.core.errors import DataError, UsageError
from toolkit.core.tokenizers import JsonTokenizer, load_tokenizer_json, nested_repetition, open_tokenizer
from toolkit.deploy.translate import TranslationModel, translate_batch

CATASTROPHIC = "(a|aa)+$"
# Accepted when read (no repeated group), yet past Oniguruma's retry limit on a long word that is not followed by "!":
# eight ways to share each letter, tried at every position.
EXHAUSTING = r"\w*\w*\w*\w*\w*\w*\w*\w*!"
LONG_WORD = "a" * 60 + " !"
WORDS = ["hello", "world", "the", "cat", "a", "!", "."]
TOKENS = ["<pad>", "<unk>", "<s>", "</s>", *WORDS, "__en__", "__fr__"]
ID = {t: i for i, t in enumerate(TOKENS)}


def _replace(pattern: str) -> dict:
    return {"type": "Replace", "pattern": {"Regex": pattern}, "content": " "}


# Where a regular expression can sit in a tokenizer.json: section -> that section holding `pattern`.
SECTIONS = {
    "normalizer": lambda p: ("normalizer", {"type": "Sequence", "normalizers": [{"type": "NFKC"}, _replace(p)]}),
    "pre_tokenizer": lambda p: ("pre_tokenizer", {"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False}),
    "decoder": lambda p: ("decoder", _replace(p)),
}


def write_tokenizer_json(path: Path, section: str | None = None, pattern: str | None = None) -> Path:
    """A word-level tokenizer.json (the tokenizers library's own format) with `pattern` in `section`, if given."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(ID, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<pad>", "<unk>", "<s>", "</s>", "__en__", "__fr__"])
    data = json.loads(tok.to_str())
    if section is not None:
        key, value = SECTIONS[section](pattern)
        data[key] = value
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def model_directory(folder: Path, kind: str = "tokenizer.json") -> manifest_mod.Manifest:
    """The manifest of a model directory whose tokenizer is folder/tokenizer.json: an NLLB-style multilingual one
    (kind "tokenizer.json") or a T5's (kind "t5")."""
    if kind == "t5":
        tokenizer = TokenizerDeclaration("t5", "tokenizer.json", unk=ID["<unk>"], prefixes={"en-fr": "translate English to French: "})
        rules = DecodingRules(start=ID["<pad>"], end=ID["</s>"], pad=ID["<pad>"])
    else:
        tokenizer = TokenizerDeclaration("tokenizer.json", "tokenizer.json", unk=ID["<unk>"], source_lang="en", target_lang="fr",
                                         languages={"en": ID["__en__"], "fr": ID["__fr__"]})
        rules = DecodingRules(start=ID["</s>"], end=ID["</s>"], pad=ID["<pad>"], forced_first=ID["__fr__"])
    declaration = Declaration(rules, tokenizer, origin="hf", placeholders=False)
    record = manifest_mod.TokenizerRecord("tokenizer.json", file_sha256(folder / "tokenizer.json"))
    return manifest_mod.Manifest(directory=folder, model="tiny", kind="seq2seq", config={"max_len": 64}, graphs={},
                                 version=manifest_mod.VERSION, tokenizer=record, declaration=declaration.to_dict())


def translation_model(folder: Path, tokenizer_class=JsonTokenizer) -> TranslationModel:
    """The model of `folder` with a scripted network that always writes "hello" (the tokenizer is what is tested)."""
    m = model_directory(folder)
    tokenizer = tokenizer_class.load(folder, m.declared().tokenizer, m.rules())
    return TranslationModel(m, tokenizer, lambda: Scripted([ID["__fr__"], ID["hello"]], len(TOKENS)), "cpu", 0.0)


# ---- which regular expressions are refused ---------------------------------------------------------------------------

@pytest.mark.parametrize("pattern", [CATASTROPHIC, r"(\w+)*$", r"(?:x+y?)+z", "((a|b)c)*", "(a|aa){1,100}", r"(?<w>\p{L}+)+"])
def test_a_group_repeated_around_an_alternation_or_a_repetition_is_nested_repetition(pattern):
    assert nested_repetition(pattern)


@pytest.mark.parametrize("pattern", [
    " {2,}",  # T5's, NLLB's and mBART's normalizer: runs of spaces
    r"\p{N}{1,3}",
    # Llama 3's and GPT-4o's pre-tokenizers: alternatives side by side, an unrepeated (or optional) group of them
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "(ab)+", "(a|aa){1,3}", r"\(a|b\)+", "[(a|b)]+", "(?#(a|b)+)x", r"[[:alpha:]]+",
])
def test_the_regexes_tokenizers_ship_are_not_nested_repetition(pattern):
    assert not nested_repetition(pattern)


# ---- refused when read -----------------------------------------------------------------------------------------------

def _one_line(e: pytest.ExceptionInfo, *words: str) -> str:
    message = str(e.value)
    assert "\n" not in message and "Traceback" not in message
    for w in words:
        assert w in message, (w, message)
    return message


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_a_tokenizer_json_with_a_catastrophic_regex_is_refused_in_one_line_when_read(tmp_path, section):
    path = write_tokenizer_json(tmp_path / "tokenizer.json", section, CATASTROPHIC)
    with pytest.raises(UsageError) as e:
        load_tokenizer_json(path, "re-export the model directory")
    _one_line(e, str(path), section, json.dumps(CATASTROPHIC), "(a|aa)+ is a+")


@pytest.mark.parametrize("kind", ["tokenizer.json", "t5"])
def test_a_model_directory_whose_tokenizer_json_was_changed_after_export_is_refused_when_opened(tmp_path, kind):
    """tk translate, serve and the API open a model's tokenizer this way: the file is read as untrusted each time."""
    write_tokenizer_json(tmp_path / "tokenizer.json", "normalizer", CATASTROPHIC)
    with pytest.raises(UsageError) as e:
        open_tokenizer(model_directory(tmp_path, kind))
    _one_line(e, "tokenizer.json", "normalizer.normalizers[1].pattern")


@pytest.mark.timeout(300)
def test_export_refuses_a_hugging_face_directory_whose_tokenizer_json_has_a_catastrophic_regex(cli, corpus_zip, tmp_path):
    from hf_marian_fixture import fra_eng_lines
    from hf_seq2seq_fixture import nllb_directory

    hf = tmp_path / "hf"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nllb_directory(hf, fra_eng_lines(corpus_zip, 200), steps=0)
    data = json.loads((hf / "tokenizer.json").read_text(encoding="utf-8"))
    data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        data["pre_tokenizer"], {"type": "Split", "pattern": {"Regex": CATASTROPHIC}, "behavior": "Isolated", "invert": False}]}
    (hf / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")

    line = one_line_error(cli("export", f"hf:{hf}", "--out", tmp_path / "out"), 2)

    assert "tokenizer.json" in line and "pre_tokenizer.pretokenizers[1].pattern" in line
    assert not (tmp_path / "out").exists()


# ---- a panic at run time fails its one input -----------------------------------------------------------------------

@pytest.mark.parametrize("section", ["normalizer", "pre_tokenizer"])
def test_a_regex_that_exhausts_the_engine_on_one_text_is_one_line_for_that_text(tmp_path, section):
    write_tokenizer_json(tmp_path / "tokenizer.json", section, EXHAUSTING)
    t = translation_model(tmp_path)  # accepted when read: no group is repeated
    opts = DecodeOptions.for_manifest(t.manifest)

    assert translate_batch(t, ["hello world"], opts)[0][0].text == "hello"
    with pytest.raises(DataError) as e:
        translate_batch(t, [LONG_WORD], opts)
    _one_line(e, str(tmp_path / "tokenizer.json"), "failed on the text 'aaaa", "retry-limit")


@pytest.fixture()
def serve_client():
    pytest.importorskip("httpx", reason="the serve extra is not installed: pip install -e '.[serve]'")
    from fastapi.testclient import TestClient

    from toolkit.serve.app import ServeConfig, create_app

    @contextmanager
    def serving(model: TranslationModel) -> Iterator[TestClient]:
        """The app in process, its model loaded and warmed up; server errors come back as responses."""
        with TestClient(create_app(lambda: model, ServeConfig()), base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
            for _ in range(3000):
                if client.get("/ready").status_code == 200:
                    break
                threading.Event().wait(0.01)
            else:
                raise AssertionError(f"never ready: {client.get('/ready').text}")
            yield client

    return serving


def test_serve_answers_a_text_the_tokenizer_fails_on_with_a_json_error_and_serves_the_next(tmp_path, serve_client):
    write_tokenizer_json(tmp_path / "tokenizer.json", "normalizer", EXHAUSTING)
    with serve_client(translation_model(tmp_path)) as client:
        failed = client.post("/v1/translate", json={"text": LONG_WORD})
        after = client.post("/v1/translate", json={"text": "hello world"})
        ready = client.get("/ready")

    assert failed.status_code == 422, failed.text
    assert "failed on the text 'aaaa" in failed.json()["error"]
    assert after.status_code == 200 and after.json()["translations"] == ["hello"]
    assert ready.status_code == 200


class BareTokenizer(JsonTokenizer):
    """A tokenizer that calls the tokenizers library without tk's guard: a stand-in for any Rust extension's panic."""

    def _pieces_ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids


def test_serve_answers_any_rust_panic_with_a_json_error_not_a_plain_text_500(tmp_path, serve_client, caplog):
    write_tokenizer_json(tmp_path / "tokenizer.json", "normalizer", EXHAUSTING)
    with caplog.at_level(logging.ERROR, logger="tk.serve"), serve_client(translation_model(tmp_path, BareTokenizer)) as client:
        failed = client.post("/v1/translate", json={"text": LONG_WORD})
        after = client.post("/v1/translate", json={"text": "hello world"})

    assert failed.status_code == 500
    assert failed.headers["content-type"] == "application/json"
    assert failed.json()["error"] == "internal error; the server log has the details"
    assert "PanicException" in caplog.text
    assert after.status_code == 200 and after.json()["translations"] == ["hello"]
