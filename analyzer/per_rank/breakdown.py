"""The time breakdown's per-rank half: one rank's computation and communication interval sets,
its step windows and its communication events with their collective types
(:class:`RankParts`), and the breakdown rows they give (:func:`breakdown_rows_of`).

Definitions: :mod:`pardiag.analyzer.analyses.breakdown` (HTA's overlap, Lumos' breakdown,
FACTS §3), which stacks these rows over the ranks.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..trace import intervals as iv
from ..trace import vocab
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
from ..trace.traceset import (
    ColumnTable,
    HoldsTables,
    RankTrace,
    StoredTable,
    frame_json,
    isin_mask,
)
from .issued_ops import gpu_issued_ops, launch_times


def _overlapping(ivs: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The rows of a sorted, disjoint interval set that may overlap ``[lo, hi)`` (a view; what
    :func:`iv.clip` keeps of the set is the same with or without the other rows)."""
    if len(ivs) < 64:
        return ivs
    i0 = int(np.searchsorted(ivs[:, 1], lo, side="right"))
    i1 = int(np.searchsorted(ivs[:, 0], hi, side="left"))
    return ivs[i0:max(i0, i1)]


_EMPTY = np.empty((0, 2), dtype=np.float64)
#: The columns of a breakdown row that add up over disjoint windows (µs); the shares are
#: recomputed from them.
ADDITIVE_COLUMNS = ("span_us", "compute_us", "comm_us", "overlap_us", "compute_only_us",
                    "exposed_comm_us", "memory_only_us", "idle_us")


def metrics(k: np.ndarray, c: np.ndarray, lo: float, hi: float, m: np.ndarray = _EMPTY
            ) -> dict[str, float]:
    """The breakdown of ``[lo, hi)`` (µs) from the computation ``k``, communication ``c`` and
    memory-copy ``m`` interval sets (:mod:`pardiag.analyzer.analyses.breakdown` defines each
    part): the five parts compute only, overlap, exposed communication, memory copies only and
    idle add up to the span."""
    k = iv.clip(_overlapping(k, lo, hi), lo, hi)
    c = iv.clip(_overlapping(c, lo, hi), lo, hi)
    span = max(0.0, hi - lo)
    comp = iv.total(k)
    comm = iv.total(c)
    ov = iv.total(iv.intersect(k, c))
    busy = comp + comm - ov
    # a copy or memset while no kernel computes or communicates: the device is not idle
    mem = (iv.total(iv.subtract(iv.clip(_overlapping(m, lo, hi), lo, hi), iv.merge(k, c)))
           if len(m) else 0.0)
    pct = (lambda x: 100.0 * x / span) if span > 0 else (lambda x: float("nan"))
    return {
        "span_us": span, "compute_us": comp, "comm_us": comm, "overlap_us": ov,
        "compute_only_us": comp - ov, "exposed_comm_us": comm - ov, "memory_only_us": mem,
        "idle_us": span - busy - mem,
        "overlap_pct": 100.0 * ov / comm if comm > 0 else float("nan"),
        "compute_only_pct": pct(comp - ov), "overlap_share_pct": pct(ov),
        "exposed_comm_pct": pct(comm - ov), "memory_only_pct": pct(mem),
        "idle_pct": pct(span - busy - mem),
    }


