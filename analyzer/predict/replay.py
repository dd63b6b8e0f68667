"""The pipeline replay: a run's measured pipeline (per-stage chunk times, hop latency, the ranks'
tails) as a :class:`PipelineModel` that :mod:`pardiag.analyzer.predict.whatif` replays under a
changed schedule, microbatch count, interleaving or stage split. Built once per report by
:func:`pipeline_model`; the recommendation rules (:mod:`pardiag.analyzer.predict.recommend`) ask it
for predictions."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics

import numpy as np
import pandas as pd

from ..analyses.breakdown import OUTLIER_STEP_FACTOR
from ..trace.classify import normalize_schedule
from ..trace.traceset import TraceSet
from . import whatif

#: Stages whose summed layer times differ by at least this share of their mean let a chunk's
#: time be fitted as a line in its layers' time (PipelineModel.layer_costs).
FIT_SPREAD = 0.25
#: Stage splits replayed one by one up to this many (else the min-max partition is used).
MAX_SPLITS = 400


@dataclasses.dataclass(frozen=True)
class PipelineModel:
    """The measured pipeline, ready to be replayed by :mod:`pardiag.analyzer.predict.whatif`.

    Attributes:
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``; p, m, v: ranks, microbatches,
            stages per rank.
        fwd_us, bwd_us: per stage, median forward/backward time of one microbatch on unprofiled
            steps (µs).
        fixed_share: ``{(stage, phase): share}`` of a chunk's time that does not scale with the
            microbatch size (:func:`whatif.chunk_cost_split`); missing → 0.
        samples: microbatch size (rows), or None when unknown.
        samples_from: where ``samples`` comes from: ``"recorded"`` (dim 0 of each chunk's
            output, recorded by ``pardiag profile``), ``"sends"`` (dim 0 of the activations
            stage 0's rank sends, :func:`sent_microbatch`), or ``""`` when unknown.
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
        periods_us: the start-to-start times of the steps ``period_us`` is the median of (µs).
        orders: the run's own order per rank (index in rank order: ``[(stage, phase,
            microbatch)]``) where its schedule is not one pardiag generates; None otherwise.
        input_share: per stage, the share of its backward the input-gradient half (``I``)
            takes, for orders that split the backward; None otherwise.
        stage_rank: per stage, the rank (index) that runs it; empty: stage ``s`` on ``s mod
            p`` (the generated schedules' placement).
        recorded_orders: for the run's own order, the schedule's orders at other microbatch
            counts that ``pardiag profile`` recorded from torch's class (``{m: {rank index:
            [(stage, phase, microbatch)]}}``); empty otherwise.
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
    samples_from: str = ""
    orders: dict | None = None
    input_share: tuple[float, ...] | None = None
    stage_rank: dict = dataclasses.field(default_factory=dict)
    recorded_orders: dict = dataclasses.field(default_factory=dict)

    @property
    def observed(self) -> bool:
        """Whether the model replays the run's own order (a schedule pardiag does not
        generate: split backward, V placement, looped BFS, a described one), which it can
        replay only as it ran: the same schedule, microbatches and stages per rank."""
        return self.orders is not None

    def bubble_pct(self, sim: whatif.SimResult) -> float:
        """The replayed step's bubble as the pipeline analysis measures one (% of its window,
        mean over ranks): each rank's own time between chunks (:attr:`gap_us`, which the
        replay adds to every chunk's cost) counts as idle there, not as work."""
        n: dict[int, int] = {}
        for a in sim.actions:
            n[a[0]] = n.get(a[0], 0) + 1
        w = sim.window_us
        if not w > 0 or not sim.busy_us:
            return 0.0
        return statistics.fmean(100.0 * (w - max(b - n.get(r, 0) * self.gap_us, 0.0)) / w
                                for r, b in sim.busy_us.items())

    def fit_text(self) -> str:
        """How the unchanged replay compares with the measured step, in words:
        ``"accounts for 27.1 ms of the 55.0 ms step"`` when it is shorter (the residual is the
        part it does not explain), ``"takes 60.8 ms, 3.3 ms more than the 57.5 ms step"`` when
        it is longer."""
        replayed = self.period_us - self.residual_us
        if round(abs(self.residual_us) / 1e3, 1) == 0:
            return f"matches the {self.period_us / 1e3:.1f} ms step"
        if self.residual_us >= 0:
            return (f"accounts for {replayed / 1e3:.1f} ms of the {self.period_us / 1e3:.1f} ms "
                    f"step")
        return (f"takes {replayed / 1e3:.1f} ms, {-self.residual_us / 1e3:.1f} ms more than the "
                f"{self.period_us / 1e3:.1f} ms step")

    def orders_for(self, schedule: str, m: int, v: int) -> dict[int, list[whatif.Action]]:
        """The order each rank runs under ``schedule`` with ``m`` microbatches and ``v`` stages
        per rank: the run's own (:attr:`observed`), else generated
        (:func:`whatif.schedule_order`).

        Raises:
            ValueError: the run's own order asked for another schedule, m or v (not known)."""
        if self.orders is not None:
            if (schedule, v) == (self.schedule, self.v) and m == self.m:
                return self.orders
            if (schedule, v) == (self.schedule, self.v) and m in self.recorded_orders:
                return self.recorded_orders[m]
            raise ValueError(f"{self.schedule}: its order with {m} microbatches and {v} "
                             "stages per rank is not known (neither run nor recorded)")
        return whatif.schedule_order(schedule, self.p, m, v)

    def knows_order(self, m: int) -> bool:
        """Whether the schedule's order with ``m`` microbatches is known: always for one
        pardiag generates; for the run's own, ``m`` as it ran or recorded by ``pardiag
        profile`` from torch's class (:attr:`recorded_orders`)."""
        return self.orders is None or m == self.m or m in self.recorded_orders

    def inflight_of(self, schedule: str, m: int, v: int) -> int:
        """Most microbatches whose activations a rank holds at once under that schedule: from
        the run's own order where it is replayed (:attr:`observed`), else :func:`inflight`."""
        if self.orders is not None and (schedule, v) == (self.schedule, self.v):
            return observed_inflight(self.orders_for(schedule, m, v))
        return inflight(schedule, self.p, m, v)

    def tails_for(self, stage_params: list[float] | None, v: int) -> dict[int, float]:
        """Per-rank tails when stage ``s`` (on rank ``s mod p``) holds ``stage_params[s]``
        parameter bytes: the optimizer part scales with the rank's parameter bytes (rate
        measured over all ranks); without per-layer parameters, the measured tails."""
        now = self.stage_params()
        if stage_params is None or not self.opt_us or now is None or sum(now) <= 0:
            return dict(self.tail_us)
        rate = sum(self.opt_us.values()) / sum(now)
        def rank_of(s: int) -> int:
            return int(self.stage_rank.get(s, s % self.p))

        per_rank_now = {r: sum(b for s, b in enumerate(now) if rank_of(s) == r)
                        for r in range(self.p)}
        per_rank = {r: sum(b for s, b in enumerate(stage_params) if rank_of(s) == r)
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
            (predicted step time µs, the replayed step).

        Raises:
            ValueError: the run's own order asked for another schedule, m or v
                (:meth:`orders_for`)."""
        schedule, m, v = schedule or self.schedule, m or self.m, v or self.v
        if fwd_us is None:
            fwd_us, bwd_us = self.scaled(m)
        period, sim = whatif.simulate_period(self.orders_for(schedule, m, v),
                                             fwd_us, bwd_us, self.hop_us,
                                             self.tails_for(stage_params, v),
                                             input_share=self.input_share)
        return period + self.residual_us, sim

    def layer_costs(self) -> tuple[list[str], list[float], list[float], list[float]] | None:
        """Per layer (all stages in order): names, forward µs, backward µs, and the per-chunk
        forward/backward overhead that no layer accounts for (µs, as a 2-list in the last
        slot). None without layer records.

        When the stages' summed layer times differ (by ≥ :data:`FIT_SPREAD`), a chunk is
        taken as ``a + b·Σ layer forward`` — forward and backward each a least-squares line
        over the stages (measured on 1F1B [1, 5] layers: forward 188 µs + 1.07·Σ, backward
        347 µs + 2.01·Σ; the backward's fixed part is not the forward's times the stage's
        ratio). Otherwise, or when a line comes out with a negative part, each stage's chunk
        time is spread over its own layers in proportion to their forward times (no overhead
        apart), so the current split replays exactly the per-stage costs the chunks measure:
        a stage's unexplained time stays with the stage's layers and never evens the stages
        out."""
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
        fw, bw = [], []
        for s, ls in enumerate(self.layers):
            kf, kb = self.fwd_us[s] / work[s], self.bwd_us[s] / work[s]
            for _, t, _ in ls:
                fw.append(t * kf)
                bw.append(t * kb)
        return names, fw, bw, [0.0, 0.0]

    def best_sizes(self, total_us: list[float], k: int, schedule: str, m: int, v: int
                   ) -> list[int]:
        """Layers per stage of the contiguous split with the shortest predicted step: every
        split is replayed when there are at most :data:`MAX_SPLITS` of them (the optimizer tail
        moves with the parameters), else the split minimizing the slowest stage's forward +
        backward (:func:`whatif.best_partition`)."""
        n = len(total_us)
        if math.comb(n - 1, k - 1) > MAX_SPLITS:
            return whatif.best_partition(total_us, k)
        best, best_t, best_worst = None, math.inf, math.inf
        for cuts in itertools.combinations(range(1, n), k - 1):
            edges = (0, *cuts, n)
            sizes = [edges[i + 1] - edges[i] for i in range(k)]
            f, b, pb = self.partition_costs(sizes)
            t = self.predict(schedule, m, v, f, b, pb)[0]
            worst = max(x + y for x, y in zip(f, b))   # ties: the most even split
            if t < best_t - 1e-6 or (abs(t - best_t) <= 1e-6 and worst < best_worst - 1e-9):
                best, best_t, best_worst = sizes, t, worst
        assert best is not None  # k <= n: there is a split
        return best

    def partition_costs(self, sizes: list[int]) -> tuple[list[float], list[float], list[float]]:
        """Per-stage forward/backward time (µs) and parameter bytes if the layers were split
        into consecutive stages of ``sizes`` layers."""
        costs = self.layer_costs()
        assert costs is not None  # called where the layers were recorded
        names, fw, bw, (of, ob) = costs
        params = [b for ls in self.layers for _, _, b in ls]
        f, b, pb, lo = [], [], [], 0
        for n in sizes:
            f.append(of + sum(fw[lo:lo + n]))
            b.append(ob + sum(bw[lo:lo + n]))
            pb.append(float(sum(params[lo:lo + n])))
            lo += n
        return f, b, pb


#: PipelineModel.schedule of a run replayed in its own order (:attr:`PipelineModel.observed`)
#: is its schedule's name or description as the report gives it.


def _schedule_layout(chunks: pd.DataFrame, sched: dict
                     ) -> tuple[tuple[str, int, int, int, int, bool] | None, str]:
    """The pipeline's layout from its schedule record and chunks: ``((schedule, p, m, v,
    stages, observed), "")``, or ``(None, why)``. ``observed``: the schedule is not one
    :func:`whatif.schedule_order` generates (a split backward, a V placement, looped BFS, a
    described order), so the run's own order is replayed; ``schedule`` is then its name or
    description."""
    name = sched.get("schedule")
    observed = bool(chunks["phase"].isin(["I", "W"]).any())
    kind = str(name or "")
    if not observed:
        try:
            kind = normalize_schedule(name)
        except ValueError:
            observed = True
    p, m, v = int(sched.get("p") or 0), int(sched.get("m") or 0), int(sched.get("v") or 1)
    n_stages = int(chunks["stage"].max()) + 1
    if p < 2 or m < 1 or n_stages != p * v:
        return None, f"pipeline layout not understood (p={p}, m={m}, v={v}, {n_stages} stages)"
    return (kind or "the run's own order", p, m, v, n_stages, observed), ""


def _observed_orders(c: pd.DataFrame) -> tuple[dict[int, list[whatif.Action]] | None,
                                               dict[int, int]]:
    """The order each rank ran its actions in (rank index in rank order), the one most of the
    used steps ``c`` share, and the rank index of each stage; ``(None, {})`` when no order
    holds every stage's forward and backward of every microbatch (a step cut short)."""
    ranks = sorted(c["rank"].unique())
    if c.groupby("stage")["rank"].nunique().max() > 1:
        return None, {}   # several pipelines (a stage on several ranks): whose order is not one
    index = {r: i for i, r in enumerate(ranks)}
    seen: dict[tuple, int] = {}
    for _, g in c.groupby("step"):
        g = g.sort_values("start_us", kind="stable")
        key = tuple((index[int(r)], tuple((int(s), str(ph), int(mb)) for s, ph, mb in zip(
            rc["stage"], rc["phase"], rc["microbatch"]))) for r, rc in g.groupby("rank"))
        seen[key] = seen.get(key, 0) + 1
    if not seen:
        return None, {}
    best = max(seen, key=lambda k: seen[k])
    if len(best) != len(ranks):
        return None, {}
    orders = {r: list(seq) for r, seq in best}
    stage_rank = {s: r for r, seq in orders.items() for s, _, _ in seq}
    return orders, stage_rank


