"""Recommendations: what to change, and how much it will help.

Interface used by the renderers (HTML, terminal) and the JSON summary:
``report.recommendations`` is a :class:`RecommendationResult` (or None). Each
:class:`Recommendation` carries its predicted step time and peak memory, the evidence behind
it, and its ``tier``: recommended changes are ranked by the policy of
:mod:`pardiag.analyzer.predict.recommend.policy` (memory-saving changes first on a memory-bound run,
changes of the parallel degrees after those that keep them, then by predicted gain), and
changes predicted within the run's noise of each other share a tier.

Structure: :func:`compute_recommendations` builds one typed context
(:mod:`~pardiag.analyzer.predict.recommend.context`), runs every rule of
:data:`~pardiag.analyzer.predict.recommend.rules.RULES` on it, scales the predictions to the
unprofiled step when one was measured, and lets the policy rank them.
"""

from __future__ import annotations

import dataclasses

from pardiag.layout import microbatch_choices

from ...trace.traceset import TraceSet
from ..replay import PipelineModel, pipeline_model
from .context import RuleContext, StepNoise, build_context, clean_step_us, ms
from .findings import identify_straggler
from .policy import DEGREE_KINDS, MEMORY_KINDS, MIN_GAIN_PCT, rank
from .rules import RULES, Rule
from .rules.ddp_buckets import why_not_evaluated as buckets_not_evaluated
from .types import STEP_BASES, Recommendation, RecommendationResult, StepTime, with_mfu
from .verdict import steps_unrecorded, verdict

__all__ = ["DEGREE_KINDS", "MEMORY_KINDS", "MIN_GAIN_PCT", "PipelineModel", "RULES",
           "Recommendation", "RecommendationResult", "Rule", "RuleContext", "STEP_BASES",
           "StepNoise", "StepTime",
           "as_ratio", "build_context", "clean_step_us", "compute_recommendations",
           "pipeline_model"]


def as_ratio(c: Recommendation, step_us: float, note: str = "") -> Recommendation:
    """``c`` restated against a step of ``step_us`` (µs; the unprofiled step): its predicted
    step and interval (:attr:`Recommendation.predicted_low_us`/``predicted_high_us``) scaled by
    ``step_us`` / its measured step, so the interval rule compares like with like; ``note``
    joins its evidence. A ruled-out change only takes the new measured step."""
    if c.ruled_out:
        return dataclasses.replace(c, measured_step_us=step_us)
    k = step_us / c.measured_step_us
    return dataclasses.replace(
        c, measured_step_us=step_us, predicted_step_us=c.predicted_step_us * k,
        predicted_low_us=c.predicted_low_us * k, predicted_high_us=c.predicted_high_us * k,
        evidence=(*c.evidence, note) if note else c.evidence)


def _settings_unrecorded(traces: TraceSet) -> str | None:
    """Why a ``pardiag profile`` run holds no layout or settings, when it cannot: ``"the run
    ended before its profiling window closed (ranks 0, 1 made 3 optimizer step(s); the window
    closes after 5)"`` — they are taken when the window closes — or ``"rank(s) 0, 1 wrote no
    metadata (the run hung or failed)"`` — they are written when the script ends. Their absence
    then says nothing about the job. None otherwise."""
    run = traces.run_info
    sch = run.schedule if run is not None else None
    if run is None or sch is None:
        return None
    end = sch.wait + sch.warmup + sch.active
    short = {r: m.optimizer_steps for r, m in sorted(traces.rank_meta.items())
             if isinstance(m.optimizer_steps, int) and m.optimizer_steps < end}
    missing = [r for r in traces.ranks if r not in traces.rank_meta]
    if not short and not (missing and (run.hang or traces.failures())):
        return None
    by_count: dict[int, list[int]] = {}
    for r, n in short.items():
        by_count.setdefault(n, []).append(r)
    parts = [(f"rank {rs[0]}" if len(rs) == 1 else f"ranks {', '.join(map(str, rs))}")
             + f" made {n} optimizer step(s)" for n, rs in sorted(by_count.items())]
    if short:
        return (f"the run ended before its profiling window closed ({'; '.join(parts)}; the "
                f"window closes after {end})")
    return (f"rank(s) {', '.join(map(str, missing))} wrote no metadata (the run "
            f"{'hung' if run.hang else 'failed'})")


def _none_clears(rejected, margin: float) -> str:
    """Why none of the evaluated changes is recommended, when some were: none is predicted to
    save ``margin`` % of the step, or those that are rest on timings whose interval reaches
    the measured step (:attr:`Recommendation.interval_spans_no_gain`)."""
    wide = [c for c in rejected if not c.ruled_out and c.gain_pct >= margin
            and c.interval_spans_no_gain]
    if not wide:
        return f"no modelled change is predicted to save ≥ {margin:.1f}% of the step"
    best = max(wide, key=lambda c: c.gain_pct)
    return (f"no modelled change is predicted to save ≥ {margin:.1f}% of the step with an "
            f"interval that excludes no gain: {len(wide)} predicted more (up to "
            f"{best.gain_pct:.1f}%, {best.change}), but the interval of the timings each rests "
            "on reaches the measured step")


