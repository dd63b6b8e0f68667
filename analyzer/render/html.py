"""The HTML report: one self-contained file that opens offline, built with the page kit
(:mod:`pardiag.analyzer.render.page`: escaping, tables, inert figure data, plotly.js inlined).

Figures are built from analysis results here and nowhere else; every string from a trace goes
into them escaped (plotly renders a subset of HTML in labels, :func:`_pe`).

**Size.** Large runs are aggregated or sampled where a figure or table would grow with
ranks × steps × collectives (limits below); the page says so where it happens and lists every
such reduction under "Run summary".
"""

from __future__ import annotations

import datetime
import html
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..analyses.pipeline import summarize_bubbles
from ..analyses.routing import IMBALANCE_MIN
from ..analyses.stragglers import STRAGGLER_MIN_WAIT_US
from ..predict.recommend.findings import (
    STRAGGLER_IDLE_PCT,
    STRAGGLER_IDLE_PCT_PIPELINE,
    STRAGGLER_LAST_SHARE,
    STRAGGLER_RATIO,
)
from ..predict.recommend.policy import TIER_ORDER
from ..report.registry import Report
from ..trace import intervals as iv
from .page import PART_COLORS, Page, document, escape, fmt, in_mib, in_ms, muted, shown, table

_PART_COLUMNS = {"compute only": "compute_only_us", "overlapped": "overlap_us",
                 "exposed comm": "exposed_comm_us", "idle": "idle_us"}

#: Section headings, in page order (each is an ``<h2>`` with the id next to it).
SECTIONS = (
    ("verdict", "Verdict and recommendations"),
    ("summary", "Run summary"),
    ("breakdown", "Time breakdown per rank and step"),
    ("overlap", "Overlap per rank and per dimension"),
    ("stragglers", "Stragglers and synchronization"),
    ("critical_path", "Cross-rank critical path"),
    ("causes", "Why ranks are slow or idle"),
    ("pipeline", "Pipeline bubbles"),
    ("imbalance", "Load imbalance"),
    ("routing", "MoE routing"),
    ("memory", "Memory"),
    ("layout", "Layout and topology"),
    ("bandwidth", "Bandwidth"),
    ("collectives", "Collectives"),
    ("warnings", "Warnings and notes"),
)
#: The section of ``report --hta`` (listed before the warnings when the report has it).
HTA_SECTION = ("hta", "HTA: GPU idle time and kernel launches")

#: Most bars in the per-rank-and-step chart; above it the chart shows the mean over ranks per
#: step and a rank × step heatmap shows every rank.
MAX_STEP_BARS = 400
#: Most columns of the straggler heatmap; above it consecutive instances are binned (max wait).
HEATMAP_MAX_COLUMNS = 200
#: Most ranks drawn in the memory timeline (those with the highest peaks), and points per chart.
TIMELINE_MAX_RANKS = 16
TIMELINE_POINTS = 12_000
#: Most points of the bandwidth scatter (evenly sampled per collective type above it).
BANDWIDTH_MAX_POINTS = 3_000
#: Pipeline Gantt: at most this many (rank, stage) rows.
GANTT_MAX_ROWS = 64


def _pe(x) -> str:
    """Escape a string for a plotly label: plotly renders a subset of HTML (``<b>``, ``<a>``)
    in text, so trace strings go in as entities, which it shows literally."""
    return html.escape(str(x), quote=True)


def _f32(values) -> np.ndarray:
    """Figure data as float32 (half the bytes on the page; µs→ms values keep ~7 digits)."""
    return np.asarray(values, dtype=np.float32)


#: Above this many ranks, rank axes show bare numbers (``"12"``) instead of ``"rank 12"``.
SHORT_RANK_LABELS_ABOVE = 16


def _ranks(ranks) -> list[str]:
    """Category labels of a rank axis: ``"rank r"``, or ``"r"`` for many ranks."""
    ranks = list(ranks)
    if len(set(ranks)) > SHORT_RANK_LABELS_ABOVE:
        return [str(r) for r in ranks]
    return [f"rank {r}" for r in ranks]


# ---------------------------------------------------------------- figures
#
# Each figure is a plotly figure as a dict (``{"data": [...], "layout": {...}}``, the form
# plotly.js reads and ``plotly.graph_objects.Figure(spec)`` accepts), written in the shape
# plotly's own validation would give it: a report needs none of the figure objects' checking
# and copying, which cost more than the analyses of a small run. ``tests/test_html.py`` passes
# every figure through ``plotly.graph_objects.Figure`` and asserts that nothing changes.


def _colorscale(colors: list[str]) -> list[list]:
    """Evenly spaced stops of ``colors``: a named plotly colorscale as plotly writes it into a
    figure (plotly.js has scales of the same names with other colours)."""
    return [[i / (len(colors) - 1), c] for i, c in enumerate(colors)]


#: ColorBrewer's sequential reds and blues (plotly's ``sequential.Reds`` and ``.Blues``, written
#: out: ``plotly.colors`` imports plotly's validators; the page test fails if they drift apart).
REDS = _colorscale(["rgb(255,245,240)", "rgb(254,224,210)", "rgb(252,187,161)",
                    "rgb(252,146,114)", "rgb(251,106,74)", "rgb(239,59,44)", "rgb(203,24,29)",
                    "rgb(165,15,21)", "rgb(103,0,13)"])
BLUES = _colorscale(["rgb(247,251,255)", "rgb(222,235,247)", "rgb(198,219,239)",
                     "rgb(158,202,225)", "rgb(107,174,214)", "rgb(66,146,198)", "rgb(33,113,181)",
                     "rgb(8,81,156)", "rgb(8,48,107)"])


def _title(text: str) -> dict:
    return {"text": text}


def _bar(**props) -> dict:
    return {"type": "bar", **props}


def _scatter(**props) -> dict:
    return {"type": "scatter", **props}


def _heatmap(**props) -> dict:
    return {"type": "heatmap", **props}


def _stacked_bars(x, rows: pd.DataFrame, parts, hover: str) -> list:
    """One bar series per ``(label, column, colour)`` of ``parts``: ``rows[column]`` µs in ms."""
    return [_bar(name=label, x=x, y=_f32(rows[col] / 1000.0), marker={"color": color},
                 hovertemplate=hover + "<extra>" + escape(label) + "</extra>")
            for label, col, color in parts]


_BREAKDOWN_PARTS = [(part, col, PART_COLORS[part]) for part, col in _PART_COLUMNS.items()]


def breakdown_figure(totals: pd.DataFrame) -> dict:
    """Stacked bar per rank: compute only, overlapped, exposed communication, idle (ms).
    Returns a plotly figure dict (``data``, ``layout``)."""
    return {"data": _stacked_bars(_ranks(totals["rank"]), totals, _BREAKDOWN_PARTS,
                                  "%{x}: %{y:.3f} ms"),
            "layout": {"barmode": "stack", "title": _title("Time breakdown per rank (whole trace)"),
                       "yaxis": {"title": _title("time (ms)")},
                       "xaxis": {"title": _title("rank")}, "height": 420}}


def step_breakdown_figure(steps: pd.DataFrame) -> dict:
    """Stacked bar per rank and profiler step (ms). Returns a plotly figure dict."""
    x = [f"r{r} s{s}" for r, s in zip(steps["rank"], steps["step"])]
    return {"data": _stacked_bars(x, steps, _BREAKDOWN_PARTS, "%{x}: %{y:.3f} ms"),
            "layout": {"barmode": "stack",
                       "title": _title("Time breakdown per rank and profiler step"),
                       "yaxis": {"title": _title("time (ms)")},
                       "xaxis": {"title": _title("rank r, step s")}, "height": 420}}


def step_mean_figure(steps: pd.DataFrame) -> dict:
    """Stacked bar per profiler step of the mean over ranks of each part (ms). Returns a plotly
    figure dict."""
    mean = steps.groupby("step", sort=True)[list(_PART_COLUMNS.values())].mean()
    return {"data": _stacked_bars([f"step {s}" for s in mean.index], mean, _BREAKDOWN_PARTS,
                                  "%{x}: %{y:.3f} ms (mean over ranks)"),
            "layout": {"barmode": "stack",
                       "title": _title("Time breakdown per profiler step (mean over ranks)"),
                       "yaxis": {"title": _title("time (ms)")}, "height": 380}}


def step_heatmap(steps: pd.DataFrame, column: str, title: str) -> dict:
    """Heatmap rank × profiler step of one breakdown column (µs in, ms shown). Returns a plotly
    figure dict."""
    z = steps.pivot_table(index="rank", columns="step", values=column, aggfunc="first")
    return {"data": [_heatmap(z=_f32(z.to_numpy() / 1000.0), x=[f"step {s}" for s in z.columns],
                              y=[f"rank {r}" for r in z.index], colorscale=REDS,
                              colorbar={"title": _title("ms")},
                              hovertemplate="%{y}, %{x}: %{z:.3f} ms<extra></extra>")],
            "layout": {"title": _title(title), "height": min(1200, max(320, 140 + 14 * len(z))),
                       "yaxis": {"autorange": "reversed"}}}


