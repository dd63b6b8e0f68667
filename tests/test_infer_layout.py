"""Layout and pipeline schedule inferred from traces recorded without pardiag."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pardiag.analyzer.analyses.infer_layout import INFERRED_SOURCE, infer_layout
from pardiag.analyzer.analyses.op_roles import hybrid_sharding
from pardiag.analyzer.per_rank import REDUCER
from pardiag.analyzer.report.registry import build_report, report_json
from pardiag.analyzer.trace import load_traces

from .synth import TraceBuilder

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
PG_WORLD2 = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}]


def _rank(rank: int, pg_config=PG_WORLD2, world: int = 2) -> TraceBuilder:
    b = TraceBuilder(rank=rank, world_size=world, backend="gloo", pid=100 + rank,
                     main_tid=100 + rank)  # the main thread: tid == pid
    b.step(1, 0, 100)
    return b


def _p2p(b: TraceBuilder, op: str, peer: int, ts: float, wait: float = 0.0) -> None:
    """c10d::send / c10d::recv_ of 1 µs (peer in Concrete Inputs[2]); a receive's gloo:recv
    lasts ``wait`` µs after it (the blocking wait for the message)."""
    name = "c10d::send" if op == "send" else "c10d::recv_"
    b.cpu(name, ts, 1, args={"Concrete Inputs": ["", "", str(peer), "0"],
                             "Input Dims": [[[8, 256]], [], [], []]})
    if op == "recv" and wait:
        b.cpu("gloo:recv", ts + 1, wait, cat="user_annotation")


def _write(tmp: Path, builders, pg_configs) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    for b, pgc in zip(builders, pg_configs):
        d = b.doc()
        d["distributedInfo"]["pg_config"] = pgc
        d["distributedInfo"]["pg_count"] = len(pgc)
        (tmp / f"rank{b.rank}.json").write_text(json.dumps(d))
    return tmp


def _gpipe(tmp: Path) -> Path:
    """GPipe, 2 stages, 2 microbatches, one step [0, 100). Busy parts (after the waits for
    input and before the sends): rank 0 [0,10) [11,21) [50,70) [72,90); rank 1 [12,22)
    [24,34) [35,49) [50,71)."""
    r0, r1 = _rank(0), _rank(1)
    r0.cpu("Forward 0", 0, 11, cat="user_annotation").cpu("aten::mm", 0, 10)
    _p2p(r0, "send", 1, 10)
    r0.cpu("Forward 1", 11, 11, cat="user_annotation").cpu("aten::mm", 11, 10)
    _p2p(r0, "send", 1, 21)
    r0.cpu("Backward 0", 40, 30, cat="user_annotation").cpu("aten::mm", 50, 20)
    _p2p(r0, "recv", 1, 40, wait=9)
    r0.cpu("Backward 1", 70, 20, cat="user_annotation").cpu("aten::mm", 72, 18)
    _p2p(r0, "recv", 1, 70, wait=1)
    r1.cpu("Forward 0", 10, 12, cat="user_annotation").cpu("aten::mm", 12, 10)
    _p2p(r1, "recv", 0, 10, wait=1)
    r1.cpu("Forward 1", 22, 13, cat="user_annotation").cpu("aten::mm", 24, 10)
    _p2p(r1, "recv", 0, 22, wait=1)
    r1.cpu("Backward 0", 35, 15, cat="user_annotation").cpu("aten::mm", 35, 14)
    _p2p(r1, "send", 0, 49)
    r1.cpu("Backward 1", 50, 22, cat="user_annotation").cpu("aten::mm", 50, 21)
    _p2p(r1, "send", 0, 71)
    return _write(tmp, [r0, r1], [PG_WORLD2, PG_WORLD2])


def test_gpipe_ranges_give_schedule_microbatches_and_measured_bubbles(tmp_path):
    traces = load_traces(_gpipe(tmp_path / "gpipe"))
    lay = infer_layout(traces)
    assert lay.dims == {"pp": 2}
    assert lay.strategies == ["pipeline"]
    assert lay.pipeline == {"schedule": "ScheduleGPipe", "stages": 2, "microbatches": 2,
                            "pp_group_size": 2, "stages_per_rank": 1,
                            "stage_ranks": {0: 0, 1: 1}, "microbatches_from": "ranges"}
    assert lay.not_inferred == ()
    rep = build_report(traces)
    b = rep.results["pipeline"].bubbles.set_index("rank")
    assert (b["method"] == "measured").all()
    assert b.loc[0, "window_us"] == 90.0 and b.loc[1, "window_us"] == 90.0
    assert b.loc[0, "busy_us"] == 58.0 and b.loc[1, "busy_us"] == 55.0
    assert b.loc[0, "bubble_pct"] == pytest.approx(100 * 32 / 90)
    assert b.loc[1, "bubble_pct"] == pytest.approx(100 * 35 / 90)
    assert [b.loc[0, c] for c in ("warmup_bubble_us", "steady_bubble_us",
                                  "cooldown_bubble_us")] == [1.0, 29.0, 2.0]
    assert [b.loc[1, c] for c in ("warmup_bubble_us", "steady_bubble_us",
                                  "cooldown_bubble_us")] == [14.0, 1.0, 20.0]
    assert b.loc[0, "ideal_pct"] == pytest.approx(100 / 3)
    assert list(b["stages"]) == ["0", "1"]
    j = report_json(rep)
    assert j["layout"]["source"] == INFERRED_SOURCE
    assert j["layout"]["pipeline"]["stage_ranks"] == {"0": 0, "1": 1}
    assert j["pipeline"]["schedule"]["source"] == INFERRED_SOURCE
    assert any("Forward i" in e for e in j["layout"]["evidence"])


def test_1f1b_without_marks_estimates_microbatches_from_sends(tmp_path):
    """1F1B marks no microbatch: the schedule comes from the order of stage 0's messages,
    the microbatches from its sends per step, and the report says they are estimated."""
    r0, r1 = _rank(0), _rank(1)
    for op, ts in (("send", 5), ("send", 15), ("recv", 25), ("send", 35), ("recv", 45),
                   ("recv", 60)):
        _p2p(r0, op, 1, ts, wait=2)
    for op, ts in (("recv", 6), ("send", 12), ("recv", 16), ("send", 30), ("recv", 36),
                   ("send", 50)):
        _p2p(r1, op, 0, ts, wait=2)
    r0.cpu("aten::mm", 0, 5)
    r1.cpu("aten::mm", 20, 5)
    traces = load_traces(_write(tmp_path / "1f1b", [r0, r1], [PG_WORLD2, PG_WORLD2]))
    lay = infer_layout(traces)
    assert lay.pipeline["schedule"] == "Schedule1F1B"
    assert lay.pipeline["microbatches"] == 3
    assert lay.pipeline["microbatches_from"] == "sends"
    assert lay.chunks.empty
    assert len(lay.not_inferred) == 1 and "estimated" in lay.not_inferred[0]
    rep = build_report(traces)
    pipe = rep.results["pipeline"]
    assert set(pipe.bubbles["method"]) == {"estimate"}
    assert pipe.schedule["microbatches_estimated"] is True
    assert pipe.bubbles["ideal_pct"].iloc[0] == pytest.approx(100 * 1 / 4)
    # GPipe's order (every send before any receive) is told apart
    r0g = _rank(0)
    for op, ts in (("send", 5), ("send", 15), ("recv", 25), ("recv", 45)):
        _p2p(r0g, op, 1, ts)
    r1g = _rank(1)
    for op, ts in (("recv", 6), ("recv", 16), ("send", 30), ("send", 50)):
        _p2p(r1g, op, 0, ts)
    lay = infer_layout(load_traces(_write(tmp_path / "g", [r0g, r1g], [PG_WORLD2, PG_WORLD2])))
    assert (lay.pipeline["schedule"], lay.pipeline["microbatches"]) == ("ScheduleGPipe", 2)


def _fsdp2_tp_ranks() -> list[TraceBuilder]:
    """4 gloo ranks with FSDP2's range and a functional all-reduce (tensor parallelism's mark)
    in one step; the tests give them their process groups."""
    bs = []
    for r in range(4):
        b = TraceBuilder(rank=r, world_size=4, backend="gloo", pid=100 + r)
        b.step(1, 0, 100).cpu("FSDP::pre_forward", 1, 2, cat="user_annotation")
        b.cpu("_c10d_functional::all_reduce", 10, 2)
        bs.append(b)
    return bs


def test_mesh_descriptions_and_wrapper_marks(tmp_path):
    """2 × 2 mesh: degrees from mesh_dp / mesh_tp; FSDP2 and TP from their marks."""
    bs, pgs = _fsdp2_tp_ranks(), []
    for r in range(4):
        pgs.append([{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
                    {"pg_name": "1", "pg_desc": "mesh_dp", "ranks": [r % 2, r % 2 + 2]},
                    {"pg_name": "2", "pg_desc": "mesh_tp", "ranks": [r // 2 * 2, r // 2 * 2 + 1]}])
    lay = infer_layout(load_traces(_write(tmp_path / "2d", bs, pgs)))
    assert lay.dims == {"dp": 2, "tp": 2}
    assert lay.strategies == ["fsdp2", "tp"]
    assert lay.pipeline is None
    # without descriptions, the world is split only when one degree is unknown
    b0, b1 = _rank(0), _rank(1)
    for b in (b0, b1):
        b.cpu("DistributedDataParallel.forward", 1, 2, cat="user_annotation")
    lay = infer_layout(load_traces(_write(tmp_path / "ddp", [b0, b1], [PG_WORLD2, PG_WORLD2])))
    assert (lay.dims, lay.strategies) == ({"dp": 2}, ["ddp"])
    for b in (b0, b1):
        b.cpu("_c10d_functional::all_reduce", 10, 2)
    lay = infer_layout(load_traces(_write(tmp_path / "ddp_tp", [b0, b1], [PG_WORLD2, PG_WORLD2])))
    assert lay.dims == {} and lay.strategies == ["ddp", "tp"]
    assert any("degrees of dp and tp" in x for x in lay.not_inferred)


def test_a_flattened_mesh_named_after_a_size_one_dimension_is_no_dimension(tmp_path):
    """dp_shard 2 × cp 1 × tp 2 with every dimension kept (torchtitan-style code keeps size-1
    dimensions): the cp groups hold one rank each, and the flattened ``mesh_cp_tp`` holds
    the tp group's ranks. It is cp × tp, a product, not context parallelism of 2 (which made
    the degrees multiply to 8 on a world of 4, and the layout unknown)."""
    bs, pgs = _fsdp2_tp_ranks(), []
    for r in range(4):
        tp = [r // 2 * 2, r // 2 * 2 + 1]
        pgs.append([{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
                    {"pg_name": "1", "pg_desc": "mesh_dp_shard", "ranks": [r % 2, r % 2 + 2]},
                    {"pg_name": "2", "pg_desc": "mesh_cp", "ranks": [r]},
                    {"pg_name": "3", "pg_desc": "mesh_tp", "ranks": tp},
                    {"pg_name": "4", "pg_desc": "mesh_dp_shard_cp", "ranks": [r % 2, r % 2 + 2]},
                    {"pg_name": "5", "pg_desc": "mesh_cp_tp", "ranks": tp}])
    lay = infer_layout(load_traces(_write(tmp_path / "mesh", bs, pgs)))
    assert lay.dims == {"dp": 2, "tp": 2}
    assert lay.strategies == ["fsdp2", "tp"]


SAMPLE_CASES = ["ddp_cpu_2rank", "fsdp1_cpu_2rank", "fsdp2_cpu_2rank", "zero1_cpu_2rank",
                "tp_sp_cpu_2rank", "moe_ep_cpu_2rank", "fsdp_tp_2d_cpu_4rank",
                "pp_gpipe_cpu_2rank", "pp_1f1b_cpu_4rank", "pp_interleaved_cpu_2rank"]


@pytest.mark.parametrize("name", SAMPLE_CASES)
def test_sample_traces_without_records_infer_the_recorded_layout(tmp_path, name):
    """The traces of pardiag's sample runs, without run.json and sidecars, are traces from
    elsewhere: what is inferred must equal what pardiag recorded."""
    src = SAMPLES / name
    for f in src.glob("rank*.trace.json.gz"):
        shutil.copy(f, tmp_path / f.name)
    recorded = json.loads((src / "pardiag" / "run.json").read_text())["layout"]
    lay = infer_layout(load_traces(tmp_path))
    assert lay.dims == recorded["dims"]
    assert lay.strategies == sorted(recorded["strategies"])
    rp = recorded.get("pipeline")
    if rp:
        got = lay.pipeline
        assert (got["schedule"], got["stages"], got["microbatches"], got["pp_group_size"],
                got["stages_per_rank"]) == (rp["schedule"], rp["stages"], rp["microbatches"],
                                            rp["pp_group_size"], rp["stages_per_rank"])
    else:
        assert lay.pipeline is None


def test_pipeline_with_a_rank_missing_still_reports(tmp_path):
    """A 4-stage pipeline whose rank 2 wrote no trace: ranks 1 and 3 still name it as their
    peer. The layout is inferred from the others and says what it cannot describe; the report
    (and its critical path) is built, not refused."""
    for f in (SAMPLES / "pp_1f1b_cpu_4rank").glob("rank*.trace.json.gz"):
        if f.name != "rank2.trace.json.gz":
            shutil.copy(f, tmp_path / f.name)
    ts = load_traces(tmp_path)
    lay = infer_layout(ts)
    assert lay.pipeline is not None and lay.pipeline["pp_group_size"] == 4
    assert any("[2] named only by their peers' messages" in m for m in lay.not_inferred)
    rep = build_report(ts)
    assert rep.critical_path.why_none == "" and len(rep.critical_path.steps) == 3
    assert set(rep.critical_path.slack["rank"]) == {0, 1, 3}


def test_pardiag_runs_keep_their_recorded_layout():
    for name in ("pp_gpipe_cpu_2rank", "zero1_cpu_2rank"):
        traces = load_traces(SAMPLES / name, reducer=REDUCER)
        rep = build_report(traces)
        lay = rep.results["layout"]
        recorded = json.loads((SAMPLES / name / "pardiag" / "run.json").read_text())["layout"]
        assert lay.source == "recorded" and lay.evidence == () and lay.not_inferred == ()
        assert (lay.dims, lay.strategies, lay.pipeline) == (
            recorded["dims"], recorded["strategies"], recorded.get("pipeline"))
        j = report_json(rep)["layout"]
        assert j["source"] == "recorded" and "not_inferred" not in j
        pipe = rep.results["pipeline"]
        assert pipe.schedule is None or "source" not in pipe.schedule


@pytest.fixture(scope="module")
def plain_interleaved(tmp_path_factory):
    """One run of the interleaved example under plain torch.profiler (no pardiag hooks)."""
    out = tmp_path_factory.mktemp("plain_interleaved")
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2",
           str(ROOT / "benchmarks" / "_plain_profiler.py"), "1", "1", "3", str(out),
           str(ROOT / "examples" / "train_pp.py"), "--steps", "6", "--schedule", "interleaved",
           "--microbatches", "4", "--stages-per-rank", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.mark.e2e
def test_plain_profiler_interleaved_run(plain_interleaved):
    from click.testing import CliRunner

    from pardiag.cli import cli
    js = plain_interleaved.parent / "interleaved.json"
    res = CliRunner().invoke(cli, ["report", str(plain_interleaved), "-o",
                                    str(plain_interleaved.parent / "r.html"), "--json", str(js)],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    term = res.output
    assert "Layout (inferred from traces): PP=2 (pipeline); ScheduleInterleaved1F1B, 4 stages, " \
           "4 microbatches" in term
    j = json.loads(js.read_text())
    assert j["layout"]["source"] == INFERRED_SOURCE
    assert j["layout"]["pipeline"]["stage_ranks"] == {"0": 0, "1": 1, "2": 0, "3": 1}
    assert j["pipeline"]["schedule"] == {"schedule": "ScheduleInterleaved1F1B", "p": 2, "m": 4,
                                         "v": 2, "stages": 4, "source": INFERRED_SOURCE,
                                         "ideal_from": "replay"}
    summ = {r["rank"]: r for r in j["pipeline"]["summary"]}
    assert summ[0]["stages"] == "0,2" and summ[1]["stages"] == "1,3"
    # the ideal replays the run's own order; for Interleaved1F1B it is the formula's 1/(2·4+1)
    assert summ[0]["ideal_pct"] == pytest.approx(100 * 1 / 9)
    assert all(r["method"] == "measured" for r in j["pipeline"]["bubbles"])
    assert all(0 < r["bubble_pct"] < 100 for r in j["pipeline"]["bubbles"])
    # 3 profiled steps × 2 stages × 4 microbatches × (F, B) on each rank
    html = (plain_interleaved.parent / "r.html").read_text()
    assert "Layout inferred from traces" in html


#: Examples run under plain torch.profiler (no pardiag hooks) and the layout the report must
#: infer from their traces alone: (ranks, script args, dims, strategies, schedule, microbatches).
PLAIN_RUNS = {
    "gpipe": (2, ["train_pp.py", "--schedule", "gpipe", "--microbatches", "4"], {"pp": 2},
              ["pipeline"], "ScheduleGPipe", 4),
    "1f1b": (2, ["train_pp.py", "--schedule", "1f1b", "--microbatches", "4"], {"pp": 2},
             ["pipeline"], "Schedule1F1B", 4),
    "fsdp2": (2, ["train_fsdp2.py"], {"dp": 2}, ["fsdp2"], None, None),
    "tp": (2, ["train_tp.py"], {"tp": 2}, ["tp"], None, None),
    "2d": (4, ["train_2d.py"], {"dp": 2, "tp": 2}, ["fsdp2", "tp"], None, None),
}


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(PLAIN_RUNS))
def test_plain_profiler_runs_infer_their_layout(name, tmp_path):
    n, (script, *args), dims, strategies, schedule, m = PLAIN_RUNS[name][0], *PLAIN_RUNS[name][1:]
    out = tmp_path / name
    out.mkdir()
    torchrun = Path(sys.executable).parent / "torchrun"
    r = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", str(n),
                        str(ROOT / "benchmarks" / "_plain_profiler.py"), "1", "1", "3", str(out),
                        str(ROOT / "examples" / script), "--steps", "6", *args],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    j = report_json(build_report(load_traces(out)))
    lay = j["layout"]
    assert lay["source"] == INFERRED_SOURCE
    assert (lay["dims"], lay["strategies"]) == (dims, strategies)
    if schedule is None:
        assert lay["pipeline"] is None and j["pipeline"] is None
    else:
        assert (lay["pipeline"]["schedule"], lay["pipeline"]["microbatches"]) == (schedule, m)
        assert j["pipeline"]["schedule"]["schedule"] == schedule
        estimated = schedule == "Schedule1F1B"  # 1F1B marks no microbatch: m counted from sends
        assert bool(j["pipeline"]["schedule"].get("microbatches_estimated")) == estimated
        assert any("marks no microbatch" in x for x in lay["not_inferred"]) == estimated
        # ranks of a pipeline wait for each other in its bubble: no straggler from that waiting
        changes = j["recommendations"] + j["not_recommended"]
        assert "straggler" not in {c["kind"] for c in changes}
        if not estimated:   # the model's microbatch: train_pp's 32 samples over 4 microbatches
            mb = [c["batch"]["microbatch"]["now"] for c in changes if c["kind"] == "microbatches"]
            assert mb and set(mb) == {8}


def test_zero12_pattern_from_one_groups_ops_per_step():
    """ZeRO-1/2 without marks: each profiled step, one group reduces gradients (all-reduce or
    reduce-scatter buckets) and gathers the updated partitions at most as often. Not ZeRO when a
    step lacks the gather, gathers more than it reduces (FSDP's pattern), or holds other ops."""
    import pandas as pd

    from pardiag.analyzer.analyses.op_roles import zero12_line as _zero12

    def events(per_step):
        rows = [{"rank": r, "step": s, "group": "g0", "pg": "0", "op": op}
                for r in (0, 1) for s in (1, 2) for op in per_step]
        rows.append({"rank": 0, "step": -1, "group": "g0", "pg": "0", "op": "broadcast"})
        return pd.DataFrame(rows)

    line = _zero12(events(["all_reduce", "all_reduce", "all_reduce", "all_gather"]))
    assert line is not None and "reduces gradients (3)" in line and "partitions (1)" in line
    assert _zero12(events(["reduce_scatter", "all_gather"])) is not None
    assert _zero12(events(["all_reduce"])) is None                        # DDP's pattern
    assert _zero12(events(["reduce_scatter", "all_gather", "all_gather"])) is None
    assert _zero12(events(["all_reduce", "all_gather", "all_to_all"])) is None
    assert _zero12(None) is None and _zero12(pd.DataFrame()) is None


def test_microbatch_size_from_the_sent_activations(tmp_path):
    """A GPipe run's traces alone (sample traces without pardiag's records): the microbatch is
    dim 0 of what stage 0 sends — [8, 256] over 4 microbatches, a step of 32 samples. Rewritten
    to [1, 256] (a microbatch of one sample), more microbatches are ruled out, as the recorded
    path rules them out, and fewer are evaluated."""
    import gzip

    def report(dims: str | None):
        out = tmp_path / (dims or "as_recorded")
        out.mkdir()
        for f in sorted((SAMPLES / "pp_gpipe_cpu_2rank").glob("rank*.trace.json*")):
            text = (gzip.open(f, "rt") if f.suffix == ".gz" else open(f)).read()
            if dims:
                text = text.replace("[8, 256]", dims)
            (out / f.name.removesuffix(".gz")).write_text(text)
        j = report_json(build_report(load_traces(out)))
        return {c["params"]["microbatches"]: c for c in j["recommendations"] + j["not_recommended"]
                if c["kind"] == "microbatches"}

    mbs = report(None)
    assert {m: c["batch"]["microbatch"]["now"] for m, c in mbs.items()} == {2: 8, 8: 8, 16: 8}
    assert not any(c["ruled_out"] for c in mbs.values())
    mbs = report("[1, 256]")
    assert {m for m, c in mbs.items() if c["ruled_out"]} == {8, 16}
    assert "under 1 sample each (global batch of 4 samples)" in mbs[16]["ruled_out"]
    assert not mbs[2]["ruled_out"] and mbs[2]["batch"]["microbatch"]["now"] == 1
    assert any("dim 0 of the activations stage 0 sends" in e for e in mbs[2]["evidence"])


def test_gloo_point_to_point_peers_of_a_middle_stage(tmp_path):
    """Stage 1 of 3 on gloo receives from 0, sends to 2, receives from 2, sends to 0; each
    transfer is a c10d call (the peer in Concrete Inputs[2]) and a gloo:send / gloo:recv on the
    calling thread. The i-th gloo:send takes the i-th c10d::send's peer (never a receive's), and
    groups of one rank in pg_config (torchtitan lists one per unused mesh dimension) leave the
    peers global."""
    from pardiag.analyzer.analyses.comm_events import comm_events

    pgc = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2]},
           {"pg_name": "1", "pg_desc": "mesh_tp", "ranks": [1]},
           {"pg_name": "2", "pg_desc": "mesh_dp_replicate", "ranks": [1]}]
    b = _rank(1, world=3)
    for ts, (op, peer) in zip((10, 30, 50, 70), (("recv", 0), ("send", 2), ("recv", 2),
                                                 ("send", 0))):
        _p2p(b, op, peer, ts)
        b.cpu(f"gloo:{op}", ts + 1, 5, cat="user_annotation")
    ev = comm_events(load_traces(_write(tmp_path / "mid", [b], [pgc])))
    ev = ev.sort_values("start_us")
    assert list(zip(ev["op"], ev["peer"])) == [("recv", 0), ("send", 2), ("recv", 2), ("send", 0)]


