"""Per-rank summaries: a report built from summaries equals the report built from raw traces."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from benchmarks.synth_run import write_run
from pardiag.analyzer.per_rank import REDUCER
from pardiag.analyzer.per_rank import store as sm
from pardiag.analyzer.report.registry import build_report, report_json
from pardiag.analyzer.trace import load_traces
from pardiag.analyzer.trace.traceset import (
    ColumnTable,
    frame_json,
    stack_by_rank,
    table_from_columns,
)

from .paths import REPO


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PARDIAG_CACHE_DIR", str(tmp_path / "user-cache"))


def _json(traces) -> dict:
    return orjson.loads(orjson.dumps(report_json(build_report(traces)),
                                     option=orjson.OPT_SERIALIZE_NUMPY, default=str))


def test_16_rank_report_from_summaries_equals_report_from_raw(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run", ranks=16, mb=0.05, layers=8)
    raw = _json(load_traces(run))
    # summarize in two shards, as two torchrun processes would
    from pardiag import cli

    for shard in ("0/2", "1/2"):
        monkeypatch.setattr(sys, "argv", ["pardiag", "summarize", str(run), "--shard", shard])
        assert cli.main() == 0
    err = capsys.readouterr().err
    assert "summarized 8 trace(s) (shard 0/2), 0 already current" in err
    assert "summarized 8 trace(s) (shard 1/2), 0 already current" in err
    assert len(list((run / ".pardiag-cache").iterdir())) == 16
    ts = load_traces(run, reducer=REDUCER, cache=True)
    assert not any(t.events_loaded for t in ts.ranks.values())
    from_summaries = _json(ts)
    assert not any(t.events_loaded for t in ts.ranks.values())  # no raw trace was opened
    assert from_summaries == raw
    # the numbers are real: 16 ranks with steps, collectives matched across all of them
    assert len(raw["ranks"]) == 16 and all(len(r["steps"]) >= 1 for r in raw["ranks"])
    assert {i["ranks"] for i in raw["sync"]["instances"]} == {16}


def test_cpu_run_with_sidecars_from_summaries_equals_raw(tmp_path):
    src = REPO / "sample_traces" / "pp_1f1b_cpu_4rank"
    run = tmp_path / "pp"
    shutil.copytree(src, run)
    raw = _json(load_traces(run))
    load_traces(run, reducer=REDUCER, cache=True)
    ts = load_traces(run, reducer=REDUCER, cache=True)
    assert not any(t.events_loaded for t in ts.ranks.values())
    assert _json(ts) == raw


def test_summary_json_round_trip_is_exact(tmp_path):
    run = write_run(tmp_path / "run", ranks=2, mb=0.02, layers=8)
    t = load_traces(run).ranks[1]
    s = sm.summarize_trace(t)
    back = sm.from_json(sm.to_json(s))
    assert back.parts.k.tobytes() == s.parts.k.tobytes()
    assert back.parts.c.tobytes() == s.parts.c.tobytes()
    assert back.parts.step_windows == s.parts.step_windows
    assert back.comm.equals(s.comm) and back.steps.equals(s.steps)
    assert back.memory.equals(s.memory)
    assert (back.n_events, back.has_gpu, back.dist_rank) == (len(t.events), True, 1)
    # the launch edges after each communication kernel (NaN where no computation follows)
    a, b = s.launch_edges, back.launch_edges
    assert len(a.after_comm) > 0 and a.after_comm.shape[1] == 3
    assert np.array_equal(a.after_comm, b.after_comm, equal_nan=True)
    assert np.array_equal(a.host_syncs, b.host_syncs) and a.latency_us == b.latency_us


def test_summary_tables_are_built_when_first_read(tmp_path):
    """A summary read from JSON holds its tables as columns until one is read; then the table
    equals the one written, is built once, and survives pickling (worker processes)."""
    import pickle

    run = write_run(tmp_path / "run", ranks=2, mb=0.02, layers=8)
    s = sm.summarize_trace(load_traces(run).ranks[1])
    back = sm.from_json(sm.to_json(s))
    for name in ("comm", "steps", "memory", "operators", "causes"):
        assert type(back.stored(name)) is ColumnTable, name
    assert type(back.parts.__dict__["_held_comm_events"]) is ColumnTable
    again = pickle.loads(pickle.dumps(back))
    assert type(again.stored("comm")) is ColumnTable
    for name in ("comm", "steps", "memory", "operators", "causes"):
        built = getattr(back, name)
        assert built.equals(getattr(s, name)), name
        assert getattr(back, name) is built and back.stored(name) is not built
        assert getattr(again, name).equals(built), name
    assert back.parts.comm_events.drop(columns="args").equals(s.parts.comm_events.drop(
        columns=["args", "issuer_record"], errors="ignore").reset_index(drop=True))
    assert back.parts.comm_events["args"].isna().all()


def _column_table(df):
    doc = orjson.loads(orjson.dumps(frame_json(df), option=orjson.OPT_SERIALIZE_NUMPY))
    return ColumnTable(doc["columns"], doc["dtypes"], doc["data"])


def test_stacking_column_tables_gives_the_concatenated_frames():
    """Column tables of ranks stacked as joined lists give the table pandas' concat of the
    ranks' own tables gives: an integer column missing a value on one rank turns float on all,
    a text column all missing on one rank (object there) and a mix with DataFrames fall back to
    concat."""
    import pandas as pd

    a = pd.DataFrame({"seq": [1, 2], "pg": ["0", "1"], "start_us": [1.5, 2.5],
                      "peer": [None, 3], "ok": [True, False]})
    b = pd.DataFrame({"seq": [3], "pg": ["2"], "start_us": [np.nan], "peer": ["x"],
                      "ok": [True]})
    c = a.assign(seq=[4.0, np.nan])  # float in JSON: a missing value
    tables = [(0, _column_table(a)), (1, _column_table(b)), (5, _column_table(c))]
    expected = pd.concat([t.frame().assign(rank=r) for r, t in tables], ignore_index=True)
    got = stack_by_rank(tables)
    pd.testing.assert_frame_equal(got, expected)
    assert got["seq"].dtype == np.float64 and got["rank"].tolist() == [0, 0, 1, 5, 5]
    blank = b.assign(pg=[None])
    tables = [(0, _column_table(a)), (1, _column_table(blank))]
    expected = pd.concat([t.frame().assign(rank=r) for r, t in tables], ignore_index=True)
    pd.testing.assert_frame_equal(stack_by_rank(tables), expected)
    mixed = [(0, _column_table(a)), (1, b)]
    pd.testing.assert_frame_equal(stack_by_rank(mixed), pd.concat(
        [a.assign(rank=0), b.assign(rank=1)], ignore_index=True).astype({"seq": np.int64}))
    assert stack_by_rank([(0, _column_table(a.iloc[:0]))]) is None


def test_tables_without_rows_are_shared_but_never_changed_through_another(tmp_path):
    """Tables without rows (no all-to-all, no pipeline chunk or send) are built once per schema
    and handed out as copies: changing one rank's never changes another's, and each keeps the
    columns and types a table built afresh has."""
    run = write_run(tmp_path / "run", ranks=2, mb=0.02, layers=8)
    data = sm.to_json(sm.summarize_trace(load_traces(run).ranks[1]))
    a, b = sm.from_json(data), sm.from_json(data)
    d = orjson.loads(data)["quantities"]["a2a"]
    fresh = table_from_columns(d["columns"], d["dtypes"], d["data"])
    assert len(a.a2a) == 0 and a.a2a is not b.a2a
    assert list(a.a2a.columns) == list(fresh.columns) and a.a2a.dtypes.equals(fresh.dtypes)
    a.a2a["extra"] = 1
    a.marks.p2p.loc[0] = ["send", 1, 1, 0, 1.0, 2.0]
    assert "extra" not in b.a2a.columns and len(b.marks.p2p) == 0
    assert len(sm.from_json(data).marks.p2p) == 0


def test_summary_of_another_version_is_refused():
    with pytest.raises(ValueError, match="summary version 0"):
        sm.from_json(orjson.dumps({"kind": sm.SUMMARY_KIND, "version": 0}))
    with pytest.raises(ValueError, match="not a pardiag rank summary"):
        sm.from_json(b'{"traceEvents": []}')


def test_summarize_bad_shard_and_empty_folder(tmp_path, monkeypatch, capsys):
    from pardiag import cli

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "t.json").write_text('{"traceEvents": [')
    for args, msg in ((["summarize", str(tmp_path), "--shard", "2/2"], "--shard '2/2'"),
                      (["summarize", str(tmp_path)], "no trace files"),
                      (["summarize", str(bad / "t.json")],
                       f"{bad / 't.json'}: truncated (the file ends inside")):
        monkeypatch.setattr(sys, "argv", ["pardiag", *args])
        assert cli.main() == 2
        err = capsys.readouterr().err
        assert err.startswith("pardiag: error: ") and msg in err and len(err.splitlines()) == 1


def test_parallel_load_keeps_the_same_events(tmp_path):
    run = write_run(tmp_path / "run", ranks=3, mb=0.05, layers=8)
    seq = load_traces(run, workers=1)
    par = load_traces(run, workers=2)
    assert par.warnings == seq.warnings
    for r in (0, 1, 2):
        assert par.ranks[r].events_loaded  # parsed in a worker, handed back whole
        a, b = seq.ranks[r].events, par.ranks[r].events
        assert a.drop(columns="args").equals(b.drop(columns="args"))
        assert list(a["args"]) == list(b["args"])


@pytest.mark.parametrize("batch_bytes", [1, 10**9])
def test_worker_processes_give_results_in_file_order(tmp_path, monkeypatch, batch_bytes):
    """A process per file (a budget of 1 byte) or one batch of every file: the summaries of
    :func:`parse_files` are those of parsing in this process, in file order, and progress
    counts every file."""
    from pardiag.analyzer.trace import workers as load

    run = write_run(tmp_path / "run", ranks=4, mb=0.02, layers=8)
    files = sorted(run.glob("*.json*"))
    monkeypatch.setattr(load, "WORKER_BATCH_BYTES", batch_bytes)
    from pardiag.analyzer.trace import classify
    monkeypatch.setattr(classify, "_NAME_TESTS", {})
    seen = []
    par = load.parse_files(files, 2, lambda d, t: seen.append((d, t)), reducer=sm.REDUCER,
                           keep_events=False)
    # the workers' name tests came back: workers forked later start with them
    learned = classify.name_tests_known()
    assert "ProfilerStep#1" in learned["step"] and learned["step"]["ProfilerStep#1"] is True
    seq = load.parse_files(files, 1, None, reducer=sm.REDUCER, keep_events=False)
    assert [p.path for p in par] == files
    assert [sm.to_json(p.summary) for p in par] == [sm.to_json(p.summary) for p in seq]
    assert seen[-1] == (4, 4) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert len(seen) == (4 if batch_bytes == 1 else 1)


def test_a_worker_that_dies_or_fails_is_an_error(tmp_path, monkeypatch):
    """A worker killed (out of memory) gives a one-line error naming a file; an exception in a
    worker (a bug: :func:`parse_file` never raises for bad input) is raised here."""
    import os

    from pardiag.analyzer.trace import workers as load
    from pardiag.errors import PardiagError

    run = write_run(tmp_path / "run", ranks=2, mb=0.02, layers=8)
    files = sorted(run.glob("*.json*"))
    monkeypatch.setattr(load, "parse_file", lambda f, **kw: os._exit(9))
    monkeypatch.setattr(load, "WORKER_BATCH_BYTES", 1)   # a process per file
    # both die: whichever death is seen first is named
    with pytest.raises(PardiagError, match=r"a process parsing .*rank[01]\.pt\.trace\.json "
                                           r"died \(out of memory\?\); try fewer workers"):
        load.parse_files(files, 2, None)
    monkeypatch.setattr(load, "WORKER_BATCH_BYTES", 10**9)   # one batch: both files
    with pytest.raises(PardiagError, match=r"a process parsing .*rank0\.pt\.trace\.json and 1 "
                                           r"other file\(s\) after it died"):
        load.parse_files(files, 2, None)

    def broken(f, **kw):
        raise KeyError("a bug")

    monkeypatch.setattr(load, "parse_file", broken)
    with pytest.raises(KeyError, match="a bug"):
        load.parse_files(files, 2, None)


def _slow_parse_code(batch_bytes: int) -> str:
    """Code that makes every file's parse take 3 s more (so that a test can kill or interrupt
    its parent while workers parse and wait) with worker batches of ``batch_bytes``."""
    return ("import time\n"
            "from pardiag.analyzer.trace import workers as load\n"
            "real = load.parse_file\n"
            "def slow(f, **kw):\n"
            "    time.sleep(3)\n"
            "    return real(f, **kw)\n"
            "load.parse_file = slow\n"
            f"load.WORKER_BATCH_BYTES = {batch_bytes}\n")


def _children(pid: int, n: int) -> list:
    """The child processes of ``pid`` once there are ``n`` of them (at most 120 s)."""
    import time

    import psutil

    deadline = time.monotonic() + 120
    kids: list = []
    while len(kids) < n and time.monotonic() < deadline:
        time.sleep(0.1)
        kids = psutil.Process(pid).children()
    assert len(kids) == n
    return kids


def _none_left(kids: list) -> bool:
    """Whether every one of ``kids`` exits within 120 s (any left is killed)."""
    import psutil

    _, alive = psutil.wait_procs(kids, timeout=120)
    for p in alive:
        p.kill()
    return not alive


@pytest.mark.parametrize("batch_bytes,kids_alive", [(1_000_000, 2), (1, 4)])
def test_workers_exit_when_the_parent_is_killed(tmp_path, batch_bytes, kids_alive):
    """A parent killed while its workers parse (kill -9: nothing runs in it) leaves no worker
    behind: each pipe's only reader was the parent, so a worker's send fails and it exits,
    instead of blocking forever with its memory and the parent's output pipes. With a process
    per file, the two forked ahead and waiting to start exit too (their start pipe's only
    writer was the parent)."""
    import os
    import signal
    import subprocess

    run = write_run(tmp_path / "run", ranks=4, mb=0.3, layers=8)
    code = (_slow_parse_code(batch_bytes)   # the parent is killed while every worker parses
            + "import sys\n"
            "from pathlib import Path\n"
            "files = sorted(Path(sys.argv[1]).glob('*.json*'))\n"
            "load.parse_files(files, 2, None)\n")   # events kept: results beyond a pipe's buffer
    parent = subprocess.Popen([sys.executable, "-c", code, str(run)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kids = _children(parent.pid, kids_alive)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert _none_left(kids)


def test_spawned_workers_where_fork_is_not_available(tmp_path, monkeypatch):
    import multiprocessing as mp

    from pardiag.analyzer.trace import workers as load

    run = write_run(tmp_path / "run", ranks=3, mb=0.02, layers=8)
    files = sorted(run.glob("*.json*"))
    monkeypatch.setattr(mp, "get_all_start_methods", lambda: ["spawn"])
    par = load.parse_files(files, 2, None, reducer=sm.REDUCER, keep_events=False)
    seq = load.parse_files(files, 1, None, reducer=sm.REDUCER, keep_events=False)
    assert [sm.to_json(p.summary) for p in par] == [sm.to_json(p.summary) for p in seq]


def test_summary_made_by_other_code_is_refused(tmp_path):
    run = write_run(tmp_path / "run", ranks=1, mb=0.02, layers=8)
    s = sm.summarize_trace(load_traces(run).ranks[0])
    doc = orjson.loads(sm.to_json(s))
    assert doc["code"] == sm.code_fingerprint()
    doc["code"] = "0" * 16
    with pytest.raises(ValueError, match="another version of pardiag"):
        sm.from_json(orjson.dumps(doc))


def _analyzer_imports(module: str) -> set[str]:
    """The ``pardiag.analyzer`` modules ``module``'s source imports (relative imports resolved),
    at any depth of its code."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    pkg = module if spec.submodule_search_locations else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(Path(spec.origin).read_text())):
        if isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), pkg) \
                if node.level else node.module
            for a in node.names:   # "from . import whatif" names a module
                full = f"{base}.{a.name}"
                out.add(full if importlib.util.find_spec(base) and _is_module(full) else base)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m.startswith("pardiag.analyzer.")}


