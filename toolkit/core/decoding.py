"""Greedy and beam search, written once over a step backend (ONNX Runtime or PyTorch).

A backend encodes a padded batch into an opaque decoder state, advances it by
one token per row, and keeps a subset of rows (finished rows leave the batch;
beams are reordered). Everything here is numpy; no torch is imported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from toolkit.core.declaration import TK_RULES, DecodingRules
from toolkit.core.graphs import NP_DTYPES, GraphSpec

_FORKS_LOCK = threading.Lock()  # StepBackend.borrow_forks: a moment's hold while a call takes or gives back forks


class StepBackend:
    """What the decoding loop needs of a model: encode a padded batch into an opaque decoder
    state, advance it one token per row, and keep a subset of rows."""

    def encode(self, src: np.ndarray, src_len: np.ndarray) -> Any:
        raise NotImplementedError

    def step(self, token: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        """token (rows,) -> log-probabilities (rows, vocab) as float32 numpy, new state."""
        raise NotImplementedError

    def step_top_k(self, token: np.ndarray, state: Any, k: int) -> tuple[np.ndarray, np.ndarray, Any]:
        """token (rows,) -> the k best log-probabilities of each row, largest first, their token ids
        (rows, k), and the new state. Backends override it to rank on their own device."""
        log_probs, state = self.step(token, state)
        return (*top_k_rows(log_probs, k), state)

    def greedy_steps(self, state: Any) -> Callable[[int], tuple[int, float]]:
        """For one row decoded greedily (a single request): a function from the row's last token to its next token and
        that token's log-probability, advancing a state of its own from `state` at each call. A step of tk's own 7M
        model takes a quarter of a millisecond, where each array operation around it costs its call: backends override
        it with fewer of them than step_top_k's arrays take."""
        return one_row_steps(self, state)

    def select(self, state: Any, rows: np.ndarray) -> Any:
        """The state of the given rows, in that order (rows may repeat)."""
        raise NotImplementedError

    def reorder_beams(self, state: Any, rows: np.ndarray) -> Any:
        """select() for a beam step where every sentence keeps its place and its number of rows, and
        its rows come from its own: what is the same on all of a sentence's rows (the encoder's
        outputs) can stay as it is. Backends override it to skip that copy."""
        return self.select(state, rows)

    def for_streams(self) -> StepBackend:
        """The backend concurrent streams start from (and fork): this one, unless the runtime keeps other
        sessions for them."""
        return self

    def fork(self) -> StepBackend:
        """Another backend over the same loaded model that may decode at the same time as this one,
        in another thread (concurrent decoding streams)."""
        raise NotImplementedError(f"{type(self).__name__} cannot decode concurrent streams")

    def borrow_forks(self, n: int) -> list[StepBackend]:
        """`n` forks for one call's concurrent streams, kept from call to call with their reorder memory: the stream
        threads are new at every call, so memory kept per thread was made again at each one. A fork is lent to one
        call at a time (return_forks gives it back); calls at the same time get forks of their own."""
        with _FORKS_LOCK:
            spare = self.__dict__.setdefault("_spare_forks", [])
            lent = [spare.pop() for _ in range(min(n, len(spare)))]
        return lent + [self.fork() for _ in range(n - len(lent))]

    def return_forks(self, forks: list[StepBackend]) -> None:
        """Gives back what borrow_forks lent, for the next call."""
        with _FORKS_LOCK:
            self.__dict__.setdefault("_spare_forks", []).extend(forks)


def one_row_steps(backend: StepBackend, state: Any) -> Callable[[int], tuple[int, float]]:
    """StepBackend.greedy_steps over any backend's step_top_k (a backend that is no StepBackend, as ForcedFirst, too)."""
    current = [state]

    def step(token: int) -> tuple[int, float]:
        values, indices, current[0] = backend.step_top_k(np.array([token], dtype=np.int64), current[0], 1)
        return int(indices[0, 0]), float(values[0, 0])

    return step