def test_functional_scalar_reductions_are_no_tensor_parallelism():
    """FSDP alone under torchtitan: per rank and step five functional all-reduces of at most
    228 bytes (token count, gradient norms, loss mean and max) — no tp. Tensor parallelism's
    are all-gathers or reduce-scatters of activations, larger all-reduces, or many."""
    import pandas as pd

    from pardiag.analyzer.analyses.op_roles import scalar_reductions as _scalar_reductions

    def events(ops):
        return pd.DataFrame([{"rank": r, "step": s, "op": op, "bytes": n, "functional": True}
                             for r in (0, 1) for s in (4, 5) for op, n in ops])

    scalars = [("all_reduce", 8), ("all_reduce", 228), ("all_reduce", 4), ("all_reduce", 4),
               ("all_reduce", 8)]
    line = _scalar_reductions(events(scalars))
    assert line is not None and "20 functional collectives" in line and "228 bytes" in line
    assert _scalar_reductions(events(scalars + [("all_gather", 131072)])) is None
    assert _scalar_reductions(events(scalars + [("all_reduce", 8192)])) is None
    assert _scalar_reductions(events([("all_reduce", 512)] * 9)) is None  # 9 a step: a TP model
    assert _scalar_reductions(events([("all_reduce", float("nan"))])) is None  # sizes unknown
    assert _scalar_reductions(None) is None


