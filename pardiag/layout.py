"""The on-disk layout of a pardiag run folder, shared by collectors and analyzer.

A run folder written by ``pardiag profile`` holds::

    rank{R}.trace.json.gz         TRACE_TEMPLATE: gzipped Kineto Chrome trace of rank R
    pardiag/                      SIDECAR_DIR: everything else pardiag writes
        run.json                  RUN_FILE: one per run (command, start time, world size, ...);
                                  of a multi-node run: the job and node 0's part
        run.node{N}.json          NODE_RUN_TEMPLATE: node N's part of a multi-node run (its
                                  hosts, ranks, exit codes); :func:`join_run_files` joins them
        rank{R}.meta.json         RANK_META_TEMPLATE: per-rank metadata (host, device, status,
                                  memory, topology, detected parallel layout)
        rank{R}.comms.json        COMMS_TEMPLATE: process groups and every collective and
                                  point-to-point op (group, seq, bytes, issue/start/end)
        rank{R}.pipeline.json     PIPELINE_TEMPLATE: forward/backward per stage and microbatch
        rank{R}.hang.json         HANG_TEMPLATE: what a rank was doing when --timeout expired
        rank{R}.stacks.txt        STACKS_TEMPLATE: every thread's Python stack, written when
                                  a rank that wrote no hang dump was signalled (--timeout)
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
from typing import Any

import msgspec

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
STACKS_TEMPLATE = "rank{rank}.stacks.txt"
#: A rank's trace while it is being written (in the sidecar folder, where no report reads
#: traces); renamed to ``TRACE_TEMPLATE`` when complete, so a rank stopped while writing leaves
#: no truncated trace under the trace's name.
PARTIAL_TRACE_TEMPLATE = "rank{rank}.trace.partial.json.gz"
#: Node N's part of run.json in a multi-node run (node 0 writes RUN_FILE: the job and its part).
NODE_RUN_TEMPLATE = "run.node{node}.json"
#: Created (in SIDECAR_DIR) by the launcher when --timeout expires; ranks then write their
#: HANG_TEMPLATE file.
DUMP_REQUEST = "dump-request"
#: The dump request of run folders written before SIDECAR_DIR (at the top of the run folder).
LEGACY_DUMP_REQUEST = ".pardiag-dump-request"
#: Folder (inside a trace folder) of per-rank summaries, one per trace file named
#: ``<trace file name>`` + SUMMARY_SUFFIX (see pardiag.analyzer.per_rank.store).
SUMMARY_DIR = ".pardiag-cache"
SUMMARY_SUFFIX = ".summary.json"

#: Names of files that are pardiag sidecars, never traces.
_SIDECAR_RE = re.compile(
    r"^(run\.json|run\.node[\w.-]+\.json|rank\d+\.(meta|comms|pipeline|hang)\.json)$")
_TRACE_RE = re.compile(r"^rank\d+\.trace\.json\.gz$")


def user_cache_dir() -> Path:
    """pardiag's folder in the user's cache: ``$PARDIAG_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/pardiag``, else ``~/.cache/pardiag`` (summaries of read-only trace
    folders, the report page's packed plotly.js). Not created here."""
    import os

    env = os.environ.get("PARDIAG_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pardiag"


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


def stacks_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s thread stacks (written on SIGUSR1) inside ``run_dir``."""
    return sidecar_dir(run_dir) / STACKS_TEMPLATE.format(rank=rank)


def partial_trace_path(run_dir: Path, rank: int) -> Path:
    """Path of rank ``rank``'s trace while it is being written (``PARTIAL_TRACE_TEMPLATE``)."""
    return sidecar_dir(run_dir) / PARTIAL_TRACE_TEMPLATE.format(rank=rank)


def run_file_path(run_dir: Path) -> Path:
    """Path of the run file inside ``run_dir``."""
    return sidecar_dir(run_dir) / RUN_FILE


def node_run_path(run_dir: Path, node: int | str | None) -> Path:
    """Path of a node's part of the run file: ``run.json`` for node 0 (or a single-node run,
    ``node`` None or 0), else ``run.node{node}.json`` (``node`` may be a host name where the
    node's rank is unknown)."""
    if node in (None, 0):
        return run_file_path(run_dir)
    return sidecar_dir(run_dir) / NODE_RUN_TEMPLATE.format(node=node)


def rank_files(run_dir: Path, rank: int) -> list[Path]:
    """The files rank ``rank`` writes into ``run_dir`` (trace and sidecars; not the summary,
    which is checked against its trace)."""
    return [trace_path(run_dir, rank), rank_meta_path(run_dir, rank), comms_path(run_dir, rank),
            pipeline_path(run_dir, rank), hang_path(run_dir, rank), stacks_path(run_dir, rank),
            partial_trace_path(run_dir, rank)]


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
    try:
        out += sorted(f for f in sidecar_dir(run_dir).glob("rank*.stacks.txt") if f.is_file())
        out += sorted(f for f in sidecar_dir(run_dir).glob(
            PARTIAL_TRACE_TEMPLATE.format(rank="*")) if f.is_file())
    except OSError:
        pass
    return sorted(out)


def full_buffer_bytes(op: str, in_bytes: int, out_bytes: int, group_size: int | None) -> int:
    """The full buffer of a collective (bytes; nccl-tests' S): the larger of its input and
    output, except for an all-gather whose recorded output is no larger than its input over a
    group of more than one rank: its input × the group's size. (The flight recorder gives the
    input for both when a functional collective allocates the output itself, as DTensor's
    tensor-parallel gathers do: 256 KiB recorded for a 512 KiB gather at tp=2, 256 KiB again
    for the 1 MiB gather at tp=4.)"""
    if op == "all_gather" and group_size and group_size > 1 and 0 < out_bytes <= in_bytes:
        return in_bytes * group_size
    return max(in_bytes, out_bytes)


def sidecar_header(kind: str) -> dict:
    """The keys every sidecar starts with: schema, schema version and kind (``run`` or ``rank``)."""
    return {"schema": SIDECAR_SCHEMA, "schema_version": SCHEMA_VERSION, "kind": kind}


#: Prefixes of the environment variables each rank records (``RankMeta.env``): the settings of
#: NCCL and of torch (``pardiag compare`` shows the differences between two runs).
ENV_PREFIXES = ("NCCL_", "TORCH_", "PYTORCH_")


# --- What the run file and the rank metadata hold ------------------------------------------------
# Written by the collectors (launch.py: RunFile; rank_entry.py: RankMeta) with encode_sidecar,
# decoded once by the loader (pardiag.analyzer.trace.load) with decode_sidecar. Every field has a
# default, so a file of an older pardiag (or a test's partial one) decodes; unknown keys are
# ignored, so a newer pardiag's file decodes too. A value of the wrong type is an error that names
# the field (the loader then ignores the file with a warning).


class ProfilerSchedule(msgspec.Struct, kw_only=True, frozen=True):
    """The ``torch.profiler`` schedule the ranks used (``--wait/--warmup/--active``).

    Attributes:
        wait: optimizer steps skipped before the profiler warms up.
        warmup: optimizer steps profiled and discarded.
        active: optimizer steps recorded in the trace.
    """

    wait: int = 1
    warmup: int = 1
    active: int = 3


class RunFile(msgspec.Struct, kw_only=True, frozen=True):
    """``pardiag/run.json``: one per run, written by the launcher when torchrun has finished.

    Attributes:
        schema: always SIDECAR_SCHEMA (tells a pardiag sidecar from other JSON).
        schema_version: SCHEMA_VERSION of the writer.
        kind: always ``"run"``.
        pardiag_version: the pardiag that wrote the run.
        command: the ``pardiag profile`` command line (shell-quoted).
        script: the training script as given.
        script_args: the script's own arguments.
        world_size: ranks started (all nodes).
        nproc_per_node: ranks started on this node.
        nnodes: nodes of the job (1: ``pardiag profile`` ran ``torchrun --standalone``).
        node_rank: the node this file describes (0 also writes the job's fields; None: not
            known). A multi-node run has one file per node (``run.json`` of node 0,
            ``run.node{N}.json`` of the others): :func:`join_run_files` makes them one.
        schedule: the profiler schedule.
        started_unix: when torchrun was started (seconds since the epoch, UTC).
        ended_unix: when torchrun had finished (seconds since the epoch, UTC).
        torchrun_exit_code: torchrun's own exit code.
        exit_code: the exit code passed on: the first non-zero rank's, 124 after ``--timeout``,
            else torchrun's.
        timed_out_after_s: the ``--timeout`` that expired (None: it did not).
        hang: one line per collective the job was stuck in when it was stopped.
        nodes: ``{host name: [ranks on it]}`` from the rank metadata (of this node's ranks in a
            node's part).
        layout: the parallel layout rank 0 detected: ``dims`` (``{"dp": 2, ...}``),
            ``strategies``, ``pipeline`` (schedule, stages, microbatches, ...) and
            ``fsdp_reshard_after_forward`` when known.
        backend: the process group backend (``gloo``, ``nccl``; a list when ranks differ).
        torch_version: torch's version (a list when ranks differ).
        failed_ranks: ``{rank as a string: error line}`` of ranks that raised or exited non-zero.
        missing_ranks: ranks that wrote no metadata (killed before they finished).
        missing_nodes: nodes whose part was not found when the parts were joined (filled in by
            :func:`join_run_files`, never written).
    """

    schema: str = SIDECAR_SCHEMA
    schema_version: int = SCHEMA_VERSION
    kind: str = "run"
    pardiag_version: str | None = None
    command: str | None = None
    script: str | None = None
    script_args: list[str] = msgspec.field(default_factory=list)
    world_size: int | None = None
    nproc_per_node: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    schedule: ProfilerSchedule | None = None
    started_unix: float | None = None
    ended_unix: float | None = None
    torchrun_exit_code: int | None = None
    exit_code: int | None = None
    timed_out_after_s: float | None = None
    hang: list[str] = msgspec.field(default_factory=list)
    nodes: dict[str, list[int]] = msgspec.field(default_factory=dict)
    layout: dict[str, Any] | None = None
    backend: str | list[str] | None = None
    torch_version: str | list[str] | None = None
    failed_ranks: dict[str, str] = msgspec.field(default_factory=dict)
    missing_ranks: list[int] = msgspec.field(default_factory=list)
    missing_nodes: list[int] = msgspec.field(default_factory=list)


def join_run_files(parts: list[RunFile]) -> RunFile | None:
    """One run file from the parts of a run's nodes (``run.json`` and ``run.node{N}.json``, from
    one shared run folder or each node's own).

    The job's fields (command, script, world size, nnodes, schedule, start) come from node 0's
    part (else the lowest node's); hosts, failed and missing ranks and hang lines are the union
    of the parts; the start is the earliest and the end the latest; the exit code the first
    non-zero one (node order); ``missing_nodes`` lists the nodes below ``nnodes`` with no part.
    None when ``parts`` is empty."""
    if not parts:
        return None
    if len(parts) == 1 and not (parts[0].nnodes or 1) > 1:
        return parts[0]
    by_node = sorted(parts, key=lambda p: (p.node_rank is None, p.node_rank or 0))
    base = by_node[0]
    nodes: dict[str, list[int]] = {}
    failed: dict[str, str] = {}
    missing: set[int] = set()
    hang: list[str] = []
    for p in by_node:
        for host, ranks in p.nodes.items():
            nodes[host] = sorted({*nodes.get(host, []), *ranks})
        failed.update(p.failed_ranks)
        missing.update(p.missing_ranks)
        hang.extend(h for h in p.hang if h not in hang)
    have = {p.node_rank for p in parts if p.node_rank is not None}
    n = base.nnodes or 1
    starts = [p.started_unix for p in parts if p.started_unix is not None]
    ends = [p.ended_unix for p in parts if p.ended_unix is not None]
    codes = [p.exit_code for p in by_node if p.exit_code]
    return msgspec.structs.replace(
        base, nodes=dict(sorted(nodes.items(), key=lambda kv: min(kv[1] or [0]))),
        failed_ranks=dict(sorted(failed.items(), key=lambda kv: int(kv[0]))),
        missing_ranks=sorted(missing), hang=hang,
        started_unix=min(starts) if starts else None, ended_unix=max(ends) if ends else None,
        exit_code=codes[0] if codes else base.exit_code,
        timed_out_after_s=next((p.timed_out_after_s for p in by_node
                                if p.timed_out_after_s is not None), None),
        missing_nodes=sorted(set(range(n)) - have) if have else [])


class ShardedParam(msgspec.Struct, kw_only=True, frozen=True):
    """A tensor-parallel (DTensor) parameter: what a TP degree must divide.

    Attributes:
        name: qualified parameter name in its root module (``layers.0.w1.weight``).
        shape: the full (global, unsharded) shape, elements per dimension.
        placements: the DTensor placement on each mesh dimension as torch writes it
            (``Shard(dim=0)``, ``Replicate()``, ``_StridedShard(dim=0, sf=2)``).
        mesh_dims: the mesh dimension names (``["dp", "tp"]``; None for an unnamed one).
        tp_dims: the tensor dimensions sharded over the tensor-parallel mesh dimension (a mesh
            dimension named ``tp``/``tensor``/``sp``, or the only dimension of an unnamed 1-D mesh
            when no FSDP manages the parameter).
    """

    name: str
    shape: list[int]
    placements: list[str] = msgspec.field(default_factory=list)
    mesh_dims: list[str | None] = msgspec.field(default_factory=list)
    tp_dims: list[int] = msgspec.field(default_factory=list)


class AttentionHeads(msgspec.Struct, kw_only=True, frozen=True):
    """An attention module's heads: a TP degree must divide them (and the KV heads under GQA).

    Attributes:
        module: qualified module name in its root module.
        type: the module's class name.
        heads: attention (query) heads.
        kv_heads: key/value heads (grouped-query attention); None when equal to ``heads`` or
            not exposed.
        source: ``"attributes"`` (``num_heads``, ``num_attention_heads``, ``n_heads``,
            ``num_key_value_heads``, ``n_kv_heads``) or ``"projections"`` (output features of
            ``q_proj``/``k_proj`` over ``head_dim``).
    """

    module: str
    type: str
    heads: int
    kv_heads: int | None = None
    source: str = "attributes"


class ModelShapes(msgspec.Struct, kw_only=True, frozen=True):
    """The shapes that constrain how a rank's model can be split, recorded by the collector
    (``pardiag.collectors.shapes.model_shapes``) when the profiler's window ends.

    Attributes:
        sharded_params: the rank's tensor-parallel parameters (FSDP/ZeRO shards need nothing:
            they pad uneven shards).
        attention: attention modules whose heads are exposed.
        stage_layers: per local pipeline stage (its index as a decimal string: a JSON object
            key), the layers its module can be split into: its direct children, a container
            child (``ModuleList``, ``ModuleDict``, ``Sequential``) counted by its items.
        batch_samples: dim 0 of the first tensor given to the rank's top-level module (the
            outermost module call with gradients on that has the most parameters, before the
            first optimizer step): the per-rank batch in samples (one accumulation step's), or
            the microbatch in a pipeline; None when unseen.
        batch_module: the class name of that module.
        batch_calls: that module's calls with gradients on before the first optimizer step
            (gradient accumulation: more than 1; in a pipeline, microbatches × local stages).
        truncated: True when more than ``MAX_SHAPES`` parameters or modules were found (the
            rest are not recorded).
    """

    sharded_params: list[ShardedParam] = msgspec.field(default_factory=list)
    attention: list[AttentionHeads] = msgspec.field(default_factory=list)
    stage_layers: dict[str, int] = msgspec.field(default_factory=dict)
    batch_samples: int | None = None
    batch_module: str | None = None
    batch_calls: int | None = None
    truncated: bool = False


#: At most this many sharded parameters and attention modules are recorded per rank.
MAX_SHAPES = 20_000


class RankMeta(msgspec.Struct, kw_only=True, frozen=True):
    """``pardiag/rank{R}.meta.json``: written by each rank when its script has ended.

    Attributes:
        schema: always SIDECAR_SCHEMA.
        schema_version: SCHEMA_VERSION of the writer.
        kind: always ``"rank"``.
        rank: global rank.
        world_size: ranks of the job.
        local_rank: rank on its node.
        pid: the rank's process id.
        host: host name (ranks with the same one share a clock).
        cpu_count: CPUs of the host (``os.cpu_count()``).
        intra_op_threads: torch's intra-op threads when the script ended
            (``torch.get_num_threads()``).
        cpu_affinity: the cores the rank may run on when the script ended
            (``os.sched_getaffinity``), None where the OS does not say.
        pinned_by_pardiag: ``pardiag profile --pin-cpu`` gave the rank its own cores.
        nccl_version: NCCL's version on GPU hosts.
        nvidia_smi_topo: ``nvidia-smi topo -m`` output (local rank 0 of GPU hosts).
        torch_version: torch's version.
        pardiag_version: the pardiag that wrote the file.
        backend: the process group backend (None: no process group).
        device: ``cpu`` or ``cuda:N``.
        device_name: the GPU's name, or the CPU's.
        device_memory_bytes: the GPU's memory (None on CPU).
        optimizer_steps: optimizer steps the rank counted (the profiler steps with them).
        optimizer_step_times_us: ``[step, start, end]`` of every counted optimizer step (epoch µs).
        trace_file: the trace's file name in the run folder (None: no trace was written).
        comm_records: collective and point-to-point records written to its comms sidecar.
        memory: ``static`` (bytes of local parameters, gradients, optimizer state), peak RSS or
            CUDA peak allocated/reserved bytes, ``trace_peaks`` (the trace's memory events' peak
            per device type).
        layout: the parallel layout the rank detected (dims, strategies, group_dims, pipeline,
            DDP bucket cap and parameter bytes, FSDP settings), or None.
        shapes: what constrains the split of the rank's model (tensor-parallel shapes,
            attention heads, pipeline layers, batch), or None (not recorded).
        started_unix: when the script started (seconds since the epoch, UTC).
        ended_unix: when it ended.
        exit_code: the script's exit code.
        instrumentation: what pardiag's own hooks did: ``post_window_s`` (seconds the work
            when the profiler's window ended took: trace export, flight-recorder dump,
            live-object scans; it follows optimizer step ``post_window_after_step``, so the
            period of the next step holds it and is never used as a step time), and per
            wrapper the calls inside the window (recorded) and outside it (``p2p_calls``,
            ``chunk_calls``: ``{"window": n, "outside": n}``), and ``wrapper_cost_us``: what
            each wrapper adds to one call outside the window, timed on a no-op after the
            script (``{"p2p": µs, "chunk": µs}``); None: not recorded (runs of an older
            pardiag).
        status: ``ok`` or ``error``.
        error: the script's exception on one line when ``status`` is ``error``.
        env: the rank's environment variables whose names start with one of
            :data:`ENV_PREFIXES` (``NCCL_*``, ``TORCH_*``, ``PYTORCH_*``); None: not recorded
            (runs of an older pardiag).
        node_rank: the rank's node (torchrun's ``GROUP_RANK``, SLURM's ``SLURM_NODEID``);
            None: not known.
        launch_id: the ``pardiag profile`` process that started the rank (tells a node's
            launcher its own ranks in a shared run folder); None under ``pardiag wrap``.
    """

    schema: str = SIDECAR_SCHEMA
    schema_version: int = SCHEMA_VERSION
    kind: str = "rank"
    rank: int
    world_size: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    host: str | None = None
    cpu_count: int | None = None
    intra_op_threads: int | None = None
    cpu_affinity: list[int] | None = None
    pinned_by_pardiag: bool = False
    nccl_version: str | None = None
    nvidia_smi_topo: str | None = None
    torch_version: str | None = None
    pardiag_version: str | None = None
    backend: str | None = None
    device: str | None = None
    device_name: str | None = None
    device_memory_bytes: int | None = None
    optimizer_steps: int | None = None
    optimizer_step_times_us: list[list[float]] = msgspec.field(default_factory=list)
    trace_file: str | None = None
    comm_records: int = 0
    memory: dict[str, Any] = msgspec.field(default_factory=dict)
    layout: dict[str, Any] | None = None
    shapes: ModelShapes | None = None
    started_unix: float | None = None
    ended_unix: float | None = None
    exit_code: int | None = None
    instrumentation: dict[str, Any] | None = None
    status: str | None = None
    error: str | None = None
    env: dict[str, str] | None = None
    node_rank: int | None = None
    launch_id: str | None = None


def contention_note(metas) -> str | None:
    """One sentence when CPU ranks on one host contend for its cores, else None.

    Contended: the host's CPU ranks run more intra-op threads in all than the cores they may
    use, or two of them may run on the same core (their ``cpu_affinity`` sets intersect: the
    OS may put both on it). GPU ranks are left out: their timings are the device's. Ranks
    without ``intra_op_threads`` (recorded before pardiag 0.x, or traces from elsewhere) are
    not judged.

    Args:
        metas: :class:`RankMeta` of the run's ranks (any iterable)."""
    hosts: dict[str, list] = {}
    for m in metas:
        if m.device and not str(m.device).startswith("cpu"):
            continue
        hosts.setdefault(str(m.host or "?"), []).append(m)
    found = []
    for host, ms in sorted(hosts.items()):
        if not all(m.intra_op_threads for m in ms):
            continue
        ranks = ",".join(str(m.rank) for m in sorted(ms, key=lambda m: m.rank))
        threads = sum(int(m.intra_op_threads) for m in ms)
        affs = [frozenset(m.cpu_affinity) for m in ms if m.cpu_affinity]
        cores = (len(frozenset().union(*affs)) if len(affs) == len(ms)
                 else max(int(m.cpu_count or 0) for m in ms))
        shared = len(affs) == len(ms) and any(
            a & b for i, a in enumerate(affs) for b in affs[i + 1:])
        where = f"on {host}" if len(hosts) > 1 else "on this host"
        if cores and threads > cores:
            found.append(f"ranks {ranks} run {threads} intra-op threads on {cores} core(s) "
                         f"{where}")
        elif shared:
            span = sorted(frozenset().union(*affs))
            found.append(f"ranks {ranks} may run on the same cores {where} (each may use "
                         f"{len(affs[0])} of cores {span[0]}–{span[-1]})")
    if not found:
        return None
    return ("timings are contended: " + "; ".join(found) + " — pin each rank to its own cores "
            "(pardiag profile --pin-cpu) or give each fewer threads (torch.set_num_threads)")


#: The typed sidecars by their ``kind``.
TYPED_SIDECARS: dict[str, type] = {"run": RunFile, "rank": RankMeta}


def encode_sidecar(obj: msgspec.Struct) -> bytes:
    """A typed sidecar as the JSON bytes written to its file (indented, keys in field order);
    a value JSON has no type for (a ``torch.__version__``, a path) is written as its ``str``."""
    return msgspec.json.format(msgspec.json.encode(obj, enc_hook=str), indent=1)


def decode_sidecar(doc: dict | bytes, kind: str):
    """A typed sidecar (``RunFile`` for ``"run"``, ``RankMeta`` for ``"rank"``) from its parsed
    JSON object or its bytes.

    Raises:
        ValueError: a value has the wrong type, or a required field is missing (the message
            names the field, e.g. ``Expected `int`, got `str` - at `$.world_size```).
    """
    cls = TYPED_SIDECARS[kind]
    try:
        if isinstance(doc, (bytes, bytearray)):
            return msgspec.json.decode(doc, type=cls)
        return msgspec.convert(doc, cls)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ValueError(str(exc)) from None
