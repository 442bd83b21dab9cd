"""`tk verify`: measured parity between the PyTorch reference and every exported graph.

Three kinds of evidence, all collected before a verdict:
  static   each graph's inputs/outputs against the declaration (names, dtypes, symbolic axes);
  sweep    random inputs over batch sizes and lengths the export never saw, every output compared;
  decode   real sentences: every decoder output along the greedy decode, then the translations,
           which must be token-for-token identical.
Plus ONNX Runtime with graph optimisations off vs on, and CPU vs CUDA drift as a noise floor.
On another runtime that reads the graphs (`runtime="openvino"`) the same checks run on it (toolkit.runtimes); one that
reads a converted copy of the weights is checked by the verify function its declaration names.

This module runs the command; the pieces are report.py (Row, Report), compare.py (tolerances, error
statistics, running a graph), checks.py (static, sweep inputs, real decodes, translations, weights),
render.py (the table), record.py (JSON, verdict, manifest summary), localize.py (the first divergent node),
attention.py and int8_layers.py (what each layer loses to int8; toolkit.convert.guarded_int8 keeps the worst in float).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from toolkit.core import architectures
from toolkit.core import manifest as manifest_mod
from toolkit.core.decoding import greedy
from toolkit.core.engines import PROVIDERS
from toolkit.core.errors import ProviderError, UsageError, first_line
from toolkit.core.manifest import Manifest
from toolkit.graphs.variants import graph_source
from toolkit.pytorch import registry
from toolkit.pytorch.export import encoder_integers
from toolkit.pytorch.reference import load_reference, reference_kind
from toolkit.runtimes import DEFAULT_RUNTIME, get, label, load, names
from toolkit.verify.checks import (
    ParityBackend,
    case_label,
    check_weights,
    compare_translations,
    held_out_sentences,
    static_check,
    sweep_cases,
    sweep_inputs,
)
from toolkit.verify.compare import (
    RunFailure,
    compare_outputs,
    failed_run,
    run_graph,
    run_torch,
    tolerance,
)
from toolkit.verify.invariance import check_batch_invariance
from toolkit.verify.report import Report, Row, environment  # noqa: F401 (environment: named here too)

# Tokens each verify decode runs to at most unless --max-len or --full says otherwise: a model that never stops early (a
# random one, or one that loops) would otherwise decode to its own limit (510 for opus-mt) in every check, 18 to 30+
# minutes for a 75M model on 2 cores. 64 tokens hold every sentence of the held-out split tk decodes.
DECODE_TOKENS = 64
# Above this many weights (opus-mt-en-fr has 74.6M), the default verify leaves out what --full adds (see `at_scale`):
# on 2 loaded cores one decode step of a 75M model against PyTorch, every output compared, takes about a second.
SCALE_WEIGHTS = 20_000_000
SCALE_SENTENCES = 4  # sentences decoded at scale unless --sentences or --full says otherwise
PROGRESS_WEIGHTS = SCALE_WEIGHTS  # above this, each stage says when it starts and how long it took


@contextmanager
def stage(name: str, echo) -> Iterator[None]:
    """A progress line when a stage starts and one with its time when it ends (stderr): verify of a large model runs
    minutes, and the times say where they went."""
    echo(f"verify: {name} ...")
    start = time.perf_counter()
    yield
    echo(f"verify: {name}: {time.perf_counter() - start:.1f} s")


def decode_limit(m: Manifest, max_len: int | None, full: bool) -> int:
    """Tokens each decode of verify runs to at most: --max-len, else the model's own limit with --full, else
    DECODE_TOKENS; never beyond the model's limit."""
    if max_len is not None:
        return min(max_len, m.max_output_len)
    return m.max_output_len if full else min(DECODE_TOKENS, m.max_output_len)


def weight_count(m: Manifest) -> int:
    """About how many float32 weights the fp32 graphs hold, from the sizes of their files and of the weights file they
    share (export's weights.bin): no graph is read."""
    files = [m.directory / g.file for g in m.graphs.values()] + [m.directory / "weights.bin"]
    return sum(f.stat().st_size for f in files if f.is_file()) // 4


