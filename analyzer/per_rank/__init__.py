"""Stage 2, per_rank: one rank's events in, its :class:`RankSummary` out.

Enters: a :class:`~pardiag.analyzer.trace.traceset.RankTrace` (the loader hands each parsed file
to :data:`REDUCER`). Leaves: the rank's :class:`RankSummary` (every per-rank quantity the
cross-rank analyses read, typed), stored beside the trace so that a later report reads it
instead of the events. The analyses read a rank's quantities through :func:`summary_of` only.

Modules: :mod:`.summary` (the record, its quantities, the accessor), :mod:`.store` (its JSON
form, where it lives, the reducer), and the per-rank halves of the analyses: :mod:`.breakdown`,
:mod:`.comm_events`, :mod:`.causes`, :mod:`.layout_marks`, :mod:`.memory`, :mod:`.operators`,
with what they share: :mod:`.issued_ops` and :mod:`.op_semantics`.
"""

from .store import REDUCER, summarize_file, summarize_paths
from .summary import RankSummary, summarize_trace, summary_of

__all__ = ["REDUCER", "RankSummary", "summarize_file", "summarize_paths", "summarize_trace",
           "summary_of"]
