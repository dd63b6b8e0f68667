"""Pipeline bubbles per rank and step, measured from pardiag's schedule records.

For profiler step *s*, the pipeline's window runs from the first forward chunk start to the last
backward chunk end over all ranks (clocks aligned by :mod:`pardiag.analyzer.analyses.sync`). A
rank's **bubble** is the part of the window in which none of its stages runs a forward or backward
chunk: ``bubble = window − |union of its chunks|``; its share is ``bubble / window``.

The bubble is split at two moments of the rank's own schedule: its first backward start (b1)
and its last forward end (b2). With 1F1B-style schedules (b1 ≤ b2) the phases are warmup
``[start, b1)``, steady state ``[b1, b2)`` and cooldown ``[b2, end]``; with GPipe (all forwards
before any backward, b2 < b1) they are the forward phase ``[start, b2)``, the turn-around
``[b2, b1)`` and the backward phase ``[b1, end]``.

The ideal share of a measured step is its own action order replayed with balanced stage costs
and free transfers (:func:`pardiag.analyzer.analyses.schedule_replay.replay_ideal`), for any
schedule; where no order is recorded (an estimate), or it does not replay, the formula
(Narayanan et al., SC'21): ``(p − 1) / (m + p − 1)`` for GPipe and 1F1B and
``(p − 1) / (v·m + p − 1)`` interleaved, with p pipeline ranks, m microbatches and v stages per
rank, for those schedules only: another schedule's ideal is then unknown (NaN).
``schedule["ideal_from"]`` says which (``"replay"`` or ``"formula"``; None when neither).

Schedule records cover every optimizer step, not only the profiled ones (``profiled`` says
which): the torch profiler slows CPU pipelines down by a factor that grows over the active
window, so the unprofiled steps time the schedule as it runs without pardiag, and summaries
use them (:func:`summarize_bubbles`). The first step is
left out when there are more than two (it also allocates the stages' buffers); so are, as
"clean" steps, the profiler's warm-up steps and the step after the window (the trace's export).

Traces recorded without pardiag (:mod:`pardiag.analyzer.analyses.infer_layout`) are measured the
same way from their per-microbatch ranges (GPipe's ``Forward i``/``Backward i``, the action
runtime's ``PP:{stage}F{mb}``), less the wait for each chunk's input; the schedule then carries
``"source": "inferred from traces"``.

Runs without schedule records or ranges get an **estimate** on pipeline ranks (those exchanging
point-to-point messages): idle plus exposed communication over the step (see
:mod:`pardiag.analyzer.analyses.breakdown`), labelled as such.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..trace import intervals as iv
from ..trace.classify import normalize_schedule
from ..trace.traceset import TraceSet
from .infer_layout import InferredLayout, is_pardiag_run
from .schedule_replay import replay_ideal

BUBBLE_COLUMNS = ("rank", "stages", "step", "window_us", "busy_us", "bubble_us", "bubble_pct",
                  "warmup_bubble_us", "steady_bubble_us", "cooldown_bubble_us", "ideal_pct",
                  "method", "profiled", "clean")
#: Columns of :func:`summarize_bubbles` (:attr:`PipelineResult.summary`).
SUMMARY_COLUMNS = ("rank", "stages", "steps", "basis", "bubble_pct", "ideal_pct", "warmup_us",
                   "steady_us", "cooldown_us", "window_us")
#: Columns of :func:`bubble_gaps` (:attr:`PipelineResult.gaps`).
GAP_COLUMNS = ("step", "rank", "start_us", "end_us")


def ideal_bubble_pct(p: int, m: int, v: int = 1) -> float:
    """Ideal bubble share of the step (%): 100·(p−1)/(v·m + p − 1) (Narayanan et al., SC'21)."""
    if p <= 1 or m <= 0:
        return 0.0
    return 100.0 * (p - 1) / (v * m + p - 1)


def _has_formula(schedule: str | None) -> bool:
    """Whether :func:`ideal_bubble_pct` is the ideal of ``schedule``: GPipe, 1F1B and
    Interleaved1F1B; any other (split backward, V placement, looped BFS, a described order) has
    its own ideal, which only a replay of its order gives."""
    try:
        normalize_schedule(schedule)
    except ValueError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class PipelineResult:
    """Result of :func:`compute_pipeline`.

    Attributes:
        bubbles: per rank and step, :data:`BUBBLE_COLUMNS` (µs, %; ``method`` is ``"measured"``
            or ``"estimate"``; ``stages`` a comma-separated list of the rank's stages).
        chunks: the schedule records on the aligned clock: ``rank``, ``stage``, ``microbatch``,
            ``phase`` (F, B, I, W), ``step``, ``start_us``, ``end_us`` (for the Gantt chart).
        schedule: ``{"schedule", "p", "m", "v"}`` used for the ideal, or None.
        summary: per rank, the medians of :func:`summarize_bubbles` (µs, %; the page and the
            terminal show it, the JSON's ``pipeline.summary`` is the same table).
        gaps: per step and rank, each bubble interval: ``step``, ``rank``, ``start_us``,
            ``end_us`` (aligned clock, µs; :func:`bubble_gaps`; the Gantt chart's red bars).
        typical_step: the step the Gantt chart draws (:func:`typical_step`), None without
            chunks.
    """

    bubbles: pd.DataFrame
    chunks: pd.DataFrame
    schedule: dict | None
    summary: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=list(SUMMARY_COLUMNS)))
    gaps: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=list(GAP_COLUMNS)))
    typical_step: int | None = None

    @property
    def phase_names(self) -> tuple[str, str, str]:
        """The names of the bubble's three phases (``warmup_us``, ``steady_us``, ``cooldown_us``
        of :attr:`summary`), from the order that ran: ``("warmup", "steady", "cooldown")``
        where every rank starts a backward before its last forward ends (1F1B-style),
        ``("forward phase", "turn-around", "backward phase")`` where every rank ends all its
        forwards first (GPipe), ``("head", "middle", "tail")`` when the ranks or steps differ
        or no chunk was recorded."""
        c = self.chunks
        if c is None or c.empty:
            return ("head", "middle", "tail")
        fwd = c[c["phase"] == "F"].groupby(["step", "rank"])["end_us"].max()
        bwd = c[c["phase"].isin(["B", "I"])].groupby(["step", "rank"])["start_us"].min()
        both = pd.concat([fwd.rename("f"), bwd.rename("b")], axis=1).dropna()
        if both.empty:
            return ("head", "middle", "tail")
        first = both["f"] < both["b"]
        if first.all():
            return ("forward phase", "turn-around", "backward phase")
        if not first.any():
            return ("warmup", "steady", "cooldown")
        return ("head", "middle", "tail")


