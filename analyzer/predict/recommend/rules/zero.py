"""DeepSpeed ZeRO: the stage up or down, the reduce bucket against the model's size, the
all-gather bucket (which changes nothing where torch has ``all_gather_into_tensor``), and
overlapping the gradient reduction with the backward.

Memory per rank (ZeRO: Memory Optimizations Toward Training Trillion Parameter Models,
Rajbhandari et al., §5 — Ψ parameters, N ranks, e bytes per parameter and per gradient, K bytes
of optimizer state per parameter, 12 for mixed-precision Adam; this rank's K is measured: its
optimizer state × N / Ψ):

* stage 1: e·Ψ + e·Ψ + K·Ψ/N (the optimizer state partitioned);
* stage 2: e·Ψ + (e + K)·Ψ/N (the gradients too);
* stage 3: (2e + K)·Ψ/N (the parameters too).

Communication per optimizer step, with A micro-batches per step
(``gradient_accumulation_steps``; the paper's §7 for one: stages 1 and 2 move what DDP moves,
stage 3 half as much again), as DeepSpeed's stages run it: stage 1 accumulates whole gradients
and reduces them once per step (r); stage 2 keeps only its gradient partition, so it reduces
every micro-batch (A·r); both gather the updated partitions once per step (g, one gather of Ψ);
stage 3 instead gathers the parameters before each module's forward and backward, every micro-
batch, and not the updated partitions (2A·g, with reduce-scatters in place of the reductions:
A·r). r and g come from the measured stage (stage 1: r = its reductions, g = its gathers; stage
2: r = reductions / A; stage 3: r = reduce-scatters / A, g = gathers / 2A), and the step moves
by the difference of the two stages' communication times the share of it that the measured
collectives exposed. Stage 3's per-module hooks run on the host: leaving stage 3, up to the host
time outside operators (Python) goes with them — the prediction's interval reaches down by all
of it, the point prediction takes half; going to stage 3 they add host time not modelled, a
caveat. When the worst rank's peak reaches :data:`MEMORY_BOUND` of device memory, the higher
stage is a memory change (``zero_shard``), ranked ahead of speed.
"""

from __future__ import annotations

import math
from typing import Any

from ..context import RuleContext
from ..types import Recommendation

#: A reduce bucket over this many times the model's gradient holds memory nothing fills.
BUCKET_SLACK = 2.0
#: A run whose worst rank's peak reaches this share of device memory is memory-bound: a higher
#: stage is then proposed to shrink it (kind ``zero_shard``, ranked with the memory changes).
MEMORY_BOUND = 0.9


def _parts(ctx: RuleContext, ds: dict) -> tuple[float, float, float, float] | None:
    """``(Ψ, e, K, N)`` from the worst rank's static memory and the recorded stage; None when
    the static memory was not recorded."""
    pr = ctx.memory.per_rank if ctx.memory is not None else None
    if pr is None or pr.empty or not pr["static_bytes"].notna().any():
        return None
    i = pr["static_bytes"].idxmax()
    p_, o_ = (float(pr.loc[i, c] or 0.0) for c in ("params_bytes", "optimizer_state_bytes"))
    n = max(int(ds.get("dp_size") or 1), 1)
    e = {"float32": 4.0, "float64": 8.0}.get(str(ds.get("param_dtype")), 2.0)
    psi = (p_ * n if int(ds.get("stage") or 0) >= 3 else p_) / e
    if psi <= 0:
        return None
    return psi, e, o_ * n / psi, float(n)


def static_at(stage: int, psi: float, e: float, k: float, n: float) -> float:
    """Static bytes per rank at ZeRO ``stage`` (module docstring)."""
    if stage >= 3:
        return (2 * e + k) * psi / n
    if stage == 2:
        return e * psi + (e + k) * psi / n
    if stage == 1:
        return 2 * e * psi + k * psi / n
    return (2 * e + k) * psi


def _per_step(ctx: RuleContext, ops: tuple[str, ...], col: str = "time_us") -> float:
    """The worst rank's time in collectives ``ops`` per profiled step (µs)."""
    c = ctx.breakdown.collectives
    sub = c[c["collective"].isin(ops)]
    if sub.empty:
        return 0.0
    return float(sub.groupby("rank")[col].sum().max()) / max(ctx.steps_per_rank, 1.0)


def stage_comm_us(stage: int, r: float, g: float, a: int) -> float:
    """Gradient reduction and gather time per optimizer step at ZeRO ``stage`` (µs; module
    docstring): ``r`` one gradient reduction, ``g`` one gather of the parameters, ``a``
    micro-batches per step."""
    if stage >= 3:
        return a * r + 2 * a * g
    return (a if stage == 2 else 1) * r + g


def _host_outside_us(ctx: RuleContext) -> float:
    """Host time outside operators per step (µs, the median over ranks of each rank's median
    step): the Python around the ops, where ZeRO-3's hooks run."""
    pr = ctx.causes.per_rank if ctx.causes is not None else None
    if pr is None or pr.empty or "other_us" not in pr:
        return 0.0
    v = pr["other_us"].dropna()
    return float(v.median()) if len(v) else 0.0


