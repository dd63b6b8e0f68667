"""Stage 3, summary: one rank's events in, what every analysis needs from them out.

Enters: a :class:`~pardiag.analyzer.trace.traceset.RankTrace` with its events (the loader hands
each parsed file to :data:`REDUCER`). Leaves: its :class:`RankSummary`, stored beside the trace
so that a later report reads it instead of the events.

A :class:`RankSummary` is computed where the trace is (the end of ``pardiag profile`` on each
rank, ``pardiag summarize`` elsewhere, or a worker process of ``pardiag report``) and holds what
the cross-rank analyses need from that rank:

* the time breakdown's parts (:class:`pardiag.analyzer.analyses.breakdown.RankParts`: computation
  and communication interval sets, the window, the step windows, the communication events with their
  collective type);
* the synchronization analysis' communication events of the rank
  (:func:`pardiag.analyzer.analyses.comm_events.events_from_trace`) and its ``ProfilerStep`` windows
  (to place pardiag's collective records in steps);
* the ``[memory]`` events (time, device, allocated and reserved bytes);
* the time per operator name (:mod:`pardiag.analyzer.analyses.operators`: GPU kernels, CPU
  operators);
* the host and device parts per profiler step and the DataLoader iterator's intervals
  (:mod:`pardiag.analyzer.analyses.causes`);
* the file's top-level metadata, thread names, warnings and notes.

Everything a report computes from summaries equals what it computes from the raw events (the
summary *is* the intermediate result); ``tests/test_summary.py`` checks it.

On disk a summary is JSON (``<trace file name>.summary.json``, schema below) in a summary folder:
``<trace folder>/.pardiag-cache/`` when it is writable, else ``$PARDIAG_CACHE_DIR`` or
``~/.cache/pardiag/<hash of the trace folder>/``. It records the trace file's size and
modification time (ns), the ``--comm-kernel`` patterns and a hash of the analyzer code that made
it; a summary whose file changed, whose patterns differ, or that other code made is ignored and
recomputed. Summaries are written only
into these folders and only over pardiag's own summary files.

A summary read back holds its tables as their stored columns
(:class:`~pardiag.analyzer.trace.traceset.ColumnTable`) and builds a DataFrame when one is first
read; the cross-rank analyses stack most of them over all ranks
(:func:`~pardiag.analyzer.trace.traceset.stack_by_rank`), which joins every rank's columns and
builds one table, so a report of thousands of ranks builds a few tables, not thousands.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from pardiag import layout
from pardiag.errors import TraceError

from .analyses.breakdown import RankParts, breakdown_rows_of, rank_parts
from .analyses.causes import (
    LaunchEdges,
    causes_of_trace,
    data_loading_of_trace,
    launch_edges_of_trace,
)
from .analyses.comm_events import events_from_trace
from .analyses.infer_layout import RankMarks, rank_marks
from .analyses.memory import memory_rows
from .analyses.operators import operators_of_events
from .trace.classify import classify, name_codes, profiler_steps
from .trace.comm_records import all_to_all_ops
from .trace.load import default_workers, find_trace_files, parse_file, parse_files
from .trace.traceset import ColumnTable, HoldsTables, RankTrace, StoredTable, has_step_names

#: Bumped whenever the content or the meaning of a summary changes (old ones are recomputed).
SUMMARY_VERSION = 13
#: Modules whose code decides what a summary holds (this one and every analyzer module it
#: imports, directly or through them; ``tests/test_summary.py`` holds that): a summary made by
#: other code is recomputed.
_CODE_MODULES = ("pardiag.analyzer.summary",
                 "pardiag.analyzer.trace.traceset", "pardiag.analyzer.trace.parse",
                 "pardiag.analyzer.trace.ranks", "pardiag.analyzer.trace.load",
                 "pardiag.analyzer.trace.classify", "pardiag.analyzer.trace.intervals",
                 "pardiag.analyzer.trace.comm_records",
                 "pardiag.analyzer.analyses.breakdown", "pardiag.analyzer.analyses.causes",
                 "pardiag.analyzer.analyses.comm_events", "pardiag.analyzer.analyses.infer_layout",
                 "pardiag.analyzer.analyses.issued_ops",
                 "pardiag.analyzer.analyses.memory", "pardiag.analyzer.analyses.mesh",
                 "pardiag.analyzer.analyses.op_semantics", "pardiag.analyzer.analyses.operators",
                 "pardiag.analyzer.analyses.peers")
SUMMARY_KIND = "pardiag-rank-summary"
#: Suffix appended to the trace file name: ``rank0.trace.json.gz.summary.json``.
SUMMARY_SUFFIX = layout.SUMMARY_SUFFIX
#: Name of the summary folder inside a trace folder.
CACHE_DIRNAME = layout.SUMMARY_DIR


@dataclasses.dataclass(frozen=True)
class RankSummary(HoldsTables):
    """What the analyses need from one rank's trace (see the module docstring).

    Attributes:
        path: the trace file summarized (as given when summarizing).
        size: its size in bytes; ``mtime_ns``: its modification time (ns).
        comm_patterns: the ``--comm-kernel`` regular expressions (source strings) used.
        dist_rank: ``distributedInfo.rank`` as found in the file (any JSON value, or None).
        metadata: the file's top-level keys other than ``traceEvents``.
        thread_names: ``{(pid, tid): name}``.
        warnings, notes: the loader's lines for this file (they start with the file path).
        repairs: what reading the file had to repair (not strict JSON), one phrase each.
        n_events: rows of the rank's event table.
        has_steps: an event is named ``ProfilerStep...``.
        has_gpu: the trace holds GPU kernels.
        parts: the time breakdown's per-rank parts (:class:`breakdown.RankParts`).
        breakdown: the time breakdown's rows of the rank (whole trace, steps, collectives;
            :func:`breakdown.breakdown_rows_of`).
        comm: the rank's communication events as the synchronization analysis reads them from the
            trace (:data:`pardiag.analyzer.analyses.comm_events.EVENT_COLUMNS`; ``rank`` is filled
            in when ranks are known).
        steps: ``ProfilerStep`` windows: ``step``, ``start_us``, ``end_us``.
        memory: ``[memory]`` events: ``ts_us``, ``device``, ``allocated_bytes``,
            ``reserved_bytes`` (NaN where not a number).
        marks: what the trace says about the parallel layout
            (:class:`pardiag.analyzer.analyses.infer_layout.RankMarks`), or None.
        operators: time per operator name
            (:func:`pardiag.analyzer.analyses.operators.operators_of_events`: ``kind``, ``name``,
            ``count``, ``time_us``), or None.
        operator_steps: the trace's profiler steps (what ``operators`` is divided by per step).
        a2a: the all-to-alls the rank issued with their split sizes
            (:func:`pardiag.analyzer.trace.comm_records.all_to_all_ops`), or None (an older
            summary).
        causes: host and device parts per profiler step
            (:func:`pardiag.analyzer.analyses.causes.rank_causes`), or None.
        data_loading: the DataLoader iterator's host intervals, shape (n, 2), µs
            (:func:`pardiag.analyzer.analyses.causes.rank_data_loading`), or None.
        launch_edges: what held the rank's computation after each communication kernel
            (:class:`pardiag.analyzer.analyses.causes.LaunchEdges`), or None.
    """

    path: str
    size: int
    mtime_ns: int
    comm_patterns: tuple[str, ...]
    dist_rank: object
    metadata: dict
    thread_names: dict
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    repairs: tuple[str, ...]
    n_events: int
    has_steps: bool
    has_gpu: bool
    parts: object
    breakdown: tuple
    comm: pd.DataFrame = StoredTable()
    steps: pd.DataFrame = StoredTable()
    memory: pd.DataFrame = StoredTable()
    marks: object = None
    operators: pd.DataFrame | None = StoredTable(None)
    operator_steps: int = 0
    a2a: pd.DataFrame | None = StoredTable(None)
    causes: pd.DataFrame | None = StoredTable(None)
    data_loading: np.ndarray | None = None
    launch_edges: LaunchEdges | None = None

    def matches(self, comm_patterns: Iterable) -> bool:
        """True when this summary was computed with the same ``--comm-kernel`` patterns."""
        return self.comm_patterns == pattern_sources(comm_patterns)

    def relocated(self, path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(warnings, notes) with the summarized path replaced by ``path``."""
        old, new = str(self.path), str(path)
        fix = ((lambda s: new + s[len(old):] if s.startswith(old) else s) if old != new
               else (lambda s: s))
        return tuple(fix(w) for w in self.warnings), tuple(fix(n) for n in self.notes)


