"""The step without a significant straggler."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ....analyses.causes import PART_LABELS
from ....per_rank.summary import summary_of
from ....trace import intervals as iv
from ....trace.traceset import TraceSet
from ..context import RuleContext, ms
from ..findings import identify_straggler
from ..types import Recommendation

#: What-ifs that read events of each rank (idle waiting) read at most this many.
SAMPLE_RANKS = 8


def _idle_waits(traces: TraceSet, sync, last: int, waiting: list[int]) -> dict[int, float]:
    """Per rank of ``waiting``: how long (µs, all steps) it sat idle waiting for rank ``last``
    to arrive — the union of its waiting intervals (arrival → last arrival) at the collectives
    ``last`` arrived at last, less the time it computed meanwhile (an asynchronous collective,
    such as a DDP bucket, is waited for while the backward goes on)."""
    inst = sync.instances[["instance", "last_rank"]]
    pr = sync.per_rank.merge(inst, on="instance")
    if "evidence" in pr:  # a window's head and ops of unknown kind say nothing of lateness
        pr = pr[pr["evidence"].astype(bool)]
    pr = pr.assign(until=pr.groupby("instance")["start_us"].transform("max"))
    pr = pr[(pr["last_rank"] == last) & pr["rank"].isin(waiting)]
    offsets = dict(zip(sync.offsets["rank"], sync.offsets["offset_us"]))
    out = {}
    for rank, rows in pr.groupby("rank"):
        waits = iv.union(rows["start_us"].to_numpy(), rows["until"].to_numpy())
        trace = traces.ranks.get(rank)
        if trace is not None and len(waits):
            k = summary_of(trace, []).parts.k
            if len(k):   # compute intervals on the rank's clock → the corrected clock
                waits = iv.subtract(waits, k - float(offsets.get(rank, 0.0)))
        out[int(rank)] = iv.total(waits)
    return out


def _excess_idle(steps: pd.DataFrame, r: int, others: list[int]) -> float | None:
    """How much longer rank ``r`` idles per step than the other ranks (µs): its median idle
    time over steps less the median of theirs, from the time breakdown's per-step rows
    (``idle_us``: neither computing nor communicating); None without rows for them."""
    if not len(steps):
        return None
    med = steps.groupby("rank")["idle_us"].median()
    theirs = [float(med[o]) for o in others if o in med.index]
    return None if r not in med.index or not theirs else float(med[r]) - float(np.median(theirs))


def straggler(ctx: RuleContext) -> list[Recommendation]:
    """The step without the run's straggler *r* (:func:`identify_straggler`): the step less
    what its delay costs the others per step — the time they sat idle waiting for it
    (:func:`_idle_waits`, mean over them) less what *r* waited for them.

    On CPU traces at most *r*'s own extra idle time (no op, no collective: data loading, host
    load, a sleep) beyond the other ranks' median (:func:`_excess_idle`): a rank's op times
    follow the host's state, not its work — with the planted 20 ms sleep the straggler's ops ran
    3.9 ms slower than the other rank's (1.2 ms without the sleep), so the others' waiting
    (23.8 ms) overstated the 19.3 ms that removing the sleep saved. On GPU traces a rank's step
    window starts at its first kernel, so a late start is not in its own idle time: the others'
    waiting is used as it is.

    At most :data:`SAMPLE_RANKS` other ranks are read (their compute intervals)."""
    traces, sync, measured = ctx.traces, ctx.sync, ctx.measured_us
    if ctx.model is not None:
        return []   # a pipeline's changes are replayed on its schedule instead
    found = identify_straggler(ctx)
    if found is None or sync is None:   # (a straggler is found from the sync analysis)
        return []
    steps = ctx.breakdown.steps
    n_steps = max(int(steps["step"].nunique()), 1) if len(steps) else 1
    inst = sync.instances
    if "evidence" in inst and "step" in inst:
        # the waits are read at the instances that are evidence only (a window's head left
        # out): per step of those, not of every profiled step (a head step's third was lost)
        ev = inst.loc[inst["evidence"].astype(bool), "step"]
        n_steps = max(int(ev[ev >= 0].nunique()), 1) if len(ev) else n_steps
    r = found.rank
    others = sorted(int(x) for x in traces.ranks if int(x) != r)[:SAMPLE_RANKS]
    idle = _idle_waits(traces, sync, r, others)
    own = sum(_idle_waits(traces, sync, o, [r]).get(r, 0.0) for o in others) / len(others)
    caused = (float(np.mean([idle.get(o, 0.0) for o in others])) - own) / n_steps
    if not (caused > 0) or not (measured > 0):
        return []
    on_gpu = ctx.on_gpu
    idle_x = None if on_gpu else _excess_idle(steps, r, others)
    saving = caused if idle_x is None else min(caused, max(idle_x, 0.0))
    cost = found.delay_cost_us
    replayed = cost is not None
    if cost is not None:
        # named by its delay cost: the execution graph's replay is the prediction (the others'
        # waiting for it holds the schedule's bubble too, and overstates it)
        saving = float(cost)
    if not (saving > 0):
        return []
    comp = ctx.balance.per_rank if ctx.balance is not None else pd.DataFrame()
    ev = [f"rank {r} arrives last at {found.last_arrivals} of {found.instances} collective(s); "
          f"the other ranks sit idle {caused / 1000:.2f} ms per step waiting for it (median "
          f"step {ms(measured)})"]
    if idle_x is not None:
        ev.append(f"rank {r} is idle (no op, no collective) {idle_x / 1000:.2f} ms per step "
                  f"more than the others (median)")
    cause = found.cause
    if cause is not None:
        ev.append(cause.sentence())
        extra = sorted(((v, p) for p, v in cause.parts.items()
                        if not math.isnan(v) and abs(v) >= 100.0), reverse=True)
        if extra:
            ev.append(f"rank {r}'s time per step beyond its peers' (median): " + ", ".join(
                f"{PART_LABELS[p]} {v / 1000:+.2f} ms" for v, p in extra[:6]))
    # its operators' time only when they are the cause (or none is known): a planted sleep
    # lies outside any operator, and there its ops' times follow the host, not its work
    operators_cause = cause is None or cause.part in (None, "forward_us", "backward_us",
                                                      "optimizer_us", "dev_compute_us")
    if len(comp) and operators_cause:
        c = comp.groupby("rank")["compute_us"].median()
        if r in c.index and len(c) > 1:
            ev.append(f"rank {r} computes {c[r] / 1000:.2f} ms per step, the others "
                      f"{c.drop(r).median() / 1000:.2f} ms (median)")
    ev.append(found.describe() + f" ({found.criterion}: the straggler criterion it meets)")
    how = ("its extra computation, by replay of the execution graph (each step's graph "
           "with its computation cut to its peers' median)" if replayed else
           "the others' waiting for it" if idle_x is None else
           "its extra idle time, at most the others' waiting for it (on CPU its op times "
           "follow the host, not its work)")
    if replayed:
        ev.append(f"predicted by replay of the execution graph: with rank {r}'s computation cut "
                  f"to its peers' median, each step ends {saving / 1000:.2f} ms earlier "
                  f"(median; its delay cost), where the others' waiting for it is "
                  f"{caused / 1000:.2f} ms per step")
    pred = max(measured - saving, 0.0)
    clean = ctx.clean
    if idle_x is not None and not replayed and clean is not None and clean.median_us > 0:
        # time outside any operator (a sleep, data loading) is not slowed by the profiler, as
        # the profiled steps' operators are: stated against the unprofiled step (the
        # recommendations restate every prediction as a ratio of it), the saving is the same
        # µs, not the same share — as a share it kept half of a planted 20 ms sleep
        pred = max(measured - saving * measured / clean.median_us, 0.0)
        ev.append(f"the time saved lies outside any operator, which the profiler does not slow "
                  f"down: {saving / 1000:.2f} ms of the unprofiled step too")
    look_at = (cause.advice() if cause is not None
               else "what delays it: host load, data loading, a slower device or link")
    return [Recommendation(
        kind="straggler", title=f"Rank {r} is a straggler",
        change=f"if rank {r} were not slow (look at {look_at})",
        evidence=tuple(ev), caveats=(f"the prediction removes {how}; a second straggler "
                                     f"would then show",),
        measured_step_us=measured, predicted_step_us=pred,
        params={"without_rank": r})]
