"""Parse one Kineto (PyTorch profiler) Chrome-trace file into the event table.

Bytes in (``.json`` or gzipped), :data:`pardiag.analyzer.trace.traceset.EVENT_COLUMNS` table out,
with the dialects seen in the field (FACTS §2):

* newest format: ``ts`` relative to ``baseTimeNanoseconds``, fractional µs;
* legacy format: categories ``Kernel``/``Operator``/``Runtime``/``Memcpy``/``Memset`` and ``tid``
  strings such as ``"stream 7"``; other accelerators' runtime categories (``xpu_runtime``, ...);
* bare ``inf``/``-inf``/``nan``/``NaN``/``Infinity`` tokens and raw control characters in strings;
* stray timestamps: events at ``ts`` 0 among epoch timestamps, or years away from the rest of
  the file, however many (left out, one warning per file that says how many and where:
  :func:`stray_timestamps`);
* kernels on one stream that overlap (the earlier one is clipped to end where the next starts:
  a stream runs one kernel at a time; counted in a note).

Strict-JSON files are decoded with msgspec into only the fields pardiag reads, a slice of
events at a time (:func:`parse_trace_fast`); anything else takes the tolerant orjson/json path
(:func:`read_trace_bytes` + :func:`events_frame`), which builds the same table. No file system
access except :func:`read_trace_json`; no analysis.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import math
import operator
import re
import zlib
from collections.abc import Iterable
from pathlib import Path

import msgspec
import numpy as np
import orjson
import pandas as pd

from pardiag.errors import TraceError

from . import vocab
from .traceset import GPU_CATS, isin_mask

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

#: Events whose raw args are kept (communication metadata, memory counters).
_KEEP_ARGS_RE = re.compile(
    r"^(gloo:|nccl:|c10d::|_c10d_functional::|c10d_functional::|record_param_comms|\[memory\])"
    r"|nccl|rccl|hccl", re.IGNORECASE)

_STREAM_TID_RE = re.compile(r"stream\s*(\d+)", re.IGNORECASE)
# Bare non-JSON number tokens, outside strings (see _sanitize_json).
_BARE_NONFINITE_RE = re.compile(r'(-?)\b(inf|infinity|nan)\b', re.IGNORECASE)


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
    raw control characters accepted, unpaired surrogate escapes kept, numbers beyond the float
    range read as infinity).

    Raises:
        TraceError: truncated or corrupt gzip, empty, not JSON, or not a JSON object.
    """
    return parse_json(plain_bytes(raw, path), path)


try:  # Intel's ISA-L inflates gzip about twice as fast as zlib (same bytes out, CRC checked)
    from isal import igzip as _igzip
    from isal import isal_zlib as _inflater

    _gunzip_members = _igzip.decompress
    _GUNZIP_ERRORS: tuple = (_inflater.error,)
except ImportError:  # a platform without its wheel
    _inflater = zlib
    _gunzip_members = gzip.decompress
    _GUNZIP_ERRORS = ()


def _gunzip(raw: bytes) -> bytes:
    """The inflated bytes of a gzip file: a file of one member in one pass (the usual case),
    anything else (several members, zero padding, a truncated or corrupt file) by the gzip
    module's reading, which gives the bytes or the error.

    Raises:
        ValueError: bytes after the compressed data that are not another member (named as
            such: the gzip module's own error for them speaks of a truncated file); the gzip
            module's and ISA-L's errors.
    """
    inflater = _inflater.decompressobj(wbits=31)  # 31: a gzip header and trailer (CRC, size)
    try:
        out = inflater.decompress(raw)
    except (zlib.error, *_GUNZIP_ERRORS):
        return _gunzip_members(raw)
    rest = inflater.unused_data
    if inflater.eof and not rest:
        return out
    del out
    if inflater.eof and rest[:2] != b"\x1f\x8b" and rest.strip(b"\x00"):
        # bytes after the member that are neither another member nor zero padding
        raise ValueError(f"{len(rest)} bytes after the end of the compressed data are not "
                         f"another gzip member")
    return _gunzip_members(raw)


def plain_bytes(raw: bytes, path: Path) -> bytes:
    """The file's JSON bytes: gunzipped when gzip, without a UTF-8 byte-order mark.

    Raises:
        TraceError: truncated or corrupt gzip, or nothing but whitespace.
    """
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = _gunzip(raw)
        except (OSError, EOFError, ValueError, zlib.error, *_GUNZIP_ERRORS) as exc:
            raise TraceError(f"{path}: truncated or corrupt gzip ({exc})") from None
    if raw[:3] == b"\xef\xbb\xbf":  # UTF-8 byte-order mark
        raw = raw[3:]
    if not raw or raw.isspace():  # (not raw.strip(), which copies the file)
        raise TraceError(f"{path}: empty file")
    return raw


