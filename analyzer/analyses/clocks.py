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

Over the matched instances (:mod:`pardiag.analyzer.analyses.matching`), :func:`align_clocks` fits
that model (per host where :func:`rank_hosts` knows them, else per rank; ranks that no complete
collective links, and that no point-to-point transfers overlapping as recorded join, are separate
clock domains, never compared; where a rank has several profiling windows, each window on its own:
every window is a profiler session that converts device times afresh) and puts every event on
the reference clock;
:func:`instance_times` then gives each instance its arrival, transfer time and bandwidth.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np
import pandas as pd

from ..per_rank.op_semantics import FROM_ROOT, ROOTED, TOGETHER, busbw_factor, semantics
from ..trace.traceset import TraceSet
from .instance_keys import is_p2p

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
        windows: ``{profiling window: ClockModel}`` where the ranks' windows were fitted each
            on its own (:func:`align_clocks`); ``table`` and ``domain`` are then the
            best-linked window's (:func:`_window_models`). Empty with one window.
    """

    table: pd.DataFrame
    t0_us: float
    domain: dict[int, int]
    applied: bool
    windows: dict[int, ClockModel] = dataclasses.field(default_factory=dict)

    @functools.cached_property
    def _terms(self) -> tuple[pd.Index, np.ndarray, np.ndarray]:
        """The table's ranks (an index to look them up), offsets and drifts (NaN as 0)."""
        last = {r: i for i, r in enumerate(self.table["rank"].tolist())}   # a repeat: the last
        rows = np.fromiter(last.values(), dtype=int, count=len(last))
        return (pd.Index(list(last)),
                np.nan_to_num(self.table["offset_us"].to_numpy(dtype=float)[rows]),
                np.nan_to_num(self.table["drift_us_per_s"].to_numpy(dtype=float)[rows]))

    def correct(self, rank: np.ndarray, t_us: np.ndarray, window: np.ndarray | int | None = None
                ) -> np.ndarray:
        """``t_us`` recorded by ``rank`` (arrays of one shape) on the reference clock (µs); with
        ``window`` (the profiling window of each, or one for all), by that window's model where
        the windows were fitted apart."""
        if self.windows and window is not None:
            t = np.array(t_us, dtype=float)
            rk = np.asarray(rank)
            w = np.broadcast_to(np.asarray(window), t.shape)
            for k in np.unique(w).tolist():
                at = w == k
                t[at] = self.windows.get(int(k), self).correct(rk[at], t[at])
            return t
        if not self.applied or not len(self.table):
            return np.asarray(t_us, dtype=float)
        ranks, off, drift = self._terms
        at = ranks.get_indexer(np.asarray(rank).ravel()).reshape(np.shape(rank))
        known = at >= 0   # a rank the table lacks is taken as on the reference clock
        a = np.where(known, off[at], 0.0)
        b = np.where(known, drift[at], 0.0)
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
    p2p = is_p2p(ev["instance"])
    sem = ev["op"].map(semantics)
    return ev[ev["instance"].isin(complete) & ~p2p & sem.eq(TOGETHER)]


def fit_clocks(rows: pd.DataFrame, unit: dict[int, object], t0_us: float, passes: int = 2
               ) -> dict[object, tuple[float, float, float, float, int]]:
    """Per clock unit (a host or a rank, ``unit[rank]``): the line of its ranks' ``end −
    consensus end`` in time (:func:`fit_line`), the consensus recomputed on the corrected ends
    each pass, starting from the offsets solved jointly over every end (:func:`_joint_offsets`).

    ``rows``: :func:`together_ends`; ``t0_us``: the time the intercepts refer to.

    Returns:
        ``{unit: (intercept µs, slope µs/s, slope half-interval, residual µs, ends used)}``,
        relative to the consensus (not yet to a reference): ``end = consensus + intercept +
        slope · (consensus − t0_us) / 1e6`` (:func:`relative_to`).
    """
    end = rows["end_us"].to_numpy(dtype=float)
    units = rows["rank"].map(unit).to_numpy()
    steps = rows["step"].to_numpy() if "step" in rows else None
    fit: dict[object, tuple] = {}
    # each unit's rows once (a mask per unit would make this quadratic in the ranks)
    codes, uniq = pd.factorize(units)
    corrected = end - _joint_offsets(end, rows["instance"].to_numpy(), codes, len(uniq))[codes]
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(uniq) + 1))
    rows_of = [order[bounds[k]:bounds[k + 1]] for k in range(len(uniq))]
    for _ in range(max(1, passes)):
        consensus = pd.Series(corrected).groupby(rows["instance"].to_numpy()).transform(
            "median").to_numpy()
        diff = end - consensus
        # the line runs on the consensus clock, not on the unit's own: a unit 0.7 s off that
        # drifts 40 µs/s would otherwise take 0.7 × 40 = 28 µs of its drift into its offset
        t = (consensus - t0_us) / 1e6
        fit = _few_point_fits(codes, uniq, t, diff)
        for u, idx in zip(uniq, rows_of):
            if u not in fit:
                fit[u] = (*fit_line(t[idx], diff[idx], None if steps is None else steps[idx]),
                          len(idx))
        a = np.array([fit[u][0] for u in uniq])[codes]
        b = np.array([fit[u][1] for u in uniq])[codes]
        corrected = end - a - b * t
    return fit


