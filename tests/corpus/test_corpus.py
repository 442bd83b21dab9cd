"""tk translate-corpus on a local Ray instance: the same lines as tk translate, in order; resume, a killed
actor, a bad line, refusals. One Ray instance (2 CPUs) serves every test of this module."""

from __future__ import annotations

import json
import os

import pytest
from conftest import REPO, on_every_core

from toolkit.core import data

# Minutes of work in all: left out of the fast tier (pytest -m 'not slow').
pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def english(corpus_zip) -> list[str]:
    en, _ = data.references(data.load_corpus(corpus_zip).splits["test"])
    return en[:36]


@pytest.fixture()
def corpus(tmp_path, english):
    """Two text files in a directory and a Parquet file: 12 + 10 + 14 lines, an empty line among them."""
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_text("\n".join(english[:12]) + "\n", encoding="utf-8")
    (d / "b.txt").write_text("\n".join([*english[12:16], "", *english[17:22]]) + "\n", encoding="utf-8")
    pq.write_table(__import__("pyarrow").table({"id": list(range(14)), "en": english[22:36]}), tmp_path / "c.parquet", row_group_size=4)
    lines = [*english[:12], *english[12:16], "", *english[17:22], *english[22:36]]
    return d, tmp_path / "c.parquet", lines


def run(cli, model, *args):
    return cli("translate-corpus", model, *args)


def plain(cli, model, tmp_path, lines: list[str]) -> list[str]:
    src, out = tmp_path / "plain-in.txt", tmp_path / "plain-out.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = cli("translate", "--model", model, "-q", "-i", src, "-o", out)
    assert result.exit_code == 0, result.output
    return out.read_text(encoding="utf-8").splitlines()


def manifest(out) -> dict:
    return json.loads((out / "corpus.json").read_text())


def test_a_multi_file_corpus_gives_the_lines_tk_translate_gives_in_input_order(cli, tiny_export, ray_address, corpus, tmp_path):
    d, parquet, lines = corpus
    out = tmp_path / "out"
    result = run(cli, tiny_export, d, parquet, out, "--column", "en", "--workers", 2, "--shard-lines", 5)
    assert result.exit_code == 0, result.output
    got = (out / "translations.txt").read_text(encoding="utf-8").splitlines()
    assert got == plain(cli, tiny_export, tmp_path, lines)
    m = manifest(out)
    # 12, 10 and 14 lines in shards of 5: 3 + 2 + 3, each with its line range and a done status.
    assert [(s["source"], s["first_line"], s["lines"]) for s in m["shards"]] == [
        (0, 1, 5), (0, 6, 5), (0, 11, 2), (1, 1, 5), (1, 6, 5), (2, 1, 5), (2, 6, 5), (2, 11, 4)]
    assert {s["status"] for s in m["shards"]} == {"done"}
    assert "shards 8/8, 36/36 lines" in result.output and "lines/s, ETA" in result.output


def test_a_rerun_skips_verified_shards_and_redoes_a_changed_or_missing_one(cli, tiny_export, ray_address, corpus, tmp_path):
    d, _, lines = corpus
    out = tmp_path / "out"
    assert run(cli, tiny_export, d, out, "--shard-lines", 4).exit_code == 0
    expected = (out / "translations.txt").read_text(encoding="utf-8")
    files = sorted((out / "shards").iterdir())
    files[1].write_text("tampered\n" * 4, encoding="utf-8")
    files[3].unlink()
    kept = {f: f.stat().st_mtime_ns for f in (files[0], files[2], files[4], files[5])}
    result = run(cli, tiny_export, d, out, "--shard-lines", 4)
    assert result.exit_code == 0, result.output
    assert "4 already done, 2 to translate" in result.output
    assert (out / "translations.txt").read_text(encoding="utf-8") == expected
    assert {f: f.stat().st_mtime_ns for f in kept} == kept  # the verified shards were not translated again


def test_an_actor_killed_mid_shard_has_its_shard_retried(cli, tiny_export, ray_address, corpus, tmp_path, monkeypatch):
    d, _, lines = corpus
    marker, out = tmp_path / "crashed", tmp_path / "out"
    monkeypatch.setenv("TK_CORPUS_CRASH_ONCE", f"2:{marker}")
    result = run(cli, tiny_export, d, out, "--workers", 2, "--shard-lines", 5)
    assert marker.exists(), "the hook never killed an actor"
    assert result.exit_code == 0, result.output
    assert (out / "translations.txt").read_text(encoding="utf-8").splitlines() == plain(cli, tiny_export, tmp_path, lines[:22])


