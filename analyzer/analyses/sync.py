"""Collectives across ranks: matching, clock alignment, synchronization, stragglers, bandwidth.

Input: every rank's communication events
    (:func:`pardiag.analyzer.analyses.comm_events.comm_events`).

1. **Matching** (:func:`match_instances`): one collective *instance* is the set of events with the
   same group and sequence number on every participant; sends and receives pair by group, the
   two ranks and their per-peer count. Traces without records are matched by per-group order
   (by per-group, per-op order where the op sequences of the ranks differ).
2. **Clock alignment**: every participant of a collective leaves it at about the same moment (the
   last arrival releases all), so the clock offset of rank r is the median over its collectives of
   ``end(r) − median over ranks of end`` (TensorBoard profiler plugin: align on collective ends).
   Times are corrected by it before anything is compared; the offsets are reported.
3. **Synchronization vs transfer** (TensorBoard profiler plugin): the transfer time of an
   instance is its minimum duration over the ranks; each rank's wait is its duration minus that.
   Arrival skew = latest start − earliest start. A rank waits from its arrival to the last
   arrival; the last to arrive *causes* that wait. Per-rank totals (wait suffered, wait caused)
   are lengths of unions of those intervals, so collectives in flight together (DDP buckets)
   count once.
4. **Bandwidth** (nccl-tests, doc/PERFORMANCE.md): algbw = S / t with S the bytes of the full
   buffer and t the transfer time; busbw = algbw × factor, factor 2(n−1)/n for all_reduce,
   (n−1)/n for all_gather, reduce_scatter and all_to_all, 1 for broadcast, reduce and send/recv.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..trace import intervals as iv
from ..trace.traceset import TraceSet
from .comm_events import P2P_OPS, comm_events


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of collective ``op`` over ``n`` ranks."""
    if n <= 1:
        return 0.0 if op not in P2P_OPS else 1.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


@dataclasses.dataclass(frozen=True)
class SyncResult:
    """Result of :func:`compute_sync`.

    Attributes:
        offsets: per rank: ``rank``, ``offset_us`` (its clock minus the reference rank's — the
            lowest rank present — as subtracted before comparing; 0 for ranks on the reference
            rank's host), ``residual_us`` (what the collective ends suggest beyond that: on one
            host the clocks are one clock, so this is jitter and is not subtracted),
            ``instances`` (complete collective instances used), ``host`` (None when unknown).
        instances: per collective instance: ``instance``, ``pg``, ``group`` (its ranks and
            description, :func:`pardiag.analyzer.analyses.comm_events.group_key`; ``""`` when
            unknown), ``seq``, ``op``, ``ranks`` (members present), ``expected`` (group size),
            ``complete`` (every member present), ``step``, ``bytes``, ``first_arrival_us``,
            ``arrival_skew_us``, ``transfer_us``, ``last_rank``, ``algbw_gbps``, ``busbw_gbps``
            (GB/s = 1e9 bytes/s; NaN without bytes or when partial), ``inter_node`` (participants on
            more than one host; None when hosts are unknown). Point-to-point transfers are instances
            of two ranks (a send and its recv).
        per_rank: per instance and rank: ``instance``, ``rank``, ``start_us``, ``end_us`` (corrected
            clock), ``dur_us``, ``wait_us``, ``arrival_delay_us``.
        stragglers: per rank, most wait caused first, from complete instances only:
            ``rank``, ``wait_suffered_us`` (|union of its waiting intervals|), ``wait_caused_us``
            (Σ over the other ranks of |union of their waits for it|), ``last_arrivals``,
            ``steps_as_top`` (steps in which it caused the most wait), ``instances``.
        bandwidth: per group, op, message size and ``inter_node`` (``"intra"``, ``"inter"`` or
            ``"unknown"``): ``count``, ``transfer_us``, ``algbw_gbps``, ``busbw_gbps`` (medians).
        matched_by: ``"records"``, ``"sequence numbers"``, ``"order"`` (some group had no
            usable sequence numbers), ``"point-to-point pairs"`` (no collective) or ``"none"``.
        p2p: per pair of ranks that exchange point-to-point transfers (complete pairs: a send
            and its recv): ``src``, ``dst``, ``count``, ``hop_us`` (median transfer time, the
            minimum of the two sides' durations: the link's latency for that size),
            ``recv_wait_us`` and ``send_wait_us`` (median time the receiver / sender waited for
            the other side to arrive), ``bytes`` (median). Empty without such pairs.
        straggler: the rank that causes the most waiting when that is at least
            :data:`STRAGGLER_MIN_WAIT_US` over complete instances, else None.
        notes: what the matching could not do (partial instances, unpaired point-to-point ops,
            the clock model used), one line each.
    """

    offsets: pd.DataFrame
    instances: pd.DataFrame
    per_rank: pd.DataFrame
    stragglers: pd.DataFrame
    bandwidth: pd.DataFrame
    matched_by: str
    straggler: int | None = None
    notes: tuple[str, ...] = ()
    p2p: pd.DataFrame = dataclasses.field(default_factory=lambda: pd.DataFrame(columns=P2P_COLUMNS))

    @property
    def skew(self) -> pd.DataFrame:
        """Arrival skew per collective type (:func:`skew_by_op`)."""
        return skew_by_op(self.instances)


