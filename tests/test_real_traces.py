"""Real GPU traces recorded by others (../shared/real_traces, read by path).

Reference overlap values are the ones in real_traces/README.md, computed independently with
HTA's definition over all kernels of each file. The HTA cross-check runs HTA's own
``get_comm_comp_overlap`` and compares on HTA's window (kernels launched before the last
profiler step; timestamps rounded the way HTA rounds them).
"""

import dataclasses
import logging
import math
import warnings

import numpy as np
import pandas as pd
import pytest

from pardiag.analyzer.analyses.breakdown import compute_rank_breakdown, compute_time_breakdown
from pardiag.analyzer.trace import load_traces
from pardiag.analyzer.trace.classify import classify, profiler_steps
from pardiag.cli import cli

REFERENCE_OVERLAP_PCT = {
    "dlrm_8rank_v100": {0: 4.50, 1: 2.47, 2: 7.88, 3: 3.31, 4: 0.56, 5: 0.64, 6: 7.56, 7: 9.51},
    "dlrm_128rank_sampled": {0: 14.95, 1: 19.93},
    "ddp_2rank_v100_rank0": {0: 15.61},
}
ALL_FOLDERS = ["amd_mi250_single", "cpu_only_single", "ddp_2rank_v100_rank0",
               "dlrm_128rank_sampled", "dlrm_8rank_v100", "newest_format_h100"]


@pytest.mark.parametrize("folder", sorted(REFERENCE_OVERLAP_PCT))
def test_overlap_matches_reference_values(real_traces, folder):
    totals = compute_time_breakdown(load_traces(real_traces / folder)).totals
    got = dict(zip(totals["rank"], totals["overlap_pct"]))
    assert set(got) == set(REFERENCE_OVERLAP_PCT[folder])
    for rank, want in REFERENCE_OVERLAP_PCT[folder].items():
        assert got[rank] == pytest.approx(want, abs=0.05), (folder, rank)


def _hta(folder, analysis: str) -> pd.DataFrame:
    """HTA's ``analysis`` (a TraceAnalysis method) of ``folder``, indexed by rank."""
    from hta.trace_analysis import TraceAnalysis

    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df = getattr(TraceAnalysis(trace_dir=str(folder)), analysis)(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    return df.set_index("rank")


def _hta_rounded(trace):
    """HTA rounds float timestamps: start up (ceil), end down (floor)."""
    ev = trace.events.copy()
    end = np.floor(ev["ts"] + ev["dur"])
    ev["ts"] = np.ceil(ev["ts"])
    ev["dur"] = end - ev["ts"]
    return dataclasses.replace(trace, events=ev)


@pytest.mark.parametrize("folder", sorted(REFERENCE_OVERLAP_PCT))
def test_overlap_agrees_with_hta_on_its_window(real_traces, folder):
    hta = _hta(real_traces / folder, "get_comm_comp_overlap")["comp_comm_overlap_pctg"]
    for rank, ours in _on_hta_window(real_traces / folder):
        assert ours["overlap_pct"] == pytest.approx(hta[rank], abs=0.05), (folder, rank)


def _on_hta_window(folder):
    """``(rank, pardiag's breakdown)`` of each rank of ``folder`` on HTA's window and times:
    the kernels launched before the last profiler step when there are two or more (else every
    kernel), their span (not a last step's host end), float timestamps rounded as HTA rounds
    them."""
    for rank, trace in load_traces(folder).ranks.items():
        if trace.events["ts"].dtype.kind == "f" and (trace.events["ts"] % 1).any():
            trace = _hta_rounded(trace)
        steps = profiler_steps(trace, classify(trace))
        window = (-np.inf, float(steps["start_us"].max()) if len(steps) > 1 else np.inf)
        yield rank, compute_rank_breakdown(trace, launch_window=window)


@pytest.mark.parametrize("folder", ALL_FOLDERS)
def test_every_real_folder_reports(real_traces, folder, tmp_path):
    from click.testing import CliRunner

    out = tmp_path / "r.html"
    js = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["report", str(real_traces / folder), "-o", str(out),
                                   "--json", str(js)])
    assert res.exit_code == 0, res.output
    import json
    data = json.loads(js.read_text())
    assert data["ranks"], folder
    for r in data["ranks"]:
        t = r["total"]
        parts = (t["compute_only_us"] + t["overlap_us"] + t["exposed_comm_us"]
                 + t["memory_only_us"] + t["idle_us"])
        assert parts == pytest.approx(t["span_us"], rel=1e-9, abs=1e-6)
    assert out.stat().st_size > 1_000_000  # plotly.js inlined


