"""Planted traces with known answers: the breakdown must reproduce them exactly."""

import json
import math
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from pardiag.analyzer.analyses.breakdown import compute_time_breakdown
from pardiag.analyzer.per_rank.breakdown import breakdown_rows_of, compute_rank_parts
from pardiag.analyzer.trace import load_traces
from pardiag.analyzer.trace.classify import Kind, classify, collective_type, compile_comm_patterns
from pardiag.errors import PardiagError

from .synth import TraceBuilder, cpu_rank, gpu_rank


def _row(df, **where):
    sel = df
    for k, v in where.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, sel
    return sel.iloc[0]


def test_gpu_planted_totals(tmp_path):
    gpu_rank(0).write(tmp_path / "a.json")
    b = compute_time_breakdown(load_traces(tmp_path))
    t = _row(b.totals, rank=0)
    assert t["domain"] == "gpu"
    # K = [10,40)+[50,70)+[110,150) = 90; C = [30,60)+[140,180) = 70; K∩C = 20+10 = 30; the
    # span runs from the first kernel to the last step's end (210: it lasts as long as its host
    # step, 100), past the last kernel (180)
    assert (t.span_us, t.compute_us, t.comm_us, t.overlap_us) == (200.0, 90.0, 70.0, 30.0)
    # the memcpy [80,90) runs while nothing else does: copies alone, not idle (HTA's idle)
    assert (t.compute_only_us, t.exposed_comm_us, t.memory_only_us, t.idle_us) == (
        60.0, 40.0, 10.0, 60.0)
    assert t.overlap_pct == pytest.approx(100 * 30 / 70, abs=1e-12)
    assert t.idle_pct == pytest.approx(100 * 60 / 200, abs=1e-12)
    assert t.memory_only_pct == pytest.approx(100 * 10 / 200, abs=1e-12)


def test_gpu_planted_steps_tile_the_device_timeline(tmp_path):
    gpu_rank(0).write(tmp_path / "a.json")
    b = compute_time_breakdown(load_traces(tmp_path))
    s1 = _row(b.steps, rank=0, step=1)
    s2 = _row(b.steps, rank=0, step=2)
    # step 1: first kernel 10 .. step 2's first kernel 110; step 2, the last: as long as its
    # host step (100), since its last kernel ends before (180): a next step's first kernel would
    # start 10 µs into its host step as this one's did
    assert (s1.start_us, s1.end_us, s2.start_us, s2.end_us) == (10.0, 110.0, 110.0, 210.0)
    assert (s1.compute_us, s1.comm_us, s1.overlap_us, s1.memory_only_us, s1.idle_us) == (
        50.0, 30.0, 20.0, 10.0, 30.0)
    assert (s2.compute_us, s2.comm_us, s2.overlap_us, s2.memory_only_us, s2.idle_us) == (
        40.0, 40.0, 10.0, 0.0, 30.0)
    assert s1.idle_us + s2.idle_us == _row(b.totals, rank=0).idle_us


def test_gpu_planted_collectives(tmp_path):
    gpu_rank(0).write(tmp_path / "a.json")
    c = compute_time_breakdown(load_traces(tmp_path)).collectives
    ar = _row(c, collective="all_reduce")
    ag = _row(c, collective="all_gather")
    assert (ar["count"], ar.time_us, ar.exposed_us) == (1, 30.0, 10.0)
    assert (ag["count"], ag.time_us, ag.exposed_us) == (1, 40.0, 30.0)


def test_cpu_planted_gloo_trace(tmp_path):
    cpu_rank(0).write(tmp_path / "a.json")
    b = compute_time_breakdown(load_traces(tmp_path))
    t = _row(b.totals, rank=0)
    assert t["domain"] == "cpu"
    # K = [0,80) minus c10d::allreduce_ [60,62) and c10d::wait [85,95) = 78 (the gloo thread's
    # aten::copy_ is not compute); C = [60,62) ∪ gloo [62,95) = 35; K∩C = [62,80) = 18
    assert (t.span_us, t.compute_us, t.comm_us, t.overlap_us) == (100.0, 78.0, 35.0, 18.0)
    assert (t.compute_only_us, t.exposed_comm_us, t.idle_us) == (60.0, 17.0, 5.0)
    assert t.overlap_pct == pytest.approx(100 * 18 / 35, abs=1e-12)
    s = _row(b.steps, rank=0, step=5)
    assert ((s.start_us, s.end_us, s.compute_us, s.comm_us, s.overlap_us)
            == (0.0, 100.0, 78.0, 35.0, 18.0))
    ar = _row(b.collectives, collective="all_reduce")
    # one transfer (the gloo worker event), the c10d issue op is not counted twice
    assert (ar["count"], ar.time_us, ar.exposed_us) == (1, 35.0, 17.0)


def test_rank_without_communication_has_no_overlap_pct(tmp_path):
    b = TraceBuilder(rank=0)
    b.kernel("void gemm(float*)", 0, 10)
    b.write(tmp_path / "a.json")
    t = _row(compute_time_breakdown(load_traces(tmp_path)).totals, rank=0)
    assert t.comm_us == 0.0 and math.isnan(t.overlap_pct) and t.compute_only_us == 10.0