def skew_by_op(instances: pd.DataFrame) -> pd.DataFrame:
    """Arrival skew per collective type: ``op``, ``count`` (instances), ``arrival_skew_us``
    (median), ``max_skew_us``, ``transfer_us`` (median); from :attr:`SyncResult.instances`."""
    if instances.empty:
        return pd.DataFrame(columns=["op", "count", "arrival_skew_us", "max_skew_us",
                                     "transfer_us"])
    return (instances.groupby("op", as_index=False)
            .agg(count=("instance", "size"), arrival_skew_us=("arrival_skew_us", "median"),
                 max_skew_us=("arrival_skew_us", "max"), transfer_us=("transfer_us", "median")))


#: Columns of :attr:`SyncResult.p2p`.
P2P_COLUMNS = ["src", "dst", "count", "hop_us", "recv_wait_us", "send_wait_us", "bytes"]
#: A send and its recv whose recorded intervals miss each other by more than this (µs) are not
#: taken to run on one clock.
P2P_OVERLAP_SLACK_US = 1.0
#: Waiting (µs, summed over the waiting ranks) below which no rank is named a straggler.
STRAGGLER_MIN_WAIT_US = 10.0


def match_instances(events: pd.DataFrame) -> pd.DataFrame:
    """Add an ``instance`` key to every event (None where it cannot be matched).

    * Collectives: a group is its ranks (``group``), or its name where the trace does not give
      the ranks. Where every event of a group carries the group's own sequence number
      (``native_seq``: records, a trace's ``Seq``), the key is ``"<group>:<seq>"``, so ranks whose
      windows start at different collectives still match. Otherwise instances are matched by
      per-group order, and per-group per-op order where the ranks' op sequences differ.
    * Point-to-point: ``"p2p:<group>:<a>><b>:<k>"`` for the k-th transfer from rank a to rank b,
      send and recv alike. A send/recv whose peer is unknown gets None: it is never matched
      as a group collective.
    """
    ev = events.copy()
    if "group" not in ev:
        ev["group"] = ""
    if "native_seq" not in ev:
        ev["native_seq"] = ev["source"].eq("records")
    gid = np.where(ev["group"].astype(str) != "", "g" + ev["group"].astype(str),
                   "pg" + ev["pg"].astype(str))
    ev["_gid"] = gid
    p2p_op = ev["op"].isin(P2P_OPS).to_numpy()
    has_peer = ev["peer"].notna().to_numpy()
    coll = ~p2p_op
    key = pd.Series([None] * len(ev), index=ev.index, dtype=object)
    how = pd.Series([None] * len(ev), index=ev.index, dtype=object)
    sub = ev[coll]
    if len(sub):
        native = sub.groupby("_gid")["native_seq"].transform("all").astype(bool)
        # a sequence number that repeats on a rank (ops of one coalescing block, a constant)
        # identifies nothing: that group is matched by order
        dup = sub.duplicated(["rank", "_gid", "seq"], keep=False)
        native &= ~dup.groupby(sub["_gid"]).transform("any").astype(bool)
        nat = sub[native]
        key.loc[nat.index] = nat["_gid"] + ":" + nat["seq"].astype(int).astype(str)
        how.loc[nat.index] = "seq"
        rest = sub[~native]
        if len(rest):
            # by position within each profiling window: a window that lost a collective shifts
            # no later window's matches
            win = rest["window"].astype(int).astype(str) if "window" in rest else "0"
            gw = rest["_gid"] + ":w" + win
            rest = rest.assign(_gid=gw)
            nth = rest.groupby(["rank", "_gid"]).cumcount() + 1
            k = rest["_gid"] + ":" + nth.astype(str)
            ops = rest.groupby(["rank", "_gid"])["op"].apply(tuple)
            differ = ops.groupby(level="_gid").nunique().gt(1)
            bad = set(differ[differ].index)
            if bad:  # the ranks' op sequences differ: order per op
                per_op = rest["_gid"].isin(bad)
                nth_op = rest[per_op].groupby(["rank", "_gid", "op"]).cumcount() + 1
                k.loc[per_op] = (rest.loc[per_op, "_gid"] + ":" + rest.loc[per_op, "op"] + ":"
                                 + nth_op.astype(str))
            key.loc[rest.index] = k
            how.loc[rest.index] = "order"
    p2p = p2p_op & has_peer & ev["op"].isin(["send", "recv"]).to_numpy()
    if p2p.any():
        sub = ev[p2p]
        src = np.where(sub["op"] == "send", sub["rank"], sub["peer"]).astype(int)
        dst = np.where(sub["op"] == "send", sub["peer"], sub["rank"]).astype(int)
        tmp = sub.assign(src=src, dst=dst)
        nth = tmp.groupby(["rank", "_gid", "src", "dst"]).cumcount() + 1
        key.loc[sub.index] = ("p2p:" + tmp["_gid"].str[1:] + ":" + tmp["src"].astype(str) + ">"
                              + tmp["dst"].astype(str) + ":" + nth.astype(str))
        how.loc[sub.index] = "pair"
    ev["instance"] = key
    ev["matched"] = how
    return ev.drop(columns="_gid")


