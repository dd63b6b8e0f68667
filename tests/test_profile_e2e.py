"""`pardiag profile` end to end on CPU/gloo with 2 ranks, then `pardiag report` on its output."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .paths import REPO

EXAMPLE = REPO / "examples" / "train_ddp.py"


def pardiag(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "pardiag", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "ddp"
    res = pardiag("profile", EXAMPLE, "--nproc-per-node", 2, "--out", out, "--", "--steps", 7)
    return out, res


@pytest.mark.e2e
def test_profile_writes_the_run_folder(ddp_run):
    out, res = ddp_run
    assert res.returncode == 0, res.stderr[-3000:]
    # only the traces at the top (tools such as HTA take every *.json / *.gz file for a trace)
    assert sorted(p.name for p in out.iterdir()) == [
        ".pardiag-cache", "pardiag", "rank0.trace.json.gz", "rank1.trace.json.gz"]
    assert sorted(p.name for p in (out / "pardiag").iterdir()) == [
        "rank0.comms.json", "rank0.meta.json", "rank1.comms.json", "rank1.meta.json", "run.json"]
    # each rank summarized its own trace (pardiag report reads these, not the raw traces)
    assert sorted(p.name for p in (out / ".pardiag-cache").iterdir()) == [
        "rank0.trace.json.gz.summary.json", "rank1.trace.json.gz.summary.json"]
    run = json.loads((out / "pardiag" / "run.json").read_text())
    assert run["world_size"] == 2 and run["exit_code"] == 0
    assert run["script_args"] == ["--steps", "7"]
    # the host probe, timed just before and just after the job (ms: a few on any machine)
    assert 0 < run["host_probe_before_ms"] < 1000 and 0 < run["host_probe_after_ms"] < 1000
    # the last line is the next command; torch's profiler lines are left out or shown once
    # (run as `python -m pardiag`: the same way again)
    assert res.stderr.strip().splitlines()[-1] == (f"pardiag: next: {sys.executable} -m pardiag "
                                                   f"report {out}")
    assert "USDT:" not in res.stderr and res.stderr.count("CPUAllocator.cpp") <= 1
    from pardiag import layout  # the typed form the loader decodes
    typed = layout.decode_sidecar((out / "pardiag" / "run.json").read_bytes(), "run")
    assert typed.started_unix < typed.ended_unix and typed.schedule.active == 3
    assert typed.nodes == {layout.decode_sidecar(
        (out / "pardiag" / "rank0.meta.json").read_bytes(), "rank").host: [0, 1]}
    for r in (0, 1):
        meta = json.loads((out / "pardiag" / f"rank{r}.meta.json").read_text())
        assert meta["rank"] == r and meta["world_size"] == 2 and meta["status"] == "ok"
        assert meta["backend"] == "gloo" and meta["device"] == "cpu"
        assert meta["optimizer_steps"] == 7
        assert meta["torch_version"].startswith("2.")
        # what contention needs: torch's threads (torchrun's OMP_NUM_THREADS=1) and the cores
        assert meta["intra_op_threads"] == 1 and meta["pinned_by_pardiag"] is False
        assert meta["cpu_affinity"] == sorted(os.sched_getaffinity(0))
        # pardiag's own work when the window (steps 2-4) ended follows step 4: the period of
        # step 5 holds it and is never a step time; DDP issues no point-to-point call
        inst = meta["instrumentation"]
        assert inst["post_window_after_step"] == 4 and inst["post_window_s"] > 0
        assert set(inst["post_window_parts_s"]) == {"export", "flight_recorder",
                                                    "live_objects", "layout", "shapes",
                                                    "window_meta"}
        assert inst["p2p_calls"] == {"window": 0, "outside": 0}
        assert inst["chunk_calls"] == {"window": 0, "outside": 0}
    if len(os.sched_getaffinity(0)) >= 2:   # unpinned ranks may share every core: said so
        assert "pardiag: warning: timings are contended: ranks 0,1 may run on the same cores" \
            in res.stderr
        # the NCCL/torch environment compare diffs: pardiag's own flight-recorder size is in it
        assert meta["env"]["TORCH_FR_BUFFER_SIZE"] == "20000"
        assert all(k.startswith(layout.ENV_PREFIXES) for k in meta["env"])


@pytest.mark.e2e
def test_hta_loads_the_run_folder(ddp_run):
    """Holistic Trace Analysis 0.5 loads the run folder as it is (only the traces at the top)
    and sees what pardiag sees: on CPU traces HTA computes little (FACTS §1), but it keeps, per
    rank, the CPU operators and annotations that start before the last ProfilerStep (its
    window, ``Trace._filter_irrelevant_gpu_kernels``); their number and their time span equal
    pardiag's events on that window, in HTA's whole µs (start rounded up, end rounded down)."""
    import numpy as np
    from hta.trace_analysis import TraceAnalysis

    from pardiag.analyzer.trace import load_traces
    out, _ = ddp_run
    hta = TraceAnalysis(trace_dir=str(out))
    assert hta.t.get_ranks() == [0, 1]
    mine = load_traces(out)
    for r in (0, 1):
        df = hta.t.get_trace(r)
        ev = mine.ranks[r].events
        ops = ev[(ev["ph"] == "X") & ev["cat"].isin(["cpu_op", "user_annotation"])]
        t0, t1 = np.ceil(ops["ts"]), np.floor(ops["ts"] + ops["dur"])
        last = t0[ops["name"].str.startswith("ProfilerStep#")].max()
        keep = (t0 < last).to_numpy()
        assert len(df) == keep.sum() > 100
        assert (df["ts"] + df["dur"]).max() - df["ts"].min() == t1[keep].max() - t0[keep].min()


@pytest.mark.e2e
def test_report_on_profiled_run(ddp_run, tmp_path):
    out, _ = ddp_run
    js = tmp_path / "s.json"
    res = pardiag("report", out, "-o", tmp_path / "r.html", "--json", js)
    assert res.returncode == 0, res.stderr
    data = json.loads(js.read_text())
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    # the ranks' own summaries give exactly what the raw traces give
    raw = tmp_path / "raw.json"
    assert pardiag("report", out, "-o", tmp_path / "r2.html", "--json", raw,
                   "--no-cache").returncode == 0
    assert json.loads(raw.read_text())["ranks"] == data["ranks"]
    for r in data["ranks"]:
        assert r["rank_source"] == "distributedInfo"
        # wait 1 + warmup 1 + active 3: steps 2, 3 and 4 of the optimizer are recorded
        assert [s["step"] for s in r["steps"]] == [2, 3, 4]
        ar = {c["collective"]: c for c in r["collectives"]}["all_reduce"]
        # DDP all-reduces every bucket every step: the gloo worker shows at least one per step
        assert ar["count"] >= 3 and ar["time_us"] > 0
        t = r["total"]
        assert t["compute_us"] > 0 and t["comm_us"] > 0
        assert 0 <= t["overlap_pct"] <= 100


@pytest.mark.e2e
def test_mfu_of_a_profiled_cpu_run_against_its_measured_peak(ddp_run, tmp_path):
    """Model FLOPs per step within 2% of the analytic count of the example's MLP (forward 2·B·W,
    weight and input gradients 2·B·W each, no input gradient for the first layer), MFU against
    the float32 matmul peak each rank measured when it started; the summaries in the cache give
    the same numbers as the raw traces."""
    from torch import nn

    sys.path.insert(0, str(REPO / "examples"))
    try:
        import _common
    finally:
        sys.path.pop(0)
    out, _ = ddp_run
    model = _common.build_model(256, 4)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    batch = 32
    analytic = (6 * batch * sum(m.weight.numel() for m in linears)
                - 2 * batch * linears[0].weight.numel())
    js = tmp_path / "s.json"
    res = pardiag("report", out, "-o", tmp_path / "r.html", "--json", js, "--no-cache", "-q")
    assert res.returncode == 0, res.stderr
    eff = json.loads(js.read_text())["efficiency"]
    assert [r["rank"] for r in eff["per_rank"]] == [0, 1]
    metas = [json.loads((out / "pardiag" / f"rank{k}.meta.json").read_text()) for k in (0, 1)]
    assert metas[0]["host"] == metas[1]["host"]
    # the ranks of one host measured at once: each MFU is against the best of them
    peak = max(m["peak_flops"]["float32"] for m in metas)
    for r in eff["per_rank"]:
        assert r["model_tflop_per_step"] * 1e12 == pytest.approx(analytic, rel=0.02)
        assert r["peak_source"] == "measured when the rank started (float32 matmul)"
        assert r["peak_tflops"] == pytest.approx(peak / 1e12)
        assert 0 < r["mfu_pct"] < 100 and r["mfu_pct_min"] <= r["mfu_pct"] <= r["mfu_pct_max"]
    for s in eff["per_step"]:
        peak = {r["rank"]: r["peak_tflops"] for r in eff["per_rank"]}[s["rank"]]
        assert s["mfu_pct"] == pytest.approx(
            100 * s["model_flops"] / (s["step_us"] / 1e6 * peak * 1e12))
    # per module: each Linear (under DDP: "DistributedDataParallel.module.<name>") has its
    # forward 2·B·W and backward 4·B·W (2·B·W for the first, no input gradient) in each of 3
    # steps × 2 ranks, exactly
    modules = {m["module"]: m for m in eff["per_module"]}
    for i, (name, lin) in enumerate((n, m) for n, m in model.named_modules()
                                    if isinstance(m, nn.Linear)):
        row = modules[f"DistributedDataParallel.module.{name}"]
        w = lin.weight.numel()
        assert (row["module_class"], row["ranks"]) == ("Linear", 2)
        assert row["forward_flops"] == 2 * batch * w * 6
        assert row["backward_flops"] == (2 if i == 0 else 4) * batch * w * 6
    assert modules["(optimizer)"]["backward_flops"] == 0
    assert sum(m["time_pct"] for m in eff["per_module"]) == pytest.approx(100)


@pytest.mark.e2e
def test_existing_output_is_not_overwritten(ddp_run):
    out, _ = ddp_run
    before = (out / "rank0.trace.json.gz").read_bytes()
    res = pardiag("profile", EXAMPLE, "--nproc-per-node", 2, "--out", out)
    assert res.returncode == 2
    assert "not empty" in res.stderr and "--overwrite" in res.stderr
    assert (out / "rank0.trace.json.gz").read_bytes() == before


@pytest.mark.e2e
def test_failing_rank_is_named_and_exit_code_nonzero(tmp_path):
    out = tmp_path / "fail"
    # rank 1 raises at step 6, after the profiled window (steps 2-4) was written
    res = pardiag("profile", EXAMPLE, "--nproc-per-node", 2, "--out", out, "--",
                  "--steps", 8, "--fail-rank", 1, "--fail-step", 6)
    # the script's code (its RuntimeError: 1), as plain torchrun passes it on; not rank 0's 143
    # from the SIGTERM torchrun then sends it
    assert res.returncode == 1, res.stderr[-2000:]
    failed = [ln for ln in res.stderr.splitlines() if re.match(r"pardiag: rank \d failed", ln)]
    # the planted failure comes first, before rank 0's consequential gloo error (if any)
    assert re.match(r"pardiag: rank 1 failed( \(first failure\))?: RuntimeError: planted failure "
                    r"on rank 1 at step 6", failed[0]), failed
    meta = json.loads((out / "pardiag" / "rank1.meta.json").read_text())
    assert meta["status"] == "error" and meta["exit_code"] == 1
    # traces of ranks that got that far are kept
    assert (out / "rank0.trace.json.gz").is_file() and (out / "rank1.trace.json.gz").is_file()
    run = json.loads((out / "pardiag" / "run.json").read_text())
    assert run["exit_code"] == 1 and "1" in run["failed_ranks"]


@pytest.mark.e2e
def test_a_rank_sent_sigterm_writes_its_files_and_says_so_on_one_line(tmp_path):
    """torchrun stops the other ranks with SIGTERM when one fails and on Ctrl-C: the rank
    stops where it is and still writes its trace (the profiled window had ended), its
    collective records and its metadata; SIGTERM's exit code (143) is passed on."""
    script = tmp_path / "term.py"
    script.write_text("import os, signal, torch\nm = torch.nn.Linear(4, 4)\n"
                      "opt = torch.optim.SGD(m.parameters(), 0.1)\n"
                      "for step in range(1000):\n    m(torch.randn(2, 4)).sum().backward()\n"
                      "    opt.step()\n"
                      "    if step == 6:\n        os.kill(os.getpid(), signal.SIGTERM)\n")
    out = tmp_path / "o"
    res = pardiag("profile", script, "--out", out)
    assert res.returncode == 143, res.stderr[-2000:]
    assert ("pardiag: rank 0 stopped by SIGTERM: the launcher ended the job (another rank "
            "failed, or it was interrupted); its files are written") in res.stderr
    assert "Traceback" not in res.stderr
    meta = json.loads((out / "pardiag" / "rank0.meta.json").read_text())
    assert meta["status"] == "error" and meta["exit_code"] == 143
    assert meta["error"].startswith("stopped by SIGTERM") and meta["optimizer_steps"] == 7
    assert (out / "rank0.trace.json.gz").is_file() and (out / "pardiag" / "run.json").is_file()
    assert not list((out / "pardiag").glob("*.partial.*"))


