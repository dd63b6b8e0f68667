"""Communication/computation overlap per parallel dimension (dp, tp, pp, ...).

The whole-rank overlap (:mod:`pardiag.analyzer.analyses.breakdown`, HTA's definition) mixes every
process group. Here the communication of each rank is split by the dimension of the group it ran on
(from the layout: ``rank{R}.comms.json`` process groups or ``distributedInfo.pg_config``
descriptions such as ``mesh_tp``); per rank and dimension d:

* C_d = union of the rank's matched collective intervals on groups of dimension d (the
  synchronization analysis' per-rank intervals, moved back to the rank's own clock);
* K = the rank's computation intervals (the same K as the time breakdown);
* overlap_d = |K ∩ C_d|, exposed_d = |C_d| − overlap_d, overlap % = 100 · overlap_d / |C_d|.

A group without a dimension is ``world`` when it holds every rank, else ``other``; where no
group is known at all the dimension is the group's name (``pg 0``), or ``all`` when the trace
does not name it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import pandas as pd

from ..per_rank.summary import summary_of
from ..trace import intervals as iv
from ..trace.traceset import TraceSet
from .comm_events import group_key
from .layout import LayoutResult
from .sync import SyncResult

#: Columns of :attr:`DimOverlapResult.per_rank` (µs; % of the dimension's communication).
DIM_OVERLAP_COLUMNS = ("rank", "dim", "comm_us", "overlap_us", "exposed_us", "overlap_pct")


@dataclasses.dataclass(frozen=True)
class DimOverlapResult:
    """Result of :func:`compute_dim_overlap`.

    Attributes:
        per_rank: one row per rank and dimension, :data:`DIM_OVERLAP_COLUMNS`.
        summary: one row per dimension: ``dim``, ``ranks`` (n), ``comm_us`` and ``exposed_us``
            (means over those ranks, µs), ``overlap_pct`` (Σ overlap / Σ comm over the ranks, %).
        why_none: when ``per_rank`` is empty, why.
    """

    per_rank: pd.DataFrame
    summary: pd.DataFrame
    why_none: str = ""


def dims_of_groups(layout: LayoutResult, n_ranks: int) -> tuple[dict[str, str], dict[str, str]]:
    """``({pg name: dim}, {group identity: dim})``: a group's identity is its ranks with and
    without its description (:func:`pardiag.analyzer.analyses.comm_events.group_key`), which every
    member spells alike; names are each rank's creation order, the fallback."""
    by_name, by_group = {}, {}
    for g in layout.groups.itertuples():
        dim = g.dim if isinstance(g.dim, str) and g.dim else (
            "world" if g.size == n_ranks else "other")
        by_name[str(g.pg)] = dim
        ranks = list(g.ranks) if isinstance(g.ranks, (list, tuple)) else []
        if ranks:
            by_group[group_key(ranks, g.desc)] = dim
            by_group.setdefault(group_key(ranks), dim)
    return by_name, by_group


def compute_dim_overlap(traces: TraceSet, sync: SyncResult, layout: LayoutResult,
                        comm_patterns: Iterable = ()) -> DimOverlapResult:
    """Overlap of computation with each parallel dimension's communication, per rank.

    Args:
        traces: the run.
        sync: its synchronization result (matched per-rank collective intervals, clock offsets).
        layout: its layout (process group → dimension).
        comm_patterns: the ``--comm-kernel`` patterns the time breakdown used.
    """
    empty = pd.DataFrame(columns=list(DIM_OVERLAP_COLUMNS))
    empty_summary = pd.DataFrame(columns=["dim", "ranks", "comm_us", "exposed_us", "overlap_pct"])
    if sync.per_rank is None or len(sync.per_rank) == 0:
        return DimOverlapResult(empty, empty_summary, "no collective was matched across ranks, "
                                "so communication cannot be attributed to process groups")
    dims, by_group = dims_of_groups(layout, len(traces.ranks))
    inst_pg = dict(zip(sync.instances["instance"], sync.instances["pg"].astype(str)))
    inst_group = dict(zip(sync.instances["instance"], sync.instances["group"].astype(str)))
    pr = sync.per_rank.assign(pg=sync.per_rank["instance"].map(inst_pg),
                              group=sync.per_rank["instance"].map(inst_group))
    if dims:
        pr["dim"] = pr["group"].map(by_group).fillna(pr["pg"].map(dims)).fillna("other")
    else:
        pr["dim"] = pr["pg"].map(lambda p: "all" if p in ("?", "None", "nan") else f"pg {p}")
    offsets = dict(zip(sync.offsets["rank"], sync.offsets["offset_us"]))
    rows = []
    patterns = list(comm_patterns)
    start, end = pr["start_us"].to_numpy(dtype=float), pr["end_us"].to_numpy(dtype=float)
    computing: dict = {}
    # positions per (rank, dim), not a sub-table each: thousands of them on a large run
    for (rank, dim), idx in sorted(pr.groupby(["rank", "dim"]).indices.items()):
        trace = traces.ranks.get(int(rank))
        if trace is None:
            continue
        if rank not in computing:
            computing[rank] = summary_of(trace, patterns).parts.k
        off = float(offsets.get(rank, 0.0))
        c = iv.union(start[idx] + off, end[idx] + off)
        comm = iv.total(c)
        ov = iv.total(iv.intersect(computing[rank], c))
        rows.append({"rank": int(rank), "dim": str(dim), "comm_us": comm, "overlap_us": ov,
                     "exposed_us": comm - ov,
                     "overlap_pct": 100.0 * ov / comm if comm > 0 else np.nan})
    per_rank = pd.DataFrame(rows, columns=list(DIM_OVERLAP_COLUMNS))
    if per_rank.empty:
        return DimOverlapResult(empty, empty_summary, "no matched collective on a loaded rank")
    s = per_rank.groupby("dim", sort=True).agg(
        ranks=("rank", "nunique"), comm_us=("comm_us", "mean"), exposed_us=("exposed_us", "mean"),
        _ov=("overlap_us", "sum"), _c=("comm_us", "sum")).reset_index()
    s["overlap_pct"] = np.where(s["_c"] > 0, 100.0 * s["_ov"] / s["_c"].where(s["_c"] > 0), np.nan)
    return DimOverlapResult(per_rank, s.drop(columns=["_ov", "_c"]))
