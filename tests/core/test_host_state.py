"""Beam reorders into reused memory (toolkit.core.decoding.HostState, ReorderMemory): the same hypotheses as fresh
copies, the memory reused step after step and search after search, and never shared between two threads' searches
(concurrent streams decode at once)."""

import threading

import numpy as np
import pytest
from test_beam_search import RandomSteps

from toolkit.core.decoding import HostState, ReorderMemory, beam_search, reorder_rows

AXES = {"src": 0, "cache": 1}  # the cache's batch axis is its second, as a time-major RNN's state


class CachedSteps(RandomSteps):
    """RandomSteps whose prefix lives in a host cache (positions, rows) that each step extends into a new array, as a
    decoder's cache output; beam steps reorder it into the search's memory."""

    def __init__(self, vocab: int, seed: int):
        super().__init__(vocab, seed)
        self.memory = ReorderMemory()

    def encode(self, src, src_len):
        return HostState({"src": src[:, 0].copy(), "cache": np.zeros((0, len(src)), dtype=np.int64)}, self.memory.here())

    def step(self, token, state):
        log_probs, inner = super().step(token, {"src": state["src"], "prefix": state["cache"].T})
        return log_probs, state.carried({"src": state["src"], "cache": np.ascontiguousarray(inner["prefix"].T)})

    def select(self, state, rows):  # into the memory too, as OrtBackend's: "src" is selected again and again
        return reorder_rows(state, rows, AXES)

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


def _search(memory: dict, sign: float, steps: range, rows: np.ndarray) -> list[np.ndarray]:
    """A search's reorders of a cache that grows by a position a step; each checked against a fresh take."""
    state, seen = HostState({"cache": np.zeros((1, 6))}, memory), []
    for step in steps:
        fresh = sign * np.arange(step * 6, dtype=float).reshape(step, 6)
        state = reorder_rows(state.carried({"cache": fresh}), rows, {"cache": 1})
        assert np.array_equal(state["cache"], fresh[:, rows])
        seen.append(state["cache"])
    return seen


def test_the_memory_is_reused_from_step_to_step_and_search_to_search():
    memory = ReorderMemory()
    first = _search(memory.here(), 1.0, range(2, 12), np.array([1, 1, 0, 3, 2, 2]))
    second = _search(memory.here(), 2.0, range(2, 6), np.array([0, 0, 5, 5, 1, 2]))
    # After the first few steps every reorder writes where the previous one did (no new memory each step), and the
    # next search starts in the memory the last one left.
    assert all(np.may_share_memory(x, y) for x, y in zip(first[1:], first[2:]))
    assert all(np.may_share_memory(first[-1], y) for y in second)


def test_searches_in_two_threads_never_share_memory():
    memory, seen, failed = ReorderMemory(), {}, []
    barrier = threading.Barrier(2)

    def run(sign: float) -> None:
        try:
            barrier.wait(10)
            seen[sign] = _search(memory.here(), sign, range(2, 40), np.array([1, 1, 0, 3, 2, 2]))
        except Exception as e:  # noqa: BLE001 (reported by the test below)
            failed.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in (1.0, -1.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failed, failed
    assert not any(np.may_share_memory(a, b) for a in seen[1.0] for b in seen[-1.0])


def test_a_state_reordered_again_without_a_step_between_is_not_copied_onto_itself():
    state = HostState({"cache": np.arange(24, dtype=float).reshape(4, 6)}, {})
    rows = np.array([5, 4, 3, 2, 1, 0])
    once = reorder_rows(state, rows, {"cache": 1})
    want = once["cache"][:, rows].copy()
    twice = reorder_rows(once, rows, {"cache": 1})
    assert np.array_equal(twice["cache"], want)
    # A tensor no step replaces (the encoder's outputs) is selected from the memory into the memory: into the other of
    # its two, or numpy would first copy the whole source aside; the third goes back to the first.
    assert not np.may_share_memory(twice["cache"], once["cache"])
    want = twice["cache"][:, rows].copy()
    thrice = reorder_rows(twice, rows, {"cache": 1})
    assert np.array_equal(thrice["cache"], want) and np.may_share_memory(thrice["cache"], once["cache"])
    with pytest.raises(IndexError):
        reorder_rows(state, np.array([0, 6]), {"cache": 1})
