"""The comparison of two runs as a page and as a terminal summary (``pardiag compare``).

The page follows the report's rules (:mod:`pardiag.analyzer.render.html`): one self-contained
file, plotly.js inlined (or linked with ``--cdn``), figure data as inert JSON, every string from
a run escaped, sortable tables, no label cut or on top of another. Charts put A and B side by
side (grouped bars, or two panels sharing an axis); A is blue, B orange on every chart.
"""

from __future__ import annotations

import math
import shlex

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from rich.console import Console
from rich.text import Text

from ..report.checks import RecommendationCheck
from ..report.compare import PARTS, Comparison, GateResult, row_noise_us
from ..report.reading import (
    BETWEEN_RUNS_ALPHA,
    BETWEEN_RUNS_FLOOR_PCT,
    MIN_RUNS_PER_SIDE,
    value_text,
)
from .page import PART_COLORS, Page, document, escape, in_mib, muted, table
from .terminal import Col, print_table

#: Section headings of the comparison page, in order.
COMPARE_SECTIONS = (
    ("verdict", "Verdict"),
    ("checks", "Recommendations checked"),
    ("setup", "What changed in the setup"),
    ("step", "Step time"),
    ("breakdown", "Time per profiled step"),
    ("overlap", "Overlap per parallel dimension"),
    ("pipeline", "Pipeline bubbles per stage"),
    ("stragglers", "Stragglers and arrival skew"),
    ("imbalance", "Load imbalance"),
    ("memory", "Memory"),
    ("collectives", "Collectives and bandwidth"),
    ("operators", "Operators that moved"),
    ("warnings", "Warnings"),
)
#: A's and B's colours on every chart.
RUN_COLORS = {"A": "#4C78A8", "B": "#F58518"}
#: Colours of the breakdown parts (the report's, exposed communication split in two reds).
_PART_COLORS = {"compute_only_us": PART_COLORS["compute only"],
                "overlap_us": PART_COLORS["overlapped"],
                "exposed_transfer_us": PART_COLORS["exposed comm"],
                "exposed_wait_us": "#F2A7A6", "memory_only_us": PART_COLORS["memory copies"],
                "idle_us": PART_COLORS["idle"]}
#: Operators drawn in the "moved" chart (the table lists :data:`compare.TOP_OPERATORS`).
CHART_OPERATORS = 15
#: Operators listed in the terminal.
TERMINAL_OPERATORS = 10


def _h2(key: str) -> str:
    return f"<h2 id='{key}'>{escape(dict(COMPARE_SECTIONS)[key])}</h2>"


def _ms(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v / 1e3:,.3f}"


def _mib(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v / 2**20:,.1f}"


def _signed(v, digits: int = 1, unit: str = "") -> str:
    return ("–" if v is None or (isinstance(v, float) and math.isnan(v))
            else f"{v:+,.{digits}f}{unit}")


def setup_text(field: str, v) -> str:
    """A setup value as text: script arguments as a command line, lists and dicts flat."""
    if field == "script_args" and isinstance(v, list):
        return shlex.join(map(str, v)) or "(none)"
    return value_text(v)


def _empty(df: pd.DataFrame, cols) -> bool:
    return df.empty or not df[[c for c in cols if c in df]].notna().any(axis=None)


def headline(c: Comparison) -> str:
    """One sentence: how B's step compares with A's, and whether it clears the noise."""
    s = c.step
    if s.a is None or s.b is None:
        return f"Step times cannot be compared: {s.noise}."
    how = (f"{abs(s.delta_pct):.1f}% {'slower' if s.delta_pct > 0 else 'faster'} than"
           if s.delta_pct != 0 else "as long as")
    basis = (s.b.basis_text if s.a.basis_text == s.b.basis_text
             else f"A: {s.a.basis_text}; B: {s.b.basis_text}")
    return (f"B's step is {how} A's: {s.b.median_us / 1e3:.2f} vs {s.a.median_us / 1e3:.2f} ms "
            f"(medians over {basis}), {s.noise}.")


def check_sentence(ch: RecommendationCheck) -> str:
    """One sentence about an applied recommendation: predicted vs measured."""
    which = (f"the change A's report recommended {'first' if ch.rank == 1 else f'as #{ch.rank}'}"
             if ch.rank else "a change A's report evaluated and did not recommend")
    err = f" (error {_signed(ch.error_pct)}%)" if ch.error_pct is not None else ""
    return (f"B made {which} ({ch.change}): predicted step {_ms(ch.predicted_step_us)} ms, "
            f"measured {_ms(ch.b_step_us)} ms{err}.")


