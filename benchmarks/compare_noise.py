"""How far apart are identical runs, and does `pardiag compare` say so? (a benchmark).

With ``--repeat 1`` (one run per side) each round profiles the DDP example three times in a row
(2 ranks, `--pin-cpu`, ``--steps`` steps): A, then B with a planted slowdown (rank 0 sleeps
`--slow-ms` per step, set once from a calibration run to ``--change-pct`` of its step), then A'
identical to A. It compares A with A' (identical: the answer should be "within noise") and A
with B (the planted change: B must come out slower).

With ``--repeat N`` each side is a set of N runs, as ``pardiag profile --repeat N`` writes it,
run one after the other as a user would (the N runs of A, then the N of B): round i profiles
the set A_i then the planted set B_i, and one more set A_{rounds} closes the sequence. It
compares A_i with B_i (planted) and A_i with A_{i+1} (identical, recorded minutes apart).

Per comparison it keeps B's step time change in % and compare's verdict on the noise
(:class:`pardiag.analyzer.report.reading.StepDelta`).

    .venv/bin/python benchmarks/compare_noise.py [--rounds 20] [--repeat 5] [--change-pct 20]
        [--steps 24] [--json out.json]

Prints one line per round and the counts the goals are stated in: identical pairs called within
noise, planted changes with the right sign (and called beyond noise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import describe, finish, machine  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train_ddp.py"
STEPS = 24


def profile(out: Path, extra: list[str], repeat: int = 1, steps: int = STEPS) -> None:
    """A pinned 2-rank run of the DDP example into ``out`` (``repeat`` > 1: a set of runs)."""
    cmd = [sys.executable, "-m", "pardiag", "profile", "--nproc-per-node", "2", "--pin-cpu",
           *(["--repeat", str(repeat)] if repeat > 1 else []),
           "--out", str(out), str(EXAMPLE), "--", "--steps", str(steps), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600 * repeat, cwd=REPO)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr[-800:]}")


def step_ms(run: Path) -> float:
    """The run's median step (ms) as its report measures it."""
    import pardiag
    return float(pardiag.compare(run, run).step.a.median_us) / 1e3


def compared(a: Path, b: Path) -> dict:
    """``{"delta_pct", "beyond_noise", "noise"}`` of ``pardiag.compare(a, b)``."""
    import pardiag
    import pardiag.layout
    c = pardiag.compare(a, b)
    s = c.step

    def probes(side: Path) -> list:
        out = []
        for run in pardiag.layout.repeat_runs(side) or [side]:
            f = json.loads((run / "pardiag" / "run.json").read_text())
            out.append([f.get("host_probe_before_ms"), f.get("host_probe_after_ms")])
        return out
    return {"host_probe": next((w for w in c.warnings if w.startswith("the host probe")), None),
            "delta_pct": round(float(s.delta_pct), 2), "beyond_noise": s.beyond_noise,
            "noise": s.noise, "p_value": s.p_value,
            "a_runs_ms": [round(x / 1e3, 3) for x in s.a.runs_us] if s.a else [],
            "b_runs_ms": [round(x / 1e3, 3) for x in s.b.runs_us] if s.b else [],
            "a_probes_ms": probes(a), "b_probes_ms": probes(b)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=1, help="runs per side")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--change-pct", type=float, default=20.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    info = machine()
    rows = []
    n, steps = args.repeat, args.steps
    with tempfile.TemporaryDirectory(prefix="pardiag-noise-") as tmp:
        cal = Path(tmp) / "calibration"
        profile(cal, [], steps=steps)
        base = step_ms(cal)
        slow = round(base * args.change_pct / 100.0, 3)
        planted_args = ["--slow-rank", "0", "--slow-ms", str(slow)]
        print(f"calibration: step {base:.3f} ms; planted sleep {slow} ms on rank 0", flush=True)
        if n > 1:
            profile(Path(tmp) / "a0", [], n, steps)
        for i in range(args.rounds):
            a, b, a2 = (Path(tmp) / x for x in (f"a{i}", f"b{i}", f"a{i + 1}" if n > 1
                                                 else f"a2_{i}"))
            if n == 1:
                profile(a, [], steps=steps)
            profile(b, planted_args, n, steps)
            profile(a2, [], n, steps)
            same, planted = compared(a, a2), compared(a, b)
            rows.append({"round": i, "identical": same, "planted": planted})
            print(f"round {i:2d}: identical {same['delta_pct']:+6.1f}% "
                  f"({'beyond' if same['beyond_noise'] else 'within'}); planted "
                  f"{planted['delta_pct']:+6.1f}% "
                  f"({'beyond' if planted['beyond_noise'] else 'within'})", flush=True)
    info = finish(info)
    same = [r["identical"] for r in rows]
    planted = [r["planted"] for r in rows]
    spread = sorted(abs(s["delta_pct"]) for s in same)
    print(f"\n{describe(info)}\ncalibration step {base:.3f} ms, planted {slow} ms "
          f"({args.change_pct:g}%)\nidentical pairs: |change| median "
          f"{statistics.median(spread):.1f}%, max {spread[-1]:.1f}%; called within noise "
          f"{sum(s['beyond_noise'] is not True for s in same)} of {len(same)}\n"
          f"planted: change median {statistics.median(p['delta_pct'] for p in planted):+.1f}%; "
          f"right sign {sum(p['delta_pct'] > 0 for p in planted)} of {len(planted)}; called "
          f"beyond noise {sum(p['beyond_noise'] is True for p in planted)}, of them with the "
          f"wrong sign {sum(p['beyond_noise'] is True and p['delta_pct'] < 0 for p in planted)}")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "calibration_ms": base,
                                         "planted_ms": slow, "repeat": n, "steps": steps,
                                         "rounds": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
