"""DDP bucket sizes: fewer, larger buckets or more, smaller ones."""

from __future__ import annotations

import dataclasses

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
        # (issue µs, bytes) of each all-reduce
        recs = [(r.issue_us, r.bytes) for r in doc.records
                if r.op == "all_reduce" and r.issue_us is not None and r.bytes is not None]
        for st in steps[steps["rank"] == rank].itertuples():
            rs = sorted((r for r in recs if st.start_us <= r[0] < st.end_us),
                        key=lambda r: r[0])
            if len(rs) < 2:
                continue
            t = [float(issue) for issue, _ in rs]
            b = np.cumsum([float(n) for _, n in rs]).tolist()
            rate = (b[-1] - b[0]) / (t[-1] - t[0]) if t[-1] > t[0] else 0.0
            if rate <= 0:
                continue
            curves.append([(t[0] - b[0] / rate, 0.0), *zip(t, b)])
    return curves


def _bucket_settings(ctx: RuleContext, curves: list, alpha: float, beta: float
                     ) -> tuple[float, list[float] | None, float, list[str]]:
    """``(the bucket cap now (bytes; torch's default when not recorded), the gradient bytes of
    each parameter (None when not recorded), the gradient bytes per step (the median over the
    ready ``curves``), the caveats)``; ``alpha`` (µs), ``beta`` (µs per byte): the all-reduce
    fit."""
    lay = ctx.settings
    cap = lay.get("ddp_bucket_cap_bytes")
    caveats = [f"all-reduce time α + β·bytes fitted on the run's fastest all-reduce of each "
               f"size (α {alpha:.0f} µs, "
               f"{1 / beta / 1e3:.2f} GB/s algbw)" if beta > 0 else "no bandwidth measured"]
    if ctx.on_gpu:
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
    return cap, params, total, caveats


def _buckets(params: list[float] | None, total: float, cap: float, first: float | None
             ) -> list[float]:
    """The buckets (bytes each) DDP forms at ``cap`` bytes (``first``: the first bucket's cap)
    from the parameters' gradient bytes ``params``, else equal splits of ``total`` bytes."""
    if params is not None:
        return whatif.ddp_buckets(params, cap, first)
    return whatif.equal_buckets(total, cap)


@dataclasses.dataclass(frozen=True)
class _Current:
    """The current buckets, what every candidate size is predicted against.

    Attributes:
        curves: :func:`_ddp_ready_curves`; buckets: the current buckets (bytes each).
        tails_us: per curve, how long after the last gradient the current buckets' all-reduces
            end (µs; :func:`whatif.bucketed_allreduce_tail`).
        alpha_us, beta_us_per_byte: the all-reduce fit; on_gpu: the run's device.
        boot: the fit's resamples (rows α µs, β µs per byte; on a GPU the first
            :data:`GPU_RESAMPLES`), or None.
        boot_tails_us: per resample, ``tails_us`` under it (on a GPU with resamples; else
            None).
    """

    curves: list
    buckets: list[float]
    tails_us: list[float]
    alpha_us: float
    beta_us_per_byte: float
    on_gpu: bool
    boot: np.ndarray | None
    boot_tails_us: list[list[float]] | None


def _current(ctx: RuleContext, curves: list, now_b: list[float], alpha: float, beta: float
             ) -> _Current:
    """The current buckets ``now_b`` (bytes each) and their tails under the fit ``alpha`` µs,
    ``beta`` µs per byte and under each of its resamples (:class:`_Current`)."""
    now = [whatif.bucketed_allreduce_tail(c, now_b, alpha, beta) for c in curves]
    boot = ctx.allreduce_fit_resamples
    now_boot = None
    if boot is not None and ctx.on_gpu:
        boot = boot[:GPU_RESAMPLES]
        # the current buckets' tails under each resampled fit, once for every candidate size
        now_boot = [[whatif.bucketed_allreduce_tail(c, now_b, a, b) for c in curves]
                    for a, b in boot]
    return _Current(curves, now_b, now, alpha, beta, ctx.on_gpu, boot, now_boot)


def _step_change(cur: _Current, new_b: list[float]) -> tuple[float, tuple[str, ...]]:
    """The step's change (µs) with buckets ``new_b`` (bytes each) and the evidence lines: on a
    GPU the median change of the last all-reduce's tail over the rank-steps, on CPU α × the
    change in bucket count."""
    curves, alpha = cur.curves, cur.alpha_us
    if cur.on_gpu:
        tail = [whatif.bucketed_allreduce_tail(c, new_b, alpha, cur.beta_us_per_byte)
                for c in curves]
        delta = float(np.median([a - b for a, b in zip(tail, cur.tails_us)]))
        how: tuple[str, ...] = (
            f"the all-reduce of the last bucket ends {np.median(cur.tails_us) / 1000:.2f} ms "
            f"after the last gradient is ready (median over {len(curves)} rank-steps)",
            f"predicted: {np.median(tail) / 1000:.2f} ms")
    else:
        delta = alpha * (len(new_b) - len(cur.buckets))
        how = (f"{len(cur.buckets)} all-reduces per step now, {len(new_b)} with this size; each "
               f"costs α = {alpha:.0f} µs beyond its bytes",)
    return delta, how


