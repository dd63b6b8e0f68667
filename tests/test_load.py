"""Loader: formats seen in the field, rank detection, bad files."""

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from pardiag.analyzer.analyses.breakdown import compute_time_breakdown
from pardiag.analyzer.trace import load_traces, read_trace_json, stray_timestamps
from pardiag.errors import TraceError

from .synth import TraceBuilder, cpu_rank, gpu_rank


def test_gzip_and_plain_json_give_the_same_events(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    gpu_rank(0).write(tmp_path / "a" / "t.json")
    gpu_rank(0).write(tmp_path / "b" / "t.json.gz", gz=True)
    a = load_traces(tmp_path / "a").ranks[0].events
    b = load_traces(tmp_path / "b").ranks[0].events
    assert a.drop(columns="args").equals(b.drop(columns="args"))


@pytest.mark.parametrize("extra_ph", ["s", "Z", None])
def test_events_of_every_ph_give_the_tolerant_paths_table(extra_ph):
    """Decoding by ``ph`` (flow events read as empty structs), and the plain decode a file with a
    ``ph`` outside the trace format (or none) takes, build the table the tolerant path builds:
    complete events, ``[memory]`` instants and thread names, nothing else."""
    from pathlib import Path

    from pardiag.analyzer.trace import events_frame, parse_trace_fast

    events = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 5, "dur": 3},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 6,
         "args": {"Total Allocated": 10, "Device Type": 1}},
        {"ph": "i", "name": "other", "pid": 1, "tid": 2, "ts": 7},
        {"ph": "f", "id": 3, "pid": 1, "tid": 2, "ts": 8, "cat": "ac2g", "bp": "e"},
        {"cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 9, "dur": 1, "ph": "X",
         "args": {"stream": 7, "correlation": 4}},
        {"ph": extra_ph, "name": "x", "pid": 1, "tid": 2, "ts": 4, "dur": 1},
    ]
    if extra_ph is None:
        del events[-1]["ph"]
    doc = {"traceEvents": events, "schemaVersion": 1}
    meta, (ev, threads, warnings, notes) = parse_trace_fast(json.dumps(doc).encode(),
                                                            Path("f.json"))
    ref = events_frame(events, Path("f.json"))
    assert ev.drop(columns="args").equals(ref[0].drop(columns="args"))
    assert list(ev["args"]) == list(ref[0]["args"])
    assert (threads, warnings, notes) == ref[1:] and meta == {"schemaVersion": 1}
    assert list(ev["name"]) == ["aten::mm", "[memory]", "k"]
    assert list(ev["stream"]) == [-1, -1, 7] and list(ev["correlation"]) == [-1, -1, 4]
    assert threads == {("1", "2"): "main"}


def test_events_decoded_in_slices_give_one_slices_table(monkeypatch):
    """Events decoded a slice at a time build the table, thread names, process names, warnings
    and kept args that one slice of every event builds, and the tolerant path's, also when the
    slices take different decoders: args that are ``null`` or not objects (the decode with
    undecoded args), a ``ph`` outside the format (the plain decode), a thread renamed in a later
    slice, numbers written as strings."""
    from pathlib import Path

    from pardiag.analyzer.trace import decode, events_frame
    from pardiag.analyzer.trace.parse import PROCESS_NAMES_KEY

    events = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}},
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "rank 0"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 5, "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": "nccl:all_reduce", "pid": 1, "tid": 2, "ts": 6,
         "dur": 1, "args": {"Collective name": "allreduce", "In msg nelems": 4}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 9, "dur": 1,
         "args": None},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 6,
         "args": {"Total Allocated": 10, "Device Type": 1}},
        {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": "11", "dur": 1,
         "args": "not an object"},
        {"ph": "f", "id": 3, "pid": 1, "tid": 2, "ts": 8, "cat": "ac2g", "bp": "e"},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "renamed"}},
        {"ph": "M", "name": "process_labels", "pid": 1, "args": {"labels": "GPU 0"}},
        {"ph": "Z", "name": "x", "pid": 1, "tid": 2, "ts": 4, "dur": 1},
        {"cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 7, "ts": 12, "dur": 2,
         "ph": "X", "args": {"stream": 7, "correlation": 4, "sycl queue": 2}},
        {"ph": "X", "cat": "cpu_op", "name": "late", "pid": 1, "ts": 13},
    ]
    raw = json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}).encode()
    path = Path("f.json")
    results = []
    for size in (1, 2, 3, 5, len(events)):
        monkeypatch.setattr(decode, "SLICE_EVENTS", size)
        results.append(decode.parse_trace_fast(raw, path))
    ref = events_frame(events, path, "ms")
    for meta, (ev, threads, warnings, notes) in results:
        assert ev.drop(columns="args").equals(ref[0].drop(columns="args"))
        assert list(ev["args"]) == list(ref[0]["args"])
        assert (threads, warnings, notes) == ref[1:]
        assert meta == {"displayTimeUnit": "ms",
                        PROCESS_NAMES_KEY: {"1": ["rank 0", "GPU 0"]}}
    assert threads == {("1", "2"): "renamed"}
    assert list(ev["name"]) == ["aten::mm", "nccl:all_reduce", "[memory]", "k", "k2",
                                "ncclKernel_AllReduce"]
    assert list(ev["stream"]) == [-1, -1, -1, 7, 7, 7]
    kept = dict(zip(ev["name"], ev["args"]))
    assert kept["nccl:all_reduce"] == {"Collective name": "allreduce", "In msg nelems": 4}
    assert kept["[memory]"] == {"Total Allocated": 10, "Device Type": 1}
    assert kept["ncclKernel_AllReduce"]["correlation"] == 4 and kept["k"] is None
    assert any("1 ts/dur values are strings" in w for w in warnings)
    assert any("left out 1 events" in w and "(1 without dur)" in w for w in warnings)


def test_an_entry_that_is_not_an_object_in_any_slice_takes_the_tolerant_path(monkeypatch):
    from pathlib import Path

    from pardiag.analyzer.trace import decode, parse

    monkeypatch.setattr(decode, "SLICE_EVENTS", 2)
    ok = {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 2, "ts": 5, "dur": 3}
    holder = [json.dumps({"traceEvents": [ok, ok, ok, 7]}).encode()]
    assert decode.parse_trace_fast(holder, Path("f.json")) is None
    assert len(holder) == 1  # the bytes are left for the tolerant path
    t = parse.events_frame([ok, ok, ok, 7], Path("f.json"))
    assert len(t[0]) == 3 and "left out 1 traceEvents entries that are not objects" in t[2][0]


