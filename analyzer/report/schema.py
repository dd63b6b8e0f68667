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

import math
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from pardiag.layout import RunFile

#: A JSON number: an int or a float, kept as written (a Struct field of this type encodes an int
#: as an int).
Number = int | float
#: The default of a number an older report lacks (read as "unknown", as compare treats it).
NAN = math.nan


class BreakdownTotals(msgspec.Struct, kw_only=True, frozen=True):
    """A rank's breakdown over its whole trace window (``ranks[].total``). K is the union of the
    computation intervals, C of the communication intervals; compute_only_us + overlap_us +
    exposed_comm_us + idle_us = span_us.

    Attributes:
        span_us: Length of the window. ``total`` is the whole trace window, summed over
            profiling windows. Unit: µs.
        compute_us: |K|: computation. Unit: µs.
        comm_us: |C|: communication. Unit: µs.
        overlap_us: |K ∩ C|: communication under computation. Unit: µs.
        compute_only_us: |K| − overlap. Unit: µs.
        exposed_comm_us: |C| − overlap: communication not hidden by computation. Unit: µs.
        idle_us: Window − |K ∪ C| (memcpy/memset only, host gaps, nothing). Unit: µs.
        overlap_pct: 100 · overlap / |C| (HTA's overlap). Unit: % of comm time. Null/absent:
            ``null`` without communication.
        compute_only_pct: Compute only / span. Unit: % of window. Null/absent: ``null`` when the
            span is 0.
        overlap_share_pct: Overlap / span. Unit: % of window. Null/absent: ``null`` when the
            span is 0.
        exposed_comm_pct: Exposed communication / span. Unit: % of window. Null/absent: ``null``
            when the span is 0.
        idle_pct: Idle / span. Unit: % of window. Null/absent: ``null`` when the span is 0.
    """

    span_us: Number | UnsetType = UNSET
    compute_us: Number | UnsetType = UNSET
    comm_us: Number | UnsetType = UNSET
    overlap_us: Number | UnsetType = UNSET
    compute_only_us: Number | UnsetType = UNSET
    exposed_comm_us: Number | UnsetType = UNSET
    idle_us: Number | UnsetType = UNSET
    overlap_pct: Number | None | UnsetType = UNSET
    compute_only_pct: Number | None | UnsetType = UNSET
    overlap_share_pct: Number | None | UnsetType = UNSET
    exposed_comm_pct: Number | None | UnsetType = UNSET
    idle_pct: Number | None | UnsetType = UNSET


class StepBreakdown(msgspec.Struct, kw_only=True, frozen=True):
    """A rank's breakdown over one profiler step (``ranks[].steps[]``); the keys of
    :class:`BreakdownTotals` over the step's window.

    Attributes:
        step: Profiler step number.
        start_us: Start of the step's window. On GPU: the step's first kernel. On CPU: the
            ``ProfilerStep`` annotation. Unit: µs (rank clock).
        end_us: End of the step's window. On GPU: the next step's first kernel, or the last
            kernel's end for the last step. Unit: µs (rank clock).
        span_us: Length of the window. ``total`` is the whole trace window, summed over
            profiling windows. Unit: µs.
        compute_us: |K|: computation. Unit: µs.
        comm_us: |C|: communication. Unit: µs.
        overlap_us: |K ∩ C|: communication under computation. Unit: µs.
        compute_only_us: |K| − overlap. Unit: µs.
        exposed_comm_us: |C| − overlap: communication not hidden by computation. Unit: µs.
        idle_us: Window − |K ∪ C| (memcpy/memset only, host gaps, nothing). Unit: µs.
        overlap_pct: 100 · overlap / |C| (HTA's overlap). Unit: % of comm time. Null/absent:
            ``null`` without communication.
        compute_only_pct: Compute only / span. Unit: % of window. Null/absent: ``null`` when the
            span is 0.
        overlap_share_pct: Overlap / span. Unit: % of window. Null/absent: ``null`` when the
            span is 0.
        exposed_comm_pct: Exposed communication / span. Unit: % of window. Null/absent: ``null``
            when the span is 0.
        idle_pct: Idle / span. Unit: % of window. Null/absent: ``null`` when the span is 0.
    """

    step: int
    start_us: Number = NAN
    end_us: Number = NAN
    span_us: Number = NAN
    compute_us: Number = NAN
    comm_us: Number = NAN
    overlap_us: Number = NAN
    compute_only_us: Number = NAN
    exposed_comm_us: Number = NAN
    idle_us: Number = NAN
    overlap_pct: Number | None = None
    compute_only_pct: Number | None = None
    overlap_share_pct: Number | None = None
    exposed_comm_pct: Number | None = None
    idle_pct: Number | None = None


class RankCollective(msgspec.Struct, kw_only=True, frozen=True):
    """Time per collective type on one rank (``ranks[].collectives[]``).

    Attributes:
        collective: Standard name: ``all_reduce``, ``all_gather``, ``reduce_scatter``,
            ``all_to_all``, ``broadcast``, ``send``, ``recv``, ``send_recv``, …
        count: Ops the program issued: pardiag's collective records when the run has them, else
            the outermost communication ops in the trace.
        time_us: Length of the union of the type's intervals, including the transport events
            that ran its ops. Unit: µs.
        exposed_us: The part of ``time_us`` not under computation. Unit: µs.
    """

    collective: str
    count: int = 0
    time_us: Number = NAN
    exposed_us: Number = NAN


