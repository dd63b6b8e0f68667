"""pardiag's load + analyses against HTA's TraceAnalysis load and the cost of reading the bytes.

    .venv/bin/python benchmarks/bench_report.py                 # real traces + 8 x 15 MB synthetic
    .venv/bin/python benchmarks/bench_report.py --scale         # ... + 64 x 15 MB synthetic
    .venv/bin/python benchmarks/bench_report.py FOLDER ...      # given folders only
    .venv/bin/python benchmarks/bench_report.py --replicate TRACE:8    # TRACE as 8 ranks

For each folder, each measurement runs in a fresh subprocess (imports included). Times are the
median of --repeat runs without any sampling (a second table gives the fastest and slowest);
peak memory is the largest, over --repeat further runs, of the sum of PSS (proportional set
size: pages shared between processes, as after fork, count once in total) over the process and
its children (pardiag's and HTA's worker processes), sampled with psutil every 10 ms for the
first 2 s and every 50 ms after. The two are measured in
separate runs because reading a large process's PSS takes CPU time from the measured processes:
on a 2-core machine the sampler made a 1.95 s run of pardiag (three processes) 0.15-0.2 s
slower:

* ``base``: gunzip (where gzipped) + ``orjson.loads`` of every trace file, one after another;
* ``floor``: gunzip + a msgspec decode of only the seven fields an analysis of the events needs
  (ph, name, cat, ts, dur, pid, tid) into structs, in as many processes as pardiag uses for the
  folder (one per core, at most one per file; one for small inputs): what reading the bytes costs
  at the least;
* ``pardiag``: ``load_traces(reducer=REDUCER)`` + ``build_report`` (every analysis, no HTML), no
  stored summaries (cold), with the command's settings (``keep_pyarrow_out``, ``collect_less``,
  ``python_strings``);
* ``HTA``: ``TraceAnalysis(trace_dir=...)`` (HTA as installed: parse and build its dataframes);
* ``cached``: pardiag again once summaries are stored (a second ``pardiag report``);
* ``report``: the whole command as a user runs it, ``pardiag report FOLDER --no-cache -o
  report.html --json report.json -q`` (start-up, HTML and JSON included).

Each child runs as an installed program does: with Python's bytecode cache
(``PYTHONDONTWRITEBYTECODE`` is removed from its environment), after one untimed run of each
measurement has written it. Without it every run compiles pardiag's modules from source (an
editable install has no bytecode until first imported), which HTA's installed modules never do.

``--replicate TRACE:N`` writes N copies of one real trace as ranks 0..N-1 of one run (its
``distributedInfo`` rank and world size set for each copy) under ``--work`` and measures that
folder.

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
import time
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
FLOOR = """
import gzip, os, sys, time
t0 = time.perf_counter()
from concurrent.futures import ProcessPoolExecutor
import msgspec

class Event(msgspec.Struct, gc=False):
    ph: object = None
    name: object = None
    cat: object = None
    ts: object = None
    dur: object = None
    pid: object = None
    tid: object = None

class Doc(msgspec.Struct):
    traceEvents: list[Event] = []

def decode(path):
    raw = open(path, "rb").read()
    if raw[:2] == b"\\x1f\\x8b":
        raw = gzip.decompress(raw)
    return len(msgspec.json.decode(raw, type=Doc).traceEvents)

files = sorted(f.path for f in os.scandir(sys.argv[1])
               if f.is_file() and f.name.endswith((".json", ".json.gz")))
procs = int(sys.argv[2])
if procs > 1:
    with ProcessPoolExecutor(procs) as pool:
        list(pool.map(decode, files))
else:
    [decode(f) for f in files]
print(time.perf_counter() - t0)
"""
REPORT = """
import subprocess, sys, time
t0 = time.perf_counter()
subprocess.run([sys.executable, "-m", "pardiag", "report", sys.argv[1], "--no-cache", "-o",
                sys.argv[2] + "/report.html", "--json", sys.argv[2] + "/report.json", "-q"],
               check=True)
print(time.perf_counter() - t0)
"""
PARDIAG = """
import sys, time
t0 = time.perf_counter()
from pardiag.cli import collect_less, keep_pyarrow_out, python_strings
keep_pyarrow_out(["report"])  # pandas without pyarrow, ...
collect_less()   # the garbage collector and ...
from pardiag.analyzer.trace import load_traces
from pardiag.analyzer.per_rank import REDUCER
from pardiag.analyzer.report.registry import build_report
with python_strings():  # ... pandas' text storage as the pardiag command sets them
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


