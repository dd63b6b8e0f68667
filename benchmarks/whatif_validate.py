"""Validate pardiag's what-if predictions against real runs (not a CI test).

For each base configuration of an example script this harness, ``--repeat`` times over:

1. profiles it with ``pardiag profile`` and builds the report in-process;
2. takes every change the recommender evaluated (recommended or not) that the example can run;
3. runs each changed configuration — and the base — with plain ``torchrun`` (no pardiag) right
   after, and reads the example's own per-step wall times (``--times-out``);
4. pairs each prediction with the measurement of the same repetition (the machine's speed
   drifts over minutes; a prediction is compared with runs made next to its profile).

It prints the median prediction, the median measurement and the median of the paired errors.

Measured step time = the median of every rank's step times over steps ≥ ``SKIP`` — the same
statistic pardiag's own step time is (``clean_step_us``: the median of the ranks' optimizer-step
periods after the profiler). A synchronous job's ranks share one period; the slowest rank *per
step* would add their jitter to it (a rank that runs a step late runs the next one early;
+0.3–1.1% measured).
Goal on CPU/gloo: median absolute error ≤ 10 %, worst ≤ 25 %.

    .venv/bin/python benchmarks/whatif_validate.py  # all cases (~6 min per repetition on 2 cores)
    .venv/bin/python benchmarks/whatif_validate.py pp_gpipe  # one case
    .venv/bin/python benchmarks/whatif_validate.py --json out.json

Run it on a quiet machine: other processes on the same cores distort every number. The
machine is recorded with the results (CPU model, cores, load average before and after; printed
above the table and written with ``--json``): a validation is only comparable with one made on
a machine like it.
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

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
STEPS = 40
SKIP = 5

#: name: (script, ranks, base args)
CASES = {
    "pp_unbalanced": ("train_pp.py", 2, ["--schedule", "1f1b", "--microbatches", "4",
                                         "--layers-per-stage", "1,5", "--batch", "128"]),
    "pp_gpipe": ("train_pp.py", 2, ["--schedule", "gpipe", "--microbatches", "2",
                                    "--batch", "512", "--width", "512"]),
    "ddp_straggler": ("train_ddp.py", 2, ["--slow-rank", "1", "--slow-ms", "20"]),
    "ddp_buckets": ("train_ddp.py", 2, ["--bucket-mb", "1", "--width", "512"]),
    "fsdp2": ("train_fsdp2.py", 2, ["--width", "512"]),
    "fsdp1": ("train_fsdp1.py", 2, ["--width", "512"]),
    # FSDP2 over dp × tensor parallel over tp: 2 × 2 on 4 ranks, and TP only
    # (dp = 1) on 2 ranks; the changes are other dp × tp splits at the same global batch
    "2d": ("train_2d.py", 4, ["--tp", "2"]),
    "tp_only": ("train_2d.py", 2, ["--tp", "2"]),
    # DeepSpeed ZeRO on a tiny GPT-2 (the changes: the stage, overlap_comm, the reduce bucket)
    "zero1": ("frameworks/train_deepspeed.py", 2, ["--zero-stage", "1", "--hidden", "256",
                                                   "--layers", "4", "--batch", "8"]),
    "zero3": ("frameworks/train_deepspeed.py", 2, ["--zero-stage", "3", "--hidden", "256",
                                                   "--layers", "4", "--batch", "8"]),
}


def _set(args: list[str], flag: str, value: str | None) -> list[str]:
    """``args`` with ``flag`` set to ``value`` (removed when None)."""
    out, i = [], 0
    while i < len(args):
        if args[i] == flag:
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out if value is None else [*out, flag, value]


def _blocks(layer_sizes: list[int]) -> str:
    """Children per stage of ``train_pp.py`` → its ``--layers-per-stage`` (blocks per stage):
    the first stage also holds the input projection, the last the head."""
    blocks = list(layer_sizes)
    blocks[0] -= 1
    blocks[-1] -= 1
    if min(blocks) < 1:
        raise ValueError(f"a stage would hold no block: {layer_sizes}")
    return ",".join(map(str, blocks))


def _get(args: list[str], flag: str, default: str | None = None) -> str | None:
    """The value of ``flag`` in ``args`` (the last one), else ``default``."""
    val = default
    for i, a in enumerate(args[:-1]):
        if a == flag:
            val = args[i + 1]
    return val


def _as_ddp(script: str, n: int, base: list[str]) -> tuple[str, list[str]] | None:
    """``train_pp.py``'s model as ``train_ddp.py`` over the same ``n`` ranks: the same blocks,
    width and global batch (DDP's ``--batch`` is per rank), DDP's default buckets."""
    if script != "train_pp.py":
        return None
    per_stage = _get(base, "--layers-per-stage")
    blocks = (sum(int(c) for c in per_stage.split(",")) if per_stage
              else int(_get(base, "--layers", "2")) * n)   # train_pp: 2 blocks per stage
    args = ["--batch", str(int(_get(base, "--batch", "32")) // n),
            "--width", _get(base, "--width", "256"), "--layers", str(blocks),
            "--optimizer", _get(base, "--optimizer", "adam"), "--bucket-mb", "0"]
    return "train_ddp.py", args + (["--pin-cpu"] if "--pin-cpu" in base else [])


def changed_args(script: str, n: int, base: list[str], params: dict
                 ) -> tuple[str, list[str]] | None:
    """The script and arguments for a recommendation's ``params``; None when the examples
    cannot run it."""
    if params.get("pp") == 1:
        return _as_ddp(script, n, base)
    a = list(base)
    if script == "train_2d.py" and not ("tp" in params and "dp" in params):
        return None   # train_2d.py runs only other dp × tp splits
    if "tp" in params and "dp" in params:
        if script != "train_2d.py":
            return None
        tp_now = int(_get(a, "--tp", "2"))
        per_replica = int(_get(a, "--batch", "32")) * (n // tp_now)   # the global batch
        if per_replica % params["dp"]:
            return None
        a = _set(_set(a, "--tp", str(params["tp"])), "--batch",
                 str(per_replica // params["dp"]))
    if "microbatches" in params:
        a = _set(a, "--microbatches", str(params["microbatches"]))
    if params.get("schedule") == "1f1b":
        a = _set(a, "--schedule", "1f1b")
    if params.get("schedule") == "interleaved":
        a = _set(a, "--schedule", "interleaved")
        a = _set(a, "--stages-per-rank", str(params["stages_per_rank"]))
    if "layers_per_stage" in params:
        try:
            a = _set(a, "--layers-per-stage", _blocks(params["layers_per_stage"]))
        except ValueError:
            return None
    if "without_rank" in params:
        a = _set(_set(a, "--slow-rank", None), "--slow-ms", None)
    if "ddp_bucket_cap_bytes" in params:
        a = _set(a, "--bucket-mb", f"{params['ddp_bucket_cap_bytes'] / 2**20:g}")
    if "fsdp_prefetch" in params:
        a = _set(a, "--prefetch", str(params["fsdp_prefetch"]))
    if params.get("reshard_after_forward") is False:
        a = _set(a, "--reshard-after-forward", "false")
    if params.get("fsdp_sharding_strategy") == "SHARD_GRAD_OP":
        a = _set(a, "--sharding-strategy", "shard_grad_op")
    if params.get("fsdp_forward_prefetch") and "--forward-prefetch" not in a:
        a = [*a, "--forward-prefetch"]
    if "zero_stage" in params:
        a = _set(a, "--zero-stage", str(params["zero_stage"]))
    if params.get("overlap_comm"):
        a = [*a, "--overlap-comm"]
    if "reduce_bucket_size" in params:
        a = _set(a, "--reduce-bucket-size", str(params["reduce_bucket_size"]))
    if "strategy" in params:
        return None
    return (script, a) if a != base else None


#: Plain runs that failed after every rank had written its step times (the script's last act;
#: DeepSpeed's ZeRO-2 example under plain torchrun aborts at interpreter exit now and then,
#: "terminate called without an active exception"): their times are used, and listed here.
FAILED_AT_EXIT: list[str] = []


def measure(script: str, n: int, args: list[str], tmp: Path, tag: str) -> float:
    """Median step time (µs) over every rank's steps ≥ ``SKIP`` of a plain torchrun run; its
    per-step times stay in ``tmp/<tag>.rank<r>``. A run that fails before every rank wrote
    them raises RuntimeError; one that fails after is kept in :data:`FAILED_AT_EXIT`."""
    times = tmp / tag
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           str(EXAMPLES / script), *args, "--steps", str(STEPS), "--times-out", str(times)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    written = all(Path(f"{times}.rank{r}").is_file() for r in range(n))
    if res.returncode != 0 and not written:
        raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr[-500:]}")
    if res.returncode != 0:
        FAILED_AT_EXIT.append(f"{tag}: exit code {res.returncode} after its steps")
    per_rank = [json.loads(Path(f"{times}.rank{r}").read_text()) for r in range(n)]
    steps = [t for rank_times in per_rank for t in rank_times[SKIP:]]
    return statistics.median(steps) * 1e6


def _replayed(report, change) -> float | None:
    """The same change predicted by replaying the critical path's graph instead of the rule's
    formula (ms), where the replay can express it (a straggler removed: its work scaled to its
    peers'); the replay's relative change applied to the step the rule starts from. None
    otherwise."""
    rank = change.params.get("without_rank")
    if rank is None:
        return None
    steps = report.critical_path.without_straggler(int(rank))
    if steps.empty:
        return None
    ratio = statistics.median(steps["predicted_us"] / steps["replay_us"])
    return change.measured_step_us * ratio / 1e3


#: The link between two simulated nodes (``tests/netns.py``: a rate-limited veth pair), Mbit/s:
#: the job is profiled at each rate and predicted, by replay, at the other.
LINK_RATES = (20.0, 80.0)
#: ``train_2d.py`` with its TP groups across the two nodes (2 ranks each): TP's activations are
#: what crosses the link, as in the two-node test.
LINK_JOB = ("train_2d.py", ["--tp-outer", "--width", "64", "--layers", "1", "--batch", "64",
                            "--seq", "32"])
LINK_STEPS = 15


def _link_runs(tmp: Path, rep: int) -> dict[float, tuple[Path, float]]:
    """Per link rate: the profiled run's folder and the plain run's median step time (µs, every
    rank's steps ≥ ``SKIP``), both made with the link at that rate."""
    sys.path.insert(0, str(REPO))
    from tests.netns import Network, profile_command, run_two_nodes, torchrun_command

    script, args = LINK_JOB
    out: dict[float, tuple[Path, float]] = {}
    for rate in LINK_RATES:
        net = Network(rate)
        if not net.ok:
            raise RuntimeError(f"no simulated link: {net.why}")
        folder, times = tmp / f"link{rate:g}_rep{rep}", tmp / f"plain_link{rate:g}_rep{rep}"
        try:
            for cmd in (profile_command(EXAMPLES / script, 2, folder, *args, "--steps",
                                        str(LINK_STEPS), timeout_s=600),
                        torchrun_command(EXAMPLES / script, 2, *args, "--steps", str(LINK_STEPS),
                                         "--times-out", str(times))):
                codes, res = run_two_nodes(net, cmd, cwd=REPO, timeout=900)
                if codes != [0, 0]:
                    raise RuntimeError(f"{' '.join(cmd[:6])} at {rate:g} Mbit/s: exit {codes}: "
                                       f"{res[0][1][-400:]}")
        finally:
            net.close()
        steps = [t for r in range(4)
                 for t in json.loads(Path(f"{times}.rank{r}").read_text())[SKIP:]]
        out[rate] = (folder, statistics.median(steps) * 1e6)
    return out


def link_rows(tmp: Path, rep: int) -> list[dict]:
    """The link made faster (and slower): profiled at one rate, the step predicted at the other
    by replaying the critical path with the transfers of the groups that span the nodes scaled
    by the rates' ratio (as the placement rule does: the steady replay, each rank's next step
    starting where its replayed step ends; and, beside it, one replay from the measured
    starts), and by the exposed-communication formula (the step less the exposed time of
    those dimensions × (1 − ratio)); each applied, as a ratio, to the profiled run's clean
    step, and measured by a plain run at the other rate."""
    from pardiag.analyzer.analyses.dim_overlap import dims_of_groups
    from pardiag.analyzer.predict.recommend import clean_step_us
    from pardiag.analyzer.report.registry import build_report
    from pardiag.analyzer.trace import load_traces

    runs = _link_runs(tmp, rep)
    rows = []
    for a, b in (LINK_RATES, LINK_RATES[::-1]):
        report = build_report(load_traces(runs[a][0]))
        groups = report.layout.groups
        by_name, _ = dims_of_groups(report.layout, len(report.traces.ranks))
        dims = sorted({by_name[str(pg)] for pg in
                       groups[groups["spans_nodes"].fillna(False).astype(bool)]["pg"]})
        f = a / b   # a transfer's time goes with 1 / rate
        ratio = report.critical_path.comm_ratio(dict.fromkeys(dims, f))
        ratio = float("nan") if ratio is None else ratio   # no transfer of theirs to replay
        # the same graph replayed once from the measured starts (the ranks' stagger fixed)
        path_dims = {j.dim for g in report.critical_path.graphs for j in g.joins}
        once = report.critical_path.replay(
            comm_scale={d: f for d in dims if d in path_dims}, steady=False)
        once = once[once["replay_us"] > 0]
        ratio_once = (float((once["predicted_us"] / once["replay_us"]).median())
                      if len(once) and path_dims & set(dims) else float("nan"))
        ov = report.results["dim_overlap"].summary
        exposed = float(ov[ov["dim"].isin(dims)]["exposed_us"].sum())
        steps = report.critical_path.steps
        per_step = exposed / len(steps) if len(steps) else 0.0
        profiled = float(steps["measured_us"].median()) if len(steps) else float("nan")
        clean = clean_step_us(report.traces)[0]
        rows.append({"case": "link", "change": f"link {a:g} → {b:g} Mbit/s ({', '.join(dims)})",
                     "base_ms": clean / 1e3, "replay_ms": clean * ratio / 1e3,
                     "replay_once_ms": clean * ratio_once / 1e3,
                     "formula_ms": clean * (1.0 - per_step / profiled * (1.0 - f)) / 1e3,
                     "measured_ms": runs[b][1] / 1e3, "measured_base_ms": runs[a][1] / 1e3})
    return rows


def link_table(reps: list[list[dict]]) -> list[dict]:
    """Per change, medians over the repetitions and the paired errors (%)."""
    out = []
    for i, first in enumerate(reps[0]):
        rs = [rep[i] for rep in reps]
        def err(key: str, rs=rs) -> float:
            return statistics.median(100.0 * (r[key] - r["measured_ms"]) / r["measured_ms"]
                                     for r in rs)
        meas = [r["measured_ms"] for r in rs]
        out.append({"change": first["change"], "repetitions": len(rs),
                    **{k: statistics.median(r[k] for r in rs) for k in
                       ("base_ms", "replay_ms", "replay_once_ms", "formula_ms",
                        "measured_ms", "measured_base_ms")},
                    "replay_error_pct": err("replay_ms"), "formula_error_pct": err("formula_ms"),
                    "replay_once_error_pct": err("replay_once_ms"),
                    "spread_pct": 100.0 * (max(meas) - min(meas)) / statistics.median(meas)})
    return out


def profile_case(name: str, tmp: Path, pin: bool, rep: int) -> list[dict]:
    """Profile a case's base configuration; returns one row per runnable evaluated change (the
    base first) with the prediction and the arguments to run."""
    from pardiag.analyzer.report.registry import build_report
    from pardiag.analyzer.trace import load_traces

    script, n, base = CASES[name]
    base = [*base, "--pin-cpu"] if pin else base
    out = tmp / f"{name}_rep{rep}"
    cmd = [sys.executable, "-m", "pardiag", "profile", str(EXAMPLES / script),
           "--nproc-per-node", str(n), "--out", str(out), "--overwrite", "--", *base,
           "--steps", str(STEPS)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr[-500:]}")
    report = build_report(load_traces(out))
    rec = report.results["recommendations"]
    evaluated = [*rec.recommendations, *rec.rejected]
    if not evaluated:
        return []
    rows = [{"case": name, "script": script, "n": n, "args": base, "recommended": False,
             "change": "(base, as pardiag measured it)",
             "predicted_ms": evaluated[0].measured_step_us / 1e3}]
    for c in evaluated:
        if c.ruled_out:   # not predicted: the model's shapes or batch rule it out
            continue
        changed = changed_args(script, n, base, c.params)
        if changed is not None:
            rows.append({"case": name, "script": changed[0], "n": n, "args": changed[1],
                         "recommended": c in rec.recommendations, "change": c.change,
                         "predicted_ms": c.predicted_step_us / 1e3,
                         "replay_ms": _replayed(report, c),
                         # the stand-in interval, where the prediction rests on one
                         "interval_ms": ([c.predicted_low_us / 1e3, c.predicted_high_us / 1e3]
                                         if c.interval_known else None)})
    return rows


def link_main(args) -> None:
    """``whatif_validate.py link``: :func:`link_rows` ``--repeat`` times, one table."""
    info = machine()
    print(f"machine: {describe(info)}", file=sys.stderr, flush=True)
    reps = []
    with tempfile.TemporaryDirectory(prefix="pardiag-whatif-") as d:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            d = str(args.keep)
        for rep in range(args.repeat):
            reps.append(link_rows(Path(d), rep))
            print(f"repetition {rep + 1}/{args.repeat} done", file=sys.stderr, flush=True)
    info = finish(info)
    rows = link_table(reps)
    print(f"machine: {describe(info)}")
    print(f"{args.repeat} repetition(s); two simulated nodes of 2 ranks, {LINK_JOB[0]} "
          f"{' '.join(LINK_JOB[1])}, {LINK_STEPS} steps\n")
    print("| change | profiled run's clean step ms | replay's prediction ms | error | "
          "one-pass replay ms | error | formula's prediction ms | error | measured ms | "
          "spread of runs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['change']} | {r['base_ms']:.1f} | {r['replay_ms']:.1f} | "
              f"{r['replay_error_pct']:+.1f}% | {r['replay_once_ms']:.1f} | "
              f"{r['replay_once_error_pct']:+.1f}% | {r['formula_ms']:.1f} | "
              f"{r['formula_error_pct']:+.1f}% | {r['measured_ms']:.1f} | "
              f"{r['spread_pct']:.0f}% |")
    errs = [abs(r["replay_error_pct"]) for r in rows]
    print(f"\nreplay: median |error| {statistics.median(errs):.1f}%, worst {max(errs):.1f}% "
          f"(goal ≤ 5% / ≤ 15%)")
    if FAILED_AT_EXIT:
        print("\nPlain runs that failed after writing their step times (used): "
              + "; ".join(FAILED_AT_EXIT))
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "repeat": args.repeat, "rows": rows,
                                         "failed_at_exit": FAILED_AT_EXIT},
                                        indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", help=f"cases to run (default: all of {', '.join(CASES)});"
                    f" 'link': the link between two simulated nodes made faster and slower "
                    f"(as root, with network namespaces; not in the default)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="repetitions: each profiles the base again and runs every configuration")
    ap.add_argument("--pin-cpu", action="store_true", help="pass --pin-cpu to every run")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep the profiled runs in this folder (default: a temporary one)")
    args = ap.parse_args()
    link = "link" in args.cases
    args.cases = [c for c in args.cases if c != "link"]
    if link and not args.cases:
        if args.pin_cpu:   # said, not ignored
            ap.error("the link case does not take --pin-cpu: it runs its simulated nodes as "
                     "they are")
        return link_main(args)
    unknown = set(args.cases) - set(CASES)
    if unknown:
        ap.error(f"unknown case(s) {sorted(unknown)}; choose from {sorted(CASES)}")
    if args.repeat < 3:
        print(f"note: {args.repeat} repetition(s); a validation for the README needs 3 or more",
              file=sys.stderr)
    info = machine()
    print(f"machine: {describe(info)}", file=sys.stderr, flush=True)
    table: dict[tuple, dict] = {}     # (case, args) → row, in order of first appearance
    with tempfile.TemporaryDirectory(prefix="pardiag-whatif-") as d:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            d = str(args.keep)
        for rep in range(args.repeat):
            for name in args.cases or list(CASES):
                for r in profile_case(name, Path(d), args.pin_cpu, rep):
                    row = table.setdefault((name, r["script"], tuple(r["args"])), {
                        **{k: r[k] for k in ("case", "script", "n", "args", "change")},
                        "predicted": {}, "measured": {}, "recommended": 0, "intervals": {},
                        "replay": {}})
                    row["predicted"][rep] = r["predicted_ms"]
                    if r.get("replay_ms") is not None:
                        row["replay"][rep] = r["replay_ms"]
                    if r.get("interval_ms"):
                        row["intervals"][rep] = r["interval_ms"]
                    row["recommended"] += bool(r["recommended"])
                for i, row in enumerate(t for t in table.values() if t["case"] == name):
                    row["measured"][rep] = measure(row["script"], row["n"], row["args"], Path(d),
                                                   f"plain_{name}_{i}_rep{rep}") / 1e3
            print(f"repetition {rep + 1}/{args.repeat} done", file=sys.stderr, flush=True)
    info = finish(info)
    rows = list(table.values())
    for r in rows:
        paired = [100.0 * (r["predicted"][k] - r["measured"][k]) / r["measured"][k]
                  for k in r["predicted"] if k in r["measured"]]
        meas = list(r["measured"].values())
        r["predicted_ms"] = statistics.median(r["predicted"].values())
        r["measured_ms"] = statistics.median(meas)
        r["error_pct"] = statistics.median(paired)
        r["spread_pct"] = 100.0 * (max(meas) - min(meas)) / r["measured_ms"]
        r["predictions"] = len(r["predicted"])
        # measurements inside the stand-in interval of their own repetition
        r["inside_interval"] = (sum(lo <= r["measured"][k] <= hi
                                    for k, (lo, hi) in r["intervals"].items()
                                    if k in r["measured"]) if r["intervals"] else None)
    changes = [r for r in rows if not r["change"].startswith("(base")]
    errs = [abs(r["error_pct"]) for r in changes]
    print(f"machine: {describe(info)}")
    print(f"{args.repeat} repetition(s){', ranks pinned' if args.pin_cpu else ''}; cases: "
          f"{', '.join(args.cases or CASES)}\n")
    print("| case | change | recommended | predicted ms | stand-in interval ms | measured ms | "
          "error | spread of runs |")
    print("|---|---|:-:|---:|---:|---:|---:|---:|")
    for r in rows:
        rec = f"{r['recommended']}/{r['predictions']}" if r["recommended"] else ""
        change = r["change"].replace("|", "\\|")     # a table cell
        iv = "–"
        if r["intervals"]:   # median ends over the repetitions; how many measurements fell in
            lo = statistics.median(v[0] for v in r["intervals"].values())
            hi = statistics.median(v[1] for v in r["intervals"].values())
            iv = f"{lo:.1f}–{hi:.1f} ({r['inside_interval']}/{len(r['intervals'])} inside)"
        print(f"| {r['case']} | {change} | {rec} | {r['predicted_ms']:.1f} | {iv} | "
              f"{r['measured_ms']:.1f} | {r['error_pct']:+.1f}% | {r['spread_pct']:.0f}% |")
    if errs:
        print(f"\n{len(errs)} changes: median |error| {statistics.median(errs):.1f}%, "
              f"worst {max(errs):.1f}%  (goal ≤ 10% / ≤ 25%)")
    replayed = [r for r in rows if r["replay"]]
    if replayed:   # the critical path's replay beside the rule's formula, on the same runs
        print("\n| case | change | rule's prediction ms | error | replay's prediction ms | "
              "error | measured ms |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for r in replayed:
            rp = [100.0 * (r["replay"][k] - r["measured"][k]) / r["measured"][k]
                  for k in r["replay"] if k in r["measured"]]
            r["replay_ms"] = statistics.median(r["replay"].values())
            r["replay_error_pct"] = statistics.median(rp)
            print(f"| {r['case']} | {r['change'].replace('|', chr(92) + '|')} | "
                  f"{r['predicted_ms']:.1f} | {r['error_pct']:+.1f}% | {r['replay_ms']:.1f} | "
                  f"{r['replay_error_pct']:+.1f}% | {r['measured_ms']:.1f} |")
    if FAILED_AT_EXIT:
        print("\nPlain runs that failed after writing their step times (used): "
              + "; ".join(FAILED_AT_EXIT))
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "repeat": args.repeat, "rows": rows,
                                         "failed_at_exit": FAILED_AT_EXIT},
                                        indent=1, default=str))


if __name__ == "__main__":
    main()
