// Glossaries in the page: a port of toolkit/core/glossary.py (reading the terms, finding them in a line, the checks
// holds and tacked_on), of what toolkit/core/textprep.py and placeholders.py do to a line that holds terms, and of
// toolkit/deploy/translate.py's three steps (_forced: the model alone, then the targets forced in by constrained.mjs,
// then placeholders). The constants and patterns come from model.json's glossary entry, which toolkit/convert/web.py
// writes from the Python definitions.

import { decodeIds, lengthLimits, retried, wordBoundary, wordEnd } from "./decoding.mjs";
import { agreeingWays, constrainedSearch, scored, termSwaps, termWord } from "./constrained.mjs";
import { confidenceOf } from "./confidence.mjs";
import { allSpans, caseOf, finish, fitted, keptSpans, mergeRuns, modelInputs, renumbered } from "./textprep.mjs";

const W = "\\p{L}\\p{N}_"; // Python's \w on str: letters, numbers, underscore
const WORDS = new RegExp(`[${W}]+`, "gu");
const CONTROL = /[\x00-\x1f\x7f-\x9f]/u;
const ALNUM = /^[\p{L}\p{N}_]$/u;
const SYMBOL = /⦅(\d+)⦆/gu;
// Python's " ".join(text.split()) on a cleaned text (whose only whitespace is single spaces).
const words = (text) => text.split(" ").filter(Boolean).join(" ");
const fold = (s) => s.toUpperCase().toLowerCase(); // str.casefold's "ß" -> "ss" too
const count = (items) => items.reduce((m, x) => m.set(x, (m.get(x) ?? 0) + 1), new Map());

// Python's repr of a str, as the Python messages quote terms.
const repr = (s) => (s.includes("'") && !s.includes('"') ? `"${s}"` : `'${s.replaceAll("\\", "\\\\").replaceAll("'", "\\'")}'`);

export class Glossary {
  // spec: model.json's glossary entry.
  constructor(spec) {
    const unspaced = spec.unspaced.slice(1, -1);
    this.spec = spec;
    this.word = new RegExp(`[${unspaced}]|(?:(?![${unspaced}])[${W}])+|[^${W}\\s]`, "gu");
    this.unspaced = new RegExp(spec.unspaced, "u");
    this.format = new RegExp(spec.format, "gu");
    this.trie = new Map();
    this.seen = new Map(); // key -> [source as written, target, where]
    this.size = 0;
  }

  // A TSV text's glossary (glossary.parse): a bad line is an Error naming it, in Python's words.
  static parse(text, name, spec) {
    const g = new Glossary(spec);
    const lines = text.replace(/^\ufeff/, "").split("\n");
    lines.forEach((raw, i) => {
      const line = raw.replace(/\r$/, "");
      if (!line.trim()) return;
      const fields = line.split("\t");
      if (fields.length !== 2) {
        const what = fields.length === 1 ? "has no TAB" : `has ${fields.length - 1} TABs`;
        throw new Error(`glossary ${name} line ${i + 1} ${what}; write each line as source term, TAB, target term`);
      }
      const problem = g.add(fields[0], fields[1], `line ${i + 1}`);
      if (problem) throw new Error(`glossary ${name} line ${i + 1}: ${problem}`);
    });
    if (!g.size) throw new Error(`glossary ${name} has no terms; write one a line as source term, TAB, target term`);
    return g;
  }

  // An object's glossary (glossary.from_mapping); null for an empty one.
  static fromObject(object, spec) {
    if (object === null || object === undefined) return null;
    if (typeof object !== "object" || Array.isArray(object)) {
      throw new Error(`glossary must be an object of source term -> target term, e.g. {"house": "demeure"} (got ${Array.isArray(object) ? "an array" : typeof object})`);
    }
    const g = new Glossary(spec);
    for (const [source, target] of Object.entries(object)) {
      if (typeof target !== "string") throw new Error(`glossary: each term must be a string (got ${JSON.stringify(source)}: ${JSON.stringify(target)})`);
      const problem = g.add(source, target, `entry ${repr(source)}`);
      if (problem) throw new Error(`glossary entry ${repr(source)}: ${problem}`);
    }
    return g.size ? g : null;
  }

