"""`tk verify`: measured parity between the PyTorch reference and every exported graph.

Three kinds of evidence, all collected before a verdict:
  static   each graph's inputs/outputs against the declaration (names, dtypes, symbolic axes);
  sweep    random inputs over batch sizes and lengths the export never saw, every output compared;
  decode   real sentences: every decoder output along the greedy decode, then the translations,
           which must be token-for-token identical.
Plus ONNX Runtime with graph optimisations off vs on, and CPU vs CUDA drift as a noise floor.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch

from toolkit import manifest as manifest_mod
from toolkit import registry
from toolkit.decoding import StepBackend, greedy
from toolkit.errors import ParityError, ProviderError, UsageError, first_line
from toolkit.graphs import NP_DTYPES, GraphSpec, make_inputs
from toolkit.reference import load_reference, reference_kind
from toolkit.variants import CATALOGUE, describe, graph_source, load_proto

FALLBACK_SENTENCES = ["Go.", "I lost.", "He's calm.", "I'm home.", "Where is the station?", "We will see tomorrow.",
                      "She doesn't like cold coffee.", "Tom bought a new car last week."]


@dataclass
class Row:
    check: str  # static | sweep | optimizer | decode | translation
    graph: str
    variant: str
    provider: str
    case: str
    output: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    outside: float = 0.0  # fraction of elements outside atol + rtol * |ref|
    top1: float | None = None  # for log_probs: agreement of the arg-max
    noise: float | None = None  # CPU vs CUDA max abs difference on the same inputs
    ok: bool = True
    detail: str = ""


@dataclass
class Report:
    directory: str
    seed: int
    rows: list[Row] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    reference: str = ""
    reference_kind: str = ""  # checkpoint | random_init | graphs (see toolkit.reference.reference_kind)
    reference_proves: str = ""
    weights_sha256: str = ""  # of the graphs' fp32 weights, when computed (--checkpoint, --expect-digest, or a graphs reference)

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.ok]

    def to_json(self) -> dict:
        return {"directory": self.directory, "seed": self.seed, "passed": not self.failures, "reference": self.reference,
                "reference_kind": self.reference_kind, "reference_proves": self.reference_proves,
                "graph_weights_sha256": self.weights_sha256 or None,
                "skipped_providers": self.skipped, "environment": self.environment,
                "failures": [asdict(r) for r in self.failures], "rows": [asdict(r) for r in self.rows]}


def compare(ref: np.ndarray, got: np.ndarray, atol: float, rtol: float) -> dict:
    """Error statistics of `got` against `ref`; NaN or Inf in `got` fails whatever the tolerance."""
    if ref.shape != got.shape:
        return {"ok": False, "detail": f"shape {got.shape}, expected {ref.shape}", "max_abs": float("inf"),
                "max_rel": float("inf"), "outside": 1.0}
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    if not np.isfinite(got).all():
        return {"ok": False, "detail": "NaN or Inf in output", "max_abs": float("nan"), "max_rel": float("nan"), "outside": 1.0}
    if ref.size == 0:
        return {"ok": True, "max_abs": 0.0, "max_rel": 0.0, "outside": 0.0}
    diff = np.abs(ref - got)
    scale = np.abs(ref)
    outside = float(np.mean(diff > atol + rtol * scale))
    rel = diff / np.maximum(scale, 1e-6)
    return {"ok": outside == 0.0, "max_abs": float(diff.max()), "max_rel": float(rel.max()), "outside": outside}


def top1(ref: np.ndarray, got: np.ndarray) -> float:
    return float(np.mean(ref.argmax(-1) == got.argmax(-1)))


# ---- static checks -----------------------------------------------------------------------------

def static_check(source: Path | bytes, spec: GraphSpec, variant: str) -> list[Row]:
    """The graph's interface against the declaration; a frozen axis is reported by name."""
    rows = []
    try:
        model = load_proto(source)
    except Exception as e:
        return [Row("static", spec.name, variant, "-", "-", "graph", ok=False, detail=f"corrupt {describe(source)}: {e}")]
    for kind, values, declared in (("input", model.graph.input, spec.inputs), ("output", model.graph.output, spec.outputs)):
        got_names = [v.name for v in values]
        if got_names != [t.name for t in declared]:
            rows.append(Row("static", spec.name, variant, "-", "-", f"{kind}s", ok=False,
                            detail=f"{kind} names {got_names}, declared {[t.name for t in declared]}"))
            continue
        for value, t in zip(values, declared):
            problems = []
            elem = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            if elem != NP_DTYPES[t.dtype]:
                problems.append(f"dtype {elem}, declared {t.dtype}")
            dims = value.type.tensor_type.shape.dim
            if len(dims) != len(t.dims):
                problems.append(f"rank {len(dims)}, declared {len(t.dims)}")
            for d, want in zip(dims, t.dims):
                if isinstance(want, str) and d.HasField("dim_value"):
                    problems.append(f"axis '{want}' is frozen to {d.dim_value}")
            rows.append(Row("static", spec.name, variant, "-", "-", t.name, ok=not problems, detail="; ".join(problems)))
    return rows