def _stage_changes(ctx: RuleContext, ds: dict, parts, measured: float) -> list[Recommendation]:
    stage = int(ds.get("stage") or 0)
    a = max(int(ds.get("gradient_accumulation_steps") or 1), 1)
    psi, e, k, n = parts
    peak = ctx.peak.peak_bytes
    now = static_at(stage, psi, e, k, n)
    red = _per_step(ctx, ("all_reduce", "reduce_scatter"))
    gat = _per_step(ctx, ("all_gather",))
    total = red + gat
    exposed = (_per_step(ctx, ("all_reduce", "reduce_scatter", "all_gather"), "exposed_us")
               / total) if total > 0 else 1.0
    r = red / (a if stage >= 2 else 1)
    g = gat / (2 * a) if stage >= 3 else gat
    comm_now = stage_comm_us(stage, r, g, a)
    outside = _host_outside_us(ctx) if stage >= 3 else 0.0
    bound = ctx.capacity is not None and peak is not None and peak >= MEMORY_BOUND * ctx.capacity
    out = []
    for new in (s for s in (stage - 1, stage + 1) if 1 <= s <= 3):
        then = static_at(new, psi, e, k, n)
        comm_then = stage_comm_us(new, r, g, a)
        pred = measured + (comm_then - comm_now) * exposed
        interval: dict[str, Any] = (
            {"predicted_low_us": pred - outside, "predicted_high_us": pred} if outside > 0 else {})
        pred -= outside / 2
        pred_peak = peak - now + then if peak is not None else None
        moves = "more" if new > stage else "less"
        shard = bound and new > stage
        memory_line: tuple[str, ...] = ()
        if shard:
            assert peak is not None and ctx.capacity is not None  # memory bound
            memory_line = (f"peak {peak / 2**30:.2f} GiB of {ctx.capacity / 2**30:.2f} GiB device "
                           f"memory ({100 * peak / ctx.capacity:.0f}%)",)
        out.append(Recommendation(
            kind="zero_shard" if shard else "zero_stage",
            title=f"ZeRO stage {new} instead of {stage}"
                  + (" to fit device memory" if shard else ""),
            change=f"zero_optimization.stage {new} (now {stage}) over dp={int(n)}",
            evidence=(f"static per rank at stage {stage}: {now / 2**20:.2f} MiB; at stage {new}: "
                      f"{then / 2**20:.2f} MiB (Ψ = {psi:,.0f} parameters of {e:g} bytes, "
                      f"{k:.1f} bytes of optimizer state each, N = {int(n)}; the ZeRO paper)",
                      f"per step now: gradient reductions {red / 1000:.2f} ms, all-gathers "
                      f"{gat / 1000:.2f} ms ({100 * exposed:.0f}% exposed), {a} micro-batch(es); "
                      f"at stage {new}: {comm_then / 1000:.2f} ms in all", *memory_line),
            caveats=(f"stage {new} shards {moves}; the change in communication is taken as "
                     "exposed as the measured collectives were",
                     *(("stage 3's per-module hooks add host time that is not modelled: the "
                        "step may be slower than predicted",) if new == 3 else ()),
                     *((f"stage 3's per-module hooks run in the {outside / 1000:.1f} ms per step "
                        "of host time outside operators; up to all of it goes with them",)
                       if outside > 0 else ())),
            measured_step_us=measured, predicted_step_us=pred,
            measured_peak_bytes=peak, predicted_peak_bytes=pred_peak,
            fits_memory=ctx.fits(pred_peak), params={"zero_stage": new}, **interval))
    return out


def _bucket_change(ctx: RuleContext, ds: dict, parts, measured: float) -> list[Recommendation]:
    """A reduce bucket far larger than the model's gradient that the measured peak shows was
    allocated: DeepSpeed's stages 1 and 2 allocate it whole (twice with ``overlap_comm``),
    whatever the model holds; stage 3 fills its buckets as it goes."""
    bucket = ds.get("reduce_bucket_size")
    psi, e, _, _ = parts
    peak, static = ctx.peak.peak_bytes, ctx.peak.static_bytes
    if not isinstance(bucket, int) or bucket <= BUCKET_SLACK * psi:
        return []
    new = int(10 ** math.ceil(math.log10(psi)))   # one bucket still holds every gradient
    buffers = 2 if ds.get("overlap_comm") else 1
    saved = (bucket - new) * e * buffers
    # only what the peak shows: the transient memory holds at least half the buckets
    if peak is None or static is None or peak - static < 0.5 * bucket * e * buffers:
        return []
    return [Recommendation(
        kind="zero_bucket", title="A reduce bucket the size of the model",
        change=f"zero_optimization.reduce_bucket_size {new:.0e} (now {bucket:.0e} elements)",
        evidence=(f"the reduce bucket holds {bucket:,} elements ({bucket * e / 2**20:,.0f} MiB"
                  + (" each of 2 buffers, overlap_comm" if buffers == 2 else "")
                  + f") for a model of {psi:,.0f} parameters",
                  f"measured peak {peak / 2**20:,.0f} MiB" if peak is not None
                  else "peak memory not recorded"),
        caveats=("the gradients still reduce in one bucket per step, so the communication does "
                 "not change",),
        measured_step_us=measured, predicted_step_us=measured, measured_peak_bytes=peak,
        predicted_peak_bytes=(peak - saved) if peak is not None else None,
        params={"reduce_bucket_size": new})]


