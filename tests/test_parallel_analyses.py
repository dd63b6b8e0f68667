"""Stragglers, clock offsets, bandwidth, pipeline bubbles, imbalance, memory and layout on
planted multi-rank runs whose answers are known exactly."""

import math

import pytest

from pardiag.analyzer.analyses.breakdown import compute_time_breakdown
from pardiag.analyzer.analyses.imbalance import compute_balance
from pardiag.analyzer.analyses.layout import compute_layout
from pardiag.analyzer.analyses.memory import compute_memory
from pardiag.analyzer.analyses.pipeline import compute_pipeline, ideal_bubble_pct
from pardiag.analyzer.analyses.sync import compute_sync
from pardiag.analyzer.per_rank.op_semantics import busbw_factor
from pardiag.analyzer.report.registry import build_report, report_json
from pardiag.analyzer.trace import load_traces

from .synth import TraceBuilder, record, write_sidecar

OFFSET = {0: 0.0, 1: 500.0, 2: 0.0}      # rank 1's clock runs 500 µs ahead
ARRIVAL = {0: 0.0, 1: 20.0, 2: 100.0}    # rank 2 always arrives 100 µs late


def straggler_run(tmp_path):
    """3 ranks, 4 all-reduces of 1 MB at 1000, 2000, 3000, 4000 µs; all leave at +150 µs."""
    for r in range(3):
        off = OFFSET[r]
        b = TraceBuilder(rank=r, world_size=3, backend="gloo")
        b.step(1, 0 + off, 2500).step(2, 2500 + off, 2500)
        b.cpu("aten::mm", 10 + off, 5)
        b.write(tmp_path / f"rank{r}.trace.json")
        recs = [record("all_reduce", i, t + ARRIVAL[r] + off, t + 150 + off)
                for i, t in enumerate((1000, 2000, 3000, 4000), start=1)]
        write_sidecar(tmp_path / f"rank{r}.comms.json", "comms", r, {
            "process_groups": [{"name": "0", "desc": "default_pg", "ranks": [0, 1, 2], "size": 3,
                                "dim": "dp"}], "records": recs})
    return load_traces(tmp_path)


def test_clock_offsets_waits_and_stragglers(tmp_path):
    s = compute_sync(straggler_run(tmp_path))
    assert s.matched_by == "records"
    assert dict(zip(s.offsets["rank"], s.offsets["offset_us"])) == OFFSET
    assert len(s.instances) == 4
    inst = s.instances.iloc[0]
    assert (inst["op"], inst["ranks"], inst["arrival_skew_us"], inst["transfer_us"],
            inst["last_rank"]) == ("all_reduce", 3, 100.0, 50.0, 2)
    waits = s.per_rank[s.per_rank["instance"] == inst["instance"]].set_index("rank")["wait_us"]
    assert waits.to_dict() == {0: 100.0, 1: 80.0, 2: 0.0}
    st = s.stragglers.set_index("rank")
    assert list(s.stragglers["rank"]) == [2, 0, 1]
    # rank 2 keeps rank 0 waiting 100 µs and rank 1 80 µs in each of 4 instances
    assert st.loc[2, "wait_caused_us"] == 4 * 180.0
    assert st.loc[0, "wait_suffered_us"] == 400.0 and st.loc[1, "wait_suffered_us"] == 320.0
    assert (st.loc[2, "last_arrivals"], st.loc[2, "steps_as_top"]) == (4, 2)


def test_bandwidth(tmp_path):
    s = compute_sync(straggler_run(tmp_path))
    inst = s.instances.iloc[0]
    # algbw = 1e6 B / 50 µs = 20 GB/s; busbw = 20 × 2(n-1)/n, n = 3
    assert inst["algbw_gbps"] == pytest.approx(20.0)
    assert inst["busbw_gbps"] == pytest.approx(20.0 * 4 / 3)
    bw = s.bandwidth.iloc[0]
    assert (bw["pg"], bw["op"], bw["bytes"], bw["count"], bw["inter_node"]) == (
        "0", "all_reduce", 1_000_000, 4, "unknown")
    assert busbw_factor("all_gather", 4) == 0.75 and busbw_factor("send", 2) == 1.0


