// The step backend for onnxruntime-web: the same encoder and decoder graphs as `tk translate`.
//
// toolkit/runtime.py keeps the cache on the device and ranks and selects rows with small ONNX
// graphs; here the outputs come back in JavaScript memory (on WebGPU too: onnxruntime-web's default), so ranking
// (top-k) and row selection (finished rows leave, beams reorder) are done here in plain
// JavaScript, with the same tie rule as ONNX Runtime's TopK (equal values: lower id first).

import { topK } from "./decoding.mjs";

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
    this.pad = model.rules.pad; // pads source batches (the graphs mask it by src_len)
  }

  async encode(src) {
    const { ort } = this;
    const rows = src.length, width = Math.max(1, ...src.map((s) => s.length));
    const ids = new BigInt64Array(rows * width).fill(BigInt(this.pad));
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

  // One decoder step: the rows' log-probabilities (a rows x vocab Float32Array) and the next state.
  async step(token, state) {
    const { ort } = this;
    const feeds = { ...state, token: new ort.Tensor("int64", BigInt64Array.from(token.map(BigInt)), [token.length]) };
    const out = await this.decoder.run(feeds);
    const next = { ...state };
    for (const [output, input] of Object.entries(this.spec.updates)) next[input] = out[output];
    return { logProbs: out.log_probs.data, vocab: out.log_probs.dims[1], state: next };
  }

  async stepTopK(token, state, k) {
    const step = await this.step(token, state);
    return { ...topK(step.logProbs, step.vocab, k), state: step.state };
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
