"""The run's setup: what was run, how it was split and what it ran on.

``pardiag compare`` diffs two runs' setups, and matches a run's setup against the ``params`` of
another run's recommendations (the change it was told to make). Everything comes from what
pardiag recorded (``run.json``, ``rank{R}.meta.json``, the pipeline sidecars) or, for traces
recorded without pardiag, from what the traces state (``distributedInfo``, ``deviceProperties``,
the inferred layout); a field neither holds is None and listed in :attr:`RunSetup.unknown`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pardiag.layout import contention_note

from ..trace import vocab
from ..trace.classify import normalize_schedule
from ..trace.traceset import TraceSet
from .layout import LayoutResult

#: Labels of the setup fields, in the order a comparison lists them.
SETUP_LABELS = {
    "script": "script",
    "script_args": "script arguments",
    "world_size": "world size",
    "nnodes": "nodes",
    "hosts": "hosts (ranks per host)",
    "dims": "parallel degrees",
    "strategies": "strategies",
    "pipeline_schedule": "pipeline schedule",
    "pipeline_stages": "pipeline stages",
    "stages_per_rank": "stages per rank",
    "microbatches": "microbatches",
    "layers_per_stage": "layers per stage (child modules)",
    "ddp_bucket_cap_bytes": "DDP bucket cap (bytes)",
    "fsdp_reshard_after_forward": "FSDP reshard after forward",
    "fsdp1_forward_prefetch": "FSDP1 forward prefetch",
    "zero_stage": "ZeRO stage (DeepSpeed)",
    "zero_reduce_bucket_size": "ZeRO reduce bucket (elements)",
    "zero_allgather_bucket_size": "ZeRO all-gather bucket (elements)",
    "zero_overlap_comm": "ZeRO overlap_comm",
    "backend": "backend",
    "torch_version": "torch",
    "nccl_version": "NCCL",
    "devices": "devices",
    "cpu_count": "CPUs per host",
    "profiler_schedule": "profiler schedule (wait, warmup, active)",
    "contention": "ranks contending for cores",
    "env": "environment (NCCL_*, TORCH_*, PYTORCH_*)",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSetup:
    """What a run was: one field per setting (None: not known for this run).

    Attributes:
        source: ``"recorded"`` (a ``pardiag profile`` run folder) or ``"traces"`` (traces
            recorded without pardiag: only what they state is known).
        layout_source: where ``dims``, ``strategies`` and the pipeline fields come from:
            ``"recorded"`` or ``"inferred from traces"``.
        script: the training script as given to ``pardiag profile``.
        script_args: its arguments.
        world_size: ranks of the job (``run.json``, else ``distributedInfo.world_size``).
        nnodes: hosts the ranks ran on.
        hosts: ``{host: [ranks]}``.
        dims: parallel degrees, ``{"dp": 2, "pp": 2}``.
        strategies: ``["ddp"]``, ``["fsdp2", "tp"]``, ``["pipeline"]`` …
        pipeline_schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved"`` (other schedules: torch's
            class name, lower case).
        pipeline_stages: stages in all.
        stages_per_rank: stages per rank (v).
        microbatches: microbatches per step.
        layers_per_stage: child modules of each stage's module, stage order (what a
            ``rebalance_stages`` recommendation's ``layers_per_stage`` counts).
        ddp_bucket_cap_bytes: DDP's ``bucket_cap_mb`` in bytes.
        fsdp_reshard_after_forward: FSDP2 ``reshard_after_forward`` (FSDP1: True for
            ``FULL_SHARD``, False for ``SHARD_GRAD_OP``).
        fsdp1_forward_prefetch: FSDP1 ``forward_prefetch``.
        zero_stage, zero_reduce_bucket_size, zero_allgather_bucket_size, zero_overlap_comm:
            DeepSpeed's ``zero_optimization`` settings (stage; bucket sizes in elements;
            ``overlap_comm``), as its engine held them.
        backend: process group backend(s).
        torch_version: torch's version(s).
        nccl_version: NCCL's version(s).
        devices: device names (GPU names, or the CPU's).
        cpu_count: CPUs per host.
        profiler_schedule: ``[wait, warmup, active]`` of ``pardiag profile``.
        contention: the sentence :func:`pardiag.layout.contention_note` says of the run's CPU
            ranks when they contended for cores, ``"none"`` when a recorded run's did not.
        env: the lowest rank's ``NCCL_*``, ``TORCH_*`` and ``PYTORCH_*`` environment variables
            (:data:`pardiag.layout.ENV_PREFIXES`; None for runs recorded before ``pardiag
            profile`` recorded them, and for traces from elsewhere).
        unknown: the fields above that are None, in :data:`SETUP_LABELS` order.
    """

    source: str
    layout_source: str | None = None
    script: str | None = None
    script_args: list[str] | None = None
    world_size: int | None = None
    nnodes: int | None = None
    hosts: dict[str, list[int]] | None = None
    dims: dict[str, int] | None = None
    strategies: list[str] | None = None
    pipeline_schedule: str | None = None
    pipeline_stages: int | None = None
    stages_per_rank: int | None = None
    microbatches: int | None = None
    layers_per_stage: list[int] | None = None
    ddp_bucket_cap_bytes: int | None = None
    fsdp_reshard_after_forward: bool | None = None
    fsdp1_forward_prefetch: bool | None = None
    zero_stage: int | None = None
    zero_reduce_bucket_size: int | None = None
    zero_allgather_bucket_size: int | None = None
    zero_overlap_comm: bool | None = None
    backend: str | list[str] | None = None
    torch_version: str | list[str] | None = None
    nccl_version: str | list[str] | None = None
    devices: list[str] | None = None
    cpu_count: int | list[int] | None = None
    profiler_schedule: list[int] | None = None
    contention: str | None = None
    env: dict[str, str] | None = None
    unknown: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """The fields as a JSON-ready dict (``unknown`` as a list)."""
        return {**dataclasses.asdict(self), "unknown": list(self.unknown)}


def _one(values) -> Any:
    """None for no value, the value when all agree, else the sorted distinct values."""
    vals = sorted({str(v) if not isinstance(v, (int, float)) else v for v in values
                   if v is not None}, key=str)
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else vals


def schedule_name(name: str | None) -> str | None:
    """A pipeline schedule as setups and recommendations name it: ``"gpipe"``, ``"1f1b"``,
    ``"interleaved"``, else torch's class name in lower case without ``schedule``."""
    if not name:
        return None
    try:
        return normalize_schedule(str(name))
    except ValueError:
        return str(name).lower().removeprefix("schedule")


def _layers_per_stage(traces: TraceSet) -> list[int] | None:
    """Child modules per stage from the pipeline sidecars' ``layers`` rows (each stage's module
    children, recorded by ``pardiag profile``)."""
    seen: dict[int, set] = {}
    for doc in traces.sidecars.get("pipeline", {}).values():
        for row in doc.layers:
            seen.setdefault(row.stage, set()).add(row.index)
    if not seen or sorted(seen) != list(range(len(seen))):
        return None
    return [len(seen[s]) for s in range(len(seen))]


def _dist_infos(traces: TraceSet) -> list[dict]:
    infos = [vocab.DISTRIBUTED_INFO.get(t.metadata) for t in traces.ranks.values()]
    return [i for i in infos if isinstance(i, dict)]


def compute_setup(traces: TraceSet, lay: LayoutResult) -> RunSetup:
    """The setup of ``traces`` (see :class:`RunSetup`); ``lay`` is the run's layout
    (:func:`pardiag.analyzer.analyses.layout.compute_layout`)."""
    run = traces.run_info
    metas = [traces.rank_meta[r] for r in sorted(traces.rank_meta)]
    infos = _dist_infos(traces)
    recorded = run is not None or bool(metas)
    meta_layouts = [m.layout for m in metas if isinstance(m.layout, dict)]
    run_layout = (run.layout if run and isinstance(run.layout, dict) else None) or {}

    def layout_value(key):
        if key in run_layout:
            return run_layout[key]
        return next((m[key] for m in meta_layouts if m.get(key) is not None), None)

    pipe = lay.pipeline if isinstance(lay.pipeline, dict) else None
    world = run.world_size if run and run.world_size else _one(
        w for i in infos if isinstance(w := vocab.DIST_WORLD_SIZE.get(i), int))
    if isinstance(world, list):
        world = max(world)
    hosts = {str(h): list(r) for h, r in (lay.nodes or {}).items()} or None
    devices = _one(m.device_name for m in metas)
    if devices is None:   # traces from elsewhere: the GPUs the trace describes
        devices = _one(vocab.DEVICE_NAME.get(d) for t in traces.ranks.values()
                       for d in (vocab.DEVICE_PROPERTIES.get(t.metadata) or [])
                       if isinstance(d, dict))
    if devices is not None and not isinstance(devices, list):
        devices = [devices]
    env = next((dict(m.env) for m in metas if m.env is not None), None)
    sch = run.schedule if run else None
    ds = layout_value("deepspeed") or {}
    setup = dict(
        source="recorded" if recorded else "traces",
        layout_source=lay.source if (lay.dims or pipe) else None,
        script=run.script if run else None,
        script_args=list(run.script_args) if run and run.script else None,
        world_size=world,
        nnodes=(run.nnodes if run and run.nnodes else (len(hosts) if hosts else None)),
        hosts=hosts,
        dims=dict(lay.dims) or None,
        strategies=list(lay.strategies) or None,
        pipeline_schedule=schedule_name(pipe.get("schedule")) if pipe else None,
        pipeline_stages=pipe.get("stages") if pipe else None,
        stages_per_rank=pipe.get("stages_per_rank") if pipe else None,
        microbatches=pipe.get("microbatches") if pipe else None,
        layers_per_stage=_layers_per_stage(traces),
        ddp_bucket_cap_bytes=layout_value("ddp_bucket_cap_bytes"),
        fsdp_reshard_after_forward=layout_value("fsdp_reshard_after_forward"),
        fsdp1_forward_prefetch=layout_value("fsdp1_forward_prefetch"),
        zero_stage=ds.get("stage"),
        zero_reduce_bucket_size=ds.get("reduce_bucket_size"),
        zero_allgather_bucket_size=ds.get("allgather_bucket_size"),
        zero_overlap_comm=ds.get("overlap_comm"),
        backend=(run.backend if run and run.backend else None) or _one(
            [m.backend for m in metas] + [vocab.DIST_BACKEND.get(i) for i in infos]),
        torch_version=(run.torch_version if run and run.torch_version else None)
        or _one(m.torch_version for m in metas),
        nccl_version=_one([m.nccl_version for m in metas] + [i.get("nccl_version")
                                                             for i in infos]),
        devices=devices,
        cpu_count=_one(m.cpu_count for m in metas),
        profiler_schedule=[sch.wait, sch.warmup, sch.active] if sch else None,
        contention=(contention_note(metas) or "none") if recorded and metas else None,
        env=env,
    )
    return RunSetup(**setup, unknown=tuple(k for k in SETUP_LABELS
                                           if k in applicable_fields(setup) and setup[k] is None))


def applicable_fields(setup: dict) -> set[str]:
    """The fields a run of this kind has (what pardiag records for every run, and the
    settings of the strategies it uses): those of them that are None are unknown; the others
    are None because they do not apply (no pipeline, no FSDP)."""
    out = {"script", "script_args", "world_size", "nnodes", "hosts", "dims", "strategies",
           "backend", "torch_version", "devices", "profiler_schedule", "env"}
    if "nccl" in str(setup.get("backend") or "").lower():
        out.add("nccl_version")
    strategies = set(setup.get("strategies") or ())
    if "pipeline" in strategies or setup.get("pipeline_schedule"):
        out |= {"pipeline_schedule", "pipeline_stages", "stages_per_rank", "microbatches",
                "layers_per_stage"}
    if "ddp" in strategies:
        out.add("ddp_bucket_cap_bytes")
    if strategies & {"fsdp1", "fsdp2"}:
        out.add("fsdp_reshard_after_forward")
    if "fsdp1" in strategies:
        out.add("fsdp1_forward_prefetch")
    if (strategies & {"zero1", "zero2", "zero3", "deepspeed"}
            and setup.get("zero_stage") is not None):
        out |= {"zero_stage", "zero_reduce_bucket_size", "zero_allgather_bucket_size",
                "zero_overlap_comm"}
    return out
