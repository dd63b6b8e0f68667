"""A monitored run's scalars as TensorBoard event files (``pardiag report RUN --tensorboard
DIR``), where people already look at a long run: per rank and step ``step_ms``,
``lateness_ms`` (:func:`pardiag.analyzer.analyses.monitored.lateness`), ``data_ms`` and
``optimizer_ms``, each at the step's wall time. Written with TensorBoard's own event writer (the
``tensorboard`` package; nothing else needs it). Beyond :data:`MAX_RANKS` ranks, the ranks'
median and 90th percentile (``ranks_median``, ``ranks_p90``) and the ranks the findings name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pardiag.errors import PardiagError

from ..analyses import monitored

#: Ranks written one run each; more are written as their spread and the named ranks.
MAX_RANKS = 64
SERIES = {"step_ms": "dur_us", "data_ms": "data_us", "optimizer_ms": "optimizer_us"}


def _writer(logdir: Path):
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise PardiagError("--tensorboard needs TensorBoard: pip install tensorboard") from None
    logdir.mkdir(parents=True, exist_ok=True)
    w = EventFileWriter(str(logdir))

    def add(step: int, wall: float, values: dict[str, float]) -> None:
        vals = [Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()
                if np.isfinite(v)]
        if vals:
            w.add_event(Event(wall_time=wall, step=int(step), summary=Summary(value=vals)))

    return w, add


def _write(logdir: Path, frame: pd.DataFrame) -> None:
    """``frame``: one row per step, indexed by step, ``wall_s`` and the scalar columns."""
    w, add = _writer(logdir)
    cols = [c for c in frame.columns if c != "wall_s"]
    for step, row in zip(frame.index, frame.itertuples(index=False)):
        values = dict(zip(frame.columns, row))
        add(step, values["wall_s"], {c: values[c] for c in cols})
    w.close()


def write_tensorboard(data: monitored.MonitorData, doc: dict, out: Path) -> list[Path]:
    """Write the event files under ``out`` (one folder per rank, ``rank{R}``, or ``ranks`` for
    their spread) and return the folders written.

    Raises:
        PardiagError: TensorBoard is not installed, or ``out`` cannot be written.
    """
    steps = data.steps
    if steps.empty:
        return []
    delays = monitored.arrival_delays(data)
    late = monitored.lateness(delays) if len(delays) > 1 else pd.DataFrame()
    ranks = sorted(int(r) for r in steps["rank"].unique())
    named = sorted({f["rank"] for f in doc.get("findings", []) if "rank" in f})
    show = ranks if len(ranks) <= MAX_RANKS else named
    written = []
    try:
        for r in show:
            g = steps[steps["rank"] == r].set_index("step").sort_index()
            frame = pd.DataFrame({"wall_s": g["end_us"] / 1e6,
                                  **{k: g[c] / 1e3 for k, c in SERIES.items()}})
            if r in late.index:
                frame["lateness_ms"] = late.loc[r].reindex(frame.index) / 1e3
            _write(out / f"rank{r}", frame)
            written.append(out / f"rank{r}")
        if len(ranks) > MAX_RANKS:
            per = steps.groupby("step")
            frame = pd.DataFrame({"wall_s": per["end_us"].median() / 1e6,
                                  "ranks_median_step_ms": per["dur_us"].median() / 1e3,
                                  "ranks_p90_step_ms": per["dur_us"].quantile(0.9) / 1e3})
            if not late.empty:
                frame["ranks_max_lateness_ms"] = late.max(axis=0).reindex(frame.index) / 1e3
            _write(out / "ranks", frame)
            written.append(out / "ranks")
    except OSError as exc:
        raise PardiagError(f"{out}: cannot write ({exc.strerror})") from None
    return written
