"""The last step: every shard's output concatenated in input order into one file, written atomically."""

from __future__ import annotations

from pathlib import Path

from toolkit.core.atomic import atomic_file
from toolkit.core.errors import DataError
from toolkit.corpus.shards import Plan, file_sha256

MERGED = "translations.txt"


def merge(p: Plan, out_dir: Path) -> tuple[Path, int]:
    """Writes OUTPUT_DIR/translations.txt from the shard files, each checked against its manifest digest;
    returns its path and line count."""
    target = out_dir / MERGED
    lines = 0
    with atomic_file(target) as out:
        for s in p.shards:
            path = out_dir / s.output_name
            if file_sha256(path) != s.output_sha256:
                raise DataError(f"{path} does not match its digest in the manifest (changed since it was written); "
                                "delete it and rerun to translate that shard again")
            data = path.read_bytes()
            lines += data.count(b"\n")
            out.write(data)
    return target, lines
