"""Load imbalance, per-rank memory and the parallel layout of a run.

**Imbalance**: compute time per rank per step (from the time breakdown). For each parallel
dimension, the ranks of one group of that dimension do the same work in a balanced run (DP
replicas, pipeline stages, TP shards); the group's imbalance is ``max / mean`` of their compute
and its cost is ``max − mean`` — how much shorter the step would be if every rank matched the
mean (a synchronous step waits for the slowest). Runs without a known layout are one group,
``world``.

**Memory** per rank: static bytes of parameters, gradients and optimizer state (local shards,
from ``rank{R}.meta.json``), peaks (the trace's ``[memory]`` events, CUDA allocator peaks or
peak RSS), and the allocator timeline from the trace; imbalance ``max / mean`` across ranks.

**Layout**: dimensions and degrees, the process groups of each dimension and which groups span
more than one node.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from .infer_layout import InferredLayout, is_pardiag_run
from ..trace.traceset import TraceSet
from ..summary import memory_rows


@dataclasses.dataclass(frozen=True)
class BalanceResult:
    """Result of :func:`compute_balance`.

    Attributes:
        per_rank: ``rank``, ``step``, ``compute_us``, ``span_us`` per rank and step.
        groups: per dimension, group and step: ``dim``, ``pg``, ``step``, ``ranks`` (n),
            ``max_us``, ``mean_us``, ``imbalance`` (max/mean), ``cost_us`` (max − mean),
            ``slowest_rank``.
        summary: per dimension and group over steps: ``dim``, ``pg``, ``imbalance`` (mean),
            ``cost_us`` (mean per step), ``slowest_rank`` (most often slowest).
        skew: where each rank's arrival skew arises (:func:`skew_origin`, :data:`SKEW_COLUMNS`).
    """

    per_rank: pd.DataFrame
    groups: pd.DataFrame
    summary: pd.DataFrame
    skew: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=list(SKEW_COLUMNS)))


#: Columns of :func:`skew_origin`.
SKEW_COLUMNS = ("rank", "steps", "start_late_us", "delay_us", "top_collective", "top_delay_us",
                "top_share_pct")


def skew_origin(steps: pd.DataFrame, sync) -> pd.DataFrame:
    """Where each rank's arrival skew arises: at the step's start, or at one collective.

    Args:
        steps: :attr:`pardiag.analyzer.analyses.breakdown.TimeBreakdown.steps` (``rank``, ``step``,
            ``start_us`` on the rank's clock).
        sync: the :class:`pardiag.analyzer.analyses.sync.SyncResult` (clock offsets, and per instance
            and rank the ``arrival_delay_us``: arrival − the first rank's arrival).

    Returns:
        :data:`SKEW_COLUMNS`, one row per rank: ``steps`` (steps every rank has),
        ``start_late_us`` (median over them of how long after the earliest rank it starts the
        step, clocks aligned; µs), ``delay_us`` (its arrival delay summed over the complete
        collectives, per step; µs), ``top_collective`` (``"op on group"`` holding most of that
        delay), ``top_delay_us`` (its share per step, µs) and ``top_share_pct`` (% of
        ``delay_us``). Empty without two ranks with steps or matched collectives.
    """
    empty = pd.DataFrame(columns=list(SKEW_COLUMNS))
    if steps is None or steps.empty or sync is None or steps["rank"].nunique() < 2:
        return empty
    off = dict(zip(sync.offsets["rank"], sync.offsets["offset_us"])) if len(sync.offsets) else {}
    st = steps.assign(start=steps["start_us"] - steps["rank"].map(off).fillna(0.0))
    starts = st.pivot_table(index="step", columns="rank", values="start", aggfunc="min").dropna()
    if starts.empty:
        return empty
    late = starts.sub(starts.min(axis=1), axis=0).median()
    n = len(starts)
    inst = sync.instances
    pr = sync.per_rank
    delays = pd.DataFrame(columns=["rank", "where", "arrival_delay_us"])
    if len(pr) and len(inst):
        done = inst.loc[inst["complete"].astype(bool), ["instance", "op", "group", "step"]]
        d = pr.merge(done, on="instance").sort_values(["rank", "step", "start_us"])
        if len(d):   # a collective is its op, its place in the step and its group
            k = d.groupby(["rank", "step", "group"], dropna=False).cumcount() + 1
            on = d["group"].fillna("").astype(str).map(lambda g: f" on {g}" if g else "")
            delays = d.assign(where=d["op"].astype(str) + " #" + k.astype(str) + " of the step"
                              + on)
    rows = []
    for r in sorted(int(x) for x in starts.columns):
        mine = delays[delays["rank"] == r]
        by = (mine.groupby("where")["arrival_delay_us"].sum()
              .sort_values(ascending=False, kind="stable"))
        total = float(mine["arrival_delay_us"].sum()) / n if len(mine) else 0.0
        top = str(by.index[0]) if len(by) and by.iloc[0] > 0 else None
        top_us = float(by.iloc[0]) / n if top else 0.0
        rows.append({"rank": r, "steps": n, "start_late_us": float(late[r]), "delay_us": total,
                     "top_collective": top, "top_delay_us": top_us,
                     "top_share_pct": 100.0 * top_us / total if total > 0 else float("nan")})
    return pd.DataFrame(rows, columns=list(SKEW_COLUMNS))


def dimension_groups(traces: TraceSet) -> list[tuple[str, str, list[int]]]:
    """``[(dim, pg name, member ranks)]`` from the comms sidecars; ``[("world", "", all)]``
    without them. One entry per distinct group."""
    seen: dict[tuple, tuple[str, str, list[int]]] = {}
    for doc in traces.sidecars.get("comms", {}).values():
        for g in doc.get("process_groups", []):
            if g.get("dim") and g.get("ranks"):
                key = (g["dim"], tuple(g["ranks"]))
                seen.setdefault(key, (g["dim"], str(g["name"]), list(g["ranks"])))
    if not seen:
        return [("world", "", sorted(traces.ranks))]
    return sorted(seen.values(), key=lambda t: (t[0], t[2]))


def compute_balance(traces: TraceSet, breakdown_steps: pd.DataFrame, sync=None) -> BalanceResult:
    """Compute-time imbalance per dimension group and step (see the module docstring), and
    where each rank's arrival skew arises (:func:`skew_origin`, with ``sync``)."""
    per_rank = breakdown_steps[["rank", "step", "compute_us", "span_us"]].copy()
    rows = []
    for dim, pg, ranks in dimension_groups(traces):
        sub = per_rank[per_rank["rank"].isin(ranks)]
        for step, s in sub.groupby("step"):
            if len(s) < 2:
                continue
            mx, mean = float(s["compute_us"].max()), float(s["compute_us"].mean())
            rows.append({"dim": dim, "pg": pg, "step": int(step), "ranks": len(s), "max_us": mx,
                         "mean_us": mean, "imbalance": mx / mean if mean > 0 else np.nan,
                         "cost_us": mx - mean,
                         "slowest_rank": int(s.loc[s["compute_us"].idxmax(), "rank"])})
    groups = pd.DataFrame(rows, columns=["dim", "pg", "step", "ranks", "max_us", "mean_us",
                                         "imbalance", "cost_us", "slowest_rank"])
    if len(groups):
        summary = (groups.groupby(["dim", "pg"], as_index=False)
                   .agg(imbalance=("imbalance", "mean"), cost_us=("cost_us", "mean"),
                        slowest_rank=("slowest_rank", lambda x: int(x.mode().iloc[0]))))
    else:
        summary = pd.DataFrame(columns=["dim", "pg", "imbalance", "cost_us", "slowest_rank"])
    return BalanceResult(per_rank.reset_index(drop=True), groups, summary,
                         skew_origin(breakdown_steps, sync))


@dataclasses.dataclass(frozen=True)
class MemoryResult:
    """Result of :func:`compute_memory`.

    Attributes:
        per_rank: ``rank``, ``params_bytes``, ``grads_bytes``, ``optimizer_state_bytes``,
            ``static_bytes``, ``peak_allocated_bytes`` (trace, or CUDA peak), ``peak_reserved_bytes``,
            ``peak_rss_bytes`` (NaN where unknown).
        timeline: ``rank``, ``ts_us``, ``allocated_bytes``, ``reserved_bytes``, ``device`` from
            the trace's ``[memory]`` events.
        imbalance: ``{"static": max/mean, "peak": max/mean}`` across ranks (NaN if unknown).
    """

    per_rank: pd.DataFrame
    timeline: pd.DataFrame
    imbalance: dict


def compute_memory(traces: TraceSet) -> MemoryResult:
    """Per-rank static and peak memory, the allocator timeline, and their imbalance."""
    rows, tl = [], []
    for rank, trace in traces.ranks.items():
        meta = traces.rank_meta[rank].memory if rank in traces.rank_meta else {}
        static = meta.get("static") or {}
        peaks = {}
        # [memory] events, from the rank's summary when it has one (pardiag.analyzer.summary)
        tr = memory_rows(trace).assign(rank=rank)[["rank", "ts_us", "device", "allocated_bytes",
                                                     "reserved_bytes"]]
        tl.append(tr)
        # the accelerator's allocator when the trace has one (CUDA, XPU, HPU, ...), else the CPU's
        accel = [d for d in tr["device"].unique() if d != "cpu"] if len(tr) else []
        device = ("cuda" if "cuda" in accel else sorted(map(str, accel))[0]) if accel else "cpu"
        if len(tr):
            d = tr[tr["device"] == device]
            peaks = {"peak_allocated_bytes": float(d["allocated_bytes"].max()),
                     "peak_reserved_bytes": float(d["reserved_bytes"].max())}
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

    cols = ["rank", "ts_us", "device", "allocated_bytes", "reserved_bytes"]
    tl = [t for t in tl if len(t)]
    timeline = (pd.concat(tl, ignore_index=True) if tl else pd.DataFrame(columns=cols))[cols]
    return MemoryResult(per_rank, timeline,
                        {"static": ratio("static_bytes"), "peak": ratio("peak_allocated_bytes")})


@dataclasses.dataclass(frozen=True)
class LayoutResult:
    """Result of :func:`compute_layout`.

    Attributes:
        dims: ``{dim: degree}`` (e.g. ``{"dp": 2, "tp": 2}``); ``{}`` when unknown.
        strategies: e.g. ``["fsdp2", "tp"]``.
        pipeline: schedule, stages, microbatches, stages per rank, or None.
        groups: ``dim``, ``pg``, ``desc``, ``ranks``, ``size``, ``nodes`` (hosts spanned),
            ``spans_nodes``.
        nodes: ``{host: [ranks]}``.
        source: ``"recorded"`` (pardiag's records of the run) or ``"inferred from traces"``
            (:mod:`pardiag.analyzer.analyses.infer_layout`, for traces recorded without pardiag).
        evidence: for an inferred layout, what each conclusion rests on (one line each).
        not_inferred: for an inferred layout, what could not be inferred or is only estimated,
            and how (one line each).
    """

    dims: dict
    strategies: list
    pipeline: dict | None
    groups: pd.DataFrame
    nodes: dict
    source: str = "recorded"
    evidence: tuple[str, ...] = ()
    not_inferred: tuple[str, ...] = ()


def compute_layout(traces: TraceSet, inferred: InferredLayout | None = None) -> LayoutResult:
    """The run's parallel layout from ``run.json``, the comms sidecars and rank metadata.

    Traces from elsewhere carry less: process groups from ``distributedInfo.pg_config`` (with
    dimension names taken from their descriptions, e.g. ``mesh_tp``), hosts unknown; dimensions,
    strategies and the pipeline come from ``inferred`` (:func:`infer_layout.infer_layout`), and
    the result says so (``source``, ``evidence``, ``not_inferred``). A pardiag run keeps its recorded layout.
    """
    run = traces.run_info
    lay = (run.layout if run else None) or {}
    hosts = {r: m.host for r, m in traces.rank_meta.items() if m.host}
    nodes = (run.nodes if run else None) or {}
    if not nodes and hosts:
        for r, h in sorted(hosts.items()):
            nodes.setdefault(h, []).append(r)
    rows, seen = [], set()
    for doc in traces.sidecars.get("comms", {}).values():
        for g in doc.get("process_groups", []):
            key = (str(g["name"]), tuple(g.get("ranks") or ()))
            if key not in seen:
                seen.add(key)
                rows.append((g.get("dim"), str(g["name"]), g.get("desc", ""), list(g.get("ranks") or [])))
    if not rows:  # traces from elsewhere: distributedInfo.pg_config
        for t in traces.ranks.values():
            info = t.metadata.get("distributedInfo")
            groups = info.get("pg_config") if isinstance(info, dict) else None
            for g in groups if isinstance(groups, list) else []:
                if not isinstance(g, dict):
                    continue
                ranks = g.get("ranks") if isinstance(g.get("ranks"), list) else []
                key = (str(g.get("pg_name")), tuple(ranks))
                if key not in seen:
                    seen.add(key)
                    desc = str(g.get("pg_desc", ""))
                    dim = desc.lower().removeprefix("mesh_") if desc.startswith("mesh_") else None
                    rows.append((dim, str(g.get("pg_name")), desc, ranks))
    out = []
    for dim, pg, desc, ranks in rows:
        spanned = sorted({hosts[r] for r in ranks if r in hosts})
        out.append({"dim": dim, "pg": pg, "desc": desc, "ranks": ranks, "size": len(ranks),
                    "nodes": len(spanned) if spanned else np.nan,
                    "spans_nodes": len(spanned) > 1 if spanned else None})
    groups = pd.DataFrame(out, columns=["dim", "pg", "desc", "ranks", "size", "nodes",
                                        "spans_nodes"])
    if inferred is not None and not is_pardiag_run(traces):
        return LayoutResult(dict(inferred.dims), list(inferred.strategies), inferred.pipeline,
                            groups, nodes, inferred.source, tuple(inferred.evidence),
                            tuple(inferred.not_inferred))
    return LayoutResult(dict(lay.get("dims") or {}), list(lay.get("strategies") or []),
                        lay.get("pipeline"), groups, nodes)
