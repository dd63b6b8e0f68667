"""The report JSON's why-objects as types (see :mod:`.schema`): compute imbalance and where
skew starts, the causes per rank and step, and memory."""

from __future__ import annotations

import msgspec

from .schema_ranks import NAN, Number


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
        forward_us: Host: inside any other CPU operator (a sleep inside a ``forward``
            annotation is outside any operator). Unit: µs.
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
        forward_us: Host: inside any other CPU operator (a sleep inside a ``forward``
            annotation is outside any operator). Unit: µs.
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
