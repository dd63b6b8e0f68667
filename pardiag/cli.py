"""The ``pardiag`` command line: thin click commands over the library API."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from pathlib import Path

import click

from pardiag import layout
from pardiag.errors import Interrupted, PardiagError
from pardiag.version import __version__


class _FinitePct(click.FloatRange):
    """A percentage: a finite number ≥ 0 (``nan`` and ``inf`` are refused: no step time is
    slower than them)."""

    def convert(self, value, param, ctx):
        import math

        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return v


_FINITE_PCT = _FinitePct(min=0)


class _Cli(click.Group):
    """The command group; the one place where errors become exit codes: a
    :class:`~pardiag.errors.PardiagError` raised by any command is one line
    ``pardiag: error: <message>`` and its ``exit_code`` (2 for bad input), never a traceback;
    :class:`~pardiag.errors.Interrupted` is ``pardiag: interrupted: <message>`` and 130."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except Interrupted as err:
            click.echo(f"pardiag: interrupted: {err}", err=True)
            ctx.exit(err.exit_code)
        except PardiagError as err:
            click.echo(f"pardiag: error: {err}", err=True)
            ctx.exit(err.exit_code)


@contextlib.contextmanager
def python_strings():
    """Within it, pandas stores text columns as Python strings (``mode.string_storage =
    "python"``) instead of pyarrow's where pyarrow is installed; the dtype (``str``) and every
    value stay the same. A report builds many small tables and reads their text a value at a
    time, which Python strings do faster: 5% of a report of 8 x 31 MB
    (``benchmarks/bench_report.py``; the report-speed results listed in benchmarks/README.md).
    The analysis commands run within it; usable as a decorator."""
    import pandas as pd

    with pd.option_context("mode.string_storage", "python"):
        yield


#: The commands that read traces with pandas (:func:`analysis_command`).
ANALYSIS_COMMANDS: set[str] = set()


def analysis_command(f):
    """Mark a command's function as one that reads traces with pandas: it runs within
    :func:`python_strings`, and :func:`keep_pyarrow_out` names it in
    :data:`ANALYSIS_COMMANDS` (the command's name is the function's)."""
    ANALYSIS_COMMANDS.add(f.__name__)
    return python_strings()(f)


def comm_kernel_option(f):
    """``--comm-kernel REGEX`` (repeatable), shared by report, merge and summarize."""
    return click.option("--comm-kernel", "comm_kernel", multiple=True, metavar="REGEX",
                        help="Extra GPU kernel names that are communication (repeatable).")(f)


def workers_option(f):
    """``--workers N``, shared by report and summarize."""
    return click.option("--workers", type=click.IntRange(min=1), default=None,
                        help="Processes that parse traces at a time, a fresh one per large "
                             "file [default: one per core for large inputs].")(f)


def guard_outputs(outputs: list[Path | None], inputs: list[Path], traces=None) -> None:
    """Refuse output paths that would overwrite or later be read as input — the one check every
    command that writes uses.

    Raises:
        PardiagError: an output is an input trace or input file, the same file as any file of
            an input folder (also through another name: hard links), or two outputs are the
            same file.
    """
    outs = [o for o in outputs if o is not None and str(o) != "-"]
    trace_files = ({f.resolve() for t in traces.ranks.values() for f in (t.files or (t.path,))}
                   if traces is not None else set())
    trace_files |= {p.resolve() for p in inputs if p.is_file()}
    inode = {}
    for folder in {pth for pth in inputs if pth.is_dir()}:
        for f in [*folder.iterdir(), *layout.owned_files(folder)]:  # sidecars in pardiag/ too
            if f.is_file():
                st = f.stat()
                inode[(st.st_dev, st.st_ino)] = f
    for f in trace_files:
        if f.exists():
            st = f.stat()
            inode[(st.st_dev, st.st_ino)] = f
    for target in outs:
        if target.resolve() in trace_files:
            what = ("inputs" if any(target.resolve() == p.resolve() for p in inputs)
                    and traces is None else "input traces")
            raise PardiagError(f"{target}: is one of the {what}; choose another output path")
        if target.exists():
            st = target.stat()
            # pardiag's own earlier page or report JSON is no input: `report .` run twice in a
            # run folder replaces its report.html
            if (st.st_dev, st.st_ino) in inode and not layout.is_report_output(target):
                raise PardiagError(f"{target}: would overwrite {inode[(st.st_dev, st.st_ino)]} "
                                   "of the input; choose another output path")
    if len(outs) == 2 and outs[0].resolve() == outs[1].resolve():
        raise PardiagError(f"{outs[0]}: given for both the HTML report and --json")


def _ours(path: Path, html: bool) -> bool:
    """Whether ``path`` (an existing file) is empty or an output pardiag wrote: a page
    (``html``), else a report's or a comparison's JSON
    (:func:`pardiag.layout.is_report_output`; a sidecar, which carries a ``schema_version``
    too, is no output)."""
    try:
        if not path.read_bytes().strip():
            return True
    except OSError:
        return False
    return layout.is_report_output(path, page=html)


def _is_sidecar(path: Path) -> bool:
    """Whether ``path`` is a JSON object marked as a pardiag sidecar (``"schema": "pardiag"``:
    a run's or a rank's file, a capture request)."""
    import orjson

    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(doc, dict) and doc.get("schema") == layout.SIDECAR_SCHEMA


def _merged_by_pardiag(path: Path) -> bool:
    """Whether ``path`` is empty or a trace ``pardiag merge`` wrote (it carries the
    ``pardiagMerge`` key; gzip-compressed or not)."""
    import gzip

    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
    except (OSError, EOFError, gzip.BadGzipFile):
        return False
    return not data.strip() or b'"pardiagMerge"' in data


def refuse_foreign_outputs(html: Path, json_out: Path | None) -> None:
    """Refuse to write over a file pardiag did not write: the page ``html`` and the JSON
    ``json_out`` replace only an earlier page or JSON of pardiag's (or an empty file), so a
    default ``report.html`` never takes the place of the user's own file.

    Raises:
        PardiagError: an output exists, is not a folder, and is not pardiag's.
    """
    for target, is_html, option in ((html, True, "-o"), (json_out, False, "--json")):
        if target is None or str(target) == "-" or not target.is_file():
            continue
        if not _ours(target, is_html):
            what = "a page" if is_html else "a JSON file"
            if _is_sidecar(target):
                raise PardiagError(f"{target}: is a run's own file (a pardiag sidecar), not an "
                                   f"output; choose another path with {option}")
            raise PardiagError(f"{target}: exists and is not {what} pardiag wrote; choose "
                               f"another path with {option} (pardiag replaces only its own "
                               f"outputs)")


