"""FSDP settings: keep parameters unsharded between forward and backward; prefetch."""

from __future__ import annotations

import functools

import pandas as pd

from ....trace.classify import cached
from ....trace.traceset import TraceSet
from ..context import RuleContext
from ..types import Recommendation

#: Ranks whose events are read (FSDP ranges), at most.
SAMPLE_RANKS = 8
#: FSDP2 explicit prefetching evaluated: this many units ahead.
FSDP_PREFETCH = 2


def _fsdp_ranges(traces: TraceSet, steps: float) -> pd.DataFrame:
    """Per rank (at most :data:`SAMPLE_RANKS`), per step: ``pre_forward`` (units gathered in
    the forward: FSDP2's ``FSDP::pre_forward`` ranges, FSDP1's
    ``FullyShardedDataParallel._pre_forward``), ``pre_backward_us`` and
    ``backward_prefetch_us`` (time inside FSDP2's ``FSDP::pre_backward`` /
    ``FSDP::backward_prefetch``, FSDP1's ``FullyShardedDataParallel._pre_backward_hook`` /
    ``._pre_backward_prefetch`` ranges). One pass over each trace's events, kept on the
    trace."""
    def scan(trace) -> tuple[int, float, float]:
        ev = trace.events
        names = ev["name"]
        fwd = (names.str.startswith("FSDP::pre_forward")
               | (names == "FullyShardedDataParallel._pre_forward")).to_numpy()
        bwd = (names.str.startswith("FSDP::pre_backward")
               | (names == "FullyShardedDataParallel._pre_backward_hook")).to_numpy()
        pre = (names.str.startswith("FSDP::backward_prefetch")
               | (names == "FullyShardedDataParallel._pre_backward_prefetch")).to_numpy()
        dur = ev["dur"].to_numpy()
        return int(fwd.sum()), float(dur[bwd].sum()), float(dur[pre].sum())

    rows = []
    for rank in sorted(traces.ranks)[:SAMPLE_RANKS]:
        trace = traces.ranks[rank]
        n, bwd, pre = cached(trace, "fsdp_ranges", functools.partial(scan, trace))
        rows.append({"rank": rank, "pre_forward": n / steps, "pre_backward_us": bwd / steps,
                     "backward_prefetch_us": pre / steps})
    return pd.DataFrame(rows, columns=["rank", "pre_forward", "pre_backward_us",
                                       "backward_prefetch_us"])


def fsdp_reshard(ctx: RuleContext) -> list[Recommendation]:
    """Keeping the parameters unsharded between forward and backward (FSDP2
    ``reshard_after_forward=False``, FSDP1 ``ShardingStrategy.SHARD_GRAD_OP``) when the run
    reshards: the backward's unsharding — the time inside FSDP2's ``FSDP::pre_backward`` /
    FSDP1's ``_pre_backward_hook`` ranges, median over ranks per step — is saved; without those
    ranges the backward's share of the exposed all-gather time. Peak: + the parameters
    unsharded over the DP degree."""
    traces, lay, measured = ctx.traces, ctx.settings, ctx.measured_us
    strategies = lay.get("strategies") or []
    fsdp1 = "fsdp1" in strategies and "fsdp2" not in strategies
    if not ({"fsdp1", "fsdp2"} & set(strategies)) or not lay.get("fsdp_reshard_after_forward"):
        return []
    per_rank = ctx.all_gathers
    if per_rank.empty or not (measured > 0):
        return []
    steps = ctx.steps_per_rank
    n = float(per_rank["count"].median()) / steps
    # the backward's unsharding (re-gather, wait, copy-out) runs inside FSDP2's
    # "FSDP::pre_backward" (FSDP1's "_pre_backward_hook") ranges: the time they take is what
    # keeping the parameters saves
    pre_bwd = _fsdp_ranges(traces, steps)["pre_backward_us"]
    pre_bwd = pre_bwd[pre_bwd > 0]
    if len(pre_bwd):
        saving = float(pre_bwd.median())
        rng = "FullyShardedDataParallel._pre_backward_hook" if fsdp1 else "FSDP::pre_backward"
        how = (f"the backward's unsharding ({rng}) takes {saving / 1000:.2f} ms per step")
    else:   # no FSDP2 annotations: the backward's share of the exposed all-gathers
        units = (n + 1) / 2
        saving = float(per_rank["exposed"].median()) / steps * ((units - 1) / n if n else 0.0)
        how = (f"all-gathers leave {per_rank['exposed'].median() / steps / 1000:.2f} ms per "
               "step exposed; the backward's share is saved")
    pred = measured - saving
    peak = ctx.peak.peak_bytes
    dp = int((lay.get("dims") or {}).get("dp") or 0)
    params_b = ctx.params_bytes
    pred_peak = ((peak + params_b * (dp - 1)) if (peak is not None and params_b and dp > 1)
                 else None)
    change, params = (("FSDP sharding_strategy=ShardingStrategy.SHARD_GRAD_OP",
                       {"fsdp_sharding_strategy": "SHARD_GRAD_OP"}) if fsdp1 else
                      ("FSDP reshard_after_forward=False", {"reshard_after_forward": False}))
    return [Recommendation(
        kind="fsdp_reshard", title="Keep parameters unsharded between forward and backward",
        change=change,
        evidence=(f"{n:.0f} all-gathers per step, about half of them in the backward", how),
        caveats=("each rank then holds the unsharded parameters of every unit from its forward "
                 "to its backward",),
        measured_step_us=measured, predicted_step_us=pred,
        measured_peak_bytes=peak, predicted_peak_bytes=pred_peak,
        fits_memory=ctx.fits(pred_peak),
        params=params)]


