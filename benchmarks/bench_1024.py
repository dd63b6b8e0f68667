"""A 1,024-rank run analyzed without a central pass over the raw traces.

    .venv/bin/python benchmarks/bench_1024.py [--ranks 1024] [--mb 0.5] [--nproc 2]

1. writes a synthetic run (``synth_run.py``: ``--ranks`` GPU traces of ``--mb`` MB of JSON) under
   ``--work`` (kept for reruns);
2. ``pardiag summarize`` under torchrun (``--nproc`` processes, each summarizing its share of
   the files, as processes on the nodes that hold the traces would; 2 plain processes with
   ``--shard`` where torch is missing);
3. ``pardiag report``'s load + every analysis from the summaries: time, peak memory (PSS of the
   process and its children) and how many raw traces were opened (must be 0);
4. for contrast, the same from the raw traces (``--no-cache``: every trace parsed centrally;
   ``--no-raw`` skips it).

Prints one table. Not a test: nothing asserts a time. Results depend on machine load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_report import run_once  # noqa: E402
from synth_run import write_run  # noqa: E402

REPORT = """
import sys, time
t0 = time.perf_counter()
from pardiag.cli import collect_less
collect_less()   # the garbage collector as the pardiag command sets it
import pardiag.analyzer.trace.load as load
from pardiag.analyzer.report.registry import build_report
from pardiag.analyzer.per_rank import REDUCER
parsed = []
parse_files = load.parse_files
def counting(files, *args, **kw):  # every raw trace the report parses goes through here
    parsed.extend(files)
    return parse_files(files, *args, **kw)
load.parse_files = counting
ts = load.load_traces(sys.argv[1], reducer=REDUCER, cache=sys.argv[2] == "cache")
rep = build_report(ts)
lazily = sum(t.events_loaded for t in ts.ranks.values())
n = len(rep.results["sync"].instances)
print(f"ranks={len(ts.ranks)} raw_traces_parsed={len(parsed) + lazily} matched_collectives={n}")
print(time.perf_counter() - t0)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--mb", type=float, default=0.5, help="JSON per rank, MB")
    p.add_argument("--nproc", type=int, default=2, help="summarizing processes")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "pardiag-bench")
    p.add_argument("--no-raw", action="store_true",
                   help="skip step 4 (the report from the raw traces: hours at 16,384 ranks)")
    a = p.parse_args()
    run = a.work / f"synthetic_{a.ranks}x{a.mb:g}MB"
    if not (run.is_dir() and sum(1 for f in run.iterdir() if f.is_file()) == a.ranks):
        shutil.rmtree(run, ignore_errors=True)
        t0 = time.perf_counter()
        write_run(run, a.ranks, a.mb, layers=8)
        print(f"wrote {run} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    shutil.rmtree(run / ".pardiag-cache", ignore_errors=True)
    size = sum(f.stat().st_size for f in run.iterdir() if f.is_file()) / 1e6
    env = {**os.environ, "PARDIAG_CACHE_DIR": tempfile.mkdtemp(prefix="pardiag-bench-cache-")}

    t0 = time.perf_counter()
    try:
        import torch  # noqa: F401
        how = f"torchrun --nproc-per-node {a.nproc}"
        res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc-per-node={a.nproc}", "-m", "pardiag", "summarize",
                              str(run), "--workers", "1"], env=env, capture_output=True,
                             text=True)
        ok = res.returncode == 0
        err = res.stderr
    except ImportError:
        how = f"{a.nproc} processes with --shard"
        procs = [subprocess.Popen([sys.executable, "-m", "pardiag", "summarize", str(run),
                                   "--shard", f"{i}/{a.nproc}", "--workers", "1"], env=env,
                                  stderr=subprocess.PIPE, text=True) for i in range(a.nproc)]
        outs = [pr.communicate()[1] for pr in procs]
        ok = all(pr.returncode == 0 for pr in procs)
        err = "".join(outs)
    t_sum = time.perf_counter() - t0
    if not ok:
        sys.exit(f"summarize failed:\n{err[-2000:]}")
    n_sum = len(list((run / ".pardiag-cache").glob("*.summary.json")))

    from_summaries = run_once(REPORT, [str(run), "cache"], env)
    info_s = run_once.last_output.splitlines()[0] if from_summaries else ""
    from_raw = None if a.no_raw else run_once(REPORT, [str(run), "nocache"], env)
    info_r = run_once.last_output.splitlines()[0] if from_raw else "not run (--no-raw)"
    print(f"{a.ranks} ranks x {a.mb:g} MB ({size:.0f} MB of JSON), "
          f"{len(os.sched_getaffinity(0))} cores")
    print(f"{'step':48} {'s':>7} {'peak MB':>8}")
    print(f"{'summarize (' + how + ')':48} {t_sum:7.1f} {'':>8}   {n_sum} summaries")
    for label, m, info in (("report load + analyses from summaries", from_summaries, info_s),
                           ("report load + analyses from raw traces", from_raw, info_r)):
        print(f"{label:48} {m[0]:7.1f} {m[1]:8.0f}   {info}" if m else
              f"{label:48} {'–':>7} {'–':>8}   {info or 'failed'}")
    shutil.rmtree(run / ".pardiag-cache", ignore_errors=True)


if __name__ == "__main__":
    main()
