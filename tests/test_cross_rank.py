"""Cross-rank results on planted multi-rank traces whose right answers are known:
process groups by their ranks, sequence numbers before position, point-to-point pairs, several
windows per rank, merged multi-rank files, missing ranks, clocks per host, and the shared
repro cases in ../shared/repros (each with its expect.json)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from pardiag.analyzer.analyses.breakdown import compute_time_breakdown
from pardiag.analyzer.analyses.sync import compute_sync
from pardiag.analyzer.per_rank import REDUCER
from pardiag.analyzer.trace import load_traces
from pardiag.analyzer.trace.classify import compile_comm_patterns, device_kind
from pardiag.analyzer.trace.comm_records import ranks_in_records
from pardiag.analyzer.trace.ranks import FileFacts, assign_ranks, merged_rank_of_pids
from pardiag.cli import cli

from .paths import REPROS
from .synth import TraceBuilder, write_sidecar

EPOCH = 1_700_000_000_000_000.0  # µs


def _nccl_args(op: str, ranks, name: str, seq: int | None = None, nelems: int = 1 << 20,
               **extra) -> dict:
    a = {"Collective name": op, "dtype": "Float", "In msg nelems": nelems,
         "Out msg nelems": nelems, "Group size": len(ranks), "Process Group Name": name,
         "Process Group Description": "", "Process Group Ranks": str(list(ranks))}
    if seq is not None:
        a["Seq"] = str(seq)
    a.update(extra)
    return a


def _coll(b: TraceBuilder, op: str, ranks, name: str, start: float, dur: float, launch: float,
          seq: int | None = None, stream: int = 20, **extra) -> None:
    b.kernel(f"ncclDevKernel_{op}(ncclDevKernelArgsStorage<4096ul>)", start, dur, stream=stream,
             launch_ts=launch, args=_nccl_args(op, ranks, name, seq, **extra))


def _report(args, tmp_path) -> dict:
    out = tmp_path / "s.json"
    res = CliRunner().invoke(cli, ["report", *map(str, args), "-q", "--no-cache", "--json",
                                   str(out), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    return json.loads(out.read_text())


# -- the shared repro cases -----------------------------------------------------------------------

#: Repro kinds the cross-rank model does not handle yet, with what goes wrong: each must fail
#: (strict), so that a change that fixes one says so by failing here.
OPEN_KINDS: dict[str, str] = {}


def _cases():
    if not REPROS.is_dir():
        return []
    names = sorted(d.name for d in REPROS.iterdir() if (d / "expect.json").is_file())
    return [pytest.param(n, marks=pytest.mark.xfail(reason=OPEN_KINDS[n], strict=True))
            if n in OPEN_KINDS else n for n in names]


@pytest.mark.parametrize("case", _cases())
def test_repro_case_gives_its_expected_values(case, tmp_path):
    """Every key of the case's expect.json, judged as ../shared/tools/check_repros.py does."""
    folder = REPROS / case
    exp = json.loads((folder / "expect.json").read_text())
    args = [folder]
    if exp.get("with_comm_kernel_regex"):
        args += ["--comm-kernel", exp["with_comm_kernel_regex"]]
    d = _report(args, tmp_path)
    ranks = {r["rank"]: r for r in d["ranks"]}
    if "ranks" in exp:
        assert len(ranks) == exp["ranks"]
    for r, v in exp.get("overlap_pct", {}).items():
        assert ranks[int(r)]["total"]["overlap_pct"] == pytest.approx(v, abs=0.05)
    for r, v in exp.get("compute_us", {}).items():
        assert ranks[int(r)]["total"]["compute_us"] == pytest.approx(v, rel=5e-4)
    offs = {o["rank"]: o["offset_us"] for o in d["sync"]["clock_offsets"]}
    for r, v in exp.get("clock_offset_us", {}).items():
        assert offs.get(int(r), 0.0) - offs.get(0, 0.0) == pytest.approx(v, abs=20)
    if "straggler" in exp:
        assert d["sync"]["straggler"] == exp["straggler"]
    if "layout_dims" in exp:   # degree-1 dimensions ignored
        got = {k: v for k, v in (d["layout"]["dims"] or {}).items() if v != 1}
        assert got == {k: v for k, v in exp["layout_dims"].items() if v != 1}
    for op, want in exp.get("collective_count", {}).items():
        for r in d["ranks"]:
            counts = {c["collective"]: c["count"] for c in r["collectives"]}
            assert counts.get(op) == want, (r["rank"], op)
    for op, want in exp.get("algbw_gbps", {}).items():
        got = [b["algbw_gbps"] for b in d["sync"]["bandwidth"] if b["op"] == op
               and b["algbw_gbps"]]
        assert got and all(g == pytest.approx(want, rel=0.05) for g in got), (op, got)
    if exp.get("clear_error_or_warning"):   # analysed, and the user is told what was assumed
        assert [w for w in d["warnings"] if "expect.json" not in w], d["warnings"]
    _extra_keys(exp, d)


def _extra_keys(exp: dict, d: dict) -> None:
    """The keys ../shared/tools/check_repros_extra.py judges: the verdict's straggler, the
    pipeline's layout and bubbles, what must not be inferred, a line that names the problem,
    and the step."""
    layout = d["layout"] or {}
    lp = layout.get("pipeline") or {}
    dims = {k: v for k, v in (layout.get("dims") or {}).items() if v != 1}
    if "verdict_straggler" in exp:
        assert d.get("straggler") == exp["verdict_straggler"]
    for k, want in (exp.get("pipeline_layout") or {}).items():
        got = lp.get(k)
        assert ({str(a): b for a, b in got.items()} if isinstance(got, dict) else got) == want, k
    summ = {str(r["rank"]): r["bubble_pct"] for r in (d.get("pipeline") or {}).get("summary") or []}
    for rank, want in (exp.get("bubble_pct") or {}).items():
        assert summ.get(rank) == pytest.approx(want, abs=0.5), rank
    if exp.get("pipeline_null"):
        assert d.get("pipeline") is None and not lp and "pp" not in dims
    for dim in exp.get("layout_dims_exclude") or []:
        assert dim not in dims, dims
    for st in exp.get("strategies_exclude") or []:
        assert st not in (layout.get("strategies") or []), layout.get("strategies")
    if exp.get("routing_empty"):
        ro = d.get("routing") or {}
        assert not ro.get("groups") and not ro.get("instances")
    if "warning_regex" in exp:
        lines = [*d["warnings"], *d["notes"], d.get("verdict") or ""]
        assert any(re.search(exp["warning_regex"], ln) for ln in lines), lines
    if "step_us" in exp:
        assert (d.get("step") or {}).get("median_us") == pytest.approx(exp["step_us"], rel=0.05)


def test_repro_cases_are_found():
    if not REPROS.is_dir():
        pytest.skip("../shared/repros is not beside the checkout")
    assert len(_cases()) >= 5


# -- rank assignment: a pure function
# ----------------------------------------------------------------

def test_assign_ranks_windows_overlaps_names_and_free_ranks():
    f = [FileFacts(0, Path("a.json"), 0, 0.0, 10.0),
         FileFacts(1, Path("b.json"), 0, 100.0, 110.0),       # rank 0's second window
         FileFacts(2, Path("c_rank3.json"), 0, 5.0, 20.0),     # overlaps a.json: name says 3
         FileFacts(3, Path("d.json"), 0, 2.0, 8.0),            # overlaps a.json, no name: out
         FileFacts(4, Path("e.json"), None, 0.0, 10.0),        # no rank at all: first free
         FileFacts(5, Path("f.json"), 7, 0.0, 10.0)]
    ranks, warnings = assign_ranks(f)
    assert [(r.rank, r.keys, r.source) for r in ranks] == [
        (0, (0, 1), "distributedInfo"), (1, (4,), "assigned"), (3, (2,), "file name"),
        (7, (5,), "distributedInfo")]
    assert any("rank 0: 2 files are 2 profiling windows" in w for w in warnings)
    assert any(w.startswith("d.json: rank 0 is already held by a.json") for w in warnings)
    assert any(w.startswith("e.json: no rank") and "treated as rank 1" in w for w in warnings)


def test_rankless_files_one_process_recorded_are_one_ranks_windows():
    """tensorboard_trace_handler's default names (``<host>_<pid>.<ms>.pt.trace.json``) and no
    distributedInfo: the three windows one process wrote (its pid in each, apart in time) are
    one rank's; a file of another process, and one of the same pid that overlaps them (another
    container's process), are ranks of their own."""
    p = frozenset({"40211"})
    f = [FileFacts(0, Path("node7_40211.1761000000513.pt.trace.json"), None, 0.0, 10.0,
                   processes=p),
         FileFacts(1, Path("node7_40211.1761000000525.pt.trace.json"), None, 12.0, 20.0,
                   processes=p),
         FileFacts(2, Path("node7_40211.1761000000537.pt.trace.json"), None, 24.0, 30.0,
                   processes=p),
         FileFacts(3, Path("node7_40212.1761000000513.pt.trace.json"), None, 0.0, 10.0,
                   processes=frozenset({"40212"})),
         FileFacts(4, Path("podb.json"), None, 1.0, 9.0, processes=p)]
    ranks, warnings = assign_ranks(f)
    assert [(r.rank, r.keys, r.source) for r in ranks] == [
        (0, (0, 1, 2), "assigned"), (1, (3,), "assigned"), (2, (4,), "assigned")]
    assert warnings[0] == (
        "node7_40211.1761000000513.pt.trace.json, node7_40211.1761000000525.pt.trace.json, "
        "node7_40211.1761000000537.pt.trace.json: no rank in distributedInfo or in the file "
        "name; one process's 3 profiling windows (its pid in each, apart in time), treated as "
        "rank 0")
    # without the processes known, each file is a rank of its own, as before
    ranks, _ = assign_ranks([dataclasses.replace(x, processes=frozenset()) for x in f])
    assert len(ranks) == 5


def test_rankless_files_take_the_rank_their_collectives_records_name():
    """A file that states no rank takes the one its records name as the caller's own, where
    every record agrees, no file claims it and no other file's records name it; else the
    lowest free rank, as before."""
    f = [FileFacts(0, Path("a.json"), None, 0.0, 10.0, records_ranks=(2,)),
         FileFacts(1, Path("b.json"), None, 0.0, 10.0, records_ranks=(0,)),
         FileFacts(2, Path("c.json"), None, 0.0, 10.0, records_ranks=(1, 3)),   # disagree
         FileFacts(3, Path("d.json"), None, 0.0, 10.0, records_ranks=(5,)),     # 5 is d's...
         FileFacts(4, Path("e.json"), None, 0.0, 10.0, records_ranks=(5,)),     # ...and e's
         FileFacts(5, Path("f.json"), 7, 0.0, 10.0),
         FileFacts(6, Path("g.json"), None, 0.0, 10.0, records_ranks=(7,))]     # 7 is f's
    ranks, warnings = assign_ranks(f)
    assert [(r.rank, r.keys, r.source) for r in ranks] == [
        (0, (1,), "records"), (1, (2,), "assigned"), (2, (0,), "records"), (3, (3,), "assigned"),
        (4, (4,), "assigned"), (5, (6,), "assigned"), (7, (5,), "distributedInfo")]
    assert warnings[0] == ("a.json: no rank in distributedInfo or in the file name; rank 2 "
                           "from its collectives' records (Rank in Process Group Ranks)")


