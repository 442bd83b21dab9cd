"""The providers (devices) the runtimes run the graphs on, declared once: every command's --provider choices, the
Python API's checks, verify and toolkit.runtimes read these. Which runtimes there are is not core's to say: each
registers itself in toolkit.runtimes.registry.

Imports nothing: `tk --help` builds its choice lists from it at no cost.
"""

from __future__ import annotations

PROVIDERS: tuple[str, ...] = ("cpu", "cuda")