def test_user_comm_kernel_pattern(tmp_path):
    b = TraceBuilder(rank=0)
    b.kernel("void gemm(float*)", 0, 10)
    b.kernel("multimem_all_reduce_kernel<float>", 5, 10, stream=3)
    b.kernel("void deep_ep::intranode::dispatch<8>(int*)", 20, 4, stream=3)
    b.write(tmp_path / "a.json")
    traces = load_traces(tmp_path)
    plain = _row(compute_time_breakdown(traces).totals, rank=0)
    assert (plain.compute_us, plain.comm_us) == (19.0, 0.0)
    pats = compile_comm_patterns([r"^multimem_", r"deep_ep::.*dispatch"])
    t = _row(compute_time_breakdown(traces, pats).totals, rank=0)
    assert (t.compute_us, t.comm_us, t.overlap_us) == (10.0, 14.0, 5.0)


def test_name_tests_are_kept_for_the_process_per_key_and_name(tmp_path):
    """Ranks share their names: a name is tested once per key in a process, each trace still
    gets the answers for its own names, and each --comm-kernel pattern has its own key."""
    from pardiag.analyzer.trace.classify import name_test
    for rank, names in ((0, ["k_a", "k_b"]), (1, ["k_b", "k_c", "K_A"])):
        b = TraceBuilder(rank=rank)
        for i, n in enumerate(names):
            b.kernel(n, 10 * i, 5)
        b.write(tmp_path / f"r{rank}.json")
    traces = load_traces(tmp_path)
    seen: list[str] = []

    def test(n: str) -> bool:
        seen.append(n)
        return n.endswith("_b")
    key = ("a test of this test", tmp_path.name)
    got = [name_test(traces.ranks[r], key, test).tolist() for r in (0, 1)]
    kernels = [traces.ranks[r].events["name"].tolist() for r in (0, 1)]
    assert [[n for n, h in zip(k, g) if h] for k, g in zip(kernels, got)] == [["k_b"], ["k_b"]]
    assert sorted(n for n in seen if n.startswith(("k_", "K_"))) == ["K_A", "k_a", "k_b", "k_c"]
    pats = [compile_comm_patterns(["k_a"]), compile_comm_patterns(["(?i)k_a"])]
    comm = [(compute_time_breakdown(traces, p).totals.set_index("rank")["comm_us"]).tolist()
            for p in pats]
    assert comm == [[5.0, 0.0], [5.0, 5.0]]


def test_invalid_comm_pattern_is_a_clear_error():
    with pytest.raises(PardiagError, match="invalid regular expression"):
        compile_comm_patterns(["(unclosed"])


def test_generic_rccl_kernel_takes_type_from_cpu_op(tmp_path):
    b = TraceBuilder(rank=0)
    b.cpu("nccl:all_to_all", 0, 20, args={"Collective name": "all_to_all"})
    b.kernel("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", 30, 10, stream=20,
             launch_ts=5)
    b.kernel("void gemm(float*)", 35, 20)
    b.write(tmp_path / "a.json")
    c = compute_time_breakdown(load_traces(tmp_path)).collectives
    row = _row(c, collective="all_to_all")
    assert (row["count"], row.time_us, row.exposed_us) == (1, 10.0, 5.0)


def test_classification_of_names(tmp_path):
    gpu_rank(0).write(tmp_path / "a.json")
    trace = load_traces(tmp_path).ranks[0]
    kinds = dict(zip(trace.events["name"].str[:12], classify(trace)))
    assert kinds["ncclKernel_A"] == Kind.GPU_COMM.value
    assert kinds["ncclDevKerne"] == Kind.GPU_COMM.value
    assert kinds["Memcpy DtoH "] == Kind.GPU_MEMORY.value
    assert kinds["void gemm_ke"] == Kind.GPU_COMPUTE.value
    assert kinds["ProfilerStep"] == Kind.STEP.value


@pytest.mark.parametrize("name,expected", [
    ("gloo:all_reduce", "all_reduce"), ("c10d::allreduce_", "all_reduce"),
    ("c10d::_allgather_base_", "all_gather"), ("c10d::_reduce_scatter_base_", "reduce_scatter"),
    ("gloo:all_gather", "all_gather"), ("c10d::broadcast_", "broadcast"), ("c10d::send", "send"),
    ("c10d::recv_", "recv"), ("nccl:all_to_all", "all_to_all"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*)", "send_recv"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(x)", "reduce_scatter"),
    ("rcclGenericKernel", "rcclGenericKernel"),
])
def test_collective_type(name, expected):
    assert collective_type(name) == expected


def test_record_param_comms_uses_collective_name():
    assert collective_type("record_param_comms",
                           {"Collective name": "_allgather_base"}) == "all_gather"