def _clock_groups(ev: pd.DataFrame, complete: set, ranks: list[int]
                  ) -> tuple[dict[int, float], dict[int, int], dict[int, int], int]:
    """Offsets of ranks whose clocks complete instances link (hosts unknown).

    Complete collectives join ranks into groups (union-find over their members); inside a group
    each rank's offset is the median over its collectives of ``end − median end`` (everyone
    leaves together), relative to the group's lowest rank. Groups that only point-to-point pairs
    join are one clock when every pair's send and recv overlap in time. Returns
    (``{rank: offset µs}`` relative to its group's lowest rank, ``{rank: collectives used}``,
    ``{rank: clock set id}``, point-to-point pairs between groups)."""
    parent = {r: r for r in ranks}

    def find(r):
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    is_p2p = ev["instance"].astype(str).str.startswith("p2p:")
    coll = ev[ev["instance"].isin(complete) & ~is_p2p]
    for _, members in coll.groupby("instance")["rank"]:
        m = sorted(int(x) for x in members)
        for x in m[1:]:
            parent[find(x)] = find(m[0])
    raw: dict[int, float] = {r: 0.0 for r in ranks}
    used: dict[int, int] = {r: 0 for r in ranks}
    if len(coll):
        consensus = coll.groupby("instance")["end_us"].transform("median")
        diff = (coll["end_us"] - consensus).groupby(coll["rank"])
        med, size = diff.median(), diff.size()
        for r in ranks:
            raw[r] = float(med.get(r, 0.0))
            used[r] = int(size.get(r, 0))
    comps: dict[int, list[int]] = {}
    for r in ranks:
        comps.setdefault(find(r), []).append(r)
    root = {r: min(comps[find(r)]) for r in ranks}
    within = {r: raw[r] - raw[root[r]] for r in ranks}
    # groups that only point-to-point transfers join: a send and its recv run together, so on
    # one clock their recorded intervals overlap. Groups whose every pair overlaps are taken as
    # one clock (no offset is made up from transfer ends, which a mispaired transfer would
    # skew); a pair that does not overlap says the clocks differ (or the pairing is off), and
    # those groups are not compared.
    pairs = ev[ev["instance"].isin(complete) & is_p2p]
    ok: dict[tuple[int, int], bool] = {}
    n_pairs = 0
    for _, g in pairs.groupby("instance"):
        if len(g) != 2:
            continue
        rs = [int(r) for r in g["rank"]]
        ca, cb = root[rs[0]], root[rs[1]]
        if ca == cb:
            continue
        n_pairs += 1
        st = [float(x) - within[r] for x, r in zip(g["start_us"], rs)]
        en = [float(x) - within[r] for x, r in zip(g["end_us"], rs)]
        overlap = max(st) <= min(en) + P2P_OVERLAP_SLACK_US
        key = (min(ca, cb), max(ca, cb))
        ok[key] = ok.get(key, True) and overlap
    linked = {}
    for start in sorted(set(root.values())):
        if start in linked:
            continue
        linked[start] = start
        todo = [start]
        while todo:
            a = todo.pop()
            for (x, y), good in ok.items():
                if good and a in (x, y):
                    other = y if a == x else x
                    if other not in linked:
                        linked[other] = start
                        todo.append(other)
    offset = {r: within[r] for r in ranks}
    return offset, used, {r: linked[root[r]] for r in ranks}, n_pairs


