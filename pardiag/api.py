"""pardiag's Python API, for notebooks and scripts: :func:`analyze` a run, get a :class:`Report`.

::

    import pardiag
    rep = pardiag.analyze("pardiag_runs/ddp")          # a run folder, trace folder or files
    rep.verdict                                         # one sentence
    rep.ranks                                           # DataFrame: per-rank breakdown (µs, %)
    rep.figures["breakdown"]                            # a plotly figure
    rep.to_html("report.html"); rep.to_json()

The command line (``pardiag report``) is a thin layer over the same calls.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, cast

import orjson
import pandas as pd

from pardiag.analyzer.report.compare import Comparison as _TypedComparison
from pardiag.analyzer.report.registry import AnalysisOptions, build_report, report_document
from pardiag.analyzer.report.registry import Report as _TypedReport
from pardiag.analyzer.report.schema import ReportDocument, decode_report, to_builtins
from pardiag.analyzer.trace.traceset import TraceSet
from pardiag.errors import PardiagError, TraceError


class Report(_TypedReport):
    """The analysis of one run: one typed field per analysis (inherited from
    :class:`pardiag.analyzer.report.registry.Report`: ``traces``, ``time_breakdown``, ``sync``,
    ``inferred_layout``, ``pipeline``, ``balance``, ``causes``, ``memory``, ``layout``,
    ``dim_overlap``, ``critical_path``, ``routing``, ``recommendations``), plus the tables a
    notebook reads most, the figures, and the outputs; :attr:`document` is the JSON summary
    typed (:class:`pardiag.analyzer.report.schema.ReportDocument`).

    Units everywhere: durations in µs (``*_us``), sizes in bytes (``*_bytes``), bandwidth in
    GB/s (10⁹ B/s, ``*_gbps``), shares in % (``*_pct``: ``overlap_pct`` of communication time,
    the others of the window).
    """

    # -- tables --------------------------------------------------------------------------------

    @property
    def ranks(self) -> pd.DataFrame:
        """One row per rank: ``rank``, ``domain`` (``gpu``/``cpu``), ``start_us``, ``end_us``,
        ``span_us``, ``compute_us``, ``comm_us``, ``overlap_us``, ``compute_only_us``,
        ``exposed_comm_us``, ``memory_only_us``, ``idle_us``, ``overlap_pct``,
        ``compute_only_pct``, ``overlap_share_pct``, ``exposed_comm_pct``, ``memory_only_pct``,
        ``idle_pct`` (HTA's overlap, Lumos' breakdown: compute only + overlap + exposed +
        memory copies only + idle = span)."""
        return self.time_breakdown.totals

    @property
    def steps(self) -> pd.DataFrame:
        """One row per rank and profiler step: ``rank``, ``step``, ``start_us``, ``end_us`` (the
        step's window) and the duration and share columns of :attr:`ranks` (``span_us``,
        ``compute_us``, ..., ``idle_pct``) over that window."""
        return self.time_breakdown.steps

    @property
    def step_parts(self) -> pd.DataFrame:
        """Where each rank's steps go (:mod:`pardiag.analyzer.analyses.causes`): one row per rank
        and
        profiler step: ``rank``, ``step``, ``start_us``, ``end_us``, ``span_us``; host parts
        ``data_loading_us``, ``sync_us``, ``comm_us``, ``launch_us``, ``optimizer_us``,
        ``backward_us``, ``forward_us``, ``other_us`` (outside any operator), summing to the
        span; device parts (GPU, else NaN) ``dev_compute_us``, ``dev_memory_us``,
        ``wait_comm_us``, ``wait_sync_us``, ``wait_host_us``, ``wait_other_us``, summing to the
        span."""
        return self.causes.per_step

    @property
    def collectives(self) -> pd.DataFrame:
        """One row per rank and collective type: ``rank``, ``collective``, ``count`` (issued
        ops), ``time_us`` (|union of its intervals|), ``exposed_us`` (not under compute)."""
        return self.time_breakdown.collectives

    @property
    def instances(self) -> pd.DataFrame:
        """One row per collective instance matched across ranks (and per point-to-point
        transfer): ``instance``, ``pg``, ``group``, ``seq``, ``op``, ``ranks``, ``expected``,
        ``complete``, ``step``, ``bytes``, ``first_arrival_us``, ``arrival_skew_us``,
        ``transfer_us``, ``last_rank``, ``algbw_gbps``, ``busbw_gbps``, ``inter_node``."""
        return self.sync.instances

    @property
    def stragglers(self) -> pd.DataFrame:
        """One row per rank, most wait caused first (complete instances only): ``rank``,
        ``wait_suffered_us``, ``wait_caused_us``, ``last_arrivals``, ``steps_as_top``,
        ``instances``. :attr:`straggler` names the verdict's straggler, or is None."""
        return self.sync.stragglers

    @property
    def straggler(self) -> int | None:
        """The rank the verdict calls a straggler (the JSON's top-level ``straggler``), else
        None; without recommendations, ``sync.straggler`` (the rank that makes the others wait
        beyond the noise, from the waiting alone)."""
        rec = getattr(self, "recommendations", None)
        return rec.straggler if rec is not None else self.sync.straggler

    @property
    def clock_offsets(self) -> pd.DataFrame:
        """One row per rank: ``rank``, ``offset_us`` (subtracted before comparing; relative to
        the lowest rank), ``residual_us`` (not subtracted: ranks on one host share a clock),
        ``instances`` (complete collectives used), ``host``."""
        return self.sync.offsets

    @property
    def path(self) -> pd.DataFrame:
        """The cross-rank critical path of every profiled step
        (:mod:`pardiag.analyzer.analyses.critical_path`), latest segment first: ``step``,
        ``rank``, ``start_us``, ``end_us`` (aligned clock), ``dur_us``, ``kind`` (``"work"``:
        the rank's time between communication it waited for, ``compute_us`` of it computing,
        ``data_loading_us`` in its DataLoader iterator outside computation, ``other_us`` the
        rest; ``"communication"``: a collective's or transfer's time from its
        last arrival, ``op``, ``dim``, ``instance``). Shares, slack and replay:
        :attr:`critical_path`."""
        return self.critical_path.segments

    @property
    def bubbles(self) -> pd.DataFrame:
        """Pipeline bubbles per rank and step: ``rank``, ``stages``, ``step``, ``window_us``,
        ``busy_us``, ``bubble_us``, ``bubble_pct``, the warmup / steady / cooldown parts
        (``*_bubble_us``), ``ideal_pct`` ((p−1)/(v·m+p−1), Narayanan et al. SC'21), ``method``
        (``measured`` or ``estimate``), ``profiled``, ``clean``. Empty without a pipeline."""
        return self.pipeline.bubbles

    @property
    def imbalance(self) -> pd.DataFrame:
        """Load imbalance per parallel-dimension group: ``dim``, ``pg``, ``imbalance``
        (max/mean of compute per step), ``cost_us`` (max − mean per step), ``slowest_rank``."""
        return self.balance.summary

    @property
    def moe_routing(self) -> pd.DataFrame:
        """MoE routing imbalance per expert-parallel group, from the all-to-alls' split sizes
        (most costly first): ``group``, ``dim``, ``ranks``, ``steps``, ``unit`` (``rows``: a
        token per row of a tokens × hidden buffer; ``elements`` where the row size is
        unknown), ``row_bytes``, ``imbalance`` (max/mean of the ranks' expert-side rows per
        step, median over steps) with ``imbalance_min``/``imbalance_max``, ``hot_rank``,
        ``hot_steps``, ``hot_rows``/``mean_rows`` (per step, median), ``wait_us`` (the others'
        waiting for the hot rank at the all-to-alls per step, median), ``saving_us`` (the
        predicted saving with even routing = ``wait_us`` / ranks) with its quartiles. Per
        rank and step: ``routing.per_rank``; per step: ``routing.steps``; per all-to-all:
        ``routing.instances``; the source × destination rows: ``routing.matrix``. Empty
        without routed all-to-alls (:mod:`pardiag.analyzer.analyses.routing`)."""
        return self.routing.groups

    @property
    def memory_per_rank(self) -> pd.DataFrame:
        """One row per rank: ``rank``, ``params_bytes``, ``grads_bytes``,
        ``optimizer_state_bytes``, ``static_bytes``, ``peak_allocated_bytes``,
        ``peak_reserved_bytes``, ``peak_rss_bytes`` (NaN where unknown)."""
        return self.memory.per_rank

    @property
    def process_groups(self) -> pd.DataFrame:
        """The layout's groups: ``dim``, ``pg``, ``desc``, ``ranks``, ``size``, ``nodes``,
        ``spans_nodes``; the degrees are ``layout.dims``, the strategies
        ``layout.strategies``."""
        return self.layout.groups

    @property
    def verdict(self) -> str:
        """One sentence: the step time and where it goes."""
        return self.recommendations.verdict

    @property
    def recommendations_table(self) -> pd.DataFrame:
        """The recommended changes, best first: ``tier`` (1 = best; one tier = predicted
        within the run's noise of each other), ``kind``, ``title``, ``change``,
        ``measured_step_us``, ``predicted_step_us``, ``gain_pct``, ``measured_peak_bytes``,
        ``predicted_peak_bytes``, ``fits_memory``, ``params``, ``evidence``, ``caveats``."""
        rows = [r.to_json() for r in self.recommendations.recommendations]
        cols = ["tier", "kind", "title", "change", "measured_step_us", "predicted_step_us",
                "gain_pct", "measured_peak_bytes", "predicted_peak_bytes", "fits_memory", "params",
                "evidence", "caveats"]
        return pd.DataFrame(rows, columns=cols)

    @property
    def warnings(self) -> tuple[str, ...]:
        """What loading had to say (files skipped, ranks joined or missing, repairs), then what
        the analyses found the figures cannot show (a process that drives several devices)."""
        return (*self.traces.warnings, *self.time_breakdown.devices_text(),
                *filter(None, [self.time_breakdown.host_only_text()]))

    # -- figures and outputs -------------------------------------------------------------------

    @property
    def figures(self) -> dict:
        """``{name: plotly Figure}`` of the report's charts that have data: ``breakdown``
        (per rank), ``step_breakdown``, ``overlap``, ``overlap_per_dimension``, ``stragglers``
        (wait heatmap), ``memory``, ``memory_timeline``, ``bandwidth``, ``moe_routing``
        (tokens per rank and step, source × destination). A notebook shows each as
        it is (``rep.figures["breakdown"]``). The report page draws the same figures."""
        import plotly.graph_objects as go

        from pardiag.analyzer.render import html as rh

        b = self.time_breakdown
        out = {}
        if len(b.totals):
            out["breakdown"] = rh.breakdown_figure(b.totals)
            out["overlap"] = rh.overlap_figure(b.totals)
        if len(b.steps):
            out["step_breakdown"] = rh.step_breakdown_figure(b.steps)
        if len(self.dim_overlap.per_rank):
            out["overlap_per_dimension"] = rh.dim_overlap_figure(self.dim_overlap.per_rank)
        if len(self.sync.instances) and len(self.sync.per_rank):
            out["stragglers"] = rh.straggler_heatmap(self.sync.per_rank, self.sync.instances)
        if len(self.memory.per_rank) and self.memory.per_rank.drop(columns="rank").notna().any(
                axis=None):
            out["memory"] = rh.memory_figure(self.memory.per_rank)
        if len(self.memory.timeline):
            out["memory_timeline"] = rh.memory_timeline(self.memory.timeline)
        if len(self.sync.instances) and self.sync.instances["busbw_gbps"].notna().any():
            out["bandwidth"] = rh.bandwidth_figure(self.sync.instances)
        if len(self.routing.per_rank):
            out["moe_routing"] = rh.routing_figure(self.routing)
        return {name: go.Figure(spec) for name, spec in out.items()}

    @functools.cached_property
    def document(self) -> ReportDocument:
        """The JSON summary as its type (:class:`pardiag.analyzer.report.schema.ReportDocument`,
        built once): one msgspec Struct per object (``document.sync.instances[0].busbw_gbps``),
        every field documented with its unit in :mod:`pardiag.analyzer.report.schema` and
        docs/json-schema.md. :meth:`to_json` is the same as plain values.

        Raises:
            TypeError: an analysis wrote a key the schema has no field for."""
        return report_document(self)

    def to_json(self) -> dict:
        """The JSON summary (what ``pardiag report --json`` writes; ``schema_version`` 3): a dict
        of plain Python values (:attr:`document` as builtins; a NaN is written as null). Its
        keys: docs/json-schema.md."""
        return to_builtins(self.document)

    def to_html(self, path: str | Path, *, cdn: bool = False) -> Path:
        """Write the self-contained HTML report to ``path`` (plotly.js inlined; linked from its
        CDN with ``cdn``) and return the path.

        Raises:
            PardiagError: the file cannot be written.
        """
        from pardiag.analyzer.render.html import render_html

        path = Path(path)
        try:
            path.write_text(render_html(self, include_plotlyjs="cdn" if cdn else True),
                            encoding="utf-8")
        except OSError as exc:
            raise PardiagError(f"{path}: cannot write ({exc.strerror})") from None
        return path

    def summary(self, width: int = 120) -> str:
        """The terminal summary as text (verdict, recommendations, breakdown, stragglers, ...),
        ``width`` columns wide."""
        from rich.console import Console

        from pardiag.analyzer.render.terminal import render_terminal

        console = Console(width=width, record=True, color_system=None,
                          file=cast(IO[str], _Null()))
        render_terminal(self, console)
        return console.export_text()

    def print_summary(self, console=None) -> None:
        """Print the terminal summary to ``console`` (a :class:`rich.console.Console`; default:
        standard output at its own width)."""
        from rich.console import Console

        from pardiag.analyzer.render.terminal import render_terminal

        render_terminal(self, console or Console())


