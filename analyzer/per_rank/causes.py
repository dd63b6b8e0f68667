"""Why one rank is slow or idle, from its own trace: its host and device parts per profiler
step (:func:`causes_of_trace`, :data:`CAUSE_COLUMNS`), its data loading
(:func:`data_loading_of_trace`) and what held its computation after each communication kernel
(:class:`LaunchEdges`).

Definitions of every part: :mod:`pardiag.analyzer.analyses.causes`, which compares the ranks.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from ..trace import intervals as iv
from ..trace import vocab
from ..trace.classify import (
    Kind,
    cached,
    classify,
    name_test,
    profiler_steps,
    transport,
)
from ..trace.traceset import RankTrace, isin_mask
from .breakdown import unmarked_waits
from .issued_ops import launch_times

#: Host parts of a step, in the order that decides an instant held by several.
HOST_PARTS = ("data_loading_us", "sync_us", "comm_us", "launch_us", "optimizer_us",
              "backward_us", "forward_us", "other_us")


#: Device parts of a step (GPU traces).
DEVICE_PARTS = ("dev_compute_us", "dev_memory_us", "wait_comm_us", "wait_sync_us",
                "wait_host_us", "wait_other_us")


#: Columns of one rank's table (:func:`rank_causes`); the run's tables add ``rank`` first.
CAUSE_COLUMNS = ("step", "start_us", "end_us", "span_us", *HOST_PARTS, *DEVICE_PARTS,
                 "dtensor_us", "fsdp_us")


_DTENSOR_NAMES = vocab.DTENSOR_EVENTS | {vocab.SUBCLASS_DISPATCH}


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


@dataclasses.dataclass(frozen=True)
class LaunchEdges:
    """What held a GPU rank's computation after each of its communication kernels: the launch
    edges (runtime call → kernel, by ``correlation``) and the host's synchronizations.

    Attributes:
        after_comm: shape (n, 3), per communication kernel end (sorted): ``[end, start of the
            first compute kernel starting at or after it (NaN: none), end of that kernel's
            launch call (NaN: no launch found)]``, µs on the rank's own clock.
        host_syncs: the host's calls that block until the device catches up
            (:data:`vocab.HOST_SYNC_RE`), shape (m, 2), µs, merged and sorted.
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

    def to_json(self) -> dict[str, Any]:
        return {"after_comm": self.after_comm.tolist(), "host_syncs": self.host_syncs.tolist(),
                "latency_us": self.latency_us}

    @staticmethod
    def from_json(d: dict[str, Any]) -> LaunchEdges:
        a = np.asarray(d["after_comm"], dtype=np.float64)
        h = np.asarray(d["host_syncs"], dtype=np.float64)
        return LaunchEdges(a.reshape(-1, 3) if a.size else np.empty((0, 3)),
                           h.reshape(-1, 2) if h.size else np.empty((0, 2)),
                           float(d["latency_us"]))


def launch_edges_of_trace(trace: RankTrace, comm_patterns: Iterable[re.Pattern[str]] = ()
                          ) -> LaunchEdges:
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
              & _named(trace, "host_sync", vocab.HOST_SYNC_RE)]
    lag = starts - launched
    lag = lag[~np.isnan(lag)]
    return LaunchEdges(after, _iv(host) if len(host) else np.empty((0, 2)),
                       max(0.0, float(lag.min())) if len(lag) else 0.0)


def data_loading_of_trace(trace: RankTrace) -> np.ndarray:
    """:func:`rank_data_loading` computed from the rank's events."""
    kinds = classify(trace, [])
    return _iv(trace.events[_host(trace, kinds) & _named(trace, "dataloader", vocab.DATALOADER_RE)])


def _named(trace: RankTrace, key: str, rx: re.Pattern[str]) -> np.ndarray:
    return name_test(trace, ("causes", key), lambda n: rx.search(n) is not None)


def _host(trace: RankTrace, kinds: pd.Series) -> np.ndarray:
    """The host events that are the thread's own work: operators, annotations and runtime
    calls, less transfers in flight (workers' events, async isend spans) and step markers."""
    own: np.ndarray = (isin_mask(trace.events["cat"],
                                 ["cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"])
                       & ~transport(trace) & (kinds != Kind.STEP.value).to_numpy())
    return own


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
    is_sync = host & named("sync", vocab.SYNC_RE)
    is_runtime = isin_mask(cat, ["cuda_runtime", "cuda_driver"])
    sets = {
        "data_loading_us": host & named("dataloader", vocab.DATALOADER_RE),
        "sync_us": is_sync,
        "comm_us": host & (is_cpu_comm | named("comm_wait", vocab.COMM_WAIT_RE)),
        "launch_us": host & is_runtime & ~is_sync,
        "optimizer_us": host & named("optimizer", vocab.OPTIMIZER_RE),
        "backward_us": host & named("backward", vocab.BACKWARD_RE),
        # operators only: inside a forward annotation (DDP's, a module's) but outside any
        # operator, the host runs Python or sleeps (other_us), not the forward's operators
        "forward_us": host & (cat == "cpu_op").to_numpy(),
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
                           _iv_of(trace, host & named("optimizer", vocab.OPTIMIZER_RE)))
               if (host & name_test(trace, ("causes", "dtensor"), _DTENSOR_NAMES.__contains__)
                   ).any() else iv.EMPTY.copy())
    fsdp = _iv_of(trace, host & named("fsdp", vocab.FSDP_RE))
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
    the union of its redistribution and wrap events (:data:`vocab.DTENSOR_EVENTS`) and of each
    subclass dispatch's overhead, the operator around a :data:`vocab.SUBCLASS_DISPATCH` event less
    the operators that event holds directly (nesting per thread from ``ts``/``dur``). Sorted
    disjoint ``[start, end]`` µs rows; empty when the trace has no DTensor."""
    names = host["name"]
    red = host[names.isin(vocab.DTENSOR_EVENTS)]
    out = _iv(red)
    if not (names == vocab.SUBCLASS_DISPATCH).any():
        return out
    outer, inner = [], []
    for _, ev in host.groupby("tid", sort=False):
        if not (ev["name"] == vocab.SUBCLASS_DISPATCH).any():
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
                if nm[i] == vocab.SUBCLASS_DISPATCH:
                    outer.append((ts[parent], end[parent]))
                elif nm[parent] == vocab.SUBCLASS_DISPATCH:
                    inner.append((ts[i], end[i]))
            stack.append(i)
    if outer:
        o, n = np.array(outer), np.array(inner).reshape(-1, 2)
        out = iv.merge(out, iv.subtract(iv.union(o[:, 0], o[:, 1]), iv.union(n[:, 0], n[:, 1])))
    return out


def _device_sets(trace: RankTrace, kinds: pd.Series) -> dict[str, np.ndarray]:
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


def _device_row(dev: dict[str, np.ndarray], parts: dict[str, np.ndarray], lo: float, hi: float
                ) -> dict[str, float]:
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
