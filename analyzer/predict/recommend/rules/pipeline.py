"""Pipeline changes replayed on the measured schedule: microbatches, schedule, stage
boundaries, interleaving."""

from __future__ import annotations

import dataclasses
import statistics
from fractions import Fraction
from typing import Any

from pardiag.layout import microbatch_choices

from ... import shapes, whatif
from ...replay import PipelineModel
from ..context import RuleContext, ms
from ..types import Recommendation, batch_fields, ruled_out


@dataclasses.dataclass(frozen=True)
class _Replay:
    """What every replayed change shares.

    Attributes:
        ctx: the rule's context; model: its pipeline replay.
        measured_us: the measured step (µs).
        peak_bytes: the measured peak (None when not measured); static_bytes: its static part
            (0 when not measured); act_bytes: the rest, the activations (None when the peak is
            not above the static bytes).
        inflight: the microbatches a rank holds at once now (:func:`replay.inflight`).
        evidence: the evidence lines every change starts with (the measured pipeline).
        batch: the run's batch sizes.
    """

    ctx: RuleContext
    model: PipelineModel
    measured_us: float
    peak_bytes: float | None
    static_bytes: float
    act_bytes: float | None
    inflight: int
    evidence: tuple[str, ...]
    batch: shapes.Batch


def _replay_base(ctx: RuleContext, model: PipelineModel) -> _Replay:
    """The measured pipeline (:class:`_Replay`): its step, peak memory, the microbatches in
    flight, the replayed bubble and the evidence lines describing it, and the batch a step
    takes."""
    measured = model.period_us
    _, base = model.predict()
    peak = ctx.peak.peak_bytes
    static = ctx.peak.static_bytes if ctx.peak.static_bytes is not None else 0.0
    act = (peak - static) if (peak is not None and peak > static) else None
    infl0 = model.inflight_of(model.schedule, model.m, model.v)
    bubble = model.bubble_pct(base)
    common_ev = (f"measured on {model.steps} {model.basis} step(s): step {ms(measured)} (median "
                 f"of their {len(model.periods_us)} periods, start to start), pipeline "
                 f"window {ms(model.window_us)}, {model.p} ranks × {model.v} stage(s) per rank, "
                 f"{model.m} microbatches"
                 + (f" of {model.samples} samples" if model.samples else "")
                 + (" (dim 0 of the activations stage 0 sends)"
                    if model.samples_from == "sends" else ""),
                 "per stage forward / backward per microbatch: " + ", ".join(
                     f"S{s} {f / 1000:.2f}/{b / 1000:.2f} ms"
                     for s, (f, b) in enumerate(zip(model.fwd_us, model.bwd_us))),
                 f"replayed bubble {bubble:.1f}% of the window; point-to-point hop "
                 f"{model.hop_us:.0f} µs, {model.gap_us:.0f} µs between a rank's chunks, "
                 f"{model.residual_us / 1000:+.2f} ms of the step not replayed")
    # the batch a step takes
    dp = int(ctx.dims.get("dp") or 1)
    step_batch = model.samples * model.m if model.samples else None
    now = shapes.Batch(step_batch * dp if step_batch else None, step_batch, model.samples)
    return _Replay(ctx, model, measured, peak, static, act, infl0, common_ev, now)


def _replayed(rp: _Replay, kind, title, change, sched, m, v, f=None, b=None, pb=None,
              extra_ev=(), caveats=(), params=None, batch_x=None) -> Recommendation:
    """The :class:`Recommendation` of a change replayed on the measured pipeline
    (:meth:`PipelineModel.predict` with schedule ``sched``, ``m`` microbatches, ``v`` stages
    per rank and, when given, per-stage forward/backward µs ``f``/``b`` and parameter bytes
    ``pb``): its predicted step and bubble, and its peak memory (the static bytes plus the
    activations of the microbatches in flight, scaled by the microbatch size)."""
    model = rp.model
    pred, sim = model.predict(sched, m, v, f, b, pb)
    # the part of the measured step the replay does not explain may move with the change: the
    # prediction is good to ± that much, and a model that explains little withholds its advice
    # (its interval reaches the step: not recommended)
    unexplained = abs(model.residual_us)
    caveats = tuple(caveats) + ((   # said where it shows at 0.1 ms
        f"the replay {model.fit_text()}: the {ms(unexplained)} by which it "
        f"{'falls short' if model.residual_us > 0 else 'overshoots'} may move with the change, "
        f"so the prediction is good to ±{ms(unexplained)}",) if unexplained >= 50.0 else ())
    pred_peak = None
    if rp.peak_bytes is not None and rp.act_bytes is not None:
        n_ratio = model.m / m
        pred_peak = rp.static_bytes + rp.act_bytes * (
            model.inflight_of(sched, m, v) * n_ratio / rp.inflight)
    fits = rp.ctx.fits(pred_peak)
    interval: dict[str, Any] = ({"predicted_low_us": max(pred - unexplained, 0.0),
                                 "predicted_high_us": pred + unexplained} if unexplained else {})
    return Recommendation(
        kind=kind, title=title, change=change,
        evidence=rp.evidence + tuple(extra_ev) + (
            f"predicted bubble {model.bubble_pct(sim):.1f}%",),
        caveats=caveats, measured_step_us=rp.measured_us, predicted_step_us=pred,
        measured_peak_bytes=rp.peak_bytes, predicted_peak_bytes=pred_peak, fits_memory=fits,
        params=params or {}, **batch_fields(rp.batch, **(batch_x or {})), **interval)


