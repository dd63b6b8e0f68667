"""The ranking policy and the noise rule: which evaluated changes are recommended, in which
order, and which are within noise of each other.

Noise rule: a change is recommended when its predicted saving is at least
:data:`MIN_GAIN_PCT` % of the step *and* at least the half-width of the 95% bootstrap interval
of the measured median step (:func:`pardiag.analyzer.predict.recommend.context.step_noise`: steps
resampled with replacement; Efron & Tibshirani 1993, ch. 13) — the saving must be larger than
what the step's own noise moves its median by. Recommendations whose predicted step times lie
within that same margin of each other form one tier ("within noise of each other"): a tier is
a set, not a ranking.

Interval rule: a change whose prediction rests on stand-in timings taken after the run (DDP on
a stand-in model, the stage modules at other sizes, all-reduces of chosen sizes) or on a fit
to the run's own transfers (DDP bucket sizes: the all-reduces' α–β) carries their 95% interval
(:attr:`Recommendation.predicted_high_us`); when the interval reaches the measured step — the
change might gain nothing — it is not recommended, whatever its point prediction.

Order: a run that does not fit in memory must shrink first — memory-saving changes
(:data:`MEMORY_KINDS`) rank ahead of speed; changes of the parallel degrees
(:data:`DEGREE_KINDS`) after the changes that keep them; then by predicted gain, tier by tier.
"""

from __future__ import annotations

import dataclasses
import math

from .context import StepNoise, ms
from .types import Recommendation

#: A change must be predicted to save at least this share of the step to be recommended (%).
MIN_GAIN_PCT = 2.0
#: Kinds of the changes that shrink memory (recommended first when they fit).
MEMORY_KINDS = ("zero1", "fsdp", "zero_bucket", "zero_shard")
#: Kinds that change the parallel degrees: ranked after the changes that keep them (they
#: re-partition the model, its memory per rank and its checkpoints, which no step time shows).
DEGREE_KINDS = ("pp_to_dp", "degrees")
#: How the tiers are ordered, in words (the page and the terminal say it under the table).
TIER_ORDER = ("Tiers are ordered by kind, then by predicted gain: memory savings a run needs "
              "first (ZeRO, FSDP), then changes that keep the parallel degrees (microbatches, "
              "schedule, stage boundaries, buckets, the straggler), then changes of the degrees "
              "(data parallel instead of a pipeline, dp × tp), which re-partition the model, its "
              "memory per rank and its checkpoints: a later tier can predict a larger gain")
#: Interleaving must beat the best schedule-keeping change by this much (% of its step).
INTERLEAVE_MARGIN_PCT = 10.0
#: Below this many steps the noise estimate is itself noisy: the relative standard error of a
#: sample's standard deviation is about 1/√(2(n − 1)) (normal data; e.g. Ahn & Fessler 2003),
#: over 24% below 10 steps. On the stability benchmark's unbalanced 1F1B pipeline the noise
#: estimate ranged ±4.9–13.8% over runs of 12 steps (5 unprofiled step periods each) and
#: ±1.9–7.0% over runs of 24 steps (17 periods) (``benchmarks/stability.py``; its results in
#: benchmarks/results/, listed in benchmarks/README.md).
FEW_NOISE_STEPS = 10
#: Said with the rule when the ranks contended for cores (:func:`pardiag.layout.
#: contention_note`). How the OS shares the cores differs between runs and holds for a whole
#: run, so a run's own step noise does not show it: on the stability benchmark's unbalanced
#: 1F1B pipeline the top tier recurred in 11–18 of 20 unpinned runs and in 18–20 of 20 runs
#: with ``--pin-cpu`` (four batches of 20 runs of 12 steps of ``benchmarks/stability.py``; its
#: results in benchmarks/results/, listed in benchmarks/README.md).
CONTENDED_TIERS = ("; the ranks contended for cores, and how they shared them differs between "
                   "identical runs without showing in one run's noise, so tiers near the margin "
                   "can differ from one run to the next: pin the ranks (pardiag profile "
                   "--pin-cpu) for steadier tiers")


def noise_margin_pct(step: StepNoise | None, contended: bool = False) -> tuple[float, str]:
    """The least predicted saving (% of the step) a change needs, and the rule as a sentence
    quoting the measured noise it rests on (and, below :data:`FEW_NOISE_STEPS` steps, that
    the noise estimate itself is uncertain; when the ranks contended for cores, that how they
    shared them is not in the run's noise — see :data:`CONTENDED_TIERS`)."""
    if step is None or not step.known or not (step.median_us > 0):
        n = step.steps if step is not None else 0
        return MIN_GAIN_PCT, (f"recommended when predicted to save ≥ {MIN_GAIN_PCT:g}% of the "
                              f"step; the step's noise is not measured ({n} step(s): 3 or more "
                              "are needed), so a smaller effect cannot be told from noise")
    noise = 100.0 * step.half_width_us / step.median_us
    margin = max(MIN_GAIN_PCT, noise)
    few = (f"; measured on only {step.steps} steps, the noise estimate itself varies between "
           "identical runs, so a change near the margin, or a tier boundary, can differ from "
           "one run to the next: profile 20 steps or more for steadier tiers"
           if step.steps < FEW_NOISE_STEPS else "")
    few += CONTENDED_TIERS if contended else ""
    return margin, (f"recommended when predicted to save ≥ {margin:.1f}% of the step: the larger "
                    f"of {MIN_GAIN_PCT:g}% and the step's noise, ±{noise:.1f}% "
                    f"(±{ms(step.half_width_us)}: half the 95% bootstrap interval of the median "
                    f"over {step.source}); changes predicted within {margin:.1f}% of each other "
                    f"are one tier, within noise of each other{few}")


