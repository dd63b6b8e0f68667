"""Collective and point-to-point records: normalise what the collectors captured and place
each record on the trace's timeline.

Sources (see :mod:`pardiag.collectors.comms`): flight-recorder entries (collectives, with group,
per-group sequence number, sizes, dtypes, creation time) and pardiag's own point-to-point hook
records. Both carry epoch-ns times on the clock of the trace's ``baseTimeNanoseconds``, so
``trace µs = (t_ns − baseTimeNanoseconds) / 1000``.

Placement on the trace (:func:`attach_trace_times`):

* ``issue_us``: the record's own time, converted (for pardiag's Python-level point-to-point
  hook: the start of the ``c10d::*`` op it called);
* CPU/gloo: ``start_us``/``end_us`` of the ``gloo:*`` event that ran it (on a gloo worker
  thread for collectives, on the caller's thread for send/recv) — the first unmatched one with
  the same name (and element count, when the trace has ``Input Dims``) starting at or after the
  issue;
* GPU/NCCL: the communication kernel launched from inside the issuing ``c10d::*``/``nccl:*`` op;
* otherwise the issuing CPU op itself (the ``c10d::*`` event containing the issue time).

Every record then has ``op`` (standard collective name), ``pg_name``, ``pg_desc``, ``pg_ranks``,
``seq``, ``in_bytes``, ``out_bytes``, ``bytes`` (the full buffer, nccl-tests' S), ``dtype``,
``peer`` (send/recv), ``issue_us``, ``start_us``, ``end_us``, ``matched`` (what placed it), and
``transport_op`` where the backend ran the op as another one (gloo's reduce_scatter is an
all_reduce; ``op`` keeps what the program called).
"""

from __future__ import annotations

import bisect
from collections import defaultdict

import numpy as np
import pandas as pd

from pardiag.layout import full_buffer_bytes

from . import vocab
from .classify import STANDARD_COLLECTIVES, collective_type, comm_threads
from .traceset import RankTrace, isin_mask


def numel(sizes) -> int:
    """Elements of the tensors of ``sizes`` (a list of shapes, such as a flight-recorder entry's
    ``input_sizes`` or an op's ``Input Dims``); a missing shape counts 0."""
    total = 0
    for s in sizes or []:
        n = 1
        for d in s or []:
            n *= int(d)
        total += n if s is not None else 0
    return total


def _bytes(sizes, dtypes) -> int | None:
    """Bytes of tensors of ``sizes`` with element types ``dtypes``; None when a dtype is not
    known (:func:`pardiag.analyzer.trace.vocab.dtype_bytes`: no size is guessed)."""
    total = 0
    for s, d in zip(sizes or [], dtypes or []):
        n = 1
        for x in s or []:
            n *= int(x)
        size = vocab.dtype_bytes(d)
        if size is None:
            return None
        total += n * size
    return total


def records_from_flight_recorder(entries: list[dict], groups: list[dict]) -> list[dict]:
    """Normalise flight-recorder entries (``_dump_fr_trace_json()["entries"]``).

    ``bytes`` is the full buffer: :func:`pardiag.layout.full_buffer_bytes`.

    Args:
        entries: raw entries.
        groups: process-group table, ``[{"name", "desc", "ranks", ...}]``.
    """
    by_name = {g["name"]: g for g in groups}
    out = []
    for e in entries:
        pg = vocab.FR_PROCESS_GROUP.get(e) or ["", ""]
        name = vocab.FR_PROFILING_NAME.get(e, "")
        in_b = _bytes(vocab.FR_INPUT_SIZES.get(e), vocab.FR_INPUT_DTYPES.get(e))
        out_b = _bytes(vocab.FR_OUTPUT_SIZES.get(e), vocab.FR_OUTPUT_DTYPES.get(e))
        dtypes = vocab.FR_INPUT_DTYPES.get(e) or vocab.FR_OUTPUT_DTYPES.get(e) or [None]
        op = collective_type(name)
        ranks = by_name.get(str(pg[0]), {}).get("ranks")
        full = (full_buffer_bytes(op, in_b, out_b, len(ranks) if ranks else None)
                if in_b is not None and out_b is not None else None)
        out.append({
            "op": op, "trace_name": name,
            "pg_name": str(pg[0]), "pg_desc": str(pg[1]) if len(pg) > 1 else "",
            "pg_ranks": ranks,
            "seq": int(vocab.FR_P2P_SEQ.get(e) if vocab.FR_IS_P2P.get(e)
                       else vocab.FR_COLLECTIVE_SEQ.get(e, -1)),
            "in_bytes": in_b, "out_bytes": out_b, "bytes": full,
            "numel": numel(vocab.FR_INPUT_SIZES.get(e)),
            "dtype": dtypes[0], "peer": None,
            "issue_ns": int(vocab.FR_TIME_CREATED.get(e, 0)),
            "source": "flight_recorder",
        })
    return out


