"""The cross-rank critical path on every sample run, every real trace and planted generated jobs.

    .venv/bin/python benchmarks/critical_path_check.py [--work /tmp/pardiag-cp]

Per input: the profiled steps, the path's length against the measured step (median over steps
of path / step), the unchanged replay's largest error (% of the step), the path's largest part,
and the time the path adds to the report (``compute_critical_path`` alone, and the whole
``analyze`` it is part of). Planted jobs (``multirank_gen``, true time known): DDP over 4 GPU
ranks with one rank's compute 900 µs longer; a 4-stage 1F1B pipeline with one stage's rank
slower; tensor parallelism over 4 hosts in lockstep. The slow-rank jobs are judged on whether
the planted rank computes most of the path in every step and has no slack (the rank whose step
ends last has none either: the path ends there); the lockstep job on whether the path's
communication share is the ranks' exposed share to within 1 point.
Not a test: it prints a table and asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _row(name: str, folder: Path) -> dict:
    from pardiag.analyzer.analyses.critical_path import compute_critical_path
    from pardiag.api import analyze

    t0 = time.perf_counter()
    rep = analyze(folder, cache=False)
    t1 = time.perf_counter()
    cp = compute_critical_path(rep.traces, rep.time_breakdown, rep.sync, rep.layout)
    t2 = time.perf_counter()
    if cp.steps.empty:
        return {"input": name, "steps": 0, "note": cp.why_none}
    st = cp.steps
    top = cp.shares.iloc[0]
    part = (f"{top['dim']} communication" if top["part"] == "communication"
            else f"rank {int(top['rank'])} {top['part']}")
    return {"input": name, "steps": len(st),
            "path_over_step": statistics.median(st["path_us"] / st["measured_us"]),
            "replay_err_pct": float(st["replay_error_pct"].abs().max()),
            "top": f"{part} {top['share_pct']:.0f}%", "path_s": t2 - t1, "report_s": t1 - t0,
            "cp": cp}


def planted(work: Path) -> list[tuple[str, Path, int]]:
    """``(name, folder, planted rank)`` of the generated jobs."""
    from benchmarks.multirank_gen import Job, generate

    jobs = {
        "ddp, rank 2 slower by 900 µs": (Job(mesh={"dp": 4}, schedule="ddp", steps=6,
                                             ranks_per_host=4, slow_ranks={2: 900.0},
                                             metadata="seq", seed=1), 2),
        "1f1b 4 stages, rank 1 slower": (Job(mesh={"pp": 4}, schedule="pp_1f1b", steps=4,
                                             microbatches=8, ranks_per_host=4,
                                             slow_ranks={1: 400.0}, metadata="seq", seed=2), 1),
    }
    jobs["tp over 4 hosts, lockstep"] = (Job(mesh={"tp": 4}, schedule="tp", steps=4,
                                             ranks_per_host=1, metadata="seq", seed=3), None)
    out = []
    for name, (job, rank) in jobs.items():
        folder = work / name.split(",")[0].replace(" ", "_")
        if not folder.exists():
            generate(job, folder)
        out.append((name, folder, rank))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/pardiag-cp"))
    args = ap.parse_args()
    from _machine import describe, finish, machine

    info = machine()
    rows = []
    for root, tag in ((REPO / "sample_traces", "sample"),
                      (REPO.parent / "shared" / "real_traces", "real")):
        if root.is_dir():
            rows += [_row(f"{tag}: {p.name}", p) for p in sorted(root.iterdir()) if p.is_dir()]
    judged, lockstep = [], []
    for name, folder, rank in planted(args.work):
        row = _row(f"planted: {name}", folder)
        cp = row.pop("cp", None)
        if cp is not None and rank is None:
            # in lockstep every rank waits alike: the path's communication share is the ranks'
            # share of exposed communication
            from pardiag.api import analyze

            tot = analyze(folder, cache=False).time_breakdown.totals
            exposed = 100.0 * tot["exposed_comm_us"].sum() / tot["span_us"].sum()
            comm = cp.shares.loc[cp.shares["part"] == "communication", "share_pct"].sum()
            lockstep.append((name, comm, exposed, abs(comm - exposed) <= 1.0))
        elif cp is not None:
            work = cp.segments[cp.segments["kind"] == "work"]
            per_step = work.groupby("step").apply(
                lambda g: g.groupby("rank")["compute_us"].sum().idxmax())
            slack = dict(zip(cp.slack["rank"], cp.slack["slack_us"]))
            ok = bool((per_step == rank).all()) and slack[rank] == 0.0
            others = ", ".join(f"{r}: {v:.0f}" for r, v in sorted(slack.items()) if r != rank)
            judged.append((name, int((per_step == rank).sum()), len(per_step), slack[rank],
                           others, ok))
        rows.append(row)
    print(describe(finish(info)))
    print("| input | steps | path / step (median) | replay error, max % | largest part | path s "
          "| report s |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for r in rows:
        if not r["steps"]:
            print(f"| {r['input']} | 0 | – | – | {r['note']} | – | – |")
            continue
        print(f"| {r['input']} | {r['steps']} | {r['path_over_step']:.3f} | "
              f"{r['replay_err_pct']:.3f} | {r['top']} | {r['path_s']:.3f} | "
              f"{r['report_s']:.2f} |")
    print()
    print("| planted job | steps whose path computes most on the planted rank | its slack µs | "
          "the others' slack µs | judged |")
    print("|---|---:|---:|---|---|")
    for name, hit, n, slack, others, ok in judged:
        print(f"| {name} | {hit} of {n} | {slack:.1f} | {others} | "
              f"{'right' if ok else 'wrong'} |")
    if lockstep:
        print()
        print("| planted job | path's communication % | ranks' exposed communication % | "
              "judged (within 1 point) |")
        print("|---|---:|---:|---|")
        for name, comm, exposed, ok in lockstep:
            print(f"| {name} | {comm:.1f} | {exposed:.1f} | {'right' if ok else 'wrong'} |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "benchmarks"))
    sys.exit(main())
