"""Each rank against its peers: the median of the other ranks, for every rank at once.

Cross-rank findings compare a rank's value with the median of the others in the same step
(the straggler's excess idle time, each host and device part's excess). Taking one column out
and computing a median for each rank is quadratic in the ranks; :func:`median_of_others` sorts
each row once instead. :func:`ranks_text` names a set of ranks in a sentence.
"""

from __future__ import annotations

import numpy as np


def median_of_others(x: np.ndarray) -> np.ndarray:
    """For each cell of ``x`` (rows × columns, e.g. steps × ranks; no NaN, at least 2 columns),
    the median of the other cells of its row: each row sorted once, and the median of the
    n − 1 values left when one is taken out read from the sorted row (the middle one, or the
    mean of the two middle ones), so a row of n ranks costs O(n log n), not O(n²). Equal, bit
    for bit, to ``np.median(np.delete(x, j, axis=1), axis=1)`` for each column ``j``.

    Returns:
        An array of ``x``'s shape (float).
    """
    rows, n = x.shape
    order = np.argsort(x, axis=1, kind="stable")
    v = np.take_along_axis(x, order, axis=1)
    k = np.empty_like(order)
    np.put_along_axis(k, order, np.arange(n)[None, :].repeat(rows, axis=0), axis=1)

    def left(i: int) -> np.ndarray:   # the i-th smallest of each row once cell k is taken out
        return np.where(i < k, v[:, [i]], v[:, [min(i + 1, n - 1)]])

    m = n - 1
    if m % 2:
        return left(m // 2)
    return (left(m // 2 - 1) + left(m // 2)) / 2.0


def ranks_text(ranks) -> str:
    """``"rank 3"`` or ``"ranks 0, 1, 3"`` (sorted; the first eight, then "…")."""
    ranks = sorted(int(r) for r in ranks)
    shown = ", ".join(map(str, ranks[:8])) + (", …" if len(ranks) > 8 else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"
