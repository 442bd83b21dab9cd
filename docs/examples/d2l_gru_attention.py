"""A GRU encoder-decoder with Bahdanau (additive) attention written as the d2l.ai textbook writes it (chapters 10.7
and 11.4): time-major nn.GRU layers (inputs (T, B, E)), d2l's masked_softmax, separate source and target word
vocabularies (d2l's Vocab) and `<eos>` after every source. Then the ~30 lines that hand it to tk (`TkSeq2Seq`, `build`).

    python docs/examples/d2l_gru_attention.py --out runs/d2l-gru --steps 300          # train on the toy pairs
    TK_EXAMPLE_RUN=runs/d2l-gru tk export docs/examples/d2l_gru_attention.py:build --out exported/d2l-gru
    tk verify exported/d2l-gru --checkpoint docs/examples/d2l_gru_attention.py:build
    tk translate --model exported/d2l-gru "I'm home."

The one change from the book: nn.Linear with its input size where the book has nn.LazyLinear (a lazy layer has no
weights to export until it has run once).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
from pathlib import Path

import torch
from torch import nn

TOY_PAIRS = Path(__file__).with_name("toy_pairs.tsv")


# ---- the textbook's data pipeline (d2l.MTFraEng, d2l.Vocab) -------------------------------------------------------

def preprocess(text: str) -> str:
    """d2l's: no-break spaces to spaces, lower case, a space before , . ! ? when a word precedes it."""
    text = text.replace("\u202f", " ").replace("\xa0", " ").lower()
    return "".join(" " + c if i > 0 and c in ",.!?" and text[i - 1] != " " else c for i, c in enumerate(text))


class Vocab:
    """d2l.Vocab: the sorted set of tokens seen at least min_freq times, with <unk> and the reserved tokens."""

    def __init__(self, tokens=(), min_freq=0, reserved_tokens=()):
        tokens = [t for line in tokens for t in line] if tokens and isinstance(tokens[0], list) else list(tokens)
        counter = collections.Counter(tokens)
        self.idx_to_token = sorted({"<unk>", *reserved_tokens, *(t for t, f in counter.items() if f >= min_freq)})
        self.token_to_idx = {t: i for i, t in enumerate(self.idx_to_token)}

    def __len__(self):
        return len(self.idx_to_token)

    def __getitem__(self, tokens):
        if not isinstance(tokens, (list, tuple)):
            return self.token_to_idx.get(tokens, self.unk)
        return [self[t] for t in tokens]

    @property
    def unk(self):
        return self.token_to_idx["<unk>"]


def read_data(path: Path = TOY_PAIRS) -> tuple[list[list[str]], list[list[str]]]:
    src, tgt = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) == 2:
            src.append([t for t in f"{preprocess(parts[0])} <eos>".split(" ") if t])  # d2l: every source ends with <eos>
            tgt.append([t for t in f"{preprocess(parts[1])} <eos>".split(" ") if t])
    return src, tgt


# ---- the textbook's model (d2l.Seq2SeqEncoder, d2l.AdditiveAttention, d2l.Seq2SeqAttentionDecoder) ----------------

def masked_softmax(X, valid_lens):
    def _sequence_mask(X, valid_len, value=0):
        maxlen = X.size(1)
        mask = torch.arange((maxlen), dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
        X[~mask] = value
        return X

    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = _sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


class AdditiveAttention(nn.Module):
    def __init__(self, num_hiddens, dropout, key_size, query_size):
        super().__init__()
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens):
        queries, keys = self.W_q(queries), self.W_k(keys)
        features = torch.tanh(queries.unsqueeze(2) + keys.unsqueeze(1))
        scores = self.w_v(features).squeeze(-1)
        self.attention_weights = masked_softmax(scores, valid_lens)  # kept for plotting, as the book does
        return torch.bmm(self.dropout(self.attention_weights), values)


class Seq2SeqEncoder(nn.Module):
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size, num_hiddens, num_layers, dropout=dropout)

    def forward(self, X, *args):
        embs = self.embedding(X.t().type(torch.int64))  # (num_steps, batch_size, embed_size): time-major
        outputs, state = self.rnn(embs)
        return outputs, state


class Seq2SeqAttentionDecoder(nn.Module):
    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0):
        super().__init__()
        self.attention = AdditiveAttention(num_hiddens, dropout, num_hiddens, num_hiddens)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(embed_size + num_hiddens, num_hiddens, num_layers, dropout=dropout)
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, enc_outputs, enc_valid_lens):
        outputs, hidden_state = enc_outputs
        return (outputs.permute(1, 0, 2), hidden_state, enc_valid_lens)

    def forward(self, X, state):
        enc_outputs, hidden_state, enc_valid_lens = state
        X = self.embedding(X).permute(1, 0, 2)
        outputs, self._attention_weights = [], []
        for x in X:
            query = torch.unsqueeze(hidden_state[-1], dim=1)
            context = self.attention(query, enc_outputs, enc_outputs, enc_valid_lens)
            x = torch.cat((context, torch.unsqueeze(x, dim=1)), dim=-1)
            out, hidden_state = self.rnn(x.permute(1, 0, 2), hidden_state)
            outputs.append(out)
            self._attention_weights.append(self.attention.attention_weights)
        outputs = self.dense(torch.cat(outputs, dim=0))
        return outputs.permute(1, 0, 2), [enc_outputs, hidden_state, enc_valid_lens]


