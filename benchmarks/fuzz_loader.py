"""Fuzz the loader with 10,000 hypothesis examples (CI runs 1,000), plus the analyses.

    .venv/bin/python benchmarks/fuzz_loader.py [--examples N] [--report-examples M]

Runs tests/test_fuzz.py under the ``fuzz`` settings profile (random seed each run) and prints
how many examples ran and how long it took. Exit code 1 when an example crashed; hypothesis
prints the shrunk failing input.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--examples", type=int, default=10_000, help="loader examples")
    p.add_argument("--report-examples", type=int, default=1_000,
                   help="examples run through every analysis")
    a = p.parse_args()
    env = {**os.environ, "HYPOTHESIS_PROFILE": "fuzz",
           "FUZZ_REPORT_EXAMPLES": str(a.report_examples), "FUZZ_LOADER_EXAMPLES": str(a.examples)}
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                          "--hypothesis-show-statistics", str(REPO / "tests" / "test_fuzz.py")],
                         env=env, cwd=REPO)
    rows = (("loader (read_trace_bytes + load_traces)", a.examples),
            ("fast path = tolerant path (same table)", a.examples),
            ("analyses; summaries = raw (build_report)", a.report_examples))
    print(f"{'test':42} {'examples':>9}")
    for name, n in rows:
        print(f"{name:42} {n:9d}")
    print(f"wall {time.perf_counter() - t0:.0f} s, "
          f"{'no crash' if res.returncode == 0 else 'FAILED'}")
    return 0 if res.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
