"""The PyTorch models: textbook worked examples and the properties export and decoding rely on."""

from __future__ import annotations

import math

import pytest
import torch
from toolkit.models.attention import (
    AdditiveAttention,
    AddNorm,
    DotProductAttention,
    MultiHeadAttention,
    PositionalEncoding,
    PositionWiseFFN,
    masked_softmax,
)
from toolkit.models.kernel_regression import NWKernelRegression, fit, leave_one_out, synthetic_data
from toolkit.models.kernel_regression import test_mse as nw_test_mse  # renamed so pytest does not collect it
from toolkit.models.seq2seq import Seq2SeqAttention, Seq2SeqConfig
from toolkit.models.transformer import Transformer, TransformerConfig, layer_key
from torch import nn


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _assert_masked(weights: torch.Tensor, lens: torch.Tensor) -> None:
    """weights (batch, n_q, n_kv), lens (batch, n_q): zero beyond each length, rows sum to 1 (or 0 if empty)."""
    for b in range(weights.shape[0]):
        for q in range(weights.shape[1]):
            n = int(lens[b, q])
            assert torch.all(weights[b, q, n:] == 0), (b, q, weights[b, q])
            assert torch.all(weights[b, q, :n] > 0)
            expected = 1.0 if n > 0 else 0.0
            assert float(weights[b, q].float().sum()) == pytest.approx(expected, abs=1e-3)


# ---- masked softmax ---------------------------------------------------------------------------


def test_masked_softmax_1d_valid_lens_zeroes_padding_and_normalises():
    scores = torch.rand(2, 2, 4)
    lens = torch.tensor([2, 3])
    w = masked_softmax(scores, lens)
    assert w.shape == (2, 2, 4)
    _assert_masked(w, lens.unsqueeze(-1).expand(2, 2))
    # Within the valid part it is the ordinary softmax.
    torch.testing.assert_close(w[0, :, :2], torch.softmax(scores[0, :, :2], dim=-1))