class Seq2Seq(nn.Module):
    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, enc_X, dec_X, enc_valid_len):
        enc_all_outputs = self.encoder(enc_X, enc_valid_len)
        dec_state = self.decoder.init_state(enc_all_outputs, enc_valid_len)
        return self.decoder(dec_X, dec_state)[0]


def make_model(src_vocab: int, tgt_vocab: int, embed_size: int = 32, num_hiddens: int = 32, num_layers: int = 2) -> Seq2Seq:
    return Seq2Seq(Seq2SeqEncoder(src_vocab, embed_size, num_hiddens, num_layers),
                   Seq2SeqAttentionDecoder(tgt_vocab, embed_size, num_hiddens, num_layers))


# ---- the adapter: what tk needs of it ----------------------------------------------------------------------------

class TkSeq2Seq(nn.Module):
    """encode / decode_step around the textbook model: the GRU's hidden state is a fixed-shape decoder state that
    starts as the encoder's, and the valid lengths pass through the encoder as d2l's init_state passes them."""

    def __init__(self, net: Seq2Seq, num_steps: int, pad: int):
        super().__init__()
        self.net, self.num_steps, self.pad = net, num_steps, pad

    def encode(self, src, src_len):
        # d2l pads every source to num_steps, in training and in predict_step, and its GRU runs over the padding: the
        # last state depends on it. Padded here the same way, a sentence translates the same alone or in a batch.
        src = nn.functional.pad(src, (0, self.num_steps - src.shape[1]), value=self.pad)
        memory, hidden, valid_lens = self.net.decoder.init_state(self.net.encoder(src, src_len), src_len)
        return {"memory": memory, "hidden": hidden, "valid_lens": valid_lens}

    def decode_step(self, token, state):
        Y, (_, hidden, _) = self.net.decoder(token[:, None], [state["memory"], state["hidden"], state["valid_lens"]])
        return torch.log_softmax(Y[:, -1], dim=-1), {**state, "hidden": hidden}


def build():
    """What `tk export docs/examples/d2l_gru_attention.py:build` calls: the trained model of $TK_EXAMPLE_RUN."""
    from toolkit import Seq2SeqAdapter, WordVocab

    run = Path(os.environ.get("TK_EXAMPLE_RUN", "runs/d2l-gru"))
    config = json.loads((run / "config.json").read_text())
    src_tokens, tgt_tokens, num_steps = config.pop("src_tokens"), config.pop("tgt_tokens"), config.pop("num_steps")
    net = make_model(len(src_tokens), len(tgt_tokens), **config)
    net.load_state_dict(torch.load(run / "model.pt", weights_only=True))
    layers, hiddens = config["num_layers"], config["num_hiddens"]
    return Seq2SeqAdapter(
        model=TkSeq2Seq(net, num_steps, src_tokens.index("<pad>")).eval(),
        tokenizer=WordVocab(src_tokens, split="punctuation", lowercase=True),  # d2l's preprocess, then split on spaces
        target_tokenizer=WordVocab(tgt_tokens, split="punctuation", lowercase=True),
        source_end=True,  # d2l appends <eos> to every source
        encoder_outputs={"memory": ("batch", num_steps, hiddens), "hidden": (layers, "batch", hiddens), "valid_lens": ("batch",)},
        decoder_state={"hidden": (layers, "batch", hiddens)},  # fixed shape, carried step to step
        integer=frozenset({"valid_lens"}), vocab_size=len(tgt_tokens), max_len=num_steps)


# ---- training: d2l's loop, briefly, on the toy pairs --------------------------------------------------------------

def train(out: Path, steps: int = 300, seed: int = 0, pairs: Path = TOY_PAIRS, **sizes) -> None:
    torch.manual_seed(seed)
    src, tgt = read_data(pairs)
    src_vocab = Vocab(src, reserved_tokens=["<pad>", "<bos>", "<eos>"])
    tgt_vocab = Vocab(tgt, reserved_tokens=["<pad>", "<bos>", "<eos>"])
    num_steps = max(12, max(len(s) for s in src + tgt) + 1)  # d2l pads every sentence to num_steps

    def pad(lines, vocab, bos=False):
        rows = [vocab[(["<bos>"] if bos else []) + line] for line in lines]
        return torch.tensor([r + [vocab["<pad>"]] * (num_steps - len(r)) for r in rows])

    X, Y_in, Y = pad(src, src_vocab), pad([t[:-1] for t in tgt], tgt_vocab, bos=True), pad(tgt, tgt_vocab)
    valid = (X != src_vocab["<pad>"]).sum(1)
    config = {"embed_size": 32, "num_hiddens": 32, "num_layers": 2, **sizes}
    net = make_model(len(src_vocab), len(tgt_vocab), **config)
    opt = torch.optim.Adam(net.parameters(), lr=0.005)
    for _ in range(steps):
        logits = net(X, Y_in, valid)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), Y.reshape(-1), ignore_index=tgt_vocab["<pad>"])
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
    out.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), out / "model.pt")
    (out / "config.json").write_text(json.dumps({**config, "num_steps": num_steps, "src_tokens": src_vocab.idx_to_token,
                                                 "tgt_tokens": tgt_vocab.idx_to_token}))
    print(f"{steps} steps, last loss {loss.item():.3f}; wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/d2l-gru"))
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    train(args.out, args.steps)
