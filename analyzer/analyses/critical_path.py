"""The cross-rank critical path of each profiled step, and its replay.

A step ends when its last rank ends; what made that rank end then is the chain of dependent work,
across ranks, behind it. This module builds that chain at the granularity of the matched
communication (:mod:`pardiag.analyzer.analyses.sync`), from what every rank's summary holds (its
computation and communication interval sets, its step windows), so it works on CPU/gloo and GPU
traces alike and from stored summaries.

The graph (:mod:`pardiag.analyzer.analyses.exec_graph`): the *joins* (every complete instance
of more than one rank), which members were *blocked* at each, its *release* at the last
arrival, each rank's *work* between its blocked joins (computation, data loading, the rest).

**The path** (per step) walks back from the step's last end (the rank whose step window ends
last, on the aligned clock): the rank's work since its last blocked join, then that join's
transfer, then — at the join's last arrival — the last-arriving rank's work before it, and so on
until a rank's step start. **Slack** of a rank in a step: how much later it could have arrived
without moving anything: the least, over its joins in the step, of the last arrival less its
own, and the step's end less its own end. On the path it is 0.

**Replay** (:func:`~pardiag.analyzer.analyses.exec_graph.replay_ends`) recomputes a step
from its graph after scaling chosen work; the unchanged graph reproduces the measured step (a
check of the graph, reported per step), and the delay costs and what-ifs below are replays.

What the traces cannot tell is said, not guessed: communication that no instance matches (its
peers absent, its group unknown) is work of its rank, not a join; a rank without any join is on
the path only where its own step ends last.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..per_rank.summary import summary_of
from ..trace import intervals as iv
from ..trace.traceset import TraceSet
from .breakdown import TimeBreakdown
from .dim_overlap import dims_of_groups
from .exec_graph import (
    BLOCKED_TOL_US,
    WAIT_BEGAN_US,
    Join,
    StepGraph,
    blocked_at,
    chain_us,
    free_senders,
    outside_us,
    period_us,
    replay_end,
    stream_order,
    work_us,
)
from .instance_keys import is_p2p_key
from .layout import LayoutResult
from .peers import median_of_others
from .sync import SyncResult

#: Columns of :attr:`CriticalPathResult.segments`.
SEGMENT_COLUMNS = ("step", "rank", "start_us", "end_us", "dur_us", "kind", "compute_us",
                   "data_loading_us", "other_us", "op", "dim", "instance")
#: Columns of :attr:`CriticalPathResult.steps`.
STEP_COLUMNS = ("step", "start_us", "end_us", "measured_us", "path_us", "replay_us",
                "replay_error_pct", "joins")
#: Columns of :attr:`CriticalPathResult.slack`.
SLACK_COLUMNS = ("rank", "steps", "slack_us", "on_path_steps")
#: Columns of :attr:`CriticalPathResult.shares`.
SHARE_COLUMNS = ("part", "rank", "dim", "us", "share_pct")
#: Columns of :attr:`CriticalPathResult.delay_costs`.
DELAY_COLUMNS = ("rank", "steps", "steps_costly", "excess_compute_us", "delay_cost_us",
                 "delay_cost_iqr_us")
#: Delay costs are replayed for at most this many ranks: those whose computation exceeds the
#: other ranks' median the most (a replay per rank and step; the rest cost the job less than they).
DELAY_RANKS = 4


@dataclasses.dataclass(frozen=True)
class CriticalPathResult:
    """Result of :func:`compute_critical_path`.

    Attributes:
        segments: the path of every step, latest first: :data:`SEGMENT_COLUMNS` — ``kind``
            ``"work"`` (a rank's time between joins: ``compute_us`` of computation,
            ``data_loading_us`` in its DataLoader iterator outside computation,
            ``other_us`` of the rest) or ``"communication"`` (a join's transfer on ``rank``'s
            side: ``op``, ``dim`` of its group, ``instance``); µs on the aligned clock.
        steps: per step: :data:`STEP_COLUMNS` — ``start_us``/``end_us`` (the earliest start and
            latest end over the ranks, aligned), ``measured_us`` (end − start), ``path_us``
            (the path's length), ``replay_us`` (the unchanged graph replayed: its latest end
            less ``start_us``), ``replay_error_pct``, ``joins``.
        shares: the path's time over all steps by part: :data:`SHARE_COLUMNS` — ``part``
            ``"compute"`` / ``"data loading"`` (only where there is some) / ``"other"`` per
            ``rank``, ``"communication"`` per ``dim``;
            ``share_pct`` of the summed path length.
        slack: per rank: :data:`SLACK_COLUMNS` — ``slack_us`` the median over steps of its
            slack (how much later it could arrive anywhere in the step without moving the
            step's end), ``on_path_steps`` in how many steps the path crosses it.
        delay_costs: per rank whose computation in a step exceeds the median of the other
            ranks' (at most :data:`DELAY_RANKS`, those with the most excess):
            :data:`DELAY_COLUMNS` — ``excess_compute_us`` (median over steps of its
            computation less the others' median, > 0), ``delay_cost_us`` (median over steps of
            the step time that excess costs the job: the unchanged replay less the replay with
            its computation scaled to the others' median, :meth:`replay`; Scalasca's delay
            cost taken on the execution graph, so waiting passed on through other ranks counts
            and a schedule's own bubble does not), ``delay_cost_iqr_us`` (its interquartile
            range over steps; 0 under three steps), ``steps``, ``steps_costly`` (steps in which
            it costs more than 0); most cost first. Empty without a path. Computation, not all
            of a rank's time: time a rank spends neither computing nor blocked includes waits
            the graph cannot tell from host work (a receive it computed around), which would
            give an end stage of a balanced pipeline a cost.
        notes: what was left out, and why.
        why_none: why there is no path ("" when there is one).
        head_steps: the steps that hold a collective at a profiling window's head
            (:func:`.stragglers.window_heads`): a late start there may be a profiler that
            opened later, not a slow rank.
    """

    segments: pd.DataFrame
    steps: pd.DataFrame
    shares: pd.DataFrame
    slack: pd.DataFrame
    notes: tuple[str, ...] = ()
    why_none: str = ""
    graphs: tuple = dataclasses.field(default=(), repr=False)
    delay_costs: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=list(DELAY_COLUMNS)))
    head_steps: frozenset = frozenset()

    def without_straggler(self, rank: int) -> pd.DataFrame:
        """The replay with ``rank``'s work in each step scaled to the median of the other ranks'
        work in that step (work: the step window less the time blocked in joins), as
        :meth:`replay` returns it: the step as if the rank were no slower than its peers.

        Raises:
            ValueError: ``rank`` is not one of the path's ranks.
        """
        self._check_ranks({rank: 1.0}, "rank")
        rows = []
        for g in self.graphs:
            w = work_us(g)
            peers = [v for r, v in w.items() if r != rank]
            if rank not in w or not peers or w[rank] <= 0:
                continue
            f = min(1.0, float(np.median(peers)) / w[rank])
            start = min(g.start.values())
            rows.append({"step": g.step, "measured_us": max(g.end.values()) - start,
                         "replay_us": replay_end(g, {}, {}) - start,
                         "predicted_us": replay_end(g, {}, {}, {rank: f}) - start})
        return pd.DataFrame(rows, columns=["step", "measured_us", "replay_us", "predicted_us"])

    def work_cost(self, rank: int) -> pd.DataFrame:
        """The step time ``rank``'s whole work costs the job, as one row of
        :data:`DELAY_COLUMNS` (``excess_compute_us`` is then its work's excess over the others'
        median): the profiled steps replayed one after the other (:func:`chain_us`), less the
        same with its work scaled to the others' median in each step, per step, counted as
        :meth:`outside_costs` counts (a delay the next step's schedule hides costs nothing, as
        the job would run). Empty without a path or when the rank is not on it."""
        if rank not in {int(r) for g in self.graphs for r in g.end}:
            return pd.DataFrame(columns=list(DELAY_COLUMNS))
        work = {g.step: work_us(g) for g in self.graphs}
        excess, med, _ = _ranked_excess(work)
        if rank not in excess:
            return pd.DataFrame(columns=list(DELAY_COLUMNS))
        return _costs_table([_window_row(sorted(self.graphs, key=lambda g: g.step), rank,
                                         work, excess[rank], med[rank], "work")])

    def outside_costs(self) -> pd.DataFrame:
        """Delay costs of the time ranks spend outside computation and data loading while not
        blocked in a join (host work, a sleep before a step's launches), as
        :data:`DELAY_COLUMNS`: for each rank whose such time exceeds the other ranks' median
        (``excess_compute_us``: that excess, median over steps; at most :data:`DELAY_RANKS`,
        the most first), ``delay_cost_us`` is the step time it costs: the profiled steps
        replayed one after the other (:func:`chain_us`: each rank starts a step where it ended
        the step before, so a delay the next step's schedule hides costs nothing) less the
        same with that time of the rank scaled to the others' median in each step, its
        computation unchanged, per step of ``steps``. ``steps_costly`` counts the steps in
        which its excess is at least :data:`OUTSIDE_MIN_US`, ``steps`` the window's steps,
        less one where one of them has no such excess (the step boundaries inside the window);
        ``delay_cost_iqr_us`` is 0 (one cost per window). Most cost first; empty without a
        path.

        One replay of the window, not one per step, and its boundaries counted: a device's
        step window runs from its step's first kernel to the next step's, so a delay before a
        step's first launch lies in the window before it (the first step's before the
        window)."""
        rest = {g.step: outside_us(g) for g in self.graphs}
        excess, med, top = _ranked_excess(rest)
        if not top:
            return pd.DataFrame(columns=list(DELAY_COLUMNS))
        graphs = sorted(self.graphs, key=lambda g: g.step)
        return _costs_table([_window_row(graphs, r, rest, excess[r], med[r], "other")
                             for r in top[:DELAY_RANKS]])

    def _delay_costs(self) -> pd.DataFrame:
        """:attr:`delay_costs`, computed from :attr:`graphs`."""
        comp = {g.step: {int(r): iv.total(k) for r, k in g.k.items()} for g in self.graphs}
        _, med, top = _ranked_excess(comp)
        base = {g.step: replay_end(g, {}, {}) for g in self.graphs} if top else {}
        rows = []
        for r in top[:DELAY_RANKS]:
            cost = []
            for g in self.graphs:
                c = comp[g.step]
                peers = [x for q, x in c.items() if q != r]
                if r not in c or not peers or c[r] <= 0:
                    continue
                f = min(1.0, float(np.median(peers)) / c[r])
                cost.append(max(0.0, base[g.step] - replay_end(g, {r: f}, {})))
            if cost:
                rows.append(_cost_row(r, cost, med[r]))
        return _costs_table(rows)

    def _check_ranks(self, scales: dict, what: str) -> None:
        ranks = sorted({int(r) for g in self.graphs for r in g.end})
        for r, f in scales.items():
            if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or int(r) not in ranks:
                raise ValueError(f"{what}: {r!r} is not a rank of the path's steps (ranks: "
                                 f"{', '.join(map(str, ranks)) or 'none'})")
            _check_factor(f, f"{what}[{r}]")

    def describe(self) -> str:
        """One sentence: the path's length against the profiled step, its largest parts (and
        what the others add up to) and the ranks with the most slack, e.g. "Critical path of the
        profiled steps (3; path 1.00 ms median, range 1.00–1.00, of a 1.00 ms profiled step:
        100%): 80% rank 1's computation, 15% rank 1's time outside computation, 5% dp
        communication; slack: rank 0 0.05 ms" (time outside computation: host work, launches,
        idle, communication the rank did not wait for). The percentages shown add up to 100
        (largest remainders); parts under 0.5% are left to the rest. When the path is under 95%
        of the step (as shown), it says how much earlier than the path's first rank the
        earliest rank started (it then waited). "" without a path."""
        if self.shares.empty or self.steps.empty:
            return ""
        top = self.shares.head(3)
        top = top[top["share_pct"] >= 0.5]
        rest = self.shares.iloc[len(top):]
        shown = [float(v) for v in top["share_pct"]]
        if len(rest) and rest["share_pct"].sum() >= 0.5:
            shown.append(float(rest["share_pct"].sum()))
        pct = _rounded(shown)
        parts = []
        for row, p in zip(top.itertuples(index=False), pct):
            if row.part == "communication":
                what = f"{row.dim} communication"
            else:
                what = f"rank {int(row.rank)}'s " + {
                    "compute": "computation", "data loading": "data loading"}.get(
                    row.part, "time outside computation")
            parts.append(f"{p}% {what}")
        if len(pct) > len(top):
            parts.append(f"{pct[-1]}% in {len(rest)} other part{'s' if len(rest) > 1 else ''}")
        st = self.steps
        path, step = st["path_us"].median(), st["measured_us"].median()
        spread = (f", range {st['path_us'].min() / 1000:.2f}–{st['path_us'].max() / 1000:.2f}"
                  if len(st) > 1 else "")
        text = (f"Critical path of the profiled steps ({len(st)}; path {path / 1000:.2f} ms "
                f"median{spread}, of a {step / 1000:.2f} ms profiled step: "
                f"{100.0 * path / step if step > 0 else float('nan'):.0f}%"
                + self._late_start(path, step) + "): " + ", ".join(parts))
        slack = self.slack[self.slack["slack_us"] > 0].sort_values("slack_us", ascending=False)
        if len(slack):
            text += "; slack: " + ", ".join(f"rank {int(r)} {v / 1000:.2f} ms" for r, v in
                                           zip(slack["rank"].head(3), slack["slack_us"].head(3)))
        return text

    def _late_start(self, path: float, step: float) -> str:
        """", the path's first rank started X ms after the earliest (which then waited)" when
        the path is under 95% of the step; "" otherwise."""
        if not step > 0 or round(100.0 * path / step) >= 95 or self.segments.empty:
            return ""
        late, at_head = [], []
        for g in self.graphs:
            seg = self.segments[self.segments["step"] == g.step]
            if len(seg):
                first = seg.iloc[-1]   # latest first: the path's first segment is the last row
                late.append(g.start[int(first["rank"])] - min(g.start.values()))
                at_head.append(g.step in self.head_steps)
        if not late or float(np.median(late)) <= 0:
            return ""
        text = (f"; the path's first rank started {float(np.median(late)) / 1000:.2f} ms after "
                f"the earliest, which waited for it")
        if all(at_head):
            text += (" (at the head of a profiling window, where a profiler that opened later "
                     "cannot be told from a slow rank)")
        return text

    def comm_ratio(self, comm_scale: dict) -> float | None:
        """The path replayed with some dimensions' transfers scaled (``{dim: factor}``;
        dimensions with no transfer on the path's steps are left out): the median over steps of
        the replayed steady period over the unchanged one (:meth:`replay` with ``steady``: a
        link's transfers also stagger the ranks' next starts), or None without a path or any
        such transfer."""
        dims = {j.dim for g in self.graphs for j in g.joins}
        scale = {d: f for d, f in comm_scale.items() if d in dims}
        if not scale:
            return None
        out = self.replay(comm_scale=scale, steady=True)
        out = out[out["replay_us"] > 0]
        return float((out["predicted_us"] / out["replay_us"]).median()) if len(out) else None

    def replay(self, compute_scale: dict | None = None, comm_scale: dict | None = None,
               work_scale: dict | None = None, steady: bool = False) -> pd.DataFrame:
        """Each step replayed with the ranks' computation scaled (``{rank: factor}``), all of
        some ranks' work scaled (``work_scale``: computation and the rest), and the transfers of
        some dimensions scaled (``{dim: factor}``). With ``steady``, each step's graph is
        replayed as if it repeated (:func:`period_us`): the ranks' staggered starts follow the
        change (a late start that the step before's slow transfer caused shrinks with it), and
        ``replay_us``/``predicted_us`` are steady periods, start to start.

        Returns:
            per step: ``step``, ``measured_us``, ``replay_us`` (the unchanged graph),
            ``predicted_us`` (µs, the changed one).

        Raises:
            ValueError: a rank or dimension the path's steps do not have, or a factor that is
                not a finite number ≥ 0.
        """
        self._check_ranks(compute_scale or {}, "compute_scale")
        self._check_ranks(work_scale or {}, "work_scale")
        dims = sorted({j.dim for g in self.graphs for j in g.joins})
        for d, f in (comm_scale or {}).items():
            if d not in dims:
                raise ValueError(f"comm_scale: no transfers of dimension {d!r} in the path's "
                                 f"steps (their dimensions: {', '.join(dims) or 'none'})")
            _check_factor(f, f"comm_scale[{d!r}]")
        rows = []
        for g in self.graphs:
            start = min(g.start.values())
            if steady:
                base = period_us(g, {}, {})
                new = period_us(g, compute_scale or {}, comm_scale or {}, work_scale or {})
            else:
                base = replay_end(g, {}, {}) - start
                new = replay_end(g, compute_scale or {}, comm_scale or {}, work_scale or {}) - start
            rows.append({"step": g.step, "measured_us": max(g.end.values()) - start,
                         "replay_us": base, "predicted_us": new})
        return pd.DataFrame(rows, columns=["step", "measured_us", "replay_us", "predicted_us"])


def _cost_row(rank: int, cost: list[float], excess_us: float) -> dict:
    """One row of :data:`DELAY_COLUMNS` from a rank's cost per step (µs)."""
    q1, q3 = np.percentile(cost, [25, 75]) if len(cost) >= 3 else (0.0, 0.0)
    return {"rank": rank, "steps": len(cost), "steps_costly": int(sum(x > 0 for x in cost)),
            "excess_compute_us": excess_us, "delay_cost_us": float(np.median(cost)),
            "delay_cost_iqr_us": float(q3 - q1)}


def _rounded(values: list[float]) -> list[int]:
    """Percentages rounded so that they add up to the rounded total (largest remainders)."""
    floors = [int(np.floor(v)) for v in values]
    left = int(round(sum(values))) - sum(floors)
    for i in sorted(range(len(values)), key=lambda i: floors[i] - values[i])[:max(0, left)]:
        floors[i] += 1
    return floors


def _check_factor(f, what: str) -> None:
    if isinstance(f, bool) or not isinstance(f, (int, float, np.integer, np.floating)) \
            or not np.isfinite(f) or f < 0:
        raise ValueError(f"{what}: a scale factor is a finite number ≥ 0, not {f!r}")


def _empty(why: str, notes=()) -> CriticalPathResult:
    return CriticalPathResult(pd.DataFrame(columns=list(SEGMENT_COLUMNS)),
                              pd.DataFrame(columns=list(STEP_COLUMNS)),
                              pd.DataFrame(columns=list(SHARE_COLUMNS)),
                              pd.DataFrame(columns=list(SLACK_COLUMNS)), tuple(notes), why)


def _graphs(traces: TraceSet, breakdown: TimeBreakdown, sync: SyncResult,
            layout: LayoutResult, comm_patterns) -> tuple[list[StepGraph], list[str]]:
    notes: list[str] = []
    offsets = dict(zip(sync.offsets["rank"].astype(int), sync.offsets["offset_us"].astype(float)))
    parts = {}
    for r in sorted(int(x) for x in traces.ranks):
        s = summary_of(traces.ranks[r], list(comm_patterns))
        p = s.parts
        off = offsets.get(r, 0.0)
        k = p.k - off if len(p.k) else p.k.reshape(-1, 2)
        exposed = iv.subtract(p.c, p.k) - off if len(p.c) else p.c.reshape(-1, 2)
        d = s.data_loading
        d = d - off if len(d) else d.reshape(-1, 2)
        # the DataLoader iterator's own operators are host computation on a CPU rank: its time
        # is data loading; on a GPU rank kernels that run meanwhile make that time computation
        if p.domain == "cpu":
            k = iv.subtract(k, d)
        else:
            d = iv.subtract(d, k)
        parts[r] = (k, exposed, d, s.launch_edges, off)
    by_name, by_group = dims_of_groups(layout, len(traces.ranks))
    inst = sync.instances
    pr = sync.per_rank
    if inst is None or inst.empty or pr is None or pr.empty:
        members = pd.DataFrame(columns=["instance", "rank", "start_us", "end_us", "issue_us",
                                        "stream"])
    else:
        ok = inst[inst["complete"].astype(bool) & (inst["ranks"] > 1)]
        members = pr[pr["instance"].isin(set(ok["instance"]))]
        partial = int((~inst["complete"].astype(bool) & (inst["ranks"] > 1)).sum())
        if partial:
            notes.append(f"{partial} communication instance(s) lacking members are no joins: "
                         f"what their absent members did is not in the traces")
    # each instance's op, group and process group by key (one row per instance)
    meta = ({c: dict(zip(inst["instance"], map(str, inst[c]))) for c in ("op", "group", "pg")}
            if inst is not None and len(inst) else None)
    steps = breakdown.steps
    graphs, straddling = [], set()
    for step, srows in steps.groupby("step", sort=True):
        start = {int(r): float(s) - offsets.get(int(r), 0.0)
                 for r, s in zip(srows["rank"], srows["start_us"])}
        end = {int(r): float(e) - offsets.get(int(r), 0.0)
               for r, e in zip(srows["rank"], srows["end_us"])}
        ranks = set(start)
        lo, hi = min(start.values()), max(end.values())
        m = members[(members["end_us"] > lo) & (members["start_us"] < hi)
                    & members["rank"].isin(ranks)]
        joins = []
        issued: dict = {}
        for key, (rs, starts, ends_, issues, streams) in _members_by_instance(m):
            # a join lies inside every member's step, or it belongs to no one step
            if not all(start[r] - BLOCKED_TOL_US <= a and e <= end[r] + BLOCKED_TOL_US
                       for r, a, e in zip(rs, starts, ends_)):
                straddling.add(key)
                continue
            arrival = dict(zip(rs, starts))
            ends = dict(zip(rs, ends_))
            began = {r: blocked_at(parts[r][1], ends[r]) for r in rs}
            waited = [r for r in rs if began[r] is not None]
            late = {r for r in waited if parts[r][3].launched_after(ends[r] + parts[r][4])}
            blocked = frozenset(r for r in waited if r not in late)
            # a member that computed beside the op began to wait only later
            since = {r: began[r] for r in blocked if began[r] > arrival[r] + WAIT_BEGAN_US}
            op = meta["op"][key] if meta is not None else "?"
            group = meta["group"][key] if meta is not None else ""
            pg = meta["pg"][key] if meta is not None else ""
            dim = by_group.get(group) or by_name.get(pg) or (
                "pp" if is_p2p_key(key) else "world" if len(rs) == len(parts)
                else "other")
            joins.append(Join(str(key), op, dim, arrival, ends, blocked, frozenset(late),
                              waited_from=since))
            issued[str(key)] = dict(zip(rs, zip(issues, streams)))
        joins = stream_order(free_senders(joins, issued), issued)
        joins.sort(key=lambda j: (j.last_arrival, j.instance))
        ks = {r: iv.clip(parts[r][0], start[r], end[r]) for r in ranks}
        ds = {r: iv.clip(parts[r][2], start[r], end[r]) for r in ranks}
        graphs.append(StepGraph(int(step), start, end, tuple(joins), ks, ds))
    if straddling:
        notes.append(f"{len(straddling)} communication instance(s) reach outside a member's step "
                     f"window: no join of any step (their time is that rank's work)")
    return graphs, notes


def _members_by_instance(m: pd.DataFrame):
    """``(instance, (ranks, start_us, end_us, issue_us))`` for each instance of ``m`` (rows of
    :attr:`SyncResult.per_rank`) in order of first appearance, its members in row order
    (``groupby("instance", sort=False)``'s groups, as lists of int and float)."""
    codes, keys = pd.factorize(m["instance"])
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(keys) + 1))
    rank = m["rank"].to_numpy()[order].astype(int).tolist()
    start = m["start_us"].to_numpy(dtype=float)[order].tolist()
    end = m["end_us"].to_numpy(dtype=float)[order].tolist()
    issue = (m["issue_us"].to_numpy(dtype=float)[order].tolist() if "issue_us" in m
             else [np.nan] * len(end))
    stream = (m["stream"].to_numpy(dtype=object)[order].tolist() if "stream" in m
              else [None] * len(end))
    for j, key in enumerate(keys):
        lo, hi = int(bounds[j]), int(bounds[j + 1])
        yield key, (rank[lo:hi], start[lo:hi], end[lo:hi], issue[lo:hi], stream[lo:hi])


