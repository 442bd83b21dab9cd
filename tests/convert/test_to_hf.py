"""Out to Hugging Face: `tk export exported/transformer --to-hf DIR` and `tk verify exported/transformer --to-hf DIR`.

The directory is written once per module from the shipped Transformer; transformers loads it as a user would
(MarianMTModel.from_pretrained, AutoTokenizer.from_pretrained). Its log-probabilities, tokenizer and greedy tokens are
held to tk's exported graphs; verify passes on it and fails on a copy with a planted conversion fault; what cannot be
mapped, and an existing directory, are refused in one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import one_line_error

from toolkit.core.declaration import transformer_layers

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "exported" / "transformer"
NEAR_TIE = 1e-4  # two tokens whose log-probabilities the graphs put this close may come out either way on another CPU
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """transformers' small steps on one thread: on 2 busy cores, 2 threads spinning for each other took generate of 30
    sentences from 0.7 s to 8 s. Restored for the modules after this one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    from click.testing import CliRunner

    from toolkit.cli import main

    out = tmp_path_factory.mktemp("to-hf") / "transformer-hf"
    result = CliRunner().invoke(main, ["export", str(SHIPPED), "--to-hf", str(out)])
    assert result.exit_code == 0, result.output
    assert f"tk verify {SHIPPED} --to-hf {out}" in result.output
    return out


@pytest.fixture(scope="module")
def hf(hf_dir):
    from transformers import AutoTokenizer, MarianMTModel

    return MarianMTModel.from_pretrained(hf_dir).eval(), AutoTokenizer.from_pretrained(hf_dir)


@pytest.fixture(scope="module")
def graphs():
    """tk's fp32 graphs of the shipped model on ONNX Runtime: the manifest and a step-backend factory."""
    from toolkit import runtimes
    from toolkit.core import manifest

    m = manifest.load(SHIPPED)
    return m, runtimes.load(m, "onnxruntime", "cpu", "fp32").backend


def challenge(path: Path, n: int) -> list[str]:
    return [line.split("\t")[2] for line in path.read_text(encoding="utf-8").splitlines()[:n]]


def test_transformers_loads_it_as_a_marian_model_with_tk_rules(hf_dir, hf):
    model, tokenizer = hf
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "source.spm", "target.spm", "vocab.json"} <= {p.name for p in hf_dir.iterdir()}
    c = model.config
    layers = transformer_layers(json.loads((SHIPPED / "manifest.json").read_text())["config"])  # the shipped model's (6, 2)
    assert (c.model_type, c.d_model, (c.encoder_layers, c.decoder_layers)) == ("marian", 256, layers)
    assert (c.vocab_size, c.max_position_embeddings) == (6000, 64)
    assert c.scale_embedding and c.activation_function == "relu" and c.tie_word_embeddings
    g = model.generation_config
    assert (g.decoder_start_token_id, g.eos_token_id, g.pad_token_id, g.forced_eos_token_id, g.num_beams, g.max_length) == (2, 3, 0, None, 1, 65)
    # The output layer is the embedding (tied), with no bias: tk's logits are h @ E^T.
    assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr()
    assert not model.final_logits_bias.any()
    assert "Fast" in type(tokenizer).__name__ or type(tokenizer).__name__ == "TokenizersBackend"


def test_log_probabilities_are_the_graphs_at_padded_shapes(hf, graphs):
    model, _ = hf
    m, backend = graphs
    rng = np.random.default_rng(1)
    for lens, t in (([11, 3, 1], 6), ([64, 40], 3)):
        b, s = len(lens), max(lens)
        mask = np.arange(s)[None, :] < np.array(lens)[:, None]
        src = np.where(mask, rng.integers(4, 6000, (b, s)), 0)
        tgt = np.concatenate([np.full((b, 1), 2), rng.integers(4, 6000, (b, t - 1))], axis=1)
        be = backend()
        state = be.encode(src, np.array(lens, dtype=np.int64))
        want = []
        for k in range(t):
            lp, state = be.step(tgt[:, k].copy(), state)
            want.append(lp)
        with torch.inference_mode():
            logits = model(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                           decoder_input_ids=torch.from_numpy(tgt)).logits
        got = torch.log_softmax(logits, dim=-1).numpy()
        np.testing.assert_allclose(got, np.stack(want, axis=1), atol=1e-4, rtol=1e-4)


