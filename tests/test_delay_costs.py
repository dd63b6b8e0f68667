"""Stragglers as root causes by their delay cost on the execution graph: the step time a rank's
extra work costs the job, from the critical path's replay (Scalasca's delay costs). In a
pipeline the schedule's own bubble roots waiting at the first and last stages, so the rank that
causes the most waiting is often not the slow one; the delay cost is 0 for a rank no slower
than its peers however much waiting ends at it.

The jobs come from the ground-truth generator (benchmarks/multirank_gen.py), whose truth is the
planted slow rank."""

from __future__ import annotations

import pandas as pd
import pytest

import pardiag
from benchmarks.multirank_gen import Job, generate
from pardiag.analyzer.analyses.critical_path import DELAY_COLUMNS
from pardiag.analyzer.analyses.stragglers import straggler_by_delay_cost
from pardiag.analyzer.report.registry import report_json


def _report(tmp_path, **kw):
    job = Job(ranks_per_host=kw.pop("ranks_per_host", 8), seed=kw.pop("seed", 1), **kw)
    truth = generate(job, tmp_path / "job")
    return pardiag.analyze(tmp_path / "job", cache=False), truth


def test_a_slow_middle_stage_is_named_by_its_delay_cost(tmp_path):
    """1F1B over 4 stages, 8 microbatches, rank 2 computing 1.39 ms longer per step: the end
    stages cause the most waiting (the bubble's), yet only rank 2 costs the step anything. Its
    cost is what the planted excess costs a 1F1B step (at least its share of the excess on the
    steady state, at most the excess), every other rank's is a third of it or less; the
    synchronization analysis and the verdict name rank 2."""
    rep, truth = _report(tmp_path, mesh={"pp": 4}, schedule="pp_1f1b", microbatches=8,
                         slow_ranks={2: 1392.0}, metadata="seq")
    assert truth.straggler == 2
    costs = rep.critical_path.delay_costs
    assert list(costs.columns) == list(DELAY_COLUMNS)
    top = costs.iloc[0]
    assert int(top["rank"]) == 2 and int(top["steps_costly"]) == int(top["steps"]) >= 2
    assert 0.5 * 1392.0 <= top["delay_cost_us"] <= 1392.0
    assert top["excess_compute_us"] == pytest.approx(1392.0, rel=0.05)
    assert (costs["delay_cost_us"].iloc[1:] <= top["delay_cost_us"] / 3).all()
    # the waits alone point at an end stage: the one that causes the most is not rank 2
    assert int(rep.sync.stragglers.iloc[0]["rank"]) != 2
    assert rep.sync.straggler == 2 and rep.straggler == 2
    assert any(n.startswith("rank 2 named by its delay cost") for n in rep.sync.notes)
    assert not any(n.startswith("no straggler named") for n in rep.sync.notes)
    doc = report_json(rep)
    assert doc["critical_path"]["delay_costs"][0]["rank"] == 2
    assert "delays the pipeline" not in doc["verdict"]   # the criterion's name stays inside
    assert "rank 2 is a straggler: the steps replayed with its computation cut" in doc["verdict"]


def test_a_balanced_pipeline_names_nobody(tmp_path):
    """The same pipeline without a slow rank: no rank's delay cost stands out, nobody is
    named."""
    rep, truth = _report(tmp_path, mesh={"pp": 4}, schedule="pp_1f1b", microbatches=8,
                         metadata="seq")
    assert truth.straggler is None
    assert rep.sync.straggler is None and rep.straggler is None


def test_two_ranks_pair_their_transfers_without_a_recorded_peer(tmp_path):
    """GPipe over 2 ranks whose traces record no peer for their sends and receives (no
    metadata): in a world of two the peer is the other rank (a rank never sends to itself), so
    the transfers pair, the pipeline's waits are seen and the slowed rank 0 is named."""
    rep, truth = _report(tmp_path, mesh={"pp": 2}, schedule="pp_gpipe", microbatches=4,
                         slow_ranks={0: 1056.0}, metadata="none")
    assert truth.straggler == 0
    assert set(zip(rep.sync.p2p["src"], rep.sync.p2p["dst"])) == {(0, 1), (1, 0)}
    assert not any("without a known peer" in n for n in rep.sync.notes)
    assert rep.sync.straggler == 0


