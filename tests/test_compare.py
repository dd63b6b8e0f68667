"""``pardiag compare`` on planted pairs of runs whose deltas are known exactly
(tests/synth_compare.py): step time and its noise, the time breakdown with exposed communication
split into waiting and transfer, a straggler removed, memory, a pipeline bubble, operators, the
setup, closing the loop on a recommendation, the --fail-if-slower gate, and bad input."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

import pardiag
from pardiag.analyzer.per_rank.operators import operators_of_events
from pardiag.analyzer.report.compare import compare_summaries, gate
from pardiag.cli import cli

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
    assert s.beyond_noise is True and s.noise.startswith("beyond both runs' noise")


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
    assert c.stragglers == {"a": 1, "b": None}
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
    cases = [(tmp_path / "missing", "no such file or folder"),
             (bad, "not a readable pardiag summary")]
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
