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
