"""Load imbalance: compute time per rank per step (from the time breakdown). For each parallel
dimension, the ranks of one group of that dimension do the same work in a balanced run (DP
replicas, pipeline stages, TP shards); the group's imbalance is ``max / mean`` of their compute
and its cost is ``max − mean`` — how much shorter the step would be if every rank matched the
mean (a synchronous step waits for the slowest). Runs without a known layout are one group,
``world``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..trace.traceset import TraceSet
from .comm_events import run_windows


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
SKEW_COLUMNS: tuple[str, ...] = ("rank", "steps", "start_late_us", "delay_us", "top_collective",
                                 "top_delay_us", "top_share_pct")


def _on_reference_clock(steps: pd.DataFrame, sync, traces: TraceSet | None) -> np.ndarray:
    """The steps' ``start_us`` on the reference clock: corrected by the sync's clock model
    (offset and drift, each profiling window by its own where the windows were fitted apart:
    a host's offset can move between windows minutes apart), else less the offsets."""
    t = steps["start_us"].to_numpy(dtype=float)
    clock = getattr(sync, "clock", None)
    if clock is None:
        off = (dict(zip(sync.offsets["rank"], sync.offsets["offset_us"]))
               if len(sync.offsets) else {})
        return t - steps["rank"].map(off).fillna(0.0).to_numpy(dtype=float)
    ranks = steps["rank"].to_numpy()
    window = np.zeros(len(steps), dtype=int)
    if traces is not None and clock.windows:
        for r, tr in traces.ranks.items():
            if len(tr.windows) >= 2:
                mine = ranks == r
                lo = np.array([a for a, _ in tr.windows], dtype=float)
                window[mine] = np.maximum(np.searchsorted(lo, t[mine], side="right") - 1, 0)
        ends = steps["end_us"].to_numpy(dtype=float) if "end_us" in steps else t
        window = run_windows(pd.DataFrame({"rank": ranks, "window": window, "start_us": t,
                                           "end_us": ends}), traces)["window"].to_numpy()
    return clock.correct(ranks, t, window)


def skew_origin(steps: pd.DataFrame, sync, traces: TraceSet | None = None) -> pd.DataFrame:
    """Where each rank's arrival skew arises: at the step's start, or at one collective.

    Args:
        steps: :attr:`pardiag.analyzer.analyses.breakdown.TimeBreakdown.steps` (``rank``, ``step``,
            ``start_us`` on the rank's clock).
        sync: the :class:`pardiag.analyzer.analyses.sync.SyncResult` (its clock model, and per
            instance and rank the ``arrival_delay_us``: arrival − the first rank's arrival).
        traces: the run (each rank's profiling windows, whose clocks may be fitted apart).

    Returns:
        :data:`SKEW_COLUMNS`, one row per rank: ``steps`` (steps every rank has),
        ``start_late_us`` (median over them of how long after the earliest rank it starts the
        step, clocks aligned; µs), ``delay_us`` (its arrival delay summed over the complete
        collectives of those steps, per step; µs), ``top_collective`` (``"op on group"``
        holding most of that delay), ``top_delay_us`` (its share per step, µs) and
        ``top_share_pct`` (% of ``delay_us``). Empty without two ranks with steps or matched
        collectives.
    """
    empty = pd.DataFrame(columns=list(SKEW_COLUMNS))
    if steps is None or steps.empty or sync is None or steps["rank"].nunique() < 2:
        return empty
    st = steps.assign(start=_on_reference_clock(steps, sync, traces))
    starts = st.pivot_table(index="step", columns="rank", values="start", aggfunc="min").dropna()
    if starts.empty:
        return empty
    late = starts.sub(starts.min(axis=1), axis=0).median()
    n = len(starts)
    inst = sync.instances
    pr = sync.per_rank
    delays = pd.DataFrame(columns=["rank", "where", "arrival_delay_us"])
    if len(pr) and len(inst):
        # the complete instances of the steps counted (``n``): one outside them (a window's
        # partial head cycle, step -1) would add to its namesake of a step counted
        done = inst.loc[inst["complete"].astype(bool) & inst["step"].isin(starts.index),
                        ["instance", "op", "group", "step"]]
        d = pr.merge(done, on="instance").sort_values(["rank", "step", "start_us"])
        if len(d):   # a collective is its op, its place in the step and its group
            k = d.groupby(["rank", "step", "group"], dropna=False).cumcount() + 1
            on = d["group"].fillna("").astype(str).map(lambda g: f" on {g}" if g else "")
            delays = d.assign(where=d["op"].astype(str) + " #" + k.astype(str) + " of the step"
                              + on)
    # each rank's delay per collective, grouped once (wheres in order: the first of the largest
    # is the top)
    sums = delays.groupby(["rank", "where"], sort=True)["arrival_delay_us"].sum()
    # each rank's rows of ``sums`` (sorted by rank): positions, not a Series per rank
    r_of = sums.index.get_level_values(0).to_numpy().astype(np.int64)
    where = sums.index.get_level_values(1).to_numpy()
    v = sums.to_numpy(dtype=float)
    cut = np.flatnonzero(np.r_[True, r_of[1:] != r_of[:-1]]) if len(v) else np.array([], int)
    per = dict(zip(r_of[cut].tolist(), zip(cut.tolist(), np.r_[cut[1:], len(v)].tolist())))
    rows = []
    for r in sorted(int(x) for x in starts.columns):
        a, b = per.get(r, (0, 0))
        by = v[a:b]
        total = float(np.where(np.isnan(by), 0.0, by).sum()) / n if b > a else 0.0
        i = int(np.argmax(by)) if b > a else -1
        top = str(where[a + i]) if i >= 0 and by[i] > 0 else None
        top_us = float(by[i]) / n if top else 0.0
        rows.append({"rank": r, "steps": n, "start_late_us": float(late[r]), "delay_us": total,
                     "top_collective": top, "top_delay_us": top_us,
                     "top_share_pct": 100.0 * top_us / total if total > 0 else float("nan")})
    return pd.DataFrame(rows, columns=list(SKEW_COLUMNS))


def dimension_groups(traces: TraceSet) -> list[tuple[str, str, list[int]]]:
    """``[(dim, pg name, member ranks)]`` from the comms sidecars; ``[("world", "", all)]``
    without them. One entry per distinct group."""
    seen: dict[tuple, tuple[str, str, list[int]]] = {}
    for doc in traces.sidecars.get("comms", {}).values():
        for g in doc.process_groups:
            if g.dim and g.ranks:
                key = (g.dim, tuple(g.ranks))
                seen.setdefault(key, (g.dim, str(g.name), list(g.ranks)))
    if not seen:
        return [("world", "", sorted(traces.ranks))]
    return sorted(seen.values(), key=lambda t: (t[0], t[2]))


def compute_balance(traces: TraceSet, breakdown_steps: pd.DataFrame, sync=None) -> BalanceResult:
    """Compute-time imbalance per dimension group and step (see the module docstring), and
    where each rank's arrival skew arises (:func:`skew_origin`, with ``sync``)."""
    per_rank = breakdown_steps[["rank", "step", "compute_us", "span_us"]].copy()
    # ranks whose trace holds no kernel beside ranks whose do: their host's op time is no
    # measure of their device's computation (TimeBreakdown.host_only_text)
    dev = {r for r, t in traces.ranks.items() if t.has_gpu}
    if dev and len(dev) < len(traces.ranks):
        per_rank = per_rank[per_rank["rank"].isin(dev)]
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
                         skew_origin(breakdown_steps, sync, traces))


