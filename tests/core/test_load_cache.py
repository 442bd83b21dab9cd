"""The start-up cache (toolkit.core.load_cache, toolkit.runtimes.onnxruntime.graph_cache): a changed model file is still caught, and a changed or
corrupt cache entry is ignored, never trusted and never an error; the cached graphs compute exactly
what the model's own graphs compute."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from toolkit.core import load_cache, manifest
from toolkit.core.decode_options import DecodeOptions
from toolkit.core.errors import UsageError
from toolkit.deploy.translate import open_model, translate_batch
from toolkit.runtimes.onnxruntime import graph_cache
from toolkit.runtimes.onnxruntime.sessions import create_session

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"
SRC = np.array([[12, 57, 300, 9, 3], [40, 41, 3, 0, 0]], dtype=np.int64)
SRC_LEN = np.array([5, 3], dtype=np.int64)
SENTENCES = ["I'm home.", "Where is the station?", "The cat is sleeping on the sofa.", "Call me at 555 0199."]


@pytest.fixture()
def model_copy(tmp_path, monkeypatch) -> Path:
    """The shipped Transformer copied where it may be edited, with its own empty cache directory."""
    monkeypatch.setenv("TK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TK_NO_CACHE", raising=False)
    monkeypatch.setattr(load_cache, "SETTLE_S", 0.0)  # the copy was written just now
    out = tmp_path / "transformer"
    shutil.copytree(SHIPPED, out)
    return out


def encoder_outputs(t) -> list[np.ndarray]:
    return t.backend().encoder.run(None, {"src": SRC, "src_len": SRC_LEN})


def uncached_outputs(directory: Path) -> list[np.ndarray]:
    return create_session(directory / "encoder.onnx").run(None, {"src": SRC, "src_len": SRC_LEN})


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_an_edited_weights_file_is_caught_though_its_digest_was_cached(model_copy, monkeypatch):
    m = manifest.load(model_copy)
    m.check_files(cached=True)
    weights = model_copy / "weights.bin"
    assert os.path.realpath(weights) in json.loads((load_cache.directory() / load_cache.DIGESTS).read_text())["files"]
    # Unchanged files are not hashed again: that is the point of the cache.
    with monkeypatch.context() as patch:
        patch.setattr(manifest, "file_sha256", lambda path: pytest.fail(f"{path} hashed again"))
        m.check_files(cached=True)

    # One byte changed in place (same size, same inode), then its old mtime put back: ctime still moves.
    before = weights.stat()
    flip_byte(weights, weights.stat().st_size // 2)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(UsageError, match="weights.bin does not match the sha256"):
        manifest.load(model_copy).check_files(cached=True)
    with pytest.raises(UsageError, match="weights.bin does not match the sha256"):
        open_model(model_copy, "cpu")


def test_a_corrupt_digest_cache_is_ignored(model_copy):
    m = manifest.load(model_copy)
    m.check_files(cached=True)
    (load_cache.directory() / load_cache.DIGESTS).write_bytes(b"\x00{not json")
    m.check_files(cached=True)
    # A wrong digest under the right stat can only come from a tampered cache, which the user owns;
    # a truncated or hand-edited entry of another shape is ignored.
    (load_cache.directory() / load_cache.DIGESTS).write_text(json.dumps({"format": 1, "files": {str(model_copy / "weights.bin"): "x"}}))
    m.check_files(cached=True)


def translations(t) -> list[tuple[str, float]]:
    """Greedy and beam translations with their scores: every decoder output they depend on."""
    out = []
    for beam in (1, 4):
        opts = DecodeOptions.for_manifest(t.manifest, beam=beam)
        out += [(h[0].text, h[0].score) for h in translate_batch(t, SENTENCES, opts)]
    return out


def test_cached_graphs_compute_exactly_what_the_model_graphs_compute(model_copy, monkeypatch):
    first = open_model(model_copy, "cpu")
    entries = sorted((load_cache.directory() / "graphs").iterdir())
    assert len(entries) == 2 and all((e / graph_cache.ENTRY).is_file() for e in entries)
    expected = uncached_outputs(model_copy)
    assert same(encoder_outputs(first), expected)
    # The second start loads the saved graphs and saves nothing.
    with monkeypatch.context() as patch:
        patch.setattr(graph_cache, "_save", lambda *a: pytest.fail("the cached graph was not used"))
        second = open_model(model_copy, "cpu")
    assert same(encoder_outputs(second), expected)
    monkeypatch.setenv("TK_NO_CACHE", "1")
    assert translations(second) == translations(open_model(model_copy, "cpu"))


def test_a_changed_cache_entry_is_rebuilt_from_the_model(model_copy):
    open_model(model_copy, "cpu")
    expected = uncached_outputs(model_copy)
    # Every cached weight zeroed, size kept: loadable, but computing something else.
    for data in (load_cache.directory() / "graphs").glob(f"*/{graph_cache.DATA}"):
        data.write_bytes(bytes(data.stat().st_size))
    assert same(encoder_outputs(open_model(model_copy, "cpu")), expected)
    assert same(encoder_outputs(open_model(model_copy, "cpu")), expected)  # and the rebuilt entry is sound


def test_an_unloadable_cache_entry_falls_back_to_the_model_without_an_error(model_copy):
    open_model(model_copy, "cpu")
    expected = uncached_outputs(model_copy)
    # Garbage whose stat the entry records as its own (as a disk error under an intact entry would leave it).
    for entry in (load_cache.directory() / "graphs").iterdir():
        (entry / graph_cache.GRAPH).write_bytes(b"not an onnx graph")
        record = json.loads((entry / graph_cache.ENTRY).read_text())
        record["stat"][graph_cache.GRAPH] = load_cache._stat_key(entry / graph_cache.GRAPH)
        (entry / graph_cache.ENTRY).write_text(json.dumps(record))
    assert same(encoder_outputs(open_model(model_copy, "cpu")), expected)


def test_new_weights_get_new_cached_graphs(model_copy):
    before = encoder_outputs(open_model(model_copy, "cpu"))
    # Re-export-like edit: new weights, and the manifest's digests rewritten to match them.
    weights = model_copy / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[: len(data) // 2] = bytes(len(data) // 2)
    weights.write_bytes(bytes(data))
    m = manifest.load(model_copy)
    for g in m.graphs.values():
        g.weights.sha256 = manifest.file_sha256(weights)
    m.save()
    after = encoder_outputs(open_model(model_copy, "cpu"))
    assert same(after, uncached_outputs(model_copy)) and not same(after, before)
    assert len(list((load_cache.directory() / "graphs").iterdir())) == 4


def test_no_cache_when_turned_off_or_unwritable(model_copy, monkeypatch, tmp_path):
    monkeypatch.setenv("TK_NO_CACHE", "1")
    t = open_model(model_copy, "cpu")
    assert not load_cache.directory() and not (tmp_path / "cache").exists()
    monkeypatch.delenv("TK_NO_CACHE")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TK_CACHE_DIR", str(blocker / "cache"))  # a directory that cannot be created
    assert same(encoder_outputs(open_model(model_copy, "cpu")), encoder_outputs(t))


def test_a_variant_built_at_load_is_kept_and_not_built_again(model_copy, monkeypatch):
    """The shipped directories store fp32 only; int8 is built at the first start (seconds), then loaded
    from the cache: a later start builds nothing and computes what a fresh build computes."""
    from toolkit.graphs import variants

    first = open_model(model_copy, "cpu", "int8")
    assert first.built_s > 0
    real = variants.graph_source
    with monkeypatch.context() as patch:
        patch.setattr(variants, "graph_source", lambda *a: pytest.fail("the cached int8 graph was not used"))
        second = open_model(model_copy, "cpu", "int8")
    assert second.built_s == 0
    monkeypatch.setenv("TK_NO_CACHE", "1")
    assert translations(second) == translations(open_model(model_copy, "cpu", "int8"))
    monkeypatch.delenv("TK_NO_CACHE")
    # Changed variant-building code (another tk version) gets a new build, not the old copy.
    built = []
    monkeypatch.setattr(variants, "builder_digest", lambda: "another-builder")
    monkeypatch.setattr(variants, "graph_source", lambda *a: built.append(a) or real(*a))
    open_model(model_copy, "cpu", "int8")
    assert len(built) == 2
