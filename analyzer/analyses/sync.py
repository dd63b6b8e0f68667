"""Collectives across ranks: matching, clocks, synchronization, stragglers, bandwidth.

Input: every rank's issued communication ops
    (:func:`pardiag.analyzer.analyses.comm_events.comm_events`: one row per op the program
    issued, however many kernels it ran as). What each op says across ranks is one table,
    :mod:`pardiag.analyzer.per_rank.op_semantics`.

1. **Matching** (:mod:`pardiag.analyzer.analyses.matching`): one collective *instance* is the
   set of events with the same group and sequence number on every participant (pardiag's
   records, a trace's ``Seq``); without them each member's sequence of issued ops is aligned
   with the group's longest by op type, bytes and profiler step (records missing at a window's
   head or in a step shift nothing; never a positional zip). Sends and receives pair by group,
   the two ranks and their per-peer count. Ops whose group is unknown are only matched with ops
   of unknown group.
2. **Clocks** (:mod:`pardiag.analyzer.analyses.clocks`): an offset and a drift per host (per rank
   when hosts are unknown), fitted robustly (Theil–Sen) to the ends of complete
   release-together instances only — rooted ops end along their chain, point-to-point pairs
   relate two ranks: sets of ranks that only they join are linked by their device kernels'
   ends (a send and its receive end together) or, on the host, taken as one clock when every
   pair overlaps. Ranks nothing links are separate clock domains, never compared. Times are
   corrected before anything is compared; offsets and drifts are reported.
3. **Window heads** (:mod:`pardiag.analyzer.analyses.stragglers`): instances before every rank's
   trace has started, and the first step after where the traces start more than
   :data:`pardiag.analyzer.analyses.stragglers.HEAD_SKEW_US` apart, are no evidence of a slow
   rank.
4. **Synchronization vs transfer** (TensorBoard profiler plugin;
   :mod:`pardiag.analyzer.analyses.stragglers`): the transfer time of an
   instance is its minimum duration over the ranks; each rank's wait is its duration minus that.
   Arrival skew = latest start − earliest start. A rank waits from its arrival to the arrival it
   waits for (the last one; at a broadcast or scatter the root's), and that rank *causes* the
   wait — or, for the part of the wait during which that rank was itself waiting, whoever it
   waited for (root causes, Scalasca's delay costs). Per-rank totals (wait suffered, wait
   caused) are lengths of unions of those intervals, so collectives in flight together (DDP
   buckets) count once. A straggler is named only from
   instances that are evidence: complete, not at a window's head, of known semantics, and
   not a rooted op on a group no record names (its members and root would be guesses).
5. **Bandwidth** (nccl-tests, doc/PERFORMANCE.md): algbw = S / t with S the bytes of the full
   buffer and t the transfer time (an op of several kernels: first start to last end); busbw =
   algbw × factor (:func:`pardiag.analyzer.per_rank.op_semantics.busbw_factor`).
"""

from __future__ import annotations

import dataclasses
import functools

import pandas as pd

from ..per_rank.op_semantics import ROOTED, UNKNOWN
from ..trace import intervals as iv
from ..trace import vocab
from ..trace.traceset import TraceSet
from .clocks import ClockModel, align_clocks, instance_times, rank_hosts
from .comm_events import comm_events
from .instance_keys import is_p2p, p2p_endpoints
from .matching import count_instances, matched_events, peers_by_ends
from .peers import ranks_text
from .stragglers import (
    STRAGGLER_DOMINANCE,
    STRAGGLER_OUTSIDE_MIN_STEP_SHARE,
    compute_per_step,
    p2p_share,
    per_rank_waits,
    step_lengths,
    straggler_by_delay_cost,
    straggler_noise_note,
    straggler_table,
    window_heads,
    window_starts,
)