#: The offsets' least-squares solve stops when its residual is this share of the start's ...
OFFSET_CG_RTOL = 1e-10
#: ... or after this many conjugate-gradient iterations (per unit: a chain of units, each
#: linked to the next only, needs about as many as it has units).
OFFSET_CG_MAX_ITER = 2000
#: Rounds of reweighting toward least absolute deviations (each end weighs 1 / its distance
#: from the fit, at least :data:`OFFSET_L1_FLOOR_US`): the offsets the ends' medians would
#: give, solved jointly, so that heavy tails (gloo's collectives end up to 100 ms apart on a
#: loaded host) and mismatched instances do not pull them.
OFFSET_ROUNDS = 30
OFFSET_L1_FLOOR_US = 1.0


def _cg(matvec: Callable[[np.ndarray], np.ndarray], b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Conjugate gradients for ``matvec(x) = b`` (symmetric positive semi-definite, ``b`` in its
    range), from ``x``."""
    r = b - matvec(x)
    p = r.copy()
    rr = float(r @ r)
    stop = OFFSET_CG_RTOL ** 2 * max(float(b @ b), 1e-300)
    for _ in range(OFFSET_CG_MAX_ITER):
        if rr <= stop:
            break
        q = matvec(p)
        pq = float(p @ q)
        if pq <= 0:
            break
        alpha = rr / pq
        x = x + alpha * p
        r = r - alpha * q
        rr_new = float(r @ r)
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def _joint_offsets(end: np.ndarray, instance: np.ndarray, codes: np.ndarray, n_units: int
                       ) -> np.ndarray:
    """Each unit's offset (µs, shape ``(n_units,)``; 0 for a unit without a finite end): the
    offsets ``a`` that best explain every end as its instance's time plus its unit's offset
    (``end = T_i + a_u``), solved jointly (least squares, instance times eliminated; conjugate
    gradients on the resulting Laplacian system), its ends reweighted toward least absolute
    deviations over :data:`OFFSET_ROUNDS` rounds (iteratively reweighted least squares).
    Offsets are fixed up to a constant per linked set of units; :func:`fit_clocks` refers them
    to its consensus.

    A unit-by-unit median of its ends less their instances' consensus stops short where most
    of a unit's instances are with units of its own clock: with 8 ranks on two hosts 3,000 µs
    apart whose tensor-parallel pairs (or expert-parallel groups) each sit on one host, it left
    750 µs of the offset after two passes, or none of it at all when the in-host instances were
    most of every rank's: their ends agree whatever the offset, and outvote the cross-host ones.
    """
    a = np.zeros(n_units)
    ok = np.isfinite(end)
    if not ok.any():
        return a
    e, c = end[ok], codes[ok]
    e = e - e.min()   # epoch µs (~1.7e15) keep a quarter µs of precision; sums of them less
    ic, _ = pd.factorize(instance[ok])
    n_i = int(ic.max()) + 1
    w = np.ones(len(e))

    def inst_mean(x: np.ndarray) -> np.ndarray:
        return (np.bincount(ic, w * x, n_i) / np.bincount(ic, w, n_i))[ic]

    def lap(v: np.ndarray) -> np.ndarray:
        x = v[c]
        return np.bincount(c, w * (x - inst_mean(x)), n_units)

    for _ in range(OFFSET_ROUNDS):
        a = _cg(lap, np.bincount(c, w * (e - inst_mean(e)), n_units), a)
        res = e - a[c]
        res = res - inst_mean(res)
        w = 1.0 / np.maximum(np.abs(res), OFFSET_L1_FLOOR_US)
    return a


#: A send and its recv whose recorded intervals miss each other by more than this (µs) are not
#: taken to run on one clock.
P2P_OVERLAP_SLACK_US = 1.0
#: A device send and its receive kernel end within this (µs) of each other on one clock.
P2P_END_TOL_US = 5.0


def _link(ev: pd.DataFrame, complete: set, ranks: list[int]) -> dict[int, int]:
    """``{rank: lowest rank it is linked to}``: complete collectives (release-together or
    rooted) join their members (union-find); ranks nothing joins are their own."""
    parent = {r: r for r in ranks}

    def find(r):
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    coll = ev[ev["instance"].isin(complete) & ~is_p2p(ev["instance"])]
    for _, members in coll.groupby("instance")["rank"]:
        m = sorted(int(x) for x in members)
        for x in m[1:]:
            parent[find(x)] = find(m[0])
    lowest: dict[int, int] = {}   # per component (its root), its lowest rank: once each
    for r in ranks:
        root = find(r)
        lowest[root] = min(lowest.get(root, r), r)
    return {r: lowest[find(r)] for r in ranks}


def _p2p_links(ev: pd.DataFrame, complete: set, root: dict[int, int], model: ClockModel
               ) -> tuple[dict[int, int], int, dict[int, tuple[float, float]]]:
    """Join the clock domains that only point-to-point pairs relate: a send and its recv run
    together, so on one clock their recorded intervals overlap. Where both sides are device
    kernels (NCCL's send and receive kernels end together, the data in place), the ends say
    more: two domains whose pairs end a consistent median apart (the median absolute deviation
    within :data:`P2P_END_TOL_US` or a tenth of it) are one clock offset by that median (none
    when it is within :data:`P2P_END_TOL_US`). Host transfers say less (an async send's span
    lasts until its wait, so its end says nothing): their domains are one clock at no offset.
    Either way every pair must overlap once the offset is subtracted: one that does not says
    the clocks differ or the pairing is off, and those domains are not compared.

    Returns:
        (``{rank: domain}``, point-to-point pairs between domains, ``{domain root: (offset µs
        of its clock relative to its new domain's reference, median absolute deviation of the
        pairs' end differences µs)}`` for the domains linked by kernel ends).
    """
    pairs = ev[ev["instance"].isin(complete) & is_p2p(ev["instance"])]
    # the instances of exactly two members, each pair's rows adjacent (sender, receiver or
    # the other way: what follows is symmetric in the two)
    pairs = pairs[pairs.groupby("instance")["rank"].transform("size").to_numpy() == 2]
    pairs = pairs.sort_values("instance", kind="stable")
    rs = pairs["rank"].to_numpy(dtype=int)
    st = model.correct(rs, pairs["start_us"].to_numpy(dtype=float))
    en = model.correct(rs, pairs["end_us"].to_numpy(dtype=float))
    ca = np.array([root[int(r)] for r in rs[0::2]], dtype=int)
    cb = np.array([root[int(r)] for r in rs[1::2]], dtype=int)
    stream = (pd.to_numeric(pairs["stream"], errors="coerce").notna().to_numpy()
              if "stream" in pairs else np.zeros(len(pairs), dtype=bool))
    kernels = stream[0::2] & stream[1::2]
    # each pair as (the smaller domain root's side, the larger's)
    lo_first = ca < cb
    sx, ex = np.where(lo_first, st[0::2], st[1::2]), np.where(lo_first, en[0::2], en[1::2])
    sy, ey = np.where(lo_first, st[1::2], st[0::2]), np.where(lo_first, en[1::2], en[0::2])
    cross = ca != cb
    n_pairs = int(cross.sum())
    keys = np.stack([np.minimum(ca, cb), np.maximum(ca, cb)], axis=1)[cross]
    sx, ex, sy, ey, kernels = sx[cross], ex[cross], sy[cross], ey[cross], kernels[cross]
    # per pair of domains: the offset of the larger root's clock, or None (not linked)
    link: dict[tuple[int, int], tuple[float, float] | None] = {}
    for key in sorted({(int(x), int(y)) for x, y in keys}):
        at = np.flatnonzero((keys[:, 0] == key[0]) & (keys[:, 1] == key[1]))
        off, mad = 0.0, float("nan")
        k = at[kernels[at]]
        if len(k):   # kernels: the median end difference, where the pairs agree on it
            d = ey[k] - ex[k]
            med = float(np.median(d))
            mad = float(np.median(np.abs(d - med)))
            if mad > max(P2P_END_TOL_US, 0.1 * abs(med)):
                link[key] = None
                continue
            off = med if abs(med) > P2P_END_TOL_US else 0.0
        # on one clock (offset subtracted) every send overlaps its receive: one that does not
        # says the pairing is off, and nothing is made up from it
        ok = np.maximum(sx[at], sy[at] - off) <= np.minimum(ex[at], ey[at] - off) \
            + P2P_OVERLAP_SLACK_US
        link[key] = (off, mad) if bool(ok.all()) else None
    linked: dict[int, int] = {}
    shift: dict[int, tuple[float, float]] = {}
    for start in sorted(set(root.values())):
        if start in linked:
            continue
        linked[start] = start
        offset = {start: 0.0}
        todo = [start]
        while todo:
            a = todo.pop()
            for (x, y), got in link.items():
                if got is None or a not in (x, y):
                    continue
                other = y if a == x else x
                if other in linked:
                    continue
                linked[other] = start
                off, mad = got
                offset[other] = offset[a] + (off if other == y else -off)
                if off or offset[other]:
                    shift[other] = (offset[other], mad)
                todo.append(other)
    return {r: linked[root[r]] for r in root}, n_pairs, shift


def _clock_model(ev: pd.DataFrame, complete: set, hosts: dict[int, str],
                 t0_us: float | None = None) -> tuple[ClockModel, list[str]]:
    """The clocks of the ranks (:mod:`pardiag.analyzer.analyses.clocks`): one offset and drift
    per host where every rank's host is known (with one host, one clock: nothing subtracted),
    else per rank, relative to the lowest rank of each clock domain and fitted over the ends of
    complete release-together instances only. Ranks nothing links to the lowest rank keep their
    clock, and a note says so. The offsets hold at ``t0_us`` (the reference rank's clock; by
    default its first communication event): with drift, an offset is a clock's difference at
    one moment, and the start of the profiled window is the one a reader compares.

    Returns:
        (the model, notes on it).
    """
    ranks = sorted(int(r) for r in ev["rank"].unique())
    notes: list[str] = []
    cols = ["rank", "offset_us", "drift_us_per_s", "drift_ci_us_per_s", "residual_us",
            "instances", "host"]
    if not ranks:
        return ClockModel(pd.DataFrame(columns=cols), 0.0, {}, False), notes
    ref = ranks[0]
    t0 = float(np.nanmin(ev.loc[ev["rank"] == ref, "start_us"].to_numpy(dtype=float)))
    if t0_us is not None and np.isfinite(t0_us):
        t0 = float(t0_us)
    root = _link(ev, complete, ranks)
    rows = together_ends(ev, complete)
    known = all(hosts.get(r) for r in ranks)
    one_host = known and len({hosts[r] for r in ranks}) == 1
    # one host is one clock; its ranks are still fitted one by one, to say how far apart the
    # ends are there
    unit: dict[int, object] = ({r: hosts[r] for r in ranks} if known and not one_host
                               else {r: r for r in ranks})
    fit = fit_clocks(rows, unit, t0)
    used = rows.groupby("rank")["instance"].nunique()
    none = (0.0, 0.0, np.nan, 0.0, 0)
    out = pd.DataFrame({"rank": ranks, "host": [hosts.get(r) for r in ranks]})
    out["instances"] = out["rank"].map(used).fillna(0).astype(int)
    a = np.array([fit.get(unit[r], none)[0] for r in ranks], dtype=float)
    b = np.array([fit.get(unit[r], none)[1] for r in ranks], dtype=float)
    a = np.nan_to_num(a)
    # relative to the lowest rank of each domain (its own clock)
    ref_of = [root[r] for r in ranks]
    pos = {r: i for i, r in enumerate(ranks)}
    terms = [relative_to(a[i], b[i], a[pos[q]], b[pos[q]]) for i, q in enumerate(ref_of)]
    out["offset_us"] = [x for x, _ in terms]
    out["drift_us_per_s"] = [y for _, y in terms]
    out["drift_ci_us_per_s"] = [fit.get(unit[r], none)[2] for r in ranks]
    out["residual_us"] = [fit.get(unit[r], none)[3] for r in ranks]
    n_coll = rows["instance"].nunique()
    applied = True
    if one_host:
        applied = False
        out["residual_us"] = out["offset_us"]
        out["offset_us"] = 0.0
        out["drift_us_per_s"] = 0.0
        notes.append(f"all {len(ranks)} ranks ran on one host ({hosts[ref]}): one clock, no "
                     f"offset subtracted" + (
                         f" (collective ends differ by at most "
                         f"{float(np.abs(out['residual_us']).max()):.1f} µs there)" if n_coll else
                         " (no complete release-together collective to compare ends at)"))
        return ClockModel(out[cols], t0, {r: 0 for r in ranks}, applied), notes
    model = ClockModel(out[cols], t0, dict(root), applied)
    domain, n_pairs, shift = _p2p_links(ev, complete, root, model)
    if shift:   # a domain linked by its kernels' transfer ends, at an offset
        moved = out["rank"].map(lambda r: shift.get(root[int(r)], (0.0, np.nan)))
        out["offset_us"] = out["offset_us"] + moved.map(lambda x: x[0])
        lone = out["instances"].eq(0) & out["rank"].map(lambda r: root[int(r)] in shift)
        if lone.any():   # (an empty object column set into a float one is an error)
            out.loc[lone, "residual_us"] = moved[lone].map(lambda x: x[1]).astype(float)
        notes.append(f"point-to-point transfers alone link rank(s) "
                     f"{sorted(r for r in ranks if root[r] in shift)[:8]} to the others: their "
                     f"send and receive kernels end together, so each clock's offset is the "
                     f"median difference of those ends")
    model = ClockModel(out[cols], t0, domain, applied)
    what = "host" if known else "rank"
    if n_coll or n_pairs:
        notes.append(f"{'hosts known' if known else 'hosts unknown'}: a clock offset and drift "
                     f"per {what} fitted (Theil–Sen) to the ends of {n_coll} complete "
                     f"release-together collective instances"
                     + (f"; {n_pairs} point-to-point pairs between ranks that no collective "
                        f"joins checked for one clock" if n_pairs else ""))
    drifting = out[out["drift_us_per_s"].abs() > 0]
    if len(drifting):
        worst = drifting.loc[drifting["drift_us_per_s"].abs().idxmax()]
        notes.append(f"clock drift found on {len(drifting)} rank(s) (up to "
                     f"{float(worst['drift_us_per_s']):+.1f} µs/s on rank {int(worst['rank'])}): "
                     f"times corrected by offset and drift")
    apart = sorted(r for r in ranks if domain[r] != domain[ref])
    if apart:
        notes.append(f"no complete collective links rank(s) {apart[:8]}"
                     f"{'...' if len(apart) > 8 else ''} to rank {ref}, and their "
                     f"point-to-point transfers with it do not overlap in time as recorded "
                     f"(other clocks, or transfers that cannot be paired): separate clock "
                     f"domains, never compared")
    return model, notes


def relative_to(a: float, b: float, a_ref: float, b_ref: float) -> tuple[float, float]:
    """(offset µs, drift µs/s) of a clock against a reference clock, both given as lines on a
    common clock c (:func:`fit_clocks`: ``t = c + a + b·(c − t0)/1e6``, ``t_ref`` likewise):
    ``t − t_ref = offset + drift·(t_ref − t0)/1e6``, the model :meth:`ClockModel.correct`
    inverts. Eliminating c (``c − t0 = (t_ref − t0 − a_ref)/(1 + b_ref/1e6)``) gives
    ``drift = (b − b_ref)/(1 + b_ref/1e6)`` and ``offset = a − a_ref − drift·a_ref/1e6``."""
    drift = (b - b_ref) / (1.0 + b_ref / 1e6)
    return a - a_ref - drift * a_ref / 1e6, drift


def rank_hosts(traces: TraceSet) -> dict[int, str]:
    """``{rank: host}`` from pardiag's rank metadata (traces from elsewhere do not say)."""
    return {r: str(m.host) for r, m in traces.rank_meta.items() if m.host}


def align_clocks(ev: pd.DataFrame, inst: pd.DataFrame, hosts: dict[int, str],
                  t0_us: float | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame, ClockModel, list[str]]:
    """Fit the clock model (:func:`_clock_model`, offsets at ``t0_us``) to the complete
    instances of ``inst`` (:func:`.matching.count_instances`) and correct the event times of
    ``ev`` by it.

    Returns:
        (``ev`` with ``start_us``/``end_us`` on the reference clock and ``dur_us`` added (µs);
        ``inst`` with ``complete`` False for instances whose members' clocks nothing relates;
        the model; notes on it).
    """
    complete = set(inst.index[inst["complete"]])
    win = (ev["window"].fillna(0).astype(int).to_numpy() if "window" in ev
           else np.zeros(len(ev), dtype=int))
    multi = len(ev) and pd.Series(win).groupby(ev["rank"].to_numpy()).nunique().max() > 1
    if multi:
        model, notes = _window_models(ev, win, complete, hosts, t0_us)
    else:
        model, notes = _clock_model(ev, complete, hosts, t0_us)
    # an instance whose members' clocks nothing relates cannot be compared (an instance lies
    # in one window: its first member's says which model's domains)
    if multi:
        rk_all = ev["rank"].to_numpy()
        groups = ev.groupby("instance").indices
        sets = pd.Series({key: len({model.windows.get(int(win[idx[0]]), model).domain.get(
            int(r), int(r)) for r in rk_all[idx]}) for key, idx in groups.items()}, dtype=int)
    else:
        sets = ev.groupby("instance")["rank"].agg(
            lambda rs: len({model.domain.get(int(r), int(r)) for r in rs}))
    apart = set(sets.index[sets > 1])
    if apart:
        inst = inst.copy()
        inst.loc[inst.index.isin(apart), "complete"] = False
    ev = ev.copy()
    rk = ev["rank"].to_numpy()
    ev["start_us"] = model.correct(rk, ev["start_us"].to_numpy(dtype=float), win)
    ev["end_us"] = model.correct(rk, ev["end_us"].to_numpy(dtype=float), win)
    if "issue_us" in ev:
        ev["issue_us"] = model.correct(rk, ev["issue_us"].to_numpy(dtype=float), win)
    ev["dur_us"] = ev["end_us"] - ev["start_us"]
    return ev, inst, model, notes


def _window_models(ev: pd.DataFrame, win: np.ndarray, complete: set, hosts: dict[int, str],
                   t0_us: float | None) -> tuple[ClockModel, list[str]]:
    """One clock model per profiling window (``win``: each event's), each fitted on its own
    (:func:`_clock_model`): every window is a profiler session of its own, whose conversion of
    device times to the host's clock is taken afresh, so a drift restarts in each and one line
    through two windows fits neither. The model returned is the window's whose fit used the
    most instances (the first among equals), its table holding every rank (a rank absent there
    from the first window it is in), with every window's in :attr:`ClockModel.windows`; its
    notes, and one on the others."""
    models: dict[int, ClockModel] = {}
    notes: list[str] = []
    used: list[int] = []
    said: dict[int, list[str]] = {}
    for w in sorted(np.unique(win).tolist()):
        sub = ev[win == w]
        mine = complete & set(sub["instance"])
        m, n = _clock_model(sub, mine, hosts, t0_us if not models else None)
        models[int(w)] = m
        said[int(w)] = n
        used.append(int(together_ends(sub, mine)["instance"].nunique()))
    # the window whose fit used the most instances speaks for the others (a window that a
    # rank lacks links none of its instances); the count is every window's
    main = sorted(models)[int(np.argmax(used))]
    notes = [ln.replace(f"the ends of {max(used)} complete", f"the ends of {sum(used)} complete")
             for ln in said[main]]
    first = models[main]
    order = [main, *[w for w in sorted(models) if w != main]]
    tables = pd.concat([models[w].table for w in order], ignore_index=True)
    per_rank = tables.groupby("rank")["instances"].sum()
    # each rank's row from the first window it is in (a rank may lack the first window)
    table = tables.drop_duplicates("rank", keep="first").sort_values("rank").reset_index(
        drop=True)
    first = dataclasses.replace(first, table=table.assign(
        instances=table["rank"].map(per_rank).fillna(0).astype(int)))
    spread = [float(np.nan_to_num((m.table.set_index("rank")["offset_us"]
                                   - first.table.set_index("rank")["offset_us"]).abs().max()))
              for m in models.values() if m.applied and first.applied]
    most = max(spread) if spread else None
    notes.append(f"the ranks' {len(models)} profiling windows are profiler sessions of their "
                 f"own: their clocks were fitted window by window (the offsets shown are "
                 f"{'the first' if main == min(models) else 'the best-linked'} window's"
                 + (")" if most is None else
                                      f"; the others' differ from them by up to {most:.1f} µs)"
                                      if most >= 0.05 else "; the others' are the same)"))
    return dataclasses.replace(first, windows=models), notes


def instance_times(ev: pd.DataFrame, inst: pd.DataFrame, hosts: dict[int, str]
                    ) -> pd.DataFrame:
    """Arrival, transfer time and bandwidth of each instance of more than one rank.

    ``ev``: the events on corrected clocks (:func:`align_clocks`); ``inst``: the instances
    (:func:`.matching.count_instances`), indexed by ``instance``.

    ``last_rank`` is the rank the others waited for: the last to arrive at a release-together
    op or a point-to-point pair; the root of a broadcast or scatter (members wait for the root
    only; their ends follow the chain by design) and the last member of a reduce or gather
    (the root waits for it). A rooted op's root is the one its record names, else the member
    that finished first.

    Returns:
        the instances of more than one rank with ``instance`` a column again, in order of
        ``first_arrival_us``, with ``first_arrival_us``, ``arrival_skew_us``, ``transfer_us``
        (µs), ``last_rank``, ``root``, ``algbw_gbps``, ``busbw_gbps`` (GB/s; NaN when partial or
        without bytes) and ``inter_node`` added (:attr:`.sync.SyncResult.instances`, plus
        ``group_size``).
    """
    inst = inst.copy()
    g = ev.groupby("instance", sort=False)
    inst["first_arrival_us"] = g["start_us"].min()
    inst["arrival_skew_us"] = g["start_us"].max() - g["start_us"].min()
    inst["transfer_us"] = g["dur_us"].min()
    # a point-to-point transfer runs from the moment both sides are there to the receive's end
    # (where the data is in place): an async isend's span lasts until its wait, which can come
    # long after (the same as the shorter side's duration when the two end together)
    recv_end = ev["end_us"].where(ev["op"].eq("recv")).groupby(ev["instance"]).max()
    p2p = is_p2p(inst.index.to_series()) & recv_end.reindex(inst.index).notna()
    xfer = (recv_end.reindex(inst.index) - g["start_us"].max()).clip(lower=0.0)
    inst.loc[p2p, "transfer_us"] = np.minimum(xfer[p2p], inst.loc[p2p, "transfer_us"])
    last_idx = g["start_us"].idxmax()
    inst["last_rank"] = ev.loc[last_idx.reindex(inst.index).values, "rank"].to_numpy()
    rooted = inst["semantics"].eq(ROOTED)
    if rooted.any():
        first_end = ev.loc[g["end_us"].idxmin().reindex(inst.index).values, "rank"].to_numpy()
        members = g["rank"].agg(lambda rs: {int(r) for r in rs}).reindex(inst.index)
        root = [int(r) if pd.notna(r) and int(r) in m else int(fe)
                for r, m, fe in zip(inst["root"], members, first_end)]
        # (numpy's stubs take no None there: an object array, None where not rooted)
        inst["root"] = np.where(rooted, root, None)  # type: ignore[call-overload]
        from_root = rooted & inst["op"].isin(FROM_ROOT)
        inst.loc[from_root, "last_rank"] = inst.loc[from_root, "root"].astype("int64")
    else:
        inst["root"] = None
    inst = inst[inst["ranks"] > 1].copy()
    n = inst["group_size"].where(inst["group_size"].notna(), inst["ranks"]).astype(float)
    seconds = inst["transfer_us"] / 1e6
    inst["algbw_gbps"] = pd.to_numeric(inst["bytes"], errors="coerce") / seconds / 1e9
    inst.loc[(seconds <= 0) | ~inst["complete"], "algbw_gbps"] = np.nan
    inst["busbw_gbps"] = inst["algbw_gbps"] * [busbw_factor(o, int(k)) for o, k in
                                               zip(inst["op"], n)]
    inst = inst.sort_values("first_arrival_us").reset_index(names="instance")
    if hosts:
        hsets = ev.groupby("instance")["rank"].apply(lambda rs: {hosts.get(int(r)) for r in rs})
        inst["inter_node"] = inst["instance"].map(
            lambda k: None if None in hsets.get(k, {None}) else len(hsets[k]) > 1)
    else:
        inst["inter_node"] = None
    return inst
