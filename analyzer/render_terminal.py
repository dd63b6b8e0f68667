"""Terminal summary of a report (rich tables)."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pardiag.analyzer.pipeline import summarize_bubbles
from pardiag.analyzer.registry import Report


def _n(v: float, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:,.{digits}f}"


#: Recommendations listed in the terminal (the HTML report and the JSON list all).
TOP_RECOMMENDATIONS = 5


def _mib(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v / 2**20:,.1f}"


def render_recommendations(report: Report, console: Console) -> None:
    """Print the verdict and the top recommendations (``report.results["recommendations"]``, a
    :class:`pardiag.analyzer.recommend.RecommendationResult`; a line saying so when absent).

    Trace strings are printed as text (``markup=False``; tables cells as :class:`rich.text.Text`).
    """
    rec = report.results.get("recommendations")
    if rec is None:
        console.print("Verdict: no recommendations computed.", markup=False, highlight=False)
        return
    console.print(Text("Verdict: ", style="bold") + Text(rec.verdict or "–"))
    recs = list(rec.recommendations or ())
    if not recs:
        console.print(Text(f"No recommendations: {rec.why_none or 'none computed'}."))
        return
    t = Table(title=f"Top recommendations ({min(len(recs), TOP_RECOMMENDATIONS)} of {len(recs)})",
              title_justify="left", caption="step time and peak memory: measured → predicted",
              caption_justify="left")
    for col in ("#", "recommendation", "change", "step ms", "gain %", "peak MiB"):
        # the change is what the user types: wrapped, even inside a long word, never cut
        t.add_column(col, justify="right" if col in ("#", "gain %") else "left",
                     overflow="fold" if col == "change" else "ellipsis")
    for i, r in enumerate(recs[:TOP_RECOMMENDATIONS], 1):
        mem = f"{_mib(r.measured_peak_bytes)} → {_mib(r.predicted_peak_bytes)}"
        t.add_row(str(i), Text(r.title), Text(r.change),
                  f"{r.measured_step_us / 1e3:,.3f} → {r.predicted_step_us / 1e3:,.3f}",
                  f"{r.gain_pct:,.1f}", mem + ("" if r.fits_memory else " (does not fit)"))
    console.print(t)


def render_terminal(report: Report, console: Console) -> None:
    """Print the verdict and top recommendations first, then the per-rank breakdown, the
    collectives table and the parallel analyses to ``console``."""
    render_recommendations(report, console)
    b = report.breakdown
    t = Table(title=Text(f"Time breakdown per rank (ms) — {report.traces.source}"), title_justify="left",
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
            c.add_row(Text(str(r.collective)), str(r.ranks), str(r.count), _n(r.time_us / 1e3, 3),
                      _n(r.exposed_us / 1e3, 3))
        console.print(c)
    _parallel(report, console)
    _hta(report, console)


def _hta(report: Report, console: Console) -> None:
    """``report --hta``: idle time per rank and category, launch delays, HTA's failures."""
    h = report.results.get("hta")
    if h is None:
        return
    if len(h.idle):
        idle = h.idle.pivot_table(index="rank", columns="category", values="idle_us",
                                  aggfunc="sum", fill_value=0.0)
        t = Table(title="HTA: GPU idle time per rank (ms, all streams)", title_justify="left")
        for col in ("rank", "host wait", "kernel wait", "other"):
            t.add_column(col, justify="right")
        for rank, row in idle.iterrows():
            t.add_row(str(rank), *(_n(row.get(c, 0.0) / 1e3, 3)
                                   for c in ("host_wait", "kernel_wait", "other")))
        console.print(t)
    if len(h.launches):
        t = Table(title="HTA: kernel launches", title_justify="left")
        for col in ("rank", "launches", "delay median µs", "delay p95 µs",
                    f"delays > {h.launch_delay_cutoff_us:g} µs"):
            t.add_column(col, justify="right")
        for row in h.launches.itertuples():
            t.add_row(str(row.rank), str(row.launches), _n(row.launch_delay_us_median),
                      _n(row.launch_delay_us_p95), str(row.delay_outliers))
        console.print(t)
    for m in h.messages:
        console.print(Text(f"note: {m}"))


