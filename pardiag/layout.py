"""The on-disk layout of a pardiag run folder, shared by collectors and analyzer.

A run folder written by ``pardiag profile`` holds::

    rank{R}.trace.json.gz         TRACE_TEMPLATE: gzipped Kineto Chrome trace of rank R
    pardiag/                      SIDECAR_DIR: everything else pardiag writes
        run.json                  RUN_FILE: one per run (command, start time, world size, ...)
        rank{R}.meta.json         RANK_META_TEMPLATE: per-rank metadata (host, device, status,
                                  memory, topology, detected parallel layout)
        rank{R}.comms.json        COMMS_TEMPLATE: process groups and every collective and
                                  point-to-point op (group, seq, bytes, issue/start/end)
        rank{R}.pipeline.json     PIPELINE_TEMPLATE: forward/backward per stage and microbatch
        rank{R}.hang.json         HANG_TEMPLATE: what a rank was doing when --timeout expired
        dump-request              DUMP_REQUEST: created by the launcher when --timeout expires
    .pardiag-cache/               SUMMARY_DIR: per-rank summaries of the traces

Only the ranks' traces sit at the top: tools that take every ``*.json``/``*.gz`` file of a
folder as a trace (Holistic Trace Analysis 0.5 ``TraceAnalysis(trace_dir=...)``, which lists the
folder with ``os.listdir`` and keeps names ending in ``.json`` or ``.gz``, never descending into
subfolders) load exactly the ranks. Run folders written before (:data:`LEGACY`: the sidecars
beside the traces, ``.pardiag-dump-request``) are still read: :func:`find_sidecars` looks in
both places, and ``--overwrite`` removes both.

Every sidecar carries ``"schema": SIDECAR_SCHEMA`` and ``"schema_version": SCHEMA_VERSION`` so
the loader can tell them from traces and from JSON files of other tools.
"""

from __future__ import annotations

import re
from pathlib import Path

SCHEMA_VERSION = 1

#: Value of the ``schema`` key in every pardiag sidecar file.
SIDECAR_SCHEMA = "pardiag"

#: Subfolder of a run folder that holds every file pardiag writes except the traces.
SIDECAR_DIR = "pardiag"
RUN_FILE = "run.json"
TRACE_TEMPLATE = "rank{rank}.trace.json.gz"
RANK_META_TEMPLATE = "rank{rank}.meta.json"
COMMS_TEMPLATE = "rank{rank}.comms.json"
PIPELINE_TEMPLATE = "rank{rank}.pipeline.json"
HANG_TEMPLATE = "rank{rank}.hang.json"
#: Created (in SIDECAR_DIR) by the launcher when --timeout expires; ranks then write their
#: HANG_TEMPLATE file.
DUMP_REQUEST = "dump-request"
#: The dump request of run folders written before SIDECAR_DIR (at the top of the run folder).
LEGACY_DUMP_REQUEST = ".pardiag-dump-request"
#: Folder (inside a trace folder) of per-rank summaries, one per trace file named
#: ``<trace file name>`` + SUMMARY_SUFFIX (see pardiag.analyzer.summary).
SUMMARY_DIR = ".pardiag-cache"
SUMMARY_SUFFIX = ".summary.json"

#: Names of files that are pardiag sidecars, never traces.
_SIDECAR_RE = re.compile(r"^(run\.json|rank\d+\.(meta|comms|pipeline|hang)\.json)$")
_TRACE_RE = re.compile(r"^rank\d+\.trace\.json\.gz$")


def sidecar_dir(run_dir: Path) -> Path:
    """The folder of ``run_dir`` that holds pardiag's sidecars (``run_dir/pardiag``)."""
    return Path(run_dir) / SIDECAR_DIR


def trace_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s trace inside ``run_dir`` (at the top: the only files there)."""
    return Path(run_dir) / TRACE_TEMPLATE.format(rank=rank)


def rank_meta_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s metadata sidecar inside ``run_dir``."""
    return sidecar_dir(run_dir) / RANK_META_TEMPLATE.format(rank=rank)


def comms_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s collective records inside ``run_dir``."""
    return sidecar_dir(run_dir) / COMMS_TEMPLATE.format(rank=rank)


def pipeline_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s pipeline schedule records inside ``run_dir``."""
    return sidecar_dir(run_dir) / PIPELINE_TEMPLATE.format(rank=rank)


def hang_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s hang dump inside ``run_dir``."""
    return sidecar_dir(run_dir) / HANG_TEMPLATE.format(rank=rank)


def run_file_path(run_dir: Path) -> Path:
    """Path of the run file inside ``run_dir``."""
    return sidecar_dir(run_dir) / RUN_FILE


def dump_request_path(run_dir: Path) -> Path:
    """Path of the file whose existence asks every rank for its hang dump."""
    return sidecar_dir(run_dir) / DUMP_REQUEST


def is_sidecar_name(name: str) -> bool:
    """True when a file name is one of pardiag's sidecars (run file or rank metadata)."""
    return _SIDECAR_RE.match(name) is not None


def is_trace_name(name: str) -> bool:
    """True when a file name is a trace written by pardiag (``TRACE_TEMPLATE``)."""
    return _TRACE_RE.match(name) is not None


def find_sidecars(folder: Path) -> list[Path]:
    """pardiag's sidecar files of a run folder, in this layout (``folder/pardiag/``) and in the
    legacy one (beside the traces); sorted, the legacy ones first. Empty for a folder that is no
    pardiag run (or cannot be listed)."""
    out: list[Path] = []
    for d in (Path(folder), sidecar_dir(folder)):
        try:
            out.extend(sorted(f for f in d.iterdir() if is_sidecar_name(f.name) and f.is_file()))
        except OSError:
            continue
    return out


def owned_files(run_dir: Path) -> list[Path]:
    """Every file pardiag wrote into ``run_dir`` (traces, sidecars and dump requests, both
    layouts; not the summaries in SUMMARY_DIR, which are checked against their traces):
    what ``--overwrite`` replaces, and what a report must never write over."""
    run_dir = Path(run_dir)
    out = list(find_sidecars(run_dir))
    try:
        out += sorted(f for f in run_dir.iterdir() if f.is_file() and (
            is_trace_name(f.name) or f.name == LEGACY_DUMP_REQUEST))
    except OSError:
        pass
    if dump_request_path(run_dir).is_file():
        out.append(dump_request_path(run_dir))
    return sorted(out)


def sidecar_header(kind: str) -> dict:
    """The keys every sidecar starts with: schema, schema version and kind (``run`` or ``rank``)."""
    return {"schema": SIDECAR_SCHEMA, "schema_version": SCHEMA_VERSION, "kind": kind}
