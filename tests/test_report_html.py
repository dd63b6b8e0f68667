"""The HTML page without a browser: size at scale, --cdn, escaping, recommendations, terminal."""

import base64
import dataclasses
import gzip
import html
import re

import pytest
from click.testing import CliRunner
from plotly.offline import get_plotlyjs
from rich.console import Console

from pardiag.analyzer.analyses.dim_overlap import compute_dim_overlap
from pardiag.analyzer.predict.recommend import Recommendation, RecommendationResult
from pardiag.analyzer.render.html import SECTIONS, render_html
from pardiag.analyzer.render.page import PLOTLY_CDN_URL
from pardiag.analyzer.render.terminal import render_terminal
from pardiag.analyzer.report.registry import build_report
from pardiag.analyzer.trace import load_traces
from pardiag.cli import cli

from .paths import REPO
from .synth import TraceBuilder, record, write_sidecar
from .synth_report import PAYLOADS, big_run, hostile_recommendations, hostile_run


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return big_run(tmp_path_factory.mktemp("big") / "run")


def _report(*args):
    res = CliRunner().invoke(cli, ["report", *map(str, args), "-q"])
    assert res.exit_code == 0, res.output
    return res


def test_64_ranks_10_steps_fit_in_5_mb_and_say_what_was_reduced(big, tmp_path):
    out = tmp_path / "big.html"
    _report(big, "-o", out)
    size = out.stat().st_size
    assert size <= 5_000_000, size
    page = out.read_text()
    for note in ("Per-step chart aggregated: 64 ranks × 10 steps (640 bars) is more than 400, so "
                 "the bars show the mean over ranks per step",
                 "Straggler heatmap binned: 480 instances are shown as 200 columns",
                 "Memory timeline sampled: the 16 ranks of 64 with the highest peak are drawn",
                 "Showing 200 of 480 instances (largest arrival skew first)."):
        assert (page.count(html.escape(note, quote=True))
                == (2 if "Showing" not in note else 1)), note
    # every rank is in the per-rank table (64 rows after the header)
    breakdown = page.split("<h2 id='breakdown'>")[1].split("<h2 id='overlap'>")[0]
    table = breakdown.split("<table")[1]
    assert table.count("<tr>") == 65
    # rank 13 arrives 40 µs late to each of its 60 collectives; 7 others wait for it each time:
    # tp group 8..15 waits 280 µs per all-reduce (× 40), dp group 5, 13, ..., 61 290 µs (× 20)
    assert ("The rank the others wait for most: <b>rank 13</b> (17.000 ms of others' waiting; "
            "last to arrive in 60 instances)") in page
    # both dimensions of the dp × tp layout get their own overlap figures and rows
    overlap = page.split("<h2 id='overlap'>")[1].split("<h2 id='stragglers'>")[0]
    assert ">dp</td>" in overlap and ">tp</td>" in overlap