def test_transfers_without_a_peer_pair_by_their_ends(tmp_path):
    """pp 2 × dp 2 with no metadata and rank 2 slowed: no send or receive records its peer, but
    a send and its receive end together, so they pair by their ends (each stage's ranks with
    the other stage's), and rank 2 is named (rank 0, its data-parallel peer, was named
    before: late at the all-reduce because rank 2's sends were)."""
    rep, truth = _report(tmp_path, mesh={"pp": 2, "dp": 2}, schedule="pp_gpipe",
                         microbatches=4, slow_ranks={2: 1471.0}, metadata="none", seed=3)
    assert truth.straggler == 2
    assert not any("without a known peer" in n for n in rep.sync.notes)
    assert any(n.endswith("were paired by their ends (a send and its receive end together, "
                          "within 10 µs)") for n in rep.sync.notes)
    stages = {frozenset(p) for p in zip(rep.sync.p2p["src"], rep.sync.p2p["dst"])}
    assert all(len(p & {0, 1}) == 1 for p in stages)   # every pair crosses the stages
    assert rep.sync.straggler == 2


def test_unpaired_transfers_name_nobody_from_the_collectives():
    """Transfers whose peer stays unknown break the chain of causes: a rank late at its
    all-reduce may be late because a rank that sends to it was, so the waits at collectives
    name nobody, and a note says why. Ends that do not meet (other hosts' clocks) pair
    nothing."""
    from pardiag.analyzer.analyses.matching import peers_by_ends

    ev = pd.DataFrame({"rank": [0, 1, 0, 1], "op": ["send", "recv", "send", "recv"],
                       "peer": [None, None, None, None], "bytes": [None] * 4,
                       "start_us": [0.0, 0.0, 100.0, 90.0], "end_us": [50.0, 50.0, 150.0, 150.0]})
    out, note = peers_by_ends(ev)
    assert list(out["peer"]) == [1, 0, 1, 0] and note.startswith("4 point-to-point op(s)")
    apart = ev.assign(end_us=[50.0, 950.0, 150.0, 1050.0])   # 900 µs apart: another clock
    out, note = peers_by_ends(apart)
    assert note is None and out["peer"].isna().all()
    # the k-th send must meet the k-th receive: crossed orders pair nothing
    crossed = ev.assign(start_us=[0.0, 95.0, 100.0, 0.0])
    assert peers_by_ends(crossed)[1] is None


def test_transfers_in_lockstep_pair_by_elimination():
    """No peers recorded. Three stages: rank 0's send ends with the receives of ranks 1 and 2,
    rank 1's (batched with its receive) with rank 2's only (its own receive is no candidate):
    rank 1's takes rank 2's, so rank 0's has rank 1's left. Four ranks: once 0→1, 2→3, 0→3 and
    2→1 have each been seen alone, ranks 0 and 2 send while ranks 1 and 3 receive, every pair
    established; rank 1's receive ends with rank 0's send and rank 3's 3 µs later with rank 2's:
    each takes the nearer. Were all four to end together nothing would tell 0→1 from 0→3, and
    as too few ops would pair, none is paired (unknown, not a guess)."""
    from pardiag.analyzer.analyses.matching import peers_by_ends

    def frame(rows):
        return pd.DataFrame([{"rank": r, "op": op, "peer": None, "bytes": None,
                              "start_us": e - 20.0, "end_us": e} for r, op, e in rows])

    out, note = peers_by_ends(frame([(0, "send", 100.0), (1, "recv", 100.0),
                                     (1, "send", 100.0), (2, "recv", 100.0)]))
    assert note is not None and note.startswith("4 point-to-point op(s)")
    assert list(out["peer"]) == [1, 0, 2, 1]
    seen = [(0, "send", 10.0), (1, "recv", 10.0), (2, "send", 30.0), (3, "recv", 30.0),
            (0, "send", 50.0), (3, "recv", 50.0), (2, "send", 70.0), (1, "recv", 70.0)]
    out, note = peers_by_ends(frame(seen + [(0, "send", 100.0), (1, "recv", 100.0),
                                            (2, "send", 103.0), (3, "recv", 103.0)]))
    assert note is not None and note.startswith("12 point-to-point op(s)")
    assert list(out["peer"]) == [1, 0, 3, 2, 3, 0, 1, 2, 1, 0, 3, 2]
    out, note = peers_by_ends(frame(seen + [(0, "send", 100.0), (1, "recv", 100.0),
                                            (2, "send", 100.0), (3, "recv", 100.0)]))
    assert note is None and out["peer"].isna().all()


def _costs(*rows):
    return pd.DataFrame([dict(zip(DELAY_COLUMNS, r)) for r in rows], columns=list(DELAY_COLUMNS))


