"""How long ``pardiag report`` of a large monitored run takes: ``--ranks`` ranks × ``--steps``
steps of per-step summaries (the lines of ``pardiag profile --monitor`` without call records:
``keep_calls`` False), written as the collector writes them, one line per 50 steps, with a
transient straggler planted.

    python -m benchmarks.bench_monitor_scale [--ranks 1024] [--steps 10000] [--repeat 3]

Times the report's work in-process (reading every file, the lateness, the findings, the page)
and checks the planted straggler is the finding. Not a test: nothing asserts a time. Goal: the
report of 1,024 ranks × 10,000 steps in <= 30 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from benchmarks._machine import describe, emit, finish, machine

EVERY = 50
STEP_US = 100_000
T0_NS = 1_700_000_000_000_000_000


def write_run(out: Path, ranks: int, steps: int, slow: tuple[int, int, int, float],
              seed: int = 0) -> None:
    """One monitor file per rank: steps of 100 ms ± 2 ms, each rank issuing its first, median
    and last collective 40, 50 and 60 ms into the step ± 1 ms each; ``slow`` = (rank, first,
    last, µs) arrives that much later then (and the step lasts as much longer)."""
    from pardiag import layout
    from pardiag.collectors.monitor import OPS, SCHEMA

    rng = np.random.default_rng(seed)
    sr, first, last, extra = slow
    k = np.arange(steps)
    lag = np.where((k >= first) & (k <= last), extra, 0.0)
    dur = STEP_US + rng.normal(0, 2000, steps) + lag
    end = np.cumsum(dur)
    layout.sidecar_dir(out).mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        at = {k_: end - dur + us + rng.normal(0, 1000, steps) + (lag if r == sr else 0.0)
              for k_, us in (("arrive_first_us", 40_000), ("arrive_us", 50_000),
                             ("arrive_last_us", 60_000))}
        with open(layout.monitor_path(out, r), "wb") as fh:
            for a in range(0, steps, EVERY):
                s = slice(a, min(a + EVERY, steps))
                fh.write(orjson.dumps({
                    "schema": SCHEMA, "rank": r, "base_ns": T0_NS, "ops": list(OPS),
                    "steps": {"index": k[s].tolist(), "end_us": end[s].astype(int).tolist(),
                              "dur_us": dur[s].astype(int).tolist(),
                              "optimizer_us": [3000] * (s.stop - s.start),
                              "data_us": [200] * (s.stop - s.start),
                              **{k_: v[s].astype(int).tolist() for k_, v in at.items()}},
                    "calls": {"step": [], "group": [], "op": [], "bytes": [], "issue_us": [],
                              "return_us": [], "done_us": []},
                    "dropped_calls": 0, "memory": {"rss_bytes": None, "device_bytes": None},
                }) + b"\n")


def report_once(run: Path, page: Path) -> tuple[float, dict]:
    from pardiag.analyzer.analyses.monitor_summary import summary
    from pardiag.analyzer.analyses.monitored import load_monitor
    from pardiag.analyzer.render.monitor_page import monitor_html

    t0 = time.perf_counter()
    data = load_monitor(run)
    doc = {"kind": "monitored_run", "source": str(run), **summary(data, run)}
    page.write_text(monitor_html(data, doc, str(run), "cdn"))
    return time.perf_counter() - t0, doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    info = machine()
    slow = (a.ranks // 3, a.steps // 2, a.steps // 2 + 199, 30_000.0)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        t0 = time.perf_counter()
        write_run(run, a.ranks, a.steps, slow)
        written = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in run.rglob("*.jsonl"))
        times, doc = [], {}
        for _ in range(a.repeat):
            t, doc = report_once(run, Path(tmp) / "page.html")
            times.append(t)
    info = finish(info)
    strag = [(f["rank"], f["first_step"], f["last_step"]) for f in doc["findings"]
             if f["kind"] == "straggler"]
    cmd = "python -m benchmarks.bench_monitor_scale " + " ".join(argv or sys.argv[1:])
    lines = [f"# Report of a large monitored run ({time.strftime('%Y-%m-%d', time.gmtime())})",
             "", f"- **Command:** `{cmd}`", f"- **Machine:** {describe(info)}",
             f"- **Repetitions:** {a.repeat} reports of one run ({a.ranks} ranks × {a.steps} "
             f"steps of per-step summaries, {size / 2**20:.0f} MiB in {a.ranks} files, written "
             f"in {written:.0f} s)", "",
             f"Report (read every file, lateness, findings, page): median "
             f"{statistics.median(times):.1f} s, range {min(times):.1f}–{max(times):.1f} s "
             f"(goal <= 30 s: {'met' if statistics.median(times) <= 30 else 'NOT met'}).", "",
             f"Planted: rank {slow[0]} 30 ms late in steps {slow[1]}–{slow[2]}; stragglers "
             f"found: {strag or 'none'}."]
    emit("\n".join(lines), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
