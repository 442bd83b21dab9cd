// Greedy and beam search over a step backend: a line-for-line port of toolkit/decoding.py and
// toolkit/batching.py, so the browser stops, guards, batches and breaks ties exactly as
// `tk translate` does (the page test asserts token-identical output).
//
// A backend has: async encode(ids, lens) -> state; async stepTopK(token, state, k) ->
// {values, indices, state} (rows x k, best first, ties by lower id); select(state, rows) -> state.

export const BOS = 2, EOS = 3, PAD = 0;
// A hypothesis loops when its last token came 4 times in a row, or its last 2-, 3- or 4-token
// group 3 times in a row.
const LOOP_RULES = [[1, 4], [2, 3], [3, 3], [4, 3]];

const same = (a, i, b, j, n) => {
  for (let k = 0; k < n; k++) if (a[i + k] !== b[j + k]) return false;
  return true;
};

// Where to cut tokens (an array) if it ends in a loop, keeping one copy of the group; else -1.
export function loopCut(tokens) {
  const t = tokens.length;
  for (const [n, reps] of LOOP_RULES) {
    if (t < n * reps) continue;
    let loops = true;
    for (let r = 0; r < reps - 1 && loops; r++) loops = same(tokens, t - n * reps + r * n, tokens, t - n, n);
    if (!loops) continue;
    let start = t - n * reps; // walk back over earlier copies of the group
    while (start >= n && same(tokens, start - n, tokens, t - n, n)) start -= n;
    return start + n;
  }
  return -1;
}

// Longest output per sentence: a * source length + b (capped at maxLen), or maxLen when a is null.
export function lengthLimits(src, maxLen, a, b) {
  return src.map((s) => (a === null ? maxLen : Math.min(maxLen, Math.ceil(a * s.length + b))));
}

export function normalized(hyp, alpha) {
  return hyp.score / ((5 + hyp.tokens.length + 1) / 6) ** alpha;
}

export async function greedy(backend, src, maxLen, limits, loopGuard) {
  let state = await backend.encode(src);
  const n = src.length;
  limits = limits.map((l) => Math.min(l, maxLen));
  maxLen = Math.max(...limits);
  const scores = new Float64Array(n);
  const out = src.map(() => []);
  let alive = src.map((_, i) => i);
  let token = new Array(n).fill(BOS);
  for (let t = 0; t < maxLen; t++) {
    const step = await backend.stepTopK(token, state, 1);
    state = step.state;
    token = alive.map((_, r) => step.indices[r][0]);
    const keep = [];
    alive.forEach((sent, r) => {
      scores[sent] += step.values[r][0];
      if (token[r] === EOS) return;
      out[sent].push(token[r]);
      let running = t + 1 < limits[sent];
      if (loopGuard) {
        const cut = loopCut(out[sent]);
        if (cut >= 0) {
          out[sent].length = cut;
          running = false;
        }
      }
      if (running) keep.push(r);
    });
    if (keep.length === 0) break;
    if (keep.length < alive.length) {
      alive = keep.map((r) => alive[r]);
      token = keep.map((r) => token[r]);
      state = backend.select(state, keep);
    }
  }
  return src.map((_, i) => ({ tokens: out[i], score: scores[i] }));
}

export async function beamSearch(backend, src, maxLen, beam, alpha, nBest, limits, loopGuard) {
  let state = await backend.encode(src);
  const n = src.length;
  limits = limits.map((l) => Math.min(l, maxLen));
  maxLen = Math.max(...limits);
  const live = src.map(() => [{ tokens: [], score: 0 }]);
  const done = src.map(() => []);
  let active = src.map((_, i) => i);
  let token = new Array(n).fill(BOS);
  for (let step = 0; step < maxLen; step++) {
    const ranked = await backend.stepTopK(token, state, 2 * beam);
    state = ranked.state;
    const rows = [], tokens = [], nextActive = [];
    let row = 0;
    for (const sent of active) {
      const k = live[sent].length;
      const cands = [];
      for (let p = 0; p < k; p++) {
        ranked.values[row + p].forEach((v, j) => cands.push({ score: live[sent][p].score + v, parent: p, tok: ranked.indices[row + p][j] }));
      }
      // Best first; equal scores by parent then token (numpy's lexsort in decoding.py).
      cands.sort((x, y) => y.score - x.score || x.parent - y.parent || x.tok - y.tok);
      const newLive = [];
      for (const c of cands.slice(0, 2 * beam)) {
        const parentHyp = live[sent][c.parent];
        const hyp = { tokens: c.tok === EOS ? parentHyp.tokens.slice() : [...parentHyp.tokens, c.tok], score: c.score };
        const cut = loopGuard && c.tok !== EOS ? loopCut(hyp.tokens) : -1;
        if (cut >= 0) hyp.tokens.length = cut;
        if (c.tok === EOS || step >= limits[sent] - 1 || cut >= 0) done[sent].push(hyp);
        else newLive.push([row + c.parent, c.tok, hyp]);
        if (done[sent].length >= beam || newLive.length === beam) break;
      }
      row += k;
      if (done[sent].length >= beam || newLive.length === 0) continue;
      live[sent] = newLive.map((x) => x[2]);
      newLive.forEach(([r, t]) => {
        rows.push(r);
        tokens.push(t);
      });
      nextActive.push(sent);
    }
    if (nextActive.length === 0) break;
    active = nextActive;
    state = backend.select(state, rows);
    token = tokens;
  }
  return done.map((d, sent) => (d.length ? d : live[sent]).slice()
    .sort((x, y) => normalized(y, alpha) - normalized(x, alpha)).slice(0, nBest));
}

// Indices in batches of similar source length (a stable sort, as Python's sorted).
export function lengthSortedBatches(lengths, batchSize) {
  const order = lengths.map((_, i) => i).sort((a, b) => lengths[a] - lengths[b] || a - b);
  const batches = [];
  for (let i = 0; i < order.length; i += batchSize) batches.push(order.slice(i, i + batchSize));
  return batches;
}

// n-best hypotheses for every source (token id lists), in input order; empty sources are not decoded.
// opts: beam, alpha, nBest, maxLen, batchSize, maxLenA (null: no length guard), maxLenB, loopGuard.
export async function decodeIds(backend, src, opts) {
  src = src.map((s) => s.slice(0, opts.maxLen));
  const out = src.map(() => [{ tokens: [], score: 0 }]);
  const todo = src.map((_, i) => i).filter((i) => src[i].length > 0);
  for (const batch of lengthSortedBatches(todo.map((i) => src[i].length), opts.batchSize)) {
    const idx = batch.map((b) => todo[b]);
    const batchSrc = idx.map((i) => src[i]);
    const limits = lengthLimits(batchSrc, opts.maxLen, opts.maxLenA, opts.maxLenB);
    const results = opts.beam === 1 && opts.nBest === 1
      ? (await greedy(backend, batchSrc, opts.maxLen, limits, opts.loopGuard)).map((h) => [h])
      : await beamSearch(backend, batchSrc, opts.maxLen, opts.beam, opts.alpha, opts.nBest, limits, opts.loopGuard);
    idx.forEach((i, k) => { out[i] = results[k]; });
  }
  return out;
}