class RankEntry(msgspec.Struct, kw_only=True, frozen=True):
    """One loaded rank: its file and time breakdown (``ranks[]``).

    Attributes:
        rank: Global rank.
        file: The rank's trace file (the first one when the rank's events come from several
            profiling windows).
        rank_source: How the rank number was found: ``"distributedInfo"``, ``"merged file"``,
            ``"file name"`` or ``"assigned"``.
        domain: ``"gpu"`` when the breakdown uses the device timeline (the trace has kernels),
            else ``"cpu"``. Null/absent: ``null`` when the rank has no breakdown.
        device: ``"cpu"`` (no kernels), ``"cuda"``, ``"rocm"``, ``"xpu"``, ``"hpu"``, ``"mtia"``
            or ``"unknown"``.
        total: The breakdown over the whole trace window. Null/absent: ``{}`` when the rank has
            no breakdown.
        steps: The breakdown per profiler step. Null/absent: ``[]`` without steps.
        collectives: Time per collective type on this rank. Null/absent: ``[]`` without
            communication.
    """

    rank: int
    file: str = ""
    rank_source: str = ""
    domain: str | None = None
    device: str = ""
    total: BreakdownTotals = msgspec.field(default_factory=BreakdownTotals)
    steps: list[StepBreakdown] = msgspec.field(default_factory=list)
    collectives: list[RankCollective] = msgspec.field(default_factory=list)


class CollectiveTotal(msgspec.Struct, kw_only=True, frozen=True):
    """Time per collective type over all ranks (``collectives[]``).

    Attributes:
        collective: Collective type, as in ``ranks[].collectives[]``.
        ranks: Number of ranks that ran it.
        count: Issued ops, summed over ranks.
        time_us: Time, summed over ranks. Unit: µs.
        exposed_us: Exposed time, summed over ranks. Unit: µs.
        exposed_pct: Share of the time not under computation. Unit: % of ``time_us``.
            Null/absent: ``null`` when ``time_us`` is 0.
    """

    collective: str
    ranks: int = 0
    count: int = 0
    time_us: Number = NAN
    exposed_us: Number = NAN
    exposed_pct: Number | None = None


class StepTimeRow(msgspec.Struct, kw_only=True, frozen=True):
    """Step time and spread of one rank, or of the run (``rank`` None) (``step_time[]``); outlier
    steps are left out of every column but ``outlier_steps``.

    Attributes:
        rank: The rank. Null/absent: ``null`` in the run row.
        steps: Steps used (outliers excluded).
        median_us: Median step span. Unit: µs. Null/absent: ``null`` when no step is left.
        q1_us: First quartile (linear interpolation). Unit: µs.
        q3_us: Third quartile. Unit: µs.
        min_us: Shortest step. Unit: µs.
        max_us: Longest step. Unit: µs.
        outlier_steps: Steps longer than 1.5 × the median (needs 3 or more steps): an
            evaluation, checkpoint or warm-up step. Null/absent: ``[]`` when none.
    """

    rank: int | None = None
    steps: int = 0
    median_us: Number | None = None
    q1_us: Number | None = None
    q3_us: Number | None = None
    min_us: Number | None = None
    max_us: Number | None = None
    outlier_steps: list[int] = msgspec.field(default_factory=list)


class OperatorRow(msgspec.Struct, kw_only=True, frozen=True):
    """One (kind, name) of :class:`OperatorsSection` (``operators.rows[]``).

    Attributes:
        kind: ``"gpu"``: events on a GPU stream (kernels, memcpy, memset). ``"cpu"``: CPU
            operators that start inside a profiler step.
        name: Kernel or operator name.
        ranks: Number of ranks that ran it.
        count: Events, summed over ranks.
        time_us: Sum of the events' durations, over ranks. CPU operators nest, so a CPU name's
            time is inclusive. Unit: µs.
        per_step_us: ``time_us`` / ``rank_steps``: the mean per rank and profiled step. Unit:
            µs.
    """

    kind: str
    name: str
    ranks: int = 0
    count: int = 0
    time_us: Number = NAN
    per_step_us: Number = NAN


class OperatorsSection(msgspec.Struct, kw_only=True, frozen=True):
    """Time per GPU kernel and CPU operator name (``operators``).

    Attributes:
        rank_steps: The ranks' profiler steps summed (a rank without steps counts 1).
            ``per_step_us`` is divided by it.
        total: Number of (kind, name) rows in the full table.
        rows: The first 2,000 rows, most time first. Any name left out took less time than every
            name listed. Null/absent: ``[]`` without events.
    """

    rank_steps: int = 0
    total: int = 0
    rows: list[OperatorRow] = msgspec.field(default_factory=list)


