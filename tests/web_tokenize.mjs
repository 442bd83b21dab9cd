// Run by tests/test_web.py: encodes a JSON list of texts (stdin) with the browser's tokenizer.
// argv: tokenizer.mjs to import, tokenizer.json to load.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const { Tokenizer } = await import(pathToFileURL(process.argv[2]).href);
const tokenizer = new Tokenizer(JSON.parse(readFileSync(process.argv[3], "utf8")));
const texts = JSON.parse(readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify({ ids: texts.map((t) => tokenizer.encode(t)), decoded: texts.map((t) => tokenizer.decode(tokenizer.encode(t))) }));
