"""DDP bucket sizes: fewer, larger buckets or more, smaller ones."""

from __future__ import annotations

import numpy as np

from ... import whatif
from ..context import RuleContext
from ..types import Recommendation

#: Resamples of the α–β fit replayed per size on a GPU (each replays every rank-step's
#: gradient-ready curve; on CPU a size's change is α × the change in bucket count, all 1000).
GPU_RESAMPLES = 200


def _ddp_ready_curves(ctx: RuleContext) -> list[list[tuple[float, float]]]:
    """Per rank and profiled step, the gradient-ready curve ``[(µs, cumulative bytes)]`` read
    from when DDP launched each bucket's all-reduce (the reducer launches a bucket as soon as
    its gradients are ready). The curve starts where the measured launch rate extrapolates to
    zero bytes."""
    steps = ctx.breakdown.steps
    curves = []
    for rank, doc in ctx.traces.sidecars.get("comms", {}).items():
        recs = [r for r in doc.get("records") or [] if isinstance(r, dict)
                and r.get("op") == "all_reduce" and isinstance(r.get("issue_us"), (int, float))
                and isinstance(r.get("bytes"), (int, float))]
        for st in steps[steps["rank"] == rank].itertuples():
            rs = sorted((r for r in recs if st.start_us <= r["issue_us"] < st.end_us),
                        key=lambda r: r["issue_us"])
            if len(rs) < 2:
                continue
            t = [float(r["issue_us"]) for r in rs]
            b = np.cumsum([float(r["bytes"]) for r in rs]).tolist()
            rate = (b[-1] - b[0]) / (t[-1] - t[0]) if t[-1] > t[0] else 0.0
            if rate <= 0:
                continue
            curves.append([(t[0] - b[0] / rate, 0.0), *zip(t, b)])
    return curves