def _walk(g: StepGraph) -> list[dict]:
    """The path of one step, latest segment first."""
    rank = max(g.end, key=lambda r: (g.end[r], -r))
    t = g.end[rank]
    out: list[dict] = []
    for _ in range(4 * len(g.joins) + len(g.end) + 2):
        # the rank's last anchor before t: the work since then is on the path
        anchor, join = g.start[rank], None
        for a, j in g.anchors(rank):
            if a <= t + 1e-6:
                anchor, join = a, j
        comp, data, other = g.work(rank, anchor, t)
        if t > anchor:
            out.append({"step": g.step, "rank": rank, "start_us": anchor, "end_us": t,
                        "kind": "work", "compute_us": comp, "data_loading_us": data,
                        "other_us": other, "op": None, "dim": None, "instance": None})
        if join is None:
            break
        last = join.last
        # a join that ends before its last arrival on the aligned clocks (their residual
        # error): the path goes on from the join's end, so it never runs back in time and
        # counts the same span twice (a path longer than its step)
        a_last = min(join.last_arrival, anchor)
        out.append({"step": g.step, "rank": rank, "start_us": a_last, "end_us": anchor,
                    "kind": "communication", "compute_us": 0.0, "data_loading_us": 0.0,
                    "other_us": 0.0,
                    "op": join.op, "dim": join.dim, "instance": join.instance})
        rank, t = last, a_last
    for row in out:
        row["dur_us"] = max(0.0, row["end_us"] - row["start_us"])
    return out


