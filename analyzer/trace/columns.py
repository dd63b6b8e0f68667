"""The raw fields of a Kineto file's events → the columns of the event table
(:data:`pardiag.analyzer.trace.traceset.EVENT_COLUMNS`), shared by both ways of decoding a file
(:mod:`pardiag.analyzer.trace.parse` and :mod:`pardiag.analyzer.trace.decode`): numbers read
whatever their JSON type, legacy category spellings normalised, GPU streams found, stray
timestamps left out (:func:`stray_timestamps`) and kernels that overlap on one stream clipped
(:func:`clip_same_stream`).
"""

from __future__ import annotations

import itertools
import math
import operator
import re

import msgspec
import numpy as np
import pandas as pd

from . import vocab
from .classify import LAUNCH_CALL_RE
from .traceset import GPU_CATS, isin_mask

#: An arg the event has not got (``stream``, ``sycl queue``).
MISSING = msgspec.UNSET


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
    """``str`` of each value (None and an absent field, :data:`MISSING`, → ``""``), equal
    strings shared (less memory, faster pickle)."""
    if set(map(type, values)) <= _STR_COLUMN_TYPES:
        table = {v: str(v) for v in set(values)}
        if MISSING in table:
            table[MISSING] = ""
        return list(map(table.__getitem__, values))
    return [("" if v is None or v is MISSING else str(v)) for v in values]


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


def keeps_args(names_raw: list, cache: dict | None = None) -> list[bool]:
    """Per event, whether the table keeps its args whole: its name (as text) marks it as
    communication or memory (:data:`_KEEP_ARGS_RE`), or as an op whose FLOPs are counted
    (:data:`pardiag.analyzer.trace.vocab.FLOP_OPS`), or as the autograd engine's range around a
    backward function or the function's own range (their sequence number links them to their
    forward op); each distinct name tested once, and once across calls that share ``cache``."""
    if set(map(type, names_raw)) <= {str}:
        cache = {} if cache is None else cache
        for x in set(names_raw).difference(cache):
            cache[x] = _keeps(x)
        return list(map(cache.__getitem__, names_raw))
    return [_keeps(str(x)) for x in names_raw]


def _keeps(name: str) -> bool:
    return (bool(_KEEP_ARGS_RE.search(name)) or name in vocab.FLOP_OPS
            or bool(vocab.BACKWARD_FUNCTION_RE.match(name))
            or bool(vocab.BACKWARD_NODE_RE.match(name)))


def _annotations_as_such(names_raw: list, cats: list[str]) -> list[str]:
    """``cats`` with pardiag's module ranges (:data:`vocab.MODULE_RANGE_PREFIX`) as
    ``user_annotation``: torch's fast record function, which ``pardiag profile`` uses for them,
    writes ``cpu_op``, and a range is no operator (its time is its operators' and waits')."""
    try:
        hits = {n for n in set(names_raw)
                if isinstance(n, str) and n.startswith(vocab.MODULE_RANGE_PREFIX)}
    except TypeError:   # unhashable names
        hits = {n for n in names_raw
                if isinstance(n, str) and n.startswith(vocab.MODULE_RANGE_PREFIX)}
    if not hits:
        return cats
    return ["user_annotation" if isinstance(n, str) and n in hits else c
            for n, c in zip(names_raw, cats)]


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
        vals.append(s if s is not MISSING else q if q is not MISSING
                    else t if type(t) is int else None)
    sub = _int_column(vals)
    for j in np.flatnonzero(sub == -1):
        i = idx[j]
        s = arg_stream[i]
        sub[j] = _int_or(None if s is MISSING else s, _int_or(tid_raw[i]))
    streams[idx] = sub
    return streams


def _device_column(gpu: np.ndarray, arg_device: list) -> np.ndarray:
    """int64 device of each GPU event from its ``device`` arg (an integer, or the digits of a
    string), -1 where it has none and for events off the device: the device of a kernel whose
    other args the table does not keep (a rank's kernels on two GPUs)."""
    out = np.full(len(arg_device), -1, dtype=np.int64)
    idx = np.flatnonzero(gpu).tolist()
    values = [arg_device[i] for i in idx]
    if values and set(map(type, values)) <= {int} and 0 <= min(values) and max(values) < 2**62:
        out[idx] = values   # every GPU event names its device (a CUDA trace): no loop
        return out
    for i, d in zip(idx, values):
        if type(d) is int or (type(d) is str and d.isdigit()):
            out[i] = int(d)
    return out


