"""The command line as a user runs it: outputs, exit codes, one-line errors."""

import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from pardiag import layout
from pardiag.cli import cli, main

from .paths import REPO
from .synth import cpu_rank, gpu_rank

SAMPLE = REPO / "sample_traces" / "ddp_cpu_2rank"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_every_command_has_help():
    for name, cmd in cli.commands.items():
        assert cmd.help and len(cmd.help.strip()) > 20, name
        res = run(name, "--help")
        assert res.exit_code == 0 and "Usage:" in res.output


def test_report_on_sample_traces(tmp_path):
    out, js = tmp_path / "report.html", tmp_path / "summary.json"
    res = run("report", SAMPLE, "-o", out, "--json", js)
    assert res.exit_code == 0, res.output
    page = out.read_text()
    for section in ("Run summary", "Time breakdown per rank", "Overlap per rank",
                    "Per profiler step", "Collectives", "Warnings and notes"):
        assert section in page
    # offline: plotly.js inlined (gzip + base64, unpacked by the page), no script from the network
    assert 'id="pd-plotlyjs"' in page and 1_500_000 < out.stat().st_size < 3_000_000
    assert re.search(r"<script[^>]*\bsrc=", page) is None
    data = json.loads(js.read_text())
    assert data["schema_version"] == 3
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    for r in data["ranks"]:
        t = r["total"]
        assert set(t) >= {"compute_us", "comm_us", "overlap_us", "exposed_comm_us", "idle_us",
                          "overlap_pct"}
        assert r["domain"] == "cpu"
        assert len(r["steps"]) == 3                      # --active 3
        assert t["comm_us"] > 0 and t["compute_us"] > 0  # gloo all-reduce and CPU compute
        assert [c["collective"] for c in r["collectives"]] == ["all_reduce"]
    assert data["run"]["world_size"] == 2
    assert "rank 0" in res.output or "│    0 │" in res.output


def test_cdn_option_links_plotly(tmp_path):
    out = tmp_path / "r.html"
    assert run("report", SAMPLE, "-o", out, "--cdn", "-q").exit_code == 0
    page = out.read_text()
    assert re.search(r'<script[^>]*src="https://cdn\.plot\.ly/', page)
    assert out.stat().st_size < 200_000


def test_report_numbers_match_the_library(tmp_path):
    """The JSON carries exactly what the analysis computed for a planted trace."""
    gpu_rank(0).write(tmp_path / "r0.json")
    cpu_rank(1).write(tmp_path / "r1.json")
    js = tmp_path / "s.json"
    assert run("report", tmp_path, "-o", tmp_path / "r.html", "--json", js, "-q").exit_code == 0
    ranks = {r["rank"]: r for r in json.loads(js.read_text())["ranks"]}
    # the planted memcpy [80,90) runs alone: memory copies, not idle; idle 30 µs in step 1 and
    # 30 at the last step's end (it lasts as long as its host step)
    assert ranks[0]["total"]["overlap_us"] == 30.0 and ranks[0]["total"]["idle_us"] == 60.0
    assert ranks[0]["total"]["memory_only_us"] == 10.0 and ranks[1]["total"]["memory_only_us"] == 0
    assert ranks[1]["total"]["overlap_us"] == 18.0 and ranks[1]["total"]["exposed_comm_us"] == 17.0
    assert [s["step"] for s in ranks[0]["steps"]] == [1, 2]


def test_json_to_stdout(tmp_path):
    gpu_rank(0).write(tmp_path / "r0.json")
    res = CliRunner().invoke(cli, ["report", str(tmp_path), "-o", str(tmp_path / "r.html"),
                                   "--json", "-"])
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert data["ranks"][0]["total"]["comm_us"] == 70.0


def test_comm_kernel_option(tmp_path):
    from .synth import TraceBuilder
    b = TraceBuilder(rank=0)
    b.kernel("void gemm(float*)", 0, 10)
    b.kernel("my_custom_allreduce_kernel", 5, 10, stream=3)
    b.write(tmp_path / "t.json")
    js = tmp_path / "s.json"
    res = run("report", tmp_path, "-o", tmp_path / "r.html", "--json", js, "-q",
              "--comm-kernel", "custom_allreduce")
    assert res.exit_code == 0
    assert json.loads(js.read_text())["ranks"][0]["total"]["comm_us"] == 10.0


