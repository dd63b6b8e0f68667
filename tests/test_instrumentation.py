"""pardiag's hooks outside the profiler's window: what they still do there.

The wrappers run on every step, so outside the window they must do only what the analyses
use from those steps (the pipeline's chunk times, the point-to-point calls a hang dump shows)
and nothing the profiler alone needs (``record_function`` ranges, full records)."""

from __future__ import annotations

import contextlib
import os
import types

import pytest

torch = pytest.importorskip("torch")

from pardiag.analyzer.trace.comm_records import records_from_p2p  # noqa: E402
from pardiag.collectors import (  # noqa: E402
    comms,
    live_objects,
    memory,
    parallelism,
    pipeline_recorder,
)


class _Group:
    """A stand-in process group (``group_name`` finds no name for it: "")."""


def test_p2p_wrapper_keeps_no_record_outside_the_window():
    rec = comms.P2PRecorder()
    calls = []

    def send(tensor, dst=None, group=None):
        calls.append(dst)
        return "sent"

    wrapped = rec._wrap("send", send)
    group = _Group()
    t = torch.zeros(8, dtype=torch.float16)
    assert wrapped(t, 1, group) == "sent" and wrapped(t, 1, group) == "sent"
    assert calls == [1, 1]
    # outside: counted and kept in the bounded buffer for a hang dump, no record
    assert rec.records == [] and rec.calls_outside == 2 and rec.calls_recorded == 0
    assert len(rec.recent) == 2
    rec.recording = True
    wrapped(t, 1, group)
    assert rec.calls_recorded == 1 and len(rec.records) == 1
    row = rec.records[0]
    # the count runs over every call, so both ranks pair their calls whatever the window
    assert row["seq"] == 3 and row["op"] == "send" and row["peer"] == 1
    assert row["bytes"] == 16 and row["dtype"] == "float16" and row["pg_name"] == ""
    assert row["issue_ns"] <= row["returned_ns"]
    # the hang dump's rows: the last calls, inside and outside the window alike
    assert [r["seq"] for r in rec.recent_rows()] == [1, 2, 3]
    rec.recording = False
    for _ in range(comms.P2PRecorder.RECENT + 5):
        wrapped(t, 1, group)
    assert len(rec.records) == 1 and len(rec.recent) == comms.P2PRecorder.RECENT


def test_a_send_made_of_an_isend_is_one_message():
    """torch's ``send`` is ``isend(...).wait()`` and ``recv`` is ``irecv``: both wrapped, the
    inner call is the outer's message, never a second one (DeepSpeed's pipeline sends with
    ``send``; each message was recorded twice)."""
    rec = comms.P2PRecorder()
    rec.recording = True
    group = _Group()
    isend = rec._wrap("isend", lambda tensor, dst=None, group=None, group_dst=None: "work")
    send = rec._wrap("send", lambda tensor, dst=None, group=None: isend(
        tensor, group=group, group_dst=dst))
    t = torch.zeros(4)
    assert send(t, 1, group) == "work" and send(t, 1, group) == "work"
    assert [(r["op"], r["peer"], r["seq"]) for r in rec.records] == [("send", 1, 1),
                                                                     ("send", 1, 2)]
    assert rec.calls_recorded == 2
    isend(t, 1, group)   # alone, an isend is a message of its own, the third to that peer
    assert len(rec.records) == 3 and rec.records[-1]["seq"] == 3


def test_deepspeed_orders_are_its_train_schedule():
    """The order DeepSpeed's TrainSchedule runs, per stage: 1F1B, stage s starting with
    min(p − s, m) forwards, every microbatch's forward before its backward, each phase's
    microbatches in order (what the recorder's per-phase count relies on)."""
    pytest.importorskip("deepspeed")
    orders = parallelism.deepspeed_orders(2, [4, 8])
    assert orders["4"] == {
        "0": [[0, "F", 0], [0, "F", 1], [0, "B", 0], [0, "F", 2], [0, "B", 1], [0, "F", 3],
              [0, "B", 2], [0, "B", 3]],
        "1": [[1, "F", 0], [1, "B", 0], [1, "F", 1], [1, "B", 1], [1, "F", 2], [1, "B", 2],
              [1, "F", 3], [1, "B", 3]]}
    for p, m in ((4, 8), (3, 2)):
        for s, seq in parallelism.deepspeed_orders(p, [m])[str(m)].items():
            phases = [ph for _, ph, _ in seq]
            lead = len(phases) - len("".join(phases).lstrip("F"))
            assert lead == min(p - int(s), m), (p, m, s, phases)
            for ph in "FB":
                assert [mb for _, x, mb in seq if x == ph] == list(range(m))


