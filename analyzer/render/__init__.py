"""Stage 6, render: a report or a comparison in, what a person reads out.

Enters: a :class:`~pardiag.analyzer.report.registry.Report`, a
:class:`~pardiag.analyzer.report.compare.Comparison`, or a TraceSet (to merge). Leaves: one
self-contained HTML page (:mod:`.html`, built with the page kit :mod:`.page` and the CSS and
script in ``static/``), a terminal summary (:mod:`.terminal`), the comparison's page and terminal
summary (:mod:`.comparison`), one Chrome trace of every rank (:mod:`.merge`). Figures are built
here and nowhere else.
"""

from .comparison import render_compare_html, render_compare_terminal
from .html import render_html
from .merge import merge_traces
from .terminal import render_terminal

__all__ = ["merge_traces", "render_compare_html", "render_compare_terminal", "render_html",
           "render_terminal"]
