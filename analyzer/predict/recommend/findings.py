"""What the verdict and the rules both conclude from the context: the run's straggler, if it
has one (:func:`identify_straggler`), by one set of criteria (:class:`StragglerFinding`).

The verdict names the rank; the straggler rule (:mod:`.rules.straggler`) predicts the step
without it. Rules never import each other: what two of them share lives here or in the context.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ...analyses.causes import StragglerCause, straggler_cause
from ...analyses.peers import median_of_others
from ...analyses.stragglers import p2p_share, straggler_by_delay_cost
from .context import RuleContext, run_step_row

#: A straggler arrives last at this share of its collectives or more …
STRAGGLER_LAST_SHARE = 0.6
#: … and causes this many times the waiting it suffers.
STRAGGLER_RATIO = 4.0
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
            :data:`STRAGGLER_IDLE_PCT_PIPELINE` %, and the waiting is the bubble's) or
            ``"causes the pipeline's waiting"`` (on GPU traces of a pipeline: the
            synchronization analysis names it, :attr:`pardiag.analyzer.analyses.sync.
            SyncResult.straggler`, because the waiting it causes directly or through the stages
            that wait for it is the most, and it computes more per step than every other rank)
            or ``"delays the pipeline"`` (on GPU traces of a pipeline: the synchronization
            analysis names it by its delay cost on the execution graph, ``delay_cost_us``) or
            ``"delays the job"`` (on GPU traces outside pipelines, where the waits name nobody:
            its delay cost on the execution graph dominates,
            :func:`pardiag.analyzer.analyses.stragglers.straggler_by_delay_cost`).
        last_arrivals, instances: collectives it arrived last at, of those it joined.
        wait_caused_us, wait_suffered_us: waiting it caused the others / suffered (µs, all
            steps; :attr:`pardiag.analyzer.analyses.sync.SyncResult.stragglers`).
        excess_idle_us: median over steps of its idle time less the other ranks' median in the
            same step (µs per step); None without per-step rows.
        steps_over, steps: steps in which it idled longer than the others' median, of all.
        delay_cost_us: the step time its extra work costs the job (µs per step, median; the
            execution graph's replay, :attr:`pardiag.analyzer.analyses.critical_path.
            CriticalPathResult.delay_costs`); None for the other criteria.
        outside: ``delay_cost_us`` is the cost of its time outside computation (host work, a
            sleep: :meth:`pardiag.analyzer.analyses.critical_path.CriticalPathResult.
            outside_costs`), not of its computation.
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
    delay_cost_us: float | None = None
    outside: bool = False

    def describe(self) -> str:
        """``"rank 1 is a straggler: it idles 30.1 ms per step more than the others (in 9 of 9
        steps)"`` or ``"…: it arrives last at 40 of 45 collectives"``."""
        if self.criterion in ("delays the pipeline", "delays the job"):
            assert self.delay_cost_us is not None  # what the criterion measured
            what = ("its time outside computation (host work, a sleep)" if self.outside
                    else "its computation")
            how = (f"the steps replayed with {what} cut to its peers' median end "
                   f"{self.delay_cost_us / 1000:.2f} ms earlier, and no other rank's saves a "
                   f"third of that")
        elif self.criterion == "causes the pipeline's waiting":
            how = (f"the other stages' waiting goes back to it ({self.wait_caused_us / 1000:.1f} "
                   f"ms, directly or through the stages that wait for it), and it computes "
                   f"longer per step than every other rank")
        elif self.criterion == "idles longer":
            assert self.excess_idle_us is not None  # what the criterion measured
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
    excess = idle.to_numpy(dtype=float) - median_of_others(idle.to_numpy(dtype=float))
    n_steps = len(idle.index)
    return pd.DataFrame({"rank": np.repeat(idle.columns.to_numpy().astype(int), n_steps),
                         "step": np.tile(idle.index.to_numpy().astype(int), len(idle.columns)),
                         "excess_us": excess.T.reshape(-1)},
                        columns=["rank", "step", "excess_us"])


def _delay_cost(ctx: RuleContext, rank: int) -> float | None:
    """The rank's delay cost per step on the execution graph (µs;
    :attr:`pardiag.analyzer.analyses.critical_path.CriticalPathResult.delay_costs`), or None
    without one."""
    cp = ctx.critical_path
    costs = getattr(cp, "delay_costs", None)
    if costs is None or costs.empty:
        return None
    row = costs[costs["rank"] == rank]
    return float(row["delay_cost_us"].iloc[0]) if len(row) else None


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
    # a pipeline: its schedule is known, or most waits are at point-to-point transfers (stages
    # that mark no microbatch, whose bubble the pipeline analysis estimates)
    p2p_waits = p2p_share(getattr(sync, "per_rank", None)) >= 0.5
    pipeline = ctx.is_pipeline or p2p_waits

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
    if (not pipeline and st["instances"] >= 3
            and getattr(sync, "straggler", int(st["rank"])) == int(st["rank"])
            and st["last_arrivals"] >= STRAGGLER_LAST_SHARE * st["instances"]
            and st["wait_caused_us"] >= STRAGGLER_RATIO * st["wait_suffered_us"]
            and st["wait_caused_us"] > 0):
        f = finding(int(st["rank"]), "arrives last")
        if ctx.on_gpu or (f.excess_idle_us is not None and step_us > 0
                          and f.excess_idle_us >= STRAGGLER_IDLE_PCT / 100.0 * step_us):
            return f
    # a pipeline on a GPU: the waiting goes back to it along the stages, and it computes the
    # longest (both checked by the synchronization analysis); on CPU its op times follow the
    # host's load, so there the idle criterion below decides
    named = getattr(sync, "straggler", None)
    if pipeline and ctx.on_gpu and named is not None:
        outside = getattr(sync, "straggler_outside_cost_us", None)
        if outside is not None:   # by the delay cost of its time outside computation
            return dataclasses.replace(finding(int(named), "delays the pipeline"),
                                       delay_cost_us=outside, outside=True)
        if int(named) == int(st["rank"]):
            return finding(int(st["rank"]), "causes the pipeline's waiting")
        cost = _delay_cost(ctx, int(named))
        if cost is not None:   # named by its delay cost on the execution graph
            return dataclasses.replace(finding(int(named), "delays the pipeline"),
                                       delay_cost_us=cost)
    # on a GPU outside pipelines, where the waits name nobody: a rank late only because it
    # waited for the straggler passes the delay on and is counted as causing waits of its own
    # (a slow TP rank makes its TP peers late at their DP collectives), so the root cause is
    # what the execution graph's delay costs name, when one rank's dominates
    if ctx.on_gpu and not pipeline and named is None:
        costs = getattr(ctx.critical_path, "delay_costs", None)
        who = straggler_by_delay_cost(costs, step_us) if costs is not None else None
        if who is not None:
            return dataclasses.replace(finding(who, "delays the job"),
                                       delay_cost_us=_delay_cost(ctx, who))
    # idles longer than its peers step after step, however many collectives the step has
    if len(ex) and step_us > 0:
        med = ex.groupby("rank")["excess_us"].median().sort_values(ascending=False)
        r = int(med.index[0])
        f = finding(r, "idles longer")
        assert f.excess_idle_us is not None  # r is a rank of ex
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