@pytest.mark.parametrize("make_input,expect", [
    (lambda d: d / "missing", "no such file or folder"),
    (lambda d: d, "no trace files"),
    (lambda d: (d / "a.json").write_text("{not json") and d / "a.json", "not valid JSON"),
    (lambda d: (d / "b.json").write_text('{"x": 1}') and d / "b.json", "not a Kineto trace"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, make_input, expect):
    target = make_input(tmp_path)
    res = subprocess.run([sys.executable, "-m", "pardiag", "report", str(target), "-o",
                          str(tmp_path / "r.html")], capture_output=True, text=True)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("pardiag: error: ") and expect in lines[0]
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "r.html").exists()


def test_invalid_regex_is_exit_2(tmp_path):
    gpu_rank(0).write(tmp_path / "r0.json")
    res = run("report", tmp_path, "--comm-kernel", "(", "-o", tmp_path / "r.html")
    assert res.exit_code == 2 and "invalid regular expression" in res.output


def test_unwritable_output_is_exit_2(tmp_path):
    gpu_rank(0).write(tmp_path / "r0.json")
    res = run("report", tmp_path, "-o", tmp_path / "no" / "such" / "dir" / "r.html")
    assert res.exit_code == 2 and "cannot write" in res.output


def test_partially_readable_folder_reports_with_warning(tmp_path):
    gpu_rank(0).write(tmp_path / "rank0.json")
    (tmp_path / "rank1.json").write_text('{"traceEvents": [')
    res = run("report", tmp_path, "-o", tmp_path / "r.html", "-q")
    assert res.exit_code == 0
    assert "pardiag: warning:" in res.output and "rank1.json: truncated" in res.output
    assert "rank1.json: truncated" in (tmp_path / "r.html").read_text()


def test_analyzer_needs_no_torch(tmp_path):
    """A report is built with torch made unimportable."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from pardiag.cli import main\n"
        f"sys.argv = ['pardiag', 'report', {str(SAMPLE)!r}, "
        f"'-o', {str(tmp_path / 'r.html')!r}, '-q']\n"
        "main()\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "r.html").stat().st_size > 1_000_000


def test_output_onto_an_input_is_refused(tmp_path):
    t = gpu_rank(0).write(tmp_path / "rank0.json")
    before = t.read_bytes()
    res = run("report", tmp_path, "-o", t)
    assert res.exit_code == 2 and "is one of the input traces" in res.output
    res = run("report", tmp_path, "--json", t)
    assert res.exit_code == 2
    assert t.read_bytes() == before


def test_a_file_pardiag_did_not_write_is_never_replaced(tmp_path):
    mine, notes = tmp_path / "report.html", tmp_path / "notes.json"
    mine.write_text("<html>mine</html>")
    notes.write_text('{"a": 1}')
    res = run("report", SAMPLE, "-o", mine, "-q")
    assert res.exit_code == 2 and res.output.strip() == (
        f"pardiag: error: {mine}: exists and is not a page pardiag wrote; choose another path "
        f"with -o (pardiag replaces only its own outputs)")
    res = run("report", SAMPLE, "-o", tmp_path / "r.html", "--json", notes, "-q")
    assert res.exit_code == 2 and "is not a JSON file pardiag wrote" in res.output
    res = run("compare", SAMPLE, SAMPLE, "-o", mine, "-q")
    assert res.exit_code == 2 and "is not a page pardiag wrote" in res.output
    assert mine.read_text() == "<html>mine</html>" and notes.read_text() == '{"a": 1}'
    # pardiag's own outputs (a page written before pages had a generator tag too) and empty
    # files are replaced
    page, js = tmp_path / "r.html", tmp_path / "s.json"
    assert run("report", SAMPLE, "-o", page, "--json", js, "-q").exit_code == 0
    assert b"<meta name='generator' content='pardiag" in page.read_bytes()
    page.write_bytes(page.read_bytes().replace(b"<meta name='generator'", b"<meta name='x'"))
    (tmp_path / "empty.json").write_text("")
    assert run("report", SAMPLE, "-o", page, "--json", tmp_path / "empty.json",
               "-q").exit_code == 0
    assert run("report", SAMPLE, "-o", page, "--json", js, "-q").exit_code == 0
    # merge: the same rule for its trace
    other = tmp_path / "mine.json.gz"
    other.write_bytes(b"not a trace")
    res = run("merge", SAMPLE, "-o", other)
    assert res.exit_code == 2 and "is not a trace pardiag merge wrote" in res.output
    assert other.read_bytes() == b"not a trace"
    merged = tmp_path / "merged.json.gz"
    assert run("merge", SAMPLE, "-o", merged).exit_code == 0
    assert run("merge", SAMPLE, "-o", merged).exit_code == 0


def test_usage_errors_are_one_line(tmp_path):
    for args in (["report"], ["report", str(tmp_path), "--bogus"], ["nosuchcommand"]):
        res = subprocess.run([sys.executable, "-m", "pardiag", *args], capture_output=True,
                             text=True)
        assert res.returncode == 2, args
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pardiag: error: "), res.stderr


def test_empty_comm_pattern_is_refused(tmp_path):
    gpu_rank(0).write(tmp_path / "r0.json")
    res = run("report", tmp_path, "--comm-kernel", ".*", "-o", tmp_path / "r.html")
    assert res.exit_code == 2 and "matches the empty string" in res.output


def test_failed_run_is_flagged_in_the_report(tmp_path):
    import shutil
    run_dir = tmp_path / "run"
    shutil.copytree(SAMPLE, run_dir)
    info = json.loads((run_dir / "pardiag" / "run.json").read_text())
    info.update(exit_code=1, failed_ranks={"1": "RuntimeError: boom"}, world_size=3)
    (run_dir / "pardiag" / "run.json").write_text(json.dumps(info))
    res = run("report", run_dir, "-o", tmp_path / "r.html", "-q")
    assert res.exit_code == 0
    for w in ("the profiled run exited with code 1", "rank 1 failed during the profiled run: "
              "RuntimeError: boom", "run.json says world size 3; no trace for rank(s) [2]"):
        assert w in res.output
        assert w in (tmp_path / "r.html").read_text()
    # a monitored run's deep capture carries the job's run file: how the job ended came after
    # the capture began
    info.update(monitor_every=10)
    (run_dir / "pardiag" / "run.json").write_text(json.dumps(info))
    res = run("report", run_dir, "-o", tmp_path / "r.html", "-q")
    for w in ("the monitored job exited with code 1, after this capture began",
              "rank 1 failed in the monitored job, after this capture began: "
              "RuntimeError: boom"):
        assert w in res.output
    # stopped by Ctrl-C (the launcher's own code, torchrun's too): interrupted; the ranks the
    # launcher stopped did not fail. So with SIGTERM to pardiag profile
    for code, how in ((130, "Ctrl-C"), (143, "SIGTERM")):
        info.update(exit_code=code, torchrun_exit_code=code,
                    failed_ranks={"0": "stopped by SIGTERM (the launcher)"})
        (run_dir / "pardiag" / "run.json").write_text(json.dumps(info))
        res = run("report", run_dir, "-o", tmp_path / "r.html", "-q")
        assert f"the monitored job was interrupted ({how}, exit code {code}), after this " \
               f"capture began" in res.output
        assert "rank 0 failed" not in res.output and "exited with code" not in res.output, \
            res.output
    # torchrun's SIGTERM after a rank was killed (torchrun's own code 1): not interrupted
    info.update(exit_code=143, torchrun_exit_code=1)
    (run_dir / "pardiag" / "run.json").write_text(json.dumps(info))
    res = run("report", run_dir, "-o", tmp_path / "r.html", "-q")
    assert "the monitored job exited with code 143" in res.output


def test_malformed_sidecars_are_left_out_with_warnings(tmp_path):
    import shutil
    run_dir = tmp_path / "run"
    shutil.copytree(REPO / "sample_traces" / "pp_1f1b_cpu_2rank", run_dir)
    side = run_dir / "pardiag"
    comms = json.loads((side / "rank0.comms.json").read_text())
    comms["records"][0]["start_us"] = "x"
    del comms["records"][1]["seq"]
    (side / "rank0.comms.json").write_text(json.dumps(comms))
    pipe = json.loads((side / "rank1.pipeline.json").read_text())
    pipe["records"] = {"not": "a list"}
    (side / "rank1.pipeline.json").write_text(json.dumps(pipe))
    (side / "rank0.pipeline.json").write_text("{broken")
    res = run("report", run_dir, "-o", tmp_path / "r.html", "-q")
    assert res.exit_code == 0, res.output
    assert "rank0.comms.json: left out 2 malformed 'records' entries" in res.output
    assert "rank1.pipeline.json: 'records' is not a list; the file is ignored" in res.output
    assert "rank0.pipeline.json: unreadable pardiag sidecar, ignored" in res.output


def _user_files(folder):
    """Every file under ``folder`` and its bytes, pardiag's summary cache (``.pardiag-cache/``,
    written by any report that loaded the traces) left out."""
    return {f: f.read_bytes() for f in folder.rglob("*")
            if f.is_file() and layout.SUMMARY_DIR not in f.parts}


def test_no_file_of_an_input_folder_is_overwritten(tmp_path):
    """run.json, a rank sidecar, a hard link to a trace, or one path for both outputs: refused
    with one line and exit 2, the files untouched."""
    import os
    import shutil
    run = tmp_path / "run"
    shutil.copytree(REPO / "sample_traces" / "ddp_cpu_2rank", run)
    before = _user_files(run)
    os.link(run / "rank0.trace.json.gz", tmp_path / "hard.json.gz")
    for args, msg in (
            (["-o", str(run / "pardiag" / "run.json")], "run.json: would overwrite"),
            (["-o", str(tmp_path / "r.html"), "--json", str(run / "pardiag" / "rank0.meta.json")],
             "rank0.meta.json: would overwrite"),
            (["-o", str(tmp_path / "hard.json.gz")], "hard.json.gz: would overwrite"),
            (["-o", str(tmp_path / "same"), "--json", str(tmp_path / "same")],
             "given for both the HTML report and --json")):
        res = subprocess.run([sys.executable, "-m", "pardiag", "report", str(run), "-q", *args],
                             capture_output=True, text=True)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert msg in lines[-1] and "Traceback" not in res.stderr
    assert _user_files(run) == before


def test_a_report_run_twice_inside_its_run_folder_replaces_its_own_outputs(tmp_path):
    """`pardiag report .` inside a run folder, twice: the second replaces the page and the JSON
    the first wrote there (they are no input); the user's own page in the folder, a sidecar and
    a trace are still refused, untouched."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(REPO / "sample_traces" / "ddp_cpu_2rank", run)
    cmd = [sys.executable, "-m", "pardiag", "report", ".", "-q", "--json", "summary.json"]
    for _ in range(2):
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=run)
        assert res.returncode == 0, res.stderr
        assert "<meta name='generator' content='pardiag" in (run / "report.html").read_text()
        assert json.loads((run / "summary.json").read_text())["schema_version"]
    (run / "mine.html").write_text("<html>my notes</html>")
    before = _user_files(run)
    for args, msg in ((["-o", "mine.html"], "mine.html: would overwrite"),
                      (["-o", "r.html", "--json", "pardiag/rank1.meta.json"],
                       "rank1.meta.json: would overwrite"),
                      (["-o", "rank0.trace.json.gz"], "is one of the input traces")):
        res = subprocess.run([sys.executable, "-m", "pardiag", "report", ".", "-q", *args],
                             capture_output=True, text=True, cwd=run)
        assert res.returncode == 2 and msg in res.stderr.strip().splitlines()[-1], res.stderr
    assert _user_files(run) == before