def _is_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_code_fingerprint_covers_every_module_the_summary_runs():
    """Every analyzer module that the store runs (what it imports, and what those import) is in
    the trace or per-rank stage, whose every file the fingerprint hashes: a summary's code cannot
    change without its fingerprint changing."""
    seen, todo = set(), ["pardiag.analyzer.per_rank.store"]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(x for x in _analyzer_imports(m) if not x.endswith(".__init__"))
    stages = {m.split(".")[2] for m in seen if m.count(".") >= 2}
    assert stages == {"trace", "per_rank"}, seen
    hashed = {p.stem for pkg in sm._CODE_PACKAGES
              for p in (Path(sm.__file__).resolve().parent.parent / pkg).glob("*.py")}
    assert {m.rsplit(".", 1)[1] for m in seen if m.count(".") == 3} <= hashed


def test_code_fingerprint_changes_with_any_module_of_the_two_stages(monkeypatch):
    """A change to any file of ``trace/`` or ``per_rank/`` (here: one byte read differently)
    changes the fingerprint; a file elsewhere does not enter it."""
    sm.code_fingerprint.cache_clear()
    base = sm.code_fingerprint()
    real = Path.read_bytes
    for changed, differs in (("memory.py", True), ("intervals.py", True), ("sync.py", False)):
        def read(self, _name=changed):
            return real(self) + (b"#" if self.name == _name else b"")
        monkeypatch.setattr(Path, "read_bytes", read)
        sm.code_fingerprint.cache_clear()
        assert (sm.code_fingerprint() != base) is differs, changed
        monkeypatch.undo()
    sm.code_fingerprint.cache_clear()
    assert sm.code_fingerprint() == base