def test_groups_of_unnamed_ops_from_the_mesh(tmp_path):
    """A 2 × 2 mesh (mesh_fsdp [0,2]/[1,3], mesh_tp [0,1]/[2,3], size-1 groups of other
    dimensions) whose gloo ops name no group: FSDP's c10d collectives are the rank's fsdp group's,
    functional all-gathers and large all-reduces its tp group's, renumbered per group; functional
    scalar reductions are the ambiguous group's and never matched; on a mesh of one dimension
    nothing is renamed."""
    import pandas as pd

    from pardiag.analyzer.analyses.comm_events import AMBIGUOUS_GROUP, groups_from_mesh
    from pardiag.analyzer.analyses.matching import match_instances

    bs, pgs = [], []
    for r in range(4):
        bs.append(_rank(r, world=4))
        pgs.append([{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
                    {"pg_name": "1", "pg_desc": "mesh_fsdp", "ranks": [r % 2, r % 2 + 2]},
                    {"pg_name": "2", "pg_desc": "mesh_tp", "ranks": [r // 2 * 2, r // 2 * 2 + 1]},
                    {"pg_name": "3", "pg_desc": "mesh_pp", "ranks": [r]}])
    traces = load_traces(_write(tmp_path / "mesh", bs, pgs))
    ops = [("all_gather", 4096, False), ("all_gather", 2048, True), ("all_reduce", 8192, True),
           ("reduce_scatter", 4096, False), ("all_reduce", 4, True)]
    ev = pd.DataFrame([{"rank": r, "pg": "?", "group": "", "seq": i + 1, "native_seq": False,
                        "op": op, "peer": None, "root": None, "start_us": 10.0 * i,
                        "end_us": 10.0 * i + 5, "bytes": n, "group_size": 4, "step": 1,
                        "source": "trace", "window": 0, "functional": f}
                       for r in range(4) for i, (op, n, f) in enumerate(ops)])
    out = groups_from_mesh(ev, traces)
    r1 = out[out["rank"] == 1]
    assert list(r1["group"]) == ["1,3|mesh_fsdp", "0,1|mesh_tp", "0,1|mesh_tp", "1,3|mesh_fsdp",
                                 AMBIGUOUS_GROUP]
    assert list(r1["seq"]) == [1, 1, 2, 2, 5] and list(r1["group_size"]) == [2, 2, 2, 2, 4]
    m = match_instances(out)
    assert m.loc[m["group"] == AMBIGUOUS_GROUP, "instance"].isna().all()
    assert m.groupby("instance")["rank"].apply(sorted).map(tuple).value_counts().to_dict() == {
        (0, 1): 2, (2, 3): 2, (0, 2): 2, (1, 3): 2}
    # one dimension: the world's ops stay unnamed (matched over all ranks)
    one = load_traces(_write(tmp_path / "one", bs[:2], [
        [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]},
         {"pg_name": "3", "pg_desc": "mesh_tp", "ranks": [r]}] for r in (0, 1)]))
    assert groups_from_mesh(ev[ev["rank"] < 2], one)["group"].eq("").all()


# -- what the all-to-alls carry, by evidence ----------------------------------------------------

PG_WORLD4 = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
             {"pg_name": "1", "pg_desc": "undefined", "pg_size": 4, "ranks": [0, 1, 2, 3]}]