  // glossary.term_key: the term's words (NFC, without format characters, case-folded), each with whether a space comes before.
  key(term) {
    const text = term.normalize("NFC").replace(this.format, "");
    const out = [];
    let last = null;
    for (const m of text.matchAll(this.word)) {
      out.push([fold(m[0]), last !== null && m.index > last]);
      last = m.index + m[0].length;
    }
    return out;
  }

  problem(term, side) {
    if (!term.trim() || (side === "source" && !this.key(term).length)) return `its ${side} term is empty`;
    const chars = [...term].length;
    if (chars > this.spec.max_term_chars) return `its ${side} term has ${chars} characters, more than ${this.spec.max_term_chars}`;
    const bad = term.match(CONTROL);
    if (bad) return `its ${side} term holds a control character (U+${bad[0].codePointAt(0).toString(16).toUpperCase().padStart(4, "0")})`;
    const bracket = term.match(/[⦅⦆]/u); // placeholders' symbols are ⦅N⦆: a target holding one would be read back as a span
    if (bracket) return `its ${side} term holds ${bracket[0]}, which tk keeps for the spans it copies; write the term without it`;
    return null;
  }

  add(source, target, where) {
    target = target.normalize("NFC").split(/\s+/u).filter(Boolean).join(" ");
    const problem = this.problem(source, "source") ?? this.problem(target, "target");
    if (problem) return problem;
    const key = this.key(source), id = JSON.stringify(key);
    const seen = this.seen.get(id);
    if (seen) {
      if (seen[1] === target) return null;
      return `its source term ${repr(source)} is the term ${repr(seen[0])} of ${seen[2]} (terms match whatever their case), `
        + `with another target (${repr(seen[1])} there, ${repr(target)} here); keep one`;
    }
    this.seen.set(id, [source, target, where]);
    this.size++;
    let node = this.trie;
    for (const [word, spaced] of key) {
      const k = `${+spaced}${word}`;
      if (!node.has(k)) node.set(k, new Map());
      node = node.get(k);
    }
    node.end = [target, source.normalize("NFC").replace(this.format, "").split(/\s+/u).filter(Boolean).join(" ")];
    return null;
  }

  // Glossary.find: [start, end, target, source as written] of each occurrence, left to right, the longest of overlapping
  // ones; one that overlaps one of `spans` without holding it whole is left to the span.
  find(text, spans) {
    const words = [...text.matchAll(this.word)].map((m) => [m.index, m.index + m[0].length, fold(m[0])]);
    const found = [];
    words.forEach(([start], i) => {
      let node = this.trie.get(`0${words[i][2]}`), j = i;
      while (node) {
        if (node.end) found.push([start, words[j][1], ...node.end]);
        if (++j === words.length) break;
        node = node.get(`${+(words[j][0] > words[j - 1][1])}${words[j][2]}`);
      }
    });
    const taken = [];
    for (const f of found.sort((a, b) => (a[0] - a[1]) - (b[0] - b[1]) || a[0] - b[0])) {
      if (taken.some(([s, e]) => s < f[1] && f[0] < e)) continue;
      if (!spans.some(([s, e]) => s < f[1] && f[0] < e && !(f[0] <= s && e <= f[1]))) taken.push(f);
    }
    return taken.sort((a, b) => a[0] - b[0]);
  }

  glued(a, b) {
    return ALNUM.test(a) && ALNUM.test(b) && !this.unspaced.test(a) && !this.unspaced.test(b);
  }

  // placeholders.whole_word
  wholeWord(text, start, end) {
    return !(start > 0 && this.glued(text[start - 1], text[start])) && !(end < text.length && this.glued(text[end - 1], text[end]));
  }

