"""The loaded run as data: :class:`RankTrace` (one rank's event table and metadata) and
:class:`TraceSet` (all ranks, warnings, pardiag's sidecars).

The bottom layer of the analyzer: no I/O, no parsing, no analysis. Parsing
(:mod:`pardiag.analyzer.trace.parse`) and loading (:mod:`pardiag.analyzer.trace.load`) build these
types; every analysis reads them, never the reverse (``tests/test_layers.py`` holds that line).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any, Protocol, TypedDict

import numpy as np
import pandas as pd

from pardiag.errors import TraceError
from pardiag.layout import CommsSidecar, PipelineSidecar, RankMeta, RunFile

from . import vocab

#: Columns of :attr:`RankTrace.events` (one row per complete event, ``ph == "X"``, or memory
#: instant event). ``cat`` normalised (``kernel``, ``cpu_op``, ``cuda_runtime``, ...; categorical
#: when the parser builds the table: analyses compare it, never assume its dtype); ``ts``/``dur``
#: in µs on the trace's own clock; ``stream`` -1 for CPU events;
#: ``correlation`` -1 when absent; ``device`` the device a GPU event names (its ``device`` arg),
#: -1 where none or off the device; ``args`` holds the raw args dict for communication and
#: memory events (None otherwise).
EVENT_COLUMNS = ("name", "cat", "ph", "pid", "tid", "ts", "dur", "stream", "correlation",
                 "device", "args")
#: Categories of events that run on a GPU stream.
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


class Summary(Protocol):
    """What the trace stage reads of a rank's summary (the per-rank stage's
    :class:`pardiag.analyzer.per_rank.summary.RankSummary`, which the loader receives from its
    reducer and this stage does not import). Its fields are read only (properties here: a
    frozen dataclass's fields are)."""

    @property
    def metadata(self) -> dict: ...
    @property
    def thread_names(self) -> dict: ...
    @property
    def repairs(self) -> tuple[str, ...]: ...
    @property
    def n_events(self) -> int: ...
    @property
    def has_steps(self) -> bool: ...
    @property
    def has_gpu(self) -> bool: ...

    @property
    def extent(self) -> tuple[float, float]:
        """(first start, last end) of the file's events, µs; NaN without any (what
        :func:`time_range` gives for its events)."""
        ...

    @property
    def records_ranks(self) -> Any:
        """The global ranks the file's communication records name as the caller's own, an
        integer array (:func:`pardiag.analyzer.trace.comm_records.ranks_in_records`)."""
        ...

    def stored(self, name: str) -> pd.DataFrame | ColumnTable:
        """The table ``name`` as held (a DataFrame or a not yet built :class:`ColumnTable`)."""
        ...

    def relocated(self, path: Path | str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(warnings, notes) of the summarized file, its path replaced by ``path``."""
        ...


class _LazyEvents:
    """Descriptor of :attr:`RankTrace.events`: a rank loaded from its summary reads its raw
    events on first access through its :attr:`RankTrace.reader` (which the loader sets) and
    keeps them."""

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return dataclasses.MISSING  # a required dataclass field
        ev = obj.__dict__.get("_events")
        if ev is None:
            reader = obj.__dict__.get("reader")
            if reader is None:
                raise TraceError(f"{obj.path}: the rank's events were not loaded")
            ev = reader()
            obj.__dict__["_events"] = ev
        return ev

    def __set__(self, obj: Any, value: pd.DataFrame | None) -> None:
        obj.__dict__["_events"] = value


@dataclasses.dataclass(frozen=True)
class RankTrace:
    """The events of one rank's trace file.

    Attributes:
        rank: global rank.
        path: the file it came from.
        events: DataFrame with :data:`EVENT_COLUMNS`, sorted by ``ts``. A rank loaded from its
            summary (``summary`` set, ``events=None`` given) reads them from ``path`` on first
            access; the analyses use the summary and do not touch them.
        metadata: top-level keys of the trace other than ``traceEvents`` (``distributedInfo``,
            ``baseTimeNanoseconds``, ``deviceProperties``, ...).
        rank_source: ``"distributedInfo"``, ``"merged file"``, ``"file name"``,
            ``"records"`` (its collectives' records) or ``"assigned"``.
        thread_names: ``{(pid, tid): name}`` from ``thread_name`` metadata events.
        notes: informational lines (clipped overlaps and the like).
        summary: the rank's :class:`pardiag.analyzer.per_rank.summary.RankSummary` when it was
            loaded from (or with) one, else None (the analyses read it through
            :func:`pardiag.analyzer.per_rank.summary.summary_of`, which computes it then).
        windows: ``((start µs, end µs), ...)`` of each profiling window when the rank's events
            come from several files (``schedule(repeat=N)``), else ``()``; the time between
            windows is not the rank's time (the breakdown leaves it out).
        files: every file the rank's events come from (``(path,)`` for one file).
        reader: ``reader() -> events`` for a rank whose events were not kept (set by the
            loader; reading is I/O, which this module does not do itself).
    """

    rank: int
    path: Path
    events: pd.DataFrame = _LazyEvents()
    # required fields: the descriptor above reads as the dataclass default MISSING (mypy takes
    # it for a default)
    metadata: dict  # type: ignore[misc]
    rank_source: str  # type: ignore[misc]
    thread_names: dict  # type: ignore[misc]
    notes: tuple[str, ...] = ()
    summary: Summary | None = dataclasses.field(default=None, repr=False, compare=False)
    windows: tuple[tuple[float, float], ...] = ()
    files: tuple[Path, ...] = ()
    reader: object = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def has_gpu(self) -> bool:
        """True when the trace holds GPU kernels (then analyses use the device timeline)."""
        if self.summary is not None and self.__dict__.get("_events") is None:
            return bool(self.summary.has_gpu)
        return bool((self.events["cat"] == "kernel").any())

    @property
    def pg_config(self) -> list[dict]:
        """The well-formed entries of ``distributedInfo.pg_config`` (dicts with a ``ranks``
        list): the process groups the trace says the rank belongs to, with ``pg_name`` and
        ``pg_desc`` where given; ``[]`` when it says none."""
        groups = vocab.DIST_PG_CONFIG.get(vocab.DISTRIBUTED_INFO.get(self.metadata))
        return [g for g in (groups if isinstance(groups, list) else [])
                if isinstance(g, dict) and isinstance(vocab.PG_CONFIG_RANKS.get(g), list)]

    @property
    def events_loaded(self) -> bool:
        """False while the raw events of a rank loaded from its summary have not been read."""
        return self.__dict__.get("_events") is not None


class Sidecars(TypedDict, total=False):
    """:attr:`TraceSet.sidecars`: pardiag's sidecars by kind and rank, as the loader decoded
    them (a kind not named here as parsed)."""

    comms: dict[int, CommsSidecar]
    pipeline: dict[int, PipelineSidecar]
    hang: dict[int, dict]


@dataclasses.dataclass(frozen=True)
class TraceSet:
    """All ranks of one run.

    Attributes:
        ranks: ``{rank: RankTrace}`` in rank order.
        source: what was loaded (folder or file list), for display.
        warnings: one line per problem met while loading (files skipped, ranks assigned, ...).
        run_info: ``run.json`` (:class:`pardiag.layout.RunFile`) when the folder came from
            ``pardiag profile``.
        rank_meta: ``{rank: RankMeta}`` from the ``rank{R}.meta.json`` sidecars
            (:class:`pardiag.layout.RankMeta`).
        sidecars: other pardiag sidecars by kind and rank, decoded once by the loader:
            ``{"comms": {rank: CommsSidecar}, "pipeline": {rank: PipelineSidecar}, "hang":
            {rank: dict}}`` (:class:`pardiag.layout.CommsSidecar`,
            :class:`pardiag.layout.PipelineSidecar`; a hang dump as parsed).
        capture: of a monitored run's deep capture (a ``capture-S/`` folder given alone), the
            run it belongs to and the steps it holds (:func:`pardiag.layout.capture_context`);
            None otherwise.
    """

    ranks: dict[int, RankTrace]
    source: str
    warnings: tuple[str, ...] = ()
    run_info: RunFile | None = None
    rank_meta: dict[int, RankMeta] = dataclasses.field(default_factory=dict)
    sidecars: Sidecars = dataclasses.field(default_factory=Sidecars)
    capture: dict | None = None

    def capture_line(self) -> str | None:
        """Where a monitored run's deep capture comes from, in one line (``steps S–E of the
        monitored run ...``; None for any other input): its steps, the run, the finding it was
        asked for, where it lies against the run's findings (``against_findings``, when the
        report found them), and how to report the whole run."""
        c = self.capture
        if c is None:
            return None
        why = f", asked on: {c['reason']}" if c.get("reason") else ""
        why += f"; it {c['against_findings']}" if c.get("against_findings") else ""
        if c.get("monitored_run_found", True):
            whole = f"the whole run: pardiag report {c['monitored_run']}"
        elif Path(c["monitored_run"]).is_dir():
            whole = ("that folder now holds another run: this capture was copied away from "
                     "its own")
        else:
            whole = "that folder is not here: this capture was copied or moved away from it"
        return (f"steps {c['first_step']}–{c['last_step']} of the monitored run "
                f"{c['monitored_run']}{why} ({whole})")

    def failures(self) -> list[tuple[int, str]]:
        """The failed ranks, the first failure first (:func:`failures_in_order`)."""
        return failures_in_order(self.run_info, self.rank_meta)

    def first_unfinished_step(self, rank: int) -> int | None:
        """The first ``ProfilerStep#N`` number that ``rank`` did not finish, from its metadata:
        ``pardiag profile`` steps the profiler after each optimizer step, so ``ProfilerStep#N``
        runs from the rank's N-th optimizer step to its (N+1)-th, and a rank that made ``k``
        optimizer steps ended inside step ``k`` (it failed or hung there, or its script ended
        with no step after it). None when the rank has no metadata or made no optimizer step
        (its profiler steps are not optimizer steps, or unknown)."""
        meta = self.rank_meta.get(rank)
        n = meta.optimizer_steps if meta is not None else None
        return n if isinstance(n, int) and n > 0 else None

    def unfinished_mask(self, ranks, steps) -> np.ndarray:
        """Bool per row of the parallel sequences ``ranks`` and ``steps`` (profiler step
        numbers): the rank did not finish that step (:meth:`first_unfinished_step`)."""
        first = {int(r): self.first_unfinished_step(int(r)) for r in set(ranks)}
        return np.array([first[int(r)] is not None and int(s) >= first[int(r)]  # type: ignore[operator]
                         for r, s in zip(ranks, steps)], dtype=bool)


def failures_in_order(run_info: RunFile | None, rank_meta: dict[int, RankMeta]
                      ) -> list[tuple[int, str]]:
    """``[(rank, error line)]`` of the ranks ``run.json`` names failed, the first failure
    first: by when each rank ended (its metadata's ``ended_unix``; the rank that failed first
    took the others down, whose errors, such as gloo's "Connection closed", are consequences),
    ranks without that time last, in rank order. ``[]`` without a run file."""
    if run_info is None:
        return []

    def when(item: tuple[str, str]) -> tuple[float, int]:
        meta = rank_meta.get(int(item[0]))
        ended = meta.ended_unix if meta is not None else None
        return (float(ended) if ended is not None else float("inf"), int(item[0]))
    return [(int(r), msg) for r, msg in sorted(run_info.failed_ranks.items(), key=when)]


def isin_mask(values: pd.Series, allowed) -> np.ndarray:
    """Bool array: each of ``values`` is one of ``allowed`` (``Series.isin``). A categorical
    column (the event table's ``cat``, :func:`~pardiag.analyzer.trace.classify.classify`'s
    kinds) is tested once per category and the answer taken by code: ~0.5 ms less per call on
    a rank of 70,000 events than pandas' categorical ``isin``, which a rank's summary calls
    about twenty times."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        allowed = set(allowed)
        hit = np.fromiter((c in allowed for c in values.cat.categories), dtype=bool,
                          count=len(values.cat.categories))
        # code -1 (missing) takes the appended False
        return np.append(hit, False)[values.cat.codes.to_numpy()]
    return values.isin(list(allowed)).to_numpy()


def time_range(events: pd.DataFrame) -> tuple[float, float]:
    """(first start, last end) of ``events`` (:data:`EVENT_COLUMNS`), µs on the trace's clock;
    NaN without events. A profiling window's extent (:attr:`RankTrace.windows`)."""
    if not len(events):
        return float("nan"), float("nan")
    ts = events["ts"].to_numpy()
    return float(ts.min()), float((ts + events["dur"].to_numpy()).max())


def has_step_names(events: pd.DataFrame) -> bool:
    """Whether an event of ``events`` (:data:`EVENT_COLUMNS`) is named ``ProfilerStep...``
    (each distinct name tested once)."""
    return any(type(u) is str and u.startswith("ProfilerStep")
               for u in pd.unique(events["name"])) if len(events) else False


def table_from_columns(columns: Iterable[str], dtypes: Iterable[str], data: Iterable[list]
                       ) -> pd.DataFrame:
    """A DataFrame from column lists as a summary stores them: ``columns`` (names), ``dtypes``
    (pandas dtype names) and ``data`` (one list of JSON values per column, None for a missing
    value). Numeric columns become numpy arrays (an integer column with a missing value becomes
    float64 with NaN), ``object`` columns object Series, other dtypes (``str``) what pandas infers
    from the values."""
    # numeric columns as numpy arrays, not Series: a report of many ranks builds thousands of
    # these tables (object columns stay Series: pandas would read an object array of strings
    # as its string dtype)
    cols = {}
    for c, t, vals in zip(columns, dtypes, data):
        if t == "object":
            cols[c] = pd.Series(vals, dtype=object)
        elif t.startswith(("int", "uint")) and None in vals:
            cols[c] = np.array([np.nan if v is None else v for v in vals], dtype=float)
        elif t.startswith(("float", "int", "uint", "bool")):
            cols[c] = np.array([np.nan if v is None else v for v in vals] if None in vals
                               else vals, dtype=t)
        else:
            cols[c] = pd.Series(vals)
    # the columns are new arrays, in order: no copy, no selection (half the cost of a table)
    return pd.DataFrame(cols, copy=False)


class ColumnTable:
    """A table held as the column lists a summary stores (see :func:`table_from_columns`) until
    it is read as a DataFrame (:meth:`frame`, built once): a report of thousands of ranks reads
    most per-rank tables only to stack them (:func:`stack_by_rank`), which joins the lists of
    every rank and builds one table instead of one per rank."""

    __slots__ = ("columns", "dtypes", "data", "_frame")

    def __init__(self, columns: list, dtypes: list, data: list) -> None:
        self.columns: tuple[str, ...] = tuple(columns)
        self.dtypes: tuple[str, ...] = tuple(dtypes)
        self.data = data
        self._frame: pd.DataFrame | None = None

    def __len__(self) -> int:
        return len(self.data[0]) if self.data else 0

    def frame(self) -> pd.DataFrame:
        """The table as a DataFrame (the same object on every call; without rows, a copy of
        the schema's shared empty table, :func:`empty_table`)."""
        if self._frame is None:
            build = functools.partial(table_from_columns, self.columns, self.dtypes, self.data)
            self._frame = (build() if len(self) else
                           empty_table(("columns", self.columns, self.dtypes), build))
        return self._frame

    def float_column(self, name: str) -> np.ndarray:
        """Column ``name`` as float64 (NaN where missing), without building the table."""
        vals = self.data[self.columns.index(name)]
        return np.array([np.nan if v is None else v for v in vals] if None in vals else vals,
                        dtype=np.float64)

    def __getstate__(self) -> tuple[tuple[str, ...], tuple[str, ...], list]:
        return self.columns, self.dtypes, self.data

    def __setstate__(self, state: tuple[tuple[str, ...], tuple[str, ...], list]) -> None:
        self.columns, self.dtypes, self.data = state
        self._frame = None


def frame_json(df: pd.DataFrame) -> dict:
    """A table as a summary stores it: ``{"columns", "dtypes", "data"}`` (one list of values per
    column; read back with :func:`table_from_json`)."""
    return {"columns": list(df.columns),
            "dtypes": [str(t) for t in df.dtypes],
            "data": [df[c].tolist() for c in df.columns]}


def table_from_json(d: dict) -> ColumnTable:
    """A table stored by :func:`frame_json` as its columns (a DataFrame built when first
    read)."""
    return ColumnTable(d["columns"], d["dtypes"], d["data"])


class Deferred:
    """A field's value not computed yet: ``compute()`` gives it when the field is first read
    (a :class:`StoredTable` field holds it; a summary computed from the events defers each
    quantity, so that an analysis pays only for the quantities it reads)."""

    __slots__ = ("compute",)

    def __init__(self, compute: Callable[[], Any]) -> None:
        self.compute = compute


def _held(obj: object, key: str) -> Any:
    """What ``obj`` holds under ``key``, computed first where it is :class:`Deferred`."""
    v = obj.__dict__[key]
    if type(v) is Deferred:
        v = obj.__dict__[key] = v.compute()
    return v


class HoldsTables:
    """Mixin of a dataclass with :class:`StoredTable` fields."""

    def stored(self, name: str) -> pd.DataFrame | ColumnTable:
        """The table ``name`` as held: a DataFrame, a not yet built :class:`ColumnTable`, or
        None."""
        return _held(self, "_held_" + name)


class StoredTable:
    """A field of a frozen dataclass held in the instance's ``__dict__`` under ``"_held_" +
    name``: a DataFrame field may hold a :class:`ColumnTable` (a summary read from JSON
    (:class:`pardiag.analyzer.per_rank.summary.RankSummary`) holds its tables as their columns
    until one is read, then the DataFrame, built once), and any field may hold a
    :class:`Deferred` value, computed when first read (:meth:`HoldsTables.stored`)."""

    def __init__(self, default: Any = dataclasses.MISSING) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = "_held_" + name

    def __get__(self, obj: object, owner: type | None = None) -> pd.DataFrame:
        if obj is None:
            if self.default is dataclasses.MISSING:
                raise AttributeError(self.key)  # a field without a default
            return self.default
        v = _held(obj, self.key)
        return v.frame() if type(v) is ColumnTable else v

    def __set__(self, obj: object, value: pd.DataFrame | ColumnTable) -> None:
        obj.__dict__[self.key] = value


def float_column(table: pd.DataFrame | ColumnTable, name: str) -> np.ndarray:
    """Column ``name`` of a DataFrame or :class:`ColumnTable` as float64 (NaN where missing)."""
    if isinstance(table, ColumnTable):
        return table.float_column(name)
    return table[name].to_numpy(dtype=np.float64)


#: dtypes whose column built from several ranks' lists joined is the column pandas' concat of
#: the ranks' own columns gives.
_JOINABLE = ("object", "str", "int", "uint", "float", "bool")


def _joined(pairs: list) -> pd.DataFrame | None:
    """:func:`table_from_columns` of every table of ``pairs`` (``(rank, ColumnTable)``) joined,
    when they share one schema that joins exactly (:data:`_JOINABLE`; no ``str`` column of a
    table all missing, which pandas would read as ``object`` there); else None."""
    first = pairs[0][1]
    if not all(type(t) is ColumnTable and t.columns == first.columns and t.dtypes == first.dtypes
               for _, t in pairs) or not all(d.startswith(_JOINABLE) for d in first.dtypes):
        return None
    strs = [i for i, d in enumerate(first.dtypes) if d == "str"]
    if any(all(v is None for v in t.data[i]) for _, t in pairs for i in strs):
        return None
    data = [list(itertools.chain.from_iterable(t.data[i] for _, t in pairs))
            for i in range(len(first.columns))]
    return table_from_columns(first.columns, first.dtypes, data)


def stack_by_rank(tables: Iterable[tuple[int, pd.DataFrame | ColumnTable]]
                  ) -> pd.DataFrame | None:
    """One table of every rank's rows: ``tables`` is ``(rank, DataFrame or ColumnTable)`` pairs
    (rank order kept); the tables without rows are left out and ``rank`` (int64) is set on each
    row — replaced where the tables have that column, appended last where they do not. The same
    table as ``pd.concat([t.assign(rank=r) ...], ignore_index=True)`` without a copy of each
    rank's table; column tables of one schema are joined as lists and built once. None when no
    table has a row."""
    pairs = [(r, t) for r, t in tables if len(t)]
    if not pairs:
        return None
    out = _joined(pairs)
    if out is None:
        out = pd.concat([t.frame() if type(t) is ColumnTable else t for _, t in pairs],
                        ignore_index=True)
    out["rank"] = np.repeat(np.array([int(r) for r, _ in pairs], dtype=np.int64),
                            [len(t) for _, t in pairs])
    return out


#: Tables without rows, one per schema (see :func:`empty_table`).
_EMPTY_TABLES: dict[Hashable, pd.DataFrame] = {}


def empty_table(schema: Hashable, build: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """A table without rows of ``schema`` (any hashable key naming its columns and types),
    ``build()`` called once per schema, then handed out as shallow copies: most ranks of most
    runs have no all-to-all, pipeline chunk or send, and building their empty tables anew was a
    third of loading a small summary. pandas' copy-on-write keeps a change to one copy from
    reaching another."""
    if schema not in _EMPTY_TABLES:
        _EMPTY_TABLES[schema] = build()
    return _EMPTY_TABLES[schema].copy(deep=False)
