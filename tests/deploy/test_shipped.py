"""The models shipped in exported/: intact, translating, and still in parity with PyTorch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from toolkit.core import manifest

EXPORTED = Path(__file__).resolve().parents[2] / "exported"
SHIPPED = ["transformer", "seq2seq", "nw"]
SIZE_BUDGET = 40 * 2**20


@pytest.mark.parametrize("name", SHIPPED)
def test_manifest_matches_its_files_and_records_provenance(name):
    m = manifest.load(EXPORTED / name)
    m.check_files()
    assert m.checkpoint.weights_sha256
    assert m.training.command.startswith("tk train") and m.training.seed is not None
    # The translation models were trained on Tatoeba (CC BY 2.0 FR asks for attribution); nw on synthetic data.
    assert (EXPORTED / name / "LICENSE-DATA.md").is_file() == (name != "nw")
    assert m.verification["onnxruntime/cpu"].passed


@pytest.mark.parametrize("name", ["transformer", "seq2seq"])
def test_translation_models_record_their_scores_as_tk_evaluate_measures_them(name, cli, tmp_path, challenge_test):
    """The shipped scores are what `tk evaluate --record` writes: re-measured here on the first sentences
    of each set (in a copy), the greedy scores land near the recorded full-set ones."""
    shipped = manifest.load(EXPORTED / name).to_dict()
    for key in ("test_split_greedy", "test_split_beam4", "tatoeba_challenge_greedy", "tatoeba_challenge_beam4"):
        assert shipped["metrics"]["evaluation"][key]["sentences"] > 1000
    assert shipped["training"]["data"]["sha256"] == "0bb85dbaa1c896844649094d7eaf2e34bee34e84fe362b26ce7e8f2e12aae104"
    assert "CC BY 2.0 FR" in (EXPORTED / name / "LICENSE-DATA.md").read_text()
    copy = tmp_path / name
    shutil.copytree(EXPORTED / name, copy)
    result = cli("evaluate", copy, "--challenge", challenge_test, "--beam", 1, "--limit", 300, "--record")
    assert result.exit_code == 0, result.output
    measured = manifest.load(copy).to_dict()["metrics"]["evaluation"]
    for key, score in (("test_split_greedy", "bleu_multi_ref"), ("tatoeba_challenge_greedy", "bleu")):
        assert measured[key]["sentences"] == 300
        # 300 sentences against a few thousand: the same model lands within a few BLEU of its full-set score.
        assert abs(measured[key][score] - shipped["metrics"]["evaluation"][key][score]) < 12, (key, measured[key])


def test_everything_shipped_fits_the_size_budget():
    total = sum(p.stat().st_size for p in EXPORTED.rglob("*") if p.is_file())
    assert total <= SIZE_BUDGET, f"exported/ holds {total / 2**20:.1f} MiB, budget 40 MiB"


# The teaching material's four examples, with every correct translation the corpus gives them.
TEXTBOOK = {
    "Go.": {"Va !", "Allez-y !", "Vas-y !", "Allez !", "Bouge !", "En route !", "Marche.", "Pars !"},
    "I lost.": {"J'ai perdu."},
    "He's calm.": {"Il est calme."},
    "I'm home.": {"Je suis chez moi.", "Je suis à la maison."},
}


@pytest.mark.parametrize("name", ["transformer", "seq2seq"])
def test_shipped_models_translate_the_textbook_examples(cli, name):
    result = cli("translate", "--model", EXPORTED / name, "-q", *TEXTBOOK)
    assert result.exit_code == 0, result.output
    out = result.output.splitlines()
    assert len(out) == 4
    for (english, correct), french in zip(TEXTBOOK.items(), out):
        assert french in correct, f"{name}: {english!r} -> {french!r}"


@pytest.mark.parametrize("name", ["transformer", "seq2seq"])
def test_translation_models_record_their_robustness(name):
    sets = manifest.load(EXPORTED / name).to_dict()["metrics"]["robustness"]["sets"]
    for key in ("clean", "no_final_punct", "lower_no_punct", "all_caps", "title_case", "short", "pass_through", "joined"):
        assert sets[key]["sentences"] > 10 and "runaway_unguarded" in sets[key]


def test_the_shipped_transformer_translates_sensibly(cli):
    result = cli("translate", "-q", "I'm home.", "I lost.", "Where is the station?")
    out = [line.lower() for line in result.output.splitlines()]
    assert "maison" in out[0] or "chez moi" in out[0]
    assert "perdu" in out[1]
    assert out[2].startswith("où") and "gare" in out[2]


def test_default_model_is_the_shipped_transformer(cli):
    result = cli("translate", "I'm home.")
    assert result.exit_code == 0 and "exported/transformer" in result.output.replace("\\", "/")


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.slow
def test_short_verify_passes_on_cpu(cli, name, tmp_path, monkeypatch, corpus_zip):
    """As on a fresh clone: no training checkpoint (the manifest's relative checkpoint path leads nowhere
    from here), so verify rebuilds its PyTorch reference from the weights the graphs hold, and says so."""
    monkeypatch.setenv("TK_DATA", str(corpus_zip))
    monkeypatch.chdir(tmp_path)
    # int8 too: with one weight scale per tensor it failed its tolerance on an AVX2-only CPU (no VNNI).
    result = cli("verify", EXPORTED / name, "--sentences", 4, "--variant", "fp32", "--variant", "int8", "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"]
    # Without the training checkpoint (a fresh clone) the reference is the graphs' own weights, and
    # the report must say that this proves the computation only.
    assert report["reference_kind"] == "graphs" and "computation only" in report["reference_proves"]
    assert "weights read from the fp32 graphs (checkpoint not on this machine)" in result.output


def _strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_manifests_name_no_machine_paths(name):
    """A manifest travels with the model: it says what the checkpoint and corpus were, not where they lay."""
    raw = json.loads((EXPORTED / name / manifest.NAME).read_text(encoding="utf-8"))
    absolute = [s for s in _strings(raw) if s.startswith("/") or " /" in s and "://" not in s]
    assert absolute == []
    for record in raw["verify"].values():
        if record["reference"].startswith("checkpoint"):
            assert "sha256" in record["reference"]
