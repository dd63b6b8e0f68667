"""``pardiag compare`` on planted pairs of runs whose deltas are known exactly
(tests/synth_compare.py): step time and its noise, the time breakdown with exposed communication
split into waiting and transfer, a straggler removed, memory, a pipeline bubble, operators, the
setup, closing the loop on a recommendation, the --fail-if-slower gate, and bad input."""

import json
import math
import subprocess
import sys
import types
from pathlib import Path

import msgspec
import orjson
import pytest
from click.testing import CliRunner

import pardiag
from pardiag.analyzer.per_rank.operators import operators_of_events
from pardiag.analyzer.report import schema as js
from pardiag.analyzer.report.compare import (
    Stragglers,
    compare_summaries,
    comparison_json,
    gate,
)
from pardiag.cli import cli

from .paths import REPO
from .synth import gpu_rank
from .synth_compare import ddp_run, pipeline_run


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A: rank 1 idles 200 µs before every all-reduce (a straggler), 600 µs of compute, 4 MB
    static and 3 MB peak per rank. B: no straggler, 500 µs of compute, half the memory, another
    NCCL_DEBUG and one more TORCH_* variable."""
    d = tmp_path_factory.mktemp("pair")
    a = ddp_run(d / "a", compute_us=600, late_us=200, script_args=["--slow-rank", "1"],
                env={"NCCL_DEBUG": "INFO"})
    b = ddp_run(d / "b", compute_us=500, late_us=0, static_bytes=2_000_000,
                peak_bytes=1_500_000, env={"NCCL_DEBUG": "WARN", "TORCH_SHOW_CPP_STACKTRACES": "1"})
    return a, b, pardiag.compare(a, b)


def test_step_time_and_its_noise(pair):
    s = pair[2].step
    # per step the span is compute + late + comm + jitter (0, 10, 20, 30): A 900–930, B 600–630
    assert s.a.samples_us == (900.0, 910.0, 920.0, 930.0)
    assert s.b.samples_us == (600.0, 610.0, 620.0, 630.0)
    assert (s.a.basis, s.a.median_us, s.a.q1_us, s.a.q3_us) == ("profiled", 915.0, 907.5, 922.5)
    assert (s.delta_us, s.delta_pct) == (-300.0, pytest.approx(-100 * 300 / 915))
    # each run's steps agree (their middle halves do not overlap), but −32.8% is inside the
    # noise between identical runs (BETWEEN_RUNS_FLOOR_PCT): one run per side cannot tell it
    assert s.beyond_noise is False and s.noise == (
        "within the noise between runs: -32.8% is inside the ±46% by which identical runs of one "
        "setup differed (each run's own steps agree: IQR A 0.91–0.92 ms, B 0.61–0.62 ms); repeat "
        "each side (pardiag profile --repeat 4 or more) to tell a smaller change")
    # what noise alone moves the step by: 46% of A's median; the breakdown's rows say whether
    # each part moved more than that
    assert s.noise_us == pytest.approx(0.46 * 915)
    bd = pair[2].breakdown.set_index("part")
    assert bd["within_noise"].to_dict() == {
        "span_us": True, "compute_only_us": True, "overlap_us": True,
        "exposed_transfer_us": True, "exposed_wait_us": True, "idle_us": True}


def test_a_change_beyond_the_noise_between_runs():
    """Where the step changes by more than identical runs differ, and each run's steps agree,
    the change clears the noise; the floor is a parameter (its measured value by default)."""
    from pardiag.analyzer.report.reading import BETWEEN_RUNS_FLOOR_PCT, StepStats, step_delta

    def stats(samples):
        s = sorted(samples)
        return StepStats("profiled", "", len(s), s[1] / 2 + s[2] / 2, s[0] / 2 + s[1] / 2,
                         s[2] / 2 + s[3] / 2, s[0], s[-1], tuple(s))
    a, b = stats([900.0, 910.0, 920.0, 930.0]), stats([1400.0, 1410.0, 1420.0, 1430.0])
    d = step_delta(a, b)   # +54.6%
    assert d.beyond_noise is True and d.noise == (
        "beyond both runs' noise (IQR A 0.91–0.93 ms, B 1.41–1.43 ms: the middle halves of their "
        f"steps do not overlap) and beyond the ±{BETWEEN_RUNS_FLOOR_PCT:g}% between identical runs")
    assert step_delta(a, b, floor_pct=60.0).beyond_noise is False
    # the runs' own steps overlap: within their noise, whatever the floor
    assert step_delta(a, stats([905.0, 915.0, 925.0, 935.0]), floor_pct=0.0).beyond_noise is False


def test_breakdown_splits_exposed_communication(pair):
    bd = pair[2].breakdown.set_index("part")
    # A, mean over its 2 ranks: rank 0 waits 200 µs for rank 1 and transfers 100; rank 1 idles
    # 200 µs and transfers 100; both idle 15 µs (mean jitter) at the end of the step
    assert bd["a_us"].to_dict() == {"span_us": 915.0, "compute_only_us": 600.0, "overlap_us": 0.0,
                                    "exposed_transfer_us": 100.0, "exposed_wait_us": 100.0,
                                    "idle_us": 115.0}
    assert bd["b_us"].to_dict() == {"span_us": 615.0, "compute_only_us": 500.0, "overlap_us": 0.0,
                                    "exposed_transfer_us": 100.0, "exposed_wait_us": 0.0,
                                    "idle_us": 15.0}
    assert bd.loc["exposed_wait_us", "delta_us"] == -100.0
    c = pair[2]
    assert c.by == "rank" and list(c.ranks["key"]) == ["rank 0", "rank 1"]
    r = c.ranks.set_index("key")
    assert (r.loc["rank 0", "a_exposed_wait_us"], r.loc["rank 0", "a_exposed_transfer_us"],
            r.loc["rank 1", "a_idle_us"], r.loc["rank 1", "a_wait_caused_us"]) == (
        200.0, 100.0, 215.0, 200.0)
    assert r["b_wait_caused_us"].tolist() == [0.0, 0.0]


def test_straggler_skew_memory_collectives_operators(pair):
    c = pair[2]
    assert c.stragglers == Stragglers(a=1, b=None)
    k = c.skew.set_index("op").loc["all_reduce"]
    assert (k["a_arrival_skew_us"], k["b_arrival_skew_us"], k["a_count"]) == (200.0, 0.0, 4.0)
    r = c.ranks.set_index("key")
    assert r["a_static_bytes"].tolist() == [4e6, 4e6] and r["b_static_bytes"].tolist() == [2e6, 2e6]
    assert r["b_peak_allocated_bytes"].tolist() == [1.5e6, 1.5e6]
    coll = c.collectives.set_index("collective").loc["all_reduce"]
    # per rank and step: A (300 + 100) / 2, B 100; one all-reduce issued per rank and step
    assert (coll["a_time_us"], coll["b_time_us"], coll["a_count"]) == (200.0, 100.0, 1.0)
    bw = c.bandwidth.set_index(["group", "op"]).loc[("dp", "all_reduce")]
    # 1 MB in 100 µs (transfer: rank 1's duration), busbw = 10 GB/s × 2(n−1)/n = 10 GB/s
    assert (bw["a_count"], bw["a_transfer_us"], bw["b_transfer_us"], bw["b_busbw_gbps"]) == (
        4, 100.0, 100.0, pytest.approx(10.0))
    ops = c.operators
    assert ops[["kind", "name", "a_us", "b_us", "delta_us"]].values.tolist() == [
        ["cpu", "aten::mm", 600.0, 500.0, -100.0]]


def test_setup_differences(pair):
    s = pair[2].setup.set_index("field")
    assert s.loc["env.NCCL_DEBUG", ["a", "b", "status"]].tolist() == ["INFO", "WARN", "changed"]
    assert s.loc["env.TORCH_SHOW_CPP_STACKTRACES", ["a", "b"]].tolist() == ["(not set)", "1"]
    assert s.loc["script_args", "detail"] == "--slow-rank: 1 → (not set); --steps: (not set) → 6"
    assert (s.loc["world_size", "status"] == "same"
            and s.loc["ddp_bucket_cap_bytes", "a"] == 25 * 2**20)
    # not recorded by these runs: unknown in both, and said so
    assert s.loc["profiler_schedule", "status"] == "unknown"
    assert "pipeline_schedule" not in s.index   # applies to neither run


def test_straggler_recommendation_is_checked(pair):
    a, b, c = pair
    (check,) = c.checks
    assert (check.kind, check.params, check.rank, check.status) == (
        "straggler", {"without_rank": 1}, 1, "applied")
    assert check.why.startswith("rank 1 is no longer the straggler in B (measured")
    assert check.b_step_us == 615.0
    assert check.error_pct == pytest.approx(100 * (check.predicted_step_us - 615.0) / 615.0)
    assert check.args_changed == ("--slow-rank: 1 → (not set)", "--steps: (not set) → 6")
    assert check.also_changed == ("NCCL_DEBUG", "TORCH_SHOW_CPP_STACKTRACES")


def test_bubble_and_microbatch_recommendation(tmp_path):
    """GPipe, p = 2: m = 2 → bubble 30 of 90 µs (33.3%), m = 4 → 30 of 150 µs (20%); A's
    'microbatches 4' is what B did."""
    c = pardiag.compare(pipeline_run(tmp_path / "a", 2), pipeline_run(tmp_path / "b", 4))
    b = c.bubbles.set_index("stage")
    assert b["a_bubble_pct"].tolist() == [pytest.approx(100 / 3)] * 2
    assert b["b_bubble_pct"].tolist() == [20.0, 20.0] and b["b_ideal_pct"].tolist() == [20.0] * 2
    assert b["a_bubble_us"].tolist() == pytest.approx([30.0, 30.0]) == b["b_bubble_us"].tolist()
    applied = c.applied
    assert [x.params for x in applied] == [{"microbatches": 4}]
    assert applied[0].why == "B has microbatches 4" and applied[0].b_step_us == 1000.0
    others = {json.dumps(x.params): x.status for x in c.checks if x.status != "applied"}
    assert others == {'{"microbatches": 8}': "not applied", '{"microbatches": 1}': "not applied",
                      '{"schedule": "1f1b"}': "not applied"}
    # one step period per run: the noise cannot be told
    assert c.step.beyond_noise is None and "fewer than 2 steps" in c.step.noise


def test_gate(pair, tmp_path):
    a, b, _ = pair
    worse = pardiag.compare(b, a)      # B is now the slower run: +300 µs = +48.8%
    g = gate(worse, 5)
    assert g.failed and g.line.startswith("B's step is 48.8% slower than A's (0.92 vs 0.61 ms")
    assert "over --fail-if-slower 5%, beyond both runs' noise" in g.line
    assert not gate(worse, 50).failed
    # 5 µs slower: over 0.1% but inside both runs' spread of steps
    near = ddp_run(tmp_path / "near", compute_us=505, late_us=0)
    g = gate(pardiag.compare(b, near), 0.1)
    assert not g.failed and "over --fail-if-slower 0.1% but within the runs' noise" in g.line
    # one step in B: the noise is unknown and the limit alone decides
    one = ddp_run(tmp_path / "one", compute_us=700, late_us=0, jitter=(0.0,))
    g = gate(pardiag.compare(b, one), 5)
    assert g.failed and "noise unknown: B has fewer than 2 steps" in g.line


def test_cli_outputs_and_exit_codes(pair, tmp_path):
    a, b, _ = pair
    html, js = tmp_path / "c.html", tmp_path / "c.json"
    res = run("compare", a, b, "-o", html, "--json", js, "--fail-if-slower", "5", "-q")
    assert res.exit_code == 0, res.output
    data = json.loads(js.read_text())
    assert data["schema_version"] == 1 and data["step"]["delta_us"] == -300.0
    assert data["gate"]["failed"] is False
    assert data["recommendation_checks"][0]["status"] == "applied"
    page = html.read_text()
    assert "pardiag compare" in page and 'id="pd-plotlyjs"' in page
    # B slower beyond the limit and the noise: exit 1, the reason on one line
    res = run("compare", b, a, "-o", html, "--fail-if-slower", "5", "-q")
    assert res.exit_code == 1
    fail = [ln for ln in res.output.splitlines() if ln.startswith("pardiag: FAIL: ")]
    assert len(fail) == 1 and "48.8% slower" in fail[0]
    # a limit that is no number of percent is a usage error
    for bad in ("nan", "inf", "-5"):
        res = run("compare", a, b, "-o", html, "--fail-if-slower", bad, "-q")
        assert res.exit_code == 2 and "Invalid value for '--fail-if-slower'" in res.output
    # JSON on standard output, nothing else there
    res = subprocess.run([sys.executable, "-m", "pardiag", "compare", str(a), str(b), "-o",
                          str(html), "--json", "-"], capture_output=True, text=True)
    assert res.returncode == 0 and json.loads(res.stdout)["stragglers"] == {"a": 1, "b": None}


def test_summaries_compare_like_their_runs(pair, tmp_path):
    """`report --json` summaries are inputs too, and give the same comparison."""
    a, b, c = pair
    for name, run_dir in (("a", a), ("b", b)):
        assert run("report", run_dir, "-o", tmp_path / f"{name}.html", "--json",
                   tmp_path / f"{name}.json", "-q").exit_code == 0
    res = run("compare", tmp_path / "a.json", tmp_path / "b.json", "-o", tmp_path / "c.html",
              "--json", tmp_path / "c.json", "-q")
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["step"]["delta_us"] == -300.0 and data["operators"][0]["delta_us"] == -100.0
    assert data["recommendation_checks"][0]["status"] == "applied"
    # a summary rewritten with sorted keys is still recognized
    resorted = tmp_path / "sorted.json"
    resorted.write_text(json.dumps(json.loads((tmp_path / "b.json").read_text()), sort_keys=True))
    assert pardiag.compare(tmp_path / "a.json", resorted).step.delta_us == -300.0
    # an older summary (schema 2: no step samples, setup or operators) still compares
    old = json.loads((tmp_path / "a.json").read_text())
    for k in ("step", "setup", "operators"):
        old.pop(k)
    old["schema_version"] = 2
    c2 = compare_summaries(old, json.loads((tmp_path / "b.json").read_text()))
    assert c2.step.a.samples_us == () and c2.step.a.median_us == 915.0
    assert c2.operators.empty and c2.operators_note.startswith("no operator times in A")
    assert any("schema 2" in w for w in c2.warnings)


def test_bad_input_is_one_line(pair, tmp_path):
    a, _, _ = pair
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 3, "ranks": [')
    wrong = tmp_path / "wrong.json"   # a summary whose rank is not a number
    wrong.write_text('{"schema_version": 3, "source": "x", "ranks": [{"rank": "zero"}]}')
    no_ranks = tmp_path / "no_ranks.json"
    no_ranks.write_text('{"schema_version": 3, "source": "x"}')
    cases = [(tmp_path / "missing", "no such file or folder"),
             (bad, "not a readable pardiag summary"),
             (wrong, "not a readable pardiag summary (Expected `int`, got `str` - at "
                     "`$.ranks[0].rank`)"),
             (no_ranks, "not a readable pardiag summary (Object missing required field "
                        "`ranks`)")]
    for path, why in cases:
        res = subprocess.run([sys.executable, "-m", "pardiag", "compare", str(a), str(path),
                              "-o", str(tmp_path / "c.html")], capture_output=True, text=True)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"pardiag: error: {path}: "), lines
        assert why in lines[0]
    # the page may not overwrite an input
    res = run("compare", a, bad, "-o", bad)
    assert res.exit_code == 2 and "is one of the inputs" in res.output


def test_runs_that_are_not_comparable(pair, tmp_path):
    """4 ranks against 2: compared by role (all ranks together), with a warning."""
    a, _, _ = pair
    big = ddp_run(tmp_path / "big", compute_us=600, late_us=200, ranks=4)
    c = pardiag.compare(a, big)
    assert c.by == "role" and list(c.ranks["key"]) == ["all ranks"]
    assert (c.ranks["a_ranks"].tolist(), c.ranks["b_ranks"].tolist()) == ([2], [4])
    assert any(w.startswith("world sizes differ (2 and 4)") for w in c.warnings)
    # the same planted step on every rank: the breakdown means are equal
    r = c.ranks.iloc[0]
    assert r["a_span_us"] == r["b_span_us"] == 915.0
    assert r["a_idle_us"] == 115.0 and r["b_idle_us"] == (200 + 4 * 15) / 4


def test_traces_from_elsewhere_say_what_is_unknown(pair, tmp_path):
    a, _, _ = pair
    gpu_rank(0).write(tmp_path / "rank0.json")
    c = pardiag.compare(a, tmp_path)
    s = c.setup.set_index("field")
    for field in ("script", "script_args", "hosts", "torch_version", "env"):
        assert s.loc[field, "status"] == "unknown in B", field
    assert s.loc["backend", ["a", "b", "status"]].tolist() == ["gloo", "nccl", "changed"]


def test_operators_per_rank_and_step(tmp_path):
    """The planted GPU trace: gemm 30 + 40 µs, relu 20, two NCCL kernels, a memcpy, 2 steps."""
    gpu_rank(0).write(tmp_path / "r0.json")
    ops, steps = operators_of_events(pardiag.analyze(tmp_path, cache=False).traces.ranks[0].events)
    assert steps == 2
    got = {(k, n[:12]): (c, t) for k, n, c, t in ops.itertuples(index=False)}
    assert got == {("gpu", "void gemm_ke"): (2, 70.0), ("gpu", "ncclDevKerne"): (1, 40.0),
                   ("gpu", "ncclKernel_A"): (1, 30.0), ("gpu", "void relu_ke"): (1, 20.0),
                   ("gpu", "Memcpy DtoH "): (1, 10.0)}
    # the same from the stored summaries (a second report reads them) and per step in the JSON
    first = pardiag.analyze(tmp_path).operators.totals
    again = pardiag.analyze(tmp_path)
    assert not again.traces.ranks[0].events_loaded   # read from the summary, not the trace
    assert again.operators.totals.equals(first)
    rows = {r["name"][:12]: r["per_step_us"] for r in again.to_json()["operators"]["rows"]}
    assert rows["void gemm_ke"] == 35.0 and rows["Memcpy DtoH "] == 5.0


# ------------------------------------------------------------------ typed summaries, planted


def _summary(*, compute: float, exposed: float, wait: float, step_us: float, gemm_us: float,
             transfers: tuple, cap: int, peak: float, overlap_pct: float, relu_us: float = 0.0,
             recommendations=(), straggler=js.UNSET) -> js.ReportDocument:
    """A typed summary of a 2-rank DDP run with 2 profiled steps per rank: per rank and step
    ``compute`` µs of compute only, 10 overlapped, ``exposed`` exposed and 40 idle; rank 0
    waits ``wait`` µs per step for rank 1 at complete instances; the step's samples are
    ``step_us`` ± 10 and ± 20; ``transfers`` ((µs, busbw GB/s, complete), ...) are all-reduces
    on pg "0" (dimension dp); the GPU kernel gemm takes ``gemm_us`` over the run (relu
    ``relu_us``); DDP's bucket cap ``cap`` bytes; each rank's peak ``peak`` bytes."""
    span = compute + 10.0 + exposed + 40.0
    ranks = [js.RankEntry(rank=r, file=f"rank{r}.json", rank_source="distributedInfo",
                          domain="cpu", device="cpu", steps=[
                              js.StepBreakdown(step=s, start_us=1e4 * s, end_us=1e4 * s + span,
                                               span_us=span, compute_us=compute + 10.0,
                                               comm_us=exposed + 10.0, overlap_us=10.0,
                                               compute_only_us=compute,
                                               exposed_comm_us=exposed, idle_us=40.0)
                              for s in (1, 2)]) for r in (0, 1)]
    samples = [step_us - 20, step_us - 10, step_us, step_us + 10, step_us + 20]
    return js.ReportDocument(
        schema_version=3, source="synthetic", ranks=ranks,
        collectives=[js.CollectiveTotal(collective="all_reduce", ranks=2, count=8,
                                        time_us=4 * (exposed + 10), exposed_us=4 * exposed)],
        operators=js.OperatorsSection(rank_steps=4, total=2, rows=[
            js.OperatorRow(kind="gpu", name="gemm", ranks=2, count=8, time_us=gemm_us),
            *([js.OperatorRow(kind="gpu", name="relu", ranks=2, count=4, time_us=relu_us)]
              if relu_us else [])]),
        sync=js.SyncSection(
            matched_by="records", straggler=1,
            stragglers=[js.StragglerRow(rank=0, wait_suffered_us=2 * wait, wait_caused_us=0.0,
                                        waiting_us=2 * wait),
                        js.StragglerRow(rank=1, wait_suffered_us=0.0, wait_caused_us=2 * wait,
                                        waiting_us=0.0)],
            instances=[js.InstanceRow(instance=f"0:{i}", pg="0", group="0,1|default_pg",
                                      seq=i, op="all_reduce", step=1, complete=done,
                                      transfer_us=us, busbw_gbps=bw)
                       for i, (us, bw, done) in enumerate(transfers)],
            skew=[js.SkewRow(op="all_reduce", count=4, arrival_skew_us=wait,
                             max_skew_us=2 * wait, transfer_us=10.0)]),
        imbalance=js.ImbalanceSection(summary=[js.ImbalanceSummary(
            dim="dp", pg="0", imbalance=1.0 + wait / 100, cost_us=wait / 2, slowest_rank=1)]),
        memory=js.MemorySection(per_rank=[js.MemoryRank(rank=r, static_bytes=1e6, peak_bytes=peak)
                                          for r in (0, 1)]),
        layout=js.LayoutSection(source="recorded", dims={"dp": 2}, strategies=["ddp"],
                                groups=[js.ProcessGroupRow(dim="dp", pg="0", desc="default_pg",
                                                           ranks=[0, 1], size=2)]),
        setup=js.SetupSection(source="recorded", script="train.py", world_size=2,
                              dims={"dp": 2}, strategies=["ddp"], ddp_bucket_cap_bytes=cap),
        overlap_per_dimension=js.DimOverlapSection(summary=[js.DimOverlapSummary(
            dim="dp", ranks=2, comm_us=2 * (exposed + 10), exposed_us=2 * exposed,
            overlap_pct=overlap_pct)]),
        step=js.MeasuredStep(basis="profiled", basis_text="profiled steps", steps=5,
                             median_us=step_us, q1_us=step_us - 10, q3_us=step_us + 10,
                             min_us=step_us - 20, max_us=step_us + 20, samples_us=samples),
        straggler=straggler, recommendations=list(recommendations))


def _planted() -> tuple[js.ReportDocument, js.ReportDocument]:
    """A: 600 µs compute, 100 exposed (30 of it waiting for rank 1), steps of 1000 µs, rank 1
    the straggler, and a recommendation to double DDP's bucket cap (predicted 891 µs, peak
    2 MB). B: the cap doubled, 500 µs compute, 80 exposed (10 waiting), steps of 900 µs, peak
    2.5 MB, a relu kernel A did not run; B's summary lacks the top-level ``straggler`` (an
    older report: ``sync.straggler`` is read)."""
    cap = 25 * 2**20
    rec = js.RecommendationEntry(
        kind="ddp_bucket", title="larger DDP buckets", change="bucket_cap_mb 50",
        measured_step_us=1000.0, predicted_step_us=891.0, gain_pct=10.9,
        predicted_peak_bytes=2e6, fits_memory=True,
        params=js.RecommendationParams(ddp_bucket_cap_bytes=2 * cap), tier=1)
    a = _summary(compute=600, exposed=100, wait=30, step_us=1000, gemm_us=800,
                 transfers=((50.0, 2.0, True), (70.0, 4.0, True)), cap=cap, peak=2e6,
                 overlap_pct=9.0, recommendations=[rec], straggler=1)
    b = _summary(compute=500, exposed=80, wait=10, step_us=900, gemm_us=600, relu_us=40,
                 transfers=((40.0, 5.0, True), (400.0, 0.5, False)), cap=2 * cap, peak=2.5e6,
                 overlap_pct=11.0)
    b = msgspec.structs.replace(b, sync=msgspec.structs.replace(b.sync, straggler=None))
    return a, b


def test_typed_summaries_with_planted_differences_compare_exactly():
    a, b = _planted()
    c = compare_summaries(a, b)
    assert c.a_document is a and c.b_document is b and c.by == "rank" and not c.warnings
    s = c.step
    assert (s.a.median_us, s.b.median_us, s.delta_us, s.delta_pct) == (1000, 900, -100, -10.0)
    # −10%: the runs' own steps do not overlap, but it is inside the noise between runs
    assert s.a.samples_us == (980.0, 990.0, 1000.0, 1010.0, 1020.0) and s.beyond_noise is False
    bd = c.breakdown.set_index("part")
    assert bd.loc["span_us", ["a_us", "b_us", "delta_us", "delta_pct"]].tolist() == [
        750.0, 630.0, -120.0, -16.0]
    assert bd.loc["compute_only_us", ["a_us", "b_us"]].tolist() == [600.0, 500.0]
    # rank 0 waits 30 (B: 10) of its exposed 100 (80); rank 1 waits for nobody
    assert bd.loc["exposed_wait_us", ["a_us", "b_us"]].tolist() == [15.0, 5.0]
    assert bd.loc["exposed_transfer_us", ["a_us", "b_us"]].tolist() == [85.0, 75.0]
    assert bd.loc["idle_us", ["delta_us", "delta_pct"]].tolist() == [0.0, 0.0]
    r = c.ranks.set_index("key")
    assert r.loc["rank 0", ["a_exposed_wait_us", "b_exposed_wait_us", "a_exposed_transfer_us",
                            "b_exposed_transfer_us"]].tolist() == [30.0, 10.0, 70.0, 70.0]
    assert r.loc["rank 1", ["a_wait_caused_us", "b_wait_caused_us", "a_peak_bytes",
                            "b_peak_bytes"]].tolist() == [30.0, 10.0, 2e6, 2.5e6]
    assert c.stragglers == Stragglers(a=1, b=None)
    assert c.dims.iloc[0].tolist() == ["dp", 9.0, 11.0, 100.0, 80.0]   # per rank and step
    assert c.skew.iloc[0].tolist() == ["all_reduce", 4.0, 4.0, 30.0, 10.0, 60.0, 20.0]
    assert c.imbalance.iloc[0].tolist() == ["dp", 1.3, 1.1, 15.0, 5.0]
    assert c.collectives.iloc[0].tolist() == ["all_reduce", 2.0, 2.0, 110.0, 90.0, 100.0, 80.0]
    # complete instances only: A's two (medians 60 µs, 3 GB/s), B's one
    assert c.bandwidth.iloc[0].tolist() == ["dp", "all_reduce", 2, 1, 60.0, 40.0, 3.0, 5.0]
    ops = c.operators.set_index("name")
    assert ops.index.tolist() == ["gemm", "relu"]
    assert ops.loc["gemm", ["a_us", "b_us", "delta_us", "delta_pct", "a_count"]].tolist() == [
        200.0, 150.0, -50.0, -25.0, 2.0]
    assert ops.loc["relu", "delta_us"] == 10.0 and math.isnan(ops.loc["relu", "delta_pct"])
    (ch,) = c.checks
    assert (ch.status, ch.why, ch.rank) == ("applied", "B has ddp_bucket_cap_bytes 52428800", 1)
    assert ch.params == {"ddp_bucket_cap_bytes": 2 * 25 * 2**20}
    assert (ch.a_step_us, ch.predicted_step_us, ch.b_step_us) == (1000.0, 891.0, 900.0)
    assert ch.error_pct == pytest.approx(-1.0) and ch.peak_error_pct == pytest.approx(-20.0)
    assert ch.also_changed == () and ch.args_changed == ()
    # the same from the JSON each typed summary is written as
    again = compare_summaries(js.to_builtins(a), js.to_builtins(b))
    assert again.breakdown.equals(c.breakdown) and again.checks == c.checks
    got = pardiag.compare(js.to_builtins(a), b, names=("A", "B")).to_json()
    assert got == comparison_json(c)


def test_an_older_summary_falls_back_where_it_lacks_keys():
    """B written by an older pardiag: no ``step`` (the run row of ``step_time`` is used), no
    ``setup`` (run.json's and the layout's fields), no ``operators``, no ``waiting_us`` (the
    waiting split is unknown) and no ``complete`` on its instances (taken as complete)."""
    a, b = _planted()
    old = js.to_builtins(b)
    for k in ("step", "setup", "operators"):
        old.pop(k)
    old["schema_version"] = 2
    old["step_time"] = [{"rank": None, "steps": 4, "median_us": 905.0, "q1_us": 900.0,
                         "q3_us": 910.0, "min_us": 890.0, "max_us": 920.0, "outlier_steps": []}]
    for row in old["sync"]["stragglers"]:
        row.pop("waiting_us")
    for row in old["sync"]["instances"]:
        row.pop("complete")
    doc = js.decode_report(old, "B")
    assert doc.step is None and doc.setup is None and doc.operators is None
    assert doc.sync.stragglers[0].waiting_us is None and doc.sync.instances[1].complete is True
    c = compare_summaries(a, old)
    assert (c.step.b.basis, c.step.b.median_us, c.step.b.samples_us) == ("profiled", 905.0, ())
    assert c.step.delta_us == -95.0
    assert c.operators.empty and c.operators_note.startswith("no operator times in B")
    assert any("B is a summary of schema 2" in w for w in c.warnings)
    assert math.isnan(c.ranks.set_index("key").loc["rank 0", "b_exposed_wait_us"])  # unknown
    assert c.bandwidth.iloc[0].tolist() == ["dp", "all_reduce", 2, 2, 60.0, 220.0, 3.0, 2.75]
    s = c.setup.set_index("field")
    assert s.loc["dims", "status"] == "same" and s.loc["script", "status"] == "unknown in B"
    (ch,) = c.checks   # B's bucket cap is not in its run.json: unknown
    assert ch.status == "unknown"


def test_a_summary_with_a_wrong_value_is_one_line(tmp_path):
    a, b = _planted()
    bad = js.to_builtins(b)
    bad["sync"]["instances"][0]["seq"] = "first"
    with pytest.raises(ValueError, match=r"^B: not a readable pardiag summary \(Expected `int`, "
                       r"got `str` - at `\$\.sync\.instances\[0\]\.seq`\)$"):
        compare_summaries(a, bad)
    f = tmp_path / "b.json"
    f.write_bytes(orjson.dumps(bad))
    with pytest.raises(pardiag.TraceError, match=rf"^{f}: not a readable pardiag summary"):
        pardiag.compare(a, f)


def test_unrelated_runs_apply_no_recommendation(tmp_path):
    """A DDP run against a pipeline run: whatever B's setup shares with a recommendation of
    A's, B is another job (script, strategies, degrees differ), so no recommendation counts as
    applied and no prediction error is computed."""
    c = pardiag.compare(REPO / "sample_traces" / "ddp_cpu_2rank",
                        REPO / "sample_traces" / "pp_1f1b_cpu_2rank")
    assert c.checks and c.applied == ()
    assert all(ch.error_pct is None for ch in c.checks)
    # the pipeline's fields apply to B only: "not used in A", not a change of value
    s = c.setup.set_index("field")
    assert s.loc[["pipeline_schedule", "microbatches"], "status"].tolist() == ["not used in A"] * 2
    assert s.loc["microbatches", "b"] == 8 and s.loc["microbatches", "a"] is None


def test_a_recommendation_made_in_another_job_is_not_applied(pair, tmp_path):
    """The planted pair's B, run from another script: rank 1 no longer straggles there, as A's
    recommendation asked, but B is not A with that change alone, so the check is unknown and
    no prediction error is computed (with the same script it is applied:
    test_straggler_recommendation_is_checked)."""
    import shutil

    b2 = tmp_path / "b2"
    shutil.copytree(pair[1], b2)
    run = b2 / "run.json"   # the older layout: sidecars beside the traces
    run.write_text(run.read_text().replace('"train.py"', '"other.py"'))
    (check,) = pardiag.compare(pair[0], b2).checks
    assert (check.kind, check.status, check.error_pct) == ("straggler", "unknown", None)
    assert check.why == ("B is not A with this change alone: it also differs in script (rank 1 "
                         "is no longer the straggler in B (measured: the setup cannot show what "
                         "slowed it))")


# ---------------------------------------------------------------------------- repeated runs


def _stats(median_us, runs=()):
    from pardiag.analyzer.report.reading import StepStats
    return StepStats("unprofiled", "", 20, median_us, median_us, median_us, median_us, median_us,
                     (), tuple(runs))


def test_repeated_runs_are_weighed_by_the_spread_between_them():
    """With repeated runs, each run's median step is one sample: two sets whose runs do not
    overlap clear the noise (exact Mann–Whitney, 5 runs each: p = 2/252); interleaved runs do
    not, whatever their medians; a side of one run cannot clear it."""
    from pardiag.analyzer.report.reading import step_delta
    a_runs = (10_000.0, 11_000.0, 12_000.0, 10_500.0, 11_500.0)
    b_runs = (13_000.0, 14_000.0, 15_000.0, 13_500.0, 14_500.0)
    d = step_delta(_stats(11_000.0, a_runs), _stats(14_000.0, b_runs))
    assert (d.delta_us, d.delta_pct) == (3000.0, pytest.approx(100 * 3 / 11))
    assert d.beyond_noise is True and d.p_value == pytest.approx(2 / 252)
    assert d.noise == ("beyond the noise between runs (A 5 runs 10.00–12.00 ms, B 5 runs "
                       "13.00–15.00 ms; Mann–Whitney p = 0.00794)")
    # B 27% slower by the medians, but its runs interleave with A's: p = 0.69
    mixed = (9_900.0, 10_600.0, 14_000.0, 14_000.0, 14_100.0)
    d = step_delta(_stats(11_000.0, a_runs), _stats(14_000.0, mixed))
    assert d.beyond_noise is False and d.p_value > 0.05
    assert d.noise.startswith("within the noise between runs (A 5 runs 10.00–12.00 ms, B 5 runs "
                              "9.90–14.10 ms; Mann–Whitney p = ")
    assert d.noise.endswith("; more runs per side tell a smaller change")
    # one run against five: the test cannot reach p < 0.05 (its smallest p is 2/6), so the
    # noise is unknown, not "within"
    d = step_delta(_stats(11_000.0, a_runs), _stats(30_000.0))
    assert d.beyond_noise is None and d.p_value == pytest.approx(1 / 3)
    assert d.noise.endswith("with 5 runs of A and 1 of B no difference can clear p < 0.05 (the "
                            "smallest p possible is 0.33); repeat each side 4 times or more "
                            "(pardiag profile --repeat 4)")


@pytest.mark.parametrize("n_a, n_b, smallest, decidable", [
    (3, 3, 0.1, False), (3, 4, 2 / 35, False), (4, 4, 2 / 70, True), (2, 8, 2 / 45, True),
    (1, 39, 2 / 40, False), (5, 5, 2 / 252, True)])
def test_too_few_runs_cannot_clear_the_test(n_a, n_b, smallest, decidable):
    """Every run of B slower than every run of A (+44%) gives the exact test's smallest p,
    2 / C(n_a + n_b, n_a): below 0.05 from 4 runs per side; with fewer the noise is unknown,
    and --fail-if-slower lets the limit alone decide."""
    from pardiag.analyzer.report.compare import gate
    from pardiag.analyzer.report.reading import smallest_p, step_delta
    a = tuple(10_000.0 + 100 * i for i in range(n_a))
    b = tuple(14_400.0 + 100 * i for i in range(n_b))
    assert smallest_p(n_a, n_b) == pytest.approx(smallest)
    d = step_delta(_stats(10_000.0, a), _stats(14_400.0, b))
    assert d.p_value == pytest.approx(smallest)
    assert d.beyond_noise is (True if decidable else None)
    c = types.SimpleNamespace(step=d)   # the gate reads the step alone
    g = gate(c, 10.0)
    assert g.failed, g.line
    assert ("beyond the noise between runs" if decidable else "noise unknown") in g.line


def _set(folder, computes, **kw):
    """A folder of repeated planted DDP runs (run-1 …), one per compute time (µs)."""
    for i, c in enumerate(computes, 1):
        ddp_run(folder / f"run-{i}", compute_us=c, late_us=0, **kw)
    return folder


def test_folders_of_repeated_runs_compare_by_their_runs(tmp_path):
    """Folders of repeated runs: the step time is the median of the runs' medians, the runs'
    medians are kept, and the rest is compared on the run with the median step."""
    # per run: step = compute + comm 100 + median jitter 15 µs
    a = _set(tmp_path / "a", [600, 640, 620, 630])
    b = _set(tmp_path / "b", [900, 960, 940, 920])
    c = pardiag.compare(a, b)
    assert c.step.a.runs_us == (715.0, 755.0, 735.0, 745.0)
    assert c.step.b.runs_us == (1015.0, 1075.0, 1055.0, 1035.0)
    assert (c.step.a.median_us, c.step.b.median_us) == (740.0, 1045.0)
    assert c.step.a.basis_text.startswith("the median of 4 runs' median steps")
    assert c.step.p_value == pytest.approx(2 / 70)   # 4 against 4, apart: the smallest p
    assert c.step.beyond_noise is True
    # each part is the median over a side's runs, tested between the runs as the step is:
    # compute moved 305 µs in every run (p = 2/70), the other parts not at all (p = 1)
    bd = c.breakdown.set_index("part")
    assert (bd.loc["compute_only_us", "a_us"], bd.loc["compute_only_us", "b_us"]) == (625.0,
                                                                                      930.0)
    assert bd.loc["compute_only_us", "p_value"] == pytest.approx(2 / 70)
    assert bd["within_noise"].to_dict() == {
        "span_us": False, "compute_only_us": False, "overlap_us": True,
        "exposed_transfer_us": True, "exposed_wait_us": True, "idle_us": True}
    assert c.step.noise_us == pytest.approx(30.0)   # the larger IQR of the runs' medians
    # a set against itself: every part within the noise, as the step is
    same = pardiag.compare([a / "run-1", a / "run-2", a / "run-3", a / "run-4"], a)
    assert same.step.delta_pct == 0.0 and same.step.beyond_noise is False
    assert same.breakdown["within_noise"].tolist() == [True] * 6
    # three runs against four: no test can clear p < 0.05, so neither the step nor a part is
    # judged
    few = pardiag.compare([a / "run-1", a / "run-2", a / "run-3"], b)
    assert few.step.beyond_noise is None and few.step.p_value == pytest.approx(2 / 35)
    assert few.breakdown["within_noise"].tolist() == [None] * 6
    from pardiag.analyzer.render.comparison import headline
    assert ("(medians over A: the median of 3 runs' median steps (each over its profiled steps "
            "(per step the slowest rank's span)); B: the median of 4 runs'") in headline(few)
    # the command line reads the folders and says so
    r = run("compare", a, b, "-o", tmp_path / "c.html", "--json", tmp_path / "c.json")
    assert r.exit_code == 0, r.output
    js_ = json.loads((tmp_path / "c.json").read_text())
    assert js_["step"]["a"]["runs_us"] == [715.0, 755.0, 735.0, 745.0]
    assert "beyond the noise between runs (A 4 runs 0.71–0.76 ms, B 4 runs 1.01–1.07 ms" in (
        js_["step"]["noise"])
    assert js_["breakdown"][1]["p_value"] == pytest.approx(2 / 70)


def test_report_of_a_set_shows_its_median_run(tmp_path):
    a = _set(tmp_path / "a", [600, 700, 640])
    (tmp_path / "a" / "notes").mkdir()   # not a run: left out
    rep = pardiag.analyze(a)
    assert rep.traces.source.endswith("run-3") or "run-3" in str(rep.traces.source)
    line = [w for w in rep.warnings if "repeated runs" in w]
    assert line == [f"{a} holds 3 repeated runs; this report is of run-3, the one with the median "
                    "step time (run-1 0.71 ms, run-2 0.81 ms, run-3 0.76 ms: they differ by 13% "
                    "of the median between runs); `pardiag compare` of two such folders weighs "
                    "a change against that spread"]
    r = run("report", a, "-o", tmp_path / "r.html", "-q")
    assert r.exit_code == 0 and "holds 3 repeated runs" in r.output


def test_what_is_a_set_of_repeated_runs(tmp_path):
    from pardiag.layout import repeat_runs
    a = _set(tmp_path / "s", [600, 600])
    ddp_run(a / "run-10", compute_us=600, late_us=0)
    (a / "other").mkdir()
    assert [p.name for p in repeat_runs(a)] == ["run-1", "run-2", "run-10"]
    assert repeat_runs(a / "run-1") == []            # a run is not a set
    one = _set(tmp_path / "one", [600])
    assert repeat_runs(one) == []                     # one run: not a set
    (a / "rank0.trace.json.gz").write_bytes(b"")       # a trace at the top: not a set
    assert repeat_runs(a) == []


def test_runs_of_other_jobs_gathered_in_a_folder_are_no_set(tmp_path):
    """Two runs of other script arguments (or one monitored, or one without a run file) in one
    folder are no repeats: no set, and report and compare of the folder say so in one line
    (exit 2) instead of reporting the median of unrelated runs."""
    from pardiag import layout
    mixed = _set(tmp_path / "m", [600])
    ddp_run(mixed / "run-2", compute_us=600, late_us=0, script_args=("--steps", "9"))
    assert layout.repeat_runs(mixed) == []
    assert layout.unlike_runs(mixed) == ("run-1 is a profiled train.py --steps 6 on 2 ranks, "
                                         "run-2 a profiled train.py --steps 9 on 2 ranks")
    for cmd in (["report", mixed, "-q", "-o", tmp_path / "r.html"],
                ["compare", mixed, mixed, "-q", "-o", tmp_path / "c.html"]):
        r = run(*cmd)
        assert r.exit_code == 2 and r.output == (
            f"pardiag: error: {mixed} holds run folders that are no repeats of one run "
            f"({layout.unlike_runs(mixed)}): report each run folder on its own, or set two "
            "side by side with pardiag compare A B\n")
    same = _set(tmp_path / "s", [600, 620])
    assert layout.unlike_runs(same) is None and len(layout.repeat_runs(same)) == 2
    run_file = same / "run-2" / "run.json"
    doc = json.loads(run_file.read_text())
    run_file.write_text(json.dumps({**doc, "monitor_every": 50}))
    assert layout.repeat_runs(same) == []
    assert layout.unlike_runs(same).startswith("run-1 is a profiled train.py --steps 6 on 2 "
                                                "ranks, run-2 a monitored train.py")
    run_file.unlink()
    assert layout.unlike_runs(same) == "run-2 has no readable run file"


def test_hosts_that_ran_the_probe_apart_are_named(tmp_path):
    """run.json's host probes (a fixed workload timed before and after the job): sides more
    than 10% apart get a warning that names the slower host."""
    a = ddp_run(tmp_path / "a", compute_us=600, late_us=0,
                run_extra={"host_probe_before_ms": 8.0, "host_probe_after_ms": 8.4})
    b = ddp_run(tmp_path / "b", compute_us=600, late_us=0,
                run_extra={"host_probe_before_ms": 12.0, "host_probe_after_ms": 12.6})
    close = ddp_run(tmp_path / "c", compute_us=600, late_us=0,
                    run_extra={"host_probe_before_ms": 8.6, "host_probe_after_ms": 8.8})
    c = pardiag.compare(a, b)
    assert [w for w in c.warnings if w.startswith("the host probe")] == [
        "the host probe (a fixed single-core workload timed before and after each run) took "
        "8.2 ms for A and 12.3 ms for B: B's host was 50% slower, which moves the whole step "
        "time whatever the change"]
    back = pardiag.compare(b, a)
    assert any("A's host was 50% slower" in w for w in back.warnings)
    assert not any(w.startswith("the host probe") for w in pardiag.compare(a, close).warnings)
    # runs without probes (older runs, traces from elsewhere) say nothing
    plain = ddp_run(tmp_path / "p", compute_us=600, late_us=0)
    assert not any(w.startswith("the host probe") for w in pardiag.compare(a, plain).warnings)


def test_a_difference_beyond_the_noise_is_not_judged_when_the_hosts_differ(tmp_path):
    """+126% clears the noise between runs, but B's host ran the probe 50% slower: the
    difference is left unjudged (unknown), with the probe's figures — unless B was the faster
    run on the slower host, which the host cannot explain."""
    a = ddp_run(tmp_path / "a", compute_us=600, late_us=0,
                run_extra={"host_probe_before_ms": 8.0, "host_probe_after_ms": 8.4})
    b = ddp_run(tmp_path / "b", compute_us=1500, late_us=0,
                run_extra={"host_probe_before_ms": 12.0, "host_probe_after_ms": 12.6})
    s = pardiag.compare(a, b).step
    assert s.delta_pct == pytest.approx(100 * 900 / 715)
    assert s.beyond_noise is None
    assert s.noise.endswith(
        "between identical runs, but not judged: the host probe (a fixed single-core workload "
        "timed before and after each run) took 8.2 ms for A and 12.3 ms for B: B's host was 50% "
        "slower, so the difference may be the host's; repeat the runs on a quieter host")
    # the same runs with hosts alike: beyond the noise
    c = ddp_run(tmp_path / "c", compute_us=1500, late_us=0,
                run_extra={"host_probe_before_ms": 8.2, "host_probe_after_ms": 8.4})
    assert pardiag.compare(a, c).step.beyond_noise is True
    # B faster on the faster host: the host may explain it, unjudged as well
    assert pardiag.compare(b, a).step.beyond_noise is None
    # B faster on the slower host: a slower host never explains a faster run; judged, and said
    slow_host_fast_run = ddp_run(tmp_path / "d", compute_us=600, late_us=0,
                                 run_extra={"host_probe_before_ms": 12.0,
                                            "host_probe_after_ms": 12.6})
    s = pardiag.compare(c, slow_host_fast_run).step
    assert s.delta_pct < 0 and s.beyond_noise is True
    assert s.noise.endswith(
        "B's host was 48% slower: B was faster on the slower host, so the difference is, if "
        "anything, larger than measured")


def test_runs_whose_ranks_contended_for_cores_leave_one_run_s_noise_unknown(tmp_path):
    """One run per side: +150% clears the ±46% measured between identical pinned runs, unless a
    side's ranks contended for cores (two ranks allowed on the same cores): that floor does not
    bound their noise, so the noise is unknown, every part's too, and --fail-if-slower lets its
    limit decide, saying so. The setup shows each run's contention."""
    from pardiag.analyzer.report.compare import gate

    pinned = {"intra_op_threads": 1, "cpu_affinity": [0]}
    a = ddp_run(tmp_path / "a", compute_us=600, late_us=0, meta_extra=pinned)
    b = ddp_run(tmp_path / "b", compute_us=1500, late_us=0, meta_extra=pinned)
    # each rank pinned to core 0 alone is still the same core: give them their own
    for run in (a, b):
        for r in (0, 1):
            m = run / f"rank{r}.meta.json"
            m.write_text(m.read_text().replace('"cpu_affinity": [0]', f'"cpu_affinity": [{r}]'))
    shared = ddp_run(tmp_path / "c", compute_us=1500, late_us=0,
                     meta_extra={"intra_op_threads": 1, "cpu_affinity": [0, 1]})
    ok = pardiag.compare(a, b)
    assert ok.step.beyond_noise is True
    row = ok.setup.set_index("field").loc["contention"]
    assert (row["a"], row["b"], row["status"]) == ("none", "none", "same")
    c = pardiag.compare(a, shared)
    assert c.step.delta_pct == ok.step.delta_pct and c.step.beyond_noise is None
    assert c.step.noise == (
        "noise unknown: B ran with ranks contending for cores, and the ±46% by which identical "
        "runs differed was measured on ranks pinned to their own cores; pin the ranks (pardiag "
        "profile --pin-cpu) or repeat each side 4 times or more (pardiag profile --repeat 4)")
    assert c.breakdown["within_noise"].tolist() == [None] * 6
    assert c.setup.set_index("field").loc["contention", "b"].startswith(
        "timings are contended: ranks 0,1 may run on the same cores")
    g = gate(c, 10.0)
    assert g.failed and ("over --fail-if-slower 10%; the difference could not be weighed "
                         "against the noise between runs, so the limit alone decides") in g.line


