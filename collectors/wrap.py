"""``pardiag wrap``: the per-rank entry for launchers pardiag does not start.

Each process a launcher starts runs ``python -m pardiag wrap [OPTIONS] SCRIPT -- ARGS`` (or
``torchrun ... -m pardiag wrap ...``, ``accelerate launch -m pardiag wrap ...``). The process
finds its rank, sets the variables ``torch.distributed``'s ``env://`` initialisation reads where
the launcher did not (so an unmodified script's ``init_process_group()`` works under ``srun``
and ``mpirun``), and runs the script as :mod:`pardiag.collectors.rank_entry` does under
``pardiag profile``: the same files in the same run folder. Local rank 0 of each node then
writes the node's part of the run file (:func:`pardiag.layout.node_run_path`).

Where the rank comes from, first match wins:

* torchrun, accelerate, DeepSpeed's launcher: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (node), ``MASTER_ADDR``/``MASTER_PORT`` already set;
* SLURM (``srun``): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``,
  tasks on this node from ``SLURM_TASKS_PER_NODE``; ``MASTER_ADDR`` the first host of
  ``SLURM_JOB_NODELIST`` (``SLURM_STEP_NODELIST``), ``MASTER_PORT`` 29500 + job id mod 1000;
* Open MPI (``mpirun``): ``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK``, ``_LOCAL_SIZE``;
  ``MASTER_ADDR`` must be given (``mpirun -x MASTER_ADDR=host``) unless all ranks share one
  host (then 127.0.0.1), ``MASTER_PORT`` 29500 unless given;
* none: one process, rank 0 of 1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import socket
import sys
import time
from pathlib import Path

from pardiag import layout
from pardiag.errors import SIGTERM_EXIT_CODE, PardiagError
from pardiag.version import __version__

#: The port SLURM jobs meet on: 29500 + (job id mod PORT_SPAN), so two jobs sharing a node
#: rarely collide; MASTER_PORT set by the user wins.
PORT_SPAN = 1000
#: How long local rank 0 waits for its node's other ranks to write their metadata (seconds).
NODE_WAIT_S = 30.0


@dataclasses.dataclass(frozen=True)
class RankEnv:
    """Where this process sits in the job.

    Attributes:
        source: ``torchrun`` (the ``RANK`` variables were set), ``slurm``, ``openmpi`` or
            ``single``.
        rank, world_size, local_rank, local_world_size: as torchrun names them.
        node_rank: the node's index in the job (None: unknown).
        nnodes: nodes in the job (None: unknown).
        set_env: the variables this entry sets (those the launcher left unset).
    """

    source: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int | None
    nnodes: int | None
    set_env: dict[str, str]


def expand_nodelist(spec: str) -> list[str]:
    """Host names of a SLURM node list: ``node[01-03,07],gpu5`` → node01, node02, node03,
    node07, gpu5 (what ``scontrol show hostnames`` prints; zero padding kept).

    Raises:
        ValueError: a range such as ``[3-1]`` or an unclosed bracket.
    """
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*|[^,]+", spec):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            if "[" in part or "]" in part:
                raise ValueError(f"cannot read the SLURM node list {spec!r}")
            hosts.append(part)
            continue
        prefix, ranges, rest = m.groups()
        tails = expand_nodelist(rest) if rest else [""]
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
                raise ValueError(f"cannot read the SLURM node list {spec!r}")
            for i in range(int(lo), int(hi or lo) + 1):
                for t in tails:
                    hosts.append(f"{prefix}{str(i).zfill(len(lo))}{t}")
    return hosts


def _tasks_on_node(spec: str, node: int) -> int | None:
    """Tasks on node ``node`` from ``SLURM_TASKS_PER_NODE`` (``2(x3),1``: 2 on nodes 0-2, 1 on
    node 3); None when it cannot be read."""
    i = 0
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        count, times = int(m.group(1)), int(m.group(2) or 1)
        if node < i + times:
            return count
        i += times
    return None


def rank_env(env: dict[str, str] | None = None) -> RankEnv:
    """This process's place in the job from the launcher's environment (see the module's
    docstring for the order and the defaults).

    Raises:
        PardiagError: a variable is not a number, or an Open MPI job spans hosts and no
            ``MASTER_ADDR`` is set.
    """
    env = dict(os.environ if env is None else env)
    set_env: dict[str, str] = {}

    def num(name: str, default: int | None = None) -> int | None:
        v = env.get(name)
        if v is None or v == "":
            return default
        if not v.strip().isdigit():
            raise PardiagError(f"pardiag wrap: {name}={v!r} is not a number")
        return int(v)

    def put(name: str, value) -> None:
        if not env.get(name):
            env[name] = set_env[name] = str(value)

    if env.get("RANK") and env.get("WORLD_SIZE"):
        rank, world = num("RANK"), num("WORLD_SIZE")
        local = num("LOCAL_RANK", 0)
        lws = num("LOCAL_WORLD_SIZE", None)
        node = num("GROUP_RANK", None)
        nn = num("GROUP_WORLD_SIZE", None)
        if node is None and lws:
            node = rank // lws
        put("LOCAL_RANK", local)
        return RankEnv("torchrun", rank, world, local, lws or 1, node,
                       nn or (world // lws if lws else None), set_env)
    if env.get("SLURM_PROCID") is not None and env.get("SLURM_NTASKS"):
        rank, world = num("SLURM_PROCID"), num("SLURM_NTASKS")
        local, node = num("SLURM_LOCALID", 0), num("SLURM_NODEID", 0)
        nn = num("SLURM_NNODES", None) or num("SLURM_JOB_NUM_NODES", None)
        lws = _tasks_on_node(env.get("SLURM_TASKS_PER_NODE", ""), node) or num(
            "SLURM_NTASKS_PER_NODE", None) or (world if nn == 1 else 1)
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        if not env.get("MASTER_ADDR"):
            try:
                hosts = expand_nodelist(nodelist) if nodelist else []
            except ValueError as exc:
                raise PardiagError(f"pardiag wrap: {exc}; set MASTER_ADDR") from None
            put("MASTER_ADDR", hosts[0] if hosts else "127.0.0.1")
        put("MASTER_PORT", 29500 + (num("SLURM_JOB_ID", 0) or 0) % PORT_SPAN)
        for k, v in (("RANK", rank), ("WORLD_SIZE", world), ("LOCAL_RANK", local),
                     ("LOCAL_WORLD_SIZE", lws), ("GROUP_RANK", node)):
            put(k, v)
        return RankEnv("slurm", rank, world, local, lws, node, nn, set_env)
    if env.get("OMPI_COMM_WORLD_RANK") is not None and env.get("OMPI_COMM_WORLD_SIZE"):
        rank, world = num("OMPI_COMM_WORLD_RANK"), num("OMPI_COMM_WORLD_SIZE")
        local = num("OMPI_COMM_WORLD_LOCAL_RANK", 0)
        lws = num("OMPI_COMM_WORLD_LOCAL_SIZE", 1)
        if not env.get("MASTER_ADDR"):
            if lws != world:
                raise PardiagError(
                    f"pardiag wrap: an Open MPI job of {world} ranks on several hosts needs "
                    f"MASTER_ADDR (rank 0's host): mpirun -x MASTER_ADDR=HOST -x MASTER_PORT=PORT")
            put("MASTER_ADDR", "127.0.0.1")
        put("MASTER_PORT", 29500)
        node = rank // lws if lws else None   # ranks placed by node, the same count on each
        for k, v in (("RANK", rank), ("WORLD_SIZE", world), ("LOCAL_RANK", local),
                     ("LOCAL_WORLD_SIZE", lws)):
            put(k, v)
        return RankEnv("openmpi", rank, world, local, lws, node,
                       world // lws if lws else None, set_env)
    return RankEnv("single", 0, 1, 0, 1, 0, 1, set_env)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WrapConfig:
    """What ``pardiag wrap`` runs (one rank of a job someone else launched).

    Attributes:
        script, args, out, wait, warmup, active, overwrite, pin_cpu: as in
            :class:`pardiag.collectors.launch.ProfileConfig`; ``out`` is shared by the ranks
            (each writes only its own files; a shared file system gives one run folder, else
            each node's folder holds its ranks and ``pardiag report`` joins the folders).
        monitor_every, monitor_calls: ``--monitor`` as in ``ProfileConfig`` (no launcher of
            pardiag's follows the records: the findings come with ``pardiag report``).
    """

    script: Path
    args: tuple[str, ...] = ()
    out: Path
    wait: int = 1
    warmup: int = 1
    active: int = 3
    overwrite: bool = False
    pin_cpu: bool = False
    monitor_every: int | None = None
    monitor_calls: bool = True


def _write_node_part(cfg: WrapConfig, out: Path, where: RankEnv, started: float, meta) -> None:
    """Local rank 0's part of the run file: the node's ranks (the metadata with its host and
    node rank found in ``out``), their exit codes; node 0 also the job. A script that destroyed
    its process group ends without the final barrier: the node's other ranks' metadata is
    waited for, at most ``NODE_WAIT_S``."""
    lo = where.rank - where.local_rank
    expected = range(lo, lo + where.local_world_size)
    deadline = time.time() + NODE_WAIT_S
    while True:
        metas = {}
        for f in layout.sidecar_dir(out).glob("rank*.meta.json"):
            try:
                m = layout.decode_sidecar(f.read_bytes(), "rank")
            except (OSError, ValueError):
                continue
            if m.host == meta.host and m.node_rank == meta.node_rank and (
                    m.ended_unix or 0) >= started - 1.0 and m.launch_id is None:
                metas[m.rank] = m
        if all(r in metas for r in expected) or time.time() > deadline:
            break
        time.sleep(0.2)
    failed = {str(r): m.error or f"exit code {m.exit_code}" for r, m in sorted(metas.items())
              if m.status == "error" or m.exit_code}
    # the first failure's code (by when the ranks ended), not a SIGTERM's from the launcher
    # stopping the other ranks after it
    ended = sorted(metas.values(), key=lambda m: (m.ended_unix or 0.0, m.rank))
    codes = [int(m.exit_code) for m in ended if m.exit_code]
    codes = [c for c in codes if c != SIGTERM_EXIT_CODE] or codes
    missing = [r for r in expected if r not in metas]
    run = layout.RunFile(
        pardiag_version=__version__,
        command=shlex.join(["pardiag", "wrap", str(cfg.script),
                            *(["--monitor", "--monitor-every", str(cfg.monitor_every)]
                              if cfg.monitor_every else []), "--", *cfg.args]),
        script=str(cfg.script), script_args=list(cfg.args), world_size=where.world_size,
        nproc_per_node=where.local_world_size, nnodes=where.nnodes, node_rank=where.node_rank,
        schedule=layout.ProfilerSchedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active),
        started_unix=started, ended_unix=time.time(),
        exit_code=codes[0] if codes else (1 if missing else 0),
        nodes={str(meta.host): sorted(metas)}, layout=_job_layout(metas),
        backend=meta.backend, torch_version=meta.torch_version,
        failed_ranks=failed, missing_ranks=missing, monitor_every=cfg.monitor_every)
    part = layout.node_run_path(out, where.node_rank if where.node_rank is not None
                                else "-" + re.sub(r"[^\w.-]", "_", socket.gethostname()))
    tmp = part.with_suffix(".json.tmp")
    tmp.write_bytes(layout.encode_sidecar(run))
    os.replace(tmp, part)


def _job_layout(metas: dict) -> dict | None:
    lays = {r: m.layout for r, m in metas.items() if m.layout}
    if not lays:
        return None
    first = lays[min(lays)]
    return {k: first[k] for k in ("dims", "strategies", "pipeline", "fsdp_reshard_after_forward")
            if k in first and first[k] is not None}


def run_wrap(cfg: WrapConfig) -> None:
    """Run one rank of a job under the profiler (never returns: the process ends with the
    script's exit code, as under ``pardiag profile``).

    Raises:
        PardiagError: torch is missing, the script is missing, the run folder cannot be made,
            or the rank cannot be told (:func:`rank_env`).
    """
    import importlib.util

    from . import rank_entry

    if importlib.util.find_spec("torch") is None:
        raise PardiagError("pardiag wrap needs torch: pip install 'pardiag[profile]'")
    if not Path(cfg.script).is_file():
        raise PardiagError(f"{cfg.script}: no such script")
    where = rank_env()
    os.environ.update(where.set_env)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "20000")   # as pardiag profile sets it
    out = Path(cfg.out).resolve()
    try:
        layout.sidecar_dir(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PardiagError(f"{out}: cannot create the run folder ({exc.strerror or exc})") from None
    if out.exists() and not out.is_dir():
        raise PardiagError(f"{out}: exists and is not a folder")
    monitored = cfg.monitor_every is not None
    rank_cfg = {"out": str(out), "script": str(Path(cfg.script).resolve()),
                "args": list(cfg.args), "wait": 0 if monitored else cfg.wait,
                "warmup": 0 if monitored else cfg.warmup,
                "active": 0 if monitored else cfg.active, "pin_cpu": cfg.pin_cpu,
                "overwrite": cfg.overwrite, "node_rank": where.node_rank,
                "monitor_every": cfg.monitor_every, "monitor_calls": cfg.monitor_calls}
    os.environ[rank_entry.CONFIG_ENV] = json.dumps(rank_cfg)   # scripts may check it
    os.environ.pop("PARDIAG_LAUNCH_ID", None)
    started = time.time()
    finish = ((lambda meta: _write_node_part(cfg, out, where, started, meta))
              if where.local_rank == 0 else None)
    if where.source != "single" and where.rank == 0:
        print(f"pardiag wrap: {where.world_size} rank(s) from {where.source}"
              + (f" ({', '.join(f'{k}={v}' for k, v in where.set_env.items())})"
                 if where.set_env else "") + f"; run folder {out}", file=sys.stderr, flush=True)
    rank_entry.main(rank_cfg, before_exit=finish)