def _fit_interval(cur: _Current, new_b: list[float], measured: float, delta: float
                  ) -> tuple[float, float, tuple[str, ...]]:
    """``(low, high, evidence)``: the predicted step's 95% interval (µs) under the fit's
    resamples (the step's change ``delta`` µs stays inside it; ``measured``: the step, µs) and
    the evidence line saying so; NaN, NaN and no line without resamples."""
    boot = cur.boot
    if boot is None or not len(boot):
        return float("nan"), float("nan"), ()
    deltas: list[float] | np.ndarray
    if cur.on_gpu:
        assert cur.boot_tails_us is not None  # taken on a GPU with resamples
        deltas = [float(np.median(
            [whatif.bucketed_allreduce_tail(c, new_b, a, b) - t0
             for c, t0 in zip(cur.curves, now_i)]))
            for (a, b), now_i in zip(boot, cur.boot_tails_us)]
    else:
        deltas = boot[:, 0] * (len(new_b) - len(cur.buckets))
    lo_d, hi_d = np.quantile(deltas, [0.025, 0.975])
    low, high = measured + min(float(lo_d), delta), measured + max(float(hi_d), delta)
    return low, high, (f"with the α–β fit's 95% bootstrap interval ({len(boot)} resamples of "
                       f"the run's all-reduces, α {np.quantile(boot[:, 0], 0.025):.0f}–"
                       f"{np.quantile(boot[:, 0], 0.975):.0f} µs) the step is "
                       f"{low / 1000:.2f}–{high / 1000:.2f} ms",)


def why_not_evaluated(ctx: RuleContext) -> str | None:
    """Why the bucket sizes of a DDP run were not evaluated, in one clause; None where they
    could be (or the run has no DDP)."""
    if "ddp" not in ctx.strategies or not (ctx.measured_us > 0):
        return None
    if not ctx.traces.sidecars.get("comms"):
        return None   # traces from elsewhere: said by the caller
    if not _ddp_ready_curves(ctx):
        return ("DDP issued fewer than two all-reduces in each profiled step (its gradients "
                "fit one bucket), so when its gradients become ready, which a bucket size "
                "changes, cannot be read")
    if ctx.allreduce_fit is None:
        return ("the run's all-reduces fit no time per call and per byte (too few message "
                "sizes), from which other bucket sizes are predicted")
    return None


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
    measured = ctx.measured_us
    if "ddp" not in ctx.strategies or not (measured > 0):
        return []
    fit = ctx.allreduce_fit
    curves = _ddp_ready_curves(ctx)
    if fit is None or not curves:
        return []
    alpha, beta = fit
    cap, params, total, caveats = _bucket_settings(ctx, curves, alpha, beta)
    # torch's first bucket is 1 MiB only when bucket_cap_mb is left at its default
    now_b = _buckets(params, total, cap, whatif.DDP_FIRST_BUCKET
                     if abs(cap - whatif.DDP_DEFAULT_CAP) < 1 else None)
    cur = _current(ctx, curves, now_b, alpha, beta)
    out = []
    seen = {tuple(now_b)}     # a size that forms the same buckets changes nothing
    for new in whatif.ddp_cap_candidates(cap, total, whatif.DDP_DEFAULT_CAP):
        # an explicit bucket_cap_mb: every bucket takes it
        new_b = _buckets(params, total, new, None)
        if tuple(new_b) in seen:
            continue
        seen.add(tuple(new_b))
        delta, how = _step_change(cur, new_b)
        low, high, how_iv = _fit_interval(cur, new_b, measured, delta)
        out.append(Recommendation(
            kind="ddp_bucket", title=f"DDP buckets of {new / 2**20:g} MiB",
            change=f"DDP bucket_cap_mb={new / 2**20:.4g} (now {cap / 2**20:.4g}; "
                   f"{total / 2**20:.3g} MiB of gradients per step)",
            evidence=(*how, *how_iv), caveats=tuple(caveats), measured_step_us=measured,
            predicted_step_us=measured + delta, predicted_low_us=low, predicted_high_us=high,
            params={"ddp_bucket_cap_bytes": int(new)}))
    return out