def test_records_from_p2p_keep_the_recorded_count():
    base = {"op": "recv", "peer": 0, "pg_name": "0", "bytes": 64, "dtype": "float32",
            "issue_ns": 10, "returned_ns": 20}
    out = records_from_p2p([{**base, "seq": 7}, {**base, "issue_ns": 30, "returned_ns": 40}], [])
    assert [r["seq"] for r in out] == [7, 2]   # a record without its count: the records' own


@pytest.fixture
def fake_stage_base(monkeypatch):
    """``_PipelineStageBase`` with chunk methods that run the stage's module (no group)."""
    from torch.distributed.pipelining.stage import _PipelineStageBase

    def forward_one_chunk(stage, chunk_id, x):
        return stage.submod(x)

    def backward_one_chunk(stage, chunk_id, loss=None, full_backward=True):
        return None

    monkeypatch.setattr(_PipelineStageBase, "forward_one_chunk", forward_one_chunk)
    monkeypatch.setattr(_PipelineStageBase, "backward_one_chunk", backward_one_chunk)
    if hasattr(_PipelineStageBase, "backward_weight_one_chunk"):
        monkeypatch.setattr(_PipelineStageBase, "backward_weight_one_chunk",
                            lambda stage, chunk_id: None)
    ranges = []

    @contextlib.contextmanager
    def record_function(name):
        ranges.append(name)
        yield

    monkeypatch.setattr(torch.profiler, "record_function", record_function)
    return _PipelineStageBase, ranges


def test_pipeline_wrapper_opens_ranges_only_in_the_window(fake_stage_base):
    base, ranges = fake_stage_base
    step = [0]
    rec = pipeline_recorder.PipelineRecorder(lambda: step[0])
    assert rec.install()
    try:
        stage = types.SimpleNamespace(stage_index=0, submod=torch.nn.Linear(4, 3))
        x = torch.randn(5, 4)
        for mb in range(2):
            base.forward_one_chunk(stage, mb, x)
            base.backward_one_chunk(stage, mb, full_backward=True)
        # outside the window: records (the unprofiled steps time the schedule), no range
        assert ranges == [] and rec.calls_outside == 4 and rec.calls_recorded == 0
        assert [(r["phase"], r["microbatch"]) for r in rec.records] == [
            ("F", 0), ("B", 0), ("F", 1), ("B", 1)]
        assert rec.records[0]["samples"] == 5 and rec.records[0]["optimizer_step"] == 0
        # the module's input was seen once; its hook is gone (the module's fast path)
        assert rec.inputs[0] == ((5, 4), torch.float32, True)
        assert len(stage.submod._forward_pre_hooks) == 0
        step[0] = 1
        rec.recording = True
        base.forward_one_chunk(stage, 0, x)
        base.backward_one_chunk(stage, 0, full_backward=False)
        assert ranges == ["pardiag:PP:S0:F0", "pardiag:PP:S0:I0"]
        assert rec.calls_recorded == 2 and len(rec.records) == 6
        assert rec.records[-1]["optimizer_step"] == 1
    finally:
        rec.uninstall()
    assert base.forward_one_chunk.__name__ == "forward_one_chunk"   # the original again


def test_live_instances_and_modules_not_imported():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    found = live_objects.live_instances((torch.nn.Sequential,))
    assert any(o is model for o in found)
    assert all(isinstance(o, torch.nn.Sequential) for o in found)
    assert live_objects.live_instances(()) == []
    # a module nobody imported has no live instance and is not imported to look
    assert live_objects.loaded("pardiag_no_such_module", "X") == ()
    assert live_objects.loaded("torch.nn", "Linear", "NoSuchClass") == (torch.nn.Linear,)
    assert torch.nn.Module in live_objects.scan_classes()


