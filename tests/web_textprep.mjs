// Run by tests/convert/test_web.py: the page's textprep.mjs on JSON cases (stdin): {fitted: [{text, limit, count}],
// sentences: [line], format}, where count is "chars" (a token a code point, plus one) or "tokens" (the tokenizer's ids)
// and format is model.json's format_characters. Prints {fitted: [{pieces, whole}], sentences: [[sentence]]}.
// argv: textprep.mjs and tokenizer.mjs to import, tokenizer.json to load, sentencex-wasm's directory.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [, , textprep, tokenizerModule, tokenizerJson, sentencexDir] = process.argv;
const { fitted, sentences } = await import(pathToFileURL(textprep).href);
const { Tokenizer } = await import(pathToFileURL(tokenizerModule).href);
const sentencex = await import(pathToFileURL(`${sentencexDir}/sentencex_wasm.js`).href);
sentencex.initSync({ module: readFileSync(`${sentencexDir}/sentencex_wasm_bg.wasm`) });
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizerJson, "utf8")));
const counts = { chars: (t) => [...t].length + 1, tokens: (t) => tokenizer.encode(t).length };
const cases = JSON.parse(readFileSync(0, "utf8"));
const format = new RegExp(cases.format, "gu");
process.stdout.write(JSON.stringify({
  fitted: cases.fitted.map((c) => fitted(c.text, counts[c.count], c.limit)),
  sentences: cases.sentences.map((line) => sentences(line, sentencex.segment, format)),
}));
