"""The on-disk layout of a pardiag run folder, shared by collectors and analyzer.

A run folder written by ``pardiag profile`` holds::

    run.json                      RUN_FILE: one per run (command, start time, world size, ...)
    rank{R}.trace.json.gz         TRACE_TEMPLATE: gzipped Kineto Chrome trace of rank R
    rank{R}.meta.json             RANK_META_TEMPLATE: per-rank metadata (host, device, status,
                                  memory, topology, detected parallel layout)
    rank{R}.comms.json            COMMS_TEMPLATE: process groups and every collective and
                                  point-to-point op (group, seq, bytes, issue/start/end)
    rank{R}.pipeline.json         PIPELINE_TEMPLATE: forward/backward per stage and microbatch
    rank{R}.hang.json             HANG_TEMPLATE: what a rank was doing when --timeout expired

Every sidecar carries ``"schema": SIDECAR_SCHEMA`` and ``"schema_version": SCHEMA_VERSION`` so
the loader can tell them from traces and from JSON files of other tools.
"""

from __future__ import annotations

import re
from pathlib import Path

SCHEMA_VERSION = 1

#: Value of the ``schema`` key in every pardiag sidecar file.
SIDECAR_SCHEMA = "pardiag"

RUN_FILE = "run.json"
TRACE_TEMPLATE = "rank{rank}.trace.json.gz"
RANK_META_TEMPLATE = "rank{rank}.meta.json"
COMMS_TEMPLATE = "rank{rank}.comms.json"
PIPELINE_TEMPLATE = "rank{rank}.pipeline.json"
HANG_TEMPLATE = "rank{rank}.hang.json"
#: Created by the launcher when --timeout expires; ranks then write their HANG_TEMPLATE file.
DUMP_REQUEST = ".pardiag-dump-request"
#: Folder (inside a trace folder) of per-rank summaries, one per trace file named
#: ``<trace file name>`` + SUMMARY_SUFFIX (see pardiag.analyzer.summary).
SUMMARY_DIR = ".pardiag-cache"
SUMMARY_SUFFIX = ".summary.json"

#: Names of files that are pardiag sidecars, never traces.
_SIDECAR_RE = re.compile(r"^(run\.json|rank\d+\.(meta|comms|pipeline|hang)\.json)$")
_TRACE_RE = re.compile(r"^rank\d+\.trace\.json\.gz$")


def trace_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s trace inside ``run_dir``."""
    return Path(run_dir) / TRACE_TEMPLATE.format(rank=rank)


def rank_meta_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s metadata sidecar inside ``run_dir``."""
    return Path(run_dir) / RANK_META_TEMPLATE.format(rank=rank)


def comms_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s collective records inside ``run_dir``."""
    return Path(run_dir) / COMMS_TEMPLATE.format(rank=rank)


def pipeline_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s pipeline schedule records inside ``run_dir``."""
    return Path(run_dir) / PIPELINE_TEMPLATE.format(rank=rank)


def hang_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s hang dump inside ``run_dir``."""
    return Path(run_dir) / HANG_TEMPLATE.format(rank=rank)


def run_file_path(run_dir: Path) -> Path:
    """Path of the run file inside ``run_dir``."""
    return Path(run_dir) / RUN_FILE


def is_sidecar_name(name: str) -> bool:
    """True when a file name is one of pardiag's sidecars (run file or rank metadata)."""
    return _SIDECAR_RE.match(name) is not None


def is_trace_name(name: str) -> bool:
    """True when a file name is a trace written by pardiag (``TRACE_TEMPLATE``)."""
    return _TRACE_RE.match(name) is not None


def sidecar_header(kind: str) -> dict:
    """The keys every sidecar starts with: schema, schema version and kind (``run`` or ``rank``)."""
    return {"schema": SIDECAR_SCHEMA, "schema_version": SCHEMA_VERSION, "kind": kind}
