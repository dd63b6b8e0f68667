"""The report JSON's structure objects as types (see :mod:`.schema`): the layout and its
process groups, the run's setup, overlap per dimension, the critical path and MoE routing."""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

from .schema_ranks import NAN, Number


class LayoutPipeline(msgspec.Struct, kw_only=True, frozen=True):
    """The pipeline's schedule, stages and microbatches (``layout.pipeline``).

    Attributes:
        schedule: torch's schedule class, e.g. ``Schedule1F1B``. Null/absent: ``null`` when no
            schedule object was found.
        microbatches: Microbatches per step. Null/absent: ``null`` when unknown.
        stages: Stages in all. Null/absent: ``null`` when unknown.
        local_stages: The stages of the rank that recorded the layout (rank 0). Null/absent:
            recorded only.
        pp_group_size: Ranks per pipeline. Null/absent: ``null`` when unknown.
        stages_per_rank: Stages per rank (v). Null/absent: ``null`` when unknown.
        stage_ranks: The rank that runs each stage. Null/absent: inferred only.
        microbatches_from: ``"ranges"`` (per-microbatch ranges) or ``"sends"`` (estimated from
            stage 0's sends per step). Null/absent: inferred only; ``null`` when unknown.
    """

    schedule: str | None = None
    microbatches: int | None = None
    stages: int | None = None
    local_stages: list[int] | UnsetType = UNSET
    pp_group_size: int | None = None
    stages_per_rank: int | None = None
    stage_ranks: dict[str, int] | UnsetType = UNSET
    microbatches_from: str | None | UnsetType = UNSET


class ProcessGroupRow(msgspec.Struct, kw_only=True, frozen=True):
    """One process group (``layout.groups[]``).

    Attributes:
        dim: The group's dimension (``dp``, ``tp``, ``pp``, ``ep``, ``dp_shard``, …; ``edp``
            for an expert-data-parallel group of a folded layout: see ``layout.folded``).
            Null/absent: ``null`` when not known (e.g. ``default_pg``).
        pg: Process group name.
        desc: Its description (``default_pg``, ``mesh_tp``, …). Null/absent: ``""`` when none.
        ranks: Member ranks.
        size: Number of members.
        nodes: Hosts spanned. Null/absent: ``null`` when hosts are unknown.
        spans_nodes: The group spans more than one host. Null/absent: ``null`` when hosts are
            unknown.
    """

    dim: str | None = None
    pg: str
    desc: str = ""
    ranks: list[int] = msgspec.field(default_factory=list)
    size: int = 0
    nodes: int | None = None
    spans_nodes: bool | None = None


class LayoutSection(msgspec.Struct, kw_only=True, frozen=True):
    """The parallel layout, recorded or inferred (``layout``).

    Attributes:
        source: ``"recorded"`` or ``"inferred from traces"``.
        dims: Parallel degrees, e.g. ``{"dp": 2, "tp": 2}``. The keys are usually ``dp``,
            ``tp``, ``pp``, ``ep``, ``cp``; a recorded mesh dimension with no canonical name
            keeps its own name. An inferred layout holds only the degrees the traces determine.
            Null/absent: ``{}`` when unknown.
        strategies: Sorted: ``ddp``, ``fsdp1``, ``fsdp2``, ``fsdp`` (FSDP whose collectives
            are functional and which no wrapper names: SimpleFSDP, torch.compile'd FSDP,
            inferred from their order), ``zero1``/``zero2``/``zero3`` (``zero`` when the stage
            is unknown), ``deepspeed``, ``tp``, ``ep``, ``cp`` (sequence/context parallelism),
            ``pipeline``. Null/absent: ``[]`` when none was detected.
        pipeline: The pipeline's schedule, stages and microbatches. Null/absent: ``null``
            without a pipeline.
        nodes: The ranks on each host. Null/absent: ``{}`` when hosts are unknown (traces from
            elsewhere).
        groups: Process groups (from pardiag's records, else from the traces'
            ``distributedInfo.pg_config``). Null/absent: ``[]`` when unknown.
        folded: ``{"ep": "dp"}`` when expert parallelism is folded into data parallelism: the
            dense weights are data parallel over groups that each hold whole expert-parallel
            groups, and each expert's gradients are reduced over its expert-data-parallel
            group (the groups whose ``dim`` is ``edp``, ``dp / ep`` ranks each); ``dp`` and
            ``ep`` then do not multiply to the world. Null/absent: ``{}`` when nothing is
            folded.
        evidence: What each inferred conclusion rests on, one line each. Null/absent: absent
            when recorded.
        not_inferred: What could not be inferred, or is only estimated and how. Null/absent:
            absent when recorded; ``[]`` when nothing.
        note: That the layout is inferred, not recorded. Null/absent: absent when recorded.
    """

    source: str = ""
    dims: dict[str, int] = msgspec.field(default_factory=dict)
    strategies: list[str] = msgspec.field(default_factory=list)
    pipeline: LayoutPipeline | None = None
    nodes: dict[str, list[int]] = msgspec.field(default_factory=dict)
    groups: list[ProcessGroupRow] = msgspec.field(default_factory=list)
    folded: dict[str, str] = msgspec.field(default_factory=dict)
    evidence: list[str] | UnsetType = UNSET
    not_inferred: list[str] | UnsetType = UNSET
    note: str | UnsetType = UNSET


