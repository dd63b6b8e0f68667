"""Load Kineto (PyTorch profiler) Chrome-trace files into per-rank event tables.

Reads a run folder written by ``pardiag profile``, any folder of Kineto traces from elsewhere, or
a list of files; ``.json`` or ``.json.gz``. Handles the trace dialects seen in the field (FACTS §2):

* newest format: ``ts`` relative to ``baseTimeNanoseconds``, fractional µs;
* legacy format: categories ``Kernel``/``Operator``/``Runtime``/``Memcpy``/``Memset`` and ``tid``
  strings such as ``"stream 7"``;
* bare ``inf``/``-inf``/``nan``/``NaN``/``Infinity`` tokens and raw control characters in strings;
* stray timestamps: events at ``ts`` 0 among epoch timestamps, or years away from the rest of
  the file, however many (left out, one warning per file that says how many and where:
  :func:`stray_timestamps`);
* kernels on one stream that overlap (the earlier one is clipped to end where the next starts:
  a stream runs one kernel at a time; counted in a note).

Rank of each file: see :mod:`pardiag.analyzer.ranks` (``distributedInfo.rank``, else a rank or
worker number in the file name, else a free rank with a warning; files of one rank that do not
overlap in time are its profiling windows; a merged multi-rank file is split into its ranks).

Speed: strict-JSON files are decoded with msgspec into only the fields pardiag reads
(:func:`parse_trace_fast`); anything else takes the tolerant orjson/json path, which builds the
same table. Files are parsed in worker processes when the input is large
(:func:`default_workers`); with ``summarize=True`` each worker reduces its rank to a
:class:`pardiag.analyzer.summary.RankSummary` and hands back only that.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import re
import zlib
from pathlib import Path
from typing import Iterable

import msgspec
import numpy as np
import orjson
import pandas as pd

from pardiag import layout
from pardiag.analyzer.ranks import FileFacts, assign_ranks, merged_rank_of_pids
from pardiag.errors import PardiagError, TraceError

#: Columns of :attr:`RankTrace.events` (one row per complete event, ``ph == "X"``, or memory
#: instant event). ``ts``/``dur`` in µs on the trace's own clock; ``stream`` -1 for CPU events;
#: ``correlation`` -1 when absent; ``args`` holds the raw args dict for communication and memory
#: events (None otherwise).
EVENT_COLUMNS = ("name", "cat", "ph", "pid", "tid", "ts", "dur", "stream", "correlation", "args")

#: Category spellings of the legacy format mapped to the current ones.
_CAT_ALIASES = {
    "kernel": "kernel", "operator": "cpu_op", "runtime": "cuda_runtime", "driver": "cuda_driver",
    "memcpy": "gpu_memcpy", "memset": "gpu_memset", "gpu_memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset", "cpu_op": "cpu_op", "cuda_runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver", "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation", "cpu_instant_event": "cpu_instant_event",
    "python_function": "python_function", "cuda_sync": "cuda_sync",
    # other accelerators' runtime calls (they carry the kernels' correlation ids): one name
    "xpu_runtime": "cuda_runtime", "xpu_driver": "cuda_driver", "mtia_runtime": "cuda_runtime",
    "privateuse1_runtime": "cuda_runtime", "privateuse1_driver": "cuda_driver",
    "hpu_runtime": "cuda_runtime",
}
#: Categories of events that run on a GPU stream.
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

#: Events whose raw args are kept (communication metadata, memory counters).
_KEEP_ARGS_RE = re.compile(
    r"^(gloo:|nccl:|c10d::|_c10d_functional::|c10d_functional::|record_param_comms|\[memory\])"
    r"|nccl|rccl|hccl", re.IGNORECASE)

_STREAM_TID_RE = re.compile(r"stream\s*(\d+)", re.IGNORECASE)
# Bare non-JSON number tokens, outside strings (see _sanitize_json).
_BARE_NONFINITE_RE = re.compile(r'(-?)\b(inf|infinity|nan)\b', re.IGNORECASE)


class _LazyEvents:
    """Descriptor of :attr:`RankTrace.events`: a rank loaded from its summary reads its raw
    events from its file on first access (and keeps them)."""

    def __get__(self, obj, objtype=None):
        if obj is None:
            return dataclasses.MISSING  # a required dataclass field
        ev = obj.__dict__.get("_events")
        if ev is None:
            p = _parse_file(Path(obj.path))
            if p.error is not None or p.not_trace:
                raise TraceError(p.error or f"{obj.path}: not a Kineto trace (no traceEvents list)")
            ev = p.events
            obj.__dict__["_events"] = ev
        return ev

    def __set__(self, obj, value) -> None:
        obj.__dict__["_events"] = value


@dataclasses.dataclass(frozen=True)
class RankTrace:
    """The events of one rank's trace file.

    Attributes:
        rank: global rank.
        path: the file it came from.
        events: DataFrame with :data:`EVENT_COLUMNS`, sorted by ``ts``. A rank loaded from its
            summary (``summary`` set, ``events=None`` given) reads them from ``path`` on first
            access; the analyses use the summary and do not touch them.
        metadata: top-level keys of the trace other than ``traceEvents`` (``distributedInfo``,
            ``baseTimeNanoseconds``, ``deviceProperties``, ...).
        rank_source: ``"distributedInfo"``, ``"file name"`` or ``"assigned"``.
        thread_names: ``{(pid, tid): name}`` from ``thread_name`` metadata events.
        notes: informational lines (clipped overlaps and the like).
        summary: the rank's :class:`pardiag.analyzer.summary.RankSummary` when it was loaded
            from (or with) one, else None.
        windows: ``((start µs, end µs), ...)`` of each profiling window when the rank's events
            come from several files (``schedule(repeat=N)``), else ``()``; the time between
            windows is not the rank's time (the breakdown leaves it out).
        files: every file the rank's events come from (``(path,)`` for one file).
    """

    rank: int
    path: Path
    events: pd.DataFrame = _LazyEvents()
    metadata: dict
    rank_source: str
    thread_names: dict
    notes: tuple[str, ...] = ()
    summary: object = dataclasses.field(default=None, repr=False, compare=False)
    windows: tuple[tuple[float, float], ...] = ()
    files: tuple[Path, ...] = ()

    @property
    def has_gpu(self) -> bool:
        """True when the trace holds GPU kernels (then analyses use the device timeline)."""
        if self.summary is not None and self.__dict__.get("_events") is None:
            return bool(self.summary.has_gpu)
        return bool((self.events["cat"] == "kernel").any())

    @property
    def events_loaded(self) -> bool:
        """False while the raw events of a rank loaded from its summary have not been read."""
        return self.__dict__.get("_events") is not None


@dataclasses.dataclass(frozen=True)
class TraceSet:
    """All ranks of one run.

    Attributes:
        ranks: ``{rank: RankTrace}`` in rank order.
        source: what was loaded (folder or file list), for display.
        warnings: one line per problem met while loading (files skipped, ranks assigned, ...).
        run_info: contents of ``run.json`` when the folder came from ``pardiag profile``.
        rank_meta: ``{rank: metadata}`` from ``rank{R}.meta.json`` sidecars.
        sidecars: other pardiag sidecars by kind and rank: ``{"comms": {rank: doc},
            "pipeline": {rank: doc}, "hang": {rank: doc}}`` (see :mod:`pardiag.layout`).
    """

    ranks: dict[int, RankTrace]
    source: str
    warnings: tuple[str, ...] = ()
    run_info: dict | None = None
    rank_meta: dict[int, dict] = dataclasses.field(default_factory=dict)
    sidecars: dict[str, dict[int, dict]] = dataclasses.field(default_factory=dict)


def _sanitize_json(text: str) -> str:
    """Replace bare inf/nan tokens that are outside JSON strings with ``null``."""
    out: list[str] = []
    # Split on string literals; odd pieces are strings and are kept as they are.
    for i, piece in enumerate(re.split(r'("(?:[^"\\]|\\.)*")', text, flags=re.DOTALL)):
        out.append(piece if i % 2 else _BARE_NONFINITE_RE.sub("null", piece))
    return "".join(out)


def read_trace_bytes(raw: bytes, path: Path) -> tuple[dict, list[str]]:
    """Parse the bytes of one trace file (gzip or plain JSON).

    Like :func:`read_trace_json` but from bytes already read, and also returns what had to be
    repaired (one line each: invalid UTF-8 replaced, bare ``NaN``/``inf`` tokens read as null,
    raw control characters accepted, integers beyond 64 bits read as floats).

    Raises:
        TraceError: truncated or corrupt gzip, empty, not JSON, or not a JSON object.
    """
    return _parse_json(_plain_bytes(raw, path), path)


def _plain_bytes(raw: bytes, path: Path) -> bytes:
    """The file's JSON bytes: gunzipped when gzip, without a UTF-8 byte-order mark.

    Raises:
        TraceError: truncated or corrupt gzip, or nothing but whitespace.
    """
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{path}: truncated or corrupt gzip ({exc})") from None
    if raw[:3] == b"\xef\xbb\xbf":  # UTF-8 byte-order mark
        raw = raw[3:]
    if not raw.strip():
        raise TraceError(f"{path}: empty file")
    return raw


def _parse_json(raw: bytes, path: Path) -> tuple[dict, list[str]]:
    repairs: list[str] = []
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            repairs.append("invalid UTF-8 bytes replaced by U+FFFD")
        clean = _sanitize_json(text)
        if clean != text:
            repairs.append("bare NaN/Infinity tokens read as null")
        try:
            doc = json.loads(clean, strict=False)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise TraceError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}"
                             f" column {exc.colno})" if isinstance(exc, json.JSONDecodeError)
                             else f"{path}: not valid JSON (nested too deeply)") from None
        if not repairs:
            repairs.append("raw control characters inside strings accepted"
                           if re.search(rb"[\x00-\x1f]", raw.replace(b"\n", b"").replace(
                               b"\r", b"").replace(b"\t", b""))
                           else "integers beyond 64 bits read as floats")
    if not isinstance(doc, dict):
        raise TraceError(f"{path}: not a Kineto trace (top level is not a JSON object)")
    return doc, repairs


def read_trace_json(path: Path) -> dict:
    """Read one trace file (``.json`` or ``.json.gz``) into a dict.

    Tries orjson first; on failure retries with bare ``inf``/``nan`` tokens replaced by ``null``,
    raw control characters allowed inside strings and invalid UTF-8 replaced.

    Raises:
        TraceError: the file is unreadable, truncated, not JSON, or not a JSON object.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return read_trace_bytes(raw, path)[0]