#: What Python's ``json`` accepted where orjson refused, by the words of orjson's message.
_REPAIRS = (("control character", "raw control characters inside strings accepted"),
            ("surrogate", "unpaired UTF-16 surrogate escapes kept as they are"),
            ("infinity", "numbers beyond the float range read as infinity"))


def _repair_of(refusal: str) -> str:
    """The repair line for a document that only Python's ``json`` read: what orjson's first
    refusal (its message) names, else the message itself."""
    low = refusal.lower()
    for words, repair in _REPAIRS:
        if words in low:
            return repair
    return f"read by Python's json where orjson refused it ({refusal})"


def parse_json(raw: bytes, path: Path) -> tuple[dict, list[str]]:
    """The tolerant reading of a file's JSON bytes: orjson, else (bare ``NaN``/``Infinity``,
    control characters in strings, unpaired surrogate escapes, numbers beyond the float range,
    invalid UTF-8) Python's ``json`` after repairs.

    Returns:
        (the document, the repairs made: one line each).

    Raises:
        TraceError: not valid JSON even after the repairs, or the top level is not an object.
    """
    repairs: list[str] = []
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as refused:
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
            repairs.append(_repair_of(refused.msg))
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


def is_trace_doc(doc: dict) -> bool:
    """Whether a decoded document is a trace: it has a ``traceEvents`` list."""
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


_STR_COLUMN_TYPES = {int, str, type(msgspec.UNSET)}


def _str_column(values: list) -> list[str]:
    """``str`` of each value (None and an absent field, :data:`_MISSING`, → ``""``), equal
    strings shared (less memory, faster pickle)."""
    if set(map(type, values)) <= _STR_COLUMN_TYPES:
        table = {v: str(v) for v in set(values)}
        if _MISSING in table:
            table[_MISSING] = ""
        return list(map(table.__getitem__, values))
    return [("" if v is None or v is _MISSING else str(v)) for v in values]


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
        if (e.get("ph") == "M" and e.get("name") == "thread_name"
                and isinstance(e.get("args"), dict)):
            thread_names[(str(e.get("pid")), str(e.get("tid")))] = str(
                vocab.THREAD_NAME.get(e["args"], ""))
    keep = [e for e in objs
            if (ph := e.get("ph")) == "X" or (ph == "i" and e.get("name") == "[memory]")]
    phs = [e["ph"] for e in keep]
    argss = [a if type(a := e.get("args")) is dict else {} for e in keep]
    names_raw = [e.get("name") for e in keep]
    return _frame_from_columns(
        path, display_time_unit, thread_names, not_objects,
        names_raw=names_raw, cats_raw=[e.get("cat") for e in keep], phs=phs,
        pids_raw=[e.get("pid", "") for e in keep], tid_raw=[e.get("tid", "") for e in keep],
        ts_raw=[e.get("ts") for e in keep],
        dur_raw=[e.get("dur") if ph == "X" else 0.0 for e, ph in zip(keep, phs)],
        no_dur=sum(1 for e, ph in zip(keep, phs) if ph == "X" and "dur" not in e),
        arg_stream=[vocab.STREAM.get(a, _MISSING) for a in argss],
        arg_queue=[vocab.SYCL_QUEUE.get(a, _MISSING) for a in argss],
        arg_corr=[vocab.CORRELATION.get(a, -1) for a in argss],
        kept_args=[a if (a and k) else None for a, k in zip(argss, _keeps_args(names_raw))])


#: Metadata events that name a process (``pardiag merge`` and other tools name each rank's
#: processes ``rank N``).
_PROCESS_META = frozenset({"process_name", "process_labels"})
#: Key under which the parser leaves ``{pid: [process names and labels]}`` in a file's metadata
#: (read by :func:`_split_merged`, removed before the metadata is kept).
PROCESS_NAMES_KEY = "_pardiag_process_names"


def read_process_names(objs: list) -> dict[str, list[str]]:
    """``{pid: [process_name / process_labels values]}`` of raw trace events."""
    out: dict[str, list[str]] = {}
    for e in objs:
        if (type(e) is dict and e.get("ph") == "M" and type(e.get("name")) is str
                and e["name"] in _PROCESS_META and isinstance(e.get("args"), dict)):
            a = e["args"]
            out.setdefault(str(e.get("pid")), []).append(
                str(vocab.THREAD_NAME.get(a, vocab.PROCESS_LABELS.get(a, ""))))
    return out


