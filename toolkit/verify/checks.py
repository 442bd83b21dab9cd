"""The checks of `tk verify`: static (interface against the declaration), the sweep's inputs, the parity
of every output along real decodes and of the translations, and the weights' chain of custody."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from toolkit.core.declaration import TK_RULES, DecodingRules
from toolkit.core.decoding import StepBackend, greedy
from toolkit.core.errors import UsageError
from toolkit.core.graphs import NP_DTYPES, GraphSpec, make_inputs
from toolkit.core.variants import CATALOGUE, describe, load_proto
from toolkit.verify.compare import compare_outputs, run_graph
from toolkit.verify.report import Report, Row

FALLBACK_SENTENCES = ["Go.", "I lost.", "He's calm.", "I'm home.", "Where is the station?", "We will see tomorrow.",
                      "She doesn't like cold coffee.", "Tom bought a new car last week."]


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


class ParityBackend(StepBackend):
    """Decodes with PyTorch and, at every step, feeds the same inputs to the ONNX graphs and compares.

    Every encoder and decoder output is checked along a real decode, cache included.
    """

    def __init__(self, torch_backend, runners, specs, variant, provider, tol, rows):
        self.t, self.runners, self.specs = torch_backend, runners, specs
        self.variant, self.provider, self.tol, self.rows = variant, provider, tol, rows
        self.step_index = 0
        self.failing_inputs: dict | None = None  # the first step that failed, for --localize
        self.step_errors: dict[int, float] = {}  # decode step -> largest log-probability error over every batch

    def _keep_failure(self, ok: bool, graph: str, case: str, feeds: dict) -> None:
        if not ok and self.failing_inputs is None:
            self.failing_inputs = {"graph": graph, "variant": self.variant, "provider": self.provider, "case": case,
                                   "feeds": {k: np.array(v) for k, v in feeds.items()}}

    def encode(self, src, src_len):
        enc = self.specs["encoder"]
        encoded = self.t.encode_outputs(src, src_len)
        state = self.t.initial_state(encoded, len(src))
        ref = {n: v.numpy() for n, v in encoded.items()}
        ref.update(self.extra_reference("encoder", len(src)))
        feeds = {"src": src, "src_len": src_len}
        got = run_graph(self.runners["encoder"], enc, feeds)
        case = f"batch={len(src)} src_len={src.shape[1]}"
        ok = compare_outputs(self.rows, "decode", enc, self.variant, self.provider, case, {n: ref[n] for n in enc.output_names}, got, self.tol)
        self._keep_failure(ok, "encoder", case, feeds)
        self.extra_checks("encoder", feeds, got, case)
        self.step_index = 0
        return state

    def step(self, token, state):
        dec = self.specs["decoder"]
        feeds = {"token": token, **{k: v.numpy() for k, v in state.items()}}
        log_probs, new_state = self.t.step(token, state)
        ref = {"log_probs": log_probs, **{o: new_state[i].numpy() for o, i in dec.updates.items()},
               **self.extra_reference("decoder", len(token))}
        got = run_graph(self.runners["decoder"], dec, feeds)
        a, b = np.asarray(got["log_probs"], np.float64), np.asarray(log_probs, np.float64)
        both = np.isneginf(a) & np.isneginf(b)  # forbidden tokens: -inf on both sides is agreement
        with np.errstate(invalid="ignore"):
            error = float(np.abs(np.where(both, 0.0, a - b)).max(initial=0.0))
        self.step_errors[self.step_index] = max(self.step_errors.get(self.step_index, 0.0), error)
        case = f"step={self.step_index} batch={len(token)}"
        ok = compare_outputs(self.rows, "decode", dec, self.variant, self.provider, case, ref, got, self.tol)
        self._keep_failure(ok, "decoder", case, feeds)
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


def held_out_sentences(n: int, data_path: str | Path | None = None) -> tuple[list[str], str]:
    """English sentences of the held-out test split of the corpus (found as every command finds it,
    toolkit.core.data.find), else a fixed list. The second item says which, for the command's output."""
    from toolkit.core import data

    try:
        corpus = data.load_corpus(data_path, download=False)
    except UsageError:
        if data_path is not None:
            raise  # asked for by name: its problem is the answer
        return FALLBACK_SENTENCES[:n], "built-in sentences (no corpus found: pass --data PATH or set $TK_DATA for the held-out split)"
    english, _ = data.references(corpus.splits["test"])
    return english[:n], f"test split of {data.describe(corpus)}"


def prefix_log_probs(backend, src: list[int], prefix: list[int], rules: DecodingRules = TK_RULES) -> np.ndarray:
    """Log-probabilities of the next token after `prefix`, for one sentence, on any backend."""
    from toolkit.core.decoding import pad_batch

    ids, lens = pad_batch([src], rules.pad)
    state = backend.encode(ids, lens)
    lp = None
    for tok in [rules.start, *prefix]:
        lp, state = backend.step(np.array([tok], dtype=np.int64), state)
    return lp[0]


