"""Which files and folders a report reads: a folder's candidate trace files and pardiag's
sidecars, a run's metadata given in place of its run, profiling windows kept a subfolder each,
and why a folder holds no trace (for the loader's error)."""

from __future__ import annotations

import os
from pathlib import Path

from pardiag import layout
from pardiag.errors import TraceError

from .traceset import failures_in_order


def find_trace_files(paths: list[Path]) -> tuple[list[Path], list[Path], str, list[str]]:
    """Expand folders into candidate files; returns (candidates, sidecars, source label, info
    lines). A folder's pardiag sidecars are found where :func:`pardiag.layout.find_sidecars`
    looks (its ``pardiag/`` subfolder, or beside the traces in run folders of the older layout).
    Trace files named one by one use the pardiag sidecars (``run.json``, ``rank{R}.*.json``) of
    the one run folder they share; files from several folders use none, and an info line says
    which happened."""
    files: list[Path] = []
    sidecars: list[Path] = []
    seen: set[Path] = set()
    named_dirs: set[Path] = set()
    given_dirs: set[Path] = set()
    for p in paths:
        if p.is_dir():
            given_dirs.add(p.resolve())
            sidecars.extend(f for f in layout.find_sidecars(p) if f not in sidecars)
            with os.scandir(p) as it:  # the entries' types without a stat each
                entries = sorted((e.name, e.is_file()) for e in it)
            for name, is_file in entries:
                if (not is_file or layout.is_sidecar_name(name)
                        or not name.endswith((".json", ".json.gz"))):
                    continue
                f = p / name
                real = f.resolve()
                if real not in seen:
                    seen.add(real)
                    files.append(f)
        elif p.is_file():
            if layout.is_sidecar_name(p.name):
                sidecars.append(p)
                continue
            if p.resolve() not in seen:  # the same file named twice is one rank
                seen.add(p.resolve())
                files.append(p)
                named_dirs.add(p.resolve().parent)
        else:
            raise TraceError(f"{p}: no such file or folder")
    info: list[str] = []
    beside = [d for d in named_dirs - given_dirs if layout.find_sidecars(d)]
    if len(named_dirs) == 1 and beside:
        d = beside[0]
        sidecars.extend(f for f in layout.find_sidecars(d) if f not in sidecars)
        info.append(f"{d}: using the pardiag run's run.json and sidecars beside the named trace "
                    f"files")
    elif beside:
        info.append(f"the named trace files come from {len(named_dirs)} folders: their pardiag "
                    f"sidecars (run.json, rank*.meta/comms/pipeline.json) are not used")
    if files:   # a folder given beside others that holds no trace of its own: said, not skipped
        info.extend(f"{d}: no trace files (*.json, *.json.gz) of its own"
                    f"{no_files_hint([d], None, {})}; nothing read from it" for d in paths
                    if d.is_dir() and not any(f.parent == d for f in files))
    source = str(paths[0]) if len(paths) == 1 else f"{len(paths)} paths"
    return files, sidecars, source, info


def run_of_sidecar(path: Path) -> Path | None:
    """The run folder whose metadata ``path`` is: its sidecar folder (``RUN/pardiag``, holding
    the run file or a monitor file) or a file in it that is not a trace (a sidecar, a monitor
    file, the capture request); None otherwise."""
    folder = path if path.is_dir() else path.parent
    if folder.name != layout.SIDECAR_DIR or folder != layout.sidecar_dir(folder.parent):
        return None
    if not (layout.run_file_path(folder.parent).is_file()
            or any(folder.glob("rank*.monitor.jsonl"))):
        return None
    if path.is_file() and (path.name.endswith((".json", ".json.gz"))
                           and not (layout.is_sidecar_name(path.name)
                                    or path == layout.capture_request_path(folder.parent))):
        return None   # a trace kept there (a partial one): read as given
    return folder.parent


def _trace_subfolders(folder: Path) -> list[Path]:
    """The subfolders of ``folder`` that hold ``*.json`` / ``*.json.gz`` files, pardiag's own
    (stored summaries, sidecars) left out; sorted."""
    return sorted({f.parent for f in folder.glob("*/*.json*")
                   if f.name.endswith((".json", ".json.gz"))
                   and f.parent.name not in (layout.SUMMARY_DIR, layout.SIDECAR_DIR)})


def window_folders(paths: list[Path], run_info: layout.RunFile | None,
                   rank_meta: dict[int, layout.RankMeta]) -> list[Path]:
    """The subfolders that may hold one run's profiling windows, a folder each (torchtitan's
    ``profile_trace/iteration_<step>/``), when one folder was given that holds no trace itself
    and is no pardiag run: every subfolder holding trace files (even one), none of them a
    pardiag run folder; else ``[]``. Whether they are one run is for the loader to say."""
    if len(paths) != 1 or not paths[0].is_dir() or run_info is not None or rank_meta:
        return []
    sub = _trace_subfolders(paths[0])
    if not sub or any(layout.run_file_path(d).exists() or (d / layout.SIDECAR_DIR).is_dir()
                      for d in sub):
        return []
    return sub


def no_files_hint(paths: list[Path], run_info: layout.RunFile | None,
                  rank_meta: dict[int, layout.RankMeta]) -> str:
    """Why no trace file was found, for the error (``"; subfolders hold some: ..."``; ``""``
    when there is nothing to say): subfolders that hold traces, a run that hung, or a pardiag
    run that wrote none."""
    hint = ""
    sub = sorted({d for p in paths if p.is_dir() for d in _trace_subfolders(p)})
    meta_dirs = [d for d in ((p if p.is_dir() else p.parent) for p in paths)
                 if d.name == layout.SIDECAR_DIR and any(
                     f.name.endswith((".json", ".json.gz")) for f in d.parent.glob("*.json*"))]
    if meta_dirs:
        hint = (f"; {meta_dirs[0]} is pardiag's metadata folder of a run: report the run "
                f"folder, {meta_dirs[0].parent}")
    elif sub:
        hint = f"; subfolders hold some: {', '.join(str(d) for d in sub[:3])}"
    elif run_info is not None and run_info.stopped_by_user:
        hint = (f"; the profiled run was interrupted ({run_info.stopped_by_user}) before "
                f"its profiling window ended, so no trace was written")
    elif run_info is not None and run_info.hang:
        hint = ("; the profiled run hung and was stopped before a trace was written: "
                + run_info.hang[0])
    elif run_info is not None and (failed := failures_in_order(run_info, rank_meta)):
        # more steps would not help a script that failed: its first error is the news
        r, msg = failed[0]
        hint = f"; the profiled run failed before a trace was written: rank {r}: {msg}"
    elif rank_meta and not any(m.optimizer_steps for m in rank_meta.values()):
        hint = ("; the script made no optimizer step, and pardiag's steps are optimizer steps "
                "(torch.optim's step()): profile with --wait 0 --warmup 0 to record the whole "
                "script as one step")
    elif run_info is not None or rank_meta:
        steps = {r: m.optimizer_steps for r, m in sorted(rank_meta.items())}
        hint = (f"; this pardiag run wrote no trace (optimizer steps per rank: {steps};"
                f" profile with more steps or --wait 0 --warmup 0)")
    return hint
