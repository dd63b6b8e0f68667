"""The report page's sections: for each, what its template (``templates/sections/KEY.html``)
shows, taken from the analysis results and formatted.

A builder here computes nothing about the run: every number it shows is a field of an analysis
result (:class:`~pardiag.analyzer.report.registry.Report`), converted to the unit the page
shows (µs in ms, bytes in MiB) and formatted. What it decides is presentation: which figure
and table a section holds, and how much of a large run it draws (the limits below; each
reduction is recorded with :meth:`Page.sample` and listed under "Run summary").

Figures are numbered on the page in the order they are made, so the builders run in page order
(:data:`BUILDERS`); the run summary, second on the page, is built last because it lists every
reduction the later sections made.
"""

from __future__ import annotations

import datetime
import math

import numpy as np
import pandas as pd
from markupsafe import Markup

from ..analyses.breakdown import has_memory_copies
from ..analyses.layout import dims_text
from ..analyses.routing import IMBALANCE_MIN
from ..analyses.stragglers import STRAGGLER_MIN_WAIT_US
from ..predict.recommend.findings import (
    STRAGGLER_IDLE_PCT,
    STRAGGLER_IDLE_PCT_PIPELINE,
    STRAGGLER_LAST_SHARE,
    STRAGGLER_RATIO,
)
from ..predict.recommend.policy import TIER_ORDER
from ..predict.recommend.verdict import without_data_loading
from ..report.registry import Report
from ..trace import vocab
from . import figures as fg
from .page import Page, fmt, in_mib, in_ms, shown, table

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
    ("routing", "All-to-all routing (MoE)"),
    ("efficiency", "How far from the peak: FLOPs and MFU"),
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
HEATMAP_MAX_COLUMNS = fg.HEATMAP_MAX_COLUMNS
#: Most ranks drawn in the memory timeline (those with the highest peaks), and points per chart.
TIMELINE_MAX_RANKS = 16
TIMELINE_POINTS = 12_000
#: Most points of the bandwidth scatter (evenly sampled per collective type above it).
BANDWIDTH_MAX_POINTS = 3_000
#: Pipeline Gantt: at most this many (rank, stage) rows.
GANTT_MAX_ROWS = 64
#: Steps of the critical path drawn on the page (the latest ones; the tables hold every step).
PATH_STEPS_DRAWN = 20
#: Most per-rank notes listed (every warning is always listed).
MAX_NOTES = 200
#: What an overlap chart whose bars are all 0% shows instead.
NO_OVERLAP = "No overlap: all communication exposed"


def _html(text: str) -> Markup:
    """HTML the page kit made (its tables, figures and notes escape what they hold)."""
    return Markup(text)


def _table(*args, **kwargs) -> Markup:
    return _html(table(*args, **kwargs))


def _ms(v: float, spec: str = ",.3f") -> str:
    """µs as ms, formatted."""
    return format(v / 1000, spec)


def _mib_or_dash(v) -> str:
    return "–" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v / 2**20:,.1f}"


def verdict(report: Report, page: Page) -> dict:
    """The verdict sentence, the critical path's sentence and the ranked recommendations
    (``report.recommendations``, a
    :class:`pardiag.analyzer.predict.recommend.RecommendationResult`, may be absent): ``rec``
    (present or not), ``verdict``, ``path``, ``why_none``, ``not_evaluated``, ``recs`` and
    ``rejected`` (rows of
    formatted cells: step time in ms, peak memory in MiB), ``notes``."""
    rec = report.recommendations
    if rec is None:
        return {"rec": None}
    out = {"rec": True, "verdict": getattr(rec, "verdict", ""),
           "path": report.critical_path.describe(), "why_none": rec.why_none,
           "not_evaluated": getattr(rec, "not_evaluated", "")}
    recs = list(getattr(rec, "recommendations", ()) or ())
    nu = getattr(rec, "noise_us", float("nan"))
    noise = f" ±{nu / 1000:,.3f}" if not math.isnan(nu) else ""   # the measured step's noise
    rows = []
    for r in recs:
        mem = f"{_mib_or_dash(r.measured_peak_bytes)} → {_mib_or_dash(r.predicted_peak_bytes)}"
        rows.append({
            "tier": r.tier or "–", "title": r.title, "change": r.change,
            "step": f"{_ms(r.measured_step_us)}{noise} → {_ms(r.predicted_step_us)}",
            "gain": f"{r.gain_pct:,.1f}",
            "mem": mem + ("" if r.fits_memory else " (does not fit)"),
            "evidence": list(r.evidence), "caveats": list(r.caveats),
            "optimizer_effect": getattr(r, "optimizer_effect", "") or "–"})
    out["recs"] = rows
    if recs:
        notes = ["Recommendations of one tier are predicted within noise of each other: a set, "
                 "not a ranking.", TIER_ORDER + "."]
        if getattr(rec, "noise_rule", ""):
            notes.append("Rule: " + rec.noise_rule + ".")
        if getattr(rec, "peak_definition", "") and any(
                r.measured_peak_bytes is not None for r in recs):
            notes.append("Measured peak memory: " + rec.peak_definition + ".")
        out["notes"] = " ".join(notes)
    # every change evaluated appears once: recommended above, the rest here
    out["rejected"] = [{
        "title": r.title, "change": r.change,
        "step": "–" if math.isnan(r.predicted_step_us) else (
            f"{_ms(r.measured_step_us)} → {_ms(r.predicted_step_us)}"
            + (f" ({_ms(r.predicted_low_us)}–{_ms(r.predicted_high_us)})"
               if r.interval_known else "")),
        "gain": "–" if math.isnan(r.predicted_step_us) else f"{r.gain_pct:,.1f}",
        "reason": r.reason or "–", "settle": r.settle or "–"}
        for r in list(getattr(rec, "rejected", ()) or ())]
    return out


