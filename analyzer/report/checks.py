"""Closing the loop (:mod:`.compare`): each change the first run's report evaluated whose
``params`` the second run's setup equals is applied, and its predicted step time and peak
memory are set beside what the second run measured (:class:`RecommendationCheck`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pandas as pd

from ..analyses.runsetup import SETUP_LABELS, schedule_name
from .reading import StepDelta, num, pct_change, peak_bytes, straggler_of, value_text
from .schema import RecommendationEntry, ReportDocument, SetupSection, to_builtins

#: ``params`` keys that describe a recommendation but are not part of the change.
_DESCRIPTIVE_PARAMS = {"layer_names"}


#: Setup fields a recommendation's ``params`` key is about (other changed fields are listed
#: as "also changed").
_PARAM_FIELDS = {
    "microbatches": {"microbatches"}, "schedule": {"pipeline_schedule"},
    "stages_per_rank": {"stages_per_rank", "pipeline_stages"},
    "layers_per_stage": {"layers_per_stage"},
    "pp": {"dims", "strategies", "pipeline_schedule", "pipeline_stages", "stages_per_rank",
           "microbatches", "layers_per_stage", "ddp_bucket_cap_bytes"},
    "dp": {"dims"}, "tp": {"dims", "strategies"},
    "ddp_bucket_cap_bytes": {"ddp_bucket_cap_bytes"},
    "reshard_after_forward": {"fsdp_reshard_after_forward"},
    "fsdp_sharding_strategy": {"fsdp_reshard_after_forward"},
    "fsdp_forward_prefetch": {"fsdp1_forward_prefetch"},
    "strategy": {"strategies"},
    "zero_stage": {"zero_stage", "strategies"},
    "reduce_bucket_size": {"zero_reduce_bucket_size"},
    "overlap_comm": {"zero_overlap_comm"},
}


@dataclasses.dataclass(frozen=True)
class RecommendationCheck:
    """One change A's report evaluated, checked against B's setup.

    Attributes:
        kind, title, change, params: the recommendation as A's report gave it.
        rank: its place among A's recommendations (1 = top), None when it was evaluated and not
            recommended.
        status: ``"applied"`` (B's setup equals every part of ``params``), ``"not applied"`` (a
            part differs) or ``"unknown"`` (B's setup does not show a part).
        why: one line: what matched, differed or is unknown.
        a_step_us: A's measured step the prediction started from (µs).
        predicted_step_us: A's prediction (µs).
        b_step_us: B's measured step (µs; :attr:`StepDelta.b`).
        error_pct: 100 · (predicted − B's measured) / B's measured; None unless applied.
        predicted_peak_bytes: A's predicted peak memory of the worst rank (bytes), or None.
        b_peak_bytes: B's measured peak of its worst rank (``memory.per_rank[].peak_bytes``,
            static + transient, as the recommendations measure it), or None.
        peak_error_pct: 100 · (predicted − measured) / measured peak; None unless both known.
        also_changed: labels of other setup fields that differ between A and B (they also move
            the measurement).
        args_changed: the script arguments that differ, ``"--flag: a → b"`` each (how the
            change was made, and anything else changed with it).
    """

    kind: str
    title: str
    change: str
    params: dict[str, Any]
    rank: int | None
    status: str
    why: str
    a_step_us: float | None
    predicted_step_us: float | None
    b_step_us: float | None
    error_pct: float | None
    predicted_peak_bytes: float | None
    b_peak_bytes: float | None
    peak_error_pct: float | None
    also_changed: tuple[str, ...] = ()
    args_changed: tuple[str, ...] = ()


#: The setup field each ``params`` key is read from (for "B has none" versus "unknown").
_PARAM_FIELD = {"microbatches": "microbatches", "schedule": "pipeline_schedule",
                "stages_per_rank": "stages_per_rank", "layers_per_stage": "layers_per_stage",
                "ddp_bucket_cap_bytes": "ddp_bucket_cap_bytes",
                "reshard_after_forward": "fsdp_reshard_after_forward",
                "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
                "fsdp_forward_prefetch": "fsdp1_forward_prefetch", "pp": "dims", "dp": "dims",
                "tp": "dims", "zero_stage": "zero_stage",
                "reduce_bucket_size": "zero_reduce_bucket_size",
                "overlap_comm": "zero_overlap_comm"}


def _param_value(key: str, setup: SetupSection) -> Any:
    """What a run's setup says about one ``params`` key of a recommendation (None: unknown or
    not applicable, see :data:`_PARAM_FIELD`)."""
    dims = setup.dims
    strategies = setup.strategies
    if key in ("pp", "dp", "tp"):
        return None if dims is None else int(dims.get(key, 1))
    if key == "fsdp_sharding_strategy":
        raf = setup.fsdp_reshard_after_forward
        if strategies is None or raf is None or "fsdp1" not in strategies:
            return None
        return "FULL_SHARD" if raf else "SHARD_GRAD_OP"
    if key in _PARAM_FIELD:
        return getattr(setup, _PARAM_FIELD[key])
    return None


def _same(want: object, have: object) -> bool:
    if isinstance(want, (int, float)) and isinstance(have, (int, float)) and not isinstance(
            want, bool) and not isinstance(have, bool):
        return abs(want - have) <= 0.01 * max(abs(want), 1e-12)   # 1%: bucket_cap_mb rounding
    if isinstance(want, str) and isinstance(have, str) and want != have:
        return (schedule_name(want) or want) == (schedule_name(have) or have)
    return want == have


def _check_params(params: dict[str, Any], sb: SetupSection, summary_b: ReportDocument
                  ) -> tuple[str, str]:
    """(status, why) of one recommendation's ``params`` against B's setup."""
    parts, unknown, differ = [], [], []
    for key, want in params.items():
        if key in _DESCRIPTIVE_PARAMS:
            continue
        if key == "without_rank":
            sb_strag = straggler_of(summary_b)
            if summary_b.sync is None:
                unknown.append(f"whether rank {want} still straggles (B has no synchronization "
                               "analysis)")
            elif sb_strag == want:
                differ.append(f"rank {want} is still the straggler in B")
            else:
                parts.append(f"rank {want} is no longer the straggler in B (measured: the setup "
                             "cannot show what slowed it)")
            continue
        if key == "strategy":
            have = sb.strategies
            if have is None:
                unknown.append("B's strategies")
            elif any(str(s).startswith(str(want)) for s in have):
                parts.append(f"B uses {want}")
            else:
                differ.append(f"strategy {want}: B uses {value_text(have)}")
            continue
        have = _param_value(key, sb)
        field = _PARAM_FIELD.get(key)
        if have is None and field and sb.source == "recorded" and field not in (
                sb.unknown or ()):
            differ.append(f"{key}: recommended {value_text(want)}, B has no "
                          f"{SETUP_LABELS.get(field, field)}")
        elif have is None:
            what = {"fsdp_prefetch": "FSDP2 explicit prefetching is not recorded",
                    "innermost": "the order of the mesh dimensions is not recorded"}.get(
                key, f"B's {key} is not known")
            unknown.append(what)
        elif _same(want, have):
            parts.append(f"B has {key} {value_text(want)}")
        else:
            differ.append(f"{key}: recommended {value_text(want)}, B has {value_text(have)}")
    if differ:
        return "not applied", "; ".join(differ)
    if unknown:
        return "unknown", "; ".join(unknown)
    if not parts:
        return "unknown", "the recommendation names no setting"
    return "applied", "; ".join(parts)


#: Setup fields that make B another job, not A changed: a recommendation B seems to have made
#: is not taken as applied (nor its prediction checked) while one of these also differs.
_STRUCTURE = ("script", "world_size", "nnodes", "dims", "strategies", "pipeline_schedule",
              "pipeline_stages", "devices", "backend")


def check_recommendations(summary_a: ReportDocument, summary_b: ReportDocument, sb: SetupSection,
            setup: pd.DataFrame, step: StepDelta) -> tuple[RecommendationCheck, ...]:
    b_step = step.b.median_us if step.b is not None else None
    b_peak = peak_bytes(summary_b)
    args = setup[setup["field"] == "script_args"]
    args_changed = tuple(x for d in args["detail"] for x in str(d).split("; ") if x)
    # a field used by one run only is a difference too (a pipeline against none)
    changed = setup[setup["status"].isin(("changed", "not used in A", "not used in B"))]
    out = []
    recs: list[tuple[int | None, RecommendationEntry]] = [
        (i, r) for i, r in enumerate(summary_a.recommendations, 1)]
    recs += [(None, r) for r in summary_a.not_recommended]
    for rank, r in recs:
        params = to_builtins(r.params)   # the keys its kind wrote, in their order
        status, why = _check_params(params, sb, summary_b)
        explained = {"script_args"} | {f for k in params for f in _PARAM_FIELDS.get(k, ())}
        also = tuple(row.label for row in changed.itertuples() if row.field not in explained)
        other_job = [row.label for row in changed.itertuples()
                     if row.field in _STRUCTURE and row.field not in explained]
        if status == "applied" and other_job:
            status, why = "unknown", (
                f"B is not A with this change alone: it also differs in "
                f"{', '.join(other_job)} ({why})")
        pred = num(r.predicted_step_us)
        ppeak = num(r.predicted_peak_bytes)
        applied = status == "applied"
        out.append(RecommendationCheck(
            kind=str(r.kind), title=str(r.title), change=str(r.change),
            params=params, rank=rank, status=status, why=why,
            a_step_us=num(r.measured_step_us), predicted_step_us=pred,
            b_step_us=b_step,
            error_pct=pct_change(b_step, pred) if applied and b_step else None,
            predicted_peak_bytes=ppeak if not math.isnan(ppeak) else None, b_peak_bytes=b_peak,
            peak_error_pct=(pct_change(b_peak, ppeak)
                            if applied and b_peak and not math.isnan(ppeak) else None),
            also_changed=also, args_changed=args_changed))
    order = {"applied": 0, "unknown": 1, "not applied": 2}
    return tuple(sorted(out, key=lambda c: (order.get(c.status, 3), c.rank is None,
                                            c.rank or 0)))
