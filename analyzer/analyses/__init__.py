"""Stage 3, analyses: a loaded run in, one typed result per analysis out.

Enters: a :class:`~pardiag.analyzer.trace.traceset.TraceSet` whose ranks' quantities are read
through :func:`pardiag.analyzer.per_rank.summary.summary_of` (never from their raw events),
and, for analyses that build on others, the earlier results the registry hands them
(:mod:`pardiag.analyzer.report.registry`).
Leaves: frozen dataclasses of pandas tables with documented columns and units (µs, bytes,
GB/s, %), one module per analysis:

* the ranks' summaries stacked: :mod:`.breakdown` (overlap, exposed communication, idle),
  :mod:`.causes` (why a rank is slow or idle), :mod:`.operators` (time per operator name),
  :mod:`.comm_events` (every rank's collectives and point-to-point ops);
* across ranks: :mod:`.sync` (the synchronization analysis: :mod:`.matching` of collectives
  across ranks, :mod:`.clocks` offsets and drift, :mod:`.stragglers` waits and stragglers,
  bandwidth),
  :mod:`.pipeline` (bubbles), :mod:`.imbalance`, :mod:`.memory`, :mod:`.layout` and
  :mod:`.infer_layout` (the parallel layout, recorded or inferred), :mod:`.dim_overlap`
  (overlap per parallel dimension), :mod:`.routing` (MoE routing), :mod:`.runsetup` (what was
  run on what), :mod:`.hang` (a hung job's dumps), :mod:`.hta_extras` (Holistic Trace
  Analysis' GPU analyses, opt-in).
"""

from .breakdown import TimeBreakdown
from .causes import CausesResult
from .dim_overlap import DimOverlapResult
from .hta_extras import HtaExtras
from .imbalance import BalanceResult
from .infer_layout import InferredLayout
from .layout import LayoutResult
from .memory import MemoryResult
from .operators import OperatorsResult
from .pipeline import PipelineResult
from .routing import RoutingResult
from .runsetup import RunSetup
from .sync import SyncResult

__all__ = ["BalanceResult", "CausesResult", "DimOverlapResult", "HtaExtras", "InferredLayout",
           "LayoutResult", "MemoryResult", "OperatorsResult", "PipelineResult", "RoutingResult",
           "RunSetup", "SyncResult", "TimeBreakdown"]
