"""A monitored run (``pardiag profile --monitor``): every step of every rank, its collectives'
arrivals, and the findings over the whole run — slow steps, stragglers that persist or come and
go, memory creep.

Input: the ranks' monitor files (:func:`pardiag.layout.monitor_path`, written by
:mod:`pardiag.collectors.monitor`), read by :func:`load_monitor`.

* **Arrival delay** (:func:`arrival_delays`, :mod:`.monitor_delays`): per rank and step, the
  largest of its delays at the step's joins, each its issue time less the earliest member's.
* **Stragglers** (:func:`straggler_findings`): a rank's *lateness* in a step is its delay less
  the median of the other ranks' (:func:`lateness`), smoothed by a centred running median of
  :data:`WINDOW_STEPS` steps. A rank is late in a step when that median exceeds
  ``max(STRAGGLER_SIGMA × σ_m, STRAGGLER_STEP_SHARE × median step)``, σ_m the noise of such a
  median (1.4826 × the median absolute deviation of the lateness about it, × 1.2533 /
  √WINDOW_STEPS, the standard error of a median). A period is the steps whose smoothed
  lateness stays above :data:`HYSTERESIS` × that threshold (late steps separated by at most
  :data:`GAP_STEPS` others joined), kept when at least :data:`MIN_STEPS` of them exceed the
  threshold itself; two periods fewer than :data:`WINDOW_STEPS` steps apart are one when their
  median lateness agree within :data:`JOIN_LEVEL_RATIO` (a dip of the noise inside one event),
  two otherwise (a start-up's lateness, then a slow period); a period is cut where its steps
  above the threshold lie more than :data:`WINDOW_STEPS` apart with the steps between not late
  at their level, and reaches at most :data:`WINDOW_STEPS` beyond them (on a loaded machine two
  ranks take turns and a rank's lateness is two-valued: its smoothed median can hover above
  the hysteresis bound between events). Each is a finding, *persistent*
  when it covers at least :data:`PERSISTENT_SHARE` of the rank's steps, else *transient*, with
  its first and last step, the median extra delay and the step time during it against the
  run's baseline (the step time's median and noise taken without the late periods); a costly
  period is found again on the joins and the step time that show it best (:func:`_on_signal`):
  its edges are those of its cost, not of a rank late by nature.
* **Slow steps**: steps whose median wall time over the ranks exceeds the baseline by more than
  ``max(SLOW_SIGMA × σ_step, SLOW_STEP_SHARE × baseline)``, in periods as above (the excess's
  5-step running median above :data:`HYSTERESIS` × that threshold; at least
  :data:`MIN_SLOW_STEPS` steps above the threshold itself). The baseline is the lower
  quartile (:data:`BASELINE_QUANTILE`) of the step time's running median over
  :data:`WINDOW_STEPS` steps and σ_step the steps' robust spread about that running median, so
  a slow period of up to 3/4 of the run moves neither, each with what moved with it
  (the DataLoader's time); slow steps inside a straggler's period are its cost, said with it,
  not a finding of their own; slow steps that end before :data:`WARMUP_STEPS` are the run's
  start-up (a note), and a deep capture's own steps are left out (pardiag slowed them).
* **Memory creep**: :mod:`.monitor_memory`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from pardiag import layout
from pardiag.errors import PardiagError

from .monitor_data import MonitorData
from .monitor_delays import (
    ARRIVALS,
    _robust_sigma,
    arrival_delays,
    join_delays,
    join_lateness,
    lateness,
    matched_signal,
)
from .monitor_memory import memory_findings
from .monitor_run import capture_request, requested_captures

STRAGGLER_SIGMA = 5.0
#: Steps of the centred running median that smooths each rank's lateness.
WINDOW_STEPS = 25
#: A period, once one of its steps stands out, lasts while the smoothed lateness stays above
#: this share of the threshold (a Schmitt trigger: noise about the threshold does not cut it).
HYSTERESIS = 0.5
STRAGGLER_STEP_SHARE = 0.10
SLOW_SIGMA = 6.0
#: The slow steps' baseline: this quantile of the step time's running median
#: (:data:`WINDOW_STEPS`).
BASELINE_QUANTILE = 0.25
SLOW_STEP_SHARE = 0.10
GAP_STEPS = 2
MIN_STEPS = 10
#: Two late periods of a rank closer than :data:`WINDOW_STEPS` are one (cut by a dip of the
#: noise) when the lower one's median lateness is at least this share of the higher one's.
JOIN_LEVEL_RATIO = 0.5
MIN_SLOW_STEPS = 3
#: The run's first steps build caches, buckets and connections: slow steps that end before
#: this step are its start-up, said in a note, not a finding.
WARMUP_STEPS = 10
PERSISTENT_SHARE = 0.9
#: Steps of the centred running median of a rank's late-period signal (:func:`_on_signal`).
SIGNAL_STEPS = 9


def is_monitored(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds monitor files (``pardiag/rank*.monitor.jsonl``)."""
    return any(layout.sidecar_dir(Path(run_dir)).glob("rank*.monitor.jsonl"))


#: The schema every monitor record names first (a cut last line starts with it).
_SCHEMA_VALUE = b'"pardiag.monitor/1"'


