"""Collective instances across ranks: which events of the ranks' issued communication ops
(:func:`pardiag.analyzer.analyses.comm_events.comm_events`) are one collective or one
point-to-point transfer.

One collective *instance* is the set of events with the same group and sequence number on every
participant (pardiag's records, a trace's ``Seq``); without them each member's sequence of issued
ops is aligned with the group's longest by op type, bytes and profiler step (records missing at a
window's head or in a step shift nothing; never a positional zip). Sends and receives pair by
group, the two ranks and their per-peer count. Ops whose group is unknown are only matched with
ops of unknown group, split into the cohorts of ranks whose ops end together
(:func:`match_instances`). :func:`matched_events` and :func:`count_instances` turn the matched
events into the instance table :func:`pardiag.analyzer.analyses.sync.compute_sync` builds on.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..per_rank.comm_events import unnamed_group_unit
from ..per_rank.op_semantics import P2P_OPS, semantics
from . import instance_keys
from .clocks import theil_sen
from .comm_events import AMBIGUOUS_GROUP


def match_instances(events: pd.DataFrame) -> pd.DataFrame:
    """Add an ``instance`` key to every event (None where it cannot be matched).

    * Collectives: a group is its ranks (``group``), or its name where the trace does not give
      the ranks. Where every event of a group carries the group's own sequence number
      (``native_seq``: records, a trace's ``Seq``), the key is ``"<group>:<seq>"``, so ranks whose
      windows start at different collectives still match. Otherwise each member's sequence of
      issued ops is aligned with the longest one of the group (:func:`_align`) by op type, bytes
      and profiler step, per profiling window: records missing at a window's head, or a step's,
      shift nothing.
    * Point-to-point: ``"p2p:<group>:<a>><b>:<k>"`` for the k-th transfer from rank a to rank b,
      send and recv alike. A send/recv whose peer is unknown gets None: it is never matched
      as a group collective.
    * A group the trace does not give the ranks of (only a name, or nothing) is taken to be
      the ranks whose ops of it end together (:func:`_cohorts`); where they fall apart into
      several such cohorts (independent replicas, engines that no collective joins), each is a
      group of its own (``cohort``: its ranks, ``"0,1"``; ``group_size`` its size), never
      joined with another.
    """
    ev = events.copy()
    if "group" not in ev:
        ev["group"] = ""
    if "native_seq" not in ev:
        ev["native_seq"] = ev["source"].eq("records")
    gid = np.where(ev["group"].astype(str) != "", "g" + ev["group"].astype(str),
                   "pg" + ev["pg"].astype(str))
    # no group named: each op type is a unit of its own (the ranks' per-type numbering)
    unit = unnamed_group_unit(ev)
    ev["_gid"] = np.where(unit != "", gid + "~" + unit, gid)
    ev["cohort"] = ""
    ambiguous = (ev["group"].astype(str) == AMBIGUOUS_GROUP).to_numpy()
    unknown = (ev["group"].astype(str) == "").to_numpy() & ~ev["op"].isin(P2P_OPS).to_numpy()
    p2p = (ev["op"].isin(["send", "recv"]).to_numpy() & ev["peer"].notna().to_numpy())
    p2p_keys = _p2p_keys(ev[p2p]) if p2p.any() else None
    clocks = _p2p_clock_lines(ev[p2p], p2p_keys) if p2p.any() and unknown.any() else {}
    lone = ev["op"].isin(["send", "recv"]).to_numpy() & ev["peer"].isna().to_numpy()
    if lone.any() and unknown.any():
        clocks = {**_lockstep_clocks(ev[lone]), **clocks}
    for g, idx in ev[unknown].groupby("_gid").indices.items():
        rows = ev.index[unknown][idx]
        cohorts = _cohorts(ev.loc[rows], clocks)
        # ranks whose ops end with nobody else's say nothing of their group (its other members
        # may have no trace): only cohorts of two or more are groups of their own
        if len(cohorts) > 1 and max(len(c) for c in cohorts) > 1:
            of = {r: ",".join(map(str, c)) for c in cohorts for r in c}
            name = ev.loc[rows, "rank"].map(of)
            ev.loc[rows, "cohort"] = name
            ev.loc[rows, "_gid"] = g + "#" + name
            size = name.str.count(",") + 1
            ev.loc[rows, "group_size"] = size.where(size > 1, ev.loc[rows, "group_size"])
    coll = ~ev["op"].isin(P2P_OPS).to_numpy() & ~ambiguous
    key = pd.Series([None] * len(ev), index=ev.index, dtype=object)
    how = pd.Series([None] * len(ev), index=ev.index, dtype=object)
    sub = ev[coll]
    if len(sub):
        native = sub.groupby("_gid")["native_seq"].transform("all").astype(bool)
        # a sequence number that repeats on a rank (ops of one coalescing block, a constant)
        # identifies nothing: that group is aligned instead
        dup = sub.duplicated(["rank", "_gid", "seq"], keep=False)
        native &= ~dup.groupby(sub["_gid"]).transform("any").astype(bool)
        nat = sub[native]
        key.loc[nat.index] = nat["_gid"] + ":" + nat["seq"].astype(int).astype(str)
        how.loc[nat.index] = "seq"
        rest = sub[~native]
        if len(rest):
            key.loc[rest.index] = _aligned_keys(rest)
            how.loc[rest.index] = "order"
    if p2p_keys is not None:
        key.loc[p2p_keys.index] = p2p_keys
        how.loc[p2p_keys.index] = "pair"
    ev["instance"] = key
    ev["matched"] = how
    return ev.drop(columns="_gid")


def _p2p_keys(sub: pd.DataFrame) -> pd.Series:
    """Instance keys of sends and receives whose peer is known (``sub``: their events, with
    ``_gid``): ``"p2p:<group>:<a>><b>:<k>"``, the k-th transfer from rank a to rank b (a
    trace's ``seq``, which counts the transfers it lost, else the events' order)."""
    src = np.where(sub["op"] == "send", sub["rank"], sub["peer"]).astype(int)
    dst = np.where(sub["op"] == "send", sub["peer"], sub["rank"]).astype(int)
    tmp = sub.assign(src=src, dst=dst)
    nth = tmp.groupby(["rank", "_gid", "src", "dst"]).cumcount() + 1
    # a trace's own count (:func:`pardiag.analyzer.per_rank.comm_events.events_from_trace`)
    # counts the transfers whose kernels the trace lost, so the ones after still pair
    if "seq" in tmp and "source" in tmp:
        seq = pd.to_numeric(tmp["seq"], errors="coerce")
        nth = nth.where(~(tmp["source"].eq("trace") & (seq > 0)), seq).astype(int)
    return instance_keys.p2p_keys(tmp["_gid"].str[1:], tmp["src"], tmp["dst"],
                                  _aligned_receives(tmp, nth))


def _aligned_receives(tmp: pd.DataFrame, nth: pd.Series) -> pd.Series:
    """``nth`` (each side's count of its transfers between two ranks, gaps where a trace lost
    some) with the receiver's shifted onto the sender's by :func:`_align` of the two sides'
    bytes and ends (a send and its receive end together): a receiver whose window began an
    iteration after its sender's pairs its first receive with the sender's second iteration's
    send, not with its first (which implied a clock offset of a whole iteration)."""
    out = nth.copy()
    nbytes = pd.to_numeric(tmp["bytes"], errors="coerce").fillna(-1).to_numpy()
    ends = tmp["end_us"].to_numpy(dtype=float)
    sends = (tmp["rank"] == tmp["src"]).to_numpy()
    k = nth.to_numpy(dtype=np.int64)
    steps = (pd.to_numeric(tmp["step"], errors="coerce").fillna(-1).to_numpy(dtype=np.int64)
             if "step" in tmp else np.full(len(tmp), -1, dtype=np.int64))
    codes = pd.factorize(nbytes)[0]
    groups = pd.DataFrame({"g": tmp["_gid"].to_numpy(), "s": tmp["src"].to_numpy(),
                           "d": tmp["dst"].to_numpy()}).groupby(["g", "s", "d"]).indices
    for idx in groups.values():
        sent, got = idx[sends[idx]], idx[~sends[idx]]
        if len(sent) < 2 or len(got) < 2:
            continue
        lo = int(k[idx].min())
        laid = []
        for rows in (got, sent):   # each side by its count: a lost transfer is a gap
            a = np.full(int(k[rows].max()) - lo + 1, -1, dtype=np.int64)
            e = np.full(len(a), np.nan)
            a[k[rows] - lo], e[k[rows] - lo] = codes[rows], ends[rows]
            laid.append((a, e))
        by_step = _step_shift(k, steps, got, sent)
        d = (by_step if by_step is not None and _ends_together(laid[0][1], laid[1][1], by_step)
             else _align(laid[0][0], laid[1][0], laid[0][1], laid[1][1]))
        if d and _ends_together(laid[0][1], laid[1][1], d):
            out.iloc[got] = k[got] + d
    return out


def _step_shift(k: np.ndarray, steps: np.ndarray, got: np.ndarray, sent: np.ndarray
                ) -> int | None:
    """The shift (in transfers) that pairs each receive with the send of the same profiler
    step and place in it (``k``: each transfer's count on its side; ``steps``: its profiler
    step, -1 outside every step), where every transfer of both sides lies in a step and the
    steps both sides recorded hold as many transfers on each; else None. A window that began
    an iteration later on one side shows in its step numbers, which the k-th send paired with
    the k-th receive would take for a clock offset of an iteration (where a rank's steps are
    numbered as its collectives' are: :func:`_aligned_keys`)."""
    sg, ss = steps[got], steps[sent]
    if (sg < 0).any() or (ss < 0).any():
        return None
    common = np.intersect1d(sg, ss)
    if not len(common) or any(int((sg == x).sum()) != int((ss == x).sum()) for x in common):
        return None
    first = common[0]
    return int(k[sent][ss == first].min() - k[got][sg == first].min())


def _ends_together(a_end: np.ndarray, b_end: np.ndarray, d: int) -> bool:
    """Whether the ends ``a_end[i]`` and ``b_end[i + d]`` keep one difference (median absolute
    deviation at most :data:`SAME_CLOCK_SPREAD_US`): NCCL completes a send and its receive
    together, while gloo's send ends when its buffer is handed off, and such ends say nothing
    of which transfers pair (:data:`P2P_CLOCK_SHARE`)."""
    lo, hi = max(0, -d), min(len(a_end), len(b_end) - d)
    diff = a_end[lo:hi] - b_end[lo + d:hi + d]
    diff = diff[np.isfinite(diff)]
    return bool(len(diff)) and float(np.median(np.abs(diff - np.median(diff)))) <= \
        SAME_CLOCK_SPREAD_US


#: Two ranks' ops of a group the trace does not name are one group's when, aligned, most of their
#: ends keep one difference (a clock offset, slowly drifting) to within this (µs): the members of a
#: collective leave it together, ranks that no collective joins do not.
COHORT_TOL_US = 10.0
#: ... at this share of the aligned ops or more (the rest may be ops of another group that the
#: trace does not tell apart).
COHORT_SHARE = 0.5
#: Fewer aligned ops than this decide nothing (the ranks stay one group).
COHORT_MIN_OPS = 3
#: A difference of ends that changes faster than this (µs per s) is no clock drift (Kineto's
#: drifts are tens of µs per s: :data:`pardiag.analyzer.analyses.clocks.MAX_DRIFT_US_PER_S`):
#: the ranks run on their own.
COHORT_MAX_DRIFT_US_PER_S = 1000.0


def _signature(ev: pd.DataFrame) -> pd.Series:
    """What must agree for two members' ops to be one collective: the op type and, where the
    trace gives them, its bytes (``"all_reduce/4096"``, ``"all_reduce/"``)."""
    nbytes = pd.to_numeric(ev["bytes"], errors="coerce")
    return pd.Series([f"{o}/{'' if pd.isna(b) else int(b)}" for o, b in
                      zip(ev["op"].astype(object), nbytes)], index=ev.index, dtype=object)


#: A pair of ranks' transfers give their clocks' difference (:func:`_p2p_clock_lines`) when at
#: least this share of them end within :data:`COHORT_TOL_US` of one line: a send and its receive
#: end together where the transport completes both at once (NCCL); where a send completes when
#: its buffer is handed off (gloo), the ends scatter and say nothing of the clocks.
P2P_CLOCK_SHARE = 0.9


def _p2p_clock_lines(sub: pd.DataFrame, keys: pd.Series) -> dict[tuple[int, int], tuple]:
    """The clocks' difference of each pair of ranks that exchange transfers, from their ends
    (``sub``: the sends and receives whose peer is known; ``keys``: their instance keys).

    Returns:
        ``{(a, b): (t_ref_us, offset_us, slope_us_per_s)}`` for both orders of each pair whose
        transfers, at least :data:`COHORT_MIN_OPS` of them, end together to within
        :data:`COHORT_TOL_US` of one line (at least :data:`P2P_CLOCK_SHARE` of them; a drift of
        at most :data:`COHORT_MAX_DRIFT_US_PER_S`, Theil–Sen as :func:`_end_together` fits):
        ``end_a − end_b ≈ offset_us + slope_us_per_s · (end_a − t_ref_us) / 1e6``."""
    both = pd.DataFrame({"key": keys.to_numpy(), "rank": sub["rank"].astype(int).to_numpy(),
                         "end": sub["end_us"].to_numpy(dtype=float)})
    both = both[both.groupby("key")["rank"].transform("size").eq(2)]
    both = both.sort_values(["key", "rank"], kind="stable")
    a, b = both.iloc[0::2], both.iloc[1::2]
    if a.empty:
        return {}
    pairs = pd.DataFrame({"a": a["rank"].to_numpy(), "b": b["rank"].to_numpy(),
                          "t": a["end"].to_numpy(), "d": a["end"].to_numpy() - b["end"].to_numpy()})
    pairs = pairs[pairs["a"] != pairs["b"]]
    out: dict[tuple[int, int], tuple] = {}
    for (ra, rb), idx in pairs.groupby(["a", "b"]).indices.items():
        t = pairs["t"].to_numpy()[idx]
        d = pairs["d"].to_numpy()[idx]
        ok = np.isfinite(t) & np.isfinite(d)
        t, d = t[ok], d[ok]
        if len(t) < COHORT_MIN_OPS:
            continue
        order = np.argsort(t, kind="stable")
        t, d = t[order], d[order]
        ts = (t - t[0]) / 1e6
        if (slope := _drift(ts, d)) is None:
            continue
        offset = float(np.median(d - slope * ts))
        if np.mean(np.abs(d - slope * ts - offset) <= COHORT_TOL_US) < P2P_CLOCK_SHARE:
            continue
        out[(int(ra), int(rb))] = (float(t[0]), offset, float(slope))
        out[(int(rb), int(ra))] = (float(t[0]) - offset, -offset, -float(slope))
    return out


#: Sends and receives whose peer is unknown give two ranks one clock (:func:`_lockstep_clocks`)
#: when at least this many of them, and :data:`LOCKSTEP_SHARE` of the fewer of the two ranks',
#: end within :data:`COHORT_TOL_US` of an op of the other kind on the other rank.
LOCKSTEP_MIN_OPS = 10
LOCKSTEP_SHARE = 0.5


def _lockstep_clocks(sub: pd.DataFrame) -> dict[tuple[int, int], tuple]:
    """One clock for two ranks whose sends and receives, their peers unknown and not paired
    (transfers in lockstep end together on several pairs of ranks, so each has several
    candidates), end with ops of the other kind on the other rank all the same: at least
    :data:`LOCKSTEP_MIN_OPS` of them and :data:`LOCKSTEP_SHARE` of the fewer of the two ranks'
    end within :data:`COHORT_TOL_US` of one (``sub``: those ops' events). Whichever of the
    candidates each transfer's peer is, its two sides end together on one clock, so the ranks'
    clocks agree to within that tolerance; ends that kept another difference (an offset, other
    hosts) would not coincide op after op.

    Returns:
        ``{(a, b): (t_ref_us, 0.0, 0.0)}`` for both orders of each such pair, as
        :func:`_p2p_clock_lines` returns lines."""
    out: dict[tuple[int, int], tuple] = {}
    ends = {(int(r), str(op)): np.sort(g.to_numpy(dtype=float))
            for (r, op), g in sub.groupby(["rank", "op"])["end_us"]}
    ranks = sorted({r for r, _ in ends})
    counts = {r: sum(len(v) for (q, _), v in ends.items() if q == r) for r in ranks}
    for i, a in enumerate(ranks):
        for b in ranks[i + 1:]:
            hits = 0
            for op_a, op_b in (("send", "recv"), ("recv", "send")):
                x, y = ends.get((a, op_a)), ends.get((b, op_b))
                if x is None or y is None or not len(x) or not len(y):
                    continue
                j = np.clip(np.searchsorted(y, x), 1, len(y) - 1) if len(y) > 1 else np.zeros(
                    len(x), dtype=int)
                near = np.minimum(np.abs(x - y[j]), np.abs(x - y[np.maximum(j - 1, 0)]))
                hits += int((near <= COHORT_TOL_US).sum())
            if hits >= LOCKSTEP_MIN_OPS and hits >= LOCKSTEP_SHARE * min(counts[a], counts[b]):
                t0 = float(min(float(v[0]) for (q, _), v in ends.items() if q == a and len(v)))
                out[(a, b)] = (t0, 0.0, 0.0)
                out[(b, a)] = (t0, 0.0, 0.0)
    return out


def _cohorts(sub: pd.DataFrame, clocks: dict | None = None) -> list[list[int]]:
    """The ranks of one unnamed group's events (``sub``: :data:`comm_events.EVENT_COLUMNS`) split
    into cohorts whose ops end together (:func:`_end_together`); lists of ranks, in rank order.

    Each rank is compared with a member of each cohort: one whose clock difference to it its
    transfers give (``clocks``: :func:`_p2p_clock_lines`), whose ends must then keep that
    difference; else the cohort's first rank, whose ends may keep any one difference (a clock
    offset the traces do not give)."""
    clocks = clocks or {}
    sub = sub.sort_values(["window", "seq"], kind="stable")
    # one signature code per op for the whole group (equal codes: equal signatures), and each
    # rank's rows by position: no sub-table and no factorization per rank or per pair
    codes = pd.factorize(_signature(sub))[0]
    window = sub["window"].to_numpy()
    seq = sub["seq"].to_numpy(dtype=np.int64)
    end = sub["end_us"].to_numpy(dtype=float)
    seqs = {}
    for r, idx in sorted(sub.groupby("rank").indices.items()):
        idx = idx[window[idx] == window[idx].min()]
        seqs[int(r)] = (codes[idx], seq[idx], end[idx])
    cohorts: list[list[int]] = []
    members: list[set[int]] = []   # each cohort's ranks as a set
    # per rank, the ranks whose clock difference to it is known, ascending: a cohort's first
    # such member (its members join in rank order) without a scan of the cohort
    partners: dict[int, list[int]] = {}
    for q, r in sorted(clocks):
        partners.setdefault(r, []).append(q)

    def joins(i: int, r: int) -> bool:
        m = next((q for q in partners.get(r, ()) if q in members[i]), None)
        return (_end_together(seqs[m], seqs[r], clocks[(m, r)]) if m is not None
                else _end_together(seqs[cohorts[i][0]], seqs[r]))

    for r in sorted(seqs):
        home = next((i for i in range(len(cohorts)) if joins(i, r)), None)
        if home is None:
            cohorts.append([r])
            members.append({r})
        else:
            cohorts[home].append(r)
            members[home].add(r)
    return cohorts


def _drift(ts: np.ndarray, d: np.ndarray) -> float | None:
    """The drift (µs per s) of two clocks' differences ``d`` (µs) over times ``ts`` (s from the
    first, ascending): the Theil–Sen slope of at most 200 evenly picked points, as the clock
    model fits; 0 when it moves the difference by at most :data:`COHORT_TOL_US` over the whole
    span (µs of jitter over ms read as thousands of µs per s, not as two clocks); None when no
    slope is found or it exceeds :data:`COHORT_MAX_DRIFT_US_PER_S` (no clock drifts so fast:
    the ranks run on their own)."""
    span = float(np.ptp(ts)) if len(ts) else 0.0
    if span <= 0:
        return 0.0
    pick = np.linspace(0, len(ts) - 1, min(len(ts), 200)).astype(int)
    slope = theil_sen(ts[pick], d[pick])[0]
    if not np.isfinite(slope):
        return None
    if abs(slope) * span <= COHORT_TOL_US:
        return 0.0
    return None if abs(slope) > COHORT_MAX_DRIFT_US_PER_S else float(slope)


def _end_together(a, b, known: tuple | None = None) -> bool:
    """Whether two ranks' ops (``(signature codes, positions, ends)``) are one group's: aligned
    (:func:`_align`), the differences of the ends of pairs with one signature lie on a line in
    time (one offset, a drift of at most :data:`COHORT_MAX_DRIFT_US_PER_S`; Theil–Sen, as the
    clock model fits) to within :data:`COHORT_TOL_US` for at least :data:`COHORT_SHARE` of them;
    True with fewer than :data:`COHORT_MIN_OPS` such pairs. A drift that changes the difference
    by at most :data:`COHORT_TOL_US` over the pairs' whole span is not told from noise: the
    offset alone is fitted. With ``known`` (``(t_ref_us, offset_us, slope_us_per_s)``: the
    clocks' difference the two ranks' transfers give, :func:`_p2p_clock_lines`), the
    differences must lie on that line instead: ops that end a constant time apart on one clock
    are two groups', not one group's on two clocks."""
    ca, cb = a[0], b[0]
    base = min(int(a[1].min()), int(b[1].min()))
    la = _laid_out(np.arange(len(ca)), a[1], ca, a[2], base)
    lb = _laid_out(np.arange(len(cb)), b[1], cb, b[2], base)
    d = _align(la[0], lb[0], la[1], lb[1])
    n, m = len(la[0]), len(lb[0])
    lo, hi = max(0, -d), min(n, m - d)
    if hi - lo < COHORT_MIN_OPS:
        return True
    same = (la[0][lo:hi] == lb[0][lo + d:hi + d]) & (la[0][lo:hi] >= 0)
    t = la[1][lo:hi][same]
    diff = t - lb[1][lo + d:hi + d][same]
    ok = np.isfinite(diff)
    t, diff = t[ok], diff[ok]
    if len(diff) < COHORT_MIN_OPS:
        return True
    if known is not None:
        t_ref, offset, drift = known
        resid = diff - offset - drift * (t - t_ref) / 1e6
        return float(np.mean(np.abs(resid) <= COHORT_TOL_US)) >= COHORT_SHARE
    ts = (t - t[0]) / 1e6
    if (slope := _drift(ts, diff)) is None:
        return False
    resid = diff - slope * ts
    resid -= np.median(resid)
    return float(np.mean(np.abs(resid) <= COHORT_TOL_US)) >= COHORT_SHARE


def _aligned_keys(rest: pd.DataFrame) -> pd.Series:
    """Instance keys of collectives without usable sequence numbers: per group (``_gid``) and
    profiling window, and per profiler step where every event of the unit has one, each member's
    ops in their order (``seq``: positions among the ops it issued) aligned with the member that
    has the most (:func:`_align`); ``"<gid>:w<window>:s<step>:<position in that member>"``."""
    rest = rest.sort_values(["rank", "seq"], kind="stable")
    win = rest["window"].astype(int) if "window" in rest else pd.Series(0, index=rest.index)
    step = rest["step"].astype(int) if "step" in rest else pd.Series(-1, index=rest.index)
    unit_has_steps = (step >= 0).groupby([rest["_gid"], win]).transform("all")
    step = step.where(unit_has_steps, -1)
    sig = _signature(rest).to_numpy()
    codes = pd.factorize(sig)[0]
    ends = rest["end_us"].to_numpy(dtype=float)
    ranks = rest["rank"].to_numpy()
    out = np.empty(len(rest), dtype=object)
    units = pd.DataFrame({"g": rest["_gid"].to_numpy(), "w": win.to_numpy(),
                          "s": step.to_numpy(), "r": ranks}).groupby(["g", "w", "s"]).indices
    seqs = rest["seq"].to_numpy(dtype=np.int64)
    for (g, w, st), idx in units.items():
        by_rank: dict = {}
        for i in idx.tolist():
            by_rank.setdefault(ranks[i], []).append(i)
        # each member's ops laid out by their place in its issue order: an op whose kernels
        # were lost is a gap (-1) that matches nothing
        base = int(seqs[idx].min())
        laid = {r: _laid_out(np.array(rows), seqs, codes, ends, base)
                for r, rows in by_rank.items()}
        ref = max(sorted(laid), key=lambda r: int((laid[r][0] >= 0).sum()))
        for r, rows in by_rank.items():
            a, a_end, pos = laid[r]
            d = 0 if r == ref else _align(a, laid[ref][0], a_end, laid[ref][1])
            for k, i in zip(pos.tolist(), rows):
                out[i] = f"{g}:w{w}:s{st}:{k + d}"
    return pd.Series(out, index=rest.index).reindex(rest.index)


def _laid_out(rows: np.ndarray, seqs: np.ndarray, codes: np.ndarray, ends: np.ndarray,
              base: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(codes, ends, positions)`` of one member's ops in a unit, indexed by position in its
    issue order counted from ``base`` (the unit's first position over all its members, so that
    members whose first ops were lost still line up; default: this member's first; gaps: code
    -1, end NaN)."""
    s = seqs[rows]
    if len(np.unique(s)) < len(s):  # a repeated (unusable) sequence number: issue order
        s, base = np.arange(len(s)), 0
    pos = s - (s.min() if base is None else min(int(base), int(s.min())))
    a = np.full(int(pos.max()) + 1, -1, dtype=np.int64)
    e = np.full(len(a), np.nan)
    a[pos] = codes[rows]
    e[pos] = ends[rows]
    return a, e, pos


#: A clock offset from aligning two ranks' ops that is at least this (µs) is not taken where a
#: shift with a tenth of it agrees as well (:func:`_align`): hosts' wall clocks are kept within
#: milliseconds (NTP), while repeating iterations agree at any whole number of them.
IMPLAUSIBLE_OFFSET_US = 10_000.0
#: Ends this consistent (median absolute deviation, µs) count as one clock's for that choice.
SAME_CLOCK_SPREAD_US = 50.0


def _align(a: np.ndarray, b: np.ndarray, a_end: np.ndarray, b_end: np.ndarray) -> int:
    """The shift ``d`` that pairs op ``i`` of one member with op ``i + d`` of the reference.

    ``a``, ``b``: signature codes (op type and bytes) of the two sequences in issue order;
    ``a_end``, ``b_end``: their end times (µs, each on its own clock). The shift with the most
    equal signatures wins — a member whose records begin late or end early matches the
    reference's middle, never by position alone; between shifts that match as many, the one
    whose end-time differences are most constant (smallest median absolute deviation: members
    leave a collective together, so on any two clocks the differences are one offset), then the
    smallest ``|d|``. A winner whose ends imply a clock offset of :data:`IMPLAUSIBLE_OFFSET_US`
    or more gives way to a shift that matches as many of the ops the two share (at most
    ``|d − d'|`` fewer), with ends as constant and a tenth of that offset (see the body)."""
    n, m = len(a), len(b)
    if n == m and np.array_equal(a, b) and (a >= 0).all():
        d0 = a_end - b_end
        d0 = d0[np.isfinite(d0)]
        if not len(d0) or abs(float(np.median(d0))) < IMPLAUSIBLE_OFFSET_US:
            return 0
    fits: list[tuple[tuple[int, float, int], int, float]] = []
    for d in range(-(n - 1), m):
        lo, hi = max(0, -d), min(n, m - d)
        if hi <= lo:
            continue
        same = (a[lo:hi] == b[lo + d:hi + d]) & (a[lo:hi] >= 0)
        hits = int(same.sum())
        if hits == 0:
            continue
        diff = a_end[lo:hi][same] - b_end[lo + d:hi + d][same]
        diff = diff[np.isfinite(diff)]
        spread = float(np.median(np.abs(diff - np.median(diff)))) if len(diff) else np.inf
        fits.append(((-hits, spread, abs(d)), d, float(np.median(diff)) if len(diff)
                     else np.nan))
    if not fits:
        return 0
    best = min(fits)
    # Repeating ops (the same iteration over and over) agree at every shift by whole
    # iterations; the most agreeing one pairs the ranks' k-th ops, which for a rank whose
    # window began an iteration later implies a clock offset of whole iterations. Wall clocks
    # are kept within milliseconds of each other: a shift that agrees as well on what the two
    # share, with its ends as consistent and a clock offset a tenth of the other's, is the one.
    (neg_hits, spread, _), d0, off = best
    if np.isfinite(off) and abs(off) >= IMPLAUSIBLE_OFFSET_US:
        near = [f for f in fits
                if np.isfinite(f[2]) and abs(f[2]) <= 0.1 * abs(off)
                and -f[0][0] >= -neg_hits - abs(f[1] - d0)
                and f[0][1] <= max(2 * spread, SAME_CLOCK_SPREAD_US)]
        if near:
            best = min(near)
    return best[1]


def matched_events(ev: pd.DataFrame) -> tuple[pd.DataFrame, str, list[str]]:
    """Match the communication events (:data:`EVENT_COLUMNS`) into instances
    (:func:`match_instances`).

    Returns:
        (the matched events, ``instance`` and ``matched`` added, without the point-to-point ops
        whose peer is unknown; :attr:`.sync.SyncResult.matched_by`; a note when such ops were left
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
    split = sorted(set(ev.loc[ev["cohort"] != "", "cohort"]), key=lambda c: int(c.split(",")[0]))
    if split:
        notes.append(f"the traces do not say which group {len(split)} set(s) of ranks "
                     f"communicate in, and their ops never end together: taken as separate "
                     f"groups ({'; '.join('ranks ' + c for c in split[:6])}"
                     f"{'; ...' if len(split) > 6 else ''}) that no collective joins")
    unpaired = ev["instance"].isna()
    ambiguous = ev["group"].astype(str) == AMBIGUOUS_GROUP
    if (unpaired & ~ambiguous).any():
        notes.append(f"{int((unpaired & ~ambiguous).sum())} point-to-point op(s) without a known "
                     f"peer were not paired (never matched as a group collective)")
    if ambiguous.any():
        ops = ev.loc[ambiguous, "op"].value_counts()
        notes.append(f"{int(ambiguous.sum())} collective op(s) "
                     f"({', '.join(f'{n} {o}' for o, n in ops.items())}) were not matched: the "
                     f"traces do not give their group, and on this mesh it is not the world "
                     f"(functional reductions of a few bytes — the loss, gradient norms — may "
                     f"run over any of its dimensions)")
    return ev[~unpaired].copy(), matched_by, notes


def count_instances(ev: pd.DataFrame, present: set[int]
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
        "root": g["root"].first() if "root" in ev else None,
    })
    inst["semantics"] = inst["op"].map(semantics)
    p2p = instance_keys.is_p2p(inst.index.to_series())
    members = inst["group"].map(lambda k: [int(x) for x in k.split("|")[0].split(",")] if k
                                else None)
    expected = inst["group_size"].astype(float)
    expected = expected.where(expected.notna(), members.map(lambda m: len(m) if m else np.nan))
    expected = expected.fillna(float(len(present)))
    expected[p2p] = 2.0
    inst["expected"] = expected.astype(int)
    inst["complete"] = inst["ranks"] == inst["expected"]
    over = inst[inst["ranks"] > inst["expected"]]
    if len(over):
        notes.append(f"{len(over)} instance(s) hold more ranks than their group has (a group "
                     f"matched by a name that ranks reuse for different groups?): not used for "
                     f"clock offsets, stragglers or bandwidth")
    n_multi = int((inst["ranks"] > 1).sum())
    partial = inst[(inst["ranks"] < inst["expected"]) & ~p2p]
    if len(partial):
        absent = sorted({r for m in members[partial.index].dropna() for r in m} - present)
        notes.append(f"{len(partial)} of {int((~p2p).sum())} collective instance(s) lack "
                     f"members" + (f" (ranks {absent[:8]}{'...' if len(absent) > 8 else ''} have "
                                   f"no trace)" if absent else "")
                     + ": not used for clock offsets, stragglers or bandwidth")
    lone = inst[(inst["ranks"] < inst["expected"]) & p2p]
    if len(lone):
        notes.append(f"{len(lone)} point-to-point transfer(s) have only one side in the traces")
    return inst, notes, n_multi


#: A send and its receive end together (the transfer's completion) to within this (µs) on one
#: clock, as a collective's members do (:data:`COHORT_TOL_US`).
P2P_END_TOL_US = COHORT_TOL_US
#: Peers found by ends stand only when at least this share of the sends and receives whose peer
#: the traces do not give find theirs: clocks that differ (other hosts) or transfers that end in
#: lockstep leave most unpaired, and then none is paired.
P2P_END_SHARE = 0.9
#: Of two receives of established pairs that end with a send, the nearer pairs with it when it
#: ends at most this share as far from the send as the other (stages in lockstep: the next
#: stage's receive ends together with the send, another's a few µs off).
P2P_NEAREST_SHARE = 0.5
#: ... and the other ends at least this much (µs) farther from it (ends that differ by less are
#: together, as far as timestamps tell).
P2P_NEAREST_MIN_US = 1.0


def _pair_by_elimination(cand: dict[int, list[int]], src: dict[int, int], s_end: dict[int, float],
                         r_rank: np.ndarray, r_end: np.ndarray) -> dict[int, int]:
    """``{send: receive}`` from each send's candidate receives (``cand``; ``src`` and ``s_end``:
    the sending rank and the send's end; ``r_rank``, ``r_end``: each receive's rank and end, µs).
    An op whose candidates on the other side are down to one takes it, and that one is no one
    else's candidate any more (a receive is one send's). When none is down to one, a send takes
    the one candidate whose pair of ranks a pairing so far established (ranks that exchange in
    lockstep end together); failing that, of the candidates of established pairs, the one that
    ends nearest to it (:func:`_nearest`: nearer by half and by :data:`P2P_NEAREST_MIN_US`);
    and elimination goes on.
    A send and a receive that are each the other's only candidate pair; so do a send on a
    rank whose batched send and receive end together with another rank's (stage 1 sends on
    to stage 2 while it receives from stage 0): once rank 1's send has taken rank 2's receive,
    rank 0's send has rank 1's receive left."""
    r_cand: dict[int, set[int]] = {}
    for i, js in cand.items():
        for j in js:
            r_cand.setdefault(j, set()).add(i)
    s_cand = {i: set(js) for i, js in cand.items() if js}
    match: dict[int, int] = {}

    def take(i: int, j: int, queue: list) -> None:
        match[i] = j
        for j2 in s_cand.pop(i, set()) - {j}:
            r_cand[j2].discard(i)
            if len(r_cand[j2]) == 1:
                queue.append(("r", j2))
        for i2 in r_cand.pop(j, set()) - {i}:
            s_cand[i2].discard(j)
            if len(s_cand[i2]) == 1:
                queue.append(("s", i2))

    def settle(queue: list) -> None:
        while queue:
            side, k = queue.pop()
            if side == "s" and len(s_cand.get(k, ())) == 1:
                take(k, next(iter(s_cand[k])), queue)
            elif side == "r" and len(r_cand.get(k, ())) == 1:
                take(next(iter(r_cand[k])), k, queue)

    settle([("s", i) for i, js in s_cand.items() if len(js) == 1]
           + [("r", j) for j, is_ in r_cand.items() if len(is_) == 1])
    while s_cand:
        pairs = {(src[i], int(r_rank[j])) for i, j in match.items()}
        fit = {i: [j for j in js if (src[i], int(r_rank[j])) in pairs]
               for i, js in s_cand.items()}
        found = [(i, js[0]) for i, js in sorted(fit.items()) if len(js) == 1]
        if not found:
            near = {i: _nearest(js, s_end[i], r_end) for i, js in sorted(fit.items())}
            found = [(i, j) for i, j in near.items() if j is not None]
        if not found:
            break
        queue: list = []
        for i, j in found:
            if j in s_cand.get(i, ()):
                take(i, j, queue)
        settle(queue)
    return match


def _nearest(js: list[int], end: float, r_end: np.ndarray) -> int | None:
    """Of the receives ``js``, the one that ends nearest to ``end`` (µs), when the next nearest
    ends at least 1/:data:`P2P_NEAREST_SHARE` as far from it and :data:`P2P_NEAREST_MIN_US`
    farther; else None."""
    if len(js) < 2:
        return js[0] if js else None
    gaps = sorted((abs(float(r_end[j]) - end), j) for j in js)
    near, far = gaps[0][0], gaps[1][0]
    return gaps[0][1] if (near <= P2P_NEAREST_SHARE * far
                          and far - near >= P2P_NEAREST_MIN_US) else None


def peers_by_ends(ev: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """Fill the ``peer`` of the sends and receives the traces give none for (no record, no
    ``Src``/``Dst Rank``), from when they end: a send and its receive complete together.

    A send pairs with the receive on another rank that ends within :data:`P2P_END_TOL_US` of
    it, of the same size where both sizes are known, by elimination
    (:func:`_pair_by_elimination`): an op whose candidates are down to one takes it; one with
    several takes the one whose pair of ranks the pairings so far established (ranks that
    exchange in lockstep end together). The k-th send from rank a to
    rank b must then meet the k-th receive of b from a (NCCL delivers a pair's transfers in
    order). Peers are filled only when :data:`P2P_END_SHARE` of the unknown ops are paired so
    and every pair keeps that order; otherwise none is, and the ops stay unpaired.

    Returns:
        (``ev`` with the peers filled, a note of how many were paired so; None when none was).
    """
    unk = ev["op"].isin(["send", "recv"]).to_numpy() & ev["peer"].isna().to_numpy()
    if not unk.any():
        return ev, None
    sends = ev[unk & (ev["op"] == "send").to_numpy()]
    recvs = ev[unk & (ev["op"] == "recv").to_numpy()]
    if sends.empty or recvs.empty:
        return ev, None
    r_end = recvs["end_us"].to_numpy(dtype=float)
    order = np.argsort(r_end, kind="stable")
    r_end, r_idx = r_end[order], recvs.index.to_numpy()[order]
    r_rank = recvs["rank"].to_numpy()[order]
    r_bytes = recvs["bytes"].to_numpy()[order]

    lo = np.searchsorted(r_end, sends["end_us"].to_numpy(float) - P2P_END_TOL_US, side="left")
    hi = np.searchsorted(r_end, sends["end_us"].to_numpy(float) + P2P_END_TOL_US, side="right")

    def fits(rank, size, j: int) -> bool:   # another rank's receive, of the size if both known
        return r_rank[j] != rank and (pd.isna(size) or pd.isna(r_bytes[j])
                                      or int(size) == int(r_bytes[j]))

    cand = {i: [j for j in range(a, b) if fits(rank, size, j)]
            for i, rank, size, a, b in zip(sends.index, sends["rank"], sends["bytes"], lo, hi)}
    match = _pair_by_elimination(cand, dict(zip(sends.index, sends["rank"].astype(int))),
                                 dict(zip(sends.index, sends["end_us"].astype(float))),
                                 r_rank, r_end)
    if 2 * len(match) < P2P_END_SHARE * int(unk.sum()):
        return ev, None
    # each pair's transfers in order: its k-th send meets its k-th receive
    by_pair: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for i, j in match.items():
        key = (int(ev.at[i, "rank"]), int(r_rank[j]))
        by_pair.setdefault(key, []).append((float(ev.at[i, "start_us"]), float(
            ev.at[r_idx[j], "start_us"])))
    for rows in by_pair.values():
        recv_starts = [b for _, b in sorted(rows)]
        if recv_starts != sorted(recv_starts):
            return ev, None
    ev = ev.copy()
    for i, j in match.items():
        ev.at[i, "peer"] = int(r_rank[j])
        ev.at[r_idx[j], "peer"] = int(ev.at[i, "rank"])
    return ev, (f"{2 * len(match)} point-to-point op(s) the traces give no peer for were paired "
                f"by their ends (a send and its receive end together, within "
                f"{P2P_END_TOL_US:g} µs)")
