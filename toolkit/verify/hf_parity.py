"""`tk verify` of a model imported from Hugging Face: tk's translations against transformers' own `generate`.

The other checks hold the graphs to tk's PyTorch view of the model (MarianForTk, built from the same modules).
This one closes the loop with the implementation users know: transformers' MarianMTModel.generate, greedy and with
the generation config's beam width (4 unless it says more), decoding the same sentences by the same rules (its
length penalty and early stopping, its maximum length, the forced end token, the forbidden tokens), must give the
same tokens as tk's decoding loop on every runtime session verified.
"""

from __future__ import annotations

import numpy as np
import torch

from toolkit.core.decoding import pad_batch, translate_ids
from toolkit.core.manifest import Manifest
from toolkit.core.variants import CATALOGUE
from toolkit.verify.report import Report, Row


def generate_tokens(model, src_ids: list[list[int]], m: Manifest, beam: int) -> list[list[int]]:
    """transformers' generate on the reference model, as each sentence's output tokens (start and end token dropped)."""
    rules = m.rules()
    ids, lens = pad_batch(src_ids, rules.pad)
    mask = np.arange(ids.shape[1])[None, :] < lens[:, None]
    max_length = m.max_output_len + 1 + int(rules.forced_end)  # generate's counts the start token
    with torch.inference_mode():
        out = model.hf.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                                num_beams=beam, do_sample=False, max_length=max_length, length_penalty=rules.alpha,
                                early_stopping=rules.early_stopping, num_return_sequences=1)
    tokens = []
    for row in out.tolist():
        row = row[1:]
        tokens.append(row[: row.index(rules.end)] if rules.end in row else [t for t in row if t != rules.pad])
    return tokens


def generate_parity(report: Report, m: Manifest, model, backends: dict, src_ids: list[list[int]], echo) -> None:
    """A row per (beam, session): how many translations are token-identical to generate's."""
    if not src_ids:
        return
    rules = m.rules()
    options = (m.training.options if m.training else None) or {}
    beams = [1, max(4, int(options.get("num_beams", 4)))]
    echo(f"comparing with transformers' generate: {len(src_ids)} sentences, greedy and beam {beams[1]}")
    for beam in beams:
        reference = generate_tokens(model, src_ids, m, beam)
        for (provider, variant), backend in backends.items():
            hyps = translate_ids(backend(), src_ids, m.max_output_len, beam, rules.alpha, 1, None, False, rules)
            got = [h[0].tokens for h in hyps]
            same = sum(a == b for a, b in zip(reference, got))
            first = next((i for i, (a, b) in enumerate(zip(reference, got)) if a != b), None)
            detail = f"{same}/{len(src_ids)} identical to generate(num_beams={beam})"
            if first is not None:
                detail += f"; sentence {first}: generate {reference[first][:8]}..., tk {got[first][:8]}..."
            report.rows.append(Row("generate", "encoder+decoder", variant, provider, f"{len(src_ids)} sentences",
                                   "greedy tokens" if beam == 1 else f"beam {beam} tokens", outside=1 - same / len(src_ids),
                                   ok=same == len(src_ids) or not CATALOGUE[variant].exact_translation, detail=detail))
