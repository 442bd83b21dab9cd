"""What `tk translate` would otherwise recompute at every start, kept in the user's cache directory.

- File digests: the sha256 of each file a manifest lists, trusted again only while the file's size,
  mtime, ctime, inode and device are all unchanged (an edit in place changes mtime and ctime; a
  replaced file has a new inode), so hashing the 27 MiB of weights happens once, not at each start.
- Optimised graphs: ONNX Runtime's CPU graph optimisation and weight prepacking, saved once
  (`optimized_model_filepath`, prepacked weights in its external data file) and loaded with
  optimisation off. Keyed by the source graph's digest, the ONNX Runtime version, the CPU and
  the session settings that shape the saved graph.

A cache entry that is missing, unreadable, or changed since it was written (its files' size, mtime,
ctime or inode) is ignored and rebuilt, and one ONNX Runtime cannot load falls back to the model's
own graph: at worst the cache makes a start slower, never an error. A cached graph is also checked
against the CRC-32 of its content recorded when it was saved. The cache is used only while its
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
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.core.atomic import write_atomic

if TYPE_CHECKING:
    import onnxruntime as ort

FORMAT = 1
DIGESTS = "digests.json"
MAX_DIGESTS = 256  # files remembered; the oldest entries go first
MAX_GRAPHS = 8  # optimised graphs kept (each is the graph plus its weights, prepacked and not)
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


def _read_json(path: Path) -> dict:
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


def _own_stat_key(path: Path) -> list[int] | None:
    """_stat_key of a cached file that is the user's own and not writable by others (else None: not trusted)."""
    st = os.lstat(path)
    if _unsafe(st) or not os.path.isfile(path) or os.path.islink(path):
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def file_digests(paths: list[Path]) -> dict[Path, str]:
    """The sha256 of each file, from the cache where the file is unchanged since it was hashed."""
    from toolkit.core.digests import file_sha256

    root = directory()
    known = _read_json(root / DIGESTS).get("files", {}) if root else {}
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


def _cpu() -> str:
    """What the prepacked weights depend on: the CPU's model and instruction set extensions."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [line for line in f.read().split("\n\n", 1)[0].splitlines()
                     if line.split(":")[0].strip() in ("vendor_id", "model name", "flags")]
        return " | ".join(lines) or platform.processor()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def graph_key(identity: str, settings: str) -> tuple[str, str]:
    """The cache entry of one graph, named by its content (`identity`: its and its weights' sha256),
    the settings the saved graph depends on, the ONNX Runtime version and the CPU: the directory
    name, and the whole key, which the entry records and must match (so a name clash is harmless)."""
    import onnxruntime as ort

    text = "\n".join([f"tk-graph-cache/{FORMAT}", identity, settings, ort.__version__, _cpu()])
    return f"{identity[:16]}-{zlib.crc32(text.encode()):08x}", text


GRAPH = "graph.onnx"
DATA = "graph.onnx.data"
ENTRY = "entry.json"


def cached_session(source: Path | Callable[[], Path | bytes], identity: str,
                   create_session: Callable[..., ort.InferenceSession], threads: int | None = None) -> ort.InferenceSession:
    """A CPU session for `source` (already checked against `identity`), from the cache's saved
    optimised graph when there is a sound one, else from `source`, saving it for next time.
    `source` may be a function that makes the graph (a variant built in memory): it runs only on a miss,
    so a cached variant costs no build at start-up.
    `create_session`: toolkit.runtimes.onnxruntime's, passed in so that this module needs no runtime."""
    from toolkit.core.ort_options import CPU_DISABLED_OPTIMIZERS

    root = directory()
    if root is None:
        return create_session(source() if callable(source) else source, "cpu", threads=threads)
    name, key = graph_key(identity, f"all -{','.join(CPU_DISABLED_OPTIMIZERS)} prepacked")
    entry = root / "graphs" / name
    recorded = _read_json(entry / ENTRY)
    try:
        # The graph itself (small: the structure, which decides what runs) is checked by content; the prepacked
        # weights beside it (tens of MB, hashed at each start would cost what the cache saves) by stat. A CRC, not
        # a sha256 (no OpenSSL at start-up): it catches an edit; the record itself is protected by the private directory.
        if (recorded.get("key") == key and recorded.get("stat") == {n: _own_stat_key(entry / n) for n in (GRAPH, DATA)}
                and recorded.get("graph_crc32") == zlib.crc32((entry / GRAPH).read_bytes())):
            return create_session(entry / GRAPH, "cpu", optimization="disabled", threads=threads)
    except Exception:
        pass  # unreadable or corrupt: rebuilt below from the source graph
    import shutil

    shutil.rmtree(entry, ignore_errors=True)
    return _save(source() if callable(source) else source, entry, key, create_session, threads)


def _save(source: Path | bytes, entry: Path, key: str, create_session: Callable[..., ort.InferenceSession],
          threads: int | None) -> ort.InferenceSession:
    """The session for `source`, whose optimised graph ONNX Runtime writes into a temporary
    directory that becomes `entry` only once complete (its files fsynced, their stat recorded)."""
    import shutil
    import tempfile

    from toolkit.core.errors import UsageError

    def save_to(so) -> None:
        so.optimized_model_filepath = str(Path(tmp) / GRAPH)
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA)
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        so.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1")

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-")
    except OSError:
        return create_session(source, "cpu", threads=threads)
    try:
        try:
            session = create_session(source, "cpu", threads=threads, configure=save_to)
        except UsageError:  # saving failed (or the source is bad: then this raises the same error)
            return create_session(source, "cpu", threads=threads)
        for name in (GRAPH, DATA):
            with open(Path(tmp) / name, "rb") as f:
                os.fsync(f.fileno())
        origin = str(source) if isinstance(source, Path) else "built in memory"
        write_atomic(Path(tmp) / ENTRY, json.dumps({"format": FORMAT, "source": origin, "key": key,
                                                    "stat": {n: _own_stat_key(Path(tmp) / n) for n in (GRAPH, DATA)},
                                                    "graph_crc32": zlib.crc32((Path(tmp) / GRAPH).read_bytes())}).encode())
        os.rename(tmp, entry)
        _prune(entry.parent)
        return session
    except OSError:
        return session  # saved or not, the session itself is sound
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _prune(graphs: Path) -> None:
    """Keeps the MAX_GRAPHS most recently written graphs (and drops temporary leftovers of crashed runs)."""
    import shutil

    entries = []
    for d in graphs.iterdir():
        try:
            age = d.stat().st_mtime
        except OSError:
            continue
        if d.name.startswith(".tmp-"):
            if time.time() - age > 3600:
                shutil.rmtree(d, ignore_errors=True)
        else:
            entries.append((age, d))
    for _, d in sorted(entries, reverse=True)[MAX_GRAPHS:]:
        shutil.rmtree(d, ignore_errors=True)
