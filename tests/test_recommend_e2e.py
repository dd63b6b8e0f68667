"""Recommendations on real CPU/gloo runs of the examples: an unbalanced pipeline is
told to move layers (with the right boundaries), GPipe with few microbatches to use more, and a
planted straggler is named."""

import subprocess
import sys

import pytest

from pardiag.analyzer.report.registry import build_report, report_json
from pardiag.analyzer.trace import load_traces

from .paths import REPO

#: Every test here starts a training job.
pytestmark = pytest.mark.e2e

RUNS = {
    # stage 0: in_proj + 1 block; stage 1: 9 blocks + head → 12 layers, 6 | 6 balanced
    "pp_unbalanced": ("train_pp.py", ["--schedule", "1f1b", "--microbatches", "4",
                                      "--layers-per-stage", "1,9", "--batch", "256"]),
    # stage 0: in_proj + 3 blocks; stage 1: 3 blocks + head → 4 | 4 child modules, even
    "pp_balanced": ("train_pp.py", ["--schedule", "1f1b", "--microbatches", "4",
                                    "--layers-per-stage", "3,3", "--batch", "128"]),
    # 512 samples per microbatch: the bubble (1/3 of the window) outweighs the per-microbatch
    # fixed costs (gradient accumulation) that halving the microbatch adds. 2 blocks per stage
    # (6 layers): with 4 per stage, Interleaved1F1B with 4 stages per rank was predicted — and
    # measured: 193.9 vs 214.7 ms — about 10% faster than 4 microbatches, the margin at which
    # it is recommended first, so the top recommendation flipped between runs
    "pp_gpipe_few": ("train_pp.py", ["--schedule", "gpipe", "--microbatches", "2", "--steps", "16",
                                     "--batch", "1024", "--width", "512", "--layers", "2"]),
    # 150 ms, far above the noise of two test workers on 2 cores: with 30 ms a run under a
    # second suite's load predicted a 12.8 ms saving of a 102 ms step, and with 60 ms another
    # worker's ranks on the same cores slowed rank 0 about as much as the sleep (21.9% of the
    # ranks' time waiting, where an idle machine shows 35–40%): no rank met the criteria
    "ddp_straggler": ("train_ddp.py", ["--slow-rank", "1", "--slow-ms", "150"]),
    # a pipeline rank that sleeps 40 ms per step: named by the idle criterion, which a
    # pipeline's bubble alone does not meet (the unplanted examples' last stage idles 8–13%)
    "pp_straggler": ("train_pp.py", ["--schedule", "1f1b", "--microbatches", "4",
                                     "--slow-rank", "1", "--slow-ms", "40"]),
    # ScheduleLoopedBFS, 4 stages looped on 2 ranks, the last stage 9 blocks + head: a schedule
    # pardiag does not generate, replayed in its own order
    "pp_looped_heavy": ("train_pp.py", ["--schedule", "looped-bfs", "--microbatches", "4",
                                        "--layers-per-stage", "1,1,1,9"]),
}
_cache: dict = {}
#: Run folders of the profiled RUNS (what compare reads again).
_folders: dict = {}


