"""The HTML report in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

``make test`` installs Playwright (the ``test`` extra) and, as root with apt, Debian's chromium.
In CI (``CI`` set) a missing driver or browser fails these tests; elsewhere they are skipped.
Screenshots are kept in ``test-artifacts/`` at the repository root (git-ignored).
"""

import dataclasses
import os
import re
import shutil

import pytest
from click.testing import CliRunner

from pardiag.analyzer.render.html import SECTIONS, render_html
from pardiag.analyzer.render.sections import STRUCTURE_SECTIONS
from pardiag.analyzer.report.registry import build_report
from pardiag.analyzer.trace import load_traces
from pardiag.cli import cli

from .paths import REPO
from .synth_report import PAYLOADS, big_run, hostile_recommendations, hostile_run

ARTIFACTS = REPO / "test-artifacts"
#: Figures each shipped sample's report draws.
#: (pp_1f1b_cpu_4rank overlaps nothing: both overlap charts are a sentence instead.)
# the 1F1B pipeline computes while some of its sends are in flight: its overlap charts are drawn
SAMPLES = {"ddp_cpu_2rank": 11, "pp_1f1b_cpu_4rank": 12, "fsdp_tp_2d_cpu_4rank": 11}


def _unavailable(why: str):
    if os.environ.get("CI"):  # CI installs both (make test): never skip there
        pytest.fail(f"{why} (make test installs it)")
    pytest.skip(why)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the Playwright Python package is not installed")
    exe = _chromium()
    if exe is None:
        _unavailable("no chromium browser found")
    with sync_playwright() as p:
        # --no-sandbox: the tests run as root in CI, where Chromium's sandbox refuses to start
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


def _open(browser, path, width=1280):
    """Load a report; return (page, console errors and page errors) once its figures are
    drawn (or failed)."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    errors = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(path.resolve().as_uri())
    page.wait_for_function("document.body.getAttribute('data-plots') !== null", timeout=60_000)
    return page, errors


_PLOTS_JS = """Array.from(document.querySelectorAll('div.pd-plot')).map(d => [
    d.querySelectorAll('svg.main-svg').length,
    d.querySelectorAll('g.trace, g.hm').length,
    d.querySelectorAll('svg.main-svg path, svg.main-svg image, svg.main-svg rect').length])"""


def _check_drawn(page, n_figures):
    assert page.evaluate("document.body.getAttribute('data-plots')") == "drawn"
    plots = page.evaluate(_PLOTS_JS)
    assert len(plots) == n_figures
    for svgs, traces, marks in plots:  # every figure: plotly's SVG with traces and marks in it
        assert svgs >= 1 and traces >= 1 and marks > 0
    headings = page.evaluate("Array.from(document.querySelectorAll('h2')).map(h => h.textContent)")
    assert headings == _headings(page)


def _headings(page) -> list[str]:
    """The page's expected ``<h2>`` titles: every section in order, those about a structure
    the run does not have (``<h3>`` under "Not in this run") last, under that heading."""
    absent = page.evaluate("Array.from(document.querySelectorAll('h2#absent ~ h3'))"
                           ".map(h => h.id)")
    assert set(absent) <= set(STRUCTURE_SECTIONS)
    return ([title for key, title in SECTIONS if key not in absent]
            + (["Not in this run"] if absent else []))


# Every label plotly drew (title, axis titles, tick labels, legend entries, colour bar, notes)
# with its rendered box, per figure, and the box of the figure's SVG.
_LABELS_JS = r"""() => Array.from(document.querySelectorAll('div.pd-plot')).map(d => {
  const svg = d.querySelector('svg.main-svg');
  const b = svg.getBoundingClientRect();
  const labels = [], seen = new Set();
  const add = (kind, sel) => d.querySelectorAll(sel).forEach(e => {
    if (seen.has(e)) { return; }
    seen.add(e);
    const r = e.getBoundingClientRect();
    if (r.width > 0 && r.height > 0 && e.textContent.trim() !== '') {
      labels.push({kind: kind, text: e.textContent, box: [r.left, r.top, r.right, r.bottom]});
    }
  });
  add('title', 'text.gtitle');
  add('axis title', 'g.infolayer text[class$="title"]:not(.gtitle)');
  add('tick', 'g[class$="axislayer-above"] g[class$="tick"] text');
  add('legend', 'g.legend text.legendtext');
  add('colour bar', 'g.colorbar text');
  add('note', 'g.annotation text');
  return {id: d.id, title: (d.querySelector('text.gtitle') || {}).textContent || '',
          box: [b.left, b.top, b.right, b.bottom], labels: labels};
})"""


def _label_problems(fig, tol=1.0):
    """Labels cut by the figure's edge, and pairs of labels whose boxes overlap (more than
    ``tol`` px both ways)."""
    x0, y0, x1, y1 = fig["box"]
    out = [f"cut: {a['kind']} {a['text']!r}" for a in fig["labels"]
           if a["box"][0] < x0 - tol or a["box"][1] < y0 - tol or a["box"][2] > x1 + tol
           or a["box"][3] > y1 + tol]
    labels = fig["labels"]
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            w = min(a["box"][2], b["box"][2]) - max(a["box"][0], b["box"][0])
            h = min(a["box"][3], b["box"][3]) - max(a["box"][1], b["box"][1])
            if w > tol and h > tol:
                out.append(f"overlap: {a['kind']} {a['text']!r} and {b['kind']} {b['text']!r}")
    return out


def _check_labels(page):
    """No label of any figure is cut or overlaps another; returns the figures' labels."""
    figs = page.evaluate(_LABELS_JS)
    problems = {f"{f['id']} ({f['title']})": p for f in figs if (p := _label_problems(f))}
    assert problems == {}
    assert all(f["labels"] for f in figs)
    return figs


