"""`tk bench --scale` with the shortlist: tk over its shortlist and CTranslate2 over a vmap of the same candidates, side
by side with tk without it, on the tiny Marian shape (an import: its decoder adds a mask of never-emitted tokens after
the log-softmax, which the shortlisted decoder gathers as well)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOKENS = 7


def test_shortlist_rows_run_beside_tk_and_ctranslate2_vmap(tmp_path, tiny_bench_work):
    pytest.importorskip("ctranslate2")
    from toolkit.bench import scale
    from toolkit.core import manifest, shortlist
    from toolkit.core.batching import DecodeOptions, decode_ids
    from toolkit.core.digests import file_sha256
    from toolkit.runtimes import registry

    rows = (scale.Row("greedy, batches of 3", 6, 3, 1), scale.Row("beam 4, batches of 2", 4, 2, 4))
    engines = ["tk-fp32", "tk-fp32-shortlist", "tk-int8-shortlist", "ct2-fp32-vmap"]
    steps, runs = scale.bench_scale("tiny", tiny_bench_work, engines, tokens=TOKENS, threads=1, repeat=1, rows=rows,
                                    echo=lambda m: None, pause=0.0)
    assert [r.error for r in runs] == [None] * len(engines)
    assert "synthetic shortlist for tk and vmap for CTranslate2" in steps
    assert (tmp_path / "work" / "ct2" / "vmap.txt").read_text(encoding="utf-8").startswith("\t")  # always-allowed first
    for row in rows:
        for run in runs:
            assert [len(o) for o in run.outputs[row.name]] == [TOKENS] * row.sentences, (run.engine, row.name)
    table = scale.table(runs, rows, TOKENS)
    assert "tk shortlist/tk fp32" in table and "tk shortlist/CT2 vmap fp32" in table
    # Each sentence decodes over its own candidates on the import too: the same tokens alone as in one batch. Two
    # candidates per source token (the bench's table lets every sentence emit most of the tiny vocabulary).
    tk = tmp_path / "work" / "tk"
    end = manifest.load(tk).rules().end
    listed = np.array([(s * k) % 400 for s in range(400) for k in (7, 13)], np.int32)
    tight = shortlist.Shortlist(np.arange(0, 801, 2, dtype=np.int64), listed, np.array([end], np.int32))
    (tk / shortlist.FILE).write_bytes(tight.to_bytes())
    with manifest.updating(tk) as m:
        m.shortlist.sha256 = file_sha256(tk / shortlist.FILE)
    m = manifest.load(tk)
    backend = registry.load(m, registry.DEFAULT, "cpu", "fp32", shortlist=True).backend()
    src = scale.sources(6, 24, 400, m.rules().end, m.rules().pad)
    opts = DecodeOptions.for_manifest(m, "cpu", batch_size=6, streams=1)
    together = [n[0].tokens for n in decode_ids(backend, src, opts)]
    assert together == [decode_ids(backend, [s], opts)[0][0].tokens for s in src]
