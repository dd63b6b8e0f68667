"""The script's parallel layout from its live objects (:func:`detect_parallelism`): DDP, FSDP1,
FSDP2, ZeRO, DeepSpeed, device meshes, pipeline stages and schedules; mesh-dimension names
(:func:`canonical_dim`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from pardiag.layout import microbatch_choices

from .comms import group_name
from .live_objects import live_instances, loaded
from .memory import local_bytes

_DIM_ALIASES = {"dp": "dp", "data": "dp", "dp_shard": "dp", "dp_replicate": "dp", "fsdp": "dp",
                "ddp": "dp", "dp_shard_cp": "dp", "hsdp": "dp", "tp": "tp", "tensor": "tp",
                "sp": "tp", "pp": "pp", "pipe": "pp", "pipeline": "pp", "ep": "ep",
                "expert": "ep", "moe": "ep", "cp": "cp", "context": "cp"}


def canonical_dim(name: str | None) -> str | None:
    """Mesh-dimension or group-description name → ``dp``/``tp``/``pp``/``ep``/``cp`` or None."""
    if not name:
        return None
    key = str(name).lower().removeprefix("mesh_")
    return _DIM_ALIASES.get(key)


@dataclasses.dataclass(frozen=True)
class _ParallelClasses:
    """The classes :func:`detect_parallelism` looks for; ``()`` for one whose module the script
    did not import (it has no instance)."""

    ddp: Any
    fsdp1: Any
    fsdp2: Any
    zero: Any
    mesh: Any
    stage: Any
    schedule: Any
    deepspeed: Any = ()

    def interesting(self) -> tuple:
        """The classes that exist, for one :func:`live_instances` pass."""
        return tuple(c for c in (self.ddp, self.fsdp1, self.fsdp2, self.zero, self.mesh,
                                 self.stage, self.schedule, self.deepspeed)
                     if isinstance(c, type))


def _parallel_classes() -> _ParallelClasses:
    """The parallel wrappers, meshes and pipeline classes, among the modules already imported
    (DDP always)."""
    from torch.nn.parallel import DistributedDataParallel

    # only the modules the script imported: this runs in the step after the profiler's window
    def cls(module: str, name: str):
        return (loaded(module, name) or ((),))[0]   # () when not imported: no instance

    return _ParallelClasses(
        ddp=DistributedDataParallel,
        fsdp1=cls("torch.distributed.fsdp", "FullyShardedDataParallel"),
        fsdp2=cls("torch.distributed.fsdp", "FSDPModule"),
        zero=cls("torch.distributed.optim", "ZeroRedundancyOptimizer"),
        mesh=cls("torch.distributed.device_mesh", "DeviceMesh"),
        stage=cls("torch.distributed.pipelining.stage", "_PipelineStageBase"),
        schedule=cls("torch.distributed.pipelining.schedules", "_PipelineSchedule"),
        deepspeed=cls("deepspeed.runtime.engine", "DeepSpeedEngine"))


@dataclasses.dataclass
class _ParallelScan:
    """What :func:`_scan_parallel` found among the live objects (see
    :func:`detect_parallelism`'s result for the meaning)."""

    wrappers: set[str] = dataclasses.field(default_factory=set)
    group_dims: dict[str, str] = dataclasses.field(default_factory=dict)
    meshes: list[dict] = dataclasses.field(default_factory=list)
    stages: list = dataclasses.field(default_factory=list)
    schedules: list = dataclasses.field(default_factory=list)
    reshard: set[bool] = dataclasses.field(default_factory=set)
    #: FSDP units with parameters; those that reshard after forward
    units: list[int] = dataclasses.field(default_factory=lambda: [0, 0])
    fsdp1_fwd_prefetch: set[bool] = dataclasses.field(default_factory=set)
    seen_mesh: set[tuple] = dataclasses.field(default_factory=set)
    ddp_cap: int | None = None
    ddp_params: list[int] | None = None
    deepspeed: dict | None = None
    #: DeepSpeed's pipeline engine: its pipeline, as :func:`_pipeline_of` returns it
    ds_pipeline: dict | None = None


def _note_ddp(scan: _ParallelScan, obj) -> None:
    """Record a DDP module: its group (dp), bucket cap and parameters' gradient bytes."""
    scan.wrappers.add("ddp")
    scan.group_dims.setdefault(group_name(obj.process_group), "dp")
    if isinstance(getattr(obj, "bucket_bytes_cap", None), int):
        scan.ddp_cap = obj.bucket_bytes_cap
    scan.ddp_params = [int(p.numel() * p.element_size())
                       for p in reversed(list(obj.module.parameters())) if p.requires_grad]


def _note_fsdp1(scan: _ParallelScan, obj) -> None:
    """Record an FSDP1 module: its group (dp), sharding strategy, unit and forward prefetch."""
    scan.wrappers.add("fsdp1")
    scan.group_dims.setdefault(group_name(obj.process_group), "dp")
    strategy = getattr(getattr(obj, "sharding_strategy", None), "name", None)
    if strategy in ("FULL_SHARD", "HYBRID_SHARD"):
        scan.reshard.add(True)
    elif strategy in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2"):
        scan.reshard.add(False)
    scan.units[0] += 1   # the root keeps its parameters for the backward
    scan.units[1] += (strategy in ("FULL_SHARD", "HYBRID_SHARD")
                      and not getattr(obj, "_is_root", False))
    if isinstance(getattr(obj, "forward_prefetch", None), bool):
        scan.fsdp1_fwd_prefetch.add(obj.forward_prefetch)


def _note_fsdp2(scan: _ParallelScan, obj) -> None:
    """Record an FSDP2 module: its shard group (dp), whether it reshards, its unit."""
    scan.wrappers.add("fsdp2")
    pg_group = obj._get_fsdp_state()._fsdp_param_group
    if pg_group is not None:
        info = pg_group.mesh_info
        if hasattr(info, "shard_process_group"):
            scan.group_dims.setdefault(group_name(info.shard_process_group), "dp")
        # reshard_after_forward=False keeps no post-forward mesh
        scan.reshard.add(pg_group.post_forward_mesh_info is not None)
        scan.units[0] += 1
        scan.units[1] += pg_group.post_forward_mesh_info is not None


def _note_deepspeed(scan: _ParallelScan, engine) -> None:
    """Record a DeepSpeed engine: its ZeRO stage (``zero1``/``zero2``/``zero3``; stage 0 is
    plain data parallel, ``deepspeed``), its data-parallel group (dp) and the ZeRO settings that
    decide its communication and memory (:func:`deepspeed_settings`)."""
    stage = int(engine.zero_optimization_stage() or 0)
    scan.wrappers.add(f"zero{stage}" if stage else "deepspeed")
    group = (getattr(engine.optimizer, "dp_process_group", None)
             or getattr(engine, "seq_data_parallel_group", None)
             or getattr(engine, "data_parallel_group", None))
    if group is not None:
        scan.group_dims.setdefault(group_name(group), "dp")
    scan.deepspeed = deepspeed_settings(engine, stage)
    if getattr(engine, "is_pipe_parallel", False) and hasattr(engine, "num_stages"):
        _note_deepspeed_pipeline(scan, engine)


def _note_deepspeed_pipeline(scan: _ParallelScan, engine) -> None:
    """Record DeepSpeed's pipeline engine: its stages (one per rank of the pipe group), this
    rank's stage, the microbatches of a step (``micro_batches``, DeepSpeed's
    ``gradient_accumulation_steps``), its pipe group (pp) and the order of its
    ``TrainSchedule`` at other microbatch counts (:func:`deepspeed_orders`)."""
    stages, m = int(engine.num_stages), int(engine.micro_batches)
    grid = getattr(engine, "grid", None)
    try:
        pp = grid.get_pipe_parallel_group() if grid is not None else None
    except Exception:   # a grid without one (DeepSpeed's own checks)
        pp = None
    if pp is not None:
        scan.group_dims.setdefault(group_name(pp), "pp")
    scan.ds_pipeline = {
        "schedule": "TrainSchedule", "microbatches": m, "stages": stages,
        "local_stages": [int(engine.stage_id)], "pp_group_size": stages,
        "orders": deepspeed_orders(stages, microbatch_choices(m)),
    }


def deepspeed_orders(stages: int, ms: list[int]) -> dict[str, dict[str, list[list]]]:
    """The order of forwards and backwards DeepSpeed's ``TrainSchedule`` runs on each stage
    (one stage per pipeline rank), for each microbatch count in ``ms``: its
    ``_step_to_micro_batch`` over the schedule's ``2 (m + stages - 1)`` steps, the steps of a
    microbatch that is no step of the stage left out (the schedule's own ``steps()`` does the
    same). Returns ``{m: {rank: [[stage, phase, microbatch], ...]}}`` (string keys, as
    :func:`schedule_orders`); ``{}`` when DeepSpeed's schedule cannot be imported."""
    try:
        from deepspeed.runtime.pipe.schedule import TrainSchedule
    except Exception:   # DeepSpeed missing or failing to import
        return {}
    out: dict[str, dict[str, list[list]]] = {}
    for m in ms:
        ranks: dict[str, list[list]] = {}
        for s in range(stages):
            sched = TrainSchedule(micro_batches=m, stages=stages, stage_id=s)
            seq = []
            for step in range(2 * (m + stages - 1)):
                mb, fwd = sched._step_to_micro_batch(step)
                if sched._valid_micro_batch(mb):
                    seq.append([s, "F" if fwd else "B", int(mb)])
            ranks[str(s)] = seq
        out[str(m)] = ranks
    return out


def deepspeed_settings(engine, stage: int) -> dict:
    """A DeepSpeed engine's ZeRO settings and its static memory by part (this rank's bytes).

    Settings: ``stage``, ``dp_size``, ``reduce_bucket_size`` and ``allgather_bucket_size``
    (elements), ``overlap_comm``, ``contiguous_gradients``, ``reduce_scatter``,
    ``prefetch_bucket_size`` (stage 3), ``gradient_accumulation_steps`` (micro-batches per
    optimizer step: stages 2 and 3 reduce the gradients on each), ``param_dtype``.

    Static memory (``static``: ``params_bytes``, ``grads_bytes``, ``optimizer_state_bytes``,
    ``params``, ``total_bytes``), from what the engine holds (the ZeRO paper, Rajbhandari et al.):
    parameters whole below stage 3, this rank's partition (``ds_tensor``) at stage 3; gradients
    whole at stage 0–1 and a 1/N partition from stage 2; the optimizer's fp32 master partition
    (``single_partition_of_fp32_groups``, ``fp32_partitioned_groups_flat``) plus its state
    (Adam's moments of that partition)."""
    cfg = {}
    for key, fn in (("reduce_bucket_size", "zero_reduce_bucket_size"),
                    ("allgather_bucket_size", "zero_allgather_bucket_size"),
                    ("overlap_comm", "zero_overlap_comm"),
                    ("contiguous_gradients", "zero_contiguous_gradients"),
                    ("reduce_scatter", "zero_reduce_scatter"),
                    ("prefetch_bucket_size", "zero_prefetch_bucket_size"),
                    ("gradient_accumulation_steps", "gradient_accumulation_steps")):
        try:
            v = getattr(engine, fn)()
        except Exception:  # a setting this DeepSpeed version does not have
            continue
        cfg[key] = v if isinstance(v, bool) else int(v) if isinstance(v, (int, float)) else v
    dp = int(getattr(engine, "dp_world_size", 0) or 1)
    params = [p for p in engine.module.parameters() if p.requires_grad]
    local = [getattr(p, "ds_tensor", None) if stage >= 3 else p for p in params]
    pbytes = sum(local_bytes(t) for t in local if isinstance(t, torch.Tensor))
    full = sum(int(getattr(p, "ds_numel", p.numel())) for p in params)
    elem = params[0].element_size() if params else 4
    gbytes = full * elem if stage < 2 else -(-full // dp) * elem
    opt = engine.optimizer
    master = [t for t in (getattr(opt, "single_partition_of_fp32_groups", None)
                          or getattr(opt, "fp32_partitioned_groups_flat", None) or [])
              if isinstance(t, torch.Tensor)]
    inner = getattr(opt, "optimizer", opt)
    state = getattr(inner, "state", {}) if isinstance(inner, torch.optim.Optimizer) else {}
    sbytes = sum(local_bytes(v) for s in state.values() for v in
                 (s.values() if isinstance(s, dict) else ()))
    obytes = sum(local_bytes(t) for t in master) + sbytes
    return {"stage": stage, "dp_size": dp, **cfg,
            "param_dtype": str(params[0].dtype).removeprefix("torch.") if params else None,
            "static": {"params_bytes": pbytes, "grads_bytes": gbytes,
                       "optimizer_state_bytes": obytes, "params": len(params),
                       "total_bytes": pbytes + gbytes + obytes}}


def _note_mesh(scan: _ParallelScan, obj) -> None:
    """Record a device mesh not seen yet: per dimension name its size, every group along it
    (global ranks, from the mesh's rank tensor) and this rank's process group's name.

    Which names are parallel dimensions is decided later, over every mesh at once, by the
    mesh-consistency rule (:func:`pardiag.analyzer.analyses.mesh.mesh_dims`): torchtitan's
    flattened (``dp``, ``dp_shard_cp``) and internal (``WORLD``, ``BATCH``, ``LOSS_MESH``,
    ``EFSDP``) meshes and size-1 dimensions are no dimensions of their own."""
    names = obj.mesh_dim_names or ()
    key = (tuple(names), tuple(obj.mesh.shape), tuple(obj.mesh.flatten().tolist()))
    if key in scan.seen_mesh:
        return
    scan.seen_mesh.add(key)
    dims, groups, members = {}, {}, {}
    for i, n in enumerate(names):
        dims[n] = int(obj.mesh.shape[i])
        along = obj.mesh.movedim(i, -1).reshape(-1, dims[n])
        members[n] = [[int(r) for r in row] for row in along.tolist()]
        try:
            groups[n] = group_name(obj.get_group(n))
        except (RuntimeError, ValueError, KeyError):
            continue
    scan.meshes.append({"dims": dims, "groups": groups, "members": members})


def _scan_parallel(found: list, c: _ParallelClasses) -> _ParallelScan:
    """Go through the live objects ``found`` (instances of ``c``'s classes) once; returns what
    they say. An object that is gone (a weak reference) is skipped."""
    scan = _ParallelScan()
    for obj in found:
        try:
            if isinstance(obj, c.ddp):
                _note_ddp(scan, obj)
            elif c.fsdp1 and isinstance(obj, c.fsdp1):
                _note_fsdp1(scan, obj)
            elif c.fsdp2 and isinstance(obj, c.fsdp2):
                _note_fsdp2(scan, obj)
            elif isinstance(obj, c.zero):
                scan.wrappers.add("zero1")
                scan.group_dims.setdefault(group_name(obj.process_group), "dp")
            elif isinstance(obj, c.mesh):
                _note_mesh(scan, obj)
            elif c.stage and isinstance(obj, c.stage):
                scan.stages.append(obj)
            elif c.schedule and isinstance(obj, c.schedule):
                scan.schedules.append(obj)
            elif c.deepspeed and isinstance(obj, c.deepspeed):
                _note_deepspeed(scan, obj)
        except ReferenceError:  # a weakly referenced object that is gone
            continue
    return scan


def _pipeline_of(scan: _ParallelScan) -> dict | None:
    """The pipeline's schedule and stages (None without any); marks the wrapper and the
    stages' groups (pp) in ``scan``."""
    if not (scan.stages or scan.schedules):
        if scan.ds_pipeline is not None:
            scan.wrappers.add("pipeline")
        return scan.ds_pipeline
    stages, schedules = scan.stages, scan.schedules
    scan.wrappers.add("pipeline")
    for st in stages:
        scan.group_dims.setdefault(group_name(st.group), "pp")
    sched = schedules[0] if schedules else None
    m = getattr(sched, "_n_microbatches", None)
    return {
        "schedule": type(sched).__name__ if sched else None,
        "microbatches": m,
        "stages": stages[0].num_stages if stages else None,
        "local_stages": sorted(st.stage_index for st in stages),
        "pp_group_size": stages[0].group_size if stages else None,
        # kept apart from the layout (rank_entry writes it to the pipeline sidecar)
        "orders": schedule_orders(sched, stages, microbatch_choices(m)) if (
            sched is not None and stages and isinstance(m, int)) else {},
    }


def schedule_orders(sched, stages: list, ms: list[int]) -> dict[str, dict[str, list[list]]]:
    """The order of actions ``type(sched)`` builds for each microbatch count in ``ms`` (its
    ``pipeline_order``, every pipeline rank), for schedules of several stages per rank (GPipe's
    and 1F1B's orders pardiag generates; their classes run their own loop). The class is built
    on stand-ins of the rank's stages, which carry only what its constructor reads, so the run's
    stages are not touched. A count the class refuses is left out. Returns ``{m: {rank:
    [[stage, phase, microbatch], ...]}}`` (string keys), a combined action as its parts."""
    import types

    from torch.distributed.pipelining.schedules import PipelineScheduleMulti

    if not isinstance(sched, PipelineScheduleMulti):
        return {}
    stand_ins = [types.SimpleNamespace(
        group_size=st.group_size, group_rank=st.group_rank, stage_index=st.stage_index,
        num_stages=st.num_stages, is_first=st.is_first, is_last=st.is_last,
        submod=st.submod) for st in sorted(stages, key=lambda x: x.stage_index)]
    out: dict[str, dict[str, list[list]]] = {}
    for m in ms:
        try:
            order = type(sched)(stand_ins, n_microbatches=m).pipeline_order
        except Exception:   # a count the schedule does not take (torch's own checks)
            continue
        ranks: dict[str, list[list]] = {}
        for r, acts in order.items():
            seq = []
            for a in acts:
                for x in (getattr(a, "sub_actions", None) or (a,)) if a is not None else ():
                    ph = str(getattr(x.computation_type, "value", x.computation_type))
                    if ph in ("F", "B", "I", "W"):
                        seq.append([int(x.stage_index), ph, int(x.microbatch_index)])
            ranks[str(r)] = seq
        out[str(m)] = ranks
    return out


def detect_parallelism(objects: list | None = None) -> dict:
    """What the live objects of the script say about its parallel layout.

    Scans the garbage collector's objects once for DDP, FSDP1, FSDP2 modules,
    ZeroRedundancyOptimizer, device meshes, pipeline stages and schedules — or ``objects``, the
    result of one :func:`live_instances` pass over :func:`scan_classes` shared with
    :func:`model_shapes`.

    Returns:
        ``{"wrappers": [...], "meshes": [{"dims": {name: size}, "groups": {name: pg_name},
        "members": {name: [[global ranks of each group along it]]}}],
        "pipeline": {...} | None, "group_dims": {pg_name: dim}, "fsdp_reshard_after_forward":
        bool | None (FSDP2's setting; FSDP1: its sharding strategy, FULL_SHARD / HYBRID_SHARD →
        true, SHARD_GRAD_OP → false), "fsdp1_forward_prefetch": bool | None,
        "fsdp_units": int | None (FSDP modules holding parameters: each gathers them in the
        forward and reduce-scatters their gradients once per step), "fsdp_resharding_units":
        int | None (those of them that reshard after the forward and gather again in the
        backward),
        "ddp_bucket_cap_bytes": int | None, "ddp_param_bytes": [int] | None,
        "deepspeed": dict | None (:func:`deepspeed_settings`)}``
        (``ddp_param_bytes``: gradient bytes of each trainable parameter of the DDP module, last
        registered first — the order DDP's buckets take them in, for the bucket-size what-if).
    """
    c = _parallel_classes()
    interesting = c.interesting()
    found = (live_instances(interesting) if objects is None
             else [o for o in objects if isinstance(o, interesting)])
    scan = _scan_parallel(found, c)
    pipeline = _pipeline_of(scan)
    reshard, units, fsdp1_fwd_prefetch = scan.reshard, scan.units, scan.fsdp1_fwd_prefetch
    return {"wrappers": sorted(scan.wrappers), "meshes": scan.meshes, "pipeline": pipeline,
            "group_dims": scan.group_dims,
            # the root module may keep its parameters; any resharding block means "true"
            "fsdp_reshard_after_forward": any(reshard) if reshard else None,
            "fsdp1_forward_prefetch": all(fsdp1_fwd_prefetch) if fsdp1_fwd_prefetch else None,
            "fsdp_units": units[0] or None, "fsdp_resharding_units": units[1] if units[0] else None,
            "ddp_bucket_cap_bytes": scan.ddp_cap, "ddp_param_bytes": scan.ddp_params,
            "deepspeed": scan.deepspeed}