def test_masked_softmax_2d_valid_lens_one_length_per_query():
    scores = torch.rand(2, 2, 4)
    lens = torch.tensor([[1, 3], [2, 4]])
    w = masked_softmax(scores, lens)
    _assert_masked(w, lens)
    assert torch.equal(w[0, 0], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(w[1, 1], torch.softmax(scores[1, 1], dim=-1))


def test_masked_softmax_without_lengths_is_plain_softmax():
    scores = torch.rand(2, 3, 5)
    torch.testing.assert_close(masked_softmax(scores, None), torch.softmax(scores, dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_masked_softmax_empty_row_gives_zeros_not_nan(dtype):
    scores = (torch.rand(2, 2, 4) * 10).to(dtype)
    lens = torch.tensor([[0, 2], [4, 0]])
    w = masked_softmax(scores, lens)
    assert w.dtype == dtype
    assert not torch.isnan(w).any()
    assert torch.all(w[0, 0] == 0) and torch.all(w[1, 1] == 0)
    _assert_masked(w, lens)


# ---- the d2l worked examples --------------------------------------------------------------------

VALUES = torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)
KEYS = torch.ones((2, 10, 2))
LENS = torch.tensor([2, 6])
# Identical keys give uniform weights over the valid keys: the mean of the first 2 and first 6 value rows.
EXPECTED = torch.tensor([[[2.0, 3.0, 4.0, 5.0]], [[10.0, 11.0, 12.0, 13.0]]])


def _check_uniform_weights(weights):
    assert weights.shape == (2, 1, 10)
    torch.testing.assert_close(weights[0, 0, :2], torch.full((2,), 0.5))
    torch.testing.assert_close(weights[1, 0, :6], torch.full((6,), 1 / 6))
    assert torch.all(weights[0, 0, 2:] == 0) and torch.all(weights[1, 0, 6:] == 0)


@pytest.mark.parametrize("make, query_size", [
    (lambda: DotProductAttention(dropout=0.5), 2),
    (lambda: AdditiveAttention(query_size=20, key_size=2, num_hiddens=8, dropout=0.1), 20),
], ids=["dot_product", "additive"])
def test_attention_worked_example(make, query_size):
    queries = torch.normal(0, 1, (2, 1, query_size))
    attention = make().eval()
    out = attention(queries, KEYS, VALUES, LENS)
    assert out.shape == (2, 1, 4)
    torch.testing.assert_close(out, EXPECTED)
    _check_uniform_weights(attention.attention_weights)


def test_additive_attention_is_deterministic_in_eval_mode():
    queries = torch.normal(0, 1, (2, 3, 20))
    keys = torch.normal(0, 1, (2, 10, 2))
    attention = AdditiveAttention(20, 2, 8, dropout=0.5).eval()
    torch.testing.assert_close(attention(queries, keys, VALUES, LENS), attention(queries, keys, VALUES, LENS))


def test_multihead_attention_shape_and_masking():
    attention = MultiHeadAttention(num_hiddens=100, num_heads=5).eval()
    X, Y = torch.ones((2, 4, 100)), torch.ones((2, 6, 100))
    lens = torch.tensor([3, 2])
    out = attention(X, Y, Y, lens)
    assert out.shape == (2, 4, 100)
    # Keys/values past the valid length cannot influence the output.
    Y2 = Y.clone()
    Y2[0, 3:] = torch.randn(3, 100)
    Y2[1, 2:] = torch.randn(4, 100)
    torch.testing.assert_close(attention(X, Y2, Y2, lens), out)
    w = attention.attention.attention_weights.reshape(2, 5, 4, 6)
    assert torch.all(w[0, :, :, 3:] == 0) and torch.all(w[1, :, :, 2:] == 0)


def test_multihead_attention_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(num_hiddens=100, num_heads=3)


def test_position_wise_ffn_shape():
    # d2l's PositionWiseFFN(4, 8) infers the input width (LazyLinear); here it is explicit
    # (export needs concrete shapes) and defaults to the output width, as in the Transformer.
    ffn = PositionWiseFFN(4, 8, num_inputs=4)
    assert ffn(torch.ones((2, 3, 4))).shape == (2, 3, 8)
    ffn = PositionWiseFFN(16, 8)
    x = torch.randn(2, 3, 8)
    out = ffn(x)
    assert out.shape == (2, 3, 8)
    # Position-wise: each position is transformed on its own, whatever surrounds it.
    torch.testing.assert_close(ffn(x[:, 1:2])[:, 0], out[:, 1])


def test_add_norm_normalises_every_position():
    add_norm = AddNorm(4, dropout=0.5).eval()
    x, y = torch.randn(2, 3, 4) * 5 + 3, torch.randn(2, 3, 4)
    out = add_norm(x, y)
    assert out.shape == (2, 3, 4)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 3), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(2, 3), atol=1e-3, rtol=0)


# ---- positional encoding ------------------------------------------------------------------------


