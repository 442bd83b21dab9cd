"""The CTranslate2 comparison: the converted model must decode exactly what tk decodes, or its speed row means nothing."""

import json
import re

import pytest

pytest.importorskip("ctranslate2", reason="the ct2 extra (in dev) installs ctranslate2")


def test_converted_shipped_model_decodes_the_same_tokens_as_onnx_runtime(tmp_path):
    from toolkit.core import manifest
    from toolkit.core.batching import DecodeOptions, decode_ids
    from toolkit.core.tokenizer import Tokenizer
    from toolkit.runtimes.ctranslate2 import engine as ct2_engine
    from toolkit.runtimes.ctranslate2.spec import convert
    from toolkit.runtimes.onnxruntime.loading import load_sessions
    from toolkit.verify.checks import FALLBACK_SENTENCES

    m = manifest.load("exported/transformer")
    english = FALLBACK_SENTENCES + ["Where did you put the keys?", "It is raining again today.", "I have never seen a whale.",
                                    "We should leave before it gets dark.", "could you help me", "MY FATHER IS A DOCTOR."]
    src = Tokenizer.load(m.tokenizer_path()).encode(english)
    tk = [h[0].tokens for h in decode_ids(load_sessions(m, "cpu").backend(), src, DecodeOptions.bare(batch_size=4))]
    with ct2_engine.Ct2Translator(convert(m, tmp_path / "ct2"), intra_threads=1) as tr:
        ct2 = tr.translate_ids(src, batch_size=4)
    assert ct2 == tk and all(tk)


def test_ct2_refuses_a_model_it_cannot_express(random_export, tmp_path):
    from toolkit.core import architectures, manifest
    from toolkit.core.errors import UsageError
    from toolkit.runtimes.ctranslate2.spec import convert

    with pytest.raises(UsageError, match="does not support a 'seq2seq' model; it supports " + ", ".join(
            a.name for a in architectures.ARCHITECTURES.values() if a.supports("ctranslate2"))):
        convert(manifest.load(random_export("seq2seq")), tmp_path / "ct2")


def test_bench_adds_ctranslate2_rows_with_ratios_and_states_the_threads(cli, tiny_export, tmp_path):
    out = tmp_path / "bench.json"
    result = cli("bench", "--model", tiny_export, "--sentences", 6, "--batch-size", 3, "--beam", 1, "--beam", 2, "--repeat", 1,
                 "--no-textbook", "--variant", "fp32", "--variant", "int8", "--runtime", "ctranslate2", "--ct2-backend", "dnnl",
                 "--json", out)
    assert result.exit_code == 0, result.output
    assert re.search(r"onnxruntime: batch 3: \d intra-op threads x \d decoding streams \(the fastest measured", result.output)
    # Its version and the matrix products it ran, as CTranslate2 itself reports them (MKL or oneDNN).
    assert re.search(r"ctranslate2 4\.\S+ \(SGEMM (DNNL|MKL), int8 (DNNL|MKL), AVX\S*\): batch 3: \d intra_threads x \d inter_threads",
                     result.output), result.output
    rows = {(r["backend"], r["search"]) for r in json.loads(out.read_text())}
    assert {("ctranslate2 float32", "greedy"), ("ctranslate2 int8", "greedy"), ("ctranslate2 float32", "beam 2")} <= rows
    # Its CPU backend (given here: the probe of --ct2-backend auto is tests/bench/test_ct2_backend.py's), on its rows.
    assert {json.dumps(r["ct2_backend"]) for r in json.loads(out.read_text()) if r["backend"].startswith("ctranslate2")} == {
        json.dumps({"backend": "dnnl", "chosen": "forced", "probe": {}})}
    assert "CTranslate2 on dnnl (--ct2-backend)" in result.output and "(SGEMM DNNL, int8 DNNL" in result.output
    ratios = result.output[result.output.index("CTranslate2 against tk") :].splitlines()
    greedy = next(line for line in ratios if line.startswith("greedy"))
    assert greedy.split()[-1] == "100%"  # the same greedy tokens as tk's fp32 graphs
    roofline = next(line for line in result.output.splitlines() if line.startswith("roofline:"))
    achieved, peak = (float(x) for x in re.findall(r"([0-9.]+) GFLOP/s", roofline))
    assert "fp32 greedy at batch 3" in roofline and 0 < achieved < peak


def test_the_ct2_table_holds_ctranslate2_against_tks_faster_fp32_graphs():
    from toolkit.bench.backends import Result, ct2_table

    def row(backend, search, seconds):
        return Result(backend, search, 1, seconds, 10, 100, 0.0, [[1, 2]] * 10)

    results = [row("onnxruntime cpu", "greedy", 1.0), row("onnxruntime cpu optimized", "greedy", 0.5),
               row("ctranslate2 float32", "greedy", 0.8), row("onnxruntime cpu", "beam 4", 1.0),
               row("onnxruntime cpu optimized", "beam 4", 2.0), row("ctranslate2 float32", "beam 4", 0.5)]
    lines = {line.split()[0]: line.split() for line in ct2_table(results).splitlines()[2:]}
    assert lines["greedy"][2:6] == ["20.0", "optimized", "12.5", "0.62"]  # the optimised graphs were faster
    assert lines["beam"][3:7] == ["10.0", "exported", "20.0", "2.00"]


def test_the_reported_backend_is_read_from_ctranslate2_s_own_lines():
    from toolkit.runtimes.ctranslate2.engine import reported_backends

    log = ("[info] CPU: AuthenticAMD (SSE4.1=true, AVX=true, AVX2=true, AVX512=true)\n[info]  - Selected ISA: AVX2\n"
           "[info]  - Use Intel MKL: true\n[info]  - SGEMM backend: MKL (packed: true)\n"
           "[info]  - GEMM_S16 backend: MKL (packed: true)\n[info]  - GEMM_S8 backend: MKL (packed: true, u8s8 preferred: true)\n")
    assert reported_backends(log) == "SGEMM MKL, int8 MKL, AVX2"
    assert reported_backends("nothing said") == ""