#: The ``args`` of a decoded event that has none (this very object: told apart by identity from
#: an empty args object).
_NO_ARGS = msgspec.Raw(b"{}")


class _Fields(msgspec.Struct, gc=False):
    """The fields of a trace event that pardiag reads besides ``ph``; ``args`` stays undecoded
    JSON."""

    name: object = None
    cat: object = None
    pid: object = msgspec.UNSET
    tid: object = msgspec.UNSET
    ts: object = None
    dur: object = msgspec.UNSET
    args: msgspec.Raw = _NO_ARGS


class _Event(_Fields):
    """A trace event with its ``ph`` as a field (any value, or none: :data:`_EVENTS_DECODER`)."""

    ph: object = None


class _Complete(_Fields, tag_field="ph", tag="X"):
    """A complete event (``ph`` ``"X"``), decoded by its tag (see :data:`_TAGGED_DECODER`)."""


class _Instant(_Complete, tag="i"):
    """An instant event (``ph`` ``"i"``: ``[memory]`` among them)."""


class _Meta(_Complete, tag="M"):
    """A metadata event (``ph`` ``"M"``: thread and process names)."""


class _LiteArgs(msgspec.Struct, gc=False, frozen=True):
    """The args every row of the event table reads (its other args are kept only for
    communication and memory events); frozen, so that one instance, :data:`_NO_LITE`, stands for
    absent args."""

    stream: object = msgspec.field(default=msgspec.UNSET, name=vocab.STREAM.name)
    correlation: object = msgspec.field(default=-1, name=vocab.CORRELATION.name)
    sycl_queue: object = msgspec.field(default=msgspec.UNSET, name=vocab.SYCL_QUEUE.name)


_NO_LITE = _LiteArgs()


class _LiteFields(_Fields):
    """:class:`_Fields` with ``args`` decoded into the three args every row reads (None where
    the args are ``null``; an args value of another kind fails the decode)."""

    args: _LiteArgs | None = _NO_LITE


class _LiteComplete(_LiteFields, tag_field="ph", tag="X"):
    """A complete event decoded by :data:`_LITE_DECODER`."""


class _LiteInstant(_LiteComplete, tag="i"):
    """An instant event decoded by :data:`_LITE_DECODER`."""


class _ArgsOnly(msgspec.Struct, gc=False):
    """An event's args decoded whole (communication and memory events: :func:`_keeps_args`)."""

    args: object = None


#: The other ``ph`` values of the Chrome trace format: such events are decoded to an empty
#: struct (flow events are a third of a GPU trace's events, and none is read).
_SKIPPED_PHS = ("B", "E", "I", "C", "b", "n", "e", "s", "t", "f", "P", "O", "N", "D", "V", "v",
                "R", "c", "(", ")")
_SKIPPED_TYPES = tuple(msgspec.defstruct(f"_Skipped{i}", [], tag_field="ph", tag=ph, gc=False)
                       for i, ph in enumerate(_SKIPPED_PHS))
_SKIPPED = functools.reduce(operator.or_, _SKIPPED_TYPES)
#: The kind of each struct the tagged decoders build: 1 complete, 2 instant, 3 metadata, 0 an
#: event no table reads (:func:`_split_tagged`).
_TYPE_CODES = {_Complete: 1, _LiteComplete: 1, _Instant: 2, _LiteInstant: 2, _Meta: 3,
               **dict.fromkeys(_SKIPPED_TYPES, 0)}

#: An arg the event has not got (``stream``, ``sycl queue``).
_MISSING = msgspec.UNSET

_TOP_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])


class _TopEvents(msgspec.Struct):
    """A trace document's event list, each event undecoded (the other keys are skipped)."""

    traceEvents: list[msgspec.Raw]


_TOP_EVENTS_DECODER = msgspec.json.Decoder(_TopEvents)
_RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
_LITE_LIST_DECODER = msgspec.json.Decoder(list[_LiteArgs])
_ARGS_LIST_DECODER = msgspec.json.Decoder(list[_ArgsOnly])
#: Events decoded by their ``ph`` with the args every row reads: only the fields of the kinds
#: pardiag reads are built. Events that fail it (args that are not objects) are decoded with
#: :data:`_TAGGED_DECODER` (args undecoded), and a ``ph`` outside the format's (or none, or not
#: a string) with :data:`_EVENTS_DECODER`.
_LITE_DECODER = msgspec.json.Decoder(list[_LiteComplete | _LiteInstant | _Meta | _SKIPPED])
_TAGGED_DECODER = msgspec.json.Decoder(list[_Complete | _Instant | _Meta | _SKIPPED])
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
_ANY_DECODER = msgspec.json.Decoder()

