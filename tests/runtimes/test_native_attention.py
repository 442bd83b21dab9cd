"""tk's own CPU attention kernels (toolkit/runtimes/onnxruntime/kernels/attention.c, native.py) and the decoder
rewrite that uses them (toolkit.graphs.native_attention): what they compute against ONNX Runtime's
MultiHeadAttention, a row's output alone or in any batch, translations with and without them, and the fallback where
they cannot be built."""

from __future__ import annotations

import ctypes
import stat
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from toolkit.graphs.native_attention import DOMAIN, native_attention
from toolkit.runtimes.onnxruntime import native

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"
HEADS = 4
DIMS = [16, 64]  # a head size of the generic path and the one kept in registers (the shipped model's)
SENTENCES = ["Where is the station?", "We ate bread at noon with our friends.", "It's raining.", "I like cats.",
             "Tom gave Mary the book he had bought in Paris last year.", "Hurry up!", "Do you know what time it is?",
             "The children are playing in the garden behind the old house."]


@pytest.fixture(autouse=True)
def fresh_build(monkeypatch):
    """Each test finds the kernels as a new process would (the library itself stays built in the test cache)."""
    monkeypatch.setattr(native, "_built", None)


def _session(nodes, inputs, outputs, kernels: bool) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 18),
                                                                   helper.make_opsetid("com.microsoft", 1),
                                                                   helper.make_opsetid(DOMAIN, 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if kernels:
        native.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _cross(kernels: bool, dim: int = 16) -> ort.InferenceSession:
    vi = helper.make_tensor_value_info
    inputs = [vi("q", TensorProto.FLOAT, ["g", "r", HEADS * dim]), vi("k", TensorProto.FLOAT, ["g", HEADS, "s", dim]),
              vi("v", TensorProto.FLOAT, ["g", HEADS, "s", dim]), vi("lengths", TensorProto.INT32, ["g"])]
    node = (helper.make_node("CrossAttention", ["q", "k", "v", "lengths"], ["o"], domain=DOMAIN, num_heads=HEADS, scale=0.3)
            if kernels else
            helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "lengths"], ["o"], domain="com.microsoft",
                             num_heads=HEADS, scale=0.3))
    return _session([node], inputs, [vi("o", TensorProto.FLOAT, None)], kernels)


def _self(kernels: bool, dim: int = 16) -> ort.InferenceSession:
    vi = helper.make_tensor_value_info
    inputs = [vi(n, TensorProto.FLOAT, ["b", 1, HEADS * dim]) for n in ("q", "k", "v")]
    inputs += [vi(n, TensorProto.FLOAT, ["b", HEADS, "p", dim]) for n in ("pk", "pv")]
    node = (helper.make_node("SelfAttention", ["q", "k", "v", "pk", "pv"], ["o", "ok", "ov"], domain=DOMAIN,
                             num_heads=HEADS, scale=0.25) if kernels else
            helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"], ["o", "ok", "ov"],
                             domain="com.microsoft", num_heads=HEADS, scale=0.25))
    return _session([node], inputs, [vi(n, TensorProto.FLOAT, None) for n in ("o", "ok", "ov")], kernels)


def _built() -> None:
    assert native.library() is not None, native.status()


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("groups, rows, keys", [(1, 1, 1), (3, 1, 7), (5, 4, 12), (2, 3, 40)])
def test_cross_attention_computes_what_multiheadattention_computes_with_source_lengths(groups, rows, keys, dim):
    """Each group's rows attend to its own first `lengths` keys, scaled, as MultiHeadAttention with a 1-D
    key_padding_mask does (a kernel that read past a sentence's length, or another group's keys, fails here)."""
    _built()
    rng = np.random.default_rng(keys)
    feeds = {"q": rng.standard_normal((groups, rows, HEADS * dim), dtype=np.float32) * 2,
             "k": rng.standard_normal((groups, HEADS, keys, dim), dtype=np.float32),
             "v": rng.standard_normal((groups, HEADS, keys, dim), dtype=np.float32),
             "lengths": np.array([keys, *rng.integers(1, keys + 1, groups - 1)], np.int32)}
    want = _cross(False, dim).run(None, feeds)[0]
    got = _cross(True, dim).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
    # The keys and values past a group's length change nothing.
    for g, n in enumerate(feeds["lengths"]):
        feeds["k"][g, :, n:] += 9.0
        feeds["v"][g, :, n:] -= 5.0
    np.testing.assert_array_equal(_cross(True, dim).run(None, feeds)[0], got)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("batch, past", [(1, 0), (3, 1), (6, 9)])
