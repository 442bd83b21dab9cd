"""The table `tk verify` prints: one line per (check, graph, variant, provider, output), its worst case."""

from __future__ import annotations

import numpy as np

from toolkit.verify.report import Report, Row


def summarize(report: Report) -> list[list[str]]:
    """One line per (check, graph, variant, provider, output): the worst case over the sweep or decode."""
    groups: dict[tuple, list[Row]] = {}
    for r in report.rows:
        output = "interface" if r.check == "static" else r.output  # one line per graph, not per tensor
        groups.setdefault((r.check, r.graph, r.variant, r.provider, output), []).append(r)
    table = []
    for (check, graph, variant, prov, output), rows in groups.items():
        worst = max(rows, key=lambda r: (not r.ok, r.max_abs if np.isfinite(r.max_abs) else np.inf))
        t1 = [r.top1 for r in rows if r.top1 is not None]
        noise = [r.noise for r in rows if r.noise is not None]
        table.append([check, graph, variant, prov, output, str(len(rows)), f"{worst.max_abs:.2e}", f"{worst.max_rel:.2e}",
                      f"{max(r.outside for r in rows):.2%}", f"{min(t1):.2%}" if t1 else "",
                      f"{max(noise):.1e}" if noise else "", "ok" if all(r.ok for r in rows) else "FAIL",
                      worst.detail if not worst.ok or check in ("translation", "generate", "batch") else ""])
    return table


HEADER = ["check", "graph", "variant", "provider", "output", "cases", "max abs", "max rel", "outside", "top-1", "noise", "", "detail"]


def render(report: Report) -> str:
    table = [HEADER, *summarize(report)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + (f"  {row[-1]}" if row[-1] else "") for row in table]
    return "\n".join(line.rstrip() for line in lines)
