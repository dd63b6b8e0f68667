"""The ideal bubble of any schedule, by replaying the observed action order with balanced stage
costs and free transfers; schedules named only where what ran matches one."""

from __future__ import annotations

import pandas as pd
import pytest

from pardiag.analyzer.analyses.infer_layout import _placed_schedule
from pardiag.analyzer.analyses.schedule_replay import replay_ideal


def _chunks(orders: dict[int, list[tuple[int, str, int]]], cost: dict[str, float],
            gap: float = 7.0) -> pd.DataFrame:
    """Each rank's actions ``(stage, phase, microbatch)`` in order, laid end to end with a gap
    (the recorded times only give the order: the replay takes its own)."""
    rows = []
    for r, acts in orders.items():
        t = 3.0 * r
        for s, ph, mb in acts:
            rows.append({"rank": r, "stage": s, "microbatch": mb, "phase": ph, "start_us": t,
                         "end_us": t + cost[ph]})
            t += cost[ph] + gap
    return pd.DataFrame(rows)


def _one_f_one_b(p: int, m: int) -> dict[int, list[tuple[int, str, int]]]:
    out = {}
    for r in range(p):
        warm = min(p - 1 - r, m)
        acts = [(r, "F", i) for i in range(warm)]
        f = warm
        for b in range(m):
            if f < m:
                acts.append((r, "F", f))
                f += 1
            acts.append((r, "B", b))
        out[r] = acts
    return out


@pytest.mark.parametrize("p, m", [(2, 2), (2, 4), (4, 4), (4, 8), (8, 3)])
def test_gpipe_and_1f1b_replay_to_the_formula(p, m):
    ideal = 100.0 * (p - 1) / (m + p - 1)
    gpipe = {r: [(r, "F", i) for i in range(m)] + [(r, "B", i) for i in range(m)]
             for r in range(p)}
    for orders in (gpipe, _one_f_one_b(p, m)):
        got = replay_ideal(_chunks(orders, {"F": 10.0, "B": 20.0}))
        assert got == {r: pytest.approx(ideal, abs=1e-9) for r in range(p)}


def test_zbv_replays_to_its_own_ideal_not_the_interleaved_formula():
    """ScheduleZBVZeroBubble on 2 ranks, 2 microbatches (pytorch#138444's shape): stages 0 and 3
    on rank 0, 1 and 2 on rank 1, backward split into I and W, every action 100 µs. Replayed
    without transfers: rank 1 starts 100 µs late and nothing else waits, so the step is 1300 µs
    of which each rank runs 1200: 7.69 %, where the interleaved formula says 1/(2·2+1) = 20 %."""
    r0 = [(0, "F", 0), (0, "F", 1), (3, "F", 0), (3, "I", 0), (3, "F", 1), (3, "I", 1),
          (0, "I", 0), (3, "W", 0), (0, "I", 1), (3, "W", 1), (0, "W", 0), (0, "W", 1)]
    r1 = [(1, "F", 0), (2, "F", 0), (1, "F", 1), (2, "F", 1), (2, "I", 0), (1, "I", 0),
          (2, "I", 1), (1, "I", 1), (2, "W", 0), (1, "W", 0), (2, "W", 1), (1, "W", 1)]
    got = replay_ideal(_chunks({0: r0, 1: r1}, {"F": 100.0, "I": 100.0, "W": 100.0}))
    assert got == {0: pytest.approx(100 / 13, abs=1e-9), 1: pytest.approx(100 / 13, abs=1e-9)}


def test_an_order_that_cannot_run_does_not_replay():
    # stage 1's forward of microbatch 0 waits for stage 0's, which the step does not hold
    assert replay_ideal(_chunks({1: [(1, "F", 0), (1, "B", 0)]}, {"F": 1.0, "B": 2.0})) is None
    assert replay_ideal(_chunks({0: [(0, "X", 0)]}, {"X": 1.0})) is None


def _ranges(orders) -> list[pd.DataFrame]:
    df = _chunks(orders, {"F": 10.0, "B": 20.0, "I": 10.0, "W": 10.0})
    return [g.drop(columns="rank") for _, g in df.groupby("rank")]