def test_a_run_compared_with_itself_is_said(pair, tmp_path, capsys):
    """The same folder on both sides (spelled differently): a warning says every difference is
    0 by construction, in the API and on the command line; the page of two runs that are not
    pipelines says so at its end, not in its main flow."""
    from pardiag.cli import main

    a, _, other = pair
    c = pardiag.compare(a, Path(str(a) + "/"))
    assert c.warnings[0] == f"A and B are the same run ({a}): every difference is 0 by construction"
    assert not any("same run" in w for w in other.warnings)
    out = tmp_path / "c.html"
    assert main(["compare", str(a), str(a), "-o", str(out)]) == 0
    assert f"pardiag: warning: A and B are the same run ({a})" in capsys.readouterr().err
    page = out.read_text()
    assert page.index("id='warnings'") < page.index("id='pipeline'")
    assert "Neither run is a pipeline." in page[page.index("id='pipeline'"):]


def test_compare_repeats_each_sides_own_warnings(tmp_path):
    """B's rank 1 trace cut short: its report warns that the file was skipped and the rank is
    missing; the comparison says both, marked B's, in its warnings (terminal, JSON, page)."""
    import shutil

    src = REPO / "sample_traces" / "ddp_cpu_2rank"
    b = tmp_path / "b"
    shutil.copytree(src, b, ignore=shutil.ignore_patterns(".pardiag-cache"))
    (b / "rank1.trace.json.gz").write_bytes((src / "rank1.trace.json.gz").read_bytes()[:20000])
    c = pardiag.compare(src, b)
    mine = [w for w in c.warnings if w.startswith("B: ")]
    assert mine[0].startswith(f"B: {b / 'rank1.trace.json.gz'}: truncated or corrupt gzip")
    assert mine[1] == "B: run.json says world size 2; no trace for rank(s) [1]"
    assert not [w for w in c.warnings if w.startswith("A: ")]
    r = run("compare", src, b, "-q", "-o", tmp_path / "c.html", "--json", tmp_path / "c.json")
    assert r.exit_code == 0 and "pardiag: warning: B: run.json says world size 2" in r.output
    assert mine[1] in json.loads((tmp_path / "c.json").read_text())["warnings"]