def _read_lines(path: Path, notes: list[str]) -> list[dict]:
    import orjson

    out = []
    try:
        raw = path.read_bytes().split(b"\n")
    except OSError as exc:
        raise PardiagError(f"{path}: cannot read ({exc.strerror})") from None
    for i, line in enumerate(raw):
        if not line.strip():
            continue
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            # the last line, cut when the rank was killed: the start of a record (an object
            # whose first key, once there, is the schema)
            torn = line.lstrip()
            if i >= len(raw) - 2 and torn.startswith(b"{") and (
                    len(torn) < 2 * len(_SCHEMA_VALUE)
                    or _SCHEMA_VALUE in torn[:3 * len(_SCHEMA_VALUE)]):
                notes.append(f"{path.name}: its last line is incomplete (the rank was stopped "
                             f"while writing it) and is left out")
                continue
            raise PardiagError(f"{path}: line {i + 1} is not JSON") from None
        if not isinstance(doc, dict) or doc.get("schema") != "pardiag.monitor/1":
            raise PardiagError(f"{path}: line {i + 1} is not a pardiag monitor record")
        out.append(doc)
    return out


#: The columns of :attr:`MonitorData.steps`.
STEP_COLUMNS = ("rank", "step", "end_us", "dur_us", "optimizer_us", "data_us", "arrive_us",
                "arrive_first_us", "arrive_last_us")


#: A line's step keys, as written (:mod:`pardiag.collectors.monitor`).
_RAW_STEP_KEYS = ("index", "end_us", "dur_us", "optimizer_us", "data_us", *ARRIVALS)
#: The float step columns (epoch µs or µs).
_FLOAT_STEP_COLUMNS = STEP_COLUMNS[2:]


class _StepBlocks:
    """The step columns of every file, filled file by file into one float block and one int
    block (rank, step) allocated once for the estimated steps (grown when short): a large job
    holds 10⁷ rows, and every copy of them costs seconds of fresh memory."""

    def __init__(self, capacity: int) -> None:
        self.f = np.empty((len(_FLOAT_STEP_COLUMNS), capacity))
        self.i = np.empty((2, capacity), dtype=np.int64)
        self.n = 0

    def add(self, raw: dict[str, list], base: np.ndarray, rank: int) -> None:
        """One file's lines' values (``raw``, :data:`_RAW_STEP_KEYS`) with each value's line's
        ``base`` (epoch µs). Raises ValueError or TypeError on a value that is no number."""
        m = len(base)
        if self.n + m > self.f.shape[1]:
            cap = max(self.n + m, int(self.f.shape[1] * 1.5))
            f, i = np.empty((self.f.shape[0], cap)), np.empty((2, cap), dtype=np.int64)
            f[:, :self.n], i[:, :self.n] = self.f[:, :self.n], self.i[:, :self.n]
            self.f, self.i = f, i
        sl = slice(self.n, self.n + m)
        self.i[0, sl] = rank
        self.i[1, sl] = raw["index"]
        for j, k in enumerate(_FLOAT_STEP_COLUMNS):
            row = self.f[j, sl]
            row[:] = raw[k]
            if k == "end_us":
                row += base
            elif k in ARRIVALS:   # -1: none
                row[row < 0] = np.nan
                row += base
        self.n += m

    def frame(self) -> pd.DataFrame:
        """The steps table (:data:`STEP_COLUMNS`), viewing the blocks."""
        ints = pd.DataFrame(self.i[:, :self.n].T, columns=["rank", "step"], copy=False)
        floats = pd.DataFrame(self.f[:, :self.n].T, columns=list(_FLOAT_STEP_COLUMNS),
                              copy=False)
        return pd.concat([ints, floats], axis=1)


def _bad_record(raw: dict[str, list], counts: list[int]) -> int:
    """The 1-based record of a file whose step values (``raw``, its lines' ``counts`` values
    each) hold one that is not a number."""
    ends = np.cumsum(counts)
    for i, (lo, hi) in enumerate(zip(ends - counts, ends), start=1):
        try:
            for v in raw.values():
                np.asarray(v[lo:hi], dtype=float)
        except (TypeError, ValueError):
            return i
    return 0


def _arrivals(st: dict, n: int, base: float) -> dict[str, np.ndarray]:
    """A line's arrival summaries (:data:`ARRIVALS`) as epoch µs, NaN where -1 or absent."""
    out = {}
    for k in ARRIVALS:
        a = np.asarray(st.get(k) or [-1] * n, dtype=float)
        out[k] = np.where(a >= 0, a + base, np.nan)
    return out


def line_frames(doc: dict) -> tuple[pd.DataFrame, pd.DataFrame | None, dict | None, int]:
    """One line of a monitor file as ``(steps, calls or None, memory row or None, dropped
    calls)``, the columns of :class:`MonitorData`'s tables, times in epoch µs."""
    rank, base = int(doc["rank"]), doc["base_ns"] / 1000.0
    st = doc["steps"]
    steps = pd.DataFrame({
        "rank": rank, "step": st["index"], "end_us": np.add(st["end_us"], base),
        "dur_us": st["dur_us"], "optimizer_us": st["optimizer_us"], "data_us": st["data_us"],
        **_arrivals(st, len(st["index"]), base)})
    return steps, _calls_frame(doc), _memory_row(doc), int(doc.get("dropped_calls") or 0)


