// The page: loads the graphs and the tokenizer once, then translates each typed line in the
// browser (no server). window.tk is the same API for scripts and for tests.

import { OrtBackend } from "./backend.mjs";
import { decodeIds, retried, wordBoundary, wordEnd } from "./decoding.mjs";
import { confidenceOf } from "./confidence.mjs";
import { Glossary, finished, normalized, translateTerms } from "./glossary.mjs";
import { finish, lineSentences, sentenceInputs } from "./textprep.mjs";
import { openTokenizer } from "./tokenizers.mjs";

async function fetchOk(url, as) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`cannot load ${url}: HTTP ${response.status}`);
  return response[as]();
}

const firstLine = (e) => String(e?.message ?? e).split("\n")[0];

// The variant and the device come from the address (index.html?variant=int8, ?device=webgpu); fp32 on WebAssembly by default.
const params = new URLSearchParams(location.search);
const variant = params.get("variant") || "fp32";
const device = params.get("device") || "wasm";
const DEVICES = { wasm: "WebAssembly", webgpu: "WebGPU" };

// WebGPU where the browser gives an adapter: navigator.gpu alone is not enough (a browser may expose the API and have no
// adapter, as headless Chromium without --enable-unsafe-webgpu does).
const adapter = (async () => { try { return (await navigator.gpu?.requestAdapter()) ?? null; } catch { return null; } })();

// onnxruntime-web's build for the device, each loaded only when chosen (WebGPU's is its own 26 MiB binary); WebGPU asked
// for in a browser that offers none runs on WebAssembly, and the page says so (fallback).
async function openRuntime() {
  if (!(device in DEVICES)) throw new Error(`unknown device ${device}; choose one of ${Object.keys(DEVICES).join(", ")}`);
  const gpu = device === "webgpu" && (await adapter) !== null;
  const ort = await import(gpu ? "./vendor/ort.webgpu.min.mjs" : "./vendor/ort.wasm.min.mjs");
  ort.env.wasm.wasmPaths = new URL("./vendor/", import.meta.url).href;
  const fallback = device === "webgpu" && !gpu ? "this browser offers no WebGPU: running on WebAssembly" : null;
  return { ort, ep: gpu ? "webgpu" : "wasm", fallback };
}

const runtime = openRuntime();
const modelJson = fetchOk("model.json", "json");
// The tokenizer loads on its own: tk.encode answers before the graphs are in.
const tokenizing = modelJson.then((model) => openTokenizer(model.tokenizer, (url) => fetchOk(url, "json")));

async function load() {
  const model = await modelJson;
  const files = model.variants[variant];
  if (!files) throw new Error(`no ${variant} graphs here; choose one of ${Object.keys(model.variants).join(", ")}`);
  const { ort, ep, fallback } = await runtime;
  // int8's matrix products are MatMulInteger after DynamicQuantizeLinear, which onnxruntime-web's WebGPU has no kernels
  // for (its node placements put them on its CPU kernels): int8 would run on WebAssembly under a WebGPU label.
  if (ep === "webgpu" && variant !== "fp32") throw new Error(`the ${variant} graphs do not run on WebGPU; choose fp32 graphs or WebAssembly`);
  const [tokenizer, weights] = await Promise.all([
    tokenizing,
    // fp32: both graphs point into one weights file (ONNX external data): downloaded once, given to both sessions.
    files.weights ? fetchOk(files.weights, "arrayBuffer").then((b) => new Uint8Array(b)) : null,
  ]);
  const options = { executionProviders: [ep], ...(weights ? { externalData: [{ path: files.weights, data: weights }] } : {}) };
  // A graph that is missing or unreadable is named, in one line (the page's status shows it).
  // One after the other: onnxruntime-web's WebGPU refuses a session while another is being created.
  const open = (g) => ort.InferenceSession.create(files.graphs[g], options)
    .catch((e) => { throw new Error(`cannot load the ${variant} ${g} graph ${files.graphs[g]}: ${firstLine(e)}`); });
  const encoder = await open("encoder"), decoder = await open("decoder");
  const backend = new OrtBackend(ort, encoder, decoder, model);
  const boundary = wordBoundary(model.words, model.decoder.outputs.find((o) => o.name === "log_probs").dims[1]);
  return { model: { ...model, variant, bytes: files.bytes }, tokenizer, backend, boundary, ort, ep, fallback, loadMs: performance.now() };
}

