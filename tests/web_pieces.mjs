// Run by tests/convert/test_web.py: the page's fitted (pieces.mjs) on JSON cases (stdin), one result per case.
// argv: pieces.mjs and tokenizer.mjs to import, tokenizer.json to load. A case: {text, limit, count}, where count is
// "chars" (a token a code point, plus one) or "tokens" (the tokenizer's ids).
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const { fitted } = await import(pathToFileURL(process.argv[2]).href);
const { Tokenizer } = await import(pathToFileURL(process.argv[3]).href);
const tokenizer = new Tokenizer(JSON.parse(readFileSync(process.argv[4], "utf8")));
const counts = { chars: (t) => [...t].length + 1, tokens: (t) => tokenizer.encode(t).length };
const cases = JSON.parse(readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(cases.map((c) => fitted(c.text, counts[c.count], c.limit))));
