"""Waits and stragglers: who waits for whom at the matched instances, on corrected clocks.

Input: the instances of :func:`pardiag.analyzer.analyses.clocks.instance_times` and the events
on the reference clock (:func:`pardiag.analyzer.analyses.clocks.align_clocks`).

* **Window heads** (:func:`window_heads`): instances before every rank's trace has started, and
  the first step after where the traces start more than :data:`HEAD_SKEW_US` apart, are no
  evidence of a slow rank.
* **Waits** (:func:`per_rank_waits`; TensorBoard profiler plugin): each rank's wait is its
  duration minus the instance's transfer time; a rank waits from its arrival to the arrival it
  waits for (the last one; at a broadcast or scatter the root's), and that rank *causes* the
  wait.
* **Stragglers** (:func:`straggler_table`): per-rank totals (wait suffered, wait caused) are
  lengths of unions of those intervals, so collectives in flight together (DDP buckets) count
  once; waiting caused is the root cause's (:func:`_wait_caused`). A straggler is named only
  from instances that are evidence (complete, not at a window's head, of known semantics) and
  only when it stands out of the noise (the ``STRAGGLER_*`` thresholds, or in a pipeline a
  second signal, :func:`_pipeline_straggler`; :func:`straggler_noise_note` says when it does
  not).
"""

from __future__ import annotations

import bisect

import numpy as np
import pandas as pd

from ..per_rank.op_semantics import FROM_ROOT, ROOTED
from ..per_rank.summary import summary_of
from ..trace import intervals as iv
from ..trace.traceset import TraceSet, float_column
from .clocks import ClockModel
from .instance_keys import is_p2p

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
#: A straggler's delay cost holds in this share of the steps or more
#: (:func:`straggler_by_delay_cost`).
STRAGGLER_STEP_SHARE = 0.8
#: A rank named by the cost of its time outside computation (host work, a sleep) costs at
#: least this share of the step: that time varies from rank to rank with the host's load (on
#: the unplanted CPU pipelines of ``sample_traces/`` one rank's cost 0.7–1.6% of the step, in
#: a different rank each run), where the kernels' does little.
STRAGGLER_OUTSIDE_MIN_STEP_SHARE = 0.02


#: Arrivals at an instance no further apart than this (µs) are a tie: nobody waited there, so
#: it names no rank last, is no rank's chance to be waited for (lock-step all-gathers beside
#: the all-reduces one rank is late at would otherwise outvote its lateness) and causes no
#: waiting.
ARRIVAL_TIE_US = 5.0
#: Traces of one window that start further apart than this (µs, on the reference clock) say a
#: profiler opened late: the first step after every rank has started is left out of waits too.
HEAD_SKEW_US = 1000.0


def window_starts(traces: TraceSet) -> dict[int, list[float]]:
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


