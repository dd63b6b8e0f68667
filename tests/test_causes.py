"""Why a rank is slow or idle: host parts, device idle, straggler cause, input-bound.

Planted synthetic traces with exact answers; the real DLRM trace (host-bound, rank 7 late at
step entry); one profiled run with a slow DataLoader on one rank."""

import re
import subprocess
import sys

import pandas as pd
import pytest

from pardiag.analyzer.analyses.causes import (
    CausesResult,
    compute_causes,
    excess_table,
    straggler_cause,
)
from pardiag.analyzer.per_rank.causes import DEVICE_PARTS, HOST_PARTS, causes_of_trace
from pardiag.analyzer.report.registry import build_report, report_json
from pardiag.analyzer.trace import load_traces

from .paths import REPO
from .synth import TraceBuilder


def _cpu_planted(rank=0, data_ms=100.0) -> TraceBuilder:
    """One step [0, 1000) µs with every host part planted (answers in the test)."""
    b = TraceBuilder(rank=rank, backend="gloo")
    b.thread_name(1, "thread 1 (python3)").thread_name(2, "thread 2 (pt_gloo_runloop)")
    b.step(1, 0, 1000)
    b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, data_ms,
          cat="user_annotation")
    b.cpu("aten::randn", 10, 20)                                   # inside data loading
    b.cpu("DistributedDataParallel.forward", 100, 200, cat="user_annotation")
    b.cpu("aten::addmm", 110, 90)
    b.cpu("cudaLaunchKernel", 200, 10, cat="cuda_runtime")       # launch 10
    b.cpu("aten::_local_scalar_dense", 250, 20)                   # .item(): sync 20
    b.cpu("autograd::engine::evaluate_function: AddmmBackward0", 300, 200)
    b.cpu("c10d::allreduce_", 450, 10)                            # comm 10
    b.cpu("Optimizer.step#Adam.step", 600, 200, cat="user_annotation")
    b.cpu("aten::add_", 610, 90)
    b.cpu("c10d::wait", 800, 50)                                  # a comm wait: comm 50
    b.cpu("gloo:all_reduce", 900, 50, tid=2, cat="user_annotation")  # waited for: comm 50
    return b


def test_host_parts_of_a_planted_cpu_step(tmp_path):
    _cpu_planted().write(tmp_path / "rank0.json")
    t = causes_of_trace(load_traces(tmp_path).ranks[0])
    row = t.iloc[0]
    got = {p: float(row[p]) for p in HOST_PARTS}
    # the forward annotation [100, 300) holds addmm (90), a launch and a sync: its other 80 µs
    # are outside any operator (a sleep in a module's forward is not its operators' time)
    assert got == {"data_loading_us": 100.0, "sync_us": 20.0, "comm_us": 110.0,
                   "launch_us": 10.0, "optimizer_us": 200.0, "backward_us": 190.0,
                   "forward_us": 90.0, "other_us": 280.0}
    assert sum(got.values()) == row["span_us"] == 1000.0
    assert t[list(DEVICE_PARTS)].isna().all().all()   # a CPU trace has no device parts


def test_device_idle_of_a_planted_gpu_step(tmp_path):
    b = TraceBuilder(rank=0)
    b.step(1, 0, 1000)
    b.kernel("void gemm_kernel<float>(float*)", 100, 200, launch_ts=50)
    b.cpu("cudaStreamSynchronize", 300, 30, cat="cuda_runtime")
    b.kernel("void relu_kernel(float*)", 400, 100, launch_ts=350)   # gap [300,400): not queued
    b.kernel("void relu_kernel(float*)", 550, 50, launch_ts=420)    # gap [500,550): queued
    b.kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", 600, 200, stream=20,
             launch_ts=590)
    b.kernel("Memcpy DtoH (Device -> Pinned)", 800, 50, stream=9, launch_ts=795,
             cat="gpu_memcpy")
    b.write(tmp_path / "rank0.json")
    row = causes_of_trace(load_traces(tmp_path).ranks[0]).iloc[0]
    got = {p: float(row[p]) for p in DEVICE_PARTS}
    # idle [0,100) and [850,1000): nothing queued, host wait; [300,400): 30 in the host's
    # synchronization, 70 host; [500,550): the next kernel was queued at 420
    assert got == {"dev_compute_us": 350.0, "dev_memory_us": 50.0, "wait_comm_us": 200.0,
                   "wait_sync_us": 30.0, "wait_host_us": 320.0, "wait_other_us": 50.0}
    assert sum(got.values()) == 1000.0
    assert row["sync_us"] == 30.0 and row["launch_us"] == 5.0


