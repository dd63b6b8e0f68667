"""Time breakdown and communication/computation overlap, per rank and per profiler step.

Definitions (HTA's overlap; Lumos' breakdown; FACTS §3). Per rank, within a time window:

* C = union of communication intervals, K = union of computation intervals;
* overlap = |K ∩ C|; overlap % = 100 · |K ∩ C| / |C| (HTA ``get_comm_comp_overlap``);
* compute-only = |K| − overlap; exposed communication = |C| − overlap;
* idle = window length − |K ∪ C| (nothing but memcpy/memset, CPU-side gaps, or nothing at all).

compute-only + overlap + exposed + idle = window length.

What counts as what:

* **GPU traces** (any kernel in the file): K = compute kernels, C = communication kernels (see
  :mod:`pardiag.analyzer.trace.classify`) and ``gloo:*`` events (the gloo backend on CUDA tensors
  runs its transfers on a CPU thread); memcpy/memset and other CPU events count as neither. The
  whole-trace window is first kernel start to last kernel end. A kernel belongs to the profiler step
  in which its launching runtime call ran (``correlation``); step *s*'s device window runs from its
  first kernel's start to the next step's first kernel's start (the last step: to its last kernel's
  end), so step windows tile the device timeline.
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

import bisect
import dataclasses
import functools
import re
from collections.abc import Iterable

import numpy as np
import pandas as pd

from pardiag.layout import CommRecord

from ..trace import intervals as iv
from ..trace.classify import (
    STANDARD_COLLECTIVES,
    Kind,
    cached,
    classify,
    collective_type,
    comm_threads,
    name_test,
    on_threads,
    pattern_key,
    profiler_steps,
    transport,
)
from ..trace.traceset import HoldsTables, RankTrace, StoredTable, TraceSet, isin_mask
from .issued_ops import gpu_issued_ops, launch_times

#: Columns of the per-rank and per-step tables (all durations in µs, shares in % of the window).
BREAKDOWN_COLUMNS = (
    "span_us", "compute_us", "comm_us", "overlap_us", "compute_only_us", "exposed_comm_us",
    "idle_us", "overlap_pct", "compute_only_pct", "overlap_share_pct", "exposed_comm_pct",
    "idle_pct",
)


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
    """

    totals: pd.DataFrame
    steps: pd.DataFrame
    collectives: pd.DataFrame

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