def test_legacy_format_categories_and_stream_tids(tmp_path):
    doc = {"traceEvents": [
        {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1,
         "dur": 1, "args": {"correlation": 9}},
        {"ph": "X", "cat": "Kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": "stream 7",
         "ts": 10, "dur": 20, "args": {"correlation": 9}},
        {"ph": "X", "cat": "Kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 0,
         "tid": "stream 13", "ts": 20, "dur": 20},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": "stream 7", "ts": 40,
         "dur": 5},
    ], "distributedInfo": {"rank": 0}}
    (tmp_path / "legacy.json").write_text(json.dumps(doc))
    t = load_traces(tmp_path).ranks[0]
    ev = t.events.set_index("name")
    assert ev.loc["volta_sgemm_128x64_nn", "cat"] == "kernel"
    assert ev.loc["volta_sgemm_128x64_nn", "stream"] == 7
    assert ev.loc["ncclKernel_AllReduce_RING_LL_Sum_float", "stream"] == 13
    assert ev.loc["aten::mm", "cat"] == "cpu_op"
    assert ev.loc["Memcpy HtoD", "cat"] == "gpu_memcpy"
    tot = compute_time_breakdown(load_traces(tmp_path)).totals.iloc[0]
    assert (tot.compute_us, tot.comm_us, tot.overlap_us, tot.span_us) == (20.0, 20.0, 10.0, 35.0)


def test_newest_format_fractional_relative_ts(tmp_path):
    b = TraceBuilder(rank=0)
    b.kernel("k1", 88437691101.749, 0.02)
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 88437691101.759, 0.02, stream=2)
    d = b.doc()
    d["baseTimeNanoseconds"] = 1775078550000000000
    (tmp_path / "t.json").write_text(json.dumps(d))
    t = load_traces(tmp_path).ranks[0]
    assert t.metadata["baseTimeNanoseconds"] == 1775078550000000000
    tot = compute_time_breakdown(load_traces(tmp_path)).totals.iloc[0]
    # float64 resolves ~1.5e-5 µs at 8.8e10 µs: the values are as exact as the file allows
    assert tot.overlap_us == pytest.approx(0.01, abs=1e-4)
    assert tot.overlap_pct == pytest.approx(50.0, abs=0.5)


def test_bare_inf_nan_tokens_and_control_characters(tmp_path):
    text = ('{"distributedInfo": {"rank": 0}, "traceEvents": ['
            '{"ph": "X", "cat": "kernel", "name": "gemm\x01\x07", "pid": 0, "tid": 7, "ts": 10,'
            ' "dur": 5, "args": {"stream": 7, "est. achieved occupancy %": inf, "x": NaN}},'
            '{"ph": "X", "cat": "kernel", "name": "name with inf, nan inside", "pid": 0, "tid": 7,'
            ' "ts": 20, "dur": -inf},'
            '{"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 30,'
            ' "dur": Infinity}'
            ']}')
    p = tmp_path / "t.json"
    p.write_text(text)
    ts = load_traces(tmp_path)
    ev = ts.ranks[0].events
    assert list(ev["name"]) == ["gemm\x01\x07"]
    assert any("left out 2 events" in w for w in ts.warnings)
    # string contents are untouched by the inf/nan repair
    assert "name with inf, nan inside" in json.dumps(read_trace_json(p))


@pytest.mark.parametrize("closed", [True, False])
def test_the_json_array_form_is_read_as_its_events(tmp_path, closed):
    """The trace format's JSON Array form: a bare list of events (some merge tools write it),
    whose closing bracket may be left out. Its events are read, with a warning that no
    metadata came with them; the breakdown is the object form's."""
    events = gpu_rank(None).events
    text = json.dumps(events)
    if not closed:
        text = text.rstrip("]") + ",\n"
    (tmp_path / "a" / "t.json").parent.mkdir()
    (tmp_path / "a" / "t.json").write_text(text)
    (tmp_path / "o" / "t.json").parent.mkdir()
    (tmp_path / "o" / "t.json").write_text(json.dumps({"traceEvents": events}))
    got, want = load_traces(tmp_path / "a"), load_traces(tmp_path / "o")
    assert len(got.ranks[0].events) == len(want.ranks[0].events) == 14
    said = [w for w in got.warnings if "JSON Array form" in w]
    assert said and "without the metadata" in said[0], got.warnings
    assert any("closing bracket left out" in w for w in got.warnings) is not closed
    assert not [w for w in got.warnings if "not strict JSON" in w], got.warnings
    a = compute_time_breakdown(got).totals.iloc[0]
    b = compute_time_breakdown(want).totals.iloc[0]
    assert (a["compute_us"], a["exposed_comm_us"]) == (b["compute_us"], b["exposed_comm_us"])

def test_invalid_utf8_is_replaced_not_fatal(tmp_path):
    data = json.dumps(gpu_rank(0).doc()).encode().replace(b"gemm_kernel", b"gemm\xff\xfekernel", 1)
    (tmp_path / "t.json").write_bytes(data)
    names = list(load_traces(tmp_path).ranks[0].events["name"])
    assert "gemm\ufffd\ufffdkernel<float>(float*)" in " ".join(names)


def test_zero_timestamp_events_left_out_with_warning(tmp_path):
    b = gpu_rank(0)
    base = 1_694_128_201_000_000
    for e in b.events:
        if "ts" in e:
            e["ts"] += base
    b.events.append({"ph": "X", "cat": "kernel", "name": "void gemm_kernel<float>(float*)",
                     "pid": 0, "tid": 7, "ts": 0, "dur": 0, "args": {"stream": 7}})
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::zero", "pid": 100, "tid": 1,
                     "ts": 0, "dur": 0})
    b.write(tmp_path / "t.json")
    ts = load_traces(tmp_path)
    assert [w.split(": ", 1)[1] for w in ts.warnings if "stray timestamps" in w] == [
        "left out 2 events with stray timestamps (2 at ts 0 µs), far from the other 14 "
        f"(ts {base}–{base + 140} µs)"]
    tot = compute_time_breakdown(ts).totals.iloc[0]
    assert tot.span_us == 200.0 and tot.overlap_us == 30.0


def _stray(ts, dur=None):
    ts = np.asarray(ts, dtype=float)
    mask, where = stray_timestamps(ts, np.zeros(len(ts)) if dur is None else np.asarray(dur, float))
    return np.flatnonzero(mask).tolist(), where


EPOCH = 1_700_000_000_000_000.0


