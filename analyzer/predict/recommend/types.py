"""The recommendation types: one proposed change, and the ranked result of a report."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np

from .. import shapes


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recommendation:
    """One proposed change and its predicted effect.

    Attributes:
        kind: short machine name (``"microbatches"``, ``"rebalance_stages"``, ``"straggler"``…).
        title: one-line human summary.
        change: the concrete change (e.g. ``"microbatches 16"``, ``"stages [0–5 | 6–11]"``).
        evidence: measured numbers behind it, one sentence each.
        caveats: what the model does not know, one sentence each.
        measured_step_us: measured step time (µs), median over steps and ranks' max.
        predicted_step_us: predicted step time after the change (µs).
        gain_pct: ``100 * (measured - predicted) / measured`` (derived when not given).
        measured_peak_bytes: measured peak memory of the worst rank (bytes), None if unknown.
        predicted_peak_bytes: predicted peak memory of the worst rank (bytes), None if unknown.
        fits_memory: False when the prediction exceeds the device capacity (then not recommended).
        params: the change in machine-readable form, e.g. ``{"microbatches": 16}``,
            ``{"layers_per_stage": [5, 5]}``, ``{"without_rank": 1}``,
            ``{"ddp_bucket_cap_bytes": 4194304}``, ``{"reshard_after_forward": False}``.
        ruled_out: why the candidate cannot be built with the model's shapes or batch
            (:mod:`pardiag.analyzer.predict.shapes`, e.g. ``"tp=4 does not divide 6 attention heads
            (attn)"``); then it is not recommended and has no prediction (NaN step time).
            Empty when it can be built.
        batch: what the change does to the global batch, per-rank batch, microbatch size and
            optimizer steps per sample (:func:`pardiag.analyzer.predict.shapes.optimizer_effects`).
        optimizer_effect: the same as one statement; when the global batch changes it says
            that the learning rate and warm-up need retuning. Defaults to "nothing changes".
        tier: 1 for the best recommendations, 2 for the next…: recommendations whose predicted
            step times lie within the run's noise of each other share a tier
            (:mod:`pardiag.analyzer.predict.recommend.policy`); None when not recommended.
        predicted_low_us, predicted_high_us: the 95% interval of the prediction (µs) where it
            rests on stand-in timings taken after the run (a stand-in model under DDP, the
            stage modules at other sizes, all-reduces of chosen sizes): the prediction with
            each stand-in median at the low, then the high end of its bootstrap interval
            (:func:`pardiag.analyzer.predict.recommend.context.step_noise`); NaN when the prediction
            rests on no stand-in or its samples were not recorded. A change whose interval
            reaches the measured step ("no gain") is not recommended
            (:func:`pardiag.analyzer.predict.recommend.policy.rank`).
        reason: for a change not recommended, why, one phrase (ruled out by the shapes, does
            not fit in memory, its interval reaches the step, below the noise ±X%, no gain,
            under the interleaving margin); empty when recommended.
        settle: for a change not recommended, what would settle it (more steps, pinned ranks,
            a run of the change); empty when nothing would.
        measured_mfu_pct, predicted_mfu_pct: the run's MFU at ``measured_step_us`` and at
            ``predicted_step_us`` (%): its model FLOPs per step over the step × the ranks' peaks
            (:func:`with_mfu`); None where the model FLOPs or a peak are unknown, or the change
            alters the global batch (and with it the FLOPs per step).
    """

    kind: str
    title: str
    change: str
    evidence: tuple[str, ...] = ()
    caveats: tuple[str, ...] = ()
    measured_step_us: float
    predicted_step_us: float
    # None only until __post_init__ derives it: a float on every instance
    gain_pct: float = None  # type: ignore[assignment]
    measured_peak_bytes: float | None = None
    predicted_peak_bytes: float | None = None
    fits_memory: bool = True
    params: dict = dataclasses.field(default_factory=dict)
    ruled_out: str = ""
    batch: dict = dataclasses.field(default_factory=dict)
    optimizer_effect: str = ""
    tier: int | None = None
    predicted_low_us: float = float("nan")
    predicted_high_us: float = float("nan")
    reason: str = ""
    settle: str = ""
    measured_mfu_pct: float | None = None
    predicted_mfu_pct: float | None = None

    @property
    def interval_known(self) -> bool:
        """Whether the prediction carries a stand-in interval."""
        return not (math.isnan(self.predicted_low_us) or math.isnan(self.predicted_high_us))

    @property
    def interval_spans_no_gain(self) -> bool:
        """Whether a change predicted faster has an interval that reaches the measured step: it
        may gain nothing (False when unknown, and for a change predicted no faster, whose
        interval lying above the step says nothing more)."""
        # an interval that ends at the step ends there however it was rounded: a ratio applied
        # to both (as_ratio) leaves them a last bit apart
        return (self.interval_known and self.predicted_step_us < self.measured_step_us
                and self.predicted_high_us >= self.measured_step_us * (1.0 - 1e-9))

    def __post_init__(self) -> None:
        if self.gain_pct is None:   # derived from the two step times unless given
            m = self.measured_step_us
            object.__setattr__(self, "gain_pct", 100.0 * (m - self.predicted_step_us) / m
                               if m > 0 else 0.0)
        if not self.optimizer_effect and not self.ruled_out:   # a change that keeps the batch
            batch, text = shapes.optimizer_effects(shapes.Batch())
            object.__setattr__(self, "batch", batch)
            object.__setattr__(self, "optimizer_effect", text)

    def to_json(self) -> dict:
        """The fields as JSON values (a NaN, such as a ruled-out candidate's prediction, as
        None)."""
        out = dataclasses.asdict(self) | {"evidence": list(self.evidence),
                                          "caveats": list(self.caveats)}
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in out.items()}


def with_mfu(rec: Recommendation, flops_per_step: float | None,
             peak_flops: float | None) -> Recommendation:
    """``rec`` with its MFU at the measured and the predicted step: ``flops_per_step`` (the
    ranks' model FLOPs per step, summed) / (step × ``peak_flops``, the ranks' peaks summed,
    FLOP/s), in %. Unchanged where either is unknown, the change is ruled out, or it alters the
    global batch (the FLOPs per step change with it)."""
    if (not flops_per_step or not peak_flops or rec.ruled_out
            or (rec.batch or {}).get("global_batch_changes")):
        return rec

    def mfu(us: float) -> float | None:
        return 100.0 * flops_per_step / (us / 1e6 * peak_flops) if us and us > 0 else None

    now, then = mfu(rec.measured_step_us), mfu(rec.predicted_step_us)
    if now is None or then is None:
        return rec
    return dataclasses.replace(
        rec, measured_mfu_pct=now, predicted_mfu_pct=then,
        evidence=(*rec.evidence, f"MFU {now:.1f}% at the measured step, {then:.1f}% at the "
                                 f"predicted one (the same FLOPs per step)"))


def ruled_out(kind: str, title: str, change: str, params: dict, measured: float,
              why: str) -> Recommendation:
    """A candidate the model's shapes or batch rule out (:mod:`pardiag.analyzer.predict.shapes`):
    listed among those not recommended with the reason, and no prediction (NaN step time)."""
    return Recommendation(kind=kind, title=title, change=change, measured_step_us=measured,
                          predicted_step_us=float("nan"), ruled_out=why, params=params)


def batch_fields(now: shapes.Batch, **factors: Fraction) -> dict:
    """``batch`` and ``optimizer_effect`` of a :class:`Recommendation` whose change multiplies
    the batch sizes by ``factors`` (:func:`pardiag.analyzer.predict.shapes.optimizer_effects`)."""
    batch, text = shapes.optimizer_effects(now, **factors)
    return {"batch": batch, "optimizer_effect": text}


#: What a :class:`StepTime` is measured on, in words (its ``basis``).
STEP_BASES = {
    "pipeline": ("pipeline steps, start to start of their chunks (unprofiled ones where "
                 "pardiag recorded them)"),
    "unprofiled": "unprofiled steps (optimizer-step periods after the profiler's window)",
    "profiled": "profiled steps (per step the slowest rank's span)",
}


@dataclasses.dataclass(frozen=True)
class StepTime:
    """The step time a run's recommendations are measured against (their
    ``measured_step_us``; the verdict's step), with the per-step values it is the median of.

    Attributes:
        basis: a key of :data:`STEP_BASES`: ``"pipeline"`` (start-to-start time of consecutive
            unprofiled pipeline steps), ``"unprofiled"`` (periods of consecutive optimizer steps
            after the profiler's window, per step the median over the ranks), ``"profiled"`` (per
            profiled step the slowest rank's span); outlier steps (over 1.5 × the median) left
            out.
        samples_us: the per-step values (µs).
    """

    basis: str
    samples_us: tuple[float, ...]

    def _q(self, q: float) -> float:
        return float(np.quantile(self.samples_us, q)) if self.samples_us else float("nan")

    @property
    def median_us(self) -> float:
        """Median of the samples (µs)."""
        return float(np.median(self.samples_us)) if self.samples_us else float("nan")

    def to_json(self) -> dict:
        """``{"basis", "basis_text", "steps", "median_us", "q1_us", "q3_us", "min_us", "max_us",
        "samples_us"}`` (µs; quartiles by linear interpolation, numpy's default)."""
        s = self.samples_us
        return {"basis": self.basis, "basis_text": STEP_BASES.get(self.basis, self.basis),
                "steps": len(s), "median_us": self.median_us, "q1_us": self._q(0.25),
                "q3_us": self._q(0.75), "min_us": min(s) if s else None,
                "max_us": max(s) if s else None, "samples_us": [float(x) for x in s]}


@dataclasses.dataclass(frozen=True)
class RecommendationResult:
    """Ranked recommendations plus a one-sentence verdict.

    Attributes:
        verdict: one sentence: the largest loss and what it costs (e.g. "exposed communication
            is 31% of the step").
        recommendations: ranked, best first; only those that fit in memory and gain > 0.
        rejected: evaluated changes not recommended (no gain, or do not fit), for the JSON.
        why_none: when ``recommendations`` is empty, why (e.g. "no traces with steps").
        noise_rule: the rule a predicted gain had to clear, with the measured noise it used
            (one sentence, :func:`pardiag.analyzer.predict.recommend.policy.rank`).
        min_gain_pct: the predicted saving a change needed to be recommended (% of the step:
            the larger of the fixed minimum and the noise).
        noise_us: the step's noise: half its median's bootstrap interval (µs; NaN when it
            could not be measured).
        step: the measured step time the recommendations compare with (:class:`StepTime`),
            None when the traces hold no step.
        peak_definition: how every measured peak of the recommendations was taken
            (:class:`pardiag.analyzer.predict.recommend.context.MeasuredPeak`).
        straggler: the rank the verdict calls a straggler
            (:func:`pardiag.analyzer.predict.recommend.findings.identify_straggler`), None when
            it names none.
        not_evaluated: the pipeline changes a replayed pipeline could not evaluate beside
            those it did, and what each needs that the run does not hold ("" when none; when
            nothing was evaluated, ``why_none`` says it).
    """

    verdict: str
    recommendations: tuple[Recommendation, ...] = ()
    rejected: tuple[Recommendation, ...] = ()
    why_none: str = ""
    noise_rule: str = ""
    noise_us: float = float("nan")
    min_gain_pct: float = float("nan")
    peak_definition: str = ""
    step: StepTime | None = None
    straggler: int | None = None
    not_evaluated: str = ""

    @property
    def top_tier(self) -> tuple[Recommendation, ...]:
        """The recommendations of the best tier (within noise of each other), or ()."""
        return tuple(c for c in self.recommendations if c.tier == 1)
