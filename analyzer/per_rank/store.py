"""Where rank summaries live and how they are written: the JSON form of a
:class:`~pardiag.analyzer.per_rank.summary.RankSummary`, the summary folders, and the reducer the
loader runs where it parses a file.

On disk a summary is JSON (``<trace file name>.summary.json``) in a summary folder:
``<trace folder>/.pardiag-cache/`` when it is writable, else ``$PARDIAG_CACHE_DIR`` or
``~/.cache/pardiag/<hash of the trace folder>/``. It records the trace file's size and
modification time (ns), the ``--comm-kernel`` patterns and a hash of the code of the trace and
per-rank stages (:func:`code_fingerprint`: every module of ``trace/`` and ``per_rank/``); a
summary whose file changed, whose patterns differ, or that other code made is ignored and
recomputed. Summaries are written only into these folders and only over pardiag's own summary
files.

Each quantity of a summary is written by its type (:func:`encode`): a table as its columns, an
array with its shape, a typed part (:class:`~pardiag.analyzer.per_rank.breakdown.RankParts`,
...) by its own ``to_json``/``from_json``. A summary read back holds its tables as their stored
columns (:class:`~pardiag.analyzer.trace.traceset.ColumnTable`) and builds a DataFrame when one
is first read; the cross-rank analyses stack most of them over all ranks
(:func:`~pardiag.analyzer.trace.traceset.stack_by_rank`), which joins every rank's columns and
builds one table, so a report of thousands of ranks builds a few tables, not thousands.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import typing
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from pardiag import layout
from pardiag.errors import TraceError

from ..trace.classify import pattern_key
from ..trace.files import parse_file
from ..trace.folders import find_trace_files
from ..trace.traceset import RankTrace, frame_json, table_from_json
from ..trace.workers import default_workers, parse_files
from .summary import QUANTITIES, RankSummary, summarize_trace

#: Bumped whenever the form of a summary changes (old ones are recomputed); a change of the
#: code that computes one is caught by :func:`code_fingerprint`.
SUMMARY_VERSION = 17
SUMMARY_KIND = "pardiag-rank-summary"
#: Suffix appended to the trace file name: ``rank0.trace.json.gz.summary.json``.
SUMMARY_SUFFIX = layout.SUMMARY_SUFFIX
#: Name of the summary folder inside a trace folder.
CACHE_DIRNAME = layout.SUMMARY_DIR
#: The packages whose code decides what a summary holds (every module of each is hashed).
_CODE_PACKAGES = ("trace", "per_rank")


#: ``--comm-kernel`` patterns, compiled or as their source strings.
Patterns = Iterable[re.Pattern[str] | str]


def pattern_sources(comm_patterns: Patterns) -> tuple[str, ...]:
    """The source strings of compiled (or string) ``--comm-kernel`` patterns."""
    return pattern_key(comm_patterns)


# -- JSON form -----------------------------------------------------------------------------------

#: The header fields of a summary (the file's record), written as they are.
_HEADER = ("path", "size", "mtime_ns", "comm_patterns", "dist_rank", "metadata", "warnings",
           "notes", "repairs", "n_events", "has_steps", "has_gpu")


@functools.lru_cache(maxsize=1)
def _quantity_types() -> dict[str, type]:
    """``{quantity field: its type}`` of :class:`RankSummary` (annotations resolved)."""
    hints = typing.get_type_hints(RankSummary)
    return {name: hints[name] for name, _, _ in QUANTITIES}


def encode(tp: type, value: Any) -> Any:
    """One quantity of type ``tp`` as JSON values: a DataFrame as its columns
    (:func:`~pardiag.analyzer.trace.traceset.frame_json`), an array as its dtype, shape and
    values, a type with ``to_json`` by that, a number or text as it is.

    Raises:
        TypeError: ``tp`` has no JSON form here (add one beside this function).
    """
    if tp is pd.DataFrame:
        return frame_json(value)
    if tp is np.ndarray:
        return {"dtype": str(value.dtype), "shape": list(value.shape),
                "data": value.ravel().tolist()}
    if hasattr(tp, "to_json"):
        return value.to_json()
    if tp in (int, float, bool, str):
        return value
    raise TypeError(f"a rank summary's quantity of type {tp!r} has no JSON form")


def decode(tp: type, doc: Any) -> Any:
    """The inverse of :func:`encode` (a table as a not yet built
    :class:`~pardiag.analyzer.trace.traceset.ColumnTable`; NaN written as null read as NaN)."""
    if tp is pd.DataFrame:
        return table_from_json(doc)
    if tp is np.ndarray:
        data = [np.nan if v is None else v for v in doc["data"]]
        return np.asarray(data, dtype=doc["dtype"]).reshape(doc["shape"])
    if hasattr(tp, "from_json"):
        return tp.from_json(doc)
    if tp in (int, float, bool, str):
        return tp(doc)
    raise TypeError(f"a rank summary's quantity of type {tp!r} has no JSON form")


def to_json(s: RankSummary) -> bytes:
    """The summary as JSON bytes (floats written exactly, NaN as null)."""
    doc = {"kind": SUMMARY_KIND, "version": SUMMARY_VERSION, "code": code_fingerprint(),
           **{k: getattr(s, k) for k in _HEADER},
           "thread_names": [[pid, tid, name] for (pid, tid), name in s.thread_names.items()],
           "quantities": {name: encode(tp, getattr(s, name))
                          for name, tp in _quantity_types().items()}}
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
                        default=_json_default)


def _json_default(v: object) -> int | float | list[Any] | str:
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, (set, tuple)):
        return list(v)
    return str(v)


def from_json(data: bytes) -> RankSummary:
    """Parse :func:`to_json` output.

    Raises:
        ValueError: not a pardiag rank summary of the current version and code.
        KeyError, TypeError: a summary of this version with a field missing or malformed.
    """
    doc = orjson.loads(data)
    if not isinstance(doc, dict) or doc.get("kind") != SUMMARY_KIND:
        raise ValueError("not a pardiag rank summary")
    if doc.get("version") != SUMMARY_VERSION:
        raise ValueError(f"summary version {doc.get('version')!r}, expected {SUMMARY_VERSION}")
    if doc.get("code") != code_fingerprint():
        raise ValueError("summary made by another version of pardiag's analyzer")
    q = doc["quantities"]
    return RankSummary(
        path=doc["path"], size=int(doc["size"]), mtime_ns=int(doc["mtime_ns"]),
        comm_patterns=tuple(doc["comm_patterns"]), dist_rank=doc["dist_rank"],
        metadata=doc["metadata"],
        thread_names={(str(a), str(b)): str(c) for a, b, c in doc["thread_names"]},
        warnings=tuple(doc["warnings"]), notes=tuple(doc["notes"]),
        repairs=tuple(doc["repairs"]), n_events=int(doc["n_events"]),
        has_steps=bool(doc["has_steps"]), has_gpu=bool(doc["has_gpu"]),
        **{name: decode(tp, q[name]) for name, tp in _quantity_types().items()})


# -- where summaries live ------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of the source of every module of the trace and per-rank stages
    (:data:`_CODE_PACKAGES`), so a changed pardiag never reuses a summary made by older code,
    even without a version bump.

    Raises:
        RuntimeError: a module's source file cannot be read (a broken install): hashing its
            name instead would let summaries of other code pass for current.
    """
    h = hashlib.sha1(str(SUMMARY_VERSION).encode())
    analyzer = Path(__file__).resolve().parent.parent
    for pkg in _CODE_PACKAGES:
        for path in sorted((analyzer / pkg).glob("*.py")):
            try:
                h.update(path.name.encode())
                h.update(path.read_bytes())
            except OSError as exc:
                raise RuntimeError(f"{path}: cannot read the source to fingerprint pardiag's "
                                   f"summaries ({exc.strerror or exc})") from None
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