def _per_step(values: dict[int, dict[str, float]], steps=(1, 2, 3)) -> pd.DataFrame:
    rows = []
    for r, parts in values.items():
        for s in steps:
            rows.append({"rank": r, "step": s, "start_us": 0.0, "end_us": 1000.0,
                         "span_us": 1000.0, **{p: parts.get(p, 0.0) for p in HOST_PARTS},
                         **{p: float("nan") for p in DEVICE_PARTS}})
    return pd.DataFrame(rows)


def test_excess_and_straggler_cause_name_the_planted_part():
    ps = _per_step({0: {"data_loading_us": 10.0, "comm_us": 500.0},
                    1: {"data_loading_us": 30.0, "comm_us": 480.0},
                    2: {"data_loading_us": 510.0, "comm_us": 20.0}})
    ex = excess_table(ps)
    mine = ex[(ex["rank"] == 2) & (ex["part"] == "data_loading_us")].iloc[0]
    assert (mine["rank_us"], mine["peers_us"], mine["excess_us"]) == (510.0, 20.0, 490.0)
    res = CausesResult(ps, pd.DataFrame(), ex)
    skew = pd.DataFrame([{"rank": 2, "steps": 3, "start_late_us": 0.0, "delay_us": 480.0,
                          "top_collective": "all_reduce #1 of the step", "top_delay_us": 480.0,
                          "top_share_pct": 100.0}])
    c = straggler_cause(res, skew, 2)
    assert (c.where, c.part, c.excess_us) == ("in the step", "data_loading_us", 490.0)
    assert c.sentence() == ("rank 2 arrives 0.5 ms late at all_reduce #1 of the step; its data "
                            "loading takes 0.5 ms longer than its peers'")
    assert "num_workers" in c.advice() and "pin_memory" in c.advice()
    # a sleep: time outside any operator, never "computes"
    ps = _per_step({0: {"other_us": 10.0}, 1: {"other_us": 10.0},
                    2: {"other_us": 400.0, "forward_us": 100.0}})
    c = straggler_cause(CausesResult(ps, pd.DataFrame(), excess_table(ps)), skew, 2)
    assert c.part == "other_us" and "outside any operator" in c.sentence()


def test_a_host_idle_while_its_device_computes_longer_blames_the_device():
    """A GPU straggler whose device computes 600 µs longer than its peers' (a throttled card)
    and whose host, with nothing to do until its device catches up, idles outside any operator
    600 µs longer too: the device's computing is the cause. A host that idles longer while its
    device computes no longer (a sleep) stays the cause."""
    skew = pd.DataFrame([{"rank": 1, "steps": 3, "start_late_us": 0.0, "delay_us": 600.0,
                          "top_collective": "all_reduce #1 of the step", "top_delay_us": 600.0,
                          "top_share_pct": 100.0}])
    for dev, want in ((2500.0, "dev_compute_us"), (1900.0, "other_us"), (2300.0, "other_us")):
        ps = _per_step({0: {"other_us": 2366.0}, 1: {"other_us": 2966.0},
                        2: {"other_us": 2366.0}})
        ps["dev_compute_us"] = ps["rank"].map({0: 1900.0, 1: dev, 2: 1900.0})
        c = straggler_cause(CausesResult(ps, pd.DataFrame(), excess_table(ps)), skew, 1)
        assert c.part == want, (dev, c.parts)
    ps["dev_compute_us"] = ps["rank"].map({0: 1900.0, 1: 2500.0, 2: 1900.0})
    c = straggler_cause(CausesResult(ps, pd.DataFrame(), excess_table(ps)), skew, 1)
    assert c.sentence().endswith("its device computing takes 0.6 ms longer than its peers'")

