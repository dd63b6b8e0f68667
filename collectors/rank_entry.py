"""Entry point of every rank under ``pardiag profile`` (run by torchrun as ``-m``).

It reads its configuration from the ``PARDIAG_PROFILE_CONFIG`` environment variable (JSON written
by :mod:`pardiag.collectors.launch`), installs pardiag's hooks (:mod:`pardiag.collectors.hooks`),
wraps the user's unmodified script in ``torch.profiler``, steps the profiler on every step of the
first top-level optimizer, and writes the rank's trace and sidecars into the run folder:

* ``rank{R}.trace.json.gz`` — the Kineto trace (written when the active window ends);
* ``rank{R}.comms.json`` — process groups (with their parallel dimension) and every collective
  and point-to-point op of the traced window, placed on the trace's clock;
* ``rank{R}.pipeline.json`` — forward/backward per stage and microbatch (pipelined scripts);
* ``rank{R}.meta.json`` — host, device, versions, memory, topology, detected layout, the
  shapes that constrain splitting the model (tensor-parallel parameters, attention heads,
  pipeline layers, per-rank batch), status.

Then it ends the process cleanly (barrier, flush, ``os._exit``) with the script's own exit code:
gloo runs that leave the process group alive end in SIGABRT 10-40% of the time (FACTS §1).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import functools
import gc
import json
import math
import os
import platform
import re
import runpy
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path

import msgspec

from pardiag import layout
from pardiag.errors import env_seconds
from pardiag.version import __version__

CONFIG_ENV = "PARDIAG_PROFILE_CONFIG"
#: Pipeline chunk records kept per rank (the most recent ones).
MAX_PIPELINE_RECORDS = 50_000
#: A rank touches its progress file at most this often (s) as it makes optimizer steps
#: (``--stall-timeout``): one stat and no write in most steps.
PROGRESS_EVERY_S = 1.0
#: Off a GPU, a rank whose main thread used at least this share of a core between two looks
#: of its watchdog computes, and makes progress (``--stall-timeout``).
BUSY_CPU_SHARE = 0.25


class _OptimizerStepper:
    """Steps a profiler once per step of the first top-level optimizer.

    Global optimizer hooks fire for every optimizer, including ones nested inside another
    (``ZeroRedundancyOptimizer`` calls its inner optimizer's ``step``). The stepper counts the
    step depth with a pre-hook and steps only when the outermost step of the first optimizer it
    saw at depth 0 ends. ``on_step(count, optimizer)`` runs before the profiler steps.
    """

    def __init__(self, on_step, keep_times: bool = True) -> None:
        self._on_step = on_step
        self._depth = 0
        self._owner: int | None = None
        self.optimizer = None
        self.steps = 0
        #: ``[(optimizer step index, start ns, end ns)]`` of the counted steps (epoch ns; kept
        #: only with ``keep_times``: a monitored run's steps are its monitor's)
        self.times: list[tuple[int, int, int]] = []
        self.keep_times = keep_times
        #: the last counted step's ``(index, start ns, end ns)``
        self.last: tuple[int, int, int] = (-1, 0, 0)
        self._t0 = 0

    def pre(self, optimizer, args, kwargs) -> None:
        if self._depth == 0:
            self._t0 = time.time_ns()
        self._depth += 1

    def post(self, optimizer, args, kwargs) -> None:
        self._depth -= 1
        if self._depth != 0:
            return
        if self._owner is None:
            self._owner = id(optimizer)
            self.optimizer = optimizer
        if id(optimizer) == self._owner:
            self.last = (self.steps, self._t0, time.time_ns())
            if self.keep_times:
                self.times.append(self.last)
            self.steps += 1
            self._on_step(self.steps, optimizer)


#: The error a script's own torch profiler raises under ``pardiag profile`` (FACTS: Lightning
#: ``Trainer(profiler="pytorch")`` beside pardiag's profiler ended both ranks in SIGSEGV).
OWN_PROFILER_ERROR = (
    "pardiag: the script starts a torch profiler of its own (such as Lightning's "
    "Trainer(profiler=\"pytorch\"), Accelerate's ProfileKwargs or torch.profiler.profile) while "
    "pardiag profiles it; two torch profilers in one process crash it: turn the script's "
    "profiler off under pardiag profile")


def _keep_destroyed_groups(kept: list) -> list[tuple]:
    """Make ``dist.destroy_process_group`` append the groups it destroys to ``kept`` before it
    runs, so that the script's last reference to a group (a DDP reducer's, freed when the
    script's function returns) never frees it: gloo's destructor joins its worker threads,
    which can be waiting for the interpreter lock the freeing thread holds: an occasional
    deadlock at exit, in the script's own frame. The groups are shut down as the script asked and
    live until ``os._exit``, as a process group does that is never destroyed. Returns
    ``[(module, attribute, original)]`` to restore."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    orig = c10d.destroy_process_group

    @functools.wraps(orig)
    def destroy_process_group(group=None):
        world = c10d._world
        if group is None or group is c10d.GroupMember.WORLD:
            kept.extend(world.pg_names)
        elif group in world.pg_names:
            kept.append(group)
        return orig(group)

    patched = []
    for mod in (c10d, dist):
        if getattr(mod, "destroy_process_group", None) is orig:
            mod.destroy_process_group = destroy_process_group
            patched.append((mod, "destroy_process_group", orig))
    return patched


def _refuse_other_profilers(ours) -> list[tuple]:
    """Make every torch profiler but ``ours`` (and a monitored run's deep capture, marked
    ``_pardiag_capture``) raise ``RuntimeError(OWN_PROFILER_ERROR)`` when it would start
    tracing (``torch.profiler`` profilers when they prepare their trace, the
    legacy ``torch.autograd.profiler.profile`` on ``__enter__``), instead of crashing the
    process. Returns ``[(class, attribute, original)]`` to restore."""
    import torch.autograd.profiler as autograd_profiler
    from torch.profiler import profiler as torch_profiler

    patched = []
    kineto = torch_profiler._KinetoProfile
    orig_prepare = kineto.prepare_trace

    @functools.wraps(orig_prepare)
    def prepare_trace(self, *args, **kwargs):
        if self is not ours and not getattr(self, "_pardiag_capture", False):
            raise RuntimeError(OWN_PROFILER_ERROR)
        return orig_prepare(self, *args, **kwargs)

    legacy = autograd_profiler.profile
    orig_enter = legacy.__enter__

    @functools.wraps(orig_enter)
    def enter(self, *args, **kwargs):
        raise RuntimeError(OWN_PROFILER_ERROR)

    for cls, name, orig, new in ((kineto, "prepare_trace", orig_prepare, prepare_trace),
                                 (legacy, "__enter__", orig_enter, enter)):
        setattr(cls, name, new)
        patched.append((cls, name, orig))
    return patched


def _write_json(path: Path, obj, compact: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, default=str, **({"separators": (",", ":")} if compact
                                                   else {"indent": 1})))
    os.replace(tmp, path)


