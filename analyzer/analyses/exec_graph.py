"""The execution graph of one profiled step, and its replay.

What ran, not what a schedule's name says: per rank its step window, its computation and data
loading, and the *joins* that tie ranks together (every complete instance of more than one rank
the matching found: a collective, or a send and its receive), each with its members' arrivals
and ends on the aligned clock.

* **blocked**: a member is blocked at a join when its exposed communication (communication not
  under its own computation) runs up to the instance's end: its next work starts at that end.
  A member that computed meanwhile (an async all-reduce under the backward) is not blocked.
  A GPU member whose next computation its host launched only after the end, while the host
  waited for no device work across it, is *launch-bound*: its time runs on from its host's work.
* **stream order**: a member whose kernel started more than :data:`STREAM_WAIT_US` after its
  launch waited on its stream, behind the op of another join on the same stream that ended as
  it started (:func:`stream_order`): in a replay it starts when that op ends, or once launched.
* **release**: a join ends for all its members after its last member has arrived; the transfer
  is the time from that last arrival to each member's end (per member, measured).
* **work**: on each rank, the time from its previous blocked join's end (or its step's start) to
  its next arrival or its step's end; split into its computation, its data loading and the rest
  (host work, launches, idle, communication it did not wait for).

**Replay** (:func:`replay_ends`) recomputes the step from the graph after scaling chosen work (a
rank's computation, its time outside computation, all its work; a dimension's transfers):
arrivals move with the work before them, each join's release with its last arrival, each blocked
member's next work with the release. The unchanged graph reproduces the measured step (a check
of the graph, not a prediction). This is the model of Lumos (Liang et al., Lumos: Efficient
Performance Modeling and Estimation for Large-scale LLM Training: a dependency graph rebuilt
from per-rank traces, replayed, and edited for what-ifs) at the granularity of communication
ops, not kernels. :func:`chain_us` replays consecutive steps one after the other and
:func:`period_us` one step as if it repeated.
"""

from __future__ import annotations

import bisect
import dataclasses

import numpy as np
import pandas as pd

from ..trace import intervals as iv
from .instance_keys import p2p_sender

#: A member is blocked at a join when its exposed communication ends at most this long (µs)
#: before the instance's end (the wait that follows a gloo worker's op ends just after it).
BLOCKED_TOL_US = 20.0
#: A blocked member that began to wait this long (µs) after its arrival worked beside the op
#: until then (:attr:`Join.waited_from`).
WAIT_BEGAN_US = 1.0
#: A communication kernel that starts this long (µs) after its launch waited on its stream.
STREAM_WAIT_US = 20.0


@dataclasses.dataclass(frozen=True)
class Join:
    instance: str
    op: str
    dim: str
    arrival: dict          # rank -> arrival (µs, aligned clock)
    end: dict              # rank -> end (µs, aligned clock)
    blocked: frozenset     # ranks whose next work starts at their end
    # ranks that waited for it on the device but whose host launched their next work only
    # after its end: their next work starts at the later of the two (a replay that speeds up
    # their host makes them wait for the join)
    launch_bound: frozenset = frozenset()
    # ranks whose op here waited on its stream behind the op of another join that ended as it
    # started: rank -> (that join's instance, its end on the rank, when this op was issued)
    after: dict = dataclasses.field(default_factory=dict)
    # blocked ranks that worked on after their arrival (computation beside the op) and began
    # to wait only later: rank -> when that wait began (its next work starts no earlier than
    # its own timeline reaches that time, however early the join is released)
    waited_from: dict = dataclasses.field(default_factory=dict)

    @property
    def last(self) -> int:
        return max(self.arrival, key=lambda r: (self.arrival[r], -r))

    @property
    def last_arrival(self) -> float:
        return max(self.arrival.values())


@dataclasses.dataclass(frozen=True)
class StepGraph:
    """One step's graph: per rank its start and end (aligned clock), its joins in arrival order,
    its computation intervals and its data-loading intervals (aligned, clipped to the step,
    disjoint from each other)."""

    step: int
    start: dict            # rank -> start
    end: dict              # rank -> end
    joins: tuple           # Join, by last arrival
    k: dict                # rank -> computation intervals (aligned, clipped to the step)
    d: dict                # rank -> data-loading intervals (aligned, clipped, outside k)
    # per interval set of k and d, its starts and ends as lists (:func:`_inside`), made when
    # first asked for
    bounds: dict = dataclasses.field(default_factory=dict, init=False, compare=False,
                                     repr=False)

    def anchors(self, rank: int) -> list[tuple[float, Join | None]]:
        """The rank's anchors in time order: its step start (no join), then the end of each
        join it is blocked at."""
        out: list[tuple[float, Join | None]] = [(self.start[rank], None)]
        for j in self.joins:
            if rank in j.blocked:
                out.append((j.end[rank], j))
        return out

    def work(self, rank: int, lo: float, hi: float) -> tuple[float, float, float]:
        """(computation, data loading, the rest) of the rank's time ``[lo, hi]``, µs."""
        if hi <= lo:
            return 0.0, 0.0, 0.0
        comp = _inside(self.bounds, ("k", rank), self.k[rank], lo, hi)
        data = _inside(self.bounds, ("d", rank), self.d[rank], lo, hi)
        return comp, data, (hi - lo) - comp - data


