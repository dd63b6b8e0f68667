"""The communication ops a GPU rank issued: one row per op the program called, however many
kernels it ran as (none, when the profiler lost them), and the op each communication kernel
belongs to. The breakdown's per-type counts and the cross-rank events both read this one table.

An op is issued on the host: c10d records it (``record_param_comms`` with a ``Collective name``,
one per op the program calls) inside the backend's range (``nccl:all_reduce``,
``c10d::allreduce_``, ``nccl:coalesced``), and its kernels are launched from there (a runtime
launch call tied to its kernel by ``correlation``). So ops are read from the host side and
kernels attached to them, launch by launch:

* a launch inside a record with a ``Collective name`` belongs to the innermost such record (an
  ``all_to_all`` launching one ``SendRecv`` kernel per peer is one op);
* a launch inside a coalescing range (``nccl:coalesced``, a record named ``coalesced``: a
  ``_coalescing_manager`` block, ``batch_isend_irecv``) belongs to a member op of the block. The
  members are the records the thread issued since its previous launching op that launch nothing
  themselves (c10d records each call in the block; the kernels are launched when the block
  ends). The i-th launch belongs to the i-th member when their numbers agree; when they do not
  (NCCL fuses a group into fewer kernels) every member spans every kernel of the block. A block
  without member records has one member op per launch;
* otherwise a launch belongs to the outermost communication range that encloses it;
* a communication kernel that no launch ties to a host op is an op of its own.

The type of an op is what the host side says (its record's ``Collective name``, else the range's
name: ``nccl:all_reduce`` says a ``SendRecv`` kernel of NCCL <= 2.13 or RCCL ran an all-reduce,
which the kernel's own name then did not say), else its first kernel's name
(:func:`pardiag.analyzer.trace.classify.collective_type`).

An op whose launches' kernels are all absent from the trace (CUPTI dropped them at a session's
start, a known loss of Kineto traces) is *missing*: it counts as issued and keeps its place in
its group's order, without times. So is a record that launched nothing before the trace's first
device-side record when its group's later records launch kernels: the launches are CUPTI
activity too, lost with the kernels (:func:`_lost_with_launches`).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import pandas as pd

from ..trace import intervals as iv
from ..trace import vocab
from ..trace.classify import (
    LAUNCH_CALL_RE,
    STANDARD_COLLECTIVES,
    cached,
    collective_type,
    name_test,
)
from ..trace.traceset import GPU_CATS, RankTrace, isin_mask

#: A host thread, ``(pid, tid)`` as the event table holds them.
Thread = tuple[Any, Any]
#: A launch inside host ops: ``(launch ts, thread, correlation, enclosing op positions)``.
OwnerRow = tuple[float, Thread, int, np.ndarray]
#: What :func:`_host_launches` finds once per trace: ``(names, args, o_ts, o_thread, owner_rows,
#: present, first activity, free launches)``.
HostLaunches = tuple[list[str], list[Any], np.ndarray, list[Thread], list[OwnerRow], set[int],
                     float, dict[int, float]]
#: :func:`_assemble`'s ``op_row(key, op, args, issue ts)``: the op's row, made on first call.
OpRow = Callable[[tuple[Any, ...], str, Any, float], dict[str, Any]]

#: Columns of :attr:`IssuedOps.ops`.
OP_COLUMNS = ("op", "args", "issue_us", "start_us", "end_us", "n_kernels", "missing", "block",
              "functional")


@dataclasses.dataclass(frozen=True)
class IssuedOps:
    """Result of :func:`gpu_issued_ops`.

    Attributes:
        ops: one row per issued op, in issue order: ``op`` (standard collective name, or a
            custom kernel's name), ``args`` (its record's args with its first kernel's on top:
            group, ``Seq``, sizes; ``{}`` when neither has any), ``issue_us`` (its first launch,
            else its record's start; µs on the rank's clock), ``start_us``/``end_us`` (its first
            kernel's start, its last kernel's end; NaN when missing), ``n_kernels``, ``missing``
            (launched, but no kernel in the trace), ``block`` (position of its coalescing range
            among the host ops, -1 outside one), ``functional`` (issued through a functional
            collective, ``_c10d_functional::*``: tensor parallelism's and DTensor's way).
        kernel_ops: for each communication kernel given (in order), the positions in ``ops`` of
            the ops it ran (one; several for a fused coalesced block).
    """

    ops: pd.DataFrame
    kernel_ops: tuple[tuple[int, ...], ...]

    def kernel_types(self) -> list[str]:
        """The op type of each kernel (its first op's)."""
        types = self.ops["op"].tolist()
        return [types[k[0]] for k in self.kernel_ops]

    def kernel_counts(self) -> np.ndarray:
        """How many issued ops each kernel accounts for: the ops whose first kernel it is."""
        return np.array([sum(c.values()) for c in self.kernel_type_counts()], dtype=np.int64)

    def kernel_type_counts(self) -> list[dict[str, int]]:
        """Per kernel, ``{op type: issued ops}`` of the ops whose first kernel it is (a fused
        coalesced block's one kernel runs its sends and its receives)."""
        types = self.ops["op"].tolist()
        out: list[dict[str, int]] = []
        seen: set[int] = set()
        for k in self.kernel_ops:
            counts: dict[str, int] = {}
            for j in k:
                if j not in seen:
                    seen.add(j)
                    counts[types[j]] = counts.get(types[j], 0) + 1
            out.append(counts)
        return out


def runtime_calls(trace: RankTrace) -> pd.DataFrame:
    """The host's runtime and driver calls that carry a ``correlation`` id (the id of the
    kernel, copy or memset each issued), the first of each id, with their event columns."""
    ev = trace.events
    rt = ev[isin_mask(ev["cat"], ["cuda_runtime", "cuda_driver"])
            & (ev["correlation"] >= 0).to_numpy()]
    return rt[~rt["correlation"].duplicated(keep="first").to_numpy()]


def launch_times(trace: RankTrace, kernels: pd.DataFrame, end: bool = False) -> np.ndarray:
    """CPU launch time (µs) of each GPU kernel: the ``ts`` of the runtime call with the same
    ``correlation`` id (with ``end``, the call's end, ``ts + dur``); a kernel without one gets
    its own ``ts`` (with ``end``, NaN: no launch is known)."""
    rt = runtime_calls(trace)
    t = rt["ts"] + rt["dur"] if end else rt["ts"]
    launch = pd.Series(t.to_numpy(dtype=float), index=rt["correlation"].to_numpy())
    lt: np.ndarray = launch.reindex(kernels["correlation"].to_numpy()).to_numpy(dtype=float)
    return lt if end else np.where(np.isnan(lt), kernels["ts"].to_numpy(), lt)


def _is_record(name: str, args: Any) -> bool:
    return name == "record_param_comms" and bool(vocab.COLLECTIVE_NAME.get(args))


def _is_coalescing(name: str, args: Any) -> bool:
    if coll := vocab.COLLECTIVE_NAME.get(args):
        return str(coll).lower().replace("_", "") in vocab.COALESCING_NAMES
    return name.rsplit(":", 1)[-1].lower().replace("_", "") in vocab.COALESCING_NAMES


def _launches(trace: RankTrace) -> pd.DataFrame:
    """Kernel launch calls (``ts``, ``pid``, ``tid``, ``correlation``), in time order."""
    ev = trace.events
    rt = ev[isin_mask(ev["cat"], ["cuda_runtime", "cuda_driver"])
            & (ev["correlation"] >= 0).to_numpy()
            & name_test(trace, "launch_call", LAUNCH_CALL_RE.search)]
    return rt[["ts", "pid", "tid", "correlation"]].sort_values("ts", kind="stable")


def gpu_issued_ops(trace: RankTrace, kernels: pd.DataFrame) -> IssuedOps:
    """The ops the rank issued and the op of each of its communication ``kernels`` (rows of its
    events; see the module docstring). The host ops and the launches inside them are found once
    per trace (:func:`_host_launches`, :func:`cached`); the kernels are matched per call."""
    names, args, o_ts, o_thread, owner_rows, present, first, free = cached(
        trace, "issued_host_launches", lambda: _host_launches(trace))
    k_corr = kernels["correlation"].to_numpy()
    kernel_of = {int(c): i for i, c in enumerate(k_corr.tolist()) if c >= 0}
    return _assemble(kernels, names, args, o_ts, o_thread, owner_rows, present, kernel_of,
                     first, free)


def _host_launches(trace: RankTrace) -> HostLaunches:
    """The host ops that can issue communication (``names``, ``args``, start ``o_ts`` in µs,
    ``(pid, tid)`` of each), the launches inside them (``(launch ts, thread, correlation,
    positions of the enclosing ops)``, time order per thread) and the correlation ids of every
    GPU event, and the time (µs) of the trace's first device-side record (a GPU event or a
    runtime call: CUPTI's activity, lost together at a session's start; inf without any), and
    the launches inside no such op (``{correlation: launch ts}``: a backend's own thread's).
    Read only by :func:`_assemble` (shared between calls: not modified)."""
    ev = trace.events
    ops = ev[name_test(trace, "launch_op", vocab.LAUNCH_OP_RE.match)
             & isin_mask(ev["cat"], ["cpu_op", "user_annotation"])]
    names, args = ops["name"].tolist(), ops["args"].tolist()
    o_ts = ops["ts"].to_numpy(dtype=float)
    o_end = o_ts + ops["dur"].to_numpy(dtype=float)
    o_thread = list(zip(ops["pid"].tolist(), ops["tid"].tolist()))
    launches = _launches(trace)
    present = set(ev.loc[isin_mask(ev["cat"], GPU_CATS)
                         & (ev["correlation"] >= 0).to_numpy(), "correlation"].tolist())
    activity = ev.loc[isin_mask(ev["cat"], [*GPU_CATS, "cuda_runtime", "cuda_driver"]), "ts"]
    first = float(activity.min()) if len(activity) else np.inf

    # per thread: the host ops (time order) and the launches inside any of them
    by_thread: dict[Thread, list[int]] = {}
    for j, key in enumerate(o_thread):
        by_thread.setdefault(key, []).append(j)
    owner_rows: list[OwnerRow] = []
    owned: set[int] = set()
    l_ts = launches["ts"].to_numpy(dtype=float)
    l_corr = launches["correlation"].to_numpy()
    l_pid, l_tid = launches["pid"].to_numpy(), launches["tid"].to_numpy()
    for key, positions in by_thread.items():
        rows = np.array(sorted(positions, key=lambda j: (o_ts[j], -o_end[j])))
        s, e = o_ts[rows], o_end[rows]
        # only the launches inside some host op need their enclosing ops looked up
        merged = iv.union(s, e + 1e-9)
        mine = np.flatnonzero((l_pid == key[0]) & (l_tid == key[1]))
        at = np.searchsorted(merged[:, 0], l_ts[mine], side="right") - 1
        inside = (at >= 0) & (l_ts[mine] <= merged[np.clip(at, 0, None), 1])
        for i in mine[inside].tolist():
            enc = rows[(s <= l_ts[i]) & (e >= l_ts[i])]
            if len(enc):
                owner_rows.append((float(l_ts[i]), key, int(l_corr[i]), enc))
                owned.add(i)
    free = {int(l_corr[i]): float(l_ts[i]) for i in range(len(l_ts)) if i not in owned}
    return names, args, o_ts, o_thread, owner_rows, present, first, free


def _assemble(kernels: pd.DataFrame, names: list[str], args: list[Any], o_ts: np.ndarray,
              o_thread: list[Thread], owner_rows: list[OwnerRow], present: set[int],
              kernel_of: dict[int, int], first: float = np.inf,
              free: dict[int, float] | None = None) -> IssuedOps:
    """The ops table from the launches inside host ops (``owner_rows``) and the kernels
    (``first``: the trace's first device-side record; ``free``: the launches inside no host
    op; :func:`_host_launches`)."""
    ops: list[dict[str, Any]] = []
    # ("op", position), ("block", position, member index) or ("kernel", kernel index)
    by_key: dict[tuple[Any, ...], int] = {}
    kernel_ops: list[list[int]] = [[] for _ in range(len(kernels))]

    def op_row(key: tuple[Any, ...], op: str, a: Any, t: float) -> dict[str, Any]:
        if key not in by_key:
            by_key[key] = len(ops)
            ops.append({"op": op, "args": a, "issue_us": t, "kernels": [], "launches": 0,
                        "block": key[1] if key[0] == "block" else -1})
        return ops[by_key[key]]

    blocks: dict[int, list[tuple[float, Thread, int]]] = {}
    # per thread, the records (time order): one that closed before its op's launch (XPU's
    # before torch-xpu-ops#5486) is found inside the range that encloses the launch
    rec_at: dict[Thread, tuple[list[float], list[int]]] = {}
    for j in sorted(range(len(names)), key=lambda j: o_ts[j]):
        if _is_record(names[j], args[j]) and not _is_coalescing(names[j], args[j]):
            at_j, pos_j = rec_at.setdefault(o_thread[j], ([], []))
            at_j.append(float(o_ts[j]))
            pos_j.append(j)
    for t, thread, corr, enc in owner_rows:
        rec = next((j for j in enc[::-1].tolist() if _is_record(names[j], args[j])
                    and not _is_coalescing(names[j], args[j])), None)
        block = next((j for j in enc.tolist() if _is_coalescing(names[j], args[j])), None)
        if rec is None and block is None and thread in rec_at:
            at_j, pos_j = rec_at[thread]
            last = bisect.bisect_right(at_j, t) - 1
            if last >= 0 and at_j[last] >= o_ts[int(enc[0])]:
                rec = pos_j[last]
                enc = np.append(enc, rec)
        if rec is None and block is not None:
            blocks.setdefault(block, []).append((t, thread, corr))
            continue
        j = rec if rec is not None else int(enc[0])
        row = op_row(("op", j), _host_type(names, args, enc),
                     args[j] if rec is not None else _shapes(args[int(enc[-1])]), t)
        row["functional"] = any(names[x].startswith(vocab.FUNCTIONAL_PREFIXES)
                                for x in enc.tolist())
        row["launches"] += 1
        k = kernel_of.get(corr)
        if k is not None:
            row["kernels"].append(k)
        elif corr in present:  # it launched computation or a copy
            row["other_kernels"] = True
    launching = set(blocks) | {key[1] for key in by_key if key[0] == "op"}
    comm_launches: dict[Thread, list[float]] = {}
    for t, thread, _, _ in owner_rows:
        comm_launches.setdefault(thread, []).append(t)
    # per thread: the records that can be members of a block, time order
    records: dict[Thread, list[int]] = {}
    for j in sorted(range(len(names)), key=lambda j: o_ts[j]):
        if j not in launching and _is_record(names[j], args[j]) \
                and not _is_coalescing(names[j], args[j]):
            records.setdefault(o_thread[j], []).append(j)
    claimed: set[int] = set()
    for b, ls in blocks.items():
        start = min(t for t, _, _ in ls)
        prev = max((t for t in comm_launches[o_thread[b]] if t < start), default=-np.inf)
        # c10d records each call of the block; the kernels launch when the block ends
        mine = records.get(o_thread[b], [])
        at = [o_ts[j] for j in mine]
        members = mine[bisect.bisect_right(at, prev):bisect.bisect_left(at, start)]
        _block_ops(b, ls, members, names, args, kernels, kernel_of, op_row)
        claimed.update(members)
    for row_i, row in enumerate(ops):
        for k in row["kernels"]:
            kernel_ops[k].append(row_i)
    if free:
        _launched_elsewhere(kernels, names, args, o_ts, records, claimed, free, kernel_ops,
                            op_row, by_key)
    _lost_with_launches(names, args, o_ts, records, claimed, ops, first, op_row)
    # kernels no host op launched: an op each
    for i, (name, a) in enumerate(zip(kernels["name"].tolist(), kernels["args"].tolist())):
        if not kernel_ops[i]:
            row = op_row(("kernel", i), _kernel_type(name, a), a if isinstance(a, dict) else {},
                         float(kernels["ts"].iloc[i]))
            row["kernels"].append(i)
            row["launches"] = 1
            kernel_ops[i].append(by_key[("kernel", i)])
    return _finish(ops, kernel_ops, kernels, present)


def _launched_elsewhere(kernels: pd.DataFrame, names: list[str], args: list[Any],
                        o_ts: np.ndarray, records: dict[Thread, list[int]], claimed: set[int],
                        free: dict[int, float], kernel_ops: list[list[int]], op_row: OpRow,
                        by_key: dict[tuple[Any, ...], int]) -> None:
    """Communication kernels a backend's own thread launched (oneCCL's worker, outside the
    calling op: ``free``, ``{correlation: launch ts}``) given to the op the program issued: the
    latest record (``records``, none that launched or joined a block: ``claimed``) at or before
    the launch, of the kernel's own type or of any type when the kernel's name says none (a
    custom kernel named by ``--comm-kernel``). A record then counts once however many kernels
    it ran as; one that launched nothing stays out, as before (gloo on CUDA tensors)."""
    recs = sorted((j for js in records.values() for j in js if j not in claimed),
                  key=lambda j: o_ts[j])
    if not recs:
        return
    at = [float(o_ts[j]) for j in recs]
    k_names, k_args = kernels["name"].tolist(), kernels["args"].tolist()
    for i, c in enumerate(kernels["correlation"].tolist()):
        t = free.get(int(c)) if c >= 0 and not kernel_ops[i] else None
        if t is None:
            continue
        last = bisect.bisect_right(at, t) - 1
        if last < 0:
            continue
        j = recs[last]
        typ = collective_type(names[j], args[j])
        own = _kernel_type(k_names[i], k_args[i] if isinstance(k_args[i], dict) else None)
        if own != typ and own in STANDARD_COLLECTIVES:
            continue
        row = op_row(("op", j), typ, args[j], float(o_ts[j]))
        row["launches"] += 1
        row["kernels"].append(i)
        kernel_ops[i].append(by_key[("op", j)])
        claimed.add(j)


def _lost_with_launches(names: list[str], args: list[Any], o_ts: np.ndarray,
                        records: dict[Thread, list[int]], claimed: set[int],
                        ops: list[dict[str, Any]], first: float, op_row: OpRow) -> None:
    """The ops whose kernels the trace lost together with their launches: records (``records``,
    per thread, none that launched or joined a block: ``claimed``) that begin before the
    trace's first device-side record (``first``; CUPTI's runtime calls and kernels are one
    activity buffer, lost together at a session's start while the host ops stay) and name the
    op type and the group (``Process Group Name``) of an op that did launch kernels here. A
    record of a group never seen launching (gloo on CUDA tensors launches nothing by design),
    or without a group's name, is no evidence and stays out."""
    launched = {(r["op"], str(vocab.PG_NAME.get(r["args"])))
                for r in ops if r["kernels"] and vocab.PG_NAME.present(r["args"])}
    if not launched or not np.isfinite(first):
        return
    for js in records.values():
        for j in js:
            if o_ts[j] >= first or j in claimed or not vocab.PG_NAME.present(args[j]):
                continue
            key = (collective_type(names[j], args[j]), str(vocab.PG_NAME.get(args[j])))
            if key in launched:
                op_row(("op", j), key[0], args[j], float(o_ts[j]))


def _block_ops(b: int, launches: list[tuple[float, Thread, int]], members: list[int],
               names: list[str], args: list[Any], kernels: pd.DataFrame,
               kernel_of: dict[int, int], op_row: OpRow) -> None:
    """The member ops of one coalescing block and their kernels (module docstring)."""
    launches = sorted(launches)
    ks = [kernel_of.get(c) for _, _, c in launches]
    if members and len(members) != len(launches):  # fused: every member spans every kernel
        for m, j in enumerate(members):
            row = op_row(("block", b, m), collective_type(names[j], args[j]), args[j],
                         launches[0][0])
            row["launches"] = len(launches)
            row["kernels"].extend(k for k in ks if k is not None)
        return
    known = next((_kernel_type(kernels["name"].iloc[k], kernels["args"].iloc[k])
                  for k in ks if k is not None), collective_type(names[b], args[b]))
    for m, ((t, _, _), k) in enumerate(zip(launches, ks)):
        member = members[m] if members else None
        op = collective_type(names[member], args[member]) if member is not None else (
            _kernel_type(kernels["name"].iloc[k], kernels["args"].iloc[k]) if k is not None
            else known)
        row = op_row(("block", b, m), op, args[member] if member is not None else {}, t)
        row["launches"] = 1
        if k is not None:
            row["kernels"].append(k)


def _host_type(names: list[str], args: list[Any], enc: np.ndarray) -> str:
    """The op type the host ops enclosing a launch name, innermost first: a record's
    ``Collective name``, else the first range named by a standard collective
    (``nccl:all_reduce``), else the outermost range's own name."""
    for j in enc[::-1].tolist():
        if _is_record(names[j], args[j]):
            return collective_type(names[j], args[j])
    for j in enc[::-1].tolist():
        t = collective_type(names[j], None)
        if t in STANDARD_COLLECTIVES and t != "send_recv":
            return t
    return collective_type(names[int(enc[0])], args[int(enc[0])])


def _shapes(args: Any) -> dict[str, Any]:
    """An op's input shapes and types (an older trace's only record of its size)."""
    return {key.name: key.get(args) for key in (vocab.INPUT_DIMS, vocab.INPUT_TYPE)
            if key.present(args)}


def _kernel_type(name: str, args: Any) -> str:
    """A kernel's op type from its own name and args; a ``SendRecv`` kernel of no known op is
    ``send_recv`` (batched point-to-point)."""
    op = collective_type(name, args if isinstance(args, dict) else None)
    if op not in STANDARD_COLLECTIVES and "sendrecv" in name.lower().replace("_", ""):
        return "send_recv"
    return op


def _finish(ops: list[dict[str, Any]], kernel_ops: list[list[int]], kernels: pd.DataFrame,
            present: set[int]) -> IssuedOps:
    """Times, kernel counts and the missing flag; a host op whose launches ran no kernel the
    trace holds counts as issued only when none of its launches' kernels is present (one that
    launched only computation or copies is no communication)."""
    k_ts = kernels["ts"].to_numpy(dtype=float)
    k_end = k_ts + kernels["dur"].to_numpy(dtype=float)
    k_args = kernels["args"].tolist()
    rows: list[dict[str, Any]] = []
    remap: dict[int, int] = {}
    for i, row in enumerate(ops):
        ks = sorted(set(row["kernels"]))
        if not ks and row.get("other_kernels"):
            continue
        a = row["args"] if isinstance(row["args"], dict) else {}
        if ks and isinstance(k_args[ks[0]], dict):
            a = {**a, **k_args[ks[0]]}
        remap[i] = len(rows)
        rows.append({"op": row["op"], "args": a, "issue_us": float(row["issue_us"]),
                     "start_us": float(k_ts[ks].min()) if ks else np.nan,
                     "end_us": float(k_end[ks].max()) if ks else np.nan,
                     "n_kernels": len(ks), "missing": not ks, "block": int(row["block"]),
                     "functional": bool(row.get("functional"))})
    df = pd.DataFrame(rows, columns=list(OP_COLUMNS))
    order = np.argsort(df["issue_us"].to_numpy(), kind="stable")
    pos = np.empty(len(order), dtype=np.int64)
    pos[order] = np.arange(len(order))
    df = df.iloc[order].reset_index(drop=True)
    k_ops = tuple(tuple(sorted(int(pos[remap[j]]) for j in ko if j in remap))
                  for ko in kernel_ops)
    return IssuedOps(df, k_ops)


def issued_ops(trace: RankTrace, kernels: pd.DataFrame, key: Hashable) -> IssuedOps:
    """:func:`gpu_issued_ops`, once per trace and ``key`` (the kernels' selection)."""
    return cached(trace, ("issued_ops", key), lambda: gpu_issued_ops(trace, kernels))

