"""Hugging Face directories and CTranslate2 conversions are files from outside (issue 46), and verify's weights check
must not fail a model whose identical tensors the exporter stored once (issue 49).

- `tk export hf:DIR` refuses, in one line naming the file and the field or tensor, what it used to accept and then fail
  on (or translate to nothing) later: ill-typed generation fields, tensors that are not dense floating-point weights,
  vocabulary ids outside the model, unloadable SentencePiece models, non-finite weights, and weights of other shapes
  than the config's (checked before the model is built).
- A CTranslate2 conversion whose files were edited with their digests rewritten is refused at load by translate,
  verify, the API and the server; graphs whose external data points out of the directory are refused by --to-hf and
  --ctranslate2; `tk verify M --to-hf` of another model's directory fails in one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
import torch
from helpers import one_line_error, rehash
from hf_marian_fixture import untrained_marian

from toolkit.core.digests import file_sha256

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "exported" / "transformer"


@pytest.fixture(scope="module")
def untrained_hf(tmp_path_factory, corpus_zip) -> Path:
    """A tiny MarianMTModel as initialised (no training): every bias is zero and every LayerNorm weight one, so the
    exporter stores each group of identical tensors once."""
    return untrained_marian(tmp_path_factory, corpus_zip)


@pytest.fixture(scope="module")
def untrained_export(tmp_path_factory, untrained_hf) -> Path:
    """`tk export hf:` of the untrained model."""
    from click.testing import CliRunner

    from toolkit.cli import main

    out = tmp_path_factory.mktemp("tk") / "tk"
    result = CliRunner().invoke(main, ["export", f"hf:{untrained_hf}", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A copy of the shipped Transformer with its CTranslate2 conversion stored."""
    pytest.importorskip("ctranslate2", reason="the ct2 extra (in dev) installs ctranslate2")
    from click.testing import CliRunner

    from toolkit.cli import main

    out = tmp_path_factory.mktemp("ct2") / "transformer"
    shutil.copytree(SHIPPED, out)
    result = CliRunner().invoke(main, ["export", str(out), "--ctranslate2"])
    assert result.exit_code == 0, result.output
    return out


def _copy(hf: Path, tmp_path: Path) -> Path:
    bad = tmp_path / "bad"
    shutil.copytree(hf, bad)
    return bad


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _export_refused(cli, source: Path, tmp_path: Path) -> str:
    """`tk export hf:SOURCE` fails in one line (exit 2) and writes no model directory; returns the line."""
    line = one_line_error(cli("export", f"hf:{source}", "--out", tmp_path / "out"), 2)
    assert not (tmp_path / "out").exists()
    # A fault of the Hugging Face source: re-exporting it would meet the same fault.
    assert "re-export" not in line
    return line


# ---- hf: generation fields ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("file, field, value", [
    ("generation_config.json", "suppress_tokens", ["a"]),
    ("generation_config.json", "suppress_tokens", [1.5]),
    ("generation_config.json", "suppress_tokens", "12"),  # once taken as the tokens 1 and 2
    ("config.json", "suppress_tokens", "12"),
    ("generation_config.json", "length_penalty", "abc"),
    ("generation_config.json", "length_penalty", 20),
])
def test_an_ill_typed_generation_field_is_refused_naming_file_and_field(cli, untrained_hf, tmp_path, file, field, value):
    bad = _copy(untrained_hf, tmp_path)
    _edit_json(bad / file, **{field: value})
    line = _export_refused(cli, bad, tmp_path)
    assert f"{bad / file}: {field} must be" in line


# ---- hf: weights ----------------------------------------------------------------------------------------------------

def _as_bin(directory: Path, change) -> None:
    """The weights as a tensors-only pytorch_model.bin, with `change` applied to the state dict."""
    from safetensors.torch import load_file

    state = load_file(str(directory / "model.safetensors"))
    change(state)
    (directory / "model.safetensors").unlink()
    torch.save(state, directory / "pytorch_model.bin")


