"""A small report's wall time against the bare import of what it needs.

    .venv/bin/python benchmarks/bench_startup.py [--repeat 5] [--run sample_traces/ddp_cpu_2rank]

Whole processes, in interleaved rounds (one of each per round, so a drift of the machine's speed
touches all alike); medians and ranges over ``--repeat`` rounds:

* ``report``: ``pardiag report RUN -o X.html --json X.json -q`` on a copy of ``RUN`` in a
  temporary folder, summaries stored beside it by the first round (as a user's second report);
* ``report --no-cache``: the same, parsing the traces every time;
* ``bare``: ``python -c "import pandas, plotly.graph_objects"``, the floor any report pays;
* ``help``: ``pardiag --help``.

Then one in-process breakdown of a report (imports, load and analyses, HTML, JSON; seconds).
Python writes bytecode as usual (``PYTHONDONTWRITEBYTECODE`` is removed from the children's
environment: a user's installed package has its ``.pyc``). The goals (small run ≤ 1.0 s and
≤ 2× the bare import) are stated in ``benchmarks/README.md``. Not a test: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

BREAKDOWN = """
import sys, time
t0 = time.perf_counter()
from pardiag.api import analyze
from pardiag.analyzer.render import render_html
import plotly.graph_objects
t1 = time.perf_counter()
rep = analyze(sys.argv[1])
t2 = time.perf_counter()
rep.to_html(sys.argv[2])
t3 = time.perf_counter()
doc = rep.to_json()
t4 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {t3 - t2:.3f} {t4 - t3:.3f}")
"""


def _timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--run", type=Path, default=REPO / "sample_traces" / "ddp_cpu_2rank")
    ap.add_argument("--no-user-cache", action="store_true",
                    help="a user cache folder that cannot be written: plotly.js is compressed "
                         "by every report, as before it was kept")
    args = ap.parse_args()
    from _machine import describe, finish, machine

    info = machine()

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    py = sys.executable
    pardiag = [py, "-m", "pardiag"]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / args.run.name
        shutil.copytree(args.run, run, ignore=shutil.ignore_patterns(".pardiag-cache"))
        env["PARDIAG_CACHE_DIR"] = str(Path(tmp) / "user-cache")
        if args.no_user_cache:
            (Path(tmp) / "a-file").write_text("")
            env["PARDIAG_CACHE_DIR"] = str(Path(tmp) / "a-file" / "user-cache")
        out = [str(Path(tmp) / "r.html"), "--json", str(Path(tmp) / "r.json"), "-q"]
        cases = {
            "report": pardiag + ["report", str(run), "-o", *out],
            "report --no-cache": pardiag + ["report", str(run), "--no-cache", "-o", *out],
            "bare": [py, "-c", "import pandas, plotly.graph_objects"],
            "help": pardiag + ["--help"],
        }
        for cmd in cases.values():   # warm: bytecode written, summaries and plotly.js cached
            _timed(cmd, env)
        times: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.repeat):
            for name, cmd in cases.items():
                times[name].append(_timed(cmd, env))
        split = subprocess.run([py, "-c", BREAKDOWN, str(run), str(Path(tmp) / "b.html")],
                               check=True, capture_output=True, text=True,
                               env=env).stdout.split()
    print(describe(finish(info)))
    print(f"run: {args.run.name}; {args.repeat} interleaved rounds; median (min–max) s"
          + ("; no user cache" if args.no_user_cache else ""))
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, v in times.items():
        print(f"  {name:<18} {med[name]:.3f} ({min(v):.3f}–{max(v):.3f})")
    print(f"  report / bare      {med['report'] / med['bare']:.2f}×")
    print("in one process (s): imports {}, load + analyses {}, HTML {}, JSON {}".format(*split))
    return 0


if __name__ == "__main__":
    sys.exit(main())
