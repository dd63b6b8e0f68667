"""Property-based fuzzing of the loader: any bytes give events or a TraceError, never a crash.

Profiles: ``ci`` (default, 400 examples for the loader, derandomized) and ``fuzz`` (10,000; used by
``benchmarks/fuzz_loader.py``). Select with ``HYPOTHESIS_PROFILE=fuzz``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pardiag.analyzer.per_rank import REDUCER
from pardiag.analyzer.trace import EVENT_COLUMNS, load_traces, read_trace_bytes
from pardiag.errors import TraceError

settings.register_profile("ci", max_examples=400, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=int(os.environ.get("FUZZ_LOADER_EXAMPLES", "10000")),
                          deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2 ** 70, max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["stream 7", "1e3", "12.5", "nan", "-1", "ProfilerStep#3", "[memory]"]))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6)
_names = st.one_of(st.sampled_from([
    "ProfilerStep#1", "ProfilerStep#2", "aten::mm", "gloo:all_reduce", "c10d::allreduce_",
    "ncclKernel_AllReduce_RING_LL_Sum_float", "ncclDevKernel_Generic", "cudaLaunchKernel",
    "[memory]", "thread_name", "Memcpy HtoD", "record_param_comms", "c10d::wait"]), _values)
_cats = st.one_of(st.sampled_from([
    "kernel", "Kernel", "cpu_op", "Operator", "cuda_runtime", "Runtime", "user_annotation",
    "gpu_memcpy", "Memset", "cpu_instant_event", "python_function"]), _values)
_times = st.one_of(st.floats(min_value=0, max_value=1e4), st.integers(0, 10_000),
                   st.floats(min_value=1.7e15, max_value=1.7e15 + 1e4), _values)
_event = st.fixed_dictionaries(
    {"ph": st.one_of(st.sampled_from(["X", "X", "X", "i", "M", "B", "E"]), _values)},
    optional={"name": _names, "cat": _cats, "ts": _times, "dur": _times,
              "pid": st.one_of(st.integers(0, 3), _values), "tid": st.one_of(
                  st.integers(0, 3), st.just("stream 7"), _values),
              "args": st.one_of(st.fixed_dictionaries({}, optional={
                  "stream": st.one_of(st.integers(0, 30), _values),
                  "correlation": st.one_of(st.integers(0, 30), _values),
                  "Total Allocated": _values, "Device Type": _values,
                  "Collective name": _values, "In msg nelems": _values, "dtype": _values,
                  "Input Dims": _values, "Input type": _values, "name": _values}), _values),
              "s": st.just("t")})
_doc = st.fixed_dictionaries(
    {"traceEvents": st.one_of(st.lists(st.one_of(_event, _values), max_size=25), _values)},
    optional={"distributedInfo": st.one_of(st.fixed_dictionaries(
        {"rank": st.one_of(st.integers(-2, 4), _values)},
        optional={"world_size": st.one_of(st.integers(0, 8), _values), "backend": _values}),
        _values), "displayTimeUnit": st.sampled_from(["ms", "ns", "us"]),
        "baseTimeNanoseconds": _values})


def _encode(doc, how: int, cut: int, junk: bytes) -> bytes:
    data = json.dumps(doc, allow_nan=True).encode()  # NaN/Infinity tokens: not strict JSON
    if how == 1:
        data = data[:cut % (len(data) + 1)]            # truncated
    elif how == 2:
        i = cut % (len(data) + 1)
        data = data[:i] + junk + data[i:]               # random bytes spliced in
    elif how == 3:
        data = gzip.compress(data)
        data = data[:cut % (len(data) + 1)] if cut % 3 == 0 else data
    return data


def _check(events) -> None:
    assert tuple(events.columns) == EVENT_COLUMNS
    ts, dur = events["ts"].to_numpy(), events["dur"].to_numpy()
    assert np.isfinite(ts).all() and np.isfinite(dur).all()
    assert (ts >= 0).all() and (dur >= 0).all()
    assert (np.diff(ts) >= 0).all()


@given(doc=_doc, how=st.integers(0, 3), cut=st.integers(0, 10_000), junk=st.binary(max_size=8))
@example(doc={"traceEvents": [{"ph": "M", "name": []}]}, how=0, cut=0, junk=b"")  # unhashable
@example(doc={"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0, "args": {
    "name": "rank 0"}}, {"ph": "M", "name": "process_name", "pid": 1000, "args": {
        "name": "rank 1"}}, {"ph": "X", "name": "k", "pid": 1000, "ts": 1, "dur": 1}]},
         how=0, cut=0, junk=b"")  # a merged file with one rank's events only
def test_loader_never_crashes(doc, how, cut, junk):
    data = _encode(doc, how, cut, junk)
    try:
        read_trace_bytes(data, Path("fuzz.json"))
    except TraceError as exc:
        assert str(exc).startswith("fuzz.json: ")
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "rank0.json").write_bytes(data)
        (Path(d) / "rank1.json").write_bytes(_encode(doc, 0, 0, b""))
        try:
            ts = load_traces(d)
        except TraceError as exc:
            assert str(exc).startswith(d)
            assert "\n" not in str(exc)
            return
        for t in ts.ranks.values():
            _check(t.events)


@settings(max_examples=int(os.environ.get("FUZZ_REPORT_EXAMPLES", "80")))
@given(doc=_doc)
def test_analyses_never_crash_on_what_loads(doc):
    """What the loader accepts, every analysis handles (no exception), and the report from
    stored summaries equals the report from the raw trace."""
    import orjson

    from pardiag.analyzer.report.registry import build_report, report_json

    def dump(ts) -> bytes:
        return orjson.dumps(report_json(build_report(ts)), default=str,
                            option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "rank0.json").write_text(json.dumps(doc, allow_nan=True))
        try:
            ts = load_traces(d)
        except TraceError:
            return
        raw = dump(ts)
        load_traces(d, reducer=REDUCER, cache=True)  # computes and stores (in d/.pardiag-cache)
        assert dump(load_traces(d, reducer=REDUCER, cache=True)) == raw  # from the stored one


def _has_huge_int(v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return abs(v) >= 2 ** 63
    if isinstance(v, dict):
        return any(_has_huge_int(x) for x in v.values())
    if isinstance(v, list):
        return any(_has_huge_int(x) for x in v)
    return False


@given(doc=_doc)
@example(doc={"traceEvents": [{"ph": "M", "name": "thread_name"}]})  # found by 10k runs
@example(doc={"traceEvents": [{"ph": "M", "name": "thread_name", "args": {}}]})
def test_fast_path_gives_the_tolerant_paths_table(doc):
    """The msgspec fast path (strict JSON) and the orjson/json path build the same events,
    thread names, warnings and metadata; only integers beyond 64 bits may differ (orjson reads
    them as floats, msgspec exactly). Decoding the events two at a time gives what one slice
    gives."""
    from pardiag.analyzer.trace import decode, events_frame, parse_trace_fast

    data = json.dumps(doc).encode() if not _has_nonfinite(doc) else None
    if data is None:
        return
    fast = parse_trace_fast(data, Path("f.json"))
    saved = decode.SLICE_EVENTS
    try:
        decode.SLICE_EVENTS = 2
        sliced = parse_trace_fast(data, Path("f.json"))
    finally:
        decode.SLICE_EVENTS = saved
    assert (sliced is None) == (fast is None)
    if fast is not None:
        assert sliced[0] == fast[0] and sliced[1][1:] == fast[1][1:]
        assert sliced[1][0].drop(columns="args").equals(fast[1][0].drop(columns="args"))
        assert list(sliced[1][0]["args"]) == list(fast[1][0]["args"])
    if fast is None or _has_huge_int(doc):
        return
    meta, (ev, threads, warnings, notes) = fast
    ref = events_frame(doc["traceEvents"], Path("f.json"), doc.get("displayTimeUnit"))
    assert ev.drop(columns="args").equals(ref[0].drop(columns="args"))
    assert list(ev["args"]) == list(ref[0]["args"])
    assert (threads, warnings, notes) == ref[1:]
    assert meta == {k: v for k, v in doc.items() if k != "traceEvents"}


def _has_nonfinite(v) -> bool:
    if isinstance(v, float):
        return not math.isfinite(v)
    if isinstance(v, dict):
        return any(_has_nonfinite(x) for x in v.values())
    if isinstance(v, list):
        return any(_has_nonfinite(x) for x in v)
    return False