class ClockOffset(msgspec.Struct, kw_only=True, frozen=True):
    """One rank's clock offset and drift (``sync.clock_offsets[]``).

    Attributes:
        rank: The rank.
        offset_us: Its clock minus the reference rank's clock (the lowest rank of its clock
            domain) at the reference rank's first communication event. It is subtracted (with
            the drift) before times are compared. It is 0 for ranks on the reference rank's
            host. Unit: µs.
        drift_us_per_s: How much faster its clock runs than the reference's, fitted (Theil–Sen)
            over the ends of release-together collectives. 0 when the drift's 95% interval holds
            0, or too few ends over too short a time. Unit: µs/s.
        drift_ci_us_per_s: Half-width of the drift's 95% interval. Unit: µs/s. Null/absent:
            ``null`` without a drift fit.
        residual_us: Median absolute residual of the collective ends after the fit. On one host,
            where nothing is subtracted, the median difference of its ends from the others'.
            Unit: µs. Null/absent: ``null`` without release-together instances.
        instances: Complete release-together collective instances the estimate used (rooted ops
            and point-to-point transfers are never clock evidence).
        host: The rank's host. Null/absent: ``null`` when unknown.
    """

    rank: int
    offset_us: Number = NAN
    drift_us_per_s: Number = NAN
    drift_ci_us_per_s: Number | None = None
    residual_us: Number | None = None
    instances: int = 0
    host: str | None = None


class StragglerRow(msgspec.Struct, kw_only=True, frozen=True):
    """Wait suffered and caused by one rank (``sync.stragglers[]``).

    Attributes:
        rank: The rank.
        wait_suffered_us: Length of the union of its waits for later arrivals. Unit: µs.
        wait_caused_us: Sum over the other ranks of the length of the union of their waits for
            this rank. Unit: µs.
        last_arrivals: Instances it arrived last at.
        steps_as_top: Steps in which it caused the most wait.
        instances: Complete instances it took part in that are evidence (not at a window's
            head).
        waiting_us: Length of the union of its waits at every complete instance, window heads
            included: the waiting part of its exposed communication is at most this, the rest is
            transfer. Unit: µs. Null/absent: ``null`` when no complete instance holds the rank
            (its peers' traces are absent): its split is unknown.
    """

    rank: int
    wait_suffered_us: Number = NAN
    wait_caused_us: Number = NAN
    last_arrivals: int = 0
    steps_as_top: int = 0
    instances: int = 0
    waiting_us: Number | None = None


class InstanceRow(msgspec.Struct, kw_only=True, frozen=True):
    """One collective instance matched across ranks, or one point-to-point transfer
    (``sync.instances[]``); times aligned by ``clock_offsets``.

    Attributes:
        instance: Key of the instance (group and sequence number, or order).
        pg: Process group name. Null/absent: ``"?"`` when unknown.
        group: Its ranks and description. Null/absent: ``""`` when unknown.
        seq: Sequence number in the group.
        op: Collective type.
        ranks: Members present in the traces.
        step: Profiler step (the latest over the members). Null/absent: ``-1`` outside every
            step.
        bytes: Size of the full buffer (the largest over the members). Unit: bytes. Null/absent:
            ``null`` when no member's size is known.
        root: The root of a rooted op (broadcast, reduce, scatter, gather): the one its record
            names, else the member that finished first. Null/absent: ``null`` for other ops.
        semantics: What the op says across ranks: ``"together"`` (every member leaves when the
            last arrives: clock and lateness evidence), ``"rooted"`` (members end along a chain;
            waits are measured against the root), ``"pair"`` (send/recv) or ``"unknown"`` (a
            custom kernel: matched, no evidence).
        expected: Group size.
        complete: Every member is present (a row of an older report without the key is taken
            as complete, as compare always did).
        first_arrival_us: Earliest start. Unit: µs (aligned).
        arrival_skew_us: Latest start minus earliest start. Unit: µs.
        transfer_us: Minimum duration over the ranks: the transfer, without waiting. Unit: µs.
        last_rank: The rank the others waited for: the last to arrive at a release-together op
            or a point-to-point pair; the root of a broadcast or scatter; the last member of a
            reduce or gather.
        algbw_gbps: ``bytes`` / ``transfer_us``. Unit: GB/s. Null/absent: ``null`` without
            bytes, or when partial.
        busbw_gbps: algbw × the op's bus factor. Unit: GB/s.
        inter_node: The participants are on more than one host. Null/absent: ``null`` when hosts
            are unknown.
        head: At a profiling window's head: before every rank's trace had started, or (when the
            traces start more than 1 ms apart) in the first step after. Not evidence of a slow
            rank.
        evidence: Counted in waits and stragglers: complete, not at the head, of known
            semantics.
    """

    instance: str
    pg: str
    group: str
    seq: int = 0
    op: str
    ranks: int = 0
    step: int
    bytes: int | None = None
    root: int | None = None
    semantics: str = ""
    expected: int = 0
    complete: bool = True
    first_arrival_us: Number = NAN
    arrival_skew_us: Number = NAN
    transfer_us: Number = NAN
    last_rank: int = 0
    algbw_gbps: Number | None = None
    busbw_gbps: Number | None = None
    inter_node: bool | None = None
    head: bool = False
    evidence: bool = False


class BandwidthRow(msgspec.Struct, kw_only=True, frozen=True):
    """Median bandwidth of one group, op, message size and placement (``sync.bandwidth[]``).

    Attributes:
        pg: Process group name. Null/absent: ``"?"`` when unknown.
        op: Collective type.
        bytes: Message size. Unit: bytes.
        inter_node: ``"intra"``, ``"inter"`` or ``"unknown"``. This is a string here, unlike the
            bool in ``sync.instances[]``.
        count: Instances.
        transfer_us: Median transfer time. Unit: µs.
        algbw_gbps: Median algorithm bandwidth. Unit: GB/s.
        busbw_gbps: Median bus bandwidth. Unit: GB/s.
    """

    pg: str
    op: str
    bytes: int = 0
    inter_node: str = ""
    count: int = 0
    transfer_us: Number = NAN
    algbw_gbps: Number = NAN
    busbw_gbps: Number = NAN


