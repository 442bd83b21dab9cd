"""tk export: every registered model runs in ONNX Runtime at sizes never seen at export, matching PyTorch."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from toolkit.core import data, manifest
from toolkit.core.graphs import make_inputs
from toolkit.pytorch import registry
from toolkit.pytorch.export import EXAMPLE_SIZES
from toolkit.pytorch.reference import load_reference

# Batch 1, an odd batch, and lengths from 1 to the maximum, including ones the export never traced.
SIZES = [(1, 1), (5, 2), (1, EXAMPLE_SIZES["src_len"]), (5, 11), (2, 24)]


@pytest.mark.parametrize("name", sorted(e.name for e in registry.entries() if e.random_init))
@pytest.mark.slow
def test_every_registered_model_matches_pytorch_at_unseen_sizes(name, random_export):
    directory = random_export(name)
    m = manifest.load(directory)
    entry, cfg, model, _ = load_reference(m)
    rng = np.random.default_rng(1)
    for spec in m.specs().values():
        session = ort.InferenceSession(str(m.graph_path(spec.name)), providers=["CPUExecutionProvider"])
        module = registry.graph_module(entry, model, spec)
        for batch, n in SIZES:
            sizes = {"batch": batch, "src_len": n, "past_len": n - 1, "n_q": n, "n_kv": n + 3}
            feeds = make_inputs(spec, sizes, rng, getattr(cfg, "vocab_size", 2))
            got = session.run(None, feeds)
            with torch.no_grad():
                want = module(*(torch.from_numpy(feeds[i]) for i in spec.input_names))
            for out_name, g, w in zip(spec.output_names, got, want):
                np.testing.assert_allclose(g, w.numpy(), atol=1e-5, rtol=1e-4, err_msg=f"{name}/{spec.name}/{out_name} {sizes}")


@pytest.mark.parametrize("name", sorted(e.name for e in registry.entries() if e.random_init))
def test_every_axis_is_named_and_symbolic(name, random_export):
    m = manifest.load(random_export(name))
    for spec in m.specs().values():
        graph = onnx.load(m.graph_path(spec.name), load_external_data=False)
        onnx.checker.check_model(str(m.graph_path(spec.name)), full_check=True)
        for value, declared in zip(list(graph.graph.input) + list(graph.graph.output), spec.inputs + spec.outputs):
            dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
            assert dims == list(declared.dims), f"{spec.name}/{value.name}"
        assert graph.opset_import[0].version >= 18


def test_manifest_describes_the_directory(tiny_export, tiny_checkpoint):
    m = manifest.load(tiny_export)
    m.check_files()
    d = m.to_dict()
    assert d["model"] == "transformer" and d["kind"] == "seq2seq"
    assert set(d["graphs"]) == {"encoder", "decoder"}
    layers = range(d["config"]["num_layers"])
    assert d["graphs"]["decoder"]["spec"]["updates"] == {f"new_{n}_{i}": f"{n}_{i}" for i in layers for n in ("self_k", "self_v")}
    assert d["opset"] >= 18
    assert {"torch", "onnx", "onnxruntime", "onnxscript"} <= set(d["versions"])
    from toolkit.pytorch.checkpoint import sha256

    assert d["checkpoint"]["sha256"] == sha256(tiny_checkpoint)
    # What the checkpoint and corpus were, not where they lay (tests run them from a temporary directory).
    assert d["checkpoint"]["path"] == tiny_checkpoint.name and d["training"]["data"]["source"] == "fra-eng.zip"
    assert "valid_bleu" in d["metrics"] and d["training"]["data"]["sha256"] == data.CORPUS_SHA256
    assert (tiny_export / "tokenizer.model").is_file()
    json.dumps(d)  # plain JSON, readable without tk


def test_shared_embedding_is_stored_once(tiny_export):
    """Encoder and decoder both use the embedding; weights.bin holds it once."""
    m = manifest.load(tiny_export)
    _, cfg, model, _ = load_reference(m)
    unique_bytes = sum(p.numel() * 4 for p in model.parameters())
    assert (tiny_export / "weights.bin").stat().st_size < unique_bytes * 1.05


def test_decoder_step_graph_reproduces_the_full_prefix_decoder_on_real_sentences(tiny_export, corpus_zip):
    """Step by step through the cached decoder graph == one full-prefix PyTorch pass, position by position."""
    from toolkit.core.decoding import empty_cache, pad_batch
    from toolkit.core.tokenizer import BOS, Tokenizer

    m = manifest.load(tiny_export)
    _, cfg, model, _ = load_reference(m)
    tok = Tokenizer.load(m.tokenizer_path())
    pairs = data.load_corpus(corpus_zip).splits["test"][:6]
    src, src_len = pad_batch(tok.encode([en for en, _ in pairs]))
    tgt = [[BOS] + t for t in tok.encode([fr for _, fr in pairs])]
    tgt_in, _ = pad_batch(tgt)
    with torch.no_grad():
        full = model(torch.from_numpy(src), torch.from_numpy(src_len), torch.from_numpy(tgt_in)).numpy()
    specs = m.specs()
    enc = ort.InferenceSession(str(m.graph_path("encoder")), providers=["CPUExecutionProvider"])
    dec = ort.InferenceSession(str(m.graph_path("decoder")), providers=["CPUExecutionProvider"])
    memory = dict(zip(specs["encoder"].output_names, enc.run(None, {"src": src, "src_len": src_len})))
    state = {**memory, "src_len": src_len, **empty_cache(specs["decoder"], memory, len(src))}
    for t in range(tgt_in.shape[1]):
        feeds = {"token": tgt_in[:, t], **{n: state[n] for n in specs["decoder"].input_names[1:]}}
        outs = dict(zip(specs["decoder"].output_names, dec.run(None, feeds)))
        for row, seq in enumerate(tgt):
            if t < len(seq):
                np.testing.assert_allclose(outs["log_probs"][row], full[row, t], atol=1e-4, rtol=1e-4, err_msg=f"step {t}")
        state.update({name: outs[new] for new, name in specs["decoder"].updates.items()})
        assert state["self_k_0"].shape[2] == t + 1


def test_existing_directory_needs_force(cli, tmp_path):
    out = tmp_path / "dir"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    result = cli("export", "nw", "--random-init", "--out", out)
    assert result.exit_code == 2
    assert "already exists; use --force" in result.output
    assert (out / "keep.txt").read_text() == "user data"


@pytest.mark.parametrize("problem", ["missing", "corrupt"])
def test_bad_checkpoint_is_one_line_error(cli, tmp_path, problem):
    ckpt = tmp_path / "checkpoint.pt"
    if problem == "corrupt":
        ckpt.write_bytes(b"not a checkpoint at all")
    result = cli("export", ckpt, "--out", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert str(ckpt) in result.output
    assert not (tmp_path / "out").exists()


def test_unknown_model_lists_the_known_ones(cli, tmp_path):
    result = cli("export", "gpt5", "--random-init", "--out", tmp_path / "x")
    assert result.exit_code == 2
    assert "unknown model 'gpt5'; choose one of:" in result.output and "transformer" in result.output


@pytest.mark.slow
def test_failed_export_leaves_nothing_behind(cli, tmp_path, monkeypatch):
    from toolkit.pytorch import export as export_mod

    real = export_mod.export_graph

    def fail_on_decoder(module, spec, *args):
        if spec.name == "decoder":
            raise export_mod.ToolkitError("simulated exporter failure")
        return real(module, spec, *args)

    monkeypatch.setattr(export_mod, "export_graph", fail_on_decoder)
    result = cli("export", "transformer", "--random-init", "--out", tmp_path / "model")
    assert result.exit_code == 1 and "simulated exporter failure" in result.output
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output_is_one_line_error(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = cli("export", "nw", "--random-init", "--out", blocker / "sub" / "model")
    assert result.exit_code == 2 and "cannot write" in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_variants_are_added_to_an_exported_directory_without_the_checkpoint(cli, tiny_export, tmp_path):
    """A fresh clone has no checkpoint; `tk export DIR --quantize int8` builds int8 graphs from DIR's own fp32 ones."""
    import shutil

    model_dir = tmp_path / "shipped"
    shutil.copytree(tiny_export, model_dir)
    before = manifest.load(model_dir).to_dict()
    result = cli("export", model_dir, "--quantize", "int8")
    assert result.exit_code == 0, result.output
    m = manifest.load(model_dir)
    m.check_files()
    assert m.variants() == ["fp32", "int8"] and m.to_dict()["graphs"] == before["graphs"]
    assert "command" in m.to_dict()["variants"]["int8"]  # how it was made, like the export command
    assert sorted(p.name for p in model_dir.iterdir()) == sorted([*(p.name for p in tiny_export.iterdir()), "encoder.int8.onnx", "decoder.int8.onnx"])
    result = cli("verify", model_dir, "--variant", "int8", "--sentences", 4)
    assert result.exit_code == 0, result.output
    result = cli("translate", "--model", model_dir, "--variant", "int8", "-q", "I am happy.")
    assert result.exit_code == 0 and result.output.strip(), result.output

    again = cli("export", model_dir, "--quantize", "int8")
    assert again.exit_code == 2 and "already has the int8 variant" in again.output and "--force" in again.output
    nothing = cli("export", model_dir)
    assert nothing.exit_code == 2 and "--quantize int8" in nothing.output
    assert manifest.load(model_dir).to_dict() == m.to_dict()  # refusals change nothing


