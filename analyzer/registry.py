"""The one list of analyses: the report, the JSON output and the CLI read it.

Each analysis is a pure function ``(TraceSet, AnalysisOptions) -> result`` registered here with
the function that turns its result into JSON-ready data.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable

import pandas as pd

from pardiag import layout
from pardiag.analyzer.breakdown import TimeBreakdown, compute_time_breakdown
from pardiag.analyzer.load import TraceSet


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnalysisOptions:
    """Options shared by all analyses.

    Attributes:
        comm_patterns: compiled regular expressions naming extra communication kernels.
    """

    comm_patterns: tuple[re.Pattern, ...] = ()


@dataclasses.dataclass(frozen=True)
class Analysis:
    """One registered analysis: a name, the function computing it, and its JSON form (a dict of
    top-level keys of the JSON summary)."""

    name: str
    compute: Callable[[TraceSet, AnalysisOptions], Any]
    to_json: Callable[[Any, TraceSet], dict]


def _clean(v):
    """JSON-safe scalar: NaN/inf become None, numpy scalars become Python numbers."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def records(df: pd.DataFrame, columns=None) -> list[dict]:
    """Rows of ``df`` as JSON-safe dicts (NaN → None)."""
    cols = list(columns or df.columns)
    return [{c: _clean(v) for c, v in zip(cols, row)} for row in df[cols].itertuples(index=False)]


_TOTAL_KEYS = ("span_us", "compute_us", "comm_us", "overlap_us", "compute_only_us",
               "exposed_comm_us", "idle_us", "overlap_pct", "compute_only_pct",
               "overlap_share_pct", "exposed_comm_pct", "idle_pct")


def _breakdown_json(b: TimeBreakdown, traces: TraceSet) -> dict:
    """``{"ranks": [...]}``: per rank its file, totals, steps and collectives."""
    ranks = []
    for rank, trace in traces.ranks.items():
        tot = b.totals[b.totals["rank"] == rank]
        steps = b.steps[b.steps["rank"] == rank]
        colls = b.collectives[b.collectives["rank"] == rank]
        ranks.append({
            "rank": rank, "file": str(trace.path), "rank_source": trace.rank_source,
            "domain": tot["domain"].iloc[0] if len(tot) else None,
            "total": records(tot, _TOTAL_KEYS)[0] if len(tot) else {},
            "steps": records(steps, ["step", "start_us", "end_us", *_TOTAL_KEYS]),
            "collectives": records(colls, ["collective", "count", "time_us", "exposed_us"]),
        })
    return {"ranks": ranks}


ANALYSES: tuple[Analysis, ...] = (
    Analysis("time_breakdown",
             lambda traces, opts: compute_time_breakdown(traces, opts.comm_patterns),
             _breakdown_json),
)


@dataclasses.dataclass(frozen=True)
class Report:
    """Everything a report shows: the loaded traces and each analysis' result by name."""

    traces: TraceSet
    results: dict[str, Any]

    @property
    def breakdown(self) -> TimeBreakdown:
        return self.results["time_breakdown"]


def build_report(traces: TraceSet, options: AnalysisOptions = AnalysisOptions()) -> Report:
    """Run every registered analysis on ``traces``."""
    return Report(traces, {a.name: a.compute(traces, options) for a in ANALYSES})


def report_json(report: Report) -> dict:
    """The JSON summary: run-level keys plus each analysis' own keys.

    Shape::

        {"schema_version", "source", "warnings": [...], "notes": [...], "run": {...} | null,
         "ranks": [{"rank", "file", "rank_source", "domain",
                    "total": {"span_us", "compute_us", "comm_us", "overlap_us",
                              "compute_only_us", "exposed_comm_us", "idle_us", "overlap_pct",
                              "compute_only_pct", "overlap_share_pct", "exposed_comm_pct",
                              "idle_pct"},
                    "steps": [{"step", "start_us", "end_us", ...the same keys}],
                    "collectives": [{"collective", "count", "time_us", "exposed_us"}]}]}

    Durations in µs; ``overlap_pct`` in % of communication time, the other ``*_pct`` in % of the
    window; null where undefined (no communication).
    """
    out = {
        "schema_version": layout.SCHEMA_VERSION,
        "source": report.traces.source,
        "warnings": list(report.traces.warnings),
        "notes": [n for t in report.traces.ranks.values() for n in t.notes],
        "run": report.traces.run_info,
    }
    for a in ANALYSES:
        out.update(a.to_json(report.results[a.name], report.traces))
    return out
