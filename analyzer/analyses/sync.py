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
   relate two ranks. Ranks that no complete collective joins are separate clock domains, never
   compared. Times are corrected before anything is compared; offsets and drifts are reported.
3. **Window heads**: instances before every rank's trace has started, and the first step after
   where the traces start more than :data:`HEAD_SKEW_US` apart, are no evidence of a slow rank.
4. **Synchronization vs transfer** (TensorBoard profiler plugin): the transfer time of an
   instance is its minimum duration over the ranks; each rank's wait is its duration minus that.
   Arrival skew = latest start − earliest start. A rank waits from its arrival to the arrival it
   waits for (the last one; at a broadcast or scatter the root's), and that rank *causes* the
   wait. Per-rank totals (wait suffered, wait caused) are lengths of unions of those intervals,
   so collectives in flight together (DDP buckets) count once. A straggler is named only from
   instances that are evidence: complete, not at a window's head, of known semantics.
5. **Bandwidth** (nccl-tests, doc/PERFORMANCE.md): algbw = S / t with S the bytes of the full
   buffer and t the transfer time (an op of several kernels: first start to last end); busbw =
   algbw × factor (:func:`pardiag.analyzer.per_rank.op_semantics.busbw_factor`).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pandas as pd

from ..per_rank.op_semantics import FROM_ROOT, ROOTED, UNKNOWN, busbw_factor
from ..per_rank.summary import summary_of
from ..trace import intervals as iv
from ..trace.traceset import TraceSet, float_column
from .clocks import ClockModel, fit_clocks, together_ends
from .comm_events import comm_events
from .matching import count_instances, matched_events


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
            (Σ over the other ranks of |union of their waits for it|), ``last_arrivals``,
            ``steps_as_top`` (steps in which it caused the most wait), ``instances``,
            ``waiting_us`` (|union of its waits| at every complete instance, window heads
            included: the waiting part of its exposed communication is at most this; NaN for a
            rank that no complete instance holds — its peers are absent — whose split into
            waiting and transfer nobody can tell).
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

    @functools.cached_property
    def skew(self) -> pd.DataFrame:
        """Arrival skew per collective type (:func:`skew_by_op`). Computed once (the JSON, the
        page and the terminal read it)."""
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
#: Waiting per profiler step (µs, summed over the waiting ranks) below which no rank is named a
#: straggler.
STRAGGLER_MIN_WAIT_US = 10.0
#: A straggler arrives last at least at this share of the ops it joins.
STRAGGLER_LAST_SHARE = 0.5
#: ... and costs each waiting rank at least this share of the step (the collectives' span per
#: step), per step.
STRAGGLER_MIN_STEP_SHARE = 0.02
#: ... and at least this share of the profiler step (the collectives can sit in a short part of
#: the step, DDP's at its end), and more than the step varies from step to step.
STRAGGLER_MIN_PROFILER_STEP_SHARE = 0.005
#: The rank that causes the most waiting is named only when it causes at least this many times
#: what the next rank does: waiting that jitter spreads over the ranks names nobody (it is
#: inside the noise, and the notes say so).
STRAGGLER_DOMINANCE = 3.0


def _link(ev: pd.DataFrame, complete: set, ranks: list[int]) -> dict[int, int]:
    """``{rank: lowest rank it is linked to}``: complete collectives (release-together or
    rooted) join their members (union-find); ranks nothing joins are their own."""
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
    comps: dict[int, list[int]] = {}
    for r in ranks:
        comps.setdefault(find(r), []).append(r)
    return {r: min(comps[find(r)]) for r in ranks}


def _p2p_links(ev: pd.DataFrame, complete: set, root: dict[int, int], model: ClockModel
               ) -> tuple[dict[int, int], int]:
    """Join the clock domains that only point-to-point pairs relate: a send and its recv run
    together, so on one clock their recorded intervals overlap. Domains whose every pair
    overlaps are taken as one clock (no offset is made up from transfer ends, which a
    mispaired transfer would skew); a pair that does not overlap says the clocks differ (or the
    pairing is off), and those domains are not compared.

    Returns:
        (``{rank: domain}``, point-to-point pairs between domains).
    """
    is_p2p = ev["instance"].astype(str).str.startswith("p2p:")
    pairs = ev[ev["instance"].isin(complete) & is_p2p]
    ok: dict[tuple[int, int], bool] = {}
    n_pairs = 0
    for _, g in pairs.groupby("instance"):
        if len(g) != 2:
            continue
        rs = g["rank"].to_numpy()
        ca, cb = root[int(rs[0])], root[int(rs[1])]
        if ca == cb:
            continue
        n_pairs += 1
        st = model.correct(rs, g["start_us"].to_numpy(dtype=float))
        en = model.correct(rs, g["end_us"].to_numpy(dtype=float))
        key = (min(ca, cb), max(ca, cb))
        ok[key] = ok.get(key, True) and bool(st.max() <= en.min() + P2P_OVERLAP_SLACK_US)
    linked: dict[int, int] = {}
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
    return {r: linked[root[r]] for r in root}, n_pairs


def _clock_model(ev: pd.DataFrame, complete: set, hosts: dict[int, str],
                 t0_us: float | None = None) -> tuple[ClockModel, list[str]]:
    """The clocks of the ranks (:mod:`pardiag.analyzer.analyses.clocks`): one offset and drift
    per host where every rank's host is known (with one host, one clock: nothing subtracted),
    else per rank, relative to the lowest rank of each clock domain and fitted over the ends of
    complete release-together instances only. Ranks nothing links to the lowest rank keep their
    clock, and a note says so. The offsets hold at ``t0_us`` (the reference rank's clock; by
    default its first communication event): with drift, an offset is a clock's difference at
    one moment, and the start of the profiled window is the one a reader compares.

    Returns:
        (the model, notes on it).
    """
    ranks = sorted(int(r) for r in ev["rank"].unique())
    notes: list[str] = []
    cols = ["rank", "offset_us", "drift_us_per_s", "drift_ci_us_per_s", "residual_us",
            "instances", "host"]
    if not ranks:
        return ClockModel(pd.DataFrame(columns=cols), 0.0, {}, False), notes
    ref = ranks[0]
    t0 = float(np.nanmin(ev.loc[ev["rank"] == ref, "start_us"].to_numpy(dtype=float)))
    if t0_us is not None and np.isfinite(t0_us):
        t0 = float(t0_us)
    root = _link(ev, complete, ranks)
    rows = together_ends(ev, complete)
    known = all(hosts.get(r) for r in ranks)
    one_host = known and len({hosts[r] for r in ranks}) == 1
    # one host is one clock; its ranks are still fitted one by one, to say how far apart the
    # ends are there
    unit = {r: hosts[r] for r in ranks} if known and not one_host else {r: r for r in ranks}
    fit = fit_clocks(rows, unit, t0)
    used = rows.groupby("rank")["instance"].nunique()
    none = (0.0, 0.0, np.nan, 0.0, 0)
    out = pd.DataFrame({"rank": ranks, "host": [hosts.get(r) for r in ranks]})
    out["instances"] = out["rank"].map(used).fillna(0).astype(int)
    a = np.array([fit.get(unit[r], none)[0] for r in ranks], dtype=float)
    b = np.array([fit.get(unit[r], none)[1] for r in ranks], dtype=float)
    a = np.nan_to_num(a)
    # relative to the lowest rank of each domain (its own clock)
    ref_of = [root[r] for r in ranks]
    pos = {r: i for i, r in enumerate(ranks)}
    out["offset_us"] = [a[i] - a[pos[q]] for i, q in enumerate(ref_of)]
    out["drift_us_per_s"] = [b[i] - b[pos[q]] for i, q in enumerate(ref_of)]
    out["drift_ci_us_per_s"] = [fit.get(unit[r], none)[2] for r in ranks]
    out["residual_us"] = [fit.get(unit[r], none)[3] for r in ranks]
    n_coll = rows["instance"].nunique()
    applied = True
    if one_host:
        applied = False
        out["residual_us"] = out["offset_us"]
        out["offset_us"] = 0.0
        out["drift_us_per_s"] = 0.0
        notes.append(f"all {len(ranks)} ranks ran on one host ({hosts[ref]}): one clock, no "
                     f"offset subtracted" + (
                         f" (collective ends differ by at most "
                         f"{float(np.abs(out['residual_us']).max()):.1f} µs there)" if n_coll else
                         " (no complete release-together collective to compare ends at)"))
        return ClockModel(out[cols], t0, {r: 0 for r in ranks}, applied), notes
    model = ClockModel(out[cols], t0, dict(root), applied)
    domain, n_pairs = _p2p_links(ev, complete, root, model)
    model = dataclasses.replace(model, domain=domain)
    what = "host" if known else "rank"
    if n_coll or n_pairs:
        notes.append(f"{'hosts known' if known else 'hosts unknown'}: a clock offset and drift "
                     f"per {what} fitted (Theil–Sen) to the ends of {n_coll} complete "
                     f"release-together collective instances"
                     + (f"; {n_pairs} point-to-point pairs between ranks that no collective "
                        f"joins checked for one clock" if n_pairs else ""))
    drifting = out[out["drift_us_per_s"].abs() > 0]
    if len(drifting):
        worst = drifting.loc[drifting["drift_us_per_s"].abs().idxmax()]
        notes.append(f"clock drift found on {len(drifting)} rank(s) (up to "
                     f"{float(worst['drift_us_per_s']):+.1f} µs/s on rank {int(worst['rank'])}): "
                     f"times corrected by offset and drift")
    apart = sorted(r for r in ranks if domain[r] != domain[ref])
    if apart:
        notes.append(f"no complete collective links rank(s) {apart[:8]}"
                     f"{'...' if len(apart) > 8 else ''} to rank {ref}, and their "
                     f"point-to-point transfers with it do not overlap in time as recorded "
                     f"(other clocks, or transfers that cannot be paired): separate clock "
                     f"domains, never compared")
    return model, notes


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
                                          "last_arrivals", "steps_as_top", "instances",
                                          "waiting_us"])
    no_offsets = pd.DataFrame(columns=["rank", "offset_us", "residual_us", "instances", "host"])
    if ev.empty:
        return SyncResult(no_offsets, empty, empty, no_stragglers, empty, "none")
    ev, matched_by, notes = matched_events(ev)
    present = set(int(r) for r in traces.ranks) | set(int(r) for r in ev["rank"].unique())
    inst, inst_notes, n_multi = count_instances(ev, present)
    notes.extend(inst_notes)
    hosts = _hosts(traces)
    starts = _window_starts(traces)
    ref_start = starts.get(min(int(r) for r in ev["rank"].unique()), []) if len(ev) else []
    ev, inst, clock, off_notes = _align_clocks(ev, inst, hosts,
                                               min(ref_start) if ref_start else None)
    notes.extend(off_notes)
    inst = _instance_times(ev, inst, hosts)
    head, head_note = _window_heads(ev, inst, starts, clock)
    inst["head"] = head.to_numpy()
    inst["evidence"] = inst["complete"] & ~inst["head"] & inst["semantics"].ne(UNKNOWN)
    if head_note:
        notes.append(head_note)
    per_rank, pr = _per_rank_waits(ev, inst)
    ranks = sorted(int(r) for r in ev["rank"].unique())
    st, straggler = _stragglers(ranks, inst, pr[pr["evidence"].astype(bool)], n_multi,
                                _step_lengths(traces, comm_patterns))
    p_start, p_until = pr["start_us"].to_numpy(), pr["wait_until_us"].to_numpy()
    # per rank, |union of its waiting intervals| (µs), its rows by position
    waiting = {int(r): iv.total(iv.union(p_start[idx], p_until[idx]))
               for r, idx in sorted(pr.groupby("rank").indices.items())}
    if st.empty and waiting:  # complete instances, none of them evidence (a window's head)
        st = pd.DataFrame({"rank": ranks, "wait_suffered_us": 0.0, "wait_caused_us": 0.0,
                           "last_arrivals": 0, "steps_as_top": 0, "instances": 0})
    st["waiting_us"] = st["rank"].map(waiting)
    noise = straggler_noise_note(st, straggler)
    if noise:
        notes.append(noise)
    bandwidth = _bandwidth_table(inst[inst["complete"]])
    return SyncResult(clock.table, inst.drop(columns=["group_size"]), per_rank, st, bandwidth,
                      matched_by, straggler, tuple(notes), _p2p_pairs(inst, pr))


