"""`tk export DIR --ctranslate2`: the directory's fp32 weights converted to a CTranslate2 model and stored beside its
graphs, recorded in the manifest's "converted" section.

CTranslate2 names its files model.bin, config.json and shared_vocabulary.json; a model directory holds only plain
names that say whose they are, so each is stored as ctranslate2.NAME and loaded from memory by its own name
(engine.stored_files).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from toolkit.convert import IntoModelDirectory, Writer, convert
from toolkit.core import manifest
from toolkit.core.errors import UsageError
from toolkit.runtimes.ctranslate2.engine import INSTALL_HINT, RUNTIME, available, version
from toolkit.runtimes.ctranslate2.spec import convert as convert_weights

PREFIX = f"{RUNTIME}."


def _check(m: manifest.Manifest) -> None:
    """validate: ctranslate2 installed (said before any work, in terms of the flag given) and every file of the directory
    as recorded."""
    if not available():
        raise UsageError(f"--ctranslate2 needs the ctranslate2 package; {INSTALL_HINT}")
    m.check_files()


def _write(m: manifest.Manifest, tmp: Path, echo: Callable[[str], None]) -> None:
    """write: CTranslate2's files, each under the plain name it is stored by (ctranslate2.NAME)."""
    echo("converting the fp32 weights to CTranslate2 ...")
    converted = tmp / RUNTIME
    converted.mkdir()
    convert_weights(m, converted)
    for path in sorted(converted.iterdir()):
        path.rename(tmp / f"{PREFIX}{path.name}")
    converted.rmdir()


def _record(m: manifest.Manifest, written: None, files: dict[str, manifest.FileRecord], command: str | None) -> None:
    records = {name.removeprefix(PREFIX): record for name, record in files.items()}
    m.converted = {**(m.converted or {}), RUNTIME: manifest.ConversionRecord(records, version(), command)}


def _replaces(m: manifest.Manifest) -> str | None:
    return "a CTranslate2 model" if RUNTIME in (m.converted or {}) else None


def _next_step(source: Path, out: Path) -> str:
    return f"check it with: tk verify {source} --runtime ctranslate2"


# `tk export DIR --ctranslate2`: the conversion is stored in DIR (the manifest rewritten only once every file is in
# place; on failure the old conversion, if any, stays as it was), under the directory's lock.
WRITER = Writer(RUNTIME, lands=IntoModelDirectory(what="the CTranslate2 model", stage="tk-ct2", replaces=_replaces, again="convert it again",
                                                  record=_record),
                validate=_check, write=_write, as_is="converts the directory's fp32 weights as they are", next_step=_next_step)


def add(directory: Path, force: bool = False, command: str | None = None, echo: Callable[[str], None] = print) -> Path:
    """Converts and stores through the converter pipeline (toolkit.convert.convert)."""
    convert(WRITER, directory, None, force, echo, command)
    return directory
