"""One trace file in, a :class:`ParsedFile` out: its events (or, with a reducer, the rank's
summary in their place), its metadata, thread names, warnings and notes, and — for a merged
file of several ranks — one piece per rank (:func:`parse_file`). The reducer that summarizes a
rank where its file is parsed is passed in (:class:`RankReducer`): the trace stage never imports
what comes after it."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import pandas as pd

from pardiag.errors import TraceError

from . import vocab
from .classify import kernel_warnings
from .decode import parse_trace_fast
from .parse import (
    PROCESS_NAMES_KEY,
    events_frame,
    is_trace_doc,
    parse_json,
    plain_bytes,
    read_process_names,
)
from .ranks import labelled_rank_of_pids, merged_rank_of_pids, suffixed_rank_of_pids
from .traceset import RankTrace, Summary, has_step_names

_S = TypeVar("_S", bound=Summary)


class RankReducer(Protocol[_S]):
    """The per-rank reduction the loader runs where a file is parsed (worker processes), passed
    in by the caller (:data:`pardiag.analyzer.per_rank.store.REDUCER`); ``_S`` is the type of
    its summaries (what :meth:`store` takes is what :meth:`summarize` gave)."""

    def summarize(self, trace: RankTrace, comm_patterns: list, *, warnings: Iterable[str],
                  repairs: Iterable[str], has_steps: bool | None,
                  stat: os.stat_result | None) -> _S:
        """The rank's summary (``trace.rank`` is provisional, -1)."""

    def find(self, path: Path, comm_patterns: list) -> _S | None:
        """A stored summary of ``path`` that is current, else None (may raise OSError)."""

    def store(self, summary: _S, path: Path) -> None:
        """Store ``summary`` of ``path`` where :meth:`find` looks."""


@dataclasses.dataclass
class ParsedFile:
    """What one worker learned from one file."""

    path: Path
    error: str | None = None
    not_trace: bool = False
    #: a ``pardiag report --json`` output (not a trace; skipped without a warning)
    own_report: bool = False
    repairs: tuple[str, ...] = ()
    metadata: dict | None = None
    events: pd.DataFrame | None = None
    thread_names: dict | None = None
    ev_warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    has_steps: bool = False
    summary: Summary | None = None
    #: the rank this part of a merged multi-rank file holds (see :func:`_split_merged`)
    rank_hint: int | None = None
    #: a merged multi-rank file: its ranks' parts (then this entry holds no events itself)
    pieces: list = dataclasses.field(default_factory=list)


def parse_file(path: Path, reducer: RankReducer | None = None, patterns: tuple[str, ...] = (),
                cache: bool = False, keep_events: bool = True, shift_ns: int = 0) -> ParsedFile:
    """Read, parse and (with a ``reducer``) summarize one file; never raises for bad input.

    ``shift_ns``: put the file's times onto a time zero this much earlier than its own
    ``baseTimeNanoseconds`` (every ``ts`` later by ``shift_ns / 1000`` µs, the base less
    ``shift_ns``), so that files whose bases differ share one (:func:`pardiag.analyzer.trace.
    load.load_traces`)."""
    try:
        try:
            st = os.stat(path)
            raw = path.read_bytes()
        except OSError as exc:
            raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
        holder = [plain_bytes(raw, path)]
        del raw
        fast = parse_trace_fast(holder, path)  # empties the holder when it succeeds
        if fast is not None:
            repairs: list[str] = []
            meta, (events, thread_names, ev_warnings, notes) = fast
        else:
            doc, repairs = parse_json(holder.pop(), path)
    except TraceError as exc:
        return ParsedFile(path, error=str(exc))
    if fast is None:
        if not is_trace_doc(doc):
            return ParsedFile(path, not_trace=True, own_report=isinstance(doc, dict) and all(
                k in doc for k in ("schema_version", "source", "ranks")))
        meta = {k: v for k, v in doc.items() if k != "traceEvents"}
        if isinstance(doc["traceEvents"], list):
            pnames = read_process_names(doc["traceEvents"])
            if pnames:
                meta[PROCESS_NAMES_KEY] = pnames
        events, thread_names, ev_warnings, notes = events_frame(doc["traceEvents"], path,
                                                                vocab.DISPLAY_TIME_UNIT.get(doc))
        del doc
    pnames = meta.pop(PROCESS_NAMES_KEY, {})
    if shift_ns:
        events = events.assign(ts=events["ts"] + shift_ns / 1e3)
        meta[vocab.BASE_TIME_NS.name] = int(vocab.BASE_TIME_NS.get(meta)) - shift_ns
    split = _split_merged(path, events, thread_names, meta, pnames)
    if split is None:
        several = _unnamed_ranks(events)
        if several:
            return ParsedFile(path, error=f"{path}: {several}")
    if split is not None:
        pieces, split_warnings = split
        for piece in pieces:
            piece.repairs = tuple(repairs)
            piece.ev_warnings = tuple(ev_warnings) + tuple(split_warnings)
            piece.notes = tuple(notes)
            # no stored summary: one file, several ranks
            _finish_rank(piece, reducer, patterns, repairs, st, cache=False, keep_events=True)
        return ParsedFile(path, metadata=meta, pieces=pieces)
    out = ParsedFile(path, repairs=tuple(repairs), metadata=meta, events=events,
                  thread_names=thread_names, ev_warnings=tuple(ev_warnings), notes=tuple(notes),
                  has_steps=has_step_names(events))
    _finish_rank(out, reducer, patterns, repairs, st, cache=cache, keep_events=keep_events)
    return out


