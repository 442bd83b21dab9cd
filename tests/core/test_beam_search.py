"""The array-at-a-time beam search against the one-sentence-at-a-time loop it replaced, on random step functions."""

import numpy as np
import pytest

from toolkit.core.decoding import Hypothesis, StepBackend, beam_search, greedy, loop_cut, pad_batch
from toolkit.core.tokenizer import BOS, EOS


class RandomSteps(StepBackend):
    """Log-probabilities drawn from a seed and the whole prefix, rounded so that ties are common."""

    def __init__(self, vocab: int, seed: int):
        self.vocab, self.seed = vocab, seed

    def encode(self, src, src_len):
        return {"src": src[:, 0].copy(), "prefix": np.zeros((len(src), 0), dtype=np.int64)}

    def step(self, token, state):
        prefix = np.concatenate([state["prefix"], token[:, None]], axis=1)
        rows = []
        for s, p in zip(state["src"], prefix):
            rng = np.random.default_rng([self.seed, int(s), *map(int, p)])
            logits = rng.normal(size=self.vocab) * 2
            logits[EOS] += 0.2 * len(p)  # longer prefixes end more often
            rows.append(np.round(logits - np.logaddexp.reduce(logits), 1))
        return np.array(rows, dtype=np.float32), {"src": state["src"], "prefix": prefix}

    def select(self, state, rows):
        return {k: v[rows] for k, v in state.items()}


class KeepsSentenceState(RandomSteps):
    """Leaves each row's source in place on beam steps that keep every sentence's rows where they are, as
    the runtimes leave the encoder's outputs: a wrong call leaves a row with another sentence's source."""

    def reorder_beams(self, state, rows):
        self.kept = getattr(self, "kept", 0) + 1
        return {"src": state["src"], "prefix": state["prefix"][rows]}


def reference_beam_search(backend, src, max_len, beam, alpha, n_best, limits, loop_guard):
    """tk's beam search before it was vectorised: one sentence at a time, one candidate at a time."""
    ids, lens = pad_batch(src)
    state = backend.encode(ids, lens)
    n = len(src)
    limits = np.full(n, max_len, dtype=np.int64) if limits is None else np.minimum(limits, max_len)
    max_len = int(limits.max())
    live = [[Hypothesis([], 0.0)] for _ in range(n)]
    done = [[] for _ in range(n)]
    active = list(range(n))
    token = np.full(n, BOS, dtype=np.int64)
    for step in range(max_len):
        values, indices, state = backend.step_top_k(token, state, 2 * beam)
        rows, tokens, next_active = [], [], []
        row = 0
        for sent in active:
            k = len(live[sent])
            scores = (np.array([h.score for h in live[sent]])[:, None] + values[row : row + k]).ravel()
            parents = np.repeat(np.arange(k), values.shape[1])
            toks = indices[row : row + k].ravel()
            new_live = []
            for idx in np.lexsort((toks, parents, -scores))[: 2 * beam]:
                parent, tok = int(parents[idx]), int(toks[idx])
                hyp = Hypothesis(live[sent][parent].tokens + ([] if tok == EOS else [tok]), float(scores[idx]))
                cut = loop_cut(np.array([hyp.tokens]))[0] if loop_guard and tok != EOS else -1
                if cut >= 0:
                    hyp.tokens = hyp.tokens[:cut]
                if tok == EOS or step >= limits[sent] - 1 or cut >= 0:
                    done[sent].append(hyp)
                else:
                    new_live.append((row + parent, tok, hyp))
                if len(done[sent]) >= beam or len(new_live) == beam:
                    break
            row += k
            if len(done[sent]) >= beam or not new_live:
                continue
            live[sent] = [h for _, _, h in new_live]
            rows += [r for r, _, _ in new_live]
            tokens += [t for _, t, _ in new_live]
            next_active.append(sent)
        if not next_active:
            break
        active = next_active
        state = backend.select(state, np.array(rows, dtype=np.int64))
        token = np.array(tokens, dtype=np.int64)
    for sent in range(n):
        if not done[sent]:
            done[sent] = live[sent]
    return [sorted(d, key=lambda h: -h.normalized(alpha))[:n_best] for d in done]


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_beam_search_equals_the_per_sentence_loop(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.choice([5, 7, 40]))  # 5 and 7: fewer tokens than 2 * beam candidates per row
    beam = int(rng.integers(1, 6))
    n = int(rng.integers(1, 9))
    src = [[int(t) for t in rng.integers(4, 100, size=rng.integers(1, 6))] for _ in range(n)]
    max_len = int(rng.integers(1, 14))
    limits = rng.integers(1, max_len + 3, size=n) if rng.random() < 0.5 else None
    args = dict(max_len=max_len, beam=beam, alpha=float(rng.choice([0.0, 0.6, 1.0])), n_best=int(rng.integers(1, beam + 1)),
                limits=limits, loop_guard=bool(rng.random() < 0.5))
    backend = KeepsSentenceState(vocab, seed)
    got = beam_search(backend, src, **args)
    want = reference_beam_search(RandomSteps(vocab, seed), src, **args)
    assert [[(h.tokens, h.score) for h in hyps] for hyps in got] == [[(h.tokens, h.score) for h in hyps] for hyps in want]