def _ctrl_c_when(out, ready, poll_s: float, settle_s: float = 0.0, sigterm: bool = False
                 ) -> tuple[int, str]:
    """Start ``pardiag profile`` of the DDP example into ``out`` in its own session (SIGINT at
    its default, as in a terminal), wait until ``ready()`` (at most 180 s) and ``settle_s``
    more, then press Ctrl-C: SIGINT to the whole process group (``sigterm``: SIGTERM to
    pardiag's process alone, as ``timeout`` or ``kill`` sends it). Returns (exit code,
    stderr); asserts that no process of the job is left."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "pardiag", "profile", str(EXAMPLE), "--nproc-per-node", "2",
         "--out", str(out), "--", "--steps", "1000000"], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 180
        while not ready():
            assert proc.poll() is None and time.time() < deadline
            time.sleep(poll_s)
        time.sleep(settle_s)
        if sigterm:
            os.kill(proc.pid, signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        # pardiag has returned: no process of its session is left, nor a rank of its job
        left = _session_processes(proc.pid) + _job_processes(out)
        assert not left, (left, err[-2000:])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err


def _job_processes(out) -> list[str]:
    """The processes alive whose environment names the run folder ``out`` (torchrun and the
    ranks, each in a session of its own), as "pid command"."""
    found = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            text = env.read_bytes()
            stat = (env.parent / "stat").read_text()
        except OSError:
            continue
        if str(out).encode() in text and stat.rsplit(")", 1)[1].split()[0] != "Z":
            found.append(f"{env.parent.name} {(env.parent / 'cmdline').read_bytes()[:80]!r}")
    return found


def _session_processes(sid: int) -> list[str]:
    """The processes of session ``sid`` still alive (zombies are dead), as "pid command"."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue   # it ended meanwhile
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:]
        fields = rest.split()
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(f"{stat.parent.name} {name}")
    return out