def records_from_p2p(records: list[dict], groups: list[dict]) -> list[dict]:
    """Normalise pardiag's point-to-point hook records; ``seq`` counts per group, op and peer:
    the count the hook recorded (every call since the script started, also those outside the
    profiler's window, which it does not keep), else the records' own count."""
    by_name = {g["name"]: g for g in groups}
    counters: dict[tuple, int] = defaultdict(int)
    out = []
    for r in sorted(records, key=lambda r: r["issue_ns"]):
        key = (r["pg_name"], r["op"], r["peer"])
        counters[key] += 1
        g = by_name.get(r["pg_name"], {})
        esize = vocab.dtype_bytes(r.get("dtype"))
        out.append({
            "op": r["op"], "trace_name": f"gloo:{r['op']}", "pg_name": r["pg_name"],
            "pg_desc": g.get("desc", ""), "pg_ranks": g.get("ranks"),
            "seq": int(r["seq"]) if isinstance(r.get("seq"), int) else counters[key],
            "in_bytes": r["bytes"], "out_bytes": r["bytes"], "bytes": r["bytes"],
            "numel": r["bytes"] // esize if esize else None, "dtype": r.get("dtype"),
            "peer": r["peer"], "issue_ns": int(r["issue_ns"]),
            "returned_ns": int(r.get("returned_ns") or r["issue_ns"]),
            "source": r.get("source", "p2p_hook"),
        })
    return out


def _input_numel(args) -> int | None:
    dims = vocab.INPUT_DIMS.get(args)
    if not isinstance(dims, list):
        return None
    try:
        return numel(dims[:1])
    except (TypeError, ValueError):
        return None


def attach_trace_times(records: list[dict], trace: RankTrace,
                       tolerance_us: float = 50.0) -> list[dict]:
    """Place records on ``trace``'s timeline (see the module docstring).

    Records whose issue time lies outside the trace's time range are dropped (the flight
    recorder keeps a ring of earlier collectives).

    Returns:
        New list of records, sorted by ``issue_us``, each with ``issue_us``, ``start_us``,
        ``end_us`` (µs, trace clock) and ``matched`` (``"gloo"``, ``"kernel"``, ``"op"`` or
        ``"none"``).
    """
    base_ns = vocab.BASE_TIME_NS.get(trace.metadata)
    ev = trace.events
    if not isinstance(base_ns, (int, float)) or ev.empty:
        return []
    lo = float(ev["ts"].min())
    hi = float((ev["ts"] + ev["dur"]).max())
    threads = comm_threads(trace)
    on_worker = np.fromiter(((p, t) in threads for p, t in zip(ev["pid"], ev["tid"])), dtype=bool,
                            count=len(ev))
    # gloo runs collectives on its worker threads and send/recv on the caller's thread
    workers = ev[ev["name"].str.startswith("gloo:")]
    by_name: dict[str, list] = defaultdict(list)
    for idx, name, ts, dur, args in zip(workers.index, workers["name"], workers["ts"],
                                        workers["dur"], workers["args"]):
        by_name[name].append((ts, ts + dur, _input_numel(args), idx))
    used: set = set()
    issuers = ev[~on_worker & isin_mask(ev["cat"], ["cpu_op", "user_annotation"])
                 & ev["name"].str.match(r"^(c10d::|nccl:|_c10d_functional::|record_param_comms)")]
    iss_start = issuers["ts"].to_numpy()
    iss_end = (issuers["ts"] + issuers["dur"]).to_numpy()
    order = np.argsort(iss_start, kind="stable")
    iss_start, iss_end = iss_start[order], iss_end[order]
    iss_rows = issuers.iloc[order]
    kernels = _comm_kernels_by_launch(trace)

    out = []
    for r in sorted(records, key=lambda r: r["issue_ns"]):
        issue = (r["issue_ns"] - base_ns) / 1000.0
        if not (lo - tolerance_us <= issue <= hi + tolerance_us):
            continue
        if "returned_ns" in r:  # a Python-level hook: the c10d op it called starts a bit later
            returned = (r["returned_ns"] - base_ns) / 1000.0
            k = bisect.bisect_left(iss_start, issue)
            if k < len(iss_start) and iss_start[k] <= returned:
                issue = float(iss_start[k])
        rec = {k: v for k, v in r.items() if k not in ("issue_ns", "returned_ns")}
        rec.update(issue_us=issue, start_us=None, end_us=None, matched="none")
        cands = by_name.get(r.get("trace_name", ""), [])
        for ts, end, numel, idx in cands:
            if idx in used or ts < issue - tolerance_us:
                continue
            if numel is not None and r.get("numel") is not None and numel != r["numel"]:
                continue
            used.add(idx)
            rec.update(start_us=float(ts), end_us=float(end), matched="gloo")
            break
        # the innermost issuing op that contains the issue time
        j = bisect.bisect_right(iss_start, issue) - 1
        while j >= 0 and iss_end[j] < issue:
            j -= 1
        if j >= 0:
            issued = collective_type(iss_rows["name"].iloc[j], iss_rows["args"].iloc[j])
            if issued in STANDARD_COLLECTIVES and issued != rec["op"]:
                # gloo runs reduce_scatter as an all_reduce: keep what the program asked for
                rec["transport_op"], rec["op"] = rec["op"], issued
        if rec["matched"] == "none" and j >= 0:
            span = kernels.get(int(iss_rows.index[j]))
            if span is not None:
                rec.update(start_us=span[0], end_us=span[1], matched="kernel")
                if span[2] is not None:
                    rec["stream"] = span[2]
            else:
                rec.update(start_us=float(iss_start[j]), end_us=float(iss_end[j]), matched="op")
        out.append(rec)
    return out


