"""The on-disk layout of a pardiag run folder, shared by collectors and analyzer.

A run folder written by ``pardiag profile`` holds::

    rank{R}.trace.json.gz         TRACE_TEMPLATE: gzipped Kineto Chrome trace of rank R
    pardiag/                      SIDECAR_DIR: everything else pardiag writes
        run.json                  RUN_FILE: one per run (command, start time, world size, ...);
                                  of a multi-node run: the job and node 0's part
        run.node{N}.json          NODE_RUN_TEMPLATE: node N's part of a multi-node run (its
                                  hosts, ranks, exit codes); :func:`join_run_files` joins them
        rank{R}.meta.json         RANK_META_TEMPLATE: per-rank metadata (host, device, status,
                                  memory, topology, detected parallel layout)
        rank{R}.meta.window.json  WINDOW_META_TEMPLATE: the same, written when the profiling
                                  window closed; removed once rank{R}.meta.json is written
        rank{R}.comms.json        COMMS_TEMPLATE: process groups and every collective and
                                  point-to-point op (group, seq, bytes, issue/start/end;
                                  CommsSidecar)
        rank{R}.pipeline.json     PIPELINE_TEMPLATE: forward/backward per stage and microbatch
                                  (PipelineSidecar)
        rank{R}.hang.json         HANG_TEMPLATE: what a rank was doing when --timeout expired
        rank{R}.stacks.txt        STACKS_TEMPLATE: every thread's Python stack, written when
                                  a rank that wrote no hang dump was signalled (--timeout)
        rank{R}.progress          PROGRESS_TEMPLATE: empty; its modification time is the
                                  rank's last optimizer step, within a second
                                  (--stall-timeout)
        dump-request              DUMP_REQUEST: created by the launcher when --timeout expires
    .pardiag-cache/               SUMMARY_DIR: per-rank summaries of the traces

Only the ranks' traces sit at the top: tools that take every ``*.json``/``*.gz`` file of a
folder as a trace (Holistic Trace Analysis 0.5 ``TraceAnalysis(trace_dir=...)``, which lists the
folder with ``os.listdir`` and keeps names ending in ``.json`` or ``.gz``, never descending into
subfolders) load exactly the ranks. Run folders written before (:data:`LEGACY`: the sidecars
beside the traces, ``.pardiag-dump-request``) are still read: :func:`find_sidecars` looks in
both places, and ``--overwrite`` removes both.

Every sidecar carries ``"schema": SIDECAR_SCHEMA`` and ``"schema_version": SCHEMA_VERSION`` so
the loader can tell them from traces and from JSON files of other tools.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import msgspec

from pardiag.errors import STOPPED_BY

SCHEMA_VERSION = 1

#: How a rank's error line (``failed_ranks``, its metadata's ``error``) begins when its launcher
#: stopped it (torchrun's SIGTERM after another rank failed, or on Ctrl-C): no failure of its own.
STOPPED_BY_LAUNCHER = "stopped by SIGTERM"

#: How a ``hang`` line of the run file begins when ``--timeout`` stopped a job that was still
#: making optimizer steps: a time limit reached, not a hang.
STILL_RUNNING = "the job was still running, not hung"

#: Value of the ``schema`` key in every pardiag sidecar file.
SIDECAR_SCHEMA = "pardiag"

#: Subfolder of a run folder that holds every file pardiag writes except the traces.
SIDECAR_DIR = "pardiag"
RUN_FILE = "run.json"
TRACE_TEMPLATE = "rank{rank}.trace.json.gz"
RANK_META_TEMPLATE = "rank{rank}.meta.json"
#: A rank's metadata as it stood when its profiling window closed (status ``running``): what a
#: report reads of a rank that never finished (a hang, a kill) in place of RANK_META_TEMPLATE,
#: which supersedes it (the rank removes it once that is written).
WINDOW_META_TEMPLATE = "rank{rank}.meta.window.json"
COMMS_TEMPLATE = "rank{rank}.comms.json"
PIPELINE_TEMPLATE = "rank{rank}.pipeline.json"
HANG_TEMPLATE = "rank{rank}.hang.json"
#: An empty file a rank touches at most once a second as it makes optimizer steps, with
#: ``--stall-timeout``: the launcher reads its modification time.
PROGRESS_TEMPLATE = "rank{rank}.progress"
STACKS_TEMPLATE = "rank{rank}.stacks.txt"
MONITOR_TEMPLATE = "rank{rank}.monitor.jsonl"
CAPTURE_REQUEST = "capture.request.json"
#: The findings a monitored run's launcher said while the run went on, one JSON object per line
#: (``kind``, ``rank`` where one is named, ``first_step``, ``last_step``, ``ongoing``, ``line``):
#: the report says which of them the whole run confirms.
SAID_FINDINGS = "monitor.said.jsonl"
CAPTURE_TEMPLATE = "capture-{step}"
#: A rank's trace while it is being written (in the sidecar folder, where no report reads
#: traces); renamed to ``TRACE_TEMPLATE`` when complete, so a rank stopped while writing leaves
#: no truncated trace under the trace's name.
PARTIAL_TRACE_TEMPLATE = "rank{rank}.trace.partial.json.gz"
#: Node N's part of run.json in a multi-node run (node 0 writes RUN_FILE: the job and its part).
NODE_RUN_TEMPLATE = "run.node{node}.json"
#: Created (in SIDECAR_DIR) by the launcher when --timeout expires; ranks then write their
#: HANG_TEMPLATE file.
DUMP_REQUEST = "dump-request"
#: The dump request of run folders written before SIDECAR_DIR (at the top of the run folder).
LEGACY_DUMP_REQUEST = ".pardiag-dump-request"
#: Folder (inside a trace folder) of per-rank summaries, one per trace file named
#: ``<trace file name>`` + SUMMARY_SUFFIX (see pardiag.analyzer.per_rank.store).
SUMMARY_DIR = ".pardiag-cache"
SUMMARY_SUFFIX = ".summary.json"

#: Names of files that are pardiag sidecars, never traces.
_SIDECAR_RE = re.compile(
    r"^(run\.json|run\.node[\w.-]+\.json|rank\d+\.(meta|meta\.window|comms|pipeline|hang)"
    r"\.json)$")
_TRACE_RE = re.compile(r"^rank\d+\.trace\.json\.gz$")


def user_cache_dir() -> Path:
    """pardiag's folder in the user's cache: ``$PARDIAG_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/pardiag``, else ``~/.cache/pardiag`` (summaries of read-only trace
    folders, the report page's packed plotly.js). Not created here."""
    import os

    env = os.environ.get("PARDIAG_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pardiag"


def sidecar_dir(run_dir: Path) -> Path:
    """The folder of ``run_dir`` that holds pardiag's sidecars (``run_dir/pardiag``)."""
    return Path(run_dir) / SIDECAR_DIR


def trace_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s trace inside ``run_dir`` (at the top: the only files there)."""
    return Path(run_dir) / TRACE_TEMPLATE.format(rank=rank)


def rank_meta_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s metadata sidecar inside ``run_dir``."""
    return sidecar_dir(run_dir) / RANK_META_TEMPLATE.format(rank=rank)


def window_meta_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s metadata as written when its profiling window closed."""
    return sidecar_dir(run_dir) / WINDOW_META_TEMPLATE.format(rank=rank)


def comms_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s collective records inside ``run_dir``."""
    return sidecar_dir(run_dir) / COMMS_TEMPLATE.format(rank=rank)


def pipeline_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s pipeline schedule records inside ``run_dir``."""
    return sidecar_dir(run_dir) / PIPELINE_TEMPLATE.format(rank=rank)


def monitor_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s always-on records (``pardiag profile --monitor``: one JSON line
    per :data:`pardiag.collectors.monitor.FLUSH_EVERY` steps) inside ``run_dir``."""
    return sidecar_dir(run_dir) / MONITOR_TEMPLATE.format(rank=rank)


def capture_request_path(run_dir: Path) -> Path:
    """Path of the request that asks every rank of a monitored run for a deep capture (a Kineto
    trace of given steps; ``{"start_step", "steps", "reason"}``)."""
    return sidecar_dir(run_dir) / CAPTURE_REQUEST


def said_findings_path(run_dir: Path) -> Path:
    """Path of the findings a monitored run's launcher said live (:data:`SAID_FINDINGS`)."""
    return sidecar_dir(run_dir) / SAID_FINDINGS


def capture_dir(run_dir: Path, start_step: int) -> Path:
    """The folder of a monitored run's deep capture that starts at ``start_step``: one
    ``rank{R}.trace.json.gz`` per rank, a folder ``pardiag report`` reads as it is."""
    return Path(run_dir) / CAPTURE_TEMPLATE.format(step=start_step)


#: What marks a page as pardiag's: the generator tag of its head, or (pages written before it
#: had one) the version line under its heading.
PAGE_MARKS = (b"<meta name='generator' content='pardiag", "\u00b7 pardiag ".encode())


def is_report_output(path: Path, page: bool | None = None) -> bool:
    """Whether ``path`` is an output of ``pardiag report`` or ``compare`` that no command reads
    as input: a page pardiag wrote (:data:`PAGE_MARKS`), or a report's or comparison's JSON
    (an object with ``schema_version``; not a sidecar, whose ``schema`` is
    :data:`SIDECAR_SCHEMA`, and not a trace). ``page``: which of the two to look for; None:
    by the name (``.html``/``.htm`` a page, ``.json`` a JSON, any other name neither)."""
    path = Path(path)
    if page is None:
        suffix = path.suffix.lower()
        if suffix not in (".html", ".htm", ".json") or is_sidecar_name(path.name):
            return False
        page = suffix != ".json"
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if page:
        return any(m in data for m in PAGE_MARKS)
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    return (isinstance(doc, dict) and "schema_version" in doc
            and doc.get("schema") != SIDECAR_SCHEMA and "traceEvents" not in doc)


def earlier_reports(run_dir: Path) -> list[Path]:
    """The report outputs (:func:`is_report_output`) in ``run_dir`` and its deep captures'
    folders: what ``pardiag report`` wrote there about an earlier run."""
    out = []
    for d in [Path(run_dir), *(c for _, c in capture_folders(run_dir))]:
        try:
            out += sorted(f for f in d.iterdir() if f.is_file() and is_report_output(f))
        except OSError:
            continue
    return out


#: A deep capture's folder name (:data:`CAPTURE_TEMPLATE`, its first step in digits).
_CAPTURE_NAME = re.compile(CAPTURE_TEMPLATE.format(step=r"(\d+)"))


def capture_step(name: str) -> int | None:
    """The first step of the deep capture a folder named ``name`` holds (``capture-S``, S
    digits), or None for any other name (``capture-notes``, the user's)."""
    m = _CAPTURE_NAME.fullmatch(name)
    return int(m.group(1)) if m is not None else None


def capture_folders(run_dir: Path) -> list[tuple[int, Path]]:
    """``(S, folder)`` of each folder in ``run_dir`` named as a deep capture is
    (:func:`capture_step`), by S."""
    out = []
    try:
        for d in Path(run_dir).glob(CAPTURE_TEMPLATE.format(step="*")):
            first = capture_step(d.name)
            if first is not None and d.is_dir():
                out.append((first, d))
    except OSError:
        return []
    return sorted(out, key=lambda c: c[0])


def _capture_request(run_dir: Path) -> tuple[dict | None, str | None]:
    """``(the capture request in run_dir, None)``; ``(None, None)`` without one; ``(None, why
    it cannot be read)`` when it is not JSON or not an object."""
    path = capture_request_path(run_dir)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror or exc})"
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        return None, f"{path}: not JSON ({exc})"
    return (doc, None) if isinstance(doc, dict) else (None, f"{path}: not a JSON object")


