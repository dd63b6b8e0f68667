"""Stored per-rank summaries as a parsed-run cache: reused when current, recomputed when a file
changes, never written over other files or into read-only folders."""

from __future__ import annotations

import json
import os
import stat

import pytest

from pardiag.analyzer.per_rank import REDUCER
from pardiag.analyzer.per_rank import store as sm
from pardiag.analyzer.report.registry import build_report
from pardiag.analyzer.trace import load_traces

from .synth import gpu_rank


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    d = tmp_path / "user-cache"
    monkeypatch.setenv("PARDIAG_CACHE_DIR", str(d))
    return d


def _run(tmp_path, n=2):
    run = tmp_path / "run"
    run.mkdir()
    for r in range(n):
        gpu_rank(r).write(run / f"rank{r}.json")
    return run


def test_second_load_reads_summaries_not_traces(tmp_path):
    run = _run(tmp_path)
    first = load_traces(run, reducer=REDUCER, cache=True)
    assert sorted(p.name for p in (run / ".pardiag-cache").iterdir()) == [
        "rank0.json.summary.json", "rank1.json.summary.json"]
    assert all(t.summary is not None for t in first.ranks.values())
    second = load_traces(run, reducer=REDUCER, cache=True)
    assert [t.events_loaded for t in second.ranks.values()] == [False, False]
    tot = build_report(second).breakdown.totals
    # overlap: all-reduce [30,60) under compute [10,40) [50,70): 20; all-gather [140,180) under
    # [110,150): 10
    assert list(tot["overlap_us"]) == [30.0, 30.0] and list(tot["comm_us"]) == [70.0, 70.0]
    assert [t.events_loaded for t in second.ranks.values()] == [False, False]


def test_changed_file_invalidates_its_summary(tmp_path):
    run = _run(tmp_path)
    load_traces(run, reducer=REDUCER, cache=True)
    b = gpu_rank(1)
    b.kernel("void gemm_kernel<float>(float*)", 150, 40, launch_ts=103)  # [150,190) under AG
    b.write(run / "rank1.json")
    st = os.stat(run / "rank1.json")
    os.utime(run / "rank1.json", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    ts = load_traces(run, reducer=REDUCER, cache=True)
    assert ts.ranks[0].events_loaded is False      # rank 0 unchanged: from its summary
    assert ts.ranks[1].events_loaded is True       # rank 1 changed: parsed again
    tot = build_report(ts).breakdown.totals.set_index("rank")
    assert tot.loc[0, "overlap_us"] == 30.0
    assert tot.loc[1, "overlap_us"] == 20.0 + 40.0  # all-gather [140,180) now all under compute
    again = load_traces(run, reducer=REDUCER, cache=True)
    assert [t.events_loaded for t in again.ranks.values()] == [False, False]


def test_other_patterns_do_not_reuse_a_summary(tmp_path):
    import re

    run = _run(tmp_path)
    load_traces(run, reducer=REDUCER, cache=True)
    ts = load_traces(run, reducer=REDUCER, cache=True, comm_patterns=[re.compile("relu")])
    assert [t.events_loaded for t in ts.ranks.values()] == [True, True]
    tot = build_report(ts, __import__("pardiag.analyzer.report.registry", fromlist=["x"])
                       .AnalysisOptions(comm_patterns=(re.compile("relu"),))).breakdown.totals
    # relu [50,70) is communication now: C = [30,70) [140,180), K = [10,40) [110,150)
    assert list(tot["comm_us"]) == [80.0, 80.0] and list(tot["overlap_us"]) == [20.0, 20.0]


def test_no_cache_neither_reads_nor_writes(tmp_path):
    run = _run(tmp_path)
    ts = load_traces(run, reducer=REDUCER, cache=False)
    assert not (run / ".pardiag-cache").exists()
    assert all(t.summary is not None for t in ts.ranks.values())


def test_read_only_folder_uses_the_user_cache(tmp_path, user_cache):
    run = _run(tmp_path)
    os.chmod(run, stat.S_IRUSR | stat.S_IXUSR)
    try:
        load_traces(run, reducer=REDUCER, cache=True)
        assert not (run / ".pardiag-cache").exists()
        stored = sorted(p.name for d in user_cache.iterdir() for p in d.iterdir())
        assert stored == ["rank0.json.summary.json", "rank1.json.summary.json"]
        ts = load_traces(run, reducer=REDUCER, cache=True)
        assert [t.events_loaded for t in ts.ranks.values()] == [False, False]
    finally:
        os.chmod(run, stat.S_IRWXU)


def test_a_foreign_file_with_the_summary_name_is_never_overwritten(tmp_path):
    run = _run(tmp_path, n=1)
    (run / ".pardiag-cache").mkdir()
    mine = run / ".pardiag-cache" / "rank0.json.summary.json"
    mine.write_text('{"user": "data"}')
    load_traces(run, reducer=REDUCER, cache=True)
    assert mine.read_text() == '{"user": "data"}'


def test_corrupt_summary_is_ignored_and_replaced(tmp_path):
    run = _run(tmp_path, n=1)
    load_traces(run, reducer=REDUCER, cache=True)
    f = run / ".pardiag-cache" / "rank0.json.summary.json"
    f.write_bytes(f.read_bytes()[:100])
    ts = load_traces(run, reducer=REDUCER, cache=True)
    assert ts.ranks[0].events_loaded is True
    assert json.loads(f.read_bytes())["kind"] == sm.SUMMARY_KIND


def test_lazy_events_are_read_on_first_access(tmp_path):
    run = _run(tmp_path, n=1)
    load_traces(run, reducer=REDUCER, cache=True)
    t = load_traces(run, reducer=REDUCER, cache=True).ranks[0]
    assert t.events_loaded is False and t.has_gpu is True
    # 2 steps, 6 kernels, 6 launches
    assert len(t.events) == len(load_traces(run).ranks[0].events) == 14
    assert t.events_loaded is True


def test_cli_report_uses_the_cache(tmp_path, monkeypatch, capsys):
    import sys

    from pardiag import cli

    run = _run(tmp_path)
    for extra in ([], [], ["--no-cache"]):
        monkeypatch.setattr(sys, "argv", ["pardiag", "report", str(run), "-q", "-o",
                                          str(tmp_path / "r.html"), "--json",
                                          str(tmp_path / "s.json"), *extra])
        assert cli.main() == 0
        doc = json.loads((tmp_path / "s.json").read_text())
        assert [r["total"]["overlap_us"] for r in doc["ranks"]] == [30.0, 30.0]
    assert (run / ".pardiag-cache" / "rank0.json.summary.json").exists()
