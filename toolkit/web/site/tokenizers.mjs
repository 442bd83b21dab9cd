// The page's tokenizer: the model's own, with what the model's Python tokenizer puts around the pieces.
//
// model.json's tokenizer entry says which (toolkit/convert/web_tokenizer.py writes it from the model directory's
// declaration): "sentencepiece", tk's own model, run by tokenizer.mjs; "tokenizers", a tokenizer.json run by
// @huggingface/tokenizers (vendored, loaded only then). Around the pieces: T5's task prefix before the text, Marian's
// `>>fr<<` code kept whole, the end token after them, a multilingual model's source language token before the text
// (after its end token for mBART). The same rule in Python is web_tokenizer.site_ids, which the export checks against
// the directory's tokenizer.

import { Tokenizer as SentencePiece } from "./tokenizer.mjs";

// What Python's str.strip() strips (the Python tokenizers' decode ends with it): trim() also strips U+FEFF, and not
// U+001C-U+001F or U+0085.
const PY_SPACE = "[\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
const PY_STRIP = new RegExp(`^${PY_SPACE}+|${PY_SPACE}+$`, "gu");

// A file that does not load (not JSON, not a tokenizer the library reads) is one line naming it.
export async function openTokenizer(entry, fetchJson) {
  try {
    return await open(entry, await fetchJson(entry.file));
  } catch (e) {
    throw new Error(`the tokenizer ${entry.file} does not load: ${String(e?.message ?? e).split("\n")[0]}`);
  }
}

async function open(entry, spec) {
  if (entry.kind === "sentencepiece") {
    const sp = new SentencePiece(spec);
    return new PageTokenizer(entry, (text) => sp.encode(text), (ids) => sp.decode(ids), () => null, null);
  }
  const { Tokenizer } = await import("./vendor/tokenizers.min.mjs");
  const tok = new Tokenizer(spec, { clean_up_tokenization_spaces: false });
  if (spec.model?.type === "Unigram" && spec.model.byte_fallback) byteFallback(tok.model);
  // A Marian of separate vocabularies: output ids are the target's, decoded with its tokenizer.json (entry.target).
  const out = entry.target ? new Tokenizer(entry.target, { clean_up_tokenization_spaces: false }) : tok;
  // A glossary's targets are written by the target's tokenizer: entry.target's, or a Marian's target SentencePiece model
  // at the shared vocabulary (entry.target_ids).
  const terms = entry.target_ids ? new Tokenizer(entry.target_ids, { clean_up_tokenization_spaces: false }) : entry.target ? out : null;
  if (entry.target_ids?.model?.type === "Unigram" && entry.target_ids.model.byte_fallback) byteFallback(terms.model);
  return new PageTokenizer(
    entry,
    (text, special = false) => tok.encode(text, { add_special_tokens: special }).ids,
    (ids) => (ids.length ? out.decode(ids, { clean_up_tokenization_spaces: false }) : ""),
    (token) => tok.model.tokens_to_ids.get(token) ?? null,
    terms ? (text) => terms.encode(text, { add_special_tokens: false }).ids : null,
  );
}

// The library's Unigram model has no byte fallback (0.2.0): a piece the vocabulary lacks is spelled as its UTF-8 bytes'
// <0xXX> pieces instead, as sentencepiece and the tokenizers package spell it. (The model's pieces are the text's own.)
function byteFallback(model) {
  const encode = model.encode.bind(model);
  const utf8 = new TextEncoder();
  const byte = (b) => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`;
  model.fuse_unk = false;
  model.encode = (tokens) => encode(tokens).flatMap((t) => (model.tokens_to_ids.has(t) ? [t] : Array.from(utf8.encode(t), byte)));
}

class PageTokenizer {
  constructor(entry, pieces, text, tokenId, targetPieces) {
    this.entry = entry;
    this.targetPieces = targetPieces;
    this.pieces = pieces;
    this.text = text;
    this.tokenId = tokenId;
    this.special = new Set(entry.special ?? []);
  }

  // The model's codes (e.g. "eng_Latn", "en"), or null for a model of one pair.
  get languages() {
    return this.entry.languages ? Object.keys(this.entry.languages) : null;
  }

  // One text's ids, as open_tokenizer(m).encode gives them; opts.sourceLang (a multilingual model's code) and, for a
  // T5, opts.targetLang choose the pair (the directory's own by default), as tk translate's --source-lang/--target-lang.
  encode(text, { sourceLang = null, targetLang = null } = {}) {
    const e = this.entry;
    if (!text) return []; // an empty line stays empty
    if (e.post_processor) return this.pieces(text, true); // the file's own special tokens
    const lang = sourceLang ?? e.source_lang;
    if (e.languages && !(lang in e.languages)) {
      throw new Error(`unknown source language ${JSON.stringify(lang)}; this model's codes: ${this.languages.join(", ")}`);
    }
    const pair = `${lang}-${targetLang ?? e.target_lang}`;
    if (e.prefixes && (sourceLang ?? targetLang) != null && !(pair in e.prefixes)) {
      throw new Error(`no task prefix for ${pair}; this model's: ${Object.keys(e.prefixes).join(", ")}`);
    }
    const prefix = e.prefixes && lang != null ? (e.prefixes[pair] ?? "") : "";
    let code = [];
    const stop = text.indexOf("<<");
    if (e.end !== null && !e.languages && text.startsWith(">>") && stop !== -1) { // Marian's target code: one token
      code = [this.tokenId(text.slice(0, stop + 2)) ?? e.unk];
      text = text.slice(stop + 2);
    }
    const ids = this.pieces(prefix + text);
    if (e.languages) {
      const id = e.languages[lang];
      return e.lang_suffix ? [...ids, e.end, id] : [id, ...ids, e.end];
    }
    return e.end === null ? ids : [...code, ...ids, e.end];
  }

  // A text's ids as the model writes it in its output (TextTokenizer.target_ids): the target vocabulary's pieces where
  // the sides have their own, else the source's ids (an end token appended, which constrained decoding drops).
  targetIds(text) {
    return this.targetPieces ? this.targetPieces(text) : this.encode(text);
  }

  // Output ids to text: special tokens (end, padding, language codes) dropped, as the Python tokenizer's decode.
  decode(ids) {
    return this.text(ids.filter((i) => !this.special.has(i))).replace(PY_STRIP, "");
  }
}
