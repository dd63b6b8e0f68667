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
from pardiag.analyzer.pipeline import summarize_bubbles
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
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}" if abs(v) >= 100_000 else str(v)
    return _e(v)


_INT_COLUMNS = {"rank", "last_rank", "slowest_rank", "count", "instances", "steps",
                "last_arrivals", "steps_as_top", "size", "nodes", "ranks", "bytes", "step"}


def _table(df: pd.DataFrame, columns: dict[str, str], left: tuple[str, ...] = (),
           digits: int = 1) -> str:
    """HTML table of ``df``; ``columns`` maps column → header. Values escaped."""
    df = df.copy()
    for c in columns:  # counts and ranks that pandas turned into floats print as integers
        if c in _INT_COLUMNS and pd.api.types.is_float_dtype(df[c]) and df[c].dropna().apply(
                float.is_integer).all():
            df[c] = df[c].astype("Int64")
    head = "".join(f'<th class="{"l" if c in left else ""}">{_e(h)}</th>' for c, h in columns.items())
    rows = []
    # column-wise values keep each column's type (iterrows would turn ints into floats)
    for values in zip(*(df[c].astype(object).where(df[c].notna(), None).tolist() for c in columns)):
        cells = "".join(f'<td class="{"l" if c in left else ""}">'
                        f'{_fmt(v, 2 if c.endswith("_pct") else digits)}</td>'
                        for c, v in zip(columns, values))
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


def _ms(df: pd.DataFrame, cols) -> pd.DataFrame:
    out = df.copy()
    for c in cols:
        out[c] = pd.to_numeric(out[c], errors="coerce") / 1000.0
    return out


def _mib(df: pd.DataFrame, cols) -> pd.DataFrame:
    out = df.copy()
    for c in cols:
        out[c] = pd.to_numeric(out[c], errors="coerce") / 2**20
    return out


def _muted(text: str) -> str:
    return f"<p class='muted'>{_e(text)}</p>"


#: Most instances shown in the straggler heatmap (the rest are summarised in the tables).
HEATMAP_MAX_INSTANCES = 400


def straggler_heatmap(per_rank: pd.DataFrame, instances: pd.DataFrame) -> go.Figure:
    """Heatmap rank × collective instance (in time order) of the wait each rank spent (ms)."""
    inst = instances.head(HEATMAP_MAX_INSTANCES)
    order = {k: i for i, k in enumerate(inst["instance"])}
    sub = per_rank[per_rank["instance"].isin(order)]
    z = sub.pivot_table(index="rank", columns="instance", values="wait_us", aggfunc="first")
    z = z.reindex(columns=list(inst["instance"]))
    labels = [f"#{i} {op}" for i, op in enumerate(inst["op"])]
    fig = go.Figure(go.Heatmap(z=z.to_numpy() / 1000.0, x=labels, y=[f"rank {r}" for r in z.index],
                               colorscale="Reds", colorbar_title="wait ms",
                               hovertemplate="%{y}, %{x}: %{z:.3f} ms<extra></extra>"))
    fig.update_layout(title="Wait per rank and collective instance (ms)",
                      height=max(320, 160 + 28 * len(z)),
                      xaxis_title="collective instance (time order)")
    return fig


def pipeline_gantt(chunks: pd.DataFrame, step: int) -> go.Figure:
    """Forward/backward chunks of one step per rank and stage; gaps are the bubbles."""
    c = chunks[chunks["step"] == step].copy()
    t0 = c["start_us"].min()
    fig = go.Figure()
    colors = {"F": "#4C78A8", "B": "#F58518", "I": "#F58518", "W": "#72B7B2"}
    for phase, grp in c.groupby("phase"):
        fig.add_bar(
            name={"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weight)"}
            .get(phase, phase), orientation="h", base=(grp["start_us"] - t0) / 1000.0,
            x=(grp["end_us"] - grp["start_us"]) / 1000.0,
            y=[f"rank {r} · stage {s}" for r, s in zip(grp["rank"], grp["stage"])],
            text=[f"{phase}{m}" for m in grp["microbatch"]], textposition="inside",
            marker_color=colors.get(phase, "#999"),
            hovertemplate="%{y}: %{text} %{base:.2f}–%{x:.2f} ms<extra></extra>")
    fig.update_layout(barmode="overlay", title=f"Pipeline schedule of step {step} (gaps are bubbles)",
                      xaxis_title="ms from the step's first forward", plot_bgcolor="#f3f3f3",
                      height=180 + 40 * c[["rank", "stage"]].drop_duplicates().shape[0],
                      yaxis={"autorange": "reversed"})
    return fig


def memory_figure(per_rank: pd.DataFrame) -> go.Figure:
    """Static memory per rank by component, with the peak allocated as a marker (MiB)."""
    fig = go.Figure()
    x = [f"rank {r}" for r in per_rank["rank"]]
    for col, name, color in (("params_bytes", "parameters", "#4C78A8"),
                             ("grads_bytes", "gradients", "#72B7B2"),
                             ("optimizer_state_bytes", "optimizer state", "#F58518")):
        fig.add_bar(name=name, x=x, y=per_rank[col] / 2**20, marker_color=color)
    fig.add_scatter(name="peak allocated (trace window)", x=x,
                    y=per_rank["peak_allocated_bytes"] / 2**20, mode="markers",
                    marker={"symbol": "diamond", "size": 12, "color": "#222"})
    fig.update_layout(barmode="stack", title="Memory per rank (MiB)", yaxis_title="MiB",
                      legend_orientation="h", height=400)
    return fig