def test_ranks_in_records_read_the_callers_own_rank_only():
    """``Rank`` is the caller's rank in the group for all-reduce, all-gather, reduce-scatter,
    all-to-all and barrier (at its place in the group's global ranks), the root's for a
    broadcast and the peer's for a send: only the first kind names the file's rank."""
    ev = pd.DataFrame({"name": ["record_param_comms"] * 6 + ["aten::mm"], "args": [
        {"Collective name": "allreduce", "Rank": 1, "Process Group Ranks": "[4, 6]"},
        {"Collective name": "broadcast", "Rank": 0, "Process Group Ranks": "[4, 6]"},
        {"Collective name": "send", "Rank": 0, "Process Group Ranks": "[4, 6]"},
        {"Collective name": "allgather", "Rank": 2, "Global rank start": 2,
         "Global rank stride": 2, "Group size": 4},
        {"Collective name": "allreduce", "Rank": 1, "Process Group Ranks": "[0, 1, ...]"},
        {"Collective name": "allreduce", "Rank": 9, "Process Group Ranks": "[4, 6]"},
        {"Rank": 3}]})
    assert ranks_in_records(ev) == [6]
    assert ranks_in_records(ev.iloc[1:]) == [6]        # the all-gather: 2 + 2 × 2
    assert ranks_in_records(ev.iloc[[1, 2, 4, 5, 6]]) == []


@pytest.mark.parametrize("summaries", [False, True])
def test_files_named_by_pid_without_distributed_info_are_ranked_by_their_records(
        tmp_path, summaries):
    """``init_process_group`` ran after the profiler started (no ``distributedInfo``) and
    ``tensorboard_trace_handler``'s names give pids, not ranks: each file's all-reduce records
    give its global rank, so rank r's planted compute (10·(r+1) µs) is read as rank r's, whether
    the loader holds the events or the summaries."""
    pids = {0: 31877, 1: 31875, 2: 31880, 3: 31874}      # name order: ranks 3, 1, 0, 2
    for r, pid in pids.items():
        b = TraceBuilder(rank=None, pid=pid)
        b.thread_name(1, f"thread 1 (python3 {pid})")
        b.step(1, 0, 100)
        b.kernel("void gemm_kernel<float>(float*)", 1, 10 * (r + 1), launch_ts=0.5)
        for i in range(2):
            b.cpu("record_param_comms", 60 + 10 * i, 1, args={
                "Collective name": "allreduce", "Rank": r, "Group size": 4,
                "Process Group Ranks": "[0, 1, 2, 3]"})
        b.cpu("record_param_comms", 80, 1, args={   # the root, on every rank
            "Collective name": "broadcast", "Rank": 0, "Process Group Ranks": "[0, 1, 2, 3]"})
        b.write(tmp_path / f"trn-a100-07_{pid}.1761000015021.pt.trace.json")
    traces = (load_traces(tmp_path, reducer=REDUCER, workers=2, cache=False) if summaries
              else load_traces(tmp_path))
    assert [(t.rank, t.path.name.split(".")[0], t.rank_source) for t in traces.ranks.values()] == [
        (r, f"trn-a100-07_{pids[r]}", "records") for r in range(4)]
    tot = compute_time_breakdown(traces).totals.set_index("rank")
    assert tot["compute_us"].to_dict() == {0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0}


def test_merged_pids_need_two_named_ranks():
    names = {"0": ["rank 0"], "1": ["rank 0: GPU 0"], "1000": ["rank 1"], "1001": ["rank 1: GPU 1"]}
    assert merged_rank_of_pids(names, ["0", "1", "1000", "1001"], False) == {
        "0": 0, "1": 0, "1000": 1, "1001": 1}
    assert merged_rank_of_pids({"0": ["python"], "1": ["GPU 0"]}, ["0", "1"], False) is None
    # pardiag merge output: pid R * 1000 + k is rank R's even where a process is unnamed
    assert merged_rank_of_pids({"0": ["rank 0"], "1000": ["rank 1"]}, ["0", "2", "1000", "1003"],
                               True) == {"0": 0, "2": 0, "1000": 1, "1003": 1}


# -- process groups are sets of ranks --------------------------------------------------------------

def test_2d_mesh_groups_with_reused_names_are_told_apart_by_their_ranks(tmp_path):
    # mesh (dp, tp) = 2 x 2: tp groups {0,1} {2,3}, dp groups {0,2} {1,3}. Every rank calls its
    # tp group "1" and its dp group "2". Rank 3 reaches its tp all-reduce 300 µs late; only
    # rank 2 waits for it. Matched by name, ranks 0 and 1 would "wait" for rank 3 as well.
    tp = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}
    dp = {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}
    for r in range(4):
        b = TraceBuilder(rank=r, world_size=4)
        b.step(1, EPOCH, 2000)
        b.kernel("gemm_kernel", EPOCH + 10, 90, launch_ts=EPOCH + 1)
        late = 300.0 if r == 3 else 0.0
        tp_start = EPOCH + 100 + late
        _coll(b, "AllReduce", tp[r], "1", tp_start, 700 - (tp_start - EPOCH - 100) if r < 2
              else (1000 - (tp_start - EPOCH)), EPOCH + 2)
        _coll(b, "AllReduce", dp[r], "2", EPOCH + 1200, 100, EPOCH + 3)
        b.write(tmp_path / f"rank{r}.json")
    sync = compute_sync(load_traces(tmp_path))
    inst = sync.instances.set_index("instance")
    assert sorted(inst["group"]) == ["0,1", "0,2", "1,3", "2,3"]
    assert set(inst["ranks"]) == {2} and inst["complete"].all()
    assert sync.matched_by == "order"
    st = sync.stragglers.set_index("rank")
    assert sync.straggler == 3
    assert st.loc[3, "wait_caused_us"] == pytest.approx(300.0)
    assert st.loc[2, "wait_suffered_us"] == pytest.approx(300.0)
    assert st.loc[0, "wait_suffered_us"] == 0.0 and st.loc[1, "wait_suffered_us"] == 0.0


def test_sequence_numbers_match_windows_that_start_one_collective_apart(tmp_path):
    # Both ranks run all-reduces seq 1..4 every 1000 µs on one clock; rank 1's profiler started
    # one collective later (seq 2..4). By position, rank 1's seq 2 would pair with rank 0's
    # seq 1 and suggest a 1000 µs clock offset and a straggler.
    for r in (0, 1):
        b = TraceBuilder(rank=r)
        seqs = (1, 2, 3, 4) if r == 0 else (2, 3, 4)
        for s in seqs:
            t = EPOCH + 1000 * s
            b.step(s, t, 1000)
            b.kernel("gemm_kernel", t + 10, 100, launch_ts=t + 1)
            _coll(b, "AllReduce", (0, 1), "0", t + 200, 300, t + 2, seq=s)
        b.write(tmp_path / f"rank{r}.json")
    sync = compute_sync(load_traces(tmp_path))
    assert sync.matched_by == "sequence numbers"
    inst = sync.instances
    assert sorted(inst.loc[inst["complete"], "seq"]) == [2, 3, 4]
    assert (inst.loc[inst["complete"], "arrival_skew_us"] == 0.0).all()
    assert sync.offsets["offset_us"].tolist() == [0.0, 0.0]
    assert sync.offsets["instances"].tolist() == [3, 3]
    assert sync.straggler is None
    assert any("1 of 4 collective instance(s) lack members" in n for n in sync.notes)


# -- point-to-point is pairs ---------------------------------------------------------------------

def _pipeline(tmp_path: Path, slow_us: float) -> None:
    """3 stages, 2 microbatches, forward only, one clock. Stage s computes 400 µs per
    microbatch (stage 1: 400 + slow_us), then sends to s+1; each recv waits for its send."""
    compute = {0: 400.0, 1: 400.0 + slow_us, 2: 400.0}
    hop = 100.0
    ready = {}  # (stage, mb) -> time the activation leaves stage
    for s in range(3):
        for mb in range(2):
            arrive = EPOCH if s == 0 else ready[(s - 1, mb)] + hop
            free = ready.get((s, mb - 1), EPOCH) if mb else EPOCH
            ready[(s, mb)] = max(arrive, free) + compute[s]
    for s in range(3):
        b = TraceBuilder(rank=s, world_size=3)
        b.step(1, EPOCH, 20000)
        for mb in range(2):
            done = ready[(s, mb)]
            if s > 0:  # recv (own stream): posted when the stage is free or the send starts,
                # whichever is first; ends with the send
                free = ready.get((s, mb - 1), EPOCH) if mb else EPOCH
                posted = min(free, ready[(s - 1, mb)])
                src_end = ready[(s - 1, mb)] + hop
                b.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", posted,
                         src_end - posted, stream=31, launch_ts=posted - 1,
                         args=_nccl_args("recv", (0, 1, 2), "1", seq=2 * mb + 1, **{
                             "Src Rank": str(s - 1), "Rank": str(s - 1)}))
            b.kernel("gemm_kernel", done - compute[s], compute[s], launch_ts=done - compute[s] - 1)
            if s < 2:
                b.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", done, hop,
                         stream=30, launch_ts=done - 1,
                         args=_nccl_args("send", (0, 1, 2), "1", seq=2 * mb + 2, **{
                             "Dst Rank": str(s + 1), "Rank": str(s + 1)}))
        b.write(tmp_path / f"rank{s}.json")


