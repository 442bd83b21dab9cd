"""Each writer's own check (the pipeline's verify stage) can fail: a write gone wrong after the writer wrote its files
(a byte flipped, a file cut short, a converter fault) is refused in one line, and nothing lands: no output directory,
or the model directory exactly as it was."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import REPO

from toolkit.convert import IntoModelDirectory, convert
from toolkit.core.errors import ToolkitError


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) * 2 // 3] ^= 0xFF
    path.write_bytes(bytes(data))


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _corrupting(writer, damage, name: str):
    """The writer, with `damage` done to its file `name` once it has written."""
    def write(m, tmp, echo):
        written = writer.write(m, tmp, echo)
        damage(tmp / name)
        return written

    return dataclasses.replace(writer, write=write)


def _to_hf(monkeypatch):
    from toolkit.convert import to_hf

    return _corrupting(to_hf.WRITER, _flip, "model.safetensors"), "transformer", "model.safetensors does not hold the graphs' weights"


def _web(monkeypatch):
    from toolkit.convert import web
    from toolkit.core.errors import UsageError

    try:
        web.ort_web_version()
    except UsageError:
        pytest.skip("onnxruntime-web is not installed in toolkit/web (npm ci --prefix toolkit/web)")
    return _corrupting(web.WRITER, _cut, "decoder.int8.onnx"), "seq2seq", "the int8 graphs are not all there"


def _ctranslate2(monkeypatch):
    """A converter fault: the first decoder layer's cross-attention keys and values swapped in the converted weights."""
    pytest.importorskip("ctranslate2", reason="the ct2 extra (in dev) installs ctranslate2")
    from toolkit.convert import ctranslate2
    from toolkit.runtimes.ctranslate2 import spec

    real = spec.graph_weights

    def swapped(m):
        w = real(m)
        k, v = "decoder_blocks.0.cross_attention.W_k.weight", "decoder_blocks.0.cross_attention.W_v.weight"
        w[k], w[v] = w[v], w[k]
        return w

    monkeypatch.setattr(spec, "graph_weights", swapped)
    return ctranslate2.WRITER, "transformer", "CTranslate2 scores a probe"


def _variants(monkeypatch):
    from toolkit.convert import variants
    from toolkit.core.variants import ExportOptions

    writer = variants.writer(ExportOptions(out=Path("."), quantize="int8"), None)
    return _corrupting(writer, _cut, "encoder.int8.onnx"), "seq2seq", "encoder.int8.onnx (the int8 encoder graph) is not an ONNX graph"


def _guarded_int8(monkeypatch):
    """The layers chosen without the minutes of judging: plain int8, as the judge would have seen it."""
    from toolkit.convert import guarded_int8

    def judged_plain_int8(directory, budget, data=None, echo=print):
        with tempfile.TemporaryDirectory() as tmp:
            return {}, [], {g: f["sha256"] for g, f in guarded_int8.graphs_with(directory, Path(tmp), {}).items()}

    monkeypatch.setattr(guarded_int8, "choose", judged_plain_int8)
    return _corrupting(guarded_int8.writer(0.3), _flip, "decoder.int8.onnx"), "seq2seq", "decoder.int8.onnx is not the graph that was judged"


@pytest.mark.parametrize("case", [_to_hf, _web, _ctranslate2, _variants, _guarded_int8], ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_write_is_refused_by_the_writer_s_check_in_one_line_and_nothing_lands(tmp_path, monkeypatch, case):
    writer, model, words = case(monkeypatch)
    source = tmp_path / model
    shutil.copytree(REPO / "exported" / model, source)
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    out = None if isinstance(writer.lands, IntoModelDirectory) else tmp_path / "out"
    with pytest.raises(ToolkitError) as refused:
        convert(writer, source, out)
    message = str(refused.value)
    assert f"{writer.option} checked what it wrote and refused it: {words}" in message and "\n" not in message, message
    assert {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [model] and not [p for p in source.iterdir() if p.is_dir()]
