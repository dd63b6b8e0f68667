"""What `pardiag report --hta` costs: wall time and peak memory of `pardiag report -q --no-cache`
with and without `--hta` on each folder of ../shared/real_traces, in fresh processes (peak RSS of
the report process and of its children: HTA parses several ranks in a process pool). Not a test.

    .venv/bin/python benchmarks/bench_hta.py [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO.parent / "shared" / "real_traces"


def run_once(folder: Path, hta: bool) -> tuple[float, float]:
    """(seconds, peak RSS in MB of the report process or its largest child) of one report."""
    out = Path(tempfile.mkdtemp()) / "r.html"
    code = ("import resource, subprocess, sys, time\n"
            "t = time.perf_counter()\n"
            f"rc = subprocess.call([sys.executable, '-m', 'pardiag', 'report', {str(folder)!r}, "
            f"'-q', '--no-cache', '-o', {str(out)!r}{', ' + repr('--hta') if hta else ''}], "
            "stderr=subprocess.DEVNULL)\n"
            "dt = time.perf_counter() - t\n"
            "print(rc, dt, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    rc, dt, rss_kb = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    cwd=REPO, check=True).stdout.split()
    assert rc == "0", (folder, hta)
    return float(dt), int(rss_kb) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}, {args.reps} repetitions (median), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| folder | report s | report --hta s | added s | report MB | report --hta MB |")
    print("|---|---:|---:|---:|---:|---:|")
    for folder in sorted(p for p in TRACES.iterdir() if p.is_dir()):
        res = {False: [], True: []}
        for _ in range(args.reps):   # interleaved: machine load hits both alike
            for hta in (False, True):
                res[hta].append(run_once(folder, hta))
        t0, t1 = (statistics.median(t for t, _ in res[h]) for h in (False, True))
        m0, m1 = (statistics.median(m for _, m in res[h]) for h in (False, True))
        print(f"| {folder.name} | {t0:.2f} | {t1:.2f} | {t1 - t0:+.2f} | {m0:.0f} | {m1:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