def spans_no_gain(c: Recommendation) -> str:
    """The caveat of a change whose stand-in interval reaches the measured step."""
    return (f"the timings it rests on put it at {ms(c.predicted_low_us)}–"
            f"{ms(c.predicted_high_us)} (95% interval), which reaches the measured "
            f"{ms(c.measured_step_us)}: it may gain nothing, so it is not recommended")


def _interleave_limit(cands: list[Recommendation], period_us: float | None) -> float:
    """Interleaving changes the schedule, adds point-to-point hops and needs the model cut into
    more stages: it must beat the best change that keeps the schedule (moving layers, the
    microbatch count) by :data:`INTERLEAVE_MARGIN_PCT`. Returns the step it must beat (µs)."""
    if period_us is None:
        return math.inf
    best = min([period_us, *(c.predicted_step_us for c in cands
                             if c.kind in ("rebalance_stages", "microbatches")
                             and not c.ruled_out)])
    return best * (1 - INTERLEAVE_MARGIN_PCT / 100)


def _order(c: Recommendation) -> tuple[bool, bool]:
    return (c.kind not in MEMORY_KINDS, c.kind in DEGREE_KINDS)


def rank(cands: list[Recommendation], step: StepNoise | None, pipeline_period_us: float | None,
         contended: bool = False
         ) -> tuple[tuple[Recommendation, ...], tuple[Recommendation, ...], str, float]:
    """Split evaluated changes into recommended (ranked, with tiers) and not recommended.

    Args:
        cands: every change the rules evaluated.
        step: the measured step the rules' predictions started from, with its noise.
        pipeline_period_us: the measured pipeline step when the run is a pipeline (for the
            interleaving margin), else None.
        contended: whether the run's ranks contended for cores (the rule then says that its
            tiers can change between runs).

    Returns:
        ``(recommended, not_recommended, rule, margin_pct)``: recommended best first, each with
        its ``tier`` (1 = best; equal tiers are within noise of each other); rule: the noise
        rule as a sentence (:func:`noise_margin_pct`)."""
    margin, rule = noise_margin_pct(step, contended)
    limit = _interleave_limit(cands, pipeline_period_us)

    def not_worth(c: Recommendation) -> bool:   # a change predicted slower has no gain at all
        return c.kind == "interleave" and c.predicted_step_us > limit and c.gain_pct > 0

    cands = [dataclasses.replace(c, caveats=(
        *c.caveats, f"predicted less than {INTERLEAVE_MARGIN_PCT:g}% faster than the best "
        "change that keeps the schedule, so not recommended")) if not_worth(c) else c
        for c in cands]
    cands = [dataclasses.replace(c, caveats=(*c.caveats, spans_no_gain(c)))
             if c.interval_spans_no_gain and not c.ruled_out else c for c in cands]
    good = sorted((c for c in cands if c.fits_memory and not not_worth(c) and not c.ruled_out
                   and not c.interval_spans_no_gain
                   and (c.gain_pct >= margin or c.kind in MEMORY_KINDS)),
                  key=lambda c: (*_order(c), -c.gain_pct))
    out, tier, lead = [], 0, None
    for c in good:
        if (lead is None or _order(c) != _order(lead)
                or c.predicted_step_us - lead.predicted_step_us
                > margin / 100.0 * lead.measured_step_us):
            tier, lead = tier + 1, c
        out.append(dataclasses.replace(c, tier=tier))
    rejected = tuple(dataclasses.replace(c, **_why_not(c, margin, step, contended, not_worth(c)))
                     for c in cands if c not in good)
    return tuple(out), rejected, rule, margin


def _why_not(c: Recommendation, margin: float, step: StepNoise | None, contended: bool,
             under_interleave_margin: bool) -> dict:
    """``{"reason", "settle"}`` of a change not recommended (:class:`Recommendation`): the
    first of the policy's tests it failed, and what would settle it."""
    noisy = step is not None and step.known and margin > MIN_GAIN_PCT
    more = ("more steps (the noise shrinks as the steps grow)" +
            (" and pinned ranks (pardiag profile --pin-cpu)" if contended else ""))
    if c.ruled_out:
        return {"reason": f"ruled out by the model's shapes or batch: {c.ruled_out}",
                "settle": ""}
    if not c.fits_memory:
        return {"reason": "does not fit in device memory", "settle": ""}
    if c.gain_pct <= 0:   # before the interleave margin: a slower change is not "faster"
        return {"reason": (f"no gain: predicted {-c.gain_pct:.1f}% slower" if c.gain_pct < -0.05
                           else "no gain: the same step predicted"), "settle": ""}
    if under_interleave_margin:
        return {"reason": f"predicted less than {INTERLEAVE_MARGIN_PCT:g}% faster than the best "
                          f"change that keeps the schedule", "settle": ""}
    if c.interval_spans_no_gain:
        return {"reason": f"its interval {c.predicted_low_us / 1e3:.1f}–"
                          f"{c.predicted_high_us / 1e3:.1f} ms reaches the measured "
                          f"{c.measured_step_us / 1e3:.1f} ms: it may gain nothing",
                "settle": "a run with the change (pardiag compare), or a model that explains "
                          "more of the step (more samples of its timings)"}
    if noisy:
        return {"reason": f"below the noise: predicted {c.gain_pct:.1f}% faster, inside the "
                          f"step's noise ±{margin:.1f}%",
                "settle": more}
    unmeasured = step is None or not step.known
    return {"reason": f"below the margin: predicted {c.gain_pct:.1f}% faster, less than "
                      f"{margin:.1f}% of the step",
            "settle": "more steps: with fewer than 3 the step's noise is not measured"
                      if unmeasured else ""}
