"""The page and the terminal summary of a monitored run (``pardiag profile --monitor``;
:mod:`pardiag.analyzer.analyses.monitored`): step time over the whole run per rank with each
finding's steps and each deep capture marked, a rank × step heatmap of the lateness that names
stragglers, and the findings, one line each."""

from __future__ import annotations

import numpy as np

from ..analyses import monitor_summary, monitored
from .page import Page, document, escape, muted

#: Steps drawn per rank; longer runs are drawn as the median of blocks of steps (the page says so).
MAX_POINTS = 4000
#: Ranks drawn one line each; more are drawn as their spread (the page says so).
MAX_RANK_LINES = 16
#: Columns of the lateness heatmap (blocks of steps beyond).
MAX_HEAT_COLUMNS = 500


def _blocks(n: int) -> int:
    return max(1, int(np.ceil(n / MAX_POINTS)))


def _step_figure(page: Page, data: monitored.MonitorData, found: list[dict],
                 caps: list[dict]) -> str:
    steps = data.steps   # every grouping below sorts its keys: no sort of 10⁷ rows first
    k = _blocks(int(steps["step"].nunique()))
    ranks = sorted(int(r) for r in steps["rank"].unique())
    named = sorted({f["rank"] for f in found if "rank" in f})
    traces = []
    if len(ranks) > MAX_RANK_LINES:   # the ranks' spread, and the ranks the findings name
        blk = steps["step"].to_numpy() // k
        per = steps.groupby(blk)["dur_us"]
        med = per.median()
        x = (med.index.to_numpy() * k).astype("float64")
        for q, name in ((0.9, "p90 of ranks"), (0.1, "p10 of ranks")):
            traces.append({"type": "scattergl", "mode": "lines", "name": name,
                           "x": x, "y": (per.quantile(q).to_numpy() / 1e3).astype("float64"),
                           "line": {"width": 0.5, "color": "rgba(99,110,250,0.5)"}})
        traces.append({"type": "scattergl", "mode": "lines", "name": "median of ranks",
                       "x": x, "y": (med.to_numpy() / 1e3).astype("float64")})
        show = named[:MAX_RANK_LINES]
    else:
        show = ranks
    for r in show:
        g = steps[steps["rank"] == r]
        s = g["step"].to_numpy() // k
        y = g.groupby(s)["dur_us"].median().to_numpy() / 1e3
        traces.append({"type": "scattergl", "mode": "lines", "name": f"rank {r}",
                       "x": (np.unique(s) * k).astype("float64"), "y": y.astype("float64")})
    shapes = [{"type": "rect", "xref": "x", "yref": "paper", "x0": f["first_step"] - 0.5,
               "x1": f["last_step"] + 0.5, "y0": 0, "y1": 1, "line": {"width": 0},
               "fillcolor": "rgba(214,39,40,0.15)" if f["kind"] == "straggler"
               else "rgba(255,127,14,0.15)"}
              for f in found if f["kind"] in ("straggler", "slow_steps")]
    shapes += [{"type": "rect", "xref": "x", "yref": "paper", "x0": c["first_step"] - 0.5,
                "x1": c["last_step"] + 0.5, "y0": 0, "y1": 1,
                "line": {"width": 1, "color": "rgba(44,160,44,0.9)", "dash": "dot"},
                "fillcolor": "rgba(44,160,44,0.12)"} for c in caps]
    title = "Step time over the run, per rank (shaded: findings" + (
        "; dotted green: deep captures)" if caps else ")")
    yaxis: dict = {"title": {"text": "step time (ms)"}, "rangemode": "tozero"}
    notes = [f"each point is the median of {k} steps"] if k > 1 else []
    ys = np.concatenate([t["y"] for t in traces]) if traces else np.array([])
    if len(ys) > 20:   # a few huge steps (the first holds the script's start) flatten the rest
        top = 1.5 * float(np.nanquantile(ys, 0.99))
        top = max([top, *(1.2 * f["step_ms"] for f in found if "step_ms" in f)])
        if float(np.nanmax(ys)) > top:
            yaxis["range"] = [0, top]
            over = sorted({int(x) for t in traces for x, y in zip(t["x"], t["y"]) if y > top})
            own = monitored.capture_steps([(c["first_step"], c["last_step"]) for c in caps])
            cap = {s for s in over if s and own.intersection(range(s, s + k))}   # k: a point's
            why = [("the script's start", [s for s in over if s == 0]),           # steps
                   ("deep captures", sorted(cap)),
                   ("", [s for s in over if s and s not in cap])]
            said = "; ".join(f"{', '.join(map(str, s[:5]))}{' …' if len(s) > 5 else ''}"
                             + (f" ({w})" if w else "") for w, s in why if s)
            notes.append(f"the axis stops at {top:.0f} ms; steps above it (up to "
                         f"{np.nanmax(ys):.0f} ms): {said}")
    fig = {"data": traces, "layout": {
        "title": {"text": title}, "xaxis": {"title": {"text": "optimizer step"}},
        "yaxis": yaxis, "shapes": shapes, "height": 380}}
    if len(ranks) > MAX_RANK_LINES:
        notes.append(f"{len(ranks)} ranks: their median and 10th–90th percentiles, and the "
                     f"ranks the findings name")
    return page.fig(fig) + "".join(page.sample(n) for n in notes)