@pytest.mark.slow
def test_a_variant_the_directory_lacks_is_built_in_memory_as_export_would_store_it(cli, tiny_export, tmp_path):
    """Shipped models store fp32 graphs only (size budget); `--variant int8` builds the int8 graphs at load
    time. They must be byte-identical to what `tk export DIR --quantize int8` stores, so that verifying
    either verifies both, and building them must not write into the model directory."""
    import shutil

    from toolkit.graphs.variants import graph_source

    stored = tmp_path / "stored"
    shutil.copytree(tiny_export, stored)
    assert cli("export", stored, "--quantize", "int8").exit_code == 0
    before = sorted(p.name for p in tiny_export.iterdir())
    for graph in ("encoder", "decoder"):
        built, seconds = graph_source(manifest.load(tiny_export), graph, "int8")
        assert isinstance(built, bytes) and seconds >= 0
        assert built == manifest.load(stored).graph_path(graph, "int8").read_bytes(), graph

    sentences = ["I am happy.", "Where is the station?", "Go."]
    in_memory = cli("translate", "--model", tiny_export, "--variant", "int8", *sentences)
    assert in_memory.exit_code == 0, in_memory.output
    assert "built the int8 graphs in memory" in in_memory.output and "--quantize int8` stores them" in in_memory.output
    from_disk = cli("translate", "--model", stored, "--variant", "int8", "-q", *sentences)
    assert from_disk.output.splitlines() == in_memory.output.splitlines()[-len(sentences) - 1 : -1]
    verified = cli("verify", tiny_export, "--variant", "int8", "--sentences", 4)
    assert verified.exit_code == 0, verified.output
    assert sorted(p.name for p in tiny_export.iterdir()) == before


