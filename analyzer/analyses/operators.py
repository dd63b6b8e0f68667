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
ranks' training steps summed (``rank_steps``: profiler steps, or optimizer steps where several
profiler steps make one): the mean time per rank and profiled step, which stays comparable
between runs of different world sizes and numbers of profiled steps.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..per_rank.operators import RANK_OPERATOR_COLUMNS, empty_operators
from ..per_rank.summary import summary_of
from ..trace.traceset import (
    TraceSet,
    stack_by_rank,
)

#: Columns of :attr:`OperatorsResult.totals`.
OPERATOR_COLUMNS = ("kind", "name", "ranks", "count", "time_us", "per_step_us")
#: Most rows of the run's table written to the JSON summary (the most time first); a name below
#: them took less time than every name listed.
MAX_JSON_OPERATORS = 2000


@dataclasses.dataclass(frozen=True)
class OperatorsResult:
    """Result of :func:`compute_operators`.

    Attributes:
        per_rank: one row per rank, kind and name: ``rank`` and :data:`RANK_OPERATOR_COLUMNS`.
        totals: one row per kind and name over all ranks, most time first:
            :data:`OPERATOR_COLUMNS`; ``ranks`` that ran it, ``count`` and ``time_us`` summed
            over ranks, ``per_step_us`` = ``time_us`` / ``rank_steps`` (mean per rank and
            profiled step, µs).
        rank_steps: the ranks' training steps summed (a rank without steps counts 1).
    """

    per_rank: pd.DataFrame
    totals: pd.DataFrame
    rank_steps: int


def compute_operators(traces: TraceSet) -> OperatorsResult:
    """Time per operator name on every rank and over the run (see the module docstring)."""
    rows, steps = [], 0
    for rank, trace in traces.ranks.items():
        s = summary_of(trace)
        ops, n = s.stored("operators"), s.operator_steps
        steps += max(int(n), 1)
        rows.append((rank, ops))
    per_rank = stack_by_rank(rows)
    per_rank = (per_rank if per_rank is not None else empty_operators().assign(
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
