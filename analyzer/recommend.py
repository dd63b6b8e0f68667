"""Recommendations: what to change, and how much it will help (issue #5).

Interface used by the renderers (HTML, terminal) and the JSON summary:

``report.results.get("recommendations")`` is a :class:`RecommendationResult` (or absent).
Each :class:`Recommendation` is ranked by predicted gain, best first.
"""

from __future__ import annotations

import dataclasses


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
        gain_pct: ``100 * (measured - predicted) / measured``.
        measured_peak_bytes: measured peak memory of the worst rank (bytes), None if unknown.
        predicted_peak_bytes: predicted peak memory of the worst rank (bytes), None if unknown.
        fits_memory: False when the prediction exceeds the device capacity (then not recommended).
    """

    kind: str
    title: str
    change: str
    evidence: tuple[str, ...] = ()
    caveats: tuple[str, ...] = ()
    measured_step_us: float
    predicted_step_us: float
    gain_pct: float
    measured_peak_bytes: float | None = None
    predicted_peak_bytes: float | None = None
    fits_memory: bool = True

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"evidence": list(self.evidence),
                                           "caveats": list(self.caveats)}


@dataclasses.dataclass(frozen=True)
class RecommendationResult:
    """Ranked recommendations plus a one-sentence verdict.

    Attributes:
        verdict: one sentence: the largest loss and what it costs (e.g. "exposed communication
            is 31% of the step").
        recommendations: ranked, best first; only those that fit in memory and gain > 0.
        rejected: evaluated changes not recommended (no gain, or do not fit), for the JSON.
        why_none: when ``recommendations`` is empty, why (e.g. "no traces with steps").
    """

    verdict: str
    recommendations: tuple[Recommendation, ...] = ()
    rejected: tuple[Recommendation, ...] = ()
    why_none: str = ""
