"""Expert-parallel (MoE) routing imbalance: are tokens routed evenly?

A mixture-of-experts layer sends each token to the rank holding its expert with an all-to-all
(*dispatch*) and back with another (*combine*); the split sizes of each all-to-all say how many
rows (dim 0 of the buffer: a token per row when the buffer is tokens × hidden) each rank sends
to and receives from each member of the expert-parallel group. They come from the traces
(:func:`pardiag.analyzer.trace.comm_records.all_to_all_ops`: ``c10d::alltoall_base_``'s concrete
split-size inputs and shapes, or ``record_param_comms``' ``In split size``/``Out split size``
and element counts) and are matched to the all-to-all instances the synchronization analysis
matched across ranks (:mod:`pardiag.analyzer.analyses.sync`): on each rank, its all-to-all events in
time order take the issuing ops in order, an op at most :data:`MATCH_TOLERANCE_US` after the
event's start (the transfer starts inside or after the op that issued it) and no larger than
the instance's buffer where both sizes are known.

Per instance (:attr:`RoutingResult.instances`): rows sent (``S``) and received (``R``) per rank.
The *expert side* is the direction whose max/mean is larger — received rows for a dispatch (the
tokens the rank's experts process), sent rows for a combine (the same tokens going back); the
other direction is each rank's own tokens, even in a data-parallel batch. An instance whose
every rank sends and receives the same rows (an even split: a count exchange, or a
capacity-padded dispatch, in which routing cannot show) is not a routed instance.

Per group and step (:attr:`RoutingResult.steps`), over its routed instances: each rank's *load* = Σ
of its rows on the expert side (a token dispatched and combined, forward and backward, counts once
per all-to-all it crosses); imbalance = max/mean of the load over the group's ranks (the MoE
literature's load-balance ratio, e.g. Fedus et al., *Switch Transformers*, JMLR 2022, §2.2); the
*hot rank* holds the max. The cost: at every routed instance the hot rank arrives last at, each
other rank waits from its arrival to the hot rank's (clocks aligned,
:mod:`pardiag.analyzer.analyses.sync`); ``wait_us`` sums those waits. If expert time is linear in
rows, rank r waits ``t·(L_max − L_r)`` for a per-row time t, so ``Σ_r wait_r = t·n·(L_max − mean
L)``: with every rank given the mean load the step would be ``t·(L_max − mean L) = wait_us / n``
shorter (``saving_us``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from ..per_rank.summary import summary_of
from ..trace.traceset import TraceSet
from .op_roles import (
    a2a_evidence_totals,
    a2a_role_of,
    sequence_exchange_evidence,
    uneven_count,
)
from .sync import SyncResult

#: An all-to-all event takes an issuing op that started at most this long after it (µs).
MATCH_TOLERANCE_US = 50.0
#: Median max/mean load over steps at or above which routing is called imbalanced (the verdict
#: and the terminal name it; the recommendation rule evaluates it).
IMBALANCE_MIN = 1.2

#: Columns of :attr:`RoutingResult.instances`.
INSTANCE_COLUMNS = ("instance", "group", "step", "seq", "unit", "ranks", "send_rows",
                    "recv_rows", "side", "imbalance", "hot_rank", "last_rank", "wait_us")
#: Columns of :attr:`RoutingResult.per_rank`.
PER_RANK_COLUMNS = ("group", "step", "rank", "sent_rows", "recv_rows", "load_rows",
                    "waited_us")
#: Columns of :attr:`RoutingResult.steps`.
STEP_COLUMNS = ("group", "step", "ranks", "instances", "max_rows", "mean_rows", "imbalance",
                "hot_rank", "wait_us", "saving_us")
#: Columns of :func:`rank_load` (:attr:`RoutingResult.rank_load`).
RANK_LOAD_COLUMNS = ("group", "rank", "load_rows")
#: Columns of :attr:`RoutingResult.groups`.
GROUP_COLUMNS = ("group", "dim", "ranks", "steps", "unit", "row_bytes", "imbalance",
                 "imbalance_min", "imbalance_max", "hot_rank", "hot_steps", "hot_rows",
                 "mean_rows", "wait_us", "saving_us", "saving_q1_us", "saving_q3_us", "expert")


@dataclasses.dataclass(frozen=True)
class RoutingResult:
    """Result of :func:`compute_routing` (see the module docstring for the definitions).

    Attributes:
        instances: per routed all-to-all instance: ``instance`` (the sync analysis' key), ``group``
            (its ranks and description, :func:`pardiag.analyzer.analyses.comm_events.group_key`),
            ``step``, ``seq``, ``unit`` (``"rows"``, or ``"elements"`` where the row size is
            unknown), ``ranks`` (members, group order), ``send_rows``/``recv_rows`` (lists in that
            order), ``side`` (``"recv"`` or ``"send"``: the expert side), ``imbalance`` (max/mean of
            the expert side), ``hot_rank``, ``last_rank`` (last to arrive), ``wait_us`` (Σ over the
            other ranks of their wait for the last arrival, µs).
        per_rank: per group, step and rank: ``sent_rows``, ``recv_rows`` (Σ over the routed
            instances), ``load_rows`` (Σ on the expert side), ``waited_us`` (its waits at them,
            µs).
        steps: per group and step: ``ranks``, ``instances`` (routed), ``max_rows``,
            ``mean_rows`` (load), ``imbalance`` (max/mean), ``hot_rank``, ``wait_us`` (the
            others' waiting at the instances the hot rank arrived last at, µs), ``saving_us``
            (``wait_us`` / ranks: the step's predicted saving with the mean load everywhere).
        groups: per group over its steps: ``dim`` (from the layout, None when unknown),
            ``ranks``, ``steps``, ``unit``, ``row_bytes`` (bytes per row of the largest routed
            buffer, None when unknown), ``imbalance`` (median over steps), ``imbalance_min``,
            ``imbalance_max``, ``hot_rank`` (most often hot), ``hot_steps`` (steps it was),
            ``hot_rows``/``mean_rows`` (median per step of the max and mean load), ``wait_us``,
            ``saving_us`` (median per step) with ``saving_q1_us``/``saving_q3_us``
            (quartiles), ``expert`` (the layout says the group's all-to-alls dispatch tokens to
            experts: its dimension is ``ep``, or it has none and the layout has an ``ep``
            dimension; else what they carry is unknown and nothing about experts is said of
            them). Sorted by ``saving_us``, largest first.
        matrix: per group, source and destination rank: ``group``, ``src``, ``dst``,
            ``rows`` (rows of ``src``'s tokens that ``dst``'s experts take, mean per routed
            all-to-all: a dispatch's send splits, a combine's receive splits; group ranks in
            ascending order; from split sizes only).
        notes: what could not be measured, one line each.
        rank_load: per group and rank, the median over steps of ``load_rows``
            (:func:`rank_load`; rows in the group's unit).
    """

    instances: pd.DataFrame
    per_rank: pd.DataFrame
    steps: pd.DataFrame
    groups: pd.DataFrame
    matrix: pd.DataFrame
    notes: tuple[str, ...] = ()
    rank_load: pd.DataFrame = dataclasses.field(
        default_factory=lambda: pd.DataFrame(columns=list(RANK_LOAD_COLUMNS)))

    @property
    def expert(self) -> bool:
        """Whether any group's all-to-alls are expert dispatch by the layout's evidence."""
        return bool(len(self.groups)) and bool(self.groups["expert"].astype(bool).any())

    @property
    def finding(self) -> dict | None:
        """The group with the largest saving whose median imbalance is at least
        :data:`IMBALANCE_MIN`, as a dict of :data:`GROUP_COLUMNS`; None when routing is even."""
        g = self.groups
        if g.empty:
            return None
        bad = g[g["imbalance"] >= IMBALANCE_MIN]
        return None if bad.empty else bad.iloc[0].to_dict()

    def describe(self) -> str | None:
        """``"MoE routing is imbalanced: rank 0's experts take 1.79× the mean tokens of group
        0,1 (median over 3 steps, range 1.75–1.80); the others wait 12.3 ms per step for it at
        the all-to-alls"``, or None when routing is even. Of a group whose all-to-alls the layout
        does not call expert dispatch: ``"all-to-all sizes are uneven: rank 0 takes 1.79× the mean
        rows of group 0,1 (…); what the all-to-alls carry is unknown, so no MoE routing is
        inferred"``."""
        f = self.finding
        if f is None:
            return None
        spread = (f"(median over {f['steps']} step(s), range "
                  f"{f['imbalance_min']:.2f}–{f['imbalance_max']:.2f})")
        group = _ranks_text(f["group"])
        if f["expert"]:
            what = "tokens" if f["unit"] == "rows" else "elements (row size unknown)"
            text = (f"MoE routing is imbalanced: rank {f['hot_rank']}'s experts take "
                    f"{f['imbalance']:.2f}× the mean {what} of its expert-parallel group "
                    f"[{group}] {spread}")
        else:
            what = "rows" if f["unit"] == "rows" else "elements"
            text = (f"all-to-all sizes are uneven: rank {f['hot_rank']} takes "
                    f"{f['imbalance']:.2f}× the mean {what} of group [{group}] {spread}")
        if f["wait_us"] > 0:
            text += (f"; the others wait {f['wait_us'] / 1000:.1f} ms per step for it at the "
                     f"all-to-alls")
        return text if f["expert"] else (text + "; what the all-to-alls carry is unknown, so "
                                          "no MoE routing is inferred")


def rank_load(per_rank: pd.DataFrame) -> pd.DataFrame:
    """Each rank's load on the expert side per step, its median over the steps (rows in the
    group's unit; the load is defined in the module docstring).

    Args:
        per_rank: :attr:`RoutingResult.per_rank`.

    Returns:
        :data:`RANK_LOAD_COLUMNS`: ``group``, ``rank``, ``load_rows`` (median over steps), by
        group and rank.
    """
    if per_rank.empty:
        return pd.DataFrame(columns=list(RANK_LOAD_COLUMNS))
    return per_rank.groupby(["group", "rank"], as_index=False, sort=True)["load_rows"].median()


def _ranks_text(group: str) -> str:
    """``"0,1"`` of a group key; ``"ranks unknown"`` where the trace does not give them."""
    return str(group).split("|")[0] or "ranks unknown"


def empty_routing(notes: tuple[str, ...] = ()) -> RoutingResult:
    """A result without routed all-to-alls."""
    instances, per_rank, steps, groups, matrix = (pd.DataFrame(columns=list(c)) for c in (
        INSTANCE_COLUMNS, PER_RANK_COLUMNS, STEP_COLUMNS, GROUP_COLUMNS,
        ("group", "src", "dst", "rows")))
    return RoutingResult(instances, per_rank, steps, groups, matrix, notes=notes)


def _size(v) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _match(events: pd.DataFrame, ops: pd.DataFrame) -> dict:
    """``{index of an all-to-all event: op row}`` for one rank (see the module docstring).
    ``events``: ``raw_start`` (µs, the rank's clock), ``bytes`` (the instance's: the largest
    member's buffer, so an op moving more than that is not its op)."""
    out: dict = {}
    if events.empty or ops.empty:
        return out
    ts = ops["ts_us"].to_numpy(dtype=float)
    rows = ops.to_dict("records")
    j = 0
    for idx, start, nbytes in zip(events.index, events["raw_start"], events["bytes"]):
        nbytes = _size(nbytes)
        k = j
        chosen = None
        while k < len(rows) and ts[k] <= start + MATCH_TOLERANCE_US:
            r = rows[k]
            eb = _size(r["elem_bytes"])
            sizes = {x * eb for x in (_size(r["send_elems"]), _size(r["recv_elems"]))
                     if x is not None and eb is not None}
            if nbytes is None or not sizes or max(sizes) <= nbytes:
                chosen = k
                break
            k += 1
        if chosen is None:
            continue
        out[idx] = rows[chosen]
        j = chosen + 1
    return out


def _rows(op: dict, n: int) -> tuple[list[int] | None, list[int] | None, float | None, str]:
    """(rows sent per member, rows received per member, elements per row, unit) of one rank's
    op; splits from the split sizes, else the totals (per member unknown: None lists)."""
    row = _size(op.get("row_elems"))
    send, recv = op.get("send_splits"), op.get("recv_splits")
    send = list(send) if isinstance(send, (list, tuple)) and len(send) == n else None
    recv = list(recv) if isinstance(recv, (list, tuple)) and len(recv) == n else None
    return send, recv, row, "rows" if row else "elements"


def compute_routing(traces: TraceSet, sync: SyncResult | None, layout=None) -> RoutingResult:
    """Routing imbalance of every expert-parallel group (module docstring).

    Args:
        traces: the run (each rank's all-to-all ops with their split sizes).
        sync: the matched collectives (all-to-all instances, clock offsets, per-rank times).
        layout: :class:`pardiag.analyzer.analyses.layout.LayoutResult`, to name a group's dimension.

    Returns:
        :class:`RoutingResult`; empty (with a note when all-to-alls were seen) when no
        all-to-all carries sizes that differ across ranks.
    """
    if sync is None or sync.instances.empty:
        return empty_routing()
    inst = sync.instances[(sync.instances["op"] == "all_to_all") & sync.instances["complete"]]
    if inst.empty:
        return empty_routing()
    not_routing = _not_expert_dispatch(traces, layout)
    if not_routing:
        return empty_routing((not_routing,))
    routed = _route_instances(inst, _matched_per_rank(traces, sync, inst))
    notes = []
    if routed.unsized:
        notes.append(f"{routed.unsized} all-to-all instance(s) without split sizes or sizes on "
                     "every member (the issuing op was not recorded with its shapes): not counted")
    if routed.even:
        notes.append(f"{routed.even} all-to-all instance(s) split evenly (every rank sends and "
                     "receives the same rows: a count exchange, or a capacity-padded dispatch "
                     "in which routing cannot show): not counted as routed")
    if not routed.instances:
        return empty_routing(tuple(notes))
    instances = pd.DataFrame(routed.instances, columns=list(INSTANCE_COLUMNS))
    r = pd.DataFrame(routed.rank_rows)
    per_rank = (r.groupby(["group", "step", "rank"], as_index=False)
                .agg(sent_rows=("sent_rows", "sum"), recv_rows=("recv_rows", "sum"),
                     load_rows=("load_rows", "sum"), waited_us=("waited_us", "sum")))
    steps = _step_table(per_rank, r)
    groups = _group_table(steps, instances, routed.row_bytes, _dims(layout),
                          "ep" in (getattr(layout, "dims", None) or {}))
    return RoutingResult(instances, per_rank, steps, groups, _matrix(routed.matrix_rows),
                         tuple(notes), rank_load(per_rank))


def _not_expert_dispatch(traces: TraceSet, layout) -> str:
    """Why the run's all-to-alls are not read as expert dispatch, or "" when they may be: the
    all-to-alls' evidence (:func:`pardiag.analyzer.analyses.op_roles.all_to_all_role`) says a
    sequence exchange (Ulysses), alone or against routing's evidence, and no recorded layout
    names an ``ep`` dimension. Split sizes that differ cannot tell the two apart: attention
    heads split over ranks that do not divide them (14 over 4: 4, 4, 3, 3) differ as routed
    tokens do, and repeat call after call as a fixed routing of the same batch does."""
    if "ep" in (getattr(layout, "dims", None) or {}):
        return ""
    total = a2a_evidence_totals(traces)
    if not sequence_exchange_evidence(total):
        return ""
    role, line = a2a_role_of(total, uneven_count(traces))
    if role == "ep":
        return ""
    return f"the all-to-alls are not analysed as MoE routing: {line}"


def _matched_per_rank(traces: TraceSet, sync: SyncResult, inst: pd.DataFrame) -> pd.DataFrame:
    """The per-rank rows of the all-to-all instances ``inst`` (:attr:`SyncResult.per_rank`
    with the instance's ``bytes``), each with the op that issued it on its rank
    (:func:`_match`).

    Returns:
        those rows with ``raw_start`` (the rank's own clock, µs), ``op`` (the op's row, a dict;
        None when unmatched), ``until`` (the last arrival, µs) and ``waited`` (µs) added.
    """
    off = dict(zip(sync.offsets["rank"], sync.offsets["offset_us"]))
    pr = sync.per_rank[sync.per_rank["instance"].isin(inst["instance"])].merge(
        inst[["instance", "bytes"]], on="instance")
    pr = pr.assign(raw_start=pr["start_us"] + pr["rank"].map(off).fillna(0.0))
    op_of: dict = {}
    for rank, rows in pr.groupby("rank"):
        trace = traces.ranks.get(int(rank))
        if trace is None:
            continue
        op_of.update(_match(rows.sort_values("raw_start"), summary_of(trace).a2a))
    pr = pr.assign(op=pd.Series({i: op_of.get(i) for i in pr.index}, dtype=object))
    pr["until"] = pr.groupby("instance")["start_us"].transform("max")
    pr["waited"] = pr["until"] - pr["start_us"]
    return pr


@dataclasses.dataclass(frozen=True)
class _Routed:
    """What :func:`_route_instances` found.

    Attributes:
        instances: one dict per routed instance, :data:`INSTANCE_COLUMNS`.
        rank_rows: one dict per routed instance and rank: ``group``, ``step``, ``rank``,
            ``sent_rows``, ``recv_rows``, ``load_rows``, ``waited_us`` (µs), ``_last`` (the
            last to arrive), ``_instance``.
        matrix_rows: one dict per routed instance, source and destination: ``group``,
            ``instance``, ``src``, ``dst``, ``rows``.
        row_bytes: ``{group: bytes per row of its largest routed buffer}``.
        unsized: instances left out for want of sizes.
        even: instances left out as split evenly.
    """

    instances: list[dict]
    rank_rows: list[dict]
    matrix_rows: list[dict]
    row_bytes: dict[str, float]
    unsized: int
    even: int


def _ratio(x: np.ndarray) -> float:
    """max/mean of ``x``; 1 when the mean is not positive."""
    return float(x.max() / x.mean()) if x.mean() > 0 else 1.0


def _route_instances(inst: pd.DataFrame, pr: pd.DataFrame) -> _Routed:
    """The routed instances among ``inst`` (all-to-all rows of :attr:`SyncResult.instances`):
    rows sent and received per member, the expert side, the hot rank and the waits
    (module docstring); ``pr``: :func:`_matched_per_rank`."""
    rows_i, rows_r, matrix_rows = [], [], []
    unsized = even = 0
    row_bytes: dict[str, float] = {}
    first = inst.drop_duplicates("instance")  # each instance's row, looked up by key
    metas = dict(zip(first["instance"],
                     first[["group", "step", "seq", "last_rank"]].to_dict("records")))
    for key, g in pr.groupby("instance", sort=False):
        meta = metas[key]
        g = g.sort_values("rank")
        members = [int(r) for r in g["rank"]]
        if g["op"].isna().any():
            unsized += 1
            continue
        ops = g["op"].tolist()
        parts, unit, sent_a, recv_a = _sent_received(ops, len(members))
        if np.isnan(sent_a).any() or np.isnan(recv_a).any():
            unsized += 1
            continue
        if np.all(sent_a == sent_a[0]) and np.all(recv_a == recv_a[0]):
            even += 1
            continue
        side = "recv" if _ratio(recv_a) >= _ratio(sent_a) else "send"
        load = recv_a if side == "recv" else sent_a
        hot = members[int(np.argmax(load))]
        last = int(meta["last_rank"])
        waits = dict(zip(members, g["waited"].astype(float)))
        rows_i.append({"instance": key, "group": meta["group"], "step": int(meta["step"]),
                       "seq": int(meta["seq"]), "unit": unit, "ranks": members,
                       "send_rows": sent_a.tolist(), "recv_rows": recv_a.tolist(), "side": side,
                       "imbalance": _ratio(load), "hot_rank": hot, "last_rank": last,
                       "wait_us": float(sum(w for r, w in waits.items() if r != last))})
        for r, s_, v, ld in zip(members, sent_a, recv_a, load):
            rows_r.append({"group": meta["group"], "step": int(meta["step"]), "rank": r,
                           "sent_rows": float(s_), "recv_rows": float(v),
                           "load_rows": float(ld), "waited_us": waits[r],
                           "_last": last, "_instance": key})
        for r, (s, rv, row, _) in zip(members, parts):
            # src → the rank whose experts take the rows: a dispatch's send splits, a combine's
            # receive splits (the rows coming back from each expert rank)
            out = s if side == "recv" else rv
            if out is not None and unit == "rows":
                for dst, x in zip(members, out):
                    matrix_rows.append({"group": meta["group"], "instance": key,
                                        "src": r, "dst": dst, "rows": float(x)})
            eb = _size(ops[members.index(r)].get("elem_bytes"))
            if row and eb:
                row_bytes[meta["group"]] = max(row_bytes.get(meta["group"], 0.0), row * eb)
    return _Routed(rows_i, rows_r, matrix_rows, row_bytes, unsized, even)


def _sent_received(ops: list[dict], n: int) -> tuple[list, str, np.ndarray, np.ndarray]:
    """Rows (elements where some member's row size is unknown) each of the ``n`` members
    sends and receives at one instance, from its op (``ops``, group order).

    Returns:
        (:func:`_rows` of each op, unit ``"rows"`` or ``"elements"``, sent and received per
        member as float arrays, NaN where unknown).
    """
    parts = [_rows(o, n) for o in ops]
    unit = "rows" if all(p[3] == "rows" for p in parts) else "elements"
    sent, recv = [], []
    for o, (s, r, row, _) in zip(ops, parts):
        # (every op in rows has its row size)
        scale = row if unit == "rows" and row is not None else 1.0
        se, re_ = _size(o.get("send_elems")), _size(o.get("recv_elems"))
        sent.append(float(sum(s)) if s is not None and unit == "rows" else
                    (se / scale if se is not None else np.nan))
        recv.append(float(sum(r)) if r is not None and unit == "rows" else
                    (re_ / scale if re_ is not None else np.nan))
    return parts, unit, np.array(sent, dtype=float), np.array(recv, dtype=float)


def _step_table(per_rank: pd.DataFrame, r: pd.DataFrame) -> pd.DataFrame:
    """:attr:`RoutingResult.steps` from :attr:`RoutingResult.per_rank` and the per-instance
    rank rows ``r`` (:attr:`_Routed.rank_rows`: the waits at the instances the hot rank
    arrived last at, µs)."""
    step_rows = []
    for (grp, step), g in per_rank.groupby(["group", "step"]):
        load = g.set_index("rank")["load_rows"]
        hot = int(load.idxmax())
        mean = float(load.mean())
        mine = r[(r["group"] == grp) & (r["step"] == step)]
        waited = mine[(mine["_last"] == hot) & (mine["rank"] != hot)]["waited_us"].sum()
        step_rows.append({"group": grp, "step": int(step), "ranks": len(load),
                          "instances": int(mine["_instance"].nunique()),
                          "max_rows": float(load.max()), "mean_rows": mean,
                          "imbalance": float(load.max() / mean) if mean > 0 else 1.0,
                          "hot_rank": hot, "wait_us": float(waited),
                          "saving_us": float(waited) / len(load)})
    return pd.DataFrame(step_rows, columns=list(STEP_COLUMNS))


def _group_table(steps: pd.DataFrame, instances: pd.DataFrame, row_bytes: dict[str, float],
                 dims: dict[str, str], has_ep: bool) -> pd.DataFrame:
    """:attr:`RoutingResult.groups` (largest saving first) from :attr:`RoutingResult.steps`
    and :attr:`RoutingResult.instances` (each group's unit); ``row_bytes``: bytes per row per
    group; ``dims``: :func:`_dims`; ``has_ep``: the layout has an ``ep`` dimension."""
    grows = []
    for grp, g in steps.groupby("group"):
        hot = g["hot_rank"].value_counts()
        top = int(hot.index[0])
        dim = dims.get(_ranks_text(grp))
        grows.append({
            "group": grp, "dim": dim, "ranks": int(g["ranks"].max()),
            "steps": len(g), "unit": instances.loc[instances["group"] == grp, "unit"].iloc[0],
            "row_bytes": row_bytes.get(grp), "imbalance": float(g["imbalance"].median()),
            "imbalance_min": float(g["imbalance"].min()),
            "imbalance_max": float(g["imbalance"].max()), "hot_rank": top,
            "hot_steps": int(hot.iloc[0]), "hot_rows": float(g["max_rows"].median()),
            "mean_rows": float(g["mean_rows"].median()), "wait_us": float(g["wait_us"].median()),
            "saving_us": float(g["saving_us"].median()),
            "saving_q1_us": float(g["saving_us"].quantile(0.25)),
            "saving_q3_us": float(g["saving_us"].quantile(0.75)),
            "expert": dim == "ep" or (dim is None and has_ep)})
    return (pd.DataFrame(grows, columns=list(GROUP_COLUMNS))
            .sort_values(["saving_us", "imbalance"], ascending=False).reset_index(drop=True))


def _matrix(matrix_rows: list[dict]) -> pd.DataFrame:
    """:attr:`RoutingResult.matrix` (mean rows per routed instance of the group) from
    :attr:`_Routed.matrix_rows`."""
    if not matrix_rows:
        return pd.DataFrame(columns=["group", "src", "dst", "rows"])
    m = pd.DataFrame(matrix_rows)
    n_inst = m.groupby("group")["instance"].nunique()
    matrix = m.groupby(["group", "src", "dst"], as_index=False)["rows"].sum()
    matrix["rows"] = matrix["rows"] / matrix["group"].map(n_inst)
    return matrix


def _dims(layout) -> dict[str, str]:
    """``{"0,1": dim}`` from the layout's groups (ranks → dimension; ``ep`` preferred)."""
    out: dict[str, str] = {}
    groups = getattr(layout, "groups", None)
    if groups is None or groups.empty or "ranks" not in groups:
        return out
    for dim, ranks in zip(groups["dim"], groups["ranks"]):
        if dim is None or not isinstance(ranks, (list, tuple)):
            continue
        key = ",".join(str(int(x)) for x in sorted(ranks))
        if key not in out or dim == "ep":
            out[key] = str(dim)
    return out
