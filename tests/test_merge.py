"""`pardiag merge`: one Chrome trace, a process per rank, clock offsets corrected."""

import gzip
import re

import orjson
from click.testing import CliRunner

from pardiag.analyzer.analyses.sync import compute_sync
from pardiag.analyzer.render.merge import PID_STRIDE, merge_traces
from pardiag.analyzer.trace import load_traces, read_trace_json
from pardiag.cli import cli

from .paths import REPO
from .synth import TraceBuilder

SKEW_US = 500.0  # rank 2's clock runs this far ahead of ranks 0 and 1


def _rank(rank: int, shift: float) -> TraceBuilder:
    """Three ranks leave two all-reduces together (ends 600 and 900 on the true clock), arriving
    at different times; rank 2's clock reads ``shift`` µs more than the true time."""
    b = TraceBuilder(rank=rank, world_size=3, backend="gloo", pid=4000 + rank)
    b.events.append({"ph": "M", "name": "process_name", "pid": b.pid, "tid": 0,
                     "args": {"name": "python3"}})
    b.events.append({"ph": "M", "name": "process_sort_index", "pid": b.pid, "tid": 0,
                     "args": {"sort_index": b.pid}})
    b.thread_name(1, "thread 1 (python3)").thread_name(2, "thread 2 (pt_gloo_runloop)")
    b.step(1, 0 + shift, 1000)
    b.cpu("aten::mm", 10 + shift, 100 + 50 * rank)
    b.cpu("c10d::allreduce_", 200 + 10 * rank + shift, 5,
          args={"Input Dims": [[1024]], "Input type": ["float"]})
    b.cpu("gloo:all_reduce", 200 + 10 * rank + shift, 400 - 10 * rank, tid=2, cat="user_annotation")
    b.cpu("gloo:all_reduce", 700 + 30 * rank + shift, 200 - 30 * rank, tid=2, cat="user_annotation")
    b.events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                     "tid": "PyTorch Profiler", "ts": shift, "dur": 1000})
    b.events.append({"ph": "s", "id": 7, "pid": b.pid, "tid": 1, "ts": 20 + shift,
                     "cat": "fwdbwd", "name": "fwdbwd"})
    b.events.append({"ph": "f", "id": 7, "pid": b.pid, "tid": 1, "ts": 50 + shift,
                     "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"})
    return b