def test_stray_timestamps_rule():
    # a minority at ts 0 among epoch times, and a majority at ts 0 beside an epoch minority
    assert _stray([0, 0, EPOCH, EPOCH + 10]) == ([0, 1], "2 at ts 0 µs")
    assert _stray([0] * 10 + [EPOCH, EPOCH + 5e6]) == (list(range(10)), "10 at ts 0 µs")
    # mostly epoch, a few decades off (either side)
    bulk = [EPOCH + i * 1e5 for i in range(50)]
    assert _stray(bulk + [EPOCH + 3e16, 1e12]) == ([50, 51], "1 at ts 1000000000000 µs, "
                                                   "1 at ts 31700000000000000 µs")
    # relative timestamps (newest format) with a few at epoch times; one at exactly 0 is real
    rel = [i * 1e5 for i in range(50)]
    assert _stray(rel + [EPOCH, EPOCH + 1]) == (
        [50, 51], "2 at ts 1700000000000000–1700000000000001 µs")
    # two profiler windows 5 s apart, and 40 minutes apart: one trace, nothing stray
    assert _stray(rel + [5e6 + t for t in rel]) == ([], "")
    assert _stray(rel + [2.4e9 + t for t in rel]) == ([], "")
    # a duration of years is stray too; everything at 0 is kept
    assert _stray([EPOCH, EPOCH + 1, EPOCH + 2], [1, 1, 1e15]) == ([2], "1 lasting up to "
                                                                   "1000000000000000 µs")
    assert _stray([0, 0, 0]) == ([], "")
    assert _stray([0], [EPOCH]) == ([0], "1 lasting up to 1700000000000000 µs")


@pytest.mark.parametrize("gz", [False, True])
def test_stray_timestamps_left_out_on_both_parse_paths(tmp_path, gz):
    """A trace mostly at ts 0 with the real events at epoch times: the same table from the fast
    (strict JSON) and the tolerant (bare NaN token) path, one warning, a span of µs not years."""
    b = cpu_rank(0)
    for e in b.events:
        if "ts" in e:
            e["ts"] += EPOCH
    for _ in range(30):
        b.cpu("aten::empty", 0, 0)
    b.cpu("aten::late", EPOCH + 4e16, 5)
    for d in ("strict", "loose"):
        (tmp_path / d).mkdir()
    b.write(tmp_path / "strict" / "rank0.json", gz=gz)
    # a bare NaN token: not strict JSON, so this one takes the tolerant path
    loose = json.dumps(b.doc()).replace('"schemaVersion": 1', '"schemaVersion": 1, "x": NaN')
    assert "NaN" in loose
    (tmp_path / "loose" / "rank0.json").write_bytes(loose.encode())
    a, c = load_traces(tmp_path / "strict"), load_traces(tmp_path / "loose")
    pd.testing.assert_frame_equal(a.ranks[0].events, c.ranks[0].events)
    for t in (a, c):
        stray = [w for w in t.warnings if "stray timestamps" in w]
        assert len(stray) == 1 and "left out 31 events with stray timestamps (30 at ts 0 µs, " \
            "1 at ts 41700000000000000 µs)" in stray[0]
        tot = compute_time_breakdown(t).totals.iloc[0]
        assert tot.span_us == 100.0 and tot.comm_us == 35.0


def test_same_stream_overlap_is_clipped(tmp_path):
    b = TraceBuilder(rank=0)
    b.kernel("k1", 0, 10, stream=7)
    b.kernel("k2", 9.998, 10.002, stream=7)   # starts 2 ns before k1 ends
    b.kernel("k3", 5, 10, stream=8)           # other stream: untouched
    b.kernel("k4", 100, 100, stream=7)        # runs 50 µs past k5's start
    b.kernel("k5", 150, 10, stream=7)
    b.write(tmp_path / "t.json")
    t = load_traces(tmp_path).ranks[0]
    ev = t.events.set_index("name")
    assert ev.loc["k1", "ts"] == 0.0 and ev.loc["k1", "dur"] == pytest.approx(9.998)
    assert ev.loc["k2", "ts"] == 9.998 and ev.loc["k2", "dur"] == pytest.approx(10.002)
    assert ev.loc["k3", "ts"] == 5.0 and ev.loc["k3", "dur"] == 10.0
    assert (ev.loc["k4", "ts"], ev.loc["k4", "dur"]) == (100.0, 50.0)
    assert (ev.loc["k5", "ts"], ev.loc["k5", "dur"]) == (150.0, 10.0)
    assert any("clipped 2 same-stream" in n and "by up to 50.000" in n for n in t.notes)


def test_stream_whose_kernels_ran_at_once_is_kept_whole(tmp_path):
    # every kernel on stream 0, as ROCm traces record them: the all-reduce ran beside the gemm
    b = TraceBuilder(rank=0)
    b.kernel("ncclDevKernel_Generic", 0, 5000, stream=0)
    b.kernel("gemm", 1000, 2000, stream=0)       # starts 4,000 µs before the all-reduce ends
    b.kernel("relu", 3001, 100, stream=0)
    b.kernel("k1", 0, 10, stream=7)              # a serial stream: 2 µs of overlap clipped
    b.kernel("k2", 8, 10, stream=7)
    b.write(tmp_path / "t.json")
    t = load_traces(tmp_path).ranks[0]
    ev = t.events.set_index("name")
    assert ev.loc["ncclDevKernel_Generic", "dur"] == 5000.0 and ev.loc["gemm", "dur"] == 2000.0
    assert ev.loc["k1", "dur"] == 8.0
    path = tmp_path / "t.json"
    assert t.notes == (
        f"{path}: clipped 1 same-stream GPU events that ran past the next one's start (by up to "
        f"2.000 µs)",
        f"{path}: kept 1 GPU events that overlap the next one on their stream as recorded (by "
        f"up to 4000.000 µs, on stream 0 of process 0): such a stream holds kernels of several "
        f"queues, which ran at once")
    tot = compute_time_breakdown(load_traces(tmp_path)).totals.iloc[0]
    # overlapped: gemm 2,000 + relu 100 + k1 and k2 (stream 7, [0, 18)) 18
    assert (tot.comm_us, tot.overlap_us) == (5000.0, 2118.0)


def test_rank_from_distributed_info_then_file_name_then_assigned(tmp_path):
    TraceBuilder(rank=5).write(tmp_path / "whatever.json")
    TraceBuilder(rank=None).write(tmp_path / "worker3_step_12.pt.trace.json")
    TraceBuilder(rank=None).write(tmp_path / "rank-7.json.gz", gz=True)
    TraceBuilder(rank=None).write(tmp_path / "trace.json")
    ts = load_traces(tmp_path)
    src = {r: (t.path.name, t.rank_source) for r, t in ts.ranks.items()}
    assert src == {0: ("trace.json", "assigned"), 3: ("worker3_step_12.pt.trace.json", "file name"),
                   5: ("whatever.json", "distributedInfo"), 7: ("rank-7.json.gz", "file name")}
    assert any("trace.json: no rank" in w and "treated as rank 0" in w for w in ts.warnings)


def test_files_claiming_one_rank_at_the_same_time_invent_no_rank(tmp_path):
    # three files say distributedInfo.rank 0 and overlap in time: not windows of one process.
    # The one whose name gives a free rank takes it; the copy is left out, never a new rank.
    TraceBuilder(rank=0).write(tmp_path / "a.json")
    TraceBuilder(rank=0).write(tmp_path / "b.json")
    TraceBuilder(rank=0).write(tmp_path / "c_rank4.json")
    ts = load_traces(tmp_path)
    assert sorted(ts.ranks) == [0, 4]
    assert {r: t.path.name for r, t in ts.ranks.items()} == {0: "a.json", 4: "c_rank4.json"}
    assert ts.ranks[4].rank_source == "file name"
    assert sum("b.json: rank 0 is already held by a.json" in w and "left out" in w
               for w in ts.warnings) == 1