def _is_trace_doc(doc: dict) -> bool:
    return isinstance(doc.get("traceEvents"), list)


def _num(v) -> float:
    """Number from an event field; strings that hold numbers are accepted, else NaN."""
    if isinstance(v, bool):
        return float("nan")
    try:
        if isinstance(v, (int, float, str)):
            return float(v)
    except (ValueError, OverflowError):  # "abc", or an integer beyond float range
        pass
    return float("nan")


_INT64_MAX = 2 ** 63 - 1


def _int_or(v, default: int = -1) -> int:
    """Integer from an event field (``"stream 7"`` → 7); ``default`` when there is none or it
    does not fit in 64 bits."""
    if isinstance(v, bool) or v is None:
        return default
    out = default
    if isinstance(v, int):
        out = v
    elif isinstance(v, float) and math.isfinite(v):
        out = int(v)
    elif isinstance(v, str):
        m = _STREAM_TID_RE.search(v)
        if m:
            out = int(m.group(1))
        else:
            try:
                out = int(v)
            except ValueError:
                return default
    return out if -_INT64_MAX <= out <= _INT64_MAX else default


_NUMBER_TYPES = {int, float}


def _float_column(values: list) -> tuple[np.ndarray, int]:
    """float64 array of ``values`` (see :func:`_num`) and how many were numeric strings."""
    types = set(map(type, values))
    if types <= _NUMBER_TYPES:
        try:
            return np.array(values, dtype=np.float64), 0
        except OverflowError:  # an integer beyond float range
            pass
    n_str = sum(1 for v in values if type(v) is str) if str in types else 0
    return np.array([_num(v) for v in values], dtype=np.float64), n_str


