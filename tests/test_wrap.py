"""`pardiag wrap`: the per-rank entry under launchers pardiag does not start (torchrun, srun,
mpirun), and the command-line checks `profile` and `wrap` share."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from pardiag.cli import main
from pardiag.collectors.wrap import expand_nodelist, rank_env
from pardiag.errors import PardiagError

from .paths import REPO

EXAMPLE = REPO / "examples" / "train_ddp.py"


def _free_port(lo: int = 0) -> int:
    """A free TCP port (from ``lo`` up when given)."""
    for port in (range(lo, lo + 1000) if lo else [0]):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


# --- where a rank comes from ---------------------------------------------------------------------

def test_slurm_node_lists_expand_as_scontrol_does():
    assert expand_nodelist("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07",
                                                       "gpu5"]
    assert expand_nodelist("a[8-10]") == ["a8", "a9", "a10"]
    assert expand_nodelist("rack[1-2]-n[1-2]") == ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
    assert expand_nodelist("solo") == ["solo"]
    with pytest.raises(ValueError):
        expand_nodelist("n[3-1]")


def test_torchrun_variables_win():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "GROUP_RANK": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
    r = rank_env(env)
    assert (r.source, r.rank, r.world_size, r.local_rank, r.local_world_size, r.node_rank) == (
        "torchrun", 5, 8, 1, 4, 1)
    assert r.set_env == {}


def test_slurm_variables_give_the_rank_and_the_master():
    """SLURM's variables as `srun -N 2 --ntasks-per-node 3` sets them on the second node's first
    task (set by hand here; tests/test_wrap.py::test_wrap_under_slurm runs a real srun where
    the machine has one)."""
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "6", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
           "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "3(x2)", "SLURM_JOB_ID": "123456",
           "SLURM_JOB_NODELIST": "gpu[07-08]"}
    r = rank_env(env)
    assert (r.source, r.rank, r.world_size, r.local_rank, r.local_world_size, r.node_rank,
            r.nnodes) == ("slurm", 3, 6, 0, 3, 1, 2)
    assert r.set_env == {"MASTER_ADDR": "gpu07", "MASTER_PORT": "29956", "RANK": "3",
                         "WORLD_SIZE": "6", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3",
                         "GROUP_RANK": "1"}
    # what the user set is kept; uneven nodes: "2(x2),1" gives the third node 1 task
    r = rank_env({**env, "MASTER_ADDR": "head", "MASTER_PORT": "4000", "SLURM_NODEID": "2",
                  "SLURM_TASKS_PER_NODE": "2(x2),1", "SLURM_PROCID": "4"})
    assert r.local_world_size == 1
    assert "MASTER_ADDR" not in r.set_env and "MASTER_PORT" not in r.set_env


def test_open_mpi_variables():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
           "MASTER_ADDR": "h0"}
    r = rank_env(env)
    assert (r.source, r.rank, r.world_size, r.local_rank, r.local_world_size, r.node_rank) == (
        "openmpi", 2, 4, 0, 2, 1)
    assert r.set_env == {"MASTER_PORT": "29500", "RANK": "2", "WORLD_SIZE": "4",
                         "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    del env["MASTER_ADDR"]   # several hosts and no master: said, not guessed
    with pytest.raises(PardiagError, match="needs MASTER_ADDR"):
        rank_env(env)
    one_host = {**env, "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "2"}
    assert rank_env(one_host).set_env["MASTER_ADDR"] == "127.0.0.1"
    assert rank_env({}).source == "single"
    with pytest.raises(PardiagError, match="SLURM_PROCID='x' is not a number"):
        rank_env({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"})


# --- command-line habits (no torch run) ---------------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    # forgetting `--` before the script's own --steps: --steps is named, not pardiag's --out
    (["profile", "t.py", "--steps", "3", "--out", "o"],
     "--steps: not an option of pardiag profile; the script's own options go after `--`"),
    (["profile", "t.py", "--out", "o", "--steps", "3"],
     "--steps: not an option of pardiag profile; the script's own options go after `--`"),
    (["profile", "t.py", "--out", "o", "3"],
     "--out is an option of pardiag profile, given after SCRIPT among the script's arguments "
     "without `--`"),
    (["profile", "--out", "a", "t.py", "--out", "b"], "--out is given twice (--out ... --out)"),
    (["wrap", "--wait", "0", "t.py", "--wait=1", "--", "x"], "--wait is given twice"),
    (["profile", "--steps", "3", "t.py"], "--steps: not an option of pardiag profile"),
    (["wrap", "t.py", "--steps", "2", "--active", "2"], "--steps: not an option of pardiag wrap"),
])
def test_ambiguous_command_lines_are_refused(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pardiag: error: ") and says in err, err
    assert len(err.splitlines()) == 1 and "-- [SCRIPT ARGS]" in err


def test_multi_node_options_are_checked(tmp_path, capsys):
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    assert main(["profile", str(script), "--nnodes", "2", "--out", str(tmp_path / "o")]) == 2
    assert "--nnodes 2 needs --node-rank (0..1, one per node)" in capsys.readouterr().err
    assert main(["profile", str(script), "--nnodes", "2", "--node-rank", "2"]) == 2
    assert "--node-rank must be in 0..1" in capsys.readouterr().err
    assert main(["profile", str(script), "--nnodes", "2", "--node-rank", "1"]) == 2
    assert "needs where the nodes meet: --rdzv-endpoint HOST:PORT" in capsys.readouterr().err
    from pardiag.collectors.launch import ProfileConfig
    cfg = ProfileConfig(script=script, out=tmp_path / "o", nnodes=2, node_rank=1,
                        rdzv_endpoint="10.0.0.1:29400", rdzv_backend="c10d", rdzv_id="job7")
    assert cfg.torchrun_args() == ["--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d",
                                   "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-id", "job7"]
    assert ProfileConfig(script=script, out=tmp_path / "o").torchrun_args() == [
        "--standalone", "--nnodes", "1"]


def test_noise_filter_drops_and_shows_once():
    from pardiag.collectors.launch import NoiseFilter

    class Sink:
        data = b""

        def write(self, b):
            Sink.data += b

        def flush(self):
            pass

    f = NoiseFilter(sink=Sink())
    lines = [b"USDT:2026-11-30 18:49:04 15280:15280 SyncActivityProfilerHandler.cpp:52] "
             b"profiler_start\n",
             b"[W1130 18:49:04.302071449 CPUAllocator.cpp:245] Memory block of unknown size was "
             b"allocated before the profiling started, profiler results will not include the "
             b"deallocation event\n",
             b"[rank1]:[W1130 18:49:04.31 CPUAllocator.cpp:245] Memory block of unknown size "
             b"was allocated before the profiling started\n",
             b"step 1 loss 2.3\n", b"[W1130 other.cpp:1] a warning of its own\n",
             # torchrun's own lines on a failed rank (pardiag names it itself)
             b"W1203 06:58:10.637000 20149 .venv/lib/python3.11/site-packages/torch/distributed/"
             b"elastic/multiprocessing/api.py:1028] Sending process 20153 closing signal "
             b"SIGTERM\n",
             b"E1203 06:58:11.203000 20149 .venv/lib/python3.11/site-packages/torch/distributed/"
             b"elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: "
             b"20154) of binary: /work/main/.venv/bin/python\n",
             b"W1203 06:58:12.000000 20149 torch/distributed/run.py:800] another warning\n",
             b"\r 50%|#####     | 1/2"]
    for ln in lines:
        os.write(f.write_fd, ln)
    f.started()
    f.close()
    assert Sink.data == lines[1] + lines[3] + lines[4] + lines[7] + lines[8]
    assert f.hidden == 4


# --- real launchers ------------------------------------------------------------------------------

@pytest.mark.e2e
def test_wrap_under_torchrun(tmp_path):
    out = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "pardiag", "wrap", "--out", str(out), "--wait", "0", "--warmup", "1",
         "--active", "2", str(EXAMPLE), "--", "--steps", "3"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "pardiag wrap: 2 rank(s) from torchrun" in res.stderr
    assert sorted(p.name for p in out.glob("rank*.trace.json.gz")) == [
        "rank0.trace.json.gz", "rank1.trace.json.gz"]
    run = json.loads((out / "pardiag" / "run.json").read_text())
    host = json.loads((out / "pardiag" / "rank0.meta.json").read_text())["host"]
    assert run["world_size"] == 2 and run["nodes"] == {host: [0, 1]} and run["exit_code"] == 0
    assert run["schedule"] == {"wait": 0, "warmup": 1, "active": 2}
    from pardiag.analyzer.trace import load_traces
    traces = load_traces(out)
    assert sorted(traces.ranks) == [0, 1] and not [w for w in traces.warnings if "rank" in w]
    # a second run into the same folder: each rank refuses to write over its own files (and
    # with --overwrite removes only those)
    from pardiag.collectors.rank_entry import claim_files
    before = sorted(p.name for p in (out / "pardiag").iterdir())
    assert "rank 1's files of an earlier run are there (rank1.trace.json.gz, pardiag/rank1." \
        in claim_files(out, 1, overwrite=False)
    assert sorted(p.name for p in (out / "pardiag").iterdir()) == before
    assert claim_files(out, 1, overwrite=True) is None
    assert sorted(p.name for p in out.glob("rank*.trace.json.gz")) == ["rank0.trace.json.gz"]
    assert (out / "pardiag" / "rank0.meta.json").is_file()
    assert not (out / "pardiag" / "rank1.meta.json").exists()
    assert claim_files(out, 1, overwrite=False) is None   # nothing of rank 1's left


def _slurm_ready() -> str | None:
    if not shutil.which("srun") or not shutil.which("sinfo"):
        return "no srun (SLURM not installed)"
    res = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    if res.returncode != 0 or not any(s in res.stdout for s in ("idle", "mixed", "allocated")):
        return f"no SLURM node up (sinfo: {(res.stderr or res.stdout).strip()[:200]})"
    return None


@pytest.mark.e2e
def test_wrap_under_slurm(tmp_path):
    """Two tasks under a real `srun` where this machine runs SLURM (CI sets up slurmctld and
    slurmd on localhost as root, .ci/run); elsewhere the same two processes get SLURM's
    variables by hand, as srun sets them for a one-node job, and the test says so."""
    out = tmp_path / "run"
    args = ["-m", "pardiag", "wrap", "--out", str(out), "--wait", "0", "--warmup", "1",
            "--active", "2", str(EXAMPLE), "--", "--steps", "4"]
    port = _free_port(29500)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "MASTER_")) and k not in (
               "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    why = _slurm_ready()
    if why is None:
        env["MASTER_PORT"] = str(port)   # the job id's port may be taken on a shared machine
        res = subprocess.run(["srun", "-n", "2", "--time", "5", sys.executable, *args],
                             capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
        codes, err = [res.returncode], res.stderr
    else:
        procs = []
        for task in (0, 1):
            e = {**env, "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task),
                 "SLURM_NTASKS": "2", "SLURM_NODEID": "0", "SLURM_NNODES": "1",
                 "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_ID": str(port - 29500),
                 "SLURM_JOB_NODELIST": "localhost"}
            procs.append(subprocess.Popen([sys.executable, *args], env=e, cwd=REPO,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        outs = [p.communicate(timeout=300) for p in procs]
        codes, err = [p.returncode for p in procs], "".join(o[1] for o in outs)
    assert set(codes) == {0}, err[-3000:]
    assert "pardiag wrap: 2 rank(s) from slurm" in err
    run = json.loads((out / "pardiag" / "run.json").read_text())
    assert run["world_size"] == 2 and run["exit_code"] == 0 and run["node_rank"] == 0
    assert sorted(sum(run["nodes"].values(), [])) == [0, 1]
    for r in (0, 1):
        meta = json.loads((out / "pardiag" / f"rank{r}.meta.json").read_text())
        assert meta["status"] == "ok" and meta["world_size"] == 2 and meta["optimizer_steps"] == 4
    if why is not None:
        pytest.skip(f"ran with SLURM's variables set by hand: {why}")


def test_ranks_leave_together_through_the_store():
    """The end of every rank: a counter in the job's store, not a collective barrier; it
    returns when every rank arrived, or after its limit."""
    import threading

    from pardiag.collectors.rank_entry import _exit_together

    class Store:
        def __init__(self):
            self.n, self.lock = 0, threading.Lock()

        def add(self, key, k):
            assert key == "pardiag_exit_sync"
            with self.lock:
                self.n += k
                return self.n

    class Dist:
        class distributed_c10d:
            store = Store()

            @staticmethod
            def _get_default_store():
                return Dist.distributed_c10d.store

    others = threading.Timer(0.3, lambda: Dist.distributed_c10d.store.add("pardiag_exit_sync", 2))
    others.start()
    assert _exit_together(Dist, 3, timeout_s=30) is True
    assert _exit_together(Dist, 5, timeout_s=0.2) is False   # nobody else comes: the limit

    class NoStore:
        class distributed_c10d:
            @staticmethod
            def _get_default_store():
                raise RuntimeError("no default store")
    assert _exit_together(NoStore, 2, timeout_s=1) is False


def test_main_thread_of_a_faulthandler_dump():
    from pardiag.collectors.launch import _main_thread_at
    text = ('Thread 0x00007f5d61ebc6c0 (most recent call first):\n'
            '  File "/x/w.py", line 5 in w\n  File "/usr/lib/threading.py", line 982 in run\n\n'
            'Current thread 0x00007f5d62c21b80 (most recent call first):\n'
            '  File "/x/t.py", line 8 in loop\n  File "/x/t.py", line 9 in <module>\n')
    assert _main_thread_at(text) == 'File "/x/t.py", line 8 in loop'
    assert _main_thread_at("") is None


def test_a_script_error_shows_the_scripts_traceback_only(tmp_path):
    """An error raised in the user's script, run as the wrapper runs it (runpy from
    rank_entry): the traceback starts at the script's frame, as `python script.py` prints it;
    a SyntaxError keeps only its message (file, line)."""
    import runpy
    import traceback

    from pardiag.collectors.rank_entry import user_traceback
    script = tmp_path / "train.py"
    script.write_text("def step():\n    raise ValueError('bad batch')\n\nstep()\n")
    try:
        runpy.run_path(str(script), run_name="__main__")
    except ValueError as exc:
        err = exc
    # the test's own frame comes first; from the wrapper's frame on, ours and runpy's go
    tb = err.__traceback__.tb_next
    text = "".join(traceback.format_exception(type(err), err, user_traceback(tb)))
    files = [f.filename for f in traceback.extract_tb(user_traceback(tb))]
    assert files == [str(script), str(script)], files
    assert "runpy" not in text and text.endswith("ValueError: bad batch\n")
    script.write_text("def step(:\n")
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SyntaxError as exc:
        err2 = exc
    assert user_traceback(err2.__traceback__.tb_next) is None


def test_the_exit_code_passed_on_is_the_first_failure_s(tmp_path):
    """Rank 1 raises (exit 1) and torchrun then stops rank 0 with SIGTERM (143): the code passed
    on is rank 1's, as plain torchrun passes it (it was rank 0's 143); a SIGTERM's code only
    where no rank has another."""
    from pardiag.collectors.launch import ProfileConfig, _exit_code, _rank_outcomes
    from pardiag.layout import RankMeta

    (tmp_path / "s.py").write_text("")
    cfg = ProfileConfig(script=tmp_path / "s.py", out=tmp_path / "o", nproc_per_node=2)

    def meta(code, ended, status="error"):
        return RankMeta(rank=0, world_size=2, status=status, exit_code=code,
                        ended_unix=ended, error=f"exit {code}", trace_file="t.json.gz",
                        optimizer_steps=8)

    got = _rank_outcomes({0: meta(143, 1000.2), 1: meta(1, 1000.0)}, cfg)
    assert got.codes == [1, 143] and list(got.failed) == [1, 0]
    assert _exit_code(got.codes, None, 1, [], 2, cfg) == 1
    # the SIGTERM'd rank wrote its metadata first: its 143 is still not the script's code
    got = _rank_outcomes({0: meta(143, 999.0), 1: meta(1, 1000.0)}, cfg)
    assert _exit_code(got.codes, None, 1, [], 2, cfg) == 1
    # every rank stopped by SIGTERM (Ctrl-C reached them): 143
    got = _rank_outcomes({0: meta(143, 1.0), 1: meta(143, 2.0)}, cfg)
    assert _exit_code(got.codes, None, 143, [], 2, cfg) == 143
    got = _rank_outcomes({0: meta(3, 2.0), 1: meta(0, 1.0, "ok")}, cfg)
    assert _exit_code(got.codes, None, 3, [], 2, cfg) == 3
