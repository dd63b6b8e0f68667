"""Stage 1, trace: files in, a loaded run out.

Enters: Kineto trace files and folders (JSON, gzipped or not, from pardiag or from elsewhere)
and a pardiag run folder's sidecars (:mod:`pardiag.layout`). Leaves: a
:class:`~.traceset.TraceSet` — one :class:`~.traceset.RankTrace` per rank (its event table,
metadata and thread names, or the per-rank summary it was loaded from) — with the run's records
and every warning that loading had.

Modules: :mod:`.traceset` (the data model), :mod:`.parse` (bytes → event table), :mod:`.ranks`
(which rank a file holds, a pure function), :mod:`.load` (files → TraceSet: orchestration
only), :mod:`.classify` (the event vocabulary: communication or computation, steps, collective
and schedule names, devices), :mod:`.intervals` (interval algebra in µs), :mod:`.comm_records`
(pardiag's collective records placed on the trace's timeline).
"""

from .classify import compile_comm_patterns
from .columns import stray_timestamps
from .decode import parse_trace_fast
from .load import load_traces
from .parse import events_frame, read_trace_bytes, read_trace_json
from .traceset import EVENT_COLUMNS, GPU_CATS, RankTrace, TraceSet

__all__ = ["EVENT_COLUMNS", "GPU_CATS", "RankTrace", "TraceSet", "compile_comm_patterns",
           "events_frame", "load_traces", "parse_trace_fast", "read_trace_bytes",
           "read_trace_json", "stray_timestamps"]
