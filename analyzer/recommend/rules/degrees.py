"""Other DP × TP degrees of the same ranks, each dimension at its measured latency and bandwidth."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

from pardiag.analyzer import shapes, whatif
from pardiag.analyzer.recommend.context import RuleContext
from pardiag.analyzer.recommend.types import Recommendation, batch_fields, ruled_out
from pardiag.analyzer.sync import P2P_OPS, busbw_factor


def _ring(n: int) -> float:
    """Bytes each rank moves per byte of buffer in a ring all-reduce, 2(n − 1)/n (the same for
    all-gather + reduce-scatter); 0 for one rank (nccl-tests PERFORMANCE.md)."""
    return 2.0 * (n - 1) / n if n > 1 else 0.0


#: A DDP bucket's cap (torch's default bucket_cap_mb, bytes): the buckets a DDP gradient
#: all-reduce is predicted in when the run has no data parallel to measure.
DDP_BUCKET_BYTES = 25 * 2**20


@dataclasses.dataclass(frozen=True)
class DimTraffic:
    """One parallel dimension's measured collectives, per rank and step.

    Attributes:
        dim: ``"tp"``, ``"dp"``…; size: its groups' size.
        ops: ``[(op, bytes, count per rank per step)]`` of its complete instances (bytes: the
            median per op and size class).
        alpha_us, beta_us_per_byte: ``t = α + β·bus bytes`` through the fastest instance of
            each size (:func:`whatif.fit_alpha_beta`; bus bytes = bytes ×
            :func:`pardiag.analyzer.sync.busbw_factor`, nccl-tests' convention).
        sizes: distinct bus-byte sizes the fit rests on.
        transfer_us: per rank and step, the measured transfer of its collectives (each
            instance from its last arrival to its end, :mod:`pardiag.analyzer.sync`): its
            communication time less the waiting for late peers.
    """

    dim: str
    size: int
    ops: tuple[tuple[str, float, float], ...]
    alpha_us: float
    beta_us_per_byte: float
    sizes: int
    transfer_us: float = 0.0

    def time_us(self, size: int, scale: float, alpha_us: float | None = None,
                beta: float | None = None) -> float:
        """Per rank and step (µs): the same collectives over groups of ``size`` ranks with
        ``scale`` × the bytes each. Latency grows with the ring's steps, (size − 1)/(k − 1)
        (Hockney model over a ring: Thakur, Rabenseifner & Gropp 2005)."""
        a = self.alpha_us if alpha_us is None else alpha_us
        b = self.beta_us_per_byte if beta is None else beta
        if size <= 1:
            return 0.0
        steps = (size - 1) / max(self.size - 1, 1)
        return sum(n * (a * steps + b * nbytes * scale * busbw_factor(op, size))
                   for op, nbytes, n in self.ops)


def _traffic(ctx: RuleContext) -> dict[str, DimTraffic]:
    """Per dimension with complete collective instances: its :class:`DimTraffic` (groups
    matched to dimensions by their ranks, :attr:`pardiag.analyzer.balance.LayoutResult.groups`)."""
    lay, sync = ctx.layout, ctx.sync
    if lay is None or lay.groups.empty or sync is None or sync.instances.empty:
        return {}
    dims = {}
    for g in lay.groups.itertuples():
        if isinstance(g.dim, str) and g.dim:
            dims[frozenset(int(r) for r in g.ranks)] = (g.dim, int(g.size))
    inst = sync.instances[sync.instances["complete"].astype(bool)]
    inst = inst[~inst["op"].isin(P2P_OPS)]
    rows = []
    for i in inst.itertuples():
        key = frozenset(int(r) for r in str(i.group).split("|")[0].split(",") if r.strip())
        if key in dims and i.bytes == i.bytes and i.bytes > 0 and i.transfer_us > 0:
            rows.append((*dims[key], str(i.op), float(i.bytes), float(i.transfer_us)))
    out = {}
    steps = ctx.steps_per_rank
    for dim in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == dim]
        size = mine[0][1]
        groups = sum(1 for d, k in dims.values() if d == dim)
        x = [b * busbw_factor(op, size) for _, _, op, b, _ in mine]
        try:
            alpha, beta = whatif.fit_alpha_beta(x, [t for *_, t in mine])
        except ValueError:
            continue
        per: dict[tuple[str, float], int] = {}
        for _, _, op, b, _ in mine:
            per[(op, b)] = per.get((op, b), 0) + 1
        ops = tuple((op, b, n / max(groups, 1) / steps) for (op, b), n in sorted(per.items()))
        transfer = sum(t for *_, t in mine) / max(groups, 1) / steps
        out[dim] = DimTraffic(dim, size, ops, alpha, beta, len({round(v) for v in x}), transfer)
    return out


def _new_dp_traffic(ctx: RuleContext, like: DimTraffic, tp_now: int, tp2: int
                    ) -> tuple[DimTraffic, str] | None:
    """The gradient synchronization a run without data parallel would add at dp > 1, at the
    α–β of ``like`` (another dimension's groups on the same links): DDP's all-reduce of the
    gradients in 25 MiB buckets (:data:`DDP_BUCKET_BYTES`), or FSDP's two all-gathers and one
    reduce-scatter of the parameters (one all-gather when it keeps them unsharded) when the run
    uses FSDP. Gradient bytes: the rank's parameter bytes × tp / tp2 (TP's shards rejoin)."""
    params = ctx.params_bytes
    if not params:
        return None
    full = params * tp_now / tp2
    fsdp = bool({"fsdp1", "fsdp2"} & ctx.strategies)
    if fsdp:
        gathers = 2 if ctx.settings.get("fsdp_reshard_after_forward", True) else 1
        ops = (("all_gather", full, float(gathers)), ("reduce_scatter", full, 1.0))
        how = (f"FSDP: {gathers} all-gather(s) and a reduce-scatter of {full / 2**20:.3g} MiB of "
               "parameters per step")
    else:
        n = max(1, math.ceil(full / DDP_BUCKET_BYTES))
        ops = (("all_reduce", full / n, float(n)),)
        how = f"DDP: an all-reduce of {full / 2**20:.3g} MiB of gradients in {n} bucket(s)"
    return DimTraffic("dp", 2, ops, like.alpha_us, like.beta_us_per_byte, like.sizes), how


def _change_us(traffic: DimTraffic, comm_us: float, size: int, scale: float) -> float:
    """How a dimension's communication per rank and step (``comm_us``, measured) changes at
    group ``size`` with ``scale`` × the bytes: all of it goes at size 1; otherwise its transfer
    (:attr:`DimTraffic.transfer_us`, at most ``comm_us``; all of it when none was measured) grows
    by the α–β model's ratio and its waiting for late peers stays."""
    if size == 1:
        return -comm_us
    transfer = min(traffic.transfer_us, comm_us) if traffic.transfer_us > 0 else comm_us
    return transfer * (traffic.time_us(size, scale) / traffic.time_us(traffic.size, 1.0) - 1.0)


def degrees(ctx: RuleContext) -> list[Recommendation]:
    """Other DP × TP splits of the same ranks (pipeline degree unchanged), TP inside a node.

    Per rank and step, with the global batch fixed: computation stays (the same work over the
    same ranks). Each dimension's collectives keep their count; their bytes scale — TP's with
    the activations a rank holds (∝ 1/dp), DP's with the parameters a rank holds (∝ 1/tp) — and
    each takes ``α + β·bus bytes`` fitted on that dimension's own instances (:func:`_traffic`;
    small gloo messages are latency-bound, so bytes alone mispredict: on the 2D example
    scaling by bytes predicted dp=4 × tp=1 1.6% faster where it ran ~32% faster). A dimension
    that stays scales its measured transfer (:attr:`DimTraffic.transfer_us`) by the model's
    ratio and keeps its waiting for late peers (arrival skew does not grow with bytes: scaling
    it too predicted TP's time at tp=4 ×3 where it grew ×2.2); one that goes (degree 1) takes
    all of its time with it. The step changes by each
    dimension's exposed share (measured) of its predicted time change. A run
    without data parallel (TP only) gets DDP's gradient all-reduce — or FSDP's gathers when it
    uses FSDP — at the TP groups' α–β, all of it exposed on CPU (gloo shares the cores), only
    the last bucket on a GPU.

    Without instances to fit (traces without collective records), each dimension's measured
    time is scaled by bytes and ring factors instead."""
    lay, dims, measured = ctx.layout, ctx.dims, ctx.measured_us
    dp, tp = int(dims.get("dp") or 1), int(dims.get("tp") or 1)
    if tp < 2 or not (measured > 0):
        return []   # without TP traffic measured there is nothing to scale from
    comm = ctx.dim_comm_per_step
    if "tp" not in comm:
        return []
    per_node = (min(len(r) for r in lay.nodes.values()) if lay.nodes
                else len(ctx.traces.ranks))
    t_tp, e_tp = comm["tp"]
    t_dp, e_dp = comm.get("dp", (0.0, 0.0))
    x_tp = e_tp / t_tp if t_tp > 0 else 1.0
    x_dp = e_dp / t_dp if t_dp > 0 else 1.0
    traffic = _traffic(ctx)
    n = dp * tp
    # the model's shapes and batch (issue #20): a degree that cannot be built is listed with why
    con = shapes.constraints(ctx.traces)
    pipe_m = (lay.pipeline or {}).get("microbatches") if isinstance(lay.pipeline, dict) else None
    now = shapes.run_batch(con, dp, pipe_m if isinstance(pipe_m, int) else None)
    unchecked_batch = () if now.global_samples else (
        "not checked against the global batch: its size was not recorded",)
    unchecked_tp = tuple(x for x in (shapes.unchecked_tp(con),) if x)
    out = []
    for tp2 in range(1, n + 1):
        if n % tp2 or tp2 == tp or tp2 > per_node:
            continue
        dp2 = n // tp2
        why = (shapes.check_tp_degree(tp2, con)
               or shapes.check_dp_degree(dp2, now.global_samples, now.microbatches))
        if why:
            out.append(ruled_out("degrees", f"dp={dp2} × tp={tp2} instead of dp={dp} × tp={tp}",
                                 f"dp={dp2}, tp={tp2} (TP inside each node; same global batch)",
                                 {"dp": dp2, "tp": tp2}, measured, why))
            continue
        ev_model = ""
        if "tp" in traffic:
            # a dimension that stays scales its measured transfer by the α–β model's ratio and
            # keeps its waiting for late peers (arrival skew, not bytes); one that goes
            # (degree 1) takes all of its time with it
            ttp = traffic["tp"]
            d_tp = _change_us(ttp, t_tp, tp2, dp / dp2)
            if dp > 1 and "dp" in traffic:
                tdp = traffic["dp"]
                d_dp = _change_us(tdp, t_dp, dp2, tp / tp2)
                new_dp = ""
            elif dp > 1:
                continue   # data parallel measured but not matched to instances
            elif dp2 > 1:
                made = _new_dp_traffic(ctx, ttp, tp, tp2)
                if made is None:
                    continue
                tdp, new_dp = made
                full = tdp.time_us(dp2, 1.0)
                if ctx.on_gpu and tdp.ops[0][0] == "all_reduce":   # beside the backward
                    full *= 1.0 / max(tdp.ops[0][2], 1.0)
                d_dp, x_dp = full, 1.0
            else:
                d_dp, new_dp = 0.0, ""
            pred = measured + x_tp * d_tp + x_dp * d_dp
            t_tp2, t_dp2 = max(t_tp + d_tp, 0.0), max(t_dp + d_dp, 0.0)
            ev_model = (f"α–β per dimension, fitted on its own collectives: TP α "
                        f"{ttp.alpha_us:.0f} µs, {1 / ttp.beta_us_per_byte / 1e3:.2f} GB/s bus "
                        f"bandwidth ({ttp.sizes} size(s))"
                        + (f"; DP α {traffic['dp'].alpha_us:.0f} µs, "
                           f"{1 / traffic['dp'].beta_us_per_byte / 1e3:.2f} GB/s"
                           if "dp" in traffic else "")
                        + (f"; no data parallel now: {new_dp}, at the TP groups' α–β"
                           if new_dp else ""))
        else:
            t_tp2 = t_tp * (dp / dp2) * (_ring(tp2) / _ring(tp)) if tp2 > 1 else 0.0
            t_dp2 = (t_dp * (tp / tp2) * (_ring(dp2) / _ring(dp)) if dp > 1 and dp2 > 1 else
                     (float("nan") if dp2 > 1 else 0.0))
            if t_dp2 != t_dp2:
                continue   # no DP traffic measured to scale from
            pred = measured - (e_tp + e_dp) + x_tp * t_tp2 + x_dp * t_dp2
        ev = [f"per rank and step: TP communication {t_tp / 1000:.2f} ms "
              f"({e_tp / 1000:.2f} exposed), DP {t_dp / 1000:.2f} ms ({e_dp / 1000:.2f} exposed)",
              f"predicted: TP {t_tp2 / 1000:.2f} ms, DP {t_dp2 / 1000:.2f} ms, each with "
              "its measured exposed share"]
        if ev_model:
            ev.append(ev_model)
        out.append(Recommendation(
            kind="degrees", title=f"dp={dp2} × tp={tp2} instead of dp={dp} × tp={tp}",
            change=f"dp={dp2}, tp={tp2} (TP inside each node; same global batch)",
            evidence=tuple(ev),
            caveats=("computation per rank is taken to stay the same (ideal scaling); TP's "
                     "smaller matmuls can run less efficiently",
                     "each dimension keeps the latency and bandwidth measured on its current "
                     "groups",
                     "memory changes (parameters shard by tp, activations by dp) are not "
                     "predicted", *(unchecked_tp if tp2 > 1 else ()), *unchecked_batch),
            measured_step_us=measured, predicted_step_us=pred,
            params={"dp": dp2, "tp": tp2},
            **batch_fields(now, per_rank_x=Fraction(dp, dp2), micro_x=Fraction(dp, dp2))))
    return out