def _comm_kernels_by_launch(trace: RankTrace) -> dict[int, tuple[float, float, int | None]]:
    """``{index of a CPU comm op: (start, end, stream) of the first comm kernel launched inside
    it}`` (stream: :data:`vocab.STREAM` of the kernel's args, None where it has none)."""
    ev = trace.events
    kern = ev[(ev["cat"] == "kernel") & ev["name"].str.contains(r"nccl|rccl|hccl", case=False)]
    if kern.empty:
        return {}
    rt = ev[isin_mask(ev["cat"], ["cuda_runtime", "cuda_driver"])
            & (ev["correlation"] >= 0).to_numpy()]
    k_by_corr = {int(c): (float(t), float(t + d), vocab.int_arg(vocab.STREAM.get(a)))
                 for c, t, d, a in zip(kern["correlation"], kern["ts"], kern["dur"],
                                       kern["args"])}
    ops = ev[isin_mask(ev["cat"], ["cpu_op", "user_annotation"])
             & ev["name"].str.match(r"^(c10d::|nccl:|_c10d_functional::|record_param_comms)")]
    out: dict[int, tuple[float, float, int | None]] = {}
    for (pid, tid), grp in rt.groupby(["pid", "tid"]):
        t = grp["ts"].to_numpy()
        corr = grp["correlation"].to_numpy()
        o = np.argsort(t)
        t, corr = t[o], corr[o]
        mine = ops[(ops["pid"] == pid) & (ops["tid"] == tid)]
        for idx, s, d in zip(mine.index, mine["ts"], mine["dur"]):
            a, b = np.searchsorted(t, s), np.searchsorted(t, s + d, side="right")
            for c in corr[a:b]:
                if int(c) in k_by_corr:
                    out[int(idx)] = k_by_corr[int(c)]
                    break
    return out


# -- all-to-all split sizes (MoE routing) -------------------------------------------------------

