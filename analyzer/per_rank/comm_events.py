"""One rank's communication events as its trace records them: every collective and
point-to-point op the rank issued, one row per op (:data:`EVENT_COLUMNS`), with its group, its
per-group sequence number, its bytes and its profiler step.

From the trace: NCCL/RCCL kernels (group and sizes from their args or from the launching
``record_param_comms`` op) or gloo worker events (sizes from ``Input Dims``), numbered in time
order per group. :mod:`pardiag.analyzer.analyses.comm_events` stacks the ranks' events (or
pardiag's collective records, where the run has them) for the cross-rank matching.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from ..trace import intervals as iv
from ..trace import vocab
from ..trace.classify import (
    Kind,
    collective_type,
    comm_threads,
    name_test,
    on_threads,
)
from ..trace.comm_records import numel
from ..trace.traceset import RankTrace, isin_mask
from ..trace.vocab import int_arg, rank_list
from .breakdown import cpu_comm_types
from .issued_ops import gpu_issued_ops
from .op_semantics import P2P_OPS, ROOTED, semantics

#: Columns of :func:`comm_events` (µs on each rank's own clock; bytes of the full buffer).
#: ``pg`` is the group's name as the rank knows it (names are per-rank creation order and can name
#: different groups on different ranks); ``group`` is its identity, the sorted global ranks joined
#: by commas (``"0,2"``), or ``""`` when the trace does not say; ``native_seq`` is True where
#: ``seq`` is the group's own sequence number (pardiag's records, a trace's ``Seq``) rather than
#: the position in the trace; ``peer`` is the global rank at the other end of a send/recv (None
#: when unknown); ``window`` is the profiling window (file) of the rank the event comes from, in
#: time order (0 for a rank with one window); ``root`` is the global rank of a rooted op's root
#: where the record names it (None otherwise); ``functional`` is True for an op issued through a
#: functional collective (``_c10d_functional::*``: tensor parallelism, DTensor). One row per op
#: the program issued (an op's several kernels are one row, from the first kernel's start to the
#: last one's end). ``issue_us`` is when the program issued it (its first kernel's launch; a
#: gloo op's start): a kernel that starts well after it waited on its stream, ``stream`` (its
#: first kernel's; None for gloo and records).
EVENT_COLUMNS = ("rank", "pg", "group", "seq", "native_seq", "op", "peer", "root", "start_us",
                 "end_us", "bytes", "group_size", "step", "source", "window", "functional",
                 "issue_us", "stream", "backward")


#: Larger group sizes in a trace's args are not believed (no group's ranks are built from them).
MAX_GROUP_SIZE = 1 << 20


def step_of(times: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Profiler step whose CPU window holds each time; -1 outside every step."""
    out = np.full(len(times), -1, dtype=np.int64)
    if steps.empty or len(times) == 0:
        return out
    starts = steps["start_us"].to_numpy()
    ends = steps["end_us"].to_numpy()
    idx = np.searchsorted(starts, times, side="right") - 1
    ok = (idx >= 0) & (times < ends[np.clip(idx, 0, None)])
    out[ok] = steps["step"].to_numpy()[idx[ok]]
    return out


def group_key(ranks: Iterable[Any], desc: object = "") -> str:
    """Identity of a process group: its sorted global ranks joined by commas (``"0,2"``), and
    its description where the trace gives one (``"0,2|mesh_dp"``: two groups of the same ranks,
    such as a mesh's dp and tp groups on 2 ranks, stay apart; every member describes a group
    alike, while its name is the member's own creation-order number)."""
    key = ",".join(str(r) for r in sorted({int(r) for r in ranks}))
    desc = str(desc or "").strip().strip('"')
    return f"{key}|{desc}" if desc else key


def group_ranks(args: dict[str, Any], pg_ranks_by_name: dict[str, list[int]]) -> list[int] | None:
    """The global ranks of a communication op's group: ``Process Group Ranks``, else
    ``Global rank start``/``stride`` with ``Group size``, else ``distributedInfo.pg_config`` for
    its group name (the rank's own names)."""
    ranks = rank_list(vocab.PG_RANKS.get(args))
    if ranks:
        return ranks
    start, stride = (int_arg(vocab.GLOBAL_RANK_START.get(args)),
                     int_arg(vocab.GLOBAL_RANK_STRIDE.get(args)))
    size = int_arg(vocab.GROUP_SIZE.get(args))
    if start is not None and stride and size and start >= 0 and stride > 0 \
            and size <= MAX_GROUP_SIZE:
        return [start + stride * i for i in range(size)]
    name = vocab.PG_NAME.get(args)
    return pg_ranks_by_name.get(str(name)) if name is not None else None


