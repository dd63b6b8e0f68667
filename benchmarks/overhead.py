"""Overhead of `pardiag profile`: step time of each example unprofiled, under pardiag (outside
and inside the active window), and under plain torch.profiler with the same schedule.

    .venv/bin/python benchmarks/overhead.py [--steps 40] [--only ddp,fsdp2]

Per-step wall times come from the examples' ``--times-out`` (rank 0). Outside the window: the
steps after the profiler has finished, compared with the same steps unprofiled. Inside: the
active steps, compared with the same steps under plain torch.profiler. Medians over steps; not a
test, nothing asserts a time. Goals: ≤ 2% outside, ≤ 5% above plain torch.profiler inside.
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

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = {
    "ddp": ("train_ddp.py", 2, []), "fsdp2": ("train_fsdp2.py", 2, []),
    "fsdp1": ("train_fsdp1.py", 2, []), "zero1": ("train_zero1.py", 2, []),
    "tp": ("train_tp.py", 2, []), "moe": ("train_moe.py", 2, []),
    "pp_1f1b": ("train_pp.py", 2, ["--schedule", "1f1b", "--microbatches", "8"]),
    "2d": ("train_2d.py", 4, []),
}
WAIT, WARMUP, ACTIVE = 8, 1, 5


def _times(path: Path) -> list[float]:
    return json.loads(Path(f"{path}.rank0").read_text())


def run(kind: str, script: Path, n: int, args: list[str], steps: int, tmp: Path) -> list[float]:
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
               "--out", str(tmp / "run"), "--overwrite", "--wait", str(WAIT), "--warmup",
               str(WARMUP), "--active", str(ACTIVE), "--", *sargs]
    for attempt in range(3):  # a rare abort at exit of a gloo process is retried, not measured
        res = subprocess.run(cmd, capture_output=True, text=True,
                             env={"OMP_NUM_THREADS": "1", **os.environ})
        if res.returncode == 0:
            return _times(times)
    raise RuntimeError(f"{kind} {script.name} failed 3 times:\n{res.stderr[-2000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--only", default="", help="comma-separated subset of " + ",".join(EXAMPLES))
    p.add_argument("--repeat", type=int, default=5, help="interleaved repetitions per example")
    a = p.parse_args()
    names = a.only.split(",") if a.only else list(EXAMPLES)
    window = slice(WAIT + WARMUP, WAIT + WARMUP + ACTIVE)
    after = slice(WAIT + WARMUP + ACTIVE + 2, a.steps)  # 2 steps for export to settle
    print(f"{'example':10} {'plain ms':>9} {'outside ms':>11} {'outside':>8} {'range':>15} "
          f"{'torch.prof ms':>14} {'inside ms':>10} {'inside':>8} {'range':>15}")
    med = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    for name in names:
        script, n, args = EXAMPLES[name]
        reps = {"plain": [], "torch_profiler": [], "pardiag": []}
        for _ in range(a.repeat):  # interleaved, so drifts of the machine hit all three alike
            for kind in reps:
                with tempfile.TemporaryDirectory() as d:
                    reps[kind].append(run(kind, REPO / "examples" / script, n, args, a.steps, Path(d)))
        out_ratio = [med(o[after]) / med(p[after]) - 1 for o, p in zip(reps["pardiag"], reps["plain"])]
        in_ratio = [med(o[window]) / med(t[window]) - 1
                    for o, t in zip(reps["pardiag"], reps["torch_profiler"])]
        mm = lambda kind, sl: statistics.median(med(x[sl]) for x in reps[kind])  # noqa: E731
        print(f"{name:10} {mm('plain', after):9.2f} {mm('pardiag', after):11.2f} "
              f"{100 * statistics.median(out_ratio):+7.1f}% "
              f"[{100 * min(out_ratio):+5.1f},{100 * max(out_ratio):+5.1f}]% "
              f"{mm('torch_profiler', window):14.2f} {mm('pardiag', window):10.2f} "
              f"{100 * statistics.median(in_ratio):+7.1f}% "
              f"[{100 * min(in_ratio):+5.1f},{100 * max(in_ratio):+5.1f}]%", flush=True)


if __name__ == "__main__":
    main()