def test_sends_pair_with_their_receives_and_a_slow_stage_is_the_one_waited_for(tmp_path):
    _pipeline(tmp_path, slow_us=250.0)
    sync = compute_sync(load_traces(tmp_path))
    inst = sync.instances.set_index("instance")
    assert sorted(inst.index) == ["p2p:0,1,2:0>1:1", "p2p:0,1,2:0>1:2", "p2p:0,1,2:1>2:1",
                                  "p2p:0,1,2:1>2:2"]
    assert (inst["ranks"] == 2).all() and inst["complete"].all()
    assert sync.offsets["offset_us"].tolist() == [0.0, 0.0, 0.0]
    # stage 1 computes 650 µs per microbatch: ready at 1150 and 1800 µs. Rank 2 posts its
    # recvs at 0 and 1650 and waits 1150 + 150 µs for rank 1; rank 1 waits 400 µs for rank 0's
    # first send (its second recv is posted with the send). Root causes: 400 µs of rank 2's
    # first wait passed while rank 1 itself waited for rank 0, so they are rank 0's; rank 1
    # is named all the same (it computes longest, the pipeline's second signal).
    st = sync.stragglers.set_index("rank")
    assert sync.straggler == 1
    assert st["wait_caused_us"].to_dict() == pytest.approx({0: 800.0, 1: 900.0, 2: 0.0})
    assert st["wait_suffered_us"].to_dict() == pytest.approx({0: 0.0, 1: 400.0, 2: 1300.0})
    # the pairs give the hop latency (100 µs per transfer) and the receivers' waits per link
    p2p = sync.p2p.set_index(["src", "dst"])
    assert p2p.loc[(0, 1), ["count", "hop_us", "recv_wait_us", "send_wait_us"]].tolist() == \
        pytest.approx([2, 100.0, 200.0, 0.0])  # waits 400 and 0: median 200
    assert p2p.loc[(1, 2), ["count", "hop_us", "recv_wait_us", "send_wait_us"]].tolist() == \
        pytest.approx([2, 100.0, 650.0, 0.0])  # waits 1150 and 150


def test_send_recv_without_a_known_peer_is_never_matched_as_a_collective(tmp_path):
    for r in (0, 1):
        b = TraceBuilder(rank=r)
        b.step(1, EPOCH, 1000)
        b.kernel("gemm_kernel", EPOCH + 10, 100, launch_ts=EPOCH + 1)
        b.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
                 EPOCH + 200 + 300 * r, 100, stream=30, launch_ts=EPOCH + 2)
        b.write(tmp_path / f"rank{r}.json")
    sync = compute_sync(load_traces(tmp_path))
    assert sync.instances.empty and sync.straggler is None
    assert any("2 point-to-point op(s) without a known peer were not paired" in n
               for n in sync.notes)


# -- several windows per rank ----------------------------------------------------------------------

def test_three_windows_of_a_rank_are_one_rank_and_the_gaps_are_not_its_time(tmp_path):
    # schedule(repeat=3): each rank writes 3 files 5 s apart; each window: one step of
    # 1000 µs with a gemm [100, 700) and an exposed all-reduce [700, 1000).
    for r in (0, 1):
        for w in range(3):
            t = EPOCH + 5e6 * w
            b = TraceBuilder(rank=r)
            b.step(10 * w + 1, t, 1000)
            b.kernel("gemm_kernel", t + 100, 600, launch_ts=t + 1)
            _coll(b, "AllReduce", (0, 1), "0", t + 700, 300, t + 2)
            b.write(tmp_path / f"host_{100 + r}.{int(t)}.pt.trace.json")
    ts = load_traces(tmp_path)
    assert sorted(ts.ranks) == [0, 1]
    assert len(ts.ranks[0].files) == 3 and len(ts.ranks[0].windows) == 3
    bd = compute_time_breakdown(ts)
    tot = bd.totals.set_index("rank")
    # from the first kernel, as long as the host's step (its kernels end 900 µs after), x3
    assert tot.loc[0, "span_us"] == pytest.approx(3 * 1000.0)
    assert tot.loc[0, "compute_us"] == pytest.approx(1800.0)
    assert tot.loc[0, "exposed_comm_us"] == pytest.approx(900.0)
    steps = bd.steps[bd.steps["rank"] == 0]
    assert steps["step"].tolist() == [1, 11, 21]
    assert steps["span_us"].tolist() == pytest.approx([1000.0, 1000.0, 1000.0])
    sync = compute_sync(ts)
    assert len(sync.instances) == 3 and sync.offsets["offset_us"].tolist() == [0.0, 0.0]
    assert sync.straggler is None
    assert any("3 files are 3 profiling windows" in w for w in ts.warnings)


def test_windows_that_number_their_steps_again_are_renumbered_after_each_other(tmp_path):
    """Two profiler sessions of one script (5 s apart) both number their steps 1 and 2: the
    second window's are read as 3 and 4, so no step spans both windows and the gap; each
    window's last step lasts as long as its host step, as the first does."""
    for r in (0, 1):
        for w in range(2):
            t = EPOCH + 5e6 * w
            b = TraceBuilder(rank=r)
            for k in (1, 2):
                s0 = t + 1000 * (k - 1)
                b.step(k, s0, 1000)
                b.kernel("gemm_kernel", s0 + 100, 600, launch_ts=s0 + 1)
                _coll(b, "AllReduce", (0, 1), "0", s0 + 700, 300, s0 + 2)
            b.write(tmp_path / f"host_{100 + r}.{int(t)}.pt.trace.json")
    ts = load_traces(tmp_path)
    bd = compute_time_breakdown(ts)
    steps = bd.steps[bd.steps["rank"] == 0]
    assert steps["step"].tolist() == [1, 2, 3, 4]
    assert steps["span_us"].tolist() == pytest.approx([1000.0] * 4)
    second = tmp_path / f"host_100.{int(EPOCH + 5e6)}.pt.trace.json"
    assert (f"{second}: this profiling window numbers its steps 1–2 again (each profiler "
            f"session counts from its own start): read as steps 3–4, after the earlier "
            f"window's") in ts.ranks[0].notes
    assert len(compute_sync(ts).instances) == 4


# -- a merged multi-rank file ----------------------------------------------------------------------

def _two_ranks(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    for r in (0, 1):
        b = TraceBuilder(rank=r)
        b.step(1, EPOCH, 2000)
        b.kernel("gemm_kernel", EPOCH + 10, 500 + 300 * r, launch_ts=EPOCH + 1)
        _coll(b, "AllReduce", (0, 1), "0", EPOCH + 400, 800 - 300 * r if r else 800, EPOCH + 2,
              seq=1)
        b.write(d / f"rank{r}.json")
    return d


def test_report_on_merge_output_equals_report_on_the_folder(tmp_path):
    run = _two_ranks(tmp_path)
    merged = tmp_path / "merged.json"
    res = CliRunner().invoke(cli, ["merge", str(run), "-o", str(merged)])
    assert res.exit_code == 0, res.output
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _report([run], tmp_path / "a")
    b = _report([merged], tmp_path / "b")
    assert [r["rank"] for r in b["ranks"]] == [0, 1]
    for ra, rb in zip(a["ranks"], b["ranks"]):
        for key in ("compute_us", "comm_us", "overlap_us", "exposed_comm_us", "overlap_pct"):
            assert rb["total"][key] == pytest.approx(ra["total"][key]), key
    assert b["sync"]["straggler"] == a["sync"]["straggler"]
    assert any("holds 2 ranks (a merged trace)" in w for w in b["warnings"])


def _naive_merge(run: Path, out: Path, name) -> Path:
    """The ranks' events in one file, each rank's pids made its own and its processes named
    ``name(rank)``, as a merge tool that does not name them ``rank N`` writes it."""
    events = []
    for r in (0, 1):
        doc = json.loads((run / f"rank{r}.json").read_text())
        for e in doc["traceEvents"]:
            events.append({**e, "pid": e["pid"] + 1_000_000 * r})
        for pid in {e["pid"] for e in doc["traceEvents"]}:
            events.append({"ph": "M", "name": "process_name", "pid": pid + 1_000_000 * r,
                           "tid": 0, "args": {"name": name(r)}})
    out.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events,
                               "distributedInfo": doc["distributedInfo"]}))
    return out


