"""Terminal summary of a report (rich tables).

Every table fits the console (``COLUMNS=80`` included) without cutting a header or a number:
:func:`print_table` gives each column the width of its longest header word and its longest cell
(numbers never wrap; headers and prose wrap at spaces, trace names anywhere), and when that is
still too wide it leaves out the least important columns and says which in the caption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
from rich.cells import cell_len
from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from ..analyses.breakdown import has_memory_copies
from ..analyses.layout import dims_text
from ..predict.recommend.policy import TIER_ORDER
from ..report.registry import Report


def _n(v: float, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:,.{digits}f}"


def _g(v) -> str:
    """A rate or share with three significant digits (``989``, ``6.75``, ``0.0273``)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:,.3g}" if abs(v) < 1e6 else f"{v:,.3e}"


def _i(v) -> str:
    """A count as the HTML report prints it (``1,234``); ranks and steps stay bare."""
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{int(v):,}"


#: Recommendations listed in the terminal (the HTML report and the JSON list all).
TOP_RECOMMENDATIONS = 5


def _mib(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v / 2**20:,.1f}"


@dataclass(frozen=True)
class Col:
    """One column of a terminal table."""

    header: str
    """Heading; wraps at spaces, never cut."""
    justify: JustifyMethod = "right"
    """``"left"`` or ``"right"``."""
    drop: int = 0
    """0: always shown; otherwise, when the table is wider than the console, columns are left
    out highest ``drop`` first until it fits."""
    wrap: str = ""
    """How cells may wrap: ``""`` never (numbers), ``"word"`` at spaces (prose), ``"fold"``
    anywhere (trace names, commands: every character shown)."""


#: Narrowest a folding column gets (a name folded over more lines than that is hard to read).
FOLD_MIN_WIDTH = 12


def _plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def _words(text: str) -> int:
    return max((cell_len(w) for line in text.splitlines() for w in line.split()), default=0)