def _calls_frame(doc: dict) -> pd.DataFrame | None:
    """A monitor line's calls (:attr:`MonitorData.calls`' columns, epoch µs), None without."""
    ca = doc["calls"]
    if not ca["step"]:
        return None
    rank, base, ops = int(doc["rank"]), doc["base_ns"] / 1000.0, doc["ops"]
    done = np.asarray(ca["done_us"], dtype=float)
    return pd.DataFrame({
        "rank": rank, "step": ca["step"], "group": ca["group"],
        "op": [ops[o] for o in ca["op"]], "bytes": ca["bytes"],
        "issue_us": np.add(ca["issue_us"], base), "return_us": np.add(ca["return_us"], base),
        "done_us": np.where(done >= 0, done + base, np.nan)})


def _memory_row(doc: dict) -> dict | None:
    """A monitor line's memory sample (:attr:`MonitorData.memory`' columns) at its last step,
    None for a line without steps."""
    index = doc["steps"]["index"]
    mem = doc.get("memory") or {}
    return ({"rank": int(doc["rank"]), "step": index[-1], "rss_bytes": mem.get("rss_bytes"),
             "device_bytes": mem.get("device_bytes")} if index else None)


def load_monitor(run_dir: Path) -> MonitorData:
    """Read every rank's monitor file in ``run_dir``.

    Raises:
        PardiagError: no monitor file, or a file that is not one (one line naming it).
    """
    run_dir = Path(run_dir)
    files = sorted(layout.sidecar_dir(run_dir).glob("rank*.monitor.jsonl"))
    if not files:
        raise PardiagError(f"{run_dir}: no monitor records (pardiag/rank*.monitor.jsonl)")
    notes: list[str] = []
    # columns gathered per file as Python lists, then written into blocks allocated once: a
    # large job has hundreds of thousands of lines, and an array per line and column, then
    # joining them, cost more than the rest
    blocks: _StepBlocks | None = None
    calls, memory = [], []
    for path in files:
        dropped = 0
        own = int(path.name[4:].split(".")[0])
        raw: dict[str, list] = {k: [] for k in _RAW_STEP_KEYS}
        bases: list[float] = []
        counts: list[int] = []
        for i, doc in enumerate(_read_lines(path, notes), start=1):
            try:
                rank, base = int(doc["rank"]), doc["base_ns"] / 1000.0
                st = doc["steps"]
                n = len(st["index"])
                for k in _RAW_STEP_KEYS:   # an arrival absent from older lines: -1, none
                    v = (st.get(k) or [-1] * n) if k in ARRIVALS else st[k]
                    if len(v) != n:
                        raise ValueError("its step columns differ in length")
                    raw[k].extend(v)
                ca = _calls_frame(doc)
                row = _memory_row(doc)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise PardiagError(f"{path}: record {i} is not a valid monitor record "
                                   f"({type(exc).__name__}: {exc})") from None
            if rank != own:
                raise PardiagError(f"{path}: record {i} is rank {rank}'s, in rank {own}'s file")
            bases.append(base)
            counts.append(n)
            if ca is not None:
                calls.append(ca)
            if row is not None:
                memory.append(row)
            dropped += int(doc.get("dropped_calls") or 0)
        total = int(np.sum(counts))
        if blocks is None and total:   # the first steps read, as many per file, and a margin
            blocks = _StepBlocks(int(total * len(files) * 1.25) + 1024)
        try:
            if blocks is not None:
                blocks.add(raw, np.repeat(np.asarray(bases, dtype=float), counts), own)
        except (TypeError, ValueError) as exc:   # the record is found only now, rarely
            raise PardiagError(f"{path}: record {_bad_record(raw, counts)} is not a valid "
                               f"monitor record ({type(exc).__name__}: {exc})") from None
        if dropped:
            notes.append(f"{path.name}: {dropped} calls over the buffer's limit were counted, "
                         f"not kept")
    steps = blocks.frame() if blocks is not None else pd.DataFrame(columns=list(STEP_COLUMNS))
    world = _world_size(run_dir, notes)
    have = {int(p.name[4:].split(".")[0]) for p in files if p.stat().st_size}
    lost = sorted(set(range(world)) - have) if world else []
    if lost and len(lost) == world:
        notes.append(f"no rank of the run's {world} wrote a monitor line (one per "
                     f"--monitor-every steps): the run stopped before its first")
    elif lost:
        notes.append(f"rank(s) {', '.join(map(str, lost))} of the run's {world} wrote no monitor "
                     f"records: the findings are about the others only")
    hosts = {}
    for r in {int(p.name[4:].split(".")[0]) for p in files}:
        meta_path = layout.rank_meta_path(run_dir, r)
        try:
            meta = layout.decode_sidecar(meta_path.read_bytes(), "rank")
            hosts[r] = str(meta.host)
        except FileNotFoundError:   # a killed rank wrote no metadata: its host is unknown
            continue
        except (OSError, ValueError) as exc:
            notes.append(f"{meta_path.name} is unreadable ({str(exc).splitlines()[0]}): rank "
                         f"{r}'s host is not known")
    call_cols = ["rank", "step", "group", "op", "bytes", "issue_us", "return_us", "done_us"]
    return MonitorData(
        steps=steps,
        calls=(pd.concat(calls, ignore_index=True) if calls
               else pd.DataFrame(columns=call_cols)),
        memory=pd.DataFrame(memory, columns=["rank", "step", "rss_bytes", "device_bytes"]),
        hosts=hosts, notes=notes, captures=requested_captures(capture_request(run_dir)))