class SetupSection(msgspec.Struct, kw_only=True, frozen=True):
    """What was run and on what, one field per setting (``setup``; what ``pardiag compare`` diffs).
    A field that applies to the run but that no source holds is None and listed in ``unknown``.

    Attributes:
        source: ``"recorded"`` (a ``pardiag profile`` run folder) or ``"traces"``.
        layout_source: Where ``dims``, ``strategies`` and the pipeline fields come from:
            ``"recorded"`` or ``"inferred from traces"``. Null/absent: ``null`` without degrees
            or a pipeline.
        script: The training script, as given to ``pardiag profile``. Null/absent: ``null`` for
            traces.
        script_args: Its arguments. Null/absent: ``null`` for traces.
        world_size: Ranks of the job. Null/absent: ``null`` when unknown.
        nnodes: Hosts. Null/absent: ``null`` when unknown.
        hosts: The ranks on each host. Null/absent: ``null`` when unknown.
        dims: Parallel degrees, as in ``layout.dims``. Null/absent: ``null`` when unknown.
        strategies: As in ``layout.strategies``. Null/absent: ``null`` when none.
        pipeline_schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved"``, or another schedule's
            torch class name in lower case without ``schedule``. Null/absent: ``null`` without a
            pipeline.
        pipeline_stages: Stages in all. Null/absent: ``null`` without a pipeline.
        stages_per_rank: Stages per rank. Null/absent: ``null`` without a pipeline.
        microbatches: Microbatches per step. Null/absent: ``null`` without a pipeline.
        layers_per_stage: Child modules of each stage's module, in stage order. Null/absent:
            ``null`` unless pardiag recorded them.
        ddp_bucket_cap_bytes: DDP's ``bucket_cap_mb``, in bytes. Unit: bytes. Null/absent:
            ``null`` without DDP, or when not recorded.
        fsdp_reshard_after_forward: FSDP2 ``reshard_after_forward``. For FSDP1: ``true`` for
            ``FULL_SHARD``, ``false`` for ``SHARD_GRAD_OP``. Null/absent: ``null`` without FSDP,
            or when not recorded.
        fsdp1_forward_prefetch: FSDP1 ``forward_prefetch``. Null/absent: ``null`` without FSDP1,
            or when not recorded.
        zero_stage: DeepSpeed's ZeRO stage (0–3), as its engine held it. Null/absent: ``null``
            without DeepSpeed.
        zero_reduce_bucket_size: DeepSpeed's ``zero_optimization.reduce_bucket_size``. Unit:
            elements. Null/absent: ``null`` without DeepSpeed.
        zero_allgather_bucket_size: DeepSpeed's ``zero_optimization.allgather_bucket_size``.
            Unit: elements. Null/absent: ``null`` without DeepSpeed.
        zero_overlap_comm: DeepSpeed's ``zero_optimization.overlap_comm``. Null/absent: ``null``
            without DeepSpeed.
        backend: Process group backend(s) (a list when ranks differ). Null/absent: ``null`` when
            unknown.
        torch_version: torch version(s). Null/absent: ``null`` when unknown.
        nccl_version: NCCL version(s). Null/absent: ``null`` when unknown.
        devices: Device names (GPU names, or the CPU's). Null/absent: ``null`` when unknown.
        cpu_count: CPUs per host. Null/absent: ``null`` when unknown.
        profiler_schedule: ``[wait, warmup, active]`` of ``pardiag profile``. Null/absent:
            ``null`` for traces.
        contention: How the run's CPU ranks contended for the host's cores (more intra-op
            threads than cores, or cores shared), in one sentence; ``"none"`` when they did
            not. Null/absent: ``null`` for traces.
        env: The lowest rank's ``NCCL_*``, ``TORCH_*`` and ``PYTORCH_*`` environment variables.
            Null/absent: ``null`` for traces, and for runs recorded before pardiag recorded
            them.
        unknown: The fields above that apply to the run but are ``null``, in a fixed order.
            Null/absent: ``[]`` when none.
    """

    source: str = ""
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
    unknown: list[str] = msgspec.field(default_factory=list)


