"""The fused-attention rewrite (toolkit/graphs/attention_fusion.py): same function, same interface, fewer nodes."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from toolkit.core import manifest
from toolkit.core.declaration import transformer_layers
from toolkit.deploy import attention_graphs
from toolkit.graphs.attention_fusion import fuse_attention, fuse_projections

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "exported" / "transformer"


@pytest.fixture(scope="module")
def shipped():
    m = manifest.load(SHIPPED)
    return m, {g: onnx.load(m.graph_path(g)) for g in ("encoder", "decoder")}


def _feeds(m, graph: str, past: int, rng, vocab: int = 6000) -> dict[str, np.ndarray]:
    """Random inputs (token ids below `vocab`) with ragged source lengths, so that padded keys must be masked."""
    batch, src = 3, 9
    sizes = {"batch": batch, "src_len": src, "past_len": past}
    feed = {}
    for t in m.specs()[graph].inputs:
        if t.name == "src_len":
            feed[t.name] = np.array([src, 4, 1], np.int64)
        elif t.dtype == "int64":
            feed[t.name] = rng.integers(4, vocab, t.shape(sizes)).astype(np.int64)
        else:
            feed[t.name] = rng.standard_normal(t.shape(sizes)).astype(np.float32)
    return feed


def _run(model: onnx.ModelProto, feed: dict) -> dict[str, np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the graph as written
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feed)))


def _interface(model: onnx.ModelProto) -> list:
    return [(v.name, v.type.SerializeToString()) for v in (*model.graph.input, *model.graph.output)]


def _attentions(m, graph: str) -> int:
    """The attention cores a graph of the shipped Transformer holds: one per encoder layer, two per decoder layer."""
    encoder_layers, decoder_layers = transformer_layers(m.config)
    return encoder_layers if graph == "encoder" else 2 * decoder_layers


@pytest.mark.parametrize("graph,past", [("encoder", 0), ("decoder", 0), ("decoder", 5)])
def test_fused_graph_computes_the_same_outputs_with_the_same_interface(shipped, graph, past):
    """Every output (log-probs, memory, cross keys, the per-layer cache) within 1e-4 of the unfused graph,
    on ragged source lengths (padded keys) and an empty and a filled cache; names and shapes unchanged."""
    m, models = shipped
    fused = onnx.ModelProto()
    fused.CopyFrom(models[graph])
    assert fuse_attention(fused) == _attentions(m, graph)
    assert fuse_projections(fused) > 0
    assert _interface(fused) == _interface(models[graph])
    feed = _feeds(m, graph, past, np.random.default_rng(past))
    want, got = _run(models[graph], feed), _run(fused, feed)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-4, rtol=1e-4, err_msg=name)


def test_fusion_removes_most_nodes(shipped):
    _, models = shipped
    for graph, model in models.items():
        fused = onnx.ModelProto()
        fused.CopyFrom(model)
        fuse_attention(fused)
        ops = collections.Counter(n.op_type for n in fused.graph.node)
        assert ops["Softmax"] == 0 and ops["Where"] == 0, graph  # no attention core left behind
        assert len(fused.graph.node) < 0.6 * len(model.graph.node), graph


def test_a_graph_without_the_pattern_is_left_unchanged():
    """The GRU's Bahdanau attention is additive, not this pattern: its graphs come back byte for byte."""
    m = manifest.load(REPO / "exported" / "seq2seq")
    for graph in m.graphs:
        model = onnx.load(m.graph_path(graph), load_external_data=False)
        before = model.SerializeToString()
        assert fuse_attention(model) == 0
        assert model.SerializeToString() == before


def test_attention_weights_read_as_outputs_keep_the_graph_unfused(shipped):
    """The attention variant reads every Softmax (`tk attention` records them): fusing would drop them."""
    m, models = shipped
    model = onnx.ModelProto()
    model.CopyFrom(models["decoder"])
    attention_graphs.expose(model, attention_graphs.declared(m)["decoder"])
    before = model.SerializeToString()
    assert fuse_attention(model) == 0
    assert model.SerializeToString() == before


def test_an_attention_whose_weights_are_a_graph_output_stays_unfused(shipped):
    """Only that attention: the others fuse, and the weights still come out, as before."""
    m, models = shipped
    model = onnx.ModelProto()
    model.CopyFrom(models["encoder"])
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    model.graph.output.append(onnx.helper.make_tensor_value_info(softmax.output[0], onnx.TensorProto.FLOAT, None))
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    assert fuse_attention(fused) == _attentions(m, "encoder") - 1
    feed = _feeds(m, "encoder", 0, np.random.default_rng(0))
    want, got = _run(model, feed), _run(fused, feed)
    np.testing.assert_allclose(got[softmax.output[0]], want[softmax.output[0]], atol=1e-6)
    np.testing.assert_allclose(got["memory"], want["memory"], atol=1e-4, rtol=1e-4)