def test_a_non_utf8_line_fails_only_its_shard_and_a_fixed_input_resumes(cli, tiny_export, ray_address, english, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out"
    good = [s.encode() for s in english[:15]]
    bad = [*good[:11], b"caf\xe9 au lait", *good[12:]]
    src.write_bytes(b"\n".join(bad) + b"\n")
    result = run(cli, tiny_export, src, out, "--shard-lines", 5)
    assert result.exit_code == 1, result.output
    assert "error: 1 of 3 shards failed" in result.output and "in.txt line 12 is not valid UTF-8" in result.output
    assert [s["status"] for s in manifest(out)["shards"]] == ["done", "done", "failed"]
    assert not (out / "translations.txt").exists()
    src.write_bytes(b"\n".join(good) + b"\n")
    result = run(cli, tiny_export, src, out, "--shard-lines", 5)
    assert result.exit_code == 0, result.output
    assert "2 already done, 1 to translate" in result.output
    assert (out / "translations.txt").read_text(encoding="utf-8").splitlines() == plain(cli, tiny_export, tmp_path, english[:15])


@pytest.mark.parametrize("problem", ["not-ours", "other-options", "no-column", "wrong-column", "no-input", "device"])
def test_refusals_are_one_line_and_touch_nothing(cli, tiny_export, ray_address, corpus, tmp_path, problem):
    d, parquet, _ = corpus
    out = tmp_path / "out"
    args = [d, out]
    if problem == "not-ours":
        out.mkdir()
        (out / "thesis.tex").write_text("precious")
    elif problem == "other-options":
        assert run(cli, tiny_export, d, out, "--shard-lines", 8).exit_code == 0
        args = [d, out, "--shard-lines", 8, "--beam", 2]
    elif problem == "no-column":
        args = [parquet, out]
    elif problem == "wrong-column":
        args = [parquet, out, "--column", "text"]
    elif problem == "device":  # a device, read by offset shard by shard as a file is, is no input
        args = ["/dev/null", out]
    else:
        args = [tmp_path / "missing*.txt", out]
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    result = run(cli, tiny_export, *args)
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("error: ")
    assert problem != "device" or "/dev/null is not a regular file" in result.output
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_translate_corpus_never_imports_torch(tiny_export, ray_address, corpus, tmp_path, assert_torch_free):
    d, _, _ = corpus
    # A separate driver process joins the test's Ray instance through --address, as on a cluster.
    assert_torch_free("translate-corpus", tiny_export, d, tmp_path / "out", "--address", ray_address, "-q")
    assert len((tmp_path / "out" / "translations.txt").read_text().splitlines()) == 22


def test_progress_rate_and_eta_count_only_this_runs_lines():
    from toolkit.corpus.progress import Progress

    now = [0.0]
    seen: list[str] = []
    # 1,000 of 4,000 lines were done by an earlier run; this run translates 1,000 lines in 10 s.
    p = Progress(4, 4000, 1, 1000, seen.append, now=lambda: now[0])
    now[0] = 10.0
    p.shard_finished(1000)
    assert seen == ["shards 2/4, 2,000/4,000 lines, 100.0 lines/s, ETA 0:00:20"]


def test_progress_is_reported_inside_a_long_shard(cli, tiny_export, ray_address, english, tmp_path):
    """One shard of 1,500 lines: progress lines come while it runs, not only when it ends."""
    src = tmp_path / "long.txt"
    src.write_text("\n".join(english[i % len(english)] for i in range(1500)) + "\n", encoding="utf-8")
    result = run(cli, tiny_export, src, tmp_path / "out", "--progress-seconds", 0.1)
    assert result.exit_code == 0, result.output
    running = [line for line in result.output.splitlines() if line.endswith("(shards running)")]
    assert running, result.output
    assert running[0].startswith("shards 0/1, ") and "/1,500 lines" in running[0]
    assert "shards 1/1, 1,500/1,500 lines" in result.output


def test_progress_counts_lines_of_running_shards():
    from toolkit.corpus.progress import Progress

    now = [0.0]
    seen: list[str] = []
    p = Progress(2, 2000, 0, 0, seen.append, now=lambda: now[0], every=5.0)
    now[0] = 2.0
    assert p.translating(256) is None  # within 5 s of the start: quiet
    now[0] = 10.0
    assert p.translating(512) == "shards 0/2, 512/2,000 lines, 51.2 lines/s, ETA 0:00:29 (shards running)"
    now[0] = 20.0
    p.shard_finished(1000)
    assert seen[-1] == "shards 1/2, 1,000/2,000 lines, 50.0 lines/s, ETA 0:00:20"


SHIPPED = str(REPO / "exported" / "transformer")


def test_an_unreachable_cluster_is_refused_at_once_in_one_line(tmp_path):
    """Ray itself retries an address that does not answer for minutes; tk tries it once first. (A subprocess:
    this module's own process has joined a Ray instance, which a command run in it would use.)"""
    import subprocess
    import sys

    (tmp_path / "in.txt").write_text("Hello.\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "translate-corpus", SHIPPED, str(tmp_path / "in.txt"),
                           str(tmp_path / "out"), "--address", "127.0.0.1:1"], env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot reach a Ray cluster at 127.0.0.1:1" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(240)
def test_sigterm_during_a_run_exits_130_with_one_line(ray_address, tmp_path):
    """ray.init installs a SIGTERM handler that exits 15 at once; tk puts its own back (clean-up, exit 130)."""
    import signal
    import subprocess
    import sys
    import time

    src = tmp_path / "in.txt"
    src.write_text("The cat is sleeping on the sofa while we wait.\n" * 20000)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "translate-corpus", SHIPPED, str(src), str(tmp_path / "out"),
                             "--address", ray_address, "--shard-lines", "2000"], env=env, stderr=subprocess.PIPE, text=True)
    seen = []
    deadline = time.time() + 180
    for line in proc.stderr:  # the pool is up once it names its workers
        seen.append(line)
        if "worker(s)" in line or time.time() > deadline:
            break
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=120)[1]
    stderr = "".join(seen) + rest
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "error: interrupted", stderr


