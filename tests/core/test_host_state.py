"""Beam reorders into a search's own memory (toolkit.core.decoding.HostState): the same hypotheses as fresh copies, the
memory reused step after step, and never shared between two searches (a server decodes several at once)."""

import numpy as np
import pytest
from test_beam_search import RandomSteps

from toolkit.core.decoding import HostState, beam_search, reorder_rows, take_rows

AXES = {"src": 0, "cache": 1}  # the cache's batch axis is its second, as a time-major RNN's state


class CachedSteps(RandomSteps):
    """RandomSteps whose prefix lives in a host cache (positions, rows) that each step extends into a new array, as a
    decoder's cache output; beam steps reorder it into the search's memory."""

    def encode(self, src, src_len):
        return HostState({"src": src[:, 0].copy(), "cache": np.zeros((0, len(src)), dtype=np.int64)})

    def step(self, token, state):
        log_probs, inner = super().step(token, {"src": state["src"], "prefix": state["cache"].T})
        return log_probs, state.carried({"src": state["src"], "cache": np.ascontiguousarray(inner["prefix"].T)})

    def select(self, state, rows):
        return take_rows(state, rows, AXES)

    def reorder_beams(self, state, rows):
        self.reordered = getattr(self, "reordered", 0) + 1
        return reorder_rows(state, rows, AXES, keep=frozenset({"src"}))


@pytest.mark.parametrize("seed", range(6))
def test_reordering_into_the_search_s_memory_finds_the_same_hypotheses(seed):
    rng = np.random.default_rng(seed)
    src = [[int(t)] + [5] * int(rng.integers(1, 4)) for t in rng.integers(10, 60, 7)]
    cached = CachedSteps(40, seed)
    for beam in (2, 4):
        want = beam_search(RandomSteps(40, seed), src, 14, beam=beam, n_best=beam)
        assert beam_search(cached, src, 14, beam=beam, n_best=beam) == want
    assert cached.reordered > 10


def test_the_memory_is_reused_and_two_searches_never_share_it():
    rows = np.array([1, 1, 0, 3, 2, 2])
    a = HostState({"cache": np.zeros((1, 6))})
    b = HostState({"cache": np.zeros((1, 6))})
    seen_a, seen_b = [], []
    for step in range(2, 12):  # two searches, interleaved, each growing its cache by a position a step
        fresh_a = np.arange(step * 6, dtype=float).reshape(step, 6)
        fresh_b = -np.arange(step * 6, dtype=float).reshape(step, 6)
        a = reorder_rows(a.carried({"cache": fresh_a}), rows, {"cache": 1})
        b = reorder_rows(b.carried({"cache": fresh_b}), rows, {"cache": 1})
        assert np.array_equal(a["cache"], fresh_a[:, rows]) and np.array_equal(b["cache"], fresh_b[:, rows])
        assert not np.may_share_memory(a["cache"], b["cache"])
        seen_a.append(a["cache"])
        seen_b.append(b["cache"])
    # After the first few steps every reorder writes where the previous one did (no new memory each step).
    assert all(np.may_share_memory(x, y) for x, y in zip(seen_a[1:], seen_a[2:]))


def test_a_state_reordered_again_without_a_step_between_is_not_copied_onto_itself():
    state = HostState({"cache": np.arange(24, dtype=float).reshape(4, 6)})
    rows = np.array([5, 4, 3, 2, 1, 0])
    once = reorder_rows(state, rows, {"cache": 1})
    want = once["cache"][:, rows].copy()
    twice = reorder_rows(once, rows, {"cache": 1})
    assert np.array_equal(twice["cache"], want)
    with pytest.raises(IndexError):
        reorder_rows(state, np.array([0, 6]), {"cache": 1})