@pytest.mark.e2e
def test_ctrl_c_stops_the_job_and_keeps_what_the_ranks_wrote(tmp_path):
    """Ctrl-C (SIGINT to the foreground process group) once the profiled window has ended: the
    ranks, sent SIGTERM, write their files; the run file is written; one line says what the
    run folder keeps; exit code 130."""
    out = tmp_path / "o"
    code, err = _ctrl_c_when(
        out, lambda: all((out / f"rank{r}.trace.json.gz").exists() for r in (0, 1)),
        poll_s=0.2, settle_s=1.0)
    assert code == 130, err[-2000:]
    assert err.splitlines()[-1] == (f"pardiag: interrupted: the job was stopped; {out} keeps the "
                                    f"traces of rank(s) 0, 1 and their metadata")
    assert "Traceback" not in err
    run = json.loads((out / "pardiag" / "run.json").read_text())
    assert run["exit_code"] == 130
    for r in (0, 1):
        meta = json.loads((out / "pardiag" / f"rank{r}.meta.json").read_text())
        assert meta["exit_code"] == 143 and meta["error"].startswith("stopped by SIGTERM")
    # the report calls the run interrupted, not failed: nobody failed
    rep = pardiag("report", out, "-o", tmp_path / "r.html")
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert ("Verdict: The run was interrupted (Ctrl-C, exit code 130): rank(s) 0, 1 were "
            "stopped by the launcher") in " ".join(rep.stdout.split())
    assert "The run failed" not in rep.stdout


