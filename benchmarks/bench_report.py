"""pardiag's load + analyses against HTA's TraceAnalysis load and a gunzip + orjson baseline.

    .venv/bin/python benchmarks/bench_report.py                 # real traces + 8 x 15 MB synthetic
    .venv/bin/python benchmarks/bench_report.py --scale         # ... + 64 x 15 MB synthetic
    .venv/bin/python benchmarks/bench_report.py FOLDER ...      # given folders only

For each folder, each measurement runs in a fresh subprocess (imports included), and the
median of --repeat runs is printed; peak memory is the largest sum of PSS (proportional set size:
pages shared between processes, as after fork, count once in total) over the process and its
children (pardiag's and HTA's worker processes), sampled every 10 ms with psutil:

* ``base``: gunzip (where gzipped) + ``orjson.loads`` of every trace file, one after another;
* ``pardiag``: ``load_traces(reducer=REDUCER)`` + ``build_report`` (every analysis, no HTML), no
  stored summaries (cold);
* ``HTA``: ``TraceAnalysis(trace_dir=...)`` (HTA 0.5.0: parse and build its dataframes);
* ``cached``: pardiag again once summaries are stored (a second ``pardiag report``).

Synthetic sets are written by ``synth_run.py`` under ``--work`` (default /tmp/pardiag-bench) and
kept for reruns. Summaries go to a temporary ``PARDIAG_CACHE_DIR`` or the synthetic folder's
``.pardiag-cache/`` (removed afterwards); nothing is written into the real traces. Not a test:
nothing here asserts a time. Results depend on machine load; rerun on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

BASELINE = """
import gzip, sys, time, orjson
from pathlib import Path
t0 = time.perf_counter()
for f in sorted(Path(sys.argv[1]).iterdir()):
    if f.is_file() and f.name.endswith((".json", ".json.gz")):
        raw = f.read_bytes()
        if raw[:2] == b"\\x1f\\x8b":
            raw = gzip.decompress(raw)
        orjson.loads(raw)
print(time.perf_counter() - t0)
"""
PARDIAG = """
import sys, time
t0 = time.perf_counter()
from pardiag.analyzer.trace import load_traces
from pardiag.analyzer.summary import REDUCER
from pardiag.analyzer.report.registry import build_report
build_report(load_traces(sys.argv[1], reducer=REDUCER, cache=sys.argv[2] == "cache"))
print(time.perf_counter() - t0)
"""
HTA = """
import logging, sys, time, warnings
logging.disable(logging.WARNING); warnings.simplefilter("ignore")
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1])
print(time.perf_counter() - t0)
"""


def run_once(code: str, args: list[str], env: dict) -> tuple[float, float] | None:
    """(seconds reported by the child, peak PSS of the child and its children in MB)."""
    proc = psutil.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True, env=env)
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            try:
                procs = [proc, *proc.children(recursive=True)]
                rss = 0
                for p in procs:
                    try:  # PSS: shared pages (fork, libraries) split among the processes
                        rss += p.memory_full_info().pss
                    except (psutil.Error, AttributeError):
                        pass
                peak = max(peak, rss)
            except psutil.Error:
                pass
            stop.wait(0.01)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    stop.set()
    th.join()
    run_once.last_output = out
    if proc.returncode != 0:
        print(f"  ({args[0]}: exit {proc.returncode}: {err.strip().splitlines()[-1:]})",
              file=sys.stderr)
        return None
    return float(out.strip().splitlines()[-1]), peak / 1e6


def measure(code: str, args: list[str], env: dict, repeat: int):
    runs = [r for r in (run_once(code, args, env) for _ in range(repeat)) if r]
    if not runs:
        return None
    return statistics.median(t for t, _ in runs), max(m for _, m in runs)


def synthetic(work: Path, ranks: int, mb: float) -> Path:
    from synth_run import write_run

    d = work / f"synthetic_{ranks}x{mb:g}MB"
    if not (d.is_dir() and len([f for f in d.iterdir() if f.is_file()]) == ranks):
        shutil.rmtree(d, ignore_errors=True)
        print(f"writing {d} ...", file=sys.stderr)
        write_run(d, ranks, mb)
    return d


def fmt(v, spec: str, width: int) -> str:
    return f"{v:{width}{spec}}" if v is not None else f"{'–':>{width}}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("folders", nargs="*", type=Path)
    p.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    p.add_argument("--scale", action="store_true", help="add the 64 x 15 MB synthetic set")
    p.add_argument("--no-hta", action="store_true", help="skip HTA")
    p.add_argument("--hta-max-mb", type=float, default=float("inf"),
                   help="skip HTA on folders larger than this (MB on disk)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "pardiag-bench")
    a = p.parse_args()
    folders = a.folders
    if not folders:
        folders = sorted(d for d in (REPO.parent / "shared" / "real_traces").iterdir()
                         if d.is_dir())
        folders.append(synthetic(a.work, 8, 15))
        if a.scale:
            folders.append(synthetic(a.work, 64, 15))
    cache_root = Path(tempfile.mkdtemp(prefix="pardiag-bench-cache-"))
    env = {**os.environ, "PARDIAG_CACHE_DIR": str(cache_root)}
    print(f"{'folder':30} {'files':>5} {'MB':>6} {'base s':>7} {'pardiag s':>9} {'HTA s':>7} "
          f"{'p/HTA':>6} {'p/base':>6} {'cached s':>8} {'speedup':>7} {'pardiag MB':>10} "
          f"{'HTA MB':>7} {'mem p/HTA':>9}")
    for f in folders:
        files = [x for x in f.iterdir() if x.is_file() and x.name.endswith((".json", ".json.gz"))]
        mb = sum(x.stat().st_size for x in files) / 1e6
        big = mb > 200
        rep = 1 if big else a.repeat
        base = measure(BASELINE, [str(f)], env, rep)
        ours = measure(PARDIAG, [str(f), "nocache"], env, rep)
        hta = None if a.no_hta or mb > a.hta_max_mb else measure(HTA, [str(f)], env, rep)
        run_once(PARDIAG, [str(f), "cache"], env)  # store the summaries
        cached = measure(PARDIAG, [str(f), "cache"], env, rep)
        shutil.rmtree(f / ".pardiag-cache", ignore_errors=True)
        t = lambda m: m[0] if m else None  # noqa: E731
        r = lambda x, y: x / y if x is not None and y else None  # noqa: E731
        print(f"{f.name[:30]:30} {len(files):5d} {mb:6.0f} {fmt(t(base), '.2f', 7)} "
              f"{fmt(t(ours), '.2f', 9)} {fmt(t(hta), '.2f', 7)} "
              f"{fmt(r(t(ours), t(hta)), '.2f', 6)} {fmt(r(t(ours), t(base)), '.2f', 6)} "
              f"{fmt(t(cached), '.2f', 8)} {fmt(r(t(ours), t(cached)), '.1f', 7)} "
              f"{fmt(ours[1] if ours else None, '.0f', 10)} "
              f"{fmt(hta[1] if hta else None, '.0f', 7)} "
              f"{fmt(r(ours[1] if ours else None, hta[1] if hta else None), '.2f', 9)}", flush=True)
    shutil.rmtree(cache_root, ignore_errors=True)
    print(f"cores: {len(os.sched_getaffinity(0))}, load average: "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} (rerun on a quiet machine)")


if __name__ == "__main__":
    main()
