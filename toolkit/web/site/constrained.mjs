// Constrained decoding for glossaries: a line-for-line port of toolkit/core/constrained.py (dynamic beam allocation,
// one sentence at a time over the page's step backend), so the page forces a target term in where and as Python does.
// kinds: per output id, starts (begins a word), apostrophes (ends in one), ends (ends a sentence), bare (an apostrophe
// alone), from model.json.

import { loopCut, topK } from "./decoding.mjs";

const last = (h) => h.tokens[h.tokens.length - 1];
const desc = (a, b) => (a > b ? -1 : a < b ? 1 : 0);
const byScore = (x, y) => desc(x[1].score, y[1].score); // Array.prototype.sort is stable, as Python's sort

// constrained._advance: h with `tok` written.
function advance(h, tok, score, terms, elided) {
  const met = h.met.slice();
  let writing = null, held = h.held;
  if (h.writing) {
    const [c, v, j] = h.writing;
    if (terms[c][v][j] === tok) {
      writing = [c, v, j + 1];
      held += 1;
    } else {
      held -= j;
    }
  }
  if (writing === null) {
    outer: for (let c = 0; c < terms.length; c++) {
      if (met[c]) continue;
      for (let v = 0; v < terms[c].length; v++) {
        if (terms[c][v][0] === tok && (v > 0) === elided) { writing = [c, v, 1]; break outer; }
      }
    }
    held += writing !== null;
  }
  const ended = writing !== null && writing[2] === terms[writing[0]][writing[1]].length;
  if (ended) {
    met[writing[0]] = true;
    writing = null;
  }
  return { tokens: [...h.tokens, tok], score, met, writing, afterTerm: ended, held };
}

// constrained._candidates: the model's `beam` best it may write, the term's next token, each unwritten term's first, the end.
function candidates(h, row, terms, beam, starts, eos, elided, stub) {
  const allMet = h.met.every(Boolean);
  let lp = row;
  if (h.afterTerm || !allMet) {
    lp = row.slice();
    if (h.afterTerm) {
      for (let i = 0; i < lp.length; i++) if (!starts[i]) lp[i] = -Infinity;
      lp[eos] = row[eos];
    }
    if (!allMet) lp[eos] = -Infinity;
    // after a word only ever written elided ("l" before its "'"), no term as a word of its own ("l fric")
    if (stub) terms.forEach((forms, c) => { if (!h.met[c]) lp[forms[0][0]] = -Infinity; });
  }
  const wanted = new Set(topK(lp, lp.length, beam).indices[0]);
  if (h.writing) {
    const [c, v, j] = h.writing;
    wanted.add(terms[c][v][j]);
  }
  terms.forEach((forms, c) => { if (!h.met[c]) forms.forEach((form, v) => { if ((v > 0) === elided && !(stub && v === 0)) wanted.add(form[0]); }); });
  if (allMet) wanted.add(eos);
  return [...wanted].filter((t) => Number.isFinite(lp[t]));
}

// constrained._allocate: each bank's best (its share of the beam, most term tokens first), then the best of the others.
function allocate(going, terms, beam) {
  const banks = new Map();
  for (const item of going) {
    if (!banks.has(item[1].held)) banks.set(item[1].held, []);
    banks.get(item[1].held).push(item);
  }
  const share = Math.max(1, Math.floor(beam / (terms.reduce((n, forms) => n + forms[0].length, 0) + 1)));
  let chosen = [...banks.keys()].sort((a, b) => b - a).flatMap((b) => banks.get(b).slice(0, share));
  chosen = chosen.sort(byScore).slice(0, beam);
  const picked = new Set(chosen);
  chosen.push(...going.filter((item) => !picked.has(item)).slice(0, beam - chosen.length));
  return chosen.sort(byScore);
}

// constrained.constrained_search: the best translation of src holding each of `terms` (per occurrence, its forms' ids),
// at most `limit` tokens, with `beam` rows; null if none finished (or the best loops).
export async function constrainedSearch(backend, src, terms, limit, beam, alpha, rules, kinds, normalized) {
  let state = await backend.encode([src]);
  const eos = rules.end;
  let hyps = [{ tokens: [], score: 0, met: terms.map(() => false), writing: null, afterTerm: false, held: 0 }];
  const finished = [];
  let token = [rules.start];
  for (let t = 0; t < limit; t++) {
    const step = await backend.step(token, state);
    state = step.state;
    const cands = [];
    hyps.forEach((h, r) => {
      if (h.tokens.length && kinds.ends[last(h)] && !h.met.every(Boolean)) return; // its sentence ended without its terms
      const elided = h.tokens.length > 0 && kinds.apostrophes[last(h)] === 1;
      const stub = h.tokens.length > 0 && kinds.stubs[last(h)] === 1;
      const row = step.logProbs.subarray(r * step.vocab, (r + 1) * step.vocab);
      for (const tok of candidates(h, row, terms, beam, kinds.starts, eos, elided, stub)) cands.push([r, advance(h, tok, h.score + row[tok], terms, elided)]);
    });
    cands.sort(byScore);
    for (const [, h] of cands.slice(0, beam)) if (last(h) === eos) finished.push([normalized(rules, h.score, h.tokens.length - 1, alpha), h]);
    if (finished.length >= beam) break;
    const live = allocate(cands.filter(([, h]) => last(h) !== eos), terms, beam);
    if (!live.length) break;
    state = backend.select(state, live.map(([r]) => r));
    hyps = live.map(([, h]) => h);
    token = hyps.map(last);
  }
  if (!finished.length) return null;
  const best = finished.reduce((a, b) => (b[0] > a[0] ? b : a))[1];
  const tokens = best.tokens.slice(0, -1);
  return tokens.length && loopCut(tokens) >= 0 ? null : { tokens, score: best.score };
}

