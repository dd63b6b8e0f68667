"""The report JSON's ``efficiency`` section: FLOPs, MFU and the roofline per op class
(:mod:`pardiag.analyzer.analyses.efficiency`)."""

from __future__ import annotations

import msgspec

from .schema_ranks import NAN, Number


class EfficiencyRank(msgspec.Struct, kw_only=True, frozen=True):
    """One rank's FLOPs and MFU (``efficiency.per_rank[]``).

    Attributes:
        rank: Global rank.
        device: The device as the peak table names it (``"H100 SXM"``), its own name when the
            table does not know it, or ``"cpu"``.
        dtype: The dtype that carries most of the rank's model FLOPs, whose peak is used.
            Null/absent: ``null`` without model FLOPs.
        peak_tflops: The peak MFU is computed against. Unit: TFLOP/s (dense). Null/absent:
            ``null`` when unknown (a device the table does not list, a CPU trace not recorded by
            ``pardiag profile``): give ``--peak-tflops``.
        peak_source: Where the peak comes from: the datasheet, ``"measured when the rank started
            (float32 matmul)"`` or ``"--peak-tflops"``. Null/absent: ``null`` when unknown.
        bandwidth_gbps: The device's memory bandwidth. Unit: GB/s. Null/absent: ``null`` when
            unknown.
        steps: Profiler steps counted.
        model_tflop_per_step: Model FLOPs per step (matmul, convolution, attention), median over
            the steps. Unit: TFLOP (10¹²). Null/absent: ``null`` when the trace shows activation
            recomputation, or a step holds such an op whose FLOPs are unknown.
        executed_tflop_per_step: Executed FLOPs per step (every counted op), median. Unit: TFLOP.
            Null/absent: ``null`` when a step holds an op whose FLOPs are unknown.
        achieved_tflops: Model FLOPs / step time, median over the steps. Unit: TFLOP/s.
            Null/absent: ``null`` when the model FLOPs are unknown.
        mfu_pct: Model FLOPs utilisation: model FLOPs / (step time × peak), median over the
            steps. Unit: %. Null/absent: ``null`` when the peak or the model FLOPs are unknown.
        mfu_pct_min: The lowest step's MFU. Unit: %. Null/absent: as ``mfu_pct``.
        mfu_pct_max: The highest step's MFU. Unit: %. Null/absent: as ``mfu_pct``.
        hfu_pct: Hardware FLOPs utilisation: executed FLOPs / (step time × peak), median. Unit: %.
            Null/absent: ``null`` when the peak is unknown.
        tokens_per_s: ``--tokens-per-step`` / step time, median. Unit: tokens/s. Null/absent:
            ``null`` without ``--tokens-per-step``.
        recomputed_ops: Forward ops that ran inside the backward (activation recomputation).
        unknown_ops: Counted ops whose shapes do not fit their formula (left out of the sums).
    """

    rank: int
    device: str = ""
    dtype: str | None = None
    peak_tflops: Number | None = None
    peak_source: str | None = None
    bandwidth_gbps: Number | None = None
    steps: int = 0
    model_tflop_per_step: Number | None = None
    executed_tflop_per_step: Number = NAN
    achieved_tflops: Number | None = None
    mfu_pct: Number | None = None
    mfu_pct_min: Number | None = None
    mfu_pct_max: Number | None = None
    hfu_pct: Number | None = None
    tokens_per_s: Number | None = None
    recomputed_ops: int = 0
    unknown_ops: int = 0


class EfficiencyStep(msgspec.Struct, kw_only=True, frozen=True):
    """One rank's step (``efficiency.per_step[]``).

    Attributes:
        rank: Global rank.
        step: Profiler step number.
        step_us: The step's duration. Unit: µs.
        model_flops: Model FLOPs in the step. Unit: FLOP. Null/absent: ``null`` when the trace
            shows activation recomputation, or the step holds a matmul, convolution or attention
            whose FLOPs are unknown.
        executed_flops: Executed FLOPs in the step. Unit: FLOP. Null/absent: ``null`` when the
            step holds an op whose FLOPs are unknown.
        unknown_ops: Counted ops in the step whose shapes do not fit their formula.
        achieved_tflops: ``model_flops`` / ``step_us``. Unit: TFLOP/s. Null/absent: as
            ``model_flops``.
        mfu_pct: ``model_flops`` / (``step_us`` × peak). Unit: %. Null/absent: ``null`` when the
            peak or the model FLOPs are unknown.
        hfu_pct: ``executed_flops`` / (``step_us`` × peak). Unit: %. Null/absent: ``null`` when
            the peak is unknown.
        tokens_per_s: ``--tokens-per-step`` / ``step_us``. Unit: tokens/s. Null/absent: ``null``
            without ``--tokens-per-step``.
    """

    rank: int
    step: int
    step_us: Number = NAN
    model_flops: Number | None = None
    executed_flops: Number = NAN
    unknown_ops: int = 0
    achieved_tflops: Number | None = None
    mfu_pct: Number | None = None
    hfu_pct: Number | None = None
    tokens_per_s: Number | None = None