def test_self_attention_appends_to_the_cache_and_attends_as_multiheadattention_does(batch, past, dim):
    _built()
    rng = np.random.default_rng(past)
    feeds = {n: rng.standard_normal(shape, dtype=np.float32) for n, shape in
             (("q", (batch, 1, HEADS * dim)), ("k", (batch, 1, HEADS * dim)), ("v", (batch, 1, HEADS * dim)),
              ("pk", (batch, HEADS, past, dim)), ("pv", (batch, HEADS, past, dim)))}
    want = _self(False, dim).run(None, feeds)
    got = _self(True, dim).run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], atol=2e-5, rtol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])  # the caches are copies: exactly
    np.testing.assert_array_equal(got[2], want[2])


@pytest.mark.parametrize("dim", DIMS)
def test_a_row_gets_the_same_output_alone_or_in_any_batch(dim):
    """Bit for bit: each (row, head) is computed on its own, so a sentence's attention does not depend on its batch."""
    _built()
    rng = np.random.default_rng(3)
    q = rng.standard_normal((6, 4, HEADS * dim), dtype=np.float32)
    k, v = (rng.standard_normal((6, HEADS, 11, dim), dtype=np.float32) for _ in range(2))
    lengths = np.array([11, 3, 7, 1, 11, 5], np.int32)
    cross = _cross(True, dim)
    together = cross.run(None, {"q": q, "k": k, "v": v, "lengths": lengths})[0]
    for g in range(6):
        alone = cross.run(None, {"q": q[g:g + 1], "k": k[g:g + 1], "v": v[g:g + 1], "lengths": lengths[g:g + 1]})[0]
        assert np.array_equal(alone[0], together[g]), g
    attention = _self(True, dim)
    feeds = {n: rng.standard_normal(s, dtype=np.float32) for n, s in
             (("q", (5, 1, HEADS * dim)), ("k", (5, 1, HEADS * dim)), ("v", (5, 1, HEADS * dim)), ("pk", (5, HEADS, 4, dim)),
              ("pv", (5, HEADS, 4, dim)))}
    together = attention.run(None, feeds)[0]
    for b in range(5):
        assert np.array_equal(attention.run(None, {n: x[b:b + 1] for n, x in feeds.items()})[0][0], together[b]), b


def test_a_shape_the_kernels_do_not_take_is_an_error_not_a_wrong_answer():
    """Lengths for fewer sentences than the keys have: refused in one line, nothing read out of bounds."""
    _built()
    dim = 16
    with pytest.raises(Exception, match="do not agree in shape"):
        _cross(True).run(None, {"q": np.zeros((2, 1, HEADS * dim), np.float32), "k": np.zeros((2, HEADS, 5, dim), np.float32),
                                "v": np.zeros((2, HEADS, 5, dim), np.float32), "lengths": np.array([5], np.int32)})


def test_the_functions_the_library_calls_are_where_it_looks_for_them():
    """The library names ONNX Runtime's C functions by their place in its function table (no headers): the places
    of the status functions, read here through the runtime's own table, hold what the library expects of them."""
    lib = ctypes.CDLL(str(next(Path(ort.__file__).parent.joinpath("capi").glob("libonnxruntime.so*"))))
    lib.OrtGetApiBase.restype = ctypes.POINTER(ctypes.c_void_p * 2)
    base = lib.OrtGetApiBase().contents
    get_api = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p * 100), ctypes.c_uint32)(base[0])
    table = get_api(16).contents
    create = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)(table[0])
    code = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(table[1])
    message = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(table[2])
    status = create(2, b"tk")
    assert code(status) == 2 and message(status) == b"tk"


@pytest.fixture(scope="module")
def sources():
    return SENTENCES


