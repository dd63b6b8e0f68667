"""Communication events per rank: every collective and point-to-point op of a rank's trace, in one
table (:data:`EVENT_COLUMNS`) that the cross-rank matching (:mod:`pardiag.analyzer.analyses.sync`)
reads.

Sources, in order: pardiag's collective records (``rank{R}.comms.json``: group, per-group sequence
number, bytes) when the run has them; else the trace — NCCL/RCCL kernels (group and sizes from
their args or from the launching ``record_param_comms`` op) or gloo worker events (sizes from
``Input Dims``), numbered in time order per group. A rank's events from its trace are part of its
summary (:func:`events_from_trace` runs where the trace is parsed).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from pardiag.layout import CommsSidecar

from ..per_rank.comm_events import (
    AMBIGUOUS_GROUP,
    EVENT_COLUMNS,
    SCALAR_BYTES,
    group_key,
    step_of,
)
from ..per_rank.op_semantics import P2P_OPS
from ..per_rank.summary import summary_of
from ..trace import vocab
from ..trace.traceset import TraceSet, stack_by_rank
from ..trace.vocab import rank_list


def _from_records(rank: int, doc: CommsSidecar, steps: pd.DataFrame) -> pd.DataFrame:
    groups = {g.name: g for g in doc.process_groups}
    recs = doc.records
    # On a rank whose ops ran as kernels, a record placed on its host op (its kernel was not
    # in the trace) has no device times: the host runs ahead of the device, so comparing them
    # with other ranks' kernel times would make up waits. It counts, but is matched with nothing.
    on_device = any(r.matched == "kernel" for r in recs)
    rows = []
    for r in recs:
        if r.start_us is None or r.end_us is None:
            continue
        if on_device and r.matched not in ("kernel", "gloo"):
            continue
        assert r.issue_us is not None  # every record says when it was issued
        g = groups.get(r.pg_name)
        members = rank_list(r.pg_ranks or (g.ranks if g else None) or []) or []
        desc = (g.desc if g else None) or r.pg_desc
        rows.append({"rank": rank, "pg": str(r.pg_name),
                     "group": group_key(members, desc) if members else "", "seq": int(r.seq),
                     "native_seq": True, "op": r.op, "peer": r.peer, "root": r.root,
                     "start_us": float(r.start_us), "end_us": float(r.end_us),
                     "bytes": r.bytes, "group_size": len(members) or None,
                     "issue_us": float(r.issue_us), "source": "records", "stream": r.stream})
    df = pd.DataFrame(rows, columns=[c for c in EVENT_COLUMNS
                                     if c not in ("step", "window", "functional", "backward")])
    df["step"] = step_of(df["issue_us"].to_numpy(dtype=float), steps)
    df["window"] = 0
    df["functional"] = False  # the records do not say
    df["backward"] = False
    return df[list(EVENT_COLUMNS)]


def comm_events(traces: TraceSet, comm_patterns=()) -> pd.DataFrame:
    """Every communication event of every rank, with :data:`EVENT_COLUMNS`.

    ``seq`` is the per-group sequence number from the records, or the per-group order in the
    trace; ``pg`` is ``"?"`` where the trace does not name the group.
    """
    frames = []
    comm_patterns = list(comm_patterns)
    for rank, trace in traces.ranks.items():
        doc = traces.sidecars.get("comms", {}).get(rank)
        s = summary_of(trace, comm_patterns)   # a summary's events carry no rank
        frames.append((rank, _from_records(rank, doc, s.steps) if doc else s.stored("comm")))
    out = stack_by_rank(frames)
    if out is None:
        return pd.DataFrame(columns=list(EVENT_COLUMNS))
    return groups_from_mesh(run_windows(out[list(EVENT_COLUMNS)], traces), traces)


def run_windows(ev: pd.DataFrame, traces: TraceSet) -> pd.DataFrame:
    """``ev`` (``rank``, ``window`` the rank's own, ``start_us``, ``end_us``) with each event's
    ``window`` the run's profiling window it lies in, where the
    ranks hold different numbers of windows: a rank's own count starts at its first file, so a
    rank that lacks the first window (its file lost, a rank that joined late) numbered its
    second window 0 and was matched with the others' first. The run's windows are the ranks'
    windows grouped by time (one group while they overlap: a repeating schedule's windows are
    seconds apart, hosts' clocks milliseconds); a rank with one window spans its events."""
    counts = {int(r): max(1, len(t.windows)) for r, t in traces.ranks.items()}
    if len(set(counts.values())) <= 1 or ev.empty:
        return ev
    spans: list[tuple[float, float, int, int]] = []
    for r, t in traces.ranks.items():
        if len(t.windows) >= 2:
            spans += [(float(a), float(b), int(r), i) for i, (a, b) in enumerate(t.windows)]
        else:
            mine = ev[ev["rank"] == r]
            if len(mine):
                spans.append((float(mine["start_us"].min()), float(mine["end_us"].max()),
                              int(r), 0))
    spans.sort()
    run_window: dict[tuple[int, int], int] = {}
    k, reach = -1, -np.inf
    for a, b, r, i in spans:
        if a > reach:
            k += 1
        reach = max(reach, b)
        run_window[(r, i)] = k
    keys = list(zip(ev["rank"].astype(int), ev["window"].astype(int)))
    return ev.assign(window=[run_window.get(x, x[1]) for x in keys])


def _mesh_groups(traces: TraceSet) -> dict[str, dict[Any, Any]]:
    """``{dim: {rank: its group's ranks}}`` of the mesh dimensions that one description names
    (:func:`pardiag.analyzer.analyses.mesh.mesh_dims` over every rank's ``pg_config``), with the
    description: ``{"tp": {0: [0, 1], ...}}``; products (``dp_replicate`` × ``dp_shard``) are left
    out, since an op runs over one of their factors."""
    from .mesh import mesh_dims

    groups = [(str(vocab.PG_CONFIG_DESC.get(g, "")), list(vocab.PG_CONFIG_RANKS.get(g)))
              for t in traces.ranks.values() for g in t.pg_config]
    if not any(len(r) > 1 for _, r in groups):
        return {}
    world = max((len(r) for _, r in groups), default=0)
    m = mesh_dims(groups, None, max(world, len(traces.ranks)))
    out: dict[str, dict[Any, Any]] = {}  # {dim: {rank: ranks, ..., "desc": its text}}
    for d, desc in m.descs.items():
        if "," in desc:
            continue
        out[d] = {r: g[d] for r, g in m.member.items() if d in g}
        out[d]["desc"] = desc
    return out


def groups_from_mesh(ev: pd.DataFrame, traces: TraceSet) -> pd.DataFrame:
    """Name the group of ops whose trace does not (gloo traces of torchtitan: no
    ``record_param_comms``, so no group ranks) from what issued them, where the device mesh of the
    ranks' ``distributedInfo.pg_config`` leaves one choice:

    * a functional collective that moves tensors (any but an all-reduce of at most
      :data:`SCALAR_BYTES`) runs over the rank's ``tp`` group — DTensor's tensor-parallel
      redistributions — when the mesh has tp and no cp (context parallelism also runs
      functional collectives);
    * any other collective (FSDP's, DDP's, ZeRO's c10d calls) runs over the rank's ``dp`` group
      when the mesh's other dimensions are tp or pp only (their ops are functional or
      point-to-point);
    * an all-to-all runs over the ``ep`` group when the mesh has one.

    What is left (functional scalar reductions: the loss over the batch dimensions, a gradient
    norm over each) has :data:`AMBIGUOUS_GROUP` as its group: on a mesh of two dimensions or more
    it is no collective of the world, and the matching leaves it out rather than join ranks that
    it did not join. All ops of a run whose mesh has one dimension stay unnamed (its unnamed ops
    are the world's). Renamed ops are numbered in their order per group and window (``seq``).
    Returns a new frame with :data:`EVENT_COLUMNS`; ``ev`` is not changed.
    """
    unknown = (ev["group"].astype(str) == "") & ~ev["op"].isin(P2P_OPS)
    if not unknown.any():
        return ev
    mesh = _mesh_groups(traces)
    if len(mesh) < 2:
        return ev
    sub = ev[unknown]
    fn = sub["functional"].astype(bool)
    nbytes = pd.to_numeric(sub["bytes"], errors="coerce")
    scalar = fn & (sub["op"] == "all_reduce") & ~(nbytes > SCALAR_BYTES)
    dim = pd.Series(None, index=sub.index, dtype=object)
    if "tp" in mesh and "cp" not in mesh:
        dim[fn & ~scalar & (sub["op"] != "all_to_all")] = "tp"
    if "dp" in mesh and set(mesh) <= {"dp", "tp", "pp"}:
        dim[~fn & (sub["op"] != "all_to_all")] = "dp"
    if "ep" in mesh:
        dim[sub["op"] == "all_to_all"] = "ep"
    out = ev.copy()
    out.loc[sub.index, "group"] = AMBIGUOUS_GROUP
    named = []
    for i, d in dim.dropna().items():
        ranks = mesh[d].get(int(ev.at[i, "rank"]))
        if ranks:
            out.at[i, "group"] = group_key(ranks, mesh[d]["desc"])
            out.at[i, "group_size"] = len(ranks)
            named.append(i)
    if named:
        rows = out.loc[named]
        rows = rows[~rows["native_seq"].astype(bool)]
        out.loc[rows.index, "seq"] = rows.sort_values("start_us", kind="stable").groupby(
            ["rank", "group", "pg", "window"]).cumcount().reindex(rows.index) + 1
    return out
