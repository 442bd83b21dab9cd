"""ONNX Runtime's optimised graphs in the user's start-up cache (toolkit.core.load_cache owns the directory).

ONNX Runtime's CPU graph optimisation and weight prepacking, saved once (`optimized_model_filepath`,
prepacked weights in its external data file) and loaded with optimisation off. Keyed by the source
graph's digest, the ONNX Runtime version, the CPU and the session settings that shape the saved graph.

An entry that is missing, unreadable, or changed since it was written (its files' size, mtime, ctime or
inode) is ignored and rebuilt, and one ONNX Runtime cannot load falls back to the model's own graph: at
worst the cache makes a start slower, never an error. A cached graph is also checked against the CRC-32
of its content recorded when it was saved, and used only while it is the user's own and not writable by
others (toolkit.core.load_cache.own_stat_key).
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import onnxruntime as ort

from toolkit.core.atomic import write_atomic
from toolkit.core.errors import UsageError
from toolkit.core.load_cache import FORMAT, directory, own_stat_key, read_json
from toolkit.graphs.optimize import CPU_DISABLED_OPTIMIZERS

MAX_GRAPHS = 8  # optimised graphs kept (each is the graph plus its weights, prepacked and not)


def cpu_description() -> str:
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
    text = "\n".join([f"tk-graph-cache/{FORMAT}", identity, settings, ort.__version__, cpu_description()])
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
    `create_session`: sessions.create_session, or the caller's wrapper of it (the decoder's own threads)."""
    root = directory()
    if root is None:
        return create_session(source() if callable(source) else source, "cpu", threads=threads)
    # "aligned": entries written before saved graphs were checked by prepacked_aligned are never trusted
    name, key = graph_key(identity, f"all -{','.join(CPU_DISABLED_OPTIMIZERS)} prepacked aligned {PACKED_ALIGNMENT}")
    entry = root / "graphs" / name
    recorded = read_json(entry / ENTRY)
    try:
        # The graph itself (small: the structure, which decides what runs) is checked by content; the prepacked
        # weights beside it (tens of MB, hashed at each start would cost what the cache saves) by stat. A CRC, not
        # a sha256 (no OpenSSL at start-up): it catches an edit; the record itself is protected by the private directory.
        if (recorded.get("key") == key and recorded.get("stat") == {n: own_stat_key(entry / n) for n in (GRAPH, DATA)}
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

    def save_to(so, prepacked: bool = True) -> None:
        so.optimized_model_filepath = str(Path(tmp) / GRAPH)
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA)
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        so.add_session_config_entry("session.save_external_prepacked_constant_initializers", "1" if prepacked else "0")

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
        if not prepacked_aligned(Path(tmp) / GRAPH):
            # Saved again with the weights packed at each load instead (the session above is sound either way).
            for name in (GRAPH, DATA):
                (Path(tmp) / name).unlink(missing_ok=True)
            create_session(source, "cpu", threads=threads, configure=lambda so: save_to(so, prepacked=False))
        for name in (GRAPH, DATA):
            with open(Path(tmp) / name, "rb") as f:
                os.fsync(f.fileno())
        origin = str(source) if isinstance(source, Path) else "built in memory"
        write_atomic(Path(tmp) / ENTRY, json.dumps({"format": FORMAT, "source": origin, "key": key,
                                                    "stat": {n: own_stat_key(Path(tmp) / n) for n in (GRAPH, DATA)},
                                                    "graph_crc32": zlib.crc32((Path(tmp) / GRAPH).read_bytes())}).encode())
        os.rename(tmp, entry)
        _prune(entry.parent)
        return session
    except OSError:
        return session  # saved or not, the session itself is sound
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# The alignment ONNX Runtime's CPU kernels read prepacked weights with (64 bytes: one AVX-512 vector).
PACKED_ALIGNMENT = 64


def prepacked_aligned(graph: Path) -> bool:
    """Whether every prepacked weight ONNX Runtime saved beside `graph` starts on a PACKED_ALIGNMENT boundary of its
    data file. Loaded, they are read in place from the mapped file; onnxruntime 1.31.1 places one after a smaller
    tensor at any multiple of 8, and its matrix kernels' aligned loads then crash the process (a Marian of d_model 64
    with its Q/K/V projections merged, at offset 895,832; 1.32 aligns them)."""
    import onnx

    model = onnx.load(graph, load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key.startswith("prepacked"):  # "KERNEL+HASH|OFFSET;LENGTH;..." for each packed buffer
                for blob in entry.value.split("|")[1:]:
                    offset = blob.split(";")[0]
                    if not offset.isdigit() or int(offset) % PACKED_ALIGNMENT:  # a format it does not know: unsafe
                        return False
    return True


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
