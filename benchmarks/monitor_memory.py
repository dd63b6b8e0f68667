"""What the always-on monitor holds in a rank's memory over a long run
(:class:`pardiag.collectors.monitor.Monitor`): ``--steps`` steps of ``--calls`` collectives
each, recorded and written every 50 steps as a rank does, with the Python allocations traced
(``tracemalloc``: the peak of what the monitor allocated, its file buffer included).

    python -m benchmarks.monitor_memory [--steps 100000] [--calls 10]

Not a test: nothing asserts a size. Goal: <= 10 MB per rank for 100,000 steps.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from benchmarks._machine import describe, emit, finish, machine


def run(steps: int, calls: int, every: int, out: Path) -> tuple[int, int, float]:
    """``(peak bytes, bytes written, seconds)`` of ``steps`` monitored steps."""
    from pardiag.collectors.monitor import OPS, Monitor

    m = Monitor(out, 0, every)
    m._fh = open(out, "ab")
    op = OPS.index("ddp_all_reduce")
    t = time.time_ns()
    tracemalloc.start()
    t0 = time.perf_counter()
    for k in range(steps):
        for _ in range(calls):
            rec = m._call(op, None, 1 << 20, t, t + 1000)
            if rec is not None:
                rec[6] = t + 5000
            t += 2_000_000
        m.on_step(k, t, t + 100_000)
        t += 200_000
    m.flush()
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    m._fh.close()
    return peak, out.stat().st_size, seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--calls", type=int, default=10, help="collectives per step")
    ap.add_argument("--every", type=int, default=50, help="steps per written line")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        peak, size, seconds = run(a.steps, a.calls, a.every, Path(tmp) / "rank0.monitor.jsonl")
    info = finish(info)
    cmd = "python -m benchmarks.monitor_memory " + " ".join(argv or sys.argv[1:])
    text = "\n".join([
        f"# Monitor memory per rank ({time.strftime('%Y-%m-%d', time.gmtime())})", "",
        f"- **Command:** `{cmd}`", f"- **Machine:** {describe(info)}",
        f"- **Repetitions:** one run of {a.steps} steps × {a.calls} collectives, a line every "
        f"{a.every} steps ({seconds:.1f} s, {1e6 * seconds / (a.steps * a.calls):.1f} µs per "
        f"recorded call including the writes)", "",
        f"Peak of the monitor's Python allocations: {peak / 2**20:.2f} MiB (goal <= 10 MB: "
        f"{'met' if peak <= 10e6 else 'NOT met'}); written to disk: {size / 2**20:.1f} MiB "
        f"({size / a.steps:.0f} bytes per step)."])
    emit(text, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