def at_scale(m: Manifest, sentences: int | None, full: bool, echo) -> tuple[int, tuple[int, ...] | None]:
    """What the default verify decodes: (sentences, generate's beams; None: the model's own). A model above
    SCALE_WEIGHTS decodes SCALE_SENTENCES sentences (unless --sentences is given) and compares with generate greedy
    only; the line on stderr names what it leaves out, which --full runs."""
    if full or weight_count(m) <= SCALE_WEIGHTS:
        return (16 if sentences is None else sentences), None
    left_out = ["generate's beam search"] + (["" if sentences is not None else f"all but {SCALE_SENTENCES} of 16 sentences"])
    echo(f"verify: {weight_count(m) / 1e6:.0f}M weights: left out at this size: {', '.join(x for x in left_out if x)} "
         "(--full runs everything; --sentences sets the sentences)")
    return (SCALE_SENTENCES if sentences is None else sentences), (1,)


def is_digest(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text.lower())


# Over 60 lines: the stages of one verify in the order they run, each a function of its own; splitting the sequence
# would only hide it.
def verify(directory: str | Path, provider: str = "cpu", variants: list[str] | None = None, atol: float | None = None,
           rtol: float | None = None, seed: int = 0, sentences: int | None = None, echo=print,
           checkpoint: str | Path | None = None, expect_digest: str | None = None, runtime: str = DEFAULT_RUNTIME,
           data: str | Path | None = None, localize: bool | None = None, localize_against=None, max_len: int | None = None,
           full: bool = False, languages: dict | None = None, strict: bool = False) -> Report:
    """`runtime`: the engine whose results are compared with PyTorch (toolkit.runtimes). Its rows name it
    in the provider column ("openvino-cpu"); the default runtime's stay "cpu"/"cuda". `data`: the corpus whose
    held-out split is decoded (default: toolkit.core.data.find's search). `localize`: find the first divergent
    node of the first failing case (None: when a check fails; True: also on the sweep case of a passing model), against
    PyTorch or `localize_against` (a toolkit.verify.localize.Side: another runtime, provider or variant).
    `max_len`: tokens each decode runs to at most (None: DECODE_TOKENS, or the model's own limit with `full`).
    `sentences`: held-out sentences decoded (None: 16, or SCALE_SENTENCES for a large model unless `full`).
    `full`: also what the default leaves out at scale (see `at_scale`). `languages`: a multilingual model's source_lang
    and target_lang as tk translate takes them (None: its default pair): the sentences carry that source code and both
    tk and transformers' generate force that target first. `strict`: transformers' generate failing on an imported model
    is a failed check (otherwise a warning in the report, toolkit.verify.hf_parity)."""
    spec = get(runtime)
    languages = {k: v for k, v in (languages or {}).items() if v is not None}
    if spec.verify and languages:
        raise UsageError(f"--runtime {runtime} is verified on its converted copy, which takes the model's default pair; "
                         "drop --source-lang/--target-lang")
    if spec.verify:  # a converted copy, not graphs: checked by its own kinds of evidence
        module, _, function = spec.verify.partition(":")
        return getattr(importlib.import_module(module), function)(
            directory, provider, variants, atol, rtol, seed, 16 if sentences is None else sentences, echo, checkpoint, expect_digest, data,
            bool(localize or localize_against))
    from toolkit.core.tokenizers import choose_languages

    # The pair chosen once, as tk translate chooses it: every check below reads it from this manifest.
    m = choose_languages(manifest_mod.load(directory), languages.get("source_lang"), languages.get("target_lang"))
    report = Report(str(directory), seed, runtime=label(runtime))
    declared = m.declared().tokenizer
    if declared.languages is not None:
        report.languages = {"source": declared.source_lang, "target": declared.target_lang}
    # A FIFO or a device in a file's place stops the run before anything opens it (a FIFO blocks for ever, /dev/zero
    # never ends); a missing or modified file is a failed check, with the rest still checked.
    m.check_kinds()
    architectures.get(m.model).check("verify")
    try:
        m.check_files()
    except UsageError as e:
        report.rows.append(Row("static", "files", "-", "-", "-", "sha256", ok=False, detail=str(e)))
    # The attention variant (built in memory, with extra outputs) is checked by verify_attention.
    attention = "attention" in (variants or []) or (not variants and m.attention is not None)
    if attention and "attention" not in spec.variants:
        if variants:
            others = [n for n in names() if "attention" in get(n).variants]
            raise UsageError(f"the attention variant is checked on {' and '.join(others)} only; drop --variant attention or --runtime {runtime}")
        attention = False  # its extra outputs are read through ONNX Runtime's I/O binding
    variants = [v for v in variants if v != "attention"] if variants else m.variants()
    providers = list(PROVIDERS) if provider == "all" else [provider]
    # Sessions first: a provider that cannot load fails before any PyTorch work.
    out_len = decode_limit(m, max_len, full)
    sentences, beams = at_scale(m, sentences, full, echo)
    # Stage lines where stages take minutes (a large model); a small model's verify stays a few lines.
    progress = echo if weight_count(m) > PROGRESS_WEIGHTS else (lambda line: None)
    with stage(f"loading the graphs ({', '.join(variants)} on {', '.join(providers)})", progress):
        sessions, backends = _load(m, runtime, providers, variants, provider == "all", report, echo)
    echo(f"runtime: {report.runtime}")
    with stage("building the PyTorch reference", progress):
        entry, cfg, model, report.reference = load_reference(m, echo, checkpoint)
    report.reference_kind, report.reference_proves = reference_kind(report.reference)
    with stage("weights digest", progress):
        check_weights(report, m, entry, cfg, model, checkpoint, expect_digest, echo)
    if not _declarations_match(report, m, entry, cfg):
        return report  # the graphs cannot be fed or compared by a declaration that is not the model's
    for v in variants:
        for name, spec in m.specs().items():
            report.rows += static_check(graph_source(m, name, v)[0], spec, v)
    with stage("sweep (random inputs, every graph and session against PyTorch)", progress):
        _sweep(report, m, entry, model, cfg, sessions, seed, atol, rtol)
    src_ids = _decodes(report, m, model, cfg, sessions, backends, sentences, data, atol, rtol, echo, out_len, beams, progress, strict)
    if attention:
        from toolkit.verify.attention import verify_attention

        with stage("attention variant", progress):
            verify_attention(m, entry, model, cfg, report, [p for p in providers if p not in report.skipped], seed, src_ids, atol, rtol, echo)
    _localize(report, m, entry, model, cfg, runtime, atol, rtol, localize, localize_against, echo)
    return report