def test_a_weight_that_is_not_a_float_tensor_is_refused(cli, untrained_hf, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = _copy(untrained_hf, tmp_path)
    state = load_file(str(bad / "model.safetensors"))
    save_file({**state, "final_logits_bias": state["final_logits_bias"].long()}, str(bad / "model.safetensors"))
    line = _export_refused(cli, bad, tmp_path)
    assert f"{bad / 'model.safetensors'}: weight final_logits_bias has dtype int64" in line


@pytest.mark.parametrize("change", [
    lambda s: s.update(final_logits_bias=torch.empty(s["final_logits_bias"].shape, device="meta")),
    lambda s: s.update(final_logits_bias=s["final_logits_bias"].to_sparse()),
    lambda s: s.update(final_logits_bias=3),
])
def test_a_pickle_of_whatever_weights_is_never_read(cli, untrained_hf, tmp_path, change):
    """Meta, sparse or non-tensor weights come only in a pickle, which tk refuses whole, unread (hf_files.read_weights)."""
    bad = _copy(untrained_hf, tmp_path)
    _as_bin(bad, change)
    line = _export_refused(cli, bad, tmp_path)
    assert "holds its weights only as pytorch_model.bin, a pickle: tk never unpickles" in line


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_at_export(cli, untrained_hf, tmp_path, value):
    """Once exported with exit 0, then every translation an empty line."""
    from safetensors.torch import load_file, save_file

    bad = _copy(untrained_hf, tmp_path)
    state = load_file(str(bad / "model.safetensors"))
    name = next(k for k in state if k.endswith("fc1.weight"))
    state[name][0, 0] = value
    save_file(state, str(bad / "model.safetensors"), metadata={"format": "pt"})
    line = _export_refused(cli, bad, tmp_path)
    assert f"{bad / 'model.safetensors'}: weight {name} holds NaN or infinite values" in line


def test_weights_of_other_shapes_than_the_config_are_refused_before_the_model_is_built(cli, untrained_hf, tmp_path, monkeypatch):
    """Every size at tk's bounds over a tiny weights file: refused from the shapes alone (building that model first
    took a minute and 4 GB)."""
    from toolkit.pytorch import hf_marian

    def never(settings):
        raise AssertionError(f"the model was built before its weights' shapes were checked: {settings}")

    monkeypatch.setattr(hf_marian.MarianForTk, "build", never)
    bad = _copy(untrained_hf, tmp_path)
    _edit_json(bad / "config.json", vocab_size=262144, decoder_vocab_size=262144, d_model=1024, encoder_layers=48, decoder_layers=48,
               encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096,
               max_position_embeddings=1024)
    line = _export_refused(cli, bad, tmp_path)
    assert f"{bad / 'model.safetensors'}: weight " in line
    shape, expected = line.split(" has shape ")[1].split(", the config gives ")
    assert shape != expected


# ---- hf: tokenizer files --------------------------------------------------------------------------------------------

def _vocab_entry(directory: Path, token_id: int) -> None:
    vocab = json.loads((directory / "vocab.json").read_text())
    vocab["▁planted"] = token_id
    (directory / "vocab.json").write_text(json.dumps(vocab))


@pytest.mark.parametrize("token_id", [10**12, "size"])
def test_a_vocabulary_id_outside_the_model_is_refused_at_export(cli, untrained_hf, tmp_path, token_id):
    """Accepted once, then every translation died in ONNX Runtime."""
    bad = _copy(untrained_hf, tmp_path)
    size = json.loads((bad / "config.json").read_text())["vocab_size"]
    _vocab_entry(bad, size if token_id == "size" else token_id)
    line = _export_refused(cli, bad, tmp_path)
    assert f"{bad / 'vocab.json'}: piece '▁planted' has id" in line and f"vocab_size {size}" in line


@pytest.mark.parametrize("name, data", [("source.spm", b""), ("target.spm", b"\x00not a model" * 40)])
def test_an_empty_or_garbage_sentencepiece_model_is_refused_at_export(cli, untrained_hf, tmp_path, name, data):
    """Once exported with exit 0; translate then said "re-export", which could not help."""
    bad = _copy(untrained_hf, tmp_path)
    (bad / name).write_bytes(data)
    line = _export_refused(cli, bad, tmp_path)
    assert f"{bad / name} is not a SentencePiece model" in line


# ---- verify: identical tensors stored once (issue 49) ---------------------------------------------------------------

@pytest.mark.slow
def test_verify_counts_identical_tensors_stored_once_as_present(cli, untrained_hf, untrained_export, tmp_path):
    """The untrained model's zero biases are one initializer in the graphs; verify with the checkpoint given (hf:DIR)
    once failed, saying that a bias is in no graph and that it needs the checkpoint."""
    from toolkit.core import manifest
    from toolkit.pytorch.reference import graph_parameters

    out = untrained_export
    m = manifest.load(out)
    stored = graph_parameters(out, [g.file for g in m.graphs.values()])
    # The premise: some zero bias is in no graph under its own name (stored once, with its identical twins).
    assert "model.encoder.layers.0.self_attn.v_proj.bias" not in stored
    report = tmp_path / "report.json"
    result = cli("verify", out, "--checkpoint", f"hf:{untrained_hf}", "--sentences", 2, "--json", report)
    assert result.exit_code == 0, result.output
    assert "checkpoint" not in "".join(line for line in result.output.splitlines() if line.startswith("error"))
    rows = [r for r in json.loads(report.read_text())["rows"] if r["check"] == "weights"]
    assert rows and all(r["ok"] for r in rows)


def test_verify_still_fails_a_merged_tensor_changed_in_the_graphs(cli, untrained_hf, untrained_export, tmp_path):
    """The shared tensor stands for every parameter it replaced: a change to it fails the weights digest."""
    import numpy as np
    from onnx import numpy_helper

    out = tmp_path / "tk"
    shutil.copytree(untrained_export, out)
    path = out / "encoder.onnx"
    graph = onnx.load(str(path), load_external_data=False)
    bias = next(i for i in graph.graph.initializer if i.name.endswith("self_attn.k_proj.bias"))
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + np.float32(1e-3), bias.name))
    onnx.save_model(graph, str(path))
    rehash(out)
    report = tmp_path / "report.json"
    result = cli("verify", out, "--checkpoint", f"hf:{untrained_hf}", "--sentences", 0, "--json", report)
    assert result.exit_code == 1, result.output
    rows = [r for r in json.loads(report.read_text())["rows"] if r["check"] == "weights"]
    assert rows and not any(r["ok"] for r in rows)