def _allgather_change(ctx: RuleContext, ds: dict, parts, measured: float
                      ) -> list[Recommendation]:
    """``allgather_bucket_size`` at stages 1 and 2, evaluated so that nobody tunes it for
    nothing: where torch has ``all_gather_into_tensor`` (every torch pardiag supports), DeepSpeed
    gathers each parameter group's updated partitions in one call whatever the bucket
    (``deepspeed/runtime/utils.py``: ``all_gather_dp_groups`` buckets only without it), so a
    bucket the size of the model changes neither the step nor the memory."""
    bucket = ds.get("allgather_bucket_size")
    if not isinstance(bucket, int) or int(ds.get("stage") or 0) >= 3:
        return []
    psi = parts[0]
    new = int(10 ** math.ceil(math.log10(psi)))
    if new == bucket:
        return []
    c = ctx.breakdown.collectives
    gathers = float(c.loc[c["collective"] == "all_gather", "count"].sum())
    per = max(ctx.steps_per_rank, 1.0) * max(len(ctx.breakdown.totals), 1)
    peak = ctx.peak.peak_bytes
    return [Recommendation(
        kind="zero_allgather_bucket", title="An all-gather bucket the size of the model",
        change=f"zero_optimization.allgather_bucket_size {new:.0e} (now {bucket:.0e} elements)",
        evidence=(f"{gathers / per:.1f} all-gather(s) of the updated partitions per rank and step",
                  "DeepSpeed gathers each parameter group's partitions in one "
                  "all_gather_into_tensor, whatever allgather_bucket_size (it buckets only "
                  "where torch lacks that call)"),
        caveats=(), measured_step_us=measured, predicted_step_us=measured,
        measured_peak_bytes=peak, predicted_peak_bytes=peak,
        params={"allgather_bucket_size": new})]


def _overlap_change(ctx: RuleContext, ds: dict, parts, measured: float
                    ) -> list[Recommendation]:
    """``overlap_comm``: the gradient reductions run beside the backward; the exposed part of
    their time, up to the compute they can hide behind, is saved."""
    if ds.get("overlap_comm") or int(ds.get("stage") or 0) >= 3:
        return []
    c = ctx.breakdown.collectives
    red = c[c["collective"].isin(["all_reduce", "reduce_scatter"])]
    if red.empty:
        return []
    per = max(ctx.steps_per_rank, 1.0)
    exposed = float(red.groupby("rank")["exposed_us"].sum().max()) / per
    tot = ctx.breakdown.totals
    compute = float(tot["compute_only_us"].min()) / per if len(tot) else 0.0
    hidden = min(exposed, compute)
    psi, e, _, _ = parts
    bucket = ds.get("reduce_bucket_size") or psi
    peak = ctx.peak.peak_bytes
    extra = min(int(bucket), int(psi)) * e   # a second reduction buffer
    # on a CPU the reduction's worker thread and the backward share the rank's cores: anything
    # from all of it to nothing may be hidden
    interval: dict[str, Any] = ({} if ctx.on_gpu else
                                {"predicted_low_us": measured - hidden,
                                 "predicted_high_us": measured})
    return [Recommendation(
        kind="zero_overlap", title="Overlap the gradient reduction with the backward",
        change="zero_optimization.overlap_comm true",
        evidence=(f"gradient reductions expose {exposed / 1000:.2f} ms per step; the compute "
                  f"only time is {compute / 1000:.2f} ms",),
        caveats=("DeepSpeed then keeps two reduction buffers",
                 *(() if ctx.on_gpu else ("on a CPU the reduction and the backward share the "
                                          "cores, so less may be hidden",))),
        measured_step_us=measured, predicted_step_us=measured - hidden, measured_peak_bytes=peak,
        predicted_peak_bytes=(peak + extra) if peak is not None else None,
        fits_memory=ctx.fits((peak + extra) if peak is not None else None),
        params={"overlap_comm": True}, **interval)]


def zero_changes(ctx: RuleContext) -> list[Recommendation]:
    """DeepSpeed ZeRO's stage, reduce bucket and overlap (module docstring), for a run whose
    recorded layout carries DeepSpeed's settings and whose data parallelism spans more than
    one rank (with one, ZeRO partitions nothing: DeepSpeed's pipeline engine over the whole
    world)."""
    ds = ctx.settings.get("deepspeed")
    measured = ctx.measured_us
    if not isinstance(ds, dict) or not (measured > 0):
        return []
    if int(ds.get("dp_size") or 1) <= 1:   # nothing to partition over, nothing reduced over it
        return []
    parts = _parts(ctx, ds)
    if parts is None:
        return []
    return (_stage_changes(ctx, ds, parts, measured) + _bucket_change(ctx, ds, parts, measured)
            + _allgather_change(ctx, ds, parts, measured)
            + _overlap_change(ctx, ds, parts, measured))
