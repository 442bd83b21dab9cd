"""`tk verify`: measured parity between the PyTorch reference and every exported graph.

Three kinds of evidence, all collected before a verdict:
  static   each graph's inputs/outputs against the declaration (names, dtypes, symbolic axes);
  sweep    random inputs over batch sizes and lengths the export never saw, every output compared;
  decode   real sentences: every decoder output along the greedy decode, then the translations,
           which must be token-for-token identical.
Plus ONNX Runtime with graph optimisations off vs on, and CPU vs CUDA drift as a noise floor.
On `runtime="openvino"` the same checks run on OpenVINO's CPU plugin (toolkit.runtimes).

This module runs the command; the pieces are verify_report (Row, Report), verify_compare (tolerances,
error statistics, running a graph), verify_checks (static, sweep inputs, real decodes, translations,
weights), verify_render (the table) and verify_record (JSON, verdict, manifest summary).
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import onnx
import torch

from toolkit import manifest as manifest_mod
from toolkit import registry
from toolkit.decoding import greedy
from toolkit.errors import ProviderError, UsageError, first_line
from toolkit.reference import load_reference, reference_kind
from toolkit.variants import graph_source

# The pieces live in modules by responsibility; their names stay importable from here.
from toolkit.verify_checks import (  # noqa: F401
    FALLBACK_SENTENCES,
    ParityBackend,
    case_label,
    check_weights,
    compare_translations,
    held_out_sentences,
    prefix_log_probs,
    static_check,
    sweep_cases,
    sweep_inputs,
)
from toolkit.verify_compare import (  # noqa: F401
    RunFailure,
    compare,
    compare_outputs,
    failed_run,
    run_ort,
    run_torch,
    tolerance,
    top1,
)
from toolkit.verify_record import raise_on_failure, record_summary, write_json  # noqa: F401
from toolkit.verify_render import HEADER, render, summarize  # noqa: F401
from toolkit.verify_report import Report, Row  # noqa: F401


def environment(providers: list[str]) -> dict:
    import onnxruntime as ort

    env = {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__,
           "python": platform.python_version(), "machine": f"{platform.machine()} {platform.system()}",
           "providers": providers, "available_providers": ort.get_available_providers()}
    if "cuda" in providers:
        from toolkit.runtime import gpu_environment

        env.update(gpu_environment())
    return env


def is_digest(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text.lower())


def verify(directory: str | Path, provider: str = "cpu", variants: list[str] | None = None, atol: float | None = None,
           rtol: float | None = None, seed: int = 0, sentences: int = 16, echo=print,
           checkpoint: str | Path | None = None, expect_digest: str | None = None, runtime: str = "onnxruntime",
           data: str | Path | None = None) -> Report:
    """`runtime`: the engine whose results are compared with PyTorch (toolkit.runtimes). Its rows name it
    in the provider column ("openvino-cpu"); ONNX Runtime's stay "cpu"/"cuda". `data`: the corpus whose
    held-out split is decoded (default: toolkit.data.find's search)."""
    from toolkit import runtime as ort_runtime
    from toolkit import runtimes
    from toolkit.tokenizer import Tokenizer
    from toolkit.torch_backend import TorchBackend

    runtimes.check(runtime)
    m = manifest_mod.load(directory)
    report = Report(str(directory), seed, runtime=runtimes.label(runtime))
    try:
        m.check_files()
    except UsageError as e:
        report.rows.append(Row("static", "files", "-", "-", "-", "sha256", ok=False, detail=str(e)))
    # The attention variant (built in memory, with extra outputs) is checked by verify_attention.
    attention = "attention" in (variants or []) or (not variants and m.attention is not None)
    if runtime != "onnxruntime" and attention:
        if variants:
            raise UsageError(f"the attention variant is checked on onnxruntime only; drop --variant attention or --runtime {runtime}")
        attention = False  # its extra outputs are read through ONNX Runtime's I/O binding
    variants = [v for v in variants if v != "attention"] if variants else m.variants()
    specs = m.specs()

    providers = ["cpu", "cuda"] if provider == "all" else [provider]
    sessions: dict[tuple[str, str], dict] = {}
    backends: dict[tuple[str, str], object] = {}
    for p in providers:
        for v in variants:
            try:
                loaded = runtimes.load(m, runtime, p, v, unverified=True)
                label = p if runtime == "onnxruntime" else f"{runtime}-{p}"
                sessions[(label, v)] = loaded.sessions
                backends[(label, v)] = loaded.backend
                if loaded.built_s:
                    echo(f"{v} graphs: not stored in {directory}, built in memory from its fp32 graphs in {loaded.built_s:.2f}s")
            except ProviderError as e:
                if provider != "all":
                    raise
                report.skipped[p] = str(e)
                break
    report.environment = environment(sorted({p for p, _ in sessions}))
    if runtime != "onnxruntime":
        report.environment[runtime] = runtimes.version(runtime)
    echo(f"runtime: {report.runtime}")
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
        unoptimized = {name: ort_runtime.create_session(m.graph_path(name), "cpu", optimization="disabled") for name in specs}
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
        english, origin = held_out_sentences(sentences, data)
        echo(f"decoding {len(english)} sentences from the {origin}")
        tokenizer = Tokenizer.load(tok_path)
        src_ids = [ids[:max_len] for ids in tokenizer.encode(english)]
        ref_backend = TorchBackend(model, specs["encoder"], specs["decoder"])
        for (p, v), s in sessions.items():
            parity = ParityBackend(ref_backend, s, specs, v, p, tolerance(v, atol, rtol), report.rows)
            try:
                greedy(parity, src_ids, max_len)
                compare_translations(report.rows, ref_backend, backends[(p, v)](), src_ids, max_len, v, p, tolerance(v, atol, rtol))
            except Exception as e:  # ONNX Runtime refusing a real sentence is a verdict, reported like any other
                failed_run(report.rows, "decode", specs["decoder"], v, p, f"{len(src_ids)} sentences", RunFailure(first_line(e)))
    if attention:
        from toolkit.verify_attention import verify_attention

        attention_sentences = src_ids if m.kind == "seq2seq" and tok_path is not None and sentences > 0 else []
        verify_attention(m, entry, model, cfg, report, [p for p in providers if p not in report.skipped], seed, attention_sentences, atol, rtol, echo)
    return report