def _screenshot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    assert path.stat().st_size > 10_000


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_sample_report_renders(browser, sample, tmp_path):
    out = tmp_path / "report.html"
    res = CliRunner().invoke(cli, ["report", str(REPO / "sample_traces" / sample), "-o", str(out),
                                   "-q"])
    assert res.exit_code == 0, res.output
    page, errors = _open(browser, out)
    assert errors == []
    _check_drawn(page, SAMPLES[sample])
    _check_labels(page)
    _screenshot(page, f"report-{sample}")
    page.close()


def test_tables_sort_on_click(browser, tmp_path):
    out = tmp_path / "report.html"
    assert CliRunner().invoke(cli, ["report", str(REPO / "sample_traces" / "pp_1f1b_cpu_4rank"),
                                    "-o", str(out), "-q"]).exit_code == 0
    page, errors = _open(browser, out)
    table = page.locator("h2#breakdown ~ table.pd-sort").first
    ranks = "t => Array.from(t.tBodies[0].rows).map(r => r.cells[0].textContent)"
    assert table.evaluate(ranks) == ["0", "1", "2", "3"]
    header = table.locator("th").nth(0)
    header.click()  # ascending (already)
    header.click()  # descending
    assert table.evaluate(ranks) == ["3", "2", "1", "0"]
    spans = ("t => Array.from(t.tBodies[0].rows).map(r => parseFloat(r.cells[2]"
             ".getAttribute('data-v')))")
    table.locator("th").nth(2).click()
    v = table.evaluate(spans)
    assert v == sorted(v) and len(v) == 4
    assert errors == []


def test_64_ranks_render(browser, tmp_path):
    run = big_run(tmp_path / "big")
    out = tmp_path / "big.html"
    assert CliRunner().invoke(cli, ["report", str(run), "-o", str(out), "-q"]).exit_code == 0
    assert out.stat().st_size <= 5_000_000
    page, errors = _open(browser, out)
    assert errors == []
    _check_drawn(page, 12)
    heat = page.evaluate("document.querySelectorAll('g.hm').length")
    assert heat == 3  # exposed-comm and idle per rank × step, waits per rank × instance
    _check_labels(page)  # 64 rank labels, 480 instances binned into 200 labelled columns
    _screenshot(page, "report-64-ranks")
    page.close()


