"""ZeRO-1 or FSDP instead of DDP when the run nearly fills device memory."""

from __future__ import annotations

import math

from ..context import RuleContext
from ..types import Recommendation


def memory_sharding(ctx: RuleContext) -> list[Recommendation]:
    """ZeRO-1 or FSDP instead of DDP when the worst rank's peak is ≥ 90% of device memory."""
    lay, measured, cap = ctx.settings, ctx.measured_us, ctx.capacity
    strategies = ctx.strategies
    peak = ctx.peak.peak_bytes
    dp = int((lay.get("dims") or {}).get("dp") or 0)
    if ("ddp" not in strategies or strategies & {"zero1", "fsdp1", "fsdp2"} or cap is None
            or peak is None or dp < 2 or peak < 0.9 * cap or not (measured > 0)):
        return []
    assert ctx.memory is not None  # the measured peak is the memory analysis'
    pr = ctx.memory.per_rank
    i = pr["static_bytes"].idxmax() if pr["static_bytes"].notna().any() else None
    if i is None:
        return []
    p_, g_, o_ = (float(pr.loc[i, c] or 0) for c in ("params_bytes", "grads_bytes",
                                                     "optimizer_state_bytes"))
    fit = ctx.allreduce_fit
    t_ar = (fit[0] + fit[1] * g_) if fit else float("nan")
    out = []
    for kind, title, saved, extra, what in (
            ("zero1", "Shard the optimizer state (ZeRO-1)", o_ * (dp - 1) / dp, 0.5,
             "ZeroRedundancyOptimizer (ZeRO-1)"),
            ("fsdp", "Shard parameters, gradients and optimizer state (FSDP / ZeRO-3)",
             (p_ + g_ + o_) * (dp - 1) / dp, 0.5, "FSDP fully_shard (ZeRO-3)")):
        pred_peak = peak - saved
        pred = measured + extra * t_ar if not math.isnan(t_ar) else measured
        out.append(Recommendation(
            kind=kind, title=title, change=f"{what} instead of DDP over dp={dp}",
            evidence=(f"peak {peak / 2**30:.2f} GiB of {cap / 2**30:.2f} GiB device memory "
                      f"({100 * peak / cap:.0f}%)",
                      f"static per rank: parameters {p_ / 2**30:.2f}, gradients {g_ / 2**30:.2f}, "
                      f"optimizer state {o_ / 2**30:.2f} GiB"),
            caveats=("adds an all-gather of the parameters per step (about half an all-reduce of "
                     "the same bytes), taken as exposed",),
            measured_step_us=measured, predicted_step_us=pred,
            measured_peak_bytes=peak,
            predicted_peak_bytes=pred_peak, fits_memory=pred_peak <= cap,
            params={"strategy": kind}))
    return out