def pattern_sources(comm_patterns: Iterable) -> tuple[str, ...]:
    """The source strings of compiled (or string) ``--comm-kernel`` patterns."""
    return tuple(p.pattern if isinstance(p, re.Pattern) else str(p) for p in comm_patterns)


def summarize_trace(trace: RankTrace, comm_patterns: Iterable = (), *, warnings: Iterable[str] = (),
                    repairs: Iterable[str] = (), has_steps: bool | None = None,
                    stat: os.stat_result | None = None) -> RankSummary:
    """Compute the summary of one rank's trace.

    Args:
        trace: the rank (its ``rank`` may be provisional: only the ``comm`` table carries it).
        comm_patterns: compiled ``--comm-kernel`` patterns.
        warnings: the loader's warnings for this file (kept with the summary).
        repairs: what reading the file repaired.
        has_steps: whether an event is named ``ProfilerStep...`` (default: looked up).
        stat: ``os.stat`` of the trace file (default: taken now).
    """
    patterns = list(comm_patterns)
    st = stat or os.stat(trace.path)
    parts = rank_parts(trace, patterns, None)
    kinds = classify(trace, patterns)
    steps = profiler_steps(trace, kinds)
    comm = events_from_trace(trace, kinds, steps)
    ops, op_steps = operators_of_events(trace.events, name_codes(trace))
    return RankSummary(
        path=str(trace.path), size=int(st.st_size), mtime_ns=int(st.st_mtime_ns),
        comm_patterns=pattern_sources(patterns),
        dist_rank=(trace.metadata.get("distributedInfo") or {}).get("rank")
        if isinstance(trace.metadata.get("distributedInfo"), dict) else None,
        metadata=trace.metadata, thread_names=dict(trace.thread_names),
        warnings=tuple(warnings), notes=tuple(trace.notes), repairs=tuple(repairs),
        n_events=len(trace.events),
        has_steps=has_step_names(trace.events) if has_steps is None else has_steps,
        has_gpu=trace.has_gpu, parts=parts, breakdown=breakdown_rows_of(parts), comm=comm,
        steps=steps, memory=memory_rows(trace),
        marks=rank_marks(trace), operators=ops, operator_steps=op_steps,
        a2a=all_to_all_ops(trace.events),
        causes=causes_of_trace(trace), data_loading=data_loading_of_trace(trace),
        launch_edges=launch_edges_of_trace(trace, patterns))