def observed_inflight(orders: dict[int, list[whatif.Action]]) -> int:
    """Most microbatches whose activations a rank holds at once in an order: forwards run less
    backwards (``B`` or ``I``) run, at its highest over every rank's order."""
    most = 0
    for seq in orders.values():
        held = 0
        for _, ph, _ in seq:
            held += 1 if ph == "F" else -1 if ph in ("B", "I") else 0
            most = max(most, held)
    return max(most, 1)


def _stage_costs(c: pd.DataFrame, n_stages: int, gap: float
                 ) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...] | None]:
    """Per stage: forward and whole-backward time of one microbatch (median over the used
    steps ``c``, plus the rank's own ``gap`` per action) and, where the backward was split,
    the share its ``I`` half takes (``B`` measured wins; else ``I + W``).

    Raises:
        KeyError: a stage has no forward, or no backward of either kind."""
    med = c.assign(d=c["end_us"] - c["start_us"]).groupby(["stage", "phase"])["d"].median()
    have = set(med.index)
    fwd, bwd, share = [], [], []
    split = any(ph in ("I", "W") for _, ph in have)
    for s in range(n_stages):
        fwd.append(float(med[(s, "F")]) + gap)
        i = float(med[(s, "I")]) + gap if (s, "I") in have else None
        w = float(med[(s, "W")]) + gap if (s, "W") in have else 0.0
        if (s, "B") in have:
            bwd.append(float(med[(s, "B")]) + gap)
        elif i is not None:
            bwd.append(i + w)
        else:
            raise KeyError((s, "B"))
        share.append(i / (i + w) if i is not None and i + w > 0 else 1.0)
    return tuple(fwd), tuple(bwd), (tuple(share) if split else None)