@pytest.mark.timeout(240)
def test_a_killed_driver_leaves_no_ray_process_behind(tmp_path):
    """kill -9 skips every clean-up of the driver's own; the watcher (toolkit/core/reaper.py) ends what it started."""
    import subprocess
    import sys
    import time

    import psutil

    src = tmp_path / "in.txt"
    src.write_text("The cat is sleeping on the sofa while we wait.\n" * 20000)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with on_every_core():  # the local Ray it starts
        proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "translate-corpus", SHIPPED, str(src), str(tmp_path / "out"),
                                 "--shard-lines", "2000"], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    for line in proc.stderr:  # a local Ray instance is up once the pool names its workers
        if "worker(s)" in line or time.time() > deadline:
            break
    time.sleep(3)  # its raylet's agents have started
    started = psutil.Process(proc.pid).children(recursive=True)
    assert len(started) >= 3, started  # the instance's processes and the watcher
    proc.kill()
    proc.wait(30)

    def alive(p) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    deadline = time.time() + 60
    while time.time() < deadline and any(alive(p) for p in started):
        time.sleep(0.5)
    left = [str(p.pid) for p in started if alive(p)]
    assert not left, left


def test_ray_s_level_announcement_is_dropped_and_every_other_native_line_kept(capfd):
    """The one line Ray's C++ core prints at every start ('Set ray log level from environment variable ...') is not
    shown; anything else written to file descriptor 2 meanwhile (an error) reaches the user."""
    from toolkit.corpus.run import _RAY_LEVEL_NOTE, _without_native_line

    capfd.readouterr()
    with _without_native_line(_RAY_LEVEL_NOTE):
        os.write(2, b"[2026-11-26 13:19:19,541 I 17160 17160] logging.cc:303: Set ray log level from environment variable "
                    b"RAY_BACKEND_LOG_LEVEL to 3\n")
        os.write(2, b"[2026-11-26 13:19:20,000 E 1 1] core_worker.cc:1: something went wrong\n")
    err = capfd.readouterr().err
    assert err == "[2026-11-26 13:19:20,000 E 1 1] core_worker.cc:1: something went wrong\n"