def compare_translations(rows, ref_backend, backend, src_ids, max_len, variant, provider, tol, rules: DecodingRules = TK_RULES) -> None:
    ref = greedy(ref_backend, src_ids, max_len, rules=rules)
    got = greedy(backend, src_ids, max_len, rules=rules)
    same = sum(r.tokens == g.tokens for r, g in zip(ref, got))
    row = Row("translation", "encoder+decoder", variant, provider, f"{len(src_ids)} sentences", "greedy tokens",
              outside=1 - same / len(src_ids), ok=same == len(src_ids) or not CATALOGUE[variant].exact_translation,
              detail=f"{same}/{len(src_ids)} identical")
    for i, (r, g) in enumerate(zip(ref, got)):
        if r.tokens != g.tokens:
            step = next((k for k, (a, b) in enumerate(zip(r.tokens + [-1], g.tokens + [-1])) if a != b))
            lp = prefix_log_probs(ref_backend, src_ids[i], r.tokens[:step], rules)
            a = r.tokens[step] if step < len(r.tokens) else rules.end
            b = g.tokens[step] if step < len(g.tokens) else rules.end
            margin = float(lp[a] - lp[b])
            # A margin inside twice the tolerance is a tie the graphs may legitimately break either way.
            kind = "a near-tie" if margin <= 2 * tol[0] else "a real divergence"
            row.detail += f"; sentence {i} first differs at step {step} (PyTorch margin {margin:.2e}: {kind})"
            break
    rows.append(row)


def check_weights(report: Report, m, entry, cfg, model, checkpoint_path, expect_digest: str | None, echo) -> None:
    """The chain of custody of the weights: the graphs' own weights against the checkpoint's digest or an expected one.

    Without either, a reference read back from the graphs proves only that the graphs compute what PyTorch
    computes with the same weights; a weight tampered with (manifest digests rewritten) would pass.
    """
    from toolkit.pytorch import checkpoint as ckpt_mod

    wanted = []
    if checkpoint_path is not None:
        wanted.append(("checkpoint", ckpt_mod.weights_sha256(model)))
    if expect_digest is not None:
        wanted.append(("--expect-digest", expect_digest.lower()))
    if not wanted and report.reference_kind != "graphs":
        return
    try:
        report.weights_sha256 = ckpt_mod.weights_sha256(model) if report.reference_kind == "graphs" else graphs_digest(m, model)
    except UsageError as e:
        report.rows.append(Row("weights", "all", "fp32", "-", "-", "weights_sha256", ok=False, detail=str(e)))
        return
    for what, digest in wanted:
        ok = digest == report.weights_sha256
        report.rows.append(Row("weights", "all", "fp32", "-", "-", "weights_sha256", ok=ok,
                               detail=f"graphs {report.weights_sha256[:16]}, {what} {digest[:16]}" + ("" if ok else ": the graphs' weights differ")))
        echo(f"weights digest {'matches' if ok else 'DOES NOT match'} the {what}: {report.weights_sha256}")


def graphs_digest(m, reference) -> str:
    """The weights digest of the reference model holding the weights the exported graphs hold (weights_sha256 of such
    a model, computed without building it: the graphs' weights are mapped from their file, not copied).

    The exporter stores identical tensors once: the zero biases and unit LayerNorm weights of an untrained model, say,
    become one initializer named after the first of them, and the others are in no graph under their own names. Such
    a parameter is in the graphs when the tensor the reference gives it is there under another name (same shape, dtype
    and values): any change to that shared tensor changes the parameters it stands for, so the digest still tells.
    A parameter whose value is in no graph (among the parameters found) makes the graphs' weights differ from the
    reference's.
    """
    import torch

    from toolkit.pytorch.checkpoint import state_dict_sha256
    from toolkit.pytorch.reference import graph_parameters, resolve_parameters

    found = graph_parameters(m.directory, [g.file for g in m.graphs.values()])
    state, missing = resolve_parameters(reference, found)
    by_shape: dict[tuple, list] = {}
    for tensor in state.values():  # the model's own parameters only: the exporter names a merged tensor after one
        by_shape.setdefault((tuple(tensor.shape), tensor.dtype), []).append(tensor)
    own = reference.state_dict()
    for name in missing:
        want = own[name]
        twin = next((t for t in by_shape.get((tuple(want.shape), want.dtype), []) if torch.equal(t, want)), None)
        if twin is None:
            raise UsageError(f"parameter {name} of the reference is in no graph of {m.directory}, under its own name or "
                             "merged with an identical tensor: the graphs' weights differ from the reference's")
        state[name] = twin
    for name, tensor in state.items():  # as load_state_dict would take them: the reference's dtype and shape
        if tensor.shape != own[name].shape:
            raise UsageError(f"parameter {name} has shape {tuple(tensor.shape)} in the graphs of {m.directory}, "
                             f"{tuple(own[name].shape)} in the reference: the graphs' weights differ from the reference's")
        state[name] = tensor.to(own[name].dtype)
    return state_dict_sha256(state)