def _int_column(values: list) -> np.ndarray:
    """int64 array of ``values`` (see :func:`_int_or`)."""
    if set(map(type, values)) <= {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            pass
    return np.array([_int_or(v) for v in values], dtype=np.int64)


def _str_column(values: list) -> list[str]:
    """``str`` of each value (None → ``""``), equal strings shared (less memory, faster pickle)."""
    types = set(map(type, values))
    if types <= {int, str}:
        table = {v: str(v) for v in set(values)}
        return [table[v] for v in values]
    return [("" if v is None else str(v)) for v in values]


#: Timestamps and durations beyond this (µs; ~3,000 years) are not times; events with them are
#: left out. Epoch µs today are ~1.8e15; epoch ns (a file in the wrong unit) ~1.8e18.
MAX_PLAUSIBLE_US = 1e17


#: Stray timestamps (:func:`stray_timestamps`): gaps shorter than this (µs, one hour) never
#: separate events, so profiler windows of one file minutes apart stay together ...
STRAY_MIN_GAP_US = 3.6e9
#: ... and a gap separates them only when it is also this many times the extent of the events
#: kept so far.
STRAY_GAP_FACTOR = 1000.0


def stray_timestamps(ts: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, str]:
    """Events whose timestamps lie far from the trace's main cluster, and where they were.

    A profile covers seconds to minutes; a few events at ``ts`` 0 (an unset time) or years away
    (another clock, a corrupt value) are not part of it, however many or few they are. The rule:

    1. Sort the start times and cut wherever two consecutive ones are more than
       :data:`STRAY_MIN_GAP_US` (one hour) apart; smaller gaps never cut, so two profiler windows
       of one file seconds or minutes apart stay one cluster.
    2. The main cluster is the one with the most events not at ``ts`` 0 exactly (ties: the
       longer one; a trace whose events are all at 0 keeps them all): a file whose events are
       mostly unset times with a minority at epoch times keeps the minority.
    3. It absorbs a neighbouring cluster while the gap to it is at most
       max(:data:`STRAY_MIN_GAP_US`, :data:`STRAY_GAP_FACTOR` × its own extent so far): only a
       gap far larger than the kept events' own span separates events.
    4. Events that start outside the main cluster, or end more than that same gap after its last
       start (a duration of years), are stray.

    Returns:
        (bool mask over the events, a description of the stray ones: ``"3 at ts 0 µs, 2 at ts
        1700000000000000–1700000000000100 µs"``; empty when there are none).
    """
    n = len(ts)
    none = np.zeros(n, dtype=bool)
    if n == 0:
        return none, ""
    order = np.argsort(ts, kind="stable")
    s = ts[order]
    cuts = np.flatnonzero(np.diff(s) > STRAY_MIN_GAP_US) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [n]])
    counts = ends - starts
    nonzero = np.add.reduceat((s != 0).astype(np.int64), starts)
    weight = nonzero if nonzero.any() else counts
    extent = s[ends - 1] - s[starts]
    main = max(range(len(starts)), key=lambda i: (weight[i], extent[i], -i))
    a = b = main

    def gap_allowed() -> float:
        return max(STRAY_MIN_GAP_US, STRAY_GAP_FACTOR * float(s[ends[b] - 1] - s[starts[a]]))

    grown = True
    while grown:
        grown = False
        if a > 0 and s[starts[a]] - s[ends[a - 1] - 1] <= gap_allowed():
            a, grown = a - 1, True
        if b < len(starts) - 1 and s[starts[b + 1]] - s[ends[b] - 1] <= gap_allowed():
            b, grown = b + 1, True
    lo, hi = float(s[starts[a]]), float(s[ends[b] - 1])
    with np.errstate(invalid="ignore"):
        stray = (ts < lo) | (ts > hi) | (ts + dur > hi + gap_allowed())
    if not stray.any():
        return none, ""
    parts = []
    for i in [*range(a), *range(b + 1, len(starts))]:
        x, y = float(s[starts[i]]), float(s[ends[i] - 1])
        parts.append(f"{counts[i]} at ts {x:.0f} µs" if x == y
                     else f"{counts[i]} at ts {x:.0f}–{y:.0f} µs")
    long = int(stray.sum()) - int(sum(counts[i] for i in [*range(a), *range(b + 1, len(starts))]))
    if long:
        parts.append(f"{long} lasting up to {float(dur[stray].max()):.0f} µs")
    return stray, ", ".join(parts)


def events_frame(raw_events: Iterable, path: Path, display_time_unit: str | None = None
                 ) -> tuple[pd.DataFrame, dict, list[str], list[str]]:
    """Turn raw trace events into the :data:`EVENT_COLUMNS` table.

    Keeps complete events (``ph`` ``X``) and ``[memory]`` instant events; reads thread names.
    ``ts``/``dur`` are µs (Chrome trace format; ``displayTimeUnit`` only sets the display unit),
    except that a file with ``displayTimeUnit: "ns"`` whose timestamps are epoch nanoseconds is
    converted to µs with a warning.

    Args:
        raw_events: the ``traceEvents`` list (dicts; other entries are counted and left out).
        path: the file, for messages.
        display_time_unit: the file's ``displayTimeUnit``.

    Returns:
        (events, thread_names, warnings, notes). Events with a non-finite, negative or
        implausible (> :data:`MAX_PLAUSIBLE_US`) ``ts``/``dur`` and events with stray
        timestamps (``ts`` 0 among epoch times, years away from the rest:
        :func:`stray_timestamps`) are dropped and counted in warnings; numbers written as
        strings are read and counted in a warning.
    """
    raw_events = raw_events if isinstance(raw_events, list) else list(raw_events)
    objs = [e for e in raw_events if type(e) is dict]
    not_objects = len(raw_events) - len(objs)
    thread_names: dict = {}
    for e in objs:
        if e.get("ph") == "M" and e.get("name") == "thread_name" and isinstance(e.get("args"), dict):
            thread_names[(str(e.get("pid")), str(e.get("tid")))] = str(e["args"].get("name", ""))
    keep = [e for e in objs
            if (ph := e.get("ph")) == "X" or (ph == "i" and e.get("name") == "[memory]")]
    phs = [e["ph"] for e in keep]
    return _frame_from_columns(
        path, display_time_unit, thread_names, not_objects,
        names_raw=[e.get("name") for e in keep], cats_raw=[e.get("cat") for e in keep], phs=phs,
        pids_raw=[e.get("pid", "") for e in keep], tid_raw=[e.get("tid", "") for e in keep],
        ts_raw=[e.get("ts") for e in keep],
        dur_raw=[e.get("dur") if ph == "X" else 0.0 for e, ph in zip(keep, phs)],
        no_dur=sum(1 for e, ph in zip(keep, phs) if ph == "X" and "dur" not in e),
        argss=[a if type(a := e.get("args")) is dict else {} for e in keep])


#: Metadata events that name a process (``pardiag merge`` and other tools name each rank's
#: processes ``rank N``).
_PROCESS_META = frozenset({"process_name", "process_labels"})
#: Key under which the parser leaves ``{pid: [process names and labels]}`` in a file's metadata
#: (read by :func:`_split_merged`, removed before the metadata is kept).
PROCESS_NAMES_KEY = "_pardiag_process_names"


def _process_names(objs: list) -> dict[str, list[str]]:
    """``{pid: [process_name / process_labels values]}`` of raw trace events."""
    out: dict[str, list[str]] = {}
    for e in objs:
        if (type(e) is dict and e.get("ph") == "M" and type(e.get("name")) is str
                and e["name"] in _PROCESS_META and isinstance(e.get("args"), dict)):
            a = e["args"]
            out.setdefault(str(e.get("pid")), []).append(str(a.get("name", a.get("labels", ""))))
    return out


class _Event(msgspec.Struct, gc=False):
    """The fields of a trace event that pardiag reads; ``args`` stays undecoded JSON."""

    ph: object = None
    name: object = None
    cat: object = None
    pid: object = msgspec.UNSET
    tid: object = msgspec.UNSET
    ts: object = None
    dur: object = msgspec.UNSET
    args: msgspec.Raw = msgspec.Raw(b"")  # empty: the event has no args


