"""`tk verify` of a model imported from Hugging Face: tk's translations against transformers' own `generate`.

The other checks hold the graphs to tk's PyTorch view of the model (MarianForTk, M2M100ForTk: built from the same
modules). This one closes the loop with the implementation users know: transformers' own generate, greedy and with
the generation config's beam width (4 unless it says more), decoding the same sentences by the same rules (its
length penalty and early stopping, its maximum length, the forced end token, the forbidden tokens), must give the
same tokens as tk's decoding loop on every runtime session verified.
"""

from __future__ import annotations

import numpy as np
import torch

from toolkit.core.decoding import pad_batch, translate_ids
from toolkit.core.errors import first_line
from toolkit.core.manifest import Manifest
from toolkit.core.variants import CATALOGUE
from toolkit.verify.report import Report, Row


def generate_tokens(model, src_ids: list[list[int]], m: Manifest, beam: int, out_len: int | None = None) -> list[list[int]]:
    """transformers' generate on the reference model, as each sentence's output tokens (start and end token dropped),
    at most `out_len` of them (None: the model's limit)."""
    rules = m.rules()
    out_len = out_len or m.max_output_len
    ids, lens = pad_batch(src_ids, rules.pad)
    mask = np.arange(ids.shape[1])[None, :] < lens[:, None]
    max_length = out_len + 1 + int(rules.forced_end)  # generate's counts the start token
    with torch.inference_mode():
        out = model.hf.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                                num_beams=beam, do_sample=False, max_length=max_length, length_penalty=rules.alpha,
                                early_stopping=rules.early_stopping, num_return_sequences=1,
                                # the directory's own rule, whatever the rebuilt config says (None: no forced end token)
                                forced_eos_token_id=rules.end if rules.forced_end else None,
                                # a multilingual model's target language, forced first as tk forces it
                                **({"forced_bos_token_id": rules.forced_first} if rules.forced_first is not None else {}))
    return [generated_tokens(row, rules.end) for row in out.tolist()]


def generated_tokens(row: list[int], end: int) -> list[int]:
    """One row of generate's output as the sentence's tokens: the decoder's start token dropped, cut before the first end
    token. generate pads a row only after its end token, so a row without one is all tokens: a pad id inside it is a
    token the model chose (T5's pad is its start token too), and dropping it made a tk translation that emitted it look
    different from generate's."""
    row = row[1:]
    return row[: row.index(end)] if end in row else row


def generate_parity(report: Report, m: Manifest, model, backends: dict, src_ids: list[list[int]], echo,
                    out_len: int | None = None, beams: tuple[int, ...] | None = None) -> None:
    """A row per (beam, session): how many translations are token-identical to generate's, both decoding at most
    `out_len` tokens (None: the model's limit), at `beams` (None: greedy and the generation config's beam width)."""
    if not src_ids:
        return
    out_len = out_len or m.max_output_len
    rules = m.rules()
    options = (m.training.options if m.training else None) or {}
    beams = list(beams or (1, max(4, int(options.get("num_beams", 4)))))
    echo(f"comparing with transformers' generate: {len(src_ids)} sentences, " + " and ".join(
        "greedy" if b == 1 else f"beam {b}" for b in beams))
    for beam in beams:
        try:
            reference = generate_tokens(model, src_ids, m, beam, out_len)
        except (RuntimeError, ValueError, IndexError, TypeError) as e:
            # transformers' own failure (5.17's beam search, say, reshapes by vocab_size on a Marian model of two
            # vocabularies): the reference does not exist, so nothing was compared, and the report says so and fails.
            import transformers

            why = f"{type(e).__name__}: {first_line(e, 120)}" if str(e).strip() else type(e).__name__
            report.rows.append(Row("generate", "encoder+decoder", "-", "-", f"{len(src_ids)} sentences",
                                   "greedy tokens" if beam == 1 else f"beam {beam} tokens", outside=1.0, ok=False,
                                   detail=f"not compared: transformers {transformers.__version__}'s generate(num_beams={beam}) "
                                          f"failed on this model ({why}); verify under another transformers release"))
            continue
        for (provider, variant), backend in backends.items():
            hyps = translate_ids(backend(), src_ids, out_len, beam, rules.alpha, 1, None, False, rules)
            got = [h[0].tokens for h in hyps]
            same = sum(a == b for a, b in zip(reference, got))
            first = next((i for i, (a, b) in enumerate(zip(reference, got)) if a != b), None)
            detail = f"{same}/{len(src_ids)} identical to generate(num_beams={beam})"
            if first is not None:
                detail += f"; sentence {first}: generate {reference[first][:8]}..., tk {got[first][:8]}..."
            report.rows.append(Row("generate", "encoder+decoder", variant, provider, f"{len(src_ids)} sentences",
                                   "greedy tokens" if beam == 1 else f"beam {beam} tokens", outside=1 - same / len(src_ids),
                                   ok=same == len(src_ids) or not CATALOGUE[variant].exact_translation, detail=detail))