@pytest.mark.e2e
def test_sigterm_to_pardiag_alone_stops_the_job_as_ctrl_c_does(tmp_path):
    """SIGTERM to ``pardiag profile`` alone (``timeout 600 pardiag profile ...``, a batch
    system's cancel): torchrun and the ranks, each in a session of its own, are stopped as
    Ctrl-C stops them, nothing is left running, exit code 143, and the report calls the run
    interrupted by SIGTERM. Before, pardiag died and the job trained on, unwatched."""
    out = tmp_path / "o"
    code, err = _ctrl_c_when(
        out, lambda: all((out / f"rank{r}.trace.json.gz").exists() for r in (0, 1)),
        poll_s=0.2, settle_s=1.0, sigterm=True)
    assert code == 143, err[-2000:]
    assert err.splitlines()[-1] == (f"pardiag: interrupted: stopped by SIGTERM; the job was "
                                    f"stopped; {out} keeps the traces of rank(s) 0, 1 and "
                                    f"their metadata")
    assert "Traceback" not in err
    run = json.loads((out / "pardiag" / "run.json").read_text())
    assert run["exit_code"] == 143 and run["torchrun_exit_code"] == 143
    rep = pardiag("report", out, "-o", tmp_path / "r.html")
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert ("Verdict: The run was interrupted (SIGTERM, exit code 143): rank(s) 0, 1 were "
            "stopped by the launcher") in " ".join(rep.stdout.split())


def _job_pid(out, marker: bytes, env_marker: bytes = b"") -> int:
    """The pid of the process of the job writing ``out`` whose command line holds ``marker``
    (and whose environment holds ``env_marker``)."""
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            text = env.read_bytes()
            if str(out).encode() in text and env_marker in text and \
                    marker in (env.parent / "cmdline").read_bytes():
                return int(env.parent.name)
        except OSError:
            continue
    raise AssertionError(f"no process of the job with {marker!r}")