def ddp_buckets(ctx: RuleContext) -> list[Recommendation]:
    """DDP bucket sizes around the current one, torch's default and splits of the step's
    gradients in 2, 4 and 8.

    Buckets are formed as DDP forms them (:func:`whatif.ddp_buckets`) from the gradient bytes
    of each parameter ``pardiag profile`` recorded, else as equal splits. Each all-reduce takes
    ``α + β·bytes`` (:func:`whatif.fit_alpha_beta` through the run's fastest all-reduce of each
    size; the median of each size was tried on CPU and scattered too much: a bucket that waits
    behind another reads as slow). On a GPU the
    all-reduces run beside the backward and only what ends after the last gradient shows
    (:func:`whatif.bucketed_allreduce_tail`); on CPU they run on the cores the backward uses
    (gloo), so all of their time adds to the step and only the count of buckets (α each)
    changes with the size.

    Each prediction carries the 95% interval the α–β fit gives it
    (:attr:`RuleContext.allreduce_fit_resamples`: the run's all-reduces resampled; on a GPU
    the first :data:`GPU_RESAMPLES` of them): a fit through few sizes, or through one lucky
    fast call, moves far, and when the interval reaches the measured step the change may
    gain nothing and is not recommended (:mod:`~pardiag.analyzer.predict.recommend.policy`)."""
    lay, measured = ctx.settings, ctx.measured_us
    if "ddp" not in ctx.strategies or not (measured > 0):
        return []
    on_gpu = ctx.on_gpu
    fit = ctx.allreduce_fit
    curves = _ddp_ready_curves(ctx)
    if fit is None or not curves:
        return []
    alpha, beta = fit
    cap = lay.get("ddp_bucket_cap_bytes")
    caveats = [f"all-reduce time α + β·bytes fitted on the run's fastest all-reduce of each "
               f"size (α {alpha:.0f} µs, "
               f"{1 / beta / 1e3:.2f} GB/s algbw)" if beta > 0 else "no bandwidth measured"]
    if on_gpu:
        caveats.insert(0, "gradients are taken to become ready at the rate DDP launched its "
                          "buckets")
    else:
        caveats.insert(0, "on CPU the all-reduces share the cores with the backward (gloo): "
                          "their time adds to the step, only their number changes with the "
                          "bucket size")
    if not isinstance(cap, (int, float)) or cap <= 0:
        cap = whatif.DDP_DEFAULT_CAP
        caveats.append("the bucket size was not recorded; torch's default 25 MiB assumed")
    params = lay.get("ddp_param_bytes")
    params = ([float(b) for b in params] if isinstance(params, list) and params
              and all(isinstance(b, (int, float)) and b >= 0 for b in params) else None)
    total = float(np.median([c[-1][1] for c in curves]))   # gradient bytes per step
    if params is None:
        caveats.append("parameter sizes not recorded: buckets taken as equal splits (DDP never "
                       "splits a parameter, so real buckets differ)")

    def buckets(c: float, first: float | None) -> list[float]:
        if params is not None:
            return whatif.ddp_buckets(params, c, first)
        return whatif.equal_buckets(total, c)

    # torch's first bucket is 1 MiB only when bucket_cap_mb is left at its default
    now_b = buckets(cap, whatif.DDP_FIRST_BUCKET if abs(cap - whatif.DDP_DEFAULT_CAP) < 1
                    else None)
    now = [whatif.bucketed_allreduce_tail(c, now_b, alpha, beta) for c in curves]
    boot = ctx.allreduce_fit_resamples
    if boot is not None and on_gpu:
        boot = boot[:GPU_RESAMPLES]
        # the current buckets' tails under each resampled fit, once for every candidate size
        now_boot = [[whatif.bucketed_allreduce_tail(c, now_b, a, b) for c in curves]
                    for a, b in boot]
    out = []
    seen = {tuple(now_b)}     # a size that forms the same buckets changes nothing
    for new in whatif.ddp_cap_candidates(cap, total, whatif.DDP_DEFAULT_CAP):
        new_b = buckets(new, None)     # an explicit bucket_cap_mb: every bucket takes it
        if tuple(new_b) in seen:
            continue
        seen.add(tuple(new_b))
        if on_gpu:
            tail = [whatif.bucketed_allreduce_tail(c, new_b, alpha, beta) for c in curves]
            delta = float(np.median([a - b for a, b in zip(tail, now)]))
            how = (f"the all-reduce of the last bucket ends {np.median(now) / 1000:.2f} ms "
                   f"after the last gradient is ready (median over {len(curves)} rank-steps)",
                   f"predicted: {np.median(tail) / 1000:.2f} ms")
        else:
            delta = alpha * (len(new_b) - len(now_b))
            how = (f"{len(now_b)} all-reduces per step now, {len(new_b)} with this size; each "
                   f"costs α = {alpha:.0f} µs beyond its bytes",)
        low = high = float("nan")
        if boot is not None and len(boot):
            if on_gpu:
                deltas = [float(np.median(
                    [whatif.bucketed_allreduce_tail(c, new_b, a, b) - t0
                     for c, t0 in zip(curves, now_i)])) for (a, b), now_i in zip(boot, now_boot)]
            else:
                deltas = boot[:, 0] * (len(new_b) - len(now_b))
            lo_d, hi_d = np.quantile(deltas, [0.025, 0.975])
            low, high = measured + min(float(lo_d), delta), measured + max(float(hi_d), delta)
            how = (*how, f"with the α–β fit's 95% bootstrap interval ({len(boot)} resamples of "
                         f"the run's all-reduces, α {np.quantile(boot[:, 0], 0.025):.0f}–"
                         f"{np.quantile(boot[:, 0], 0.975):.0f} µs) the step is "
                         f"{low / 1000:.2f}–{high / 1000:.2f} ms")
        out.append(Recommendation(
            kind="ddp_bucket", title=f"DDP buckets of {new / 2**20:g} MiB",
            change=f"DDP bucket_cap_mb={new / 2**20:.4g} (now {cap / 2**20:.4g}; "
                   f"{total / 2**20:.3g} MiB of gradients per step)",
            evidence=how, caveats=tuple(caveats), measured_step_us=measured,
            predicted_step_us=measured + delta, predicted_low_us=low, predicted_high_us=high,
            params={"ddp_bucket_cap_bytes": int(new)}))
    return out
