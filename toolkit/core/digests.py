"""sha256 of files, read in chunks: the digests manifests record and checks compare."""

from __future__ import annotations

from pathlib import Path


def file_sha256(path: Path) -> str:
    import hashlib  # here: `tk translate` hashes nothing when the digests are cached (toolkit.core.load_cache)

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
