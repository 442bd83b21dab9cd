// SentencePiece Unigram tokenizer in plain JavaScript, giving the ids Python SentencePiece gives.
//
// It follows sentencepiece's own encoder (unigram_model.cc, EncodeOptimized) step for step,
// because "close" is not enough: a tokenizer that differs on one id gives a different
// translation. The details that matter: the Viterbi runs over UTF-8 bytes with float32 sums
// and keeps the first best path on ties; user-defined pieces score (bytes * max_score - 0.1) in
// double precision; unused pieces are skipped; a character no piece covers becomes <unk>, which
// byte fallback then spells as one <0xXX> piece per UTF-8 byte.
// tokenizer.json is written by toolkit/web_tokenizer.py from the model's tokenizer.model.

const NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6;
const FLT_MIN = 1.1754943508222875e-38; // sentencepiece starts max_score at FLT_MIN, not -FLT_MAX
const UNK_PENALTY = 10.0;
const SPACE = "\u2581";
// Python's str.split() separators (toolkit.tokenizer.normalize): JavaScript's \s lacks \x1c-\x1f
// and \x85, and has \ufeff, which Python keeps.
const PY_WHITESPACE = /[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/u;
const utf8 = new TextEncoder();

export class Tokenizer {
  constructor(spec) {
    this.spec = spec;
    this.pieces = spec.pieces.map((p) => p[0]);
    this.scores = Float32Array.from(spec.pieces.map((p) => p[1]));
    this.types = spec.pieces.map((p) => p[2]);
    this.lookup = new Map(); // piece -> id, for the pieces sentencepiece puts in its trie
    this.bytePiece = new Int32Array(256).fill(-1);
    let min = Infinity, max = FLT_MIN, longest = 1;
    this.pieces.forEach((piece, id) => {
      const type = this.types[id];
      if (type === NORMAL || type === USER_DEFINED || type === UNUSED) {
        this.lookup.set(piece, id);
        longest = Math.max(longest, [...piece].length);
      }
      if (type === NORMAL) {
        min = Math.min(min, this.scores[id]);
        max = Math.max(max, this.scores[id]);
      }
      if (type === UNKNOWN) this.unkId = id;
      if (type === BYTE) this.bytePiece[parseInt(piece.slice(3, 5), 16)] = id;
    });
    this.minScore = Math.fround(min);
    this.maxScore = Math.fround(max);
    this.longest = longest;
  }

  static async fetch(url) {
    const response = await fetch(url);
    if (!response.ok) throw new Error(`cannot load ${url}: HTTP ${response.status}`);
    return new Tokenizer(await response.json());
  }

  // toolkit.tokenizer.normalize: NFKC, whitespace runs to one space, stripped.
  static normalize(text) {
    return text.normalize("NFKC").split(PY_WHITESPACE).filter((w) => w.length > 0).join(" ");
  }

  // sentencepiece's normaliser for this model (identity rule): extra spaces removed, a dummy
  // prefix added, spaces written as U+2581.
  spNormalize(text) {
    const n = this.spec.normalizer;
    let s = text;
    if (n.remove_extra_whitespaces) s = s.split(/ +/).filter((w) => w.length > 0).join(" ");
    if (s.length === 0) return s;
    if (n.add_dummy_prefix) s = " " + s;
    return n.escape_whitespaces ? s.replaceAll(" ", SPACE) : s;
  }

  // Ids of one text, exactly as Tokenizer.encode in Python (toolkit.tokenizer) gives them.
  encode(text) {
    const chars = [...this.spNormalize(Tokenizer.normalize(text))];
    const n = chars.length;
    const bytes = chars.map((c) => utf8.encode(c).length);
    // Best path ending at each character boundary: score (float32), start, piece id.
    const score = new Float32Array(n + 1), start = new Int32Array(n + 1).fill(-1), id = new Int32Array(n + 1);
    const unkScore = Math.fround(this.minScore - UNK_PENALTY);
    for (let s = 0; s < n; s++) {
      const here = score[s];
      let hasSingle = false, piece = "", length = 0;
      for (let e = s + 1; e <= Math.min(n, s + this.longest); e++) {
        piece += chars[e - 1];
        length += bytes[e - 1];
        const pid = this.lookup.get(piece);
        if (pid === undefined || this.types[pid] === UNUSED) continue;
        // A user-defined piece's bonus is computed in double precision, as in the C++ source.
        const candidate = this.types[pid] === USER_DEFINED
          ? Math.fround(length * this.maxScore) - 0.1 + here
          : Math.fround(this.scores[pid] + here);
        if (start[e] === -1 || candidate > score[e]) {
          score[e] = candidate;
          start[e] = s;
          id[e] = pid;
        }
        if (e === s + 1) hasSingle = true;
      }
      if (!hasSingle) {
        const candidate = Math.fround(unkScore + here);
        if (start[s + 1] === -1 || candidate > score[s + 1]) {
          score[s + 1] = candidate;
          start[s + 1] = s;
          id[s + 1] = this.unkId;
        }
      }
    }
    const out = [];
    for (let e = n; e > 0; e = start[e]) {
      if (id[e] === this.unkId && this.spec.byte_fallback) {
        const spelled = utf8.encode(chars.slice(start[e], e).join(""));
        for (let k = spelled.length - 1; k >= 0; k--) out.push(this.bytePiece[spelled[k]]);
      } else {
        out.push(id[e]);
      }
    }
    return out.reverse();
  }

  // Text of ids, as Tokenizer.decode in Python: specials dropped, byte pieces joined into UTF-8
  // (an invalid byte becomes U+FFFD), U+2581 back to spaces, the dummy prefix removed.
  // While nothing has been written yet, each piece loses one leading U+2581 (sentencepiece's
  // "bos whitespace"), so a text that began with spaces comes back without them.
  decode(ids) {
    const decoder = new TextDecoder("utf-8", { ignoreBOM: true }); // a decoded U+FEFF is text, not a byte-order mark
    let text = "", pending = [];
    const flush = () => {
      if (pending.length) text += decoder.decode(Uint8Array.from(pending));
      pending = [];
    };
    for (const i of ids) {
      if (i <= 3 || i >= this.pieces.length) continue;
      const type = this.types[i];
      if (type === BYTE) {
        pending.push(parseInt(this.pieces[i].slice(3, 5), 16));
        continue;
      }
      flush();
      if (type === CONTROL) continue;
      let piece = type === UNKNOWN ? " \u2047 " : this.pieces[i];
      if (text === "" && this.spec.normalizer.add_dummy_prefix && piece.startsWith(SPACE)) piece = piece.slice(1);
      text += piece.replaceAll(SPACE, " ");
    }
    flush();
    return text;
  }
}
