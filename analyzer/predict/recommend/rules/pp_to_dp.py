"""Data parallel instead of a pipeline, predicted from the stage modules timed at other sizes."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pandas as pd

from pardiag.layout import AllreduceTiming, DdpCalibration

from ... import shapes, whatif
from ...replay import PipelineModel
from ..context import RuleContext, step_noise
from ..types import Recommendation, batch_fields, ruled_out


def median_interval(samples) -> tuple[float, float] | None:
    """The 95% percentile-bootstrap interval (µs) of the median of ``samples`` (µs;
    :func:`pardiag.analyzer.predict.recommend.context.step_noise`), or None with fewer than 3
    numbers."""
    xs = [float(x) for x in samples or [] if isinstance(x, (int, float))]
    if len(xs) < 3:
        return None
    noise = step_noise(xs, "stand-in timings")
    return noise.low_us, noise.high_us


def _scaling_intervals(traces) -> dict[tuple[int, float], tuple[tuple, tuple]]:
    """``{(stage, samples): ((fwd low, high), (bwd low, high))}`` (µs) of the stage modules'
    timings after the run (``size_scaling`` rows with their samples)."""
    out = {}
    for doc in traces.sidecars.get("pipeline", {}).values():
        for row in doc.size_scaling:
            f = median_interval(row.fwd_samples_us)
            b = median_interval(row.bwd_samples_us)
            if f and b:
                out[(row.stage, float(row.samples))] = (f, b)
    return out


def _calibration_rows(traces) -> list[AllreduceTiming]:
    """The all-reduce timings ``pardiag profile`` took on the group after the run
    (``allreduce_calibration`` rows of the pipeline sidecars)."""
    return [r for doc in traces.sidecars.get("pipeline", {}).values()
            for r in doc.allreduce_calibration]


def _allreduce_fit(rows: list[AllreduceTiming]) -> tuple[float, float] | None:
    """``(α µs, β µs per byte)`` of the all-reduce through the calibration ``rows``' fastest
    timings (:func:`whatif.fit_alpha_beta`), or None without two sizes to fit."""
    calib = [(float(r.bytes), float(r.us)) for r in rows if r.us is not None]
    try:
        alpha, beta = whatif.fit_alpha_beta([b for b, _ in calib], [t for _, t in calib])
    except ValueError:
        return None
    if len({b for b, _ in calib}) < 2:
        return None
    return alpha, beta


def _stage_compute(model: PipelineModel, ivs: dict, n_new: float
                   ) -> tuple[float, list[float] | None]:
    """Σ over stages of the stage module's forward + backward at ``n_new`` samples (µs; the
    line through its times at other microbatch sizes, :func:`whatif.affine`) and its interval
    ``[low, high]`` (µs) from the timings' intervals (``ivs``, :func:`_scaling_intervals`), or
    None when a timing has none."""
    compute = 0.0
    compute_iv: list[float] | None = [0.0, 0.0]
    for s in range(len(model.fwd_us)):
        pts = model.size_scaling[s]
        xs = [q[0] for q in pts]
        point = (whatif.affine(xs, [q[1] for q in pts], n_new)
                 + whatif.affine(xs, [q[2] for q in pts], n_new))
        compute += point
        if compute_iv is None or any((s, x) not in ivs for x in xs):
            compute_iv = None
            continue
        ends = [whatif.affine(xs, [ivs[(s, x)][0][e] for x in xs], n_new)
                + whatif.affine(xs, [ivs[(s, x)][1][e] for x in xs], n_new) for e in (0, 1)]
        compute_iv[0] += min(point, *ends)   # an extrapolated line may swap the ends
        compute_iv[1] += max(point, *ends)
    return compute, compute_iv


@dataclasses.dataclass(frozen=True)
class _GradSync:
    """DDP's gradient synchronization after the change, per step.

    Attributes:
        buckets: DDP's default buckets of the stages' parameter bytes (bytes each).
        all_us: every bucket's all-reduce at the fitted α–β (µs).
        step_us: what of it adds to the step (µs): all of it on CPU (or what DDP added on the
            stand-in it was timed on), the last bucket's on a GPU.
        interval_us: ``(low, high)`` of ``step_us`` (µs), or None without the timings' samples.
        how: how ``step_us`` was made, appended to the all-reduce's evidence line.
    """

    buckets: list[float]
    all_us: float
    step_us: float
    interval_us: tuple[float, float] | None
    how: str


def _allreduce_interval(rows: list[AllreduceTiming], buckets: list[float], ar: float, on_gpu: bool
                        ) -> tuple[float, float] | None:
    """The all-reduces' interval (µs): from ``ar`` (the line through the fastest timings) to
    the line through the high ends of the timings' medians' intervals (:func:`median_interval`);
    None when a calibration row has no samples or the line cannot be fitted."""
    highs = [(float(r.bytes), median_interval(r.samples_us)) for r in rows]
    if not highs or not all(h is not None for _, h in highs):
        return None
    known = [(b, h) for b, h in highs if h is not None]   # all of them
    try:
        a_hi, b_hi = whatif.fit_alpha_beta([b for b, _ in known], [h[1] for _, h in known])
    except ValueError:
        return None
    hi = (sum(a_hi + b_hi * b for b in buckets) if not on_gpu
          else a_hi + b_hi * buckets[-1])
    return (min(ar, hi), max(ar, hi))


def _ddp_calibration(traces) -> DdpCalibration | None:
    """The last pipeline sidecar's ``ddp_calibration`` (DDP itself timed on a stand-in after
    the run) with ``grad_bytes`` and ``overhead_us`` > 0, or None."""
    cal = None
    for doc in traces.sidecars.get("pipeline", {}).values():
        c = doc.ddp_calibration
        if c is not None and all(v is not None and v > 0 for v in (c.grad_bytes, c.overhead_us)):
            cal = c
    return cal


def _grad_sync(ctx: RuleContext, fit: tuple[float, float], rows: list[AllreduceTiming],
               grad_bytes: float) -> _GradSync:
    """The gradient all-reduce of DDP's default buckets of the stages' layers' parameter bytes
    (``grad_bytes`` in all) at the fitted ``(α µs, β µs per byte)``: every bucket's time adds
    on CPU, the last bucket's on a GPU; on CPU, when DDP itself was timed on a stand-in
    (:func:`_ddp_calibration`), what it added there, scaled by the gradient bytes."""
    model, on_gpu = ctx.model, ctx.on_gpu
    assert model is not None  # the rule replays a pipeline
    alpha, beta = fit
    layer_bytes = [float(b) for ls in reversed(model.layers) for _, _, b in reversed(ls)]
    buckets = whatif.ddp_buckets(layer_bytes, whatif.DDP_DEFAULT_CAP, whatif.DDP_FIRST_BUCKET)
    ar_all = sum(alpha + beta * b for b in buckets)
    ar = ar_all if not on_gpu else alpha + beta * buckets[-1]
    # the all-reduces' interval: the line through the fastest timings (the point) to the one
    # through the high ends of the medians' intervals
    ar_iv = _allreduce_interval(rows, buckets, ar, on_gpu)
    how_ar = ("; on a GPU only the last bucket's is added" if on_gpu else
              "; on CPU all of it adds to the step")
    cal = _ddp_calibration(ctx.traces)
    if cal and not on_gpu:   # DDP itself timed on a stand-in with these gradient bytes
        assert cal.overhead_us is not None and cal.grad_bytes is not None  # _ddp_calibration
        ar = cal.overhead_us * grad_bytes / cal.grad_bytes
        ov = median_interval(cal.overhead_samples_us)
        ar_iv = ((max(ov[0], 0.0) * grad_bytes / cal.grad_bytes,
                  max(ov[1], 0.0) * grad_bytes / cal.grad_bytes) if ov is not None else None)
        how_ar = (f"; DDP itself, timed after the run on a stand-in with "
                  f"{cal.grad_bytes / 2**20:.3g} MiB of gradients, adds "
                  f"{cal.overhead_us / 1000:.2f} ms"
                  + (f": {ar / 1000:.2f} ms at this size"
                     if abs(cal.grad_bytes - grad_bytes) > 0.01 * grad_bytes else ""))
    return _GradSync(buckets, ar_all, ar, ar_iv, how_ar)


def _step_interval(compute_iv: list[float] | None, rest_us: tuple[float, float],
                   sync: _GradSync) -> tuple[float, float, tuple[str, ...]]:
    """``(low, high, evidence)``: the predicted step (µs) with every stand-in timing at the low,
    then at the high end of its interval, ``rest_us`` (the optimizer, the other per-step work;
    µs) as measured, and the evidence line saying so; NaN, NaN and no line without
    intervals."""
    opt, other = rest_us
    ar, ar_iv = sync.step_us, sync.interval_us
    if compute_iv is None or ar_iv is None:
        return float("nan"), float("nan"), ()
    low = compute_iv[0] + opt + other + min(ar_iv[0], ar)
    high = compute_iv[1] + opt + other + max(ar_iv[1], ar)
    return low, high, (
        f"with the stand-in timings' 95% intervals the step is {low / 1000:.2f}–"
        f"{high / 1000:.2f} ms (stage modules {compute_iv[0] / 1000:.2f}–"
        f"{compute_iv[1] / 1000:.2f} ms, gradient synchronisation "
        f"{ar_iv[0] / 1000:.2f}–{ar_iv[1] / 1000:.2f} ms; bootstrap intervals of "
        "their medians)",)


def _predicted_peak(ctx: RuleContext, n_new: float) -> float | None:
    """The peak memory as data parallel (bytes): every stage's static bytes plus every stage's
    activations for one microbatch, scaled to ``n_new`` samples; None without every rank's
    static bytes and allocated peak."""
    model = ctx.model
    # the rule replays a pipeline whose microbatch size is known
    assert model is not None and model.samples is not None
    pr = ctx.memory.per_rank if ctx.memory is not None else pd.DataFrame()
    if not (len(pr) and pr["static_bytes"].notna().all()
            and pr["peak_allocated_bytes"].notna().all()):
        return None
    infl = model.inflight_of(model.schedule, model.m, model.v)
    static = pr["static_bytes"].astype(float)
    peak = pr["peak_allocated_bytes"].astype(float)
    # a device's allocated peak holds the static state; a CPU trace's window peak counts
    # only what was allocated inside the window (context.measured_peak)
    act = (peak - static).clip(lower=0) if (peak >= static).all() else peak
    return float(static.sum()) + float(act.sum()) / infl * (n_new / model.samples)


def pp_to_dp(ctx: RuleContext) -> list[Recommendation]:
    """The same ranks as data parallel instead of a pipeline (pp = p → dp = p, DDP with its
    default buckets): every rank runs the whole model on 1/p of the global batch.

    Step = Σ over stages of the stage module's forward + backward at that size (its times at
    other microbatch sizes, measured after the run, the line through them) + the optimizer over all
    parameters (Σ of the ranks' optimizer steps) + what rank 0 does besides (its tail less its
    optimizer) + the gradient all-reduce: DDP's buckets of the stages' parameter bytes, each
    α + β·bytes from the all-reduce times ``pardiag profile`` measured on the group after the
    run. On CPU every bucket's time adds (gloo shares the cores) — or, when ``pardiag profile``
    timed DDP itself on a stand-in model after the run (``ddp_calibration``), what DDP added
    there, scaled by the gradient bytes; on a GPU only the last bucket's (the others run beside
    the backward). Peak memory: every stage's static bytes
    plus every stage's activations for one microbatch, scaled to the new batch (activations:
    the allocated peak less the static bytes — or all of it when the peak is below them, as
    in a CPU trace whose window sees only its own allocations; the measured peak is then
    static + window peak). Only for a
    pipeline with one stage per rank and no other parallel dimension.

    Every time above that was taken on a stand-in after the run carries the 95% bootstrap
    interval of its median (:func:`median_interval`): the prediction is repeated with
    each at the low end, then at the high end of its interval (``predicted_low_us``,
    ``predicted_high_us``; the policy does not recommend a change whose interval reaches the
    measured step). The optimizer and the rest are the run's own undisturbed steps."""
    model, traces, dims = ctx.model, ctx.traces, ctx.dims
    if model is None:
        return []
    if model.v != 1 or any(int(dims.get(d) or 1) > 1 for d in ("dp", "tp", "ep", "cp")):
        return []
    # the global batch must split into whole samples per rank
    why = shapes.check_dp_degree(model.p, model.samples * model.m if model.samples else None)
    if why:
        return [ruled_out("pp_to_dp", f"Data parallel instead of a {model.p}-stage pipeline",
                          f"dp={model.p}, pp=1: every rank runs the whole model on 1/{model.p} "
                          f"of the global batch (DDP, default buckets) instead of pp={model.p}",
                          {"pp": 1, "dp": model.p}, model.period_us, why)]
    n_stages = len(model.fwd_us)
    pb = model.stage_params()
    if (not model.samples or any(s not in model.size_scaling for s in range(n_stages))
            or pb is None or sum(pb) <= 0 or len(model.opt_us) != model.p):
        return []
    rows = _calibration_rows(traces)
    fit = _allreduce_fit(rows)
    if fit is None:
        return []
    alpha, beta = fit
    n_new = model.samples * model.m / model.p
    compute, compute_iv = _stage_compute(model, _scaling_intervals(traces), n_new)
    opt = sum(model.opt_us.values())
    other = max(model.tail_us.get(0, 0.0) - model.opt_us.get(0, 0.0), 0.0)
    total_b = sum(pb)
    sync = _grad_sync(ctx, fit, rows, total_b)
    pred = compute + opt + other + sync.step_us
    low, high, interval = _step_interval(compute_iv, (opt, other), sync)
    pred_peak = _predicted_peak(ctx, n_new)
    return [Recommendation(
        kind="pp_to_dp", title=f"Data parallel instead of a {model.p}-stage pipeline",
        change=f"dp={model.p}, pp=1: every rank runs the whole model on {n_new:g} samples "
               f"(DDP, default buckets) instead of pp={model.p}",
        evidence=(f"the stage modules take {compute / 1000:.2f} ms forward + backward at "
                  f"{n_new:g} samples (measured at other sizes after the run)",
                  f"optimizer over all parameters {opt / 1000:.2f} ms; other per-step work "
                  f"{other / 1000:.2f} ms",
                  f"{total_b / 2**20:.3g} MiB of gradients in {len(sync.buckets)} bucket(s): "
                  f"all-reduce {sync.all_us / 1000:.2f} ms (α {alpha:.0f} µs, "
                  f"{1 / beta / 1e3:.2f} GB/s measured on the group after the run)"
                  + sync.how, *interval),
        caveats=("every rank then holds all parameters, gradients and optimizer state",
                 "the all-reduce was timed on an idle group, not beside a backward"),
        measured_step_us=model.period_us, predicted_step_us=pred,
        predicted_low_us=low, predicted_high_us=high,
        measured_peak_bytes=ctx.peak.peak_bytes,
        predicted_peak_bytes=pred_peak,
        fits_memory=ctx.fits(pred_peak),
        params={"pp": 1, "dp": model.p},
        # the same global batch; each rank takes 1/p of it in one pass instead of m microbatches
        **batch_fields(shapes.Batch(model.samples * model.m, model.samples * model.m,
                                    model.samples),
                       per_rank_x=Fraction(1, model.p), micro_x=Fraction(model.m, model.p)))]
