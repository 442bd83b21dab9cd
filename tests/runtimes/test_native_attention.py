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

    def spy(graph):
        out = native_attention(graph)
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


@pytest.mark.parametrize("rows, width, k", [(1, 5, 1), (3, 40, 8), (64, 6000, 8), (7, 300, 16), (5, 6000, 5), (2, 300, 300)])
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
