// Greedy and beam search over a step backend: a line-for-line port of toolkit/core/decoding.py,
// toolkit/core/forced_first.py and toolkit/core/batching.py, so the browser stops, guards, batches
// and breaks ties exactly as `tk translate` does (the page tests assert token-identical output).
//
// A backend has: async encode(ids) -> state; async step(token, state) -> {logProbs, vocab, state}
// (rows x vocab log-probabilities); async stepTopK(token, state, k) -> {values, indices, state}
// (rows x k, best first, ties by lower id); select(state, rows) -> state.
//
// rules: the model's DecodingRules as model.json carries them (toolkit/core/declaration.py): start,
// end, pad, length_penalty ("gnmt": tk's beam rule, "hf": generate's), alpha, early_stopping,
// forced_end, max_new_tokens (already in the page's maxLen) and forced_first.
//
// Each hypothesis is {tokens, score, stopped, rest}, as decoding.Hypothesis: stopped is "" (it emitted the end token),
// "length" (its length limit) or "loop" (the loop guard), and rest the tokens the loop guard cut off (wordEnd's input).

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

// Larger first, as numpy's sort of the negated values orders them (-inf last; equal infinities tie).
const desc = (a, b) => (a > b ? -1 : a < b ? 1 : 0);

// A forced first output token (generate's forced_bos_token_id) over any backend: the first step's
// log-probabilities are 0 for the forced token and -inf for every other (toolkit/core/forced_first.py).
export class ForcedFirst {
  constructor(inner, token) {
    this.inner = inner;
    this.token = token;
  }

  async encode(src) {
    return { inner: await this.inner.encode(src), first: true };
  }

  async stepTopK(token, state, k) {
    if (!state.first) {
      const step = await this.inner.stepTopK(token, state.inner, k);
      return { ...step, state: { inner: step.state, first: false } };
    }
    // Ranked here: the backend's own ranking would rank the model's choice, not the forced one.
    const step = await this.inner.step(token, state.inner);
    const forced = new Float32Array(step.logProbs.length).fill(-Infinity);
    for (let r = 0; r < token.length; r++) forced[r * step.vocab + this.token] = 0;
    return { ...topK(forced, step.vocab, k), state: { inner: step.state, first: false } };
  }

  select(state, rows) {
    return { inner: this.inner.select(state.inner, rows), first: state.first };
  }
}

// The k best values of each row of a (rows x vocab) Float32Array, largest first; equal values by
// lower id (ONNX Runtime's TopK, numpy's stable argsort); k == 1 is an argmax (first maximum).
export function topK(data, vocab, k) {
  k = Math.min(k, vocab);
  const rows = data.length / vocab, values = [], indices = [];
  for (let r = 0; r < rows; r++) {
    const row = data.subarray(r * vocab, (r + 1) * vocab);
    const best = [];
    for (let i = 0; i < vocab; i++) {
      const v = row[i];
      if (best.length === k && v <= row[best[k - 1]]) continue;
      let at = best.length;
      while (at > 0 && row[best[at - 1]] < v) at--;
      best.splice(at, 0, i);
      if (best.length > k) best.pop();
    }
    values.push(best.map((i) => row[i]));
    indices.push(best);
  }
  return { values, indices };
}

