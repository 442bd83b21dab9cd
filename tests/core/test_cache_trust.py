"""The start-up cache is trusted only where no one else could have written it, and a cached graph only
while its content is what was saved (issue 36, class 4)."""

from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path

import onnx
import pytest

from toolkit.core import load_cache
from toolkit.deploy.api import Translator
from toolkit.runtimes.onnxruntime import graph_cache

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"
SENTENCES = ["I'm home.", "Where is the station?", "The cat is sleeping on the sofa."]


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("TK_CACHE_DIR", str(root))
    monkeypatch.delenv("TK_NO_CACHE", raising=False)
    monkeypatch.setattr(load_cache, "_checked", {})
    return root


def translate() -> list[str]:
    return Translator(SHIPPED, provider="cpu").translate(SENTENCES)


def test_a_cache_directory_others_can_write_is_not_used(cache, capfd):
    cache.mkdir(mode=0o700)
    cache.chmod(0o777)
    expected = translate()
    assert "not using the cache directory" in capfd.readouterr().err
    assert not any(cache.iterdir())  # nothing written into it, nothing read from it
    cache.chmod(0o700)
    load_cache._checked.clear()
    assert translate() == expected and (cache / "graphs").is_dir()


def test_a_cache_file_others_can_write_is_ignored(cache):
    cache.mkdir(mode=0o700)
    (cache / load_cache.DIGESTS).write_text(json.dumps({"format": load_cache.FORMAT, "files": {"x": {"stat": [], "sha256": "0"}}}))
    assert load_cache.read_json(cache / load_cache.DIGESTS)
    (cache / load_cache.DIGESTS).chmod(0o666)
    assert load_cache.read_json(cache / load_cache.DIGESTS) == {}


def test_a_cache_owned_by_another_user_is_refused():
    st = os.stat_result((0o40700, 0, 0, 2, os.geteuid() + 1, 0, 0, 0, 0, 0))
    assert load_cache._unsafe(st) == "owned by another user"
    st = os.stat_result((0o40700, 0, 0, 2, os.geteuid(), 0, 0, 0, 0, 0))
    assert load_cache._unsafe(st) is None


def test_an_edited_cached_graph_with_its_stat_rewritten_is_rebuilt_not_run(cache):
    expected = translate()
    entries = [d for d in (cache / "graphs").iterdir() if (d / graph_cache.GRAPH).is_file()]
    assert entries
    originals = {}
    for entry in entries:
        path = entry / graph_cache.GRAPH
        originals[path] = path.read_bytes()
        graph = onnx.load(str(path), load_external_data=False)
        add = next(n for n in graph.graph.node if n.op_type == "Add")
        add.op_type = "Sub"  # still a valid graph of the same shapes, computing something else
        path.write_bytes(graph.SerializeToString())
        record = json.loads((entry / graph_cache.ENTRY).read_text())
        record["stat"][graph_cache.GRAPH] = load_cache.own_stat_key(path)  # as an attacker would
        (entry / graph_cache.ENTRY).write_text(json.dumps(record))
    assert translate() == expected
    for path, original in originals.items():
        assert path.read_bytes() == original  # rebuilt from the model's own graph


def test_a_cache_entry_written_by_this_version_records_the_graphs_digest(cache):
    translate()
    for entry in (cache / "graphs").iterdir():
        if (entry / graph_cache.ENTRY).is_file():
            record = json.loads((entry / graph_cache.ENTRY).read_text())
            assert record["graph_crc32"] == zlib.crc32((entry / graph_cache.GRAPH).read_bytes())


def test_the_cache_directory_is_created_private(cache):
    translate()
    assert (cache.stat().st_mode & 0o777) == 0o700
    shutil.rmtree(cache)