@pytest.mark.e2e
@pytest.mark.parametrize("victim", ["torchrun", "rank 1"])
def test_a_killed_torchrun_or_rank_leaves_nothing_running_and_is_named(tmp_path, victim):
    """SIGKILL to torchrun (its ranks, in sessions of their own, would train on, orphaned) or
    to one rank (torchrun then stops the other with SIGTERM, and that rank's "stopped by
    SIGTERM" was said as the run's failure). pardiag ends with no process of the job left; a
    killed torchrun is said, and a killed rank is said first, as the one that ended without a
    word."""
    import signal
    import time

    out = tmp_path / "o"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pardiag", "profile", str(EXAMPLE), "--nproc-per-node", "2",
         "--out", str(out), "--", "--steps", "1000000"], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.time() + 180
        while not all((out / f"rank{r}.trace.json.gz").exists() for r in (0, 1)):
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.2)
        time.sleep(1.0)
        os.kill(_job_pid(out, b"torchrun_quiet") if victim == "torchrun"
                else _job_pid(out, b"rank_entry", b"\0RANK=1\0"), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        left = _job_processes(out)
        assert not left, (left, err[-2000:])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in err
    # a killed rank's empty stacks file (SIGUSR1's, created at its start) is not left behind
    assert not list((out / "pardiag").glob("rank*.stacks.txt"))
    if victim == "torchrun":
        assert "pardiag: torchrun ended (exit code -9) while 2 rank process(es) still ran " \
               "(torchrun killed?); they were stopped" in err, err[-2000:]
    else:
        assert "- the first to end, without a word (killed: SIGKILL, or out of memory?); " \
               "torchrun then stopped the others" in err, err[-2000:]
        said = [ln for ln in err.splitlines()
                if ln.startswith(("pardiag: rank 1 did not finish", "pardiag: rank 0 failed"))]
        assert len(said) == 2 and said[0].startswith("pardiag: rank 1"), err[-2000:]
        rep = pardiag("report", out, "-o", tmp_path / "r.html")
        assert ("Verdict: The run failed: rank(s) [1] ended without a word (killed: SIGKILL, "
                "or out of memory?); then the launcher stopped rank(s) 0 (SIGTERM)") in \
            " ".join(rep.stdout.split()), rep.stdout[-2000:]


@pytest.mark.e2e
def test_timeout_on_a_job_still_making_steps_is_no_hang(tmp_path):
    """``--timeout`` as a time limit on a healthy job: it was stopped while making steps, which
    is no hang (before, a snapshot of its collectives named a rank 'missing' from an all-reduce
    the other had just entered). The ranks are stopped as Ctrl-C stops them and write their
    files; exit code 124; the report says it was stopped by --timeout."""
    out = tmp_path / "o"
    res = pardiag("profile", EXAMPLE, "--nproc-per-node", 2, "--timeout", 20, "--out", out,
                  "--", "--steps", 1000000)
    assert res.returncode == 124, res.stderr[-2000:]
    said = [ln for ln in res.stderr.splitlines() if "--timeout" in ln or "hang" in ln]
    assert len(said) == 1 and said[0].startswith(
        "pardiag: stopped by --timeout after 20 s: the job was still running, not hung: a "
        "rank's optimizer step ended "), res.stderr[-2000:]
    assert said[0].endswith("s before --timeout 20 s expired; the ranks were stopped and wrote "
                            "their files")
    rep = pardiag("report", out, "-o", tmp_path / "r.html")
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "Verdict: The run was stopped by --timeout after 20 s: the job was still running, " \
           "not hung" in " ".join(rep.stdout.split())


@pytest.mark.e2e
def test_ctrl_c_while_the_ranks_start_is_one_line(tmp_path):
    """Ctrl-C as soon as the ranks exist (their stacks files are created when they start,
    before the profiler and the hooks): no traceback from any rank, one line, exit code 130,
    no file left but the run file."""
    out = tmp_path / "o"
    code, err = _ctrl_c_when(out, lambda: bool(list((out / "pardiag").glob("rank*.stacks.txt"))),
                             poll_s=0.05)
    assert code == 130, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.splitlines()[-1].startswith(f"pardiag: interrupted: the job was stopped; {out} "
                                           f"keeps ")
    assert not list((out / "pardiag").glob("rank*.stacks.txt"))


@pytest.mark.e2e
def test_script_exit_code_is_passed_on(tmp_path):
    script = tmp_path / "exit3.py"
    script.write_text("import sys\nprint('bye')\nsys.exit(3)\n")
    res = pardiag("profile", script, "--nproc-per-node", 1, "--out", tmp_path / "o")
    assert res.returncode == 3, res.stderr
    meta = json.loads((tmp_path / "o" / "pardiag" / "rank0.meta.json").read_text())
    assert meta["exit_code"] == 3
    # sys.exit is no crash: no traceback, as Python prints none (argparse's usage error too)
    assert "Traceback" not in res.stderr, res.stderr
    assert "pardiag: rank 0's script exited with code 3" in res.stderr


@pytest.mark.e2e
def test_missing_script_is_exit_2(tmp_path):
    res = pardiag("profile", tmp_path / "nope.py", "--out", tmp_path / "o")
    assert res.returncode == 2 and "no such script" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
def test_script_without_optimizer(tmp_path):
    script = tmp_path / "noopt.py"
    script.write_text("import torch\nx = torch.randn(64, 64)\nfor _ in range(3):\n"
                      "    x = torch.tanh(x @ x.T)\n")
    res = pardiag("profile", script, "--out", tmp_path / "a")
    assert res.returncode == 0
    assert ("rank 0 wrote no trace: the script made 0 optimizer step(s), and pardiag's steps "
            "are optimizer steps (torch.optim's step()); with --wait 0 --warmup 0 it records "
            "the whole script as one step") in res.stderr
    assert not (tmp_path / "a" / "rank0.trace.json.gz").exists()
    rep = pardiag("report", tmp_path / "a", "-o", tmp_path / "none.html")
    assert rep.returncode == 2 and rep.stderr.strip().endswith(
        "the script made no optimizer step, and pardiag's steps are optimizer steps "
        "(torch.optim's step()): profile with --wait 0 --warmup 0 to record the whole script "
        "as one step")
    # recording from the start: the whole script is one (partial) active window
    res = pardiag("profile", script, "--out", tmp_path / "b", "--wait", 0, "--warmup", 0)
    assert res.returncode == 0 and "no trace" not in res.stderr
    js = tmp_path / "s.json"
    assert pardiag("report", tmp_path / "b", "-o", tmp_path / "r.html",
                   "--json", js).returncode == 0
    total = json.loads(js.read_text())["ranks"][0]["total"]
    assert total["compute_us"] > 0 and total["comm_us"] == 0 and total["overlap_pct"] is None


@pytest.mark.e2e
def test_short_run_warns(tmp_path):
    """Also ``--pin-cpu``: each rank gets its own cores and as many threads, and no contention
    is reported."""
    res = pardiag("profile", EXAMPLE, "--nproc-per-node", 2, "--pin-cpu", "--out",
                  tmp_path / "o", "--", "--steps", 3)
    assert res.returncode == 0
    assert "rank 0 recorded 1 of --active 3 steps" in res.stderr
    cores = sorted(os.sched_getaffinity(0))
    metas = [json.loads((tmp_path / "o" / "pardiag" / f"rank{r}.meta.json").read_text())
             for r in (0, 1)]
    assert all(m["pinned_by_pardiag"] for m in metas)
    if len(cores) >= 2:
        k = len(cores) // 2
        assert [m["cpu_affinity"] for m in metas] == [cores[:k], cores[k:2 * k]]
        assert [m["intra_op_threads"] for m in metas] == [k, k]
        assert "contended" not in res.stderr


@pytest.mark.e2e
def test_bad_out_folder_is_exit_2(tmp_path):
    (tmp_path / "file").write_text("x")
    res = pardiag("profile", EXAMPLE, "--out", tmp_path / "file" / "sub")
    assert res.returncode == 2 and "cannot create the run folder" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.e2e
def test_a_script_that_fails_before_its_first_step_gets_no_schedule_advice(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("x = (\n")
    res = pardiag("profile", script, "--out", tmp_path / "o")
    assert res.returncode == 1
    assert re.search(r"pardiag: rank 0 failed: SyntaxError: '\(' was never closed", res.stderr)
    assert "wrote no trace" not in res.stderr and "--wait 0" not in res.stderr


def test_a_script_error_is_told_on_one_line():
    """A syntax error names its file and line on one line (Python's own form takes four); any
    other error is ``Type: message``, its line breaks made spaces."""
    from pardiag.collectors.rank_entry import _one_line
    try:
        compile("x = (\n", "/tmp/train.py", "exec")
    except SyntaxError as exc:
        assert _one_line(exc) == "SyntaxError: '(' was never closed (/tmp/train.py, line 1)"
    assert _one_line(RuntimeError("planted failure\non rank 1")) == \
        "RuntimeError: planted failure on rank 1"


def test_overwrite_says_what_it_removed(tmp_path, capsys):
    """--overwrite removes pardiag's own files of the previous run — naming them — and keeps
    anything else."""
    from pardiag.collectors.launch import _prepare_out
    for name in ("rank0.trace.json.gz", "rank3.meta.json", "notes.txt"):
        (tmp_path / name).write_text("x")
    _prepare_out(tmp_path, True)
    err = capsys.readouterr().err
    assert err.strip() == (f"pardiag: {tmp_path}: --overwrite removed the previous run's 2 "
                           "file(s): rank0.trace.json.gz, rank3.meta.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "pardiag"]


def test_overwrite_keeps_the_previous_runs_reports_and_says_so(tmp_path, capsys):
    """Reports pardiag wrote into the run folder and its captures' (a page, a report JSON) are
    kept by --overwrite, the user's to keep, with a line saying they describe the previous run;
    a page or JSON of the user's own is kept without one; a folder named capture-notes is no
    capture."""
    from pardiag.collectors.launch import _prepare_out
    page = "<html><head><meta name='generator' content='pardiag 0.1.0'></head></html>"
    for name, text in (("report.html", page), ("summary.json", '{"schema_version": 3}'),
                       ("capture-40/report.html", page), ("capture-notes/report.html", page),
                       ("mine.html", "<html>mine</html>"), ("mine.json", '{"a": 1}'),
                       ("rank0.trace.json.gz", "x"), ("pardiag/run.json", "x")):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    _prepare_out(tmp_path, True)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"pardiag: {tmp_path}: kept report.html, summary.json, "
                       "capture-40/report.html: report(s) of the previous run, not of this one")
    assert (tmp_path / "report.html").read_text() == page


def test_overwrite_replaces_only_a_previous_run(tmp_path):
    """--overwrite on a folder no pardiag run wrote: a trace of pardiag's name copied there is
    the user's, and so is a pardiag/ folder of other files (a source package); each is refused
    in one line and nothing is removed."""
    from pardiag.collectors.launch import _prepare_out
    from pardiag.errors import PardiagError
    copied = tmp_path / "a"
    copied.mkdir()
    for name in ("rank0.trace.json.gz", "notes.txt"):
        (copied / name).write_text("x")
    with pytest.raises(PardiagError, match=r"rank0\.trace\.json\.gz: no pardiag run wrote it "
                                           r"here \(the folder holds no run\.json or rank "
                                           r"metadata\); --overwrite replaces only"):
        _prepare_out(copied, True)
    assert sorted(p.name for p in copied.iterdir()) == ["notes.txt", "rank0.trace.json.gz"]
    repo = tmp_path / "b"
    (repo / "pardiag").mkdir(parents=True)
    (repo / "pardiag" / "__init__.py").write_text("x")
    with pytest.raises(PardiagError, match=r"pardiag: holds files pardiag did not write \(e\.g\. "
                                           r"pardiag/__init__\.py\) and no run's metadata"):
        _prepare_out(repo, True)
    assert [p.name for p in (repo / "pardiag").iterdir()] == ["__init__.py"]


def test_overwrite_removes_both_layouts(tmp_path, capsys):
    """--overwrite on a run folder of today's layout (sidecars in pardiag/) removes them there,
    and keeps a file of the user's in pardiag/."""
    from pardiag.collectors.launch import _prepare_out
    (tmp_path / "pardiag").mkdir()
    for name in ("rank0.trace.json.gz", "pardiag/run.json", "pardiag/rank0.hang.json",
                 "pardiag/dump-request", ".pardiag-dump-request", "pardiag/mine.txt"):
        (tmp_path / name).write_text("x")
    _prepare_out(tmp_path, True)
    assert "removed the previous run's 5 file(s)" in capsys.readouterr().err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "pardiag", "pardiag/mine.txt"]


def test_overwrite_removes_a_monitored_runs_records_and_captures(tmp_path, capsys):
    """--overwrite on a monitored run's folder removes its records and capture request before
    the launcher reads them (else it says the old run's findings and asks for a capture of
    steps the new run may never reach), and its deep captures' folders with their traces,
    records and summaries; a file of the user's in a capture folder keeps the folder."""
    from pardiag.collectors.launch import _prepare_out
    (tmp_path / "pardiag").mkdir()
    for d in ("capture-7", "capture-9"):
        (tmp_path / d / "pardiag").mkdir(parents=True)
        (tmp_path / d / ".pardiag-cache").mkdir()
        for name in ("rank0.trace.json.gz", "pardiag/rank0.meta.json",
                     "pardiag/rank0.comms.json", ".pardiag-cache/rank0.trace.json.gz.summary.json"):
            (tmp_path / d / name).write_text("x")
    for name in ("pardiag/run.json", "pardiag/rank0.monitor.jsonl", "pardiag/rank1.monitor.jsonl",
                 "pardiag/capture.request.json", "capture-9/notes.txt"):
        (tmp_path / name).write_text("x")
    _prepare_out(tmp_path, True)
    assert "removed the previous run's 12 file(s)" in capsys.readouterr().err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "capture-9", "capture-9/notes.txt", "pardiag"]


