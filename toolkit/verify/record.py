"""What `tk verify` leaves behind: the JSON report, the verdict as an error, and a summary in manifest.json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from toolkit.core import manifest as manifest_mod
from toolkit.core.atomic import write_atomic
from toolkit.core.errors import ParityError
from toolkit.verify.report import Report


def write_json(report: Report, path: Path) -> None:
    write_atomic(path, (json.dumps(report.to_json(), indent=2) + "\n").encode("utf-8"), user_path=True)  # --json: a FIFO or device is written through


def raise_on_failure(report: Report) -> None:
    if report.failures:
        first = report.failures[0]
        raise ParityError(f"{len(report.failures)} check(s) failed; first: {first.check} {first.graph}/{first.output} "
                          f"[{first.variant}, {first.provider}, {first.case}] max abs {first.max_abs:.3g}"
                          + (f" ({first.detail})" if first.detail else ""))


def record_summary(report: Report, directory: Path, seconds: float) -> list[str]:
    """Worst error per (check, variant) and the verdict, stored in manifest.json as one record per runtime and
    provider that ran: a record for another provider (CUDA evidence, when verifying on a CPU machine) is kept.
    Static checks (files, declarations, graph structure) belong to every provider's record. Returns the keys written."""
    with manifest_mod.updating(directory) as m:
        return _record(report, m, seconds)


def _record(report: Report, m: manifest_mod.Manifest, seconds: float) -> list[str]:
    runtime = report.runtime.split()[0]
    static = [r for r in report.rows if r.check == "static"]
    written = []
    for provider in dict.fromkeys(r.provider for r in report.rows if r.check != "static"):
        rows = static + [r for r in report.rows if r.provider == provider]
        worst: dict[str, dict] = {}
        for r in rows:
            if r.check == "static":
                continue
            w = worst.setdefault(f"{r.check}/{r.variant}/{r.provider}", {"max_abs": 0.0, "checks": 0, "failed": 0})
            w["checks"] += 1
            w["failed"] += not r.ok
            if np.isfinite(r.max_abs):
                w["max_abs"] = max(w["max_abs"], r.max_abs)
            if r.check == "translation":
                w["detail"] = r.detail
        failures = sum(not r.ok for r in rows)
        key = manifest_mod.verification_key(runtime, provider)
        m.verification[key] = manifest_mod.VerificationRecord(
            passed=not failures, checks=len(rows), failures=failures, seed=report.seed,
            seconds=round(seconds, 1), reference=report.reference, environment=report.environment,
            skipped_providers=report.skipped, worst=worst)
        written.append(key)
    return written
