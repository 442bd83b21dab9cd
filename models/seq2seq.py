"""GRU encoder-decoder with Bahdanau (additive) attention.

The model splits into `encode` (once per sentence) and `decode_step` (once per
target position), which is the split the exported encoder and decoder graphs use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from toolkit.models.attention import AdditiveAttention
from torch import nn


@dataclass
class Seq2SeqConfig:
    vocab_size: int = 8000  # shared source/target subword vocabulary
    embed_size: int = 256
    num_hiddens: int = 256
    num_layers: int = 2
    dropout: float = 0.1
    max_len: int = 64  # longest source or target sequence, in subword tokens
    pad_id: int = 0
    # Output projection shares the embedding matrix (needs embed_size == num_hiddens): a third
    # fewer parameters at a 6,000-piece vocabulary, as in the Transformer.
    tie_embeddings: bool = False


class StackedGRU(nn.Module):
    """Stacked unidirectional GRU that also returns every layer's full output.

    Each layer is its own nn.GRU so that the state at each row's last valid
    position can be read out per layer: the final state then ignores padding,
    and a sentence translates the same whatever else shares its batch.
    """

    def __init__(self, input_size: int, hidden: int, num_layers: int, dropout: float):
        super().__init__()
        sizes = [input_size] + [hidden] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.GRU(s, hidden, batch_first=True) for s in sizes)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, state=None):
        """x (batch, n, in), state (layers, batch, hidden) or None
        -> top outputs (batch, n, hidden), per-layer outputs [(batch, n, hidden)], last state."""
        per_layer, last = [], []
        for i, gru in enumerate(self.layers):
            h0 = None if state is None else state[i : i + 1].contiguous()
            x, h = gru(x, h0)
            per_layer.append(x)
            last.append(h)
            if i + 1 < len(self.layers):
                x = self.dropout(x)
        return x, per_layer, torch.cat(last, dim=0)


class Seq2SeqEncoder(nn.Module):
    """src (batch, n), src_len (batch,) -> outputs (batch, n, hidden), state (layers, batch, hidden)."""

    def __init__(self, cfg: Seq2SeqConfig, embedding: nn.Embedding):
        super().__init__()
        self.embedding = embedding
        self.rnn = StackedGRU(cfg.embed_size, cfg.num_hiddens, cfg.num_layers, cfg.dropout)

    def forward(self, src, src_len):
        outputs, per_layer, _ = self.rnn(self.embedding(src))
        # State at position src_len - 1 of every layer: padding after it never leaks in.
        index = (src_len - 1).clamp(min=0).reshape(1, -1, 1, 1)
        stacked = torch.stack(per_layer, dim=0)  # (layers, batch, n, hidden)
        index = index.expand(stacked.shape[0], -1, 1, stacked.shape[-1])
        state = torch.gather(stacked, 2, index).squeeze(2)
        return outputs, state


class Seq2SeqAttentionDecoder(nn.Module):
    """One step: previous token (batch,), state (layers, batch, hidden), memory, src_len
    -> log-probabilities (batch, vocab), new state. Attention query: the top layer's state."""

    def __init__(self, cfg: Seq2SeqConfig, embedding: nn.Embedding):
        super().__init__()
        self.embedding = embedding
        self.attention = AdditiveAttention(cfg.num_hiddens, cfg.num_hiddens, cfg.num_hiddens, cfg.dropout)
        self.rnn = StackedGRU(cfg.embed_size + cfg.num_hiddens, cfg.num_hiddens, cfg.num_layers, cfg.dropout)
        if cfg.tie_embeddings and cfg.embed_size != cfg.num_hiddens:
            raise ValueError(f"tie_embeddings needs embed_size == num_hiddens (got {cfg.embed_size} and {cfg.num_hiddens})")
        self.dense = None if cfg.tie_embeddings else nn.Linear(cfg.num_hiddens, cfg.vocab_size)
        self.out_bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.tie_embeddings else None
        self.attention_weights: list[torch.Tensor] = []

    def step(self, token, state, memory, src_len):
        query = state[-1].unsqueeze(1)  # (batch, 1, hidden)
        context = self.attention(query, memory, memory, src_len)  # (batch, 1, hidden)
        self.attention_weights.append(self.attention.attention_weights)
        x = torch.cat([context, self.embedding(token).unsqueeze(1)], dim=-1)
        out, _, state = self.rnn(x, state)
        out = out.squeeze(1)
        logits = self.dense(out) if self.dense is not None else out @ self.embedding.weight.T + self.out_bias
        return torch.log_softmax(logits, dim=-1), state


class Seq2SeqAttention(nn.Module):
    """English -> French GRU encoder-decoder with Bahdanau attention."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.cfg = cfg
        embedding = nn.Embedding(cfg.vocab_size, cfg.embed_size, padding_idx=cfg.pad_id)
        self.encoder = Seq2SeqEncoder(cfg, embedding)
        self.decoder = Seq2SeqAttentionDecoder(cfg, embedding)

    def encode(self, src, src_len) -> dict[str, torch.Tensor]:
        memory, state = self.encoder(src, src_len)
        self.decoder.attention_weights = []  # one sentence batch's weights, not every batch ever decoded
        return {"memory": memory, "state": state, "src_len": src_len}

    def decode_step(self, token, cache: dict[str, torch.Tensor]):
        """token (batch,) -> log-probs (batch, vocab), updated cache."""
        log_probs, state = self.decoder.step(token, cache["state"], cache["memory"], cache["src_len"])
        return log_probs, {**cache, "state": state}

    def forward(self, src, src_len, tgt_in):
        """Teacher forcing: tgt_in (batch, m) -> log-probs (batch, m, vocab)."""
        cache = self.encode(src, src_len)
        steps = []
        for t in range(tgt_in.shape[1]):
            log_probs, cache = self.decode_step(tgt_in[:, t], cache)
            steps.append(log_probs)
        return torch.stack(steps, dim=1)