def test_hostile_trace_runs_no_script(browser, tmp_path):
    rep = build_report(load_traces(hostile_run(tmp_path)))
    rep = dataclasses.replace(rep, recommendations=hostile_recommendations())
    out = tmp_path / "hostile.html"
    out.write_text(render_html(rep), encoding="utf-8")
    page, errors = _open(browser, out)
    assert errors == []
    _check_drawn(page, 8)  # no overlap planted: both overlap charts are a sentence
    for header in page.locator("table.pd-sort th").all()[:6]:
        header.click()  # the sort script must not bring anything to life either
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('img, iframe, object, embed').length") == 0
    # the only running scripts: the page's own and the plotly.js it unpacked
    assert page.evaluate("document.querySelectorAll('script:not([type])').length") == 2
    # links (HTML or SVG): only the page's own table of contents; no javascript: URL anywhere
    hrefs = page.evaluate("Array.from(document.querySelectorAll('a'))"
                          ".map(a => a.getAttribute('href') || a.getAttribute('xlink:href'))")
    absent = page.evaluate("Array.from(document.querySelectorAll('h2#absent ~ h3'))"
                           ".map(h => h.id)")
    assert absent == ["routing", "efficiency"]   # no MoE, no recorded shapes
    assert hrefs == ["#" + key for key, _ in SECTIONS if key not in absent] + ["#absent"]
    assert page.evaluate("Array.from(document.querySelectorAll('*')).filter(e => "
                         "Array.from(e.attributes).some(a => /^\\s*javascript:/i.test(a.value)))"
                         ".length") == 0
    assert page.evaluate("Array.from(document.querySelectorAll('*')).filter(e => "
                         "Array.from(e.attributes).some(a => a.name.startsWith('on'))).length") == 0
    # the strings are shown as text, not dropped: in tables and in plotly's SVG labels
    text = page.evaluate("document.body.innerText")
    for p in PAYLOADS:
        assert p in text, p
    svg_text = page.evaluate("Array.from(document.querySelectorAll('svg text'))"
                             ".map(t => t.textContent).join('\\n')")
    assert PAYLOADS[0] in svg_text
    _screenshot(page, "report-hostile")
    page.close()


def test_single_rank_report_renders(browser, tmp_path):
    """A report whose later sections have no data still loads cleanly and draws its figures."""
    from .synth import gpu_rank

    gpu_rank(0).write(tmp_path / "r0.json")
    out = tmp_path / "one.html"
    assert CliRunner().invoke(cli, ["report", str(tmp_path), "-o", str(out), "-q"]).exit_code == 0
    page, errors = _open(browser, out)
    assert errors == []
    _check_drawn(page, 6)
    page.close()


#: The report's layout on the demo, pipeline, FSDP2, MoE and a real GPU trace: what each
#: page must show. overlap: the per-rank overlap chart is drawn (else the "no overlap" sentence);
#: dims: the per-dimension chart is "drawn", replaced by the "no overlap" sentence, or "left out"
#: (dimensions unknown); offsets: the clock-offset table (else the note why there is none);
#: instances: columns of the straggler heatmap; bytes: byte counts in the tables.
POLISH = {
    # pipelines: the compute that runs while a send is in flight is overlap (1.0% on rank 0 of
    # the unbalanced one), so their overlap charts are drawn
    "pp_unbalanced_cpu_2rank": dict(overlap=True, dims="drawn", offsets=False,
                                    instances=24, memory=True, bytes={"32,768"}),
    "pp_1f1b_cpu_4rank": dict(overlap=True, dims="drawn", offsets=False, instances=144,
                              memory=True, bytes={"4,096"}),
    "fsdp2_cpu_2rank": dict(overlap=True, dims="drawn", offsets=True, instances=45, memory=True,
                            bytes={"76,840", "1,053,696"}),
    "moe_ep_cpu_2rank": dict(overlap=True, dims="drawn", offsets=True, instances=48,
                             memory=True, bytes=None),
    # hosts unknown: one clock offset per rank, measured on the 8 all-to-alls and all-reduces
    "dlrm_8rank_v100": dict(overlap=True, dims="left out", offsets=True, instances=8,
                            memory=False, bytes={"192", "448", "1,536", "13,568", "24,576",
                                                 "907,840", "1,576,964"}),
}