class _LiteArgs(msgspec.Struct, gc=False):
    """The args the event table reads from events whose other args it does not keep."""

    stream: object = msgspec.UNSET
    correlation: object = msgspec.UNSET
    sycl_queue: object = msgspec.field(default=msgspec.UNSET, name="sycl queue")

    def get(self, key: str, default=None):
        v = getattr(self, key.replace(" ", "_"), msgspec.UNSET)
        return default if v is msgspec.UNSET else v


_TOP_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])
_LITE_DECODER = msgspec.json.Decoder(_LiteArgs)
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
_ANY_DECODER = msgspec.json.Decoder()
#: Categories whose args are read (stream, correlation) whatever the event's name.
_ARGS_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver",
                        "Kernel", "Memcpy", "Memset", "Runtime", "Driver", "xpu_runtime",
                        "xpu_driver", "mtia_runtime", "privateuse1_runtime", "privateuse1_driver",
                        "hpu_runtime"})


def parse_trace_fast(raw: bytes | list, path: Path, display_time_unit_default=None
                     ) -> tuple[dict, tuple] | None:
    """Strict-JSON fast path of reading a trace: the document's metadata and the
    :func:`events_frame` result, decoding only the event fields pardiag uses (msgspec; each
    event's ``args`` is decoded only where it is read). ``raw`` is the decompressed file, or a
    one-item list holding it: then the list is emptied on success so the bytes can be freed before
    the table is built (and left as it was when None is returned).

    Returns:
        ``(metadata, (events, thread_names, warnings, notes))``, or None when the file is not a
        strict-JSON object with a ``traceEvents`` list of objects (then the caller takes the
        tolerant path, :func:`read_trace_bytes` + :func:`events_frame`, which gives the same
        table or the right error).
    """
    holder = raw if isinstance(raw, list) else None
    raw = holder[0] if holder is not None else raw
    try:
        top = _TOP_DECODER.decode(raw)
        if "traceEvents" not in top:
            return None
        meta = {k: _ANY_DECODER.decode(v) for k, v in top.items() if k != "traceEvents"}
        evs = _EVENTS_DECODER.decode(top["traceEvents"])
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError, RecursionError):
        return None
    del top
    if holder is not None:
        holder.clear()  # the events' raw args still refer to the bytes until ``keep`` goes
    del raw
    thread_names: dict = {}
    process_names: dict[str, list[str]] = {}
    keep = []
    for e in evs:
        ph = e.ph
        if ph == "X" or (ph == "i" and e.name == "[memory]"):
            keep.append(e)
        elif ph == "M" and e.name == "thread_name" and len(e.args):
            a = _ANY_DECODER.decode(e.args)
            if isinstance(a, dict):
                pid = None if e.pid is msgspec.UNSET else e.pid
                tid = None if e.tid is msgspec.UNSET else e.tid
                thread_names[(str(pid), str(tid))] = str(a.get("name", ""))
        elif ph == "M" and type(e.name) is str and e.name in _PROCESS_META and len(e.args):
            a = _ANY_DECODER.decode(e.args)
            if isinstance(a, dict):
                pid = None if e.pid is msgspec.UNSET else e.pid
                process_names.setdefault(str(pid), []).append(
                    str(a.get("name", a.get("labels", ""))))
    del evs  # metadata and flow events: not needed any more
    names_raw = [e.name for e in keep]
    keep_name = {}
    for n in set(names_raw) if all(type(n) is str for n in names_raw) else ():
        keep_name[n] = bool(_KEEP_ARGS_RE.search(n))
    argss = []
    for e, n in zip(keep, names_raw):
        b = bytes(e.args)
        if len(b) <= 2:
            argss.append({})
            continue
        if type(e.cat) is not str or (keep_name.get(n, True) if type(n) is str else True):
            a = _ANY_DECODER.decode(b)  # args kept whole (communication, memory), or odd input
            argss.append(a if type(a) is dict else {})
        elif e.cat in _ARGS_CATS or b'"correlation"' in b or b'"stream"' in b or b'"sycl queue"' in b:
            try:
                argss.append(_LITE_DECODER.decode(b))
            except msgspec.ValidationError:  # args that are not an object
                argss.append({})
        else:
            argss.append({})
    phs = [e.ph for e in keep]
    unit = meta.get("displayTimeUnit", display_time_unit_default)
    cols = dict(
        names_raw=names_raw, cats_raw=[e.cat for e in keep], phs=phs,
        pids_raw=[("" if (p := e.pid) is msgspec.UNSET else p) for e in keep],
        tid_raw=[("" if (t := e.tid) is msgspec.UNSET else t) for e in keep],
        ts_raw=[e.ts for e in keep],
        dur_raw=[e.dur if ph == "X" else 0.0 for e, ph in zip(keep, phs)],
        no_dur=sum(1 for e, ph in zip(keep, phs) if ph == "X" and e.dur is msgspec.UNSET),
        argss=argss)
    del keep  # the structs, and with them the file's bytes
    if process_names:
        meta[PROCESS_NAMES_KEY] = process_names
    return meta, _frame_from_columns(path, unit, thread_names, 0, **cols)


def _normalize_cats(cats_raw: list) -> list[str]:
    cat_table: dict = {}
    cats = []
    for c in cats_raw:
        try:
            cats.append(cat_table[c])
        except (KeyError, TypeError):
            low = str(c or "").lower()
            norm = _CAT_ALIASES.get(low, low)
            try:
                cat_table[c] = norm
            except TypeError:  # unhashable
                pass
            cats.append(norm)
    return cats


