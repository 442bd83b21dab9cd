// A line as the model reads it, as toolkit/core/textprep.py makes it: cleaned (clean), cut into its sentences by
// sentencex as in Python (sentences), a sentence too long for the model cut into pieces that fit rather than truncated
// (fitted, cut for cut: the same places, counted in code points as Python counts a str's characters), and the
// placeholders of each piece numbered from 0 as the model was trained (renumbered).

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
// model.json) removed, runs of whitespace collapsed.
export function clean(line, format) {
  let text = line.normalize("NFC");
  if (text.search(CONTROL) >= 0 || text.search(format) >= 0) text = text.replace(CONTROL, " ").replace(format, "").normalize("NFC");
  return text.split(new RegExp(`[${SPACE}]+`, "u")).filter(Boolean).join(" ");
}

// textprep.prepare's sentences of a line ([] for an empty one): the cleaned line cut by sentencex's `segment` (its
// English rules, as textprep.split_sentences), each stripped; the line itself where sentencex finds none.
export function sentences(line, segment, format) {
  const text = clean(line, format);
  if (!text) return [];
  const found = segment("en", text).map((s) => strip([...s]).join("")).filter(Boolean);
  return found.length ? found : [text];
}