# ---------------------------------------------------------------------------- figures


def step_figure(c: Comparison) -> go.Figure:
    """Each run's per-step times (ms): a box with every step shown, or, for a summary without
    samples, the median with its quartiles."""
    fig = go.Figure()
    for name, s in (("A", c.step.a), ("B", c.step.b)):
        if s is None:
            continue
        if s.samples_us:
            fig.add_box(y=np.asarray(s.samples_us) / 1e3, name=name, boxpoints="all",
                        jitter=0.4, pointpos=0, marker_color=RUN_COLORS[name],
                        hovertemplate=name + ": %{y:.3f} ms<extra></extra>")
        else:
            fig.add_bar(x=[name], y=[s.median_us / 1e3], marker_color=RUN_COLORS[name],
                        name=name, error_y={"type": "data", "symmetric": False,
                                            "array": [(s.q3_us - s.median_us) / 1e3],
                                            "arrayminus": [(s.median_us - s.q1_us) / 1e3]},
                        hovertemplate=name + ": median %{y:.3f} ms<extra></extra>")
    fig.update_layout(title="Step time per step (ms)", yaxis_title="ms", showlegend=False,
                      height=380)
    return fig


def breakdown_figure(c: Comparison) -> go.Figure:
    """Two panels sharing the time axis, A left and B right: per rank (or role) the mean
    profiled step split into compute only, overlapped, exposed transfer, exposed waiting,
    memory copies and idle (ms)."""
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=("A", "B"))
    r = c.ranks
    for col, side in ((1, "a"), (2, "b")):
        rows = r[r[f"{side}_span_us"].notna()]
        for part, label in PARTS.items():
            fig.add_bar(name=label, x=list(rows["key"]),
                        y=(rows[f"{side}_{part}"] / 1e3).astype("float32"),
                        marker_color=_PART_COLORS[part], legendgroup=part, showlegend=col == 1,
                        hovertemplate="%{x}: %{y:.3f} ms<extra>" + label + "</extra>",
                        row=1, col=col)
    fig.update_layout(barmode="stack", title="Mean profiled step per rank or role (ms)",
                      height=420)
    fig.update_yaxes(title_text="ms", row=1, col=1)
    return fig


def _grouped(c_df: pd.DataFrame, key: str, col: str, title: str, ytitle: str,
             scale: float = 1.0, xtitle: str | None = None) -> go.Figure:
    """Grouped bars A | B of one value per key."""
    fig = go.Figure()
    for name in ("A", "B"):
        v = c_df[f"{name.lower()}_{col}"]
        fig.add_bar(name=name, x=[str(k) for k in c_df[key]],
                    y=(pd.to_numeric(v, errors="coerce") / scale).astype("float32"),
                    marker_color=RUN_COLORS[name],
                    hovertemplate="%{x}: %{y:.3f}<extra>" + name + "</extra>")
    fig.update_layout(barmode="group", title=title, yaxis_title=ytitle, xaxis_title=xtitle,
                      height=360)
    return fig


def memory_figure(c: Comparison) -> go.Figure:
    """Static memory (bars) and peak (markers) per rank or role, A and B side by side (MiB)."""
    r = c.ranks
    fig = go.Figure()
    for name in ("A", "B"):
        p = name.lower()
        fig.add_bar(name=f"{name} static", x=list(r["key"]),
                    y=(r[f"{p}_static_bytes"] / 2**20).astype("float32"),
                    marker_color=RUN_COLORS[name], offsetgroup=name,
                    hovertemplate="%{x}: %{y:.2f} MiB<extra>" + name + " static</extra>")
    for name in ("A", "B"):
        p = name.lower()
        peak = r[f"{p}_peak_bytes"]
        fig.add_scatter(name=f"{name} peak", x=list(r["key"]),
                        y=(peak / 2**20).astype("float32"), mode="markers",
                        marker={"symbol": "diamond", "size": 11, "color": RUN_COLORS[name],
                                "line": {"color": "#222", "width": 1}},
                        hovertemplate="%{x}: %{y:.2f} MiB<extra>" + name + " peak</extra>")
    fig.update_layout(barmode="group", title="Memory per rank or role (MiB)", yaxis_title="MiB",
                      height=380)
    return fig