def _pg_config(trace: RankTrace) -> tuple[dict[str, list[int]], int | None, int | None]:
    """(``{pg name: global ranks}`` from ``distributedInfo.pg_config``, world size, pg count)."""
    info = vocab.DISTRIBUTED_INFO.get(trace.metadata)
    by_name: dict[str, list[int]] = {}
    for g in trace.pg_config:  # the well-formed entries, as the layout reads them
        ranks = rank_list(vocab.PG_CONFIG_RANKS.get(g))
        if ranks:
            by_name[str(vocab.PG_CONFIG_NAME.get(g))] = ranks
    world = int_arg(vocab.DIST_WORLD_SIZE.get(info))
    return by_name, world, int_arg(vocab.DIST_PG_COUNT.get(info))


def _args_bytes(args: Any) -> int | None:
    """Bytes of an op's buffer from its record: the larger element count of ``In``/``Out msg
    nelems`` times the size of its ``dtype``, else its first input's shape (``Input Dims``)
    times the size of its first ``Input type``; None where the trace says neither, or names a
    dtype pardiag does not know (:func:`pardiag.analyzer.trace.vocab.dtype_bytes`: the loader
    warns; no size is guessed)."""
    if not isinstance(args, dict):
        return None
    n_in, n_out = int_arg(vocab.IN_NELEMS.get(args)), int_arg(vocab.OUT_NELEMS.get(args))
    if n_in is not None or n_out is not None:
        size = vocab.dtype_bytes(vocab.DTYPE.get(args))
        if size is None:
            return None
        n = max(n_in or 0, n_out or 0) * size
        return n if n < 2 ** 53 else None
    dims, types = vocab.INPUT_DIMS.get(args), vocab.INPUT_TYPE.get(args)
    if isinstance(dims, list) and dims and isinstance(types, list) and types:
        size = vocab.dtype_bytes(types[0])
        if size is None:
            return None
        try:
            n = numel(dims[:1]) * size
        except (TypeError, ValueError):
            return None
        return n if n < 2 ** 53 else None
    return None


def p2p_peer(op: str, args: Any, members: list[int] | None, c10d_call: bool = False
             ) -> tuple[int | None, int | None]:
    """The rank at the other end of a send/recv, as (its rank in the group, its global rank);
    either is None where the record and ``members`` (the group's global ranks, or None) do not
    give it. The one reader of a peer, for the matching and the layout alike. In order:

    * a ``c10d::send``/``c10d::recv_`` call (``c10d_call``): ``Concrete Inputs[2]``, a rank in
      the group;
    * ``Dst Rank`` of a send, ``Src Rank`` of a recv: a global rank;
    * another record's ``Peer`` (:data:`pardiag.analyzer.trace.vocab.PEER`): a rank in the group;
    * a send's or recv's ``Rank``: older ``record_param_comms`` hold the peer's rank in the group
      there (not the rank's own), taken where it fits the group's size.
    """
    if not isinstance(args, dict) or op not in P2P_OPS:
        return None, None

    def placed(local: int | None) -> tuple[int | None, int | None]:
        if local is None or local < 0:
            return None, None
        if members:
            return (local, members[local]) if local < len(members) else (None, None)
        return local, None

    if c10d_call:
        ci = vocab.CONCRETE_INPUTS.get(args)
        local = int_arg(ci[2]) if isinstance(ci, list) and len(ci) > 2 else None
        if local is not None:
            return placed(local)
    glob = int_arg((vocab.DST_RANK if op == "send" else vocab.SRC_RANK).get(args))
    if glob is not None:
        return (members.index(glob) if members and glob in members else None), glob
    v = vocab.PEER.get(args)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return placed(int(v))
    local = int_arg(vocab.RANK.get(args))
    size = int_arg(vocab.GROUP_SIZE.get(args))
    if local is not None and size is not None and local >= size:
        return None, None
    return placed(local)


def _p2p_peer(op: str, args: dict[str, Any], ranks: list[int] | None, rank: int | None = None,
              world: int | None = None) -> int | None:
    """Global rank at the other end of a send/recv (:func:`p2p_peer`), else, in a world of two
    ranks (``world``, the trace's ``distributedInfo``), the other one: a rank never sends to
    itself."""
    peer = p2p_peer(op, args, ranks)[1]
    if peer is not None:
        return peer
    if world == 2 and rank in (0, 1):
        return 1 - int(rank)
    return None