class P2PLink(msgspec.Struct, kw_only=True, frozen=True):
    """One point-to-point link between two ranks (``sync.p2p[]``).

    Attributes:
        src: Sending rank.
        dst: Receiving rank.
        count: Complete transfers (send and recv both present).
        hop_us: Median transfer time: from the later side's arrival to the receive's end, i.e.
            the link's latency for that size (an upper bound where a receive's span ends at a
            late wait, as gloo's async ``irecv`` does). Unit: µs.
        recv_wait_us: Median time the receiver waited for the sender. Unit: µs.
        send_wait_us: Median time the sender waited for the receiver. Unit: µs.
        bytes: Median message size. Unit: bytes. Null/absent: ``null`` when unknown.
    """

    src: int
    dst: int
    count: int = 0
    hop_us: Number = NAN
    recv_wait_us: Number = NAN
    send_wait_us: Number = NAN
    bytes: Number = NAN


class SkewRow(msgspec.Struct, kw_only=True, frozen=True):
    """Arrival skew of one collective type (``sync.skew[]``).

    Attributes:
        op: Collective type.
        count: Instances.
        arrival_skew_us: Median arrival skew. Unit: µs.
        max_skew_us: Largest arrival skew. Unit: µs.
        transfer_us: Median transfer time. Unit: µs.
    """

    op: str
    count: int = 0
    arrival_skew_us: Number = NAN
    max_skew_us: Number = NAN
    transfer_us: Number = NAN


class SyncSection(msgspec.Struct, kw_only=True, frozen=True):
    """Collectives matched across ranks (``sync``).

    Attributes:
        matched_by: How collectives were matched across ranks: ``"records"``, ``"sequence
            numbers"``, ``"order"``, ``"point-to-point pairs"`` or ``"none"``.
        straggler: The rank that makes the others wait, from the waiting alone: it causes the
            most (at least 10 µs per step and 3× the next rank's), arrives last at half or more
            of its ops, and costs each waiting rank more than the step varies, over the
            instances that are evidence (``instances[].evidence``), on clocks corrected for
            offset and drift (measures.md). The verdict asks more of it: the top-level
            ``straggler``. Null/absent: ``null`` when no rank does.
        notes: What matching could not do (partial instances, unpaired point-to-point ops) and
            the clock model used. Null/absent: ``[]`` when none.
        clock_offsets: Clock offset per rank. Null/absent: ``[]`` when nothing was matched.
        stragglers: Wait suffered and caused per rank, most wait caused first. Null/absent:
            ``[]`` without complete instances.
        instances: One row per matched collective instance. Null/absent: ``[]`` when nothing was
            matched.
        bandwidth: Median bandwidth per group, op, message size and placement. Null/absent:
            ``[]`` without sized complete instances.
        p2p: Point-to-point links between pairs of ranks. Null/absent: ``[]`` without complete
            send/recv pairs.
        skew: Arrival skew per collective type. Null/absent: ``[]`` when nothing was matched.
    """

    matched_by: str = ""
    straggler: int | None = None
    notes: list[str] = msgspec.field(default_factory=list)
    clock_offsets: list[ClockOffset] = msgspec.field(default_factory=list)
    stragglers: list[StragglerRow] = msgspec.field(default_factory=list)
    instances: list[InstanceRow] = msgspec.field(default_factory=list)
    bandwidth: list[BandwidthRow] = msgspec.field(default_factory=list)
    p2p: list[P2PLink] = msgspec.field(default_factory=list)
    skew: list[SkewRow] = msgspec.field(default_factory=list)


class PipelineSchedule(msgspec.Struct, kw_only=True, frozen=True):
    """The schedule used for the ideal bubble (``pipeline.schedule``).

    Attributes:
        schedule: torch's schedule class (``ScheduleGPipe``, ``Schedule1F1B``,
            ``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``). Null/absent:
            ``null`` when not recorded.
        p: Pipeline ranks. Null/absent: ``null`` when unknown.
        m: Microbatches. Null/absent: ``null`` when unknown.
        v: Stages per rank. Null/absent: ``null`` when unknown.
        stages: Stages in all. Null/absent: ``null`` when unknown.
        source: ``"inferred from traces"``. Null/absent: absent for a recorded pipeline.
        microbatches_estimated: ``true``: ``m`` was counted from the sends, because the schedule
            marks no microbatch. Null/absent: absent unless estimated.
    """

    schedule: str | None = None
    p: int | None = None
    m: int | None = None
    v: int | None = None
    stages: int | None = None
    source: str | UnsetType = UNSET
    microbatches_estimated: bool | UnsetType = UNSET