def _finish_rank(out: ParsedFile, reducer: RankReducer | None, patterns, repairs, st, *,
                 cache: bool, keep_events: bool) -> None:
    """What one rank's events say about its kernels joins its warnings
    (:func:`pardiag.analyzer.trace.classify.kernel_warnings`; with or without a reducer, so a
    report from the raw traces and one from stored summaries say the same); with a
    ``reducer``, the rank is summarized (on the same trace object: its classification is made
    once), the summary stored with ``cache`` and the events dropped unless ``keep_events``."""
    assert out.metadata is not None and out.thread_names is not None  # a rank's trace was read
    trace = RankTrace(rank=-1, path=out.path, events=out.events, metadata=out.metadata,
                      rank_source="", thread_names=out.thread_names, notes=tuple(out.notes))
    compiled = [re.compile(p) for p in patterns]
    out.ev_warnings = (*out.ev_warnings, *kernel_warnings(trace, compiled))
    if reducer is None:
        return
    out.summary = reducer.summarize(trace, compiled, warnings=out.ev_warnings, repairs=repairs,
                                    has_steps=out.has_steps, stat=st)
    if cache:
        reducer.store(out.summary, out.path)
    if not keep_events:
        out.events = None


def _split_merged(path: Path, events: pd.DataFrame, thread_names: dict, meta: dict,
                  process_names: dict[str, list[str]]) -> tuple[list[ParsedFile], list[str]] | None:
    """The ranks of a merged multi-rank file (``pardiag merge`` output, another tool's merge
    whose processes are named ``rank N``, or one whose pids carry the ranks' labels or
    suffixes: :func:`pardiag.analyzer.trace.ranks.labelled_rank_of_pids`,
    :func:`pardiag.analyzer.trace.ranks.suffixed_rank_of_pids`, each process given back its own
    pid), one :class:`ParsedFile` each with the events of its processes and
    ``distributedInfo.rank`` set to it; None for a single-rank file. Events of
    processes that belong to no rank are left out (a warning says how many)."""
    pids = sorted(pd.unique(events["pid"]).tolist(), key=str) if len(events) else []
    mapping = merged_rank_of_pids(process_names, pids, "pardiagMerge" in meta)
    warnings = []
    own_pid: dict[str, str] = {}   # a labelled pid's own pid
    if mapping is None:
        labelled = labelled_rank_of_pids(pids)
        suffixed = suffixed_rank_of_pids(pids) if labelled is None else None
        if labelled is not None:
            mapping, own_pid, note = labelled
            if note:
                warnings.append(f"{path}: {note}")
        elif suffixed is not None:
            mapping, own_pid = suffixed
        else:
            return None
    pid_text = events["pid"].astype(str)   # (pids are text in the event table; keys too)
    rank_of = pid_text.map(mapping)
    if rank_of.isna().any():
        found = _ranks_by_launch(events, rank_of)
        if found:
            mapping = {**mapping, **found}
            rank_of = pid_text.map(mapping)
    stray = int(rank_of.isna().sum())
    if stray:
        warnings.append(f"{path}: left out {stray} events of processes that belong to no rank of "
                        f"this merged file")
    # pardiag merge keeps each rank's own metadata; other tools copy one rank's header, whose
    # group list (pg_config) is that rank's alone
    info = vocab.DISTRIBUTED_INFO.get(meta)
    header = info if isinstance(info, dict) else {}
    merged = meta.get("pardiagMerge")
    if not isinstance(merged, dict):
        merged = {}
    own: dict[Any, dict] = {e.get("rank"): e["metadata"] for e in merged.get("ranks") or []
                            if isinstance(e, dict) and isinstance(e.get("metadata"), dict)}
    base = {k: v for k, v in meta.items() if k != "pardiagMerge"}
    pieces = []
    for r in sorted(set(mapping.values())):
        ev = events[(rank_of == r).to_numpy()].reset_index(drop=True)
        if ev.empty:
            continue
        mine = {p for p, rr in mapping.items() if rr == r}
        ev = _without_rank_prefix(ev, r)
        if own_pid:   # each rank's processes keep their own pids (a GPU's is its device index)
            ev["pid"] = [own_pid.get(p, p) for p in ev["pid"].astype(str).tolist()]
        names_r = {(own_pid.get(str(k[0]), k[0]), *k[1:]): v for k, v in thread_names.items()
                   if str(k[0]) in mine}
        if r in own:
            rmeta = {**base, **own[r]}
            info = dict(vocab.DISTRIBUTED_INFO.get(rmeta) or {})
        else:
            rmeta = dict(base)
            info = dict(header)
            if vocab.DIST_RANK.get(info) != r:
                info.pop(vocab.DIST_PG_CONFIG.name, None)
        info[vocab.DIST_RANK.name] = r
        pieces.append(ParsedFile(
            path, metadata={**rmeta, vocab.DISTRIBUTED_INFO.name: info}, events=ev,
            thread_names=names_r,
            has_steps=has_step_names(ev), rank_hint=r))
    return pieces, warnings


