"""The last step: every shard's output concatenated in input order into one file, written atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from toolkit.corpus.shards import Plan, file_sha256
from toolkit.errors import DataError

MERGED = "translations.txt"


def merge(p: Plan, out_dir: Path) -> tuple[Path, int]:
    """Writes OUTPUT_DIR/translations.txt from the shard files, each checked against its manifest digest;
    returns its path and line count."""
    target = out_dir / MERGED
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{MERGED}.", suffix=".tmp")
    lines = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for s in p.shards:
                path = out_dir / s.output_name
                if file_sha256(path) != s.output_sha256:
                    raise DataError(f"{path} does not match its digest in the manifest (changed since it was written); "
                                    "delete it and rerun to translate that shard again")
                data = path.read_bytes()
                lines += data.count(b"\n")
                out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target, lines