def test_the_pipeline_recorder_keeps_its_last_calls_only(fake_stage_base):
    """A long run's chunk calls are bounded: the last MAX_RECORDS are kept."""
    pipe = pipeline_recorder.PipelineRecorder(lambda: 0)
    pipe.records.extend({"microbatch": i} for i in range(pipeline_recorder.MAX_RECORDS + 10))
    assert len(pipe.records) == pipeline_recorder.MAX_RECORDS
    assert pipe.records[0]["microbatch"] == 10


def test_wrappers_time_their_own_cost_and_leave_no_trace(fake_stage_base):
    """The per-call cost outside the window is measured on a no-op after the run; measuring
    it leaves the recorders as they were (no record, count or buffered call added)."""
    step = [0]
    pipe = pipeline_recorder.PipelineRecorder(lambda: step[0])
    p2p = comms.P2PRecorder()
    assert pipe.self_cost_us(calls=50, blocks=3) >= 0.0
    assert p2p.self_cost_us(calls=50, blocks=3) >= 0.0
    assert list(pipe.records) == [] and pipe.calls_outside == 0 and not pipe._hooked
    assert p2p.records == [] and p2p.calls_outside == 0 and len(p2p.recent) == 0
    assert p2p._seq == {}


def test_profiler_warmup_steps_do_not_calibrate_the_pipeline(tmp_path):
    """The pipeline's clean (undisturbed) steps leave out the profiler's
    warm-up steps as well as the first step; with the schedule unknown only the first."""
    import dataclasses

    import msgspec

    from pardiag import layout
    from pardiag.analyzer.analyses.pipeline import compute_pipeline

    from .test_recommend import _pipeline_run

    traces = _pipeline_run(tmp_path, "1f1b", 2, 4, [600, 200], [1200, 400], {0: 600, 1: 200},
                           steps=8)
    clean = compute_pipeline(traces).bubbles.groupby("step")["clean"].all()
    assert list(clean.index) == list(range(1, 8)) and clean.all()   # step 0 left out
    with_schedule = dataclasses.replace(traces, run_info=msgspec.structs.replace(
        traces.run_info, schedule=layout.ProfilerSchedule(wait=1, warmup=2, active=3)))
    clean = compute_pipeline(with_schedule).bubbles.groupby("step")["clean"].all()
    assert [s for s, c in clean.items() if not c] == [1, 2]   # the warm-up steps


def test_layer_times_are_the_fastest_call():
    """Each layer's forward time is the fastest of its calls: a loaded host only adds time. One
    preempted call (70 ms among 1 ms ones) leaves it at 1 ms (the mean would say 10.9 ms), and
    so do 4 of 7 calls at 5 ms (the median would say 5 ms)."""
    rec = pipeline_recorder.PipelineRecorder(lambda: 0)
    stage = types.SimpleNamespace(stage_index=1, submod=torch.nn.Sequential(
        torch.nn.Linear(4, 4), torch.nn.ReLU()))
    handles = rec._layer_hooks(stage, "after_run")
    try:
        stage.submod(torch.randn(2, 4))
    finally:
        for h in handles:
            h.remove()
    assert [(r["stage"], r["index"], r["type"], len(r["fwd_us"])) for r in rec.layer_rows()] == [
        (1, 0, "Linear", 1), (1, 1, "ReLU", 1)]
    rec.layers[(1, 0)]["fwd_ns"]["after_run"] = [1_000_000] * 6 + [70_000_000]
    assert rec.layer_rows()[0]["fwd_us"] == {"after_run": 1000.0}
    rec.layers[(1, 0)]["fwd_ns"]["after_run"] = [5_000_000, 1_000_000] * 3 + [5_000_000]
    assert rec.layer_rows()[0]["fwd_us"] == {"after_run": 1000.0}


