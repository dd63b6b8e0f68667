"""TP (or EP/CP) groups that span nodes: keep them inside one."""

from __future__ import annotations

from ..context import RuleContext
from ..types import Recommendation


def placement(ctx: RuleContext) -> list[Recommendation]:
    """TP (or EP/CP) groups that span nodes while another dimension's stay inside one: swap
    them in the device mesh. Predicted with the busbw measured on each side."""
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
        pred = measured - e_mine * (1 - r) + e_other * (1 / r - 1)
        out.append(Recommendation(
            kind="placement", title=f"Keep {dim.upper()} inside a node",
            change=f"{dim}={int(mine['size'].max())} inside each node: order the device mesh "
                   f"so {dim} is the innermost dimension ({other} across nodes)",
            evidence=(f"{dim} groups span nodes: busbw {b_inter:.2f} GB/s vs {b_intra:.2f} GB/s "
                      f"on the {other} groups inside a node",
                      f"exposed per step: {dim} {e_mine / 1000:.2f} ms, {other} "
                      f"{e_other / 1000:.2f} ms"),
            caveats=(f"{other} traffic then crosses nodes at {dim}'s measured bandwidth",),
            measured_step_us=measured, predicted_step_us=pred,
            params={"innermost": dim}))
    return out