def read_capture_request(run_dir: Path) -> dict | None:
    """The launcher's capture request in ``run_dir`` (:func:`capture_request_path`: this
    request's ``start_step``, ``steps``, ``reason`` and every request so far in ``asked``), or
    None when there is none or it cannot be read (:func:`capture_request_problem` says
    which)."""
    return _capture_request(run_dir)[0]


def capture_request_problem(run_dir: Path) -> str | None:
    """Why ``run_dir``'s capture request cannot be read, in words (it is not JSON, not an
    object, or lists no capture it can read), or None when it reads or there is none."""
    doc, why = _capture_request(run_dir)
    if doc is not None and not asked_captures(doc):
        return f"{capture_request_path(run_dir)}: lists no capture with a start step and a " \
               "number of steps"
    return why


def asked_captures(req: dict | None) -> list[tuple[int, int, str | None]]:
    """(first, last step, reason or None) of each deep capture ``req``
    (:func:`read_capture_request`) asked for, in the order asked: its ``asked`` list, or (a
    request written before there was one) the one request it holds; empty without a request."""
    if not isinstance(req, dict):
        return []
    asked = req.get("asked")
    out = []
    for r in asked if isinstance(asked, list) else [req]:
        try:
            first, n = int(r["start_step"]), int(r["steps"])
        except (TypeError, KeyError, ValueError):
            continue
        reason = r.get("reason")
        if first >= 0:
            out.append((first, first + max(n, 1) - 1,
                        reason if isinstance(reason, str) and reason else None))
    return out


class CaptureRecord(msgspec.Struct, kw_only=True, frozen=True):
    """What a deep capture's own run file records of where it comes from
    (:attr:`RunFile.capture`): the monitored run's folder (absolute, as the launcher wrote it),
    the first and last step asked for, and the finding it was asked on (None: none given)."""

    monitored_run: Annotated[str, msgspec.Meta(min_length=1)]
    first_step: Annotated[int, msgspec.Meta(ge=0)]
    last_step: Annotated[int, msgspec.Meta(ge=0)]
    reason: str | None = None


def capture_record(own: RunFile | None) -> tuple[dict | None, str | None]:
    """A deep capture's own record of where it comes from (:attr:`RunFile.capture` of its
    run file ``own``, read as a :class:`CaptureRecord`): ``({"monitored_run", "first_step",
    "last_step", "reason"}, None)``; ``(None, None)`` without one (a profiled run's file, or
    one written before it was recorded); ``(None, why)`` when the record is there but not
    one (a wrong type, a last step before the first)."""
    rec = own.capture if own is not None else None
    if rec is None:
        return None, None
    try:
        got = msgspec.convert(rec, CaptureRecord)
    except msgspec.ValidationError:
        got = None
    if got is None or got.last_step < got.first_step:
        return None, ("'capture' is not a record of the monitored run, its first and last step "
                      "and the finding")
    return {"monitored_run": got.monitored_run, "first_step": got.first_step,
            "last_step": got.last_step, "reason": got.reason or None}, None


def _same_job(run_dir: Path, own: RunFile | None, first: int) -> bool:
    """Whether ``run_dir`` is the monitored run a capture starting at step ``first`` with the
    run file ``own`` comes from: its capture request asked for that step, or (the request
    unreadable) its run file names the same job (the same start time); with no start time on
    either side, its request must say so."""
    if any(a == first for a, _, _ in asked_captures(read_capture_request(run_dir))):
        return True
    try:
        run = decode_sidecar(run_file_path(run_dir).read_bytes(), "run")
    except (OSError, ValueError):
        return False
    return (own is not None and own.started_unix is not None
            and run.started_unix == own.started_unix and run.monitor_every is not None)