@pytest.mark.parametrize("rows, step, named", [
    # rank, steps, steps_costly, excess, cost, iqr
    ([(2, 4, 4, 500.0, 300.0, 5.0), (3, 4, 1, 1.0, 0.0, 0.0)], 20_000.0, 2),
    ([(2, 4, 4, 500.0, 300.0, 5.0), (3, 4, 4, 200.0, 101.0, 5.0)], 20_000.0, None),  # < 3x
    ([(2, 4, 4, 500.0, 300.0, 5.0)], 80_000.0, None),          # under 0.5% of the step
    ([(2, 4, 3, 500.0, 300.0, 5.0)], 20_000.0, None),          # 3 of 4 steps: < 80%
    ([(2, 5, 4, 500.0, 300.0, 5.0)], 20_000.0, 2),             # 4 of 5: 80%
    ([(2, 1, 1, 500.0, 300.0, 0.0)], 20_000.0, None),          # one step
    ([(2, 4, 4, 500.0, 300.0, 400.0)], 20_000.0, None),        # inside its own spread
    ([(2, 4, 4, 9.0, 9.0, 0.0)], 1000.0, None),                # under 10 µs
    ([], 20_000.0, None),
])
def test_the_delay_cost_rule(rows, step, named):
    """Named only when the top cost is 3x the next, ≥ 10 µs and 0.5% of the step, costs in 80%
    of two or more steps and stands above its own interquartile range."""
    assert straggler_by_delay_cost(_costs(*rows), step) == named


def test_the_page_names_the_costly_rank_beside_the_one_waited_for(tmp_path):
    """The stragglers section of the page says which rank's computation costs the step and that
    the rank causing the most waiting causes the schedule's, with the cost by replay."""
    from pardiag.analyzer.render.html import render_html

    rep, _ = _report(tmp_path, mesh={"pp": 4}, schedule="pp_1f1b", microbatches=8,
                     slow_ranks={2: 1392.0}, metadata="seq")
    page = render_html(rep, include_plotlyjs=False)
    cost = rep.critical_path.delay_costs.iloc[0]["delay_cost_us"] / 1000
    top = int(rep.sync.stragglers.iloc[0]["rank"])
    assert (f"The rank whose extra computation costs the step most: <b>rank 2</b> "
            f"({cost:.3f} ms per step, by replay of the execution graph); rank {top} causes "
            f"the most waiting") in page


def test_transfers_across_clocks_stay_unpaired_and_name_nobody(tmp_path):
    """The same job with each stage on its own host, 700 µs apart: ends on two clocks do not
    meet, the transfers stay unpaired, and the lateness at the data-parallel all-reduces names
    nobody (unknown, never a rank whose lateness may be its sender's)."""
    rep, truth = _report(tmp_path, mesh={"pp": 2, "dp": 2}, schedule="pp_gpipe",
                         microbatches=4, slow_ranks={2: 1471.0}, metadata="none", seed=3,
                         ranks_per_host=2, host_offset_us={1: 700.0})
    assert truth.straggler == 2
    assert any("without a known peer" in n for n in rep.sync.notes)
    assert rep.sync.straggler is None
    assert any(n.startswith("no straggler named: rank") and "no known peer" in n
               for n in rep.sync.notes)


def test_the_straggler_change_is_predicted_by_the_replay(tmp_path):
    """The change 'if rank 2 were not slow' of the slow middle stage saves its delay cost (the
    graph's replay), and the run without the planted excess is that much shorter within 10%
    (the others' waiting for rank 2, which holds the bubble's too, overstates it by 40%)."""
    rep, _ = _report(tmp_path / "slow", mesh={"pp": 4}, schedule="pp_1f1b", microbatches=8,
                     slow_ranks={2: 1392.0}, metadata="seq")
    fast, _ = _report(tmp_path / "fast", mesh={"pp": 4}, schedule="pp_1f1b", microbatches=8,
                      metadata="seq")
    res = rep.results["recommendations"]
    change = next(c for c in (*res.recommendations, *res.rejected) if c.kind == "straggler")
    cost = float(rep.critical_path.delay_costs.iloc[0]["delay_cost_us"])
    saving = change.measured_step_us - change.predicted_step_us
    assert saving == pytest.approx(cost)
    assert any(e.startswith("predicted by replay of the execution graph") for e in change.evidence)
    true_saving = (rep.critical_path.steps["measured_us"].median()
                   - fast.critical_path.steps["measured_us"].median())
    assert saving == pytest.approx(true_saving, rel=0.10)


