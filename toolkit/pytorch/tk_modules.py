"""The builder of tk's standalone attention modules and the kernel regression (toolkit.core.entries.modules
and .nw): one graph each, over the modules in models/."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from toolkit.core.graphs import FLOAT, INT, GraphSpec, TensorSpec
from toolkit.models.attention import AdditiveAttention, DotProductAttention, MultiHeadAttention, masked_softmax
from toolkit.models.kernel_regression import NWKernelRegression
from toolkit.pytorch.registry import ModelEntry


@dataclass
class AttentionConfig:
    query_size: int = 8
    key_size: int = 8
    value_size: int = 6
    num_hiddens: int = 16
    num_heads: int = 4


@dataclass
class KernelRegressionConfig:
    learn_width: bool = True


def _qkv(q: int, k: int, v: int) -> tuple[TensorSpec, ...]:
    return (TensorSpec("queries", FLOAT, ("batch", "n_q", q)), TensorSpec("keys", FLOAT, ("batch", "n_kv", k)),
            TensorSpec("values", FLOAT, ("batch", "n_kv", v)), TensorSpec("valid_lens", INT, ("batch", "n_q"), "lengths:n_kv"))


def _attention_outputs(v: int, weight_dims: tuple) -> tuple[TensorSpec, ...]:
    return (TensorSpec("output", FLOAT, ("batch", "n_q", v)), TensorSpec("attention_weights", FLOAT, weight_dims))


def _module_graph(inputs, outputs) -> list[GraphSpec]:
    return [GraphSpec("model", tuple(inputs), tuple(outputs))]


def _with_weights(model, *inputs):
    out = model(*inputs)
    return out, model.attention_weights


def _mha_run(model: MultiHeadAttention, q, k, v, valid_lens):
    out = model(q, k, v, valid_lens)
    w = model.attention.attention_weights
    return out, w.reshape(q.shape[0], model.num_heads, *w.shape[1:])


class _MaskedSoftmax(nn.Module):
    """masked_softmax has no parameters; a module gives it the same export path as the rest."""

    def forward(self, scores, valid_lens):
        return masked_softmax(scores, valid_lens)


MODELS = {e.name: e for e in (
    ModelEntry(
        "masked_softmax", AttentionConfig, lambda c: _MaskedSoftmax(),
        lambda c: _module_graph(
            (TensorSpec("scores", FLOAT, ("batch", "n_q", "n_kv")), TensorSpec("valid_lens", INT, ("batch", "n_q"), "lengths:n_kv")),
            (TensorSpec("weights", FLOAT, ("batch", "n_q", "n_kv")),)),
        run=lambda m, s, v: (m(s, v),)),
    ModelEntry(
        "dot_attention", AttentionConfig, lambda c: DotProductAttention(dropout=0.0),
        lambda c: _module_graph(_qkv(c.query_size, c.query_size, c.value_size),
                                _attention_outputs(c.value_size, ("batch", "n_q", "n_kv"))),
        run=_with_weights),
    ModelEntry(
        "additive_attention", AttentionConfig,
        lambda c: AdditiveAttention(c.query_size, c.key_size, c.num_hiddens, dropout=0.0),
        lambda c: _module_graph(_qkv(c.query_size, c.key_size, c.value_size),
                                _attention_outputs(c.value_size, ("batch", "n_q", "n_kv"))),
        run=_with_weights),
    ModelEntry(
        "multihead_attention", AttentionConfig,
        lambda c: MultiHeadAttention(c.num_hiddens, c.num_heads, dropout=0.0),
        lambda c: _module_graph(_qkv(c.num_hiddens, c.num_hiddens, c.num_hiddens),
                                _attention_outputs(c.num_hiddens, ("batch", c.num_heads, "n_q", "n_kv"))),
        run=_mha_run),
    ModelEntry(
        "nw", KernelRegressionConfig, lambda c: NWKernelRegression(c.learn_width),
        lambda c: _module_graph(
            (TensorSpec("queries", FLOAT, ("n_q",)), TensorSpec("keys", FLOAT, ("n_q", "n_kv")), TensorSpec("values", FLOAT, ("n_q", "n_kv"))),
            (TensorSpec("output", FLOAT, ("n_q",)), TensorSpec("attention_weights", FLOAT, ("n_q", "n_kv")))),
        run=_with_weights, train="regression"),
)}
