"""Record normalisation, placement on the trace, and hang diagnosis — on planted data."""

from pardiag.analyzer.analyses.hang import describe, describe_p2p, diagnose_hang, diagnose_p2p
from pardiag.analyzer.trace import load_traces
from pardiag.analyzer.trace.comm_records import (
    attach_trace_times,
    records_from_flight_recorder,
    records_from_p2p,
)

from .synth import TraceBuilder, write_sidecar

BASE = 1_700_000_000_000_000_000  # baseTimeNanoseconds of the planted traces
GROUPS = [{"name": "0", "desc": "default_pg", "ranks": [0, 1], "size": 2},
          {"name": "1", "desc": "mesh_tp", "ranks": [0, 1], "size": 2}]


def fr(seq, name, t_us, sizes=((1000,),), out_sizes=None, pg=("0", "default_pg"), dtype="Float"):
    return {"collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False, "profiling_name": name,
            "process_group": list(pg), "input_sizes": [list(s) for s in sizes],
            "output_sizes": [list(s) for s in (out_sizes or sizes)],
            "input_dtypes": [dtype] * len(sizes),
            "output_dtypes": [dtype] * len(out_sizes or sizes),
            "time_created_ns": BASE + int(t_us * 1000), "state": "scheduled"}


def test_flight_recorder_records_sizes_and_groups():
    recs = records_from_flight_recorder(
        [fr(3, "gloo:all_gather", 10, sizes=((500,),), out_sizes=((2, 500),), pg=("1", "mesh_tp"),
            dtype="BFloat16")], GROUPS)
    r = recs[0]
    assert (r["op"], r["pg_name"], r["pg_desc"], r["pg_ranks"], r["seq"]) == (
        "all_gather", "1", "mesh_tp", [0, 1], 3)
    # nccl-tests' S for all_gather is the gathered buffer: 2 × 500 bf16 = 2000 bytes
    assert (r["in_bytes"], r["out_bytes"], r["bytes"], r["dtype"]) == (1000, 2000, 2000, "BFloat16")


def test_an_all_gather_recorded_with_its_input_as_output_counts_the_gathered_buffer(tmp_path):
    """DTensor's functional all-gathers reach the flight recorder with the input's size as the
    output's (measured: 256 KiB for TP's 512 KiB gathers at tp=2): the full buffer is the input
    × the group's size. A reduce-scatter (its input is the full buffer) and a one-rank gather
    keep the larger size. Run folders written before the repair get it when loaded."""
    recs = records_from_flight_recorder(
        [fr(1, "gloo:all_gather", 10, sizes=((512,),), pg=("1", "mesh_tp")),
         fr(2, "gloo:reduce_scatter", 20, sizes=((1024,),), pg=("1", "mesh_tp"))], GROUPS)
    assert [(r["in_bytes"], r["out_bytes"], r["bytes"]) for r in recs] == [
        (2048, 2048, 4096), (4096, 4096, 4096)]
    one = records_from_flight_recorder([fr(1, "gloo:all_gather", 10, sizes=((512,),))],
                                       [{"name": "0", "desc": "default_pg", "ranks": [0]}])
    assert one[0]["bytes"] == 2048
    # an older run folder's comms sidecar with the recorder's size: repaired on load
    b = TraceBuilder(rank=0, world_size=2, backend="gloo")
    b.cpu("aten::mm", 0, 100)
    b.write(tmp_path / "rank0.trace.json")
    write_sidecar(tmp_path / "rank0.comms.json", "comms", 0,
                  {"process_groups": GROUPS, "records": [{**recs[0], "bytes": 2048}]})
    traces = load_traces(tmp_path)
    assert traces.sidecars["comms"][0].records[0].bytes == 4096


def test_p2p_records_count_per_peer():
    raw = [{"op": "send", "peer": 1, "pg_name": "0", "bytes": 400, "dtype": "float32",
            "issue_ns": BASE + 5000, "source": "p2p_hook"},
           {"op": "send", "peer": 1, "pg_name": "0", "bytes": 400, "dtype": "float32",
            "issue_ns": BASE + 9000, "source": "p2p_hook"},
           {"op": "recv", "peer": 1, "pg_name": "0", "bytes": 400, "dtype": "float32",
            "issue_ns": BASE + 7000, "source": "p2p_hook"}]
    recs = records_from_p2p(raw, GROUPS)
    assert [(r["op"], r["seq"], r["peer"], r["numel"]) for r in recs] == [
        ("send", 1, 1, 100), ("recv", 1, 1, 100), ("send", 2, 1, 100)]


