"""--runtime ctranslate2: the converted copy `tk export DIR --ctranslate2` stores is proven by `tk verify --runtime
ctranslate2` (which a converter fault fails), decodes what tk's loop decodes on the ONNX graphs, guards and scores
included, and runs behind tk translate, the API, the server and corpus translation with tk's text handling around it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("ctranslate2", reason="the ct2 extra (in dev) installs ctranslate2")

from helpers import one_line_error, store_unchecked_ct2  # noqa: E402

from toolkit.core import manifest  # noqa: E402
from toolkit.core.decode_options import DecodeOptions  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "exported" / "transformer"


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A copy of the shipped Transformer with its CTranslate2 model stored."""
    from click.testing import CliRunner

    from toolkit.cli import main

    out = tmp_path_factory.mktemp("ct2") / "transformer"
    shutil.copytree(SHIPPED, out)
    result = CliRunner().invoke(main, ["export", str(out), "--ctranslate2"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def challenge_lines(challenge_test) -> list[str]:
    return [line.split("\t")[2] for line in challenge_test.read_text(encoding="utf-8").splitlines()[:60]]


def test_export_stores_the_conversion_under_plain_names_with_digests_and_refuses_to_redo_it_unasked(converted, cli):
    m = manifest.load(converted)
    record = m.converted["ctranslate2"]
    assert set(record.files) == {"model.bin", "config.json", "shared_vocabulary.json"}
    assert all(e.file == f"ctranslate2.{name}" and (converted / e.file).is_file() for name, e in record.files.items())
    assert record.version == __import__("ctranslate2").__version__
    m.check_files()  # every stored file has its digest
    assert "already has a CTranslate2 model; use --force" in one_line_error(cli("export", converted, "--ctranslate2"), 2)


def test_verify_passes_and_a_swapped_key_value_half_fails_it(converted, tmp_path, cli, monkeypatch):
    result = cli("verify", converted, "--runtime", "ctranslate2", "--sentences", 4)
    assert result.exit_code == 0, result.output
    assert "score " in result.output and "4/4 identical to the ONNX graphs'" in result.output

    from toolkit.runtimes.ctranslate2 import spec

    faulty = tmp_path / "faulty"
    shutil.copytree(converted, faulty)
    real = spec.graph_weights

    def swapped(m):
        w = real(m)
        k, v = "decoder_blocks.0.cross_attention.W_k.weight", "decoder_blocks.0.cross_attention.W_v.weight"
        w[k], w[v] = w[v], w[k]
        return w

    monkeypatch.setattr(spec, "graph_weights", swapped)
    store_unchecked_ct2(faulty)
    result = cli("verify", faulty, "--runtime", "ctranslate2", "--sentences", 0)
    assert result.exit_code == 1, result.output
    score_rows = [line for line in result.output.splitlines() if line.startswith("score")]
    assert score_rows and all(line.split()[-1] == "FAIL" for line in score_rows)


def _greedy_both(m, src, opts):
    from toolkit import runtimes
    from toolkit.core.batching import decode_ids

    onnx = decode_ids(runtimes.load(m, "onnxruntime", "cpu", "fp32").backend(), src, opts)
    ct2 = decode_ids(runtimes.load(m, "ctranslate2", "cpu", "fp32").backend(), src, opts)
    return [h[0] for h in onnx], [h[0] for h in ct2]


def _near_tie(m, src: list[int], a: list[int], b: list[int]) -> bool:
    """Whether the ONNX graphs themselves score the first differing tokens of a and b within 1e-3."""
    from toolkit import runtimes
    from toolkit.verify.checks import prefix_log_probs

    step = next(k for k, (x, y) in enumerate(zip(a + [-1], b + [-1])) if x != y)
    rules = m.rules()
    lp = prefix_log_probs(runtimes.load(m, "onnxruntime", "cpu", "fp32").backend(), src, a[:step], rules)
    x, y = (t[step] if step < len(t) else rules.end for t in (a, b))
    return abs(float(lp[x] - lp[y])) < 1e-3


@pytest.mark.parametrize("guards", [dict(max_len_a=None, loop_guard=False), dict(max_len_a=0.5, max_len_b=1, loop_guard=True)])
def test_greedy_gives_tks_tokens_stops_and_scores_guards_included(converted, challenge_lines, guards):
    from toolkit.core.tokenizers import open_tokenizer

    m = manifest.load(converted)
    # Sentences that loop, a sentence cut by the length guard, and ordinary ones.
    lines = challenge_lines[:40] + ["ha ha ha ha ha ha ha ha ha ha ha ha", "no no no no no no no no no no no no no",
                                    "the the the the the the the the the the"]
    src = open_tokenizer(m).encode(lines)
    # Batches of 8: a call of several batches, which runs on CTranslate2's batch-parallel copy where there are cores.
    onnx, ct2 = _greedy_both(m, src, DecodeOptions.bare(max_len=m.max_output_len, rules=m.rules(), batch_size=8, **guards))
    stops = {h.stopped for h in onnx}
    # Each way a decode ends is covered: the end token unguarded (a sentence may also run to the model's limit), the
    # length and loop guards guarded (an output short enough may still end on its end token there).
    if guards["loop_guard"]:
        assert {"length", "loop"} <= stops <= {"", "length", "loop"}, stops
    else:
        assert "" in stops and stops <= {"", "length"}, stops
    for s, a, b in zip(src, onnx, ct2):
        if a.tokens != b.tokens:
            assert _near_tie(m, s, a.tokens, b.tokens), (a, b)
            continue
        assert a.stopped == b.stopped
        assert b.score == pytest.approx(a.score, abs=1e-4 * (len(a.tokens) + 1))  # fp32 rounding, about 1e-5 a step


def test_text_handling_runs_around_it_and_the_api_and_cli_agree_with_onnx(converted, challenge_lines, cli):
    from toolkit import Translator

    lines = challenge_lines[:30] + ["I have 3 cats and 12 dogs. They live at 5 Main Street.", "THE CAT IS BLACK.",
                                    "Call 555 0199 now."]
    onnx = Translator(converted, variant="fp32").translate(lines)
    ct2 = Translator(converted, runtime="ctranslate2").translate(lines)
    differ = [i for i, (a, b) in enumerate(zip(onnx, ct2)) if a != b]
    assert len(differ) <= 1, [(onnx[i], ct2[i]) for i in differ]  # a near-tie at most (checked token by token above)
    assert "3" in ct2[-3] and "12" in ct2[-3] and ct2[-2].isupper() and "555 0199" in ct2[-1]
    result = cli("translate", "--model", converted, "--runtime", "ctranslate2", *lines[-3:])
    assert result.exit_code == 0, result.output
    assert [line for line in result.output.splitlines() if line in ct2[-3:]] == ct2[-3:]
    assert "on cpu (ctranslate2 " in result.output


def test_beam_and_n_best_come_back_with_sums_of_log_probabilities(converted):
    from toolkit import Translator

    onnx = Translator(converted, variant="fp32").translate_batch(["He is running."], beam=4, n_best=2)[0]
    ct2 = Translator(converted, runtime="ctranslate2").translate_batch(["He is running."], beam=4, n_best=2)[0]
    assert len(ct2) == len(onnx) == 2
    assert ct2[0].text == onnx[0].text and ct2[0].score == pytest.approx(onnx[0].score, abs=1e-3)
    # The runners-up come from each side's own beam rule (CTranslate2 keeps finished hypotheses its own way), so only
    # where they are the same text are their sums of log-probabilities held equal; each is below the best.
    assert ct2[1].score <= ct2[0].score and onnx[1].score <= onnx[0].score
    if ct2[1].text == onnx[1].text:
        assert ct2[1].score == pytest.approx(onnx[1].score, abs=1e-3)


def test_missing_conversion_cuda_and_variants_are_refused_in_one_line(converted, cli):
    assert "tk export exported/transformer --ctranslate2" in one_line_error(
        cli("translate", "--model", "exported/transformer", "--runtime", "ctranslate2", "Hello."), 2).replace(str(REPO) + "/", "")
    assert "CTranslate2 sees no CUDA device" in one_line_error(
        cli("translate", "--model", converted, "--runtime", "ctranslate2", "--provider", "cuda", "Hello."), 1)
    result = cli("translate", "--model", converted, "--runtime", "ctranslate2", "--provider", "cuda", "--allow-cpu-fallback", "Hello.")
    assert result.exit_code == 0 and "on cpu (ctranslate2" in result.output
    assert "not fp16" in one_line_error(cli("translate", "--model", converted, "--runtime", "ctranslate2", "--variant", "fp16", "Hi."), 2)


def test_a_tampered_or_escaping_conversion_is_refused(converted, tmp_path, cli):
    bad = tmp_path / "bad"
    shutil.copytree(converted, bad)
    with open(bad / "ctranslate2.model.bin", "r+b") as f:
        f.seek(4096)
        f.write(b"\x00\x01\x02\x03")
    assert "does not match the sha256" in one_line_error(cli("translate", "--model", bad, "--runtime", "ctranslate2", "Hi."), 2)
    data = json.loads((converted / "manifest.json").read_text())
    data["converted"]["ctranslate2"]["files"]["model.bin"]["file"] = "../model.bin"
    escaping = tmp_path / "escaping"
    shutil.copytree(converted, escaping)
    (escaping / "manifest.json").write_text(json.dumps(data))
    assert "must be a file name inside the model directory" in one_line_error(
        cli("translate", "--model", escaping, "--runtime", "ctranslate2", "Hi."), 2)


def test_the_server_and_a_corpus_shard_run_on_it(converted, challenge_lines, tmp_path):
    pytest.importorskip("httpx", reason="the serve extra is not installed")
    from serve.test_serve import config, running, wait_ready

    from toolkit import Translator
    from toolkit.corpus import inputs
    from toolkit.corpus.worker import ShardTranslator
    from toolkit.deploy.translate import open_model

    lines = challenge_lines[:6]
    expected = Translator(converted, runtime="ctranslate2").translate(lines)
    with running(lambda: open_model(converted, "cpu", runtime="ctranslate2"), config()) as client:
        wait_ready(client)
        assert client.post("/v1/translate", json={"text": lines}).json()["translations"] == expected
    shard = tmp_path / "shard.txt"
    shard.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    _, digest = inputs.read_text(str(shard), 0, len(lines))
    worker = ShardTranslator(str(converted), "cpu", "fp32", 1, DecodeOptions.for_model(64, "cpu", streams=1),
                             {"keep": (), "split": True, "enabled": True}, False, runtime="ctranslate2")
    status, text, error = worker.translate_shard({"shard": 0, "path": str(shard), "kind": "text", "first_line": 1,
                                                  "lines": len(lines), "offset": 0, "input_sha256": digest, "column": ""})
    assert (status, error) == ("done", None) and text.splitlines() == expected
