// Run by tests/convert/test_web.py: the page's wordEnd and wordBoundary on JSON cases (stdin), one result per case.
// argv: decoding.mjs to import. A case: {tokens, rest, vocab, words: {inside_word, ends_word}}.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const { wordBoundary, wordEnd } = await import(pathToFileURL(process.argv[2]).href);
const cases = JSON.parse(readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(cases.map((c) => wordEnd(c.tokens, c.rest, wordBoundary(c.words, c.vocab)))));