def operators_figure(ops: pd.DataFrame) -> go.Figure:
    """The operators that moved most: B − A per rank and profiled step (ms), labelled ``#n``
    (the table below names them; the hover too)."""
    top = ops.head(CHART_OPERATORS).iloc[::-1]
    labels = [f"#{i}" for i in range(len(top), 0, -1)]
    names = [f"{escape(k)}: {escape(n if len(n) <= 80 else n[:77] + '...')}"
             for k, n in zip(top["kind"], top["name"])]
    fig = go.Figure(go.Bar(
        x=(top["delta_us"] / 1e3).astype("float32"), y=labels, orientation="h",
        customdata=names, marker_color=["#E45756" if d > 0 else "#54A24B"
                                        for d in top["delta_us"]],
        hovertemplate="%{y} %{customdata}: %{x:+.3f} ms<extra></extra>"))
    fig.update_layout(title="Operators that moved most: B − A per rank and step (ms)",
                      xaxis_title="ms (red: slower in B, green: faster)",
                      yaxis={"type": "category"},
                      height=max(300, 120 + 22 * len(top)), showlegend=False)
    return fig


# ---------------------------------------------------------------------------- page sections


def _verdict_section(c: Comparison, gate_result: GateResult | None) -> list[str]:
    out = [_h2("verdict"), f"<p class='verdict'>{escape(headline(c))}</p>"]
    for ch in c.applied:
        out.append(f"<p><b>{escape(check_sentence(ch))}</b></p>")
    if gate_result is not None:
        cls = "warn" if gate_result.failed else "muted"
        out.append(f"<p class='{cls}'>{'FAIL' if gate_result.failed else 'pass'}: "
                   f"{escape(gate_result.line)}</p>")
    out.append(muted(f"A (reference): {c.a_source} · B (candidate): {c.b_source} · every "
                      "delta is B − A."))
    return out


def _checks_section(c: Comparison) -> list[str]:
    out = [_h2("checks")]
    if not c.checks:
        out.append(muted("A's report evaluated no change (no recommendation to check)."))
        return out
    applied = pd.DataFrame([{
        "rank": ch.rank if ch.rank else "not recommended", "change": ch.change,
        "a_step": ch.a_step_us, "predicted": ch.predicted_step_us, "measured": ch.b_step_us,
        "error_pct": ch.error_pct, "pred_peak": ch.predicted_peak_bytes,
        "b_peak": ch.b_peak_bytes, "peak_error_pct": ch.peak_error_pct,
        "also": "; ".join([*ch.args_changed, *ch.also_changed]) or "–"} for ch in c.applied])
    if len(applied):
        out.append("<p>Changes of A's report that B made (A's predicted step time and peak "
                   "memory against B's measured ones):</p>")
        out.append(table(applied.assign(
            a_step=applied["a_step"] / 1e3, predicted=applied["predicted"] / 1e3,
            measured=applied["measured"] / 1e3, pred_peak=applied["pred_peak"] / 2**20,
            b_peak=applied["b_peak"] / 2**20), {
            "rank": "A's recommendation #", "change": "change", "a_step": "A measured (ms)",
            "predicted": "predicted (ms)", "measured": "B measured (ms)",
            "error_pct": "error %", "pred_peak": "predicted peak (MiB)",
            "b_peak": "B peak (MiB)", "peak_error_pct": "peak error %",
            "also": "also changed"}, left=("change", "also"), digits=3))
        out.append(muted("error = (predicted − measured) / measured. \"Also changed\": the "
                          "script arguments and other setup fields that differ between A and "
                          "B — they move the measurement too."))
    else:
        out.append(muted(f"B made none of the {len(c.checks)} changes A's report evaluated "
                          "(or its setup does not show them); the table says why for each."))
    others = [ch for ch in c.checks if ch.status != "applied"]
    if others:
        df = pd.DataFrame([{"rank": ch.rank if ch.rank else "not recommended",
                            "change": ch.change, "predicted": ch.predicted_step_us / 1e3
                            if ch.predicted_step_us is not None else None,
                            "status": ch.status, "why": ch.why} for ch in others])
        out.append("<h3>Other changes A's report evaluated</h3>")
        out.append(table(df, {"rank": "A's recommendation #", "change": "change",
                               "predicted": "predicted (ms)", "status": "in B",
                               "why": "why"}, left=("rank", "change", "status", "why"),
                          digits=3, sortable=True, what="changes"))
    return out


