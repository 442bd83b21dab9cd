"""The shard plan and its manifest, OUTPUT_DIR/corpus.json: what each shard reads, its status, and its output's digest.

Only the driver writes the manifest, always whole and atomically, so a killed run leaves the last
complete state. A rerun re-plans from the inputs and skips a shard only when the manifest says it is
done, its input bytes still have the recorded digest and its output file still has the recorded digest.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from toolkit.core.atomic import write_atomic
from toolkit.core.errors import UsageError
from toolkit.core.manifest import file_sha256 as manifest_sha256
from toolkit.corpus import inputs
from toolkit.corpus.inputs import Source

MANIFEST = "corpus.json"
SHARD_DIR = "shards"
VERSION = 1


@dataclass
class Shard:
    id: int
    source: int  # index into the manifest's sources
    first_line: int  # 1-based line (or row) number in its source
    lines: int
    offset: int  # byte offset of first_line in a text source; 0 for Parquet
    input_sha256: str
    status: str = "pending"  # pending | done | failed
    output_sha256: str | None = None
    error: str | None = None

    @property
    def output_name(self) -> str:
        # Named by position, not by id: a re-plan after an input changed keeps every unchanged shard's file.
        return f"{SHARD_DIR}/{self.source:04d}-{self.first_line:010d}.txt"

    def describe(self, sources: list[Source]) -> str:
        return f"shard {self.id} ({Path(sources[self.source].path).name} lines {self.first_line}-{self.first_line + self.lines - 1})"


@dataclass
class Plan:
    sources: list[Source]
    settings: dict  # the model and every option that changes a translation
    shard_lines: int
    shards: list[Shard] = field(default_factory=list)

    @property
    def total_lines(self) -> int:
        return sum(s.lines for s in self.shards)

    def to_json(self) -> dict:
        return {"version": VERSION, "settings": self.settings, "shard_lines": self.shard_lines,
                "sources": [asdict(s) for s in self.sources], "total_lines": self.total_lines,
                "shards": [asdict(s) for s in self.shards]}


def plan(sources: list[Source], settings: dict, shard_lines: int) -> Plan:
    """Reads every input once: shard boundaries and each shard's input digest."""
    p = Plan(sources, settings, shard_lines)
    for k, src in enumerate(sources):
        bounds = (inputs.text_boundaries(src.path, shard_lines) if src.kind == "text"
                  else inputs.parquet_boundaries(src.path, src.column, shard_lines))
        for first, lines, offset, digest in bounds:
            p.shards.append(Shard(len(p.shards), k, first, lines, offset, digest))
    return p


def file_sha256(path: Path) -> str | None:
    """The file's sha256, or None if it cannot be read (a missing shard is redone, not an error)."""
    try:
        return manifest_sha256(path)
    except OSError:
        return None


def resume(p: Plan, out_dir: Path) -> int:
    """Marks done the shards an earlier run in out_dir completed and whose files verify; returns how many.

    Refuses a directory that holds something else, or a run of other inputs or options, rather than mixing them."""
    path = out_dir / MANIFEST
    if not path.exists():
        if out_dir.exists() and any(out_dir.iterdir()):
            raise UsageError(f"{out_dir} is not empty and holds no {MANIFEST}; choose a new or empty OUTPUT_DIR")
        return 0
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        old_sources = [Source(**s) for s in old["sources"]]
        old_shards = [Shard(**s) for s in old["shards"]]
        old_settings = old["settings"]
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{path} is not a tk corpus manifest ({type(e).__name__}: {e}); choose a new OUTPUT_DIR") from None
    if old_sources != p.sources:
        raise UsageError(f"{out_dir} holds a run over other inputs ({', '.join(Path(s.path).name for s in old_sources)}); "
                         "choose a new OUTPUT_DIR")
    changed = sorted(k for k in set(old_settings) | set(p.settings) if old_settings.get(k) != p.settings.get(k))
    if changed or old.get("shard_lines") != p.shard_lines:
        what = ", ".join(f"{k} {old_settings.get(k)!r} -> {p.settings.get(k)!r}" for k in changed) or "shard size"
        raise UsageError(f"{out_dir} holds a run with other options ({what}); rerun with the same options or choose a new OUTPUT_DIR")
    done = {(s.source, s.first_line, s.lines, s.input_sha256): s.output_sha256 for s in old_shards if s.status == "done"}
    resumed = 0
    for s in p.shards:
        expected = done.get((s.source, s.first_line, s.lines, s.input_sha256))
        if expected and file_sha256(out_dir / s.output_name) == expected:
            s.status, s.output_sha256 = "done", expected
            resumed += 1
    return resumed


def save(p: Plan, out_dir: Path) -> None:
    write_atomic(out_dir / MANIFEST, (json.dumps(p.to_json(), indent=1) + "\n").encode("utf-8"))