def _gloo_rs_trace() -> TraceBuilder:
    """Two reduce-scatters that gloo runs as gloo:all_reduce on two worker threads (one of them
    named 'python3', as Kineto may name it), an all-reduce whose transfer starts before the first
    reduce-scatter's, and an all-gather. Main thread: aten::mm [0,50), [60,100), [120,140)."""
    b = TraceBuilder(rank=0, backend="gloo")
    b.thread_name(1, "thread 1 (python3)").thread_name(2, "thread 2 (python3)")
    b.thread_name(3, "thread 3 (pt_gloo_runloop)")
    b.step(1, 0, 200)
    for ts, dur in ((0, 50), (60, 40), (120, 20)):
        b.cpu("aten::mm", ts, dur)
    rs = {"Input Dims": [[512], [1024]], "Input type": ["float", "float"]}
    b.cpu("c10d::_reduce_scatter_base_", 50, 2, args=rs)
    b.cpu("c10d::allreduce_", 54, 2, args={"Input Dims": [[256]], "Input type": ["float"]})
    b.cpu("gloo:all_reduce", 55, 15, tid=3, cat="user_annotation", args={"Input Dims": [[256]]})
    b.cpu("gloo:all_reduce", 58, 22, tid=2, cat="user_annotation", args={"Input Dims": [[1024]]})
    b.cpu("c10d::_reduce_scatter_base_", 100, 2, args=rs)
    b.cpu("gloo:all_reduce", 102, 28, tid=3, cat="user_annotation", args={"Input Dims": [[1024]]})
    b.cpu("c10d::_allgather_base_", 110, 2, args={"Input Dims": [[2048], [1024]]})
    b.cpu("gloo:all_gather", 112, 38, tid=2, cat="user_annotation", args={"Input Dims": [[1024]]})
    return b


def test_gloo_reduce_scatter_on_two_worker_threads_counts_issued_ops(tmp_path):
    _gloo_rs_trace().write(tmp_path / "a.json")
    traces = load_traces(tmp_path)
    c = compute_time_breakdown(traces).collectives
    assert sorted(c["collective"]) == ["all_gather", "all_reduce", "reduce_scatter"]
    rs, ar, ag = (_row(c, collective=t) for t in ("reduce_scatter", "all_reduce", "all_gather"))
    # reduce_scatter: c10d [50,52) + gloo [58,80) + c10d [100,102) + gloo [102,130) = 54 µs;
    # not under compute: [50,52) [58,60) [100,120) = 24
    assert (rs["count"], rs.time_us, rs.exposed_us) == (2, 54.0, 24.0)
    # all_reduce: c10d [54,56) ∪ gloo [55,70) = [54,70); exposed [54,60)
    assert (ar["count"], ar.time_us, ar.exposed_us) == (1, 16.0, 6.0)
    # all_gather: c10d [110,112) ∪ gloo [112,150); exposed [110,120) + [140,150)
    assert (ag["count"], ag.time_us, ag.exposed_us) == (1, 40.0, 20.0)
    # the synchronization analysis names the worker events by the op issued
    from pardiag.analyzer.analyses.comm_events import comm_events
    ev = comm_events(traces).sort_values("start_us")
    assert ev["op"].tolist() == ["all_reduce", "reduce_scatter", "reduce_scatter", "all_gather"]
    assert ev["start_us"].tolist() == [55.0, 58.0, 102.0, 112.0]


def test_gloo_on_cuda_tensors_names_its_worker_events_by_the_op_issued(tmp_path):
    """gloo on CUDA tensors (Windows has no NCCL): the same reduce-scatters, run as
    gloo:all_reduce on the workers, beside the GPU's gemms. The GPU trace's collectives are the
    workers' events, named (as on a CPU trace) by the op the program issued."""
    b = _gloo_rs_trace()
    for ts, dur in ((0, 50), (60, 40), (120, 20)):
        b.kernel("volta_sgemm_128x64_nn", ts + 1, dur - 2, launch_ts=ts)
    b.write(tmp_path / "a.json")
    c = compute_time_breakdown(load_traces(tmp_path)).collectives
    assert sorted(c["collective"]) == ["all_gather", "all_reduce", "reduce_scatter"]
    rs, ar, ag = (_row(c, collective=t) for t in ("reduce_scatter", "all_reduce", "all_gather"))
    # the workers' events alone: reduce-scatters [58,80) + [102,130), all-reduce [55,70),
    # all-gather [112,150)
    assert (rs["count"], rs.time_us) == (2, 50.0)
    assert (ar["count"], ar.time_us) == (1, 15.0)
    assert (ag["count"], ag.time_us) == (1, 38.0)


def test_gloo_counts_come_from_records_when_the_run_has_them(tmp_path):
    from .synth import record, write_sidecar
    _gloo_rs_trace().write(tmp_path / "rank0.trace.json")
    recs = [record("reduce_scatter", 1, 58, 80), record("all_reduce", 2, 55, 70),
            record("reduce_scatter", 3, 102, 130), record("all_gather", 4, 112, 150),
            record("broadcast", 5, 160, 170)]
    write_sidecar(tmp_path / "rank0.comms.json", "comms", 0,
                  {"process_groups": [{"name": "0", "ranks": [0, 1, 2]}], "records": recs})
    c = compute_time_breakdown(load_traces(tmp_path)).collectives
    counts = dict(zip(c["collective"], c["count"]))
    assert counts == {"all_gather": 1, "all_reduce": 1, "broadcast": 1, "reduce_scatter": 2}
    bc = _row(c, collective="broadcast")   # recorded, not in the trace: counted, no time
    assert (bc.time_us, bc.exposed_us) == (0.0, 0.0)
    assert _row(c, collective="reduce_scatter").time_us == 54.0


SAMPLES = sorted(p for p in (Path(__file__).resolve().parents[1] / "sample_traces").iterdir()
                 if p.is_dir())


def test_every_sample_run_has_comms_records():
    assert len(SAMPLES) == 16    # the sample_traces/README.md table
    assert all(len(list(p.glob("pardiag/rank*.comms.json"))) >= 2 for p in SAMPLES)