@pytest.mark.parametrize("seed", range(40))
def test_greedy_equals_a_beam_of_one_while_finished_rows_wait_in_the_state(seed):
    """Greedy leaves finished rows in the decoder state until a third of it is done (decoding.COMPACT_AT);
    a row read from the wrong place would change its sentence's tokens (each step depends on the prefix)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 24))
    src = [[int(t) for t in rng.integers(4, 100, size=rng.integers(1, 6))] for _ in range(n)]
    max_len = int(rng.integers(1, 14))
    limits = rng.integers(1, max_len + 3, size=n) if rng.random() < 0.5 else None
    guard = bool(rng.random() < 0.5)
    selects = []

    class Counted(RandomSteps):
        def select(self, state, rows):
            selects.append(len(rows))
            return super().select(state, rows)

    got = greedy(Counted(40, seed), src, max_len, limits, guard)
    want = beam_search(RandomSteps(40, seed), src, max_len, 1, limits=limits, loop_guard=guard)
    assert [(h.tokens, h.score, h.stopped) for h in got] == [(h[0].tokens, h[0].score, h[0].stopped) for h in want]
    assert all(k < n for k in selects) and len(selects) <= n


@pytest.mark.parametrize("seed", range(60))
def test_one_sentence_decodes_as_it_does_in_a_batch(seed):
    """A single request takes greedy's one-row path (Python numbers instead of arrays): its tokens, score and
    guard must be those the same sentence gets in a batch, with loops, length limits and EOS all common."""
    rng = np.random.default_rng(seed)
    vocab = int(rng.choice([5, 7, 40]))  # small vocabularies loop often
    n = int(rng.integers(2, 9))
    src = [[int(t) for t in rng.integers(4, 100, size=rng.integers(1, 6))] for _ in range(n)]
    max_len = int(rng.integers(1, 30))
    limits = rng.integers(1, max_len + 3, size=n) if rng.random() < 0.7 else None
    guard = bool(rng.random() < 0.7)
    batch = greedy(Loopy(vocab, seed), src, max_len, limits, guard)
    alone = [greedy(Loopy(vocab, seed), [s], max_len, None if limits is None else limits[i : i + 1], guard)[0]
             for i, s in enumerate(src)]
    assert [(h.tokens, h.score, h.stopped) for h in alone] == [(h.tokens, h.score, h.stopped) for h in batch]
    stops.update(h.stopped for h in batch)


stops: set[str] = set()


def test_the_one_sentence_cases_met_every_way_to_stop():
    """Runs after the cases above (pytest keeps file order): they must have met EOS, the length limit and the loop guard."""
    assert stops == {"", "length", "loop"}


class Loopy(RandomSteps):
    """RandomSteps that favours repeating the token from 1 to 4 steps back (by sentence): the loop guard's every rule fires."""

    def step(self, token, state):
        log_probs, new = super().step(token, state)
        for row, (s, p) in enumerate(zip(state["src"], new["prefix"])):
            period = 1 + int(s) % 4
            if len(p) > period:
                log_probs[row, p[-period]] += 8.0
        return log_probs, new


class Scripted(StepBackend):
    """Each sentence (its first source token) has a fixed favourite next token: EOS, a repeated word, or a count."""

    def encode(self, src, src_len):
        return {"kind": src[:, 0].copy(), "t": np.zeros(len(src), dtype=np.int64)}

    def step(self, token, state):
        vocab = 40
        logits = np.full((len(token), vocab), -5.0, dtype=np.float32)
        for row, (kind, t) in enumerate(zip(state["kind"], state["t"])):
            favourite = {1: EOS if t >= 2 else 7, 2: 9, 3: 10 + t % 20}[int(kind)]  # ends / loops / counts on
            logits[row, favourite] = 0.0
        return logits, {"kind": state["kind"], "t": state["t"] + 1}

    def select(self, state, rows):
        return {k: v[rows] for k, v in state.items()}


