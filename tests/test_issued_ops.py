"""The ops a GPU rank issued (analyzer/analyses/issued_ops.py): one per op the program called,
however many kernels it ran as, lost kernels included; the breakdown's counts read them."""

from __future__ import annotations

import re

import pandas as pd

from pardiag.analyzer.analyses.breakdown import compute_time_breakdown
from pardiag.analyzer.analyses.comm_events import comm_events
from pardiag.analyzer.per_rank.issued_ops import gpu_issued_ops
from pardiag.analyzer.trace import load_traces, vocab
from pardiag.analyzer.trace.classify import Kind, classify

from .synth import TraceBuilder

A2A = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _lost_launch(b: TraceBuilder, ts: float) -> None:
    """A launch whose kernel the profiler lost (CUPTI dropped it)."""
    b._corr += 1
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                     "pid": b.pid, "tid": b.main_tid, "ts": ts, "dur": 1,
                     "args": {"correlation": b._corr}})


def _rec(name: str, nelems: int) -> dict:
    return {"Collective name": name, "In msg nelems": nelems, "Out msg nelems": nelems,
            "dtype": "BFloat16", "Group size": 2}


def _trace(tmp_path):
    b = TraceBuilder(rank=0, world_size=2)
    b.step(1, 0, 1000)
    # an all_to_all launching one SendRecv kernel per peer: one op, first start to last end
    b.cpu("record_param_comms", 10, 40, args=_rec("all_to_allv", 1024))
    b.cpu("nccl:all_to_all", 12, 36, cat="user_annotation")
    b.kernel(A2A, 100, 20, stream=20, launch_ts=14)
    b.kernel(A2A, 125, 30, stream=20, launch_ts=20)
    # a coalescing block of three all-reduces: three member records, then the block's launches
    # (the second kernel lost)
    for i in range(3):
        b.cpu("record_param_comms", 60 + 3 * i, 2, args=_rec("allreduce", 100 * (i + 1)))
    b.cpu("nccl:coalesced", 70, 30, cat="user_annotation")
    b.kernel(AR, 200, 10, stream=20, launch_ts=72)
    _lost_launch(b, 80)
    b.kernel(AR, 215, 10, stream=20, launch_ts=88)
    # an all-reduce of an older trace (no record) whose kernel was lost: it still counts
    b.cpu("nccl:all_reduce", 120, 10, cat="user_annotation")
    _lost_launch(b, 122)
    # NCCL <= 2.13 ran this all-reduce as a SendRecv kernel: the host op names it
    b.cpu("nccl:all_reduce", 140, 10, cat="user_annotation")
    b.kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long)", 300, 10,
             stream=20, launch_ts=142)
    # a communication kernel no host op launched
    b.kernel(AR, 400, 10, stream=20)
    path = b.write(tmp_path / "rank0.json")
    TraceBuilder(rank=1, world_size=2).step(1, 0, 1000).write(tmp_path / "rank1.json")
    return path


def test_ops_are_what_the_program_issued(tmp_path):
    _trace(tmp_path)
    t = load_traces(tmp_path, cache=False).ranks[0]
    kinds = classify(t, ())
    kernels = t.events[(kinds == Kind.GPU_COMM.value).to_numpy()]
    got = gpu_issued_ops(t, kernels)
    ops = got.ops
    assert ops["op"].tolist() == ["all_to_all", "all_reduce", "all_reduce", "all_reduce",
                                  "all_reduce", "all_reduce", "all_reduce"]
    assert ops["missing"].tolist() == [False, False, True, False, True, False, False]
    a2a = ops.iloc[0]
    assert (a2a["start_us"], a2a["end_us"], a2a["n_kernels"]) == (100, 155, 2)
    # the block's members keep their own sizes, launch by launch
    members = ops[ops["block"] >= 0]
    assert [m["In msg nelems"] for m in members["args"]] == [100, 200, 300]
    assert members["start_us"].tolist()[::2] == [200, 215]
    # each kernel belongs to its op; the a2a's second kernel counts nothing
    assert got.kernel_counts().tolist() == [1, 0, 1, 1, 1, 1]
    assert got.kernel_types()[4] == "all_reduce"