class DimOverlapSummary(msgspec.Struct, kw_only=True, frozen=True):
    """Overlap with one dimension's communication over its ranks
    (``overlap_per_dimension.summary[]``).

    Attributes:
        dim: Dimension.
        ranks: Ranks with this dimension.
        comm_us: |C_d| (in ``summary[]``: the mean over ranks). Unit: µs.
        exposed_us: |C_d| − overlap (in ``summary[]``: the mean over ranks). Unit: µs.
        overlap_pct: Overlap / |C_d| (in ``summary[]``: Σ overlap / Σ comm). Unit: % of the
            dimension's comm. Null/absent: ``null`` when |C_d| is 0.
    """

    dim: str
    ranks: int = 0
    comm_us: Number = NAN
    exposed_us: Number = NAN
    overlap_pct: Number | None = None


class DimOverlapRank(msgspec.Struct, kw_only=True, frozen=True):
    """Overlap of one rank with one dimension's communication
    (``overlap_per_dimension.per_rank[]``).

    Attributes:
        rank: The rank.
        dim: Dimension.
        comm_us: |C_d| (in ``summary[]``: the mean over ranks). Unit: µs.
        overlap_us: |K ∩ C_d|. Unit: µs.
        exposed_us: |C_d| − overlap (in ``summary[]``: the mean over ranks). Unit: µs.
        overlap_pct: Overlap / |C_d| (in ``summary[]``: Σ overlap / Σ comm). Unit: % of the
            dimension's comm. Null/absent: ``null`` when |C_d| is 0.
    """

    rank: int
    dim: str
    comm_us: Number = NAN
    overlap_us: Number = NAN
    exposed_us: Number = NAN
    overlap_pct: Number | None = None


class DimOverlapSection(msgspec.Struct, kw_only=True, frozen=True):
    """Overlap of computation with each parallel dimension's communication
    (``overlap_per_dimension``).

    Attributes:
        summary: One row per dimension. Null/absent: ``[]`` when nothing was matched.
        per_rank: One row per rank and dimension. Null/absent: ``[]`` when nothing was matched.
        note: Why the tables are empty. Null/absent: ``null`` when they are not.
    """

    summary: list[DimOverlapSummary] = msgspec.field(default_factory=list)
    per_rank: list[DimOverlapRank] = msgspec.field(default_factory=list)
    note: str | None = None


class PathStep(msgspec.Struct, kw_only=True, frozen=True):
    """One profiled step's path (``critical_path.steps[]``).

    Attributes:
        step: Profiler step.
        start_us: The earliest step start and the latest step end over the ranks (aligned
            clock). Unit: µs.
        end_us: The earliest step start and the latest step end over the ranks (aligned clock).
            Unit: µs.
        measured_us: ``end_us`` − ``start_us``. Unit: µs.
        path_us: The path's length. Unit: µs.
        replay_us: The step's graph replayed unchanged (its latest end less ``start_us``). Unit:
            µs.
        replay_error_pct: (``replay_us`` − ``measured_us``) / ``measured_us``. Unit: % of the
            step. Null/absent: ``null`` for an empty step.
        joins: Communication instances of more than one rank in the step.
    """

    step: int
    start_us: Number = NAN
    end_us: Number = NAN
    measured_us: Number = NAN
    path_us: Number = NAN
    replay_us: Number = NAN
    replay_error_pct: Number | None = None
    joins: int = 0


