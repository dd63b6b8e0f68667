"""Terminal summary of a report (rich tables)."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from pardiag.analyzer.registry import Report


def _n(v: float, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:,.{digits}f}"


def render_terminal(report: Report, console: Console) -> None:
    """Print the per-rank breakdown and the collectives table to ``console``."""
    b = report.breakdown
    t = Table(title=f"Time breakdown per rank (ms) — {report.traces.source}", title_justify="left",
              caption="compute = compute only; overlap % = overlapped / communication; "
                      "exposed % = exposed comm / span", caption_justify="left")
    for col in ("rank", "on", "span", "compute", "overlapped", "exposed", "idle", "overlap %",
                "exposed %"):
        t.add_column(col, justify="left" if col == "on" else "right")
    for r in b.totals.itertuples():
        t.add_row(str(r.rank), r.domain, _n(r.span_us / 1e3, 3), _n(r.compute_only_us / 1e3, 3),
                  _n(r.overlap_us / 1e3, 3), _n(r.exposed_comm_us / 1e3, 3),
                  _n(r.idle_us / 1e3, 3), _n(r.overlap_pct, 2), _n(r.exposed_comm_pct, 1))
    console.print(t)
    if len(b.collectives):
        agg = (b.collectives.groupby("collective", as_index=False)
               .agg(ranks=("rank", "nunique"), count=("count", "sum"), time_us=("time_us", "sum"),
                    exposed_us=("exposed_us", "sum")))
        c = Table(title="Collectives (all ranks)", title_justify="left")
        for col in ("collective", "ranks", "count", "time ms", "exposed ms"):
            c.add_column(col, justify="left" if col == "collective" else "right")
        for r in agg.itertuples():
            c.add_row(r.collective, str(r.ranks), str(r.count), _n(r.time_us / 1e3, 3),
                      _n(r.exposed_us / 1e3, 3))
        console.print(c)
