// How far to trust a translation, in the page: toolkit/core/confidence.py's confidence of one model input's translation
// (the logistic map of its length-normalised score and the share of the source's words it copied, capped where a guard
// cut it or it left the source untranslated), by the model's calibration, which model.json's confidence entry carries
// with the constants, from the Python definitions (toolkit/convert/web.py site_confidence).

// confidence._WORD: letters (Python's [^\W\d_]), with an inner apostrophe; digits and placeholders are no words here.
const WORD = /[\p{L}\p{Nl}\p{No}]+(?:['’][\p{L}\p{Nl}\p{No}]+)*/gu;
const casefold = (s) => s.toUpperCase().toLowerCase(); // str.casefold's "ß" -> "ss" too

// confidence.copy_signals: [share of the source's words the output repeats (capitalised ones after the first aside:
// names), whether the output is an untranslated copy].
export function copySignals(source, output, c) {
  const found = source.match(WORD) ?? [];
  const words = found.filter((w, k) => k === 0 || !/^\p{Uppercase}/u.test(w)).map(casefold);
  if (!words.length) return [0, false];
  const written = (output.match(WORD) ?? []).map(casefold), seen = new Set(written);
  const share = words.filter((w) => seen.has(w)).length / words.length;
  const same = found.length === written.length && found.every((w, k) => casefold(w) === written[k]);
  return [share, words.length >= c.untranslated_words && (share >= c.untranslated_share || same)];
}

// Calibration.confidence of confidence.signals(source, output, score, stopped): `c` is model.json's confidence entry,
// `score` the hypothesis's log-probability normalised as it was ranked, `stopped` what guard cut it ("" for none).
export function confidenceOf(c, source, output, score, stopped) {
  const [copied, untranslated] = copySignals(source, output, c);
  const z = c.bias + (c.weights[0] * Math.max(score, c.score_floor) + c.weights[1] * copied);
  let p = z > -700 ? 1 / (1 + Math.exp(-z)) : 0;
  if (stopped) p = Math.min(p, c.guarded_max);
  if (untranslated) p = Math.min(p, c.untranslated_max);
  return p;
}