def test_a_concatenation_of_ranks_that_share_a_pid_is_refused(tmp_path):
    """Each rank in its own container is the same pid: two ranks' events concatenated into one
    file (jq) are one process whose profiler steps overlap, which no process records. Read as
    one rank, the union of both ranks' kernels was its timeline; the file is refused."""
    run = _two_ranks(tmp_path)
    docs = [json.loads((run / f"rank{r}.json").read_text()) for r in (0, 1)]
    pids = {e["pid"] for e in docs[0]["traceEvents"] if e.get("cat") == "user_annotation"}
    events = docs[0]["traceEvents"] + [{**e, "ts": e["ts"] + 700} for e in docs[1]["traceEvents"]
                                       if "ts" in e]
    cat = tmp_path / "concatenated.json"
    cat.write_text(json.dumps({**docs[0], "traceEvents": events}))
    res = CliRunner().invoke(cli, ["report", str(cat), "-q", "--no-cache",
                                   "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert (f"{cat}: holds ProfilerStep#1 of process {pids.pop()} twice, 700 µs apart on one "
            f"thread: a merge of several ranks whose processes share a pid" in res.output), \
        res.output
    # one process's: a step annotated twice from its start, a user's range of the step's name
    # inside it, another thread's annotations, a step whose start the profiler moved back
    # before the previous one's end (to the Python step() call)
    b = TraceBuilder(rank=0)
    b.step(1, EPOCH, 1000).step(2, EPOCH + 700, 1000).step(2, EPOCH + 700, 600)
    b.cpu("ProfilerStep#2", EPOCH + 750, 100, cat="user_annotation")
    b.cpu("ProfilerStep#1", EPOCH + 5, 900, tid=2, cat="user_annotation")
    b.kernel("gemm_kernel", EPOCH + 10, 500, launch_ts=EPOCH + 1)
    res = CliRunner().invoke(cli, ["report", str(b.write(tmp_path / "one.json")), "-q",
                                   "--no-cache", "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output


def test_a_merge_that_does_not_name_its_ranks_is_refused_and_rank_prefixes_split(tmp_path):
    """Two ranks' processes, all named 'python3', ran profiler steps at the same time: one
    rank never does, and read as one the union of their kernels is meaningless, so the file is
    refused with one line. Named '[rankN] python3' (torchrun's prefix), it is split."""
    run = _two_ranks(tmp_path)
    plain = _naive_merge(run, tmp_path / "plain.json", lambda r: "python3")
    res = CliRunner().invoke(cli, ["report", str(plain), "-q", "--no-cache",
                                   "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert (f"{plain}: holds the profiler steps of 2 processes at the same time (pids 100, "
            f"1000100): a merge of several ranks whose processes are not named 'rank N'"
            in res.output)
    # in a folder beside a file that is no trace, the merge's refusal is the error's example
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "all_ranks.json").write_text(plain.read_text())
    (folder / "train_config.json").write_text('{"lr": 0.001}')
    res = CliRunner().invoke(cli, ["report", str(folder), "-q", "--no-cache",
                                   "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert (f"{folder}: none of 2 file(s) is a readable Kineto trace (e.g. "
            f"{folder / 'all_ranks.json'}: holds the profiler steps of 2 processes"
            in res.output), res.output
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    named = _naive_merge(run, tmp_path / "named.json", lambda r: f"[rank{r}] python3")
    a, b = _report([run], tmp_path / "a"), _report([named], tmp_path / "b")
    assert [r["rank"] for r in b["ranks"]] == [0, 1]
    for ra, rb in zip(a["ranks"], b["ranks"]):
        assert rb["total"]["overlap_pct"] == pytest.approx(ra["total"]["overlap_pct"])


def _labelled_merge(run: Path, out: Path, label) -> Path:
    """The ranks' events in one file as SGLang's ProfileMerger writes it: every pid prefixed
    with the rank's coordinates (``[TP01] 100``; a GPU's ``[TP01] 0``), no process named
    ``rank N``, rank 0's header alone."""
    events = []
    for r in (0, 1):
        doc = json.loads((run / f"rank{r}.json").read_text())
        events += [{**e, "pid": f"{label(r)} {e['pid']}"} for e in doc["traceEvents"]]
        if r == 0:
            header = {k: v for k, v in doc.items() if k != "traceEvents"}
    out.write_text(json.dumps({**header, "traceEvents": events}))
    return out


def _reads_as_own_files(run: Path, merged: Path, tmp_path: Path) -> tuple[dict, dict]:
    """The reports of the two ranks' own files (``run``) and of their ``merged`` file: the
    merged one splits into ranks 0 and 1, each with its own file's compute, communication and
    overlap. Returns (own, merged) report JSON."""
    for d in "ab":
        (tmp_path / d).mkdir()
    a, b = _report([run], tmp_path / "a"), _report([merged], tmp_path / "b")
    assert [r["rank"] for r in b["ranks"]] == [0, 1]
    for ra, rb in zip(a["ranks"], b["ranks"]):
        for key in ("compute_us", "comm_us", "overlap_pct"):
            assert rb["total"][key] == pytest.approx(ra["total"][key]), key
    return a, b


def test_a_merge_that_prefixes_every_name_with_its_rank_reads_the_names_without(tmp_path):
    """A merge script that names its processes 'Rank N - ...' and prefixes every event's name
    with ``[RN] `` (``[R1] ProfilerStep#1``): each rank's steps and kernels read as the profiler
    wrote them, so the steps are there and each rank reads as its own file."""
    run = _two_ranks(tmp_path)
    events = []
    for r in (0, 1):
        doc = json.loads((run / f"rank{r}.json").read_text())
        events += [{**e, "pid": e["pid"] + 1000 * r, "name": f"[R{r}] {e['name']}"}
                   for e in doc["traceEvents"]]
        events += [{"ph": "M", "name": "process_name", "pid": p + 1000 * r, "tid": 0,
                    "args": {"name": f"Rank {r} - {what}"}} for p, what in ((0, "GPU Stream"),
                                                                         (100, "CPU"))]
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps({"traceEvents": events}))
    a, b = _reads_as_own_files(run, merged, tmp_path)
    assert b["step"]["median_us"] == a["step"]["median_us"] == 2000.0
    assert not [w for w in b["warnings"] if "ProfilerStep" in w]


@pytest.mark.parametrize("gz", [False, True])
def test_a_merge_that_prefixes_its_metadata_events_too_is_split_by_them(tmp_path, gz):
    """VeOmni's ``merge_chrome_trace.py`` prefixes every name with ``[RN] ``, the metadata
    events' too (``[R1] process_name``, ``[R1] thread_name``), names no process by its rank and
    offsets pids and tids by 1000 × the rank: the prefixed metadata events give each process
    its rank and each thread its name, so the file reads as the two ranks it holds, not one
    rank driving two devices."""
    run = _two_ranks(tmp_path)
    events = []
    for r in (0, 1):
        doc = json.loads((run / f"rank{r}.json").read_text())
        events += [{**e, "pid": e["pid"] + 1000 * r, "tid": e["tid"] + 1000 * r,
                    "name": f"[R{r}] {e['name']}"} for e in doc["traceEvents"]]
        events += [{"ph": "M", "name": f"[R{r}] process_name", "pid": p + 1000 * r, "tid": 0,
                    "args": {"name": "python3"}} for p in (0, 100)]
        events += [{"ph": "M", "name": f"[R{r}] thread_name", "pid": 100 + 1000 * r,
                    "tid": 1 + 1000 * r, "args": {"name": f"thread {1 + 1000 * r} (python3)"}}]
    events.sort(key=lambda e: e.get("ts", 0))
    merged = tmp_path / ("merged.json.gz" if gz else "merged.json")
    data = json.dumps({"traceEvents": events}).encode()
    merged.write_bytes(gzip.compress(data) if gz else data)
    a, b = _reads_as_own_files(run, merged, tmp_path)
    assert b["step"]["median_us"] == a["step"]["median_us"] == 2000.0
    traces = load_traces(merged)
    assert traces.ranks[1].thread_names[("1100", "1001")] == "thread 1001 (python3)"


@pytest.mark.parametrize("label, note", [
    (lambda r: f"[TP{r:02d}]", None),
    (lambda r: f"[TP{r:02d}-DP{r:02d}]", "the ranks' labels give their dp, tp coordinates, not "
                                         "their global ranks: numbered in the labels' order "
                                         "(dp, ep, pp, tp)")])
def test_a_merge_whose_pids_carry_rank_labels_is_split_by_them(tmp_path, label, note):
    """SGLang's merge of a tensor-parallel server's ranks names no process ``rank N`` and
    records no profiler step: each pid carries its rank's label. Read as one process, the
    ranks' kernels made one timeline (a process driving two GPUs). Split by the labels, each
    rank reads as its own file does, its GPU's pid its device index again; where two
    coordinates vary, the numbering is said to be the labels' order."""
    run = _two_ranks(tmp_path)
    merged = _labelled_merge(run, tmp_path / "merged.json", label)
    _, b = _reads_as_own_files(run, merged, tmp_path)
    said = [w for w in b["warnings"] if "labels" in w]
    assert said == ([f"{merged}: {note}"] if note else [])
    assert not [w for w in b["warnings"] if "drives" in w]


def test_a_merge_whose_pids_carry_the_rank_as_a_suffix_is_split_by_them(tmp_path):
    """ByteDance's Triton-distributed / flux ``group_profile``: one bare array, every pid the
    string ``f"{pid}_{rank}"`` (a GPU's too: ``"1_1"``), every int tid ``tid × world + rank``,
    no header. Read as one process, both ranks' kernels made one timeline (a process driving
    two GPUs); split by the suffixes, each rank reads as its own file does."""
    run = _two_ranks(tmp_path)
    events = []
    for r in (0, 1):
        doc = json.loads((run / f"rank{r}.json").read_text())
        events += [{**e, "pid": f"{e['pid']}_{r}",
                    "tid": e["tid"] * 2 + r if isinstance(e["tid"], int) else e["tid"]}
                   for e in doc["traceEvents"]]
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps(events))
    _, b = _reads_as_own_files(run, merged, tmp_path)
    assert not [w for w in b["warnings"] if "drives" in w]


def test_a_merge_naming_only_host_processes_gives_each_gpu_its_launching_rank(tmp_path):
    """A merge that names each rank's host process ``rank N`` and leaves its GPU's timeline as
    Kineto names it: every kernel links to its launch by a correlation id, which the merge
    kept unique, so each GPU goes to the rank that launched its kernels and each rank reads as
    its own file. Where the ids repeat across ranks (each rank's profiler numbers from 1),
    nothing says whose GPU is whose: its events are left out with a warning."""
    run = _two_ranks(tmp_path)

    def merge(out, unique):
        events = []
        for r in (0, 1):
            doc = json.loads((run / f"rank{r}.json").read_text())
            for e in doc["traceEvents"]:
                e = json.loads(json.dumps(e))
                gpu = e.get("cat") == "kernel"
                e["pid"] = r if gpu else 1000 * (r + 1)
                if unique and "correlation" in e.get("args", {}):
                    e["args"]["correlation"] += 100 * r
                events.append(e)
            events.append({"ph": "M", "name": "process_name", "pid": 1000 * (r + 1), "tid": 0,
                           "args": {"name": f"rank {r}"}})
            events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                           "args": {"name": "python3.11"}})
        out.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events,
                                   "distributedInfo": doc["distributedInfo"]}))
        return out

    for d in "abc":
        (tmp_path / d).mkdir()
    a = _report([run], tmp_path / "a")
    b = _report([merge(tmp_path / "unique.json", True)], tmp_path / "b")
    assert [r["rank"] for r in b["ranks"]] == [0, 1]
    for ra, rb in zip(a["ranks"], b["ranks"]):
        for key in ("compute_us", "comm_us", "overlap_pct"):
            assert rb["total"][key] == pytest.approx(ra["total"][key]), key
    assert not [w for w in b["warnings"] if "left out" in w]
    c = _report([merge(tmp_path / "repeated.json", False)], tmp_path / "c")
    assert [w for w in c["warnings"] if "left out" in w] == [
        f"{tmp_path / 'repeated.json'}: left out 4 events of processes that belong to no rank "
        f"of this merged file"]


# -- missing ranks ---------------------------------------------------------------------------------

def test_two_of_eight_ranks_name_no_straggler_and_no_clock_offset(tmp_path):
    # all-reduces over 8 ranks; only ranks 0 and 1 are here, and rank 1 arrives 500 µs late
    for r in (0, 1):
        b = TraceBuilder(rank=r, world_size=8)
        b.step(1, EPOCH, 3000)
        b.kernel("gemm_kernel", EPOCH + 10, 100, launch_ts=EPOCH + 1)
        _coll(b, "AllReduce", range(8), "0", EPOCH + 200 + 500 * r, 1000 - 500 * r, EPOCH + 2)
        b.write(tmp_path / f"rank{r}.json")
    ts = load_traces(tmp_path)
    assert any(w.startswith("2 of 8 ranks present") for w in ts.warnings)
    sync = compute_sync(ts)
    assert sync.straggler is None and sync.stragglers.empty
    assert not sync.instances["complete"].any()
    assert sync.offsets["instances"].tolist() == [0, 0]
    assert any("ranks [2, 3, 4, 5, 6, 7] have no trace" in n for n in sync.notes)


# -- clocks: one per host --------------------------------------------------------------------------

def _hosts_run(tmp_path: Path, hosts: dict[int, str]) -> Path:
    """4 ranks; every all-reduce ends at the same true time; ranks 2 and 3's clocks read
    +500 µs (recorded times), as if on another host."""
    d = tmp_path / "run"
    d.mkdir()
    for r in range(4):
        skew = 500.0 if r >= 2 else 0.0
        b = TraceBuilder(rank=r, world_size=4, backend="gloo")
        b.thread_name(2, "pt_gloo_runloop")
        for s in range(3):
            t = EPOCH + 2000 * s + skew
            b.step(s + 1, t, 2000)
            b.cpu("aten::mm", t, 400)
            b.cpu("gloo:all_reduce", t + 400 + 20 * r, 600 - 20 * r, tid=2,
                  cat="user_annotation")
        b.write(d / f"rank{r}.json")
        write_sidecar(d / f"rank{r}.meta.json", "rank", r, {"host": hosts[r]})
    return d


