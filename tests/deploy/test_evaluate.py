"""`tk evaluate` end to end on the tiny model: scores printed, and --record stores exactly them."""

from __future__ import annotations

import json
import shutil

from toolkit.core import data, manifest
from toolkit.core.batching import DecodeOptions
from toolkit.core.scoring import bleu_chrf
from toolkit.deploy.translate import open_model, translate_batch


def test_evaluate_scores_the_test_split_and_record_stores_the_same_scores(cli, tiny_export, corpus_zip, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_export, model)
    before = manifest.load(model).to_dict()
    result = cli("evaluate", model, "--data", corpus_zip, "--beam", 1, "--limit", 6, "--record")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()  # progress lines on stderr, then the scores as indented JSON on stdout
    start = lines.index("{")
    printed = json.loads("\n".join(lines[start: lines.index("}", start) + 1]))
    greedy = printed["test_split_greedy"]
    assert greedy["sentences"] == 6 and printed["variant"] == "fp32"
    # the scores are printed once, as JSON; the line said while they come in is for a person, not a Python dict
    progress = [line for line in lines[:start] if line.startswith("test_split greedy")]
    assert progress == [f"test_split greedy: BLEU {greedy['bleu_multi_ref']:.2f}, chrF {greedy['chrf_multi_ref']:.2f} (6 sentences, "
                        f"{greedy['seconds']} s)"], lines[:start]
    assert not any("{" in line for line in lines[:start])
    # The score is that of the translations tk translate would give for the same sentences.
    english, refs = data.references(data.load_corpus(str(corpus_zip)).splits["test"])
    t = open_model(model, "cpu")
    hyps = [n[0].text for n in translate_batch(t, english[:6], DecodeOptions.for_manifest(t.manifest))]
    assert greedy["bleu_multi_ref"] == bleu_chrf(hyps, refs[:6])["bleu"]
    after = manifest.load(model).to_dict()
    assert after["metrics"]["evaluation"] == printed
    assert {k: v for k, v in after.items() if k != "metrics"} == {k: v for k, v in before.items() if k != "metrics"}
    assert {k: v for k, v in after["metrics"].items() if k != "evaluation"} == before["metrics"]


def test_evaluate_without_record_leaves_the_manifest_alone(cli, tiny_export, corpus_zip, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_export, model)
    before = (model / manifest.NAME).read_bytes()
    assert cli("evaluate", model, "--data", corpus_zip, "--beam", 1, "--limit", 2).exit_code == 0
    assert (model / manifest.NAME).read_bytes() == before


def test_evaluate_of_one_sentence_scores_it_and_says_confidence_needs_more(cli, tiny_export, corpus_zip):
    result = cli("evaluate", tiny_export, "--data", corpus_zip, "--beam", 1, "--limit", 1)
    assert result.exit_code == 0, result.output
    assert "confidence, test_split greedy: not measured on one sentence" in result.output and '"sentences": 1' in result.output


def test_evaluate_on_cuda_refuses_a_silent_cpu_run_and_never_records_its_scores(cli, tiny_export, corpus_zip, tmp_path,
                                                                                 cuda_falls_back):
    """Scores said to be CUDA's must be CUDA's: where the provider does not load, one line and no scores; and the
    manifest's records stay the CPU's figures, which other commands compare against."""
    model = tmp_path / "model"
    shutil.copytree(tiny_export, model)
    before = (model / manifest.NAME).read_bytes()
    refused = cli("evaluate", model, "--data", corpus_zip, "--beam", 1, "--limit", 2, "--provider", "cuda")
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert refused.output.strip().splitlines()[-1].startswith("error: ONNX Runtime could not load its CUDA provider")
    assert "BLEU" not in refused.output
    for extra in ("--record", "--calibrate", "--robustness"):
        result = cli("evaluate", model, "--data", corpus_zip, "--limit", 2, "--provider", "cuda", extra)
        assert result.exit_code == 2 and "--provider cuda scores the test sets only: drop --record" in result.output
    assert (model / manifest.NAME).read_bytes() == before
    scored = cli("evaluate", model, "--data", corpus_zip, "--beam", 1, "--limit", 2)
    assert scored.exit_code == 0 and '"provider": "cpu"' in scored.output