def metrics_over(k: np.ndarray, c: np.ndarray, spans: list[tuple[float, float]],
                 m: np.ndarray = _EMPTY) -> dict[str, float]:
    """:func:`metrics` of a rank's time made of several spans (profiling windows): times
    summed over the spans, shares of their summed length."""
    if len(spans) == 1:
        return metrics(k, c, *spans[0], m)
    parts = [metrics(k, c, lo, hi, m) for lo, hi in spans]
    tot = {key: float(sum(p[key] for p in parts)) for key in ADDITIVE_COLUMNS}
    span = tot["span_us"]
    pct = (lambda x: 100.0 * x / span) if span > 0 else (lambda x: float("nan"))
    return {**tot,
            "overlap_pct": 100.0 * tot["overlap_us"] / tot["comm_us"] if tot["comm_us"] > 0
            else float("nan"),
            "compute_only_pct": pct(tot["compute_only_us"]),
            "overlap_share_pct": pct(tot["overlap_us"]),
            "exposed_comm_pct": pct(tot["exposed_comm_us"]),
            "memory_only_pct": pct(tot["memory_only_us"]), "idle_pct": pct(tot["idle_us"])}


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
            step of a profiling window: as long as its ``ProfilerStep`` range, or to its last
            kernel's end if later), on CPU the ``ProfilerStep`` range.
        comm_events: the communication events (``name, ts, dur, args, type, counted``):
            ``counted`` is how many issued ops an event accounts for (an op counts once however
            many kernels it ran as); an issued op whose kernels the trace lost is a row with
            NaN ``ts``/``dur`` (GPU).
        segments: ``((start µs, end µs), ...)`` inside ``[lo, hi]`` that are the rank's time
            when its events come from several profiling windows (:attr:`RankTrace.windows`);
            ``()`` for one window (then ``[lo, hi]`` is).
        m: the device's memory copies and sets (memcpy, memset), shape (n, 2), µs (merged;
            empty on CPU traces): neither computation nor communication, and not idle.
    """

    domain: str
    k: np.ndarray
    c: np.ndarray
    lo: float
    hi: float
    step_windows: list[tuple[int, float, float]]
    comm_events: pd.DataFrame = StoredTable()  # name, ts, dur, args, type, counted
    segments: tuple[tuple[float, float], ...] = ()
    m: np.ndarray = dataclasses.field(default_factory=lambda: _EMPTY.copy())

    def spans(self) -> list[tuple[float, float]]:
        """The rank's time as ``[(start µs, end µs)]``: its segments, or ``[(lo, hi)]``."""
        return list(self.segments) if self.segments else [(self.lo, self.hi)]

    def to_json(self) -> dict[str, Any]:
        """The parts as JSON values (the communication events without their ``args`` and
        ``issuer_record``, which no analysis reads from a summary)."""
        comm = self.comm_events.drop(columns=["args", "issuer_record"], errors="ignore")
        return {"domain": self.domain, "k": self.k.tolist(), "c": self.c.tolist(),
                "lo": self.lo, "hi": self.hi,
                "step_windows": [list(w) for w in self.step_windows],
                "comm_events": frame_json(comm), "segments": [list(x) for x in self.segments],
                "m": self.m.tolist()}

    @staticmethod
    def from_json(d: dict[str, Any]) -> RankParts:
        """Parts read back from :meth:`to_json` (``args`` all None)."""
        ce = d["comm_events"]
        rows = len(ce["data"][0]) if ce["data"] else 0
        comm = ColumnTable([*ce["columns"], "args"], [*ce["dtypes"], "object"],
                           [*ce["data"], [None] * rows])
        return RankParts(d["domain"], _interval_rows(d["k"]), _interval_rows(d["c"]),
                         float(d["lo"]), float(d["hi"]),
                         [(int(a), float(b), float(c)) for a, b, c in d["step_windows"]], comm,
                         tuple((float(a), float(b)) for a, b in d["segments"]),
                         _interval_rows(d["m"]))


def _interval_rows(rows: list[list[float]]) -> np.ndarray:
    """Stored interval rows as an interval set, shape (n, 2)."""
    a = np.asarray(rows, dtype=np.float64)
    return a.reshape(-1, 2) if a.size else np.empty((0, 2), dtype=np.float64)


