"""A pre-LN Transformer translation model written the way the textbooks write one: its own layers on
nn.MultiheadAttention (layer norm before each sublayer, a final one on each stack), learned positions, a word-level
vocabulary shared by both languages. Then the ~30 lines that hand it to tk (`encode`/`decode_step` and `build`).

    python docs/examples/pre_ln_transformer.py --out runs/pre-ln --steps 300          # train on the toy pairs
    TK_EXAMPLE_RUN=runs/pre-ln tk export docs/examples/pre_ln_transformer.py:build --out exported/pre-ln
    tk verify exported/pre-ln --checkpoint docs/examples/pre_ln_transformer.py:build
    tk translate --model exported/pre-ln "I'm home."

The decoder runs over the whole prefix at every step: its state is the prefix (token ids, one position longer each
step). Both attentions take the source's padding mask; without it a sentence translates differently alone and in a
padded batch, which `tk verify` reports (its "batch" check).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
from pathlib import Path

import torch
from torch import nn

TOY_PAIRS = Path(__file__).with_name("toy_pairs.tsv")
SPECIALS = ["<unk>", "<pad>", "<bos>", "<eos>"]


class EncoderLayer(nn.Module):
    def __init__(self, d, heads, ffn, dropout):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(d, ffn), nn.ReLU(), nn.Linear(ffn, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, padding):
        h = self.norm1(x)
        x = x + self.drop(self.attn(h, h, h, key_padding_mask=padding, need_weights=False)[0])
        return x + self.drop(self.ffn(self.norm2(x)))


class DecoderLayer(nn.Module):
    def __init__(self, d, heads, ffn, dropout):
        super().__init__()
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.self_attn = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(d, heads, dropout=dropout, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(d, ffn), nn.ReLU(), nn.Linear(ffn, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, y, memory, causal, padding):
        h = self.norm1(y)
        y = y + self.drop(self.self_attn(h, h, h, attn_mask=causal, need_weights=False)[0])
        h = self.norm2(y)
        y = y + self.drop(self.cross_attn(h, memory, memory, key_padding_mask=padding, need_weights=False)[0])
        return y + self.drop(self.ffn(self.norm3(y)))


class Transformer(nn.Module):
    def __init__(self, vocab, d=32, heads=4, layers=2, ffn=64, max_len=24, dropout=0.1, pad=1):
        super().__init__()
        self.d, self.pad = d, pad
        self.embed = nn.Embedding(vocab, d, padding_idx=pad)
        self.positions = nn.Embedding(max_len, d)
        self.encoder = nn.ModuleList(EncoderLayer(d, heads, ffn, dropout) for _ in range(layers))
        self.decoder = nn.ModuleList(DecoderLayer(d, heads, ffn, dropout) for _ in range(layers))
        self.enc_norm, self.dec_norm = nn.LayerNorm(d), nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def _embed(self, tokens):
        return self.embed(tokens) * math.sqrt(self.d) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))

    def _padding(self, lengths, n):
        return torch.arange(n, device=lengths.device)[None, :] >= lengths[:, None]

    def _decode(self, prefix, memory, src_len):
        t = prefix.shape[1]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=prefix.device), diagonal=1)
        y, padding = self._embed(prefix), self._padding(src_len, memory.shape[1])
        for layer in self.decoder:
            y = layer(y, memory, causal, padding)
        return self.out(self.dec_norm(y))

    def forward(self, src, src_len, tgt_in):
        """Teacher forcing, for training: logits (batch, m, vocab)."""
        return self._decode(tgt_in, self.encode(src, src_len)["memory"], src_len)

    # ---- the two methods tk's contract asks for ---------------------------------------------------------------

    def encode(self, src, src_len):
        x, padding = self._embed(src), self._padding(src_len, src.shape[1])
        for layer in self.encoder:
            x = layer(x, padding)
        return {"memory": self.enc_norm(x)}

    def decode_step(self, token, state):
        prefix = torch.cat([state["prefix"], token[:, None]], dim=1)
        logits = self._decode(prefix, state["memory"], state["src_len"])[:, -1]
        return torch.log_softmax(logits, dim=-1), {**state, "prefix": prefix}


def build():
    """What `tk export docs/examples/pre_ln_transformer.py:build` calls: the trained model of $TK_EXAMPLE_RUN."""
    from toolkit import Seq2SeqAdapter, WordVocab

    run = Path(os.environ.get("TK_EXAMPLE_RUN", "runs/pre-ln"))
    config = json.loads((run / "config.json").read_text())
    tokens = config.pop("tokens")
    model = Transformer(len(tokens), **config)
    model.load_state_dict(torch.load(run / "model.pt", weights_only=True))
    return Seq2SeqAdapter(model=model.eval(), tokenizer=WordVocab(tokens, split="punctuation", lowercase=True),
                          encoder_outputs={"memory": ("batch", "src_len", config["d"])},
                          decoder_state={"prefix": ("batch", "past_len")}, integer=frozenset({"prefix"}),
                          vocab_size=len(tokens), max_len=config["max_len"])


# ---- training, briefly, on the toy pairs --------------------------------------------------------------------------

def train(out: Path, steps: int = 300, seed: int = 0, pairs: Path = TOY_PAIRS, **sizes) -> None:
    from toolkit import WordVocab

    torch.manual_seed(seed)
    split = WordVocab(SPECIALS).words  # the rule the adapter declares: tokenized the same here and in tk
    lines = [line.split("\t") for line in pairs.read_text(encoding="utf-8").splitlines() if line.count("\t") == 1]
    data = [(split(e), split(f)) for e, f in lines]
    counts = collections.Counter(w for e, f in data for w in e + f)
    tokens = SPECIALS + sorted(counts)
    ids = {t: i for i, t in enumerate(tokens)}
    pad, bos, eos = ids["<pad>"], ids["<bos>"], ids["<eos>"]
    config = {"d": 32, "heads": 4, "layers": 2, "ffn": 64, "max_len": 24, "pad": pad, **sizes}
    model = Transformer(len(tokens), **config)
    src = nn.utils.rnn.pad_sequence([torch.tensor([ids[w] for w in e]) for e, _ in data], batch_first=True, padding_value=pad)
    tgt = nn.utils.rnn.pad_sequence([torch.tensor([bos, *(ids[w] for w in f), eos]) for _, f in data], batch_first=True,
                                    padding_value=pad)
    src_len = torch.tensor([len(e) for e, _ in data])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        logits = model(src, src_len, tgt[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1), ignore_index=pad)
        opt.zero_grad()
        loss.backward()
        opt.step()
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "model.pt")
    (out / "config.json").write_text(json.dumps({**config, "tokens": tokens}))
    print(f"{steps} steps, last loss {loss.item():.3f}; wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/pre-ln"))
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    train(args.out, args.steps)
