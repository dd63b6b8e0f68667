"""One rank's summary: every per-rank quantity the cross-rank analyses read, as one typed record
(:class:`RankSummary`), and the one accessor they read it through (:func:`summary_of`).

A :class:`RankSummary` is computed where the trace is (the end of ``pardiag profile`` on each
rank, ``pardiag summarize`` elsewhere, or a worker process of ``pardiag report``) and stored
beside the trace (:mod:`pardiag.analyzer.per_rank.store`), so that a later report reads it
instead of the events. Everything a report computes from summaries equals what it computes from
the raw events: the summary *is* the intermediate result (``tests/test_summary.py`` checks it).

A per-rank quantity is one field of :class:`RankSummary` declared with :func:`quantity` and one
function of a :class:`~pardiag.analyzer.per_rank.source.RankSource` (the rank's trace and the
``--comm-kernel`` patterns, with the classification, steps and parts computed once);
:func:`summarize_trace` calls every such function, the store writes and reads the field by its
type, and the store's fingerprint covers every module of ``trace/`` and ``per_rank/``, so
nothing else needs an edit (``docs/architecture.md`` shows one, and a test runs it).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
import pandas as pd

from ..trace import vocab
from ..trace.classify import cached, pattern_key
from ..trace.comm_records import all_to_all_ops, ranks_in_records
from ..trace.ranks import states_rank
from ..trace.traceset import (
    Deferred,
    HoldsTables,
    RankTrace,
    StoredTable,
    has_step_names,
    time_range,
)
from .breakdown import RankParts, breakdown_rows_of, device_timelines
from .causes import LaunchEdges, causes_of_trace, data_loading_of_trace, launch_edges_of_trace
from .comm_events import events_from_trace
from .flops import flop_ops
from .layout_marks import RankMarks, rank_marks_of_trace
from .memory import memory_rows
from .source import RankSource


class BreakdownRows(NamedTuple):
    """The time breakdown's rows of one rank, without ``rank``
    (:func:`pardiag.analyzer.per_rank.breakdown.breakdown_rows_of`).

    Attributes:
        total: the whole-trace row (``domain``, ``start_us``, ``end_us`` and the breakdown's
            columns, µs and %).
        steps: one row per profiler step (``step``, ``start_us``, ``end_us``, the columns).
        collectives: one row per collective type (``collective``, ``count``, ``time_us``,
            ``exposed_us``).
    """

    total: dict[str, Any]
    steps: list[dict[str, Any]]
    collectives: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"total": self.total, "steps": self.steps, "collectives": self.collectives}

    @staticmethod
    def from_json(d: dict[str, Any]) -> BreakdownRows:
        """Rows read back from JSON: null (NaN when written) becomes NaN again."""
        def nan_row(row: dict[str, Any]) -> dict[str, Any]:
            return {k: (float("nan") if v is None else v) for k, v in row.items()}
        return BreakdownRows(nan_row(d["total"]), [nan_row(r) for r in d["steps"]],
                             [nan_row(r) for r in d["collectives"]])


def _training_steps_of(profiler_steps: int, steps: pd.DataFrame) -> int:
    """The training steps ``profiler_steps`` profiler steps hold: as many, unless ``steps``
    (:func:`pardiag.analyzer.trace.classify.profiler_steps`) join several into one step per
    optimizer step; then in the ratio of its steps to the profiler steps they join (rounded,
    at least 1)."""
    joined = int(steps["profiler_steps"].sum()) if "profiler_steps" in steps else 0
    if not len(steps) or joined <= len(steps):
        return profiler_steps
    return max(1, round(profiler_steps * len(steps) / joined))


def _records_ranks(trace: RankTrace) -> np.ndarray:
    """:func:`pardiag.analyzer.trace.comm_records.ranks_in_records` of a trace whose file states
    no rank (``distributedInfo``, its name), shape (n,); empty for one that does (the loader
    reads it only then)."""
    if states_rank(trace.metadata, Path(trace.path)):
        return np.zeros(0, dtype=np.int64)
    return np.array(ranks_in_records(trace.events), dtype=np.int64)


def quantity(compute: Callable[[RankSource], Any], *, patterns: bool = False) -> Any:
    """Declare a field of :class:`RankSummary` as a per-rank quantity: ``compute(source)`` gives
    its value (:func:`summarize_trace` calls it). ``patterns``: the value depends on the
    ``--comm-kernel`` patterns (a summary made with other patterns does not serve it)."""
    return dataclasses.field(metadata={"compute": compute, "patterns": patterns})


_C = TypeVar("_C", bound=type)


def _stored_tables(cls: _C) -> _C:
    """Hold every DataFrame field and every quantity of a frozen dataclass as a
    :class:`StoredTable` (a summary read from JSON keeps a table as its columns until it is
    first read; one computed from the events computes a quantity when it is first read)."""
    for f in dataclasses.fields(cls):
        if f.type in ("pd.DataFrame", pd.DataFrame) or "compute" in f.metadata:
            d = StoredTable()
            d.__set_name__(cls, f.name)
            setattr(cls, f.name, d)
    return cls


@_stored_tables
@dataclasses.dataclass(frozen=True)
class RankSummary(HoldsTables):
    """What the cross-rank analyses need from one rank's trace (µs on the rank's own clock).

    The file's record:
        path: the trace file summarized (as given when summarizing).
        size: its size in bytes; ``mtime_ns``: its modification time (ns); both 0 where the
            trace has no file.
        comm_patterns: the ``--comm-kernel`` regular expressions (source strings) used.
        dist_rank: ``distributedInfo.rank`` as found in the file (any JSON value, or None).
        metadata: the file's top-level keys other than ``traceEvents``.
        thread_names: ``{(pid, tid): name}``.
        warnings, notes: the loader's lines for this file (they start with the file path).
        repairs: what reading the file had to repair (not strict JSON), one phrase each.
        n_events: rows of the rank's event table.
        has_steps: an event is named ``ProfilerStep...``.
        has_gpu: the trace holds GPU kernels.

    The quantities (:func:`quantity`; † depends on the ``--comm-kernel`` patterns):
        parts†: the time breakdown's parts (:class:`pardiag.analyzer.per_rank.breakdown.RankParts`).
        breakdown†: the time breakdown's rows (:class:`BreakdownRows`).
        comm†: the communication events
            (:data:`pardiag.analyzer.per_rank.comm_events.EVENT_COLUMNS`; ``rank`` -1: filled in
            when ranks are known).
        steps†: training steps: ``step``, ``start_us``, ``end_us``, ``profiler_steps``
            (:func:`pardiag.analyzer.trace.classify.profiler_steps`).
        devices†: each device's own timeline
            (:func:`pardiag.analyzer.per_rank.breakdown.device_timelines`).
        memory: ``[memory]`` events: ``ts_us``, ``device``, ``allocated_bytes``,
            ``reserved_bytes`` (NaN where not a number).
        marks: what the trace says about the parallel layout
            (:class:`pardiag.analyzer.per_rank.layout_marks.RankMarks`).
        operators: time per operator name (``kind``, ``name``, ``count``, ``time_us``).
        operator_steps: the training steps ``operators`` is divided by per step: its profiler
            steps, or as many optimizer steps as they hold where several profiler steps make
            one training step (gradient accumulation; :func:`_training_steps_of`).
        a2a: the all-to-alls the rank issued with their split sizes
            (:func:`pardiag.analyzer.trace.comm_records.all_to_all_ops`).
        causes: host and device parts per profiler step
            (:data:`pardiag.analyzer.per_rank.causes.CAUSE_COLUMNS`).
        data_loading: the DataLoader iterator's host intervals, shape (n, 2).
        launch_edges†: what held the rank's computation after each communication kernel
            (:class:`pardiag.analyzer.per_rank.causes.LaunchEdges`).
        events_range: (first start, last end) of all the file's events, shape (2,), µs (NaN
            without events): its profiling window's extent when windows are joined.
        flop_ops: the operators whose FLOPs are counted (:func:`pardiag.analyzer.per_rank.flops.
            flop_ops`).
        records_ranks: the global ranks the communication records name as the caller's own,
            shape (n,) (:func:`pardiag.analyzer.trace.comm_records.ranks_in_records`): the
            rank of a file that states none elsewhere (empty for one that does).
    """

    path: str
    size: int
    mtime_ns: int
    comm_patterns: tuple[str, ...]
    dist_rank: Any
    metadata: dict[str, Any]
    thread_names: dict[tuple[Any, Any], str]
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    repairs: tuple[str, ...]
    n_events: int
    has_steps: bool
    has_gpu: bool
    parts: RankParts = quantity(lambda src: src.parts, patterns=True)
    breakdown: BreakdownRows = quantity(lambda src: BreakdownRows(*breakdown_rows_of(src.parts)),
                                        patterns=True)
    comm: pd.DataFrame = quantity(lambda src: events_from_trace(src.trace, src.kinds, src.steps),
                                  patterns=True)
    steps: pd.DataFrame = quantity(lambda src: src.steps, patterns=True)
    devices: pd.DataFrame = quantity(lambda src: device_timelines(src.trace, src.kinds),
                                     patterns=True)
    memory: pd.DataFrame = quantity(lambda src: memory_rows(src.trace))
    marks: RankMarks = quantity(lambda src: rank_marks_of_trace(src.trace))
    operators: pd.DataFrame = quantity(lambda src: src.operators[0])
    operator_steps: int = quantity(lambda src: _training_steps_of(src.operators[1], src.steps))
    a2a: pd.DataFrame = quantity(lambda src: all_to_all_ops(src.trace.events))
    causes: pd.DataFrame = quantity(lambda src: causes_of_trace(src.trace))
    data_loading: np.ndarray = quantity(lambda src: data_loading_of_trace(src.trace))
    launch_edges: LaunchEdges = quantity(
        lambda src: launch_edges_of_trace(src.trace, src.patterns), patterns=True)
    events_range: np.ndarray = quantity(lambda src: np.array(time_range(src.trace.events)))
    flop_ops: pd.DataFrame = quantity(lambda src: flop_ops(src.trace, src.steps))
    records_ranks: np.ndarray = quantity(lambda src: _records_ranks(src.trace))

    def matches(self, comm_patterns: Iterable[re.Pattern[str] | str]) -> bool:
        """True when this summary was computed with the same ``--comm-kernel`` patterns."""
        return self.comm_patterns == pattern_key(comm_patterns)

    @property
    def extent(self) -> tuple[float, float]:
        """(first start, last end) of the file's events (µs; NaN without any): the extent of
        its profiling window, as the loader takes it from the events
        (:func:`pardiag.analyzer.trace.traceset.time_range`)."""
        return float(self.events_range[0]), float(self.events_range[1])

    def relocated(self, path: os.PathLike[str] | str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(warnings, notes) with the summarized path replaced by ``path``."""
        old, new = str(self.path), str(path)

        def fix(s: str) -> str:
            return new + s[len(old):] if old != new and s.startswith(old) else s
        return tuple(fix(w) for w in self.warnings), tuple(fix(n) for n in self.notes)