def test_a_rank_the_waits_name_stays_named_when_its_whole_work_costs_the_step(tmp_path):
    """No rank's computation stands out (a rank that sleeps computes no more than its peers):
    the rank the waits name stays named when the replay without its extra work (a sleep, host
    work) saves the step a clear share, and is no longer named when that saves nothing (the
    waiting was the schedule's bubble), with a note saying so."""
    import dataclasses

    rep, _ = _report(tmp_path, mesh={"pp": 4}, schedule="pp_1f1b", microbatches=8,
                     metadata="seq")
    sync = dataclasses.replace(rep.sync, straggler=1)
    none = pd.DataFrame(columns=list(DELAY_COLUMNS))
    sleeping = _costs((1, 4, 4, 40_000.0, 35_000.0, 100.0))
    assert sync.with_graph_straggler(none, 100_000.0, sleeping).straggler == 1
    idle = _costs((1, 4, 1, 3.0, 0.0, 0.0))
    out = sync.with_graph_straggler(none, 100_000.0, idle)
    assert out.straggler is None
    assert out.notes[-1].startswith("no straggler named: rank 1 causes the most waiting, but "
                                    "the steps replayed with its work cut to the other ranks' "
                                    "median end 0 µs earlier per step")
    # its extra work mostly time outside computation (38 of 40 ms) whose own replay saves
    # 50 µs: the schedule hides the sleep (a last stage that waits for its first forward
    # anyway); the whole work's replay, which shortens its computation too, does not decide
    hidden = _costs((1, 4, 4, 38_000.0, 50.0, 0.0))
    out = sync.with_graph_straggler(none, 100_000.0, sleeping, hidden)
    assert out.straggler is None
    assert out.notes[-1].startswith("no straggler named: rank 1 causes the most waiting, but "
                                    "its extra time is mostly outside computation (38000 µs "
                                    "per step: host work, a sleep), and the steps replayed "
                                    "with that time cut to the other ranks' median end only 50 "
                                    "µs earlier per step")
    # ... but 15 of 40 ms outside computation is not most of it: the whole work's cost decides
    partly = _costs((1, 4, 4, 15_000.0, 50.0, 0.0))
    assert sync.with_graph_straggler(none, 100_000.0, sleeping, partly).straggler == 1
    # outside a pipeline (waits at collectives) the graph's costs change nothing
    ddp, _ = _report(tmp_path / "ddp", mesh={"dp": 4}, schedule="ddp", slow_ranks={2: 900.0},
                     metadata="seq")
    assert ddp.sync.with_graph_straggler(none, 100_000.0, idle).straggler == 2


def test_no_wait_as_evidence_names_nobody_and_the_page_still_renders(tmp_path):
    """Every matched transfer at a window's head (a plain profiler's traces that start apart):
    no wait is evidence, so the graph's costs name nobody either; a synchronization result that
    names a rank with no table row still renders (it raised IndexError on the page)."""
    import dataclasses

    from pardiag.analyzer.render.html import render_html

    rep, _ = _report(tmp_path, mesh={"pp": 4}, schedule="pp_1f1b", microbatches=8,
                     slow_ranks={2: 1392.0}, metadata="seq")
    bare = dataclasses.replace(rep.sync, straggler=None, stragglers=rep.sync.stragglers.iloc[:0])
    costs = rep.critical_path.delay_costs
    assert bare.with_graph_straggler(costs, 17_000.0).straggler is None
    named = dataclasses.replace(bare, straggler=2)
    page = render_html(dataclasses.replace(rep, sync=named), include_plotlyjs=False)
    assert "Stragglers" in page


