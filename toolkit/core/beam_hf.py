"""Beam search by Hugging Face's rule (transformers' `generate(num_beams=...)`), for models imported from it.

tk's own rule (toolkit.core.decoding.beam_search) keeps a sentence's first `beam` finished hypotheses. Hugging Face
ranks differently, and a model imported from it should translate as `generate` does, so that `tk verify` can prove
beam parity token for token. Its rule, step by step (transformers 4.50+ `_beam_search`, unchanged in 5.x):

- the 2 x beam best continuations of all live hypotheses (summed log-probabilities) are taken, best first;
- of those, the ones that emit the end token or reach the length limit finish, but only those among the first `beam`
  enter the finished set, ranked by score / n ** alpha (n: tokens generated, the end token included), which keeps the
  `beam` best;
- the `beam` best continuations that did not finish live on (with fewer, finished ones fill in at -1e9, as there);
- a sentence is done once `beam` have finished and its best live score over (tokens so far) ** alpha cannot beat
  the worst finished one (early_stopping False), as soon as `beam` have finished (True), or at its limit ("never",
  where the live score is taken over the longest length when alpha > 0). After that nothing enters its set.

A forced end token (forced_eos_token_id) makes the last step of the limit emit the end token with probability one.
The backend's top 2 x beam per row suffice: a sentence's 2 x beam best continuations are among them. Numpy only.
"""

from __future__ import annotations

import numpy as np

from toolkit.core.declaration import DecodingRules
from toolkit.core.decoding import STOPPED, Hypothesis, StepBackend, loop_cut, pad_batch

DEAD = -1.0e9  # the score Hugging Face adds to a continuation that may not go on


class _Sentence:
    """One sentence's live and finished hypotheses."""

    def __init__(self, steps: int):
        self.steps = steps  # decoder steps it may take (its limit, plus the forced end token's step)
        self.live_tokens: list[list[int]] = [[]]
        self.live_scores = np.zeros(1)
        # Finished: (ranking score, tokens, summed log-probability, why); at most `beam`, best first.
        self.finished: list[tuple[float, list[int], float, int]] = []
        self.settled = False  # nothing more may enter the finished set


# Over 60 lines: a step is one pass of Hugging Face's rule over every sentence's candidates; split, each piece would
# take and return the same per-sentence lists.
def beam_search_hf(backend: StepBackend, src: list[list[int]], max_len: int, beam: int, alpha: float, n_best: int,
                   limits: np.ndarray | None, loop_guard: bool, rules: DecodingRules) -> list[list[Hypothesis]]:
    ids, lens = pad_batch(src, rules.pad)
    state = backend.encode(ids, lens)
    n = len(src)
    limits = np.full(n, max_len, dtype=np.int64) if limits is None else np.minimum(limits, max_len)
    forced = int(rules.forced_end)
    sentences = [_Sentence(int(limit) + forced) for limit in limits]
    active = list(range(n))  # in state row order; each owns len(live_tokens) rows
    width = 2 * beam
    token = np.full(n, rules.start, dtype=np.int64)
    step = 0
    while active:
        values, indices, state = backend.step_top_k(token, state, width)
        keep_rows: list[int] = []
        next_tokens: list[int] = []
        still: list[int] = []
        row = 0
        for s in active:
            sent = sentences[s]
            k = len(sent.live_tokens)
            rows = slice(row, row + k)
            row += k
            last = step + 1 >= sent.steps
            if forced and last:
                # Every token but the end one is at -inf: each live hypothesis's one continuation is the end token.
                cand = sent.live_scores.copy()
                toks = np.full(k, rules.end, dtype=np.int64)
                parents = np.arange(k)
            else:
                cand = (sent.live_scores[:, None] + values[rows]).reshape(-1)
                toks = indices[rows].reshape(-1)
                parents = np.repeat(np.arange(k), values.shape[1])
            # Best first; equal scores in the order of the flat (parent, token) index, as torch.topk on the flat row.
            order = np.lexsort((toks, parents, -cand))[:width]
            cand, toks, parents = cand[order], toks[order], parents[order]
            seqs = [sent.live_tokens[p] + [int(t)] for p, t in zip(parents, toks)]
            hits = (toks == rules.end) | last
            cuts = np.full(len(seqs), -1)
            if loop_guard:
                for i, seq in enumerate(seqs):
                    if not hits[i]:
                        cuts[i] = loop_cut(np.array([seq]))[0]
                hits = hits | (cuts >= 0)
            finite = np.isfinite(cand)
            # The finished set: the first `beam` candidates that finished, by score over length ** alpha.
            if not sent.settled and not (rules.early_stopping is True and len(sent.finished) >= beam):
                for i in np.flatnonzero(hits[:beam] & finite[:beam]):
                    ended = bool(toks[i] == rules.end)
                    tokens = seqs[i][:-1] if ended else seqs[i][: cuts[i]] if cuts[i] >= 0 else seqs[i]
                    why = 0 if ended else 2 if cuts[i] >= 0 else 1
                    sent.finished.append((float(cand[i]) / (step + 1) ** alpha, tokens, float(cand[i]), why))
                sent.finished.sort(key=lambda f: -f[0])  # stable: earlier entries first among equals, as there
                del sent.finished[beam:]
            # Live on: the `beam` best that did not finish (finished ones fill in at DEAD, as there).
            going = np.argsort(-(cand + np.where(hits, DEAD, 0.0)), kind="stable")[:beam]
            sent.live_scores = cand[going] + np.where(hits[going], DEAD, 0.0)
            sent.live_tokens = [seqs[i] for i in going]
            if len(sent.finished) >= beam and not sent.settled:
                length = sent.steps if rules.early_stopping == "never" and alpha > 0 else step + 1
                sent.settled = sent.live_scores[0] / length ** alpha <= sent.finished[-1][0]
            done = (last or sent.settled or (rules.early_stopping is True and len(sent.finished) >= beam)
                    or not np.isfinite(sent.live_scores).any())
            if not done:
                still.append(s)
                keep_rows.extend(rows.start + int(parents[i]) for i in going)
                next_tokens.extend(int(toks[i]) for i in going)
        active = still
        if active:
            state = backend.select(state, np.array(keep_rows, dtype=np.int64))
            token = np.array(next_tokens, dtype=np.int64)
        step += 1
    return [[Hypothesis(tokens, score, STOPPED[why]) for _, tokens, score, why in sent.finished[:n_best]] or [Hypothesis([], 0.0, "length")]
            for sent in sentences]