def _slack(g: StepGraph) -> dict[int, float]:
    """Per rank: the least, over its joins, of the last arrival less its own, and the step's
    latest end less its own end (µs)."""
    t_end = max(g.end.values())
    out = {r: t_end - e for r, e in g.end.items()}
    for j in g.joins:
        last = j.last_arrival  # once per join: a max over its ranks
        for r, a in j.arrival.items():
            out[r] = min(out[r], last - a)
    return out


#: A rank's time outside computation exceeds its peers' in a step by at least this much (µs)
#: to count that step as one its delay holds in (:meth:`CriticalPathResult.outside_costs`).
OUTSIDE_MIN_US = 10.0


def _ranked_excess(per_step: dict[int, dict[int, float]]
                   ) -> tuple[dict[int, list[float]], dict[int, float], list[int]]:
    """Per rank, its excess over the other ranks' median in each step of ``per_step`` (step ->
    rank -> µs; :func:`~.peers.median_of_others`), the median of those excesses, and the ranks
    whose median excess is above 0, the most first (ties by rank)."""
    excess: dict[int, list[float]] = {}
    for c in per_step.values():
        if len(c) < 2:
            continue
        ranks = list(c)
        vals = np.array([c[r] for r in ranks], dtype=float)[None, :]
        # every rank's excess at once: the others' median of n ranks in O(n log n)
        for r, x in zip(ranks, (vals - median_of_others(vals))[0]):
            excess.setdefault(r, []).append(float(x))
    med = {r: float(np.median(v)) for r, v in excess.items()}
    return excess, med, sorted((r for r, v in med.items() if v > 0), key=lambda r: (-med[r], r))


