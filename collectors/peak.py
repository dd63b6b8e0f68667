"""A CPU rank's own peak FLOP/s, measured when ``pardiag profile`` starts it (:func:`measure`):
the rate its threads reach in a dense float32 matmul on its cores, with the other ranks of the
node measuring at the same time. The report's MFU on a CPU is computed against it (a datasheet
peak of a CPU says little of what ``torch.get_num_threads()`` threads sharing a host reach)."""

from __future__ import annotations

import time

#: The matmul measured: ``[N, N] × [N, N]`` float32, ``2·N³`` FLOPs each.
N = 512
#: Blocks timed; the fastest block's rate is the peak.
BLOCKS = 3
#: Seconds each block runs for (at least one matmul).
BLOCK_S = 0.06


def measure(torch) -> dict[str, float]:
    """``{"float32": FLOP/s}``: the fastest of :data:`BLOCKS` blocks of ``N × N`` float32
    matmuls, each timed for about :data:`BLOCK_S` s after one warm-up call."""
    a = torch.randn(N, N)
    b = torch.randn(N, N)
    out = torch.empty(N, N)
    torch.mm(a, b, out=out)
    best = 0.0
    for _ in range(BLOCKS):
        n, t0 = 0, time.perf_counter()
        while True:
            torch.mm(a, b, out=out)
            n += 1
            dt = time.perf_counter() - t0
            if dt >= BLOCK_S:
                break
        best = max(best, 2.0 * N ** 3 * n / dt)
    return {"float32": best}
