"""Merge the per-rank traces of a run into one Chrome trace (Perfetto, chrome://tracing).

Every rank becomes its own process(es) on one timeline:

* **pids**: the processes of rank R (its host process, GPU devices, Kineto's ``Spans``...) get
  ``R * PID_STRIDE + k``, k = 0 for the process with the most events (named ``rank R``), then in
  order of first appearance (named ``rank R: <Kineto label such as GPU 0, or process name>``).
  ``process_name`` and ``process_sort_index`` metadata events say so, so ranks are listed in
  order. tids are kept.
* **clocks**: each rank's timestamps (µs, as the loader reads them) minus its clock offset from
  :func:`pardiag.analyzer.sync.compute_sync` (median of its collective ends minus the consensus
  end), so collectives line up across hosts. A rank without matched collectives keeps offset 0.
* **ids** of flow and async events (``s``/``t``/``f``, ``b``/``e``/``n``...) would link events of
  different ranks that share a correlation id: an integer id becomes ``id * n_ranks + i``
  (i = the rank's index among the merged ranks), a string id gets ``:r<rank>`` appended.
* events that are not objects, or whose ``ts`` is not a finite number, are left out (counted).

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

import orjson

from pardiag.analyzer.parse import read_trace_json
from pardiag.analyzer.traceset import TraceSet
from pardiag.errors import PardiagError

#: pid of process k of rank R in the merged trace: ``R * PID_STRIDE + k``.
PID_STRIDE = 1000

_PROCESS_META = {"process_name", "process_sort_index", "process_labels"}


@dataclasses.dataclass(frozen=True)
class MergeResult:
    """What :func:`merge_traces` wrote.

    Attributes:
        output: the file written.
        events: events written (metadata events included).
        dropped: events left out (not objects, or ``ts`` not a finite number).
        offsets_us: ``{rank: clock offset subtracted (µs)}``.
        pids: ``{rank: [merged pids]}``, host process first.
    """

    output: Path
    events: int
    dropped: int
    offsets_us: dict[int, float]
    pids: dict[int, list[int]]


def _pid_key(pid) -> str:
    return str(pid)


def rank_events(doc: dict, rank: int, index: int, n_ranks: int,
                offset_us: float) -> tuple[list[dict], list[int], int]:
    """The events of one rank's trace document, remapped for the merged trace.

    Args:
        doc: the rank's trace (``{"traceEvents": [...], ...}``).
        rank: its global rank (sets the pids and names).
        index: its position among the merged ranks (0-based; sets the flow ids).
        n_ranks: number of merged ranks.
        offset_us: clock offset to subtract from every ``ts`` (µs).

    Returns:
        (events, merged pids host process first, number of events left out).
    """
    raw = doc.get("traceEvents") or []
    events = [e for e in raw if isinstance(e, dict)]
    dropped = len(raw) - len(events)
    names: dict[str, str] = {}
    labels: dict[str, str] = {}
    counts: Counter = Counter()
    first_seen: dict[str, int] = {}
    for i, e in enumerate(events):
        key = _pid_key(e.get("pid"))
        first_seen.setdefault(key, i)
        if e.get("ph") == "M":
            if e.get("name") == "process_name" and isinstance(e.get("args"), dict):
                names.setdefault(key, str(e["args"].get("name", "")))
            elif e.get("name") == "process_labels" and isinstance(e.get("args"), dict):
                labels[key] = str(e["args"].get("labels", ""))  # Kineto: "CPU", "GPU 0"
        else:
            counts[key] += 1
    order = sorted(first_seen, key=lambda k: (-counts[k], first_seen[k]))
    if len(order) > PID_STRIDE:
        raise PardiagError(f"rank {rank}: {len(order)} processes in one trace; at most "
                           f"{PID_STRIDE} can be merged")
    new_pid = {k: rank * PID_STRIDE + i for i, k in enumerate(order)}
    out: list[dict] = []
    for k in order:
        pid = new_pid[k]
        label = f"rank {rank}" if pid == rank * PID_STRIDE else \
            f"rank {rank}: {labels.get(k) or names.get(k) or 'pid ' + k}"
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                    "args": {"name": label}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                    "args": {"sort_index": pid}})
    for e in events:
        ph = e.get("ph")
        if ph == "M" and e.get("name") in ("process_name", "process_sort_index"):
            continue  # replaced above
        e = dict(e)
        e["pid"] = new_pid[_pid_key(e.get("pid"))]
        ts = e.get("ts")
        if ts is not None or ph != "M":
            if (not isinstance(ts, (int, float)) or isinstance(ts, bool)
                    or not math.isfinite(ts)):
                if ph == "M":
                    e.pop("ts", None)
                else:
                    dropped += 1
                    continue
            else:
                e["ts"] = ts - offset_us
        if "id" in e and ph != "M":
            i = e["id"]
            if isinstance(i, int) and not isinstance(i, bool):
                e["id"] = i * n_ranks + index
            else:
                e["id"] = f"{i}:r{rank}"
        out.append(e)
    return out, [new_pid[k] for k in order], dropped


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
    info = {"source": traces.source, "pid_stride": PID_STRIDE, "ranks": []}
    written = dropped = 0
    pids: dict[int, list[int]] = {}
    offsets = {r: float(offsets_us.get(r, 0.0)) for r in traces.ranks}
    opener = gzip.open if output.name.endswith(".gz") else open
    try:
        with opener(output, "wb") as fh:
            fh.write(b'{"traceEvents":[')
            first = True
            for index, (rank, trace) in enumerate(traces.ranks.items()):
                doc = read_trace_json(trace.path)
                evs, rank_pids, drop = rank_events(doc, rank, index, n, offsets[rank])
                pids[rank] = rank_pids
                dropped += drop
                written += len(evs)
                if evs:
                    body = orjson.dumps(evs, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
                    fh.write(body if first else b"," + body)
                    first = False
                info["ranks"].append({"rank": rank, "file": str(trace.path),
                                      "offset_us": offsets[rank], "pids": rank_pids,
                                      # what report needs to read the rank back out of the
                                      # merged file as it read it here
                                      "metadata": {k: trace.metadata[k] for k in (
                                          "distributedInfo", "deviceProperties")
                                          if k in trace.metadata}})
                del doc, evs
            fh.write(b'],"displayTimeUnit":"ms","pardiagMerge":' + orjson.dumps(info) + b"}")
    except OSError as exc:
        raise PardiagError(f"{output}: cannot write ({exc.strerror or exc})") from None
    return MergeResult(output, written, dropped, offsets, pids)