class PathShare(msgspec.Struct, kw_only=True, frozen=True):
    """The path's time of one part over all steps (``critical_path.shares[]``).

    Attributes:
        part: ``compute`` (a rank's computation), ``data loading`` (its DataLoader iterator's
            time outside computation; a row only where there is some), ``other`` (the rest of
            its work: host work, launches, idle, communication it did not wait for) or
            ``communication``.
        rank: The rank. Null/absent: ``null`` for ``communication``.
        dim: The dimension of the communication's group (``world``, ``other``, ``pp`` for point-
            to-point without a group dimension). Null/absent: ``null`` for the parts of a rank.
        us: Time on the path, summed over steps. Unit: µs.
        share_pct: Of the path's summed length. Unit: % of the path. Null/absent: ``null`` when
            the path is empty.
    """

    part: str
    rank: int | None = None
    dim: str | None = None
    us: Number = NAN
    share_pct: Number | None = None


class PathSlack(msgspec.Struct, kw_only=True, frozen=True):
    """One rank's slack (``critical_path.slack[]``).

    Attributes:
        rank: The rank.
        steps: Steps it has.
        slack_us: Median over steps of how much later it could have arrived anywhere in the step
            without moving the step's end: the least, over its joins, of the last arrival less
            its own, and of the step's end less its own. 0 on the path. Unit: µs.
        on_path_steps: Steps whose path crosses the rank.
    """

    rank: int
    steps: int = 0
    slack_us: Number = NAN
    on_path_steps: int = 0


class PathDelay(msgspec.Struct, kw_only=True, frozen=True):
    """One rank's delay cost (``critical_path.delay_costs[]``).

    Attributes:
        rank: The rank.
        steps: Steps replayed.
        steps_costly: Steps in which its excess work costs the job more than 0.
        excess_compute_us: Median over steps of its computation less the median of the other
            ranks' computation. Unit: µs per step.
        delay_cost_us: Median over steps of the step time its excess costs the job: the step's
            graph replayed unchanged less the graph replayed with its computation scaled to the
            others' median (Scalasca's delay cost). Unit: µs per step.
        delay_cost_iqr_us: Interquartile range of its cost over the steps (0 under three
            steps). Unit: µs.
    """

    rank: int
    steps: int = 0
    steps_costly: int = 0
    excess_compute_us: Number = NAN
    delay_cost_us: Number = NAN
    delay_cost_iqr_us: Number = NAN


class PathSegment(msgspec.Struct, kw_only=True, frozen=True):
    """One segment of the path (``critical_path.segments[]``).

    Attributes:
        step: Profiler step.
        rank: The rank whose time the segment is.
        start_us: The segment (aligned clock). Unit: µs.
        end_us: The segment (aligned clock). Unit: µs.
        dur_us: The segment (aligned clock). Unit: µs.
        kind: ``work`` or ``communication``.
        compute_us: Of a ``work`` segment: its computation, its data loading (the DataLoader
            iterator's host time outside computation: on a CPU rank the iterator's own operators
            count as data loading, on a GPU rank kernels running meanwhile as computation) and
            the rest. Unit: µs. Null/absent: 0 for ``communication``.
        data_loading_us: Of a ``work`` segment: its computation, its data loading (the
            DataLoader iterator's host time outside computation: on a CPU rank the iterator's
            own operators count as data loading, on a GPU rank kernels running meanwhile as
            computation) and the rest. Unit: µs. Null/absent: 0 for ``communication``.
        other_us: Of a ``work`` segment: its computation, its data loading (the DataLoader
            iterator's host time outside computation: on a CPU rank the iterator's own operators
            count as data loading, on a GPU rank kernels running meanwhile as computation) and
            the rest. Unit: µs. Null/absent: 0 for ``communication``.
        op: The communication's op (``all_reduce``, ``send``, …). Null/absent: ``null`` for
            ``work``.
        dim: Its group's dimension. Null/absent: ``null`` for ``work``.
        instance: Its instance key (as in ``sync.instances[].instance``). Null/absent: ``null``
            for ``work``.
    """

    step: int
    rank: int
    start_us: Number = NAN
    end_us: Number = NAN
    dur_us: Number = NAN
    kind: str
    compute_us: Number = NAN
    data_loading_us: Number = NAN
    other_us: Number = NAN
    op: str | None = None
    dim: str | None = None
    instance: str | None = None