class BubbleSummary(msgspec.Struct, kw_only=True, frozen=True):
    """The median bubble of one rank (``pipeline.summary[]``).

    Attributes:
        rank: The rank.
        stages: Its stages, as in ``bubbles[]``.
        steps: Steps the medians are taken over.
        basis: ``"unprofiled"`` (the clean steps), else ``"profiled"`` (the profiled window's
            steps: a run that ended with its window), else ``"all"``.
        bubble_pct: Median bubble. Unit: % of window.
        ideal_pct: Ideal bubble. Unit: % of window.
        warmup_us: Median warm-up bubble. Unit: µs. Null/absent: ``null`` for an estimate.
        steady_us: Median steady-state bubble. Unit: µs. Null/absent: ``null`` for an estimate.
        cooldown_us: Median cool-down bubble. Unit: µs. Null/absent: ``null`` for an estimate.
        window_us: Median window. Unit: µs.
    """

    rank: int
    stages: str = ""
    steps: int = 0
    basis: str = ""
    bubble_pct: Number = NAN
    ideal_pct: Number | None = None
    warmup_us: Number | None = None
    steady_us: Number | None = None
    cooldown_us: Number | None = None
    window_us: Number = NAN


class BubbleRow(msgspec.Struct, kw_only=True, frozen=True):
    """The bubble of one rank and step (``pipeline.bubbles[]``).

    Attributes:
        rank: The rank.
        stages: The rank's stages, comma-separated. Null/absent: ``""`` for an estimate.
        step: Step (schedule records cover unprofiled steps too).
        window_us: The pipeline's window: the first forward start to the last backward end over
            all ranks (aligned clocks). Unit: µs.
        busy_us: Length of the union of the rank's forward and backward chunks. Unit: µs.
        bubble_us: Window − busy. Unit: µs.
        bubble_pct: Bubble / window. Unit: % of window.
        warmup_bubble_us: Bubble before the rank's first backward. With GPipe: the forward
            phase. Unit: µs. Null/absent: ``null`` for an estimate.
        steady_bubble_us: Bubble between the first backward and the last forward. With GPipe:
            the turn-around. Unit: µs. Null/absent: ``null`` for an estimate.
        cooldown_bubble_us: Bubble after the last forward. With GPipe: the backward phase. Unit:
            µs. Null/absent: ``null`` for an estimate.
        ideal_pct: Ideal bubble: 100·(p−1)/(v·m+p−1). Unit: % of window. Null/absent: ``null``
            when p or m is unknown.
        method: ``"measured"`` (from schedule records or per-microbatch ranges) or
            ``"estimate"`` (idle + exposed communication).
        profiled: The step is inside the profiler's window.
        clean: An unprofiled step that is used for the summary (not the first step, the warm-up
            steps or the export step).
    """

    rank: int
    stages: str = ""
    step: int
    window_us: Number = NAN
    busy_us: Number = NAN
    bubble_us: Number = NAN
    bubble_pct: Number = NAN
    warmup_bubble_us: Number | None = None
    steady_bubble_us: Number | None = None
    cooldown_bubble_us: Number | None = None
    ideal_pct: Number | None = None
    method: str = ""
    profiled: bool = False
    clean: bool = False


class PipelineSection(msgspec.Struct, kw_only=True, frozen=True):
    """Pipeline bubbles per rank and step (``pipeline``).

    Attributes:
        schedule: The schedule used for the ideal bubble. Null/absent: ``null`` for an estimate
            on point-to-point ranks that have no schedule.
        summary: Median bubble per rank.
        bubbles: Bubble per rank and step.
    """

    schedule: PipelineSchedule | None = None
    summary: list[BubbleSummary] = msgspec.field(default_factory=list)
    bubbles: list[BubbleRow] = msgspec.field(default_factory=list)


class ImbalanceSummary(msgspec.Struct, kw_only=True, frozen=True):
    """Compute imbalance of one group over its steps (``imbalance.summary[]``).

    Attributes:
        dim: Parallel dimension (``dp``, ``tp``, ``pp``, ``ep``, …), or ``world``.
        pg: Process group name. Null/absent: ``""`` for ``world``.
        imbalance: max / mean (in ``summary[]``: its mean over steps). Unit: ratio. Null/absent:
            ``null`` when the mean is 0.
        cost_us: max − mean (in ``summary[]``: its mean per step). Unit: µs.
        slowest_rank: Rank with the most compute (in ``summary[]``: most often the slowest).
    """

    dim: str
    pg: str
    imbalance: Number | None = None
    cost_us: Number = NAN
    slowest_rank: int = 0


class ImbalanceStep(msgspec.Struct, kw_only=True, frozen=True):
    """Compute imbalance of one group in one step (``imbalance.groups[]``).

    Attributes:
        dim: Parallel dimension (``dp``, ``tp``, ``pp``, ``ep``, …), or ``world``.
        pg: Process group name. Null/absent: ``""`` for ``world``.
        step: Step.
        ranks: Ranks in the group with the step.
        max_us: Largest compute time. Unit: µs.
        mean_us: Mean compute time. Unit: µs.
        imbalance: max / mean (in ``summary[]``: its mean over steps). Unit: ratio. Null/absent:
            ``null`` when the mean is 0.
        cost_us: max − mean (in ``summary[]``: its mean per step). Unit: µs.
        slowest_rank: Rank with the most compute (in ``summary[]``: most often the slowest).
    """

    dim: str
    pg: str
    step: int
    ranks: int = 0
    max_us: Number = NAN
    mean_us: Number = NAN
    imbalance: Number | None = None
    cost_us: Number = NAN
    slowest_rank: int = 0