@pytest.mark.e2e
def test_a_rank_stuck_holding_the_interpreter_still_says_where(tmp_path):
    """A rank stuck in native code that holds the interpreter lock cannot let its watchdog
    thread write the --timeout dump (the issue's empty dumps): the launcher then asks it for
    its threads' stacks (SIGUSR1, faulthandler) and names where its main thread was."""
    script = tmp_path / "stuck.py"
    script.write_text("import ctypes, torch\nm = torch.nn.Linear(4, 4)\n"
                      "opt = torch.optim.SGD(m.parameters(), 0.1)\n"
                      "for step in range(3):\n    m(torch.randn(2, 4)).sum().backward()\n"
                      "    opt.step()\n"
                      "ctypes.PyDLL(None).sleep(600)  # holds the GIL\n")
    # --stall-timeout counts from the first optimizer step: the rank is in its sleep then (a
    # --timeout counts from the job's start: with 15 s, three test workers on 2 cores once
    # kept it importing torch past the timeout, and its watchdog wrote a dump)
    res = pardiag("profile", script, "--out", tmp_path / "o", "--stall-timeout", 5)
    assert res.returncode == 124, res.stderr[-2000:]
    line = next(ln for ln in res.stderr.splitlines()
                if ln.startswith("pardiag: hang, no optimizer step for 5 s: "))
    assert "rank 0 wrote no hang dump" in line and "its main thread was at File " in line, line
    stacks = (tmp_path / "o" / "pardiag" / "rank0.stacks.txt").read_text()
    assert "most recent call first" in stacks
    if str(script) in stacks:   # a loaded machine may still be importing torch after 30 s
        assert f'File "{script}", line 7 in <module>' in line, line