def _cpu_trace(tmp_path):
    b = TraceBuilder(rank=0, backend="gloo")
    b.thread_name(2, "thread 2 (pt_gloo_runloop)")
    b.cpu("c10d::allreduce_", 100, 5)
    b.cpu("c10d::_reduce_scatter_base_", 200, 5)
    b.cpu("c10d::allreduce_", 300, 5)
    # worker events: the first all_reduce runs at 110-150, the reduce_scatter (as an
    # all_reduce of 2000 elements) at 210-260, the second all_reduce at 320-330
    b.cpu("gloo:all_reduce", 110, 40, tid=2, cat="user_annotation", args={"Input Dims": [[1000]]})
    b.cpu("gloo:all_reduce", 210, 50, tid=2, cat="user_annotation", args={"Input Dims": [[2000]]})
    b.cpu("gloo:all_reduce", 320, 10, tid=2, cat="user_annotation", args={"Input Dims": [[1000]]})
    d = b.doc()
    d["baseTimeNanoseconds"] = BASE
    import json
    (tmp_path / "t.json").write_text(json.dumps(d))
    return load_traces(tmp_path).ranks[0]


def test_records_placed_on_gloo_worker_events(tmp_path):
    trace = _cpu_trace(tmp_path)
    raw = records_from_flight_recorder([
        fr(1, "gloo:all_reduce", 101),
        fr(2, "gloo:all_reduce", 201, sizes=((2000,),)),
        fr(3, "gloo:all_reduce", 301),
        fr(0, "gloo:all_reduce", -5000),  # before the trace: a ring-buffer leftover
    ], GROUPS)
    recs = attach_trace_times(raw, trace)
    got = [(r["seq"], r["op"], r.get("transport_op"), r["issue_us"], r["start_us"], r["end_us"],
            r["matched"]) for r in recs]
    assert got == [(1, "all_reduce", None, 101.0, 110.0, 150.0, "gloo"),
                   (2, "reduce_scatter", "all_reduce", 201.0, 210.0, 260.0, "gloo"),
                   (3, "all_reduce", None, 301.0, 320.0, 330.0, "gloo")]


def test_records_placed_on_nccl_kernels(tmp_path):
    import json
    b = TraceBuilder(rank=0)
    b.cpu("record_param_comms", 100, 10, args={"Collective name": "allreduce"})
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 130, 25, stream=20, launch_ts=104)
    b.kernel("void gemm(float*)", 120, 30)
    d = b.doc()
    d["baseTimeNanoseconds"] = BASE
    (tmp_path / "t.json").write_text(json.dumps(d))
    trace = load_traces(tmp_path).ranks[0]
    recs = attach_trace_times(records_from_flight_recorder(
        [fr(7, "nccl:all_reduce", 102)], GROUPS), trace)
    assert [(r["start_us"], r["end_us"], r["matched"], r.get("stream")) for r in recs] == [
        (130.0, 155.0, "kernel", 20)]


def _dump(rank, seqs, stack_line):
    return {"flight_recorder": [{"collective_seq_id": s, "profiling_name": "gloo:all_reduce",
                                 "process_group": ["0", "default_pg"], "is_p2p": False}
                                for s in seqs],
            "process_groups": [{"name": "0", "desc": "default_pg", "ranks": [0, 1, 2]}],
            "main_stack": [f'  File "train.py", line 9, in {stack_line}\n    x()\n']}


def test_hang_names_the_missing_rank():
    dumps = {0: _dump(0, range(1, 13), "backward"), 1: _dump(1, range(1, 11), "plant"),
             2: _dump(2, range(1, 13), "backward")}
    stuck = diagnose_hang(dumps, 3)
    assert len(stuck) == 1
    s = stuck[0]
    assert (s.pg_name, s.seq, s.waiting, s.missing, s.last_seq) == ("0", 11, (0, 2), (1,), {1: 10})
    assert describe(s, {r: d["main_stack"] for r, d in dumps.items()}) == (
        "rank(s) [0, 2] wait in gloo:all_reduce #11 on process group 0 (default_pg); missing: "
        'rank 1 (last entered #10; at File "train.py", line 9, in plant)')


