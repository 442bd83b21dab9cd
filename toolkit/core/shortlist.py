"""A lexical shortlist: for each source token, the target tokens a translation of it is likely to use, so that a
decoder step scores those few instead of the whole vocabulary (Marian's lexical shortlist, CTranslate2's vmap).

Each sentence decodes over its OWN candidates: the tokens listed for its source tokens plus the always-allowed ones
(the end token, a forced first token, the most frequent target tokens). A batch gathers the output weights of the
union of its sentences' candidates once, and each row masks out what is not its own sentence's: a sentence gets the
same candidates alone or in any batch (a shortlist that let a row see the union changed outputs with the batch they
were in, mozilla/translations #977). Numpy only: the deploy path reads it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.core.errors import UsageError

FILE = "shortlist.npz"  # in the model directory, recorded in manifest.json ("shortlist")
# Candidates kept per source token. Marian's usual `--shortlist lex.s2t 100 100` keeps 100; on tk's shipped model 100
# keeps 97.3% of greedy translations identical and 400 keeps 99.7%, which tk verify's 99.5% guard accepts.
PER_TOKEN = 400
FREQUENT = 100  # most frequent target tokens always allowed
ITERATIONS = 5  # of IBM model 1's EM (fast_align runs 5)


@dataclass(frozen=True)
class Shortlist:
    """Candidates per source token as compressed rows: those of token t are targets[offsets[t]:offsets[t + 1]]."""

    offsets: np.ndarray  # (source vocabulary + 1,) int64
    targets: np.ndarray  # int32
    always: np.ndarray  # int32, sorted: allowed for every sentence

    def candidates(self, src: np.ndarray, src_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For a padded batch (rows, len) and its lengths: the union of the rows' candidates (sorted ids) and which of
        them each row may emit ((rows, union) bool). A row's own set depends on its own tokens alone."""
        rows, width = src.shape
        vocab = len(self.offsets) - 1
        mine = (np.arange(width)[None, :] < np.asarray(src_len)[:, None]) & (src >= 0) & (src < vocab)
        row_of, token = np.nonzero(mine)[0], src[mine]
        counts = self.offsets[token + 1] - self.offsets[token]
        # Each (row, listed token) pair, its list's entries laid out one after another.
        at = np.repeat(self.offsets[token] - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        top = max(vocab, int(self.always.max(initial=-1)) + 1, int(self.targets.max(initial=-1)) + 1)
        allowed = np.zeros((rows, top), dtype=bool)
        allowed[np.repeat(row_of, counts), self.targets[at]] = True
        allowed[:, self.always] = True
        union = np.flatnonzero(allowed.any(0))
        return union.astype(np.int64), allowed[:, union]

    def to_bytes(self) -> bytes:
        out = io.BytesIO()
        np.savez(out, offsets=self.offsets, targets=self.targets, always=self.always)
        return out.getvalue()

    @property
    def sizes(self) -> dict:
        """What manifest.json records of it."""
        return {"source_tokens": int(np.count_nonzero(np.diff(self.offsets))), "entries": int(len(self.targets)),
                "always": int(len(self.always))}


def load(path: Path) -> Shortlist:
    """The shortlist stored at `path`; a file that is not one is a one-line error."""
    try:
        with np.load(path, allow_pickle=False) as data:
            table = Shortlist(data["offsets"].astype(np.int64), data["targets"].astype(np.int32), data["always"].astype(np.int32))
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"{path} is not a tk shortlist ({e}); make it again with `tk export DIR --shortlist FILE`") from None
    if table.offsets.ndim != 1 or len(table.offsets) < 2 or table.offsets[-1] != len(table.targets) or (np.diff(table.offsets) < 0).any():
        raise UsageError(f"{path} is not a tk shortlist (its offsets do not index its targets); make it again")
    return table


