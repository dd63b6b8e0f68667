"""Other DP × TP degrees of the same ranks."""

from __future__ import annotations

from pardiag.analyzer.recommend.context import RuleContext
from pardiag.analyzer.recommend.types import Recommendation


def _ring(n: int) -> float:
    """Bytes each rank moves per byte of buffer in a ring all-reduce, 2(n − 1)/n (the same for
    all-gather + reduce-scatter); 0 for one rank (nccl-tests PERFORMANCE.md)."""
    return 2.0 * (n - 1) / n if n > 1 else 0.0


def degrees(ctx: RuleContext) -> list[Recommendation]:
    """Other DP × TP splits of the same ranks (pipeline degree unchanged), TP inside a node.

    Per rank and step, with the global batch fixed: computation stays (the same work over the
    same ranks); TP traffic scales with the activations a rank holds, ∝ 1/dp, times the ring
    factor of tp; DP traffic scales with the gradient bytes, ∝ 1/tp, times the ring factor of dp;
    each dimension keeps its measured time per byte and its exposed share."""
    lay, dims, measured = ctx.layout, ctx.dims, ctx.measured_us
    dp, tp = int(dims.get("dp") or 1), int(dims.get("tp") or 1)
    if tp < 2 or not (measured > 0):
        return []   # without TP traffic measured there is nothing to scale from
    comm = ctx.dim_comm_per_step
    if "tp" not in comm:
        return []
    per_node = (min(len(r) for r in lay.nodes.values()) if lay.nodes
                else len(ctx.traces.ranks))
    t_tp, e_tp = comm["tp"]
    t_dp, e_dp = comm.get("dp", (0.0, 0.0))
    x_tp = e_tp / t_tp if t_tp > 0 else 1.0
    x_dp = e_dp / t_dp if t_dp > 0 else 1.0
    n = dp * tp
    out = []
    for tp2 in range(1, n + 1):
        if n % tp2 or tp2 == tp or tp2 > per_node:
            continue
        dp2 = n // tp2
        t_tp2 = t_tp * (dp / dp2) * (_ring(tp2) / _ring(tp)) if tp2 > 1 else 0.0
        t_dp2 = (t_dp * (tp / tp2) * (_ring(dp2) / _ring(dp)) if dp > 1 and dp2 > 1 else
                 (float("nan") if dp2 > 1 else 0.0))
        if t_dp2 != t_dp2:
            continue   # no DP traffic measured to scale from
        pred = measured - (e_tp + e_dp) + x_tp * t_tp2 + x_dp * t_dp2
        out.append(Recommendation(
            kind="degrees", title=f"dp={dp2} × tp={tp2} instead of dp={dp} × tp={tp}",
            change=f"dp={dp2}, tp={tp2} (TP inside each node; same global batch)",
            evidence=(f"per rank and step: TP communication {t_tp / 1000:.2f} ms "
                      f"({e_tp / 1000:.2f} exposed), DP {t_dp / 1000:.2f} ms "
                      f"({e_dp / 1000:.2f} exposed)",
                      f"predicted: TP {t_tp2 / 1000:.2f} ms, DP {t_dp2 / 1000:.2f} ms, each with "
                      "its measured exposed share"),
            caveats=("computation per rank is taken to stay the same (ideal scaling); TP's "
                     "smaller matmuls can run less efficiently",
                     "each dimension keeps the bandwidth measured on its current groups",
                     "memory changes (parameters shard by tp, activations by dp) are not "
                     "predicted"),
            measured_step_us=measured, predicted_step_us=pred,
            params={"dp": dp2, "tp": tp2}))
    return out