class SkewOrigin(msgspec.Struct, kw_only=True, frozen=True):
    """Where one rank's arrival skew arises (``imbalance.skew_origin[]``).

    Attributes:
        rank: The rank.
        steps: Steps that every rank has.
        start_late_us: Median time by which the rank starts the step after the earliest rank
            (aligned clocks). Unit: µs.
        delay_us: Its arrival delay summed over complete collectives, per step. Unit: µs.
        top_collective: The collective (``"op #k of the step on group"``) that holds most of
            that delay. Null/absent: ``null`` without delay.
        top_delay_us: That collective's delay per step. Unit: µs.
        top_share_pct: Its share. Unit: % of ``delay_us``. Null/absent: ``null`` when
            ``delay_us`` is 0.
    """

    rank: int
    steps: int = 0
    start_late_us: Number = NAN
    delay_us: Number = NAN
    top_collective: str | None = None
    top_delay_us: Number = NAN
    top_share_pct: Number | None = None


class ImbalanceSection(msgspec.Struct, kw_only=True, frozen=True):
    """Compute-time imbalance per parallel dimension, and where arrival skew comes from
    (``imbalance``).

    Attributes:
        summary: Imbalance per dimension and group, over steps. Null/absent: ``[]`` with fewer
            than 2 ranks per group.
        groups: Imbalance per dimension, group and step.
        skew_origin: Where each rank's arrival skew arises. Null/absent: ``[]`` without 2 ranks
            with steps.
    """

    summary: list[ImbalanceSummary] = msgspec.field(default_factory=list)
    groups: list[ImbalanceStep] = msgspec.field(default_factory=list)
    skew_origin: list[SkewOrigin] = msgspec.field(default_factory=list)


class CauseRank(msgspec.Struct, kw_only=True, frozen=True):
    """The medians over one rank's steps of :class:`CauseStep` (``causes.per_rank[]``).

    Attributes:
        rank: The rank.
        steps: Steps the medians are taken over.
        span_us: Length of the step. Unit: µs.
        data_loading_us: Host: in the DataLoader iterator. Unit: µs.
        sync_us: Host: blocked in a device synchronization (``cuda*Synchronize``, ``.item()``,
            ``cudaMemcpy``, …). Unit: µs.
        comm_us: Host: inside a communication call or a wait for one (``c10d::wait``,
            ``wait_tensor``), or waiting while a transfer is in flight. This is host time, not
            ``ranks[].total.comm_us``. Unit: µs.
        launch_us: Host: other CUDA/HIP runtime and driver calls (kernel launches, async
            copies). Unit: µs.
        optimizer_us: Host: inside an ``optimizer`` event. Unit: µs.
        backward_us: Host: inside a ``backward`` event. Unit: µs.
        forward_us: Host: inside any other CPU operator, or a ``forward`` annotation. Unit: µs.
        other_us: Host: outside any operator (Python, sleeps, host contention). Unit: µs.
        dev_compute_us: Device: compute kernels. Unit: µs. Null/absent: ``null`` on CPU ranks.
        dev_memory_us: Device: memcpy/memset not under compute. Unit: µs. Null/absent: ``null``
            on CPU ranks.
        wait_comm_us: Device: communication kernels alone, plus idle time while the host is in a
            communication call. Unit: µs. Null/absent: ``null`` on CPU ranks.
        wait_sync_us: Device idle with nothing queued, while the host is in a synchronization.
            Unit: µs. Null/absent: ``null`` on CPU ranks.
        wait_host_us: Device idle with nothing queued, while the host does anything else
            (launch- or CPU-bound). Unit: µs. Null/absent: ``null`` on CPU ranks.
        wait_other_us: Device idle with work queued that did not run (a cross-stream
            dependency). Unit: µs. Null/absent: ``null`` on CPU ranks.
        dtensor_us: Host time in DTensor's redistributions, wrapping and dispatch, outside the
            optimizer. It overlaps the parts above. Unit: µs.
        fsdp_us: Host time in FSDP2's hooks (``FSDP::…``). It overlaps the parts above. Unit:
            µs.
        data_loading_pct: Median share of data loading. Unit: % of step. Null/absent: ``null``
            when the span is 0.
        dev_compute_pct: Median share of device compute and memory time. Unit: % of step.
            Null/absent: ``null`` on CPU ranks.
        wait_host_pct: Median share of ``wait_host_us`` + ``wait_sync_us``. Unit: % of step.
            Null/absent: ``null`` on CPU ranks.
    """

    rank: int
    steps: int = 0
    span_us: Number = NAN
    data_loading_us: Number = NAN
    sync_us: Number = NAN
    comm_us: Number = NAN
    launch_us: Number = NAN
    optimizer_us: Number = NAN
    backward_us: Number = NAN
    forward_us: Number = NAN
    other_us: Number = NAN
    dev_compute_us: Number | None = None
    dev_memory_us: Number | None = None
    wait_comm_us: Number | None = None
    wait_sync_us: Number | None = None
    wait_host_us: Number | None = None
    wait_other_us: Number | None = None
    dtensor_us: Number = NAN
    fsdp_us: Number = NAN
    data_loading_pct: Number | None = None
    dev_compute_pct: Number | None = None
    wait_host_pct: Number | None = None