def _costs_table(rows: list[dict]) -> pd.DataFrame:
    """Delay-cost rows as :data:`DELAY_COLUMNS`, the most cost first (ties by rank)."""
    out = pd.DataFrame(rows, columns=list(DELAY_COLUMNS))
    return out.sort_values(["delay_cost_us", "rank"], ascending=[False, True],
                           kind="stable").reset_index(drop=True)


def _window_row(graphs: list[StepGraph], r: int, per_step: dict[int, dict], excess: list[float],
                med: float, what: str) -> dict:
    """One row of :data:`DELAY_COLUMNS`: what rank ``r``'s time ``per_step`` (step -> rank ->
    µs) costs the chained replay of ``graphs`` (:func:`chain_us`) when scaled to
    the other ranks' median in each step (``what``: ``"work"`` its whole work, ``"other"`` its
    time outside computation), per step. ``excess``: its excess per step, ``med`` their median.
    n device windows hold n - 1 step boundaries: a delay before each step's first launch shows
    in n - 1 of them (the first step's lies before the window); a host's windows hold their own.
    """
    scales: dict[int, dict] = {}
    for g in graphs:
        c = per_step[g.step]
        peers = [x for q, x in c.items() if q != r]
        if r in c and peers and c[r] > 0:
            scales[g.step] = {r: min(1.0, float(np.median(peers)) / c[r])}
    n = len(excess)
    held = int(sum(x >= OUTSIDE_MIN_US for x in excess))
    steps = n if held == n else max(1, n - 1)
    cost = max(0.0, chain_us(graphs) - chain_us(graphs, **{f"{what}_scale": scales})) / steps
    return {"rank": r, "steps": steps, "steps_costly": min(held, steps),
            "excess_compute_us": med, "delay_cost_us": cost, "delay_cost_iqr_us": 0.0}