  // glossary.count: how often `target` stands in `text` as written, as a whole word.
  count(text, target) {
    let found = 0;
    for (let at = text.indexOf(target); at >= 0; at = text.indexOf(target, at + 1)) found += this.wholeWord(text, at, at + target.length);
    return found;
  }

  // glossary.holds: each target exactly as often as `targets` lists it, as written, as whole words.
  holds(text, targets) {
    for (const [target, n] of count(targets)) if (this.count(text, target) !== n) return false;
    return true;
  }

  // placeholders.protect_terms on a cleaned line, for a model trained on placeholders (null where the line holds no
  // term): the line with each span a symbol numbered from 0 (`text`), what each puts back (`spans`: its text, or a
  // term's target) and the source term each stands for as the model is shown it (`sources`: capitalised where the
  // line's is, placeholders._cased_as; null for a span that is no term). `keep`: the line's words the model does not
  // spell (textprep.unspelled), copied as they are. app.mjs cuts this line into sentences, as textprep.prepare does.
  protectLine(text, keep) {
    const spans = allSpans(text, keep, this.spec);
    let terms = this.find(text, spans);
    if (terms.length && keep.length) { // an occurrence within a kept word is the word's: copied as it is
      const verbatim = keptSpans(text, keep, this.spec);
      terms = terms.filter(([start, end]) => !verbatim.some(([s, e]) => s <= start && end <= e));
    }
    if (!terms.length) return null;
    // A span inside a term is the term's ("Windows 10"), spans with only separators between them are one run, and a
    // term a run took in is left to the run.
    const runs = mergeRuns(text, spans.filter(([s, e]) => !terms.some(([start, end]) => start <= s && e <= end)));
    const kept = terms.filter(([start, end]) => !runs.some(([s, e]) => s < end && start < e));
    const chosen = [...runs.map(([s, e]) => [s, e, text.slice(s, e), null]),
      ...kept.map(([s, e, target, source]) => [s, e, target, /^\p{Lu}/u.test(text.slice(s, e)) ? source[0].toUpperCase() + source.slice(1) : source])]
      .sort((a, b) => a[0] - b[0]);
    let line = "", last = 0;
    chosen.forEach(([start, end], i) => { line += `${text.slice(last, start)}⦅${i}⦆`; last = end; });
    return { text: line + text.slice(last), spans: chosen.map((c) => c[2]), sources: chosen.map((c) => c[3]) };
  }

  // The model inputs of one sentence of a line protectLine protected (its symbols numbered as the line's `spans`,
  // standing for `sources`), as textprep.prepare makes them: `whole`, its tokens where it was cut to fit `limit`
  // positions (0 where it was not), and `pieces`, each one input: its placeholder form (`protected`, each span a symbol
  // numbered from 0, `kept` what each puts back), its case (`fold`), whether it holds a term (`holds`: its placeholder
  // form puts the target back), and its form with the terms as the glossary writes them (`forced`; null for an input
  // holding no term, or a sentence in capitals, whose targets must stay as written), their targets and its text
  // without them (`without`). A sentence of more terms and spans than one input holds (per_input) is cut between them,
  // and one too long for the model into pieces that fit (modelInputs); `count`: a text's tokens.
  pieces(sentence, spans, sources, count, limit) {
    const fold = caseOf(sentence);
    const { whole, inputs } = modelInputs(sentence, spans, fold, count, limit, this.spec.per_input);
    const holds = (piece) => [...piece.matchAll(SYMBOL)].some((m) => sources[Number(m[1])] !== null);
    return { whole, pieces: inputs.map((input) => ({ protected: input.text, kept: input.spans, fold: input.fold, holds: holds(input.piece),
      ...(fold === "upper" ? { forced: null, targets: [] } : withTerms(input.piece, spans, sources, Boolean(fold))) })) };
  }

