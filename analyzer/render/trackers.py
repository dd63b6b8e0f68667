"""A monitored run's scalars where people already look at a long run: TensorBoard event files
(``pardiag report RUN --tensorboard DIR``), an MLflow run (``--mlflow URI``) and a W&B run
(``--wandb DIR``), each written with the tracker's own library (none is required; each is
imported only when asked for).

The scalars, per rank and step: ``step_ms``, ``lateness_ms``
(:func:`pardiag.analyzer.analyses.monitored.lateness`), ``data_ms`` and ``optimizer_ms``, each at
the step's wall time. Beyond :data:`MAX_RANKS` ranks, the ranks' median and 90th percentile
(``ranks_median_step_ms``, ``ranks_p90_step_ms``, ``ranks_max_lateness_ms``) and the ranks the
findings name."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from pardiag.errors import PardiagError

from ..analyses import monitor_summary, monitored

#: Ranks written one series each; more are written as their spread and the named ranks.
MAX_RANKS = 64
SERIES = {"step_ms": "dur_us", "data_ms": "data_us", "optimizer_ms": "optimizer_us"}
#: MLflow takes at most 1,000 metrics per ``log_batch`` call (its REST API's limit).
MLFLOW_BATCH = 1000


def scalar_frames(data: monitored.MonitorData, doc: dict) -> dict[str, pd.DataFrame]:
    """The scalars to write, by series name (``rank{R}``, and ``ranks`` beyond
    :data:`MAX_RANKS` ranks): one frame each, indexed by step, with ``wall_s`` (the step's end,
    s since the epoch) and one column per scalar (ms). ``doc`` is the report's summary (its
    ``findings`` name the ranks kept beyond :data:`MAX_RANKS`)."""
    steps = data.steps
    if steps.empty:
        return {}
    delays = monitored.arrival_delays(data)
    late = monitored.lateness(delays) if len(delays) > 1 else pd.DataFrame()
    ranks = sorted(int(r) for r in steps["rank"].unique())
    named = sorted({f["rank"] for f in doc.get("findings", []) if "rank" in f})
    frames = {}
    for r in ranks if len(ranks) <= MAX_RANKS else named:
        g = steps[steps["rank"] == r].set_index("step").sort_index()
        frame = pd.DataFrame({"wall_s": g["end_us"] / 1e6,
                              **{k: g[c] / 1e3 for k, c in SERIES.items()}})
        if r in late.index:
            frame["lateness_ms"] = late.loc[r].reindex(frame.index) / 1e3
        frames[f"rank{r}"] = frame
    if len(ranks) > MAX_RANKS:
        per = steps.groupby("step")
        frame = pd.DataFrame({"wall_s": per["end_us"].median() / 1e6,
                              "ranks_median_step_ms": per["dur_us"].median() / 1e3,
                              "ranks_p90_step_ms": per["dur_us"].quantile(0.9) / 1e3})
        if not late.empty:
            frame["ranks_max_lateness_ms"] = late.max(axis=0).reindex(frame.index) / 1e3
        frames["ranks"] = frame
    return frames


def _rows(frame: pd.DataFrame):
    """(step, wall_s, {scalar: value}) per row, finite values only."""
    cols = list(frame.columns)
    for step, row in zip(frame.index, frame.itertuples(index=False)):
        values = dict(zip(cols, row))
        wall = values.pop("wall_s")
        yield int(step), float(wall), {k: float(v) for k, v in values.items() if np.isfinite(v)}


#: The file in each run's TensorBoard folder that names the run it holds.
TB_RUN_FILE = "pardiag-run.txt"


def tensorboard_run_dir(out: Path, run: Path) -> tuple[Path, bool]:
    """The folder under ``out`` that holds ``run``'s event files, and whether it held them
    before (a second report of the run): ``out/<run folder's name>``, or ``<name>-2``, ``-3``
    … when that folder holds another run's (its :data:`TB_RUN_FILE` names another folder) or
    is not pardiag's (no such file). TensorBoard shows each folder under ``--logdir`` as a run
    of its own, so two runs never share one."""
    me = str(run.resolve())
    name = run.resolve().name or "run"
    for i in range(1, 1000):
        cand = out / (name if i == 1 else f"{name}-{i}")
        if not cand.exists():
            return cand, False
        try:
            if (cand / TB_RUN_FILE).read_text().strip() == me:
                return cand, True
        except OSError:
            pass
    raise PardiagError(f"{out}: 999 folders named {name}(-N) already; choose another --tensorboard")


def write_tensorboard(data: monitored.MonitorData, doc: dict, out: Path, run: Path
                      ) -> tuple[Path, list[Path], bool]:
    """Write the event files of ``run`` under ``out`` in a folder of its own
    (:func:`tensorboard_run_dir`), one folder per series (``rank{R}``, or ``ranks`` for their
    spread), with TensorBoard's own event writer. A second report of the run replaces the
    event files it wrote before (TensorBoard would show each point twice). Returns the run's
    folder, the series folders written and whether earlier files of the run were replaced.

    Raises:
        PardiagError: TensorBoard is not installed, or ``out`` cannot be written.
    """
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise PardiagError("--tensorboard needs TensorBoard: pip install tensorboard") from None
    written = []
    where, again = tensorboard_run_dir(out, run)
    try:
        where.mkdir(parents=True, exist_ok=True)
        (where / TB_RUN_FILE).write_text(str(run.resolve()) + "\n")
        for old in where.glob("*/events.out.tfevents.*"):   # this run's, written before
            old.unlink()
        for name, frame in scalar_frames(data, doc).items():
            (where / name).mkdir(parents=True, exist_ok=True)
            w = EventFileWriter(str(where / name))
            for step, wall, values in _rows(frame):
                if values:
                    w.add_event(Event(wall_time=wall, step=step, summary=Summary(value=[
                        Summary.Value(tag=k, simple_value=v) for k, v in values.items()])))
            w.close()
            written.append(where / name)
    except OSError as exc:
        raise PardiagError(f"{out}: cannot write ({exc.strerror})") from None
    return where, written, again


def _params(data: monitored.MonitorData, doc: dict, run: Path) -> dict[str, str]:
    """What a tracker's run records of the job: its folder, world size, steps and findings."""
    return {"pardiag_run": str(run), "ranks": str(len(doc.get("ranks", []))),
            "steps": str(doc.get("steps", "")), "findings": str(len(doc.get("findings", [])))}