def _pipeline_unchangeable(model, capture: bool = False) -> str:
    """Why a replayed pipeline had no change to evaluate (:func:`_pipeline_missing`)."""
    missing = _pipeline_missing(model, capture)
    return ("the pipeline is replayed, but " + "; ".join(missing) if missing else
            "the pipeline is replayed, but no change to it applies")


def _pipeline_missing(model, capture: bool = False) -> list[str]:
    """What each pipeline change the replay cannot evaluate needs and the run does not hold
    (per-layer times to move stage boundaries; the schedule's order at other microbatch
    counts); of a monitored run's deep capture (``capture``), that it records neither. Empty
    when every pipeline change could be evaluated."""
    missing = []
    if not model.layers:
        missing.append("no per-layer times were recorded to move stage boundaries")
    if model.observed and not model.recorded_orders:
        missing.append(f"{model.schedule} is replayed in the order it ran, and its order with "
                       "other microbatch counts is not known" + (
                           "" if capture else " (pardiag profile records it from torch's "
                           "schedule class)"))
    elif model.observed:
        unknown = [m for m in microbatch_choices(model.m) if not model.knows_order(m)]
        if unknown:
            missing.append(f"{' and '.join(map(str, unknown))} microbatches: {model.schedule}'s "
                           f"order for {'them' if len(unknown) > 1 else 'it'} was not recorded "
                           f"(torch's schedule class gave none)")
    if missing and capture:
        missing.append("a monitored run's deep capture records neither: a profiled run "
                       "(pardiag profile without --monitor) times its stages' layers and "
                       "records the schedule's orders after its script")
    return missing


def _pipeline_unmodelled(model) -> list[str]:
    """The pipeline changes not modelled for this shape of pipeline, said beside those that
    were evaluated: data parallel in its place with several stages per rank; another schedule
    in place of one replayed in its own order, or of an interleaved one."""
    out = []
    stages = len(model.fwd_us)
    if stages != model.p:
        out.append(f"data parallel in place of the pipeline: modelled for one stage per rank "
                   f"only (here {stages} stages on {model.p} ranks)")
    if model.observed or model.schedule == "interleaved":
        out.append(f"another schedule in place of {model.schedule} (1F1B, or other stages per "
                   f"rank): not modelled")
    return out


def _nothing_to_change(ctx: RuleContext) -> str:
    """Why no rule had anything to evaluate, outside pipelines: the strategies the layout shows
    whose settings the traces do not hold are named (a report of traces from elsewhere); a
    ``pardiag profile`` run that ended before its profiling window closed never recorded its
    layout or settings, and what it had to change is unknown."""
    unrecorded = _settings_unrecorded(ctx.traces)
    if unrecorded:
        return (f"{unrecorded}, so the layout and the DDP, FSDP, ZeRO and tensor-parallel "
                "settings were not recorded: whether any of them could change is unknown")
    lay = ctx.layout
    shown = [s for s in (lay.strategies if lay is not None else []) if s in {
        "ddp", "fsdp1", "fsdp2", "zero", "zero1", "zero2", "zero3", "tp"}]
    if shown and not ctx.settings:
        return (f"{' and '.join(shown)} {'is' if len(shown) == 1 else 'are'} in the layout the "
                "traces show, but not their settings (bucket sizes, resharding, prefetching, the "
                "ZeRO stage, static memory)" + ("" if ctx.on_gpu else
                                                " nor, on a CPU, each collective's group")
                + ": run under `pardiag profile` to evaluate changes to them")
    if shown:   # never "no DDP" about a job whose layout shows it
        run = ctx.traces.run_info
        world = run.world_size if run else None
        absent = [r for r in range(world or 0) if r not in ctx.traces.ranks]
        # metadata from the window's end only: the collective records come after the script
        unfinished = [r for r, m in sorted(ctx.traces.rank_meta.items())
                      if m.status == "running"
                      and r not in ctx.traces.sidecars.get("comms", {})]
        why = ""
        if absent:
            why = (f": rank(s) {', '.join(map(str, absent[:8]))} of {world} have no trace, so "
                   "their collectives cannot be matched across ranks")
        elif unfinished:
            why = (f": rank(s) {', '.join(map(str, unfinished[:8]))} did not finish (the run "
                   f"{'hung' if run is not None and run.hang else 'was stopped'}), and the "
                   "collective records the changes are evaluated on are written after the "
                   "script ends")
        buckets = buckets_not_evaluated(ctx)
        if not why and buckets:
            why = f": {buckets}"
        return (f"{' and '.join(shown)} {'is' if len(shown) == 1 else 'are'} in the layout, "
                "but no change to the settings could be evaluated from these traces" + why)
    return ("no pipeline, no significant straggler, and no DDP, FSDP, ZeRO or tensor-parallel "
            "setting to change")