def test_copies_claiming_one_rank_take_the_ranks_their_names_give(tmp_path):
    """Copies of one rank's trace (every one says distributedInfo.rank 1) named rank0..rank3: the
    file whose name agrees with the claim keeps rank 1, each other file takes the free rank its
    name gives, rank0's copy included (it came first in file order, and used to keep rank 1 and
    push rank1's own file out)."""
    for i in range(4):
        TraceBuilder(rank=1).write(tmp_path / f"rank{i}.json")
    ts = load_traces(tmp_path)
    assert {r: (t.path.name, t.rank_source) for r, t in ts.ranks.items()} == {
        0: ("rank0.json", "file name"), 1: ("rank1.json", "distributedInfo"),
        2: ("rank2.json", "file name"), 3: ("rank3.json", "file name")}
    assert not any("left out" in w for w in ts.warnings)
    assert any("rank0.json: rank 1 from distributedInfo is also claimed by rank1.json" in w
               and "using rank 0 from the file name" in w for w in ts.warnings)


def test_non_trace_files_are_skipped_with_a_warning(tmp_path):
    gpu_rank(0).write(tmp_path / "rank0.json")
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "broken.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [')[:-6])
    ts = load_traces(tmp_path)
    assert list(ts.ranks) == [0]
    assert any("config.json: not a Kineto trace" in w for w in ts.warnings)
    assert any("broken.json.gz" in w and "skipped" in w for w in ts.warnings)
    assert not any("notes.txt" in w for w in ts.warnings)


@pytest.mark.parametrize("setup,message", [
    (lambda d: None, "no trace files"),
    (lambda d: (d / "x.json").write_text("[1, 2]"),
     r"none of 1 file\(s\) is a readable Kineto trace"
     r" \(e\.g\. .*x\.json: not a Kineto trace"),
    (lambda d: (d / "x.json").write_text(""), r"none of 1 file\(s\) .*x\.json: empty file"),
])
def test_folder_without_readable_traces_is_an_error(tmp_path, setup, message):
    setup(tmp_path)
    with pytest.raises(TraceError, match=message):
        load_traces(tmp_path)


def test_explicit_bad_file_is_an_error_naming_it(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": []}')[:10])
    with pytest.raises(TraceError, match=r"t\.json\.gz: truncated or corrupt gzip"):
        load_traces(p)
    q = tmp_path / "t2.json"
    q.write_text('{"traceEvents": [')
    with pytest.raises(TraceError, match=r"t2\.json: truncated \(the file ends inside"):
        load_traces(q)
    with pytest.raises(TraceError, match="no such file or folder"):
        load_traces(tmp_path / "missing")


@pytest.mark.parametrize("inflate", ["isal", "gzip"])
def test_gzip_inflated_alike_with_or_without_isal(monkeypatch, inflate):
    """ISA-L's inflate (where installed) and Python's zlib/gzip give the bytes Python's
    ``gzip.decompress`` gives, for one member (one pass) and for several members (the gzip
    module's reading), and the same error for a truncated or corrupt file, a wrong CRC or
    length, and bytes after the member."""
    import zlib
    from pathlib import Path

    from pardiag.analyzer.trace import parse

    if inflate == "gzip":
        monkeypatch.setattr(parse, "_inflater", zlib)
        monkeypatch.setattr(parse, "_gunzip_members", gzip.decompress)
        monkeypatch.setattr(parse, "_GUNZIP_ERRORS", ())
    else:
        pytest.importorskip("isal")
        assert parse._inflater is not zlib
    body = json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}] * 50}).encode()
    one = gzip.compress(body)
    two = gzip.compress(body[:100]) + gzip.compress(body[100:])
    assert parse.plain_bytes(one, Path("t.json.gz")) == body
    assert parse.plain_bytes(two, Path("t.json.gz")) == body
    crc = one[:-8] + bytes([one[-8] ^ 1]) + one[-7:]
    size = one[:-4] + bytes([one[-4] ^ 1]) + one[-3:]
    for bad in (two[:30], two[:2] + b"\x00" * 40, crc, size, one + b"junk"):
        with pytest.raises((OSError, EOFError, zlib.error)):   # Python's gzip refuses it
            gzip.decompress(bad)
        with pytest.raises(TraceError, match=r"t\.json\.gz: truncated or corrupt gzip"):
            parse.plain_bytes(bad, Path("t.json.gz"))
    with pytest.raises(TraceError, match=r"t\.json\.gz: truncated or corrupt gzip \(4 bytes after "
                                         r"the end of the compressed data are not another gzip "
                                         r"member\)"):
        parse.plain_bytes(one + b"junk", Path("t.json.gz"))
    assert parse.plain_bytes(one + b"\x00" * 7, Path("t.json.gz")) == body  # zero padding
    with pytest.raises(TraceError, match="empty file"):
        parse.plain_bytes(gzip.compress(b" \n\t "), Path("t.json.gz"))


def test_list_of_files(tmp_path):
    a = gpu_rank(0).write(tmp_path / "a.json")
    b = gpu_rank(1).write(tmp_path / "b.json")
    assert sorted(load_traces([a, b]).ranks) == [0, 1]


def test_negative_ts_huge_numbers_and_missing_dur_are_left_out(tmp_path):
    b = gpu_rank(0)
    b.events.append({"ph": "X", "cat": "kernel", "name": "neg", "pid": 0, "tid": 7, "ts": -100,
                     "dur": 3, "args": {"stream": 7}})
    b.events.append({"ph": "X", "cat": "kernel", "name": "nodur", "pid": 0, "tid": 7, "ts": 5})
    b.events.append("not an event")
    text = json.dumps(b.doc()).replace('"traceEvents": [', '"traceEvents": [{"ph": "X", "cat": '
                                       '"kernel", "name": "huge", "pid": 0, "tid": 7, "ts": 1'
                                       + "0" * 400 + ', "dur": 1},', 1)
    (tmp_path / "t.json").write_text(text)
    ts = load_traces(tmp_path)
    names = set(ts.ranks[0].events["name"])
    assert not names & {"neg", "nodur", "huge"}
    assert any("left out 3 events" in w and "(1 without dur)" in w for w in ts.warnings)
    assert any("1 traceEvents entries that are not objects" in w for w in ts.warnings)
    tot = compute_time_breakdown(ts).totals.iloc[0]
    assert (tot.span_us, tot.overlap_us) == (200.0, 30.0)