class _Null:
    """A file that swallows writes (the summary is recorded, not printed): what rich's Console
    uses of a text file (given as one, ``IO[str]``)."""

    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        pass


def positive_number(name: str, value: object) -> None:
    """Refuse ``value`` unless it is None or a positive, finite number.

    Raises:
        PardiagError: one line naming ``name`` and the value."""
    import math

    if value is None:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise PardiagError(f"{name} must be a positive, finite number; got {value!r}")


def analyze(paths: str | Path | Iterable[str | Path], *, comm_kernels: Iterable[str] = (),
            cache: bool = True, workers: int | None = None, progress=None,
            hta: bool = False, mixed_runs: bool = False,
            loaded: Callable[[TraceSet], None] | None = None,
            peak_tflops: float | None = None, tokens_per_step: float | None = None) -> Report:
    """Load a run and run every analysis on it.

    Args:
        paths: a run folder written by ``pardiag profile``, a folder of Kineto traces from
            elsewhere, or trace files (``.json``/``.json.gz``); one or a list. A folder of
            repeated runs (``pardiag profile --repeat N``, :func:`repeat_runs`) gives the
            report of its run with the median step time, and a warning that lists every run's
            step time and their spread.
        comm_kernels: regular expressions naming extra communication kernels (custom
            collectives such as DeepEP's ``dispatch``/``combine``; copy-engine transfers), as
            ``--comm-kernel``.
        cache: read current per-rank summaries and store new ones (``.pardiag-cache/`` beside
            the traces, else ``~/.cache/pardiag``); False parses every trace and stores nothing.
        workers: processes that parse traces (default: one per core for large inputs).
        progress: ``progress(done, total)`` after each file is loaded.
        hta: also run Holistic Trace Analysis' idle time breakdown and kernel launch statistics
            on each GPU rank (:attr:`Report.hta`; as ``report --hta``).
        mixed_runs: analyse the files of different runs as one (as ``report --mixed-runs``; by
            default they are refused with a TraceError that points to :func:`compare`).
        loaded: called with the loaded :class:`~pardiag.analyzer.trace.TraceSet` before any
            analysis runs (``pardiag report`` checks its outputs against the traces and prints
            loading's warnings there); what it raises propagates.
        peak_tflops: the peak (dense TFLOP/s) every rank's MFU is computed against, over the
            device table's and the one measured at a CPU rank's start (as ``--peak-tflops``).
        tokens_per_step: tokens each rank processes per step, for tokens/s (as
            ``--tokens-per-step``).

    Returns:
        :class:`Report`; loading's warnings are in :attr:`Report.warnings`.

    Raises:
        PardiagError: a bad ``comm_kernels`` pattern, or a ``peak_tflops`` or
            ``tokens_per_step`` that is not a positive, finite number (exit code 2 on the
            command line).
        TraceError: a path does not exist, no readable trace is found, no trace holds a timed
            event, or the paths hold different runs (the message names the file and the
            problem).
    """
    for name, value in (("peak_tflops", peak_tflops), ("tokens_per_step", tokens_per_step)):
        positive_number(name, value)
    runs = repeat_runs(paths)
    _refuse_unlike_runs(paths)
    if runs:
        folder = runs[0].parent
        return _analyze_repeats(folder, runs, comm_kernels=comm_kernels,
                                cache=cache, workers=workers, progress=progress, hta=hta,
                                loaded=loaded, peak_tflops=peak_tflops,
                                tokens_per_step=tokens_per_step)
    return _analyze(paths, comm_kernels=comm_kernels, cache=cache, workers=workers,
                    progress=progress, hta=hta, mixed_runs=mixed_runs, loaded=loaded,
                    peak_tflops=peak_tflops, tokens_per_step=tokens_per_step)


