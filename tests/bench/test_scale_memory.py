"""`tk bench --scale` at the size users deploy: its engines' processes must fit in memory. At the NLLB-600M shape the
six engines, all loaded at once, took more than the machine's 24 GiB and the kernel killed tk fp32's worker (its rows
then read "its process ended (exit -9)"). Engines that do not fit together now run in groups, one group's rounds after
the other's (each engine allowed to grow to 2.5 times its loaded size); here the workers are stand-ins, and the memory is what the test says it is."""

from __future__ import annotations

import types

from toolkit.bench import scale

ENGINES = ["tk-fp32", "tk-int8", "ct2-fp32", "ct2-int8", "optimum", "transformers"]
ROWS = (scale.Row("greedy, batches of 2", 4, 2, 1), scale.Row("one per call", 2, 1, 1, per_call=True))


class _Machine:
    """A machine of `total` MiB on which every loaded engine holds `each` MiB."""

    def __init__(self, total: float, each: float):
        self.total, self.each, self.alive, self.most = total, each, set(), 0

    def worker(self, engine, *args, **kwargs):
        machine = self

        class Worker:
            def __init__(self):
                machine.alive.add(engine)
                machine.most = max(machine.most, len(machine.alive))
                self.hello = {"version": f"{engine} 1.0", "threads": "1 thread"}
                self.proc = types.SimpleNamespace(pid=len(machine.alive))

            def run(self, src, row):
                assert engine in machine.alive
                return {"seconds": 0.5, "outputs": [[5] * 3 for _ in src]}

            def close(self):
                machine.alive.discard(engine)

        return Worker()


def _run(monkeypatch, machine: _Machine, work) -> tuple[list, list[str]]:
    monkeypatch.setattr(scale, "_Worker", machine.worker)
    monkeypatch.setattr(scale, "_rss_mib", lambda pid: machine.each, raising=False)
    monkeypatch.setattr(scale, "_available_mib", lambda: machine.total - machine.each * len(machine.alive), raising=False)
    said: list[str] = []
    src = [[5, 6, 7, 2]] * 4
    runs = scale.run_engines(ENGINES, work, ROWS, src, tokens=3, threads=1, repeat=2, peer_python=None,
                             echo=said.append, pause=0.0)
    return runs, said


def test_engines_that_do_not_fit_together_run_in_groups_and_every_row_is_measured(monkeypatch, tmp_path):
    machine = _Machine(total=24_000, each=4_000)
    runs, said = _run(monkeypatch, machine, tmp_path)
    # With two loaded, 16,000 MiB are left: less than both growing to 2.5 times their 4,000 and a third doing the same.
    assert machine.most == 2 and not machine.alive
    assert all(r.error is None and sorted(r.seconds) == sorted(row.name for row in ROWS) for r in runs)
    assert all(len(seconds) == 2 for r in runs for seconds in r.seconds.values())  # two kept rounds each
    waits = [line for line in said if line.startswith("memory:")]
    assert waits == [f"memory: {engine} and the engines after it wait for {before} to finish (16,000 MiB available; "
                     "the loaded engines hold 8,000 MiB, each may grow to 2.5x)"
                     for engine, before in (("ct2-fp32", "tk-fp32, tk-int8"), ("optimum", "ct2-fp32, ct2-int8"))]
    assert "round 2 done (optimum, transformers)" in said


def test_engines_that_fit_take_turns_together_as_before(monkeypatch, tmp_path):
    machine = _Machine(total=64_000, each=2_000)
    runs, said = _run(monkeypatch, machine, tmp_path)
    assert machine.most == 6 and not any(line.startswith("memory:") for line in said)
    assert "round 2 done" in said and all(r.error is None for r in runs)


def test_a_worker_killed_mid_run_is_named_and_the_run_ends_with_the_other_rows(tmp_path):
    """A worker the kernel kills (here it kills itself with signal 9 at its first row) is reaped where it is found dead:
    its rows name the signal and what to do, its memory is still read, and the run ends normally. Before, closing it
    waited for it a second time, and the ECHILD that raised ended the whole run as 'no child processes'."""
    worker = tmp_path / "stand-in"
    worker.write_text("#!/bin/sh\nread hello\necho '{\"version\": \"stand-in 1\", \"threads\": \"1 thread\"}'\n"
                      "read row\nkill -9 $$\n", encoding="utf-8")
    worker.chmod(0o755)
    said: list[str] = []
    runs = scale.run_engines(["optimum"], tmp_path, ROWS, [[5, 6, 7, 2]] * 4, tokens=3, threads=1, repeat=1,
                             peer_python=str(worker), echo=said.append, pause=0.0)
    (run,) = runs
    assert run.error.startswith("its process was killed (signal 9, as the kernel kills one when memory runs out); "
                                "bench fewer --engines at a time"), run.error
    assert run.seconds == {} and run.peak_mib is not None and "round 1 done" in said
    assert f"optimum: {run.error}; the other engines go on" in said