def _a2a_rank(rank: int, around: str, router: bool = False, splits: str = "[]",
              named: bool = False) -> TraceBuilder:
    """A GPU rank of 4 whose layer runs q/k/v all-to-alls, then ``around`` (a kernel name), then
    one more all-to-all, twice; ``router``: an ``aten::topk`` before them; ``named``: each
    all-to-all inside DeepSpeed-Ulysses' ``_SeqAllToAll`` autograd function."""
    b = TraceBuilder(rank=rank, world_size=4, pid=100 + rank, main_tid=100 + rank)
    b.step(1, 0, 4000)
    t = 10.0
    args = {"Collective name": "all_to_all", "dtype": "BFloat16", "In msg nelems": 4096,
            "Out msg nelems": 4096, "Group size": 4, "In split size": splits,
            "Out split size": splits, "Process Group Name": "1",
            "Process Group Description": "undefined", "Process Group Ranks": "[0, 1, 2, 3]"}
    for _ in range(2):
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t, 200, launch_ts=t - 5)
        t += 210
        if router:
            b.cpu("aten::topk", t - 8, 5)
            b.kernel("void at::native::sbtopk::gatherTopK<float>", t, 20, launch_ts=t - 5)
            t += 30
        for _ in range(3):
            if named:
                b.cpu("_SeqAllToAll", t - 7, 8)
            b.cpu("nccl:all_to_all", t - 5, 4, args=args)
            b.cpu("record_param_comms", t - 4, 2, args=args)
            b.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", t, 60, stream=20,
                     launch_ts=t - 3, args=args)
            t += 70
        b.kernel(around, t, 300, launch_ts=t - 5)
        t += 310
        b.cpu("nccl:all_to_all", t - 5, 4, args=args)
        b.cpu("record_param_comms", t - 4, 2, args=args)
        b.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", t, 60, stream=20,
                 launch_ts=t - 3, args=args)
        t += 70
    return b


@pytest.mark.parametrize("around, router, splits, dims, strategies, unknown", [
    # all-to-alls around attention, no router: Ulysses' sequence exchange
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", False, "[]",
     {"cp": 4}, ["cp"], None),
    # around the experts' GEMM after a top-k gate: expert parallelism
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>", True, "[]",
     {"ep": 4}, ["ep"], None),
    # split sizes that differ: tokens routed unevenly
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>", False, "[1024, 512, 2048, 512]",
     {"ep": 4}, ["ep"], None),
    # a gate and attention next to the all-to-alls: the evidence disagrees
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", True, "[]",
     {}, [], "expert dispatch by"),
    # neither: nothing says what they carry
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>", False, "[]",
     {}, [], "no router"),
    # named as Ulysses' exchange, 13 heads over 4 ranks (4, 3, 3, 3): sizes that differ are
    # heads, not routed tokens, where no router says otherwise ...
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", "named", "[4, 3, 3, 3]",
     {"cp": 4}, ["cp"], None),
    # ... and with a router too, the evidence disagrees
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", "named+router",
     "[4, 3, 3, 3]", {}, [], "expert dispatch by"),
])
def test_all_to_alls_are_named_by_what_they_carry_or_unknown(tmp_path, around, router, splits,
                                                            dims, strategies, unknown):
    named = isinstance(router, str)
    router = router == "named+router" if named else router
    ranks = [_a2a_rank(r, around, router, splits, named) for r in range(4)]
    lay = infer_layout(load_traces(_write(tmp_path, ranks, [PG_WORLD4] * 4)))
    assert lay.dims == dims and lay.strategies == strategies
    said = [ln for ln in lay.not_inferred if "what the all-to-alls carry is unknown" in ln]
    assert (said and unknown in said[0]) if unknown else not said, lay.not_inferred


def test_a_combined_action_range_is_split_into_its_two_actions(tmp_path):
    """ScheduleDualPipeV runs a forward and a backward of other stages in one range,
    ``PP:(0F1;3B0)OVERLAP_F_B``, one after the other. Its busy part is split where the first
    autograd function starts (the backward's start on the host); a combined range with no
    such mark is split in proportion to the rank's own forward and backward ranges (10 and 20
    µs here), so both actions count as busy and as the microbatches they are."""
    from pardiag.analyzer.per_rank.summary import summary_of

    b = _rank(0)
    b.cpu("PP:0F0", 0, 10, cat="user_annotation").cpu("aten::mm", 0, 10)
    b.cpu("PP:(0F1;3B0)OVERLAP_F_B", 20, 30, cat="user_annotation").cpu("aten::mm", 20, 8)
    b.cpu("autograd::engine::evaluate_function: MmBackward0", 30, 18).cpu("aten::mm", 30, 18)
    b.cpu("PP:3F0", 55, 10, cat="user_annotation").cpu("aten::mm", 55, 10)
    b.cpu("PP:(0F2;3B1)OVERLAP_F_B", 66, 30, cat="user_annotation").cpu("aten::mm", 66, 30)
    b.cpu("PP:0B0", 97, 20, cat="user_annotation")
    b.cpu("autograd::engine::evaluate_function: MmBackward0", 97, 20).cpu("aten::mm", 97, 20)
    one = _write(tmp_path / "one", [b], [PG_WORLD2])
    marks = summary_of(load_traces(one).ranks[0]).marks
    got = [(r.stage, r.phase, r.microbatch, r.start_us, r.end_us)
           for r in marks.chunks.itertuples()]
    assert got == [(0, "F", 0, 0.0, 10.0), (0, "F", 1, 20.0, 30.0), (3, "B", 0, 30.0, 48.0),
                   (3, "F", 0, 55.0, 65.0), (0, "F", 2, 66.0, 76.0), (3, "B", 1, 76.0, 96.0),
                   (0, "B", 0, 97.0, 117.0)]



def test_a_combined_device_range_leaves_out_the_wait_between_its_actions(tmp_path):
    """On the device, ``PP:(0F1;3B0)OVERLAP_F_B`` runs its forward's kernels [20,30), then its
    backward waits for the next stage's gradient (the receive's kernel spins until 45) and
    runs [45,65): the device idled 15 µs inside the open range, which is neither action's work
    (the pipeline's bubble). A combined range whose parts follow without a wait is split in
    proportion to the rank's own forward and backward ranges (10 and 20 µs)."""
    from pardiag.analyzer.per_rank.summary import summary_of

    b = TraceBuilder(rank=0, world_size=2)
    b.step(1, 0, 200)
    recv = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
    b.kernel("PP:0F0", 0, 10, cat="gpu_user_annotation").kernel("gemm_kernel", 0, 10)
    b.kernel("PP:(0F1;3B0)OVERLAP_F_B", 20, 45, cat="gpu_user_annotation")
    b.kernel("gemm_kernel", 20, 10).kernel(recv, 30, 15, stream=20).kernel("gemm_kernel", 45, 20)
    b.kernel("PP:(0F2;3B1)OVERLAP_F_B", 70, 30, cat="gpu_user_annotation")
    b.kernel("gemm_kernel", 70, 30)
    b.kernel("PP:0B0", 110, 20, cat="gpu_user_annotation").kernel("gemm_kernel", 110, 20)
    marks = summary_of(load_traces(_write(tmp_path, [b], [PG_WORLD2])).ranks[0]).marks
    assert marks.device_chunks
    got = [(r.stage, r.phase, r.microbatch, r.start_us, r.end_us)
           for r in marks.chunks.itertuples()]
    assert got == [(0, "F", 0, 0.0, 10.0), (0, "F", 1, 20.0, 30.0), (3, "B", 0, 45.0, 65.0),
                   (0, "F", 2, 70.0, 80.0), (3, "B", 1, 80.0, 100.0),
                   (0, "B", 0, 110.0, 130.0)]

#: torch's schedules beyond GPipe, 1F1B and Interleaved1F1B, run by train_pp.py under plain
#: torch.profiler: (--schedule, torch's class, the schedule the report must give: torch's name
#: only where what ran matches that schedule alone, else a description).
TORCH_RUNS = {
    "interleaved-zb": ("ScheduleInterleavedZeroBubble", "ScheduleInterleavedZeroBubble"),
    "looped-bfs": ("ScheduleLoopedBFS", "looped placement, 4 stages on 2 ranks, every forward "
                                        "before any backward"),
    "zbv": ("ScheduleZBVZeroBubble", "V placement, 4 stages on 2 ranks, split backward"),
    "dualpipev": ("ScheduleDualPipeV", "V placement, 4 stages on 2 ranks, split backward"),
}


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(TORCH_RUNS))
def test_torch_schedules_from_plain_traces(name, tmp_path):
    """Each rank's order of actions read from the trace is torch's own order of the schedule
    (combined actions as their two parts), every step; 4 microbatches; the ideal is the replay
    of that order, and the schedule is named only where what ran matches one."""
    from .test_schedule_replay import torch_order

    cls, schedule = TORCH_RUNS[name]
    out = tmp_path / name
    out.mkdir()
    torchrun = Path(sys.executable).parent / "torchrun"
    r = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2",
                        str(ROOT / "benchmarks" / "_plain_profiler.py"), "1", "1", "3", str(out),
                        str(ROOT / "examples" / "train_pp.py"), "--steps", "6", "--schedule",
                        name, "--microbatches", "4"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    rep = build_report(load_traces(out))
    j = report_json(rep)
    assert (j["layout"]["pipeline"]["schedule"], j["layout"]["pipeline"]["microbatches"]) == (
        schedule, 4)
    assert j["pipeline"]["schedule"]["ideal_from"] == "replay"
    want = torch_order(cls, 2, 4)
    chunks = rep.results["pipeline"].chunks
    steps = sorted(chunks["step"].unique())
    assert len(steps) == 3
    for (rank, _), g in chunks.groupby(["rank", "step"]):
        g = g.sort_values("start_us", kind="stable")
        assert list(zip(g["stage"], g["phase"], g["microbatch"])) == want[rank]
    assert all(0 <= b["ideal_pct"] < b["bubble_pct"] for b in j["pipeline"]["bubbles"])