def _align_clocks(ev: pd.DataFrame, inst: pd.DataFrame, hosts: dict[int, str],
                  t0_us: float | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame, ClockModel, list[str]]:
    """Fit the clock model (:func:`_clock_model`, offsets at ``t0_us``) to the complete
    instances of ``inst`` (:func:`.matching.count_instances`) and correct the event times of
    ``ev`` by it.

    Returns:
        (``ev`` with ``start_us``/``end_us`` on the reference clock and ``dur_us`` added (µs);
        ``inst`` with ``complete`` False for instances whose members' clocks nothing relates;
        the model; notes on it).
    """
    complete = set(inst.index[inst["complete"]])
    model, notes = _clock_model(ev, complete, hosts, t0_us)
    # an instance whose members' clocks nothing relates cannot be compared
    sets = ev.groupby("instance")["rank"].agg(
        lambda rs: len({model.domain.get(int(r), int(r)) for r in rs}))
    apart = set(sets.index[sets > 1])
    if apart:
        inst = inst.copy()
        inst.loc[inst.index.isin(apart), "complete"] = False
    ev = ev.copy()
    rk = ev["rank"].to_numpy()
    ev["start_us"] = model.correct(rk, ev["start_us"].to_numpy(dtype=float))
    ev["end_us"] = model.correct(rk, ev["end_us"].to_numpy(dtype=float))
    ev["dur_us"] = ev["end_us"] - ev["start_us"]
    return ev, inst, model, notes