def test_rows_per_profiled_step_are_judged_on_their_own_scale():
    """A pipeline's step is its period (20 ms, noise 46% of it: 9.2 ms) while the rows are per
    profiled step (a 60 ms span): a row that moved 15 ms moved 25% of its size, inside the 46%,
    and is within the noise (27.6 ms on that scale), not beyond the 9.2 ms of the shorter step.
    Where the step is the profiled steps' own, the step's noise applies as it is."""
    import dataclasses
    from types import SimpleNamespace

    import pandas as pd

    from pardiag.analyzer.render.comparison import noise_caption
    from pardiag.analyzer.report.compare import PARTS, _breakdown, row_noise_us
    from pardiag.analyzer.report.reading import StepDelta, StepStats

    def stats(basis, med):
        return StepStats(basis, basis, 10, med, med - 100, med + 100, med - 200, med + 200)

    a, b = stats("pipeline", 20_000.0), stats("pipeline", 22_000.0)
    step = StepDelta(a, b, 2_000.0, 10.0, False, "within", noise_us=9_200.0)
    assert row_noise_us(step, 60_000.0) == pytest.approx(27_600.0)
    prof = dataclasses.replace(step, a=stats("profiled", 20_000.0))
    assert row_noise_us(prof, 60_000.0) == 9_200.0
    ra = pd.DataFrame({"rank": [0], "span_us": [60_000.0], **{p: [10_000.0] for p in PARTS}})
    rb = ra.assign(span_us=75_000.0, compute_only_us=25_000.0)
    bd = _breakdown(ra, rb, step, ((), ())).set_index("part")["within_noise"]
    assert bd["span_us"] and bd["compute_only_us"]
    assert not _breakdown(ra, rb, prof, ((), ())).set_index("part")["within_noise"]["span_us"]
    c = SimpleNamespace(step=step, breakdown=pd.DataFrame({"a_us": [60_000.0]}))
    assert noise_caption(c) == (
        "A difference of at most ±27.600 ms per profiled step (46% of A's profiled step of "
        "60.000 ms, the share by which identical runs' steps differed) is within the noise "
        "between runs.")


def test_two_sets_of_repeated_runs_given_to_report_are_refused_in_one_line(tmp_path):
    """``report A B`` of two --repeat folders named neither as sets; it now says A is one, and
    what to do instead."""
    a = _set(tmp_path / "a", [600, 640])
    b = _set(tmp_path / "b", [900, 960])
    res = CliRunner().invoke(cli, ["report", str(a), str(b), "--no-cache"])
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines()[-1] == (
        f"pardiag: error: {a} is a set of repeated runs (pardiag profile --repeat): report it "
        f"on its own, or set two sets side by side with pardiag compare A B")