def test_bandwidth_split_intra_and_inter_node(tmp_path):
    straggler_run(tmp_path)
    for r, host in ((0, "a"), (1, "a"), (2, "b")):
        write_sidecar(tmp_path / f"rank{r}.meta.json", "rank", r, {"host": host})
    s = compute_sync(load_traces(tmp_path))
    assert s.instances["inter_node"].tolist() == [True] * 4
    assert s.bandwidth["inter_node"].tolist() == ["inter"]


def test_trace_order_matching_without_records(tmp_path):
    """NCCL kernels of two ranks, no records: matched by order; rank 1 late by 30 µs."""
    for r in (0, 1):
        b = TraceBuilder(rank=r)
        b.step(1, 0, 1000)
        late = 30.0 * r
        b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 100 + late, 60 - late, stream=20,
                 launch_ts=50, args={"Collective name": "allreduce", "In msg nelems": 1000,
                                     "Out msg nelems": 1000, "dtype": "Float", "Group size": 2,
                                     "Process Group Name": "0"})
        b.kernel("ncclDevKernel_AllGather_RING_LL(x)", 300, 40, stream=20, launch_ts=60,
                 args={"Collective name": "allgather", "Out msg nelems": 2000, "dtype": "Float",
                       "Group size": 2, "Process Group Name": "0"})
        b.write(tmp_path / f"rank{r}.json")
    s = compute_sync(load_traces(tmp_path))
    assert s.matched_by == "order" and len(s.instances) == 2
    ar = s.instances.set_index("op").loc["all_reduce"]
    assert (ar["arrival_skew_us"], ar["transfer_us"], ar["last_rank"], ar["bytes"]) == (
        30.0, 30.0, 1, 4000)
    assert s.stragglers.iloc[0]["rank"] == 1 and s.stragglers.iloc[0]["wait_caused_us"] == 30.0


def pipeline_run(tmp_path, schedule="ScheduleGPipe"):
    """GPipe, p = 2, m = 2, forward 10 µs, backward 20 µs, no gaps but the pipeline's own."""
    chunks = {0: [("F", 0, 0, 10), ("F", 1, 10, 20), ("B", 1, 50, 70), ("B", 0, 70, 90)],
              1: [("F", 0, 10, 20), ("F", 1, 20, 30), ("B", 1, 30, 50), ("B", 0, 50, 70)]}
    for r, cs in chunks.items():
        b = TraceBuilder(rank=r, backend="gloo")
        b.step(0, 0, 100)
        b.write(tmp_path / f"rank{r}.trace.json")
        recs = []
        for step in (1, 2):  # two identical steps, 1000 µs apart
            recs += [{"stage": r, "microbatch": mb, "phase": ph, "start_us": s + 1000 * step,
                      "end_us": e + 1000 * step, "optimizer_step": step, "profiled": step == 1}
                     for ph, mb, s, e in cs]
        write_sidecar(tmp_path / f"rank{r}.pipeline.json", "pipeline", r, {"records": recs})
    write_sidecar(tmp_path / "run.json", "run", None, {"world_size": 2, "layout": {
        "dims": {"pp": 2}, "strategies": ["pipeline"], "pipeline": {
            "schedule": schedule, "stages": 2, "microbatches": 2, "pp_group_size": 2,
            "stages_per_rank": 1}}})
    return load_traces(tmp_path)