def test_size_scaling_times_the_sizes_in_turn():
    """The stage module is timed at each size in turn, one call per size per round (a first
    round warms up), not all calls of one size and then the next: drift on the host then falls
    on every size alike. Each size keeps ``repeats`` timings; the layers are timed only at the
    run's own size, once per timed round."""
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(int(x.shape[0]))
            return x * 2

    rec = pipeline_recorder.PipelineRecorder(lambda: 0)
    stage = types.SimpleNamespace(stage_index=1, submod=torch.nn.Sequential(
        torch.nn.Linear(4, 4), Probe()))
    rec._stages.append(stage)
    rec.inputs[1] = ((8, 4), torch.float32, True)
    rows = rec.size_scaling(repeats=3)
    assert seen == [2, 4, 8, 16] * 4
    assert [(r["samples"], len(r["fwd_samples_us"]), len(r["bwd_samples_us"])) for r in rows] == [
        (2, 3, 3), (4, 3, 3), (8, 3, 3), (16, 3, 3)]
    assert [len(e["fwd_ns"]["after_run"]) for _, e in sorted(rec.layers.items())] == [3, 3]
    assert all(r["fwd_us"] == sorted(r["fwd_samples_us"])[1] for r in rows)


class _Container(torch.optim.Optimizer):
    """Like torchtitan's ``OptimizersContainer``: an optimizer over every part's parameters whose
    ``step`` steps one real optimizer per model part (``.optimizers``); its own ``state`` stays
    empty."""

    def __init__(self, parts):
        self.optimizers = [torch.optim.Adam(p.parameters(), lr=1e-3) for p in parts]
        super().__init__([q for p in parts for q in p.parameters()], {"lr": 1e-3})

    def step(self, closure=None):
        for o in self.optimizers:
            o.step()


def test_static_memory_reads_the_state_of_a_container_of_optimizers():
    """Two parts of 10·10 + 10 and 10·4 + 4 fp32 parameters: Adam's two moments (and a step
    scalar per parameter) are in the inner optimizers; the container's bytes are theirs."""
    parts = [torch.nn.Linear(10, 10), torch.nn.Linear(10, 4)]
    opt = _Container(parts)
    for p in parts:
        p(torch.ones(2, 10)).sum().backward()
    opt.step()
    mem = memory.static_memory(opt)
    n = 110 + 44
    assert mem["params"] == 4 and mem["params_bytes"] == 4 * n and mem["grads_bytes"] == 4 * n
    steps = sum(memory.local_bytes(s["step"]) for o in opt.optimizers for s in o.state.values())
    assert mem["optimizer_state_bytes"] == 2 * 4 * n + steps


class _FakeMesh:
    """A DeviceMesh's surface that the collector reads: names, the rank tensor, groups."""

    def __init__(self, names, shape, ranks=None):
        n = 1
        for x in shape:
            n *= x
        self.mesh_dim_names = tuple(names)
        self.mesh = torch.arange(n).reshape(shape) if ranks is None else torch.tensor(ranks)

    def get_group(self, name):
        raise KeyError(name)   # no live process group in a unit test


def _torchtitan_meshes(dp_shard: int, tp: int) -> list[dict]:
    """The meshes torchtitan builds for FSDP over dp_shard × TP over tp (one node): the world
    mesh with its size-1 dimensions, the flattened ``dp``/``dp_shard_cp``/``dp_cp`` meshes, and
    internal ones (``WORLD``, ``BATCH``, ``LOSS_MESH``, ``EFSDP``)."""
    scan = parallelism._ParallelScan()
    world = dp_shard * tp
    parallelism._note_mesh(scan, _FakeMesh(["pp", "dp_replicate", "dp_shard", "cp", "tp"],
                                     (1, 1, dp_shard, 1, tp)))
    by_dp = torch.arange(world).reshape(dp_shard, tp)
    for name in ("dp", "dp_shard_cp", "dp_cp", "BATCH", "LOSS_MESH", "EFSDP"):
        for col in range(tp):   # a 1-D mesh per TP rank, over the data-parallel ranks
            parallelism._note_mesh(scan, _FakeMesh([name], (dp_shard,), by_dp[:, col].tolist()))
    parallelism._note_mesh(scan, _FakeMesh(["WORLD"], (world,)))
    return scan.meshes


@pytest.mark.parametrize("dp_shard, tp, dims", [(2, 1, {"dp": 2}), (2, 2, {"dp": 2, "tp": 2}),
                                                (4, 1, {"dp": 4})])
