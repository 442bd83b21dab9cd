"""`tk export DIR --ctranslate2`: the directory's fp32 weights converted to a CTranslate2 model and stored beside its
graphs, recorded in the manifest's "converted" section.

CTranslate2 names its files model.bin, config.json and shared_vocabulary.json; a model directory holds only plain
names that say whose they are, so each is stored as ctranslate2.NAME and loaded from memory by its own name
(engine.stored_files).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from toolkit.convert import output
from toolkit.core import manifest
from toolkit.core.errors import UsageError
from toolkit.runtimes.ctranslate2.engine import RUNTIME, version
from toolkit.runtimes.ctranslate2.spec import convert

PREFIX = f"{RUNTIME}."


def add(directory: Path, force: bool = False, command: str | None = None, echo: Callable[[str], None] = print) -> Path:
    """Converts and stores; the manifest is rewritten only once every file is complete (on failure the new files are
    removed and the old conversion, if any, stays as it was). Under the directory's lock."""
    ct2_version = version()  # a missing ctranslate2 is said before any work
    with manifest.locked(directory):
        m = manifest.load(directory)
        m.check_files()
        if RUNTIME in (m.converted or {}) and not force:
            raise UsageError(f"{directory} already has a CTranslate2 model; use --force to convert it again")
        # Named with this process's id, so that a later conversion removes it if this one is killed (kill -9).
        tmp = output.temporary_directory(directory, "tk-ct2")
        try:
            echo("converting the fp32 weights to CTranslate2 ...")
            convert(m, tmp)
            _store(m, directory, tmp, ct2_version, command)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return directory


def _store(m: manifest.Manifest, directory: Path, tmp: Path, ct2_version: str, command: str | None) -> None:
    """Moves the converted files in and records them; on failure the new files are removed and the old ones stay."""
    written: list[Path] = []
    files = {}
    try:
        for path in sorted(tmp.iterdir()):
            # Under a temporary name first (tk's form, with this process's id: a later write in the directory removes
            # it if this one dies): a failed conversion never leaves a half-replaced file the old manifest still lists.
            staged = directory / f".{PREFIX}{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
            shutil.move(path, staged)
            written.append(staged)
            files[path.name] = staged
        records = {}
        for name, staged in files.items():
            final = directory / f"{PREFIX}{name}"
            staged.replace(final)
            written.append(final)
            records[name] = manifest.FileRecord(final.name, manifest.file_sha256(final), final.stat().st_size)
        m.converted = {**(m.converted or {}), RUNTIME: manifest.ConversionRecord(records, ct2_version, command)}
        m.save()
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