const loading = load();
// sentencex's WebAssembly build, as tk's Python side splits sentences (its own 2 MiB, fetched beside the graphs).
const splitting = import("./vendor/sentencex_wasm.js").then(async (sentencex) => {
  await sentencex.default({ module_or_path: new URL("./vendor/sentencex_wasm_bg.wasm", import.meta.url) });
  return sentencex.segment;
});

// The model's decoding rules for a target language (null: the export's): a multilingual model's target sets the
// token it forces first, or its start token (model.json's languages.sets), as toolkit.core.tokenizers.choose_languages.
function rulesFor(model, targetLang) {
  const languages = model.languages;
  if (!languages?.tokens) {
    if (targetLang != null && targetLang !== languages?.target_lang) throw new Error(`this model does not translate into ${targetLang}`);
    return model.rules;
  }
  const target = targetLang ?? languages.target_lang;
  if (!(target in languages.tokens)) throw new Error(`unknown target language ${target}; this model's: ${languages.target.join(", ")}`);
  return { ...model.rules, [languages.sets]: languages.tokens[target] };
}

// Options as `tk translate` takes them (DecodeOptions.for_manifest: the model's rules and output limit, guards on);
// opts.targetLang chooses a multilingual model's target language.
function decodeOptions(model, opts = {}) {
  const { targetLang, sourceLang, ...given } = opts;
  return {
    beam: 1, alpha: null, nBest: 1, batchSize: 64, maxLen: model.max_output_len, maxSrcLen: model.max_len,
    maxLenA: model.guards.max_len_a, maxLenB: model.guards.max_len_b, loopGuard: model.guards.loop_guard,
    rules: rulesFor(model, targetLang), ...given,
  };
}

window.tk = {
  ready: loading.then(({ model, loadMs, ort, ep, fallback }) => ({
    loadMs, model: model.name, variant, bytes: model.bytes, device: ep, fallback, threads: ort.env.wasm.numThreads,
  })),
  // Each source's log-probabilities for the first target token: what `tk verify` compares.
  async firstStep(ids) {
    const { model, backend } = await loading;
    const step = await backend.step(ids.map(() => model.rules.start), await backend.encode(ids));
    return Array.from(step.logProbs);
  },
  // Each text's ids; opts.sourceLang: a multilingual model's source language (its own code; T5: with opts.targetLang,
  // the pair), the exported one if none.
  async encode(texts, opts = {}) {
    const tokenizer = await tokenizing;
    return texts.map((t) => tokenizer.encode(t, opts));
  },
  async decode(ids) {
    const tokenizer = await tokenizing;
    return ids.map((seq) => tokenizer.decode(seq));
  },
  // Token ids in, hypotheses ({tokens, score}) out: decodeIds with tk translate's defaults; opts as decodeOptions's.
  async translateIds(ids, opts) {
    const { model, backend } = await loading;
    return decodeIds(backend, ids, decodeOptions(model, opts));
  },
  // Lines in, a translation of each out: each line cleaned and cut into its sentences as tk translate cuts it (sentencex,
  // textprep.mjs), the sentences translated together and each line's joined with a space (textprep.join), with its
  // sentences' warnings. opts.glossary: source term -> target term, an object or the TSV text (a bad line is one Error
  // in Python's words); a sentence holding terms has them put in as tk translate --glossary does (glossary.mjs), and its
  // line says how in its `glossary`.
  async translate(texts, opts = {}) {
    const [{ model }, segment] = await Promise.all([loading, splitting]);
    const { glossary: given, ...rest } = opts;
    const glossary = await glossaryOf(given);
    const lines = [], said = [];
    texts.forEach((t, i) => {
      for (const s of lineSentences(t, model.text, segment, glossary)) {
        said.push(s);
        lines.push(i + 1);
      }
    });
    const done = await translateSentences(said, lines, glossary, rest);
    return texts.map((_, i) => {
      const mine = done.filter((_, k) => lines[k] === i + 1);
      // Its confidence: its weakest sentence's (translate._line_of); an empty line's is 1, as tk translate's.
      const line = { text: mine.map((o) => o.text).filter(Boolean).join(" "), tokens: mine.flatMap((o) => o.tokens),
        confidence: Math.min(1, ...mine.map((o) => o.confidence)) };
      const ways = mine.map((o) => o.glossary).filter(Boolean), notes = [...new Set(mine.map((o) => o.warning).filter(Boolean))];
      if (ways.length) line.glossary = ways.join(", ");
      if (notes.length) line.warning = notes.join("; ");
      return line;
    });
  },
};

