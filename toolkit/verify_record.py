"""What `tk verify` leaves behind: the JSON report, the verdict as an error, and a summary in manifest.json."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from toolkit import manifest as manifest_mod
from toolkit.errors import ParityError
from toolkit.verify_report import Report


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")


def raise_on_failure(report: Report) -> None:
    if report.failures:
        first = report.failures[0]
        raise ParityError(f"{len(report.failures)} check(s) failed; first: {first.check} {first.graph}/{first.output} "
                          f"[{first.variant}, {first.provider}, {first.case}] max abs {first.max_abs:.3g}"
                          + (f" ({first.detail})" if first.detail else ""))


def record_summary(report: Report, directory: Path, seconds: float) -> None:
    """Worst error per (check, variant) and the verdict, stored in manifest.json as the model's parity record."""
    m = manifest_mod.load(directory)
    worst: dict[str, dict] = {}
    for r in report.rows:
        if r.check == "static":
            continue
        key = f"{r.check}/{r.variant}/{r.provider}"
        w = worst.setdefault(key, {"max_abs": 0.0, "checks": 0, "failed": 0})
        w["checks"] += 1
        w["failed"] += not r.ok
        if np.isfinite(r.max_abs):
            w["max_abs"] = max(w["max_abs"], r.max_abs)
        if r.check == "translation":
            w["detail"] = r.detail
    m.verification = manifest_mod.VerificationRecord(
        passed=not report.failures, checks=len(report.rows), failures=len(report.failures), seed=report.seed,
        seconds=round(seconds, 1), reference=report.reference, environment=report.environment,
        skipped_providers=report.skipped, worst=worst)
    m.save()
