"""The one list of analyses: the report, the JSON output and the CLI read it.

Each analysis is a pure function ``(TraceSet, AnalysisOptions, earlier results) -> result``
registered here, in dependency order, with the function that turns its result into the keys it
adds to the JSON summary.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import pandas as pd

from ..analyses.breakdown import BREAKDOWN_COLUMNS, TimeBreakdown, compute_time_breakdown
from ..analyses.causes import CausesResult, compute_causes
from ..analyses.comm_events import P2P_OPS, comm_events
from ..analyses.critical_path import CriticalPathResult, compute_critical_path
from ..analyses.dim_overlap import DimOverlapResult, compute_dim_overlap
from ..analyses.efficiency import EfficiencyResult, compute_efficiency
from ..analyses.hta_extras import HtaExtras, compute_hta_extras, hta_json
from ..analyses.imbalance import BalanceResult, compute_balance
from ..analyses.infer_layout import InferredLayout, infer_layout, is_pardiag_run
from ..analyses.layout import LayoutResult, compute_layout
from ..analyses.memory import MemoryResult, compute_memory
from ..analyses.monitor_summary import capture_in_run
from ..analyses.operators import MAX_JSON_OPERATORS, OperatorsResult, compute_operators
from ..analyses.pipeline import PipelineResult, compute_pipeline, summarize_bubbles
from ..analyses.routing import RoutingResult, compute_routing
from ..analyses.runsetup import RunSetup, compute_setup
from ..analyses.stragglers import p2p_share
from ..analyses.sync import SyncResult, compute_sync
from ..predict.recommend import RecommendationResult, compute_recommendations
from ..trace.classify import device_kind
from ..trace.traceset import TraceSet
from . import schema as js

#: Version of the report JSON (``pardiag report --json``, :meth:`pardiag.Report.to_json`); its
#: own number, apart from the run folder's sidecars. 2: ``ranks[].device``; ``sync.straggler``,
#: ``notes``, ``p2p``; clock offsets relative to the lowest rank with ``residual_us`` and
#: ``host``; instances with ``group``, ``expected`` and ``complete``. 3: ``step`` (the step
#: time the recommendations compare with, and its samples), ``setup``, ``operators`` (what
#: ``pardiag compare`` reads from a summary).
REPORT_SCHEMA_VERSION = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnalysisOptions:
    """Options shared by all analyses.

    Attributes:
        comm_patterns: compiled regular expressions naming extra communication kernels.
        hta: also run the opt-in HTA analyses (idle time breakdown, kernel launch statistics).
    """

    comm_patterns: tuple[re.Pattern[str], ...] = ()
    #: run the opt-in HTA analyses (:mod:`pardiag.analyzer.analyses.hta_extras`; ``report --hta``)
    hta: bool = False
    #: a peak for every rank (dense TFLOP/s) over the device table's and the measured one
    #: (``report --peak-tflops``)
    peak_tflops: float | None = None
    #: tokens each rank processes per step, for tokens/s (``report --tokens-per-step``)
    tokens_per_step: float | None = None


@dataclasses.dataclass(frozen=True)
class Analysis:
    """One registered analysis: a name, the function computing it, and its JSON form
    (``to_json``: ``{field of ReportDocument: its typed value}``, the top-level keys it adds to
    the JSON summary, :mod:`.schema`)."""

    name: str
    compute: Callable[[TraceSet, AnalysisOptions, dict[str, Any]], Any]
    to_json: Callable[[Any, TraceSet], dict[str, Any]]


def _clean(v: Any) -> Any:
    """JSON-safe scalar: NaN/inf and pandas' NA become None, numpy scalars become Python
    numbers."""
    if v is pd.NA:
        return None
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def records(df: pd.DataFrame, columns: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Rows of ``df`` as JSON-safe dicts (NaN → None)."""
    cols = list(columns or df.columns)
    if not cols:
        return [{} for _ in range(len(df))]
    # column by column (one conversion to Python values each), then rows
    values = [[_clean(v) for v in df[c].tolist()] for c in cols]
    return [dict(zip(cols, row)) for row in zip(*values)]


_TOTAL_KEYS = BREAKDOWN_COLUMNS


_Row = TypeVar("_Row")


