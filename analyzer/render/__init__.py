"""Stage 6, render: a report or a comparison in, what a person reads out.

Enters: a :class:`~pardiag.analyzer.report.registry.Report`, a
:class:`~pardiag.analyzer.report.compare.Comparison`, or a TraceSet (to merge). Leaves: one
self-contained HTML page (:mod:`.html`, built with the page kit :mod:`.page` and the CSS and
script in ``static/``), a terminal summary (:mod:`.terminal`), the comparison's page and terminal
summary (:mod:`.comparison`), one Chrome trace of every rank (:mod:`.merge`). Figures are built
here and nowhere else.
"""

import importlib

#: Each name and its module, imported at first use: a report does not load the comparison's
#: figure code (plotly's figure objects), a comparison not the report's.
_EXPORTS = {"merge_traces": ".merge", "render_compare_html": ".comparison",
            "render_compare_terminal": ".comparison", "render_html": ".html",
            "render_terminal": ".terminal"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
