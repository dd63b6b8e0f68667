"""What a per-rank quantity is computed from (:class:`RankSource`): one rank's trace and the
``--comm-kernel`` patterns, with what several quantities share (the classification of the
events, the profiler steps, the breakdown's parts) computed once."""

from __future__ import annotations

import functools
import re

import pandas as pd

from ..trace.classify import classify, name_codes, profiler_steps
from ..trace.traceset import RankTrace
from .breakdown import RankParts, compute_rank_parts
from .operators import operators_of_events


class RankSource:
    """One rank's trace and the ``--comm-kernel`` patterns, as a quantity function reads them:
    the classification of its events, its ``ProfilerStep`` windows and its breakdown parts are
    computed once and shared.

    Attributes:
        trace: the rank (its ``rank`` may be provisional, -1).
        patterns: compiled ``--comm-kernel`` patterns (``[]`` for the built-in ones).
    """

    def __init__(self, trace: RankTrace, patterns: list[re.Pattern[str]]) -> None:
        self.trace = trace
        self.patterns = patterns

    @functools.cached_property
    def kinds(self) -> pd.Series:
        """Each event's kind (:func:`pardiag.analyzer.trace.classify.classify`)."""
        return classify(self.trace, self.patterns)

    @functools.cached_property
    def steps(self) -> pd.DataFrame:
        """``ProfilerStep`` windows: ``step``, ``start_us``, ``end_us`` (µs)."""
        return profiler_steps(self.trace, self.kinds)

    @functools.cached_property
    def parts(self) -> RankParts:
        """The breakdown's parts
        (:func:`pardiag.analyzer.per_rank.breakdown.compute_rank_parts`)."""
        return compute_rank_parts(self.trace, self.patterns, None)

    @functools.cached_property
    def operators(self) -> tuple[pd.DataFrame, int]:
        """(time per operator name, profiler steps)
        (:func:`pardiag.analyzer.per_rank.operators.operators_of_events`)."""
        return operators_of_events(self.trace.events, name_codes(self.trace))