#: Points per rank kept in the memory timeline chart (evenly sampled).
TIMELINE_POINTS = 1500


def memory_timeline(timeline: pd.DataFrame) -> go.Figure:
    """Allocated bytes over time per rank from the trace's memory events (MiB)."""
    fig = go.Figure()
    for rank, t in timeline.groupby("rank"):
        t = t.sort_values("ts_us")
        if len(t) > TIMELINE_POINTS:
            t = t.iloc[:: max(1, len(t) // TIMELINE_POINTS)]
        fig.add_scatter(name=f"rank {rank}", x=(t["ts_us"] - t["ts_us"].min()) / 1000.0,
                        y=t["allocated_bytes"] / 2**20, mode="lines", line_shape="hv")
    fig.update_layout(title="Allocated memory over the traced window (MiB)", height=360,
                      xaxis_title="ms from the rank's first memory event", yaxis_title="MiB")
    return fig


def bandwidth_figure(instances: pd.DataFrame) -> go.Figure:
    """busbw of every collective instance against its message size."""
    d = instances.dropna(subset=["busbw_gbps"])
    fig = go.Figure()
    for op, g in d.groupby("op"):
        fig.add_scatter(name=op, x=g["bytes"], y=g["busbw_gbps"], mode="markers",
                        hovertemplate=op + ": %{x} B, %{y:.3f} GB/s<extra></extra>")
    fig.update_layout(title="Bus bandwidth by message size", xaxis_type="log",
                      xaxis_title="bytes", yaxis_title="busbw (GB/s)", height=360)
    return fig


def _parallel_sections(report: Report, add) -> list[str]:
    """Stragglers, pipeline, imbalance, memory, layout and bandwidth sections."""
    r = report.results
    sync, pipe, bal, mem, lay = r["sync"], r["pipeline"], r["balance"], r["memory"], r["layout"]
    out = ["<h2>Stragglers and synchronization</h2>"]
    if len(sync.instances):
        top = sync.stragglers.iloc[0]
        out.append(f"<p>Matched {len(sync.instances)} collective instances across ranks "
                   f"(by {_e(sync.matched_by)}). The rank the others wait for most: "
                   f"<b>rank {int(top['rank'])}</b> ({top['wait_caused_us'] / 1000:.3f} ms of "
                   f"others' waiting; last to arrive in {int(top['last_arrivals'])} instances).</p>")
        out.append(_table(_ms(sync.stragglers, ["wait_suffered_us", "wait_caused_us"]), {
            "rank": "rank", "wait_caused_us": "wait caused (ms)",
            "wait_suffered_us": "wait suffered (ms)", "last_arrivals": "last arrivals",
            "steps_as_top": "steps as top straggler", "instances": "instances"}, digits=3))
        out.append(add(straggler_heatmap(sync.per_rank, sync.instances)))
        if len(sync.instances) > HEATMAP_MAX_INSTANCES:
            out.append(_muted(f"The heatmap shows the first {HEATMAP_MAX_INSTANCES} of "
                              f"{len(sync.instances)} instances; the tables cover all."))
        skew = (sync.instances.groupby("op", as_index=False)
                .agg(count=("instance", "size"), arrival_skew_us=("arrival_skew_us", "median"),
                     transfer_us=("transfer_us", "median")))
        out.append(_table(_ms(skew, ["arrival_skew_us", "transfer_us"]), {
            "op": "collective", "count": "instances", "arrival_skew_us": "median arrival skew (ms)",
            "transfer_us": "median transfer (ms)"}, left=("op",), digits=3))
        if (sync.offsets["instances"] == 0).all():
            out.append(_muted("No collective spans all ranks here, so clocks could not be "
                              "aligned: times are compared as recorded (same host: one clock)."))
        out.append("<p class='muted'>Clock offsets (estimated from aligned collective ends, "
                   "subtracted before comparing):</p>")
        out.append(_table(sync.offsets, {"rank": "rank", "offset_us": "offset (µs)",
                                         "instances": "collectives used"}, digits=1))
    else:
        out.append(_muted("No collective was found on two or more ranks: synchronization across "
                          "ranks cannot be measured (a single rank, or no communication)."))

    out.append("<h2>Pipeline bubbles</h2>")
    if len(pipe.bubbles):
        b = pipe.bubbles
        method = "estimated from idle and exposed point-to-point time (no schedule records)" \
            if (b["method"] == "estimate").all() else "measured from the schedule records"
        sch = pipe.schedule or {}
        out.append(f"<p>{_e(method)}; schedule {_e(sch.get('schedule'))}, p = {_e(sch.get('p'))} "
                   f"ranks, m = {_e(sch.get('m'))} microbatches, v = {_e(sch.get('v'))}; ideal "
                   f"bubble {b['ideal_pct'].iloc[0]:.1f}% of the step.</p>")
        summ = summarize_bubbles(b)
        out.append(_table(_ms(summ, ["warmup_us", "steady_us", "cooldown_us", "window_us"]), {
            "rank": "rank", "stages": "stages", "steps": "steps", "basis": "steps used",
            "window_us": "step window (ms)", "bubble_pct": "bubble % (median)",
            "ideal_pct": "ideal %", "warmup_us": "warmup (ms)", "steady_us": "steady (ms)",
            "cooldown_us": "cooldown (ms)"}, left=("stages", "basis"), digits=3))
        if len(pipe.chunks):
            clean = sorted(b.loc[b["clean"], "step"].unique())
            pool = clean or sorted(b["step"].unique())
            step = int(pool[len(pool) // 2])
            out.append(add(pipeline_gantt(pipe.chunks, step)))
            out.append(_muted(f"Step {step} is shown ({'an unprofiled step, like the table' if clean else 'no unprofiled step was recorded'}). "
                              "Table columns are medians over steps each, so the phases need "
                              "not add up to the bubble."))
    else:
        out.append(_muted("No pipeline parallelism detected (no schedule records and no "
                          "point-to-point traffic)."))

    out.append("<h2>Load imbalance</h2>")
    if len(bal.summary):
        out.append(_table(_ms(bal.summary, ["cost_us"]), {
            "dim": "dimension", "pg": "group", "imbalance": "compute max/mean",
            "cost_us": "cost per step (ms)", "slowest_rank": "slowest rank"},
            left=("dim", "pg"), digits=3))
        out.append(_muted("Cost = max − mean compute of the group's ranks: how much shorter each "
                          "step would be if every rank matched the mean."))
    else:
        out.append(_muted("Imbalance needs two or more ranks with profiler steps."))

    out.append("<h2>Memory</h2>")
    m = mem.per_rank
    if m[["static_bytes", "peak_allocated_bytes"]].notna().any().any():
        if m["static_bytes"].notna().any():
            out.append(add(memory_figure(m)))
        out.append(_table(_mib(m, ["params_bytes", "grads_bytes", "optimizer_state_bytes",
                                   "static_bytes", "peak_allocated_bytes", "peak_rss_bytes"]), {
            "rank": "rank", "params_bytes": "parameters (MiB)", "grads_bytes": "gradients (MiB)",
            "optimizer_state_bytes": "optimizer state (MiB)", "static_bytes": "static (MiB)",
            "peak_allocated_bytes": "peak allocated in traced window (MiB)",
            "peak_rss_bytes": "peak RSS (MiB)"},
            digits=2))
        imb = mem.imbalance
        out.append(_muted(f"Imbalance across ranks (max/mean): static "
                          f"{imb['static']:.3f}, peak {imb['peak']:.3f}."))
        if len(mem.timeline):
            out.append(add(memory_timeline(mem.timeline)))
    else:
        out.append(_muted("No memory information: the traces have no memory events and no "
                          "pardiag metadata (profile with pardiag for static memory)."))

    out.append("<h2>Parallel layout</h2>")
    if lay.dims or len(lay.groups):
        dims = ", ".join(f"{k.upper()} = {v}" for k, v in lay.dims.items()) or "unknown"
        out.append(f"<p>Dimensions: <b>{_e(dims)}</b>; strategies: "
                   f"{_e(', '.join(lay.strategies) or 'unknown')}; nodes: "
                   f"{_e(', '.join(f'{h}: {v}' for h, v in lay.nodes.items()) or 'unknown')}.</p>")
        out.append(_table(lay.groups.assign(ranks=lay.groups["ranks"].map(str)), {
            "pg": "group", "desc": "description", "dim": "dimension", "size": "size",
            "ranks": "ranks", "nodes": "nodes", "spans_nodes": "spans nodes"},
            left=("pg", "desc", "dim", "ranks"), digits=0))
    else:
        out.append(_muted("No layout information in these traces (no pardiag metadata and no "
                          "process-group configuration)."))

    out.append("<h2>Bandwidth</h2>")
    if len(sync.bandwidth):
        out.append(add(bandwidth_figure(sync.instances)))
        out.append(_table(_ms(sync.bandwidth, ["transfer_us"]), {
            "pg": "group", "op": "collective", "bytes": "bytes", "inter_node": "intra/inter node",
            "count": "count",
            "transfer_us": "transfer (ms)", "algbw_gbps": "algbw (GB/s)",
            "busbw_gbps": "busbw (GB/s)"}, left=("pg", "op", "inter_node"), digits=3))
        out.append(_muted("algbw = bytes / transfer time (the minimum duration over the ranks); "
                          "busbw = algbw × 2(n−1)/n for all_reduce, (n−1)/n for all_gather, "
                          "reduce_scatter and all_to_all, 1 otherwise (nccl-tests)."))
    else:
        out.append(_muted("No message sizes found for matched collectives."))
    return out


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

    parts.extend(_parallel_sections(report, add))

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