def test_bom_same_file_twice_and_subfolder_hint(tmp_path):
    p = gpu_rank(0).write(tmp_path / "t.json")
    p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
    assert list(load_traces([p, p, tmp_path / "." / "t.json"]).ranks) == [0]
    nested = tmp_path / "outer"
    (nested / "inner").mkdir(parents=True)
    gpu_rank(0).write(nested / "inner" / "r.json")
    # the one subfolder that holds traces is read, and said
    got = load_traces(nested)
    assert list(got.ranks) == [0]
    assert got.warnings[0] == f"{nested}: no trace files of its own; read its one subfolder " \
                              f"that holds some, inner"
    (nested / "inner" / "r.json").write_text('{"settings": 1}')   # no trace there: the hint
    with pytest.raises(TraceError, match="subfolders hold some: .*inner"):
        load_traces(nested)


def test_a_config_beside_the_traces_subfolder_is_skipped_and_the_subfolder_read(tmp_path):
    """A run folder holding its config.json and a traces/ subfolder: the config is no trace,
    so the folder holds none of its own, and its one subfolder of traces is read."""
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    gpu_rank(0).write(run / "traces" / "r0.json")
    gpu_rank(1).write(run / "traces" / "r1.json")
    (run / "config.json").write_text('{"lr": 0.1}')
    got = load_traces(run)
    assert list(got.ranks) == [0, 1]
    assert got.warnings[:2] == (
        f"{run}: no trace files of its own; read its one subfolder that holds some, traces",
        f"{run / 'config.json'}: not a Kineto trace (no traceEvents list) - skipped")
    # a trace that cannot be read is the news, not the subfolder
    (run / "broken.json").write_text('{"traceEvents": [{"ph": "X", "ts": ')
    with pytest.raises(TraceError, match="none of 2 file"):
        load_traces(run)


@pytest.mark.parametrize("doc", [
    b'{"a": 1, "traceEvents": [ {"ph": "X"} ,{"ph": "M"}\n] , "b": [1, {"c": "]"}]}',
    b'{"traceEvents":[{"x":1}]}',
    b'{"meta": {"traceEvents": [5]}, "traceEvents": [{"x": "[ ]"}], "z": null}',
    b'{"traceEvents": [{"x": 1}], "traceEvents": [{"y": 2}]}',
    b'{"traceEvents": [], "a": 2}',
    b'{"a": 2}',
    b'{"traceEvents": [1, "two"], "deviceProperties": [{"id": 0}]}',
])
def test_one_pass_split_of_a_document_equals_decoding_its_top_level_first(doc):
    """The event list split while the document's other keys are skipped, and those keys read
    from the document with the list cut out, are what decoding the top level and then the list
    give."""
    from pardiag.analyzer.trace import decode

    top = decode._TOP_DECODER.decode(doc)
    got = decode._split_document(doc)
    if "traceEvents" not in top:
        assert got is None
        return
    want = ({k: bytes(v) for k, v in top.items() if k != "traceEvents"},
            [bytes(r) for r in decode._RAW_LIST_DECODER.decode(top["traceEvents"])])
    assert ({k: bytes(v) for k, v in got[0].items()}, [bytes(r) for r in got[1]]) == want


def test_events_that_are_not_views_of_the_document_are_not_cut_out():
    import msgspec

    from pardiag.analyzer.trace import decode

    doc = b'{"a": 1, "traceEvents": [{"x": 1}]}'
    assert decode._without_events(doc, [msgspec.Raw(b'{"x": 1}')]) is None
    views = decode._TOP_EVENTS_DECODER.decode(doc).traceEvents
    assert {k: bytes(v) for k, v in decode._without_events(doc, views).items()} == {"a": b"1"}


def test_gpu_streams_from_integer_stream_args_equal_the_per_event_reading():
    """The stream of each GPU event: its integer ``stream`` arg read for all of them at once,
    else (an arg missing, not an integer, beyond 64 bits) event by event: the ``stream`` arg,
    the ``sycl queue`` arg, an integer tid, a ``"stream N"`` tid."""
    import numpy as np

    from pardiag.analyzer.trace.columns import MISSING as _MISSING
    from pardiag.analyzer.trace.columns import _gpu_streams

    gpu = np.array([True, False, True, True])
    tid = [7, 1, "stream 9", 3]
    cases = [
        ([5, _MISSING, 6, 8], [_MISSING] * 4, [5, -1, 6, 8]),         # all integers
        ([5, _MISSING, _MISSING, 8], [_MISSING, _MISSING, 2, _MISSING], [5, -1, 2, 8]),
        ([_MISSING, 1, _MISSING, True], [_MISSING] * 4, [7, -1, 9, 3]),  # tids: a bool is no stream
        ([2 ** 70, 0, 6, 8], [_MISSING] * 4, [7, -1, 6, 8]),           # beyond int64: the tid
    ]
    for stream, queue, want in cases:
        assert _gpu_streams(gpu, stream, queue, tid).tolist() == want


def test_a_kernel_whose_end_runs_far_past_the_host_is_clipped_even_on_a_shared_stream(tmp_path):
    """A kernel whose recorded end runs 1.6 s past the next kernel on its stream and past the
    host's last event by far more than a profiler step has a corrupted end: it is clipped to
    the next kernel's start, also on a stream kept whole because kernels of several queues ran
    at once there (ROCm's stream 0); the steps stay 300 µs."""
    b = TraceBuilder(rank=0)
    for i in range(3):
        b.step(i, 300 * i, 300)
        b.cpu("aten::mm", 300 * i + 10, 50)
    b.kernel("ncclDevKernel_Generic", 0, 250, stream=0)   # beside the gemm: kept whole
    b.kernel("gemm", 50, 100, stream=0)
    b.kernel("bad", 400, 1_600_000, stream=0)             # the corrupted end
    b.kernel("relu", 450, 40, stream=0)
    b.kernel("late", 700, 50, stream=0)
    b.write(tmp_path / "t.json")
    t = load_traces(tmp_path).ranks[0]
    ev = t.events.set_index("name")
    assert ev.loc["ncclDevKernel_Generic", "dur"] == 250.0 and ev.loc["gemm", "dur"] == 100.0
    assert ev.loc["bad", "dur"] == 50.0 and ev.loc["relu", "dur"] == 40.0
    path = tmp_path / "t.json"
    assert t.notes[0] == (
        f"{path}: clipped 1 GPU event(s) whose recorded end ran past the next event on their "
        f"stream and past the host's last event by more than a profiler step (by up to 1.600 s "
        f"past the next one's start): a corrupted end, not concurrent work")
    assert any("kept 1 GPU events that overlap the next one on their stream as recorded" in n
               for n in t.notes)
    # the rank's timeline ends with its last step at 1,000 µs (from its first kernel at 700, as
    # long as its host step), not 1.6 s later
    assert compute_time_breakdown(load_traces(tmp_path)).totals.iloc[0].span_us == 1000.0


