"""Interval algebra on the time axis (µs), vectorised with numpy.

An *interval set* is a float64 array of shape (N, 2) holding ``[start, end)`` rows that are
sorted, disjoint and non-empty, as :func:`union` returns. The time breakdown (overlap, exposed
communication, idle) is built from these four operations.
"""

from __future__ import annotations

import numpy as np

EMPTY = np.empty((0, 2), dtype=np.float64)


def union(starts, ends) -> np.ndarray:
    """Merge possibly overlapping intervals ``[starts[i], ends[i])`` into an interval set.

    Zero-length intervals are dropped. Touching intervals are merged.

    Returns:
        (N, 2) float64 array, sorted and disjoint.
    """
    s = np.asarray(starts, dtype=np.float64).ravel()
    e = np.asarray(ends, dtype=np.float64).ravel()
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return EMPTY.copy()
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    # A new group starts where the interval begins after every earlier one has ended.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    group = np.cumsum(new) - 1
    out_s = s[new]
    out_e = np.zeros(out_s.size)
    np.maximum.at(out_e, group, e)
    return np.column_stack([out_s, out_e])


def total(iv: np.ndarray) -> float:
    """Total length (µs) of an interval set."""
    return float(np.sum(iv[:, 1] - iv[:, 0])) if len(iv) else 0.0


def _combine(a: np.ndarray, b: np.ndarray, keep) -> np.ndarray:
    """Sweep two interval sets; keep the pieces where ``keep(in_a, in_b)`` holds."""
    if len(a) == 0 and len(b) == 0:
        return EMPTY.copy()
    t = np.concatenate([a[:, 0], a[:, 1], b[:, 0], b[:, 1]])
    da = np.concatenate([np.ones(len(a)), -np.ones(len(a)), np.zeros(2 * len(b))])
    db = np.concatenate([np.zeros(2 * len(a)), np.ones(len(b)), -np.ones(len(b))])
    order = np.argsort(t, kind="stable")
    t, da, db = t[order], da[order], db[order]
    # Sum the changes at equal times so the state between distinct times is exact.
    uniq, first = np.unique(t, return_index=True)
    ca = np.add.reduceat(da, first)
    cb = np.add.reduceat(db, first)
    in_a = np.cumsum(ca) > 0
    in_b = np.cumsum(cb) > 0
    mask = keep(in_a[:-1], in_b[:-1])
    if not mask.any():
        return EMPTY.copy()
    return union(uniq[:-1][mask], uniq[1:][mask])


def intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Interval set of the times in both ``a`` and ``b``."""
    if len(a) == 0 or len(b) == 0:
        return EMPTY.copy()
    return _combine(a, b, lambda x, y: x & y)


def subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Interval set of the times in ``a`` and not in ``b``."""
    if len(a) == 0:
        return EMPTY.copy()
    if len(b) == 0:
        return a.copy()
    return _combine(a, b, lambda x, y: x & ~y)


def merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Interval set of the times in ``a`` or ``b``."""
    return union(np.concatenate([a[:, 0], b[:, 0]]), np.concatenate([a[:, 1], b[:, 1]]))


def clip(iv: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The part of an interval set inside ``[lo, hi)``."""
    if len(iv) == 0 or hi <= lo:
        return EMPTY.copy()
    s = np.maximum(iv[:, 0], lo)
    e = np.minimum(iv[:, 1], hi)
    keep = e > s
    return np.column_stack([s[keep], e[keep]])


def window_of(times: np.ndarray, windows) -> np.ndarray:
    """Index of the profiling window holding each of ``times`` (µs): the last of ``windows``
    (``((start, end), ...)`` in time order,
    :attr:`pardiag.analyzer.trace.traceset.RankTrace.windows`) starting at or before it; 0 with
    fewer than two windows. Shape ``(len(times),)``, int64."""
    if len(windows) < 2:
        return np.zeros(len(times), dtype=np.int64)
    starts = np.array([w[0] for w in windows], dtype=float)
    return np.maximum(np.searchsorted(starts, times, side="right") - 1, 0)
