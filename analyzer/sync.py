"""Collectives across ranks: matching, clock alignment, synchronization, stragglers, bandwidth.

1. **Communication events per rank** (:func:`comm_events`): from pardiag's collective records
   (``rank{R}.comms.json``: group, per-group sequence number, bytes) when the run has them; else
   from the trace — NCCL/RCCL kernels (group and sizes from their args or from the launching
   ``record_param_comms`` op) or gloo worker events (sizes from ``Input Dims``), numbered in time
   order per group.
2. **Matching** (:func:`match_instances`): one collective *instance* is the set of events with the
   same group and sequence number on every participant; sends and receives pair by group, the
   two ranks and their per-peer count. Traces without records are matched by per-group order
   (by per-group, per-op order where the op sequences of the ranks differ).
3. **Clock alignment**: every participant of a collective leaves it at about the same moment (the
   last arrival releases all), so the clock offset of rank r is the median over its collectives of
   ``end(r) − median over ranks of end`` (TensorBoard profiler plugin: align on collective ends).
   Times are corrected by it before anything is compared; the offsets are reported.
4. **Synchronization vs transfer** (TensorBoard profiler plugin): the transfer time of an
   instance is its minimum duration over the ranks; each rank's wait is its duration minus that.
   Arrival skew = latest start − earliest start. A rank waits from its arrival to the last
   arrival; the last to arrive *causes* that wait. Per-rank totals (wait suffered, wait caused)
   are lengths of unions of those intervals, so collectives in flight together (DDP buckets)
   count once.
5. **Bandwidth** (nccl-tests, doc/PERFORMANCE.md): algbw = S / t with S the bytes of the full
   buffer and t the transfer time; busbw = algbw × factor, factor 2(n−1)/n for all_reduce,
   (n−1)/n for all_gather, reduce_scatter and all_to_all, 1 for broadcast, reduce and send/recv.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from pardiag.analyzer import intervals as iv
from pardiag.analyzer.breakdown import cpu_comm_types, launch_times, launching_op_rows
from pardiag.analyzer.classify import (STANDARD_COLLECTIVES, Kind, classify, collective_type,
                                       comm_threads, on_threads, profiler_steps)
from pardiag.analyzer.comm_records import DTYPE_BYTES, _numel
from pardiag.analyzer.load import RankTrace, TraceSet

#: Columns of :func:`comm_events` (µs on each rank's own clock; bytes of the full buffer).
EVENT_COLUMNS = ("rank", "pg", "seq", "op", "peer", "start_us", "end_us", "bytes", "group_size",
                 "step", "source")

P2P_OPS = frozenset({"send", "recv", "send_recv"})


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of collective ``op`` over ``n`` ranks."""
    if n <= 1:
        return 0.0 if op not in P2P_OPS else 1.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _step_of(times: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Profiler step whose CPU window holds each time; -1 outside every step."""
    out = np.full(len(times), -1, dtype=np.int64)
    if steps.empty or len(times) == 0:
        return out
    starts = steps["start_us"].to_numpy()
    ends = steps["end_us"].to_numpy()
    idx = np.searchsorted(starts, times, side="right") - 1
    ok = (idx >= 0) & (times < ends[np.clip(idx, 0, None)])
    out[ok] = steps["step"].to_numpy()[idx[ok]]
    return out


def _from_records(rank: int, doc: dict, steps: pd.DataFrame) -> pd.DataFrame:
    groups = {g["name"]: g for g in doc.get("process_groups", [])}
    rows = []
    for r in doc.get("records", []):
        if r.get("start_us") is None or r.get("end_us") is None:
            continue
        size = len(r.get("pg_ranks") or groups.get(r["pg_name"], {}).get("ranks") or [])
        rows.append({"rank": rank, "pg": str(r["pg_name"]), "seq": int(r["seq"]), "op": r["op"],
                     "peer": r.get("peer"), "start_us": float(r["start_us"]),
                     "end_us": float(r["end_us"]), "bytes": r.get("bytes"),
                     "group_size": size or None, "issue_us": float(r["issue_us"]),
                     "source": "records"})
    df = pd.DataFrame(rows, columns=[*EVENT_COLUMNS[:-2], "issue_us", "source"])
    df["step"] = _step_of(df["issue_us"].to_numpy(dtype=float), steps)
    return df.drop(columns="issue_us")


def _args_bytes(args) -> int | None:
    if not isinstance(args, dict):
        return None
    dtype = args.get("dtype")
    n_in, n_out = args.get("In msg nelems"), args.get("Out msg nelems")
    if isinstance(n_in, (int, float)) or isinstance(n_out, (int, float)):
        n = max(int(n_in or 0), int(n_out or 0))
        return n * DTYPE_BYTES.get(str(dtype), 4)
    dims, types = args.get("Input Dims"), args.get("Input type")
    if isinstance(dims, list) and dims and isinstance(types, list) and types:
        try:
            return _numel(dims[:1]) * DTYPE_BYTES.get(str(types[0]), 4)
        except (TypeError, ValueError):
            return None
    return None


def _from_trace(trace: RankTrace, kinds: pd.Series, steps: pd.DataFrame) -> pd.DataFrame:
    ev = trace.events
    world = None
    info = trace.metadata.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("world_size"), int):
        world = info["world_size"]
    gpu = ev[kinds == Kind.GPU_COMM.value]
    if len(gpu):
        # metadata from the kernel's args, else from the CPU op that launched it
        launch = launch_times(trace, gpu)
        ops, enclosing = launching_op_rows(trace, gpu)
        op_names = ops["name"].tolist()
        op_args = ops["args"].tolist()
        rows = []
        for name, ts, dur, kargs, lt, enc in zip(gpu["name"].tolist(), gpu["ts"].tolist(),
                                                 gpu["dur"].tolist(), gpu["args"].tolist(),
                                                 launch, enclosing):
            args = kargs if isinstance(kargs, dict) else {}
            if "Collective name" not in args:
                for j in enc[::-1]:
                    a = op_args[j]
                    if isinstance(a, dict) and "Collective name" in a:
                        args = {**a, **args}
                        break
                else:
                    if len(enc):  # an older trace: the op name and its input shapes
                        a = op_args[enc[-1]]
                        a = a if isinstance(a, dict) else {}
                        args = {**args, "_op_name": op_names[enc[-1]],
                                **{k: a[k] for k in ("Input Dims", "Input type") if k in a}}
            op = collective_type(args.get("_op_name", name), args)
            if op not in STANDARD_COLLECTIVES:
                op = collective_type(name, args)
            size = args.get("Group size")
            rows.append({"rank": trace.rank, "pg": str(args.get("Process Group Name", "?")),
                         "op": op, "peer": None, "start_us": float(ts),
                         "end_us": float(ts + dur), "bytes": _args_bytes(args),
                         "group_size": int(size) if isinstance(size, (int, float)) else world,
                         "launch_us": float(lt), "source": "trace"})
        df = pd.DataFrame(rows)
        df["step"] = _step_of(df["launch_us"].to_numpy(), steps)
        df = df.drop(columns="launch_us")
    else:
        threads = comm_threads(trace)
        on_worker = on_threads(ev, threads)
        gl = ev[on_worker & ev["name"].str.startswith("gloo:").to_numpy()]
        # named by the op the program issued (gloo's all_reduce of a reduce_scatter is one)
        issued = cpu_comm_types(trace, kinds)["type"]
        df = pd.DataFrame({
            "rank": trace.rank, "pg": "?", "op": issued.reindex(gl.index).to_numpy(),
            "peer": None, "start_us": gl["ts"].to_numpy(dtype=float),
            "end_us": (gl["ts"] + gl["dur"]).to_numpy(dtype=float),
            "bytes": [_args_bytes(a) for a in gl["args"]], "group_size": world, "source": "trace"})
        df["step"] = _step_of(df["start_us"].to_numpy(dtype=float), steps)
    df = df.sort_values("start_us", kind="stable").reset_index(drop=True)
    df["seq"] = df.groupby("pg").cumcount() + 1
    return df[list(EVENT_COLUMNS)]


def comm_events(traces: TraceSet, comm_patterns=()) -> pd.DataFrame:
    """Every communication event of every rank, with :data:`EVENT_COLUMNS`.

    ``seq`` is the per-group sequence number from the records, or the per-group order in the
    trace; ``pg`` is ``"?"`` where the trace does not name the group.
    """
    frames = []
    comm_patterns = list(comm_patterns)
    for rank, trace in traces.ranks.items():
        doc = traces.sidecars.get("comms", {}).get(rank)
        s = trace.summary
        if s is not None and s.matches(comm_patterns):
            frames.append(_from_records(rank, doc, s.steps) if doc else s.comm)
            continue
        kinds = classify(trace, comm_patterns)
        steps = profiler_steps(trace, kinds)
        frames.append(_from_records(rank, doc, steps) if doc else _from_trace(trace, kinds, steps))
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=list(EVENT_COLUMNS))
    return pd.concat(frames, ignore_index=True)[list(EVENT_COLUMNS)]


@dataclasses.dataclass(frozen=True)
class SyncResult:
    """Result of :func:`compute_sync`.

    Attributes:
        offsets: per rank: ``rank``, ``offset_us`` (its clock minus the consensus, estimated from
            collective ends), ``instances`` (collectives used).
        instances: per collective instance: ``instance``, ``pg``, ``seq``, ``op``, ``ranks`` (n),
            ``step``, ``bytes``, ``first_arrival_us``, ``arrival_skew_us``, ``transfer_us``,
            ``last_rank``, ``algbw_gbps``, ``busbw_gbps`` (GB/s = 1e9 bytes/s; NaN without bytes),
            ``inter_node`` (participants on more than one host; None when hosts are unknown).
        per_rank: per instance and rank: ``instance``, ``rank``, ``start_us``, ``end_us`` (corrected
            clock), ``dur_us``, ``wait_us``, ``arrival_delay_us``.
        stragglers: per rank, most wait caused first: ``rank``, ``wait_suffered_us`` (|union of
            its waiting intervals|), ``wait_caused_us`` (Σ over the other ranks of |union of
            their waits for it|), ``last_arrivals``, ``steps_as_top`` (steps in which it caused
            the most wait), ``instances``.
        bandwidth: per group, op, message size and ``inter_node`` (``"intra"``, ``"inter"`` or
            ``"unknown"``): ``count``, ``transfer_us``, ``algbw_gbps``, ``busbw_gbps`` (medians).
        matched_by: ``"records"`` or ``"order"``.
    """

    offsets: pd.DataFrame
    instances: pd.DataFrame
    per_rank: pd.DataFrame
    stragglers: pd.DataFrame
    bandwidth: pd.DataFrame
    matched_by: str


def match_instances(events: pd.DataFrame) -> pd.DataFrame:
    """Add an ``instance`` key to every event: ``"pg:seq"`` for collectives, and
    ``"p2p:pg:a>b:k"`` for the k-th transfer from rank a to rank b (send and recv alike).

    Events of traces without records are matched by per-group order; where the ranks' op
    sequences disagree, by per-group per-op order.
    """
    ev = events.copy()
    coll = ~ev["op"].isin(["send", "recv"]) | ev["peer"].isna()
    key = ev["pg"].astype(str) + ":" + ev["seq"].astype(str)
    unordered = ev["source"].eq("trace")
    if unordered.any():
        sub = ev[unordered & coll]
        ops = sub.groupby(["rank", "pg"])["op"].apply(tuple)
        if ops.groupby(level="pg").nunique().gt(1).any():  # sequences differ: order per op
            nth = sub.groupby(["rank", "pg", "op"]).cumcount() + 1
            key.loc[sub.index] = (sub["pg"].astype(str) + ":" + sub["op"] + ":" + nth.astype(str))
    p2p = ~coll
    if p2p.any():
        sub = ev[p2p]
        src = np.where(sub["op"] == "send", sub["rank"], sub["peer"]).astype(int)
        dst = np.where(sub["op"] == "send", sub["peer"], sub["rank"]).astype(int)
        tmp = sub.assign(src=src, dst=dst)
        nth = tmp.groupby(["rank", "pg", "src", "dst"]).cumcount() + 1
        key.loc[sub.index] = ("p2p:" + tmp["pg"].astype(str) + ":" + tmp["src"].astype(str) + ">"
                              + tmp["dst"].astype(str) + ":" + nth.astype(str))
    ev["instance"] = key
    return ev


def _offsets(ev: pd.DataFrame) -> pd.DataFrame:
    coll = ev[~ev["instance"].str.startswith("p2p:")]
    multi = coll.groupby("instance")["rank"].transform("nunique") > 1
    coll = coll[multi]
    ranks = sorted(ev["rank"].unique())
    if coll.empty:
        return pd.DataFrame({"rank": ranks, "offset_us": 0.0, "instances": 0})
    consensus = coll.groupby("instance")["end_us"].transform("median")
    diff = (coll["end_us"] - consensus).groupby(coll["rank"])
    med = diff.median()
    out = pd.DataFrame({"rank": ranks})
    out["offset_us"] = out["rank"].map(med).fillna(0.0).astype(float)
    out["instances"] = out["rank"].map(diff.size()).fillna(0).astype(int)
    return out


def compute_sync(traces: TraceSet, comm_patterns=(), events: pd.DataFrame | None = None) -> SyncResult:
    """Match collectives across ranks, align clocks, and measure synchronization (see module)."""
    ev = comm_events(traces, comm_patterns) if events is None else events
    empty = pd.DataFrame()
    if ev.empty:
        return SyncResult(pd.DataFrame(columns=["rank", "offset_us", "instances"]), empty, empty,
                          pd.DataFrame(columns=["rank", "wait_suffered_us", "wait_caused_us",
                                                "last_arrivals", "steps_as_top", "instances"]),
                          empty, "none")
    matched_by = "records" if ev["source"].eq("records").all() else "order"
    ev = match_instances(ev)
    offsets = _offsets(ev)
    off = ev["rank"].map(dict(zip(offsets["rank"], offsets["offset_us"])))
    ev["start_us"] = ev["start_us"] - off
    ev["end_us"] = ev["end_us"] - off
    ev["dur_us"] = ev["end_us"] - ev["start_us"]

    g = ev.groupby("instance", sort=False)
    inst = pd.DataFrame({
        "pg": g["pg"].first(), "seq": g["seq"].first(), "op": g["op"].first(),
        "ranks": g["rank"].nunique(), "step": g["step"].max(), "bytes": g["bytes"].max(),
        "first_arrival_us": g["start_us"].min(),
        "arrival_skew_us": g["start_us"].max() - g["start_us"].min(),
        "transfer_us": g["dur_us"].min(),
        "group_size": g["group_size"].max(),
    })
    last_idx = g["start_us"].idxmax()
    inst["last_rank"] = ev.loc[last_idx.values, "rank"].to_numpy()
    inst = inst[inst["ranks"] > 1].copy()
    n = inst["group_size"].fillna(inst["ranks"]).astype(float)
    seconds = inst["transfer_us"] / 1e6
    inst["algbw_gbps"] = pd.to_numeric(inst["bytes"], errors="coerce") / seconds / 1e9
    inst.loc[seconds <= 0, "algbw_gbps"] = np.nan
    inst["busbw_gbps"] = inst["algbw_gbps"] * [busbw_factor(o, int(k)) for o, k in
                                               zip(inst["op"], n)]
    inst = inst.sort_values("first_arrival_us").reset_index(names="instance")
    hosts = {r: m.get("host") for r, m in traces.rank_meta.items() if m.get("host")}
    if hosts:
        members = ev.groupby("instance")["rank"].apply(lambda rs: {hosts.get(r) for r in rs})
        inst["inter_node"] = inst["instance"].map(
            lambda k: None if None in members.get(k, {None}) else len(members[k]) > 1)
    else:
        inst["inter_node"] = None

    pr = ev[ev["instance"].isin(inst["instance"])].copy()
    pr = pr.merge(inst[["instance", "transfer_us", "first_arrival_us", "last_rank"]], on="instance")
    pr["wait_us"] = pr["dur_us"] - pr["transfer_us"]
    pr["arrival_delay_us"] = pr["start_us"] - pr["first_arrival_us"]
    # Waiting = from a rank's arrival to the last arrival. Aggregates take the union of those
    # intervals, so collectives in flight at the same time (DDP buckets) are not counted twice.
    pr["wait_until_us"] = pr.groupby("instance")["start_us"].transform("max")
    per_rank = pr[["instance", "rank", "start_us", "end_us", "dur_us", "wait_us",
                   "arrival_delay_us"]].reset_index(drop=True)

    def waited(rows: pd.DataFrame) -> float:
        return iv.total(iv.union(rows["start_us"].to_numpy(), rows["wait_until_us"].to_numpy()))

    ranks = sorted(ev["rank"].unique())
    st = pd.DataFrame({"rank": ranks})
    st["wait_suffered_us"] = [waited(pr[pr["rank"] == r]) for r in ranks]
    others = pr[pr["rank"] != pr["last_rank"]]
    # per (last arrival, step): the sum over the waiting ranks (in rank order) of each one's
    # waited time; positions instead of sub-frames (thousands of groups on big runs)
    caused: dict[tuple[int, int], float] = {}
    o_start = others["start_us"].to_numpy()
    o_until = others["wait_until_us"].to_numpy()
    groups = others.groupby(["last_rank", "step", "rank"], sort=True).indices
    for (last, step, _), idx in sorted(groups.items(), key=lambda kv: kv[0]):
        key = (int(last), int(step))
        caused[key] = caused.get(key, 0) + iv.total(iv.union(o_start[idx], o_until[idx]))
    total_caused: dict[int, float] = {}
    for (last, _), v in caused.items():
        total_caused[last] = total_caused.get(last, 0.0) + v
    st["wait_caused_us"] = st["rank"].map(total_caused).fillna(0.0)
    st["last_arrivals"] = st["rank"].map(inst["last_rank"].value_counts()).fillna(0).astype(int)
    top: dict[int, tuple[int, float]] = {}
    for (last, step), v in caused.items():
        if v > top.get(step, (None, -1.0))[1]:
            top[step] = (last, v)
    tops = pd.Series([t[0] for t in top.values()]).value_counts()
    st["steps_as_top"] = st["rank"].map(tops).fillna(0).astype(int)
    st["instances"] = st["rank"].map(pr.groupby("rank")["instance"].nunique()).fillna(0).astype(int)
    st = st.sort_values(["wait_caused_us", "rank"], ascending=[False, True]).reset_index(drop=True)

    bw = inst.dropna(subset=["algbw_gbps"])
    if len(bw):
        bandwidth = (bw.assign(inter_node=bw["inter_node"].map(
                         lambda v: "unknown" if v is None else ("inter" if v else "intra")))
                     .groupby(["pg", "op", "bytes", "inter_node"], as_index=False)
                     .agg(count=("instance", "size"), transfer_us=("transfer_us", "median"),
                          algbw_gbps=("algbw_gbps", "median"), busbw_gbps=("busbw_gbps", "median")))
    else:
        bandwidth = pd.DataFrame(columns=["pg", "op", "bytes", "inter_node", "count", "transfer_us",
                                          "algbw_gbps", "busbw_gbps"])
    return SyncResult(offsets, inst.drop(columns=["group_size"]), per_rank, st, bandwidth, matched_by)