class ReorderMemory:
    """Where a backend's beam reorders write (HostState), kept from search to search: one memory per thread for a
    backend that its callers' threads share, or one for a fork (`per_thread=False`), which decodes one stream of one
    call at a time.

    A beam step copies the whole self-attention cache into the order of the surviving beams. Into fresh arrays, which
    grow by a position each step, the copy ran at half speed: the allocator maps new pages for every larger array
    (opus-mt shape, fp32 beam 4, 16 sentences: 0.8 of 4.7 s; into reused memory 0.25 s; the whole fp32 beam-4 row
    1.16x faster). Memory made for each search instead cost the int8 row 7% (0.93x): it is kept for the next one. A
    thread decodes one search at a time, and concurrent streams are forks with memory of their own
    (StepBackend.borrow_forks), so no two searches ever write into the same memory. What it holds stays at the largest
    cache it has reordered, as ONNX Runtime's own arena keeps its largest run's memory."""

    def __init__(self, per_thread: bool = True) -> None:
        self._local = threading.local() if per_thread else None
        self._memory: dict[str, tuple[np.ndarray, int]] = {}

    def here(self) -> dict[str, tuple[np.ndarray, int]]:
        """The memory of this thread (or of this fork): name -> (flat array, the size its last reorder used)."""
        if self._local is None:
            return self._memory
        memory = getattr(self._local, "memory", None)
        if memory is None:
            memory = self._local.memory = {}
        return memory