@pytest.mark.parametrize("kw, slow, planted", [
    # a first stage's host: every later stage waits for it, whatever the schedule
    (dict(mesh={"pp": 4}, schedule="pp_1f1b", microbatches=8, metadata="seq"), 0, 1400.0),
    # pp 2 × dp 2, no metadata: the transfers pair by their ends
    (dict(mesh={"pp": 2, "dp": 2}, schedule="pp_interleaved", microbatches=8, metadata="none",
          seed=4), 1, 1200.0),
])
def test_a_rank_slow_on_its_host_is_named_by_its_time_outside_computation(
        tmp_path, kw, slow, planted):
    """A GPU pipeline whose rank sleeps on its host before each step's launches (no kernel
    longer than its peers'): its computation's delay cost names nobody, the cost of its time
    outside computation (the window replayed step after step, that time cut to its peers')
    is the planted sleep per step (the generator's truth re-simulates the job without it), so
    the synchronization analysis and the verdict name it, and the page says what it cost."""
    from pardiag.analyzer.render.html import render_html

    rep, truth = _report(tmp_path, host_slow_ranks={slow: planted}, **kw)
    assert truth.straggler == slow and truth.straggler_judged
    assert straggler_by_delay_cost(rep.critical_path.delay_costs, 1e4) is None
    out = rep.critical_path.outside_costs()
    assert list(out.columns) == list(DELAY_COLUMNS)
    assert int(out.iloc[0]["rank"]) == slow
    assert out.iloc[0]["delay_cost_us"] == pytest.approx(planted, rel=0.02)
    assert out.iloc[0]["excess_compute_us"] == pytest.approx(planted, rel=0.02)
    assert (out["delay_cost_us"].iloc[1:] <= 1.0).all()
    assert rep.sync.straggler == slow and rep.straggler == slow
    assert rep.sync.straggler_outside_cost_us == pytest.approx(planted, rel=0.02)
    assert any(n.startswith(f"rank {slow} named by the delay cost of its time outside "
                            f"computation") for n in rep.sync.notes)
    doc = report_json(rep)
    assert doc["sync"]["straggler"] == slow
    assert (f"rank {slow} is a straggler: the steps replayed with its time outside computation "
            f"(host work, a sleep) cut to its peers' median end "
            f"{rep.sync.straggler_outside_cost_us / 1000:.2f} ms earlier") in doc["verdict"]
    page = render_html(rep, include_plotlyjs=False)
    if int(rep.sync.stragglers.iloc[0]["rank"]) != slow:
        assert (f"The rank whose extra time outside computation (host work, a sleep) costs the "
                f"step most: <b>rank {slow}</b>") in page


@pytest.mark.parametrize("steps", [None, 6])
def test_a_host_delay_the_schedule_hides_names_nobody(tmp_path, steps):
    """1F1B over 4 stages, rank 2's host sleeping 1.4 ms before each step's launches: stage 2
    waits for its first input longer than that anyway, so the sleep costs the job nothing
    (the generator's truth: the job re-simulated without it steps as fast) and the replay of
    the window step after step says so; nobody is named, though rank 2 arrives last at
    transfers and idles 1.4 ms (9% of the step) longer than the others in every step: the
    traces mark no microbatch, but nearly every wait is at a point-to-point transfer, so
    idling is held to a pipeline's bar (20% of the step), where a bubble is idle by design."""
    kw = {} if steps is None else {"steps": steps}
    rep, truth = _report(tmp_path, mesh={"pp": 4}, schedule="pp_1f1b", microbatches=8,
                         host_slow_ranks={2: 1400.0}, metadata="seq", **kw)
    assert truth.straggler is None and truth.straggler_judged
    out = rep.critical_path.outside_costs()
    assert int(out.iloc[0]["rank"]) == 2
    assert out.iloc[0]["excess_compute_us"] == pytest.approx(1400.0, rel=0.02)
    assert out.iloc[0]["delay_cost_us"] < 0.01 * 1400.0   # under 1% of the sleep
    assert rep.sync.straggler is None and rep.straggler is None
    assert rep.sync.straggler_outside_cost_us is None


@pytest.mark.parametrize("slow_us", [150.0, 600.0])
def test_a_slow_tp_rank_whose_peers_pass_its_delay_on_is_named_by_its_delay_cost(tmp_path,
                                                                                slow_us):
    """dp 4 × tp 2 on GPUs, rank 5 computing ``slow_us`` longer per step: its TP peer waits for
    it, then reaches its own DP all-reduce late, so the waits name the peer as a cause of
    waiting too and no rank dominates them. The execution graph's delay costs do: only rank
    5's extra computation costs the step, and the verdict names it (the synchronization
    analysis, which counts waits, still names nobody)."""
    rep, truth = _report(tmp_path, mesh={"dp": 4, "tp": 2}, schedule="tp", steps=4,
                         slow_ranks={5: slow_us}, metadata="seq")
    assert truth.straggler == 5
    assert rep.sync.straggler is None
    assert rep.straggler == 5
    costs = rep.critical_path.delay_costs.set_index("rank")["delay_cost_us"]
    assert costs.idxmax() == 5
    assert "rank 5 is a straggler: the steps replayed with its computation cut" in rep.verdict
