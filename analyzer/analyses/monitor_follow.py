"""Findings while a monitored run goes on: the launcher of ``pardiag profile --monitor`` follows
the ranks' monitor files as they grow (:class:`Follower`) and says each new finding once, and
a finding may ask every rank for a deep capture (:func:`request_capture`).

Only the last :data:`HORIZON` steps are kept and judged (memory bounded over any run); the steps
every rank has written are judged (a rank's lines come every ``--monitor-every`` steps, not all
at once). A finding is new unless one of its kind and rank was said before that overlaps it
(its edges move while it goes on; not one that began a window later at another level) or lies
within a window of it at the same level; a period
still running is said as "since step N". Slow steps whose ranks' arrivals are known wait until
they number :data:`SLOW_SAID_AFTER` (or end): a straggler is named only by then, and slow
steps that are its cost are said as its finding, not as every rank's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import orjson
import pandas as pd

from pardiag import layout

from .monitor_run import capture_request, requested_captures
from .monitored import (
    MIN_STEPS,
    WINDOW_STEPS,
    MonitorData,
    findings,
    line_frames,
    same_level,
)

#: Steps the follower keeps and judges (the most recent ones).
HORIZON = 4000
#: Slow steps whose ranks' arrivals are known are said once this many are found (or once
#: they end): a late rank's own finding needs :data:`~.monitored.MIN_STEPS` late steps after
#: the lateness's running median, which lags the step time by a few steps.
SLOW_SAID_AFTER = 2 * MIN_STEPS
#: A finding that began before this step asks for a deep capture only once it has gone on past
#: it (:meth:`Follower.capture_worthy`): a loaded machine's first steps, late or slow, are the
#: run's start-up, not what a capture is for; a persistent straggler from step 0 still gets one.
START_UP_STEPS = 2 * WINDOW_STEPS


class Follower:
    """Reads each rank's new complete lines of a monitor folder, keeps the last
    :data:`HORIZON` steps, and gives the findings not said before.

    Args:
        run_dir: the run folder the ranks write (``pardiag/rank*.monitor.jsonl``).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._offsets: dict[Path, int] = {}
        self._steps: list[pd.DataFrame] = []
        self._calls: list[pd.DataFrame] = []
        self.said: list[dict] = []
        #: the last step judged (every rank's records reach it)
        self.top = 0
        #: ranks whose script has ended (their last line says so)
        self.ended: set[int] = set()

    def read(self) -> bool:
        """Take the lines written since the last call (a line still being written waits).
        Returns whether anything new came."""
        new = False
        for path in sorted(layout.sidecar_dir(self.run_dir).glob("rank*.monitor.jsonl")):
            at = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as fh:
                    fh.seek(at)
                    chunk = fh.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n")
            if end < 0:
                continue
            self._offsets[path] = at + end + 1
            for line in chunk[:end].split(b"\n"):
                try:
                    doc = orjson.loads(line)
                    st, ca, _, _ = line_frames(doc)
                    if doc.get("last"):
                        self.ended.add(int(doc["rank"]))
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue   # the report says what is wrong with a file; the run goes on
                self._steps.append(st)
                if ca is not None:
                    self._calls.append(ca)
                new = True
        return new

    def data(self) -> MonitorData | None:
        """The steps every rank has written, within the last :data:`HORIZON` (None: none)."""
        if not self._steps:
            return None
        steps = pd.concat(self._steps, ignore_index=True)
        top = int(steps.groupby("rank")["step"].max().min())
        low = top - HORIZON
        steps = steps[steps["step"] > low]
        self._steps = [steps]
        calls = pd.concat(self._calls, ignore_index=True) if self._calls else pd.DataFrame(
            columns=["rank", "step", "group", "op", "bytes", "issue_us", "return_us",
                     "done_us"])
        calls = calls[calls["step"] > low]
        self._calls = [calls]
        return MonitorData(steps=steps[steps["step"] <= top].reset_index(drop=True),
                           calls=calls[calls["step"] <= top].reset_index(drop=True),
                           memory=pd.DataFrame(columns=["rank", "step", "rss_bytes",
                                                        "device_bytes"]),
                           hosts={}, notes=[],
                           captures=requested_captures(capture_request(self.run_dir)))

    def new_findings(self) -> list[tuple[dict, bool]]:
        """The findings not said before, each with whether it still goes on (its last step is
        within :data:`~.monitored.WINDOW_STEPS` of the last step judged); marks them said.
        Each finding is the follower's own record of it, whose ``last_step`` grows as later
        reads find it again."""
        if not self.read():
            return []
        data = self.data()
        if data is None or data.steps.empty:
            return []
        top = int(data.steps["step"].max())
        out = []
        for f in findings(data):
            if f["kind"] == "slow_steps" and f["straggler_rank"] is not None:
                continue   # the straggler's own finding says it
            if f["kind"] not in ("straggler", "slow_steps"):
                continue
            seen = [g for g in self.said if _same_period(g, f)]
            for g in seen:   # the same period, grown since it was said
                g["last_step"] = max(g["last_step"], f["last_step"])
                if f.get("persistent") == g.get("persistent"):
                    # its latest level: a first reading's (a few steps of it) kept, a later
                    # period's first reading could pass for it
                    g.update({k: f[k] for k in _LEVEL if k in f})
            if seen:
                continue
            if (f["kind"] == "slow_steps" and f["arrivals_known"]
                    and f["steps"] < SLOW_SAID_AFTER and _ongoing(f, top)):
                continue   # whether a rank is late there is not known yet
            g = dict(f)
            self.said.append(g)
            out.append((g, _ongoing(f, top)))
        self.top = top
        return out

    def capture_worthy(self, f: dict) -> bool | None:
        """Whether finding ``f`` (as :meth:`new_findings` gave it) is worth a deep capture now:
        True when it still goes on and began after the start-up (:data:`START_UP_STEPS`) or
        has gone on past it; None while that is not known yet (it began in the start-up and
        goes on); False when it has ended (a capture begins some steps after the last step
        read: it would show the run after the finding, not the finding)."""
        if not _ongoing(f, self.top):
            return False
        return True if max(f["first_step"], f["last_step"]) >= START_UP_STEPS else None


