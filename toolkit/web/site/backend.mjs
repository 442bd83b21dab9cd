// The step backend for onnxruntime-web: the same encoder and decoder graphs as `tk translate`.
//
// toolkit/runtime.py keeps the cache on the device and ranks and selects rows with small ONNX
// graphs; on the WebAssembly backend tensors already live in JavaScript memory, so ranking
// (top-k) and row selection (finished rows leave, beams reorder) are done here in plain
// JavaScript, with the same tie rule as ONNX Runtime's TopK (equal values: lower id first).

import { PAD } from "./decoding.mjs";

const size = (dims) => dims.reduce((a, b) => a * b, 1);
const TYPED = { float32: Float32Array, int64: BigInt64Array, float16: Uint16Array };

export class OrtBackend {
  // ort: the onnxruntime-web module; model: model.json (the manifest's graph specs).
  constructor(ort, encoder, decoder, model) {
    this.ort = ort;
    this.encoder = encoder;
    this.decoder = decoder;
    this.spec = model.decoder;
    this.stateInputs = this.spec.inputs.slice(1);
  }

  async encode(src) {
    const { ort } = this;
    const rows = src.length, width = Math.max(1, ...src.map((s) => s.length));
    const ids = new BigInt64Array(rows * width).fill(BigInt(PAD));
    src.forEach((s, r) => s.forEach((t, c) => { ids[r * width + c] = BigInt(t); }));
    const lens = BigInt64Array.from(src.map((s) => BigInt(Math.max(1, s.length))));
    const feeds = { src: new ort.Tensor("int64", ids, [rows, width]), src_len: new ort.Tensor("int64", lens, [rows]) };
    const outputs = { ...(await this.encoder.run(feeds)), ...feeds };
    const state = {};
    for (const t of this.stateInputs) {
      if (outputs[t.name]) {
        state[t.name] = outputs[t.name];
      } else if (t.fill === "empty") { // a cache that starts with zero positions
        const dims = t.dims.map((d) => (d === "batch" ? rows : d === "past_len" ? 0 : d));
        state[t.name] = new ort.Tensor(t.dtype, new TYPED[t.dtype](size(dims)), dims);
      } else {
        throw new Error(`the decoder needs ${t.name}, which the encoder does not give`);
      }
    }
    return state;
  }

  async stepTopK(token, state, k) {
    const { ort } = this;
    const feeds = { ...state, token: new ort.Tensor("int64", BigInt64Array.from(token.map(BigInt)), [token.length]) };
    const out = await this.decoder.run(feeds);
    const next = { ...state };
    for (const [output, input] of Object.entries(this.spec.updates)) next[input] = out[output];
    const { values, indices } = topK(out.log_probs.data, out.log_probs.dims[1], k);
    return { values, indices, state: next };
  }

  // The state of the given rows, in that order (rows may repeat), gathered along each tensor's batch axis.
  select(state, rows) {
    const next = {};
    for (const t of this.stateInputs) {
      const tensor = state[t.name], axis = t.dims.indexOf("batch");
      const dims = tensor.dims.slice(), data = tensor.data;
      const outer = size(dims.slice(0, axis)), inner = size(dims.slice(axis + 1)), batch = dims[axis];
      const picked = new data.constructor(outer * rows.length * inner);
      for (let o = 0; o < outer; o++) {
        rows.forEach((r, i) => picked.set(data.subarray((o * batch + r) * inner, (o * batch + r + 1) * inner), (o * rows.length + i) * inner));
      }
      dims[axis] = rows.length;
      next[t.name] = new this.ort.Tensor(tensor.type, picked, dims);
    }
    return next;
  }
}

// The k best values of each row of a (rows x vocab) Float32Array, largest first; k == 1 is an
// argmax (first maximum, as numpy's).
export function topK(data, vocab, k) {
  const rows = data.length / vocab, values = [], indices = [];
  for (let r = 0; r < rows; r++) {
    const row = data.subarray(r * vocab, (r + 1) * vocab);
    const best = [];
    for (let i = 0; i < vocab; i++) {
      const v = row[i];
      if (best.length === k && v <= row[best[k - 1]]) continue;
      let at = best.length;
      while (at > 0 && row[best[at - 1]] < v) at--;
      best.splice(at, 0, i);
      if (best.length > k) best.pop();
    }
    values.push(best.map((i) => row[i]));
    indices.push(best);
  }
  return { values, indices };
}