def test_loose_files_recorded_seconds_apart_are_two_runs(tmp_path):
    """rank0 of one run and rank1 of another, on one host, 3.8 s apart (as two sample runs of
    this repository were): their windows overlap nowhere, so they are not one job's ranks; the
    same files in one job's time, and one rank's two windows far apart, load."""
    from pardiag.errors import TraceError

    def rank(r, t0, host="vm"):
        b = TraceBuilder(rank=r)
        b.step(1, t0, 50_000).cpu("aten::mm", t0 + 10, 100)
        doc = b.doc()
        doc.update(host_name=host, baseTimeNanoseconds=1_790_857_026_000_000_000)
        return doc

    def write(folder, docs):
        folder.mkdir()
        for i, d in enumerate(docs):
            (folder / f"rank{i}.json").write_text(json.dumps(d))
        return folder

    apart = write(tmp_path / "apart", [rank(0, 5_114_143_245_633), rank(1, 5_114_147_046_524)])
    with pytest.raises(TraceError) as e:
        load_traces(apart)
    assert str(e.value) == (
        f"{apart / 'rank0.json'} (rank 0) and {apart / 'rank1.json'} (rank 1) were profiled "
        "3.8 s apart on vm's clock, their windows overlapping nowhere (the longest lasts 50.0 "
        "ms): they are different runs, not ranks of one job; to analyse them as one anyway, "
        "pass --mixed-runs; to set two runs side by side, pardiag compare A B")
    assert len(load_traces(apart, mixed_runs=True).ranks) == 2
    # one job: the ranks' windows overlap
    together = write(tmp_path / "together", [rank(0, 5_114_143_245_633),
                                             rank(1, 5_114_143_245_900)])
    assert len(load_traces(together).ranks) == 2
    # other hosts, 3.8 s apart: within what unsynchronized clocks may differ, not refused
    hosts = write(tmp_path / "hosts", [rank(0, 5_114_143_245_633, "a"),
                                       rank(1, 5_114_147_046_524, "b")])
    assert len(load_traces(hosts).ranks) == 2


def test_no_trace_hints_say_what_the_folder_is(tmp_path):
    """A run's metadata folder (or a file in it) points to the run folder that holds the
    traces; a run interrupted before its window ended says so instead of advising more
    steps."""
    from pardiag import layout

    from .synth import write_sidecar

    run = tmp_path / "run"
    (run / layout.SIDECAR_DIR).mkdir(parents=True)
    gpu_rank(0).write(run / "rank0.trace.json")
    meta_dir = run / layout.SIDECAR_DIR
    write_sidecar(meta_dir / "run.json", "run", None, {"command": "pardiag profile t.py",
                                                      "world_size": 1, "exit_code": 0})
    for target, what in ((meta_dir, "pardiag's metadata folder of the run"),
                         (meta_dir / "run.json", "one of pardiag's own files of the run")):
        with pytest.raises(TraceError) as err:
            load_traces(target)
        assert str(err.value) == (f"{target}: {what} {run}, not a trace: report the run "
                                  f"folder (pardiag report {run})")
    # a monitored run's (no trace, a monitor file) and its files too
    mon = tmp_path / "mon"
    (mon / layout.SIDECAR_DIR).mkdir(parents=True)
    layout.monitor_path(mon, 0).write_bytes(b"")
    layout.capture_request_path(mon).write_text("{}")
    for target in (mon / layout.SIDECAR_DIR, layout.monitor_path(mon, 0),
                   layout.capture_request_path(mon)):
        with pytest.raises(TraceError, match=rf"not a trace: report the run folder \(pardiag "
                                             rf"report {mon}\)$"):
            load_traces(target)
    stopped = tmp_path / "stopped"
    (stopped / layout.SIDECAR_DIR).mkdir(parents=True)
    write_sidecar(stopped / layout.SIDECAR_DIR / "run.json", "run", None, {
        "command": "pardiag profile t.py", "world_size": 2, "exit_code": 130})
    with pytest.raises(TraceError) as err:
        load_traces(stopped)
    assert str(err.value).endswith("; the profiled run was interrupted (Ctrl-C) before its "
                                   "profiling window ended, so no trace was written")


def test_files_of_one_rank_from_other_processes_are_two_runs(tmp_path):
    """Two files of rank 0 apart in time are its two profiling windows when one process
    recorded both (a repeating schedule); recorded by other processes (a log folder that
    gathered two jobs' traces), they are two runs: one line naming both files and compare
    (--mixed-runs reads them as one anyway)."""
    from .synth import TraceBuilder

    def window(path, pid, t0):
        b = TraceBuilder(rank=0, world_size=1, pid=pid, main_tid=pid)
        b.thread_name(pid, f"thread {pid} (python3)")
        b.step(1, t0, 1000)
        b.cpu("aten::mm", t0 + 10, 500)
        b.write(path)

    same = tmp_path / "same"
    same.mkdir()
    window(same / "worker0.1.pt.trace.json", 4242, 0)
    window(same / "worker0.2.pt.trace.json", 4242, 50_000)
    traces = load_traces(same, cache=False)
    assert any("2 files are 2 profiling windows of that rank" in w for w in traces.warnings)
    other = tmp_path / "other"
    other.mkdir()
    window(other / "worker0.1.pt.trace.json", 4242, 0)
    window(other / "worker0.2.pt.trace.json", 5151, 50_000)
    with pytest.raises(TraceError) as err:
        load_traces(other, cache=False)
    assert str(err.value) == (
        f"{other / 'worker0.1.pt.trace.json'} and {other / 'worker0.2.pt.trace.json'} both hold "
        "rank 0 but were recorded by other processes 4242 and 5151: they are different runs, not "
        "profiling windows of one; to analyse them as one anyway, pass --mixed-runs; to set two "
        "runs side by side, pardiag compare A B")
    assert len(load_traces(other, cache=False, mixed_runs=True).ranks) == 1


def _three_allreduces(b: TraceBuilder, t0: float, late_us: float) -> dict:
    """``b``'s document: three 1 ms profiler steps from ``t0`` (µs), each a 400 µs gemm and an
    all-reduce (record with ``Seq``) that the rank reaches ``late_us`` after 420 µs and that
    ends at 600 µs on every rank."""
    for k in range(3):
        s = t0 + 1_000 * k
        b.step(k + 1, s, 1_000)
        b.kernel("volta_sgemm_128x64_nn", s + 10, 400, launch_ts=s + 5)
        arrive = s + 420 + late_us
        b.cpu("record_param_comms", arrive - 8, 4, args={
            "Collective name": "allreduce", "Process Group Name": "0",
            "Process Group Ranks": "[0, 1]", "Group size": 2, "Seq": str(k + 1),
            "dtype": "Float", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20})
        b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 arrive, s + 600 - arrive, stream=20, launch_ts=arrive - 6)
    return b.doc()


