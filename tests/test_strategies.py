"""Every parallelism strategy under `pardiag profile` on CPU/gloo: records, pipeline schedule,
memory, layout (issue: collectors for every strategy)."""

import json
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from pardiag.analyzer.classify import comm_threads
from pardiag.analyzer.load import load_traces
from conftest import REPO

# name: (script, ranks, script args, expected layout dims, expected strategies)
RUNS = {
    "ddp": ("train_ddp.py", 2, [], {"dp": 2}, ["ddp"]),
    "fsdp2": ("train_fsdp2.py", 2, [], {"dp": 2}, ["fsdp2"]),
    "fsdp2_keep": ("train_fsdp2.py", 2, ["--reshard-after-forward", "false"], {"dp": 2}, ["fsdp2"]),
    "fsdp1": ("train_fsdp1.py", 2, [], {"dp": 2}, ["fsdp1"]),
    "zero1": ("train_zero1.py", 2, [], {"dp": 2}, ["ddp", "zero1"]),
    "tp": ("train_tp.py", 2, [], {"tp": 2}, ["tp"]),
    "moe": ("train_moe.py", 2, [], {"ep": 2}, ["ep"]),
    "pp_gpipe2": ("train_pp.py", 2, ["--schedule", "gpipe", "--microbatches", "4"], {"pp": 2},
                  ["pipeline"]),
    "pp_1f1b2": ("train_pp.py", 2, ["--schedule", "1f1b", "--microbatches", "8"], {"pp": 2},
                 ["pipeline"]),
    "pp_interleaved2": ("train_pp.py", 2, ["--schedule", "interleaved", "--microbatches", "4"],
                        {"pp": 2}, ["pipeline"]),
    "pp_gpipe4": ("train_pp.py", 4, ["--schedule", "gpipe", "--microbatches", "4"], {"pp": 4},
                  ["pipeline"]),
    "pp_1f1b4": ("train_pp.py", 4, ["--schedule", "1f1b", "--microbatches", "4",
                                    "--layers-per-stage", "1,2,2,3"], {"pp": 4}, ["pipeline"]),
    "2d": ("train_2d.py", 4, [], {"dp": 2, "tp": 2}, ["fsdp2", "tp"]),
}
PIPELINES = {  # name: (schedule class, stages, microbatches, stages per rank)
    "pp_gpipe2": ("ScheduleGPipe", 2, 4, 1), "pp_1f1b2": ("Schedule1F1B", 2, 8, 1),
    "pp_interleaved2": ("ScheduleInterleaved1F1B", 4, 4, 2), "pp_gpipe4": ("ScheduleGPipe", 4, 4, 1),
    "pp_1f1b4": ("Schedule1F1B", 4, 4, 1),
}
ACTIVE = 3