def rows(cls: type[_Row], df: pd.DataFrame, columns: Iterable[str] | None = None
         ) -> list[_Row]:
    """Rows of ``df`` as ``cls`` Structs (:func:`records`: NaN → None; values kept as they
    are, not converted to the fields' types).

    Raises:
        TypeError: a column that ``cls`` has no field for (the schema and the table differ)."""
    return [cls(**rec) for rec in records(df, columns)]


def _rows_by_rank(df: pd.DataFrame, columns: list[str]) -> dict[int, list[dict[str, Any]]]:
    """``{rank: its rows of df as records (columns)}``, rows in table order."""
    out: dict[int, list[dict[str, Any]]] = {}
    for r, rec in zip(df["rank"].tolist(), records(df, columns)):
        out.setdefault(r, []).append(rec)
    return out


def _breakdown_json(b: TimeBreakdown, traces: TraceSet) -> dict[str, Any]:
    """``ranks``, ``collectives``, ``step_time``: per rank its file, totals, steps and
    collectives."""
    # each table's rows converted once and handed to their rank (not a filter per rank)
    tot = _rows_by_rank(b.totals, ["domain", *_TOTAL_KEYS])
    steps = _rows_by_rank(b.steps, ["step", "start_us", "end_us", *_TOTAL_KEYS])
    colls = _rows_by_rank(b.collectives, ["collective", "count", "time_us", "exposed_us"])
    ranks = []
    for rank, trace in traces.ranks.items():
        total = dict(tot[rank][0]) if rank in tot else None
        ranks.append(js.RankEntry(
            rank=rank, file=str(trace.path), rank_source=trace.rank_source,
            domain=total.pop("domain") if total is not None else None,
            device=device_kind(trace),
            total=js.BreakdownTotals(**total) if total is not None else js.BreakdownTotals(),
            steps=[js.StepBreakdown(**s) for s in steps.get(rank, [])],
            collectives=[js.RankCollective(**c) for c in colls.get(rank, [])]))
    return {"ranks": ranks, "collectives": rows(js.CollectiveTotal, b.collective_totals),
            "step_time": rows(js.StepTimeRow, b.step_time),
            "run_steps": rows(js.RunStepRow, b.run_steps),
            "devices": rows(js.DeviceRow, b.devices)}


def _sync_json(r: SyncResult, traces: TraceSet) -> dict[str, Any]:
    return {"sync": js.SyncSection(
        matched_by=r.matched_by,
        straggler=r.straggler,
        notes=list(r.notes),
        clock_offsets=rows(js.ClockOffset, r.offsets),
        stragglers=rows(js.StragglerRow, r.stragglers),
        instances=rows(js.InstanceRow, r.instances),
        bandwidth=rows(js.BandwidthRow, r.bandwidth),
        p2p=rows(js.P2PLink, r.p2p),
        skew=rows(js.SkewRow, r.skew),
    )}


def _pipeline_json(r: PipelineResult, traces: TraceSet) -> dict[str, Any]:
    return {"pipeline": None if r.bubbles.empty else js.PipelineSection(
        schedule=None if r.schedule is None else js.PipelineSchedule(**r.schedule),
        summary=rows(js.BubbleSummary, summarize_bubbles(r.bubbles)),
        bubbles=rows(js.BubbleRow, r.bubbles))}


def _balance_json(r: BalanceResult, traces: TraceSet) -> dict[str, Any]:
    return {"imbalance": js.ImbalanceSection(summary=rows(js.ImbalanceSummary, r.summary),
                                             groups=rows(js.ImbalanceStep, r.groups),
                                             skew_origin=rows(js.SkewOrigin, r.skew))}


def _causes_json(r: CausesResult, traces: TraceSet) -> dict[str, Any]:
    input_bound: dict[str, Any] | None = None if r.input_bound is None else {
        k: ({str(a): _clean(b) for a, b in v.items()} if isinstance(v, dict)
            else _clean(v) if not isinstance(v, list) else v)
        for k, v in r.input_bound.items()}
    host_bound: dict[str, Any] | None = None if r.host_bound is None else {
        k: _clean(v) if not isinstance(v, list) else v for k, v in r.host_bound.items()}
    return {"causes": js.CausesSection(
        per_rank=rows(js.CauseRank, r.per_rank), per_step=rows(js.CauseStep, r.per_step),
        excess=rows(js.CauseExcess, r.excess),
        input_bound=None if input_bound is None else js.InputBound(**input_bound),
        host_bound=None if host_bound is None else js.HostBound(**host_bound))}