def compute_rank_parts(trace: RankTrace, comm_patterns: Iterable[re.Pattern[str]],
                       launch_window: tuple[float, float] | None) -> RankParts:
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
            step_durs = (steps["end_us"] - steps["start_us"]).to_numpy()
            for j, i in enumerate(step_idx):
                # to the next step's first kernel, unless that lies in another profiling window;
                # there (and at the last step) it lasts as long as its host's step, or to its
                # last kernel's end if later: a next step's first kernel would start as long
                # after its host step's start as this one's did (within 0.6 ms of 80-630 ms
                # steps on the real traces); in a launch window (HTA's) to its last kernel's
                # end, as the next step was left out, not absent
                nxt = j + 1 < len(step_idx) and seg[j + 1] == seg[j]
                end = (starts[j + 1] if nxt else last_ends[j] if launch_window is not None
                       else max(last_ends[j], starts[j] + step_durs[i]))
                windows.append((int(step_ids[i]), float(starts[j]),
                                float(max(starts[j], end))))
        comm = _gpu_comm_types(trace, comm_ev, kinds)
        # the rank's time runs to its last step's end: a device idle there is idle in the
        # profiled steps
        ts = np.concatenate([kernels["ts"].to_numpy(), [w[1] for w in windows]])
        te = np.concatenate([(kernels["ts"] + kernels["dur"]).to_numpy(), [w[2] for w in windows]])
        hi = max(hi, float(te.max())) if len(te) else hi
        return RankParts("gpu", k, c, lo, hi, windows, comm, _segments(ts, te, trace.windows),
                         _intervals(kernels[kk == Kind.GPU_MEMORY.value]))

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


def unmarked_waits(trace: RankTrace, comm_patterns: Iterable[re.Pattern[str]] = ()
                   ) -> np.ndarray:
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
    # Python frames (with_stack) are not ops: the frame of ``work.wait()`` would be a leaf
    # spanning the whole wait, and a leaf's own time is never taken for a wait
    ops = ev[isin_mask(kinds, [Kind.CPU_COMPUTE.value, Kind.CPU_COMM.value,
                               Kind.CPU_WAIT.value, Kind.OTHER.value]) & ~tr
             & (ev["dur"].to_numpy(dtype=float) > 0)
             & ev["cat"].ne("python_function").to_numpy()]
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


