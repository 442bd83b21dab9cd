"""`tk bench`."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import make_dataclass
from pathlib import Path

import click

from toolkit.cli.commands.options import (
    BATCH,
    BEAM,
    DATA_OPTION,
    DEFAULT_MODEL,
    STREAMS,
    THREADS,
    provider_option,
    read_glossary,
    runtime_option,
    writable_file,
)
from toolkit.core.decode_options import cores
from toolkit.core.engines import PROVIDERS
from toolkit.core.errors import UsageError
from toolkit.core.variants import NAMES
from toolkit.runtimes.ctranslate2.engine import GEMM_CHOICES
from toolkit.runtimes.registry import DEFAULT as DEFAULT_RUNTIME

# toolkit.bench.scale's names, kept here so that `tk --help` imports no bench module (a test keeps them equal).
SCALE_SHAPES = ("opus-mt", "tiny", "nllb-600m", "nllb-1.3b", "tiny-m2m100")
SCALE_ENGINES = ("tk-fp32", "tk-int8", "ct2-fp32", "ct2-int8", "optimum", "transformers",
                 "tk-cuda-fp32", "tk-cuda-fp16", "ct2-cuda-fp32", "ct2-cuda-fp16", "transformers-cuda", "transformers-cuda-fp16",
                 "tk-fp32-shortlist", "tk-int8-shortlist", "ct2-fp32-vmap", "ct2-int8-vmap")
SCALE_DEFAULT_ENGINES = SCALE_ENGINES[:6]  # the CPU's; the GPU's are named with --engines


@click.command()
@click.option("--model", "model_dir", type=click.Path(path_type=Path), default=DEFAULT_MODEL, show_default="exported/transformer")
@click.option("--sentences", type=click.IntRange(1, 100000), default=64, show_default=True, help="Held-out test sentences to decode.")
@click.option("--batch-size", "batch_sizes", type=BATCH, multiple=True, help="Batch sizes [default: 1 and 64].")
@click.option("--beam", "beams", type=BEAM, multiple=True, help="Beam sizes [default: 1 (greedy) and 4].")
@click.option("--no-textbook", is_flag=True, help="Skip the slow full-prefix PyTorch loop.")
@click.option("--repeat", type=click.IntRange(1, 1000), default=3, show_default=True,
              help="Timed runs per row, taken in turns across backends; the median is reported.")
@click.option("--variant", "variants", multiple=True, type=click.Choice(NAMES),
              help="Graph variants to time [default: fp32, the stored ones, and int8 on CPU / fp16 on CUDA, built in memory if not stored].")
@runtime_option(multiple=True, help="Runtimes to time, interleaved in one run (repeatable) [default: onnxruntime].")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the results as JSON.")
@click.option("--text", "text_path", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="User-level comparison instead: tk's Python API with its defaults against CTranslate2's fastest setting, "
                   "text in and text out, on this file (one sentence per line, or a Tatoeba Challenge file).")
@click.option("--reference", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="With --text: one reference translation per line, for the BLEU columns.")
@click.option("--lines", type=click.IntRange(1, 100000), default=2000, show_default=True, help="With --text: first lines of the file translated.")
@click.option("--glossary", type=click.Path(path_type=Path), metavar="FILE.tsv",
              help="With --text: after each file row, tk with this glossary (tk translate --glossary) against tk without it.")
@click.option("--requests", type=click.IntRange(1, 100000), default=200, show_default=True,
              help="With --text: sentences sent one call at a time for the single-request row.")
@click.option("--peer", "peers", multiple=True, type=click.Choice(["transformers", "optimum"]),
              help="With --text: also time a Hugging Face peer on the same weights (written with --to-hf): transformers' generate, "
                   "Optimum's ORTModelForSeq2SeqLM (its exporter, its defaults). Repeatable; fp32 rows.")
@click.option("--peer-python", type=click.Path(path_type=Path, dir_okay=False),
              help="With --peer: the Python that runs the peers [default: this one]. Optimum pins an older transformers than "
                   "the hf extra, so it usually lives in an environment of its own.")
@click.option("--serve", is_flag=True, help="Load-test `tk serve` instead: --clients concurrent clients on loopback, dynamic batching vs off.")
@click.option("--clients", type=click.IntRange(min=1), default=32, show_default=True, help="With --serve: concurrent clients.")
@click.option("--ray", "on_ray", is_flag=True, help="With --serve: tk serve against tk serve --ray (a local Ray) with 1 and 2 replicas, "
                                                    "the same load on each, instead of batching against no batching.")
@DATA_OPTION
@click.option("--threads", type=THREADS, help="ONNX Runtime intra-op threads [default: with --streams, measured first].")
@click.option("--streams", type=STREAMS, help="tk's concurrent decoding streams [default: the fastest (threads, streams) pair, measured first].")
@provider_option(help="ONNX Runtime's provider, with PyTorch on the same device beside it [default: cpu, and cuda where it truly loads].")
@click.option("--ct2/--no-ct2", default=None, help="CTranslate2 float32 and int8 rows [default: when ctranslate2 is installed; the ct2 extra].")
@click.option("--ct2-threads", type=(THREADS, THREADS), metavar="INTRA INTER",
              help="CTranslate2 intra and inter threads [default: the fastest measured first].")
@click.option("--ct2-backend", type=click.Choice(GEMM_CHOICES), default="auto", show_default=True,
              help="CTranslate2's CPU matrix products wherever it is timed: mkl, dnnl (oneDNN), or auto: both timed in a short "
                   "probe, each in a process of its own, the faster kept (per precision with --scale, whose engines have "
                   "processes of their own; one for the whole run otherwise).")
@click.option("--scale", type=click.Choice(list(SCALE_SHAPES)),
              help="Fixed-work rows on a model of the size users deploy instead: opus-mt (opus-mt-en-fr's shape, 75M weights), "
                   "built from config with random weights, exported by each engine's own tool, each engine in a process of "
                   "its own (tiny: the same harness in seconds).")
@click.option("--engines", "engines_text", metavar="LIST",
              help=f"With --scale: comma-separated engines [default: {','.join(SCALE_DEFAULT_ENGINES)}]; optimum runs under "
                   f"--peer-python. On a GPU: {','.join(SCALE_ENGINES[6:])}.")
@click.option("--tokens", type=click.IntRange(1, 1023), default=32, show_default=True,
              help="With --scale: tokens every engine decodes per sentence (the model never ends early).")
@click.option("--work", "work_dir", type=click.Path(path_type=Path, file_okay=False),
              help="With --scale: where the model and each engine's copy are kept between runs [default: the user cache, tk/bench-scale/SHAPE].")
@click.option("--sources", "sources_path", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="With --scale: also time rows of real sentences, the first lines of this file (one sentence per line, or a "
                   "Tatoeba Challenge file), varied in length; every engine still decodes exactly --tokens tokens.")
def bench(**given):
    """Measure decoding speed of PyTorch (textbook and cached), ONNX Runtime (CPU, CUDA), OpenVINO and CTranslate2 side by side.

    With --serve: throughput and latency percentiles of `tk serve` under concurrent single-sentence
    requests, with dynamic batching and with batching off.

    \b
    Example: tk bench --model exported/transformer --sentences 64
             tk bench --serve --clients 32 --sentences 2048
             tk bench --serve --ray --clients 32 --sentences 1024
             tk bench --text tatoeba-test-eng-fra.txt --lines 2000
    """
    o = BenchOptions(**given)
    _check_provider(o.provider, o.text_path)
    if o.scale:
        writable_file(o.json_path, "--json")
        return _scale(o)
    if o.engines_text or o.work_dir or o.sources_path:
        raise UsageError("--engines, --work and --sources choose the engines, work directory and sentences of --scale; add --scale opus-mt")
    if o.text_path:
        writable_file(o.json_path, "--json")
        return _text(o)
    if o.glossary:
        raise UsageError("--glossary times tk with a glossary in the user-level comparison; add --text FILE")
    if o.peers or o.peer_python:
        raise UsageError("--peer and --peer-python time the Hugging Face peers in the user-level comparison; add --text FILE")
    if o.serve and set(o.runtimes) - {DEFAULT_RUNTIME}:
        raise UsageError(f"--serve load-tests `tk serve` on {DEFAULT_RUNTIME}; drop --runtime {sorted(set(o.runtimes) - {DEFAULT_RUNTIME})[0]}")
    if o.on_ray and not o.serve:
        raise UsageError("--ray is an option of tk bench --serve; add --serve")
    if o.serve:
        return _serve(o)
    writable_file(o.json_path, "--json")
    _graphs(o)


# tk bench's options as one object, a field for each of the command's click options (by its parameter name), which
# the benches' helpers read: the click options are their one declaration.
BenchOptions = make_dataclass("BenchOptions", [p.name for p in bench.params], frozen=True)


def _graphs(o: BenchOptions) -> None:
    """The default bench: PyTorch (textbook and cached), ONNX Runtime, OpenVINO and CTranslate2 side by side."""
    import platform

    from toolkit.bench import backends as b
    from toolkit.runtimes.ctranslate2.engine import describe_gemm

    runtimes, ct2 = _ct2_rows(o.runtimes, o.ct2)
    notes: list[str] = []
    results = b.bench(o.model_dir, o.sentences, o.batch_sizes or (1, 64), o.beams or (1, 4), textbook=not o.no_textbook,
                      repeat=o.repeat, variants=list(o.variants) or None, echo=lambda m: click.echo(m, err=True),
                      runtimes=list(runtimes) or [DEFAULT_RUNTIME], threads=o.threads, providers=(o.provider,) if o.provider else PROVIDERS,
                      ct2=False if o.provider == "cuda" and ct2 is None else ct2, ct2_threads=o.ct2_threads, notes=notes, streams=o.streams,
                      data=o.data_path, ct2_backend=o.ct2_backend)
    for note in notes:
        click.echo(note)
    click.echo(f"machine: {platform.machine()}, {cores()} cores, {platform.processor() or platform.system()}")
    gemm = next((r.ct2_backend for r in results if r.ct2_backend), None)
    if gemm:
        click.echo(describe_gemm(gemm))
    click.echo(b.table(results))
    ct2_table = b.ct2_table(results)
    if ct2_table:
        click.echo("\nCTranslate2 against tk (ONNX Runtime CPU), sentences/s:")
        click.echo(ct2_table)
    write_json(o.json_path, [{k: v for k, v in r.__dict__.items() if k != "outputs"} for r in results])


def _serve(o: BenchOptions) -> None:
    """--serve: `tk serve` under concurrent single-sentence requests, with dynamic batching and with batching off (with
    --ray: tk serve against tk serve --ray with 1 and 2 replicas)."""
    import platform

    from toolkit.bench.serve_load import bench_serve, bench_serve_ray
    from toolkit.bench.serve_load import table as load_table
    from toolkit.core.data import describe, load_corpus, references

    corpus = load_corpus(o.data_path, download=False)
    click.echo(describe(corpus), err=True)
    english, _ = references(corpus.splits["test"])
    args = [a for v in o.variants[:1] for a in ("--variant", v)] + (["--provider", o.provider] if o.provider else [])
    run = bench_serve_ray if o.on_ray else bench_serve
    results = run(o.model_dir, english[:o.sentences], o.clients, (o.beams or (1,))[0], args, echo=lambda m: click.echo(m, err=True))
    click.echo(f"machine: {platform.machine()}, {cores()} cores; clients and server share them; loopback")
    click.echo(load_table(results))
    write_json(o.json_path, [{**r.__dict__, "throughput": r.throughput} for r in results])


def _ct2_rows(runtimes: tuple[str, ...], ct2: bool | None) -> tuple[tuple[str, ...], bool | None]:
    """A runtime that reads a converted copy (--runtime ctranslate2) asks for the converted rows (the --ct2 rows: it
    decodes in its own loop), beside tk's."""
    from toolkit.runtimes import registry

    converted = [r for r in runtimes if registry.get(r).runs == registry.CONVERTED]
    if not converted:
        return runtimes, ct2
    if ct2 is False:
        raise UsageError(f"--runtime {converted[0]} times CTranslate2's rows, which --no-ct2 turns off; drop one of them")
    return tuple(r for r in runtimes if r not in converted), True