def _offsets(ev: pd.DataFrame, complete: set, hosts: dict[int, str]
             ) -> tuple[pd.DataFrame, list[str], dict[int, int]]:
    """Clock offsets (see :class:`SyncResult`) from the ends of complete instances (every
    member leaves a collective when the last arrives; TensorBoard profiler plugin: align on
    collective ends). Ranks on one host share one clock and one offset (the median over its
    ranks); with every rank on one host nothing is subtracted. Hosts unknown: per rank, linked
    through collectives, and one clock where only point-to-point pairs join ranks and every pair
    overlaps in time (:func:`_clock_groups`); ranks nothing links to the lowest rank keep their
    clock (offset 0), and a note says so.

    Returns:
        (offsets table, notes, ``{rank: clock set}``: ranks in different sets have clocks that
        nothing relates, so instances spanning two sets are not compared).
    """
    ranks = sorted(int(r) for r in ev["rank"].unique())
    out = pd.DataFrame({"rank": ranks})
    out["host"] = [hosts.get(r) for r in ranks]
    notes: list[str] = []
    if not ranks:
        return (pd.DataFrame(columns=["rank", "offset_us", "residual_us", "instances", "host"]),
                notes, {})
    offset, used, linked, n_pairs = _clock_groups(ev, complete, ranks)
    out["instances"] = out["rank"].map(used).astype(int)
    ref = ranks[0]
    raw = out["rank"].map(offset).astype(float)
    n_coll = ev.loc[ev["instance"].isin(complete)
                    & ~ev["instance"].astype(str).str.startswith("p2p:"), "instance"].nunique()
    known = all(hosts.get(r) for r in ranks)
    if known:
        by_host = raw.groupby(out["host"]).median()
        off = out["host"].map(by_host) - by_host[hosts[ref]]
        out["offset_us"] = off.astype(float)
        out["residual_us"] = raw - out["offset_us"]
        n_hosts = len(set(hosts[r] for r in ranks))
        if n_hosts == 1:
            notes.append(f"all {len(ranks)} ranks ran on one host ({hosts[ref]}): one clock, no "
                         f"offset subtracted (collective ends differ by at most "
                         f"{float(raw.abs().max()):.1f} µs there)")
            linked = {r: 0 for r in ranks}
        else:
            notes.append(f"clock offsets of {n_hosts} hosts estimated from {n_coll} complete "
                         f"collective instances; ranks on one host share one offset")
    else:
        out["offset_us"] = raw
        out["residual_us"] = 0.0
        if n_coll or n_pairs:
            notes.append(f"hosts unknown: a clock offset per rank estimated from {n_coll} "
                         f"complete collective instances"
                         + (f"; {n_pairs} point-to-point pairs between ranks that no collective "
                            f"joins checked for one clock" if n_pairs else ""))
        apart = sorted(r for r in ranks if linked[r] != linked[ref])
        if apart:
            notes.append(f"no complete collective links rank(s) {apart[:8]}"
                         f"{'...' if len(apart) > 8 else ''} to rank {ref}, and their "
                         f"point-to-point transfers with it do not overlap in time as recorded "
                         f"(other clocks, or transfers that cannot be paired): what they exchange "
                         f"with it is not compared")
    return out[["rank", "offset_us", "residual_us", "instances", "host"]], notes, linked