def test_a_schedule_is_named_only_where_what_ran_matches_one():
    looped = {0: 0, 1: 1, 2: 0, 3: 1}
    vee = {0: 0, 1: 1, 2: 1, 3: 0}
    bfs = {0: [(0, "F", 0), (2, "F", 0), (2, "B", 0), (0, "B", 0)],
           1: [(1, "F", 0), (3, "F", 0), (3, "B", 0), (1, "B", 0)]}
    mixed = {0: [(0, "F", 0), (0, "F", 1), (2, "F", 0), (2, "B", 0), (2, "F", 1), (2, "B", 1),
                 (0, "B", 0), (0, "B", 1)], 1: [(1, "F", 0), (3, "F", 0), (3, "B", 0)]}
    name = lambda placed, phases, orders: _placed_schedule(placed, [0, 1], phases,  # noqa: E731
                                                           _ranges(orders))[0]
    assert name(looped, {"F", "B"}, mixed) == "ScheduleInterleaved1F1B"
    assert name(looped, {"F", "I", "W"}, mixed) == "ScheduleInterleavedZeroBubble"
    assert name(looped, {"F", "B"}, bfs) == ("looped placement, 4 stages on 2 ranks, every "
                                             "forward before any backward")
    assert name(vee, {"F", "I", "W"}, bfs) == "V placement, 4 stages on 2 ranks, split backward"
    assert name({0: 0, 1: 0, 2: 1, 3: 1}, {"F", "B"}, bfs) == (
        "4 stages on 2 ranks, placement 0→0, 1→0, 2→1, 3→1")
    # two steps of looped BFS: the second step's forwards come after the first step's
    # backwards, which is no interleaving (each step is judged on its own)
    two = [pd.concat([r.assign(step=1), r.assign(step=2, start_us=r["start_us"] + 1e6,
                                                 end_us=r["end_us"] + 1e6)])
           for r in _ranges(bfs)]
    assert _placed_schedule(looped, [0, 1], {"F", "B"}, two)[0] == (
        "looped placement, 4 stages on 2 ranks, every forward before any backward")


# ---------------------------------------------------------------- every schedule torch ships

def torch_order(name: str, p: int, m: int) -> dict[int, list[tuple[int, str, int]]]:
    """torch's own action order for schedule class ``name`` on ``p`` ranks and ``m``
    microbatches (``pipeline_order`` of the class, built on stand-in stages that carry only
    what the constructors read), each combined action (DualPipeV's ``OVERLAP_F_B``) as its
    parts in the order the runtime runs them. Stages: one per rank, two per rank looped
    (Interleaved1F1B, InterleavedZeroBubble, LoopedBFS) or in a V (ZBV, DualPipeV)."""
    import types

    torch = pytest.importorskip("torch")
    import torch.distributed.pipelining.schedules as S

    if name == "Schedule1F1B":
        # its pipeline_order only draws the schedule (the class runs its own loop) and numbers
        # the last rank's forwards from 1: the order the loop runs
        return _one_f_one_b(p, m)
    cls = getattr(S, name)
    vee = name in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")
    single = name in ("ScheduleGPipe", "Schedule1F1B")
    n = p if single else 2 * p
    idx = [0] if single else ([0, 2 * p - 1] if vee else [0, p])
    stages = [types.SimpleNamespace(group_size=p, group_rank=0, stage_index=i, num_stages=n,
                                    is_first=i == 0, is_last=i == n - 1,
                                    submod=torch.nn.Linear(1, 1)) for i in idx]
    sched = cls(stages[0] if single else stages, n_microbatches=m)
    out = {}
    for r, acts in sched.pipeline_order.items():
        seq = []
        for a in acts:
            for x in (a.sub_actions or (a,)) if a is not None else ():
                ph = str(x.computation_type.value)
                if ph in ("F", "B", "I", "W"):
                    seq.append((int(x.stage_index), ph, int(x.microbatch_index)))
        out[r] = seq
    return out


def _independent_ideal(orders, cost):
    """The same replay written again, plainly: each rank takes its next action when its inputs
    are done (F after F of the stage before; B or I after the next stage's B or I, the last
    stage after its own F; W after its I), at no cost for a transfer. Returns per rank the %
    of the step (first start to last end) it runs nothing."""
    last = max(s for acts in orders.values() for s, _, _ in acts)
    held = {a for acts in orders.values() for a in acts}
    end, clock, work, nxt = {}, dict.fromkeys(orders, 0.0), dict.fromkeys(orders, 0.0), \
        dict.fromkeys(orders, 0)
    while any(nxt[r] < len(orders[r]) for r in orders):
        moved = False
        for r, acts in orders.items():
            while nxt[r] < len(acts):
                s, ph, mb = acts[nxt[r]]
                need = ([(s - 1, "F", mb)] if ph == "F" and s else [] if ph == "F"
                        else [(s, "I", mb)] if ph == "W"
                        else [(s, "F", mb)] + ([] if s == last else
                                               [(s + 1, "B", mb) if (s + 1, "B", mb) in held
                                                else (s + 1, "I", mb)]))
                if any(d not in end for d in need):
                    break
                t = max([clock[r]] + [end[d] for d in need])
                end[(s, ph, mb)] = clock[r] = t + cost[ph]
                work[r] += cost[ph]
                nxt[r] += 1
                moved = True
        assert moved, "the order deadlocks"
    span = max(clock.values())
    return {r: 100.0 * (span - w) / span for r, w in work.items()}