def _without_rank_prefix(ev: pd.DataFrame, rank: int) -> pd.DataFrame:
    """A merged file's part ``ev`` of rank ``rank`` with the merge tool's prefix taken off its
    event names, where every name carries the rank's own
    (:data:`pardiag.analyzer.trace.vocab.RANK_NAME_PREFIX_RE`): the
    names are read as the profiler wrote them (a step is ``ProfilerStep#5`` again)."""
    names = ev["name"].astype(str).tolist()
    if not names:
        return ev
    cut = []
    for n in names:
        m = vocab.RANK_NAME_PREFIX_RE.match(n)
        if m is None or int(m.group(1)) != rank:
            return ev
        cut.append(n[m.end():])
    return ev.assign(name=cut)


def _ranks_by_launch(events: pd.DataFrame, rank_of: pd.Series) -> dict[str, int]:
    """``{pid: rank}`` for the processes of a merged file that no name gave a rank (a GPU's
    timeline, where the merge named only the host's processes ``rank N``): the rank whose
    processes launched every one of its events that links to a launch (a correlation id held by
    one rank alone). None of them where correlation ids repeat across ranks (each rank's
    profiler numbers its own from 1), or where a process holds no linked event."""
    corr = events["correlation"]
    placed = rank_of.notna() & (corr >= 0)
    by_corr = pd.DataFrame({"c": corr[placed], "r": rank_of[placed]}).drop_duplicates()
    one = by_corr.groupby("c")["r"].agg(["nunique", "first"])
    owner = one.loc[one["nunique"] == 1, "first"]
    out: dict[str, int] = {}
    loose = rank_of.isna() & (corr >= 0)
    for pid, cs in corr[loose].groupby(events["pid"][loose]):
        ranks = cs.map(owner)
        if ranks.notna().all() and ranks.nunique() == 1:
            out[str(pid)] = int(ranks.iloc[0])
    return out