def _check_provider(provider: str | None, text_path: Path | None) -> None:
    """--provider cuda times the GPU or nothing: a CUDA that cannot load is named, never replaced by the CPU."""
    if provider != "cuda":
        return
    from toolkit.core.errors import ProviderError
    from toolkit.runtimes.onnxruntime.cuda import cuda_fix
    from toolkit.runtimes.onnxruntime.sessions import cuda_available

    if text_path:
        raise UsageError("--text compares with CTranslate2 on the CPU; drop --provider cuda (tk bench --provider cuda times the GPU)")
    if not cuda_available():
        raise ProviderError(cuda_fix())


def _text(o: BenchOptions) -> None:
    """--text: tk's Python API with its defaults against CTranslate2's fastest setting, text in and text out."""
    import platform

    from toolkit.bench import text as text_bench
    from toolkit.core.batching import default_request_threads, default_streams, default_threads
    from toolkit.core.manifest import load as load_manifest
    from toolkit.runtimes.ctranslate2.engine import describe_gemm
    from toolkit.runtimes.onnxruntime.runtime import weights_bytes

    terms = read_glossary(o.glossary, raw=False)
    sources, refs = text_bench.read_text(o.text_path, o.reference)
    sources, refs = sources[:o.lines], refs[:o.lines] if refs else None
    echo = lambda m: click.echo(m, err=True)  # noqa: E731
    weights = weights_bytes(load_manifest(o.model_dir)) // 4
    per_variant = ", ".join(f"{v} {default_request_threads(v, weights)}" for v in (tuple(o.variants) or ("fp32", "int8")))
    echo(f"{len(sources)} lines of {o.text_path}; tk defaults here: {default_threads()} thread(s) x {default_streams()} stream(s) "
         f"for a file, a decoder on this many threads for a single request: {per_variant}")
    rows = text_bench.bench_text(o.model_dir, sources, refs, tuple(o.variants) or ("fp32", "int8"), tuple(o.beams) or (1, 4),
                                 min(o.requests, len(sources)), o.repeat, peers=tuple(dict.fromkeys(o.peers)),
                                 peer_python=str(o.peer_python) if o.peer_python else None, echo=echo, glossary=terms,
                                 ct2_backend=o.ct2_backend)
    click.echo(f"machine: {platform.machine()}, {cores()} cores, {platform.processor() or platform.system()}")
    click.echo(describe_gemm(next(e.backend for r in rows for e in r.engines if e.backend)))
    click.echo(text_bench.table(rows))
    write_json(o.json_path, [{**dataclasses.asdict(r), "tk_speedup": {e.name: r.speedup(e) for e in r.engines}} for r in rows])