#: Columns of :func:`all_to_all_ops`: one row per all-to-all the rank issued (``ts_us``/``end_us``
#: of the issuing op on the rank's own clock, µs); ``send_splits``/``recv_splits``: rows sent
#: to / received from each member of the group, in group-rank order (a list; ``[]`` when the op
#: split evenly; None when the trace does not say); ``send_elems``/``recv_elems``: elements sent
#: and received in all; ``row_elems``: elements per row (dim 0 of the buffer: a token when the
#: buffer is tokens × hidden), None when unknown; ``elem_bytes``: bytes per element (None when
#: the dtype is unknown); ``source``: ``"c10d"`` (``c10d::alltoall_base_``: its ``Concrete
#: Inputs`` hold the split sizes, its ``Input Dims`` the shapes) or ``"record_param_comms"``
#: (``In split size``/``Out split size``, ``In msg nelems``/``Out msg nelems``, ``dtype``).
A2A_COLUMNS = ("ts_us", "end_us", "send_splits", "recv_splits", "send_elems", "recv_elems",
               "row_elems", "elem_bytes", "source")


def parse_splits(v) -> list[int] | None:
    """Split sizes from a trace arg: a list, or text such as ``"[226, 30]"``; ``[]`` for an
    even split (``"[]"``); None when absent, unreadable or cut short (``"[1, 2, ...]"``)."""
    if isinstance(v, (list, tuple)):
        items = list(v)
    elif isinstance(v, str):
        text = v.strip().strip('"').strip()
        if not (text.startswith("[") and text.endswith("]")) or "..." in text:
            return None
        items = [t for t in text[1:-1].replace(" ", "").split(",") if t]
    else:
        return None
    out = []
    for x in items:
        try:
            n = int(x)
        except (TypeError, ValueError):
            return None
        if n < 0 or n >= 2 ** 53:
            return None
        out.append(n)
    return out


def _a2a_int(v) -> int | None:
    try:
        n = int(str(v).strip().strip('"')) if not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None
    return n if n is not None and 0 <= n < 2 ** 53 else None


def _from_c10d(args: dict) -> dict | None:
    """``c10d::alltoall_base_(output, input, group, output_split_sizes, input_split_sizes,
    ...)``: shapes from ``Input Dims``, split sizes from ``Concrete Inputs`` (recorded with
    ``record_shapes``)."""
    dims, ci = vocab.INPUT_DIMS.get(args), vocab.CONCRETE_INPUTS.get(args)
    if not isinstance(dims, list) or len(dims) < 2:
        return None
    out_d, in_d = dims[0], dims[1]
    if not (isinstance(out_d, list) and isinstance(in_d, list) and out_d and in_d):
        return None
    try:
        recv_elems, send_elems = numel([out_d]), numel([in_d])
        row = numel([in_d[1:]]) if len(in_d) > 1 else 1
    except (TypeError, ValueError):
        return None
    ci = ci if isinstance(ci, list) else []
    types = vocab.INPUT_TYPE.get(args)
    dtype = str(types[1] if isinstance(types, list) and len(types) > 1 else "")
    return {"recv_splits": parse_splits(ci[3]) if len(ci) > 3 else None,
            "send_splits": parse_splits(ci[4]) if len(ci) > 4 else None,
            "send_elems": send_elems, "recv_elems": recv_elems, "row_elems": row,
            "elem_bytes": vocab.dtype_bytes(dtype), "source": "c10d"}


def _from_rpc(args: dict) -> dict:
    """``record_param_comms`` of an all-to-all: split sizes and element counts."""
    send_s, recv_s = (parse_splits(vocab.IN_SPLITS.get(args)),
                      parse_splits(vocab.OUT_SPLITS.get(args)))
    send_e, recv_e = _a2a_int(vocab.IN_NELEMS.get(args)), _a2a_int(vocab.OUT_NELEMS.get(args))
    row = None
    if send_s and send_e is not None and sum(send_s) > 0 and send_e % sum(send_s) == 0:
        row = send_e // sum(send_s)
    elif recv_s and recv_e is not None and sum(recv_s) > 0 and recv_e % sum(recv_s) == 0:
        row = recv_e // sum(recv_s)
    return {"send_splits": send_s, "recv_splits": recv_s, "send_elems": send_e,
            "recv_elems": recv_e, "row_elems": row,
            "elem_bytes": vocab.dtype_bytes(vocab.DTYPE.get(args)),
            "source": "record_param_comms"}


