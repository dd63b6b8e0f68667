"""Time pardiag's load + analyses against HTA's TraceAnalysis load on the same folders.

    .venv/bin/python benchmarks/bench_report.py [FOLDER ...]   # default: ../shared/real_traces/*

Each measurement runs in a fresh subprocess (so caches and imports do not carry over) and the
median of --repeat runs is printed, with peak RSS. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PARDIAG = """
import resource, sys, time
t0 = time.perf_counter()
from pardiag.analyzer.load import load_traces
from pardiag.analyzer.registry import build_report
build_report(load_traces(sys.argv[1]))
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
HTA = """
import logging, resource, sys, time, warnings
logging.disable(logging.WARNING); warnings.simplefilter("ignore")
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1])
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def measure(code: str, folder: Path, repeat: int) -> tuple[float, float] | None:
    times, rss = [], []
    for _ in range(repeat):
        res = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True,
                             text=True)
        if res.returncode != 0:
            return None
        t, m = res.stdout.strip().splitlines()[-1].split()
        times.append(float(t))
        rss.append(int(m) / 1024)
    return statistics.median(times), max(rss)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("folders", nargs="*", type=Path)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    folders = a.folders or sorted(d for d in (REPO.parent / "shared" / "real_traces").iterdir()
                                  if d.is_dir())
    print(f"{'folder':28} {'pardiag s':>10} {'HTA s':>8} {'ratio':>6} {'pardiag MB':>11} {'HTA MB':>8}")
    for f in folders:
        ours = measure(PARDIAG, f, a.repeat)
        hta = measure(HTA, f, a.repeat)
        o = f"{ours[0]:10.2f}" if ours else f"{'error':>10}"
        h = f"{hta[0]:8.2f}" if hta else f"{'error':>8}"
        ratio = f"{ours[0] / hta[0]:6.2f}" if ours and hta else f"{'–':>6}"
        om = f"{ours[1]:11.0f}" if ours else f"{'–':>11}"
        hm = f"{hta[1]:8.0f}" if hta else f"{'–':>8}"
        print(f"{f.name:28} {o} {h} {ratio} {om} {hm}")


if __name__ == "__main__":
    main()
