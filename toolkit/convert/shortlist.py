"""`tk export DIR --shortlist FILE`: a lexical shortlist estimated from text and stored in the model directory.

The target side is the model's own greedy translations of FILE's first column (one sentence a line, or a TSV whose
first column is the source): the candidates are what this model emits for each source token, in its own target
vocabulary, so a model with separate source and target vocabularies needs no target tokenizer here. A TSV's second
column (a reference) adds its tokens where source and target share one tokenizer (tk's own models).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from toolkit.core import manifest as manifest_mod
from toolkit.core import shortlist as table_mod
from toolkit.core.atomic import write_atomic
from toolkit.core.batching import decode_ids
from toolkit.core.decode_options import DecodeOptions
from toolkit.core.digests import file_sha256
from toolkit.core.errors import UsageError
from toolkit.core.placeholders import SYMBOLS
from toolkit.core.tokenizer import Tokenizer
from toolkit.deploy.translate import open_model


def read_sources(path: Path) -> tuple[list[str], list[str | None]]:
    """FILE's lines: the source (the first tab-separated column) and the reference (the second, or None)."""
    try:
        lines = [line.rstrip("\r") for line in path.read_text(encoding="utf-8").split("\n")]
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read --shortlist {path}: {e}; give a UTF-8 text file, one sentence (or TSV pair) a line") from None
    cols = [line.split("\t") for line in lines if line.strip()]
    if not cols:
        raise UsageError(f"--shortlist {path} holds no sentence; give a text file, one sentence (or TSV pair) a line")
    return [c[0] for c in cols], [c[1] if len(c) > 1 else None for c in cols]


def store(directory: Path, path: Path, echo: Callable[[str], None], command: str = "",
          per_token: int = table_mod.PER_TOKEN, frequent: int = table_mod.FREQUENT) -> table_mod.Shortlist:
    """Estimates the shortlist from `path` and records it in `directory` (replacing one stored before)."""
    sources, references = read_sources(path)
    t = open_model(directory, "cpu", None)
    m, rules = t.manifest, t.manifest.rules()
    src = [s[: m.max_len] for s in t.tokenizer.encode(sources)]
    echo(f"translating {len(src):,} sentences of {path} for the shortlist")
    opts = DecodeOptions.for_manifest(m, "cpu")
    tgt = [nbest[0].tokens for nbest in decode_ids(t.backend(), src, opts)]
    pairs = list(zip(src, tgt))
    shared = isinstance(t.tokenizer, Tokenizer)  # one vocabulary: a reference's tokens are target ids too
    if shared and any(references):
        kept = [(s, r) for s, r in zip(src, references) if r is not None]
        pairs += zip([s for s, _ in kept], t.tokenizer.encode([r for _, r in kept]))
    always = [rules.end, *([rules.forced_first] if rules.forced_first is not None else [])]
    if m.declared().placeholders:  # the model copies its placeholder symbols whatever the source words are
        always += [i for ids in t.tokenizer.encode(SYMBOLS) for i in ids]
    table = table_mod.estimate([s for s, _ in pairs], [g for _, g in pairs], per_token, frequent, tuple(always))
    write_atomic(directory / table_mod.FILE, table.to_bytes())
    with manifest_mod.updating(directory) as m2:
        m2.shortlist = manifest_mod.ShortlistRecord(
            table_mod.FILE, file_sha256(directory / table_mod.FILE),
            f"{path.name} ({len(src):,} sentences, the model's own translations{' and references' if shared and any(references) else ''})",
            per_token, frequent, table.sizes, command or None)
    return table