def _setup_section(c: Comparison) -> list[str]:
    out = [_h2("setup")]
    s = c.setup
    shown = s[s["status"] != "same"].copy()
    shown["a"] = [setup_text(f, v) for f, v in zip(shown["field"], shown["a"])]
    shown["b"] = [setup_text(f, v) for f, v in zip(shown["field"], shown["b"])]
    if len(shown):
        out.append(table(shown, {"label": "setting", "a": "A", "b": "B", "status": "status",
                                  "detail": "detail"}, left=("label", "a", "b", "status",
                                                            "detail"), what="settings"))
    else:
        out.append(muted("Nothing differs in what both runs recorded."))
    same = s[s["status"] == "same"]
    if len(same):
        out.append(muted("The same in both: " + "; ".join(
            f"{lab} {setup_text(f, v)}" for f, lab, v in zip(same["field"], same["label"],
                                                             same["a"])) + "."))
    unknown = s[s["status"].str.startswith("unknown")]
    if len(unknown):
        out.append(muted("Unknown: what a run does not record (traces from elsewhere state "
                          "little: no script, environment or hosts; runs of an older pardiag "
                          "lack the environment)."))
    return out


def _step_section(c: Comparison, page: Page) -> list[str]:
    out = [_h2("step")]
    s = c.step
    if s.a is None and s.b is None:
        out.append(muted(s.noise))
        return out
    out.append(page.fig(step_figure(c)))
    rows = []
    for name, st in (("A", s.a), ("B", s.b)):
        if st is None:
            continue
        rows.append({"run": name, "basis": st.basis_text, "steps": st.steps,
                     "median": st.median_us / 1e3, "q1": st.q1_us / 1e3, "q3": st.q3_us / 1e3,
                     "min": st.min_us / 1e3, "max": st.max_us / 1e3})
    out.append(table(pd.DataFrame(rows), {
        "run": "run", "basis": "measured on", "steps": "steps", "median": "median (ms)",
        "q1": "first quartile (ms)", "q3": "third quartile (ms)", "min": "min (ms)",
        "max": "max (ms)"}, left=("run", "basis"), digits=3))
    if s.a is not None and s.b is not None:
        out.append(f"<p>B − A: {_signed(s.delta_us / 1e3, 3)} ms "
                   f"({_signed(s.delta_pct)}%), {escape(s.noise)}.</p>")
    return out


def _breakdown_section(c: Comparison, page: Page) -> list[str]:
    out = [_h2("breakdown")]
    if _empty(c.ranks, ["a_span_us", "b_span_us"]):
        out.append(muted("Neither run has timed events."))
        return out
    out.append(page.fig(breakdown_figure(c)))
    out.append(table(c.breakdown.assign(a_us=c.breakdown["a_us"] / 1e3,
                                         b_us=c.breakdown["b_us"] / 1e3,
                                         delta_us=c.breakdown["delta_us"] / 1e3,
                                         noise=c.breakdown["within_noise"].map(noise_label)), {
        "label": "part", "a_us": "A (ms)", "b_us": "B (ms)", "delta_us": "B − A (ms)",
        "delta_pct": "B − A (%)", "noise": "B − A against the noise"},
        left=("label", "noise"), digits=3))
    out.append(muted("Mean over ranks of the mean profiled step. Exposed communication is "
                      "split into waiting (the wait the rank suffered in matched collectives, "
                      "counted as exposed first) and transfer (the rest). " + noise_caption(c)))
    r = c.ranks
    ms = {f"{p}_{v}": r[f"{p}_{v}"] / 1e3 for p in ("a", "b")
          for v in ("span_us", "exposed_comm_us", "exposed_wait_us", "idle_us",
                    "wait_caused_us")}
    out.append(f"<h3>By {'rank' if c.by == 'rank' else 'role (the layouts differ)'}</h3>")
    out.append(table(r.assign(**ms), {
        "key": "rank" if c.by == "rank" else "role", "a_span_us": "A step (ms)",
        "b_span_us": "B step (ms)", "a_exposed_comm_us": "A exposed (ms)",
        "b_exposed_comm_us": "B exposed (ms)", "a_exposed_wait_us": "A waiting (ms)",
        "b_exposed_wait_us": "B waiting (ms)", "a_idle_us": "A idle (ms)",
        "b_idle_us": "B idle (ms)", "a_wait_caused_us": "A wait caused (ms)",
        "b_wait_caused_us": "B wait caused (ms)"}, left=("key",), digits=3, sortable=True,
        what="rows"))
    out.append(muted(noise_caption(c)))
    return out