def summary(report: Report, page: Page) -> dict:
    """The run summary: ``rows`` of (label, value) — source, ranks, run metadata, the run's
    exposed communication and overlap (:attr:`TimeBreakdown.overall`, %) — and ``sampled``,
    every reduction the page made (:attr:`Page.sampled`; build this section last)."""
    b, traces = report.breakdown, report.traces
    run = traces.run_info
    domains = sorted(set(b.totals["domain"]))
    rows: list[tuple[str, object]] = [
        ("source", traces.source),
        *([("deep capture", traces.capture_line())] if traces.capture else []),
        ("ranks", f"{len(traces.ranks)} ({', '.join(str(r) for r in traces.ranks)})"
         if len(traces.ranks) <= 16 else f"{len(traces.ranks)}"),
        ("timeline", ", ".join("GPU kernels" if d == "gpu" else "CPU events (no GPU kernels)"
                               for d in domains)),
    ]
    if run:
        rows += [("command", run.command or ""),
                 ("world size", run.world_size if run.world_size is not None else ""),
                 ("exit code", run.exit_code if run.exit_code is not None else "")]
        if run.torch_version:
            rows.append(("torch", run.torch_version))
        if run.started_unix is not None:   # run.json's started_unix (UTC)
            rows.append(("started", datetime.datetime.fromtimestamp(
                run.started_unix, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")))
        lay = run.layout or {}
        if isinstance(lay, dict) and lay:
            dims = dims_text(lay.get("dims") or {}, lay.get("folded"))
            pipe = lay.get("pipeline")
            extra = (f"; {pipe.get('schedule')}, {pipe.get('stages')} stages, "
                     f"{pipe.get('microbatches')} microbatches" if isinstance(pipe, dict) else "")
            rows.append(("parallel layout",
                         f"{dims} ({', '.join(map(str, lay.get('strategies') or []))})" + extra))
    named = (vocab.DIST_BACKEND.get(vocab.DISTRIBUTED_INFO.get(t.metadata))
             for t in traces.ranks.values())
    backends = sorted({str(name) for name in named if name})
    if backends:
        rows.append(("backend", ", ".join(backends)))
    if len(b.totals):
        exposed, overlap = b.overall["exposed_comm_pct"], b.overall["overlap_pct"]
        rows.append(("exposed communication",
                     "–" if math.isnan(exposed) else f"{exposed:.1f}% of rank time"))
        rows.append(("overlap (all ranks)", "no communication found" if math.isnan(overlap)
                     else f"{overlap:.1f}%"))
    rows.append(("warnings", str(len(traces.warnings))))
    return {"rows": rows, "sampled": list(page.sampled)}


def breakdown(report: Report, page: Page) -> dict:
    """The breakdown per rank (figure and table) and per profiler step: one bar per rank and
    step, or above :data:`MAX_STEP_BARS` the mean over ranks per step
    (:attr:`TimeBreakdown.step_means`) and two rank × step heatmaps."""
    b = report.breakdown
    out: dict = {"steps": []}
    if len(b.totals):
        out["figure"] = _html(page.fig(fg.breakdown_figure(b.totals)))
        ms = in_ms(b.totals, ["span_us", "compute_only_us", "overlap_us", "exposed_comm_us",
                            "memory_only_us", "idle_us"])
        copies = ({"memory_only_us": "memory copies only (ms)"}
                  if has_memory_copies(b.totals) else {})
        out["table"] = _table(ms, {
            "rank": "rank", "domain": "timeline", "span_us": "span (ms)",
            "compute_only_us": "compute only (ms)", "overlap_us": "overlapped (ms)",
            "exposed_comm_us": "exposed comm (ms)", **copies, "idle_us": "idle (ms)",
            "overlap_pct": "overlap %"}, left=("domain",), digits=3, sortable=True, what="ranks")
    out["has_steps"] = bool(len(b.steps))
    if len(b.run_steps):
        out["run_steps"] = _html(page.fig(fg.run_steps_figure(b.run_steps)))
    if len(b.steps) and len(b.steps) <= MAX_STEP_BARS:
        out["steps"].append(_html(page.fig(fg.step_breakdown_figure(b.steps))))
    elif len(b.steps):
        n_r, n_s = b.steps["rank"].nunique(), b.steps["step"].nunique()
        out["steps"] += [_html(page.sample(
            f"Per-step chart aggregated: {n_r} ranks × {n_s} steps ({len(b.steps)} bars) is "
            f"more than {MAX_STEP_BARS}, so the bars show the mean over ranks per step; the "
            "heatmaps below show every rank and step.")),
            _html(page.fig(fg.step_mean_figure(b.step_means))),
            _html(page.fig(fg.step_heatmap(b.steps, "exposed_comm_us",
                                           "Exposed communication per rank and step (ms)"))),
            _html(page.fig(fg.step_heatmap(b.steps, "idle_us", "Idle per rank and step (ms)")))]
    return out


def _no_overlap(overlap_us: pd.Series) -> bool:
    """True when no rank overlaps any communication (every bar of the chart would be 0%): the
    chart is left out."""
    v = pd.to_numeric(overlap_us, errors="coerce").dropna()
    return len(v) > 0 and bool((v <= 0).all())


def overlap(report: Report, page: Page) -> dict:
    """Overlap per rank (a chart, or why none) and per parallel dimension
    (:class:`pardiag.analyzer.analyses.dim_overlap.DimOverlapResult`)."""
    b, dov = report.breakdown, report.dim_overlap
    if not b.totals["overlap_pct"].notna().any():
        return {"measured": False}
    measured = b.totals.dropna(subset=["overlap_pct"])
    out: dict = {"measured": True, "no_overlap": NO_OVERLAP}
    if _no_overlap(measured["overlap_us"]):
        # a chart of zero-height bars reads as a broken page: say what it would show
        out["none_on"] = len(measured)
        out["comm_ms"] = fmt(b.overall["comm_us_per_rank"] / 1000.0, 3)
    else:
        out["figure"] = _html(page.fig(fg.overlap_figure(b.totals)))
    if len(dov.per_rank) and set(dov.per_rank["dim"]) == {"all"}:
        # one row "all" is the per-rank chart again (matched collectives only): leave it out
        out["dims"] = "all"
    elif len(dov.per_rank):
        out["dims"] = "known"
        out["groups_unknown"] = report.layout.groups.empty
        if _no_overlap(dov.per_rank["overlap_us"]):
            out["dims_without_overlap"] = ", ".join(map(str, sorted(set(dov.per_rank["dim"]))))
        else:
            out["dim_figure"] = _html(page.fig(fg.dim_overlap_figure(dov.per_rank)))
        out["table"] = _table(in_ms(dov.summary, ["comm_us", "exposed_us"]), {
            "dim": "dimension", "ranks": "ranks", "comm_us": "communication per rank (ms, mean)",
            "exposed_us": "exposed per rank (ms, mean)", "overlap_pct": "overlap %"},
            left=("dim",), digits=3, sortable=True, what="dimensions")
    else:
        out["dims"] = None
        out["why_none"] = dov.why_none
    return out


def stragglers(report: Report, page: Page) -> dict:
    """Matched instances (:attr:`SyncResult.counts`), the rank the others wait for, the
    straggler table, heatmap and skew table, point-to-point links and clock offsets
    (:class:`pardiag.analyzer.analyses.sync.SyncResult`)."""
    sync = report.sync
    if not len(sync.instances):
        return {"matched": False}
    n = sync.counts
    what = (f"{n['collectives']} collective instances" if not n["p2p"] else
            f"{n['p2p']} point-to-point transfers (no collective)" if not n["collectives"] else
            f"{n['instances']} instances ({n['collectives']} collectives, {n['p2p']} "
            "point-to-point transfers)")
    out: dict = {"matched": True, "what": what, "matched_by": sync.matched_by,
                 "complete": n["complete"], "min_wait_us": f"{STRAGGLER_MIN_WAIT_US:.0f}",
                 "notes": list(sync.notes)}
    if sync.straggler is not None and len(sync.stragglers):
        top = sync.stragglers.iloc[0]
        out["top"] = {"rank": int(top["rank"]), "caused_ms": _ms(top["wait_caused_us"], ".3f"),
                      "last": int(top["last_arrivals"])}
        cp = getattr(report, "critical_path", None)
        costs = cp.delay_costs if cp is not None else None
        outside = getattr(sync, "straggler_outside_cost_us", None)
        if int(top["rank"]) != int(sync.straggler) and (
                outside is not None or (costs is not None and len(costs))):
            # named by its delay cost on the execution graph (a pipeline's end stages cause
            # the schedule's waiting)
            row = (costs[costs["rank"] == int(sync.straggler)]["delay_cost_us"]
                   if costs is not None else pd.Series(dtype=float))
            if outside is not None or len(row):
                out["costly"] = {"rank": int(sync.straggler),
                                 "cost_ms": _ms(outside if outside is not None
                                                else row.iloc[0], ".3f"),
                                 "what": ("time outside computation (host work, a sleep)"
                                          if outside is not None else "computation")}
    rec = getattr(report, "recommendations", None)
    if sync.straggler is not None and rec is not None and rec.straggler != sync.straggler:
        pipe = report.pipeline
        out["not_called"] = int(sync.straggler)
        out["why_not"] = (
            f"in a pipeline the waiting a stage causes is the schedule's bubble, and on CPU "
            f"traces a rank's computation follows its host's load, so only a rank that idles "
            f"{STRAGGLER_IDLE_PCT_PIPELINE:g}% of the step longer than its peers is one"
            if pipe is not None and (len(pipe.chunks) or pipe.schedule) else
            f"it asks more of one: it arrives last at {STRAGGLER_LAST_SHARE:.0%} or more of 3 "
            f"or more collectives and causes {STRAGGLER_RATIO:g}× the waiting it suffers; on "
            f"CPU traces it also idles {STRAGGLER_IDLE_PCT:g}% of the step longer than its "
            f"peers, since ranks that share a host's cores arrive last in turn")
    if rec is not None and rec.straggler is not None and rec.straggler != sync.straggler:
        # the verdict names one the waiting alone does not (its idle time, its delay cost)
        out["called"] = int(rec.straggler)
    out["table"] = _table(in_ms(sync.stragglers, ["wait_suffered_us", "wait_caused_us"]), {
        "rank": "rank", "wait_caused_us": "wait caused (ms)",
        "wait_suffered_us": "wait suffered (ms)", "last_arrivals": "last arrivals",
        "steps_as_top": "steps as top straggler", "instances": "instances"}, digits=3,
        sortable=True, what="ranks (most wait caused first)")
    if len(sync.instances) > HEATMAP_MAX_COLUMNS:
        out["binned"] = _html(page.sample(
            f"Straggler heatmap binned: {len(sync.instances)} instances are shown as "
            f"{HEATMAP_MAX_COLUMNS} columns of consecutive instances (largest wait and skew per "
            "column); the tables cover every instance."))
    out["figure"] = _html(page.fig(fg.straggler_heatmap(sync.per_rank, sync.instances)))
    out["skew"] = _table(in_ms(sync.skew, ["arrival_skew_us", "max_skew_us", "transfer_us"]), {
        "op": "collective", "count": "instances", "arrival_skew_us": "median arrival skew (ms)",
        "max_skew_us": "max arrival skew (ms)", "transfer_us": "median transfer (ms)"},
        left=("op",), digits=3, sortable=True)
    if len(sync.p2p):
        out["p2p"] = _table(in_ms(sync.p2p, ["hop_us", "recv_wait_us", "send_wait_us"]), {
            "src": "from rank", "dst": "to rank", "count": "transfers",
            "hop_us": "hop (ms, median)", "recv_wait_us": "receiver waits (ms, median)",
            "send_wait_us": "sender waits (ms, median)", "bytes": "bytes (median)"}, digits=3,
            sortable=True, what="links")
    # Either the offsets or why there are none, never both: a table of zeros next to "could not
    # be aligned" contradicts itself (pipeline runs match only point-to-point transfers).
    if not len(sync.offsets) or (sync.offsets["instances"] == 0).all():
        hosts = set(sync.offsets["host"]) if len(sync.offsets) else set()
        out["one_host"] = (next(iter(hosts)) if len(hosts) == 1 and None not in hosts
                           else None)
        out["p2p_only"] = n["p2p"] == n["instances"]
    else:
        out["offsets"] = _table(sync.offsets.drop(columns=["host"]), {
            "rank": "rank", "offset_us": "offset (µs)", "residual_us": "residual (µs)",
            "instances": "collectives used"}, digits=1, sortable=True, what="ranks")
    return out


def critical_path(report: Report, page: Page) -> dict:
    """The critical path's sentence, figure (the latest :data:`PATH_STEPS_DRAWN` steps) and
    tables (:class:`pardiag.analyzer.analyses.critical_path.CriticalPathResult`)."""
    cp = report.critical_path
    if cp.steps.empty or cp.segments.empty:
        return {"why_none": cp.why_none or "no step has a path"}
    drawn = sorted(set(cp.segments["step"]))[-PATH_STEPS_DRAWN:]
    return {
        "describe": cp.describe(),
        "figure": _html(page.fig(fg.critical_path_figure(cp.segments, drawn))),
        "drawn": len(drawn), "steps": len(cp.steps),
        "tables": [
            _table(in_ms(cp.shares, ["us"]), {
                "part": "part", "rank": "rank", "dim": "dimension",
                "us": "on the path (ms, all steps)", "share_pct": "share %"},
                left=("part", "dim"), digits=3, sortable=True, what="parts"),
            _table(in_ms(cp.steps, ["measured_us", "path_us", "replay_us"]), {
                "step": "step", "measured_us": "step (ms)", "path_us": "path (ms)",
                "replay_us": "replayed (ms)", "replay_error_pct": "replay error %",
                "joins": "communication joins"}, digits=3, sortable=True, what="steps"),
            _table(in_ms(cp.slack, ["slack_us"]), {
                "rank": "rank", "steps": "steps", "slack_us": "slack (ms, median)",
                "on_path_steps": "steps on the path"}, digits=3, sortable=True, what="ranks")],
        "notes": list(cp.notes)}


def causes(report: Report, page: Page) -> dict:
    """Where each rank's step goes on the host and the device, the straggler's cause, the
    input- and host-bound findings (:mod:`pardiag.analyzer.analyses.causes`; ms, %)."""
    c = getattr(report, "causes", None)
    if c is None or c.per_rank.empty:
        return {"steps": False}
    rec = report.recommendations
    lines = []
    if c.host_bound is not None:
        hb = c.host_bound
        lines.append(f"Host-bound: the GPU computes {hb['busy_pct']:.1f}% of the step and idles "
                     f"waiting for the host {hb['wait_host_pct']:.1f}% (median over ranks).")
    if c.input_bound is not None:
        ib = c.input_bound
        # against the verdict's step, as the verdict says it
        step = getattr(rec, "step", None)
        pred, now = without_data_loading(ib, step.median_us if step is not None else None)
        lines.append("Input-bound: data loading takes " + ", ".join(
            f"{ib['share_pct'][r]:.0f}% of the step on rank {r} "
            f"({ib['data_loading_us'][r] / 1e3:.1f} ms)" for r in ib["ranks"])
            + (f"; without it the step would take about {pred / 1e3:.1f} ms "
               f"(now {now / 1e3:.1f} ms)" if not math.isnan(pred) else "") + ".")
    for r in tuple(getattr(rec, "recommendations", ())) + tuple(getattr(rec, "rejected", ())):
        if r.kind == "straggler":
            lines.append(f"{r.title}: " + "; ".join(r.evidence[1:3]) + f" — {r.change}.")
            break
    pr = c.per_rank
    out: dict = {"steps": True, "lines": lines, "host": _html(page.fig(fg.parts_figure(
        pr, fg.HOST_PART_COLORS, "Where the profiled step goes on the host, per rank")))}
    gpu = pr[pr["dev_compute_us"].notna()]
    if len(gpu):
        out["device"] = _html(page.fig(fg.parts_figure(
            gpu, fg.DEVICE_PART_COLORS, "Where the step goes on the device, per rank")))
    cols = {"rank": "rank", "steps": "steps", "span_us": "step (ms)",
            **{k: v[0] + " (ms)" for k, v in fg.HOST_PART_COLORS.items()},
            "data_loading_pct": "data loading %"}
    if len(gpu):
        cols.update({k: "device " + v[0] + " (ms)" for k, v in fg.DEVICE_PART_COLORS.items()})
        cols["dev_compute_pct"] = "device busy %"
    extra = {k: label for k, label in (("dtensor_us", "DTensor host work (ms)"),
                                       ("fsdp_us", "FSDP2 hooks (ms)"))
             if k in pr and (pd.to_numeric(pr[k], errors="coerce") > 0).any()}
    cols.update(extra)
    out["table"] = _table(in_ms(pr, [k for k in cols if k.endswith("_us")]), cols, digits=2,
                          sortable=True, what="ranks")
    out["extra"] = bool(extra)
    return out


def pipeline(report: Report, page: Page) -> dict:
    """How the bubbles were measured, the schedule, the summary per rank
    (:attr:`PipelineResult.summary`) and the Gantt chart of one step
    (:attr:`PipelineResult.typical_step`, its bubbles :attr:`PipelineResult.gaps`)."""
    pipe = report.pipeline
    if not len(pipe.bubbles):
        return {"bubbles": False}
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
    out: dict = {"bubbles": True, "method": method, "schedule": sch.get("schedule"),
                 "p": sch.get("p"), "m": sch.get("m"), "v": sch.get("v"),
                 "ideal": fmt(float(b["ideal_pct"].iloc[0]))}
    out["table"] = _table(in_ms(pipe.summary, ["warmup_us", "steady_us", "cooldown_us",
                                               "window_us"]), {
        "rank": "rank", "stages": "stages", "steps": "steps", "basis": "steps used",
        "window_us": "step window (ms)", "bubble_pct": "bubble % (median)",
        "ideal_pct": "ideal %", **{k: f"{n} (ms)" for k, n in zip(
            ("warmup_us", "steady_us", "cooldown_us"), pipe.phase_names)}},
        left=("stages", "basis"), digits=3, sortable=True,
        what="ranks")
    if not len(pipe.chunks):
        return out
    step = pipe.typical_step
    chunks = pipe.chunks
    rows = chunks[["rank", "stage"]].drop_duplicates().sort_values(["rank", "stage"])
    if len(rows) > GANTT_MAX_ROWS:
        chunks = chunks.merge(rows.head(GANTT_MAX_ROWS), on=["rank", "stage"])
        out["gantt_sampled"] = _html(page.sample(
            f"Pipeline Gantt sampled: the first {GANTT_MAX_ROWS} of {len(rows)} (rank, stage) "
            "rows are drawn."))
    out["gantt"] = _html(page.fig(fg.pipeline_gantt(chunks, pipe.gaps, step)))
    which = ("an unprofiled step, like the table" if b["clean"].any()
             else "no unprofiled step was recorded")
    out["gantt_note"] = _html(page.sample(
        f"Pipeline Gantt shows one step of {chunks['step'].nunique()}: step {step} ({which}). "
        "Table columns are medians over steps each, so the phases need not add up to the "
        "bubble."))
    return out


def imbalance(report: Report, page: Page) -> dict:
    """Compute imbalance per group and where the arrival skew arises
    (:class:`pardiag.analyzer.analyses.imbalance.BalanceResult`; ms)."""
    bal = report.balance
    out: dict = {}
    if len(bal.summary):
        out["table"] = _table(in_ms(bal.summary, ["cost_us"]), {
            "dim": "dimension", "pg": "group", "imbalance": "compute max/mean",
            "cost_us": "cost per step (ms)", "slowest_rank": "slowest rank"},
            left=("dim", "pg"), digits=3, sortable=True, what="groups")
    skew = getattr(bal, "skew", None)
    if skew is not None and len(skew):
        out["skew"] = _table(in_ms(skew, ["start_late_us", "delay_us", "top_delay_us"]), {
            "rank": "rank", "steps": "steps", "start_late_us": "starts the step late by (ms)",
            "delay_us": "arrives late, per step (ms)", "top_collective": "mostly at",
            "top_delay_us": "there, per step (ms)", "top_share_pct": "share %"},
            left=("top_collective",), digits=3, sortable=True, what="ranks")
    return out


def routing(report: Report, page: Page) -> dict:
    """MoE routing: the finding, the figure and the tables
    (:class:`pardiag.analyzer.analyses.routing.RoutingResult`; rows, ms)."""
    r = report.routing
    if r.groups.empty:
        return {"routed": False, "notes": list(r.notes)}
    return {
        "routed": True, "describe": r.describe(), "imbalance_min": f"{IMBALANCE_MIN:g}",
        "expert": r.expert,
        "figure": _html(page.fig(fg.routing_figure(r))),
        "groups": _table(in_ms(r.groups, ["wait_us", "saving_us", "saving_q1_us",
                                          "saving_q3_us"]), {
            "group": "group", "dim": "dimension", "ranks": "ranks", "steps": "steps",
            "unit": "unit", "imbalance": "max/mean (median)", "imbalance_min": "min",
            "imbalance_max": "max", "hot_rank": "hot rank", "hot_steps": "hot in steps",
            "hot_rows": "hot rank per step", "mean_rows": "mean per step",
            "wait_us": "others wait per step (ms)", "saving_us": "saving per step (ms)",
            "saving_q1_us": "saving Q1 (ms)", "saving_q3_us": "saving Q3 (ms)",
            "expert": "expert dispatch"},
            left=("group", "dim", "unit"), digits=3, sortable=True, what="groups"),
        "per_rank": _table(in_ms(r.per_rank, ["waited_us"]), {
            "group": "group", "step": "step", "rank": "rank", "sent_rows": "sent",
            "recv_rows": "received", "load_rows": "expert side", "waited_us": "waited (ms)"},
            left=("group",), digits=3, sortable=True, what="rows"),
        "notes": list(r.notes)}


def efficiency(report: Report, page: Page) -> dict:
    """MFU per rank (table, with each rank's range over its steps), the roofline figure and the
    table per op class (:class:`pardiag.analyzer.analyses.efficiency.EfficiencyResult`)."""
    e = report.efficiency
    if e.per_rank.empty or not e.ops["flops"].notna().any():
        return {"counted": False, "notes": list(e.notes)}
    ranks = e.per_rank.assign(
        mfu_range=["–" if pd.isna(a) else f"{a:.3g}–{b:.3g}"
                   for a, b in zip(e.per_rank["mfu_pct_min"], e.per_rank["mfu_pct_max"])],
        model_tflop_per_step=e.per_rank["model_tflop_per_step"] * 1e3)
    return {
        "counted": True, "mfu": fmt(e.mfu_pct, 1) if e.mfu_pct is not None else None,
        "per_rank": _table(ranks, {
            "rank": "rank", "device": "device", "dtype": "dtype", "peak_tflops": "peak TFLOP/s",
            "model_tflop_per_step": "model GFLOP per step",
            "achieved_tflops": "achieved TFLOP/s", "mfu_pct": "MFU %",
            "mfu_range": "MFU % over its steps", "hfu_pct": "HFU %",
            "tokens_per_s": "tokens/s", "peak_source": "peak from"},
            left=("device", "dtype", "mfu_range", "peak_source"), digits=3, sortable=True,
            what="ranks"),
        **({"figure": _html(page.fig(fg.roofline_figure(e.per_class, e.per_module)))}
           if len(fg.roofline_points(e.per_class)) else {}),
        **_module_table(e.per_module),
        "per_class": _table(e.per_class.assign(flops=e.per_class["flops"] / 1e9,
                                               time_us=e.per_class["time_us"] / 1e3), {
            "op_class": "op class", "dtype": "dtype", "ops": "ops", "flops": "GFLOP",
            "time_us": "time (ms)", "time_basis": "time on", "achieved_tflops": "TFLOP/s",
            "achieved_gbps": "GB/s", "intensity": "FLOP/byte"},
            left=("op_class", "dtype", "time_basis"), digits=3, sortable=True, what="classes"),
        "notes": list(e.notes)}


#: Modules the page's table shows (the longest by time); the JSON holds them all.
PAGE_MODULES = 20


def _module_table(per_module: pd.DataFrame) -> dict:
    """``per_module`` (the page's table of the :data:`PAGE_MODULES` longest modules),
    ``modules_shown`` and ``modules_total``; nothing without module rows."""
    if per_module.empty:
        return {}
    top = per_module.head(PAGE_MODULES)
    top = top.assign(module=top["module"].fillna("(no known module)"),
                     module_class=top["module_class"].fillna("–"),
                     flops=top["flops"] / 1e9, time_us=top["time_us"] / 1e3,
                     inclusive_time_us=top["inclusive_time_us"] / 1e3)
    return {"modules_total": len(per_module), "modules_shown": len(top),
            "per_module": _table(top, {
        "module": "module", "module_class": "class", "ranks": "ranks", "ops": "ops",
        "flops": "GFLOP", "time_us": "time (ms)", "time_pct": "% of counted time",
        "inclusive_time_us": "with its submodules (ms)",
        "time_basis": "time on", "achieved_tflops": "TFLOP/s", "intensity": "FLOP/byte"},
        left=("module", "module_class", "time_basis"), digits=3, sortable=True, what="modules")}


def memory(report: Report, page: Page) -> dict:
    """Memory per rank (figure and table, MiB), the peak's definition, the imbalance across
    ranks (:class:`pardiag.analyzer.analyses.memory.MemoryResult`) and the timeline (the
    :data:`TIMELINE_MAX_RANKS` ranks with the highest peak, at most :data:`TIMELINE_POINTS`
    points)."""
    mem = report.memory
    m = mem.per_rank
    if not m[["static_bytes", "peak_allocated_bytes", "peak_bytes"]].notna().any().any():
        return {"known": False}
    out: dict = {"known": True, "peak_definition": mem.peak_definition,
                 "static_imbalance": fmt(mem.imbalance.get("static"), 3),
                 "peak_imbalance": fmt(mem.imbalance.get("peak"), 3)}
    if m["static_bytes"].notna().any():
        out["figure"] = _html(page.fig(fg.memory_figure(m)))
    out["table"] = _table(in_mib(m, ["params_bytes", "grads_bytes", "optimizer_state_bytes",
                                     "static_bytes", "peak_bytes", "peak_allocated_bytes",
                                     "peak_rss_bytes"]), {
        "rank": "rank", "params_bytes": "parameters (MiB)", "grads_bytes": "gradients (MiB)",
        "optimizer_state_bytes": "optimizer state (MiB)", "static_bytes": "static (MiB)",
        "peak_bytes": "peak (MiB)",
        "peak_allocated_bytes": "allocator's peak in traced window (MiB)",
        "peak_rss_bytes": "peak RSS (MiB)"}, digits=2, sortable=True, what="ranks")
    tl = mem.timeline
    if len(tl):
        notes = []
        ranks = tl["rank"].unique()
        if len(ranks) > TIMELINE_MAX_RANKS:
            peaks = tl.groupby("rank")["allocated_bytes"].max().sort_values(ascending=False)
            keep = sorted(peaks.index[:TIMELINE_MAX_RANKS])
            tl = tl[tl["rank"].isin(keep)]
            notes.append(_html(page.sample(
                f"Memory timeline sampled: the {TIMELINE_MAX_RANKS} ranks of {len(ranks)} with "
                f"the highest peak are drawn ({', '.join(map(str, keep))}).")))
        per = max(100, TIMELINE_POINTS // max(1, tl["rank"].nunique()))
        if tl.groupby("rank").size().max() > per:
            notes.append(_html(page.sample(f"Memory timeline thinned to at most {per} evenly "
                                           "spaced points per rank.")))
        out["timeline_notes"] = notes
        out["timeline"] = _html(page.fig(fg.memory_timeline(tl, per)))
    return out


def layout(report: Report, page: Page) -> dict:
    """Dimensions, strategies and nodes; what an inferred layout rests on; the groups with
    their bus bandwidth (:attr:`SyncResult.group_busbw`, GB/s); the nodes
    (:class:`pardiag.analyzer.analyses.layout.LayoutResult`)."""
    lay = report.layout
    known = bool(lay.dims or len(lay.groups))
    out: dict = {"known": known, "inferred": lay.source != "recorded", "source": lay.source,
                 "pipeline": lay.pipeline, "evidence": list(lay.evidence),
                 "not_inferred": list(lay.not_inferred)}
    if lay.pipeline:
        out["estimated"] = lay.pipeline.get("microbatches_from") == "sends"
    if known:
        out["dims"] = dims_text(lay.dims, lay.folded, " = ") or "unknown"
        out["strategies"] = ", ".join(map(str, lay.strategies)) or "unknown"
        out["nodes_text"] = ", ".join(f"{h}: {v}" for h, v in lay.nodes.items()) or "unknown"
        key = lay.groups["pg"].astype(str)
        bw = report.sync.group_busbw.set_index("pg")
        g = lay.groups.assign(
            ranks=lay.groups["ranks"].map(
                lambda rs: str(rs) if len(rs) <= 32 else f"{len(rs)} ranks: {rs[:8]}…"),
            busbw_median=key.map(bw["busbw_median"]).astype(float),
            busbw_max=key.map(bw["busbw_max"]).astype(float),
            count=key.map(bw["count"]).astype(float))
        out["groups"] = _table(g, {
            "pg": "group", "desc": "description", "dim": "dimension", "size": "size",
            "ranks": "ranks", "nodes": "nodes", "spans_nodes": "spans nodes",
            "busbw_median": "busbw median (GB/s)", "busbw_max": "busbw max (GB/s)",
            "count": "collectives measured"},
            left=("pg", "desc", "dim", "ranks"), digits=3, sortable=True, what="groups")
    if lay.nodes:
        out["nodes"] = _table(pd.DataFrame({"host": list(lay.nodes),
                                            "ranks": [str(v) for v in lay.nodes.values()]}),
                              {"host": "node", "ranks": "ranks"}, left=("host", "ranks"))
    return out


def bandwidth(report: Report, page: Page) -> dict:
    """The busbw scatter (at most :data:`BANDWIDTH_MAX_POINTS` instances, evenly spaced per
    collective) and the bandwidth table (:attr:`SyncResult.bandwidth`; ms, GB/s)."""
    sync = report.sync
    if not len(sync.instances):
        return {"matched": False}
    if not len(sync.bandwidth):
        return {"matched": True, "sized": False}
    out: dict = {"matched": True, "sized": True}
    inst = sync.instances.dropna(subset=["busbw_gbps"])
    if len(inst) > BANDWIDTH_MAX_POINTS:
        # every stride-th instance of each collective (a groupby-apply drops the grouping
        # column in pandas 3)
        stride = -(-len(inst) // BANDWIDTH_MAX_POINTS)
        keep = inst[(inst.groupby("op").cumcount() % stride == 0).to_numpy()]
        out["sampled"] = _html(page.sample(
            f"Bandwidth scatter sampled: {len(keep)} of {len(inst)} instances (evenly spaced "
            "per collective); the table covers all."))
        inst = keep
    out["figure"] = _html(page.fig(fg.bandwidth_figure(inst)))
    out["table"] = _table(in_ms(sync.bandwidth, ["transfer_us"]), {
        "pg": "group", "op": "collective", "bytes": "bytes", "inter_node": "intra/inter node",
        "count": "count", "transfer_us": "transfer (ms)", "algbw_gbps": "algbw (GB/s)",
        "busbw_gbps": "busbw (GB/s)"}, left=("pg", "op", "inter_node"), digits=3, sortable=True,
        what="(group, collective, size) rows")
    return out


def collectives(report: Report, page: Page) -> dict:
    """Collectives by type (:attr:`TimeBreakdown.collective_totals`), by rank and type, and the
    matched instances (ms, GB/s)."""
    b, sync = report.breakdown, report.sync
    if not len(b.collectives):
        return {"found": False}
    per = b.collectives.sort_values(["exposed_us", "rank"], ascending=[False, True])
    out: dict = {"found": True, "by_type": _table(
        in_ms(b.collective_totals, ["time_us", "exposed_us"]), {
            "collective": "collective", "ranks": "ranks", "count": "count",
            "time_us": "time, sum over ranks (ms)", "exposed_us": "exposed, sum over ranks (ms)",
            "exposed_pct": "exposed %"}, left=("collective",), digits=3, sortable=True,
        what="types"),
        "by_rank": _table(in_ms(per, ["time_us", "exposed_us"]), {
            "rank": "rank", "collective": "collective", "count": "count",
            "time_us": "time (ms)", "exposed_us": "exposed (ms)"}, left=("collective",),
            digits=3, sortable=True, what="rows (most exposed first)")}
    if len(sync.instances):
        inst = sync.instances.sort_values("arrival_skew_us", ascending=False)
        out["instances"] = _table(in_ms(inst, ["arrival_skew_us", "transfer_us"]), {
            "instance": "instance", "pg": "group", "op": "collective", "step": "step",
            "ranks": "ranks", "bytes": "bytes", "arrival_skew_us": "arrival skew (ms)",
            "transfer_us": "transfer (ms)", "last_rank": "last to arrive",
            "busbw_gbps": "busbw (GB/s)"}, left=("instance", "pg", "op"), digits=3,
            sortable=True, what="instances (largest arrival skew first)")
    return out


def hta(report: Report, page: Page) -> dict:
    """``report --hta``: HTA's idle time per stream and its kernel launch statistics per rank
    (:class:`pardiag.analyzer.analyses.hta_extras.HtaExtras`; ms, µs), and a line per HTA
    failure."""
    h = report.hta
    assert h is not None  # the section is drawn when --hta ran
    out: dict = {"version": h.hta_version or "", "delay": f"{h.consecutive_kernel_delay_us:g}",
                 "messages": list(h.messages)}
    if len(h.idle):
        out["idle"] = _table(in_ms(h.idle, ["idle_us"]), {
            "rank": "rank", "stream": "stream", "category": "idle category",
            "idle_us": "idle (ms)", "idle_pct": "share of the stream's idle (%)"},
            left=("category",), digits=3, sortable=True, what="rows")
    if len(h.launches):
        out["launches"] = _table(h.launches, {
            "rank": "rank", "launches": "launches", "cpu_us_median": "runtime call median (µs)",
            "gpu_us_median": "GPU event median (µs)",
            "launch_delay_us_median": "launch delay median (µs)",
            "launch_delay_us_p95": "launch delay p95 (µs)",
            "launch_delay_us_max": "launch delay max (µs)",
            "runtime_outliers": f"runtime calls > {h.runtime_cutoff_us:g} µs",
            "delay_outliers": f"delays > {h.launch_delay_cutoff_us:g} µs",
            "gpu_shorter": "GPU event shorter than its launch"},
            sortable=True, what="ranks")
    return out


def warnings(report: Report, page: Page) -> dict:
    """The loader's warnings (all) and the ranks' notes (the first :data:`MAX_NOTES`)."""
    traces = report.traces
    notes = [n for t in traces.ranks.values() for n in t.notes]
    return {"warnings": list(traces.warnings), "notes": notes[:MAX_NOTES],
            "shown": _html(shown(min(len(notes), MAX_NOTES), len(notes),
                                 "notes (every warning is listed)"))}


#: ``(key, builder)`` of every section with a figure or a sampling note, in page order (the
#: run summary is built after them; ``hta`` only when the report has it).
BUILDERS = (("verdict", verdict), ("breakdown", breakdown), ("overlap", overlap),
            ("stragglers", stragglers), ("critical_path", critical_path), ("causes", causes),
            ("pipeline", pipeline), ("imbalance", imbalance), ("routing", routing),
            ("efficiency", efficiency), ("memory", memory), ("layout", layout),
            ("bandwidth", bandwidth), ("collectives", collectives), ("hta", hta),
            ("warnings", warnings))


#: Sections about a structure a job may not have, and the key of their builder's output that
#: says it has it: without it the section moves to "Not in this run" at the page's end, where
#: it still says why, instead of an empty section among those that measured something.
STRUCTURE_SECTIONS = {"pipeline": "bubbles", "routing": "routed", "efficiency": "counted"}


def build(report: Report, page: Page) -> tuple[list[str], list[str], dict[str, dict]]:
    """The page's section keys in page order, the keys of the :data:`STRUCTURE_SECTIONS` this
    run does not have (shown last, each with why), and what each section's template shows."""
    keys = [k for k, _ in SECTIONS[:-1]] + (
        [HTA_SECTION[0]] if report.hta is not None else []) + [SECTIONS[-1][0]]
    out = {key: f(report, page) for key, f in BUILDERS if key in keys}
    out["summary"] = summary(report, page)
    absent = [k for k, flag in STRUCTURE_SECTIONS.items() if not out[k].get(flag)]
    return [k for k in keys if k not in absent], absent, out