def test_another_runs_sidecar_is_no_output_to_replace(tmp_path):
    """--json or -o naming a sidecar of a folder that is not an input (the monitored run around
    a reported capture, another run): refused in one line, the file untouched; two monitored
    runs in one report: one line naming what to run instead."""
    import shutil
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(REPO / "sample_traces" / "ddp_cpu_2rank", a)
    shutil.copytree(REPO / "sample_traces" / "ddp_slowrank1_cpu_2rank", b)
    before = _user_files(b)
    for args in (["-o", str(tmp_path / "r.html"), "--json", str(b / "pardiag" / "run.json")],
                 ["-o", str(b / "pardiag" / "rank0.meta.json")]):
        res = subprocess.run([sys.executable, "-m", "pardiag", "report", str(a), "-q", *args],
                             capture_output=True, text=True)
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip().splitlines()[-1].endswith(
            "is a run's own file (a pardiag sidecar), not an output; choose another path with "
            + ("--json" if "--json" in args else "-o")), res.stderr
    assert _user_files(b) == before
    for run in (a, b):
        (run / "pardiag" / "rank0.monitor.jsonl").write_text("")
        for t in run.glob("rank*.trace.json.gz"):
            t.unlink()
    res = subprocess.run([sys.executable, "-m", "pardiag", "report", str(a), str(b), "-q"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip() == (
        f"pardiag: error: {a}: a monitored run is reported on its own (pardiag report {a}); "
        "pardiag compare A B sets two runs side by side"), res.stderr


def test_a_report_json_in_the_run_folder_is_not_taken_for_a_trace(tmp_path):
    """`report --json` written into the run folder: the next report skips it without a warning;
    named as the input, it is refused in one line."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(REPO / "sample_traces" / "ddp_cpu_2rank", run)
    cmd = [sys.executable, "-m", "pardiag", "report", str(run), "-q", "-o",
           str(tmp_path / "r.html")]
    assert subprocess.run([*cmd, "--json", str(run / "summary.json")]).returncode == 0
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0 and "summary.json" not in res.stderr, res.stderr
    res = subprocess.run([sys.executable, "-m", "pardiag", "report", str(run / "summary.json"),
                          "-q", "-o", str(tmp_path / "s.html")], capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip() == (f"pardiag: error: {run / 'summary.json'}: not a Kineto trace "
                                  "(a pardiag report's JSON)")


@pytest.mark.parametrize("args", [["--help"], ["report", "--help"], ["profile", "--help"],
                                  ["compare", "--help"], ["--version"]])
def test_help_imports_no_analysis_code(args):
    """Asking for help starts fast: no pandas, plotly, numpy, torch or analysis code is
    imported (each command imports what it needs when it runs)."""
    code = ("import sys\n"
            f"sys.argv = ['pardiag', *{args!r}]\n"
            "from pardiag.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "heavy = ('pandas', 'plotly', 'numpy', 'torch', 'pardiag.analyzer.analyses',\n"
            "         'pardiag.analyzer.render', 'pardiag.analyzer.report')\n"
            "print(sorted(m for m in heavy if m in sys.modules), file=sys.stderr)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.stderr.strip().splitlines()[-1] == "[]", res.stderr


def test_report_loads_no_figure_objects(tmp_path):
    """A report writes its figures as plotly figure dicts: once the page template is in the
    user's cache (the first report puts it there), it imports neither plotly's figure objects
    (their validators cost a quarter of a small report) nor the comparison's code, nor rich
    when the terminal summary is not printed."""
    code = ("import sys\n"
            f"sys.argv = ['pardiag', 'report', {str(REPO / 'sample_traces' / 'ddp_cpu_2rank')!r},\n"
            f"            '-o', {str(tmp_path / 'r.html')!r}, '--no-cache', '-q']\n"
            "from pardiag.cli import main\n"
            "code = main()\n"
            "heavy = ('plotly.basedatatypes', 'plotly.graph_objs', 'plotly.subplots',\n"
            "         'pardiag.analyzer.render.comparison', 'rich.console')\n"
            "print(code, sorted(m for m in heavy if m in sys.modules), file=sys.stderr)\n")
    env = {**os.environ, "PARDIAG_CACHE_DIR": str(tmp_path / "cache")}
    first, second = (subprocess.run([sys.executable, "-c", code], capture_output=True,
                                    text=True, timeout=120, env=env) for _ in range(2))
    assert first.stderr.strip().splitlines()[-1].startswith("0 "), first.stderr
    assert second.stderr.strip().splitlines()[-1] == "0 []", second.stderr
    assert (tmp_path / "r.html").stat().st_size > 1_000_000   # plotly.js inlined


def test_analysis_commands_store_text_as_python_strings_and_restore_the_setting(
        tmp_path, monkeypatch):
    """report builds its tables with pandas' Python string storage (python_strings) and leaves
    the caller's setting as it was."""
    import pandas as pd

    import pardiag.api as api  # report calls pardiag.analyze, which builds the report

    seen = []
    real = api.build_report

    def spy(traces, *a, **kw):
        seen.append((pd.get_option("mode.string_storage"), type(pd.Series(["x"]).array).__name__))
        return real(traces, *a, **kw)

    monkeypatch.setattr(api, "build_report", spy)
    before = pd.get_option("mode.string_storage")
    gpu_rank(0).write(tmp_path / "r0.json")
    assert run("report", tmp_path, "-o", tmp_path / "r.html", "-q").exit_code == 0
    assert seen and seen[0][0] == "python"
    if pd.Series(["x"]).dtype != object:  # pandas >= 3 infers text columns as str
        assert seen[0][1] == "StringArray"
    assert pd.get_option("mode.string_storage") == before


def test_the_command_line_reports_without_pyarrow_and_writes_the_same_json(tmp_path):
    """`pardiag report` keeps pyarrow out of its process (keep_pyarrow_out) and writes the JSON
    that the same report written in a process with pyarrow loaded has."""
    sample = REPO / "sample_traces" / "ddp_cpu_2rank"
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('pyarrow module:', sys.modules.get('pyarrow')))\n"
            "from pardiag.cli import run\n"
            "run()\n")
    out = subprocess.run([sys.executable, "-c", code, "report", str(sample), "--no-cache", "-q",
                          "-o", str(tmp_path / "a.html"), "--json", str(tmp_path / "a.json")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "pyarrow module: None" in out.stdout
    assert run("report", sample, "--no-cache", "-q", "-o", tmp_path / "b.html",
               "--json", tmp_path / "b.json").exit_code == 0
    a, b = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ab")
    assert a == b


def test_pyarrow_is_kept_out_only_for_analysis_commands_before_pandas_loads():
    from pardiag.cli import ANALYSIS_COMMANDS, keep_pyarrow_out

    assert ANALYSIS_COMMANDS == {"report", "compare", "merge", "summarize"}
    assert "pandas" in sys.modules  # this test process: nothing may change
    before = sys.modules.get("pyarrow")
    for argv in (["report", "x"], ["-q", "compare", "a", "b"], ["profile", "t.py"], []):
        assert keep_pyarrow_out(argv) is False
        assert sys.modules.get("pyarrow") is before


def test_report_calls_analyze_and_checks_its_outputs_before_the_analyses(tmp_path, monkeypatch):
    """``pardiag report`` is :func:`pardiag.analyze` with the command line's checks: an output
    onto an input trace is refused once the traces are loaded, before any analysis runs, and
    an analysis that fails is one line naming the traces (exit code 1)."""
    import pardiag.api as api

    calls = []

    def failing(traces, *a, **kw):
        calls.append(traces.source)
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "build_report", failing)
    trace = gpu_rank(0).write(tmp_path / "rank0.json")
    res = run("report", tmp_path, "-o", trace, "-q")
    assert res.exit_code == 2 and "is one of the input traces" in res.output and not calls
    res = run("report", tmp_path, "-o", tmp_path / "r.html", "-q")
    assert res.exit_code == 1 and calls == [str(tmp_path)]
    assert res.output.strip().splitlines()[-1] == (
        f"pardiag: error: {tmp_path}: analysis failed (RuntimeError: boom); set "
        "PARDIAG_DEBUG=1 for the traceback")


def test_the_first_failure_leads_not_the_lowest_rank(tmp_path):
    """Rank 1 raised first and took rank 0 down ("Connection closed"): the report's warnings
    and the verdict lead with rank 1's error, the one ``pardiag profile`` named first, by when
    each rank ended (its metadata)."""
    import shutil
    run_dir = tmp_path / "run"
    shutil.copytree(SAMPLE, run_dir)
    side = run_dir / "pardiag"
    info = json.loads((side / "run.json").read_text())
    info.update(exit_code=1, failed_ranks={
        "0": "RuntimeError: [gloo] Connection closed by peer", "1": "ValueError: bad batch"})
    (side / "run.json").write_text(json.dumps(info))
    for r, ended in ((0, 2000.5), (1, 2000.0)):
        meta = json.loads((side / f"rank{r}.meta.json").read_text())
        meta.update(ended_unix=ended, status="error", exit_code=1)
        (side / f"rank{r}.meta.json").write_text(json.dumps(meta))
    js = tmp_path / "s.json"
    res = run("report", run_dir, "-o", tmp_path / "r.html", "--json", js, "-q")
    assert res.exit_code == 0, res.output
    warnings = json.loads(js.read_text())["warnings"]
    failed = [w for w in warnings if " failed" in w and "profiled run" in w]
    assert failed == ["rank 1 failed first during the profiled run: ValueError: bad batch",
                      "rank 0 failed during the profiled run: RuntimeError: [gloo] Connection "
                      "closed by peer"]
    verdict = json.loads(js.read_text())["verdict"]
    assert ("The run failed: rank 1 failed first: ValueError: bad batch; rank 0 failed: "
            "RuntimeError: [gloo] Connection closed by peer") in json.dumps(verdict)


def test_bare_pardiag_prints_its_help(capsys):
    """``pardiag`` alone shows its commands on standard output and exits 0, as ``--help`` does,
    not as an error line."""
    assert main([]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("Usage: pardiag [OPTIONS] COMMAND [ARGS]...")
    assert "report" in out.out and "profile" in out.out and out.err == ""


def test_a_limit_that_is_no_positive_time_is_one_line(tmp_path):
    """--timeout of 0, --stall-timeout under 2 s (ranks say they progressed once a second), or
    either not finite: one line naming the option, exit code 2, nothing started."""
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    for opt, value, said in (
            ("--timeout", "0", "must be > 0 seconds, got 0.0"),
            ("--timeout", "nan", "must be > 0 seconds, got nan"),
            ("--stall-timeout", "1.5", "must be at least 2 seconds (each rank says it made "
             "progress once a second), got 1.5"),
            ("--stall-timeout", "inf", "must be at least 2 seconds (each rank says it made "
             "progress once a second), got inf")):
        res = run("profile", script, "--out", tmp_path / "o", opt, value)
        assert res.exit_code == 2 and res.output.strip() == f"pardiag: error: {opt} {said}", \
            res.output
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("json_out", [None, "-"])
def test_a_reader_that_stops_early_changes_nothing(tmp_path, json_out):
    """``pardiag report … | head``: stdout is a pipe whose reader is gone before the first
    write. The report is still written, the exit code is 0 and stderr holds no traceback."""
    read, write = os.pipe()
    os.close(read)
    page, js = tmp_path / "r.html", tmp_path / "r.json"
    args = [sys.executable, "-m", "pardiag", "report", str(SAMPLE), "-o", str(page),
            "--json", json_out or str(js)]
    try:
        res = subprocess.run(args, stdout=write, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith(f"pardiag: wrote {page}")
    assert page.stat().st_size > 1_000_000
    if json_out is None:
        assert json.loads(js.read_text())["source"]
