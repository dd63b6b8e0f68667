"""The report JSON's per-rank objects as types (see :mod:`.schema`): each rank's breakdown,
its steps and collectives, the collectives over all ranks, step times and operators; and the
number type every schema module shares."""

from __future__ import annotations

import math

import msgspec
from msgspec import UNSET, UnsetType

#: A JSON number: an int or a float, kept as written (a Struct field of this type encodes an int
#: as an int).
Number = int | float


#: The default of a number an older report lacks (read as "unknown", as compare treats it).
NAN = math.nan


class BreakdownTotals(msgspec.Struct, kw_only=True, frozen=True):
    """A rank's breakdown over its whole trace window (``ranks[].total``). K is the union of the
    computation intervals, C of the communication intervals, M of the device's memory copies and
    sets; compute_only_us + overlap_us + exposed_comm_us + memory_only_us + idle_us = span_us.

    Attributes:
        span_us: Length of the window. ``total`` is the whole trace window, summed over
            profiling windows. Unit: µs.
        compute_us: |K|: computation. Unit: µs.
        comm_us: |C|: communication. Unit: µs.
        overlap_us: |K ∩ C|: communication under computation. Unit: µs.
        compute_only_us: |K| − overlap. Unit: µs.
        exposed_comm_us: |C| − overlap: communication not hidden by computation. Unit: µs.
        memory_only_us: |M − (K ∪ C)|: the device copies (memcpy, memset) and neither computes
            nor communicates; 0 on CPU traces. Unit: µs.
        idle_us: Window − |K ∪ C ∪ M| (host gaps, nothing running). Unit: µs.
        overlap_pct: 100 · overlap / |C| (HTA's overlap). Unit: % of comm time. Null/absent:
            ``null`` without communication.
        compute_only_pct: Compute only / span. Unit: % of window. Null/absent: ``null`` when the
            span is 0.
        overlap_share_pct: Overlap / span. Unit: % of window. Null/absent: ``null`` when the
            span is 0.
        exposed_comm_pct: Exposed communication / span. Unit: % of window. Null/absent: ``null``
            when the span is 0.
        memory_only_pct: Memory copies only / span. Unit: % of window. Null/absent: ``null``
            when the span is 0.
        idle_pct: Idle / span. Unit: % of window. Null/absent: ``null`` when the span is 0.
    """

    span_us: Number | UnsetType = UNSET
    compute_us: Number | UnsetType = UNSET
    comm_us: Number | UnsetType = UNSET
    overlap_us: Number | UnsetType = UNSET
    compute_only_us: Number | UnsetType = UNSET
    exposed_comm_us: Number | UnsetType = UNSET
    memory_only_us: Number | UnsetType = UNSET
    idle_us: Number | UnsetType = UNSET
    overlap_pct: Number | None | UnsetType = UNSET
    compute_only_pct: Number | None | UnsetType = UNSET
    overlap_share_pct: Number | None | UnsetType = UNSET
    exposed_comm_pct: Number | None | UnsetType = UNSET
    memory_only_pct: Number | None | UnsetType = UNSET
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
        memory_only_us: |M − (K ∪ C)|: the device copies (memcpy, memset) and neither computes
            nor communicates; 0 on CPU traces. Unit: µs.
        idle_us: Window − |K ∪ C ∪ M| (host gaps, nothing running). Unit: µs.
        overlap_pct: 100 · overlap / |C| (HTA's overlap). Unit: % of comm time. Null/absent:
            ``null`` without communication.
        compute_only_pct: Compute only / span. Unit: % of window. Null/absent: ``null`` when the
            span is 0.
        overlap_share_pct: Overlap / span. Unit: % of window. Null/absent: ``null`` when the
            span is 0.
        exposed_comm_pct: Exposed communication / span. Unit: % of window. Null/absent: ``null``
            when the span is 0.
        memory_only_pct: Memory copies only / span. Unit: % of window. Null/absent: ``null``
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
    memory_only_us: Number = NAN
    idle_us: Number = NAN
    overlap_pct: Number | None = None
    compute_only_pct: Number | None = None
    overlap_share_pct: Number | None = None
    exposed_comm_pct: Number | None = None
    memory_only_pct: Number | None = None
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
            ``"file name"``, ``"records"`` (the caller's ``Rank`` in its collectives' records)
            or ``"assigned"``.
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


class RunStepRow(msgspec.Struct, kw_only=True, frozen=True):
    """One optimizer step of the whole run on one rank (``run_steps[]``), from ``pardiag
    profile``'s metadata: every step the script made, not only the profiled ones.

    Attributes:
        rank: The rank.
        step: The optimizer step (0-based; step 0 has no period).
        period_us: Time from the end of the rank's previous optimizer step to the end of this
            one (the span of ``ProfilerStep#step``). Unit: µs.
        profiled: The trace recorded this step (``--wait + --warmup`` ≤ step < ``--wait +
            --warmup + --active``); the profiler slows such steps down.
    """

    rank: int
    step: int
    period_us: Number
    profiled: bool


class DeviceRow(msgspec.Struct, kw_only=True, frozen=True):
    """One device of a rank whose trace holds several (``devices[]``): a process that drives
    several GPUs writes their kernels into one trace, and the rank's breakdown is their union.

    Attributes:
        rank: The rank.
        device: The device id (the events' ``device`` arg, else their ``pid``).
        kernels: Kernels, copies and sets the device ran.
        compute_us: Time the device computes: the union of its computation kernels. Unit: µs.
        busy_us: Time the device runs anything: the union of all its events. Unit: µs.
        idle_pct: Share of the rank's span (``ranks[].total.span_us``) in which the device
            runs nothing. Unit: %.
    """

    rank: int
    device: int
    kernels: int
    compute_us: Number
    busy_us: Number
    idle_pct: Number


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
        rank_steps: The ranks' training steps summed (profiler steps, or optimizer steps where
            several profiler steps make one; a rank without steps counts 1). ``per_step_us`` is
            divided by it.
        total: Number of (kind, name) rows in the full table.
        rows: The first 2,000 rows, most time first. Any name left out took less time than every
            name listed. Null/absent: ``[]`` without events.
    """

    rank_steps: int = 0
    total: int = 0
    rows: list[OperatorRow] = msgspec.field(default_factory=list)