def _inside(bounds: dict, key: tuple, ivs: np.ndarray, lo: float, hi: float) -> float:
    """``iv.total(iv.clip(ivs, lo, hi))`` bit for bit (µs), with the intervals that reach into
    ``[lo, hi)`` found by bisection on their starts and ends (kept in ``bounds`` under
    ``key``): none is 0, one is its clipped length, more are summed as :func:`iv.total` sums
    them. A replay of thousands of ranks asks this for every rank at every join, where numpy's
    cost per call on whole arrays took most of the report's time."""
    held = bounds.get(key)
    if held is None:
        held = bounds[key] = (ivs[:, 0].tolist(), ivs[:, 1].tolist())
    starts, ends = held
    a = bisect.bisect_right(ends, lo)     # the first interval ending after lo
    b = bisect.bisect_left(starts, hi)    # the first starting at or after hi
    if b <= a:
        return 0.0
    if b == a + 1:
        x = min(ends[a], hi) - max(starts[a], lo)
        return float(x) if x > 0 else 0.0
    return iv.total(iv.clip(ivs[a:b], lo, hi))


def _issued(issued: dict, instance: str, rank: int) -> tuple[float | None, object]:
    """``(issue time, stream)`` of ``rank``'s op in ``instance`` (``issued``: instance -> rank
    -> (issue time, stream)); the stream None where unknown (absent or NaN)."""
    t, stream = issued.get(instance, {}).get(rank, (None, None))
    return t, (None if stream is None or pd.isna(stream) else stream)


def free_senders(joins: list[Join], issued: dict) -> list[Join]:
    """``joins`` with a sender taken out of :attr:`Join.blocked` where another op explains its
    wait: a rank blocked at a send it issued and, at once (ends within :data:`BLOCKED_TOL_US`),
    at a join it did not send on another stream (a receive, a collective) waited for that one,
    when the step shows that the rank does not wait for its sends (it worked beside one of
    them: a send at which it was neither blocked nor launch-bound). A lockstep pipeline's
    stage ends its send to the next stage as the receive from it ends; without this, a replay
    that moves the rank earlier would hold it until the next stage took the send.
    ``issued``: instance -> rank -> (issue time, stream); streams unknown free nobody."""
    sender = {j.instance: p2p_sender(j.instance) for j in joins}
    free: dict[str, set] = {}
    for r in {r for j in joins for r in j.blocked}:
        sends = [j for j in joins if sender[j.instance] == r and r in j.arrival]
        if not any(r not in j.blocked | j.launch_bound for j in sends):
            continue
        stream = {j.instance: _issued(issued, j.instance, r)[1] for j in joins if r in j.arrival}
        known = {i: s for i, s in stream.items() if s is not None}
        others = sorted((j.end[r], known[j.instance]) for j in joins
                        if r in j.blocked and sender[j.instance] != r and j.instance in known)
        ends = [e for e, _ in others]
        for j in sends:
            s = known.get(j.instance)
            if r not in j.blocked or s is None:
                continue
            lo = bisect.bisect_left(ends, j.end[r] - BLOCKED_TOL_US)
            hi = bisect.bisect_right(ends, j.end[r] + BLOCKED_TOL_US)
            if any(o != s for _, o in others[lo:hi]):
                free.setdefault(j.instance, set()).add(r)
    return [dataclasses.replace(j, blocked=j.blocked - free[j.instance],
                                waited_from={r: t for r, t in j.waited_from.items()
                                             if r not in free[j.instance]})
            if j.instance in free else j for j in joins]