def test_files_that_count_from_different_zeros_share_one(tmp_path):
    """Kineto counts ``ts`` from ``baseTimeNanoseconds``, the process's start rounded down to a
    multiple of 7,889,238 s: two hosts of one job that started on either side of such a
    boundary write one instant 7,889,238 s apart. On one zero, each all-reduce ends at one
    instant on both ranks: no clock offset, and no 91-day one. The files' own bases are
    multiples of the quarter (as every real trace's is); rank 1's all-reduces arrive 30 µs
    late, so rank 1 is named. The summaries stored by a first report give the same."""
    import pardiag

    quarter_ns = 7_889_238 * 10 ** 9
    base0 = 215 * quarter_ns   # host A's processes started before the boundary, B's after it
    for r, base, t0 in ((0, base0, quarter_ns / 1e3 + 5_000), (1, base0 + quarter_ns, 5_000.0)):
        doc = _three_allreduces(TraceBuilder(rank=r), t0, late_us=30.0 if r == 1 else 0.0)
        doc["baseTimeNanoseconds"] = base
        (tmp_path / f"rank{r}.json").write_text(json.dumps(doc))
    for cache in (False, True, True):   # the raw traces, then the stored summaries
        rep = pardiag.analyze(tmp_path, cache=cache)
        offsets = rep.sync.offsets.set_index("rank")["offset_us"]
        assert offsets.abs().max() == 0.0, offsets
        assert rep.sync.straggler == 1
        assert [w for w in rep.warnings if "different zeros" in w] == [
            f"the files count their times from different zeros (baseTimeNanoseconds): "
            f"rank1.json (+7,889,238 s) put onto the earliest's, {base0}"]


def test_per_rank_bases_beside_a_merged_copy_and_a_plugin_dump_share_one_zero(tmp_path):
    """An SGLang folder: each rank's file counts from its own process's start (rank 1's base
    0.7 ms after rank 0's), the merger's copy of both beside them (pids ``[TP0r] <pid>``, times
    unchanged, rank 0's base), and an NCCL profiler plugin's dump (a bare array of async
    events, no rank). On one zero every all-reduce ends at one instant: no clock offset, rank
    1 (30 µs late) named; the merged copy adds no rank and the dump is left out, said. Before,
    the copy and the dump kept every file on its own zero: rank 1 read 700 µs off."""
    import pardiag

    base0 = 215 * 7_889_238 * 10 ** 9
    docs = []
    for r in (0, 1):
        # the same instants, counted from a base 0.7 ms later on rank 1
        doc = _three_allreduces(TraceBuilder(rank=r, pid=4000 + r, main_tid=4000 + r),
                                5_000 - 700.0 * r, late_us=30.0 if r == 1 else 0.0)
        doc["baseTimeNanoseconds"] = base0 + 700_000 * r
        (tmp_path / f"1765-TP-{r}.trace.json").write_text(json.dumps(doc))
        docs.append(doc)
    merged = dict(docs[0], traceEvents=[
        dict(e, pid=f"[TP0{r}] {e['pid']}") for r, d in enumerate(docs) for e in d["traceEvents"]])
    (tmp_path / "merged-1765.trace.json").write_text(json.dumps(merged))
    (tmp_path / "nccl_1385_0.json").write_text(json.dumps([
        {"ph": "b", "cat": "P2P", "name": "Send", "id": 1, "pid": 4000, "tid": 1, "ts": 5.0},
        {"ph": "e", "cat": "P2P", "name": "Send", "id": 1, "pid": 4000, "tid": 1, "ts": 9.0}, {}]))
    rep = pardiag.analyze(tmp_path, cache=False)
    assert sorted(rep.traces.ranks) == [0, 1]
    assert [rep.traces.ranks[r].path.name for r in (0, 1)] == [
        "1765-TP-0.trace.json", "1765-TP-1.trace.json"]
    offsets = rep.sync.offsets.set_index("rank")["offset_us"]
    assert offsets.abs().max() == 0.0, offsets
    assert rep.sync.straggler == 1
    assert [w for w in rep.warnings if "different zeros" in w] == [
        f"the files count their times from different zeros (baseTimeNanoseconds): "
        f"1765-TP-1.trace.json (+0.700 ms) put onto the earliest's, {base0}"]
    assert f"{tmp_path / 'nccl_1385_0.json'}: no timed events (complete 'X' ranges) and no " \
           f"rank in distributedInfo or its name: no rank's trace - skipped" in rep.warnings


def test_windows_of_one_process_without_a_rank_are_one_rank(tmp_path):
    """schedule(repeat=3) under tensorboard_trace_handler's default names and no
    distributedInfo (a model split over two GPUs in one process): the three files are that
    process's windows, one rank, not three."""
    for w in range(3):
        b = TraceBuilder(rank=None, pid=40211, main_tid=40211)
        b.thread_name(40211, "thread 40211 (python)")
        t = 12_000.0 * w
        b.step(10 + w, t, 10_000)
        b.kernel("gemm_kernel", t + 10, 500, launch_ts=t + 1)
        b.write(tmp_path / f"node7_40211.17610000005{13 + 12 * w}.pt.trace.json")
    ts = load_traces(tmp_path, cache=False)
    assert list(ts.ranks) == [0]
    assert len(ts.ranks[0].windows) == 3


def test_a_rank_short_of_a_window_is_said_with_the_folder_that_lacks_its_file(tmp_path):
    """torchtitan's folder per window, rank 1's file of the second window lost: rank 1 is read
    with its one window, and a line says which folder lacks its file."""
    folders = []
    for w, it in enumerate((10, 20)):
        d = tmp_path / f"iteration_{it}"
        d.mkdir()
        folders.append(d)
        for r in ((0, 1) if w == 0 else (0,)):
            b = TraceBuilder(rank=r, pid=4000 + r, main_tid=4000 + r)
            b.thread_name(4000 + r, f"thread {4000 + r} (python)")
            t = 10e6 * w
            b.step(it, t, 1000)
            b.kernel("gemm_kernel", t + 10, 500, launch_ts=t + 1)
            b.write(d / f"rank{r}_trace.json")
    ts = load_traces(folders, cache=False)
    assert [len(ts.ranks[r].windows) for r in (0, 1)] == [2, 0]
    assert "rank 1: 1 profiling window(s) where rank 0 has 2 (no file of it in iteration_20): " \
           "the steps of the other window(s) are not in its trace" in ts.warnings