def capture_context(folder: Path, own: RunFile | None = None) -> dict | None:
    """Of a monitored run's deep capture: ``{"monitored_run": the run folder (absolute),
    "first_step": S, "last_step": the last step asked for, "reason": the finding it was asked
    for, or None when the request gives none, "monitored_run_found": whether that folder is
    there and holds that run}``.

    ``folder`` is ``capture-S/`` inside a run folder whose capture request asked for steps
    from S; else the capture's own run file ``own`` (:func:`capture_record`) says which run it
    came from (a capture copied or moved away from its run, renamed, or beside a request that
    cannot be read): found there when that folder is the same job (:func:`_same_job`; another
    run written to the same path since is not), else in the folder that holds the capture when
    that is. None for any other folder, and for a capture neither lists (an earlier run's)."""
    folder = Path(folder).resolve()
    step = capture_step(folder.name)
    if step is not None:
        for first, last, reason in asked_captures(read_capture_request(folder.parent)):
            if first == step:
                return {"monitored_run": str(folder.parent), "first_step": first,
                        "last_step": last, "reason": reason, "monitored_run_found": True}
    rec, _ = capture_record(own)
    if rec is None:
        return None
    first = rec["first_step"]
    at = Path(rec["monitored_run"])
    for where in (at, folder.parent):
        if where.is_dir() and _same_job(where, own, first):
            return {**rec, "monitored_run": str(where.resolve()), "monitored_run_found": True}
    return {**rec, "monitored_run_found": False}


def progress_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s progress file (:data:`PROGRESS_TEMPLATE`) inside ``run_dir``."""
    return sidecar_dir(run_dir) / PROGRESS_TEMPLATE.format(rank=rank)


def hang_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s hang dump inside ``run_dir``."""
    return sidecar_dir(run_dir) / HANG_TEMPLATE.format(rank=rank)


def stacks_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s thread stacks (written on SIGUSR1) inside ``run_dir``."""
    return sidecar_dir(run_dir) / STACKS_TEMPLATE.format(rank=rank)


def partial_trace_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s trace while it is being written (``PARTIAL_TRACE_TEMPLATE``)."""
    return sidecar_dir(run_dir) / PARTIAL_TRACE_TEMPLATE.format(rank=rank)


def run_file_path(run_dir: Path) -> Path:
    """Path of the run file inside ``run_dir``."""
    return sidecar_dir(run_dir) / RUN_FILE


def node_run_path(run_dir: Path, node: int | str | None) -> Path:
    """Path of a node's part of the run file: ``run.json`` for node 0 (or a single-node run,
    ``node`` None or 0), else ``run.node{node}.json`` (``node`` may be a host name where the
    node's rank is unknown)."""
    if node in (None, 0):
        return run_file_path(run_dir)
    return sidecar_dir(run_dir) / NODE_RUN_TEMPLATE.format(node=node)


def rank_files(run_dir: Path, rank: int) -> list[Path]:
    """The files rank ``rank`` writes into ``run_dir`` (trace and sidecars; not the summary,
    which is checked against its trace)."""
    return [trace_path(run_dir, rank), rank_meta_path(run_dir, rank),
            window_meta_path(run_dir, rank), comms_path(run_dir, rank),
            pipeline_path(run_dir, rank), hang_path(run_dir, rank), stacks_path(run_dir, rank),
            partial_trace_path(run_dir, rank), monitor_path(run_dir, rank),
            progress_path(run_dir, rank),
            *(trace_path(d, rank) for _, d in capture_folders(run_dir))]


#: The folder of the i-th run of a repeated profile (``pardiag profile --repeat N``) in its set.
REPEAT_TEMPLATE = "run-{i}"


def repeat_path(set_dir: Path, i: int) -> Path:
    """Folder of the ``i``-th run (from 1) of a set of repeated runs (:data:`REPEAT_TEMPLATE`)."""
    return Path(set_dir) / REPEAT_TEMPLATE.format(i=i)


def _natural(name: str) -> list:
    """Sort key that orders ``run-2`` before ``run-10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _run_folders(folder: Path) -> list[Path]:
    """The pardiag run folders (each with sidecars, :func:`find_sidecars`) among ``folder``'s
    subfolders, in natural order of their names, when ``folder`` is not itself a run (it holds
    no trace and no sidecar) and there are two or more; else empty."""
    folder = Path(folder)
    try:
        if not folder.is_dir() or find_sidecars(folder) or any(
                is_trace_name(f.name) for f in folder.iterdir() if f.is_file()):
            return []
        runs = [d for d in folder.iterdir() if d.is_dir() and find_sidecars(d)]
    except OSError:
        return []
    return sorted(runs, key=lambda d: _natural(d.name)) if len(runs) >= 2 else []


def _job(run_dir: Path) -> tuple | None:
    """What makes runs repeats of one job, from ``run_dir``'s run file: the script, its
    arguments, the world size, the nodes, and whether it was monitored or profiled; None
    when the run file is missing or unreadable (the job is not known)."""
    for path in (run_file_path(run_dir), Path(run_dir) / RUN_FILE):
        try:
            run = decode_sidecar(path.read_bytes(), "run")
        except (OSError, ValueError):
            continue
        # the fields RunFile.job_differences compares, and whether the run was monitored
        return (run.script, tuple(run.script_args), run.world_size, run.nnodes,
                run.monitor_every is not None)
    return None


def repeat_runs(folder: Path) -> list[Path]:
    """The run folders of a set of repeated runs, in natural order of their names; empty when
    ``folder`` is not such a set.

    A set is a folder that is not itself a run (it holds no trace and no sidecar) and whose
    subfolders include two or more pardiag run folders of one job (:func:`_job`: the same
    script, arguments, world size and nodes, each profiled): what ``pardiag profile --repeat
    N`` writes (``run-1`` … ``run-N``), or repeats a user gathered in one folder. Other
    subfolders are not runs and are left out. Runs of other jobs, or whose job is not known,
    are no set (:func:`unlike_runs` says why)."""
    runs = _run_folders(folder)
    jobs = {_job(r) for r in runs}
    job = next(iter(jobs)) if len(jobs) == 1 else None
    return runs if job is not None and not job[-1] else []


def unlike_runs(folder: Path) -> str | None:
    """Why the run folders gathered in ``folder`` are no set of repeated runs (they are of
    other jobs, monitored, or without a readable run file), naming two that differ; None when
    they are a set or ``folder`` gathers fewer than two runs."""
    runs = _run_folders(folder)
    if not runs or repeat_runs(folder):
        return None
    jobs = [_job(r) for r in runs]

    def what(job: tuple | None) -> str:
        if job is None:
            return "no readable run file"
        kind = "monitored" if job[-1] else "profiled"
        return f"{kind} {' '.join([job[0] or '?', *job[1]])} on {job[2]} ranks"
    unknown = [r for r, j in zip(runs, jobs) if j is None]
    if unknown:
        return f"{unknown[0].name} has {what(None)}"
    monitored = [r for r, j in zip(runs, jobs) if j is not None and j[-1]]
    if monitored and len({j for j in jobs}) == 1:
        return f"they are monitored runs ({monitored[0].name}: {what(jobs[0])})"
    b = next(i for i, j in enumerate(jobs) if j != jobs[0])
    return (f"{runs[0].name} is a {what(jobs[0])}, {runs[b].name} a {what(jobs[b])}")


def dump_request_path(run_dir: Path) -> Path:
    """Path of the file whose existence asks every rank for its hang dump."""
    return sidecar_dir(run_dir) / DUMP_REQUEST


def is_sidecar_name(name: str) -> bool:
    """True when a file name is one of pardiag's sidecars (run file or rank metadata)."""
    return _SIDECAR_RE.match(name) is not None


def is_trace_name(name: str) -> bool:
    """True when a file name is a trace written by pardiag (``TRACE_TEMPLATE``)."""
    return _TRACE_RE.match(name) is not None