def _localize(report: Report, m: Manifest, entry, model, cfg, runtime: str, atol, rtol, localize: bool | None,
              localize_against, echo) -> None:
    """The first divergent node of the first failing case (or, asked with nothing failing, of a sweep case)."""
    target = report.failing_inputs if report.failures else report.probe_inputs if localize else None
    if target is None or localize is False:
        return
    from toolkit.verify.localize import localize as find_divergence

    echo(f"localizing: {target['graph']} [{target['variant']}, {target['provider']}, {target['case']}], every intermediate tensor")
    try:
        loc = find_divergence(m, entry, model, cfg, target["graph"], target["variant"], target["provider"].split("-")[-1], runtime,
                              target["case"], target["feeds"], tolerance(target["variant"], atol, rtol), localize_against)
        report.localization = loc.to_json()
        report.localization["step_errors"] = report.step_errors.get(f"{target['variant']}/{target['provider']}", [])
    except Exception as e:  # the verdict stands without it; say why it is missing
        echo(f"localize: not available for this case ({first_line(e)}); the checks above are the verdict")


def _load(m: Manifest, runtime: str, providers: list[str], variants: list[str], any_provider: bool, report: Report,
          echo) -> tuple[dict[tuple[str, str], dict], dict[tuple[str, str], object]]:
    """Sessions and backend factories per (provider label, variant). With `any_provider` (--provider all),
    a provider that cannot load is skipped and named in the report; otherwise its error is raised."""
    spec = get(runtime)
    sessions: dict[tuple[str, str], dict] = {}
    backends: dict[tuple[str, str], object] = {}
    for p in providers:
        for v in variants:
            try:
                loaded = load(m, runtime, p, v, check_io=False)  # a graph that differs is a static row
            except ProviderError as e:
                if not any_provider:
                    raise
                report.skipped[p] = str(e)
                break
            label = spec.provider_label(p)
            sessions[(label, v)] = loaded.runners
            backends[(label, v)] = loaded.backend
            if loaded.built_s:
                echo(f"{v} graphs: not stored in {m.directory}, built in memory from its fp32 graphs in {loaded.built_s:.2f}s")
    report.environment = environment(sorted({p for p, _ in sessions}))
    report.environment[runtime] = spec.version()  # the default runtime's as environment() found it
    return sessions, backends


