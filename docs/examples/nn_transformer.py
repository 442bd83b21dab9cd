"""A translation model written the way most people write one, on torch.nn.TransformerEncoder/Decoder layers, and the
few lines that hand it to tk (`build`, which returns a toolkit.Seq2SeqAdapter).

    python docs/examples/nn_transformer.py --out runs/nn-transformer --seconds 60     # train on fra-eng
    TK_EXAMPLE_RUN=runs/nn-transformer tk export docs/examples/nn_transformer.py:build --out exported/nn-transformer
    tk verify exported/nn-transformer --checkpoint docs/examples/nn_transformer.py:build
    tk translate --model exported/nn-transformer "I'm home."

The decoder keeps no key/value cache of its own: each step runs the decoder layers over the whole prefix, which is
its state (`prefix`, token ids growing by one position a step). tk exports that as it is; a model with a key/value
cache per layer declares those tensors instead (see docs/models.md).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import time
import zipfile
from pathlib import Path

import sentencepiece as spm
import torch
from torch import nn

PAD, UNK, BOS, EOS = 0, 1, 2, 3


class Seq2Seq(nn.Module):
    def __init__(self, vocab: int, d: int = 128, heads: int = 4, layers: int = 2, ffn: int = 256, max_len: int = 48,
                 dropout: float = 0.1):
        super().__init__()
        self.d, self.max_len = d, max_len
        self.embed = nn.Embedding(vocab, d, padding_idx=PAD)
        self.positions = nn.Embedding(max_len, d)
        encoder_layer = nn.TransformerEncoderLayer(d, heads, ffn, dropout, batch_first=True)
        decoder_layer = nn.TransformerDecoderLayer(d, heads, ffn, dropout, batch_first=True)
        # No nested tensors: they zero the padded positions in eager mode, which an exported graph does not do.
        self.encoder = nn.TransformerEncoder(encoder_layer, layers, enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(decoder_layer, layers)
        self.generator = nn.Linear(d, vocab)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.embed(tokens) * math.sqrt(self.d) + self.positions(positions)

    @staticmethod
    def _padding(lengths: torch.Tensor, n: int) -> torch.Tensor:
        return torch.arange(n, device=lengths.device)[None, :] >= lengths[:, None]

    def _decode(self, prefix: torch.Tensor, memory: torch.Tensor, src_len: torch.Tensor) -> torch.Tensor:
        t = prefix.shape[1]
        causal = torch.triu(torch.full((t, t), float("-inf"), device=prefix.device), diagonal=1)
        # tgt_is_causal=True: without it PyTorch inspects the mask's values, which torch.export cannot trace.
        h = self.decoder(self._embed(prefix), memory, tgt_mask=causal, tgt_is_causal=True,
                         memory_key_padding_mask=self._padding(src_len, memory.shape[1]))
        return self.generator(h)

    def forward(self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing, for training: logits (batch, m, vocab)."""
        return self._decode(tgt_in, self.encode(src, src_len)["memory"], src_len)

    # ---- the two methods tk's contract asks for -------------------------------------------------------------

    def encode(self, src: torch.Tensor, src_len: torch.Tensor) -> dict[str, torch.Tensor]:
        memory = self.encoder(self._embed(src), src_key_padding_mask=self._padding(src_len, src.shape[1]))
        return {"memory": memory}

    def decode_step(self, token: torch.Tensor, state: dict[str, torch.Tensor]):
        prefix = torch.cat([state["prefix"], token[:, None]], dim=1)
        logits = self._decode(prefix, state["memory"], state["src_len"])[:, -1]
        return torch.log_softmax(logits, dim=-1), {**state, "prefix": prefix}


def build():
    """What `tk export docs/examples/nn_transformer.py:build` calls: the trained model of $TK_EXAMPLE_RUN."""
    from toolkit import Seq2SeqAdapter

    run = Path(os.environ.get("TK_EXAMPLE_RUN", "runs/nn-transformer"))
    config = json.loads((run / "config.json").read_text())
    model = Seq2Seq(**config)
    model.load_state_dict(torch.load(run / "model.pt", weights_only=True))
    return Seq2SeqAdapter(model=model.eval(), tokenizer=run / "tokenizer.model",
                          encoder_outputs={"memory": ("batch", "src_len", config["d"])},
                          decoder_state={"prefix": ("batch", "past_len")}, integer=frozenset({"prefix"}),
                          vocab_size=config["vocab"], max_len=config["max_len"])


# ---- training: a minute on the Tatoeba pairs ---------------------------------------------------------------

def read_pairs(corpus: Path, limit: int = 60000) -> list[tuple[str, str]]:
    with zipfile.ZipFile(corpus) as z:
        name = next(n for n in z.namelist() if n.endswith("fra.txt"))
        lines = z.read(name).decode("utf-8").splitlines()
    pairs = [tuple(line.split("\t")[:2]) for line in lines if line.count("\t") >= 1]
    return pairs[:limit]


def train(out: Path, corpus: Path, seconds: float = 60.0, d: int = 128, layers: int = 2, vocab: int = 2000, seed: int = 0,
          limit: int = 60000) -> None:
    torch.manual_seed(seed)
    pairs = read_pairs(corpus, limit)
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter([s for p in pairs for s in p]), model_writer=proto, vocab_size=vocab,
                                   model_type="unigram", pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS, minloglevel=2,
                                   hard_vocab_limit=False, num_threads=2)
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    config = {"vocab": sp.get_piece_size(), "d": d, "heads": 4, "layers": layers, "ffn": 2 * d, "max_len": 48}
    model = Seq2Seq(**config)
    data = [(sp.encode(e), sp.encode(f)) for e, f in pairs]
    data = [(e, f) for e, f in data if 0 < len(e) <= config["max_len"] and len(f) < config["max_len"]]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed)
    start, step = time.time(), 0
    model.train()
    while time.time() - start < seconds:
        batch = [data[i] for i in torch.randint(0, len(data), (64,), generator=g).tolist()]
        src = nn.utils.rnn.pad_sequence([torch.tensor(e) for e, _ in batch], batch_first=True, padding_value=PAD)
        tgt = nn.utils.rnn.pad_sequence([torch.tensor([BOS, *f, EOS]) for _, f in batch], batch_first=True, padding_value=PAD)
        logits = model(src, torch.tensor([len(e) for e, _ in batch]), tgt[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "model.pt")
    (out / "config.json").write_text(json.dumps(config))
    (out / "tokenizer.model").write_bytes(proto.getvalue())
    print(f"{step} steps in {time.time() - start:.0f} s, last loss {loss.item():.2f}; wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/nn-transformer"))
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("TK_DATA", "../shared/data/fra-eng.zip")))
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pairs", type=int, default=60000, help="the first N sentence pairs of the corpus")
    args = parser.parse_args()
    train(args.out, args.data, args.seconds, limit=args.pairs)
