"""The HTML report in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

``make test`` installs Playwright (the ``test`` extra) and, as root with apt, Debian's chromium.
In CI (``CI`` set) a missing driver or browser fails these tests; elsewhere they are skipped.
Screenshots are kept in ``test-artifacts/`` at the repository root (git-ignored).
"""

import os
import shutil

import pytest
from click.testing import CliRunner

from pardiag.analyzer.load import load_traces
from pardiag.analyzer.registry import build_report
from pardiag.analyzer.render_html import SECTIONS, render_html
from pardiag.cli import cli
from synth_report import PAYLOADS, big_run, hostile_recommendations, hostile_run

from conftest import REPO

ARTIFACTS = REPO / "test-artifacts"
#: Figures each shipped sample's report draws.
SAMPLES = {"ddp_cpu_2rank": 8, "pp_1f1b_cpu_4rank": 9, "fsdp_tp_2d_cpu_4rank": 8}


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
    assert headings == [title for _, title in SECTIONS]


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
    _check_drawn(page, 10)
    heat = page.evaluate("document.querySelectorAll('g.hm').length")
    assert heat == 3  # exposed-comm and idle per rank × step, waits per rank × instance
    _screenshot(page, "report-64-ranks")
    page.close()


def test_hostile_trace_runs_no_script(browser, tmp_path):
    rep = build_report(load_traces(hostile_run(tmp_path)))
    rep.results["recommendations"] = hostile_recommendations()
    out = tmp_path / "hostile.html"
    out.write_text(render_html(rep), encoding="utf-8")
    page, errors = _open(browser, out)
    assert errors == []
    _check_drawn(page, 6)  # no overlap planted: both overlap charts are a sentence
    for header in page.locator("table.pd-sort th").all()[:6]:
        header.click()  # the sort script must not bring anything to life either
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('img, iframe, object, embed').length") == 0
    # the only running scripts: the page's own and the plotly.js it unpacked
    assert page.evaluate("document.querySelectorAll('script:not([type])').length") == 2
    # links (HTML or SVG): only the page's own table of contents; no javascript: URL anywhere
    hrefs = page.evaluate("Array.from(document.querySelectorAll('a'))"
                          ".map(a => a.getAttribute('href') || a.getAttribute('xlink:href'))")
    assert hrefs == ["#" + key for key, _ in SECTIONS]
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
    from synth import gpu_rank

    gpu_rank(0).write(tmp_path / "r0.json")
    out = tmp_path / "one.html"
    assert CliRunner().invoke(cli, ["report", str(tmp_path), "-o", str(out), "-q"]).exit_code == 0
    page, errors = _open(browser, out)
    assert errors == []
    _check_drawn(page, 3)
    page.close()
