"""The report page's figures: each a plotly figure as a dict built from an analysis result
(:mod:`pardiag.analyzer.render.sections` places them on the page; ``pardiag.Report.figures``
shows them in a notebook).

Each figure is a plotly figure as a dict (``{"data": [...], "layout": {...}}``, the form
plotly.js reads and ``plotly.graph_objects.Figure(spec)`` accepts), written in the shape
plotly's own validation would give it: a report needs none of the figure objects' checking
and copying, which cost more than the analyses of a small run. ``tests/test_report_html.py``
passes every figure through ``plotly.graph_objects.Figure`` and asserts that nothing changes.

Every string from a trace goes into a figure escaped (plotly renders a subset of HTML in
labels, :func:`_pe`). A figure computes nothing about the run: its values are the analyses'
(µs shown in ms, bytes in MiB); what it does itself is lay them out, and reduce what it draws
on large runs (the straggler heatmap's bins, the memory timeline's points).
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd

from ..analyses.breakdown import has_memory_copies
from .page import PART_COLORS, escape

_PART_COLUMNS = {"compute only": "compute_only_us", "overlapped": "overlap_us",
                 "exposed comm": "exposed_comm_us", "memory copies": "memory_only_us",
                 "idle": "idle_us"}

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


def _parts(rows: pd.DataFrame) -> list:
    """The breakdown parts to stack for ``rows``: memory copies only where some row has them
    (a GPU trace's memcpy/memset; never on CPU traces)."""
    copies = has_memory_copies(rows)
    return [p for p in _BREAKDOWN_PARTS if copies or p[1] != "memory_only_us"]


def breakdown_figure(totals: pd.DataFrame) -> dict:
    """Stacked bar per rank: compute only, overlapped, exposed communication, memory copies
    only (where a rank has them), idle (ms).
    Returns a plotly figure dict (``data``, ``layout``)."""
    return {"data": _stacked_bars(_ranks(totals["rank"]), totals, _parts(totals),
                                  "%{x}: %{y:.3f} ms"),
            "layout": {"barmode": "stack", "title": _title("Time breakdown per rank (whole trace)"),
                       "yaxis": {"title": _title("time (ms)")},
                       "xaxis": {"title": _title("rank")}, "height": 420}}


def step_breakdown_figure(steps: pd.DataFrame) -> dict:
    """Stacked bar per rank and profiler step (ms). Returns a plotly figure dict."""
    x = [f"r{r} s{s}" for r, s in zip(steps["rank"], steps["step"])]
    return {"data": _stacked_bars(x, steps, _parts(steps), "%{x}: %{y:.3f} ms"),
            "layout": {"barmode": "stack",
                       "title": _title("Time breakdown per rank and profiler step"),
                       "yaxis": {"title": _title("time (ms)")},
                       "xaxis": {"title": _title("rank r, step s")}, "height": 420}}


#: Above this many ranks the run's step chart draws the median over ranks and their range, not
#: a line per rank.
RUN_STEPS_MAX_LINES = 16


def run_steps_figure(run_steps: pd.DataFrame) -> dict:
    """Step time over every step of the run (ms), one line per rank — or, above
    :data:`RUN_STEPS_MAX_LINES` ranks, the median over ranks with the min–max band — and the
    profiled steps shaded, from
    :attr:`pardiag.analyzer.analyses.breakdown.TimeBreakdown.run_steps` (µs). Returns a plotly
    figure dict."""
    data: list = []
    ranks = sorted(run_steps["rank"].unique())
    if len(ranks) <= RUN_STEPS_MAX_LINES:
        for r in ranks:
            g = run_steps[run_steps["rank"] == r]
            data.append(_scatter(name=f"rank {r}", x=g["step"].tolist(),
                                 y=_f32(g["period_us"] / 1000.0), mode="lines+markers",
                                 marker={"size": 4},
                                 hovertemplate="step %{x}: %{y:.3f} ms<extra>rank " + str(r)
                                 + "</extra>"))
    else:
        by = run_steps.groupby("step")["period_us"]
        steps = by.median().index.tolist()
        for name, values, fill in (("max over ranks", by.max(), None),
                                   ("min over ranks", by.min(), "tonexty"),
                                   ("median over ranks", by.median(), None)):
            data.append(_scatter(name=name, x=steps, y=_f32(values / 1000.0), mode="lines",
                                 fill=fill, line={"width": 1 if fill or "max" in name else 2},
                                 hovertemplate="step %{x}: %{y:.3f} ms<extra>" + name
                                 + "</extra>"))
    on = run_steps.loc[run_steps["profiled"], "step"]
    shapes = ([{"type": "rect", "xref": "x", "yref": "paper", "x0": float(on.min()) - 0.5,
                "x1": float(on.max()) + 0.5, "y0": 0, "y1": 1, "fillcolor": "#f0a020",
                "opacity": 0.15, "line": {"width": 0}}] if len(on) else [])
    yaxis: dict = {"title": _title("step time (ms)"), "rangemode": "tozero"}
    annotations = []
    off = off_scale_steps(run_steps)
    if len(off):   # e.g. the step that exports the trace: drawn, the axis ends below it
        rest = run_steps.loc[~run_steps["step"].isin(off.index), "period_us"]
        yaxis["range"] = [0.0, float(rest.max()) / 1000.0 * 1.25]
        listed = [f"step {s} ({v / 1000.0:,.1f} ms)" for s, v in off.head(4).items()]
        more = f" and {len(off) - 4} more" if len(off) > 4 else ""
        annotations.append({"xref": "paper", "yref": "paper", "x": 1.0, "y": 1.0,
                            "xanchor": "right", "yanchor": "bottom", "showarrow": False,
                            "text": "off the scale: " + ", ".join(listed) + more,
                            "font": {"size": 11}})
    return {"data": data,
            "layout": {"title": _title("Step time over every step of the run (profiled steps "
                                       "shaded)"),
                       "xaxis": {"title": _title("optimizer step")},
                       "yaxis": yaxis, "shapes": shapes, "annotations": annotations,
                       "height": 360}}


#: A step of the run's chart longer than this many times the median step (over every rank
#: and step) is left off its scale, so that one slow step (the one that exports the trace, a
#: checkpoint) does not flatten the others.
OFF_SCALE_X = 3.0


def off_scale_steps(run_steps: pd.DataFrame) -> pd.Series:
    """The steps of :func:`run_steps_figure` drawn off its scale: those whose longest period
    over ranks exceeds :data:`OFF_SCALE_X` × the median period of every rank and step, when
    at least one step stays on it. Returns their longest period (µs) indexed by step, in step
    order; empty when none."""
    if run_steps.empty:
        return pd.Series(dtype=float)
    longest = run_steps.groupby("step")["period_us"].max()
    big = longest[longest > OFF_SCALE_X * float(run_steps["period_us"].median())]
    return big if len(big) < len(longest) else pd.Series(dtype=float)


def step_mean_figure(step_means: pd.DataFrame) -> dict:
    """Stacked bar per profiler step of the mean over ranks of each part (ms), from
    :attr:`pardiag.analyzer.analyses.breakdown.TimeBreakdown.step_means` (µs). Returns a plotly
    figure dict."""
    return {"data": _stacked_bars([f"step {s}" for s in step_means["step"]], step_means,
                                  _parts(step_means), "%{x}: %{y:.3f} ms (mean over ranks)"),
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


#: Below this largest overlap (%) the overlap charts' axis ends near the largest bar instead
#: of at 100%: a pipeline's 1% on a 0–100 axis draws as a flat line.
PCT_AXIS_FULL = 25.0


def pct_axis(values) -> list[float]:
    """The y range of an overlap chart (%): ``[0, 100]`` when a value exceeds
    :data:`PCT_AXIS_FULL`, else ``[0, 1.25 × the largest]`` rounded up to a whole % (at least
    1), so that small overlaps show as bars; each bar also carries its value."""
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    top = float(v.max()) if len(v) else 0.0
    return [0, 100] if top > PCT_AXIS_FULL else [0, max(1.0, float(np.ceil(top * 1.25)))]


def overlap_figure(totals: pd.DataFrame) -> dict:
    """Bar per rank: overlap % = |compute ∩ comm| / |comm|, each labelled with its value; the
    axis ends at 100% or near the largest bar (:func:`pct_axis`). Returns a plotly figure
    dict."""
    t = totals.dropna(subset=["overlap_pct"])
    return {"data": [_bar(x=_ranks(t["rank"]), y=_f32(t["overlap_pct"]),
                          marker={"color": PART_COLORS["overlapped"]},
                          text=[f"{x:.1f}%" for x in t["overlap_pct"]], textposition="outside",
                          hovertemplate="%{x}: %{y:.2f} %<extra></extra>")],
            "layout": {"title": _title("Communication overlapped by computation"),
                       "yaxis": {"title": _title("overlap (%)"),
                                 "range": pct_axis(t["overlap_pct"])},
                       "xaxis": {"title": _title("rank")}, "height": 360}}


def dim_overlap_figure(per_rank: pd.DataFrame) -> dict:
    """Grouped bars per rank, one series per parallel dimension: overlap % of that dimension's
    communication, each labelled; the axis as :func:`pct_axis`. Returns a plotly figure
    dict."""
    data = [_bar(name=_pe(dim), x=_ranks(g["rank"]), y=_f32(g["overlap_pct"]),
                 text=[f"{x:.1f}%" for x in g["overlap_pct"]], textposition="outside",
                 customdata=_f32(g["exposed_us"] / 1000.0),
                 hovertemplate="%{x}: %{y:.2f} % overlapped, %{customdata:.3f} ms exposed"
                               "<extra>" + _pe(dim) + "</extra>")
            for dim, g in per_rank.groupby("dim", sort=True)]
    return {"data": data,
            "layout": {"barmode": "group",
                       "title": _title("Overlap per rank and parallel dimension"),
                       "xaxis": {"title": _title("rank")},
                       "yaxis": {"title": _title("overlap (% of the dimension's communication)"),
                                 "range": pct_axis(per_rank["overlap_pct"])},
                       "height": 380}}


#: Most columns of the straggler heatmap; above it consecutive instances are binned (max wait).
HEATMAP_MAX_COLUMNS = 200
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


def pipeline_gantt(chunks: pd.DataFrame, gaps: pd.DataFrame, step: int | None) -> dict:
    """Forward/backward chunks of one step per rank and stage (ms from the step's first
    forward), with each rank's bubbles shaded red on each of its rows. ``chunks`` and ``gaps``:
    :attr:`pardiag.analyzer.analyses.pipeline.PipelineResult.chunks` and ``.gaps`` (aligned
    clock, µs). Returns a plotly figure dict."""
    c = chunks[chunks["step"] == step].copy()
    t0 = c["start_us"].min()
    c["row"] = [f"rank {r} · stage {s}" for r, s in zip(c["rank"], c["stage"])]
    g = gaps[gaps["step"] == step]
    bx, bb, by = [], [], []
    for (rank, row), _ in c.groupby(["rank", "row"], sort=True):
        mine = g[g["rank"] == rank]
        for a, b in zip(mine["start_us"], mine["end_us"]):
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
    (:class:`pardiag.analyzer.analyses.routing.RoutingResult`): left, each rank's expert-side rows
    per step (median over steps, ``rank_load``, bars) with the group's mean (``mean_rows`` of
    ``groups``: the median over steps of the mean over ranks, line); right, when split sizes are
    known, the rows of each source rank's tokens each destination's experts take per all-to-all
    (mean, heatmap). Returns a plotly figure dict (the heatmap on ``x2``/``y2``)."""
    grp = routing.groups["group"].iloc[0]
    unit = "tokens" if routing.groups["unit"].iloc[0] == "rows" else "elements"
    load = routing.rank_load[routing.rank_load["group"] == grp]
    mean = float(routing.groups["mean_rows"].iloc[0])
    m = routing.matrix[routing.matrix["group"] == grp]
    x = _ranks(load["rank"])
    data = [_bar(x=x, y=_f32(load["load_rows"].to_numpy()), name="rank",
                 marker={"color": "#4C78A8"},
                 hovertemplate="%{x}: %{y:,.0f} " + unit + " per step<extra></extra>",
                 xaxis="x", yaxis="y"),
            _scatter(x=x, y=[mean] * len(x), mode="lines", name="mean",
                     line={"color": "#E45756", "dash": "dash"},
                     hovertemplate="mean %{y:,.0f}<extra></extra>", xaxis="x", yaxis="y")]
    # one plot, or two side by side with 0.18 of the width between them
    right = 1.0 if not len(m) else (1.0 - 0.18) / 2
    layout: dict[str, Any] = {
        "xaxis": {"anchor": "y", "domain": [0.0, right], "title": _title("rank"),
                  "type": "category"},
        "yaxis": {"anchor": "x", "domain": [0.0, 1.0], "title": _title(f"{unit} per step")},
        "annotations": [_subplot_title(f"{unit} per rank and step (expert side)", right / 2)]}
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
    what = "MoE routing" if routing.groups["expert"].iloc[0] else "All-to-all split sizes"
    layout.update(title=_title(f"{what}, group {_pe(str(grp).split('|')[0] or '?')}"),
                  height=400, showlegend=False)
    return {"data": data, "layout": layout}



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



#: Colours of the op classes in the roofline.
CLASS_COLORS = {"matmul": "#4C78A8", "attention": "#F58518", "convolution": "#54A24B",
                "norm": "#B279A2", "softmax": "#E45756", "elementwise": "#9D755D"}


def roofline_points(per_class: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``per_class`` the roofline can place: a positive rate and intensity (an op
    class whose time is 0, e.g. ops that launched no kernel, has none)."""
    pts = per_class.dropna(subset=["achieved_tflops", "intensity"])
    return pts[(pts["achieved_tflops"] > 0) & (pts["intensity"] > 0)]


#: Modules the roofline places (the longest by time); the JSON holds them all.
ROOFLINE_MODULES = 20


def roofline_figure(per_class: pd.DataFrame, per_module: pd.DataFrame | None = None) -> dict:
    """The roofline (Williams, Waterman and Patterson, CACM 2009): each op class and dtype of
    :attr:`pardiag.analyzer.analyses.efficiency.EfficiencyResult.per_class` at its arithmetic
    intensity (FLOP/byte, x, log) and achieved TFLOP/s (y, log), marker area by its time; the
    :data:`ROOFLINE_MODULES` longest modules of ``per_module`` (its rows with a module) as
    open diamonds, hidden until their legend entry is clicked; the peak (flat line) and, where
    the memory bandwidth is known, the bandwidth roof (``bandwidth × intensity``) up to the
    ridge. Returns a plotly figure dict."""
    pts = roofline_points(per_class)
    t = pts["time_us"].to_numpy(float)
    size = 8 + 22 * np.sqrt(t / t.max()) if len(t) and t.max() > 0 else np.full(len(t), 10.0)
    data = []
    for (cls, dtype), g in pts.groupby(["op_class", "dtype"], sort=False):
        idx = [pts.index.get_loc(i) for i in g.index]
        data.append(_scatter(
            x=_f32(g["intensity"]), y=_f32(g["achieved_tflops"]), mode="markers",
            name=escape(f"{cls} ({dtype})"),
            marker={"size": _f32(size[idx]), "color": CLASS_COLORS.get(cls, "#888888")},
            hovertemplate=(escape(f"{cls} ({dtype})") + ": %{y:,.3f} TFLOP/s at %{x:,.2f} "
                           "FLOP/byte<extra></extra>")))
    mods = (roofline_points(per_module[per_module["module"].notna()]).head(ROOFLINE_MODULES)
            if per_module is not None and len(per_module) else None)
    if mods is not None and len(mods):
        data.append(_scatter(
            x=_f32(mods["intensity"]), y=_f32(mods["achieved_tflops"]), mode="markers",
            name=f"modules (the {len(mods)} longest)", visible="legendonly",
            marker={"size": 9, "symbol": "diamond-open", "color": "#333333"},
            text=[escape(f"{m} ({c})") for m, c in zip(mods["module"], mods["module_class"])],
            hovertemplate="%{text}: %{y:,.3f} TFLOP/s at %{x:,.2f} FLOP/byte<extra></extra>"))
        pts = pd.concat([pts, mods])
    xs = pts["intensity"].to_numpy(float)
    lo, hi = (float(xs.min()) / 4, float(xs.max()) * 4) if len(xs) else (0.01, 1000.0)
    peak = per_class["peak_tflops"].dropna()
    bw = per_class["bandwidth_gbps"].dropna()
    if len(peak):
        p = float(peak.iloc[0])
        start = lo
        if len(bw):
            b = float(bw.iloc[0]) / 1e3   # TB/s: TFLOP/s per FLOP/byte
            ridge = p / b
            hi = max(hi, ridge * 4)
            data.append(_scatter(x=[lo, ridge], y=[b * lo, p], mode="lines", name="bandwidth",
                                 line={"color": "#BAB0AC", "dash": "dash"},
                                 hovertemplate=f"memory bandwidth {b * 1e3:,.0f} GB/s"
                                               "<extra></extra>"))
            start = ridge
        data.append(_scatter(x=[start, hi], y=[p, p], mode="lines", name="peak",
                             line={"color": "#BAB0AC"},
                             hovertemplate=f"peak {p:,.3f} TFLOP/s<extra></extra>"))
    return {"data": data, "layout": {
        "title": _title("Roofline: achieved TFLOP/s per op class"),
        "xaxis": {"type": "log", "title": _title("arithmetic intensity (FLOP/byte)")},
        "yaxis": {"type": "log", "title": _title("achieved TFLOP/s")},
        "height": 420}}