class CauseStep(msgspec.Struct, kw_only=True, frozen=True):
    """One rank's step split into host parts (summing to ``span_us``) and device parts (GPU ranks)
    (``causes.per_step[]``).

    Attributes:
        rank: The rank.
        step: Step.
        start_us: CPU start of the ``ProfilerStep``. Unit: µs (rank clock).
        end_us: CPU end of the ``ProfilerStep``. Unit: µs (rank clock).
        span_us: Length of the step. Unit: µs.
        data_loading_us: Host: in the DataLoader iterator. Unit: µs.
        sync_us: Host: blocked in a device synchronization (``cuda*Synchronize``, ``.item()``,
            ``cudaMemcpy``, …). Unit: µs.
        comm_us: Host: inside a communication call or a wait for one (``c10d::wait``,
            ``wait_tensor``), or waiting while a transfer is in flight. This is host time, not
            ``ranks[].total.comm_us``. Unit: µs.
        launch_us: Host: other CUDA/HIP runtime and driver calls (kernel launches, async
            copies). Unit: µs.
        optimizer_us: Host: inside an ``optimizer`` event. Unit: µs.
        backward_us: Host: inside a ``backward`` event. Unit: µs.
        forward_us: Host: inside any other CPU operator, or a ``forward`` annotation. Unit: µs.
        other_us: Host: outside any operator (Python, sleeps, host contention). Unit: µs.
        dev_compute_us: Device: compute kernels. Unit: µs. Null/absent: ``null`` on CPU ranks.
        dev_memory_us: Device: memcpy/memset not under compute. Unit: µs. Null/absent: ``null``
            on CPU ranks.
        wait_comm_us: Device: communication kernels alone, plus idle time while the host is in a
            communication call. Unit: µs. Null/absent: ``null`` on CPU ranks.
        wait_sync_us: Device idle with nothing queued, while the host is in a synchronization.
            Unit: µs. Null/absent: ``null`` on CPU ranks.
        wait_host_us: Device idle with nothing queued, while the host does anything else
            (launch- or CPU-bound). Unit: µs. Null/absent: ``null`` on CPU ranks.
        wait_other_us: Device idle with work queued that did not run (a cross-stream
            dependency). Unit: µs. Null/absent: ``null`` on CPU ranks.
        dtensor_us: Host time in DTensor's redistributions, wrapping and dispatch, outside the
            optimizer. It overlaps the parts above. Unit: µs.
        fsdp_us: Host time in FSDP2's hooks (``FSDP::…``). It overlaps the parts above. Unit:
            µs.
    """

    rank: int
    step: int
    start_us: Number = NAN
    end_us: Number = NAN
    span_us: Number = NAN
    data_loading_us: Number = NAN
    sync_us: Number = NAN
    comm_us: Number = NAN
    launch_us: Number = NAN
    optimizer_us: Number = NAN
    backward_us: Number = NAN
    forward_us: Number = NAN
    other_us: Number = NAN
    dev_compute_us: Number | None = None
    dev_memory_us: Number | None = None
    wait_comm_us: Number | None = None
    wait_sync_us: Number | None = None
    wait_host_us: Number | None = None
    wait_other_us: Number | None = None
    dtensor_us: Number = NAN
    fsdp_us: Number = NAN


class CauseExcess(msgspec.Struct, kw_only=True, frozen=True):
    """How far one rank's part exceeds the other ranks' (``causes.excess[]``).

    Attributes:
        rank: The rank.
        part: A host or device part: a key of ``per_step[]``, e.g. ``"data_loading_us"``.
        rank_us: Its median over steps. Unit: µs.
        peers_us: Median over steps of the other ranks' median. Unit: µs.
        excess_us: Median over steps of (its value − the others' median in the same step). Unit:
            µs.
    """

    rank: int
    part: str
    rank_us: Number = NAN
    peers_us: Number = NAN
    excess_us: Number = NAN


class InputBound(msgspec.Struct, kw_only=True, frozen=True):
    """Data loading takes 10% of the step or more on some rank (``causes.input_bound``).

    Attributes:
        ranks: Ranks whose data loading takes ≥ 10% of the step.
        share_pct: Each rank's median share of data loading. Unit: % of step.
        data_loading_us: Each rank's median data loading. Unit: µs.
        all_ranks: Every rank is input-bound.
        step_us: The run's median step (the slowest rank per step). Unit: µs. Null/absent:
            ``null`` without a step time.
        predicted_step_us: ``step_us`` less the median over steps of the largest data loading: a
            first-order estimate. Unit: µs.
    """

    ranks: list[int] = msgspec.field(default_factory=list)
    share_pct: dict[str, Number] = msgspec.field(default_factory=dict)
    data_loading_us: dict[str, Number] = msgspec.field(default_factory=dict)
    all_ranks: bool = False
    step_us: Number | None = None
    predicted_step_us: Number | None = None


class HostBound(msgspec.Struct, kw_only=True, frozen=True):
    """The GPUs compute under 30% of the step and idle waiting for the host at least as long
    (``causes.host_bound``).

    Attributes:
        busy_pct: Median over GPU ranks of ``dev_compute_pct``. Unit: % of step.
        wait_host_pct: Median over GPU ranks of ``wait_host_pct``. Unit: % of step.
        ranks: The GPU ranks.
    """

    busy_pct: Number = NAN
    wait_host_pct: Number = NAN
    ranks: list[int] = msgspec.field(default_factory=list)


