"""The terminal summary at 80 and 120 columns: no header or cell cut with
"…", no line wider than the console; what does not fit is left out and named."""

import pytest
from rich.console import Console

from pardiag.analyzer.render.terminal import render_terminal
from pardiag.analyzer.report.registry import build_report
from pardiag.analyzer.trace import load_traces

from .paths import REPO

#: The demo, a 4-stage pipeline, FSDP2 and a real GPU trace (read by path).
RUNS = ["pp_unbalanced_cpu_2rank", "pp_1f1b_cpu_4rank", "fsdp2_cpu_2rank", "dlrm_8rank_v100"]
BREAKDOWN = ["rank", "on", "span", "compute", "overlapped", "exposed", "idle", "overlap %",
             "exposed %"]


@pytest.fixture(scope="module")
def reports():
    return {}


def _report(request, reports, run):
    if run not in reports:
        path = REPO / "sample_traces" / run
        if not path.is_dir():
            path = request.getfixturevalue("real_traces") / run
        reports[run] = build_report(load_traces(path))
    return reports[run]


def _tables(text: str) -> list[dict]:
    """Each rich table of ``text``: its title's last line (the line above), header cells
    (joined over the header's lines), header lines, rows (cells stripped) and caption."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.startswith("┏"):
            continue
        j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("┡"))
        head_lines = lines[i + 1:j]
        cols = [[] for _ in head_lines[0].split("┃")[1:-1]]
        for hl in head_lines:
            for c, cell in zip(cols, hl.split("┃")[1:-1]):
                if cell.strip():
                    c.append(cell.strip())
        end = next(k for k in range(j + 1, len(lines)) if lines[k].startswith("└"))
        rows = [[c.strip() for c in row.split("│")[1:-1]] for row in lines[j + 1:end]]
        out.append({"title": lines[i - 1].strip(), "headers": [" ".join(c) for c in cols],
                    "head_lines": head_lines, "rows": rows,
                    "caption": " ".join(x.strip() for x in lines[end + 1:end + 3])})
    return out


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("run", RUNS)
def test_summary_fits_without_cutting(request, reports, run, width):
    con = Console(record=True, width=width, color_system=None)
    render_terminal(_report(request, reports, run), con)
    text = con.export_text()
    tables = _tables(text)
    assert len(tables) >= 4    # recommendations, breakdown, collectives, stragglers at least
    for t in tables:
        assert not any("…" in line for line in t["head_lines"]), (t["title"], t["head_lines"])
    assert "…" not in text                         # no cell cut either
    assert max(map(len, text.splitlines())) <= width
    bd = next(t for t in tables if "compute" in t["headers"])
    ranks = len(_report(request, reports, run).breakdown.totals)
    assert [r[0] for r in bd["rows"]] == [str(r) for r in range(ranks)]
    # a GPU run's memory copies alone get their column (DLRM: 19 µs per rank)
    copies = bool((_report(request, reports, run).breakdown.totals["memory_only_us"] > 0).any())
    assert copies == (run == "dlrm_8rank_v100")
    full = [h for c in BREAKDOWN for h in ((["memcpy"] if copies else []) + [c]
                                           if c == "idle" else [c])]
    if width == 120:   # everything fits: every column, nothing said to be left out
        assert bd["headers"] == full and "left out at" not in bd["caption"]
    else:              # 80: the timeline kind ("on") goes first, then memcpy; the caption says
        assert bd["headers"] == [h for h in full if h not in ("on", "memcpy")]
        gone = "on, memcpy" if copies else "on"
        assert (f"memcpy = memory copies and sets alone (not idle); left out at 80 columns: "
                f"{gone} (a wider" if copies else f"left out at 80 columns: {gone} (a wider"
                ) in " ".join(text.split())


def test_breakdown_values_at_80_columns(request, reports):
    """The demo's numbers, whole, in their columns at 80 columns."""
    con = Console(record=True, width=80, color_system=None)
    render_terminal(_report(request, reports, "pp_unbalanced_cpu_2rank"), con)
    tables = _tables(con.export_text())
    bd = next(t for t in tables if "compute" in t["headers"])
    assert [dict(zip(bd["headers"], r)) for r in bd["rows"]] == [
        {"rank": "0", "span": "94.968", "compute": "13.689", "overlapped": "0.797",
         "exposed": "75.911", "idle": "4.571", "overlap %": "1.04", "exposed %": "79.9"},
        {"rank": "1", "span": "97.556", "compute": "83.093", "overlapped": "0.000",
         "exposed": "2.583", "idle": "11.880", "overlap %": "0.00", "exposed %": "2.6"}]
    bub = next(t for t in tables if "ideal %" in t["headers"])
    assert bub["headers"] == ["rank", "stages", "steps", "bubble % (median)", "ideal %",
                              "warmup ms", "steady ms", "cooldown ms"]
    assert [r[2] for r in bub["rows"] if r[2]] == ["14", "unprofiled", "14", "unprofiled"]


def test_the_bubbles_phases_are_named_by_the_order_that_ran(request, reports):
    """1F1B starts a backward before its last forward (warmup, steady, cooldown); GPipe ends
    every forward first (forward phase, turn-around, backward phase)."""
    for name, phases in (("pp_1f1b_cpu_2rank", ("warmup", "steady", "cooldown")),
                         ("pp_gpipe_cpu_2rank", ("forward phase", "turn-around",
                                                 "backward phase"))):
        rep = _report(request, reports, name)
        assert rep.pipeline.phase_names == phases
        con = Console(record=True, width=200, color_system=None)
        render_terminal(rep, con)
        bub = next(t for t in _tables(con.export_text()) if "ideal %" in t["headers"])
        assert bub["headers"][-3:] == [f"{n} ms" for n in phases]


def test_fit_columns_drops_least_important_first():
    """Planted widths: 3 columns of 10 need 3·10 + 3·3 + 1 = 40 console columns."""
    from pardiag.analyzer.render.terminal import Col, fit_columns

    cols = [Col("a"), Col("b", drop=1), Col("c", drop=2)]
    rows = [("x" * 10, "y" * 10, "z" * 10)]
    assert fit_columns(cols, rows, 40) == ([0, 1, 2], [10, 10, 10])
    assert fit_columns(cols, rows, 39) == ([0, 1], [10, 10])        # c (drop=2) goes first
    assert fit_columns(cols, rows, 27) == ([0, 1], [10, 10])
    assert fit_columns(cols, rows, 26) == ([0], [10])
    # a header wraps at its spaces, so its longest word sets the least width; spare room widens
    # it back towards one line
    cols = [Col("a long header"), Col("n")]
    assert fit_columns(cols, [("1", "2")], 1 + 6 + 6 + 1) == ([0, 1], [6, 1])
    assert fit_columns(cols, [("1", "2")], 80) == ([0, 1], [13, 1])