def noise_label(within: bool | None) -> str:
    """A breakdown row's difference against the step's noise between runs, in words."""
    if within is None:
        return "noise unknown"
    return "within noise" if within else "larger than the noise"


def noise_caption(c: Comparison) -> str:
    """One sentence: the difference below which a row moved within the noise between runs
    (:attr:`pardiag.analyzer.report.reading.StepDelta.noise_us`)."""
    if c.step.p_value is not None:   # repeated runs: each part tested as the step is
        return ("Each part is the median over a side's runs; it moved within the noise unless "
                "its values in A's runs and B's differ by the same Mann–Whitney test as the "
                f"step (p < {BETWEEN_RUNS_ALPHA:g}), and the noise is unknown where the runs "
                f"are too few for that test (fewer than {MIN_RUNS_PER_SIDE} per side).")
    span = float(c.breakdown["a_us"].iloc[0]) if len(c.breakdown) else float("nan")
    n = row_noise_us(c.step, span)
    if math.isnan(n):
        return "The noise between runs is unknown: no difference here can be told from it."
    if n != c.step.noise_us:   # the step is measured on other steps than the rows
        return (f"A difference of at most ±{n / 1e3:.3f} ms per profiled step "
                f"({BETWEEN_RUNS_FLOOR_PCT:g}% of A's profiled step of {span / 1e3:.3f} ms, the "
                "share by which identical runs' steps differed) is within the noise between "
                "runs.")
    return (f"A difference of at most ±{n / 1e3:.3f} ms ({BETWEEN_RUNS_FLOOR_PCT:g}% of A's "
            "step, by which identical runs differed) is within the noise between runs.")

def _overlap_section(c: Comparison, page: Page) -> list[str]:
    out = [_h2("overlap")]
    d = c.dims
    if _empty(d, ["a_overlap_pct", "b_overlap_pct"]):
        out.append(muted("No communication on a known parallel dimension in either run."))
        return out
    vals = pd.concat([d["a_overlap_pct"], d["b_overlap_pct"]]).dropna()
    if len(vals) and (vals <= 0).all():
        out.append(muted("No overlap in either run: all communication exposed on every "
                          "dimension, so no chart is drawn."))
    else:
        out.append(page.fig(_grouped(d, "dim", "overlap_pct", "Overlap per parallel dimension",
                                     "overlap (%)", xtitle="dimension")))
    out.append(table(d.assign(a_exposed_us=d["a_exposed_us"] / 1e3,
                               b_exposed_us=d["b_exposed_us"] / 1e3), {
        "dim": "dimension", "a_overlap_pct": "A overlap %", "b_overlap_pct": "B overlap %",
        "a_exposed_us": "A exposed per rank and step (ms)",
        "b_exposed_us": "B exposed per rank and step (ms)"}, left=("dim",), digits=3))
    return out


def _pipeline_section(c: Comparison, page: Page) -> list[str]:
    out = [_h2("pipeline")]
    b = c.bubbles
    if _empty(b, ["a_bubble_pct", "b_bubble_pct"]):
        out.append(muted("Neither run is a pipeline."))
        return out
    out.append(page.fig(_grouped(b.assign(stage=[f"stage {s}" for s in b["stage"]]), "stage",
                                 "bubble_pct", "Pipeline bubble per stage (% of the window)",
                                 "bubble (%)")))
    out.append(table(b.assign(a_bubble_us=b["a_bubble_us"] / 1e3,
                               b_bubble_us=b["b_bubble_us"] / 1e3), {
        "stage": "stage", "a_bubble_pct": "A bubble %", "b_bubble_pct": "B bubble %",
        "a_ideal_pct": "A ideal %", "b_ideal_pct": "B ideal %",
        "a_bubble_us": "A bubble per step (ms)", "b_bubble_us": "B bubble per step (ms)",
        "a_basis": "A steps", "b_basis": "B steps"}, left=("stage", "a_basis", "b_basis"),
        digits=3))
    out.append(muted("Bubble = the window less the rank's forward and backward chunks; ideal "
                      "(p−1)/(v·m+p−1) (Narayanan et al., SC'21)."))
    return out


