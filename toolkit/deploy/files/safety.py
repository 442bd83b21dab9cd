"""Hostile files refused before any heavy work: the size limits of each kind, and a .docx refused by its zip directory
(a zip bomb), a DTD in any of its XML parts (entity expansion) or a link to an outside file other than a hyperlink."""

from __future__ import annotations

import io
import zipfile
import zlib
from dataclasses import dataclass

from toolkit.core.errors import DataError, UsageError, first_line

MiB = 2**20
_REL = "{http://schemas.openxmlformats.org/package/2006/relationships}"


@dataclass(frozen=True)
class Limits:
    """What a file may be before it is refused unread."""

    text_bytes: int = 5 * MiB  # a .txt, .html or .srt file (a feature film's subtitles are about 100 kB)
    docx_bytes: int = 20 * MiB  # a .docx file as stored
    unzipped_bytes: int = 100 * MiB  # all the entries of a .docx, unpacked, as its zip directory declares them
    ratio: float = 100.0  # an entry's unpacked size over its packed size (Word's XML packs about 10 to 1)
    ratio_from: int = 1 * MiB  # the ratio is checked on entries that unpack to more than this
    entries: int = 5000  # entries in a .docx

    def of(self, kind: str) -> int:
        return self.docx_bytes if kind == "docx" else self.text_bytes


def _safe_parser():
    from lxml import etree

    # No entity is ever resolved, no DTD loaded, nothing fetched from the network, no tree past libxml2's default bounds.
    return etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, dtd_validation=False, huge_tree=False)


def check_package(data: bytes, name: str, limits: Limits) -> None:
    """Refuses a .docx by its zip directory before anything is unpacked (entries, unpacked bytes, packing ratio), then one
    whose XML parts hold a DTD or cannot be parsed, or that links to outside files other than by hyperlinks."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as e:
        raise DataError(f"{name} is not a readable .docx ({first_line(e)}); save it again from Word as .docx") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > limits.entries:
            raise UsageError(f"{name} holds {len(infos):,} zip entries, over the limit of {limits.entries:,}; refused as it is")
        unpacked = sum(i.file_size for i in infos)
        if unpacked > limits.unzipped_bytes:
            raise UsageError(f"{name} would unpack to {unpacked:,} bytes, over the {limits.unzipped_bytes:,}-byte limit "
                             "(a zip bomb?); refused without unpacking it")
        for i in infos:
            if i.file_size > limits.ratio_from and i.file_size > limits.ratio * max(i.compress_size, 1):
                raise UsageError(f"{name}: entry {i.filename!r} would unpack {i.file_size / max(i.compress_size, 1):,.0f} times its "
                                 f"packed size, over the limit of {limits.ratio:g} (a zip bomb?); refused without unpacking it")
        for i in infos:
            if i.filename.lower().endswith((".xml", ".rels")):
                _check_part(archive, i, name)


def _check_part(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> None:
    from lxml import etree

    try:
        data = archive.read(info)
    except (zipfile.BadZipFile, RuntimeError, NotImplementedError, zlib.error, EOFError, ValueError) as e:
        raise DataError(f"{name}: part {info.filename} cannot be unpacked ({first_line(e)}); save the document again from Word") from None
    shown = data.decode("utf-16", "replace").encode("utf-8") if data.startswith((b"\xff\xfe", b"\xfe\xff")) else data
    if b"<!DOCTYPE" in shown or b"<!ENTITY" in shown:
        raise UsageError(f"{name}: part {info.filename} declares a DTD, which no Word document has (entity expansion); refused")
    try:
        root = etree.fromstring(data, _safe_parser())
    except etree.XMLSyntaxError as e:
        raise DataError(f"{name}: part {info.filename} is not well-formed XML ({first_line(e)}); save the document again from Word") from None
    if info.filename.lower().endswith(".rels"):
        for rel in root.iter(_REL + "Relationship"):
            kind = rel.get("Type", "").rsplit("/", 1)[-1]
            if rel.get("TargetMode") == "External" and kind != "hyperlink":
                raise UsageError(f"{name}: {info.filename} links an outside file ({kind} {rel.get('Target', '')[:80]!r}), which Word "
                                 "would fetch on opening the translation; refused (remove the link, or embed the file)")
