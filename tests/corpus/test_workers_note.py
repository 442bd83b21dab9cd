"""`tk translate-corpus --workers N` on a corpus of fewer shards than N: a shard is one actor's work, so fewer actors
run than asked for, and the user is told so in one line (with the shard size that would give each worker a shard),
not left to wonder why two workers were no faster than one. Torch-free and Ray-free: the line is said before Ray starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.corpus import run as corpus_run

SHIPPED = Path(__file__).resolve().parents[2] / "exported" / "transformer"


class RayStarting(Exception):
    """Stands for Ray's start: what the driver has said by then is what the test reads."""


def said_before_ray(tmp_path: Path, monkeypatch, lines: int, workers: int, shard_lines: int = 4096) -> list[str]:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "part-1.txt").write_text("".join(f"Sentence {i}.\n" for i in range(lines)))

    def no_ray(address):
        raise RayStarting

    monkeypatch.setattr(corpus_run, "connect", no_ray)
    job = corpus_run.CorpusJob(str(SHIPPED), [str(tmp_path / "corpus")], tmp_path / "out", settings={}, decode=None, text={},
                               workers=workers, shard_lines=shard_lines)
    said: list[str] = []
    with pytest.raises(RayStarting):
        corpus_run.translate_corpus(job, said.append)
    return said


def test_more_workers_than_shards_is_said_in_one_line_with_the_shard_size_that_uses_them(tmp_path, monkeypatch):
    said = said_before_ray(tmp_path, monkeypatch, lines=300, workers=2)
    notes = [line for line in said if line.startswith("note:")]
    assert notes == ["note: --workers 2, but the input is 1 shard (--shard-lines 4,096), so 1 worker runs; "
                     "--shard-lines 150 into a new OUTPUT_DIR gives each worker a shard"], said


def test_as_many_shards_as_workers_says_nothing(tmp_path, monkeypatch):
    said = said_before_ray(tmp_path, monkeypatch, lines=300, workers=2, shard_lines=150)
    assert not [line for line in said if line.startswith("note:")], said


def test_a_resumed_run_with_fewer_shards_left_than_workers_says_so_without_a_new_shard_size():
    left = [corpus_run.shards.Shard(3, 0, 301, 100, 0, "0" * 64)]
    workers, note = corpus_run.worker_count(4, left, 100, resuming=True)
    assert workers == 1 and note == "note: --workers 4, but 1 shard is left to translate, so 1 worker runs"