// constrained.term_words, one sentence at a time: where the word of the model's own translation `own` (ids) that the source terms account for
// most stands, the one whose log-probability falls most when the model reads `without` (the source with its terms taken
// out) instead of `src` (the first of equals), never one of spec.not_a_terms_word (an article: "de", "le"):
// { begin, i, end, elided, text }; null where `own` has no word.
export async function termWord(backend, tokenizer, src, own, rules, kinds, without, spec) {
  if (own.length < 2) return null;
  const [withTerms, withoutTerms] = await ownLogProbsEach(backend, [src, without], own, rules);
  const begins = (tok) => kinds.starts[tok] === 1 && kinds.bare[tok] !== 1;
  let best = null;
  for (let i = 0; i < own.length; i++) {
    const elided = i > 0 && kinds.apostrophes[own[i - 1]] === 1;
    if (!begins(own[i]) && !elided) continue;
    let end = i + 1;
    while (end < own.length && !begins(own[end])) end++;
    if (spec.not_a_terms_word.includes(tokenizer.decode(own.slice(i, end)).trim().replaceAll("’", "'").toLowerCase())) continue;
    let weight = 0;
    for (let j = i; j < end; j++) weight += withTerms[j] - withoutTerms[j]; // float64, as numpy's sum of float64
    if (best === null || weight > best.weight) best = { weight, i, end, elided };
  }
  if (best === null) return null;
  const { i, end, elided } = best;
  const begin = elided ? wordStart(own, i - 1, kinds) : i;
  return { begin, i, end, elided, text: tokenizer.decode(own.slice(begin, end)).trim() };
}

// constrained.term_swaps: the model's own translation `own` (ids) with its word for the first term (`found`: termWord)
// swapped for that term (`target`, its forms terms[0]), in each way the words before it may then be written. An elided
// article or preposition (spec.unelided) stays elided before a term that takes elision and comes back whole before one
// that takes none, in each of its forms (spec.contracted: "du fric", not "de le fric"); one that stands whole before
// the word is the caller's to write in each form it may take before the term (agreeingWays).
export function termSwaps(tokenizer, own, found, terms, target, rules, kinds, spec) {
  const { begin, i, end, elided } = found;
  const word = found.text, rest = own.slice(end);
  const ids = (text) => {
    const out = tokenizer.targetIds(text);
    return out.length && out[out.length - 1] === rules.end ? out.slice(0, -1) : out;
  };
  const lower = (w) => w.toLowerCase(); // str.casefold on the words spec.unelided and spec.contracted hold
  const elides = terms[0].length > 1;
  const unelided = new Map(Object.entries(spec.unelided));
  const contracted = new Map(spec.contracted.map(([a, b, whole]) => [`${a} ${b}`, whole]));
  const chars = [...word.slice(0, -1)];
  let cut = -1;
  for (let k = 0, at = 0; k < chars.length; at += chars[k].length, k++) if ("'’".includes(chars[k])) { cut = at; break; }
  if (cut > 0 && unelided.has(lower(word.slice(0, cut)))) {
    const short = word.slice(0, cut);
    if (elides) return [[...own.slice(0, begin), ...ids(`${short}${word[cut]}${target}`), ...rest]];
    const before = begin > 0 ? wordStart(own, begin - 1, kinds) : 0;
    const previous = begin > 0 ? tokenizer.decode(own.slice(before, begin)).trim() : "";
    return unelided.get(lower(short)).map((full) => {
      const whole = contracted.get(`${lower(previous)} ${full}`);
      return whole !== undefined ? [...own.slice(0, before), ...ids(`${cased(whole, previous)} ${target}`), ...rest]
        : [...own.slice(0, begin), ...ids(`${cased(full, short)} ${target}`), ...rest];
    });
  }
  if (elided && elides) return [[...own.slice(0, i), ...terms[0][1], ...rest]];
  return [[...own.slice(0, begin), ...terms[0][0], ...rest]];
}