@pytest.mark.timeout(300)
@pytest.mark.parametrize("variant", ["optimized", "int8"])
def test_the_cpu_decoder_runs_on_the_kernels_and_fp32_translates_as_before(monkeypatch, variant, sources):
    """The shipped model's CPU decoder has its step attention on the kernels; its float32 graphs translate exactly as
    with ONNX Runtime's attention (greedy and beam 4), and its int8 graphs the same sentences."""
    from toolkit import Translator
    from toolkit.runtimes.onnxruntime import loading

    _built()
    rewritten: list[int] = []

    def spy(graph, **options):
        out = native_attention(graph, **options)
        model = onnx.load_model_from_string(out) if out else None
        rewritten.append(sum(n.domain == DOMAIN for n in model.graph.node) if model else 0)
        return out

    monkeypatch.setattr(loading, "native_attention", spy)
    monkeypatch.setenv("TK_NO_CACHE", "1")  # the graphs built here, not an earlier test's copies from the start-up cache
    on = Translator(SHIPPED, provider="cpu", variant=variant)
    assert rewritten == [4], rewritten  # two self- and two cross-attentions (the encoder's are left as they are)
    with_kernels = [on.translate(sources), on.translate(sources, beam=4)]
    monkeypatch.setattr(native, "_built", (None, "turned off for the test"))
    off = Translator(SHIPPED, provider="cpu", variant=variant)
    without = [off.translate(sources), off.translate(sources, beam=4)]
    if variant == "optimized":
        assert with_kernels == without
    else:  # int8 quantises each step's activations: a rounding's difference may move a near-tie, not a sentence's sense
        assert sum(a != b for a, b in zip(with_kernels[0] + with_kernels[1], without[0] + without[1])) <= 2


def test_without_a_compiler_the_decoder_keeps_onnx_runtime_s_attention(monkeypatch, sources):
    from toolkit import Translator

    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert native.library() is None
    assert native.status() == "tk attention kernels: off (no C compiler (/nonexistent/cc) to build them: ONNX Runtime's attention is used)"
    assert Translator(SHIPPED, provider="cpu", variant="int8").translate(sources[:2])