def _instance_times(ev: pd.DataFrame, inst: pd.DataFrame, hosts: dict[int, str]
                    ) -> pd.DataFrame:
    """Arrival, transfer time and bandwidth of each instance of more than one rank.

    ``ev``: the events on corrected clocks (:func:`_align_clocks`); ``inst``: the instances
    (:func:`.matching.count_instances`), indexed by ``instance``.

    ``last_rank`` is the rank the others waited for: the last to arrive at a release-together
    op or a point-to-point pair; the root of a broadcast or scatter (members wait for the root
    only; their ends follow the chain by design) and the last member of a reduce or gather
    (the root waits for it). A rooted op's root is the one its record names, else the member
    that finished first.

    Returns:
        the instances of more than one rank with ``instance`` a column again, in order of
        ``first_arrival_us``, with ``first_arrival_us``, ``arrival_skew_us``, ``transfer_us``
        (µs), ``last_rank``, ``root``, ``algbw_gbps``, ``busbw_gbps`` (GB/s; NaN when partial or
        without bytes) and ``inter_node`` added (:attr:`SyncResult.instances`, plus
        ``group_size``).
    """
    inst = inst.copy()
    g = ev.groupby("instance", sort=False)
    inst["first_arrival_us"] = g["start_us"].min()
    inst["arrival_skew_us"] = g["start_us"].max() - g["start_us"].min()
    inst["transfer_us"] = g["dur_us"].min()
    # a point-to-point transfer runs from the moment both sides are there to the receive's end
    # (where the data is in place): an async isend's span lasts until its wait, which can come
    # long after (the same as the shorter side's duration when the two end together)
    recv_end = ev["end_us"].where(ev["op"].eq("recv")).groupby(ev["instance"]).max()
    p2p = inst.index.to_series().str.startswith("p2p:") & recv_end.reindex(inst.index).notna()
    xfer = (recv_end.reindex(inst.index) - g["start_us"].max()).clip(lower=0.0)
    inst.loc[p2p, "transfer_us"] = np.minimum(xfer[p2p], inst.loc[p2p, "transfer_us"])
    last_idx = g["start_us"].idxmax()
    inst["last_rank"] = ev.loc[last_idx.reindex(inst.index).values, "rank"].to_numpy()
    rooted = inst["semantics"].eq(ROOTED)
    if rooted.any():
        first_end = ev.loc[g["end_us"].idxmin().reindex(inst.index).values, "rank"].to_numpy()
        members = g["rank"].agg(lambda rs: {int(r) for r in rs}).reindex(inst.index)
        root = [int(r) if pd.notna(r) and int(r) in m else int(fe)
                for r, m, fe in zip(inst["root"], members, first_end)]
        inst["root"] = np.where(rooted, root, None)
        from_root = rooted & inst["op"].isin(FROM_ROOT)
        inst.loc[from_root, "last_rank"] = inst.loc[from_root, "root"].astype("int64")
    else:
        inst["root"] = None
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