def compute_critical_path(traces: TraceSet, breakdown: TimeBreakdown, sync: SyncResult,
                          layout: LayoutResult, comm_patterns=()) -> CriticalPathResult:
    """The critical path, slack and replay of every profiled step (see the module docstring).

    Args:
        traces: the run; breakdown: its time breakdown (step windows); sync: its matched
            instances and clock offsets; layout: its groups' dimensions; comm_patterns: the
            ``--comm-kernel`` patterns the breakdown used.
    """
    if breakdown.steps is None or breakdown.steps.empty:
        return _empty("no profiler steps: a path is drawn per step")
    graphs, notes = _graphs(traces, breakdown, sync, layout, comm_patterns)
    if not graphs:
        return _empty("no profiler steps: a path is drawn per step", notes)
    tot = breakdown.totals
    if (len(traces.ranks) > 1 and not any(g.joins for g in graphs) and tot is not None
            and len(tot) and not (tot["comm_us"].fillna(0) > 0).any()):
        # no rank communicates: nothing ties one rank's time to another's, a path across
        # ranks would be each rank's own time, and a late start no wait
        return _empty("the ranks communicate in none of their profiled steps (no collective, "
                      "no send or receive): they ran as independent processes, and no rank "
                      "waited for another", notes)
    segs, step_rows, slack_rows = [], [], []
    for g in graphs:
        path = _walk(g)
        segs += path
        lo, hi = min(g.start.values()), max(g.end.values())
        replay = replay_end(g, {}, {})
        path_us = sum(s["dur_us"] for s in path)
        step_rows.append({"step": g.step, "start_us": lo, "end_us": hi, "measured_us": hi - lo,
                          "path_us": path_us, "replay_us": replay - lo,
                          "replay_error_pct": 100.0 * (replay - hi) / (hi - lo)
                          if hi > lo else np.nan, "joins": len(g.joins)})
        on = {s["rank"] for s in path}
        for r, v in _slack(g).items():
            slack_rows.append({"rank": r, "step": g.step, "slack_us": max(0.0, v),
                               "on_path": r in on})
    segments = pd.DataFrame(segs, columns=list(SEGMENT_COLUMNS))
    sl = pd.DataFrame(slack_rows)
    slack = (sl.groupby("rank").agg(steps=("step", "nunique"), slack_us=("slack_us", "median"),
                                    on_path_steps=("on_path", "sum")).reset_index()
             if len(sl) else pd.DataFrame(columns=list(SLACK_COLUMNS)))
    slack["on_path_steps"] = slack["on_path_steps"].astype(int)
    inst = sync.instances
    heads = (frozenset(int(s) for s in inst.loc[inst["head"].astype(bool), "step"].dropna())
             if len(inst) and "head" in inst and "step" in inst else frozenset())
    out = CriticalPathResult(segments, pd.DataFrame(step_rows, columns=list(STEP_COLUMNS)),
                             _shares(segments), slack[list(SLACK_COLUMNS)], tuple(notes), "",
                             tuple(graphs), head_steps=heads)
    return dataclasses.replace(out, delay_costs=out._delay_costs())