@pytest.mark.parametrize("beam", [1, 4])
def test_each_hypothesis_says_which_guard_ended_it(beam):
    """EOS: nothing to say; a repeated word: the loop guard; a long non-repeating run: the length limit."""
    from toolkit.core.decoding import translate_ids

    src = [[1, 5], [2, 5], [3, 5]]
    limits = np.array([30, 30, 6])
    guarded = [h[0] for h in translate_ids(Scripted(), src, 30, beam=beam, limits=limits, loop_guard=True)]
    assert [h.stopped for h in guarded] == ["", "loop", "length"]
    assert guarded[0].tokens == [7, 7] and len(guarded[2].tokens) == 6
    unguarded = [h[0] for h in translate_ids(Scripted(), src, 30, beam=beam, limits=None, loop_guard=False)]
    assert [h.stopped for h in unguarded] == ["", "length", "length"]


def test_beam_steps_leave_the_encoders_state_in_place_on_the_shipped_model():
    from pathlib import Path

    from toolkit import Translator
    from toolkit.graphs.native_attention import ROWS
    from toolkit.runtimes.onnxruntime.backend import OrtBackend

    copied: list[set] = []

    class Watching(OrtBackend):
        def reorder_beams(self, state, rows):
            new = super().reorder_beams(state, rows)
            copied.append({n for n in new if new[n] is not state[n]})
            return new

    t = Translator(Path(__file__).resolve().parents[2] / "exported" / "transformer", provider="cpu")
    texts = ["I'm home.", "Where is the station?", "We ate bread at noon with our friends.", "It's raining."]
    want = t.translate(texts, beam=4, streams=1)
    b = t._backend
    t._backend = Watching(b.encoder, b.decoder, b.encoder_spec, b.decoder_spec)
    assert t.translate(texts, beam=4, streams=1) == want
    # Only the self-attention cache, or where the graph takes the cache's rows itself (tk's CPU kernels), only those rows.
    assert copied and all(c == {n for n in c if n.startswith("self_")} or c == {ROWS} for c in copied), copied
    assert all(any(n.startswith("self_") or n == ROWS for n in c) for c in copied)


def exhaustive_scores(backend: StepBackend, src: list[int], max_len: int):
    """The log-probability of every output the search could return: each ends at EOS, or at max_len tokens."""
    vocab = backend.vocab

    def walk(state, token: int, score: float, depth: int):
        log_probs, state = backend.step(np.array([token]), state)
        for t in range(vocab):
            total = score + float(log_probs[0, t])
            if t == EOS or depth + 1 == max_len:
                yield total
            else:
                yield from walk(state, t, total, depth + 1)

    yield from walk(backend.encode(*pad_batch([src])), BOS, 0.0, 0)


@pytest.mark.parametrize("seed", range(12))
def test_a_beam_wide_enough_to_keep_every_prefix_finds_the_most_likely_output(seed):
    """Beam search's own guarantee, independent of any model or CPU: pruning nothing, it is exact."""
    vocab, max_len = 5, 3
    backend = RandomSteps(vocab, seed)
    src = [[10 + seed, 4]]
    best = max(exhaustive_scores(backend, src[0], max_len))
    got = beam_search(backend, src, max_len=max_len, beam=vocab ** max_len, alpha=0.0)[0][0]
    assert got.score == pytest.approx(best, abs=1e-4)


@pytest.mark.parametrize("seed", range(40))
def test_hugging_face_beam_steps_leave_each_sentences_state_in_place(seed):
    """Hugging Face's beam rule (imported models) reorders beams without copying the encoder's part of the state on
    steps where every sentence keeps its `beam` rows: the same hypotheses as a search that selects every row, and a
    reorder called where the layout changed would decode a row against another sentence's source."""
    import dataclasses

    from toolkit.core.declaration import TK_RULES
    from toolkit.core.decoding import beam_search_hf

    rng = np.random.default_rng(seed)
    vocab, beam = int(rng.choice([5, 7, 40])), int(rng.integers(1, 6))
    n = int(rng.integers(1, 9))
    src = [[int(t) for t in rng.integers(4, 100, size=rng.integers(1, 6))] for _ in range(n)]
    max_len = int(rng.integers(1, 14))
    limits = rng.integers(1, max_len + 3, size=n) if rng.random() < 0.5 else None
    rules = dataclasses.replace(TK_RULES, length_penalty="hf", early_stopping=[False, True, "never"][seed % 3],
                                forced_end=bool(seed % 2))
    args = dict(max_len=max_len, beam=beam, alpha=float(rng.choice([0.0, 0.6, 1.0])), n_best=int(rng.integers(1, beam + 1)),
                limits=limits, loop_guard=bool(rng.random() < 0.5), rules=rules)
    keeping = KeepsSentenceState(vocab, seed)
    got = beam_search_hf(keeping, src, **args)
    want = beam_search_hf(RandomSteps(vocab, seed), src, **args)
    assert [[(h.tokens, h.score) for h in hyps] for hyps in got] == [[(h.tokens, h.score) for h in hyps] for hyps in want]
    if max_len >= 3 and limits is None and rules.early_stopping == "never":  # no sentence stops before its limit
        assert getattr(keeping, "kept", 0) > 0