def test_two_hosts_get_one_offset_each_estimated_from_collective_ends(tmp_path):
    ts = load_traces(_hosts_run(tmp_path, {0: "a", 1: "a", 2: "b", 3: "b"}))
    sync = compute_sync(ts)
    off = sync.offsets.set_index("rank")
    assert off["offset_us"].tolist() == pytest.approx([0.0, 0.0, 500.0, 500.0])
    assert off["instances"].tolist() == [3, 3, 3, 3]
    assert any("offset and drift per host fitted (Theil–Sen) to the ends of 3 complete" in n
               for n in sync.notes)
    # after alignment rank 3 arrives last (it starts 20 µs after rank 2 on the true clock)
    assert sync.instances["arrival_skew_us"].tolist() == pytest.approx([60.0] * 3)


def test_one_host_is_one_clock_and_nothing_is_subtracted(tmp_path):
    ts = load_traces(_hosts_run(tmp_path, {0: "a", 1: "a", 2: "a", 3: "a"}))
    sync = compute_sync(ts)
    off = sync.offsets.set_index("rank")
    assert off["offset_us"].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert off["residual_us"].tolist() == pytest.approx([0.0, 0.0, 500.0, 500.0])
    assert any("one host (a): one clock, no offset subtracted" in n for n in sync.notes)


# -- devices and transports ------------------------------------------------------------------------

def test_copy_engine_transfers_count_as_communication_when_named(tmp_path):
    b = TraceBuilder(rank=0, world_size=1)
    b.step(1, EPOCH, 1000)
    b.kernel("gemm_kernel", EPOCH + 100, 400, launch_ts=EPOCH + 1)
    b.kernel("Memcpy PtoP (Device -> Device)", EPOCH + 300, 400, stream=9, cat="gpu_memcpy",
             launch_ts=EPOCH + 2)
    b.write(tmp_path / "rank0.json")
    plain = compute_time_breakdown(load_traces(tmp_path)).totals.iloc[0]
    assert plain["comm_us"] == 0.0
    named = compute_time_breakdown(load_traces(tmp_path), compile_comm_patterns(
        [r"Memcpy PtoP"])).totals.iloc[0]
    assert (named["comm_us"], named["overlap_us"], named["overlap_pct"]) == (400.0, 200.0, 50.0)


def test_report_on_named_files_uses_the_sidecars_beside_them(tmp_path):
    d = _hosts_run(tmp_path, {0: "a", 1: "a", 2: "b", 3: "b"})
    ts = load_traces([d / "rank0.json", d / "rank2.json"])
    assert set(ts.rank_meta) == {0, 1, 2, 3}
    assert any("using the pardiag run's run.json and sidecars" in w for w in ts.warnings)
    assert {r: m.host for r, m in ts.rank_meta.items()} == {0: "a", 1: "a", 2: "b", 3: "b"}


