"""Arrival delays of a monitored run's collectives (``pardiag profile --monitor``), per rank and
step and per join: the inputs of the straggler findings (:mod:`.monitored`).

* **Matching**: the collectives a rank issued are matched across ranks by (process group, op,
  the rank's count of that op on that group so far): every member of a group issues its
  collectives in the same order. A member's arrival delay at an instance is its issue time less
  the earliest member's (µs; TensorBoard profiler plugin's arrival skew, per rank). Ranks of
  other hosts are first put on the reference host's clock: the offset is the median, over the
  release-together instances both completed, of the difference of their completion times
  (members of an all-reduce complete together; the cross-rank model's rule).
* **Joins** (:func:`join_delays`): a step's *k*-th call of one op on one group is one join of
  every step (a DDP step's buckets, an FSDP step's all-gathers and reduce-scatters). Without
  call records (``--monitor`` of a large job keeps only the steps' summaries) the joins are the
  step's median, first and last issue times (:data:`ARRIVALS`), each less the earliest rank's
  (one host's clock assumed).
* **A rank's delay in a step** (:func:`arrival_delays`) is the largest of its delays at the
  step's joins: the join where it held the others most. After a blocking join they are in step
  again, so a rank that slows before its forward is late at the step's first FSDP all-gather
  and at none after it (the median of its delays would hide it); a DDP rank's buckets are all
  late alike. Without call records, a rank late at a single join between the first and the last
  is not seen.
* **A late period's signal** (:func:`matched_signal`): which joins carry a straggler's delay,
  and how noisy each is, differ by run (a DDP rank's lateness adds up bucket by bucket, so its
  first bucket's is the least noisy; an FSDP rank's shows at its first all-gather alone): a
  period's edges are sought on the joins' lateness weighted by what each shows of the period
  and its noise, the matched filter.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ..trace import vocab
from .monitor_data import MonitorData

#: Ops whose members complete together (their completions align clocks).
RELEASE_TOGETHER = vocab.MONITOR_RELEASE_TOGETHER
#: Point-to-point ops: matched by peer, not by group order; left out of arrival delays.
P2P = vocab.MONITOR_P2P
#: The steps' arrival summaries (epoch µs; NaN: none, or records written before the first and
#: last were kept): the median, first and last issue time of the step's collectives.
ARRIVALS = ("arrive_us", "arrive_first_us", "arrive_last_us")
#: Up to this many ranks, each rank's lateness is against the median of the others exactly.
EXACT_LATENESS_RANKS = 32


def _instances(calls: pd.DataFrame) -> pd.DataFrame:
    """``calls`` of collectives with ``instance`` (group, op and the rank's ordinal of that op
    on that group) and ``members`` (ranks that issued it)."""
    c = calls[~calls["op"].isin(P2P)].sort_values(["rank", "issue_us"]).copy()
    c["ordinal"] = c.groupby(["rank", "group", "op"]).cumcount()
    c["instance"] = c["group"].astype(str) + "|" + c["op"] + "|" + c["ordinal"].astype(str)
    c["members"] = c.groupby("instance")["rank"].transform("size")
    return c[c["members"] > 1]


def host_offsets(c: pd.DataFrame, hosts: dict[int, str]) -> dict[int, float]:
    """``{rank: µs to subtract}`` putting each host's clock on the host of the lowest rank:
    per other host, the median over release-together instances completed on both of
    (completion on that host − completion on the reference host). Ranks of one host share a
    clock; with one host (or none known) every offset is 0."""
    ranks = sorted(c["rank"].unique()) if len(c) else []
    if len(set(hosts.values())) < 2 or not ranks:
        return {int(r): 0.0 for r in ranks}
    ref_host = hosts.get(int(ranks[0]))
    done = c[c["op"].isin(RELEASE_TOGETHER) & c["done_us"].notna()]
    ref = done[done["rank"].map(hosts) == ref_host].groupby("instance")["done_us"].median()
    out: dict[int, float] = {}
    for h in set(hosts.values()):
        mine = done[done["rank"].map(hosts) == h].groupby("instance")["done_us"].median()
        both = mine.index.intersection(ref.index)
        off = float(np.median(mine[both] - ref[both])) if h != ref_host and len(both) else 0.0
        for r, hr in hosts.items():
            if hr == h:
                out[r] = off
    return {int(r): out.get(int(r), 0.0) for r in ranks}


def arrival_delays(data: MonitorData) -> pd.DataFrame:
    """Each rank's arrival delay per step (µs): a ranks × steps table, the largest of its delays
    at the step's joins (:func:`join_delays`; NaN where the rank issued no collective it shares
    with another rank that step). See the module."""
    if data.delays is None:
        j = join_delays(data)
        data.delays = (j.groupby(level="rank").max() if len(j) else pd.DataFrame())
    return data.delays


def join_delays(data: MonitorData) -> pd.DataFrame:
    """Each rank's arrival delay at each join of each step (µs): rows (``join``, ``rank``),
    columns the steps (NaN where the rank had no such join that step). A join is
    ``group|op|k`` (the step's *k*-th call of that op on that group, from 0), or one of
    :data:`ARRIVALS` without call records. Computed once per ``data``."""
    if data.joins is None:
        data.joins = (_summary_joins(data.steps) if data.calls.empty
                      else _call_joins(data))
    return data.joins


def _call_joins(data: MonitorData) -> pd.DataFrame:
    c = _instances(data.calls)
    if c.empty:
        return pd.DataFrame()
    off = host_offsets(c, data.hosts)
    c["issue_us"] = c["issue_us"] - c["rank"].map(off).fillna(0.0)
    c["delay_us"] = c["issue_us"] - c.groupby("instance")["issue_us"].transform("min")
    k = c.groupby(["rank", "step", "group", "op"]).cumcount()
    c["join"] = c["group"].astype(str) + "|" + c["op"] + "|" + k.astype(str)
    return c.set_index(["join", "rank", "step"])["delay_us"].unstack("step").sort_index()


def _summary_joins(steps: pd.DataFrame) -> pd.DataFrame:
    """:func:`join_delays` from the steps' arrival summaries alone: per summary, each rank's
    less the earliest rank's (NaN where none)."""
    cols = [k for k in ARRIVALS if k in steps and steps[k].notna().any()]
    if not cols:
        return pd.DataFrame()
    # hashed, not sorted: 10⁷ rows of a large job
    r_idx, ranks = pd.factorize(steps["rank"].to_numpy(), sort=True)
    s_idx, idx = pd.factorize(steps["step"].to_numpy(), sort=True)
    parts = []
    for k in cols:
        a = np.full((len(ranks), len(idx)), np.nan)
        a[r_idx, s_idx] = steps[k].to_numpy(float)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # a step no rank arrived in
            parts.append(a - np.nanmin(a, axis=0))
    rows = pd.MultiIndex.from_product([cols, ranks], names=["join", "rank"])
    return pd.DataFrame(np.vstack(parts), index=rows, columns=pd.Index(idx, name="step"))


def _robust_sigma(x: np.ndarray) -> float:
    """A spread of ``x`` robust to outliers: the larger of 1.4826 × its median absolute
    deviation and its interquartile range / 1.349 (each σ for normal values). The MAD alone is
    0 for values that take one value more than half the time (two ranks taking turns, one late
    by about the same amount: the lateness less its running median is 0 in most steps)."""
    x = x[np.isfinite(x)]
    if not len(x):
        return 0.0
    q1, q3 = np.percentile(x, [25, 75])
    return float(max(1.4826 * np.median(np.abs(x - np.median(x))), (q3 - q1) / 1.349))


def lateness(delays: pd.DataFrame) -> pd.DataFrame:
    """Each rank's lateness per step (µs): its arrival delay less the median of the other
    ranks' that step (ranks × steps; about 0 for ranks that differ only by noise, +δ for a rank
    δ late whether or not it is late in every step). Beyond :data:`EXACT_LATENESS_RANKS`
    ranks, the median of every rank's (one rank moves it by at most one order statistic)."""
    vals = delays.to_numpy(dtype=float)
    if len(vals) > EXACT_LATENESS_RANKS:   # one rank moves the median of many by little
        with np.errstate(all="ignore"):
            ref = np.nanmedian(vals, axis=0)
        return pd.DataFrame(vals - ref, index=delays.index, columns=delays.columns)
    out = np.full_like(vals, np.nan)
    for i in range(len(vals)):
        others = np.delete(vals, i, axis=0)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # a step no other rank had
            ref = (np.nanmedian(others, axis=0) if np.isfinite(others).any()
                   else np.full(vals.shape[1], np.nan))
        out[i] = vals[i] - ref
    return pd.DataFrame(out, index=delays.index, columns=delays.columns)


def join_lateness(joins: pd.DataFrame, rank: int, steps: pd.Index) -> np.ndarray:
    """``rank``'s :func:`lateness` at each join (joins × ``steps``, µs; NaN where none), from
    :func:`join_delays`'s table."""
    out = []
    for _, t in joins.groupby(level="join", sort=True):
        t = t.droplevel("join")
        if rank in t.index and len(t) > 1:
            out.append(lateness(t).loc[rank].reindex(steps).to_numpy(dtype=float))
    return np.array(out).reshape(len(out), len(steps))


def matched_signal(chans: np.ndarray, inside: np.ndarray, outside: np.ndarray) -> np.ndarray:
    """One series from several that a late period shifts (channels × steps, any unit): each
    channel less its median over the steps ``outside`` (a boolean mask), weighted by its shift
    (its median over ``inside`` less that) over its spread outside squared — the matched filter
    for a shift pattern seen through independent noise (North 1943) — and scaled so that the
    period's shift is 1 (NaN channels of a step left out of that step's sum; NaN where no
    channel with a shift has a value). Channels that the period does not shift get no
    weight; with none, all NaN."""
    n = chans.shape[1]
    num, den = np.zeros(n), np.zeros(n)
    for ch in chans:
        if not np.isfinite(ch[outside]).any() or not np.isfinite(ch[inside]).any():
            continue
        base = float(np.nanmedian(ch[outside]))
        shift = float(np.nanmedian(ch[inside])) - base
        sigma = _robust_sigma(ch[outside] - base)
        if shift <= 0 or sigma <= 0:
            continue
        w = shift / sigma ** 2
        ok = np.isfinite(ch)
        num[ok] += w * (ch[ok] - base)
        den[ok] += w * shift
    with np.errstate(all="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