def _plain(obj):
    """``obj`` as plain JSON values (what ``_write_json`` writes: anything else as its str)."""
    return json.loads(json.dumps(obj, default=str))


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (a message's own line breaks become spaces); a syntax error
    also names its file and line (Python's own form spreads it over four lines with the code
    and a caret)."""
    if isinstance(exc, _Terminated):
        return str(exc)
    if isinstance(exc, SyntaxError):
        where = f" ({exc.filename}, line {exc.lineno})" if exc.filename else ""
        return f"{type(exc).__name__}: {exc.msg}{where}"
    text = "".join(traceback.format_exception_only(type(exc), exc))
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


class _Terminated(BaseException):
    """SIGTERM reached the rank: its launcher is ending the job (torchrun stops the other ranks
    this way when one fails, and on Ctrl-C). ``after``: the error the script had raised first,
    as the job was being stopped (a collective whose peers had gone)."""

    def __init__(self, after: str | None = None) -> None:
        super().__init__()
        self.after = after

    def __str__(self) -> str:
        after = (f"; its collective had failed first as its peers stopped ({self.after})"
                 if self.after else "")
        return (f"{layout.STOPPED_BY_LAUNCHER}: the launcher ended the job (another rank "
                f"failed, or it was interrupted){after}")


#: Errors of a collective whose peer process has gone (gloo's and NCCL's words): when a SIGTERM
#: follows, they are the job's stop seen from this rank, not a failure of its own.
PEER_LOST_RE = re.compile(r"Connection closed by peer|Connection reset by peer|"
                          r"remote process exited|Broken pipe|NCCL communicator was aborted")
#: How long a rank whose collective lost its peer waits for the SIGTERM that says the job is
#: being stopped (seconds).
PEER_LOST_WAIT_S = 2.0


def _stopped_after_peer_loss(run: _RankRun) -> None:
    """A script that failed because a collective's peer had gone, in a job being stopped (a
    SIGTERM came, or comes within :data:`PEER_LOST_WAIT_S`): the rank was stopped, and the
    error it raised first is said with it (one line, exit code 143)."""
    err = run.error
    if err is None or isinstance(err, (_Terminated, SystemExit)):
        return
    msg = f"{type(err).__name__}: {err}"
    if not PEER_LOST_RE.search(msg):
        return
    deadline = time.time() + PEER_LOST_WAIT_S
    while not run.terminated and time.time() < deadline:
        time.sleep(0.05)
    if run.terminated:
        first = msg.splitlines()[0]
        run.error = _Terminated(first if len(first) <= 160 else first[:159] + "…")


#: The exit code of a rank stopped by SIGTERM (128 + the signal's number, as a shell reports it).
TERMINATED_EXIT_CODE = 143


def _exit_code_of(exc: BaseException | None) -> int:
    if exc is None:
        return 0
    if isinstance(exc, _Terminated):
        return TERMINATED_EXIT_CODE
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        return 1  # sys.exit("message") prints the message and exits 1
    return 1


def _device_info(torch) -> dict:
    if torch.cuda.is_available():
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        return {"device": f"cuda:{idx}", "device_name": props.name,
                "device_memory_bytes": int(props.total_memory)}
    return {"device": "cpu", "device_name": platform.processor() or platform.machine(),
            "device_memory_bytes": None}


def claim_files(out: Path, rank: int, overwrite: bool) -> str | None:
    """Make sure this rank writes over nothing of an earlier run: where its own files are in
    ``out`` (a run folder shared by several nodes or launchers, where nobody checked the whole
    folder first), remove them with ``overwrite`` (saying so), else return the one-line error.
    Touches no other rank's file."""
    found = [p for p in layout.rank_files(out, rank) if p.exists()]
    if not found:
        return None
    names = ", ".join(str(p.relative_to(out)) for p in found)
    if not overwrite:
        return (f"{out}: rank {rank}'s files of an earlier run are there ({names}); pass "
                f"--overwrite to replace them, or another --out")
    for p in found:
        p.unlink(missing_ok=True)
    print(f"pardiag: {out}: --overwrite removed rank {rank}'s {names}", file=sys.stderr)
    return None


#: How long a rank that has written everything waits for the others at the end (seconds).
EXIT_SYNC_S = 120.0


def _exit_together(dist, world_size: int, timeout_s: float = EXIT_SYNC_S) -> bool:
    """Wait until every rank has written its files, then return (the caller ends the process).

    A counter in the job's key-value store (the store ``init_process_group`` used), not a
    collective barrier: ``dist.barrier()`` also waits for every collective still queued or
    running on the group (``ProcessGroupGloo::barrier`` waits for all prior work) and has no
    limit short of the group's timeout (30 min): with it, short runs in a loop sometimes had both
    ranks write every file and then not exit until ``--timeout`` stopped them
    (``benchmarks/short_runs.py``; its results in benchmarks/results/). No rank leaves while
    another has not finished (gloo aborts a rank whose peer vanished mid-collective, FACTS §1);
    at most ``timeout_s`` is waited. Returns whether every rank arrived."""
    try:
        store = dist.distributed_c10d._get_default_store()
        n = store.add("pardiag_exit_sync", 1)
        deadline = time.time() + timeout_s
        while n < world_size and time.time() < deadline:
            time.sleep(0.05)
            n = store.add("pardiag_exit_sync", 0)
        return n >= world_size
    except Exception:  # no store, or its host (rank 0 under srun) already gone: nobody to wait for
        return False


def _stack_dump_on_signal(out: Path, rank: int):
    """Make SIGUSR1 write every thread's Python stack to ``pardiag/rank{R}.stacks.txt``
    (:mod:`faulthandler`: it writes from the signal handler, without the interpreter lock, so
    it also answers when the main thread is stuck in native code that holds it and the
    watchdog thread cannot run). Returns the open file, or None where it cannot be set up."""
    import faulthandler
    import signal

    if not hasattr(signal, "SIGUSR1"):
        return None
    try:
        f = open(layout.stacks_path(out, rank), "w")   # noqa: SIM115 - held until the end
        faulthandler.register(signal.SIGUSR1, file=f, all_threads=True)
        return f
    except (OSError, RuntimeError, ValueError):
        return None


def _watchdog(out: Path, rank: int, p2p, stop: threading.Event,
              busy: _RankRun | None = None, monitor=None) -> threading.Thread:
    """A daemon thread that writes ``rank{R}.hang.json`` when the launcher asks (--timeout),
    and then the steps a monitored run's ``monitor`` holds (:func:`_write_monitor_now`: the
    launcher kills the job once the dumps are in).

    It runs while the main thread is blocked in a collective (gloo and NCCL waits release the
    GIL) and records the flight recorder's entries, recent point-to-point calls and the main
    thread's Python stack. With ``--stall-timeout`` (``busy``, the rank's run, given) it also
    touches the rank's progress file, from the rank's first optimizer step until its script
    ends, while pardiag's own work holds the main thread (``busy.own_work``), whenever the
    main thread has moved since the last look (:func:`_main_position`), and, off a GPU, while
    it computes (:func:`_main_cpu_s`, :data:`BUSY_CPU_SHARE`): the script's own work between
    two steps (an evaluation) is progress; a rank blocked in a collective, or sleeping, is not.
    """
    from .comms import flight_recorder_entries, process_groups

    request = layout.dump_request_path(out)
    main_id = threading.main_thread().ident

    def run() -> None:
        last, last_cpu, last_t = None, None, time.monotonic()
        while not stop.wait(0.2):
            if busy is not None and busy.progress_at > float("-inf") and not busy.steps_over:
                where = _main_position(main_id)
                # off a GPU, a main thread that computes uses its core; one that waits (a
                # collective, a sleep) does not (a host waiting for a GPU may spin instead)
                cpu, now = (None if busy.cuda else _main_cpu_s(main_id)), time.monotonic()
                computing = (cpu is not None and last_cpu is not None
                             and cpu - last_cpu > BUSY_CPU_SHARE * (now - last_t))
                if busy.own_work.is_set() or where != last or computing:
                    _touch_progress(busy)
                last, last_cpu, last_t = where, cpu, now
            if not request.exists():
                continue
            frame = sys._current_frames().get(main_id)
            dump = {
                **layout.sidecar_header("hang"), "rank": rank, "time_ns": time.time_ns(),
                "launch_id": os.environ.get("PARDIAG_LAUNCH_ID"),
                "flight_recorder": flight_recorder_entries()[-200:],
                "p2p": p2p.recent_rows(), "process_groups": process_groups(),
                "main_stack": traceback.format_stack(frame) if frame else [],
            }
            _write_json(layout.hang_path(out, rank), dump)
            _write_monitor_now(monitor)
            return

    t = threading.Thread(target=run, name="pardiag-watchdog", daemon=True)
    t.start()
    return t


def _main_position(main_id: int | None) -> tuple | None:
    """Where the main thread is: each frame of its stack's code and last instruction, innermost
    first (None when it has none). Unchanged between two looks while it waits in one call (a
    collective, a sleep); changed by any Python work between them."""
    f = sys._current_frames().get(main_id) if main_id is not None else None
    out = []
    while f is not None:
        out.append((f.f_code, f.f_lasti))
        f = f.f_back
    return tuple(out) or None


def _main_cpu_s(main_id: int | None) -> float | None:
    """The main thread's CPU time (s, its POSIX thread clock); None where it cannot be read."""
    if main_id is None:
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(main_id))
    except (AttributeError, OSError, TypeError, ValueError, OverflowError):
        return None


def _mesh_layout(meshes: list[dict], world: int | None) -> tuple[dict[str, int], dict]:
    """``({dim: degree}, {process group name: dim})`` of the device meshes a rank holds, by the
    mesh-consistency rule (:func:`pardiag.analyzer.analyses.mesh.mesh_dims`): a dimension name
    is a dimension when its groups partition the ranks and are no product of other dimensions'
    groups; names of one canonical dimension multiply (``dp_replicate`` × ``dp_shard``); size-1
    dimensions and names of no dimension (``WORLD``, ``BATCH``, ``LOSS_MESH``) are none."""
    from ..analyzer.analyses.mesh import dim_of, mesh_dims

    cands = [(name, ranks) for m in meshes for name, gs in (m.get("members") or {}).items()
             for ranks in gs]
    found = mesh_dims(cands, world=world)
    group_dims = {}
    for m in meshes:
        for name, pg in (m.get("groups") or {}).items():
            d = dim_of(name)
            if d in found.dims and int((m.get("dims") or {}).get(name) or 1) > 1:
                group_dims.setdefault(pg, d)
    return dict(found.dims), group_dims