def test_code_fingerprint_refuses_an_unreadable_module(monkeypatch):
    real = Path.read_bytes

    def read(self):
        if self.name == "parse.py":
            raise OSError(13, "Permission denied")
        return real(self)
    sm.code_fingerprint.cache_clear()
    monkeypatch.setattr(Path, "read_bytes", read)
    try:
        with pytest.raises(RuntimeError, match="parse.py: cannot read the source"):
            sm.code_fingerprint()
    finally:
        monkeypatch.undo()
        sm.code_fingerprint.cache_clear()
    assert len(sm.code_fingerprint()) == 16


@pytest.mark.parametrize("dtype", ["category", object])
def test_isin_mask_is_series_isin(dtype):
    """The categorical shortcut (one test per category, taken by code; a missing value is in
    nothing) gives ``Series.isin``'s answer, and so does a plain column."""
    from pardiag.analyzer.trace.traceset import isin_mask

    s = pd.Series(["kernel", "cpu_op", None, "gpu_memcpy", "cpu_op", "kernel"], dtype=dtype)
    for allowed in (["kernel"], {"cpu_op", "gpu_memcpy"}, [], ["absent"], frozenset({"kernel"})):
        got = isin_mask(s, allowed)
        assert got.dtype == bool
        assert got.tolist() == s.isin(list(allowed)).tolist()
    assert isin_mask(s, ["cpu_op", "kernel"]).tolist() == [True, True, False, False, True, True]
    assert isin_mask(s.iloc[:0], ["kernel"]).tolist() == []


