"""The shortlist `tk bench --scale` times: one table of candidates, stored for tk (shortlist.npz, `tk translate
--shortlist`) and as CTranslate2's vocabulary map (vmap.txt, translate_batch(use_vmap=True)), so both engines decode
over the same candidates.

The bench's models have random weights, so no text can estimate their shortlist: each source token the bench's
sources use gets PER_TOKEN candidates drawn without replacement with chances falling as 1 / (id + 10) (a
SentencePiece vocabulary lists its frequent pieces first, so real lists share their common tokens the same way), and
the FREQUENT lowest ids and the end token are always allowed. The sizes are the defaults of a shortlist tk estimates.

Run as a script of its own (`python -m toolkit.bench.scale_shortlist TK_DIR [CT2_DIR]`), one preparation step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from toolkit.core import manifest as manifest_mod
from toolkit.core import shortlist as table_mod
from toolkit.core.atomic import write_atomic
from toolkit.core.digests import file_sha256

SOURCE_IDS = 4096  # the bench's sources use ids below this (scale.sources)
VMAP = "vmap.txt"  # where CTranslate2's Translator reads its vocabulary map


def synthetic(vocab: int, end: int, seed: int = 0) -> table_mod.Shortlist:
    rng = np.random.default_rng(seed)
    chance = 1.0 / (np.arange(vocab) + 10.0)
    chance /= chance.sum()
    lists = [np.sort(rng.choice(vocab, table_mod.PER_TOKEN, replace=False, p=chance)) for _ in range(min(vocab, SOURCE_IDS))]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    always = np.unique(np.concatenate([np.arange(min(table_mod.FREQUENT, vocab)), [end]])).astype(np.int32)
    return table_mod.Shortlist(offsets, np.concatenate(lists).astype(np.int32), always)


def write(tk_dir: Path, ct2_dir: Path | None) -> None:
    m = manifest_mod.load(tk_dir)
    vocab = int(next(t.dims[-1] for t in m.specs()["decoder"].outputs if t.name == "log_probs"))
    table = synthetic(vocab, m.rules().end)
    write_atomic(tk_dir / table_mod.FILE, table.to_bytes())
    with manifest_mod.updating(tk_dir) as m:
        m.shortlist = manifest_mod.ShortlistRecord(table_mod.FILE, file_sha256(tk_dir / table_mod.FILE),
                                                   "synthetic (toolkit.bench.scale_shortlist)", table_mod.PER_TOKEN,
                                                   table_mod.FREQUENT, table.sizes)
    if ct2_dir is not None:
        # CTranslate2's own ids are its vocabulary file's lines; tk's are the same (the bench checks their outputs agree).
        pieces = json.loads((ct2_dir / "shared_vocabulary.json").read_text(encoding="utf-8"))
        lines = ["\t" + " ".join(pieces[i] for i in table.always)]  # an empty source: always candidates
        for s in range(len(table.offsets) - 1):
            listed = table.targets[table.offsets[s]: table.offsets[s + 1]]
            if len(listed) and s < len(pieces):
                lines.append(pieces[s] + "\t" + " ".join(pieces[i] for i in listed if i < len(pieces)))
        write_atomic(ct2_dir / VMAP, ("\n".join(lines) + "\n").encode("utf-8"))


if __name__ == "__main__":
    write(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