def _overlapping(ivs: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The rows of a sorted, disjoint interval set that may overlap ``[lo, hi)`` (a view; what
    :func:`iv.clip` keeps of the set is the same with or without the other rows)."""
    if len(ivs) < 64:
        return ivs
    i0 = int(np.searchsorted(ivs[:, 1], lo, side="right"))
    i1 = int(np.searchsorted(ivs[:, 0], hi, side="left"))
    return ivs[i0:max(i0, i1)]


def _metrics(k: np.ndarray, c: np.ndarray, lo: float, hi: float) -> dict:
    k = iv.clip(_overlapping(k, lo, hi), lo, hi)
    c = iv.clip(_overlapping(c, lo, hi), lo, hi)
    span = max(0.0, hi - lo)
    comp = iv.total(k)
    comm = iv.total(c)
    ov = iv.total(iv.intersect(k, c))
    busy = comp + comm - ov
    pct = (lambda x: 100.0 * x / span) if span > 0 else (lambda x: float("nan"))
    return {
        "span_us": span, "compute_us": comp, "comm_us": comm, "overlap_us": ov,
        "compute_only_us": comp - ov, "exposed_comm_us": comm - ov, "idle_us": span - busy,
        "overlap_pct": 100.0 * ov / comm if comm > 0 else float("nan"),
        "compute_only_pct": pct(comp - ov), "overlap_share_pct": pct(ov),
        "exposed_comm_pct": pct(comm - ov), "idle_pct": pct(span - busy),
    }


def _metrics_over(k: np.ndarray, c: np.ndarray, spans: list[tuple[float, float]]) -> dict:
    """:func:`_metrics` of a rank's time made of several spans (profiling windows): times
    summed over the spans, shares of their summed length."""
    if len(spans) == 1:
        return _metrics(k, c, *spans[0])
    parts = [_metrics(k, c, lo, hi) for lo, hi in spans]
    tot = {key: float(sum(p[key] for p in parts)) for key in
           ("span_us", "compute_us", "comm_us", "overlap_us", "compute_only_us", "exposed_comm_us",
            "idle_us")}
    span = tot["span_us"]
    pct = (lambda x: 100.0 * x / span) if span > 0 else (lambda x: float("nan"))
    return {**tot,
            "overlap_pct": 100.0 * tot["overlap_us"] / tot["comm_us"] if tot["comm_us"] > 0
            else float("nan"),
            "compute_only_pct": pct(tot["compute_only_us"]),
            "overlap_share_pct": pct(tot["overlap_us"]),
            "exposed_comm_pct": pct(tot["exposed_comm_us"]), "idle_pct": pct(tot["idle_us"])}


def _intervals(ev: pd.DataFrame) -> np.ndarray:
    """Interval set of the events (rows without times, issued ops whose kernels were lost,
    drop out)."""
    return iv.union(ev["ts"].to_numpy(), (ev["ts"] + ev["dur"]).to_numpy())


@dataclasses.dataclass(frozen=True)
class RankParts(HoldsTables):
    """One rank's timeline in the parts the breakdown and the what-ifs read.

    Attributes:
        domain: ``"gpu"`` (kernels) or ``"cpu"`` (operators on the host).
        k, c: computation and communication interval sets, shape (n, 2), µs on the rank's own
            clock (merged, sorted).
        lo, hi: the span of the rank's recorded work (µs).
        step_windows: ``(step, start µs, end µs)`` per profiler step — on GPU from the first
            kernel launched in the step's CPU range to the next step's first kernel (the last
            step: to its last kernel's end), on CPU the ``ProfilerStep`` range.
        comm_events: the communication events (``name, ts, dur, args, type, counted``):
            ``counted`` is how many issued ops an event accounts for (an op counts once however
            many kernels it ran as); an issued op whose kernels the trace lost is a row with
            NaN ``ts``/``dur`` (GPU).
        segments: ``((start µs, end µs), ...)`` inside ``[lo, hi]`` that are the rank's time
            when its events come from several profiling windows (:attr:`RankTrace.windows`);
            ``()`` for one window (then ``[lo, hi]`` is).
    """

    domain: str
    k: np.ndarray
    c: np.ndarray
    lo: float
    hi: float
    step_windows: list[tuple[int, float, float]]
    comm_events: pd.DataFrame = StoredTable()  # name, ts, dur, args, type, counted
    segments: tuple = ()

    def spans(self) -> list[tuple[float, float]]:
        """The rank's time as ``[(start µs, end µs)]``: its segments, or ``[(lo, hi)]``."""
        return list(self.segments) if self.segments else [(self.lo, self.hi)]


def rank_parts(trace: RankTrace, comm_patterns, launch_window) -> RankParts:
    """The rank's :class:`RankParts`: from its summary when it has one made with the same
    ``comm_patterns`` (extra communication name patterns; ``[]`` for the built-in ones) and no
    ``launch_window`` (``(lo, hi)`` µs: only kernels launched then) is asked for, else from its
    events (computed once per trace and pattern list)."""
    s = trace.summary
    if s is not None and launch_window is None and s.matches(comm_patterns):
        return s.parts
    if launch_window is not None:
        return _compute_rank_parts(trace, comm_patterns, launch_window)
    return cached(trace, ("rank_parts", pattern_key(comm_patterns)),
                  lambda: _compute_rank_parts(trace, comm_patterns, None))


def _compute_rank_parts(trace: RankTrace, comm_patterns, launch_window) -> RankParts:
    kinds = classify(trace, comm_patterns)
    ev = trace.events
    steps = profiler_steps(trace, kinds)
    gpu_kinds = [Kind.GPU_COMPUTE.value, Kind.GPU_COMM.value, Kind.GPU_MEMORY.value]
    dev = isin_mask(kinds, gpu_kinds)
    if dev.any():
        # gloo on CUDA tensors: the transfer runs on a CPU thread beside the GPU's computation
        host_comm = (kinds == Kind.CPU_COMM.value).to_numpy() & name_test(
            trace, "gloo", lambda n: n.startswith("gloo:"))
        kernels = ev[dev | host_comm]
        kk = kinds[kernels.index].where(~host_comm[dev | host_comm], Kind.GPU_COMM.value)
        launch = launch_times(trace, kernels)
        if launch_window is not None:
            sel = (launch >= launch_window[0]) & (launch < launch_window[1])
            kernels, kk, launch = kernels[sel], kk[sel], launch[sel]
        k = _intervals(kernels[kk == Kind.GPU_COMPUTE.value])
        comm_ev = kernels[kk == Kind.GPU_COMM.value]
        c = _intervals(comm_ev)
        lo = float(kernels["ts"].min()) if len(kernels) else 0.0
        hi = float((kernels["ts"] + kernels["dur"]).max()) if len(kernels) else 0.0
        windows = []
        if len(steps) and len(kernels):
            # Step of each kernel: the step whose CPU window holds its launch.
            idx = np.searchsorted(steps["start_us"].to_numpy(), launch, side="right") - 1
            inside = (idx >= 0) & (launch < steps["end_us"].to_numpy()[np.clip(idx, 0, None)])
            ends = (kernels["ts"] + kernels["dur"]).to_numpy()
            # per step (in step order): its first kernel's start and its last kernel's end
            at = idx[inside]
            order = np.argsort(at, kind="stable")
            at = at[order]
            step_idx, first = np.unique(at, return_index=True)
            starts = np.minimum.reduceat(kernels["ts"].to_numpy()[inside][order], first)
            last_ends = np.maximum.reduceat(ends[inside][order], first)
            seg = iv.window_of(starts, trace.windows)
            step_ids = steps["step"].to_numpy()
            for j, i in enumerate(step_idx):
                # to the next step's first kernel, unless that lies in another profiling window
                nxt = j + 1 < len(step_idx) and seg[j + 1] == seg[j]
                end = starts[j + 1] if nxt else last_ends[j]
                windows.append((int(step_ids[i]), float(starts[j]),
                                float(max(starts[j], end))))
        comm = _gpu_comm_types(trace, comm_ev)
        ts = kernels["ts"].to_numpy()
        return RankParts("gpu", k, c, lo, hi, windows, comm,
                         _segments(ts, ts + kernels["dur"].to_numpy(), trace.windows))

    comm_ev = ev[kinds == Kind.CPU_COMM.value]
    c = _intervals(comm_ev)
    # the calls that block the thread are not computation; a transfer in flight (a worker's
    # event, an async isend's span) is communication the thread's own work overlaps
    not_compute = ev[isin_mask(kinds, [Kind.CPU_COMM.value, Kind.CPU_WAIT.value])
                     & ~transport(trace)]
    k = iv.subtract(_intervals(ev[kinds == Kind.CPU_COMPUTE.value]), _intervals(not_compute))
    k = iv.subtract(k, unmarked_waits(trace, comm_patterns))
    timed = ev[isin_mask(kinds, [Kind.CPU_COMPUTE.value, Kind.CPU_COMM.value,
                                 Kind.CPU_WAIT.value, Kind.STEP.value])]
    lo = float(timed["ts"].min()) if len(timed) else 0.0
    hi = float((timed["ts"] + timed["dur"]).max()) if len(timed) else 0.0
    windows = [(int(r.step), float(r.start_us), float(r.end_us)) for r in steps.itertuples()]
    ts = timed["ts"].to_numpy()
    return RankParts("cpu", k, c, lo, hi, windows, cpu_comm_types(trace, kinds),
                     _segments(ts, ts + timed["dur"].to_numpy(), trace.windows))


#: An unmarked wait is at least this long (µs).
UNMARKED_WAIT_MIN_US = 50.0
#: A thread resumes at most this long after the transfer it waited for ends (µs; or 10% of the
#: wait, whichever is more), and not before it ends (within 20 µs).
UNMARKED_WAIT_LAG_US = 500.0


def unmarked_waits(trace: RankTrace, comm_patterns=()) -> np.ndarray:
    """A CPU rank's waits for its own communication that no op marks, shape (n, 2), µs (merged;
    once per trace and ``--comm-kernel`` pattern list: the breakdown and the causes both read
    them).

    FSDP (1 and 2) on gloo waits for an all-gather or reduce-scatter inside its own annotation
    (``FSDP::all_gather``) or an autograd op, with no ``wait`` op of its own: the enclosing op's
    time would count as computation. Such a wait is a stretch of a thread with an op open but no
    op starting or ending (no child running), of at least :data:`UNMARKED_WAIT_MIN_US`, that
    starts where a child ended or ends where one starts (not the whole of a leaf op such as a
    matmul) and lies in no ATen operator's own time (a matmul computing after a small child op),
    during which a transfer of the rank (a transport event:
    :func:`pardiag.analyzer.trace.classify.transport`) is in flight and ends just before the
    thread resumes (within :data:`UNMARKED_WAIT_LAG_US` or 10% of the stretch). The wait runs
    from the stretch's start, or from the transfer's start when that came well into it."""
    return cached(trace, ("unmarked_waits", pattern_key(comm_patterns)),
                  lambda: _unmarked_waits(trace, classify(trace, list(comm_patterns))))


def _unmarked_waits(trace: RankTrace, kinds: pd.Series) -> np.ndarray:
    ev = trace.events
    tr = transport(trace)
    comm = ev[(kinds == Kind.CPU_COMM.value).to_numpy() & tr]
    if comm.empty:
        return np.empty((0, 2))
    cs = comm["ts"].to_numpy(dtype=float)
    ce = cs + comm["dur"].to_numpy(dtype=float)
    order = np.argsort(ce, kind="stable")
    cs, ce = cs[order], ce[order]
    ops = ev[isin_mask(kinds, [Kind.CPU_COMPUTE.value, Kind.CPU_COMM.value,
                               Kind.CPU_WAIT.value, Kind.OTHER.value]) & ~tr
             & (ev["dur"].to_numpy(dtype=float) > 0)]
    out = []
    for _, g in ops.groupby(["pid", "tid"], sort=False):
        s = g["ts"].to_numpy(dtype=float)
        e = s + g["dur"].to_numpy(dtype=float)
        names = g["name"].to_numpy()
        pts = np.unique(np.concatenate([s, e]))
        if len(pts) < 2:
            continue
        a, b = pts[:-1], pts[1:]
        mid = (a + b) / 2
        depth = (np.searchsorted(np.sort(s), mid, side="right")
                 - np.searchsorted(np.sort(e), mid, side="right"))
        after_child = np.isin(a, e)      # the stretch starts where an op ended
        before_child = np.isin(b, s)     # or ends where one starts
        sel = (depth >= 1) & (b - a >= UNMARKED_WAIT_MIN_US) & (after_child | before_child)
        for lo, hi in zip(a[sel], b[sel]):
            lag = max(UNMARKED_WAIT_LAG_US, 0.1 * (hi - lo))
            i0 = int(np.searchsorted(ce, hi - lag, side="left"))
            i1 = int(np.searchsorted(ce, hi + 20.0, side="right"))
            hit = [j for j in range(i0, i1) if cs[j] < hi and ce[j] > lo]
            if hit and not _in_operator(s, e, names, lo, hi):
                start = min(cs[j] for j in hit)
                out.append((lo if start - lo <= lag else start, hi))
    if not out:
        return np.empty((0, 2))
    a = np.asarray(out, dtype=float)
    return iv.union(a[:, 0], a[:, 1])


def _in_operator(s: np.ndarray, e: np.ndarray, names: np.ndarray, lo: float, hi: float) -> bool:
    """Whether the innermost op open over ``[lo, hi]`` (the latest to start) is an ATen
    operator: its own time is a kernel computing, whatever else is in flight."""
    cover = np.flatnonzero((s <= lo) & (e >= hi))
    if not len(cover):
        return False
    inner = cover[np.lexsort((e[cover], -s[cover]))[0]]
    return str(names[inner]).startswith("aten::")


def _segments(starts: np.ndarray, ends: np.ndarray, windows) -> tuple:
    """Per profiling window of the rank (``()`` for one window): from the first start to the
    last end of the events (``starts``/``ends``, µs) that start in it — what ``[lo, hi]`` is
    for a rank with one window."""
    if len(windows) < 2 or len(starts) == 0:
        return ()
    seg = iv.window_of(starts, windows)
    out = tuple((float(starts[seg == i].min()), float(ends[seg == i].max()))
                for i in range(len(windows)) if (seg == i).any())
    return out if len(out) > 1 else ()


#: What a transport may run an issued collective as: gloo runs reduce_scatter as an all_reduce
#: (FACTS §1); every other op runs as itself.
TRANSPORT_OPS = {"reduce_scatter": ("reduce_scatter", "all_reduce")}
_ISSUING = re.compile(r"^(c10d::|_c10d_functional::|c10d_functional::|nccl:|record_param_comms)")
_FUNCTIONAL = ("_c10d_functional::", "c10d_functional::")
#: How many later transport events an issued op looks at for one with its op and size.
_PAIR_SCAN = 64


def _entry_numel(entry) -> int | None:
    """Elements of one ``Input Dims`` entry: a shape, or a list of shapes (coalesced ops)."""
    if not isinstance(entry, list) or not entry:
        return None
    try:
        if all(isinstance(x, list) for x in entry):
            return sum(int(np.prod(x)) if x else 1 for x in entry)
        return int(np.prod(entry))
    except (TypeError, ValueError):
        return None


def _numels(args) -> set[int]:
    dims = args.get("Input Dims") if isinstance(args, dict) else None
    if not isinstance(dims, list):
        return set()
    return {n for n in map(_entry_numel, dims) if n is not None}


def _first_numel(args) -> int | None:
    """Elements of the first ``Input Dims`` entry (a transport event's buffer)."""
    dims = args.get("Input Dims") if isinstance(args, dict) else None
    return _entry_numel(dims[0]) if isinstance(dims, list) and dims else None


def cpu_comm_types(trace: RankTrace, kinds: pd.Series) -> pd.DataFrame:
    """Collective type and count of a CPU trace's communication events (its ``cpu_comm`` events
    by ``kinds``, which do not depend on ``--comm-kernel`` patterns; computed once per trace),
    counting *issued* ops once and naming every event by the op the program issued.

    * An **issued op** is an outermost communication op (``c10d::*``, ``_c10d_functional::*``,
      ``nccl:*``, ``record_param_comms``) on a thread that is not a transport worker (see
      :func:`classify.comm_threads`); the ops it encloses on its thread (``c10d::allreduce_`` in
      ``_c10d_functional::all_reduce``) are the same op. Each issued op counts once; its type is
      the first standard collective name among its own and its nested ops' names.
    * A **transport event** (``gloo:*`` on any thread, or any communication event on a worker
      thread) is where the transfer happens. It is paired with the issued op it ran: issued ops in
      time order each take the earliest unpaired transport event that starts at or after the op,
      runs the op (its own name, or what the transport runs it as: :data:`TRANSPORT_OPS`) and,
      where both record ``Input Dims``, has the element count of one of the op's inputs. The
      event takes the issued op's type (gloo's ``gloo:all_reduce`` of a reduce-scatter is a
      ``reduce_scatter``) and counts nothing, however many worker threads there are. An unpaired
      transport event (its op issued before the window) keeps its own type, or the one issued type
      the transport runs as it.
    * A trace without any issued op (worker events only) counts its transport events.

    Returns:
        ``name, ts, dur, args, type, counted, functional, issuer_record`` per ``cpu_comm``
        event (the events' index); ``functional`` is True for an op issued through a functional
        collective (``_c10d_functional::*``) and for the transport events that ran one;
        ``issuer_record`` is the args of the ``record_param_comms`` of the op that issued a
        transport event (group ranks, description, ``Seq``), else None.
    """
    return cached(trace, "cpu_comm_types",
                  lambda: _cpu_comm_types(trace,
                                          trace.events[(kinds == Kind.CPU_COMM.value).to_numpy()]))


def _cpu_comm_types(trace: RankTrace, comm_ev: pd.DataFrame) -> pd.DataFrame:
    comm = comm_ev[["name", "ts", "dur", "args"]].copy()
    n = len(comm)
    names = comm["name"].tolist()
    args = comm["args"].tolist()
    own = [collective_type(nm, a) for nm, a in zip(names, args)]
    worker = on_threads(comm_ev, comm_threads(trace))
    transport = worker | np.fromiter((nm.startswith("gloo:") for nm in names), dtype=bool, count=n)
    issuing = ~transport & np.fromiter((bool(_ISSUING.match(nm)) for nm in names), dtype=bool,
                                       count=n)
    types = list(own)
    counted = np.zeros(n, dtype=bool)
    ts = comm["ts"].to_numpy(dtype=float)
    end = ts + comm["dur"].to_numpy(dtype=float)
    # issued ops: the outermost issuing op per thread; nested ones belong to it
    owner = np.full(n, -1, dtype=np.int64)
    pos = np.flatnonzero(issuing)
    keys = list(zip(comm_ev["pid"].to_numpy()[pos], comm_ev["tid"].to_numpy()[pos]))
    by_thread: dict = {}
    for p, key in zip(pos.tolist(), keys):
        by_thread.setdefault(key, []).append(p)
    for rows in by_thread.values():
        rows.sort(key=lambda i: (ts[i], -end[i]))
        outer, outer_end = -1, -np.inf
        for i in rows:
            if ts[i] >= outer_end:
                outer, outer_end = i, end[i]
            owner[i] = outer
    issued = np.flatnonzero(owner == np.arange(n))
    members: dict[int, list[int]] = {}
    for i in np.flatnonzero(owner >= 0).tolist():
        members.setdefault(int(owner[i]), []).append(i)
    issued_type = {}
    for i in issued.tolist():
        std = [own[j] for j in members[i] if own[j] in STANDARD_COLLECTIVES]
        issued_type[i] = std[0] if std else own[i]
        for j in members[i]:
            types[j] = issued_type[i]
    counted[issued] = True

    # transport events per own type, in time order; each issued op takes one
    tpos = np.flatnonzero(transport)
    tpos = tpos[np.argsort(ts[tpos], kind="stable")]
    lanes: dict[str, list[int]] = {}
    for i in tpos.tolist():
        lanes.setdefault(own[i], []).append(i)
    lane_ts = {t: [ts[i] for i in rows] for t, rows in lanes.items()}
    paired = np.zeros(n, dtype=bool)
    issuer = np.full(n, -1, dtype=np.int64)
    for i in sorted(issued.tolist(), key=lambda i: ts[i]):
        typ = issued_type[i]
        sizes = set().union(*(_numels(args[j]) for j in members[i]))
        best = None
        for lane in TRANSPORT_OPS.get(typ, (typ,)):
            rows = lanes.get(lane)
            if not rows:
                continue
            k = bisect.bisect_left(lane_ts[lane], ts[i])
            for j in rows[k:k + _PAIR_SCAN]:
                if paired[j]:
                    continue
                got = _first_numel(args[j])
                if sizes and got is not None and got not in sizes:
                    continue
                if best is None or ts[j] < ts[best]:
                    best = j
                break
        if best is not None:
            paired[best] = True
            types[best] = typ
            issuer[best] = i
    issued_types = set(issued_type.values())
    for i in tpos.tolist():
        if paired[i] or own[i] in issued_types:
            continue
        runs_as = [t for t in issued_types if own[i] in TRANSPORT_OPS.get(t, ())]
        if len(runs_as) == 1:
            types[i] = runs_as[0]
    if not len(issued):
        counted[tpos] = True
    comm["type"] = types
    comm["counted"] = counted
    # issued through a functional collective (tensor parallelism, DTensor), and the transport
    # events that ran such an op
    functional = np.zeros(n, dtype=bool)
    for i in issued.tolist():
        functional[i] = any(names[j].startswith(_FUNCTIONAL) for j in members[i])
    functional[issuer >= 0] = functional[issuer[issuer >= 0]]
    comm["functional"] = functional
    # the record of the op that issued each transport event (record_param_comms: its group's
    # ranks, description, Seq) — gloo's worker events name no group themselves
    record = {}
    for i in issued.tolist():
        record[i] = next((args[j] for j in members[i] if isinstance(args[j], dict)
                          and "Collective name" in args[j]), None)
    comm["issuer_record"] = pd.Series([record.get(int(k)) if k >= 0 else None for k in issuer],
                                      index=comm.index, dtype=object)
    return comm


def _gpu_comm_types(trace: RankTrace, comm_ev: pd.DataFrame) -> pd.DataFrame:
    """Collective type of each GPU communication event and the issued ops it accounts for
    (:func:`pardiag.analyzer.analyses.issued_ops.gpu_issued_ops`: the type the launching host op
    names before the kernel's; an op counts once however many kernels it ran as), plus one row
    without times (``ts``/``dur`` NaN) per issued op whose kernels the trace lost."""
    comm = comm_ev[["name", "ts", "dur", "args", "correlation"]].copy()
    issued = gpu_issued_ops(trace, comm_ev)
    comm["type"] = issued.kernel_types()
    comm["counted"] = issued.kernel_counts()
    lost = issued.ops[issued.ops["missing"]]
    if len(lost):
        comm = pd.concat([comm, pd.DataFrame({
            "name": lost["op"].to_numpy(), "ts": np.nan, "dur": np.nan, "args": None,
            "correlation": -1, "type": lost["op"].to_numpy(), "counted": 1})],
            ignore_index=True)
    return comm


def _collective_rows(rank: int, parts: RankParts) -> list[dict]:
    rows = []
    comm = parts.comm_events
    for typ, grp in comm.groupby("type", sort=True):
        u = _intervals(grp)
        rows.append({"rank": rank, "collective": typ, "count": int(grp["counted"].sum()),
                     "time_us": iv.total(u), "exposed_us": iv.total(iv.subtract(u, parts.k))})
    return rows


def rank_breakdown_rows(trace: RankTrace, comm_patterns=()) -> tuple[dict, list[dict], list[dict]]:
    """The per-rank part of :func:`compute_time_breakdown`: (whole-trace row, step rows,
    collective rows), without the ``rank`` column. From the rank's summary when it has one made
    with the same patterns, else computed from its events (once per trace)."""
    s = trace.summary
    if s is not None and s.matches(comm_patterns):
        return s.breakdown
    return cached(trace, ("breakdown_rows", pattern_key(comm_patterns)),
                  lambda: breakdown_rows_of(rank_parts(trace, comm_patterns, None)))


def breakdown_rows_of(parts: RankParts) -> tuple[dict, list[dict], list[dict]]:
    """Whole-trace, per-step and per-collective rows (see :class:`TimeBreakdown`, without
    ``rank``) of one rank's parts."""
    total = {"domain": parts.domain, "start_us": parts.lo, "end_us": parts.hi,
             **_metrics_over(parts.k, parts.c, parts.spans())}
    steps = [{"step": step, "start_us": lo, "end_us": hi, **_metrics(parts.k, parts.c, lo, hi)}
             for step, lo, hi in parts.step_windows]
    colls = []
    for r in _collective_rows(-1, parts):
        r.pop("rank")
        colls.append(r)
    return total, steps, colls


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
    parts = rank_parts(trace, list(comm_patterns), launch_window)
    return {"domain": parts.domain, "start_us": parts.lo, "end_us": parts.hi,
            **_metrics_over(parts.k, parts.c, parts.spans())}


def compute_time_breakdown(traces: TraceSet,
                           comm_patterns: Iterable[re.Pattern] = ()) -> TimeBreakdown:
    """Per-rank and per-step time breakdown and overlap for every rank of ``traces``.

    See the module docstring for the definitions (HTA overlap, Lumos breakdown).

    Returns:
        TimeBreakdown (tables documented there).
    """
    comm_patterns = list(comm_patterns)
    totals, steps, colls = [], [], []
    for rank, trace in traces.ranks.items():
        total, step_rows, coll_rows = rank_breakdown_rows(trace, comm_patterns)
        doc = traces.sidecars.get("comms", {}).get(rank)
        if doc:
            coll_rows = with_record_counts(coll_rows, doc.records)
        totals.append({"rank": rank, **total})
        steps.extend({"rank": rank, **r} for r in step_rows)
        colls.extend({"rank": rank, **r} for r in coll_rows)
    cols = ["rank", "domain", "start_us", "end_us", *BREAKDOWN_COLUMNS]
    step_cols = ["rank", "step", "start_us", "end_us", *BREAKDOWN_COLUMNS]
    coll_cols = ["rank", "collective", "count", "time_us", "exposed_us"]
    return TimeBreakdown(
        totals=pd.DataFrame(totals, columns=cols),
        steps=pd.DataFrame(steps, columns=step_cols),
        collectives=pd.DataFrame(colls, columns=coll_cols),
    )
