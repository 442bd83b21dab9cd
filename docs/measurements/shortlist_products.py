"""What a shortlist cuts of a `tk bench --scale` row's work, counted in the weight products' multiply-adds.

A shortlist cuts the output layer from the vocabulary to a batch's candidates: the encoder (and the decoder's
cross-attention keys and values, made once per sentence) and the decoder's other products stay. This counts, for the
bench's own work model, sources, batches and shortlist, the weight products' multiply-adds with and without it, and
prints their ratio: what the row would gain if its time were its weight products' alone, at one rate. It is no
ceiling: a shortlist also cuts the work over the whole vocabulary besides the product (the log-softmax, the additions
over it, the ranking, the log-probabilities copied out), more of a step in int8, whose products are cheaper; and a
product over weights fed per batch runs slower than over the graph's own. Run it on the model `tk bench --scale SHAPE`
prepared:

    python docs/measurements/shortlist_products.py [--shape opus-mt] [--sources ../shared/data/tatoeba-test-eng-fra.txt]

With --sources: the real-sentence rows (128 sentences in batches of 32 greedy, 32 in batches of 16 at beam 4), else the
bench's random rows (24 random ids and the end token), each decoding exactly --tokens tokens.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    from toolkit.core import shortlist
    from toolkit.core.batching import length_sorted_batches
    from toolkit.core.decoding import pad_batch, padding_groups
    from toolkit.core.load_cache import default_directory

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="opus-mt", help="the bench's shape whose work model to count (opus-mt, nllb-600m)")
    p.add_argument("--work", type=Path, default=None, help="the bench's --work directory [default: the user cache's]")
    p.add_argument("--sources", type=Path, default=None, help="real sentences, as tk bench --scale --sources feeds them")
    p.add_argument("--tokens", type=int, default=32)
    a = p.parse_args()
    work = a.work or default_directory() / "bench-scale" / a.shape
    c = json.loads((work / "hf" / "config.json").read_text(encoding="utf-8"))
    d, vocab = c["d_model"], c.get("decoder_vocab_size") or c["vocab_size"]
    # Weight products per encoder position: self-attention's four, the feed-forward's two, and each decoder layer's
    # cross-attention keys and values of that position (made once). Per decoder row and step: self-attention's four,
    # cross-attention's query and output, the feed-forward's two; then the output layer's d x vocab (or x candidates).
    per_position = c["encoder_layers"] * (4 * d * d + 2 * d * c["encoder_ffn_dim"]) + c["decoder_layers"] * 2 * d * d
    per_row = c["decoder_layers"] * (6 * d * d + 2 * d * c["decoder_ffn_dim"])
    table = shortlist.load(work / "tk" / shortlist.FILE)
    if a.sources:
        from toolkit.bench.scale import real_sources

        src = real_sources(a.sources, 128, work / "tk")
        rows = [("128 real sentences, batches of 32, greedy", src, 32, 1), ("32 real sentences, batches of 16, beam 4", src[:32], 16, 4)]
    else:
        from toolkit.bench.scale import sources

        src = sources(128, 24, vocab, c["eos_token_id"], c["pad_token_id"])
        rows = [("128 sentences, batches of 32, greedy", src, 32, 1), ("32 sentences, batches of 16, beam 4", src[:32], 16, 4)]
    print(f"{a.shape}: d_model {d}, vocabulary {vocab:,}; {per_position / 1e6:.1f}M multiply-adds per encoder position, "
          f"{per_row / 1e6:.1f}M per decoder row and step besides the output layer's {d * vocab / 1e6:.1f}M")
    for name, sentences, size, beam in rows:
        encoder = plain = listed = 0
        unions = []
        for batch in length_sorted_batches([len(s) for s in sentences], size, None):
            ids, lengths = pad_batch([sentences[i] for i in batch])
            encoder += sum(int(lengths[g].max()) * len(g) for g in padding_groups(lengths)) * per_position
            union, _ = table.candidates(ids, lengths)
            unions.append(len(union))
            steps = a.tokens * len(batch) * beam  # every row decodes exactly --tokens tokens
            plain += steps * (per_row + d * vocab)
            listed += steps * (per_row + d * len(union))
        print(f"- {name}: {encoder / 1e9:.1f}G in the encoder, {plain / 1e9:.1f}G decoding without the shortlist and "
              f"{listed / 1e9:.1f}G with it (a batch's union {min(unions):,} to {max(unions):,} tokens); "
              f"the products' ratio {(encoder + plain) / (encoder + listed):.2f}x")


if __name__ == "__main__":
    main()
