// The page: loads the graphs and the tokenizer once, then translates each typed line in the
// browser (no server). window.tk is the same API for scripts and for tests.

import * as ort from "./vendor/ort.wasm.min.mjs";
import { OrtBackend } from "./backend.mjs";
import { decodeIds } from "./decoding.mjs";
import { openTokenizer } from "./tokenizers.mjs";

ort.env.wasm.wasmPaths = new URL("./vendor/", import.meta.url).href;

async function fetchOk(url, as) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`cannot load ${url}: HTTP ${response.status}`);
  return response[as]();
}

// The variant comes from the address (index.html?variant=int8); fp32 by default.
const variant = new URLSearchParams(location.search).get("variant") || "fp32";

const modelJson = fetchOk("model.json", "json");
// The tokenizer loads on its own: tk.encode answers before the graphs are in.
const tokenizing = modelJson.then((model) => openTokenizer(model.tokenizer, (url) => fetchOk(url, "json")));

async function load() {
  const model = await modelJson;
  const files = model.variants[variant];
  if (!files) throw new Error(`no ${variant} graphs here; choose one of ${Object.keys(model.variants).join(", ")}`);
  const [tokenizer, weights] = await Promise.all([
    tokenizing,
    // fp32: both graphs point into one weights file (ONNX external data): downloaded once, given to both sessions.
    files.weights ? fetchOk(files.weights, "arrayBuffer").then((b) => new Uint8Array(b)) : null,
  ]);
  const options = { executionProviders: ["wasm"], ...(weights ? { externalData: [{ path: files.weights, data: weights }] } : {}) };
  const [encoder, decoder] = await Promise.all(
    ["encoder", "decoder"].map((g) => ort.InferenceSession.create(files.graphs[g], options)));
  const backend = new OrtBackend(ort, encoder, decoder, model);
  return { model: { ...model, variant, bytes: files.bytes }, tokenizer, backend, loadMs: performance.now() };
}

const loading = load();

// Options as `tk translate` takes them (DecodeOptions, with its guards on).
function decodeOptions(model, opts = {}) {
  return {
    beam: 1, alpha: 0.6, nBest: 1, batchSize: 64, maxLen: model.max_len,
    maxLenA: model.guards.max_len_a, maxLenB: model.guards.max_len_b, loopGuard: model.guards.loop_guard, ...opts,
  };
}

window.tk = {
  ready: loading.then(({ model, loadMs }) => ({ loadMs, model: model.name, variant, bytes: model.bytes, threads: ort.env.wasm.numThreads })),
  // Each source's log-probabilities for the first target token: what `tk verify` compares.
  async firstStep(ids) {
    const { backend } = await loading;
    const state = await backend.encode(ids);
    const out = await backend.decoder.run({ ...state, token: new ort.Tensor("int64", BigInt64Array.from(ids.map(() => 2n)), [ids.length]) });
    return Array.from(out.log_probs.data);
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
  // Token ids in, hypotheses ({tokens, score}) out: decodeIds with tk translate's defaults.
  async translateIds(ids, opts) {
    const { model, backend } = await loading;
    return decodeIds(backend, ids, decodeOptions(model, opts));
  },
  async translate(texts, opts) {
    const { tokenizer } = await loading;
    const hyps = await this.translateIds(texts.map((t) => tokenizer.encode(t)), opts);
    return hyps.map((n) => ({ text: tokenizer.decode(n[0].tokens), tokens: n[0].tokens }));
  },
};

const $ = (id) => document.getElementById(id);
const button = $("translate");
loading.then(({ model, loadMs }) => {
  for (const v of Object.keys(model.variants)) $("variant").add(new Option(v, v, false, v === variant));
  $("variant").addEventListener("change", () => { location.search = `?variant=${$("variant").value}`; });
  $("model").textContent = `${model.name} (${variant}, ${(model.bytes / 2 ** 20).toFixed(1)} MiB of graphs), onnxruntime-web ${ort.env.versions?.web ?? ""} on WebAssembly, ${ort.env.wasm.numThreads || 1} thread(s)`;
  $("status").textContent = `ready in ${Math.round(loadMs)} ms`;
  button.disabled = false;
}, (e) => { $("status").textContent = `error: ${String(e.message).split("\n")[0]}`; });

button.addEventListener("click", async () => {
  const lines = $("input").value.split("\n");
  button.disabled = true;
  $("status").textContent = "translating ...";
  const start = performance.now();
  try {
    const out = await window.tk.translate(lines, { beam: Number($("beam").value) });
    const ms = performance.now() - start;
    $("output").textContent = out.map((o) => o.text).join("\n");
    const n = lines.filter((l) => l.trim()).length;
    $("status").textContent = `${n} sentences in ${Math.round(ms)} ms`;
  } catch (e) {
    $("status").textContent = `error: ${e.message}`;
  } finally {
    button.disabled = false;
  }
});
