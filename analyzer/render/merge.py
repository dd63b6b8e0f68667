"""Merge the per-rank traces of a run into one Chrome trace (Perfetto, chrome://tracing).

Every rank becomes its own process(es) on one timeline:

* **pids**: the processes of rank R that hold events get ``R * PID_STRIDE + k``; k = 0 for its
  host process (the integer pid with the most events, named ``rank R``), then in order of
  event count and first appearance (named ``rank R: <Kineto label such as GPU 0, or process
  name>``). ``process_name`` and ``process_sort_index`` (= the pid) metadata events say so, so
  ranks are listed in order. A process without events (Kineto names every GPU of the host, used
  or not) is left out with its metadata. Kineto's bookkeeping processes with string pids
  (``Spans``: the ``PyTorch Profiler (0)`` span; ``Traces`` and ``""``: the iteration-start and
  record-window-end instants) become threads of the host process, named after their pid and
  tid, instead of processes called ``pid Spans``.
* **tids** are integers: integer tids are kept; a string tid (legacy ``"stream 7"``, Kineto's
  ``"PyTorch Profiler"``) gets the next free integer of its rank, and its thread keeps the
  string (or its ``thread_name``) as name. Every thread with events has a ``thread_name``.
* **clocks**: each rank's timestamps (µs, as the loader reads them) minus its clock offset from
  :func:`pardiag.analyzer.analyses.sync.compute_sync` (median of its collective ends minus the
  consensus end), so collectives line up across hosts. A rank without matched collectives keeps
  offset 0.
* **ids** of flow and async events (``s``/``t``/``f``, ``b``/``e``/``n``...) would link events of
  different ranks that share a correlation id: an integer id becomes ``id * n_ranks + i``
  (i = the rank's index among the merged ranks), a string id gets ``:r<rank>`` appended. A flow
  event whose ``(cat, id)`` lacks its start (``s``) or its end (``f``) in the rank's trace is
  left out (Kineto writes ``ac2g`` ends without starts; Perfetto drops them anyway), counted.
* **windows**: a rank whose events come from several files (its profiling windows,
  ``schedule(repeat=N)``) has every window's events, its process and thread names once.
* events that are not objects, whose ``ts`` is not a finite number, or complete events (``X``)
  whose ``dur`` is not a finite number ≥ 0 are left out (counted).

So the output keeps the rules Perfetto's JSON importer relies on (``tests/test_merge.py``
checks them): ``ph`` a string, ``pid``/``tid`` integers, ``ts`` finite numbers, ``dur`` ≥ 0,
each flow id one ``s`` and one ``f`` of one category, metadata events with their ``args``.

The output is ``{"traceEvents": [...], "displayTimeUnit": "ms", "pardiagMerge": {...}}``
(``pardiagMerge.ranks[]`` holds each rank's file, offset, pids and its ``distributedInfo`` and
``deviceProperties``, so ``pardiag report`` on the merged file reads each rank as before),
gzip-compressed when the file name ends in ``.gz``.
"""

from __future__ import annotations

import dataclasses
import gzip
import math
from collections import Counter
from pathlib import Path
from typing import Any, TypeGuard

import orjson

from pardiag.errors import PardiagError

from ..trace import vocab
from ..trace.parse import read_trace_json
from ..trace.traceset import TraceSet

#: pid of process k of rank R in the merged trace: ``R * PID_STRIDE + k``.
PID_STRIDE = 1000

#: Flow event phases: start, step, end (Chrome trace format "flow events", v1).
_FLOW = {"s", "t", "f"}


@dataclasses.dataclass(frozen=True)
class MergeResult:
    """What :func:`merge_traces` wrote.

    Attributes:
        output: the file written.
        events: events written (metadata events included).
        dropped: events left out (not objects, ``ts`` not a finite number, ``X`` without a
            finite ``dur`` ≥ 0).
        offsets_us: ``{rank: clock offset subtracted (µs)}``.
        pids: ``{rank: [merged pids]}``, host process first.
        unmatched_flows: flow events left out because their start or end is missing.
    """

    output: Path
    events: int
    dropped: int
    offsets_us: dict[int, float]
    pids: dict[int, list[int]]
    unmatched_flows: int = 0


