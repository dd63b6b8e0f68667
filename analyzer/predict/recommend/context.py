"""The one typed context every recommendation rule reads, built once per report.

:func:`build_context` gathers what the rules need from the earlier analyses (time breakdown,
sync, pipeline, balance, memory, layout, overlap per dimension), the pipeline replay
(:mod:`pardiag.analyzer.predict.replay`), the run's recorded settings, the device capacity, the
measured peak memory (one definition for every rule, :class:`MeasuredPeak`) and the measured
step time with its noise (:class:`StepNoise`). Rules never read the earlier results by string
key and never re-derive the layout.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pandas as pd

from pardiag.layout import contention_note

from ...analyses.breakdown import OUTLIER_STEP_FACTOR, TimeBreakdown, run_step_periods
from ...analyses.causes import CausesResult
from ...analyses.critical_path import CriticalPathResult
from ...analyses.dim_overlap import DimOverlapResult
from ...analyses.efficiency import EfficiencyResult
from ...analyses.imbalance import BalanceResult
from ...analyses.layout import LayoutResult
from ...analyses.memory import MemoryResult
from ...analyses.pipeline import PipelineResult
from ...analyses.routing import RoutingResult
from ...analyses.sync import SyncResult
from ...trace import vocab
from ...trace.traceset import TraceSet
from .. import whatif
from ..replay import PipelineModel, pipeline_model

#: Bootstrap resamples for the interval of the median step time (:func:`step_noise`).
BOOTSTRAP_RESAMPLES = 2000
#: Confidence of that interval.
BOOTSTRAP_CONFIDENCE = 0.95
#: Fixed seed: the same steps give the same interval, so a report does not change between
#: two builds of it.
BOOTSTRAP_SEED = 0


def ms(us: float) -> str:
    """``"12.3 ms"`` from µs."""
    return f"{us / 1000.0:.1f} ms"


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepNoise:
    """The measured step time a rule's prediction is compared with, and its noise.

    Attributes:
        median_us: median step time (µs) over ``samples_us``.
        low_us, high_us: the :data:`BOOTSTRAP_CONFIDENCE` percentile-bootstrap interval of that
            median (µs; :data:`BOOTSTRAP_RESAMPLES` resamples of the steps with replacement,
            Efron & Tibshirani, *An Introduction to the Bootstrap*, ch. 13); NaN with fewer
            than 3 steps.
        samples_us: the step times the median is over (µs), outlier steps left out.
        source: what the steps are, e.g. ``"8 unprofiled steps (start to start)"``.
        outliers: the step times left out, over :data:`OUTLIER_STEP_FACTOR` × the median (µs).
    """

    median_us: float
    low_us: float
    high_us: float
    samples_us: tuple[float, ...]
    source: str
    outliers: tuple[float, ...] = ()

    @property
    def steps(self) -> int:
        """How many steps the median is over."""
        return len(self.samples_us)

    @property
    def half_width_us(self) -> float:
        """Half the bootstrap interval (µs); NaN when it is unknown."""
        return (self.high_us - self.low_us) / 2.0

    @property
    def known(self) -> bool:
        """Whether the interval could be measured (3 or more steps)."""
        return not math.isnan(self.half_width_us)


def step_noise(samples_us, source: str) -> StepNoise:
    """The median of ``samples_us`` (µs) and its percentile-bootstrap interval
    (:class:`StepNoise`). Deterministic (:data:`BOOTSTRAP_SEED`).

    Raises:
        ValueError: when ``samples_us`` is empty."""
    x = np.asarray([float(s) for s in samples_us if pd.notna(s)], dtype=float)
    if not len(x):
        raise ValueError("no step times")
    med = float(np.median(x))
    if len(x) < 3:
        return StepNoise(median_us=med, low_us=float("nan"), high_us=float("nan"),
                         samples_us=tuple(x.tolist()), source=source)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    meds = np.median(x[rng.integers(0, len(x), size=(BOOTSTRAP_RESAMPLES, len(x)))], axis=1)
    a = (1.0 - BOOTSTRAP_CONFIDENCE) / 2.0
    lo, hi = np.quantile(meds, [a, 1.0 - a])
    return StepNoise(median_us=med, low_us=float(lo), high_us=float(hi),
                     samples_us=tuple(x.tolist()), source=source)


def _outliers(x: list[float]) -> tuple[float, ...]:
    """The values of ``x`` over :data:`OUTLIER_STEP_FACTOR` × its median (3 or more values):
    what :func:`_without_outliers` leaves out."""
    if len(x) < 3:
        return ()
    med = float(np.median(x))
    return tuple(v for v in x if v > OUTLIER_STEP_FACTOR * med)


def _without_outliers(x: list[float]) -> list[float]:
    """``x`` less the values over :data:`OUTLIER_STEP_FACTOR` × its median (3 or more)."""
    if len(x) < 3:
        return list(x)
    med = float(np.median(x))
    return [v for v in x if v <= OUTLIER_STEP_FACTOR * med]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeasuredPeak:
    """The worst rank's measured peak memory, one definition for every rule and table.

    Attributes:
        peak_bytes: static + transient bytes of the worst rank (bytes), None when unknown.
        static_bytes: its parameters + gradients + optimizer state (bytes), None when unknown.
        definition: how the peak was taken, one sentence (e.g. "the device allocator's peak,
            which holds the static state"; "static state + the trace window's allocation peak:
            a CPU trace sees only what was allocated inside its window").
    """

    peak_bytes: float | None
    static_bytes: float | None
    definition: str

    @property
    def transient_bytes(self) -> float | None:
        """Peak less static (activations, workspaces; bytes), None when either is unknown."""
        if self.peak_bytes is None or self.static_bytes is None:
            return None
        return max(self.peak_bytes - self.static_bytes, 0.0)


def measured_peak(memory: MemoryResult | None) -> MeasuredPeak:
    """The worst rank's peak (:class:`MeasuredPeak`): its ``peak_bytes``, static + transient
    (:func:`pardiag.analyzer.analyses.memory.peak_bytes`, the one definition the Memory section
    and ``pardiag compare`` show too)."""
    if memory is None or memory.per_rank.empty or "peak_bytes" not in memory.per_rank:
        return MeasuredPeak(peak_bytes=None, static_bytes=None, definition="not recorded")
    pr = memory.per_rank
    peak = pd.to_numeric(pr["peak_bytes"], errors="coerce")
    if peak.notna().sum() == 0:
        return MeasuredPeak(peak_bytes=None, static_bytes=None, definition="not recorded")
    i = peak.idxmax()
    s = pd.to_numeric(pr["static_bytes"], errors="coerce")[i]
    return MeasuredPeak(peak_bytes=float(peak[i]), static_bytes=float(s) if pd.notna(s) else None,
                        definition=memory.peak_definition)


def capacity_bytes(traces: TraceSet) -> float | None:
    """Device memory per rank (bytes) from the traces' ``deviceProperties``; None on CPU."""
    caps = []
    for t in traces.ranks.values():
        for d in vocab.DEVICE_PROPERTIES.get(t.metadata) or []:
            if isinstance(mem := vocab.DEVICE_TOTAL_MEMORY.get(d), (int, float)):
                caps.append(float(mem))
    return min(caps) if caps else None


def recorded_settings(traces: TraceSet) -> dict:
    """The run's recorded settings (``layout`` of run.json, else of the ranks' metadata):
    ``strategies``, ``dims``, ``ddp_bucket_cap_bytes``, ``ddp_param_bytes``,
    ``fsdp_reshard_after_forward``, ``fsdp1_forward_prefetch``…; ``{}`` for traces from
    elsewhere."""
    lay = dict((traces.run_info.layout if traces.run_info else None) or {})
    for meta in traces.rank_meta.values():   # rank metadata has keys run.json may not carry
        if isinstance(meta.layout, dict):
            for k, v in meta.layout.items():
                lay.setdefault(k, v)
    return lay


def clean_step_periods(traces: TraceSet) -> tuple[list[float], int]:
    """Step times (µs) after the profiler's window, when the ranks' metadata recorded every
    optimizer step (``pardiag profile``): per step, the median over the ranks of the time from
    their previous optimizer step's end to this one's (each on its own clock), taken only where
    both steps ran without the profiler. One sample per step, not per rank and step: ranks in
    lock-step share one period, so the ranks' periods of a step are not independent samples.
    Returns ``(periods in step order, steps used)``; ``([], 0)`` when there is none."""
    sch = traces.run_info.schedule if traces.run_info else None
    if sch is None:
        return [], 0
    first_clean = sch.wait + sch.warmup + sch.active
    # every rank's periods (:func:`run_step_periods`); step window_end + 1 on: the step right
    # after the window also holds the trace's export
    rs = run_step_periods(traces)
    rs = rs[(rs["step"] - 1 >= first_clean) & (rs["period_us"] > 0)]
    periods = [float(v) for v in rs.groupby("step")["period_us"].median()]
    return periods, len(periods)


def clean_step_us(traces: TraceSet) -> tuple[float, int]:
    """Median step time (µs) after the profiler's window (:func:`clean_step_periods`) and the
    number of steps it is over; ``(nan, 0)`` when there is none."""
    periods, n = clean_step_periods(traces)
    return (float(np.median(periods)), n) if periods else (float("nan"), 0)


def run_step_row(breakdown: TimeBreakdown) -> dict | None:
    """The run's row of the step-time spread (:attr:`TimeBreakdown.step_time`), or None."""
    st = breakdown.step_time
    run = st[st["rank"].isna()]
    return None if run.empty else run.iloc[0].to_dict()


def _profiled_step_samples(breakdown: TimeBreakdown) -> list[float]:
    """Per profiled step the slowest rank's span (µs), outlier steps left out."""
    steps = breakdown.steps
    if steps is None or steps.empty:
        return []
    row = run_step_row(breakdown)
    spans = steps.groupby("step")["span_us"].max()
    out = set(row["outlier_steps"]) if row else set()
    return [float(v) for k, v in spans.items() if int(k) not in out]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuleContext:
    """Everything a recommendation rule reads, built once (:func:`build_context`).

    Attributes:
        traces: the run.
        breakdown, sync, pipeline, balance, memory, layout, dim_overlap, routing, causes,
            critical_path, efficiency: the earlier analyses' results (None where an analysis did
            not run).
        settings: the run's recorded settings (:func:`recorded_settings`).
        model: the pipeline replay (:class:`pardiag.analyzer.predict.replay.PipelineModel`) of a
            pipeline run, else None; model_why: why there is none.
        step: the measured step the rules' predictions start from, with its noise: the
            replay's unprofiled step periods in a pipeline, else the profiled steps (slowest
            rank per step). None without a complete step.
        clean: the step measured after the profiler's window (the base predictions are scaled
            to, as ratios, outside pipelines), or None.
        peak: the worst rank's measured peak (:func:`measured_peak`).
        capacity: device memory per rank (bytes), None on CPU.
        on_gpu: whether any rank has GPU activity.
        contention: a sentence when the run's CPU ranks contended for cores
            (:func:`pardiag.layout.contention_note`), else None.
    """

    traces: TraceSet
    breakdown: TimeBreakdown
    sync: SyncResult | None = None
    pipeline: PipelineResult | None = None
    balance: BalanceResult | None = None
    memory: MemoryResult | None = None
    layout: LayoutResult | None = None
    dim_overlap: DimOverlapResult | None = None
    routing: RoutingResult | None = None
    causes: CausesResult | None = None
    critical_path: CriticalPathResult | None = None
    efficiency: EfficiencyResult | None = None
    settings: dict = dataclasses.field(default_factory=dict)
    model: PipelineModel | None = None
    model_why: str = "no pipeline"
    step: StepNoise | None = None
    clean: StepNoise | None = None
    peak: MeasuredPeak = MeasuredPeak(peak_bytes=None, static_bytes=None,
                                      definition="not recorded")
    capacity: float | None = None
    on_gpu: bool = False
    contention: str | None = None

    @property
    def measured_us(self) -> float:
        """The step time the rules compare with (µs); NaN without a complete step."""
        return self.step.median_us if self.step is not None else float("nan")

    @property
    def is_pipeline(self) -> bool:
        """Whether the run is a pipeline: a replay model, schedule records, or a schedule the
        traces show (point-to-point stages without per-microbatch marks included)."""
        return self.model is not None or (self.pipeline is not None and (
            len(self.pipeline.chunks) > 0 or bool(self.pipeline.schedule)))

    @property
    def dims(self) -> dict:
        """``{dim: degree}`` of the layout (``{}`` when unknown)."""
        return dict(self.layout.dims) if self.layout is not None else {}

    @property
    def strategies(self) -> set[str]:
        """The recorded strategies (``ddp``, ``fsdp2``, ``zero1``…)."""
        return set(self.settings.get("strategies") or [])

    def fits(self, peak_bytes: float | None) -> bool:
        """Whether a predicted peak fits the device (always on CPU, or when unknown)."""
        return self.capacity is None or peak_bytes is None or peak_bytes <= self.capacity

    @functools.cached_property
    def steps_per_rank(self) -> float:
        """Median number of profiled steps per rank (≥ 1 when there are none)."""
        n = self.breakdown.steps.groupby("rank")["step"].nunique()
        return float(n.median()) if len(n) else 1.0

    @functools.cached_property
    def _allreduce_points(self) -> tuple[list[float], list[float]]:
        """The run's all-reduces: bytes and transfer µs (min over ranks), in two lists."""
        if self.sync is None or self.sync.instances.empty:
            return [], []
        ar = self.sync.instances[self.sync.instances["op"] == "all_reduce"]
        return pd.to_numeric(ar["bytes"], errors="coerce").tolist(), ar["transfer_us"].tolist()

    @functools.cached_property
    def allreduce_fit(self) -> tuple[float, float] | None:
        """α (µs), β (µs/byte) of the run's all-reduces (transfer part: min over ranks)
        through the fastest of each size (:func:`whatif.fit_alpha_beta`), or None."""
        try:
            return whatif.fit_alpha_beta(*self._allreduce_points)
        except ValueError:
            return None

    @functools.cached_property
    def allreduce_fit_resamples(self) -> np.ndarray | None:
        """Bootstrap of :attr:`allreduce_fit` (:func:`whatif.alpha_beta_resamples`, seeded
        :data:`BOOTSTRAP_SEED`): shape ``(1000, 2)``, α (µs), β (µs/byte) per resample; None
        without all-reduces."""
        try:
            return whatif.alpha_beta_resamples(*self._allreduce_points, resamples=1000,
                                               seed=BOOTSTRAP_SEED)
        except ValueError:
            return None

    @functools.cached_property
    def all_gathers(self) -> pd.DataFrame:
        """Per rank (index): ``count`` and ``exposed`` (µs) of its all-gathers over the
        profiled steps."""
        colls = self.breakdown.collectives
        ag = colls[colls["collective"] == "all_gather"]
        return ag.groupby("rank").agg(count=("count", "sum"), exposed=("exposed_us", "sum"))

    @functools.cached_property
    def params_bytes(self) -> float | None:
        """The largest rank's parameter bytes (memory analysis), or None."""
        pr = self.memory.per_rank if self.memory is not None else pd.DataFrame()
        if not len(pr) or not pr["params_bytes"].notna().any():
            return None
        return float(pr["params_bytes"].max())

    @functools.cached_property
    def dim_comm_per_step(self) -> dict[str, tuple[float, float]]:
        """``{dim: (communication µs, exposed µs)}`` per rank and step (means over ranks)."""
        dov = self.dim_overlap
        if dov is None or dov.summary.empty:
            return {}
        return {str(r.dim): (float(r.comm_us) / self.steps_per_rank,
                             float(r.exposed_us) / self.steps_per_rank)
                for r in dov.summary.itertuples()}


def build_context(traces: TraceSet, done: dict) -> RuleContext:
    """The :class:`RuleContext` of a run from the earlier analyses (``done``: results by
    registry name: ``time_breakdown``, ``sync``, ``pipeline``, ``balance``, ``memory``,
    ``layout``, ``dim_overlap``). Builds the pipeline replay of a pipeline run."""
    bd: TimeBreakdown = done["time_breakdown"]
    pipe = done.get("pipeline")
    is_pipeline = pipe is not None and (pipe.schedule is not None or not pipe.chunks.empty)
    model, why = pipeline_model(traces, pipe) if is_pipeline else (None, "no pipeline")
    step = None
    if model is not None:
        samples = _without_outliers(list(model.periods_us)) or [model.period_us]
        step = step_noise(samples, f"{len(samples)} periods (start to start) of the "
                                   f"{model.steps} {model.basis} step(s) of the pipeline")
        step = dataclasses.replace(step, median_us=model.period_us,
                                   outliers=_outliers(list(model.periods_us)))
    else:
        samples = _profiled_step_samples(bd)
        if samples:
            step = step_noise(samples, f"{len(samples)} profiled step(s), the slowest rank's "
                                       "span of each")
    periods, _ = clean_step_periods(traces)
    clean = None
    if periods:
        kept = _without_outliers(periods)
        clean = dataclasses.replace(
            step_noise(kept, f"{len(kept)} unprofiled step period(s), start to start (per step "
                             "the median over the ranks)"), outliers=_outliers(periods))
    return RuleContext(
        traces=traces, breakdown=bd, sync=done.get("sync"), pipeline=pipe,
        balance=done.get("balance"), memory=done.get("memory"), layout=done.get("layout"),
        dim_overlap=done.get("dim_overlap"), routing=done.get("routing"),
        causes=done.get("causes"), critical_path=done.get("critical_path"),
        efficiency=done.get("efficiency"), settings=recorded_settings(traces), model=model,
        model_why=why, step=step, clean=clean, peak=measured_peak(done.get("memory")),
        capacity=capacity_bytes(traces), on_gpu=any(t.has_gpu for t in traces.ranks.values()),
        contention=contention_note(traces.rank_meta.values()))