#: Traces of one window that start further apart than this (µs, on the reference clock) say a
#: profiler opened late: the first step after every rank has started is left out of waits too.
HEAD_SKEW_US = 1000.0


def _window_starts(traces: TraceSet) -> dict[int, list[float]]:
    """``{rank: [start µs of each profiling window]}`` on each rank's own clock: its first
    profiler step or its first recorded work, whichever is earlier (the window starts of a rank
    loaded from several files), alike from a summary or from the events."""
    out: dict[int, list[float]] = {}
    for r, t in traces.ranks.items():
        if t.windows:
            out[int(r)] = [float(w[0]) for w in t.windows]
            continue
        s = summary_of(t)
        start = s.breakdown.total.get("start_us")
        steps = s.stored("steps")
        st = float_column(steps, "start_us")
        st = st[~np.isnan(st)]
        firsts = [float(x) for x in (start, st.min() if len(st) else None)
                  if x is not None and np.isfinite(x)]
        if firsts:  # its first profiler step, or its first recorded work before that
            out[int(r)] = [min(firsts)]
    return out


def _window_heads(ev: pd.DataFrame, inst: pd.DataFrame, starts: dict[int, list[float]],
                  clock: ClockModel) -> tuple[pd.Series, str | None]:
    """Which instances sit at a window's head: before every rank's trace of that profiling
    window has started, and — where the traces start more than :data:`HEAD_SKEW_US` apart (a
    rank whose profiler opened late arrives late at its first collectives, which says nothing
    about its speed) — the first profiler step after that (the whole step where every event
    has a step; else each group's first instance after).

    ``ev``: the events on the reference clock; ``inst``: :func:`_instance_times`; ``starts``:
    :func:`_window_starts`; ``clock``: the clock model that put ``ev`` on the reference clock.

    Returns:
        (a boolean Series aligned with ``inst``; a note when any instance is left out).
    """
    head = pd.Series(False, index=inst.index)
    if inst.empty:
        return head, None
    window = ev.groupby("instance")["window"].first()
    inst_win = inst["instance"].map(window).fillna(0).astype(int)
    skewed = 0.0
    for w, sub in ev.groupby("window"):
        ranks = sorted(int(r) for r in sub["rank"].unique())
        own = [starts.get(r, [])[int(w)] if int(w) < len(starts.get(r, [])) else np.nan
               for r in ranks]
        t0 = clock.correct(np.array(ranks), np.array(own, dtype=float))
        t0 = np.where(np.isfinite(t0), t0, sub.groupby("rank")["start_us"].min()
                      .reindex(ranks).to_numpy())
        t_all, spread = float(np.max(t0)), float(np.max(t0) - np.min(t0))
        mine = inst_win.eq(int(w))
        early = mine & (inst["first_arrival_us"] < t_all)
        after = pd.Series(False, index=inst.index)
        if spread > HEAD_SKEW_US:
            skewed = max(skewed, spread)
            steps = sub.loc[sub["step"] >= 0].groupby("rank")["step"].min()
            if (sub["step"] >= 0).all() and len(steps) == len(ranks):
                after = mine & (inst["step"] <= int(steps.max()))
            else:
                rows = inst[mine & ~early].sort_values("first_arrival_us")
                keys = rows["group"].astype(str) + "|" + rows["pg"].astype(str)
                after = pd.Series(inst.index.isin(rows.index[~keys.duplicated()]),
                                  index=inst.index)
        head |= early | after
    n = int((head & inst["complete"]).sum())
    note = None
    if n:
        note = (f"{n} complete collective instance(s) at the head of a profiling window kept out "
                f"of waits and stragglers: before every rank's trace had started"
                + (f", and the first step after (the traces start {skewed / 1e3:.1f} ms apart: a "
                   f"rank whose profiler opened late is late there without being slow)"
                   if skewed else ""))
    return head, note