def _hosts(traces: TraceSet) -> dict[int, str]:
    """``{rank: host}`` from pardiag's rank metadata (traces from elsewhere do not say)."""
    return {r: str(m.host) for r, m in traces.rank_meta.items() if m.host}


def compute_sync(traces: TraceSet, comm_patterns=(),
                 events: pd.DataFrame | None = None) -> SyncResult:
    """Match collectives across ranks, align clocks, and measure synchronization (see module).

    Only *complete* instances (every member of the group present in the loaded traces) feed
    clock offsets, stragglers and bandwidth; partial ones are listed (``complete`` False) and
    counted in a note. A rank is named :attr:`SyncResult.straggler` only from complete ones.
    """
    ev = comm_events(traces, comm_patterns) if events is None else events
    empty = pd.DataFrame()
    no_stragglers = pd.DataFrame(columns=["rank", "wait_suffered_us", "wait_caused_us",
                                          "last_arrivals", "steps_as_top", "instances"])
    no_offsets = pd.DataFrame(columns=["rank", "offset_us", "residual_us", "instances", "host"])
    if ev.empty:
        return SyncResult(no_offsets, empty, empty, no_stragglers, empty, "none")
    ev, matched_by, notes = _matched_events(ev)
    present = set(int(r) for r in traces.ranks) | set(int(r) for r in ev["rank"].unique())
    inst, inst_notes, n_multi = _count_instances(ev, present)
    notes.extend(inst_notes)
    hosts = _hosts(traces)
    ev, inst, offsets, off_notes = _align_clocks(ev, inst, hosts)
    notes.extend(off_notes)
    inst = _instance_times(ev, inst, hosts)
    per_rank, pr = _per_rank_waits(ev, inst)
    ranks = sorted(int(r) for r in ev["rank"].unique())
    st, straggler = _stragglers(ranks, inst, pr, n_multi)
    bandwidth = _bandwidth_table(inst[inst["complete"]])
    return SyncResult(offsets, inst.drop(columns=["group_size"]), per_rank, st, bandwidth,
                      matched_by, straggler, tuple(notes), _p2p_pairs(inst, pr))


def _matched_events(ev: pd.DataFrame) -> tuple[pd.DataFrame, str, list[str]]:
    """Match the communication events (:data:`EVENT_COLUMNS`) into instances
    (:func:`match_instances`).

    Returns:
        (the matched events, ``instance`` and ``matched`` added, without the point-to-point ops
        whose peer is unknown; :attr:`SyncResult.matched_by`; a note when such ops were left
        out).
    """
    ev = match_instances(ev)
    hows = set(ev["matched"].dropna())
    if ev["source"].eq("records").all():
        matched_by = "records"
    elif "order" in hows:
        matched_by = "order"
    elif "seq" in hows:
        matched_by = "sequence numbers"
    elif "pair" in hows:
        matched_by = "point-to-point pairs"
    else:
        matched_by = "none"
    notes: list[str] = []
    unpaired = ev["instance"].isna()
    if unpaired.any():
        notes.append(f"{int(unpaired.sum())} point-to-point op(s) without a known peer were not "
                     f"paired (never matched as a group collective)")
    return ev[~unpaired].copy(), matched_by, notes


