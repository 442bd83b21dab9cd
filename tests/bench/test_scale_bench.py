"""`tk bench --scale`: the harness on its tiny shape. What the lead's full-size run relies on: every engine, each in a
process of its own, decodes exactly the number of tokens asked (fixed work), and tk's fp32 tokens are transformers'
own (greedy and beam 4). Optimum is left out: it lives in an environment of its own (--peer-python)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOKENS = 9
ENGINES = ["tk-fp32", "tk-int8", "ct2-fp32", "ct2-int8", "transformers", "tk-cuda-fp32", "transformers-cuda"]
# A Tatoeba Challenge file's layout (the source column is read), lengths from 2 words to 14.
SENTENCES = ["eng\tfra\tThe cat.\tLe chat.", "eng\tfra\tWe will see the big red house by the river tomorrow morning, and you?\tx",
             "eng\tfra\tShe runs.\tx", "eng\tfra\tThey often walk to the station in the evening with a book.\tx",
             "eng\tfra\tIs it green or blue?\tx", "eng\tfra\tCoffee, tea and bread are on the small table today.\tx"]
CUDA = {"tk-cuda-fp32": "ONNX Runtime could not load its CUDA provider", "transformers-cuda": "sees no CUDA device"}


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "engines"), [("tiny", ENGINES), ("tiny-m2m100", ["tk-fp32", "ct2-fp32", "transformers"])])
def test_every_engine_decodes_the_same_tokens_and_tk_matches_transformers(tmp_path, shape, engines, request, monkeypatch):
    """Marian (opus-mt's architecture) and M2M100 (NLLB's), each converted by CTranslate2's own converter."""
    from toolkit.bench import scale

    rows = (scale.Row("greedy, batches of 3", 6, 3, 1), scale.Row("beam 4, batches of 2", 4, 2, 4),
            scale.Row("one per call", 2, 1, 1, per_call=True),
            # Sentences of varied lengths (--sources): padded batches, each engine batching them its own way.
            scale.Row("real, greedy, batches of 3", 6, 3, 1, real=True), scale.Row("real, beam 4, batches of 3", 6, 3, 4, real=True))
    text = tmp_path / "sources.txt"
    text.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    # Marian on two threads: tk decodes the batches of a row on two streams (as `tk translate` does on two cores), and
    # CTranslate2 is timed both of its ways (intra or inter threads), the faster kept. M2M100 on one (the suite's time).
    threads = 2 if shape == "tiny" else 1
    if shape == "tiny":  # the shared, prepared work directory (copied to tmp_path / "work")
        request.getfixturevalue("tiny_bench_work")
    steps, runs = scale.bench_scale(shape, tmp_path / "work", engines, tokens=TOKENS, threads=threads, repeat=1, rows=rows,
                                    echo=lambda m: None, pause=0.0, text=text)
    # Without a GPU each CUDA engine says why in one line and the others' rows go on; with one, it runs like the rest.
    if not _cuda_visible():
        skipped = {r.engine: r.error for r in runs if r.error}
        assert set(skipped) == set(CUDA) & set(engines)
        assert all(CUDA[e] in why and "\n" not in why for e, why in skipped.items()), skipped
        assert "tk/transformers cuda fp32" not in scale.table(runs, rows, TOKENS)  # a ratio only where both engines ran
        runs = [r for r in runs if r.engine not in CUDA]
    assert [r.engine for r in runs if r.error] == []
    by = {r.engine: r for r in runs}
    lengths = sorted(map(len, scale.real_sources(text, len(SENTENCES), tmp_path / "work" / "tk")))
    assert lengths[0] * 3 < lengths[-1], lengths  # the real rows' sources do vary in length
    if threads == 2:
        assert by["tk-fp32"].threads.startswith("2 streams x 1 intra-op threads")  # as `tk translate` on two cores
        ways = {"intra_threads 2 x inter_threads 1", "intra_threads 1 x inter_threads 2"}
        assert all(set(by["ct2-fp32"].how[row.name]) <= ways and by["ct2-fp32"].how[row.name] for row in rows)
    # Each engine's memory is stated: its worker's resident memory once loaded, and its peak over the rounds.
    assert all(0 < r.loaded_mib <= r.peak_mib and r.memory().endswith(f"peak {r.peak_mib:,.0f} MiB") for r in runs), \
        [(r.engine, r.loaded_mib, r.peak_mib) for r in runs]
    for row in rows:
        for run in runs:
            assert [len(o) for o in run.outputs[row.name]] == [TOKENS] * row.sentences, (run.engine, row.name)
            assert all(s > 0 for s in run.seconds[row.name])
        assert by["tk-fp32"].outputs[row.name] == by["transformers"].outputs[row.name], row.name
    # The preparation's cost is reported, and a second run reuses what the first one built.
    assert {"tk export hf:DIR", "CTranslate2 TransformersConverter"} <= set(steps)
    if shape == "tiny":
        # Without --threads each engine gets the CPUs this process may use (taskset's or a container's share), not the
        # host's count: 16 threads on 2 allowed cores buried a rented machine's run.
        import os

        monkeypatch.setattr(os, "cpu_count", lambda: 16)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
        said: list[str] = []
        again, _ = scale.bench_scale(shape, tmp_path / "work", ["tk-fp32"], tokens=TOKENS, threads=None, repeat=1,
                                     rows=rows[:1], echo=said.append, pause=0.0)
        assert any("; 1 threads each;" in m for m in said), said
        assert again and {k: v.seconds for k, v in again.items()} == {k: steps[k].seconds for k in again}
    else:
        _tks_own_conversion_of_an_untrained_model_verifies(tmp_path / "work")