# ---- the sweep -----------------------------------------------------------------------------------

def sweep_cases(max_len: int) -> list[dict[str, int]]:
    """Batch 1, 2, odd, large; lengths 1, 2, typical, longer than at export, the maximum."""
    cases = [(1, 1), (2, 2), (5, 8), (64, 13), (2, max_len)]
    return [{"batch": b, "src_len": n, "past_len": n - 1, "n_q": n, "n_kv": n + 2} for b, n in cases]


def case_label(spec: GraphSpec, sizes: dict[str, int]) -> str:
    return " ".join(f"{d}={sizes[d]}" for d in sorted(spec.symbolic_dims()) if "+" not in d)


def sweep_inputs(spec: GraphSpec, sizes: dict, rng: np.random.Generator, vocab: int, index: int) -> dict[str, np.ndarray]:
    feeds = make_inputs(spec, sizes, rng, vocab)
    if "valid_lens" in feeds and index % 2 == 0 and sizes["batch"] > 1:
        feeds["valid_lens"][-1] = 0  # a fully masked row: zeros out, never NaN
    return feeds


def run_torch(module: torch.nn.Module, spec: GraphSpec, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        outs = module(*(torch.from_numpy(feeds[n]) for n in spec.input_names))
    return {n: o.numpy() for n, o in zip(spec.output_names, outs)}


class RunFailure(Exception):
    """ONNX Runtime refused the inputs (a frozen axis, a broken graph): a parity failure, not a crash."""


def run_ort(session, spec: GraphSpec, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    try:
        return dict(zip(spec.output_names, session.run(None, feeds)))
    except Exception as e:
        raise RunFailure(first_line(e)) from None


def failed_run(rows: list[Row], check: str, spec: GraphSpec, variant: str, provider: str, case: str, error: Exception) -> None:
    rows.append(Row(check, spec.name, variant, provider, case, "(run)", float("inf"), float("inf"), 1.0, ok=False,
                    detail=f"ONNX Runtime failed: {error}"))


def compare_outputs(rows: list[Row], check: str, spec: GraphSpec, variant: str, provider: str, case: str,
                    ref: dict, got: dict, tol: tuple[float, float], noise: dict | None = None) -> None:
    for name in spec.output_names:
        stats = compare(ref[name], got[name], *tol)
        row = Row(check, spec.name, variant, provider, case, name, **stats)
        if name == "log_probs" and ref[name].shape == got[name].shape:
            row.top1 = top1(ref[name], got[name])
        if noise and name in noise:
            row.noise = noise[name]
        rows.append(row)


# ---- real sentences --------------------------------------------------------------------------------

class ParityBackend(StepBackend):
    """Decodes with PyTorch and, at every step, feeds the same inputs to the ONNX graphs and compares.

    Every encoder and decoder output is checked along a real decode, cache included.
    """

    def __init__(self, torch_backend, sessions, specs, variant, provider, tol, rows):
        self.t, self.sessions, self.specs = torch_backend, sessions, specs
        self.variant, self.provider, self.tol, self.rows = variant, provider, tol, rows
        self.step_index = 0

    def encode(self, src, src_len):
        enc = self.specs["encoder"]
        encoded = self.t.encode_outputs(src, src_len)
        state = self.t.initial_state(encoded, len(src))
        ref = {n: v.numpy() for n, v in encoded.items()}
        ref.update(self.extra_reference("encoder", len(src)))
        feeds = {"src": src, "src_len": src_len}
        got = run_ort(self.sessions["encoder"], enc, feeds)
        case = f"batch={len(src)} src_len={src.shape[1]}"
        compare_outputs(self.rows, "decode", enc, self.variant, self.provider, case, {n: ref[n] for n in enc.output_names}, got, self.tol)
        self.extra_checks("encoder", feeds, got, case)
        self.step_index = 0
        return state

    def step(self, token, state):
        dec = self.specs["decoder"]
        feeds = {"token": token, **{k: v.numpy() for k, v in state.items()}}
        log_probs, new_state = self.t.step(token, state)
        ref = {"log_probs": log_probs, **{o: new_state[i].numpy() for o, i in dec.updates.items()},
               **self.extra_reference("decoder", len(token))}
        got = run_ort(self.sessions["decoder"], dec, feeds)
        case = f"step={self.step_index} batch={len(token)}"
        compare_outputs(self.rows, "decode", dec, self.variant, self.provider, case, ref, got, self.tol)
        self.extra_checks("decoder", feeds, got, case)
        self.step_index += 1
        return log_probs, new_state

    def select(self, state, rows):
        return self.t.select(state, rows)

    def extra_reference(self, graph: str, batch: int) -> dict[str, np.ndarray]:
        """PyTorch's values of outputs beyond the model's own (the attention variant's weights)."""
        return {}

    def extra_checks(self, graph: str, feeds: dict, got: dict, case: str) -> None:
        """More checks of each run's outputs (the attention variant's probabilities)."""


def test_sentences(m: manifest_mod.Manifest, n: int) -> tuple[list[str], str]:
    """English sentences of the held-out test split, else a fixed fallback list."""
    from toolkit import data

    source = ((m.training and m.training.data) or {}).get("source")
    try:
        corpus = data.load_corpus(source if source and Path(source).is_file() else None, download=False)
        english, _ = data.references(corpus.splits["test"])
        return english[:n], f"test split of {corpus.source}"
    except UsageError:
        return FALLBACK_SENTENCES[:n], "built-in sentences (corpus not found)"


def prefix_log_probs(backend, src: list[int], prefix: list[int]) -> np.ndarray:
    """Log-probabilities of the next token after `prefix`, for one sentence, on any backend."""
    from toolkit.decoding import pad_batch
    from toolkit.tokenizer import BOS

    ids, lens = pad_batch([src])
    state = backend.encode(ids, lens)
    lp = None
    for tok in [BOS, *prefix]:
        lp, state = backend.step(np.array([tok], dtype=np.int64), state)
    return lp[0]


def compare_translations(rows, ref_backend, backend, src_ids, max_len, variant, provider, tol) -> None:
    ref = greedy(ref_backend, src_ids, max_len)
    got = greedy(backend, src_ids, max_len)
    same = sum(r.tokens == g.tokens for r, g in zip(ref, got))
    row = Row("translation", "encoder+decoder", variant, provider, f"{len(src_ids)} sentences", "greedy tokens",
              outside=1 - same / len(src_ids), ok=same == len(src_ids) or not CATALOGUE[variant].exact_translation,
              detail=f"{same}/{len(src_ids)} identical")
    for i, (r, g) in enumerate(zip(ref, got)):
        if r.tokens != g.tokens:
            step = next((k for k, (a, b) in enumerate(zip(r.tokens + [-1], g.tokens + [-1])) if a != b))
            lp = prefix_log_probs(ref_backend, src_ids[i], r.tokens[:step])
            a = r.tokens[step] if step < len(r.tokens) else 3
            b = g.tokens[step] if step < len(g.tokens) else 3
            margin = float(lp[a] - lp[b])
            # A margin inside twice the tolerance is a tie the graphs may legitimately break either way.
            kind = "a near-tie" if margin <= 2 * tol[0] else "a real divergence"
            row.detail += f"; sentence {i} first differs at step {step} (PyTorch margin {margin:.2e}: {kind})"
            break
    rows.append(row)


# ---- the command -----------------------------------------------------------------------------------

def environment(providers: list[str]) -> dict:
    import onnxruntime as ort

    env = {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__,
           "python": platform.python_version(), "machine": f"{platform.machine()} {platform.system()}",
           "providers": providers, "available_providers": ort.get_available_providers()}
    if "cuda" in providers:
        try:
            env["cuda"] = ort.get_build_info() if hasattr(ort, "get_build_info") else ort.get_device()
        except Exception:  # informational only
            pass
    return env


def is_digest(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text.lower())


def check_weights(report: Report, m, entry, cfg, model, checkpoint_path, expect_digest: str | None, echo) -> None:
    """The chain of custody of the weights: the graphs' own weights against the checkpoint's digest or an expected one.

    Without either, a reference read back from the graphs proves only that the graphs compute what PyTorch
    computes with the same weights; a weight tampered with (manifest digests rewritten) would pass.
    """
    from toolkit import checkpoint as ckpt_mod
    from toolkit.reference import weights_from_graphs

    wanted = []
    if checkpoint_path is not None:
        wanted.append(("checkpoint", ckpt_mod.weights_sha256(model)))
    if expect_digest is not None:
        wanted.append(("--expect-digest", expect_digest.lower()))
    if not wanted and report.reference_kind != "graphs":
        return
    try:
        report.weights_sha256 = ckpt_mod.weights_sha256(model if report.reference_kind == "graphs" else weights_from_graphs(m, entry, cfg))
    except UsageError as e:
        report.rows.append(Row("weights", "all", "fp32", "-", "-", "weights_sha256", ok=False, detail=str(e)))
        return
    for what, digest in wanted:
        ok = digest == report.weights_sha256
        report.rows.append(Row("weights", "all", "fp32", "-", "-", "weights_sha256", ok=ok,
                               detail=f"graphs {report.weights_sha256[:16]}, {what} {digest[:16]}" + ("" if ok else ": the graphs' weights differ")))
        echo(f"weights digest {'matches' if ok else 'DOES NOT match'} the {what}: {report.weights_sha256}")


def verify(directory: str | Path, provider: str = "cpu", variants: list[str] | None = None, atol: float | None = None,
           rtol: float | None = None, seed: int = 0, sentences: int = 16, echo=print,
           checkpoint: str | Path | None = None, expect_digest: str | None = None) -> Report:
    from toolkit import runtime
    from toolkit.tokenizer import Tokenizer
    from toolkit.torch_backend import TorchBackend

    m = manifest_mod.load(directory)
    report = Report(str(directory), seed)
    try:
        m.check_files()
    except UsageError as e:
        report.rows.append(Row("static", "files", "-", "-", "-", "sha256", ok=False, detail=str(e)))
    # The attention variant (built in memory, with extra outputs) is checked by verify_attention.
    attention = "attention" in (variants or []) or (not variants and m.attention is not None)
    variants = [v for v in variants if v != "attention"] if variants else m.variants()
    specs = m.specs()

    providers = ["cpu", "cuda"] if provider == "all" else [provider]
    sessions: dict[tuple[str, str], dict] = {}
    for p in providers:
        for v in variants:
            try:
                loaded = runtime.load_sessions(m, p, v)
                sessions[(p, v)] = loaded.sessions
                if loaded.built_s:
                    echo(f"{v} graphs: not stored in {directory}, built in memory from its fp32 graphs in {loaded.built_s:.2f}s")
            except ProviderError as e:
                if provider != "all":
                    raise
                report.skipped[p] = str(e)
                break
    report.environment = environment(sorted({p for p, _ in sessions}))
    # Sessions first: a provider that cannot load fails before any PyTorch work.
    entry, cfg, model, report.reference = load_reference(m, echo, checkpoint)
    report.reference_kind, report.reference_proves = reference_kind(report.reference)
    check_weights(report, m, entry, cfg, model, checkpoint, expect_digest, echo)
    declared = {s.name: s for s in entry.graphs(cfg)}
    for name, spec in specs.items():
        if declared.get(name) != spec:
            report.rows.append(Row("static", name, "-", "-", "-", "declaration", ok=False,
                                   detail="manifest declaration differs from the model registry's; re-export"))
    if report.failures and any(r.output == "declaration" for r in report.failures):
        return report  # the graphs cannot be fed or compared by a declaration that is not the model's
    for v in variants:
        for name, spec in specs.items():
            report.rows += static_check(graph_source(m, name, v)[0], spec, v)

    vocab = getattr(cfg, "vocab_size", 2)
    max_len = getattr(cfg, "max_len", 64)
    modules = {name: registry.graph_module(entry, model, spec) for name, spec in specs.items()}
    rng = np.random.default_rng(seed)
    unoptimized = {}
    if ("cpu", "fp32") in sessions:
        unoptimized = {name: runtime.create_session(m.graph_path(name), "cpu", optimization="disabled") for name in specs}
    for i, sizes in enumerate(sweep_cases(max_len)):
        for name, spec in specs.items():
            feeds = sweep_inputs(spec, sizes, rng, vocab, i)
            ref = run_torch(modules[name], spec, feeds)
            case = case_label(spec, sizes)
            outs = {}
            for (p, v), s in sessions.items():
                try:
                    outs[(p, v)] = run_ort(s[name], spec, feeds)
                except RunFailure as e:
                    failed_run(report.rows, "sweep", spec, v, p, case, e)
            for (p, v), got in outs.items():
                noise = None
                if ("cpu", v) in outs and ("cuda", v) in outs:
                    noise = {o: float(np.abs(outs[("cpu", v)][o].astype(np.float64) - outs[("cuda", v)][o]).max(initial=0))
                             for o in spec.output_names}
                compare_outputs(report.rows, "sweep", spec, v, p, case, ref, got, tolerance(v, atol, rtol), noise)
            if ("cpu", "fp32") in outs:
                try:
                    plain = run_ort(unoptimized[name], spec, feeds)
                except RunFailure as e:
                    failed_run(report.rows, "optimizer", spec, "fp32", "cpu", case, e)
                    continue
                compare_outputs(report.rows, "optimizer", spec, "fp32", "cpu", case, plain,
                                outs[("cpu", "fp32")], tolerance("fp32", atol, rtol))

    tok_path = m.tokenizer_path()
    if m.kind == "seq2seq" and tok_path is not None and sentences > 0:
        english, origin = test_sentences(m, sentences)
        echo(f"decoding {len(english)} sentences from the {origin}")
        tokenizer = Tokenizer.load(tok_path)
        src_ids = [ids[:max_len] for ids in tokenizer.encode(english)]
        ref_backend = TorchBackend(model, specs["encoder"], specs["decoder"])
        for (p, v), s in sessions.items():
            parity = ParityBackend(ref_backend, s, specs, v, p, tolerance(v, atol, rtol), report.rows)
            ort_backend = runtime.OrtBackend(s["encoder"], s["decoder"], specs["encoder"], specs["decoder"])
            try:
                greedy(parity, src_ids, max_len)
                compare_translations(report.rows, ref_backend, ort_backend, src_ids, max_len, v, p, tolerance(v, atol, rtol))
            except Exception as e:  # ONNX Runtime refusing a real sentence is a verdict, reported like any other
                failed_run(report.rows, "decode", specs["decoder"], v, p, f"{len(src_ids)} sentences", RunFailure(first_line(e)))
    if attention:
        from toolkit.verify_attention import verify_attention

        attention_sentences = src_ids if m.kind == "seq2seq" and tok_path is not None and sentences > 0 else []
        verify_attention(m, entry, model, cfg, report, [p for p in providers if p not in report.skipped], seed, attention_sentences, atol, rtol, echo)
    return report


def tolerance(variant: str, atol: float | None, rtol: float | None) -> tuple[float, float]:
    default = CATALOGUE[variant].tolerance
    return (default[0] if atol is None else atol, default[1] if rtol is None else rtol)


def summarize(report: Report) -> list[list[str]]:
    """One line per (check, graph, variant, provider, output): the worst case over the sweep or decode."""
    groups: dict[tuple, list[Row]] = {}
    for r in report.rows:
        output = "interface" if r.check == "static" else r.output  # one line per graph, not per tensor
        groups.setdefault((r.check, r.graph, r.variant, r.provider, output), []).append(r)
    table = []
    for (check, graph, variant, prov, output), rows in groups.items():
        worst = max(rows, key=lambda r: (not r.ok, r.max_abs if np.isfinite(r.max_abs) else np.inf))
        t1 = [r.top1 for r in rows if r.top1 is not None]
        noise = [r.noise for r in rows if r.noise is not None]
        table.append([check, graph, variant, prov, output, str(len(rows)), f"{worst.max_abs:.2e}", f"{worst.max_rel:.2e}",
                      f"{max(r.outside for r in rows):.2%}", f"{min(t1):.2%}" if t1 else "",
                      f"{max(noise):.1e}" if noise else "", "ok" if all(r.ok for r in rows) else "FAIL",
                      worst.detail if not worst.ok or check == "translation" else ""])
    return table


HEADER = ["check", "graph", "variant", "provider", "output", "cases", "max abs", "max rel", "outside", "top-1", "noise", "", "detail"]


def render(report: Report) -> str:
    table = [HEADER, *summarize(report)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + (f"  {row[-1]}" if row[-1] else "") for row in table]
    return "\n".join(line.rstrip() for line in lines)


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")


def raise_on_failure(report: Report) -> None:
    if report.failures:
        first = report.failures[0]
        raise ParityError(f"{len(report.failures)} check(s) failed; first: {first.check} {first.graph}/{first.output} "
                          f"[{first.variant}, {first.provider}, {first.case}] max abs {first.max_abs:.3g}"
                          + (f" ({first.detail})" if first.detail else ""))


def record_summary(report: Report, directory: Path, seconds: float) -> None:
    """Worst error per (check, variant) and the verdict, stored in manifest.json as the model's parity record."""
    m = manifest_mod.load(directory)
    worst: dict[str, dict] = {}
    for r in report.rows:
        if r.check == "static":
            continue
        key = f"{r.check}/{r.variant}/{r.provider}"
        w = worst.setdefault(key, {"max_abs": 0.0, "checks": 0, "failed": 0})
        w["checks"] += 1
        w["failed"] += not r.ok
        if np.isfinite(r.max_abs):
            w["max_abs"] = max(w["max_abs"], r.max_abs)
        if r.check == "translation":
            w["detail"] = r.detail
    m.verification = manifest_mod.VerificationRecord(
        passed=not report.failures, checks=len(report.rows), failures=len(report.failures), seed=report.seed,
        seconds=round(seconds, 1), reference=report.reference, environment=report.environment,
        skipped_providers=report.skipped, worst=worst)
    m.save()
