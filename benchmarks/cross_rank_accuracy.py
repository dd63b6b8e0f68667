"""How often the cross-rank conclusions are right on traces whose truth is known.

Draws random jobs from the ground-truth generator (:mod:`benchmarks.multirank_gen`: every kind ×
metadata level), analyses each with pardiag in-process and judges, per job:

* ``straggler``: the report's ``sync.straggler`` is the planted slow rank, or None when nobody
  was planted (profiler-start skew, clock offsets and drift are never a straggler);
* ``offsets``: every rank's ``clock_offsets[].offset_us`` (relative to rank 0) within
  :data:`OFFSET_TOL_US` of the truth — judged only where a clock differs (other hosts), since
  ranks of one host share one clock;
* ``layout``: ``layout.dims`` (degree > 1; FSDP's shard and replicate dims multiply into dp)
  equal the mesh, judged on meshes of two or more dimensions whose process groups the traces
  list (metadata ``seq`` and ``names``: ``pg_config``), whatever their descriptions say
  (DeviceMesh/torchtitan ``mesh_*``, Megatron-LM's names, plain names, DeepSpeed's
  ``undefined``). Elsewhere (one dimension; ``none``: no group is listed; ``records``: a
  pardiag run keeps the layout its collector recorded and the generated run.json carries
  none) every degree the report states must be the mesh's: unknown, never wrong; and no
  pipeline (section or layout) where none ran; a dim whose role the traces cannot tell
  (``Truth.unknown``: all-to-alls no evidence places) must not be stated at all;
* ``counts``: every rank's issued-op count per collective type equals the truth.

Usage::

    python -m benchmarks.cross_rank_accuracy --jobs 1000 --seed 0 [--out FILE.md]

prints one row per kind and metadata level (share right of each judged metric) and the jobs that
failed (kind, metadata, seed: each can be rerun with ``--only KIND:META:SEED``).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks._machine import describe, emit, finish, machine
from benchmarks.multirank_gen import KINDS, METADATA, Truth, generate, random_job

#: Offsets are right within this (µs), the cross-rank model's goal.
OFFSET_TOL_US = 20.0
METRICS = ("straggler", "offsets", "layout", "counts")


def analyse(folder: Path, truth: Truth) -> dict:
    """pardiag's JSON report of a generated job (in-process, no cache)."""
    from pardiag.analyzer.report.registry import AnalysisOptions, build_report, report_json
    from pardiag.analyzer.trace import load_traces

    pats = (re.compile(truth.comm_kernel_regex),) if truth.comm_kernel_regex else ()
    traces = load_traces(folder, cache=False)
    return report_json(build_report(traces, AnalysisOptions(comm_patterns=pats)))


def judge(truth: Truth, doc: dict, metadata: str) -> dict[str, bool | None]:
    """``{metric: right?}`` for one job (None: not judged for this job); see the module."""
    sync = doc.get("sync") or {}
    out: dict[str, bool | None] = {"straggler": sync.get("straggler") == truth.straggler
                                   if truth.straggler_judged else None}
    offs = {int(o["rank"]): float(o.get("offset_us") or 0.0)
            for o in sync.get("clock_offsets") or []}
    hosts = set(truth.hosts.values())
    if len(hosts) > 1:
        base = offs.get(0, 0.0)
        out["offsets"] = all(abs(offs.get(r, 0.0) - base - v) <= OFFSET_TOL_US
                             for r, v in truth.offset_us.items())
    else:
        out["offsets"] = None
    want: dict[str, int] = {}
    for k, v in truth.layout.items():
        if v != 1:
            d = "dp" if k == "fsdp" else k
            want[d] = want.get(d, 1) * v
    got = {k: v for k, v in ((doc.get("layout") or {}).get("dims") or {}).items() if v != 1}
    if metadata in ("seq", "names") and len(want) > 1:
        out["layout"] = got == want
    elif got and want:   # where the layout is not judged, what it states must still be right
        out["layout"] = all(want.get(k) == v for k, v in got.items())
    else:
        out["layout"] = None
    if truth.unknown:   # nothing that cannot be told may be stated; the rest must be right
        out["layout"] = (not set(got) & set(truth.unknown)
                         and all(want.get(k) == v for k, v in got.items()))
    if "pp" not in want and want and (doc.get("pipeline") or (doc.get("layout") or {}).get(
            "pipeline")):
        out["layout"] = False   # a pipeline where none ran (ring attention's send/recv)
    counts_ok = True
    for r in doc.get("ranks") or []:
        got = {c["collective"]: c["count"] for c in r.get("collectives") or []}
        want = truth.counts.get(int(r["rank"]), {})
        if any(got.get(op, 0) != n for op, n in want.items() if n):
            counts_ok = False
    out["counts"] = counts_ok
    return out


