"""Where a corpus comes from: text files (one sentence per line) or a text column of Parquet files.

Lines are numbered from 1 within their file (rows, for Parquet), and every error names the file and number.
"""

from __future__ import annotations

import glob
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from toolkit.core.errors import DataError, UsageError

PARQUET_SUFFIXES = (".parquet", ".pq")


@dataclass(frozen=True)
class Source:
    path: str  # absolute, so that actors on other nodes of a shared file system find it
    kind: str  # "text" or "parquet"
    column: str | None = None


def find_sources(inputs: list[str], column: str | None) -> list[Source]:
    """The input files in order: each argument is a file, a directory (its files, sorted) or a glob (sorted)."""
    paths: list[Path] = []
    for arg in inputs:
        p = Path(arg)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
            if not found:
                raise UsageError(f"input directory {arg} holds no files; give text or Parquet files")
        elif p.is_file():
            found = [p]
        elif glob.has_magic(arg):
            found = sorted(Path(f) for f in glob.glob(arg) if Path(f).is_file())
            if not found:
                raise UsageError(f"input pattern {arg} matches no files")
        elif p.exists():  # a device, a pipe, a socket: shards are read by offset, more than once
            raise UsageError(f"input {arg} is not a regular file; save it to a file and give that")
        else:
            raise UsageError(f"input {arg} does not exist; give text files, a directory or a glob of them")
        paths.extend(found)
    sources, seen = [], set()
    for p in paths:
        resolved = str(p.resolve())
        if resolved in seen:
            continue  # a file named twice (a file and a glob covering it) would be translated twice
        seen.add(resolved)
        if p.suffix.lower() in PARQUET_SUFFIXES:
            if column is None:
                raise UsageError(f"{p} is a Parquet file; name its text column with --column")
            sources.append(Source(resolved, "parquet", column))
        else:
            sources.append(Source(resolved, "text"))
    return sources


def text_boundaries(path: str, shard_lines: int) -> Iterator[tuple[int, int, int, str]]:
    """(first line, lines, byte offset, sha256 of the shard's bytes) of each shard of a text file, in one pass."""
    with open(path, "rb") as f:
        first, count, offset, pos, digest = 1, 0, 0, 0, hashlib.sha256()
        for raw in f:
            digest.update(raw)
            count += 1
            pos += len(raw)
            if count == shard_lines:
                yield first, count, offset, digest.hexdigest()
                first, count, offset, digest = first + count, 0, pos, hashlib.sha256()
        if count:
            yield first, count, offset, digest.hexdigest()


def read_text(path: str, offset: int, lines: int) -> tuple[list[bytes], str]:
    """A shard's raw lines from a text file, and the sha256 of their bytes."""
    digest, out = hashlib.sha256(), []
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            digest.update(raw)
            out.append(raw)
            if len(out) == lines:
                break
    return out, digest.hexdigest()


def _parquet_column(path: str, column: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(path)
    except Exception as e:
        raise DataError(f"{path} is not a readable Parquet file ({str(e).splitlines()[0][:120]})") from None
    names = f.schema_arrow.names
    if column not in names:
        raise UsageError(f"{path} has no column {column!r}; its columns are {', '.join(names)}")
    kind = f.schema_arrow.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        raise UsageError(f"{path}: column {column!r} holds {kind}, not text; name a string column with --column")
    return f


def _as_bytes(value) -> bytes:
    # A null row is an empty line, so output row i still answers input row i.
    if value is None:
        return b"\n"
    raw = value if isinstance(value, bytes) else value.encode("utf-8")
    return raw + b"\n"


def parquet_boundaries(path: str, column: str, shard_lines: int) -> Iterator[tuple[int, int, int, str]]:
    """(first row, rows, 0, sha256) of each shard of a Parquet file's text column."""
    f = _parquet_column(path, column)
    first, count, digest = 1, 0, hashlib.sha256()
    for batch in f.iter_batches(columns=[column], batch_size=65536):
        for value in batch.column(0).to_pylist():
            digest.update(_as_bytes(value))
            count += 1
            if count == shard_lines:
                yield first, count, 0, digest.hexdigest()
                first, count, digest = first + count, 0, hashlib.sha256()
    if count:
        yield first, count, 0, digest.hexdigest()


def read_parquet(path: str, column: str, first: int, rows: int) -> tuple[list[bytes], str]:
    """Rows first .. first+rows-1 (1-based) of the column, reading only the row groups that hold them."""
    f = _parquet_column(path, column)
    start, stop, out, at = first - 1, first - 1 + rows, [], 0
    for g in range(f.metadata.num_row_groups):
        n = f.metadata.row_group(g).num_rows
        if at + n > start and at < stop:
            values = f.read_row_group(g, columns=[column]).column(0).to_pylist()
            out.extend(values[max(0, start - at): stop - at])
        at += n
        if at >= stop:
            break
    raws = [_as_bytes(v) for v in out]
    digest = hashlib.sha256()
    for raw in raws:
        digest.update(raw)
    return raws, digest.hexdigest()


def decode(raws: list[bytes], first: int, path: str) -> list[tuple[int, str]]:
    """(line number, text) of each raw line; a non-UTF-8 line is a DataError naming the file and line."""
    out = []
    for lineno, raw in enumerate(raws, first):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path} line {lineno} is not valid UTF-8 (byte {e.start}); convert the file to UTF-8") from None
        out.append((lineno, text.rstrip("\r\n")))
    return out