#: Events decoded at a time by :func:`parse_trace_fast`: a slice's structs become column arrays
#: and are dropped before the next slice is decoded, so a file's events are never all Python
#: objects at once (for a 31 MB trace the parse's peak above the file's bytes fell from 51 to
#: 19 MB; ``benchmarks/bench_report.py``, results in ``benchmarks/README.md``).
SLICE_EVENTS = 8192

_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError,
                  RecursionError)


def parse_trace_fast(raw: bytes | list, path: Path, display_time_unit_default=None
                     ) -> tuple[dict, tuple] | None:
    """Strict-JSON fast path of reading a trace: the document's metadata and the
    :func:`events_frame` result, decoding only the event fields pardiag uses (msgspec), in
    slices of :data:`SLICE_EVENTS` events. ``raw`` is the decompressed file, or a one-item list
    holding it: then the list is emptied on success so the bytes can be freed before the table
    is built (and left as it was when None is returned).

    Returns:
        ``(metadata, (events, thread_names, warnings, notes))``, or None when the file is not a
        strict-JSON object with a ``traceEvents`` list of objects (then the caller takes the
        tolerant path, :func:`read_trace_bytes` + :func:`events_frame`, which gives the same
        table or the right error).
    """
    holder = raw if isinstance(raw, list) else None
    raw = holder[0] if holder is not None else raw
    try:
        split = _split_document(raw)
        if split is None:
            return None
        top, raws = split
        meta = {k: _ANY_DECODER.decode(v) for k, v in top.items()}
    except _DECODE_ERRORS:
        return None
    del top, split
    parts: list[dict] = []
    thread_names: dict = {}
    process_names: dict[str, list[str]] = {}
    keeps: dict = {}
    for start in range(0, len(raws), SLICE_EVENTS):
        part = _slice_part(raws[start:start + SLICE_EVENTS], thread_names, process_names, keeps)
        if part is None:
            return None
        parts.append(part)
    del raws  # the events' undecoded JSON: the last reference to the file's bytes
    if holder is not None:
        holder.clear()
    del raw
    if process_names:
        meta[PROCESS_NAMES_KEY] = process_names
    unit = vocab.DISPLAY_TIME_UNIT.get(meta, display_time_unit_default)
    return meta, _frame_from_parts(path, unit, thread_names, 0, parts)


def _split_document(raw: bytes) -> tuple[dict, list] | None:
    """The document's top-level values other than ``traceEvents`` and the events, all as
    undecoded JSON (:class:`msgspec.Raw`); None when it has no ``traceEvents`` list.

    One pass over the events: the document is decoded as :class:`_TopEvents` (which splits the
    event list and skips the other values), and the other values are then read from the
    document with the event list cut out (:func:`_without_events`). Where that cannot be done
    (no events, or the list is not where its events say), the top level is decoded first and the
    event list a second time.

    Raises:
        msgspec.DecodeError, ValueError, ...: (:data:`_DECODE_ERRORS`) the bytes are not strict
            JSON.
    """
    try:
        raws = _TOP_EVENTS_DECODER.decode(raw).traceEvents
    except msgspec.ValidationError:  # not an object with a traceEvents list: said below
        raws = None
    if raws:
        top = _without_events(raw, raws)
        if top is not None:
            return top, raws
    top = _TOP_DECODER.decode(raw)
    if "traceEvents" not in top:
        return None
    return ({k: v for k, v in top.items() if k != "traceEvents"},
            _RAW_LIST_DECODER.decode(top["traceEvents"]))


def _without_events(raw: bytes, raws: list) -> dict | None:
    """The top-level values (undecoded) of the document ``raw`` other than its event list,
    whose events ``raws`` (non-empty) are views into ``raw``: the list is found from where its
    first and last events lie in ``raw`` and replaced by ``[]`` before the (now small) document
    is decoded. None when the list is not where they say, or the document names
    ``traceEvents`` twice."""
    def at(view) -> tuple[int, bytes]:  # where a view into raw starts in it, and its bytes
        return np.frombuffer(view, np.uint8).ctypes.data - base, bytes(view)

    base = np.frombuffer(raw, np.uint8).ctypes.data
    (first, head), (last, tail) = at(raws[0]), at(raws[-1])
    end = last + len(tail)
    if not (0 < first <= last and end <= len(raw)) or raw[first:first + len(head)] != head \
            or raw[last:end] != tail:
        return None
    start, stop = raw.rfind(b"[", 0, first), raw.find(b"]", end)
    if start < 0 or stop < 0 or raw[start + 1:first].strip() or raw[end:stop].strip():
        return None
    top = _TOP_DECODER.decode(b"".join((raw[:start], b"[]", raw[stop + 1:])))
    if bytes(top.pop("traceEvents", b"")) != b"[]":
        return None
    return top