def test_mesh_layout_of_torchtitan_meshes(dp_shard, tp, dims):
    """Size-1 dimensions are none; flattened and internal meshes add no dimension and do not
    overwrite one (dp_replicate = 1 used to leave FSDP over 2 ranks as dp = 1); TP only where
    its degree is 2 or more."""
    from pardiag.collectors.rank_entry import _layout_of

    lay = _layout_of({"meshes": _torchtitan_meshes(dp_shard, tp), "wrappers": ["fsdp2"]}, [],
                     [], world=dp_shard * tp)
    assert lay["dims"] == dims
    assert lay["strategies"] == (["fsdp2", "tp"] if tp > 1 else ["fsdp2"])


def test_mesh_layout_keeps_hsdp_and_groups_of_one_out():
    """HSDP: dp_replicate 2 × dp_shard 2 multiply into dp = 4; a size-1 group described
    mesh_ep is no expert dimension."""
    from pardiag.collectors.rank_entry import _layout_of

    scan = parallelism._ParallelScan()
    parallelism._note_mesh(scan, _FakeMesh(["dp_replicate", "dp_shard"], (2, 2)))
    lay = _layout_of({"meshes": scan.meshes, "wrappers": ["fsdp2"]},
                     [{"name": "7", "desc": "mesh_ep", "size": 1, "ranks": [0]}], [], world=4)
    assert lay["dims"] == {"dp": 4} and lay["strategies"] == ["fsdp2"]
    assert "7" not in lay["group_dims"]


def test_replicas_that_reduce_gradients_over_the_world_are_data_parallel():
    """Ulysses on 4 ranks with --dp 2: two sequence-parallel groups of 2 made with new_group (no
    mesh, no wrapper) and the gradients all-reduced over the world by the script: dp=2 beside
    cp=2. Without a reduction over the world the replicas are not called data parallel."""
    from pardiag.collectors.rank_entry import _layout_of

    groups = [{"name": "0", "desc": "default_pg", "size": 4, "ranks": [0, 1, 2, 3]},
              {"name": "1", "desc": "undefined", "size": 2, "ranks": [0, 1]}]
    a2a = [{"op": "all_to_all", "pg_name": "1"}]
    lay = _layout_of({}, groups, [*a2a, {"op": "all_reduce", "pg_name": "0"}], world=4,
                     a2a_role="cp")
    assert lay["dims"] == {"cp": 2, "dp": 2} and lay["strategies"] == ["cp"]
    assert _layout_of({}, groups, a2a, world=4, a2a_role="cp")["dims"] == {"cp": 2}
    # the whole world in its dimensions already: nothing to add
    assert _layout_of({}, groups[:1] + [{**groups[1], "size": 4, "ranks": [0, 1, 2, 3]}],
                      [{"op": "all_to_all", "pg_name": "1"},
                       {"op": "all_reduce", "pg_name": "0"}], world=4,
                      a2a_role="cp")["dims"] == {"cp": 4}


def _bare_run(tmp_path):
    """A rank's run state, as the rank entry holds it, writing into ``tmp_path``."""
    from pardiag import layout
    from pardiag.collectors import rank_entry

    run = rank_entry._RankRun(
        cfg={"active": 1}, out=tmp_path, rank=0, world_size=1, local_rank=0, group=None,
        stacks=None, pinned=False, cuda=False, trace_file=layout.trace_path(tmp_path, 0),
        wait=0, warmup=0)
    layout.sidecar_dir(tmp_path).mkdir()
    return run


def _window_ends_under_sigterm(run, prof) -> None:
    """The profiling window's end (:func:`rank_entry._on_trace_ready`) with the rank's SIGTERM
    handling installed; it must end by stopping the rank. The handlers are restored after."""
    import signal

    from pardiag.collectors import rank_entry

    saved = signal.getsignal(signal.SIGTERM)
    saved_fd = signal.set_wakeup_fd(-1)
    try:
        rank_entry._stop_on_sigterm(run)
        with pytest.raises(rank_entry._Terminated):
            rank_entry._on_trace_ready(run, prof)
    finally:
        signal.signal(signal.SIGTERM, saved)
        signal.set_wakeup_fd(saved_fd)