def stream_order(joins: list[Join], issued: dict) -> list[Join]:
    """``joins`` with :attr:`Join.after` set: a member whose kernel started more than
    :data:`STREAM_WAIT_US` after its launch waited on its stream; the op it waited behind is
    the rank's op of another join on the same stream that ended (within
    :data:`BLOCKED_TOL_US`) as it started, the latest such. ``issued``: instance -> rank ->
    (issue time, NaN where unknown; stream); none waited where the stream is not known."""
    ends: dict[int, list[tuple[float, float, str, object]]] = {}
    for j in joins:
        for r, e in j.end.items():
            ends.setdefault(r, []).append((e, j.arrival[r], j.instance,
                                           _issued(issued, j.instance, r)[1]))
    out = []
    for j in joins:
        after = {}
        for r, a in j.arrival.items():
            t, stream = _issued(issued, j.instance, r)
            if t is None or stream is None or not np.isfinite(t) or a - t <= STREAM_WAIT_US:
                continue
            prev = [(e, i) for e, s, i, st in ends[r]
                    if i != j.instance and st == stream and s < a
                    and a - BLOCKED_TOL_US <= e <= a + 1e-6]
            if prev:
                e, i = max(prev)
                after[r] = (i, e, float(t))
        out.append(dataclasses.replace(j, after=after) if after else j)
    return out


def blocked_at(exposed: np.ndarray, end: float) -> float | None:
    """When the rank's wait for an op ending at ``end`` (µs) began: the start of the exposed
    communication that runs up to ``end`` (the rank waited there), or None when none does."""
    if not len(exposed):
        return None
    # the last exposed interval that starts by the end (the next op's kernel may start a few
    # µs after it: a coalesced block's members run back to back)
    i = int(np.searchsorted(exposed[:, 0], end, side="right")) - 1
    return float(exposed[i, 0]) if i >= 0 and exposed[i, 1] >= end - BLOCKED_TOL_US else None


def _blocked_spans(g: StepGraph, r: int) -> np.ndarray:
    """The rank's blocked time at each join it waited at (µs, aligned; ``(n, 2)``): from when
    its wait began (:attr:`Join.waited_from`; its arrival where it waited at once) to the
    join's end. Work beside an op before the rank began to wait is work, not waiting."""
    return np.asarray([(j.waited_from.get(r, j.arrival[r]), j.end[r]) for j in g.joins
                       if r in j.blocked], dtype=float).reshape(-1, 2)


def work_us(g: StepGraph) -> dict[int, float]:
    """Per rank, its work in the step (µs, ≥ 0): its step window less the time it was blocked
    in joins (:func:`_blocked_spans`; joins that overlap, such as DDP's buckets in flight
    together, count once)."""
    out = {}
    for r in g.end:
        spans = _blocked_spans(g, r)
        blocked = iv.total(iv.clip(iv.union(*spans.T), g.start[r], g.end[r])) if len(
            spans) else 0.0
        out[r] = max(0.0, g.end[r] - g.start[r] - blocked)
    return out


def outside_us(g: StepGraph) -> dict[int, float]:
    """Per rank, its time in the step outside computation, data loading and joins it was
    blocked in (µs, ≥ 0): host work, launches, a sleep (computation that runs while the rank
    is blocked, such as kernels beside a transfer, counts once)."""
    out = {}
    for r in g.end:
        busy = np.concatenate([_blocked_spans(g, r), g.k[r].reshape(-1, 2),
                               g.d[r].reshape(-1, 2)])
        taken = iv.total(iv.clip(iv.union(busy[:, 0], busy[:, 1]), g.start[r], g.end[r]))
        out[r] = max(0.0, g.end[r] - g.start[r] - taken)
    return out


def replay_end(g: StepGraph, compute_scale: dict, comm_scale: dict,
               work_scale: dict | None = None, other_scale: dict | None = None) -> float:
    """The step's latest end (µs, aligned) replayed with scaled computation and transfers."""
    return max(replay_ends(g, compute_scale, comm_scale, work_scale,
                           other_scale=other_scale).values())


