"""The step without a significant straggler."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ....trace import intervals as iv
from ....analyses.breakdown import rank_parts
from ....analyses.causes import PART_LABELS, StragglerCause, straggler_cause
from ..context import RuleContext, ms, run_step_row
from ..types import Recommendation
from ....trace.traceset import TraceSet

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


#: A rank that idles (no op, no collective) this share of the step or more per step beyond
#: the other ranks' median, in most steps, is a straggler however many collectives it is last
#: at (%).
STRAGGLER_IDLE_PCT = 5.0
#: … in at least this share of the steps (and 2 or more steps).
STRAGGLER_STEP_SHARE = 0.8
#: In a pipeline ranks idle in the schedule's bubble by design (the last stage idled 8–13% of
#: the profiled step longer than the first on the unplanted examples; a planted 20 ms sleep:
#: 24%): there a straggler must idle this share of the step longer (%).
STRAGGLER_IDLE_PCT_PIPELINE = 20.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class StragglerFinding:
    """A rank that slows the others down, and the criterion it met.

    Attributes:
        rank: the straggler.
        criterion: ``"arrives last"`` (it is last at ≥ :data:`STRAGGLER_LAST_SHARE` of ≥ 3
            collectives and causes ≥ :data:`STRAGGLER_RATIO` × the waiting it suffers; on CPU
            traces it also idles ≥ :data:`STRAGGLER_IDLE_PCT` % of the step more than the
            others, as op times there follow the host's load) or
            ``"idles longer"`` (it idles ≥ :data:`STRAGGLER_IDLE_PCT` % of the step per step
            more than the other ranks' median, in ≥ :data:`STRAGGLER_STEP_SHARE` of ≥ 2 steps,
            and, outside pipelines, causes more waiting than it suffers; in a pipeline ≥
            :data:`STRAGGLER_IDLE_PCT_PIPELINE` %, and the waiting is the bubble's).
        last_arrivals, instances: collectives it arrived last at, of those it joined.
        wait_caused_us, wait_suffered_us: waiting it caused the others / suffered (µs, all
            steps; :attr:`pardiag.analyzer.analyses.sync.SyncResult.stragglers`).
        excess_idle_us: median over steps of its idle time less the other ranks' median in the
            same step (µs per step); None without per-step rows.
        steps_over, steps: steps in which it idled longer than the others' median, of all.
        cause: why it is slow (:func:`pardiag.analyzer.analyses.causes.straggler_cause`): where its
            delay arises (step entry or in the step) and the part it spends longer on than its
            peers; None without the causes analysis.
    """

    rank: int
    criterion: str
    last_arrivals: int
    instances: int
    wait_caused_us: float
    wait_suffered_us: float
    excess_idle_us: float | None
    steps_over: int
    steps: int
    cause: StragglerCause | None = None

    def describe(self) -> str:
        """``"rank 1 is a straggler: it idles 30.1 ms per step more than the others (in 9 of 9
        steps)"`` or ``"…: it arrives last at 40 of 45 collectives"``."""
        if self.criterion == "idles longer":
            how = (f"it idles {self.excess_idle_us / 1000:.1f} ms per step more than the others "
                   f"(in {self.steps_over} of {self.steps} steps)")
        else:
            how = f"it arrives last at {self.last_arrivals} of {self.instances} collectives"
        return f"rank {self.rank} is a straggler: {how}"


def _excess_idle_by_step(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank and step: ``excess_us``, its idle time less the median idle time of the other
    ranks in that step (µs). Rows of steps that only one rank has are left out."""
    if steps is None or steps.empty or steps["rank"].nunique() < 2:
        return pd.DataFrame(columns=["rank", "step", "excess_us"])
    idle = steps.pivot_table(index="step", columns="rank", values="idle_us", aggfunc="sum")
    idle = idle.dropna()
    rows = []
    for r in idle.columns:
        others = idle.drop(columns=r).median(axis=1)
        for st, v in (idle[r] - others).items():
            rows.append({"rank": int(r), "step": int(st), "excess_us": float(v)})
    return pd.DataFrame(rows, columns=["rank", "step", "excess_us"])


def identify_straggler(ctx: RuleContext) -> StragglerFinding | None:
    """The run's straggler, when one rank meets :class:`StragglerFinding`'s criteria; None
    when none does (waiting that is about symmetric names nobody). In a pipeline only the idle
    criterion applies, at :data:`STRAGGLER_IDLE_PCT_PIPELINE`: waiting for the neighbour stage
    is its bubble. Idle time is compared with the profiled step it was measured in."""
    sync = ctx.sync
    if (sync is None or len(ctx.traces.ranks) < 2 or sync.stragglers is None
            or sync.stragglers.empty):
        return None
    table = sync.stragglers.set_index("rank")
    ex = _excess_idle_by_step(ctx.breakdown.steps)
    row = run_step_row(ctx.breakdown)
    step_us = float(row["median_us"]) if row is not None else float("nan")
    pipeline = ctx.model is not None or (ctx.pipeline is not None and len(ctx.pipeline.chunks))

    def finding(r: int, criterion: str) -> StragglerFinding:
        row = table.loc[r] if r in table.index else None
        mine = ex[ex["rank"] == r]["excess_us"]
        return StragglerFinding(
            rank=r, criterion=criterion,
            last_arrivals=int(row["last_arrivals"]) if row is not None else 0,
            instances=int(row["instances"]) if row is not None else 0,
            wait_caused_us=float(row["wait_caused_us"]) if row is not None else 0.0,
            wait_suffered_us=float(row["wait_suffered_us"]) if row is not None else 0.0,
            excess_idle_us=float(mine.median()) if len(mine) else None,
            steps_over=int((mine > 0).sum()), steps=int(len(mine)),
            cause=straggler_cause(ctx.causes, ctx.balance.skew if ctx.balance is not None
                                  else None, r) if ctx.causes is not None else None)

    # arrives last most of the time and makes the others wait far more than it waits; on CPU
    # also idles longer: there a rank's op times follow the host's load (two ranks on two
    # cores), so slower ops alone are contention, not a slow rank
    st = sync.stragglers.iloc[0]
    if (not pipeline and st["instances"] >= 3 and st["last_arrivals"] >= STRAGGLER_LAST_SHARE * st["instances"]
            and st["wait_caused_us"] >= STRAGGLER_RATIO * st["wait_suffered_us"]
            and st["wait_caused_us"] > 0):
        f = finding(int(st["rank"]), "arrives last")
        if ctx.on_gpu or (f.excess_idle_us is not None and step_us > 0
                          and f.excess_idle_us >= STRAGGLER_IDLE_PCT / 100.0 * step_us):
            return f
    # idles longer than its peers step after step, however many collectives the step has
    if len(ex) and step_us > 0:
        med = ex.groupby("rank")["excess_us"].median().sort_values(ascending=False)
        r = int(med.index[0])
        f = finding(r, "idles longer")
        pct = STRAGGLER_IDLE_PCT_PIPELINE if pipeline else STRAGGLER_IDLE_PCT
        # in a pipeline the waiting a rank causes or suffers is the schedule's bubble: a slow
        # first stage makes the last one wait whatever the last one does (under a second
        # suite's load a last stage that slept 40 ms per step suffered 180 ms of waiting and
        # caused 63), so there the idle time alone decides; it is neither an op nor a transfer
        if (f.steps >= 2 and f.excess_idle_us >= pct / 100.0 * step_us
                and f.steps_over >= STRAGGLER_STEP_SHARE * f.steps
                and (pipeline or f.wait_caused_us > f.wait_suffered_us)):
            return f
    return None


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
    if found is None:
        return []
    steps = ctx.breakdown.steps
    n_steps = max(int(steps["step"].nunique()), 1) if len(steps) else 1
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
        extra = sorted(((v, p) for p, v in cause.parts.items() if v == v and abs(v) >= 100.0),
                       reverse=True)
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
    how = ("the others' waiting for it" if idle_x is None else
           "its extra idle time, at most the others' waiting for it (on CPU its op times "
           "follow the host, not its work)")
    pred = max(measured - saving, 0.0)
    return [Recommendation(
        kind="straggler", title=f"Rank {r} is a straggler", change=f"if rank {r} were not slow "
        f"(look at {cause.advice() if cause is not None else 'what delays it: host load, data loading, a slower device or link'})",
        evidence=tuple(ev), caveats=(f"the prediction removes {how}; a second straggler "
                                     f"would then show",),
        measured_step_us=measured, predicted_step_us=pred,
        params={"without_rank": r})]
