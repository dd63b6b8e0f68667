"""pardiag's analyzer: trace files in, a report out, in six stages (each a folder or module here;
a module imports only from its own stage or an earlier one, ``tests/test_architecture.py``):

1. :mod:`.trace` — files → a :class:`~.trace.traceset.TraceSet` (parsing, rank assignment,
   loading, the event vocabulary, interval algebra);
2. :mod:`.analyses` — a TraceSet → one typed result per analysis (time breakdown, cross-rank
   matching and clocks, pipeline bubbles, imbalance, memory, layout, ...);
3. :mod:`.summary` — the per-rank reduction: what every analysis needs from one rank's events,
   computed where the trace is and stored beside it;
4. :mod:`.predict` — the analyses' results → what-if predictions and ranked recommendations;
5. :mod:`.report` — the registry of analyses, the :class:`~.report.registry.Report` and its
   JSON, the comparison of two runs;
6. :mod:`.render` — a Report or a comparison → an HTML page, a terminal summary, a merged
   Chrome trace.

Nothing here imports torch: a report can be built on a machine without a GPU stack. The package
imports none of its stages itself, so a training rank that needs one of them loads only that.
"""
