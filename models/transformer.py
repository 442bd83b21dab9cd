"""The encoder-decoder Transformer (Vaswani et al., 2017), post-LN by default, pre-LN as an option.

Names follow the paper and d2l.ai. The model splits into `encode` (source ->
memory and every decoder layer's cross-attention keys/values) and `decode_step`
(one new target token against a self-attention key/value cache), which is the
split of the exported encoder and decoder graphs; `forward` is the full-prefix
teacher-forcing pass used for training and as the reference for the cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from toolkit.models.attention import AddNorm, MultiHeadAttention, PositionalEncoding, PositionWiseFFN
from torch import nn

from toolkit.core.declaration import layer_key  # the cache layout is declared once, there


@dataclass
class TransformerConfig:
    vocab_size: int = 8000  # shared source/target subword vocabulary
    num_hiddens: int = 256  # d_model
    ffn_num_hiddens: int = 1024  # d_ff
    num_heads: int = 4  # h
    num_layers: int = 3  # N: encoder layers, and decoder layers unless decoder_layers says otherwise
    # Decoder layers; None: num_layers (configs written before it existed say nothing and load unchanged). A deep
    # encoder over a shallow decoder (6 + 2) decodes faster at the same size (Kasai et al. 2021).
    decoder_layers: int | None = None
    dropout: float = 0.1
    max_len: int = 64  # longest source or target sequence, in subword tokens
    pre_ln: bool = False  # False: post-LN as in the paper; True: pre-LN with a final LayerNorm
    pad_id: int = 0

    def __post_init__(self) -> None:
        if self.decoder_layers is None:
            self.decoder_layers = self.num_layers


class Sublayer(nn.Module):
    """x -> x + f(x) wrapped in LayerNorm, after (post-LN, AddNorm) or before (pre-LN)."""

    def __init__(self, d: int, dropout: float, pre_ln: bool):
        super().__init__()
        self.pre_ln = pre_ln
        self.addnorm = AddNorm(d, dropout)

    def forward(self, x, f):
        if self.pre_ln:
            return x + self.addnorm.dropout(f(self.addnorm.ln(x)))
        return self.addnorm(x, f(x))


class EncoderBlock(nn.Module):
    """x (batch, n, d), valid_lens (batch,) -> (batch, n, d)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        d = cfg.num_hiddens
        self.attention = MultiHeadAttention(d, cfg.num_heads, cfg.dropout)
        self.sub1 = Sublayer(d, cfg.dropout, cfg.pre_ln)
        self.ffn = PositionWiseFFN(cfg.ffn_num_hiddens, d)
        self.sub2 = Sublayer(d, cfg.dropout, cfg.pre_ln)

    def forward(self, x, valid_lens):
        x = self.sub1(x, lambda y: self.attention(y, y, y, valid_lens))
        return self.sub2(x, self.ffn)


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention to the encoder memory, FFN."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        d = cfg.num_hiddens
        self.self_attention = MultiHeadAttention(d, cfg.num_heads, cfg.dropout)
        self.sub1 = Sublayer(d, cfg.dropout, cfg.pre_ln)
        self.cross_attention = MultiHeadAttention(d, cfg.num_heads, cfg.dropout)
        self.sub2 = Sublayer(d, cfg.dropout, cfg.pre_ln)
        self.ffn = PositionWiseFFN(cfg.ffn_num_hiddens, d)
        self.sub3 = Sublayer(d, cfg.dropout, cfg.pre_ln)

    def cross_kv(self, memory):
        """memory (batch, n_src, d) -> keys, values (batch, heads, n_src, d_head)."""
        att = self.cross_attention
        return att.split_heads(att.W_k(memory)), att.split_heads(att.W_v(memory))

    def forward(self, x, causal_lens, cross_k, cross_v, src_len):
        """Full prefix: x (batch, m, d), causal_lens (batch, m) = [1..m] -> (batch, m, d)."""
        x = self.sub1(x, lambda y: self.self_attention(y, y, y, causal_lens))
        return self._cross_and_ffn(x, cross_k, cross_v, src_len)

    def step(self, x, past_k, past_v, cross_k, cross_v, src_len):
        """One position: x (batch, 1, d), past keys/values (batch, heads, t, d_head)
        -> (batch, 1, d), keys/values (batch, heads, t + 1, d_head)."""
        att = self.self_attention
        keys, values = past_k, past_v

        def self_attend(y):
            nonlocal keys, values
            keys = torch.cat([past_k, att.split_heads(att.W_k(y))], dim=2)
            values = torch.cat([past_v, att.split_heads(att.W_v(y))], dim=2)
            # The cache holds only positions up to t, so no causal mask is needed.
            return att.attend(att.split_heads(att.W_q(y)), keys, values, None)

        x = self.sub1(x, self_attend)
        return self._cross_and_ffn(x, cross_k, cross_v, src_len), keys, values

    def _cross_and_ffn(self, x, cross_k, cross_v, src_len):
        att = self.cross_attention
        x = self.sub2(x, lambda y: att.attend(att.split_heads(att.W_q(y)), cross_k, cross_v, src_len))
        return self.sub3(x, self.ffn)


