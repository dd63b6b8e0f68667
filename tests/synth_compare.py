"""Planted pairs of runs for ``pardiag compare``: every delta between them is known exactly."""

from __future__ import annotations

from pathlib import Path

from .synth import TraceBuilder, record, write_sidecar

#: Extra idle at the end of each profiled step (µs): the steps' spread, the same in every run.
JITTER = (0.0, 10.0, 20.0, 30.0)
#: Time between the starts of two profiled steps (µs); longer than any step.
STEP_GAP = 10_000.0


def ddp_run(out: Path, *, compute_us: float, late_us: float, comm_us: float = 100.0,
            ranks: int = 2, static_bytes: int = 4_000_000, peak_bytes: int = 3_000_000,
            script_args=("--steps", "6"), env: dict | None = None,
            jitter=JITTER, run_extra: dict | None = None,
            meta_extra: dict | None = None) -> Path:
    """A pardiag-style CPU/gloo data-parallel run (older layout: sidecars beside the traces).

    Per profiled step ``s`` (``ProfilerStep#s`` of ``compute + late + comm + jitter[s]`` µs on
    every rank): ``aten::mm`` for ``compute_us`` on every rank; rank 1 then idles ``late_us``
    (a planted straggler) while the others already wait in a ``gloo:all_reduce``, which every
    rank leaves ``comm_us`` after rank 1 arrived; ``jitter[s]`` µs idle close the step.

    So, per rank and step: compute only = compute_us; rank 0 (and any rank but 1): exposed
    communication = late + comm (waiting late, transfer comm), idle = jitter; rank 1: exposed
    = comm (transfer), idle = late + jitter. The step's span (every rank) = compute + late +
    comm + jitter[s]. Static memory ``static_bytes`` (parameters, gradients and optimizer
    state 1:1:2) and a peak allocated of ``peak_bytes`` per rank. ``run_extra``: more fields
    of run.json (e.g. the host probes); ``meta_extra``: more fields of every rank's metadata
    (e.g. its threads and CPU affinity).
    """
    out.mkdir(parents=True, exist_ok=True)
    group = list(range(ranks))
    for r in range(ranks):
        b = TraceBuilder(rank=r, world_size=ranks, backend="gloo")
        b.thread_name(1, "thread 1 (python3)").thread_name(2, "thread 2 (pt_gloo_runloop)")
        recs = []
        for s, j in enumerate(jitter, start=1):
            t0 = STEP_GAP * s
            end = t0 + compute_us + late_us + comm_us
            b.step(s, t0, compute_us + late_us + comm_us + j)
            b.cpu("aten::mm", t0, compute_us)
            arrive = t0 + compute_us + (late_us if r == 1 else 0.0)
            b.cpu("gloo:all_reduce", arrive, end - arrive, tid=2, cat="user_annotation")
            recs.append(record("all_reduce", s, arrive, end, ranks=group, nbytes=1_000_000))
        b.events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 100,
                         "tid": 1, "ts": STEP_GAP + 1, "args": {
                             "Total Allocated": peak_bytes, "Total Reserved": 0, "Bytes": 1,
                             "Device Type": 0, "Device Id": -1}})
        b.write(out / f"rank{r}.trace.json")
        write_sidecar(out / f"rank{r}.comms.json", "comms", r, {
            "process_groups": [{"name": "0", "desc": "default_pg", "ranks": group,
                                "size": ranks, "dim": "dp"}], "records": recs})
        q = static_bytes // 4
        write_sidecar(out / f"rank{r}.meta.json", "rank", r, {
            "host": "h0", "world_size": ranks, "torch_version": "2.13.0+cpu", "backend": "gloo",
            "device": "cpu", "device_name": "x86_64", "cpu_count": 2,
            "memory": {"static": {"params_bytes": q, "grads_bytes": q,
                                  "optimizer_state_bytes": 2 * q, "total_bytes": static_bytes},
                       "peak_rss_bytes": 100_000_000},
            "layout": {"dims": {"dp": ranks}, "strategies": ["ddp"], "group_dims": {"0": "dp"},
                       "ddp_bucket_cap_bytes": 25 * 2**20},
            **({"env": env} if env is not None else {}), **(meta_extra or {})})
    write_sidecar(out / "run.json", "run", None, {
        "command": "pardiag profile train.py", "script": "train.py",
        "script_args": list(script_args), "world_size": ranks, "nproc_per_node": ranks,
        "nnodes": 1, "exit_code": 0, "nodes": {"h0": group}, "backend": "gloo",
        "torch_version": "2.13.0+cpu",
        "layout": {"dims": {"dp": ranks}, "strategies": ["ddp"]}, **(run_extra or {})})
    return out


def pipeline_run(out: Path, microbatches: int) -> Path:
    """GPipe over 2 ranks with ``microbatches`` microbatches: forward 10 µs and backward 20 µs
    per microbatch and stage, no gap but the pipeline's own; two identical steps 1000 µs apart
    (the first profiled). Rank 0 runs its forwards back to back from 0, rank 1 each forward
    10 µs later; rank 1 runs the backwards from the last forward's end, rank 0 each 20 µs
    later. Window = 10·(m + 1) + 20·(m + 1) µs, busy = 30·m µs per rank: bubble 30 µs,
    100 · 30 / (30·m + 30) % = (p−1)/(m+p−1) for p = 2 (Narayanan et al.)."""
    out.mkdir(parents=True, exist_ok=True)
    m = microbatches
    chunks = {0: [], 1: []}
    for mb in range(m):
        chunks[0].append(("F", mb, 10 * mb, 10 * mb + 10))
        chunks[1].append(("F", mb, 10 * mb + 10, 10 * mb + 20))
    last_f = 10 * m + 10
    for i, mb in enumerate(reversed(range(m))):
        chunks[1].append(("B", mb, last_f + 20 * i, last_f + 20 * i + 20))
        chunks[0].append(("B", mb, last_f + 20 * i + 20, last_f + 20 * i + 40))
    for r, cs in chunks.items():
        b = TraceBuilder(rank=r, backend="gloo")
        b.step(0, 0, 100)
        b.write(out / f"rank{r}.trace.json")
        recs = []
        for step in (1, 2):
            recs += [{"stage": r, "microbatch": mb, "phase": ph, "start_us": s + 1000 * step,
                      "end_us": e + 1000 * step, "optimizer_step": step, "profiled": step == 1}
                     for ph, mb, s, e in cs]
        write_sidecar(out / f"rank{r}.pipeline.json", "pipeline", r, {"records": recs})
    write_sidecar(out / "run.json", "run", None, {
        "script": "train_pp.py", "script_args": ["--microbatches", str(m)], "world_size": 2,
        "layout": {"dims": {"pp": 2}, "strategies": ["pipeline"], "pipeline": {
            "schedule": "ScheduleGPipe", "stages": 2, "microbatches": m, "pp_group_size": 2,
            "stages_per_rank": 1}}})
    return out