def test_pipeline_bubbles_match_the_ideal_exactly(tmp_path):
    p = compute_pipeline(pipeline_run(tmp_path))
    assert p.schedule == {"schedule": "ScheduleGPipe", "p": 2, "m": 2, "v": 1, "stages": 2,
                          "ideal_from": "replay"}
    b = p.bubbles.set_index(["rank", "step"])
    for step in (1, 2):
        r0, r1 = b.loc[(0, step)], b.loc[(1, step)]
        assert (r0["window_us"], r0["busy_us"], r0["bubble_us"]) == (90.0, 60.0, 30.0)
        assert r0["bubble_pct"] == pytest.approx(100 / 3) == r0["ideal_pct"]
        # rank 0: forwards [0,20), turn-around [20,50) idle, backwards [50,90)
        assert (r0["warmup_bubble_us"], r0["steady_bubble_us"], r0["cooldown_bubble_us"]) == (
            0.0, 30.0, 0.0)
        # rank 1: waits 10 µs for its first input, 20 µs after its last backward
        assert (r1["warmup_bubble_us"], r1["steady_bubble_us"], r1["cooldown_bubble_us"]) == (
            10.0, 0.0, 20.0)
    assert list(b.loc[(0, 1)][["profiled"]]) == [True] and not b.loc[(0, 2)]["profiled"]
    assert ideal_bubble_pct(4, 8) == pytest.approx(100 * 3 / 11)
    assert ideal_bubble_pct(4, 8, v=2) == pytest.approx(100 * 3 / 19)


def test_pipeline_bubbles_follow_clock_offsets(tmp_path):
    traces = pipeline_run(tmp_path)
    shifted = compute_pipeline(traces, offsets={1: -5.0})   # rank 1 read 5 µs behind
    r1 = shifted.bubbles.set_index(["rank", "step"]).loc[(1, 1)]
    assert r1["window_us"] == 90.0 and r1["warmup_bubble_us"] == 15.0


def test_pipeline_estimate_without_records(tmp_path):
    b = TraceBuilder(rank=0, backend="gloo")
    b.thread_name(1, "python3")
    b.step(1, 0, 100)
    b.cpu("aten::mm", 0, 40)
    b.cpu("c10d::recv_", 40, 30)
    b.cpu("aten::mm", 70, 20)
    b.write(tmp_path / "rank0.json")
    traces = load_traces(tmp_path)
    steps = compute_time_breakdown(traces).steps
    p = compute_pipeline(traces, breakdown_steps=steps, p2p_ranks={0})
    row = p.bubbles.iloc[0]
    # idle [90,100) + exposed recv [40,70) = 40 of 100
    assert (row["method"], row["bubble_us"], row["bubble_pct"]) == ("estimate", 40.0, 40.0)


def test_imbalance_per_dimension_group(tmp_path):
    for r, work in ((0, 30.0), (1, 50.0)):
        b = TraceBuilder(rank=r, backend="gloo")
        b.step(1, 0, 100)
        b.cpu("aten::mm", 0, work)
        b.write(tmp_path / f"rank{r}.trace.json")
        write_sidecar(tmp_path / f"rank{r}.comms.json", "comms", r, {"records": [],
                      "process_groups": [{"name": "0", "desc": "default_pg", "ranks": [0, 1],
                                          "size": 2, "dim": "dp"}]})
    traces = load_traces(tmp_path)
    bal = compute_balance(traces, compute_time_breakdown(traces).steps)
    g = bal.groups.iloc[0]
    assert (g["dim"], g["pg"], g["max_us"], g["mean_us"], g["imbalance"], g["cost_us"],
            g["slowest_rank"]) == ("dp", "0", 50.0, 40.0, 1.25, 10.0, 1)