def _run_step_us(b: TimeBreakdown) -> float:
    """The run's median step (µs; per step the slowest rank's span), NaN without steps."""
    st = b.step_time
    run = st[st["rank"].isna()] if len(st) else st
    return float(run["median_us"].iloc[0]) if len(run) else float("nan")


def _memory_json(r: MemoryResult, traces: TraceSet) -> dict[str, Any]:
    return {"memory": js.MemorySection(
        per_rank=rows(js.MemoryRank, r.per_rank),
        imbalance=js.MemoryImbalance(**{k: _clean(v) for k, v in r.imbalance.items()}),
        peak_definition=r.peak_definition)}


def _layout_json(r: LayoutResult, traces: TraceSet) -> dict[str, Any]:
    out: dict[str, Any] = {"source": r.source, "dims": r.dims, "strategies": r.strategies,
           "pipeline": None if r.pipeline is None else js.LayoutPipeline(**r.pipeline),
           "nodes": r.nodes, "groups": rows(js.ProcessGroupRow, r.groups),
           "folded": r.folded}
    if r.source != "recorded":
        out["pipeline"] = (None if r.pipeline is None else js.LayoutPipeline(
            **{**r.pipeline, "stage_ranks": {str(k): v for k, v in
                                             r.pipeline["stage_ranks"].items()}}))
        out["evidence"] = list(r.evidence)
        out["not_inferred"] = list(r.not_inferred)
        out["note"] = ("the layout was not recorded by pardiag: it is inferred from what the "
                       "traces show (evidence), and not_inferred lists what they do not")
    return {"layout": js.LayoutSection(**out)}


def _pipeline(traces: TraceSet, opts: AnalysisOptions, done: dict[str, Any]) -> PipelineResult:
    sync: SyncResult = done["sync"]
    p2p = set()
    if len(sync.per_rank):
        p2p_inst = sync.instances.loc[sync.instances["op"].isin(P2P_OPS), "instance"]
        p2p = set(sync.per_rank.loc[sync.per_rank["instance"].isin(p2p_inst), "rank"])
    inferred: InferredLayout = done["inferred_layout"]
    if not is_pardiag_run(traces):
        p2p |= set(inferred.pp_ranks)
    recorded = (traces.run_info.layout if traces.run_info else None) or {}
    if inferred.p2p_role != "pp" and not recorded.get("pipeline"):
        p2p = set()   # ring attention's messages (or unknown ones): no pipeline of them
    return compute_pipeline(traces, dict(zip(sync.offsets["rank"], sync.offsets["offset_us"])),
                            done["time_breakdown"].steps, p2p, inferred)


#: At most this many path segments in the JSON (the latest steps' first).
MAX_JSON_PATH_SEGMENTS = 2000


def _critical_path_json(r: CriticalPathResult, traces: TraceSet) -> dict[str, Any]:
    """``critical_path`` (:class:`CriticalPathResult`; µs, %)."""
    return {"critical_path": js.CriticalPathSection(
        summary=r.describe() or None, steps=rows(js.PathStep, r.steps),
        shares=rows(js.PathShare, r.shares), slack=rows(js.PathSlack, r.slack),
        delay_costs=rows(js.PathDelay, r.delay_costs),
        segments=rows(js.PathSegment, r.segments.tail(MAX_JSON_PATH_SEGMENTS)),
        segments_total=len(r.segments), notes=list(r.notes),
        note=r.why_none or None)}


def _dim_overlap_json(r: DimOverlapResult, traces: TraceSet) -> dict[str, Any]:
    return {"overlap_per_dimension": js.DimOverlapSection(
        summary=rows(js.DimOverlapSummary, r.summary),
        per_rank=rows(js.DimOverlapRank, r.per_rank), note=r.why_none or None)}