def _gloo_p2p_peers(ev: pd.DataFrame, p2p: pd.DataFrame, world_group: bool
                    ) -> list[int | None]:
    """Peers of gloo's point-to-point events (``gloo:send``/``gloo:recv`` on the calling thread):
    the i-th ``c10d::send`` (``c10d::recv_``) of the thread names the i-th transfer's peer in its
    ``Concrete Inputs[2]`` (a rank in the group; global only when every group is the world,
    ``world_group``). None where that does not hold."""
    out: list[int | None] = [None] * len(p2p)
    if not world_group or p2p.empty:
        return out
    for op, c10d in (("send", "c10d::send"), ("recv", "c10d::recv_")):
        calls = ev[ev["name"] == c10d]
        rows = np.flatnonzero((p2p["name"] == f"gloo:{op}").to_numpy())
        for (pid, tid), pos in p2p.iloc[rows].groupby(["pid", "tid"]).indices.items():
            idx = rows[pos]  # positions in p2p, where ``out`` holds them
            mine = calls[(calls["pid"] == pid) & (calls["tid"] == tid)]
            if len(mine) != len(idx):
                continue  # cannot tell which call is which transfer
            for i, a in zip(idx, mine["args"].tolist()):
                out[i] = p2p_peer(op, a, None, c10d_call=True)[0]
    return out


def events_from_trace(trace: RankTrace, kinds: pd.Series, steps: pd.DataFrame) -> pd.DataFrame:
    """The rank's communication events read from its trace (no pardiag records): GPU
    communication kernels (group, sequence number, peer and sizes from their args or from the
    launching ``record_param_comms`` op) and gloo's events (the worker threads' collectives; the
    calling thread's send/recv), in :data:`EVENT_COLUMNS`."""
    pg_ranks, world, pg_count = _pg_config(trace)
    frames = [df for df in (_gpu_comm_events(trace, kinds, steps, pg_ranks, world),
                            _gloo_events(trace, kinds, steps, pg_ranks, world, pg_count))
              if df is not None]
    if not frames:
        return pd.DataFrame(columns=list(EVENT_COLUMNS))
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    # in the order the program issued them: ops whose kernels were lost keep their place
    df = df.sort_values("issue_us", kind="stable").reset_index(drop=True)
    df["window"] = iv.window_of(df["issue_us"].to_numpy(dtype=float), trace.windows)
    # where the trace names no group, the k-th op of each type: ops of several groups (gloo's
    # broadcasts beside graph-launched all-reduces) may share that "group", and one group's ops
    # of one type keep their order on every rank where their mixture need not
    order = df.groupby(["group", "pg", "window", unnamed_group_unit(df)]).cumcount() + 1
    df["seq"] = np.where(df["native_seq"].astype(bool), df["seq"], order)
    # a send or recv: the k-th transfer to (from) its peer in its group, the lost ones counted,
    # which is how the cross-rank matching pairs a send with its recv; -1 without a peer
    p2p_ops = df["op"].isin(P2P_OPS).to_numpy()
    p2p = p2p_ops & df["peer"].notna().to_numpy()
    df.loc[p2p_ops & ~p2p, "seq"] = -1
    if p2p.any():
        df.loc[p2p, "seq"] = (df[p2p].groupby(["group", "pg", "op", "peer"]).cumcount() + 1
                              ).to_numpy()
    df = df[~df["missing"].astype(bool)]
    df = df.sort_values("start_us", kind="stable").reset_index(drop=True)
    df["backward"] = in_backward(trace, df["issue_us"].to_numpy(dtype=float))
    return df[list(EVENT_COLUMNS)]


def in_backward(trace: RankTrace, times: np.ndarray) -> np.ndarray:
    """Whether each of ``times`` (µs, the rank's clock) falls inside a host range that runs the
    backward (:data:`pardiag.analyzer.trace.vocab.BACKWARD_SPAN_RE`) on any thread: the forward
    thread waits in ``backward()`` meanwhile, so time says which pass issued an op."""
    ev = trace.events
    hit = (isin_mask(ev["cat"], ["cpu_op", "user_annotation"])
           & name_test(trace, "backward_span", vocab.BACKWARD_SPAN_RE.match))
    if not hit.any() or not len(times):
        return np.zeros(len(times), dtype=bool)
    spans = iv.union(ev["ts"].to_numpy(dtype=float)[hit],
                     (ev["ts"] + ev["dur"]).to_numpy(dtype=float)[hit])
    at = np.searchsorted(spans[:, 0], times, side="right") - 1
    inside: np.ndarray = (at >= 0) & (times <= spans[np.clip(at, 0, None), 1])
    return inside