def _shares(segments: pd.DataFrame) -> pd.DataFrame:
    """The path's time by part: computation, data loading and the rest per rank,
    communication per dim."""
    if segments.empty:
        return pd.DataFrame(columns=list(SHARE_COLUMNS))
    total = float(segments["dur_us"].sum())
    rows = []
    work = segments[segments["kind"] == "work"]
    for r, g in work.groupby("rank", sort=True):
        rows.append({"part": "compute", "rank": int(r), "dim": None,
                     "us": float(g["compute_us"].sum())})
        if g["data_loading_us"].sum() > 0:
            rows.append({"part": "data loading", "rank": int(r), "dim": None,
                         "us": float(g["data_loading_us"].sum())})
        rows.append({"part": "other", "rank": int(r), "dim": None,
                     "us": float(g["other_us"].sum())})
    comm = segments[segments["kind"] == "communication"]
    for d, g in comm.groupby("dim", sort=True):
        rows.append({"part": "communication", "rank": None, "dim": str(d),
                     "us": float(g["dur_us"].sum())})
    out = pd.DataFrame(rows, columns=list(SHARE_COLUMNS[:-1]))
    out["rank"] = out["rank"].astype("Int64")   # none on communication's rows
    out["share_pct"] = 100.0 * out["us"] / total if total > 0 else np.nan
    return out.sort_values("us", ascending=False, kind="stable").reset_index(drop=True)
