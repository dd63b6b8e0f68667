"""Recommendations on real CPU/gloo runs of the examples (issue #5): an unbalanced pipeline is
told to move layers (with the right boundaries), GPipe with few microbatches to use more, and a
planted straggler is named."""

import subprocess
import sys

import pytest

from pardiag.analyzer.load import load_traces
from pardiag.analyzer.registry import build_report, report_json
from conftest import REPO

RUNS = {
    # stage 0: in_proj + 1 block; stage 1: 9 blocks + head → 12 layers, 6 | 6 balanced
    "pp_unbalanced": ("train_pp.py", ["--schedule", "1f1b", "--microbatches", "4",
                                      "--layers-per-stage", "1,9", "--batch", "256"]),
    # 512 samples per microbatch: the bubble (1/3 of the window) outweighs the per-microbatch
    # fixed costs (gradient accumulation) that halving the microbatch adds. 2 blocks per stage
    # (6 layers): with 4 per stage, Interleaved1F1B with 4 stages per rank was predicted — and
    # measured: 193.9 vs 214.7 ms — about 10% faster than 4 microbatches, the margin at which
    # it is recommended first, so the top recommendation flipped between runs
    "pp_gpipe_few": ("train_pp.py", ["--schedule", "gpipe", "--microbatches", "2", "--steps", "16",
                                     "--batch", "1024", "--width", "512", "--layers", "2"]),
    "ddp_straggler": ("train_ddp.py", ["--slow-rank", "1", "--slow-ms", "30"]),
}
_cache: dict = {}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("recommend")

    def get(name):
        if name not in _cache:
            script, args = RUNS[name]
            out = base / name
            res = subprocess.run(
                [sys.executable, "-m", "pardiag", "profile", str(REPO / "examples" / script),
                 "--nproc-per-node", "2", "--out", str(out), "--", "--steps", "12", "--pin-cpu",
                 *args],
                capture_output=True, text=True, timeout=300, cwd=REPO)
            assert res.returncode == 0, res.stderr[-3000:]
            _cache[name] = build_report(load_traces(out))
        return _cache[name]
    return get


def test_unbalanced_pipeline_is_rebalanced(run):
    rep = run("pp_unbalanced")
    res = rep.results["recommendations"]
    # within the run's noise another change may tie: the answer is the top tier, a set
    (top,) = [c for c in res.top_tier if c.kind == "rebalance_stages"] or [None]
    assert top is not None, [(c.tier, c.change) for c in res.recommendations]
    # the planted split is 2 | 10 of 12 equal blocks; within the timing noise of a 2-core
    # machine an even split and one block either way are the same answer (a full run on an idle
    # machine gave 7,5 once in three)
    split = top.params["layers_per_stage"]
    assert split in ([6, 6], [7, 5], [5, 7]), split
    a = split[0]
    assert top.change.startswith(f"stage boundaries [0–{a - 1} | {a}–11] (child modules per "
                                 f"stage {a},{12 - a}; now [0–1 | 2–11])")
    assert top.predicted_step_us < top.measured_step_us
    # the evidence carries the measured numbers behind it
    assert any(e.startswith("forward+backward per microbatch by stage: S0 ") for e in top.evidence)
    tier1 = [c for c in report_json(rep)["recommendations"] if c["tier"] == 1]
    assert "rebalance_stages" in {c["kind"] for c in tier1}


def test_gpipe_with_few_microbatches_gets_more(run):
    res = run("pp_gpipe_few").results["recommendations"]
    mb = [c for c in (*res.recommendations, *res.rejected) if c.kind == "microbatches"]
    top = [c for c in res.top_tier if c.kind == "microbatches"]
    if top:
        assert top[0].params["microbatches"] > 2 and top[0].gain_pct >= res.min_gain_pct
    else:
        # a loaded machine: the steps' noise exceeds every microbatch change's predicted
        # gain, and the report does not claim one (nothing inside the noise is recommended)
        assert res.min_gain_pct > 2.0, [(c.tier, c.change) for c in res.recommendations]
        assert all(c.gain_pct < res.min_gain_pct and c.tier is None for c in mb)
    # data parallel instead of the pipeline is evaluated too (ranked after the changes that
    # keep the degrees, even when predicted faster)
    dp = [c for c in (*res.recommendations, *res.rejected) if c.kind == "pp_to_dp"]
    assert len(dp) == 1 and dp[0].params == {"pp": 1, "dp": 2}


def test_planted_straggler_is_named(run):
    res = run("ddp_straggler").results["recommendations"]
    (top,) = [c for c in res.top_tier if c.kind == "straggler"] or [None]
    assert top is not None, [(c.tier, c.change) for c in res.recommendations]
    assert (top.kind, top.params) == ("straggler", {"without_rank": 1})
    assert top.title == "Rank 1 is a straggler"
    # rank 1 sleeps 30 ms per step: removing it saves a good part of the step
    assert top.gain_pct > 20
    assert "; rank 1 is a straggler: it " in res.verdict