# -- JSON form -----------------------------------------------------------------------------------

def _frame_json(df: pd.DataFrame) -> dict:
    return {"columns": list(df.columns),
            "dtypes": [str(t) for t in df.dtypes],
            "data": [df[c].tolist() for c in df.columns]}


def _table_from(d: dict) -> ColumnTable:
    """A stored table as its columns (built when first read; without rows, a copy of its
    schema's shared empty table)."""
    return ColumnTable(d["columns"], d["dtypes"], d["data"])


def to_json(s: RankSummary) -> bytes:
    """The summary as JSON bytes (floats written exactly, NaN as null)."""
    p = s.parts
    comm_ev = p.comm_events.drop(columns=["args", "issuer_record"], errors="ignore")
    doc = {
        "kind": SUMMARY_KIND, "version": SUMMARY_VERSION, "code": code_fingerprint(),
        "path": s.path, "size": s.size,
        "mtime_ns": s.mtime_ns, "comm_patterns": list(s.comm_patterns), "dist_rank": s.dist_rank,
        "metadata": s.metadata,
        "thread_names": [[pid, tid, name] for (pid, tid), name in s.thread_names.items()],
        "warnings": list(s.warnings), "notes": list(s.notes), "repairs": list(s.repairs),
        "n_events": s.n_events, "has_steps": s.has_steps, "has_gpu": s.has_gpu,
        "parts": {"domain": p.domain, "k": p.k.tolist(), "c": p.c.tolist(), "lo": p.lo,
                  "hi": p.hi, "step_windows": [list(w) for w in p.step_windows],
                  "comm_events": _frame_json(comm_ev)},
        "breakdown": {"total": s.breakdown[0], "steps": s.breakdown[1],
                      "collectives": s.breakdown[2]},
        "comm": _frame_json(s.comm), "steps": _frame_json(s.steps),
        "memory": _frame_json(s.memory),
        "marks": s.marks.to_json() if s.marks is not None else None,
        "operators": _frame_json(s.operators) if s.operators is not None else None,
        "operator_steps": s.operator_steps,
        "a2a": _frame_json(s.a2a) if s.a2a is not None else None,
        "causes": _frame_json(s.causes) if s.causes is not None else None,
        "data_loading": s.data_loading.tolist() if s.data_loading is not None else None,
        "launch_edges": {"after_comm": s.launch_edges.after_comm.tolist(),
                         "host_syncs": s.launch_edges.host_syncs.tolist(),
                         "latency_us": s.launch_edges.latency_us}
        if s.launch_edges is not None else None,
    }
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
                        default=_json_default)


