"""What `tk translate` would otherwise recompute at every start, kept in the user's cache directory: the
directory itself, its trust check, and the file digests. The runtimes keep their own entries in it
(ONNX Runtime's optimised graphs: toolkit.runtimes.onnxruntime.graph_cache).

- File digests: the sha256 of each file a manifest lists, trusted again only while the file's size,
  mtime, ctime, inode and device are all unchanged (an edit in place changes mtime and ctime; a
  replaced file has a new inode), so hashing the 27 MiB of weights happens once, not at each start.

A cache entry that is missing, unreadable, or changed since it was written (its files' size, mtime,
ctime or inode) is ignored and rebuilt: at worst the cache makes a start slower, never an error.
The cache is used only while its
directory is the user's own and no one else can write it (checked at each start, as ssh checks
~/.ssh), and a file in it only while the same holds for the file: it is trusted as the user's own
files are. Whoever can write it can also write the model directory, whose manifest states the
digests that `tk translate` checks, so the cache gives no one a way in that they did not already have;
`tk verify --expect-digest` is what proves weights against a digest kept elsewhere.
`TK_CACHE_DIR` moves it (default `$XDG_CACHE_HOME/tk`, else `~/.cache/tk`); `TK_NO_CACHE=1` turns it off.
Torch-free: the deploy path uses it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from toolkit.core.atomic import write_atomic

FORMAT = 1  # of every record in the cache
DIGESTS = "digests.json"
MAX_DIGESTS = 256  # files remembered; the oldest entries go first
# A file changed less than this long before it was hashed may change again within the same
# timestamp tick without its mtime moving (git's "racily clean" case): its digest is not kept.
SETTLE_S = 2.0


_checked: dict[str, bool] = {}


def directory() -> Path | None:
    """The cache directory, or None when caching is turned off or the directory is not safe to trust."""
    if os.environ.get("TK_NO_CACHE", "") not in ("", "0"):
        return None
    root = default_directory()
    key = str(root)
    if key not in _checked:
        _checked[key] = _private(root)
    return root if _checked[key] else None


def _private(root: Path) -> bool:
    """Made if missing (mode 0700); trusted only if it is the user's own and no one else can write it, as ssh
    treats ~/.ssh: a cache that another user can write could swap the graphs every translation runs."""
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(root)
    except OSError:
        return False  # a read-only or missing home: starts are slower, nothing else changes
    problem = _unsafe(st)
    if problem:
        print(f"warning: not using the cache directory {root}: it is {problem}; make it your own with mode 700 "
              "(chmod 700), or set TK_CACHE_DIR to a directory that is", file=sys.stderr)
        return False
    return True


def _unsafe(st: os.stat_result) -> str | None:
    """Why a cache file or directory with this stat must not be trusted, or None."""
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return "owned by another user"
    if st.st_mode & 0o022:
        return "writable by other users"
    return None


def default_directory() -> Path:
    """$TK_CACHE_DIR, else $XDG_CACHE_HOME/tk, else ~/.cache/tk."""
    if os.environ.get("TK_CACHE_DIR"):
        return Path(os.environ["TK_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tk"


def _stat_key(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def read_json(path: Path) -> dict:
    """A cache file's JSON object; {} for a missing, corrupt or foreign one (not the user's own, or writable by others)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            if _unsafe(os.fstat(f.fileno())):
                return {}
            data = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) and data.get("format") == FORMAT else {}


def own_stat_key(path: Path) -> list[int] | None:
    """_stat_key of a cached file that is the user's own and not writable by others (else None: not trusted)."""
    st = os.lstat(path)
    if _unsafe(st) or not os.path.isfile(path) or os.path.islink(path):
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def file_digests(paths: list[Path]) -> dict[Path, str]:
    """The sha256 of each file, from the cache where the file is unchanged since it was hashed."""
    from toolkit.core.digests import file_sha256

    root = directory()
    known = read_json(root / DIGESTS).get("files", {}) if root else {}
    if not isinstance(known, dict):
        known = {}
    out, changed = {}, False
    for path in paths:
        name = os.path.realpath(path)
        key = _stat_key(path)
        entry = known.get(name)
        if isinstance(entry, dict) and entry.get("stat") == key and isinstance(entry.get("sha256"), str):
            out[path] = entry["sha256"]
            continue
        out[path] = file_sha256(path)
        if time.time_ns() - max(key[1], key[2]) > SETTLE_S * 1e9 and _stat_key(path) == key:
            known.pop(name, None)
            known[name] = {"stat": key, "sha256": out[path]}
            changed = True
    if root and changed:
        kept = dict(list(known.items())[-MAX_DIGESTS:])
        try:
            write_atomic(root / DIGESTS, json.dumps({"format": FORMAT, "files": kept}).encode())
        except OSError:
            pass  # a read-only or full cache directory: the digests are recomputed next time
    return out
