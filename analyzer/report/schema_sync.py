"""The report JSON's cross-rank timing objects as types (see :mod:`.schema`): clock offsets,
stragglers, matched instances, bandwidth, point-to-point links, arrival skew, and the pipeline's
schedule and bubbles."""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

from .schema_ranks import NAN, Number


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
        wait_caused_us: Waiting this rank caused as its root cause: over the other ranks, the
            length of the union of their waits for it, less the part during which it was itself
            waiting for another rank (that part is charged down the chain, Scalasca's delay
            costs). Unit: µs.
        last_arrivals: Instances it arrived last at (of a broadcast or scatter: the root, the
            one its members wait for).
        steps_as_top: Steps in which it caused the most wait.
        instances: Complete instances it took part in that are evidence (not at a window's
            head) and at which it could be the one waited for: a broadcast or scatter only for
            its root.
        waiting_us: Length of the union of its waits at every complete instance, window heads
            included: the waiting part of its exposed communication is at most this, the rest is
            transfer. Unit: µs. Null/absent: ``null`` when no complete instance holds the rank
            (its peers' traces are absent): its split is unknown.
        head_waiting_us: The part of ``waiting_us`` at instances at a window's head (before
            every rank's trace had started, and the first step after where the traces start
            apart): the profilers' start-up, no evidence of a slow peer. Unit: µs. Null/absent:
            ``null`` as ``waiting_us``.
    """

    rank: int
    wait_suffered_us: Number = NAN
    wait_caused_us: Number = NAN
    last_arrivals: int = 0
    steps_as_top: int = 0
    instances: int = 0
    waiting_us: Number | None = None
    head_waiting_us: Number | None = None


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
        ideal_from: How ``ideal_pct`` was found: ``"replay"`` (each step's own action order
            replayed with balanced stage costs and free transfers, for any schedule) or
            ``"formula"`` (100·(p−1)/(v·m+p−1), where no order is recorded; for GPipe, 1F1B
            and Interleaved1F1B only). Null/absent: ``null`` when neither applies (another
            schedule whose order does not replay).
    """

    schedule: str | None = None
    p: int | None = None
    m: int | None = None
    v: int | None = None
    stages: int | None = None
    source: str | UnsetType = UNSET
    microbatches_estimated: bool | UnsetType = UNSET
    ideal_from: str | None = None


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
        ideal_pct: Ideal bubble: the step's own action order replayed with balanced stage costs
            and free transfers, else 100·(p−1)/(v·m+p−1) (``schedule.ideal_from``). Unit: % of
            window. Null/absent: ``null`` when neither can be found.
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
