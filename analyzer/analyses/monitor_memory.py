"""Memory creep in a monitored run (one of :mod:`.monitored`'s findings).

A rank's resident (or device) memory, sampled at each written line, creeps when it grows by at
least :data:`CREEP_MIN_SHARE` of its first sample and at least :data:`CREEP_MIN_BYTES`, with at
least 3/4 of the increments non-negative, and grows over the run, not at once: its slope
(Theil-Sen's, bytes per 1,000 steps) over the samples' span accounts for at least
:data:`CREEP_SPREAD` of the growth. A single rise (a deep capture's profiler buffers, a cache
filled once) is no creep. A deep capture's steps are left out (:func:`memory_findings`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: A creep grows by at least this share of the first sample ...
CREEP_MIN_SHARE = 0.05
CREEP_MIN_BYTES = 64 * 2**20
#: ... and its slope over the samples' span accounts for at least this share of the growth.
CREEP_SPREAD = 0.5


def memory_findings(memory: pd.DataFrame, captures: list[tuple[int, int]] | None = None
                    ) -> list[dict]:
    """Memory creep per rank (see the module): ``[{"kind": "memory_creep", "rank", "memory",
    ("rss" or "device"), "first_bytes", "last_bytes", "bytes_per_1k_steps"}]``. The deep
    captures' steps (``captures``: (first, last) of each) are pardiag's own growth (the
    profiler's buffers): the samples from a capture's first step to the first after its last
    are left out, and the samples between captures are segments, each judged on its own
    growth, the slope taken over pairs of samples of one segment (``first_bytes``/
    ``last_bytes`` as sampled)."""
    out = []
    cols = [c for c in ("rss_bytes", "device_bytes") if memory[c].notna().any()]
    for (r, m), col in ((k, c) for k in memory.groupby("rank") for c in cols):
        s = m[["step", col]].dropna()
        if len(s) < 4:
            continue
        first_bytes, last_bytes = int(s[col].iloc[0]), int(s[col].iloc[-1])
        st = s["step"].to_numpy(dtype=float)
        seg = np.zeros(len(s), dtype=int)
        keep = np.ones(len(s), dtype=bool)
        for a, b in captures or []:
            after = st > b
            keep &= (st < a) | after
            keep[np.flatnonzero(after)[:1]] = False   # it still holds the capture's rise
            seg += after
        if not keep.all():
            seg, s, st = seg[keep], s[keep], st[keep]
            if len(s) < 4:
                continue
        y = s[col].to_numpy(dtype=float)
        ends = [np.flatnonzero(seg == k) for k in np.unique(seg)]
        ends = [e for e in ends if len(e) > 1]
        grow = sum(y[e[-1]] - y[e[0]] for e in ends)
        span = sum(st[e[-1]] - st[e[0]] for e in ends)
        same = seg[1:] == seg[:-1]
        if (not ends or grow < max(CREEP_MIN_SHARE * y[0], CREEP_MIN_BYTES)
                or (np.diff(y)[same] >= 0).mean() < 0.75):
            continue
        i, j = np.triu_indices(len(y), 1)
        ok = (st[j] != st[i]) & (seg[i] == seg[j])
        slope = float(np.median((y[j] - y[i])[ok] / (st[j] - st[i])[ok]))
        if slope * span < CREEP_SPREAD * grow:   # a rise at once, then flat
            continue
        out.append({"kind": "memory_creep", "rank": int(r),
                    "memory": col.removesuffix("_bytes"), "first_bytes": first_bytes,
                    "last_bytes": last_bytes, "bytes_per_1k_steps": round(slope * 1000)})
    return out
