// A line as the model reads it and its translation given back, as toolkit/core/textprep.py and placeholders.py make
// them: the line cleaned (clean); for a model trained on tk's placeholders, its numbers, URLs, e-mail addresses and words
// the model does not spell protected (unspelledWords, protect); cut into sentences by sentencex (splitSentences); each
// sentence's case folded (caseOf) and the sentence cut into model inputs of at most two placeholders that fit the
// model's positions (modelInputs, by fitted: cut for cut Python's, counted in code points as Python counts a str's
// characters), each input's placeholders numbered from 0 (renumbered); a translation given its case and its spans
// back, each exactly once (finish, restore). Tests hold each to the Python (tests/convert/test_web.py).

// Python's str.isspace, which its \s and str.strip follow (JavaScript's \s differs: it takes U+FEFF, leaves U+001C-1F, U+0085).
const SPACE = "\\t-\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const IS_SPACE = new RegExp(`[${SPACE}]`, "u");
// textprep._SENTENCE_END, _CUT_AFTER and _CONJUNCTION ("\b" as Python's: a letter, digit or underscore of any script
// is a word's).
const SENTENCE_END = new RegExp(`[.!?…]["'»”’)\\]]*(?=[${SPACE}]|$)|[。！？]`, "gu");
const CUT_AFTER = new RegExp(`[,;:，；：、](?=[${SPACE}]|$)|[，；：、]`, "gu");
const CONJUNCTION = new RegExp(`[${SPACE}](?:and|or|but|nor|then|plus|while|whereas)(?![\\p{L}\\p{N}_])`, "giu");
const SYMBOL = /⦅(\d+)⦆/gu;
const ANY_SYMBOL = /⦅\p{Nd}+⦆/gu; // placeholders.SYMBOL_RE: Python's \d is any script's digit
// textprep._CONTROL: C0 and C1 controls other than tab.
const CONTROL = /[\x00-\x08\x0a-\x1f\x7f-\x9f]/gu;
const FRAGMENT = /⦅\d*|\d*⦆/g;
const TAIL = /[\s.!?…:;»"')\]]*$/u;
const CLOSING = { ")": "(", "]": "[", "}": "{" };
// textprep.PIECE_SHARE: a piece's translation, often longer than its source, must fit the same positions.
export const PIECE_SHARE = 0.75;

const strip = (cps) => {
  let a = 0, b = cps.length;
  while (a < b && IS_SPACE.test(cps[a])) a++;
  while (b > a && IS_SPACE.test(cps[b - 1])) b--;
  return cps.slice(a, b);
};

// Python's round(): halves to the even neighbour.
function roundHalfEven(x) {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 ? 2 * Math.round(x / 2) : r;
}

// textprep._joins: whether a cut before cps[i] would part a character from what belongs to it.
function joins(cps, i) {
  const c = cps[i];
  const regional = (x) => x !== undefined && x >= "\u{1f1e6}" && x <= "\u{1f1ff}";
  return /\p{M}/u.test(c) || c === "\u200c" || c === "\u200d" || (c >= "\ufe00" && c <= "\ufe0f")
    || (c >= "\u{1f3fb}" && c <= "\u{1f3ff}") || (regional(c) && i > 0 && regional(cps[i - 1]));
}

// Positions (code points) of a regex's matches in cps[lo, hi]: each astral character is one UTF-16 unit in the string
// searched (a letter or digit as "a", anything else as a private-use character), so offsets are code points.
function matches(re, cps, lo, hi, at) {
  const text = cps.slice(lo, hi + 1).map((c) => (c.length === 1 ? c : /[\p{L}\p{N}]/u.test(c) ? "a" : "\ue000")).join("");
  return [...text.matchAll(re)].map((m) => lo + at(m));
}

// textprep._inside_symbols: positions inside a placeholder symbol, where no cut may fall.
function insideSymbols(cps, lo, hi) {
  let start = -1;
  for (let i = Math.min(lo, cps.length - 1); i >= 0; i--) if (cps[i] === "⦅") { start = i; break; }
  if (start < 0 && !cps.slice(lo, hi + 1).includes("⦅")) return new Set();
  const out = new Set();
  for (const m of cps.slice(Math.max(0, start), hi + 1).join("").matchAll(ANY_SYMBOL)) {
    // a symbol is all BMP: its code units are code points (digits and brackets)
    const begin = Math.max(0, start) + [...cps.slice(Math.max(0, start), hi + 1).join("").slice(0, m.index)].length;
    for (let i = begin + 1; i < begin + m[0].length; i++) out.add(i);
  }
  return out;
}

// textprep._cut_near: where to end a piece begun at `start`, near `target` (within `reach`), the best kind of place
// there, the nearest to `target` of that kind (the first of equals); null where none lies after `start`.
function cutNear(cps, start, target, reach) {
  const lo = Math.max(start + 1, Math.trunc(target - reach)), hi = Math.min(cps.length - 1, Math.trunc(target + reach));
  const inside = insideSymbols(cps, lo, hi);
  const kinds = [
    () => matches(SENTENCE_END, cps, lo, hi, (m) => m.index + m[0].length),
    () => matches(CUT_AFTER, cps, lo, hi, (m) => m.index + m[0].length),
    () => matches(CONJUNCTION, cps, lo, hi, (m) => m.index + 1),
    () => cps.slice(lo, hi + 1).flatMap((c, k) => (IS_SPACE.test(c) ? [lo + k] : [])),
    () => cps.slice(lo, hi + 1).flatMap((_, k) => (joins(cps, lo + k) ? [] : [lo + k])),
  ];
  for (const places of kinds) {
    const found = places().filter((p) => start < p && p < cps.length && !inside.has(p));
    if (found.length) return found.reduce((best, p) => (Math.abs(p - target) < Math.abs(best - target) ? p : best));
  }
  return null;
}

// textprep.fitted: the text as one piece if its `tokens(text)` fit `limit`; else cut into the fewest pieces of at most
// PIECE_SHARE of the positions, each cut near its share of the characters at the best place there. Returns the pieces
// and the text's tokens where it was cut (0 where it was not); a piece with no place to cut stays whole (truncated).
export function fitted(text, tokens, limit) {
  const count = tokens(text);
  if (count <= limit || limit < 2) return { pieces: [text], whole: 0 };
  const cap = Math.max(1, Math.trunc(limit * PIECE_SHARE));
  const cut = (cps, n) => {
    if (n <= limit) return [cps];
    const parts = Math.ceil(n / cap), bounds = [];
    let start = 0;
    for (let k = 1; k < parts; k++) {
      const at = cutNear(cps, start, roundHalfEven((k * cps.length) / parts), cps.length / (2 * parts));
      if (at !== null && start < at && at < cps.length) { bounds.push(at); start = at; }
    }
    if (!bounds.length) return [cps];
    const kept = [0, ...bounds].map((a, k) => strip(cps.slice(a, [...bounds, cps.length][k]))).filter((p) => p.length);
    if (kept.length < 2) return [cps];
    return kept.flatMap((p) => cut(p, tokens(p.join(""))));
  };
  return { pieces: cut([...text], count).map((p) => p.join("")), whole: count };
}

// textprep._renumber: a piece's placeholders numbered from 0, and the line's spans they stand for, in that order.
export function renumbered(piece, spans) {
  const local = [];
  const text = piece.replace(SYMBOL, (_, i) => `⦅${local.push(spans[Number(i)]) - 1}⦆`);
  return { text, spans: local };
}

// textprep.clean: NFC, control characters and format characters (`format`: placeholders.FORMAT_RE's class, from
// model.json) removed, except a format character inside a `keep` term (an emoji's joiners), runs of whitespace collapsed.
export function clean(line, format, keep = []) {
  let text = line.normalize("NFC");
  if (text.search(CONTROL) >= 0 || text.search(format) >= 0) {
    text = text.replace(CONTROL, " ");
    if (text.search(format) >= 0) text = stripFormat(text, format, keep).normalize("NFC");
  }
  return text.split(new RegExp(`[${SPACE}]+`, "u")).filter(Boolean).join(" ");
}

// textprep._strip_format: format characters removed, except inside occurrences of the kept terms.
function stripFormat(text, format, keep) {
  const kept = termPatterns(keep, format).flatMap((p) => [...text.matchAll(p)].map((m) => [m.index, m.index + m[0].length]));
  let out = "", last = 0;
  for (const [start, end] of kept.sort((a, b) => a[0] - b[0] || a[1] - b[1])) {
    if (start >= last) { out += text.slice(last, start).replace(format, "") + text.slice(start, end); last = end; }
  }
  return out + text.slice(last).replace(format, "");
}

// placeholders.term_patterns: each kept term as written (NFC) and without its format characters, any run of
// whitespace where it has one.
function termPatterns(keep, format) {
  const forms = new Set();
  for (const term of keep) {
    const words = term.normalize("NFC").split(new RegExp(`[${SPACE}]+`, "u")).filter(Boolean).join(" ");
    forms.add(words);
    forms.add(words.replace(format, "").split(new RegExp(`[${SPACE}]+`, "u")).filter(Boolean).join(" "));
  }
  const escape = (w) => w.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&"); // the characters a "u" pattern may escape
  return [...forms].filter(Boolean).map((f) => new RegExp(f.split(" ").map(escape).join(`[${SPACE}]+`), "gu"));
}

// textprep.split_sentences: a cleaned (or protected) text's sentences, cut by sentencex's `segment` (its English
// rules), each stripped; the text itself where sentencex finds none.
export function splitSentences(text, segment) {
  const found = segment("en", text).map((s) => strip([...s]).join("")).filter(Boolean);
  return found.length ? found : text ? [text] : [];
}

// textprep.unspelled: the words of a line holding a character the model's tokenizer does not spell (spec.alphabet),
// without the punctuation around them (spec.around): kept as they are, as tk translate keeps them.
const PLAIN = /^[A-Za-z0-9 .,;:!?'"()\-]*$/;
export function unspelledWords(line, spec) {
  if (spec.alphabet === null || PLAIN.test(line)) return [];
  const alphabet = spec.alphabetSet ?? (spec.alphabetSet = new Set(spec.alphabet)), around = new Set(spec.around);
  if ([...line].every((c) => alphabet.has(c))) return [];
  const out = [];
  for (const word of line.split(new RegExp(`[${SPACE}]+`, "u")).filter(Boolean)) {
    if (!unspelled(word, spec)) continue;
    const chars = [...word];
    let a = 0, b = chars.length;
    while (a < b && around.has(chars[a])) a++;
    while (b > a && around.has(chars[b - 1])) b--;
    out.push(chars.slice(a, b).join(""));
  }
  return [...new Set(out)];
}

// The character before `i` and the one at it, whole where they lie outside the Basic Multilingual Plane.
const before = (text, i) => String.fromCodePoint(text.codePointAt(i >= 2 && /[\udc00-\udfff]/.test(text[i - 1]) ? i - 2 : i - 1));
const at = (text, i) => String.fromCodePoint(text.codePointAt(i));

// placeholders.whole_word: not glued to a letter or digit on either side (in a script written with spaces).
function wholeWord(text, start, end, unspaced) {
  const glued = (a, b) => /^[\p{L}\p{N}_]$/u.test(a) && /^[\p{L}\p{N}_]$/u.test(b) && !unspaced.test(a) && !unspaced.test(b);
  return !(start > 0 && glued(before(text, start), at(text, start))) && !(end < text.length && glued(before(text, end), at(text, end)));
}

// [start, end] of each whole-word occurrence of a kept word (placeholders.term_patterns, whole_word).
export function keptSpans(text, keep, spec) {
  const unspaced = new RegExp(spec.unspaced, "u"), found = [];
  for (const p of termPatterns(keep, new RegExp(spec.format, "gu"))) {
    for (const m of text.matchAll(p)) if (wholeWord(text, m.index, m.index + m[0].length, unspaced)) found.push([m.index, m.index + m[0].length]);
  }
  return found;
}

// placeholders.all_spans: [start, end] of every number, URL, e-mail address, typed placeholder and kept word, left to
// right; overlapping ones become one.
export function allSpans(text, keep, spec) {
  const found = spanOffsets(text, new RegExp(spec.spans, "gu"));
  if (!keep.length) return found;
  found.push(...keptSpans(text, keep, spec));
  const taken = [];
  for (const [start, end] of found.sort((a, b) => a[0] - b[0] || a[1] - b[1])) {
    if (taken.length && start < taken[taken.length - 1][1]) taken[taken.length - 1][1] = Math.max(end, taken[taken.length - 1][1]);
    else taken.push([start, end]);
  }
  return taken;
}

// placeholders._RUN_GAP: what may stand between spans kept as one.
const RUN_GAP = new RegExp(`^(?:[${SPACE},;/&\\-–—]*|[^${SPACE}]*)$`, "u");

// placeholders.merge_runs: `spans` ([start, end], in order) of `text` with only separators between them as one.
export function mergeRuns(text, spans) {
  const runs = [];
  for (const [s, e] of spans) {
    if (runs.length && RUN_GAP.test(text.slice(runs[runs.length - 1][1], s))) runs[runs.length - 1][1] = e;
    else runs.push([s, e]);
  }
  return runs;
}

// A cleaned line as placeholders.protect_terms gives it (without glossary terms) to a model trained on tk's
// placeholders: each number, URL, e-mail address and `keep` word a symbol, runs of them one (placeholders.merge_runs),
// numbered from 0; and the spans in that order.
export function protect(line, keep, spec) {
  const spans = mergeRuns(line, allSpans(line, keep, spec));
  let text = "", last = 0;
  spans.forEach(([start, end], i) => { text += `${line.slice(last, start)}⦅${i}⦆`; last = end; });
  return { text: text + line.slice(last), spans: spans.map(([s, e]) => line.slice(s, e)) };
}

// textprep.prepare's case of a sentence: "upper" (in capitals), "title" (Title Case) or "", folded to lowercase for
// the model and given back to its translation.
export const caseOf = (sentence) => (isAllCaps(sentence) ? "upper" : isTitleCase(sentence) ? "title" : "");

// textprep._pieces: a sentence cut so that no piece holds more than `perInput` symbols, each cut in the words between
// two of them: after a comma, semicolon or colon there, else before a conjunction, else at the first space.
function symbolPieces(sentence, perInput) {
  const symbols = [...sentence.matchAll(ANY_SYMBOL)];
  const out = [];
  let start = 0, held = 0;
  for (let k = 0; k + 1 < symbols.length; k++) {
    if (++held < perInput) continue;
    const end = symbols[k].index + symbols[k][0].length, gap = sentence.slice(end, symbols[k + 1].index);
    const clause = gap.search(/[,;:][^,;:]*$/u), conjunction = gap.search(new RegExp(CONJUNCTION.source, "iu"));
    const space = gap.search(IS_SPACE);
    const cut = clause >= 0 ? clause + 1 : conjunction >= 0 ? conjunction : space >= 0 ? space : null;
    if (cut === null) continue;
    out.push(strip([...sentence.slice(start, end + cut)]).join(""));
    start = end + cut;
    held = 0;
  }
  out.push(strip([...sentence.slice(start)]).join(""));
  return out.filter(Boolean);
}

// The model inputs of a sentence as textprep.prepare makes them: a protected sentence (`spans`: its symbols' spans,
// `fold`: its case) cut so that no input holds more than `perInput` symbols, then so that each fits `limit` tokens
// (fitted, counted as the model reads it: symbols numbered from 0, capitals folded); each input its text, its own spans
// and its case (a later piece is mid-sentence: it keeps capitals, but gets no capital first letter), and the piece as
// cut (`piece`: its symbols numbered as the sentence's). `whole`: the sentence's tokens where it was cut to fit, else 0.
export function modelInputs(sentence, spans, fold, tokens, limit, perInput) {
  const measure = (p) => tokens(fold ? renumbered(p, spans).text.toLowerCase() : renumbered(p, spans).text);
  const cut = (sentence.includes("⦅") ? symbolPieces(sentence, perInput) : [sentence]).map((p) => fitted(p, measure, limit));
  const pieces = cut.flatMap((c) => c.pieces);
  return {
    whole: Math.max(...cut.map((c) => c.whole)),
    inputs: pieces.map((p, k) => {
      const own = renumbered(p, spans);
      return { text: fold ? own.text.toLowerCase() : own.text, spans: own.spans, fold: k === 0 || fold === "upper" ? fold : "", piece: p };
    }),
  };
}

// textprep.prepare's first steps on one input line: cleaned, its spans protected (for a model trained on tk's
// placeholders: its numbers, URLs, e-mail addresses and words the model does not spell, and a glossary's terms,
// glossary.protectLine) and cut into sentences by `segment` (sentencex's); each sentence's `text`, its line's `spans`
// and, where the line holds glossary terms, the source term each span stands for (`sources`). Protected before they
// are cut: a period inside an address is no sentence end, and a term's symbol is no capital that starts a sentence.
export function lineSentences(line, spec, segment, glossary = null) {
  const keep = spec.placeholders ? unspelledWords(line, spec) : [], text = clean(line, new RegExp(spec.format, "gu"), keep);
  if (!text) return [];
  const terms = glossary && spec.placeholders ? glossary.protectLine(text, keep) : null;
  const protectedLine = terms ?? (spec.placeholders ? protect(text, keep, spec) : { text, spans: [] });
  return splitSentences(protectedLine.text, segment).map((s) => ({ text: s, spans: protectedLine.spans, sources: terms?.sources }));
}

// textprep.prepare's model inputs of one of lineSentences' sentences: cut so that none holds more than per_input
// symbols and each fits `limit` positions (`count`: a text's tokens); `whole` as modelInputs gives it, and each input's
// text, spans and case, and where a glossary's terms are in its sentence, the input's glossary forms (`form`:
// glossary.pieces' or, for a model not trained on placeholders, glossary.writtenPieces').
export function sentenceInputs(sentence, spec, glossary, count, limit) {
  const prepared = sentence.sources ? glossary.pieces(sentence.text, sentence.spans, sentence.sources, count, limit)
    : glossary && !spec.placeholders ? glossary.writtenPieces(sentence.text, count, limit) : null;
  if (prepared) {
    return { whole: prepared.whole, inputs: prepared.pieces.map((form) => (form.protected === null
      ? { text: form.text, spans: [], fold: "", form } : { text: form.protected, spans: form.kept, fold: form.fold, form })) };
  }
  if (spec.placeholders) return modelInputs(sentence.text, sentence.spans, caseOf(sentence.text), count, limit, spec.per_input);
  const { pieces, whole } = fitted(sentence.text, count, limit);
  return { whole, inputs: pieces.map((p) => ({ text: p, spans: [], fold: "" })) };
}

// placeholders.all_spans without terms: [start, end] of each match of `pattern` (placeholders.SPAN_RE: numbers, URLs,
// e-mail addresses, typed placeholders), a URL without the punctuation that closes its sentence (placeholders.url_end).
export function spanOffsets(text, pattern) {
  return [...text.matchAll(pattern)].map((m) => {
    let end = m.index + m[0].length;
    if (m.groups.url) { // closing punctuation is the sentence's, and so is an unbalanced bracket
      const start = m.index, n = (c) => [...text.slice(start, end)].filter((x) => x === c).length;
      while (end - start > 1 && ".,;:!?'\")]}".includes(text[end - 1])) {
        const opener = CLOSING[text[end - 1]];
        if (opener && n(opener) >= n(text[end - 1])) break;
        end--;
      }
    }
    return [m.index, end];
  });
}

// textprep.unspelled: whether a word holds a character the model's tokenizer does not spell (spec.alphabet), the
// punctuation around it (spec.around) aside; control and format characters, spaces and combining marks count for none.
export function unspelled(word, spec) {
  const around = new Set(spec.around);
  const chars = [...word];
  let start = 0, end = chars.length;
  while (start < end && around.has(chars[start])) start++;
  while (end > start && around.has(chars[end - 1])) end--;
  const alphabet = spec.alphabetSet ?? (spec.alphabetSet = new Set(spec.alphabet));
  return chars.slice(start, end).some((c) => !alphabet.has(c) && !/[\p{C}\p{Z}\p{M}]/u.test(c));
}


// textprep.is_all_caps, is_title_case: by the Unicode properties Python's str.isupper, islower and isalpha read.
const isAlpha = (c) => /\p{L}/u.test(c), isLower = (c) => /\p{Lowercase}/u.test(c), isUpper = (c) => /\p{Uppercase}/u.test(c);
const cased = (c) => isUpper(c) || isLower(c) || c.toLowerCase() !== c.toUpperCase();

export function isAllCaps(text) {
  const chars = [...text];
  if (chars.some((c) => isLower(c) && isAlpha(c))) return false;
  let upper = 0;
  for (const c of chars) {
    if (isUpper(c)) upper += isAlpha(c);
    else if (isAlpha(c) && cased(c)) return false;
  }
  return upper >= 3;
}

export function isTitleCase(text) {
  const split = text.split(/\s+/u).filter(Boolean);
  if (split.length < 3 || split.some((w) => isLower([...w][0]) && isAlpha([...w][0]))) return false;
  const firsts = split.map((w) => [...w].find((c) => isAlpha(c) && cased(c))).filter(Boolean);
  return firsts.length >= 3 && firsts.every(isUpper) && !isAllCaps(text);
}

// textprep.finish: a model input's translation with its case given back and its spans restored.
export function finish(fold, text, spans, report = []) {
  if (fold === "upper") text = text.toUpperCase();
  else if (fold === "title") text = text.slice(0, 1).toUpperCase() + text.slice(1);
  return restore(text, spans, report);
}

// placeholders.restore: each span back exactly once, whatever the model did with its symbol; what had to be repaired
// is appended to `report` (a word per repair: "dropped", "repeated or invented", "broken").
export function restore(text, spans, report = []) {
  if (!spans.length && !text.includes("⦅") && !text.includes("⦆")) return text;
  const parts = text.split(new RegExp(SYMBOL.source, "g"));
  const words = parts.filter((_, i) => i % 2 === 0).map((w) => {
    report.push(...(w.match(FRAGMENT) ?? []).map(() => "broken"));
    return w.replace(FRAGMENT, " ");
  });
  const given = [], wrong = [];
  parts.filter((_, i) => i % 2 === 1).map(Number).forEach((i, k) => {
    const fresh = i < spans.length && !given.includes(i);
    given.push(fresh ? i : null);
    if (!fresh) wrong.push(k);
  });
  const missing = spans.map((_, i) => i).filter((i) => !given.includes(i));
  for (const k of wrong) {
    report.push(missing.length ? "dropped" : "repeated or invented");
    if (missing.length) given[k] = missing.shift();
  }
  if (missing.length) {
    report.push(...missing.map(() => "dropped"));
    const w = words[words.length - 1], tail = w.search(TAIL);
    words[words.length - 1] = `${w.slice(0, tail)} ${missing.map((i) => spans[i]).join(" ")}${w.slice(tail)}`;
  }
  let out = words[0];
  given.forEach((i, k) => { out += (i !== null ? spans[i] : "") + words[k + 1]; });
  return out.split(/\s+/u).filter(Boolean).join(" ");
}