def _declarations_match(report: Report, m: Manifest, entry, cfg) -> bool:
    """Whether the manifest declares each graph as the model registry does (a failing row per graph that differs)."""
    declared = {s.name: s for s in entry.graphs(cfg)}
    ok = True
    for name, spec in m.specs().items():
        if declared.get(name) != spec:
            ok = False
            report.rows.append(Row("static", name, "-", "-", "-", "declaration", ok=False,
                                   detail="manifest declaration differs from the model registry's; re-export"))
    return ok


def _sweep(report: Report, m: Manifest, entry, model, cfg, sessions: dict, seed: int, atol: float | None, rtol: float | None) -> None:
    """Every graph on random inputs over a sweep of batch sizes and lengths, each session against PyTorch; the
    CPU fp32 session also against ONNX Runtime with its optimisations off (an optimiser fault shows there)."""
    from toolkit.runtimes.onnxruntime.sessions import OrtRunner, create_session

    specs = m.specs()
    vocab = registry.token_bound(cfg)
    modules = {name: registry.graph_module(entry, model, spec) for name, spec in specs.items()}
    # Integer encoder outputs the decoder takes (valid lengths) are fed the encoder's own values, never random ones.
    run_encoder = (lambda feeds: run_torch(modules["encoder"], specs["encoder"], feeds)) if "encoder" in specs else None
    rng = np.random.default_rng(seed)
    unoptimized = {}
    if ("cpu", "fp32") in sessions:
        unoptimized = {name: OrtRunner(create_session(m.graph_path(name), "cpu", optimization="disabled")) for name in specs}
    for i, sizes in enumerate(sweep_cases(getattr(cfg, "max_len", 64))):
        for name, spec in specs.items():
            feeds = encoder_integers(specs, name, sweep_inputs(spec, sizes, rng, vocab, i), sizes, rng, vocab, run_encoder)
            ref = run_torch(modules[name], spec, feeds)
            case = case_label(spec, sizes)
            outs = {}
            for (p, v), s in sessions.items():
                try:
                    outs[(p, v)] = run_graph(s[name], spec, feeds)
                except RunFailure as e:
                    failed_run(report.rows, "sweep", spec, v, p, case, e)
            for (p, v), got in outs.items():
                noise = None
                if ("cpu", v) in outs and ("cuda", v) in outs:
                    noise = {o: float(np.abs(outs[("cpu", v)][o].astype(np.float64) - outs[("cuda", v)][o]).max(initial=0))
                             for o in spec.output_names}
                inputs = {"graph": name, "variant": v, "provider": p, "case": case, "feeds": feeds}
                if not compare_outputs(report.rows, "sweep", spec, v, p, case, ref, got, tolerance(v, atol, rtol), noise):
                    report.failing_inputs = report.failing_inputs or inputs
                if i == 2 and (p, v) == next(iter(sessions)):
                    report.probe_inputs = inputs  # the last graph's (the decoder of a translation model)
            if ("cpu", "fp32") in outs:
                try:
                    plain = run_graph(unoptimized[name], spec, feeds)
                except RunFailure as e:
                    failed_run(report.rows, "optimizer", spec, "fp32", "cpu", case, e)
                    continue
                compare_outputs(report.rows, "optimizer", spec, "fp32", "cpu", case, plain,
                                outs[("cpu", "fp32")], tolerance("fp32", atol, rtol))