def test_a_sigterm_while_the_trace_is_written_waits_for_the_trace(tmp_path):
    """torchrun stops the other ranks with SIGTERM when one fails: a rank writing its trace
    finishes it under its name (written under another name, then renamed), then stops."""
    import gzip
    import os
    import signal
    import time

    from pardiag import layout
    from pardiag.collectors import rank_entry

    run = _bare_run(tmp_path)
    written = []

    class Profiler:
        def export_chrome_trace(self, path):
            written.append(path)
            with open(path, "wb") as f:
                f.write(b"part one, ")
                os.kill(os.getpid(), signal.SIGTERM)   # the launcher stops the job mid-write
                time.sleep(0.05)                        # the handler runs here
                f.write(b"part two")

    _window_ends_under_sigterm(run, Profiler())
    partial = layout.partial_trace_path(tmp_path, 0)
    raw = partial.with_name("rank0.trace.partial.json")   # Kineto's JSON, then compressed
    assert written == [str(raw)]
    assert gzip.decompress(run.trace_file.read_bytes()) == b"part one, part two"
    assert not partial.exists() and not raw.exists()
    assert run.traces_written == ["rank0.trace.json.gz"] and run.terminated
    assert rank_entry._exit_code_of(rank_entry._Terminated()) == 143
    assert rank_entry._one_line(rank_entry._Terminated()).startswith("stopped by SIGTERM")


def test_a_sigterm_after_the_trace_waits_for_the_window_s_metadata(tmp_path, monkeypatch):
    """A SIGTERM that comes while the rank reads its live objects after the trace (importing
    modules on first use) waits until the window's metadata is written: raised inside an
    import, it left a module half-initialized and the rank's later files failed on it."""
    import os
    import signal
    import time

    from pardiag.collectors import rank_entry, shapes

    run = _bare_run(tmp_path)
    reached = []

    def model_shapes(objects=None):
        os.kill(os.getpid(), signal.SIGTERM)   # the launcher stops the job here
        time.sleep(0.05)                        # the handler runs here
        reached.append("after the signal")
        return None

    monkeypatch.setattr(shapes, "model_shapes", model_shapes)
    monkeypatch.setattr(rank_entry, "_write_window_meta", lambda run: reached.append("meta"))

    class Profiler:
        def export_chrome_trace(self, path):
            with open(path, "wb") as f:
                f.write(b"{}")

    _window_ends_under_sigterm(run, Profiler())
    # the rest of the window's work ran, the metadata's write last, and then the rank stopped
    assert reached == ["after the signal", "meta"] and run.terminated


def test_a_gpu_rank_tears_cupti_down_after_its_window(monkeypatch):
    """On a GPU the rank's profiler runs with TEARDOWN_CUPTI=1 (Kineto otherwise keeps CUPTI
    attached after the window, slowing every later launch); a user's own value stands, and a
    CPU rank leaves the variable alone."""
    from pardiag.collectors.rank_entry import _make_profiler

    def run(cuda):
        return types.SimpleNamespace(cuda=cuda, wait=1, warmup=1, cfg={"active": 1})

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    _make_profiler(run(False))
    assert "TEARDOWN_CUPTI" not in os.environ
    _make_profiler(run(True))
    assert os.environ["TEARDOWN_CUPTI"] == "1"
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    _make_profiler(run(True))
    assert os.environ["TEARDOWN_CUPTI"] == "0"


@pytest.mark.parametrize("name", ["ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble",
                                  "ScheduleLoopedBFS", "ScheduleZBVZeroBubble",
                                  "ScheduleDualPipeV"])
