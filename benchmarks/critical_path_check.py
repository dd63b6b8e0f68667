"""The cross-rank critical path on every sample run, every real trace and planted generated jobs.

    .venv/bin/python benchmarks/critical_path_check.py [--work /tmp/pardiag-cp]

Per input: the profiled steps, the path's length against the measured step (median over steps
of path / step), the unchanged replay's largest error (% of the step), the path's largest part,
and the time the path adds to the report (``compute_critical_path`` alone, and the whole
``analyze`` it is part of). Planted jobs (``multirank_gen``, true time known, true path
written by the generator from its own dependencies): DDP over 4 GPU ranks with one rank's
compute 900 µs longer; a 4-stage 1F1B pipeline with one stage's rank slower; tensor parallelism
over 4 hosts in lockstep (communication-bound); DDP with one input-bound rank (its DataLoader
3 ms per step); and shapes whose dependencies are subtle (:func:`shapes`). Each is judged on
its shares against the true path's (every part within 1 point) and, where a rank was planted,
on whether that rank computes most of the path in every step and has no slack (the rank whose
step ends last has none either: the path ends there). Then random jobs of every kind of the
generator, with group metadata and without (:func:`sweep`; ``--no-sweep`` skips them), judged
the same way. Not a test: it prints tables and asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import shutil
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


def shares_against_truth(truth_path: dict, shares, mesh: dict, world: int | None = None) -> dict:
    """The path's shares (:attr:`CriticalPathResult.shares`) against the generator's true path
    (``Truth.path``) of a job over ``mesh`` (``world`` ranks in all: more than the mesh's
    size when the job runs independent replicas of it).

    Parts are compared per rank, or summed over ranks where the true path passes a tie (two
    ranks' arrivals, or step ends, within ``TIE_US``: either path is true, and the ranks they
    credit differ). pardiag names a group of every rank ``world`` when the traces do not say
    which dimension it is; the true dimension whose group is every rank is compared under that
    name. Where pardiag calls some communication's group ``other`` (the traces do not name
    it: no group metadata), communication is compared summed over dimensions.

    Returns:
        ``{"by_rank": bool, "by_dim": bool, "max_diff": percentage points, "diffs": {(part,
        rank | dim | None): pardiag − truth}}``.
    """
    world = world or math.prod(mesh.values())
    whole = {d for d, n in mesh.items() if n == world}
    by_rank = not any(s["ties"] for s in truth_path["steps"])
    true_dims = {s["dim"] for s in truth_path["shares"] if s["part"] == "communication"}
    by_dim = "other" in true_dims or not (
        shares["part"].eq("communication") & shares["dim"].eq("other")).any()

    def key(part, rank, dim):
        if part == "communication":
            return part, ("world" if dim in whole else str(dim)) if by_dim else None
        return part, int(rank) if by_rank else None

    true: dict = {}
    ours: dict = {}
    for s in truth_path["shares"]:
        k = key(s["part"], s["rank"], s["dim"])
        true[k] = true.get(k, 0.0) + s["share_pct"]
    for r in shares.itertuples(index=False):
        k = key(r.part, r.rank, r.dim)
        ours[k] = ours.get(k, 0.0) + float(r.share_pct)
    diffs = {k: ours.get(k, 0.0) - true.get(k, 0.0) for k in set(true) | set(ours)}
    return {"by_rank": by_rank, "by_dim": by_dim, "diffs": diffs,
            "max_diff": max((abs(v) for v in diffs.values()), default=0.0)}


def planted(work: Path) -> list[tuple[str, Path, int | None, object]]:
    """``(name, folder, planted rank, job)`` of the generated jobs."""
    from benchmarks.multirank_gen import Job

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
    jobs["ddp, rank 1 input-bound (3 ms DataLoader)"] = (
        Job(mesh={"dp": 4}, schedule="ddp", steps=6, ranks_per_host=4,
            data_loading_us={1: 3000.0}, metadata="seq", seed=4), None)
    return [(name, work / name.split(",")[0].replace(" ", "_") / str(i), rank, job)
            for i, (name, (job, rank)) in enumerate(jobs.items())]


def shapes(work: Path) -> list[tuple[str, Path, None, object]]:
    """``(name, folder, None, job)`` of generated shapes whose dependencies are subtle: DDP's
    buckets in one coalesced block (its members' kernels back to back), rooted broadcasts at
    each step's start that the computation does not wait for (it waits for its launch), FSDP
    with a late-starting rank and jitter (computation launched just after an all-gather ends)."""
    from benchmarks.multirank_gen import Job

    jobs = {
        "ddp, buckets in one coalesced block": Job(
            mesh={"dp": 4}, schedule="ddp", steps=5, metadata="seq", seed=531748801,
            coalesced=True),
        "ddp, rooted broadcasts before each step": Job(
            mesh={"dp": 8}, schedule="ddp", steps=4, metadata="seq", seed=348543442,
            broadcasts_per_step=2),
        "fsdp, a rank starting late, jitter": Job(
            mesh={"fsdp": 4}, schedule="fsdp", steps=5, metadata="seq", seed=305909225,
            start_skew_us={3: 8512.0}, jitter_us=2.0),
    }
    return [(name, work / "shape" / str(i), None, job)
            for i, (name, job) in enumerate(jobs.items())]


def sweep(work: Path, seeds=(7, 11, 23), metadata=("seq", "none")) -> list[dict]:
    """Random jobs of every kind of the generator (``random_job``), per seed and metadata
    level, against their true paths: one row each (``kind``, ``metadata``, ``job``, ``by_rank``,
    ``by_dim``, ``max_diff`` points, ``worst`` part), or ``error``."""
    import random

    from benchmarks.multirank_gen import KINDS, generate, random_job
    from pardiag.api import analyze

    out = []
    for seed in seeds:
        rng = random.Random(seed)
        for kind in KINDS:
            for md in metadata:
                job = random_job(rng, kind, md)
                folder = work / "sweep" / f"{seed}_{kind}_{md}"
                shutil.rmtree(folder, ignore_errors=True)
                row = {"seed": seed, "kind": kind, "metadata": md,
                       "job": f"{job.schedule} {job.mesh}"}
                try:
                    truth = generate(job, folder)
                    rep = analyze(folder, cache=False, comm_kernels=[truth.comm_kernel_regex]
                                  if truth.comm_kernel_regex else ())
                    cp = rep.critical_path
                    if cp.steps.empty:
                        raise ValueError(cp.why_none)
                    row.update(shares_against_truth(truth.path, cp.shares, job.mesh,
                                                    truth.world))
                    k, v = max(row.pop("diffs").items(), key=lambda kv: abs(kv[1]))
                    row["worst"] = f"{k[0]} {k[1]} {v:+.2f}"
                except Exception as e:  # noqa: BLE001 - a row that says what failed
                    row["error"] = f"{type(e).__name__}: {e}"[:100]
                shutil.rmtree(folder, ignore_errors=True)
                out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/pardiag-cp"))
    ap.add_argument("--no-sweep", action="store_true", help="skip the random jobs' table")
    args = ap.parse_args()
    from _machine import describe, finish, machine

    info = machine()
    rows = []
    for root, tag in ((REPO / "sample_traces", "sample"),
                      (REPO.parent / "shared" / "real_traces", "real")):
        if root.is_dir():
            rows += [_row(f"{tag}: {p.name}", p) for p in sorted(root.iterdir()) if p.is_dir()]
    judged, truths = _planted(args.work, rows)
    swept = [] if args.no_sweep else sweep(args.work)
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
    print()
    print("| generated job | true path µs (median of steps) | pardiag's path µs | "
          "largest true parts | "
          "compared | largest difference, points | judged (within 1 point) |")
    print("|---|---:|---:|---|---|---:|---|")
    for name, tp, cp, cmp in truths:
        top = ", ".join(_part(s) for s in tp["shares"][:3])
        print(f"| {name} | {statistics.median(s['path_us'] for s in tp['steps']):.0f} | "
              f"{cp.steps['path_us'].median():.0f} | {top} | {_mode(cmp)} | "
              f"{cmp['max_diff']:.2f} | {'right' if cmp['max_diff'] <= 1.0 else 'wrong'} |")
    if swept:
        _print_sweep(swept)
    return 0


def _planted(work: Path, rows: list) -> tuple[list, list]:
    """The planted jobs and the shapes: rows of the inputs' table, the planted ranks' judgement
    and each job's comparison with its true path."""
    from benchmarks.multirank_gen import generate

    judged, truths = [], []
    for name, folder, rank, job in planted(work) + shapes(work):
        shutil.rmtree(folder, ignore_errors=True)
        truth = generate(job, folder)
        row = _row(f"generated: {name}", folder)
        cp = row.pop("cp", None)
        if cp is not None:
            truths.append((name, truth.path, cp, shares_against_truth(
                truth.path, cp.shares, job.mesh, truth.world)))
        if cp is not None and rank is not None:
            work_segs = cp.segments[cp.segments["kind"] == "work"]
            per_step = work_segs.groupby("step").apply(
                lambda g: g.groupby("rank")["compute_us"].sum().idxmax())
            slack = dict(zip(cp.slack["rank"], cp.slack["slack_us"]))
            ok = bool((per_step == rank).all()) and slack[rank] == 0.0
            others = ", ".join(f"{r}: {v:.0f}" for r, v in sorted(slack.items()) if r != rank)
            judged.append((name, int((per_step == rank).sum()), len(per_step), slack[rank],
                           others, ok))
        rows.append(row)
    return judged, truths


def _mode(cmp: dict) -> str:
    return (("per rank" if cmp["by_rank"] else "summed over ranks (a tie)")
            + ("" if cmp.get("by_dim", True) else ", communication summed (groups unnamed)"))


def _print_sweep(swept: list[dict]) -> None:
    print()
    print("| seed | kind | metadata | job | compared | largest difference, points | "
          "where | judged |")
    print("|---:|---|---|---|---|---:|---|---|")
    for r in swept:
        if "error" in r:
            print(f"| {r['seed']} | {r['kind']} | {r['metadata']} | {r['job']} | – | – | "
                  f"{r['error']} | no path |")
            continue
        print(f"| {r['seed']} | {r['kind']} | {r['metadata']} | {r['job']} | {_mode(r)} | "
              f"{r['max_diff']:.2f} | {r['worst']} | "
              f"{'right' if r['max_diff'] <= 1.0 else 'wrong'} |")
    print()
    print("| metadata | jobs | within 1 point | within 5 points | median difference | worst |")
    print("|---|---:|---:|---:|---:|---:|")
    for md in sorted({r["metadata"] for r in swept}, key=["seq", "names", "records",
                                                           "none"].index):
        d = [r["max_diff"] for r in swept if r["metadata"] == md and "error" not in r]
        n = sum(1 for r in swept if r["metadata"] == md)
        print(f"| {md} | {n} | {sum(x <= 1.0 for x in d)} | {sum(x <= 5.0 for x in d)} | "
              f"{statistics.median(d):.2f} | {max(d):.2f} |")


def _part(s: dict) -> str:
    what = f"{s['dim']} communication" if s["part"] == "communication" else \
        f"rank {s['rank']} {s['part']}"
    return f"{what} {s['share_pct']:.1f}%"


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "benchmarks"))
    sys.exit(main())
