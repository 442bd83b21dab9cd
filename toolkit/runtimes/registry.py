"""The runtimes, registered once: a name and the module that declares it (`RUNTIME`, a RuntimeSpec). Everything that
offers, loads, verifies or times a runtime asks this registry what it can run and how, and never compares its name:
a new runtime is one package in toolkit/runtimes/ (or anywhere on sys.path) plus one line in TABLE or one `register`.

Imports no runtime: `names()` reads the table (`tk --help` builds its --runtime choices at no cost), and `get(name)`
imports the one declaration asked for, so the deploy path never imports openvino or ctranslate2 unless chosen.
The layout follows Polygraphy's backend/<name>/ (a loader apart from what runs it): each runtime's declaration
points at its own loader, which picks the runtime's defaults and checks its own sessions.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolkit.core.errors import UsageError

if TYPE_CHECKING:
    from toolkit.core.manifest import Manifest

LoadedRuntime = Any  # toolkit.runtimes.LoadedRuntime, which imports this module

# The one registration of each runtime shipped with tk: name -> the module whose RUNTIME declares it. The first is
# the default runtime (the one --runtime and the Python API use unless told).
TABLE: dict[str, str] = {
    "onnxruntime": "toolkit.runtimes.onnxruntime.runtime",
    "openvino": "toolkit.runtimes.openvino.runtime",
    "ctranslate2": "toolkit.runtimes.ctranslate2.runtime",
}
DEFAULT: str = next(iter(TABLE))
GRAPHS, CONVERTED = "graphs", "converted"  # what a runtime reads: the ONNX graphs, or a converted copy of the weights


def _cpu() -> str:
    return "cpu"


def _plain(provider: str, m: Manifest | None = None) -> str:
    return "fp32"  # toolkit.core.variants.PLAIN: the exported graphs, which every runtime runs


def _no_threads(provider: str, variant: str, m: Manifest) -> tuple[int | None, int | None]:
    return None, None


@dataclass(frozen=True)
class RuntimeSpec:
    """What a runtime is, declared by its own package as `RUNTIME`.

    load(m, provider, variant, *, allow_fallback, threads, cache, request_threads, check_io) -> LoadedRuntime: the
    loader, which checks its sessions' inputs and outputs against the manifest when `check_io` (verify reports a
    mismatch as a row of its own instead).
    default_provider() when none is given; default_variant(provider, m) when variant is None; default_threads(provider, variant, m)
    -> (threads, request_threads) when threads is None. streams: its backends' forks decode side by side on
    sessions of `threads` threads each (tk's streams pay off; a file's streams are cut to the cores / threads).
    verify: "module:function" of verify's checks for a runtime that reads no graphs (None: the graph checks).
    graph_outputs(source, provider, feeds) -> {name: array}: one graph run with every output named (localize).
    extra: the pip extra that installs it (None: tk's own requirements)."""

    name: str
    runs: str  # GRAPHS or CONVERTED
    load: Callable[..., LoadedRuntime]
    version: Callable[[], str]
    providers: tuple[str, ...] = ("cpu",)
    variants: tuple[str, ...] = ("fp32",)  # the catalogue's variants it runs (toolkit.core.variants), "attention" included
    default_provider: Callable[[], str] = _cpu
    default_variant: Callable[[str, Manifest | None], str] = _plain
    default_threads: Callable[[str, str, Manifest], tuple[int | None, int | None]] = _no_threads
    streams: bool = False
    verify: str | None = None
    graph_outputs: Callable[..., dict[str, Any]] | None = None
    extra: str | None = None
    shortlist: bool = False  # its loader takes shortlist=True: decoding over the directory's shortlist (toolkit.core.shortlist)

    def label(self) -> str:
        """How output names it: 'onnxruntime 1.31.0', 'openvino 2026.4.1'."""
        return f"{self.name} {self.version()}"

    def provider_label(self, provider: str) -> str:
        """A verify row's provider column: the default runtime's rows 'cpu'/'cuda', another's 'openvino-cpu'."""
        return provider if self.name == DEFAULT else f"{self.name}-{provider}"


_SPECS: dict[str, RuntimeSpec] = {}


def names() -> tuple[str, ...]:
    """Every registered runtime, the default first: the --runtime choices and the Python API's."""
    return tuple(TABLE)


def register(name: str, module: str) -> None:
    """Registers a runtime declared by `module`'s RUNTIME (imported when the runtime is first used): the one line a
    runtime that is not shipped with tk needs, after which --runtime, the Python API, deploy, serve and verify offer it."""
    if not name or not isinstance(module, str):
        raise UsageError(f"register a runtime by its name and the module that declares it, not {name!r}, {module!r}")
    TABLE[name] = module
    _SPECS.pop(name, None)


def check(name: str) -> None:
    if name not in TABLE:
        raise UsageError(f"unknown runtime '{name}'; choose {' or '.join(TABLE)}")


def get(name: str) -> RuntimeSpec:
    """The declaration of runtime `name`, its module imported now (and only now)."""
    check(name)
    if name not in _SPECS:
        try:
            spec = importlib.import_module(TABLE[name]).RUNTIME
        except (ImportError, AttributeError) as e:
            raise UsageError(f"runtime '{name}' is registered as {TABLE[name]}, which declares no RUNTIME ({e}); "
                             "fix its registration or install its package") from None
        if spec.name != name:
            raise UsageError(f"runtime '{name}' is registered as {TABLE[name]}, which declares '{spec.name}'; register it by that name")
        _SPECS[name] = spec
    return _SPECS[name]


def load(m: Manifest, name: str = DEFAULT, provider: str = "cpu", variant: str = "fp32", allow_fallback: bool = False,
         threads: int | None = None, cache: bool = False, request_threads: int | None = None, check_io: bool = True,
         shortlist: bool = False) -> LoadedRuntime:
    """Graph runners and a step-backend factory (`.backend()`) for every graph of the directory on runtime `name`.
    `cache`: ONNX Runtime on CPU loads the user cache's optimised graphs (toolkit.runtimes.onnxruntime.graph_cache).
    `request_threads`: ONNX Runtime on CPU decodes a call of one batch on this many threads, and concurrent
    streams on `threads` each (toolkit.runtimes.onnxruntime.loading). `check_io`: the loader refuses graphs
    whose inputs or outputs differ from manifest.json (verify, which reports that as a row, turns it off).
    `shortlist`: decode over the directory's shortlist, on a runtime that declares it can."""
    spec = get(name)
    if shortlist and not spec.shortlist:
        raise UsageError(f"runtime '{name}' cannot decode over a shortlist; use --runtime {DEFAULT}")
    return spec.load(m, provider, variant, allow_fallback=allow_fallback, threads=threads, cache=cache,
                     request_threads=request_threads, check_io=check_io, **({"shortlist": True} if shortlist else {}))