@dataclasses.dataclass(frozen=True)
class RankEvents:
    """One rank's events remapped for the merged trace (:func:`rank_events`).

    Attributes:
        events: metadata events first (processes, then threads), then the timed events.
        pids: merged pids of the rank, host process first.
        dropped: events left out as malformed.
        unmatched_flows: flow events left out because their start or end is missing.
    """

    events: list[dict]
    pids: list[int]
    dropped: int
    unmatched_flows: int


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _key(v) -> str:
    """A hashable key for a pid/tid/id of any JSON type."""
    return v if isinstance(v, str) else repr(v)


def _split_events(doc: dict) -> tuple[list[dict], list[dict], list[dict], int]:
    """The events of ``doc`` sorted out: returns ``(events, meta, timed, dropped)`` — every
    event that is an object, its metadata (``M``) events, its well-formed timed events, and how
    many were left out as malformed (not objects, ``ts`` not finite, ``X`` without a finite
    ``dur`` ≥ 0)."""
    raw = doc.get("traceEvents") or []
    events = [e for e in raw if isinstance(e, dict)]
    dropped = len(raw) - len(events)
    meta: list[dict] = []
    timed: list[dict] = []
    for e in events:
        if e.get("ph") == "M":
            meta.append(e)
        elif not isinstance(e.get("ph"), str) or not _is_finite(e.get("ts")) or (
                e["ph"] == "X" and not (_is_finite(e.get("dur")) and e["dur"] >= 0)):
            dropped += 1
        else:
            timed.append(e)
    return events, meta, timed, dropped


def _matched_flows(timed: list[dict]) -> tuple[list[dict], int]:
    """``timed`` without the flow events whose ``(cat, id)`` lacks its start or its end;
    returns ``(kept events, flow events left out)``."""
    ends = {(str(e.get("cat")), _key(e.get("id"))) for e in timed if e["ph"] == "f"}
    starts = {(str(e.get("cat")), _key(e.get("id"))) for e in timed if e["ph"] == "s"}
    matched = starts & ends
    n_timed = len(timed)
    timed = [e for e in timed if e["ph"] not in _FLOW
             or (str(e.get("cat")), _key(e.get("id"))) in matched]
    return timed, n_timed - len(timed)


def _process_names(meta: list[dict]) -> tuple[dict[str, str], dict[str, str]]:
    """``(process names, Kineto process labels)`` by pid key, from the metadata events."""
    names: dict[str, str] = {}
    labels: dict[str, str] = {}
    for e in meta:
        if isinstance(e.get("args"), dict):
            k = _key(e.get("pid"))
            if e.get("name") == "process_name":
                names.setdefault(k, str(e["args"].get("name", "")))
            elif e.get("name") == "process_labels":
                labels[k] = str(e["args"].get("labels", ""))  # Kineto: "CPU", "GPU 0"
    return names, labels


@dataclasses.dataclass
class _RankPids:
    """How one rank's pids map to merged pids (:func:`_map_pids`).

    Attributes:
        own: pid keys that stay processes of their own, host process first.
        host: the host process's pid key (None in a trace without timed events).
        new_pid: ``{pid key: merged pid}`` for every pid with events.
        folded: pid keys folded into the host process (Kineto's Spans/Traces/"").
    """

    own: list[str]
    host: str | None
    new_pid: dict[str, int]
    folded: set[str]


def _map_pids(timed: list[dict], rank: int) -> _RankPids:
    """The merged pids of the processes of ``rank`` that hold timed events: the host first,
    then by event count and first appearance; string pids fold into the host.

    Raises:
        PardiagError: more than ``PID_STRIDE`` processes.
    """
    counts: Counter = Counter()
    first_seen: dict[str, int] = {}
    is_int_pid: dict[str, bool] = {}
    for i, e in enumerate(timed):
        k = _key(e.get("pid"))
        counts[k] += 1
        first_seen.setdefault(k, i)
        is_int_pid[k] = _is_int(e.get("pid"))
    order = sorted(first_seen, key=lambda k: (not is_int_pid[k], -counts[k], first_seen[k]))
    host = order[0] if order else None
    own = [k for k in order if k == host or is_int_pid[k]]  # processes of their own
    if len(own) > PID_STRIDE:
        raise PardiagError(f"rank {rank}: {len(own)} processes in one trace; at most "
                           f"{PID_STRIDE} can be merged")
    new_pid = {k: rank * PID_STRIDE + i for i, k in enumerate(own)}
    folded = {k for k in order if k not in new_pid}  # Kineto's Spans/Traces/"": into the host
    for k in folded:
        assert host is not None  # k is of order, whose first is the host
        new_pid[k] = new_pid[host]
    return _RankPids(own, host, new_pid, folded)