_cache: dict = {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("strategies")

    def get(name):
        if name not in _cache:
            script, n, args, *_ = RUNS[name]
            out = base / name
            res = subprocess.run(
                [sys.executable, "-m", "pardiag", "profile", str(REPO / "examples" / script),
                 "--nproc-per-node", str(n), "--out", str(out), "--active", str(ACTIVE), "--",
                 "--steps", "6", *args], capture_output=True, text=True, timeout=300, cwd=REPO)
            assert res.returncode == 0, res.stderr[-4000:]
            _cache[name] = out
        return _cache[name]
    return get


def _json(path):
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", list(RUNS))
def test_every_collective_has_a_record(runs, name):
    out = runs(name)
    traces = load_traces(out)
    assert len(traces.ranks) == RUNS[name][1] and not traces.warnings
    for rank, trace in traces.ranks.items():
        comms = _json(out / f"rank{rank}.comms.json")
        recs = comms["records"]
        assert recs, (name, rank)
        groups = {g["name"]: g for g in comms["process_groups"]}
        for r in recs:
            assert r["pg_name"] in groups and r["bytes"] > 0 and r["dtype"], r
            assert r["start_us"] is not None and r["end_us"] >= r["start_us"] >= r["issue_us"] - 50
            if r["op"] in ("send", "recv"):
                assert r["peer"] in groups[r["pg_name"]]["ranks"] and r["peer"] != rank
        ev = trace.events
        threads = comm_threads(trace)
        worker = np.array([(p, t) in threads for p, t in zip(ev["pid"], ev["tid"])])
        # every gloo transfer in the trace (worker thread, or caller thread for send/recv) is
        # exactly one record's start
        gloo = ev[ev["name"].str.startswith("gloo:").to_numpy()]
        starts = Counter(r["start_us"] for r in recs if r["matched"] == "gloo")
        assert len(gloo) > 0
        for ts in gloo["ts"]:
            assert starts[float(ts)] == 1, (name, rank, ts)
        # every collective the program issued (c10d op on its own threads) holds a record
        issued = ev[~worker & ev["name"].str.match(r"^c10d::(?!wait)").to_numpy()]
        issue = np.array([r["issue_us"] for r in recs])
        for s, d, n in zip(issued["ts"], issued["dur"], issued["name"]):
            assert ((issue >= s) & (issue <= s + d)).any(), (name, rank, n, s)


@pytest.mark.parametrize("name", list(RUNS))
def test_detected_layout(runs, name):
    out = runs(name)
    _, n, _, dims, strategies = RUNS[name]
    lay = _json(out / "run.json")["layout"]
    assert lay["dims"] == dims
    assert lay["strategies"] == strategies
    if name.startswith("fsdp2"):
        assert lay["fsdp_reshard_after_forward"] is (name == "fsdp2")
    run = _json(out / "run.json")
    assert run["nodes"] == {_json(out / "rank0.meta.json")["host"]: list(range(n))}
    assert run["backend"] == "gloo" and run["world_size"] == n


@pytest.mark.parametrize("name", list(PIPELINES))
def test_pipeline_records(runs, name):
    out = runs(name)
    sched, stages, mbs, v = PIPELINES[name]
    pipe = _json(out / "run.json")["layout"]["pipeline"]
    assert (pipe["schedule"], pipe["stages"], pipe["microbatches"], pipe["stages_per_rank"]) == (
        sched, stages, mbs, v)
    n = RUNS[name][1]
    seen = Counter()
    for rank in range(n):
        allrecs = _json(out / f"rank{rank}.pipeline.json")["records"]
        # every optimizer step is recorded; the profiled ones are flagged
        assert {r["optimizer_step"] for r in allrecs} == set(range(6))
        recs = [r for r in allrecs if r["profiled"]]
        for r in recs:
            assert r["stage"] % n == rank and r["end_us"] >= r["start_us"]
            seen[(r["stage"], r["phase"])] += 1
        # each local stage: every microbatch forward and backward once per active step
        per = Counter((r["stage"], r["phase"], r["microbatch"]) for r in recs)
        assert set(per.values()) == {ACTIVE}
    assert seen == {(s, p): ACTIVE * mbs for s in range(stages) for p in "FB"}


def test_static_memory_of_sharded_optimizers(runs):
    """FSDP and ZeRO shard the optimizer state: about 1/world of DDP's on each rank."""
    def static(name, rank=0):
        return _json(runs(name) / f"rank{rank}.meta.json")["memory"]["static"]
    ddp = static("ddp")
    # Adam: exp_avg + exp_avg_sq per parameter, plus a 4-byte step counter per parameter tensor
    assert ddp["optimizer_state_bytes"] == 2 * ddp["params_bytes"] + 4 * ddp["params"]
    for name in ("fsdp2", "fsdp1", "zero1"):
        for rank in (0, 1):
            s = static(name, rank)
            ratio = s["optimizer_state_bytes"] / ddp["optimizer_state_bytes"]
            assert ratio == pytest.approx(0.5, abs=0.02), (name, rank, ratio)
    # FSDP also shards parameters and gradients; ZeRO-1 keeps them whole
    assert static("fsdp2")["params_bytes"] / ddp["params_bytes"] == pytest.approx(0.5, abs=0.02)
    assert static("zero1")["params_bytes"] == ddp["params_bytes"]
    # 2D mesh dp×tp = 2×2: a quarter of everything
    assert static("2d")["params_bytes"] / ddp["params_bytes"] == pytest.approx(0.25, abs=0.02)
    meta = _json(runs("ddp") / "rank0.meta.json")
    assert meta["memory"]["peak_rss_bytes"] > 50 * 2**20
    # the allocator peak seen in the trace covers at least the gradients' buckets it allocated
    assert meta["memory"]["trace_peaks"]["cpu"]["peak_allocated_bytes"] > 0
    assert meta["cpu_count"] >= 1 and meta["host"]


def test_planted_hang_is_diagnosed(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "pardiag", "profile", str(REPO / "examples" / "train_ddp.py"),
         "--nproc-per-node", "2", "--out", str(tmp_path / "h"), "--timeout", "12", "--",
         "--hang-rank", "1", "--hang-step", "3"], capture_output=True, text=True, timeout=120,
        cwd=REPO)
    assert res.returncode == 124
    line = next(ln for ln in res.stderr.splitlines() if ln.startswith("pardiag: hang after"))
    assert re.search(r"rank\(s\) \[0\] wait in gloo:all_reduce #\d+ on process group 0 "
                     r"\(default_pg\); missing: rank 1 \(last entered #\d+; at .*in plant\)", line), line
    run = _json(tmp_path / "h" / "run.json")
    assert run["exit_code"] == 124 and run["hang"] and run["timed_out_after_s"] == 12
    assert (tmp_path / "h" / "rank0.hang.json").is_file()