def find_summary(trace_path: Path, comm_patterns: Patterns = (),
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

    written: dict[Path, Path | None]
    current: tuple[Path, ...]
    skipped: tuple[str, ...]


def summarize_paths(paths: Path | str | Iterable[Path | str], comm_patterns: Patterns = (), *,
                    shard: tuple[int, int] = (0, 1), workers: int | None = None,
                    progress: Callable[[int, int], object] | None = None) -> SummarizeResult:
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
    roots = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
    files, _, source, _ = find_trace_files(roots)
    if not files:
        raise TraceError(f"{source}: no trace files (*.json, *.json.gz) found")
    files = sorted(files, key=str)[i::n]
    patterns = list(comm_patterns)
    current: list[Path] = []
    todo: list[Path] = []
    for f in files:
        (current if find_summary(f, patterns) is not None else todo).append(f)
    if progress and current:
        progress(len(current), len(files))
    n_workers = default_workers(todo) if workers is None else workers
    done = len(current)

    def step(k: int, total: int) -> None:
        if progress:
            progress(done + k, len(files))

    written: dict[Path, Path | None] = {}
    skipped: list[str] = []
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


def summarize_file(path: Path, comm_patterns: Patterns = (), *, store: bool = True
                   ) -> RankSummary:
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
    # summarized by REDUCER: the file's one rank has its RankSummary
    return typing.cast(RankSummary, p.summary)


class SummaryReducer:
    """The per-rank reduction that :func:`pardiag.analyzer.trace.load.load_traces` runs where it
    parses a file (:class:`pardiag.analyzer.trace.files.RankReducer`): :func:`summarize_trace`,
    :func:`find_summary`, :func:`write_summary`."""

    def summarize(self, trace: RankTrace, comm_patterns: list[re.Pattern[str]], *,
                  warnings: Iterable[str] = (), repairs: Iterable[str] = (),
                  has_steps: bool | None = None, stat: os.stat_result | None = None
                  ) -> RankSummary:
        return summarize_trace(trace, comm_patterns, warnings=warnings, repairs=repairs,
                               has_steps=has_steps, stat=stat)

    def find(self, path: Path, comm_patterns: list[re.Pattern[str]]) -> RankSummary | None:
        return find_summary(path, comm_patterns)

    def store(self, summary: RankSummary, path: Path) -> None:
        write_summary(summary, path)


#: Pass as ``load_traces(..., reducer=REDUCER)`` to load a run from (and into) summaries.
REDUCER = SummaryReducer()