# ---- CTranslate2 conversions edited, digests rewritten --------------------------------------------------------------

def _tampered(converted: Path, tmp_path: Path, how: str) -> tuple[Path, str]:
    """A copy of the converted model with one file edited and the manifest's digests rewritten; returns it and the
    edited file's name."""
    bad = tmp_path / how
    shutil.copytree(converted, bad)
    vocab_file, config_file = bad / "ctranslate2.shared_vocabulary.json", bad / "ctranslate2.config.json"
    vocab, config = json.loads(vocab_file.read_text()), json.loads(config_file.read_text())
    if how == "word":
        vocab[7] = "hello"
    elif how == "cut":
        vocab = vocab[:100]
    else:
        config["add_source_eos"] = True
    vocab_file.write_text(json.dumps(vocab))
    config_file.write_text(json.dumps(config))
    data = json.loads((bad / "manifest.json").read_text())
    for entry in data["converted"]["ctranslate2"]["files"].values():
        entry["sha256"], entry["bytes"] = file_sha256(bad / entry["file"]), (bad / entry["file"]).stat().st_size
    (bad / "manifest.json").write_text(json.dumps(data))
    return bad, (config_file if how == "eos" else vocab_file).name


@pytest.mark.parametrize("how", ["word", "cut", "eos"])
def test_an_edited_conversion_is_refused_by_translate_verify_and_the_api(converted, tmp_path, cli, how):
    from toolkit import Translator
    from toolkit.core.errors import UsageError

    bad, edited = _tampered(converted, tmp_path, how)
    said = f"{bad / edited} "
    for args in (("translate", "--model", bad, "--runtime", "ctranslate2", "Hello, how are you today?"),
                 ("verify", bad, "--runtime", "ctranslate2", "--sentences", 2)):
        line = one_line_error(cli(*args), 2)
        assert said in line and f"tk export {bad} --ctranslate2 --force" in line
    with pytest.raises(UsageError, match="not the conversion tk wrote"):
        Translator(bad, runtime="ctranslate2").translate(["Hello."])


def test_the_server_on_an_edited_conversion_says_why_it_is_not_ready(converted, tmp_path):
    pytest.importorskip("httpx", reason="the serve extra is not installed")
    import threading

    from serve.test_serve import config, running

    from toolkit.deploy.translate import open_model

    bad, edited = _tampered(converted, tmp_path, "cut")
    with running(lambda: open_model(bad, "cpu", runtime="ctranslate2"), config()) as client:
        for _ in range(3000):
            answer = client.get("/ready")
            if "failed to load" in answer.text:
                break
            threading.Event().wait(0.01)
        assert answer.status_code == 503 and f"{bad / edited} holds 100 entries" in answer.text


def test_an_untouched_conversion_passes_the_load_checks(converted):
    from toolkit import Translator

    assert Translator(converted, runtime="ctranslate2").translate(["Hello."])[0]


# ---- graphs whose external data leaves the directory ----------------------------------------------------------------

@pytest.fixture()
def escaping(tmp_path) -> Path:
    """A copy of the shipped Transformer whose decoder graph reads its weights from ../outside.bin, digests rewritten."""
    model = tmp_path / "model"
    shutil.copytree(SHIPPED, model)
    (tmp_path / "outside.bin").write_bytes(b"\0" * 1024)
    graph = onnx.load(str(model / "decoder.onnx"), load_external_data=False)
    for init in graph.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../outside.bin"
    onnx.save_model(graph, str(model / "decoder.onnx"))
    rehash(model)
    return model


@pytest.mark.parametrize("option", ["--ctranslate2", "--to-hf"])
def test_external_data_out_of_the_directory_is_refused_naming_the_graph(cli, escaping, tmp_path, option):
    if option == "--ctranslate2":
        pytest.importorskip("ctranslate2", reason="the ct2 extra (in dev) installs ctranslate2")
    args = (option,) if option == "--ctranslate2" else (option, tmp_path / "hf")
    line = one_line_error(cli("export", escaping, *args), 2)
    assert f"{escaping / 'decoder.onnx'}: tensor " in line and "'../outside.bin'" in line
    assert not (tmp_path / "hf").exists() and not list(escaping.glob("*ctranslate2*"))


# ---- verify --to-hf of another model's directory --------------------------------------------------------------------

def test_verify_to_hf_of_another_marian_directory_fails_in_one_line(cli, untrained_hf):
    line = one_line_error(cli("verify", SHIPPED, "--to-hf", untrained_hf, "--sentences", 2), 1)
    assert f"{untrained_hf} does not match {SHIPPED}" in line and "vocab_size" in line