@pytest.mark.parametrize("meta, kind", [
    ({"deviceProperties": [{"name": "Intel(R) Data Center GPU Max 1550"}],
      "distributedInfo": {"backend": "xccl"}}, "xpu"),
    ({"deviceProperties": [{"name": "AMD Instinct MI300X"}]}, "rocm"),
    ({"deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}]}, "cuda"),
    ({"deviceProperties": [{"name": "GAUDI2"}]}, "hpu"),
    ({"distributedInfo": {"backend": "hccl"}}, "hpu"),
    ({"deviceProperties": [{"name": "Some Accelerator 9000"}]}, "unknown"),
    ({}, "unknown"),
])
def test_device_kind_names_what_the_trace_says_and_unknown_otherwise(meta, kind, tmp_path):
    b = TraceBuilder(rank=0, world_size=1, backend="")
    b.kernel("some_kernel", EPOCH, 10, launch_ts=EPOCH - 1)
    doc = {**b.doc(), **meta}
    if "distributedInfo" in meta:
        doc["distributedInfo"] = {"rank": 0, "world_size": 1, **meta["distributedInfo"]}
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    assert device_kind(load_traces(tmp_path).ranks[0]) == kind


def test_absurd_world_and_group_sizes_are_read_without_building_them(tmp_path):
    # found by the fuzz run: a world size of 10^15 built a set of every rank (out of memory)
    b = TraceBuilder(rank=0, world_size=10 ** 15)
    b.step(1, EPOCH, 1000)
    b.kernel("gemm_kernel", EPOCH + 10, 100, launch_ts=EPOCH + 1)
    b.kernel("ncclDevKernel_AllReduce(x)", EPOCH + 200, 100, stream=20, launch_ts=EPOCH + 2,
             args={"Collective name": "allreduce", "Group size": 10 ** 12,
                   "Global rank start": 0, "Global rank stride": 1})
    b.write(tmp_path / "rank0.json")
    ts = load_traces(tmp_path)
    assert any(w.startswith(f"1 of {10 ** 15} ranks present") and "[1, 2, 3, 4, 5, 6, 7, 8]..."
               in w for w in ts.warnings)
    sync = compute_sync(ts)
    assert sync.instances.empty and sync.straggler is None


# -- found by a break test (each was a made-up offset or straggler)
# ---------------------------------

def _lockstep(tmp_path: Path, n: int = 2, seqs=None, late: dict | None = None, **kw) -> Path:
    """n ranks, one clock, 4 all-reduces in lock step (rank r late by ``late[r]`` µs, ending
    together); ``seqs[r]``: the Seq of each of rank r's all-reduces (None: no Seq)."""
    late = late or {}
    for r in range(n):
        b = TraceBuilder(rank=r, world_size=n)
        b.step(1, EPOCH, 5000)
        for k in range(4):
            t = EPOCH + 1000 * k
            b.kernel("gemm_kernel", t + 10, 300, launch_ts=t + 1)
            s = seqs[r][k] if seqs else None
            _coll(b, "AllReduce", range(n), "0", t + 400 + late.get(r, 0), 400 - late.get(r, 0),
                  t + 2, seq=s, **kw)
        b.write(tmp_path / f"rank{r}.json")
    return tmp_path


def test_a_sequence_number_that_repeats_on_a_rank_is_not_used(tmp_path):
    # every Seq 0 (or one Seq for a coalescing block): matching by it would fold four
    # all-reduces into one instance and make rank 0 "wait" for its own later calls
    sync = compute_sync(load_traces(_lockstep(tmp_path, seqs=[[0] * 4, [0] * 4])))
    assert sync.matched_by == "order" and len(sync.instances) == 4
    assert sync.straggler is None and sync.offsets["offset_us"].tolist() == [0.0, 0.0]


def test_an_instance_with_more_ranks_than_its_group_is_not_used(tmp_path):
    # 4 ranks that all call their own 2-rank group "1" (only Group size, no ranks in the args)
    for r in range(4):
        b = TraceBuilder(rank=r, world_size=4)
        b.step(1, EPOCH, 2000)
        b.kernel("gemm_kernel", EPOCH + 10, 100, launch_ts=EPOCH + 1)
        b.kernel("ncclDevKernel_AllReduce(x)", EPOCH + 200 + (300 if r >= 2 else 0), 300,
                 stream=20, launch_ts=EPOCH + 2,
                 args={"Collective name": "allreduce", "Group size": 2,
                       "Process Group Name": "1", "In msg nelems": 1024, "dtype": "Float"})
        b.write(tmp_path / f"rank{r}.json")
    sync = compute_sync(load_traces(tmp_path))
    assert sync.straggler is None and (sync.offsets["offset_us"] == 0.0).all()
    assert any("hold more ranks than their group has" in n for n in sync.notes)


def test_order_matching_restarts_in_every_window(tmp_path):
    # two windows per rank, no Seq; rank 1's first window lost its last all-reduce
    for r in (0, 1):
        for w in range(2):
            t0 = EPOCH + 5e6 * w
            b = TraceBuilder(rank=r)
            b.step(w + 1, t0, 4000)
            n = 2 if (r == 1 and w == 0) else 3
            for k in range(n):
                t = t0 + 1000 * k
                b.kernel("gemm_kernel", t + 10, 300, launch_ts=t + 1)
                _coll(b, "AllReduce", (0, 1), "0", t + 400, 400, t + 2)
            b.write(tmp_path / f"rank{r}.{int(t0)}.pt.trace.json")
    sync = compute_sync(load_traces(tmp_path))
    assert sync.offsets["offset_us"].tolist() == [0.0, 0.0]
    assert sync.straggler is None
    assert int(sync.instances["complete"].sum()) == 5


def test_gloo_worker_events_take_their_issuing_ops_group(tmp_path):
    # a 2 x 2 mesh on gloo: the worker events name no group; the caller's record_param_comms
    # does. Rank 3 is 300 µs late to its tp all-reduce: only rank 2 waits for it.
    tp = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}
    for r in range(4):
        b = TraceBuilder(rank=r, world_size=4, backend="gloo")
        b.thread_name(2, "pt_gloo_runloop")
        b.step(1, EPOCH, 3000)
        b.cpu("aten::mm", EPOCH, 100)
        t = EPOCH + 200 + (300 if r == 3 else 0)
        args = _nccl_args("allreduce", tp[r], "1")
        b.cpu("c10d::allreduce_", t, 20)
        b.cpu("record_param_comms", t + 1, 10, args=args)
        b.cpu("gloo:all_reduce", t + 20, 800 - (t - EPOCH - 200) - 20, tid=2,
              cat="user_annotation")
        b.write(tmp_path / f"rank{r}.json")
    sync = compute_sync(load_traces(tmp_path))
    assert sorted(sync.instances["group"]) == ["0,1", "2,3"]
    st = sync.stragglers.set_index("rank")
    assert sync.straggler == 3 and st.loc[3, "wait_caused_us"] == pytest.approx(300.0)
    assert st.loc[0, "wait_suffered_us"] == 0.0 and st.loc[1, "wait_suffered_us"] == 0.0
    assert sync.offsets["offset_us"].tolist() == [0.0] * 4


def test_merge_keeps_the_world_size_so_absent_ranks_stay_absent(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _lockstep(run, n=2, late={1: 200})
    for r in (0, 1):  # the traces state world size 4: ranks 2 and 3 are absent
        p = run / f"rank{r}.json"
        doc = json.loads(p.read_text())
        doc["distributedInfo"]["world_size"] = 4
        doc["traceEvents"] = [dict(e, args={**e["args"], "Group size": 4,
                                            "Process Group Ranks": "[0, 1, 2, 3]"})
                              if "Collective name" in e.get("args", {}) else e
                              for e in doc["traceEvents"]]
        p.write_text(json.dumps(doc))
    merged = tmp_path / "merged.json"
    assert CliRunner().invoke(cli, ["merge", str(run), "-o", str(merged)]).exit_code == 0
    for ts in (load_traces(run), load_traces(merged)):
        assert any(w.startswith("2 of 4 ranks present") for w in ts.warnings)
        sync = compute_sync(ts)
        assert sync.straggler is None and not sync.instances["complete"].any()


def _p2p_only(tmp_path: Path, skews) -> Path:
    """Two ranks that exchange only send/recv kernels, 3 transfers; rank 1 records the k-th
    one ``skews[k]`` µs later than rank 0 (its clock, or a mispairing)."""
    tmp_path.mkdir(parents=True)
    for r in (0, 1):
        b = TraceBuilder(rank=r)
        b.step(1, EPOCH + (skews[0] if r else 0.0), 10000)
        for k in range(3):
            t = EPOCH + (skews[k] if r else 0.0) + 3000 * k
            op, peer = ("send", "Dst Rank") if r == 0 else ("recv", "Src Rank")
            b.kernel("ncclDevKernel_SendRecv(x)", t + 100, 200, stream=30, launch_ts=t + 1,
                     args=_nccl_args(op, (0, 1), "0", **{peer: str(1 - r)}))
        b.write(tmp_path / f"rank{r}.json")
    return tmp_path


def test_hosts_linked_only_by_a_pipelines_transfers_keep_their_in_host_collectives(tmp_path):
    """A pipeline's two stages on two hosts, each stage data parallel inside its host: the
    all-reduces never cross a host, the sends and receives alone link the hosts. Host B's
    clock (ranks 2 and 3) reads 5000 µs ahead: every rank has collectives of its own, and the
    transfers' ends give B's offset."""
    for r in range(4):
        skew = 5000.0 if r >= 2 else 0.0
        b = TraceBuilder(rank=r, world_size=4)
        for k in range(3):
            t = EPOCH + skew + 3000 * k
            b.step(k + 1, t, 3000)
            op, peer = ("send", "Dst Rank") if r < 2 else ("recv", "Src Rank")
            b.kernel("ncclDevKernel_SendRecv(x)", t + 100, 200, stream=30, launch_ts=t + 1,
                     args=_nccl_args(op, (0, 1, 2, 3), "0", **{peer: str((r + 2) % 4)}))
            pair = (0, 1) if r < 2 else (2, 3)
            _coll(b, "AllReduce", pair, "1" if r < 2 else "2", t + 400 + 10 * (r % 2),
                  300 - 10 * (r % 2), t + 2, seq=k + 1)
        b.write(tmp_path / f"rank{r}.json")
    sync = compute_sync(load_traces(tmp_path))
    off = dict(zip(sync.offsets["rank"], sync.offsets["offset_us"]))
    assert off == {0: 0.0, 1: 0.0, 2: 5000.0, 3: 5000.0}
    assert any("point-to-point transfers alone link rank(s) [2, 3]" in n for n in sync.notes)


def test_point_to_point_only_ranks_are_linked_by_their_kernels_ends(tmp_path):
    """NCCL's send and receive kernels end together: where rank 1 records every transfer
    5000 µs later, its clock is 5000 µs ahead (no pair overlaps as recorded); where the ends
    disagree by 2000 µs from pair to pair, nothing relates the clocks and they are not
    compared, as where one pair of three ends off the others' offset; on one clock the pairs end
    together and nothing is subtracted."""
    sync = compute_sync(load_traces(_p2p_only(tmp_path / "a", (5000.0,) * 3)))
    off = dict(zip(sync.offsets["rank"], sync.offsets["offset_us"]))
    assert off == {0: 0.0, 1: 5000.0}
    assert any("point-to-point transfers alone link rank(s) [1]" in n for n in sync.notes)
    assert sync.straggler is None and len(sync.p2p) == 1
    assert float(sync.p2p["recv_wait_us"].iloc[0]) == 0.0
    sync = compute_sync(load_traces(_p2p_only(tmp_path / "b", (5000.0, 3000.0, 7000.0))))
    assert sync.straggler is None
    assert any("no complete collective links rank(s) [1] to rank 0" in n for n in sync.notes)
    # two pairs agree on 5000 µs, the third ends 4000 µs off it: a mispairing (or another
    # clock), so nothing is made up from the median
    sync = compute_sync(load_traces(_p2p_only(tmp_path / "d", (5000.0, 5000.0, 9000.0))))
    assert sync.straggler is None and len(sync.p2p) == 0
    assert any("no complete collective links rank(s) [1] to rank 0" in n for n in sync.notes)
    sync = compute_sync(load_traces(_p2p_only(tmp_path / "c", (0.0,) * 3)))
    assert len(sync.p2p) == 1 and not any("links rank(s)" in n for n in sync.notes)
    assert set(sync.offsets["offset_us"]) == {0.0}


def _one_iteration_late(folder, first: int, period_us: float, gap_us: float,
                        offset_us: float) -> None:
    """Rank 0 sends to rank 1 twice per iteration of ``period_us`` (``gap_us`` apart); rank 1's
    clock reads ``offset_us`` ahead and its trace holds iterations ``first + 1 .. first + 3``
    against rank 0's ``first .. first + 2``, each a profiler step numbered as the iteration."""
    for r in (0, 1):
        b = TraceBuilder(rank=r)
        for it in range(first + r, first + r + 3):
            t = EPOCH + period_us * it + (offset_us if r else 0.0)
            b.step(it, t, period_us)
            for k in range(2):
                op, peer = ("send", "Dst Rank") if r == 0 else ("recv", "Src Rank")
                b.kernel("ncclDevKernel_SendRecv(x)", t + 100 + gap_us * k, 200 + 50 * k,
                         stream=30, launch_ts=t + 1 + gap_us * k,
                         args=_nccl_args(op, (0, 1), "0", **{peer: str(1 - r)}))
        b.write(folder / f"rank{r}.json")


def test_a_receiver_whose_window_began_an_iteration_later_pairs_by_its_ends(tmp_path):
    """Rank 0 sends to rank 1 twice per 40 ms iteration; rank 1's clock reads 350 µs ahead and
    its trace began one iteration later (iterations 2-4 against rank 0's 1-3). Pairing the
    k-th send with the k-th receive made rank 1's clock 40.35 ms ahead; the transfers of the
    two shared iterations pair, and the offset is 350 µs."""
    _one_iteration_late(tmp_path, first=1, period_us=40_000, gap_us=15_000, offset_us=350.0)
    sync = compute_sync(load_traces(tmp_path, cache=False))
    off = dict(zip(sync.offsets["rank"], sync.offsets["offset_us"]))
    assert off == {0: 0.0, 1: 350.0}
    assert sync.p2p["count"].tolist() == [4]
    # ends that do not keep one difference (gloo's send ends at hand-off) say nothing of which
    # transfers pair: they stay paired by their order, all six
    doc = json.loads((tmp_path / "rank1.json").read_text())
    kernels = [x for x in doc["traceEvents"] if x.get("cat") == "kernel"]
    for i, x in enumerate(kernels):
        x["dur"] += 900 * (i % 3)
    (tmp_path / "rank1.json").write_text(json.dumps(doc))
    sync = compute_sync(load_traces(tmp_path, cache=False))
    assert sync.instances["instance"].tolist() == [f"p2p:0,1:0>1:{k}" for k in range(1, 7)]


def test_a_receiver_a_short_iteration_later_pairs_by_its_profiler_steps(tmp_path):
    """As above with 9 ms iterations on one clock: pairing the k-th send with the k-th receive
    implies a 9 ms offset, below the size that makes a shift of a whole iteration implausible,
    and the ends agree at both shifts. The steps' numbers (#1001 on both ranks) pair the
    transfers of one iteration: offset 0, 2 shared iterations of 2 transfers each."""
    _one_iteration_late(tmp_path, first=1000, period_us=9_000, gap_us=4_000, offset_us=0.0)
    sync = compute_sync(load_traces(tmp_path, cache=False))
    off = dict(zip(sync.offsets["rank"], sync.offsets["offset_us"]))
    assert off == {0: 0.0, 1: 0.0}
    assert sync.p2p["count"].tolist() == [4]


def test_batched_sendrecv_and_named_copies_are_never_matched_as_collectives(tmp_path):
    for r in (0, 1):
        b = TraceBuilder(rank=r)
        b.step(1, EPOCH, 3000)
        b.kernel("ncclDevKernel_SendRecv(x)", EPOCH + 100 + 300 * r, 200, stream=30,
                 launch_ts=EPOCH + 1, args=_nccl_args("coalesced", (0, 1), "0"))
        b.kernel("Memcpy PtoP (Device -> Device)", EPOCH + 1000 + 500 * r, 100, stream=9,
                 cat="gpu_memcpy", launch_ts=EPOCH + 2)
        b.write(tmp_path / f"rank{r}.json")
    sync = compute_sync(load_traces(tmp_path), compile_comm_patterns(["Memcpy PtoP"]))
    assert sync.instances.empty and sync.straggler is None and sync.offsets.empty
    assert any(n.startswith("2 point-to-point op(s) without a known peer") for n in sync.notes)


def test_huge_integers_and_odd_pg_config_are_read_without_failing(tmp_path):
    d = _lockstep(tmp_path, seqs=[[10 ** 20] * 4, [10 ** 20] * 4])
    for f in d.glob("rank*.json"):
        doc = json.loads(f.read_text())
        doc["distributedInfo"]["pg_config"] = [5]
        for e in doc["traceEvents"]:
            if "Collective name" in e.get("args", {}):
                e["args"]["In msg nelems"] = 10 ** 20
        f.write_text(json.dumps(doc))
    out = _report([d], tmp_path)
    assert len(out["ranks"]) == 2 and out["sync"]["straggler"] is None


def test_ends_that_jitter_over_a_short_span_are_one_group_not_a_fast_drift(tmp_path):
    # kernels only (a profile of GPU activity alone): the traces name no group, so ranks are
    # grouped by whether their ops end together. Rank 2's ends differ from rank 0's by 5, 1 and
    # -2 µs over 3.8 ms: a Theil–Sen slope of -1,849 µs per s, but a change of 7 µs, within the
    # ends' noise (COHORT_TOL_US): one clock, one group
    ends = [1000.0, 2356.0, 3786.0]
    jitter = {0: (0, 0, 0), 1: (-2, 1, -1), 2: (-5, -1, 2)}
    for r, dj in jitter.items():
        b = TraceBuilder(rank=r, world_size=3)
        for end, d in zip(ends, dj):
            b.kernel("void gemm_kernel<float>(float*)", EPOCH + end - 500, 300)
            b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                     EPOCH + end - 100, 100 + d, stream=20)
        b.write(tmp_path / f"rank{r}.json")
    res = compute_sync(load_traces(tmp_path))
    assert not any("never end together" in n for n in res.notes)
    inst = res.instances
    assert inst["ranks"].tolist() == [3, 3, 3] and inst["complete"].all()


def test_point_to_point_keys_are_written_and_read_in_one_place():
    """The key matching writes for a transfer is what every reader parses back: its sender
    and receiver (a group id holding ':' and '|' included); collectives' keys, None and NaN
    are no point-to-point keys, and reading a collective's key as one is an error."""
    from pardiag.analyzer.analyses import instance_keys as K

    keys = K.p2p_keys(pd.Series(["0,1|pg:3", "2,3"]), pd.Series([1, 2]), pd.Series([0, 3]),
                      pd.Series([4, 1]))
    assert keys.tolist() == ["p2p:0,1|pg:3:1>0:4", "p2p:2,3:2>3:1"]
    assert K.p2p_endpoints(keys).to_dict("list") == {"src": [1, 2], "dst": [0, 3]}
    assert [K.p2p_sender(k) for k in keys] == [1, 2]
    mixed = pd.Series([keys[0], "0,1|pg:3:17", None, float("nan")])
    assert K.is_p2p(mixed).tolist() == [True, False, False, False]
    assert K.p2p_sender("0,1|pg:3:17") is None
    with pytest.raises(ValueError, match="not a point-to-point instance key: '0,1:5'"):
        K.p2p_endpoints(pd.Series(["0,1:5"]))


def _two_ops_then_a_late_all_reduce(out: Path, op: str, extra_us, args: dict) -> None:
    """4 ranks, 4 steps of 2300 µs: two ``op`` per step that every rank reaches within 3 µs
    (rank r's lasting ``extra_us(r)`` longer: a broadcast chain's hops), a gemm (950 µs on rank
    2, 700 elsewhere) and an all-reduce that ends together at t0 + 2050."""
    ranks = [0, 1, 2, 3]
    for r in ranks:
        b = TraceBuilder(rank=r, world_size=4)
        seq = 0
        for s in range(4):
            t0 = EPOCH + s * 2300.0
            b.step(s + 1, t0, 2300.0)
            for k, at in enumerate((100.0, 500.0)):
                seq += 1
                jitter = float((r + k + s) % 4)
                _coll(b, op, ranks, "0", t0 + at + jitter, 200.0 + extra_us(r) - jitter,
                      t0 + at - 50.0, seq=seq, **args)
            gemm = 950.0 if r == 2 else 700.0
            b.kernel("void gemm_kernel<float>(float*)", t0 + 900.0, gemm, launch_ts=t0 + 850.0)
            seq += 1
            start = t0 + 900.0 + gemm
            _coll(b, "AllReduce", ranks, "0", start, t0 + 2050.0 - start, t0 + 880.0, seq=seq)
        b.write(out / f"rank{r}.json")


def test_broadcasts_from_a_root_are_no_chance_for_their_members_to_be_last(tmp_path):
    """4 ranks, 4 steps: two broadcasts from rank 0 (members arrive 0–3 µs apart, the chain
    ends 60 µs per hop later), a gemm and an all-reduce that ends together. Rank 2's gemm takes
    950 µs against 700, so it reaches every all-reduce 250 µs late: it causes 250 × 3 ranks ×
    4 steps = 3000 µs of waiting, and no other rank causes more than the broadcasts' jitter.
    A broadcast's members wait for its root only, so it is a chance to be waited for only for
    the root: rank 2 arrives last at 4 of its 4 chances, not at 4 of 12 ops. (Rank 0's
    broadcasts' members arrive within 3 µs of each other: ties, no chance for the root either.)"""
    _two_ops_then_a_late_all_reduce(tmp_path, "Broadcast", lambda r: 60.0 * r, {"Rank": 0})
    d = _report([tmp_path], tmp_path)
    rows = {r["rank"]: r for r in d["sync"]["stragglers"]}
    assert rows[2]["wait_caused_us"] == pytest.approx(3000.0, abs=1e-6)
    assert (rows[2]["last_arrivals"], rows[2]["instances"]) == (4, 4)
    assert (rows[0]["instances"], rows[1]["instances"], rows[3]["instances"]) == (4, 4, 4)
    assert d["sync"]["straggler"] == 2 and d["straggler"] == 2


def test_collectives_every_rank_reaches_together_are_no_chance_to_be_last(tmp_path):
    """4 ranks, 4 steps: two all-gathers every rank reaches within 3 µs (nobody waits there),
    then a gemm and an all-reduce that ends together. Rank 2's gemm takes 950 µs against 700,
    so it reaches every all-reduce 250 µs late: 3000 µs of waiting caused, and it is the only
    rank anyone waits for. The all-gathers' ties name nobody last and are nobody's chance to
    be waited for: rank 2 arrives last at 4 of its 4 chances, not at 4 (or more, by the ties'
    jitter) of 12 ops, and the verdict names it."""
    ranks = [0, 1, 2, 3]
    _two_ops_then_a_late_all_reduce(tmp_path, "AllGather", lambda r: 0.0, {})
    d = _report([tmp_path], tmp_path)
    rows = {r["rank"]: r for r in d["sync"]["stragglers"]}
    # 3000 µs at the all-reduces, and nothing at the 8 ties: nobody waits there
    assert rows[2]["wait_caused_us"] == pytest.approx(3000.0)
    assert [rows[r]["wait_caused_us"] for r in (0, 1, 3)] == [0.0, 0.0, 0.0]
    assert [(rows[r]["last_arrivals"], rows[r]["instances"]) for r in ranks] == [
        (0, 4), (0, 4), (4, 4), (0, 4)]
    assert d["sync"]["straggler"] == 2 and d["straggler"] == 2


def test_gloo_broadcasts_of_a_one_group_run_name_their_late_root(tmp_path):
    """gloo's broadcasts name no group (no record), so a rooted op's root is the member that
    finished first, and where a run has several groups one instance may join several groups'
    ops: who waited for whom is a guess. A run whose pg_config lists one group of all its
    ranks has no such doubt: rank 0, the root, reaches each of 4 broadcasts 300 µs after the
    others, who wait inside them: 1200 µs per other rank, 3600 µs caused by rank 0. The same
    run whose traces list no group says nothing of its groups: nobody is named."""
    for listed in (True, False):
        d = tmp_path / ("listed" if listed else "unlisted")
        d.mkdir()
        for r in range(4):
            b = TraceBuilder(rank=r, world_size=4, backend="gloo")
            b.thread_name(2, "pt_gloo_runloop")
            for s in range(4):
                t = EPOCH + 2000 * s
                b.step(s + 1, t, 2000)
                b.cpu("aten::mm", t, 400)
                arrive = t + 400 + (300 if r == 0 else 0)
                b.cpu("c10d::broadcast_", arrive, 2)
                b.cpu("gloo:broadcast", arrive + 1, (t + 900) - (arrive + 1) - 3 * (r == 0),
                      tid=2, cat="user_annotation")
            doc = b.doc()
            if listed:
                doc["distributedInfo"]["pg_config"] = [
                    {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4,
                     "ranks": [0, 1, 2, 3]}]
            (d / f"rank{r}.json").write_text(json.dumps(doc))
        sync = compute_sync(load_traces(d))
        caused = dict(zip(sync.stragglers["rank"], sync.stragglers["wait_caused_us"]))
        if listed:
            assert sync.straggler == 0 and caused[0] == pytest.approx(3600.0)
        else:
            assert sync.straggler is None and caused.get(0, 0.0) == 0.0


def _four_all_reduces_on_one_clock(d: dict) -> None:
    """Both ranks of report ``d`` count 4 all-reduces, at offset 0, and nobody is named."""
    assert [(r["rank"], [(c["collective"], c["count"]) for c in r["collectives"]])
            for r in d["ranks"]] == [(0, [("all_reduce", 4)]), (1, [("all_reduce", 4)])]
    assert [o["offset_us"] for o in d["sync"]["clock_offsets"]] == [0.0, 0.0]
    assert d["sync"]["straggler"] is None


def test_vllm_all_reduces_count_and_keep_their_place_when_their_kernels_are_lost(tmp_path):
    """vLLM's tensor-parallel all-reduce is its own op (``vllm::all_reduce``, PyNccl inside, no
    c10d record, no profiler step). Rank 1's profiler lost its first 2 kernels (their launches
    kept): both all-reduces still count (4 per rank) and keep their place, so the k-th
    all-reduce of one rank meets the k-th of the other: one clock, nobody waits for a rank
    (both reach every all-reduce together)."""
    kernel = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    for r in (0, 1):
        b = TraceBuilder(rank=r)
        for k in range(4):
            t = EPOCH + 1000 * k
            b.cpu("vllm::all_reduce", t + 300, 20)
            if r == 1 and k < 2:   # the kernel lost, its launch kept
                b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                                 "pid": b.pid, "tid": b.main_tid, "ts": t + 305, "dur": 1,
                                 "args": {"correlation": 9000 + k}})
                continue
            b.kernel("sm89_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", t + 10, 280, launch_ts=t + 2)
            b.kernel(kernel, t + 320, 60, stream=20, launch_ts=t + 305)
        b.write(tmp_path / f"rank{r}.json")
    _four_all_reduces_on_one_clock(_report([tmp_path], tmp_path))


