"""The report JSON as types: one msgspec Struct per object of ``pardiag report --json``.

:func:`~.registry.report_json` builds a :class:`ReportDocument`; :func:`to_builtins` turns it
into the plain values that are written (``Report.to_json``); :func:`decode_report` reads a
written one back (``pardiag compare``). docs/json-schema.md documents every field, and
``tests/test_docs.py`` keeps the page and these types equal, key for key.

Units (every field's own line says which applies): ``*_us`` µs, ``*_bytes`` bytes, ``*_gbps``
GB/s (10⁹ B/s), ``*_pct`` % (``overlap_pct`` of the communication time, the others of the window
or step), ``imbalance`` max / mean. A missing number (NaN, ±inf) is written as null.

Reading a report of an older pardiag: every field but ``schema_version`` and ``ranks`` (and a
row's identifying keys: its rank, step, op, name, ...) has a default, so a key that an older
report lacks reads as its default: None for a value that may be null, NaN for a number, ``[]``
or ``{}`` for a list or map, an empty section for a section. The sections that ``compare`` falls
back from are None when missing (``step``: the run row of ``step_time``; ``setup``: ``run`` and
``layout``; ``operators``; ``sync``), and the top-level ``straggler`` is UNSET when missing
(``sync.straggler`` is used instead). A key written only in some cases (``layout.evidence``,
``pipeline.schedule.source``, ``hta``, ``recommendations[].params`` keys, ...) is UNSET when it
is not written, and :func:`to_builtins` leaves it out. Unknown keys (a newer pardiag's) are
ignored; a value of the wrong type is an error naming its place (``$.sync.instances[3].seq``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from pardiag.layout import RunFile

from .schema_causes import (
    CauseExcess,
    CauseRank,
    CausesSection,
    CauseStep,
    HostBound,
    ImbalanceSection,
    ImbalanceStep,
    ImbalanceSummary,
    InputBound,
    MemoryImbalance,
    MemoryRank,
    MemorySection,
    SkewOrigin,
)
from .schema_efficiency import (
    EfficiencyClass,
    EfficiencyModule,
    EfficiencyRank,
    EfficiencySection,
    EfficiencyStep,
)
from .schema_layout import (
    CriticalPathSection,
    DimOverlapRank,
    DimOverlapSection,
    DimOverlapSummary,
    LayoutPipeline,
    LayoutSection,
    PathDelay,
    PathSegment,
    PathShare,
    PathSlack,
    PathStep,
    ProcessGroupRow,
    RoutingCell,
    RoutingGroup,
    RoutingInstance,
    RoutingRank,
    RoutingSection,
    RoutingStep,
    SetupSection,
)
from .schema_ranks import (
    NAN,
    BreakdownTotals,
    CollectiveTotal,
    DeviceRow,
    Number,
    OperatorRow,
    OperatorsSection,
    RankCollective,
    RankEntry,
    RunStepRow,
    StepBreakdown,
    StepTimeRow,
)
from .schema_sync import (
    BandwidthRow,
    BubbleRow,
    BubbleSummary,
    ClockOffset,
    InstanceRow,
    P2PLink,
    PipelineSchedule,
    PipelineSection,
    SkewRow,
    StragglerRow,
    SyncSection,
)

#: The report's types, wherever each is defined (one module per part of the document).
__all__ = [
    "BandwidthRow",
    "BatchEffect",
    "BatchFactor",
    "BatchSize",
    "BreakdownTotals",
    "BubbleRow",
    "BubbleSummary",
    "CauseExcess",
    "CauseRank",
    "CauseStep",
    "CausesSection",
    "EfficiencyClass",
    "EfficiencyModule",
    "EfficiencyRank",
    "EfficiencySection",
    "EfficiencyStep",
    "ClockOffset",
    "CollectiveTotal",
    "CriticalPathSection",
    "DimOverlapRank",
    "DimOverlapSection",
    "DimOverlapSummary",
    "HostBound",
    "HtaIdle",
    "HtaLaunches",
    "HtaSection",
    "ImbalanceSection",
    "ImbalanceStep",
    "ImbalanceSummary",
    "InputBound",
    "InstanceRow",
    "LayoutPipeline",
    "LayoutSection",
    "MeasuredStep",
    "MemoryImbalance",
    "MemoryRank",
    "MemorySection",
    "NAN",
    "Number",
    "OperatorRow",
    "OperatorsSection",
    "P2PLink",
    "PathDelay",
    "PathSegment",
    "PathShare",
    "PathSlack",
    "PathStep",
    "PipelineSchedule",
    "PipelineSection",
    "ProcessGroupRow",
    "RankCollective",
    "RankEntry",
    "RecommendationEntry",
    "RecommendationParams",
    "ReportDocument",
    "RoutingCell",
    "RoutingGroup",
    "RoutingInstance",
    "RoutingRank",
    "RoutingSection",
    "RoutingStep",
    "SetupSection",
    "SkewOrigin",
    "SkewRow",
    "StepBreakdown",
    "RunStepRow",
    "DeviceRow",
    "StepTimeRow",
    "StragglerRow",
    "SyncSection",
    "decode_report",
    "to_builtins",
]



class MeasuredStep(msgspec.Struct, kw_only=True, frozen=True):
    """The step time the recommendations compare with, and its samples (``step``). With ``basis``
    ``"pipeline"`` the verdict uses the pipeline model's period instead.

    Attributes:
        basis: ``"pipeline"`` (start-to-start time of unprofiled pipeline steps, from pardiag's
            chunk records), ``"unprofiled"`` (optimizer-step periods after the profiler's
            window, per step the median over the ranks) or ``"profiled"`` (per profiled step,
            the slowest rank's span). Outlier steps are left out.
        basis_text: The basis, in words.
        steps: Number of samples.
        median_us: Median of the samples. Unit: µs. Null/absent: ``null`` without samples.
        q1_us: First quartile (numpy's linear interpolation). Unit: µs. Null/absent: ``null``
            without samples.
        q3_us: Third quartile. Unit: µs. Null/absent: ``null`` without samples.
        min_us: Smallest sample. Unit: µs. Null/absent: ``null`` without samples.
        max_us: Largest sample. Unit: µs. Null/absent: ``null`` without samples.
        samples_us: The per-step values. Unit: µs. Null/absent: ``[]`` without samples.
    """

    basis: str = ""
    basis_text: str = ""
    steps: int = 0
    median_us: Number | None = None
    q1_us: Number | None = None
    q3_us: Number | None = None
    min_us: Number | None = None
    max_us: Number | None = None
    samples_us: list[Number] = msgspec.field(default_factory=list)


class RecommendationParams(msgspec.Struct, kw_only=True, frozen=True):
    """A change in machine form (``recommendations[].params``): each kind writes only its own keys,
    the others are UNSET (absent).

    Attributes:
        pp: Pipeline degree: 1 (``pp_to_dp``). Null/absent: other kinds.
        dp: Data-parallel degree (``pp_to_dp``, ``degrees``). Null/absent: other kinds.
        tp: Tensor-parallel degree (``degrees``). Null/absent: other kinds.
        schedule: ``"1f1b"`` (``schedule``) or ``"interleaved"`` (``interleave``). Null/absent:
            other kinds.
        stages_per_rank: Stages per rank (``interleave``). Null/absent: other kinds.
        layers_per_stage: Child modules per stage, in stage order (``rebalance_stages``,
            ``interleave``). Null/absent: other kinds.
        layer_names: The layers in order. This describes the change but is not part of it
            (``rebalance_stages``, ``interleave``). Null/absent: other kinds.
        microbatches: New microbatch count (``microbatches``). Null/absent: other kinds.
        reshard_after_forward: FSDP2: ``false`` (``fsdp_reshard``). Null/absent: other kinds,
            FSDP1.
        without_rank: The straggler, if it were not slow (``straggler``). Null/absent: other
            kinds.
        fsdp_prefetch: FSDP2: units to prefetch ahead (``fsdp_prefetch``). Unit: FSDP units.
            Null/absent: other kinds, FSDP1.
        fsdp_forward_prefetch: FSDP1: ``true`` (``fsdp_prefetch``). Null/absent: other kinds,
            FSDP2.
        ddp_bucket_cap_bytes: New DDP bucket cap (``ddp_bucket``). Unit: bytes. Null/absent:
            other kinds.
        balanced_routing_group: Group key of the MoE group to balance (``moe_routing``).
            Null/absent: other kinds.
        hot_rank: Its hot rank (``moe_routing``). Null/absent: other kinds.
        fsdp_sharding_strategy: FSDP1: ``"SHARD_GRAD_OP"`` (``fsdp_reshard``). Null/absent:
            other kinds, FSDP2.
        innermost: The dimension to make innermost in the device mesh (``placement``).
            Null/absent: other kinds.
        zero_stage: DeepSpeed ZeRO stage to use (``zero_stage``, ``zero_shard``). Null/absent:
            other kinds.
        reduce_bucket_size: DeepSpeed ``zero_optimization.reduce_bucket_size``
            (``zero_bucket``). Unit: elements. Null/absent: other kinds.
        allgather_bucket_size: DeepSpeed ``zero_optimization.allgather_bucket_size``
            (``zero_allgather_bucket``). Unit: elements. Null/absent: other kinds.
        overlap_comm: DeepSpeed ``zero_optimization.overlap_comm``: ``true`` (``zero_overlap``).
            Null/absent: other kinds.
        strategy: ``"zero1"`` or ``"fsdp"`` (kinds ``zero1``, ``fsdp``). Null/absent: other
            kinds.
    """

    pp: int | UnsetType = UNSET
    dp: int | UnsetType = UNSET
    tp: int | UnsetType = UNSET
    schedule: str | UnsetType = UNSET
    stages_per_rank: int | UnsetType = UNSET
    layers_per_stage: list[int] | UnsetType = UNSET
    layer_names: list[str] | UnsetType = UNSET
    microbatches: int | UnsetType = UNSET
    reshard_after_forward: bool | UnsetType = UNSET
    without_rank: int | UnsetType = UNSET
    fsdp_prefetch: int | UnsetType = UNSET
    fsdp_forward_prefetch: bool | UnsetType = UNSET
    ddp_bucket_cap_bytes: int | UnsetType = UNSET
    balanced_routing_group: str | UnsetType = UNSET
    hot_rank: int | UnsetType = UNSET
    fsdp_sharding_strategy: str | UnsetType = UNSET
    innermost: str | UnsetType = UNSET
    zero_stage: int | UnsetType = UNSET
    reduce_bucket_size: int | UnsetType = UNSET
    allgather_bucket_size: int | UnsetType = UNSET
    overlap_comm: bool | UnsetType = UNSET
    strategy: str | UnsetType = UNSET


class BatchSize(msgspec.Struct, kw_only=True, frozen=True):
    """One batch size now and after a change (``batch.global_batch``, ``batch.per_rank_batch``,
    ``batch.microbatch``).

    Attributes:
        now: Size now. Unit: samples. Null/absent: ``null`` when unknown; absent in
            ``optimizer_steps_per_sample``.
        after: Size after the change. Unit: samples. Null/absent: ``null`` when unknown; absent
            in ``optimizer_steps_per_sample``.
        factor: after / now (1: unchanged). Unit: ratio.
    """

    now: int | None = None
    after: int | None = None
    factor: Number = NAN


class BatchFactor(msgspec.Struct, kw_only=True, frozen=True):
    """The change of optimizer steps per sample (``batch.optimizer_steps_per_sample``).

    Attributes:
        factor: after / now (1: unchanged). Unit: ratio.
    """

    factor: Number = NAN


class BatchEffect(msgspec.Struct, kw_only=True, frozen=True):
    """What a change does to the batch sizes and the optimizer (``recommendations[].batch``).

    Attributes:
        global_batch: Global batch, now and after the change. Unit: samples.
        per_rank_batch: Per-rank batch, now and after the change. Unit: samples.
        microbatch: Microbatch size, now and after the change. Unit: samples.
        optimizer_steps_per_sample: Optimizer steps per sample (1 / global batch).
        global_batch_changes: The global batch changes.
    """

    global_batch: BatchSize | UnsetType = UNSET
    per_rank_batch: BatchSize | UnsetType = UNSET
    microbatch: BatchSize | UnsetType = UNSET
    optimizer_steps_per_sample: BatchFactor | UnsetType = UNSET
    global_batch_changes: bool | UnsetType = UNSET


class RecommendationEntry(msgspec.Struct, kw_only=True, frozen=True):
    """One evaluated change (``recommendations[]``, ``not_recommended[]``).

    Attributes:
        kind: Machine name of the change: ``microbatches``, ``schedule``, ``rebalance_stages``,
            ``interleave``, ``pp_to_dp``, ``straggler``, ``moe_routing``, ``ddp_bucket``,
            ``fsdp_reshard``, ``fsdp_prefetch``, ``degrees``, ``placement``, ``zero1``,
            ``fsdp``, ``zero_stage``, ``zero_shard``, ``zero_bucket``,
            ``zero_allgather_bucket``, ``zero_overlap``.
        title: One-line summary.
        change: The concrete change, e.g. ``"microbatches 16 (same global batch)"``.
        evidence: The measured numbers behind the change, one sentence each. Null/absent: ``[]``
            when none.
        caveats: What the model does not know, one sentence each. Null/absent: ``[]`` when none.
        measured_step_us: The measured step that the prediction starts from: ``step.median_us``,
            or on a pipeline run the model's period (see ``step``). Unit: µs.
        predicted_step_us: Predicted step after the change. Unit: µs. Null/absent: ``null`` when
            ruled out.
        gain_pct: 100 · (measured − predicted) / measured. Unit: % of the step. Null/absent:
            ``null`` when ruled out.
        measured_peak_bytes: Measured peak memory of the worst rank (see ``peak_definition``).
            Unit: bytes. Null/absent: ``null`` when unknown.
        predicted_peak_bytes: Predicted peak memory of the worst rank. Unit: bytes. Null/absent:
            ``null`` when unknown.
        fits_memory: ``false`` when the predicted peak exceeds the device's capacity (then the
            change is not recommended). On CPU, everything fits.
        params: The change in machine form (see below). Null/absent: ``{}`` when the change has
            none.
        ruled_out: Why the candidate cannot be built with the model's shapes or batch.
            Null/absent: ``""`` when it can be built.
        batch: What the change does to the batch sizes and to the optimizer. Null/absent: ``{}``
            when ruled out.
        optimizer_effect: The same as one statement. When the global batch changes, it says that
            the learning rate and warm-up need retuning. Null/absent: ``""`` when ruled out.
        tier: 1 for the best recommendations, 2 for the next, …. A tier is a set, not a ranking.
            Tiers are ordered by kind (memory savings, then changes that keep the degrees, then
            changes of the degrees), then by gain. Null/absent: ``null`` in ``not_recommended``.
        predicted_low_us: The prediction's 95% interval, when it rests on stand-in timings taken
            after the run. A change whose interval reaches the measured step is not recommended.
            Unit: µs. Null/absent: ``null`` when the prediction rests on no stand-in.
        predicted_high_us: The prediction's 95% interval, when it rests on stand-in timings
            taken after the run. A change whose interval reaches the measured step is not
            recommended. Unit: µs. Null/absent: ``null`` when the prediction rests on no stand-
            in.
        reason: Why the change is not recommended: ruled out by the shapes or batch, does not
            fit in device memory, its interval reaches the measured step, no gain, below the
            noise ±X%, below the margin, under the interleaving margin. Null/absent: ``""`` in
            ``recommendations``.
        settle: What would settle it: more steps, pinned ranks (``--pin-cpu``), a run of the
            change. Null/absent: ``""`` when nothing would, and in ``recommendations``.
        measured_mfu_pct: The run's MFU at ``measured_step_us``: the ranks' model FLOPs per
            step over the step × the ranks' peaks (see ``efficiency``). Unit: %. Null/absent:
            ``null`` when the model FLOPs or a peak are unknown, the change is ruled out, or it
            changes the global batch.
        predicted_mfu_pct: The same at ``predicted_step_us``. Unit: %. Null/absent: as
            ``measured_mfu_pct``.
    """

    kind: str
    title: str = ""
    change: str = ""
    evidence: list[str] = msgspec.field(default_factory=list)
    caveats: list[str] = msgspec.field(default_factory=list)
    measured_step_us: Number = NAN
    predicted_step_us: Number | None = None
    gain_pct: Number | None = None
    measured_peak_bytes: Number | None = None
    predicted_peak_bytes: Number | None = None
    fits_memory: bool = False
    params: RecommendationParams = msgspec.field(default_factory=RecommendationParams)
    ruled_out: str = ""
    batch: BatchEffect = msgspec.field(default_factory=BatchEffect)
    optimizer_effect: str = ""
    tier: int | None = None
    predicted_low_us: Number | None = None
    predicted_high_us: Number | None = None
    reason: str = ""
    settle: str = ""
    measured_mfu_pct: Number | None = None
    predicted_mfu_pct: Number | None = None


class HtaIdle(msgspec.Struct, kw_only=True, frozen=True):
    """Idle time of one rank, stream and category (``hta.idle[]``).

    Attributes:
        rank: Global rank.
        stream: GPU stream (Kineto's tid of the stream).
        category: ``host_wait`` (the kernel was launched after the previous one ended),
            ``kernel_wait`` (a gap shorter than ``consecutive_kernel_delay_us``) or ``other``.
        idle_us: Idle time of that category on the stream. Unit: µs.
        idle_pct: Its share. Unit: % of the stream's idle time. Null/absent: ``null`` when the
            stream has no idle time.
    """

    rank: int
    stream: int
    category: str
    idle_us: Number = NAN
    idle_pct: Number = NAN


class HtaLaunches(msgspec.Struct, kw_only=True, frozen=True):
    """Kernel launch statistics of one rank (``hta.launches[]``).

    Attributes:
        rank: Global rank.
        launches: Launches that HTA matched to a GPU event (kernels, memcpy, memset).
        cpu_us_median: Median duration of the CPU runtime call. Unit: µs.
        gpu_us_median: Median duration of the GPU event. Unit: µs.
        launch_delay_us_median: Median launch delay: GPU start − end of the runtime call, ≥ 0.
            Unit: µs.
        launch_delay_us_p95: 95th percentile of the launch delay. Unit: µs.
        launch_delay_us_max: Longest launch delay. Unit: µs.
        runtime_outliers: Runtime calls longer than ``runtime_cutoff_us``.
        delay_outliers: Launches delayed more than ``launch_delay_cutoff_us``.
        gpu_shorter: Launches whose GPU event is shorter than its CPU runtime call (the CPU
            cannot keep such a stream busy).
    """

    rank: int
    launches: int = 0
    cpu_us_median: Number = NAN
    gpu_us_median: Number = NAN
    launch_delay_us_median: Number = NAN
    launch_delay_us_p95: Number = NAN
    launch_delay_us_max: Number = NAN
    runtime_outliers: int = 0
    delay_outliers: int = 0
    gpu_shorter: int = 0


class HtaSection(msgspec.Struct, kw_only=True, frozen=True):
    """Holistic Trace Analysis' idle time breakdown and kernel launch statistics (``hta``; ``report
    --hta``).

    Attributes:
        version: The HTA version used. Null/absent: ``null`` when HTA is not installed.
        messages: One line per HTA failure or limit. Ranks with the same one share a line.
            Null/absent: ``[]`` when none.
        runtime_cutoff_us: Runtime calls longer than this are outliers (HTA's default, 50).
            Unit: µs.
        launch_delay_cutoff_us: Launch delays longer than this are outliers (HTA's default,
            100). Unit: µs.
        consecutive_kernel_delay_us: Gaps shorter than this are kernel wait (HTA's default, 30).
            Unit: µs.
        idle: Idle time breakdown per rank, stream and category. Null/absent: ``[]`` when no
            rank was analysed.
        launches: Kernel launch statistics per rank. Ranks without launches are absent (e.g.
            ROCm: HTA knows only CUDA launch names). Null/absent: ``[]`` when none.
    """

    version: str | None = None
    messages: list[str] = msgspec.field(default_factory=list)
    runtime_cutoff_us: Number = NAN
    launch_delay_cutoff_us: Number = NAN
    consecutive_kernel_delay_us: Number = NAN
    idle: list[HtaIdle] = msgspec.field(default_factory=list)
    launches: list[HtaLaunches] = msgspec.field(default_factory=list)


class CaptureInfo(msgspec.Struct, kw_only=True, frozen=True):
    """Of a monitored run's deep capture: the run it belongs to and the steps it holds.

    Attributes:
        monitored_run: The monitored run's folder, absolute (``pardiag report`` of it gives
            the whole run).
        first_step: The first step the capture holds, as the run numbers its steps.
        last_step: The last step it was asked to hold.
        reason: The finding the launcher asked for it on, as said while the run went on.
            Null/absent: ``null`` when the request gives none.
        monitored_run_found: Whether ``monitored_run`` is there and holds that run (its
            capture request asks for this capture, or its ``run.json`` has the same start
            time). A capture copied or moved elsewhere is still found while its run stays
            where the capture's own ``run.json`` says, or when it sits in its run's folder;
            false when neither holds the run (moved or deleted, or another run written there
            since): ``monitored_run`` then says where the run was.
        against_findings: Where the capture's steps lie against the whole run's findings, as
            its report gives them: "lies inside the run's finding: …", "lies outside every
            finding's steps …" (the finding that asked for it ended before the capture began),
            or "was asked for by a finding the whole run does not confirm …". Null/absent:
            ``null`` when the run is not found or its monitor records cannot be read.
    """

    monitored_run: str
    first_step: int
    last_step: int
    reason: str | None = None
    monitored_run_found: bool = True
    against_findings: str | None = None


class ReportDocument(msgspec.Struct, kw_only=True, frozen=True):
    """The report JSON (``pardiag report --json``): run-level keys, then each analysis' keys.

    Attributes:
        schema_version: Version of this schema: 3.
        source: What was loaded (the folder or list of files as given).
        warnings: Problems with the input, one line each (missing ranks, skipped files, a failed
            or stopped run that ``run.json`` records). Null/absent: ``[]`` when none.
        notes: Informational lines from loading each rank, e.g. clipped overlapping events.
            Null/absent: ``[]`` when none.
        run: The run folder's ``run.json`` (see ``run``). Null/absent: ``null`` for traces
            recorded without ``pardiag profile``.
        capture: Of a monitored run's deep capture (a ``capture-S`` folder): the run and the
            steps (see ``capture``). Null/absent: ``null`` for any other input.
        ranks: One entry per loaded rank: its file and time breakdown.
        collectives: Time per collective type over all ranks, most time first. Null/absent:
            ``[]`` without communication.
        step_time: Step time and spread per rank, plus one row for the run. Null/absent: ``[]``
            without profiler steps.
        run_steps: Every optimizer step of the run per rank, profiled or not. Null/absent:
            ``[]`` for traces recorded without ``pardiag profile``.
        devices: Each device's own timeline, for ranks whose trace holds several devices (one
            process driving several GPUs). Null/absent: ``[]`` when every rank drives one.
        operators: Time per GPU kernel and CPU operator name.
        sync: Collectives matched across ranks: clock offsets, stragglers, arrival skew,
            bandwidth, point-to-point.
        pipeline: Pipeline bubbles per rank and step. Null/absent: ``null`` without a pipeline
            (no schedule records, no inferred pipeline, no point-to-point ranks).
        imbalance: Compute-time imbalance per parallel dimension, and where arrival skew comes
            from.
        causes: Where each rank's step goes on the host and device; cross-rank excess; input-
            and host-bound findings.
        memory: Static and peak memory per rank.
        layout: Parallel layout: dimensions, strategies, pipeline, process groups, nodes.
            Recorded or inferred.
        setup: What was run and on what, field by field (what ``pardiag compare`` diffs).
        overlap_per_dimension: Overlap of computation with each parallel dimension's
            communication.
        critical_path: The cross-rank critical path of each profiled step, each rank's slack,
            and the replay of the step's graph.
        routing: MoE (expert-parallel) routing imbalance, from the all-to-alls' split sizes.
            Null/absent: ``null`` without routed all-to-alls and without notes about them.
        efficiency: FLOPs, MFU and HFU per rank and step against the device's peak, and the
            roofline per op class, from the recorded shapes.
        verdict: One paragraph: the step time, the largest losses and the findings.
        straggler: The rank the verdict calls a straggler: ``sync.straggler`` when it also
            arrives last at 60% or more of 3 or more collectives and causes 4× the waiting it
            suffers (on CPU traces also idling 5% of the step longer than its peers), or a rank
            that idles that much longer step after step (measures.md). Null/absent: ``null``
            when the verdict names none.
        step: The step time the recommendations compare with, and its samples. Null/absent:
            ``null`` when the traces hold no step.
        recommendations: Changes predicted to help, ranked in tiers. Null/absent: ``[]`` when
            none.
        not_recommended: Every other change that was evaluated. It has the same fields as
            ``recommendations[]``. Null/absent: ``[]`` when none.
        recommendations_note: Why ``recommendations`` is empty. Null/absent: ``null`` when there
            are recommendations.
        recommendations_not_evaluated: The pipeline changes a replayed pipeline could not
            evaluate beside those it did, and what each needs that the run does not hold.
            Null/absent: ``null`` when every pipeline change was evaluated, outside pipelines,
            and when nothing was (``recommendations_note`` then says why).
        recommendations_rule: The noise rule a predicted gain had to clear, with the noise it
            measured. Null/absent: ``null`` when the profiler recorded no training step.
        step_noise_us: The step's noise: half the 95% bootstrap interval of its median. Unit:
            µs. Null/absent: ``null`` when it cannot be measured (fewer than 3 steps).
        min_gain_pct: The saving a change had to be predicted to make: the larger of 2% and the
            noise. Unit: % of the step. Null/absent: ``null`` when the profiler recorded no
            training step.
        peak_definition: How the measured peak memory was taken (device allocator's peak, static
            + trace-window peak, peak RSS, or ``"not recorded"``). Null/absent: ``null`` when
            the profiler recorded no training step.
        hta: Holistic Trace Analysis' idle time breakdown and kernel launch statistics (see
            ``hta``). Null/absent: absent without ``--hta``.
    """

    schema_version: int
    source: str = ""
    warnings: list[str] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    run: RunFile | None = None
    capture: CaptureInfo | None = None
    ranks: list[RankEntry]
    collectives: list[CollectiveTotal] = msgspec.field(default_factory=list)
    step_time: list[StepTimeRow] = msgspec.field(default_factory=list)
    run_steps: list[RunStepRow] = msgspec.field(default_factory=list)
    devices: list[DeviceRow] = msgspec.field(default_factory=list)
    operators: OperatorsSection | None = None
    sync: SyncSection | None = None
    pipeline: PipelineSection | None = None
    imbalance: ImbalanceSection = msgspec.field(default_factory=ImbalanceSection)
    causes: CausesSection = msgspec.field(default_factory=CausesSection)
    memory: MemorySection = msgspec.field(default_factory=MemorySection)
    layout: LayoutSection = msgspec.field(default_factory=LayoutSection)
    setup: SetupSection | None = None
    overlap_per_dimension: DimOverlapSection = msgspec.field(default_factory=DimOverlapSection)
    critical_path: CriticalPathSection = msgspec.field(default_factory=CriticalPathSection)
    routing: RoutingSection | None = None
    efficiency: EfficiencySection = msgspec.field(default_factory=EfficiencySection)
    verdict: str = ""
    straggler: int | None | UnsetType = UNSET
    step: MeasuredStep | None = None
    recommendations: list[RecommendationEntry] = msgspec.field(default_factory=list)
    not_recommended: list[RecommendationEntry] = msgspec.field(default_factory=list)
    recommendations_note: str | None = None
    recommendations_not_evaluated: str | None = None
    recommendations_rule: str | None = None
    step_noise_us: Number | None = None
    min_gain_pct: Number | None = None
    peak_definition: str | None = None
    hta: HtaSection | UnsetType = UNSET


def _plain(value: Any) -> Any:
    """msgspec's ``enc_hook``: a numpy scalar or array as Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise NotImplementedError(f"{type(value).__name__} is not a JSON value")