def _decode_slice(raws: list) -> tuple[list, str] | None:
    """The events of ``raws`` (each event's undecoded JSON) decoded with the first of
    :data:`_LITE_DECODER` (``"lite"``), :data:`_TAGGED_DECODER` (``"tagged"``) and
    :data:`_EVENTS_DECODER` (``"plain"``) that takes them all, and which one; None when an
    entry is not an object."""
    data = _joined_array(raws)
    for decoder, kind in ((_LITE_DECODER, "lite"), (_TAGGED_DECODER, "tagged"),
                          (_EVENTS_DECODER, "plain")):
        try:
            return decoder.decode(data), kind
        except msgspec.ValidationError:
            continue
        except _DECODE_ERRORS:
            return None
    return None


def _slice_part(raws: list, thread_names: dict, process_names: dict, keeps: dict
                ) -> dict | None:
    """The :func:`_slice_arrays` of one slice of events (each event's undecoded JSON), or None
    when an entry is not an object. The slice's thread and process names are added to
    ``thread_names`` and ``process_names`` (:func:`_names_of`); ``keeps`` caches
    :func:`_keeps_args` across slices."""
    decoded = _decode_slice(raws)
    if decoded is None:
        return None
    evs, kind = decoded
    if kind == "plain":
        keep, phs = _split_events(evs, thread_names, process_names)
    else:
        keep, phs, mask = _split_tagged(evs, thread_names, process_names)
    del evs
    get = operator.attrgetter
    names_raw = list(map(get("name"), keep))
    full = _keeps_args(names_raw, keeps)
    if kind == "lite":
        arg_cols = _lite_args(list(map(get("args"), keep)), full,
                              list(itertools.compress(raws, mask)))
    else:
        arg_cols = _fast_args(list(map(get("args"), keep)), full)
    durs = list(map(get("dur"), keep))
    if phs.count("X") == len(phs):
        no_dur = durs.count(_MISSING)
    else:  # [memory] instants: no duration
        no_dur = sum(1 for d, ph in zip(durs, phs) if ph == "X" and d is _MISSING)
        durs = [d if ph == "X" else 0.0 for d, ph in zip(durs, phs)]
    return _slice_arrays(
        names_raw=names_raw, cats_raw=list(map(get("cat"), keep)), phs=phs,
        pids_raw=list(map(get("pid"), keep)), tid_raw=list(map(get("tid"), keep)),
        ts_raw=list(map(get("ts"), keep)), dur_raw=durs, no_dur=no_dur, **arg_cols)


def _split_events(evs: list, thread_names: dict, process_names: dict
                  ) -> tuple[list, list]:
    """The decoded events (:class:`_Event`) the table keeps (complete events and ``[memory]``
    instants) and their ``ph``; the names of the metadata events are added to
    ``thread_names`` and ``process_names`` (:func:`_names_of`)."""
    keep = []
    metas = []
    for e in evs:
        ph = e.ph
        if ph == "X" or (ph == "i" and e.name == "[memory]"):
            keep.append(e)
        elif ph == "M":
            metas.append(e)
    _names_of(metas, thread_names, process_names)
    return keep, list(map(operator.attrgetter("ph"), keep))


def _split_tagged(evs: list, thread_names: dict, process_names: dict
                  ) -> tuple[list, list, list[bool]]:
    """:func:`_split_events` of events decoded by their tag (:data:`_LITE_DECODER` or
    :data:`_TAGGED_DECODER`), with the mask of the events kept."""
    # each event's kind as a small integer (C-level maps), not a Python test per event
    codes = np.fromiter(map(_TYPE_CODES.__getitem__, map(type, evs)), np.int8, len(evs))
    keep_mask = codes == 1
    memory = [i for i in np.flatnonzero(codes == 2).tolist() if evs[i].name == "[memory]"]
    keep_mask[memory] = True
    mask = keep_mask.tolist()
    keep = list(itertools.compress(evs, mask))
    phs = ["X"] * len(keep) if not memory else [
        "X" if c == 1 else "i" for c in codes[keep_mask].tolist()]
    _names_of([evs[i] for i in np.flatnonzero(codes == 3).tolist()], thread_names, process_names)
    return keep, phs, mask


