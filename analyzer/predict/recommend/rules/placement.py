"""TP (or EP/CP) groups that span nodes: keep them inside one."""

from __future__ import annotations

from ..context import RuleContext
from ..types import Recommendation


def placement(ctx: RuleContext) -> list[Recommendation]:
    """TP (or EP/CP) groups that span nodes while another dimension's stay inside one: swap
    them in the device mesh. Predicted with the busbw measured on each side (r = the spanning
    groups' busbw over the others'): the critical path replayed with the dimension's transfers
    × r and the other's × 1/r, as a ratio of the measured step; without a path, the
    exposed-communication formula (the step less the dimension's exposed time × (1 − r), plus
    the other's × (1/r − 1)). The replay measured closer on the link what-if
    (``benchmarks/whatif_validate.py link``: +12.3% / −7.8% against the formula's +27.6% /
    −10.6%; the whatif-link results in benchmarks/results/, listed in benchmarks/README.md)."""
    lay, sync, measured = ctx.layout, ctx.sync, ctx.measured_us
    if lay is None or lay.groups.empty or sync is None or sync.bandwidth.empty or not (
            measured > 0):
        return []
    g = lay.groups
    comm = ctx.dim_comm_per_step
    bw = sync.bandwidth.dropna(subset=["busbw_gbps"])
    out = []
    for dim in ("tp", "ep", "cp"):
        mine = g[g["dim"] == dim]
        if mine.empty or not mine["spans_nodes"].any() or dim not in comm:
            continue
        intra = g[(g["dim"] != dim) & ~g["spans_nodes"].astype(bool)]
        if intra.empty:
            continue
        other = str(intra["dim"].iloc[0])
        pgs_mine = set(mine["pg"].astype(str))
        pgs_other = set(intra["pg"].astype(str))
        b_inter = bw[bw["pg"].astype(str).isin(pgs_mine)]["busbw_gbps"].median()
        b_intra = bw[bw["pg"].astype(str).isin(pgs_other)]["busbw_gbps"].median()
        if not (b_inter > 0 and b_intra > 0) or b_inter >= b_intra:
            continue
        r = b_inter / b_intra
        _, e_mine = comm[dim]
        _, e_other = comm.get(other, (0.0, 0.0))
        formula = measured - e_mine * (1 - r) + e_other * (1 / r - 1)
        ratio = (ctx.critical_path.comm_ratio({dim: r, other: 1 / r})
                 if ctx.critical_path is not None else None)
        pred = measured * ratio if ratio is not None else formula
        how = (f"predicted by replaying the critical path as a steady step (each rank "
               f"starting its next step where it ends this one) with {dim}'s transfers × "
               f"{r:.2f} and {other}'s × {1 / r:.2f} (the exposed-communication formula gives "
               f"{formula / 1000:.2f} ms)" if ratio is not None else
               "predicted by the exposed-communication formula (no critical path to replay)")
        out.append(Recommendation(
            kind="placement", title=f"Keep {dim.upper()} inside a node",
            change=f"{dim}={int(mine['size'].max())} inside each node: order the device mesh "
                   f"so {dim} is the innermost dimension ({other} across nodes)",
            evidence=(f"{dim} groups span nodes: busbw {b_inter:.2f} GB/s vs {b_intra:.2f} GB/s "
                      f"on the {other} groups inside a node",
                      f"exposed per step: {dim} {e_mine / 1000:.2f} ms, {other} "
                      f"{e_other / 1000:.2f} ms", how),
            caveats=(f"{other} traffic then crosses nodes at {dim}'s measured bandwidth",),
            measured_step_us=measured, predicted_step_us=pred,
            params={"innermost": dim}))
    return out