def _script_usage_error(cmd: click.Command, ctx: click.Context, args: list[str]) -> None:
    """Refuse a command line whose options could belong to pardiag or to the script.

    Raises:
        click.UsageError: an option of ``cmd`` is given twice (the second would silently replace
            the first), an option ``cmd`` does not define comes before SCRIPT, or an option of
            ``cmd`` follows SCRIPT among the script's own arguments without a ``--`` between
            them (``pardiag profile train.py --steps 3 --out x``: whose ``--out``?).
    """
    opts: dict[str, click.Option] = {}
    for p in cmd.get_params(ctx):
        if isinstance(p, click.Option):
            for o in (*p.opts, *p.secondary_opts):
                opts[o] = p
    seen: dict[str, str] = {}
    after: list[str] = []
    script_at = None
    script_args = False
    dash = False
    foreign = None  # the first argument after SCRIPT that looks like an option not pardiag's
    i = 0
    usage = (f"pardiag {cmd.name} [OPTIONS] SCRIPT [OPTIONS] -- [SCRIPT ARGS]")
    while i < len(args):
        a = args[i]
        if a == "--":
            dash = True
            break
        name = a.split("=", 1)[0] if a.startswith("--") else a
        opt = opts.get(name)
        if opt is not None:
            if opt.name in seen and not opt.multiple:
                raise click.UsageError(
                    f"{name} is given twice ({seen[opt.name]} ... {name}): the second would "
                    f"replace the first; an option of the script's own goes after `--`: {usage}")
            seen[opt.name] = name
            if script_at is not None:
                after.append(name)
            i += 2 if (not opt.is_flag and not opt.count and "=" not in a) else 1
            continue
        if script_at is None:
            if a.startswith("-") and a != "-":
                raise click.UsageError(f"{a}: not an option of pardiag {cmd.name}; the script's "
                                       f"options go after SCRIPT and `--`: {usage}")
            script_at = i
        else:
            script_args = True
            if foreign is None and a.startswith("-") and a != "-":
                foreign = a.split("=", 1)[0]
        i += 1
    if after and script_args and not dash:
        if foreign is not None:  # the script's own option, without `--` before it
            raise click.UsageError(
                f"{foreign}: not an option of pardiag {cmd.name}; the script's own options go "
                f"after `--`: {usage}")
        raise click.UsageError(
            f"{after[0]} is an option of pardiag {cmd.name}, given after SCRIPT among the "
            f"script's arguments without `--`: is it pardiag's or the script's? Put pardiag's "
            f"options before `--` and the script's after it: {usage}")