def find_sidecars(folder: Path) -> list[Path]:
    """pardiag's sidecar files of a run folder, in this layout (``folder/pardiag/``) and in the
    legacy one (beside the traces); sorted, the legacy ones first. Empty for a folder that is no
    pardiag run (or cannot be listed)."""
    out: list[Path] = []
    for d in (Path(folder), sidecar_dir(folder)):
        try:
            out.extend(sorted(f for f in d.iterdir() if is_sidecar_name(f.name) and f.is_file()))
        except OSError:
            continue
    return out


def owned_files(run_dir: Path) -> list[Path]:
    """Every file pardiag wrote into ``run_dir`` (traces, sidecars and dump requests, both
    layouts; a monitored run's records, its capture request, its findings said live and
    its deep captures' folders, summaries included; not the run's own summaries in
    SUMMARY_DIR, which are checked against their traces): what ``--overwrite`` replaces, and
    what a report must never write over."""
    run_dir = Path(run_dir)
    out = list(find_sidecars(run_dir))
    try:
        out += sorted(f for f in sidecar_dir(run_dir).glob(MONITOR_TEMPLATE.format(rank="*"))
                      if f.is_file())
        for own in (capture_request_path(run_dir), said_findings_path(run_dir)):
            if own.is_file():
                out.append(own)
        for _, d in capture_folders(run_dir):
            out += owned_files(d)
            out += sorted(f for f in (d / SUMMARY_DIR).glob("*" + SUMMARY_SUFFIX)
                          if f.is_file())
    except OSError:
        pass
    try:
        out += sorted(f for f in run_dir.iterdir() if f.is_file() and (
            is_trace_name(f.name) or f.name == LEGACY_DUMP_REQUEST))
    except OSError:
        pass
    if dump_request_path(run_dir).is_file():
        out.append(dump_request_path(run_dir))
    try:
        out += sorted(f for f in sidecar_dir(run_dir).glob("rank*.stacks.txt") if f.is_file())
        out += sorted(f for f in sidecar_dir(run_dir).glob(
            PARTIAL_TRACE_TEMPLATE.format(rank="*")) if f.is_file())
    except OSError:
        pass
    return sorted(out)


def full_buffer_bytes(op: str, in_bytes: int, out_bytes: int, group_size: int | None) -> int:
    """The full buffer of a collective (bytes; nccl-tests' S): the larger of its input and
    output, except for an all-gather whose recorded output is no larger than its input over a
    group of more than one rank: its input × the group's size. (The flight recorder gives the
    input for both when a functional collective allocates the output itself, as DTensor's
    tensor-parallel gathers do: 256 KiB recorded for a 512 KiB gather at tp=2, 256 KiB again
    for the 1 MiB gather at tp=4.)"""
    if op == "all_gather" and group_size and group_size > 1 and 0 < out_bytes <= in_bytes:
        return in_bytes * group_size
    return max(in_bytes, out_bytes)


def sidecar_header(kind: str) -> dict:
    """The keys every sidecar starts with: schema, schema version and kind (``run`` or ``rank``)."""
    return {"schema": SIDECAR_SCHEMA, "schema_version": SCHEMA_VERSION, "kind": kind}


#: Prefixes of the environment variables each rank records (``RankMeta.env``): the settings of
#: NCCL and of torch (``pardiag compare`` shows the differences between two runs).
ENV_PREFIXES = ("NCCL_", "TORCH_", "PYTORCH_")


# --- What the run file and the rank metadata hold ------------------------------------------------
# Written by the collectors (launch.py: RunFile; rank_entry.py: RankMeta) with encode_sidecar,
# decoded once by the loader (pardiag.analyzer.trace.load) with decode_sidecar. Every field has a
# default, so a file of an older pardiag (or a test's partial one) decodes; unknown keys are
# ignored, so a newer pardiag's file decodes too. A value of the wrong type is an error that names
# the field (the loader then ignores the file with a warning).


class ProfilerSchedule(msgspec.Struct, kw_only=True, frozen=True):
    """The ``torch.profiler`` schedule the ranks used (``--wait/--warmup/--active``).

    Attributes:
        wait: optimizer steps skipped before the profiler warms up.
        warmup: optimizer steps profiled and discarded.
        active: optimizer steps recorded in the trace.
    """

    wait: int = 1
    warmup: int = 1
    active: int = 3


class RunFile(msgspec.Struct, kw_only=True, frozen=True):
    """``pardiag/run.json``: one per run, written by the launcher when torchrun has finished.

    Attributes:
        schema: always SIDECAR_SCHEMA (tells a pardiag sidecar from other JSON).
        schema_version: SCHEMA_VERSION of the writer.
        kind: always ``"run"``.
        pardiag_version: the pardiag that wrote the run.
        command: the ``pardiag profile`` command line (shell-quoted).
        script: the training script as given.
        script_args: the script's own arguments.
        world_size: ranks started (all nodes).
        nproc_per_node: ranks started on this node.
        nnodes: nodes of the job (1: ``pardiag profile`` ran ``torchrun --standalone``).
        node_rank: the node this file describes (0 also writes the job's fields; None: not
            known). A multi-node run has one file per node (``run.json`` of node 0,
            ``run.node{N}.json`` of the others): :func:`join_run_files` makes them one.
        schedule: the profiler schedule.
        started_unix: when torchrun was started (seconds since the epoch, UTC).
        ended_unix: when torchrun had finished (seconds since the epoch, UTC).
        torchrun_exit_code: torchrun's own exit code.
        exit_code: the exit code passed on: the first non-zero rank's, 124 after ``--timeout``,
            else torchrun's.
        timed_out_after_s: the ``--timeout`` that expired (None: it did not).
        stalled_after_s: the ``--stall-timeout`` that expired: no rank had made an optimizer
            step or moved on for that long (None: it did not).
        hang: one line per collective the job was stuck in when it was stopped.
        nodes: ``{host name: [ranks on it]}`` from the rank metadata (of this node's ranks in a
            node's part).
        layout: the parallel layout rank 0 detected: ``dims`` (``{"dp": 2, ...}``),
            ``strategies``, ``pipeline`` (schedule, stages, microbatches, ...) and
            ``fsdp_reshard_after_forward`` when known, ``folded`` (``{"ep": "dp"}``) when expert
            parallelism is folded into data parallelism.
        backend: the process group backend (``gloo``, ``nccl``; a list when ranks differ).
        torch_version: torch's version (a list when ranks differ).
        failed_ranks: ``{rank as a string: error line}`` of ranks that raised or exited non-zero.
        missing_ranks: ranks that wrote no metadata (killed before they finished).
        missing_nodes: nodes whose part was not found when the parts were joined (filled in by
            :func:`join_run_files`, never written).
        load_before, load_after: the host's 1, 5 and 15 minute load averages
            (``os.getloadavg``) when the job started and when it ended (this node's host; None
            where the OS has none): whether other work shared the machine, which moves a run's
            step time as a whole.
        host_probe_before_ms, host_probe_after_ms: how long a fixed single-core workload took
            on this node's host just before the job started and just after it ended (ms,
            :func:`pardiag.collectors.launch.host_probe_ms`; None: not measured, e.g. after
            Ctrl-C). A slower probe means a slower host (a virtual machine's neighbours), which
            moves the step time of the whole run.
        monitor_every: with ``pardiag profile --monitor``, the steps per line of each rank's
            monitor file (:func:`monitor_path`); None: a profiled run.
        capture: in a monitored run's deep capture only (``capture-S/pardiag/run.json``):
            ``{"monitored_run": the run folder (absolute, as the launcher wrote it),
            "first_step": S, "last_step": the last step asked for, "reason": the finding it was
            asked on, or None}``, so that a capture copied away from its run still says where
            it comes from (:func:`capture_context`); None elsewhere.
    """

    schema: str = SIDECAR_SCHEMA
    schema_version: int = SCHEMA_VERSION
    kind: str = "run"
    pardiag_version: str | None = None
    command: str | None = None
    script: str | None = None
    script_args: list[str] = msgspec.field(default_factory=list)
    world_size: int | None = None
    nproc_per_node: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    schedule: ProfilerSchedule | None = None
    started_unix: float | None = None
    ended_unix: float | None = None
    torchrun_exit_code: int | None = None
    exit_code: int | None = None
    timed_out_after_s: float | None = None
    stalled_after_s: float | None = None
    hang: list[str] = msgspec.field(default_factory=list)
    nodes: dict[str, list[int]] = msgspec.field(default_factory=dict)
    layout: dict[str, Any] | None = None
    backend: str | list[str] | None = None
    torch_version: str | list[str] | None = None
    failed_ranks: dict[str, str] = msgspec.field(default_factory=dict)
    missing_ranks: list[int] = msgspec.field(default_factory=list)
    missing_nodes: list[int] = msgspec.field(default_factory=list)
    load_before: list[float] | None = None
    load_after: list[float] | None = None
    host_probe_before_ms: float | None = None
    host_probe_after_ms: float | None = None
    monitor_every: int | None = None
    capture: dict[str, Any] | None = None

    @property
    def stopped_by_user(self) -> str | None:
        """``"Ctrl-C"`` or ``"SIGTERM"`` where the user stopped ``pardiag profile`` (it stopped
        the job: torchrun's exit code is then the launcher's own, 130 or 143); None otherwise,
        as where torchrun stopped the ranks after one was killed (its own code, 1). A run file
        without torchrun's code is judged by its exit code alone."""
        code = self.exit_code
        if code is None or self.torchrun_exit_code not in (code, None):
            return None
        return STOPPED_BY.get(code)

    def job_differences(self, other: RunFile) -> list[tuple[str, Any, Any]]:
        """What makes ``other`` another job than this run's, in the words the messages use:
        ``[("scripts", a, b), ("script arguments", …), ("world sizes", …), ("node counts",
        …)]``, only the fields that differ; empty for repeats of one job (its nodes' parts
        included: they differ only in ``node_rank``). The one definition of "one job" that
        repeats, a run's parts and compared runs share."""
        return [(what, x, y) for what, x, y in (
            ("scripts", self.script, other.script),
            ("script arguments", " ".join(self.script_args or []),
             " ".join(other.script_args or [])),
            ("world sizes", self.world_size, other.world_size),
            ("node counts", self.nnodes, other.nnodes)) if x != y]