TORCH_SCHEDULES = ["ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
                   "ScheduleInterleavedZeroBubble", "ScheduleLoopedBFS", "ScheduleZBVZeroBubble",
                   "ScheduleDualPipeV"]


@pytest.mark.parametrize("name", TORCH_SCHEDULES)
@pytest.mark.parametrize("p, m", [(2, 4), (2, 8), (4, 8)])
def test_every_torch_schedule_replays_to_its_own_order(name, p, m):
    """torch's own order of each schedule it ships, run as recorded ranges would show it,
    replays to the ideal an independent simulation of that order gives (F 10, B 20, I and W
    10 µs; free transfers), on every rank; GPipe and 1F1B also to the formula."""
    orders = torch_order(name, p, m)
    cost = {"F": 10.0, "B": 20.0, "I": 10.0, "W": 10.0}
    got = replay_ideal(_chunks(orders, cost))
    want = _independent_ideal(orders, cost)
    assert got is not None and set(got) == set(want)
    assert got == {r: pytest.approx(want[r], abs=1e-9) for r in want}
    if name in ("ScheduleGPipe", "Schedule1F1B"):
        assert got == {r: pytest.approx(100 * (p - 1) / (m + p - 1)) for r in want}


def test_the_replayed_window_starts_at_the_first_action_as_the_measured_one_does():
    """Rank 1 is ready at 0 and rank 0 at 50 µs (a longer tail of the step before), but rank
    1's forward waits for rank 0's (50–150): the window runs from 50 (the first action) to
    rank 0's backward's end at 650, 600 µs, of which each rank is busy 300 µs: a 50% bubble.
    From time 0 the window read 650 µs and the bubble 53.8%, which the verdict set beside
    the measured one (24.2% against 31.8% on a ZBV pipeline that replays exactly)."""
    from pardiag.analyzer.predict.whatif import simulate

    orders = {0: [(0, "F", 0), (0, "B", 0)], 1: [(1, "F", 0), (1, "B", 0)]}
    res = simulate(orders, [100.0, 100.0], [200.0, 200.0], 0.0, {0: 50.0, 1: 0.0})
    assert res.window_us == 600.0
    assert res.bubble_pct == {0: 50.0, 1: 50.0}
    assert [a[4:] for a in res.actions] == [(50.0, 150.0), (150.0, 250.0), (250.0, 450.0),
                                            (450.0, 650.0)]


def test_a_replay_that_matches_the_step_gives_the_measured_bubble():
    """The GPipe sample's replay matches its 8.2 ms step; the bubble it gives is the measured
    one (35.7%) within a point once a rank's own time between chunks, which the replay adds to
    each chunk's cost, counts as idle as the measurement counts it (it read 30.4%, then 21.8%
    from the first action)."""
    import re

    from pardiag.analyzer.predict.replay import pipeline_model
    from pardiag.analyzer.report.registry import build_report
    from pardiag.analyzer.trace import load_traces

    from .paths import REPO

    traces = load_traces(REPO / "sample_traces" / "pp_gpipe_cpu_2rank")
    rep = build_report(traces)
    model, _ = pipeline_model(traces, rep.results["pipeline"])
    assert model is not None and abs(model.residual_us) < 100.0   # the replay matches the step
    measured = float(rep.results["pipeline"].summary["bubble_pct"].mean())
    assert model.bubble_pct(model.predict()[1]) == pytest.approx(measured, abs=1.0)
    got = re.search(r"pipeline bubble ([\d.]+)% of the window, measured \(the what-if replay, "
                    r"with the measured stage costs and transfers, gives ([\d.]+)%",
                    rep.recommendations.verdict)
    assert got and abs(float(got.group(1)) - float(got.group(2))) <= 1.0
