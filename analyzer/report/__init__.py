"""Stage 5, report: every analysis of a run, in one typed object and its JSON.

Enters: a TraceSet. Leaves: a :class:`~.registry.Report` (one field per registered analysis,
:data:`~.registry.ANALYSES`), its JSON summary as types (:func:`~.registry.report_document`: a
:class:`~.schema.ReportDocument`, the schema of ``pardiag report --json``) and as plain values
(:func:`~.registry.report_json`) and, from two such summaries, a :class:`~.compare.Comparison`.
"""

from .compare import Comparison, compare_summaries, comparison_json, gate
from .registry import (
           ANALYSES,
           REPORT_SCHEMA_VERSION,
           AnalysisOptions,
           Report,
           build_report,
           report_document,
           report_json,
)

__all__ = ["ANALYSES", "AnalysisOptions", "Comparison", "REPORT_SCHEMA_VERSION", "Report",
           "build_report", "compare_summaries", "comparison_json", "gate", "report_document",
           "report_json"]