def _planted(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    for r in range(3):
        _rank(r, SKEW_US if r == 2 else 0.0).write(d / f"rank{r}.json")
    return d


def test_planted_offset_is_corrected_exactly(tmp_path):
    traces = load_traces(_planted(tmp_path))
    sync = compute_sync(traces)
    offsets = dict(zip(sync.offsets["rank"], sync.offsets["offset_us"]))
    assert offsets == {0: 0.0, 1: 0.0, 2: SKEW_US}
    out = tmp_path / "merged.json.gz"
    res = merge_traces(traces, offsets, out)
    assert out.read_bytes()[:2] == b"\x1f\x8b"  # gzip
    doc = read_trace_json(out)
    ev = doc["traceEvents"]
    assert res.events == len(ev) and res.dropped == 0
    assert res.pids == {r: [r * PID_STRIDE] for r in range(3)}
    # every event is Chrome-trace-format: ph, pid, tid; all but metadata have ts
    assert all({"ph", "pid", "tid"} <= set(e) for e in ev)
    assert all(isinstance(e["ts"], float | int) for e in ev if e["ph"] != "M")
    names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    # Kineto's "Spans" process is a thread of the rank's process, not a process of its own
    assert names == {0: "rank 0", 1000: "rank 1", 2000: "rank 2"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in ev if e["name"] == "process_sort_index"}
    assert sort == {p: p for p in names}
    # the all-reduces end together on the corrected clock, and rank 2 moved by exactly SKEW_US
    ends = {(e["pid"], round(e["ts"] + e["dur"], 6)) for e in ev if e["name"] == "gloo:all_reduce"}
    assert ends == {(p, t) for p in (0, 1000, 2000) for t in (600.0, 900.0)}
    steps = {e["pid"]: e["ts"] for e in ev if e["name"] == "ProfilerStep#1"}
    assert steps == {0: 0.0, 1000: 0.0, 2000: 0.0}
    # tids kept; flow ids no longer shared between ranks (id * n_ranks + index)
    assert {(e["pid"], e["tid"]) for e in ev if e["name"] == "gloo:all_reduce"} == {
        (0, 2), (1000, 2), (2000, 2)}
    flows = sorted((e["pid"], e["ph"], e["id"]) for e in ev if e["ph"] in "sf")
    assert flows == [(0, "f", 21), (0, "s", 21), (1000, "f", 22), (1000, "s", 22),
                     (2000, "f", 23), (2000, "s", 23)]
    # the original process metadata is replaced, thread names are kept under the new pid
    assert not any(e["name"] == "process_name" and e["args"]["name"] == "python3" for e in ev)
    assert {(e["pid"], e["args"]["name"]) for e in ev if e["name"] == "thread_name"} == {
        (p, n) for p in (0, 1000, 2000)
        for n in ("thread 1 (python3)", "thread 2 (pt_gloo_runloop)", "Spans: PyTorch Profiler")}
    assert doc["pardiagMerge"]["ranks"][2]["offset_us"] == SKEW_US


def test_cli_merge_and_its_errors(tmp_path):
    d = _planted(tmp_path)
    out = tmp_path / "m.json.gz"
    res = CliRunner().invoke(cli, ["merge", str(d), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "3 ranks" in res.output and "rank 2: +500.0 µs" in res.output
    # per rank: 12 events, less its 2 process metadata events, plus name and sort index of its
    # one process and the name of the thread Kineto's "Spans" process became
    assert len(read_trace_json(out)["traceEvents"]) == 3 * (12 - 2 + 2 + 1)
    before = (d / "rank0.json").read_bytes()
    for target in (d / "rank0.json", d / "new.json.gz"):  # an input; inside an input folder
        res = CliRunner().invoke(cli, ["merge", str(d), "-o", str(target)])
        assert res.exit_code == 2
        assert res.output.count("\n") == 1 and res.output.startswith("pardiag: error: ")
        assert "Traceback" not in res.output
    assert (d / "rank0.json").read_bytes() == before and not (d / "new.json.gz").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(cli, ["merge", str(empty), "-o", str(tmp_path / "x.json.gz")])
    assert res.exit_code == 2 and res.output.startswith("pardiag: error: ")
    plain = tmp_path / "m.json"
    assert CliRunner().invoke(cli, ["merge", str(d), "-o", str(plain)]).exit_code == 0
    assert orjson.loads(plain.read_bytes())["traceEvents"][0]["name"] == "process_name"


def test_sample_run_merges(tmp_path):
    """A recorded run: every timed event kept (flows whose start and end are both there), the
    ranks' processes renamed, each rank shifted by its offset."""
    sample = REPO / "sample_traces" / "ddp_cpu_2rank"
    traces = load_traces(sample)
    sync = compute_sync(traces)
    offsets = dict(zip(sync.offsets["rank"], sync.offsets["offset_us"]))
    res = merge_traces(traces, offsets, tmp_path / "m.json.gz")
    with gzip.open(tmp_path / "m.json.gz") as fh:
        ev = orjson.loads(fh.read())["traceEvents"]
    expected = 0
    for r, t in traces.ranks.items():
        raw = read_trace_json(t.path)["traceEvents"]
        expected += sum(e.get("ph") != "M" for e in raw)
        first = min(e["ts"] for e in raw if e.get("ph") == "X")
        merged_first = min(e["ts"] for e in ev if e["ph"] == "X" and e["pid"] // PID_STRIDE == r)
        assert merged_first == first - offsets[r]
    assert sum(e["ph"] != "M" for e in ev) == expected and res.unmatched_flows == 0
    assert len(ev) == res.events and res.pids == {0: [0], 1: [1000]}
    names = {e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    check_chrome_trace(ev)


def test_gpu_processes_are_named_by_their_kineto_label():
    from pardiag.analyzer.render.merge import rank_events

    doc = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 59811, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_labels", "pid": 59811, "tid": 0, "args": {"labels": "CPU"}},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "X", "name": "aten::mm", "pid": 59811, "tid": 59811, "ts": 10.0, "dur": 5.0},
        {"ph": "X", "name": "aten::add", "pid": 59811, "tid": 59811, "ts": 20.0, "dur": 5.0},
        {"ph": "X", "name": "gemm", "pid": 0, "tid": 7, "ts": 12.0, "dur": 2.0},
        {"ph": "X", "name": "no ts", "pid": 0, "tid": 7},
        "not an event",
    ]}
    got = rank_events(doc, rank=3, index=1, n_ranks=4, offset_us=2.0)
    events, pids, dropped = got.events, got.pids, got.dropped
    assert pids == [3000, 3001] and dropped == 2
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {3000: "rank 3", 3001: "rank 3: GPU 0"}
    assert [(e["name"], e["pid"], e["tid"], e["ts"]) for e in events if e["ph"] == "X"] == [
        ("aten::mm", 3000, 59811, 8.0), ("aten::add", 3000, 59811, 18.0), ("gemm", 3001, 7, 10.0)]
    assert ([e["args"]["labels"] for e in events if e["name"] == "process_labels"]
            == ["CPU", "GPU 0"])


def check_chrome_trace(ev: list) -> None:
    """The Chrome trace event format rules Perfetto's JSON importer relies on: ``ph`` a string;
    integer ``pid`` and ``tid``; a finite number ``ts`` on every event but metadata, and a
    ``dur`` >= 0 on complete events; each flow id (with its ``cat``) has exactly one start
    ``s`` and one end ``f``, the end not before the start; metadata events are the known kinds
    with their ``args``; every process with events has exactly one name and one sort index
    (ranks in order: ``rank R`` first, sort index = pid), every thread with events a name;
    no process without events."""
    import math
    from collections import Counter, defaultdict

    known = {"process_name": "name", "process_labels": "labels", "process_sort_index":
             "sort_index", "thread_name": "name", "thread_sort_index": "sort_index"}
    flows = defaultdict(list)
    timed_pids, timed_threads = Counter(), set()
    for e in ev:
        assert isinstance(e["ph"], str) and len(e["ph"]) == 1, e
        assert type(e["pid"]) is int and type(e["tid"]) is int, e
        if e["ph"] == "M":
            assert e["name"] in known and isinstance(e["args"], dict), e
            assert known[e["name"]] in e["args"], e
            continue
        assert type(e["ts"]) in (int, float) and math.isfinite(e["ts"]), e
        if e["ph"] == "X":
            assert type(e["dur"]) in (int, float) and math.isfinite(e["dur"]) and e["dur"] >= 0
        if e["ph"] in "stf":
            assert isinstance(e.get("cat"), str) and type(e["id"]) in (int, str), e
            flows[(e["cat"], e["id"])].append(e)
        timed_pids[e["pid"]] += 1
        timed_threads.add((e["pid"], e["tid"]))
    for key, fl in flows.items():
        phs = Counter(f["ph"] for f in fl)
        assert phs["s"] == 1 and phs["f"] == 1, (key, phs)
        s = next(f for f in fl if f["ph"] == "s")
        f = next(f for f in fl if f["ph"] == "f")
        assert f["ts"] >= s["ts"], key
    pnames = Counter(e["pid"] for e in ev if e["ph"] == "M" and e["name"] == "process_name")
    sort = {e["pid"]: e["args"]["sort_index"] for e in ev
            if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert set(pnames) == set(timed_pids) == set(sort) and set(pnames.values()) == {1}
    names = {e["pid"]: e["args"]["name"] for e in ev
             if e["ph"] == "M" and e["name"] == "process_name"}
    for pid, name in names.items():
        rank = pid // PID_STRIDE
        assert (name == f"rank {rank}" if pid % PID_STRIDE == 0
                else name.startswith(f"rank {rank}: "))
        assert sort[pid] == pid and not re.search(r"pid (Spans|Traces)?$", name), name
    tnames = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert timed_threads <= tnames


def test_merged_real_gpu_run_keeps_the_format(real_traces, tmp_path):
    """dlrm_8rank_v100 (8 GPU ranks): no empty processes (Kineto names all 8 GPUs of each host),
    no Spans/Traces processes, a host and a GPU process per rank; Kineto's ac2g flow ends whose
    start is not in the trace are left out, counted."""
    run = real_traces / "dlrm_8rank_v100"
    traces = load_traces(run)
    res = merge_traces(traces, {}, tmp_path / "m.json")
    ev = orjson.loads((tmp_path / "m.json").read_bytes())["traceEvents"]
    check_chrome_trace(ev)
    assert res.pids == {r: [r * PID_STRIDE, r * PID_STRIDE + 1] for r in range(8)}
    names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert all(names[r * PID_STRIDE + 1] == f"rank {r}: GPU {r}" for r in range(8))
    orphan = 0
    for t in traces.ranks.values():   # independently: f events whose (cat, id) has no s
        raw = read_trace_json(t.path)["traceEvents"]
        starts = {(e.get("cat"), e.get("id")) for e in raw if e.get("ph") == "s"}
        ends = {(e.get("cat"), e.get("id")) for e in raw if e.get("ph") == "f"}
        orphan += sum(e.get("ph") in ("s", "f") and (e.get("cat"), e.get("id")) not in
                      starts & ends for e in raw)
        # every kernel of the trace is in the merged file
        kernels = sum(e.get("cat") == "kernel" for e in raw)
        assert kernels == sum(e.get("cat") == "kernel" and e["pid"] // PID_STRIDE == t.rank
                              for e in ev) > 0
    assert res.unmatched_flows == orphan > 0


def test_string_tids_and_bad_durations():
    """Legacy ``"stream 7"`` tids become integers named after the string; an X event with a
    negative or missing dur is left out; a process with only metadata is not written."""
    from pardiag.analyzer.render.merge import rank_events

    doc = {"traceEvents": [
        {"ph": "M", "name": "process_labels", "pid": 5, "tid": 0, "args": {"labels": "GPU 5"}},
        {"ph": "X", "name": "op", "pid": 1, "tid": 3, "ts": 1.0, "dur": 4.0},
        {"ph": "X", "name": "k", "pid": 0, "tid": "stream 7", "ts": 2.0, "dur": 1.0},
        {"ph": "X", "name": "neg", "pid": 1, "tid": 3, "ts": 2.0, "dur": -1.0},
        {"ph": "X", "name": "nodur", "pid": 1, "tid": 3, "ts": 2.0},
        {"ph": "s", "id": 1, "cat": "ac2g", "pid": 1, "tid": 3, "ts": 1.0},
        {"ph": "f", "id": 2, "cat": "ac2g", "pid": 0, "tid": "stream 7", "ts": 2.0, "bp": "e"},
    ]}
    got = rank_events(doc, rank=0, index=0, n_ranks=1, offset_us=0.0)
    assert got.dropped == 2 and got.unmatched_flows == 2 and got.pids == [0, 1]
    check_chrome_trace(got.events)
    k = next(e for e in got.events if e.get("name") == "k")
    assert k["tid"] == 4 and {"ph": "M", "name": "thread_name", "pid": 1, "tid": 4,
                              "args": {"name": "stream 7"}} in got.events


def test_every_profiling_window_of_a_rank_is_merged(tmp_path):
    """A rank of two profiling windows (two files of one process): the merged trace holds both
    windows' events, its names once, and its report reads both windows' steps back."""
    for t0, step in ((0, 1), (50_000, 2)):
        b = TraceBuilder(rank=0, world_size=1, pid=4242, main_tid=4242)
        b.thread_name(4242, "thread 4242 (python3)")
        b.step(step, t0, 1000)
        b.cpu("aten::mm", t0 + 10, 500)
        b.write(tmp_path / f"worker0.{step}.pt.trace.json")
    traces = load_traces(tmp_path, cache=False)
    (tmp_path / "m").mkdir()
    res = merge_traces(traces, {}, tmp_path / "m" / "merged.json")
    doc = orjson.loads((tmp_path / "m" / "merged.json").read_bytes())
    names = [e["name"] for e in doc["traceEvents"]]
    assert names.count("aten::mm") == 2 and names.count("thread_name") == 1
    assert {"ProfilerStep#1", "ProfilerStep#2"} <= set(names)
    assert res.events == len(doc["traceEvents"])
    back = load_traces(tmp_path / "m" / "merged.json", cache=False)
    steps = back.ranks[0].events["name"]
    assert sorted(steps[steps.str.startswith("ProfilerStep")]) == ["ProfilerStep#1",
                                                                    "ProfilerStep#2"]