def _steps_used(chunks: pd.DataFrame, pipe) -> tuple[list, str]:
    """The steps the medians are over and their basis: the unprofiled ones (``clean`` in the
    pipeline's bubbles) past the first (which also builds the stages' buffers) when there are
    more than two, ``"unprofiled"``; else all of those, ``"profiled"``."""
    steps = sorted(chunks["step"].unique())
    if len(steps) > 2:
        steps = steps[1:]  # the first step also builds the stages' buffers
    clean = set(pipe.bubbles.loc[pipe.bubbles["clean"], "step"]) if len(pipe.bubbles) else set()
    use = [s for s in steps if s in clean] or steps
    basis = "unprofiled" if use and use[0] in clean else "profiled"
    return use, basis


def _step_times(chunks: pd.DataFrame, c: pd.DataFrame, use: list, spans: dict | None = None
                ) -> tuple[float, float, list[float]]:
    """``(window, period, periods)`` (µs): the median pipeline window of the used steps' chunks
    ``c``, the median start-to-start time from each used step to the next (periods over
    :data:`OUTLIER_STEP_FACTOR` × the median of three or more left out, as the report's step
    leaves them out) and all those start-to-start times. Without a next step (a trace of one
    step), the period is the median of the used steps' profiler-step ``spans`` (``{step: µs}``,
    the slowest rank's), else the window: a step also holds what runs outside its chunks (the
    optimizer, a rank's work between them)."""
    per_step = c.groupby("step").agg(lo=("start_us", "min"), hi=("end_us", "max"))
    window = float((per_step["hi"] - per_step["lo"]).median())
    starts = chunks.groupby("step")["start_us"].min().sort_index()
    periods = [starts[s + 1] - starts[s] for s in use if s + 1 in starts.index]
    kept = periods
    if len(periods) >= 3:
        med = float(np.median(periods))
        kept = [x for x in periods if x <= OUTLIER_STEP_FACTOR * med]
    held = [spans[st] for st in use if spans and st in spans]
    period = (float(np.median(kept)) if kept else float(np.median(held)) if held else window)
    return window, period, periods


