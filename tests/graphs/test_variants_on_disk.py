"""A variant a directory does not store, for a graph too large for one protobuf message (an NLLB-1.3B decoder holds
3.5 GB of fp32 weights): built in a temporary directory with its weights beside it, not in memory, so that `tk
translate`'s default graphs (`optimized` on CPU) and `--variant int8` load at any size.

The tiny shipped Transformer stands in for the large model: the size limit is lowered to nothing, and the in-memory
builder is made to fail the way protobuf fails past 2 GB, so only the on-disk path can give the translations.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.core import manifest
from toolkit.graphs import graph_files, variants

pytestmark = pytest.mark.timeout(300)

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"
SENTENCES = ["I'm home.", "Where is the station?", "The cat is sleeping on the sofa."]


def _translate(variant: str | None) -> list[str]:
    from toolkit import Translator

    kwargs = {} if variant is None else {"variant": variant}
    return Translator(SHIPPED, **kwargs).translate(SENTENCES, beam=4)


def test_a_variant_past_the_protobuf_limit_is_built_on_disk_and_translates_the_same(monkeypatch):
    monkeypatch.setenv("TK_NO_CACHE", "1")  # every start builds its graphs: the cache would hide the builder
    want = {v: _translate(v) for v in (None, "int8")}  # the default (optimized) and int8, built in memory

    def past_the_limit(*args):
        raise ValueError("Message onnx.ModelProto exceeds maximum protobuf size of 2GB: 3512406528")

    monkeypatch.setattr(variants, "IN_MEMORY_BYTES", 0)
    monkeypatch.setattr(variants, "_built", past_the_limit)
    m = manifest.load(SHIPPED)
    source, _ = variants.graph_source(m, "decoder", "optimized")
    assert isinstance(source, Path) and graph_files.beside(source).exists()  # its weights beside it, not inside
    assert {v: _translate(v) for v in want} == want


def test_weight_bytes_counts_the_weights_stored_outside_the_graph():
    """What the choice rests on: the shipped decoder's weights live in weights.bin, not in decoder.onnx."""
    decoder = SHIPPED / "decoder.onnx"
    assert variants.weight_bytes(decoder) > 4 * decoder.stat().st_size


def test_storing_an_optimized_variant_past_the_limit_is_refused_in_one_line(cli, monkeypatch, tmp_path):
    """`tk export DIR --optimize` stores each graph as one file, which cannot pass 2 GB: refused before anything is
    written, naming the way that works (tk builds it at load), and the directory is left as it was."""
    import shutil

    directory = tmp_path / "model"
    shutil.copytree(SHIPPED, directory)
    before = sorted(p.name for p in directory.iterdir())
    monkeypatch.setattr(variants, "IN_MEMORY_BYTES", 0)
    result = cli("export", directory, "--optimize")
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "holds too much for one ONNX file" in result.output and "drop --optimize" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert sorted(p.name for p in directory.iterdir()) == before


@pytest.mark.parametrize("stored", [False, True])
def test_a_large_model_runs_its_exported_graphs_by_default_unless_the_fast_ones_are_stored(monkeypatch, tmp_path, stored):
    """Past LARGE_WEIGHTS_BYTES of weights, building the optimized graphs at the first start costs minutes and several
    times the weights in memory for no speed: the default is the exported fp32 graphs. Stored ones are used as stored;
    a small model keeps the optimized graphs; an explicit variant is always honoured."""
    import shutil

    from toolkit import Translator
    from toolkit.runtimes.onnxruntime import runtime

    directory = tmp_path / "model"
    shutil.copytree(SHIPPED, directory)
    if stored:
        from click.testing import CliRunner

        from toolkit.cli import main

        assert CliRunner().invoke(main, ["export", str(directory), "--optimize"]).exit_code == 0
    assert Translator(directory).variant == "optimized"
    monkeypatch.setattr(runtime, "LARGE_WEIGHTS_BYTES", 0)
    assert Translator(directory).variant == ("optimized" if stored else "fp32")
    assert Translator(directory, variant="optimized").variant == "optimized"


def test_a_large_graph_that_cannot_be_built_names_only_the_way_that_works(monkeypatch):
    """Its optimized graphs cannot be stored (the refusal above), so the one-line error names the exported graphs alone."""
    from toolkit.core.errors import ToolkitError

    def out_of_memory(src, dst):
        raise MemoryError("std::bad_alloc")

    monkeypatch.setattr(variants, "IN_MEMORY_BYTES", 0)
    monkeypatch.setitem(variants.ON_DISK, "optimized", out_of_memory)
    monkeypatch.setattr(variants, "_on_disk", {})
    with pytest.raises(ToolkitError) as caught:
        variants.graph_source(manifest.load(SHIPPED), "decoder", "optimized")
    assert "use --variant fp32" in str(caught.value) and "--optimize" not in str(caught.value)