def _decodes(report: Report, m: Manifest, model, cfg, sessions: dict, backends: dict, sentences: int, data, atol: float | None,
             rtol: float | None, echo, out_len: int, beams: tuple[int, ...] | None, progress=None, strict: bool = False) -> list[list[int]]:
    """The decode stages, each decode at most `out_len` tokens: every step against PyTorch, then (a model imported from
    Hugging Face) transformers' generate at `beams`. Returns the sentences' ids. `progress`: where stage lines go."""
    progress = progress or echo
    progress(f"verify: decodes run to at most {out_len} tokens (the model allows {m.max_output_len}"
         + ("" if out_len == m.max_output_len else "; --max-len raises it, --full runs to the model's limit") + ")")
    with stage(f"decoding {sentences} sentences, every step against PyTorch", progress):
        src_ids = _decode(report, m, model, cfg, sessions, backends, sentences, data, atol, rtol, echo, out_len)
    if architectures.imported(m.model):  # imported from Hugging Face: its own generate is the final word
        from toolkit.verify.hf_parity import generate_parity

        with stage("transformers' generate against tk's decoding", progress):
            generate_parity(report, m, model, backends, src_ids, echo, out_len, beams, strict)
    return src_ids


def _decode(report: Report, m: Manifest, model, cfg, sessions: dict, backends: dict, sentences: int, data, atol: float | None,
            rtol: float | None, echo, out_len: int | None = None) -> list[list[int]]:
    """Greedy decodes of held-out sentences, every step's outputs against PyTorch's, then the translations token
    for token; returns the sentences' ids (the attention check decodes them too). Only translation models."""
    from toolkit.core.tokenizers import open_tokenizer
    from toolkit.pytorch.torch_backend import TorchBackend

    tok_path = m.tokenizer_path()
    if m.kind != architectures.SEQ2SEQ or tok_path is None or sentences <= 0:
        return []
    specs = m.specs()
    max_len = getattr(cfg, "max_len", 64)
    english, origin = held_out_sentences(sentences, data)
    echo(f"decoding {len(english)} sentences from the {origin}")
    src_ids = [ids[:max_len] for ids in open_tokenizer(m).encode(english)]
    rules, out_len = m.rules(), out_len or m.max_output_len
    ref_backend = TorchBackend(model, specs["encoder"], specs["decoder"])
    # Batch invariance is the model's (a mask left out), checked on the first session that can show it exactly: not
    # int8, whose activations take one quantisation scale per batch, so a sentence's logits move with its batch
    # (docs/performance.md) and a near-tie can flip in any model. An int8-only run leaves it to the fp32 graphs' run.
    batch_session = next((key for key in sessions if key[1] != "int8"), None)
    for (p, v), s in sessions.items():
        echo(f"decode: {v} on {p}")
        parity = ParityBackend(ref_backend, s, specs, v, p, tolerance(v, atol, rtol), report.rows)
        try:
            greedy(parity, src_ids, out_len, rules=rules)
            report.failing_inputs = report.failing_inputs or parity.failing_inputs
            report.step_errors[f"{v}/{p}"] = [parity.step_errors[k] for k in sorted(parity.step_errors)]
            compare_translations(report.rows, ref_backend, backends[(p, v)](), src_ids, out_len, v, p, tolerance(v, atol, rtol), rules)
            if (p, v) == batch_session:  # once, on the graphs as deployed: padding leaking into attention
                check_batch_invariance(report.rows, backends[(p, v)](), src_ids, out_len, v, p, tolerance(v, atol, rtol), rules)
        except Exception as e:  # ONNX Runtime refusing a real sentence is a verdict, reported like any other
            failed_run(report.rows, "decode", specs["decoder"], v, p, f"{len(src_ids)} sentences", RunFailure(first_line(e)))
    return src_ids