class HostState(dict):
    """A host backend's decoder state (name -> numpy array) with the memory its beam reorders write into
    (ReorderMemory). Only a search's latest state is valid: each reorder writes over what the previous one returned."""

    __slots__ = ("_memory",)

    def __init__(self, arrays: dict[str, np.ndarray], memory: dict[str, tuple[np.ndarray, int]]):
        super().__init__(arrays)
        self._memory = memory

    def carried(self, arrays: dict[str, np.ndarray]) -> HostState:
        """The next state of the same search (it keeps this one's memory)."""
        return HostState(arrays, self._memory)

    def reordered(self, name: str, value: np.ndarray, rows: np.ndarray, axis: int) -> np.ndarray:
        """np.take(value, rows, axis), written into this search's memory for `name`."""
        shape = (*value.shape[:axis], len(rows), *value.shape[axis + 1:])
        size = int(np.prod(shape))
        held = self._memory.get(name)
        if held is not None and np.may_share_memory(value, held[0]):
            # `value` is this memory's own (a select's copy of a tensor no step replaces, the encoder's outputs): into
            # the other of the name's two memories, since numpy would first copy a source that overlaps its output.
            name = f"{name}/other"
        flat, last = self._memory.get(name, (None, size))
        if flat is None or flat.size < size or flat.dtype != value.dtype:
            # Room for 32 more steps of the growth since the last reorder (a cache grows by a position a step): fresh
            # memory each few steps would fault its pages in again.
            flat = np.empty(size + max(32 * (size - last), size // 4, 1), value.dtype)
        self._memory[name] = (flat, size)
        # mode="clip" (reorder_rows checked the rows): with out= and numpy's default mode "raise", numpy copies through a
        # buffer of its own. (A value in this memory itself, reordered twice without a step between, is copied first by
        # numpy: take checks overlap.)
        return np.take(value, rows, axis=axis, out=flat[:size].reshape(shape), mode="clip")


def take_rows(state: dict[str, np.ndarray], rows: np.ndarray, batch_axis: dict[str, int],
              keep: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """The given rows of every host state tensor along its batch axis; the tensors named in `keep` as they are."""
    taken = {n: v if n in keep else np.take(v, rows, axis=batch_axis[n]) for n, v in state.items()}
    return state.carried(taken) if isinstance(state, HostState) else taken


def take_sentence_rows(state: dict[str, np.ndarray], rows: np.ndarray, batch_axis: dict[str, int],
                       per_sentence: frozenset[str], keep: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """take_rows for a state whose `per_sentence` tensors (a decoder's encoder outputs and source lengths) hold one row
    per sentence, each sentence's rows next to each other and as many for every sentence (a decoder graph regrouped by
    toolkit.graphs.sentence_cross). Where the rows taken are runs of one length, each from one sentence (beam search
    keeping `beam` rows a sentence), those tensors take one row per run: at the first beam step, which turns each
    sentence's row into `beam`, they stay as they are. Otherwise one row per row taken (runs of one). `keep`: tensors
    without rows (a shortlist's gathered weights), passed on as they are."""
    shared = next((n for n in state if n in per_sentence), None)
    own = next((n for n in state if n not in per_sentence and n not in keep), None)
    if shared is None or own is None or not len(rows):
        return take_rows(state, rows, batch_axis)
    group = state[own].shape[batch_axis[own]] // state[shared].shape[batch_axis[shared]]
    sentence = rows // group
    starts = np.flatnonzero(np.diff(sentence)) + 1
    runs = np.diff(np.concatenate([[0], starts, [len(rows)]]))
    picked = sentence[:: runs[0]] if (runs == runs[0]).all() else sentence
    same = np.array_equal(picked, np.arange(state[shared].shape[batch_axis[shared]]))
    # The rest by reorder_rows: into the search's memory, as every other select on the host.
    taken = reorder_rows(state, rows, batch_axis, keep=per_sentence | keep)
    for n in per_sentence & taken.keys():
        taken[n] = state[n] if same else np.take(state[n], picked, axis=batch_axis[n])
    return taken


def next_host_state(spec: GraphSpec, state: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """spec.next_state for a host backend: a HostState's next state keeps its search's memory."""
    new_state = spec.next_state(state, outputs)
    return state.carried(new_state) if isinstance(state, HostState) else new_state


def reorder_rows(state: dict[str, np.ndarray], rows: np.ndarray, batch_axis: dict[str, int],
                 keep: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """take_rows for a beam reorder: into the search's own memory where the state is a HostState."""
    if not isinstance(state, HostState):
        return take_rows(state, rows, batch_axis, keep)
    if len(rows) and (rows.min() < 0 or any(rows.max() >= state[n].shape[batch_axis[n]] for n in state if n not in keep)):
        raise IndexError(f"row {int(rows.max())} is past the state's rows")  # mode="clip" would hide it
    return state.carried({n: v if n in keep else state.reordered(n, v, rows, batch_axis[n]) for n, v in state.items()})


def top_k_rows(log_probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values of each row, largest first, and their indices; k == 1 is an argmax."""
    k = min(k, log_probs.shape[1])
    if k == 1:  # greedy's every step: plain indexing costs a tenth of take_along_axis at batch 1
        idx = log_probs.argmax(-1)
        return log_probs[np.arange(len(idx)), idx][:, None], idx[:, None]
    else:
        # numpy's partition is slow on wide rows (20 ms for 256 x 6000); backends avoid this path.
        idx = np.argpartition(-log_probs, k - 1, axis=-1)[:, :k]
        order = np.argsort(-np.take_along_axis(log_probs, idx, -1), axis=-1, kind="stable")
        idx = np.take_along_axis(idx, order, -1)
    return np.take_along_axis(log_probs, idx, -1), idx


@dataclass
class Hypothesis:
    tokens: list[int]
    score: float  # sum of token log-probabilities, EOS included when finished
    # What ended it: "" (it emitted EOS), "length" (its length limit) or "loop" (the loop guard).
    stopped: str = field(default="", compare=False)
    # For "loop": the tokens the guard cut off (more copies of the repeated group), so that word_end can end the
    # output on a whole word, which needs the tokenizer's pieces that this loop does not have.
    rest: list[int] = field(default_factory=list, compare=False)

    def normalized(self, alpha: float) -> float:
        """GNMT length penalty ((5 + n) / 6)^alpha: beam search otherwise favours short output."""
        return self.score / (((5 + len(self.tokens) + 1) / 6) ** alpha)


def pad_batch(seqs: list[list[int]], pad: int = TK_RULES.pad) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists -> (batch, longest) int64 ids padded with `pad`, and lengths (batch,)."""
    lens = np.array([max(len(s), 1) for s in seqs], dtype=np.int64)
    src = np.full((len(seqs), int(lens.max())), pad, dtype=np.int64)
    for i, s in enumerate(seqs):
        src[i, : len(s)] = s
    return src, lens


def padding_groups(lengths: np.ndarray, per_call: int = 16) -> list[np.ndarray]:
    """The rows of a padded batch in groups that an encoder runs one at a time, each padded only to its own longest:
    the fewest padded positions plus `per_call` positions' worth for every run beyond the first (a run of tk's 7M
    encoder costs about a dozen positions' work; of the 75M opus-mt shape's, under one). One group (all rows, in order)
    where splitting saves no more than that, and where at most a fifth of the positions are padding: a batch of
    similar lengths (tk's length-sorted batching mostly makes those) is encoded whole at no cost of searching. The
    first 32 Tatoeba Challenge sentences in the opus-mt shape's two batches of 16 (12 to 25 and 25 to 76 tokens: 839
    tokens) were 1,616 positions padded whole, 902 in groups."""
    n = len(lengths)
    padded = int(lengths.max()) * n if n else 0
    if n < 2 or padded - int(lengths.sum()) <= max(per_call, padded // 5):
        return [np.arange(n)]
    order = np.argsort(lengths, kind="stable")
    ordered = lengths[order]
    # cost[j]: least cost of the j shortest rows; a group (i, j] is padded to ordered[j - 1].
    cost, cut = np.zeros(n + 1), np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):
        options = cost[:j] + ordered[j - 1] * (j - np.arange(j)) + per_call
        cut[j] = int(options.argmin())
        cost[j] = options[cut[j]]
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]


def empty_cache(decoder: GraphSpec, encoder_outputs: dict, batch: int) -> dict[str, np.ndarray]:
    """Zero-length caches for decoder inputs the encoder does not provide (declared with fill 'empty')."""
    sizes = {"batch": batch, "past_len": 0}
    return {t.name: np.zeros(t.shape(sizes), NP_DTYPES[t.dtype]) for t in decoder.inputs
            if t.fill == "empty" and t.name not in encoder_outputs}


# A hypothesis loops when its last token came 4 times in a row, or its last 2-, 3- or 4-token
# group 3 times in a row ("bonjour bonjour bonjour" is three 2-piece groups).
LOOP_RULES = ((1, 4), (2, 3), (3, 3), (4, 3))
SHORTEST_LOOP, WIDEST_GROUP = min(n * reps for n, reps in LOOP_RULES), max(n for n, _ in LOOP_RULES)
STOPPED = ("", "length", "loop")  # Hypothesis.stopped, indexed by the codes the search loops record


def may_loop(tokens: np.ndarray) -> bool:
    """False when no row of (rows, t) tokens can end in a loop: every rule needs the last token to have
    come 1 to 4 tokens earlier. Most steps of most rows fail that, and the test is one array operation
    instead of four rules' worth."""
    t = tokens.shape[1]
    return t >= SHORTEST_LOOP and bool((tokens[:, max(0, t - 1 - WIDEST_GROUP) : t - 1] == tokens[:, -1:]).any())


def loop_cut(tokens: np.ndarray) -> np.ndarray:
    """For each row of (rows, t) tokens, where to cut it if it ends in a loop (keeping one
    copy of the repeated group), else -1."""
    rows, t = tokens.shape
    cut = np.full(rows, -1, dtype=np.int64)
    if not may_loop(tokens):
        return cut
    for n, reps in LOOP_RULES:
        if t < n * reps:
            continue
        block = tokens[:, t - n * reps :].reshape(rows, reps, n)
        for row in np.flatnonzero((block == block[:, -1:, :]).all(axis=(1, 2)) & (cut < 0)):
            start = t - n * reps  # walk back over earlier copies of the group
            while start >= n and (tokens[row, start - n : start] == tokens[row, t - n :]).all():
                start -= n
            cut[row] = start + n
    return cut


def word_end(tokens: list[int], rest: list[int], boundary: Callable[[int, int], bool]) -> list[int]:
    """What a hypothesis the loop guard stopped keeps, ending on a whole word: loop_cut keeps one copy of the repeated
    group, and a group found out of step with the words ("aux ▁post" in "▁post aux ▁post aux ▁post") ended the output
    mid-word ("Les taux post"). The shortest output that holds that copy and ends at a word boundary (`boundary(a, b)`:
    one lies between ids a and b; in the copies cut off: "Les taux postaux"), else the output without its unfinished
    last word, else the copy as it is (a single word). Every runtime's guard ends here (toolkit.deploy.translate
    applies it, with the tokenizer's pieces: TextTokenizer.boundary)."""
    if not rest:
        return tokens
    full = tokens + rest
    for p in range(max(len(tokens), 1), len(full)):
        if boundary(full[p - 1], full[p]):
            return full[:p]
    for q in range(len(tokens) - 1, 0, -1):
        if boundary(tokens[q - 1], tokens[q]):
            return tokens[:q]
    return tokens


def length_limits(src: list[list[int]], max_len: int, a: float | None, b: int) -> np.ndarray:
    """Longest output per sentence: a * source length + b (capped at max_len), or max_len when a is None."""
    lens = np.array([len(s) for s in src], dtype=np.float64)
    if a is None:
        return np.full(len(src), max_len, dtype=np.int64)
    return np.minimum(max_len, np.ceil(a * lens + b)).astype(np.int64)


COMPACT_AT = 2 / 3  # greedy drops finished rows from the state when at most this share is still decoding


# Over 60 lines: one step's record, finish and compaction act on the same per-row arrays (tokens, scores, live
# rows, the state); split, each piece would take and return most of them, and a single request pays every call.
def greedy(backend: StepBackend, src: list[list[int]], max_len: int, limits: np.ndarray | None = None,
           loop_guard: bool = False, rules: DecodingRules = TK_RULES) -> list[Hypothesis]:
    """Most probable next token at every step, from the model's start token. Rows that emit its end token
    (EOS below), reach their length limit or (with the loop guard) start repeating themselves leave the batch."""
    EOS = rules.end
    state = backend.encode(*pad_batch(src, rules.pad))
    n = len(src)
    limits = np.full(n, max_len, dtype=np.int64) if limits is None else np.minimum(limits, max_len)
    max_len = int(limits.max())
    if n == 1:
        return [_greedy_one(backend, state, max_len, loop_guard, rules)]
    scores = np.zeros(n)
    out = np.full((n, max_len), EOS, dtype=np.int64)  # each sentence's tokens; EOS from where it stopped
    why = np.zeros(n, dtype=np.int8)  # index into STOPPED
    rests: dict[int, list[int]] = {}  # per sentence the loop guard stopped: what it cut off (Hypothesis.rest)
    sentence = np.arange(n)  # the sentence of each row of the decoder state
    live = np.ones(n, dtype=bool)  # rows still decoding; a finished row stays until the state is compacted
    all_live = True  # no finished row waits in the state (then the rows are `sentence` as they stand)
    token = np.full(n, rules.start, dtype=np.int64)
    everyone = np.arange(n)
    shortest = int(limits.min())  # no row meets its length limit before this step
    # A step's own work is a handful of operations on arrays as small as one row (a single request), where
    # each costs its call, not its size: the common cases below skip what they can.
    for t in range(max_len):
        values, indices, state = backend.step_top_k(token, state, 1)
        token = indices[:, 0].astype(np.int64, copy=False)
        if all_live and len(sentence) == n:  # until a row finishes, row i is sentence i: slices, not gathers
            rows = alive = everyone
            scores += values[:, 0]
            out[:, t] = tok = token
            limit, history = limits, out[:, : t + 1]
        else:
            rows = everyone[: len(sentence)] if all_live else np.flatnonzero(live)
            alive, tok = (sentence, token) if all_live else (sentence[rows], token[rows])
            scores[alive] += values[:, 0] if all_live else values[rows, 0]
            out[alive, t] = tok
            limit, history = limits[alive], out[alive, : t + 1]
        ending = tok == EOS
        length = (t + 1 >= limit) & ~ending if t + 1 >= shortest else None
        if length is not None:
            ending |= length
        cut = loop_cut(history) if loop_guard and may_loop(history) else None
        if cut is not None:
            ending |= cut >= 0
        # Most steps every row goes on and there is nothing to record. Skipping the bookkeeping then took
        # the loop's own cost per sentence decoded alone from 0.70 to 0.50 ms (a step function that costs nothing).
        if not ending.any():
            continue
        if length is not None:
            why[alive[length]] = 1
        if cut is not None:
            for row in np.flatnonzero(cut >= 0):
                rests[int(alive[row])] = out[alive[row], cut[row] : t + 1].tolist()
                out[alive[row], cut[row] :] = EOS
            why[alive[cut >= 0]] = 2
        live[rows[ending]] = False
        all_live = False
        remaining = len(alive) - int(ending.sum())
        if remaining == 0:
            break
        # Finished rows leave the state once they are a third of it: every compaction copies the whole
        # cache, and a few idle rows in a step cost less than that copy. First 2,000 Tatoeba Challenge
        # sentences, fp32, 1 thread x 2 streams: 3.42 s compacting at every finish, 3.08 s at a third.
        if remaining <= COMPACT_AT * len(sentence):
            keep = np.flatnonzero(live)
            sentence, token, live = sentence[keep], token[keep], live[keep]
            state = backend.select(state, keep)
            all_live = True
    stopped = out == EOS
    ends = np.where(stopped.any(1), stopped.argmax(1), max_len)
    return [Hypothesis(out[i, : ends[i]].tolist(), float(scores[i]), STOPPED[why[i]], rests.get(i, [])) for i in range(n)]


def _greedy_one(backend: StepBackend, state: Any, limit: int, loop_guard: bool, rules: DecodingRules) -> Hypothesis:
    """greedy() for one sentence (a single request), by the same rules: its one-row arrays become Python
    numbers, since at one row every numpy operation costs its call. The score sums every step's
    log-probability (EOS's, and that of a token a guard stopped at, included), as greedy's does."""
    tokens: list[int] = []
    rest: list[int] = []
    score, why = 0.0, 0
    steps = backend.greedy_steps(state) if hasattr(backend, "greedy_steps") else one_row_steps(backend, state)
    tok = rules.start
    EOS = rules.end
    for t in range(limit):
        tok, value = steps(tok)
        score += value
        if tok == EOS:
            break
        tokens.append(tok)
        if loop_guard and t + 1 >= SHORTEST_LOOP and tok in tokens[-1 - WIDEST_GROUP : -1]:
            cut = int(loop_cut(np.array([tokens]))[0])
            if cut >= 0:
                tokens, rest = tokens[:cut], tokens[cut:]
                why = 2
                break
        if t + 1 >= limit:
            why = 1
            break
    return Hypothesis(tokens, score, STOPPED[why], rest)


# Over 60 lines: a step is one sequence of array operations over the same (sentences x beam) arrays (candidates,
# live and finished hypotheses); split, each piece would take and return most of them.
def beam_search(backend: StepBackend, src: list[list[int]], max_len: int, beam: int = 4,
                alpha: float = 0.6, n_best: int = 1, limits: np.ndarray | None = None,
                loop_guard: bool = False, rules: DecodingRules = TK_RULES) -> list[list[Hypothesis]]:
    """Beam search per sentence by tk's rule (DecodingRules "gnmt"), batched over sentences; returns the n_best per sentence.

    Live hypotheses are ranked by raw log-probability; finished ones by the
    length-normalised score. A sentence stops when it has `beam` finished
    hypotheses and leaves the batch; with beam=1 this is exactly greedy search.
    The backend ranks each row's 2*beam best tokens (on its own device): a
    sentence's 2*beam best continuations are always among them.

    Each step's scoring, ranking, finishing and reordering are array operations over
    (sentences x beam): at small batch a per-sentence Python loop cost as much as the
    decoder step itself. Candidates are taken best first, as one sentence at a time
    would take them: a sentence stops taking them once it holds `beam` finished or
    `beam` live hypotheses.
    """
    EOS = rules.end
    state = backend.encode(*pad_batch(src, rules.pad))
    n = len(src)
    limits = np.full(n, max_len, dtype=np.int64) if limits is None else np.minimum(limits, max_len)
    max_len = int(limits.max())
    width = 2 * beam
    # Live hypotheses of every sentence: tokens so far (all `step` long), score, and how many.
    live_tokens = np.zeros((n, beam, max_len), dtype=np.int64)
    live_scores = np.zeros((n, beam))
    live_count = np.ones(n, dtype=np.int64)
    # Finished hypotheses, in the order they finished (a sentence stops once it holds `beam`).
    done_tokens = np.zeros((n, beam, max_len), dtype=np.int64)
    done_len = np.zeros((n, beam), dtype=np.int64)
    done_scores = np.zeros((n, beam))
    done_why = np.zeros((n, beam), dtype=np.int8)  # index into STOPPED
    done_end = np.zeros((n, beam), dtype=np.int64)  # tokens written, the ones the loop guard cut off included
    done_count = np.zeros(n, dtype=np.int64)
    active = np.arange(n)  # sentences still searching, in state row order; each owns live_count rows
    token = np.full(n, rules.start, dtype=np.int64)
    for step in range(max_len):
        values, indices, state = backend.step_top_k(token, state, width)
        a, k = len(active), live_count[active]
        # Scatter the rows' candidates into (sentences, beam, top) with missing parents at -inf.
        first_row = np.cumsum(k) - k
        slot = np.arange(len(token)) - np.repeat(first_row, k)
        sent_of_row = np.repeat(np.arange(a), k)
        top = values.shape[1]
        cand = np.full((a, beam, top), -np.inf)
        cand_tok = np.zeros((a, beam, top), dtype=np.int64)
        cand[sent_of_row, slot] = live_scores[active[sent_of_row], slot, None] + values
        cand_tok[sent_of_row, slot] = indices
        cand, cand_tok = cand.reshape(a, -1), cand_tok.reshape(a, -1)
        parent = np.broadcast_to(np.repeat(np.arange(beam), top), cand.shape)
        # Best first; equal scores by parent then token, as one flat (parent, token) ranking would.
        order = np.lexsort((cand_tok, parent, -cand), axis=-1)[:, :width]
        scores = np.take_along_axis(cand, order, 1)
        toks = np.take_along_axis(cand_tok, order, 1)
        parents = order // top
        valid = parents < k[:, None]
        eos = toks == EOS
        # Each candidate's tokens: its parent's, then its own token (EOS is not written).
        prefix = live_tokens[active[:, None], parents, :step]
        seqs = np.concatenate([prefix, toks[..., None]], axis=-1)
        lengths = np.where(eos, step, step + 1)
        finishes = eos | (step >= limits[active] - 1)[:, None]
        why = np.where(eos, 0, 1).astype(np.int8)
        if loop_guard:
            cut = loop_cut(seqs.reshape(a * width, step + 1)).reshape(a, width)
            lengths = np.where(cut >= 0, cut, lengths)
            finishes |= cut >= 0
            why = np.where(~eos & (cut >= 0), 2, why).astype(np.int8)
        finishes &= valid
        going = valid & ~finishes
        # A sentence takes candidates up to and including the first that gives it `beam`
        # finished or `beam` live hypotheses.
        n_done = done_count[active, None] + np.cumsum(finishes, 1)
        n_live = np.cumsum(going, 1)
        full = (n_done >= beam) | (n_live == beam)
        stop = np.where(full.any(1), full.argmax(1), width - 1)
        taken = np.arange(width)[None, :] <= stop[:, None]
        finishes &= taken
        going &= taken
        s_idx, c_idx = np.nonzero(finishes)
        sents = active[s_idx]
        d_slot = done_count[sents] + (np.cumsum(finishes, 1) - 1)[s_idx, c_idx]
        done_tokens[sents, d_slot, : step + 1] = seqs[s_idx, c_idx]
        done_len[sents, d_slot] = lengths[s_idx, c_idx]
        done_scores[sents, d_slot] = scores[s_idx, c_idx]
        done_why[sents, d_slot] = why[s_idx, c_idx]
        done_end[sents, d_slot] = step + 1
        done_count[active] += finishes.sum(1)
        still = (done_count[active] < beam) & going.any(1)
        going &= still[:, None]
        s_idx, c_idx = np.nonzero(going)  # row-major: sentence order, then best first
        if len(s_idx) == 0:
            break
        sents = active[s_idx]
        l_slot = (np.cumsum(going, 1) - 1)[s_idx, c_idx]
        live_tokens[sents, l_slot, : step + 1] = seqs[s_idx, c_idx]
        live_scores[sents, l_slot] = scores[s_idx, c_idx]
        live_count[active] = going.sum(1)
        rows = first_row[s_idx] + parents[s_idx, c_idx]
        # Mostly no sentence stops and each keeps `beam` rows: the encoder's part of the state stays put.
        # First 2,000 Tatoeba Challenge sentences, fp32 beam 4, 1 thread x 2 streams: 6.09 -> 5.64 s.
        same_layout = bool(still.all()) and np.array_equal(live_count[active], k)
        active = active[still]
        state = (backend.reorder_beams if same_layout else backend.select)(state, rows)
        token = toks[s_idx, c_idx]
    return _best(live_tokens, live_scores, live_count, done_tokens, done_len, done_scores, done_why, done_count, alpha, n_best,
                 done_end)


def _best(live_tokens, live_scores, live_count, done_tokens, done_len, done_scores, done_why, done_count,
          alpha: float, n_best: int, done_end) -> list[list[Hypothesis]]:
    """Each sentence's n_best finished hypotheses by normalised score (its live ones if none finished)."""
    # A sentence with none finished never took a step (every candidate finishes at its length
    # limit), so its one live hypothesis is empty.
    none = done_count == 0
    tokens = np.where(none[:, None, None], live_tokens, done_tokens)
    count = np.where(none, live_count, done_count)
    lengths = np.where(none[:, None], 0, done_len)
    scores = np.where(none[:, None], live_scores, done_scores)
    why = np.where(none[:, None], 1, done_why)
    norm = scores / (((5 + lengths + 1) / 6) ** alpha)
    norm[np.arange(tokens.shape[1])[None, :] >= count[:, None]] = -np.inf
    order = np.argsort(-norm, axis=1, kind="stable")[:, :n_best]
    return [[Hypothesis(tokens[s, j, : lengths[s, j]].tolist(), float(scores[s, j]), STOPPED[why[s, j]],
                        tokens[s, j, lengths[s, j] : done_end[s, j]].tolist() if why[s, j] == 2 else [])
             for j in order[s, : min(n_best, count[s])]]
            for s in range(len(count))]


# ---- Hugging Face's beam rule -----------------------------------------------------------------------------------
# For models imported from it (DecodingRules.length_penalty "hf"): a model should translate as `generate` does, so
# that `tk verify` can prove beam parity token for token. Its rule, step by step (transformers 4.50+ `_beam_search`,
# unchanged in 5.x):
#
# - the 2 x beam best continuations of all live hypotheses (summed log-probabilities) are taken, best first;
# - of those, the ones that emit the end token or reach the length limit finish, but only those among the first
#   `beam` enter the finished set, ranked by score / n ** alpha (n: tokens generated, the end token included), which
#   keeps the `beam` best;
# - the `beam` best continuations that did not finish live on (with fewer, finished ones fill in at -1e9, as there);
# - a sentence is done once `beam` have finished and its best live score over (tokens so far) ** alpha cannot beat the
#   worst finished one (early_stopping False), as soon as `beam` have finished (True), or at its limit ("never", where
#   the live score is taken over the longest length when alpha > 0). After that nothing enters its set.
#
# A forced end token (forced_eos_token_id) makes the last step of the limit emit the end token with probability one.
# The backend's top 2 x beam per row suffice: a sentence's 2 x beam best continuations are among them.

DEAD = -1.0e9  # the score Hugging Face adds to a continuation that may not go on


class _Sentence:
    """One sentence's live and finished hypotheses."""

    def __init__(self, steps: int):
        self.steps = steps  # decoder steps it may take (its limit, plus the forced end token's step)
        self.live_tokens: list[list[int]] = [[]]
        self.live_scores = np.zeros(1)
        # Finished: (ranking score, tokens, summed log-probability, why, what the loop guard cut off); at most `beam`,
        # best first.
        self.finished: list[tuple[float, list[int], float, int, list[int]]] = []
        self.settled = False  # nothing more may enter the finished set


# Over 60 lines: a step is one pass of Hugging Face's rule over every sentence's candidates; split, each piece would
# take and return the same per-sentence lists.
def beam_search_hf(backend: StepBackend, src: list[list[int]], max_len: int, beam: int, alpha: float, n_best: int,
                   limits: np.ndarray | None, loop_guard: bool, rules: DecodingRules) -> list[list[Hypothesis]]:
    state = backend.encode(*pad_batch(src, rules.pad))
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
        full = True  # every sentence came into this step with `beam` rows (each leaves it with `beam` if it goes on)
        for s in active:
            sent = sentences[s]
            k = len(sent.live_tokens)
            full = full and k == beam
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
                    rest = seqs[i][cuts[i]:] if why == 2 else []
                    sent.finished.append((float(cand[i]) / (step + 1) ** alpha, tokens, float(cand[i]), why, rest))
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
        # When no sentence stopped and each kept its `beam` rows, every row comes from its own sentence's rows and the
        # encoder's part of the state stays put (reorder_beams): the full select copied the cross-attention keys and
        # values of every row at every step: 17 to 22% of an opus-mt-sized int8 decode at beam 4 (batch 16, 2 cores, a
        # loaded machine). Reordering instead: int8 beam 4 1.11 to 1.31x faster, fp32 no faster (docs/performance.md).
        same_layout = full and len(still) == len(active)
        active = still
        if active:
            rows_kept = np.array(keep_rows, dtype=np.int64)
            state = (backend.reorder_beams if same_layout else backend.select)(state, rows_kept)
            token = np.array(next_tokens, dtype=np.int64)
        step += 1
    return [[Hypothesis(tokens, score, STOPPED[why], rest) for _, tokens, score, why, rest in sent.finished[:n_best]]
            or [Hypothesis([], 0.0, "length")]
            for sent in sentences]


def translate_ids(backend: StepBackend, src: list[list[int]], max_len: int, beam: int = 1,
                  alpha: float | None = None, n_best: int = 1, limits: np.ndarray | None = None,
                  loop_guard: bool = False, rules: DecodingRules = TK_RULES) -> list[list[Hypothesis]]:
    """Greedy when beam == 1 and one hypothesis is wanted, else beam search by the model's rule.
    alpha None: the model's own length penalty exponent (rules.alpha)."""
    alpha = rules.alpha if alpha is None else alpha
    if rules.forced_first is not None:  # a multilingual model's target language, forced as generate forces it
        from toolkit.core.forced_first import ForcedFirst

        backend = ForcedFirst(backend, rules.forced_first)
    if beam == 1 and n_best == 1:
        return [[h] for h in greedy(backend, src, max_len, limits, loop_guard, rules)]
    if rules.length_penalty == "hf":
        return beam_search_hf(backend, src, max_len, beam, alpha, n_best, limits, loop_guard, rules)
    return beam_search(backend, src, max_len, beam, alpha, n_best, limits, loop_guard, rules)
