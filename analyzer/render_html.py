"""The HTML report: one self-contained file (plotly.js inlined) that opens offline.

Figures are built from analysis results here and nowhere else. Every string that comes from a
trace or a file name is HTML-escaped before it reaches the page.
"""

from __future__ import annotations

import datetime
import html
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from pardiag import __version__
from pardiag.analyzer.registry import Report

#: Colours of the four breakdown parts, shared by every breakdown chart.
PART_COLORS = {"compute only": "#4C78A8", "overlapped": "#54A24B",
               "exposed comm": "#E45756", "idle": "#BAB0AC"}
_PART_COLUMNS = {"compute only": "compute_only_us", "overlapped": "overlap_us",
                 "exposed comm": "exposed_comm_us", "idle": "idle_us"}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;
color:#222;padding:0 16px}
h1{font-size:1.6em;margin-bottom:4px} h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:4px;
margin-top:32px} table{border-collapse:collapse;font-size:.9em;margin:8px 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:right} th{background:#f4f4f4}
td.l,th.l{text-align:left} .muted{color:#666} .warn{color:#a05a00} ul{padding-left:20px}
.kv td{text-align:left}
"""


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _fmt(v, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return _e(v)


def _table(df: pd.DataFrame, columns: dict[str, str], left: tuple[str, ...] = (),
           digits: int = 1) -> str:
    """HTML table of ``df``; ``columns`` maps column → header. Values escaped."""
    head = "".join(f'<th class="{"l" if c in left else ""}">{_e(h)}</th>' for c, h in columns.items())
    rows = []
    for _, r in df.iterrows():
        cells = "".join(f'<td class="{"l" if c in left else ""}">'
                        f'{_fmt(r[c], 2 if c.endswith("_pct") else digits)}</td>' for c in columns)
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def breakdown_figure(totals: pd.DataFrame) -> go.Figure:
    """Stacked bar per rank: compute only, overlapped, exposed communication, idle (ms)."""
    fig = go.Figure()
    x = [f"rank {r}" for r in totals["rank"]]
    for part, col in _PART_COLUMNS.items():
        fig.add_bar(name=part, x=x, y=totals[col] / 1000.0, marker_color=PART_COLORS[part],
                    hovertemplate="%{x}: %{y:.3f} ms<extra>" + part + "</extra>")
    fig.update_layout(barmode="stack", title="Time breakdown per rank (whole trace)",
                      yaxis_title="time (ms)", legend_orientation="h", height=420)
    return fig


def step_breakdown_figure(steps: pd.DataFrame) -> go.Figure:
    """Stacked bar per rank and profiler step (ms)."""
    fig = go.Figure()
    x = [f"r{r} s{s}" for r, s in zip(steps["rank"], steps["step"])]
    for part, col in _PART_COLUMNS.items():
        fig.add_bar(name=part, x=x, y=steps[col] / 1000.0, marker_color=PART_COLORS[part],
                    hovertemplate="%{x}: %{y:.3f} ms<extra>" + part + "</extra>")
    fig.update_layout(barmode="stack", title="Time breakdown per rank and profiler step",
                      yaxis_title="time (ms)", xaxis_title="rank r, step s",
                      legend_orientation="h", height=420)
    return fig


def overlap_figure(totals: pd.DataFrame) -> go.Figure:
    """Bar per rank: overlap % = |compute ∩ comm| / |comm|."""
    t = totals.dropna(subset=["overlap_pct"])
    fig = go.Figure(go.Bar(x=[f"rank {r}" for r in t["rank"]], y=t["overlap_pct"],
                           marker_color=PART_COLORS["overlapped"],
                           hovertemplate="%{x}: %{y:.2f} %<extra></extra>"))
    fig.update_layout(title="Communication overlapped by computation", yaxis_title="overlap (%)",
                      yaxis_range=[0, 100], height=360)
    return fig


def render_html(report: Report, *, include_plotlyjs: bool | str = True) -> str:
    """The whole report page as a string.

    Args:
        report: the analyses to show.
        include_plotlyjs: True inlines plotly.js (works offline); ``"cdn"`` links it instead.
    """
    b = report.breakdown
    traces = report.traces
    first = True

    def add(fig: go.Figure) -> str:
        nonlocal first
        out = pio.to_html(fig, full_html=False, include_plotlyjs=include_plotlyjs if first else False,
                          config={"displaylogo": False, "responsive": True})
        first = False
        return out

    parts: list[str] = []
    run = traces.run_info or {}
    domains = sorted(set(b.totals["domain"]))
    summary = [
        ("source", traces.source),
        ("ranks", f"{len(traces.ranks)} ({', '.join(str(r) for r in traces.ranks)})"
         if len(traces.ranks) <= 16 else f"{len(traces.ranks)}"),
        ("timeline", ", ".join("GPU kernels" if d == "gpu" else "CPU events (no GPU kernels)"
                               for d in domains)),
    ]
    if run:
        summary += [("command", run.get("command", "")),
                    ("world size", run.get("world_size", "")),
                    ("exit code", run.get("exit_code", ""))]
        lay = run.get("layout") or {}
        if lay:
            dims = ", ".join(f"{k.upper()}={v}" for k, v in lay.get("dims", {}).items())
            pipe = lay.get("pipeline")
            extra = (f"; {pipe.get('schedule')}, {pipe.get('stages')} stages, "
                     f"{pipe.get('microbatches')} microbatches" if pipe else "")
            summary.append(("parallel layout", f"{dims} ({', '.join(lay.get('strategies', []))})"
                            + extra))
    backends = sorted({str(t.metadata.get("distributedInfo", {}).get("backend"))
                       for t in traces.ranks.values()
                       if isinstance(t.metadata.get("distributedInfo"), dict)
                       and t.metadata["distributedInfo"].get("backend")})
    if backends:
        summary.append(("backend", ", ".join(backends)))
    if len(b.totals):
        comm = b.totals["comm_us"].sum()
        exposed = b.totals["exposed_comm_us"].sum()
        span = b.totals["span_us"].sum()
        summary.append(("exposed communication",
                        f"{100 * exposed / span:.1f}% of rank time" if span else "–"))
        summary.append(("overlap (all ranks)", f"{100 * (comm - exposed) / comm:.1f}%" if comm
                        else "no communication found"))
    parts.append("<h2>Run summary</h2><table class='kv'>" + "".join(
        f"<tr><th class='l'>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in summary) + "</table>")

    parts.append("<h2>Time breakdown per rank</h2>")
    if len(b.totals):
        parts.append(add(breakdown_figure(b.totals)))
        ms = b.totals.copy()
        for c in ("span_us", "compute_only_us", "overlap_us", "exposed_comm_us", "idle_us"):
            ms[c] = ms[c] / 1000.0
        parts.append(_table(ms, {
            "rank": "rank", "domain": "timeline", "span_us": "span (ms)",
            "compute_only_us": "compute only (ms)", "overlap_us": "overlapped (ms)",
            "exposed_comm_us": "exposed comm (ms)", "idle_us": "idle (ms)",
            "overlap_pct": "overlap %"}, left=("domain",), digits=3))
    else:
        parts.append("<p class='muted'>No timed events found.</p>")

    parts.append("<h2>Overlap per rank</h2>")
    if b.totals["overlap_pct"].notna().any():
        parts.append(add(overlap_figure(b.totals)))
    else:
        parts.append("<p class='muted'>No communication found in any rank, so there is no overlap "
                     "to measure.</p>")

    parts.append("<h2>Per profiler step</h2>")
    if len(b.steps):
        parts.append(add(step_breakdown_figure(b.steps)))
    else:
        parts.append("<p class='muted'>No ProfilerStep#N annotations in the traces: per-step "
                     "breakdown unavailable.</p>")

    parts.append("<h2>Collectives</h2>")
    if len(b.collectives):
        ms = b.collectives.copy()
        ms["time_us"] = ms["time_us"] / 1000.0
        ms["exposed_us"] = ms["exposed_us"] / 1000.0
        parts.append(_table(ms, {
            "rank": "rank", "collective": "collective", "count": "count",
            "time_us": "time (ms)", "exposed_us": "exposed (ms)"}, left=("collective",), digits=3))
    else:
        parts.append("<p class='muted'>No communication events found.</p>")

    warnings = list(traces.warnings)
    notes = [n for t in traces.ranks.values() for n in t.notes]
    parts.append("<h2>Warnings and notes</h2>")
    if warnings or notes:
        parts.append("<ul>" + "".join(f"<li class='warn'>{_e(w)}</li>" for w in warnings)
                     + "".join(f"<li class='muted'>{_e(n)}</li>" for n in notes) + "</ul>")
    else:
        parts.append("<p class='muted'>None.</p>")

    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>pardiag report: {_e(Path(str(traces.source)).name)}</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>pardiag report</h1><p class='muted'>{_e(traces.source)} · pardiag {__version__}"
        f" · {stamp}</p>" + "".join(parts) + "</body></html>"
    )