def _names_of(metas: list, thread_names: dict, process_names: dict[str, list[str]]) -> None:
    """Add the thread names ``{(pid, tid): name}`` and process names ``{pid: [names]}`` of
    decoded metadata events to ``thread_names`` and ``process_names`` (a later name of a
    thread replaces an earlier one)."""
    for e in metas:
        if e.args is not _NO_ARGS and (
                e.name == "thread_name" or (type(e.name) is str and e.name in _PROCESS_META)):
            a = _ANY_DECODER.decode(e.args)
            if not isinstance(a, dict):
                continue
            pid = None if e.pid is _MISSING else e.pid
            if e.name == "thread_name":
                tid = None if e.tid is _MISSING else e.tid
                thread_names[(str(pid), str(tid))] = str(vocab.THREAD_NAME.get(a, ""))
            else:
                process_names.setdefault(str(pid), []).append(
                    str(vocab.THREAD_NAME.get(a, vocab.PROCESS_LABELS.get(a, ""))))


def _keeps_args(names_raw: list, cache: dict | None = None) -> list[bool]:
    """Per event, whether the table keeps its args whole: its name (as text) marks it as
    communication or memory (:data:`_KEEP_ARGS_RE`; each distinct name tested once, and once
    across calls that share ``cache``)."""
    if set(map(type, names_raw)) <= {str}:
        cache = {} if cache is None else cache
        for x in set(names_raw).difference(cache):
            cache[x] = bool(_KEEP_ARGS_RE.search(x))
        return list(map(cache.__getitem__, names_raw))
    return [bool(_KEEP_ARGS_RE.search(str(x))) for x in names_raw]


def _joined_array(items: list) -> bytes:
    """One JSON array of the JSON values ``items`` (bytes or :class:`msgspec.Raw`), written
    once (``b"[" + b",".join(...) + b"]"`` would copy the joined bytes a second time)."""
    if not items:
        return b"[]"
    pieces = [b"["] + [b","] * (2 * len(items) - 1) + [b"]"]
    pieces[1:-1:2] = items
    return b"".join(pieces)


def _lite_args(lites: list, full: list[bool], raws: list) -> dict:
    """The arg columns of :func:`_slice_arrays` from the kept events' :class:`_LiteArgs`
    (None for ``null`` args); ``raws`` are the same events' undecoded JSON, decoded again (all
    at once) for the args the table keeps whole (``full``: :func:`_keeps_args`)."""
    n = len(lites)
    if type(None) in set(map(type, lites)):
        lites = [_NO_LITE if a is None else a for a in lites]
    get = operator.attrgetter
    kept: list = [None] * n
    todo = list(itertools.compress(range(n), full))
    if todo:
        whole = _ARGS_LIST_DECODER.decode(_joined_array([raws[i] for i in todo]))
        for i, o in zip(todo, whole):
            if type(o.args) is dict and o.args:
                kept[i] = o.args
    return dict(arg_stream=list(map(get("stream"), lites)),
                arg_queue=list(map(get("sycl_queue"), lites)),
                arg_corr=list(map(get("correlation"), lites)), kept_args=kept)


def _fast_args(raws: list, full: list[bool]) -> dict:
    """The arg columns of :func:`_slice_arrays` from each kept event's undecoded args
    (:data:`_NO_ARGS` where it has none; ``full``: :func:`_keeps_args`).

    Every event's args are read for ``stream``, ``correlation`` and ``sycl queue`` in one decode
    of all of them (one event at a time only when an args value is not a JSON object); those of
    events whose name marks them as kept (communication, memory) are also decoded whole."""
    n = len(raws)
    kept: list = [None] * n
    try:
        lites = _LITE_LIST_DECODER.decode(_joined_array(raws))
    except msgspec.ValidationError:  # an args value that is not an object: one at a time
        lites = None
    if lites is not None:
        get = operator.attrgetter
        stream = list(map(get("stream"), lites))
        queue = list(map(get("sycl_queue"), lites))
        corr = list(map(get("correlation"), lites))
        del lites
        todo = [i for i in itertools.compress(range(n), full) if len(raws[i]) > 2]
    else:
        stream, queue, corr = [_MISSING] * n, [_MISSING] * n, [-1] * n
        todo = [i for i in range(n) if len(raws[i]) > 2]
    for i in todo:
        a = _ANY_DECODER.decode(raws[i])
        if type(a) is dict:
            if full[i] and a:
                kept[i] = a
            stream[i] = vocab.STREAM.get(a, _MISSING)
            queue[i] = vocab.SYCL_QUEUE.get(a, _MISSING)
            corr[i] = vocab.CORRELATION.get(a, -1)
    return dict(arg_stream=stream, arg_queue=queue, arg_corr=corr, kept_args=kept)