def _segments(starts: np.ndarray, ends: np.ndarray,
              windows: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
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


#: How many later transport events an issued op looks at for one with its op and size.
_PAIR_SCAN = 64


def _entry_numel(entry: Any) -> int | None:
    """Elements of one ``Input Dims`` entry: a shape, or a list of shapes (coalesced ops)."""
    if not isinstance(entry, list) or not entry:
        return None
    try:
        if all(isinstance(x, list) for x in entry):
            return sum(int(np.prod(x)) if x else 1 for x in entry)
        return int(np.prod(entry))
    except (TypeError, ValueError):
        return None


def _numels(args: Any) -> set[int]:
    dims = vocab.INPUT_DIMS.get(args)
    if not isinstance(dims, list):
        return set()
    return {n for n in map(_entry_numel, dims) if n is not None}


def _first_numel(args: Any) -> int | None:
    """Elements of the first ``Input Dims`` entry (a transport event's buffer)."""
    dims = vocab.INPUT_DIMS.get(args)
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
    issuing = ~transport & np.fromiter((bool(vocab.ISSUING_OP_RE.match(nm)) for nm in names),
                                       dtype=bool, count=n)
    types = list(own)
    counted = np.zeros(n, dtype=bool)
    ts = comm["ts"].to_numpy(dtype=float)
    end = ts + comm["dur"].to_numpy(dtype=float)
    # issued ops: the outermost issuing op per thread; nested ones belong to it
    owner = np.full(n, -1, dtype=np.int64)
    pos = np.flatnonzero(issuing)
    keys = list(zip(comm_ev["pid"].to_numpy()[pos], comm_ev["tid"].to_numpy()[pos]))
    by_thread: dict[tuple[Any, Any], list[int]] = {}
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
            lane_rows = lanes.get(lane)
            if not lane_rows:
                continue
            k = bisect.bisect_left(lane_ts[lane], ts[i])
            for j in lane_rows[k:k + _PAIR_SCAN]:
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
        functional[i] = any(names[j].startswith(vocab.FUNCTIONAL_PREFIXES) for j in members[i])
    functional[issuer >= 0] = functional[issuer[issuer >= 0]]
    comm["functional"] = functional
    # the record of the op that issued each transport event (record_param_comms: its group's
    # ranks, description, Seq) — gloo's worker events name no group themselves
    record = {}
    for i in issued.tolist():
        record[i] = next((args[j] for j in members[i]
                          if vocab.COLLECTIVE_NAME.present(args[j])), None)
    comm["issuer_record"] = pd.Series([record.get(int(k)) if k >= 0 else None for k in issuer],
                                      index=comm.index, dtype=object)
    return comm


def _gpu_comm_types(trace: RankTrace, comm_ev: pd.DataFrame, kinds: pd.Series) -> pd.DataFrame:
    """Collective type of each GPU communication event and the issued ops it accounts for
    (:func:`pardiag.analyzer.analyses.issued_ops.gpu_issued_ops`: the type the launching host op
    names before the kernel's; an op counts once however many kernels it ran as), plus one row
    without times (``ts``/``dur`` NaN) per issued op whose kernels the trace lost. A host
    thread's ``gloo:*`` event among them (gloo on CUDA tensors) is named by the op it ran, as on
    a CPU trace (:func:`cpu_comm_types`: gloo runs a reduce-scatter as ``gloo:all_reduce``)."""
    comm = comm_ev[["name", "ts", "dur", "args", "correlation"]].copy()
    issued = gpu_issued_ops(trace, comm_ev)
    comm["type"] = types = issued.kernel_types()
    per_type = issued.kernel_type_counts()
    comm["counted"] = [c.get(t, 0) for t, c in zip(types, per_type)]
    host = (kinds.reindex(comm.index) == Kind.CPU_COMM.value).to_numpy()
    if host.any():
        ran = cpu_comm_types(trace, kinds)["type"].reindex(comm.index[host])
        comm.loc[host, "type"] = ran.where(ran.notna(), comm.loc[host, "type"]).to_numpy()
    # a kernel that ran ops of several types (a coalesced block of sends and receives fused
    # into one kernel): a row more per other type, so that each type counts its own ops and
    # shows the kernel's time
    others = [(i, t, n) for i, (own, c) in enumerate(zip(types, per_type))
              for t, n in c.items() if t != own and not host[i]]
    if others:
        more = comm.iloc[[i for i, _, _ in others]].assign(
            type=[t for _, t, _ in others], counted=[n for _, _, n in others])
        comm = pd.concat([comm, more])
    lost = issued.ops[issued.ops["missing"]]
    if len(lost):
        comm = pd.concat([comm, pd.DataFrame({
            "name": lost["op"].to_numpy(), "ts": np.nan, "dur": np.nan, "args": None,
            "correlation": -1, "type": lost["op"].to_numpy(), "counted": 1})],
            ignore_index=True)
    return comm


def _collective_rows(rank: int, parts: RankParts) -> list[dict[str, Any]]:
    rows = []
    comm = parts.comm_events
    for typ, grp in comm.groupby("type", sort=True):
        u = _intervals(grp)
        rows.append({"rank": rank, "collective": typ, "count": int(grp["counted"].sum()),
                     "time_us": iv.total(u), "exposed_us": iv.total(iv.subtract(u, parts.k))})
    return rows


def breakdown_rows_of(parts: RankParts
                      ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Whole-trace, per-step and per-collective rows (see :class:`TimeBreakdown`, without
    ``rank``) of one rank's parts."""
    total = {"domain": parts.domain, "start_us": parts.lo, "end_us": parts.hi,
             **metrics_over(parts.k, parts.c, parts.spans(), parts.m)}
    steps = [{"step": step, "start_us": lo, "end_us": hi,
              **metrics(parts.k, parts.c, lo, hi, parts.m)}
             for step, lo, hi in parts.step_windows]
    colls = []
    for r in _collective_rows(-1, parts):
        r.pop("rank")
        colls.append(r)
    return total, steps, colls


#: Columns of :func:`device_timelines`.
DEVICE_COLUMNS = ("device", "kernels", "compute_us", "busy_us", "start_us", "end_us")


def device_timelines(trace: RankTrace, kinds: pd.Series) -> pd.DataFrame:
    """Each device's own timeline in one rank's trace: a process that drives several devices
    (a model split across GPUs, ``device_map="auto"``) writes all their kernels into one trace,
    and their union is no device's time.

    Args:
        trace: the rank.
        kinds: :func:`pardiag.analyzer.trace.classify.classify` of its events.

    Returns:
        :data:`DEVICE_COLUMNS`, one row per device that ran a kernel, copy or set, by device
        id (:func:`_device_ids`):
        ``kernels`` (events), ``compute_us`` (|union of its computation kernels|), ``busy_us``
        (|union of all its events|), ``start_us``/``end_us`` (its first start and last end, µs,
        trace clock); empty for a trace without device events.
    """
    k = kinds.to_numpy()
    dev = np.isin(k, [Kind.GPU_COMPUTE.value, Kind.GPU_COMM.value, Kind.GPU_MEMORY.value])
    if not dev.any():
        return pd.DataFrame(columns=list(DEVICE_COLUMNS))
    ev = trace.events
    named = (ev["device"].to_numpy()[dev] if "device" in ev.columns
             else np.array([a if type(a) is int and a >= 0 else -1
                            for a in vocab.DEVICE.values(ev["args"].to_numpy()[dev])]))
    ids = _device_ids(named, ev["pid"].to_numpy()[dev])
    ts = ev["ts"].to_numpy(dtype=float)[dev]
    end = ts + ev["dur"].to_numpy(dtype=float)[dev]
    compute = k[dev] == Kind.GPU_COMPUTE.value
    idx = np.asarray(ids)
    rows = []
    for d in sorted(set(ids) - {-1}):
        on = idx == d
        rows.append({"device": d, "kernels": int(on.sum()),
                     "compute_us": iv.total(iv.union(ts[on & compute], end[on & compute])),
                     "busy_us": iv.total(iv.union(ts[on], end[on])),
                     "start_us": float(ts[on].min()), "end_us": float(end[on].max())})
    return pd.DataFrame(rows, columns=list(DEVICE_COLUMNS))


def _device_ids(named: np.ndarray, pid: np.ndarray) -> list[int]:
    """Each device event's device (``named``, ``pid``: the device events' ``device`` column,
    -1 where an event names none, and their ``pid``): the device it names. An event without
    one is on the only device the others name; where none names one, on its ``pid`` (Kineto's
    pid of a device's events is the device; merge tools renumber pids, so a pid is read only
    when no event says more); where several are named, on the one its pid equals, else on none
    (-1, left out)."""
    # a trace names few pids; keyed by type too, as 1.0 == 1 is no device number
    memo: dict[tuple[type, object], int | None] = {}

    def as_int(x: object) -> int | None:
        key = (type(x), x)
        try:
            return memo[key]
        except KeyError:
            pass
        except TypeError:   # unhashable: a list or an object is no device number
            return None
        got = (int(x) if isinstance(x, (int, np.integer))
               else int(str(x)) if str(x).isdigit() else None)
        memo[key] = got
        return got
    arg = [d if d >= 0 else None for d in named.tolist()]
    known = {d for d in arg if d is not None}
    pids = (pid.tolist() if pid.dtype.kind in "iu"
            else [p if type(p) is int else as_int(p) for p in pid])
    if not known:
        return [-1 if p is None else p for p in pids]
    only = next(iter(known)) if len(known) == 1 else None
    return [d if d is not None else only if only is not None
            else p if p in known else -1 for d, p in zip(arg, pids)]
