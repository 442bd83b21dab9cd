"""Ray's processes end with the driver that started them, however it ends.

A local Ray instance started by `tk translate-corpus` is shut down when the driver exits, but a driver
killed outright (kill -9, the OOM killer) cannot do that, and Ray's own reaper leaves the agents its
raylet started (seven processes stayed behind). A small watcher process, started before Ray, keeps a
list of the driver's descendants and kills them once the driver is gone: it learns that from a pipe
whose only writer is the driver, which the kernel closes at the driver's death whatever the cause.
"""

from __future__ import annotations

import os
import subprocess
import sys

# psutil comes with Ray. A reused pid is safe: psutil checks a process's start time before it kills.
_WATCHER = r"""
import os, sys, threading
import psutil

driver, me = psutil.Process(int(sys.argv[1])), os.getpid()
seen = {}
gone = threading.Event()
threading.Thread(target=lambda: (sys.stdin.buffer.read(), gone.set()), daemon=True).start()
while not gone.is_set():
    try:
        seen.update((p.pid, p) for p in driver.children(recursive=True) if p.pid != me)
    except psutil.Error:
        break
    gone.wait(float(sys.argv[2]))
for p in seen.values():
    try:
        p.kill()
    except psutil.Error:
        pass
"""

_pipe: list[int] = []  # the write end, open for the life of this process


def watch_descendants(poll_s: float = 1.0) -> None:
    """Starts the watcher once per process. os.pipe's descriptors are not inherited (PEP 446), so no
    child of the driver holds the pipe open after the driver has died."""
    if _pipe:
        return
    read_end, write_end = os.pipe()
    try:
        subprocess.Popen([sys.executable, "-c", _WATCHER, str(os.getpid()), str(poll_s)], stdin=read_end,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        os.close(write_end)
        return  # without the watcher a killed driver may leave Ray's processes behind, as before
    finally:
        os.close(read_end)
    _pipe.append(write_end)