def _gpu_comm_events(trace: RankTrace, kinds: pd.Series, steps: pd.DataFrame,
                     pg_ranks: dict[str, list[int]], world: int | None) -> pd.DataFrame | None:
    """The rank's GPU communication as events, one per *issued op*
    (:func:`pardiag.analyzer.analyses.issued_ops.gpu_issued_ops`: an all_to_all's ``SendRecv``
    per peer is one op from its first kernel's start to its last kernel's end; each member of a
    coalesced block is one; the type comes from the launching host op before the kernel's name);
    group, sequence number, peer and bytes from the op's record and kernel args.

    Ops whose kernels the trace lost (CUPTI drops records at a session's start) keep their place
    in their group's order: rows with NaN times (``missing``), so the positions of the ops that
    follow still say which collective of the group they are.

    ``kinds``: :func:`pardiag.analyzer.trace.classify.classify` of the events; ``steps``: the
    profiler steps; ``pg_ranks``/``world``: :func:`_pg_config`.

    Returns:
        :data:`EVENT_COLUMNS` but ``window``, plus ``issue_us`` (the launch, µs) and ``missing``
        (bool); ``seq`` -1 where the trace gives none; None without kernels.
    """
    ev = trace.events
    # communication kernels; copies a --comm-kernel pattern names (Memcpy PtoP) have no
    # rendezvous across ranks, so they are not matched
    gpu = ev[(kinds == Kind.GPU_COMM.value).to_numpy()
             & ~isin_mask(ev["cat"], ["gpu_memcpy", "gpu_memset"])]
    if not len(gpu):
        return None
    ops = gpu_issued_ops(trace, gpu).ops
    # the rank the trace states (a summary is made before the loader assigns ranks)
    own = int_arg(vocab.DIST_RANK.get(vocab.DISTRIBUTED_INFO.get(trace.metadata)))
    rows = []
    for op, a, issue, start, end, missing, functional in zip(
            ops["op"].tolist(), ops["args"].tolist(), ops["issue_us"].tolist(),
            ops["start_us"].tolist(), ops["end_us"].tolist(), ops["missing"].tolist(),
            ops["functional"].tolist()):
        row = _op_row(trace.rank, op, a, pg_ranks, world, own)
        row.update(start_us=start, end_us=end, issue_us=issue, missing=bool(missing),
                   functional=bool(functional))
        rows.append(row)
    df = pd.DataFrame(rows)
    df["step"] = step_of(df["issue_us"].to_numpy(dtype=float), steps)
    return df


def _op_row(rank: int, op: str, args: dict[str, Any], pg_ranks: dict[str, list[int]],
            world: int | None, own: int | None = None) -> dict[str, Any]:
    """Group, sequence number, peer and bytes of an op from its record's ``args``; ``own``: the
    global rank the trace states (``distributedInfo``), for a peer only a world of two ranks
    names (:func:`_p2p_peer`)."""
    members = group_ranks(args, pg_ranks)
    size = int_arg(vocab.GROUP_SIZE.get(args))
    seq = int_arg(vocab.SEQ.get(args))
    return {"rank": rank, "pg": str(vocab.PG_NAME.get(args, "?")),
            "group": group_key(members, vocab.PG_DESC.get(args))
            if members else "",
            "seq": seq if seq is not None else -1,
            "native_seq": seq is not None and op not in P2P_OPS,
            "op": op, "peer": _p2p_peer(op, args, members, own, world)
            if op in P2P_OPS else None,
            "bytes": _args_bytes(args), "root": _root(op, args, members),
            "group_size": size if size else (len(members) if members else world),
            "source": "trace", "stream": int_arg(vocab.STREAM.get(args))}


def _root(op: str, args: dict[str, Any], members: list[int] | None) -> int | None:
    """Global rank of a rooted op's root: the record's ``Rank`` (c10d records the root there for
    broadcast, reduce, scatter and gather) read as a rank in the group; None otherwise."""
    if semantics(op) != ROOTED:
        return None
    local = int_arg(vocab.RANK.get(args))
    if local is None:
        return None
    if members and 0 <= local < len(members):
        return members[local]
    return local