def slice_arrays(*, names_raw, cats_raw, phs, pids_raw, tid_raw, ts_raw, dur_raw, no_dur,
                  arg_stream, arg_queue, arg_corr, arg_device, kept_args) -> dict:
    """The columns of the event table for some events, from the raw field values (one list per
    field: ``arg_stream``/``arg_queue``/``arg_device`` hold :data:`MISSING` where an event's
    args have no such key, ``arg_corr`` -1; ``kept_args`` the args dicts the table keeps
    (:func:`keeps_args`), None elsewhere), with ``strings`` (ts/dur values read from strings)
    and ``no_dur`` (complete events without ``dur``). :func:`frame_from_parts` joins them."""
    cats = _annotations_as_such(names_raw, _normalize_cats(cats_raw))
    ts, ts_str = _float_column(ts_raw)
    dur, dur_str = _float_column(dur_raw)
    gpu_cat = {c: c in GPU_CATS for c in set(cats)}
    is_gpu = np.fromiter(map(gpu_cat.__getitem__, cats), bool, len(cats))
    return dict(name=_str_column(names_raw), cat=cats, ph=phs, pid=_str_column(pids_raw),
                tid=_str_column(tid_raw), ts=ts, dur=dur,
                stream=_gpu_streams(is_gpu, arg_stream, arg_queue, tid_raw),
                correlation=_int_column(list(arg_corr)),
                device=_device_column(is_gpu, arg_device), args=kept_args,
                strings=ts_str + dur_str, no_dur=no_dur)


def frame_from_columns(path, display_time_unit, thread_names, not_objects, **cols):
    """:func:`events_frame` from the raw field values of the kept events (the keyword
    arguments of :func:`slice_arrays`)."""
    return frame_from_parts(path, display_time_unit, thread_names, not_objects,
                             [slice_arrays(**cols)])


def frame_from_parts(path, display_time_unit, thread_names, not_objects, parts: list[dict]):
    """:func:`events_frame` from the :func:`slice_arrays` of consecutive slices of the kept
    events."""
    if not parts:
        parts = [slice_arrays(names_raw=[], cats_raw=[], phs=[], pids_raw=[], tid_raw=[],
                               ts_raw=[], dur_raw=[], no_dur=0, arg_stream=[], arg_queue=[],
                               arg_corr=[], arg_device=[], kept_args=[])]

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
        "device": joined("device"),
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
    df, clip_notes = clip_same_stream(df)
    notes.extend(f"{path}: {n}" for n in clip_notes)
    relinked = relink_kernels(df)
    if relinked:
        warnings.append(f"{path}: {relinked}")
    return df, thread_names, warnings, notes


def relink_kernels(df: pd.DataFrame) -> str | None:
    """Tie kernels whose ``correlation`` ids are broken back to their launches, in place: where
    every kernel that no host event's id names carries an id of 0 or less, or one that other
    kernels carry too (roctracer gives RCCL's kernels ``correlation`` 0: ROCm/roctracer#100),
    and as many launch calls (:data:`pardiag.analyzer.trace.classify.LAUNCH_CALL_RE`) tie to no
    kernel, on one device, the k-th such kernel in time is the k-th such launch's, when each
    starts after its launch. The line to say (a warning: the pairing is by order), else None.

    ``df``: the event table in time order (:data:`pardiag.analyzer.trace.traceset.
    EVENT_COLUMNS`)."""
    if not len(df):
        return None
    kern = (df["cat"] == "kernel").to_numpy()
    if not kern.any():
        return None
    corr = df["correlation"].to_numpy()
    gpu = np.asarray(isin_mask(df["cat"], list(GPU_CATS)))
    host = ~gpu & (corr >= 0)
    # no host event at all ties it (a CUDA graph's kernels share their graph launch's id)
    orphan_k = kern & ~np.isin(corr, corr[host])
    if not orphan_k.any():
        return None
    ids, counts = np.unique(corr[kern], return_counts=True)
    repeated = set(ids[counts > 1].tolist())
    if not all(c <= 0 or c in repeated for c in corr[orphan_k].tolist()):
        return None
    at = np.flatnonzero(host)   # the launch calls' names tested only here, where it matters
    launch = np.zeros(len(df), dtype=bool)
    launch[at] = df["name"].iloc[at].astype(str).str.contains(LAUNCH_CALL_RE).to_numpy()
    orphan_l = launch & ~np.isin(corr, corr[gpu & ~orphan_k])
    k_at, l_at = np.flatnonzero(orphan_k), np.flatnonzero(orphan_l)
    ts = df["ts"].to_numpy(dtype=float)
    if (len(k_at) != len(l_at) or len(set(df["device"].to_numpy()[k_at].tolist())) != 1
            or (ts[k_at] < ts[l_at]).any()):
        return None
    df.iloc[k_at, df.columns.get_loc("correlation")] = corr[l_at]
    return (f"{len(k_at)} kernels carry correlation ids that tie them to no launch (0 or "
            f"repeated: roctracer's RCCL kernels); each paired with one of the {len(l_at)} "
            f"launches that tie to no kernel, in time order")


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
#: kept whole (:func:`clip_same_stream`). The largest same-stream overlap in the real GPU traces
#: of ``../shared/real_traces`` is 13 µs; timestamp noise is a few ns.
SAME_STREAM_MAX_CLIP_US = 100.0


