"""The Ray Data actor: one per worker, holding its own ONNX Runtime sessions, translating a shard per call.

The sessions are created in the actor's constructor, on the node that runs it (sessions cannot be
pickled, and shipping a model per call would cost more than translating). Each shard is translated by
toolkit.deploy.translate.translate_lines, the loop of `tk translate -i`, over translate_batch, so a shard's
output is what `tk translate` writes for the same lines.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from toolkit.core.batching import DecodeOptions
from toolkit.core.errors import ToolkitError, first_line
from toolkit.core.textprep import TextOptions
from toolkit.corpus import inputs
from toolkit.runtimes.registry import DEFAULT as DEFAULT_RUNTIME

# Lines per chunk inside a shard: how often a worker reports progress (and sorts by length within).
PROGRESS_LINES = 256

# Test hook: "SHARD_ID:MARKER_FILE" makes the actor that gets that shard exit abruptly, once (the marker
# records that it did), standing in for a node or process dying mid-shard.
CRASH_ENV = "TK_CORPUS_CRASH_ONCE"


class ShardTranslator:
    def __init__(self, model_dir: str, provider: str, variant: str, threads: int | None, decode: DecodeOptions, text: dict,
                 strict: bool, crash_once: str | None = None, counter=None, runtime: str = DEFAULT_RUNTIME,
                 languages: dict | None = None):
        from toolkit.deploy.translate import open_model

        # The pair as tk translate --source-lang/--target-lang chooses it (TranslationModel.for_languages).
        self.t = open_model(model_dir, provider, variant, threads=threads, runtime=runtime).for_languages(**(languages or {}))
        self.opts = decode
        self.text = TextOptions(**text)
        self.strict = strict
        self.crash_once = crash_once
        self.counter = counter  # a LineCounter actor, or None

    def _maybe_crash(self, shard: int) -> None:
        if not self.crash_once:
            return
        target, marker = self.crash_once.split(":", 1)
        if int(target) == shard and not os.path.exists(marker):
            Path(marker).write_text(str(os.getpid()))
            os._exit(1)

    def translate_shard(self, row: dict) -> tuple[str, str, str | None]:
        """(status, output text, error) for one shard row of the plan; for a done shard, `error` holds the warnings
        about lines tk failed on (translate_batch gave them a fallback's or an empty translation), one a line."""
        from toolkit.deploy.translate import failure_notes, translate_lines

        self._maybe_crash(int(row["shard"]))
        path, first, lines = str(row["path"]), int(row["first_line"]), int(row["lines"])
        try:
            if row["kind"] == "text":
                raws, digest = inputs.read_text(path, int(row["offset"]), lines)
            else:
                raws, digest = inputs.read_parquet(path, str(row["column"]), first, lines)
            if len(raws) != lines or digest != row["input_sha256"]:
                return "failed", "", f"{path} changed since the run was planned (lines {first}-{first + lines - 1}); rerun to re-plan"
            out: list[str] = []
            said: list[str] = []
            stats = translate_lines(self.t, inputs.decode(raws, first, path), out.append, self.opts, self.strict, warn=said.append,
                                    text=self.text, progress=self._report, chunk_lines=PROGRESS_LINES)
        except ToolkitError as e:
            return "failed", "", str(e)
        except OSError as e:
            return "failed", "", f"cannot read {path} ({e.strerror})"
        except Exception as e:  # noqa: BLE001 - a bug fails this shard in one line; the run goes on, the other shards are kept
            return "failed", "", f"{type(e).__name__} in tk while translating lines {first}-{first + lines - 1} ({first_line(e)})"
        # Only the warnings about lines tk failed on reach the driver (a corpus's guard warnings would flood it).
        notes = [f"{path} line {n}: {note}" for n, note in failure_notes(said, stats.failed)]
        return "done", "".join(line + "\n" for line in out), "\n".join(notes) or None

    def _report(self, lines: int) -> None:
        if self.counter is not None:
            self.counter.add.remote(lines)  # fire and forget: progress never waits on the driver

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = [{k: v[i] for k, v in batch.items()} for i in range(len(batch["shard"]))]
        status, text, error, seconds = [], [], [], []
        for row in rows:
            start = time.perf_counter()
            s, t, e = self.translate_shard(row)
            status.append(s)
            text.append(t)
            error.append(e or "")
            seconds.append(time.perf_counter() - start)
        return {"shard": batch["shard"], "status": np.array(status, dtype=object), "text": np.array(text, dtype=object),
                "error": np.array(error, dtype=object), "seconds": np.array(seconds)}