def test_auto_tokenizer_gives_tk_ids_and_text_and_marian_tokenizer_needs_no_special_tokens(hf_dir, hf, challenge_test):
    import warnings

    from transformers import MarianTokenizer

    from toolkit.core.tokenizer import Tokenizer

    _, tokenizer = hf
    tk = Tokenizer.load(SHIPPED / "tokenizer.model")
    english = challenge(challenge_test, 300) + ["  Ｔｈｅ  ﬁrst ⦅0⦆ costs ⦅1⦆€.\u00a0", "Ça coûte 5 € — 🙂", ""]
    assert tokenizer(english)["input_ids"] == tk.encode(english)  # no end token on the source
    # Where a conversion goes wrong first: typed "▁", "<" and "</s>", whitespace and format characters, byte fallback.
    rng = np.random.default_rng(0)
    bits = [tk.sp.id_to_piece(int(i)).replace("▁", " ") for i in rng.integers(0, tk.vocab_size, 1000)]
    bits += ["▁", " ", "\t", "\u3000", "\u200b", "\ufeff", "<", "</s>", "<unk>", "<0x41>", "⦅0⦆", "🙂", "中"] * 40
    odd = ["".join(rng.choice(bits, int(rng.integers(0, 8)))) for _ in range(500)]
    assert tokenizer(odd)["input_ids"] == tk.encode(odd)
    french = [line.split("\t")[3] for line in challenge_test.read_text(encoding="utf-8").splitlines()[:300]]
    ids = tk.encode(french)
    assert tokenizer.batch_decode(ids, skip_special_tokens=True) == tk.decode(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        marian = MarianTokenizer.from_pretrained(hf_dir)
    plain = english[:50]
    assert [marian(e, add_special_tokens=False)["input_ids"] for e in plain] == tk.encode(plain)
    assert marian(plain[0])["input_ids"] == [*tk.encode(plain[:1])[0], 3]  # what the docs warn about


def test_greedy_generate_gives_tk_greedy_translations(hf, graphs, challenge_test):
    """30 Tatoeba Challenge sentences: generate (AutoTokenizer, the generation config) against tk's greedy loop on the
    graphs without text handling or guards; the tokens may part only at a near-tie, which rounding on another CPU may
    break either way."""
    from toolkit import Translator
    from toolkit.core.decoding import greedy
    from toolkit.verify.checks import prefix_log_probs

    model, tokenizer = hf
    m, backend = graphs
    english = challenge(challenge_test, 30)
    batch = tokenizer(english, return_tensors="pt", padding=True, truncation=True)
    with torch.inference_mode():
        out = model.generate(**batch)
    texts = tokenizer.batch_decode(out, skip_special_tokens=True)
    got = [row[1: row.index(3, 1)] if 3 in row[1:] else [t for t in row[1:] if t != 0] for row in out.tolist()]
    src = tokenizer(english)["input_ids"]
    want = [h.tokens for h in greedy(backend(), src, m.max_output_len, rules=m.rules())]
    parted = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    assert len(parted) <= 1, parted
    for i in parted:
        k = next(k for k, (a, b) in enumerate(zip([*want[i], 3], [*got[i], 3])) if a != b)
        lp = prefix_log_probs(backend(), src[i], want[i][:k], m.rules())
        pick = [t[k] if k < len(t) else 3 for t in (want[i], got[i])]
        assert abs(float(lp[pick[0]] - lp[pick[1]])) < NEAR_TIE, (i, k, pick)
    raw = Translator(SHIPPED).translate(english, raw=True, loop_guard=False, max_len_a=None)
    assert sum(a != b for a, b in zip(raw, texts)) == len(parted)


def test_verify_passes_on_the_written_directory(cli, hf_dir, corpus_zip, tmp_path):
    report = tmp_path / "report.json"
    result = cli("verify", SHIPPED, "--to-hf", hf_dir, "--sentences", 8, "--data", corpus_zip, "--json", report)
    assert result.exit_code == 0, result.output
    rows = json.loads(report.read_text())["rows"]
    assert {r["check"] for r in rows} == {"static", "sweep", "tokenizer", "generate"} and all(r["ok"] for r in rows)
    assert sum(r["check"] == "sweep" for r in rows) >= 4 and "8/8 identical to tk's greedy" in result.output


def _swap_cross_kv(directory: Path) -> None:
    from safetensors.numpy import load_file, save_file

    w = load_file(directory / "model.safetensors")
    key = "model.decoder.layers.1.encoder_attn.{}_proj.weight"
    w[key.format("k")], w[key.format("v")] = w[key.format("v")], w[key.format("k")]
    save_file(w, directory / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("fault", ["cross-attention K and V swapped", "channel permutation left out"])
def test_verify_fails_on_a_planted_conversion_fault(cli, hf_dir, tmp_path, fault, monkeypatch):
    from safetensors.numpy import save_file

    from toolkit.convert import to_hf
    from toolkit.core import manifest
    from toolkit.runtimes.ctranslate2.spec import graph_weights

    bad = tmp_path / "bad"
    shutil.copytree(hf_dir, bad)
    if fault.startswith("cross"):
        _swap_cross_kv(bad)
    else:
        m = manifest.load(SHIPPED)
        monkeypatch.setattr(to_hf, "channels", np.arange)  # tk's channel order kept: the permutation left out
        save_file(to_hf.marian_tensors(graph_weights(m), m.config), bad / "model.safetensors", metadata={"format": "pt"})
    report = tmp_path / "report.json"
    result = cli("verify", SHIPPED, "--to-hf", bad, "--sentences", 0, "--json", report)
    line = one_line_error(result, 1)
    assert "sweep MarianMTModel/log_probs" in line
    rows = json.loads(report.read_text())["rows"]
    assert not any(r["ok"] for r in rows if r["check"] == "sweep")
    assert all(r["ok"] for r in rows if r["check"] == "static")  # the files are right; the numbers are not


def _copy_with(tmp_path: Path, edit) -> Path:
    """A model directory like the shipped one (its big files linked, not copied) with its manifest edited by `edit`."""
    out = tmp_path / "model"
    out.mkdir()
    for f in SHIPPED.iterdir():
        (out / f.name).symlink_to(f)
    (out / "manifest.json").unlink()
    data = json.loads((SHIPPED / "manifest.json").read_text())
    edit(data, out)
    (out / "manifest.json").write_text(json.dumps(data))
    return out


def _pre_ln(data, out):
    data["config"]["pre_ln"] = True


def _tokenizer_missing(data, out):
    (out / "tokenizer.model").unlink()


@pytest.mark.parametrize("case", ["gru", "pre-LN", "tokenizer missing", "not a model directory"])
def test_what_cannot_be_mapped_is_refused_in_one_line(cli, tmp_path, case):
    source = {"gru": lambda: REPO / "exported" / "seq2seq", "pre-LN": lambda: _copy_with(tmp_path, _pre_ln),
              "tokenizer missing": lambda: _copy_with(tmp_path, _tokenizer_missing), "not a model directory": lambda: tmp_path}[case]()
    line = one_line_error(cli("export", source, "--to-hf", tmp_path / "hf"), 2)
    assert {"gru": "'seq2seq' model", "pre-LN": "pre-LN", "tokenizer missing": "tokenizer.model is listed",
            "not a model directory": "needs an exported model directory"}[case] in line
    assert not (tmp_path / "hf").exists()


def test_an_existing_directory_needs_force_and_force_replaces_only_a_marian_directory(cli, hf_dir, tmp_path):
    target = tmp_path / "hf"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    assert "use --force" in one_line_error(cli("export", SHIPPED, "--to-hf", target), 2)
    assert "will not delete it" in one_line_error(cli("export", SHIPPED, "--to-hf", target, "--force"), 2)
    assert (target / "notes.txt").read_text() == "mine"
    shutil.rmtree(target)
    shutil.copytree(hf_dir, target)
    (target / "stale.bin").write_bytes(b"old")
    result = cli("export", SHIPPED, "--to-hf", target, "--force")
    assert result.exit_code == 0, result.output
    # tk's files replaced, a file tk did not write kept (issue 46: --force never deletes what tk did not write)
    assert (target / "stale.bin").read_bytes() == b"old"
    assert (target / "model.safetensors").stat().st_size == (hf_dir / "model.safetensors").stat().st_size
    assert "as it is" in one_line_error(cli("export", SHIPPED, "--to-hf", target, "--fp16"), 2)
    assert "does not exist" in one_line_error(cli("verify", SHIPPED, "--to-hf", tmp_path / "nowhere"), 2)
    assert "drop --record" in one_line_error(cli("verify", SHIPPED, "--to-hf", target, "--record"), 2)


# tokenizer.json edited after the export, each as a user (or a careless hand) might: verify must compare tokenizations
# on text that exercises the normalizer, not only on plain corpus sentences (which tokenize alike with or without it).
def _normalizer_removed(tokenizer: dict) -> None:
    tokenizer["normalizer"] = None


def _nfkc_as_nfc(tokenizer: dict) -> None:
    steps = tokenizer["normalizer"]["normalizers"]
    assert steps[0] == {"type": "NFKC"}
    steps[0] = {"type": "NFC"}


def _whitespace_runs_kept(tokenizer: dict) -> None:
    steps = tokenizer["normalizer"]["normalizers"]
    collapse = [s for s in steps if s["type"] == "Replace" and s["content"] == " "]
    assert len(collapse) == 1
    steps.remove(collapse[0])


TAMPERS = {"normalizer removed": (_normalizer_removed, {"whitespace runs", "fullwidth letters", "decomposed accents"}),
           "NFKC replaced by NFC": (_nfkc_as_nfc, {"fullwidth letters", "fullwidth digits", "ligatures"}),
           "whitespace collapse dropped": (_whitespace_runs_kept, {"whitespace runs", "tabs and newlines", "no-break and other spaces"})}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_verify_fails_when_the_tokenizer_json_normalizer_was_tampered_with(cli, hf_dir, tmp_path, tamper):
    edit, must_fail = TAMPERS[tamper]
    bad = tmp_path / "bad"
    shutil.copytree(hf_dir, bad)
    data = json.loads((bad / "tokenizer.json").read_text(encoding="utf-8"))
    edit(data)
    (bad / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    report = tmp_path / "report.json"
    line = one_line_error(cli("verify", SHIPPED, "--to-hf", bad, "--sentences", 0, "--json", report), 1)
    assert "tokenizer MarianMTModel/normalization ids (AutoTokenizer)" in line
    rows = json.loads(report.read_text())["rows"]
    failed = [r for r in rows if not r["ok"]]
    assert must_fail <= {r["case"] for r in failed}
    # one row per text that tokenizes differently, naming the text; the model, the configs and Marian's files still pass
    assert all(r["output"] == "normalization ids (AutoTokenizer)" and "tk" in r["detail"] for r in failed)
    assert all(r["ok"] for r in rows if r["check"] in ("static", "sweep") or "MarianTokenizer" in r["output"])


def test_verify_fails_when_marian_vocabulary_was_tampered_with(cli, hf_dir, tmp_path):
    """vocab.json maps SentencePiece's pieces to ids for MarianTokenizer (the slow tokenizer): two ids swapped there
    change what a user of MarianTokenizer feeds the model, while AutoTokenizer (tokenizer.json) is still right."""
    from toolkit.core.tokenizer import Tokenizer

    tk = Tokenizer.load(SHIPPED / "tokenizer.model")
    first, second = (tk.sp.id_to_piece(i) for i in tk.encode(["I am home."])[0][:2])
    bad = tmp_path / "bad"
    shutil.copytree(hf_dir, bad)
    vocab = json.loads((bad / "vocab.json").read_text(encoding="utf-8"))
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (bad / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    report = tmp_path / "report.json"
    line = one_line_error(cli("verify", SHIPPED, "--to-hf", bad, "--sentences", 0, "--json", report), 1)
    assert "tokenizer MarianMTModel/normalization ids (MarianTokenizer" in line
    rows = json.loads(report.read_text())["rows"]
    assert "whitespace runs" in {r["case"] for r in rows if not r["ok"]}
    assert all(r["ok"] for r in rows if "AutoTokenizer" in r["output"] or r["check"] != "tokenizer")


def test_the_normalization_texts_tokenize_alike_in_the_written_directory(hf_dir, hf):
    """The untampered directory: AutoTokenizer and MarianTokenizer (on tk-normalized text) give tk's ids on every
    normalization text, and those texts cover what tk's normalize folds."""
    from toolkit.convert.to_hf import NORMALIZATION_TEXTS
    from toolkit.convert.to_hf_parity import normalization_rows
    from toolkit.core import manifest
    from toolkit.core.tokenizer import normalize
    from toolkit.verify.report import Report

    report = Report(str(SHIPPED), 0)
    normalization_rows(report, manifest.load(SHIPPED), hf_dir, hf[1])
    assert report.rows and all(r.ok for r in report.rows), [r.detail for r in report.rows if not r.ok]
    assert {r.output for r in report.rows} == {"normalization ids (AutoTokenizer)", "normalization ids (MarianTokenizer, tk-normalized text)"}
    texts = [t for _, t in NORMALIZATION_TEXTS]
    assert sum(normalize(t) != t for t in texts) >= 10 and "" in texts
    assert {"\t", "\u00a0", "Ｉ", "１", "ﬁ", "\u0301", "🙂"} <= {c for t in texts for c in t}