def _profiler_step_spans(traces: TraceSet) -> dict[int, float]:
    """Per profiler step, the slowest rank's span (µs, each rank's own clock)."""
    from ..per_rank.summary import summary_of

    out: dict[int, float] = {}
    for t in traces.ranks.values():
        st = summary_of(t).steps
        for step, lo, hi in zip(st["step"], st["start_us"], st["end_us"]):
            out[int(step)] = max(out.get(int(step), 0.0), float(hi) - float(lo))
    return out


def _sidecar_records(traces: TraceSet, use: list, n_stages: int
                     ) -> tuple[dict, int | None, tuple]:
    """From the pipeline sidecars: ``(fixed shares {(stage, phase): share}, the microbatch size
    or None, per stage its layers ((name, forward µs, parameter bytes), in order; the median
    over the used steps, else over all))``; layers ``()`` when none were recorded."""
    fixed: dict = {}
    samples = None
    layers: dict[int, list[tuple[int, str, float, int]]] = {}
    use_keys = {str(s) for s in use}
    for doc in traces.sidecars.get("pipeline", {}).values():
        for row in doc.chunk_costs:
            fixed[(row.stage, row.phase)] = float(row.fixed_share)
        for r in doc.records:
            if r.samples is not None and r.samples > 0:
                samples = samples or r.samples
        for layer in doc.layers:
            times = [float(t) for k, t in layer.fwd_us.items() if k in use_keys]
            if not times:
                times = [float(t) for t in layer.fwd_us.values()]
            if times:
                layers.setdefault(layer.stage, []).append(
                    (layer.index, layer.name, float(np.median(times)),
                     int(layer.params_bytes or 0)))
    layer_list = tuple(tuple((n, t, b) for _, n, t, b in sorted(layers.get(s, [])))
                       for s in range(n_stages)) if layers else ()
    return fixed, samples, layer_list