def translation_probabilities(src: list[list[int]], tgt: list[list[int]], vocab: int,
                              iterations: int = ITERATIONS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """p(t | s) of IBM model 1 (with a NULL source token), as fast_align's lexical table that Marian's extract_lex
    reads: EM over every (source position, target position) pair of each sentence. Returns (s, t, p) of the pairs
    that co-occur. Unlike a co-occurrence count, it gives a target token to the source token that explains it,
    not to the frequent source tokens it happens to sit beside."""
    null = vocab
    s_tok = [np.append(np.asarray(s, dtype=np.int64), null) for s in src]
    t_tok = [np.asarray(t, dtype=np.int64) for t in tgt]
    es = np.concatenate([np.repeat(s, len(t)) for s, t in zip(s_tok, t_tok)])
    et = np.concatenate([np.tile(t, len(s)) for s, t in zip(s_tok, t_tok)])
    first = np.cumsum([0] + [len(t) for t in t_tok[:-1]])  # each target position's row in the E-step's sums
    slot = np.concatenate([np.tile(np.arange(len(t)) + f, len(s)) for s, t, f in zip(s_tok, t_tok, first)])
    pairs, inverse = np.unique(es * (vocab + 1) + et, return_inverse=True)
    p_s = pairs // (vocab + 1)
    prob = np.ones(len(pairs))
    for _ in range(iterations):
        p = prob[inverse]
        posterior = p / np.bincount(slot, weights=p)[slot]
        counts = np.bincount(inverse, weights=posterior, minlength=len(pairs))
        prob = counts / np.bincount(p_s, weights=counts, minlength=vocab + 1)[p_s]
    real = p_s < null
    return p_s[real], pairs[real] % (vocab + 1), prob[real]


def estimate(src: list[list[int]], tgt: list[list[int]], per_token: int = PER_TOKEN,
             frequent: int = FREQUENT, always: tuple[int, ...] = ()) -> Shortlist:
    """Candidates from token-id sentence pairs: for each source token the `per_token` target tokens of highest
    p(t | s) (translation_probabilities), the `frequent` most frequent target tokens and `always` for every sentence,
    as Marian's `--shortlist lex.s2t FIRST BEST` keeps its most frequent and its best-by-probability."""
    if len(src) != len(tgt) or not src or not any(len(t) for t in tgt):
        raise UsageError("a shortlist needs sentence pairs; the file gave none")
    vocab = 1 + max(max(s, default=-1) for s in src + tgt)  # ids past it are never looked up
    s_of, t_of, prob = translation_probabilities(src, tgt, vocab)
    order = np.lexsort((t_of, -prob, s_of))  # by source token, best first (ties by id: the table is reproducible)
    s_of, t_of = s_of[order], t_of[order]
    starts = np.searchsorted(s_of, np.arange(vocab + 1))
    keep = np.arange(len(s_of)) - starts[s_of] < per_token
    s_kept, t_kept = s_of[keep], t_of[keep]
    offsets = np.searchsorted(s_kept, np.arange(vocab + 1)).astype(np.int64)
    c_tgt = np.bincount(np.concatenate([np.asarray(t, dtype=np.int64) for t in tgt]), minlength=vocab)[:vocab]
    top = np.argsort(-c_tgt, kind="stable")[:frequent]
    fixed = np.unique(np.concatenate([top[c_tgt[top] > 0], np.asarray(always, dtype=np.int64)]))
    return Shortlist(offsets, t_kept.astype(np.int32), fixed.astype(np.int32))


def checked_as(variant: str) -> str:
    """The variant whose `tk verify --shortlist` verdict holds for `variant`: the optimized graphs compute fp32's output."""
    return "fp32" if variant == "optimized" else variant


def unguarded_note(directory: str | Path, checked: dict | None, variant: str) -> str | None:
    """What to tell a user decoding `directory` with its shortlist on `variant` (`checked`: the shortlist record's
    verdicts, ShortlistRecord.checked): that `tk verify --shortlist` refused it, or never checked it there; None once it
    was accepted. The shortlist is used either way, as an int8 variant is; the note says how far to trust it."""
    key = checked_as(variant)
    verdict = (checked or {}).get(key)
    if verdict is None:
        return (f"the shortlist of {directory} has not been checked on {key}: its translations may differ from the model's own; "
                f"run tk verify {directory} --shortlist{'' if key == 'fp32' else f' --variant {key}'} --record")
    if not verdict.get("accepted"):
        return (f"the shortlist of {directory} was refused by tk verify --shortlist on {key} ({verdict.get('identical', 0):.1%} of "
                f"{verdict.get('sentences', 0):,} translations identical): export another (a larger file, a larger --per-token) "
                "or translate without --shortlist")
    return None