class Transformer(nn.Module):
    """English -> French Transformer with a shared, tied subword embedding."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.num_hiddens
        self.embedding = nn.Embedding(cfg.vocab_size, d, padding_idx=cfg.pad_id)
        nn.init.normal_(self.embedding.weight, std=d**-0.5)
        self.pos_encoding = PositionalEncoding(d, cfg.dropout, cfg.max_len)
        self.encoder_blocks = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.num_layers))
        self.decoder_blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.decoder_layers))
        # Pre-LN leaves the residual stream unnormalised, hence one last LayerNorm per stack.
        self.encoder_norm = nn.LayerNorm(d) if cfg.pre_ln else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if cfg.pre_ln else nn.Identity()
        self.encoder_attention_weights: list[torch.Tensor] = []

    def embed(self, tokens, offset=None):
        """tokens (batch, n) -> (batch, n, d): embedding * sqrt(d) + positional encoding."""
        return self.pos_encoding(self.embedding(tokens) * math.sqrt(self.cfg.num_hiddens), offset)

    def logits(self, x):
        """(..., d) -> (..., vocab) through the tied embedding matrix."""
        return self.decoder_norm(x) @ self.embedding.weight.T

    def encode_memory(self, src, src_len):
        """src (batch, n), src_len (batch,) -> memory (batch, n, d).

        Each layer's attention weights (batch, heads, n, n) are kept in
        `encoder_attention_weights`.
        """
        x = self.embed(src)
        self.encoder_attention_weights = []
        for block in self.encoder_blocks:
            x = block(x, src_len)
            w = block.attention.attention.attention_weights
            self.encoder_attention_weights.append(w.reshape(x.shape[0], -1, *w.shape[1:]))
        return self.encoder_norm(x)

    def encode(self, src, src_len) -> dict[str, torch.Tensor]:
        """-> memory, each decoder layer's cross keys/values (batch, heads, n, d_head), src_len.

        The decoding loop adds the self-attention cache, empty at first:
        self_k_i, self_v_i (batch, heads, 0, d_head) for layer i.
        """
        memory = self.encode_memory(src, src_len)
        out = {"memory": memory, "src_len": src_len}
        for i, block in enumerate(self.decoder_blocks):
            out[layer_key("cross_k", i)], out[layer_key("cross_v", i)] = block.cross_kv(memory)
        return out

    def decode_step(self, token, cache: dict[str, torch.Tensor]):
        """token (batch,) -> log-probs (batch, vocab), cache with self keys/values one position longer.

        The position of the new token is the cache length, so the two cannot disagree.
        """
        x = self.embed(token.unsqueeze(1), offset=cache[layer_key("self_k", 0)].shape[2])
        new = {}
        for i, block in enumerate(self.decoder_blocks):
            sk, sv = layer_key("self_k", i), layer_key("self_v", i)
            x, new[sk], new[sv] = block.step(x, cache[sk], cache[sv], *self._cross(cache, i))
        log_probs = torch.log_softmax(self.logits(x.squeeze(1)), dim=-1)
        return log_probs, {**cache, **new}

    def decode_full(self, tgt_in, cache):
        """Full prefix, no self-attention cache: tgt_in (batch, m) -> log-probs (batch, m, vocab)."""
        b, m = tgt_in.shape
        causal_lens = torch.arange(1, m + 1, device=tgt_in.device).expand(b, m)
        x = self.embed(tgt_in)
        for i, block in enumerate(self.decoder_blocks):
            x = block(x, causal_lens, *self._cross(cache, i))
        return torch.log_softmax(self.logits(x), dim=-1)

    @staticmethod
    def _cross(cache, i):
        return cache[layer_key("cross_k", i)], cache[layer_key("cross_v", i)], cache["src_len"]

    def forward(self, src, src_len, tgt_in):
        """Teacher forcing: src (batch, n), src_len (batch,), tgt_in (batch, m) -> log-probs (batch, m, vocab)."""
        return self.decode_full(tgt_in, self.encode(src, src_len))
