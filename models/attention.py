"""Attention building blocks, following the classic formulations (d2l.ai, chapter 11).

Every forward takes only tensors, so the same modules export to ONNX without
Python values being frozen into the graph as constants.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def sequence_mask(valid_lens: torch.Tensor, length: int | torch.Tensor) -> torch.Tensor:
    """Boolean mask (..., length): True where position < valid length.

    valid_lens: (...,) integer tensor.
    """
    positions = torch.arange(length, device=valid_lens.device)
    return positions < valid_lens.unsqueeze(-1)


def masked_softmax(scores: torch.Tensor, valid_lens: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis, ignoring positions at or beyond the valid length.

    scores: (batch, queries, keys). valid_lens: None, (batch,) for one length per
    row, or (batch, queries) for one length per query. Masked positions get
    exactly zero weight, and a fully masked row gives all zeros rather than NaN:
    the dtype's own minimum (not -1e9, which overflows float16) keeps the
    softmax finite and the mask multiplies the leftovers away.
    """
    if valid_lens is None:
        return torch.softmax(scores, dim=-1)
    if valid_lens.dim() == 1:
        valid_lens = valid_lens.unsqueeze(-1).expand(scores.shape[:-1])
    mask = sequence_mask(valid_lens, scores.shape[-1])
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(filled, dim=-1) * mask.to(scores.dtype)


class DotProductAttention(nn.Module):
    """Scaled dot-product attention: softmax(Q K^T / sqrt(d)) V.

    queries (batch, n_q, d), keys (batch, n_kv, d), values (batch, n_kv, d_v),
    valid_lens None, (batch,) or (batch, n_q) -> (batch, n_q, d_v).
    The weights of the last call are kept in `attention_weights` (batch, n_q, n_kv).
    """

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.attention_weights: torch.Tensor | None = None

    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class AdditiveAttention(nn.Module):
    """Additive (MLP) attention: score(q, k) = w_v^T tanh(W_q q + W_k k).

    queries (batch, n_q, q_dim), keys (batch, n_kv, k_dim), values (batch, n_kv, d_v),
    valid_lens None, (batch,) or (batch, n_q) -> (batch, n_q, d_v).
    """

    def __init__(self, query_size: int, key_size: int, num_hiddens: int, dropout: float = 0.0):
        super().__init__()
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.attention_weights: torch.Tensor | None = None

    def forward(self, queries, keys, values, valid_lens=None):
        queries, keys = self.W_q(queries), self.W_k(keys)
        # (batch, n_q, 1, h) + (batch, 1, n_kv, h) broadcasts to every query-key pair.
        features = torch.tanh(queries.unsqueeze(2) + keys.unsqueeze(1))
        scores = self.w_v(features).squeeze(-1)  # (batch, n_q, n_kv)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with query/key/value/output projections.

    queries (batch, n_q, d_model), keys/values (batch, n_kv, d_model),
    valid_lens None, (batch,) or (batch, n_q) -> (batch, n_q, d_model).
    Heads run as one batched dot-product attention over (batch * heads).
    """

    def __init__(self, num_hiddens: int, num_heads: int, dropout: float = 0.0, bias: bool = False):
        super().__init__()
        if num_hiddens % num_heads:
            raise ValueError(f"num_hiddens={num_hiddens} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.attention = DotProductAttention(dropout)
        self.W_q = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_k = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_v = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, n, d_model) -> (batch, heads, n, d_model / heads)."""
        b, n, d = x.shape
        return x.reshape(b, n, self.num_heads, d // self.num_heads).transpose(1, 2)

    def attend(self, q_heads, k_heads, v_heads, valid_lens=None):
        """Attention over already split heads (batch, heads, n, d_head) -> (batch, n_q, d_model).

        The decoder's cached step calls this directly with keys and values
        accumulated over earlier steps.
        """
        b, h, n_q, d_head = q_heads.shape
        n_kv = k_heads.shape[2]
        if valid_lens is not None:
            # One copy of each row's lengths per head, matching the (batch * heads) layout.
            valid_lens = torch.repeat_interleave(valid_lens, repeats=h, dim=0)
        out = self.attention(
            q_heads.reshape(b * h, n_q, d_head),
            k_heads.reshape(b * h, n_kv, d_head),
            v_heads.reshape(b * h, n_kv, d_head),
            valid_lens,
        )
        out = out.reshape(b, h, n_q, d_head).transpose(1, 2).reshape(b, n_q, h * d_head)
        return self.W_o(out)

    def forward(self, queries, keys, values, valid_lens=None):
        return self.attend(
            self.split_heads(self.W_q(queries)),
            self.split_heads(self.W_k(keys)),
            self.split_heads(self.W_v(values)),
            valid_lens,
        )


class PositionWiseFFN(nn.Module):
    """Two-layer MLP applied to every position: (..., num_inputs) -> (..., ffn_num_outputs).

    num_inputs defaults to ffn_num_outputs (d_model in, d_model out, as in the Transformer).
    """

    def __init__(self, ffn_num_hiddens: int, ffn_num_outputs: int, num_inputs: int | None = None):
        super().__init__()
        self.dense1 = nn.Linear(num_inputs or ffn_num_outputs, ffn_num_hiddens)
        self.relu = nn.ReLU()
        self.dense2 = nn.Linear(ffn_num_hiddens, ffn_num_outputs)

    def forward(self, x):
        return self.dense2(self.relu(self.dense1(x)))


class AddNorm(nn.Module):
    """Residual connection followed by layer normalisation: LayerNorm(x + Dropout(y))."""

    def __init__(self, norm_shape: int, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.ln = nn.LayerNorm(norm_shape)

    def forward(self, x, y):
        return self.ln(self.dropout(y) + x)


class PositionalEncoding(nn.Module):
    """Sinusoidal positions: P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(...).

    x (batch, n, d) -> x + P[offset : offset + n], then dropout. `offset` lets a
    cached decoder add the encoding of position t to a single new token.
    """

    def __init__(self, num_hiddens: int, dropout: float = 0.0, max_len: int = 1000):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        position = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1)
        div = torch.pow(10000, torch.arange(0, num_hiddens, 2, dtype=torch.float32) / num_hiddens)
        table = torch.zeros(max_len, num_hiddens)
        table[:, 0::2] = torch.sin(position / div)
        table[:, 1::2] = torch.cos(position / div[: num_hiddens // 2])
        # Not a parameter, and not saved: it is a pure function of the shape.
        self.register_buffer("P", table, persistent=False)

    def forward(self, x, offset=None):
        n = x.shape[1]
        if offset is None:
            pos = self.P[:n]
        else:
            pos = self.P[offset + torch.arange(n, device=x.device)]
        return self.dropout(x + pos.unsqueeze(0).to(x.dtype))