def test_a_bandwidth_scatter_of_more_instances_than_it_shows_is_sampled(big, tmp_path,
                                                                         monkeypatch):
    """More sized instances than the scatter's limit: every stride-th of each collective is
    drawn, and the page says how many of how many (it raised a KeyError under pandas 3)."""
    from pardiag.analyzer.render import sections
    monkeypatch.setattr(sections, "BANDWIDTH_MAX_POINTS", 50)
    out = tmp_path / "big.html"
    _report(big, "-o", out, "--no-cache")
    got = re.search(r"Bandwidth scatter sampled: (\d+) of (\d+) instances", out.read_text())
    assert got, "no sampling note"
    kept, total = int(got[1]), int(got[2])
    stride = -(-total // 50)
    assert total > 50 and total / stride - 2 <= kept <= 50 + 2   # two collective types


def test_cdn_page_is_small_and_links_plotly(big, tmp_path):
    out = tmp_path / "cdn.html"
    _report(big, "-o", out, "--cdn")
    page = out.read_text()
    assert out.stat().st_size < 1_000_000
    assert page.count(f'<script src="{PLOTLY_CDN_URL}" charset="utf-8"></script>') == 1
    assert PLOTLY_CDN_URL.startswith("https://cdn.plot.ly/plotly-")
    assert 'id="pd-plotlyjs"' not in page


def test_inlined_plotly_is_the_bundled_one(tmp_path):
    out = tmp_path / "r.html"
    _report(REPO / "sample_traces" / "ddp_cpu_2rank", "-o", out)
    page = out.read_text()
    packed = re.search(r'<script type="application/octet-stream" id="pd-plotlyjs">([^<]*)</script>',
                       page).group(1)
    assert gzip.decompress(base64.b64decode(packed)).decode() == get_plotlyjs()
    assert re.search(r"<script[^>]*\bsrc=", page) is None  # nothing fetched: works offline


def _scripts(page):
    return re.findall(r"<script[^>]*>", page)


def test_hostile_strings_are_escaped_in_the_source(tmp_path):
    rep = build_report(load_traces(hostile_run(tmp_path)))
    rep = dataclasses.replace(rep, recommendations=hostile_recommendations())
    page = render_html(rep)
    # only the page's own script elements: figure/template JSON, packed plotly.js, the boot script
    tags = _scripts(page)
    n_figs = page.count('<div class="pd-plot"')
    # its communication never overlaps: both overlap charts are a sentence; + where the step
    # goes on the host (a CPU run: no device chart); the critical path of a step
    assert n_figs == 8
    assert tags.count("<script>") == 1
    assert sum(t.startswith('<script type="application/json" id="pd-') for t in tags) == n_figs + 1
    assert len(tags) == n_figs + 3
    for raw in ("<script>window", "<img", "<a href=\"javascript", "href=\"javascript",
                "href='javascript"):
        assert raw not in page, raw
    # each payload is on the page, escaped: in tables, title, verdict and recommendations
    for p in PAYLOADS:
        assert html.escape(p, quote=True) in page, p
    verdict = page.split("<h2 id='verdict'>")[1].split("<h2 id='summary'>")[0]
    assert f"verdict {html.escape(PAYLOADS[1], quote=True)}" in verdict
    assert f"<b>Fix {html.escape(PAYLOADS[0], quote=True)}</b>" in verdict


def _planted_rec(**kw):
    base = dict(kind="microbatches", title="More microbatches", change="microbatches 16",
                evidence=("bubble 48% of the step",), caveats=("activations grow",),
                measured_step_us=40_000.0, predicted_step_us=30_000.0, gain_pct=25.0,
                measured_peak_bytes=float(512 << 20), predicted_peak_bytes=float(640 << 20),
                tier=1)
    return Recommendation(**(base | kw))


def test_verdict_and_recommendations_come_first():
    rep = build_report(load_traces(REPO / "sample_traces" / "ddp_cpu_2rank"))
    rep = dataclasses.replace(rep, recommendations=RecommendationResult(
        verdict="Exposed communication is 63% of the step.",
        recommendations=(_planted_rec(), _planted_rec(title="Overlap the all-reduce", tier=2,
                                                       change="bucket_cap_mb 100", gain_pct=5.0,
                                                       predicted_step_us=38_000.0,
                                                       measured_peak_bytes=None,
                                                       predicted_peak_bytes=None)),
        rejected=(_planted_rec(fits_memory=False),)))
    page = render_html(rep, include_plotlyjs="cdn")
    heads = re.findall(r"<h2 id='(\w+)'>", page)
    assert heads == [k for k, _ in SECTIONS if k not in ("pipeline", "routing")] + ["absent"]
    assert heads[0] == "verdict"
    verdict = page.split("<h2 id='verdict'>")[1].split("<h2 id='summary'>")[0]
    assert "<p class='verdict'>Exposed communication is 63% of the step.</p>" in verdict
    rows = re.findall(r"<tr><td>(\d)</td><td class='l'><b>([^<]*)</b></td><td class='l'>([^<]*)"
                      r"</td><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>", verdict)
    assert rows == [("1", "More microbatches", "microbatches 16", "40.000 → 30.000", "25.0",
                     "512.0 → 640.0"),
                    ("2", "Overlap the all-reduce", "bucket_cap_mb 100", "40.000 → 38.000", "5.0",
                     "– → –")]
    assert "<li>bubble 48% of the step</li>" in verdict and "<li>activations grow</li>" in verdict
    # folded under each row, so that a row is one line tall on a narrow window
    assert verdict.count("<details><summary>1 evidence, 1 caveat(s)</summary><b>Evidence</b>"
                         "<ul><li>bubble 48% of the step</li></ul>") == 2
    # every change evaluated appears once: the one not recommended with its reason
    assert "<h3>Evaluated and not recommended</h3>" in verdict


@pytest.mark.parametrize("result, text", [
    (None, "No recommendations computed."),
    (RecommendationResult(verdict="Nothing to gain.", why_none="no traces with steps"),
     "no traces with steps"),
])
def test_no_recommendations_says_why(result, text):
    rep = build_report(load_traces(REPO / "sample_traces" / "ddp_cpu_2rank"))
    rep = dataclasses.replace(rep, recommendations=result)
    verdict = render_html(rep, include_plotlyjs="cdn").split("<h2 id='verdict'>")[1].split("<h2")[0]
    assert f"<p class='muted'>{text}</p>" in verdict
    assert "<table" not in verdict


def test_terminal_prints_verdict_and_recommendations_first(tmp_path):
    TraceBuilder(rank=0, backend="gloo").step(1, 0, 100).cpu("aten::mm", 0, 50).cpu(
        "gloo:[/bold]odd", 50, 20, tid=2, cat="user_annotation").write(tmp_path / "r0.json")
    rep = build_report(load_traces(tmp_path))
    rep = dataclasses.replace(rep, recommendations=RecommendationResult(
        verdict="Idle is 30% of the step [bold].", recommendations=(_planted_rec(title="[red]x"),),
        noise_us=1500.0))
    con = Console(record=True, width=200, color_system=None)
    render_terminal(rep, con)
    lines = con.export_text().splitlines()
    assert lines[0] == "Verdict: Idle is 30% of the step [bold]."
    # the critical path's sentence: one rank, its step of 100 µs, 50 of them computing
    assert lines[1] == ("Critical path of the profiled steps (1; path 0.10 ms median, of a 0.10 "
                        "ms profiled step: 100%): 50% rank 0's computation, 50% rank 0's time "
                        "outside computation.")
    assert lines[2].strip() == "Top recommendations (1 of 1)"
    row = next(line for line in lines if "[red]x" in line)
    assert [c.strip() for c in row.split("│")[1:-1]] == [
        "1", "[red]x", "microbatches 16", "40.000 ±1.500 → 30.000", "25.0", "512.0 → 640.0"]
    assert any("[/bold]odd" in line for line in lines)  # a trace name, shown as written


def test_terminal_wraps_a_long_change_instead_of_cutting_it(tmp_path):
    """On 80 columns the change — what the user types — is folded over lines, never cut."""
    TraceBuilder(rank=0, backend="gloo").step(1, 0, 100).cpu("aten::mm", 0, 50).write(
        tmp_path / "r0.json")
    rep = build_report(load_traces(tmp_path))
    change = "FSDP sharding_strategy=ShardingStrategy.SHARD_GRAD_OP"
    rep = dataclasses.replace(rep, recommendations=RecommendationResult(
        verdict="v", recommendations=(_planted_rec(change=change),)))
    con = Console(record=True, width=80, color_system=None)
    render_terminal(rep, con)
    text = con.export_text().split("step time and peak memory")[0]   # the first table
    cells = [line.split("│")[3].strip() for line in text.splitlines() if line.startswith("│")]
    assert "".join(cells) == change.replace(" ", "")   # every character shown, in order
    assert "…" not in con.export_text()


def test_overlap_per_dimension_planted(tmp_path):
    """Two ranks compute [0, 100); their tp all-reduce [50, 150) is half hidden, their dp
    all-reduce [200, 300) not at all."""
    groups = [{"name": "tp0", "desc": "mesh_tp", "ranks": [0, 1], "dim": "tp"},
              {"name": "dp0", "desc": "mesh_dp", "ranks": [0, 1], "dim": "dp"}]
    for r in range(2):
        b = TraceBuilder(rank=r, backend="gloo")
        b.thread_name(1, "thread 1 (python3)").thread_name(2, "thread 2 (pt_gloo_runloop)")
        b.step(1, 0, 400).cpu("aten::mm", 0, 100)
        b.cpu("gloo:all_reduce", 50, 100, tid=2, cat="user_annotation")
        b.cpu("gloo:all_reduce", 200, 100, tid=2, cat="user_annotation")
        b.write(tmp_path / f"rank{r}.trace.json.gz", gz=True)
        write_sidecar(tmp_path / f"rank{r}.comms.json", "comms", r, {
            "process_groups": groups,
            "records": [record("all_reduce", 1, 50, 150, pg="tp0", ranks=(0, 1)),
                        record("all_reduce", 1, 200, 300, pg="dp0", ranks=(0, 1))]})
    rep = build_report(load_traces(tmp_path))
    res = compute_dim_overlap(rep.traces, rep.results["sync"], rep.results["layout"])
    got = [tuple(r) for r in res.per_rank[["rank", "dim", "comm_us", "overlap_us", "exposed_us",
                                           "overlap_pct"]].itertuples(index=False)]
    assert got == [(0, "dp", 100.0, 0.0, 100.0, 0.0), (0, "tp", 100.0, 50.0, 50.0, 50.0),
                   (1, "dp", 100.0, 0.0, 100.0, 0.0), (1, "tp", 100.0, 50.0, 50.0, 50.0)]
    assert list(res.summary["overlap_pct"]) == [0.0, 50.0]
    page = render_html(rep, include_plotlyjs="cdn")
    overlap = page.split("<h2 id='overlap'>")[1].split("<h2 id='stragglers'>")[0]
    rows = [[dim, *re.findall(r">([^<]*)</td>", cells)] for dim, cells in
            re.findall(r'<tr><td class="l">(\w+)</td>(.*?)</tr>', overlap)]
    assert rows == [["dp", "2", "0.100", "0.100", "0.00"], ["tp", "2", "0.100", "0.050", "50.00"]]


def test_sections_without_data_say_why(tmp_path):
    """One GPU rank: no other rank, no groups, no memory, no pipeline — each section says why."""
    from .synth import gpu_rank

    b = gpu_rank(0)
    b.world_size = 1
    b.write(tmp_path / "r0.json")
    page = render_html(build_report(load_traces(tmp_path)), include_plotlyjs="cdn")
    parts = re.split(r"<h[23] id='(\w+)'>", page)
    sections = dict(zip(parts[1::2], parts[2::2]))
    # no pipeline, no MoE, no shapes: their sections come last, under "Not in this run", saying
    # why
    assert list(sections) == [k for k, _ in SECTIONS
                              if k not in ("pipeline", "routing", "efficiency")] + [
        "absent", "pipeline", "routing", "efficiency"]
    assert "<h2 id='absent'>Not in this run</h2>" in page
    why = {
        "overlap": "Overlap per dimension unavailable: no collective was matched across ranks, "
                   "so communication cannot be attributed to process groups.",
        "stragglers": "No collective was found on two or more ranks: synchronization across "
                      "ranks cannot be measured (a single rank, or no communication).",
        "pipeline": "No pipeline parallelism detected (no schedule records and no "
                    "point-to-point traffic).",
        "imbalance": "Imbalance needs two or more ranks with profiler steps.",
        "memory": "No memory information: the traces have no memory events and no pardiag "
                  "metadata (profile with pardiag for static memory).",
        "layout": "No layout information in these traces (no pardiag metadata and no "
                  "process-group configuration).",
        "bandwidth": "No collective was matched across ranks (a single rank, or no "
                     "communication), so no bandwidth can be measured.",
        "warnings": "None.",
        "efficiency": "No FLOPs counted: the traces record no shapes of matmul, convolution or "
                      "attention ops (profile with record_shapes=True; pardiag profile does).",
    }
    for key, text in why.items():
        assert f"<p class='muted'>{html.escape(text, quote=True)}</p>" in sections[key], key
    # breakdown, per step, overlap per rank, where the step goes on the host and the device,
    # the critical path (one rank: its step window)
    assert page.count('<div class="pd-plot"') == 6


def test_packed_plotlyjs_is_compressed_once_per_version(tmp_path, monkeypatch):
    """The page's packed plotly.js is compressed at first use into the user's cache folder and
    read from there after; where that folder cannot be written, it is compressed in memory."""
    import base64
    import gzip

    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    from pardiag.analyzer.render import page

    monkeypatch.setenv("PARDIAG_CACHE_DIR", str(tmp_path / "cache"))
    page._packed_plotlyjs.cache_clear()
    packed = page._packed_plotlyjs()
    assert gzip.decompress(base64.b64decode(packed)).decode() == get_plotlyjs()
    kept = tmp_path / "cache" / f"plotly-{get_plotlyjs_version()}.min.js.gz.b64"
    assert kept.read_text() == packed and [p.name for p in kept.parent.iterdir()] == [kept.name]
    kept.write_text("c2VlbiBmcm9tIHRoZSBjYWNoZQ==")   # read back, not compressed again
    page._packed_plotlyjs.cache_clear()
    assert page._packed_plotlyjs() == "c2VlbiBmcm9tIHRoZSBjYWNoZQ=="
    (tmp_path / "file").write_text("")   # a cache folder that cannot be made
    monkeypatch.setenv("PARDIAG_CACHE_DIR", str(tmp_path / "file" / "cache"))
    page._packed_plotlyjs.cache_clear()
    assert page._packed_plotlyjs() == packed
    page._packed_plotlyjs.cache_clear()


@pytest.mark.parametrize("run", ["big", "pp_1f1b_cpu_4rank", "moe_ep_cpu_2rank",
                                 "ddp_cpu_2rank"])
def test_every_figure_is_already_what_plotly_validates(run, big, tmp_path):
    """The report writes its figures as plain dicts: each must be exactly what plotly's figure
    objects make of it (no unknown property, no value plotly would coerce), so the page draws
    what ``rep.figures`` shows. Covers every figure kind: the big run has the per-step mean,
    both heatmaps and a binned straggler heatmap; the pipeline its schedule; the MoE run its
    routing subplots."""
    from benchmarks.json_unchanged import page_specs, plain, validated

    folder = big if run == "big" else REPO / "sample_traces" / run
    out = tmp_path / "r.html"
    _report(folder, "-o", out)
    figs = page_specs(out.read_text())
    assert len(figs) >= 6
    titles = []
    for spec in figs:
        assert plain(validated(spec)) == plain(spec)
        titles.append(spec["layout"]["title"]["text"])
    expected = {"big": ["per profiler step (mean over ranks)", "Exposed communication per rank",
                        "Idle per rank", "instances binned"],
                "pp_1f1b_cpu_4rank": ["Pipeline schedule of step"],
                "moe_ep_cpu_2rank": ["MoE routing"],
                "ddp_cpu_2rank": ["Bus bandwidth", "critical path across ranks"]}[run]
    for part in expected:
        assert any(part in t for t in titles), (part, titles)


def test_template_is_kept_per_plotly_version(tmp_path, monkeypatch):
    """The page's plotly template is built through plotly once and then read from the user's
    cache folder; a damaged cache file is built again."""
    import json

    import plotly
    import plotly.io as pio

    from pardiag.analyzer.render import page

    monkeypatch.setenv("PARDIAG_CACHE_DIR", str(tmp_path / "cache"))
    page.template_json.cache_clear()
    built = json.loads(page.template_json())
    assert built == json.loads(pio.to_json(pio.templates["plotly"].layout))
    kept = tmp_path / "cache" / f"plotly-{plotly.__version__}-template.json"
    kept.write_text('{"seen": "from the cache"}')
    page.template_json.cache_clear()
    assert json.loads(page.template_json()) == {"seen": "from the cache"}
    kept.write_text('{"half')
    page.template_json.cache_clear()
    assert json.loads(page.template_json()) == built
    page.template_json.cache_clear()


def test_the_page_is_rendered_from_templates(tmp_path, monkeypatch):
    """Every section has its template (``templates/sections/KEY.html``) and the page is what
    they render: a planted template shows up in its section, and template text is escaped
    the page's one way (``html.escape``: ``&#x27;``, not markupsafe's ``&#39;``)."""
    import jinja2
    from markupsafe import Markup

    from pardiag.analyzer.render import page as kit
    from pardiag.analyzer.render.html import HTA_SECTION

    folder = REPO / "analyzer" / "render" / "templates"
    keys = {k for k, _ in SECTIONS} | {HTA_SECTION[0]}
    assert {p.stem for p in (folder / "sections").glob("*.html")} == keys
    warnings = kit.TEMPLATES.get_template("sections/warnings.html")
    got = warnings.render(s={"warnings": ["it's <b>"], "notes": ["a & b"], "shown": Markup("")})
    assert "".join(got.split("\n")) == (
        "<ul><li class='warn'>it&#x27;s &lt;b&gt;</li><li class='muted'>a &amp; b</li></ul>")
    assert warnings.render(s={"warnings": [], "notes": []}).strip() == (
        "<p class='muted'>None.</p>")
    with pytest.raises(jinja2.UndefinedError):   # a name the builder did not give is an error
        kit.TEMPLATES.get_template("sections/memory.html").render(s={"known": True})

    from .synth import gpu_rank

    gpu_rank(0).write(tmp_path / "r0.json")
    rep = build_report(load_traces(tmp_path))
    planted = jinja2.DictLoader({"sections/warnings.html": "<p>planted {{ s.warnings|length }}"
                                                           " warnings</p>"})
    monkeypatch.setattr(kit.TEMPLATES, "loader", jinja2.ChoiceLoader([planted,
                                                                     kit.TEMPLATES.loader]))
    kit.TEMPLATES.cache.clear()
    try:
        page = render_html(rep, include_plotlyjs="cdn")
    finally:
        monkeypatch.undo()
        kit.TEMPLATES.cache.clear()
    tail = page.split("<h2 id='warnings'>Warnings and notes</h2>")[1]
    assert tail.lstrip().startswith(f"<p>planted {len(rep.traces.warnings)} warnings</p>")
    path = render_html(rep, include_plotlyjs="cdn").split("<h2 id='critical_path'>")[1]
    assert "&#x27;Other&#x27; work is host time" in path


def test_page_shows_the_pipeline_analysis_gaps_and_step(tmp_path):
    """The Gantt chart draws the step the analysis chose (step 2 of the planted GPipe run) and
    its bubbles (:attr:`PipelineResult.gaps`), in ms from the step's first forward: rank 0
    idles [0.02, 0.05), rank 1 [0, 0.01) and [0.07, 0.09)."""
    from benchmarks.json_unchanged import page_specs, plain

    from .test_parallel_analyses import pipeline_run

    rep = build_report(pipeline_run(tmp_path))
    assert rep.pipeline.typical_step == 2
    specs = page_specs(render_html(rep, include_plotlyjs="cdn"))
    gantt = next(plain(s) for s in specs
                 if s["layout"]["title"]["text"].startswith("Pipeline schedule of step 2"))
    red = gantt["data"][0]
    assert red["name"] == "bubble (idle in the step window)"
    bars = sorted(zip(red["y"], (round(b, 6) for b in red["base"]),
                      (round(x, 6) for x in red["x"])))
    assert bars == [("rank 0 · stage 0", 0.02, 0.03), ("rank 1 · stage 1", 0.0, 0.01),
                    ("rank 1 · stage 1", 0.07, 0.02)]


def test_layout_table_shows_the_busbw_per_group(tmp_path):
    """The layout's group table takes its busbw from :attr:`SyncResult.group_busbw`: group 0's
    four all-reduces of 1 MB in 50 µs on 3 ranks, 80/3 GB/s each."""
    from .test_parallel_analyses import straggler_run

    rep = build_report(straggler_run(tmp_path))
    layout = render_html(rep, include_plotlyjs="cdn").split("<h2 id='layout'>")[1].split(
        "<h2 ")[0]
    row = re.search(r"<tr><td class=\"l\">0</td>(.*?)</tr>", layout).group(1)
    cells = re.findall(r">([^<]*)</td>", row)
    assert cells[-3:] == ["26.667", "26.667", "4"]


def test_small_overlaps_are_drawn_as_bars_not_a_flat_line():
    """A pipeline overlaps ~1% of its transfers: on a 0–100 axis its bars are a flat line. The
    axis then ends near the largest bar (1.25 × it, rounded up), every bar carries its value,
    and a large overlap keeps the 0–100 axis."""
    import pandas as pd

    from pardiag.analyzer.render.figures import dim_overlap_figure, overlap_figure, pct_axis
    assert pct_axis([1.054, 0.0]) == [0, 2.0]
    assert pct_axis([0.2]) == [0, 1.0] and pct_axis([]) == [0, 1.0]
    assert pct_axis([12.0, 3.0]) == [0, 15.0] and pct_axis([30.0]) == [0, 100]
    totals = pd.DataFrame({"rank": [0, 1], "overlap_pct": [1.054, 0.0]})
    fig = overlap_figure(totals)
    assert fig["layout"]["yaxis"]["range"] == [0, 2.0]
    assert fig["data"][0]["text"] == ["1.1%", "0.0%"]
    per = pd.DataFrame({"rank": [0, 1, 0, 1], "dim": ["dp", "dp", "pp", "pp"],
                        "overlap_pct": [60.0, 40.0, 1.0, 0.5], "exposed_us": [1e3] * 4})
    dfig = dim_overlap_figure(per)
    assert dfig["layout"]["yaxis"]["range"] == [0, 100]
    assert [d["text"] for d in dfig["data"]] == [["60.0%", "40.0%"], ["1.0%", "0.5%"]]


def test_a_slow_export_step_does_not_flatten_the_run_chart():
    """The step after the profiling window exports the trace (~1 s against 20 ms steps): it is
    drawn, but the axis ends at 1.25 × the longest other step and a note names it; with no
    such step the axis starts at zero and ends where plotly puts it."""
    import pandas as pd

    from pardiag.analyzer.render.figures import off_scale_steps, run_steps_figure
    rows = [(r, k, 20_000.0 + 1_000 * r + 100 * k, 3 <= k < 6) for r in (0, 1)
            for k in range(1, 10)]
    rows = [(r, k, 1_187_000.0 if k == 6 else p, on) for r, k, p, on in rows]
    rs = pd.DataFrame(rows, columns=["rank", "step", "period_us", "profiled"])
    assert off_scale_steps(rs).to_dict() == {6: 1_187_000.0}
    fig = run_steps_figure(rs)
    # the longest other step: rank 1, step 9, 21.9 ms
    assert fig["layout"]["yaxis"]["range"] == [0.0, pytest.approx(21.9 * 1.25)]
    assert fig["layout"]["annotations"][0]["text"] == "off the scale: step 6 (1,187.0 ms)"
    calm = rs[rs["step"] != 6]
    assert off_scale_steps(calm).empty
    fig = run_steps_figure(calm)
    assert "range" not in fig["layout"]["yaxis"] and fig["layout"]["annotations"] == []
    # every step slow alike: nothing is off the scale
    assert off_scale_steps(rs.assign(period_us=1e6)).empty