def _unnamed_ranks(events: pd.DataFrame) -> str | None:
    """Why one file's events are several ranks' that :func:`_split_merged` cannot tell apart
    (their processes are not named ``rank N``), or None: two or more host processes ran
    profiler steps (``ProfilerStep#N`` user annotations) at the same time, which one rank's
    profiler never records.
    Read as one rank, their kernels' union would be one meaningless timeline."""
    if not len(events):
        return None
    # the host's step ranges (user annotations; Kineto also marks each step on the GPU's
    # timeline, gpu_user_annotation under the device's pid, which does not count)
    marks = events[(events["cat"] == "user_annotation").to_numpy()]
    steps = marks[marks["name"].str.startswith("ProfilerStep", na=False).to_numpy()]
    if len(steps) < 2:
        return None
    pids = pd.unique(steps["pid"])
    order = np.argsort(steps["ts"].to_numpy(), kind="stable")
    ts = steps["ts"].to_numpy()[order]
    end = ts + steps["dur"].to_numpy()[order]
    pid = steps["pid"].to_numpy()[order]
    reach, owner = -np.inf, None   # the latest end so far, and its process
    for t, e, p in zip(ts.tolist(), end.tolist(), pid.tolist()):
        if t < reach and p != owner:
            shown = ", ".join(map(str, sorted(map(str, pids))[:6]))
            return (f"holds the profiler steps of {len(pids)} processes at the same time "
                    f"(pids {shown}{', ...' if len(pids) > 6 else ''}): a merge of several "
                    f"ranks whose processes are not named 'rank N', which pardiag cannot split; "
                    f"report each rank's own file, or name each rank's processes 'rank N'")
        if e > reach:
            reach, owner = e, p
    return _one_step_twice(steps)


def _one_step_twice(steps: pd.DataFrame) -> str | None:
    """Why the host step ranges ``steps`` are two processes' that share a pid (each rank in
    its own container is pid 1, or 47; their traces concatenated), or None: one thread holds
    the same ``ProfilerStep#N`` twice in ranges that overlap, neither within the other (by
    more than :data:`SAME_STEP_TOLERANCE_US`). One process numbers its steps once each; a
    range the user records inside the profiler's, another thread's annotations and a step
    whose start the profiler moved back (to the Python ``step()`` call) are no second
    process."""
    for (pid, _, name), g in steps.groupby(["pid", "tid", "name"], sort=False):
        if len(g) < 2:
            continue
        t = g["ts"].to_numpy(dtype=float)
        e = t + g["dur"].to_numpy(dtype=float)
        o = np.argsort(t, kind="stable")
        t, e = t[o], e[o]
        tol = SAME_STEP_TOLERANCE_US
        for i in range(1, len(t)):
            inside = e[i] <= e[:i].max() + tol or (t[i] - t[:i].min() <= tol)
            if t[i] < e[:i].max() - tol and not inside:
                return (f"holds {name} of process {pid} twice, {t[i] - t[0]:,.0f} µs apart on "
                        f"one thread: a merge of several ranks whose processes share a pid "
                        f"(one per container), which pardiag cannot split; report each rank's "
                        f"own file")
    return None


#: A step range that starts or ends within this (µs) of another of its number is that step
#: annotated twice (:func:`_one_step_twice`).
SAME_STEP_TOLERANCE_US = 10.0


def read_events(path: Path, rank_hint: int | None = None) -> pd.DataFrame:
    """The event table of ``path`` (of rank ``rank_hint``'s part of a merged file), for a rank
    that kept only its summary (:attr:`RankTrace.reader`).

    Raises:
        TraceError: the file cannot be read or is not a trace.
    """
    p = parse_file(Path(path))
    if p.error is not None or p.not_trace:
        raise TraceError(p.error or f"{path}: not a Kineto trace (no traceEvents list)")
    if p.pieces:
        return next(q.events for q in p.pieces if q.rank_hint == rank_hint)
    return p.events


def from_summary(path: Path, s: Summary) -> ParsedFile:
    return ParsedFile(path, repairs=s.repairs, metadata=s.metadata, events=None,
                   thread_names=s.thread_names, ev_warnings=s.relocated(path)[0],
                   notes=s.relocated(path)[1], has_steps=s.has_steps, summary=s)