def to_builtins(doc: msgspec.Struct) -> Any:
    """``doc`` (a :class:`ReportDocument` or any part of it) as plain Python values: dicts in
    field order, lists, str, int, float (NaN kept: the JSON writers write it as null), bool,
    None; UNSET fields left out.

    Raises:
        TypeError: a value JSON has no type for (other than numpy's, which become numbers)."""
    return msgspec.to_builtins(doc, enc_hook=_plain)


def decode_report(data: bytes | dict[str, Any], source: str | Path = "summary") -> ReportDocument:
    """A report JSON (its bytes, or the dict it parses to) as a :class:`ReportDocument`.

    Args:
        data: what ``pardiag report --json`` wrote, or :meth:`pardiag.Report.to_json`'s dict.
        source: names the input in the error (a file's path).

    Raises:
        ValueError: one line, ``"<source>: not a readable pardiag summary (<why>)"``: the bytes
            are not JSON, a required key (``schema_version``, ``ranks``) is missing, or a
            value has the wrong type (msgspec names its place, e.g. ``$.ranks[0].rank``).
    """
    try:
        if isinstance(data, (bytes, bytearray, memoryview)):
            return msgspec.json.decode(data, type=ReportDocument)
        return msgspec.convert(data, ReportDocument)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"{source}: not a readable pardiag summary "
                         f"({str(exc).splitlines()[0]})") from None