def test_counts_and_events_read_the_same_ops(tmp_path):
    _trace(tmp_path)
    traces = load_traces(tmp_path, cache=False)
    colls = compute_time_breakdown(traces).collectives
    counts = dict(zip(colls.loc[colls["rank"] == 0, "collective"],
                      colls.loc[colls["rank"] == 0, "count"]))
    assert counts == {"all_to_all": 1, "all_reduce": 6}
    ev = comm_events(traces)
    ev = ev[ev["rank"] == 0]
    # the lost ops have no times to compare: they are left out of the cross-rank events, but
    # keep their place in their order: no group is named, so each type is numbered on its own
    # (the all-reduce after the first lost one is the 3rd all-reduce, not the 2nd)
    assert len(ev) == 5
    ar = ev[ev["op"] == "all_reduce"].sort_values("start_us")
    assert ar["seq"].tolist() == [1, 3, 5, 6]
    assert ev.loc[ev["op"] == "all_to_all", "seq"].tolist() == [1]
    assert pd.isna(ev["peer"]).all()


def test_kernels_that_communication_ops_launched_under_unknown_names_are_warned_of(tmp_path):
    """A custom collective kernel (a renamed NCCL, a fabric's own) that no pattern names is
    counted as computation: the loader warns and names the option. An op that also launched a
    known communication kernel, copies inside a collective (gloo's of CUDA tensors), and a gemm
    outside any collective are no such case."""
    b = TraceBuilder(rank=0, world_size=2)
    b.step(1, 0, 1000)
    for t in (10, 300):   # two all-reduces run as fabric_allreduce_kernel
        b.cpu("record_param_comms", t, 40, args=_rec("allreduce", 1024))
        b.cpu("nccl:all_reduce", t + 2, 36, cat="user_annotation")
        b.kernel("fabric_allreduce_kernel", t + 100, 50, stream=20, launch_ts=t + 4)
    b.cpu("record_param_comms", 500, 40, args=_rec("allreduce", 1024))
    b.kernel("void scale_kernel(float*)", 600, 5, launch_ts=502)    # with a known kernel
    b.kernel(AR, 610, 30, stream=20, launch_ts=504)
    b.cpu("record_param_comms", 700, 40, args=_rec("allreduce", 1024))
    b.kernel("Memcpy DtoH (Device -> Pinned)", 750, 10, stream=9, launch_ts=702,
             cat="gpu_memcpy")
    b.kernel("void gemm_kernel<float>(float*)", 800, 100, launch_ts=790)
    b.write(tmp_path / "rank0.json")
    path = tmp_path / "rank0.json"
    from pardiag.analyzer.per_rank import REDUCER

    for cache in (False, True, True):   # parsed, then stored and read back
        ts = load_traces(tmp_path, reducer=REDUCER, cache=cache)
        assert [w for w in ts.warnings if "no communication pattern" in w] == [
            f"{path}: communication ops launched 2 GPU kernel(s) that no communication pattern "
            f"names, counted as computation: fabric_allreduce_kernel (2); name them with "
            f"--comm-kernel REGEX"]
    named = load_traces(tmp_path, reducer=REDUCER, cache=False, comm_patterns=["fabric_"])
    assert not [w for w in named.warnings if "no communication pattern" in w]