def test_memory_per_rank_and_imbalance(tmp_path):
    for r, (static, peak) in enumerate(((100, 300), (100, 500))):
        b = TraceBuilder(rank=r, backend="gloo")
        b.step(1, 0, 100)
        for ts, alloc in ((1, peak // 2), (5, peak), (9, peak // 4)):
            b.events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]",
                             "pid": 100, "tid": 1, "ts": ts, "args": {
                                 "Total Allocated": alloc, "Total Reserved": 0, "Bytes": 1,
                                 "Device Type": 0, "Device Id": -1}})
        b.write(tmp_path / f"rank{r}.trace.json")
        write_sidecar(tmp_path / f"rank{r}.meta.json", "rank", r, {"host": "h", "memory": {
            "static": {"params_bytes": 25, "grads_bytes": 25, "optimizer_state_bytes": 50,
                       "total_bytes": static}, "peak_rss_bytes": 10_000}})
    m = compute_memory(load_traces(tmp_path))
    rows = m.per_rank.set_index("rank")
    assert rows.loc[0, "static_bytes"] == 100 and rows.loc[1, "optimizer_state_bytes"] == 50
    assert (rows.loc[0, "peak_allocated_bytes"], rows.loc[1, "peak_allocated_bytes"]) == (300, 500)
    assert m.imbalance == {"static": 1.0, "peak": 500 / 400}
    assert len(m.timeline) == 6 and m.timeline["allocated_bytes"].max() == 500


def test_layout_groups_spanning_nodes(tmp_path):
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    groups = [{"name": "1", "desc": "mesh_dp", "ranks": [0, 2], "size": 2, "dim": "dp"},
              {"name": "2", "desc": "mesh_dp", "ranks": [1, 3], "size": 2, "dim": "dp"},
              {"name": "3", "desc": "mesh_tp", "ranks": [0, 1], "size": 2, "dim": "tp"},
              {"name": "4", "desc": "mesh_tp", "ranks": [2, 3], "size": 2, "dim": "tp"}]
    for r in range(4):
        TraceBuilder(rank=r, world_size=4).write(tmp_path / f"rank{r}.trace.json")
        write_sidecar(tmp_path / f"rank{r}.meta.json", "rank", r, {"host": hosts[r]})
        mine = [g for g in groups if r in g["ranks"]]
        write_sidecar(tmp_path / f"rank{r}.comms.json", "comms", r,
                      {"process_groups": mine, "records": []})
    write_sidecar(tmp_path / "run.json", "run", None, {"world_size": 4, "layout": {
        "dims": {"dp": 2, "tp": 2}, "strategies": ["fsdp2", "tp"]}})
    lay = compute_layout(load_traces(tmp_path))
    assert lay.dims == {"dp": 2, "tp": 2} and lay.nodes == {"a": [0, 1], "b": [2, 3]}
    spans = dict(zip(lay.groups["pg"], lay.groups["spans_nodes"]))
    assert spans == {"1": True, "2": True, "3": False, "4": False}


def test_report_json_carries_every_analysis(tmp_path):
    data = report_json(build_report(straggler_run(tmp_path)))
    assert data["sync"]["stragglers"][0]["rank"] == 2
    assert data["sync"]["clock_offsets"][1]["offset_us"] == 500.0
    assert data["pipeline"] is None
    assert {"imbalance", "memory", "layout"} <= set(data)
    assert all(not (isinstance(v, float) and math.isnan(v))
               for r in data["sync"]["instances"] for v in r.values())


def test_concurrent_collectives_count_waiting_once(tmp_path):
    """Two DDP-style buckets in flight together: rank 1 arrives 30 µs late to both; rank 0's
    waiting intervals [100,130) and [105,135) overlap, so it waited 35 µs, not 60."""
    for r in (0, 1):
        b = TraceBuilder(rank=r, backend="gloo")
        b.step(1, 0, 1000)
        b.write(tmp_path / f"rank{r}.trace.json")
        late = 30.0 * r
        recs = [record("all_reduce", 1, 100 + late, 200, ranks=(0, 1)),
                record("all_reduce", 2, 105 + late, 220, ranks=(0, 1))]
        write_sidecar(tmp_path / f"rank{r}.comms.json", "comms", r, {
            "process_groups": [{"name": "0", "desc": "default_pg", "ranks": [0, 1], "size": 2,
                                "dim": "dp"}], "records": recs})
    s = compute_sync(load_traces(tmp_path))
    st = s.stragglers.set_index("rank")
    assert st.loc[0, "wait_suffered_us"] == 35.0 and st.loc[1, "wait_caused_us"] == 35.0
    assert st.loc[1, "wait_suffered_us"] == 0.0
    # per instance the TensorBoard definition still holds: duration - transfer
    assert sorted(s.per_rank[s.per_rank["rank"] == 0]["wait_us"]) == [30.0, 30.0]