def _normalize_cats(cats_raw: list) -> list[str]:
    try:
        table = {c: _CAT_ALIASES.get(low := str(c or "").lower(), low) for c in set(cats_raw)}
    except TypeError:  # unhashable categories
        table = None
    if table is not None:
        return list(map(table.__getitem__, cats_raw))
    out = []
    for c in cats_raw:
        low = str(c or "").lower()
        out.append(_CAT_ALIASES.get(low, low))
    return out


def _gpu_streams(gpu: np.ndarray, arg_stream, arg_queue, tid_raw: list) -> np.ndarray:
    """int64 stream of each event: for GPU events the ``stream`` arg (CUDA/HIP), else the
    ``sycl queue`` arg (Intel XPU), else an integer ``tid``, else a ``"stream 7"`` tid (the legacy
    format); -1 for the other events and where none of these is a number."""
    n = len(gpu)
    streams = np.full(n, -1, dtype=np.int64)
    idx = np.flatnonzero(gpu)
    if not len(idx):
        return streams
    if len(idx) > 1:  # every GPU event with an integer stream arg (CUDA, HIP): no loop
        given = operator.itemgetter(*idx.tolist())(arg_stream)
        if set(map(type, given)) == {int}:
            try:
                streams[idx] = np.array(given, dtype=np.int64)
                return streams
            except OverflowError:
                pass
    vals = []
    for i in idx:
        s, q, t = arg_stream[i], arg_queue[i], tid_raw[i]
        vals.append(s if s is not _MISSING else q if q is not _MISSING
                    else t if type(t) is int else None)
    sub = _int_column(vals)
    for j in np.flatnonzero(sub == -1):
        i = idx[j]
        s = arg_stream[i]
        sub[j] = _int_or(None if s is _MISSING else s, _int_or(tid_raw[i]))
    streams[idx] = sub
    return streams


def _slice_arrays(*, names_raw, cats_raw, phs, pids_raw, tid_raw, ts_raw, dur_raw, no_dur,
                  arg_stream, arg_queue, arg_corr, kept_args) -> dict:
    """The columns of the event table for some events, from the raw field values (one list per
    field: ``arg_stream``/``arg_queue`` hold :data:`_MISSING` where an event's args have no
    such key, ``arg_corr`` -1; ``kept_args`` the args dicts the table keeps
    (:func:`_keeps_args`), None elsewhere), with ``strings`` (ts/dur values read from strings)
    and ``no_dur`` (complete events without ``dur``). :func:`_frame_from_parts` joins them."""
    cats = _normalize_cats(cats_raw)
    ts, ts_str = _float_column(ts_raw)
    dur, dur_str = _float_column(dur_raw)
    gpu_cat = {c: c in GPU_CATS for c in set(cats)}
    is_gpu = np.fromiter(map(gpu_cat.__getitem__, cats), bool, len(cats))
    return dict(name=_str_column(names_raw), cat=cats, ph=phs, pid=_str_column(pids_raw),
                tid=_str_column(tid_raw), ts=ts, dur=dur,
                stream=_gpu_streams(is_gpu, arg_stream, arg_queue, tid_raw),
                correlation=_int_column(list(arg_corr)), args=kept_args,
                strings=ts_str + dur_str, no_dur=no_dur)


def _frame_from_columns(path, display_time_unit, thread_names, not_objects, **cols):
    """:func:`events_frame` from the raw field values of the kept events (the keyword
    arguments of :func:`_slice_arrays`)."""
    return _frame_from_parts(path, display_time_unit, thread_names, not_objects,
                             [_slice_arrays(**cols)])