def test_ops_lost_with_their_launches_at_the_session_start_still_count(tmp_path):
    """CUPTI's kernels and runtime calls are one activity buffer: rank 1 lost both for its
    first 2 of 4 steps, while its host ops (``c10d::allreduce_`` > ``record_param_comms``,
    group "0") are all there. Those 2 records launched nothing and come before the rank's first
    device-side record, and group "0"'s later records launch all-reduce kernels: they are 2
    all-reduces whose kernels were lost, so both ranks count 4 and the k-th meets the k-th (one
    clock, nobody waits). Left out: a record of a group that never launches here (gloo's group
    "1", CUDA tensors on gloo launch nothing by design) and a record naming no group, both
    before the first device record too."""
    kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    for r in (0, 1):
        b = TraceBuilder(rank=r)
        b.cpu("record_param_comms", EPOCH - 100, 5,
              args=_nccl_args("allreduce", [0, 1], "1", nelems=256))
        b.cpu("record_param_comms", EPOCH - 90, 5,
              args={"Collective name": "allreduce", "In msg nelems": 256})
        for k in range(4):
            t = EPOCH + 1000 * k
            b.step(k + 1, t, 1000)
            b.cpu("c10d::allreduce_", t + 300, 20)
            b.cpu("record_param_comms", t + 301, 15,
                  args=_nccl_args("allreduce", [0, 1], "0"))
            if r == 1 and k < 2:   # the kernels and their launches lost
                continue
            b.kernel("sm89_xmma_gemm_f32f32_f32f32_f32_tn_n", t + 10, 280, launch_ts=t + 2)
            b.kernel(kernel, t + 320, 60, stream=20, launch_ts=t + 305)
        b.write(tmp_path / f"rank{r}.json")
    _four_all_reduces_on_one_clock(_report([tmp_path], tmp_path))