def test_late_step_entry_with_nothing_longer_inside_the_step():
    ps = _per_step({0: {"forward_us": 100.0}, 1: {"forward_us": 101.0},
                    2: {"forward_us": 102.0}})
    skew = pd.DataFrame([{"rank": 2, "steps": 3, "start_late_us": 7500.0, "delay_us": 8000.0,
                          "top_collective": "all_to_all #1 of the step", "top_delay_us": 7600.0,
                          "top_share_pct": 95.0}])
    c = straggler_cause(CausesResult(ps, pd.DataFrame(), excess_table(ps)), skew, 2)
    assert (c.where, c.part) == ("step entry", None)
    assert c.sentence().startswith("rank 2 enters each step 7.5 ms late; nothing inside its "
                                   "step takes longer: the delay lies before the step")
    assert "before each step" in c.advice()


def test_input_bound_on_every_rank_predicts_the_step_without_loading(tmp_path):
    for r in (0, 1):
        b = _cpu_planted(rank=r, data_ms=100.0 + 100.0 * r)   # rank 1 loads 200 µs
        b.write(tmp_path / f"rank{r}.json")
    res = compute_causes(load_traces(tmp_path), run_step_us=1000.0)
    ib = res.input_bound
    assert ib["ranks"] == [0, 1] and ib["all_ranks"] is True
    assert ib["share_pct"] == {0: 10.0, 1: 20.0}
    assert ib["predicted_step_us"] == 800.0     # 1000 less the largest loading (200)
    assert res.host_bound is None


def test_dlrm_is_host_bound_and_rank_7_late_at_step_entry(real_traces):
    rep = build_report(load_traces(real_traces / "dlrm_8rank_v100", cache=False))
    hb = rep.causes.host_bound
    # compute kernels ~1 ms of 12.5-19.9 ms steps
    assert hb is not None and 5.0 < hb["busy_pct"] < 10.0 and hb["wait_host_pct"] > 40.0
    v = rep.recommendations.verdict
    assert "host-bound: the GPU computes" in v
    # One step recorded, and the ranks' traces start 7.5 ms apart: rank 7 arrives last at
    # every collective of that step, which is the window's head (a profiler that opened late
    # looks the same), so no straggler is named and no recommendation rests on one.
    assert "straggler" not in v
    sync = rep.results["sync"]
    assert sync.straggler is None and sync.instances["head"].all()
    assert any("traces start 7.5 ms apart" in n for n in sync.notes)
    doc = report_json(rep)
    assert doc["causes"]["host_bound"]["ranks"] == list(range(8))
    assert len(doc["causes"]["per_step"]) == 8 and doc["causes"]["input_bound"] is None
    assert not [r for r in rep.recommendations.recommendations if r.kind == "straggler"]


@pytest.mark.e2e
def test_profiled_slow_dataloader_is_named(tmp_path):
    """A rank whose DataLoader sleeps 60 ms per batch: input-bound on that rank, named as the
    straggler's cause (a sleep never returns early, so its data loading is ≥ 60 ms)."""
    out = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "pardiag", "profile", str(REPO / "examples" / "train_ddp.py"),
         "--nproc-per-node", "2", "--out", str(out), "--", "--steps", "7", "--pin-cpu",
         "--slow-data-rank", "1", "--slow-data-ms", "60"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    rep = build_report(load_traces(out))
    pr = rep.causes.per_rank.set_index("rank")
    assert pr.loc[1, "data_loading_us"] >= 60_000.0
    assert pr.loc[0, "data_loading_us"] < 30_000.0
    assert rep.causes.input_bound is not None and 1 in rep.causes.input_bound["ranks"]
    v = rep.recommendations.verdict
    assert "input-bound: data loading" in v
    assert "rank 1 is a straggler" in v and "its data loading takes" in v
    # the verdict's step is the unprofiled one: the step without data loading is stated against
    # it, and the data loading's time says which steps it was measured on
    assert rep.recommendations.step.basis == "unprofiled"
    assert "ms per profiled step)" in v
    head = float(re.match(r"Step ([\d.]+) ms", v).group(1))
    without = float(re.search(r"without it the step would take about ([\d.]+) ms", v).group(1))
    # the same µs of data loading less (a sleep is not slowed by the profiler, as the profiled
    # steps' operators are): not the same share of the unprofiled step
    ib = rep.causes.input_bound
    saved = ib["step_us"] - ib["predicted_step_us"]
    assert saved >= 60_000.0
    assert without < head and without == pytest.approx(
        max(rep.recommendations.step.median_us - saved, 0.0) / 1e3, abs=0.051)
    # the critical path: rank 1's data loading (60 ms of sleep per step) is one of its largest
    # parts — the largest on an idle machine (63% in one run); with three test workers on the
    # 2 cores rank 0's computation stretched past it — and the sentence names it
    sh = rep.critical_path.shares
    dl = sh[(sh["part"] == "data loading") & (sh["rank"] == 1)]
    assert len(dl) == 1 and dl["share_pct"].iloc[0] >= 15.0, sh
    assert dl.index[0] < 3, sh
    assert "rank 1's data loading" in rep.critical_path.describe()