def write_json(path: Path | None, rows: object) -> None:
    """--json (none where path is None): written whole or not at all (the previous file kept on a full disk); a FIFO or
    device written through."""
    from toolkit.core.atomic import write_atomic

    if path is not None:
        write_atomic(path, (json.dumps(rows, indent=2) + "\n").encode("utf-8"), user_path=True)


def parse_engines(text: str | None) -> list[str]:
    """--engines: a comma-separated subset of SCALE_ENGINES, in the order given, each once."""
    if text is None:
        return list(SCALE_DEFAULT_ENGINES)
    engines = list(dict.fromkeys(e.strip() for e in text.split(",") if e.strip()))
    unknown = [e for e in engines if e not in SCALE_ENGINES]
    if unknown or not engines:
        problem = f"unknown engine {unknown[0]!r}" if unknown else "no engine named"
        raise UsageError(f"--engines: {problem}; choose from {','.join(SCALE_ENGINES)}")
    return engines


def _scale(o: BenchOptions) -> None:
    """--scale: fixed-work rows on a model of the size users deploy, each engine in a process of its own."""
    import platform

    from toolkit.bench import scale as scale_bench
    from toolkit.core.load_cache import default_directory
    from toolkit.runtimes.ctranslate2.engine import describe_gemm

    others = [name for name, given in (("--text", o.text_path), ("--serve", o.serve), ("--peer", o.peers), ("--provider", o.provider))
              if given]
    if others:
        raise UsageError(f"--scale runs its own fixed-work rows; drop {', '.join(others)}")
    shape, tokens = o.scale, o.tokens
    engines = parse_engines(o.engines_text)
    work = o.work_dir or default_directory() / "bench-scale" / shape
    echo = lambda m: click.echo(m, err=True)  # noqa: E731
    rows = scale_bench.ROWS + (scale_bench.REAL_ROWS if o.sources_path else ())
    steps, runs = scale_bench.bench_scale(shape, work, engines, tokens, o.threads, o.repeat,
                                          str(o.peer_python) if o.peer_python else None, rows=rows, echo=echo, text=o.sources_path,
                                          ct2_backend=o.ct2_backend)
    click.echo(f"machine: {platform.machine()}, {cores()} cores, {platform.processor() or platform.system()}; "
               f"load average {os.getloadavg()[0]:.1f} at the end")
    click.echo("\n".join(f"- {s.name}: {s.seconds:.0f} s, peak {s.peak_mib:,.0f} MiB"
                          + (f", {s.size_mib:,.0f} MiB on disk" if s.size_mib else "") for s in steps.values()))
    for r in runs:
        click.echo(f"- {r.engine}: " + (f"skipped ({r.error})" if r.error else f"{r.version}; {r.threads}")
                   + (f"; {describe_gemm(r.ct2_backend)}" if r.ct2_backend and not r.error else "")
                   + (f"; {r.memory()}" if r.memory() and not r.error else ""))
        for row, ways in r.how.items():  # an engine timed two ways: the faster, each round
            click.echo(f"  {row}: {', '.join(ways)}")
    click.echo("\ntokens/s (each row's median over the rounds):\n")
    click.echo(scale_bench.table(runs, rows, tokens))
    write_json(o.json_path, {"shape": shape, "tokens": tokens, "steps": [s.__dict__ for s in steps.values()],
                             "engines": [{k: v for k, v in r.__dict__.items() if k != "outputs"} for r in runs]})
