"""The one converter pipeline: every writer of tk (toolkit.convert's modules) is a `Writer` declaration, and `convert`
runs it the same way, after CTranslate2's converters/converter.py (_load, validate, optimize, save):

    load -> validate -> write into a temporary directory -> verify -> move into place

Load and validate are shared (an exported model directory, every file as its manifest records it; then the writer's own
refusals). Verify is each writer's own check of what it wrote; a problem refuses the write in one line and nothing
lands. How a writer lands is declared: a `NewDirectory` of its own (--to-hf, --web; toolkit.core.outputs refuses and
renames), or files stored `IntoModelDirectory` (--ctranslate2, variants, guarded int8) under its lock, the manifest
rewritten only once every file is in place (outputs.store). Torch-free; imports no writer.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.core import manifest, outputs
from toolkit.core.errors import ToolkitError, UsageError, first_line
from toolkit.core.manifest import FileRecord, Manifest

Echo = Callable[[str], None]


def load_model_directory(writer: Writer, source: Path) -> Manifest:
    """What tk's writers read: an exported model directory, refused in one line if SOURCE is not one."""
    if not (Path(source) / "manifest.json").is_file():
        raise UsageError(f"{writer.option} needs an exported model directory (one with manifest.json), not {source}; "
                         "export the checkpoint first")
    return manifest.load(source)


@dataclass(frozen=True)
class NewDirectory:
    """Lands as a directory of its own at OUT. owned(OUT, m): the entries of an existing OUT that tk wrote (what
    --force replaces); None when OUT is not a directory this writer makes (--force will not touch it). what: such a
    directory, for the refusal ("a tk web site (no model.json)"). keep_foreign: entries tk did not write are kept
    (True) or refused by name (False)."""

    owned: Callable[[Path, Any], set[str] | None]
    what: str
    keep_foreign: bool = True


@dataclass(frozen=True)
class IntoModelDirectory:
    """Lands as files stored inside the model directory it reads, recorded in its manifest. what: what it stores, as
    the export's summary names it ("the CTranslate2 model"). stage: the temporary directory's name inside the model
    directory (`.STAGE.new.PID-XXXXXXXX`). replaces(m): what the directory already holds that this writer would
    replace ("a CTranslate2 model"), None if nothing; `again` says what --force does then ("convert it again").
    record(m, written, files, command): records the landed files (name -> FileRecord) in the manifest m, given what
    `write` returned and the command line that asked; convert saves the manifest once every file is in place."""

    what: str
    stage: str
    replaces: Callable[[Manifest], str | None]
    again: str
    record: Callable[[Manifest, Any, dict[str, FileRecord], str | None], None]


@dataclass(frozen=True)
class Writer:
    """One writer, declared. name: "web" for `tk export DIR --web`; its option names it in every message. validate(m):
    refuses what this writer cannot write from the model directory's manifest m, in one line, before any work. write(m,
    tmp, echo) fills the empty temporary directory; what it returns goes to `verify` and to the landing's `record`.
    verify(m, tmp, written): the writer's own check of what it wrote, before it lands: the problem in a few words, or
    None. as_is: how it takes the directory, for the refusal of export's other options ("converts the directory as it
    is"). next_step(source, out) -> what to do with what was written, once it is in place (None: nothing)."""

    name: str
    lands: NewDirectory | IntoModelDirectory
    write: Callable[[Manifest, Path, Echo], Any]
    verify: Callable[[Manifest, Path, Any], str | None]
    validate: Callable[[Manifest], None] = lambda m: None
    as_is: str = "converts the directory as it is"
    next_step: Callable[[Path, Path], str] | None = None

    @property
    def option(self) -> str:
        """How `tk export` and every message name it: --to-hf."""
        return f"--{self.name}"


def convert(writer: Writer, source: Path, out: Path | None = None, force: bool = False, echo: Echo = lambda s: None,
            command: str | None = None) -> dict[str, int]:
    """Runs `writer` on SOURCE: load, validate, write into a temporary directory, verify, move into place (at OUT for a
    NewDirectory writer; inside SOURCE for the others, which take no OUT and record `command`, the command line that
    asked, in the manifest). Returns {path relative to where it landed: bytes} of the files written; entries tk did not
    write that a new directory kept are said through `echo`."""
    source = Path(source)
    if isinstance(writer.lands, NewDirectory):
        if out is None:
            raise UsageError(f"{writer.option} needs an output directory: {writer.option} DIR")
        return _new_directory(writer, writer.lands, source, Path(out), force, echo)
    return _into_model_directory(writer, writer.lands, source, force, echo, command)


def _new_directory(writer: Writer, lands: NewDirectory, source: Path, out: Path, force: bool, echo: Echo) -> dict[str, int]:
    outputs.refuse_source_inside(out, [source], writer.option)  # before reading the source: replacing OUT would delete it
    m = load_model_directory(writer, source)
    target = outputs.prepare(out, option=writer.option, sources=[source], force=force, owned=lambda d: lands.owned(d, m),
                             what=lands.what, keep_foreign=lands.keep_foreign)
    m.check_files()  # before validate, which may parse the graphs: a corrupt file is refused as one, not parsed
    writer.validate(m)
    kept: list[str] = []
    with outputs.writing(target, skipped=kept.extend) as tmp:
        _verify(writer, m, tmp, writer.write(m, tmp, echo), out)
        written = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
    for name in kept:
        echo(f"kept {out / name}: tk did not write it (tk's own {name} was not written)")
    return {name: size for name, size in written.items() if Path(name).parts[0] not in kept}


def _into_model_directory(writer: Writer, lands: IntoModelDirectory, source: Path, force: bool, echo: Echo,
                          command: str | None) -> dict[str, int]:
    load_model_directory(writer, source)  # a source that is no model directory is refused before its lock (which opens it)
    with manifest.locked(source):
        m = load_model_directory(writer, source)  # read again under the lock: another command may have written it meanwhile
        m.check_files()  # before validate, which may parse the graphs (--optimize reads their weights' sizes)
        writer.validate(m)
        present = lands.replaces(m)
        if present and not force:
            raise UsageError(f"{source} already has {present}; use --force to {lands.again}")
        tmp = outputs.temporary_directory(source, lands.stage)
        try:
            written = writer.write(m, tmp, echo)
            _verify(writer, m, tmp, written, source)
            records = {p.name: FileRecord(p.name, manifest.file_sha256(p), p.stat().st_size) for p in sorted(tmp.iterdir())}

            def record() -> None:
                lands.record(m, written, records, command)
                m.save()

            outputs.store(tmp, source, record)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {name: r.bytes for name, r in records.items()}


def _verify(writer: Writer, m: Manifest, tmp: Path, written: Any, where: Path) -> None:
    """The writer's own check of what it wrote: a problem refuses it in one line, and nothing lands."""
    try:
        problem = writer.verify(m, tmp, written)
    except Exception as e:  # noqa: BLE001 - a file that does not load back is the check's verdict too
        problem = f"what it wrote does not load back ({first_line(e)})"
    if problem:
        raise ToolkitError(f"{writer.option} checked what it wrote and refused it: {problem}; {where} was left as it was "
                           "(a fault of the disk or of tk: run it again, and report it if it fails again)")