def _recorded_orders(traces: TraceSet, p: int) -> dict[int, dict[int, list[whatif.Action]]]:
    """The schedule's orders at other microbatch counts that ``pardiag profile`` recorded
    (:attr:`pardiag.layout.PipelineSidecar.orders`; any rank's, all hold the same), by
    microbatch count and pipeline rank; only those that hold all ``p`` ranks."""
    out: dict[int, dict[int, list[whatif.Action]]] = {}
    for doc in traces.sidecars.get("pipeline", {}).values():
        for m, ranks in (doc.orders or {}).items():
            try:
                got = {int(r): [(int(a[0]), str(a[1]), int(a[2])) for a in seq]
                       for r, seq in ranks.items()}
            except (TypeError, ValueError, IndexError):
                continue
            if sorted(got) == list(range(p)):
                out.setdefault(int(m), got)
    return out


def _size_scaling(traces: TraceSet) -> dict[int, list]:
    """Per stage, ``[(samples, forward µs, backward µs)]`` of its module timed at other
    microbatch sizes after the run (sorted), for stages timed at two sizes or more with
    positive times."""
    size_scaling: dict[int, list] = {}
    for doc in traces.sidecars.get("pipeline", {}).values():
        for row in doc.size_scaling:
            size_scaling.setdefault(row.stage, []).append(
                (float(row.samples), float(row.fwd_us), float(row.bwd_us)))
    return {k: sorted(v) for k, v in size_scaling.items()
            if len({x[0] for x in v}) >= 2 and all(x[1] > 0 and x[2] > 0 for x in v)}


def _tails(traces: TraceSet, chunks: pd.DataFrame, use: list, period: float, window: float
           ) -> tuple[dict[int, float], dict[int, float]]:
    """Per rank (numbered in rank order): ``(tail µs, optimizer µs)``. The tail is the idle time
    between stage 0's rank's last chunk of a step and its first of the next (median over the
    used steps; the period less the window when none), split as each rank's optimizer step
    plus what rank 0 does besides; without every rank's optimizer recorded, that time for all
    and no optimizer times."""
    opt: dict[int, float] = {}
    for rank, doc in traces.sidecars.get("pipeline", {}).items():
        d = [float(o.end_us) - float(o.start_us) for o in doc.optimizer
             if o.optimizer_step in set(use)]
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
    return tails, opt


