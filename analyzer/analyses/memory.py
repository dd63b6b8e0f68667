"""Memory per rank: static bytes of parameters, gradients and optimizer state (local shards, from
``rank{R}.meta.json``), peaks (the trace's ``[memory]`` events, CUDA allocator peaks or peak RSS),
the allocator timeline from the trace, and the imbalance ``max / mean`` across ranks.

:func:`memory_rows` reads a rank's ``[memory]`` events; the per-rank summary keeps its result
(:mod:`pardiag.analyzer.per_rank.store`), so a report from summaries reads no raw event.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from ..per_rank.summary import summary_of
from ..trace.traceset import TraceSet, stack_by_rank


@dataclasses.dataclass(frozen=True)
class MemoryResult:
    """Result of :func:`compute_memory`.

    Attributes:
        per_rank: ``rank``, ``params_bytes``, ``grads_bytes``, ``optimizer_state_bytes``,
            ``static_bytes``, ``peak_allocated_bytes`` (trace, or CUDA peak),
            ``peak_reserved_bytes``, ``peak_rss_bytes``, ``peak_bytes`` (the rank's peak as
            every table, rule and comparison states it: :func:`peak_bytes`; NaN where unknown).
        timeline: ``rank``, ``ts_us``, ``allocated_bytes``, ``reserved_bytes``, ``device`` from
            the trace's ``[memory]`` events.
        imbalance: ``{"static": max/mean, "peak": max/mean}`` across ranks (NaN if unknown).
        peak_definition: how ``peak_bytes`` was taken, one phrase ("not recorded" without it).
    """

    per_rank: pd.DataFrame
    timeline: pd.DataFrame
    imbalance: dict
    peak_definition: str = "not recorded"


def peak_bytes(per_rank: pd.DataFrame) -> tuple[pd.Series, str]:
    """Each rank's peak memory as static + transient (bytes), and how it was taken.

    A device allocator's peak (``peak_allocated_bytes`` ≥ the rank's static bytes) already holds
    the static state. A CPU trace's allocator view starts at the profiler: its window peak
    (below the static bytes: a rank's 20 MiB of parameters, gradients and optimizer state under
    a 1.6 MiB peak) is transient only, and the static bytes are added. Without an allocator
    peak, the process's peak RSS.

    ``per_rank``: :attr:`MemoryResult.per_rank`'s columns but ``peak_bytes``."""
    alloc = pd.to_numeric(per_rank["peak_allocated_bytes"], errors="coerce")
    static = pd.to_numeric(per_rank["static_bytes"], errors="coerce")
    if alloc.notna().any():
        window = alloc.notna() & static.notna() & (alloc < static)
        peak = alloc.where(~window, alloc + static)
        definition = ("static state + the trace window's allocation peak (a CPU trace sees "
                      "only what was allocated inside its window)" if window.any() else
                      "the allocator's peak, which holds the static state")
    else:
        peak = pd.to_numeric(per_rank["peak_rss_bytes"], errors="coerce")
        definition = "the process's peak resident memory (RSS)"
    if peak.notna().sum() == 0:
        definition = "not recorded"
    return peak.astype(float), definition


def compute_memory(traces: TraceSet) -> MemoryResult:
    """Per-rank static and peak memory, the allocator timeline, and their imbalance."""
    cols = ["rank", "ts_us", "device", "allocated_bytes", "reserved_bytes"]
    # [memory] events, from each rank's summary (pardiag.analyzer.per_rank), in
    # one table, grouped once (not filtered once per rank)
    timeline = stack_by_rank((rank, summary_of(trace).stored("memory"))
                             for rank, trace in traces.ranks.items())
    timeline = (timeline if timeline is not None else pd.DataFrame(columns=cols))[cols]
    devices = (timeline.groupby("rank", sort=False)["device"].unique().to_dict()
               if len(timeline) else {})
    highest = (timeline.groupby(["rank", "device"], sort=False, dropna=False)[
        ["allocated_bytes", "reserved_bytes"]].max() if len(timeline) else None)
    # {(rank, device): (peak allocated, peak reserved)}: one lookup per rank, not an index's
    highest = ({} if highest is None else dict(zip(highest.index, zip(
        highest["allocated_bytes"].to_numpy(dtype=float),
        highest["reserved_bytes"].to_numpy(dtype=float)))))
    rows = []
    for rank in traces.ranks:
        meta = traces.rank_meta[rank].memory if rank in traces.rank_meta else {}
        static = meta.get("static") or {}
        peaks: dict[str, Any] = {}
        # the accelerator's allocator when the trace has one (CUDA, XPU, HPU, ...), else the CPU's
        accel = [d for d in devices.get(rank, ()) if d != "cpu"]
        device = ("cuda" if "cuda" in accel else sorted(map(str, accel))[0]) if accel else "cpu"
        if rank in devices:
            alloc, reserved = highest.get((rank, device), (np.nan, np.nan))
            peaks = {"peak_allocated_bytes": float(alloc), "peak_reserved_bytes": float(reserved)}
        if "peak_allocated_bytes" in meta:  # CUDA allocator peaks beat the trace's view
            peaks = {"peak_allocated_bytes": meta["peak_allocated_bytes"],
                     "peak_reserved_bytes": meta.get("peak_reserved_bytes")}
        p, g, o = (static.get(k) for k in ("params_bytes", "grads_bytes", "optimizer_state_bytes"))
        rows.append({"rank": rank, "params_bytes": p, "grads_bytes": g, "optimizer_state_bytes": o,
                     "static_bytes": static.get("total_bytes"),
                     "peak_allocated_bytes": peaks.get("peak_allocated_bytes"),
                     "peak_reserved_bytes": peaks.get("peak_reserved_bytes"),
                     "peak_rss_bytes": meta.get("peak_rss_bytes")})
    per_rank = pd.DataFrame(rows, columns=["rank", "params_bytes", "grads_bytes",
                                           "optimizer_state_bytes", "static_bytes",
                                           "peak_allocated_bytes", "peak_reserved_bytes",
                                           "peak_rss_bytes"]).astype(
        {c: float for c in ["params_bytes", "grads_bytes", "optimizer_state_bytes", "static_bytes",
                            "peak_allocated_bytes", "peak_reserved_bytes", "peak_rss_bytes"]})

    def ratio(col):
        s = per_rank[col].dropna()
        return float(s.max() / s.mean()) if len(s) and s.mean() > 0 else float("nan")

    per_rank["peak_bytes"], definition = peak_bytes(per_rank)
    return MemoryResult(per_rank, timeline,
                        {"static": ratio("static_bytes"), "peak": ratio("peak_bytes")},
                        definition)
