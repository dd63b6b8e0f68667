"""The step with expert-parallel tokens routed evenly."""

from __future__ import annotations

from ....analyses.routing import IMBALANCE_MIN
from ..context import RuleContext, ms
from ..types import Recommendation


def moe_routing(ctx: RuleContext) -> list[Recommendation]:
    """The step if every rank of the most costly imbalanced expert-parallel group
    (:attr:`pardiag.analyzer.analyses.routing.RoutingResult.finding`: median max/mean load ≥
    :data:`~pardiag.analyzer.analyses.routing.IMBALANCE_MIN`) held the mean load: the measured step
    less the median per step of ``saving_us`` — the others' waiting at the all-to-alls the hot rank
    arrives last at, divided by the group's ranks (the hot rank's excess over the mean, with expert
    time linear in tokens; :mod:`pardiag.analyzer.analyses.routing`). How to get there is the
    model's choice, so the change is a suggestion with its caveats: a larger load-balancing
    (auxiliary) loss weight, or a capacity factor that caps the tokens per expert.

    Returns [] when routing is even, the group's all-to-alls are not expert dispatch by the
    layout's evidence (``expert``), nothing waits for the hot rank, or the step is unknown;
    the policy's noise rule decides whether the saving is recommended."""
    routing, measured = ctx.routing, ctx.measured_us
    if routing is None or ctx.model is not None or not (measured > 0):
        return []
    f = routing.finding
    if f is None or not f["expert"] or not (f["saving_us"] > 0):
        return []   # an all-to-all the layout does not call expert dispatch: no MoE advice
    hot, n = int(f["hot_rank"]), int(f["ranks"])
    what = "tokens" if f["unit"] == "rows" else "elements"
    ev = [f"the expert-parallel group [{str(f['group']).split('|')[0] or 'ranks unknown'}] routes "
          f"{f['hot_rows']:,.0f} {what} per step to rank {hot}'s experts against a mean of "
          f"{f['mean_rows']:,.0f}: max/mean {f['imbalance']:.2f} (median over {f['steps']} "
          f"step(s), range {f['imbalance_min']:.2f}–{f['imbalance_max']:.2f}; rank {hot} is the "
          f"most loaded in {f['hot_steps']} of them), from the all-to-alls' split sizes",
          f"the other ranks wait {ms(f['wait_us'])} per step (median) at the all-to-alls rank "
          f"{hot} arrives last at; with every rank at the mean load the step shrinks by that "
          f"over the group's {n} ranks: {ms(f['saving_us'])} (quartiles "
          f"{ms(f['saving_q1_us'])}–{ms(f['saving_q3_us'])})"]
    return [Recommendation(
        kind="moe_routing", title=f"Balance MoE routing: rank {hot}'s experts take "
        f"{f['imbalance']:.2f}× the mean {what}",
        change="route tokens more evenly: raise the router's load-balancing (auxiliary) loss "
               "weight, or cap the tokens per expert with a capacity factor",
        evidence=tuple(ev),
        caveats=("a capacity factor drops the tokens over an expert's capacity (they skip the "
                 "expert through the residual path), which can cost accuracy",
                 "a larger load-balancing loss weight changes what the router learns and can "
                 "cost model quality; the imbalance measured now may also change as training "
                 "goes on",
                 "the prediction assumes expert time grows linearly with tokens and that the "
                 "waiting at the all-to-alls comes from the load difference alone; the "
                 "all-to-alls' transfer time also evens out, which it does not count",
                 f"routing is called imbalanced from a median max/mean of {IMBALANCE_MIN:g}"),
        measured_step_us=measured, predicted_step_us=max(measured - f["saving_us"], 0.0),
        params={"balanced_routing_group": str(f["group"]), "hot_rank": hot})]
