"""Variants added to an exported directory from its own fp32 graphs (`tk export DIR --quantize int8`, `--fp16`,
`--optimize`, and `--attention`'s declaration): torch-free, so a deploy-only install (no torch extra) can store them.
A new export writes its variants itself (toolkit.pytorch.export), before its directory is in place."""

from __future__ import annotations

import contextlib
from pathlib import Path

from toolkit.convert.pipeline import IntoModelDirectory, Writer
from toolkit.core import architectures, manifest, variants
from toolkit.core.errors import UsageError
from toolkit.graphs import variants as built_variants


def writer(opts: variants.ExportOptions, attention: dict | None) -> Writer:
    """The writer of the variants `opts` asks for (and of the attention declaration, which writes no file), from the
    directory's own fp32 graphs (how a fresh clone gets a shipped model's int8 graphs). `attention`: with opts.attention,
    the model's declaration of its attention outputs (toolkit.pytorch.export.attention_declaration makes it)."""
    wanted = variants.wanted_variants(opts)

    def validate(m: manifest.Manifest) -> None:
        if not wanted and not opts.attention:
            flags = ", ".join(variants.CATALOGUE[v].export_flag for v in variants.BUILT)
            raise UsageError(f"{m.directory} is already exported; to add graphs to it pass {flags} or --attention")
        for variant in wanted:
            architectures.check_variant(m.model, variant)
        if "optimized" in wanted:  # stored as one file each, the size of the fp32 graph
            big = [g for g in m.graphs if built_variants.weight_bytes(m.graph_path(g)) > built_variants.IN_MEMORY_BYTES]
            if big:
                raise UsageError(f"the {big[0]} graph of {m.directory} holds too much for one ONNX file, so its optimized "
                                 "variant is not stored; drop --optimize: tk builds it when it loads the model")

    def write(m: manifest.Manifest, tmp: Path, echo) -> dict[str, dict[str, str]]:
        made: dict[str, dict[str, str]] = {}
        for variant in wanted:
            echo(f"writing the {variant} variant ...")
            made[variant] = {name: f"{name}{variants.CATALOGUE[variant].suffix}.onnx" for name in m.graphs}
            for name, file in made[variant].items():
                built_variants.build(m.graph_path(name), tmp / file, variant)
        if opts.attention:
            echo("declaring the attention outputs ...")
        return made

    def record(m: manifest.Manifest, made: dict[str, dict[str, str]], files: dict[str, manifest.FileRecord], command: str | None) -> None:
        for variant, graphs in made.items():
            m.stored[variant] = manifest.VariantRecord(graphs={g: files[f] for g, f in graphs.items()},
                                                       **variants.CATALOGUE[variant].record(), command=command)
        if opts.attention:
            m.attention = attention

    present = lambda m: [v for v in wanted if v in m.stored]  # noqa: E731
    return Writer("quantize", lands=IntoModelDirectory(what="the variants", stage="tk-variants", again="rebuild it", record=record,
                                                       replaces=lambda m: f"the {', '.join(present(m))} variant" if present(m) else None),
                  validate=validate, write=write, verify=same_interface)


def same_interface(m: manifest.Manifest, tmp: Path, made: dict[str, dict[str, str]]) -> str | None:
    """verify: each variant's graph is an ONNX model that takes and gives what the fp32 graph it was built from does:
    the same inputs and outputs, by name and element type."""
    import onnx

    def interface(path: Path) -> list:
        with contextlib.suppress(Exception):  # a graph onnx cannot read has no interface
            graph = onnx.load(str(path), load_external_data=False).graph
            return [(v.name, v.type.tensor_type.elem_type) for v in (*graph.input, *graph.output)]

    wrong = [(v, g, f) for v, graphs in made.items() for g, f in graphs.items() if interface(tmp / f) != interface(m.graph_path(g))]
    return f"{wrong[0][2]} (the {wrong[0][0]} {wrong[0][1]} graph) is not an ONNX graph with the fp32 graph's inputs and outputs" if wrong else None