def _frame_from_columns(path, display_time_unit, thread_names, not_objects, *, names_raw,
                        cats_raw, phs, pids_raw, tid_raw, ts_raw, dur_raw, no_dur, argss):
    """:func:`events_frame` from the raw field values of the kept events (one list per field;
    ``argss`` holds dicts, ``{}`` where an event has none)."""
    names = _str_column(names_raw)
    cats = _normalize_cats(cats_raw)
    pids = _str_column(pids_raw)
    tids = _str_column(tid_raw)
    ts, ts_str = _float_column(ts_raw)
    dur, dur_str = _float_column(dur_raw)
    is_gpu = [c in GPU_CATS for c in cats]
    # the stream (CUDA/HIP), else the SYCL queue (Intel XPU), else an integer tid
    streams = _int_column([(a.get("stream", a.get("sycl queue", t if type(t) is int else None))
                            if g else -1) for a, g, t in zip(argss, is_gpu, tid_raw)])
    if any(is_gpu):
        # "stream 7" tids of the legacy format, where args carry no stream
        bad = [i for i, (g, s) in enumerate(zip(is_gpu, streams)) if g and s == -1]
        for i in bad:
            streams[i] = _int_or(argss[i].get("stream"), _int_or(tid_raw[i]))
    corrs = _int_column([a.get("correlation", -1) for a in argss])
    keep_args = {n: bool(_KEEP_ARGS_RE.search(n)) for n in set(names)}
    kept_args = [a if (a and keep_args[n]) else None for a, n in zip(argss, names)]

    df = pd.DataFrame({
        "name": pd.Series(names, dtype=object), "cat": pd.Series(cats, dtype=object),
        "ph": pd.Series(phs, dtype=object), "pid": pd.Series(pids, dtype=object),
        "tid": pd.Series(tids, dtype=object),
        "ts": ts, "dur": dur, "stream": streams, "correlation": corrs,
        "args": pd.Series(kept_args, dtype=object),
    })
    warnings: list[str] = []
    notes: list[str] = []
    if not_objects:
        warnings.append(f"{path}: left out {not_objects} traceEvents entries that are not objects")
    if ts_str or dur_str:
        warnings.append(f"{path}: {ts_str + dur_str} ts/dur values are strings; read as numbers"
                        f" where they hold one")
    if len(df) and str(display_time_unit).lower() == "ns":
        finite = ts[np.isfinite(ts)]
        if len(finite) and float(np.median(finite)) > MAX_PLAUSIBLE_US:
            df["ts"] = df["ts"] / 1000.0
            df["dur"] = df["dur"] / 1000.0
            warnings.append(f"{path}: displayTimeUnit is \"ns\" and timestamps are epoch "
                            f"nanoseconds; read ts/dur as ns and converted to µs")
    tsv, durv = df["ts"].to_numpy(), df["dur"].to_numpy()
    with np.errstate(invalid="ignore"):
        bad = (~np.isfinite(tsv) | ~np.isfinite(durv) | (durv < 0) | (tsv < 0)
               | (tsv > MAX_PLAUSIBLE_US) | (durv > MAX_PLAUSIBLE_US))
    if bad.any():
        warnings.append(f"{path}: left out {int(bad.sum())} events with a missing, non-numeric, "
                        f"non-finite, negative or implausibly large ts/dur"
                        + (f" ({no_dur} without dur)" if no_dur else ""))
        df = df[~bad]
    if len(df):
        stray, where = stray_timestamps(df["ts"].to_numpy(), df["dur"].to_numpy())
        if stray.any():
            kept = df["ts"].to_numpy()[~stray]
            rest = (f"far from the other {len(kept)} (ts {kept.min():.0f}–{kept.max():.0f} µs)"
                    if len(kept) else "no other events")
            warnings.append(f"{path}: left out {int(stray.sum())} events with stray timestamps "
                            f"({where}), {rest}")
            df = df[~stray]
    df = df.sort_values("ts", kind="stable").reset_index(drop=True)
    df, clip_note = _clip_same_stream(df)
    if clip_note:
        notes.append(f"{path}: {clip_note}")
    return df, thread_names, warnings, notes