def run_one(kind: str, metadata: str, seed: int) -> tuple[dict, Truth]:
    """Generate and judge one job (:func:`judge`)."""
    job = random_job(random.Random(seed), kind=kind, metadata=metadata)
    with tempfile.TemporaryDirectory() as tmp:
        truth = generate(job, tmp)
        return judge(truth, analyse(Path(tmp), truth), metadata), truth


def _table(results: dict) -> list[str]:
    lines = ["| kind | metadata | jobs | " + " | ".join(METRICS) + " |",
             "|---|---|---|" + "---|" * len(METRICS)]
    for (kind, meta), rows in sorted(results.items()):
        cells = []
        for m in METRICS:
            judged = [r[m] for r in rows if r.get(m) is not None]
            cells.append(f"{sum(judged)}/{len(judged)}" if judged else "–")
        lines.append(f"| {kind} | {meta} | {len(rows)} | " + " | ".join(cells) + " |")
    tot = []
    for m in METRICS:
        judged = [r[m] for rows in results.values() for r in rows if r.get(m) is not None]
        tot.append(f"{100 * sum(judged) / len(judged):.1f}% ({sum(judged)}/{len(judged)})"
                   if judged else "–")
    lines.append("| **all** | | " + str(sum(len(v) for v in results.values())) + " | "
                 + " | ".join(tot) + " |")
    return lines


GOALS = {"straggler": 0.99, "offsets": 0.99, "layout": 1.0, "counts": 1.0}


def _shortfalls(results: dict) -> list[str]:
    """One line per metric below its goal (:data:`GOALS`), naming the kinds that miss."""
    out = []
    for m, goal in GOALS.items():
        judged = [(k, r[m]) for k, rows in results.items() for r in rows
                  if r.get(m) is not None]
        if not judged:
            continue
        share = sum(ok for _, ok in judged) / len(judged)
        missed = sorted({f"{k[0]}:{k[1]}" for k, ok in judged if not ok})
        verdict = "met" if share >= goal else "NOT met"
        out.append(f"- {m}: {100 * share:.1f}% against a goal of {100 * goal:g}%: {verdict}"
                   + (f"; wrong on {', '.join(missed)}" if missed else ""))
    return out


def _commit() -> str:
    """The checkout's commit (short hash), or "unknown"."""
    import subprocess
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=False).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _header(a, info: dict, seconds: float, commit: str) -> list[str]:
    import numpy
    import pandas
    return [f"# Cross-rank accuracy on generated traces ({info['started_utc'][:10]})", "",
            f"- **Command:** `python -m benchmarks.cross_rank_accuracy --jobs {a.jobs} "
            f"--seed {a.seed}" + (f" --kinds {a.kinds}" if a.kinds else "") + "`",
            f"- **Machine:** {describe(info)}",
            f"- **Versions:** pandas {pandas.__version__}, numpy {numpy.__version__}; "
            f"code at commit {commit}",
            f"- **Repetitions:** {a.jobs} jobs, each generated, analysed in-process and judged "
            f"once ({seconds:.0f} s); kinds and metadata levels in turn, seeds drawn from "
            f"`--seed`", ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="KIND:META:SEED, one job")
    ap.add_argument("--kinds", help="KIND,KIND,...: draw the jobs from these kinds only")
    ap.add_argument("--out", type=Path, help="write the table (markdown) here too")
    a = ap.parse_args(argv)
    if a.only:
        kind, meta, seed = a.only.split(":")
        res, truth = run_one(kind, meta, int(seed))
        print(res, dataclasses.replace(truth, files=[]))
        return 0
    rng = random.Random(a.seed)
    info, commit = machine(), _commit()  # the code as it is when the run starts
    results: dict = defaultdict(list)
    failed = []
    t0 = time.time()
    kinds = tuple(a.kinds.split(",")) if a.kinds else KINDS
    if unknown := sorted(set(kinds) - set(KINDS)):
        ap.error(f"--kinds: no such kind: {', '.join(unknown)} (kinds: {', '.join(KINDS)})")
    for i in range(a.jobs):
        kind, meta = kinds[i % len(kinds)], METADATA[(i // len(kinds)) % len(METADATA)]
        seed = rng.randrange(1 << 30)
        try:
            res, _ = run_one(kind, meta, seed)
        except Exception as exc:  # a crash is a wrong answer on every metric
            res = {m: False for m in METRICS}
            res["error"] = f"{type(exc).__name__}: {exc}"
        results[(kind, meta)].append(res)
        bad = [m for m in METRICS if res.get(m) is False]
        if bad:
            failed.append(f"{kind}:{meta}:{seed} {','.join(bad)} {res.get('error', '')}")
    lines = [*_header(a, finish(info), time.time() - t0, commit),
             "Goals: straggler (or nobody) >= 99%, offsets within 20 µs >= 99%, layout exact, "
             "per-rank op counts exact.", "", *_shortfalls(results), "", *_table(results), "",
             "Failed jobs (kind:metadata:seed metrics; each reruns with `--only`):",
             *([f"- {f}" for f in failed] or ["- none"])]
    emit("\n".join(lines), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
