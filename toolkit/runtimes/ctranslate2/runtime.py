"""CTranslate2's declaration in the runtime registry (toolkit.runtimes.registry): it reads no graphs but the converted
copy of the weights that `tk export DIR --ctranslate2` stores, so verify holds it to PyTorch by its own evidence."""

from __future__ import annotations

from toolkit.core.manifest import Manifest
from toolkit.runtimes.ctranslate2.engine import COMPUTE, LoadedCt2, version
from toolkit.runtimes.ctranslate2.engine import load as load_converted
from toolkit.runtimes.registry import CONVERTED, RuntimeSpec


def load(m: Manifest, provider: str, variant: str, *, allow_fallback: bool = False, threads: int | None = None,
         cache: bool = False, request_threads: int | None = None, check_io: bool = True) -> LoadedCt2:
    # No sessions to check: the converted files are checked against the manifest's sha256 as they load.
    return load_converted(m, provider, variant, threads, allow_fallback)


RUNTIME = RuntimeSpec(name="ctranslate2", runs=CONVERTED, load=load, version=version, providers=tuple(COMPUTE),
                      variants=tuple(dict.fromkeys(v for per in COMPUTE.values() for v in per)),
                      verify="toolkit.verify.ct2_parity:verify_ct2", extra="ct2")
