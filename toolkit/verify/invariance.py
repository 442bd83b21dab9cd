"""Batch invariance: a sentence translates the same alone and in a padded batch.

Parity with PyTorch cannot catch a model that lets padding into its attention (a source mask left out): the graphs
and PyTorch leak the same way, and every comparison agrees. Translating each sentence alone and all of them in one
padded batch, on the graphs the user will deploy, shows it: the tokens must be identical, and the first step's
log-probabilities equal within the tolerance (a leak too small to flip a token still shows there).
"""

from __future__ import annotations

import numpy as np

from toolkit.core.declaration import DecodingRules
from toolkit.core.decoding import StepBackend, greedy, pad_batch
from toolkit.verify.report import Row


def first_step(backend: StepBackend, src_ids: list[list[int]], rules: DecodingRules) -> np.ndarray:
    """The first decoder step's log-probabilities of the sentences as one padded batch, (batch, vocab)."""
    src, lens = pad_batch(src_ids, rules.pad)
    state = backend.encode(src, lens)
    log_probs, _ = backend.step(np.full(len(src_ids), rules.start, dtype=np.int64), state)
    return np.asarray(log_probs, np.float64)


def check_batch_invariance(rows: list[Row], backend: StepBackend, src_ids: list[list[int]], max_len: int, variant: str,
                           provider: str, tol: tuple[float, float], rules: DecodingRules) -> bool:
    """Appends one row: the sentences greedy-decoded one at a time against in one padded batch. Whether it passed."""
    src_ids = [s for s in src_ids if s]
    lengths = {len(s) for s in src_ids}
    if len(src_ids) < 2 or len(lengths) < 2:  # no padding in the batch: nothing to show
        return True
    batched = greedy(backend, src_ids, max_len, rules=rules)
    alone = [greedy(backend, [s], max_len, rules=rules)[0] for s in src_ids]
    same = [a.tokens == b.tokens for a, b in zip(alone, batched)]
    together = first_step(backend, src_ids, rules)
    single = np.concatenate([first_step(backend, [s], rules) for s in src_ids])
    finite = np.isfinite(together) & np.isfinite(single)
    # Forbidden tokens are -inf in both: compared by where they are, not subtracted (inf - inf is nan).
    diff = np.abs(np.where(finite, together, 0.0) - np.where(finite, single, 0.0))
    outside = diff > tol[0] + tol[1] * np.abs(np.where(finite, single, 0.0))
    leak = bool(outside.any() or (np.isfinite(together) != np.isfinite(single)).any())
    ok = all(same) and not leak
    detail = f"{sum(same)}/{len(src_ids)} identical alone and in one padded batch"
    if not all(same):
        first = same.index(False)
        detail += f"; sentence {first} ({len(src_ids[first])} tokens, padded to {max(lengths)}) differs"
    if leak:
        row = int(np.argwhere(outside.any(axis=1)).ravel()[0]) if outside.any() else 0
        detail += (f"; first-step log-probabilities differ by up to {float(diff.max()):.2e} (sentence {row}): padding reaches "
                   "the model's attention (is the source mask applied?)")
    rows.append(Row("batch", "encoder+decoder", variant, provider, f"{len(src_ids)} sentences", "greedy tokens",
                    max_abs=float(diff.max(initial=0.0)), outside=1 - sum(same) / len(src_ids), ok=ok, detail=detail))
    return ok
