"""The Python API (pardiag.analyze -> pardiag.Report): the README's session runs as written,
and the API's tables, JSON and HTML equal what the command line writes."""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go
import pytest
from click.testing import CliRunner

import pardiag
from pardiag.cli import cli, main

from .paths import REPO
from .synth import gpu_rank

SLOW = REPO / "sample_traces" / "ddp_slowrank1_cpu_2rank"


def _readme_session() -> str:
    text = (REPO / "README.md").read_text()
    block = text.split("### Python API (notebooks)")[1].split("```python\n")[1].split("```")[0]
    assert "pardiag.analyze(" in block
    return block


def test_the_readme_session_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sample_traces").symlink_to(REPO / "sample_traces")
    ns: dict = {}
    exec(compile(_readme_session(), "README.md", "exec"), ns)
    rep = ns["rep"]
    assert isinstance(rep, pardiag.Report)
    assert ns["straggler"] == 1            # the planted 20 ms sleep is on rank 1
    assert isinstance(ns["fig"], go.Figure)
    assert (tmp_path / "report.html").stat().st_size > 1_000_000
    assert ns["summary"]["sync"]["straggler"] == 1
    assert rep.verdict.startswith("Step ")


def test_api_tables_equal_the_cli_json(tmp_path):
    rep = pardiag.analyze(SLOW, cache=False)
    out = tmp_path / "s.json"
    res = CliRunner().invoke(cli, ["report", str(SLOW), "-q", "--no-cache", "--json", str(out),
                                   "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    cli_json = json.loads(out.read_text())
    api_json = json.loads(json.dumps(rep.to_json()))
    for key in ("ranks", "sync", "layout", "verdict", "recommendations", "imbalance", "memory"):
        assert api_json[key] == cli_json[key], key
    totals = {r["rank"]: r["total"] for r in cli_json["ranks"]}
    for row in rep.ranks.itertuples():
        assert row.compute_us == pytest.approx(totals[row.rank]["compute_us"])
        assert row.exposed_comm_us == pytest.approx(totals[row.rank]["exposed_comm_us"])
    assert list(rep.stragglers["rank"]) == [s["rank"] for s in cli_json["sync"]["stragglers"]]
    assert rep.straggler == cli_json["straggler"] == cli_json["sync"]["straggler"] == 1
    assert list(rep.recommendations_table["title"]) == [
        r["title"] for r in cli_json["recommendations"]]
    assert set(rep.collectives.columns) == {"rank", "collective", "count", "time_us",
                                            "exposed_us"}
    assert set(rep.clock_offsets.columns) == {"rank", "offset_us", "drift_us_per_s",
                                              "drift_ci_us_per_s", "residual_us", "instances",
                                              "host"}


def test_figures_html_and_summary(tmp_path):
    rep = pardiag.analyze(SLOW, cache=False)
    figs = rep.figures
    assert {"breakdown", "overlap", "step_breakdown", "stragglers"} <= set(figs)
    assert all(isinstance(f, go.Figure) for f in figs.values())
    assert figs["breakdown"].data  # has traces
    page = rep.to_html(tmp_path / "r.html", cdn=True).read_text()
    assert "<h2 id='verdict'>" in page and "cdn.plot.ly" in page
    text = rep.summary(width=100)
    assert text.startswith("Verdict: Step ")
    assert max(len(line) for line in text.splitlines()) <= 100


def test_comm_kernels_and_errors(tmp_path):
    gpu_rank(0).write(tmp_path / "rank0.json")
    plain = pardiag.analyze(tmp_path, cache=False)
    named = pardiag.analyze(tmp_path, comm_kernels=["relu"], cache=False)
    # relu [50, 70) becomes communication: |[30, 60) ∪ [50, 70) ∪ [140, 180)| = 80 µs (was 70)
    assert (plain.ranks["comm_us"].iloc[0], named.ranks["comm_us"].iloc[0]) == (70.0, 80.0)
    with pytest.raises(pardiag.TraceError, match=re.escape(str(tmp_path / "nope"))):
        pardiag.analyze(tmp_path / "nope")
    with pytest.raises(pardiag.PardiagError, match="invalid regular expression"):
        pardiag.analyze(tmp_path, comm_kernels=["("])


def test_main_returns_the_exit_code_in_process(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pardiag: error: ") and len(err.splitlines()) == 1
    assert main(["--version"]) == 0
    assert main(["report"]) == 2  # usage error: one line
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_every_public_name_has_a_docstring_with_units():
    for name in ("analyze", "Report"):
        assert getattr(pardiag, name).__doc__
    for name, attr in vars(pardiag.Report).items():
        if name.startswith("_"):
            continue
        doc = (attr.fget if isinstance(attr, property) else attr).__doc__
        assert doc, name
    for name in ("ranks", "steps", "collectives", "instances", "stragglers", "clock_offsets",
                 "bubbles", "imbalance", "memory_per_rank"):
        doc = getattr(pardiag.Report, name).__doc__
        assert "_us" in doc or "_bytes" in doc or "imbalance" in doc, name
