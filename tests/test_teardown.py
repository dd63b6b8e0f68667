"""What the launcher says about a rank stuck after its script (no job started: the stack dumps
are written as faulthandler writes them)."""

import pardiag
from pardiag import layout
from pardiag.collectors.launch import _main_thread_at, _stacks_lines

# faulthandler's dump of a rank whose backstop expired in pardiag's teardown: the threads
# newest first, the main thread ("Current thread") last, each innermost frame first
BACKSTOP = """Timeout (0:05:00)!
Thread 0x00007fbc277546c0 (most recent call first):
  File "/py/threading.py", line 331 in wait
  File "/py/threading.py", line 1002 in _bootstrap

Current thread 0x00007fbc4ebbfb80 (most recent call first):
  File "/site/pardiag/collectors/rank_entry.py", line 735 in _run_script
  File "/site/pardiag/collectors/rank_entry.py", line 961 in main
  File "<frozen runpy>", line 88 in _run_code
"""

# SIGUSR1's dump of a rank stuck in torch, called from the user's script
SIGUSR1 = """Thread 0x00007fbc277546c0 (most recent call first):
  File "/py/threading.py", line 331 in wait

Current thread 0x00007fbc4ebbfb80 (most recent call first):
  File "/t/torch/distributed/distributed_c10d.py", line 2093 in destroy_process_group
  File "/w/train.py", line 17 in main
  File "/w/train.py", line 20 in <module>
  File "<frozen runpy>", line 88 in _run_code
"""


def test_the_main_thread_is_placed_in_the_users_script_too():
    assert _main_thread_at(SIGUSR1, "/w/train.py") == (
        'File "/t/torch/distributed/distributed_c10d.py", line 2093 in destroy_process_group, '
        'called from File "/w/train.py", line 17 in main')
    assert _main_thread_at(SIGUSR1) == (
        'File "/t/torch/distributed/distributed_c10d.py", line 2093 in destroy_process_group')
    # no frame of the script on the stack (pardiag's own teardown): the innermost frame alone
    assert _main_thread_at(BACKSTOP, "/w/train.py") == (
        'File "/site/pardiag/collectors/rank_entry.py", line 735 in _run_script')
    assert _main_thread_at("Thread 0x1 (most recent call first):\n  <no Python frame>\n") is None


def test_a_rank_that_stopped_itself_says_so_and_where(tmp_path):
    (tmp_path / "pardiag").mkdir()
    layout.stacks_path(tmp_path, 1).write_text(BACKSTOP)
    layout.stacks_path(tmp_path, 2).write_text(SIGUSR1)
    layout.stacks_path(tmp_path, 3).write_text("")   # asked, never answered
    lines = _stacks_lines(tmp_path, [0, 1, 2, 3], "/w/train.py")
    assert lines == [
        "rank 1: pardiag's work after the script did not end within 300 s and the rank stopped "
        "itself; its main thread was at File "
        '"/site/pardiag/collectors/rank_entry.py", line 735 in _run_script (all threads: '
        f"{layout.stacks_path(tmp_path, 1)})",
        'rank 2\'s main thread was at File "/t/torch/distributed/distributed_c10d.py", line 2093 '
        'in destroy_process_group, called from File "/w/train.py", line 17 in main (all '
        f"threads: {layout.stacks_path(tmp_path, 2)})"]


# ---- end to end: pardiag profile never changes how a script ends --------------------------

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

from pardiag.collectors.launch import _alive, _descendants  # noqa: E402

from .paths import REPO  # noqa: E402

EXAMPLE = REPO / "examples" / "train_ddp.py"


def _profile(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "pardiag", "profile", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, **(env or {})})


# one rank, gloo: DDP over a subgroup; both groups destroyed; the DDP freed by refcount
KEEP_GROUPS = """
import gc, sys, torch, torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from pardiag.collectors.rank_entry import _keep_destroyed_groups
kept = []
patched = _keep_destroyed_groups(kept)
assert dist.destroy_process_group is c10d.destroy_process_group
assert patched[0][0].destroy_process_group is c10d.destroy_process_group
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
world = c10d._get_default_group()
sub = dist.new_group([0])
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4), process_group=sub)
model(torch.randn(2, 4)).sum().backward()
dist.destroy_process_group(sub)
assert [id(g) for g in kept] == [id(sub)] and sub not in c10d._world.pg_names
dist.destroy_process_group()
assert sorted(map(id, kept)) == sorted(map(id, [sub, world])) and not c10d._world.pg_names
del model, sub, world
gc.collect()
assert [g.size() for g in kept] == [1, 1]    # alive: the reducer was not their last owner
for mod, name, orig in patched:
    setattr(mod, name, orig)
assert dist.destroy_process_group is c10d.destroy_process_group is orig
print("ok")
"""