// constrained.agreeing: the ways of writing `tokens` (a translation) with the article or determiner right before a term
// (spec.agreeing; spec.unelided's full forms) in each form it may take before that term, one place changed in each,
// `tokens` itself first where each such word may stand before its term as written.
export function agreeingWays(tokenizer, tokens, terms, targets, end, kinds, spec) {
  const same = (a, at, b) => b.every((x, k) => a[at + k] === x);
  const changed = [];
  let stands = true, p = 1;
  while (p < tokens.length) {
    const k = terms.findIndex((forms) => same(tokens, p, forms[0]));
    if (k < 0 || kinds.starts[tokens[p]] !== 1) { p++; continue; }
    const target = targets[k], n = terms[k][0].length;
    let before = wordStart(tokens, p - 1, kinds), words = tokenizer.decode(tokens.slice(before, p)).trim();
    if (before > 0) { // "de la", "à la": the article and the preposition before it
      const first = wordStart(tokens, before - 1, kinds);
      const two = `${tokenizer.decode(tokens.slice(first, before)).trim()} ${words}`;
      if (agreeingForms(two, target, spec)[1].length) { before = first; words = two; }
    }
    const [fits, others] = agreeingForms(words, target, spec);
    stands = stands && fits;
    for (const form of others) {
      let glued = tokenizer.targetIds(`${cased(form, words)}${/['’]$/.test(form) ? "" : " "}${target}`);
      if (glued.length && glued[glued.length - 1] === end) glued = glued.slice(0, -1);
      changed.push([...tokens.slice(0, before), ...glued, ...tokens.slice(p + n)]);
    }
    p += n;
  }
  return stands ? [tokens.slice(), ...changed] : changed;
}

// constrained._agreeing_forms: whether the article or determiner `words` may stand before `target` as written, and the
// other forms of its kind that may; [true, []] for words of no kind.
function agreeingForms(words, target, spec) {
  const key = words.toLowerCase(), elidedOf = elidedForms(spec);
  const kinds = spec.agreeing.filter(([consonant, vowel]) => consonant.includes(key) || vowel.includes(key));
  if (elidedOf.has(key)) kinds.push([[key], [`${elidedOf.get(key)}'`]]);
  if (!kinds.length) return [true, []];
  const first = [...target][0].toLowerCase(), plural = /[sxz]$/.test(target.toLowerCase());
  const fitting = [];
  for (const [consonant, vowel] of kinds) {
    for (const f of "hy".includes(first) ? [...consonant, ...vowel] : spec.elides.includes(first) ? vowel : consonant) {
      if (!spec.plural.includes(f) || plural) fitting.push(f);
    }
  }
  return [fitting.includes(key) || spec.plural.includes(key), [...new Set(fitting)].filter((f) => f !== key)];
}

// constrained.ELIDED: each full form of spec.unelided, by its elided form ("la" -> "l").
function elidedForms(spec) {
  const out = new Map();
  for (const [short, fulls] of Object.entries(spec.unelided)) for (const full of fulls) if (!out.has(full)) out.set(full, short);
  return out;
}

// constrained._cased: `word` with a capital first letter where `like` has one.
function cased(word, like) {
  const c = like.slice(0, 1);
  return c !== c.toLowerCase() && c === c.toUpperCase() ? word.slice(0, 1).toUpperCase() + word.slice(1) : word;
}

// constrained._word_start: where the word holding own[j] (an elided word's last piece) begins.
function wordStart(own, j, kinds) {
  if (j > 0 && kinds.bare[own[j]] === 1) j -= 1;
  while (j > 0 && kinds.starts[own[j]] !== 1) j -= 1;
  return j;
}

// constrained._read_each of one row: the log-probability of each token of `own` and then of the end token, reading `src`.
async function ownLogProbs(backend, src, own, rules) {
  let state = await backend.encode([src]);
  let token = [rules.start];
  const out = [];
  for (const tok of [...own, rules.end]) {
    const step = await backend.step(token, state);
    state = step.state;
    out.push(step.logProbs[tok]);
    token = [tok];
  }
  return out;
}

// constrained._read_each: the log-probability of each token of `own` (the end token's last) as the model reads
// each of `srcs`, in one padded batch.
async function ownLogProbsEach(backend, srcs, own, rules) {
  let state = await backend.encode(srcs);
  let token = srcs.map(() => rules.start);
  const out = srcs.map(() => []);
  for (const tok of [...own, rules.end]) {
    const step = await backend.step(token, state);
    state = step.state;
    srcs.forEach((_, r) => out[r].push(step.logProbs[r * step.vocab + tok]));
    token = srcs.map(() => tok);
  }
  return out;
}

// constrained.scored_each of one: `tokens` as a translation of `src`, its log-probability summed with the end token's.
export async function scored(backend, src, tokens, rules) {
  return { tokens, score: (await ownLogProbs(backend, src, tokens, rules)).reduce((a, b) => a + b, 0) };
}