@dataclasses.dataclass(frozen=True)
class SyncResult:
    """Result of :func:`compute_sync`.

    Attributes:
        offsets: per rank (:attr:`pardiag.analyzer.analyses.clocks.ClockModel.table`):
            ``rank``, ``offset_us`` (its clock minus the reference rank's — the lowest rank of
            its clock domain — as subtracted before comparing; 0 for ranks on the reference
            rank's host), ``drift_us_per_s``, ``drift_ci_us_per_s``, ``residual_us`` (after the
            fit; on one host, where nothing is subtracted, what the ends suggest),
            ``instances`` (release-together instances used), ``host`` (None when unknown).
        instances: per collective instance: ``instance``, ``pg``, ``group`` (its ranks and
            description, :func:`pardiag.analyzer.analyses.comm_events.group_key`; ``""`` when
            unknown), ``seq``, ``op``, ``ranks`` (members present), ``expected`` (group size),
            ``complete`` (every member present), ``step``, ``bytes``, ``first_arrival_us``,
            ``arrival_skew_us``, ``transfer_us``, ``last_rank`` (the rank waited for), ``root``
            (rooted ops), ``semantics``, ``algbw_gbps``, ``busbw_gbps`` (GB/s = 1e9 bytes/s;
            NaN without bytes or when partial), ``inter_node`` (participants on more than one
            host; None when hosts are unknown), ``head`` (at a window's head), ``evidence``
            (counted in waits and stragglers). Point-to-point transfers are instances of two
            ranks (a send and its recv).
        per_rank: per instance and rank: ``instance``, ``rank``, ``start_us``, ``end_us`` (corrected
            clock), ``dur_us``, ``wait_us``, ``arrival_delay_us``, ``evidence``.
        stragglers: per rank, most wait caused first, from the instances that are evidence:
            ``rank``, ``wait_suffered_us`` (|union of its waiting intervals|), ``wait_caused_us``
            (Σ over the other ranks of |union of their waits for it|, as root cause:
            :func:`.stragglers._wait_caused`), ``last_arrivals`` and ``instances`` (the
            instances it arrived last at, of those it could be waited for at; an instance whose
            arrivals tie within :data:`.stragglers.ARRIVAL_TIE_US` counts in neither),
            ``steps_as_top`` (steps in which it caused the most wait),
            ``waiting_us`` (|union of its waits| at every complete instance, window heads
            included: the waiting part of its exposed communication is at most this; NaN for a
            rank that no complete instance holds — its peers are absent — whose split into
            waiting and transfer nobody can tell), ``head_waiting_us`` (the part of
            ``waiting_us`` at instances at a window's head: the profilers' start-up, no
            evidence of a slow peer; NaN as ``waiting_us``).
        bandwidth: per group, op, message size and ``inter_node`` (``"intra"``, ``"inter"`` or
            ``"unknown"``): ``count``, ``transfer_us``, ``algbw_gbps``, ``busbw_gbps`` (medians).
        matched_by: ``"records"``, ``"sequence numbers"``, ``"order"`` (some group had no
            usable sequence numbers), ``"point-to-point pairs"`` (no collective) or ``"none"``.
        p2p: per pair of ranks that exchange point-to-point transfers (complete pairs: a send
            and its recv): ``src``, ``dst``, ``count``, ``hop_us`` (median transfer time: from
            the later side's arrival to the receive's end, the link's latency for that size
            where the receive is blocking; an upper bound where the receive's span ends at a
            late wait, as gloo's async ``irecv`` does),
            ``recv_wait_us`` and ``send_wait_us`` (median time the receiver / sender waited for
            the other side to arrive), ``bytes`` (median). Empty without such pairs.
        straggler: the rank that causes the most waiting when that is at least
            :data:`pardiag.analyzer.analyses.stragglers.STRAGGLER_MIN_WAIT_US` over complete
            instances, else None.
        notes: what the matching could not do (partial instances, unpaired point-to-point ops,
            the clock model used), one line each.
        group_busbw: per group over its matched instances of every op and size
            (:func:`busbw_by_group`): ``pg`` (as text), ``busbw_median``, ``busbw_max`` (GB/s),
            ``count`` (instances with a busbw).
        counts: the matched instances counted (:func:`instance_counts`): ``instances``,
            ``collectives``, ``p2p``, ``complete``.
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
    group_busbw: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=GROUP_BUSBW_COLUMNS))
    counts: dict[str, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(COUNT_KEYS, 0))
    #: Set when the execution graph named :attr:`straggler` by the delay cost of its time
    #: outside computation (host work, a sleep), not of its computation: that cost (µs per
    #: step, median). Not in the JSON (its note says it).
    straggler_outside_cost_us: float | None = None
    #: The clock model the times were corrected with (per profiling window where the windows
    #: were fitted apart); None without matched instances. Not in the JSON (``offsets`` is).
    clock: ClockModel | None = None

    def with_graph_straggler(self, costs: pd.DataFrame | None, step_us: float | None,
                             work_cost: pd.DataFrame | None = None,
                             outside_costs: pd.DataFrame | None = None) -> SyncResult:
        """This result with, in a pipeline (most waits at point-to-point transfers), the
        straggler the execution graph's delay costs name
        (:func:`.stragglers.straggler_by_delay_cost`; ``costs``: :attr:`pardiag.analyzer.
        analyses.critical_path.CriticalPathResult.delay_costs`, None without a graph;
        ``step_us``: the step's median) and a note saying why; itself outside pipelines or
        without a graph. The waits a rank causes say little there: the first and last stages
        root the schedule's bubble, so a balanced pipeline's end stage causes most of the
        waiting, and a slow middle stage less than the end stages.

        Where no rank's computation costs the step a dominant share, the rank the waits name
        stays named when its whole work (computation and the rest: a sleep, host work) costs
        the step by the same rule (``work_cost``: its row, :data:`.critical_path.DELAY_COLUMNS`,
        from :meth:`~pardiag.analyzer.analyses.critical_path.CriticalPathResult.work_cost`),
        and is no longer named otherwise.

        A rank whose time outside computation costs the step a dominant share
        (``outside_costs``: :meth:`~pardiag.analyzer.analyses.critical_path.
        CriticalPathResult.outside_costs`), at least :data:`.stragglers.STRAGGLER_DOMINANCE` ×
        what the rank named by its computation costs and at least
        :data:`.stragglers.STRAGGLER_OUTSIDE_MIN_STEP_SHARE` of the step, is named instead: its
        extra time is no computation (a sleep, host work before its launches), which the
        computation's cost cannot see."""
        if costs is None or self.stragglers.empty or p2p_share(self.per_rank) < 0.5:
            return self   # no wait is evidence (every instance at a window's head): nobody
        who = straggler_by_delay_cost(costs, step_us)
        notes = tuple(n for n in self.notes if not n.startswith("no straggler named"))
        out = (straggler_by_delay_cost(outside_costs, step_us)
               if outside_costs is not None else None)
        if outside_costs is not None and out is not None and out != who:
            orow = outside_costs[outside_costs["rank"] == out].iloc[0]
            mine = costs[costs["rank"] == who]["delay_cost_us"] if who is not None else None
            cost_of_who = float(mine.iloc[0]) if mine is not None and len(mine) else 0.0
            if (float(orow["delay_cost_us"]) >= STRAGGLER_DOMINANCE * cost_of_who
                    and float(orow["delay_cost_us"])
                    >= STRAGGLER_OUTSIDE_MIN_STEP_SHARE * (step_us or 0.0)):
                note = (f"rank {out} named by the delay cost of its time outside computation "
                        f"on the execution graph (host work, a sleep): the steps replayed with "
                        f"that time cut to the other ranks' median "
                        f"({orow['excess_compute_us']:.0f} µs less per step) end "
                        f"{orow['delay_cost_us']:.0f} µs earlier per step (median)"
                        + ("" if who is None else
                           f"; rank {who}'s extra computation saves {cost_of_who:.0f} µs"))
                return dataclasses.replace(self, straggler=out, notes=(*notes, note),
                                           straggler_outside_cost_us=float(orow["delay_cost_us"]))
        if who == self.straggler:
            return self
        if who is None:
            if self.straggler is None:
                return self
            hidden = work_cost is not None and _mostly_outside(self.straggler, work_cost,
                                                               outside_costs)
            if (work_cost is not None and not hidden
                    and straggler_by_delay_cost(work_cost, step_us) is not None):
                return self   # its extra time is not computation (a sleep, host work)
            cost = (float(work_cost["delay_cost_us"].iloc[0])
                    if work_cost is not None and len(work_cost) else 0.0)
            if hidden and outside_costs is not None:
                o = outside_costs[outside_costs["rank"] == self.straggler].iloc[0]
                extra, saved = float(o["excess_compute_us"]), float(o["delay_cost_us"])
                what = (f"its extra time is mostly outside computation ({extra:.0f} µs per "
                        f"step: host work, a sleep), and the steps replayed with that time cut "
                        f"to the other ranks' median end only {saved:.0f} µs earlier per step")
            else:
                what = (f"the steps replayed with its work cut to the other ranks' median end "
                        f"{cost:.0f} µs earlier per step (median)")
            note = (f"no straggler named: rank {self.straggler} causes the most waiting, but "
                    f"{what}, and no rank's extra computation costs the step a clear share of "
                    f"it (delay costs on the execution graph): the waiting is the schedule's")
            return dataclasses.replace(self, straggler=None, notes=(*notes, note))
        row = costs[costs["rank"] == who].iloc[0]
        rest = costs[costs["rank"] != who]["delay_cost_us"]
        note = (f"rank {who} named by its delay cost on the execution graph: the steps replayed "
                f"with its computation cut to the other ranks' median "
                f"({row['excess_compute_us']:.0f} µs less per step) end "
                f"{row['delay_cost_us']:.0f} µs earlier per step (median); "
                f"no other rank's saves more than {float(rest.max()) if len(rest) else 0.0:.0f} "
                f"µs" + ("" if self.straggler is None else
                         f" (rank {self.straggler} causes the most waiting: the schedule's)"))
        return dataclasses.replace(self, straggler=who, notes=(*notes, note))

    @functools.cached_property
    def skew(self) -> pd.DataFrame:
        """Arrival skew per collective type (:func:`skew_by_op`). Computed once (the JSON, the
        page and the terminal read it)."""
        return skew_by_op(self.instances)


def _mostly_outside(rank: int, work_cost: pd.DataFrame, outside_costs: pd.DataFrame | None
                    ) -> bool:
    """Whether at least half of ``rank``'s extra work (``work_cost``'s excess) is time outside
    computation whose own delay cost (``outside_costs``) was measured: then that cost, not the
    whole work's, says what its extra time costs (scaling its whole work down shortens its
    computation too, which is no slower than its peers')."""
    if outside_costs is None or outside_costs.empty or work_cost.empty:
        return False
    row = outside_costs[outside_costs["rank"] == rank]
    extra = float(work_cost["excess_compute_us"].iloc[0])
    return bool(len(row)) and extra > 0 and float(row["excess_compute_us"].iloc[0]) >= 0.5 * extra


def skew_by_op(instances: pd.DataFrame) -> pd.DataFrame:
    """Arrival skew per collective type: ``op``, ``count`` (instances), ``arrival_skew_us``
    (median), ``max_skew_us``, ``transfer_us`` (median); from :attr:`SyncResult.instances`."""
    if instances.empty:
        return pd.DataFrame(columns=["op", "count", "arrival_skew_us", "max_skew_us",
                                     "transfer_us"])
    return (instances.groupby("op", as_index=False)
            .agg(count=("instance", "size"), arrival_skew_us=("arrival_skew_us", "median"),
                 max_skew_us=("arrival_skew_us", "max"), transfer_us=("transfer_us", "median")))


#: Columns of :func:`busbw_by_group` (:attr:`SyncResult.group_busbw`).
GROUP_BUSBW_COLUMNS: list[str] = ["pg", "busbw_median", "busbw_max", "count"]
#: Keys of :func:`instance_counts` (:attr:`SyncResult.counts`).
COUNT_KEYS: tuple[str, ...] = ("instances", "collectives", "p2p", "complete")


def busbw_by_group(instances: pd.DataFrame) -> pd.DataFrame:
    """Bus bandwidth per process group over its instances of every op and message size: the
    median and the largest ``busbw_gbps`` (GB/s = 1e9 bytes/s; busbw as nccl-tests defines it,
    see the module docstring) of the instances that have one, and how many do.

    Args:
        instances: :attr:`SyncResult.instances`.

    Returns:
        :data:`GROUP_BUSBW_COLUMNS`: ``pg`` (the group's id as text, the key the layout's
        groups are looked up by), ``busbw_median``, ``busbw_max`` (GB/s), ``count``; one row
        per group with at least one busbw, by ``pg``.
    """
    if instances.empty or "busbw_gbps" not in instances:
        return pd.DataFrame(columns=GROUP_BUSBW_COLUMNS)
    bw = (instances.dropna(subset=["busbw_gbps"])
          .groupby(instances["pg"].astype(str))["busbw_gbps"].agg(["median", "max", "size"]))
    return pd.DataFrame({"pg": bw.index.to_numpy(), "busbw_median": bw["median"].to_numpy(),
                         "busbw_max": bw["max"].to_numpy(), "count": bw["size"].to_numpy()},
                        columns=GROUP_BUSBW_COLUMNS)


def instance_counts(instances: pd.DataFrame) -> dict[str, int]:
    """The matched instances counted: ``instances`` (all), ``p2p`` (point-to-point transfers,
    the instances keyed ``p2p:…``), ``collectives`` (the others), ``complete`` (every member
    present; all of them when the table does not say)."""
    if instances.empty:
        return dict.fromkeys(COUNT_KEYS, 0)
    n = len(instances)
    p2p = int(is_p2p(instances["instance"]).sum())
    complete = int(instances["complete"].sum()) if "complete" in instances else n
    return {"instances": n, "collectives": n - p2p, "p2p": p2p, "complete": complete}


def _multi_rank_groups(traces: TraceSet) -> set[tuple[int, ...]]:
    """The process groups of two or more ranks that the ranks' ``distributedInfo.pg_config``
    lists (each rank lists the groups that hold it); empty where a rank lists none (the trace
    does not say which groups the run has)."""
    groups: set[tuple[int, ...]] = set()
    for t in traces.ranks.values():
        mine = {tuple(sorted(int(x) for x in vocab.PG_CONFIG_RANKS.get(g)))
                for g in t.pg_config}   # (entries whose ranks are a list)
        if not mine:
            return set()
        groups |= {g for g in mine if len(g) > 1}
    return groups


#: Columns of :attr:`SyncResult.p2p`.
P2P_COLUMNS: list[str] = ["src", "dst", "count", "hop_us", "recv_wait_us", "send_wait_us", "bytes"]


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
                                          "last_arrivals", "steps_as_top", "instances",
                                          "waiting_us", "head_waiting_us"])
    no_offsets = pd.DataFrame(columns=["rank", "offset_us", "residual_us", "instances", "host"])
    if ev.empty:
        return SyncResult(no_offsets, empty, empty, no_stragglers, empty, "none")
    ev, by_ends = peers_by_ends(ev)
    unpaired = {int(r) for r in ev.loc[ev["op"].isin(["send", "recv"]) & ev["peer"].isna(),
                                       "rank"]}
    ev, matched_by, notes = matched_events(ev)
    if by_ends:
        notes.append(by_ends)
    present = set(int(r) for r in traces.ranks) | set(int(r) for r in ev["rank"].unique())
    inst, inst_notes, n_multi = count_instances(ev, present)
    notes.extend(inst_notes)
    hosts = rank_hosts(traces)
    starts = window_starts(traces)
    ref_start = starts.get(min(int(r) for r in ev["rank"].unique()), []) if len(ev) else []
    ev, inst, clock, off_notes = align_clocks(ev, inst, hosts,
                                              min(ref_start) if ref_start else None)
    notes.extend(off_notes)
    inst = instance_times(ev, inst, hosts)
    head, head_note = window_heads(ev, inst, starts, clock)
    inst["head"] = head.to_numpy()
    # A rooted op on a group no record names may join several groups' ops in one instance, and
    # its root is then only the member that finished first: who waited for whom is a guess,
    # unless the run has one group of two or more ranks (gloo's broadcasts of a DDP job).
    guessed_root = (inst["semantics"].eq(ROOTED) & inst["group"].fillna("").astype(str).eq("")
                    & (len(_multi_rank_groups(traces)) != 1))
    inst["evidence"] = (inst["complete"] & ~inst["head"] & inst["semantics"].ne(UNKNOWN)
                        & ~guessed_root)
    if head_note:
        notes.append(head_note)
    per_rank, pr = per_rank_waits(ev, inst)
    ranks = sorted(int(r) for r in ev["rank"].unique())
    st, straggler = straggler_table(ranks, inst, pr[pr["evidence"].astype(bool)], n_multi,
                                     step_lengths(traces, comm_patterns),
                                     compute_per_step(traces, comm_patterns))
    p_start, p_until = pr["start_us"].to_numpy(), pr["wait_until_us"].to_numpy()
    p_head = pr["instance"].map(inst.set_index("instance")["head"]).fillna(False).to_numpy(bool)
    # per rank, |union of its waiting intervals| (µs), its rows by position; and of those at a
    # window's head, where waiting is profiler start-up rather than a slow peer
    waiting, head_waiting = {}, {}
    for r, idx in sorted(pr.groupby("rank").indices.items()):
        waiting[int(r)] = iv.total(iv.union(p_start[idx], p_until[idx]))
        h = idx[p_head[idx]]
        head_waiting[int(r)] = iv.total(iv.union(p_start[h], p_until[h])) if len(h) else 0.0
    if st.empty and waiting:  # complete instances, none of them evidence (a window's head)
        st = pd.DataFrame({"rank": ranks, "wait_suffered_us": 0.0, "wait_caused_us": 0.0,
                           "last_arrivals": 0, "steps_as_top": 0, "instances": 0})
    st["waiting_us"] = st["rank"].map(waiting)
    st["head_waiting_us"] = st["rank"].map(head_waiting)
    # the rank named, else the ranks that arrived last together and caused the most waiting
    lead = ([straggler] if straggler is not None else
            st.loc[(st["wait_caused_us"] > 0) & (st["last_arrivals"] > 0)
                   & (st["wait_caused_us"] >= 0.99 * st["wait_caused_us"].max()),
                   "rank"].astype(int).tolist() if len(st) else [])
    if lead and unpaired:
        # a rank late at its collectives because a rank that sends to it was late: with
        # transfers whose peer is unknown the chain of causes breaks there
        who, it = ((f"rank {lead[0]} arrives last at its", "it") if len(lead) == 1 else
                   (f"{ranks_text(lead)} arrive last together at their", "them"))
        notes.append(f"no straggler named: {who} collectives, but point-to-point transfers of "
                     f"{ranks_text(unpaired)} have no known peer, so whether that lateness "
                     f"comes from a rank that sends to {it} cannot be told")
        straggler = None
    noise = straggler_noise_note(st, straggler) if not unpaired else None
    if noise:
        notes.append(noise)
    bandwidth = _bandwidth_table(inst[inst["complete"]])
    inst = inst.drop(columns=["group_size"])
    return SyncResult(clock.table, inst, per_rank, st, bandwidth, matched_by, straggler,
                      tuple(notes), _p2p_pairs(inst, pr), busbw_by_group(inst),
                      instance_counts(inst), clock=clock)


def _bandwidth_table(done: pd.DataFrame) -> pd.DataFrame:
    """:attr:`SyncResult.bandwidth` (medians per group, op, bytes and ``inter_node``; µs, GB/s)
    from the complete instances ``done`` (:func:`.clocks.instance_times`)."""
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
    pairs = inst[is_p2p(inst["instance"]) & inst["complete"]]
    if pairs.empty:
        return pd.DataFrame(columns=P2P_COLUMNS)
    pairs = pairs.join(p2p_endpoints(pairs["instance"]))
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
