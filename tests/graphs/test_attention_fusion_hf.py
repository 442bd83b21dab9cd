"""The fused-attention rewrite on graphs imported from Hugging Face (transformers' attention, exported by torch.export).

Marian, M2M100/NLLB and mBART write attention as Softmax(MatMul(q, k^T) * scale + padding mask) @ v with the heads
split and merged by Reshape/Transpose, the decoder's cache appended by Concat: every core must become one
MultiHeadAttention computing the same outputs (the optimized and int8 variants, tk's default fp32 graphs on CPU, are
built this way). T5's attention has no scale and adds a position bias: its graphs come back unchanged.
The directories are the ones the architectures' own test modules build (built_once, shared by name).
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import pytest
from graphs.test_attention_fusion import _feeds, _interface, _run
from hf_marian_fixture import fra_eng_lines
from verify.test_planted_faults_hf import ARCHITECTURES, Architecture, exported_directory

from toolkit.core import manifest
from toolkit.graphs.attention_fusion import fuse_attention, fuse_projections

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BY_NAME = {a.name: a for a in ARCHITECTURES}
FUSED = ("marian", "m2m100", "mbart")


@pytest.fixture(scope="module")
def pairs(corpus_zip) -> list[tuple[str, str]]:
    return fra_eng_lines(corpus_zip, 2000)


def _exported(tmp_path_factory, pairs, arch: Architecture) -> Path:
    return exported_directory(tmp_path_factory, pairs, arch)[1]


def _cores(m, graph: str) -> int:
    """One attention per encoder layer, two (self, cross) per decoder layer."""
    return m.config["encoder_layers"] if graph == "encoder" else 2 * m.config["decoder_layers"]


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("graph,past", [("encoder", 0), ("decoder", 0), ("decoder", 5)])
def test_every_imported_attention_fuses_and_computes_the_same_outputs(tmp_path_factory, pairs, name, graph, past):
    """Every Softmax gone; every output (log-probs, memory, cross keys, the cache) within 1e-4 of the graph as exported,
    on ragged source lengths (padded keys must stay masked) with an empty and a filled cache; interface unchanged."""
    out = _exported(tmp_path_factory, pairs, BY_NAME[name])
    m = manifest.load(out)
    model = onnx.load(m.graph_path(graph))
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    assert fuse_attention(fused) == _cores(m, graph)
    fuse_projections(fused)
    ops = collections.Counter(n.op_type for n in fused.graph.node)
    assert ops["Softmax"] == 0 and ops["MultiHeadAttention"] == _cores(m, graph)
    assert _interface(fused) == _interface(model)
    feed = _feeds(m, graph, past, np.random.default_rng(past), vocab=100)  # the tiny vocabularies
    want, got = _run(model, feed), _run(fused, feed)
    assert list(got) == list(want)
    for output in want:
        np.testing.assert_allclose(got[output], want[output], atol=1e-4, rtol=1e-4, err_msg=output)


def test_t5_attention_is_left_as_exported(tmp_path_factory, pairs):
    """T5 adds a learned position bias and does not scale: not the pattern, so nothing changes."""
    m = manifest.load(_exported(tmp_path_factory, pairs, BY_NAME["t5"]))
    for graph in ("encoder", "decoder"):
        model = onnx.load(m.graph_path(graph), load_external_data=False)
        before = model.SerializeToString()
        assert fuse_attention(model) == 0
        assert model.SerializeToString() == before