def test_device_ranges_leave_out_the_receive_s_spin(tmp_path):
    """GPipe on two GPUs, one microbatch: each per-microbatch range on the device holds the
    receive kernel that spins until its input comes (and the send kernel after the work). The
    busy part runs from the end of that spin to the last computing kernel's end, so the bubbles
    are the schedule's: window [20, 690] = 670 µs; rank 0 busy 80 + 90 → 74.6%, rank 1 85 +
    190 → 59.0% (the ranges whole, window [20, 700], would give 14.7% and 33.8%)."""
    sendrecv = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"

    def rank(r):
        b = TraceBuilder(rank=r, world_size=2, backend="nccl", pid=100 + r, main_tid=100 + r)
        b.step(1, 0, 1000)
        return b

    def dev_range(b, name, ts, dur):
        b.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": 0,
                         "tid": 7, "ts": ts, "dur": dur})

    r0, r1 = rank(0), rank(1)
    # rank 0, stage 0: forward [20,100) then its send spins until rank 1 takes it; backward's
    # receive spins [400,600) for the gradient, then computes [600,690)
    r0.cpu("Forward 0", 1, 5, cat="user_annotation")
    _p2p(r0, "send", 1, 3)
    dev_range(r0, "Forward 0", 20, 280)
    r0.kernel("void gemm_kernel<float>(float*)", 20, 80, launch_ts=2)
    r0.kernel(sendrecv, 100, 200, stream=20, launch_ts=3)
    r0.cpu("Backward 0", 390, 5, cat="user_annotation")
    _p2p(r0, "recv", 1, 391)
    dev_range(r0, "Backward 0", 400, 300)
    r0.kernel(sendrecv, 400, 200, stream=20, launch_ts=391)
    r0.kernel("void gemm_kernel<float>(float*)", 600, 90, launch_ts=392)
    # rank 1, stage 1: its forward's receive spins [150,305), computes [310,390); backward
    # computes [400,590) and sends [590,600)
    r1.cpu("Forward 0", 140, 5, cat="user_annotation")
    _p2p(r1, "recv", 0, 141)
    dev_range(r1, "Forward 0", 150, 250)
    r1.kernel(sendrecv, 150, 155, stream=20, launch_ts=141)
    r1.kernel("void gemm_kernel<float>(float*)", 310, 80, launch_ts=142)
    r1.cpu("Backward 0", 395, 4, cat="user_annotation")
    _p2p(r1, "send", 0, 397)
    dev_range(r1, "Backward 0", 400, 200)
    r1.kernel("void gemm_kernel<float>(float*)", 400, 190, launch_ts=396)
    r1.kernel(sendrecv, 590, 10, stream=20, launch_ts=397)
    out = _write(tmp_path / "gpipe_gpu", [r0, r1], [PG_WORLD2, PG_WORLD2])
    rep = build_report(load_traces(out))
    pipe = rep.results["pipeline"]
    got = sorted((int(r.rank), r.phase, r.start_us, r.end_us) for r in pipe.chunks.itertuples())
    assert got == [(0, "B", 600.0, 690.0), (0, "F", 20.0, 100.0), (1, "B", 400.0, 590.0),
                   (1, "F", 305.0, 390.0)]
    b = pipe.bubbles.set_index("rank")
    assert b.loc[0, "window_us"] == 670.0
    assert b.loc[0, "bubble_pct"] == pytest.approx(100 * 500 / 670)
    assert b.loc[1, "bubble_pct"] == pytest.approx(100 * 395 / 670)


# -- expert parallelism folded into data parallelism -------------------------------------------

def _fold_rank(rank: int, descs: dict, dense: list[int], ep: list[int], edp: list[int]
               ) -> TraceBuilder:
    """A GPU rank of 8 (Megatron's MoE parallel folding: EP=4 carved out of DP=8): per step a
    routed all-to-all dispatch and combine on its expert-parallel group (split sizes that
    differ), the dense gradients' all-reduce on ``dense`` and the experts' on ``edp``.
    ``descs``: the description of each kind of group (``dense``, ``ep``, ``edp``)."""
    b = TraceBuilder(rank=rank, world_size=8, pid=100 + rank, main_tid=100 + rank)
    b.step(1, 0, 3000)
    t = 10.0

    def coll(op: str, ranks: list[int], kind: str, extra: dict) -> None:
        nonlocal t
        args = {"Collective name": op, "dtype": "BFloat16", "In msg nelems": 65536,
                "Out msg nelems": 65536, "Group size": len(ranks),
                "Process Group Name": kind, "Process Group Description": descs[kind],
                "Process Group Ranks": str(ranks), **extra}
        b.cpu(f"nccl:{op}", t - 5, 4, args=args)
        b.cpu("record_param_comms", t - 4, 2, args=args)
        kind_ = "SendRecv" if op == "all_to_all" else "AllReduce_Sum_bf16_RING_LL"
        b.kernel(f"ncclDevKernel_{kind_}(ncclDevKernelArgsStorage<4096ul>)", t, 80, stream=20,
                 launch_ts=t - 3, args=args)
        t += 90

    splits = {"In split size": "[100, 300, 50, 62]", "Out split size": "[80, 120, 200, 112]"}
    for _ in range(2):
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t, 200, launch_ts=t - 5)
        t += 210
        coll("all_to_all", ep, "ep", splits)
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t, 300, launch_ts=t - 5)
        t += 310
        coll("all_to_all", ep, "ep", splits)
    coll("all_reduce", dense, "dense", {})
    coll("all_reduce", edp, "edp", {})
    return b


@pytest.mark.parametrize("descs, dims, folded, unknown", [
    # Megatron's names: DATA_PARALLEL_GROUP spans the world, EP groups of 4 inside it
    ({"dense": "DATA_PARALLEL_GROUP", "ep": "EXPERT_MODEL_PARALLEL_GROUP",
      "edp": "EXPERT_DATA_PARALLEL_GROUP"}, {"dp": 8, "ep": 4}, {"ep": "dp"}, None),
    # DeepSpeed names no group: the all-to-alls' groups are expert parallel, the dense
    # gradients' all-reduce over the world holds them
    ({"dense": "undefined", "ep": "undefined", "edp": "undefined"},
     {"dp": 8, "ep": 4}, {"ep": "dp"}, None),
    # the expert-data groups described as data parallel: dp=2 by the names, the dense
    # gradients reduced over 8 ranks: dp is unknown, never a guess
    ({"dense": "undefined", "ep": "EXPERT_MODEL_PARALLEL_GROUP",
      "edp": "DATA_PARALLEL_GROUP"}, {"ep": 4}, {}, "but dp=2 by the groups' descriptions"),
])
def test_expert_parallelism_folded_into_data_parallelism(tmp_path, descs, dims, folded, unknown):
    """EP=4 carved out of DP=8 (expert-data-parallel groups of 2): dp is the dense gradients'
    group (8), not what the world leaves over ep (2); the layout is valid though dp × ep is not
    the world, the expert-data groups are named ``edp``; when the descriptions contradict the
    reductions, dp is unknown and the line names both."""
    ranks, pgs = [], []
    for r in range(8):
        world, ep, edp = list(range(8)), [r // 4 * 4 + i for i in range(4)], [r % 4, r % 4 + 4]
        ranks.append(_fold_rank(r, descs, world, ep, edp))
        pgs.append([{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 8, "ranks": world},
                    {"pg_name": "dense", "pg_desc": descs["dense"], "pg_size": 8, "ranks": world},
                    {"pg_name": "ep", "pg_desc": descs["ep"], "pg_size": 4, "ranks": ep},
                    {"pg_name": "edp", "pg_desc": descs["edp"], "pg_size": 2, "ranks": edp}])
    from pardiag.analyzer.analyses.comm_events import comm_events

    traces = load_traces(_write(tmp_path, ranks, pgs))
    lay = infer_layout(traces, comm_events(traces))
    assert lay.dims == dims and lay.folded == folded, (lay.dims, lay.evidence, lay.not_inferred)
    assert "ep" in lay.strategies
    said = [ln for ln in lay.not_inferred if "folded into data parallelism is unknown" in ln]
    assert (said and unknown in said[0]) if unknown else not said, lay.not_inferred
    j = report_json(build_report(traces))
    assert j["layout"]["dims"] == dims and j["layout"]["folded"] == folded
    if folded:
        line = next(ln for ln in lay.evidence if "is folded" in ln)
        assert "ep=4 is folded into data parallelism (expert-data-parallel groups of 2: " \
               "[0, 4], [1, 5], [2, 6], [3, 7])" in line, line
        from pardiag.analyzer.analyses.layout import dims_text

        assert dims_text(j["layout"]["dims"], j["layout"]["folded"]) == "DP=8, EP=4 folded into DP"
        by_ranks = {tuple(g["ranks"]): g["dim"] for g in j["layout"]["groups"]}
        assert by_ranks[(0, 4)] == by_ranks[(3, 7)] == "edp"
        assert by_ranks[(0, 1, 2, 3)] == "ep"



@pytest.mark.parametrize("descs, dense_elems, dims, folded", [
    # Megatron: the expert-parallel group is the data-parallel group, both described
    ({"dense": "DATA_PARALLEL_GROUP", "ep": "EXPERT_MODEL_PARALLEL_GROUP"}, 65536,
     {"dp": 8, "ep": 8}, {"ep": "dp"}),
    # one group of all ranks runs the routed all-to-alls and the dense gradients' all-reduce
    ({"dense": "default_pg", "ep": "default_pg"}, 65536, {"dp": 8, "ep": 8}, {"ep": "dp"}),
    # only a loss's all-reduce (one float) over it: no gradients, no data parallelism shown
    ({"dense": "default_pg", "ep": "default_pg"}, 1, {"ep": 8}, {}),
])
def test_expert_parallelism_over_the_data_parallel_group_itself(tmp_path, descs, dense_elems,
                                                               dims, folded):
    """EP=8 on 8 ranks whose dense gradients are all-reduced over the same 8 ranks (Megatron's
    folding with EP = DP: each expert held once, no expert-data-parallel groups): dp=8 and
    ep=8 over one set of ranks, folded; a same-ranks group described as data parallel is that
    dimension too, not a product of the expert-parallel one. A scalar all-reduce shows no
    gradients: ep=8 alone."""
    world = list(range(8))
    ranks, pgs = [], []
    for r in world:
        b = TraceBuilder(rank=r, world_size=8, pid=100 + r, main_tid=100 + r)
        b.step(1, 0, 3000)
        t = 10.0
        for kind, op, n, extra in (
                ("ep", "all_to_all", 65536, {"In split size": "[100, 300, 50, 62, 1, 2, 3, 4]",
                                             "Out split size": "[80, 120, 200, 112, 4, 3, 2, 1]"}),
                ("ep", "all_to_all", 65536, {"In split size": "[9, 300, 50, 62, 1, 2, 3, 4]",
                                             "Out split size": "[8, 120, 200, 112, 4, 3, 2, 1]"}),
                ("dense", "all_reduce", dense_elems, {})):
            b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t, 200, launch_ts=t - 5)
            t += 210
            args = {"Collective name": op, "dtype": "BFloat16", "In msg nelems": n,
                    "Out msg nelems": n, "Group size": 8, "Process Group Name": descs[kind],
                    "Process Group Description": descs[kind], "Process Group Ranks": str(world),
                    **extra}
            b.cpu(f"nccl:{op}", t - 5, 4, args=args).cpu("record_param_comms", t - 4, 2,
                                                           args=args)
            k = "SendRecv" if op == "all_to_all" else "AllReduce_Sum_bf16_RING_LL"
            b.kernel(f"ncclDevKernel_{k}(ncclDevKernelArgsStorage<4096ul>)", t, 80, stream=20,
                     launch_ts=t - 3, args=args)
            t += 90
        ranks.append(b)
        pgs.append([{"pg_name": d, "pg_desc": d, "pg_size": 8, "ranks": world}
                    for d in sorted(set(descs.values()))])
    from pardiag.analyzer.analyses.comm_events import comm_events

    traces = load_traces(_write(tmp_path, ranks, pgs))
    lay = infer_layout(traces, comm_events(traces))
    assert lay.dims == dims and lay.folded == folded, (lay.dims, lay.evidence, lay.not_inferred)
    assert not [ln for ln in lay.not_inferred if "product" in ln], lay.not_inferred
    if folded:
        line = next(ln for ln in lay.evidence if "is folded" in ln)
        assert "each an expert-parallel group itself: ep=8 is folded into data parallelism " \
               "over the same ranks" in line, line