def _lines(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


def fit_columns(cols: list[Col], rows: list[tuple], width: int) -> tuple[list[int], list[int]]:
    """(indices of the columns shown, their content widths) for a table of ``cols`` and
    ``rows`` in ``width`` console columns (each column adds 3: padding and a border, plus 1)."""
    lo, hi = [], []
    for j, c in enumerate(cols):
        cells = [_plain(r[j]) for r in rows]
        need = [_lines(t) if not c.wrap else _words(t) if c.wrap == "word"
                else min(_lines(t), FOLD_MIN_WIDTH) for t in cells]
        lo.append(max([_words(c.header), *need, 1]))
        hi.append(max([_lines(c.header), *(_lines(t) for t in cells), lo[-1]]))
    keep = list(range(len(cols)))

    def room() -> int:
        return width - 3 * len(keep) - 1 - sum(lo[j] for j in keep)

    for j in sorted((j for j in keep if cols[j].drop), key=lambda j: -cols[j].drop):
        if room() >= 0:
            break
        keep.remove(j)
    widths = {j: lo[j] for j in keep}
    spare = max(0, room())
    while spare:  # the rest goes one column at a time to those that would wrap
        grow = [j for j in keep if widths[j] < hi[j]]
        if not grow:
            break
        for j in grow:
            if spare:
                widths[j] += 1
                spare -= 1
    return keep, [widths[j] for j in keep]


def print_table(console: Console, title, cols: list[Col], rows: list[tuple],
                caption: str = "") -> None:
    """Print a rich table that fits ``console.width``: see :func:`fit_columns`; the caption
    names the columns left out."""
    keep, widths = fit_columns(cols, rows, console.width)
    dropped = [cols[j].header for j in range(len(cols)) if j not in keep]
    if dropped:
        caption = (caption + "; " if caption else "") + (
            f"left out at {console.width} columns: {', '.join(dropped)} (a wider terminal "
            "shows them)")
    t = Table(title=Text(title) if isinstance(title, str) else title, title_justify="left",
              caption=Text(caption) if caption else None, caption_justify="left")
    for j, w in zip(keep, widths):
        c = cols[j]
        # a number fits its column by construction; the header wraps at its spaces (no_wrap
        # would cut it), and nothing is ever cut with "…": what is too long folds
        t.add_column(c.header, justify=c.justify, width=w, overflow="fold")
    for r in rows:   # cells are text, never markup (module names hold brackets)
        t.add_row(*(Text(r[j]) if isinstance(r[j], str) else r[j] for j in keep))
    console.print(t)


def render_recommendations(report: Report, console: Console) -> None:
    """Print the verdict and the top recommendations (``report.recommendations``, a
    :class:`pardiag.analyzer.predict.recommend.RecommendationResult`; a line saying so when absent).

    Trace strings are printed as text (``markup=False``; tables cells as :class:`rich.text.Text`).
    """
    rec = report.recommendations
    if rec is None:
        console.print("Verdict: no recommendations computed.", markup=False, highlight=False)
        return
    console.print(Text("Verdict: ", style="bold") + Text(rec.verdict or "–"))
    path = report.critical_path
    console.print(Text(f"{path.describe()}." if path.describe() else
                       f"Critical path: none ({path.why_none or 'no step has one'})."))
    recs = list(rec.recommendations or ())
    if not recs:
        console.print(Text(f"No recommendations: {rec.why_none or 'none computed'}."))
        if rec.not_evaluated:
            console.print(Text(f"Not evaluated: {rec.not_evaluated}."))
        _ruled_out(rec, console)
        return
    rows = []
    nu = getattr(rec, "noise_us", float("nan"))
    noise = f" ±{nu / 1e3:,.3f}" if not math.isnan(nu) else ""   # the measured step's noise
    for r in recs[:TOP_RECOMMENDATIONS]:
        mem = f"{_mib(r.measured_peak_bytes)} → {_mib(r.predicted_peak_bytes)}"
        rows.append((str(r.tier or "–"), Text(r.title), Text(r.change),
                     f"{r.measured_step_us / 1e3:,.3f}{noise} → {r.predicted_step_us / 1e3:,.3f}",
                     f"{r.gain_pct:,.1f}", mem + ("" if r.fits_memory else " (does not fit)")))
    # the change is what the user types: wrapped, even inside a long word, never cut
    print_table(console, f"Top recommendations ({min(len(recs), TOP_RECOMMENDATIONS)} of "
                f"{len(recs)})", [
                    Col("tier"), Col("recommendation", "left", wrap="word"),
                    Col("change", "left", wrap="fold"), Col("step ms", "left", wrap="word"),
                    Col("gain %"), Col("peak MiB", "left", wrap="word")],
                rows, caption="step time and peak memory: measured → predicted; one tier: "
                "within noise of each other")
    if len({r.tier for r in recs}) > 1:
        console.print(Text(TIER_ORDER + "."))
    if rec.noise_rule:
        console.print(Text("Rule: " + rec.noise_rule + "."))
    if rec.peak_definition and any(r.measured_peak_bytes is not None for r in recs):
        console.print(Text("Peak memory: " + rec.peak_definition + "."))
    # what each shown change does to the batch and the optimizer; those that change nothing
    # share one line
    shown = recs[:TOP_RECOMMENDATIONS]
    moving = [r for r in shown if _moves_batch(r)]
    if len(moving) < len(shown):
        console.print(Text(("Batch and optimizer: the other changes shown keep" if moving else
                            "Batch and optimizer: every change shown keeps") + " the global "
                           "batch, per-rank batch, microbatch size and optimizer steps per "
                           "sample."))
    for r in moving:
        console.print(Text(f"{r.title}: {r.optimizer_effect}"))
    if rec.not_evaluated:
        console.print(Text(f"Not evaluated: {rec.not_evaluated}."))
    _ruled_out(rec, console)


def _moves_batch(r) -> bool:
    """True when a recommendation changes any batch size (its ``batch`` factors)."""
    batch = getattr(r, "batch", None) or {}
    return any(isinstance(v, dict) and v.get("factor", 1.0) != 1.0 for v in batch.values())


def _ruled_out(rec, console: Console) -> None:
    """One line per evaluated change not recommended: the change, its prediction, why not
    (:attr:`Recommendation.reason`) and what would settle it."""
    rejected = list(getattr(rec, "rejected", ()) or ())
    if rejected:
        console.print(Text("Evaluated and not recommended:", style="bold"))
        for r in rejected:
            pred = ("" if math.isnan(r.predicted_step_us) else
                    f" ({r.measured_step_us / 1e3:.1f} → {r.predicted_step_us / 1e3:.1f} ms)")
            console.print(Text(f"  {r.change}{pred}: {r.reason or 'not recommended'}"
                               + (f"; to settle it: {r.settle}" if r.settle else "")))


def render_terminal(report: Report, console: Console) -> None:
    """Print the verdict and top recommendations first, then the per-rank breakdown, the
    collectives table and the parallel analyses to ``console``; a monitored run's deep
    capture first says where it comes from."""
    where = report.traces.capture_line()
    if where:
        console.print(Text(f"Deep capture of {where}"))
    render_recommendations(report, console)
    b = report.breakdown
    # a GPU trace's memory copies alone get a column where some rank has them
    copies = has_memory_copies(b.totals)
    rows = [(str(r.rank), r.domain, _n(r.span_us / 1e3, 3), _n(r.compute_only_us / 1e3, 3),
             _n(r.overlap_us / 1e3, 3), _n(r.exposed_comm_us / 1e3, 3),
             *((_n(r.memory_only_us / 1e3, 3),) if copies else ()), _n(r.idle_us / 1e3, 3),
             _n(r.overlap_pct, 2), _n(r.exposed_comm_pct, 1)) for r in b.totals.itertuples()]
    # on a narrow terminal the timeline kind goes first (one kind in nearly every run), then the
    # overlapped ms (overlap % says it relative to the communication)
    print_table(console, Text(f"Time breakdown per rank (ms) — {report.traces.source}"), [
        Col("rank"), Col("on", "left", drop=4), Col("span"), Col("compute"),
        Col("overlapped", drop=2), Col("exposed"), *((Col("memcpy", drop=3),) if copies else ()),
        Col("idle"), Col("overlap %"), Col("exposed %", drop=1)], rows,
        caption="compute = compute only; overlap % = overlapped / communication; "
                "exposed % = exposed comm / span"
                + ("; memcpy = memory copies and sets alone (not idle)" if copies else ""))
    if len(b.collectives):
        agg = b.collective_totals  # the same table as the HTML's and the JSON's
        print_table(console, "Collectives (all ranks)", [
            Col("collective", "left", wrap="fold"), Col("ranks"), Col("count"), Col("time ms"),
            Col("exposed ms")],
            [(Text(str(r.collective)), _i(r.ranks), _i(r.count), _n(r.time_us / 1e3, 3),
              _n(r.exposed_us / 1e3, 3)) for r in agg.itertuples()])
    _causes(report, console)
    _efficiency(report, console)
    _parallel(report, console)
    _hta(report, console)


#: Most ranks in the terminal's tables of where the step goes.
MAX_CAUSE_RANKS = 16
#: Modules the terminal lists (the longest by time).
TERMINAL_MODULES = 10


def _causes(report: Report, console: Console) -> None:
    """Where each rank's step goes on the host and, on GPU runs, on the device (medians over
    steps, ms; :mod:`pardiag.analyzer.analyses.causes`)."""
    c = getattr(report, "causes", None)
    if c is None or c.per_rank.empty:
        return
    pr = c.per_rank.head(MAX_CAUSE_RANKS)
    more = (f"; showing {MAX_CAUSE_RANKS} of {len(c.per_rank)} ranks"
            if len(c.per_rank) > MAX_CAUSE_RANKS else "")
    host = ["data_loading_us", "sync_us", "comm_us", "launch_us", "optimizer_us", "backward_us",
            "forward_us", "other_us"]
    print_table(console, "Where the step goes on the host (ms per profiled step, median)", [
        Col("rank"), Col("step"), Col("data", drop=1), Col("sync", drop=3), Col("comm"),
        Col("launch", drop=4), Col("optim", drop=5), Col("backward", drop=6),
        Col("forward+", drop=7), Col("outside ops", drop=2)],
        [(str(int(r["rank"])), _n(r["span_us"] / 1e3, 2), *(_n(r[k] / 1e3, 2) for k in host))
         for _, r in pr.iterrows()],
        caption="data = DataLoader; comm = communication calls and waits; forward+ = "
                "operators outside backward and optimizer; outside ops = Python, sleeps, "
                "host contention" + more)
    gpu = pr[pr["dev_compute_us"].notna()]
    if len(gpu):
        dev = ["dev_compute_us", "dev_memory_us", "wait_comm_us", "wait_host_us",
               "wait_sync_us", "wait_other_us"]
        print_table(console, "Where the step goes on the device (ms per step, median)", [
            Col("rank"), Col("step"), Col("compute"), Col("copy", drop=3), Col("comm"),
            Col("idle: host"), Col("idle: sync", drop=2), Col("idle: queued", drop=1)],
            [(str(int(r["rank"])), _n(r["span_us"] / 1e3, 2), *(_n(r[k] / 1e3, 2) for k in dev))
             for _, r in gpu.iterrows()],
            caption="idle: host = nothing queued, the host was launching or computing; sync = "
                    "nothing queued during a host synchronization; queued = work waiting on a "
                    "dependency" + more)


def _efficiency(report: Report, console: Console) -> None:
    """FLOPs and MFU per rank, and the achieved rate per op class
    (:mod:`pardiag.analyzer.analyses.efficiency`)."""
    e = getattr(report, "efficiency", None)
    if e is None:
        return
    if e.per_rank.empty or not e.ops["flops"].notna().any():
        for n in e.notes:   # ops without shapes: why no FLOPs are given
            console.print(Text(f"note: {n}", style="dim"), highlight=False)
        return
    pr = e.per_rank.head(MAX_CAUSE_RANKS)

    def mfu(r) -> str:
        if pd.isna(r["mfu_pct"]):
            return "unknown"
        lo, hi = r["mfu_pct_min"], r["mfu_pct_max"]
        return _g(r["mfu_pct"]) + (f" ({_g(lo)}–{_g(hi)})" if _g(lo) != _g(hi) else "")

    print_table(console, "How far from the peak (per step, median over the rank's steps)", [
        Col("rank"), Col("device", "left", drop=4), Col("dtype", "left", drop=5),
        Col("peak TFLOP/s", drop=3), Col("model GFLOP", drop=6), Col("TFLOP/s"),
        Col("MFU % (range)"), Col("HFU %", drop=2), Col("tokens/s", drop=1)],
        [(str(int(r["rank"])), str(r["device"]), str(r["dtype"] or "–"),
          _g(r["peak_tflops"]), _g(r["model_tflop_per_step"] * 1e3),
          _g(r["achieved_tflops"]), mfu(r), _g(r["hfu_pct"]), _i(r["tokens_per_s"]))
         for _, r in pr.iterrows()],
        caption="model FLOPs = matmul, convolution, attention; MFU = model FLOPs / (step × "
                "peak); HFU counts every counted op" + (
                    f"; showing {MAX_CAUSE_RANKS} of {len(e.per_rank)} ranks"
                    if len(e.per_rank) > MAX_CAUSE_RANKS else ""))
    if len(e.per_class):
        print_table(console, "Achieved rate per op class (all ranks)", [
            Col("class", "left"), Col("dtype", "left"), Col("ops"), Col("GFLOP"),
            Col("ms"), Col("TFLOP/s"), Col("GB/s", drop=1), Col("FLOP/byte", drop=2)],
            [(str(r["op_class"]), str(r["dtype"]), _i(r["ops"]), _n(r["flops"] / 1e9, 2),
              _n(r["time_us"] / 1e3, 2), _n(r["achieved_tflops"], 3),
              _n(r["achieved_gbps"], 1), _n(r["intensity"], 1))
             for _, r in e.per_class.iterrows()],
            caption="time on the device for GPU ranks, on the host thread for CPU ranks")
    if len(e.per_module):
        top = e.per_module.head(TERMINAL_MODULES)
        print_table(console, "Achieved rate per module (own ops, all ranks)", [
            Col("module", "left"), Col("class", "left", drop=1), Col("GFLOP"), Col("ms"),
            Col("% time"), Col("TFLOP/s"), Col("FLOP/byte", drop=2)],
            [(str(r["module"]) if pd.notna(r["module"]) else "(no known module)",
              str(r["module_class"]) if pd.notna(r["module_class"]) else "–",
              _n(r["flops"] / 1e9, 2), _n(r["time_us"] / 1e3, 2),
              _n(r["time_pct"], 1), _n(r["achieved_tflops"], 3), _n(r["intensity"], 1))
             for _, r in top.iterrows()],
            caption="the longest by time" + (f"; {len(top)} of {len(e.per_module)} modules "
                                             f"(all in --json)"
                                             if len(e.per_module) > len(top) else ""))
    for n in e.notes:
        console.print(Text(f"note: {n}", style="dim"), highlight=False)


def _hta(report: Report, console: Console) -> None:
    """``report --hta``: idle time per rank and category (:attr:`HtaExtras.idle_by_rank`),
    launch delays, HTA's failures."""
    h = report.hta
    if h is None:
        return
    if len(h.idle_by_rank):
        t = Table(title="HTA: GPU idle time per rank (ms, all streams)", title_justify="left")
        for col in ("rank", "host wait", "kernel wait", "other"):
            t.add_column(col, justify="right")
        for row in h.idle_by_rank.itertuples():
            t.add_row(str(row.rank), *(_n(v / 1e3, 3) for v in (
                row.host_wait_us, row.kernel_wait_us, row.other_us)))
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


def _routing(report: Report, console: Console) -> None:
    """MoE routing: per expert-parallel group, max/mean tokens, the hot rank, the others' wait
    and the saving with even routing (per step, medians), and the cause in words."""
    r = report.routing
    if r.groups.empty:
        return
    title = ("MoE routing (all-to-all split sizes, per step)" if r.expert else
             "All-to-all split sizes, per step (what they carry is unknown)")
    print_table(console, title, [
        Col("group", "left", wrap="fold"), Col("unit", "left", drop=2), Col("steps", drop=3),
        Col("max/mean"), Col("range", drop=1), Col("hot rank"), Col("hot rank rows"),
        Col("mean rows"), Col("others wait ms"), Col("saving ms")],
        [(Text(str(g.group).split("|")[0]), g.unit, _i(g.steps), _n(g.imbalance, 2),
          f"{g.imbalance_min:.2f}–{g.imbalance_max:.2f}", str(g.hot_rank), _n(g.hot_rows, 0),
          _n(g.mean_rows, 0), _n(g.wait_us / 1e3, 3), _n(g.saving_us / 1e3, 3))
         for g in r.groups.itertuples()],
        caption=(f"rows on the {'expert' if r.expert else 'larger (received or sent)'} side "
                 f"summed over the step's routed all-to-alls (median over steps); saving = "
                 f"others' wait / ranks"))
    text = r.describe()
    if text:
        console.print(Text(f"cause: {text}"))


def _parallel(report: Report, console: Console) -> None:
    sync, pipe, bal, mem, lay = (report.sync, report.pipeline, report.balance, report.memory,
                                 report.layout)
    inferred = lay.source != "recorded"
    if lay.dims:
        dims = dims_text(lay.dims, lay.folded)
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
        print_table(console, f"Stragglers ({len(sync.instances)} collective instances matched "
                    f"by {sync.matched_by})", [
                        Col("rank"), Col("wait caused ms"), Col("wait suffered ms"),
                        Col("last arrivals"), Col("top in steps")],
                    [(str(row.rank), _n(row.wait_caused_us / 1e3, 3),
                      _n(row.wait_suffered_us / 1e3, 3), _i(row.last_arrivals),
                      _i(row.steps_as_top)) for row in sync.stragglers.head(8).itertuples()])
        for note in sync.notes:
            console.print(Text(f"note: {note}"))
        for row in sync.p2p.head(8).itertuples():
            console.print(Text(f"point-to-point {row.src} → {row.dst}: {row.count} transfers, hop "
                               f"{row.hop_us / 1e3:.3f} ms (median), receiver waits "
                               f"{row.recv_wait_us / 1e3:.3f} ms, sender waits "
                               f"{row.send_wait_us / 1e3:.3f} ms"))
    if len(pipe.bubbles):
        summ = pipe.summary
        src = (pipe.schedule or {}).get("source")
        title = "Pipeline bubbles (" + ("estimate" if (pipe.bubbles["method"] == "estimate")
                                         .all() else "measured") + (
            f"; schedule {src}" if src else "") + ")"
        names = pipe.phase_names
        print_table(console, title, [
            Col("rank"), Col("stages", wrap="word"), Col("steps", wrap="word"),
            Col("bubble % (median)"), Col("ideal %"), *(Col(f"{n} ms") for n in names)],
            [(str(row.rank), Text(str(row.stages)), f"{_i(row.steps)} {row.basis}",
              _n(row.bubble_pct, 1), _n(row.ideal_pct, 1), _n(row.warmup_us / 1e3, 3),
              _n(row.steady_us / 1e3, 3), _n(row.cooldown_us / 1e3, 3))
             for row in summ.itertuples()])
    if len(bal.summary):
        print_table(console, "Load imbalance (compute per step)", [
            Col("dimension", wrap="fold"), Col("group", wrap="fold"), Col("max/mean"),
            Col("cost ms/step"), Col("slowest rank")],
            [(Text(str(row.dim)), Text(str(row.pg)), _n(row.imbalance, 3),
              _n(row.cost_us / 1e3, 3), str(row.slowest_rank))
             for row in bal.summary.itertuples()])
    _routing(report, console)
    m = mem.per_rank
    if m["static_bytes"].notna().any():
        print_table(console, "Memory per rank (MiB)", [
            Col("rank"), Col("params"), Col("grads"), Col("optimizer"), Col("static"),
            Col("peak"), Col("alloc. in window", drop=1), Col("peak RSS", drop=2)],
            [(str(row.rank), *(_n(v / 2**20, 2) for v in (
                row.params_bytes, row.grads_bytes, row.optimizer_state_bytes, row.static_bytes,
                row.peak_bytes, row.peak_allocated_bytes, row.peak_rss_bytes)))
             for row in m.itertuples()])
        console.print(Text(f"peak = {mem.peak_definition}; alloc. in window = the allocator's "
                           f"peak inside the traced window"))
