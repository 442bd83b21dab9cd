"""Ctrl-C and SIGTERM, handled in one place for every command.

The first signal raises KeyboardInterrupt in the main thread, so each command cleans up as it would on
any error (temporary outputs removed, a training checkpoint saved) and the CLI exits 130 with one line.
A second signal while that clean-up runs means "stop now": the process exits 130 at once, without
unwinding, instead of raising inside the clean-up (a traceback) or inside a native runtime's teardown
(an abort). Files are still never half-written: every output is renamed into place only when complete,
and a later write removes the temporary files of a writer that died.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_active = False  # inside handled(): claim() puts the handlers back where a library replaced them


def _first(signum, frame) -> None:
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _again)
    raise KeyboardInterrupt


def _again(signum, frame) -> None:
    with contextlib.suppress(OSError):
        os.write(2, b"error: interrupted\n")
    os._exit(130)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Installs the handlers for the block (the main thread only: signals are delivered there), then puts
    back the ones that were there, so that running a command in-process leaves its caller as it was."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # A signal the process was started ignoring (SIGINT of a shell's background job) stays ignored.
    global _active
    previous = {sig: h for sig in SIGNALS if (h := signal.getsignal(sig)) is not signal.SIG_IGN}
    for sig in previous:
        signal.signal(sig, _first)
    _active = True
    try:
        yield
    finally:
        _active = False
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def claim() -> None:
    """Puts tk's handlers back after a library installed its own (ray.init makes SIGTERM exit 15 at once,
    skipping the clean-up and the one-line message)."""
    if not _active or threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        if signal.getsignal(sig) not in (signal.SIG_IGN, _again):
            signal.signal(sig, _first)