def fsdp_prefetch(ctx: RuleContext) -> list[Recommendation]:
    """FSDP2 explicit prefetching (``set_modules_to_forward_prefetch`` /
    ``set_modules_to_backward_prefetch``, :data:`FSDP_PREFETCH` units ahead), or FSDP1's
    ``forward_prefetch=True`` (the next unit; when the run did not set it).

    On a GPU the all-gathers run on their own stream: the forward's exposed all-gather time
    (its share of the all-gathers) is saved except the first unit's, which nothing precedes.
    On CPU FSDP waits for each all-gather in the thread that issues it — the backward's
    prefetch (the default of both) already shows this: its ranges last as long as the gathers — so
    issuing them earlier hides nothing: predicted unchanged. One more gathered unit is held at
    a time (the unsharded parameters over the units, added to the peak). Reads at most
    :data:`SAMPLE_RANKS` ranks' events."""
    traces, lay, measured = ctx.traces, ctx.settings, ctx.measured_us
    strategies = lay.get("strategies") or []
    fsdp1 = "fsdp1" in strategies and "fsdp2" not in strategies
    if (not ({"fsdp1", "fsdp2"} & set(strategies)) or not (measured > 0)
            or (fsdp1 and lay.get("fsdp1_forward_prefetch"))):
        return []
    per_rank = ctx.all_gathers
    if per_rank.empty:
        return []
    steps = ctx.steps_per_rank
    ranges = _fsdp_ranges(traces, steps)
    units = float(ranges["pre_forward"].median()) if len(ranges) else 0.0
    if units < 2:
        return []
    n_ag = float(per_rank["count"].median()) / steps
    exposed = float(per_rank["exposed"].median()) / steps
    on_gpu = ctx.on_gpu
    if on_gpu:
        fwd_exposed = exposed * min(units / n_ag, 1.0) if n_ag else 0.0
        saving = fwd_exposed * (units - 1) / units
        how: tuple[str, ...] = (
            f"{units:.0f} FSDP units gather in the forward; the all-gathers leave "
            f"{exposed / 1000:.2f} ms per step exposed, {fwd_exposed / 1000:.2f} ms of it "
            "in the forward", "the first unit's gather has nothing before it to hide behind")
        caveats = ("assumes each gather fits behind the compute of the unit before it",)
    else:
        saving = 0.0
        in_prefetch = float(ranges["backward_prefetch_us"].median())
        how = (f"on CPU FSDP{1 if fsdp1 else 2} waits for each all-gather where it is "
               f"issued: its backward prefetch (on by default) spends "
               f"{in_prefetch / 1000:.2f} ms per step inside those ranges, so gathering "
               f"earlier hides nothing",)
        caveats = ("on CPU the gathers share the cores with the compute",)
    peak = ctx.peak.peak_bytes
    dp = int((lay.get("dims") or {}).get("dp") or 0)
    params_b = ctx.params_bytes
    unit_bytes = params_b * max(dp, 1) / units if params_b else None   # one unsharded unit
    pred_peak = peak + unit_bytes if (peak is not None and unit_bytes) else None
    if fsdp1:
        title, change = "Prefetch the next FSDP unit in the forward", "FSDP forward_prefetch=True"
        params: dict[str, object] = {"fsdp_forward_prefetch": True}
    else:
        title = f"Prefetch {FSDP_PREFETCH} FSDP units ahead"
        change = (f"FSDP2 explicit prefetching: set_modules_to_forward_prefetch / "
                  f"set_modules_to_backward_prefetch with the next {FSDP_PREFETCH} units")
        params = {"fsdp_prefetch": FSDP_PREFETCH}
    return [Recommendation(
        kind="fsdp_prefetch", title=title, change=change,
        evidence=how, caveats=caveats, measured_step_us=measured,
        predicted_step_us=measured - saving, measured_peak_bytes=peak,
        predicted_peak_bytes=pred_peak,
        fits_memory=ctx.fits(pred_peak),
        params=params)]