@pytest.mark.parametrize("run", SAMPLES, ids=lambda p: p.name)
def test_sample_collective_counts_equal_the_records(run):
    """Every rank's per-type count equals its comms.json records' — both as reported (records)
    and as counted from the trace alone (issued c10d ops) — and every member of a group agrees."""
    traces = load_traces(run)
    c = compute_time_breakdown(traces).collectives
    for f in sorted(run.glob("rank*.comms.json")):
        doc = json.loads(f.read_text())
        want = Counter(r["op"] for r in doc["records"])
        rank = doc["rank"]
        got = c[c["rank"] == rank]
        assert dict(zip(got["collective"], got["count"])) == dict(want), (run.name, rank)
        _, _, trace_rows = breakdown_rows_of(compute_rank_parts(traces.ranks[rank], [], None))
        assert {r["collective"]: r["count"] for r in trace_rows} == dict(want), (run.name, rank)


def test_step_time_spread_quartiles_range_and_outliers():
    from pardiag.analyzer.analyses.breakdown import step_time_spread

    spans = {0: [100.0, 110.0, 120.0, 130.0, 400.0], 1: [90.0, 100.0, 100.0, 100.0, 100.0]}
    steps = pd.DataFrame([{"rank": r, "step": i + 1, "span_us": v}
                          for r, vs in spans.items() for i, v in enumerate(vs)])
    st = step_time_spread(steps).set_index(steps.columns[0], drop=False)
    r0 = st.iloc[0]   # 400 > 1.5 x 120: step 5 is an outlier, left out
    assert (r0["steps"], r0["median_us"], r0["q1_us"], r0["q3_us"], r0["min_us"], r0["max_us"],
            r0["outlier_steps"]) == (4, 115.0, 107.5, 122.5, 100.0, 130.0, [5])
    run = st.iloc[-1]  # per step the slowest rank: 100, 110, 120, 130, 400
    assert run["rank"] is None and run["outlier_steps"] == [5] and run["median_us"] == 115.0
    one = step_time_spread(steps[steps["step"] == 1]).iloc[-1]
    assert (one["steps"], one["median_us"], one["outlier_steps"]) == (1, 100.0, [])


def test_step_time_rows_of_many_ranks_equal_each_ranks_own():
    """The step-time rows of ranks done together (as many steps, none unknown or an outlier)
    equal those computed rank by rank, bit for bit; ranks with NaN spans or outliers among them."""
    import numpy as np

    from pardiag.analyzer.analyses.breakdown import _spread_row, _spread_rows

    rng = np.random.default_rng(3)
    for trial in range(40):
        n = rng.integers(1, 7, 30)
        ranks = np.repeat(np.arange(30), n)
        step_no = np.concatenate([np.arange(k) + 1 for k in n])
        span = np.round(rng.normal(1000, 50, len(ranks)), int(rng.integers(0, 4)))
        span[rng.random(len(span)) < 0.05] = np.nan
        span[rng.random(len(span)) < 0.05] *= 3   # outliers
        lo = np.r_[0, np.cumsum(n)[:-1]]
        hi = np.cumsum(n)
        got = _spread_rows(ranks, step_no, span, lo, hi)
        want = [_spread_row(int(ranks[a]), step_no[a:b], span[a:b]) for a, b in zip(lo, hi)]
        for g, w in zip(got, want):
            assert g.keys() == w.keys()
            for key in g:
                assert (g[key] == w[key] or (g[key] != g[key] and w[key] != w[key])), (trial, key)
                assert type(g[key]) is type(w[key])


def test_compute_under_an_async_send_is_compute(tmp_path):
    """A pipeline's async isend on gloo: its gloo:send span on the main thread lasts from the
    issue to the step-end wait while the backward runs. Main thread: step [0,100); c10d::send
    [5,7) (the call); gloo:send [7,90) (in flight); aten::mm [10,40) and aten::mm [50,80) meanwhile;
    then nothing until the wait returns at 90. K = [10,40) ∪ [50,80) = 60 (the blocking call
    [5,7) is not compute); C = [5,90) = 85; overlap = 60; exposed = 25: the call, [7,10), the gap
    [40,50) and the wait [80,90)."""
    b = TraceBuilder(rank=0, backend="gloo")
    b.thread_name(1, "thread 1 (python3)")
    b.step(1, 0, 100)
    b.cpu("c10d::send", 5, 2, args={"Input Dims": [[8, 256]], "Input type": ["float"]})
    b.cpu("gloo:send", 7, 83, cat="user_annotation")
    b.cpu("autograd::engine::evaluate_function: MmBackward0", 10, 30)
    b.cpu("aten::mm", 10, 30)
    b.cpu("aten::mm", 50, 30)
    b.write(tmp_path / "a.json")
    t = _row(compute_time_breakdown(load_traces(tmp_path)).totals, rank=0)
    assert (t.compute_us, t.comm_us, t.overlap_us) == (60.0, 85.0, 60.0)
    assert (t.compute_only_us, t.exposed_comm_us, t.idle_us) == (0.0, 25.0, 15.0)
    from pardiag.analyzer.per_rank.causes import causes_of_trace

    c = causes_of_trace(load_traces(tmp_path).ranks[0]).iloc[0]
    # the host's parts: the backward it ran under the send, and as communication the call and
    # the time in flight in no op
    assert c["backward_us"] == 30.0
    assert c["comm_us"] == 2.0 + 3.0 + 10.0 + 10.0