def _gloo_events(trace: RankTrace, kinds: pd.Series, steps: pd.DataFrame,
                 pg_ranks: dict[str, list[int]], world: int | None, pg_count: int | None
                 ) -> pd.DataFrame | None:
    """The rank's gloo events: the collectives on its communication worker threads, and the
    send/recv on the calling thread, each named by the op the program issued (gloo's all_reduce
    of a reduce_scatter is one), in the group that op's record names.

    ``kinds``, ``steps``: as for :func:`_gpu_comm_events`; ``pg_ranks``/``world``/``pg_count``:
    :func:`_pg_config`.

    Returns:
        :data:`EVENT_COLUMNS` but ``window`` (``step`` last; µs on the rank's clock, ``seq`` -1
        where the record gives none); None without gloo events.
    """
    ev = trace.events
    threads = comm_threads(trace)
    gloo = ev[name_test(trace, "gloo", lambda n: n.startswith("gloo:"))]
    if not len(gloo):
        return None
    on_worker = on_threads(gloo, threads)
    cct = cpu_comm_types(trace, kinds)
    issued = cct["type"].reindex(gloo.index)
    recs = cct["issuer_record"].reindex(gloo.index).tolist()
    ops = [t if isinstance(t, str) else collective_type(n)
           for t, n in zip(issued.tolist(), gloo["name"].tolist())]
    is_p2p = np.array([o in ("send", "recv") for o in ops], dtype=bool)
    keep = on_worker | is_p2p  # collectives on the worker threads; send/recv on the caller's
    gl = gloo[keep]
    # pg_config lists the groups that hold the rank; one of them carries its point-to-point
    # ops, and never one of a single rank (torchtitan lists one per unused mesh dimension)
    multi = [r for r in pg_ranks.values() if len(r) > 1]
    world_group = bool(pg_count == 1 or (multi and world and all(len(r) == world for r in multi)))
    peers: list[int | None] = [None] * len(gl)
    p2p_rows = np.flatnonzero(is_p2p[keep])
    if len(p2p_rows):
        for i, peer in zip(p2p_rows, _gloo_p2p_peers(ev, gl.iloc[p2p_rows], world_group)):
            peers[i] = peer
    recs = [r if isinstance(r, dict) else {} for r, k in zip(recs, keep) if k]
    members = [group_ranks(r, pg_ranks) if r else None for r in recs]
    seqs = [int_arg(vocab.SEQ.get(r)) for r in recs]
    kept_ops = [o for o, k in zip(ops, keep) if k]
    df = pd.DataFrame({
        "rank": trace.rank, "pg": [str(vocab.PG_NAME.get(r, "?")) for r in recs],
        "group": [group_key(m, vocab.PG_DESC.get(r)) if m else ""
                  for m, r in zip(members, recs)],
        "seq": [q if q is not None else -1 for q in seqs],
        "native_seq": [q is not None and o not in P2P_OPS for q, o in zip(seqs, kept_ops)],
        "op": kept_ops, "peer": pd.Series(peers, dtype=object),
        "start_us": gl["ts"].to_numpy(dtype=float),
        "end_us": (gl["ts"] + gl["dur"]).to_numpy(dtype=float),
        "bytes": [_args_bytes(a) for a in gl["args"]],
        "group_size": [len(m) if m else world for m in members],
        "root": [_root(o, r, m) for o, r, m in zip(kept_ops, recs, members)],
        "source": "trace",
        "functional": cct["functional"].reindex(gl.index).fillna(False).astype(bool).to_numpy()})
    df["step"] = step_of(df["start_us"].to_numpy(dtype=float), steps)
    df["issue_us"] = df["start_us"]
    df["stream"] = None
    df["missing"] = False
    return df


#: ``group`` of an op whose group the trace does not give on a mesh of two or more dimensions, and
#: that what issued it does not place in one (:func:`groups_from_mesh`): never matched.
AMBIGUOUS_GROUP = "?"


def unnamed_group_unit(ev: pd.DataFrame) -> pd.Series:
    """Per event (:data:`EVENT_COLUMNS`), the op type of a collective whose trace names no group
    (``group`` empty, ``pg`` ``"?"``), else ``""``: without a group's name, collectives of one
    type are the unit numbered and matched in order (one group's ops of a type are in one order
    on every rank; ops of several unnamed groups interleave differently on each). Sends and
    receives are paired by their own rules."""
    unnamed = ((ev["group"].astype(str) == "") & (ev["pg"].astype(str) == "?")
               & ~ev["op"].isin(P2P_OPS))
    return ev["op"].astype(str).where(unnamed, "")


#: A functional all-reduce of at most this many bytes reduces scalars (the loss, token counts,
#: per-parameter gradient norms: 4 bytes each, up to 1,024 parameter tensors), not activations.
SCALAR_BYTES = 4096