// Sentences in, a translation of each out, as translate takes them: each sentence's `text` (protected for a model
// trained on tk's placeholders), its line's `spans` and, where its line holds glossary terms, the source term each
// span stands for (`sources`: glossary.protectLine's); `lines`: each one's line number, for the warnings.
// Over 60 lines: the sentences' model inputs, their two batches (with terms, then the rest) and each sentence joined.
async function translateSentences(sentences, lines, glossary, rest) {
  const { tokenizer, model, backend, boundary } = await loading;
  const languages = { sourceLang: rest.sourceLang, targetLang: rest.targetLang };
  const spec = model.text, count = (text) => tokenizer.encode(text, languages).length, limit = model.max_len;
  // Each sentence's model inputs (textprep.prepare; sentenceInputs), those holding glossary terms with their forms.
  const forms = new Map(); // `sentence:input` -> the input's glossary forms, for translateTerms
  const cuts = sentences.map((s, i) => {
    const cut = sentenceInputs(s, spec, glossary, count, limit);
    cut.inputs.forEach((input, k) => {
      if (input.form) forms.set((input.key = `${i}:${k}`), input.form);
    });
    return cut;
  });
  // The inputs holding terms, by translate._forced's three steps; those it leaves to their placeholder form (a model
  // without them: the input as it is, reported where it lacks its targets), decoded with the inputs without
  // terms in one batch (translate.decode_segments). As there, an input whose translation a guard cut is decoded again
  // with a wider beam, and a loop guard's cut ends on a word. An input with no letter outside its placeholders ("2019",
  // "👍", a term alone) is its own translation.
  const done = forms.size ? await translateTerms(glossary, backend, tokenizer, model, forms, decodeOptions(model, rest), languages) : new Map();
  const copied = (input) => input.spans.length > 0 && !/\p{L}/u.test(input.text.replace(/⦅\d+⦆/gu, ""));
  const decoded = (input) => !done.has(input.key) && !copied(input);
  const inputs = cuts.flatMap((c) => c.inputs).filter(decoded).map((input) => input.text);
  const ids = inputs.map((t) => tokenizer.encode(t, languages)), options = decodeOptions(model, rest);
  const hyps = await retried(backend, ids, await decodeIds(backend, ids, options), options, model.retry);
  const alpha = options.alpha ?? options.rules.alpha, c = model.confidence;
  let k = 0;
  return cuts.map(({ whole, inputs: mine }, i) => {
    const notes = [], missed = [], all = [], said = [], ways = [], repairs = [];
    let least = 1; // the sentence's confidence: its weakest input's (translate.join_line); a copied input's is 1
    for (const input of mine) {
      if (done.has(input.key)) { // its terms put in by translateTerms
        const o = done.get(input.key);
        said.push(o.text);
        all.push(...o.tokens);
        ways.push(o.glossary);
        least = Math.min(least, o.confidence);
        continue;
      }
      let tokens = [], text = input.text, confidence = 1;
      if (decoded(input)) {
        const h = hyps[k][0];
        tokens = wordEnd(h.tokens, h.rest, boundary);
        text = tokenizer.decode(tokens);
        confidence = confidenceOf(c, input.text, text, normalized(options.rules, h.score, tokens.length, alpha, !h.stopped), h.stopped);
        if (ids[k].length > limit) notes.push(`warning: line ${lines[i]} has a sentence of ${ids[k].length} tokens; truncated to the model's maximum of ${limit}`);
        k += 1;
      }
      const symbols = input.form === undefined ? spec.placeholders : input.form.protected !== null;
      said.push(symbols ? finish(input.fold, text, input.spans, repairs) : text);
      all.push(...tokens);
      if (input.form?.targets.length && !symbols) { // a model without placeholders: its own translation, if it holds them
        const o = finished(glossary, input.form, tokens, text, lines[i], confidence, c.failed);
        ways.push(o.glossary);
        if (o.warning) missed.push(o.warning);
        confidence = o.confidence;
      } else if (input.form?.holds) {
        ways.push("placeholders");
      }
      least = Math.min(least, confidence);
    }
    const out = { text: said.join(" "), tokens: all, confidence: repairs.length ? Math.min(least, c.repaired_max) : least };
    if (ways.length) out.glossary = ways.join(", ");
    if (whole) notes.unshift(`warning: line ${lines[i]} has a sentence of ${whole} tokens, more than the model's ${limit}; translated in ${mine.length} pieces, cut between clauses or words`);
    notes.unshift(...new Set(missed));
    if (notes.length) out.warning = notes.join("; ");
    return out;
  });
}