def test_a_wait_no_op_marks_is_not_compute(tmp_path):
    """FSDP on gloo waits for its all-gather inside its own annotation, with no wait op. Main
    thread: step [0, 2000); FSDP::all_gather [100, 1700) holding c10d::_allgather_base_ [120,
    150) (the call) and nothing else until _ToTorchTensorBackward [1700, 1750); the whole held
    by an autograd op [100, 1900); aten::mm [1750, 1900). The gloo worker's all-gather runs
    [160, 1680). The stretch [150, 1700) has an op open and none starting or ending, starts
    where the call ended, and the all-gather ends 20 µs before the thread resumes: a wait, not
    computation. K = [100, 120) ∪ [1700, 1900) = 220 µs (without the rule: 1,770); exposed
    communication 1,550 µs (the call [120, 150) and the worker's [160, 1680): the rank waited,
    and nothing of it is under computation). An ATen operator's own time (an aten::mm of
    1,500 µs, its small child op done in its first 10 µs, under an all-reduce in flight that
    ends just before it) stays computation."""
    b = TraceBuilder(rank=0, backend="gloo")
    b.thread_name(1, "thread 1 (python3)").thread_name(2, "thread 2 (pt_gloo_runloop)")
    b.step(1, 0, 2000)
    b.cpu("autograd::engine::evaluate_function: _ToTorchTensorBackward", 100, 1800)
    b.cpu("FSDP::all_gather (1)", 100, 1600, cat="user_annotation")
    b.cpu("c10d::_allgather_base_", 120, 30)
    b.cpu("gloo:all_gather", 160, 1520, tid=2, cat="user_annotation")
    b.cpu("_ToTorchTensorBackward", 1700, 50)
    b.cpu("aten::mm", 1750, 150)
    b.step(2, 2000, 2000)
    b.cpu("aten::mm", 2100, 1500)
    b.cpu("aten::resolve_conj", 2100, 10)
    b.cpu("gloo:all_reduce", 2150, 1440, tid=2, cat="user_annotation")
    b.write(tmp_path / "a.json")
    ts = load_traces(tmp_path)
    from pardiag.analyzer.per_rank.breakdown import unmarked_waits

    t = ts.ranks[0]
    assert unmarked_waits(t).tolist() == [[150.0, 1700.0]]
    steps = compute_time_breakdown(ts).steps
    one, two = (_row(steps[steps["step"] == n], rank=0) for n in (1, 2))
    assert one.compute_us == 220.0 and one.exposed_comm_us == 1550.0
    # the matmul under an all-reduce in flight is a leaf op: computation, the transfer overlapped
    assert two.compute_us == 1500.0 and two.overlap_us == 1440.0


def test_step_means_and_overall_shares(tmp_path):
    """Rank 0 is the planted GPU trace (span 200, communication 70, 40 of it exposed); rank 1
    computes [10,40) in step 1 and [110,130) in step 2 (its last step lasts as long as its host
    step: to 210) and never communicates. Per step the
    page's chart shows the mean over the two ranks; the run summary the shares over both."""
    gpu_rank(0).write(tmp_path / "a.json")
    b = TraceBuilder(rank=1)
    b.step(1, 0, 100).step(2, 100, 100)
    b.kernel("void gemm_kernel<float>(float*)", 10, 30, launch_ts=1)
    b.kernel("void gemm_kernel<float>(float*)", 110, 20, launch_ts=101)
    b.write(tmp_path / "b.json")
    bd = compute_time_breakdown(load_traces(tmp_path))
    assert _row(bd.totals, rank=1).span_us == 200.0
    m = bd.step_means.set_index("step")
    # step 1: rank 0 (30 compute only, 20 overlapped, 10 exposed, 10 memory copies alone, 30
    # idle), rank 1 (30, 0, 0, 0, 70); step 2 (to 210): rank 0 (30, 10, 30, 0, 30), rank 1
    # (20, 0, 0, 0, 80)
    assert m.loc[1].tolist() == [30.0, 10.0, 5.0, 5.0, 50.0]
    assert m.loc[2].tolist() == [25.0, 5.0, 15.0, 0.0, 55.0]
    o = bd.overall
    assert o["exposed_comm_pct"] == pytest.approx(100 * 40 / 400, abs=1e-12)
    assert o["overlap_pct"] == pytest.approx(100 * 30 / 70, abs=1e-12)
    assert o["comm_us_per_rank"] == 70.0   # rank 1 has no communication: not in the mean


def test_overall_shares_without_communication_or_time():
    from pardiag.analyzer.analyses.breakdown import overall_shares

    none = overall_shares(pd.DataFrame({"comm_us": [0.0], "exposed_comm_us": [0.0],
                                        "span_us": [0.0], "overlap_pct": [math.nan]}))
    assert all(math.isnan(v) for v in none.values())
    assert all(math.isnan(v) for v in overall_shares(pd.DataFrame()).values())


