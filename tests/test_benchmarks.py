"""The benchmarks' own statistics."""

from __future__ import annotations

import pytest

from benchmarks.stability import agreement, goal_chance


def test_agreement_is_the_most_common_answer():
    assert agreement([["a"], ["a", "b"], ["a"]]) == ('["a"]', 2)


def test_goal_chance_of_an_agreement_rate():
    """18 of 20 runs agree: rate 0.9, Wilson 95% interval 0.699–0.972 (Wilson 1927:
    (p + z²/2n ± z·√(p(1−p)/n + z²/4n²)) / (1 + z²/n), z = 1.96); 5 fresh runs give the answer
    ≥ 4 times with chance 0.9⁵ + 5·0.9⁴·0.1 = 0.91854."""
    odds = goal_chance(18, 20)
    assert odds["rate"] == 0.9
    assert odds["rate_low"] == pytest.approx(0.69897, abs=1e-4)
    assert odds["rate_high"] == pytest.approx(0.97213, abs=1e-4)
    assert odds["goal_chance"] == pytest.approx(0.91854, abs=1e-9)
    assert odds["goal_chance_low"] < odds["goal_chance"] < odds["goal_chance_high"] < 1
    # 3 of 5 (a run that misses the goal): a fresh 5 meet it a third of the time
    assert goal_chance(3, 5)["goal_chance"] == pytest.approx(0.6 ** 5 + 5 * 0.6 ** 4 * 0.4)
    assert goal_chance(20, 20)["goal_chance"] == 1.0


def test_json_unchanged_finds_every_difference():
    """benchmarks/json_unchanged.py: floats equal to 1e-9 relative and NaN equal to NaN pass;
    a changed value, a missing key or a list of another length is named by its path."""
    from benchmarks.json_unchanged import diff

    a = {"x": 1.0, "n": float("nan"), "l": [1, {"k": "v"}], "s": "a"}
    assert diff(a, {"x": 1.0 + 1e-12, "n": float("nan"), "l": [1, {"k": "v"}], "s": "a"}) == []
    assert diff(a, {**a, "x": 1.001}) == [".x: 1.0 vs 1.001"]
    assert diff(a, {**a, "l": [1, {"k": "w"}]}) == [".l[1].k: 'v' vs 'w'"]
    assert diff(a, {**a, "l": [1]}) == [".l: 2 vs 1 items"]
    b = dict(a)
    del b["s"]
    assert diff(a, b) == [".s: only in one"]