def test_bubble_summary_leaves_out_the_warm_up_and_export_steps_without_clean_steps():
    """A run that ended with its profiler window has no unprofiled step to summarize: its
    profiled steps are, not the step after the window (the trace's export) nor the
    profiler's warm-up step."""
    import pandas as pd

    from pardiag.analyzer.analyses.pipeline import BUBBLE_COLUMNS, summarize_bubbles

    rows = [dict(rank=0, stages="0", step=s, window_us=100.0, busy_us=100.0 - pct,
                 bubble_us=pct, bubble_pct=pct, warmup_bubble_us=0.0, steady_bubble_us=pct,
                 cooldown_bubble_us=0.0, ideal_pct=20.0, method="measured", profiled=prof,
                 clean=False)
            for s, pct, prof in ((1, 70.0, False), (2, 50.0, True), (3, 52.0, True),
                                 (4, 54.0, True), (5, 84.0, False))]
    got = summarize_bubbles(pd.DataFrame(rows, columns=list(BUBBLE_COLUMNS))).iloc[0]
    assert (got["basis"], got["steps"], got["bubble_pct"]) == ("profiled", 3, 52.0)
    rows[0]["clean"] = True
    got = summarize_bubbles(pd.DataFrame(rows, columns=list(BUBBLE_COLUMNS))).iloc[0]
    assert (got["basis"], got["steps"], got["bubble_pct"]) == ("unprofiled", 1, 70.0)


def test_pipeline_bubble_gaps_summary_and_typical_step(tmp_path):
    """The Gantt chart's red bars, its step and the summary table come from the analysis: in
    each step's window [0, 90) µs (+1000·step), rank 0 idles in the turn-around [20, 50), rank
    1 before its first input [0, 10) and after its last backward [70, 90); their lengths add up
    to each rank's bubble."""
    p = compute_pipeline(pipeline_run(tmp_path))
    gaps = {(s, r): list(zip(g["start_us"], g["end_us"]))
            for (s, r), g in p.gaps.groupby(["step", "rank"])}
    for step in (1, 2):
        t = 1000.0 * step
        assert gaps[(step, 0)] == [(t + 20, t + 50)]
        assert gaps[(step, 1)] == [(t, t + 10), (t + 70, t + 90)]
    lengths = (p.gaps["end_us"] - p.gaps["start_us"]).groupby(
        [p.gaps["step"], p.gaps["rank"]]).sum()
    assert lengths.to_dict() == p.bubbles.set_index(["step", "rank"])["bubble_us"].to_dict()
    # no clean step (step 2 follows the profiled window): the middle of steps 1, 2 is 2
    assert p.typical_step == 2
    # the summary is the profiled step 1 (step 2 is the trace's export)
    s = p.summary.set_index("rank")
    assert list(p.summary.columns) == ["rank", "stages", "steps", "basis", "bubble_pct",
                                       "ideal_pct", "warmup_us", "steady_us", "cooldown_us",
                                       "window_us"]
    assert (s.loc[0, "basis"], s.loc[0, "steps"], s.loc[0, "window_us"]) == ("profiled", 1, 90.0)
    assert s.loc[0, "bubble_pct"] == pytest.approx(100 / 3)
    assert (s.loc[0, "warmup_us"], s.loc[0, "steady_us"], s.loc[0, "cooldown_us"]) == (
        0.0, 30.0, 0.0)
    assert (s.loc[1, "warmup_us"], s.loc[1, "steady_us"], s.loc[1, "cooldown_us"]) == (
        10.0, 0.0, 20.0)


