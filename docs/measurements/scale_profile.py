"""Where tk's decoding time goes on the `tk bench --scale` work model: ONNX Runtime's profiler over the decoder (op-type
totals and the costliest nodes), and the decoding loop's backend calls timed in the same process (decoder runs,
ranking, row selection, the loop's own Python). One batch of the bench's kind of sources (24 random tokens and the end
token, or with --sources the first lines of a file as `tk bench --scale --sources` encodes them), exactly --tokens
tokens per sentence, decoded --warm times first and then once more: only that last decode is
reported. A process's first decodes map fresh memory for every output and growing cache (27,000 page faults in the
first fp32 greedy decode at batch 32, 2 in the third); a profile of a first decode charged that to whichever node writes
the graph's output (the forbidden-token `Add`: 11% of the fp32 step, 3% once warm), which the bench's rounds, after a
warm-up round, never pay.

    python docs/measurements/scale_profile.py [--variant int8|optimized|fp32] [--beam 4] [--batch 16] [--warm 2]
        [--model DIR] [--sources FILE] [--no-kernels] [--shortlist]

--shortlist: the decoder rewritten for the directory's shortlist, as `Translator(DIR, shortlist=True)` loads it.

--variant: int8 (default), optimized (the float32 graphs tk runs on CPU: attention fused) or fp32 (as exported); a
variant the directory does not store is built in memory as tk builds it.

DIR: the tk directory of the work model (default $TK_CACHE_DIR/bench-scale/opus-mt/tk, made by `tk bench --scale
opus-mt`). Shares, not absolute times, compare between machines.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    from toolkit.core import manifest
    from toolkit.core.batching import DecodeOptions, decode_ids
    from toolkit.core.load_cache import default_directory
    from toolkit.graphs.native_attention import native_attention
    from toolkit.graphs.sentence_cross import cross_per_sentence
    from toolkit.graphs.variants import graph_source
    from toolkit.runtimes.onnxruntime import native
    from toolkit.runtimes.onnxruntime.backend import OrtBackend
    from toolkit.runtimes.onnxruntime.sessions import create_session

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=["int8", "optimized", "fp32"], default="int8")
    parser.add_argument("--warm", type=int, default=2, help="decodes before the profiled one")
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--sources", type=Path, default=None, help="real sentences: the first --batch lines of this file")
    parser.add_argument("--no-kernels", action="store_true", help="ONNX Runtime's attention, not tk's kernels")
    parser.add_argument("--shortlist", action="store_true", help="decode over the directory's shortlist")
    args = parser.parse_args()
    model = args.model or default_directory() / "bench-scale" / "opus-mt" / "tk"
    m = manifest.load(model)
    specs = m.specs()
    prefix = os.path.join(tempfile.mkdtemp(prefix="tk-profile-"), "decoder")

    def profiled(options) -> None:
        options.enable_profiling = True
        options.profile_file_prefix = prefix

    encoder = create_session(graph_source(m, "encoder", args.variant)[0], threads=args.threads)
    # As tk loads it on the CPU: the cross-attention regrouped per sentence where it applies.
    graph = graph_source(m, "decoder", args.variant)[0]
    graph = cross_per_sentence(graph, specs["decoder"].constant_inputs) or graph
    kernels = native.library() is not None and not args.no_kernels  # tk's attention kernels, as tk loads it
    graph = (native_attention(graph) or graph) if kernels else graph
    print(native.status() if not args.no_kernels else "tk attention kernels: off (--no-kernels)")

    shortlisting = None
    if args.shortlist:  # rewritten last, as toolkit.runtimes.onnxruntime.loading does
        from toolkit.runtimes.onnxruntime.shortlisted import ShortlistBackend, prepare

        shortlisting = prepare(m)
        graph = shortlisting.graph(graph)

    def configured(options) -> None:
        profiled(options)
        if kernels:
            native.register(options)
        if shortlisting is not None:
            shortlisting.configure(options)

    decoder = create_session(graph, threads=args.threads, configure=configured)
    if shortlisting is not None:
        backend = ShortlistBackend(encoder, decoder, specs["encoder"], specs["decoder"], shortlisting)
    else:
        backend = OrtBackend(encoder, decoder, specs["encoder"], specs["decoder"])
    spent: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    for name in ("encode", "_run_host", "step_top_k", "reorder_beams", "select"):  # timed on this object only
        method = getattr(backend, name)

        def timed(*a, _method=method, _name=name, **kw):
            start = time.perf_counter()
            calls[_name] += 1
            try:
                return _method(*a, **kw)
            finally:
                spent[_name] += time.perf_counter() - start

        setattr(backend, name, timed)
    rng = np.random.default_rng(0)
    vocab = specs["decoder"].outputs[0].dims[-1]  # log_probs (batch, vocab)
    src = [[int(t) for t in rng.integers(2, vocab - 2, 24)] + [m.rules().end] for _ in range(args.batch)]
    if args.sources:  # as tk bench --scale --sources feeds them
        from toolkit.bench.scale import real_sources

        src = real_sources(args.sources, args.batch, model)
        print(f"sources: {len(src)} real sentences of {min(map(len, src))} to {max(map(len, src))} tokens")
    opts = DecodeOptions.bare(beam=args.beam, batch_size=args.batch, max_len=args.tokens, streams=1, rules=m.rules())
    for _ in range(args.warm):
        decode_ids(backend, src, opts)
    runs_before = calls["_run_host"]  # decoder runs of the warm-up decodes
    spent.clear()
    start = time.perf_counter()
    decode_ids(backend, src, opts)
    total = time.perf_counter() - start
    events = json.loads(Path(decoder.end_profiling()).read_text(encoding="utf-8"))
    runs = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    since = runs[runs_before]  # the first decoder run of the profiled decode
    by_op: collections.Counter[str] = collections.Counter()
    by_node: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= since:
            by_op[e["args"]["op_name"]] += e["dur"]
            by_node[e["name"][: -len("_kernel_time")]] += e["dur"]
    ops = sum(by_op.values())
    print(f"{args.variant}{' with the shortlist' if args.shortlist else ''}, beam {args.beam}, batch {args.batch}, "
          f"{args.tokens} tokens: {total * 1000:.0f} ms in all "
          f"(with the profiler on; the decode after {args.warm} others)")
    loop = total - spent["encode"] - spent["step_top_k"] - spent["reorder_beams"] - spent["select"]
    for name, seconds in [("encoder", spent["encode"]), ("decoder runs", spent["_run_host"]),
                          ("ranking", spent["step_top_k"] - spent["_run_host"]),
                          ("reorder_beams", spent["reorder_beams"]), ("select", spent["select"]), ("loop's Python", loop)]:
        print(f"  {name:16s} {seconds * 1000:8.0f} ms {100 * seconds / total:5.1f}%")
    print(f"decoder ops, {ops / 1000:.0f} ms:")
    for op, us in by_op.most_common(12):
        print(f"  {op:24s} {us / 1000:8.1f} ms {100 * us / ops:5.1f}%")
    print("costliest nodes:")
    for node, us in by_node.most_common(6):
        print(f"  {node[:60]:60s} {us / 1000:8.1f} ms {100 * us / ops:5.1f}%")


if __name__ == "__main__":
    main()