def _per_rank_waits(ev: pd.DataFrame, inst: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each rank's time at each instance of :func:`_instance_times`.

    ``ev``: the events on corrected clocks (:func:`_align_clocks`). A member of a
    release-together op or a point-to-point pair waits from its arrival to the last arrival
    (what it took beyond the fastest member's duration, the transfer, is its wait: TensorBoard
    profiler plugin); a member of a broadcast or scatter waits from its arrival to the root's;
    the root of a reduce or gather to the last member's.

    Returns:
        (:attr:`SyncResult.per_rank`: ``instance``, ``rank``, ``start_us``, ``end_us``,
        ``dur_us``, ``wait_us``, ``arrival_delay_us`` (µs), ``evidence``; the rows of complete
        instances with every column of ``ev`` plus ``transfer_us``, ``first_arrival_us``,
        ``last_rank``, ``complete``, ``evidence``, ``wait_us``, ``arrival_delay_us`` and
        ``wait_until_us`` (the arrival waited for, µs)).
    """
    pr = ev[ev["instance"].isin(inst["instance"])].copy()
    pr = pr.merge(inst[["instance", "transfer_us", "first_arrival_us", "last_rank", "complete",
                        "semantics", "root", "evidence"]].rename(columns={"root": "_root"}),
                  on="instance")
    pr["wait_us"] = pr["dur_us"] - pr["transfer_us"]
    pr["arrival_delay_us"] = pr["start_us"] - pr["first_arrival_us"]
    # Waiting = from a rank's arrival to the arrival it waits for. Aggregates take the union of
    # those intervals, so collectives in flight at the same time (DDP buckets) count once.
    pr["wait_until_us"] = pr.groupby("instance")["start_us"].transform("max")
    rooted = pr["semantics"].eq(ROOTED).to_numpy()
    if rooted.any():
        is_root = (pr["rank"] == pr["_root"]).to_numpy()
        root_start = pr["start_us"].where(is_root).groupby(pr["instance"]).transform("max")
        from_root = rooted & pr["op"].isin(FROM_ROOT).to_numpy()
        until = np.where(from_root & ~is_root, np.maximum(pr["start_us"], root_start),
                         pr["start_us"])
        until = np.where(rooted & ~from_root & is_root, pr["wait_until_us"], until)
        pr["wait_until_us"] = np.where(rooted, until, pr["wait_until_us"])
        pr["wait_us"] = np.where(rooted, pr["wait_until_us"] - pr["start_us"], pr["wait_us"])
    # point-to-point: each side waits from its arrival to its peer's (an async isend's span,
    # which lasts until its wait, is no waiting)
    pair = pr["instance"].astype(str).str.startswith("p2p:").to_numpy()
    pr["wait_us"] = np.where(pair, pr["wait_until_us"] - pr["start_us"], pr["wait_us"])
    per_rank = pr[["instance", "rank", "start_us", "end_us", "dur_us", "wait_us",
                   "arrival_delay_us", "evidence"]].reset_index(drop=True)
    return per_rank, pr[pr["complete"].astype(bool)].drop(columns="_root")


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


def _stragglers(ranks: list[int], inst: pd.DataFrame, pr: pd.DataFrame, n_multi: int,
                profiler_step: tuple[float | None, float | None] = (None, None)
                ) -> tuple[pd.DataFrame, int | None]:
    """Per-rank waits from the complete instances.

    ``ranks``: every rank with events; ``inst``: :func:`_instance_times`; ``pr``: the rows of
    complete instances (:func:`_per_rank_waits`); ``n_multi``: instances of more than one rank
    (with none of them complete, the table is empty); ``profiler_step``: the step's median
    length and spread (:func:`_step_lengths`).

    Returns:
        (:attr:`SyncResult.stragglers`, most wait caused first; :attr:`SyncResult.straggler`).
    """
    st = pd.DataFrame({"rank": ranks})
    start, until = pr["start_us"].to_numpy(), pr["wait_until_us"].to_numpy()
    rows_of = pr.groupby("rank", sort=False).indices   # each rank's rows once, not a mask each
    none = np.array([], dtype=int)
    st["wait_suffered_us"] = [iv.total(iv.union(start[i], until[i]))
                              for i in (rows_of.get(r, none) for r in ranks)]
    caused = _wait_caused(pr)
    total_caused: dict[int, float] = {}
    for (last, _), v in caused.items():
        total_caused[last] = total_caused.get(last, 0.0) + v
    st["wait_caused_us"] = st["rank"].map(total_caused).fillna(0.0)
    done = inst[inst["evidence"]] if "evidence" in inst else inst[inst["complete"]]
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
    straggler = None
    n_steps = max(1, int(done["step"].nunique())) if len(done) else 1
    if len(st) and float(st["wait_caused_us"].iloc[0]) >= STRAGGLER_MIN_WAIT_US * n_steps:
        top = float(st["wait_caused_us"].iloc[0])
        second = float(st["wait_caused_us"].iloc[1]) if len(st) > 1 else 0.0
        # consistent: far ahead of the next rank, last at most of the ops it joins, and what
        # each waiting rank loses per step is a share of the step that matters
        # the ranks that waited for it (its groups' members, not the whole world)
        who = int(st["rank"].iloc[0])
        waiters = pr.loc[(pr["last_rank"] == who) & (pr["rank"] != who), "rank"].nunique()
        per_waiter = top / n_steps / max(1, waiters)
        if (top >= STRAGGLER_DOMINANCE * second and st["last_arrivals"].iloc[0]
                >= STRAGGLER_LAST_SHARE * max(1, int(st["instances"].iloc[0]))
                and per_waiter >= STRAGGLER_MIN_STEP_SHARE * _step_span(done)
                and per_waiter >= STRAGGLER_MIN_PROFILER_STEP_SHARE * (profiler_step[0] or 0.0)
                and per_waiter > (profiler_step[1] or 0.0)):
            straggler = int(st["rank"].iloc[0])
    return st, straggler


def _step_lengths(traces: TraceSet, comm_patterns=()) -> tuple[float | None, float | None]:
    """The profiler step (µs): ``(median length, spread)`` over the ranks' ``ProfilerStep``
    ranges; the spread is, per rank with three steps or more, the interquartile range of its
    step lengths, the median over those ranks. None where the traces have no such steps. A rank
    that costs each waiting rank less than the spread per step cannot be told from the
    step-to-step variation."""
    lengths, spreads = [], []
    for t in traces.ranks.values():
        steps = summary_of(t, comm_patterns).stored("steps")
        x = float_column(steps, "end_us") - float_column(steps, "start_us")
        x = x[np.isfinite(x) & (x > 0)]
        lengths.extend(x.tolist())
        if len(x) >= 3:
            q1, q3 = np.percentile(x, [25, 75])
            spreads.append(float(q3 - q1))
    return (float(np.median(lengths)) if lengths else None,
            float(np.median(spreads)) if spreads else None)


def _step_span(done: pd.DataFrame) -> float:
    """Median over profiler steps of the time the instances of ``done`` span (first arrival to
    last end, µs on the reference clock): the step as the collectives see it."""
    if done.empty:
        return 0.0
    end = done["first_arrival_us"] + done["arrival_skew_us"] + done["transfer_us"]
    g = pd.DataFrame({"step": done["step"], "lo": done["first_arrival_us"], "hi": end})
    spans = g.groupby("step").agg(lo=("lo", "min"), hi=("hi", "max"))
    return float((spans["hi"] - spans["lo"]).median())


def straggler_noise_note(st: pd.DataFrame, straggler: int | None) -> str | None:
    """A note when waiting was caused but nobody is named because it is spread over the ranks
    (:data:`STRAGGLER_DOMINANCE`); ``st``: :attr:`SyncResult.stragglers`."""
    if straggler is not None or len(st) < 2:
        return None
    top, second = (float(x) for x in st["wait_caused_us"].iloc[:2])
    if top < STRAGGLER_MIN_WAIT_US:
        return None
    return (f"no straggler named: the waiting is spread over the ranks or too small (rank "
            f"{int(st['rank'].iloc[0])} causes {top:.0f} µs, rank {int(st['rank'].iloc[1])} "
            f"{second:.0f} µs; a straggler causes {STRAGGLER_DOMINANCE:g}× the next rank's, at "
            f"least {STRAGGLER_MIN_WAIT_US:g} µs per step, {STRAGGLER_MIN_STEP_SHARE:.0%} of "
            f"the collectives' span and {STRAGGLER_MIN_PROFILER_STEP_SHARE:.1%} of the step per "
            f"waiting rank, more than the step varies, and arrives last at "
            f"{STRAGGLER_LAST_SHARE:.0%} of its ops or more: this is inside the noise)")


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