def test_unnamed_groups_ops_are_numbered_per_type(tmp_path):
    """An inference engine's driver (rank 0) and worker (rank 1), no profiler steps: per
    iteration, two all-reduces launched by a CUDA graph (kernels without a host op: no group
    named) and a gloo broadcast of the next inputs (no record: no group named). The driver
    reaches its broadcast 300 µs into the iteration, after its host work; the worker enters it
    at +50 and waits there for the driver, so the broadcast starts before the all-reduces on
    the worker and after them on the driver. Ops of one group keep their order on every rank,
    a mixture of two groups' need not: numbered per type, the k-th broadcast meets the k-th,
    and the driver caused 250 µs of waiting at each of the 4 (1000 µs); numbered together, the
    worker's broadcasts met the driver's of the iteration before."""
    for r in (0, 1):
        b = TraceBuilder(rank=r)
        b.thread_name(2, "pt_gloo_runloop")
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", EPOCH, 40, launch_ts=EPOCH - 5)
        for k in range(4):
            t = EPOCH + 1000 * (k + 1)
            for j in (100, 200):   # the graph's all-reduces, together on both ranks
                b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage"
                         "<4096ul>)", t + j, 20, stream=20)
            enter = t + (300 if r == 0 else 50)
            b.cpu("c10d::broadcast_", enter, 310 - (enter - t))
            b.cpu("gloo:broadcast", enter + 1, (t + 306) - (enter + 1), tid=2,
                  cat="user_annotation")
        doc = b.doc()
        doc["distributedInfo"]["pg_config"] = [
            {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
             "pg_size": 2, "ranks": [0, 1]},
            {"pg_name": "1", "pg_desc": "undefined", "backend_config": "cpu:gloo,cuda:gloo",
             "pg_size": 2, "ranks": [0, 1]}]
        (tmp_path / f"rank{r}.json").write_text(json.dumps(doc))
    sync = compute_sync(load_traces(tmp_path))
    caused = dict(zip(sync.stragglers["rank"], sync.stragglers["wait_caused_us"]))
    assert sync.straggler == 0
    assert caused[0] == pytest.approx(1000.0) and caused[1] == 0.0


def test_each_profiling_window_gets_its_own_clock_fit(tmp_path):
    """schedule(repeat=2): two windows 10 s apart, 8 steps of 100 ms each, every all-reduce
    ending together in true time. Each window is its own profiler session, whose conversion
    of device times to the host's clock is taken afresh: rank 1's device clock runs 100 µs/s
    fast and is exact at each window's end, so within a window its ends read from −80 to 0 µs
    off (a sawtooth over the two). One line through both windows leaves ±40 µs that flip
    between them, read as waits; fitted window by window, the drift is 100 µs/s in each,
    nobody waits, and a note says how the windows were fitted."""
    step = 100_000.0
    for r in (0, 1):
        for w in range(2):
            t0 = EPOCH + 10e6 * w
            end = t0 + 8 * step
            b = TraceBuilder(rank=r)
            fast = 100e-6 if r == 1 else 0.0   # rank 1's device clock: exact at the end
            for k in range(8):
                t = t0 + k * step
                b.step(10 * w + k + 1, t, step)
                b.kernel("gemm_kernel", t + 1000 + fast * (t + 1000 - end), 60_000,
                         launch_ts=t + 10)
                _coll(b, "AllReduce", (0, 1), "0", t + 61_000 + fast * (t + 61_000 - end),
                      9_000, t + 20)
            b.write(tmp_path / f"host_{100 + r}.{int(t0)}.pt.trace.json")
    ts = load_traces(tmp_path)
    assert len(ts.ranks[1].windows) == 2
    sync = compute_sync(ts)
    assert sync.offsets.set_index("rank").loc[1, "drift_us_per_s"] == pytest.approx(
        100.0, abs=0.5)
    caused = dict(zip(sync.stragglers["rank"], sync.stragglers["wait_caused_us"]))
    assert caused == {0: pytest.approx(0.0, abs=0.5), 1: pytest.approx(0.0, abs=0.5)}
    assert sync.straggler is None
    assert any("fitted window by window" in n for n in sync.notes)
    # the instances used, over both windows
    assert sync.offsets["instances"].tolist() == [16, 16]
    assert any("to the ends of 16 complete" in n for n in sync.notes), sync.notes


def test_when_a_rank_enters_its_steps_is_read_on_each_windows_own_clock(tmp_path):
    """Two windows 300 s apart; rank 1's host is 350 µs ahead in the first and 2,150 µs in the
    second (its clock stepped between them), and every rank enters every step at the same true
    time, its all-reduce ending with the others'. Each window's clocks are fitted on their
    own: read with the first window's offset, rank 1 entered the second window's steps
    1,800 µs early and rank 0 as late, a median of 0.9 ms said as a straggler's late entry."""
    from pardiag.analyzer.analyses.imbalance import skew_origin

    step = 4000.0
    for r in (0, 1):
        for w, off in enumerate((350.0, 2150.0)):
            off = off if r == 1 else 0.0
            t0 = EPOCH + 300e6 * w
            b = TraceBuilder(rank=r)
            for k in range(3):
                t = t0 + k * step + off
                b.step(10 * w + k + 1, t, step)
                b.kernel("gemm_kernel", t + 40, 2000, launch_ts=t + 10)
                _coll(b, "AllReduce", (0, 1), "0", t + 2100, 500, t + 20)
            b.write(tmp_path / f"host_{100 + r}.{int(t0)}.pt.trace.json")
    ts = load_traces(tmp_path)
    sync = compute_sync(ts)
    assert any("fitted window by window" in n for n in sync.notes), sync.notes
    skew = skew_origin(compute_time_breakdown(ts).steps, sync, ts).set_index("rank")
    assert skew["start_late_us"].tolist() == [pytest.approx(0.0, abs=1.0)] * 2


def test_a_collective_outside_the_steps_counted_adds_nothing_to_its_namesake(tmp_path):
    """One profiler step holds an all-reduce rank 0 arrives at 700 µs late; the window's head,
    before any step (a partial accumulation cycle), holds another. Both are the first
    all-reduce of their step (the head's step is none): counted together they read 1.4 ms late
    per step; the step counted holds 0.7 ms."""
    from pardiag.analyzer.analyses.imbalance import skew_origin

    for r in (0, 1):
        b = TraceBuilder(rank=r)
        b.kernel("gemm_kernel", EPOCH + 50, 100, launch_ts=EPOCH + 10)
        late = 700.0 if r == 0 else 0.0
        _coll(b, "AllReduce", (0, 1), "0", EPOCH + 200 + late, 800 - late, EPOCH + 20 + late)
        b.step(7, EPOCH + 1500, 5000)
        b.kernel("gemm_kernel", EPOCH + 1600, 300, launch_ts=EPOCH + 1510)
        _coll(b, "AllReduce", (0, 1), "0", EPOCH + 2000 + late, 800 - late,
              EPOCH + 1520 + late)
        b.write(tmp_path / f"rank{r}.json")
    ts = load_traces(tmp_path)
    sync = compute_sync(ts)
    assert sorted(sync.instances["step"].tolist()) == [-1, 7]
    skew = skew_origin(compute_time_breakdown(ts).steps, sync, ts).set_index("rank")
    assert skew.loc[0, "top_delay_us"] == pytest.approx(700.0)
    assert skew.loc[0, "delay_us"] == pytest.approx(700.0)


def test_a_rank_whose_window_began_an_iteration_later_is_not_given_a_clock_offset(tmp_path):
    """An on-demand trace (no profiler steps, no Seq) of two ranks on one clock: rank 0 traced
    iterations 0-3, rank 1 picked the request up one iteration later and traced 1-4, each of
    300 ms with two all-reduces of different sizes that end together in true time. Paired
    k-th with k-th, every end agrees on a 300 ms offset; paired by time, on none, with three
    iterations in common. A 300 ms clock offset is no wall clock's: the pairing by time
    stands, rank 1's offset is 0, and 6 instances are complete."""
    period = 300_000.0
    for r in (0, 1):
        b = TraceBuilder(rank=r)
        for it in range(r, r + 4):
            t = EPOCH + it * period
            b.kernel("gemm_kernel", t + 1000, 100_000, launch_ts=t + 10)
            _coll(b, "AllReduce", (0, 1), "0", t + 200_000, 10_000, t + 20, nelems=1 << 22)
            _coll(b, "AllReduce", (0, 1), "0", t + 281_000, 10_000, t + 30, nelems=1 << 20)
        b.write(tmp_path / f"rank{r}.json")
    sync = compute_sync(load_traces(tmp_path))
    assert sync.offsets["offset_us"].tolist() == [0.0, 0.0]
    assert int(sync.instances["complete"].sum()) == 6
    assert sync.straggler is None


def test_a_rank_without_the_first_window_is_matched_in_the_windows_it_has(tmp_path):
    """schedule(repeat=2), no Seq: rank 0 wrote both windows, 30 s apart; rank 1's first file
    is lost, so its only window is the run's second. Counted rank by rank, its window is its
    first and met rank 0's first: nothing matched, nobody named. Its window is the run's
    second: the second window's 3 all-reduces are complete, rank 1 (200 µs late at each) is
    the straggler, and both ranks are in the clock table."""
    for r in (0, 1):
        for w in range(2):
            if r == 1 and w == 0:
                continue
            t0 = EPOCH + 30e6 * w
            b = TraceBuilder(rank=r)
            b.step(w + 1, t0, 4000)
            for k in range(3):
                t = t0 + 1000 * k
                late = 200 if r == 1 else 0
                b.kernel("gemm_kernel", t + 10, 300 + late, launch_ts=t + 1)
                _coll(b, "AllReduce", (0, 1), "0", t + 400 + late, 400 - late, t + 2)
            b.write(tmp_path / f"rank{r}.{int(t0)}.pt.trace.json")
    sync = compute_sync(load_traces(tmp_path))
    assert int(sync.instances["complete"].sum()) == 3
    assert sync.offsets["rank"].tolist() == [0, 1]
    assert sync.offsets["offset_us"].tolist() == [0.0, 0.0]
    caused = dict(zip(sync.stragglers["rank"], sync.stragglers["wait_caused_us"]))
    assert caused[1] > 0 and sync.straggler == 1, sync.stragglers