export async function greedy(backend, src, maxLen, limits, loopGuard, rules) {
  let state = await backend.encode(src);
  const n = src.length;
  limits = limits.map((l) => Math.min(l, maxLen));
  maxLen = Math.max(...limits);
  const scores = new Float64Array(n);
  const out = src.map(() => []);
  const stopped = src.map(() => ""), rests = src.map(() => []);
  let alive = src.map((_, i) => i);
  let token = new Array(n).fill(rules.start);
  for (let t = 0; t < maxLen; t++) {
    const step = await backend.stepTopK(token, state, 1);
    state = step.state;
    token = alive.map((_, r) => step.indices[r][0]);
    const keep = [];
    alive.forEach((sent, r) => {
      scores[sent] += step.values[r][0];
      if (token[r] === rules.end) return;
      out[sent].push(token[r]);
      let running = t + 1 < limits[sent];
      if (!running) stopped[sent] = "length";
      if (loopGuard) {
        const cut = loopCut(out[sent]);
        if (cut >= 0) {
          rests[sent] = out[sent].slice(cut);
          out[sent].length = cut;
          stopped[sent] = "loop";
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
  return src.map((_, i) => ({ tokens: out[i], score: scores[i], stopped: stopped[i], rest: rests[i] }));
}

export async function beamSearch(backend, src, maxLen, beam, alpha, nBest, limits, loopGuard, rules) {
  const EOS = rules.end;
  let state = await backend.encode(src);
  const n = src.length;
  limits = limits.map((l) => Math.min(l, maxLen));
  maxLen = Math.max(...limits);
  const live = src.map(() => [{ tokens: [], score: 0 }]);
  const done = src.map(() => []);
  let active = src.map((_, i) => i);
  let token = new Array(n).fill(rules.start);
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
      cands.sort((x, y) => desc(x.score, y.score) || x.parent - y.parent || x.tok - y.tok);
      const newLive = [];
      for (const c of cands.slice(0, 2 * beam)) {
        const parentHyp = live[sent][c.parent];
        const hyp = { tokens: c.tok === EOS ? parentHyp.tokens.slice() : [...parentHyp.tokens, c.tok], score: c.score };
        const cut = loopGuard && c.tok !== EOS ? loopCut(hyp.tokens) : -1;
        hyp.stopped = c.tok === EOS ? "" : cut >= 0 ? "loop" : "length"; // what ends it, if it ends here
        hyp.rest = cut >= 0 ? hyp.tokens.slice(cut) : [];
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
  // A sentence with none finished never took a step (every candidate finishes at its length limit).
  return done.map((d, sent) => (d.length ? d : live[sent].map((h) => ({ ...h, stopped: "length", rest: [] }))).slice()
    .sort((x, y) => desc(normalized(x, alpha), normalized(y, alpha))).slice(0, nBest));
}

// Hugging Face's beam rule (DecodingRules length_penalty "hf"), as beam_search_hf in decoding.py: each step the 2 x
// beam best continuations, best first; those among the first `beam` that end (the end token, the limit, the loop
// guard) enter the finished set, ranked by score / (tokens generated) ** alpha, which keeps the `beam` best; the
// `beam` best that did not end live on (ended ones fill in at DEAD); a sentence is done by its early_stopping rule.
const DEAD = -1.0e9;

// Over 60 lines: one step of the rule over every sentence's candidates, as decoding.py's beam_search_hf.
export async function beamSearchHf(backend, src, maxLen, beam, alpha, nBest, limits, loopGuard, rules) {
  let state = await backend.encode(src);
  const forced = rules.forced_end ? 1 : 0;
  const sentences = limits.map((l) => ({ steps: Math.min(l, maxLen) + forced, liveTokens: [[]], liveScores: [0], finished: [], settled: false }));
  let active = src.map((_, i) => i); // in state row order; each owns liveTokens.length rows
  const width = 2 * beam;
  let token = new Array(src.length).fill(rules.start);
  for (let step = 0; active.length; step++) {
    const ranked = await backend.stepTopK(token, state, width);
    state = ranked.state;
    const keepRows = [], nextTokens = [], still = [];
    let row = 0;
    for (const s of active) {
      const sent = sentences[s], k = sent.liveTokens.length, first = row;
      row += k;
      const last = step + 1 >= sent.steps;
      let cands = [];
      if (forced && last) { // every live hypothesis's one continuation is the end token
        for (let p = 0; p < k; p++) cands.push({ score: sent.liveScores[p], tok: rules.end, parent: p });
      } else {
        for (let p = 0; p < k; p++) {
          ranked.values[first + p].forEach((v, j) => cands.push({ score: sent.liveScores[p] + v, tok: ranked.indices[first + p][j], parent: p }));
        }
      }
      // Best first; equal scores in the order of the flat (parent, token) index, as torch.topk on the flat row.
      cands = cands.sort((x, y) => desc(x.score, y.score) || x.parent - y.parent || x.tok - y.tok).slice(0, width);
      for (const c of cands) {
        c.seq = [...sent.liveTokens[c.parent], c.tok];
        c.hit = c.tok === rules.end || last;
        c.cut = loopGuard && !c.hit ? loopCut(c.seq) : -1;
        c.hit = c.hit || c.cut >= 0;
      }
      if (!sent.settled && !(rules.early_stopping === true && sent.finished.length >= beam)) {
        cands.slice(0, beam).forEach((c) => {
          if (!c.hit || !Number.isFinite(c.score)) return;
          const ended = c.tok === rules.end;
          const tokens = ended ? c.seq.slice(0, -1) : c.cut >= 0 ? c.seq.slice(0, c.cut) : c.seq;
          const stopped = ended ? "" : c.cut >= 0 ? "loop" : "length", rest = c.cut >= 0 ? c.seq.slice(c.cut) : [];
          sent.finished.push({ rank: c.score / (step + 1) ** alpha, tokens, score: c.score, stopped, rest });
        });
        sent.finished.sort((x, y) => desc(x.rank, y.rank)); // stable: earlier entries first among equals
        sent.finished.length = Math.min(sent.finished.length, beam);
      }
      const going = cands.map((c, i) => i).sort((i, j) => desc(cands[i].score + (cands[i].hit ? DEAD : 0), cands[j].score + (cands[j].hit ? DEAD : 0)) || i - j)
        .slice(0, beam);
      sent.liveScores = going.map((i) => cands[i].score + (cands[i].hit ? DEAD : 0));
      sent.liveTokens = going.map((i) => cands[i].seq);
      if (sent.finished.length >= beam && !sent.settled) {
        const length = rules.early_stopping === "never" && alpha > 0 ? sent.steps : step + 1;
        sent.settled = sent.liveScores[0] / length ** alpha <= sent.finished[sent.finished.length - 1].rank;
      }
      const done = last || sent.settled || (rules.early_stopping === true && sent.finished.length >= beam)
        || !sent.liveScores.some(Number.isFinite);
      if (!done) {
        still.push(s);
        going.forEach((i) => {
          keepRows.push(first + cands[i].parent);
          nextTokens.push(cands[i].tok);
        });
      }
    }
    active = still;
    if (active.length) {
      state = backend.select(state, keepRows);
      token = nextTokens;
    }
  }
  return sentences.map((sent) => (sent.finished.length ? sent.finished.slice(0, nBest).map(({ rank, ...h }) => h)
    : [{ tokens: [], score: 0, stopped: "length", rest: [] }]));
}

// Greedy when beam == 1 and one hypothesis is wanted, else beam search by the model's rule (translate_ids).
export async function translateIds(backend, src, maxLen, beam, alpha, nBest, limits, loopGuard, rules) {
  if (rules.forced_first !== null && rules.forced_first !== undefined) backend = new ForcedFirst(backend, rules.forced_first);
  if (beam === 1 && nBest === 1) return (await greedy(backend, src, maxLen, limits, loopGuard, rules)).map((h) => [h]);
  const search = rules.length_penalty === "hf" ? beamSearchHf : beamSearch;
  return search(backend, src, maxLen, beam, alpha, nBest, limits, loopGuard, rules);
}

// Indices in batches of similar source length (a stable sort, as Python's sorted).
export function lengthSortedBatches(lengths, batchSize) {
  const order = lengths.map((_, i) => i).sort((a, b) => lengths[a] - lengths[b] || a - b);
  const batches = [];
  for (let i = 0; i < order.length; i += batchSize) batches.push(order.slice(i, i + batchSize));
  return batches;
}

// n-best hypotheses for every source (token id lists), in input order; empty sources are not decoded.
// opts: beam, alpha (null: the rules' own), nBest, maxLen, maxSrcLen, batchSize, maxLenA (null: no length guard),
// maxLenB, loopGuard, rules.
export async function decodeIds(backend, src, opts) {
  const { rules } = opts, alpha = opts.alpha ?? rules.alpha;
  src = src.map((s) => s.slice(0, opts.maxSrcLen));
  const out = src.map(() => [{ tokens: [], score: 0, stopped: "", rest: [] }]);
  const todo = src.map((_, i) => i).filter((i) => src[i].length > 0);
  for (const batch of lengthSortedBatches(todo.map((i) => src[i].length), opts.batchSize)) {
    const idx = batch.map((b) => todo[b]);
    const batchSrc = idx.map((i) => src[i]);
    const limits = lengthLimits(batchSrc, opts.maxLen, opts.maxLenA, opts.maxLenB);
    const results = await translateIds(backend, batchSrc, opts.maxLen, opts.beam, alpha, opts.nBest, limits, opts.loopGuard, rules);
    idx.forEach((i, k) => { out[i] = results[k]; });
  }
  return out;
}

// decodeIds' results for `src` with `opts`, where a guard cut a sentence's best hypothesis, decoded again with a wider
// beam (retry.beam, or twice the beam asked for when that is already as wide), keeping every hypothesis it finished:
// those that ended of their own accord first, then the cut ones; the first cut is kept only where every hypothesis of
// the wider beam was cut too. toolkit.deploy.translate.retried, with its constants from model.json's retry.
export async function retried(backend, src, results, opts, retry) {
  if (!opts.loopGuard && opts.maxLenA === null) return results; // the guards off: the decode asked for
  const cut = results.map((_, i) => i).filter((i) => results[i][0].stopped && src[i].length > 0);
  if (!cut.length) return results;
  const beam = opts.beam < retry.beam ? retry.beam : Math.min(2 * opts.beam, retry.max_beam);
  const wider = { ...opts, beam, nBest: beam, batchSize: Math.max(1, Math.min(opts.batchSize, Math.floor(retry.rows / beam))) };
  const sources = cut.map((i) => src[i].slice(0, opts.maxSrcLen));
  const limits = lengthLimits(sources, opts.maxLen, opts.maxLenA, opts.maxLenB);
  const again = await decodeIds(backend, sources, wider);
  const out = results.slice();
  cut.forEach((i, k) => {
    const ended = again[k].filter((h) => !h.stopped && h.tokens.length < limits[k]);
    if (ended.length) out[i] = [...ended, ...again[k].filter((h) => h.stopped || h.tokens.length >= limits[k])].slice(0, opts.nBest);
  });
  return out;
}

// What a hypothesis the loop guard stopped keeps, ending on a whole word (decoding.word_end): the shortest output that
// holds the kept copy and ends at a word boundary (boundary(a, b): one lies between ids a and b), else the output
// without its unfinished last word, else the copy as it is.
export function wordEnd(tokens, rest, boundary) {
  if (!rest.length) return tokens;
  const full = [...tokens, ...rest];
  for (let p = Math.max(tokens.length, 1); p < full.length; p++) if (boundary(full[p - 1], full[p])) return full.slice(0, p);
  for (let q = tokens.length - 1; q > 0; q--) if (boundary(tokens[q - 1], tokens[q])) return tokens.slice(0, q);
  return tokens;
}

// Whether a word boundary lies between two output ids (TextTokenizer.boundary), from model.json's words: the ids that
// begin no word and the ids that end one.
export function wordBoundary(words, vocab) {
  const begins = new Uint8Array(vocab).fill(1), ends = new Uint8Array(vocab);
  words.inside_word.forEach((i) => { begins[i] = 0; });
  words.ends_word.forEach((i) => { ends[i] = 1; });
  return (before, after) => ends[before] === 1 || begins[after] === 1;
}