def _past_the_host(df: pd.DataFrame, gpu: np.ndarray, sub: pd.DataFrame) -> np.ndarray:
    """Per GPU event of ``sub``: whether its recorded end lies after the end of every host
    event by more than the longest ``ProfilerStep`` (or, without steps, more than the host
    events' whole extent, at least :data:`SAME_STREAM_MAX_CLIP_US`). The host launched every
    kernel and the steps bound the work it waited for: a kernel ending that much later has a
    corrupted end (HTA reports such same-stream kernels), where kernels of several queues
    filed under one stream (ROCm's stream 0) end within the host's steps."""
    host = ~gpu & (df["dur"].to_numpy() > 0)
    if not host.any():
        return np.zeros(len(sub), dtype=bool)
    ts, dur = df["ts"].to_numpy()[host], df["dur"].to_numpy()[host]
    host_end = float(np.max(ts + dur))
    names = df["name"][host]
    # each distinct name tested once (a trace has millions of events, hundreds of names)
    steps = names.isin([n for n in pd.unique(names)
                        if type(n) is str and n.startswith("ProfilerStep")]).to_numpy()
    span = float(np.max(dur[steps])) if steps.any() else host_end - float(np.min(ts))
    end = (sub["ts"] + sub["dur"]).to_numpy()
    return end - host_end > max(span, SAME_STREAM_MAX_CLIP_US)


def clip_same_stream(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Clip GPU events whose recorded end passes the start of the next event on their stream,
    and the notes that say what was clipped and what was kept whole.

    A stream runs one kernel (or copy) at a time, so such an event ends where the next one
    starts: its ``dur`` shrinks to ``next ts − ts`` (never below 0). Overlaps of a few ns are
    timestamp noise; larger ones (a kernel "inside" another) are clipped the same way and the
    note gives the largest clip. A stream (``pid``, ``stream``) with an overlap beyond
    :data:`SAME_STREAM_MAX_CLIP_US` is not serial and is left as recorded: clipping it would cut
    communication kernels short where they overlapped computation. An event whose end also lies
    far past the host's last event (:func:`_past_the_host`) has a corrupted end: it is clipped
    whatever its stream, and said so.
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
    corrupt = over & _past_the_host(df, gpu, sub)
    if corrupt.any():
        notes.append(f"clipped {int(corrupt.sum())} GPU event(s) whose recorded end ran past "
                     f"the next event on their stream and past the host's last event by more "
                     f"than a profiler step (by up to {float(np.max(past[corrupt])) / 1e6:.3f} s "
                     f"past the next one's start): a corrupted end, not concurrent work")
    wide = over & ~corrupt & (past > SAME_STREAM_MAX_CLIP_US)
    if wide.any():
        streams = pd.MultiIndex.from_arrays([sub["pid"].to_numpy()[wide],
                                             sub["stream"].to_numpy()[wide]]).unique()
        whole = pd.MultiIndex.from_arrays([sub["pid"], sub["stream"]]).isin(streams)
        named = ", ".join(f"stream {st} of process {pid}" for pid, st in streams[:4])
        more = f" and {len(streams) - 4} more" if len(streams) > 4 else ""
        kept = int((over & whole & ~corrupt).sum())
        notes.append(f"kept {kept} GPU events that overlap the next one on "
                     f"their stream as recorded (by up to {float(np.max(past[wide])):.3f} µs, on "
                     f"{named}{more}): such a stream holds kernels of several queues, which ran "
                     f"at once")
        over &= ~whole | corrupt
        if not over.any():
            return df, notes
    at = np.flatnonzero(gpu)[over]  # positions in df
    dur = df["dur"].to_numpy().copy()
    new_dur = np.maximum(0.0, next_start.to_numpy()[over] - df["ts"].to_numpy()[at])
    plain = ~corrupt[over]   # the corrupted ends have their own note
    dur_before = dur[at]
    dur[at] = new_dur
    df = df.copy(deep=False)
    df["dur"] = dur
    if not plain.any():
        return df, notes
    max_clip = float(np.max(dur_before[plain] - new_dur[plain]))
    return df, [f"clipped {int(plain.sum())} same-stream GPU events that ran past the next one's "
                f"start (by up to {max_clip:.3f} µs)", *notes]