def _routing_json(r: RoutingResult, traces: TraceSet) -> dict[str, Any]:
    """``routing`` (:class:`RoutingResult`; rows in the unit of each group, µs), or None
    without routed all-to-alls and notes about them."""
    if r.groups.empty:
        return {"routing": None if not r.notes else js.RoutingSection(notes=list(r.notes))}
    return {"routing": js.RoutingSection(
        groups=rows(js.RoutingGroup, r.groups), steps=rows(js.RoutingStep, r.steps),
        per_rank=rows(js.RoutingRank, r.per_rank),
        instances=rows(js.RoutingInstance, r.instances),
        matrix=rows(js.RoutingCell, r.matrix), notes=list(r.notes), finding=r.describe())}


def _recommendation(rec: dict[str, Any]) -> js.RecommendationEntry:
    """A :meth:`Recommendation.to_json` dict as its Struct (``params`` and ``batch`` too)."""
    batch = rec.get("batch") or {}
    sizes = {k: js.BatchSize(**v) if k != "optimizer_steps_per_sample" else js.BatchFactor(**v)
             for k, v in batch.items() if isinstance(v, dict)}
    return js.RecommendationEntry(**{
        **rec, "params": js.RecommendationParams(**rec.get("params") or {}),
        "batch": js.BatchEffect(**{**batch, **sizes})})


def _recommendations_json(r: RecommendationResult, traces: TraceSet) -> dict[str, Any]:
    step: dict[str, Any] | None = None if r.step is None else {
        k: _clean(v) if not isinstance(v, list) else v for k, v in r.step.to_json().items()}
    return {"verdict": r.verdict,
            "straggler": r.straggler,
            "step": js.MeasuredStep(**step) if step is not None else None,
            "recommendations": [_recommendation(c.to_json()) for c in r.recommendations],
            "not_recommended": [_recommendation(c.to_json()) for c in r.rejected],
            "recommendations_note": r.why_none or None,
            "recommendations_not_evaluated": r.not_evaluated or None,
            "recommendations_rule": r.noise_rule or None,
            "step_noise_us": r.noise_us if not math.isnan(r.noise_us) else None,
            "min_gain_pct": r.min_gain_pct if not math.isnan(r.min_gain_pct) else None,
            "peak_definition": r.peak_definition or None}


def _operators_json(r: OperatorsResult, traces: TraceSet) -> dict[str, Any]:
    return {"operators": js.OperatorsSection(
        rank_steps=r.rank_steps, total=len(r.totals),
        rows=rows(js.OperatorRow, r.totals.head(MAX_JSON_OPERATORS)))}


def _efficiency_json(r: EfficiencyResult, traces: TraceSet) -> dict[str, Any]:
    return {"efficiency": js.EfficiencySection(
        mfu_pct=_clean(r.mfu_pct) if r.mfu_pct is not None else None,
        per_rank=rows(js.EfficiencyRank, r.per_rank),
        per_step=rows(js.EfficiencyStep, r.per_step.astype({"step": int})),
        per_class=rows(js.EfficiencyClass, r.per_class),
        per_module=rows(js.EfficiencyModule, r.per_module), notes=list(r.notes))}


def _hta_json(r: HtaExtras, traces: TraceSet) -> dict[str, Any]:
    h = hta_json(r)["hta"]
    return {"hta": js.HtaSection(**{**h, "idle": [js.HtaIdle(**x) for x in h["idle"]],
                                    "launches": [js.HtaLaunches(**x) for x in h["launches"]]})}


def _critical_path(traces: TraceSet, opts: Any, done: dict[str, Any]) -> CriticalPathResult:
    """The critical path; in a pipeline the synchronization result (``done["sync"]``, read by
    every later analysis) takes the straggler the execution graph's delay costs name, or none
    (:meth:`SyncResult.with_graph_straggler`)."""
    cp = compute_critical_path(traces, done["time_breakdown"], done["sync"], done["layout"],
                               opts.comm_patterns)
    step = cp.steps["measured_us"].median() if len(cp.steps) else None
    named = done["sync"].straggler
    pipeline = bool(cp.graphs) and p2p_share(done["sync"].per_rank) >= 0.5
    done["sync"] = done["sync"].with_graph_straggler(
        cp.delay_costs if cp.graphs else None, step,
        cp.work_cost(int(named)) if named is not None and cp.graphs else None,
        cp.outside_costs() if pipeline else None)
    return cp


