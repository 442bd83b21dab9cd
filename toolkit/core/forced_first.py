"""A forced first output token (Hugging Face's forced_bos_token_id: a multilingual model's target language) over any
step backend: the decoding loops stay as they are, and the first step's log-probabilities are generate's after its
ForcedBOSTokenLogitsProcessor, 0 for the forced token and -inf for every other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class _State:
    inner: Any
    first: bool  # the next step is the first: its output is forced


class ForcedFirst:
    """A StepBackend (toolkit.core.decoding, which imports this module) that forces the first step's token."""

    def __init__(self, inner: Any, token: int):
        self.inner, self.token = inner, token

    def encode(self, src: np.ndarray, src_len: np.ndarray) -> _State:
        return _State(self.inner.encode(src, src_len), True)

    def step(self, token: np.ndarray, state: _State) -> tuple[np.ndarray, _State]:
        log_probs, inner = self.inner.step(token, state.inner)
        if state.first:
            forced = np.full_like(log_probs, -np.inf)
            forced[:, self.token] = 0.0
            log_probs = forced
        return log_probs, _State(inner, False)

    def step_top_k(self, token: np.ndarray, state: _State, k: int) -> tuple[np.ndarray, np.ndarray, _State]:
        if state.first:  # ranked here: the backend's own ranking would rank the model's choice, not the forced one
            log_probs, state = self.step(token, state)
            order = np.argsort(-log_probs, axis=1, kind="stable")[:, :k]
            return np.take_along_axis(log_probs, order, axis=1), order.astype(np.int64), state
        values, indices, inner = self.inner.step_top_k(token, state.inner, k)
        return values, indices, _State(inner, False)

    def select(self, state: _State, rows: np.ndarray) -> _State:
        return _State(self.inner.select(state.inner, rows), state.first)

    def reorder_beams(self, state: _State, rows: np.ndarray) -> _State:
        return _State(self.inner.reorder_beams(state.inner, rows), state.first)