@pytest.mark.e2e
def test_destroyed_process_groups_outlive_the_scripts_objects(tmp_path):
    """The groups a script destroys are held until the process ends (each time it destroys
    them: the group, or the whole registry when it destroys the world), so that freeing the script's
    DDP never runs gloo's destructor, which joins worker threads that may wait for the
    interpreter lock; the registry is emptied as torch does it, and the original function
    comes back when pardiag restores it."""
    res = subprocess.run([sys.executable, "-c", KEEP_GROUPS, str(tmp_path / "store")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


@pytest.mark.e2e
def test_ddp_that_destroys_its_process_group_ends_by_itself(tmp_path):
    """A DDP script that ends with dist.destroy_process_group(), pinned: it hung at exit in
    about one run of three when pardiag freed the script's objects (a DDP reducer's gloo group
    joining its worker thread, which waited for the interpreter lock). Three runs: each ends
    by itself, exit 0, with both ranks' files and nothing stopped."""
    for i in range(3):
        out = tmp_path / f"o{i}"
        res = _profile("--nproc-per-node", 2, "--pin-cpu", "--timeout", 150, "--out", out,
                       EXAMPLE, "--", "--steps", 24, "--destroy")
        assert res.returncode == 0, res.stderr[-3000:]
        assert "hang" not in res.stderr and "did not finish" not in res.stderr, res.stderr[-3000:]
        assert sorted(p.name for p in (out / "pardiag").glob("rank*.meta.json")) == [
            "rank0.meta.json", "rank1.meta.json"]


@pytest.mark.e2e
def test_a_rank_stuck_after_its_script_stops_itself_and_says_where(tmp_path):
    """The backstop of pardiag's work after the script: a rank stuck there holding the
    interpreter lock (here the script has replaced what the final wait calls) ends itself
    when the part's limit passes; its files were written, so the script's exit code (0)
    stands, and one line names the frame it was stuck in, in the user's script."""
    script = tmp_path / "stuck_at_end.py"
    script.write_text(
        "import ctypes, torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "m = torch.nn.Linear(4, 4)\nopt = torch.optim.SGD(m.parameters(), 0.1)\n"
        "for step in range(6):\n    m(torch.randn(2, 4)).sum().backward()\n    opt.step()\n"
        "dist.distributed_c10d._get_default_store = lambda: ctypes.PyDLL(None).sleep(600)\n")
    res = _profile("--out", tmp_path / "o", script, env={"PARDIAG_TEARDOWN_PART_S": "3"},
                   timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(ln for ln in res.stderr.splitlines() if "stopped itself" in ln)
    assert line.startswith("pardiag: hang at exit: rank 0: pardiag's work after the script did "
                           "not end within 3 s and the rank stopped itself after writing its "
                           f'files; its main thread was at File "{script}", line 8 in <lambda>')
    assert (tmp_path / "o" / "rank0.trace.json.gz").is_file()


@pytest.mark.e2e
def test_ctrl_c_during_a_hang_at_exit_leaves_no_process_and_says_what_is_kept(tmp_path):
    """Ctrl-C while both ranks hang after their script, holding the interpreter lock (they
    cannot take the SIGTERM torchrun passes on): every process of the job is gone after
    pardiag exits (130), and the last line names both traces on disk, whose ranks wrote no
    metadata."""
    script = tmp_path / "hang_at_end.py"
    # SIGTERM blocked, then a native call that holds the lock: as a deadlocked rank, it never
    # takes the SIGTERM torchrun passes on
    script.write_text("import ctypes, signal, torch\nm = torch.nn.Linear(4, 4)\n"
                      "opt = torch.optim.SGD(m.parameters(), 0.1)\n"
                      "for step in range(6):\n    m(torch.randn(2, 4)).sum().backward()\n"
                      "    opt.step()\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
                      "ctypes.PyDLL(None).sleep(600)\n")
    out = tmp_path / "o"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pardiag", "profile", "--nproc-per-node", "2", "--out", str(out),
         str(script)], cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    job: set[int] = set()
    try:
        deadline = time.time() + 180
        while not all((out / f"rank{r}.trace.json.gz").exists() for r in (0, 1)):
            assert proc.poll() is None and time.time() < deadline
            job.update(_descendants(proc.pid))
            time.sleep(0.2)
        time.sleep(2.0)
        job.update(_descendants(proc.pid))
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert len(job) >= 3   # torchrun and its two ranks at least
    assert [p for p in job if _alive(p)] == []
    assert err.splitlines()[-1] == (f"pardiag: interrupted: the job was stopped; {out} keeps the "
                                    f"traces of rank(s) 0, 1; rank(s) 0, 1 stopped before "
                                    f"writing their metadata (rank(s) 0, 1 keep what it held "
                                    f"when the profiling window closed)")
    # the report reads what the ranks recorded when their window closed
    rep = pardiag.analyze(out)
    assert [w for w in rep.warnings if "did not finish:" in w] == [
        f"rank {r} did not finish: its settings and memory are those recorded when its "
        f"profiling window closed (after 5 optimizer steps; rank{r}.meta.window.json)"
        for r in (0, 1)]
    assert all(m.status == "running" for m in rep.traces.rank_meta.values())


def test_a_lost_peer_in_a_job_being_stopped_is_the_stop(monkeypatch):
    """Ctrl-C stops one rank first; the other's collective fails ("Connection closed by peer")
    before its own SIGTERM is taken: it was stopped, the first error said with it (exit 143).
    Without a SIGTERM the error stands; other errors always stand."""
    import types

    from pardiag.collectors import rank_entry as re_

    monkeypatch.setattr(re_, "PEER_LOST_WAIT_S", 0.1)
    lost = RuntimeError("[/x/pair.cc:553] Connection closed by peer [127.0.0.1]:58531. GLHF")
    run = types.SimpleNamespace(error=lost, terminated=True)
    re_._stopped_after_peer_loss(run)
    assert isinstance(run.error, re_._Terminated)
    assert re_._exit_code_of(run.error) == 143
    assert str(run.error).startswith("stopped by SIGTERM") and "Connection closed by peer" in str(
        run.error)
    alone = types.SimpleNamespace(error=lost, terminated=False)
    re_._stopped_after_peer_loss(alone)
    assert alone.error is lost
    own = types.SimpleNamespace(error=ValueError("bad batch"), terminated=True)
    re_._stopped_after_peer_loss(own)
    assert isinstance(own.error, ValueError)