#: A finding's fields that give its size (:func:`_level`).
_LEVEL = ("extra_delay_ms", "step_ms", "baseline_step_ms")


def _ongoing(f: dict, top: int) -> bool:
    """Whether a finding still goes on: its last step within :data:`~.monitored.WINDOW_STEPS`
    of ``top``, the last step judged."""
    return f["last_step"] >= top - WINDOW_STEPS


def _level(f: dict) -> float:
    """A period's size (ms): a straggler's extra delay, slow steps' excess over the baseline."""
    if f["kind"] == "straggler":
        return float(f["extra_delay_ms"])
    return float(f["step_ms"]) - float(f["baseline_step_ms"])


def _same_period(said: dict, f: dict) -> bool:
    """Whether ``f`` is the period ``said`` before, grown or moved since: of its kind and rank,
    overlapping it at the same level (:func:`~.monitored.same_level`) or from within
    :data:`~.monitored.WINDOW_STEPS` of its first step, or within a window of it at the same
    level (as the report joins two parts of one period); a start-up's lateness and a slow
    period soon after are two, as are a small lateness and a straggler's period right after."""
    if said["kind"] != f["kind"] or said.get("rank") != f.get("rank"):
        return False
    level = same_level(_level(said), _level(f))
    if said["first_step"] <= f["last_step"] and f["first_step"] <= said["last_step"]:
        # overlapping: the same period, unless it began a window later at another level (a
        # straggler's period right after a small lateness the noise made)
        return level or abs(f["first_step"] - said["first_step"]) <= WINDOW_STEPS
    return (said["first_step"] <= f["last_step"] + WINDOW_STEPS
            and f["first_step"] <= said["last_step"] + WINDOW_STEPS and level)


def online_line(f: dict, ongoing: bool) -> str:
    """How the launcher says a finding while the run goes on."""
    who = f"rank {f['rank']}: " if "rank" in f else ""
    what = {"straggler": "late at its collectives", "slow_steps": "slow"}[f["kind"]]
    span = (f"since step {f['first_step']}" if ongoing
            else f"in steps {f['first_step']}–{f['last_step']}")
    if f["kind"] == "slow_steps":
        what, span = "every rank's steps slow", span
    extra = (f" (+{f['extra_delay_ms']:.1f} ms per step)" if f["kind"] == "straggler"
             else f" ({f['step_ms']:.1f} ms against {f['baseline_step_ms']:.1f} ms)")
    return f"{who}{what} {span}{extra}"


def request_capture(run_dir: Path, start_step: int, steps: int, reason: str) -> Path:
    """Ask every rank for a Kineto trace of steps ``start_step`` .. ``start_step + steps - 1``
    (written atomically to :func:`pardiag.layout.capture_request_path`; the ranks read it at
    their next step). The file holds this request at its top (``start_step``, ``steps``,
    ``reason``: what the ranks read) and every request of the run so far in ``asked``, in the
    order asked. Returns the request's path."""
    path = layout.capture_request_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    this = {"start_step": int(start_step), "steps": int(steps), "reason": reason}
    try:
        before = orjson.loads(path.read_bytes())
        asked = [a for a in before.get("asked", [before]) if isinstance(a, dict)]
    except (OSError, ValueError, AttributeError):
        asked = []
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**this, "asked": [*asked, this]}))
    os.replace(tmp, path)
    return path