def _fold_of(dims: dict, groups: list[dict], group_dims: dict, records: list[dict],
             world: int | None, meshes: list[dict]) -> dict:
    """Expert parallelism folded into data parallelism, from this rank's groups and the
    collectives it recorded (:func:`pardiag.analyzer.analyses.mesh.fold_expert_parallel`): sets
    ``dims["dp"]``, the dense groups' dimension (``dp``) and the expert-data-parallel groups'
    (``edp``) in ``group_dims``; returns ``{"ep": "dp"}``, or ``{}`` when not folded. A device
    mesh lists every group of its dimensions (``meshes``); a rank's own groups hold it only."""
    from ..analyzer.analyses.mesh import DP_OPS, dim_of, fold_expert_parallel, is_expert_dp

    ranks_of = {g["name"]: frozenset(int(r) for r in g.get("ranks") or []) for g in groups}
    label = {g["name"]: g.get("desc") or f"group {g['name']}" for g in groups}
    eps = [ranks_of[pg] for pg, d in group_dims.items() if d == "ep" and ranks_of.get(pg)]
    eps += [frozenset(int(r) for r in g) for m in meshes
            for name, gs in (m.get("members") or {}).items() if dim_of(name) == "ep" for g in gs]
    reducing = {(ranks_of[r["pg_name"]], label[r["pg_name"]]) for r in records
                if r.get("op") in DP_OPS and ranks_of.get(r.get("pg_name"))}
    world = world or max((len(g) for g in ranks_of.values()), default=0)
    fold, _ = fold_expert_parallel(dims, eps, sorted(reducing, key=lambda x: sorted(x[0])),
                                   world)
    if fold is None:
        return {}
    dims["dp"] = fold.dp
    by_ranks = {v: k for k, v in ranks_of.items()}
    for g in fold.dense_groups:
        if g in by_ranks:
            group_dims[by_ranks[g]] = "dp"
    for g in fold.expert_dp:
        if len(g) > 1 and frozenset(g) in by_ranks:
            group_dims[by_ranks[frozenset(g)]] = "edp"
    for g in groups:   # described so (mesh_edp, EXPERT_DATA_PARALLEL_GROUP)
        if is_expert_dp(g.get("desc")) and len(ranks_of[g["name"]]) > 1:
            group_dims[g["name"]] = "edp"
    return {"ep": "dp"}


def _replicas(dims: dict, groups: list[dict], records: list[dict], world: int | None) -> int:
    """Data parallelism no object names: the dimensions found (``dims``, no ``dp``) multiply to
    fewer ranks than the world, and a gradient reduction (all-reduce, reduce-scatter,
    all-gather) ran over a group of the whole world, so the world holds ``world / Π dims``
    replicas of those groups that reduce together — a script's own ``dist.all_reduce`` of its
    gradients over a (dp, cp) layout made of plain ``new_group`` calls. 0 when not."""
    from ..analyzer.analyses.mesh import DP_OPS

    prod = math.prod(int(v) for v in dims.values()) if dims else 1
    if not world or "dp" in dims or prod < 2 or world <= prod or world % prod:
        return 0
    size_of = {g["name"]: len(g.get("ranks") or []) or int(g.get("size") or 0) for g in groups}
    spans = any(r.get("op") in DP_OPS and size_of.get(r.get("pg_name")) == world
                for r in records)
    return world // prod if spans else 0


def _layout_of(parallel: dict, groups: list[dict], records: list[dict],
               world: int | None = None, a2a_role: str | None = None) -> dict:
    """Parallel dimensions and degrees from the detected objects and the records. Dimensions of
    degree 1 are left out: a group of one rank parallelizes nothing. A group that ran
    all-to-alls and that nothing else names is ``a2a_role``'s (``ep`` for expert dispatch,
    ``cp`` for a sequence exchange, from the rank's trace:
    :func:`pardiag.analyzer.analyses.op_roles.a2a_role_of`), and no dimension when it is None
    (unknown, or no trace to weigh)."""
    from .parallelism import canonical_dim

    dims, group_dims = _mesh_layout(parallel.get("meshes", []), world)
    size_of = {g["name"]: g["size"] for g in groups}
    for pg, dim in parallel.get("group_dims", {}).items():   # wrappers' groups (DDP, FSDP…)
        group_dims.setdefault(pg, dim)
    for r in records:  # all-to-all on a group nothing else explains: what they carry
        if r["op"] == "all_to_all" and r["pg_name"] not in group_dims and a2a_role:
            group_dims[r["pg_name"]] = a2a_role
    for g in groups:  # descriptions such as mesh_tp
        if g["name"] not in group_dims and canonical_dim(g.get("desc")):
            group_dims[g["name"]] = canonical_dim(g.get("desc"))
    group_dims = {pg: d for pg, d in group_dims.items() if (size_of.get(pg) or 2) > 1}
    for pg, dim in group_dims.items():
        if dim not in dims and (size_of.get(pg) or 0) > 1:
            dims[dim] = size_of[pg]
    folded = _fold_of(dims, groups, group_dims, records, world, parallel.get("meshes", []))
    pipe = parallel.get("pipeline")
    out: dict = {"dims": dims, "strategies": parallel.get("wrappers", []),
                 "group_dims": group_dims}
    if folded:
        out["folded"] = folded
    if pipe:
        if pipe.get("pp_group_size"):
            dims["pp"] = pipe["pp_group_size"]
        v = (pipe["stages"] // pipe["pp_group_size"]) if pipe.get("stages") and pipe.get(
            "pp_group_size") else None
        # the schedule's orders at other microbatch counts go to the pipeline sidecar only
        out["pipeline"] = {**{k: x for k, x in pipe.items() if k != "orders"},
                           "stages_per_rank": v}
    if parallel.get("fsdp_reshard_after_forward") is not None:
        out["fsdp_reshard_after_forward"] = parallel["fsdp_reshard_after_forward"]
    for key in ("fsdp_units", "fsdp_resharding_units"):
        if parallel.get(key) is not None:
            out[key] = parallel[key]
    if parallel.get("fsdp1_forward_prefetch") is not None:
        out["fsdp1_forward_prefetch"] = parallel["fsdp1_forward_prefetch"]
    if parallel.get("ddp_bucket_cap_bytes") is not None:
        out["ddp_bucket_cap_bytes"] = parallel["ddp_bucket_cap_bytes"]
    if parallel.get("ddp_param_bytes"):
        out["ddp_param_bytes"] = parallel["ddp_param_bytes"]
    ds = parallel.get("deepspeed")
    if ds:  # DeepSpeed's ZeRO settings (its static memory goes to the rank's metadata)
        out["deepspeed"] = {k: v for k, v in ds.items() if k != "static"}
        if int(ds.get("dp_size") or 1) > 1:
            dims.setdefault("dp", int(ds["dp_size"]))
    replicas = _replicas(dims, groups, records, world)
    if replicas:
        dims["dp"] = replicas
    if "tp" in dims and "tp" not in out["strategies"]:
        out["strategies"] = sorted([*out["strategies"], "tp"])
    for d in ("ep", "cp"):
        if d in dims and d not in out["strategies"]:
            out["strategies"] = sorted([*out["strategies"], d])
    return out


def _trace_memory_peaks(events) -> dict:
    """Peak ``Total Allocated``/``Total Reserved`` of the trace's ``[memory]`` events, per
    device type (``cpu``, ``cuda``), in bytes: what the allocator held during the active window."""
    mem = events[events["name"] == "[memory]"]
    out: dict[str, dict] = {}
    for args in mem["args"]:
        if not isinstance(args, dict):
            continue
        dev = {0: "cpu", 1: "cuda"}.get(args.get("Device Type"), str(args.get("Device Type")))
        d = out.setdefault(dev, {"peak_allocated_bytes": 0, "peak_reserved_bytes": 0})
        for key, name in (("Total Allocated", "peak_allocated_bytes"),
                          ("Total Reserved", "peak_reserved_bytes")):
            v = args.get(key)
            if isinstance(v, (int, float)) and v > d[name]:
                d[name] = int(v)
    return out