class _ScriptCommand(click.Command):
    """A command that runs a script: ``pardiag CMD [OPTIONS] SCRIPT [OPTIONS] -- [SCRIPT ARGS]``.
    Arguments after ``--`` go to the script unchanged; an ambiguous command line is a usage
    error (:func:`_script_usage_error`), never an option silently taken by the wrong side."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _script_usage_error(self, ctx, list(args))
        return super().parse_args(ctx, args)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pardiag")
def cli() -> None:
    """Profile distributed PyTorch training and diagnose why scaling disappoints."""



def _positive_option(ctx, param, value):
    """A click callback: the option's value unless it is not a positive, finite number (then a
    usage error naming the option)."""
    from pardiag.api import positive_number

    try:
        positive_number(param.opts[0], value)
    except PardiagError as exc:
        raise click.BadParameter(str(exc)[len(param.opts[0]) + 1:], ctx=ctx,
                                 param=param) from None
    return value


def _write_json(data: bytes, json_out: Path) -> None:
    """Write a JSON document to ``json_out``, or to stdout when it is ``-`` (a reader that
    stops early, ``| head``, is :class:`_StopsEarly`'s case).

    Raises:
        PardiagError: the file cannot be written (one line naming it)."""
    if str(json_out) == "-":
        try:
            sys.stdout.buffer.write(data + b"\n")
            sys.stdout.flush()
        except BrokenPipeError:
            _StopsEarly.silence(sys.stdout)
        return
    try:
        json_out.write_bytes(data)
    except OSError as exc:
        raise PardiagError(f"{exc.filename}: cannot write ({exc.strerror})") from None

def _schedule_options(f):
    """``--out``, ``--wait``, ``--warmup``, ``--active``, ``--overwrite``, ``--pin-cpu``: shared by
    profile and wrap."""
    for opt in reversed([
        click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path),
                     default=None,
                     help="Run folder to write [default: pardiag_runs/<script>-<time>]."),
        click.option("--wait", default=1, show_default=True,
                     help="Optimizer steps skipped before profiling."),
        click.option("--warmup", default=1, show_default=True,
                     help="Optimizer steps profiled and discarded."),
        click.option("--active", default=3, show_default=True,
                     help="Optimizer steps recorded in the trace."),
        click.option("--overwrite", is_flag=True,
                     help="Replace pardiag's files in an existing run folder."),
        click.option("--pin-cpu", is_flag=True,
                     help="Give each rank its own cores (cores / ranks on the node) and as many "
                          "torch threads, so CPU ranks do not slow each other down.")]):
        f = opt(f)
    return f


@cli.command(cls=_ScriptCommand, context_settings={"ignore_unknown_options": True})
@click.argument("script", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--nproc-per-node", default=1, show_default=True, help="Ranks to start on this node.")
@_schedule_options
@click.option("--timeout", "timeout_s", type=float, default=None, metavar="SECONDS",
              help="Stop a job still running after SECONDS and name the rank(s) it waits for.")
@click.option("--stall-timeout", "stall_s", type=float, default=None, metavar="SECONDS",
              help="Stop a job once no rank has made an optimizer step or moved on for SECONDS "
                   "(at least 2; counted from the first step; for long runs: an evaluation "
                   "between steps moves on, a rank waiting in a collective does not) and name "
                   "the rank(s) it waits for.")
@click.option("--nnodes", default=1, show_default=True, type=click.IntRange(min=1),
              help="Nodes of the job; run the same command on each (torchrun's --nnodes).")
@click.option("--node-rank", type=click.IntRange(min=0), default=None,
              help="This node's rank, 0..NNODES-1 (torchrun's static rendezvous).")
@click.option("--rdzv-backend", default=None, metavar="NAME",
              help="torchrun's rendezvous backend (static, c10d).")
@click.option("--rdzv-endpoint", default=None, metavar="HOST:PORT",
              help="Where the nodes meet (torchrun's --rdzv-endpoint).")
@click.option("--rdzv-id", default=None, metavar="ID", help="Job id shared by the nodes.")
@click.option("--master-addr", default=None, metavar="HOST",
              help="torchrun's --master-addr (static rendezvous without --rdzv-endpoint).")
@click.option("--master-port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
              help="torchrun's --master-port.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              metavar="N", help="Run the job N times, one after the other, into --out/run-1 … "
                                "run-N: `pardiag compare` of two such folders measures the noise "
                                "between runs (it needs 4 runs or more per side).")
@click.option("--monitor", is_flag=True,
              help="Monitor every step of a long run instead of profiling a window: no trace; "
                   "each rank's step times and collectives, appended as the job runs, for "
                   "`pardiag report` (slow steps, stragglers that come and go, memory creep).")
@click.option("--monitor-every", type=click.IntRange(min=1), default=None, metavar="STEPS",
              help="With --monitor: steps between two writes of each rank's records "
                   "[default: 50]; a killed job keeps everything written.")
@click.option("--monitor-capture", type=click.IntRange(min=1), default=None, metavar="STEPS",
              help="With --monitor: on a finding, every rank records a Kineto trace of "
                   "STEPS steps into DIR/capture-S/ for `pardiag report`.")
@click.option("--monitor-captures", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --monitor-capture: the most deep captures of the run [default: 3]; "
                   "a finding that comes once the last one has ended asks for the next.")
@click.option("--monitor-calls/--no-monitor-calls", default=True, show_default=True,
              help="With --monitor: write every collective call, or only each step's summary "
                   "(its arrival among them; for large jobs).")
def profile(script: Path, script_args: tuple[str, ...], nproc_per_node: int, out: Path | None,
            wait: int, warmup: int, active: int, overwrite: bool, timeout_s: float | None,
            stall_s: float | None, pin_cpu: bool, nnodes: int, node_rank: int | None,
            rdzv_backend: str | None, rdzv_endpoint: str | None, rdzv_id: str | None,
            master_addr: str | None, master_port: int | None, repeat: int, monitor: bool,
            monitor_every: int | None, monitor_capture: int | None,
            monitor_captures: int | None,
            monitor_calls: bool) -> None:
    """Run SCRIPT under torchrun with every rank profiled.

    Arguments after `--` go to the script unchanged. The run folder gets one gzipped Kineto trace
    per rank, per-rank metadata and run.json. The exit code is the script's. On several nodes,
    run the same command on each with --nnodes, --node-rank and --rdzv-endpoint: each node
    writes its own ranks' files into --out (a shared folder, or one per node that `pardiag
    report` joins). With --repeat N the job runs N times into --out/run-1 … run-N; a run that
    fails ends the repeats with its exit code.
    """
    import time

    from pardiag.collectors.launch import MONITOR_CAPTURES, ProfileConfig, run_profile

    if (monitor_every is not None or monitor_capture is not None or not monitor_calls
            or monitor_captures is not None) and not monitor:
        raise PardiagError("--monitor-every, --monitor-capture, --monitor-captures and "
                           "--no-monitor-calls need --monitor")
    if monitor_captures is not None and monitor_capture is None:
        raise PardiagError("--monitor-captures needs --monitor-capture STEPS")
    if monitor:
        ctx = click.get_current_context()
        given = [f"--{n}" for n in ("wait", "warmup", "active")
                 if ctx.get_parameter_source(n) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise PardiagError(f"{', '.join(given)}: a profiler schedule, and --monitor runs no "
                               f"profiler (--monitor-capture N records N steps on a finding)")
        if repeat > 1:
            raise PardiagError("--repeat is for profiled runs; a monitored run already holds "
                               "every step (compare two monitored runs with pardiag compare)")
    if out is None:
        out = Path("pardiag_runs") / f"{script.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    if repeat > 1:
        if nnodes > 1:
            raise PardiagError("--repeat runs a job on one node only (--nnodes 1)")
        if out.exists() and not out.is_dir():
            raise PardiagError(f"{out}: exists and is not a folder")
        if out.is_dir() and any(out.iterdir()) and not overwrite:
            raise PardiagError(f"{out}: folder exists and is not empty (pass --overwrite to "
                               f"replace the runs in it)")
        from pardiag.analyzer.report.reading import MIN_RUNS_PER_SIDE
        if repeat < MIN_RUNS_PER_SIDE:
            click.echo(f"pardiag: warning: with {repeat} runs per side `pardiag compare` cannot "
                       f"tell any difference from the noise between runs (its test needs "
                       f"{MIN_RUNS_PER_SIDE} or more per side): use --repeat "
                       f"{MIN_RUNS_PER_SIDE} or more", err=True)
    runs = [out] if repeat == 1 else [layout.repeat_path(out, i) for i in range(1, repeat + 1)]
    code = 0
    for i, run_out in enumerate(runs, 1):
        if repeat > 1:
            click.echo(f"pardiag: run {i} of {repeat} into {run_out}", err=True)
        cfg = ProfileConfig(script=script, args=tuple(script_args), out=run_out,
                            nproc_per_node=nproc_per_node, wait=wait, warmup=warmup,
                            active=active, overwrite=overwrite, timeout_s=timeout_s,
                            stall_s=stall_s, pin_cpu=pin_cpu, nnodes=nnodes, node_rank=node_rank,
                            rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint,
                            rdzv_id=rdzv_id, master_addr=master_addr, master_port=master_port,
                            monitor_every=_monitor_every(monitor, monitor_every),
                            monitor_capture=monitor_capture or 0,
                            monitor_captures=monitor_captures or MONITOR_CAPTURES,
                            monitor_calls=monitor_calls)
        result = run_profile(cfg)
        _say_outcome(result, wait, warmup, active, timeout_s, stall_s)
        code = result.exit_code
        if code != 0:
            if i < repeat:
                click.echo(f"pardiag: run {i} of {repeat} failed: the other "
                           f"{repeat - i} were not started", err=True)
            break
    if (any(out.glob("rank*.trace.json.gz")) or (repeat > 1 and code == 0)
            or (monitor and any(layout.sidecar_dir(out).glob("rank*.monitor.jsonl")))):
        where = _shell_path(out)
        more = " (with node-local folders: every node's folder)" if nnodes > 1 else ""
        click.echo(f"pardiag: next: {_program()} report {where}{more}", err=True)
    sys.exit(code)


def _say_outcome(result, wait: int, warmup: int, active: int, timeout_s: float | None,
                 stall_s: float | None = None) -> None:
    """What one profiled run left behind, on standard error: failed ranks, short or missing
    traces, hangs, contention and the run folder. A rank that ended without a word (no final
    metadata) while every failed rank was stopped by torchrun's SIGTERM ended first: it is said
    first, as the likely cause."""
    silent_first = (bool(result.missing_ranks) and bool(result.failed_ranks)
                    and not result.hang and result.stopped_by is None and all(
                        m.startswith(layout.STOPPED_BY_LAUNCHER)
                        for m in result.failed_ranks.values()))
    if silent_first:
        _say_missing(result, " - the first to end, without a word (killed: SIGKILL, or out of "
                             "memory?); torchrun then stopped the others")
    # ranks --timeout stopped while they ran did not fail: the line of that stop says it
    limit = bool(result.hang) and result.hang[0].startswith(layout.STILL_RUNNING)
    for i, (r, msg) in enumerate(result.failed_ranks.items()):
        if limit and msg.startswith(layout.STOPPED_BY_LAUNCHER):
            continue
        first = (" (first failure)" if i == 0 and len(result.failed_ranks) > 1
                 and not silent_first else "")
        click.echo(f"pardiag: rank {r} failed{first}: {msg}", err=True)
    for r, seen in sorted(result.short_ranks.items()):
        click.echo(f"pardiag: warning: rank {r} recorded {seen} of --active {active} steps "
                   f"(the script made fewer optimizer steps than --wait + --warmup + --active)",
                   err=True)
    for r, seen in sorted(result.no_trace.items()):
        if r in result.failed_ranks:  # its failure says why: the schedule is not the reason
            continue
        if not seen:   # more steps cannot help a script that makes none
            click.echo(f"pardiag: warning: rank {r} wrote no trace: the script made 0 optimizer "
                       f"step(s), and pardiag's steps are optimizer steps (torch.optim's "
                       f"step()); with --wait 0 --warmup 0 it records the whole script as one "
                       f"step", err=True)
            continue
        click.echo(f"pardiag: warning: rank {r} wrote no trace: the script made {seen} optimizer "
                   f"step(s) and the profiler starts recording after --wait + --warmup = "
                   f"{wait + warmup} (try --wait 0 --warmup 0, or more steps)", err=True)
    for line in result.hang:
        prefix = {"timeout": f"hang after {timeout_s or 0:g} s",
                  "stall": f"hang, no optimizer step for {stall_s or 0:g} s"}.get(
            result.stopped_by or "", "hang at exit")
        if line.startswith(layout.STILL_RUNNING):
            prefix = f"stopped by --timeout after {timeout_s or 0:g} s"
        click.echo(f"pardiag: {prefix}: {line}", err=True)
    if not silent_first:
        _say_missing(result, "")
    if result.contention:
        click.echo(f"pardiag: warning: {result.contention}", err=True)
    if result.after_window is not None and result.after_window < MIN_STEPS_AFTER_WINDOW:
        click.echo(f"pardiag: warning: only {result.after_window} optimizer step(s) ran after "
                   f"the profiling window and the step that exports its trace: the report "
                   f"measures the step time and its noise on those undisturbed steps, and needs "
                   f"3 periods between them (run "
                   f"{MIN_STEPS_AFTER_WINDOW - result.after_window} more step(s))", err=True)
    click.echo(f"pardiag: run folder {result.out} (exit code {result.exit_code})", err=True)


def _say_missing(result, why: str) -> None:
    """One line per rank of the run that wrote no final metadata, with what it kept and
    ``why`` after it."""
    for r in result.missing_ranks:
        kept = [what for what, path in (
            ("its trace", layout.trace_path(result.out, r)),
            ("the metadata written when its profiling window closed",
             layout.window_meta_path(result.out, r)),
            ("its monitor records", layout.monitor_path(result.out, r)),
            ("its hang dump", layout.hang_path(result.out, r)),
            ("its threads' stacks", layout.stacks_path(result.out, r)))
            if path.is_file() and path.stat().st_size]
        click.echo(f"pardiag: rank {r} did not finish (no final metadata; "
                   + (f"kept: {_and(kept)})" if kept else "it wrote nothing)") + why, err=True)


#: Undisturbed steps after the profiling window from which a step's noise is measured (the
#: report's step noise needs 3 periods).
MIN_STEPS_AFTER_WINDOW = 4


def _program() -> str:
    """pardiag as the user ran it, for a command line to paste: ``pardiag`` when that name on
    PATH is this program, else the path that was run (``.venv/bin/pardiag``), else
    ``PYTHON -m pardiag``."""
    import shlex
    import shutil

    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "pardiag":
        found = shutil.which("pardiag")
        if found and os.path.realpath(found) == os.path.realpath(argv0):
            return "pardiag"
        return shlex.quote(argv0)
    return f"{shlex.quote(sys.executable)} -m pardiag"


def _shell_path(p: Path) -> str:
    """``p`` relative to the working folder where it lies below it, shell-quoted."""
    import shlex
    try:
        p = p.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    return shlex.quote(str(p))


@cli.command(cls=_ScriptCommand, context_settings={"ignore_unknown_options": True})
@click.argument("script", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@_schedule_options
@click.option("--monitor", is_flag=True,
              help="Monitor every step instead of profiling a window (as pardiag profile "
                   "--monitor; the findings come with pardiag report).")
@click.option("--monitor-every", type=click.IntRange(min=1), default=None, metavar="STEPS",
              help="Steps between two writes of the rank's records [default: 50]; implies "
                   "--monitor (under torchrun give this one: torchrun reads --monitor as its "
                   "own --monitor-interval).")
@click.option("--monitor-calls/--no-monitor-calls", default=True, show_default=True,
              help="With --monitor: write every collective call, or only each step's summary.")
def wrap(script: Path, script_args: tuple[str, ...], out: Path | None, wait: int, warmup: int,
         active: int, overwrite: bool, pin_cpu: bool, monitor: bool, monitor_every: int | None,
         monitor_calls: bool) -> None:
    """Profile one rank of a job another launcher started (torchrun, srun, mpirun, accelerate).

    Every process runs `python -m pardiag wrap [OPTIONS] SCRIPT -- ARGS`, e.g.
    `torchrun --nproc-per-node 4 -m pardiag wrap train.py -- --steps 20` or
    `srun python -m pardiag wrap --out /shared/run train.py -- --steps 20`. The rank comes from
    RANK/LOCAL_RANK/WORLD_SIZE, else SLURM's variables (the master from the node list), else
    Open MPI's. Each rank writes its own files into --out (one folder on a shared file system);
    the exit code is the script's. --out is needed unless the job is one process.
    """
    from pardiag.collectors.wrap import WrapConfig, rank_env, run_wrap

    if out is None:
        if rank_env().world_size > 1:   # each rank would name its own folder by its own clock
            raise PardiagError("pardiag wrap: give --out DIR (one folder for every rank of the "
                               "job, on a shared file system or the same path on each node)")
        import time
        out = Path("pardiag_runs") / f"{script.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    monitor = monitor or monitor_every is not None
    run_wrap(WrapConfig(script=script, args=tuple(script_args), out=out, wait=wait,
                        warmup=warmup, active=active, overwrite=overwrite, pin_cpu=pin_cpu,
                        monitor_every=_monitor_every(monitor, monitor_every),
                        monitor_calls=monitor_calls))


def _monitor_every(monitor: bool, every: int | None) -> int | None:
    """Steps between a monitored run's lines (``--monitor-every``, else the monitor's default);
    None without ``--monitor``. The monitor's module (it loads pandas) is imported only then:
    a profiled run's launcher starts without it."""
    if not monitor:
        return None
    from pardiag.collectors.monitor import FLUSH_EVERY

    return every or FLUSH_EVERY


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("report.html"), show_default=True, help="HTML report to write.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the JSON summary to this file ('-' for standard output).")
@comm_kernel_option
@click.option("--cdn", is_flag=True, help="Link plotly.js from its CDN instead of inlining it.")
@click.option("--quiet", "-q", is_flag=True, help="No terminal summary.")
@click.option("--no-cache", is_flag=True,
              help="Parse every trace; neither read nor store per-rank summaries.")
@workers_option
@click.option("--hta", is_flag=True,
              help="Also run Holistic Trace Analysis' idle time breakdown and kernel launch "
                   "statistics on each GPU rank (needs HTA: pip install traceinsight).")
@click.option("--mixed-runs", is_flag=True,
              help="Analyse the files of different runs as one (by default they are refused: "
                   "pardiag compare sets two runs side by side).")
@click.option("--tensorboard", "tensorboard", type=click.Path(file_okay=False, path_type=Path),
              default=None, metavar="DIR",
              help="Of a monitored run (profile --monitor): also write its per-rank, per-step "
                   "scalars as TensorBoard event files under DIR (needs tensorboard).")
@click.option("--peak-tflops", type=float, default=None, callback=_positive_option,
              metavar="TFLOPS",
              help="The peak (dense TFLOP/s per rank) MFU is computed against, over the device "
                   "table's and the one pardiag profile measures on a CPU.")
@click.option("--tokens-per-step", type=float, default=None, callback=_positive_option,
              metavar="N", help="Tokens each rank processes per step: the report adds tokens/s.")
@click.option("--mlflow", "mlflow_uri", default=None, metavar="URI",
              help="Of a monitored run: also log its scalars as one MLflow run to the tracking "
                   "URI (a server, or a store such as sqlite:///mlflow.db; needs mlflow).")
@click.option("--wandb", "wandb_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, metavar="DIR",
              help="Of a monitored run: also log its scalars as one W&B run, offline under DIR "
                   "unless WANDB_MODE says otherwise (wandb sync uploads it; needs wandb).")
@analysis_command
def report(paths: tuple[Path, ...], output: Path, json_out: Path | None,
           comm_kernel: tuple[str, ...], cdn: bool, quiet: bool, no_cache: bool,
           workers: int | None, hta: bool, mixed_runs: bool,
           peak_tflops: float | None, tokens_per_step: float | None,
           tensorboard: Path | None, mlflow_uri: str | None, wandb_dir: Path | None) -> None:
    """Analyze a run folder, a folder of Kineto traces, or trace files.

    Writes a self-contained HTML report, prints a summary, and optionally writes JSON.
    Per-rank summaries are reused when current and stored for next time (in .pardiag-cache/ of
    the trace folder, or ~/.cache/pardiag when it is read-only). Bad input exits with code 2
    and a one-line message.
    """
    import orjson

    from pardiag.analyzer.analyses.monitored import is_monitored
    from pardiag.api import analyze
    from pardiag.progress import progress_reporter

    monitored = [p for p in paths if p.is_dir() and is_monitored(p)
                 and not any(p.glob("rank*.trace.json.gz"))]
    if len(paths) > 1 and monitored:
        for p in paths:   # a deep capture given with its own run
            ctx = layout.capture_context(p) if p.is_dir() else None
            if ctx is not None and any(Path(ctx["monitored_run"]) == m.resolve()
                                       for m in monitored):
                raise PardiagError(
                    f"{p} is a deep capture of the monitored run {ctx['monitored_run']}: report "
                    f"each on its own (pardiag report {p} gives the capture's deep diagnosis and "
                    f"where it lies in the run's findings; pardiag report "
                    f"{ctx['monitored_run']} the whole run)")
        raise PardiagError(f"{monitored[0]}: a monitored run is reported on its own (pardiag "
                           f"report {monitored[0]}); pardiag compare A B sets two runs side "
                           f"by side")
    if monitored:
        for flag, number in (("--peak-tflops", peak_tflops),
                             ("--tokens-per-step", tokens_per_step)):
            if number is not None:
                raise PardiagError(f"{flag}: only for a traced run; a monitored run records no "
                                   f"FLOPs (its deep captures are traced: report a capture-S "
                                   f"folder)")
        if hta:
            raise PardiagError("--hta: only for a traced run; a monitored run holds no Kineto "
                               "trace for HTA to read (its deep captures do: report a capture-S "
                               "folder)")
        _monitor_report(paths[0], output, json_out, cdn, quiet,
                        {"tensorboard": tensorboard, "mlflow": mlflow_uri, "wandb": wandb_dir})
        return
    for name, given in (("tensorboard", tensorboard), ("mlflow", mlflow_uri),
                        ("wandb", wandb_dir)):
        if given is not None:
            raise PardiagError(f"--{name}: only for a monitored run (pardiag profile --monitor)")
    analysing: str | None = None   # the traces' source, once the analyses run

    def loaded(traces) -> None:
        """Between loading and the analyses: the progress bar ends, the outputs are checked
        against the traces (nothing the user produced is overwritten: no trace, no file of an
        input folder) and loading's warnings are printed."""
        nonlocal analysing
        bar.close()
        guard_outputs([output, json_out], list(paths), traces)
        refuse_foreign_outputs(output, json_out)
        for w in traces.warnings:
            click.echo(f"pardiag: warning: {w}", err=True)
        analysing = traces.source

    with contextlib.ExitStack() as bar:
        progress = bar.enter_context(progress_reporter("loading traces"))
        try:
            rep = analyze(list(paths), comm_kernels=comm_kernel, cache=not no_cache,
                          workers=workers, progress=progress, hta=hta, mixed_runs=mixed_runs,
                          loaded=loaded, peak_tflops=peak_tflops,
                          tokens_per_step=tokens_per_step)
        except Exception as exc:  # a bug, or input no check caught: one line, details on request
            if analysing is None or os.environ.get("PARDIAG_DEBUG"):
                raise
            raise PardiagError(f"{analysing}: analysis failed ({type(exc).__name__}: {exc}); "
                               f"set PARDIAG_DEBUG=1 for the traceback", exit_code=1) from None
    for w in rep.warnings[len(rep.traces.warnings):]:   # the analyses' own
        click.echo(f"pardiag: warning: {w}", err=True)
    if json_out is not None:
        data = orjson.dumps(rep.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
        _write_json(data, json_out)
    rep.to_html(output, cdn=cdn)
    if not quiet and str(json_out) != "-":
        from rich.console import Console

        # a pipe or a file gets 120 columns unless COLUMNS says otherwise
        wide = sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit()
        rep.print_summary(Console(width=None if wide else 120))
    click.echo(f"pardiag: wrote {output}"
               + (f" and {json_out}" if json_out and str(json_out) != "-" else ""), err=True)


#: The version of a monitored run's and a monitored comparison's JSON (``kind``
#: ``monitored_run``, ``monitored_comparison``); 2: the comparison's gate as a traced one's
#: (``gate``), a slow period's ``arrivals_known``.
MONITOR_JSON_VERSION = 2


def _monitored_setup_warnings(a: Path, b: Path) -> list[str]:
    """What makes two monitored runs' step times unlike, from their run files: another script,
    other arguments, another world size (none where a run file is missing or unreadable)."""
    runs = []
    for p in (a, b):
        try:
            runs.append(layout.decode_sidecar(layout.run_file_path(p).read_bytes(), "run"))
        except (OSError, ValueError):
            return []
    return [f"A and B ran other {what} ({x!r} against {y!r}): their step times are compared as "
            f"they are" for what, x, y in runs[0].job_differences(runs[1])]


def _and(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return ", ".join(items[:-1]) + (" and " if len(items) > 1 else "") + items[-1]


def _compare_monitored(a: Path, b: Path, output: Path, json_out: Path | None,
                       fail_pct: float | None, cdn: bool, quiet: bool) -> None:
    """``pardiag compare`` of two monitored runs: step time with its noise, findings, gate."""
    import orjson

    from pardiag.analyzer.analyses.monitor_compare import compare_monitored, gate
    from pardiag.analyzer.analyses.monitored import load_monitor
    from pardiag.analyzer.render.monitor_page import compare_html, compare_lines

    data = (load_monitor(a), load_monitor(b))
    try:
        cmp = compare_monitored(*data, run_dirs=(a, b))
    except ValueError as exc:
        raise PardiagError(f"{a} vs {b}: {exc}") from None
    names = (str(a), str(b))
    warns = _monitored_setup_warnings(a, b)
    failed = fail_pct is not None and gate(cmp, fail_pct)
    line = None
    if fail_pct is not None:   # the traced comparison's gate line and JSON
        line = (f"B's step is {cmp['step_delta_pct']:.1f}% slower than A's, beyond the noise "
                f"and the --fail-if-slower {fail_pct:g}% limit" if failed else
                f"B's step is {cmp['step_delta_pct']:+.1f}% against A's, inside the noise"
                if cmp["verdict"] == "inside the noise" else
                f"B's step is {cmp['step_delta_pct']:+.1f}% against A's, within the "
                f"--fail-if-slower {fail_pct:g}% limit" if cmp["verdict"] == "slower" else
                f"B's step is {cmp['step_delta_pct']:+.1f}% against A's: B is faster")
    doc = {"kind": "monitored_comparison", "schema_version": MONITOR_JSON_VERSION,
           "a_source": names[0], "b_source": names[1], **cmp,
           "gate": None if line is None else {"failed": failed, "line": line},
           "warnings": warns}
    if json_out is not None:
        _write_json(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY),
                    json_out)
    try:
        output.write_text(compare_html(cmp, data, names, "cdn" if cdn else True))
    except OSError as exc:
        raise PardiagError(f"{output}: cannot write ({exc.strerror})") from None
    if not quiet and str(json_out) != "-":
        click.echo("\n".join(compare_lines(cmp, names)))
    click.echo(f"pardiag: wrote {output}"
               + (f" and {json_out}" if json_out and str(json_out) != "-" else ""), err=True)
    for w in warns:
        click.echo(f"pardiag: warning: {w}", err=True)
    if line is not None:
        click.echo(f"pardiag: {'FAIL' if failed else 'pass'}: {line}", err=True)
    if failed:
        sys.exit(1)


def _monitor_report(run: Path, output: Path, json_out: Path | None, cdn: bool,
                    quiet: bool, trackers: dict | None = None) -> None:
    """``pardiag report`` of a monitored run (``profile --monitor``): its findings on the
    terminal, the page, JSON when asked, and the scalars to the ``trackers`` given
    (``tensorboard``: a folder, ``mlflow``: a tracking URI, ``wandb``: a folder)."""
    import orjson

    from pardiag.analyzer.analyses.monitor_summary import summary
    from pardiag.analyzer.analyses.monitored import load_monitor
    from pardiag.analyzer.render.monitor_page import monitor_html, monitor_lines

    guard_outputs([output, json_out], [run])
    refuse_foreign_outputs(output, json_out)
    data = load_monitor(run)
    doc = {"kind": "monitored_run", "schema_version": MONITOR_JSON_VERSION, "source": str(run),
           **summary(data, run)}
    if json_out is not None:
        _write_json(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY),
                    json_out)
    try:
        output.write_text(monitor_html(data, doc, str(run), "cdn" if cdn else True))
    except OSError as exc:
        raise PardiagError(f"{output}: cannot write ({exc.strerror})") from None
    _to_trackers(run, data, doc, trackers or {})
    if not quiet and str(json_out) != "-":
        click.echo("\n".join(monitor_lines(doc)))
    click.echo(f"pardiag: wrote {output}"
               + (f" and {json_out}" if json_out and str(json_out) != "-" else ""), err=True)


def _to_trackers(run: Path, data, doc: dict, trackers: dict) -> None:
    """The monitored run's scalars to TensorBoard, MLflow and W&B, as asked; a folder inside
    the run folder is refused (nothing is written among the run's own files)."""
    from pardiag.analyzer.render import trackers as tb

    for name in ("tensorboard", "wandb"):
        folder = trackers.get(name)
        if folder is not None and folder.resolve().is_relative_to(run.resolve()):
            raise PardiagError(f"{folder}: inside the run folder {run}; write it elsewhere")
    if trackers.get("tensorboard") is not None:
        out = trackers["tensorboard"]
        where, done, again = tb.write_tensorboard(data, doc, out, run)
        click.echo(f"pardiag: wrote TensorBoard event files for {len(done)} rank folder(s) under "
                   f"{where}" + (", replacing this run's earlier ones" if again else "")
                   + f" (tensorboard --logdir {out})", err=True)
    if trackers.get("mlflow") is not None:
        run_id = tb.log_mlflow(data, doc, run, trackers["mlflow"])
        click.echo(f"pardiag: logged MLflow run {run_id} (experiment pardiag) to "
                   f"{trackers['mlflow']}", err=True)
    if trackers.get("wandb") is not None:
        where = tb.log_wandb(data, doc, run, trackers["wandb"])
        click.echo(f"pardiag: logged a W&B run under {where}"
                   + ("" if os.environ.get("WANDB_MODE", "offline") != "offline"
                      else f" (offline: wandb sync {where})"), err=True)


@cli.command()
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("compare.html"), show_default=True, help="HTML page to write.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the comparison as JSON to this file ('-' for standard output).")
@click.option("--fail-if-slower", "fail_pct", type=_FINITE_PCT, default=None,
              metavar="PCT", help="Exit 1 when B's step time is more than PCT % slower than "
                                  "A's and beyond the runs' noise.")
@comm_kernel_option
@click.option("--cdn", is_flag=True, help="Link plotly.js from its CDN instead of inlining it.")
@click.option("--quiet", "-q", is_flag=True, help="No terminal summary.")
@click.option("--no-cache", is_flag=True,
              help="Parse every trace; neither read nor store per-rank summaries.")
@workers_option
@analysis_command
def compare(a: Path, b: Path, output: Path, json_out: Path | None, fail_pct: float | None,
            comm_kernel: tuple[str, ...], cdn: bool, quiet: bool, no_cache: bool,
            workers: int | None) -> None:
    """Compare run B (the candidate) with run A (the reference).

    A and B are run folders, folders of repeated runs (`pardiag profile --repeat N`: the
    step times are then weighed against the spread between the runs), trace folders or JSON
    summaries written by `pardiag report --json`. Shows what changed in the setup and in the
    time (step time against both runs' noise, breakdown, overlap, bubbles, stragglers,
    memory, collectives, operators) and, when B made a change A's report recommended, its
    predicted against its measured step time. With --fail-if-slower the exit code is 1 when
    B is slower beyond the limit and the noise. A
    missing or unreadable input exits with code 2 and a one-line message.
    """
    import dataclasses as _dc

    import orjson
    from rich.console import Console

    from pardiag.api import compare as compare_runs
    from pardiag.api import load_summaries, same_run
    from pardiag.progress import progress_reporter

    guard_outputs([output, json_out], [a, b])
    refuse_foreign_outputs(output, json_out)
    from pardiag.analyzer.analyses.monitored import is_monitored


    for p in (a, b):   # a monitored report's JSON holds findings, not the steps to compare
        if p.is_file() and p.suffix == ".json" and p.stat().st_size < 64 * 2**20:
            try:
                kind = orjson.loads(p.read_bytes()).get("kind")
            except (OSError, ValueError, AttributeError):
                kind = None
            if kind in ("monitored_run", "monitored_comparison"):
                raise PardiagError(f"{p} is a monitored run's report JSON ({kind}), which "
                                   f"keeps its findings, not its steps: compare the run "
                                   f"folders themselves")
    kinds = [p.is_dir() and is_monitored(p) and not any(p.glob("rank*.trace.json.gz"))
             for p in (a, b)]
    if any(kinds):
        if not all(kinds):
            which, other = (a, b) if kinds[0] else (b, a)
            raise PardiagError(f"{which} is a monitored run (profile --monitor) and {other} is "
                               f"not: compare two monitored runs, or two profiled runs")
        _compare_monitored(a, b, output, json_out, fail_pct, cdn, quiet)
        return
    docs = []
    for label, path in (("A", a), ("B", b)):
        with progress_reporter(f"loading {label}") as progress:
            docs.append(load_summaries(path, comm_kernels=comm_kernel, cache=not no_cache,
                                       workers=workers, progress=progress))
    try:
        cmp = compare_runs(docs[0], docs[1], names=(str(a), str(b)))
    except PardiagError:
        raise
    except Exception as exc:  # a bug, or input no check caught: one line, details on request
        if os.environ.get("PARDIAG_DEBUG"):
            raise
        raise PardiagError(f"{a} vs {b}: comparison failed ({type(exc).__name__}: {exc}); "
                           f"set PARDIAG_DEBUG=1 for the traceback", exit_code=1) from None
    same = same_run(a, b)
    if same:
        cmp = _dc.replace(cmp, warnings=(same, *cmp.warnings))
    for w in cmp.warnings:
        click.echo(f"pardiag: warning: {w}", err=True)
    result = cmp.gate(fail_pct) if fail_pct is not None else None
    if json_out is not None:
        data = orjson.dumps(cmp.to_json(fail_pct), option=orjson.OPT_INDENT_2
                            | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
        _write_json(data, json_out)
    cmp.to_html(output, cdn=cdn, fail_if_slower_pct=fail_pct)
    if not quiet and str(json_out) != "-":
        wide = sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit()
        cmp.print_summary(Console(width=None if wide else 120))   # the gate: one line below
    click.echo(f"pardiag: wrote {output}"
               + (f" and {json_out}" if json_out and str(json_out) != "-" else ""), err=True)
    if result is not None:
        click.echo(f"pardiag: {'FAIL' if result.failed else 'pass'}: {result.line}", err=True)
        if result.failed:
            click.get_current_context().exit(1)


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("merged.json.gz"), show_default=True,
              help="Merged trace to write (gzip-compressed when the name ends in .gz).")
@comm_kernel_option
@analysis_command
def merge(paths: tuple[Path, ...], output: Path, comm_kernel: tuple[str, ...]) -> None:
    """Merge the ranks' traces into one trace for Perfetto or chrome://tracing.

    Each rank becomes a process named "rank R" (pid R*1000; its GPU and other processes follow),
    thread ids are kept, and every rank's clock offset (measured on collective ends, as in
    `pardiag report`) is subtracted so collectives line up. The output may not be one of the
    inputs or lie in an input folder (a later report would read it as a rank). Bad input exits
    with code 2 and a one-line message.
    """
    from pardiag.analyzer.analyses.sync import compute_sync
    from pardiag.analyzer.render.merge import merge_traces
    from pardiag.analyzer.trace import load_traces
    from pardiag.analyzer.trace.classify import compile_comm_patterns

    patterns = tuple(compile_comm_patterns(comm_kernel))
    traces = load_traces(list(paths))
    guard_outputs([output], list(paths), traces)
    target = output.resolve()
    folders = ({p.resolve() for p in paths if p.is_dir()}
               | {p.resolve().parent for p in paths if p.is_file()})
    if target.parent in folders:
        raise PardiagError(f"{output}: is inside the input folder {target.parent} (a later "
                           f"report would read it as one more rank); choose another path")
    if output.is_file() and not _merged_by_pardiag(output):
        raise PardiagError(f"{output}: exists and is not a trace pardiag merge wrote; choose "
                           f"another path with -o (pardiag replaces only its own outputs)")
    for w in traces.warnings:
        click.echo(f"pardiag: warning: {w}", err=True)
    sync = compute_sync(traces, patterns)
    offsets = dict(zip(sync.offsets["rank"].astype(int), sync.offsets["offset_us"]))
    result = merge_traces(traces, offsets, output)
    if result.dropped:
        click.echo(f"pardiag: warning: left out {result.dropped} events without a numeric ts "
                   f"(or an X event without a duration >= 0)", err=True)
    if result.unmatched_flows:
        click.echo(f"pardiag: note: left out {result.unmatched_flows} flow events whose start or "
                   f"end is not in the trace", err=True)
    shifts = ", ".join(f"rank {r}: {o:+.1f} µs" for r, o in result.offsets_us.items())
    click.echo(f"pardiag: wrote {output} ({len(result.pids)} ranks, {result.events} events; "
               f"clock offsets subtracted: {shifts})", err=True)


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@comm_kernel_option
@click.option("--shard", default=None, metavar="I/N",
              help="Summarize only every N-th file from the I-th [default: $RANK/$WORLD_SIZE "
                   "under torchrun, else all].")
@workers_option
@analysis_command
def summarize(paths: tuple[Path, ...], comm_kernel: tuple[str, ...], shard: str | None,
              workers: int | None) -> None:
    """Write the per-rank summary of each trace, where the traces are.

    `pardiag report` then reads the summaries instead of the raw traces. Spread the work over
    processes or nodes with torchrun (each process takes its share of the files, --shard
    $RANK/$WORLD_SIZE), e.g. `torchrun --nnodes 8 --nproc-per-node 4 -m pardiag summarize DIR`.
    Summaries go to .pardiag-cache/ in the trace folder, or ~/.cache/pardiag when it is read-only.
    """
    from pardiag.analyzer.per_rank import summarize_paths
    from pardiag.analyzer.trace.classify import compile_comm_patterns
    from pardiag.progress import progress_reporter

    if shard is None and os.environ.get("WORLD_SIZE") and os.environ.get("RANK"):
        shard = f"{os.environ['RANK']}/{os.environ['WORLD_SIZE']}"
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if workers is None and local.isdigit() and int(local) > 0:  # torchrun: share the node's cores
        workers = max(1, len(os.sched_getaffinity(0)) // int(local)
                      if hasattr(os, "sched_getaffinity") else 1)
    try:
        i, n = (int(x) for x in (shard or "0/1").split("/"))
        if n < 1 or not 0 <= i < n:
            raise ValueError
    except ValueError:
        raise PardiagError(f"--shard {shard!r}: expected I/N with 0 <= I < N") from None
    with progress_reporter("summarizing traces") as progress:
        res = summarize_paths(list(paths), compile_comm_patterns(comm_kernel), shard=(i, n),
                              workers=workers, progress=progress)
    if not res.written and not res.current and res.skipped:
        first = res.skipped[0].removesuffix(" - skipped")
        raise PardiagError(first if len(res.skipped) == 1 else
                           f"{paths[0]}: none of {len(res.skipped)} file(s) is a readable "
                           f"Kineto trace (e.g. {first})")
    for line in res.skipped:
        click.echo(f"pardiag: warning: {line}", err=True)
    unwritable = [str(t) for t, f in res.written.items() if f is None]
    for t in unwritable:
        click.echo(f"pardiag: warning: {t}: no writable folder for its summary", err=True)
    folders = sorted({str(f.parent) for f in res.written.values() if f is not None})
    click.echo(f"pardiag: summarized {len(res.written) - len(unwritable)} trace(s)"
               f"{f' (shard {i}/{n})' if n > 1 else ''}, {len(res.current)} already current"
               + (f"; summaries in {', '.join(folders[:3])}" if folders else ""), err=True)


def main(argv: list[str] | None = None) -> int:
    """Run the command line (``argv`` without the program name; default ``sys.argv[1:]``) and
    return the exit code: a usage error is one line and 2, an interrupt 130, a
    :class:`~pardiag.errors.PardiagError` one line and its code. The console script is
    ``sys.exit(main())``; tests call ``main([...])`` in-process."""
    try:
        code = cli.main(args=argv, prog_name="pardiag", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as err:   # bare `pardiag`: its help, on stdout
        click.echo(err.ctx.get_help() if err.ctx is not None else err.format_message())
        return 0
    except click.UsageError as err:
        click.echo(f"pardiag: error: {err.format_message()}", err=True)
        return 2
    except click.ClickException as err:
        click.echo(f"pardiag: error: {err.format_message()}", err=True)
        return err.exit_code
    except click.exceptions.Exit as exc:  # ctx.exit(code), --help, --version
        return exc.exit_code
    except click.Abort:
        click.echo("pardiag: aborted", err=True)
        return 130
    except PardiagError as err:
        click.echo(f"pardiag: error: {err}", err=True)
        return err.exit_code
    return code if isinstance(code, int) else 0


#: The cyclic garbage collector's thresholds in pardiag's own processes (Python's: 700, 10, 10).
GC_THRESHOLDS = (50_000, 20, 100)


def collect_less() -> None:
    """Set :data:`GC_THRESHOLDS`: a report allocates many small objects that live until its end
    (tables, intervals), so the collector's passes over them find little; its first generation
    is collected after 50,000 allocations instead of 700. The benchmarks that time a report in
    a script of their own call it too."""
    gc.set_threshold(*GC_THRESHOLDS)


def keep_pyarrow_out(argv: list[str]) -> bool:
    """Before pandas is imported for an analysis command (``argv``: the arguments after the
    program name), make ``import pyarrow`` fail in this process (``sys.modules["pyarrow"] =
    None``, Python's documented way), so that pandas starts without it; whether it did.

    No command reads Arrow data, and text columns are Python strings either way
    (:func:`python_strings`); pandas >= 3 imports pyarrow and ``pyarrow.compute`` whole at
    start where pyarrow is installed, 0.06 s of every report (``benchmarks/bench_startup.py``
    and ``benchmarks/bench_report.py``; results listed in benchmarks/README.md). Nothing is
    changed once pandas or pyarrow is loaded, or for the other commands (``profile`` and
    ``wrap`` run the user's code)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in ANALYSIS_COMMANDS or "pandas" in sys.modules or "pyarrow" in sys.modules:
        return False
    sys.modules["pyarrow"] = None  # type: ignore[assignment]
    return True


class _StopsEarly:
    """``sys.stdout`` or ``sys.stderr`` of the console script, whose reader may stop reading
    before the end (``pardiag report … | head``): the first write to a closed pipe
    (``BrokenPipeError``) points the stream's file descriptor at ``os.devnull`` and the command
    goes on, so its page, JSON and exit code are what they would be; what the reader did not
    take is not written anywhere. Click's own handling would exit 1 at that write, saying
    nothing. Every other attribute is the wrapped stream's."""

    def __init__(self, stream) -> None:
        self._stream = stream

    @staticmethod
    def silence(stream) -> None:
        """Point ``stream``'s file descriptor at ``os.devnull`` (Python's documented answer to
        SIGPIPE); what is still in its buffer goes there."""
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self.silence(self._stream)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self.silence(self._stream)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def run() -> None:
    """The console script (``pardiag``, ``python -m pardiag``): :func:`main` in a process of its
    own, which exits with its code (:func:`keep_pyarrow_out` first).

    The garbage collector runs as :func:`collect_less` sets it, and what is alive at the end is
    frozen so the interpreter's exit does not traverse it again: together 0.1–0.2 s of a
    one-second report (``benchmarks/bench_startup.py``; the startup results in
    benchmarks/results/, listed in benchmarks/README.md)."""
    keep_pyarrow_out(sys.argv[1:])
    collect_less()
    sys.stdout = _StopsEarly(sys.stdout)
    sys.stderr = _StopsEarly(sys.stderr)
    try:
        code = main()
    finally:
        gc.freeze()
    sys.exit(code)
