"""The step without a significant straggler."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pardiag.analyzer import intervals as iv
from pardiag.analyzer.breakdown import rank_parts
from pardiag.analyzer.recommend.context import RuleContext, ms
from pardiag.analyzer.recommend.types import Recommendation
from pardiag.analyzer.traceset import TraceSet

#: What-ifs that read events of each rank (idle waiting) read at most this many.
SAMPLE_RANKS = 8
#: A straggler arrives last at this share of its collectives or more …
STRAGGLER_LAST_SHARE = 0.6
#: … and causes this many times the waiting it suffers.
STRAGGLER_RATIO = 4.0


def _idle_waits(traces: TraceSet, sync, last: int, waiting: list[int]) -> dict[int, float]:
    """Per rank of ``waiting``: how long (µs, all steps) it sat idle waiting for rank ``last``
    to arrive — the union of its waiting intervals (arrival → last arrival) at the collectives
    ``last`` arrived at last, less the time it computed meanwhile (an asynchronous collective,
    such as a DDP bucket, is waited for while the backward goes on)."""
    inst = sync.instances[["instance", "last_rank"]]
    pr = sync.per_rank.merge(inst, on="instance")
    pr = pr.assign(until=pr.groupby("instance")["start_us"].transform("max"))
    pr = pr[(pr["last_rank"] == last) & pr["rank"].isin(waiting)]
    offsets = dict(zip(sync.offsets["rank"], sync.offsets["offset_us"]))
    out = {}
    for rank, rows in pr.groupby("rank"):
        waits = iv.union(rows["start_us"].to_numpy(), rows["until"].to_numpy())
        trace = traces.ranks.get(rank)
        if trace is not None and len(waits):
            k = rank_parts(trace, [], None).k
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
    """The step without a significant straggler *r*: the step less what its delay costs the
    others per step — the time they sat idle waiting for it (:func:`_idle_waits`, mean over
    them) less what *r* waited for them.

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
        return []   # in a pipeline, waiting for the neighbour stage is the bubble
    if sync is None or sync.straggler is None or len(traces.ranks) < 2:
        return []
    st = sync.stragglers.iloc[0]
    steps = ctx.breakdown.steps
    n_steps = max(int(steps["step"].nunique()), 1) if len(steps) else 1
    # a straggler arrives last most of the time and makes others wait far more than it waits
    if (st["instances"] < 3 or st["last_arrivals"] < STRAGGLER_LAST_SHARE * st["instances"]
            or st["wait_caused_us"] < STRAGGLER_RATIO * st["wait_suffered_us"]):
        return []
    r = int(st["rank"])
    others = sorted(int(x) for x in traces.ranks if int(x) != r)[:SAMPLE_RANKS]
    idle = _idle_waits(traces, sync, r, others)
    own = sum(_idle_waits(traces, sync, o, [r]).get(r, 0.0) for o in others) / len(others)
    caused = (float(np.mean([idle.get(o, 0.0) for o in others])) - own) / n_steps
    if not (caused > 0) or not (measured > 0):
        return []
    on_gpu = ctx.on_gpu
    idle_x = None if on_gpu else _excess_idle(steps, r, others)
    saving = caused if idle_x is None else min(caused, max(idle_x, 0.0))
    if not (saving > 0):
        return []
    comp = ctx.balance.per_rank if ctx.balance is not None else pd.DataFrame()
    ev = [f"rank {r} arrives last at {int(st['last_arrivals'])} collective(s); the other ranks "
          f"sit idle {caused / 1000:.2f} ms per step waiting for it (median step "
          f"{ms(measured)})"]
    if idle_x is not None:
        ev.append(f"rank {r} is idle (no op, no collective) {idle_x / 1000:.2f} ms per step "
                  f"more than the others (median)")
    if len(comp):
        c = comp.groupby("rank")["compute_us"].median()
        if r in c.index and len(c) > 1:
            ev.append(f"rank {r} computes {c[r] / 1000:.2f} ms per step, the others "
                      f"{c.drop(r).median() / 1000:.2f} ms (median)")
    how = ("the others' waiting for it" if idle_x is None else
           "its extra idle time, at most the others' waiting for it (on CPU its op times "
           "follow the host, not its work)")
    pred = max(measured - saving, 0.0)
    return [Recommendation(
        kind="straggler", title=f"Rank {r} is a straggler", change=f"if rank {r} were not slow "
        f"(find what delays it: host load, data loading, a slower device or link)",
        evidence=tuple(ev), caveats=(f"the prediction removes {how}; a second straggler "
                                     f"would then show",),
        measured_step_us=measured, predicted_step_us=pred,
        params={"without_rank": r})]