class CriticalPathSection(msgspec.Struct, kw_only=True, frozen=True):
    """The cross-rank critical path of each profiled step, each rank's slack and the replay
    (``critical_path``); aligned clock.

    Attributes:
        summary: One sentence: the path's largest parts and the ranks with slack. Null/absent:
            ``null`` without a path.
        steps: One row per profiled step. Null/absent: ``[]`` without steps.
        shares: The path's time over all steps, by part. Null/absent: ``[]`` without a path.
        slack: One row per rank. Null/absent: ``[]`` without a path.
        delay_costs: One row per rank whose computation exceeds the other ranks' median (at
            most four, the most excess), most cost first. Null/absent: ``[]`` without a path or
            such a rank.
        segments: The path's segments, latest first within each step; at most 2,000 (the latest
            steps'). Null/absent: ``[]`` without a path.
        segments_total: How many segments there are in all.
        notes: What was left out, and why.
        note: Why there is no path. Null/absent: ``null`` when there is one.
    """

    summary: str | None = None
    steps: list[PathStep] = msgspec.field(default_factory=list)
    shares: list[PathShare] = msgspec.field(default_factory=list)
    slack: list[PathSlack] = msgspec.field(default_factory=list)
    delay_costs: list[PathDelay] = msgspec.field(default_factory=list)
    segments: list[PathSegment] = msgspec.field(default_factory=list)
    segments_total: int = 0
    notes: list[str] = msgspec.field(default_factory=list)
    note: str | None = None


class RoutingGroup(msgspec.Struct, kw_only=True, frozen=True):
    """One expert-parallel group over its steps (``routing.groups[]``).

    Attributes:
        group: Group key. Null/absent: ``""`` when unknown.
        dim: Dimension, from the layout. Null/absent: ``null`` when unknown.
        ranks: Members.
        steps: Steps with routed instances.
        unit: ``"rows"``, or ``"elements"`` when the row size is unknown.
        row_bytes: Bytes per row of the largest routed buffer. Unit: bytes. Null/absent:
            ``null`` when unknown.
        imbalance: Median over steps of max/mean load. Unit: ratio.
        imbalance_min: Lowest over steps. Unit: ratio.
        imbalance_max: Highest over steps. Unit: ratio.
        hot_rank: The rank most often holding the max.
        hot_steps: Steps in which it did.
        hot_rows: Median per step of the max load. Unit: rows.
        mean_rows: Median per step of the mean load. Unit: rows.
        wait_us: Median per step of the other ranks' waiting at instances the hot rank arrived
            last at. Unit: µs.
        saving_us: Median per step of ``wait_us`` / ranks: the step's predicted saving if every
            rank had the mean load. Unit: µs.
        saving_q1_us: First quartile of the saving. Unit: µs.
        saving_q3_us: Third quartile of the saving. Unit: µs.
        expert: The layout says the group's all-to-alls dispatch tokens to experts (its
            dimension is ``ep``, or it has none and the layout has an ``ep`` dimension); false:
            what they carry is unknown, and nothing is said of experts.
    """

    group: str
    dim: str | None = None
    ranks: int = 0
    steps: int = 0
    unit: str = ""
    row_bytes: Number | None = None
    imbalance: Number = NAN
    imbalance_min: Number = NAN
    imbalance_max: Number = NAN
    hot_rank: int = 0
    hot_steps: int = 0
    hot_rows: Number = NAN
    mean_rows: Number = NAN
    wait_us: Number = NAN
    saving_us: Number = NAN
    saving_q1_us: Number = NAN
    saving_q3_us: Number = NAN
    expert: bool = False