def _analyze(paths, *, comm_kernels, cache, workers, progress, hta, mixed_runs=False,
             loaded=None, more_warnings: tuple[str, ...] = (), peak_tflops=None,
             tokens_per_step=None) -> Report:
    """:func:`analyze` of one run; ``more_warnings`` join loading's warnings."""
    from pardiag.analyzer.per_rank import REDUCER
    from pardiag.analyzer.per_rank.summary import summary_of
    from pardiag.analyzer.trace import load_traces
    from pardiag.analyzer.trace.classify import compile_comm_patterns

    if isinstance(comm_kernels, (str, re.Pattern)):
        comm_kernels = [comm_kernels]
    patterns = tuple(compile_comm_patterns(
        p.pattern if isinstance(p, re.Pattern) else p for p in comm_kernels))
    opts = AnalysisOptions(comm_patterns=patterns, hta=hta, peak_tflops=peak_tflops,
                           tokens_per_step=tokens_per_step)
    traces = load_traces(paths, reducer=REDUCER, comm_patterns=patterns, cache=cache,
                         workers=workers, progress=progress, mixed_runs=mixed_runs)
    if all(summary_of(t).n_events == 0 for t in traces.ranks.values()):   # not an empty report
        first = next(iter(traces.ranks.values()))
        raise TraceError(f"{traces.source}: no trace holds a timed event (e.g. {first.path}): "
                         f"the profiler recorded nothing")
    if more_warnings:
        traces = dataclasses.replace(traces, warnings=(*traces.warnings, *more_warnings))
    if loaded is not None:
        loaded(traces)
    return build_report(traces, opts, cls=Report)