def _cuda_visible() -> bool:
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers() and Path("/dev/nvidiactl").exists()


def _tks_own_conversion_of_an_untrained_model_verifies(work: Path) -> None:
    """The bench's M2M100 is built from config, untrained: its unit layer-norm scales are stored once in the graphs
    (under the first module's name), and its random decoder does not choose the target language itself. tk's own
    conversion (`tk export DIR --ctranslate2`) must find every layer norm, and verify must hold CTranslate2 to tk's
    loop as translate runs it (the target language forced first on both)."""
    import shutil

    from click.testing import CliRunner

    from toolkit.cli import main

    out = work.parent / "tk-ct2"
    shutil.copytree(work / "tk", out)
    result = CliRunner().invoke(main, ["export", str(out), "--ctranslate2"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["verify", str(out), "--runtime", "ctranslate2", "--checkpoint", f"hf:{work / 'hf'}",
                                       "--sentences", "4"])
    assert result.exit_code == 0, result.output
    assert "4/4 identical to the ONNX graphs'" in result.output


def test_a_work_directory_it_did_not_write_is_refused_and_kept(cli, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = cli("bench", "--scale", "tiny", "--work", mine)
    assert result.exit_code != 0
    assert "was not written by tk bench --scale" in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("args, message", [
    (["--scale", "tiny", "--engines", "tk-fp32,ct3"], "unknown engine 'ct3'"),
    (["--scale", "tiny", "--engines", ","], "no engine named"),
    (["--scale", "tiny", "--text", __file__], "drop --text"),
    (["--engines", "tk-fp32"], "add --scale"),
    (["--sources", __file__], "add --scale"),
])
def test_scale_options_are_checked_in_one_line(cli, args, message):
    result = cli("bench", *args)
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output


def test_the_command_offers_the_harness_names(tmp_path: Path):
    """The command keeps the shapes and engines as names (so `tk --help` imports no bench module): the harness's own."""
    from toolkit.bench import scale
    from toolkit.bench.scale_model import SHAPES
    from toolkit.cli.commands import bench

    assert tuple(bench.SCALE_SHAPES) == tuple(SHAPES) and tuple(bench.SCALE_ENGINES) == scale.ENGINES