def _frame_from_parts(path, display_time_unit, thread_names, not_objects, parts: list[dict]):
    """:func:`events_frame` from the :func:`_slice_arrays` of consecutive slices of the kept
    events."""
    if not parts:
        parts = [_slice_arrays(names_raw=[], cats_raw=[], phs=[], pids_raw=[], tid_raw=[],
                               ts_raw=[], dur_raw=[], no_dur=0, arg_stream=[], arg_queue=[],
                               arg_corr=[], kept_args=[])]

    def joined(key):
        if len(parts) == 1:
            return parts[0][key]
        if isinstance(parts[0][key], np.ndarray):
            return np.concatenate([p[key] for p in parts])
        return list(itertools.chain.from_iterable(p[key] for p in parts))

    ts = joined("ts")
    df = pd.DataFrame({
        "name": pd.Series(joined("name"), dtype=object),
        "cat": pd.Series(_categorical(joined("cat"))),
        "ph": pd.Series(joined("ph"), dtype=object), "pid": pd.Series(joined("pid"), dtype=object),
        "tid": pd.Series(joined("tid"), dtype=object), "ts": ts, "dur": joined("dur"),
        "stream": joined("stream"), "correlation": joined("correlation"),
        "args": pd.Series(joined("args"), dtype=object),
    })
    strings = sum(p["strings"] for p in parts)
    no_dur = sum(p["no_dur"] for p in parts)
    parts.clear()  # the slices' columns: the table holds its own copies
    warnings: list[str] = []
    notes: list[str] = []
    if not_objects:
        warnings.append(f"{path}: left out {not_objects} traceEvents entries that are not objects")
    if strings:
        warnings.append(f"{path}: {strings} ts/dur values are strings; read as numbers"
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
    df, clip_notes = _clip_same_stream(df)
    notes.extend(f"{path}: {n}" for n in clip_notes)
    return df, thread_names, warnings, notes


def _categorical(values: list[str]) -> pd.Categorical:
    """``pd.Categorical(values)`` (categories sorted) of a list of ``str``, built from codes:
    a third of the time for a trace's ``cat`` column."""
    if not values:
        return pd.Categorical(values)
    cats = sorted(set(values))
    index = {c: i for i, c in enumerate(cats)}
    codes = np.fromiter(map(index.__getitem__, values), np.int32, len(values))
    return pd.Categorical.from_codes(codes, categories=cats)


#: A GPU event that runs more than this (µs) past the start of the next event on its stream did
#: not share a serial stream with it: the trace recorded kernels of several queues under one
#: stream id (ROCm traces can put every kernel, RCCL's included, on stream 0). Such a stream is
#: kept whole (:func:`_clip_same_stream`). The largest same-stream overlap in the real GPU traces
#: of ``../shared/real_traces`` is 13 µs; timestamp noise is a few ns.
SAME_STREAM_MAX_CLIP_US = 100.0


def _clip_same_stream(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Clip GPU events whose recorded end passes the start of the next event on their stream,
    and the notes that say what was clipped and what was kept whole.

    A stream runs one kernel (or copy) at a time, so such an event ends where the next one
    starts: its ``dur`` shrinks to ``next ts − ts`` (never below 0). Overlaps of a few ns are
    timestamp noise; larger ones (a kernel "inside" another) are clipped the same way and the
    note gives the largest clip. A stream (``pid``, ``stream``) with an overlap beyond
    :data:`SAME_STREAM_MAX_CLIP_US` is not serial and is left as recorded: clipping it would cut
    communication kernels short where they overlapped computation.
    """
    gpu = isin_mask(df["cat"], GPU_CATS)
    if not gpu.any():
        return df, []
    sub = df.loc[gpu, ["pid", "stream", "ts", "dur"]]  # df is sorted by ts
    keys = [sub["pid"], sub["stream"]]
    next_start = sub["ts"].groupby(keys, sort=False).shift(-1)
    past = (sub["ts"] + sub["dur"] - next_start).to_numpy()
    over = np.nan_to_num(past, nan=0.0) > 0
    if not over.any():
        return df, []
    notes = []
    wide = over & (past > SAME_STREAM_MAX_CLIP_US)
    if wide.any():
        streams = pd.MultiIndex.from_arrays([sub["pid"].to_numpy()[wide],
                                             sub["stream"].to_numpy()[wide]]).unique()
        whole = pd.MultiIndex.from_arrays([sub["pid"], sub["stream"]]).isin(streams)
        named = ", ".join(f"stream {st} of process {pid}" for pid, st in streams[:4])
        more = f" and {len(streams) - 4} more" if len(streams) > 4 else ""
        notes.append(f"kept {int((over & whole).sum())} GPU events that overlap the next one on "
                     f"their stream as recorded (by up to {float(np.max(past[wide])):.3f} µs, on "
                     f"{named}{more}): such a stream holds kernels of several queues, which ran "
                     f"at once")
        over &= ~whole
        if not over.any():
            return df, notes
    at = np.flatnonzero(gpu)[over]  # positions in df
    dur = df["dur"].to_numpy().copy()
    new_dur = np.maximum(0.0, next_start.to_numpy()[over] - df["ts"].to_numpy()[at])
    max_clip = float(np.max(dur[at] - new_dur))
    dur[at] = new_dur
    df = df.copy(deep=False)
    df["dur"] = dur
    return df, [f"clipped {len(at)} same-stream GPU events that ran past the next one's start "
                f"(by up to {max_clip:.3f} µs)", *notes]