def test_every_step_of_the_run_is_kept_with_its_period(tmp_path):
    """Two ranks' metadata record 8 optimizer steps each, the profiler's window (wait 1, warmup
    1, active 3) covering steps 2–4. Rank 0's steps end every 10 ms; rank 1's every 10 ms but
    step 6, which a planted 25 ms pause makes 35 ms — outside the profiled steps, where only
    the run's steps can show it. The page draws them."""
    from pardiag.analyzer.render.html import render_html
    from pardiag.analyzer.report.registry import build_report, report_json

    from .synth import TraceBuilder, write_sidecar
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2, backend="gloo")
        for s in (2, 3, 4):
            b.step(s, 10000.0 * s, 10000).cpu("aten::mm", 10000.0 * s, 5000)
        b.write(tmp_path / f"rank{r}.trace.json")
        ends, t = [], 1e15
        for k in range(8):
            t += 35000.0 if (r == 1 and k == 6) else 10000.0
            ends.append([k, t - 2000.0, t])
        write_sidecar(tmp_path / f"rank{r}.meta.json", "rank", r, {
            "optimizer_steps": 8, "optimizer_step_times_us": ends})
    write_sidecar(tmp_path / "run.json", "run", None, {
        "world_size": 2, "schedule": {"wait": 1, "warmup": 1, "active": 3}})
    rep = build_report(load_traces(tmp_path))
    rs = rep.time_breakdown.run_steps
    assert list(rs.columns) == ["rank", "step", "period_us", "profiled"]
    assert rs["step"].tolist() == [1, 2, 3, 4, 5, 6, 7] * 2
    assert rs["profiled"].tolist() == [False, True, True, True, False, False, False] * 2
    assert rs["period_us"].tolist() == [10000.0] * 7 + [10000.0] * 5 + [35000.0, 10000.0]
    # the complete steps are all there: none is cut
    assert rep.time_breakdown.unfinished.empty
    j = report_json(rep)["run_steps"]
    assert j[12] == {"rank": 1, "step": 6, "period_us": 35000.0, "profiled": False}
    page = render_html(rep, include_plotlyjs="cdn")
    assert "<h3>Every step of the run</h3>" in page
    assert "Step time over every step of the run (profiled steps shaded)" in page


# -- the training step is the optimizer step --------------------------------------------------

def _steps(n: int, dur: float = 100.0) -> pd.DataFrame:
    return pd.DataFrame({"step": list(range(1, n + 1)),
                         "start_us": [i * dur for i in range(n)],
                         "end_us": [(i + 1) * dur for i in range(n)]})


@pytest.mark.parametrize("opt_in, want", [
    # accumulation of 4 over 8 profiler steps: two training steps of 4
    ([3, 7], [(4, 0, 400, 4), (8, 400, 800, 4)]),
    # the window began inside an accumulation (2 of 4 before the first optimizer step): left out;
    # the steps after the last optimizer step are left out too
    ([1, 5], [(6, 200, 600, 4)]),
    # irregular: an epoch's last accumulation is shorter; 3 before the first (as many as the next)
    ([2, 5, 7], [(3, 0, 300, 3), (6, 300, 600, 3), (8, 600, 800, 2)]),
    # three optimizers stepping together (Adam, Adam, Muon) in every profiler step that steps
    ([3, 3, 3, 7, 7, 7], [(4, 0, 400, 4), (8, 400, 800, 4)]),
])
def test_profiler_steps_join_into_one_step_per_optimizer_step(opt_in, want):
    from pardiag.analyzer.trace.classify import training_steps
    starts = [i * 100.0 + 50 for i in opt_in]   # inside profiler step i + 1
    got = training_steps(_steps(8), pd.Series(starts).to_numpy())
    assert [tuple(r) for r in got[["step", "start_us", "end_us", "profiler_steps"]]
            .itertuples(index=False)] == want


@pytest.mark.parametrize("opt_in", [
    [],                      # no optimizer ranges: unknown, profiler steps kept
    list(range(8)),          # one per profiler step: already training steps
    [3],                     # one optimizer step: no period to join by
    [3, 3, 7],               # two in one profiler step: several training steps in one
])
def test_profiler_steps_stay_without_the_evidence(opt_in):
    from pardiag.analyzer.trace.classify import training_steps
    starts = [i * 100.0 + 50 + 10 * opt_in[:k].count(i) for k, i in enumerate(opt_in)]
    got = training_steps(_steps(8), pd.Series(starts, dtype=float).to_numpy())
    assert got["step"].tolist() == list(range(1, 9))
    assert got["profiler_steps"].tolist() == [1] * 8


