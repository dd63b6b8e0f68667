"""How often a monitored run's findings are right: a transient slow rank, a persistent one, and
clean runs (``pardiag profile --monitor``; :mod:`pardiag.analyzer.analyses.monitored`).

Two sources of runs:

* default: the noise of real clean monitored runs (their per-step records and collectives;
  ``--record N`` runs of ``examples/train_ddp.py`` on ``--ranks`` pinned ranks recorded first,
  or ``--noise RUN`` given once per run; the trials are shared out among them, since one
  run's noise holds the slow periods the machine had that minute and no other's),
  resampled in blocks of :data:`BLOCK` steps into ``--steps``-step runs
  (a moving-block bootstrap: each trial's noise is the machine's own, in a new order; blocks
  begin and end on ordinary steps, so that no junction joins two short slowdowns), then
  planted: the slow rank issues every collective of the slow steps ``share`` × the median step
  later, and those steps last as much longer on every rank (synchronous training waits for it).
  Kinds: ``transient`` (+``--share`` for ``--slow-steps`` of ``--steps``, at a random start),
  ``persistent`` (every step), ``clean`` (nothing planted).
* ``--real N``: N real runs of each kind (``examples/train_ddp.py`` under ``pardiag profile
  --monitor --pin-cpu``, the slow rank sleeping ``--share`` × the clean run's median step).

The clean run's own findings (a 2-core virtual machine has real slow periods: a core taken
away for a while) are listed, and the blocks holding them are not resampled: the trials'
noise is the machine's without its events. Judged per run: a transient is right when exactly
one straggler finding names the slow rank with its first and last step each within
``--tolerance`` steps of the planted ones and no other straggler finding spans more than
``--tolerance`` steps; a persistent one when the slow rank's finding is persistent; a clean
run when it has no straggler and no slow-steps finding.

Usage::

    python -m benchmarks.monitor_detection [--noise RUN ...] [--record N] --trials 50 [--out F]
    python -m benchmarks.monitor_detection --real 5 --ranks 2 [--out FILE.md]

Not a test: nothing asserts a rate. Goals (the always-on monitor's): transient and persistent
each named in >= 49 of 50 runs, clean runs with no finding in >= 49 of 50.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks._machine import describe, emit, finish, machine

REPO = Path(__file__).resolve().parents[1]
#: Steps per resampled block of the noise.
BLOCK = 50
#: A step is ordinary (a block may begin or end there) when its median over the ranks is at
#: most this multiple of the run's median step.
ORDINARY = 1.2
KINDS = ("transient", "persistent", "clean")


def _resampled(data, steps: int, rng: np.random.Generator, events: list[dict]):
    """A ``steps``-step copy of ``data`` (:class:`MonitorData`) built of random blocks of
    :data:`BLOCK` consecutive steps of it (its first 10 steps, the start-up, left out, and
    every block that holds a step of ``events``, the noise run's own findings), each beginning
    and ending on :data:`ORDINARY` steps."""
    from pardiag.analyzer.analyses.monitored import MonitorData

    have = np.sort(data.steps["step"].unique())
    have = have[have >= 10]
    starts = have[: len(have) - BLOCK]
    # blocks cut where the run is ordinary: a block that ended inside a short slowdown of the
    # machine (1-3 steps, every ~2 s on this VM) followed by one that began inside another
    # would join them into a longer slowdown than the run ever had
    dur = data.steps.groupby("step")["dur_us"].median()
    ordinary = set(dur.index[dur <= ORDINARY * float(dur.median())].tolist())
    ok = np.array([all(s + i in ordinary for i in (-1, 0, BLOCK - 1, BLOCK)) for s in starts],
                  dtype=bool)
    if ok.any():
        starts = starts[ok]
    for f in events:
        starts = starts[(starts + BLOCK <= f["first_step"]) | (starts > f["last_step"])]
    st, ca = [], []
    for b in range(steps // BLOCK):
        s0 = int(rng.choice(starts))
        m = {s0 + i: b * BLOCK + i for i in range(BLOCK)}
        x = data.steps[data.steps["step"].isin(m)].copy()
        x["step"] = x["step"].map(m)
        st.append(x)
        y = data.calls[data.calls["step"].isin(m)].copy()
        y["step"] = y["step"].map(m)
        # each block's calls after the previous ones: per-rank issue order = step order
        y["issue_us"] = y["issue_us"] + b * 1e9
        ca.append(y)
    return MonitorData(steps=pd.concat(st, ignore_index=True),
                       calls=pd.concat(ca, ignore_index=True),
                       memory=data.memory.iloc[0:0], hosts={}, notes=[])


def _plant(data, rank: int, first: int, last: int, delay_us: float):
    """``data`` with ``rank`` arriving ``delay_us`` late at every collective of steps
    ``first``..``last`` and those steps ``delay_us`` longer on every rank."""
    sel = data.steps["step"].between(first, last)
    data.steps.loc[sel, "dur_us"] += delay_us
    c = data.calls
    late = (c["rank"] == rank) & c["step"].between(first, last)
    c.loc[late, "issue_us"] += delay_us
    return data


def judge(kind: str, found: list[dict], rank: int | None, first: int, last: int,
          tol: int) -> bool:
    """Whether ``found`` (the run's findings) is right for the planted ``kind``."""
    strag = [f for f in found if f["kind"] == "straggler"]
    if kind == "clean":
        return not strag and not [f for f in found if f["kind"] == "slow_steps"]
    mine = [f for f in strag if f["rank"] == rank]
    others = [f for f in strag if f["rank"] != rank and f["steps"] > tol]
    if kind == "persistent":
        return len(mine) == 1 and mine[0]["persistent"] and not others
    return (len(mine) == 1 and abs(mine[0]["first_step"] - first) <= tol
            and abs(mine[0]["last_step"] - last) <= tol and not others)


def noise_trials(noises: list[Path], trials: int, steps: int, slow: int, share: float,
                 tol: int, seed: int) -> list[dict]:
    """``trials`` per kind, shared out in turn among the clean runs ``noises`` (each trial's
    row names its run: ``noise``, its position)."""
    from pardiag.analyzer.analyses import monitored as M
    from pardiag.analyzer.analyses.monitor_summary import finding_line

    rng = np.random.default_rng(seed)
    rows = []
    bases = []
    for i, noise in enumerate(noises):
        base = M.load_monitor(noise)
        med = float(base.steps.groupby("step")["dur_us"].median().median())
        events = [f for f in M.findings(base) if f["kind"] in ("straggler", "slow_steps")]
        bases.append((base, med, sorted(base.steps["rank"].unique()), events))
        rows.append({"kind": "noise", "noise": i, "path": str(noise), "median_ms": med / 1e3,
                     "found": [finding_line(f) for f in events]})
    for kind in KINDS:
        for t in range(trials):
            i = t % len(bases)
            base, med, ranks, events = bases[i]
            d = _resampled(base, steps, rng, events)
            rank = int(rng.choice(ranks)) if kind != "clean" else None
            first = int(rng.integers(100, steps - slow - 100)) if kind == "transient" else 0
            last = first + slow - 1 if kind == "transient" else steps - 1
            if rank is not None:
                _plant(d, rank, first, last, share * med)
            found = M.findings(d)
            rows.append({"kind": kind, "trial": t, "noise": i, "rank": rank, "first": first,
                         "last": last, "right": judge(kind, found, rank, first, last, tol),
                         "found": [finding_line(f) for f in found]})
    return rows


def real_runs(n: int, ranks: int, steps: int, slow: int, share: float, tol: int,
              seed: int) -> list[dict]:
    from pardiag.analyzer.analyses import monitored as M
    from pardiag.analyzer.analyses.monitor_summary import finding_line

    rng = np.random.default_rng(seed)
    rows = []
    step_ms = None
    for i in range(n):
        for kind in (KINDS[::-1] if i % 2 else KINDS):   # clean first: the step to plant
            rank = int(rng.integers(0, ranks)) if kind != "clean" else None
            first = int(rng.integers(100, steps - slow - 100)) if kind == "transient" else 0
            last = first + slow - 1 if kind == "transient" else steps - 1
            args = ["--steps", str(steps)]
            if rank is not None:
                args += ["--slow-rank", str(rank), "--slow-ms", f"{share * (step_ms or 20.0):.3f}",
                         "--slow-from", str(first), "--slow-until", str(last + 1)]
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "run"
                res = subprocess.run(
                    [sys.executable, "-m", "pardiag", "profile", "--nproc-per-node", str(ranks),
                     "--pin-cpu", "--monitor", "--out", str(out),
                     str(REPO / "examples" / "train_ddp.py"), "--", *args],
                    capture_output=True, text=True, cwd=REPO)
                if res.returncode != 0:
                    raise RuntimeError(res.stderr[-2000:])
                data = M.load_monitor(out)
            if kind == "clean" and step_ms is None:
                step_ms = float(data.steps.groupby("step")["dur_us"].median().median()) / 1e3
            found = M.findings(data)
            rows.append({"kind": kind, "trial": i, "rank": rank, "first": first, "last": last,
                         "right": judge(kind, found, rank, first, last, tol),
                         "found": [finding_line(f) for f in found]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def record_clean(out: Path, ranks: int, steps: int) -> Path:
    """A clean monitored run of ``examples/train_ddp.py`` (``ranks`` pinned ranks) into
    ``out``: the noise the trials resample."""
    res = subprocess.run(
        [sys.executable, "-m", "pardiag", "profile", "--nproc-per-node", str(ranks),
         "--pin-cpu", "--monitor", "--out", str(out), str(REPO / "examples" / "train_ddp.py"),
         "--", "--steps", str(steps)], capture_output=True, text=True, cwd=REPO)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--noise", type=Path, action="append",
                    help="a clean monitored run whose noise is resampled (once per run)")
    ap.add_argument("--record", type=int, default=1,
                    help="clean runs to record as the noise when no --noise is given")
    ap.add_argument("--real", type=int, default=0, help="real runs per kind instead")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--slow-steps", type=int, default=200)
    ap.add_argument("--share", type=float, default=0.3, help="the slow rank's delay / step")
    ap.add_argument("--tolerance", type=int, default=10, help="steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    info, t0 = machine(), time.time()
    tmp = tempfile.TemporaryDirectory()
    if not a.noise and not a.real:   # the noise of this machine, recorded now
        a.noise = [record_clean(Path(tmp.name) / f"clean{i}", a.ranks, a.steps)
                   for i in range(a.record)]
    if a.real:
        rows = real_runs(a.real, a.ranks, a.steps, a.slow_steps, a.share, a.tolerance, a.seed)
        how = (f"{a.real} real runs per kind (examples/train_ddp.py, {a.ranks} ranks pinned, "
               f"pardiag profile --monitor)")
    else:
        rows = noise_trials(a.noise, a.trials, a.steps, a.slow_steps, a.share, a.tolerance,
                            a.seed)
        how = (f"{a.trials} trials per kind on the noise of {len(a.noise)} clean monitored "
               f"run(s) in turn ({a.ranks} ranks, recorded on this machine unless --noise "
               f"names them) resampled in blocks of {BLOCK} steps")
    info = finish(info)
    cmd = "python -m benchmarks.monitor_detection " + " ".join(argv or sys.argv[1:])
    lines = [f"# Monitor detection ({time.strftime('%Y-%m-%d', time.gmtime())})", "",
             f"- **Command:** `{cmd}`", f"- **Machine:** {describe(info)}",
             f"- **Repetitions:** {how}; {a.steps} steps, a slow rank {a.share:.0%} of the "
             f"median step late for {a.slow_steps} steps (transient) or every step "
             f"(persistent); right within {a.tolerance} steps ({time.time() - t0:.0f} s)", "",
             "| kind | runs | right | goal |", "|---|---:|---:|---|"]
    for kind in KINDS:
        got = [r for r in rows if r["kind"] == kind]
        ok = sum(r["right"] for r in got)
        verdict = ("too few runs to judge" if len(got) < 50
                   else "met" if ok >= 0.98 * len(got) else "NOT met")
        lines.append(f"| {kind} | {len(got)} | {ok} | {verdict} (>= 49 of 50) |")
    noise = [r for r in rows if r["kind"] == "noise"]
    if noise:
        lines += ["", "Per clean run (right of the trials on its noise, by kind; its median "
                  "step; its own findings: real slow periods of this machine, whose blocks "
                  "are left out of the noise):", "",
                  "| run | median step ms | transient | persistent | clean | its own findings |",
                  "|---|---:|---:|---:|---:|---|"]
        for n in noise:
            cells = []
            for kind in KINDS:
                got = [r for r in rows if r["kind"] == kind and r.get("noise") == n["noise"]]
                cells.append(f"{sum(r['right'] for r in got)}/{len(got)}")
            lines.append(f"| {n['noise']} | {n['median_ms']:.1f} | " + " | ".join(cells)
                         + " | " + ("; ".join(n["found"]) or "none") + " |")
    lines += ["", "Wrong runs (kind, trial, planted rank and steps, what was found):"]
    wrong = [r for r in rows if not r.get("right", True)]
    lines += [f"- {r['kind']} #{r['trial']}"
              + (f" (run {r['noise']})" if "noise" in r else "")
              + f": rank {r['rank']} steps {r['first']}–{r['last']}: "
              + ("; ".join(r["found"]) or "nothing found") for r in wrong] or ["- none"]
    emit("\n".join(lines), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