def test_hang_with_a_rank_that_wrote_no_dump():
    stuck = diagnose_hang({0: _dump(0, [1, 2], "x"), 1: _dump(1, [1, 2], "x")}, 3)
    assert [(s.seq, s.waiting, s.missing) for s in stuck] == [(1, (0, 1), (2,))]


def test_no_hang_when_all_entered():
    assert diagnose_hang({0: _dump(0, [1, 2], "x"), 1: _dump(1, [1, 2], "x"),
                          2: _dump(2, [1, 2], "x")}, 3) == []


def test_hang_names_the_scripts_frame_below_torchs():
    """A rank stuck inside torch is placed in the user's script too: the frame they can act
    on, not only the innermost one."""
    dumps = {0: _dump(0, range(1, 4), "x"), 1: _dump(1, range(1, 3), "x")}
    for d in dumps.values():
        d["process_groups"][0]["ranks"] = [0, 1]
    dumps[1]["main_stack"] = [
        '  File "/w/train.py", line 30, in <module>\n    main()\n',
        '  File "/w/train.py", line 12, in main\n    dist.barrier()\n',
        '  File "/t/torch/distributed/c10d.py", line 4, in barrier\n    work.wait()\n']
    (s,) = diagnose_hang(dumps, 2)
    assert describe(s, {r: d["main_stack"] for r, d in dumps.items()}, "/w/train.py").endswith(
        'rank 1 (last entered #2; at File "/t/torch/distributed/c10d.py", line 4, in barrier, '
        'called from File "/w/train.py", line 12, in main)')
    # where the innermost frame is the script's own, it is named once
    dumps[1]["main_stack"] = dumps[1]["main_stack"][:2]
    assert describe(s, {1: dumps[1]["main_stack"]}, "/w/train.py").endswith(
        'at File "/w/train.py", line 12, in main)')


def _p2p(calls, stack_line):
    return {"flight_recorder": [], "process_groups": [],
            "p2p": [{"op": op, "peer": peer, "pg_name": "0", "seq": seq}
                    for op, peer, seq in calls],
            "main_stack": [f'  File "train.py", line 9, in {stack_line}\n    x()\n']}


def test_a_pipeline_hang_names_the_send_never_received():
    """A 2-stage pipeline on gloo (no point-to-point entries in its flight recorder): rank 0
    sent #203 to rank 1, which received up to #202 and sleeps; the sends and receives the other
    way match. Rank 1 waiting on a receive whose send never came is named the other way."""
    dumps = {0: _p2p([("send", 1, 202), ("recv", 1, 202), ("send", 1, 203)], "wait"),
             1: _p2p([("recv", 0, 202), ("send", 0, 202)], "plant")}
    assert diagnose_hang(dumps, 2) == []
    (s,) = diagnose_p2p(dumps)
    assert (s.waiting, s.op, s.seq, s.peer, s.peer_seq) == (0, "send", 203, 1, 202)
    stacks = {r: d["main_stack"] for r, d in dumps.items()}
    assert describe_p2p(s, stacks) == (
        "rank 0's send #203 to rank 1 on process group 0 was never received: rank 1 received "
        'up to #202 (at File "train.py", line 9, in plant)')
    dumps[1]["p2p"].append({"op": "recv", "peer": 0, "pg_name": "0", "seq": 204})
    dumps[0]["p2p"][-1]["seq"] = 203
    dumps[1]["p2p"][0]["seq"] = 203
    (s,) = diagnose_p2p(dumps)
    assert describe_p2p(s, stacks) == (
        "rank 1 waits on its receive #204 from rank 0 on process group 0, never sent: rank 0 "
        'sent up to #203 (at File "train.py", line 9, in wait)')
    # matched calls, or a pair whose other side is not in the dumps: nothing said
    assert diagnose_p2p({0: _p2p([("send", 1, 5)], "x"), 1: _p2p([("recv", 0, 5)], "x")}) == []
    assert diagnose_p2p({0: _p2p([("send", 1, 5)], "x"), 1: _p2p([], "x")}) == []