def join_run_files(parts: list[RunFile]) -> RunFile | None:
    """One run file from the parts of a run's nodes (``run.json`` and ``run.node{N}.json``, from
    one shared run folder or each node's own).

    The job's fields (command, script, world size, nnodes, schedule, start) come from node 0's
    part (else the lowest node's); hosts, failed and missing ranks and hang lines are the union
    of the parts; the start is the earliest and the end the latest; the exit code the first
    non-zero one (node order); ``missing_nodes`` lists the nodes below ``nnodes`` with no part.
    None when ``parts`` is empty."""
    if not parts:
        return None
    if len(parts) == 1 and not (parts[0].nnodes or 1) > 1:
        return parts[0]
    by_node = sorted(parts, key=lambda p: (p.node_rank is None, p.node_rank or 0))
    base = by_node[0]
    nodes: dict[str, list[int]] = {}
    failed: dict[str, str] = {}
    missing: set[int] = set()
    hang: list[str] = []
    for p in by_node:
        for host, ranks in p.nodes.items():
            nodes[host] = sorted({*nodes.get(host, []), *ranks})
        failed.update(p.failed_ranks)
        missing.update(p.missing_ranks)
        hang.extend(h for h in p.hang if h not in hang)
    have = {p.node_rank for p in parts if p.node_rank is not None}
    n = base.nnodes or 1
    starts = [p.started_unix for p in parts if p.started_unix is not None]
    ends = [p.ended_unix for p in parts if p.ended_unix is not None]
    codes = [p.exit_code for p in by_node if p.exit_code]
    return msgspec.structs.replace(
        base, nodes=dict(sorted(nodes.items(), key=lambda kv: min(kv[1] or [0]))),
        failed_ranks=dict(sorted(failed.items(), key=lambda kv: int(kv[0]))),
        missing_ranks=sorted(missing), hang=hang,
        started_unix=min(starts) if starts else None, ended_unix=max(ends) if ends else None,
        exit_code=codes[0] if codes else base.exit_code,
        timed_out_after_s=next((p.timed_out_after_s for p in by_node
                                if p.timed_out_after_s is not None), None),
        stalled_after_s=next((p.stalled_after_s for p in by_node
                              if p.stalled_after_s is not None), None),
        missing_nodes=sorted(set(range(n)) - have) if have else [])


class ShardedParam(msgspec.Struct, kw_only=True, frozen=True):
    """A tensor-parallel (DTensor) parameter: what a TP degree must divide.

    Attributes:
        name: qualified parameter name in its root module (``layers.0.w1.weight``).
        shape: the full (global, unsharded) shape, elements per dimension.
        placements: the DTensor placement on each mesh dimension as torch writes it
            (``Shard(dim=0)``, ``Replicate()``, ``_StridedShard(dim=0, sf=2)``).
        mesh_dims: the mesh dimension names (``["dp", "tp"]``; None for an unnamed one).
        tp_dims: the tensor dimensions sharded over the tensor-parallel mesh dimension (a mesh
            dimension named ``tp``/``tensor``/``sp``, or the only dimension of an unnamed 1-D mesh
            when no FSDP manages the parameter).
    """

    name: str
    shape: list[int]
    placements: list[str] = msgspec.field(default_factory=list)
    mesh_dims: list[str | None] = msgspec.field(default_factory=list)
    tp_dims: list[int] = msgspec.field(default_factory=list)


class AttentionHeads(msgspec.Struct, kw_only=True, frozen=True):
    """An attention module's heads: a TP degree must divide them (and the KV heads under GQA).

    Attributes:
        module: qualified module name in its root module.
        type: the module's class name.
        heads: attention (query) heads.
        kv_heads: key/value heads (grouped-query attention); None when equal to ``heads`` or
            not exposed.
        source: ``"attributes"`` (``num_heads``, ``num_attention_heads``, ``n_heads``,
            ``num_key_value_heads``, ``n_kv_heads``) or ``"projections"`` (output features of
            ``q_proj``/``k_proj`` over ``head_dim``).
    """

    module: str
    type: str
    heads: int
    kv_heads: int | None = None
    source: str = "attributes"


class ModelShapes(msgspec.Struct, kw_only=True, frozen=True):
    """The shapes that constrain how a rank's model can be split, recorded by the collector
    (``pardiag.collectors.shapes.model_shapes``) when the profiler's window ends.

    Attributes:
        sharded_params: the rank's tensor-parallel parameters (FSDP/ZeRO shards need nothing:
            they pad uneven shards).
        attention: attention modules whose heads are exposed.
        stage_layers: per local pipeline stage (its index as a decimal string: a JSON object
            key), the layers its module can be split into: its direct children, a container
            child (``ModuleList``, ``ModuleDict``, ``Sequential``) counted by its items.
        batch_samples: dim 0 of the first tensor given to the rank's top-level module (the
            outermost module call with gradients on that has the most parameters, before the
            first optimizer step): the per-rank batch in samples (one accumulation step's), or
            the microbatch in a pipeline; None when unseen.
        batch_module: the class name of that module.
        batch_calls: that module's calls with gradients on before the first optimizer step
            (gradient accumulation: more than 1; in a pipeline, microbatches × local stages).
        batch_shape: the whole shape of that tensor; None when unseen.
        batch_integer: whether that tensor's dtype is an integer one (token ids: its elements
            are the tokens of one call); None when unseen.
        truncated: True when more than ``MAX_SHAPES`` parameters or modules were found (the
            rest are not recorded).
    """

    sharded_params: list[ShardedParam] = msgspec.field(default_factory=list)
    attention: list[AttentionHeads] = msgspec.field(default_factory=list)
    stage_layers: dict[str, int] = msgspec.field(default_factory=dict)
    batch_samples: int | None = None
    batch_module: str | None = None
    batch_calls: int | None = None
    batch_shape: list[int] | None = None
    batch_integer: bool | None = None
    truncated: bool = False


