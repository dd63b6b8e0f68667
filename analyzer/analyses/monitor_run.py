"""How a monitored run was asked for and how it ended (``pardiag profile --monitor``): its deep
captures' requests and folders (:func:`captures`), and its run file's ending
(:func:`ending_notes`), for :mod:`pardiag.analyzer.analyses.monitor_summary`.
"""

from __future__ import annotations

from pathlib import Path

from pardiag import layout


def capture_request(run_dir: Path) -> dict | None:
    """The launcher's capture request in ``run_dir`` (``start_step``, ``steps``), if any
    (:func:`pardiag.layout.read_capture_request`)."""
    return layout.read_capture_request(run_dir)


def requested_captures(req: dict | None) -> list[tuple[int, int]]:
    """(first, last) step of each deep capture ``req`` (:func:`capture_request`) asked for, in
    the order asked (:func:`pardiag.layout.asked_captures`)."""
    return [(first, last) for first, last, _ in layout.asked_captures(req)]


def captures(run_dir: Path) -> list[dict]:
    """The deep captures of a monitored run (``capture-S/``,
    :func:`pardiag.layout.capture_folders`): ``[{"folder", "first_step", "ranks"}]``
    (``ranks``: trace files in it), by first step."""
    return [{"folder": d.name, "first_step": first,
             "ranks": len(list(d.glob("rank*.trace.json.gz")))}
            for first, d in layout.capture_folders(Path(run_dir))]


def own_record(run_dir: Path, folder: str) -> dict | None:
    """The record a capture folder of ``run_dir`` keeps of where it comes from
    (:func:`pardiag.layout.capture_record` of its own run file), when it names this run:
    ``{"monitored_run", "first_step", "last_step", "reason"}``; None otherwise (no record, or
    another job's, :func:`pardiag.layout.capture_context`)."""
    cap = Path(run_dir) / folder
    try:
        own = layout.decode_sidecar(layout.run_file_path(cap).read_bytes(), "run")
    except (OSError, ValueError):
        return None
    ctx = layout.capture_context(cap, own)
    if ctx is None or not ctx["monitored_run_found"] or (
            Path(ctx["monitored_run"]) != Path(run_dir).resolve()):
        return None
    return ctx


def ending_notes(run_dir: Path, last_step: int | None) -> list[str]:
    """How the run ended, where it did not end well (its run file: ``--timeout``, Ctrl-C, a
    failed rank), with its last recorded step."""
    try:
        run = layout.decode_sidecar(layout.run_file_path(run_dir).read_bytes(), "run")
    except (OSError, ValueError):
        return []   # said where the run file is read for the world size
    at = (f"; its last recorded step is {last_step}" if last_step is not None
          else "; no step was recorded")
    if run.timed_out_after_s is not None:
        hang = f": {'; '.join(run.hang)}" if run.hang else ""
        return [f"the run was stopped by --timeout after {run.timed_out_after_s:g} s{at}{hang}"]
    if run.stalled_after_s is not None:
        hang = f": {'; '.join(run.hang)}" if run.hang else ""
        return [f"the run was stopped by --stall-timeout: no rank made an optimizer step or "
                f"moved on for {run.stalled_after_s:g} s{at}{hang}"]
    if run.stopped_by_user:
        return [f"the run was interrupted ({run.stopped_by_user}, exit code {run.exit_code}){at}"]
    if run.exit_code not in (0, None):
        failed = "; ".join(f"rank {r}: {line}" for r, line in (run.failed_ranks or {}).items())
        return [f"the run ended with exit code {run.exit_code}{at}"
                + (f" ({failed})" if failed else "")]
    return []


def ended_well(run_dir: Path | None) -> bool:
    """Whether the run's file says it ended well: exit code 0, not stopped by ``--timeout`` or
    ``--stall-timeout``. False when it cannot be read (a run still going, or killed before
    writing it) and without a run folder."""
    if run_dir is None:
        return False
    try:
        run = layout.decode_sidecar(layout.run_file_path(run_dir).read_bytes(), "run")
    except (OSError, ValueError):
        return False
    return (run.exit_code == 0 and run.timed_out_after_s is None
            and run.stalled_after_s is None)


def mark_open(found: list[dict], last_step: int | None, run_dir: Path | None) -> None:
    """Mark each transient straggler late up to ``last_step``, the last recorded step, where
    the run in ``run_dir`` did not end well (:func:`ended_well`; ``until_last_step``): whether
    it ended is not known. Of a run that ended well, its last step is the run's, and the
    finding is said as it is."""
    if ended_well(run_dir):
        return
    for f in found:
        if f["kind"] == "straggler" and not f["persistent"] and f["last_step"] == last_step:
            f["until_last_step"] = True
