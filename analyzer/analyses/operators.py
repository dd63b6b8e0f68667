"""Time per operator name: the GPU kernels and CPU operators of each rank, totalled by name.

What ``pardiag compare`` ranks as "operators that moved" (Holistic Trace Analysis' TraceDiff
compares two traces' operators by name the same way; here it is done on pardiag's per-rank
summaries, so it needs no second pass over raw traces).

Per rank and operator name:

* **kind** ``gpu``: events on a GPU stream (``kernel``, ``gpu_memcpy``, ``gpu_memset``), every one
  in the trace;
* **kind** ``cpu``: CPU operators (``cpu_op``) that start inside a ``ProfilerStep#N`` window
  (every one when the trace has no steps);
* ``count`` events and ``time_us`` = the sum of their durations (µs). CPU operators nest
  (``aten::linear`` holds ``aten::addmm``): each name's time is inclusive, and names are not
  added up across levels.

The run's table (:attr:`OperatorsResult.totals`) divides each name's time over all ranks by the
ranks' profiler steps summed (``rank_steps``): the mean time per rank and profiled step, which
stays comparable between runs of different world sizes and numbers of profiled steps.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..trace.classify import STEP_RE
from ..trace.traceset import (
    GPU_CATS,
    RankTrace,
    TraceSet,
    isin_mask,
    stack_by_rank,
    summary_table,
)

#: Columns of one rank's operator table (:func:`rank_operators`).
RANK_OPERATOR_COLUMNS = ("kind", "name", "count", "time_us")
#: Columns of :attr:`OperatorsResult.totals`.
OPERATOR_COLUMNS = ("kind", "name", "ranks", "count", "time_us", "per_step_us")
#: Most rows of the run's table written to the JSON summary (the most time first); a name below
#: them took less time than every name listed.
MAX_JSON_OPERATORS = 2000


def _empty() -> pd.DataFrame:
    return pd.DataFrame({"kind": pd.Series(dtype=object), "name": pd.Series(dtype=object),
                         "count": pd.Series(dtype=np.int64),
                         "time_us": pd.Series(dtype=float)})


def operators_of_events(events: pd.DataFrame, name_codes: tuple | None = None
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
        return _empty(), 0
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
        lo, hi = [], []
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
        return _empty(), n_steps
    out = pd.concat(parts, ignore_index=True)
    return (out.sort_values(["time_us", "kind", "name"], ascending=[False, True, True],
                            kind="stable").reset_index(drop=True), n_steps)


def rank_operators(trace: RankTrace) -> tuple[pd.DataFrame, int]:
    """(operator table, profiler steps) of one rank: from its summary when it has one (the
    summary holds them), else from its events (:func:`operators_of_events`)."""
    s = trace.summary
    if s is not None and getattr(s, "operators", None) is not None:
        return s.operators, int(s.operator_steps)
    return operators_of_events(trace.events)


@dataclasses.dataclass(frozen=True)
class OperatorsResult:
    """Result of :func:`compute_operators`.

    Attributes:
        per_rank: one row per rank, kind and name: ``rank`` and :data:`RANK_OPERATOR_COLUMNS`.
        totals: one row per kind and name over all ranks, most time first:
            :data:`OPERATOR_COLUMNS`; ``ranks`` that ran it, ``count`` and ``time_us`` summed
            over ranks, ``per_step_us`` = ``time_us`` / ``rank_steps`` (mean per rank and
            profiled step, µs).
        rank_steps: the ranks' profiler steps summed (a rank without steps counts 1).
    """

    per_rank: pd.DataFrame
    totals: pd.DataFrame
    rank_steps: int


def compute_operators(traces: TraceSet) -> OperatorsResult:
    """Time per operator name on every rank and over the run (see the module docstring)."""
    rows, steps = [], 0
    for rank, trace in traces.ranks.items():
        ops = summary_table(trace, "operators")
        ops, n = ((ops, int(trace.summary.operator_steps)) if ops is not None
                  else rank_operators(trace))
        steps += max(int(n), 1)
        rows.append((rank, ops))
    per_rank = stack_by_rank(rows)
    per_rank = (per_rank if per_rank is not None else _empty().assign(
        rank=pd.Series(dtype=np.int64)))[["rank", *RANK_OPERATOR_COLUMNS]]
    if per_rank.empty:
        totals = pd.DataFrame({c: pd.Series(dtype=object if c in ("kind", "name") else float)
                               for c in OPERATOR_COLUMNS})
    else:
        totals = (per_rank.groupby(["kind", "name"], as_index=False, sort=False)
                  .agg(ranks=("rank", "nunique"), count=("count", "sum"),
                       time_us=("time_us", "sum")))
        totals["per_step_us"] = totals["time_us"] / max(steps, 1)
        totals = totals.sort_values(["time_us", "kind", "name"], ascending=[False, True, True],
                                    kind="stable").reset_index(drop=True)
    return OperatorsResult(per_rank=per_rank, totals=totals[list(OPERATOR_COLUMNS)],
                           rank_steps=steps)