_SECTION_JS = """key => { const out = []; let e = document.getElementById(key).nextElementSibling;
  while (e && e.tagName !== 'H2') { out.push(e); e = e.nextElementSibling; }
  return {text: out.map(x => x.innerText || '').join('\\n'),
          plots: out.filter(x => x.matches('div.pd-plot')).map(x => x.id),
          heads: out.filter(x => x.tagName === 'TABLE').map(t =>
            Array.from(t.tHead.rows[0].cells).map(c => c.textContent))}; }"""

_BYTES_JS = """() => Array.from(document.querySelectorAll('table')).flatMap(t => {
  if (!t.tHead) { return []; }
  const heads = Array.from(t.tHead.rows[0].cells).map(c => c.textContent);
  return heads.flatMap((h, j) => h.startsWith('bytes') ?
    Array.from(t.tBodies[0].rows).map(r => r.cells[j].textContent) : []); })"""


def _run_path(request, name):
    if (REPO / "sample_traces" / name).is_dir():
        return REPO / "sample_traces" / name
    return request.getfixturevalue("real_traces") / name


@pytest.mark.parametrize("run", sorted(POLISH))
def test_report_reads_whole_and_consistent(browser, run, request, tmp_path):
    """In the browser: no chart of empty bars, no label over another or cut
    (every figure, rendered boxes compared), short heatmap ticks with the full name on hover,
    one byte format, offsets or the reason for none, no per-dimension chart that repeats the
    per-rank one."""
    want = POLISH[run]
    out = tmp_path / "report.html"
    res = CliRunner().invoke(cli, ["report", str(_run_path(request, run)), "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    page, errors = _open(browser, out)
    assert errors == []
    assert page.evaluate("document.body.getAttribute('data-plots')") == "drawn"
    _screenshot(page, f"polish-{run}")
    figs = {f["id"]: f for f in _check_labels(page)}          # items 2 and 3, every figure

    # 1 and 6: overlap charts, or the sentence that says why there is none
    ov = page.evaluate(_SECTION_JS, "overlap")
    titles = [figs[i]["title"] for i in ov["plots"]]
    assert ("Communication overlapped by computation" in titles) == want["overlap"]
    assert ("No overlap: all communication exposed (0% overlapped by computation on every one "
            "of" in ov["text"]) == (not want["overlap"])
    assert ("Overlap per rank and parallel dimension" in titles) == (want["dims"] == "drawn")
    assert ("No overlap: all communication exposed on every dimension" in ov["text"]) == (
        want["dims"] == "no overlap")
    assert ("Overlap per dimension left out: the parallel dimensions are unknown" in ov["text"]
            ) == (want["dims"] == "left out")
    for fid in ov["plots"]:   # a chart that is drawn has bars above 0 %
        assert page.evaluate(f"Math.max(...document.getElementById('{fid}')._fullData"
                             ".flatMap(t => Array.from(t.y)))") > 0

    # 2: the memory legend beside the plot, clear of the "rank" axis title
    mem = page.evaluate(_SECTION_JS, "memory")
    mem_figs = [figs[i] for i in mem["plots"] if figs[i]["title"] == "Memory per rank (MiB)"]
    assert len(mem_figs) == int(want["memory"])
    for f in mem_figs:
        legend = [a for a in f["labels"] if a["kind"] == "legend"]
        rank_title = [a for a in f["labels"] if a["kind"] == "axis title" and a["text"] == "rank"]
        assert sorted(a["text"] for a in legend) == ["gradients", "optimizer state",
                                                     "parameters", "peak"]
        assert len(rank_title) == 1
        assert all(a["box"][0] > rank_title[0]["box"][2] for a in legend)  # right of it

    # 3: heatmap ticks short, at most 16, in order; the hover names the instance in full
    st = page.evaluate(_SECTION_JS, "stragglers")
    heat = [figs[i] for i in st["plots"]]
    assert len(heat) == 1
    ticks = [a["text"] for a in heat[0]["labels"] if a["kind"] == "tick"
             and a["text"].startswith("#")]
    step = int(ticks[1][1:]) if len(ticks) > 1 else 1
    assert ticks == [f"#{i}" for i in range(0, want["instances"], step)] and len(ticks) <= 16
    cells = page.locator(f"#{heat[0]['id']} g.hm image")
    cells.scroll_into_view_if_needed()
    box = cells.bounding_box()
    page.mouse.move(box["x"] + 3, box["y"] + box["height"] - 3)   # first instance, last rank
    hover = page.locator(f"#{heat[0]['id']} g.hoverlayer g.hovertext text.nums")
    hover.wait_for(timeout=5_000)
    text = hover.text_content()
    assert re.fullmatch(r"rank \d+, #0 [a-z_:]+: wait \d+\.\d{3} ms", text), text

    # 4: one byte format: whole numbers with thousands separators everywhere
    cells = page.evaluate(_BYTES_JS)
    assert cells and all(re.fullmatch(r"\d{1,3}(,\d{3})*", c) for c in cells), cells
    if want["bytes"]:
        assert set(cells) == want["bytes"]

    # 5: the clock offsets or why there are none, never both
    has_table = any("offset (µs)" in h for h in st["heads"])
    has_note = "so no clock offsets were estimated" in st["text"]
    assert (has_table, has_note) == (want["offsets"], not want["offsets"])
    if not want["offsets"]:
        assert ("No complete collective spans the ranks here (only point-to-point transfers "
                "were matched), so no clock offsets were estimated: times are compared as "
                "recorded. Every rank ran on one host (vm), which has one clock.") in st["text"]
    page.close()


@pytest.mark.parametrize("run", ["fsdp2_cpu_2rank", "pp_1f1b_cpu_4rank"])
def test_labels_stay_apart_on_a_narrow_window(browser, run, tmp_path):
    """At 800 px the figures shrink, and still no label is cut or overlaps another."""
    out = tmp_path / "report.html"
    assert CliRunner().invoke(cli, ["report", str(REPO / "sample_traces" / run), "-o",
                                    str(out), "-q"]).exit_code == 0
    page, errors = _open(browser, out, width=800)
    assert errors == []
    _check_labels(page)
    _screenshot(page, f"polish-{run}-800px")
    page.close()


# ---------------------------------------------------------------- pardiag compare


def _compare_page(browser, a, b, tmp_path, width=1280, name="compare", extra=()):
    from pardiag.analyzer.render.comparison import COMPARE_SECTIONS

    out = tmp_path / f"{name}.html"
    res = CliRunner().invoke(cli, ["compare", str(a), str(b), "-o", str(out), "-q", *extra])
    assert res.exit_code in (0, 1), res.output
    page, errors = _open(browser, out, width=width)
    assert errors == []
    assert page.evaluate("document.body.getAttribute('data-plots')") == "drawn"
    headings = page.evaluate("Array.from(document.querySelectorAll('h2')).map(h => h.textContent)")
    # neither run a pipeline: that section comes last, saying so
    order = ([s for s in COMPARE_SECTIONS if s[0] != "pipeline"]
             + [s for s in COMPARE_SECTIONS if s[0] == "pipeline"]
             if "Neither run is a pipeline." in page.content() else list(COMPARE_SECTIONS))
    assert headings == [title for _, title in order]
    plots = page.evaluate(_PLOTS_JS)
    for svgs, traces, marks in plots:
        assert svgs >= 1 and traces >= 1 and marks > 0
    return page, plots


@pytest.mark.parametrize("width", [1280, 800])
def test_compare_page_renders(browser, tmp_path, width):
    """The planted pair: step, breakdown (A | B panels), memory, collectives and operators
    charts (no overlap anywhere: a sentence instead), no label cut or over another."""
    from .synth_compare import ddp_run

    a = ddp_run(tmp_path / "a", compute_us=600, late_us=200, env={"NCCL_DEBUG": "INFO"})
    b = ddp_run(tmp_path / "b", compute_us=500, late_us=0, static_bytes=2_000_000,
                env={"NCCL_DEBUG": "WARN"})
    page, plots = _compare_page(browser, a, b, tmp_path, width=width,
                                extra=("--fail-if-slower", "5"))
    figs = {f["title"] for f in _check_labels(page)}
    assert figs == {"Step time per step (ms)", "Mean profiled step per rank or role (ms)",
                    "Memory per rank or role (MiB)",
                    "Time per collective type per rank and step (ms)",
                    "Operators that moved most: B − A per rank and step (ms)"}
    text = page.evaluate("document.body.innerText")
    assert "B's step is 32.8% faster than A's: 0.61 vs 0.92 ms" in text
    assert "B made the change A's report recommended first (if rank 1 were not slow" in text
    assert "pass: B's step is 32.8% faster" in text
    assert "No overlap in either run" in text
    # the checked recommendation's table: A measured, predicted, B measured
    table = page.locator("h2#checks ~ table").first
    heads = table.evaluate("t => Array.from(t.tHead.rows[0].cells).map(c => c.textContent)")
    assert heads[:6] == ["A's recommendation #", "change", "A measured (ms)", "predicted (ms)",
                         "B measured (ms)", "error %"]
    row = table.evaluate("t => Array.from(t.tBodies[0].rows[0].cells).map(c => c.textContent)")
    assert row[0] == "1" and row[2] == "0.915" and row[4] == "0.615"
    # sortable: the per-rank table sorts by B's step on a click
    ranks = page.locator("h2#breakdown ~ table.pd-sort").first
    first_col = "t => Array.from(t.tBodies[0].rows).map(r => r.cells[0].textContent)"
    assert ranks.evaluate(first_col) == ["rank 0", "rank 1"]
    ranks.locator("th").nth(0).click()
    ranks.locator("th").nth(0).click()
    assert ranks.evaluate(first_col) == ["rank 1", "rank 0"]
    _screenshot(page, f"compare-planted-{width}px")
    page.close()


def test_compare_page_runs_no_script(browser, tmp_path):
    """Script arguments and environment values are shown as text, never run."""
    from .synth_compare import ddp_run

    a = ddp_run(tmp_path / "a", compute_us=600, late_us=0, script_args=list(PAYLOADS),
                env={"NCCL_DEBUG": PAYLOADS[1]})
    b = ddp_run(tmp_path / "b", compute_us=500, late_us=0, env={"NCCL_DEBUG": PAYLOADS[0]})
    page, _ = _compare_page(browser, a, b, tmp_path, name="hostile")
    for header in page.locator("table.pd-sort th").all()[:6]:
        header.click()
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('img, iframe, object, embed').length") == 0
    assert page.evaluate("document.querySelectorAll('script:not([type])').length") == 2
    text = page.evaluate("document.body.innerText")
    for p in PAYLOADS:
        assert p in text, p
    page.close()


def test_demo_comparison_renders(browser, tmp_path):
    """The comparison `make demo` writes: the unbalanced pipeline against the run recorded
    right after it with its top recommendation applied (2 microbatches instead of 4)."""
    samples = REPO / "sample_traces"
    page, plots = _compare_page(browser, samples / "pp_before_cpu_2rank",
                                samples / "pp_after_cpu_2rank", tmp_path, name="demo")
    # step, breakdown, overlap per dimension, bubbles, memory, collectives, operators
    assert len(plots) == 7
    _check_labels(page)
    text = page.evaluate("document.body.innerText")
    assert ("B made the change A's report recommended first (microbatches 2 of 64 samples (same "
            "global batch)): predicted step 28.690 ms, measured 27.529 ms (error +4.2%).") in text
    _screenshot(page, "compare-demo")
    page.close()