ANALYSES: tuple[Analysis, ...] = (
    Analysis("time_breakdown",
             lambda traces, opts, done: compute_time_breakdown(traces, opts.comm_patterns),
             _breakdown_json),
    Analysis("operators", lambda traces, opts, done: compute_operators(traces),
             _operators_json),
    Analysis("sync", lambda traces, opts, done: compute_sync(traces, opts.comm_patterns),
             _sync_json),
    Analysis("inferred_layout", lambda traces, opts, done: infer_layout(
        traces, comm_events(traces, opts.comm_patterns)),
             lambda r, traces: {}),   # shown through "layout" and "pipeline"
    Analysis("pipeline", _pipeline, _pipeline_json),
    Analysis("balance", lambda traces, opts, done: compute_balance(
        traces, done["time_breakdown"].steps, done["sync"]), _balance_json),
    Analysis("causes", lambda traces, opts, done: compute_causes(
        traces, _run_step_us(done["time_breakdown"])), _causes_json),
    Analysis("memory", lambda traces, opts, done: compute_memory(traces), _memory_json),
    Analysis("layout", lambda traces, opts, done: compute_layout(traces, done["inferred_layout"]),
             _layout_json),
    Analysis("setup", lambda traces, opts, done: compute_setup(traces, done["layout"]),
             lambda r, traces: {"setup": js.SetupSection(**r.to_json())}),
    Analysis("dim_overlap", lambda traces, opts, done: compute_dim_overlap(
        traces, done["sync"], done["layout"], opts.comm_patterns), _dim_overlap_json),
    Analysis("critical_path", _critical_path, _critical_path_json),
    Analysis("routing", lambda traces, opts, done: compute_routing(
        traces, done["sync"], done["layout"]), _routing_json),
    Analysis("efficiency", lambda traces, opts, done: compute_efficiency(
        traces, opts.peak_tflops, opts.tokens_per_step), _efficiency_json),
    Analysis("recommendations", lambda traces, opts, done: compute_recommendations(traces, done),
             _recommendations_json),
)


#: Opt-in analyses, run after ANALYSES only when their AnalysisOptions flag is set:
#: (flag, analysis). Their JSON keys appear only when they ran.
OPT_IN: tuple[tuple[str, Analysis], ...] = (
    ("hta", Analysis("hta", lambda traces, opts, done: compute_hta_extras(
        traces, opts.comm_patterns), _hta_json)),
)


@dataclasses.dataclass(frozen=True)
class Report:
    """Everything a report shows: the loaded traces and one typed field per analysis (the HTML,
    terminal and JSON renderers only format these; :class:`pardiag.Report` adds the notebook
    conveniences).

    Attributes:
        traces: the loaded run.
        time_breakdown: per rank, step and collective type (:class:`TimeBreakdown`).
        sync: matched collectives, clock offsets, stragglers, bandwidth (:class:`SyncResult`).
        inferred_layout: the layout read from traces recorded without pardiag
            (:class:`InferredLayout`).
        pipeline: bubbles per rank and step (:class:`PipelineResult`).
        balance: load imbalance per group (:class:`BalanceResult`).
        causes: where each rank's step goes on the host, why its device idles, the cross-rank
            excess, input- and host-bound findings (:class:`CausesResult`).
        memory: static and peak memory per rank (:class:`MemoryResult`).
        layout: dimensions, strategies, groups, nodes (:class:`LayoutResult`).
        dim_overlap: overlap per parallel dimension (:class:`DimOverlapResult`).
        critical_path: the cross-rank critical path of each step, its slack and replay
            (:class:`CriticalPathResult`).
        recommendations: verdict and ranked changes (:class:`RecommendationResult`).
        operators: time per GPU kernel and CPU operator name (:class:`OperatorsResult`).
        routing: expert-parallel routing imbalance from the all-to-alls' split sizes
            (:class:`RoutingResult`).
        setup: what was run and on what (:class:`RunSetup`).
        efficiency: FLOPs, MFU and the roofline per op class (:class:`EfficiencyResult`).
        hta: HTA's idle time breakdown and kernel launch statistics (:class:`HtaExtras`), only
            with ``AnalysisOptions(hta=True)`` (``report --hta``), else None.
    """

    traces: TraceSet
    time_breakdown: TimeBreakdown
    sync: SyncResult
    inferred_layout: InferredLayout
    pipeline: PipelineResult
    balance: BalanceResult
    causes: CausesResult
    memory: MemoryResult
    layout: LayoutResult
    dim_overlap: DimOverlapResult
    critical_path: CriticalPathResult
    recommendations: RecommendationResult
    operators: OperatorsResult
    setup: RunSetup
    routing: RoutingResult
    efficiency: EfficiencyResult
    hta: HtaExtras | None = None

    @property
    def breakdown(self) -> TimeBreakdown:
        """The time breakdown (same as :attr:`time_breakdown`)."""
        return self.time_breakdown

    @property
    def results(self) -> dict[str, Any]:
        """``{analysis name: result}`` in registry order (a view of the fields; opt-in
        analyses only when they ran)."""
        out = {a.name: getattr(self, a.name) for a in ANALYSES}
        out.update({a.name: getattr(self, a.name) for _, a in OPT_IN
                    if getattr(self, a.name, None) is not None})
        return out


