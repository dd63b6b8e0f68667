"""Stress benchmark: short runs that end before the profiler's window does.

Runs ``pardiag profile --nproc-per-node 2`` N times (default 30) on 2-step scripts — the
profiled window (wait 1, warmup 1, active 3) never completes — alternating two endings:
``examples/train_ddp.py --steps 2`` (ends with a barrier, leaves the process group alive) and a
small DDP script that calls ``dist.destroy_process_group()`` at its end. For each run it records
the exit code, the wall time, whether both traces were written, and whether pardiag had to stop
ranks stuck at exit after they wrote every file (its safety net; counted apart, so a run that
needed it is visible even though it exits 0).

    .venv/bin/python benchmarks/short_runs.py [--runs 30] [--timeout 240] [--json out.json]

Prints one line per run and a summary; exits 1 unless every run exited 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

DESTROY = '''import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
m = DDP(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)]))
opt = torch.optim.Adam(m.parameters())
for _ in range(2):
    opt.zero_grad(); m(torch.randn(32, 256)).sum().backward(); opt.step()
dist.destroy_process_group()
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--timeout", type=float, default=240.0,
                    help="pardiag profile --timeout (s): a run still going then counts as hung")
    ap.add_argument("--json", type=Path, default=None, help="write the per-run results here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pardiag-short-") as tmp:
        destroy = Path(tmp) / "ddp_destroy.py"
        destroy.write_text(DESTROY)
        cases = [("train_ddp --steps 2", [str(REPO / "examples" / "train_ddp.py"), "--",
                                          "--steps", "2"]),
                 ("ddp + destroy_process_group, 2 steps", [str(destroy)])]
        for i in range(args.runs):
            name, script = cases[i % 2]
            out = Path(tmp) / f"run{i}"
            t0 = time.time()
            res = subprocess.run(
                [sys.executable, "-m", "pardiag", "profile", "--nproc-per-node", "2",
                 "--out", str(out), "--timeout", str(args.timeout), *script],
                capture_output=True, text=True, cwd=REPO, timeout=args.timeout + 120)
            wall = time.time() - t0
            traces = len(list(out.glob("rank*.trace.json.gz")))
            net = "had not exited; they were stopped" in res.stderr
            rows.append({"run": i, "case": name, "exit_code": res.returncode,
                         "wall_s": round(wall, 1), "traces": traces, "stopped_at_exit": net,
                         "tail": res.stderr.strip().splitlines()[-3:] if res.returncode else []})
            print(f"run {i:2d} [{name}]: exit {res.returncode}, {wall:.1f} s, {traces} traces"
                  + (", ranks stopped at exit" if net else ""), flush=True)
    ok = sum(r["exit_code"] == 0 for r in rows)
    both = sum(r["traces"] == 2 for r in rows)
    nets = sum(r["stopped_at_exit"] for r in rows)
    walls = sorted(r["wall_s"] for r in rows)
    print(f"\n{ok} of {len(rows)} runs exited 0; {both} wrote both traces; {nets} needed "
          f"ranks stopped at exit; wall time median {walls[len(walls) // 2]:.1f} s, max "
          f"{walls[-1]:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