def overlap_figure(totals: pd.DataFrame) -> dict:
    """Bar per rank: overlap % = |compute ∩ comm| / |comm|. Returns a plotly figure dict."""
    t = totals.dropna(subset=["overlap_pct"])
    return {"data": [_bar(x=_ranks(t["rank"]), y=_f32(t["overlap_pct"]),
                          marker={"color": PART_COLORS["overlapped"]},
                          hovertemplate="%{x}: %{y:.2f} %<extra></extra>")],
            "layout": {"title": _title("Communication overlapped by computation"),
                       "yaxis": {"title": _title("overlap (%)"), "range": [0, 100]},
                       "xaxis": {"title": _title("rank")}, "height": 360}}


def dim_overlap_figure(per_rank: pd.DataFrame) -> dict:
    """Grouped bars per rank, one series per parallel dimension: overlap % of that dimension's
    communication. Returns a plotly figure dict."""
    data = [_bar(name=_pe(dim), x=_ranks(g["rank"]), y=_f32(g["overlap_pct"]),
                 customdata=_f32(g["exposed_us"] / 1000.0),
                 hovertemplate="%{x}: %{y:.2f} % overlapped, %{customdata:.3f} ms exposed"
                               "<extra>" + _pe(dim) + "</extra>")
            for dim, g in per_rank.groupby("dim", sort=True)]
    return {"data": data,
            "layout": {"barmode": "group",
                       "title": _title("Overlap per rank and parallel dimension"),
                       "xaxis": {"title": _title("rank")},
                       "yaxis": {"title": _title("overlap (% of the dimension's communication)"),
                                 "range": [0, 100]},
                       "height": 380}}


#: Most tick labels on the straggler heatmap's instance axis (every k-th instance is labelled;
#: each cell's hover names its instance in full).
HEATMAP_MAX_TICKS = 16