#: The quantity fields of :class:`RankSummary`, in order: ``(name, compute, patterns)``.
QUANTITIES: tuple[tuple[str, Callable[[RankSource], Any], bool], ...] = tuple(
    (f.name, f.metadata["compute"], f.metadata["patterns"])
    for f in dataclasses.fields(RankSummary) if "compute" in f.metadata)


def summarize_trace(trace: RankTrace, comm_patterns: Iterable[re.Pattern[str] | str] = (), *,
                    warnings: Iterable[str] = (), repairs: Iterable[str] = (),
                    has_steps: bool | None = None, stat: os.stat_result | None = None,
                    defer: bool = False) -> RankSummary:
    """Compute the summary of one rank's trace: its file's record and every quantity.

    Args:
        trace: the rank (its ``rank`` may be provisional: only the ``comm`` table carries it).
        comm_patterns: compiled ``--comm-kernel`` patterns.
        warnings: the loader's warnings for this file (kept with the summary).
        repairs: what reading the file repaired.
        has_steps: whether an event is named ``ProfilerStep...`` (default: looked up).
        stat: ``os.stat`` of the trace file (default: taken now; size and time 0 where the
            trace has no file).
        defer: compute each quantity when it is first read (:class:`Deferred`), not now.
    """
    patterns = [p if isinstance(p, re.Pattern) else re.compile(p) for p in comm_patterns]
    if stat is None:
        try:
            stat = os.stat(trace.path)
        except (OSError, TypeError, ValueError):
            stat = None
    src = RankSource(trace, patterns)
    info = vocab.DISTRIBUTED_INFO.get(trace.metadata)
    # a Deferred value stands for the field's type until the field is read (StoredTable)
    values: dict[str, Any] = {
        name: Deferred(functools.partial(compute, src)) if defer else compute(src)
        for name, compute, _ in QUANTITIES}
    return RankSummary(
        path=str(trace.path), size=int(stat.st_size) if stat else 0,
        mtime_ns=int(stat.st_mtime_ns) if stat else 0, comm_patterns=pattern_key(patterns),
        dist_rank=vocab.DIST_RANK.get(info),
        metadata=trace.metadata, thread_names=dict(trace.thread_names),
        warnings=tuple(warnings), notes=tuple(trace.notes), repairs=tuple(repairs),
        n_events=len(trace.events),
        has_steps=has_step_names(trace.events) if has_steps is None else has_steps,
        has_gpu=trace.has_gpu, **values)


def summary_of(trace: RankTrace, comm_patterns: Iterable[re.Pattern[str] | str] | None = None
               ) -> RankSummary:
    """The rank's :class:`RankSummary`: the one it was loaded with, else computed from its
    events (once per trace and pattern list; each quantity when it is first read).

    Args:
        trace: the rank.
        comm_patterns: the ``--comm-kernel`` patterns of the quantities read (those marked †
            in :class:`RankSummary`): a summary made with other patterns is not used for them.
            None: only quantities that do not depend on the patterns are read, and any summary
            of the rank serves.
    """
    # the trace stage holds it as what it reads of a summary; the per-rank stage made it
    s = cast(RankSummary | None, trace.summary)
    if s is not None and (comm_patterns is None or s.matches(comm_patterns)):
        return s
    patterns = list(comm_patterns or ())
    return cached(trace, ("summary", pattern_key(patterns)),
                  lambda: summarize_trace(trace, patterns, defer=True))
