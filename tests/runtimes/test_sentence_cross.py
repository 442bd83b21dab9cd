"""The decoder's cross-attention per sentence (toolkit.graphs.sentence_cross, decoding.take_sentence_rows): a beam's
rows read their sentence's one copy of the encoder's outputs, and the translations are those of one copy per row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from toolkit.core.decoding import take_rows, take_sentence_rows

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"
AXES = {"cache": 0, "keys": 0, "lengths": 0}
SHARED = frozenset({"keys", "lengths"})


@pytest.mark.parametrize("rows, kept", [
    ([0, 0, 0, 1, 1, 1], 2),  # the first beam step (one row a sentence before): each sentence's row becomes three
    ([2, 0, 1, 5, 3, 4], 2),  # a beam step: rows reordered within their sentences
    ([1, 0, 2, 4, 3, 5], 2),
    ([3, 4, 5], 1),  # the first sentence finished
    ([0, 1, 2, 3, 4], 5),  # a sentence keeps fewer rows: one copy per row from then on
    ([5, 4, 3, 0, 0, 0], 2),  # the sentences' order changes
    ([3, 5, 4, 0, 2, 1], 2),
])
def test_sentence_rows_read_as_the_rows_copies_did(rows, kept):
    """Taking rows of a state that holds one row per sentence gives, read in groups (the graph's rows / sentences),
    what taking them from one copy per row gave."""
    rng = np.random.default_rng(len(rows))
    group = 1 if rows == [0, 0, 0, 1, 1, 1] else 3
    sentences = 2
    state = {"cache": rng.standard_normal((sentences * group, 4)), "keys": rng.standard_normal((sentences, 5)),
             "lengths": np.array([7, 9])}
    per_row = {**state, "keys": np.repeat(state["keys"], group, 0), "lengths": np.repeat(state["lengths"], group)}
    rows = np.array(rows)
    want = take_rows(per_row, rows, AXES)
    got = take_sentence_rows(state, rows, AXES, SHARED)
    assert len(got["keys"]) == kept
    per = len(rows) // len(got["keys"])
    for name, value in want.items():
        assert np.array_equal(np.repeat(got[name], per, 0) if name in SHARED else got[name], value), name
    # Kept in place where the sentences stay as they were (nothing copied).
    assert (got["keys"] is state["keys"]) == (rows.tolist() in ([0, 0, 0, 1, 1, 1], [2, 0, 1, 5, 3, 4], [1, 0, 2, 4, 3, 5]))


@pytest.fixture(scope="module")
def translator():
    from toolkit import Translator

    return Translator(SHIPPED, provider="cpu")


def test_the_cpu_decoder_reads_one_copy_of_a_sentence_s_encoder_outputs_per_beam(translator):
    """A decoder step fed one row of encoder outputs per sentence computes what it did with one per row, and a beam
    search keeps them per sentence throughout, translating exactly as with a copy per row."""
    b = translator._backend
    assert b._per_sentence == b.decoder_spec.constant_inputs  # the CPU's default variant is regrouped
    texts = ["Where is the station?", "We ate bread at noon with our friends.", "It's raining.", "I like cats."]
    from toolkit.core.decoding import pad_batch
    from toolkit.core.tokenizers import open_tokenizer
    from toolkit.graphs.native_attention import ROWS

    state = b.encode(*pad_batch(open_tokenizer(translator.manifest).encode(texts), translator.manifest.rules().pad))
    rows = np.repeat(np.arange(len(texts)), 4)
    grouped = b.select(state, rows)
    # A row's own state: the caches, or where the graph takes the caches' rows itself (tk's CPU kernels), those rows.
    own = ROWS if ROWS in grouped else next(n for n in grouped if n not in b.decoder_spec.constant_inputs)
    assert len(grouped["src_len"]) == len(texts) and len(grouped[own]) == len(rows)
    per_row = take_rows(dict(state), rows, b.batch_axis)
    token = np.arange(5, 21, dtype=np.int64)
    got, _ = b.step(token, grouped)
    want, _ = b.step(token, per_row)
    finite = np.isfinite(want)
    assert np.array_equal(finite, np.isfinite(got))
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)

    fed: list[tuple[int, int]] = []
    run = b._run_decoder
    b._run_decoder = lambda names, feeds: fed.append((len(feeds["token"]), len(feeds["src_len"]))) or run(names, feeds)
    try:
        shared = translator.translate(texts, beam=4, streams=1, batch_size=4)
        b._per_sentence = None  # one copy per row, as before the regrouping
        assert translator.translate(texts, beam=4, streams=1, batch_size=4) == shared
    finally:
        b._per_sentence, b._run_decoder = b.decoder_spec.constant_inputs, run
    assert (16, 4) in fed[: len(fed) // 2] and (16, 16) in fed[len(fed) // 2:]


def test_a_graph_without_fused_cross_attention_is_left_as_it_is(translator):
    """The exported graphs (attention not fused) and a constant input read by anything but the cross-attention: None,
    and the backend keeps one copy per row."""
    import onnx

    from toolkit.core import manifest
    from toolkit.graphs.sentence_cross import cross_per_sentence

    m = manifest.load(SHIPPED)
    constants = m.specs()["decoder"].constant_inputs
    plain = onnx.load(SHIPPED / "decoder.onnx")
    assert cross_per_sentence(plain.SerializeToString(), constants) is None
    from toolkit.graphs.variants import graph_source

    fused, _ = graph_source(m, "decoder", "optimized")
    assert cross_per_sentence(fused, constants) is not None
    model = onnx.load_model_from_string(fused)
    model.graph.node.append(onnx.helper.make_node("Identity", ["src_len"], ["tk_test_reads_src_len"]))
    assert cross_per_sentence(model.SerializeToString(), constants) is None
