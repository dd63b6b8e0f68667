"""Do identical runs get the same diagnosis? (a benchmark, not a CI test).

For each case, ``--repeat`` identical ``pardiag profile`` runs, with and without ``--pin-cpu``
(each rank on its own cores), each reported in-process. Per run it keeps:

* the **top tier**: the kinds of the recommendations of tier 1 (within the run's noise of each
  other, :mod:`pardiag.analyzer.predict.recommend.policy`), or ``nothing`` when nothing is
  recommended;
* the **straggler** the verdict names (or none): :func:`pardiag.analyzer.predict.recommend.findings.
  identify_straggler`;
* the first-listed recommendation's kind, and the step's noise the tiers used (% of the step).

and reports how many of the runs agree with the most common answer. Goal: ≥ 4 of 5 for every
case, pinned and unpinned.

Straggler mode (``--stragglers``): per strategy, ``--repeat`` runs with a planted per-step
sleep on one rank (``--slow-rank 1 --slow-ms MS``) and ``--repeat`` without; counts the runs
whose verdict names the planted rank, and the unplanted runs that name nobody. Goal: ≥ 9 of 10.

    .venv/bin/python benchmarks/stability.py                      # 5 cases × 5 runs × 2
    .venv/bin/python benchmarks/stability.py --stragglers --repeat 10
    .venv/bin/python benchmarks/stability.py ddp fsdp2 --repeat 3 --json out.json
    .venv/bin/python benchmarks/stability.py --steps 24     # 17 unprofiled step periods, not 5

Every run is a real 2-rank CPU/gloo job (about 10–30 s each on 2 cores).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import describe, finish, load_average, machine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
STEPS = 12

#: name: (script, ranks, args) — the issue's five cases
CASES = {
    "ddp": ("train_ddp.py", 2, []),
    "zero1": ("train_zero1.py", 2, []),
    "fsdp2": ("train_fsdp2.py", 2, []),
    "pp_unbalanced": ("train_pp.py", 2, ["--schedule", "1f1b", "--microbatches", "4",
                                         "--layers-per-stage", "1,9", "--batch", "256"]),
    "pp_gpipe_m2": ("train_pp.py", 2, ["--schedule", "gpipe", "--microbatches", "2",
                                       "--batch", "1024", "--width", "512", "--layers", "2"]),
}
#: strategies of the straggler benchmark: (script, ranks, args)
STRAGGLER_CASES = {
    "ddp": ("train_ddp.py", 2, []),
    "fsdp2": ("train_fsdp2.py", 2, []),
    "zero1": ("train_zero1.py", 2, []),
    "tp": ("train_tp.py", 2, []),
    "1f1b": ("train_pp.py", 2, ["--schedule", "1f1b", "--microbatches", "4"]),
}


def run_once(script: str, n: int, args: list[str], pin: bool, tmp: Path, tag: str,
             steps: int = STEPS) -> dict:
    """Profile one run of ``steps`` optimizer steps and report it: ``{"top_tier": [...],
    "straggler": rank | None, "lead": kind, "verdict": str, "step_ms": float, "noise_pct":
    float, "gains": {kind: %}}``. lead: the first-listed recommendation's kind, or "nothing";
    gains: each evaluated kind's best predicted gain (% of the step); step_ms and
    noise_pct: the step the recommendations are measured against and its noise (% of it), the
    margin the noise rule and the tiers used (None without a step)."""
    from pardiag.analyzer.predict.recommend import build_context
    from pardiag.analyzer.predict.recommend.findings import identify_straggler
    from pardiag.analyzer.report.registry import build_report
    from pardiag.analyzer.trace import load_traces

    out = tmp / tag
    cmd = [sys.executable, "-m", "pardiag", "profile", str(EXAMPLES / script),
           "--nproc-per-node", str(n), "--out", str(out),
           *(["--pin-cpu"] if pin else []), "--", "--steps", str(steps), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    if res.returncode != 0:
        raise SystemExit(f"{tag}: profile failed:\n{res.stderr[-2000:]}")
    rep = build_report(load_traces(out))
    rec = rep.recommendations
    found = identify_straggler(build_context(rep.traces, rep.results))
    top = sorted({c.kind for c in rec.top_tier}) or ["nothing"]
    gains: dict[str, float] = {}   # each kind's best predicted gain (% of the step)
    for c in (*rec.recommendations, *rec.rejected):
        if not c.ruled_out and math.isfinite(c.gain_pct):
            gains[c.kind] = max(gains.get(c.kind, -math.inf), round(c.gain_pct, 1))
    step = rec.step.median_us if rec.step is not None else None
    return {"top_tier": top, "straggler": None if found is None else found.rank,
            "lead": rec.recommendations[0].kind if rec.recommendations else "nothing",
            "load_1m": (load_average() or [None])[0],
            "verdict": rec.verdict, "step_ms": step / 1e3 if step else None, "gains": gains,
            "noise_pct": round(100 * rec.noise_us / step, 1)
            if step and math.isfinite(rec.noise_us) else None}


def agreement(answers: list) -> tuple[str, int]:
    """The most common answer (as text) and how many runs gave it."""
    counts = collections.Counter(json.dumps(a, sort_keys=True) for a in answers)
    text, k = counts.most_common(1)[0]
    return text, k


def goal_chance(k: int, n: int, goal: int = 4, of: int = 5) -> dict:
    """How often one run gives the most common answer (``k`` of ``n`` runs), with its 95%
    Wilson interval (Wilson 1927; :func:`scipy.stats.binomtest`), and the chance that ``of``
    fresh runs give it at least ``goal`` times — the issue's goal (≥ 4 of 5) is itself a
    sample of 5 — at the rate and at the interval's ends (binomial, runs independent).

    Returns ``{"rate", "rate_low", "rate_high", "goal_chance", "goal_chance_low",
    "goal_chance_high"}`` (fractions, 0–1)."""
    from scipy import stats

    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")

    def chance(p: float) -> float:
        return float(stats.binom.sf(goal - 1, of, p))

    return {"rate": k / n, "rate_low": float(ci.low), "rate_high": float(ci.high),
            "goal_chance": chance(k / n), "goal_chance_low": chance(float(ci.low)),
            "goal_chance_high": chance(float(ci.high))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cases", nargs="*", help="cases to run (default: all)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--stragglers", action="store_true", help="the straggler benchmark")
    ap.add_argument("--slow-ms", type=float, nargs="+", default=[20.0, 30.0])
    ap.add_argument("--pin", choices=["both", "pinned", "unpinned"], default="both")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=STEPS,
                    help=f"optimizer steps per run (default {STEPS}: 5 unprofiled step periods "
                    "after the profiler's window)")
    a = ap.parse_args()
    table = STRAGGLER_CASES if a.stragglers else CASES
    names = a.cases or list(table)
    pins = {"both": [False, True], "pinned": [True], "unpinned": [False]}[a.pin]
    rows = []
    started = time.time()
    info = machine()
    print(f"machine: {describe(info)}", flush=True)
    loads: list[float] = []   # the 1-minute load average after each run
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)

        def repeat(script: str, n: int, args: list[str], pin: bool, tag: str) -> list[dict]:
            """``a.repeat`` runs of one configuration; their loads go to ``loads``."""
            runs = [run_once(script, n, args, pin, tmp, f"{tag}-{i}", a.steps)
                    for i in range(a.repeat)]
            loads.extend(r["load_1m"] for r in runs if r["load_1m"] is not None)
            return runs

        for name in names:
            script, n, args = table[name]
            for pin in pins:
                p = "pinned" if pin else "unpinned"
                if not a.stragglers:
                    runs = repeat(script, n, args, pin, f"{name}-{p}")
                    answer, k = agreement([r["top_tier"] for r in runs])
                    odds = goal_chance(k, len(runs))
                    rows.append({"case": name, "pin": p, "runs": len(runs), "same_top": k,
                                 "top_tier": answer, "tops": [r["top_tier"] for r in runs],
                                 "stragglers": [r["straggler"] for r in runs],
                                 "noise_pct": [r["noise_pct"] for r in runs],
                                 "leads": [r["lead"] for r in runs],
                                 "gains": [r["gains"] for r in runs], **odds})
                    print(f"{name:14s} {p:8s} top tier {answer} in {k}/{len(runs)} (per run "
                          f"{odds['rate']:.2f}, 95% {odds['rate_low']:.2f}–"
                          f"{odds['rate_high']:.2f}; 5 runs give it ≥ 4 times with chance "
                          f"{odds['goal_chance']:.2f}, {odds['goal_chance_low']:.2f}–"
                          f"{odds['goal_chance_high']:.2f}); "
                          f"stragglers named {[r['straggler'] for r in runs]}; first listed "
                          f"{[r['lead'] for r in runs]}; noise % "
                          f"{[r['noise_pct'] for r in runs]}", flush=True)
                    continue
                for ms in a.slow_ms:
                    planted = repeat(script, n, [*args, "--slow-rank", "1", "--slow-ms",
                                                 f"{ms:g}"], pin, f"{name}-{p}-slow{ms:g}")
                    named = sum(r["straggler"] == 1 for r in planted)
                    rows.append({"case": name, "pin": p, "slow_ms": ms, "runs": len(planted),
                                 "named_planted": named,
                                 "named": [r["straggler"] for r in planted]})
                    print(f"{name:6s} {p:8s} sleep {ms:g} ms: rank 1 named in "
                          f"{named}/{len(planted)}", flush=True)
                clean = repeat(script, n, args, pin, f"{name}-{p}-clean")
                nobody = sum(r["straggler"] is None for r in clean)
                rows.append({"case": name, "pin": p, "slow_ms": 0, "runs": len(clean),
                             "named_nobody": nobody, "named": [r["straggler"] for r in clean]})
                print(f"{name:6s} {p:8s} no sleep: nobody named in {nobody}/{len(clean)}",
                      flush=True)
    info = finish(info)
    meta = {"machine": info, "date": time.strftime("%Y-%m-%d"),
            "minutes": round((time.time() - started) / 60, 1), "repeat": a.repeat,
            "steps": a.steps,
            # how loaded the machine was while the runs ran (1-minute load after each run)
            "load_1m_after_runs": ({"median": statistics.median(loads), "min": min(loads),
                                    "max": max(loads)} if loads else None)}
    print(f"machine: {describe(info)}")
    print(json.dumps(meta))
    if a.json:
        a.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