def test_ctrl_c_stops_the_workers_with_one_line(tmp_path):
    """Ctrl-C (SIGINT to the whole process group) while two workers parse and two wait to start:
    `pardiag: aborted`, exit 130, no traceback from any worker, and no worker left."""
    import os
    import signal
    import subprocess

    run = write_run(tmp_path / "run", ranks=4, mb=0.3, layers=8)
    code = (_slow_parse_code(1)   # a process per file: two parse, two wait
            + "from pardiag.cli import run\n"
            "run()\n")
    parent = subprocess.Popen(
        [sys.executable, "-c", code, "report", str(run), "--no-cache", "-q", "--workers", "2",
         "-o", str(tmp_path / "r.html")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
        # SIGINT at its default, as a terminal gives it: a test worker that ignores SIGINT
        # passes that on to its children, and the report then never sees the Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    kids = _children(parent.pid, 4)
    os.killpg(parent.pid, signal.SIGINT)
    _, err = parent.communicate(timeout=120)
    assert parent.returncode == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1] == "pardiag: aborted"
    assert _none_left(kids)


def test_a_rank_of_several_windows_reads_the_same_from_its_summaries(tmp_path):
    """A rank whose profiling windows are files of their own: a second report (the windows'
    extents read from their summaries) places every event in the window the first report (from
    the events) did. The summary keeps each file's full extent (``events_range``): the span of
    its classified work alone is narrower, and a collective past it fell into the wrong window."""
    from .paths import REPROS

    case = REPROS / "h19_repeat_windows_per_rank"
    if not case.is_dir():
        pytest.skip("../shared/repros is not beside the checkout")
    run = tmp_path / "run"
    shutil.copytree(case, run)
    raw = report_json(build_report(load_traces(run, reducer=REDUCER, cache=False)))
    load_traces(run, reducer=REDUCER, cache=True)   # stores the summaries
    again = load_traces(run, reducer=REDUCER, cache=True)
    assert all(t.windows for t in again.ranks.values())
    cached = report_json(build_report(again))
    key = [(i["instance"], i["seq"]) for i in raw["sync"]["instances"]]
    assert [(i["instance"], i["seq"]) for i in cached["sync"]["instances"]] == key
    assert [k for k, _ in key] == ["g0,1|default_pg:w0:s3:0", "g0,1|default_pg:w0:s4:0",
                                   "g0,1|default_pg:w1:s8:0", "g0,1|default_pg:w1:s9:0"]
    assert cached["sync"] == raw["sync"]