def _clip_same_stream(df: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """Clip GPU events whose recorded end passes the start of the next event on their stream.

    A stream runs one kernel (or copy) at a time, so such an event ends where the next one
    starts: its ``dur`` shrinks to ``next ts − ts`` (never below 0). Overlaps of a few ns are
    timestamp noise; larger ones (a kernel "inside" another) are clipped the same way and the
    note gives the largest clip.
    """
    gpu = df["cat"].isin(GPU_CATS).to_numpy()
    if not gpu.any():
        return df, None
    sub = df.loc[gpu, ["pid", "stream", "ts", "dur"]]  # df is sorted by ts
    keys = [sub["pid"], sub["stream"]]
    next_start = sub["ts"].groupby(keys, sort=False).shift(-1)
    end = sub["ts"] + sub["dur"]
    over = (end > next_start).fillna(False).to_numpy()
    if not over.any():
        return df, None
    idx = sub.index[over]
    new_dur = np.maximum(0.0, next_start[over].to_numpy() - sub.loc[idx, "ts"].to_numpy())
    max_clip = float(np.max(sub.loc[idx, "dur"].to_numpy() - new_dur))
    df = df.copy()
    df.loc[idx, "dur"] = new_dur
    return df, f"clipped {len(idx)} same-stream GPU events that ran past the next one's start " \
               f"(by up to {max_clip:.3f} µs)"


def _trace_files(paths: list[Path]) -> tuple[list[Path], list[Path], str, list[str]]:
    """Expand folders into candidate files; returns (candidates, sidecars, source label, info
    lines). Trace files named one by one use the pardiag sidecars (``run.json``,
    ``rank{R}.*.json``) of the one folder they share; files from several folders use none, and
    an info line says which happened."""
    files: list[Path] = []
    sidecars: list[Path] = []
    seen: set[Path] = set()
    named_dirs: set[Path] = set()
    given_dirs: set[Path] = set()
    for p in paths:
        if p.is_dir():
            given_dirs.add(p.resolve())
            for f in sorted(p.iterdir()):
                if not f.is_file():
                    continue
                if layout.is_sidecar_name(f.name):
                    sidecars.append(f)
                elif f.name.endswith((".json", ".json.gz")) and f.resolve() not in seen:
                    seen.add(f.resolve())
                    files.append(f)
        elif p.is_file():
            if layout.is_sidecar_name(p.name):
                sidecars.append(p)
                continue
            if p.resolve() not in seen:  # the same file named twice is one rank
                seen.add(p.resolve())
                files.append(p)
                named_dirs.add(p.resolve().parent)
        else:
            raise TraceError(f"{p}: no such file or folder")
    info: list[str] = []
    beside = [d for d in named_dirs - given_dirs
              if any(layout.is_sidecar_name(f.name) for f in d.iterdir() if f.is_file())]
    if len(named_dirs) == 1 and beside:
        d = beside[0]
        extra = sorted(f for f in d.iterdir() if f.is_file() and layout.is_sidecar_name(f.name))
        sidecars.extend(f for f in extra if f not in sidecars)
        info.append(f"{d}: using the pardiag run's run.json and sidecars beside the named trace "
                    f"files")
    elif beside:
        info.append(f"the named trace files come from {len(named_dirs)} folders: their pardiag "
                    f"sidecars (run.json, rank*.meta/comms/pipeline.json) are not used")
    source = str(paths[0]) if len(paths) == 1 else f"{len(paths)} paths"
    return files, sidecars, source, info


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


#: Required keys of the list entries of each sidecar kind, and the keys that must be numbers.
_SIDECAR_LISTS = {
    "comms": (("records", ("op", "pg_name", "seq"), ("seq",)),
              ("process_groups", ("name", "ranks"), ())),
    "pipeline": (("records", ("stage", "microbatch", "phase", "start_us", "end_us",
                              "optimizer_step"),
                  ("stage", "microbatch", "start_us", "end_us", "optimizer_step")),),
}


def _check_sidecar(path: Path, doc: dict, warnings: list[str]) -> dict | None:
    """Keep the well-formed entries of a comms/pipeline sidecar; warn about the rest."""
    spec = _SIDECAR_LISTS.get(doc.get("kind"))
    if spec is None:
        return doc
    doc = dict(doc)
    for key, required, numeric in spec:
        items = doc.get(key)
        if not isinstance(items, list):
            warnings.append(f"{path}: '{key}' is not a list; the file is ignored")
            return None
        good = [e for e in items if isinstance(e, dict) and all(k in e for k in required)
                and all(_is_num(e[k]) for k in numeric)
                and all(e.get(k) is None or _is_num(e.get(k))
                        for k in ("start_us", "end_us", "issue_us", "bytes"))]
        if len(good) < len(items):
            warnings.append(f"{path}: left out {len(items) - len(good)} malformed '{key}' entries")
        doc[key] = good
    return doc


def _read_sidecars(sidecars: list[Path], warnings: list[str]
                   ) -> tuple[dict | None, dict[int, dict], dict[str, dict[int, dict]]]:
    run_info = None
    rank_meta: dict[int, dict] = {}
    others: dict[str, dict[int, dict]] = {}
    for f in sidecars:
        try:
            doc = orjson.loads(f.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            warnings.append(f"{f}: unreadable pardiag sidecar, ignored ({exc})")
            continue
        if not isinstance(doc, dict) or doc.get("schema") != layout.SIDECAR_SCHEMA:
            warnings.append(f"{f}: not a pardiag sidecar, ignored")
            continue
        if doc.get("kind") == "run":
            run_info = doc
        elif doc.get("kind") == "rank" and isinstance(doc.get("rank"), int):
            rank_meta[doc["rank"]] = doc
        elif isinstance(doc.get("kind"), str) and isinstance(doc.get("rank"), int):
            checked = _check_sidecar(f, doc, warnings)
            if checked is not None:
                others.setdefault(doc["kind"], {})[doc["rank"]] = checked
        else:
            warnings.append(f"{f}: pardiag sidecar without a known kind and rank, ignored")
    for kind in ("comms", "pipeline"):
        have = set(others.get(kind, {}))
        if have and rank_meta and set(rank_meta) - have:
            warnings.append(f"no usable {kind} records for rank(s) {sorted(set(rank_meta) - have)}"
                            f" (other ranks have them)")
    return run_info, rank_meta, others


def _run_warnings(run_info: dict | None, rank_meta: dict[int, dict], ranks: set[int]) -> list[str]:
    """What ``run.json`` and the rank metadata say went wrong in a ``pardiag profile`` run."""
    out: list[str] = []
    if run_info:
        if run_info.get("exit_code"):
            out.append(f"the profiled run exited with code {run_info['exit_code']}")
        for r, msg in sorted((run_info.get("failed_ranks") or {}).items()):
            out.append(f"rank {r} failed during the profiled run: {msg}")
        for r in run_info.get("missing_ranks") or []:
            out.append(f"rank {r} did not finish the profiled run")
        for line in run_info.get("hang") or []:
            out.append(f"the profiled run hung and was stopped: {line}")
        ws = run_info.get("world_size")
        if isinstance(ws, int) and ws > 0:
            absent = sorted(set(range(ws)) - ranks)
            if absent:
                out.append(f"run.json says world size {ws}; no trace for rank(s) {absent}")
    return out


def _time_range(p: _Parsed) -> tuple[float, float]:
    """(first start, last end) of a parsed file's events (µs); NaN when it has none."""
    if p.events is not None:
        if not len(p.events):
            return math.nan, math.nan
        ts = p.events["ts"].to_numpy()
        return float(ts.min()), float((ts + p.events["dur"].to_numpy()).max())
    parts = getattr(p.summary, "parts", None)
    if parts is not None and parts.hi > parts.lo:
        return float(parts.lo), float(parts.hi)
    return math.nan, math.nan


def _join_windows(parts: list[_Parsed]) -> _Parsed:
    """One rank from the files of its profiling windows: their events in one table (read again
    where only a summary was kept; correlation ids of later windows shifted past the earlier
    ones', since every window numbers them from the start), thread names together, the first
    file's metadata; no summary (the analyses work from the events)."""
    frames = []
    names: dict = {}
    for p in parts:
        ev = p.events
        if ev is None:
            again = _parse_file(p.path)
            if again.error is not None:
                raise TraceError(again.error)
            ev = again.events if not again.pieces else next(
                q.events for q in again.pieces if q.rank_hint == p.rank_hint)
        if frames:  # correlation ids restart in every window: keep them apart
            base = max(int(f["correlation"].max()) for f in frames) + 1
            ev = ev.assign(correlation=np.where(ev["correlation"] >= 0, ev["correlation"] + base,
                                                ev["correlation"]))
        frames.append(ev)
        names.update(p.thread_names or {})
    events = pd.concat(frames, ignore_index=True).sort_values("ts", kind="stable").reset_index(
        drop=True)
    first = parts[0]
    notes = tuple(n for p in parts for n in p.notes)
    return _Parsed(first.path, metadata=first.metadata, events=events, thread_names=names,
                   notes=notes, has_steps=any(p.has_steps for p in parts))


def _world_size_warnings(rank_docs: list[tuple[int, dict]], run_info: dict | None = None
                         ) -> list[str]:
    """One warning when the traces' ``distributedInfo.world_size`` values disagree, or a rank
    number is not below the world size the traces state; and one when fewer ranks than that
    world size are present (``2 of 128 ranks present``; not repeated for pardiag runs, whose
    ``run.json`` check names the absent ranks)."""
    sizes: dict[int, list[int]] = {}
    for r, doc in rank_docs:
        info = doc.get("distributedInfo")
        ws = info.get("world_size") if isinstance(info, dict) else None
        if isinstance(ws, int) and not isinstance(ws, bool):
            sizes.setdefault(ws, []).append(r)
    if len(sizes) > 1:
        desc = "; ".join(f"{ws} for rank(s) {rs[:8]}{'...' if len(rs) > 8 else ''}"
                         for ws, rs in sorted(sizes.items()))
        return [f"the traces disagree on the world size ({desc}): are they from one run?"]
    if sizes:
        ws = next(iter(sizes))
        over = sorted(r for r, _ in rank_docs if r >= ws)
        if over:
            return [f"rank(s) {over[:8]} are not below the world size {ws} the traces state"]
        have = {r for r, _ in rank_docs}
        if len(have) < ws and not (run_info and run_info.get("world_size")):
            absent = sorted(set(range(ws)) - have)
            return [f"{len(have)} of {ws} ranks present (the traces state world size {ws}; no "
                    f"trace for rank(s) {absent[:8]}{'...' if len(absent) > 8 else ''}): "
                    f"collectives that include absent ranks are partial, and no straggler or "
                    f"clock offset is drawn from them"]
    return []


@dataclasses.dataclass
class _Parsed:
    """What one worker learned from one file."""

    path: Path
    error: str | None = None
    not_trace: bool = False
    #: a ``pardiag report --json`` output (not a trace; skipped without a warning)
    own_report: bool = False
    repairs: tuple[str, ...] = ()
    metadata: dict | None = None
    events: pd.DataFrame | None = None
    thread_names: dict | None = None
    ev_warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    has_steps: bool = False
    summary: object = None
    #: the rank this part of a merged multi-rank file holds (see :func:`_split_merged`)
    rank_hint: int | None = None
    #: a merged multi-rank file: its ranks' parts (then this entry holds no events itself)
    pieces: list = dataclasses.field(default_factory=list)


def _has_step_names(events: pd.DataFrame) -> bool:
    return bool(events["name"].str.startswith("ProfilerStep").any()) if len(events) else False


def _parse_file(path: Path, summarize: bool = False, patterns: tuple[str, ...] = (),
                cache: bool = False, keep_events: bool = True) -> _Parsed:
    """Read, parse and (with ``summarize``) summarize one file; never raises for bad input."""
    try:
        try:
            st = os.stat(path)
            raw = path.read_bytes()
        except OSError as exc:
            raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
        holder = [_plain_bytes(raw, path)]
        del raw
        fast = parse_trace_fast(holder, path)  # empties the holder when it succeeds
        if fast is not None:
            repairs: list[str] = []
            meta, (events, thread_names, ev_warnings, notes) = fast
        else:
            doc, repairs = _parse_json(holder.pop(), path)
    except TraceError as exc:
        return _Parsed(path, error=str(exc))
    if fast is None:
        if not _is_trace_doc(doc):
            return _Parsed(path, not_trace=True, own_report=isinstance(doc, dict) and all(
                k in doc for k in ("schema_version", "source", "ranks")))
        meta = {k: v for k, v in doc.items() if k != "traceEvents"}
        if isinstance(doc["traceEvents"], list):
            pnames = _process_names(doc["traceEvents"])
            if pnames:
                meta[PROCESS_NAMES_KEY] = pnames
        events, thread_names, ev_warnings, notes = events_frame(doc["traceEvents"], path,
                                                                doc.get("displayTimeUnit"))
        del doc
    pnames = meta.pop(PROCESS_NAMES_KEY, {})
    split = _split_merged(path, events, thread_names, meta, pnames)
    if split is not None:
        pieces, split_warnings = split
        for piece in pieces:
            piece.repairs = tuple(repairs)
            piece.ev_warnings = tuple(ev_warnings) + tuple(split_warnings)
            piece.notes = tuple(notes)
            if summarize:  # no stored summary: one file, several ranks
                _summarize_into(piece, patterns, repairs, st, cache=False, keep_events=True)
        return _Parsed(path, metadata=meta, pieces=pieces)
    out = _Parsed(path, repairs=tuple(repairs), metadata=meta, events=events,
                  thread_names=thread_names, ev_warnings=tuple(ev_warnings), notes=tuple(notes),
                  has_steps=_has_step_names(events))
    if summarize:
        _summarize_into(out, patterns, repairs, st, cache=cache, keep_events=keep_events)
    return out


def _summarize_into(out: _Parsed, patterns, repairs, st, *, cache: bool, keep_events: bool) -> None:
    from pardiag.analyzer import summary as sm

    trace = RankTrace(rank=-1, path=out.path, events=out.events, metadata=out.metadata,
                      rank_source="", thread_names=out.thread_names, notes=tuple(out.notes))
    out.summary = sm.summarize_trace(trace, [re.compile(p) for p in patterns],
                                     warnings=out.ev_warnings, repairs=repairs,
                                     has_steps=out.has_steps, stat=st)
    if cache:
        sm.write_summary(out.summary, out.path)
    if not keep_events:
        out.events = None


def _split_merged(path: Path, events: pd.DataFrame, thread_names: dict, meta: dict,
                  process_names: dict[str, list[str]]) -> tuple[list[_Parsed], list[str]] | None:
    """The ranks of a merged multi-rank file (``pardiag merge`` output, or another tool's merge
    whose processes are named ``rank N``), one :class:`_Parsed` each with the events of its
    processes and ``distributedInfo.rank`` set to it; None for a single-rank file. Events of
    processes that belong to no rank are left out (a warning says how many)."""
    pids = sorted(set(events["pid"].tolist())) if len(events) else []
    mapping = merged_rank_of_pids(process_names, pids, "pardiagMerge" in meta)
    if mapping is None:
        return None
    rank_of = events["pid"].map(mapping)
    warnings = []
    stray = int(rank_of.isna().sum())
    if stray:
        warnings.append(f"{path}: left out {stray} events of processes that belong to no rank of "
                        f"this merged file")
    pieces = []
    for r in sorted(set(mapping.values())):
        ev = events[(rank_of == r).to_numpy()].reset_index(drop=True)
        if ev.empty:
            continue
        mine = {p for p, rr in mapping.items() if rr == r}
        info = dict(meta.get("distributedInfo") or {}) if isinstance(
            meta.get("distributedInfo"), dict) else {}
        info["rank"] = r
        pieces.append(_Parsed(path, metadata={**meta, "distributedInfo": info}, events=ev,
                              thread_names={k: v for k, v in thread_names.items() if k[0] in mine},
                              has_steps=_has_step_names(ev), rank_hint=r))
    return pieces, warnings


def _from_summary(path: Path, s) -> _Parsed:
    return _Parsed(path, repairs=s.repairs, metadata=s.metadata, events=None,
                   thread_names=s.thread_names, ev_warnings=s.relocated(path)[0],
                   notes=s.relocated(path)[1], has_steps=s.has_steps, summary=s)


#: Below this many bytes of input, files are parsed in this process (workers cost ~0.1 s).
PARALLEL_MIN_BYTES = 8_000_000


def default_workers(files: list[Path]) -> int:
    """Worker processes for parsing ``files``: one per CPU core (at most one per file), or 1
    (this process) when the input is small."""
    try:
        total = sum(f.stat().st_size for f in files)
    except OSError:
        total = 0
    if len(files) < 2 or total < PARALLEL_MIN_BYTES:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(len(files), cpus or 1))


def _parse_all(files: list[Path], workers: int, progress, **kw) -> list[_Parsed]:
    """:func:`_parse_file` for every file, in ``workers`` processes; results in file order.
    ``progress(done, total)`` is called from this process after each file."""
    total = len(files)
    if workers <= 1 or total <= 1:
        out = []
        for i, f in enumerate(files):
            out.append(_parse_file(f, **kw))
            if progress:
                progress(i + 1, total)
        return out
    import concurrent.futures as cf
    import multiprocessing as mp

    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
    if ctx is not None:
        import gc

        gc.freeze()  # forked workers: the collector does not touch (and so copy) parent pages
    results: dict[int, _Parsed] = {}
    try:
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futs = {pool.submit(_parse_file, f, **kw): i for i, f in enumerate(files)}
            for fut in cf.as_completed(futs):
                results[futs[fut]] = fut.result()
                if progress:
                    progress(len(results), total)
    except cf.process.BrokenProcessPool:
        raise PardiagError(f"a process parsing {len(files)} trace file(s) died (out of memory?); "
                           f"try fewer workers (--workers 1)", exit_code=1) from None
    finally:
        if ctx is not None:
            import gc

            gc.unfreeze()
    return [results[i] for i in range(total)]


def load_traces(paths: Path | str | Iterable[Path | str], *, summarize: bool = False,
                comm_patterns: Iterable[re.Pattern] = (), cache: bool = False,
                workers: int | None = None, progress=None) -> TraceSet:
    """Load a run folder, a folder of Kineto traces, or a list of trace files.

    Files in a folder that are not traces (other JSON, pardiag sidecars) are skipped; unreadable
    trace files are skipped with a warning as long as one readable trace remains.

    Args:
        paths: folders and/or files.
        summarize: also compute each rank's :class:`~pardiag.analyzer.summary.RankSummary`
            (with ``comm_patterns``) in the worker that parses it, and keep only the summary of
            ranks parsed in other processes (their ``events`` are read again on first access).
            The analyses then work from the summaries.
        comm_patterns: compiled ``--comm-kernel`` patterns for the summaries.
        cache: with ``summarize``: use stored summaries that are current (same file size,
            modification time and patterns) instead of parsing, and store new ones (see
            :mod:`pardiag.analyzer.summary` for where).
        workers: processes that parse files in parallel (default :func:`default_workers`).
        progress: ``progress(done, total)`` after each file (for a progress bar).

    Returns:
        TraceSet with one RankTrace per file.

    Raises:
        TraceError: a path does not exist, no trace file is found, or none can be read. An
            explicitly named file that cannot be read is an error too.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = [Path(p) for p in paths]
    if not paths:
        raise TraceError("no input given")
    files, sidecars, source, info = _trace_files(paths)
    explicit = {p for p in paths if p.is_file()}
    warnings: list[str] = list(info)
    run_info, rank_meta, others = _read_sidecars(sidecars, warnings)
    if not files:
        hint = ""
        sub = sorted({f.parent for p in paths if p.is_dir()
                      for f in p.glob("*/*.json*") if f.name.endswith((".json", ".json.gz"))
                      and f.parent.name != ".pardiag-cache"})
        if sub:
            hint = f"; subfolders hold some: {', '.join(str(d) for d in sub[:3])}"
        elif run_info is not None and run_info.get("hang"):
            hint = ("; the profiled run hung and was stopped before a trace was written: "
                    + run_info["hang"][0])
        elif run_info is not None or rank_meta:
            steps = {r: m.get("optimizer_steps") for r, m in sorted(rank_meta.items())}
            hint = (f"; this pardiag run wrote no trace (optimizer steps per rank: {steps};"
                    f" profile with more steps or --wait 0 --warmup 0)")
        raise TraceError(f"{source}: no trace files (*.json, *.json.gz) found{hint}")

    patterns = list(comm_patterns)
    parsed: dict[Path, _Parsed] = {}
    if summarize and cache:
        from pardiag.analyzer import summary as sm

        for f in files:
            try:
                s = sm.find_summary(f, patterns)
            except OSError:
                s = None
            if s is not None:
                parsed[f] = _from_summary(f, s)
    todo = [f for f in files if f not in parsed]
    n_workers = default_workers(todo) if workers is None else workers
    done0 = len(parsed)

    def step(done: int, total: int) -> None:
        if progress:
            progress(done0 + done, len(files))

    if progress and done0:
        progress(done0, len(files))
    kw = dict(summarize=summarize, cache=cache,
              patterns=tuple(p.pattern if isinstance(p, re.Pattern) else str(p) for p in patterns),
              keep_events=not summarize or n_workers <= 1)
    for p in _parse_all(todo, n_workers, step, **kw):
        parsed[p.path] = p

    docs: list[_Parsed] = []
    for f in files:
        p = parsed[f]
        if p.error is not None:
            if f in explicit:
                raise TraceError(p.error)
            warnings.append(f"{p.error} - skipped")
            continue
        if p.not_trace:
            what = "a pardiag report's JSON" if p.own_report else "no traceEvents list"
            if f in explicit:
                raise TraceError(f"{f}: not a Kineto trace ({what})")
            if not p.own_report:   # `report --json` written into the run folder: no warning
                warnings.append(f"{f}: not a Kineto trace ({what}) - skipped")
            continue
        if p.repairs:
            warnings.append(f"{f}: not strict JSON; read with repairs ({'; '.join(p.repairs)})")
        docs.append(p)
    if not docs:
        first = warnings[-1].removesuffix(" - skipped") if warnings else ""
        raise TraceError(f"{source}: none of {len(files)} file(s) is a readable Kineto trace"
                         f" (e.g. {first})")

    # Ranks: a pure function of what each file (or merged file's part) says (analyzer.ranks).
    units: list[_Parsed] = [q for p in docs for q in (p.pieces or [p])]
    facts = []
    for i, p in enumerate(units):
        info = p.metadata.get("distributedInfo")
        lo, hi = _time_range(p)
        facts.append(FileFacts(key=i, path=p.path, dist_rank=info.get("rank") if isinstance(
            info, dict) else None, start_us=lo, end_us=hi, rank_hint=p.rank_hint))
    assignment, rank_warnings = assign_ranks(facts)
    warnings.extend(rank_warnings)
    if any(p.pieces for p in docs):
        for p in docs:
            if p.pieces:
                warnings.append(f"{p.path}: holds {len(p.pieces)} ranks (a merged trace); split "
                                f"into rank(s) {[q.rank_hint for q in p.pieces]}")

    present = {a.rank for a in assignment}
    warnings.extend(_run_warnings(run_info, rank_meta, present))
    warnings.extend(_world_size_warnings([(a.rank, units[a.keys[0]].metadata) for a in assignment],
                                         run_info))
    ranks: dict[int, RankTrace] = {}
    for a in assignment:
        r, how = a.rank, a.source
        parts = [units[k] for k in a.keys]
        for p in parts:
            warnings.extend(p.ev_warnings)
        p = parts[0] if len(parts) == 1 else _join_windows(parts)
        f = p.path
        n_events = len(p.events) if p.events is not None else p.summary.n_events
        if n_events == 0:
            warnings.append(f"{f}: rank {r} has no timed events")
        elif not p.has_steps:
            warnings.append(f"{f}: no ProfilerStep#N annotations; per-step results are empty for "
                            f"rank {r}")
        s = p.summary
        if s is not None:
            s = dataclasses.replace(s, comm=s.comm.assign(rank=r) if len(s.comm) else s.comm)
        windows = tuple(_time_range(q) for q in parts) if len(parts) > 1 else ()
        ranks[r] = RankTrace(rank=r, path=f, events=p.events, metadata=p.metadata,
                             rank_source=how, thread_names=p.thread_names, notes=tuple(p.notes),
                             summary=s, windows=windows, files=tuple(q.path for q in parts))
    return TraceSet(ranks=ranks, source=source, warnings=tuple(warnings), run_info=run_info,
                    rank_meta=rank_meta, sidecars=others)
