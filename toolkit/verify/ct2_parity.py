"""`tk verify DIR --runtime ctranslate2`: the directory's CTranslate2 model against the PyTorch reference and the ONNX
graphs.

CTranslate2 has no graphs to feed step by step, so the evidence is of two kinds:
  score   log-probabilities of given target sentences (`Translator.score_batch`, every position, the end token
          included) against PyTorch's teacher-forced ones, over batch sizes and source and target lengths the
          export never saw, ragged batches (padding) included: a converter fault (a swapped key/value half, a wrong
          position table, a transposed weight) moves them;
  decode  greedy translations of held-out sentences, token for token against the ONNX graphs' (tk's loop on ONNX
          Runtime, the same variant): identical, or parting only where PyTorch itself scores the two tokens within
          twice the tolerance (a near-tie two engines' arithmetic may break either way), which the row names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from toolkit.core import architectures
from toolkit.core import manifest as manifest_mod
from toolkit.core.decode_options import DecodeOptions
from toolkit.core.decoding import translate_ids
from toolkit.core.errors import UsageError
from toolkit.core.variants import CATALOGUE
from toolkit.pytorch.reference import load_reference, reference_kind
from toolkit.runtimes.ctranslate2.engine import RUNTIME, forbidden_tokens
from toolkit.verify.checks import check_weights, held_out_sentences, prefix_log_probs
from toolkit.verify.compare import compare, tolerance
from toolkit.verify.report import Report, Row, environment

# (batch, longest source, longest target): single sentences to the model's limit, and ragged batches.
SHAPES = ((1, 1, 1), (1, 5, 12), (2, 17, 3), (3, 9, 30), (5, 33, 7), (8, 64, 63), (16, 12, 20), (4, 2, 63))


def verify_ct2(directory: str | Path, provider: str = "cpu", variants: list[str] | None = None, atol: float | None = None,
               rtol: float | None = None, seed: int = 0, sentences: int = 16, echo=print,
               checkpoint: str | Path | None = None, expect_digest: str | None = None,
               data: str | Path | None = None, localize: bool = False) -> Report:
    from toolkit.runtimes import get
    from toolkit.runtimes.ctranslate2 import engine as ct2
    from toolkit.runtimes.ctranslate2.spec import vocabularies

    if localize:
        raise UsageError("--localize finds a node of the ONNX graphs, and CTranslate2 runs none; drop it, or verify "
                         "--runtime onnxruntime")
    m = manifest_mod.load(directory)
    report = Report(str(directory), seed, runtime=get(RUNTIME).label())
    try:
        m.check_files()
    except UsageError as e:
        report.rows.append(Row("static", "files", "-", "-", "-", "sha256", ok=False, detail=str(e)))
        return report
    if provider == "all":
        raise UsageError("--runtime ctranslate2 verifies one provider at a time; give --provider cpu or --provider cuda")
    variants = variants or ["fp32"]
    loaded = {v: ct2.load(m, provider, v) for v in variants}  # a runtime that cannot load fails before PyTorch work
    label = f"{RUNTIME}-{provider}"
    report.environment = environment([provider] if provider == "cpu" else [])
    report.environment[RUNTIME] = ct2.version()
    echo(f"runtime: {report.runtime} ({', '.join(f'{v}: {c.compute_type}' for v, c in loaded.items())})")
    entry, cfg, model, report.reference = load_reference(m, echo, checkpoint)
    report.reference_kind, report.reference_proves = reference_kind(report.reference)
    check_weights(report, m, entry, cfg, model, checkpoint, expect_digest, echo)
    rng = np.random.default_rng(seed)
    rules = m.rules()
    source_vocab, target_vocab = (len(v) for v in vocabularies(m))
    # Tokens the model never emits (Marian's <pad>) are left out of the targets: tk's graphs give them -inf after
    # the softmax, as generate does, and CTranslate2 forbids them per call, so their scores are not comparable.
    allowed = np.setdiff1d(np.arange(4, target_vocab), forbidden_tokens(m))
    cases = [_case(rng, b, n, t, source_vocab, allowed, m.max_len) for b, n, t in SHAPES]
    specs = m.specs()
    for v, c in loaded.items():
        tol = tolerance(v, atol, rtol)
        for (b, n, t), (src, tgt) in zip(SHAPES, cases):
            ref = _torch_scores(model, src, tgt, rules, specs if architectures.imported(m.model) else None)
            got = [np.array(r.log_probs, dtype=np.float64) for r in c.translator.score_batch(_words(src), _words(tgt))]
            _score_row(report, v, label, f"batch={b} src<={n} tgt<={t}", ref, got, tol)
    _decode(report, m, model, loaded, label, sentences, data, atol, rtol, echo)
    return report


def _case(rng: np.random.Generator, batch: int, src_len: int, tgt_len: int, source_vocab: int, target_tokens: np.ndarray,
          max_len: int):
    """Random sources and targets of ordinary tokens (no specials), the first row of each at the longest length."""
    lens = lambda top: [top] + [int(rng.integers(1, top + 1)) for _ in range(batch - 1)]  # noqa: E731
    sources = [rng.integers(4, source_vocab, size=n).tolist() for n in lens(min(src_len, max_len))]
    return sources, [rng.choice(target_tokens, size=n).tolist() for n in lens(min(tgt_len, max_len - 1))]


def _words(seqs: list[list[int]]) -> list[list[str]]:
    return [[str(t) for t in s] for s in seqs]


@torch.no_grad()
def _torch_scores(model, src: list[list[int]], tgt: list[list[int]], rules, specs=None) -> list[np.ndarray]:
    """PyTorch's log-probability of each target token and of the end token after it, per sentence (teacher forcing
    from the start token), as score_batch gives them. tk's Transformer scores a batch in one forward pass; an import
    (specs given) is stepped through its own one-step decoder, the computation its graphs were exported from."""
    from toolkit.core.decoding import pad_batch

    ids, lens = pad_batch(src, rules.pad)
    tgt_in, _ = pad_batch([[rules.start, *t] for t in tgt], rules.pad)
    if specs is None:
        log_probs = model(torch.from_numpy(ids), torch.from_numpy(lens), torch.from_numpy(tgt_in)).double().numpy()
    else:
        from toolkit.pytorch.torch_backend import TorchBackend

        backend = TorchBackend(model, specs["encoder"], specs["decoder"])
        state, steps = backend.encode(ids, lens), []
        for t in range(tgt_in.shape[1]):
            lp, state = backend.step(tgt_in[:, t], state)
            steps.append(np.asarray(lp, dtype=np.float64))
        log_probs = np.stack(steps, axis=1)
    return [log_probs[i, np.arange(len(t) + 1), [*t, rules.end]] for i, t in enumerate(tgt)]


def _score_row(report: Report, variant: str, label: str, case: str, ref: list[np.ndarray], got: list[np.ndarray],
               tol: tuple[float, float]) -> None:
    shapes = [r.shape == g.shape for r, g in zip(ref, got)]
    if not all(shapes):
        i = shapes.index(False)
        report.rows.append(Row("score", "encoder+decoder", variant, label, case, "log_probs", ok=False,
                               detail=f"sentence {i}: {len(got[i])} log-probabilities, expected {len(ref[i])}"))
        return
    stats = compare(np.concatenate(ref), np.concatenate(got), *tol)
    report.rows.append(Row("score", "encoder+decoder", variant, label, case, "log_probs", stats["max_abs"], stats["max_rel"],
                           stats["outside"], ok=stats["ok"], detail=stats.get("detail", "")))


def _decode(report: Report, m, model, loaded: dict, label: str, sentences: int, data, atol, rtol, echo) -> None:
    """Greedy translations on CTranslate2 against the ONNX graphs' (tk's loop on ONNX Runtime, CPU, same variant)."""
    from toolkit.core.tokenizers import open_tokenizer
    from toolkit.pytorch.torch_backend import TorchBackend
    from toolkit.runtimes import DEFAULT_RUNTIME, load

    if sentences <= 0:
        return
    english, origin = held_out_sentences(sentences, data)
    echo(f"decoding {len(english)} sentences from the {origin}")
    src = [ids[: m.max_len] for ids in open_tokenizer(m).encode(english)]
    rules, out_len = m.rules(), m.max_output_len
    specs = m.specs()
    ref_backend = TorchBackend(model, specs["encoder"], specs["decoder"])
    opts = DecodeOptions.bare(max_len=out_len, rules=rules)
    for v, c in loaded.items():
        onnx_variant = v if v in m.variants() or v in ("int8", "optimized") else "fp32"
        # tk's loop as translate runs it: a multilingual model's target language forced first, as CTranslate2 is told to.
        graphs = [h[0] for h in translate_ids(load(m, DEFAULT_RUNTIME, "cpu", onnx_variant).backend(), src, out_len, rules=rules)]
        got = [h[0] for h in c.backend().decode_all(src, opts)]
        same = sum(a.tokens == b.tokens for a, b in zip(graphs, got))
        tol = tolerance(v, atol, rtol)
        ties, real = [], []
        for i, (a, b) in enumerate(zip(graphs, got)):
            if a.tokens == b.tokens:
                continue
            step = next(k for k, (x, y) in enumerate(zip(a.tokens + [-1], b.tokens + [-1])) if x != y)
            lp = prefix_log_probs(ref_backend, src[i], a.tokens[:step], rules)
            x = a.tokens[step] if step < len(a.tokens) else rules.end
            y = b.tokens[step] if step < len(b.tokens) else rules.end
            margin = abs(float(lp[x] - lp[y]))
            (ties if margin <= 2 * tol[0] else real).append(f"sentence {i} at step {step} (PyTorch margin {margin:.2e})")
        exact = CATALOGUE[v].exact_translation
        detail = f"{same}/{len(src)} identical to the ONNX graphs' ({onnx_variant})"
        if ties:
            detail += f"; near-ties: {'; '.join(ties[:3])}"
        if real:
            detail += f"; divergences: {'; '.join(real[:3])}"
        report.rows.append(Row("translation", "encoder+decoder", v, label, f"{len(src)} sentences", "greedy tokens",
                               outside=1 - same / len(src), ok=not real or not exact, detail=detail))