@pytest.mark.e2e
def test_moe_folded_into_dp_profiled_and_plain(tmp_path):
    """train_moe.py --ep 2 on 4 ranks: EP groups [0, 1], [2, 3] carved out of data parallelism
    over all four (the dense gradients' all-reduce on the world, the experts' on [0, 2],
    [1, 3]). Profiled, pardiag's records of each collective's group give dp=4, ep=2, folded,
    the expert-data groups named edp. Its plain gloo trace names no collective's group: ep=2
    from the mesh's descriptions and dp unknown, never the 2 the world leaves over ep."""
    out = tmp_path / "prof"
    r = subprocess.run([sys.executable, "-m", "pardiag", "profile", "--nproc-per-node", "4",
                        "--out", str(out), str(ROOT / "examples" / "train_moe.py"), "--",
                        "--steps", "6", "--ep", "2"], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    lay = report_json(build_report(load_traces(out)))["layout"]
    assert (lay["source"], lay["dims"], lay["folded"]) == ("recorded", {"dp": 4, "ep": 2},
                                                          {"ep": "dp"})
    dims = {tuple(g["ranks"]): g["dim"] for g in lay["groups"]}
    assert dims == {(0, 1, 2, 3): "dp", (0, 1): "ep", (2, 3): "ep", (0, 2): "edp",
                    (1, 3): "edp"}, lay["groups"]
    plain = tmp_path / "plain"
    plain.mkdir()
    torchrun = Path(sys.executable).parent / "torchrun"
    r = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "4",
                        str(ROOT / "benchmarks" / "_plain_profiler.py"), "1", "1", "3",
                        str(plain), str(ROOT / "examples" / "train_moe.py"), "--steps", "6",
                        "--ep", "2"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    lay = report_json(build_report(load_traces(plain)))["layout"]
    assert (lay["source"], lay["dims"], lay["folded"]) == (INFERRED_SOURCE, {"ep": 2}, {})
    assert any(ln.startswith("dp: unknown; 2 if expert parallelism is a mesh dimension of its "
                             "own (dp × ep = 4 ranks), up to 4 if it is folded")
               for ln in lay["not_inferred"]), lay["not_inferred"]


# -- point-to-point messages: a pipeline's, or ring attention's -----------------------------------

def _ring_rank(rank: int, near: str, named: str | None, ranges: bool) -> TraceBuilder:
    """A gloo rank of 4 running context parallelism's ring attention for 2 steps: per layer
    3 rounds of ``near`` (a compute op), then a send of its key/value shard to the next rank
    and a receive from the previous one (``named``: a range around each round's exchange);
    ``ranges``: per-microbatch pipeline ranges around each step's work as well."""
    b = _rank(rank, world=4)
    t = 0.0
    for step in (1, 2):
        b.step(step, t, 2000)
        if ranges:
            b.cpu(f"PP:{rank}F0", t + 1, 1500, cat="user_annotation")
        t += 10
        for _ in range(2):   # layers
            for _ in range(3):   # ring rounds: compute on the block held, pass it on
                b.cpu(near, t, 100)
                t += 105
                if named:
                    b.cpu(named, t, 12, cat="user_annotation")
                _p2p(b, "send", (rank + 1) % 4, t + 1)
                _p2p(b, "recv", (rank - 1) % 4, t + 5, wait=4)
                t += 15
        t = step * 2000.0
    return b


@pytest.mark.parametrize("desc, near, named, ranges, dims, strategies, unknown", [
    # Megatron's context-parallel group, attention around the messages
    ("CONTEXT_PARALLEL_GROUP", "aten::_scaled_dot_product_flash_attention_for_cpu", None,
     False, {"cp": 4}, ["cp"], False),
    # no group names anything; TransformerEngine's exchange names itself
    ("undefined", "aten::addmm", "flash_attn_p2p_communicate", False, {"cp": 4}, ["cp"], False),
    # attention around the messages, and per-microbatch pipeline ranges: unknown
    ("undefined", "aten::_scaled_dot_product_flash_attention_for_cpu", None, True, {}, [],
     True),
    # nothing speaks for a ring: send/recv between ranks is read as a pipeline
    ("undefined", "aten::addmm", None, False, {"pp": 4}, ["pipeline"], False),
])
def test_ring_attention_messages_are_no_pipeline(tmp_path, desc, near, named, ranges, dims,
                                                 strategies, unknown):
    """Sends and receives around a ring of 4 ranks (each to the next, from the previous):
    context parallelism's ring attention when a context-parallel group, a named exchange or
    attention around the messages says so (cp=4, no pipeline, no bubble); unknown, with both
    named, when per-microbatch pipeline ranges say otherwise; a pipeline when nothing does."""
    ranks = [_ring_rank(r, near, named, ranges) for r in range(4)]
    pgs = [[{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
            {"pg_name": "1", "pg_desc": desc, "pg_size": 4, "ranks": [0, 1, 2, 3]}]] * 4
    traces = load_traces(_write(tmp_path, ranks, pgs))
    j = report_json(build_report(traces))
    lay = j["layout"]
    assert lay["dims"] == dims and lay["strategies"] == strategies, (lay["evidence"],
                                                                    lay["not_inferred"])
    said = [ln for ln in lay["not_inferred"] if "point-to-point messages among ranks" in ln]
    assert bool(said) == unknown, lay["not_inferred"]
    if unknown:   # neither: no pipeline section either
        assert "ring attention by" in said[0] and "a pipeline by per-microbatch ranges" in said[0]
        assert j["pipeline"] is None and "pipeline bubble" not in j["verdict"]
    if "cp" in dims:
        assert lay["pipeline"] is None and j["pipeline"] is None
        assert "pipeline bubble" not in j["verdict"]
        line = next(ln for ln in lay["evidence"] if ln.startswith("cp: "))
        assert "ring attention, not a pipeline" in line


# -- what functional collectives carry: tensor parallelism's activations, or FSDP's parameters --

_FN = {"ag": "_c10d_functional::all_gather_into_tensor",
       "rs": "_c10d_functional::reduce_scatter_tensor", "ar": "_c10d_functional::all_reduce"}


def _functional_rank(rank: int, order: str) -> TraceBuilder:
    """A gloo rank of 4 running, in each of 3 steps, the functional collectives ``order``
    spells (``ag``, ``rs``, ``ar``: 64 KiB each, then a wait), each followed by a matmul;
    ``ar!`` issues its all-reduce inside a compiled graph's backward
    (``CompiledFunctionBackward``)."""
    b = _rank(rank, world=4)
    b.thread_name(2, "thread 2 (pt_gloo_runloop)")
    gloo = {"ag": "gloo:all_gather", "rs": "gloo:reduce_scatter", "ar": "gloo:all_reduce"}
    for step in (1, 2, 3):
        t = step * 1000.0
        b.step(step, t, 1000)
        t += 10
        for op in order.split():
            if op.endswith("!"):
                op = op[:-1]
                b.cpu("CompiledFunctionBackward", t - 1, 18)
            b.cpu(_FN[op], t, 5, args={"Input Dims": [[128, 128], [], []],
                                      "Input type": ["float", "", ""]})
            b.cpu(gloo[op], t + 1, 10, tid=2, cat="user_annotation",
                  args={"Input Dims": [[128, 128]], "Input type": ["float"]})
            b.cpu("_c10d_functional::wait_tensor", t + 6, 10)
            b.cpu("aten::mm", t + 20, 30)
            t += 60
    return b


@pytest.mark.parametrize("order, dims, strategies, unknown", [
    # SimpleFSDP / compiled FSDP: 3 units gathered for the forward, then the backward's
    # gathers and reduce-scatters
    ("ag ag ag ag rs ag rs ag rs", {"dp": 4}, ["fsdp"], False),
    # sequence parallelism: gather before each block, scatter after it
    ("ag rs ag rs ag rs ag rs", {"tp": 4}, ["tp"], False),
    # all-reduces of activations: tensor parallelism
    ("ar ar ar ar", {"tp": 4}, ["tp"], False),
    # all-reduces issued only in the backward: gradients (DDP under compiled autograd) ...
    ("ar! ar!", {"dp": 4}, ["ddp"], False),
    # ... but tensor parallelism's, in the forward as well
    ("ar ar ar! ar!", {"tp": 4}, ["tp"], False),
    # one gather, one scatter: either
    ("ag rs", {}, [], True),
])
def test_functional_collectives_are_named_by_their_order(tmp_path, order, dims, strategies,
                                                         unknown):
    """Functional collectives on the default group of 4 ranks, no wrapper's range: FSDP when
    every step opens with several all-gathers before a reduce-scatter (torch.compile'd FSDP,
    SimpleFSDP: it was read as tp=4), tensor parallelism when all-reduces move activations or
    gathers and scatters alternate, unknown when the order fits both."""
    traces = load_traces(_write(tmp_path, [_functional_rank(r, order) for r in range(4)],
                                [[{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4,
                                   "ranks": [0, 1, 2, 3]}]] * 4))
    lay = report_json(build_report(traces))["layout"]
    assert (lay["dims"], lay["strategies"]) == (dims, strategies), (lay["evidence"],
                                                                   lay["not_inferred"])
    said = [ln for ln in lay["not_inferred"] if "functional collectives carry is unknown" in ln]
    assert bool(said) == unknown, lay["not_inferred"]
    if strategies == ["fsdp"]:
        line = next(ln for ln in lay["evidence"] if ln.startswith("fsdp: "))
        assert "opens with 4 or more all-gathers before its first reduce-scatter" in line


def test_functional_roles_per_group_and_mixed():
    """SimpleFSDP × TP, both through functional collectives: per named group, FSDP's order on
    the dp group and activations' all-reduces on the tp group; where no group is named, the
    same mix is unknown (sequence parallelism's scatters come before FSDP's gathers end, and
    all-reduces of unknown size may be tensor parallelism's)."""
    import pandas as pd

    from pardiag.analyzer.analyses.op_roles import functional_role as _functional_role
    from pardiag.analyzer.analyses.op_roles import functional_roles as _functional_roles

    def ev(rows):
        return pd.DataFrame([{"rank": r, "step": s, "op": op, "bytes": n, "functional": True,
                              "group": g, "start_us": float(i)}
                             for r in (0, 1) for s in (1, 2)
                             for i, (g, op, n) in enumerate(rows)])

    fsdp = [("0,2|", "all_gather", 4096)] * 3 + [("0,2|", "reduce_scatter", 4096),
                                                 ("0,2|", "all_gather", 4096),
                                                 ("0,2|", "reduce_scatter", 4096),
                                                 ("0,2|", "reduce_scatter", 4096)]
    tp = [("0,1|", "all_reduce", 65536)] * 4
    roles = _functional_roles(ev(fsdp + tp))
    assert {g: r for g, (r, _) in roles.items()} == {"0,2|": "fsdp", "0,1|": "tp"}
    # unnamed groups: FSDP's gathers with sequence parallelism's gather/scatter pairs mixed in
    sp = [("", "all_gather", 4096), ("", "all_gather", 4096), ("", "reduce_scatter", 4096),
          ("", "all_gather", 4096), ("", "reduce_scatter", 4096), ("", "reduce_scatter", 4096)]
    assert _functional_role(ev(sp))[0] is None
    # FSDP's order beside all-reduces of unknown size: unknown, not fsdp
    unsized = [(g.replace("0,2|", ""), op, n) for g, op, n in fsdp] + [("", "all_reduce",
                                                                        float("nan"))]
    role, line = _functional_role(ev(unsized))
    assert role is None and "all-reduces of unknown size" in line
    assert _functional_role(ev([(g.replace("0,2|", ""), op, n) for g, op, n in fsdp]))[0] == \
        "fsdp"
    # functional all-to-alls alone (xDiT's Ulysses) say nothing of tensor parallelism, and a
    # trace without profiler steps (inference) is read as one step, not taken for tp
    a2a = [("", "all_to_all", 9437184)] * 4 + [("", "all_reduce", 4)]
    assert _functional_role(ev(a2a)) == ("", "") and _functional_roles(ev(a2a)) == {}
    no_steps = ev([("", "all_gather", 9437184)] * 2).assign(step=-1)
    role, line = _functional_role(no_steps)
    assert role is None and "all-gathers without reduce-scatters" in line


#: The sequence-sharded examples' small job: 4 ranks as 2 replicas of a group of 2.
SEQ_SHARDED_ARGS = ["--steps", "6", "--dp", "2", "--width", "64", "--layers", "2", "--batch",
                    "8"]


def _profiled_and_plain(tmp_path: Path, example: str, args: list[str]) -> tuple[Path, Path]:
    """``examples/<example>`` on 4 ranks under ``pardiag profile`` and under plain
    torch.profiler (``benchmarks/_plain_profiler.py``); returns the two run folders."""
    script = str(ROOT / "examples" / example)
    prof, plain = tmp_path / "prof", tmp_path / "plain"
    r = subprocess.run([sys.executable, "-m", "pardiag", "profile", "--nproc-per-node", "4",
                        "--out", str(prof), script, "--", *args], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    plain.mkdir()
    r = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone",
                        "--nproc-per-node", "4", str(ROOT / "benchmarks" / "_plain_profiler.py"),
                        "1", "1", "3", str(plain), script, *args], capture_output=True,
                       text=True, timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    return prof, plain


@pytest.mark.e2e
def test_context_parallel_ring_is_no_pipeline_profiled_and_plain(tmp_path):
    """train_cp.py --dp 2 on 4 ranks: ring attention's keys and values go around each cp group
    with isend/irecv. Profiled and under plain torch.profiler, the layout is dp=2 × cp=2 with cp
    among the strategies, and no pipeline, bubble or schedule comes of the sends and receives
    (before, they made a pipeline)."""
    prof, plain = _profiled_and_plain(tmp_path, "train_cp.py", SEQ_SHARDED_ARGS)
    for folder, source in ((prof, "recorded"), (plain, INFERRED_SOURCE)):
        j = report_json(build_report(load_traces(folder)))
        lay = j["layout"]
        assert (lay["source"], lay["dims"], lay["strategies"]) == (source, {"dp": 2, "cp": 2},
                                                                   ["cp"])
        assert lay["pipeline"] is None and j["pipeline"] is None
        assert "pipeline" not in j["verdict"]
    assert any("ring attention, not a pipeline (" in ln and "named as ring attention" in ln
               for ln in lay["evidence"]), lay["evidence"]


RING_CHECK = """
import os, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import train_cp
dist.init_process_group("gloo")
r, n = dist.get_rank(), dist.get_world_size()
g = dist.new_group(list(range(n)))
torch.manual_seed(0)
Q, K, V = (torch.randn(2, 4 * n, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
sl = slice(4 * r, 4 * r + 4)
q, k, v = (t.detach()[:, sl].clone().requires_grad_() for t in (Q, K, V))
s, v_all = train_cp.RingScores.apply(q, k, v, g)
out = torch.softmax(s, -1) @ v_all
w = [torch.randn(2, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
     for i in range(n)]
(out * w[r]).sum().backward()
ref = torch.softmax(Q @ K.transpose(-1, -2) / 8 ** 0.5, -1) @ V
(ref * torch.cat(w, 1)).sum().backward()
ok = all(torch.allclose(a, b[:, sl]) for a, b in ((out, ref), (q.grad, Q.grad),
                                                   (k.grad, K.grad), (v.grad, V.grad)))
print(f"rank {r}: {'equal' if ok else 'DIFFERENT'}", flush=True)
os._exit(0)
"""


@pytest.mark.e2e
def test_the_examples_ring_attention_is_attention(tmp_path):
    """train_cp.py's ring attention on 4 gloo ranks, each holding 4 of 16 tokens: its output
    and its query, key and value gradients equal full attention's over the whole sequence
    (float64), so the example's messages are those of a correct ring."""
    script = tmp_path / "ring_check.py"
    script.write_text(RING_CHECK)
    r = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone",
                        "--nproc-per-node", "4", str(script), str(ROOT / "examples")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    # the ranks' lines can interleave on torchrun's one output: read each verdict wherever it is
    import re

    assert sorted(re.findall(r"rank (\d): (equal|DIFFERENT)", r.stdout)) == [
        (str(i), "equal") for i in range(4)], r.stdout + r.stderr[-2000:]


@pytest.mark.e2e
def test_ulysses_all_to_alls_are_no_expert_parallelism_profiled_and_plain(tmp_path):
    """train_ulysses.py --dp 2 on 4 ranks: all-to-alls around attention swap sequence and head
    shards in groups [0, 1] and [2, 3] that nothing names. Profiled, the rank's own trace weighs
    what they carry: cp=2, never expert parallelism (before, any all-to-all on an unnamed group
    was ep, and the world's gradient all-reduce then folded it into dp); the two cp groups'
    gradients are all-reduced over the world, so they are dp=2 replicas. The plain trace names
    no group: cp without a degree, no ep, no routing analysis, no pipeline."""
    prof, plain = _profiled_and_plain(tmp_path, "train_ulysses.py", SEQ_SHARDED_ARGS)
    p, q = (report_json(build_report(load_traces(f))) for f in (prof, plain))
    assert (p["layout"]["dims"], p["layout"]["strategies"], p["layout"]["folded"]) == (
        {"cp": 2, "dp": 2}, ["cp"], {})
    assert {tuple(g["ranks"]): g["dim"] for g in p["layout"]["groups"] if g["dim"]} == {
        (0, 1): "cp", (2, 3): "cp"}
    assert (q["layout"]["dims"], q["layout"]["strategies"]) == ({}, ["cp"])
    assert any(ln.startswith("cp: degree unknown") for ln in q["layout"]["not_inferred"])
    for rep in (p, q):
        assert not (rep["routing"]["groups"] or rep["routing"]["instances"])
        assert rep["pipeline"] is None


def test_a_records_rank_is_the_peer_of_a_send_without_dst_rank():
    """Older ``record_param_comms`` of a send or recv carry no ``Dst Rank``/``Src Rank``; their
    ``Rank`` is the peer's rank in the group (as the matching reads it,
    :func:`pardiag.analyzer.per_rank.comm_events._p2p_peer`). The layout's pipeline marks read
    it the same way; a newer record's ``Dst Rank`` (global) still wins."""
    from pardiag.analyzer.per_rank.layout_marks import _peer

    old = {"Collective name": "send", "Group size": 4, "Rank": 2}
    assert _peer("send", old) == 2 and _peer("recv", {**old, "Collective name": "recv"}) == 2
    assert _peer("send", {**old, "Rank": 4}) == -1          # no rank of a group of 4
    new = {**old, "Dst Rank": 7, "Process Group Ranks": "[4, 5, 6, 7]"}
    assert _peer("send", new) == 3
    assert _peer("all_reduce", {"Group size": 4, "Rank": 2}) == -1


def test_one_reader_gives_the_matching_and_the_layout_the_same_peer():
    """The matching (global ranks) and the layout's pipeline marks (ranks in the group) read a
    transfer's peer with one reader: a record that names its peer only as ``Peer`` gives both
    the same rank; ``Concrete Inputs[2]`` is a peer only on a ``c10d::send``/``recv_`` call,
    where torch puts it, and never on a ``record_param_comms`` (whose third scalar is its
    process group)."""
    from pardiag.analyzer.per_rank.comm_events import _p2p_peer, p2p_peer
    from pardiag.analyzer.per_rank.layout_marks import _peer

    members = [4, 5, 6, 7]
    peer_only = {"Collective name": "send", "Peer": 1,
                 "Process Group Ranks": "[4, 5, 6, 7]"}
    assert p2p_peer("send", peer_only, members) == (1, 5)
    assert _p2p_peer("send", peer_only, members) == 5 and _peer("send", peer_only) == 1
    rpc = {"Collective name": "send", "Concrete Inputs": ["", "7", "2", ""], "Group size": 4,
           "Rank": 3}
    assert _peer("send", rpc) == 3 and _peer("send", rpc, c10d_call=True) == 2
    assert p2p_peer("send", rpc, members, c10d_call=True) == (2, 6)
    assert p2p_peer("send", {"Dst Rank": 9}, members) == (None, 9)   # outside the group named
    assert p2p_peer("all_reduce", peer_only, members) == (None, None)


def test_megatron_pipeline_with_data_parallel_pairs_reads_its_own_groups(tmp_path):
    """Megatron, pp 4 × dp 2 on 8 ranks, tensor parallelism 1: MODEL_PARALLEL_GROUP (tp × pp)
    then has the pipeline group's ranks, and is their product, not tensor parallelism of 4.
    The sends name their peers' global ranks (``Dst Rank``/``Src Rank``) and their group (a
    pipeline group of 4 of the 8 ranks, one of several groups each rank holds): two
    pipelines, 0-2-4-6 and 1-3-5-7, not one of 8."""
    ranks = list(range(8))
    pipes = [[0, 2, 4, 6], [1, 3, 5, 7]]
    builders, configs = [], []
    for r in ranks:
        stage, pipe = r // 2, pipes[r % 2]
        pgc = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 8, "ranks": ranks},
               {"pg_name": "1", "pg_desc": "DATA_PARALLEL_GROUP", "pg_size": 2,
                "ranks": [r - r % 2, r - r % 2 + 1]},
               {"pg_name": "9", "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP", "pg_size": 1,
                "ranks": [r]},
               {"pg_name": "17", "pg_desc": "MODEL_PARALLEL_GROUP", "pg_size": 4,
                "ranks": pipe},
               {"pg_name": "19", "pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP", "pg_size": 4,
                "ranks": pipe}]
        b = TraceBuilder(rank=r, world_size=8)
        b.step(1, 0, 1000)
        b.kernel("volta_sgemm_128x64_nn", stage * 100, 90, launch_ts=stage * 100)

        def p2p(op, peer, t, b=b, pipe=pipe):
            args = {"Collective name": op, "dtype": "BFloat16", "In msg nelems": 1024,
                    "Out msg nelems": 1024, "Group size": 4, "Process Group Name": "19",
                    "Process Group Description": "PIPELINE_MODEL_PARALLEL_GROUP",
                    "Process Group Ranks": str(pipe), "Rank": pipe.index(peer),
                    ("Dst Rank" if op == "send" else "Src Rank"): peer}
            b.cpu("record_param_comms", t - 3, 2, args=args)
            b.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", t, 10,
                     stream=28, launch_ts=t - 2, args=args)

        if stage < 3:
            p2p("send", r + 2, stage * 100 + 90)
        if stage > 0:
            p2p("recv", r - 2, stage * 100 - 10)
        builders.append(b)
        configs.append(pgc)
    lay = infer_layout(load_traces(_write(tmp_path, builders, configs)))
    assert lay.dims == {"dp": 2, "pp": 4}
    assert "tp" not in lay.strategies
    assert (lay.pipeline["pp_group_size"], lay.pipeline["stage_ranks"]) == (
        4, {0: 0, 1: 2, 2: 4, 3: 6})
    assert any("MODEL_PARALLEL_GROUP (4 ranks) is the product of PIPELINE_MODEL_PARALLEL_GROUP"
               in n for n in lay.not_inferred)