def test_a_gpu_run_traced_without_its_device_is_warned_of(tmp_path):
    """A rank of an NCCL run whose trace holds only host events (profiled without
    ProfilerActivity.CUDA): its communication times are the host's NCCL calls, so the loader
    says so. A gloo CPU run and a trace with kernels are no such case."""
    from pardiag.analyzer.per_rank import REDUCER

    from .synth import cpu_rank, gpu_rank

    b = TraceBuilder(rank=0, world_size=2)   # backend nccl
    b.step(1, 0, 1000).cpu("aten::mm", 10, 500)
    b.cpu("record_param_comms", 600, 40, args=_rec("allreduce", 1024))
    b.cpu("cudaLaunchKernel", 610, 5, cat="cuda_runtime")
    (tmp_path / "gpu").mkdir()
    b.write(tmp_path / "gpu" / "rank0.json")
    got = [w for w in load_traces(tmp_path / "gpu", reducer=REDUCER, cache=False).warnings
           if "a GPU run" in w]
    assert got == [f"{tmp_path / 'gpu' / 'rank0.json'}: a GPU run (backend nccl, 1 runtime "
                   f"calls) whose trace holds no GPU kernel (profiled without the device's "
                   f"activity?): its computation and communication on the device are not in "
                   f"it, and the communication times are the host's calls, not the transfers"]
    # init_process_group() without a backend says 'undefined': NCCL's own ranges tell
    u = TraceBuilder(rank=0, world_size=2, backend="undefined")
    u.step(1, 0, 1000).cpu("nccl:all_reduce", 600, 40)
    (tmp_path / "undefined").mkdir()
    u.write(tmp_path / "undefined" / "rank0.json")
    got = [w for w in load_traces(tmp_path / "undefined", reducer=REDUCER,
                                  cache=False).warnings if "a GPU run" in w]
    assert len(got) == 1 and "a GPU run (1 GPU-backend ops)" in got[0]
    # a device that ran only copies was recorded: no hint that its activity is missing
    c = TraceBuilder(rank=0, world_size=2)
    c.step(1, 0, 1000).cpu("aten::copy_", 10, 500)
    c.kernel("Memcpy HtoD (Pinned -> Device)", 30, 40, launch_ts=20, cat="gpu_memcpy")
    c.kernel("Memset (Device)", 80, 2, launch_ts=20, cat="gpu_memset")
    (tmp_path / "copies").mkdir()
    c.write(tmp_path / "copies" / "rank0.json")
    got = [w for w in load_traces(tmp_path / "copies", reducer=REDUCER, cache=False).warnings
           if "a GPU run" in w]
    assert got == [f"{tmp_path / 'copies' / 'rank0.json'}: a GPU run (backend nccl, 2 runtime "
                   f"calls) whose device ran 2 copies and memsets and no kernel: it is "
                   f"analysed on its host's timeline"]
    for name, builder in (("cpu", cpu_rank), ("kernels", gpu_rank)):
        (tmp_path / name).mkdir()
        builder(0).write(tmp_path / name / "rank0.json")
        ts = load_traces(tmp_path / name, reducer=REDUCER, cache=False)
        assert not [w for w in ts.warnings if "a GPU run" in w]


def test_a_record_that_closed_before_its_launch_still_names_its_op(tmp_path):
    """XPU traces before torch-xpu-ops#5486: the op's ``record_param_comms`` closes before its
    kernel's launch, inside ``c10d::allreduce_``. The record is still the op's (the latest
    record of the thread inside the range that encloses the launch): its size and group are
    the op's, where the kernel carries nothing. An op whose range holds no record keeps the
    range's type alone."""
    b = TraceBuilder(rank=0, world_size=2)
    b.step(1, 0, 1000)
    b.cpu("c10d::allreduce_", 10, 60)
    b.cpu("record_param_comms", 12, 4, args={**_rec("allreduce", 1 << 20),
                                             "Process Group Ranks": "[0, 1]"})
    b.kernel("oneccl_reduce_base_kernel", 100, 40, stream=20, launch_ts=30)
    b.cpu("c10d::allreduce_", 200, 60)
    b.kernel("oneccl_reduce_base_kernel", 300, 40, stream=20, launch_ts=220)
    pattern = [re.compile("oneccl_")]
    trace = load_traces(b.write(tmp_path / "rank0.json"), comm_patterns=pattern).ranks[0]
    kinds = classify(trace, pattern)
    kernels = trace.events[(kinds == Kind.GPU_COMM.value).to_numpy()]
    ops = gpu_issued_ops(trace, kernels).ops
    assert ops["op"].tolist() == ["all_reduce", "all_reduce"]
    assert [vocab.IN_NELEMS.get(a) for a in ops["args"]] == [1 << 20, None]