def _write_sidecars(out: Path, rank: int, captured: dict, p2p_records: list[dict],
                    pipe_records: Sequence[dict], pipe_layers: list[dict] | None = None,
                    optimizer_times: list[tuple[int, int, int]] | None = None,
                    size_scaling: list[dict] | None = None) -> tuple[dict, int]:
    """Comms and pipeline sidecars of a rank whose trace was written; returns (layout, n records).
    Also stores the trace's memory peaks in ``captured["trace_memory"]``."""
    from ..analyzer.trace import RankTrace, events_frame, read_trace_json
    from ..analyzer.trace.comm_records import (
        attach_trace_times,
        records_from_flight_recorder,
        records_from_p2p,
    )

    path = layout.trace_path(out, rank)
    doc = read_trace_json(path)
    events, threads, _, _ = events_frame(doc["traceEvents"], path)
    captured["trace_memory"] = _trace_memory_peaks(events)
    trace = RankTrace(rank=rank, path=path, events=events,
                      metadata={k: v for k, v in doc.items() if k != "traceEvents"},
                      rank_source="distributedInfo", thread_names=threads)
    groups = captured.get("groups", [])
    raw = (records_from_flight_recorder(captured.get("flight_recorder", []), groups)
           + records_from_p2p(p2p_records, groups))
    records = attach_trace_times(raw, trace)
    a2a_role = None
    if any(r.get("op") == "all_to_all" for r in records):   # what they carry, by evidence
        from ..analyzer.analyses.op_roles import a2a_role_of, uneven_splits
        from ..analyzer.per_rank.layout_marks import all_to_all_evidence
        from ..analyzer.per_rank.summary import summary_of

        a2a_role, _ = a2a_role_of(all_to_all_evidence(trace),
                                  uneven_splits(summary_of(trace).a2a))
    lay = _layout_of(captured.get("parallel", {}), groups, records,
                     int(os.environ.get("WORLD_SIZE") or 0) or None, a2a_role)
    for g in groups:
        g["dim"] = lay["group_dims"].get(g["name"])
    _write_json(layout.comms_path(out, rank), {
        **layout.sidecar_header("comms"), "rank": rank,
        "base_time_ns": trace.metadata.get("baseTimeNanoseconds"),
        "process_groups": groups, "records": records}, compact=True)
    base = trace.metadata.get("baseTimeNanoseconds")
    if pipe_records and isinstance(base, (int, float)):
        # every step is kept, not only the profiled ones: the records cost nothing to take and
        # the profiler itself slows CPU pipelines down, so unprofiled steps time the schedule best
        lo = float(events["ts"].min())
        hi = float((events["ts"] + events["dur"]).max())
        rows = []
        for r in list(pipe_records)[-MAX_PIPELINE_RECORDS:]:
            s = (r["start_ns"] - base) / 1000.0
            e = (r["end_ns"] - base) / 1000.0
            row = {"stage": r["stage"], "microbatch": r["microbatch"], "phase": r["phase"],
                   "start_us": s, "end_us": e, "optimizer_step": r["optimizer_step"],
                   "profiled": bool(s >= lo and e <= hi)}
            if "samples" in r:
                row["samples"] = r["samples"]
            rows.append(row)
        from ..analyzer.predict.whatif import chunk_cost_split
        samples = {r["stage"]: r["samples"] for r in pipe_records if "samples" in r}
        _write_json(layout.pipeline_path(out, rank), {
            **layout.sidecar_header("pipeline"), "rank": rank,
            "schedule": lay.get("pipeline"), "records": rows,
            # for the what-if model: per-layer forward times and the chunks' fixed shares
            "layers": pipe_layers or [],
            "size_scaling": size_scaling or [],
            "allreduce_calibration": captured.get("allreduce_calibration") or [],
            "ddp_calibration": captured.get("ddp_calibration") or {},
            "optimizer": [{"optimizer_step": st, "start_us": (a - base) / 1000.0,
                           "end_us": (b - base) / 1000.0}
                          for st, a, b in (optimizer_times or [])[-MAX_PIPELINE_RECORDS:]],
            "chunk_costs": chunk_cost_split(doc["traceEvents"], samples),
            "orders": ((captured.get("parallel") or {}).get("pipeline") or {}).get("orders")
            or {}}, compact=True)
    return lay, len(records)


def _write_rank_summary(out: Path, rank: int) -> None:
    """This rank's summary of its own trace (pardiag.analyzer.per_rank), so that
    `pardiag report` needs no central pass over the raw traces. A failure is a warning, not an
    error."""
    try:
        from ..analyzer.per_rank import summarize_file

        summarize_file(layout.trace_path(out, rank))
    except Exception as exc:
        print(f"pardiag: rank {rank}: could not write its summary: {type(exc).__name__}: {exc}",
              file=sys.stderr)


def _affinity() -> list[int] | None:
    """The cores this process may run on, or None where the OS does not say."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _pin_cpu(torch, local_rank: int, local_world: int) -> bool:
    """Give this rank its own share of the cores it may use: ``cores // local_world`` of them
    (at least one; the ranks of a node get disjoint shares while there are enough cores) and as
    many intra-op threads. Returns False where the OS cannot pin (then nothing changes)."""
    cores = _affinity()
    if not cores:
        return False
    k = max(1, len(cores) // max(1, local_world))
    lo = (local_rank * k) % len(cores)
    share = set(cores[lo:lo + k]) or {cores[local_rank % len(cores)]}
    try:
        os.sched_setaffinity(0, share)
    except OSError:
        return False
    torch.set_num_threads(len(share))
    return True


@dataclasses.dataclass
class _RankRun:
    """The state :func:`main`'s phases hand on to each other.

    Set by :func:`_configure`: the configuration and where this rank stands; by
    :func:`_make_profiler`: ``prof``; by :func:`_install_hooks`: the recorders, the optimizer
    stepper, the hooks to remove and the watchdog's stop event; by :func:`_run_script`:
    ``started`` and ``error``.
    """

    cfg: dict
    out: Path
    rank: int
    world_size: int
    local_rank: int
    #: the node's rank as torchrun or the configuration gives it (str, int or None)
    group: object
    #: the open stacks file of SIGUSR1 (:func:`_stack_dump_on_signal`), or None
    stacks: object
    pinned: bool
    cuda: bool
    trace_file: Path
    wait: int
    warmup: int
    traces_written: list[str] = dataclasses.field(default_factory=list)
    #: what only the live process can tell, taken when the trace is written
    captured: dict = dataclasses.field(default_factory=lambda: {"backend": None})
    #: what pardiag's own instrumentation did (RankMeta.instrumentation)
    instrumentation: dict = dataclasses.field(
        default_factory=lambda: {"post_window_s": None, "post_window_after_step": None})
    prof: object = None
    #: the always-on monitor (``--monitor``; :mod:`pardiag.collectors.monitor`), else None
    monitor: object = None
    #: the Kineto profiler of a monitored run's deep capture while it records
    capture_prof: object = None
    stepper: _OptimizerStepper | None = None
    batch: object = None
    p2p: object = None
    pipe: object = None
    modules: object = None
    hook_handles: list = dataclasses.field(default_factory=list)
    refused: list[tuple] = dataclasses.field(default_factory=list)
    #: the process groups the script destroyed, held until the process ends
    #: (:func:`_keep_destroyed_groups`)
    kept_groups: list = dataclasses.field(default_factory=list)
    stop_watchdog: threading.Event | None = None
    started: float = 0.0
    #: when the progress file was last touched (``--stall-timeout``; time.monotonic())
    progress_at: float = float("-inf")
    #: set while pardiag's own work holds the main thread between two steps (a trace's
    #: export): the watchdog then touches the progress file, so that it is no stall
    own_work: threading.Event = dataclasses.field(default_factory=threading.Event)
    #: the script has ended: the watchdog no longer touches the progress file
    steps_over: bool = False
    error: BaseException | None = None
    #: the script's module globals, held until the process ends (:func:`_run_script`)
    script_globals: dict | None = None
    #: SIGTERM waits (:func:`_stop_on_sigterm`): the trace or the rank's files are being written
    hold_term: bool = False
    #: a SIGTERM came while ``hold_term``
    terminated: bool = False

    @property
    def window_end(self) -> int:
        """The optimizer step count at which the profiler's active window ends."""
        return self.wait + self.warmup + self.cfg["active"]