def run_once(code: str, args: list[str], env: dict, sample: bool = True
             ) -> tuple[float, float | None] | None:
    """(seconds reported by the child, peak PSS of the child and its children in MB, or None
    without ``sample``)."""
    proc = psutil.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True, env=env)
    peak = 0
    stop = threading.Event()
    t_start = time.monotonic()

    def sampler() -> None:
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
            # every 10 ms for the first 2 s, then every 50 ms: reading a large process's PSS
            # costs CPU time, which the measured processes would lose on a 2-core machine
            stop.wait(0.01 if time.monotonic() - t_start < 2.0 else 0.05)

    th = threading.Thread(target=sampler, daemon=True) if sample else None
    if th is not None:
        th.start()
    out, err = proc.communicate()
    stop.set()
    if th is not None:
        th.join()
    run_once.last_output = out
    if proc.returncode != 0:
        print(f"  ({args[0]}: exit {proc.returncode}: {err.strip().splitlines()[-1:]})",
              file=sys.stderr)
        return None
    return float(out.strip().splitlines()[-1]), (peak / 1e6 if sample else None)


def measure(code: str, args: list[str], env: dict, repeat: int):
    """(median seconds of ``repeat`` runs without sampling, largest peak MB of ``repeat`` runs
    with it, fastest and slowest of the timed runs), or None when every run failed."""
    timed = [r for r in (run_once(code, args, env, sample=False) for _ in range(repeat)) if r]
    sampled = [r for r in (run_once(code, args, env) for _ in range(repeat)) if r]
    if not timed or not sampled:
        return None
    times = [t for t, _ in timed]
    return statistics.median(times), max(m for _, m in sampled), min(times), max(times)


def synthetic(work: Path, ranks: int, mb: float) -> Path:
    from synth_run import write_run

    d = work / f"synthetic_{ranks}x{mb:g}MB"
    if not (d.is_dir() and len([f for f in d.iterdir() if f.is_file()]) == ranks):
        shutil.rmtree(d, ignore_errors=True)
        print(f"writing {d} ...", file=sys.stderr)
        write_run(d, ranks, mb)
    return d


def replicate(work: Path, spec: str) -> Path:
    """``TRACE:N``: N copies of one trace as the ranks of one run, under ``work``."""
    import gzip
    import re

    src, n = spec.rsplit(":", 1)
    src, n = Path(src), int(n)
    d = work / f"{src.parent.name}_{src.name.split('.')[0]}_x{n}"
    if d.is_dir() and len(list(d.glob("rank*.json.gz"))) == n:
        return d
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    raw = src.read_bytes()
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
    info = re.compile(r'"distributedInfo":\s*\{[^}]*\}')
    if not info.search(text):
        raise SystemExit(f"{src}: no distributedInfo to set each copy's rank in")
    print(f"writing {d} ...", file=sys.stderr)
    for r in range(n):
        one = info.sub(f'"distributedInfo": {{"backend": "nccl", "rank": {r}, '
                       f'"world_size": {n}}}', text, count=1)
        (d / f"rank{r}.json.gz").write_bytes(gzip.compress(one.encode(), compresslevel=6))
    return d


def fmt(v, spec: str, width: int) -> str:
    return f"{v:{width}{spec}}" if v is not None else f"{'–':>{width}}"


COLUMNS = ("folder", "files", "MB", "floor s", "base s", "pardiag s", "report s", "HTA s",
           "p/HTA", "p/floor", "report/floor", "cached s", "speedup", "pardiag MB", "report MB",
           "HTA MB", "mem p/HTA")


#: The second table: each time's median and range over the timed runs.
RANGE_COLUMNS = ("folder", "floor s", "pardiag s", "report s", "HTA s", "cached s")


def _spread(m) -> str:
    return f"{m[0]:.2f} ({m[2]:.2f}–{m[3]:.2f})" if m else "–"