_R = TypeVar("_R", bound=Report)


# (a TypeVar's default class: mypy cannot check a default against every subclass it may be)
def build_report(traces: TraceSet, options: AnalysisOptions = AnalysisOptions(),
                 cls: type[_R] = Report) -> _R:  # type: ignore[assignment]
    """Run every registered analysis on ``traces``, in registry order, into a ``cls`` (a
    :class:`Report` or a subclass). A deep capture reported alone gains where it lies against
    its run's findings (``capture["against_findings"]``,
    :func:`~pardiag.analyzer.analyses.monitor_summary.capture_in_run`)."""
    if traces.capture is not None and "against_findings" not in traces.capture:
        traces = dataclasses.replace(traces, capture={
            **traces.capture, "against_findings": capture_in_run(traces.capture)})
    results: dict[str, Any] = {}
    for a in ANALYSES:
        results[a.name] = a.compute(traces, options, results)
    for flag, a in OPT_IN:
        if getattr(options, flag):
            results[a.name] = a.compute(traces, options, results)
    return cls(traces=traces, **results)


def report_document(report: Report) -> js.ReportDocument:
    """The JSON summary as its type (:class:`.schema.ReportDocument`): run-level keys plus each
    analysis' own keys, every row a Struct (:mod:`.schema` documents each field and its unit).

    Raises:
        TypeError: an analysis wrote a key the schema has no field for.
    """
    joined = report.time_breakdown.joined_text()
    fields: dict[str, Any] = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "source": report.traces.source,
        "warnings": [*report.traces.warnings, *report.time_breakdown.devices_text(),
                     *filter(None, [report.time_breakdown.host_only_text()])],
        "notes": [*(n for t in report.traces.ranks.values() for n in t.notes),
                  *([f"Steps: {joined}"] if joined else [])],
        "run": report.traces.run_info,
        "capture": (js.CaptureInfo(**report.traces.capture)
                    if report.traces.capture is not None else None),
    }
    for a in ANALYSES:
        fields.update(a.to_json(getattr(report, a.name), report.traces))
    for _, a in OPT_IN:
        if getattr(report, a.name, None) is not None:
            fields.update(a.to_json(getattr(report, a.name), report.traces))
    return js.ReportDocument(**fields)


def report_json(report: Report) -> dict[str, Any]:
    """The JSON summary as plain Python values (:func:`report_document` through
    :func:`.schema.to_builtins`: dicts in field order, NaN kept for the writer to write as
    null, keys written only in some cases left out).

    Shape::

        {"schema_version", "source", "warnings": [...], "notes": [...], "run": {...} | null,
         "capture": {...} | null,
         "ranks": [{"rank", "file", "rank_source", "domain",
                    "total": {"span_us", "compute_us", "comm_us", "overlap_us",
                              "compute_only_us", "exposed_comm_us", "memory_only_us",
                              "idle_us", "overlap_pct", "compute_only_pct", "overlap_share_pct",
                              "exposed_comm_pct", "memory_only_pct", "idle_pct"},
                    "steps": [{"step", "start_us", "end_us", ...the same keys}],
                    "collectives": [{"collective", "count", "time_us", "exposed_us"}]}]}

    Durations in µs; ``overlap_pct`` in % of communication time, the other ``*_pct`` in % of the
    window; null where undefined (no communication).

    Raises:
        TypeError: an analysis wrote a key the schema has no field for.
    """
    doc: dict[str, Any] = js.to_builtins(report_document(report))
    return doc
