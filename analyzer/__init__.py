"""pardiag's analyzer: trace files in, a report out, in six stages (each a folder or module here;
a module imports only from its own stage or an earlier one, ``tests/test_architecture.py``):

1. :mod:`.trace` — files → a :class:`~.trace.traceset.TraceSet` (parsing, rank assignment,
   loading, the event vocabulary, interval algebra);
2. :mod:`.per_rank` — one rank's events → its typed
   :class:`~.per_rank.summary.RankSummary`: every per-rank quantity the analyses read,
   computed where the trace is and stored beside it;
3. :mod:`.analyses` — a TraceSet and its ranks' summaries → one typed result per analysis (time
   breakdown, cross-rank matching and clocks, pipeline bubbles, imbalance, memory, layout, ...);
4. :mod:`.predict` — the analyses' results → what-if predictions and ranked recommendations;
5. :mod:`.report` — the registry of analyses, the :class:`~.report.registry.Report` and its
   JSON, the comparison of two runs;
6. :mod:`.render` — a Report or a comparison → an HTML page, a terminal summary, a merged
   Chrome trace.

Nothing here imports torch: a report can be built on a machine without a GPU stack. The package
imports none of its stages itself, so a training rank that needs one of them loads only that.
"""
