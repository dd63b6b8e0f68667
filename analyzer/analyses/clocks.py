"""How the ranks' clocks relate: an offset and a drift per clock, fitted to the ends of
release-together collectives.

Every member of a release-together op (:mod:`pardiag.analyzer.per_rank.op_semantics`) leaves it
when the last contribution has arrived, so on one true clock their ends agree to a few µs
(TensorBoard profiler plugin: align ranks on collective ends). A rank's recorded clock is
``true + offset + drift · t``: one offset from the time its profiler converted the GPU's clock
to the host's, and a drift that grows with the length of the trace (Kineto converts GPU
timestamps with one offset taken at start, so long traces drift). For each clock (a host's,
where the hosts are known; else a rank's) the differences ``end − consensus end`` (the
consensus: the median of the members' ends, after the previous pass's fit) are fitted by a line
in time with the Theil–Sen estimator (median of pairwise slopes, with Sen's distribution-free
interval from Kendall's S; Sen, J. Am. Stat. Assoc. 63 (1968) 1379 — as
:func:`scipy.stats.theilslopes` computes it), robust to about 29% of the points being wrong;
where the ends fall in profiler steps, through each step's median, since ends within one step
share their noise. The drift is kept only when its 95% interval excludes 0 and it is at most
:data:`MAX_DRIFT_US_PER_S` (no clock drifts faster: what fits faster is the noise of the ends,
e.g. gloo ranks waking up on contended CPUs, not a clock); else the offset is the median
difference. Rooted ops, point-to-point transfers and ops of unknown kind are never clock evidence.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..per_rank.op_semantics import TOGETHER, semantics

#: At most this many points per clock enter the Theil–Sen fit (its cost is quadratic); evenly
#: spaced in time.
MAX_FIT_POINTS = 1000
#: Fewer release-together ends than this, or a span shorter than this (s), fit no drift.
MIN_DRIFT_POINTS = 8
MIN_DRIFT_SPAN_S = 0.05
#: A fitted drift beyond this (µs per s) is claimed for no clock: NTP's maximum frequency
#: tolerance is 500 ppm (the NTPv4 specification, its section on the clock discipline), and
#: Kineto's GPU-to-host conversions, one offset taken at the trace's start, drift tens of µs per
#: s (the drift the cross-rank generator plants; results of ``benchmarks/cross_rank_accuracy.py``
#: in benchmarks/results/, listed in benchmarks/README.md).
MAX_DRIFT_US_PER_S = 500.0
#: Where the ends fall in profiler steps, fewer steps than this fit no drift (a line through two
#: steps' medians has no interval).
MIN_DRIFT_STEPS = 4


@dataclasses.dataclass(frozen=True)
class ClockModel:
    """Offsets and drifts of the ranks' clocks relative to a reference.

    Attributes:
        table: per rank: ``rank``, ``offset_us`` (its clock minus the reference rank's at
            ``t0_us``), ``drift_us_per_s`` (how much faster its clock runs, µs per s; 0 where
            none is claimed), ``drift_ci_us_per_s`` (half-width of the drift's 95% interval;
            NaN without a fit), ``residual_us`` (median absolute residual of the ends after the
            fit; on one host, where nothing is subtracted, the median difference itself),
            ``instances`` (release-together instances used), ``host`` (None when unknown).
        t0_us: the time (reference clock, µs) at which the offsets hold.
        domain: ``{rank: clock domain}``: ranks of different domains have clocks nothing relates.
        applied: whether the offsets are subtracted (not on one host: there is one clock).
    """

    table: pd.DataFrame
    t0_us: float
    domain: dict[int, int]
    applied: bool

    def correct(self, rank: np.ndarray, t_us: np.ndarray) -> np.ndarray:
        """``t_us`` recorded by ``rank`` (arrays of one shape) on the reference clock (µs)."""
        if not self.applied or not len(self.table):
            return np.asarray(t_us, dtype=float)
        off = dict(zip(self.table["rank"], self.table["offset_us"]))
        drift = dict(zip(self.table["rank"], self.table["drift_us_per_s"]))
        r = pd.Series(rank)
        a = r.map(off).fillna(0.0).to_numpy(dtype=float)
        b = r.map(drift).fillna(0.0).to_numpy(dtype=float)
        t = np.asarray(t_us, dtype=float)
        # t_ref = t - a - b (t_ref - t0) / 1e6, solved for t_ref
        return (t - a + b * self.t0_us / 1e6) / (1.0 + b / 1e6)


def theil_sen(t: np.ndarray, d: np.ndarray, z: float = 1.959964) -> tuple[float, float, float]:
    """Theil–Sen slope of ``d`` over ``t`` and its interval (Sen 1968: the order statistics of
    the pairwise slopes at ``(N ± z·σ_S) / 2``, σ_S² = n(n−1)(2n+5)/18 the variance of Kendall's
    S without ties; ``z`` = 1.96 for 95%).

    Returns:
        ``(slope, low, high)`` in units of d per unit of t; NaNs for fewer than 2 distinct t.
    """
    i, j = np.triu_indices(len(t), k=1)
    dt = t[j] - t[i]
    ok = dt != 0
    if not ok.any():
        return np.nan, np.nan, np.nan
    slopes = np.sort((d[j] - d[i])[ok] / dt[ok])
    n, m = len(t), len(slopes)
    sigma = np.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    hi = int(np.clip(np.round((m + z * sigma) / 2.0), 0, m - 1))
    lo = int(np.clip(np.round((m - z * sigma) / 2.0) - 1, 0, m - 1))
    return float(np.median(slopes)), float(slopes[lo]), float(slopes[hi])


def _block_medians(blocks: np.ndarray, *values: np.ndarray) -> list[np.ndarray]:
    """The median of each of ``values`` (finite) per block, blocks in ascending order: each
    value sorted within its block, the middle one or the mean of the two middle ones read off
    (as ``np.median`` computes it; called once per clock unit, thousands of times in a large
    run)."""
    sb = np.sort(blocks, kind="stable")
    starts = np.flatnonzero(np.r_[True, sb[1:] != sb[:-1]])
    n = np.diff(np.r_[starts, len(sb)])
    lo, hi = starts + (n - 1) // 2, starts + n // 2
    out = []
    for v in values:
        sv = v[np.lexsort((v, blocks))]
        out.append((sv[lo] + sv[hi]) / 2.0)
    return out


def fit_line(t_s: np.ndarray, d_us: np.ndarray, blocks: np.ndarray | None = None
             ) -> tuple[float, float, float, float]:
    """Robust line ``d = intercept + slope · t`` through a clock's differences.

    ``t_s``: times (s since the model's ``t0``); ``d_us``: differences (µs); ``blocks``: the
    profiler step of each point (-1 outside every step), or None. Theil–Sen with its 95% slope
    interval (:func:`theil_sen`). Sen's interval takes the points' errors as independent, and
    within a step they are not (a rank descheduled for a while shifts a run of its ends alike):
    where most points fall in steps, the slope is fitted through each step's median time and
    difference (the points outside steps sit out), so the interval counts steps, not ends, and
    a drift needs at least :data:`MIN_DRIFT_STEPS` of them. The slope is 0 when the interval
    holds 0, when it is above :data:`MAX_DRIFT_US_PER_S`, when there are fewer than
    :data:`MIN_DRIFT_POINTS` points or steps too few, or they span less than
    :data:`MIN_DRIFT_SPAN_S`.

    Returns:
        ``(intercept µs, slope µs/s, slope half-interval µs/s (NaN without a fit), median
        absolute residual µs)``; NaNs for no points.
    """
    ok = np.isfinite(t_s) & np.isfinite(d_us)
    t, d = np.asarray(t_s, float)[ok], np.asarray(d_us, float)[ok]
    if not len(d):
        return np.nan, 0.0, np.nan, np.nan
    tf, df = t, d
    enough = len(d) >= MIN_DRIFT_POINTS
    if blocks is not None:
        b = np.asarray(blocks)[ok]
        if (b >= 0).mean() >= 0.5:   # ends outside every step (a window's edges) sit out
            inside = b >= 0
            tf, df = _block_medians(b[inside], t[inside], d[inside])
            enough = enough and len(tf) >= MIN_DRIFT_STEPS
    slope, half = 0.0, np.nan
    if enough and np.ptp(tf) >= MIN_DRIFT_SPAN_S:
        if len(df) > MAX_FIT_POINTS:
            order = np.argsort(tf)
            pick = np.linspace(0, len(df) - 1, MAX_FIT_POINTS).astype(int)
            tf, df = tf[order][pick], df[order][pick]
        est, low, high = theil_sen(tf, df)
        if np.isfinite(est):
            half = (high - low) / 2
            if not (low <= 0.0 <= high) and abs(est) <= MAX_DRIFT_US_PER_S:
                slope = est
    intercept = float(np.median(d - slope * t))
    resid = float(np.median(np.abs(d - intercept - slope * t)))
    return intercept, slope, half, resid


def _few_point_fits(codes: np.ndarray, uniq, t: np.ndarray, diff: np.ndarray) -> dict:
    """:func:`fit_line` of every unit with fewer than :data:`MIN_DRIFT_POINTS` finite points
    (``{unit: (intercept, 0.0, NaN, residual, rows)}``), all in one pass: such a unit gets no
    slope, so its intercept is the median of its differences and its residual the median
    distance from it (the same numbers as :func:`fit_line`; most units of a run with few
    collectives, thousands of them in a large run)."""
    ok = np.isfinite(t) & np.isfinite(diff)
    rows = np.bincount(codes, minlength=len(uniq))
    used = np.bincount(codes[ok], minlength=len(uniq))
    few = used < MIN_DRIFT_POINTS
    fit = {u: (np.nan, 0.0, np.nan, np.nan, int(rows[k]))
           for k, u in enumerate(uniq) if few[k] and not used[k]}
    sel = ok & few[codes]
    if not sel.any():
        return fit
    c, d = codes[sel], diff[sel]
    present = np.unique(c)
    (icpt,) = _block_medians(c, d)
    (resid,) = _block_medians(c, np.abs(d - icpt[np.searchsorted(present, c)]))
    for k, a, r in zip(present.tolist(), icpt.tolist(), resid.tolist()):
        fit[uniq[k]] = (a, 0.0, np.nan, r, int(rows[k]))
    return fit


def together_ends(ev: pd.DataFrame, complete: set) -> pd.DataFrame:
    """Rows of ``ev`` (matched events) that are clock evidence: members of complete
    release-together collectives (``instance``, ``rank``, ``end_us``)."""
    is_p2p = ev["instance"].astype(str).str.startswith("p2p:")
    sem = ev["op"].map(semantics)
    return ev[ev["instance"].isin(complete) & ~is_p2p & sem.eq(TOGETHER)]


def fit_clocks(rows: pd.DataFrame, unit: dict[int, object], t0_us: float, passes: int = 2
               ) -> dict[object, tuple[float, float, float, float, int]]:
    """Per clock unit (a host or a rank, ``unit[rank]``): the line of its ranks' ``end −
    consensus end`` in time (:func:`fit_line`), the consensus recomputed on the corrected ends
    each pass.

    ``rows``: :func:`together_ends`; ``t0_us``: the time the intercepts refer to.

    Returns:
        ``{unit: (intercept µs, slope µs/s, slope half-interval, residual µs, ends used)}``,
        relative to the consensus (not yet to a reference).
    """
    end = rows["end_us"].to_numpy(dtype=float)
    units = rows["rank"].map(unit).to_numpy()
    steps = rows["step"].to_numpy() if "step" in rows else None
    t = (end - t0_us) / 1e6
    fit: dict[object, tuple] = {}
    corrected = end.copy()
    # each unit's rows once (a mask per unit would make this quadratic in the ranks)
    codes, uniq = pd.factorize(units)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(uniq) + 1))
    rows_of = [order[bounds[k]:bounds[k + 1]] for k in range(len(uniq))]
    for _ in range(max(1, passes)):
        consensus = pd.Series(corrected).groupby(rows["instance"].to_numpy()).transform("median")
        diff = end - consensus.to_numpy()
        fit = _few_point_fits(codes, uniq, t, diff)
        for u, idx in zip(uniq, rows_of):
            if u not in fit:
                fit[u] = (*fit_line(t[idx], diff[idx], None if steps is None else steps[idx]),
                          len(idx))
        a = np.array([fit[u][0] for u in uniq])[codes]
        b = np.array([fit[u][1] for u in uniq])[codes]
        corrected = end - a - b * t
    return fit