TINY = ("import torch\nm = torch.nn.Linear(4, 4)\nopt = torch.optim.SGD(m.parameters(), 0.1)\n"
        "for step in range(6):\n    m(torch.randn(2, 4)).sum().backward()\n    opt.step()\n")


@pytest.mark.e2e
def test_a_pause_between_steps_is_a_stall_and_the_end_of_the_script_is_not(tmp_path):
    """--stall-timeout 4: a script that sleeps 12 s after its fifth step is stopped (exit code
    124), and the hang line says where its rank was, as no collective waits; the same script
    without the pause ends by itself (exit code 0), pardiag's work after its last step no
    stall, and the rank's progress file is gone (its steps were over); one that evaluates
    for 6 s there instead (no optimizer step; nearly all its time in one matrix product, so
    that its stack looks the same at every look: its core's use says it works), pinned to its
    core, is making progress: no stall."""
    script = tmp_path / "pause.py"
    script.write_text("import sys, time, torch\nm = torch.nn.Linear(4, 4)\n"
                      "opt = torch.optim.SGD(m.parameters(), 0.1)\n"
                      "for step in range(10):\n    m(torch.randn(2, 4)).sum().backward()\n"
                      "    opt.step()\n    if step == 4 and len(sys.argv) == 2:\n"
                      "        time.sleep(float(sys.argv[1]))\n"
                      "    elif step == 4:   # an evaluation, in one call site nearly always\n"
                      "        t, a = time.monotonic(), torch.randn(700, 700)\n"
                      "        with torch.no_grad():\n"
                      "            while time.monotonic() - t < float(sys.argv[1]):\n"
                      "                a @ a\n")
    res = pardiag("profile", script, "--out", tmp_path / "p", "--stall-timeout", 4, "--", 12)
    assert res.returncode == 124, res.stderr[-2000:]
    assert (f'pardiag: hang, no optimizer step for 4 s: no collective is waiting on a missing '
            f'rank; rank 0 at File "{script}", line 8, in <module>') in res.stderr, res.stderr
    res = pardiag("profile", script, "--out", tmp_path / "q", "--stall-timeout", 2, "--", 0)
    assert res.returncode == 0 and "hang" not in res.stderr, res.stderr[-2000:]
    assert not list((tmp_path / "q" / "pardiag").glob("*.progress"))
    res = pardiag("profile", script, "--out", tmp_path / "e", "--stall-timeout", 2, "--pin-cpu",
                  "--", 6, "eval")
    assert res.returncode == 0 and "hang" not in res.stderr, res.stderr[-2000:]