def test_positional_encoding_table():
    d = 32
    pe = PositionalEncoding(d, dropout=0.0, max_len=60)
    P = pe.P
    assert P.shape == (60, d)
    # Position 0: sin(0) = 0 in even columns, cos(0) = 1 in odd ones.
    assert torch.equal(P[0], torch.tensor([0.0, 1.0] * (d // 2)))
    for i in (1, 7, 59):
        for j in range(d // 2):
            angle = i / 10000 ** (2 * j / d)
            assert float(P[i, 2 * j]) == pytest.approx(math.sin(angle), abs=1e-5)
            assert float(P[i, 2 * j + 1]) == pytest.approx(math.cos(angle), abs=1e-5)
    # Derived from the shape, so not saved in checkpoints.
    assert "P" not in pe.state_dict()


def test_positional_encoding_offset_adds_the_right_rows():
    pe = PositionalEncoding(16, dropout=0.0, max_len=50).eval()
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(pe(x), x + pe.P[:3])
    for k in (0, 5, 47):
        torch.testing.assert_close(pe(x, offset=k), x + pe.P[k : k + 3])
        torch.testing.assert_close(pe(x, offset=torch.tensor(k)), x + pe.P[k : k + 3])
    one = torch.randn(2, 1, 16)
    # What the cached decoder relies on: token t alone at offset t gets the same encoding as in the full prefix.
    torch.testing.assert_close(pe(one, offset=4)[:, 0], one[:, 0] + pe.P[4])


# ---- Transformer --------------------------------------------------------------------------------

TF = dict(vocab_size=50, num_hiddens=32, ffn_num_hiddens=64, num_heads=4, num_layers=2, dropout=0.0, max_len=20)


def _transformer(pre_ln=False, dropout=0.0):
    return Transformer(TransformerConfig(**{**TF, "dropout": dropout}, pre_ln=pre_ln)).eval()


def _source():
    src_len = torch.tensor([6, 3, 1])
    src = torch.randint(4, 50, (3, 6))
    src[torch.arange(6) >= src_len.unsqueeze(1)] = 0  # PAD
    return src, src_len


def test_transformer_forward_gives_log_probabilities():
    model = _transformer()
    src, src_len = _source()
    tgt_in = torch.randint(4, 50, (3, 5))
    with torch.no_grad():
        log_probs = model(src, src_len, tgt_in)
    assert log_probs.shape == (3, 5, 50)
    assert torch.all(log_probs <= 0)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3, 5))


def test_transformer_encoder_attention_ignores_padding():
    model = _transformer()
    src, src_len = _source()
    with torch.no_grad():
        model.encode(src, src_len)
    weights = model.encoder_attention_weights
    assert len(weights) == 2
    for w in weights:
        assert w.shape == (3, 4, 6, 6)
        for b, n in enumerate(src_len.tolist()):
            assert torch.all(w[b, :, :, n:] == 0)
            torch.testing.assert_close(w[b].sum(-1), torch.ones(4, 6))


@pytest.mark.parametrize("pre_ln", [False, True], ids=["post-ln", "pre-ln"])
def test_transformer_cached_decoding_matches_full_prefix(pre_ln):
    model = _transformer(pre_ln)
    cfg = model.cfg
    src, src_len = _source()
    tgt_in = torch.randint(4, 50, (3, 8))
    d_head = cfg.num_hiddens // cfg.num_heads
    with torch.no_grad():
        cache = model.encode(src, src_len)
        full = model.decode_full(tgt_in, cache)
        names = [layer_key(n, i) for i in range(cfg.num_layers) for n in ("self_k", "self_v")]
        cache = {**cache, **{n: torch.zeros(3, cfg.num_heads, 0, d_head) for n in names}}
        for t in range(tgt_in.shape[1]):
            step, cache = model.decode_step(tgt_in[:, t], cache)
            assert all(cache[n].shape == (3, cfg.num_heads, t + 1, d_head) for n in names)
            torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=0)
    torch.testing.assert_close(model(src, src_len, tgt_in), full)


def test_transformer_final_layer_norm_only_in_pre_ln():
    pre, post = _transformer(pre_ln=True), _transformer(pre_ln=False)
    assert isinstance(pre.encoder_norm, nn.LayerNorm) and isinstance(pre.decoder_norm, nn.LayerNorm)
    assert isinstance(post.encoder_norm, nn.Identity) and isinstance(post.decoder_norm, nn.Identity)
    assert not any(k.startswith(("encoder_norm", "decoder_norm")) for k in post.state_dict())


@pytest.mark.parametrize("pre_ln", [False, True], ids=["post-ln", "pre-ln"])
def test_transformer_output_independent_of_batch_padding(pre_ln):
    model = _transformer(pre_ln)
    short = torch.tensor([[7, 8, 9]])
    longer = torch.tensor([[11, 12, 13, 14, 15, 16, 17]])
    batch = torch.cat([torch.cat([short, torch.zeros(1, 4, dtype=torch.long)], 1), longer])
    tgt_in = torch.tensor([[2, 20, 21, 22]])
    with torch.no_grad():
        alone = model.encode(short, torch.tensor([3]))
        padded = model.encode(batch, torch.tensor([3, 7]))
        torch.testing.assert_close(padded["memory"][0, :3], alone["memory"][0], atol=1e-5, rtol=0)
        # So the translation of a sentence does not depend on what shares its batch.
        lp_alone = model.decode_full(tgt_in, alone)
        lp_padded = model.decode_full(tgt_in.repeat(2, 1), padded)
        torch.testing.assert_close(lp_padded[0], lp_alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("build", [
    lambda p: Transformer(TransformerConfig(**{**TF, "dropout": p})),
    lambda p: Seq2SeqAttention(Seq2SeqConfig(**{**S2S, "dropout": p})),
], ids=["transformer", "seq2seq"])
def test_the_configured_dropout_reaches_every_dropout_layer(build):
    """The config's rate is what every layer uses (not PyTorch's behaviour: that tk wires it through)."""
    model = build(0.3)
    rates = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    rates += [m.dropout for m in model.modules() if isinstance(m, nn.GRU) and m.num_layers > 1]
    assert rates and set(rates) == {0.3}


# ---- GRU seq2seq with Bahdanau attention --------------------------------------------------------

S2S = dict(vocab_size=50, embed_size=16, num_hiddens=32, num_layers=2, dropout=0.0)


def _seq2seq():
    return Seq2SeqAttention(Seq2SeqConfig(**S2S)).eval()


def test_seq2seq_forward_shape_and_log_probs():
    model = _seq2seq()
    src, src_len = _source()
    tgt_in = torch.randint(4, 50, (3, 5))
    with torch.no_grad():
        log_probs = model(src, src_len, tgt_in)
    assert log_probs.shape == (3, 5, 50)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3, 5))
    # One attention map per step, never on padded source positions.
    assert len(model.decoder.attention_weights) == 5
    for w in model.decoder.attention_weights:
        assert w.shape == (3, 1, 6)
        assert torch.all(w[1, :, 3:] == 0) and torch.all(w[2, :, 1:] == 0)