def compute_recommendations(traces: TraceSet, done: dict) -> RecommendationResult:
    """Evaluate the changes pardiag models and rank those predicted to help.

    Candidates the model's shapes or batch rule out (:mod:`pardiag.analyzer.predict.shapes`) are
    listed among those not recommended with ``ruled_out``, the reason, and no prediction.

    Changes (:data:`RULES`): pipeline microbatch count, schedule (1F1B for GPipe), interleaving,
    stage boundaries, data parallel instead of the pipeline, the step without the worst straggler,
    expert-parallel tokens routed evenly, DDP bucket sizes, FSDP resharding and prefetching, DP × TP
    degrees, TP inside a node, ZeRO-1/FSDP on a memory-bound DDP run. Each carries evidence,
    predicted vs measured step time and peak memory. Recommended: predicted gain clears the noise
    rule (:mod:`~pardiag.analyzer.predict.recommend.policy`) and fits in device memory (capacity
    from ``deviceProperties``; unknown on CPU, where everything fits).

    Args:
        traces: the run. done: earlier analyses by registry name (``time_breakdown``,
            ``sync``, ``pipeline``, ``balance``, ``memory``, ``layout``, ``dim_overlap``).
    """
    unrecorded = steps_unrecorded(traces)
    if unrecorded:
        return RecommendationResult(unrecorded, (), (), "the traces hold no training step")
    ctx = build_context(traces, done)
    cands: list[Recommendation] = [c for rule in RULES for c in rule.compute(ctx)]
    measured = ctx.measured_us
    clean = ctx.clean
    if ctx.model is None and clean is not None and measured > 0:
        # the profiler slows steps down (on CPU by 2–4×): predictions made on the profiled
        # steps are applied as ratios to the step time measured without it
        note = (f"step time {ms(clean.median_us)} measured on {clean.steps} unprofiled step "
                f"period(s) ({ms(measured)} while profiled); the predicted change is applied as "
                "a ratio")
        cands = [as_ratio(c, clean.median_us, note) for c in cands]
    # the noise of the step the predictions are finally stated against: the unprofiled steps
    # when they were measured (more of them, and without the profiler's own jitter)
    use_clean = ctx.model is None and clean is not None
    good, rejected, rule, margin = rank(
        cands, clean if use_clean else ctx.step,
        ctx.model.period_us if ctx.model is not None else None, ctx.contention is not None)
    flops, peak = (ctx.efficiency.totals() if ctx.efficiency is not None else None) or (
        None, None)
    good = tuple(with_mfu(c, flops, peak) for c in good)
    rejected = tuple(with_mfu(c, flops, peak) for c in rejected)
    why_none = ""
    if not good:
        why_none = ("every change evaluated is ruled out by the model's shapes or batch"
                    if cands and all(c.ruled_out for c in cands) else
                    _none_clears(rejected, margin)
                    if cands else
                    # traces whose run file says --monitor are a deep capture's
                    "nothing to evaluate: " + (_pipeline_unchangeable(ctx.model, bool(
                        ctx.traces.run_info and ctx.traces.run_info.monitor_every))
                                               if ctx.model is not None else
                                               ctx.model_why if ctx.model_why != "no pipeline"
                                               else _nothing_to_change(ctx)))
    # the verdict's step time is the one the recommendations compare with: unprofiled when known
    step = clean.median_us if use_clean and clean is not None else measured
    base = clean if use_clean else ctx.step
    noise_us = (base.half_width_us if base is not None else float("nan"))
    basis = "pipeline" if ctx.model is not None else ("unprofiled" if use_clean else "profiled")
    step_time = StepTime(basis, base.samples_us) if base is not None else None
    found = identify_straggler(ctx)
    # what a replayed pipeline could not evaluate beside what it did (said in why_none when
    # it evaluated nothing)
    missing = ([*_pipeline_missing(ctx.model, bool(ctx.traces.run_info
                                                   and ctx.traces.run_info.monitor_every)),
                *_pipeline_unmodelled(ctx.model)]
               if ctx.model is not None and cands else [])
    buckets = buckets_not_evaluated(ctx)
    if buckets and cands:
        missing.append(f"DDP's bucket sizes: {buckets}")
    return RecommendationResult(verdict(ctx, step, profiled=ctx.model is None and clean is None,
                                        changes=(*good, *rejected), straggler=found),
                                good, rejected, why_none, rule, noise_us, margin,
                                ctx.peak.definition, step_time,
                                found.rank if found is not None else None,
                                "; ".join(missing))
