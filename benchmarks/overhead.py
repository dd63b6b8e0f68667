"""Cost of `pardiag profile` outside the profiler's window: each example under plain
``torchrun`` and under ``pardiag profile`` with the same arguments, interleaved.

    .venv/bin/python benchmarks/overhead.py [--repeat 5] [--steps 40] [--pin-cpu]
        [--only ddp,pp_1f1b] [--inside] [--monitor] [--json out.json]

Per-step wall times come from the examples' ``--times-out`` (every rank). A run's step time is
the median of every rank's steps from the second step after the window to the end (the first
after the window waits for the trace's export; the same steps of the plain run). Each
repetition runs plain and pardiag back to back, in alternating order (plain first in even
repetitions), so a drift of the machine hits both alike; the overhead of a repetition is
pardiag / plain − 1 of that pair. The table shows the median over the repetitions and their
[min, max], and the plain runs' own spread (max − min over the repetitions, in % of their
median). An overhead is "inside the noise" when the paired overheads change sign over the
repetitions; "every pair above" marks a cost found in every repetition. A median under the
goal is "not settled" when the pairs' half-range is wider than the goal. Also shown: pardiag's
work when the window ends (``post_window_s`` of the ranks' metadata; not in any measured step)
and what its wrappers add per step outside the window by their own measurement (calls outside
the window per unprofiled step × each wrapper's cost per call timed on a no-op after the run,
``wrapper_cost_us``; the largest rank's), the part of the overhead the hooks explain.

``--monitor`` runs ``pardiag profile --monitor`` instead (every step monitored, no window; the
same steps counted; goal ≤ 0.5%).

``--inside`` adds plain ``torch.profiler`` runs with the same schedule and options
(``_plain_profiler.py``) and compares the profiled steps with them.

Not a test: nothing asserts a time. Goal: ≤ 2% median outside the window on every example.
The machine (CPU model, cores, load average before and after) is printed and written with the
rows (``--json``). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import describe, finish, machine  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = {
    "ddp": ("train_ddp.py", 2, []), "fsdp2": ("train_fsdp2.py", 2, []),
    "fsdp1": ("train_fsdp1.py", 2, []), "zero1": ("train_zero1.py", 2, []),
    "tp": ("train_tp.py", 2, []), "moe": ("train_moe.py", 2, []),
    "pp_1f1b": ("train_pp.py", 2, ["--schedule", "1f1b", "--microbatches", "8"]),
    # the what-if validation's pipeline (benchmarks/whatif_validate.py pp_unbalanced)
    "pp_unbalanced": ("train_pp.py", 2, ["--schedule", "1f1b", "--microbatches", "4",
                                         "--layers-per-stage", "1,5", "--batch", "128"]),
    "2d": ("train_2d.py", 4, []),
}
WAIT, WARMUP, ACTIVE = 8, 1, 5
#: first step counted after the window: the one after the window waits for the export
AFTER = WAIT + WARMUP + ACTIVE + 1


def _times(path: Path, n: int) -> list[list[float]]:
    return [json.loads(Path(f"{path}.rank{r}").read_text()) for r in range(n)]


def run(kind: str, script: Path, n: int, args: list[str], steps: int, tmp: Path,
        monitor: bool = False) -> tuple[list[list[float]], list[float], list[float]]:
    """Per-rank step times (s) of one run and, under pardiag, the ranks' post-window seconds
    and the µs per unprofiled step their wrappers measured they add (with ``monitor``:
    ``pardiag profile --monitor``, no window, every step monitored, neither measured)."""
    times = tmp / f"{kind}.times"
    sargs = [*args, "--steps", str(steps), "--times-out", str(times)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(n)]
    if kind == "plain":
        cmd = [*torchrun, str(script), *sargs]
    elif kind == "torch_profiler":
        cmd = [*torchrun, str(REPO / "benchmarks" / "_plain_profiler.py"), str(WAIT), str(WARMUP),
               str(ACTIVE), str(tmp), str(script), *sargs]
    else:
        cmd = [sys.executable, "-m", "pardiag", "profile", str(script), "--nproc-per-node", str(n),
               "--out", str(tmp / "run"), "--overwrite",
               *(["--monitor"] if monitor else ["--wait", str(WAIT), "--warmup", str(WARMUP),
                                                "--active", str(ACTIVE)]), "--", *sargs]
    for _attempt in range(3):  # a rare abort at exit of a gloo process is retried, not measured
        res = subprocess.run(cmd, capture_output=True, text=True,
                             env={"OMP_NUM_THREADS": "1", **os.environ})
        if res.returncode == 0:
            post, wrap = [], []
            if kind == "pardiag" and monitor:   # the monitor's own cost per step, measured
                for r in range(n):
                    meta = json.loads((tmp / "run" / "pardiag" / f"rank{r}.meta.json").read_text())
                    inst = meta.get("instrumentation") or {}
                    cost = (inst.get("wrapper_cost_us") or {}).get("monitor_call")
                    seen = inst.get("monitor_calls") or {}
                    if cost is not None and seen.get("steps"):
                        wrap.append(float(cost) * seen["calls"] / seen["steps"])
            if kind == "pardiag" and not monitor:
                for r in range(n):
                    meta = json.loads((tmp / "run" / "pardiag" / f"rank{r}.meta.json").read_text())
                    inst = meta.get("instrumentation") or {}
                    if isinstance(inst.get("post_window_s"), (int, float)):
                        post.append(float(inst["post_window_s"]))
                    cost = inst.get("wrapper_cost_us") or {}
                    outside_steps = max(steps - ACTIVE, 1)
                    wrap.append(sum((inst.get(f"{k}_calls") or {}).get("outside", 0)
                                    * float(cost.get(k) or 0.0) for k in ("p2p", "chunk"))
                                / outside_steps)
            return _times(times, n), post, wrap
    raise RuntimeError(f"{kind} {script.name} failed 3 times:\n{res.stderr[-2000:]}")


def step_ms(per_rank: list[list[float]], sl: slice) -> float:
    """Median (ms) of every rank's step times in ``sl``."""
    return statistics.median(t for rank in per_rank for t in rank[sl]) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--only", default="", help="comma-separated subset of " + ",".join(EXAMPLES))
    p.add_argument("--repeat", type=int, default=5, help="interleaved repetitions per example")
    p.add_argument("--pin-cpu", action="store_true",
                   help="pass --pin-cpu to every example (each rank on its own core)")
    p.add_argument("--inside", action="store_true",
                   help="also run plain torch.profiler and compare the profiled steps")
    p.add_argument("--json", type=Path, default=None, help="write the rows and the machine")
    p.add_argument("--monitor", action="store_true",
                   help="pardiag profile --monitor (every step monitored, no profiler window) "
                        "against plain torchrun; the goal is then 0.5%%")
    a = p.parse_args()
    names = a.only.split(",") if a.only else list(EXAMPLES)
    unknown = set(names) - set(EXAMPLES)
    if unknown:
        p.error(f"unknown example(s) {sorted(unknown)}; choose from {sorted(EXAMPLES)}")
    if a.steps < AFTER + 3:
        p.error(f"--steps must be at least {AFTER + 3} (window ends at step {AFTER - 1})")
    info = machine()
    print(f"machine: {describe(info)}", flush=True)
    window, after = slice(WAIT + WARMUP, WAIT + WARMUP + ACTIVE), slice(AFTER, a.steps)
    kinds = ["plain", "pardiag"] + (["torch_profiler"] if a.inside else [])
    rows = []
    for name in names:
        script, n, args = EXAMPLES[name]
        args = [*args, "--pin-cpu"] if a.pin_cpu else args
        reps: dict[str, list] = {k: [] for k in kinds}
        post: list[float] = []
        wrap: list[float] = []
        for rep in range(a.repeat):   # interleaved, alternating order: drifts hit both alike
            for kind in (kinds if rep % 2 == 0 else kinds[::-1]):
                with tempfile.TemporaryDirectory() as d:
                    t, pw, wr = run(kind, REPO / "examples" / script, n, args, a.steps,
                                    Path(d), a.monitor)
                reps[kind].append(t)
                post += pw
                if wr:
                    wrap.append(max(wr))
        plain = [step_ms(t, after) for t in reps["plain"]]
        prof = [step_ms(t, after) for t in reps["pardiag"]]
        ratio = [100.0 * (o / q - 1) for o, q in zip(prof, plain)]
        row = {"example": name, "ranks": n, "args": args, "repeat": a.repeat,
               "plain_ms": plain, "pardiag_ms": prof, "outside_pct": ratio,
               "outside_median_pct": statistics.median(ratio),
               "plain_spread_pct": 100.0 * (max(plain) - min(plain)) / statistics.median(plain),
               "post_window_s": statistics.median(post) if post else None,
               "wrappers_us_per_step": statistics.median(wrap) if wrap else None}
        if a.inside:
            tp = [step_ms(t, window) for t in reps["torch_profiler"]]
            inside = [step_ms(t, window) for t in reps["pardiag"]]
            row |= {"torch_profiler_ms": tp, "inside_ms": inside,
                    "inside_pct": [100.0 * (i / q - 1) for i, q in zip(inside, tp)]}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "args"}, default=str), flush=True)
    info = finish(info)
    print(f"\nmachine: {describe(info)}")
    what = ("every step monitored (no window)" if a.monitor
            else f"window {WAIT + WARMUP}–{WAIT + WARMUP + ACTIVE - 1}")
    print(f"{a.repeat} interleaved repetitions, {a.steps} steps, {what}, steps {AFTER}–"
          f"{a.steps - 1} counted{', ranks pinned' if a.pin_cpu else ''}\n")
    head = ("| example | plain ms | pardiag ms | outside (median) | [min, max] | plain runs' "
            "spread | post-window s | wrappers' own µs/step |")
    print(head + (" inside vs torch.profiler |" if a.inside else ""))
    print("|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if a.inside else ""))
    for r in rows:
        # inside the noise: the paired overheads change sign over the repetitions (a cost the
        # instrumentation adds to every run would make every pair positive)
        verdict = ("inside the noise" if min(r["outside_pct"]) < 0 < max(r["outside_pct"])
                   else "every pair above" if min(r["outside_pct"]) > 0 else "every pair below")
        line = (f"| {r['example']} | {statistics.median(r['plain_ms']):.2f} | "
                f"{statistics.median(r['pardiag_ms']):.2f} | {r['outside_median_pct']:+.1f}%"
                f"{' (' + verdict + ')' if verdict else ''} | "
                f"[{min(r['outside_pct']):+.1f}, {max(r['outside_pct']):+.1f}]% | "
                f"{r['plain_spread_pct']:.1f}% | "
                + (f"{r['post_window_s']:.2f}" if r["post_window_s"] is not None else "–")
                + " | " + (f"{r['wrappers_us_per_step']:.1f}"
                           if r["wrappers_us_per_step"] is not None else "–") + " |")
        if a.inside:
            line += (f" {statistics.median(r['inside_pct']):+.1f}% "
                     f"[{min(r['inside_pct']):+.1f}, {max(r['inside_pct']):+.1f}] |")
        print(line)
    goal = 0.5 if a.monitor else 2.0
    over = [r["example"] for r in rows if r["outside_median_pct"] > goal]
    # a median under the goal shows nothing when the pairs spread far wider than the goal
    unsettled = [r["example"] for r in rows if r["example"] not in over
                 and (max(r["outside_pct"]) - min(r["outside_pct"])) / 2 > goal]
    met = [r["example"] for r in rows if r["example"] not in over + unsettled]
    parts = ([f"met on {', '.join(met)}"] if met else []) + (
        [f"not met on {', '.join(over)}"] if over else []) + (
        [f"not settled on {', '.join(unsettled)} (its pairs spread wider than the goal)"]
        if unsettled else [])
    print(f"\ngoal ≤ {goal:g}% median "
          + ("with every step monitored: " if a.monitor else "outside the window: ")
          + "; ".join(parts))
    if a.json:
        a.json.write_text(json.dumps({"machine": info, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