def test_windows_one_process_wrote_into_folders_of_their_own_are_one_run(tmp_path):
    """torchtitan writes each profiling window to a folder of its own
    (``profile_trace/iteration_<step>/rank<r>_trace.json``). Given both folders, or their
    parent, each rank's two files were recorded by one process (its pid in both): its two
    windows, not two runs. The same folders with other processes in the second are two runs,
    refused in one line (their parent: no traces of its own, and the subfolders named)."""
    for other in (False, True):
        root = tmp_path / ("other" if other else "same")
        for w, it in enumerate((10, 20)):
            d = root / f"iteration_{it}"
            d.mkdir(parents=True)
            for r in (0, 1):
                pid = 4000 + r + (500 if other and w else 0)
                b = TraceBuilder(rank=r, pid=pid, main_tid=pid)
                b.thread_name(pid, f"thread {pid} (python)")
                t = 10e6 * w
                b.step(it - 1, t, 1000).step(it, t + 1000, 1000)
                b.kernel("gemm_kernel", t + 10, 500, launch_ts=t + 1)
                b.write(d / f"rank{r}_trace.json")
        folders = [root / "iteration_10", root / "iteration_20"]
        if other:
            with pytest.raises(TraceError, match="both hold a trace of one rank"):
                load_traces(folders, cache=False)
            # their parent: no traces of its own, subfolders that are two runs: the hint
            with pytest.raises(TraceError, match="no trace files .* subfolders hold some.*"
                                                 "read together they are refused: .*both hold"):
                load_traces(root, cache=False)
            assert sorted(load_traces(root, cache=False, mixed_runs=True).ranks) == [0, 1]
            continue
        ts = load_traces(folders, cache=False)
        assert sorted(ts.ranks) == [0, 1]
        assert [len(ts.ranks[r].windows) for r in (0, 1)] == [2, 2]
        # their parent (torchtitan's profile_trace/) reads as the same run, and says so
        whole = load_traces(root, cache=False)
        assert sorted(whole.ranks) == [0, 1]
        assert [len(whole.ranks[r].windows) for r in (0, 1)] == [2, 2]
        assert "its 2 subfolders (iteration_10, iteration_20) hold each rank's profiling " \
               "windows" in whole.warnings[0]
        assert any("(iteration_10/rank0_trace.json, iteration_20/rank0_trace.json)" in w
                   for w in whole.warnings), whole.warnings
        # the parent named beside one of its folders is not expanded: said, not passed over
        beside = load_traces([folders[0], root], cache=False)
        assert sorted(beside.ranks) == [0, 1] and not any(t.windows for t in beside.ranks.values())
        assert f"{root}: no trace files (*.json, *.json.gz) of its own; subfolders hold some: " \
               f"{folders[0]}, {folders[1]}; nothing read from it" in beside.warnings


def _rccl_rank(kernel_corr, launches: int = 3, graph: bool = False) -> TraceBuilder:
    """Three all-gathers, each ``record_param_comms`` (1 MiB of Float8_e4m3fnuz) inside
    ``nccl:_all_gather_base`` launching one RCCL kernel with ``hipExtLaunchKernel`` (ids 2, 3,
    4; ``launches`` of them), the kernels' own ids ``kernel_corr``; a GEMM tied by id 9. With
    ``graph``, a ``cudaGraphLaunch`` of id ``kernel_corr`` instead (its kernels share its
    id)."""
    b = TraceBuilder(rank=0)
    b.step(1, 0, 1000)
    for i in range(3):
        t = 100.0 + 200 * i
        b.cpu("nccl:_all_gather_base", t, 20)
        b.cpu("record_param_comms", t + 1, 5, args={
            "Collective name": "_allgather_base", "dtype": "Float8_e4m3fnuz",
            "In msg nelems": 1 << 20, "Out msg nelems": 1 << 21, "Group size": 2,
            "Process Group Ranks": "[0, 1]", "Rank": 0})
        if i < launches:
            b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "hipExtLaunchKernel",
                             "pid": b.pid, "tid": b.main_tid, "ts": t + 10, "dur": 1,
                             "args": {"correlation": 2 + i}})
        b.events.append({"ph": "X", "cat": "kernel", "pid": 0, "tid": 3, "ts": t + 30,
                         "dur": 50, "name": "ncclDevKernel_Generic(ncclDevComm*, "
                                           "channelMasks, ncclWork*)",
                         "args": {"device": 0, "stream": 3, "correlation": kernel_corr}})
    b.events.append({"ph": "X", "cat": "cuda_runtime",
                     "name": "cudaGraphLaunch" if graph else "hipLaunchKernel",
                     "pid": b.pid, "tid": b.main_tid, "ts": 700, "dur": 1,
                     "args": {"correlation": kernel_corr if graph else 9}})
    b.kernel("Cijk_Alik_Bljk_BBS_BH_MT256x256x64", 710, 100, stream=0,
             args={"correlation": kernel_corr if graph else 9})
    return b


def test_rccl_kernels_without_their_launch_ids_are_paired_with_them_in_order(tmp_path):
    """roctracer gives RCCL's kernels correlation 0 (ROCm/roctracer#100): no launch ties them,
    and their ops were read as kernels of an op of their own, without bytes. Three kernels of id
    0 and three launches that tie to no kernel, one device, each kernel after its launch: the
    k-th kernel is the k-th launch's, with a warning, and each all-gather has its bytes."""
    _rccl_rank(0).write(tmp_path / "rank0.json")
    ts = load_traces(tmp_path)
    ev = ts.ranks[0].events
    k = ev[ev["name"].str.startswith("ncclDevKernel")]
    assert k["correlation"].tolist() == [2, 3, 4]
    assert any("3 kernels carry correlation ids that tie them to no launch" in w
               for w in ts.warnings), ts.warnings
    from pardiag.analyzer.analyses.comm_events import comm_events
    c = comm_events(ts)
    assert c["op"].tolist() == ["all_gather"] * 3
    assert c["bytes"].tolist() == [2 * (1 << 20)] * 3   # the gathered buffer, fp8


@pytest.mark.parametrize("case", ["a launch lost", "a kernel of its own id", "a graph"])
def test_kernels_are_not_paired_by_order_without_the_evidence(tmp_path, case):
    """Counts that differ (a kernel whose launch the profiler lost), an unbroken id that ties to
    nothing (one kernel of id 77: no sign of broken ids), or kernels that share their CUDA
    graph launch's id: nothing is paired."""
    b = (_rccl_rank(0, launches=2) if case == "a launch lost" else
         _rccl_rank(77) if case == "a kernel of its own id" else _rccl_rank(5, graph=True))
    if case == "a kernel of its own id":   # only the first keeps 77; the others' ids differ
        ks = [e for e in b.events if e.get("cat") == "kernel" and "nccl" in e["name"]]
        for i, e in enumerate(ks):
            e["args"]["correlation"] = 77 + i
    b.write(tmp_path / "rank0.json")
    ts = load_traces(tmp_path)
    ev = ts.ranks[0].events
    before = [e["args"]["correlation"] for e in b.events
              if e.get("cat") == "kernel" and "nccl" in e["name"]]
    assert ev[ev["name"].str.startswith("ncclDevKernel")]["correlation"].tolist() == before
    assert not any("tie them to no launch" in w for w in ts.warnings)