def _count_instances(ev: pd.DataFrame, present: set[int]
                     ) -> tuple[pd.DataFrame, list[str], int]:
    """One row per matched instance of ``ev`` (matched events, every ``instance`` set).

    ``present``: the ranks that have a trace (a group without sizes is taken to span them).

    Returns:
        (instances indexed by ``instance``: ``pg``, ``group``, ``seq``, ``op``, ``ranks``
        (members present), ``step`` (max), ``bytes`` (max over members), ``group_size``,
        ``expected`` (group size; 2 for a point-to-point pair), ``complete``; notes on
        over-full, partial and one-sided instances; the number of instances of more than one
        rank).
    """
    notes: list[str] = []
    g = ev.groupby("instance", sort=False)
    inst = pd.DataFrame({
        "pg": g["pg"].first(), "group": g["group"].first(), "seq": g["seq"].first(),
        "op": g["op"].first(), "ranks": g["rank"].nunique(), "step": g["step"].max(),
        "bytes": g["bytes"].max(), "group_size": g["group_size"].max(),
    })
    is_p2p = inst.index.to_series().str.startswith("p2p:")
    members = inst["group"].map(lambda k: [int(x) for x in k.split("|")[0].split(",")] if k
                                else None)
    expected = inst["group_size"].astype(float)
    expected = expected.where(expected.notna(), members.map(lambda m: len(m) if m else np.nan))
    expected = expected.fillna(float(len(present)))
    expected[is_p2p] = 2.0
    inst["expected"] = expected.astype(int)
    inst["complete"] = inst["ranks"] == inst["expected"]
    over = inst[inst["ranks"] > inst["expected"]]
    if len(over):
        notes.append(f"{len(over)} instance(s) hold more ranks than their group has (a group "
                     f"matched by a name that ranks reuse for different groups?): not used for "
                     f"clock offsets, stragglers or bandwidth")
    n_multi = int((inst["ranks"] > 1).sum())
    partial = inst[(inst["ranks"] < inst["expected"]) & ~is_p2p]
    if len(partial):
        absent = sorted({r for m in members[partial.index].dropna() for r in m} - present)
        notes.append(f"{len(partial)} of {int((~is_p2p).sum())} collective instance(s) lack "
                     f"members" + (f" (ranks {absent[:8]}{'...' if len(absent) > 8 else ''} have "
                                   f"no trace)" if absent else "")
                     + ": not used for clock offsets, stragglers or bandwidth")
    lone = inst[(inst["ranks"] < inst["expected"]) & is_p2p]
    if len(lone):
        notes.append(f"{len(lone)} point-to-point transfer(s) have only one side in the traces")
    return inst, notes, n_multi


