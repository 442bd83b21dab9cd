"""Ctrl-C and SIGTERM, handled in one place for every command.

The first signal raises KeyboardInterrupt in the main thread, so each command cleans up as it would on
any error (temporary outputs removed, a training checkpoint saved) and the CLI exits 130 with one line.
A second signal while that clean-up runs means "stop now": the process exits 130 at once, without
unwinding, instead of raising inside the clean-up (a traceback) or inside a native runtime's teardown
(an abort). Files are still never half-written: every output is renamed into place only when complete,
and a later write removes the temporary files of a writer that died.

Before a command runs (while `tk` imports its modules and parses its arguments) there is nothing to clean
up, so a signal then exits 130 at once with the same line (`starting`): raised as KeyboardInterrupt inside
an import it would print a traceback, or turn into the ImportError of a native module's initialisation.
This module imports only the standard library, so the CLI installs it before anything heavy.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_active = False  # inside handled(): claim() puts the handlers back where a library replaced them
_received = False  # a signal arrived inside handled(): whatever error follows was caused by it
_said = False  # "error: interrupted" is already on stderr: a later signal exits without saying it twice


class Interrupted(KeyboardInterrupt):
    """What the first signal raises; every `except KeyboardInterrupt` catches it. Not KeyboardInterrupt itself:
    CPython remembers a KeyboardInterrupt (that exact type) leaving any exec or eval of a string (a dataclass
    being made, a string type hint read while a model loads) as unhandled, even when tk catches it later, and
    then ends the process by SIGINT instead of its exit code 130."""


def _first(signum, frame) -> None:
    global _received
    _received = True
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _again)
    raise Interrupted


def _again(signum, frame) -> None:
    if not _said:
        with contextlib.suppress(OSError):
            os.write(2, b"error: interrupted\n")
    os._exit(130)


def say_interrupted() -> None:
    """Writes the one line an interrupted command ends with, once: a signal after it exits without a second. Through
    sys.stderr, which a caller running tk in-process (click's CliRunner) may have replaced."""
    global _said
    _said = True
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.write("error: interrupted\n")
        sys.stderr.flush()


def _install(handler) -> dict:
    """Puts `handler` on every signal the process does not ignore (a shell's background job starts with SIGINT
    ignored, and it stays ignored); returns the handlers it replaced. The main thread only: signals are delivered there."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {sig: h for sig in SIGNALS if (h := signal.getsignal(sig)) is not signal.SIG_IGN}
    for sig in previous:
        signal.signal(sig, handler)
    return previous


def _restore(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def exit_at_once() -> dict:
    """From now on a signal exits 130 with one line (nothing to clean up yet: start-up). Returns what to restore."""
    return _install(_again)


def restore(previous: dict) -> None:
    """Puts back the handlers `exit_at_once` replaced."""
    _restore(previous)


@contextlib.contextmanager
def starting() -> Iterator[None]:
    """The block (argument parsing, the command's own set-up around handled()) exits 130 at once on a signal;
    the handlers that were there are put back after it, so that running tk in-process leaves its caller as it was."""
    previous = exit_at_once()
    try:
        yield
    finally:
        _restore(previous)


def interrupted() -> bool:
    """Whether a signal arrived in the current handled() block: an error raised after it (an import that a
    KeyboardInterrupt turned into "ImportError: initialization failed") is the interruption, not a fault."""
    return _received


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Installs the handlers for the block, then puts back the ones that were there, so that running a command
    in-process leaves its caller as it was."""
    global _active, _received
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received = False
    previous = _install(_first)
    _active = True
    try:
        yield
    finally:
        _active = False
        _restore(previous)


def claim() -> None:
    """Puts tk's handlers back after a library installed its own (ray.init makes SIGTERM exit 15 at once,
    skipping the clean-up and the one-line message)."""
    if not _active or threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        if signal.getsignal(sig) not in (signal.SIG_IGN, _again):
            signal.signal(sig, _first)