def _json_default(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, (set, tuple)):
        return list(v)
    return str(v)


def _nan_row(row: dict) -> dict:
    """A breakdown row read back from JSON: null (NaN when written) becomes NaN again."""
    return {k: (float("nan") if v is None else v) for k, v in row.items()}


def _intervals(rows) -> np.ndarray:
    a = np.asarray(rows, dtype=np.float64)
    return a.reshape(-1, 2) if a.size else np.empty((0, 2), dtype=np.float64)


def from_json(data: bytes) -> RankSummary:
    """Parse :func:`to_json` output.

    Raises:
        ValueError: not a pardiag rank summary of the current version.
    """

    doc = orjson.loads(data)
    if not isinstance(doc, dict) or doc.get("kind") != SUMMARY_KIND:
        raise ValueError("not a pardiag rank summary")
    if doc.get("version") != SUMMARY_VERSION:
        raise ValueError(f"summary version {doc.get('version')!r}, expected {SUMMARY_VERSION}")
    if doc.get("code") != code_fingerprint():
        raise ValueError("summary made by another version of pardiag's analyzer")
    p = doc["parts"]
    ce = p["comm_events"]  # written without its args: read back with them all None
    rows = len(ce["data"][0]) if ce["data"] else 0
    comm_ev = ColumnTable([*ce["columns"], "args"], [*ce["dtypes"], "object"],
                          [*ce["data"], [None] * rows])
    parts = RankParts(p["domain"], _intervals(p["k"]), _intervals(p["c"]), float(p["lo"]),
                       float(p["hi"]), [(int(a), float(b), float(c)) for a, b, c in
                                        p["step_windows"]], comm_ev)
    return RankSummary(
        path=doc["path"], size=int(doc["size"]), mtime_ns=int(doc["mtime_ns"]),
        comm_patterns=tuple(doc["comm_patterns"]), dist_rank=doc["dist_rank"],
        metadata=doc["metadata"],
        thread_names={(str(a), str(b)): str(c) for a, b, c in doc["thread_names"]},
        warnings=tuple(doc["warnings"]), notes=tuple(doc["notes"]),
        repairs=tuple(doc["repairs"]), n_events=int(doc["n_events"]),
        has_steps=bool(doc["has_steps"]), has_gpu=bool(doc["has_gpu"]), parts=parts,
        breakdown=(_nan_row(doc["breakdown"]["total"]),
                   [_nan_row(r) for r in doc["breakdown"]["steps"]],
                   [_nan_row(r) for r in doc["breakdown"]["collectives"]]),
        comm=_table_from(doc["comm"]),
        steps=_table_from(doc["steps"]), memory=_table_from(doc["memory"]),
        marks=RankMarks.from_json(doc["marks"]) if doc.get("marks") else None,
        operators=_table_from(doc["operators"]) if doc.get("operators") else None,
        operator_steps=int(doc.get("operator_steps") or 0),
        a2a=_table_from(doc["a2a"]) if doc.get("a2a") else None,
        causes=_table_from(doc["causes"]) if doc.get("causes") else None,
        data_loading=_intervals(doc["data_loading"]) if doc.get("data_loading") is not None
        else None,
        launch_edges=_launch_edges(doc.get("launch_edges")))


