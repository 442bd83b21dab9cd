// Run by tests/convert/test_web.py: the page's model inputs of lines with a glossary (textprep.mjs lineSentences and
// sentenceInputs, as app.mjs calls them; glossary.mjs) on JSON cases (stdin): {lines: [line], terms: {source: target},
// text: model.json's text entry, glossary: its glossary entry, limit}. Prints, per line, its model inputs:
// [{text, spans, fold, whole, forced: null | {text, spans, targets, without}}].
// argv: textprep.mjs, glossary.mjs and tokenizer.mjs to import, tokenizer.json to load, sentencex-wasm's directory.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [, , textprep, glossaryModule, tokenizerModule, tokenizerJson, sentencexDir] = process.argv;
const { lineSentences, sentenceInputs } = await import(pathToFileURL(textprep).href);
const { Glossary } = await import(pathToFileURL(glossaryModule).href);
const { Tokenizer } = await import(pathToFileURL(tokenizerModule).href);
const sentencex = await import(pathToFileURL(`${sentencexDir}/sentencex_wasm.js`).href);
sentencex.initSync({ module: readFileSync(`${sentencexDir}/sentencex_wasm_bg.wasm`) });
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizerJson, "utf8")));
const count = (t) => tokenizer.encode(t).length;
const cases = JSON.parse(readFileSync(0, "utf8"));
const glossary = Glossary.fromObject(cases.terms, { ...cases.text, ...cases.glossary });
const prepared = (line) => lineSentences(line, cases.text, sentencex.segment, glossary).flatMap((sentence) => {
  const { inputs, whole } = sentenceInputs(sentence, cases.text, glossary, count, cases.limit);
  return inputs.map((input) => ({ text: input.text, spans: input.spans, fold: input.fold, whole,
    forced: input.form?.forced == null ? null : { text: input.form.forced, spans: input.form.spans, targets: input.form.targets, without: input.form.without } }));
});
process.stdout.write(JSON.stringify(cases.lines.map(prepared)));
