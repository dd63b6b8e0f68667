"""Why a rank is slow or idle: where its step goes on the host, why its device idles, what a
straggler does longer than its peers, and whether the run is input-bound.

**Host time** per rank and ``ProfilerStep`` (:data:`HOST_PARTS`). The step's CPU window is cut
into exclusive parts, each instant going to the first part in this order that holds it (events
of every host thread but the communication workers, :func:`classify.comm_threads`):

1. ``data_loading_us``: the DataLoader iterator (``enumerate(DataLoader)#...__next__``);
2. ``sync_us``: blocked in a device synchronization: ``cuda*Synchronize``, ``.item()``
   (``aten::_local_scalar_dense``), ``cudaMemcpy``;
3. ``comm_us``: inside a communication call (``c10d::*``, ``nccl:*``, ...) or a wait for one
   (``c10d::wait``, functional collectives' ``wait_tensor``, ``aten::wait``: tensor
   parallelism waits there for its all-reduces), or in none of the parts below while a transfer
   is in flight (a worker thread's, an async send's: DDP on gloo waits for its buckets'
   all-reduces at the end of the backward outside any operator), and the waits no op marks
   (:func:`pardiag.analyzer.analyses.breakdown.unmarked_waits`: FSDP's on gloo);
4. ``launch_us``: other CUDA/HIP runtime and driver calls (kernel launches, async copies);
5. ``optimizer_us``: inside an event whose name holds ``optimizer`` (``Optimizer.step#Adam.step``,
   ``Optimizer.zero_grad#...``);
6. ``backward_us``: inside an event whose name holds ``backward`` (autograd's
   ``evaluate_function: ...Backward0``, on any host thread: the autograd engine's device threads
   run a GPU backward while the main thread waits);
7. ``forward_us``: inside any other CPU operator, or an annotation naming ``forward`` (the
   forward pass, the loss, and whatever else runs operators outside backward and optimizer);
8. ``other_us``: the rest — time outside any operator (Python, a ``time.sleep``, waiting for the
   OS: host contention).

The parts sum to the step's span (``span_us``).

**DTensor's host work** per rank and step (``dtensor_us``, beside the parts, overlapping them):
the host time, outside the optimizer, inside DTensor's redistributions (``Redistribute``,
``RedistributeBackward``, ``NestedRedistribute``, with the collectives and waits they hold) and
its wrapping of local tensors (``_FromTorchTensor``, ``_ToTorchTensor``), plus its dispatch of
operators on DTensors: an operator holding a ``PythonSubclass`` event (torch's tensor-subclass
dispatch), less the local operators that event runs. With tensor (or sequence) parallelism on
DTensor the activations are DTensors, so this is TP's own host work; FSDP2 alone computes on
plain tensors and dispatches on DTensors only in the optimizer, which is left out.

**FSDP2's host work** per rank and step (``fsdp_us``, beside the parts): the host time inside
FSDP2's hooks (events named ``FSDP::...``: gathering and copying parameters in, resharding,
reducing gradients, with the waits for their collectives).

**Device time** per rank and step (GPU traces; NaN on CPU traces), over the same CPU step
window (:data:`DEVICE_PARTS`): ``dev_compute_us`` (compute kernels), ``dev_memory_us``
(memcpy/memset not under compute), ``wait_comm_us`` (communication kernels alone, plus idle
time while the host sat in a communication call), and the idle time with no kernel at all,
each idle interval classified by the kernel that ends it (its launch, by ``correlation``):
launched after the device fell idle — nothing was queued — it waited for the host, split by what
the host did meanwhile into ``wait_sync_us`` (in a synchronization) and ``wait_host_us`` (anything
else: launching, computing on the CPU, Python: launch- or CPU-bound); launched before — work was
queued but did not run (a cross-stream dependency) — ``wait_other_us``. An idle interval that no
kernel ends within the window counts as waiting for the host. HTA's idle time breakdown
(``get_idle_time_breakdown``: host wait, kernel wait, other, per stream) uses the same
queued-or-not test per stream; here the device is idle only when no stream runs a kernel.

**Cross-rank** (:func:`excess_table`): per rank and part, its median over steps and how much it
exceeds the median of the other ranks in the same step (median over steps, µs).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import numpy as np
import pandas as pd

from ..trace import intervals as iv
from ..trace.classify import (
    Kind,
    cached,
    classify,
    name_test,
    pattern_key,
    profiler_steps,
    transport,
)
from ..trace.traceset import RankTrace, isin_mask, stack_by_rank, summary_table
from .breakdown import unmarked_waits
from .issued_ops import launch_times
from .peers import median_of_others

#: Host parts of a step, in the order that decides an instant held by several.
HOST_PARTS = ("data_loading_us", "sync_us", "comm_us", "launch_us", "optimizer_us",
              "backward_us", "forward_us", "other_us")
#: Device parts of a step (GPU traces).
DEVICE_PARTS = ("dev_compute_us", "dev_memory_us", "wait_comm_us", "wait_sync_us",
                "wait_host_us", "wait_other_us")
#: Columns of one rank's table (:func:`rank_causes`); the run's tables add ``rank`` first.
CAUSE_COLUMNS = ("step", "start_us", "end_us", "span_us", *HOST_PARTS, *DEVICE_PARTS,
                 "dtensor_us", "fsdp_us")
#: FSDP2's hooks (``torch.distributed.fsdp.fully_shard``) name their record_function ranges so.
FSDP_RE = re.compile(r"^FSDP::")
#: DTensor's redistributions and local-tensor wraps (torch.distributed.tensor), by event name.
DTENSOR_EVENTS = frozenset({"Redistribute", "RedistributeBackward", "NestedRedistribute",
                            "_FromTorchTensor", "_ToTorchTensor"})
#: The event torch's profiler records around a tensor subclass's ``__torch_dispatch__``.
SUBCLASS_DISPATCH = "PythonSubclass"
_DTENSOR_NAMES = DTENSOR_EVENTS | {SUBCLASS_DISPATCH}

#: What each part is, in words (terminal, HTML, straggler evidence).
PART_LABELS = {
    "data_loading_us": "data loading", "sync_us": "synchronization", "comm_us": "communication "
    "calls and waits", "launch_us": "kernel launches", "optimizer_us": "optimizer", "backward_us":
    "backward", "forward_us": "forward and other operators", "other_us": "outside any operator",
    "dev_compute_us": "device computing", "dev_memory_us": "device copying",
    "wait_comm_us": "device waiting for communication", "wait_sync_us": "device idle during a "
    "host synchronization", "wait_host_us": "device idle waiting for the host",
    "wait_other_us": "device idle with work queued",
}

DATALOADER_RE = re.compile(r"^enumerate\(DataLoader\)")
#: Waits for communication: the host blocks on a collective's work, not on the device.
COMM_WAIT_RE = re.compile(r"^(aten::_?wait\b|c10d::wait|_?c10d_functional::wait_tensor)")
SYNC_RE = re.compile(r"^(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize"
                     r"|cudaStreamWaitEvent|hipStreamSynchronize|hipDeviceSynchronize"
                     r"|hipEventSynchronize)|^(aten::_local_scalar_dense|cudaMemcpy|hipMemcpy)$")
#: Host calls that block the host until the device has run up to them (not
#: ``cudaStreamWaitEvent``: that makes a stream wait, the host goes on).
HOST_SYNC_RE = re.compile(r"^(cuda|hip)(Stream|Device|Event)Synchronize"
                          r"|^(aten::_local_scalar_dense|cudaMemcpy|hipMemcpy)$")
OPTIMIZER_RE = re.compile(r"optimizer", re.IGNORECASE)
BACKWARD_RE = re.compile(r"backward", re.IGNORECASE)
FORWARD_RE = re.compile(r"forward", re.IGNORECASE)


def _iv(ev: pd.DataFrame) -> np.ndarray:
    ts = ev["ts"].to_numpy(dtype=float)
    return iv.union(ts, ts + ev["dur"].to_numpy(dtype=float))


def _iv_of(trace: RankTrace, mask: np.ndarray) -> np.ndarray:
    """:func:`_iv` of the events of ``trace`` where ``mask`` (bool per event) holds, without
    taking the rows out of the event table."""
    ts, end = cached(trace, "ts_end", lambda: (
        trace.events["ts"].to_numpy(dtype=float),
        (trace.events["ts"] + trace.events["dur"]).to_numpy(dtype=float)))
    return iv.union(ts[mask], end[mask])


def rank_causes(trace: RankTrace) -> pd.DataFrame:
    """One rank's host and device parts per ``ProfilerStep`` (:data:`CAUSE_COLUMNS`, µs; see
    the module docstring). From the rank's summary when it holds them, else from its events
    (once per trace). Empty without profiler steps."""
    s = trace.summary
    if s is not None and getattr(s, "causes", None) is not None:
        return s.causes
    return cached(trace, "causes", lambda: causes_of_trace(trace))


def rank_data_loading(trace: RankTrace) -> np.ndarray:
    """The rank's data loading: the host intervals of its DataLoader iterator
    (``enumerate(DataLoader)#...__next__``), shape (n, 2), µs on the rank's own clock, merged
    and sorted (empty without any). From the rank's summary when it holds them, else from its
    events (once per trace)."""
    s = trace.summary
    if s is not None and getattr(s, "data_loading", None) is not None:
        return s.data_loading
    return cached(trace, "data_loading", lambda: data_loading_of_trace(trace))


@dataclasses.dataclass(frozen=True)
class LaunchEdges:
    """What held a GPU rank's computation after each of its communication kernels: the launch
    edges (runtime call → kernel, by ``correlation``) and the host's synchronizations.

    Attributes:
        after_comm: shape (n, 3), per communication kernel end (sorted): ``[end, start of the
            first compute kernel starting at or after it (NaN: none), end of that kernel's
            launch call (NaN: no launch found)]``, µs on the rank's own clock.
        host_syncs: the host's calls that block until the device catches up
            (:data:`HOST_SYNC_RE`), shape (m, 2), µs, merged and sorted.
        latency_us: the least time from a compute kernel's launch call's end to the kernel's
            start on this rank (≥ 0): no kernel starts sooner after its launch.
    Both arrays are empty on a CPU rank.
    """

    after_comm: np.ndarray
    host_syncs: np.ndarray
    latency_us: float = 0.0

    def launched_after(self, end: float, tol: float = 1.0) -> bool:
        """Whether the first computation after a communication kernel ending at ``end`` (µs,
        the rank's clock) could start only after that end (by more than ``tol``) because of
        its launch — its launch call's end plus :attr:`latency_us` — while the host waited for
        no device work across the end: the computation waited for its launch, not for the
        communication."""
        a = self.after_comm
        if not len(a):
            return False
        i = int(np.searchsorted(a[:, 0], end - tol))
        if i >= len(a) or abs(a[i, 0] - end) > tol or np.isnan(a[i, 2]):
            return False
        h = self.host_syncs
        j = int(np.searchsorted(h[:, 0], end, side="right")) - 1 if len(h) else -1
        return bool(a[i, 2] + self.latency_us > end + tol
                    and not (j >= 0 and h[j, 1] >= end - tol))


def rank_launch_edges(trace: RankTrace, comm_patterns=()) -> LaunchEdges:
    """The rank's :class:`LaunchEdges`: from its summary when it holds them (made with the
    same ``comm_patterns``), else from its events (once per trace and pattern list)."""
    s = trace.summary
    if (s is not None and getattr(s, "launch_edges", None) is not None
            and s.matches(comm_patterns)):
        return s.launch_edges
    return cached(trace, ("launch_edges", pattern_key(comm_patterns)),
                  lambda: launch_edges_of_trace(trace, comm_patterns))


def launch_edges_of_trace(trace: RankTrace, comm_patterns=()) -> LaunchEdges:
    """:func:`rank_launch_edges` computed from the rank's events."""
    empty = LaunchEdges(np.empty((0, 3)), np.empty((0, 2)))
    kinds = classify(trace, list(comm_patterns))
    ev = trace.events
    comp = ev[(kinds == Kind.GPU_COMPUTE.value).to_numpy()]
    comm = ev[(kinds == Kind.GPU_COMM.value).to_numpy()]
    if comp.empty or comm.empty:
        return empty
    comp = comp.sort_values("ts", kind="stable")
    starts = comp["ts"].to_numpy(dtype=float)
    launched = launch_times(trace, comp, end=True)
    ends = np.unique((comm["ts"] + comm["dur"]).to_numpy(dtype=float))
    i = np.searchsorted(starts, ends - 1.0, side="left")
    ok = i < len(starts)
    ii = np.clip(i, 0, len(starts) - 1)
    after = np.column_stack([ends, np.where(ok, starts[ii], np.nan),
                             np.where(ok, launched[ii], np.nan)])
    host = ev[isin_mask(ev["cat"], ["cuda_runtime", "cuda_driver", "cpu_op"])
              & _named(trace, "host_sync", HOST_SYNC_RE)]
    lag = starts - launched
    lag = lag[~np.isnan(lag)]
    return LaunchEdges(after, _iv(host) if len(host) else np.empty((0, 2)),
                       max(0.0, float(lag.min())) if len(lag) else 0.0)


def data_loading_of_trace(trace: RankTrace) -> np.ndarray:
    """:func:`rank_data_loading` computed from the rank's events."""
    kinds = classify(trace, [])
    return _iv(trace.events[_host(trace, kinds) & _named(trace, "dataloader", DATALOADER_RE)])


def _named(trace: RankTrace, key: str, rx: re.Pattern) -> np.ndarray:
    return name_test(trace, ("causes", key), lambda n: rx.search(n) is not None)


def _host(trace: RankTrace, kinds: pd.Series) -> np.ndarray:
    """The host events that are the thread's own work: operators, annotations and runtime
    calls, less transfers in flight (workers' events, async isend spans) and step markers."""
    return (isin_mask(trace.events["cat"],
                      ["cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"])
            & ~transport(trace) & (kinds != Kind.STEP.value).to_numpy())


def causes_of_trace(trace: RankTrace) -> pd.DataFrame:
    """:func:`rank_causes` computed from the rank's events."""
    kinds = classify(trace, [])
    steps = profiler_steps(trace, kinds)
    empty = pd.DataFrame(columns=list(CAUSE_COLUMNS)).astype(float)
    if steps.empty:
        return empty
    ev = trace.events
    cat = ev["cat"]
    named = functools.partial(_named, trace)
    moving = transport(trace)  # transfers in flight: workers' events, async isend spans
    host = _host(trace, kinds)
    is_cpu_comm = (kinds == Kind.CPU_COMM.value).to_numpy()
    is_sync = host & named("sync", SYNC_RE)
    is_runtime = isin_mask(cat, ["cuda_runtime", "cuda_driver"])
    sets = {
        "data_loading_us": host & named("dataloader", DATALOADER_RE),
        "sync_us": is_sync,
        "comm_us": host & (is_cpu_comm | named("comm_wait", COMM_WAIT_RE)),
        "launch_us": host & is_runtime & ~is_sync,
        "optimizer_us": host & named("optimizer", OPTIMIZER_RE),
        "backward_us": host & named("backward", BACKWARD_RE),
        "forward_us": host & (((cat == "cpu_op").to_numpy())
                              | named("forward", FORWARD_RE)),
    }
    # waits no op marks (FSDP's on gloo) are communication waits, not the enclosing op's work
    unmarked = unmarked_waits(trace)
    parts, taken = {}, iv.EMPTY.copy()
    for name, mask in sets.items():
        own = _iv_of(trace, mask)
        if name == "comm_us" and len(unmarked):
            own = iv.merge(own, unmarked)
        own = iv.subtract(own, taken)
        parts[name] = own
        taken = iv.merge(taken, own)
    # outside any operator while a transfer is in flight: waiting for communication (DDP on
    # gloo waits for its buckets' all-reduces at the end of the backward in no op; a pipeline
    # waits for its async sends at the step's end); the work the thread does meanwhile is its
    # own part
    in_flight = moving & is_cpu_comm
    parts["comm_us"] = iv.merge(parts["comm_us"], iv.subtract(_iv_of(trace, in_flight), taken))
    gpu = trace.has_gpu
    if gpu:
        dev = _device_sets(trace, kinds)
    dtensor = (iv.subtract(dtensor_intervals(ev[host]),
                           _iv_of(trace, host & named("optimizer", OPTIMIZER_RE)))
               if (host & name_test(trace, ("causes", "dtensor"), _DTENSOR_NAMES.__contains__)
                   ).any() else iv.EMPTY.copy())
    fsdp = _iv_of(trace, host & named("fsdp", FSDP_RE))
    rows = []
    for step, lo, hi in steps[["step", "start_us", "end_us"]].itertuples(index=False):
        row = {"step": int(step), "start_us": float(lo), "end_us": float(hi),
               "span_us": float(hi - lo)}
        for name, s in parts.items():
            row[name] = iv.total(iv.clip(s, lo, hi))
        row["other_us"] = row["span_us"] - sum(row[p] for p in HOST_PARTS[:-1])
        row.update(_device_row(dev, parts, lo, hi) if gpu else
                   {p: np.nan for p in DEVICE_PARTS})
        row["dtensor_us"] = iv.total(iv.clip(dtensor, lo, hi))
        row["fsdp_us"] = iv.total(iv.clip(fsdp, lo, hi))
        rows.append(row)
    return pd.DataFrame(rows, columns=list(CAUSE_COLUMNS)).astype(
        {c: float for c in CAUSE_COLUMNS if c != "step"})


def dtensor_intervals(host: pd.DataFrame) -> np.ndarray:
    """DTensor's host work among ``host`` events (rows of :data:`traceset.EVENT_COLUMNS`):
    the union of its redistribution and wrap events (:data:`DTENSOR_EVENTS`) and of each
    subclass dispatch's overhead, the operator around a :data:`SUBCLASS_DISPATCH` event less
    the operators that event holds directly (nesting per thread from ``ts``/``dur``). Sorted
    disjoint ``[start, end]`` µs rows; empty when the trace has no DTensor."""
    names = host["name"]
    red = host[names.isin(DTENSOR_EVENTS)]
    out = _iv(red)
    if not (names == SUBCLASS_DISPATCH).any():
        return out
    outer, inner = [], []
    for _, ev in host.groupby("tid", sort=False):
        if not (ev["name"] == SUBCLASS_DISPATCH).any():
            continue
        order = np.lexsort((-ev["dur"].to_numpy(float), ev["ts"].to_numpy(float)))
        ts = ev["ts"].to_numpy(float)[order]
        end = ts + ev["dur"].to_numpy(float)[order]
        nm = ev["name"].to_numpy()[order]
        stack: list[int] = []
        for i in range(len(ts)):
            while stack and ts[i] >= end[stack[-1]]:
                stack.pop()
            if stack:
                parent = stack[-1]
                if nm[i] == SUBCLASS_DISPATCH:
                    outer.append((ts[parent], end[parent]))
                elif nm[parent] == SUBCLASS_DISPATCH:
                    inner.append((ts[i], end[i]))
            stack.append(i)
    if outer:
        o, n = np.array(outer), np.array(inner).reshape(-1, 2)
        out = iv.merge(out, iv.subtract(iv.union(o[:, 0], o[:, 1]), iv.union(n[:, 0], n[:, 1])))
    return out


def _device_sets(trace: RankTrace, kinds: pd.Series) -> dict:
    """Kernel interval sets and each kernel's start and launch time (µs, trace clock)."""
    ev = trace.events
    dev_mask = isin_mask(kinds, [Kind.GPU_COMPUTE.value, Kind.GPU_COMM.value,
                                 Kind.GPU_MEMORY.value])
    kern = ev[dev_mask]
    rt = ev[isin_mask(ev["cat"], ["cuda_runtime", "cuda_driver"])
            & (ev["correlation"] >= 0).to_numpy()]
    launch = pd.Series(rt["ts"].to_numpy(dtype=float), index=rt["correlation"].to_numpy())
    launch = launch[~launch.index.duplicated(keep="first")]
    lt = launch.reindex(kern["correlation"].to_numpy()).to_numpy(dtype=float)
    start = kern["ts"].to_numpy(dtype=float)
    order = np.argsort(start, kind="stable")
    return {"k": _iv_of(trace, (kinds == Kind.GPU_COMPUTE.value).to_numpy()),
            "m": _iv_of(trace, (kinds == Kind.GPU_MEMORY.value).to_numpy()),
            "c": _iv_of(trace, (kinds == Kind.GPU_COMM.value).to_numpy()),
            "start": start[order], "launch": lt[order]}


def _device_row(dev: dict, parts: dict, lo: float, hi: float) -> dict:
    k = iv.clip(dev["k"], lo, hi)
    m = iv.subtract(iv.clip(dev["m"], lo, hi), k)
    busy = iv.merge(k, m)
    c = iv.subtract(iv.clip(dev["c"], lo, hi), busy)
    idle = iv.subtract(iv.union([lo], [hi]), iv.merge(busy, c))
    # the kernel that ends each gap: the first one starting at or after its end; the gap is
    # idle with work queued when that kernel was launched before the gap began
    start, launch = dev["start"], dev["launch"]
    queued = np.zeros(len(idle), dtype=bool)
    if len(start):
        i = np.searchsorted(start, idle[:, 1], side="left")
        j = np.minimum(i, len(start) - 1)
        lt = np.where((i < len(start)) & (start[j] <= hi), launch[j], np.nan)
        with np.errstate(invalid="ignore"):
            queued = lt < idle[:, 0]   # NaN (no such kernel, or its launch unknown) is False
    hw, other = idle[~queued], idle[queued]
    sync = iv.intersect(hw, parts["sync_us"])
    comm = iv.intersect(iv.subtract(hw, sync), parts["comm_us"])
    host = iv.subtract(iv.subtract(hw, sync), comm)
    return {"dev_compute_us": iv.total(k), "dev_memory_us": iv.total(m),
            "wait_comm_us": iv.total(c) + iv.total(comm), "wait_sync_us": iv.total(sync),
            "wait_host_us": iv.total(host),
            "wait_other_us": iv.total(other)}


#: Columns of :func:`excess_table`.
EXCESS_COLUMNS = ("rank", "part", "rank_us", "peers_us", "excess_us")


def excess_table(per_step: pd.DataFrame) -> pd.DataFrame:
    """Per rank and part (:data:`HOST_PARTS`, :data:`DEVICE_PARTS` where known): ``rank_us``
    (its median over steps), ``peers_us`` (median over steps of the other ranks' median in
    that step) and ``excess_us`` (median over steps of its value less the other ranks' median
    in the same step). Steps that not every rank has are left out; empty with fewer than two
    ranks."""
    if per_step is None or per_step.empty or per_step["rank"].nunique() < 2:
        return pd.DataFrame(columns=list(EXCESS_COLUMNS))
    cols: dict[str, list] = {c: [] for c in EXCESS_COLUMNS}
    parts = [*HOST_PARTS, *DEVICE_PARTS]
    # one pivot for every part (steps × (part, rank)), then each part's table in numpy
    wide = per_step.pivot_table(index="step", columns="rank", values=parts, aggfunc="sum",
                                dropna=False)
    for part in parts:
        if part not in wide.columns.get_level_values(0):
            continue
        t = wide[part].dropna()
        if t.empty:
            continue
        x = t.to_numpy(dtype=float)
        peers = median_of_others(x)   # steps × ranks
        mine, theirs, excess = (np.median(a, axis=0) for a in (x, peers, x - peers))
        cols["rank"] += [int(r) for r in t.columns]
        cols["part"] += [part] * len(t.columns)
        for c, v in (("rank_us", mine), ("peers_us", theirs), ("excess_us", excess)):
            cols[c] += v.tolist()
    if not cols["rank"]:
        return pd.DataFrame(columns=list(EXCESS_COLUMNS))
    return pd.DataFrame(cols, columns=list(EXCESS_COLUMNS))


#: Data loading is a significant share of the step from this share of its span (%).
INPUT_BOUND_PCT = 10.0
#: A GPU run is host-bound when its devices compute under this share of the step (%) …
HOST_BOUND_BUSY_PCT = 30.0
#: … and idle waiting for the host (nothing queued, or during a host synchronization) at
#: least as long as they compute.


@dataclasses.dataclass(frozen=True)
class CausesResult:
    """Result of :func:`compute_causes`.

    Attributes:
        per_step: per rank and step: ``rank`` and :data:`CAUSE_COLUMNS` (µs).
        per_rank: per rank, the median over its steps of each part and of ``dtensor_us`` and
            ``fsdp_us`` (µs), and
            ``data_loading_pct`` / ``dev_compute_pct`` / ``wait_host_pct``: the median over steps
            of the part's share of the step (%; device shares NaN on CPU).
        excess: :func:`excess_table`.
        input_bound: None, or ``{"ranks": [...], "share_pct": {rank: %}, "data_loading_us":
            {rank: µs}, "step_us", "predicted_step_us", "all_ranks": bool}`` when data loading
            takes ≥ :data:`INPUT_BOUND_PCT` % of the step on some rank (median over steps).
            ``predicted_step_us`` = ``step_us`` (the run's median step, slowest rank per step)
            less the median over steps of the largest data loading of any rank in the step: a
            first-order estimate that puts the slowest loader on the step's critical path.
        host_bound: None, or ``{"busy_pct", "wait_host_pct", "ranks"}`` (medians over GPU ranks,
            %) when the devices compute under :data:`HOST_BOUND_BUSY_PCT` % of the step and
            idle waiting for the host at least as long.
    """

    per_step: pd.DataFrame
    per_rank: pd.DataFrame
    excess: pd.DataFrame
    input_bound: dict | None = None
    host_bound: dict | None = None

    def excess_of(self, rank: int) -> dict[str, float]:
        """``{part: excess µs}`` of one rank (empty when unknown)."""
        e = self.excess[self.excess["rank"] == rank]
        return dict(zip(e["part"], e["excess_us"].astype(float)))


def _per_rank(per_step: pd.DataFrame) -> pd.DataFrame:
    cols = [*HOST_PARTS, *DEVICE_PARTS, "dtensor_us", "fsdp_us"]
    out_cols = ["rank", "steps", "span_us", *cols, "data_loading_pct", "dev_compute_pct",
                "wait_host_pct"]
    if per_step.empty:
        return pd.DataFrame(columns=out_cols)
    d = per_step.copy()
    span = d["span_us"].where(d["span_us"] > 0)
    d["data_loading_pct"] = 100.0 * d["data_loading_us"] / span
    d["dev_compute_pct"] = 100.0 * (d["dev_compute_us"] + d["dev_memory_us"]) / span
    d["wait_host_pct"] = 100.0 * (d["wait_host_us"] + d["wait_sync_us"]) / span
    g = d.groupby("rank", sort=True)
    out = g[["span_us", *cols, "data_loading_pct", "dev_compute_pct", "wait_host_pct"]].median()
    out.insert(0, "steps", g.size())
    return out.reset_index()[out_cols]


def compute_causes(traces, run_step_us: float = float("nan")) -> CausesResult:
    """Host and device parts of every rank's steps, the cross-rank excess, and the input-bound
    and host-bound findings (see :class:`CausesResult`).

    Args:
        traces: the run (:class:`pardiag.analyzer.trace.traceset.TraceSet`).
        run_step_us: the run's median step (µs; per step the slowest rank's span), for the
            input-bound prediction.
    """
    cols = ["rank", *CAUSE_COLUMNS]
    per_step = stack_by_rank((rank, t if (t := summary_table(trace, "causes")) is not None
                              else rank_causes(trace)) for rank, trace in traces.ranks.items())
    per_step = per_step[cols] if per_step is not None else pd.DataFrame(columns=cols)
    per_rank = _per_rank(per_step)
    excess = excess_table(per_step)
    input_bound = host_bound = None
    if len(per_rank):
        heavy = per_rank[per_rank["data_loading_pct"] >= INPUT_BOUND_PCT]
        if len(heavy):
            worst = per_step.groupby("step")["data_loading_us"].max().median()
            input_bound = {
                "ranks": [int(r) for r in heavy["rank"]],
                "share_pct": {int(r): float(p) for r, p in
                              zip(per_rank["rank"], per_rank["data_loading_pct"])},
                "data_loading_us": {int(r): float(p) for r, p in
                                    zip(per_rank["rank"], per_rank["data_loading_us"])},
                "all_ranks": len(heavy) == len(per_rank),
                "step_us": float(run_step_us),
                "predicted_step_us": float(max(run_step_us - worst, 0.0))
                if not math.isnan(run_step_us) else float("nan")}
        gpu = per_rank[per_rank["dev_compute_pct"].notna()]
        if len(gpu):
            busy = float(gpu["dev_compute_pct"].median())
            wait = float(gpu["wait_host_pct"].median())
            if busy < HOST_BOUND_BUSY_PCT and wait >= busy:
                host_bound = {"busy_pct": busy, "wait_host_pct": wait,
                              "ranks": [int(r) for r in gpu["rank"]]}
    return CausesResult(per_step, per_rank, excess, input_bound, host_bound)


#: What each host part means as a straggler's cause, and what to do about it.
CAUSE_ADVICE = {
    "data_loading_us": ("its data loading", "its input pipeline: more DataLoader workers "
                        "(num_workers), pin_memory=True, prefetching (prefetch_factor)"),
    "other_us": ("outside any operator (Python, sleeps, host contention)",
                 "what it does outside any operator: Python work, sleeps, other processes on "
                 "its cores (host contention)"),
    "forward_us": ("its forward operators", "why its operators run slower: host contention or "
                   "a slower device"),
    "backward_us": ("its backward", "why its operators run slower: host contention or a "
                    "slower device"),
    "optimizer_us": ("its optimizer step", "why its optimizer runs slower: host contention or "
                     "a slower device"),
    "launch_us": ("its kernel launches", "host contention on its CPU (launches run slower)"),
    "sync_us": ("its synchronizations", "a slower device (it waits longer for its own GPU)"),
    "dev_compute_us": ("its device computing", "a slower device (clocks, thermals, a "
                       "different GPU)"),
}


@dataclasses.dataclass(frozen=True)
class StragglerCause:
    """Why a straggler is slow (:func:`straggler_cause`).

    Attributes:
        rank: the straggler.
        start_late_us: how late it enters the step (median, clocks aligned; µs), from
            :func:`pardiag.analyzer.analyses.imbalance.skew_origin`; NaN unknown.
        delay_us, top_collective, top_delay_us: its arrival delay per step, and the collective
            holding most of it (skew_origin).
        where: ``"step entry"`` (it enters late by at least half its arrival delay: the delay
            lies before the step) or ``"in the step"``.
        part: the host or device part it spends longest on beyond its peers (a key of
            :data:`CAUSE_ADVICE`), or None when no part exceeds its peers by
            :data:`CAUSE_MIN_SHARE` of its lag (the larger of ``start_late_us`` and
            ``top_delay_us``; without them, of its summed positive excess). Parts that add time
            outside operators (data loading, outside any operator, launches, synchronization,
            device computing) come before the operators' host time, which follows the host's
            load.
        excess_us: that part's excess over the peers (µs per step, median).
        parts: every part's excess (µs; :func:`excess_table`).
    """

    rank: int
    start_late_us: float
    delay_us: float
    top_collective: str | None
    top_delay_us: float
    where: str
    part: str | None
    excess_us: float
    parts: dict

    def sentence(self) -> str:
        """``"rank 7 enters each step 7.5 ms late; its data loading takes 7.2 ms longer than
        its peers'"``."""
        bits = []
        if self.where == "step entry":
            bits.append(f"rank {self.rank} enters each step {self.start_late_us / 1e3:.1f} ms "
                        "late")
        elif self.top_collective:
            bits.append(f"rank {self.rank} arrives {self.top_delay_us / 1e3:.1f} ms late at "
                        f"{self.top_collective}")
        if self.part is not None:
            what = CAUSE_ADVICE[self.part][0]
            verb = "is" if self.part == "other_us" else "takes"
            bits.append(f"{what} {verb} {self.excess_us / 1e3:.1f} ms longer than its peers'"
                        if self.part != "other_us" else
                        f"it spends {self.excess_us / 1e3:.1f} ms more than its peers {what}")
        elif self.where == "step entry":
            bits.append("nothing inside its step takes longer: the delay lies before the step "
                        "(data loading before the step began, the previous step's tail)")
        return "; ".join(bits) if bits else f"rank {self.rank}: cause not found"

    def advice(self) -> str:
        """What to look at, one phrase."""
        if self.part is not None:
            return CAUSE_ADVICE[self.part][1]
        if self.where == "step entry":
            return ("what it does before each step: data loading, the previous step's tail "
                    "(logging, checkpointing, evaluation)")
        return "what delays it: host load, data loading, a slower device or link"


#: A part names a straggler's cause when its excess is at least this share of the straggler's
#: lag (:class:`StragglerCause`).
CAUSE_MIN_SHARE = 0.3
#: Parts that are operators' time (on the host or the device).
_OPERATOR_PARTS = {"forward_us", "backward_us", "optimizer_us"}
#: Parts that are waiting for the others (a straggler waits less), never a cause.
_WAITING = {"comm_us", "wait_comm_us", "wait_other_us", "wait_host_us", "wait_sync_us",
            "dev_memory_us"}


def straggler_cause(causes: CausesResult | None, skew: pd.DataFrame | None,
                    rank: int) -> StragglerCause:
    """Decompose rank ``rank``'s extra time over its peers: where in the step it arises (``skew``:
    :func:`pardiag.analyzer.analyses.imbalance.skew_origin`) and which part it spends longer on
    (``causes.excess``; on GPU ranks the device's computing, on every rank the host parts but
    those that are waiting for the others: communication, device waits)."""
    row = None
    if skew is not None and len(skew):
        m = skew[skew["rank"] == rank]
        row = m.iloc[0] if len(m) else None
    late = float(row["start_late_us"]) if row is not None else float("nan")
    delay = float(row["delay_us"]) if row is not None else float("nan")
    top = row["top_collective"] if row is not None else None
    top_us = float(row["top_delay_us"]) if row is not None else 0.0
    where = ("step entry" if not math.isnan(late) and late > 0
             and (not delay > 0 or late >= 0.5 * delay) else "in the step")
    parts = causes.excess_of(rank) if causes is not None else {}
    cand = {p: v for p, v in parts.items() if p in CAUSE_ADVICE and not math.isnan(v) and v > 0}
    lag = max(x for x in (late, top_us, 0.0) if not math.isnan(x))
    need = CAUSE_MIN_SHARE * (lag if lag > 0 else sum(cand.values()))
    cand = {p: v for p, v in cand.items() if v >= need and v > 0}
    part, ex = None, 0.0
    # time added outside operators first: op times follow the host's load (a planted 30 ms
    # data delay on a loaded 2-core machine came with forward ops 113 vs 49 ms on its peer)
    added = {p: v for p, v in cand.items() if p not in _OPERATOR_PARTS}
    pick = added or cand
    if pick:
        part = max(pick, key=pick.get)
        ex = float(pick[part])
    return StragglerCause(rank=int(rank), start_late_us=late, delay_us=delay,
                          top_collective=top if isinstance(top, str) else None,
                          top_delay_us=top_us, where=where, part=part, excess_us=ex,
                          parts=parts)