def all_to_all_ops(events) -> pd.DataFrame:
    """The all-to-alls a rank issued, with their split sizes (:data:`A2A_COLUMNS`), from its
    event table (:data:`pardiag.analyzer.trace.traceset.EVENT_COLUMNS`), in time order.

    ``c10d::alltoall_base_`` ops (CPU and GPU traces recorded with shapes) and
    ``record_param_comms`` events of an all-to-all (``Collective name``) are read; a
    ``record_param_comms`` inside a ``c10d::alltoall_base_`` of the same thread fills what that
    op's row lacks instead of adding a row."""
    cols = list(A2A_COLUMNS)
    if events is None or events.empty:
        return pd.DataFrame(columns=cols)
    ops = events[events["name"].isin(["c10d::alltoall_base_", "c10d::alltoall_base",
                                      "record_param_comms"])]  # one pass over the names
    is_rpc = (ops["name"] == "record_param_comms").to_numpy()
    c10d, rpc = ops[~is_rpc], ops[is_rpc]
    rows: list[dict] = []
    spans: list[tuple] = []
    for pid, tid, ts, dur, args in zip(c10d["pid"], c10d["tid"], c10d["ts"], c10d["dur"],
                                       c10d["args"]):
        row = _from_c10d(args) if isinstance(args, dict) else None
        if row is None:
            row = {"send_splits": None, "recv_splits": None, "send_elems": None,
                   "recv_elems": None, "row_elems": None, "elem_bytes": None, "source": "c10d"}
        row.update(ts_us=float(ts), end_us=float(ts + dur))
        rows.append(row)
        spans.append((pid, tid, float(ts), float(ts + dur)))
    by_thread: dict[tuple, tuple[list, list]] = {}
    for i, (p, t, a, _) in sorted(enumerate(spans), key=lambda x: x[1][2]):
        starts, idx = by_thread.setdefault((p, t), ([], []))
        starts.append(a)
        idx.append(i)
    for pid, tid, ts, dur, args in zip(rpc["pid"], rpc["tid"], rpc["ts"], rpc["dur"], rpc["args"]):
        if (not isinstance(args, dict)
                or collective_type("record_param_comms", args) != "all_to_all"):
            continue
        rec = _from_rpc(args)
        starts, idx = by_thread.get((pid, tid), ([], []))
        k = bisect.bisect_right(starts, float(ts)) - 1   # the op started last before it
        inside = idx[k] if k >= 0 and spans[idx[k]][3] >= float(ts) else None
        if inside is None:
            rec.update(ts_us=float(ts), end_us=float(ts + dur))
            rows.append(rec)
            continue
        row = rows[inside]
        for k, v in rec.items():
            if row.get(k) is None and v is not None and k != "source":
                row[k] = v
    if not rows:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(rows)[cols]
    for c in ("send_splits", "recv_splits"):
        df[c] = df[c].astype(object)
    return df.sort_values("ts_us", kind="stable").reset_index(drop=True)


def ranks_in_records(events: pd.DataFrame | None) -> list[int]:
    """The global ranks a trace's communication records name as the caller's own, sorted: for
    each event of an op whose ``Rank`` is the caller's (:data:`pardiag.analyzer.trace.vocab.
    OWN_RANK_OPS`), the group's global ranks (``Process Group Ranks``, or ``Global rank start``
    and ``stride``) at that position. One rank when the records agree, several when they do not,
    none where they give no rank and group (older dialects, a truncated rank list).

    ``events``: :data:`pardiag.analyzer.trace.traceset.EVENT_COLUMNS`."""
    if events is None or events.empty:
        return []
    recs = events[events["name"].str.match(
        r"^(c10d::|nccl:|_c10d_functional::|record_param_comms|ncclDevKernel|ncclKernel)")]
    found: set[int] = set()
    for name, args in zip(recs["name"].tolist(), recs["args"].tolist()):
        if not isinstance(args, dict):
            continue
        local = vocab.int_arg(vocab.RANK.get(args))
        if local is None or collective_type(name, args) not in vocab.OWN_RANK_OPS:
            continue
        members = vocab.rank_list(vocab.PG_RANKS.get(args))
        if members is not None:
            if 0 <= local < len(members):
                found.add(members[local])
            continue
        start = vocab.int_arg(vocab.GLOBAL_RANK_START.get(args))
        stride = vocab.int_arg(vocab.GLOBAL_RANK_STRIDE.get(args))
        size = vocab.int_arg(vocab.GROUP_SIZE.get(args))
        if start is not None and start >= 0 and stride and stride > 0 and size \
                and 0 <= local < size:
            found.add(start + stride * local)
    return sorted(found)