#: At most this many sharded parameters and attention modules are recorded per rank.
MAX_SHAPES = 20_000


class RankMeta(msgspec.Struct, kw_only=True, frozen=True):
    """``pardiag/rank{R}.meta.json``: written by each rank when its script has ended.

    Attributes:
        schema: always SIDECAR_SCHEMA.
        schema_version: SCHEMA_VERSION of the writer.
        kind: always ``"rank"``.
        rank: global rank.
        world_size: ranks of the job.
        local_rank: rank on its node.
        pid: the rank's process id.
        host: host name (ranks with the same one share a clock).
        cpu_count: CPUs of the host (``os.cpu_count()``).
        intra_op_threads: torch's intra-op threads when the script ended
            (``torch.get_num_threads()``).
        cpu_affinity: the cores the rank may run on when the script ended
            (``os.sched_getaffinity``), None where the OS does not say.
        pinned_by_pardiag: ``pardiag profile --pin-cpu`` gave the rank its own cores.
        nccl_version: NCCL's version on GPU hosts.
        nvidia_smi_topo: ``nvidia-smi topo -m`` output (local rank 0 of GPU hosts).
        torch_version: torch's version.
        pardiag_version: the pardiag that wrote the file.
        backend: the process group backend (None: no process group).
        device: ``cpu`` or ``cuda:N``.
        device_name: the GPU's name, or the CPU's.
        device_memory_bytes: the GPU's memory (None on CPU).
        optimizer_steps: optimizer steps the rank counted (the profiler steps with them).
        optimizer_step_times_us: ``[step, start, end]`` of every counted optimizer step (epoch µs).
        trace_file: the trace's file name in the run folder (None: no trace was written).
        comm_records: collective and point-to-point records written to its comms sidecar.
        memory: ``static`` (bytes of local parameters, gradients, optimizer state), peak RSS or
            CUDA peak allocated/reserved bytes, ``trace_peaks`` (the trace's memory events' peak
            per device type).
        layout: the parallel layout the rank detected (dims, strategies, group_dims, pipeline,
            DDP bucket cap and parameter bytes, FSDP settings), or None.
        shapes: what constrains the split of the rank's model (tensor-parallel shapes,
            attention heads, pipeline layers, batch), or None (not recorded).
        started_unix: when the script started (seconds since the epoch, UTC).
        ended_unix: when it ended.
        exit_code: the script's exit code.
        instrumentation: what pardiag's own hooks did: ``post_window_s`` (seconds the work
            when the profiler's window ended took: trace export, flight-recorder dump,
            live-object scans; it follows optimizer step ``post_window_after_step``, so the
            period of the next step holds it and is never used as a step time), and per
            wrapper the calls inside the window (recorded) and outside it (``p2p_calls``,
            ``chunk_calls``: ``{"window": n, "outside": n}``), and ``wrapper_cost_us``: what
            each wrapper adds to one call outside the window, timed on a no-op after the
            script (``{"p2p": µs, "chunk": µs}``, and ``monitor_call`` with ``--monitor``,
            whose ``monitor_calls`` are ``{"calls": n, "steps": n}`` recorded); None: not
            recorded (runs of an older pardiag).
        status: ``ok`` or ``error``; ``running`` in the metadata written when the profiling
            window closed (:data:`WINDOW_META_TEMPLATE`) or a monitored run's deep capture
            ended (in ``capture-S/``): the rank had not finished then, and its
            ``optimizer_steps``, ``optimizer_step_times_us`` and memory stop there.
        error: the script's exception on one line when ``status`` is ``error``.
        env: the rank's environment variables whose names start with one of
            :data:`ENV_PREFIXES` (``NCCL_*``, ``TORCH_*``, ``PYTORCH_*``); None: not recorded
            (runs of an older pardiag).
        node_rank: the rank's node (torchrun's ``GROUP_RANK``, SLURM's ``SLURM_NODEID``);
            None: not known.
        launch_id: the ``pardiag profile`` process that started the rank (tells a node's
            launcher its own ranks in a shared run folder); None under ``pardiag wrap``.
        peak_flops: on a CPU rank, the FLOP/s per dtype its threads reached in a short matmul
            when it started (``{"float32": FLOP/s}``, :func:`pardiag.collectors.peak.measure`;
            the peak its MFU is computed against); None: not measured (a GPU rank, whose peak is
            its device's datasheet figure, or runs of an older pardiag).
    """

    schema: str = SIDECAR_SCHEMA
    schema_version: int = SCHEMA_VERSION
    kind: str = "rank"
    rank: int
    world_size: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    host: str | None = None
    cpu_count: int | None = None
    intra_op_threads: int | None = None
    cpu_affinity: list[int] | None = None
    pinned_by_pardiag: bool = False
    nccl_version: str | None = None
    nvidia_smi_topo: str | None = None
    torch_version: str | None = None
    pardiag_version: str | None = None
    backend: str | None = None
    device: str | None = None
    device_name: str | None = None
    device_memory_bytes: int | None = None
    peak_flops: dict[str, float] | None = None
    optimizer_steps: int | None = None
    optimizer_step_times_us: list[list[float]] = msgspec.field(default_factory=list)
    trace_file: str | None = None
    comm_records: int = 0
    memory: dict[str, Any] = msgspec.field(default_factory=dict)
    layout: dict[str, Any] | None = None
    shapes: ModelShapes | None = None
    started_unix: float | None = None
    ended_unix: float | None = None
    exit_code: int | None = None
    instrumentation: dict[str, Any] | None = None
    status: str | None = None
    error: str | None = None
    env: dict[str, str] | None = None
    node_rank: int | None = None
    launch_id: str | None = None


def contention_note(metas) -> str | None:
    """One sentence when CPU ranks on one host contend for its cores, else None.

    Contended: the host's CPU ranks run more intra-op threads in all than the cores they may
    use, or two of them may run on the same core (their ``cpu_affinity`` sets intersect: the
    OS may put both on it). GPU ranks are left out: their timings are the device's. Ranks
    without ``intra_op_threads`` (recorded before pardiag 0.x, or traces from elsewhere) are
    not judged.

    Args:
        metas: :class:`RankMeta` of the run's ranks (any iterable)."""
    hosts: dict[str, list] = {}
    for m in metas:
        if m.device and not str(m.device).startswith("cpu"):
            continue
        hosts.setdefault(str(m.host or "?"), []).append(m)
    found = []
    for host, ms in sorted(hosts.items()):
        if not all(m.intra_op_threads for m in ms):
            continue
        ranks = ",".join(str(m.rank) for m in sorted(ms, key=lambda m: m.rank))
        threads = sum(int(m.intra_op_threads) for m in ms)
        affs = [frozenset(m.cpu_affinity) for m in ms if m.cpu_affinity]
        cores = (len(frozenset().union(*affs)) if len(affs) == len(ms)
                 else max(int(m.cpu_count or 0) for m in ms))
        shared = len(affs) == len(ms) and any(
            a & b for i, a in enumerate(affs) for b in affs[i + 1:])
        where = f"on {host}" if len(hosts) > 1 else "on this host"
        if cores and threads > cores:
            found.append(f"ranks {ranks} run {threads} intra-op threads on {cores} core(s) "
                         f"{where}")
        elif shared:
            span = sorted(frozenset().union(*affs))
            found.append(f"ranks {ranks} may run on the same cores {where} (each may use "
                         f"{len(affs[0])} of cores {span[0]}–{span[-1]})")
    if not found:
        return None
    return ("timings are contended: " + "; ".join(found) + " — pin each rank to its own cores "
            "(pardiag profile --pin-cpu) or give each fewer threads (torch.set_num_threads)")


