"""A long input's progress moves while it is decoded, per batch, and ends at the line count."""

from __future__ import annotations

from toolkit.core.decode_options import DecodeOptions
from toolkit.deploy.translate import open_model, translate_lines


def test_progress_moves_per_batch_within_a_chunk_and_ends_at_the_line_count(tiny_export):
    t = open_model(tiny_export)
    lines = [(i, f"Hello number {i}. How are you?" if i % 3 else "I'm home.") for i in range(1, 41)]
    steps: list[int] = []
    out: list[str] = []
    opts = DecodeOptions.for_manifest(t.manifest, batch_size=4, streams=1)
    # one chunk holds every line: before, the bar moved once, at the very end of the chunk
    translate_lines(t, iter(lines), out.append, opts, progress=steps.append, chunk_lines=2048)
    assert len(out) == 40
    assert sum(steps) == 40 and all(isinstance(s, int) and s > 0 for s in steps)
    assert len(steps) >= 10, steps  # 40 lines of one or two sentences in batches of 4: many updates, not one


def test_progress_is_whole_lines_even_when_a_batch_ends_inside_a_line(tiny_export):
    t = open_model(tiny_export)
    # three sentences per line and batches of 2: a batch ends in the middle of a line
    lines = [(i, "I'm home. Where is the station? The cat is sleeping.") for i in range(1, 8)]
    steps: list[int] = []
    translate_lines(t, iter(lines), lambda s: None, DecodeOptions.for_manifest(t.manifest, batch_size=2, streams=1),
                    progress=steps.append)
    assert sum(steps) == 7 and all(isinstance(s, int) for s in steps) and len(steps) > 1