class _TidMap:
    """Integer tids of one rank's threads, assigned as :meth:`tid_of` first meets them:
    integer tids of processes of their own are kept, others get the next free integer.

    Attributes:
        new_tid: ``{(pid key, tid key): merged tid}``.
        named: ``{(merged pid, merged tid): thread name}`` of every thread met.
    """

    def __init__(self, meta: list[dict], events: list[dict], pids: _RankPids) -> None:
        self._pids = pids
        self._thread_names: dict[tuple[str, str], str] = {}
        for e in meta:
            if e.get("name") == "thread_name" and isinstance(e.get("args"), dict):
                self._thread_names.setdefault((_key(e.get("pid")), _key(e.get("tid"))),
                                              str(e["args"].get("name", "")))
        used = [t for t in (e.get("tid") for e in events) if _is_int(t)]
        self._next_tid = max(used, default=0) + 1
        self.new_tid: dict[tuple[str, str], int] = {}
        self.named: dict[tuple[int, int], str] = {}

    def tid_of(self, pid_key: str, tid) -> int:
        """The merged tid of thread ``tid`` of process ``pid_key`` (named when first met)."""
        folded, new_tid = self._pids.folded, self.new_tid
        key = (pid_key, _key(tid))
        if key not in new_tid:
            if _is_int(tid) and pid_key not in folded:
                new_tid[key] = tid
            else:
                new_tid[key] = self._next_tid
                self._next_tid += 1
            label = self._thread_names.get(key) or (tid if isinstance(tid, str) else "")
            if pid_key in folded:   # e.g. "Spans: PyTorch Profiler"
                label = ": ".join(x for x in (pid_key, label) if x) or "profiler"
            self.named[(self._pids.new_pid[pid_key], new_tid[key])] = (
                label or f"thread {new_tid[key]}")
        return new_tid[key]


def _process_meta(pids: _RankPids, rank: int, names: dict[str, str],
                  labels: dict[str, str]) -> list[dict]:
    """``process_name`` and ``process_sort_index`` events of the rank's own processes."""
    out: list[dict] = []
    for k in pids.own:
        pid = pids.new_pid[k]
        label = f"rank {rank}" if k == pids.host else \
            f"rank {rank}: {labels.get(k) or names.get(k) or 'pid ' + k}"
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                    "args": {"name": label}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                    "args": {"sort_index": pid}})
    return out


def _remap_timed(timed: list[dict], pids: _RankPids, tids: _TidMap, rank: int, index: int,
                 n_ranks: int, offset_us: float) -> list[dict]:
    """Copies of the timed events with merged pids, tids, shifted ``ts`` and rank-unique ids
    (assigns the tids in ``tids`` as it goes)."""
    body: list[dict] = []
    for e in timed:
        e = dict(e)
        k = _key(e.get("pid"))
        e["pid"] = pids.new_pid[k]
        e["tid"] = tids.tid_of(k, e.get("tid"))
        e["ts"] = e["ts"] - offset_us
        if "id" in e:
            i = e["id"]
            e["id"] = i * n_ranks + index if _is_int(i) else f"{i}:r{rank}"
        body.append(e)
    return body


def _other_meta(meta: list[dict], pids: _RankPids, tids: _TidMap,
                offset_us: float) -> tuple[list[dict], list[dict]]:
    """The rest of the metadata, of processes and threads that are kept (after the timed
    events were remapped); returns ``(process metadata, thread metadata)``, every thread met
    named once."""
    new_pid, folded, new_tid = pids.new_pid, pids.folded, tids.new_tid
    out: list[dict] = []
    threads: list[dict] = []
    seen_threads: set[tuple[str, int, int]] = set()
    for e in meta:   # the rest of the metadata, of processes and threads that are kept
        k = _key(e.get("pid"))
        name = e.get("name")
        if name in ("process_name", "process_sort_index") or k not in new_pid:
            continue   # replaced above, or a process without events
        if name in ("process_labels",) and k in folded:
            continue
        if name in ("thread_name", "thread_sort_index"):
            if (k, _key(e.get("tid"))) not in new_tid:
                continue   # a thread without events
            e = dict(e, pid=new_pid[k], tid=new_tid[(k, _key(e.get("tid")))])
            if (name, e["pid"], e["tid"]) in seen_threads:
                continue   # Kineto may name a thread twice; the first name counts
            seen_threads.add((name, e["pid"], e["tid"]))
            if name == "thread_name":
                e["args"] = {"name": tids.named[(e["pid"], e["tid"])]}
            threads.append(e)
            continue
        e = dict(e, pid=new_pid[k], tid=e.get("tid") if _is_int(e.get("tid")) else 0)
        if "ts" in e and not _is_finite(e["ts"]):
            e.pop("ts")
        elif "ts" in e:
            e["ts"] = e["ts"] - offset_us
        out.append(e)
    have = {(e["pid"], e["tid"]) for e in threads if e["name"] == "thread_name"}
    for (pid, tid), label in sorted(tids.named.items()):
        if (pid, tid) not in have:
            threads.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                            "args": {"name": label}})
    return out, threads