def _parallel(report: Report, console: Console) -> None:
    r = report.results
    sync, pipe, bal, mem, lay = r["sync"], r["pipeline"], r["balance"], r["memory"], r["layout"]
    inferred = lay.source != "recorded"
    if lay.dims:
        dims = ", ".join(f"{k.upper()}={v}" for k, v in lay.dims.items())
        est = " (estimated)" if inferred and lay.pipeline and lay.pipeline.get(
            "microbatches_from") == "sends" else ""
        console.print(Text(f"Layout{f' ({lay.source})' if inferred else ''}: {dims} "
                           f"({', '.join(map(str, lay.strategies))})"
                      + (f"; {lay.pipeline.get('schedule')}, {lay.pipeline.get('stages')} stages, "
                         f"{lay.pipeline.get('microbatches')} microbatches{est}"
                         if lay.pipeline else "")))
    if inferred and lay.not_inferred:
        console.print(Text("Not inferred from the traces:"))
        for line in lay.not_inferred:
            console.print(Text(f"  - {line}"))
    if len(sync.instances):
        t = Table(title=f"Stragglers ({len(sync.instances)} collective instances matched by "
                        f"{sync.matched_by})", title_justify="left")
        for col in ("rank", "wait caused ms", "wait suffered ms", "last arrivals", "top in steps"):
            t.add_column(col, justify="right")
        for row in sync.stragglers.head(8).itertuples():
            t.add_row(str(row.rank), _n(row.wait_caused_us / 1e3, 3),
                      _n(row.wait_suffered_us / 1e3, 3), str(row.last_arrivals),
                      str(row.steps_as_top))
        console.print(t)
        for note in sync.notes:
            console.print(Text(f"note: {note}"))
        for row in sync.p2p.head(8).itertuples():
            console.print(Text(f"point-to-point {row.src} → {row.dst}: {row.count} transfers, hop "
                               f"{row.hop_us / 1e3:.3f} ms (median), receiver waits "
                               f"{row.recv_wait_us / 1e3:.3f} ms, sender waits "
                               f"{row.send_wait_us / 1e3:.3f} ms"))
    if len(pipe.bubbles):
        summ = summarize_bubbles(pipe.bubbles)
        src = (pipe.schedule or {}).get("source")
        t = Table(title="Pipeline bubbles (" + ("estimate" if (pipe.bubbles["method"] == "estimate")
                                                 .all() else "measured") + (
            f"; schedule {src}" if src else "") + ")", title_justify="left")
        for col in ("rank", "stages", "steps", "bubble % (median)", "ideal %", "warmup ms",
                    "steady ms", "cooldown ms"):
            t.add_column(col, justify="right")
        for row in summ.itertuples():
            t.add_row(str(row.rank), Text(str(row.stages)), f"{row.steps} {row.basis}", _n(row.bubble_pct, 1),
                      _n(row.ideal_pct, 1), _n(row.warmup_us / 1e3, 3), _n(row.steady_us / 1e3, 3),
                      _n(row.cooldown_us / 1e3, 3))
        console.print(t)
    if len(bal.summary):
        t = Table(title="Load imbalance (compute per step)", title_justify="left")
        for col in ("dimension", "group", "max/mean", "cost ms/step", "slowest rank"):
            t.add_column(col, justify="right")
        for row in bal.summary.itertuples():
            t.add_row(Text(str(row.dim)), Text(str(row.pg)), _n(row.imbalance, 3), _n(row.cost_us / 1e3, 3),
                      str(row.slowest_rank))
        console.print(t)
    m = mem.per_rank
    if m["static_bytes"].notna().any():
        t = Table(title="Memory per rank (MiB)", title_justify="left")
        for col in ("rank", "params", "grads", "optimizer", "static",
                    "peak alloc. (traced window)", "peak RSS"):
            t.add_column(col, justify="right")
        for row in m.itertuples():
            t.add_row(str(row.rank), *(_n(v / 2**20, 2) for v in (
                row.params_bytes, row.grads_bytes, row.optimizer_state_bytes, row.static_bytes,
                row.peak_allocated_bytes, row.peak_rss_bytes)))
        console.print(t)