def _launch_edges(d: dict | None) -> LaunchEdges | None:
    if d is None:
        return None
    a = np.asarray(d["after_comm"], dtype=np.float64)
    return LaunchEdges(a.reshape(-1, 3) if a.size else np.empty((0, 3)),
                       _intervals(d["host_syncs"]), float(d["latency_us"]))


# -- where summaries live ------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of the source of :data:`_CODE_MODULES` (so a changed pardiag never reuses a summary
    made by older code, even without a version bump).

    Raises:
        RuntimeError: a module's source file cannot be read (a broken install): hashing its
            name instead would let summaries of other code pass for current.
    """
    h = hashlib.sha1(str(SUMMARY_VERSION).encode())
    for name in _CODE_MODULES:
        path = Path(importlib.import_module(name).__file__)
        try:
            h.update(path.read_bytes())
        except OSError as exc:
            raise RuntimeError(f"{path}: cannot read the source of {name} to fingerprint "
                               f"pardiag's summaries ({exc.strerror or exc})") from None
    return h.hexdigest()[:16]


def summary_dirs(trace_path: Path) -> Iterator[Path]:
    """Folders where the summary of ``trace_path`` may be, in lookup order: the trace folder's
    ``.pardiag-cache/``, then the user cache folder for that trace folder (worked out only when
    the first is passed over)."""
    folder = Path(trace_path).resolve().parent
    yield folder / CACHE_DIRNAME
    yield layout.user_cache_dir() / hashlib.sha1(str(folder).encode()).hexdigest()[:16]


def summary_file_name(trace_path: Path) -> str:
    """``rank0.trace.json.gz`` → ``rank0.trace.json.gz.summary.json``."""
    return Path(trace_path).name + SUMMARY_SUFFIX


def find_summary(trace_path: Path, comm_patterns: Iterable = (),
                 stat: os.stat_result | None = None) -> RankSummary | None:
    """The stored summary of ``trace_path`` if one is current: same size, modification time,
    patterns and version; else None (nothing raised for missing or unreadable summaries)."""
    st = stat or os.stat(trace_path)
    want = pattern_sources(comm_patterns)
    for d in summary_dirs(trace_path):
        f = d / summary_file_name(trace_path)
        try:
            s = from_json(f.read_bytes())
        except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
            continue
        if s.size == st.st_size and s.mtime_ns == st.st_mtime_ns and s.comm_patterns == want:
            return s
    return None


def _is_ours(f: Path) -> bool:
    try:
        with open(f, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return False
    return head.startswith(b'{"kind":"' + SUMMARY_KIND.encode())


def _writable(folder: Path) -> bool:
    """A folder pardiag may create its summary folder in: writable by us, and not marked
    read-only by its permission bits (root can write anywhere; shared read-only material stays
    untouched)."""
    try:
        return os.access(folder, os.W_OK) and bool(os.stat(folder).st_mode & 0o222)
    except OSError:
        return False


def write_summary(s: RankSummary, trace_path: Path) -> Path | None:
    """Store ``s`` for ``trace_path`` in the first writable summary folder (see
    :func:`summary_dirs`); never over a file that is not a pardiag summary. Returns the file
    written, or None when no folder is writable (the report still works, only slower next
    time)."""
    try:
        data = to_json(s)
    except (TypeError, ValueError, orjson.JSONEncodeError):  # e.g. integers beyond 64 bits
        return None
    for d in summary_dirs(trace_path):
        f = d / summary_file_name(trace_path)
        if f.exists() and not _is_ours(f):
            continue
        anc = d
        while not anc.exists() and anc.parent != anc:
            anc = anc.parent
        if not _writable(anc):
            continue
        try:
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f".{f.name}.{os.getpid()}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, f)
            return f
        except OSError:
            continue
    return None


@dataclasses.dataclass(frozen=True)
class SummarizeResult:
    """Result of :func:`summarize_paths`.

    Attributes:
        written: ``{trace file: summary file}`` for the summaries computed now (summary file None
            where no summary folder was writable).
        current: trace files whose stored summary was already current (left as they are).
        skipped: one line per file that is not a readable trace.
    """

    written: dict
    current: tuple
    skipped: tuple


def summarize_paths(paths, comm_patterns: Iterable = (), *, shard: tuple[int, int] = (0, 1),
                    workers: int | None = None, progress=None) -> SummarizeResult:
    """Compute and store the summary of every trace file under ``paths`` that lacks a current one.

    Args:
        paths: folders and/or trace files (as :func:`pardiag.analyzer.trace.load.load_traces`
            takes).
        comm_patterns: compiled ``--comm-kernel`` patterns.
        shard: ``(i, n)``: handle only the files whose position in the sorted file list is ``i``
            modulo ``n`` (run ``n`` copies, e.g. one per torchrun process or node).
        workers: parsing processes (default: one per core for large inputs).
        progress: ``progress(done, total)`` after each file.

    Raises:
        TraceError: a path does not exist, or no trace file is found.
        ValueError: a bad shard.
    """
    i, n = shard
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard {i}/{n}: need 0 <= i < n")
    paths = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    files, _, source, _ = find_trace_files(paths)
    if not files:
        raise TraceError(f"{source}: no trace files (*.json, *.json.gz) found")
    files = sorted(files, key=str)[i::n]
    patterns = list(comm_patterns)
    current, todo = [], []
    for f in files:
        (current if find_summary(f, patterns) is not None else todo).append(f)
    if progress and current:
        progress(len(current), len(files))
    n_workers = default_workers(todo) if workers is None else workers
    done = len(current)

    def step(k: int, total: int) -> None:
        if progress:
            progress(done + k, len(files))

    written, skipped = {}, []
    for p in parse_files(todo, n_workers, step, reducer=REDUCER, cache=True,
                        patterns=pattern_sources(patterns), keep_events=False):
        if p.error is not None:
            skipped.append(f"{p.error} - skipped")
        elif p.not_trace:
            skipped.append(f"{p.path}: not a Kineto trace (no traceEvents list) - skipped")
        else:
            found = [d / summary_file_name(p.path) for d in summary_dirs(p.path)]
            written[p.path] = next((f for f in found if f.exists()), None)
    return SummarizeResult(written, tuple(current), tuple(skipped))


def summarize_file(path: Path, comm_patterns: Iterable = (), *, store: bool = True) -> RankSummary:
    """Parse one trace file, compute its summary and (with ``store``) write it where
    :func:`find_summary` looks (see :func:`write_summary`).

    Raises:
        TraceError: the file cannot be read or is not a Kineto trace.
    """
    p = parse_file(Path(path), reducer=REDUCER, cache=store,
                    patterns=pattern_sources(comm_patterns), keep_events=False)
    if p.error is not None:
        raise TraceError(p.error)
    if p.not_trace:
        raise TraceError(f"{path}: not a Kineto trace (no traceEvents list)")
    if p.pieces:
        raise TraceError(f"{path}: holds {len(p.pieces)} ranks (a merged trace); summaries are "
                         f"made per rank file")
    return p.summary


class SummaryReducer:
    """The per-rank reduction that :func:`pardiag.analyzer.trace.load.load_traces` runs where it
    parses a file (:class:`pardiag.analyzer.trace.load.RankReducer`): :func:`summarize_trace`,
    :func:`find_summary`, :func:`write_summary`."""

    def summarize(self, trace: RankTrace, comm_patterns: list, *, warnings=(), repairs=(),
                  has_steps: bool | None = None, stat=None) -> RankSummary:
        return summarize_trace(trace, comm_patterns, warnings=warnings, repairs=repairs,
                               has_steps=has_steps, stat=stat)

    def find(self, path: Path, comm_patterns: list) -> RankSummary | None:
        return find_summary(path, comm_patterns)

    def store(self, summary: RankSummary, path: Path) -> None:
        write_summary(summary, path)


#: Pass as ``load_traces(..., reducer=REDUCER)`` to load a run from (and into) summaries.
REDUCER = SummaryReducer()