def _hsdp_events(shard: int, replica: int, tp: int = 1) -> tuple[pd.DataFrame, dict]:
    """Communication events of HSDP over ``shard × replica`` ranks (× ``tp``, tensor parallel
    innermost): each shard group all-gathers and reduce-scatters 8 MiB, each replica group
    all-reduces 4 MiB, each tp group all-reduces 8 MiB, and every group all-reduces a 4-byte
    loss; with the ``member`` map the mesh gives (dp: the replica group, tp: the tp group)."""
    rows, member = [], {}
    world = shard * replica * tp
    for r in range(world):
        t, d = r % tp, r // tp
        sg = [tp * (shard * (d // shard) + i) + t for i in range(shard)]
        rg = [tp * (d % shard + shard * j) + t for j in range(replica)]
        tg = [tp * d + i for i in range(tp)]
        member[r] = {"dp": rg, **({"tp": tg} if tp > 1 else {})}
        for ranks, op, size in ((sg, "all_gather", 8 << 20), (sg, "reduce_scatter", 8 << 20),
                                (sg, "all_reduce", 4), (rg, "all_reduce", 4 << 20),
                                (tg, "all_reduce", 8 << 20)):
            if len(ranks) > 1:
                rows.append({"rank": r, "group": ",".join(map(str, ranks)), "op": op,
                             "bytes": size})
    return pd.DataFrame(rows), member


@pytest.mark.parametrize("shard,replica,tp", [(2, 2, 1), (4, 2, 1), (2, 4, 2)])
def test_hybrid_sharding_is_told_by_the_groups_each_op_runs_over(shard, replica, tp):
    ev, member = _hsdp_events(shard, replica, tp)
    line = hybrid_sharding(ev, member, shard * replica)
    world = shard * replica * tp
    assert line == (f"hybrid sharding (HSDP): parameters all-gathered and gradients "
                    f"reduce-scattered over {world // shard} groups of {shard} ranks, gradients "
                    f"all-reduced over {world // replica} groups of {replica}: sharded {shard} "
                    f"ways, replicated {replica} ways")
    # plain FSDP over every dp rank (one shard group, no replica all-reduce): not hybrid
    plain = ev[~((ev["op"] == "all_reduce") & (ev["bytes"] == 4 << 20))]
    assert hybrid_sharding(plain, member, shard * replica) is None
    # the degrees must multiply to dp
    assert hybrid_sharding(ev, member, 2 * shard * replica) is None


def test_a_coalesced_ring_exchange_beside_attention_kernels_is_no_pipeline(tmp_path):
    """Inference with ring attention (yunchang's USP): each round's exchange is a
    ``batch_isend_irecv`` (``nccl:send`` and ``nccl:recv`` records naming the next and the
    previous rank, then ``nccl:coalesced``
    launching one SendRecv kernel with no metadata) beside flash-attn's kernels, which its
    extension launches with no host op. The device's SendRecv kernels, each next to attention,
    are the messages read: context parallelism, no pipeline and no bubble."""
    for r in range(4):
        b = TraceBuilder(rank=r, world_size=4)
        b.step(1, 0, 2000)
        t = 10.0
        for _ in range(6):
            b.kernel("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Params)",
                     t, 100, stream=7, launch_ts=t - 5)
            for op, peer, at in (("send", (r + 1) % 4, 101), ("recv", (r - 1) % 4, 103)):
                b.cpu(f"nccl:{op}", t + at, 2)
                b.cpu("record_param_comms", t + at + 0.5, 1, args={
                    "Collective name": op, "Process Group Ranks": "[0, 1, 2, 3]",
                    "Group size": 4, "Rank": peer, "In msg nelems": 1 << 20,
                    "dtype": "BFloat16"})
            b.cpu("nccl:coalesced", t + 105, 5)
            b.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", t + 110, 20,
                     stream=20, launch_ts=t + 106)
            t += 140
        b.write(tmp_path / f"rank{r}.json")
    j = report_json(build_report(load_traces(tmp_path)))
    lay = j["layout"]
    assert "pp" not in lay["dims"] and "pipeline" not in lay["strategies"], lay
    assert j["pipeline"] is None and "pipeline bubble" not in j["verdict"]
    assert any("24 of 24 sends and receives next to attention" in ln
               for ln in lay["evidence"] + lay["not_inferred"]), lay
