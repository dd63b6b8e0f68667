"""The HTML report: one self-contained file that opens offline, built from Jinja2 templates
(``templates/report.html``, which extends the document ``templates/base.html`` and includes one
template per section, ``templates/sections/KEY.html``) with the page kit
(:mod:`pardiag.analyzer.render.page`: escaping, tables, inert figure data, plotly.js inlined).

Rendering only formats: every number on the page is a field of an analysis result. What each
section shows is built by :mod:`pardiag.analyzer.render.sections` (tables and notes) and
:mod:`pardiag.analyzer.render.figures` (the plotly figures); the templates lay it out, and
escape every value that is not already markup.

**Size.** Large runs are aggregated or sampled where a figure or table would grow with
ranks × steps × collectives (the limits of :mod:`~pardiag.analyzer.render.sections`); the page
says so where it happens and lists every such reduction under "Run summary".
"""

from __future__ import annotations

from pathlib import Path

from ..report.registry import Report
from .figures import (
    BLUES,
    DEVICE_PART_COLORS,
    HOST_PART_COLORS,
    REDS,
    bandwidth_figure,
    breakdown_figure,
    critical_path_figure,
    dim_overlap_figure,
    memory_figure,
    memory_timeline,
    overlap_figure,
    parts_figure,
    pipeline_gantt,
    routing_figure,
    run_steps_figure,
    step_breakdown_figure,
    step_heatmap,
    step_mean_figure,
    straggler_heatmap,
)
from .page import TEMPLATES, Page, document_context
from .sections import HTA_SECTION, SECTIONS, build

#: The figure builders, for ``pardiag.Report.figures`` and the tests (defined in
#: :mod:`.figures`).
__all__ = ["BLUES", "DEVICE_PART_COLORS", "HOST_PART_COLORS", "HTA_SECTION", "REDS", "SECTIONS",
           "bandwidth_figure", "breakdown_figure", "critical_path_figure", "dim_overlap_figure",
           "memory_figure", "memory_timeline", "overlap_figure", "parts_figure",
           "pipeline_gantt", "render_html", "routing_figure", "run_steps_figure",
           "step_breakdown_figure",
           "step_heatmap", "step_mean_figure", "straggler_heatmap"]


def render_html(report: Report, *, include_plotlyjs: bool | str = True) -> str:
    """The whole report page as a string (UTF-8 text, one self-contained HTML document).

    Args:
        report: the analyses to show; ``report.recommendations`` is optional.
        include_plotlyjs: True inlines plotly.js (gzip + base64, works offline); ``"cdn"``
            links it from the plotly CDN instead (a page of a few hundred kB).
    """
    page = Page()
    order, absent, sections = build(report, page)
    titles = dict(SECTIONS + (HTA_SECTION,), absent=ABSENT_TITLE)
    source = report.traces.source
    toc = [(k, titles[k]) for k in order] + ([("absent", ABSENT_TITLE)] if absent else [])
    context = document_context(f"pardiag report: {Path(str(source)).name}", "pardiag report",
                               str(source), toc, include_plotlyjs)
    return TEMPLATES.get_template("report.html").render(
        context, order=order, absent=absent, sections=sections, titles=titles)


#: The heading under which the sections about a structure the run does not have say why.
ABSENT_TITLE = "Not in this run"