def _stragglers_section(c: Comparison) -> list[str]:
    out = [_h2("stragglers")]
    sa, sb = c.stragglers.a, c.stragglers.b

    def who(x):
        return "no straggler" if x is None else f"rank {x}"

    line = f"Straggler: A {who(sa)}, B {who(sb)}"
    if sa is not None and sa != sb:
        line += f" — rank {sa} no longer makes the others wait"
    out.append(f"<p>{escape(line)}.</p>")
    if not _empty(c.skew, ["a_arrival_skew_us", "b_arrival_skew_us"]):
        k = c.skew
        out.append(table(k.assign(**{f"{p}_{v}": k[f"{p}_{v}"] / 1e3 for p in ("a", "b")
                                      for v in ("arrival_skew_us", "max_skew_us")}), {
            "op": "collective", "a_count": "A instances", "b_count": "B instances",
            "a_arrival_skew_us": "A median arrival skew (ms)",
            "b_arrival_skew_us": "B median arrival skew (ms)",
            "a_max_skew_us": "A max skew (ms)", "b_max_skew_us": "B max skew (ms)"},
            left=("op",), digits=3, sortable=True))
    else:
        out.append(muted("No collective matched across ranks in either run."))
    return out


def _imbalance_section(c: Comparison) -> list[str]:
    out = [_h2("imbalance")]
    if _empty(c.imbalance, ["a_imbalance", "b_imbalance"]):
        out.append(muted("No parallel-dimension group with compute in either run."))
        return out
    i = c.imbalance
    out.append(table(i.assign(a_cost_us=i["a_cost_us"] / 1e3, b_cost_us=i["b_cost_us"] / 1e3), {
        "dim": "dimension", "a_imbalance": "A max/mean", "b_imbalance": "B max/mean",
        "a_cost_us": "A cost per step (ms)", "b_cost_us": "B cost per step (ms)"},
        left=("dim",), digits=3))
    out.append(muted("Compute per step: max/mean over the group's ranks; cost = max − mean."))
    return out


def _memory_section(c: Comparison, page: Page) -> list[str]:
    out = [_h2("memory")]
    r = c.ranks
    cols = [f"{p}_{v}" for p in ("a", "b") for v in ("static_bytes", "peak_bytes",
                                                     "peak_rss_bytes")]
    if _empty(r, cols):
        out.append(muted("No memory information in either run."))
        return out
    out.append(page.fig(memory_figure(c)))
    out.append(table(in_mib(r, cols), {
        "key": "rank" if c.by == "rank" else "role",
        "a_static_bytes": "A static (MiB)", "b_static_bytes": "B static (MiB)",
        "a_peak_bytes": "A peak (MiB)", "b_peak_bytes": "B peak (MiB)",
        "a_peak_rss_bytes": "A peak RSS (MiB)", "b_peak_rss_bytes": "B peak RSS (MiB)"},
        left=("key",), digits=2, sortable=True, what="rows"))
    out.append(muted("Static: parameters, gradients and optimizer state of the rank; peak: "
                      "static + transient, as each run's report states it and A's "
                      "recommendations predicted it."))
    return out


def _collectives_section(c: Comparison, page: Page) -> list[str]:
    out = [_h2("collectives")]
    k = c.collectives
    if _empty(k, ["a_time_us", "b_time_us"]):
        out.append(muted("No communication in either run."))
    else:
        out.append(page.fig(_grouped(k, "collective", "time_us",
                                     "Time per collective type per rank and step (ms)", "ms",
                                     scale=1e3)))
        out.append(table(k.assign(**{f"{p}_{v}": k[f"{p}_{v}"] / 1e3 for p in ("a", "b")
                                      for v in ("time_us", "exposed_us")}), {
            "collective": "collective", "a_count": "A count", "b_count": "B count",
            "a_time_us": "A time (ms)", "b_time_us": "B time (ms)",
            "a_exposed_us": "A exposed (ms)", "b_exposed_us": "B exposed (ms)"},
            left=("collective",), digits=3, sortable=True, what="types"))
        out.append(muted("Per rank and profiled step: issued ops, |union| of their intervals "
                          "and its part not under compute."))
    if not _empty(c.bandwidth, ["a_count", "b_count"]):
        bw = c.bandwidth
        out.append("<h3>Per dimension (or group): transfer and bus bandwidth</h3>")
        out.append(table(bw.assign(a_transfer_us=bw["a_transfer_us"] / 1e3,
                                    b_transfer_us=bw["b_transfer_us"] / 1e3), {
            "group": "dimension or group", "op": "collective", "a_count": "A instances",
            "b_count": "B instances", "a_transfer_us": "A transfer median (ms)",
            "b_transfer_us": "B transfer median (ms)", "a_busbw_gbps": "A busbw median (GB/s)",
            "b_busbw_gbps": "B busbw median (GB/s)"}, left=("group", "op"), digits=3,
            sortable=True, what="rows"))
        out.append(muted("Complete instances matched across ranks; transfer = an instance's "
                          "shortest duration over its ranks; busbw as nccl-tests defines it."))
    return out