def _accumulating_rank(rank: int, steps: int = 8, scaler: bool = False,
                       skipped: tuple[int, ...] = (), syncs: tuple[int, ...] = ()
                       ) -> TraceBuilder:
    """DDP with gradient accumulation 4 and ``prof.step()`` per micro-batch: micro-batches 1-3
    compute 900 µs in a 1000 µs profiler step; the 4th (1600 µs) computes 900 µs, all-reduces
    400 µs and steps the optimizer; with ``scaler``, a GradScaler's update follows, and in the
    profiler steps ``skipped`` the scaler skips the optimizer's step (no range, no kernel).
    ``syncs``: the micro-batches that all-reduce and step instead of every 4th."""
    b = TraceBuilder(rank=rank, world_size=2)
    t = EPOCH
    for n in range(1, steps + 1):
        if (n not in syncs) if syncs else n % 4:
            b.step(n, t, 1000).kernel("gemm", t + 50, 900, launch_ts=t + 10)
            t += 1000
            continue
        b.step(n, t, 1600).kernel("gemm", t + 50, 900, launch_ts=t + 10)
        b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 t + 950, 400, stream=20, launch_ts=t + 20,
                 args={"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1024,
                       "Out msg nelems": 1024, "Group size": 2, "Process Group Name": "0",
                       "Process Group Ranks": "[0, 1]",
                       "Seq": str(syncs.index(n) + 1 if syncs else n // 4)})
        if n not in skipped:
            b.cpu("Optimizer.step#AdamW.step", t + 1400, 150, cat="user_annotation")
            b.kernel("multi_tensor_apply_kernel", t + 1450, 100, launch_ts=t + 1410)
        if scaler:
            b.cpu("aten::_amp_update_scale_", t + 1560, 5)
        t += 1600
    return b


EPOCH = 1_700_000_000_000_000.0


def test_a_step_with_gradient_accumulation_is_the_optimizer_step(tmp_path):
    """Planted: 3 micro-batch profiler steps of 1000 µs, then one of 1600 µs that all-reduces
    and steps the optimizer; twice. The step is 3 × 1000 + 1600 = 4600 µs, numbered 4 and 8,
    and no profiler step is an outlier to leave out. On the device a step runs from its first
    kernel to the next step's first kernel (4600 µs); the last, whose kernels end 4500 µs after
    its first began, as long as its host step (4600 µs)."""
    for r in range(2):
        _accumulating_rank(r).write(tmp_path / f"rank{r}.json")
    traces = load_traces(tmp_path)
    b = compute_time_breakdown(traces)
    assert b.steps.groupby("rank")["step"].apply(list).to_dict() == {0: [4, 8], 1: [4, 8]}
    # operators per step: per training step (2 in the window), not per micro-batch (8)
    from pardiag.analyzer.per_rank.summary import summary_of
    assert [summary_of(t).operator_steps for t in traces.ranks.values()] == [2, 2]
    assert (b.steps["end_us"] - b.steps["start_us"]).tolist() == [4600.0, 4600.0] * 2
    run = b.step_time[b.step_time["rank"].isna()].iloc[0]
    assert run["median_us"] == 4600.0 and run["outlier_steps"] == []
    assert b.joined_text() == ("a step is one optimizer step: 4 profiler steps each (gradient "
                               "accumulation; the optimizer stepped, or a gradient scaler "
                               "skipped its step, in profiler step(s) 4, 8 only)")


def test_accumulation_groups_an_epoch_ends_early_are_steps_and_said(tmp_path):
    """Accumulation 2 over epochs of 3 micro-batches: the optimizer steps after micro-batches
    2 and 3 of each epoch (the last one's group ends with the epoch). Every optimizer step is
    a step, and the note names them all with their 1-2 profiler steps (it named only those of
    two, as if each were two)."""
    for r in range(2):
        _accumulating_rank(r, steps=6, syncs=(2, 3, 5, 6)).write(tmp_path / f"rank{r}.json")
    b = compute_time_breakdown(load_traces(tmp_path))
    # (micro-batches 1-2, the window's first group, are not as many as the next group's: the
    # window may have begun inside one, so they are left out)
    assert b.steps.groupby("rank")["step"].apply(list).to_dict() == {0: [3, 5, 6],
                                                                     1: [3, 5, 6]}
    assert b.joined_text() == ("a step is one optimizer step: 1–2 profiler steps each "
                               "(gradient accumulation; the optimizer stepped, or a gradient "
                               "scaler skipped its step, in profiler step(s) 3, 5, 6 only)")


def test_a_step_whose_optimizer_step_the_gradient_scaler_skipped_is_still_a_step(tmp_path):
    """Mixed precision with GradScaler: in profiler step 8 the scaler found inf gradients and
    skipped the optimizer's step, but updated its scale. Three training steps of 4600 µs
    (profiler steps 4, 8, 12), not one of 8 profiler steps from 4 to 12."""
    for r in range(2):
        _accumulating_rank(r, steps=12, scaler=True, skipped=(8,)).write(
            tmp_path / f"rank{r}.json")
    b = compute_time_breakdown(load_traces(tmp_path))
    assert b.steps.groupby("rank")["step"].apply(list).to_dict() == {0: [4, 8, 12],
                                                                     1: [4, 8, 12]}
    assert (b.steps["end_us"] - b.steps["start_us"]).tolist() == [4600.0] * 6


# -- one process, several devices --------------------------------------------------------------

def test_each_device_of_one_process_is_its_own_timeline(tmp_path):
    """Planted: one process (no torch.distributed) splits a model over two GPUs: per 1000 µs
    step GPU 0 computes [0, 400] and [600, 900], GPU 1 [400, 600] and [900, 1000] — their union
    is busy all the time, each GPU alone computes 700 and 300 µs of every 1000 µs. Three steps."""
    b = TraceBuilder(rank=None)
    for s in range(3):
        t = EPOCH + 1000 * s
        b.step(s + 1, t, 1000)
        for dev, lo, hi in ((0, 0, 400), (1, 400, 600), (0, 600, 900), (1, 900, 1000)):
            b.kernel("gemm", t + lo, hi - lo, launch_ts=t + lo, args={"device": dev})
            b.events[-2]["pid"] = dev     # Kineto's pid of a device's events is the device
    b.write(tmp_path / "trace.json")
    bd = compute_time_breakdown(load_traces(tmp_path))
    assert bd.totals["idle_pct"].tolist() == [0.0]          # the union: never idle
    assert bd.devices[["device", "kernels", "compute_us", "busy_us"]].values.tolist() == [
        [0, 6, 2100.0, 2100.0], [1, 6, 900.0, 900.0]]
    assert bd.devices["idle_pct"].tolist() == pytest.approx([30.0, 70.0])
    line, = bd.devices_text()
    assert line.startswith("rank 0: one process drives 2 devices (0 and 1: a model split "
                           "across them, as device_map='auto' does, or copied onto each, as "
                           "nn.DataParallel does)")
    assert ("device 0 computes 2.10 ms and is idle 30.0% of the rank's time; device 1 computes "
            "0.90 ms and is idle 70.0%") in line


def test_one_device_per_rank_has_no_device_rows(tmp_path):
    gpu_rank(0).write(tmp_path / "rank0.json")
    gpu_rank(1).write(tmp_path / "rank1.json")
    bd = compute_time_breakdown(load_traces(tmp_path))
    assert bd.devices.empty and bd.devices_text() == []


def test_a_merged_files_renumbered_pids_are_not_devices(tmp_path):
    """A merge tool's file: rank 0's compute kernel on pid 1 without a device arg, its
    all-reduce with ``device`` 0 — one device, read from the arg, not two from the pids."""
    b = TraceBuilder(rank=0, world_size=1)
    b.step(1, EPOCH, 1000)
    b.kernel("gemm", EPOCH + 10, 500, launch_ts=EPOCH + 1)
    del b.events[-2]["args"]["device"]
    b.events[-2]["pid"] = 1
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
             EPOCH + 520, 300, stream=20, launch_ts=EPOCH + 2, args={"device": 0})
    b.write(tmp_path / "rank0.json")
    bd = compute_time_breakdown(load_traces(tmp_path))
    assert bd.devices.empty and bd.devices_text() == []


def test_a_ranks_kernels_on_another_gpu_are_read_from_their_device_arg(tmp_path):
    """A DDP rank on GPU 1 that also runs its EMA update on cuda:0 (never called set_device):
    its kernels name their devices, and only its NCCL kernel's args were kept whole. The
    EMA kernel is GPU 0's (it was put on the only device the kept args named, so the rank
    showed one device and no warning)."""
    b = TraceBuilder(rank=1, world_size=2)
    b.step(1, EPOCH, 1000)
    b.kernel("gemm", EPOCH + 10, 500, launch_ts=EPOCH + 1, args={"device": 1})
    b.events[-2]["pid"] = 1
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
             EPOCH + 520, 300, stream=20, launch_ts=EPOCH + 2, args={"device": 1})
    b.events[-2]["pid"] = 1
    b.kernel("ema_update_kernel", EPOCH + 830, 100, launch_ts=EPOCH + 3, args={"device": 0})
    b.write(tmp_path / "rank1.json")
    bd = compute_time_breakdown(load_traces(tmp_path, cache=False))
    assert bd.devices[["device", "kernels", "compute_us"]].values.tolist() == [
        [0, 1, 100.0], [1, 2, 500.0]]
    assert bd.devices_text()[0].startswith("rank 1: one process drives 2 devices (0 and 1:")
    # a 2 µs memset on cuda:0 (the context a rank on GPU 1 created there) is no second device
    doc = json.loads((tmp_path / "rank1.json").read_text())
    ema = next(e for e in doc["traceEvents"] if e["name"] == "ema_update_kernel")
    ema.update(name="Memset (Device)", cat="gpu_memset", dur=2)
    (tmp_path / "rank1.json").write_text(json.dumps(doc))
    bd = compute_time_breakdown(load_traces(tmp_path, cache=False))
    assert bd.devices.empty and bd.devices_text() == []


