// Run by tests/convert/test_web.py: the page's textprep.mjs on JSON cases (stdin): {fitted: [{text, limit, count}],
// sentences: [line], prepared: [line], text, limit}, where count is "chars" (a token a code point, plus one) or "tokens"
// (the tokenizer's ids) and text is model.json's text entry. Prints {fitted: [{pieces, whole}], sentences: [[sentence]],
// prepared: [[{text, spans, fold, whole}]]}: each line's model inputs, as the page makes them for a model trained on
// tk's placeholders.
// argv: textprep.mjs and tokenizer.mjs to import, tokenizer.json to load, sentencex-wasm's directory.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [, , textprep, tokenizerModule, tokenizerJson, sentencexDir] = process.argv;
const { caseOf, clean, fitted, modelInputs, protect, splitSentences, unspelledWords } = await import(pathToFileURL(textprep).href);
const { Tokenizer } = await import(pathToFileURL(tokenizerModule).href);
const sentencex = await import(pathToFileURL(`${sentencexDir}/sentencex_wasm.js`).href);
sentencex.initSync({ module: readFileSync(`${sentencexDir}/sentencex_wasm_bg.wasm`) });
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizerJson, "utf8")));
const counts = { chars: (t) => [...t].length + 1, tokens: (t) => tokenizer.encode(t).length };
const cases = JSON.parse(readFileSync(0, "utf8"));
const spec = cases.text, format = new RegExp(spec.format, "gu");
const sentences = (line) => {
  const text = clean(line, format);
  return text ? splitSentences(text, sentencex.segment) : [];
};
const prepared = (line) => {
  const keep = unspelledWords(line, spec), text = clean(line, format, keep);
  if (!text) return [];
  const protectedLine = protect(text, keep, spec);
  return splitSentences(protectedLine.text, sentencex.segment).flatMap((sentence) => {
    const { inputs, whole } = modelInputs(sentence, protectedLine.spans, caseOf(sentence), counts.tokens, cases.limit, spec.per_input);
    return inputs.map((input) => ({ ...input, whole }));
  });
};
process.stdout.write(JSON.stringify({
  fitted: cases.fitted.map((c) => fitted(c.text, counts[c.count], c.limit)),
  sentences: cases.sentences.map(sentences),
  prepared: cases.prepared.map(prepared),
}));
