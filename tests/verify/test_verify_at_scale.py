"""`tk verify` of a model that never stops early: its decodes end at a bound (64 tokens, or --max-len, or the model's own
limit with --full), tk's decoding and transformers' generate are held to the same bound, and each stage says on stderr
when it starts and how long it took. The model: a tiny Marian built from config (toolkit.bench.scale_model) whose
generation config forbids the end token and allows 127 tokens."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def never_stops(tmp_path_factory) -> tuple[Path, Path]:
    """(the Hugging Face directory, the tk model directory exported from it)."""
    from toolkit.bench.scale_model import Shape, build
    from toolkit.pytorch.export import ExportOptions, export

    root = tmp_path_factory.mktemp("never-stops")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = build(Shape("never-stops", d_model=32, layers=1, heads=4, ffn=64, vocab=300, positions=128, init_std=0.2), root / "hf",
                   forced_end=True)  # as opus-mt's config
    export(ExportOptions(out=root / "tk", checkpoint=f"hf:{hf}"), echo=lambda m: None)
    return hf, root / "tk"


def _decoded_tokens(report: Path) -> int:
    """The most decoder steps any verify decode ran (step k is the (k+1)-th token)."""
    rows = json.loads(report.read_text())["rows"]
    steps = [int(m.group(1)) for r in rows if r["check"] == "decode" and (m := re.match(r"step=(\d+)", r["case"]))]
    return max(steps) + 1


@pytest.mark.slow
def test_verify_bounds_the_decodes_of_a_model_that_never_stops(cli, never_stops, tmp_path, monkeypatch):
    from toolkit.core.manifest import load
    from toolkit.verify import run
    from toolkit.verify.run import DECODE_TOKENS

    monkeypatch.setattr(run, "PROGRESS_WEIGHTS", 0)  # stage lines are for large models; this tiny one stands in
    hf, tk = never_stops
    assert load(tk).max_output_len > DECODE_TOKENS  # the model alone would decode past the bound
    default = cli("verify", tk, "--checkpoint", f"hf:{hf}", "--sentences", 3, "--json", tmp_path / "default.json")
    assert default.exit_code == 0, default.output
    assert _decoded_tokens(tmp_path / "default.json") == DECODE_TOKENS
    assert f"decodes run to at most {DECODE_TOKENS} tokens" in default.output
    # Every stage says when it starts and how long it took.
    for stage in ("loading the graphs", "building the PyTorch reference", "sweep", "decoding 3 sentences", "transformers' generate"):
        assert re.search(rf"verify: {re.escape(stage)}.*: \d+\.\d s", default.output), stage

    short = cli("verify", tk, "--checkpoint", f"hf:{hf}", "--sentences", 3, "--max-len", 5, "--json", tmp_path / "short.json")
    assert short.exit_code == 0, short.output  # generate is held to the same bound: its rows still pass
    assert _decoded_tokens(tmp_path / "short.json") == 5
    rows = json.loads((tmp_path / "short.json").read_text())["rows"]
    assert {r["detail"].split(" identical")[0] for r in rows if r["check"] == "generate"} == {"3/3"}


@pytest.mark.slow
def test_a_small_model_s_verify_prints_no_stage_lines_and_a_model_without_a_forced_end_matches_generate(cli, tmp_path):
    """Stage lines are for models whose verify takes minutes; and generate is held to the directory's own end-token rule
    (no forced_eos_token_id here), not the one the rebuilt config would otherwise force."""
    from toolkit.bench.scale_model import Shape, build
    from toolkit.pytorch.export import ExportOptions, export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = build(Shape("no-forced-end", d_model=32, layers=1, heads=4, ffn=64, vocab=300, positions=128, init_std=0.2),
                   tmp_path / "hf", forced_end=False)
    export(ExportOptions(out=tmp_path / "tk", checkpoint=f"hf:{hf}"), echo=lambda m: None)
    result = cli("verify", tmp_path / "tk", "--checkpoint", f"hf:{hf}", "--sentences", 3, "--max-len", 6, "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert not re.search(r"^verify: ", result.output, re.M), result.output
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert {r["detail"].split(" identical")[0] for r in rows if r["check"] == "generate"} == {"3/3"}


def test_max_len_and_full_are_refused_beside_to_hf(cli, tmp_path):
    result = cli("verify", tmp_path, "--to-hf", tmp_path / "hf", "--max-len", 8)
    assert result.exit_code != 0
    assert "drop --max-len" in result.output and "Traceback" not in result.output