class EfficiencyClass(msgspec.Struct, kw_only=True, frozen=True):
    """One op class and dtype over all ranks' steps (``efficiency.per_class[]``): a point of the
    roofline.

    Attributes:
        op_class: ``matmul``, ``convolution``, ``attention``, ``norm``, ``softmax`` or
            ``elementwise``.
        dtype: The ops' dtype (``float32``, ``bfloat16``, ...; ``unknown`` when not recorded).
        ops: Ops counted.
        flops: Their FLOPs. Unit: FLOP.
        bytes: Bytes they read and write (each input and output once). Unit: bytes.
        time_us: Their time: the kernels they launched on GPU ranks, the ops' own duration on
            CPU ranks. Unit: µs.
        time_basis: ``device`` or ``cpu``: which time ``time_us`` is.
        achieved_tflops: ``flops`` / ``time_us``. Unit: TFLOP/s. Null/absent: ``null`` when
            ``time_us`` is 0.
        achieved_gbps: ``bytes`` / ``time_us``. Unit: GB/s. Null/absent: ``null`` when
            ``time_us`` is 0.
        intensity: Arithmetic intensity, ``flops`` / ``bytes``. Unit: FLOP/byte. Null/absent:
            ``null`` without bytes.
        peak_tflops: The ranks' peak (median). Unit: TFLOP/s. Null/absent: ``null`` when unknown.
        bandwidth_gbps: The ranks' memory bandwidth (median). Unit: GB/s. Null/absent: ``null``
            when unknown.
    """

    op_class: str
    dtype: str
    time_basis: str
    ops: int = 0
    flops: Number = NAN
    bytes: Number = NAN
    time_us: Number = NAN
    achieved_tflops: Number | None = None
    achieved_gbps: Number | None = None
    intensity: Number | None = None
    peak_tflops: Number | None = None
    bandwidth_gbps: Number | None = None


class EfficiencyModule(msgspec.Struct, kw_only=True, frozen=True):
    """One module over all ranks' steps (``efficiency.per_module[]``): its own counted ops (those
    in no submodule's range), forward in its range and backward linked to it by autograd's
    sequence numbers.

    Attributes:
        module: The module's qualified name under its root, prefixed with the root's class
            (``GPT.blocks.0.attn``, torch's module tracker's names; ``GPT_1`` for a second root of
            that class; with the profiler's own frames, their nesting: ``Net_0.Linear_1``), or
            ``(optimizer)`` for the ops of the optimizer's step. Null/absent: ``null`` for the
            ops of no known module.
        module_class: The module's class (the optimizer's class for ``(optimizer)``).
            Null/absent: ``null`` with ``module`` null.
        ranks: Ranks that ran it.
        ops: Ops counted.
        forward_flops: FLOPs of its ops outside the backward. Unit: FLOP.
        backward_flops: FLOPs of its ops inside the backward. Unit: FLOP.
        recomputed_flops: Of ``backward_flops``, the forward ops the trace shows recomputed inside
            the backward (activation checkpointing). Unit: FLOP.
        flops: Their sum. Unit: FLOP.
        bytes: Bytes its ops read and write. Unit: bytes.
        time_us: Its ops' time (kernels on GPU ranks, the ops on CPU ranks). Unit: µs.
        time_basis: ``device`` or ``cpu``: which time ``time_us`` is.
        time_pct: Its share of all counted ops' time of that basis. Unit: %.
        achieved_tflops: ``flops`` / ``time_us``. Unit: TFLOP/s. Null/absent: ``null`` when an
            op's FLOPs are unknown or ``time_us`` is 0.
        achieved_gbps: ``bytes`` / ``time_us``. Unit: GB/s. Null/absent: ``null`` likewise.
        intensity: ``flops`` / ``bytes``. Unit: FLOP/byte. Null/absent: ``null`` likewise.
        unknown_ops: Its ops whose shapes fit no formula (not in ``flops``).
        inclusive_flops: ``flops`` of the module and of every module under it (whose name it
            prefixes: ``GPT.blocks.0`` holds ``GPT.blocks.0.attn``); its own for
            ``(optimizer)`` and the row of no module. Unit: FLOP.
        inclusive_time_us: ``time_us`` likewise. Unit: µs.
    """

    time_basis: str
    module: str | None = None
    module_class: str | None = None
    ranks: int = 0
    ops: int = 0
    forward_flops: Number = NAN
    backward_flops: Number = NAN
    recomputed_flops: Number = NAN
    flops: Number = NAN
    bytes: Number = NAN
    time_us: Number = NAN
    time_pct: Number | None = None
    achieved_tflops: Number | None = None
    achieved_gbps: Number | None = None
    intensity: Number | None = None
    unknown_ops: int = 0
    inclusive_flops: Number = NAN
    inclusive_time_us: Number = NAN


class EfficiencySection(msgspec.Struct, kw_only=True, frozen=True):
    """How far each rank is from its device's peak (``efficiency``).

    Attributes:
        mfu_pct: The run's MFU: all ranks' model FLOPs / Σ over ranks of step time × peak.
            Unit: %. Null/absent: ``null`` when any rank's peak or model FLOPs are unknown.
        per_rank: FLOPs and MFU per rank. Null/absent: ``[]`` without counted ops whose shapes
            were recorded (``record_shapes``).
        per_step: FLOPs and MFU per rank and step. Null/absent: ``[]`` without counted ops.
        per_class: Achieved rate and arithmetic intensity per op class and dtype. Null/absent:
            ``[]`` without counted ops.
        per_module: Achieved rate and arithmetic intensity per module, by time. Null/absent:
            ``[]`` without module ranges (recorded by ``pardiag profile``, or the profiler's
            with ``with_stack=True``).
        notes: Why a number is unknown and what the counts leave out. Null/absent: ``[]`` when
            none.
    """

    mfu_pct: Number | None = None
    per_rank: list[EfficiencyRank] = msgspec.field(default_factory=list)
    per_step: list[EfficiencyStep] = msgspec.field(default_factory=list)
    per_class: list[EfficiencyClass] = msgspec.field(default_factory=list)
    per_module: list[EfficiencyModule] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
