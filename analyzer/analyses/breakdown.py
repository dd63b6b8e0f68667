"""Time breakdown and communication/computation overlap, per rank and per profiler step.

Definitions (HTA's overlap; Lumos' breakdown; FACTS §3). Per rank, within a time window:

* C = union of communication intervals, K = union of computation intervals;
* overlap = |K ∩ C|; overlap % = 100 · |K ∩ C| / |C| (HTA ``get_comm_comp_overlap``);
* compute-only = |K| − overlap; exposed communication = |C| − overlap;
* memory copies only = |M − (K ∪ C)|, M = union of the device's memcpy/memset (GPU traces; 0 on
  CPU): the device copies and does nothing else (HTA's temporal breakdown counts it as
  non-compute time, not idle);
* idle = window length − |K ∪ C ∪ M| (CPU-side gaps or nothing at all: no kernel, copy or
  collective runs; HTA's idle time).

compute-only + overlap + exposed + memory copies only + idle = window length.

What counts as what:

* **GPU traces** (any kernel in the file): K = compute kernels, C = communication kernels (see
  :mod:`pardiag.analyzer.trace.classify`) and ``gloo:*`` events (the gloo backend on CUDA tensors
  runs its transfers on a CPU thread); M = memcpy/memset; other CPU events count as none. The
  whole-trace window is first kernel start to the last step's end. A kernel belongs to the profiler
  step in which its launching runtime call ran (``correlation``); step *s*'s device window runs
  from its first kernel's start to the next step's first kernel's start (the last step of a
  profiling window: as long as its ``ProfilerStep`` range, or to its last kernel's end if later),
  so step windows tile the device timeline.
* **CPU traces** (gloo): C = every ``gloo:*``/``c10d::*``/``nccl:*``/``record_param_comms`` event on
  any thread (the gloo worker threads carry the transfers); K = CPU operators on the other threads
  minus the time they spend inside the communication calls and waits that block (waiting is not
  computing; a transfer in flight, :func:`pardiag.analyzer.trace.classify.transport`, such as
  an async isend's ``gloo:send`` span until its wait, is not such a call) and minus the waits
  no op marks (:func:`unmarked_waits`: FSDP's waits for its collectives on gloo). The
  whole-trace window is first to last classified event; step windows are the ``ProfilerStep#N``
  annotations.

Per collective type (:attr:`TimeBreakdown.collectives`): ``count`` is the number of ops the
program *issued* — pardiag's collective records (``rank{R}.comms.json``) where the run has them,
else the outermost ``c10d::*``/``_c10d_functional::*`` ops on the calling thread (GPU: the
communication kernels) — so every member of a group shows the same count whatever its transport
does; ``time_us``/``exposed_us`` are the union of the type's events, where the transport events
that ran an op (gloo worker events) take the type the program issued (:func:`cpu_comm_types`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable

import numpy as np
import pandas as pd

from pardiag.layout import CommRecord

from ..per_rank.breakdown import ADDITIVE_COLUMNS, compute_rank_parts, metrics_over
from ..per_rank.summary import summary_of
from ..trace.traceset import RankTrace, TraceSet, float_column

#: Columns of the per-rank and per-step tables (all durations in µs, shares in % of the window).
BREAKDOWN_COLUMNS = (
    "span_us", "compute_us", "comm_us", "overlap_us", "compute_only_us", "exposed_comm_us",
    "memory_only_us", "idle_us", "overlap_pct", "compute_only_pct", "overlap_share_pct",
    "exposed_comm_pct", "memory_only_pct", "idle_pct",
)

#: Columns of :func:`run_step_periods`.
RUN_STEP_COLUMNS = ("rank", "step", "period_us", "profiled")
#: Columns of :attr:`TimeBreakdown.devices`.
DEVICE_ROW_COLUMNS = ("rank", "device", "kernels", "compute_us", "busy_us", "idle_pct")


@dataclasses.dataclass(frozen=True)
class TimeBreakdown:
    """Result of :func:`compute_time_breakdown`.

    Attributes:
        totals: one row per rank: ``rank``, ``domain`` (``"gpu"`` or ``"cpu"``), ``start_us``,
            ``end_us`` and :data:`BREAKDOWN_COLUMNS`. ``overlap_pct`` is NaN when the rank has no
            communication.
        steps: one row per rank and profiler step: ``rank``, ``step``, ``start_us``, ``end_us`` and
            :data:`BREAKDOWN_COLUMNS`.
        collectives: one row per rank and collective type (standard names: ``all_reduce``,
            ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``, ``send``,
            ``recv``, ...): ``rank``, ``collective``, ``count`` (issued ops: the rank's records
            when the run has them, else its trace), ``time_us`` (|union of its intervals|,
            including the transport events that ran its ops), ``exposed_us`` (the part not under
            compute).
        step_means: one row per profiler step, the mean over ranks of each part
            (:func:`step_means`): ``step``, ``compute_only_us``, ``overlap_us``,
            ``exposed_comm_us``, ``idle_us`` (µs).
        overall: the run's shares over all ranks (:func:`overall_shares`):
            ``exposed_comm_pct``, ``overlap_pct`` (%), ``comm_us_per_rank`` (µs); NaN where
            undefined.
        run_steps: every optimizer step of the whole run, profiled or not, per rank
            (:func:`run_step_periods`): ``rank``, ``step``, ``period_us``, ``profiled``;
            empty for traces from elsewhere.
        devices: each device's own timeline, for ranks whose trace holds several devices (one
            process driving several GPUs; :func:`pardiag.analyzer.per_rank.breakdown.
            device_timelines`): :data:`DEVICE_ROW_COLUMNS`: ``rank``, ``device``, ``kernels``,
            ``compute_us``, ``busy_us`` (µs), ``idle_pct`` (% of the rank's span,
            ``totals.span_us``, in which the device runs nothing); empty otherwise.
        joined: where training steps join several profiler steps (gradient accumulation
            with ``prof.step()`` per micro-batch;
            :func:`pardiag.analyzer.trace.classify.training_steps`), every training step, one
            per optimizer step (an epoch's last may hold fewer micro-batches): ``rank``,
            ``step`` (the profiler step that holds the optimizer step), ``profiler_steps`` (how
            many); empty when each profiler step is a training step.
        unfinished: the profiler steps a rank ended inside without finishing them
            (:meth:`pardiag.analyzer.trace.traceset.TraceSet.first_unfinished_step`: the step
            a rank failed or hung in, or a script's tail after its last optimizer step): the
            rows of ``steps`` they would be. They are left out of ``steps``, and their time out
            of ``totals``: a step cut short by a failure is not a step, and a collective that
            never completed is not a transfer.
    """

    totals: pd.DataFrame
    steps: pd.DataFrame
    collectives: pd.DataFrame
    step_means: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=["step", *PART_COLUMNS]))
    overall: dict[str, float] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(OVERALL_KEYS, float("nan")))
    unfinished: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=["rank", "step", "start_us", "end_us",
                                                      *BREAKDOWN_COLUMNS]))
    run_steps: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=list(RUN_STEP_COLUMNS)))
    joined: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=["rank", "step", "profiler_steps"]))
    devices: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=list(DEVICE_ROW_COLUMNS)))

    def devices_text(self) -> list[str]:
        """One line per rank whose trace holds several devices' work (:attr:`devices`): its
        figures are their union, and what each device did alone."""
        out = []
        for rank, g in self.devices.groupby("rank", sort=True):
            ids = [int(d) for d in g["device"]]
            each = "; ".join(f"device {int(d)} computes {c / 1e3:.2f} ms and is idle "
                             f"{i:.1f}% of the rank's time" for d, c, i in
                             zip(g["device"], g["compute_us"], g["idle_pct"]))
            out.append(f"rank {int(rank)}: one process drives {len(ids)} devices "
                       f"({', '.join(map(str, ids[:-1]))} and {ids[-1]}: a model split across "
                       f"them, as device_map='auto' does, or copied onto each, as "
                       f"nn.DataParallel does): the rank's figures are their union, "
                       f"not any device's time — {each} (devices[])")
        return out

    def host_only_text(self) -> str | None:
        """A line naming the ranks whose trace holds no device activity while other ranks' hold
        kernels (:attr:`totals` ``domain``), else None: their figures are their host's."""
        t = self.totals
        if t is None or t.empty or "domain" not in t.columns:
            return None
        dev = sorted(int(r) for r in t.loc[t["domain"] == "gpu", "rank"])
        host = sorted(int(r) for r in t.loc[t["domain"] != "gpu", "rank"])
        if not dev or not host:
            return None

        def named(rs: list[int]) -> str:
            return (f"rank {rs[0]}" if len(rs) == 1
                    else f"ranks {', '.join(map(str, rs[:8]))}{', ...' if len(rs) > 8 else ''}")
        return (f"{named(host)} {'holds' if len(host) == 1 else 'hold'} no device activity "
                f"(no kernel) while {named(dev)} ran kernels: profiled with CPU activities only? "
                f"Their computation and overlap are their host's, not comparable with the "
                f"device ranks': the run's shares and the load-imbalance table leave them out")

    def joined_text(self) -> str | None:
        """``"a step is one optimizer step: 4 profiler steps each (gradient accumulation; the
        optimizer stepped, or a gradient scaler skipped its step, in profiler step(s) 4, 8
        only)"`` when :attr:`joined` has rows, else None."""
        j = self.joined
        if j is None or j.empty:
            return None
        counts = sorted({int(n) for n in j["profiler_steps"]})
        each = (f"{counts[0]} profiler steps each" if len(counts) == 1
                else f"{counts[0]}–{counts[-1]} profiler steps each")
        at = sorted({int(s) for s in j["step"]})
        return (f"a step is one optimizer step: {each} (gradient accumulation; the optimizer "
                f"stepped, or a gradient scaler skipped its step, in profiler step(s) "
                f"{', '.join(map(str, at))} only)")

    def unfinished_text(self) -> str | None:
        """``"step 3 left out: ranks 0, 1 ended inside it without finishing it"``, or None."""
        u = self.unfinished
        if u is None or u.empty:
            return None
        parts = []
        for step, g in u.groupby("step"):
            ranks = sorted(int(r) for r in g["rank"])
            who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
            parts.append(f"step {int(step)} left out: {who} ended inside it without finishing it")
        return "; ".join(parts)

    @functools.cached_property
    def step_time(self) -> pd.DataFrame:
        """Step time and its spread (:func:`step_time_spread`): one row per rank and a last row
        for the run (``rank`` None: per step the slowest rank's span). Computed once."""
        return step_time_spread(self.steps)

    @functools.cached_property
    def collective_totals(self) -> pd.DataFrame:
        """One row per collective type over all ranks, most time first: ``collective``,
        ``ranks`` (ranks that ran it), ``count`` (issued ops, summed), ``time_us`` and
        ``exposed_us`` (summed over ranks), ``exposed_pct`` (% of that time not under compute;
        NaN without time). The HTML, terminal and JSON reports all show this table: computed
        once."""
        c = self.collectives
        if c.empty:
            return pd.DataFrame(columns=["collective", "ranks", "count", "time_us", "exposed_us",
                                         "exposed_pct"])
        agg = (c.groupby("collective", as_index=False)
               .agg(ranks=("rank", "nunique"), count=("count", "sum"), time_us=("time_us", "sum"),
                    exposed_us=("exposed_us", "sum")))
        agg["exposed_pct"] = 100.0 * agg["exposed_us"] / agg["time_us"].where(agg["time_us"] > 0)
        return agg.sort_values(["time_us", "collective"], ascending=[False, True],
                               kind="stable").reset_index(drop=True)


#: The five parts a rank's window splits into (µs), in the order the breakdown charts stack them.
PART_COLUMNS: tuple[str, ...] = ("compute_only_us", "overlap_us", "exposed_comm_us",
                                 "memory_only_us", "idle_us")
def has_memory_copies(rows: pd.DataFrame) -> bool:
    """Whether some row of a breakdown table (totals, steps or step means) has memory copies
    alone (a GPU's memcpy/memset): the charts and tables show that part only then."""
    return "memory_only_us" in rows and bool((rows["memory_only_us"].fillna(0) > 0).any())


#: Keys of :func:`overall_shares`.
OVERALL_KEYS: tuple[str, ...] = ("exposed_comm_pct", "overlap_pct", "comm_us_per_rank")


def step_means(steps: pd.DataFrame) -> pd.DataFrame:
    """The mean over ranks of each of :data:`PART_COLUMNS` per profiler step (µs): ``step``
    and those columns, by step. ``steps``: :attr:`TimeBreakdown.steps`."""
    if steps.empty:
        return pd.DataFrame(columns=["step", *PART_COLUMNS])
    return steps.groupby("step", sort=True)[list(PART_COLUMNS)].mean().reset_index()


#: A device of a rank's trace busy for less than this share of the rank's busiest device is
#: left out of the rank's devices (a context created on cuda:0 by a rank on another GPU).
DEVICE_MIN_BUSY_SHARE = 0.01


def comparable_totals(totals: pd.DataFrame) -> pd.DataFrame:
    """``totals`` without the ranks whose trace holds no device activity when other ranks'
    hold kernels (:meth:`TimeBreakdown.host_only_text`: their host's op time is no measure of
    their devices'); all of it otherwise."""
    if totals.empty or "domain" not in totals.columns:
        return totals
    dev = totals["domain"] == "gpu"
    return totals[dev] if dev.any() and not dev.all() else totals


def overall_shares(totals: pd.DataFrame) -> dict[str, float]:
    """The run's shares, summed over ranks (``totals``: :attr:`TimeBreakdown.totals`):
    ``exposed_comm_pct`` = 100·Σ exposed_comm_us / Σ span_us (% of rank time),
    ``overlap_pct`` = 100·(Σ comm_us − Σ exposed_comm_us) / Σ comm_us (% of communication
    under compute, HTA's overlap over all ranks), ``comm_us_per_rank`` = mean ``comm_us`` (µs)
    over the ranks that communicate (``overlap_pct`` measured). NaN where a denominator is 0 or
    no rank communicates. Ranks without device activity beside ranks with it are left out
    (:func:`comparable_totals`)."""
    out = dict.fromkeys(OVERALL_KEYS, float("nan"))
    totals = comparable_totals(totals)
    if totals.empty:
        return out
    comm, exposed = totals["comm_us"].sum(), totals["exposed_comm_us"].sum()
    span = totals["span_us"].sum()
    if span:
        out["exposed_comm_pct"] = float(100 * exposed / span)
    if comm:
        out["overlap_pct"] = float(100 * (comm - exposed) / comm)
    measured = totals.dropna(subset=["overlap_pct"])
    if len(measured):
        out["comm_us_per_rank"] = float(measured["comm_us"].mean())
    return out


#: A step longer than this multiple of its rank's median step is an outlier (a step that holds
#: an evaluation, a checkpoint, a first-step warm-up): flagged and left out of medians.
OUTLIER_STEP_FACTOR = 1.5
#: Columns of :func:`step_time_spread`.
STEP_TIME_COLUMNS = ("rank", "steps", "median_us", "q1_us", "q3_us", "min_us", "max_us",
                     "outlier_steps")


def _spread_row(rank, steps: np.ndarray, spans: np.ndarray) -> dict:
    """Median, quartiles and range (µs) of one rank's step spans (``spans``, NaN where unknown,
    of the step numbers ``steps``), outliers (> :data:`OUTLIER_STEP_FACTOR` × the median) left
    out and named."""
    known = spans[~np.isnan(spans)]
    med = float(np.median(known)) if len(known) else np.nan
    with np.errstate(invalid="ignore"):
        out = spans > OUTLIER_STEP_FACTOR * med if len(spans) > 2 else np.zeros(len(spans), bool)
    used = spans[~out]
    kept = used[~np.isnan(used)]
    q = np.quantile(kept, [0.25, 0.5, 0.75]) if len(kept) else [np.nan] * 3
    return {"rank": rank, "steps": int(len(used)), "median_us": float(q[1]), "q1_us": float(q[0]),
            "q3_us": float(q[2]), "min_us": float(kept.min()) if len(kept) else np.nan,
            "max_us": float(kept.max()) if len(kept) else np.nan,
            "outlier_steps": [int(x) for x in steps[out]]}


def _spread_rows(ranks: np.ndarray, step_no: np.ndarray, span: np.ndarray, lo: np.ndarray,
                 hi: np.ndarray) -> list[dict]:
    """:func:`_spread_row` of each rank, whose rows are ``lo[i]:hi[i]`` of the arrays (sorted by
    rank). Ranks with as many steps, none unknown and none an outlier (most ranks of a run) are
    done together, one row each of a matrix (numpy's median and quantiles of a row are those of
    the row alone); the others one by one."""
    rows: list = [None] * len(lo)
    n = hi - lo
    for k in np.unique(n):
        idx = np.flatnonzero(n == k)
        m = span[lo[idx][:, None] + np.arange(k)]
        clean = ~np.isnan(m).any(axis=1)
        if k > 2 and clean.any():
            with np.errstate(invalid="ignore"):
                med = np.median(m[clean], axis=1)
                clean[clean] = ~(m[clean] > OUTLIER_STEP_FACTOR * med[:, None]).any(axis=1)
        if k and clean.any():
            mc = m[clean]
            q = np.quantile(mc, [0.25, 0.5, 0.75], axis=1)
            for j, i in enumerate(idx[clean]):
                rows[i] = {"rank": int(ranks[lo[i]]), "steps": int(k),
                           "median_us": float(q[1, j]), "q1_us": float(q[0, j]),
                           "q3_us": float(q[2, j]), "min_us": float(mc[j].min()),
                           "max_us": float(mc[j].max()), "outlier_steps": []}
        for i in idx[~clean] if k else idx:
            rows[i] = _spread_row(int(ranks[lo[i]]), step_no[lo[i]:hi[i]], span[lo[i]:hi[i]])
    return rows


def step_time_spread(steps: pd.DataFrame) -> pd.DataFrame:
    """Step time per rank and for the run, with its spread over the profiled steps.

    Args:
        steps: :attr:`TimeBreakdown.steps` (``rank``, ``step``, ``span_us``, ...).

    Returns:
        :data:`STEP_TIME_COLUMNS`: ``rank`` (None for the run: per step the slowest rank's span,
        as the step takes as long as its slowest rank), ``steps`` (steps used), ``median_us``,
        ``q1_us``, ``q3_us`` (quartiles, linear interpolation), ``min_us``, ``max_us`` (µs), and
        ``outlier_steps``: steps longer than :data:`OUTLIER_STEP_FACTOR` × the median (needs 3
        or more steps), left out of the other columns.
    """
    if steps is None or steps.empty:
        return pd.DataFrame(columns=list(STEP_TIME_COLUMNS))
    ranks = steps["rank"].to_numpy()
    order = np.argsort(ranks, kind="stable")
    r_sorted = ranks[order]
    step_no = steps["step"].to_numpy()[order]
    span = steps["span_us"].to_numpy(dtype=float)[order]
    cuts = np.flatnonzero(r_sorted[1:] != r_sorted[:-1]) + 1
    rows = _spread_rows(r_sorted, step_no, span, np.r_[0, cuts], np.r_[cuts, len(r_sorted)])
    run = steps.groupby("step")["span_us"].max()
    rows.append(_spread_row(None, run.index.to_numpy(), run.to_numpy(dtype=float)))
    out = pd.DataFrame(rows, columns=list(STEP_TIME_COLUMNS))
    out["rank"] = pd.Series([r["rank"] for r in rows], dtype=object)
    return out


def with_record_counts(rows: list[dict], records: list[CommRecord]) -> list[dict]:
    """Collective rows (without ``rank``) whose ``count`` is the number of pardiag's records of
    the op (the ops the rank issued in the traced window); an op recorded but absent from the
    trace gets a row with no time. Ops without records keep the trace's count."""
    counts: dict[str, int] = {}
    for r in records:
        counts[r.op] = counts.get(r.op, 0) + 1
    out = [{**r, "count": counts.get(r["collective"], r["count"])} for r in rows]
    have = {r["collective"] for r in rows}
    out += [{"collective": op, "count": n, "time_us": 0.0, "exposed_us": 0.0}
            for op, n in counts.items() if op not in have]
    return sorted(out, key=lambda r: r["collective"])


def compute_rank_breakdown(trace: RankTrace, comm_patterns: Iterable[re.Pattern] = (),
                           launch_window: tuple[float, float] | None = None) -> dict:
    """Time breakdown of one rank over its whole trace.

    Args:
        trace: the rank's events.
        comm_patterns: extra regular expressions naming communication kernels.
        launch_window: GPU traces only: keep only kernels launched (CPU runtime call, µs on the
            trace clock) in ``[lo, hi)``; e.g. HTA's window is everything launched before the last
            profiler step starts.

    Returns:
        dict with ``domain``, ``start_us``, ``end_us`` and :data:`BREAKDOWN_COLUMNS`.
    """
    patterns = list(comm_patterns)
    parts = (summary_of(trace, patterns).parts if launch_window is None
             else compute_rank_parts(trace, patterns, launch_window))
    return {"domain": parts.domain, "start_us": parts.lo, "end_us": parts.hi,
            **metrics_over(parts.k, parts.c, parts.spans(), parts.m)}


def compute_time_breakdown(traces: TraceSet,
                           comm_patterns: Iterable[re.Pattern] = ()) -> TimeBreakdown:
    """Per-rank and per-step time breakdown and overlap for every rank of ``traces``.

    See the module docstring for the definitions (HTA overlap, Lumos breakdown).

    Returns:
        TimeBreakdown (tables documented there).
    """
    comm_patterns = list(comm_patterns)
    totals: list[dict] = []
    steps: list[dict] = []
    colls: list[dict] = []
    joined: list[dict] = []
    devices: list[dict] = []
    for rank, trace in traces.ranks.items():
        summary = summary_of(trace, comm_patterns)
        total, step_rows, coll_rows = summary.breakdown
        # the tables as stored: a rank's table is built only where it is read (thousands of
        # ranks, most with one device and no joined profiler steps)
        devs = summary.stored("devices")
        if devs is not None and len(devs) > 1:
            # a device the process touched in passing (a context's memset on cuda:0) is no
            # second timeline of the rank's work
            own = summary.devices
            own = own[own["busy_us"] >= DEVICE_MIN_BUSY_SHARE * own["busy_us"].max()]
            span = float(total.get("span_us") or 0.0)
            devices.extend({"rank": rank, **{k: d[k] for k in ("device", "kernels", "compute_us",
                                                                "busy_us")},
                            "idle_pct": 100.0 * (1 - d["busy_us"] / span) if span > 0
                            else float("nan")}
                           for d in (own.to_dict("records") if len(own) > 1 else ()))
        held = summary.stored("steps")
        if held is not None and "profiler_steps" in held.columns:
            n_prof = float_column(held, "profiler_steps")
            if (n_prof > 1).any():   # every optimizer step: accumulation may end a group early
                joined.extend({"rank": rank, "step": int(s), "profiler_steps": int(n)}
                              for s, n in zip(float_column(held, "step"), n_prof) if n >= 1)
        doc = traces.sidecars.get("comms", {}).get(rank)
        if doc:
            coll_rows = with_record_counts(coll_rows, doc.records)
        totals.append({"rank": rank, **total})
        steps.extend({"rank": rank, **r} for r in step_rows)
        colls.extend({"rank": rank, **r} for r in coll_rows)
    cols = ["rank", "domain", "start_us", "end_us", *BREAKDOWN_COLUMNS]
    step_cols = ["rank", "step", "start_us", "end_us", *BREAKDOWN_COLUMNS]
    coll_cols = ["rank", "collective", "count", "time_us", "exposed_us"]
    totals_df = pd.DataFrame(totals, columns=cols)
    steps_df = pd.DataFrame(steps, columns=step_cols)
    cut = traces.unfinished_mask(steps_df["rank"], steps_df["step"])
    unfinished = steps_df[cut].reset_index(drop=True)
    if cut.any():
        steps_df = steps_df[~cut].reset_index(drop=True)
        totals_df = _without(totals_df, unfinished)
    return TimeBreakdown(
        totals=totals_df, steps=steps_df, collectives=pd.DataFrame(colls, columns=coll_cols),
        step_means=step_means(steps_df), overall=overall_shares(totals_df),
        unfinished=unfinished, run_steps=run_step_periods(traces),
        joined=pd.DataFrame(joined, columns=["rank", "step", "profiler_steps"]),
        devices=pd.DataFrame(devices, columns=list(DEVICE_ROW_COLUMNS)))



def run_step_periods(traces: TraceSet) -> pd.DataFrame:
    """Every training step of a ``pardiag profile`` run, per rank, from its metadata's
    optimizer-step times (``rank{R}.meta.json``, :class:`pardiag.layout.RankMeta`), not only
    the few the profiler recorded: what a step that comes late in the run looks like.

    Step ``k``'s period is the time from the end of the rank's optimizer step ``k − 1`` to the
    end of its step ``k`` (µs, the rank's own clock; step 0 has none): the span of
    ``ProfilerStep#k``. ``profiled`` is True for the steps the trace recorded (``--wait +
    --warmup`` ≤ k < ``--wait + --warmup + --active``), which the profiler slows down.

    Returns:
        :data:`RUN_STEP_COLUMNS`, sorted by rank and step; empty without metadata.
    """
    sch = traces.run_info.schedule if traces.run_info else None
    rows = []
    for rank, meta in sorted(traces.rank_meta.items()):
        ends: dict[int, float] = {}
        for row in meta.optimizer_step_times_us:
            if (isinstance(row, list) and len(row) == 3
                    and all(isinstance(x, (int, float)) for x in row)):
                ends[int(row[0])] = float(row[2])
        for k in sorted(ends):
            if k - 1 in ends and ends[k] >= ends[k - 1]:
                on = sch is not None and sch.wait + sch.warmup <= k < (
                    sch.wait + sch.warmup + sch.active)
                rows.append((int(rank), k, ends[k] - ends[k - 1], bool(on)))
    return pd.DataFrame(rows, columns=list(RUN_STEP_COLUMNS))



def _without(totals: pd.DataFrame, cut: pd.DataFrame) -> pd.DataFrame:
    """``totals`` less the time of the step rows ``cut`` (the steps' windows lie inside the
    rank's window and do not overlap, so each part's time is additive over them): the µs
    columns reduced, the shares recomputed (module docstring), and a rank's ``end_us`` moved
    to the start of a cut step that ends its window."""
    out = totals.copy()
    sums = cut.groupby("rank")[list(ADDITIVE_COLUMNS)].sum()
    starts = cut.groupby("rank")["start_us"].min()
    ends = cut.groupby("rank")["end_us"].max()
    for i, r in zip(out.index, out["rank"]):
        if r not in sums.index:
            continue
        for c in ADDITIVE_COLUMNS:
            out.at[i, c] = max(float(out.at[i, c]) - float(sums.at[r, c]), 0.0)
        if float(ends.at[r]) >= float(out.at[i, "end_us"]):
            out.at[i, "end_us"] = float(starts.at[r])
        span, comm = float(out.at[i, "span_us"]), float(out.at[i, "comm_us"])
        out.at[i, "overlap_pct"] = 100.0 * float(out.at[i, "overlap_us"]) / comm if comm else np.nan
        for pct, us in (("compute_only_pct", "compute_only_us"),
                        ("overlap_share_pct", "overlap_us"),
                        ("exposed_comm_pct", "exposed_comm_us"),
                        ("memory_only_pct", "memory_only_us"), ("idle_pct", "idle_us")):
            out.at[i, pct] = 100.0 * float(out.at[i, us]) / span if span else np.nan
    return out