def test_a_failed_build_is_said_once_and_not_tried_again_at_each_start(monkeypatch, tmp_path):
    runs = tmp_path / "runs"
    compiler = tmp_path / "cc"
    compiler.write_text(f"#!/bin/sh\necho run >> {runs}\n[ \"$1\" = --version ] && echo 'fake cc 1.0' && exit 0\n"
                        "echo 'attention.c:1: error: no' >&2\nexit 1\n")
    compiler.chmod(compiler.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CC", str(compiler))
    assert native.library() is None
    assert "the build failed" in native.status() and "attention.c:1: error: no" in native.status()
    builds = runs.read_text().count("run")
    monkeypatch.setattr(native, "_built", None)
    assert native.library() is None and "the build failed" in native.status()
    assert runs.read_text().count("run") == builds  # not started again: neither a build nor its version


def test_tk_native_kernels_0_turns_them_off(monkeypatch):
    monkeypatch.setenv("TK_NATIVE_KERNELS", "0")
    assert native.library() is None and native.status() == "tk attention kernels: off (TK_NATIVE_KERNELS=0)"


def test_graphs_without_the_decoder_forms_are_left_as_they_are():
    """The encoder's attention (keys of three axes, a query per position) is not a decoder step's: unchanged."""
    from toolkit.core import manifest
    from toolkit.graphs.variants import graph_source

    m = manifest.load(SHIPPED)
    encoder, _ = graph_source(m, "encoder", "int8")
    assert any(n.op_type == "MultiHeadAttention" for n in onnx.load_model_from_string(encoder).graph.node)
    assert native_attention(encoder) is None
    assert native_attention(SHIPPED / "decoder.onnx") is None  # the exported graphs: no fused attention (and weights outside)


def _rankers() -> tuple[ort.InferenceSession, ort.InferenceSession]:
    from toolkit.graphs.helper_graphs import top_k_graph

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    plain = ort.InferenceSession(top_k_graph(), options, providers=["CPUExecutionProvider"])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    native.register(options)
    return plain, ort.InferenceSession(top_k_graph(native=True), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("rows, width, k", [(1, 5, 1), (3, 40, 8), (64, 6000, 8), (7, 300, 16), (5, 6000, 5), (2, 300, 300),
                                          (2, 6000, 257)])
@pytest.mark.parametrize("values", ["distinct", "ties", "minus infinity"])
def test_the_ranking_kernel_ranks_as_onnx_runtime_s_topk(rows, width, k, values):
    """tk.kernels.TopK (a beam's ranking on the CPU) gives ONNX Runtime's TopK's values and ids, equal values in id
    order, rows where most or all values are -inf included."""
    _built()
    rng = np.random.default_rng(rows * width + k)
    x = rng.standard_normal((rows, width)).astype(np.float32) * 4
    if values == "ties":
        x = np.round(x)  # a few distinct values, each many times
    elif values == "minus infinity":
        x[:, rng.choice(width, size=width * 2 // 3, replace=False)] = -np.inf
        x[-1] = -np.inf
    plain, kernel = _rankers()
    feed = {"log_probs": x, "k": np.array([k], dtype=np.int64)}
    want, got = plain.run(None, feed), kernel.run(None, feed)
    assert np.array_equal(want[1], got[1]) and np.array_equal(want[0], got[0])


def test_a_cpu_beam_search_ranks_on_the_kernel_where_it_is_built_and_on_onnx_runtime_s_topk_where_not(monkeypatch):
    from toolkit import Translator
    from toolkit.runtimes.onnxruntime import backend

    _built()
    asked: list[bool] = []
    real = backend.top_k_graph
    monkeypatch.setattr(backend, "top_k_graph", lambda native=False: asked.append(native) or real(native))
    with_kernel = Translator(SHIPPED, provider="cpu").translate(SENTENCES[:3], beam=4)
    monkeypatch.setattr(native, "_built", (None, "turned off for the test"))
    assert Translator(SHIPPED, provider="cpu").translate(SENTENCES[:3], beam=4) == with_kernel
    assert asked == [True, False]


def _self_rows(dim: int) -> ort.InferenceSession:
    vi = helper.make_tensor_value_info
    inputs = [vi(n, TensorProto.FLOAT, ["b", 1, HEADS * dim]) for n in ("q", "k", "v")]
    inputs += [vi(n, TensorProto.FLOAT, ["past_rows", HEADS, "p", dim]) for n in ("pk", "pv")]
    inputs += [vi("rows", TensorProto.INT64, ["b"])]
    node = helper.make_node("SelfAttentionRows", ["q", "k", "v", "pk", "pv", "rows"], ["o", "ok", "ov"], domain=DOMAIN,
                            num_heads=HEADS, scale=0.25)
    return _session([node], inputs, [vi(n, TensorProto.FLOAT, None) for n in ("o", "ok", "ov")], True)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("past_rows, rows", [(4, [0, 1, 2, 3]), (4, [2, 2, 0, 3, 3, 3, 1, 0]), (6, [5, 1]), (3, [1, 1, 1]),
                                             (2, [])])
def test_a_step_that_takes_its_caches_rows_equals_the_step_after_taking_them(dim, past_rows, rows):
    """SelfAttentionRows(..., past, rows) is SelfAttention(..., past[rows]) bit for bit: a beam step's reorder (rows
    repeated, dropped, in any order, more or fewer than the past has) done by the kernel's copy of the cache."""
    _built()
    rng = np.random.default_rng(len(rows) + past_rows)
    rows = np.array(rows, dtype=np.int64)
    step = {n: rng.standard_normal((len(rows), 1, HEADS * dim), dtype=np.float32) for n in ("q", "k", "v")}
    past = {n: rng.standard_normal((past_rows, HEADS, 5, dim), dtype=np.float32) for n in ("pk", "pv")}
    want = _self(True, dim).run(None, {**step, **{n: p[rows] for n, p in past.items()}})
    got = _self_rows(dim).run(None, {**step, **past, "rows": rows})
    for w, g in zip(want, got):
        assert np.array_equal(w, g)


def test_a_row_of_the_past_out_of_range_is_an_error_not_a_read_out_of_bounds():
    _built()
    rng = np.random.default_rng(0)
    step = {n: rng.standard_normal((2, 1, HEADS * 16), dtype=np.float32) for n in ("q", "k", "v")}
    past = {n: rng.standard_normal((3, HEADS, 5, 16), dtype=np.float32) for n in ("pk", "pv")}
    for bad in ([0, 3], [-1, 0]):
        with pytest.raises(Exception, match="a row of the past out of range"):
            _self_rows(16).run(None, {**step, **past, "rows": np.array(bad, dtype=np.int64)})


@pytest.mark.timeout(300)
def test_a_decoder_that_takes_its_caches_rows_translates_as_one_whose_caches_are_reordered_on_the_host(monkeypatch, sources):
    """The shipped model's CPU decoder takes its caches' rows itself (select and beam reorder leave the caches to it):
    greedy and beam search, in a batch and one sentence a call, translate exactly as with the caches reordered by numpy
    (fp32). (A shortlisted decoder's: tests/deploy/test_shortlist.py.)"""
    from toolkit import Translator
    from toolkit.graphs.native_attention import ROWS
    from toolkit.runtimes.onnxruntime import loading

    _built()
    monkeypatch.setenv("TK_NO_CACHE", "1")
    on = Translator(SHIPPED, provider="cpu", variant="optimized")
    assert on.loaded.backend()._graph_reorders == {"self_k_0", "self_v_0", "self_k_1", "self_v_1"}
    assert ROWS in [i.name for i in on.loaded.backend().decoder.get_inputs()]
    def decode(t) -> list:
        # The searches themselves, where an error is not retried sentence by sentence as translate does, with every
        # hypothesis's tokens and score: a beam's rows other than the best read the caches their parents left, which
        # a lost reorder gets wrong even where the best translation comes out the same.
        from toolkit.core.decoding import beam_search, greedy

        ids = [[(7 * i + 3 * j) % 5000 + 4 for j in range(3 + 2 * i)] + [2] for i in range(8)]
        backend = t.loaded.backend()
        searches = [[[(h.tokens, h.score) for h in nbest] for nbest in beam_search(backend, ids, 24, beam=4, n_best=4)],
                    [(h.tokens, h.score) for h in greedy(backend, ids, 24)]]
        return searches + [t.translate(sources, beam=4), t.translate(sources, beam=3, streams=1),
                           [t.translate([s], beam=4)[0] for s in sources[:3]], [t.translate([s])[0] for s in sources[:3]]]

    with_rows = decode(on)
    real = loading.native_attention
    monkeypatch.setattr(loading, "native_attention", lambda graph, **options: real(graph))
    off = Translator(SHIPPED, provider="cpu", variant="optimized")
    assert not off.loaded.backend()._graph_reorders
    assert decode(off) == with_rows


def test_a_cache_read_for_more_than_its_length_is_left_to_the_host():
    """Where another node reads a cache's rows (not only its length), the graph cannot take them for a beam step."""
    vi = helper.make_tensor_value_info
    inputs = [vi(n, TensorProto.FLOAT, ["b", 1, 64]) for n in ("q", "k", "v")] + \
             [vi(n, TensorProto.FLOAT, ["b", 4, "p", 16]) for n in ("pk", "pv")]
    attention = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "", "pk", "pv"], ["o", "ok", "ov"],
                                 domain="com.microsoft", num_heads=4, scale=0.25)
    for reader, rows_taken in ((helper.make_node("Shape", ["pk"], ["n"], start=2, end=3), True),
                               (helper.make_node("Shape", ["pk"], ["n"]), False),
                               (helper.make_node("ReduceSum", ["pk"], ["n"]), False)):
        graph = helper.make_graph([reader, attention], "g", inputs, [vi(n, TensorProto.FLOAT, None) for n in ("o", "ok", "ov", "n")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
        out = onnx.load_model_from_string(native_attention(model.SerializeToString(), beam_rows=True))
        assert ("SelfAttentionRows" in [n.op_type for n in out.graph.node]) == rows_taken, reader.op_type
        assert (len(out.graph.input) == 6) == rows_taken