def test_kernels_a_backends_own_thread_launched_belong_to_the_op_issued(tmp_path):
    """oneCCL's Level-Zero path launches its kernels from its worker thread, outside the calling
    op: 2 all-reduces issued on the main thread (``c10d::allreduce_`` > ``record_param_comms``),
    each run as 2 ``allreduce_execution_bf16_sum`` kernels (a custom name, counted through
    ``--comm-kernel``) launched by thread 9 just after it. Each op counts once, as an
    all-reduce, with both its kernels. Left alone: a gloo broadcast's record that launched
    nothing, and an all-reduce kernel launched later outside any op (a graph's): its type is
    not the record's, so it stays an op of its own."""
    b = TraceBuilder(rank=0, world_size=2)
    b.step(1, 0, 3000)
    for t in (100, 1000):
        b.cpu("c10d::allreduce_", t, 30)
        b.cpu("record_param_comms", t + 5, 20, args=_rec("allreduce", 4096))
        for j, lt in enumerate((t + 10, t + 14)):
            b._corr += 1
            b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                             "pid": b.pid, "tid": 9, "ts": lt, "dur": 2,
                             "args": {"correlation": b._corr}})
            b.events.append({"ph": "X", "cat": "kernel", "name": "allreduce_execution_bf16_sum",
                             "pid": 0, "tid": 20, "ts": t + 200 + 100 * j, "dur": 80,
                             "args": {"device": 0, "stream": 20, "correlation": b._corr}})
    b.cpu("record_param_comms", 2000, 10, args=_rec("broadcast", 8))
    b.kernel(AR, 2500, 20, stream=21, launch_ts=2050)
    b.write(tmp_path / "rank0.json")
    t = load_traces(tmp_path, cache=False).ranks[0]
    from pardiag.analyzer.trace.classify import compile_comm_patterns
    kinds = classify(t, compile_comm_patterns(["allreduce_execution_"]))
    kernels = t.events[(kinds == Kind.GPU_COMM.value).to_numpy()]
    got = gpu_issued_ops(t, kernels)
    ops = got.ops
    assert ops["op"].tolist() == ["all_reduce", "all_reduce", "all_reduce"]
    assert ops["n_kernels"].tolist() == [2, 2, 1]
    assert ops["issue_us"].tolist() == [105.0, 1005.0, 2500.0]
    assert (ops.loc[0, "start_us"], ops.loc[0, "end_us"]) == (300.0, 480.0)
    assert ops["missing"].tolist() == [False, False, False]


def test_a_fused_block_of_sends_and_receives_counts_each_type(tmp_path):
    """batch_isend_irecv of a ring exchange (send, recv, send, recv: four records) that NCCL
    fused into one SendRecv kernel: two sends and two receives, each type with the kernel's
    time (it ran both), not four of the first member's type."""
    b = TraceBuilder(rank=0, world_size=2)
    b.step(1, 0, 1000)
    for i, (op, peer) in enumerate((("send", "Dst Rank"), ("recv", "Src Rank")) * 2):
        b.cpu("record_param_comms", 10 + 5 * i, 2, args={"Collective name": op, peer: 1,
                                                          "Process Group Name": "3"})
    b.cpu("nccl:coalesced", 40, 20, cat="user_annotation")
    b.kernel(A2A, 100, 50, stream=20, launch_ts=45)
    b.kernel("gemm", 120, 100, stream=7, launch_ts=50)
    b.write(tmp_path / "rank0.json")
    TraceBuilder(rank=1, world_size=2).step(1, 0, 1000).write(tmp_path / "rank1.json")
    for cache in (False, True, True):   # the same from the summary stored by the second
        colls = compute_time_breakdown(load_traces(tmp_path, cache=cache)).collectives
        got = {r.collective: (r.count, r.time_us, r.exposed_us)
               for r in colls[colls["rank"] == 0].itertuples()}
        assert got == {"send": (2, 50.0, 20.0), "recv": (2, 50.0, 20.0)}
