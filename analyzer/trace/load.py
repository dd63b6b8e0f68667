"""Load a run: a run folder written by ``pardiag profile``, any folder of Kineto traces from
elsewhere, or a list of files.

The loader orchestrates and computes nothing itself: it finds the files and pardiag's sidecars
(:mod:`pardiag.layout`), parses each file (:mod:`pardiag.analyzer.trace.files`, which splits
merged multi-rank files), assigns ranks (:func:`pardiag.analyzer.trace.ranks.assign_ranks`, a pure
function), joins a rank's profiling windows, and returns a
:class:`~pardiag.analyzer.trace.traceset.TraceSet`.

Speed: files are parsed in worker processes when the input is large
(:mod:`pardiag.analyzer.trace.workers`); with a
``reducer`` (the per-rank reduction, passed in: :data:`pardiag.analyzer.per_rank.store.REDUCER`)
each worker reduces its rank to a summary and hands back only that, and stored summaries are
used instead of parsing where they are current. The loader never imports an analysis.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import msgspec
import numpy as np
import orjson
import pandas as pd

from pardiag import layout
from pardiag.errors import TraceError

from . import vocab
from .classify import STEP_RE
from .comm_records import ranks_in_records
from .files import ParsedFile, RankReducer, from_summary, parse_file, read_events
from .folders import find_trace_files, no_files_hint, run_of_sidecar, window_folders
from .parse import ARRAY_FORM
from .ranks import FileFacts, RankFiles, assign_ranks, states_rank
from .traceset import RankTrace, Sidecars, TraceSet, failures_in_order, time_range
from .workers import default_workers, parse_files


def _read_sidecars(sidecars: list[Path], warnings: list[str], check_one_run: bool = False
                   ) -> tuple[layout.RunFile | None, dict[int, layout.RankMeta],
                              dict[str, dict[int, Any]]]:
    """The run file and rank metadata decoded into their types (:class:`pardiag.layout.RunFile`,
    :class:`pardiag.layout.RankMeta`; a rank without its final metadata gets the one written
    when its profiling window closed, with a warning), the other sidecars by kind and rank:
    comms and pipeline decoded too (:func:`pardiag.layout.decode_rank_sidecar`: malformed
    entries left out with a warning), hang dumps as parsed; a file that cannot be read or
    decoded is ignored with a warning.

    Raises:
        TraceError: with ``check_one_run``, the run files are of different runs (two parts of
            one node, or parts whose script, arguments, world size or node count differ)."""
    run_parts: list[layout.RunFile] = []
    run_files: list[Path] = []
    rank_meta: dict[int, layout.RankMeta] = {}
    window_meta: dict[int, layout.RankMeta] = {}
    others: dict[str, dict[int, Any]] = {}
    for f in sidecars:
        try:
            doc = orjson.loads(f.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            warnings.append(f"{f}: unreadable pardiag sidecar, ignored ({exc})")
            continue
        if not isinstance(doc, dict) or doc.get("schema") != layout.SIDECAR_SCHEMA:
            warnings.append(f"{f}: not a pardiag sidecar, ignored")
            continue
        if doc.get("kind") in layout.TYPED_SIDECARS:
            try:
                typed = layout.decode_sidecar(doc, doc["kind"])
            except ValueError as exc:
                warnings.append(f"{f}: pardiag sidecar with a wrong value, ignored ({exc})")
                continue
            if doc["kind"] == "run":
                run_parts.append(typed)
                run_files.append(f)
            elif f.name == layout.WINDOW_META_TEMPLATE.format(rank=typed.rank):
                window_meta[typed.rank] = typed
            else:
                rank_meta[typed.rank] = typed
        elif isinstance(doc.get("kind"), str) and isinstance(doc.get("rank"), int):
            # comms and pipeline typed, other kinds (hang dumps) as they are
            checked: dict | layout.CommsSidecar | layout.PipelineSidecar | None = doc
            if doc["kind"] in layout.RANK_SIDECARS:
                checked, notes = layout.decode_rank_sidecar(doc, f)
                warnings.extend(notes)
            if checked is not None:
                others.setdefault(doc["kind"], {})[doc["rank"]] = checked
        else:
            warnings.append(f"{f}: pardiag sidecar without a known kind and rank, ignored")
    for r, m in sorted(window_meta.items()):
        if r not in rank_meta:   # the rank never finished: what it recorded at the window's end
            rank_meta[r] = m
            warnings.append(f"rank {r} did not finish: its settings and memory are those "
                            f"recorded when its profiling window closed (after "
                            f"{m.optimizer_steps} optimizer steps; "
                            f"{layout.WINDOW_META_TEMPLATE.format(rank=r)})")
    for kind in ("comms", "pipeline"):
        have = set(others.get(kind, {}))
        if have and rank_meta and set(rank_meta) - have:
            warnings.append(f"no usable {kind} records for rank(s) {sorted(set(rank_meta) - have)}"
                            f" (other ranks have them)")
    if check_one_run:
        why = _different_run_parts(run_parts, run_files)
        if why:
            raise TraceError(why)
    # a multi-node run: node 0's run.json and the other nodes' run.node{N}.json, from one
    # shared run folder or from each node's own
    return layout.join_run_files(run_parts), rank_meta, others


_TO_COMPARE = ("to analyse them as one anyway, pass --mixed-runs; to set two runs side by side, "
               "pardiag compare A B")


def _different_run_parts(parts: list[layout.RunFile], files: list[Path]) -> str | None:
    """Why the run files ``parts`` (read from ``files``, in order) are not one run's, else None:
    two parts of one node, or parts whose job (script, its arguments, world size, nodes)
    differs — the parts of a multi-node run differ only in their node."""
    seen: list[tuple[Path, layout.RunFile]] = []
    for p, f in zip(parts, files):
        for g, q in seen:
            other = q.job_differences(p)
            if q.node_rank == p.node_rank or other:
                when = [time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(x.started_unix))
                        if x.started_unix else "?" for x in (q, p)]
                what = (f"{' '.join([q.script or '?', *q.script_args])} vs "
                        f"{' '.join([p.script or '?', *p.script_args])}"
                        if other and other[0][0] in ("scripts", "script arguments") else
                        "; ".join(f"{w} {x} vs {y}" for w, x, y in other) if other else
                        f"one job started at {when[0]} and at {when[1]} UTC")
                return (f"{g.parent.parent if g.parent.name == layout.SIDECAR_DIR else g}"
                        f" and {f.parent.parent if f.parent.name == layout.SIDECAR_DIR else f} "
                        f"are different runs ({what}); {_TO_COMPARE}")
        seen.append((f, p))
    return None


#: Two groups of ranks whose profiling windows are this far apart (µs) on one host's clock,
#: overlapping nowhere, and more than :data:`APART_WINDOWS` times the longest window, are two
#: runs: the ranks of one job are profiled over the same steps, at the same time.
APART_SAME_HOST_US = 1e6
#: ... on the clocks of different (or unnamed) hosts, which NTP keeps within far less.
APART_HOSTS_US = 3600e6
APART_WINDOWS = 10.0


def apart_in_time(units: list[ParsedFile], ranks: list[tuple[int, list[int]]]) -> str | None:
    """Why the ranks' files cannot be one job's by when they were recorded, else None: sorted by
    start, the windows split into two groups of different ranks (a rank on both sides is one
    process profiled twice) with a gap no window bridges, longer than
    :data:`APART_WINDOWS` times the longest window and than :data:`APART_SAME_HOST_US` (every
    file names the same ``host_name``: one clock) or :data:`APART_HOSTS_US` (other hosts'
    clocks). Times are ``baseTimeNanoseconds`` + ``ts`` where every file has the former, else
    ``ts``.

    Args:
        units: the parsed files.
        ranks: ``(rank, indices of its files in units)``.
    """
    spans = []
    bases = [vocab.BASE_TIME_NS.get(u.metadata or {}) for u in units]
    use_base = all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bases)
    for rank, keys in ranks:
        for k in keys:
            lo, hi = _time_range(units[k])
            if math.isnan(lo) or math.isnan(hi):
                return None
            shift = bases[k] / 1e3 if use_base else 0.0
            spans.append((lo + shift, hi + shift, rank, units[k].path))
    if len(spans) < 2:
        return None
    hosts = {vocab.HOST_NAME.get(u.metadata or {}) for u in units}
    one_host = len(hosts) == 1 and None not in hosts
    longest = max(hi - lo for lo, hi, _, _ in spans)
    limit = max(APART_SAME_HOST_US if one_host else APART_HOSTS_US, APART_WINDOWS * longest)
    spans.sort()
    reach, last = spans[0][1], spans[0]
    for i, span in enumerate(spans[1:], 1):
        # a split with a rank on both sides is that rank's later window (a repeating schedule)
        if span[0] - reach > limit and not ({s[2] for s in spans[:i]}
                                            & {s[2] for s in spans[i:]}):
            where = f"on {hosts.pop()}'s clock" if one_host else "on their hosts' clocks"
            return (f"{last[3]} (rank {last[2]}) and {span[3]} (rank {span[2]}) were profiled "
                    f"{(span[0] - reach) / 1e6:.1f} s apart {where}, their windows overlapping "
                    f"nowhere (the longest lasts {longest / 1e3:.1f} ms): they are different "
                    f"runs, not ranks of one job; {_TO_COMPARE}")
        if span[1] > reach:
            reach, last = span[1], span
    return None


def different_runs(rank_files: list[list[Path]], paths: list[Path],
                   units: list[list[ParsedFile]] | None = None) -> str | None:
    """Why the trace files of the ranks (one list per rank, its profiling windows) are not one
    run's, else None: a rank whose files come from different given folders (most runs write a
    rank's windows into one folder; two folders of ``rank0`` files are two runs, even when their
    windows do not overlap in time) — unless one process recorded them all (``units``: the
    parsed files, in ``rank_files``' order; a process that shares a pid in each: torchtitan
    writes each window to a folder of its own, ``iteration_<step>/rank<r>_trace.json``)."""
    given = [p.resolve() for p in paths if p.is_dir()]
    for i, files in enumerate(rank_files):
        if len(files) < 2:  # one file is one home
            continue
        homes = {next((d for d in given if f.resolve().is_relative_to(d)), f.resolve().parent)
                 for f in files}
        pids = [_processes(u) for u in units[i]] if units is not None else []
        if pids and all(pids) and set.intersection(*pids):
            continue   # one process's windows
        if len(homes) > 1:
            a, b = sorted(homes)[:2]
            return (f"{a} and {b} both hold a trace of one rank ({files[0].name}, "
                    f"{files[1].name}): they are different runs, not profiling windows of one; "
                    f"{_TO_COMPARE}")
    return None


def _processes(unit: ParsedFile) -> set[str]:
    """The host processes that recorded a trace file: the pids of its CPU threads, as Kineto
    names them (``thread <tid> (<name>)``; a GPU stream's "process" is its device); empty when
    its thread names say none."""
    return {str(pid) for (pid, _), name in (unit.thread_names or {}).items()
            if str(name).startswith("thread ")}


def other_processes(ranks: list[tuple[int, list[ParsedFile]]]) -> str | None:
    """Why the files taken for one rank's profiling windows are not one run's, else None: the
    windows of one run are recorded by one process (a schedule that repeats, or
    ``pardiag profile``'s windows), so two files whose host processes (:func:`_processes`)
    share no pid, or that name other hosts, are two runs (a log folder that gathered two jobs'
    traces of ``worker0``)."""
    for rank, files in ranks:
        for i, a in enumerate(files):
            for b in files[i + 1:]:
                pa, pb = _processes(a), _processes(b)
                ha, hb = (vocab.HOST_NAME.get(u.metadata or {}) for u in (a, b))
                if pa and pb and not pa & pb:
                    by = f"processes {min(pa)} and {min(pb)}"
                elif ha and hb and ha != hb:
                    by = f"hosts {ha} and {hb}"
                else:
                    continue
                return (f"{a.path} and {b.path} both hold rank {rank} but were recorded by "
                        f"other {by}: they are different runs, not profiling windows of one; "
                        f"{_TO_COMPARE}")
    return None


def _run_warnings(run_info: layout.RunFile | None, rank_meta: dict[int, layout.RankMeta],
                  ranks: set[int]) -> list[str]:
    """What ``run.json`` and the rank metadata say went wrong in a ``pardiag profile`` run."""
    out: list[str] = []
    if run_info:
        # a monitored run's deep capture carries the job's run file: how the job ended came
        # after the capture began (written at its last step, or as far as it got when the
        # job was stopped while it recorded)
        run, during, later = (
            ("the monitored job", "in the monitored job", ", after this capture began")
            if run_info.monitor_every else ("the profiled run", "during the profiled run", ""))
        failures = failures_in_order(run_info, rank_meta)
        if run_info.stopped_by_user and run_info.monitor_every:
            # Ctrl-C or SIGTERM: the ranks the launcher stopped did not fail
            out.append(f"{run} was interrupted ({run_info.stopped_by_user}, exit code "
                       f"{run_info.exit_code}){later}")
            failures = [(r, m) for r, m in failures
                        if not m.startswith(layout.STOPPED_BY_LAUNCHER)]
        elif run_info.exit_code:
            out.append(f"{run} exited with code {run_info.exit_code}{later}")
        for i, (r, msg) in enumerate(failures):
            first = " first" if i == 0 and len(failures) > 1 else ""
            out.append(f"rank {r} failed{first} {during}{later}: {msg}")
        for missing in run_info.missing_ranks:
            out.append(f"rank {missing} did not finish {run}")
        for line in run_info.hang:
            out.append(f"{run} hung and was stopped{later}: {line}")
        if run_info.missing_nodes:
            files = ", ".join(layout.node_run_path(Path(layout.SIDECAR_DIR), n).as_posix()
                              for n in run_info.missing_nodes)
            out.append(f"the run had {run_info.nnodes} nodes; no part of node(s) "
                       f"{run_info.missing_nodes} was found ({files}): with node-local run "
                       f"folders, give every node's folder (pardiag report DIR0 DIR1 ...)")
        ws = run_info.world_size
        if isinstance(ws, int) and ws > 0:
            absent = sorted(set(range(ws)) - ranks)
            if absent:
                out.append(f"run.json says world size {ws}; no trace for rank(s) {absent}")
    return out


def _records_ranks(p: ParsedFile) -> tuple[int, ...]:
    """The global ranks a unit's communication records name as the caller's own
    (:func:`pardiag.analyzer.trace.comm_records.ranks_in_records`)."""
    if p.events is not None:
        return tuple(ranks_in_records(p.events))
    return tuple(int(r) for r in p.summary.records_ranks) if p.summary is not None else ()


def _time_range(p: ParsedFile) -> tuple[float, float]:
    """(first start, last end) of a parsed file's events (µs); NaN when it has none."""
    if p.events is not None:
        return time_range(p.events)
    return p.summary.extent if p.summary is not None else (math.nan, math.nan)


def _join_windows(parts: list[ParsedFile]) -> ParsedFile:
    """One rank from the files of its profiling windows: their events in one table (read again
    where only a summary was kept; correlation ids of later windows shifted past the earlier
    ones', since every window numbers them from the start), thread names together, the first
    file's metadata; no summary (the analyses work from the events)."""
    frames: list[pd.DataFrame] = []
    names: dict = {}
    for p in parts:
        ev = p.events
        if ev is None:
            again = parse_file(p.path)
            if again.error is not None:
                raise TraceError(again.error)
            ev = again.events if not again.pieces else next(
                q.events for q in again.pieces if q.rank_hint == p.rank_hint)
            assert ev is not None  # a readable trace, parsed with its events
        if frames:  # correlation ids restart in every window: keep them apart
            base = max(int(f["correlation"].max()) for f in frames) + 1
            ev = ev.assign(correlation=np.where(ev["correlation"] >= 0, ev["correlation"] + base,
                                                ev["correlation"]))
        frames.append(ev)
        names.update(p.thread_names or {})
    renumbered = _renumber_steps(frames, [p.path for p in parts])
    events = pd.concat(frames, ignore_index=True).sort_values("ts", kind="stable").reset_index(
        drop=True)
    first = parts[0]
    notes = tuple(n for p in parts for n in p.notes) + tuple(renumbered)
    return ParsedFile(first.path, metadata=first.metadata, events=events, thread_names=names,
                   notes=notes, has_steps=any(p.has_steps for p in parts))


def _renumber_steps(frames: list[pd.DataFrame], paths: list[Path]) -> list[str]:
    """Give the profiler steps of later windows numbers after the earlier windows' (in place in
    ``frames``, one event table per window): every profiler session numbers its steps from its
    own start, so two sessions of one script both hold ``ProfilerStep#3``, and steps are known
    by their number across the analyses (one step would span both windows and the gap between
    them). Windows are taken in time order; one whose numbers do not follow the earlier ones'
    is shifted to follow them. Returns a note per window renumbered."""
    def first_ts(ev: pd.DataFrame) -> float:
        return float(ev["ts"].min()) if len(ev) else math.inf

    notes, top = [], None
    for i in sorted(range(len(frames)), key=lambda i: first_ts(frames[i])):
        ev = frames[i]
        steps = ev["name"].str.extract(STEP_RE, expand=False)
        has = steps.notna().to_numpy()
        if not has.any():
            continue
        nums = steps[has].astype(np.int64).to_numpy()
        lo, hi = int(nums.min()), int(nums.max())
        if top is not None and lo <= top:
            shift = top + 1 - lo
            name = ev["name"].to_numpy(dtype=object).copy()
            name[has] = [f"ProfilerStep#{n}" for n in (nums + shift).tolist()]
            frames[i] = ev.assign(name=name)
            notes.append(f"{paths[i]}: this profiling window numbers its steps {lo}–{hi} again "
                         f"(each profiler session counts from its own start): read as steps "
                         f"{lo + shift}–{hi + shift}, after the earlier window's")
            lo, hi = lo + shift, hi + shift
        top = hi if top is None else max(top, hi)
    return notes


def _world_size_warnings(rank_docs: list[tuple[int, dict | None]],
                         run_info: layout.RunFile | None = None
                         ) -> list[str]:
    """One warning when the traces' ``distributedInfo.world_size`` values disagree, or a rank
    number is not below the world size the traces state; and one when fewer ranks than that
    world size are present (``2 of 128 ranks present``; not repeated for pardiag runs, whose
    ``run.json`` check names the absent ranks)."""
    sizes: dict[int, list[int]] = {}
    for r, doc in rank_docs:
        ws = vocab.DIST_WORLD_SIZE.get(vocab.DISTRIBUTED_INFO.get(doc))
        if isinstance(ws, int) and not isinstance(ws, bool):
            sizes.setdefault(ws, []).append(r)
    if len(sizes) > 1:
        desc = "; ".join(f"{ws} for rank(s) {rs[:8]}{'...' if len(rs) > 8 else ''}"
                         for ws, rs in sorted(sizes.items()))
        return [f"the traces disagree on the world size ({desc}): are they from one run?"]
    if sizes:
        ws = next(iter(sizes))
        over = sorted(r for r, _ in rank_docs if r >= ws)
        if over:
            return [f"rank(s) {over[:8]} are not below the world size {ws} the traces state"]
        have = {r for r, _ in rank_docs}
        if len(have) < ws and not (run_info and run_info.world_size):
            absent = []  # the first few (a world size can be any number the file says)
            for r in range(ws):
                if r not in have:
                    absent.append(r)
                    if len(absent) > 8:
                        break
            return [f"{len(have)} of {ws} ranks present (the traces state world size {ws}; no "
                    f"trace for rank(s) {absent[:8]}{'...' if len(absent) > 8 else ''}): "
                    f"collectives that include absent ranks are partial, and no straggler or "
                    f"clock offset is drawn from them"]
    return []


def load_traces(paths: Path | str | Iterable[Path | str], *, reducer: RankReducer | None = None,
                comm_patterns: Iterable[re.Pattern] = (), cache: bool = False,
                workers: int | None = None, progress=None, mixed_runs: bool = False) -> TraceSet:
    """Load a run folder, a folder of Kineto traces, or a list of trace files.

    Files in a folder that are not traces (other JSON, pardiag sidecars) are skipped; unreadable
    trace files are skipped with a warning as long as one readable trace remains.

    Args:
        paths: folders and/or files.
        reducer: the per-rank reduction (:data:`pardiag.analyzer.per_rank.store.REDUCER`): each
            rank's summary is computed (with ``comm_patterns``) in the worker that parses it,
            and only the summary of ranks parsed in other processes is kept (their ``events``
            are read again on first access). The analyses then work from the summaries.
            None: ranks keep their events and carry no summary.
        comm_patterns: compiled ``--comm-kernel`` patterns for the summaries.
        cache: with a ``reducer``: use stored summaries that are current (same file size,
            modification time and patterns) instead of parsing, and store new ones (see
            :mod:`pardiag.analyzer.per_rank.store` for where).
        workers: processes that parse files in parallel (default :func:`default_workers`).
        progress: ``progress(done, total)`` after each file (for a progress bar).
        mixed_runs: analyse files of different runs as one (by default they are refused:
            :func:`different_runs`).

    Returns:
        TraceSet with one RankTrace per rank (a rank's profiling windows joined; a merged
        multi-rank file split into its ranks).

    Raises:
        TraceError: a path does not exist, no trace file is found, or none can be read. An
            explicitly named file that cannot be read is an error too. The paths hold
            different runs (:func:`different_runs`) and ``mixed_runs`` is not set.
    """
    roots = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    if not roots:
        raise TraceError("no input given")
    for p in roots:   # a run's own metadata given for its run
        run_dir = run_of_sidecar(p)
        if run_dir is not None:
            what = ("pardiag's metadata folder of the run" if p.is_dir()
                    else "one of pardiag's own files of the run")
            raise TraceError(f"{p}: {what} {run_dir}, not a trace: report the run folder "
                             f"(pardiag report {run_dir})")
    files, sidecars, source, info = find_trace_files(roots)
    explicit = {p for p in roots if p.is_file()}
    warnings: list[str] = list(info)
    run_info, rank_meta, others = _read_sidecars(sidecars, warnings,
                                                 check_one_run=not mixed_runs)
    options = dict(reducer=reducer, comm_patterns=comm_patterns, cache=cache, workers=workers,
                   progress=progress, mixed_runs=mixed_runs)
    if not files:
        missing = TraceError(f"{source}: no trace files (*.json, *.json.gz) found"
                             f"{no_files_hint(roots, run_info, rank_meta)}")
        return _from_window_folders(window_folders(roots, run_info, rank_meta), source,
                                    missing, [], **options)
    parsed = _parse_all(files, reducer=reducer, patterns=list(comm_patterns), cache=cache,
                        workers=workers, progress=progress)
    docs = _readable(files, parsed, explicit, warnings)
    if not docs:
        # a trace that could not be read says more than a file that is no trace (a config)
        errors = [parsed[f].error for f in files if parsed[f].error is not None]
        first = errors[0] if errors else (warnings[-1].removesuffix(" - skipped")
                                          if warnings else "")
        missing = TraceError(f"{source}: none of {len(files)} file(s) is a readable Kineto "
                             f"trace (e.g. {first})")
        # files that are no trace (a config.json) beside the windows' subfolders: read those
        sub = [] if errors else window_folders(roots, run_info, rank_meta)
        return _from_window_folders(sub, source, missing, warnings, **options)
    docs = _on_one_base(docs, warnings, reducer, list(comm_patterns))
    units, assignment = _assign(docs, warnings)
    if not mixed_runs:
        why = (different_runs([[units[k].path for k in a.keys] for a in assignment], roots,
                              [[units[k] for k in a.keys] for a in assignment])
               or other_processes([(a.rank, [units[k] for k in a.keys]) for a in assignment]))
        if why is None and run_info is None:   # loose files: when were they recorded?
            why = apart_in_time(units, [(a.rank, list(a.keys)) for a in assignment])
        if why:
            raise TraceError(why)
    present = {a.rank for a in assignment}
    warnings.extend(_run_warnings(run_info, rank_meta, present))
    warnings.extend(_world_size_warnings([(a.rank, units[a.keys[0]].metadata) for a in assignment],
                                         run_info))
    ranks: dict[int, RankTrace] = {}
    for a in assignment:
        ranks[a.rank] = _rank_trace(a, units, warnings)
    _, bad_capture = layout.capture_record(run_info)
    if bad_capture and run_info is not None:   # said, and not echoed into the report's run
        warnings.append(f"{layout.run_file_path(roots[0]) if len(roots) == 1 else 'run.json'}: "
                        f"{bad_capture}; ignored")
        run_info = msgspec.structs.replace(run_info, capture=None)
    capture = (layout.capture_context(roots[0], run_info)
               if len(roots) == 1 and roots[0].is_dir() else None)
    # (a merged file's parts each carry the file's warnings: said once)
    return TraceSet(ranks=ranks, source=source, warnings=tuple(dict.fromkeys(warnings)),
                    run_info=run_info, rank_meta=rank_meta, sidecars=cast(Sidecars, others),
                    capture=capture)


def _from_window_folders(sub: list[Path], source: str, missing: TraceError,
                         skipped: list[str], **kw) -> TraceSet:
    """The run whose profiling windows lie a folder each in ``sub`` (torchtitan's layout:
    :func:`~pardiag.analyzer.trace.folders.window_folders`), read by :func:`load_traces`
    (``kw``: its options) with a warning naming ``source``, their parent, after ``skipped``
    (the parent's files that are no trace, said).

    Raises:
        TraceError: ``missing`` (the parent holds no trace) when ``sub`` is empty, or with why
            the subfolders are not one run.
    """
    if not sub:
        raise missing
    try:
        got = load_traces(sub, **kw)
    except TraceError as exc:   # the hint, and why the subfolders are no one run
        raise TraceError(f"{missing}; read together they are refused: {exc}") from None
    said = (f"{source}: no trace files of its own; its {len(sub)} subfolders "
            f"({', '.join(d.name for d in sub[:3])}{', ...' if len(sub) > 3 else ''}) hold "
            f"each rank's profiling windows, recorded by one process per rank: read as one run"
            if len(sub) > 1 else f"{source}: no trace files of its own; read its one subfolder "
            f"that holds some, {sub[0].name}")
    return dataclasses.replace(got, warnings=type(got.warnings)([said, *skipped, *got.warnings]))


def _parse_all(files: list[Path], *, reducer: RankReducer | None, patterns: list,
               cache: bool, workers: int | None, progress) -> dict[Path, ParsedFile]:
    """Every file parsed (:func:`parse_files`), or read from its stored summary (with a
    ``reducer`` and ``cache``); ``progress(done, total)`` counts both.

    Returns:
        ``{file: ParsedFile}``.
    """
    parsed: dict[Path, ParsedFile] = {}
    if reducer is not None and cache:
        for f in files:
            try:
                s = reducer.find(f, patterns)
            except OSError:
                s = None
            if s is not None:
                parsed[f] = from_summary(f, s)
    todo = [f for f in files if f not in parsed]
    n_workers = default_workers(todo) if workers is None else workers
    done0 = len(parsed)

    def step(done: int, total: int) -> None:
        if progress:
            progress(done0 + done, len(files))

    if progress and done0:
        progress(done0, len(files))
    kw = dict(reducer=reducer, cache=cache,
              patterns=tuple(p.pattern if isinstance(p, re.Pattern) else str(p) for p in patterns),
              keep_events=reducer is None or n_workers <= 1)
    for p in parse_files(todo, n_workers, step, **kw):
        parsed[p.path] = p
    return parsed


def _readable(files: list[Path], parsed: dict[Path, ParsedFile], explicit: set[Path],
              warnings: list[str]) -> list[ParsedFile]:
    """The parsed files that are traces, in file order; the others are skipped with a line in
    ``warnings`` (a ``pardiag report --json`` output without one), and files read with repairs
    are named there.

    Raises:
        TraceError: a file in ``explicit`` (named on its own) cannot be read or is no trace.
    """
    docs: list[ParsedFile] = []
    for f in files:
        p = parsed[f]
        if p.error is not None:
            if f in explicit:
                raise TraceError(p.error)
            warnings.append(f"{p.error} - skipped")
            continue
        if p.not_trace:
            what = "a pardiag report's JSON" if p.own_report else "no traceEvents list"
            if f in explicit:
                raise TraceError(f"{f}: not a Kineto trace ({what})")
            if not p.own_report:   # `report --json` written into the run folder: no warning
                warnings.append(f"{f}: not a Kineto trace ({what}) - skipped")
            continue
        form = [x for x in p.repairs if ARRAY_FORM in x]
        fixed = [x for x in p.repairs if ARRAY_FORM not in x]
        if form:
            warnings.append(f"{f}: {'; '.join(form)}")
        if fixed:
            warnings.append(f"{f}: not strict JSON; read with repairs ({'; '.join(fixed)})")
        docs.append(p)
    return docs


def _on_one_base(docs: list[ParsedFile], warnings: list[str], reducer: RankReducer | None,
                 patterns: list) -> list[ParsedFile]:
    """The files with their times from one time zero: where the files of one rank each that
    have a ``baseTimeNanoseconds`` (their ``ts`` count from it) differ in it, those of a later
    base are read again with their times moved onto the earliest (:func:`parse_file`'s
    ``shift_ns``; their events kept, their summaries not stored), and a line in ``warnings``
    says so. Kineto rounds each process's start down to a multiple of 7,889,238 s (a quarter
    of a year: every real trace's base is one) and counts from there, so the processes of one
    job started on either side of such a boundary write one instant 7,889,238 s apart. A
    merged file's parts and a file without a base (a bare array) keep their times."""
    bases = [vocab.BASE_TIME_NS.get(p.metadata or {}) if not p.pieces else None for p in docs]
    based = {b for b in bases if isinstance(b, int) and not isinstance(b, bool)}
    if len(based) < 2:
        return docs
    ref = min(based)
    out, moved = [], []
    for p, b in zip(docs, bases):
        if b == ref or b not in based:
            out.append(p)
            continue
        again = parse_file(p.path, reducer, tuple(q.pattern if isinstance(q, re.Pattern)
                                                  else str(q) for q in patterns), cache=False,
                           keep_events=True, shift_ns=b - ref)
        if again.error is not None:   # it was read a moment ago: the file changed meanwhile
            raise TraceError(again.error)
        out.append(again)
        moved.append(f"{p.path.name} (+{(b - ref) / 1e9:,.0f} s)" if b - ref >= 10**9
                     else f"{p.path.name} (+{(b - ref) / 1e6:,.3f} ms)")
    named = ", ".join(moved[:4]) + (f" and {len(moved) - 4} more" if len(moved) > 4 else "")
    warnings.append(f"the files count their times from different zeros (baseTimeNanoseconds): "
                    f"{named} put onto the earliest's, {ref}")
    return out


def _assign(docs: list[ParsedFile], warnings: list[str]
            ) -> tuple[list[ParsedFile], list[RankFiles]]:
    """Ranks: a pure function of what each file (or merged file's part) says
    (:func:`pardiag.analyzer.trace.ranks.assign_ranks`); its warnings, and a line per merged
    file split, go to ``warnings``.

    Returns:
        (the units: each file, or each part of a merged file, in order; the ranks, whose
        ``keys`` index the units).
    """
    units: list[ParsedFile] = [q for p in docs for q in (p.pieces or [p])]
    ranges = [_time_range(p) for p in units]
    if any(not math.isnan(lo) for lo, _ in ranges):
        # a file without a timed event that names no rank (an NCCL profiler plugin's dump of
        # async events beside the traces) holds no rank: said, and left out
        kept = [i for i, p in enumerate(units) if not math.isnan(ranges[i][0])
                or p.rank_hint is not None or states_rank(p.metadata, p.path)]
        left = set(range(len(units))) - set(kept)
        warnings.extend(f"{units[i].path}: no timed events (complete 'X' ranges) and no rank in "
                        f"distributedInfo or its name: no rank's trace - skipped"
                        for i in sorted(left))
        units, ranges = [units[i] for i in kept], [ranges[i] for i in kept]
    facts = []
    for i, p in enumerate(units):
        lo, hi = ranges[i]
        dist = vocab.DIST_RANK.get(vocab.DISTRIBUTED_INFO.get(p.metadata))
        facts.append(FileFacts(key=i, path=p.path, dist_rank=dist,
                               start_us=lo, end_us=hi, rank_hint=p.rank_hint,
                               processes=frozenset(_processes(p)),
                               records_ranks=_records_ranks(p) if p.rank_hint is None
                               and not states_rank(p.metadata, p.path) else ()))
    assignment, rank_warnings = assign_ranks(facts)
    warnings.extend(rank_warnings)
    if any(p.pieces for p in docs):
        for p in docs:
            if p.pieces:
                warnings.append(f"{p.path}: holds {len(p.pieces)} ranks (a merged trace); split "
                                f"into rank(s) {[q.rank_hint for q in p.pieces]}")
    return units, assignment


def _rank_trace(a: RankFiles, units: list[ParsedFile], warnings: list[str]) -> RankTrace:
    """The :class:`RankTrace` of rank ``a`` from its units (profiling windows joined,
    :func:`_join_windows`); the units' event warnings, and a line when the rank has no timed
    events or no step annotations, go to ``warnings``."""
    r, how = a.rank, a.source
    parts = [units[k] for k in a.keys]
    for p in parts:
        warnings.extend(p.ev_warnings)
    p = parts[0] if len(parts) == 1 else _join_windows(parts)
    f = p.path
    if p.events is not None:
        n_events = len(p.events)
    else:
        assert p.summary is not None  # a unit without its events holds its summary
        n_events = p.summary.n_events
    if n_events == 0:
        warnings.append(f"{f}: rank {r} has no timed events")
    elif not p.has_steps:
        warnings.append(f"{f}: no ProfilerStep#N annotations; per-step results are empty for "
                        f"rank {r}")
    s = p.summary
    windows = tuple(_time_range(q) for q in parts) if len(parts) > 1 else ()
    reader = (functools.partial(read_events, f, p.rank_hint) if p.events is None
              else None)
    assert p.metadata is not None and p.thread_names is not None  # a readable trace's unit
    return RankTrace(rank=r, path=f, events=p.events, metadata=p.metadata, reader=reader,
                     rank_source=how, thread_names=p.thread_names, notes=tuple(p.notes),
                     summary=s, windows=windows, files=tuple(q.path for q in parts))
