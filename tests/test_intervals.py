import numpy as np

from pardiag.analyzer.trace import intervals as iv


def test_union_merges_overlapping_touching_and_drops_empty():
    u = iv.union([5, 0, 3, 20, 30, 12], [10, 4, 6, 25, 30, 20])
    assert u.tolist() == [[0.0, 10.0], [12.0, 25.0]]
    assert iv.total(u) == 23.0


def test_union_of_nothing_is_empty():
    assert iv.union([], []).shape == (0, 2)
    assert iv.total(iv.union([], [])) == 0.0


def test_intersect_subtract_merge_clip():
    a = iv.union([0, 20], [10, 30])
    b = iv.union([5, 25], [22, 40])
    assert iv.intersect(a, b).tolist() == [[5.0, 10.0], [20.0, 22.0], [25.0, 30.0]]
    assert iv.subtract(a, b).tolist() == [[0.0, 5.0], [22.0, 25.0]]
    assert iv.subtract(b, a).tolist() == [[10.0, 20.0], [30.0, 40.0]]
    assert iv.merge(a, b).tolist() == [[0.0, 40.0]]
    assert iv.clip(a, 8, 25).tolist() == [[8.0, 10.0], [20.0, 25.0]]


def test_identities_on_random_sets():
    rng = np.random.default_rng(7)
    for _ in range(50):
        s1 = rng.uniform(0, 1000, 40)
        a = iv.union(s1, s1 + rng.uniform(0, 60, 40))
        s2 = rng.uniform(0, 1000, 40)
        b = iv.union(s2, s2 + rng.uniform(0, 60, 40))
        inter = iv.total(iv.intersect(a, b))
        # |A ∪ B| = |A| + |B| - |A ∩ B|, |A − B| = |A| − |A ∩ B|
        assert np.isclose(iv.total(iv.merge(a, b)), iv.total(a) + iv.total(b) - inter)
        assert np.isclose(iv.total(iv.subtract(a, b)), iv.total(a) - inter)
