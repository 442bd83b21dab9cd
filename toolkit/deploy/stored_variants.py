"""Variants added to an exported directory from its own fp32 graphs (`tk export DIR --quantize int8`, `--fp16`,
`--optimize`): torch-free, so a deploy-only install (no torch extra) can store them. Exporting from PyTorch lives in
toolkit/pytorch/export.py, which uses this module for the variants it writes beside new graphs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolkit.convert import IntoModelDirectory, Writer, convert
from toolkit.core import architectures, manifest, variants
from toolkit.core.errors import UsageError
from toolkit.graphs import variants as built_variants
from toolkit.graphs.variants import build


@dataclass
class ExportOptions:
    out: Path
    checkpoint: str | None = None
    model: str | None = None  # with random_init: a registry name
    random_init: bool = False
    seed: int = 0
    opset: int = 18
    fp16: bool = False
    optimize: bool = False
    quantize: str | None = None  # a quantised variant's name (toolkit.core.variants)
    attention: bool = False  # on an exported directory: record the attention variant's declaration
    force: bool = False
    command: str = ""
    languages: tuple[str, str] | None = None  # --source-lang/--target-lang: checked against an import before it exports


def wanted_variants(opts: ExportOptions) -> list[str]:
    """The variants whose export option (declared in the catalogue) is set."""
    return [v for v in variants.BUILT if getattr(opts, variants.CATALOGUE[v].export_option[0]) == variants.CATALOGUE[v].export_option[1]]


def add_variants(directory: Path, opts: ExportOptions, echo=print, attention: dict | None = None) -> Path:
    """Adds variants to an exported directory, from its own fp32 graphs (no checkpoint needed).

    This is how a fresh clone gets the int8 graphs of a shipped model. Through the converter pipeline
    (toolkit.convert.convert): built in a temporary directory inside (named with this process's id, so a later write
    removes it if this one is killed), moved in and recorded only when all are complete, under the directory's lock
    (two commands adding to one directory run one after the other); on failure the new files go and the variants they
    replaced (--force) are put back. `attention`: with opts.attention, the model's declaration of its attention
    outputs (toolkit.pytorch.export.attention_declaration: the torch side makes it).
    """
    convert(variants_writer(opts, attention), directory, None, opts.force, echo, opts.command)
    return directory


def variants_writer(opts: ExportOptions, attention: dict | None) -> Writer:
    """The writer of the variants `opts` asks for (and of the attention declaration, which writes no file)."""
    wanted = wanted_variants(opts)

    def validate(m: manifest.Manifest) -> None:
        m.check_files()
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

    def write(m: manifest.Manifest, tmp: Path, echo) -> dict[str, dict]:
        graphs = {name: {"file": g.file} for name, g in m.graphs.items()}
        made = {}
        for variant in wanted:
            echo(f"writing the {variant} variant ...")
            made[variant] = make_variant(m.directory, graphs, variant, into=tmp)
        if opts.attention:
            echo("declaring the attention outputs ...")
        return made

    def record(m: manifest.Manifest, made: dict[str, dict], files: dict[str, manifest.FileRecord], command: str | None) -> None:
        for variant, graphs in made.items():
            m.stored[variant] = manifest.VariantRecord(graphs={g: files[f["file"]] for g, f in graphs.items()},
                                                       **variants.CATALOGUE[variant].record(), command=command)
        if opts.attention:
            m.attention = attention

    def replaces(m: manifest.Manifest) -> str | None:
        present = [v for v in wanted if v in m.stored]
        return f"the {', '.join(present)} variant" if present else None

    return Writer("quantize", lands=IntoModelDirectory(what="the variants", stage="tk-variants", replaces=replaces, again="rebuild it",
                                                       record=record),
                  validate=validate, write=write)


def make_variant(tmp: Path, graphs: dict, variant: str, into: Path | None = None) -> dict:
    """Writes `variant` of each graph of directory `tmp` beside it, or into the directory `into`."""
    out = {}
    for name, g in graphs.items():
        src, dst = tmp / g["file"], (into or tmp) / f"{name}{variants.CATALOGUE[variant].suffix}.onnx"
        build(src, dst, variant)
        out[name] = {"file": dst.name, "sha256": manifest.file_sha256(dst), "bytes": dst.stat().st_size}
    return out