def _late_figure(page: Page, data: monitored.MonitorData) -> str:
    delays = monitored.arrival_delays(data)
    if delays.empty or len(delays) < 2:
        return muted("No collective shared by two ranks was recorded: no lateness to draw.")
    late = monitored.lateness(delays)
    # collectives after the last optimizer step (the script's closing barrier) are no step's
    if len(data.steps):
        late = late.loc[:, late.columns <= int(data.steps["step"].max())]
    if late.shape[1] == 0:
        return muted("No collective shared by two ranks was recorded within an optimizer "
                     "step: no lateness to draw.")
    k = max(1, int(np.ceil(late.shape[1] / MAX_HEAT_COLUMNS)))
    cols = late.columns.to_numpy() // k
    z = late.T.groupby(cols).median().T / 1e3
    fig = {"data": [{"type": "heatmap", "z": z.to_numpy(dtype="float32"),
                     "x": (z.columns.to_numpy() * k).astype("float64"),
                     "y": [f"rank {r}" for r in z.index], "colorscale": "RdBu",
                     "zmid": 0,   # plotly's RdBu runs blue to red: late is red
                     "colorbar": {"title": {"text": "ms late"}}}],
           "layout": {"title": {"text": "Lateness: arrival at collectives after the other "
                                        "ranks (ms)"},
                      "xaxis": {"title": {"text": "optimizer step"}},
                      "height": 160 + 24 * len(z.index)}}
    return page.fig(fig) + (page.sample(f"each cell is the median of {k} steps") if k > 1
                            else "")


def monitor_html(data: monitored.MonitorData, doc: dict, source: str,
                 include_plotlyjs: bool | str = True) -> str:
    """The monitored run's page (one self-contained HTML document); ``doc`` is
    :func:`pardiag.analyzer.analyses.monitor_summary.summary` of ``data``."""
    page = Page()
    found = doc["findings"]
    items = "".join(f"<li>{escape(monitor_summary.finding_line(f))}</li>" for f in found)
    st = doc["step_ms"] or {}
    arrivals = "arrive_us" in data.steps and bool((data.steps["arrive_us"] >= 0).any())
    calls = (f"{doc['collectives']} collectives recorded" if doc["collectives"] or not arrivals
             else "each step's arrivals at its collectives recorded, not each call "
                  "(--no-monitor-calls)")
    head = (f"<p>{len(doc['ranks'])} ranks, {doc['steps']} steps, "
            f"{calls}; step time median "
            f"{st.get('median', float('nan')):.1f} ms (p10 {st.get('p10', float('nan')):.1f}, "
            f"p90 {st.get('p90', float('nan')):.1f}).</p>" if st else
            "<p>No step recorded: no rank finished an optimizer step.</p>")
    body = (f'<section id="findings"><h2>Findings</h2>{head}'
            + (f"<ul>{items}</ul>" if items else "" if not st else
               muted("No finding: no rank stood out of the run's noise and no period of steps "
                     "was slow."))
            + "".join(muted(n) for n in doc["notes"])
            + "".join(f"<p>Deep capture of steps {c['first_step']}–{c['last_step']} "
                      f"({c['ranks']} ranks): <code>pardiag report "
                      f"{escape(doc['source'])}/{escape(c['folder'])}</code></p>"
                      for c in doc.get("captures", []))
            + "</section>"
            + '<section id="steps"><h2>Step time</h2>'
            + _step_figure(page, data, found, doc.get("captures", [])) + "</section>"
            + f'<section id="lateness"><h2>Lateness per rank</h2>{_late_figure(page, data)}'
            + "</section>")
    toc = [("findings", "Findings"), ("steps", "Step time"), ("lateness", "Lateness per rank")]
    return document(f"pardiag: monitored run {source}", "pardiag report (monitored run)",
                    source, toc, body, include_plotlyjs)