// The page's glossary of an object or TSV text (null: none), or the one line why this model's page takes none.
async function glossaryOf(given) {
  // None, as in Python: no glossary, an empty one (an empty object, a blank box).
  const empty = typeof given === "string" ? !given.trim() : typeof given === "object" && !Array.isArray(given) && !Object.keys(given ?? {}).length;
  if (given === undefined || empty) return null;
  const { model } = await loading;
  if (model.glossary.refused) throw new Error(model.glossary.refused);
  const spec = { ...model.text, ...model.glossary }; // the text's patterns and limits, and the glossary's own
  return typeof given === "string" ? Glossary.parse(given, "terms", spec) : Glossary.fromObject(given, spec);
}

const $ = (id) => document.getElementById(id);
const button = $("translate");
const choose = () => { location.search = `?variant=${$("variant").value}&device=${$("device").value}`; };
adapter.then((a) => {
  for (const [d, name] of Object.entries(DEVICES)) {
    const option = new Option(d === "webgpu" && !a ? `${name} (not offered here)` : name, d, false, d === device);
    option.disabled = d === "webgpu" && !a;
    $("device").add(option);
  }
  $("device").addEventListener("change", choose);
});
const shown = (e) => { $("status").textContent = `error: ${firstLine(e)}`; };
runtime.then(({ fallback }) => { if (fallback) $("status").textContent = `loading ... (${fallback})`; }, shown);
loading.then(({ model, loadMs, ort, ep, fallback }) => {
  for (const v of Object.keys(model.variants)) $("variant").add(new Option(v, v, false, v === variant));
  $("variant").addEventListener("change", choose);
  if (model.languages && model.languages.target.length > 1) { // a multilingual model: its languages, the export's pair first
    for (const side of ["source", "target"]) {
      for (const code of model.languages[side]) $(side).add(new Option(code, code, false, code === model.languages[`${side}_lang`]));
    }
    $("languages").hidden = false;
  }
  const on = ep === "webgpu" ? "WebGPU" : `WebAssembly, ${ort.env.wasm.numThreads || 1} thread(s)`;
  $("model").textContent = `${model.name} (${variant}, ${(model.bytes / 2 ** 20).toFixed(1)} MiB of graphs), onnxruntime-web ${ort.env.versions?.web ?? ""} on ${on}`;
  $("status").textContent = `ready in ${Math.round(loadMs)} ms${fallback ? ` (${fallback})` : ""}`;
  button.disabled = false;
}, shown);

button.addEventListener("click", async () => {
  const lines = $("input").value.split("\n");
  button.disabled = true;
  $("status").textContent = "translating ...";
  const start = performance.now();
  try {
    const languages = $("languages").hidden ? {} : { sourceLang: $("source").value, targetLang: $("target").value };
    const out = await window.tk.translate(lines, { beam: Number($("beam").value), glossary: $("glossary").value, ...languages });
    const ms = performance.now() - start;
    $("output").textContent = out.map((o) => o.text).join("\n");
    const n = lines.filter((l) => l.trim()).length;
    const { fallback } = await runtime;
    const missed = out.filter((o) => o.warning);
    // The line to check first: the lowest confidence (confidence.mjs), where any line is below a half.
    const weakest = out.reduce((w, o, i) => (o.confidence < out[w].confidence ? i : w), 0);
    const check = out.length && out[weakest].confidence < 0.5 ? `; check line ${weakest + 1} first (confidence ${out[weakest].confidence.toFixed(2)})` : "";
    $("status").textContent = `${n} sentences in ${Math.round(ms)} ms${fallback ? ` (${fallback})` : ""}${check}`
      + (missed.length ? `; ${missed[0].warning}${missed.length > 1 ? ` (and ${missed.length - 1} more lines)` : ""}` : "");
  } catch (e) {
    $("status").textContent = `error: ${firstLine(e)}`;
  } finally {
    button.disabled = false;
  }
});