def repeat_runs(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """The run folders of ``paths`` when it is one folder of repeated runs
    (:func:`pardiag.layout.repeat_runs`: what ``pardiag profile --repeat N`` writes), else
    ``[]``."""
    from pardiag import layout

    if isinstance(paths, (list, tuple)) and len(paths) == 1:
        paths = paths[0]
    if isinstance(paths, (str, Path)):
        return layout.repeat_runs(Path(paths))
    return []


def _refuse_unlike_runs(paths) -> None:
    """Raise when ``paths`` is one folder that gathers run folders which are no repeats of one
    run (:func:`pardiag.layout.unlike_runs`), or several paths of which one is a set of
    repeated runs: no report stands for all of them.

    Raises:
        TraceError: naming two runs that differ, and what to do instead."""
    from pardiag import layout

    if isinstance(paths, (list, tuple)) and len(paths) == 1:
        paths = paths[0]
    if not isinstance(paths, (str, Path)):
        sets = [Path(p) for p in paths if Path(p).is_dir() and layout.repeat_runs(Path(p))]
        if sets:   # a set among several paths: its runs are not one report's ranks
            raise TraceError(f"{sets[0]} is a set of repeated runs (pardiag profile --repeat): "
                             f"report it on its own, or set two sets side by side with "
                             f"pardiag compare A B")
        return
    why = layout.unlike_runs(Path(paths))
    if why:
        raise TraceError(f"{paths} holds run folders that are no repeats of one run ({why}): "
                         f"report each run folder on its own, or set two side by side with "
                         f"pardiag compare A B")


def _analyze_repeats(folder: Path, runs: list[Path], *, loaded=None, **kw) -> Report:
    """:func:`analyze` of a folder of repeated runs: every run is analysed for its step time
    (the report's ``step`` median), then the run with the median of those is reported again
    (from the per-rank cache, when on), with a warning naming every run's step time. Runs
    without a step are named and left out; when no run has one, the first is reported."""
    from pardiag.analyzer.report.reading import step_stats

    medians: list[tuple[float, Path]] = []
    without: list[str] = []
    for run in runs:
        try:
            st = step_stats(_analyze(run, **kw).document)
        except PardiagError as exc:   # a run without traces (it failed): named below
            without.append(f"{run.name} ({str(exc).split(': ', 1)[-1]})")
            continue
        if st is None:
            without.append(f"{run.name} (no complete step)")
        else:
            medians.append((st.median_us, run))
    i = _median_index([m for m, _ in medians])
    chosen = medians[i][1] if i is not None else runs[0]
    if i is not None:
        lo, hi = min(m for m, _ in medians), max(m for m, _ in medians)
        mid = medians[i][0]
        times = ", ".join(f"{r.name} {m / 1e3:.2f} ms" for m, r in medians)
        line = (f"{folder} holds {len(runs)} repeated runs; this report is of {chosen.name}, "
                f"the one with the median step time ({times}: they differ by "
                f"{100 * (hi - lo) / mid:.0f}% of the median between runs); `pardiag compare` "
                f"of two such folders weighs a change against that spread")
    else:
        line = f"{folder} holds {len(runs)} repeated runs and none has a step: {chosen.name} shown"
    if without:
        line += "; left out: " + "; ".join(without)
    return _analyze(chosen, loaded=loaded, more_warnings=(line,), **kw)


# -- comparing two runs ----------------------------------------------------------------------

#: A pardiag report summary (``report --json``) starts with this key (the writers keep the
#: field order).
_SUMMARY_HEAD = re.compile(rb'^\s*\{\s*"schema_version"\s*:')


def load_summary(path: str | Path, *, comm_kernels: Iterable[str] = (), cache: bool = True,
                 workers: int | None = None, progress=None) -> ReportDocument:
    """A run's typed JSON summary (:class:`~pardiag.analyzer.report.schema.ReportDocument`, what
    ``pardiag report --json`` writes): decoded from ``path`` when it is such a summary, else
    computed by :func:`analyze` from the run folder, trace folder or trace file ``path``
    (:attr:`Report.document`). A summary of an older pardiag decodes with defaults for the keys
    it lacks (:mod:`pardiag.analyzer.report.schema`).

    Raises:
        TraceError: ``path`` does not exist, holds no readable trace, or is a summary that
            cannot be read or decoded (one line naming the file and the problem, e.g.
            ``a.json: not a readable pardiag summary (Expected `int`, got `str` - at
            `$.ranks[0].rank`)``).
    """
    from pardiag.errors import TraceError

    p = Path(path)

    def decoded(data: bytes) -> ReportDocument:
        try:
            return decode_report(data, p)
        except ValueError as exc:
            raise TraceError(str(exc)) from None

    if p.is_file() and p.suffix == ".json":
        try:
            with open(p, "rb") as fh:
                head = fh.read(4096)
        except OSError as exc:
            raise TraceError(f"{p}: cannot read ({exc.strerror})") from None
        if _SUMMARY_HEAD.match(head):
            try:
                return decoded(p.read_bytes())
            except OSError as exc:
                raise TraceError(f"{p}: cannot read ({exc.strerror})") from None
    try:
        return analyze(p, comm_kernels=comm_kernels, cache=cache, workers=workers,
                       progress=progress).document
    except TraceError as exc:
        # a summary rewritten with its keys in another order (json.dump(sort_keys=True))
        if not (p.is_file() and p.suffix == ".json" and "not a Kineto trace" in str(exc)):
            raise
        try:
            data = p.read_bytes()
            doc = orjson.loads(data)
        except (OSError, orjson.JSONDecodeError):
            raise exc from None
        if isinstance(doc, dict) and "schema_version" in doc and isinstance(doc.get("ranks"),
                                                                           list):
            return decoded(data)
        raise


class Comparison(_TypedComparison):
    """Two runs compared (:func:`compare`): the typed result (inherited from
    :class:`pardiag.analyzer.report.compare.Comparison`: ``setup``, ``step``, ``breakdown``,
    ``ranks``, ``dims``, ``bubbles``, ``stragglers``, ``skew``, ``imbalance``,
    ``collectives``, ``bandwidth``, ``operators``, ``checks``, ``warnings``, and the two typed
    summaries compared, ``a_document`` and ``b_document``) and its outputs. Every delta is
    B − A; µs, bytes, GB/s, %.
    """

    def gate(self, fail_if_slower_pct: float):
        """The ``--fail-if-slower PCT`` check (:func:`pardiag.analyzer.report.compare.gate`): a
        :class:`~pardiag.analyzer.report.compare.GateResult` (``failed``, ``line``)."""
        from pardiag.analyzer.report.compare import gate

        return gate(self, fail_if_slower_pct)

    def to_json(self, fail_if_slower_pct: float | None = None) -> dict:
        """What ``pardiag compare --json`` writes (with the gate when a limit is given)."""
        from pardiag.analyzer.report.compare import comparison_json

        g = None if fail_if_slower_pct is None else self.gate(fail_if_slower_pct)
        return comparison_json(self, g)

    def to_html(self, path: str | Path, *, cdn: bool = False,
                fail_if_slower_pct: float | None = None) -> Path:
        """Write the comparison page to ``path`` (plotly.js inlined, or linked with ``cdn``)
        and return the path.

        Raises:
            PardiagError: the file cannot be written.
        """
        from pardiag.analyzer.render.comparison import render_compare_html

        path = Path(path)
        g = None if fail_if_slower_pct is None else self.gate(fail_if_slower_pct)
        try:
            path.write_text(render_compare_html(self, gate_result=g,
                                                include_plotlyjs="cdn" if cdn else True),
                            encoding="utf-8")
        except OSError as exc:
            raise PardiagError(f"{path}: cannot write ({exc.strerror})") from None
        return path

    def summary(self, width: int = 120) -> str:
        """The terminal summary as text, ``width`` columns wide."""
        from rich.console import Console

        console = Console(width=width, record=True, color_system=None,
                          file=cast(IO[str], _Null()))
        self.print_summary(console)
        return console.export_text()

    def print_summary(self, console=None, gate_result=None) -> None:
        """Print the terminal summary to ``console`` (a :class:`rich.console.Console`; default:
        standard output), with the gate's line when ``gate_result`` is given."""
        from rich.console import Console

        from pardiag.analyzer.render.comparison import render_compare_terminal

        render_compare_terminal(self, console or Console(), gate_result=gate_result)


def compare(a, b, *, comm_kernels: Iterable[str] = (), cache: bool = True,
            workers: int | None = None, names: tuple[str, str] | None = None) -> Comparison:
    """Compare run ``b`` (the candidate) with run ``a`` (the reference).

    Args:
        a, b: each a run folder written by ``pardiag profile``, a folder of repeated runs
            (``pardiag profile --repeat N``), a folder of Kineto traces, a trace file, a JSON
            summary written by ``pardiag report --json``, such a summary as a dict
            (:meth:`Report.to_json`), a typed summary (:attr:`Report.document`), a
            :class:`Report`, or a list of these (the runs of one side). A side of several runs
            is compared by the spread between its runs (its step time: the median of the runs'
            medians; the rest: its run with the median step time).
        comm_kernels, cache, workers: as for :func:`analyze` (for inputs that are analyzed).
        names: how the page and the JSON name A and B (default: the paths as given, or a
            summary's ``source``).

    Returns:
        :class:`Comparison`; runs that are not comparable (different scripts, world sizes) are
        compared where they can be, with ``warnings``.

    Raises:
        TraceError: an input is missing or unreadable, or a summary (a file or a dict) cannot
            be decoded (one line naming it).
    """
    from pardiag.analyzer.report.compare import compare_summaries

    sides, given = [], []
    for x in (a, b):
        if isinstance(x, (list, tuple)):
            runs = [d for item in x for d in _side_docs(item, comm_kernels, cache, workers)]
            given.append(", ".join(_given_name(item) for item in x))
        else:
            runs = _side_docs(x, comm_kernels, cache, workers)
            given.append(_given_name(x))
        if not runs:
            raise PardiagError(f"{given[-1]}: no run to compare")
        sides.append(runs)
    names = names or (given[0], given[1])
    picked = [median_run(runs) for runs in sides]
    res = compare_summaries(picked[0], picked[1], a_source=names[0], b_source=names[1],
                            a_runs=sides[0] if len(sides[0]) > 1 else (),
                            b_runs=sides[1] if len(sides[1]) > 1 else ())
    same = same_run(a, b)
    if same:
        res = dataclasses.replace(res, warnings=(same, *res.warnings))
    return Comparison(**{f.name: getattr(res, f.name) for f in dataclasses.fields(res)})


def same_run(a, b) -> str | None:
    """A warning when the two inputs of :func:`compare` are one path (spelled alike or not):
    every difference is then 0 by construction. None otherwise."""
    if all(isinstance(x, (str, Path)) for x in (a, b)) and Path(a).resolve() == Path(b).resolve():
        return f"A and B are the same run ({Path(a)}): every difference is 0 by construction"
    return None


def _given_name(x) -> str:
    """How an input of :func:`compare` is named: its path, or a summary's ``source``."""
    if isinstance(x, _TypedReport):
        return str(x.traces.source)
    if isinstance(x, dict):
        return str(x.get("source") or "summary")
    if isinstance(x, ReportDocument):
        return x.source or "summary"
    return str(x)


def _side_docs(x, comm_kernels, cache, workers) -> list[ReportDocument]:
    """The typed summaries of one input of :func:`compare`: one, or one per run of a folder
    of repeated runs."""
    from pardiag.errors import TraceError

    if isinstance(x, _TypedReport):
        return [x.document if isinstance(x, Report) else report_document(x)]
    if isinstance(x, dict):
        try:
            return [decode_report(x, _given_name(x))]
        except ValueError as exc:
            raise TraceError(str(exc)) from None
    if isinstance(x, ReportDocument):
        return [x]
    return load_summaries(x, comm_kernels=comm_kernels, cache=cache, workers=workers)


def load_summaries(path: str | Path, *, comm_kernels: Iterable[str] = (), cache: bool = True,
                   workers: int | None = None, progress=None) -> list[ReportDocument]:
    """:func:`load_summary` of ``path``, or of each run when ``path`` is a folder of repeated
    runs (:func:`repeat_runs`), in the runs' order.

    Raises:
        TraceError: as :func:`load_summary`, for any of the runs."""
    _refuse_unlike_runs(path)
    runs = repeat_runs(path) or [Path(path)]
    return [load_summary(r, comm_kernels=comm_kernels, cache=cache, workers=workers,
                         progress=progress) for r in runs]


def _median_index(values: list[float | None]) -> int | None:
    """Index of the median of ``values`` (the lower middle one for an even count; None values
    left out); None when there is none."""
    timed = sorted((v, i) for i, v in enumerate(values) if v is not None)
    return timed[(len(timed) - 1) // 2][1] if timed else None


def median_run(docs: list[ReportDocument]) -> ReportDocument:
    """The summary with the median step time (the lower middle one for an even count) of
    ``docs``; runs without a step are left out; the first of ``docs`` when none has one."""
    from pardiag.analyzer.report.reading import step_stats

    i = _median_index([st.median_us if (st := step_stats(d)) is not None else None
                       for d in docs])
    return docs[i if i is not None else 0]