def test_export_without_out_names_the_missing_option(cli, tiny_checkpoint):
    result = cli("export", tiny_checkpoint)
    assert result.exit_code == 2 and result.output.startswith("error: missing --out")


def test_each_graph_gets_a_node_map_of_where_its_nodes_came_from(random_export):
    """What the exporter knew of each node (module path, class, source line) is kept beside the graph, small,
    listed and digested in the manifest: `tk verify --localize` names modules from it."""
    from toolkit.core.node_map import node_map_name

    directory = random_export("transformer")
    m = manifest.load(directory)
    listed = {e.file for e in m.extra_files}
    for record in m.graphs.values():
        path = directory / node_map_name(record.file)
        assert path.name in listed
        nodes = {n.name: n.op_type for n in onnx.load(directory / record.file, load_external_data=False).graph.node}
        origins = json.loads(path.read_text())
        assert set(origins) <= set(nodes) and len(origins) > len(nodes) / 2
        assert path.stat().st_size < 64 * 1024
    decoder = json.loads((directory / node_map_name(m.graphs["decoder"].file)).read_text())
    relus = [origin for node, origin in decoder.items() if nodes.get(node) == "Relu"]
    assert relus[0] == ["decoder_blocks.0.ffn.relu", "torch.nn.modules.activation.ReLU", "models/attention.py:152"]
    m.check_files()


@pytest.mark.slow
def test_one_torchlib_registry_per_opset_exports_what_a_registry_of_its_own_exports(tmp_path, monkeypatch):
    """Export builds torch.onnx's function registry once per opset (torchlib_registry_once): every graph it writes is
    the graph an export building its own registry writes, byte for byte, at each opset, in either order."""
    import contextlib

    from toolkit.pytorch import export as export_module
    from toolkit.pytorch.export import ExportOptions, export

    def graphs(out, opset: int) -> dict[str, bytes]:
        export(ExportOptions(out=out, model="dot_attention", random_init=True, opset=opset), echo=lambda m: None)
        return {p.name: p.read_bytes() for p in sorted(out.glob("*.onnx"))}

    monkeypatch.setattr(export_module, "_REGISTRIES", {})
    once = {opset: graphs(tmp_path / f"once-{opset}", opset) for opset in (18, 20)}  # the opset-18 registry built first
    assert len(export_module._REGISTRIES) >= 2  # one per opset asked for
    with monkeypatch.context() as m:
        m.setattr(export_module, "torchlib_registry_once", contextlib.nullcontext)
        own = {opset: graphs(tmp_path / f"own-{opset}", opset) for opset in (20, 18)}
    assert once == own
    for opset, files in once.items():
        assert {onnx.load_from_string(b).opset_import[0].version for b in files.values()} == {opset}