def _profile(out, script, args):
    res = subprocess.run(
        [sys.executable, "-m", "pardiag", "profile", str(REPO / "examples" / script),
         "--nproc-per-node", "2", "--out", str(out), "--", "--steps", "12", "--pin-cpu", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("recommend")

    def get(name):
        if name not in _cache:
            script, args = RUNS[name]
            _folders[name] = _profile(base / name, script, args)
            _cache[name] = build_report(load_traces(_folders[name]))
        return _cache[name]
    return get


def test_unbalanced_pipeline_is_rebalanced(run):
    rep = run("pp_unbalanced")
    res = rep.results["recommendations"]
    # within the run's noise another change may tie: the answer is the top tier, a set
    top = next((c for c in res.recommendations if c.kind == "rebalance_stages"), None)
    if top is None:
        # a loaded machine (another test suite on the same cores): the steps' noise exceeds
        # the move's predicted gain, and the report does not claim it
        # (or the replay explains too little of the step for its advice: the interval of
        # what it leaves unexplained reaches the measured step), and the report says which
        (ev,) = [c for c in res.rejected if c.kind == "rebalance_stages"]
        assert ((res.min_gain_pct > 2.0 and ev.gain_pct < res.min_gain_pct)
                or ev.interval_spans_no_gain), [(c.tier, c.change) for c in res.recommendations]
        assert ev.reason.startswith(("below the noise", "its interval")), ev.reason
        top = ev
    else:
        first = min(c.tier for c in res.recommendations if c.kind not in ("pp_to_dp", "degrees"))
        if top.tier != first:
            # another bubble remedy may be predicted to save more than the move plus the noise:
            # interleaving, whose own stage boundaries balance the blocks too, or more
            # microbatches (a loaded 2-core machine's chunk timings tip it: the fully loaded
            # CI rehearsal put interleaving ahead with the noise under the 2% floor); only
            # such remedies rank ahead
            ahead = [c for c in res.recommendations if c.tier == first]
            assert all(c.kind in ("microbatches", "schedule", "interleave") for c in ahead), \
                [(c.tier, c.kind, c.change) for c in res.recommendations]
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
    if top.tier is not None:
        assert top.change in {c["change"] for c in report_json(rep)["recommendations"]
                              if c["tier"] == top.tier}


def test_gpipe_with_few_microbatches_gets_more(run):
    res = run("pp_gpipe_few").results["recommendations"]
    mb = [c for c in (*res.recommendations, *res.rejected) if c.kind == "microbatches"]
    tiered = sorted((c for c in mb if c.tier is not None), key=lambda c: c.tier)
    if tiered:
        best = tiered[0]
        assert best.params["microbatches"] > 2 and best.gain_pct >= res.min_gain_pct
        # on a loaded machine another bubble remedy (1F1B, interleaving) can be predicted to
        # save more than the extra microbatches plus the noise; only such remedies rank ahead
        ahead = [c for c in res.recommendations if c.tier < best.tier]
        assert all(c.kind in ("schedule", "interleave") for c in ahead), \
            [(c.tier, c.kind, c.change) for c in res.recommendations]
    else:
        # a loaded machine: the steps' noise exceeds every microbatch change's predicted
        # gain, or the interval of the timings it rests on reaches the measured step, and the
        # report does not claim one (nothing inside the noise is recommended)
        assert mb and all(c.tier is None for c in mb)
        assert all(c.gain_pct < res.min_gain_pct or c.interval_spans_no_gain for c in mb), \
            [(c.gain_pct, c.reason) for c in mb]
    # data parallel instead of the pipeline is evaluated too (ranked after the changes that
    # keep the degrees, even when predicted faster)
    dp = [c for c in (*res.recommendations, *res.rejected) if c.kind == "pp_to_dp"]
    assert len(dp) == 1 and dp[0].params == {"pp": 1, "dp": 2}


def test_planted_straggler_is_named(run):
    res = run("ddp_straggler").results["recommendations"]
    # the verdict names it by the straggler criteria
    assert "; rank 1 is a straggler: it " in res.verdict
    (top,) = [c for c in res.recommendations if c.kind == "straggler"] or [None]
    if top is None:   # a loaded machine: its predicted gain did not clear the noise margin,
        # or the interval of the timings it rests on reaches the measured step
        (ev,) = [c for c in res.rejected if c.kind == "straggler"]
        assert ev.params == {"without_rank": 1}
        assert ev.gain_pct < res.min_gain_pct or ev.interval_spans_no_gain, ev.reason
        return
    assert (top.kind, top.params) == ("straggler", {"without_rank": 1})
    assert top.title == "Rank 1 is a straggler"
    # rank 1 sleeps 150 ms per step: removing it saves at least a quarter of that (as a share
    # of the step it depends on the load)
    assert top.measured_step_us - top.predicted_step_us > 37_500, \
        (top.measured_step_us, top.predicted_step_us)
    assert "; rank 1 is a straggler: it " in res.verdict


def _with_params(args: list[str], params: dict) -> list[str]:
    """``train_pp.py``'s arguments with a pipeline recommendation's ``params`` applied: its
    ``--layers-per-stage`` counts blocks, while ``layers_per_stage`` counts each stage's child
    modules (the first stage also holds the input projection, the last the head)."""
    def put(a, flag, value):
        out = [x for i, x in enumerate(a) if x != flag and (i == 0 or a[i - 1] != flag)]
        return [*out, flag, value]

    a = list(args)
    if "microbatches" in params:
        a = put(a, "--microbatches", str(params["microbatches"]))
    if params.get("schedule") == "interleaved":
        a = put(put(a, "--schedule", "interleaved"), "--stages-per-rank",
                str(params["stages_per_rank"]))
    if "layers_per_stage" in params:
        blocks = list(params["layers_per_stage"])
        blocks[0] -= 1
        blocks[-1] -= 1
        a = put(a, "--layers-per-stage", ",".join(map(str, blocks)))
    return a


def test_compare_closes_the_loop_on_the_top_recommendation(run, tmp_path):
    """Profile the unbalanced 1F1B example, apply its top recommendation's params to the
    example's arguments, profile again: compare names the change as A's first recommendation,
    with the predicted step time next to B's measured one."""
    import json

    rep_a = run("pp_unbalanced")
    recs = rep_a.recommendations
    # the first recommendation the example's arguments can express; on a loaded machine the
    # run's noise may leave none of them recommended: then the best one evaluated
    runnable = ("rebalance_stages", "microbatches", "interleave")
    pool = [c for c in recs.recommendations if c.kind in runnable] or sorted(
        (c for c in recs.rejected if c.kind in runnable and not c.ruled_out),
        key=lambda c: c.predicted_step_us)
    top = pool[0]
    rank = next((i for i, c in enumerate(recs.recommendations, 1) if c is top), None)
    script, args = RUNS["pp_unbalanced"]
    b = _profile(tmp_path / "applied", script, _with_params(args, top.params))
    out = tmp_path / "compare.json"
    res = subprocess.run([sys.executable, "-m", "pardiag", "compare",
                          str(_folders["pp_unbalanced"]), str(b), "-o",
                          str(tmp_path / "compare.html"), "--json", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    checks = [c for c in data["recommendation_checks"] if c["status"] == "applied"]
    assert [(c["kind"], c["rank"]) for c in checks] == [(top.kind, rank)], \
        data["recommendation_checks"]
    check = checks[0]
    b_step = data["step"]["b"]     # B's step as its own report measures it
    assert check["predicted_step_us"] == pytest.approx(top.predicted_step_us)
    assert check["b_step_us"] == b_step["median_us"] and b_step["basis"] == "pipeline"
    assert check["error_pct"] == pytest.approx(
        100 * (top.predicted_step_us - b_step["median_us"]) / b_step["median_us"])
    assert check["args_changed"] and all(x.startswith(("--layers-per-stage", "--microbatches",
                                                       "--schedule", "--stages-per-rank"))
                                         for x in check["args_changed"])
    # the terminal says it in one sentence, and the setup table shows what changed
    if rank == 1:
        assert "B made the change A's report recommended first (" in res.stdout
    changed = {r["field"] for r in data["setup"] if r["status"] == "changed"}
    assert changed & {"layers_per_stage", "microbatches", "pipeline_schedule"}


def test_planted_pipeline_straggler_is_named(run):
    rep = run("pp_straggler")
    res = rep.results["recommendations"]
    if "rank 1 is a straggler: it idles " not in res.verdict:
        # a loaded machine (a second suite's training jobs on the same 2 cores): the steps'
        # noise can keep the pipeline's margin (20% of the step more than the others, in 80%
        # of the steps) from being met; the planted 40 ms sleep still shows as rank 1's idle
        st = rep.time_breakdown.steps
        idle = st.pivot_table(index="step", columns="rank", values="idle_us")
        assert (idle[1] - idle[0]).median() >= 15_000.0, (res.verdict, idle)
        assert "is a straggler" not in res.verdict or "rank 1 is a straggler" in res.verdict
    # the pipeline's changes are replayed on its schedule: no 'without the straggler' change
    assert not [c for c in (*res.recommendations, *res.rejected) if c.kind == "straggler"]


def test_a_balanced_pipeline_is_never_told_to_unbalance(run):
    """Even stages (4 | 4 child modules): whatever the machine's load does to the chunks'
    timings, no recommendation moves the boundary by more than one module, and none points to
    a split the stage model finds more uneven than the measured one."""
    from pardiag.analyzer.predict.recommend import build_context
    from pardiag.analyzer.predict.recommend.rules.pipeline import imbalance

    rep = run("pp_balanced")
    res = rep.results["recommendations"]
    for c in (*res.recommendations, *res.rejected):
        if c.kind == "rebalance_stages":
            assert c.params["layers_per_stage"] in ([3, 5], [4, 4], [5, 3]), c.change
    # the verdict claims a saving from moving the boundaries only when one is recommended
    assert "moving the stage boundaries saves" not in res.verdict or any(
        c.kind == "rebalance_stages" for c in res.recommendations)
    ctx = build_context(rep.traces, dict(rep.results))
    measured = imbalance([f + b for f, b in zip(ctx.model.fwd_us, ctx.model.bwd_us)])
    for c in res.recommendations:
        if c.kind == "rebalance_stages":
            f, b, _ = ctx.model.partition_costs(c.params["layers_per_stage"])
            assert imbalance([x + y for x, y in zip(f, b)]) < measured


def test_a_heavy_stage_of_looped_bfs_is_rebalanced_in_its_own_order(run):
    """LoopedBFS is no schedule pardiag generates: its model replays the run's own order (every
    forward of a stage before the next stage's, then the backwards in reverse), moving the
    layers off the heavy last stage is evaluated in that order, other microbatch counts in the
    orders torch's class gives for them (recorded by profile), and never another schedule."""
    from pardiag.analyzer.predict.replay import pipeline_model

    rep = run("pp_looped_heavy")
    model, why = pipeline_model(load_traces(_folders["pp_looped_heavy"]),
                                rep.results["pipeline"])
    assert model is not None and model.observed, why
    res = rep.results["recommendations"]
    sched = rep.results["pipeline"].schedule
    assert sched["schedule"] == "ScheduleLoopedBFS" and (sched["p"], sched["m"], sched["v"]) == (
        2, 4, 2)
    kinds = {c.kind for c in (*res.recommendations, *res.rejected)}
    assert kinds.isdisjoint({"interleave", "schedule"}), kinds
    assert sorted(model.recorded_orders) == [2, 8, 16]
    assert {c.params["microbatches"] for c in (*res.recommendations, *res.rejected)
            if c.kind == "microbatches"} <= {2, 8, 16}
    top = next((c for c in res.recommendations if c.kind == "rebalance_stages"), None)
    if top is None:   # a loaded machine: the report says why it withholds the move
        (top,) = [c for c in res.rejected if c.kind == "rebalance_stages"]
        assert top.reason.startswith(("below the noise", "its interval")), top.reason
    split = top.params["layers_per_stage"]
    # 14 child modules (in_proj, 12 blocks, head) now 2,1,1,10; stages 0 and 2 run on rank 0,
    # 1 and 3 on rank 1: the move evens the ranks out
    assert sum(split) == 14 and len(split) == 4
    assert abs((split[0] + split[2]) - (split[1] + split[3])) <= 2, split
    assert top.predicted_step_us < top.measured_step_us