def _microbatches(rp: _Replay) -> list[Recommendation]:
    """More (or fewer) microbatches, same global batch: 2× and 4× as many and half as many;
    those the batch does not split into are ruled out."""
    model, measured = rp.model, rp.measured_us
    caveats_mb: tuple[str, ...] = (
        "a chunk's time is split into a fixed part and a part proportional to the "
        "microbatch size, measured from its operators; very small microbatches can "
        "run below the hardware's efficient size",)
    dp = int(rp.ctx.dims.get("dp") or 1)
    step_batch = model.samples * model.m if model.samples else None
    if not model.samples:
        caveats_mb += ("not checked against the global batch: the microbatch size was not "
                       "recorded",)
    out = []
    for m2 in microbatch_choices(model.m):
        if not model.knows_order(m2):   # the run's own order, and none recorded for m2
            continue
        title = f"{'More' if m2 > model.m else 'Fewer'} microbatches: {m2} instead of {model.m}"
        why = shapes.check_microbatches(m2, step_batch,
                                        "global batch" if dp == 1 else "per-rank batch")
        if why:   # the batch does not split into whole microbatches
            out.append(ruled_out("microbatches", title, f"microbatches {m2} (same global "
                                 "batch)", {"microbatches": m2}, measured, why))
            continue
        if model.schedule == "interleaved" and m2 % max(1, m2 // model.p):
            continue
        size = model.samples * model.m // m2 if model.samples else 0
        n2 = f" of {size} sample{'s' if size != 1 else ''}" if model.samples else ""
        out.append(_replayed(
            rp, "microbatches", title, f"microbatches {m2}{n2} (same global batch)",
            model.schedule, m2, model.v, caveats=caveats_mb, params={"microbatches": m2},
            batch_x={"micro_x": Fraction(model.m, m2)}))
    return out


def imbalance(stage_us: list[float]) -> float:
    """max / mean of per-stage times (1.0: even)."""
    mean = statistics.fmean(stage_us) if stage_us else 0.0
    return max(stage_us) / mean if mean > 0 else 1.0


def _rebalance(rp: _Replay, names: list[str], total: list[float]) -> list[Recommendation]:
    """Stage boundaries: the contiguous split of the per-layer forward + backward times
    (``total``, µs, of the layers ``names``) with the shortest replayed step, when it differs
    from the current one and is more even than the stages the chunks measure; where that split
    is more uneven, the most even split (:func:`whatif.best_partition`), replayed as any other
    — so a more even split is always evaluated when one exists, and "no split is more even" is
    said only when none is."""
    model = rp.model
    sizes_now = [len(ls) for ls in model.layers]
    now = imbalance([x + y for x, y in zip(model.fwd_us, model.bwd_us)])

    def uneven(sz: list[int]) -> float:
        f, b, _ = model.partition_costs(sz)
        return imbalance([x + y for x, y in zip(f, b)])
    sizes = model.best_sizes(total, len(sizes_now), model.schedule, model.m, model.v)
    # never toward a split more uneven than the one the chunks measure
    if sizes == sizes_now or uneven(sizes) >= now:
        sizes = whatif.best_partition(total, len(sizes_now))
    if sizes == sizes_now or uneven(sizes) >= now:
        return []
    f, b, pb = model.partition_costs(sizes)
    stage_ms = ", ".join(f"S{s} {(fv + bv) / 1000:.2f} ms" for s, (fv, bv) in
                         enumerate(zip(model.fwd_us, model.bwd_us)))
    return [_replayed(
        rp, "rebalance_stages", "Move layers between pipeline stages",
        f"stage boundaries {whatif.boundaries_text(sizes)} (child modules per stage "
        f"{','.join(map(str, sizes))}; now {whatif.boundaries_text(sizes_now)})",
        model.schedule, model.m, model.v, f, b, pb,
        extra_ev=(f"forward+backward per microbatch by stage: {stage_ms}",
                  f"layers are the {len(names)} child modules of the stage modules, in "
                  f"order ({names[0]} … {names[-1]}): count embeddings, heads and "
                  "other non-block children too when you split your model",
                  "layers in order: " + ", ".join(
                      f"{n} {t / 1000:.2f} ms" for n, t in zip(names, total))),
        caveats=("a layer's backward time is taken proportional to its forward time",
                 "the first and last layers (embedding, head) "
                 "may not be movable in your model"),
        params={"layers_per_stage": sizes, "layer_names": names})]


def _interleave(rp: _Replay, names: list[str], total: list[float]) -> list[Recommendation]:
    """Interleaving: 2 or 4 stages per rank, the same layers (``names``, forward + backward
    ``total`` µs each) split into p·v stages by the shortest replayed step; a v with more
    stages than the model has layers is ruled out. Nothing for a run already interleaved."""
    model, measured = rp.model, rp.measured_us
    if model.schedule == "interleaved" or model.observed:
        return []
    out = []
    layers = shapes.constraints(rp.ctx.traces).layers or len(total)
    for v2 in (2, 4):
        s2 = model.p * v2
        why = shapes.check_stages(model.p, v2, layers)
        if why:   # more stages than layers to put in them
            out.append(ruled_out(
                "interleave", f"Interleaved 1F1B with {v2} stages per rank",
                f"schedule Interleaved1F1B, {v2} stages per rank",
                {"schedule": "interleaved", "stages_per_rank": v2}, measured, why))
            continue
        if len(total) < s2 or model.m % max(1, model.m // model.p):
            continue
        sizes2 = model.best_sizes(total, s2, "interleaved", model.m, v2)
        f, b, pb = model.partition_costs(sizes2)
        out.append(_replayed(
            rp, "interleave", f"Interleaved 1F1B with {v2} stages per rank",
            f"schedule Interleaved1F1B, {v2} stages per rank, stage boundaries "
            f"{whatif.boundaries_text(sizes2)}", "interleaved", model.m, v2, f, b, pb,
            caveats=("each extra stage adds a point-to-point hop per microbatch, "
                     "taken at the measured latency",),
            params={"schedule": "interleaved", "stages_per_rank": v2,
                    "layers_per_stage": sizes2, "layer_names": names}))
    return out


def pipeline_changes(ctx: RuleContext) -> list[Recommendation]:
    """Changes replayed on the measured pipeline (:class:`pardiag.analyzer.predict.replay.
    PipelineModel`): more or fewer microbatches (same global batch), 1F1B instead of GPipe,
    stage boundaries (the contiguous split of the measured per-layer times with the shortest
    replayed step) and interleaving (2 or 4 stages per rank). A schedule pardiag does not
    generate (split backward, V placement, looped BFS) is replayed in the run's own order: the
    stage boundaries, which keep that order, are evaluated for it, and other microbatch counts
    only where ``pardiag profile`` recorded the schedule's own order for them. Peak memory: the
    static bytes plus the activations of the microbatches a rank holds at once
    (:meth:`PipelineModel.inflight_of`), scaled by the microbatch size."""
    model = ctx.model
    if model is None:
        return []
    rp = _replay_base(ctx, model)
    # more (or fewer) microbatches, same global batch
    out: list[Recommendation] = _microbatches(rp)
    # schedule: 1F1B holds fewer activations than GPipe at the same time
    if model.schedule == "gpipe":
        out.append(_replayed(
            rp, "schedule", "1F1B instead of GPipe", "schedule 1F1B", "1f1b", model.m, 1,
            caveats=("1F1B mostly saves activation memory; its bubble equals GPipe's",),
            params={"schedule": "1f1b"}))
    lc = model.layer_costs()
    if lc is not None:
        names, fw, bw, _ = lc
        total = [a + b for a, b in zip(fw, bw)]
        # stage boundaries: the optimal contiguous split of the measured per-layer times
        out += _rebalance(rp, names, total)
        # interleaving: v stages per rank, same layers split into p·v stages
        out += _interleave(rp, names, total)
    return out