def _world_size(run_dir: Path, notes: list[str]) -> int | None:
    """The run's world size from its run file (None: no readable run file, said in ``notes``)."""
    path = layout.run_file_path(run_dir)
    try:
        run = layout.decode_sidecar(path.read_bytes(), "run")
    except FileNotFoundError:
        # the launcher writes it when the job ends: a run still going has none yet
        try:
            age = time.time() - max(p.stat().st_mtime for p in
                                    layout.sidecar_dir(run_dir).glob("rank*.monitor.jsonl"))
            when = f" (its records were last written {age:.0f} s ago)"
        except (OSError, ValueError):
            when = ""
        notes.append(f"{path.name} is missing: the run is still going, or its launcher was "
                     f"stopped before the job ended{when}; the run's world size is not known, "
                     f"so a rank that wrote no records cannot be told")
        return None
    except (OSError, ValueError) as exc:
        notes.append(f"{path.name} is unreadable ({str(exc).splitlines()[0]}): the run's world "
                     f"size is not known, so a rank that wrote no records cannot be told")
        return None
    return int(run.world_size) if run.world_size else None


def _periods(flags: np.ndarray, steps: np.ndarray, gap: int, min_len: int) -> list[tuple]:
    """``[(first step, last step, flagged steps)]`` of runs of flagged steps joined across at
    most ``gap`` unflagged ones, of at least ``min_len`` flagged steps."""
    out: list[tuple] = []
    start = last = -1
    n = 0
    for flag, s in zip(flags, steps):
        if not flag:
            continue
        if n and s - last <= gap + 1:
            last, n = int(s), n + 1
            continue
        if n >= min_len:
            out.append((start, last, n))
        start, last, n = int(s), int(s), 1
    if n >= min_len:
        out.append((start, last, n))
    return out


def _edge(x: np.ndarray, lo: int, hi: int, level: float, rising: bool) -> int:
    """The change point of a mean shift by ``level`` × 2 inside positions ``lo``..``hi`` of
    ``x`` (the classical CUSUM estimate, Page 1954): a rise starts where the sum of
    ``x - level`` from there to ``hi`` is largest; a fall ends where the sum from ``lo`` to
    there is largest. Missing values count as ``level`` (no evidence either way)."""
    y = np.nan_to_num(x[lo:hi + 1] - level, nan=0.0)
    if rising:
        return lo + int(np.argmax(np.cumsum(y[::-1])[::-1]))
    return lo + int(np.argmax(np.cumsum(y)))


def same_level(lx: float, ly: float) -> bool:
    """Whether two late periods' median lateness (any one unit) agree within
    :data:`JOIN_LEVEL_RATIO`:
    a dip of the noise cuts one event into parts at one level; a start-up's lateness and a slow
    period a few steps later are two events at two levels."""
    return min(lx, ly) >= JOIN_LEVEL_RATIO * max(lx, ly)


def _edges(x: np.ndarray, a: int, b: int, lo: int, hi: int) -> tuple[int, int]:
    """The first and last position of the period ``a..b`` of ``x`` moved to its change points
    (:func:`_edge`, a shift by the period's median), each sought within :data:`WINDOW_STEPS` of
    the old one and inside ``lo..hi`` (between the neighbouring periods, never inside one)."""
    level = 0.5 * float(np.nanmedian(x[a:b + 1]))
    first = _edge(x, max(lo, a - WINDOW_STEPS), min(b, a + WINDOW_STEPS), level, True)
    return first, _edge(x, max(first, b - WINDOW_STEPS), min(hi, b + WINDOW_STEPS), level, False)


def _late_periods(x: np.ndarray, m: np.ndarray, thr: float) -> list[tuple[int, int]]:
    """Positions ``(first, last)`` of one rank's late periods (see the module): hysteresis on
    the smoothed lateness ``m``, periods closer than :data:`WINDOW_STEPS` joined (a dip of the
    noise inside one), edges moved to the raw lateness ``x``'s change points.

    Where the noise's own smoothed median hovers above the hysteresis bound (two ranks taking
    turns on a loaded machine: a rank's lateness two-valued), the bound alone would join
    events far apart and put an edge far from its event: a period is cut where its steps above
    ``thr`` itself lie more than :data:`WINDOW_STEPS` apart and the steps between are not
    late at their level (:func:`same_level`), and reaches at most :data:`WINDOW_STEPS` beyond
    its first and last step above ``thr``."""
    pos = np.arange(len(x))
    high = np.isfinite(m) & (m > thr)
    low = np.isfinite(m) & (m > HYSTERESIS * thr)
    found = [(a, b) for a, b, _ in _periods(low, pos, GAP_STEPS, MIN_STEPS)
             if int(high[a:b + 1].sum()) >= MIN_STEPS]   # it stood out of the noise
    merged: list[tuple[int, int]] = []
    for a, b in found:
        if merged and a - merged[-1][1] <= WINDOW_STEPS and same_level(
                float(np.nanmedian(x[merged[-1][0]:merged[-1][1] + 1])),
                float(np.nanmedian(x[a:b + 1]))):
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    pieces = [p for a, b in merged for p in _cut_at_noise(x, high, a, b)]
    out: list[tuple[int, int]] = []
    for i, (a, b) in enumerate(pieces):
        out.append(_edges(x, a, b, out[-1][1] + 1 if out else 0,
                          pieces[i + 1][0] - 1 if i + 1 < len(pieces) else len(x) - 1))
    return out