def _configure(cfg: dict | None) -> _RankRun:
    """Read the configuration (``cfg`` or ``PARDIAG_PROFILE_CONFIG``) and the rank's place;
    claim its files (ends the process with exit code 2 when an earlier run's are there),
    set up SIGTERM's handling (:func:`_stop_on_sigterm`), the stack dump on SIGUSR1 and pin the
    CPU cores when asked. Returns the run with SIGTERM still held (``hold_term``): the caller
    ends the hold (:func:`_release_term`) where a :class:`_Terminated` is handled."""
    import torch

    cfg = cfg if cfg is not None else json.loads(os.environ[CONFIG_ENV])
    out = Path(cfg["out"])
    rank = int(os.environ.get("RANK", "0"))
    problem = claim_files(out, rank, bool(cfg.get("overwrite")))
    if problem:
        print(f"pardiag: error: {problem}", file=sys.stderr, flush=True)
        os._exit(2)
    group = cfg.get("node_rank", os.environ.get("GROUP_RANK"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    run = _RankRun(cfg=cfg, out=out, rank=rank, world_size=world_size, local_rank=local_rank,
                   group=group, stacks=None, pinned=False, cuda=torch.cuda.is_available(),
                   trace_file=layout.trace_path(out, rank), wait=cfg["wait"],
                   warmup=cfg["warmup"])
    # SIGTERM's handling comes before the stacks file: with SIGTERM's default, a rank stopped
    # between the two (torchrun forwards Ctrl-C as SIGTERM) ended at once and left the file
    # empty behind. The file is made with SIGTERM held, so it is never open but unrecorded.
    run.hold_term = True
    _stop_on_sigterm(run)
    run.stacks = _stack_dump_on_signal(out, rank)
    run.pinned = bool(cfg.get("pin_cpu")) and _pin_cpu(
        torch, local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return run


def _release_term(run: _RankRun) -> None:
    """End :func:`_configure`'s hold on SIGTERM: raises :class:`_Terminated` when one came
    meanwhile."""
    run.hold_term = False
    if run.terminated:
        raise _Terminated()


def _measure_peak(run: _RankRun, capture: bool = False) -> None:
    """On a CPU rank of a profiled run, the float32 matmul peak its MFU is computed against
    (:func:`pardiag.collectors.peak.measure`), into ``run.captured["peak_flops"]``; a
    monitored run measures it at its first deep capture's end (``capture``), every rank at the
    same step, and not before."""
    if run.cuda or (run.cfg.get("monitor_every") and not capture) or (
            capture and run.captured.get("peak_flops") is not None):
        return
    import torch

    from .peak import measure

    try:
        run.captured["peak_flops"] = measure(torch)
    except Exception as exc:  # extra information: never the run's failure
        print(f"pardiag: rank {run.rank}: could not measure its CPU peak: {exc}",
              file=sys.stderr)


#: A rank whose main thread has not taken a SIGTERM within this many seconds is blocked outside
#: Python (a collective that never completes): it ends at once, as SIGTERM's default would.
TERM_HANDLER_WAIT_S = 5.0


#: How long one part of pardiag's work after the script (the last export, the sidecars, the
#: wait for the other ranks) may take before the rank is taken as hung in it (seconds; the
#: environment variable ``PARDIAG_TEARDOWN_PART_S`` sets another).
def _teardown_part_s(default: float = 300.0) -> float:
    """``PARDIAG_TEARDOWN_PART_S``, else ``default``. ``pardiag profile`` refuses a bad value
    before the job starts; under ``pardiag wrap`` a rank says so once and uses the default
    (the variable is read when this module is imported: a traceback there would stop it)."""
    from pardiag.errors import PardiagError

    try:
        return env_seconds("PARDIAG_TEARDOWN_PART_S", default)
    except PardiagError as exc:
        print(f"pardiag: warning: {exc}; {default:g} s is used", file=sys.stderr)
        return default


TEARDOWN_PART_S = _teardown_part_s()


def _guard_teardown(run: _RankRun, limit_s: float | None = TEARDOWN_PART_S) -> None:
    """Arm (or, with ``limit_s`` None, disarm) the backstop of pardiag's work after the
    script: when the part does not end within ``limit_s``, every thread's stack goes to the
    rank's stacks file (:func:`_stack_dump_on_signal`; standard error without one) and the
    process ends with exit code 1. faulthandler's own thread does this without the interpreter
    lock, so it also ends a rank whose main thread holds the lock in a native deadlock; the
    launcher then names where it was (``launch._stacks_lines``)."""
    faulthandler.cancel_dump_traceback_later()
    if limit_s is not None:
        faulthandler.dump_traceback_later(limit_s, exit=True,
                                          file=run.stacks if run.stacks else sys.stderr)


def _stop_on_sigterm(run: _RankRun) -> None:
    """Make SIGTERM stop the script like any failure, so the rank still writes its files:
    torchrun ends the other ranks with SIGTERM when one fails and on Ctrl-C, and kills them
    (SIGKILL) only 30 s later. The signal raises :class:`_Terminated` in the main thread; while
    the trace or the rank's files are being written (``run.hold_term``) it is only recorded
    (``run.terminated``), so they are finished first.

    Python runs a signal's handler only when the main thread returns to the interpreter. A
    thread woken by the signal (:func:`signal.set_wakeup_fd`) ends the process with
    :data:`TERMINATED_EXIT_CODE` when the handler has not run :data:`TERM_HANDLER_WAIT_S`
    seconds later: a rank hung in a collective still stops."""
    import signal

    taken = threading.Event()

    def handler(signum, frame):
        taken.set()
        if run.hold_term:
            run.terminated = True
            return
        raise _Terminated()

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: SIGTERM keeps its default
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            if signal.SIGTERM in os.read(read_fd, 64) and not taken.wait(TERM_HANDLER_WAIT_S):
                _write_monitor_now(run.monitor)
                os._exit(TERMINATED_EXIT_CODE)

    threading.Thread(target=watch, name="pardiag-sigterm", daemon=True).start()


def _write_monitor_now(monitor) -> None:
    """The rank is hung and about to end (its main thread blocked in a collective that never
    completes, or in the script): write the steps ``monitor`` (a monitored run's, else None)
    holds, up to ``--monitor-every`` of them, the ones that led to the hang, from this thread.
    The blocked main thread records nothing meanwhile; whatever fails is left."""
    if monitor is None:
        return
    try:
        monitor.flush()
    except Exception:  # the rank is ending either way
        pass


def _on_trace_ready(run: _RankRun, prof) -> None:
    """The profiler's window ended: export the trace, then take what only the live process
    can tell (flight recorder, process groups, parallel layout, model shapes, peak memory)
    into ``run.captured``, timing each part into ``run.instrumentation``."""
    t0 = time.perf_counter()
    partial = layout.partial_trace_path(run.out, run.rank)
    # a SIGTERM waits for the whole of it: raised inside an import (the live objects' scan,
    # the window's metadata import modules on first use), it left a module half-initialized,
    # and the rank's later files failed on it ("partially initialized module 'pandas'")
    held, run.hold_term = run.hold_term, True
    try:
        _after_window(run, prof, partial, t0)
    finally:
        run.hold_term = held
    if run.terminated and not held:  # SIGTERM came meanwhile: stop now
        raise _Terminated()


#: zlib's default level: torch's own ``.gz`` export compresses at level 9, line by line, about
#: thirty times slower than level 6 in blocks, for files about 15% smaller (the DDP example's
#: traces: 147 kB at level 9, 170 kB at level 6).
TRACE_GZIP_LEVEL = 6


def _export_trace(prof, partial: Path) -> None:
    """The profiler's window as a gzipped Chrome trace at ``partial``: Kineto writes the JSON
    beside it, which is then compressed in 1 MiB blocks at :data:`TRACE_GZIP_LEVEL` and
    removed (an error leaves no uncompressed file behind)."""
    import gzip
    import shutil

    raw = partial.with_name(partial.name.removesuffix(".gz"))
    try:
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as fin, gzip.open(partial, "wb",
                                               compresslevel=TRACE_GZIP_LEVEL) as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    finally:
        raw.unlink(missing_ok=True)


def _after_window(run: _RankRun, prof, partial: Path, t0: float) -> None:
    """:func:`_on_trace_ready`'s work, with SIGTERM held."""
    import torch.distributed as dist

    from .comms import flight_recorder_entries, process_groups
    from .live_objects import live_instances, scan_classes
    from .memory import peak_memory
    from .parallelism import detect_parallelism
    from .shapes import model_shapes

    captured, rank = run.captured, run.rank
    # written under another name, then renamed: never a truncated trace under its name
    _export_trace(prof, partial)
    os.replace(partial, run.trace_file)
    run.traces_written.append(run.trace_file.name)
    t1 = time.perf_counter()
    # what only the live process can tell, taken while the script's objects exist
    captured["flight_recorder"] = flight_recorder_entries()
    t2 = time.perf_counter()
    captured["groups"] = process_groups()
    live = live_instances(scan_classes())   # one pass over the live objects
    t3 = time.perf_counter()
    captured["parallel"] = detect_parallelism(live)
    t4 = time.perf_counter()
    try:  # what constrains the split of the model (tensor shapes, heads, pipeline layers)
        captured["shapes"] = model_shapes(objects=live)
    except Exception as exc:  # extra information: never the run's failure
        print(f"pardiag: rank {rank}: could not record the model's shapes: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
    captured["peak"] = peak_memory(run.cuda)
    t5 = time.perf_counter()
    run.instrumentation["post_window_parts_s"] = {
        "export": t1 - t0, "flight_recorder": t2 - t1, "live_objects": t3 - t2,
        "layout": t4 - t3, "shapes": t5 - t4}
    if dist.is_available() and dist.is_initialized():  # the script may destroy it later
        captured["backend"] = str(dist.get_backend())
    t6 = time.perf_counter()
    try:   # a rank that never finishes (a hang, a kill) still leaves its settings
        _write_window_meta(run)
    except Exception as exc:  # extra information: never the run's failure
        print(f"pardiag: rank {rank}: could not write its metadata at the window's end: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
    run.instrumentation["post_window_parts_s"]["window_meta"] = time.perf_counter() - t6


def _write_window_meta(run: _RankRun) -> None:
    """The rank's metadata as it stands when the profiling window closes (status
    ``running``, :data:`pardiag.layout.WINDOW_META_TEMPLATE`), with the layout detected from
    the objects and the flight recorder's records (their trace times come later, with the
    sidecars): what a report reads of a rank that hangs or is killed before its script ends,
    whose final metadata is never written."""
    from ..analyzer.trace.comm_records import records_from_flight_recorder, records_from_p2p

    captured = run.captured
    groups = captured.get("groups", [])
    raw = (records_from_flight_recorder(captured.get("flight_recorder", []), groups)
           + records_from_p2p(run.p2p.records, groups))
    lay = _layout_of(captured.get("parallel", {}), groups, raw,
                     int(os.environ.get("WORLD_SIZE") or 0) or None)
    _write_meta(run, lay, len(raw), None, False, window=True)


class _NoProfiler:
    """The profiler of a monitored run: it records nothing."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def step(self) -> None:
        pass


def _make_profiler(run: _RankRun):
    """The torch profiler of the rank (CPU, and CUDA where there is a GPU) with its
    wait/warmup/active schedule; its trace is written by :func:`_on_trace_ready`. Returns it
    (not started)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    if run.cfg.get("monitor_every"):   # monitored: no Kineto at all
        return _NoProfiler()
    activities = [ProfilerActivity.CPU]
    if run.cuda:
        activities.append(ProfilerActivity.CUDA)
        # Kineto leaves CUPTI attached after the window unless TEARDOWN_CUPTI=1, which slows
        # every later kernel launch (pytorch#144455); torch sets it back to 0 itself where
        # CUDA graphs need CUPTI kept. A user's own setting stands.
        os.environ.setdefault("TEARDOWN_CUPTI", "1")
    return profile(
        activities=activities,
        schedule=schedule(wait=run.wait, warmup=run.warmup, active=run.cfg["active"], repeat=1),
        on_trace_ready=functools.partial(_on_trace_ready, run),
        record_shapes=True,
        profile_memory=True,
    )


def _on_step(run: _RankRun, count: int, optimizer) -> None:
    """After ``count`` optimizer steps. Outside the profiler's window only the step's times
    are taken: the profiler is no longer stepped once its window has ended, and the
    wrappers record no ranges (``recording``)."""
    import torch

    from .memory import static_memory

    wait, warmup, window_end = run.wait, run.warmup, run.window_end
    if run.cfg.get("stall_s") or run.cfg.get("progress"):
        _touch_progress(run)
    if run.monitor is not None:
        run.monitor.on_step(*run.stepper.last)
        if run.monitor.capture is not None:
            _deep_capture(run, count)
    if count == 1:   # the first step's forward has shown the per-rank batch
        run.batch.uninstall()
    if count == wait and run.monitor is None:   # the warmup steps see the ranges' cost too
        run.modules.install()
    if count == wait + warmup and run.cuda:
        torch.cuda.reset_peak_memory_stats()  # the active window starts now
    if count == wait + warmup + 1:  # end of the first active step: state and grads exist
        run.captured["static"] = static_memory(optimizer)
    if count > window_end:
        return
    run.pipe.install_deepspeed()   # once DeepSpeed's pipeline engine is imported
    recording = wait + warmup <= count < window_end
    run.pipe.recording = run.p2p.recording = recording
    if count == window_end:   # the trace's export and the live-object scans run now
        run.modules.uninstall()
        t0 = time.perf_counter()
        run.own_work.set()
        try:
            run.prof.step()
        finally:
            run.own_work.clear()
        run.instrumentation["post_window_s"] = time.perf_counter() - t0
        run.instrumentation["post_window_after_step"] = count - 1
    else:
        run.prof.step()


def _touch_progress(run: _RankRun) -> None:
    """Touch this rank's progress file (:func:`pardiag.layout.progress_path`) at most every
    :data:`PROGRESS_EVERY_S`: the launcher's ``--stall-timeout`` reads its modification time.
    A write that fails is left (the launcher then sees no progress, as for a stuck rank)."""
    now = time.monotonic()
    if now - run.progress_at < PROGRESS_EVERY_S:
        return
    run.progress_at = now   # (the watchdog thread sets it too: a race costs one extra touch)
    try:
        layout.progress_path(run.out, run.rank).touch()
        if run.steps_over:   # the script ended meanwhile (the watchdog thread's touch)
            layout.progress_path(run.out, run.rank).unlink(missing_ok=True)
    except OSError:
        pass


def _deep_capture(run: _RankRun, count: int) -> None:
    """A monitored run's deep capture (:mod:`pardiag.collectors.monitor`): after ``count``
    optimizer steps, start a Kineto profiler when the capture's first step comes next, step it
    through the capture (``ProfilerStep#N`` per step), and write ``capture-S/`` when its window
    ends (:func:`_capture_ready`). Its steps' point-to-point calls and pipeline chunks are
    recorded, as a profiled window's are."""
    from torch.profiler import ProfilerActivity, profile, schedule

    start, steps = run.monitor.capture
    if count == start and run.capture_prof is None and steps > 0:
        out = layout.capture_dir(run.out, start)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.cuda else [])
        with warnings.catch_warnings():   # "won't be using warmup": the capture needs none
            warnings.simplefilter("ignore", UserWarning)
            prof = profile(activities=acts, record_shapes=True, profile_memory=True,
                           schedule=schedule(skip_first=start, wait=0, warmup=0, active=steps,
                                             repeat=1),
                           on_trace_ready=functools.partial(_capture_ready, run, out))
        _number_steps_from(prof, start, steps)
        prof._pardiag_capture = True
        run.capture_prof = prof
        run.modules.install()   # the capture's module ranges, as a profiled window's
        if not run.cfg.get("hang_dumps"):   # else installed for the whole run
            run.p2p.install()   # its calls numbered from here: the same step on every rank
        run.pipe.install()
        run.p2p.records.clear()
        run.pipe.records.clear()
        run.pipe.recording = run.p2p.recording = True
        prof.start()
    elif run.capture_prof is not None:
        if count >= start + steps:
            run.pipe.recording = run.p2p.recording = False
        run.own_work.set()
        try:
            run.capture_prof.step()   # the window's last step writes the capture
        finally:
            run.own_work.clear()
        if count >= start + steps:
            prof, run.capture_prof = run.capture_prof, None
            run.modules.uninstall()
            run.pipe.uninstall()
            if not run.cfg.get("hang_dumps"):
                run.p2p.uninstall()
            prof.stop()
            run.monitor.capture = None   # done: the launcher's next request may come


def _number_steps_from(prof, start: int, steps: int) -> None:
    """Have ``prof`` (a profiler whose schedule skips ``start`` steps, then records ``steps``)
    start at step ``start``, so that its trace's steps are the run's own numbers
    (``ProfilerStep#start`` on). A profiler that does not keep its step and action where
    torch's does gets a schedule that records from its own step 0 instead (its steps then
    numbered from 0)."""
    from torch.profiler import ProfilerAction, schedule

    if hasattr(prof, "step_num") and hasattr(prof, "current_action"):
        prof.step_num = start
        prof.current_action = prof.schedule(start)
        if prof.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            return
    prof.step_num = 0
    prof.schedule = schedule(wait=0, warmup=0, active=steps, repeat=1)
    prof.current_action = prof.schedule(0)


def _capture_ready(run: _RankRun, out: Path, prof) -> None:
    """A deep capture's window ended: into ``out`` (``capture-S/``) its trace, and what a
    profiled window leaves in a run folder — the collective records of its steps (process
    groups, layout), the rank's metadata (host, measured CPU peak, status ``running``: the
    script goes on) — so that ``pardiag report capture-S`` reads what it reads of a profiled
    run. The monitored run goes on without what could not be written."""
    view = dataclasses.replace(run, out=out, trace_file=layout.trace_path(out, run.rank),
                               traces_written=[], instrumentation=dict(run.instrumentation))
    held, run.hold_term = run.hold_term, True   # as at a profiled window's end
    try:
        layout.sidecar_dir(out).mkdir(parents=True, exist_ok=True)
        _after_window(view, prof, layout.partial_trace_path(out, run.rank),
                      time.perf_counter())
        _measure_peak(run, capture=True)
        lay, n_records = _write_sidecars(out, run.rank, run.captured, run.p2p.records,
                                         run.pipe.records, run.pipe.layer_rows(),
                                         run.stepper.times)
        _write_meta(view, lay, n_records, None, False, capture=True)
    except Exception as exc:   # the monitored run goes on without it
        print(f"pardiag: rank {run.rank}: could not write the deep capture: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        run.hold_term = held
        run.p2p.records.clear()
        run.pipe.records.clear()
    if run.terminated and not held:  # SIGTERM came meanwhile: stop now
        raise _Terminated()


def _install_hooks(run: _RankRun) -> None:
    """Install the batch, point-to-point and pipeline recorders, the optimizer step hooks
    (:func:`_on_step`), the refusal of other profilers and the watchdog thread; stores them
    in ``run``."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    from .comms import P2PRecorder
    from .modules import ModuleRanges
    from .pipeline_recorder import PipelineRecorder
    from .shapes import BatchRecorder

    monitor_every = run.cfg.get("monitor_every")
    run.stepper = stepper = _OptimizerStepper(functools.partial(_on_step, run),
                                              keep_times=not monitor_every)
    run.batch = BatchRecorder()
    run.batch.install()
    run.p2p = P2PRecorder()
    run.pipe = PipelineRecorder(lambda: stepper.steps)
    # A monitored run installs them only for its deep capture (_deep_capture), and the
    # point-to-point recorder for the whole run where a hang dump may be asked (--timeout):
    # host work at a pipeline's sends and receives costs its steps far more than its own time.
    if not monitor_every or run.cfg.get("hang_dumps"):
        run.p2p.install()
    if not monitor_every:
        run.pipe.install()
    run.modules = ModuleRanges()
    if run.wait == 0 and not monitor_every:   # the window's ranges from the first call
        run.modules.install()
    if monitor_every:   # over the recorders' wrappers: restored first
        import torch

        from .monitor import Monitor
        run.monitor = Monitor(layout.monitor_path(run.out, run.rank), run.rank, monitor_every,
                              torch.cuda.memory_allocated if run.cuda else None,
                              layout.capture_request_path(run.out)
                              if run.cfg.get("monitor_capture") else None,
                              keep_calls=bool(run.cfg.get("monitor_calls", True)))
        run.monitor.install()
    # a window that starts with the script (wait = warmup = 0) records from the first call;
    # a monitored run has no window: they never record (every call would be kept)
    run.pipe.recording = run.p2p.recording = run.wait + run.warmup == 0 and not monitor_every
    run.hook_handles = [register_optimizer_step_pre_hook(stepper.pre),
                        register_optimizer_step_post_hook(stepper.post)]
    run.refused = _refuse_other_profilers(run.prof) + _keep_destroyed_groups(run.kept_groups)
    run.stop_watchdog = threading.Event()
    _watchdog(run.out, run.rank, run.p2p, run.stop_watchdog,
              run if run.cfg.get("stall_s") else None, run.monitor)


def _run_script(run: _RankRun) -> None:
    """Run the user's script as ``__main__`` under the started profiler; its exception (exit
    included) goes to ``run.error``. Then restore ``sys.argv``, remove the hooks, stop the
    profiler (a trace that cannot be written is a warning) and uninstall the recorders."""
    script = run.cfg["script"]
    # the CPU peak's measurement and the profiler's start run whole: a SIGTERM meanwhile waits
    # for them, then stops the rank as any other (its files cleaned up, one line)
    run.hold_term = True
    _measure_peak(run)
    run.started = time.time()
    run.error = None
    saved_argv = sys.argv
    sys.argv = [script, *run.cfg["args"]]
    sys.path.insert(0, str(Path(script).resolve().parent))
    run.prof.start()
    run.hold_term = False
    try:
        if run.terminated:
            raise _Terminated()
        run.script_globals = runpy.run_path(script, run_name="__main__")
    except BaseException as exc:  # the script's own failure: recorded, reported, exit code kept
        run.error = exc   # (its traceback's frames hold the script's globals)
    finally:
        # The script's objects are never freed in pardiag's code: held above and frozen out
        # of the cyclic collector, they live until os._exit, as a plain run's live until the
        # interpreter ends. Freed here, a DDP reducer's gloo process group joins its worker
        # thread while that thread waits for the interpreter lock this one holds (it drops
        # the last work's thread-local state): a deadlock at exit (benchmarks/teardown_matrix.py
        # runs every way a script ends; its results are in benchmarks/results/). The groups
        # the script destroyed are held too (_keep_destroyed_groups): its own frames free the
        # reducer that was their last owner.
        collecting = gc.isenabled()
        gc.disable()   # nothing is collected until the objects are frozen below
        if run.cfg.get("stall_s"):   # its steps are over: pardiag's work that follows, or
            # waiting at exit for a rank that hangs, is no progress and no stall of its own
            run.steps_over = True
            layout.progress_path(run.out, run.rank).unlink(missing_ok=True)
        _guard_teardown(run)
        sys.argv = saved_argv
        for h in run.hook_handles:
            h.remove()
        for cls, name, orig in run.refused:
            setattr(cls, name, orig)
        # from here on the rank writes its files: a SIGTERM waits for them (_stop_on_sigterm)
        run.hold_term = True
        if run.capture_prof is not None:   # a deep capture cut short (Ctrl-C, a failure):
            prof, run.capture_prof = run.capture_prof, None   # written as far as it got,
            try:                           # its scan of the live objects before they are
                prof.stop()                # frozen (gc.get_objects() leaves frozen ones out)
            except Exception as exc:
                print(f"pardiag: rank {run.rank}: could not write the deep capture: {exc}",
                      file=sys.stderr)
        gc.freeze()
        if collecting:
            gc.enable()
        try:
            run.prof.stop()
        except Exception as exc:  # a trace that cannot be written must not hide the script's result
            print(f"pardiag: rank {run.rank}: could not write the trace: {exc}", file=sys.stderr)
        if run.monitor is not None:
            run.monitor.close()
        run.p2p.uninstall()
        run.pipe.uninstall()
        run.batch.uninstall()
        run.modules.uninstall()
    if run.terminated and run.error is None:  # SIGTERM while the last trace was written
        run.error = _Terminated()


def _size_scaling(run: _RankRun, lap) -> list[dict]:
    """Of a pipelined script that ran without error: how the stages' chunks scale with the
    microbatch size, and the all-reduce and DDP calibrations (into ``run.captured``); ``lap``
    times each part. Returns the scaling rows (``[]`` where it cannot be measured)."""
    import torch.distributed as dist

    from .calibration import allreduce_calibration, ddp_calibration

    scaling: list[dict] = []
    pipe, captured = run.pipe, run.captured
    try:  # how the stages' chunks scale with the microbatch size (what-if model)
        scaling = pipe.size_scaling()
        lap("size_scaling")
        # what a pipeline run cannot show: the group's all-reduce cost (more DP instead of PP)
        captured["allreduce_calibration"] = allreduce_calibration()
        lap("allreduce_calibration")
        if captured["allreduce_calibration"]:   # every rank is there: DDP's own cost
            m = ((captured.get("parallel") or {}).get("pipeline") or {}).get("microbatches")
            captured["ddp_calibration"] = ddp_calibration(
                pipe.grad_bytes(), pipe.dp_rows(dist.get_world_size(), m))
            lap("ddp_calibration")
    except Exception as exc:
        print(f"pardiag: rank {run.rank}: no microbatch-size measurement: {exc}",
              file=sys.stderr)
    return scaling


def _after_script(run: _RankRun) -> tuple[dict | None, int]:
    """The work after the script, each part timed into
    ``run.instrumentation["after_script_parts_s"]``: the wrappers' own cost, the microbatch
    scaling (:func:`_size_scaling`), the sidecars and the rank's summary (where a trace was
    written), the static memory. Returns ``(layout or None, collective records written)``."""
    from .memory import static_memory

    rank, pipe, p2p = run.rank, run.pipe, run.p2p
    # what the wrappers add to each call outside the window, measured (not assumed)
    try:
        run.instrumentation["wrapper_cost_us"] = {"p2p": p2p.self_cost_us(),
                                                  "chunk": pipe.self_cost_us()}
        if run.monitor is not None:   # what --monitor adds per step, by its own measure
            mon = run.monitor
            run.instrumentation["wrapper_cost_us"]["monitor_call"] = mon.self_cost_us()
            run.instrumentation["monitor_calls"] = {"calls": mon.calls_total,
                                                    "steps": mon.steps_total}
    except Exception as exc:  # extra information: never the run's failure
        print(f"pardiag: rank {rank}: could not time its own wrappers: {exc}", file=sys.stderr)
    lay, n_records = None, 0
    scaling: list[dict] = []
    # the work after the script, timed per part (seconds): what a user waits for at the end
    after: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        after[name] = round(now - clock, 4)
        clock = now

    if run.traces_written and pipe.records and run.error is None:
        scaling = _size_scaling(run, lap)
    if run.traces_written:
        try:
            lay, n_records = _write_sidecars(run.out, rank, run.captured, p2p.records,
                                            pipe.records, pipe.layer_rows(), run.stepper.times,
                                            scaling)
        except Exception as exc:  # sidecars are extra: the trace and metadata still count
            print(f"pardiag: rank {rank}: could not write collective records: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
        lap("sidecars")
        _guard_teardown(run, None)   # the summary reads the trace file only: no deadlock there
        _write_rank_summary(run.out, rank)
        _guard_teardown(run)
        lap("rank_summary")
    run.instrumentation["after_script_parts_s"] = after
    if "static" not in run.captured and run.stepper.optimizer is not None:
        run.captured["static"] = static_memory(run.stepper.optimizer)
    return lay, n_records


def _write_meta(run: _RankRun, lay: dict | None, n_records: int, code: int | None,
                failed: bool, window: bool = False, capture: bool = False
                ) -> layout.RankMeta:
    """Write the rank's metadata (``rank{R}.meta.json``, atomically) and return it; with
    ``window``, as it stands when the profiling window closes (``rank{R}.meta.window.json``,
    status ``running``, no exit code); with ``capture``, a deep capture's (in ``run.out``,
    the capture's folder: status ``running``, the script goes on). The final metadata removes
    the window's."""
    import torch
    import torch.distributed as dist

    from .topology import topology

    captured, stepper, batch, p2p, pipe = (run.captured, run.stepper, run.batch, run.p2p,
                                           run.pipe)
    shapes = captured.get("shapes")
    if shapes is not None or batch.samples is not None:
        shapes = msgspec.structs.replace(shapes or layout.ModelShapes(),
                                         batch_samples=batch.samples, batch_module=batch.module,
                                         batch_calls=batch.calls if batch.samples else None,
                                         batch_shape=batch.shape if batch.samples else None,
                                         batch_integer=batch.integer if batch.samples else None)
    topo = captured.get("topology")
    if topo is None:   # once per rank: nvidia-smi takes a while
        topo = captured["topology"] = topology(run.local_rank)
    meta = layout.RankMeta(
        rank=run.rank, world_size=run.world_size, local_rank=run.local_rank, pid=os.getpid(),
        host=topo.get("host"), cpu_count=topo.get("cpu_count"),
        intra_op_threads=torch.get_num_threads(), cpu_affinity=_affinity(),
        pinned_by_pardiag=run.pinned,
        nccl_version=topo.get("nccl_version"), nvidia_smi_topo=topo.get("nvidia_smi_topo"),
        torch_version=str(torch.__version__), pardiag_version=__version__,
        backend=captured["backend"] or (str(dist.get_backend())
                                        if dist.is_available() and dist.is_initialized() else None),
        **_device_info(torch), peak_flops=captured.get("peak_flops"),
        optimizer_steps=stepper.steps,
        # every counted optimizer step, epoch µs: unprofiled steps time the script as it runs
        optimizer_step_times_us=[[st, a / 1000.0, b / 1000.0]
                                 for st, a, b in stepper.times[-MAX_PIPELINE_RECORDS:]],
        trace_file=run.traces_written[-1] if run.traces_written else None,
        comm_records=n_records,
        # DeepSpeed's optimizer steps a flat fp32 partition: its engine knows what each part
        # holds (parallelism.deepspeed_settings), the stepped optimizer does not
        memory=_plain({"static": ((captured.get("parallel") or {}).get("deepspeed") or {}).get(
                           "static") or captured.get("static"), **captured.get("peak", {}),
                       "trace_peaks": captured.get("trace_memory")}),
        layout=_plain(lay), shapes=shapes, started_unix=run.started,
        ended_unix=None if window or capture else time.time(), exit_code=code,
        instrumentation=_plain({
            **run.instrumentation,
            "p2p_calls": {"window": p2p.calls_recorded, "outside": p2p.calls_outside},
            "chunk_calls": {"window": pipe.calls_recorded, "outside": pipe.calls_outside}}),
        status="running" if window or capture else "error" if failed else "ok",
        error=None if not failed else _one_line(run.error),
        env={k: v for k, v in sorted(os.environ.items()) if k.startswith(layout.ENV_PREFIXES)},
        node_rank=int(run.group) if str(run.group).isdigit() else None,
        launch_id=os.environ.get("PARDIAG_LAUNCH_ID"))
    path = (layout.window_meta_path if window else layout.rank_meta_path)(run.out, run.rank)
    path.with_suffix(".json.tmp").write_bytes(layout.encode_sidecar(meta))
    os.replace(path.with_suffix(".json.tmp"), path)
    if not window:   # superseded
        layout.window_meta_path(run.out, run.rank).unlink(missing_ok=True)
    return meta


def user_traceback(tb):
    """``tb`` without its first frames in pardiag's wrapper and ``runpy``: the traceback a
    plain ``python script.py`` prints, starting at the script's own frame (None when the
    error arose before any, e.g. a SyntaxError, whose message names the file and line)."""
    ours = {os.path.realpath(__file__), os.path.realpath(runpy.__file__)}
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name != "<frozen runpy>" and os.path.realpath(name) not in ours:
            break   # (runpy is a frozen module from Python 3.11)
        tb = tb.tb_next
    return tb


def _finish(run: _RankRun, meta: layout.RankMeta, code: int, failed: bool,
            before_exit) -> None:
    """Report the script's failure, or wait for the other ranks (:func:`_exit_together`);
    call ``before_exit``, stop the watchdog, drop an empty stacks file, flush and end the
    process with ``code`` (never returns)."""
    import torch.distributed as dist

    error, rank = run.error, run.rank
    if isinstance(error, _Terminated):  # where the script was is no news: one line
        print(f"pardiag: rank {rank} {error}; its files are written", file=sys.stderr, flush=True)
    elif failed and isinstance(error, SystemExit):
        # sys.exit(N), argparse's usage error: Python prints no traceback for these, and the
        # script has said why (a message given to sys.exit is printed, as Python does)
        if not isinstance(error.code, int) and error.code is not None:
            print(error.code, file=sys.stderr)
        print(f"pardiag: rank {rank}'s script exited with code {code}", file=sys.stderr,
              flush=True)
    elif failed:
        traceback.print_exception(type(error), error, user_traceback(error.__traceback__))
        print(f"pardiag: rank {rank} raised {meta.error}", file=sys.stderr, flush=True)
    elif run.terminated:  # the others are being stopped: nobody to wait for
        pass
    elif dist.is_available() and dist.is_initialized():
        # then os._exit, without destroying the group (FACTS §1: 20/20 clean)
        _guard_teardown(run)
        _exit_together(dist, run.world_size)
    if before_exit is not None:
        try:
            before_exit(meta)
        except Exception as exc:  # the run file is extra: the rank's own files are written
            print(f"pardiag: rank {rank}: could not write the node's run file: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
    run.stop_watchdog.set()
    _guard_teardown(run, None)
    _drop_empty_stacks(run)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _drop_empty_stacks(run: _RankRun) -> None:
    """Close the stacks file of SIGUSR1 and remove it when nothing was asked for: no empty file
    is left behind."""
    if run.stacks is None:
        return
    run.stacks.close()
    try:
        if layout.stacks_path(run.out, run.rank).stat().st_size == 0:
            layout.stacks_path(run.out, run.rank).unlink()
    except OSError:
        pass


def main(cfg: dict | None = None, before_exit=None) -> None:
    """Run the user's script as ``__main__`` under the profiler; never returns.

    Args:
        cfg: the configuration (as ``PARDIAG_PROFILE_CONFIG`` holds it: ``out``, ``script``,
            ``args``, ``wait``, ``warmup``, ``active``, ``pin_cpu``, ``overwrite``, optional
            ``node_rank``); default: read from that variable.
        before_exit: called with the rank's :class:`~pardiag.layout.RankMeta` after the final
            barrier, before the process ends (``pardiag wrap`` writes the node's run file).
    """
    import torch  # noqa: F401 - loaded before the script, as the phases below need it
    import torch.distributed  # noqa: F401
    import torch.optim.optimizer  # noqa: F401
    import torch.profiler  # noqa: F401

    from . import (  # noqa: F401 - the instrumentation, loaded before the script
        calibration,
        comms,
        live_objects,
        memory,
        parallelism,
        pipeline_recorder,
        shapes,
        topology,
    )

    run = _configure(cfg)                  # configuration, files claimed, stacks, pinning
    try:
        _release_term(run)                 # a SIGTERM held while the stacks file was made
        run.prof = _make_profiler(run)     # the profiler and its schedule
        _install_hooks(run)                # recorders, optimizer hooks, watchdog
    except _Terminated as exc:             # stopped before the script started: nothing to keep
        print(f"pardiag: rank {run.rank} {exc}, before the script started", file=sys.stderr,
              flush=True)
        _drop_empty_stacks(run)
        os._exit(TERMINATED_EXIT_CODE)
    _run_script(run)                       # the script itself, then the hooks removed
    lay, n_records = _after_script(run)    # sidecars and summary, timed
    _stopped_after_peer_loss(run)          # a lost peer in a job being stopped
    code = _exit_code_of(run.error)
    failed = run.error is not None and code != 0
    meta = _write_meta(run, lay, n_records, code, failed)
    _finish(run, meta, code, failed, before_exit)   # wait for the other ranks, exit


if __name__ == "__main__":
    main()