  // For a model not trained on placeholders, a cleaned sentence's model inputs as textprep.prepare makes them (null
  // where it holds no term): cut to fit (fitted), each piece as written with its own terms (textprep._as_written).
  writtenPieces(sentence, count, limit) {
    if (!this.find(sentence, allSpans(sentence, [], this.spec)).length) return null;
    const { pieces, whole } = fitted(sentence, count, limit);
    return { whole, pieces: pieces.map((piece) => this.asWritten(piece)) };
  }

  // textprep._as_written: a piece for a model not trained on placeholders, as it is, with its terms' targets (forced
  // null where it holds none); its text without the terms (Segment.without_terms).
  asWritten(piece) {
    const terms = this.find(piece, allSpans(piece, [], this.spec));
    if (!terms.length) return { forced: null, text: piece, protected: null, spans: [], targets: [], fold: "" };
    const without = terms.map(([start], k) => piece.slice(k ? terms[k - 1][1] : 0, start)).join("") + piece.slice(terms[terms.length - 1][1]);
    return { forced: piece, text: piece, protected: null, spans: [], targets: terms.map((t) => t[2]), fold: "", without: words(without) };
  }
}

// textprep._with_terms: a model input (its symbols numbered as its sentence's spans `put`) with its terms' symbols back
// to the source terms (`sources`, null for a span that is no term), the targets they stand for, and its text with them
// taken out; lowercase where its sentence was folded. forced null where it holds no term.
function withTerms(piece, put, sources, lower) {
  const targets = [];
  const text = piece.replace(SYMBOL, (m, i) => (sources[Number(i)] === null ? m : (targets.push(put[Number(i)]), sources[Number(i)])));
  if (!targets.length) return { forced: null, targets };
  const own = renumbered(text, put), cut = words(renumbered(piece.replace(SYMBOL, (m, i) => (sources[Number(i)] === null ? m : "")), put).text);
  return { forced: lower ? own.text.toLowerCase() : own.text, spans: own.spans, targets, without: lower ? cut.toLowerCase() : cut };
}

// glossary.tacked_on: every word of the model's own translation is still there besides the targets.
export function tackedOn(text, own, targets) {
  const rest = count(fold(text).match(WORDS) ?? []);
  for (const w of targets.flatMap((t) => fold(t).match(WORDS) ?? [])) rest.set(w, (rest.get(w) ?? 0) - 1);
  return [...count(fold(own).match(WORDS) ?? [])].every(([w, n]) => n <= (rest.get(w) ?? 0));
}

// The translation of a sentence holding terms, by a model not trained on tk's placeholders, from its plain decode
// (`tokens`, of that `confidence`): the model's own where it holds the targets, else reported as
// translate.decode_segments reports it (confidence `failed`).
export function finished(glossary, form, tokens, text, lineno, confidence, failed) {
  if (glossary.holds(text, form.targets)) return { text, tokens, glossary: "model", confidence };
  const terms = [...new Set(form.targets)].map(repr).join(", ");
  return { text, tokens, glossary: "missed", confidence: failed, warning: `warning: line ${lineno}: its glossary targets (${terms}) could not be forced into its `
    + "translation (this model was not trained on tk's placeholders, which would put them back); its output is the model's own translation without them" };
}

// DecodingRules.normalized
export const normalized = (rules, score, tokens, alpha, ended = true) => (rules.length_penalty === "hf"
  ? score / Math.max(1, tokens + Number(ended)) ** alpha : score / ((5 + tokens + 1) / 6) ** alpha);