def log_mlflow(data: monitored.MonitorData, doc: dict, run: Path, uri: str,
               experiment: str = "pardiag") -> str:
    """Log the scalars as one MLflow run (metrics ``rank{R}/step_ms`` …, at each training
    step and its wall time) in ``experiment`` of the tracking server or store at ``uri``, with
    the report's JSON as the artifact ``pardiag_monitor.json``; return the MLflow run id.

    Raises:
        PardiagError: MLflow is not installed, or the tracking URI refuses the run.
    """
    try:
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise PardiagError("--mlflow needs MLflow: pip install mlflow-skinny") from None
    try:
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
        run_id = client.create_run(exp_id, run_name=run.name).info.run_id
        client.log_batch(run_id, params=[Param(k, v) for k, v in
                                         _params(data, doc, run).items()])
        batch: list = []
        for name, frame in scalar_frames(data, doc).items():
            for step, wall, values in _rows(frame):
                batch += [Metric(f"{name}/{k}", v, int(wall * 1000), step)
                          for k, v in values.items()]
                if len(batch) >= MLFLOW_BATCH:
                    client.log_batch(run_id, metrics=batch[:MLFLOW_BATCH])
                    batch = batch[MLFLOW_BATCH:]
        if batch:
            client.log_batch(run_id, metrics=batch)
        client.log_dict(run_id, doc, "pardiag_monitor.json")
        client.set_terminated(run_id)
    except MlflowException as exc:
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise PardiagError(f"--mlflow {uri}: {first}{_store_hint(uri, first)}") from None
    return run_id


#: The schemes of MLflow's database stores (SQLAlchemy's): only the full ``mlflow`` package
#: has them; ``mlflow-skinny`` logs to a tracking server or a file store.
_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def _store_hint(uri: str, message: str) -> str:
    """What to do when the tracking URI is a database store this MLflow cannot open (``""``
    otherwise): ``mlflow-skinny`` has no database stores."""
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme in _DB_SCHEMES and "unsupported uri" in message.lower():
        return ("; a database store needs the full MLflow (pip install mlflow: mlflow-skinny "
                "has none), or log to a tracking server (--mlflow http://HOST:5000)")
    return ""


def log_wandb(data: monitored.MonitorData, doc: dict, run: Path, out: Path,
              project: str = "pardiag") -> Path:
    """Log the scalars as one W&B run in ``project`` (metrics ``rank{R}/step_ms`` …, one
    ``log`` per training step), offline under ``out`` unless ``WANDB_MODE`` says otherwise
    (``wandb sync`` uploads it later), with the findings in its summary; return the run's
    folder.

    Raises:
        PardiagError: wandb is not installed, or the run cannot be written.
    """
    try:
        import wandb
    except ImportError:
        raise PardiagError("--wandb needs W&B: pip install wandb") from None
    frames = scalar_frames(data, doc)
    per_step: dict[int, dict[str, float]] = {}
    for name, frame in frames.items():
        for step, _wall, values in _rows(frame):
            per_step.setdefault(step, {}).update({f"{name}/{k}": v for k, v in values.items()})
    out.mkdir(parents=True, exist_ok=True)
    try:
        wb = wandb.init(project=project, name=run.name, dir=str(out),
                        mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
                        config=_params(data, doc, run), reinit="create_new")
        for step in sorted(per_step):
            wb.log(per_step[step], step=step)
        wb.summary["findings"] = [monitor_summary.finding_line(f) for f in doc.get("findings", [])]
        wb.finish()
    except (OSError, wandb.Error) as exc:
        raise PardiagError(f"--wandb {out}: {str(exc).splitlines()[0]}") from None
    return Path(wb.dir).parent
