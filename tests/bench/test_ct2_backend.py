"""CTranslate2's CPU backend (MKL or oneDNN) in `tk bench --scale`: the faster in a short probe per precision, or the one
--ct2-backend forces, set in the environment of the worker that loads CTranslate2, printed and written in the JSON."""

from __future__ import annotations

import json

import pytest

from toolkit.core.errors import UsageError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
pytest.importorskip("ctranslate2", reason="the ct2 extra")


@pytest.fixture()
def work(tiny_bench_work):
    return tiny_bench_work


def test_a_forced_backend_is_what_the_worker_loading_ctranslate2_was_given(work):
    """MKL, which CTranslate2 would not choose on an AMD CPU: the worker saw CT2_USE_MKL=1 and CTranslate2 says MKL."""
    from toolkit.bench import scale

    row = (scale.Row("greedy, batches of 2", 2, 2, 1),)
    _, runs = scale.bench_scale("tiny", work, ["ct2-fp32", "ct2-int8"], tokens=5, threads=1, repeat=1, rows=row,
                                echo=lambda m: None, pause=0.0, ct2_backend="mkl")
    for r in runs:
        assert r.error is None, r.error
        assert r.ct2_backend == {"backend": "mkl", "chosen": "forced", "probe": {}, "CT2_USE_MKL": "1"}, r.engine
        assert "SGEMM MKL, int8 MKL" in r.version, r.version  # as CTranslate2 reports it in the worker's environment


def test_auto_keeps_the_faster_in_the_probe_and_the_table_and_json_say_so(cli, work, tmp_path):
    from toolkit.runtimes.ctranslate2.engine import GEMM

    out = tmp_path / "scale.json"
    result = cli("bench", "--scale", "tiny", "--work", work, "--engines", "ct2-int8", "--tokens", 5, "--repeat", 1,
                 "--threads", 1, "--json", out)
    assert result.exit_code == 0, result.output
    (engine,) = json.loads(out.read_text())["engines"]
    chosen = engine["ct2_backend"]
    probe = chosen["probe"]["int8"]
    assert set(probe) == set(GEMM) and all(p["seconds"] > 0 for p in probe.values()), probe
    assert chosen["backend"] == min(probe, key=lambda b: probe[b]["seconds"]) and chosen["chosen"] == "probe"
    assert chosen["CT2_USE_MKL"] == GEMM[chosen["backend"]]  # what its worker was started with
    line = next(x for x in result.output.splitlines() if x.startswith("- ct2-int8: "))
    assert f"CTranslate2 on {chosen['backend']} (the faster in a probe" in line
    assert all(f"{b} {p['seconds']:.3f} s" in line for b, p in probe.items()), line


def test_a_bad_backend_is_one_line_before_any_work(cli, tmp_path):
    from toolkit.bench import scale

    result = cli("bench", "--scale", "tiny", "--work", tmp_path / "w", "--ct2-backend", "openblas")
    assert result.exit_code == 2 and "--ct2-backend" in result.output and len(result.output.strip().splitlines()) == 1
    with pytest.raises(UsageError, match="--ct2-backend 'openblas' is not a CTranslate2 backend; choose one of auto, mkl"):
        scale.bench_scale("tiny", tmp_path / "w", ["ct2-fp32"], ct2_backend="openblas")
    assert not (tmp_path / "w").exists()


def test_ctranslate2_is_timed_at_the_thread_counts_of_the_cpus_this_process_may_use(monkeypatch):
    """On 2 CPUs of a 16-core host (taskset, a container's share), CTranslate2's candidates stop at 2 threads: more
    would time it against oversubscribed cores, not at its best."""
    import os

    from toolkit.runtimes.ctranslate2.engine import thread_candidates

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 7}, raising=False)
    assert thread_candidates() == [(1, 1), (1, 2), (2, 1)]