def test_typical_step_is_the_middle_clean_step():
    import pandas as pd

    from pardiag.analyzer.analyses.pipeline import BUBBLE_COLUMNS, typical_step

    rows = [dict.fromkeys(BUBBLE_COLUMNS) | {"step": s, "clean": clean}
            for s, clean in ((1, False), (2, True), (3, True), (4, True), (5, False))]
    bub = pd.DataFrame(rows, columns=list(BUBBLE_COLUMNS))
    assert typical_step(bub) == 3
    assert typical_step(bub.assign(clean=False)) == 3
    assert typical_step(bub[bub["step"] < 3].assign(clean=False)) == 2
    assert typical_step(bub.iloc[:0]) is None


def test_busbw_per_group_and_instance_counts(tmp_path):
    """4 all-reduces of 1 MB on group 0 with a 50 µs transfer each: busbw = 1e6 B / 50 µs ×
    2(n−1)/n = 80/3 GB/s for every one (median and max), 4 measured."""
    s = compute_sync(straggler_run(tmp_path))
    g = s.group_busbw
    assert list(g.columns) == ["pg", "busbw_median", "busbw_max", "count"]
    assert g["pg"].tolist() == ["0"] and g["count"].tolist() == [4]
    assert g["busbw_median"].iloc[0] == pytest.approx(80 / 3)
    assert g["busbw_max"].iloc[0] == pytest.approx(80 / 3)
    assert s.counts == {"instances": 4, "collectives": 4, "p2p": 0, "complete": 4}


def test_busbw_per_group_takes_median_and_max_over_its_instances():
    import pandas as pd

    from pardiag.analyzer.analyses.sync import busbw_by_group, instance_counts

    inst = pd.DataFrame({"instance": ["a", "b", "c", "p2p:0", "d"], "pg": [1, 1, 1, 2, 3],
                         "busbw_gbps": [10.0, 30.0, 20.0, 5.0, float("nan")],
                         "complete": [True, True, False, True, True]})
    g = busbw_by_group(inst).set_index("pg")
    assert g.index.tolist() == ["1", "2"]   # group 3 measured nothing
    assert g.loc["1"].tolist() == [20.0, 30.0, 3]
    assert g.loc["2"].tolist() == [5.0, 5.0, 1]
    assert instance_counts(inst) == {"instances": 5, "collectives": 4, "p2p": 1, "complete": 4}
    assert busbw_by_group(pd.DataFrame()).empty
    assert instance_counts(pd.DataFrame()) == {"instances": 0, "collectives": 0, "p2p": 0,
                                               "complete": 0}


def test_a_device_range_belongs_to_the_step_that_launched_it(tmp_path):
    """Nothing synchronises in the loop, so the host runs ahead: each step's host range
    ``PP:0F0`` opens at 100 µs into its profiler step, while its device copy runs from 1,050 µs,
    inside the next host step. Each device range is the step's that launched it (the k-th
    device range of a name is the k-th host range of that name), not the host step its device
    time falls in; the last one is not left out as outside every step."""
    from pardiag.analyzer.per_rank.layout_marks import rank_marks_of_trace

    b = TraceBuilder(rank=0)
    for k, base in enumerate((0.0, 1000.0)):
        b.step(k + 1, base, 1000)
        b.cpu("PP:0F0", base + 100, 20, cat="user_annotation")
        b.kernel("PP:0F0", base + 1050, 250, cat="gpu_user_annotation")
        b.kernel("void gemm_kernel<float>(float*)", base + 1050, 250, launch_ts=base + 110)
    b.write(tmp_path / "rank0.json")
    trace = load_traces(tmp_path).ranks[0]
    chunks = rank_marks_of_trace(trace).chunks
    assert chunks[["stage", "phase", "microbatch", "step", "start_us"]].values.tolist() == [
        [0, "F", 0, 1, 1050.0], [0, "F", 0, 2, 2050.0]]