def test_dlrm_8rank_cli_prints_the_8_rank_breakdown(real_traces, tmp_path):
    from click.testing import CliRunner

    res = CliRunner().invoke(cli, ["report", str(real_traces / "dlrm_8rank_v100"),
                                   "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0
    out = res.output.splitlines()
    start = next(i for i, ln in enumerate(out) if ln.startswith("Time breakdown per rank"))
    lines = [ln for ln in out[start:] if ln.startswith("│")]   # after the recommendations
    ranks = [ln.split("│")[1].strip() for ln in lines[:8]]
    assert ranks == [str(r) for r in range(8)]
    assert "4.50" in lines[0] and "9.51" in lines[7]


def test_dlrm_8rank_skew_lies_before_the_step(real_traces):
    """Read by an expert: rank 7 enters the step about 7.5 ms late and almost all
    of its skew sits in the step's first collective (an all_to_all) — the delay lies before the
    step, not in its compute."""
    from pardiag.analyzer.report.registry import build_report
    skew = build_report(load_traces(real_traces / "dlrm_8rank_v100")).balance.skew
    r7 = skew.set_index("rank").loc[7]
    assert 7000 < r7["start_late_us"] < 8500
    assert r7["top_collective"].startswith("all_to_all #1 of the step")
    assert r7["top_share_pct"] > 70
    # the rank that starts first has no late start
    assert skew["start_late_us"].min() == 0


def test_real_trace_quirks(real_traces):
    # AMD: every kernel on stream 0, no rank anywhere: one rank, assigned, with a warning
    amd = load_traces(real_traces / "amd_mi250_single")
    assert list(amd.ranks) == [0] and amd.ranks[0].rank_source == "assigned"
    # CPU-only gloo trace of rank 34: gloo all-reduces on worker threads are the communication
    cpu = compute_time_breakdown(load_traces(real_traces / "cpu_only_single"))
    row = cpu.totals.iloc[0]
    assert row["rank"] == 34 and row["domain"] == "cpu"
    coll = cpu.collectives.set_index("collective").loc["all_reduce"]
    assert coll["count"] == 10


@pytest.mark.parametrize("folder", sorted(REFERENCE_OVERLAP_PCT))
def test_idle_agrees_with_hta_temporal_breakdown_on_its_window(real_traces, folder):
    """HTA's idle time is the window less every device event (kernels, memcpy, memset): a
    device that copies is not idle. On its window pardiag's idle is HTA's to the µs, and its
    exposed communication and memory copies alone together are HTA's non-compute time (a
    device event runs, no computation)."""
    hta = _hta(real_traces / folder, "get_temporal_breakdown")
    for rank, ours in _on_hta_window(real_traces / folder):
        assert ours["idle_us"] == pytest.approx(hta.at[rank, "idle_time(us)"], abs=1.0)
        assert ours["exposed_comm_us"] + ours["memory_only_us"] == pytest.approx(
            hta.at[rank, "non_compute_time(us)"], abs=1.0), (folder, rank)
        parts = (ours["compute_only_us"] + ours["overlap_us"] + ours["exposed_comm_us"]
                 + ours["memory_only_us"] + ours["idle_us"])
        assert parts == pytest.approx(ours["span_us"], abs=1e-6)


def test_memory_copies_are_not_idle_on_a_v100_trace(real_traces):
    """hta_trace_diff_test copies (memcpy/memset) 157 ms, 96.5 ms of it while no kernel runs:
    counted as idle that read 16.6% of the window where the device ran nothing 3.7% of it.
    Both figures computed here from the raw events, with plain sorting."""
    import gzip
    import json
    path = real_traces / "hta_trace_diff_test" / "rank1.json.gz"
    ev = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
          if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]

    def busy(events) -> float:
        total, end = 0.0, -math.inf
        for s, e in sorted((x["ts"], x["ts"] + x["dur"]) for x in events):
            if e > end:
                total += e - max(s, end)
                end = e
        return total

    lo = min(e["ts"] for e in ev)
    hi = max(e["ts"] + e["dur"] for e in ev)
    all_busy = busy(ev)
    kernels_busy = busy([e for e in ev if e["cat"] == "kernel"])
    t = compute_time_breakdown(load_traces(path.parent)).totals.iloc[0]
    assert t["span_us"] == hi - lo == 745239.0
    assert t["idle_us"] == pytest.approx(hi - lo - all_busy, abs=1e-6) == 27296.0
    assert t["memory_only_us"] == pytest.approx(all_busy - kernels_busy, abs=1e-6) == 96497.0


@pytest.mark.parametrize("folder", ["ddp_2rank_v100_rank0", "dlrm_128rank_sampled",
                                    "hta_trace_diff_test"])
def test_a_step_lasts_as_long_as_its_host_step_on_the_device_too(real_traces, folder):
    """What the last step's window stands on: a step's first kernel starts about as long after
    its host step's start as the step before's did, so each step's first kernel start plus its
    ``ProfilerStep`` range's length lands within 0.6 ms of the next step's first kernel (steps of
    80-630 ms; up to 4.5 ms after the last kernel's end). The last step, with no next one, ends
    there, or at its last kernel's end if later."""
    from pardiag.analyzer.per_rank.breakdown import compute_rank_parts

    for rank, trace in load_traces(real_traces / folder).ranks.items():
        host = profiler_steps(trace, classify(trace)).set_index("step")
        windows = compute_rank_parts(trace, [], None).step_windows
        assert len(windows) >= 2, (folder, rank)
        for (step, start, _), (_, nxt, _) in zip(windows, windows[1:]):
            dur = host.at[step, "end_us"] - host.at[step, "start_us"]
            assert start + dur == pytest.approx(nxt, abs=600.0), (folder, rank, step)
        step, start, end = windows[-1]
        dur = host.at[step, "end_us"] - host.at[step, "start_us"]
        ev = trace.events
        dev = ev[ev["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"])]
        assert end == pytest.approx(max(start + dur, float((dev["ts"] + dev["dur"]).max())),
                                    abs=1e-6), (folder, rank)