def test_seq2seq_encoder_state_ignores_padding():
    model = _seq2seq()
    short = torch.tensor([[7, 8, 9]])
    batch = torch.tensor([[7, 8, 9, 0, 0, 0, 0], [11, 12, 13, 14, 15, 16, 17]])
    with torch.no_grad():
        alone = model.encode(short, torch.tensor([3]))
        padded = model.encode(batch, torch.tensor([3, 7]))
        assert padded["state"].shape == (2, 2, 32)
        torch.testing.assert_close(padded["state"][:, 0], alone["state"][:, 0], atol=1e-6, rtol=0)
        torch.testing.assert_close(padded["memory"][0, :3], alone["memory"][0], atol=1e-6, rtol=0)
        token = torch.tensor([2])
        lp_alone, _ = model.decode_step(token, alone)
        lp_padded, _ = model.decode_step(token.repeat(2), padded)
        torch.testing.assert_close(lp_padded[0], lp_alone[0], atol=1e-5, rtol=0)


def test_seq2seq_decode_step_log_probs_sum_to_one():
    model = _seq2seq()
    src, src_len = _source()
    with torch.no_grad():
        cache = model.encode(src, src_len)
        token = torch.full((3,), 2)
        for _ in range(3):
            log_probs, cache = model.decode_step(token, cache)
            assert log_probs.shape == (3, 50)
            torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3))
            token = log_probs.argmax(-1)
        assert cache["state"].shape == (2, 3, 32)


# ---- Nadaraya-Watson kernel regression ----------------------------------------------------------


def test_nonparametric_attention_weights_are_a_distribution():
    x_train, y_train, x_test, _ = synthetic_data()
    model = NWKernelRegression(learn_width=False)
    n = x_test.shape[0]
    pred = model(x_test, x_train.repeat(n, 1), y_train.repeat(n, 1))
    assert pred.shape == (n,)
    w = model.attention_weights
    assert w.shape == (n, 50)
    assert torch.all(w >= 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(n))
    # A non-parametric model has nothing to fit.
    assert list(fit(model, x_train, y_train)) == []
    assert float(model.w) == 1.0


def test_learned_width_beats_nonparametric():
    x_train, y_train, x_test, y_truth = synthetic_data()
    model = NWKernelRegression(learn_width=True)
    losses = [loss for _, loss in fit(model, x_train, y_train, epochs=5)]
    assert len(losses) == 5
    assert losses[-1] < losses[0]
    assert all(math.isfinite(v) for v in losses)
    learned = nw_test_mse(model, x_train, y_train, x_test, y_truth)
    baseline = nw_test_mse(NWKernelRegression(learn_width=False), x_train, y_train, x_test, y_truth)
    assert learned < baseline


def test_leave_one_out_never_includes_the_query():
    x_train, y_train, _, _ = synthetic_data(n_train=20)
    keys, values = leave_one_out(x_train, y_train)
    assert keys.shape == values.shape == (20, 19)
    for i in range(20):
        others = torch.cat([x_train[:i], x_train[i + 1 :]])
        assert torch.equal(keys[i], others)
        assert torch.equal(values[i], torch.cat([y_train[:i], y_train[i + 1 :]]))
        assert not torch.any(keys[i] == x_train[i])