def test_dtensor_host_work_of_a_planted_step(tmp_path):
    """One step [0, 1000) µs on CPU. A ``Redistribute`` [100, 300) holds a functional
    all-gather and its wait (all 200 µs count: the redistribution's host time, waits included);
    ``_ToTorchTensor`` [300, 320) wraps (20); ``aten::addmm`` [400, 500) dispatches on a
    DTensor (``PythonSubclass`` [410, 490)) whose local ``aten::addmm`` [420, 470) computes: the
    dispatch is the 100 µs less the 50 of the local op. In the optimizer [600, 900) a
    ``PythonSubclass`` dispatch of 100 µs is left out (FSDP2 alone has it too), and so is a
    plain ``aten::mm`` with no subclass. dtensor_us = 200 + 20 + 50 = 270."""
    b = TraceBuilder(rank=0, backend="gloo")
    b.thread_name(1, "thread 1 (python3)").thread_name(2, "thread 2 (pt_gloo_runloop)")
    b.step(1, 0, 1000)
    b.cpu("Redistribute", 100, 200, cat="user_annotation")
    b.cpu("_c10d_functional::all_gather_into_tensor", 110, 20)
    b.cpu("_c10d_functional::wait_tensor", 150, 140)
    b.cpu("_ToTorchTensor", 300, 20, cat="user_annotation")
    b.cpu("aten::addmm", 400, 100)
    b.cpu("PythonSubclass", 410, 80, cat="user_annotation")
    b.cpu("aten::addmm", 420, 50)
    b.cpu("aten::mm", 520, 40)
    b.cpu("Optimizer.step#Adam.step", 600, 300, cat="user_annotation")
    b.cpu("aten::add_", 610, 100)
    b.cpu("PythonSubclass", 620, 80, cat="user_annotation")
    b.cpu("aten::add_", 630, 10)
    b.cpu("gloo:all_gather", 120, 150, tid=2, cat="user_annotation")
    b.cpu("FSDP::pre_forward (1)", 920, 40, cat="user_annotation")   # FSDP2's hooks: 40 + 30
    b.cpu("FSDP::all_gather (1)", 925, 20, cat="user_annotation")
    b.cpu("FSDP::post_backward_reduce", 965, 30, cat="user_annotation")
    b.write(tmp_path / "rank0.json")
    row = causes_of_trace(load_traces(tmp_path).ranks[0]).iloc[0]
    assert row["dtensor_us"] == 270.0 and row["fsdp_us"] == 70.0
    assert sum(float(row[p]) for p in HOST_PARTS) == row["span_us"] == 1000.0


def test_no_dtensor_no_host_work(tmp_path):
    """The planted step without DTensor or FSDP2 events: dtensor_us and fsdp_us are 0."""
    _cpu_planted().write(tmp_path / "rank0.json")
    row = causes_of_trace(load_traces(tmp_path).ranks[0]).iloc[0]
    assert row["dtensor_us"] == row["fsdp_us"] == 0.0