class RoutingStep(msgspec.Struct, kw_only=True, frozen=True):
    """One group in one step (``routing.steps[]``).

    Attributes:
        group: Group key.
        step: Step.
        ranks: Members.
        instances: Routed instances.
        max_rows: Largest load. Unit: rows.
        mean_rows: Mean load. Unit: rows.
        imbalance: max / mean. Unit: ratio.
        hot_rank: The rank with the max.
        wait_us: The others' waiting at the instances the hot rank arrived last at. Unit: µs.
        saving_us: ``wait_us`` / ranks. Unit: µs.
    """

    group: str
    step: int
    ranks: int = 0
    instances: int = 0
    max_rows: Number = NAN
    mean_rows: Number = NAN
    imbalance: Number = NAN
    hot_rank: int = 0
    wait_us: Number = NAN
    saving_us: Number = NAN


class RoutingRank(msgspec.Struct, kw_only=True, frozen=True):
    """One rank of a group in one step (``routing.per_rank[]``).

    Attributes:
        group: Group key.
        step: Step.
        rank: The rank.
        sent_rows: Sent, summed over the routed instances. Unit: rows.
        recv_rows: Received, summed over the routed instances. Unit: rows.
        load_rows: Summed on the expert side. Unit: rows.
        waited_us: Its waits at those instances. Unit: µs.
    """

    group: str
    step: int
    rank: int
    sent_rows: Number = NAN
    recv_rows: Number = NAN
    load_rows: Number = NAN
    waited_us: Number = NAN


class RoutingInstance(msgspec.Struct, kw_only=True, frozen=True):
    """One routed all-to-all instance (``routing.instances[]``).

    Attributes:
        instance: The key in ``sync.instances[]``.
        group: Group key.
        step: Step.
        seq: Sequence number.
        unit: ``"rows"`` or ``"elements"``.
        ranks: Members, in group order.
        send_rows: Rows each member sends, in ``ranks`` order. Unit: rows.
        recv_rows: Rows each member receives, in ``ranks`` order. Unit: rows.
        side: The expert side: ``"recv"`` or ``"send"``.
        imbalance: max / mean on the expert side. Unit: ratio.
        hot_rank: The rank with the max.
        last_rank: The last rank to arrive.
        wait_us: Sum over the other ranks of their wait for the last arrival. Unit: µs.
    """

    instance: str
    group: str
    step: int
    seq: int = 0
    unit: str = ""
    ranks: list[int] = msgspec.field(default_factory=list)
    send_rows: list[Number] = msgspec.field(default_factory=list)
    recv_rows: list[Number] = msgspec.field(default_factory=list)
    side: str = ""
    imbalance: Number = NAN
    hot_rank: int = 0
    last_rank: int = 0
    wait_us: Number = NAN


class RoutingCell(msgspec.Struct, kw_only=True, frozen=True):
    """Mean rows per routed all-to-all from one source to one destination (``routing.matrix[]``).

    Attributes:
        group: Group key.
        src: The rank whose tokens are routed.
        dst: The rank whose experts take them.
        rows: Mean per routed all-to-all. Unit: rows.
    """

    group: str
    src: int
    dst: int
    rows: Number = NAN


class RoutingSection(msgspec.Struct, kw_only=True, frozen=True):
    """MoE (expert-parallel) routing imbalance from the all-to-alls' split sizes (``routing``).

    Attributes:
        groups: Per group, over its steps, largest saving first. Null/absent: ``[]`` when only
            notes.
        steps: Per group and step. Null/absent: ``[]`` when only notes.
        per_rank: Per group, step and rank. Null/absent: ``[]`` when only notes.
        instances: Per routed all-to-all instance. Null/absent: ``[]`` when only notes.
        matrix: Mean rows per routed all-to-all from each source to each destination.
            Null/absent: ``[]`` when only notes, or without split sizes.
        notes: What could not be measured. Null/absent: ``[]`` when none.
        finding: One sentence naming the hot rank, when a group's median imbalance is ≥ 1.2.
            Null/absent: ``null`` when routing is even.
    """

    groups: list[RoutingGroup] = msgspec.field(default_factory=list)
    steps: list[RoutingStep] = msgspec.field(default_factory=list)
    per_rank: list[RoutingRank] = msgspec.field(default_factory=list)
    instances: list[RoutingInstance] = msgspec.field(default_factory=list)
    matrix: list[RoutingCell] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    finding: str | None = None