class CausesSection(msgspec.Struct, kw_only=True, frozen=True):
    """Where each rank's step goes on the host and the device (``causes``).

    Attributes:
        per_rank: Median over each rank's steps. Null/absent: ``[]`` without steps.
        per_step: Per rank and step. Null/absent: ``[]`` without steps.
        excess: Per rank and part: how far it exceeds the other ranks. Null/absent: ``[]`` with
            fewer than 2 ranks.
        input_bound: Data loading takes ≥ 10% of the step on some rank. Null/absent: ``null``
            when no rank is input-bound.
        host_bound: The GPUs compute under 30% of the step, and idle waiting for the host at
            least as long. Null/absent: ``null`` when not host-bound, and on CPU runs.
    """

    per_rank: list[CauseRank] = msgspec.field(default_factory=list)
    per_step: list[CauseStep] = msgspec.field(default_factory=list)
    excess: list[CauseExcess] = msgspec.field(default_factory=list)
    input_bound: InputBound | None = None
    host_bound: HostBound | None = None


class MemoryRank(msgspec.Struct, kw_only=True, frozen=True):
    """One rank's static and peak memory (``memory.per_rank[]``).

    Attributes:
        rank: The rank.
        params_bytes: Parameters. Unit: bytes. Null/absent: ``null`` when unknown.
        grads_bytes: Gradients. Unit: bytes. Null/absent: ``null`` when unknown.
        optimizer_state_bytes: Optimizer state. Unit: bytes. Null/absent: ``null`` when unknown.
        static_bytes: Parameters + gradients + optimizer state. Unit: bytes. Null/absent:
            ``null`` when unknown.
        peak_allocated_bytes: Peak allocated memory: the CUDA allocator's peak when recorded,
            else the trace's ``[memory]`` events (the accelerator, else the CPU). Unit: bytes.
            Null/absent: ``null`` when unknown.
        peak_reserved_bytes: Peak reserved memory, from the same source. Unit: bytes.
            Null/absent: ``null`` when unknown.
        peak_rss_bytes: The process's peak resident set size. Unit: bytes. Null/absent: ``null``
            when unknown.
        peak_bytes: The rank's peak as the report, the recommendations and ``pardiag compare``
            state it: static + transient. A device allocator's peak holds the static state; a
            CPU trace's window peak (below the static bytes) is transient only, and the static
            bytes are added; without an allocator peak, the peak RSS (``peak_definition`` says
            which). Unit: bytes. Null/absent: ``null`` when unknown.
    """

    rank: int
    params_bytes: Number | None = None
    grads_bytes: Number | None = None
    optimizer_state_bytes: Number | None = None
    static_bytes: Number | None = None
    peak_allocated_bytes: Number | None = None
    peak_reserved_bytes: Number | None = None
    peak_rss_bytes: Number | None = None
    peak_bytes: Number | None = None


class MemoryImbalance(msgspec.Struct, kw_only=True, frozen=True):
    """max / mean of the ranks' memory (``memory.imbalance``).

    Attributes:
        static: max / mean of ``static_bytes``. Unit: ratio. Null/absent: ``null`` when unknown.
        peak: max / mean of ``peak_bytes``. Unit: ratio. Null/absent: ``null`` when unknown.
    """

    static: Number | None = None
    peak: Number | None = None


class MemorySection(msgspec.Struct, kw_only=True, frozen=True):
    """Static and peak memory per rank (``memory``).

    Attributes:
        per_rank: Static and peak memory per rank.
        imbalance: max / mean across ranks.
        peak_definition: How ``per_rank[].peak_bytes`` was taken, e.g. "static state + the trace
            window's allocation peak (…)"; ``"not recorded"`` without a peak.
    """

    per_rank: list[MemoryRank] = msgspec.field(default_factory=list)
    imbalance: MemoryImbalance = msgspec.field(default_factory=MemoryImbalance)
    peak_definition: str = ""


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
        dim: The group's dimension (``dp``, ``tp``, ``pp``, ``ep``, ``dp_shard``, …).
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
        strategies: Sorted: ``ddp``, ``fsdp1``, ``fsdp2``, ``zero1``, ``tp``, ``ep``,
            ``pipeline``. Null/absent: ``[]`` when none was detected.
        pipeline: The pipeline's schedule, stages and microbatches. Null/absent: ``null``
            without a pipeline.
        nodes: The ranks on each host. Null/absent: ``{}`` when hosts are unknown (traces from
            elsewhere).
        groups: Process groups (from pardiag's records, else from the traces'
            ``distributedInfo.pg_config``). Null/absent: ``[]`` when unknown.
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
        ranks: One entry per loaded rank: its file and time breakdown.
        collectives: Time per collective type over all ranks, most time first. Null/absent:
            ``[]`` without communication.
        step_time: Step time and spread per rank, plus one row for the run. Null/absent: ``[]``
            without profiler steps.
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
    ranks: list[RankEntry]
    collectives: list[CollectiveTotal] = msgspec.field(default_factory=list)
    step_time: list[StepTimeRow] = msgspec.field(default_factory=list)
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
    verdict: str = ""
    straggler: int | None | UnsetType = UNSET
    step: MeasuredStep | None = None
    recommendations: list[RecommendationEntry] = msgspec.field(default_factory=list)
    not_recommended: list[RecommendationEntry] = msgspec.field(default_factory=list)
    recommendations_note: str | None = None
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


def decode_report(data: bytes | dict, source: str | Path = "summary") -> ReportDocument:
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