def monitor_lines(doc: dict) -> list[str]:
    """The terminal summary of a monitored run, one string per line."""
    st = doc["step_ms"] or {}
    n = len(doc["ranks"])
    if not doc["steps"]:
        out = ["Monitored run: no step recorded"]
    else:
        out = [f"Monitored run: {n} rank{'s' if n != 1 else ''}, {doc['steps']} steps, step "
               f"time median {st.get('median', float('nan')):.1f} ms (p10–p90 "
               f"{st.get('p10', float('nan')):.1f}–{st.get('p90', float('nan')):.1f} ms)"]
        out += [f"  {monitor_summary.finding_line(f)}" for f in doc["findings"]] or [
            "  no finding: no rank stood out of the run's noise and no period of steps was slow"]
    out += [f"  note: {n}" for n in doc["notes"]]
    out += [f"  deep capture of steps {c['first_step']}–{c['last_step']} ({c['ranks']} ranks): "
            f"pardiag report "
            f"{doc['source']}/{c['folder']}" for c in doc.get("captures", [])]
    return out


def compare_lines(cmp: dict, names: tuple[str, str]) -> list[str]:
    """The terminal summary of two monitored runs compared
    (:func:`pardiag.analyzer.analyses.monitor_compare.compare_monitored`)."""
    from ..analyses.monitor_compare import WARMUP_STEPS

    a, b = cmp["a"], cmp["b"]
    low, high = cmp["step_delta_ci_pct"]
    out = [f"Monitored runs: A {names[0]} ({a['steps']} steps), B {names[1]} ({b['steps']} steps)",
           f"  step time from step {WARMUP_STEPS} on (the first {WARMUP_STEPS} build caches "
           f"and buckets): A {a['step_ms']:.2f} ms (p10–p90 {a['p10_ms']:.2f}–{a['p90_ms']:.2f}), "
           f"B {b['step_ms']:.2f} ms (p10–p90 {b['p10_ms']:.2f}–{b['p90_ms']:.2f}): "
           f"B {cmp['step_delta_pct']:+.1f}% [{low:+.1f}, {high:+.1f}]% — {cmp['verdict']}"]
    for label, side in (("A", a), ("B", b)):
        out += [f"  {label}: {monitor_summary.finding_line(f)}" for f in side["findings"]] or [
            f"  {label}: no finding"]
    return out


def compare_html(cmp: dict, data: tuple[monitored.MonitorData, monitored.MonitorData],
                 names: tuple[str, str], include_plotlyjs: bool | str = True) -> str:
    """The page of two monitored runs compared: both runs' step time over their steps, the
    difference with its noise, each run's findings."""
    from ..analyses.monitor_compare import WARMUP_STEPS

    page = Page()
    traces = []
    for label, d in zip(("A", "B"), data):
        per = d.steps.groupby("step")["dur_us"].median()
        per = per[per.index >= WARMUP_STEPS]
        k = _blocks(len(per))
        blk = per.groupby(per.index.to_numpy() // k).median()
        traces.append({"type": "scattergl", "mode": "lines", "name": label,
                       "x": (blk.index.to_numpy() * k).astype("float64"),
                       "y": (blk.to_numpy() / 1e3).astype("float64")})
    fig = {"data": traces, "layout": {
        "title": {"text": "Step time over each run (median over ranks)"},
        "xaxis": {"title": {"text": "optimizer step"}},
        "yaxis": {"title": {"text": "step time (ms)"}}, "height": 380}}
    items = "".join(f"<li>{escape(line.strip())}</li>" for line in compare_lines(cmp, names)[1:])
    body = (f'<section id="steps"><h2>Step time</h2><ul>{items}</ul>{page.fig(fig)}'
            + muted("The interval is a moving-block bootstrap of each run's steps (blocks of 50 "
                    "steps): B is slower or faster only when it excludes 0.")
            + "</section>")
    return document(f"pardiag compare: {names[0]} → {names[1]}",
                    "pardiag compare (monitored runs)", f"{names[0]} → {names[1]}",
                    [("steps", "Step time")], body, include_plotlyjs)