def _cut_at_noise(x: np.ndarray, high: np.ndarray, a: int, b: int) -> list[tuple[int, int]]:
    """The period ``a..b`` cut where its steps above the threshold (``high``) lie more than
    :data:`WINDOW_STEPS` apart and the lateness ``x`` between is not at their level, each part
    kept with :data:`MIN_STEPS` such steps and reaching at most :data:`WINDOW_STEPS` beyond
    its first and last of them (see :func:`_late_periods`)."""
    idx = a + np.flatnonzero(high[a:b + 1])
    groups = [[int(idx[0]), int(idx[0]), 1]]
    for k in idx[1:]:
        g = groups[-1]
        if k - g[1] > WINDOW_STEPS + 1 and not same_level(
                float(np.nanmedian(x[g[1] + 1:k])), float(np.nanmedian(x[g[0]:k + 1]))):
            groups.append([int(k), int(k), 1])
        else:
            g[1], g[2] = int(k), g[2] + 1
    # each part's reach stops half-way to the next part's steps above the threshold
    bounds = [a, *[(g[1] + h[0]) // 2 for g, h in zip(groups, groups[1:])], b]
    return [(max(bounds[i] + (i > 0), c0 - WINDOW_STEPS), min(bounds[i + 1], c1 + WINDOW_STEPS))
            for i, (c0, c1, n) in enumerate(groups) if n >= MIN_STEPS]


def _on_signal(cand: list[tuple], late: pd.DataFrame, excess: np.ndarray,
               joins: pd.DataFrame | None, cols: np.ndarray, costly) -> list[tuple]:
    """``cand`` (``(rank, first, last, persistent)`` positions, by rank) with each
    rank's costly transient periods (``costly(first, last)``) found again on its
    :func:`_cost_signal` (in units of their shift): a period is where that signal's running
    median over :data:`SIGNAL_STEPS` steps stays above :data:`HYSTERESIS` × half the shift,
    with at least :data:`MIN_STEPS` steps above half of it; pieces fewer than
    :data:`WINDOW_STEPS` steps apart are one when the steps between stay above that lower
    bound or one first-pass period holds both; it is kept where it overlaps a costly period,
    its edges are the signal's change points (:func:`_edge`, sought within
    :data:`WINDOW_STEPS` of its first and last step above half) less the end steps that cost
    nothing (:func:`_costly_part`), and with fewer than :data:`MIN_STEPS` steps left it is
    none. The rank's other periods stay as they were, unless a new one covers them."""
    out: list[tuple] = []
    for r in dict.fromkeys(c[0] for c in cand):
        mine = [c for c in cand if c[0] == r]
        seeds = [(a, b) for _, a, b, persistent in mine if not persistent and costly(a, b)]
        sig = _cost_signal(late.loc[r].to_numpy(dtype=float), excess, mine, seeds, joins, r,
                           cols) if seeds else None
        if sig is None:
            out += mine
            continue
        y, cost, outside = sig
        spread = _robust_sigma(cost[outside]) if np.isfinite(cost[outside]).any() else np.inf
        found = [_costly_part(cost, a, b, spread) for a, b in _signal_periods(y, seeds)]
        keep = [c for c in mine if not any(c[1] <= b and a <= c[2] for a, b in found)]
        # a period whose costly steps are fewer than a period's least is none
        out += sorted(keep + [(r, a, b, False) for a, b in found if b - a + 1 >= MIN_STEPS],
                      key=lambda c: c[1])
    return out


def _costly_part(cost: np.ndarray, a: int, b: int, spread: float) -> tuple[int, int]:
    """Positions ``a..b`` of a late period less its first and last steps that cost the run
    nothing: where the step time's excess (``cost``, in units of the period's; ``spread``: its
    noise) changes within each half (:func:`_edge`), cut when the steps left out stay under
    half the period's excess by more than :data:`STRAGGLER_SIGMA` × their median's noise (a
    rank late by nature for a while next to its costly period, while the others were as much
    slower: its lateness alone is no cost, and on a loaded machine the step time is too noisy
    to cut on)."""
    mid = a + (b - a) // 2
    if not np.isfinite(cost[a:b + 1]).any():
        return a, b

    def free(lo: int, hi: int) -> bool:
        n = hi - lo + 1
        return n > 0 and float(np.nanmedian(cost[lo:hi + 1])) < 0.5 - (
            STRAGGLER_SIGMA * spread * 1.2533 / np.sqrt(n))

    first = _edge(cost, a, mid, 0.5, True)
    a = first if first > a and free(a, first - 1) else a
    last = _edge(cost, mid, b, 0.5, False)
    return a, last if last < b and free(last + 1, b) else b


def _cost_signal(x: np.ndarray, excess: np.ndarray, mine: list[tuple],
                 seeds: list[tuple[int, int]], joins: pd.DataFrame | None, r: int,
                 cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The series on which rank ``r``'s costly late periods (``seeds``, positions) are found
    again (``x``: its lateness; ``excess``: the step time less the baseline, µs per step):
    :func:`~.monitor_delays.matched_signal` of its lateness at each join (``joins``, the run's
    :func:`~.monitor_delays.join_delays`; ``x`` alone without them) and of the excess's 5-step
    running median (a lone outlier step, the run's first above all, keeps an edge sharp
    instead of pulling it to itself), against the seeds' middle halves and the steps outside
    the rank's late periods (``mine``); None when no channel shows the seeds."""
    chans = (join_lateness(joins, r, pd.Index(cols)) if joins is not None and len(joins)
             else np.empty((0, len(x))))
    if not len(chans):
        chans = x[None, :]
    ex = pd.Series(excess).rolling(5, center=True, min_periods=1).median().to_numpy()
    inside = np.zeros(len(x), bool)
    for a, b in seeds:
        q = (b - a) // 4
        inside[a + q:b - q + 1] = True
    outside = np.ones(len(x), bool)
    for _, a, b, _ in mine:
        outside[a:b + 1] = False
    y = matched_signal(np.vstack([chans, ex[None, :]]), inside, outside)
    if not np.isfinite(y[inside]).any():
        return None
    return y, matched_signal(ex[None, :], inside, outside), outside


def _signal_periods(y: np.ndarray, seeds: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Positions ``(first, last)`` of the periods of ``y`` (in units of their shift) that
    overlap ``seeds`` (see :func:`_on_signal`)."""
    ys = pd.Series(y).rolling(SIGNAL_STEPS, center=True,
                              min_periods=SIGNAL_STEPS // 2 + 1).median().to_numpy()
    high = np.isfinite(ys) & (ys > 0.5)
    low = np.isfinite(ys) & (ys > HYSTERESIS * 0.5)
    joined: list[tuple[int, int]] = []
    for a, b, _ in _periods(low, np.arange(len(y)), GAP_STEPS, MIN_STEPS):
        if int(high[a:b + 1].sum()) < MIN_STEPS:
            continue
        idx = a + np.flatnonzero(high[a:b + 1])   # the edges are sought about these
        a, b = int(idx[0]), int(idx[-1])
        if joined and a - joined[-1][1] <= WINDOW_STEPS and (
                float(np.nanmedian(y[joined[-1][1] + 1:a])) > HYSTERESIS * 0.5
                or any(sa <= joined[-1][0] and b <= sb for sa, sb in seeds)):
            joined[-1] = (joined[-1][0], b)
        else:
            joined.append((a, b))
    joined = [(a, b) for a, b in joined if any(a <= sb and sa <= b for sa, sb in seeds)]
    out: list[tuple[int, int]] = []
    for i, (a, b) in enumerate(joined):
        lo = out[-1][1] + 1 if out else 0
        hi = joined[i + 1][0] - 1 if i + 1 < len(joined) else len(y) - 1
        first = _edge(y, max(lo, a - WINDOW_STEPS), min(b, a + WINDOW_STEPS), 0.5, True)
        out.append((first, _edge(y, max(first, b - WINDOW_STEPS), min(hi, b + WINDOW_STEPS),
                                 0.5, False)))
    return out


def _persistent(x: np.ndarray, m: np.ndarray, periods: list[tuple[int, int]],
                thr: float) -> bool:
    """Whether a rank with lateness ``x`` (smoothed: ``m``) and late ``periods`` is late in
    nearly every step (:data:`PERSISTENT_SHARE` of its steps with a lateness): its periods
    cover them, or its smoothed lateness stays above the hysteresis bound in them (dips where
    the noise's regimes cut the periods) and its lateness outside its periods exceeds ``thr``
    itself (not a rank whose lateness stays in the band: two ranks taking turns)."""
    ok = np.isfinite(x)
    need = PERSISTENT_SHARE * int(ok.sum())
    if sum(b - a + 1 for a, b in periods) >= need:
        return True
    if int((np.isfinite(m) & (m > HYSTERESIS * thr)).sum()) < need:
        return False
    outside = ok.copy()
    for a, b in periods:
        outside[a:b + 1] = False
    return bool(outside.any()) and float(np.median(x[outside])) > thr


def _quiet_steps(n: int, cand: list[tuple[int, int, int, bool]]) -> tuple[np.ndarray, bool]:
    """The steps (of ``n`` positions) the run's baseline step time is taken over, and whether
    that is every step: the steps outside every late period of ``cand`` (``(rank, first,
    last, persistent)``); a persistent straggler's steps stay in when fewer than
    :data:`WINDOW_STEPS` others remain (late in nearly every step, its cost is its lateness,
    the other ranks' wait); every step when none is left."""
    quiet = np.ones(n, bool)
    for _, a, b, persistent in cand:
        if not persistent:
            quiet[a:b + 1] = False
    without = quiet.copy()
    for _, a, b, persistent in cand:
        if persistent:
            without[a:b + 1] = False
    over_run = int(without.sum()) < WINDOW_STEPS
    if not over_run:
        quiet = without
    if not quiet.any():
        quiet[:] = True
    return quiet, over_run


def straggler_findings(delays: pd.DataFrame, steps: pd.DataFrame,
                       notes: list[str] | None = None,
                       joins: pd.DataFrame | None = None,
                       captures: list[tuple[int, int]] | None = None) -> list[dict]:
    """Stragglers over the run (see the module): ``[{"kind": "straggler", "rank",
    "first_step", "last_step", "steps", "persistent", "extra_delay_ms", "step_ms",
    "baseline_step_ms", "baseline_over_run", "threshold_ms"}]`` (ms; ``steps``: the steps
    judged from the first to the last; ``baseline_over_run``: the baseline is every step's
    median, a persistent straggler's that leaves fewer than :data:`WINDOW_STEPS` others). A
    late period whose steps were not slower than the others' by :data:`STRAGGLER_STEP_SHARE`
    and by :data:`STRAGGLER_SIGMA` × the noise of their median is no finding: the other ranks
    waited, the run lost no time; it is said in ``notes`` when given. ``delays``:
    :func:`arrival_delays` (ranks × steps, µs); ``steps``: :attr:`MonitorData.steps`; ``joins``:
    :func:`~.monitor_delays.join_delays`, on which a costly period is found again
    (:func:`_on_signal`; without it, on the largest delay per step). The deep captures' own
    steps (:func:`capture_steps` of ``captures``) are left out, as for slow steps: the
    profiler and the trace's writing slow the ranks unequally there; a period around one goes
    on across it."""
    if delays.empty or len(delays) < 2:
        return []
    step_ms = steps.groupby("step")["dur_us"].median()
    # calls issued after the last recorded step (a barrier at exit) belong to no step
    delays = delays.loc[:, delays.columns.isin(step_ms.index)
                        & ~delays.columns.isin(capture_steps(captures or []))]
    if delays.shape[1] == 0:
        return []
    late = lateness(delays)
    smooth = late.T.rolling(WINDOW_STEPS, center=True, min_periods=WINDOW_STEPS // 2 + 1
                            ).median().T
    resid = (late - smooth).to_numpy(dtype=float).ravel()
    # the noise of a median of WINDOW_STEPS values: sigma * 1.2533 / sqrt(n) (normal errors)
    noise = _robust_sigma(resid) * 1.2533 / np.sqrt(WINDOW_STEPS)
    thr = max(STRAGGLER_SIGMA * noise, STRAGGLER_STEP_SHARE * float(step_ms.median()))
    cols = delays.columns.to_numpy()
    cand: list[tuple[int, int, int, bool]] = []
    for r in delays.index:
        x = late.loc[r].to_numpy(dtype=float)
        ok = np.isfinite(x)
        if not ok.any():
            continue
        m = smooth.loc[r].to_numpy(dtype=float)
        periods = _late_periods(x, m, thr)
        if _persistent(x, m, periods, thr):
            # from its first late period's start to its last one's end (a rank late from
            # step 100 to the end of a 1,200-step run is late since step 100, not over the
            # run); over every step with a lateness when no period stands out
            idx = np.flatnonzero(ok)
            a, b = ((periods[0][0], periods[-1][1]) if periods
                    else (int(idx[0]), int(idx[-1])))
            cand.append((int(r), a, b, True))
        else:
            cand += [(int(r), a, b, False) for a, b in periods]
    dur = step_ms.reindex(cols).to_numpy(dtype=float)
    quiet, over_run = _quiet_steps(len(cols), cand)
    # the step time's median and noise without the late periods (two of them would widen it)
    base, sigma_dur = float(np.nanmedian(dur[quiet])), _robust_sigma(dur[quiet])

    def bound(a: int, b: int) -> float:
        """How much the median of steps a..b must exceed the run's median step (µs) to be a
        cost: its share of the step, and its noise (a median of b - a + 1 steps)."""
        return max(STRAGGLER_STEP_SHARE * base,
                   STRAGGLER_SIGMA * sigma_dur * 1.2533 / np.sqrt(b - a + 1))

    def costs(a: int, b: int, during: float) -> bool:
        return during - base > bound(a, b)

    # a costly period's edges, and whether two pieces are one, on the rank's signal that shows
    # its periods best (a rank late by nature for a while around one, the noise's regimes,
    # moves the lateness's edges and cuts it where it is early by nature, not the step time's
    # or its least noisy joins')
    cand = _on_signal(cand, late, dur - base, joins, cols,
                      lambda a, b: costs(a, b, float(np.nanmedian(dur[a:b + 1]))))
    out: list[dict] = []
    for r, a, b, persistent in cand:
        during = float(np.nanmedian(dur[a:b + 1]))
        extra = float(np.nanmedian(late.loc[r].to_numpy(dtype=float)[a:b + 1]))
        f = {"kind": "straggler", "rank": r, "first_step": int(cols[a]),
             "last_step": int(cols[b]), "steps": b - a + 1, "persistent": persistent,
             "extra_delay_ms": round(extra / 1e3, 3), "step_ms": round(during / 1e3, 3),
             "baseline_step_ms": round(base / 1e3, 3),
             "baseline_over_run": bool(persistent and over_run),
             "threshold_ms": round(thr / 1e3, 3)}
        if persistent or costs(a, b, during):
            out.append(f)
        elif notes is not None:
            notes.append(_not_named(f, during - base, bound(a, b)))
    return sorted(out, key=lambda f: (f["first_step"], f["rank"]))


def _not_named(f: dict, excess_us: float, bound_us: float) -> str:
    """The note of a late period whose steps cost the run nothing beyond the noise (``f``: its
    finding; ``excess_us``: its steps' median less the run's; ``bound_us``: the noise bound)."""
    slower = ("the others waited without the run losing time" if excess_us <= 0 else
              f"their extra {excess_us / 1e3:.1f} ms is inside the step time's "
              f"noise over {f['steps']} steps (±{bound_us / 1e3:.1f} ms)")
    return (f"rank {f['rank']} arrived {f['extra_delay_ms']:.1f} ms after the others in "
            f"steps {f['first_step']}–{f['last_step']}, but those steps took "
            f"{f['step_ms']:.1f} ms against {f['baseline_step_ms']:.1f} ms: "
            f"{slower}, so it is not named a straggler")


def capture_steps(captures: list[tuple[int, int]]) -> set[int]:
    """The steps a deep capture slowed itself (``captures``: (first, last) of each): its own,
    where the profiler records, and the one after its last, which writes the trace."""
    return {s for a, b in captures for s in range(a, b + 2)}


def slow_step_findings(steps: pd.DataFrame, stragglers: list[dict],
                       delays: pd.DataFrame | None = None,
                       captures: list[tuple[int, int]] | None = None) -> list[dict]:
    """Periods of slow steps on every rank (see the module): ``[{"kind": "slow_steps",
    "first_step", "last_step", "steps", "step_ms", "baseline_step_ms", "data_ms",
    "baseline_data_ms", "straggler_rank", "arrivals_known", "ranks"}]`` (``straggler_rank``: a
    straggler's period it overlaps, else None; ``arrivals_known``: the ranks' arrival delays
    (:func:`arrival_delays`, ``delays``) cover at least half the period's steps, so that no
    straggler there means no rank was late; ``ranks``: the ranks that recorded steps). The
    deep captures' own steps (:func:`capture_steps` of ``captures``, (first, last) each) are
    left out: pardiag slowed them; a period around one goes on across it."""
    if steps.empty:
        return []
    ranks = int(steps["rank"].nunique())
    per = steps.groupby("step")[["dur_us", "data_us"]].median()
    per = per[~per.index.isin(capture_steps(captures or []))]
    if per.empty:
        return []
    x = per["dur_us"].to_numpy(dtype=float)
    # The baseline is the lower quartile of the step time's running median, its noise the
    # steps' spread about that running median: a slow period of up to 3/4 of the run moves
    # neither (the run's median and spread did, once half the steps were slow).
    smooth = pd.Series(x).rolling(WINDOW_STEPS, center=True, min_periods=1).median().to_numpy()
    base = float(np.quantile(smooth, BASELINE_QUANTILE))
    thr = max(SLOW_SIGMA * _robust_sigma(x - smooth), SLOW_STEP_SHARE * base)
    idx = per.index.to_numpy()
    out = []
    # a Schmitt trigger, as for stragglers: a period lasts while the excess's 5-step running
    # median stays above HYSTERESIS × the threshold (a slow step dipping under it on a loaded
    # machine does not cut the period), kept when MIN_SLOW_STEPS steps exceed the threshold
    high = x - base > thr
    low = high | (pd.Series(x - base).rolling(5, center=True, min_periods=1).median()
                  .to_numpy() > HYSTERESIS * thr)
    # gaps counted in steps judged: a capture's steps left out do not cut a period
    for a, b, n in _periods(low, np.arange(len(idx)), GAP_STEPS, 1):
        first, last = int(idx[a]), int(idx[b])
        if int(high[a:b + 1].sum()) < MIN_SLOW_STEPS:
            continue
        span = per.loc[first:last]
        who = [f["rank"] for f in stragglers
               if f["first_step"] <= last and f["last_step"] >= first]
        seen = (0 if delays is None or delays.empty else
                int(delays.loc[:, (delays.columns >= first) & (delays.columns <= last)]
                    .notna().any(axis=0).sum()))
        out.append({"kind": "slow_steps", "first_step": first, "last_step": last,
                    "steps": int(n), "step_ms": round(float(span["dur_us"].median()) / 1e3, 3),
                    "baseline_step_ms": round(base / 1e3, 3),
                    "data_ms": round(float(span["data_us"].median()) / 1e3, 3),
                    "baseline_data_ms": round(float(per["data_us"].median()) / 1e3, 3),
                    "straggler_rank": who[0] if who else None,
                    "arrivals_known": 2 * seen >= n, "ranks": ranks})
    return out


def findings(data: MonitorData, notes: list[str] | None = None) -> list[dict]:
    """Every finding of the run, stragglers first (see the module); what was measured and not
    named goes to ``notes`` when given."""
    delays = arrival_delays(data)
    strag = straggler_findings(delays, data.steps, notes, join_delays(data), data.captures)
    # slow steps inside a straggler's period are its cost, said with it
    slow = [f for f in slow_step_findings(data.steps, strag, delays, data.captures)
            if f["straggler_rank"] is None]
    for f in [f for f in slow if f["last_step"] < WARMUP_STEPS]:   # steps count from 0
        slow.remove(f)
        if notes is not None:
            notes.append(f"steps {f['first_step']}–{f['last_step']}, the run's start-up, took "
                         f"{f['step_ms']:.1f} ms against {f['baseline_step_ms']:.1f} ms (the "
                         f"first steps build caches, buckets and connections): not a finding")
    return strag + slow + memory_findings(data.memory, data.captures)