@pytest.mark.e2e
def test_repeat_writes_a_set_of_runs_that_report_and_compare_read(tmp_path):
    """--repeat 2: run-1 and run-2, each a run folder with its host probes; report reads the
    set (its median run, with every run's step), compare of the set with itself cannot
    judge the noise with two runs per side; a folder that holds files is refused; a failing
    run ends the repeats."""
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    out = tmp_path / "set"
    res = pardiag("profile", "--repeat", 2, "--out", out, script)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["run-1", "run-2"]
    assert "pardiag: run 2 of 2 into" in res.stderr
    assert ("pardiag: warning: with 2 runs per side `pardiag compare` cannot tell any "
            "difference from the noise between runs (its test needs 4 or more per side): use "
            "--repeat 4 or more") in res.stderr
    # 6 steps: the window (1 + 1 + 3) and the export step leave none undisturbed
    assert ("pardiag: warning: only 0 optimizer step(s) ran after the profiling window and the "
            "step that exports its trace") in res.stderr
    assert res.stderr.strip().splitlines()[-1].endswith(f"report {out}")
    for run in ("run-1", "run-2"):
        f = json.loads((out / run / "pardiag" / "run.json").read_text())
        assert f["exit_code"] == 0 and f["host_probe_before_ms"] > 0
    rep = pardiag("report", out, "-o", tmp_path / "r.html", "-q")
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert f"{out} holds 2 repeated runs; this report is of run-" in rep.stderr
    cmp = pardiag("compare", out, out, "-o", tmp_path / "c.html", "--json", tmp_path / "c.json",
                  "-q")
    assert cmp.returncode == 0, cmp.stderr[-2000:]
    step = json.loads((tmp_path / "c.json").read_text())["step"]
    assert len(step["a"]["runs_us"]) == 2 and step["delta_pct"] == 0.0
    # two runs per side: the test cannot clear p < 0.05 whatever the values, so the noise is
    # unknown rather than "within"
    assert step["beyond_noise"] is None and step["p_value"] == 1.0
    assert "repeat each side 4 times or more" in step["noise"]
    # the set folder holds files now: refused without --overwrite
    again = pardiag("profile", "--repeat", 2, "--out", out, script)
    assert again.returncode == 2 and again.stderr.strip() == (
        f"pardiag: error: {out}: folder exists and is not empty (pass --overwrite to replace "
        "the runs in it)")
    multi = pardiag("profile", "--repeat", 2, "--nnodes", 2, "--node-rank", 0, "--out",
                    tmp_path / "m", script)
    assert multi.returncode == 2 and multi.stderr.strip() == (
        "pardiag: error: --repeat runs a job on one node only (--nnodes 1)")
    bad = tmp_path / "bad.py"
    bad.write_text("raise SystemExit(3)\n")
    res = pardiag("profile", "--repeat", 3, "--out", tmp_path / "bad", bad)
    assert res.returncode == 3
    assert "pardiag: run 1 of 3 failed: the other 2 were not started" in res.stderr
    assert sorted(p.name for p in (tmp_path / "bad").iterdir()) == ["run-1"]
