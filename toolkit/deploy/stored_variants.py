"""Variants added to an exported directory from its own fp32 graphs (`tk export DIR --quantize int8`, `--fp16`,
`--optimize`): torch-free, so a deploy-only install (no torch extra) can store them. Exporting from PyTorch lives in
toolkit/pytorch/export.py, which uses this module for the variants it writes beside new graphs."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from toolkit.convert import output
from toolkit.core import manifest, variants
from toolkit.core.errors import UsageError
from toolkit.runtimes.onnxruntime.variants import build


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


def wanted_variants(opts: ExportOptions) -> list[str]:
    """The variants whose export option (declared in the catalogue) is set."""
    return [v for v in variants.BUILT if getattr(opts, variants.CATALOGUE[v].export_option[0]) == variants.CATALOGUE[v].export_option[1]]


def add_variants(directory: Path, opts: ExportOptions, echo=print, attention: dict | None = None) -> Path:
    """Adds variants to an exported directory, from its own fp32 graphs (no checkpoint needed).

    This is how a fresh clone gets the int8 graphs of a shipped model. The manifest is rewritten
    only after every new file is complete; on failure they are removed. Under the directory's lock:
    two commands adding to one directory run one after the other. `attention`: with opts.attention, the model's
    declaration of its attention outputs (toolkit.pytorch.export.attention_declaration: the torch side makes it).
    """
    with manifest.locked(directory):
        return _add_variants(directory, opts, echo, attention)


def _add_variants(directory: Path, opts: ExportOptions, echo, attention: dict | None) -> Path:
    m = manifest.load(directory)
    m.check_files()
    wanted = wanted_variants(opts)
    if not wanted and not opts.attention:
        flags = ", ".join(variants.CATALOGUE[v].export_flag for v in variants.BUILT)
        raise UsageError(f"{directory} is already exported; to add graphs to it pass {flags} or --attention")
    present = [v for v in wanted if v in m.stored]
    if present and not opts.force:
        raise UsageError(f"{directory} already has the {', '.join(present)} variant; use --force to rebuild it")
    graphs = {name: {"file": g.file} for name, g in m.graphs.items()}
    # Built in a temporary directory inside (named with this process's id, so a later write removes it if this one is
    # killed) and renamed into place only when all are complete: a killed rebuild (--force) never leaves a half-written
    # graph that the manifest lists.
    tmp = output.temporary_directory(directory, "tk-variants")
    written: list[Path] = []
    try:
        for variant in wanted:
            echo(f"writing the {variant} variant ...")
            made = make_variant(directory, graphs, variant, into=tmp)
            m.stored[variant] = manifest.VariantRecord(graphs={g: manifest.FileRecord(**f) for g, f in made.items()},
                                                       **variants.CATALOGUE[variant].record(), command=opts.command)
        if opts.attention:
            echo("declaring the attention outputs ...")
            m.attention = attention
        for staged in sorted(tmp.iterdir()):
            written.append(directory / staged.name)
            staged.replace(directory / staged.name)
        m.save()
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def make_variant(tmp: Path, graphs: dict, variant: str, into: Path | None = None) -> dict:
    """Writes `variant` of each graph of directory `tmp` beside it, or into the directory `into`."""
    out = {}
    for name, g in graphs.items():
        src, dst = tmp / g["file"], (into or tmp) / f"{name}{variants.CATALOGUE[variant].suffix}.onnx"
        build(src, dst, variant)
        out[name] = {"file": dst.name, "sha256": manifest.file_sha256(dst), "bytes": dst.stat().st_size}
    return out
