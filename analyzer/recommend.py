"""Recommendations: what to change, and how much it will help (issue #5).

Interface used by the renderers (HTML, terminal) and the JSON summary:

``report.results.get("recommendations")`` is a :class:`RecommendationResult` (or absent).
Each :class:`Recommendation` is ranked by predicted gain, best first — memory-saving changes
first on a memory-bound run, changes of the parallel degrees (:data:`DEGREE_KINDS`) after the
changes that keep them.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np
import pandas as pd

from pardiag.analyzer import intervals as iv
from pardiag.analyzer import whatif
from pardiag.analyzer.breakdown import OUTLIER_STEP_FACTOR, rank_parts
from pardiag.analyzer.classify import cached
from pardiag.analyzer.traceset import TraceSet


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recommendation:
    """One proposed change and its predicted effect.

    Attributes:
        kind: short machine name (``"microbatches"``, ``"rebalance_stages"``, ``"straggler"``…).
        title: one-line human summary.
        change: the concrete change (e.g. ``"microbatches 16"``, ``"stages [0–5 | 6–11]"``).
        evidence: measured numbers behind it, one sentence each.
        caveats: what the model does not know, one sentence each.
        measured_step_us: measured step time (µs), median over steps and ranks' max.
        predicted_step_us: predicted step time after the change (µs).
        gain_pct: ``100 * (measured - predicted) / measured`` (derived when not given).
        measured_peak_bytes: measured peak memory of the worst rank (bytes), None if unknown.
        predicted_peak_bytes: predicted peak memory of the worst rank (bytes), None if unknown.
        fits_memory: False when the prediction exceeds the device capacity (then not recommended).
        params: the change in machine-readable form, e.g. ``{"microbatches": 16}``,
            ``{"layers_per_stage": [5, 5]}``, ``{"without_rank": 1}``,
            ``{"ddp_bucket_cap_bytes": 4194304}``, ``{"reshard_after_forward": False}``.
    """

    kind: str
    title: str
    change: str
    evidence: tuple[str, ...] = ()
    caveats: tuple[str, ...] = ()
    measured_step_us: float
    predicted_step_us: float
    gain_pct: float | None = None
    measured_peak_bytes: float | None = None
    predicted_peak_bytes: float | None = None
    fits_memory: bool = True
    params: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.gain_pct is None:   # derived from the two step times unless given
            m = self.measured_step_us
            object.__setattr__(self, "gain_pct", 100.0 * (m - self.predicted_step_us) / m
                               if m > 0 else 0.0)

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"evidence": list(self.evidence),
                                           "caveats": list(self.caveats)}


#: What a :class:`StepTime` is measured on, in words (its ``basis``).
STEP_BASES = {
    "pipeline": "unprofiled pipeline steps (start to start, from pardiag's chunk records)",
    "unprofiled": "unprofiled steps (optimizer-step periods after the profiler's window)",
    "profiled": "profiled steps (per step the slowest rank's span)",
}


@dataclasses.dataclass(frozen=True)
class StepTime:
    """The step time a run's recommendations are measured against (their
    ``measured_step_us``; the verdict's step), with the per-step values it is the median of.

    Attributes:
        basis: a key of :data:`STEP_BASES`: ``"pipeline"`` (start-to-start time of consecutive
            unprofiled pipeline steps), ``"unprofiled"`` (periods of consecutive optimizer steps
            after the profiler's window, every rank's), ``"profiled"`` (per profiled step the
            slowest rank's span, steps over :data:`OUTLIER_STEP_FACTOR` × the median left out,
            as :func:`pardiag.analyzer.breakdown.step_time_spread`).
        samples_us: the per-step values (µs), in step order.
    """

    basis: str
    samples_us: tuple[float, ...]

    def _q(self, q: float) -> float:
        return float(np.quantile(self.samples_us, q)) if self.samples_us else float("nan")

    @property
    def median_us(self) -> float:
        """Median of the samples (µs)."""
        return float(np.median(self.samples_us)) if self.samples_us else float("nan")

    def to_json(self) -> dict:
        """``{"basis", "basis_text", "steps", "median_us", "q1_us", "q3_us", "min_us", "max_us",
        "samples_us"}`` (µs; quartiles by linear interpolation, numpy's default)."""
        s = self.samples_us
        return {"basis": self.basis, "basis_text": STEP_BASES.get(self.basis, self.basis),
                "steps": len(s), "median_us": self.median_us, "q1_us": self._q(0.25),
                "q3_us": self._q(0.75), "min_us": min(s) if s else None,
                "max_us": max(s) if s else None, "samples_us": [float(x) for x in s]}


@dataclasses.dataclass(frozen=True)
class RecommendationResult:
    """Ranked recommendations plus a one-sentence verdict.

    Attributes:
        verdict: one sentence: the largest loss and what it costs (e.g. "exposed communication
            is 31% of the step").
        recommendations: ranked, best first; only those that fit in memory and gain > 0.
        rejected: evaluated changes not recommended (no gain, or do not fit), for the JSON.
        why_none: when ``recommendations`` is empty, why (e.g. "no traces with steps").
        step: the measured step time the recommendations compare with (:class:`StepTime`),
            None when the traces hold no step.
    """

    verdict: str
    recommendations: tuple[Recommendation, ...] = ()
    rejected: tuple[Recommendation, ...] = ()
    why_none: str = ""
    step: StepTime | None = None


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


#: A change must be predicted to save at least this share of the step to be recommended (%).
MIN_GAIN_PCT = 2.0
#: torch DDP's default bucket_cap_mb (bytes), and its first bucket's cap with that default.
DDP_DEFAULT_CAP = 25 * 2**20
DDP_FIRST_BUCKET = 2**20
#: What-ifs that read events of each rank (idle waiting, FSDP ranges) read at most this many.
SAMPLE_RANKS = 8
#: FSDP2 explicit prefetching evaluated: this many units ahead.
FSDP_PREFETCH = 2
#: Kinds of the changes that shrink memory (recommended first when they fit).
MEMORY_KINDS = ("zero1", "fsdp")
#: Kinds that change the parallel degrees: ranked after the changes that keep them (they
#: re-partition the model, its memory per rank and its checkpoints, which no step time shows).
DEGREE_KINDS = ("pp_to_dp", "degrees")
#: Stages whose summed layer times differ by at least this share of their mean let a chunk's
#: time be fitted as a line in its layers' time (PipelineModel.layer_costs).
FIT_SPREAD = 0.25
#: Interleaving must beat the best schedule-keeping change by this much (% of its step).
INTERLEAVE_MARGIN_PCT = 10.0
#: Stage splits replayed one by one up to this many (else the min-max partition is used).
MAX_SPLITS = 400
#: A straggler arrives last at this share of its collectives or more …
STRAGGLER_LAST_SHARE = 0.6
#: … and causes this many times the waiting it suffers.
STRAGGLER_RATIO = 4.0


def _ms(us: float) -> str:
    return f"{us / 1000.0:.1f} ms"


@dataclasses.dataclass(frozen=True)
class PipelineModel:
    """The measured pipeline, ready to be replayed by :mod:`pardiag.analyzer.whatif`.

    Attributes:
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``; p, m, v: ranks, microbatches,
            stages per rank.
        fwd_us, bwd_us: per stage, median forward/backward time of one microbatch on unprofiled
            steps (µs).
        fixed_share: ``{(stage, phase): share}`` of a chunk's time that does not scale with the
            microbatch size (:func:`whatif.chunk_cost_split`); missing → 0.
        samples: microbatch size (rows), or None when unknown.
        window_us: measured pipeline window (median over unprofiled steps, aligned clocks).
        period_us: measured step time (median start-to-start of consecutive unprofiled steps).
        hop_us: point-to-point latency: the median time from a chunk's end to the start of the
            chunk on another rank that waited for it (less the per-chunk gap); calibrated to
            the measured step when no chunk waited.
        residual_us: measured step minus the replayed one (added to every prediction).
        gap_us: a rank's median time between two chunks when it waits for nothing (added to
            each chunk's cost).
        size_scaling: per stage, ``[(samples, forward µs, backward µs)]`` of its module timed at
            other microbatch sizes after the run (sorted); empty when not measured.
        tail_us: per rank, time from its last chunk of a step to its first chunk of the next
            when it need not wait (optimizer step plus what rank 0 does besides it).
        opt_us: per rank, median optimizer-step time (µs); empty when not recorded.
        layers: per stage, ``[(name, fwd_us, params_bytes)]`` of its layers (children of the
            stage module), empty when not recorded.
        steps: how many steps the medians are over; basis: ``"unprofiled"`` or ``"profiled"``.
        periods_us: the start-to-start times whose median is ``period_us`` (empty when the
            period is the window: a single step).
    """

    schedule: str
    p: int
    m: int
    v: int
    fwd_us: tuple[float, ...]
    bwd_us: tuple[float, ...]
    fixed_share: dict
    samples: int | None
    window_us: float
    period_us: float
    hop_us: float
    tail_us: dict
    opt_us: dict
    layers: tuple[tuple[tuple[str, float, int], ...], ...]
    steps: int
    basis: str
    residual_us: float = 0.0
    gap_us: float = 0.0
    size_scaling: dict = dataclasses.field(default_factory=dict)
    periods_us: tuple[float, ...] = ()

    def tails_for(self, stage_params: list[float] | None, v: int) -> dict[int, float]:
        """Per-rank tails when stage ``s`` (on rank ``s mod p``) holds ``stage_params[s]``
        parameter bytes: the optimizer part scales with the rank's parameter bytes (rate
        measured over all ranks); without per-layer parameters, the measured tails."""
        now = self.stage_params()
        if stage_params is None or not self.opt_us or now is None or sum(now) <= 0:
            return dict(self.tail_us)
        rate = sum(self.opt_us.values()) / sum(now)
        per_rank_now = {r: sum(b for s, b in enumerate(now) if s % self.p == r) for r in range(self.p)}
        per_rank = {r: sum(b for s, b in enumerate(stage_params) if s % self.p == r)
                    for r in range(self.p)}
        return {r: self.tail_us.get(r, 0.0) - self.opt_us.get(r, rate * per_rank_now[r])
                + rate * per_rank[r] for r in range(self.p)}

    def stage_params(self) -> list[float] | None:
        """Parameter bytes per stage from the layer records, or None."""
        if not self.layers:
            return None
        return [float(sum(b for _, _, b in ls)) for ls in self.layers]

    def scaled(self, m_new: int) -> tuple[list[float], list[float]]:
        """Per-stage forward/backward times at ``m_new`` microbatches (same global batch):
        times the ratio of the stage module's times at the new and the current size, read off
        the least-squares line through its times measured at other microbatch sizes
        (``size_scaling``, :func:`whatif.affine`) when pardiag measured them, else scaled by
        the chunk's fixed share."""
        out = []
        for phase, times in (("F", self.fwd_us), ("B", self.bwd_us)):
            col = 1 if phase == "F" else 2
            row = []
            for s, t in enumerate(times):
                pts = self.size_scaling.get(s)
                if pts and self.samples:
                    n0 = float(self.samples)
                    n1 = n0 * self.m / m_new
                    xs = [p[0] for p in pts]
                    ys = [p[col] for p in pts]
                    # the chunk follows its module's size curve (the line through every
                    # timed size); what it takes beyond the module (sends, the loss, the
                    # schedule's own work) keeps its share: measured 13–15% at 8 and 32 rows
                    row.append(t * whatif.affine(xs, ys, n1) / whatif.affine(xs, ys, n0))
                else:
                    row.append(whatif.scaled_chunk_us(
                        t, self.fixed_share.get((s, phase), 0.0), 1.0, self.m / m_new))
            out.append(row)
        return out[0], out[1]

    def predict(self, schedule: str | None = None, m: int | None = None, v: int | None = None,
                fwd_us=None, bwd_us=None, stage_params=None) -> tuple[float, whatif.SimResult]:
        """Replay with a changed schedule, microbatch count, stages per rank or stage costs.

        Returns:
            (predicted step time µs, the replayed step)."""
        schedule, m, v = schedule or self.schedule, m or self.m, v or self.v
        if fwd_us is None:
            fwd_us, bwd_us = self.scaled(m)
        period, sim = whatif.simulate_period(whatif.schedule_order(schedule, self.p, m, v),
                                             fwd_us, bwd_us, self.hop_us,
                                             self.tails_for(stage_params, v))
        return period + self.residual_us, sim

    def layer_costs(self) -> tuple[list[str], list[float], list[float], list[float]] | None:
        """Per layer (all stages in order): names, forward µs, backward µs, and the per-chunk
        forward/backward overhead that no layer accounts for (µs, as a 2-list in the last
        slot). None without layer records.

        When the stages' summed layer times differ (by ≥ :data:`FIT_SPREAD`), a chunk is
        taken as ``a + b·Σ layer forward`` — forward and backward each a least-squares line
        over the stages (measured on 1F1B [1, 5] layers: forward 188 µs + 1.07·Σ, backward
        347 µs + 2.01·Σ; the backward's fixed part is not the forward's times the stage's
        ratio). Otherwise, or when a line comes out with a negative part, the overhead is the
        stages' mean chunk time beyond their layers and a layer's backward is its forward times
        its stage's backward/forward ratio."""
        if not self.layers or any(not ls for ls in self.layers):
            return None
        work = [sum(t for _, t, _ in ls) for ls in self.layers]
        if min(work) <= 0:
            return None
        names = [f"S{s}.{name}" for s, ls in enumerate(self.layers) for name, _, _ in ls]
        times = [t for ls in self.layers for _, t, _ in ls]
        if len(work) >= 2 and (max(work) - min(work)) >= FIT_SPREAD * statistics.fmean(work):
            bf, af = statistics.linear_regression(work, list(self.fwd_us))
            bb, ab = statistics.linear_regression(work, list(self.bwd_us))
            if min(af, ab) >= 0 and min(bf, bb) > 0:
                return names, [t * bf for t in times], [t * bb for t in times], [af, ab]
        fw, bw, ovh_f, ovh_b = [], [], [], []
        for s, ls in enumerate(self.layers):
            of = max(self.fwd_us[s] - work[s], 0.0)
            ratio = self.bwd_us[s] / max(self.fwd_us[s], 1e-9)
            ovh_f.append(of)
            ovh_b.append(of * ratio)
            for _, t, _ in ls:
                fw.append(t)
                bw.append(t * ratio)
        return names, fw, bw, [statistics.fmean(ovh_f), statistics.fmean(ovh_b)]

    def best_sizes(self, total_us: list[float], k: int, schedule: str, m: int, v: int
                   ) -> list[int]:
        """Layers per stage of the contiguous split with the shortest predicted step: every
        split is replayed when there are at most :data:`MAX_SPLITS` of them (the optimizer tail
        moves with the parameters), else the split minimizing the slowest stage's forward +
        backward (:func:`whatif.best_partition`)."""
        n = len(total_us)
        if math.comb(n - 1, k - 1) > MAX_SPLITS:
            return whatif.best_partition(total_us, k)
        import itertools
        best, best_t, best_worst = None, math.inf, math.inf
        for cuts in itertools.combinations(range(1, n), k - 1):
            edges = (0, *cuts, n)
            sizes = [edges[i + 1] - edges[i] for i in range(k)]
            f, b, pb = self.partition_costs(sizes)
            t = self.predict(schedule, m, v, f, b, pb)[0]
            worst = max(x + y for x, y in zip(f, b))   # ties: the most even split
            if t < best_t - 1e-6 or (abs(t - best_t) <= 1e-6 and worst < best_worst - 1e-9):
                best, best_t, best_worst = sizes, t, worst
        return best

    def partition_costs(self, sizes: list[int]) -> tuple[list[float], list[float], list[float]]:
        """Per-stage forward/backward time (µs) and parameter bytes if the layers were split
        into consecutive stages of ``sizes`` layers."""
        names, fw, bw, (of, ob) = self.layer_costs()
        params = [b for ls in self.layers for _, _, b in ls]
        f, b, pb, lo = [], [], [], 0
        for n in sizes:
            f.append(of + sum(fw[lo:lo + n]))
            b.append(ob + sum(bw[lo:lo + n]))
            pb.append(float(sum(params[lo:lo + n])))
            lo += n
        return f, b, pb


def pipeline_model(traces: TraceSet, pipe) -> tuple[PipelineModel | None, str]:
    """Build the :class:`PipelineModel` of a run from its pipeline result (aligned chunks) and
    pipeline sidecars. Returns ``(model, "")`` or ``(None, why)``."""
    chunks = pipe.chunks
    sched = pipe.schedule or {}
    if chunks is None or chunks.empty:
        return None, "no pipeline schedule records (run under `pardiag profile`)"
    if chunks["phase"].isin(["I", "W"]).any():
        return None, "zero-bubble schedules (split backward) are not modelled"
    try:
        kind = whatif.normalize_schedule(sched.get("schedule"))
    except ValueError as exc:
        return None, str(exc)
    p, m, v = int(sched.get("p") or 0), int(sched.get("m") or 0), int(sched.get("v") or 1)
    n_stages = int(chunks["stage"].max()) + 1
    if p < 2 or m < 1 or n_stages != p * v:
        return None, f"pipeline layout not understood (p={p}, m={m}, v={v}, {n_stages} stages)"
    steps = sorted(chunks["step"].unique())
    if len(steps) > 2:
        steps = steps[1:]  # the first step also builds the stages' buffers
    clean = set(pipe.bubbles.loc[pipe.bubbles["clean"], "step"]) if len(pipe.bubbles) else set()
    use = [s for s in steps if s in clean] or steps
    basis = "unprofiled" if use and use[0] in clean else "profiled"
    c = chunks[chunks["step"].isin(use)]
    med = c.assign(d=c["end_us"] - c["start_us"]).groupby(["stage", "phase"])["d"].median()
    try:
        fwd = tuple(float(med[(s, "F")]) for s in range(n_stages))
        bwd = tuple(float(med[(s, "B")]) for s in range(n_stages))
    except KeyError:
        return None, "a stage has no forward or backward records"
    per_step = c.groupby("step").agg(lo=("start_us", "min"), hi=("end_us", "max"))
    window = float((per_step["hi"] - per_step["lo"]).median())
    starts = chunks.groupby("step")["start_us"].min().sort_index()
    periods = [starts[s + 1] - starts[s] for s in use if s + 1 in starts.index]
    period = float(np.median(periods)) if periods else window
    fixed: dict = {}
    samples = None
    layers: dict[int, list[tuple[int, str, float]]] = {}
    use_keys = {str(s) for s in use}
    for doc in traces.sidecars.get("pipeline", {}).values():
        for row in doc.get("chunk_costs") or []:
            try:
                fixed[(int(row["stage"]), str(row["phase"]))] = float(row["fixed_share"])
            except (KeyError, TypeError, ValueError):
                continue
        for r in doc.get("records") or []:
            if isinstance(r, dict) and isinstance(r.get("samples"), int) and r["samples"] > 0:
                samples = samples or r["samples"]
        for row in doc.get("layers") or []:
            try:
                times = [float(t) for k, t in (row.get("fwd_us") or {}).items() if k in use_keys]
                if not times:
                    times = [float(t) for t in (row.get("fwd_us") or {}).values()]
                if times:
                    layers.setdefault(int(row["stage"]), []).append(
                        (int(row["index"]), str(row["name"]), float(np.median(times)),
                         int(row.get("params_bytes") or 0)))
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
    size_scaling: dict[int, list] = {}
    for doc in traces.sidecars.get("pipeline", {}).values():
        for row in doc.get("size_scaling") or []:
            try:
                size_scaling.setdefault(int(row["stage"]), []).append(
                    (float(row["samples"]), float(row["fwd_us"]), float(row["bwd_us"])))
            except (KeyError, TypeError, ValueError):
                continue
    size_scaling = {k: sorted(v) for k, v in size_scaling.items()
                    if len({x[0] for x in v}) >= 2 and all(x[1] > 0 and x[2] > 0 for x in v)}
    layer_list = tuple(tuple((n, t, b) for _, n, t, b in sorted(layers.get(s, [])))
                       for s in range(n_stages)) if layers else ()
    # per rank: optimizer time and the idle time between its last chunk and its next first one
    opt: dict[int, float] = {}
    for rank, doc in traces.sidecars.get("pipeline", {}).items():
        d = [float(o["end_us"]) - float(o["start_us"]) for o in doc.get("optimizer") or []
             if isinstance(o, dict) and o.get("optimizer_step") in set(use)]
        if d:
            opt[int(rank)] = float(np.median(d))
    gaps = []
    r0 = chunks[chunks["rank"] == chunks.loc[chunks["stage"] == 0, "rank"].iloc[0]]
    last0 = r0.groupby("step")["end_us"].max()
    first0 = r0.groupby("step")["start_us"].min()
    for st in use:
        if st + 1 in first0.index and st in last0.index:
            gaps.append(float(first0[st + 1] - last0[st]))
    gap0 = float(np.median(gaps)) if gaps else max(period - window, 0.0)
    rank0 = int(r0["rank"].iloc[0])
    ranks = sorted(chunks["rank"].unique())
    if len(opt) == len(ranks) and rank0 in opt:
        other = max(gap0 - opt[rank0], 0.0)
        tails = {i: opt[r] + other for i, r in enumerate(ranks)}
        opt = {i: opt[r] for i, r in enumerate(ranks)}
    else:
        tails, opt = {i: gap0 for i in range(len(ranks))}, {}
    orders = whatif.schedule_order(kind, p, m, v)
    gap, hop_obs = _observed_gaps(c, n_stages)
    fwd = tuple(t + gap for t in fwd)   # the rank's own time between chunks belongs to them
    bwd = tuple(t + gap for t in bwd)
    if hop_obs is not None:
        hop = hop_obs
        residual = period - whatif.simulate_period(orders, fwd, bwd, hop, tails)[0]
    else:
        hop = whatif.calibrate_hop(orders, fwd, bwd, period, tails)
        residual = period - whatif.simulate_period(orders, fwd, bwd, hop, tails)[0]
    return PipelineModel(kind, p, m, v, fwd, bwd, fixed, samples, window, period, hop, tails,
                         opt, layer_list, len(use), basis, residual, gap, size_scaling,
                         tuple(float(x) for x in periods)), ""


def _observed_gaps(chunks: pd.DataFrame, n_stages: int) -> tuple[float, float | None]:
    """From the aligned chunk records: the median gap between a rank's consecutive chunks when
    the second one had nothing to wait for (its own overhead per chunk, µs), and the median
    time from a chunk's end to the start of the chunk on another rank that waited for it (the
    hop latency, µs; None when no chunk waited)."""
    end = {(r.step, r.stage, r.phase, r.microbatch): r.end_us for r in chunks.itertuples()}
    rank_of = dict(zip(chunks["stage"], chunks["rank"]))
    local, hops = [], []
    for (_, rank), rc in chunks.groupby(["step", "rank"]):
        rc = rc.sort_values("start_us")
        prev_end = None
        for r in rc.itertuples():
            if r.phase == "F":
                dep = (r.step, r.stage - 1, "F", r.microbatch) if r.stage > 0 else None
            else:
                dep = ((r.step, r.stage + 1, "B", r.microbatch) if r.stage < n_stages - 1
                       else None)
            dep_end = end.get(dep) if dep else None
            cross = dep is not None and rank_of.get(dep[1]) != rank
            if prev_end is not None:
                if dep_end is None or dep_end <= prev_end or not cross:
                    local.append(r.start_us - max(prev_end, dep_end or prev_end))
                elif cross:
                    hops.append(r.start_us - dep_end)
            prev_end = r.end_us
    gap = max(float(np.median(local)), 0.0) if local else 0.0
    hop = max(float(np.median(hops)) - gap, 0.0) if hops else None
    return gap, hop


def _pp_to_dp_recs(traces: TraceSet, done: dict, model: PipelineModel,
                   cap: float | None) -> list[Recommendation]:
    """The same ranks as data parallel instead of a pipeline (pp = p → dp = p, DDP with its
    default buckets): every rank runs the whole model on 1/p of the global batch.

    Step = Σ over stages of the stage module's forward + backward at that size (its times at
    other microbatch sizes, measured after the run, the line through them) + the optimizer over all
    parameters (Σ of the ranks' optimizer steps) + what rank 0 does besides (its tail less its
    optimizer) + the gradient all-reduce: DDP's buckets of the stages' parameter bytes, each
    α + β·bytes from the all-reduce times ``pardiag profile`` measured on the group after the
    run. On CPU every bucket's time adds (gloo shares the cores) — or, when ``pardiag profile``
    timed DDP itself on a stand-in model after the run (``ddp_calibration``), what DDP added
    there, scaled by the gradient bytes; on a GPU only the last bucket's (the others run beside
    the backward). Peak memory: every stage's static bytes
    plus every stage's activations for one microbatch, scaled to the new batch (activations:
    the allocated peak less the static bytes — or all of it when the peak is below them, as
    in a CPU trace whose window sees only its own allocations; the measured peak is then
    static + window peak). Only for a
    pipeline with one stage per rank and no other parallel dimension."""
    lay = done.get("layout")
    dims = dict(lay.dims) if lay is not None else {}
    if model.v != 1 or any(int(dims.get(d) or 1) > 1 for d in ("dp", "tp", "ep", "cp")):
        return []
    n_stages = len(model.fwd_us)
    pb = model.stage_params()
    if (not model.samples or any(s not in model.size_scaling for s in range(n_stages))
            or pb is None or sum(pb) <= 0 or len(model.opt_us) != model.p):
        return []
    calib = [(float(r["bytes"]), float(r["us"]))
             for doc in traces.sidecars.get("pipeline", {}).values()
             for r in doc.get("allreduce_calibration") or []
             if isinstance(r, dict) and isinstance(r.get("bytes"), (int, float))
             and isinstance(r.get("us"), (int, float))]
    try:
        alpha, beta = whatif.fit_alpha_beta([b for b, _ in calib], [t for _, t in calib])
    except ValueError:
        return []
    if len({b for b, _ in calib}) < 2:
        return []
    n_new = model.samples * model.m / model.p
    compute = 0.0
    for s in range(n_stages):
        pts = model.size_scaling[s]
        xs = [q[0] for q in pts]
        compute += (whatif.affine(xs, [q[1] for q in pts], n_new)
                    + whatif.affine(xs, [q[2] for q in pts], n_new))
    opt = sum(model.opt_us.values())
    other = max(model.tail_us.get(0, 0.0) - model.opt_us.get(0, 0.0), 0.0)
    layer_bytes = [float(b) for ls in reversed(model.layers) for _, _, b in reversed(ls)]
    buckets = whatif.ddp_buckets(layer_bytes, DDP_DEFAULT_CAP, DDP_FIRST_BUCKET)
    on_gpu = any(t.has_gpu for t in traces.ranks.values())
    ar_all = sum(alpha + beta * b for b in buckets)
    ar = ar_all if not on_gpu else alpha + beta * buckets[-1]
    how_ar = ("; on a GPU only the last bucket's is added" if on_gpu else
              "; on CPU all of it adds to the step")
    cal = {}
    for doc in traces.sidecars.get("pipeline", {}).values():
        c = doc.get("ddp_calibration")
        if isinstance(c, dict) and all(isinstance(c.get(k), (int, float)) and c[k] > 0
                                       for k in ("grad_bytes", "overhead_us")):
            cal = c
    if cal and not on_gpu:   # DDP itself timed on a stand-in with these gradient bytes
        ar = cal["overhead_us"] * sum(pb) / cal["grad_bytes"]
        how_ar = (f"; DDP itself, timed after the run on a stand-in with "
                  f"{cal['grad_bytes'] / 2**20:.3g} MiB of gradients, adds "
                  f"{cal['overhead_us'] / 1000:.2f} ms"
                  + (f": {ar / 1000:.2f} ms at this size"
                     if abs(cal["grad_bytes"] - sum(pb)) > 0.01 * sum(pb) else ""))
    pred = compute + opt + other + ar
    measured = model.period_us
    pred_peak = meas_peak = None
    pr = done["memory"].per_rank if done.get("memory") is not None else pd.DataFrame()
    if len(pr) and pr["static_bytes"].notna().all() and pr["peak_allocated_bytes"].notna().all():
        infl = _inflight(model.schedule, model.p, model.m, model.v)
        static = pr["static_bytes"].astype(float)
        peak = pr["peak_allocated_bytes"].astype(float)
        # a device's allocated peak holds the static state; a CPU trace's window peak counts
        # only what was allocated inside the window (a rank's 20 MiB of parameters, gradients
        # and optimizer state under a 1.6 MiB peak): then the peak is all activations
        if (peak >= static).all():
            act, meas_peak = (peak - static).clip(lower=0), float(peak.max())
        else:
            act, meas_peak = peak, float((peak + static).max())
        pred_peak = float(static.sum()) + float(act.sum()) / infl * (n_new / model.samples)
    total_b = sum(pb)
    return [Recommendation(
        kind="pp_to_dp", title=f"Data parallel instead of a {model.p}-stage pipeline",
        change=f"dp={model.p}, pp=1: every rank runs the whole model on {n_new:g} samples "
               f"(DDP, default buckets) instead of pp={model.p}",
        evidence=(f"the stage modules take {compute / 1000:.2f} ms forward + backward at "
                  f"{n_new:g} samples (measured at other sizes after the run)",
                  f"optimizer over all parameters {opt / 1000:.2f} ms; other per-step work "
                  f"{other / 1000:.2f} ms",
                  f"{total_b / 2**20:.3g} MiB of gradients in {len(buckets)} bucket(s): "
                  f"all-reduce {ar_all / 1000:.2f} ms (α {alpha:.0f} µs, "
                  f"{1 / beta / 1e3:.2f} GB/s measured on the group after the run)"
                  + how_ar),
        caveats=("every rank then holds all parameters, gradients and optimizer state",
                 "the all-reduce was timed on an idle group, not beside a backward"),
        measured_step_us=measured, predicted_step_us=pred,
        measured_peak_bytes=meas_peak,
        predicted_peak_bytes=pred_peak,
        fits_memory=cap is None or pred_peak is None or pred_peak <= cap,
        params={"pp": 1, "dp": model.p})]


def _inflight(schedule: str, p: int, m: int, v: int) -> int:
    """Most microbatches whose activations a pipeline rank holds at once (stage 0's rank)."""
    if schedule == "gpipe":
        return m * v
    if schedule == "1f1b":
        return min(m, p)
    rounds = max(1, m // p)
    return min((v - 1) * (m // rounds) + 2 * (p - 1) + 1, m * v)


def _memory_of(done: dict) -> tuple[float | None, float | None]:
    """(worst rank's measured peak bytes, its static bytes) or Nones."""
    mem = done.get("memory")
    if mem is None or mem.per_rank.empty:
        return None, None
    pr = mem.per_rank
    peak = pr["peak_allocated_bytes"].where(pr["peak_allocated_bytes"].notna(),
                                            pr["peak_rss_bytes"])
    if peak.notna().sum() == 0:
        return None, None
    i = peak.idxmax()
    static = pr.loc[i, "static_bytes"]
    return float(peak[i]), (float(static) if pd.notna(static) else None)


def _capacity(traces: TraceSet) -> float | None:
    """Device memory per rank (bytes) from the traces' ``deviceProperties``; None on CPU."""
    caps = []
    for t in traces.ranks.values():
        for d in t.metadata.get("deviceProperties") or []:
            if isinstance(d, dict) and isinstance(d.get("totalGlobalMem"), (int, float)):
                caps.append(float(d["totalGlobalMem"]))
    return min(caps) if caps else None


def _pipeline_recs(traces: TraceSet, done: dict, model: PipelineModel,
                   mem: tuple[float | None, float | None], cap: float | None) -> list[Recommendation]:
    measured = model.period_us
    _, base = model.predict()
    out: list[Recommendation] = []
    peak, static = mem
    if peak is not None and (static is None or peak <= static):
        static = 0.0   # a CPU trace's allocator view starts at the profiler: activations only
    act = (peak - static) if (peak is not None and peak > static) else None
    infl0 = _inflight(model.schedule, model.p, model.m, model.v)
    bubble = statistics.fmean(base.bubble_pct.values())
    common_ev = (f"measured on {model.steps} {model.basis} step(s): step {_ms(measured)}, pipeline "
                 f"window {_ms(model.window_us)}, {model.p} ranks × {model.v} stage(s) per rank, "
                 f"{model.m} microbatches" + (f" of {model.samples} samples" if model.samples else ""),
                 "per stage forward / backward per microbatch: " + ", ".join(
                     f"S{s} {f / 1000:.2f}/{b / 1000:.2f} ms"
                     for s, (f, b) in enumerate(zip(model.fwd_us, model.bwd_us))),
                 f"replayed bubble {bubble:.1f}% of the window; point-to-point hop "
                 f"{model.hop_us:.0f} µs, {model.gap_us:.0f} µs between a rank's chunks, "
                 f"{model.residual_us / 1000:+.2f} ms of the step not replayed")
    caveats_mb = ("a chunk's time is split into a fixed part and a part proportional to the "
                  "microbatch size, measured from its operators; very small microbatches can "
                  "run below the hardware's efficient size",)

    def rec(kind, title, change, sched, m, v, f=None, b=None, pb=None, extra_ev=(), caveats=(),
            params=None):
        pred, sim = model.predict(sched, m, v, f, b, pb)
        pred_peak = None
        if peak is not None and act is not None:
            n_ratio = model.m / m
            pred_peak = static + act * (_inflight(sched, model.p, m, v) * n_ratio / infl0)
        fits = cap is None or pred_peak is None or pred_peak <= cap
        out.append(Recommendation(
            kind=kind, title=title, change=change,
            evidence=common_ev + tuple(extra_ev) + (
                f"predicted bubble {statistics.fmean(sim.bubble_pct.values()):.1f}%",),
            caveats=tuple(caveats), measured_step_us=measured, predicted_step_us=pred,
            measured_peak_bytes=peak, predicted_peak_bytes=pred_peak, fits_memory=fits,
            params=params or {}))

    # more (or fewer) microbatches, same global batch
    for m2 in sorted({model.m * 2, model.m * 4, model.m // 2}):
        if m2 < 1 or m2 == model.m:
            continue
        if model.samples and (model.samples * model.m) % m2:
            continue  # the global batch does not split evenly
        if model.schedule == "interleaved" and m2 % max(1, m2 // model.p):
            continue
        n2 = f" of {model.samples * model.m // m2} samples" if model.samples else ""
        rec("microbatches", f"{'More' if m2 > model.m else 'Fewer'} microbatches: {m2} instead "
            f"of {model.m}", f"microbatches {m2}{n2} (same global batch)", model.schedule, m2,
            model.v, caveats=caveats_mb, params={"microbatches": m2})
    # schedule: 1F1B holds fewer activations than GPipe at the same time
    if model.schedule == "gpipe":
        rec("schedule", "1F1B instead of GPipe", "schedule 1F1B", "1f1b", model.m, 1,
            caveats=("1F1B mostly saves activation memory; its bubble equals GPipe's",),
            params={"schedule": "1f1b"})
    lc = model.layer_costs()
    # stage boundaries: the optimal contiguous split of the measured per-layer times
    if lc is not None:
        names, fw, bw, _ = lc
        sizes_now = [len(ls) for ls in model.layers]
        total = [a + b for a, b in zip(fw, bw)]
        sizes = model.best_sizes(total, len(sizes_now), model.schedule, model.m, model.v)
        if sizes != sizes_now:
            f, b, pb = model.partition_costs(sizes)
            stage_ms = ", ".join(f"S{s} {(fv + bv) / 1000:.2f} ms" for s, (fv, bv) in
                                 enumerate(zip(model.fwd_us, model.bwd_us)))
            rec("rebalance_stages", "Move layers between pipeline stages",
                f"stage boundaries {whatif.boundaries_text(sizes)} (child modules per stage "
                f"{','.join(map(str, sizes))}; now {whatif.boundaries_text(sizes_now)})",
                model.schedule, model.m, model.v, f, b, pb,
                extra_ev=(f"forward+backward per microbatch by stage: {stage_ms}",
                          f"layers are the {len(names)} child modules of the stage modules, in "
                          f"order ({names[0]} … {names[-1]}): count embeddings, heads and "
                          "other non-block children too when you split your model",
                          "layers in order: " + ", ".join(
                              f"{n} {t / 1000:.2f} ms" for n, t in zip(names, total))),
                caveats=("a layer's backward time is taken proportional to its forward time",
                         "the first and last layers (embedding, head) "
                         "may not be movable in your model"),
                params={"layers_per_stage": sizes, "layer_names": names})
        # interleaving: v stages per rank, same layers split into p·v stages
        if model.schedule != "interleaved":
            for v2 in (2, 4):
                s2 = model.p * v2
                if len(total) < s2 or model.m % max(1, model.m // model.p):
                    continue
                sizes2 = model.best_sizes(total, s2, "interleaved", model.m, v2)
                f, b, pb = model.partition_costs(sizes2)
                rec("interleave", f"Interleaved 1F1B with {v2} stages per rank",
                    f"schedule Interleaved1F1B, {v2} stages per rank, stage boundaries "
                    f"{whatif.boundaries_text(sizes2)}", "interleaved", model.m, v2, f, b, pb,
                    caveats=("each extra stage adds a point-to-point hop per microbatch, "
                             "taken at the measured latency",),
                    params={"schedule": "interleaved", "stages_per_rank": v2,
                            "layers_per_stage": sizes2, "layer_names": names})
    return out


def _idle_waits(traces: TraceSet, sync, last: int, waiting: list[int]) -> dict[int, float]:
    """Per rank of ``waiting``: how long (µs, all steps) it sat idle waiting for rank ``last``
    to arrive — the union of its waiting intervals (arrival → last arrival) at the collectives
    ``last`` arrived at last, less the time it computed meanwhile (an asynchronous collective,
    such as a DDP bucket, is waited for while the backward goes on)."""
    inst = sync.instances[["instance", "last_rank"]]
    pr = sync.per_rank.merge(inst, on="instance")
    pr = pr.assign(until=pr.groupby("instance")["start_us"].transform("max"))
    pr = pr[(pr["last_rank"] == last) & pr["rank"].isin(waiting)]
    offsets = dict(zip(sync.offsets["rank"], sync.offsets["offset_us"]))
    out = {}
    for rank, rows in pr.groupby("rank"):
        waits = iv.union(rows["start_us"].to_numpy(), rows["until"].to_numpy())
        trace = traces.ranks.get(rank)
        if trace is not None and len(waits):
            k = rank_parts(trace, [], None).k
            if len(k):   # compute intervals on the rank's clock → the corrected clock
                waits = iv.subtract(waits, k - float(offsets.get(rank, 0.0)))
        out[int(rank)] = iv.total(waits)
    return out


def _excess_idle(steps: pd.DataFrame, r: int, others: list[int]) -> float | None:
    """How much longer rank ``r`` idles per step than the other ranks (µs): its median idle
    time over steps less the median of theirs, from the time breakdown's per-step rows
    (``idle_us``: neither computing nor communicating); None without rows for them."""
    if not len(steps):
        return None
    med = steps.groupby("rank")["idle_us"].median()
    theirs = [float(med[o]) for o in others if o in med.index]
    return None if r not in med.index or not theirs else float(med[r]) - float(np.median(theirs))


def _straggler_recs(traces: TraceSet, done: dict, measured: float) -> list[Recommendation]:
    """The step without a significant straggler *r*: the step less what its delay costs the
    others per step — the time they sat idle waiting for it (:func:`_idle_waits`, mean over
    them) less what *r* waited for them.

    On CPU traces at most *r*'s own extra idle time (no op, no collective: data loading, host
    load, a sleep) beyond the other ranks' median (:func:`_excess_idle`): a rank's op times
    follow the host's state, not its work — with the planted 20 ms sleep the straggler's ops ran
    3.9 ms slower than the other rank's (1.2 ms without the sleep), so the others' waiting
    (23.8 ms) overstated the 19.3 ms that removing the sleep saved. On GPU traces a rank's step
    window starts at its first kernel, so a late start is not in its own idle time: the others'
    waiting is used as it is.

    At most :data:`SAMPLE_RANKS` other ranks are read (their compute intervals)."""
    sync = done.get("sync")
    if sync is None or sync.straggler is None or len(traces.ranks) < 2:
        return []
    st = sync.stragglers.iloc[0]
    steps = done["time_breakdown"].steps
    n_steps = max(int(steps["step"].nunique()), 1) if len(steps) else 1
    # a straggler arrives last most of the time and makes others wait far more than it waits
    if (st["instances"] < 3 or st["last_arrivals"] < STRAGGLER_LAST_SHARE * st["instances"]
            or st["wait_caused_us"] < STRAGGLER_RATIO * st["wait_suffered_us"]):
        return []
    r = int(st["rank"])
    others = sorted(int(x) for x in traces.ranks if int(x) != r)[:SAMPLE_RANKS]
    idle = _idle_waits(traces, sync, r, others)
    own = sum(_idle_waits(traces, sync, o, [r]).get(r, 0.0) for o in others) / len(others)
    caused = (float(np.mean([idle.get(o, 0.0) for o in others])) - own) / n_steps
    if not (caused > 0) or not (measured > 0):
        return []
    on_gpu = any(t.has_gpu for t in traces.ranks.values())
    idle_x = None if on_gpu else _excess_idle(steps, r, others)
    saving = caused if idle_x is None else min(caused, max(idle_x, 0.0))
    if not (saving > 0):
        return []
    comp = done["balance"].per_rank if done.get("balance") is not None else pd.DataFrame()
    ev = [f"rank {r} arrives last at {int(st['last_arrivals'])} collective(s); the other ranks "
          f"sit idle {caused / 1000:.2f} ms per step waiting for it (median step "
          f"{_ms(measured)})"]
    if idle_x is not None:
        ev.append(f"rank {r} is idle (no op, no collective) {idle_x / 1000:.2f} ms per step "
                  f"more than the others (median)")
    if len(comp):
        c = comp.groupby("rank")["compute_us"].median()
        if r in c.index and len(c) > 1:
            ev.append(f"rank {r} computes {c[r] / 1000:.2f} ms per step, the others "
                      f"{c.drop(r).median() / 1000:.2f} ms (median)")
    how = ("the others' waiting for it" if idle_x is None else
           "its extra idle time, at most the others' waiting for it (on CPU its op times "
           "follow the host, not its work)")
    pred = max(measured - saving, 0.0)
    return [Recommendation(
        kind="straggler", title=f"Rank {r} is a straggler", change=f"if rank {r} were not slow "
        f"(find what delays it: host load, data loading, a slower device or link)",
        evidence=tuple(ev), caveats=(f"the prediction removes {how}; a second straggler "
                                     f"would then show",),
        measured_step_us=measured, predicted_step_us=pred,
        params={"without_rank": r})]


def _layout(traces: TraceSet) -> dict:
    """The run's layout (run.json, else rank 0's metadata), or {}."""
    lay = dict((traces.run_info.layout if traces.run_info else None) or {})
    for meta in traces.rank_meta.values():   # rank metadata has keys run.json may not carry
        if isinstance(meta.layout, dict):
            for k, v in meta.layout.items():
                lay.setdefault(k, v)
    return lay


def _allreduce_fit(done: dict) -> tuple[float, float] | None:
    """α (µs), β (µs/byte) of the run's all-reduces (transfer part: min over ranks), through
    the fastest of each size."""
    sync = done.get("sync")
    if sync is None or sync.instances.empty:
        return None
    ar = sync.instances[sync.instances["op"] == "all_reduce"]
    try:
        return whatif.fit_alpha_beta(pd.to_numeric(ar["bytes"], errors="coerce").tolist(),
                                     ar["transfer_us"].tolist())
    except ValueError:
        return None


def _ddp_ready_curves(traces: TraceSet, done: dict) -> list[list[tuple[float, float]]]:
    """Per rank and profiled step, the gradient-ready curve ``[(µs, cumulative bytes)]`` read
    from when DDP launched each bucket's all-reduce (the reducer launches a bucket as soon as
    its gradients are ready). The curve starts where the measured launch rate extrapolates to
    zero bytes."""
    steps = done["time_breakdown"].steps
    curves = []
    for rank, doc in traces.sidecars.get("comms", {}).items():
        recs = [r for r in doc.get("records") or [] if isinstance(r, dict)
                and r.get("op") == "all_reduce" and isinstance(r.get("issue_us"), (int, float))
                and isinstance(r.get("bytes"), (int, float))]
        for st in steps[steps["rank"] == rank].itertuples():
            rs = sorted((r for r in recs if st.start_us <= r["issue_us"] < st.end_us),
                        key=lambda r: r["issue_us"])
            if len(rs) < 2:
                continue
            t = [float(r["issue_us"]) for r in rs]
            b = np.cumsum([float(r["bytes"]) for r in rs]).tolist()
            rate = (b[-1] - b[0]) / (t[-1] - t[0]) if t[-1] > t[0] else 0.0
            if rate <= 0:
                continue
            curves.append([(t[0] - b[0] / rate, 0.0), *zip(t, b)])
    return curves


def _ddp_bucket_recs(traces: TraceSet, done: dict, measured: float) -> list[Recommendation]:
    """DDP bucket sizes around the current one, torch's default and splits of the step's
    gradients in 2, 4 and 8.

    Buckets are formed as DDP forms them (:func:`whatif.ddp_buckets`) from the gradient bytes
    of each parameter ``pardiag profile`` recorded, else as equal splits. Each all-reduce takes
    ``α + β·bytes`` (:func:`whatif.fit_alpha_beta` through the run's fastest all-reduce of each
    size; the median of each size was tried on CPU and scattered too much: a bucket that waits
    behind another reads as slow). On a GPU the
    all-reduces run beside the backward and only what ends after the last gradient shows
    (:func:`whatif.bucketed_allreduce_tail`); on CPU they run on the cores the backward uses
    (gloo), so all of their time adds to the step and only the count of buckets (α each)
    changes with the size."""
    lay = _layout(traces)
    if "ddp" not in (lay.get("strategies") or []) or not (measured > 0):
        return []
    on_gpu = any(t.has_gpu for t in traces.ranks.values())
    fit = _allreduce_fit(done)
    curves = _ddp_ready_curves(traces, done)
    if fit is None or not curves:
        return []
    alpha, beta = fit
    cap = lay.get("ddp_bucket_cap_bytes")
    caveats = [f"all-reduce time α + β·bytes fitted on the run's fastest all-reduce of each "
               f"size (α {alpha:.0f} µs, "
               f"{1 / beta / 1e3:.2f} GB/s algbw)" if beta > 0 else "no bandwidth measured"]
    if on_gpu:
        caveats.insert(0, "gradients are taken to become ready at the rate DDP launched its "
                          "buckets")
    else:
        caveats.insert(0, "on CPU the all-reduces share the cores with the backward (gloo): "
                          "their time adds to the step, only their number changes with the "
                          "bucket size")
    if not isinstance(cap, (int, float)) or cap <= 0:
        cap = DDP_DEFAULT_CAP
        caveats.append("the bucket size was not recorded; torch's default 25 MiB assumed")
    params = lay.get("ddp_param_bytes")
    params = ([float(b) for b in params] if isinstance(params, list) and params
              and all(isinstance(b, (int, float)) and b >= 0 for b in params) else None)
    total = float(np.median([c[-1][1] for c in curves]))   # gradient bytes per step
    if params is None:
        caveats.append("parameter sizes not recorded: buckets taken as equal splits (DDP never "
                       "splits a parameter, so real buckets differ)")

    def buckets(c: float, first: float | None) -> list[float]:
        if params is not None:
            return whatif.ddp_buckets(params, c, first)
        return whatif.equal_buckets(total, c)

    # torch's first bucket is 1 MiB only when bucket_cap_mb is left at its default
    now_b = buckets(cap, DDP_FIRST_BUCKET if abs(cap - DDP_DEFAULT_CAP) < 1 else None)
    now = [whatif.bucketed_allreduce_tail(c, now_b, alpha, beta) for c in curves]
    out = []
    seen = {tuple(now_b)}     # a size that forms the same buckets changes nothing
    for new in whatif.ddp_cap_candidates(cap, total, DDP_DEFAULT_CAP):
        new_b = buckets(new, None)     # an explicit bucket_cap_mb: every bucket takes it
        if tuple(new_b) in seen:
            continue
        seen.add(tuple(new_b))
        if on_gpu:
            tail = [whatif.bucketed_allreduce_tail(c, new_b, alpha, beta) for c in curves]
            delta = float(np.median([a - b for a, b in zip(tail, now)]))
            how = (f"the all-reduce of the last bucket ends {np.median(now) / 1000:.2f} ms "
                   f"after the last gradient is ready (median over {len(curves)} rank-steps)",
                   f"predicted: {np.median(tail) / 1000:.2f} ms")
        else:
            delta = alpha * (len(new_b) - len(now_b))
            how = (f"{len(now_b)} all-reduces per step now, {len(new_b)} with this size; each "
                   f"costs α = {alpha:.0f} µs beyond its bytes",)
        out.append(Recommendation(
            kind="ddp_bucket", title=f"DDP buckets of {new / 2**20:g} MiB",
            change=f"DDP bucket_cap_mb={new / 2**20:.4g} (now {cap / 2**20:.4g}; "
                   f"{total / 2**20:.3g} MiB of gradients per step)",
            evidence=how, caveats=tuple(caveats), measured_step_us=measured,
            predicted_step_us=measured + delta, params={"ddp_bucket_cap_bytes": int(new)}))
    return out


def _per_step(done: dict) -> float:
    """Median number of profiled steps per rank (≥ 1 when there are none)."""
    n = done["time_breakdown"].steps.groupby("rank")["step"].nunique()
    return float(n.median()) if len(n) else 1.0


def _fsdp_ranges(traces: TraceSet, steps: float) -> pd.DataFrame:
    """Per rank (at most :data:`SAMPLE_RANKS`), per step: ``pre_forward`` (units gathered in
    the forward: FSDP2's ``FSDP::pre_forward`` ranges, FSDP1's
    ``FullyShardedDataParallel._pre_forward``), ``pre_backward_us`` and
    ``backward_prefetch_us`` (time inside FSDP2's ``FSDP::pre_backward`` /
    ``FSDP::backward_prefetch``, FSDP1's ``FullyShardedDataParallel._pre_backward_hook`` /
    ``._pre_backward_prefetch`` ranges). One pass over each trace's events, kept on the
    trace."""
    def scan(trace) -> tuple[int, float, float]:
        ev = trace.events
        names = ev["name"]
        fwd = (names.str.startswith("FSDP::pre_forward")
               | (names == "FullyShardedDataParallel._pre_forward")).to_numpy()
        bwd = (names.str.startswith("FSDP::pre_backward")
               | (names == "FullyShardedDataParallel._pre_backward_hook")).to_numpy()
        pre = (names.str.startswith("FSDP::backward_prefetch")
               | (names == "FullyShardedDataParallel._pre_backward_prefetch")).to_numpy()
        dur = ev["dur"].to_numpy()
        return int(fwd.sum()), float(dur[bwd].sum()), float(dur[pre].sum())

    rows = []
    for rank in sorted(traces.ranks)[:SAMPLE_RANKS]:
        n, bwd, pre = cached(traces.ranks[rank], "fsdp_ranges", lambda t=traces.ranks[rank]:
                             scan(t))
        rows.append({"rank": rank, "pre_forward": n / steps, "pre_backward_us": bwd / steps,
                     "backward_prefetch_us": pre / steps})
    return pd.DataFrame(rows, columns=["rank", "pre_forward", "pre_backward_us",
                                       "backward_prefetch_us"])


def _all_gathers(done: dict) -> pd.DataFrame:
    """Per rank: ``count`` and ``exposed`` (µs) of its all-gathers over the profiled steps."""
    colls = done["time_breakdown"].collectives
    ag = colls[colls["collective"] == "all_gather"]
    return ag.groupby("rank").agg(count=("count", "sum"), exposed=("exposed_us", "sum"))


def _params_bytes(done: dict) -> float | None:
    """The largest rank's parameter bytes (memory analysis), or None."""
    pr = done["memory"].per_rank if done.get("memory") is not None else pd.DataFrame()
    return float(pr["params_bytes"].max()) if len(pr) and pr["params_bytes"].notna().any() else None


def _fsdp_recs(traces: TraceSet, done: dict, measured: float,
               mem: tuple[float | None, float | None], cap: float | None) -> list[Recommendation]:
    """Keeping the parameters unsharded between forward and backward (FSDP2
    ``reshard_after_forward=False``, FSDP1 ``ShardingStrategy.SHARD_GRAD_OP``) when the run
    reshards: the backward's unsharding — the time inside FSDP2's ``FSDP::pre_backward`` /
    FSDP1's ``_pre_backward_hook`` ranges, median over ranks per step — is saved; without those
    ranges the backward's share of the exposed all-gather time. Peak: + the parameters
    unsharded over the DP degree."""
    lay = _layout(traces)
    strategies = lay.get("strategies") or []
    fsdp1 = "fsdp1" in strategies and "fsdp2" not in strategies
    if not ({"fsdp1", "fsdp2"} & set(strategies)) or not lay.get("fsdp_reshard_after_forward"):
        return []
    per_rank = _all_gathers(done)
    if per_rank.empty or not (measured > 0):
        return []
    steps = _per_step(done)
    n = float(per_rank["count"].median()) / steps
    # the backward's unsharding (re-gather, wait, copy-out) runs inside FSDP2's
    # "FSDP::pre_backward" (FSDP1's "_pre_backward_hook") ranges: the time they take is what
    # keeping the parameters saves
    pre_bwd = _fsdp_ranges(traces, steps)["pre_backward_us"]
    pre_bwd = pre_bwd[pre_bwd > 0]
    if len(pre_bwd):
        saving = float(pre_bwd.median())
        rng = "FullyShardedDataParallel._pre_backward_hook" if fsdp1 else "FSDP::pre_backward"
        how = (f"the backward's unsharding ({rng}) takes {saving / 1000:.2f} ms per step")
    else:   # no FSDP2 annotations: the backward's share of the exposed all-gathers
        units = (n + 1) / 2
        saving = float(per_rank["exposed"].median()) / steps * ((units - 1) / n if n else 0.0)
        how = (f"all-gathers leave {per_rank['exposed'].median() / steps / 1000:.2f} ms per "
               "step exposed; the backward's share is saved")
    pred = measured - saving
    peak, _ = mem
    dp = int((lay.get("dims") or {}).get("dp") or 0)
    params = _params_bytes(done)
    pred_peak = (peak + params * (dp - 1)) if (peak is not None and params and dp > 1) else None
    change, params = (("FSDP sharding_strategy=ShardingStrategy.SHARD_GRAD_OP",
                       {"fsdp_sharding_strategy": "SHARD_GRAD_OP"}) if fsdp1 else
                      ("FSDP reshard_after_forward=False", {"reshard_after_forward": False}))
    return [Recommendation(
        kind="fsdp_reshard", title="Keep parameters unsharded between forward and backward",
        change=change,
        evidence=(f"{n:.0f} all-gathers per step, about half of them in the backward", how),
        caveats=("each rank then holds the unsharded parameters of every unit from its forward "
                 "to its backward",),
        measured_step_us=measured, predicted_step_us=pred,
        measured_peak_bytes=peak, predicted_peak_bytes=pred_peak,
        fits_memory=cap is None or pred_peak is None or pred_peak <= cap,
        params=params)]


def _fsdp_prefetch_recs(traces: TraceSet, done: dict, measured: float,
                        mem: tuple[float | None, float | None],
                        cap: float | None) -> list[Recommendation]:
    """FSDP2 explicit prefetching (``set_modules_to_forward_prefetch`` /
    ``set_modules_to_backward_prefetch``, :data:`FSDP_PREFETCH` units ahead), or FSDP1's
    ``forward_prefetch=True`` (the next unit; when the run did not set it).

    On a GPU the all-gathers run on their own stream: the forward's exposed all-gather time
    (its share of the all-gathers) is saved except the first unit's, which nothing precedes.
    On CPU FSDP waits for each all-gather in the thread that issues it — the backward's
    prefetch (the default of both) already shows this: its ranges last as long as the gathers — so
    issuing them earlier hides nothing: predicted unchanged. One more gathered unit is held at
    a time (the unsharded parameters over the units, added to the peak). Reads at most
    :data:`SAMPLE_RANKS` ranks' events."""
    lay = _layout(traces)
    strategies = lay.get("strategies") or []
    fsdp1 = "fsdp1" in strategies and "fsdp2" not in strategies
    if (not ({"fsdp1", "fsdp2"} & set(strategies)) or not (measured > 0)
            or (fsdp1 and lay.get("fsdp1_forward_prefetch"))):
        return []
    per_rank = _all_gathers(done)
    if per_rank.empty:
        return []
    steps = _per_step(done)
    ranges = _fsdp_ranges(traces, steps)
    units = float(ranges["pre_forward"].median()) if len(ranges) else 0.0
    if units < 2:
        return []
    n_ag = float(per_rank["count"].median()) / steps
    exposed = float(per_rank["exposed"].median()) / steps
    on_gpu = any(t.has_gpu for t in traces.ranks.values())
    if on_gpu:
        fwd_exposed = exposed * min(units / n_ag, 1.0) if n_ag else 0.0
        saving = fwd_exposed * (units - 1) / units
        how = (f"{units:.0f} FSDP units gather in the forward; the all-gathers leave "
               f"{exposed / 1000:.2f} ms per step exposed, {fwd_exposed / 1000:.2f} ms of it "
               "in the forward", "the first unit's gather has nothing before it to hide behind")
        caveats = ("assumes each gather fits behind the compute of the unit before it",)
    else:
        saving = 0.0
        in_prefetch = float(ranges["backward_prefetch_us"].median())
        how = (f"on CPU FSDP{1 if fsdp1 else 2} waits for each all-gather where it is "
               f"issued: its backward prefetch (on by default) spends "
               f"{in_prefetch / 1000:.2f} ms per step inside those ranges, so gathering "
               f"earlier hides nothing",)
        caveats = ("on CPU the gathers share the cores with the compute",)
    peak, _ = mem
    dp = int((lay.get("dims") or {}).get("dp") or 0)
    params = _params_bytes(done)
    unit_bytes = params * max(dp, 1) / units if params else None   # one unsharded unit
    pred_peak = peak + unit_bytes if (peak is not None and unit_bytes) else None
    if fsdp1:
        title, change = "Prefetch the next FSDP unit in the forward", "FSDP forward_prefetch=True"
        params = {"fsdp_forward_prefetch": True}
    else:
        title = f"Prefetch {FSDP_PREFETCH} FSDP units ahead"
        change = (f"FSDP2 explicit prefetching: set_modules_to_forward_prefetch / "
                  f"set_modules_to_backward_prefetch with the next {FSDP_PREFETCH} units")
        params = {"fsdp_prefetch": FSDP_PREFETCH}
    return [Recommendation(
        kind="fsdp_prefetch", title=title, change=change,
        evidence=how, caveats=caveats, measured_step_us=measured,
        predicted_step_us=measured - saving, measured_peak_bytes=peak,
        predicted_peak_bytes=pred_peak,
        fits_memory=cap is None or pred_peak is None or pred_peak <= cap,
        params=params)]


def _memory_recs(traces: TraceSet, done: dict, measured: float,
                 mem: tuple[float | None, float | None], cap: float | None) -> list[Recommendation]:
    """ZeRO-1 or FSDP instead of DDP when the worst rank's peak is ≥ 90% of device memory."""
    lay = _layout(traces)
    strategies = set(lay.get("strategies") or [])
    peak, _ = mem
    dp = int((lay.get("dims") or {}).get("dp") or 0)
    if ("ddp" not in strategies or strategies & {"zero1", "fsdp1", "fsdp2"} or cap is None
            or peak is None or dp < 2 or peak < 0.9 * cap or not (measured > 0)):
        return []
    pr = done["memory"].per_rank
    i = pr["static_bytes"].idxmax() if pr["static_bytes"].notna().any() else None
    if i is None:
        return []
    p_, g_, o_ = (float(pr.loc[i, c] or 0) for c in ("params_bytes", "grads_bytes",
                                                     "optimizer_state_bytes"))
    fit = _allreduce_fit(done)
    t_ar = (fit[0] + fit[1] * g_) if fit else float("nan")
    out = []
    for kind, title, saved, extra, what in (
            ("zero1", "Shard the optimizer state (ZeRO-1)", o_ * (dp - 1) / dp, 0.5,
             "ZeroRedundancyOptimizer (ZeRO-1)"),
            ("fsdp", "Shard parameters, gradients and optimizer state (FSDP / ZeRO-3)",
             (p_ + g_ + o_) * (dp - 1) / dp, 0.5, "FSDP fully_shard (ZeRO-3)")):
        pred_peak = peak - saved
        pred = measured + extra * t_ar if t_ar == t_ar else measured
        out.append(Recommendation(
            kind=kind, title=title, change=f"{what} instead of DDP over dp={dp}",
            evidence=(f"peak {peak / 2**30:.2f} GiB of {cap / 2**30:.2f} GiB device memory "
                      f"({100 * peak / cap:.0f}%)",
                      f"static per rank: parameters {p_ / 2**30:.2f}, gradients {g_ / 2**30:.2f}, "
                      f"optimizer state {o_ / 2**30:.2f} GiB"),
            caveats=("adds an all-gather of the parameters per step (about half an all-reduce of "
                     "the same bytes), taken as exposed",),
            measured_step_us=measured, predicted_step_us=pred,
            measured_peak_bytes=peak,
            predicted_peak_bytes=pred_peak, fits_memory=pred_peak <= cap,
            params={"strategy": kind}))
    return out


def _dim_comm_per_step(done: dict) -> dict[str, tuple[float, float]]:
    """``{dim: (communication µs, exposed µs)}`` per rank and step (means over ranks)."""
    dov = done.get("dim_overlap")
    if dov is None or dov.summary.empty:
        return {}
    steps = _per_step(done)
    return {str(r.dim): (float(r.comm_us) / steps, float(r.exposed_us) / steps)
            for r in dov.summary.itertuples()}


def _ring(n: int) -> float:
    """Bytes each rank moves per byte of buffer in a ring all-reduce, 2(n − 1)/n (the same for
    all-gather + reduce-scatter); 0 for one rank (nccl-tests PERFORMANCE.md)."""
    return 2.0 * (n - 1) / n if n > 1 else 0.0


def _degree_recs(traces: TraceSet, done: dict, measured: float) -> list[Recommendation]:
    """Other DP × TP splits of the same ranks (pipeline degree unchanged), TP inside a node.

    Per rank and step, with the global batch fixed: computation stays (the same work over the
    same ranks); TP traffic scales with the activations a rank holds, ∝ 1/dp, times the ring
    factor of tp; DP traffic scales with the gradient bytes, ∝ 1/tp, times the ring factor of dp;
    each dimension keeps its measured time per byte and its exposed share."""
    lay = done.get("layout")
    dims = dict(lay.dims) if lay is not None else {}
    dp, tp = int(dims.get("dp") or 1), int(dims.get("tp") or 1)
    if tp < 2 or not (measured > 0):
        return []   # without TP traffic measured there is nothing to scale from
    comm = _dim_comm_per_step(done)
    if "tp" not in comm:
        return []
    per_node = (min(len(r) for r in lay.nodes.values()) if lay.nodes
                else len(traces.ranks))
    t_tp, e_tp = comm["tp"]
    t_dp, e_dp = comm.get("dp", (0.0, 0.0))
    x_tp = e_tp / t_tp if t_tp > 0 else 1.0
    x_dp = e_dp / t_dp if t_dp > 0 else 1.0
    n = dp * tp
    out = []
    for tp2 in range(1, n + 1):
        if n % tp2 or tp2 == tp or tp2 > per_node:
            continue
        dp2 = n // tp2
        t_tp2 = t_tp * (dp / dp2) * (_ring(tp2) / _ring(tp)) if tp2 > 1 else 0.0
        t_dp2 = (t_dp * (tp / tp2) * (_ring(dp2) / _ring(dp)) if dp > 1 and dp2 > 1 else
                 (float("nan") if dp2 > 1 else 0.0))
        if t_dp2 != t_dp2:
            continue   # no DP traffic measured to scale from
        pred = measured - (e_tp + e_dp) + x_tp * t_tp2 + x_dp * t_dp2
        out.append(Recommendation(
            kind="degrees", title=f"dp={dp2} × tp={tp2} instead of dp={dp} × tp={tp}",
            change=f"dp={dp2}, tp={tp2} (TP inside each node; same global batch)",
            evidence=(f"per rank and step: TP communication {t_tp / 1000:.2f} ms "
                      f"({e_tp / 1000:.2f} exposed), DP {t_dp / 1000:.2f} ms "
                      f"({e_dp / 1000:.2f} exposed)",
                      f"predicted: TP {t_tp2 / 1000:.2f} ms, DP {t_dp2 / 1000:.2f} ms, each with "
                      "its measured exposed share"),
            caveats=("computation per rank is taken to stay the same (ideal scaling); TP's "
                     "smaller matmuls can run less efficiently",
                     "each dimension keeps the bandwidth measured on its current groups",
                     "memory changes (parameters shard by tp, activations by dp) are not "
                     "predicted"),
            measured_step_us=measured, predicted_step_us=pred,
            params={"dp": dp2, "tp": tp2}))
    return out


def _tp_node_recs(traces: TraceSet, done: dict, measured: float) -> list[Recommendation]:
    """TP (or EP/CP) groups that span nodes while another dimension's stay inside one: swap
    them in the device mesh. Predicted with the busbw measured on each side."""
    lay = done.get("layout")
    sync = done.get("sync")
    if lay is None or lay.groups.empty or sync is None or sync.bandwidth.empty or not (
            measured > 0):
        return []
    g = lay.groups
    comm = _dim_comm_per_step(done)
    bw = sync.bandwidth.dropna(subset=["busbw_gbps"])
    out = []
    for dim in ("tp", "ep", "cp"):
        mine = g[g["dim"] == dim]
        if mine.empty or not mine["spans_nodes"].any() or dim not in comm:
            continue
        intra = g[(g["dim"] != dim) & ~g["spans_nodes"].astype(bool)]
        if intra.empty:
            continue
        other = str(intra["dim"].iloc[0])
        pgs_mine = set(mine["pg"].astype(str))
        pgs_other = set(intra["pg"].astype(str))
        b_inter = bw[bw["pg"].astype(str).isin(pgs_mine)]["busbw_gbps"].median()
        b_intra = bw[bw["pg"].astype(str).isin(pgs_other)]["busbw_gbps"].median()
        if not (b_inter > 0 and b_intra > 0) or b_inter >= b_intra:
            continue
        r = b_inter / b_intra
        _, e_mine = comm[dim]
        _, e_other = comm.get(other, (0.0, 0.0))
        pred = measured - e_mine * (1 - r) + e_other * (1 / r - 1)
        out.append(Recommendation(
            kind="placement", title=f"Keep {dim.upper()} inside a node",
            change=f"{dim}={int(mine['size'].max())} inside each node: order the device mesh "
                   f"so {dim} is the innermost dimension ({other} across nodes)",
            evidence=(f"{dim} groups span nodes: busbw {b_inter:.2f} GB/s vs {b_intra:.2f} GB/s "
                      f"on the {other} groups inside a node",
                      f"exposed per step: {dim} {e_mine / 1000:.2f} ms, {other} "
                      f"{e_other / 1000:.2f} ms"),
            caveats=(f"{other} traffic then crosses nodes at {dim}'s measured bandwidth",),
            measured_step_us=measured, predicted_step_us=pred,
            params={"innermost": dim}))
    return out


def clean_step_us(traces: TraceSet) -> tuple[float, int]:
    """Median step time (µs) over the optimizer steps after the profiler's window, when the
    ranks' metadata recorded every optimizer step (``pardiag profile``): the start-to-start time
    of consecutive optimizer-step ends, taken only where both steps ran without the profiler.
    Returns ``(nan, 0)`` when there is none."""
    periods, n = clean_step_periods(traces)
    return (float(np.median(periods)), n) if periods else (float("nan"), 0)


def clean_step_periods(traces: TraceSet) -> tuple[list[float], int]:
    """The periods (µs) :func:`clean_step_us` is the median of, every rank's in rank and step
    order, and the number of distinct steps they cover; ``([], 0)`` when there is none."""
    sch = traces.run_info.schedule if traces.run_info else None
    if sch is None:
        return [], 0
    first_clean = sch.wait + sch.warmup + sch.active
    periods = []
    steps_used: set[int] = set()
    for meta in traces.rank_meta.values():
        rows = meta.optimizer_step_times_us
        ends = {}
        for row in rows:
            if isinstance(row, list) and len(row) == 3 and all(
                    isinstance(x, (int, float)) for x in row):
                ends[int(row[0])] = float(row[2])
        ok = [k for k in sorted(ends)
              if k - 1 >= first_clean and k - 1 in ends and ends[k] > ends[k - 1]]
        periods += [ends[k] - ends[k - 1] for k in ok]
        steps_used.update(ok)
    return periods, len(steps_used)


def profiled_step_samples(done: dict) -> list[float]:
    """Per profiled step, the slowest rank's span (µs), in step order, steps over
    :data:`OUTLIER_STEP_FACTOR` × the median left out (the values whose median is the run row
    of :func:`pardiag.analyzer.breakdown.step_time_spread`)."""
    steps = done["time_breakdown"].steps
    if steps.empty:
        return []
    spans = steps.groupby("step", sort=True)["span_us"].max()
    med = float(spans.median())
    if len(spans) > 2:
        spans = spans[spans <= OUTLIER_STEP_FACTOR * med]
    return [float(x) for x in spans]


def _steps_unrecorded(traces: TraceSet) -> str:
    """A sentence when ``pardiag profile``'s metadata shows that no rank recorded a training
    step (the script made no more optimizer steps than ``--wait + --warmup``), else ""."""
    sch = traces.run_info.schedule if traces.run_info else None
    if sch is None:
        return ""
    skip = sch.wait + sch.warmup
    steps = [m.optimizer_steps for m in traces.rank_meta.values()]
    if not steps or not all(isinstance(n, int) and n <= skip for n in steps):
        return ""
    return (f"The profiler recorded no training step: the script made {max(steps)} optimizer "
            f"step(s) and recording starts after --wait + --warmup = {skip}; the traces show "
            "only the script's end, so nothing is measured or recommended (profile more steps).")


def _measured_step_us(done: dict) -> float:
    """Median over profiled steps of the slowest rank's step span (µs), outlier steps left out
    (:func:`pardiag.analyzer.breakdown.step_time_spread`)."""
    run = _run_step(done)
    return float(run["median_us"]) if run is not None else float("nan")


def _run_step(done: dict) -> dict | None:
    """The run's row of the step-time spread, or None without steps."""
    st = done["time_breakdown"].step_time
    run = st[st["rank"].isna()]
    return None if run.empty else run.iloc[0].to_dict()


def _spread_text(done: dict) -> str:
    """``" (IQR a–b, range c–d ms over n steps)"``, a one-step caveat, and outlier steps."""
    run = _run_step(done)
    if run is None or not run["steps"]:
        return ""
    n = int(run["steps"])
    if n == 1:
        text = " (1 step recorded: a one-off cannot be told from a persistent cause)"
    else:
        text = (f" (IQR {run['q1_us'] / 1e3:.1f}–{run['q3_us'] / 1e3:.1f}, range "
                f"{run['min_us'] / 1e3:.1f}–{run['max_us'] / 1e3:.1f} ms over {n} steps)")
    if run["outlier_steps"]:
        text += (f"; step(s) {run['outlier_steps']} over {OUTLIER_STEP_FACTOR:g}× the median "
                 f"left out")
    return text


def _verdict(done: dict, model: PipelineModel | None, measured: float,
             profiled: bool = False) -> str:
    tot = done["time_breakdown"].totals
    parts = []
    if len(tot) and tot["span_us"].sum() > 0:
        exp = 100.0 * tot["exposed_comm_us"].sum() / tot["span_us"].sum()
        idle = 100.0 * tot["idle_us"].sum() / tot["span_us"].sum()
        parts.append(f"exposed communication {exp:.1f}% and idle {idle:.1f}% of the ranks' time")
    if model is not None:
        b = model.predict()[1].bubble_pct
        parts.append(f"pipeline bubble {statistics.fmean(b.values()):.1f}% of the window")
    sync = done.get("sync")
    if sync is not None and sync.straggler is not None:
        parts.append(f"rank {sync.straggler} causes the most waiting")
    spread = ""
    if profiled:  # measured on the profiled steps: their spread, " (while profiled; IQR ...)"
        spread = _spread_text(done)
        spread = (" (while profiled; " + spread[2:] if spread.startswith(" (")
                  else " (while profiled)" + spread)
    head = f"Step {_ms(measured)}{spread}" if measured == measured else "No complete step"
    return head + (": " + "; ".join(parts) if parts else "") + "."


def compute_recommendations(traces: TraceSet, done: dict) -> RecommendationResult:
    """Evaluate the changes pardiag models and rank those predicted to help.

    Changes: pipeline microbatch count, schedule (1F1B for GPipe), interleaving, stage
    boundaries (optimal contiguous partition of measured per-layer times), and the step without
    the worst straggler. Each carries evidence, predicted vs measured step time and peak
    memory. Recommended: predicted gain ≥ :data:`MIN_GAIN_PCT` and fits in device memory
    (capacity from ``deviceProperties``; unknown on CPU, where everything fits).

    Args:
        traces: the run. done: earlier analyses by name (``time_breakdown``, ``sync``,
            ``pipeline``, ``balance``, ``memory``).
    """
    unrecorded = _steps_unrecorded(traces)
    if unrecorded:
        return RecommendationResult(unrecorded, (), (), "the traces hold no training step")
    measured = _measured_step_us(done)
    pipe = done.get("pipeline")
    is_pipeline = pipe is not None and (pipe.schedule is not None or not pipe.chunks.empty)
    model, why = pipeline_model(traces, pipe) if is_pipeline else (None, "no pipeline")
    mem = _memory_of(done)
    cap = _capacity(traces)
    cands: list[Recommendation] = []
    if model is not None:
        measured = model.period_us  # unprofiled steps: the profiler slows pipelines down
        cands += _pipeline_recs(traces, done, model, mem, cap)
        cands += _pp_to_dp_recs(traces, done, model, cap)
    elif measured == measured:  # in a pipeline, waiting for the neighbour stage is the bubble
        cands += _straggler_recs(traces, done, measured)
    if measured == measured:
        cands += _ddp_bucket_recs(traces, done, measured)
        cands += _fsdp_recs(traces, done, measured, mem, cap)
        cands += _fsdp_prefetch_recs(traces, done, measured, mem, cap)
        cands += _degree_recs(traces, done, measured)
        cands += _tp_node_recs(traces, done, measured)
        cands += _memory_recs(traces, done, measured, mem, cap)
    clean, n_clean = clean_step_us(traces)
    if model is None and clean == clean and measured == measured and measured > 0:
        # the profiler slows steps down (on CPU by 2–4×): predictions made on the profiled
        # steps are applied as ratios to the step time measured without it
        note = (f"step time {_ms(clean)} measured on {n_clean} unprofiled step(s) "
                f"({_ms(measured)} while profiled); the predicted change is applied as a ratio")
        cands = [dataclasses.replace(
            c, measured_step_us=clean,
            predicted_step_us=clean * c.predicted_step_us / c.measured_step_us,
            evidence=(*c.evidence, note)) for c in cands]
    # interleaving changes the schedule, adds point-to-point hops and needs the model cut into
    # more stages: it must beat the best change that keeps the schedule (moving layers, the
    # microbatch count) by a margin
    limit = math.inf
    if model is not None:
        best = min([model.period_us, *(c.predicted_step_us for c in cands
                                       if c.kind in ("rebalance_stages", "microbatches"))])
        limit = best * (1 - INTERLEAVE_MARGIN_PCT / 100)

    def not_worth(c: Recommendation) -> bool:
        return c.kind == "interleave" and c.predicted_step_us > limit

    cands = [dataclasses.replace(c, caveats=(
        *c.caveats, f"predicted less than {INTERLEAVE_MARGIN_PCT:g}% faster than the best "
        "change that keeps the schedule, so not recommended")) if not_worth(c) else c
        for c in cands]
    # a run that does not fit must shrink first: memory changes rank ahead of speed; changes
    # of the parallel degrees rank after the changes that keep them
    good = sorted((c for c in cands if c.fits_memory and not not_worth(c)
                   and (c.gain_pct >= MIN_GAIN_PCT or c.kind in MEMORY_KINDS)),
                  key=lambda c: (c.kind not in MEMORY_KINDS, c.kind in DEGREE_KINDS,
                                 -c.gain_pct))
    rejected = tuple(c for c in cands if c not in good)
    why_none = ""
    if not good:
        why_none = ("no modelled change is predicted to save ≥ "
                    f"{MIN_GAIN_PCT:g}% of the step" if cands else
                    "nothing to evaluate: " + (why if why != "no pipeline" else
                                               "no pipeline, no significant straggler, and no "
                                               "DDP, FSDP or tensor-parallel setting to change"))
    # the verdict's step time is the one the recommendations compare with: unprofiled when known
    step = clean if (model is None and clean == clean) else measured
    if model is not None:
        step_time = StepTime("pipeline", model.periods_us or (model.period_us,))
    elif clean == clean:
        step_time = StepTime("unprofiled", tuple(clean_step_periods(traces)[0]))
    else:
        samples = profiled_step_samples(done)
        step_time = StepTime("profiled", tuple(samples)) if samples else None
    return RecommendationResult(_verdict(done, model, step, profiled=model is None
                                         and clean != clean), tuple(good), rejected, why_none,
                                step_time)
