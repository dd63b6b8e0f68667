"""Other DP × TP degrees of the same ranks, each dimension at its measured latency and bandwidth."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import pandas as pd

from ....analyses.comm_events import P2P_OPS
from ....per_rank.op_semantics import busbw_factor
from ... import shapes, whatif
from ..context import RuleContext
from ..types import Recommendation, batch_fields, ruled_out


def _ring(n: int) -> float:
    """Bytes each rank moves per byte of buffer in a ring all-reduce, 2(n − 1)/n (the same for
    all-gather + reduce-scatter); 0 for one rank (nccl-tests PERFORMANCE.md)."""
    return 2.0 * (n - 1) / n if n > 1 else 0.0


@dataclasses.dataclass(frozen=True)
class DimTraffic:
    """One parallel dimension's measured collectives, per rank and step.

    Attributes:
        dim: ``"tp"``, ``"dp"``…; size: its groups' size.
        ops: ``[(op, bytes, count per rank per step)]`` of its complete instances (bytes: the
            median per op and size class).
        alpha_us, beta_us_per_byte: ``t = α + β·bus bytes`` through the fastest instance of
            each size (:func:`whatif.fit_alpha_beta`; bus bytes = bytes ×
            :func:`pardiag.analyzer.per_rank.op_semantics.busbw_factor`, nccl-tests' convention).
        sizes: distinct bus-byte sizes the fit rests on.
        transfer_us: per rank and step, the measured transfer of its collectives (each
            instance from its last arrival to its end, :mod:`pardiag.analyzer.analyses.sync`): its
            communication time less the waiting for late peers.
    """

    dim: str
    size: int
    ops: tuple[tuple[str, float, float], ...]
    alpha_us: float
    beta_us_per_byte: float
    sizes: int
    transfer_us: float = 0.0
    placement: frozenset[str] | None = None

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


def hop_kinds(ranks, meta: dict) -> frozenset[str] | None:
    """The kinds of link a ring over ``ranks`` (in rank order, back to the first) crosses:
    ``"across nodes"`` (different hosts), ``"one core"`` (both ranks pinned to the same cores,
    fewer than the host has: they take turns on them), ``"across cores"`` (pinned to disjoint
    cores) or ``"same node"`` (anything else). ``meta``: ``{rank: RankMeta}``
    (``host``, ``cpu_affinity``, ``cpu_count``). None when a rank has no host recorded or the
    ring has one rank."""
    ranks = list(ranks)
    if len(ranks) < 2 or any(r not in meta or not meta[r].host for r in ranks):
        return None
    out = set()
    for a, b in zip(ranks, ranks[1:] + ranks[:1]):
        ma, mb = meta[a], meta[b]
        ca, cb = frozenset(ma.cpu_affinity or ()), frozenset(mb.cpu_affinity or ())
        if ma.host != mb.host:
            out.add("across nodes")
        elif ca and ca == cb and len(ca) < (ma.cpu_count or len(ca) + 1):
            out.add("one core")
        elif ca and cb and ca.isdisjoint(cb):
            out.add("across cores")
        else:
            out.add("same node")
    return frozenset(out)


def _placement(groups, meta: dict) -> frozenset[str] | None:
    """The union of :func:`hop_kinds` over ``groups`` (lists of ranks); None when one is
    unknown."""
    out: set[str] = set()
    for g in groups:
        k = hop_kinds(g, meta)
        if k is None:
            return None
        out |= k
    return frozenset(out)


def mesh_groups(n: int, tp: int, dim: str) -> list[list[int]]:
    """The groups of ``dim`` (``"tp"`` or ``"dp"``) when ``n`` ranks form a dp × tp mesh in
    rank order with TP innermost (TP groups: runs of ``tp`` consecutive ranks; DP groups: ranks
    ``tp`` apart)."""
    if dim == "tp":
        return [list(range(i, i + tp)) for i in range(0, n, tp)]
    return [list(range(j, n, tp)) for j in range(tp)]


def _traffic(ctx: RuleContext) -> dict[str, DimTraffic]:
    """Per dimension with complete collective instances: its :class:`DimTraffic` (groups
    matched to dimensions by their ranks,
    :attr:`pardiag.analyzer.analyses.layout.LayoutResult.groups`)."""
    lay, sync = ctx.layout, ctx.sync
    if lay is None or lay.groups.empty or sync is None or sync.instances.empty:
        return {}
    dims: dict[frozenset[int], tuple[str, int]] = {}
    members: dict[str, list[list[int]]] = {}
    for g in lay.groups.itertuples():
        if isinstance(g.dim, str) and g.dim:
            dims[frozenset(int(r) for r in g.ranks)] = (g.dim, int(g.size))
            members.setdefault(g.dim, []).append(sorted(int(r) for r in g.ranks))
    inst = sync.instances[sync.instances["complete"].astype(bool)]
    inst = inst[~inst["op"].isin(P2P_OPS)]
    rows = []
    for i in inst.itertuples():
        key = frozenset(int(r) for r in str(i.group).split("|")[0].split(",") if r.strip())
        if key in dims and pd.notna(i.bytes) and i.bytes > 0 and i.transfer_us > 0:
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
        out[dim] = DimTraffic(dim, size, ops, alpha, beta, len({round(v) for v in x}), transfer,
                              _placement(members.get(dim, []), ctx.traces.rank_meta))
    return out


def _links_like(traffic: dict[str, DimTraffic], dim: str, groups: list[list[int]], meta: dict
                ) -> DimTraffic | None:
    """The measured dimension whose groups cross the same kinds of link as ``groups`` (the
    groups ``dim`` would have) when ``dim``'s own groups cross other kinds, else None: the
    α–β belongs to the links, not to the dimension."""
    own = traffic[dim].placement
    new = _placement(groups, meta)
    if own is None or new is None or new == own:
        return None
    for other in sorted(traffic):
        if other != dim and traffic[other].placement == new:
            return traffic[other]
    return None


def _new_dp_traffic(ctx: RuleContext, like: DimTraffic, tp_now: int, tp2: int
                    ) -> tuple[DimTraffic, str] | None:
    """The gradient synchronization a run without data parallel would add at dp > 1, at the α–β of
    ``like`` (another dimension's groups on the same links): DDP's all-reduce of the gradients in
    torch's default 25 MiB buckets (:data:`whatif.DDP_DEFAULT_CAP`), or FSDP's all-gathers and
    reduce-scatters of the parameters when the run uses FSDP: each of its units (``fsdp_units``,
    recorded by ``pardiag profile``; one when not recorded: then two all-gathers, or one when it
    keeps the parameters unsharded) gathers once in the forward and once more in the backward when
    it reshards after the forward (``fsdp_resharding_units``), and reduce-scatters once; the
    parameters split evenly over the units. Gradient bytes: the rank's parameter bytes × tp / tp2
    (TP's shards rejoin). The α–β is ``like``'s, through its fastest instances; :func:`degrees`
    scales the time by ``like``'s measured transfer over its α–β time (the contention its links
    show)."""
    params = ctx.params_bytes
    if not params:
        return None
    full = params * tp_now / tp2
    fsdp = bool({"fsdp1", "fsdp2"} & ctx.strategies)
    if fsdp:
        units = ctx.settings.get("fsdp_units")
        if isinstance(units, int) and units > 0:
            gathers = units + int(ctx.settings.get("fsdp_resharding_units") or 0)
        else:   # not recorded: the whole model as one unit
            units = 1
            gathers = 2 if ctx.settings.get("fsdp_reshard_after_forward", True) else 1
        ops: tuple[tuple[str, float, float], ...] = (
            ("all_gather", full / units, float(gathers)),
               ("reduce_scatter", full / units, float(units)))
        how = (f"FSDP: {gathers} all-gather(s) and {units} reduce-scatter(s) per step of "
               f"{full / 2**20:.3g} MiB of parameters in {units} unit(s)")
    else:
        n = max(1, math.ceil(full / whatif.DDP_DEFAULT_CAP))
        ops = (("all_reduce", full / n, float(n)),)
        how = f"DDP: an all-reduce of {full / 2**20:.3g} MiB of gradients in {n} bucket(s)"
    return DimTraffic("dp", 2, ops, like.alpha_us, like.beta_us_per_byte, like.sizes), how


def _change_us(traffic: DimTraffic, comm_us: float, size: int, scale: float,
               links: DimTraffic | None = None) -> float:
    """How a dimension's communication per rank and step (``comm_us``, measured) changes at
    group ``size`` with ``scale`` × the bytes: all of it goes at size 1; otherwise its transfer
    (:attr:`DimTraffic.transfer_us`, at most ``comm_us``; all of it when none was measured) grows
    by the α–β model's ratio and its waiting for late peers stays. ``links``: the dimension
    whose α–β the new groups take (:func:`_links_like`), else its own."""
    if size == 1:
        return -comm_us
    transfer = min(traffic.transfer_us, comm_us) if traffic.transfer_us > 0 else comm_us
    new = (traffic.time_us(size, scale) if links is None else
           traffic.time_us(size, scale, links.alpha_us, links.beta_us_per_byte))
    return transfer * (new / traffic.time_us(traffic.size, 1.0) - 1.0)


def _kinds(placement) -> str:
    """``{"across cores"}`` → ``"across cores"``; several joined with "and"."""
    return " and ".join(sorted(placement or ()))


def host_us(ctx: RuleContext, part: str) -> float:
    """A host work per rank and step (µs; mean over ranks and profiled steps of a column of
    :func:`pardiag.analyzer.analyses.causes.rank_causes`): ``"dtensor_us"``, DTensor's
    redistributions with their collectives and waits and its dispatch of operators on DTensors,
    outside the optimizer (TP's host work); ``"fsdp_us"``, FSDP2's hooks with their waits. 0 when
    not measured."""
    c = ctx.causes
    if c is None or c.per_step.empty or part not in c.per_step:
        return 0.0
    v = pd.to_numeric(c.per_step[part], errors="coerce").dropna()
    return float(v.mean()) if len(v) else 0.0


@dataclasses.dataclass(frozen=True)
class _Measured:
    """The run's DP × TP split as :func:`degrees` scales it, per rank and step.

    Attributes:
        dp, tp: the degrees now; n: dp × tp, the ranks the mesh holds; per_node: the fewest
            ranks a node has (TP stays inside one).
        measured_us: the measured step (µs).
        t_tp_us, e_tp_us, t_dp_us, e_dp_us: each dimension's communication and its exposed
            part (µs; :attr:`RuleContext.dim_comm_per_step`, DP's 0 when not measured).
        x_tp, x_dp: each dimension's exposed share (exposed over all; 1 with none measured).
        traffic: :func:`_traffic`; meta: ``{rank: RankMeta}``.
        whole: the mesh holds every rank (no pipeline), so its groups are :func:`mesh_groups`.
        host_us, fsdp_host_us: on CPU, DTensor's and FSDP2's host work (:func:`host_us`, µs);
            0 on a GPU, where it runs ahead of the kernels.
    """

    dp: int
    tp: int
    n: int
    per_node: int
    measured_us: float
    t_tp_us: float
    e_tp_us: float
    t_dp_us: float
    e_dp_us: float
    x_tp: float
    x_dp: float
    traffic: dict
    meta: dict
    whole: bool
    host_us: float
    fsdp_host_us: float


@dataclasses.dataclass(frozen=True)
class _Prediction:
    """One candidate's predicted step (µs), each dimension's predicted communication per rank
    and step (µs) and the evidence lines the prediction adds (the α–β fits, the host work)."""

    step_us: float
    t_tp_us: float
    t_dp_us: float
    evidence: tuple[str, ...] = ()


def _measured(ctx: RuleContext) -> _Measured | None:
    """The measured traffic per dimension (:class:`_Measured`), or None without TP or its
    communication measured (nothing to scale from)."""
    lay, dims, measured = ctx.layout, ctx.dims, ctx.measured_us
    dp, tp = int(dims.get("dp") or 1), int(dims.get("tp") or 1)
    if tp < 2 or not (measured > 0):
        return None   # without TP traffic measured there is nothing to scale from
    assert lay is not None  # it gave the dimensions
    comm = ctx.dim_comm_per_step
    if "tp" not in comm:
        return None
    per_node = (min(len(r) for r in lay.nodes.values()) if lay.nodes
                else len(ctx.traces.ranks))
    t_tp, e_tp = comm["tp"]
    t_dp, e_dp = comm.get("dp", (0.0, 0.0))
    n = dp * tp
    # on CPU the host work is the step; on a GPU it runs ahead of the kernels
    host = host_us(ctx, "dtensor_us") if not ctx.on_gpu else 0.0
    fsdp_host = (host_us(ctx, "fsdp_us") if not ctx.on_gpu and "fsdp2" in ctx.strategies
                 else 0.0)
    return _Measured(
        dp=dp, tp=tp, n=n, per_node=per_node, measured_us=measured,
        t_tp_us=t_tp, e_tp_us=e_tp, t_dp_us=t_dp, e_dp_us=e_dp,
        x_tp=e_tp / t_tp if t_tp > 0 else 1.0, x_dp=e_dp / t_dp if t_dp > 0 else 1.0,
        traffic=_traffic(ctx), meta=ctx.traces.rank_meta,
        whole=n == len(ctx.traces.ranks),   # the dp × tp mesh holds every rank (no pipeline)
        host_us=host, fsdp_host_us=fsdp_host)


def _batch_check(ctx: RuleContext, dp: int
                 ) -> tuple[shapes.Constraints, shapes.Batch, tuple[str, ...], tuple[str, ...]]:
    """The model's shapes and batch: ``(constraints, the run's batch, the caveat
    when TP's shapes could not be checked, the caveat when the global batch was not
    recorded)``; the caveats are empty tuples when there is nothing to say."""
    lay = ctx.layout
    assert lay is not None  # called after _measured, which read the layout
    con = shapes.constraints(ctx.traces)
    pipe_m = (lay.pipeline or {}).get("microbatches") if isinstance(lay.pipeline, dict) else None
    now = shapes.run_batch(con, dp, pipe_m if isinstance(pipe_m, int) else None)
    unchecked_batch = () if now.global_samples else (
        "not checked against the global batch: its size was not recorded",)
    unchecked_tp = tuple(x for x in (shapes.unchecked_tp(con),) if x)
    return con, now, unchecked_tp, unchecked_batch


def _candidate_tps(run: _Measured) -> list[int]:
    """The other TP degrees of the same ranks, ascending: divisors of dp × tp, TP inside a
    node."""
    return [tp2 for tp2 in range(1, run.n + 1)
            if not (run.n % tp2 or tp2 == run.tp or tp2 > run.per_node)]


def _new_dp_change(ctx: RuleContext, ttp: DimTraffic, tp: int, tp2: int, dp2: int
                   ) -> tuple[float, str] | None:
    """A run without data parallel at dp2 > 1: the time per rank and step (µs) the new
    gradient synchronization adds (:func:`_new_dp_traffic` at the TP groups' α–β, times the
    contention TP's links show; on a GPU only DDP's last bucket) and how it was made, in words;
    None when the parameter bytes are unknown."""
    made = _new_dp_traffic(ctx, ttp, tp, tp2)
    if made is None:
        return None
    tdp, new_dp = made
    # the contention TP's links show: its measured transfer over its α–β time
    slow = (ttp.transfer_us / ttp.time_us(ttp.size, 1.0)
            if ttp.transfer_us > 0 and ttp.time_us(ttp.size, 1.0) > 0 else 1.0)
    slow = max(slow, 1.0)
    new_dp += (f", at the TP groups' α–β × {slow:.2f} (TP's measured transfer "
               "over its α–β time)" if slow > 1.0 else ", at the TP groups' α–β")
    full = tdp.time_us(dp2, 1.0) * slow
    if ctx.on_gpu and tdp.ops[0][0] == "all_reduce":   # beside the backward
        full *= 1.0 / max(tdp.ops[0][2], 1.0)
    return full, new_dp


def _dp_change(ctx: RuleContext, run: _Measured, tp2: int, dp2: int
               ) -> tuple[float, float, str, DimTraffic | None] | None:
    """DP's side of a candidate: ``(its communication's change per rank and step (µs), its
    exposed share, how a new DP's synchronization was made ("" when DP stays or there is
    none), the dimension whose α–β DP's new groups take (:func:`_links_like`) or None)``.
    None when the candidate cannot be predicted: DP measured but not matched to instances, or
    a new DP without the parameter bytes."""
    traffic, dp = run.traffic, run.dp
    if dp > 1 and "dp" in traffic:
        dp_links = (_links_like(traffic, "dp", mesh_groups(run.n, tp2, "dp"), run.meta)
                    if dp2 > 1 and run.whole else None)
        d_dp = _change_us(traffic["dp"], run.t_dp_us, dp2, run.tp / tp2, dp_links)
        return d_dp, run.x_dp, "", dp_links
    if dp > 1:
        return None   # data parallel measured but not matched to instances
    if dp2 > 1:
        made = _new_dp_change(ctx, traffic["tp"], run.tp, tp2, dp2)
        if made is None:
            return None
        return made[0], 1.0, made[1], None
    return 0.0, run.x_dp, "", None


def _model_evidence(traffic: dict[str, DimTraffic], new_dp: str,
                    tp_links: DimTraffic | None, dp_links: DimTraffic | None) -> str:
    """The evidence line of the α–β fits: each dimension's α (µs) and bus bandwidth (GB/s),
    a new DP's synchronization (``new_dp``) and the dimensions whose new groups take another's
    α–β."""
    ttp = traffic["tp"]
    return (f"α–β per dimension, fitted on its own collectives: TP α "
            f"{ttp.alpha_us:.0f} µs, {1 / ttp.beta_us_per_byte / 1e3:.2f} GB/s bus "
            f"bandwidth ({ttp.sizes} size(s))"
            + (f"; DP α {traffic['dp'].alpha_us:.0f} µs, "
               f"{1 / traffic['dp'].beta_us_per_byte / 1e3:.2f} GB/s"
               if "dp" in traffic else "")
            + (f"; no data parallel now: {new_dp}" if new_dp else "")
            + "".join(f"; {d.upper()}'s new groups' rings would run "
                      f"{_kinds(lk.placement)}, as {lk.dim.upper()}'s do: they "
                      f"take {lk.dim.upper()}'s α–β"
                      for d, lk in (("tp", tp_links), ("dp", dp_links)) if lk))


def _host_evidence(run: _Measured, tp2: int, dp2: int) -> str:
    """The evidence line when a dimension that goes takes its host work (ms) with it, larger
    than its exposed communication: DTensor's at tp=1, FSDP's at dp=1; "" otherwise."""
    ev_host = ""
    if tp2 == 1 and run.host_us > run.e_tp_us:
        ev_host = (f"at tp=1 TP's host work goes with its communication: DTensor's "
                   f"redistributions (their collectives and waits included) and "
                   f"dispatch take {run.host_us / 1000:.2f} ms per rank and step outside the "
                   f"optimizer, more than TP's exposed communication "
                   f"({run.e_tp_us / 1000:.2f} ms)")
    if dp2 == 1 and run.dp > 1 and run.fsdp_host_us > run.e_dp_us:
        ev_host = (f"at dp=1 FSDP's host work goes with its communication: its hooks "
                   f"(their collectives' waits included) take {run.fsdp_host_us / 1000:.2f} ms "
                   f"per rank and step, more than DP's exposed communication "
                   f"({run.e_dp_us / 1000:.2f} ms)")
    return ev_host


def _predict_fitted(ctx: RuleContext, run: _Measured, tp2: int, dp2: int
                    ) -> _Prediction | None:
    """A candidate predicted from each dimension's α–β (:func:`_change_us`, new groups at the
    α–β of the links they would cross), the step changing by each dimension's exposed share of
    its change — or, on CPU, by the host work of a dimension that goes when that is larger;
    None when DP's side cannot be predicted (:func:`_dp_change`)."""
    # a dimension that stays scales its measured transfer by the α–β model's ratio and
    # keeps its waiting for late peers (arrival skew, not bytes); one that goes
    # (degree 1) takes all of its time with it
    traffic = run.traffic
    tp_links = (_links_like(traffic, "tp", mesh_groups(run.n, tp2, "tp"), run.meta)
                if tp2 > 1 and run.whole else None)
    d_tp = _change_us(traffic["tp"], run.t_tp_us, tp2, run.dp / dp2, tp_links)
    dp_side = _dp_change(ctx, run, tp2, dp2)
    if dp_side is None:
        return None
    d_dp, x_dp, new_dp, dp_links = dp_side
    tp_term, dp_term = run.x_tp * d_tp, x_dp * d_dp
    if tp2 == 1 and run.host_us > run.e_tp_us:   # TP's host work goes with its communication
        tp_term = -run.host_us
    if dp2 == 1 and run.dp > 1 and run.fsdp_host_us > run.e_dp_us:   # and FSDP's, at dp=1
        dp_term = -run.fsdp_host_us
    ev_host = _host_evidence(run, tp2, dp2)
    return _Prediction(
        step_us=run.measured_us + tp_term + dp_term,
        t_tp_us=max(run.t_tp_us + d_tp, 0.0), t_dp_us=max(run.t_dp_us + d_dp, 0.0),
        evidence=(_model_evidence(traffic, new_dp, tp_links, dp_links),
                  *((ev_host,) if ev_host else ())))


def _predict_scaled(run: _Measured, tp2: int, dp2: int) -> _Prediction | None:
    """A candidate predicted without instances to fit: each dimension's measured time scaled
    by its bytes and ring factors, at its exposed share; None when a DP stays but none was
    measured."""
    dp, tp, t_tp, t_dp = run.dp, run.tp, run.t_tp_us, run.t_dp_us
    t_tp2 = t_tp * (dp / dp2) * (_ring(tp2) / _ring(tp)) if tp2 > 1 else 0.0
    t_dp2 = (t_dp * (tp / tp2) * (_ring(dp2) / _ring(dp)) if dp > 1 and dp2 > 1 else
             (float("nan") if dp2 > 1 else 0.0))
    if math.isnan(t_dp2):
        return None   # no DP traffic measured to scale from
    pred = run.measured_us - (run.e_tp_us + run.e_dp_us) + run.x_tp * t_tp2 + run.x_dp * t_dp2
    return _Prediction(pred, t_tp2, t_dp2)


def _change_text(dp2: int, tp2: int) -> str:
    """``"dp=2, tp=2 (TP inside each node; same global batch)"``; with tp=1 there is no TP
    group to place, ``"dp=4, tp=1 (data parallel only; same global batch)"``."""
    where = "TP inside each node" if tp2 > 1 else "data parallel only"
    return f"dp={dp2}, tp={tp2} ({where}; same global batch)"


def _recommendation(run: _Measured, tp2: int, dp2: int, pred: _Prediction, now: shapes.Batch,
                    unchecked_tp: tuple[str, ...], unchecked_batch: tuple[str, ...]
                    ) -> Recommendation:
    """The :class:`Recommendation` of dp2 × tp2: the measured and predicted communication per
    dimension (ms) with the prediction's own evidence, the caveats and the batch sizes."""
    dp, tp = run.dp, run.tp
    ev = [f"per rank and step: TP communication {run.t_tp_us / 1000:.2f} ms "
          f"({run.e_tp_us / 1000:.2f} exposed), DP {run.t_dp_us / 1000:.2f} ms "
          f"({run.e_dp_us / 1000:.2f} exposed)",
          f"predicted: TP {pred.t_tp_us / 1000:.2f} ms, DP {pred.t_dp_us / 1000:.2f} ms, each "
          "with its measured exposed share", *pred.evidence]
    return Recommendation(
        kind="degrees", title=f"dp={dp2} × tp={tp2} instead of dp={dp} × tp={tp}",
        change=_change_text(dp2, tp2),
        evidence=tuple(ev),
        caveats=("computation per rank is taken to stay the same (ideal scaling); TP's "
                 "smaller matmuls can run less efficiently",
                 "each dimension keeps the latency and bandwidth measured on its current "
                 "groups",
                 "memory changes (parameters shard by tp, activations by dp) are not "
                 "predicted", *(unchecked_tp if tp2 > 1 else ()), *unchecked_batch),
        measured_step_us=run.measured_us, predicted_step_us=pred.step_us,
        params={"dp": dp2, "tp": tp2},
        **batch_fields(now, per_rank_x=Fraction(dp, dp2), micro_x=Fraction(dp, dp2)))


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
    all of its time with it. The α–β belongs to the links a ring crosses, not to the
    dimension: when a dimension's new groups would cross other kinds of link than its groups
    do now (:func:`hop_kinds`: across nodes, across cores, ranks taking turns on one core) and
    another dimension's groups cross those, the new groups take that dimension's α–β (on the
    2-core machine, dp=2 × tp=2 with ``--pin-cpu`` puts each DP pair on one core; at dp=4 its
    ring crosses cores as TP's pairs do). The step changes by each dimension's exposed share
    (measured) of its predicted time change. On CPU, a dimension that goes takes its host work
    with it (:func:`host_us`, measured from the trace): at tp=1 DTensor's redistributions and
    dispatch, at dp=1 FSDP2's hooks (a run at dp=1 needs no FSDP); the step loses that or the
    dimension's exposed communication, whichever is larger (the host work holds the waits; on
    the 2D example DTensor's took 130 ms of a 320 ms step, where TP's exposed communication
    was 69 ms and the step at tp=1 took 128 ms less). A run
    without data parallel (TP only) gets DDP's gradient all-reduce — or FSDP's gathers when it
    uses FSDP — at the TP groups' α–β, all of it exposed on CPU (gloo shares the cores), only
    the last bucket on a GPU.

    Without instances to fit (traces without collective records), each dimension's measured
    time is scaled by bytes and ring factors instead."""
    run = _measured(ctx)
    if run is None:
        return []
    con, now, unchecked_tp, unchecked_batch = _batch_check(ctx, run.dp)
    dp, tp = run.dp, run.tp
    out = []
    for tp2 in _candidate_tps(run):
        dp2 = run.n // tp2
        # the model's shapes and batch: a degree that cannot be built is listed
        # with why
        why = (shapes.check_tp_degree(tp2, con)
               or shapes.check_dp_degree(dp2, now.global_samples, now.microbatches))
        if why:
            out.append(ruled_out("degrees", f"dp={dp2} × tp={tp2} instead of dp={dp} × tp={tp}",
                                 _change_text(dp2, tp2),
                                 {"dp": dp2, "tp": tp2}, run.measured_us, why))
            continue
        pred = (_predict_fitted(ctx, run, tp2, dp2) if "tp" in run.traffic
                else _predict_scaled(run, tp2, dp2))
        if pred is not None:
            out.append(_recommendation(run, tp2, dp2, pred, now, unchecked_tp, unchecked_batch))
    return out
