"""A multilingual model's pair on every command: tk translate-corpus, evaluate, verify and serve take --source-lang and
--target-lang as tk translate and Translator.translate do (one chooser, toolkit.core.tokenizers.choose_languages), give
the same text for the same pair, refuse an unknown code in one line listing the model's codes, and default to what the
model's files say or what `tk export --source-lang/--target-lang` recorded. tk serve serves every pair of the one model.

The tiny M2M100 of tests/hf_seq2seq_fixture.py (built once per run, shared with test_hf_m2m100.py), trained en -> fr: its
German is poor but its own, so an answer in the wrong language shows as a different text.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from conftest import built_once
from helpers import one_line_error
from hf_marian_fixture import fra_eng_lines
from hf_seq2seq_fixture import m2m100_directory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PAIR = ("--source-lang", "en", "--target-lang", "de")


@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    return fra_eng_lines(corpus_zip, 2000)


@pytest.fixture(scope="module")
def m2m100(tmp_path_factory, pairs) -> tuple[Path, Path]:
    """(Hugging Face directory, tk model directory), built once per run under the name test_hf_m2m100.py uses."""
    from click.testing import CliRunner

    from toolkit.cli import main

    def build(root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m2m100_directory(root / "hf", pairs[:400])
        result = CliRunner().invoke(main, ["export", f"hf:{root / 'hf'}", "--out", str(root / "tk")])
        assert result.exit_code == 0, result.output

    root = built_once(tmp_path_factory, "hf-m2m100", build)
    return root / "hf", root / "tk"


@pytest.fixture(scope="module")
def english(pairs) -> list[str]:
    return [e for e, _ in pairs[1000:1008]]


@pytest.fixture(scope="module")
def api(m2m100):
    from toolkit import Translator

    return Translator(m2m100[1], provider="cpu", variant="fp32")


def test_the_pair_changes_the_text(api, english):
    """The premise of every test below: German and French differ, so a command that ignored the pair would show."""
    french = api.translate(english, source_lang="en", target_lang="fr")
    assert api.translate(english, source_lang="en", target_lang="de") != french
    assert api.translate(english) == french  # the model's own default: its files say en -> fr


@pytest.mark.timeout(600)
def test_translate_corpus_with_a_pair_gives_translate_s_text(cli, m2m100, api, english, tmp_path):
    pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")
    src = tmp_path / "in.txt"
    src.write_text("\n".join(english) + "\n", encoding="utf-8")
    result = cli("translate-corpus", m2m100[1], src, tmp_path / "out", "-q", *PAIR)
    assert result.exit_code == 0, result.output
    got = (tmp_path / "out" / "translations.txt").read_text(encoding="utf-8").splitlines()
    assert got == api.translate(english, source_lang="en", target_lang="de")


def test_evaluate_with_a_pair_scores_translate_s_text(cli, m2m100, api, corpus_zip):
    from toolkit.core import data
    from toolkit.core.scoring import bleu_chrf

    result = cli("evaluate", m2m100[1], "--data", corpus_zip, "--limit", 6, "--beam", 1, *PAIR)
    assert result.exit_code == 0, result.output
    scores = json.loads(result.stdout)["test_split_greedy"]
    source, references = data.references(data.load_corpus(corpus_zip).splits["test"])
    hyps = api.translate(source[:6], source_lang="en", target_lang="de")
    want = bleu_chrf(hyps, references[:6])
    assert (scores["bleu_multi_ref"], scores["chrf_multi_ref"]) == (want["bleu"], want["chrf"])
    french = bleu_chrf(api.translate(source[:6], source_lang="en", target_lang="fr"), references[:6])
    assert (want["bleu"], want["chrf"]) != (french["bleu"], french["chrf"])  # the pair was taken, not the default


def test_verify_with_a_pair_holds_the_graphs_to_generate_in_that_pair(cli, m2m100, tmp_path):
    hf, out = m2m100
    report = tmp_path / "report.json"
    result = cli("verify", out, "--checkpoint", f"hf:{hf}", "--sentences", 4, "--json", report, *PAIR)
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["languages"] == {"source": "en", "target": "de"}
    assert {r["output"] for r in data["rows"] if r["check"] == "generate" and r["ok"]} == {"greedy tokens", "beam 4 tokens"}


def test_a_recorded_pair_is_every_command_s_default(cli, m2m100, api, english, tmp_path):
    """`tk export DIR --source-lang en --target-lang de` makes en -> de what a command naming no pair translates: the
    forced target token too, not only the recorded codes (held to the unrecorded directory's German)."""
    from toolkit import Translator

    directory = tmp_path / "recorded"
    shutil.copytree(m2m100[1], directory)
    assert cli("export", directory, *PAIR).exit_code == 0
    german = api.translate(english, source_lang="en", target_lang="de")
    t = Translator(directory, provider="cpu", variant="fp32")
    assert t.translate(english) == german
    assert t.translate(english, source_lang="en", target_lang="de") == german
    plain = cli("translate", "--model", directory, "-q", "--variant", "fp32", *english)
    assert plain.exit_code == 0 and plain.stdout.splitlines() == german


@pytest.mark.parametrize("command", [
    ("translate", "--model", "{out}", "Hello."),
    ("translate-corpus", "{out}", "{tmp}/in.txt", "{tmp}/out"),
    ("evaluate", "{out}", "--limit", "2"),
    ("verify", "{out}", "--sentences", "1"),
    ("serve", "{out}", "--port", "0"),
])
def test_an_unknown_code_is_one_line_listing_the_model_s_codes(cli, m2m100, tmp_path, command):
    if command[0] == "translate-corpus":
        pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")
        (tmp_path / "in.txt").write_text("Hello.\n", encoding="utf-8")
    args = [a.format(out=m2m100[1], tmp=tmp_path) for a in command]
    line = one_line_error(cli(*args, "--source-lang", "en", "--target-lang", "xx"), 2)
    assert "unknown target language 'xx'; this model's codes: " in line and ", de, " in line and ", fr, " in line


def test_serve_routes_each_pair_of_the_one_model(m2m100, english):
    pytest.importorskip("httpx", reason="the serve extra is not installed: pip install -e '.[serve]'")
    from serve.test_serve import config, running, wait_ready

    from toolkit import Translator
    from toolkit.cli.commands.serve import served_models

    _, out = m2m100
    specs, default = served_models((str(out),), "cpu", None, None, "onnxruntime", {"source_lang": None, "target_lang": None})
    assert default is None and len(specs) == 1
    api = Translator(out, provider="cpu")  # the variant tk serve runs: the fastest, as the API's default
    with running(specs, config()) as client:
        wait_ready(client)
        for target in ("fr", "de"):
            for text in english[:3]:
                r = client.post("/translate", json={"q": text, "source": "en", "target": target})
                assert r.status_code == 200, r.text
                assert r.json()["translatedText"] == api.translate([text], source_lang="en", target_lang=target)[0]
        corpus = client.post("/translate", json={"texts": english[:3], "src_lang": "en", "tgt_lang": "de"})
        assert corpus.json()["translations"] == api.translate(english[:3], source_lang="en", target_lang="de")
        plain = client.post("/v1/translate", json={"text": english[:3]})  # no pair named: the model's own default
        assert plain.json()["translations"] == api.translate(english[:3])
        listed = {lang["code"]: lang["targets"] for lang in client.get("/languages").json()}
        assert {"fr", "de"} <= set(listed["en"]) and "en" in listed["de"]
        refused = client.post("/translate", json={"q": "Hi.", "source": "en", "target": "xx"})
        assert refused.status_code == 400 and "any two of" in refused.json()["error"]


def test_serve_s_languages_pick_the_default_pair(m2m100, english):
    pytest.importorskip("httpx", reason="the serve extra is not installed: pip install -e '.[serve]'")
    from serve.test_serve import running, wait_ready

    from toolkit import Translator
    from toolkit.cli.commands.serve import served_models
    from toolkit.serve.app import ServeConfig

    _, out = m2m100
    specs, default = served_models((str(out),), "cpu", None, None, "onnxruntime", {"source_lang": None, "target_lang": "de"})
    assert default == ("en", "de")
    with running(specs, ServeConfig(default_pair=default)) as client:
        wait_ready(client)
        got = client.post("/v1/translate", json={"text": english[:2]}).json()["translations"]
        assert got == Translator(out, provider="cpu").translate(english[:2], source_lang="en", target_lang="de")
        assert client.get("/frontend/settings").json()["language"]["target"]["code"] == "de"
