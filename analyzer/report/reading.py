"""Reading one run's typed summary for a comparison (:mod:`.compare`): its step time with
its spread (:class:`StepStats`), the step-time difference of two runs (:class:`StepDelta`), its
setup, its ranks' time per profiled step and its peak memory."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from msgspec import UNSET

from ..analyses.runsetup import SETUP_LABELS, applicable_fields, schedule_name
from ..predict.recommend import STEP_BASES
from .schema import ReportDocument, SetupSection


@dataclasses.dataclass(frozen=True)
class StepStats:
    """One run's step time (µs) as its report measured it.

    Attributes:
        basis: ``pipeline``, ``unprofiled`` or ``profiled``
            (:data:`pardiag.analyzer.predict.recommend.STEP_BASES`).
        basis_text: the basis in words.
        steps: how many per-step values the statistics are over.
        median_us, q1_us, q3_us, min_us, max_us: median, quartiles and range (µs).
        samples_us: the per-step values (empty for a summary of schema 2, which has only the
            statistics of its profiled steps).
        runs_us: for a set of repeated runs (:func:`set_step_stats`), each run's median step
            (µs, in the runs' order); empty for one run.
    """

    basis: str
    basis_text: str
    steps: int
    median_us: float
    q1_us: float
    q3_us: float
    min_us: float
    max_us: float
    samples_us: tuple[float, ...] = ()
    runs_us: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class StepDelta:
    """The two runs' step times and their difference.

    Attributes:
        a, b: each run's :class:`StepStats`, None when it has no step.
        delta_us: B's median − A's (µs); NaN without both.
        delta_pct: 100 · delta / A's median (positive: B is slower).
        beyond_noise: one run per side: True when the middle halves (quartiles) of the two
            runs' steps do not overlap and the change exceeds the noise between identical runs
            (:data:`BETWEEN_RUNS_FLOOR_PCT`); repeated runs: True when the runs' median steps
            differ by a two-sided Mann–Whitney test at p < :data:`BETWEEN_RUNS_ALPHA`. False
            otherwise; None when a run has fewer than two steps, or when repeated runs are too
            few for the test to reach that level (:data:`MIN_RUNS_PER_SIDE`).
        noise: the rule's outcome in words.
        p_value: the Mann–Whitney test's p-value (repeated runs; None for one run per side).
        noise_us: how far apart the runs' step times come by noise alone (µs; NaN unknown):
            one run per side, :data:`BETWEEN_RUNS_FLOOR_PCT` of A's median; repeated runs,
            the larger side's interquartile range of its runs' medians. A part of the step (a
            row of the comparison) that moved less than this moved within the noise
            (:func:`within_noise`).
    """

    a: StepStats | None
    b: StepStats | None
    delta_us: float
    delta_pct: float
    beyond_noise: bool | None
    noise: str
    p_value: float | None = None
    noise_us: float = float("nan")


def num(v: object) -> float:
    """A JSON number as float (None, UNSET and non-numbers: NaN)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return float("nan")
    return float(v)


def step_stats(doc: ReportDocument) -> StepStats | None:
    """A run's step time from its summary: ``step`` (schema 3), else the run row of
    ``step_time`` (profiled steps; schema 2 has no samples), else None."""
    st = doc.step
    if st is not None and not math.isnan(num(st.median_us)):
        samples = tuple(float(x) for x in st.samples_us if isinstance(x, (int, float)))
        return StepStats(str(st.basis), str(st.basis_text or st.basis),
                         int(st.steps or len(samples)), num(st.median_us), num(st.q1_us),
                         num(st.q3_us), num(st.min_us), num(st.max_us), samples)
    run = [r for r in doc.step_time if r.rank is None]
    if run and not math.isnan(num(run[0].median_us)):
        r = run[0]
        return StepStats("profiled", STEP_BASES["profiled"], int(r.steps or 0),
                         num(r.median_us), num(r.q1_us), num(r.q3_us), num(r.min_us),
                         num(r.max_us))
    return None


def set_step_stats(docs: list[ReportDocument]) -> StepStats | None:
    """The step time of a set of repeated runs (``pardiag profile --repeat N``): the median,
    quartiles and range of the runs' median steps (each run's :func:`step_stats`), so that its
    spread is the noise between runs; ``runs_us`` holds each run's median, ``samples_us`` every
    step of every run, ``steps`` their count. Runs without a step are left out; one run with a
    step gives its own :func:`step_stats`; none gives None."""
    stats = [s for s in (step_stats(d) for d in docs) if s is not None]
    if len(stats) < 2:
        return stats[0] if stats else None
    med = np.array([s.median_us for s in stats])
    bases = {s.basis for s in stats}
    basis = stats[0].basis if len(bases) == 1 else "mixed"
    text = (f"the median of {len(stats)} runs' median steps (each over its "
            f"{stats[0].basis_text if len(bases) == 1 else 'steps'})")
    return StepStats(basis, text, sum(s.steps for s in stats), float(np.median(med)),
                     float(np.percentile(med, 25)), float(np.percentile(med, 75)),
                     float(med.min()), float(med.max()),
                     tuple(x for s in stats for x in s.samples_us), tuple(float(x) for x in med))


def host_probe_ms(doc: ReportDocument) -> float | None:
    """The mean of the run's host probes (ms: a fixed single-core workload timed before and
    after the job, ``run.host_probe_before_ms``/``host_probe_after_ms``); None when the run
    recorded none."""
    run = doc.run
    if run is None:
        return None
    got = [float(x) for x in (getattr(run, "host_probe_before_ms", None),
                              getattr(run, "host_probe_after_ms", None))
           if isinstance(x, (int, float)) and x > 0]
    return float(np.mean(got)) if got else None


def setup_of(doc: ReportDocument) -> SetupSection:
    """The summary's ``setup`` (schema 3), else what its ``run`` and ``layout`` hold."""
    if doc.setup is not None:
        return doc.setup
    run, lay = doc.run, doc.layout
    pipe = lay.pipeline
    sch = run.schedule if run is not None else None
    out: dict[str, Any] = {"source": "recorded" if run is not None else "traces",
           "script": run.script if run else None,
           "script_args": run.script_args if run and run.script else None,
           "world_size": run.world_size if run else None,
           "nnodes": run.nnodes if run else None,
           "hosts": (run.nodes if run else None) or lay.nodes or None,
           "dims": lay.dims or None, "strategies": lay.strategies or None,
           "pipeline_schedule": schedule_name(pipe.schedule if pipe else None),
           "pipeline_stages": pipe.stages if pipe else None,
           "stages_per_rank": pipe.stages_per_rank if pipe else None,
           "microbatches": pipe.microbatches if pipe else None,
           "backend": run.backend if run else None,
           "torch_version": run.torch_version if run else None,
           "profiler_schedule": [sch.wait, sch.warmup, sch.active] if sch else None}
    out["unknown"] = [k for k in SETUP_LABELS if k in applicable_fields(out) and out.get(k) is None]
    return SetupSection(**out)


def _roles(doc: ReportDocument) -> dict[int, str]:
    """Rank → role: ``"stage s"`` for pipeline ranks (their stages), else ``"all ranks"``."""
    stages = {r.rank: str(r.stages) for r in (doc.pipeline.summary if doc.pipeline else [])}
    return {r.rank: (f"stage {stages[r.rank]}" if r.rank in stages else "all ranks")
            for r in doc.ranks}


#: The breakdown values :func:`rank_table` averages over a rank's profiled steps.
_STEP_VALUES = ("span_us", "compute_only_us", "overlap_us", "exposed_comm_us", "memory_only_us",
                "idle_us")


def rank_table(doc: ReportDocument) -> pd.DataFrame:
    """Per rank of a summary: ``rank``, ``role``, ``steps`` (profiled), the mean per profiled
    step of ``span_us``, ``compute_only_us``, ``overlap_us``, ``exposed_comm_us``,
    ``memory_only_us`` (NaN in a report older than that key), ``idle_us``;
    ``wait_suffered_us`` and ``wait_caused_us`` per profiled step (matched collectives),
    ``exposed_wait_us`` = min(waiting at complete instances, ``sync.stragglers[].waiting_us``
    per step, exposed) and ``exposed_transfer_us`` = exposed − that (NaN for a rank that no
    complete instance holds: the split is unknown, as the verdict says);
    ``static_bytes``, ``peak_bytes`` (the report's peak, static + transient),
    ``peak_allocated_bytes``, ``peak_rss_bytes``."""
    roles = _roles(doc)
    waits = {r.rank: r for r in (doc.sync.stragglers if doc.sync else [])}
    mem = {r.rank: r for r in doc.memory.per_rank}
    rows = []
    for rk in doc.ranks:
        r = rk.rank
        n = len(rk.steps)
        if n:
            mean = {}
            for c in _STEP_VALUES:
                v = [x for x in (num(getattr(s, c)) for s in rk.steps) if not math.isnan(x)]
                mean[c] = float(np.mean(v)) if v else float("nan")
        else:   # no profiler step: the whole trace is one "step"
            mean = {c: num(getattr(rk.total, c)) for c in _STEP_VALUES}
        per = max(n, 1)
        w = waits.get(r)
        suffered = num(w.wait_suffered_us) / per if w else 0.0
        caused = num(w.wait_caused_us) / per if w else 0.0
        exposed = mean["exposed_comm_us"]
        # as the verdict splits it: unknown for a rank no complete instance holds
        matched = num(w.waiting_us) / per if w else float("nan")
        wait_exp = (min(matched, exposed) if not (math.isnan(matched) or math.isnan(exposed))
                    else float("nan"))
        m = mem.get(r)
        rows.append({"rank": r, "role": roles.get(r, "all ranks"), "steps": n, **mean,
                     "wait_suffered_us": suffered, "wait_caused_us": caused,
                     "exposed_wait_us": wait_exp, "exposed_transfer_us": exposed - wait_exp,
                     "static_bytes": num(m.static_bytes if m else None),
                     "peak_bytes": num(m.peak_bytes if m else None),
                     "peak_allocated_bytes": num(m.peak_allocated_bytes if m else None),
                     "peak_rss_bytes": num(m.peak_rss_bytes if m else None)})
    cols = ["rank", "role", "steps", "span_us", "compute_only_us", "overlap_us", "exposed_comm_us",
            "memory_only_us", "idle_us", "wait_suffered_us", "wait_caused_us", "exposed_wait_us",
            "exposed_transfer_us", "static_bytes", "peak_bytes", "peak_allocated_bytes",
            "peak_rss_bytes"]
    return pd.DataFrame(rows, columns=cols)


def peak_bytes(doc: ReportDocument) -> float | None:
    """The worst rank's peak memory (bytes) as the report and its recommendations state it
    (``memory.per_rank[].peak_bytes``: static + transient,
    :func:`pardiag.analyzer.analyses.memory.peak_bytes`); None when unknown."""
    best = None
    for r in doc.memory.per_rank:
        v = num(r.peak_bytes)
        if not math.isnan(v) and (best is None or v > best):
            best = v
    return best


def pct_change(a: float, b: float) -> float:
    """100 · (b − a) / a; NaN when a is 0 or unknown."""
    return 100.0 * (b - a) / a if not (math.isnan(a) or math.isnan(b)) and a != 0 else float("nan")


def value_text(v: object) -> str:
    """A setup value as short text: ``–`` for None, ``k=v, …`` for a dict, ``a, b`` for a
    list."""
    if v is None:
        return "–"
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items()) or "{}"
    if isinstance(v, list):
        return ", ".join(map(str, v)) if not any(isinstance(x, (list, dict)) for x in v) else str(v)
    return str(v)