def _align_clocks(ev: pd.DataFrame, inst: pd.DataFrame, hosts: dict[int, str]
                  ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
    """Estimate the clock offsets (:func:`_offsets`) from the complete instances of ``inst``
    (:func:`_count_instances`) and correct the event times of ``ev`` by them.

    Returns:
        (``ev`` with ``start_us``/``end_us`` corrected and ``dur_us`` added (µs); ``inst`` with
        ``complete`` False for instances whose members' clocks nothing relates; the offsets
        table (:attr:`SyncResult.offsets`); notes on the clock model).
    """
    complete = set(inst.index[inst["complete"]])
    offsets, notes, clock_set = _offsets(ev, complete, hosts)
    # an instance whose members' clocks nothing relates cannot be compared
    sets = ev.groupby("instance")["rank"].agg(lambda rs: len({clock_set[int(r)] for r in rs}))
    apart = set(sets.index[sets > 1])
    if apart:
        inst = inst.copy()
        inst.loc[inst.index.isin(apart), "complete"] = False
    ev = ev.copy()
    off = ev["rank"].map(dict(zip(offsets["rank"], offsets["offset_us"]))).fillna(0.0)
    ev["start_us"] = ev["start_us"] - off
    ev["end_us"] = ev["end_us"] - off
    ev["dur_us"] = ev["end_us"] - ev["start_us"]
    return ev, inst, offsets, notes


def _instance_times(ev: pd.DataFrame, inst: pd.DataFrame, hosts: dict[int, str]
                    ) -> pd.DataFrame:
    """Arrival, transfer time and bandwidth of each instance of more than one rank.

    ``ev``: the events on corrected clocks (:func:`_align_clocks`); ``inst``: the instances
    (:func:`_count_instances`), indexed by ``instance``.

    Returns:
        the instances of more than one rank with ``instance`` a column again, in order of
        ``first_arrival_us``, with ``first_arrival_us``, ``arrival_skew_us``, ``transfer_us``
        (µs), ``last_rank``, ``algbw_gbps``, ``busbw_gbps`` (GB/s; NaN when partial or without
        bytes) and ``inter_node`` added (:attr:`SyncResult.instances`, plus ``group_size``).
    """
    inst = inst.copy()
    g = ev.groupby("instance", sort=False)
    inst["first_arrival_us"] = g["start_us"].min()
    inst["arrival_skew_us"] = g["start_us"].max() - g["start_us"].min()
    inst["transfer_us"] = g["dur_us"].min()
    last_idx = g["start_us"].idxmax()
    inst["last_rank"] = ev.loc[last_idx.reindex(inst.index).values, "rank"].to_numpy()
    inst = inst[inst["ranks"] > 1].copy()
    n = inst["group_size"].where(inst["group_size"].notna(), inst["ranks"]).astype(float)
    seconds = inst["transfer_us"] / 1e6
    inst["algbw_gbps"] = pd.to_numeric(inst["bytes"], errors="coerce") / seconds / 1e9
    inst.loc[(seconds <= 0) | ~inst["complete"], "algbw_gbps"] = np.nan
    inst["busbw_gbps"] = inst["algbw_gbps"] * [busbw_factor(o, int(k)) for o, k in
                                               zip(inst["op"], n)]
    inst = inst.sort_values("first_arrival_us").reset_index(names="instance")
    if hosts:
        hsets = ev.groupby("instance")["rank"].apply(lambda rs: {hosts.get(int(r)) for r in rs})
        inst["inter_node"] = inst["instance"].map(
            lambda k: None if None in hsets.get(k, {None}) else len(hsets[k]) > 1)
    else:
        inst["inter_node"] = None
    return inst


def _per_rank_waits(ev: pd.DataFrame, inst: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each rank's time at each instance of :func:`_instance_times`.

    ``ev``: the events on corrected clocks (:func:`_align_clocks`).

    Returns:
        (:attr:`SyncResult.per_rank`: ``instance``, ``rank``, ``start_us``, ``end_us``,
        ``dur_us``, ``wait_us``, ``arrival_delay_us`` (µs); the rows of complete instances with
        every column of ``ev`` plus ``transfer_us``, ``first_arrival_us``, ``last_rank``,
        ``complete``, ``wait_us``, ``arrival_delay_us`` and ``wait_until_us`` (the last arrival,
        µs)).
    """
    pr = ev[ev["instance"].isin(inst["instance"])].copy()
    pr = pr.merge(inst[["instance", "transfer_us", "first_arrival_us", "last_rank", "complete"]],
                  on="instance")
    pr["wait_us"] = pr["dur_us"] - pr["transfer_us"]
    pr["arrival_delay_us"] = pr["start_us"] - pr["first_arrival_us"]
    # Waiting = from a rank's arrival to the last arrival. Aggregates take the union of those
    # intervals, so collectives in flight at the same time (DDP buckets) are not counted twice.
    pr["wait_until_us"] = pr.groupby("instance")["start_us"].transform("max")
    per_rank = pr[["instance", "rank", "start_us", "end_us", "dur_us", "wait_us",
                   "arrival_delay_us"]].reset_index(drop=True)
    return per_rank, pr[pr["complete"]]


def _waited(rows: pd.DataFrame) -> float:
    """|union of the waiting intervals ``start_us``–``wait_until_us``| of ``rows`` (µs)."""
    return iv.total(iv.union(rows["start_us"].to_numpy(), rows["wait_until_us"].to_numpy()))


def _wait_caused(pr: pd.DataFrame) -> dict[tuple[int, int], float]:
    """``{(last arrival, step): wait caused (µs)}``: per last-arriving rank and step, the sum over
    the waiting ranks (in rank order) of |union of each one's waits|; ``pr``: the rows of
    complete instances (:func:`_per_rank_waits`)."""
    others = pr[pr["rank"] != pr["last_rank"]]
    # positions instead of sub-frames (thousands of groups on big runs)
    caused: dict[tuple[int, int], float] = {}
    o_start = others["start_us"].to_numpy()
    o_until = others["wait_until_us"].to_numpy()
    groups = others.groupby(["last_rank", "step", "rank"], sort=True).indices
    for (last, step, _), idx in sorted(groups.items(), key=lambda kv: kv[0]):
        key = (int(last), int(step))
        caused[key] = caused.get(key, 0) + iv.total(iv.union(o_start[idx], o_until[idx]))
    return caused


def _stragglers(ranks: list[int], inst: pd.DataFrame, pr: pd.DataFrame, n_multi: int
                ) -> tuple[pd.DataFrame, int | None]:
    """Per-rank waits from the complete instances.

    ``ranks``: every rank with events; ``inst``: :func:`_instance_times`; ``pr``: the rows of
    complete instances (:func:`_per_rank_waits`); ``n_multi``: instances of more than one rank
    (with none of them complete, the table is empty).

    Returns:
        (:attr:`SyncResult.stragglers`, most wait caused first; :attr:`SyncResult.straggler`).
    """
    st = pd.DataFrame({"rank": ranks})
    st["wait_suffered_us"] = [_waited(pr[pr["rank"] == r]) for r in ranks]
    caused = _wait_caused(pr)
    total_caused: dict[int, float] = {}
    for (last, _), v in caused.items():
        total_caused[last] = total_caused.get(last, 0.0) + v
    st["wait_caused_us"] = st["rank"].map(total_caused).fillna(0.0)
    done = inst[inst["complete"]]
    st["last_arrivals"] = st["rank"].map(done["last_rank"].value_counts()).fillna(0).astype(int)
    top: dict[int, tuple[int, float]] = {}
    for (last, step), v in caused.items():
        if v > top.get(step, (None, -1.0))[1]:
            top[step] = (last, v)
    tops = pd.Series([t[0] for t in top.values()]).value_counts()
    st["steps_as_top"] = st["rank"].map(tops).fillna(0).astype(int)
    st["instances"] = st["rank"].map(pr.groupby("rank")["instance"].nunique()).fillna(0).astype(int)
    st = st.sort_values(["wait_caused_us", "rank"], ascending=[False, True]).reset_index(drop=True)
    if done.empty and n_multi:
        st = st.iloc[:0]
    straggler = (int(st["rank"].iloc[0]) if len(st)
                 and float(st["wait_caused_us"].iloc[0]) >= STRAGGLER_MIN_WAIT_US else None)
    return st, straggler


def _bandwidth_table(done: pd.DataFrame) -> pd.DataFrame:
    """:attr:`SyncResult.bandwidth` (medians per group, op, bytes and ``inter_node``; µs, GB/s)
    from the complete instances ``done`` (:func:`_instance_times`)."""
    bw = done.dropna(subset=["algbw_gbps"])
    if len(bw):
        return (bw.assign(inter_node=bw["inter_node"].map(
                    lambda v: "unknown" if v is None else ("inter" if v else "intra")))
                .groupby(["pg", "op", "bytes", "inter_node"], as_index=False)
                .agg(count=("instance", "size"), transfer_us=("transfer_us", "median"),
                     algbw_gbps=("algbw_gbps", "median"), busbw_gbps=("busbw_gbps", "median")))
    return pd.DataFrame(columns=["pg", "op", "bytes", "inter_node", "count", "transfer_us",
                                 "algbw_gbps", "busbw_gbps"])


def _p2p_pairs(inst: pd.DataFrame, pr: pd.DataFrame) -> pd.DataFrame:
    """:attr:`SyncResult.p2p` from the complete point-to-point instances and their per-rank
    rows (``pr``: corrected times, ``wait_until_us``)."""
    pairs = inst[inst["instance"].str.startswith("p2p:") & inst["complete"]]
    if pairs.empty:
        return pd.DataFrame(columns=P2P_COLUMNS)
    ends = pairs["instance"].str.split(":").str[-2].str.split(">")
    pairs = pairs.assign(src=ends.str[0].astype(int), dst=ends.str[1].astype(int))
    rows = pr[pr["instance"].isin(pairs["instance"])].merge(
        pairs[["instance", "src", "dst"]], on="instance")
    rows = rows.assign(waited=rows["wait_until_us"] - rows["start_us"])
    recv = rows[rows["rank"] == rows["dst"]].set_index("instance")["waited"]
    send = rows[rows["rank"] == rows["src"]].set_index("instance")["waited"]
    pairs = pairs.assign(recv_wait_us=pairs["instance"].map(recv),
                         send_wait_us=pairs["instance"].map(send))
    out = (pairs.groupby(["src", "dst"], as_index=False)
           .agg(count=("instance", "size"), hop_us=("transfer_us", "median"),
                recv_wait_us=("recv_wait_us", "median"), send_wait_us=("send_wait_us", "median"),
                bytes=("bytes", "median")))
    return out[P2P_COLUMNS]