// constrained.term_forms: a target's ids as a word of its own, and for a target an article is elided before (`elides`,
// constrained.ELIDES), glued to an elided word ("l'automobile").
function termForms(tokenizer, target, end, elides) {
  const [alone, prefix, glued] = [target, "l'", `l'${target}`].map((t) => {
    const ids = tokenizer.targetIds(t);
    return ids.length && ids[ids.length - 1] === end ? ids.slice(0, -1) : ids;
  });
  const after = glued.slice(prefix.length), same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
  const first = ([...target][0] ?? "").toUpperCase().toLowerCase(); // str.casefold of its first letter, a substring of elides
  return elides.includes(first) && same(glued.slice(0, prefix.length), prefix) && after.length ? [alone, after] : [alone];
}

// translate._forced for the model inputs holding terms (forms: glossary.pieces' or writtenPieces', by key): by key, each input's
// {text, tokens, glossary: "model" | "forced", confidence} by the same steps and checks as Python; an input left out is
// translated as its placeholder form (step 3, app.mjs, with the inputs without terms).
// Over 60 lines: the three steps in order, each a batch as in translate.py.
export async function translateTerms(glossary, backend, tokenizer, model, forms, opts, languages) {
  const spec = model.glossary, rules = opts.rules, alpha = opts.alpha ?? rules.alpha;
  const done = new Map();
  const lines = [...forms.keys()].filter((i) => forms.get(i).forced !== null);
  const ids = lines.map((i) => tokenizer.encode(forms.get(i).forced, languages));
  const wanted = lines.filter((_, k) => ids[k].length > 0 && ids[k].length <= model.max_len);
  // The model's own translations, as tk translate makes them (a guard's cut decoded again, ended on a word).
  const ownIds = wanted.map((i) => ids[lines.indexOf(i)]);
  const own = await retried(backend, ownIds, await decodeIds(backend, ownIds, opts), opts, model.retry);
  const kinds = kindsOf(spec, model), boundary = wordBoundary(model.words, kinds.starts.length);
  // A translation's confidence, as decode_sentences gives it to the forced form's (confidence.mjs), capped where its
  // spans were repaired (translate._line_of).
  const trust = (form, h, report) => {
    const raw = tokenizer.decode(h.tokens), score = normalized(rules, h.score, h.tokens.length, alpha, !h.stopped);
    const p = confidenceOf(model.confidence, form.forced, raw, score, h.stopped ?? "");
    return report.length ? Math.min(p, model.confidence.repaired_max) : p;
  };
  for (const [w, i] of wanted.entries()) {
    // Nothing but terms ("House"): their placeholder form gives the targets as they are (translate._forced).
    if (forms.get(i).protected !== null && !/\p{L}/u.test(forms.get(i).without)) continue;
    const form = forms.get(i), mine = { ...own[w][0], tokens: wordEnd(own[w][0].tokens, own[w][0].rest, boundary) };
    const mineReport = [], mineText = finish(form.fold, tokenizer.decode(mine.tokens), form.spans, mineReport);
    if (!mine.stopped && glossary.holds(mineText, form.targets)) {
      done.set(i, { text: mineText, tokens: mine.tokens, glossary: "model", confidence: trust(form, mine, mineReport) });
      continue;
    }
    const terms = form.targets.map((t) => termForms(tokenizer, t, rules.end, spec.elides));
    if (terms.every((f) => f[0].length)) {
      const src = ids[lines.indexOf(i)];
      const limit = lengthLimits([src], Math.min(opts.maxLen, model.max_len), opts.maxLenA, opts.maxLenB)[0];
      const mineScore = normalized(rules, mine.score, mine.tokens.length, alpha);
      // translate._passes: holds each target as often as asked, not tacked on, within the margin of the model's own.
      const passes = (h) => {
        if (!h) return false;
        const text = finish(form.fold, tokenizer.decode(h.tokens), form.spans);
        return glossary.holds(text, form.targets) && !tackedOn(text, mineText, form.targets)
          && normalized(rules, h.score, h.tokens.length, alpha) > mineScore - spec.forced_margin;
      };
      let h = await constrainedSearch(backend, src, terms, limit, Math.max(opts.beam, spec.forced_beam), alpha, rules, kinds, normalized);
      const better = (a, b) => b === null || normalized(rules, a.score, a.tokens.length, alpha) > normalized(rules, b.score, b.tokens.length, alpha);
      const sameIds = (a, b) => a.length === b.length && a.every((x, k) => x === b[k]);
      const ways = h === null ? [] : agreeingWays(tokenizer, h.tokens, terms, form.targets, rules.end, kinds, spec);
      if (ways.length && !(ways.length === 1 && sameIds(ways[0], h.tokens))) {
        // translate._constrained: the article before a term in the form the model scores best of those that may stand there
        let best = sameIds(ways[0], h.tokens) ? h : null;
        for (const way of ways) {
          if (sameIds(way, h.tokens)) continue;
          const s = await scored(backend, src, way, rules);
          if (better(s, best)) best = s;
        }
        h = best;
      }
      const mineRaw = tokenizer.decode(mine.tokens);
      const ownWord = async () => { // translate._own_word: the model's own translation's ids, and its word for the terms
        const without = tokenizer.encode(form.without, languages), ownTarget = tokenizer.targetIds(mineRaw);
        if (!without.length) return null;
        const ownIds = ownTarget[ownTarget.length - 1] === rules.end ? ownTarget.slice(0, -1) : ownTarget;
        const found = await termWord(backend, tokenizer, src, ownIds, rules, kinds, without, spec);
        return found === null ? null : { ownIds, found };
      };
      const swapped = async (where) => { // translate._swapped: the model's own with its word for a target swapped for it
        if (where === null) return null;
        let best = null; // the way of writing it the model scores best, the first of equals
        const seen = new Set();
        for (const swap of termSwaps(tokenizer, where.ownIds, where.found, terms, form.targets[0], rules, kinds, spec)) {
          for (const way of agreeingWays(tokenizer, swap, terms, form.targets, rules.end, kinds, spec)) {
            if (seen.has(way.join(","))) continue;
            seen.add(way.join(","));
            const s = await scored(backend, src, way, rules);
            if (better(s, best)) best = s;
          }
        }
        return best;
      };
      // translate._kept_own_word: the model's own word for the term as often as in its own translation, the targets'
      // own words aside ("fille" in "jeune fille").
      const kept = (x, word) => {
        const outside = (text) => glossary.count(text, word)
          - [...new Set(form.targets)].reduce((n, t) => n + glossary.count(text, t) * glossary.count(t, word), 0);
        const n = outside(mineRaw);
        return n > 0 && outside(tokenizer.decode(x.tokens)) >= n;
      };
      if (passes(h)) {
        const where = await ownWord(); // the search put the target in beside the model's own word: the swap, where it
        if (where !== null && kept(h, where.found.text)) { // passes, whatever the two score: the model's word said twice
          const s = await swapped(where); // is the worse mistake ("une banque fric")
          if (passes(s)) h = s;
        }
      } else {
        h = await swapped(await ownWord());
      }
      if (passes(h)) {
        const report = [], text = finish(form.fold, tokenizer.decode(h.tokens), form.spans, report);
        done.set(i, { text, tokens: h.tokens, glossary: "forced", confidence: trust(form, h, report) });
      }
    }
  }
  return done;
}

// Per output id: whether it begins a word (model.json's words), ends in an apostrophe, ends a sentence (constrained.
// _piece_kinds, from model.json's glossary).
function kindsOf(spec, model) {
  const vocab = model.decoder.outputs.find((o) => o.name === "log_probs").dims[1];
  const mark = (ids, value) => { const a = new Uint8Array(vocab).fill(1 - value); ids.forEach((i) => { a[i] = value; }); return a; };
  return { starts: mark(model.words.inside_word, 0), apostrophes: mark(spec.apostrophe, 1), ends: mark(spec.sentence_end, 1),
    bare: mark(spec.bare_apostrophe, 1), stubs: mark(spec.elision_stub, 1) };
}
