"""Does `pardiag profile` ever change how a script ends? The teardown matrix.

Every cell of (DDP, FSDP2, 1F1B pipeline) x (the script destroys its process group or not) x
(`--pin-cpu` or not) x (a short run of 2 steps, which ends before the profiler's window does,
or a long one of 24) runs `pardiag profile --nproc-per-node 2` R times (default 3). A run
passes when pardiag exits 0 by itself: no `--timeout` (set as a safety net, default 180 s),
no rank stopped at exit, no rank's backstop; the wall time is kept per run.

    .venv/bin/python benchmarks/teardown_matrix.py [--repeat 3] [--cells ddp,fsdp2,pp]
        [--json out.json]

Prints one line per run and per cell; exits 1 unless every run passed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import describe, finish, machine  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = {"ddp": ["train_ddp.py"], "fsdp2": ["train_fsdp2.py"],
           "pp": ["train_pp.py", "--schedule", "1f1b", "--microbatches", "4"]}
LENGTHS = {"short": 2, "long": 24}
#: what pardiag prints when it had to stop ranks, or a rank stopped itself, at the end
HANG_MARKS = ("pardiag: hang", "did not finish", "stopped itself")


def run_cell(tmp: Path, kind: str, destroy: bool, pin: bool, length: str, i: int,
             timeout_s: float) -> dict:
    """One run of one cell: ``{"cell", "exit_code", "wall_s", "passed", "tail"}``."""
    script, *extra = SCRIPTS[kind]
    out = tmp / f"{kind}-{int(destroy)}-{int(pin)}-{length}-{i}"
    cmd = [sys.executable, "-m", "pardiag", "profile", "--nproc-per-node", "2", "--out", str(out),
           "--timeout", str(timeout_s), *(["--pin-cpu"] if pin else []),
           str(REPO / "examples" / script), "--", *extra, "--steps", str(LENGTHS[length]),
           *(["--destroy"] if destroy else [])]
    t0 = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout_s + 120)
    wall = time.time() - t0
    hung = [ln for ln in res.stderr.splitlines() if any(m in ln for m in HANG_MARKS)]
    cell = f"{kind} {'destroy' if destroy else 'keep-pg'} {'pin' if pin else 'no-pin'} {length}"
    return {"cell": cell, "run": i, "exit_code": res.returncode, "wall_s": round(wall, 1),
            "passed": res.returncode == 0 and not hung, "hang_lines": hung,
            "tail": res.stderr.strip().splitlines()[-3:] if res.returncode else []}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cells", default="ddp,fsdp2,pp", help="strategies, comma-separated")
    ap.add_argument("--timeout", type=float, default=180.0,
                    help="pardiag profile --timeout (s): a run still going then counts as hung")
    ap.add_argument("--json", type=Path, default=None, help="write the machine and runs here")
    args = ap.parse_args()
    info = machine()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pardiag-teardown-") as tmp:
        for kind, destroy, pin, length in itertools.product(
                args.cells.split(","), (False, True), (False, True), LENGTHS):
            for i in range(args.repeat):
                row = run_cell(Path(tmp), kind, destroy, pin, length, i, args.timeout)
                rows.append(row)
                print(f"{row['cell']:32s} run {i}: exit {row['exit_code']}, {row['wall_s']:5.1f} s"
                      + ("" if row["passed"] else f"  FAILED {row['hang_lines'] or row['tail']}"),
                      flush=True)
    info = finish(info)
    cells = sorted({r["cell"] for r in rows})
    failed = [c for c in cells if not all(r["passed"] for r in rows if r["cell"] == c)]
    walls = sorted(r["wall_s"] for r in rows)
    print(f"\n{describe(info)}\n{len(cells) - len(failed)} of {len(cells)} cells passed every "
          f"run; {sum(r['passed'] for r in rows)} of {len(rows)} runs; wall time median "
          f"{walls[len(walls) // 2]:.1f} s, max {walls[-1]:.1f} s"
          + (f"; failed: {failed}" if failed else ""))
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "runs": rows}, indent=1))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