def measure_folder(f: Path, a, env: dict) -> tuple[list[str], list[str]]:
    """One row of each table (formatted cells, in COLUMNS' and RANGE_COLUMNS' order)."""
    from pardiag.analyzer.trace.workers import default_workers

    files = [x for x in f.iterdir() if x.is_file() and x.name.endswith((".json", ".json.gz"))]
    mb = sum(x.stat().st_size for x in files) / 1e6
    rep = 1 if mb > 200 else a.repeat
    procs = default_workers(files)
    # one untimed run each, so that every child imports from the bytecode cache
    for code, args in ((PARDIAG, [str(f), "nocache"]), (HTA, [str(f)])):
        if code is PARDIAG or not (a.no_hta or mb > a.hta_max_mb):
            run_once(code, args, env, sample=False)
    shutil.rmtree(f / ".pardiag-cache", ignore_errors=True)
    floor = measure(FLOOR, [str(f), str(procs)], env, rep)
    base = measure(BASELINE, [str(f)], env, rep)
    ours = measure(PARDIAG, [str(f), "nocache"], env, rep)
    out_dir = tempfile.mkdtemp(prefix="pardiag-bench-out-")
    whole = measure(REPORT, [str(f), out_dir], env, rep)
    shutil.rmtree(out_dir, ignore_errors=True)
    hta = None if a.no_hta or mb > a.hta_max_mb else measure(HTA, [str(f)], env, rep)
    run_once(PARDIAG, [str(f), "cache"], env)  # store the summaries
    cached = measure(PARDIAG, [str(f), "cache"], env, rep)
    shutil.rmtree(f / ".pardiag-cache", ignore_errors=True)
    t = lambda m: m[0] if m else None  # noqa: E731
    m = lambda m: m[1] if m else None  # noqa: E731
    r = lambda x, y: x / y if x is not None and y else None  # noqa: E731
    spreads = [f.name[:34], *(_spread(x) for x in (floor, ours, whole, hta, cached))]
    return [f.name[:34], str(len(files)), f"{mb:.0f}", fmt(t(floor), ".2f", 0),
            fmt(t(base), ".2f", 0), fmt(t(ours), ".2f", 0), fmt(t(whole), ".2f", 0),
            fmt(t(hta), ".2f", 0), fmt(r(t(ours), t(hta)), ".2f", 0),
            fmt(r(t(ours), t(floor)), ".2f", 0), fmt(r(t(whole), t(floor)), ".2f", 0),
            fmt(t(cached), ".2f", 0), fmt(r(t(ours), t(cached)), ".1f", 0),
            fmt(m(ours), ".0f", 0), fmt(m(whole), ".0f", 0), fmt(m(hta), ".0f", 0),
            fmt(r(m(ours), m(hta)), ".2f", 0)], spreads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("folders", nargs="*", type=Path)
    p.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    p.add_argument("--scale", action="store_true", help="add the 64 x 15 MB synthetic set")
    p.add_argument("--replicate", action="append", default=[], metavar="TRACE:N",
                   help="add N copies of TRACE as one N-rank run (repeatable)")
    p.add_argument("--no-hta", action="store_true", help="skip HTA")
    p.add_argument("--hta-max-mb", type=float, default=float("inf"),
                   help="skip HTA on folders larger than this (MB on disk)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "pardiag-bench")
    a = p.parse_args()
    folders = list(a.folders) + [replicate(a.work, spec) for spec in a.replicate]
    if not folders:
        folders = sorted(d for d in (REPO.parent / "shared" / "real_traces").iterdir()
                         if d.is_dir())
        folders.append(synthetic(a.work, 8, 15))
        if a.scale:
            folders.append(synthetic(a.work, 64, 15))
    cache_root = Path(tempfile.mkdtemp(prefix="pardiag-bench-cache-"))
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
           "PARDIAG_CACHE_DIR": str(cache_root)}
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" + "---:|" * (len(COLUMNS) - 1))
    spreads = []
    for f in folders:
        row, spread = measure_folder(f, a, env)
        spreads.append(spread)
        print("| " + " | ".join(row) + " |", flush=True)
    shutil.rmtree(cache_root, ignore_errors=True)
    print("\nmedian (fastest–slowest) of the timed runs, s:\n\n| " + " | ".join(RANGE_COLUMNS)
          + " |\n|" + "---|" + "---:|" * (len(RANGE_COLUMNS) - 1))
    for spread in spreads:
        print("| " + " | ".join(spread) + " |")
    print(f"cores: {len(os.sched_getaffinity(0))}, load average: "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} (rerun on a quiet machine)")


if __name__ == "__main__":
    main()