#: How far apart the step times of identical runs came (%, largest |B − A| / A over 20 pairs
#: of one setup run back to back: the DDP example, 2 ranks pinned, on a 2-core VM; within
#: each run its steps agreed to a few %), measured by benchmarks/compare_noise.py (its
#: results: benchmarks/results/compare-noise_*). A single run per side cannot tell a change
#: smaller than this from the noise between runs.
BETWEEN_RUNS_FLOOR_PCT = 46.0


#: Significance level of the between-runs test of repeated runs (:func:`step_delta`).
BETWEEN_RUNS_ALPHA = 0.05


#: Runs per side from which the between-runs test can clear :data:`BETWEEN_RUNS_ALPHA`
#: (the smallest two-sided exact p of 4 against 4 runs is 2/70 = 0.029; of 3 against 3, 0.1).
MIN_RUNS_PER_SIDE = 4


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest p-value a two-sided exact Mann–Whitney test of ``n_a`` against ``n_b``
    samples can give (no ties: every sample of one side below every sample of the other):
    2 / C(n_a + n_b, n_a), at most 1 (Mann & Whitney 1947; the exact null distribution of U
    puts 1 / C(n_a + n_b, n_a) on each extreme)."""
    if n_a < 1 or n_b < 1:
        return 1.0
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))


def runs_test(ra: Sequence[float], rb: Sequence[float]) -> tuple[float, bool]:
    """Two-sided exact Mann–Whitney U test of B's values against A's (one value per run,
    scipy.stats.mannwhitneyu): ``(p, decidable)``; ``decidable`` is False when the run counts
    cannot give p < :data:`BETWEEN_RUNS_ALPHA` whatever the values (:func:`smallest_p`), so a
    large p says nothing. NaN values are left out; p is NaN when a side has none."""
    from scipy.stats import mannwhitneyu

    xa = [float(x) for x in ra if not math.isnan(x)]
    xb = [float(x) for x in rb if not math.isnan(x)]
    if not xa or not xb:
        return float("nan"), False
    p = float(mannwhitneyu(xb, xa, alternative="two-sided", method="exact").pvalue)
    return p, smallest_p(len(xa), len(xb)) < BETWEEN_RUNS_ALPHA


def _runs_delta(a: StepStats, b: StepStats, d: float, pct: float) -> StepDelta:
    """Repeated runs on either side: the runs' median steps compared by :func:`runs_test` (a
    run is one sample, so the spread between runs is the noise). When the run counts cannot
    reach :data:`BETWEEN_RUNS_ALPHA` (fewer than :data:`MIN_RUNS_PER_SIDE` runs on a side),
    the noise is unknown (``beyond_noise`` None), never "within"."""
    ra = a.runs_us or (a.median_us,)
    rb = b.runs_us or (b.median_us,)
    p, decidable = runs_test(ra, rb)

    def span(r: tuple[float, ...]) -> str:
        return (f"{len(r)} run{'s' if len(r) > 1 else ''} "
                + (f"{min(r) / 1e3:.2f}–{max(r) / 1e3:.2f} ms" if len(r) > 1
                   else f"{r[0] / 1e3:.2f} ms"))
    runs = f"A {span(ra)}, B {span(rb)}; Mann–Whitney p = {p:.3g}"
    noise = max(float(np.subtract(*np.percentile(r, [75, 25]))) for r in (ra, rb))
    if not decidable:
        return StepDelta(a, b, d, pct, None, (
            f"noise unknown ({runs}): with {len(ra)} run{'s' if len(ra) > 1 else ''} of A and "
            f"{len(rb)} of B no difference can clear p < {BETWEEN_RUNS_ALPHA:g} (the smallest "
            f"p possible is {smallest_p(len(ra), len(rb)):.2g}); repeat each side "
            f"{MIN_RUNS_PER_SIDE} times or more (pardiag profile --repeat "
            f"{MIN_RUNS_PER_SIDE})"), p, noise)
    if p < BETWEEN_RUNS_ALPHA:
        return StepDelta(a, b, d, pct, True, f"beyond the noise between runs ({runs})", p, noise)
    return StepDelta(a, b, d, pct, False, f"within the noise between runs ({runs}); more runs "
                     "per side tell a smaller change", p, noise)


def step_delta(a: StepStats | None, b: StepStats | None,
               floor_pct: float = BETWEEN_RUNS_FLOOR_PCT) -> StepDelta:
    """The step times' difference and whether it clears the noise (module docstring).

    Repeated runs on either side (:attr:`StepStats.runs_us`): the runs' medians are compared
    with each other (:func:`_runs_delta`). One run per side: the noise within each run (the
    middle halves of their steps do not overlap) and the noise between runs (``floor_pct``,
    :data:`BETWEEN_RUNS_FLOOR_PCT`)."""
    if a is None or b is None:
        missing = " and ".join(x for x, s in (("A", a), ("B", b)) if s is None)
        return StepDelta(a, b, float("nan"), float("nan"), None,
                         f"no step time in {missing}: the traces hold no complete step")
    d = b.median_us - a.median_us
    pct = pct_change(a.median_us, b.median_us)
    if len(a.runs_us) >= 2 or len(b.runs_us) >= 2:
        return _runs_delta(a, b, d, pct)
    few = [x for x, s in (("A", a), ("B", b)) if s.steps < 2]
    if few:
        return StepDelta(a, b, d, pct, None, f"noise unknown: {' and '.join(few)} "
                         f"{'has' if len(few) == 1 else 'have'} fewer than 2 steps")
    floor_us = floor_pct / 100.0 * a.median_us
    iqr = (f"IQR A {a.q1_us / 1e3:.2f}–{a.q3_us / 1e3:.2f} ms, B {b.q1_us / 1e3:.2f}–"
           f"{b.q3_us / 1e3:.2f} ms")
    repeat = (f"repeat each side (pardiag profile --repeat {MIN_RUNS_PER_SIDE} or more) to "
              "tell a smaller change")
    inside = abs(pct) <= floor_pct
    if not (b.q1_us > a.q3_us or b.q3_us < a.q1_us):
        between = (f" and inside the ±{floor_pct:g}% by which identical runs of one setup "
                   "differed" if inside else "")
        return StepDelta(a, b, d, pct, False, f"within the runs' noise ({iqr} overlap){between}; "
                         f"{repeat}", noise_us=floor_us)
    if inside:
        return StepDelta(a, b, d, pct, False, (
            f"within the noise between runs: {pct:+.1f}% is inside the ±{floor_pct:g}% by which "
            f"identical runs of one setup differed (each run's own steps agree: {iqr}); "
            f"{repeat}"), noise_us=floor_us)
    return StepDelta(a, b, d, pct, True, f"beyond both runs' noise ({iqr}: the middle "
                     f"halves of their steps do not overlap) and beyond the ±{floor_pct:g}% "
                     "between identical runs", noise_us=floor_us)


def within_noise(delta_us: float, step: StepDelta) -> bool | None:
    """Whether a part of the step that moved by ``delta_us`` (µs, B − A) moved within the
    noise between runs (:attr:`StepDelta.noise_us`): True when ``|delta_us|`` is at most
    that, False when larger, None when either is unknown."""
    if math.isnan(step.noise_us) or delta_us is None or math.isnan(delta_us):
        return None
    return abs(delta_us) <= step.noise_us


def straggler_of(doc: ReportDocument) -> int | None:
    """The run's straggler as its report's verdict names it (the JSON's top-level
    ``straggler``); in a report's JSON from before that key, ``sync.straggler``."""
    if doc.straggler is not UNSET:
        return doc.straggler
    return doc.sync.straggler if doc.sync is not None else None
