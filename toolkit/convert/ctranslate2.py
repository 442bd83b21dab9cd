"""`tk export DIR --ctranslate2`: the directory's fp32 weights converted to a CTranslate2 model and stored beside its
graphs, recorded in the manifest's "converted" section.

CTranslate2 names its files model.bin, config.json and shared_vocabulary.json; a model directory holds only plain
names that say whose they are, so each is stored as ctranslate2.NAME and loaded from memory by its own name
(engine.stored_files).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from toolkit.convert.pipeline import IntoModelDirectory, Writer
from toolkit.core import manifest
from toolkit.core.errors import UsageError
from toolkit.runtimes.ctranslate2 import spec
from toolkit.runtimes.ctranslate2.engine import INSTALL_HINT, RUNTIME, available, forbidden_tokens, load_translator, version

PREFIX = f"{RUNTIME}."
PROBE = (9, 4, 1)  # the probe's sentence lengths (sources and targets alike): a ragged batch
PROBE_TOLERANCE = 1e-3  # of a log-probability: two engines' float32 rounding, far below a converter fault's


def _check(m: manifest.Manifest) -> None:
    """validate: ctranslate2 installed (said before any work, in terms of the flag given)."""
    if not available():
        raise UsageError(f"--ctranslate2 needs the ctranslate2 package; {INSTALL_HINT}")


def _write(m: manifest.Manifest, tmp: Path, echo: Callable[[str], None]) -> None:
    """write: CTranslate2's files, each under the plain name it is stored by (ctranslate2.NAME)."""
    echo("converting the fp32 weights to CTranslate2 ...")
    converted = tmp / RUNTIME
    converted.mkdir()
    spec.convert(m, converted)
    for path in sorted(converted.iterdir()):
        path.rename(tmp / f"{PREFIX}{path.name}")
    converted.rmdir()


def _verify(m: manifest.Manifest, tmp: Path, written: None) -> str | None:
    """verify: the stored files are what tk writes (spec.check_converted), and CTranslate2, loading them, scores a probe
    (random sentences: every target position and the end token) as the directory's fp32 graphs do on ONNX Runtime."""
    from toolkit import runtimes
    from toolkit.core.decoding import pad_batch
    from toolkit.runtimes.registry import DEFAULT

    files = {p.name.removeprefix(PREFIX): p.read_bytes() for p in sorted(tmp.iterdir())}
    spec.check_converted(m, files, {name: tmp / f"{PREFIX}{name}" for name in files})
    translator = load_translator(str(tmp), files, device="cpu", compute_type="float32", intra_threads=1)
    rules, (source, target), rng = m.rules(), (len(v) for v in spec.vocabularies(m)), np.random.default_rng(0)
    src = [rng.integers(4, source, n).tolist() for n in PROBE]
    tgt = [rng.choice(np.setdiff1d(np.arange(4, target), forbidden_tokens(m)), n).tolist() for n in PROBE]
    got = translator.score_batch([list(map(str, s)) for s in src], [list(map(str, t)) for t in tgt])
    backend = runtimes.load(m, DEFAULT, "cpu", "fp32").backend()
    state, steps = backend.encode(*pad_batch(src, rules.pad)), []
    for token in pad_batch([[rules.start, *t] for t in tgt], rules.pad)[0].T:
        steps.append(backend.step(token, state))
        state = steps[-1][1]
    lp = np.stack([s[0] for s in steps], axis=1)
    ref = np.concatenate([lp[i, np.arange(len(t) + 1), [*t, rules.end]] for i, t in enumerate(tgt)])
    finite = np.isfinite(ref)  # a token the model's rules forbid (-inf in the graphs; an end token) CTranslate2 scores all the same
    worst = float(np.abs(ref - np.concatenate([g.log_probs for g in got]))[finite].max())
    return None if worst <= PROBE_TOLERANCE else f"CTranslate2 scores a probe {worst:.2g} away from the fp32 graphs' log-probabilities"


def _record(m: manifest.Manifest, written: None, files: dict[str, manifest.FileRecord], command: str | None) -> None:
    records = {name.removeprefix(PREFIX): record for name, record in files.items()}
    m.converted = {**(m.converted or {}), RUNTIME: manifest.ConversionRecord(records, version(), command)}


# `tk export DIR --ctranslate2`: the conversion is stored in DIR (the manifest rewritten only once every file is in
# place; on failure the old conversion, if any, stays as it was), under the directory's lock.
WRITER = Writer(RUNTIME, lands=IntoModelDirectory(what="the CTranslate2 model", stage="tk-ct2", again="convert it again",
                                                  replaces=lambda m: "a CTranslate2 model" if RUNTIME in (m.converted or {}) else None,
                                                  record=_record),
                validate=_check, write=_write, verify=_verify, as_is="converts the directory's fp32 weights as they are",
                next_step=lambda source, out: f"check it with: tk verify {source} --runtime ctranslate2")