def sent_microbatch(traces: TraceSet, chunks: pd.DataFrame) -> int | None:
    """The microbatch size from the activations stage 0's rank sends: dim 0 of the tensor most
    of its sends carry (torch.distributed.pipelining splits the batch on dim 0 by default, and
    the per-microbatch ranges a model is built from are its marks). None without shapes
    (``record_shapes``)."""
    from ..per_rank.summary import summary_of

    s0 = chunks.loc[chunks["stage"] == 0, "rank"]
    trace = traces.ranks.get(int(s0.iloc[0])) if len(s0) else None
    if trace is None:
        return None
    dims = summary_of(trace).marks.send_dim0
    return max(dims, key=lambda k: (dims[k], -k)) if dims else None


def pipeline_model(traces: TraceSet, pipe) -> tuple[PipelineModel | None, str]:
    """Build the :class:`PipelineModel` of a run from its pipeline result (aligned chunks) and
    pipeline sidecars. Returns ``(model, "")`` or ``(None, why)``."""
    chunks = pipe.chunks
    sched = pipe.schedule or {}
    if chunks is None or chunks.empty:
        return None, ("no per-microbatch records or ranges to replay the schedule from (run under "
                      "`pardiag profile`)")
    layout, why = _schedule_layout(chunks, sched)
    if layout is None:
        return None, why
    kind, p, m, v, n_stages, observed = layout
    use, basis = _steps_used(chunks, pipe)
    c = chunks[chunks["step"].isin(use)]
    orders: dict[int, list[whatif.Action]] | None = None
    stage_rank: dict[int, int] = {}
    if observed:
        orders, stage_rank = _observed_orders(c)
        if orders is None:
            return None, "no step holds the whole schedule to replay"
    gap, hop_obs = _observed_gaps(c, n_stages)
    try:
        # the rank's own time between chunks belongs to them
        fwd, bwd, share = _stage_costs(c, n_stages, gap)
    except KeyError:
        return None, "a stage has no forward or backward records"
    window, period, periods = _step_times(chunks, c, use, _profiler_step_spans(traces))
    fixed, samples, layer_list = _sidecar_records(traces, use, n_stages)
    samples_from = "recorded" if samples else ""
    if not samples and (samples := sent_microbatch(traces, chunks)):
        samples_from = "sends"
    size_scaling = _size_scaling(traces)
    # per rank: optimizer time and the idle time between its last chunk and its next first one
    tails, opt = _tails(traces, chunks, use, period, window)
    run_orders = orders if orders is not None else whatif.schedule_order(kind, p, m, v)
    try:
        hop = (hop_obs if hop_obs is not None else
               whatif.calibrate_hop(run_orders, fwd, bwd, period, tails, share))
        residual = period - whatif.simulate_period(run_orders, fwd, bwd, hop, tails,
                                                   input_share=share)[0]
    except ValueError as exc:   # the recorded order does not run (a dependency it lacks)
        return None, f"the run's order does not replay: {exc}"
    return PipelineModel(kind, p, m, v, fwd, bwd, fixed, samples, window, period, hop, tails,
                         opt, layer_list, len(use), basis, residual, gap, size_scaling,
                         tuple(float(x) for x in periods), samples_from, orders, share,
                         stage_rank, _recorded_orders(traces, p) if observed else {}), ""


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
            elif r.phase == "W" or r.stage == n_stages - 1:
                dep = None   # after the rank's own work
            else:
                dep = next((k for k in ((r.step, r.stage + 1, ph, r.microbatch)
                                        for ph in ("B", "I")) if k in end), None)
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


def inflight(schedule: str, p: int, m: int, v: int) -> int:
    """Most microbatches whose activations a pipeline rank holds at once (stage 0's rank)."""
    if schedule == "gpipe":
        return m * v
    if schedule == "1f1b":
        return min(m, p)
    rounds = max(1, m // p)
    return min((v - 1) * (m // rounds) + 2 * (p - 1) + 1, m * v)