def test_ranks_profiled_without_their_device_are_said_and_left_out_of_the_comparisons(tmp_path):
    """Ranks 0 and 1 ran kernels; ranks 2 and 3 of the same job hold only host events (profiled
    with CPU activities only). A warning names them; the run's exposed share is the device
    ranks' alone, and the load-imbalance table compares only the device ranks."""
    from pardiag.analyzer.analyses.imbalance import compute_balance

    for r in range(4):
        b = gpu_rank(r) if r < 2 else cpu_rank(r)
        b.world_size = 4
        b.write(tmp_path / f"rank{r}.json")
    traces = load_traces(tmp_path, cache=False)
    b = compute_time_breakdown(traces)
    assert b.host_only_text() == (
        "ranks 2, 3 hold no device activity (no kernel) while ranks 0, 1 ran kernels: profiled "
        "with CPU activities only? Their computation and overlap are their host's, not "
        "comparable with the device ranks': the run's shares and the load-imbalance table "
        "leave them out")
    gpu = b.totals[b.totals["rank"] < 2]
    assert b.overall["exposed_comm_pct"] == pytest.approx(
        100 * gpu["exposed_comm_us"].sum() / gpu["span_us"].sum())
    bal = compute_balance(traces, b.steps)
    assert sorted(bal.per_rank["rank"].unique()) == [0, 1]
    # every rank on its device, or every rank on its host: nothing to say
    assert compute_time_breakdown(load_traces(tmp_path / "rank0.json", cache=False)
                                  ).host_only_text() is None
