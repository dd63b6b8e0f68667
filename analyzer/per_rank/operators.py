"""Time per operator name on one rank (:func:`operators_of_events`): GPU kernels and CPU
operators, with the rank's profiler steps. :mod:`pardiag.analyzer.analyses.operators` sums them
over the ranks."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..trace.classify import STEP_RE
from ..trace.traceset import GPU_CATS, isin_mask

#: Columns of one rank's operator table (:func:`rank_operators`).
RANK_OPERATOR_COLUMNS = ("kind", "name", "count", "time_us")


def empty_operators() -> pd.DataFrame:
    return pd.DataFrame({"kind": pd.Series(dtype=object), "name": pd.Series(dtype=object),
                         "count": pd.Series(dtype=np.int64),
                         "time_us": pd.Series(dtype=float)})


def operators_of_events(events: pd.DataFrame,
                        name_codes: tuple[np.ndarray, np.ndarray] | None = None
                        ) -> tuple[pd.DataFrame, int]:
    """(operator table, number of profiler steps) of one rank's event table
    (:data:`pardiag.analyzer.trace.traceset.EVENT_COLUMNS`); ``name_codes`` is
    ``pd.factorize(events["name"], use_na_sentinel=False)`` where the caller has it
    (:func:`pardiag.analyzer.trace.classify.name_codes`).

    Returns:
        a DataFrame with :data:`RANK_OPERATOR_COLUMNS` (``time_us`` in µs), one row per kind
        and name, most time first; and the number of distinct ``ProfilerStep#N`` steps (0 when
        there is none).
    """
    if events is None or events.empty:
        return empty_operators(), 0
    cat = events["cat"]
    # each distinct name once: its text, whether it is a step, the step's number
    codes, uniques = (name_codes if name_codes is not None
                      else pd.factorize(events["name"], use_na_sentinel=False))
    text = [str(u) for u in uniques]
    step_no = [m.group(1) if (m := STEP_RE.match(t)) else None for t in text]
    is_step = (isin_mask(cat, ["user_annotation", "cpu_op"])
               & np.array([x is not None for x in step_no], dtype=bool)[codes])
    n_steps = len({step_no[c] for c in np.unique(codes[is_step])})
    gpu = isin_mask(cat, GPU_CATS)
    cpu = (cat == "cpu_op").to_numpy() & ~is_step
    if is_step.any() and cpu.any():
        s_ts = events["ts"].to_numpy(float)[is_step]
        win = np.sort(np.stack([s_ts, s_ts + events["dur"].to_numpy(float)[is_step]], axis=1),
                      axis=0)
        # merge overlapping windows, then keep the ops that start inside one
        lo: list[float] = []
        hi: list[float] = []
        for a, b in win:
            if lo and a <= hi[-1]:
                hi[-1] = max(hi[-1], b)
            else:
                lo.append(a)
                hi.append(b)
        ts = events["ts"].to_numpy(float)[cpu]
        i = np.searchsorted(np.asarray(lo), ts, side="right") - 1
        cpu[cpu] = (i >= 0) & (ts < np.asarray(hi)[np.clip(i, 0, None)])
    # names whose text is equal are one operator
    name_id, names = pd.factorize(pd.Series(text, dtype=object), use_na_sentinel=False)
    dur = events["dur"].to_numpy(float)
    parts = []
    for kind, sel in (("gpu", gpu), ("cpu", cpu)):
        if sel.any():
            ids = name_id[codes[sel]]
            count = np.bincount(ids, minlength=len(names))
            total = np.bincount(ids, weights=dur[sel], minlength=len(names))
            has = np.flatnonzero(count)
            parts.append(pd.DataFrame({"kind": kind,
                                       "name": pd.Series(names[has], dtype=str),
                                       "count": count[has].astype(np.int64),
                                       "time_us": total[has].astype(float)}))
    if not parts:
        return empty_operators(), n_steps
    out = pd.concat(parts, ignore_index=True)
    return (out.sort_values(["time_us", "kind", "name"], ascending=[False, True, True],
                            kind="stable").reset_index(drop=True), n_steps)