def _operators_section(c: Comparison, page: Page) -> list[str]:
    out = [_h2("operators")]
    o = c.operators
    if o.empty:
        out.append(muted(c.operators_note or "No operators in either run."))
        return out
    out.append(page.fig(operators_figure(o)))
    out.append(table(o.assign(n=[f"#{i}" for i in range(1, len(o) + 1)],
                               a_us=o["a_us"] / 1e3, b_us=o["b_us"] / 1e3,
                               delta_us=o["delta_us"] / 1e3), {
        "n": "#", "kind": "kind", "name": "operator", "a_us": "A (ms)", "b_us": "B (ms)",
        "delta_us": "B − A (ms)", "delta_pct": "B − A (%)", "a_count": "A count",
        "b_count": "B count"}, left=("n", "kind", "name"), digits=3, sortable=True,
        what="operators"))
    out.append(muted(c.operators_note[0].upper() + c.operators_note[1:] + "."))
    return out


def _warnings_section(c: Comparison) -> list[str]:
    out = [_h2("warnings")]
    if c.warnings:
        out.append("<ul>" + "".join(f"<li class='warn'>{escape(w)}</li>" for w in c.warnings)
                   + "</ul>")
    else:
        out.append(muted("None: the two runs are comparable rank by rank."
                          if c.by == "rank" else "None."))
    return out


def render_compare_html(c: Comparison, *, gate_result: GateResult | None = None,
                        include_plotlyjs: bool | str = True) -> str:
    """The comparison page as one self-contained HTML document (a string).

    Args:
        c: the comparison (:func:`pardiag.analyzer.report.compare.compare_summaries`).
        gate_result: the ``--fail-if-slower`` outcome to show, if any.
        include_plotlyjs: True inlines plotly.js (gzip + base64, works offline); ``"cdn"``
            links it from the plotly CDN instead.
    """
    page = Page()
    pipeline = _pipeline_section(c, page)
    last = _empty(c.bubbles, ["a_bubble_pct", "b_bubble_pct"])
    body = (_verdict_section(c, gate_result) + _checks_section(c) + _setup_section(c)
            + _step_section(c, page) + _breakdown_section(c, page) + _overlap_section(c, page)
            + ([] if last else pipeline) + _stragglers_section(c) + _imbalance_section(c)
            + _memory_section(c, page) + _collectives_section(c, page)
            + _operators_section(c, page) + _warnings_section(c) + (pipeline if last else []))
    return document(f"pardiag compare: {c.a_source} → {c.b_source}", "pardiag compare",
                    f"A {c.a_source} → B {c.b_source}", section_order(c), "".join(body),
                    include_plotlyjs)


def section_order(c: Comparison) -> tuple[tuple[str, str], ...]:
    """The page's sections in order (:data:`COMPARE_SECTIONS`), the pipeline's last when
    neither run is a pipeline: it then only says so, at the end, not in the main flow."""
    if not _empty(c.bubbles, ["a_bubble_pct", "b_bubble_pct"]):
        return COMPARE_SECTIONS
    return (*(s for s in COMPARE_SECTIONS if s[0] != "pipeline"),
            *(s for s in COMPARE_SECTIONS if s[0] == "pipeline"))


# ---------------------------------------------------------------------------- terminal


