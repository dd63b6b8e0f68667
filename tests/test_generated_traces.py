"""The cross-rank conclusions on traces of the ground-truth generator (benchmarks/multirank_gen):
who is the straggler (or nobody), clock offsets within 20 µs, the layout, per-op counts.

The benchmark (benchmarks/cross_rank_accuracy.py) runs a thousand random jobs; here a few fixed
seeds of every kind and a derandomized property test keep the same judge in CI."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import pardiag
from benchmarks.cross_rank_accuracy import judge, run_one
from benchmarks.multirank_gen import KINDS, METADATA, Job, generate
from pardiag.analyzer.analyses.clocks import fit_line, theil_sen
from pardiag.analyzer.analyses.sync import compute_sync
from pardiag.analyzer.trace import load_traces

#: Jobs the benchmark once got wrong, each with what went wrong (kind:metadata:seed).
FOUND = {
    "dropped:records:202142728": "a record placed on its host op compared with kernel times",
    "drift:seq:479402028": "offsets stated at the first collective, not the window's start",
    "drift:none:391578343": "offsets stated at the first collective, not the window's start",
    "dropped:none:605441630": "an all_to_all of lost kernels without records dropped",
    "dropped:none:92259244": "lost kernels shifted the alignment within a step",
    "dropped:seq:851864842": "issued ops whose kernels were lost not counted",
    "coalesced:seq:474769608": "a coalesced block counted once, not per member",
    "coalesced:none:157197671": "a coalesced block counted once, not per member",
    "coalesced:none:671455124": "a few µs of lateness per step named a straggler",
    "xpu_oneccl:seq:277756007": "oneCCL's reduce_scatter kernel read as a reduce",
    "pipeline:seq:252956896": "groups described as 'undefined' gave no layout",
    "mesh_layout:names:386046157": "groups described as 'undefined' gave no layout",
    "independent_groups:seq:597350286": "twin groups of other descriptions split instances",
    "independent_groups:none:289043724": "replicas no collective joins matched as one group",
    "independent_groups:records:742486493": "a straggler's cost shared over the whole world",
    "deepspeed_pipe:none:3": "a loss broadcast on unknown groups: a guessed root named a straggler",
    "pipeline_host_straggler:names:898466117": "a lockstep stage held by its send in the replay",
}


def _check(kind: str, meta: str, seed: int) -> None:
    res, truth = run_one(kind, meta, seed)
    for metric, ok in res.items():
        assert ok is not False, (metric, kind, meta, seed, truth.notes)


#: Kinds whose straggler is not yet found in every job (benchmarks/cross_rank_accuracy.py
#: measures how often); none now.
SHORT_OF_GOAL: frozenset[str] = frozenset()


def _two_levels() -> list[tuple[str, str]]:
    """Every kind at two metadata levels, the levels rotating over the kinds (each level with
    about half of them): the benchmark (benchmarks/cross_rank_accuracy.py) draws every pair;
    here a regression in any kind or any level shows, at half the suite's time."""
    kinds = sorted(set(KINDS) - SHORT_OF_GOAL)
    n = len(METADATA)
    return [(k, METADATA[(i + j) % n]) for i, k in enumerate(kinds) for j in (0, n // 2)]


@pytest.mark.parametrize("kind,meta", _two_levels())
def test_every_kind_at_two_metadata_levels_fixed_seed(kind, meta):
    _check(kind, meta, 7)


def test_the_fixed_seed_grid_covers_every_kind_and_level():
    pairs = _two_levels()
    assert {k for k, _ in pairs} == set(KINDS) - SHORT_OF_GOAL
    assert {m for _, m in pairs} == set(METADATA)
    assert all(len({m for k2, m in pairs if k2 == k}) == 2 for k, _ in pairs)


@pytest.mark.parametrize("job", sorted(FOUND))
def test_jobs_once_wrong_stay_right(job):
    kind, meta, seed = job.split(":")
    _check(kind, meta, int(seed))


@settings(derandomize=True, max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(kind=hs.sampled_from(sorted(set(KINDS) - SHORT_OF_GOAL)),
       meta=hs.sampled_from(["seq", "names", "none"]),
       seed=hs.integers(0, 2 ** 30))
def test_random_jobs_hold_their_truth(kind, meta, seed):
    _check(kind, meta, seed)


def test_planted_slow_rank_offsets_and_drift_are_recovered(tmp_path):
    """DDP over 4 hosts of 2 ranks, offsets per host, drift on host 2, rank 5 slowed 900 µs a
    step: the straggler is rank 5, every offset within 20 µs, the drift within its interval."""
    job = Job(mesh={"dp": 8}, schedule="ddp", steps=12, ranks_per_host=2,
              slow_ranks={5: 900.0}, host_offset_us={1: 700.0, 2: -450.0, 3: 120.0},
              host_drift_us_per_s={2: 40.0}, metadata="names", compute_scale=50.0, seed=3)
    truth = generate(job, tmp_path)
    from benchmarks.cross_rank_accuracy import analyse

    doc = analyse(tmp_path, truth)
    assert doc["sync"]["straggler"] == truth.straggler == 5
    offs = {o["rank"]: o for o in doc["sync"]["clock_offsets"]}
    for r, v in truth.offset_us.items():
        assert offs[r]["offset_us"] - offs[0]["offset_us"] == pytest.approx(v, abs=20.0)
    for r in (4, 5):
        d = offs[r]["drift_us_per_s"]
        assert abs(d - truth.drift_us_per_s[r]) <= max(offs[r]["drift_ci_us_per_s"], 2.0)
    assert judge(truth, doc, "names")["straggler"]


@pytest.mark.parametrize("metadata", ["seq", "none"])
def test_a_drifting_host_far_off_keeps_its_drift_out_of_its_offset(tmp_path, metadata):
    """Host 1's clock 0.7 s ahead (more than a step) and running 40 µs/s fast, nobody slow:
    fitted on the host's own time axis, the drift line's intercept took 0.7 s × 40 µs/s = 28 µs
    of the drift into the offset, and every rank of host 1 read 28 µs late at every collective
    (a false straggler). On the common clock the offsets hold to 2 µs and nobody is named."""
    job = Job(mesh={"dp": 4}, schedule="ddp", steps=12, ranks_per_host=2,
              host_offset_us={1: 700_000.0}, host_drift_us_per_s={1: 40.0},
              metadata=metadata, compute_scale=50.0, seed=11)
    truth = generate(job, tmp_path)
    from benchmarks.cross_rank_accuracy import analyse

    doc = analyse(tmp_path, truth)
    offs = {o["rank"]: o for o in doc["sync"]["clock_offsets"]}
    for r, v in truth.offset_us.items():
        assert offs[r]["offset_us"] - offs[0]["offset_us"] == pytest.approx(v, abs=2.0), r
    assert doc["sync"]["straggler"] is None and truth.straggler is None
    assert judge(truth, doc, metadata)["straggler"]


@pytest.mark.parametrize("metadata", ["seq", "none"])
@pytest.mark.parametrize("schedule,mesh", [("tp", {"dp": 2, "tp": 4}), ("ep", {"dp": 2, "ep": 4})])
def test_offsets_between_hosts_that_only_data_parallel_groups_cross(tmp_path, metadata,
                                                                     schedule, mesh):
    """Two hosts of 4 ranks, 3,000.25 µs apart; each tensor- (or expert-) parallel group sits
    on one host, so only the data-parallel pairs [j, j + 4] cross: most of every rank's
    collectives are with ranks of its own clock, whose ends agree whatever the offset. Each
    offset is recovered within 1 µs and nobody waits (hosts known or not)."""
    job = Job(mesh=mesh, schedule=schedule, steps=4, ranks_per_host=4,
              host_offset_us={1: 3000.25}, metadata=metadata, seed=5)
    truth = generate(job, tmp_path)
    from benchmarks.cross_rank_accuracy import analyse

    doc = analyse(tmp_path, truth)
    offs = {o["rank"]: o["offset_us"] for o in doc["sync"]["clock_offsets"]}
    for r, v in truth.offset_us.items():
        assert offs[r] - offs[0] == pytest.approx(v, abs=1.0), (r, offs)
    assert doc["sync"]["straggler"] is None and truth.straggler is None


def test_theil_sen_is_sens_estimator():
    """Slope and 95% interval as scipy.stats.theilslopes computes them (Sen 1968)."""
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    t = np.sort(rng.uniform(0, 10, 200))
    d = 3 + 40 * t + rng.normal(0, 5, 200)
    d[::9] += 300.0   # a tenth of the points far off: the fit does not follow them
    ref = stats.theilslopes(d, t, alpha=0.95)
    assert theil_sen(t, d) == pytest.approx((ref.slope, ref.low_slope, ref.high_slope))
    intercept, slope, half, resid = fit_line(t, d)
    assert slope == pytest.approx(40.0, abs=1.0) and intercept == pytest.approx(3.0, abs=3.0)
    # no drift inside its own uncertainty: a flat cloud gives slope 0 and the median
    flat = rng.normal(0, 5, 200)
    assert fit_line(t, flat)[1] == 0.0
    # no clock drifts 800 µs/s (NTP's tolerance is 500 ppm): ends that fit it are noise, and
    # the offset is their median
    fast = 800 * t + rng.normal(0, 5, 200)
    assert fit_line(t, fast)[1] == 0.0
    assert fit_line(t, fast)[0] == pytest.approx(float(np.median(fast)))


def test_drift_counts_steps_not_ends():
    """Ends within one profiler step share their noise: two steps of 100 ends each, the second
    shifted 300 µs (a rank descheduled), fit a steep line point by point but are no drift; over
    12 steps a true 40 µs/s drift is found through the steps' medians."""
    rng = np.random.default_rng(2)
    t = np.sort(rng.uniform(0, 2, 200))
    steps = (t >= 1).astype(int)
    d = np.where(steps == 1, 300.0, 0.0) + rng.normal(0, 5, 200)
    assert fit_line(t, d)[1] != 0.0                  # the ends taken as independent
    assert fit_line(t, d, steps)[1] == 0.0           # two steps: nothing to fit a drift to
    t = np.sort(rng.uniform(0, 12, 600))
    steps = t.astype(int)
    d = 40 * t + rng.normal(0, 5, 600) + rng.normal(0, 20, 12)[steps]
    assert fit_line(t, d, steps)[1] == pytest.approx(40.0, abs=4.0)
    steps[:10] = -1                                  # a window's edge outside every step
    assert fit_line(t, d, steps)[1] == pytest.approx(40.0, abs=4.0)


def test_a_rank_whose_profiler_opens_late_is_not_a_straggler(tmp_path):
    job = Job(mesh={"dp": 4}, schedule="ddp", steps=5, start_skew_us={2: 30_000.0},
              metadata="seq", seed=random.Random(5).randrange(1000))
    truth = generate(job, tmp_path)
    from benchmarks.cross_rank_accuracy import analyse

    doc = analyse(tmp_path, truth)
    assert truth.straggler is None and doc["sync"]["straggler"] is None
    heads = [i for i in doc["sync"]["instances"] if i["head"]]
    assert heads and all(not i["evidence"] for i in heads)
    assert any("ms apart: a rank whose profiler opened late" in n for n in doc["sync"]["notes"])
    # the others' 30 ms wait for rank 2's profiler is waiting at the head, and the verdict says
    # so rather than blame the waiting on a slow rank; outside the head, waiting is what the
    # straggler table counts
    st = {s["rank"]: s for s in doc["sync"]["stragglers"]}
    for r in (0, 1, 3):
        assert 30_000 <= st[r]["head_waiting_us"] <= 31_000
    assert st[2]["head_waiting_us"] == 0.0
    for s in st.values():
        assert s["waiting_us"] - s["head_waiting_us"] == pytest.approx(s["wait_suffered_us"])
    assert ("waiting for other ranks, all of it at the head of a profiling window, where a "
            "profiler that opened later cannot be told from a slow rank;") in doc["verdict"]


def test_clock_fits_of_units_with_few_points_equal_fit_line():
    """The units with too few points for a drift, fitted all at once, get fit_line's numbers bit
    for bit (0 to 7 finite points, NaNs among them); units with more are left to fit_line."""
    import numpy as np

    from pardiag.analyzer.analyses.clocks import MIN_DRIFT_POINTS, _few_point_fits, fit_line

    rng = np.random.default_rng(11)
    for trial in range(100):
        counts = rng.integers(0, 12, 9)
        codes = np.repeat(np.arange(9), counts)
        rng.shuffle(codes)
        t = rng.random(len(codes)) * 30 - 5
        d = np.round(rng.normal(0, 50, len(codes)), int(rng.integers(0, 3)))
        d[rng.random(len(codes)) < 0.1] = np.nan
        uniq = [f"host{k}" for k in range(9)]
        got = _few_point_fits(codes, uniq, t, d)
        for k, u in enumerate(uniq):
            idx = np.flatnonzero(codes == k)
            if np.isfinite(d[idx]).sum() >= MIN_DRIFT_POINTS:
                assert u not in got
                continue
            want = (*fit_line(t[idx], d[idx]), len(idx))
            assert np.array_equal(np.array(got[u], dtype=float), np.array(want, dtype=float),
                                  equal_nan=True), (trial, u)


def test_block_medians_equal_numpy_medians_per_block():
    """The clock fit's per-step medians, read from each step's sorted values, equal numpy's
    median of each step's points bit for bit (odd and even counts, ties, one point)."""
    import numpy as np

    from pardiag.analyzer.analyses.clocks import _block_medians

    rng = np.random.default_rng(5)
    for trial in range(300):
        n = int(rng.integers(1, 40))
        blocks = rng.integers(0, 6, n)
        values = (rng.random(n) * 1e6, rng.integers(0, 5, n).astype(float))
        got = _block_medians(blocks, *values)
        for g, v in zip(got, values):
            want = np.array([np.median(v[blocks == k]) for k in np.unique(blocks)])
            assert np.array_equal(g, want), trial


# -- stragglers in pipelines: root causes, not the neighbour that waited ------------------------

@pytest.mark.parametrize("schedule, mesh, slow", [
    ("pp_1f1b", {"pp": 4}, 1),                 # a middle stage: both neighbours wait for it
    ("pp_gpipe", {"pp": 2, "dp": 2}, 2),       # one rank of one pipeline, its DP twin is not
    ("pp_interleaved", {"pp": 4}, 3),          # the last stage
])
def test_a_slow_pipeline_rank_is_the_root_cause_of_the_waiting(tmp_path, schedule, mesh, slow):
    """One rank of a pipeline computes 1.5 ms longer per compute op: the waiting it causes
    directly (its neighbours) and through the stages that wait for its neighbours is the most of
    any rank, and the synchronization analysis and the verdict name it."""
    from benchmarks.cross_rank_accuracy import analyse

    job = Job(mesh=mesh, schedule=schedule, microbatches=8, steps=4, metadata="names",
              slow_ranks={slow: 1500.0}, seed=5)
    truth = generate(job, tmp_path)
    doc = analyse(tmp_path, truth)
    assert doc["sync"]["stragglers"][0]["rank"] == slow
    assert doc["sync"]["straggler"] == truth.straggler == slow
    assert doc["straggler"] == slow


def test_a_balanced_pipeline_names_nobody(tmp_path):
    """The schedule's own bubble makes ranks wait for the first and last stages: no straggler."""
    from benchmarks.cross_rank_accuracy import analyse

    job = Job(mesh={"pp": 4}, schedule="pp_1f1b", microbatches=8, steps=4, metadata="names",
              seed=5)
    doc = analyse(tmp_path, generate(job, tmp_path))
    assert doc["sync"]["straggler"] is None and doc["straggler"] is None


def test_waiting_passes_down_a_chain_of_waits_to_its_root():
    """Rank 2 waits [0, 10] for rank 1, which waits [0, 6] for rank 0 (rank 1 then computes 4
    more): 6 µs of rank 2's wait are rank 0's, 4 are rank 1's; rank 1's own wait is rank 0's."""
    import numpy as np

    from pardiag.analyzer.analyses.stragglers import _root_shares

    shares = _root_shares(np.array([2, 1]), [(1,), (0,)], np.array([0.0, 0.0]),
                          np.array([10.0, 6.0]))
    assert shares[1] == {0: 1.0}
    assert shares[0] == {0: pytest.approx(0.6), 1: pytest.approx(0.4)}
    # rank 1 and rank 3 arrived last together (rank 3 waited for nobody): rank 2's 10 µs are
    # half rank 3's, and of rank 1's half 6 of 10 rank 0's
    shares = _root_shares(np.array([2, 1]), [(1, 3), (0,)], np.array([0.0, 0.0]),
                          np.array([10.0, 6.0]))
    assert shares[0] == {0: pytest.approx(0.3), 1: pytest.approx(0.2), 3: pytest.approx(0.5)}


def test_root_shares_equal_the_definition_on_random_waits():
    """The bisection that finds a cause's overlapping waits gives what taking every earlier
    wait of the cause gives (the definition), on 600 random waits of 6 ranks."""
    import numpy as np

    from pardiag.analyzer.analyses.stragglers import _root_shares

    rng = np.random.default_rng(1)
    w = rng.integers(0, 6, 600)
    c = (w + rng.integers(1, 6, 600)) % 6
    start = rng.uniform(0, 5000, 600)
    until = start + rng.uniform(0, 80, 600)

    def reference() -> list[dict[int, float]]:
        out: list[dict[int, float]] = [{} for _ in range(600)]
        done: list[int] = []
        for i in np.argsort(until, kind="stable"):
            d, left, share = until[i] - start[i], until[i] - start[i], {}
            if d > 0:
                for j in done:
                    if w[j] != c[i]:
                        continue
                    o = min(until[i], until[j]) - max(start[i], start[j])
                    if o <= 0:
                        continue
                    o = min(o, left)
                    left -= o
                    for r, s in out[j].items():
                        share[r] = share.get(r, 0.0) + s * o / d
                    if left <= 0:
                        break
                share[int(c[i])] = share.get(int(c[i]), 0.0) + left / d
            else:
                share[int(c[i])] = 1.0
            out[i] = share
            done.append(i)
        return out

    got, want = _root_shares(w, [(int(x),) for x in c], start, until), reference()
    assert len(got) == len(want)
    for g, x in zip(got, want):
        assert g.keys() == x.keys() and all(g[k] == pytest.approx(x[k]) for k in g)


def test_unnamed_groups_whose_ends_keep_one_gap_on_one_clock_are_two_groups(tmp_path):
    """pp 2 × dp 2, interleaved, no metadata: the two DP groups' all-reduces end ~500 µs apart
    in every step, a constant that could be a clock offset, were it not for the sends and
    receives between the groups' ranks, which end together: ranks 0 and 2 (and 1 and 3) share a
    clock, so the all-reduces are two groups' ({0, 1} and {2, 3}), not one group's on clocks
    500 µs apart, and no rank is given an offset."""
    job = Job(mesh={"pp": 2, "dp": 2}, schedule="pp_interleaved", steps=4, microbatches=4,
              metadata="none", seed=23987866)
    generate(job, tmp_path)
    sync = compute_sync(load_traces(tmp_path, cache=False))
    ar = sync.instances[sync.instances["op"] == "all_reduce"]
    assert len(ar) == 8 and (ar["ranks"] == 2).all() and ar["complete"].all()
    assert any("(ranks 0,1; ranks 2,3)" in n for n in sync.notes)
    assert sync.offsets["offset_us"].abs().max() <= 20.0
    p2p = sync.instances[sync.instances["instance"].str.startswith("p2p:")]
    assert len(p2p) == 192 and p2p["complete"].all()


def test_replica_pipelines_in_lockstep_share_a_clock_though_their_transfers_do_not_pair(tmp_path):
    """pp 2 × dp 2, 1F1B, no metadata, nobody slow: the two pipelines run in lockstep, so each
    send ends with the receives of both pipelines' next stage and none pairs (two candidates
    each; nothing is guessed). Whichever each peer is, the four ranks' transfers end together op
    after op: one clock, and the DP groups' all-reduces, which end a constant time apart, are
    two groups' ({0, 1} and {2, 3})."""
    job = Job(mesh={"pp": 2, "dp": 2}, schedule="pp_1f1b", steps=4, microbatches=4,
              metadata="none", seed=11)
    generate(job, tmp_path)
    sync = compute_sync(load_traces(tmp_path, cache=False))
    assert any("without a known peer were not paired" in n for n in sync.notes)
    ar = sync.instances[sync.instances["op"] == "all_reduce"]
    assert len(ar) == 8 and (ar["ranks"] == 2).all() and ar["complete"].all()
    assert any("(ranks 0,1; ranks 2,3)" in n for n in sync.notes)


def test_interleaved_stages_in_lockstep_pair_their_transfers_by_elimination(tmp_path):
    """Interleaved 1F1B over 4 ranks, no metadata, 2 µs of jitter, rank 0 sleeping 1,188 µs on
    its host before each step's launches (without jitter every end ties: nothing pairs).
    Stages in lockstep: a send ends together with the next stage's receive and, a few µs off,
    with the receives of ranks that another stage sends to at that moment.
    Elimination pairs 872 of the 896 (a receive is one send's; rank 1's batched send and
    receive; then the nearer of two established pairs' receives, when it is nearer by 1 µs at
    least); 24, whose candidates end within 1 µs of each other, stay unpaired and are said to.
    The chain of waits holds enough for rank 0 to be named by the cost of its time outside
    computation (half its sleep or more: the unpaired transfers' waits are its peers' work)."""
    job = Job(mesh={"pp": 4}, schedule="pp_interleaved", steps=4, microbatches=8,
              host_slow_ranks={0: 1188.3242496000935}, metadata="none", jitter_us=2.0,
              seed=228908276)
    truth = generate(job, tmp_path)
    assert truth.straggler == 0
    rep = pardiag.analyze(tmp_path, cache=False)
    assert "24 point-to-point op(s) without a known peer were not paired (never matched as a " \
           "group collective)" in rep.sync.notes
    assert any(n.startswith("872 point-to-point op(s) the traces give no peer for were paired")
               for n in rep.sync.notes)
    pairs = set(zip(rep.sync.p2p["src"], rep.sync.p2p["dst"]))
    assert pairs == {(0, 1), (1, 2), (2, 3), (3, 0), (1, 0), (2, 1), (3, 2), (0, 3)}
    assert rep.sync.straggler == 0 and rep.straggler == 0
    out = rep.critical_path.outside_costs().set_index("rank")
    assert 0.45 * 1188.3 <= out.loc[0, "delay_cost_us"] <= 1.1 * 1188.3


def test_a_lockstep_stage_slow_on_its_host_is_named_by_what_its_sleep_costs(tmp_path):
    """Interleaved 1F1B over 2 ranks, rank 1 (the last stage) sleeping 744 µs on its host before
    each step's launches; removing the sleep shortens the step by 511 µs (the generator's own
    simulation without it). In the lockstep phase rank 1's send to rank 0 ends as its receive
    from rank 0 does, on another stream, and rank 1 computes beside its other sends: the send
    did not hold it (its wait was the receive's). Rank 0's sends queue on their stream behind
    the first one, which waited for rank 1. With both, the sleep's replayed cost is 0.5–1.1×
    the true one; without them it was 14 µs and nobody was named."""
    job = Job(mesh={"pp": 2}, schedule="pp_interleaved", steps=3, microbatches=8,
              host_slow_ranks={1: 744.14854830317}, metadata="names", seed=246854160)
    truth = generate(job, tmp_path)
    assert truth.straggler == 1
    rep = pardiag.analyze(tmp_path, cache=False)
    assert rep.sync.straggler == 1 and rep.straggler == 1
    out = rep.critical_path.outside_costs().set_index("rank")
    assert 0.5 * 511.4 <= out.loc[1, "delay_cost_us"] <= 1.1 * 511.4


def test_a_straggler_saving_is_per_step_of_its_evidence(tmp_path):
    """Rank 1 spends 5 ms outside any operator at each of 4 steps' start. With rank 0's
    profiler opening 30 ms late, the first step's collectives are a window's head and no
    evidence: the others' waiting is averaged over the 3 steps it was read on, not the 4 (it
    read 3.7 ms per step, three quarters of the same 4.94)."""
    import pardiag

    saved = []
    for skew in ({}, {0: 30_000.0}):
        out = tmp_path / f"skew{len(skew)}"
        generate(Job(mesh={"dp": 2}, schedule="ddp", steps=4, host_slow_ranks={1: 5000.0},
                     start_skew_us=skew, metadata="seq", seed=11), out)
        res = pardiag.analyze(out, cache=False).results["recommendations"]
        (c,) = [c for c in (*res.recommendations, *res.rejected) if c.kind == "straggler"]
        assert "the other ranks sit idle 4.94 ms per step waiting for it" in c.evidence[0]
        saved.append(c.measured_step_us - c.predicted_step_us)
    assert saved[1] == pytest.approx(saved[0], rel=0.01)


@pytest.mark.parametrize("metadata", ["seq", "none"])
def test_a_pipeline_rank_that_lost_its_first_transfers_still_pairs_the_rest(tmp_path, metadata):
    """1F1B over 2 ranks on 2 hosts (hosts unknown: clocks compared by the transfers), rank 1's
    first 3 send/recv kernels lost (CUPTI drops records at a session's start; their launches and
    records remain). Each transfer is the k-th to (from) its peer counting the lost ones, so the
    rest pair with the right partner: one clock, the waiting at the transfers known. Counted
    from the kernels alone, each paired with a transfer 3 later: none overlapped, and the ranks
    were separate clock domains whose waiting nobody could tell."""
    job = Job(mesh={"pp": 2}, schedule="pp_1f1b", microbatches=4, steps=3, ranks_per_host=1,
              drop={1: [0, 1, 2]}, metadata=metadata, seed=2)
    truth = generate(job, tmp_path)
    from benchmarks.cross_rank_accuracy import analyse

    doc = analyse(tmp_path, truth)
    offs = {o["rank"]: o["offset_us"] for o in doc["sync"]["clock_offsets"]}
    assert abs(offs[1] - offs[0]) <= 20.0, offs
    assert doc["sync"]["straggler"] is None and truth.straggler is None
    assert not any("separate clock domains" in n for n in doc["sync"]["notes"])
    assert "waiting vs transfer unknown" not in doc["verdict"]