def replay_ends(g: StepGraph, compute_scale: dict, comm_scale: dict,
                work_scale: dict | None = None, starts: dict | None = None,
                other_scale: dict | None = None) -> dict:
    """Each rank's end of the step (µs, aligned) replayed with scaled computation and
    transfers (``work_scale``: a rank's whole work; ``other_scale``: its time outside
    computation and data loading), each rank starting at ``starts[rank]`` (default: where it
    started)."""
    # per rank, its anchors as [measured, replayed, wait began] times, in measured order: a time
    # on the rank moves with the latest anchor at or before it (joins are taken in order of their
    # last arrival, so every blocked join a rank's arrival follows has been replayed by then). An
    # anchor whose rank worked on beside the op until its wait began is no earlier than that
    # time moved: resolved when first used, once every anchor before that time is in place
    anchors = {r: [[s, s if starts is None else starts[r], None]] for r, s in g.start.items()}

    def anchor(r: int, t: float) -> tuple[float, float]:
        a = next((a for a in reversed(anchors[r]) if a[0] <= t + 1e-6), anchors[r][0])
        if a[2] is not None:
            x, a[2] = a[2], None
            a[1] = max(a[1], moved(r, x))
        return a[0], a[1]

    def moved(r: int, t: float) -> float:
        a_meas, a_new = anchor(r, t)
        comp, data, other = g.work(r, a_meas, t)
        if t < a_meas:   # before the rank's step start: nothing to scale
            return a_new + (t - a_meas)
        w = (work_scale or {}).get(r, 1.0)
        return (a_new + comp * compute_scale.get(r, 1.0) * w
                + (data + other * (other_scale or {}).get(r, 1.0)) * w)

    def add(r: int, t_meas: float, new: float, since: float | None) -> None:
        same = next((a for a in anchors[r] if a[0] == t_meas), None)
        if same is None:
            anchors[r].append([t_meas, new, since])
            anchors[r].sort(key=lambda a: a[0])
            return
        same[1] = max(same[1], new)   # joins that end together: the later release holds
        if since is not None:
            same[2] = since if same[2] is None else max(same[2], since)

    ended: dict = {}   # (instance, rank) -> replayed end
    for j in g.joins:
        arr = {}
        for r, a in j.arrival.items():
            w = j.after.get(r)
            if w is not None and (w[0], r) in ended:
                # queued on its stream: it starts when the op before it ends, or once issued
                arr[r] = max(moved(r, w[2]), ended[(w[0], r)] + (a - w[1]))
            else:
                arr[r] = moved(r, a)
        last_new, last_meas = max(arr.values()), j.last_arrival
        f = comm_scale.get(j.dim, 1.0)
        for r in j.arrival:
            ended[(j.instance, r)] = last_new + max(0.0, j.end[r] - last_meas) * f
        own = {r: moved(r, j.end[r]) for r in j.launch_bound}
        for r in j.blocked | j.launch_bound:
            release = last_new + max(0.0, j.end[r] - last_meas) * f
            add(r, j.end[r], max(release, own[r]) if r in own else release,
                j.waited_from.get(r))
    return {r: moved(r, e) for r, e in g.end.items()}


#: Repetitions of a step's graph replayed to find its steady period (:func:`period_us`).
PERIOD_ITERATIONS = 12


def chain_us(graphs: list[StepGraph], other_scale: dict[int, dict] | None = None,
             work_scale: dict[int, dict] | None = None) -> float:
    """The replayed length (µs) of the steps ``graphs`` (in step order) one after the other:
    each rank starts a step where it ended the step before in the replay, plus the measured gap
    between its windows; steps not consecutive start a new chain at their measured starts. The
    sum over chains. ``other_scale``, ``work_scale``: per step, :func:`replay_ends`' own."""
    total = t0 = 0.0
    ends: dict = {}
    for i, g in enumerate(graphs):
        prev = graphs[i - 1] if i else None
        if prev is None or g.step != prev.step + 1:
            if prev is not None:
                total += max(ends.values()) - t0
            starts = dict(g.start)
            t0 = min(starts.values())
        else:
            starts = {r: ends[r] + s - prev.end[r] if r in ends and r in prev.end else s
                      for r, s in g.start.items()}
        ends = replay_ends(g, {}, {}, (work_scale or {}).get(g.step), starts,
                            (other_scale or {}).get(g.step))
    if graphs:
        total += max(ends.values()) - t0
    return total


def period_us(g: StepGraph, compute_scale: dict, comm_scale: dict,
              work_scale: dict | None = None, other_scale: dict | None = None) -> float:
    """The step's steady period (µs): its graph replayed as if it repeated, each rank starting
    the next step where it ended this one (a rank's profiler steps follow each other), until
    every rank advances by the same time per step (or :data:`PERIOD_ITERATIONS` repetitions);
    the largest advance. Unlike one replay from the measured starts, the ranks' staggered
    starts are the replayed step's own: a rank that starts a step late because its last
    transfer of the step before ended late starts it less late when transfers are faster."""
    starts = dict(g.start)
    advance: dict = {}
    for _ in range(PERIOD_ITERATIONS):
        ends = replay_ends(g, compute_scale, comm_scale, work_scale, starts, other_scale)
        new = {r: ends[r] - starts[r] for r in ends}
        done = bool(advance) and max(abs(new[r] - advance[r]) for r in new) < 0.1
        advance, starts = new, ends
        if done:
            break
    return max(advance.values())