# --- What the comms and pipeline sidecars hold ----------------------------------------------------
# Written by the collectors (rank_entry.py) as plain JSON, decoded once by the loader with
# decode_rank_sidecar. Their lists are decoded entry by entry: a malformed entry is left out with
# a warning naming the file; a file whose ``records`` (or ``process_groups``) is not a list, or
# whose own fields have the wrong type, is ignored with a warning. Unknown keys are ignored.


class ProcessGroupRecord(msgspec.Struct, kw_only=True, frozen=True):
    """One process group of a rank (``rank{R}.comms.json``'s ``process_groups``).

    Attributes:
        name: the group's name (``"0"``, ``"1"``, ...), as its records' ``pg_name``.
        ranks: its members (global ranks).
        desc: its description (``default_pg``, ``mesh_tp``, ...; ``""`` when none).
        size: members, as the group states it.
        backend: the group's backend (``gloo``, ``nccl``).
        dim: the parallel dimension the rank's layout gives the group (``dp``, ``tp``, ...;
            None when none does).
    """

    name: str
    ranks: list[int]
    desc: str = ""
    size: int | None = None
    backend: str | None = None
    dim: str | None = None


class CommRecord(msgspec.Struct, kw_only=True, frozen=True):
    """One collective or point-to-point op a rank issued (``rank{R}.comms.json``'s ``records``;
    :mod:`pardiag.analyzer.trace.comm_records` makes and places them).

    Attributes:
        op: standard collective name (``all_reduce``, ``send``, ...).
        pg_name: its process group's name.
        seq: its sequence number in the group.
        pg_desc: the group's description.
        pg_ranks: the group's members (global ranks).
        trace_name: the trace event that ran it (``gloo:all_reduce``).
        in_bytes, out_bytes: the input's and output's size (bytes).
        bytes: the full buffer (bytes; nccl-tests' S, :func:`full_buffer_bytes`).
        numel: elements of the input.
        dtype: the input's element type.
        peer: the other rank of a send or recv (group rank), else None.
        root: the root of a rooted op (broadcast, reduce, ...), when recorded.
        source: what recorded it (``flight_recorder``, ``p2p_hook``).
        issue_us: when the program issued it (µs, the trace's clock).
        start_us, end_us: where it ran on the trace (µs, the trace's clock); None when no
            event was found.
        matched: what placed it on the trace (``kernel``, ``gloo``, ``cpu op``, ``none``).
        transport_op: the op the backend ran it as, where another one (gloo's reduce_scatter
            is an all_reduce).
        stream: the GPU stream its first kernel ran on (placed on a kernel), else None.
    """

    op: str
    pg_name: str
    seq: int
    pg_desc: str | None = None
    pg_ranks: list[int] | None = None
    trace_name: str | None = None
    in_bytes: int | float | None = None
    out_bytes: int | float | None = None
    bytes: int | float | None = None
    numel: int | None = None
    dtype: str | None = None
    peer: int | None = None
    root: int | None = None
    source: str | None = None
    issue_us: int | float | None = None
    start_us: int | float | None = None
    end_us: int | float | None = None
    matched: str | None = None
    transport_op: str | None = None
    stream: int | None = None


class CommsSidecar(msgspec.Struct, kw_only=True, frozen=True):
    """``pardiag/rank{R}.comms.json``: a rank's process groups and every op it issued.

    Attributes:
        schema, schema_version, kind: the sidecar header (``kind`` ``"comms"``).
        rank: global rank.
        base_time_ns: the trace's ``baseTimeNanoseconds`` (epoch ns of trace time 0).
        process_groups: the rank's process groups.
        records: its ops, in issue order.
    """

    schema: str = SIDECAR_SCHEMA
    schema_version: int = SCHEMA_VERSION
    kind: str = "comms"
    rank: int
    base_time_ns: int | float | None = None
    process_groups: list[ProcessGroupRecord] = msgspec.field(default_factory=list)
    records: list[CommRecord] = msgspec.field(default_factory=list)


class ChunkRecord(msgspec.Struct, kw_only=True, frozen=True):
    """One forward or backward chunk of a pipeline stage (``rank{R}.pipeline.json``'s
    ``records``; unprofiled steps too).

    Attributes:
        stage: the stage.
        microbatch: the microbatch.
        phase: ``F`` (forward), ``B`` (backward), ``I`` (input gradient), ``W`` (weights).
        start_us, end_us: the chunk (µs, the trace's clock).
        optimizer_step: the optimizer step it belongs to.
        profiled: inside the profiler's window.
        samples: the microbatch's size (rows of the stage's forward output), when recorded.
    """

    stage: int
    microbatch: int
    phase: str
    start_us: int | float
    end_us: int | float
    optimizer_step: int
    profiled: bool = True
    samples: int | None = None


class LayerTiming(msgspec.Struct, kw_only=True, frozen=True):
    """One child module of a stage's module, timed (``layers``).

    Attributes:
        stage: the stage.
        index: its place among the stage's children.
        name: its qualified name.
        type: its class name.
        params_bytes: its parameters (bytes).
        fwd_us: ``{optimizer step: its fastest forward in that step}`` (µs).
    """

    stage: int
    index: int
    name: str
    type: str | None = None
    params_bytes: int | None = None
    fwd_us: dict[str, float] = msgspec.field(default_factory=dict)


class SizeScaling(msgspec.Struct, kw_only=True, frozen=True):
    """A stage's module timed at another microbatch size after the run (``size_scaling``).

    Attributes:
        stage: the stage.
        samples: the microbatch size timed (samples).
        fwd_us, bwd_us: its median forward and backward (µs).
        fwd_samples_us, bwd_samples_us: every repetition's times (µs), when recorded.
    """

    stage: int
    samples: int | float
    fwd_us: float
    bwd_us: float
    fwd_samples_us: list[float] | None = None
    bwd_samples_us: list[float] | None = None


class AllreduceTiming(msgspec.Struct, kw_only=True, frozen=True):
    """An all-reduce timed on the group after the run (``allreduce_calibration``).

    Attributes:
        bytes: its size (bytes).
        us: its fastest time (µs; the first repetition warms up).
        samples_us: every repetition's time (µs), when recorded.
    """

    bytes: int | float
    us: float | None = None
    samples_us: list[float] | None = None


class DdpCalibration(msgspec.Struct, kw_only=True, frozen=True):
    """DDP itself timed on a stand-in after the run, on CPU (``ddp_calibration``; every field
    None when it was not timed: the file holds ``{}``).

    Attributes:
        grad_bytes: the stand-in's gradients (bytes).
        rows: its batch (rows).
        plain_us, ddp_us: the median backward without and with DDP (µs).
        overhead_us: the median of what DDP added (µs).
        plain_samples_us, ddp_samples_us, overhead_samples_us: every repetition's (µs).
    """

    grad_bytes: int | float | None = None
    rows: int | None = None
    plain_us: float | None = None
    ddp_us: float | None = None
    overhead_us: float | None = None
    plain_samples_us: list[float] | None = None
    ddp_samples_us: list[float] | None = None
    overhead_samples_us: list[float] | None = None


class OptimizerTiming(msgspec.Struct, kw_only=True, frozen=True):
    """One optimizer step of the rank (``optimizer``).

    Attributes:
        optimizer_step: the step.
        start_us, end_us: its optimizer call (µs, the trace's clock).
    """

    optimizer_step: int
    start_us: float
    end_us: float