def window_heads(ev: pd.DataFrame, inst: pd.DataFrame, starts: dict[int, list[float]],
                  clock: ClockModel) -> tuple[pd.Series, str | None]:
    """Which instances sit at a window's head: before every rank's trace of that profiling
    window has started, and — where the traces start more than :data:`HEAD_SKEW_US` apart (a
    rank whose profiler opened late arrives late at its first collectives, which says nothing
    about its speed) — the first profiler step after that (the whole step where every event
    has a step; else each group's first instance after).

    ``ev``: the events on the reference clock; ``inst``: :func:`.clocks.instance_times`; ``starts``:
    :func:`window_starts`; ``clock``: the clock model that put ``ev`` on the reference clock.

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
        t0 = clock.correct(np.array(ranks), np.array(own, dtype=float), int(w))
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


def per_rank_waits(ev: pd.DataFrame, inst: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each rank's time at each instance of :func:`.clocks.instance_times`.

    ``ev``: the events on corrected clocks (:func:`.clocks.align_clocks`). A member of a
    release-together op or a point-to-point pair waits from its arrival to the last arrival
    (what it took beyond the fastest member's duration, the transfer, is its wait: TensorBoard
    profiler plugin); a member of a broadcast or scatter waits from its arrival to the root's;
    the root of a reduce or gather to the last member's.

    Returns:
        (:attr:`.sync.SyncResult.per_rank`: ``instance``, ``rank``, ``start_us``, ``end_us``,
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
    pair = _is_pair(pr)
    pr["wait_us"] = np.where(pair, pr["wait_until_us"] - pr["start_us"], pr["wait_us"])
    pr["co_last"] = _co_last(pr, pair | (rooted & pr["op"].isin(FROM_ROOT).to_numpy()))
    per_rank = pr[["instance", "rank", "start_us", "end_us", "dur_us", "wait_us",
                   "arrival_delay_us", "evidence"]
                  + [c for c in ("issue_us", "stream") if c in pr]].reset_index(drop=True)
    return per_rank, pr[pr["complete"].astype(bool)].drop(columns="_root")


#: Ranks whose arrivals lie within this share of an instance's arrival skew of the last arrival
#: arrived last together (:func:`_co_last`).
CO_LAST_SHARE = 0.1


def _co_last(pr: pd.DataFrame, own_rule: np.ndarray) -> list[tuple[int, ...]]:
    """Per row, the ranks its instance waited for: those that arrived last together (within
    :data:`CO_LAST_SHARE` of the instance's arrival skew, and at least :data:`ARRIVAL_TIE_US`,
    of the last arrival: two ranks with the same extra work, as the heads Ulysses gives the
    first ranks of an uneven split, or two ranks of a slow host, are both waited for, not the
    later by its tens of µs or the lower by its number); only ``last_rank`` where the instance
    has a rule of its own (``own_rule``: a pair, or a broadcast's or scatter's root)."""
    by = pr.groupby("instance")["start_us"]
    latest = by.transform("max")
    # together: within a tenth of the instance's arrival skew of the last arrival (two ranks
    # 2 ms late, one of them 60 µs after the other, are late together), at least ARRIVAL_TIE_US
    tol = np.maximum(ARRIVAL_TIE_US, CO_LAST_SHARE * (latest - by.transform("min")))
    tied = (pr["start_us"] >= latest - tol).to_numpy()
    together = pr[tied].groupby("instance")["rank"].agg(lambda r: tuple(sorted(int(x) for x in r)))
    own = pr["last_rank"].map(lambda r: (int(r),))
    return [o if rule or not isinstance(t, tuple) else t for o, t, rule in
            zip(own, pr["instance"].map(together), own_rule)]


def _wait_caused(pr: pd.DataFrame) -> dict[tuple[int, int], float]:
    """``{(root cause, step): wait caused (µs)}``: the waiting each rank caused, directly or
    through ranks that were late because they waited for it (Scalasca's delay costs, Böhme et
    al., 2016, without their comparison to a baseline).

    A wait of rank *w* for the last arrival *c* is caused by *c*, except for the part during
    which *c* was itself waiting for a rank: that part was caused by whoever *c* waited for,
    and so on (:func:`_root_shares`) — in a pipeline a slow stage makes its neighbour wait, the
    neighbour makes the next wait, and all of it is the slow stage's. Per waiting rank and
    step, waits in flight together (DDP's buckets) count once: each wait's share is scaled by
    |union of the rank's waits for that arrival| / their sum. ``pr``: the rows of complete
    instances (:func:`per_rank_waits`)."""
    waiting = [int(r) not in c for r, c in zip(pr["rank"], pr["co_last"])]
    others = pr[np.asarray(waiting, dtype=bool)]
    o_start = others["start_us"].to_numpy(dtype=float)
    o_until = others["wait_until_us"].to_numpy(dtype=float)
    shares = _root_shares(others["rank"].to_numpy(), others["co_last"].tolist(), o_start,
                          o_until)
    caused: dict[tuple[int, int], float] = {}
    # positions instead of sub-frames (thousands of groups on big runs)
    groups = others.groupby(["last_rank", "step", "rank"], sort=True).indices
    for (_, step, _), idx in sorted(groups.items(), key=lambda kv: kv[0]):
        lengths = np.maximum(o_until[idx] - o_start[idx], 0.0)
        total = float(lengths.sum())
        if total <= 0:
            continue
        scale = iv.total(iv.union(o_start[idx], o_until[idx])) / total
        for i, d in zip(idx, lengths):
            for root, share in shares[i].items():
                key = (root, int(step))
                caused[key] = caused.get(key, 0.0) + float(d) * scale * share
    return caused


def _root_shares(waiter: np.ndarray, cause: list[tuple[int, ...]], start: np.ndarray,
                 until: np.ndarray) -> list[dict[int, float]]:
    """Per wait (rank ``waiter`` waits from ``start`` to ``until`` µs for the ranks ``cause``,
    which arrived last together: each an equal part), the share of it each root cause accounts
    for: a cause for the part of the wait in which it was not waiting itself, and for the part
    in which it was, the shares of those waits of its own (already resolved: waits are taken
    in the order they end), in proportion to their overlap with this one."""
    n = len(waiter)
    out: list[dict[int, float]] = [{} for _ in range(n)]
    order = np.argsort(until, kind="stable")
    # each rank's resolved waits and their ends, in the order they end: the ones that can
    # overlap a wait from ``start`` on are found by bisection (a rank waits thousands of times)
    own: dict[int, list[int]] = {}
    ends: dict[int, list[float]] = {}
    for i in order:
        d = float(until[i] - start[i])
        share: dict[int, float] = {}
        part = 1.0 / len(cause[i])
        for c in cause[i]:
            if d <= 0:
                share[c] = share.get(c, 0.0) + part
                continue
            left = d
            mine = own.get(c, [])
            for j in mine[bisect.bisect_right(ends.get(c, []), float(start[i])):]:
                o = min(until[i], until[j]) - max(start[i], start[j])
                if o <= 0:
                    continue
                o = min(float(o), left)
                left -= o
                for r, s in out[j].items():
                    share[r] = share.get(r, 0.0) + part * s * o / d
                if left <= 0:
                    break
            share[c] = share.get(c, 0.0) + part * left / d
        out[i] = share
        own.setdefault(int(waiter[i]), []).append(i)
        ends.setdefault(int(waiter[i]), []).append(float(until[i]))
    return out


def straggler_table(ranks: list[int], inst: pd.DataFrame, pr: pd.DataFrame, n_multi: int,
                profiler_step: tuple[float | None, float | None] = (None, None),
                compute: dict[int, float] | None = None
                ) -> tuple[pd.DataFrame, int | None]:
    """Per-rank waits from the complete instances.

    ``ranks``: every rank with events; ``inst``: :func:`.clocks.instance_times`; ``pr``: the rows of
    complete instances (:func:`per_rank_waits`); ``n_multi``: instances of more than one rank
    (with none of them complete, the table is empty); ``profiler_step``: the step's median
    length and spread (:func:`step_lengths`); ``compute``: each rank's computation per
    profiler step (:func:`compute_per_step`).

    In a pipeline (most waits at point-to-point transfers) the schedule's own bubble makes the
    first and last stages the root of much waiting without being slow, so the rank that causes
    the most is named without the dominance rule when a second signal agrees: it computes more
    per step than every other rank, by more than the step varies and the thresholds below
    (:func:`_pipeline_straggler`).

    Returns:
        (:attr:`.sync.SyncResult.stragglers`, most wait caused first;
        :attr:`.sync.SyncResult.straggler`).
    """
    st = pd.DataFrame({"rank": ranks})
    start, until = pr["start_us"].to_numpy(), pr["wait_until_us"].to_numpy()
    rows_of = pr.groupby("rank", sort=False).indices   # each rank's rows once, not a mask each
    none = np.array([], dtype=int)
    st["wait_suffered_us"] = [iv.total(iv.union(start[i], until[i]))
                              for i in (rows_of.get(r, none) for r in ranks)]
    # an instance whose arrivals tie (within ARRIVAL_TIE_US) has nobody waiting for anybody:
    # its few µs are the clocks' and the timestamps' resolution (µs near 1.7e15 resolve to
    # 0.25 µs), which summed over many tied instances made a rank the cause of waiting
    tied = (set(inst.loc[inst["arrival_skew_us"] <= ARRIVAL_TIE_US, "instance"])
            if "arrival_skew_us" in inst else set())
    caused = _wait_caused(pr[~pr["instance"].isin(tied)] if tied else pr)
    total_caused: dict[int, float] = {}
    for (last, _), v in caused.items():
        total_caused[last] = total_caused.get(last, 0.0) + v
    st["wait_caused_us"] = st["rank"].map(total_caused).fillna(0.0)
    done = inst[inst["evidence"]] if "evidence" in inst else inst[inst["complete"]]
    waited = (done[done["arrival_skew_us"] > ARRIVAL_TIE_US] if "arrival_skew_us" in done
              else done)
    # each rank that arrived last, with any that arrived together with it (:func:`_co_last`)
    co = pr.drop_duplicates("instance").set_index("instance")["co_last"].to_dict()
    lasts = pd.Series([r for i, last in zip(waited["instance"], waited["last_rank"])
                       for r in co.get(i, (int(last),))], dtype="int64").value_counts()
    st["last_arrivals"] = st["rank"].map(lasts).fillna(0).astype(int)
    top: dict[int, tuple[int, float]] = {}
    for (last, step), v in caused.items():
        if v > top.get(step, (None, -1.0))[1]:
            top[step] = (last, v)
    tops = pd.Series([t[0] for t in top.values()]).value_counts()
    st["steps_as_top"] = st["rank"].map(tops).fillna(0).astype(int)
    # the ops at which a rank can be the one waited for: a broadcast's or scatter's members
    # wait for its root only, so a member's arrival there is no chance to be last
    from_root = (pr["semantics"].eq(ROOTED) & pr["op"].isin(FROM_ROOT)).to_numpy()
    root = pd.to_numeric(pr["instance"].map(inst.set_index("instance")["root"]),
                         errors="coerce").to_numpy(dtype=float)
    chances = pr[(~from_root | (pr["rank"].to_numpy(dtype=float) == root))
                 & pr["instance"].isin(waited["instance"]).to_numpy()]
    st["instances"] = (st["rank"].map(chances.groupby("rank")["instance"].nunique())
                       .fillna(0).astype(int))
    st = st.sort_values(["wait_caused_us", "rank"], ascending=[False, True]).reset_index(drop=True)
    if done.empty and n_multi:
        st = st.iloc[:0]
    straggler = None
    n_steps = max(1, int(done["step"].nunique())) if len(done) else 1
    if len(st) and float(st["wait_caused_us"].iloc[0]) >= STRAGGLER_MIN_WAIT_US * n_steps:
        top_us = float(st["wait_caused_us"].iloc[0])
        second = float(st["wait_caused_us"].iloc[1]) if len(st) > 1 else 0.0
        # consistent: far ahead of the next rank, last at most of the ops it joins, and what
        # each waiting rank loses per step is a share of the step that matters
        # the ranks that waited for it (its groups' members, not the whole world)
        who = int(st["rank"].iloc[0])
        waiters = pr.loc[(pr["last_rank"] == who) & (pr["rank"] != who), "rank"].nunique()
        per_waiter = top_us / n_steps / max(1, waiters)
        if (top_us >= STRAGGLER_DOMINANCE * second and st["last_arrivals"].iloc[0]
                >= STRAGGLER_LAST_SHARE * max(1, int(st["instances"].iloc[0]))
                and per_waiter >= STRAGGLER_MIN_STEP_SHARE * _step_span(done)
                and per_waiter >= STRAGGLER_MIN_PROFILER_STEP_SHARE * (profiler_step[0] or 0.0)
                and per_waiter > (profiler_step[1] or 0.0)):
            straggler = int(st["rank"].iloc[0])
        elif _pipeline_straggler(st, pr, compute or {}, profiler_step):
            straggler = who
    return st, straggler


def _pipeline_straggler(st: pd.DataFrame, pr: pd.DataFrame, compute: dict[int, float],
                        profiler_step: tuple[float | None, float | None]) -> bool:
    """Whether the rank that causes the most waiting (``st``'s first row) of a pipeline is its
    straggler: most waits are at point-to-point transfers, it arrives last at
    :data:`STRAGGLER_LAST_SHARE` of its ops or more, and it computes more per step than every
    other rank by at least :data:`STRAGGLER_MIN_PROFILER_STEP_SHARE` of the step and more than
    the step varies."""
    if pr.empty or len(st) < 2 or not compute:
        return False
    who = int(st["rank"].iloc[0])
    if p2p_share(pr) < 0.5 or who not in compute or len(compute) < 2:
        return False
    if st["last_arrivals"].iloc[0] < STRAGGLER_LAST_SHARE * max(1, int(st["instances"].iloc[0])):
        return False
    excess = compute[who] - max(v for r, v in compute.items() if r != who)
    step, spread = profiler_step
    return bool(excess > 0 and excess >= STRAGGLER_MIN_PROFILER_STEP_SHARE * (step or 0.0)
                and excess > (spread or 0.0))


def straggler_by_delay_cost(costs: pd.DataFrame, step_us: float | None) -> int | None:
    """The rank whose delay cost dominates, else None. ``costs``: the execution graph's delay
    costs (:attr:`pardiag.analyzer.analyses.critical_path.CriticalPathResult.delay_costs`, µs
    per step); ``step_us``: the step's median (µs). The top rank is named when its cost is at
    least :data:`STRAGGLER_DOMINANCE` × the next rank's, :data:`STRAGGLER_MIN_WAIT_US` and
    :data:`STRAGGLER_MIN_PROFILER_STEP_SHARE` of the step, and holds step after step: it costs
    something in :data:`STRAGGLER_STEP_SHARE` of two steps or more, and its median cost is
    above the interquartile range of its costs over the steps. Unlike the waits a rank causes,
    the cost is the step time the job would gain were the rank's work no longer than its
    peers': a pipeline's first and last stages cause the schedule's bubble and cost nothing."""
    if costs is None or costs.empty:
        return None
    c = costs.sort_values(["delay_cost_us", "rank"], ascending=[False, True], kind="stable")
    top = c.iloc[0]
    cost = float(top["delay_cost_us"])
    second = float(c["delay_cost_us"].iloc[1]) if len(c) > 1 else 0.0
    if (cost >= STRAGGLER_MIN_WAIT_US and cost >= STRAGGLER_DOMINANCE * second
            and cost >= STRAGGLER_MIN_PROFILER_STEP_SHARE * (step_us or 0.0)
            and int(top["steps"]) >= 2
            and int(top["steps_costly"]) >= STRAGGLER_STEP_SHARE * int(top["steps"])
            and cost > float(top["delay_cost_iqr_us"])):
        return int(top["rank"])
    return None


def p2p_share(per_rank: pd.DataFrame | None) -> float:
    """The share of ``per_rank``'s rows (:func:`per_rank_waits`) at point-to-point transfers:
    a pipeline's waits when most are; 0 for no rows."""
    if per_rank is None or not len(per_rank):
        return 0.0
    return float(_is_pair(per_rank).mean())


def _is_pair(pr: pd.DataFrame) -> np.ndarray:
    """Bool per row: its instance is a point-to-point pair (``p2p:...``)."""
    return is_p2p(pr["instance"]).to_numpy()


def compute_per_step(traces: TraceSet, comm_patterns=()) -> dict[int, float]:
    """``{rank: computation per profiler step (µs)}``: the rank's compute time (its time
    breakdown's ``compute_us``) over its steps; ranks without steps are left out."""
    out = {}
    for r, t in traces.ranks.items():
        total, steps, _ = summary_of(t, comm_patterns).breakdown
        if steps:
            out[int(r)] = float(total.get("compute_us") or 0.0) / len(steps)
    return out


def step_lengths(traces: TraceSet, comm_patterns=()) -> tuple[float | None, float | None]:
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


def late_together(st: pd.DataFrame) -> list[int]:
    """The ranks that arrive last together at most of their ops and cause about as much
    waiting each (within a tenth of the most), when two or more do (a slow host's ranks, the
    ranks with more work), else ``[]``; ``st``: :attr:`.sync.SyncResult.stragglers`."""
    if len(st) < 2 or float(st["wait_caused_us"].max()) < STRAGGLER_MIN_WAIT_US:
        return []
    top = float(st["wait_caused_us"].max())
    sel = st[(st["wait_caused_us"] >= 0.9 * top)
             & (st["last_arrivals"] >= STRAGGLER_LAST_SHARE * st["instances"].clip(lower=1))]
    return sorted(int(r) for r in sel["rank"]) if len(sel) > 1 else []


def straggler_noise_note(st: pd.DataFrame, straggler: int | None) -> str | None:
    """A note when waiting was caused but nobody is named because it is spread over the ranks
    (:data:`STRAGGLER_DOMINANCE`); ``st``: :attr:`.sync.SyncResult.stragglers`."""
    if straggler is not None or len(st) < 2:
        return None
    top, second = (float(x) for x in st["wait_caused_us"].iloc[:2])
    if top < STRAGGLER_MIN_WAIT_US:
        return None
    r0, r1 = int(st["rank"].iloc[0]), int(st["rank"].iloc[1])
    last, n = int(st["last_arrivals"].iloc[0]), max(1, int(st["instances"].iloc[0]))
    causes = f"rank {r0} causes {top:.0f} µs, rank {r1} {second:.0f} µs"
    # the criterion it failed, said as such (straggler_table's order)
    together = late_together(st)
    if together and top < STRAGGLER_DOMINANCE * second:
        who = ", ".join(map(str, together))
        why = (f"ranks {who} arrive last together at most of their collectives and cause "
               f"about as much waiting each ({causes}): a group slower than the rest (a slower "
               f"host, more work), not one straggler")
    elif top < STRAGGLER_DOMINANCE * second:
        why = (f"the waiting is spread over the ranks ({causes}: a straggler causes "
               f"{STRAGGLER_DOMINANCE:g}× the next rank's)")
    elif last < STRAGGLER_LAST_SHARE * n:
        why = (f"rank {r0} causes {top / max(second, 1e-9):.1f}× the next rank's waiting "
               f"({causes}) but arrives last at only {last} of its {n} ops (a straggler "
               f"arrives last at {STRAGGLER_LAST_SHARE:.0%} or more): by the waiting alone it "
               f"is late at some collectives, not most")
    else:
        why = (f"the waiting rank {r0} causes is too small ({causes}; a straggler's is at "
               f"least {STRAGGLER_MIN_STEP_SHARE:.0%} of the collectives' span and "
               f"{STRAGGLER_MIN_PROFILER_STEP_SHARE:.1%} of the step per waiting rank, and more "
               f"than the step varies): this is inside the noise")
    return f"no straggler named by the waiting: {why}"