def _schedule(traces: TraceSet, chunks: pd.DataFrame,
              inferred: InferredLayout | None = None) -> dict | None:
    lay = (traces.run_info.layout if traces.run_info else None) or {}
    pipe = lay.get("pipeline") or {}
    if not pipe and inferred is not None and inferred.pipeline and not is_pardiag_run(traces):
        pipe = inferred.pipeline
        sched = {"schedule": pipe["schedule"], "p": pipe["pp_group_size"],
                 "m": pipe["microbatches"], "v": pipe["stages_per_rank"],
                 "stages": pipe["stages"], "source": inferred.source}
        if pipe.get("microbatches_from") == "sends":
            sched["microbatches_estimated"] = True
        return sched
    if chunks.empty and not pipe:
        return None
    stages = pipe.get("stages") or (int(chunks["stage"].max()) + 1 if len(chunks) else None)
    p = pipe.get("pp_group_size") or (chunks["rank"].nunique() if len(chunks) else None)
    m = pipe.get("microbatches") or (int(chunks["microbatch"].max()) + 1 if len(chunks) else None)
    v = pipe.get("stages_per_rank") or (stages // p if stages and p else 1)
    return {"schedule": pipe.get("schedule"), "p": p, "m": m, "v": v, "stages": stages}


def summarize_bubbles(bubbles: pd.DataFrame) -> pd.DataFrame:
    """Median bubble per rank over the clean steps when there are any; else over the profiled
    steps (a run that ended with its window: the warm-up steps and the step after the window,
    which waits for the trace's export, still left out); else over all steps.

    Returns:
        ``rank``, ``stages``, ``steps`` (count used), ``basis`` (``"unprofiled"``,
        ``"profiled"`` or ``"all"``), ``bubble_pct``, ``ideal_pct``, ``warmup_us``,
        ``steady_us``, ``cooldown_us``, ``window_us`` (medians).
    """
    profiled = bubbles["profiled"].astype(bool)
    if bubbles["clean"].any():
        use, basis = bubbles[bubbles["clean"]], "unprofiled"
    elif profiled.any():
        use, basis = bubbles[profiled], "profiled"
    else:
        use, basis = bubbles, "all"
    out = (use.groupby(["rank", "stages"], as_index=False)
           .agg(steps=("step", "nunique"), bubble_pct=("bubble_pct", "median"),
                ideal_pct=("ideal_pct", "first"), warmup_us=("warmup_bubble_us", "median"),
                steady_us=("steady_bubble_us", "median"),
                cooldown_us=("cooldown_bubble_us", "median"), window_us=("window_us", "median")))
    out.insert(3, "basis", basis)
    return out


def bubble_gaps(chunks: pd.DataFrame) -> pd.DataFrame:
    """Each rank's bubbles in each step as intervals: the step's window (first chunk start to
    last chunk end over all ranks, the window of the module docstring) minus the union of the
    rank's chunks (:func:`pardiag.analyzer.trace.intervals.subtract`); their lengths add up to
    the rank's ``bubble_us`` of that step.

    Args:
        chunks: :attr:`PipelineResult.chunks` (aligned clock, µs).

    Returns:
        :data:`GAP_COLUMNS`: ``step``, ``rank``, ``start_us``, ``end_us`` (µs, aligned clock),
        by step, rank and time.
    """
    rows = []
    for step, sc in chunks.groupby("step", sort=True):
        window = np.array([[sc["start_us"].min(), sc["end_us"].max()]], dtype=float)
        for rank, rc in sc.groupby("rank", sort=True):
            busy = iv.union(rc["start_us"].to_numpy(), rc["end_us"].to_numpy())
            rows += [(int(step), rank, a, b) for a, b in iv.subtract(window, busy)]
    return pd.DataFrame(rows, columns=list(GAP_COLUMNS))


def typical_step(bubbles: pd.DataFrame) -> int | None:
    """The middle one (``sorted[n // 2]``) of the clean steps of ``bubbles``, else of all its
    steps: a step that runs as the run does without the profiler where there is one (the
    summary's basis). None for an empty table."""
    if bubbles.empty:
        return None
    clean = sorted(bubbles.loc[bubbles["clean"].astype(bool), "step"].unique())
    pool = clean or sorted(bubbles["step"].unique())
    return int(pool[len(pool) // 2])


def compute_pipeline(traces: TraceSet, offsets: dict[int, float] | None = None,
                     breakdown_steps: pd.DataFrame | None = None,
                     p2p_ranks: set[int] | None = None,
                     inferred: InferredLayout | None = None) -> PipelineResult:
    """Bubbles per rank and step (see the module docstring).

    Args:
        traces: the run; schedule records come from its ``pipeline`` sidecars.
        offsets: ``{rank: clock offset µs}`` to subtract (from :func:`sync.compute_sync`).
        breakdown_steps: per-step breakdown (for the estimate when there are no records).
        p2p_ranks: ranks that exchange point-to-point messages (pipeline ranks, for the estimate).
        inferred: the layout inferred from traces recorded without pardiag; its chunks are used
            where the run has no schedule records.
    """
    offsets = offsets or {}
    rows = []
    for rank, doc in sorted(traces.sidecars.get("pipeline", {}).items()):
        off = offsets.get(rank, 0.0)
        for r in doc.records:
            rows.append({"rank": rank, "stage": r.stage, "microbatch": r.microbatch,
                         "phase": r.phase, "step": r.optimizer_step,
                         "start_us": r.start_us - off, "end_us": r.end_us - off,
                         "profiled": bool(r.profiled)})
    if not rows and inferred is not None and not is_pardiag_run(traces):
        for r in inferred.chunks.itertuples(index=False):
            off = offsets.get(r.rank, 0.0)
            rows.append({"rank": int(r.rank), "stage": int(r.stage),
                         "microbatch": int(r.microbatch), "phase": r.phase, "step": int(r.step),
                         "start_us": r.start_us - off, "end_us": r.end_us - off,
                         "profiled": True})
    chunks = pd.DataFrame(rows, columns=["rank", "stage", "microbatch", "phase", "step",
                                         "start_us", "end_us", "profiled"])
    chunks = chunks[chunks["step"] >= 0].reset_index(drop=True) if len(chunks) else chunks
    sched = _schedule(traces, chunks, inferred)
    ideal = (ideal_bubble_pct(sched["p"], sched["m"], sched["v"])
             if sched and sched["p"] and sched["m"] and _has_formula(sched.get("schedule"))
             else float("nan"))
    out = []
    replays = False   # some step's own order replayed (the ideal is then the replay's)
    prof_steps = set(chunks.loc[chunks["profiled"], "step"])
    after_window = max(prof_steps) + 1 if prof_steps else None
    sch = traces.run_info.schedule if traces.run_info else None
    # the profiler's warm-up steps: it is already set up (on a GPU CUPTI runs), not yet tracing
    warmup = set(range(sch.wait, sch.wait + sch.warmup)) if sch is not None else set()
    for step, sc in chunks.groupby("step"):
        if step == 0 and chunks["step"].nunique() > 2:
            continue  # the first step also builds the stages' buffers: not the steady schedule
        lo, hi = float(sc["start_us"].min()), float(sc["end_us"].max())
        replayed = replay_ideal(sc)
        replays |= replayed is not None
        profiled = bool(sc["profiled"].all())
        # undisturbed: unprofiled, not a warm-up step of the profiler, and not the step after
        # the window (it waits for the trace export and the live-object scans)
        clean = not profiled and step != after_window and step not in warmup
        window = hi - lo
        for rank, rc in sc.groupby("rank"):
            busy = iv.union(rc["start_us"].to_numpy(), rc["end_us"].to_numpy())
            bwd = rc[rc["phase"].isin(["B", "I"])]
            fwd = rc[rc["phase"] == "F"]
            b1 = float(bwd["start_us"].min()) if len(bwd) else hi
            b2 = float(fwd["end_us"].max()) if len(fwd) else lo
            cuts = [lo, min(b1, b2), max(b1, b2), hi]
            phase_bubble = [(cuts[i + 1] - cuts[i]) - iv.total(iv.clip(busy, cuts[i], cuts[i + 1]))
                            for i in range(3)]
            busy_us = iv.total(busy)
            out.append({"rank": rank,
                        "stages": ",".join(str(s) for s in sorted(rc["stage"].unique())),
                        "step": int(step), "window_us": window, "busy_us": busy_us,
                        "bubble_us": window - busy_us,
                        "bubble_pct": 100.0 * (window - busy_us) / window if window > 0 else np.nan,
                        "warmup_bubble_us": phase_bubble[0], "steady_bubble_us": phase_bubble[1],
                        "cooldown_bubble_us": phase_bubble[2],
                        "ideal_pct": replayed.get(rank, ideal) if replayed else ideal,
                        "method": "measured", "profiled": profiled, "clean": clean})
    if chunks.empty and breakdown_steps is not None and p2p_ranks:
        est = breakdown_steps[breakdown_steps["rank"].isin(p2p_ranks)]
        for r in est.itertuples():
            bubble = r.idle_us + r.exposed_comm_us
            out.append({"rank": r.rank, "stages": "", "step": int(r.step), "window_us": r.span_us,
                        "busy_us": r.span_us - bubble, "bubble_us": bubble,
                        "bubble_pct": 100.0 * bubble / r.span_us if r.span_us > 0 else np.nan,
                        "warmup_bubble_us": np.nan, "steady_bubble_us": np.nan,
                        "cooldown_bubble_us": np.nan, "ideal_pct": ideal, "method": "estimate",
                        "profiled": True, "clean": False})
    if sched is not None:
        sched["ideal_from"] = ("replay" if replays else "formula"
                               if _has_formula(sched.get("schedule")) else None)
    bubbles = pd.DataFrame(out, columns=list(BUBBLE_COLUMNS))
    return PipelineResult(bubbles, chunks, sched, summarize_bubbles(bubbles), bubble_gaps(chunks),
                          typical_step(bubbles) if len(chunks) else None)