def render_compare_terminal(c: Comparison, console: Console,
                            gate_result: GateResult | None = None) -> None:
    """Print the comparison: the headline, the gate, checked recommendations, setup changes,
    step time and breakdown, per rank or role, the operators that moved most. Strings from the
    runs are printed as text (never as markup)."""
    console.print(Text(f"Comparing B {c.b_source} with A {c.a_source} (B − A)", style="bold"))
    console.print(Text(headline(c)))
    for ch in c.applied:
        console.print(Text(check_sentence(ch)))
    if gate_result is not None:
        console.print(Text(f"{'FAIL' if gate_result.failed else 'pass'}: {gate_result.line}"))
    if c.checks:
        rows = [(str(ch.rank or "–"), Text(ch.change), ch.status, _ms(ch.predicted_step_us),
                 _ms(ch.b_step_us) if ch.status == "applied" else "–",
                 _signed(ch.error_pct) if ch.error_pct is not None else "–")
                for ch in c.checks]
        print_table(console, "Changes A's report evaluated, checked against B", [
            Col("#"), Col("change", "left", wrap="fold"), Col("in B", "left", wrap="word"),
            Col("predicted ms"), Col("B measured ms", drop=1), Col("error %", drop=2)], rows,
            caption="#: A's recommendation rank (– evaluated, not recommended); error = "
                    "(predicted − measured) / measured")
    changed = c.setup[c.setup["status"] != "same"]
    if len(changed):
        print_table(console, "What changed in the setup", [
            Col("setting", "left", wrap="word"), Col("A", "left", wrap="fold"),
            Col("B", "left", wrap="fold"), Col("status", "left", wrap="word", drop=1)],
            [(Text(str(r.label)), Text(setup_text(r.field, r.a)), Text(setup_text(r.field, r.b)),
              Text(str(r.status))) for r in changed.itertuples()])
        for r in changed[changed["detail"] != ""].itertuples():
            console.print(Text(f"{r.label} changed: {r.detail}"))
    timing: list[tuple[str, ...]] = []
    s = c.step
    if s.a is not None or s.b is not None:
        timing.append(("step (median)", _ms(s.a.median_us if s.a else None),
                       _ms(s.b.median_us if s.b else None), _signed(s.delta_us / 1e3, 3),
                       _signed(s.delta_pct), ""))
    for r in c.breakdown.itertuples():
        timing.append((f"{r.label}, per profiled step", _ms(r.a_us), _ms(r.b_us),
                       _signed(r.delta_us / 1e3, 3), _signed(r.delta_pct),
                       "" if r.within_noise is None else noise_label(r.within_noise)))
    print_table(console, "Step time and breakdown (ms)", [
        Col("", "left", wrap="word"), Col("A"), Col("B"), Col("B − A"), Col("B − A %"),
        Col("vs noise", "left", wrap="word", drop=1)], timing,
        caption=f"step: {s.noise}. {noise_caption(c)}")
    r = c.ranks
    if len(r):
        print_table(console, f"Per {'rank' if c.by == 'rank' else 'role'} (ms per profiled "
                    "step; MiB)", [
                        Col("rank" if c.by == "rank" else "role", "left"),
                        Col("A step"), Col("B step"), Col("A exposed"), Col("B exposed"),
                        Col("A idle", drop=2), Col("B idle", drop=2),
                        Col("A peak MiB", drop=1), Col("B peak MiB", drop=1)],
                    [(Text(str(x.key)), _ms(x.a_span_us), _ms(x.b_span_us),
                      _ms(x.a_exposed_comm_us), _ms(x.b_exposed_comm_us), _ms(x.a_idle_us),
                      _ms(x.b_idle_us), _mib(x.a_peak_bytes),
                      _mib(x.b_peak_bytes)) for x in r.itertuples()])
    b = c.bubbles
    if not _empty(b, ["a_bubble_pct", "b_bubble_pct"]):
        print_table(console, "Pipeline bubble per stage (% of the window)", [
            Col("stage", "left"), Col("A"), Col("B"), Col("A ideal"), Col("B ideal")],
            [(Text(str(x.stage)), _fmt_pct(x.a_bubble_pct), _fmt_pct(x.b_bubble_pct),
              _fmt_pct(x.a_ideal_pct), _fmt_pct(x.b_ideal_pct)) for x in b.itertuples()])
    sa, sb = c.stragglers.a, c.stragglers.b
    console.print(Text(f"Straggler: A {'none' if sa is None else f'rank {sa}'}, B "
                       f"{'none' if sb is None else f'rank {sb}'}."))
    o = c.operators
    if len(o):
        print_table(console, f"Operators that moved most (ms per rank and profiled step; "
                    f"{min(len(o), TERMINAL_OPERATORS)} of {len(o)})", [
                        Col("kind", "left", drop=1), Col("operator", "left", wrap="fold"),
                        Col("A"), Col("B"), Col("B − A")],
                    [(x.kind, Text(str(x.name)), _ms(x.a_us), _ms(x.b_us),
                      _signed(x.delta_us / 1e3, 3)) for x in o.head(TERMINAL_OPERATORS)
                     .itertuples()])
    elif c.operators_note:
        console.print(Text(f"Operators: {c.operators_note}."))


def _fmt_pct(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"