def rank_events(doc: dict, rank: int, index: int, n_ranks: int,
                offset_us: float) -> RankEvents:
    """The events of one rank's trace document, remapped for the merged trace (see the module
    docstring).

    Args:
        doc: the rank's trace (``{"traceEvents": [...], ...}``).
        rank: its global rank (sets the pids and names).
        index: its position among the merged ranks (0-based; sets the flow ids).
        n_ranks: number of merged ranks.
        offset_us: clock offset to subtract from every ``ts`` (µs).
    """
    events, meta, timed, dropped = _split_events(doc)
    # flows: keep a (cat, id) only with both its start and its end
    timed, unmatched = _matched_flows(timed)
    names, labels = _process_names(meta)
    pids = _map_pids(timed, rank)
    tids = _TidMap(meta, events, pids)
    out = _process_meta(pids, rank, names, labels)
    body = _remap_timed(timed, pids, tids, rank, index, n_ranks, offset_us)
    rest, threads = _other_meta(meta, pids, tids, offset_us)
    return RankEvents(out + rest + threads + body, [pids.new_pid[k] for k in pids.own],
                      dropped, unmatched)


def merge_traces(traces: TraceSet, offsets_us: dict[int, float], output: Path) -> MergeResult:
    """Write the merged trace of ``traces`` to ``output`` (see the module docstring).

    Each rank's file is read again (raw events, not the loader's table) one at a time, so memory
    holds one rank's events at a time plus the compressor.

    Args:
        traces: the loaded run (which files, which ranks).
        offsets_us: ``{rank: clock offset (µs)}`` to subtract; missing ranks get 0.
        output: file to write; gzip-compressed when its name ends in ``.gz``.

    Raises:
        PardiagError: a trace cannot be read again, or the output cannot be written.
    """
    output = Path(output)
    n = len(traces.ranks)
    info: dict[str, Any] = {"source": traces.source, "pid_stride": PID_STRIDE, "ranks": []}
    written = dropped = unmatched = 0
    pids: dict[int, list[int]] = {}
    offsets = {r: float(offsets_us.get(r, 0.0)) for r in traces.ranks}
    opener = gzip.open if output.name.endswith(".gz") else open
    try:
        with opener(output, "wb") as fh:
            fh.write(b'{"traceEvents":[')
            first = True
            for index, (rank, trace) in enumerate(traces.ranks.items()):
                # every profiling window of the rank (schedule(repeat=N)), one file at a time;
                # the process and thread names once
                for w, path in enumerate(trace.files or (trace.path,)):
                    doc = read_trace_json(path)
                    got = rank_events(doc, rank, index, n, offsets[rank])
                    evs = got.events if w == 0 else [e for e in got.events if e.get("ph") != "M"]
                    pids[rank] = got.pids
                    dropped += got.dropped
                    unmatched += got.unmatched_flows
                    written += len(evs)
                    if evs:
                        body = orjson.dumps(evs, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
                        fh.write(body if first else b"," + body)
                        first = False
                    del doc, evs
                rank_pids = pids[rank]
                info["ranks"].append({"rank": rank, "file": str(trace.path),
                                      "offset_us": offsets[rank], "pids": rank_pids,
                                      # what report needs to read the rank back out of the
                                      # merged file as it read it here
                                      "metadata": {k.name: k.get(trace.metadata) for k in (
                                          vocab.DISTRIBUTED_INFO, vocab.DEVICE_PROPERTIES)
                                          if k.present(trace.metadata)}})
            fh.write(b'],"displayTimeUnit":"ms","pardiagMerge":' + orjson.dumps(info) + b"}")
    except OSError as exc:
        raise PardiagError(f"{output}: cannot write ({exc.strerror or exc})") from None
    return MergeResult(output, written, dropped, offsets, pids, unmatched)