def test_the_schedule_s_own_orders_are_recorded_for_other_microbatch_counts(name):
    """For the what-if model, profile records the order the run's schedule class builds at the
    microbatch counts it evaluates (half, twice, four times), each combined action as its parts:
    torch's own order, the same the tests replay (test_schedule_replay.torch_order); GPipe and
    1F1B, whose orders pardiag generates, record none."""
    import torch.distributed.pipelining.schedules as S

    from pardiag.collectors.parallelism import schedule_orders
    from pardiag.layout import microbatch_choices

    from .test_schedule_replay import torch_order

    p, vee = 2, name in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")
    idx = [0, 3] if vee else [0, 2]
    stages = [types.SimpleNamespace(group_size=p, group_rank=0, stage_index=i, num_stages=4,
                                    is_first=i == 0, is_last=i == 3,
                                    submod=torch.nn.Linear(1, 1)) for i in idx]
    sched = getattr(S, name)(stages, n_microbatches=4)
    assert microbatch_choices(4) == [2, 8, 16]
    got = schedule_orders(sched, stages, microbatch_choices(4))
    for m, ranks in got.items():
        want = torch_order(name, p, int(m))
        assert {int(r): [tuple(a) for a in seq] for r, seq in ranks.items()} == want
    assert "8" in got and "16" in got
    single = S.Schedule1F1B(stages[0], n_microbatches=4)
    assert schedule_orders(single, stages[:1], [8]) == {}


def test_torch_stages_are_patched_only_once_the_script_imports_them():
    """A rank installs the pipeline recorder before the script runs; importing
    ``torch.distributed.pipelining`` costs seconds, so a script without a pipeline must not pay
    it: the stage class is patched when the script imports it (a fresh interpreter, as a rank
    is), at once when it already has, and restored by ``uninstall``."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pardiag.collectors.pipeline_recorder import PipelineRecorder\n"
        "rec = PipelineRecorder(lambda: 0)\n"
        "assert rec.install()\n"
        "print('before', 'torch.distributed.pipelining' in sys.modules)\n"
        "from torch.distributed.pipelining.stage import _PipelineStageBase as B\n"
        "print('patched', hasattr(B.forward_one_chunk, '__wrapped__'))\n"
        "rec.uninstall()\n"
        "print('restored', hasattr(B.forward_one_chunk, '__wrapped__'))\n"
        "rec.install()\n"
        "print('again', hasattr(B.forward_one_chunk, '__wrapped__'))\n"
        "rec.install()\n"
        "print('once', not hasattr(B.forward_one_chunk.__wrapped__, '__wrapped__'))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["before", "False", "patched", "True", "restored", "False",
                                  "again", "True", "once", "True"]


def test_a_failed_export_leaves_no_uncompressed_json(tmp_path):
    """The trace is compressed from Kineto's JSON written beside it; when the export fails
    half-way the JSON is removed and the error is the caller's to report."""
    from pardiag.collectors.rank_entry import _export_trace

    class Profiler:
        def export_chrome_trace(self, path):
            with open(path, "wb") as f:
                f.write(b'{"traceEvents": [')
            raise OSError("disk full")

    partial = tmp_path / "rank3.trace.partial.json.gz"
    with pytest.raises(OSError, match="disk full"):
        _export_trace(Profiler(), partial)
    assert list(tmp_path.iterdir()) == []


def test_a_sigterm_as_the_stacks_file_is_made_leaves_no_file(tmp_path):
    """torchrun forwards Ctrl-C to the ranks as SIGTERM, which can come as a rank starts: the
    moment its stacks file exists, before the script. The rank stops with one line and exit
    code 143, and no empty stacks file is left behind."""
    import subprocess
    import sys

    from pardiag import layout

    (tmp_path / "s.py").write_text("raise SystemExit('the script must not run')\n")
    layout.sidecar_dir(tmp_path).mkdir()
    code = f"""
import os, signal
from pardiag.collectors import rank_entry
made = rank_entry._stack_dump_on_signal
def made_then_stopped(out, rank):
    f = made(out, rank)
    os.kill(os.getpid(), signal.SIGTERM)   # the launcher stops the job right here
    return f
rank_entry._stack_dump_on_signal = made_then_stopped
rank_entry.main({{"out": {str(tmp_path)!r}, "script": {str(tmp_path / "s.py")!r}, "args": [],
                 "wait": 0, "warmup": 0, "active": 1}})
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"})
    assert res.returncode == 143, res.stderr[-2000:]
    assert res.stderr.strip().splitlines() == [
        "pardiag: rank 0 stopped by SIGTERM: the launcher ended the job (another rank failed, "
        "or it was interrupted), before the script started"], res.stderr[-2000:]
    assert not layout.stacks_path(tmp_path, 0).exists()