def _tick_step(n: int, max_ticks: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, … that labels at most ``max_ticks`` of ``n``."""
    step, k = 1, 0
    while -(-n // step) > max_ticks:
        k += 1
        step = (1, 2, 5)[k % 3] * 10 ** (k // 3)
    return step


def straggler_heatmap(per_rank: pd.DataFrame, instances: pd.DataFrame,
                      max_columns: int = HEATMAP_MAX_COLUMNS,
                      max_ticks: int = HEATMAP_MAX_TICKS) -> dict:
    """Wait per rank and collective instance (ms, heatmap, instances in time order) under the
    arrival skew of each instance (ms, bars). Above ``max_columns`` instances, consecutive
    instances are binned: each cell is the largest wait of the bin, each bar the largest skew.

    Each column is named in full (``#8 reduce_scatter``, or ``#40–#42`` for a bin), which the
    hover shows; the axis labels at most ``max_ticks`` columns with the short ``#8``, so the
    labels stay whole and apart at any number of instances. Returns a plotly figure dict: two
    rows sharing the x axis (bars on ``x``/``y``, the heatmap on ``x2``/``y2``)."""
    n = len(instances)
    binned = n > max_columns
    col = np.arange(n) * max_columns // n if binned else np.arange(n)
    col_of = dict(zip(instances["instance"], col))
    sub = per_rank[per_rank["instance"].isin(col_of)]
    z = (sub.assign(col=sub["instance"].map(col_of))
         .pivot_table(index="rank", columns="col", values="wait_us", aggfunc="max"))
    ncols = int(col.max()) + 1 if n else 0
    z = z.reindex(columns=range(ncols))
    skew = pd.Series(instances["arrival_skew_us"].to_numpy(), index=col).groupby(level=0).max()
    if binned:
        first = pd.Series(np.arange(n), index=col).groupby(level=0).agg(["min", "max"])
        labels = [f"#{a}–#{b}" for a, b in zip(first["min"], first["max"])]
        short = [f"#{a}" for a in first["min"]]
    else:
        labels = [f"#{i} {_pe(op)}" for i, op in enumerate(instances["op"])]
        short = [f"#{i}" for i in range(n)]
    ticks = list(range(0, ncols, _tick_step(ncols, max_ticks)))
    data = [_bar(x=labels, y=_f32(skew.reindex(range(ncols)).to_numpy() / 1000.0),
                 marker={"color": "#F58518"}, name="arrival skew",
                 hovertemplate="%{x}: arrival skew %{y:.3f} ms<extra></extra>",
                 xaxis="x", yaxis="y"),
            _heatmap(z=_f32(z.to_numpy() / 1000.0), x=labels, y=[f"rank {r}" for r in z.index],
                     colorscale=REDS, colorbar={"title": _title("wait ms"), "y": 0.38,
                                                  "len": 0.75},
                     hovertemplate="%{y}, %{x}: wait %{z:.3f} ms<extra></extra>",
                     xaxis="x2", yaxis="y2")]
    # two rows, a quarter and three quarters of the height less a 0.04 gap, one shared x axis
    layout = {
        "xaxis": {"anchor": "y", "domain": [0.0, 1.0], "matches": "x2", "showticklabels": False},
        "yaxis": {"anchor": "x", "domain": [0.76, 1.0], "title": _title("skew ms")},
        "xaxis2": {"anchor": "y2", "domain": [0.0, 1.0],
                   "title": _title("collective instance (time order; hover a cell for its name)"),
                   "tickmode": "array", "tickvals": [labels[i] for i in ticks],
                   "ticktext": [short[i] for i in ticks], "tickangle": 0, "automargin": True},
        "yaxis2": {"anchor": "x2", "domain": [0.0, 0.72], "autorange": "reversed",
                   "automargin": True},
        "title": _title("Arrival skew (top) and wait per rank and collective instance (ms)"
                        + (" — instances binned, max per bin" if binned else "")),
        "height": min(1400, max(420, 240 + 16 * len(z))), "showlegend": False}
    return {"data": data, "layout": layout}


_PHASE_NAMES = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weight)"}
_PHASE_COLORS = {"F": "#4C78A8", "B": "#F58518", "I": "#F58518", "W": "#72B7B2"}


def pipeline_gantt(chunks: pd.DataFrame, step: int) -> dict:
    """Forward/backward chunks of one step per rank and stage (ms from the step's first
    forward), with each rank's bubbles (the step window minus its chunks) shaded red. Returns a
    plotly figure dict."""
    c = chunks[chunks["step"] == step].copy()
    t0, t1 = c["start_us"].min(), c["end_us"].max()
    c["row"] = [f"rank {r} · stage {s}" for r, s in zip(c["rank"], c["stage"])]
    bx, bb, by = [], [], []
    for (rank, row), _ in c.groupby(["rank", "row"], sort=True):
        busy = iv.union(c.loc[c["rank"] == rank, "start_us"].to_numpy(),
                        c.loc[c["rank"] == rank, "end_us"].to_numpy())
        gaps = iv.subtract(np.array([[t0, t1]], dtype=float), busy)
        for a, b in gaps:
            bb.append((a - t0) / 1000.0)
            bx.append((b - a) / 1000.0)
            by.append(row)
    data = [_bar(name="bubble (idle in the step window)", orientation="h", base=_f32(bb),
                 x=_f32(bx), y=by, marker={"color": "rgba(228,87,86,0.30)"},
                 hovertemplate="%{y}: bubble %{x:.2f} ms<extra></extra>")]
    for phase, grp in c.groupby("phase", sort=True):
        data.append(_bar(
            name=_pe(_PHASE_NAMES.get(phase, phase)), orientation="h",
            base=_f32((grp["start_us"] - t0) / 1000.0),
            x=_f32((grp["end_us"] - grp["start_us"]) / 1000.0),
            y=list(grp["row"]), text=[f"{_pe(phase)}{m}" for m in grp["microbatch"]],
            textposition="inside", marker={"color": _PHASE_COLORS.get(phase, "#999")},
            hovertemplate="%{y}: %{text} %{base:.2f} ms, %{x:.2f} ms long<extra></extra>"))
    return {"data": data,
            "layout": {"barmode": "overlay",
                       "title": _title(f"Pipeline schedule of step {step} (red: bubbles)"),
                       "xaxis": {"title": _title("ms from the step's first forward")},
                       "plot_bgcolor": "#fafafa", "height": 180 + 36 * c["row"].nunique(),
                       "yaxis": {"autorange": "reversed", "automargin": True}}}


def memory_figure(per_rank: pd.DataFrame) -> dict:
    """Static memory per rank by component, with the rank's peak (``peak_bytes``, static +
    transient: the peak every section states) as a marker (MiB). Returns a plotly figure
    dict."""
    x = _ranks(per_rank["rank"])
    data = [_bar(name=name, x=x, y=_f32(per_rank[col] / 2**20), marker={"color": color})
            for col, name, color in (("params_bytes", "parameters", "#4C78A8"),
                                     ("grads_bytes", "gradients", "#72B7B2"),
                                     ("optimizer_state_bytes", "optimizer state", "#F58518"))]
    peak = per_rank["peak_bytes"] if "peak_bytes" in per_rank else per_rank["peak_allocated_bytes"]
    data.append(_scatter(name="peak", x=x, y=_f32(peak / 2**20), mode="markers",
                         marker={"symbol": "diamond", "size": 12, "color": "#222"}))
    # legends sit to the right of the plot (plotly's default): a horizontal one below it lies
    # over the x-axis title ("parameters" over "rank")
    return {"data": data,
            "layout": {"barmode": "stack", "title": _title("Memory per rank (MiB)"),
                       "yaxis": {"title": _title("MiB")}, "xaxis": {"title": _title("rank")},
                       "height": 400}}


def memory_timeline(timeline: pd.DataFrame, points_per_rank: int = 1500) -> dict:
    """Allocated bytes over time per rank from the trace's memory events (MiB); at most
    ``points_per_rank`` evenly sampled points per rank. Returns a plotly figure dict."""
    data = []
    for rank, t in timeline.groupby("rank"):
        t = t.sort_values("ts_us")
        if len(t) > points_per_rank:
            t = t.iloc[:: -(-len(t) // points_per_rank)]
        data.append(_scatter(name=f"rank {rank}",
                             x=_f32((t["ts_us"] - t["ts_us"].min()) / 1000.0),
                             y=_f32(t["allocated_bytes"] / 2**20), mode="lines",
                             line={"shape": "hv"}))
    # tall enough for the legend's entries (a legend taller than the plot is cut at its foot)
    return {"data": data,
            "layout": {"title": _title("Allocated memory over the traced window (MiB)"),
                       "height": max(360, 160 + 20 * timeline["rank"].nunique()),
                       "xaxis": {"title": _title("ms from the rank's first memory event")},
                       "yaxis": {"title": _title("MiB")}}}


def bandwidth_figure(instances: pd.DataFrame) -> dict:
    """busbw of every collective instance (rows of ``instances``) against its message size.
    Returns a plotly figure dict."""
    d = instances.dropna(subset=["busbw_gbps"])
    data = [_scatter(name=_pe(op), x=_f32(g["bytes"]), y=_f32(g["busbw_gbps"]), mode="markers",
                     hovertemplate=_pe(op) + ": %{x:,.0f} B, %{y:.3f} GB/s<extra></extra>")
            for op, g in d.groupby("op")]
    # bytes as the tables print them (68,608): ticks at 1, 2 and 5 of each decade, or at the
    # powers of ten alone over three decades or more (plotly's own choice crowds them)
    sizes = d["bytes"][d["bytes"] > 0]
    wide = len(sizes) and np.log10(sizes.max() / sizes.min()) >= 3
    return {"data": data,
            "layout": {"title": _title("Bus bandwidth by message size"),
                       "xaxis": {"type": "log", "tickformat": ",.0f", "dtick": 1 if wide else "D2",
                                 # a tick label at the plot's left end would run into the
                                 # y-axis labels
                                 "ticklabeloverflow": "hide past domain",
                                 "title": _title("bytes")},
                       "yaxis": {"title": _title("busbw (GB/s)")}, "height": 360}}


def _subplot_title(text: str, x: float) -> dict:
    """A subplot's title above it, as plotly's ``make_subplots(subplot_titles=...)`` writes it."""
    return {"font": {"size": 16}, "showarrow": False, "text": text, "x": x, "xanchor": "center",
            "xref": "paper", "y": 1.0, "yanchor": "bottom", "yref": "paper"}


def routing_figure(routing) -> dict:
    """MoE routing of the most costly expert-parallel group
    (:class:`pardiag.analyzer.analyses.routing. RoutingResult`): left, each rank's expert-side rows
    per step (median over steps, bars) with the group's mean (line); right, when split sizes are
    known, the rows of each source rank's tokens each destination's experts take per all-to-all
    (mean, heatmap). Returns a plotly figure dict (the heatmap on ``x2``/``y2``)."""
    grp = routing.groups["group"].iloc[0]
    unit = "tokens" if routing.groups["unit"].iloc[0] == "rows" else "elements"
    pr = routing.per_rank[routing.per_rank["group"] == grp]
    load = pr.groupby("rank")["load_rows"].median()
    mean = float(pr.groupby("step")["load_rows"].mean().median())
    m = routing.matrix[routing.matrix["group"] == grp]
    x = _ranks(load.index)
    data = [_bar(x=x, y=_f32(load.to_numpy()), name="rank", marker={"color": "#4C78A8"},
                 hovertemplate="%{x}: %{y:,.0f} " + unit + " per step<extra></extra>",
                 xaxis="x", yaxis="y"),
            _scatter(x=x, y=[mean] * len(x), mode="lines", name="mean",
                     line={"color": "#E45756", "dash": "dash"},
                     hovertemplate="mean %{y:,.0f}<extra></extra>", xaxis="x", yaxis="y")]
    # one plot, or two side by side with 0.18 of the width between them
    right = 1.0 if not len(m) else (1.0 - 0.18) / 2
    layout = {"xaxis": {"anchor": "y", "domain": [0.0, right], "title": _title("rank"),
                        "type": "category"},
              "yaxis": {"anchor": "x", "domain": [0.0, 1.0],
                        "title": _title(f"{unit} per step")},
              "annotations": [_subplot_title(f"{unit} per rank and step (expert side)",
                                             right / 2)]}
    if len(m):
        piv = m.pivot_table(index="src", columns="dst", values="rows", aggfunc="sum")
        data.append(_heatmap(z=_f32(piv.to_numpy()), x=_ranks(piv.columns), y=_ranks(piv.index),
                             colorscale=BLUES, colorbar={"title": _title("rows")},
                             hovertemplate="%{y} → %{x}: %{z:,.0f} rows<extra></extra>",
                             xaxis="x2", yaxis="y2"))
        layout["xaxis2"] = {"anchor": "y2", "domain": [1.0 - right, 1.0],
                            "title": _title("expert rank"), "type": "category"}
        layout["yaxis2"] = {"anchor": "x2", "domain": [0.0, 1.0],
                            "title": _title("source rank"), "type": "category",
                            "autorange": "reversed"}
        layout["annotations"].append(_subplot_title("rows per all-to-all, source → expert rank",
                                                    1.0 - right / 2))
    layout.update(title=_title(f"MoE routing, group {_pe(str(grp).split('|')[0] or '?')}"),
                  height=400, showlegend=False)
    return {"data": data, "layout": layout}


# ---------------------------------------------------------------- page assembly


def _h2(key: str) -> str:
    return f"<h2 id='{key}'>{escape(dict(SECTIONS)[key])}</h2>"


def _mib_or_dash(v) -> str:
    return "–" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v / 2**20:,.1f}"


def _verdict_section(report: Report) -> list[str]:
    """Verdict sentence and the ranked recommendations (``report.recommendations``,
    a :class:`pardiag.analyzer.predict.recommend.RecommendationResult`, may be absent)."""
    out = [_h2("verdict")]
    rec = report.recommendations
    if rec is None:
        out.append(muted("No recommendations computed."))
        return out
    if getattr(rec, "verdict", ""):
        out.append(f"<p class='verdict'>{escape(rec.verdict)}</p>")
    path = report.critical_path.describe()
    if path:
        out.append(f"<p>{escape(path)}.</p>")
    recs = list(getattr(rec, "recommendations", ()) or ())
    if not recs:
        out.append(muted(rec.why_none or "No recommendations computed."))
    else:
        head = ("<tr><th>tier</th><th class='l'>recommendation</th><th class='l'>change</th>"
                "<th>step time (ms) measured → predicted</th><th>gain %</th>"
                "<th>peak memory (MiB) measured → predicted</th><th class='l'>evidence</th>"
                "<th class='l'>caveats</th><th class='l'>batch and optimizer</th></tr>")
        rows = []
        nu = getattr(rec, "noise_us", float("nan"))
        noise = f" ±{nu / 1000:,.3f}" if not math.isnan(nu) else ""   # the measured step's noise
        for r in recs:
            def bullets(items):
                return ("<ul>" + "".join(f"<li>{escape(x)}</li>" for x in items) + "</ul>"
                        if items else "–")
            mem = f"{_mib_or_dash(r.measured_peak_bytes)} → {_mib_or_dash(r.predicted_peak_bytes)}"
            if not r.fits_memory:
                mem += " (does not fit)"
            rows.append(
                f"<tr><td>{r.tier or '–'}</td><td class='l'><b>{escape(r.title)}</b></td>"
                f"<td class='l'>{escape(r.change)}</td>"
                f"<td>{r.measured_step_us / 1000:,.3f}{noise} → "
                f"{r.predicted_step_us / 1000:,.3f}</td>"
                f"<td>{r.gain_pct:,.1f}</td><td>{escape(mem)}</td>"
                f"<td class='l'>{bullets(r.evidence)}</td><td class='l'>{bullets(r.caveats)}</td>"
                f"<td class='l'>{escape(getattr(r, 'optimizer_effect', '') or '–')}</td></tr>")
        out.append(f"<table class='recs'><thead>{head}</thead>"
                   f"<tbody>{''.join(rows)}</tbody></table>")
        notes = ["Recommendations of one tier are predicted within noise of each other: a set, "
                 "not a ranking.", TIER_ORDER + "."]
        if getattr(rec, "noise_rule", ""):
            notes.append("Rule: " + rec.noise_rule + ".")
        if getattr(rec, "peak_definition", "") and any(
                r.measured_peak_bytes is not None for r in recs):
            notes.append("Measured peak memory: " + rec.peak_definition + ".")
        out.append(muted(" ".join(notes)))
    rejected = list(getattr(rec, "rejected", ()) or ())
    if rejected:   # every change evaluated appears once: recommended above, the rest here
        rows = []
        for r in rejected:
            pred = ("–" if math.isnan(r.predicted_step_us) else
                    f"{r.measured_step_us / 1000:,.3f} → {r.predicted_step_us / 1000:,.3f}"
                    + (f" ({r.predicted_low_us / 1000:,.3f}–{r.predicted_high_us / 1000:,.3f})"
                       if r.interval_known else ""))
            gain = "–" if math.isnan(r.predicted_step_us) else f"{r.gain_pct:,.1f}"
            rows.append(f"<tr><td class='l'>{escape(r.title)}</td>"
                        f"<td class='l'>{escape(r.change)}</td><td>{pred}</td><td>{gain}</td>"
                        f"<td class='l'>{escape(r.reason or '–')}</td>"
                        f"<td class='l'>{escape(r.settle or '–')}</td></tr>")
        out.append("<h3>Evaluated and not recommended</h3><table class='not-recommended'>"
                   "<thead><tr><th class='l'>change</th><th class='l'>concretely</th>"
                   "<th>step time (ms) measured → predicted (interval)</th><th>gain %</th>"
                   "<th class='l'>why not</th><th class='l'>what would settle it</th></tr>"
                   f"</thead><tbody>{''.join(rows)}</tbody></table>")
    return out


def _summary_section(report: Report) -> list[tuple[str, str]]:
    """(label, value) rows of the run summary: source, ranks, run metadata, headline numbers."""
    b, traces = report.breakdown, report.traces
    run = traces.run_info
    domains = sorted(set(b.totals["domain"]))
    summary = [
        ("source", traces.source),
        ("ranks", f"{len(traces.ranks)} ({', '.join(str(r) for r in traces.ranks)})"
         if len(traces.ranks) <= 16 else f"{len(traces.ranks)}"),
        ("timeline", ", ".join("GPU kernels" if d == "gpu" else "CPU events (no GPU kernels)"
                               for d in domains)),
    ]
    if run:
        summary += [("command", run.command or ""),
                    ("world size", run.world_size if run.world_size is not None else ""),
                    ("exit code", run.exit_code if run.exit_code is not None else "")]
        if run.torch_version:
            summary.append(("torch", run.torch_version))
        if run.started_unix is not None:   # run.json's started_unix (UTC)
            summary.append(("started", datetime.datetime.fromtimestamp(
                run.started_unix, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")))
        lay = run.layout or {}
        if isinstance(lay, dict) and lay:
            dims = ", ".join(f"{k.upper()}={v}" for k, v in (lay.get("dims") or {}).items())
            pipe = lay.get("pipeline")
            extra = (f"; {pipe.get('schedule')}, {pipe.get('stages')} stages, "
                     f"{pipe.get('microbatches')} microbatches" if isinstance(pipe, dict) else "")
            summary.append(("parallel layout",
                            f"{dims} ({', '.join(map(str, lay.get('strategies') or []))})" + extra))
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
    summary.append(("warnings", str(len(traces.warnings))))
    return summary


def _breakdown_section(report: Report, page: Page) -> list[str]:
    b = report.breakdown
    out = [_h2("breakdown")]
    if len(b.totals):
        out.append(page.fig(breakdown_figure(b.totals)))
        ms = in_ms(b.totals, ["span_us", "compute_only_us", "overlap_us", "exposed_comm_us",
                            "idle_us"])
        out.append(table(ms, {
            "rank": "rank", "domain": "timeline", "span_us": "span (ms)",
            "compute_only_us": "compute only (ms)", "overlap_us": "overlapped (ms)",
            "exposed_comm_us": "exposed comm (ms)", "idle_us": "idle (ms)",
            "overlap_pct": "overlap %"}, left=("domain",), digits=3, sortable=True, what="ranks"))
    else:
        out.append(muted("No timed events found in any trace."))
    out.append("<h3>Per profiler step</h3>")
    if len(b.steps):
        if len(b.steps) <= MAX_STEP_BARS:
            out.append(page.fig(step_breakdown_figure(b.steps)))
        else:
            n_r, n_s = b.steps["rank"].nunique(), b.steps["step"].nunique()
            out.append(page.sample(
                f"Per-step chart aggregated: {n_r} ranks × {n_s} steps ({len(b.steps)} bars) is "
                f"more than {MAX_STEP_BARS}, so the bars show the mean over ranks per step; the "
                "heatmaps below show every rank and step."))
            out.append(page.fig(step_mean_figure(b.steps)))
            out.append(page.fig(step_heatmap(b.steps, "exposed_comm_us",
                                             "Exposed communication per rank and step (ms)")))
            out.append(page.fig(step_heatmap(b.steps, "idle_us", "Idle per rank and step (ms)")))
    else:
        out.append(muted("No ProfilerStep#N annotations in the traces: per-step breakdown "
                          "unavailable."))
    return out


#: What an overlap chart whose bars are all 0% shows instead.
NO_OVERLAP = "No overlap: all communication exposed"


def _no_overlap(overlap_us: pd.Series) -> bool:
    """True when no rank overlaps any communication (every bar of the chart would be 0%)."""
    v = pd.to_numeric(overlap_us, errors="coerce").dropna()
    return len(v) > 0 and bool((v <= 0).all())


def _overlap_section(report: Report, page: Page) -> list[str]:
    b = report.breakdown
    out = [_h2("overlap")]
    if not b.totals["overlap_pct"].notna().any():
        out.append(muted("No communication found in any rank, so there is no overlap to "
                          "measure."))
        return out
    measured = b.totals.dropna(subset=["overlap_pct"])
    if _no_overlap(measured["overlap_us"]):
        # a chart of zero-height bars reads as a broken page: say what it would show
        out.append(muted(f"{NO_OVERLAP} (0% overlapped by computation on every one of "
                          f"{len(measured)} ranks; "
                          f"{fmt(measured['comm_us'].mean() / 1000.0, 3)} ms of communication "
                          "per rank, mean), so no chart is drawn."))
    else:
        out.append(page.fig(overlap_figure(b.totals)))
    out.append("<h3>Per parallel dimension</h3>")
    dov = report.dim_overlap
    if len(dov.per_rank) and set(dov.per_rank["dim"]) == {"all"}:
        # one row "all" is the per-rank chart again (matched collectives only): leave it out
        out.append(muted(
            "Overlap per dimension left out: the parallel dimensions are unknown (no pardiag "
            "metadata and no process-group configuration in the traces), so all matched "
            "communication is one dimension and the chart would repeat the per-rank chart "
            "above."))
    elif len(dov.per_rank):
        if report.layout.groups.empty:
            out.append(muted("The parallel dimensions are unknown (no pardiag metadata and no "
                              "process-group configuration in the traces): communication is "
                              "split by the process group the trace names instead."))
        if _no_overlap(dov.per_rank["overlap_us"]):
            dims = ", ".join(map(str, sorted(set(dov.per_rank["dim"]))))
            out.append(muted(f"{NO_OVERLAP} on every dimension ({dims}): 0% of each "
                              "dimension's communication overlapped by computation on every "
                              "rank, so no chart is drawn."))
        else:
            out.append(page.fig(dim_overlap_figure(dov.per_rank)))
        out.append(table(in_ms(dov.summary, ["comm_us", "exposed_us"]), {
            "dim": "dimension", "ranks": "ranks", "comm_us": "communication per rank (ms, mean)",
            "exposed_us": "exposed per rank (ms, mean)", "overlap_pct": "overlap %"},
            left=("dim",), digits=3, sortable=True, what="dimensions"))
        out.append(muted("Per dimension: the rank's matched collectives on that dimension's "
                          "groups against the same computation as above; collectives of two "
                          "dimensions in flight together count in both."))
    else:
        out.append(muted(f"Overlap per dimension unavailable: {dov.why_none}."))
    return out


def _stragglers_section(report: Report, page: Page) -> list[str]:
    sync = report.sync
    out = [_h2("stragglers")]
    if not len(sync.instances):
        out.append(muted("No collective was found on two or more ranks: synchronization across "
                          "ranks cannot be measured (a single rank, or no communication)."))
        return out
    n_complete = int(sync.instances["complete"].sum()) if "complete" in sync.instances else len(
        sync.instances)
    n_p2p = int(sync.instances["instance"].astype(str).str.startswith("p2p:").sum())
    n_coll = len(sync.instances) - n_p2p
    what = (f"{n_coll} collective instances" if not n_p2p else
            f"{n_p2p} point-to-point transfers (no collective)" if not n_coll else
            f"{len(sync.instances)} instances ({n_coll} collectives, {n_p2p} point-to-point "
            "transfers)")
    head = (f"<p>Matched {what} across ranks (by {escape(sync.matched_by)}; {n_complete} "
            "complete). ")
    if sync.straggler is not None:
        top = sync.stragglers.iloc[0]
        head += (f"The rank the others wait for most: <b>rank {int(top['rank'])}</b> "
                 f"({top['wait_caused_us'] / 1000:.3f} ms of others' waiting; last to arrive in "
                 f"{int(top['last_arrivals'])} instances).</p>")
    else:
        head += ("No rank makes the others wait beyond the noise (at least "
                 f"{STRAGGLER_MIN_WAIT_US:.0f} µs per step over complete instances, and more "
                 "than the step varies).</p>")
    out.append(head)
    rec = getattr(report, "recommendations", None)
    if sync.straggler is not None and rec is not None and rec.straggler != sync.straggler:
        pipe = report.pipeline
        why = (f"in a pipeline the waiting a stage causes is the schedule's bubble, so only a "
               f"rank that idles {STRAGGLER_IDLE_PCT_PIPELINE:g}% of the step longer than its "
               f"peers is one" if pipe is not None and (len(pipe.chunks) or pipe.schedule) else
               f"it asks more of one: it arrives last at {STRAGGLER_LAST_SHARE:.0%} or more of 3 "
               f"or more collectives and causes {STRAGGLER_RATIO:g}× the waiting it suffers; on "
               f"CPU traces it also idles {STRAGGLER_IDLE_PCT:g}% of the step longer than its "
               f"peers, since ranks that share a host's cores arrive last in turn")
        out.append(muted(f"The verdict does not call rank {int(sync.straggler)} a straggler: "
                         f"{why}."))
    for note in sync.notes:
        out.append(muted(note))
    out.append(table(in_ms(sync.stragglers, ["wait_suffered_us", "wait_caused_us"]), {
        "rank": "rank", "wait_caused_us": "wait caused (ms)",
        "wait_suffered_us": "wait suffered (ms)", "last_arrivals": "last arrivals",
        "steps_as_top": "steps as top straggler", "instances": "instances"}, digits=3,
        sortable=True, what="ranks (most wait caused first)"))
    if len(sync.instances) > HEATMAP_MAX_COLUMNS:
        out.append(page.sample(
            f"Straggler heatmap binned: {len(sync.instances)} instances are shown as "
            f"{HEATMAP_MAX_COLUMNS} columns of consecutive instances (largest wait and skew per "
            "column); the tables cover every instance."))
    out.append(page.fig(straggler_heatmap(sync.per_rank, sync.instances)))
    skew = sync.skew
    out.append(table(in_ms(skew, ["arrival_skew_us", "max_skew_us", "transfer_us"]), {
        "op": "collective", "count": "instances", "arrival_skew_us": "median arrival skew (ms)",
        "max_skew_us": "max arrival skew (ms)", "transfer_us": "median transfer (ms)"},
        left=("op",), digits=3, sortable=True))
    if len(sync.p2p):
        out.append("<p class='muted'>Point-to-point links (each send paired with its recv):</p>")
        out.append(table(in_ms(sync.p2p, ["hop_us", "recv_wait_us", "send_wait_us"]), {
            "src": "from rank", "dst": "to rank", "count": "transfers",
            "hop_us": "hop (ms, median)", "recv_wait_us": "receiver waits (ms, median)",
            "send_wait_us": "sender waits (ms, median)", "bytes": "bytes (median)"}, digits=3,
            sortable=True, what="links"))
    # Either the offsets or why there are none, never both: a table of zeros next to "could not
    # be aligned" contradicts itself (pipeline runs match only point-to-point transfers).
    if not len(sync.offsets) or (sync.offsets["instances"] == 0).all():
        hosts = set(sync.offsets["host"]) if len(sync.offsets) else set()
        one_host = (f" Every rank ran on one host ({next(iter(hosts))}), which has one clock."
                    if len(hosts) == 1 and None not in hosts else "")
        p2p_only = bool(sync.instances["instance"].astype(str).str.startswith("p2p:").all())
        out.append(muted(
            "No complete collective spans the ranks here"
            + (" (only point-to-point transfers were matched)" if p2p_only else "")
            + ", so no clock offsets were estimated: times are compared as recorded." + one_host))
        return out
    out.append("<p class='muted'>Clock offsets relative to the lowest rank (estimated from aligned "
               "ends of complete collectives; the offset is subtracted before comparing, the "
               "residual is not — ranks on one host share one clock):</p>")
    out.append(table(sync.offsets.drop(columns=["host"]), {
        "rank": "rank", "offset_us": "offset (µs)", "residual_us": "residual (µs)",
        "instances": "collectives used"}, digits=1, sortable=True, what="ranks"))
    return out


#: Colours and labels of the host and device parts (:mod:`pardiag.analyzer.analyses.causes`).
HOST_PART_COLORS = {"data_loading_us": ("data loading", "#F58518"),
                    "sync_us": ("synchronization", "#B279A2"),
                    "comm_us": ("communication calls and waits", "#E45756"),
                    "launch_us": ("kernel launches", "#72B7B2"),
                    "optimizer_us": ("optimizer", "#EECA3B"),
                    "backward_us": ("backward", "#54A24B"),
                    "forward_us": ("forward and other operators", "#4C78A8"),
                    "other_us": ("outside any operator", "#BAB0AC")}
DEVICE_PART_COLORS = {"dev_compute_us": ("computing", "#4C78A8"),
                      "dev_memory_us": ("copying", "#72B7B2"),
                      "wait_comm_us": ("communication", "#E45756"),
                      "wait_host_us": ("idle: waiting for the host", "#F58518"),
                      "wait_sync_us": ("idle: host synchronization", "#B279A2"),
                      "wait_other_us": ("idle: work queued", "#BAB0AC")}


def parts_figure(per_rank: pd.DataFrame, parts: dict, title: str) -> dict:
    """Stacked bar per rank of the median per step of each part (ms; ``parts``: column →
    (label, colour)). Returns a plotly figure dict."""
    return {"data": _stacked_bars(_ranks(per_rank["rank"].astype(int)), per_rank,
                                  [(label, col, color) for col, (label, color) in parts.items()],
                                  "%{x}: %{y:.3f} ms"),
            "layout": {"barmode": "stack", "title": _title(title),
                       "yaxis": {"title": _title("ms per step (median)")},
                       "xaxis": {"title": _title("rank")}, "height": 420}}


def _causes_section(report: Report, page: Page) -> list[str]:
    """Where each rank's step goes on the host and the device, the straggler's cause, the
    input- and host-bound findings (:mod:`pardiag.analyzer.analyses.causes`)."""
    out = [_h2("causes")]
    c = getattr(report, "causes", None)
    if c is None or c.per_rank.empty:
        out.append(muted("Needs profiler steps (ProfilerStep#N) in the traces."))
        return out
    rec = report.recommendations
    lines = []
    if c.host_bound is not None:
        hb = c.host_bound
        lines.append(f"Host-bound: the GPU computes {hb['busy_pct']:.1f}% of the step and idles "
                     f"waiting for the host {hb['wait_host_pct']:.1f}% (median over ranks).")
    if c.input_bound is not None:
        ib = c.input_bound
        lines.append("Input-bound: data loading takes " + ", ".join(
            f"{ib['share_pct'][r]:.0f}% of the step on rank {r} "
            f"({ib['data_loading_us'][r] / 1e3:.1f} ms)" for r in ib["ranks"])
            + (f"; without it the step would take about {ib['predicted_step_us'] / 1e3:.1f} ms "
               f"(now {ib['step_us'] / 1e3:.1f} ms)"
               if ib["predicted_step_us"] == ib["predicted_step_us"] else "") + ".")
    for r in tuple(getattr(rec, "recommendations", ())) + tuple(getattr(rec, "rejected", ())):
        if r.kind == "straggler":
            lines.append(f"{r.title}: " + "; ".join(r.evidence[1:3]) + f" — {r.change}.")
            break
    out += [f"<p>{escape(t)}</p>" for t in lines]
    pr = c.per_rank
    out.append(page.fig(parts_figure(pr, HOST_PART_COLORS,
                                     "Where the profiled step goes on the host, per rank")))
    out.append(muted("Profiled steps (the profiler slows them: the verdict's step may be measured "
                      "on the unprofiled ones). Each instant of a step's CPU window goes to the "
                      "first part that holds it: "
                      "data loading (the DataLoader iterator), device synchronization "
                      "(cuda*Synchronize, .item()), communication calls and their waits "
                      "(c10d::wait, wait_tensor; and, outside any operator, waiting while a "
                      "transfer is in flight), kernel launches, "
                      "optimizer, backward, other operators (forward, loss), and the rest: "
                      "outside any operator (Python, sleeps, host contention)."))
    gpu = pr[pr["dev_compute_us"].notna()]
    if len(gpu):
        out.append(page.fig(parts_figure(gpu, DEVICE_PART_COLORS,
                                         "Where the step goes on the device, per rank")))
        out.append(muted("Over the step's CPU window: compute kernels, copies, communication "
                          "kernels alone, and idle time classified by the kernel that ends it: "
                          "launched after the device fell idle (waiting for the host; during a "
                          "host synchronization shown apart) or queued earlier (a dependency)."))
    cols = {"rank": "rank", "steps": "steps", "span_us": "step (ms)",
            **{k: v[0] + " (ms)" for k, v in HOST_PART_COLORS.items()},
            "data_loading_pct": "data loading %"}
    if len(gpu):
        cols.update({k: "device " + v[0] + " (ms)" for k, v in DEVICE_PART_COLORS.items()})
        cols["dev_compute_pct"] = "device busy %"
    extra = {k: label for k, label in (("dtensor_us", "DTensor host work (ms)"),
                                       ("fsdp_us", "FSDP2 hooks (ms)"))
             if k in pr and (pd.to_numeric(pr[k], errors="coerce") > 0).any()}
    cols.update(extra)
    ms_cols = [k for k in cols if k.endswith("_us")]
    out.append(table(in_ms(pr, ms_cols), cols, digits=2, sortable=True, what="ranks"))
    if extra:
        out.append(muted("Beside the parts (they overlap them): DTensor host work is the host "
                          "time outside the optimizer in DTensor's redistributions (their "
                          "collectives and waits included) and its dispatch of operators on "
                          "DTensors — tensor parallelism's own host work; FSDP2 hooks is the host "
                          "time in FSDP2's hooks (FSDP::...), waits included. The DP × TP what-if "
                          "takes them away with their dimension."))
    return out


def _pipeline_section(report: Report, page: Page) -> list[str]:
    pipe = report.pipeline
    out = [_h2("pipeline")]
    if not len(pipe.bubbles):
        out.append(muted("No pipeline parallelism detected (no schedule records and no "
                          "point-to-point traffic)."))
        return out
    b = pipe.bubbles
    sch = pipe.schedule or {}
    inferred = sch.get("source")
    method = "estimated from idle and exposed point-to-point time (no schedule records)" \
        if (b["method"] == "estimate").all() else (
            "measured from the trace's per-microbatch ranges (no schedule records)" if inferred
            else "measured from the schedule records")
    if inferred:
        method += f"; schedule {inferred}" + (
            ", microbatches estimated from the sends per step" if sch.get(
                "microbatches_estimated") else "")
    ideal = b["ideal_pct"].iloc[0]
    out.append(f"<p>{escape(method)}; schedule {escape(sch.get('schedule'))}, "
               f"p = {escape(sch.get('p'))} ranks, m = {escape(sch.get('m'))} microbatches, "
               f"v = {escape(sch.get('v'))}; ideal bubble {fmt(float(ideal))}% of the step.</p>")
    summ = summarize_bubbles(b)
    out.append(table(in_ms(summ, ["warmup_us", "steady_us", "cooldown_us", "window_us"]), {
        "rank": "rank", "stages": "stages", "steps": "steps", "basis": "steps used",
        "window_us": "step window (ms)", "bubble_pct": "bubble % (median)",
        "ideal_pct": "ideal %", "warmup_us": "warmup (ms)", "steady_us": "steady (ms)",
        "cooldown_us": "cooldown (ms)"}, left=("stages", "basis"), digits=3, sortable=True,
        what="ranks"))
    if len(pipe.chunks):
        clean = sorted(b.loc[b["clean"], "step"].unique())
        pool = clean or sorted(b["step"].unique())
        step = int(pool[len(pool) // 2])
        chunks = pipe.chunks
        rows = chunks[["rank", "stage"]].drop_duplicates().sort_values(["rank", "stage"])
        if len(rows) > GANTT_MAX_ROWS:
            keep = rows.head(GANTT_MAX_ROWS)
            chunks = chunks.merge(keep, on=["rank", "stage"])
            out.append(page.sample(f"Pipeline Gantt sampled: the first {GANTT_MAX_ROWS} of "
                                   f"{len(rows)} (rank, stage) rows are drawn."))
        out.append(page.fig(pipeline_gantt(chunks, step)))
        n_steps = chunks["step"].nunique()
        which = "an unprofiled step, like the table" if clean else "no unprofiled step was recorded"
        out.append(page.sample(
            f"Pipeline Gantt shows one step of {n_steps}: step {step} ({which}). "
            "Table columns are medians over steps each, so the phases need not add up to the "
            "bubble."))
    else:
        out.append(muted("No Gantt chart: without schedule records (pardiag profile records "
                          "them) the chunks of each stage are unknown."))
    return out


#: Steps of the critical path drawn on the page (the latest ones; the tables hold every step).
PATH_STEPS_DRAWN = 20


def critical_path_figure(segments: pd.DataFrame, steps: list[int] | None = None) -> dict:
    """The critical path of ``steps`` (default: every step in ``segments``) on the ranks'
    timeline: a bar per segment on its rank's row (ms from the first drawn step's path start,
    on the aligned clock, so consecutive steps follow each other), work in the colour of
    computation, transfers in communication's, a dotted line at each join where the path moves
    from one rank to the rank that arrived last, and a faint line where each step's path
    starts. Returns a plotly figure dict."""
    steps = sorted(set(segments["step"])) if steps is None else sorted(steps)
    seg = segments[segments["step"].isin(steps)].sort_values(["step", "start_us"],
                                                              kind="stable")
    t0 = float(seg["start_us"].min()) if len(seg) else 0.0
    data = []
    for kind, color in (("work", PART_COLORS["compute only"]),
                        ("communication", PART_COLORS["exposed comm"])):
        g = seg[seg["kind"] == kind]
        if g.empty:
            continue
        text = [f"step {int(st)}: " + (
                f"{o} ({d})" if kind == "communication" else
                f"compute {c / 1000:.2f} ms, " + (f"data loading {dl / 1000:.2f} ms, "
                                                  if dl > 0 else "")
                + f"other {x / 1000:.2f} ms")
                for st, o, d, c, dl, x in zip(g["step"], g["op"], g["dim"], g["compute_us"],
                                              g["data_loading_us"], g["other_us"])]
        data.append(_bar(y=[f"rank {int(r)}" for r in g["rank"]],
                         x=(g["dur_us"] / 1000).tolist(),
                         base=((g["start_us"] - t0) / 1000).tolist(), orientation="h", name=kind,
                         marker={"color": color}, hovertext=text, hoverinfo="text+x"))
    # the joins: where the path leaves a rank for the one that arrived last (within a step);
    # with several steps, a faint line where each step's path starts
    xs, ys, shapes, notes = [], [], [], []
    for st, g in seg.groupby("step", sort=True):
        rows = list(g.itertuples(index=False))
        for prev, nxt in zip(rows, rows[1:]):
            if int(prev.rank) != int(nxt.rank):
                x = (float(nxt.start_us) - t0) / 1000
                xs += [x, x, None]
                ys += [f"rank {int(prev.rank)}", f"rank {int(nxt.rank)}", None]
        if len(steps) > 1:
            # the line plotly's add_vline would draw
            x = (float(g["start_us"].min()) - t0) / 1000
            shapes.append({"type": "line", "xref": "x", "yref": "y domain", "x0": x, "x1": x,
                           "y0": 0, "y1": 1, "line": {"color": "#BBBBBB", "width": 1}})
            notes.append({"x": x, "xref": "x", "y": 1, "yref": "y domain", "showarrow": False,
                          "text": f"step {st}", "xanchor": "left", "yanchor": "top",
                          "font": {"size": 10}})
    if xs:
        data.append(_scatter(x=xs, y=ys, mode="lines", name="waits for (join)",
                             line={"color": "#333333", "width": 1, "dash": "dot"},
                             hoverinfo="skip"))
    which = (f"Step {steps[0]}" if len(steps) == 1 else
             f"Steps {steps[0]}–{steps[-1]}" if steps else "No step")
    return {"data": data,
            "layout": {"title": _title(f"{which}: the critical path across ranks"),
                       "barmode": "overlay",
                       "xaxis": {"title": _title("ms from the path's start (aligned clock)")},
                       "height": 180 + 30 * seg["rank"].nunique(),
                       "yaxis": {"categoryorder": "category descending"}, "shapes": shapes,
                       "annotations": notes}}


def _critical_path_section(report: Report, page: Page) -> list[str]:
    cp = report.critical_path
    out = [_h2("critical_path")]
    if cp.steps.empty or cp.segments.empty:
        out.append(muted(f"No critical path: {cp.why_none or 'no step has a path'}."))
        return out
    out.append(f"<p>{escape(cp.describe())}.</p>")
    steps = cp.steps
    drawn = sorted(set(cp.segments["step"]))[-PATH_STEPS_DRAWN:]
    out.append(page.fig(critical_path_figure(cp.segments, drawn)))
    if len(drawn) < len(steps):
        out.append(muted(f"The figure draws the latest {len(drawn)} of {len(steps)} steps; "
                         f"the tables below hold every step."))
    out.append(table(in_ms(cp.shares, ["us"]), {
        "part": "part", "rank": "rank", "dim": "dimension", "us": "on the path (ms, all steps)",
        "share_pct": "share %"}, left=("part", "dim"), digits=3, sortable=True, what="parts"))
    out.append(table(in_ms(steps, ["measured_us", "path_us", "replay_us"]), {
        "step": "step", "measured_us": "step (ms)", "path_us": "path (ms)",
        "replay_us": "replayed (ms)", "replay_error_pct": "replay error %",
        "joins": "communication joins"}, digits=3, sortable=True, what="steps"))
    out.append(table(in_ms(cp.slack, ["slack_us"]), {
        "rank": "rank", "steps": "steps", "slack_us": "slack (ms, median)",
        "on_path_steps": "steps on the path"}, digits=3, sortable=True, what="ranks"))
    out.append(muted("The path walks back from the step's last end: a rank's work since the "
                     "last communication it waited for, that communication from its last "
                     "arrival, the last-arriving rank's work before it, and so on. Slack: how "
                     "much later a rank could have arrived without moving the step's end. The "
                     "replay recomputes each step from the same graph; unchanged it must match "
                     "the step (a check of the graph). 'Other' work is host time, launches, "
                     "idle and communication the rank did not wait for."))
    for note in cp.notes:
        out.append(muted(note))
    return out


def _imbalance_section(report: Report) -> list[str]:
    bal = report.balance
    out = [_h2("imbalance")]
    if len(bal.summary):
        out.append(table(in_ms(bal.summary, ["cost_us"]), {
            "dim": "dimension", "pg": "group", "imbalance": "compute max/mean",
            "cost_us": "cost per step (ms)", "slowest_rank": "slowest rank"},
            left=("dim", "pg"), digits=3, sortable=True, what="groups"))
        out.append(muted("Cost = max − mean compute of the group's ranks: how much shorter each "
                          "step would be if every rank matched the mean."))
    else:
        out.append(muted("Imbalance needs two or more ranks with profiler steps."))
    skew = getattr(bal, "skew", None)
    if skew is not None and len(skew):
        out.append(table(in_ms(skew, ["start_late_us", "delay_us", "top_delay_us"]), {
            "rank": "rank", "steps": "steps", "start_late_us": "starts the step late by (ms)",
            "delay_us": "arrives late, per step (ms)", "top_collective": "mostly at",
            "top_delay_us": "there, per step (ms)", "top_share_pct": "share %"},
            left=("top_collective",), digits=3, sortable=True, what="ranks"))
        out.append(muted("Where the arrival skew arises: how long after the earliest rank each "
                          "rank starts a step (median, clocks aligned), and the collective that "
                          "holds most of its arrival delay. A delay at the step's first "
                          "collective that equals the late start lies before the step (data "
                          "loading, the previous step's tail), not in its compute."))
    return out


def _routing_section(report: Report, page: Page) -> list[str]:
    r = report.routing
    out = [_h2("routing")]
    if r.groups.empty:
        out.append(muted("No routed all-to-all: no all-to-all whose split sizes differ across "
                          "ranks (MoE routing shows in expert-parallel runs' dispatch and "
                          "combine)." + (" " + " ".join(r.notes) if r.notes else "")))
        return out
    text = r.describe()
    out.append(f"<p>{escape(text)}.</p>" if text else muted(
        "Tokens are routed about evenly: no group's median max/mean reaches "
        f"{IMBALANCE_MIN:g}."))
    out.append(page.fig(routing_figure(r)))
    out.append(table(in_ms(r.groups, ["wait_us", "saving_us", "saving_q1_us", "saving_q3_us"]), {
        "group": "group", "dim": "dimension", "ranks": "ranks", "steps": "steps",
        "unit": "unit", "imbalance": "max/mean (median)", "imbalance_min": "min",
        "imbalance_max": "max", "hot_rank": "hot rank", "hot_steps": "hot in steps",
        "hot_rows": "hot rank per step", "mean_rows": "mean per step",
        "wait_us": "others wait per step (ms)", "saving_us": "saving per step (ms)",
        "saving_q1_us": "saving Q1 (ms)", "saving_q3_us": "saving Q3 (ms)"},
        left=("group", "dim", "unit"), digits=3, sortable=True, what="groups"))
    out.append(table(in_ms(r.per_rank, ["waited_us"]), {
        "group": "group", "step": "step", "rank": "rank", "sent_rows": "sent",
        "recv_rows": "received", "load_rows": "expert side", "waited_us": "waited (ms)"},
        left=("group",), digits=3, sortable=True, what="rows"))
    out.append(muted(
        "Rows of the all-to-alls' split sizes (dim 0 of the buffer: a token per row of a "
        "tokens × hidden buffer), summed per rank and step over the routed all-to-alls (a token "
        "counts once per all-to-all it crosses: dispatch, combine and their backward). The expert "
        "side is the direction whose max/mean is larger (received for a dispatch, sent for a "
        "combine). Others wait = their waiting at the all-to-alls the hot rank arrived last "
        "at (clocks aligned); saving = that / ranks, the step's predicted saving if every rank "
        "held the mean load and expert time were linear in tokens."))
    for n in r.notes:
        out.append(muted(n))
    return out


def _memory_section(report: Report, page: Page) -> list[str]:
    mem = report.memory
    out = [_h2("memory")]
    m = mem.per_rank
    if not m[["static_bytes", "peak_allocated_bytes", "peak_bytes"]].notna().any().any():
        out.append(muted("No memory information: the traces have no memory events and no "
                          "pardiag metadata (profile with pardiag for static memory)."))
        return out
    if m["static_bytes"].notna().any():
        out.append(page.fig(memory_figure(m)))
    else:
        out.append(muted("No static memory by component: it comes from pardiag's metadata "
                          "(profile with pardiag); peaks below are from the trace."))
    out.append(table(in_mib(m, ["params_bytes", "grads_bytes", "optimizer_state_bytes",
                               "static_bytes", "peak_bytes", "peak_allocated_bytes",
                               "peak_rss_bytes"]), {
        "rank": "rank", "params_bytes": "parameters (MiB)", "grads_bytes": "gradients (MiB)",
        "optimizer_state_bytes": "optimizer state (MiB)", "static_bytes": "static (MiB)",
        "peak_bytes": "peak (MiB)",
        "peak_allocated_bytes": "allocator's peak in traced window (MiB)",
        "peak_rss_bytes": "peak RSS (MiB)"}, digits=2, sortable=True, what="ranks"))
    out.append(muted(f"Peak: {mem.peak_definition}; the same peak the recommendations and "
                     f"pardiag compare state."))
    imb = mem.imbalance
    out.append(muted(f"Imbalance across ranks (max/mean): static {fmt(imb.get('static'), 3)}, "
                      f"peak {fmt(imb.get('peak'), 3)}."))
    tl = mem.timeline
    if len(tl):
        ranks = tl["rank"].unique()
        if len(ranks) > TIMELINE_MAX_RANKS:
            peaks = tl.groupby("rank")["allocated_bytes"].max().sort_values(ascending=False)
            keep = sorted(peaks.index[:TIMELINE_MAX_RANKS])
            tl = tl[tl["rank"].isin(keep)]
            out.append(page.sample(
                f"Memory timeline sampled: the {TIMELINE_MAX_RANKS} ranks of {len(ranks)} with "
                f"the highest peak are drawn ({', '.join(map(str, keep))})."))
        per = max(100, TIMELINE_POINTS // max(1, tl["rank"].nunique()))
        if tl.groupby("rank").size().max() > per:
            out.append(page.sample(f"Memory timeline thinned to at most {per} evenly spaced "
                                   "points per rank."))
        out.append(page.fig(memory_timeline(tl, per)))
    else:
        out.append(muted("No memory timeline: the traces have no [memory] events (profile "
                          "with profile_memory=True; pardiag profile does)."))
    return out


def _inferred_layout(lay) -> list[str]:
    """What an inferred layout rests on and what it leaves out (traces recorded without
    pardiag)."""
    out = [muted(f"Layout {lay.source}: pardiag did not record this run, so the dimensions, "
                  f"strategies and pipeline above are read from what the traces show.")]
    pipe = lay.pipeline
    if pipe:
        out.append(f"<p>Pipeline ({escape(lay.source)}): schedule "
                   f"<b>{escape(pipe.get('schedule'))}</b>, {escape(pipe.get('stages'))} stages, "
                   f"{escape(pipe.get('microbatches'))} microbatches"
                   f"{' (estimated)' if pipe.get('microbatches_from') == 'sends' else ''}, "
                   f"{escape(pipe.get('stages_per_rank'))} stage(s) per rank.</p>")
    if lay.evidence:
        out.append("<p>Inferred from:</p><ul>"
                   + "".join(f"<li>{escape(x)}</li>" for x in lay.evidence) + "</ul>")
    if lay.not_inferred:
        out.append("<p>Not inferred, or only estimated:</p><ul>"
                   + "".join(f"<li>{escape(x)}</li>" for x in lay.not_inferred) + "</ul>")
    return out


def _layout_section(report: Report) -> list[str]:
    lay, sync = report.layout, report.sync
    out = [_h2("layout")]
    if lay.dims or len(lay.groups):
        dims = ", ".join(f"{str(k).upper()} = {v}" for k, v in lay.dims.items()) or "unknown"
        out.append(f"<p>Dimensions: <b>{escape(dims)}</b>; strategies: "
                   f"{escape(', '.join(map(str, lay.strategies)) or 'unknown')}; nodes: "
                   f"{escape(', '.join(f'{h}: {v}' for h, v in lay.nodes.items()) or 'unknown')}"
                   ".</p>")
    if lay.source != "recorded":
        out += _inferred_layout(lay)
    if lay.dims or len(lay.groups):
        g = lay.groups.assign(ranks=lay.groups["ranks"].map(
            lambda rs: str(rs) if len(rs) <= 32 else f"{len(rs)} ranks: {rs[:8]}…"))
        if len(sync.instances):
            bw = sync.instances.dropna(subset=["busbw_gbps"]).groupby(
                sync.instances["pg"].astype(str))["busbw_gbps"].agg(["median", "max", "size"])
            g = g.assign(busbw_median=g["pg"].astype(str).map(bw["median"]),
                         busbw_max=g["pg"].astype(str).map(bw["max"]),
                         busbw_n=g["pg"].astype(str).map(bw["size"]))
        else:
            g = g.assign(busbw_median=np.nan, busbw_max=np.nan, busbw_n=np.nan)
        g = g.rename(columns={"busbw_n": "count"})
        out.append(table(g, {
            "pg": "group", "desc": "description", "dim": "dimension", "size": "size",
            "ranks": "ranks", "nodes": "nodes", "spans_nodes": "spans nodes",
            "busbw_median": "busbw median (GB/s)", "busbw_max": "busbw max (GB/s)",
            "count": "collectives measured"},
            left=("pg", "desc", "dim", "ranks"), digits=3, sortable=True, what="groups"))
        out.append(muted("busbw per group: medians over its matched collectives of every size "
                          "(the Bandwidth section splits them by operation and size)."))
    else:
        out.append(muted("No layout information in these traces (no pardiag metadata and no "
                          "process-group configuration)."))
    if lay.nodes:
        out.append(table(pd.DataFrame({"host": list(lay.nodes),
                                        "ranks": [str(v) for v in lay.nodes.values()]}),
                          {"host": "node", "ranks": "ranks"}, left=("host", "ranks")))
    else:
        out.append(muted("Nodes unknown: the traces do not say which host ran each rank "
                          "(pardiag metadata does)."))
    return out


def _bandwidth_section(report: Report, page: Page) -> list[str]:
    sync = report.sync
    out = [_h2("bandwidth")]
    if not len(sync.instances):
        out.append(muted("No collective was matched across ranks (a single rank, or no "
                          "communication), so no bandwidth can be measured."))
        return out
    if not len(sync.bandwidth):
        out.append(muted("No message sizes found for the matched collectives, so no "
                          "bandwidth."))
        return out
    inst = sync.instances.dropna(subset=["busbw_gbps"])
    if len(inst) > BANDWIDTH_MAX_POINTS:
        keep = inst.groupby("op", group_keys=False).apply(
            lambda g: g.iloc[:: -(-len(g) * len(inst) // BANDWIDTH_MAX_POINTS // len(g))]
            if len(g) else g)
        out.append(page.sample(f"Bandwidth scatter sampled: {len(keep)} of {len(inst)} instances "
                               "(evenly spaced per collective); the table covers all."))
        inst = keep
    out.append(page.fig(bandwidth_figure(inst)))
    out.append(table(in_ms(sync.bandwidth, ["transfer_us"]), {
        "pg": "group", "op": "collective", "bytes": "bytes", "inter_node": "intra/inter node",
        "count": "count", "transfer_us": "transfer (ms)", "algbw_gbps": "algbw (GB/s)",
        "busbw_gbps": "busbw (GB/s)"}, left=("pg", "op", "inter_node"), digits=3, sortable=True,
        what="(group, collective, size) rows"))
    out.append(muted("algbw = bytes / transfer time (the minimum duration over the ranks); "
                      "busbw = algbw × 2(n−1)/n for all_reduce, (n−1)/n for all_gather, "
                      "reduce_scatter and all_to_all, 1 otherwise (nccl-tests)."))
    return out


def _collectives_section(report: Report) -> list[str]:
    b, sync = report.breakdown, report.sync
    out = [_h2("collectives")]
    if not len(b.collectives):
        out.append(muted("No communication events found in any trace."))
        return out
    agg = b.collective_totals  # the same table as the terminal's and the JSON's
    out.append("<h3>By type (all ranks)</h3>")
    out.append(table(in_ms(agg, ["time_us", "exposed_us"]), {
        "collective": "collective", "ranks": "ranks", "count": "count",
        "time_us": "time, sum over ranks (ms)", "exposed_us": "exposed, sum over ranks (ms)",
        "exposed_pct": "exposed %"}, left=("collective",), digits=3, sortable=True,
        what="types"))
    out.append("<h3>By rank and type</h3>")
    per = b.collectives.sort_values(["exposed_us", "rank"], ascending=[False, True])
    out.append(table(in_ms(per, ["time_us", "exposed_us"]), {
        "rank": "rank", "collective": "collective", "count": "count",
        "time_us": "time (ms)", "exposed_us": "exposed (ms)"}, left=("collective",), digits=3,
        sortable=True, what="rows (most exposed first)"))
    out.append("<h3>Matched instances</h3>")
    if len(sync.instances):
        inst = sync.instances.sort_values("arrival_skew_us", ascending=False)
        out.append(table(in_ms(inst, ["arrival_skew_us", "transfer_us"]), {
            "instance": "instance", "pg": "group", "op": "collective", "step": "step",
            "ranks": "ranks", "bytes": "bytes", "arrival_skew_us": "arrival skew (ms)",
            "transfer_us": "transfer (ms)", "last_rank": "last to arrive",
            "busbw_gbps": "busbw (GB/s)"}, left=("instance", "pg", "op"), digits=3,
            sortable=True, what="instances (largest arrival skew first)"))
    else:
        out.append(muted("No collective instance was matched across ranks."))
    out.append(muted("Click a column heading to sort."))
    return out


#: Most per-rank notes listed (every warning is always listed).
MAX_NOTES = 200


def _warnings_section(report: Report) -> list[str]:
    traces = report.traces
    out = [_h2("warnings")]
    warnings = list(traces.warnings)
    notes = [n for t in traces.ranks.values() for n in t.notes]
    if warnings or notes:
        out.append("<ul>" + "".join(f"<li class='warn'>{escape(w)}</li>" for w in warnings)
                   + "".join(f"<li class='muted'>{escape(n)}</li>" for n in notes[:MAX_NOTES])
                   + "</ul>")
        out.append(shown(min(len(notes), MAX_NOTES), len(notes), "notes (every warning is listed)"))
    else:
        out.append(muted("None."))
    return out


def _hta_section(report: Report) -> list[str]:
    """``report --hta``: HTA's idle time breakdown per stream and its kernel launch statistics
    per rank (:class:`pardiag.analyzer.analyses.hta_extras.HtaExtras`), and a line per HTA
    failure."""
    h = report.hta
    if h is None:
        return []
    out = [f"<h2 id='{HTA_SECTION[0]}'>{escape(HTA_SECTION[1])}</h2>", muted(
        f"Holistic Trace Analysis {h.hta_version or ''} on each rank's trace, on HTA's window "
        f"(events launched before the last profiler step; whole µs). Idle time of a stream = "
        f"the gaps between its kernels: host wait (launched after the previous kernel ended), "
        f"kernel wait (gap < {h.consecutive_kernel_delay_us:g} µs), other.")]
    if len(h.idle):
        out.append(table(in_ms(h.idle, ["idle_us"]), {
            "rank": "rank", "stream": "stream", "category": "idle category",
            "idle_us": "idle (ms)", "idle_pct": "share of the stream's idle (%)"},
            left=("category",), digits=3, sortable=True, what="rows"))
    if len(h.launches):
        out.append(table(h.launches, {
            "rank": "rank", "launches": "launches", "cpu_us_median": "runtime call median (µs)",
            "gpu_us_median": "GPU event median (µs)",
            "launch_delay_us_median": "launch delay median (µs)",
            "launch_delay_us_p95": "launch delay p95 (µs)",
            "launch_delay_us_max": "launch delay max (µs)",
            "runtime_outliers": f"runtime calls > {h.runtime_cutoff_us:g} µs",
            "delay_outliers": f"delays > {h.launch_delay_cutoff_us:g} µs",
            "gpu_shorter": "GPU event shorter than its launch"},
            sortable=True, what="ranks"))
    out += [f"<p class='warn'>{escape(m)}</p>" for m in h.messages]
    if not len(h.idle) and not len(h.launches) and not h.messages:
        out.append(muted("HTA found nothing to analyze."))
    return out


def render_html(report: Report, *, include_plotlyjs: bool | str = True) -> str:
    """The whole report page as a string (UTF-8 text, one self-contained HTML document).

    Args:
        report: the analyses to show; ``report.recommendations`` is optional.
        include_plotlyjs: True inlines plotly.js (gzip + base64, works offline); ``"cdn"``
            links it from the plotly CDN instead (a page of a few hundred kB).
    """
    page = Page()
    body: list[str] = []
    body += _verdict_section(report)
    summary = _summary_section(report)
    body += _breakdown_section(report, page)
    body += _overlap_section(report, page)
    body += _stragglers_section(report, page)
    body += _critical_path_section(report, page)
    body += _causes_section(report, page)
    body += _pipeline_section(report, page)
    body += _imbalance_section(report)
    body += _routing_section(report, page)
    body += _memory_section(report, page)
    body += _layout_section(report)
    body += _bandwidth_section(report, page)
    body += _collectives_section(report)
    body += _hta_section(report)
    body += _warnings_section(report)
    # The run summary sits second but lists what later sections sampled, so it is built last.
    reductions = ("<p class='muted'>Reduced to keep the page small:</p><ul>"
                  + "".join(f"<li class='muted'>{escape(s)}</li>" for s in page.sampled) + "</ul>"
                  if page.sampled else "<p class='muted'>Nothing on this page is sampled or "
                  "aggregated beyond what each section says.</p>")
    summary_html = [_h2("summary"), "<table class='kv'>" + "".join(
        f"<tr><th class='l'>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in summary)
        + "</table>", reductions]
    n_verdict = next(i for i, p in enumerate(body) if p.startswith("<h2 id='breakdown'"))
    body = body[:n_verdict] + summary_html + body[n_verdict:]

    toc = SECTIONS[:-1] + ((HTA_SECTION,) if report.hta is not None else ()) + SECTIONS[-1:]
    source = report.traces.source
    return document(f"pardiag report: {Path(str(source)).name}", "pardiag report", str(source),
                    toc, "".join(body), include_plotlyjs)