class ChunkCost(msgspec.Struct, kw_only=True, frozen=True):
    """The fixed share of a stage's chunks of one phase (``chunk_costs``;
    :func:`pardiag.analyzer.predict.whatif.chunk_cost_split`).

    Attributes:
        stage, phase: the stage and phase.
        chunks: chunks measured.
        chunk_us: their median duration (µs).
        fixed_share: the median share of a chunk that does not scale with the microbatch.
        fit: ``[c µs, a µs/byte, b µs/flop]`` of the operators' time model.
    """

    stage: int
    phase: str
    chunks: int | None = None
    chunk_us: float | None = None
    fixed_share: float
    fit: list[float] | None = None


def microbatch_choices(m: int) -> list[int]:
    """The microbatch counts the what-if model evaluates for a pipeline of ``m``: half, twice
    and four times as many (same global batch). ``pardiag profile`` records the schedule's own
    order for each (:attr:`PipelineSidecar.orders`)."""
    return sorted({m * 2, m * 4, m // 2} - {0, m})


class PipelineSidecar(msgspec.Struct, kw_only=True, frozen=True):
    """``pardiag/rank{R}.pipeline.json``: a pipeline rank's chunks and what the what-if model
    timed after the run.

    Attributes:
        schema, schema_version, kind: the sidecar header (``kind`` ``"pipeline"``).
        rank: global rank.
        schedule: the pipeline rank 0 detected (``schedule``, ``stages``, ``microbatches``,
            ``local_stages``, ``pp_group_size``, ``stages_per_rank``), or None.
        records: every forward and backward chunk.
        layers: the stages' child modules, timed.
        size_scaling: the stage modules timed at other microbatch sizes.
        allreduce_calibration: all-reduces timed on the group.
        ddp_calibration: DDP timed on a stand-in, or None.
        optimizer: the rank's optimizer steps.
        chunk_costs: the chunks' fixed shares.
        orders: the schedule's own order of actions at other microbatch counts
            (:func:`microbatch_choices`), as torch's schedule class builds it: ``{m: {pipeline
            rank: [[stage, phase, microbatch], ...]}}`` (keys as strings; phases ``F``, ``B``,
            ``I``, ``W``; a combined action as its parts); empty for GPipe and 1F1B, whose
            orders pardiag generates, and where the class could not build one.
    """

    schema: str = SIDECAR_SCHEMA
    schema_version: int = SCHEMA_VERSION
    kind: str = "pipeline"
    rank: int
    schedule: dict[str, Any] | None = None
    records: list[ChunkRecord] = msgspec.field(default_factory=list)
    layers: list[LayerTiming] = msgspec.field(default_factory=list)
    size_scaling: list[SizeScaling] = msgspec.field(default_factory=list)
    allreduce_calibration: list[AllreduceTiming] = msgspec.field(default_factory=list)
    ddp_calibration: DdpCalibration | None = None
    optimizer: list[OptimizerTiming] = msgspec.field(default_factory=list)
    chunk_costs: list[ChunkCost] = msgspec.field(default_factory=list)
    orders: dict[str, dict[str, list[list[Any]]]] = msgspec.field(default_factory=dict)


#: The rank sidecars decoded by :func:`decode_rank_sidecar`, by ``kind``: their type and their
#: lists, each ``(key, entry type, required)`` (a required list that is not a list makes the
#: file unusable).
RANK_SIDECARS: dict[str, tuple[type, tuple[tuple[str, type, bool], ...]]] = {
    "comms": (CommsSidecar, (("records", CommRecord, True),
                             ("process_groups", ProcessGroupRecord, True))),
    "pipeline": (PipelineSidecar, (("records", ChunkRecord, True),
                                   ("layers", LayerTiming, False),
                                   ("size_scaling", SizeScaling, False),
                                   ("allreduce_calibration", AllreduceTiming, False),
                                   ("optimizer", OptimizerTiming, False),
                                   ("chunk_costs", ChunkCost, False))),
}
#: Number fields of the entries that must be finite where given.
_FINITE = ("start_us", "end_us", "issue_us", "bytes", "us", "fixed_share", "samples")


def _finite(entry: msgspec.Struct) -> bool:
    import math

    return all(not isinstance(v, float) or math.isfinite(v)
               for v in (getattr(entry, k, None) for k in _FINITE))


def _repaired(rec: CommRecord) -> CommRecord:
    """A comms record with ``bytes`` the full buffer (:func:`full_buffer_bytes`): runs recorded
    before the all-gather repair wrote the input's size for some all-gathers."""
    ib, ob, ranks = rec.in_bytes, rec.out_bytes, rec.pg_ranks
    if rec.op != "all_gather" or ib is None or ob is None or ranks is None:
        return rec
    full = full_buffer_bytes("all_gather", int(ib), int(ob), len(ranks))
    return rec if full == rec.bytes else msgspec.structs.replace(rec, bytes=full)


def decode_rank_sidecar(doc: dict, path: str | Path
                        ) -> tuple[CommsSidecar | PipelineSidecar | None, list[str]]:
    """A comms or pipeline sidecar (its parsed JSON object, ``doc["kind"]`` one of
    :data:`RANK_SIDECARS`) as its type, and the warnings about it (each naming ``path``).

    Each list is decoded entry by entry: a malformed entry (a required key missing, a value of
    the wrong type, a time or size that is not finite) is left out, with one warning per list
    (how many, and the first reason). Comms records of an all-gather get the full buffer as
    ``bytes`` (:func:`_repaired`).

    Returns:
        ``(sidecar, warnings)``; the sidecar is None when the file cannot be used: a required
        list (``records``, comms' ``process_groups``) is not a list, or a field of the file
        itself has the wrong type.
    """
    cls, lists = RANK_SIDECARS[doc["kind"]]
    warnings: list[str] = []
    body = dict(doc)
    for key, entry_type, required in lists:
        items = body.get(key)
        if items is None and not required:
            continue
        if not isinstance(items, list):
            if required:
                warnings.append(f"{path}: '{key}' is not a list; the file is ignored")
                return None, warnings
            warnings.append(f"{path}: '{key}' is not a list; left out")
            body.pop(key)
            continue
        good, why = [], None
        for e in items:
            try:
                x: Any = msgspec.convert(e, entry_type)
            except msgspec.ValidationError as exc:
                why = why or str(exc)
                continue
            if not _finite(x):
                why = why or "a time or size that is not a finite number"
                continue
            good.append(x)
        if len(good) < len(items):
            warnings.append(f"{path}: left out {len(items) - len(good)} malformed '{key}' "
                            f"entries ({why})")
        body[key] = good
    if cls is CommsSidecar:
        body["records"] = [_repaired(r) for r in body["records"]]
    try:
        return msgspec.convert(body, cls), warnings
    except msgspec.ValidationError as exc:
        warnings.append(f"{path}: pardiag sidecar with a wrong value, ignored ({exc})")
        return None, warnings


#: The typed sidecars by their ``kind``.
TYPED_SIDECARS: dict[str, type] = {"run": RunFile, "rank": RankMeta}


def encode_sidecar(obj: msgspec.Struct) -> bytes:
    """A typed sidecar as the JSON bytes written to its file (indented, keys in field order);
    a value JSON has no type for (a ``torch.__version__``, a path) is written as its ``str``."""
    return msgspec.json.format(msgspec.json.encode(obj, enc_hook=str), indent=1)


def decode_sidecar(doc: dict | bytes, kind: str):
    """A typed sidecar (``RunFile`` for ``"run"``, ``RankMeta`` for ``"rank"``) from its parsed
    JSON object or its bytes.

    Raises:
        ValueError: a value has the wrong type, or a required field is missing (the message
            names the field, e.g. ``Expected `int`, got `str` - at `$.world_size```).
    """
    cls = TYPED_SIDECARS[kind]
    try:
        if isinstance(doc, (bytes, bytearray)):
            return msgspec.json.decode(doc, type=cls)
        return msgspec.convert(doc, cls)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ValueError(str(exc)) from None
