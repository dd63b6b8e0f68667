"""Ground-truth generator of multi-rank Kineto (PyTorch profiler) traces.

`generate(job, out_dir)` simulates a distributed training job in true time (µs) and writes one
Chrome-trace JSON file per rank (and per profiling window), as the PyTorch profiler / Kineto
would, together with the `Truth` of what was planted. `random_job(rng, kind, metadata)` draws a
valid job of one of `KINDS`.

What is modelled
----------------
* Each rank runs its step program on a compute stream and on communication streams (one main
  comm stream, one per peer and direction for point-to-point). A CPU thread runs ahead of the GPU
  and launches every kernel (`cudaLaunchKernel` / `hipLaunchKernel` / `urEnqueueKernelLaunch`
  with `correlation`; kernel and launch share `correlation` and `External id`; an `ac2g` flow
  pair joins them), blocking only on the synchronisation at the end of each step.
* Collectives (Kineto trace format: `record_param_comms` args, `distributedInfo.pg_config`,
  `ProfilerStep#N` user annotations). A member's kernel starts when its stream reaches it.
  Release-together ops (all_reduce, all_gather, reduce_scatter, all_to_all) end on every member
  at max(arrivals) + transfer. Rooted broadcasts end on the root first and one hop later on each
  next rank of the chain. send/recv end together at max(arrivals) + transfer.
  transfer = latency + S / algbw with algbw = busbw / factor, the bus-bandwidth factors of
  nccl-tests doc/PERFORMANCE.md (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all
  (n-1)/n; broadcast, send/recv 1), busbw lower across hosts.
* One `all_to_all_single` on NCCL launches group-size `ncclDevKernel_SendRecv` kernels in sequence
  (a known Kineto trace shape); the op spans its first kernel's start to its last kernel's end.
* Coalesced DP reductions: per member op a `record_param_comms` (sharing one `Seq`) without a
  launch, then one `nccl:coalesced` op launching one kernel per member, kernels carrying no
  comm metadata. Counting: **every member all_reduce counts as one issued
  all_reduce** (a block of 3 buckets is 3 all_reduces, each with its own byte size and kernel).
* NCCL <= 2.13 kernel names, where an all_reduce may run as a `...SendRecv...` kernel and only
  the launching CPU op `nccl:all_reduce` tells the op; RCCL's
  `ncclDevKernel_Generic`; Intel XPU oneCCL kernels on SYCL queues; custom
  comm kernel names (matched by `Truth.comm_kernel_regex`).
* Clocks: recorded(t) = t + host offset + drift * t / 1e6 (t from the job start); ranks of one
  host share a clock. With `gpu_only_drift` only GPU timestamps drift, CPU ones keep the offset
  (Kineto converts GPU timestamps with one offset taken at start).
* Profiler-start skew: the rank starts (and its trace opens) late, so the others wait at the
  first collective; it is not a straggler. Dropped kernels: CUPTI buffer loss, the kernel event
  vanishes while its CPU ops and launch remain.
* Pipelines (GPipe, 1F1B, interleaved with 2 chunks per rank in breadth-first "looped" order)
  over send/recv; the bubble (Narayanan et al., SC'21: (p-1)/(m+p-1)) is measured on the
  simulated timeline.
* Metadata levels: "seq" (newest torch: `Seq`, group ranks, comm args copied onto kernels),
  "names" (group names/descriptions and sizes, no Seq/ranks), "none" (no record_param_comms,
  no pg_config), "records" (a pardiag run folder: the "none" trace gzipped as
  `rank{R}.trace.json.gz` plus `pardiag/run.json`, `pardiag/rank{R}.meta.json` and
  `pardiag/rank{R}.comms.json` with every collective and p2p op: group, seq, bytes,
  issue/start/end on the rank's trace clock).

* Expert parallelism folded into data parallelism (kind `moe_folded`, Megatron's MoE parallel
  folding): a mesh (`edp`, `ep`) whose dense gradients are all-reduced over every rank and each
  expert's over its `edp` group; the true layout is dp = the world, ep inside it.

* Ring attention (kind `cp_ring`): context parallelism whose key/value shards go around the
  cp group with send/recv between attention's blocks (TransformerEngine's KV ring); the truth
  has cp and no pipeline.

* FSDP through functional collectives (kind `simple_fsdp`: SimpleFSDP, torch.compile'd FSDP):
  the gathers and scatters are `_c10d_functional::*` ops and no FSDP range is written; the
  truth is data parallelism, no tensor parallelism.

* Ulysses sequence parallelism (kind `ulysses`): context parallelism whose q, k, v go to head
  shards and back with even all-to-alls around attention (DeepSpeed-Ulysses' `_SeqAllToAll`);
  the truth has cp and no expert parallelism.

* DeepSpeed's pipeline engine (kind `deepspeed_pipe`): 1F1B over send/recv on groups DeepSpeed
  leaves undescribed (`undefined`), the pipe axis outermost (`PipeDataParallelTopology`), and
  the step's loss broadcast from the last stage over the pipe group (`_aggregate_total_loss`).

* Traces whose truth is unknown (kind `opaque_a2a`): even all-to-alls on undescribed groups
  with nothing next to them that routes tokens or attends: expert or context parallelism alike.
  `Truth.unknown` names the dims a report must not state.

* Input-bound ranks (`data_loading_us`): the rank's DataLoader iterator
  (`enumerate(DataLoader)#...__next__` on the host) at each step's start, before its first launch.
* The true critical path (`Truth.path`): every time point of the simulation keeps the one it
  waited for (a kernel's start: its stream's previous end or its launch; an op's end: its last
  arrival; the host at a synchronisation: the compute stream), so each recorded step's path is
  walked back from its last end, as pardiag's GPU step windows define the steps.

Not modelled: the gloo backend (`backend="gloo"` raises NotImplementedError), memory events,
CPU-bound phases, torchtitan's flattened meshes.

Run `python -m benchmarks.multirank_gen --smoke DIR` to write one job of every kind x metadata.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

try:  # orjson when available: faster, same output
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

KINDS: tuple[str, ...] = (
    "lockstep", "straggler", "clock_offset", "drift", "start_skew", "dropped",
    "multi_kernel_a2a", "coalesced", "old_nccl", "rccl", "xpu_oneccl", "custom_kernel",
    "rooted_broadcast", "pipeline", "windows", "mesh_layout", "independent_groups",
    "pipeline_straggler", "moe_folded", "cp_ring", "simple_fsdp", "ulysses", "deepspeed_pipe",
    "opaque_a2a", "pipeline_host_straggler",
)
METADATA: tuple[str, ...] = ("records", "seq", "names", "none")
OPS: tuple[str, ...] = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv")
RELEASE_TOGETHER = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SCHEDULES = ("ddp", "fsdp", "tp", "pp_gpipe", "pp_1f1b", "pp_interleaved", "ep")
BASE_US = 1_700_000_000_000_000.0
ELEM = 2  # bf16


@dataclass
class Job:
    """A simulated job. `steps` is the number of recorded steps per profiling window.
    Extra knobs beyond the brief: `broadcasts_per_step` (rooted broadcasts from the DP/world
    group's first rank at each step's start), `compute_scale` (multiplies compute time; long
    steps make drift visible) and `replicas` (independent copies of the mesh in one world, such
    as inference engines or replicas that no collective joins: ranks r*S..r*S+S-1 of S = the
    mesh's size form replica r) and `data_loading_us` (rank -> µs its DataLoader iterator takes
    on the host at each step's start, before the step's first launch: an input-bound rank)
    and `host_slow_ranks` (rank -> µs its host spends at each step's start outside any
    operator, a sleep or Python work, before its first launch: a straggler whose extra time is
    no computation)
    and `cp_ring` (context parallelism as ring attention: the key/value shards passed around
    the cp group with send/recv between attention's blocks, instead of Ulysses' all-to-alls)
    and `functional_fsdp` (FSDP's gathers and scatters issued as functional collectives, as
    SimpleFSDP and torch.compile'd FSDP issue them: no wrapper range names them)
    and `family` (the framework whose group descriptions the traces carry, one of `_DESC`;
    drawn from the seed when empty) and `loss_broadcast` (DeepSpeed's pipeline: the last stage
    broadcasts the step's loss over the pipe group) and `opaque_a2a` (the ep all-to-alls with no
    router and no expert kernel next to them: nothing tells routing from a sequence exchange)."""
    mesh: dict[str, int]
    schedule: str
    steps: int = 4
    microbatches: int = 4
    ranks_per_host: int = 8
    slow_ranks: dict[int, float] = field(default_factory=dict)
    host_slow_ranks: dict[int, float] = field(default_factory=dict)
    host_offset_us: dict[int, float] = field(default_factory=dict)
    host_drift_us_per_s: dict[int, float] = field(default_factory=dict)
    gpu_only_drift: bool = False
    start_skew_us: dict[int, float] = field(default_factory=dict)
    metadata: str = "seq"
    kernels: str = "nccl"
    coalesced: bool = False
    drop: dict[int, list[int]] = field(default_factory=dict)
    windows: int = 1
    jitter_us: float = 0.0
    seed: int = 0
    backend: str = "gpu"
    broadcasts_per_step: int = 0
    compute_scale: float = 1.0
    replicas: int = 1
    cp_ring: bool = False
    functional_fsdp: bool = False
    data_loading_us: dict[int, float] = field(default_factory=dict)
    family: str = ""
    loss_broadcast: bool = False
    opaque_a2a: bool = False


@dataclass
class Truth:
    """What `generate` planted. `counts` counts every op the program issued in the recorded
    windows (a coalesced block of k all_reduces counts k; a multi-kernel all_to_all counts once;
    ops whose kernels were dropped still count). `algbw_gbps` is given for release-together
    types with one size and one transfer time; `bubble` is measured on the simulated timeline
    (idle share of the F/B span of each pipeline group's step, averaged over stages and steps).
    `path` is the true critical path of the recorded steps (see `_true_path`). `unknown` names
    the dims whose role the traces cannot tell (their degree is in no layout a report may
    state). `straggler_judged` is False where a planted host delay's true cost
    (:func:`_host_delay_cost`) lies within a factor of 2 of the bound a straggler must cost
    (:data:`TRUE_COST_MIN_US`, :data:`TRUE_COST_MIN_SHARE`): naming it or nobody is right."""
    world: int
    layout: dict[str, int]
    hosts: dict[int, int]
    offset_us: dict[int, float]
    drift_us_per_s: dict[int, float]
    straggler: int | None
    counts: dict[int, dict[str, int]]
    bytes: dict[str, list[int]]
    algbw_gbps: dict[str, float]
    bubble: float | None
    comm_kernel_regex: str | None
    files: list[str]
    notes: str
    path: dict | None = None
    unknown: tuple[str, ...] = ()
    straggler_judged: bool = True


# --------------------------------------------------------------------------------------------
# Mesh and process groups


def _dims(job: Job) -> list[tuple[str, int]]:
    """The mesh's dims, led by a ``replica`` dim when there are several replicas (no group of
    the replica dim ever communicates)."""
    dims = [(d, int(n)) for d, n in job.mesh.items()]
    return [("replica", int(job.replicas))] + dims if job.replicas > 1 else dims


def _world(job: Job) -> int:
    return int(np.prod([n for _, n in _dims(job)])) if job.mesh else 1


def _coords(rank: int, dims: list[tuple[str, int]]) -> list[int]:
    out = []
    for _, n in reversed(dims):
        out.append(rank % n)
        rank //= n
    return out[::-1]


def _rank_of(coords: list[int], dims: list[tuple[str, int]]) -> int:
    r = 0
    for c, (_, n) in zip(coords, dims):
        r = r * n + c
    return r


def _group(rank: int, dims: list[tuple[str, int]], dim: str) -> tuple[int, ...]:
    names = [d for d, _ in dims]
    if dim not in names:
        return (rank,)
    i = names.index(dim)
    c = _coords(rank, dims)
    out = []
    for k in range(dims[i][1]):
        c2 = list(c)
        c2[i] = k
        out.append(_rank_of(c2, dims))
    return tuple(out)


_DESC = {
    "plain": {"dp": "dp", "fsdp": "fsdp", "tp": "tp", "pp": "pp", "ep": "ep", "cp": "cp",
              "edp": "edp"},
    "torchtitan": {"dp": "mesh_dp_replicate", "fsdp": "mesh_dp_shard", "tp": "mesh_tp",
                   "pp": "mesh_pp", "ep": "mesh_ep", "cp": "mesh_cp",
                   "edp": "mesh_dp_shard_mod_ep"},
    "megatron": {"dp": "DATA_PARALLEL_GROUP", "fsdp": "INTRA_PARTIAL_DATA_PARALLEL_GROUP",
                 "tp": "TENSOR_MODEL_PARALLEL_GROUP", "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
                 "ep": "EXPERT_MODEL_PARALLEL_GROUP", "cp": "CONTEXT_PARALLEL_GROUP",
                 "edp": "EXPERT_DATA_PARALLEL_GROUP"},
    "deepspeed": {d: "undefined" for d in ("dp", "fsdp", "tp", "pp", "ep", "cp", "edp")},
}


def _pg_tables(job: Job, P: dict) -> tuple[dict, dict, dict]:
    """Per rank: {group ranks: (pg_name, pg_desc, dim)} (the group an op on those ranks runs
    on), pg_count, and every group the rank belongs to as [(ranks, pg_name, pg_desc, dim)]
    (twins of the same ranks included: what pg_config lists). Names are creation-order ids; with
    the "local" scheme each rank creates only its own groups, in its own order, so one group can
    have different names on different ranks."""
    dims, world = _dims(job), _world(job)
    fam = dict(_DESC[P["family"]])
    for key, by_family in _EXTRA_DESC.items():
        fam[key] = by_family.get(P["family"], "undefined")
    fam["replica_world"] = "undefined"
    allr = tuple(range(world))
    per_dim = []
    for d, n in dims:
        if n <= 1 or n == world or d == "replica":
            continue
        gs = sorted({_group(r, dims, d) for r in range(world)})
        per_dim.append((d, gs))
    per_dim += _extra_groups(job, P, dims, world)
    tables, counts, listing = {}, {}, {}
    for r in range(world):
        lst = [(allr, "0", "default_pg", "world")]
        if P["naming"] == "mesh":
            nxt = 1
            for d, gs in per_dim:
                for g in gs:
                    if r in g:
                        lst.append((g, str(nxt), fam.get(d, d), d))
                    nxt += 1
            counts[r] = nxt
        else:
            order = list(per_dim)
            random.Random(job.seed * 1009 + r).shuffle(order)
            for k, (d, gs) in enumerate(order, start=1):
                mine = [g for g in gs if r in g]
                if mine:
                    lst.append((mine[0], str(k), fam.get(d, d), d))
            counts[r] = len(order) + 1
        for d, n in dims:  # a dim spanning the world uses the default group
            if n == world and n > 1:
                lst[0] = (allr, "0", "default_pg", d)
        t: dict = {}
        for g, name, desc, d in sorted(lst, key=lambda x: x[3] in _EXTRA_DESC
                                       or x[3] == "replica_world"):
            t.setdefault(g, (name, desc, d))  # a mesh dim's group before its twins
        tables[r], listing[r] = t, sorted(lst, key=lambda x: int(x[1]))
    return tables, counts, listing


def _extra_groups(job: Job, P: dict, dims, world: int) -> list[tuple[str, list]]:
    """Groups that are no dimension of the mesh, as real frameworks create them:

    * torchtitan flattens data parallelism for the loss reduction: ``mesh_dp`` =
      dp_replicate x dp_shard (torchtitan's ``parallel_dims.py``);
    * Megatron-LM keeps a gloo twin of its data-parallel group (``DATA_PARALLEL_GROUP_GLOO``)
      and, with a pipeline, an ``EMBEDDING_GROUP`` of the first and last stages
      (Megatron-LM's ``parallel_state.py``);
    * several replicas: each replica's own world (``replica_world``).
    """
    names = {d: n for d, n in dims if n > 1}
    out: list[tuple[str, list]] = []
    if P["family"] == "torchtitan" and "dp" in names and "fsdp" in names:
        out.append(("flat_dp", sorted({_flat_dp(r, dims) for r in range(world)})))
    if P["family"] == "megatron" and "dp" in names:
        out.append(("dp_gloo", sorted({_group(r, dims, "dp") for r in range(world)})))
    if P["family"] == "megatron" and "pp" in names:
        out.append(("embedding", sorted({_embedding(r, dims) for r in range(world)})))
    if job.replicas > 1 and len(set(names) - {"replica"}) > 1:
        out.append(("replica_world", sorted({_replica_world(r, dims) for r in range(world)})))
    return out


def _flat_dp(rank: int, dims) -> tuple[int, ...]:
    return tuple(sorted({x for y in _group(rank, dims, "dp") for x in _group(y, dims, "fsdp")}))


def _embedding(rank: int, dims) -> tuple[int, ...]:
    g = _group(rank, dims, "pp")
    return (g[0], g[-1])


def _replica_world(rank: int, dims) -> tuple[int, ...]:
    size = int(np.prod([n for d, n in dims if d != "replica"]))
    r0 = rank - rank % size
    return tuple(range(r0, r0 + size))


_EXTRA_DESC = {
    "flat_dp": {"torchtitan": "mesh_dp"},
    "dp_gloo": {"megatron": "DATA_PARALLEL_GROUP_GLOO"},
    "embedding": {"megatron": "EMBEDDING_GROUP"},
}


# --------------------------------------------------------------------------------------------
# Programs


@dataclass
class _Ins:
    kind: str  # comp | comm | wait | waitall | sync | step | data
    dur: float = 0.0
    name: str = ""
    op: str = ""
    ranks: tuple = ()
    stream: str = "comm"
    dep: str = "end"
    sizes: tuple = ()
    nk: int = 1
    peer: int = -1
    ref: int = -1
    root: int = -1
    step: int = 0
    tag: str = ""
    wrap: str = ""


def _params(job: Job) -> dict:
    g = np.random.default_rng([job.seed, 7])
    s = job.compute_scale
    P = {
        "layers": int(g.integers(2, 5)), "F": float(g.uniform(250, 600)) * s,
        "buckets": int(g.integers(2, 5)), "ar_n": int(2 ** g.integers(20, 23)),
        "tp_n": int(2 ** g.integers(18, 21)), "ag_n": int(2 ** g.integers(19, 22)),
        "a2a_n": int(2 ** g.integers(20, 23)), "bc_n": int(2 ** g.integers(18, 21)),
        "p2p_n": int(2 ** g.integers(17, 20)),
        "family": str(g.choice(list(_DESC))), "naming": str(g.choice(["mesh", "local"])),
        "p2p_style": str(g.choice(["dst_src", "rank_only"])),
        "fsdp_style": int(g.integers(0, 2)), "old_sendrecv_ar": bool(g.integers(0, 2)),
        "rccl_generic": bool(g.integers(0, 2)), "gap_steps": 2,
    }
    if job.family:
        P["family"] = job.family
    if P["family"] == "megatron":
        P["p2p_style"] = "dst_src"
    P["total_steps"] = job.steps * job.windows + P["gap_steps"] * (job.windows - 1)
    P["step0"] = int(g.integers(1, 11))
    return P


def _comm(op, ranks, sizes, stream="comm", dep="end", nk=1, peer=-1, wrap="") -> _Ins:
    return _Ins("comm", op=op, ranks=tuple(ranks), sizes=tuple(sizes), stream=stream, dep=dep,
                nk=nk, peer=peer, wrap=wrap)


def _multi_kernel(job: Job, n: int) -> int:
    return n if job.kernels in ("nccl", "nccl_old") else 1


def _layer_pass(job, P, rank, dims, prog, fwd: bool, dp_role: str):
    """Forward or backward over the layers, with each dim's collectives."""
    names = {d for d, n in dims if n > 1}
    L, F = P["layers"], P["F"]
    layers = range(L) if fwd else range(L - 1, -1, -1)
    per_bucket = max(1, math.ceil(L / P["buckets"]))
    for i, _layer in enumerate(layers):
        if dp_role == "fsdp":
            g = _group(rank, dims, "fsdp" if "fsdp" in names else "dp")
            n = len(g)
            prog.append(_comm("all_gather", g, (P["ag_n"] * n * ELEM,), dep="start",
                              wrap="_c10d_functional::all_gather_into_tensor"
                              if job.functional_fsdp else ""))
            prog.append(_Ins("wait", ref=len(prog) - 1))
        if "cp" in names and job.cp_ring:   # ring attention: a block per round, then pass it on
            g = _group(rank, dims, "cp")
            i = g.index(rank)
            nxt, prv = g[(i + 1) % len(g)], g[(i - 1) % len(g)]
            for _ in range(len(g) - 1):
                prog.append(_Ins("comp", dur=(0.5 * F if fwd else F) / len(g),
                                 name="attention" if fwd else "attention_bwd"))
                prog.append(_comm("send", g, (P["a2a_n"] * ELEM,), stream=f"p2p:{rank}>{nxt}",
                                  peer=nxt))
                prog.append(_comm("recv", g, (P["a2a_n"] * ELEM,), stream=f"p2p:{prv}>{rank}",
                                  peer=prv))
                prog.append(_Ins("wait", ref=len(prog) - 1))
            prog.append(_Ins("comp", dur=(0.5 * F if fwd else F) / len(g),
                             name="attention" if fwd else "attention_bwd"))
        elif "cp" in names:   # Ulysses: q, k, v to head shards, attention, back to sequence shards
            g = _group(rank, dims, "cp")
            for k in (range(4) if fwd else range(3, -1, -1)):
                if k == 3:
                    prog.append(_Ins("comp", dur=0.5 * F if fwd else F,
                                     name="attention" if fwd else "attention_bwd"))
                prog.append(_comm("all_to_all", g, (P["a2a_n"] * ELEM,)))
                prog.append(_Ins("wait", ref=len(prog) - 1))
        prog.append(_Ins("comp", dur=F if fwd else 2 * F, name="gemm"))
        if "tp" in names:
            prog.append(_comm("all_reduce", _group(rank, dims, "tp"), (P["tp_n"] * ELEM,),
                              wrap="_c10d_functional::all_reduce"))
            prog.append(_Ins("wait", ref=len(prog) - 1))
        if "ep" in names:
            g = _group(rank, dims, "ep")
            if fwd and not job.opaque_a2a:   # the gate: router logits and their top-k
                prog.append(_Ins("comp", dur=0.05 * F, name="router"))
            for k in range(2):
                prog.append(_comm("all_to_all", g, (P["a2a_n"] * ELEM,),
                                  nk=_multi_kernel(job, len(g)),
                                  wrap="_c10d_functional::all_to_all_single"))
                prog.append(_Ins("wait", ref=len(prog) - 1))
                if k == 0:
                    prog.append(_Ins("comp", dur=0.5 * F if fwd else F,
                                     name="gemm" if job.opaque_a2a else "expert"))
        if fwd:
            continue
        if dp_role == "fsdp":
            g = _group(rank, dims, "fsdp" if "fsdp" in names else "dp")
            prog.append(_comm("reduce_scatter", g, (P["ag_n"] * len(g) * ELEM,),
                              wrap="_c10d_functional::reduce_scatter_tensor"
                              if job.functional_fsdp else ""))
            if "fsdp" in names and "dp" in names:  # HSDP: the shard's gradient across replicas
                prog.append(_comm("all_reduce", _group(rank, dims, "dp"), (P["ag_n"] * ELEM,)))
        if dp_role == "ddp" and not job.coalesced and ((i + 1) % per_bucket == 0 or i == L - 1):
            prog.append(_comm("all_reduce", _group(rank, dims, "dp"), (P["ar_n"] * ELEM,)))
    if not fwd and "edp" in names:
        # expert parallelism folded into data parallelism: the dense gradients over every
        # rank, each expert's over the ranks that hold it (the expert-data-parallel group)
        prog.append(_comm("all_reduce", tuple(range(_world(job))), (P["ar_n"] * ELEM,)))
        prog.append(_comm("all_reduce", _group(rank, dims, "edp"), (P["ar_n"] * ELEM,)))
    if not fwd and dp_role == "ddp" and job.coalesced:
        nb = math.ceil(L / per_bucket)
        prog.append(_comm("all_reduce", _group(rank, dims, "dp"), (P["ar_n"] * ELEM,) * nb))


def _dp_role(job: Job, dims) -> str:
    names = {d for d, n in dims if n > 1}
    if job.schedule == "fsdp" or "fsdp" in names:
        return "fsdp" if ("fsdp" in names or "dp" in names) else ""
    return "ddp" if "dp" in names else ""


def _pp_order(job: Job, p: int, s: int, m: int) -> list[tuple[str, int, int]]:
    """(F|B, chunk, microbatch) in the order stage s runs them."""
    if job.schedule == "pp_interleaved":
        return ([("F", c, i) for c in range(2) for i in range(m)]
                + [("B", c, i) for c in (1, 0) for i in range(m)])
    if job.schedule == "pp_gpipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    w = min(p - s - 1, m)
    out = [("F", 0, i) for i in range(w)]
    for i in range(m - w):
        out += [("F", 0, w + i), ("B", 0, i)]
    return out + [("B", 0, i) for i in range(m - w, m)]


def _pp_step(job, P, rank, dims, prog):
    names = [d for d, _ in dims]
    p = dims[names.index("pp")][1]
    v = 2 if job.schedule == "pp_interleaved" else 1
    c = _coords(rank, dims)
    s = c[names.index("pp")]
    g = _group(rank, dims, "pp")
    V, f = p * v, P["F"] * P["layers"] / v / max(1, job.microbatches) * 2

    def rank_of_vs(vs):
        return g[vs % p]

    nbytes = (P["p2p_n"] * ELEM,)
    for kind, ch, _mb in _pp_order(job, p, s, job.microbatches):
        vs = ch * p + s
        src = vs - 1 if kind == "F" else vs + 1
        dst = vs + 1 if kind == "F" else vs - 1
        if 0 <= src < V:
            peer = rank_of_vs(src)
            prog.append(_comm("recv", g, nbytes, stream=f"p2p:{peer}>{rank}", peer=peer))
            prog.append(_Ins("wait", ref=len(prog) - 1))
        prog.append(_Ins("comp", dur=f if kind == "F" else 2 * f, name="gemm", tag="pp"))
        if "tp" in names and dims[names.index("tp")][1] > 1:
            prog.append(_comm("all_reduce", _group(rank, dims, "tp"), (P["tp_n"] * ELEM,),
                              wrap="_c10d_functional::all_reduce"))
            prog.append(_Ins("wait", ref=len(prog) - 1))
        if 0 <= dst < V:
            peer = rank_of_vs(dst)
            prog.append(_comm("send", g, nbytes, stream=f"p2p:{rank}>{peer}", peer=peer))
    if job.loss_broadcast:   # DeepSpeed: the last stage's loss to every stage of the pipe
        prog.append(_Ins("comm", op="broadcast", ranks=tuple(g), sizes=(4,), root=g[-1]))
        prog.append(_Ins("wait", ref=len(prog) - 1))
    if _dp_role(job, dims) == "ddp":
        nb = P["buckets"] if job.coalesced else 1
        prog.append(_comm("all_reduce", _group(rank, dims, "dp"), (P["ar_n"] * ELEM,) * nb))


def _program(job: Job, P: dict, rank: int) -> list[_Ins]:
    dims = _dims(job)
    names = {d for d, n in dims if n > 1}
    prog: list[_Ins] = []
    bgroup = _group(rank, dims, "dp") if "dp" in names else _replica_world(rank, dims)
    flat = P["family"] == "torchtitan" and {"dp", "fsdp"} <= names
    for st in range(P["total_steps"]):
        prog.append(_Ins("step", step=st))
        if job.data_loading_us.get(rank):
            prog.append(_Ins("data", dur=job.data_loading_us[rank]))
        for _ in range(job.broadcasts_per_step):
            prog.append(_comm("broadcast", bgroup, (P["bc_n"] * ELEM,), dep="none"))
        if "pp" in names:
            _pp_step(job, P, rank, dims, prog)
        else:
            role = _dp_role(job, dims)
            _layer_pass(job, P, rank, dims, prog, True, role)
            _layer_pass(job, P, rank, dims, prog, False, role)
        if flat:  # the loss, reduced over torchtitan's flattened dp mesh
            prog.append(_comm("all_reduce", _flat_dp(rank, dims), (4,),
                              wrap="_c10d_functional::all_reduce"))
            prog.append(_Ins("wait", ref=len(prog) - 1))
        prog.append(_Ins("waitall"))
        prog.append(_Ins("comp", dur=0.15 * P["F"], name="optim"))
        prog.append(_Ins("sync"))
    for ins in prog:  # step index of every instruction
        if ins.kind == "step":
            cur = ins.step
        ins.step = cur
    return prog


# --------------------------------------------------------------------------------------------
# Simulation


def _xfer(op: str, nbytes: int, ranks: tuple, rph: int) -> float:
    n = max(2, len(ranks))
    inter = len({r // rph for r in ranks}) > 1
    busbw, lat = (22.0, 22.0) if inter else (170.0, 9.0)
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
              "reduce_scatter": (n - 1) / n, "all_to_all": (n - 1) / n}.get(op, 1.0)
    return lat + nbytes / (busbw / factor * 1e3)


def _resolve(ins: _Ins, arr: dict[int, float], rph: int) -> tuple[dict, list[float]]:
    """Kernel intervals per member, and the transfer time of each member op."""
    mx = max(arr.values())
    out: dict[int, list[tuple[float, float]]] = {}
    if ins.op == "broadcast":
        T = _xfer(ins.op, ins.sizes[0], ins.ranks, rph)
        hop = 0.2 * T
        i0 = ins.ranks.index(ins.root) if ins.root >= 0 else 0
        for k, r in enumerate(ins.ranks[i0:] + ins.ranks[:i0]):   # the root's chain
            out[r] = [(arr[r], mx + T + k * hop)]
        return out, [T]
    if len(ins.sizes) > 1:  # coalesced block: members back to back
        Ts, t, ends = [], mx, []
        for sz in ins.sizes:
            T = _xfer(ins.op, sz, ins.ranks, rph)
            Ts.append(T)
            ends.append((t, t + T))
            t += T + 2.0
        for r in arr:
            out[r] = [(arr[r], ends[0][1])] + ends[1:]
        return out, Ts
    T = _xfer(ins.op, ins.sizes[0], ins.ranks, rph)
    if ins.nk > 1:
        T = max(T, 30.0 * ins.nk)
        seg = T / ins.nk
        gap = min(5.0, 0.1 * seg)
        for r in arr:
            ks = []
            for i in range(ins.nk):
                s = arr[r] if i == 0 else mx + i * seg
                e = mx + (i + 1) * seg - (gap if i < ins.nk - 1 else 0.0)
                ks.append((s, e))
            out[r] = ks
        return out, [T]
    for r in arr:
        out[r] = [(arr[r], mx + T)]
    return out, [T]


class _Node:
    """A time point of the simulated job and the one it waited for: the interval from `pred`'s
    time to `t` is `cat` — "compute" (a kernel on `rank`'s compute stream), "data" (its
    DataLoader on the host), "other" (host work and launches) or ("comm", key): a transfer, from
    the op's last arrival (`pred`, on that rank) to its end on `rank`."""

    __slots__ = ("t", "rank", "cat", "pred")

    def __init__(self, t: float, rank: int, cat, pred: _Node | None):
        self.t, self.rank, self.cat, self.pred = t, rank, cat, pred


class _Rank:
    def __init__(self, rank: int, prog: list[_Ins], start: float, seed: int):
        self.rank, self.prog, self.pc = rank, prog, 0
        self.tc = self.cpu = start
        self.last_start = start
        # what the compute stream, the host and the last kernel start waited for
        self.tc_node = self.cpu_node = self.start_node = _Node(start, rank, "other", None)
        self.streams: dict[str, object] = {}
        self.keys: dict[int, tuple] = {}
        self.counter: dict[tuple, int] = {}
        self.seq: dict[tuple, int] = {}
        self.queues: dict[str, list[dict]] = {}
        self.recs: list[dict] = []
        self.rng = np.random.default_rng([seed, rank, 11])

    def cost(self, c: float) -> float:
        return c * float(self.rng.uniform(1.0, 1.25))


def _stream_free(st: _Rank, s: str, results: dict) -> float | None:
    v = st.streams.get(s, 0.0)
    if isinstance(v, tuple):
        res = results.get(v)
        return None if res is None else res[0][st.rank][-1][1]
    return v


def _stream_node(st: _Rank, s: str, graph: dict) -> _Node | None:
    """The node of the stream's last op's end on `st` (None: the stream never ran)."""
    v = st.streams.get(s)
    return graph["end"][v][st.rank] if isinstance(v, tuple) else None


def _park_comm(st: _Rank, ins: _Ins, idx: int) -> None:
    """The CPU issues the op now (launch times, key, seq); its stream starts it when free."""
    dep_t = {"end": st.tc, "start": st.last_start + 10.0, "none": 0.0}[ins.dep]
    dep_node = {"end": st.tc_node, "none": None,
                "start": _Node(st.last_start + 10.0, st.rank, "other", st.start_node)}[ins.dep]
    c0 = st.cpu
    nl = ins.nk if len(ins.sizes) == 1 else len(ins.sizes)
    launches = [c0 + 6.0 + 12.0 * i for i in range(nl)]
    launched = launches[0] + st.cost(6.0)
    ready = max(dep_t, launched)
    ready_node = dep_node if dep_t >= launched else _Node(launched, st.rank, "other",
                                                          st.cpu_node)
    st.cpu = c0 + st.cost(16.0 + 12.0 * nl)
    if ins.op in ("send", "recv"):
        src, dst = (st.rank, ins.peer) if ins.op == "send" else (ins.peer, st.rank)
        gkey: tuple = ("p2p", src, dst)
    else:
        gkey = ("g", ins.ranks)
    n = st.counter.get(gkey, 0)
    st.counter[gkey] = n + 1
    key = (gkey, n)
    pg = ins.ranks
    seq = st.seq.get(pg, 1 + (len(pg) * 3 + pg[0]) % 5)
    st.seq[pg] = seq + 1
    st.keys[idx] = key
    rec = {"t": "comm", "ins": ins, "cpu": c0, "cpu_end": st.cpu, "launches": launches,
           "key": key, "seq": seq, "step": ins.step, "ready": ready, "ready_node": ready_node}
    st.recs.append(rec)
    st.queues.setdefault(ins.stream, []).append(rec)


def _flush(st: _Rank, pending: dict, results: dict, rph: int, graph: dict) -> bool:
    """Start every parked op whose stream is free; True when one started. `graph` collects the
    nodes of each op's arrivals and ends (``graph["arr"|"end"][key][rank]``)."""
    moved = False
    for s, q in st.queues.items():
        while q:
            free = _stream_free(st, s, results)
            if free is None:
                break
            rec = q.pop(0)
            ins, key = rec["ins"], rec["key"]
            arrival = max(free, rec["ready"])
            arr_node = (_stream_node(st, s, graph) if free >= rec["ready"]
                        else rec["ready_node"])
            graph["arr"].setdefault(key, {})[st.rank] = arr_node
            st.streams[s] = key
            members = 2 if ins.op in ("send", "recv") else len(ins.ranks)
            slot = pending.setdefault(key, {})
            slot[st.rank] = arrival
            if len(slot) == members:
                results[key] = _resolve(ins, dict(slot), rph) + (dict(slot),)
                del pending[key]
                last = max(slot, key=lambda r: (slot[r], -r))
                graph["end"][key] = {r: _Node(k[-1][1], r, ("comm", key), graph["arr"][key][last])
                                     for r, k in results[key][0].items()}
            moved = True
    return moved


def _advance(st: _Rank, pending: dict, results: dict, job: Job, extra: dict, rph: int,
             graph: dict) -> bool:
    """Run `st` as far as it can; True when it moved."""
    moved = _flush(st, pending, results, rph, graph)
    while st.pc < len(st.prog):
        ins = st.prog[st.pc]
        if ins.kind == "comm":
            _park_comm(st, ins, st.pc)
            _flush(st, pending, results, rph, graph)
        elif ins.kind == "wait":
            key = st.keys[ins.ref]
            res = results.get(key)
            if res is None:
                return moved
            if res[0][st.rank][-1][1] > st.tc:
                st.tc, st.tc_node = res[0][st.rank][-1][1], graph["end"][key][st.rank]
        elif ins.kind == "waitall":
            frees = [_stream_free(st, s, results) for s in st.streams]
            if any(f is None for f in frees) or any(st.queues.values()):
                return moved
            for s, f in zip(st.streams, frees):
                if f > st.tc:
                    st.tc, st.tc_node = f, _stream_node(st, s, graph)
        elif ins.kind == "comp":
            _compute(st, ins, job, extra)
        elif ins.kind == "sync":
            c0 = st.cpu
            if st.tc > st.cpu:
                st.cpu_node = st.tc_node
            st.cpu = max(st.cpu, st.tc) + st.cost(5.0)
            st.recs.append({"t": "sync", "cpu": c0, "cpu_end": st.cpu, "step": ins.step})
        elif ins.kind == "data":
            c0 = st.cpu
            st.cpu += ins.dur
            st.cpu_node = _Node(st.cpu, st.rank, "data", _Node(c0, st.rank, "other", st.cpu_node))
            st.recs.append({"t": "data", "cpu": c0, "cpu_end": st.cpu, "step": ins.step})
        elif ins.kind == "step":
            st.recs.append({"t": "step", "cpu": st.cpu, "step": ins.step})
            st.cpu += st.cost(3.0)
            if job.host_slow_ranks.get(st.rank, 0.0) > 0:   # host time outside any operator
                st.cpu += job.host_slow_ranks[st.rank]
                st.cpu_node = _Node(st.cpu, st.rank, "other", st.cpu_node)
        st.pc += 1
        moved = True
    return moved


def _compute(st: _Rank, ins: _Ins, job: Job, extra: dict) -> None:
    """A kernel on the compute stream: it starts when the stream is free and its launch is."""
    launch = st.cpu + 4.0
    launched = launch + st.cost(6.0)
    start = max(st.tc, launched)
    dur = ins.dur + extra.get(ins.step, 0.0)
    if job.jitter_us:
        dur += float(st.rng.uniform(-job.jitter_us, job.jitter_us))
    dur = max(dur, 5.0)
    s_node = st.tc_node if st.tc >= launched else _Node(start, st.rank, "other", st.cpu_node)
    e_node = _Node(start + dur, st.rank, "compute", s_node)
    st.recs.append({"t": "comp", "name": ins.name, "cpu": st.cpu, "launch": launch,
                    "start": start, "end": start + dur, "step": ins.step, "tag": ins.tag,
                    "start_node": s_node, "end_node": e_node})
    st.cpu += st.cost(14.0)
    st.tc, st.last_start = start + dur, start
    st.tc_node, st.start_node = e_node, s_node


def _simulate(job: Job, P: dict) -> tuple[list[_Rank], dict, dict]:
    world = _world(job)
    rph = max(1, job.ranks_per_host)
    ranks = []
    for r in range(world):
        prog = _program(job, P, r)
        start = 10.0 + float(np.random.default_rng([job.seed, r, 3]).uniform(0, 20))
        st = _Rank(r, prog, start + job.start_skew_us.get(r, 0.0), job.seed)
        ncomp = sum(1 for i in prog if i.kind == "comp" and i.step == 0)
        st_extra = job.slow_ranks.get(r, 0.0) / max(1, ncomp)
        ranks.append((st, {s: st_extra for s in range(P["total_steps"])}))
    pending: dict = {}
    results: dict = {}
    graph: dict = {"arr": {}, "end": {}}
    while True:
        moved = False
        for st, extra in ranks:
            moved |= _advance(st, pending, results, job, extra, rph, graph)
        if all(st.pc >= len(st.prog) and not any(st.queues.values()) for st, _ in ranks):
            break
        if not moved:
            raise RuntimeError(f"simulated job deadlocked: {len(pending)} ops waiting")
    return [st for st, _ in ranks], results, graph


# --------------------------------------------------------------------------------------------
# Naming


_NCCL_OP = {"all_reduce": "nccl:all_reduce", "all_gather": "nccl:_all_gather_base",
            "reduce_scatter": "nccl:_reduce_scatter_base", "all_to_all": "nccl:all_to_all",
            "broadcast": "nccl:broadcast", "send": "nccl:send", "recv": "nccl:recv"}
_C10D_OP = {"all_reduce": "c10d::allreduce_", "all_gather": "c10d::_allgather_base_",
            "reduce_scatter": "c10d::_reduce_scatter_base_", "all_to_all": "c10d::alltoall_base_",
            "broadcast": "c10d::broadcast_", "send": "c10d::send", "recv": "c10d::recv_"}
_COLL_NAME = {"all_reduce": "allreduce", "all_gather": "_allgather_base",
              "reduce_scatter": "_reduce_scatter_base", "all_to_all": "all_to_allv",
              "broadcast": "broadcast", "send": "send", "recv": "recv"}
_NEW = {"all_reduce": "AllReduce_Sum_bf16_RING_LL", "all_gather": "AllGather_RING_LL",
        "reduce_scatter": "ReduceScatter_Sum_bf16_RING_LL", "broadcast": "Broadcast_RING_LL",
        "all_to_all": "SendRecv", "send": "SendRecv", "recv": "SendRecv"}
_OLD = {"all_reduce": "AllReduce_RING_LL_Sum_bfloat16",
        "all_gather": "AllGather_RING_LL_Sum_int8_t",
        "reduce_scatter": "ReduceScatter_RING_LL_Sum_bfloat16",
        "broadcast": "Broadcast_RING_LL_Sum_int8_t"}
_ONECCL = {"all_reduce": "oneccl_allreduce_kernel<bf16, 2, 16, 1, 1, 2>",
           "all_gather": "oneccl_allgatherv_kernel<bf16, 2, 16>",
           "reduce_scatter": "oneccl_reduce_scatter_kernel<bf16, 2, 16>",
           "all_to_all": "oneccl_alltoallv_kernel<bf16, 2>",
           "broadcast": "oneccl_bcast_kernel<bf16>",
           "send": "oneccl_send_kernel<bf16>", "recv": "oneccl_recv_kernel<bf16>"}
_CUSTOM = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
           "all_to_all": "alltoall", "broadcast": "broadcast", "send": "send", "recv": "recv"}
CUSTOM_REGEX = r"^my_[a-z]+_kernel"
_GEMM = {"nvidia": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
                   "_execute_segment_k_off_kernel__5x_cublas",
         "amd": "Cijk_Alik_Bljk_BBS_BH_MT256x256x64_MI32x32x8x1_SN_1LDSB1_GRVW8_K1_WG32_8_1",
         "xpu": "gemm_kernel"}
_OPTIM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
          "(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
          "FusedAdamMathFunctor<float, 4>>(...)")
#: The gate's top-k (torch's sort-based top-k kernel, on every vendor's build of torch).
_TOPK = ("void at::native::sbtopk::gatherTopK<c10::BFloat16, unsigned int, 2, false>"
         "(at::cuda::detail::TensorInfo<c10::BFloat16 const, unsigned int>, ...)")
#: FlashAttention's forward and backward kernels.
_FLASH = ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
          "cutlass::bfloat16_t>, false, false, false, false, true, true, false>(...)",
          "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, "
          "64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t>, false, false, false, false>"
          "(...)")
_EXPERT = ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn"
           "_align8>")


def _vendor(job: Job) -> str:
    return {"rccl": "amd", "oneccl": "xpu"}.get(job.kernels, "nvidia")


def _kernel_name(job: Job, P: dict, op: str) -> str:
    k = job.kernels
    if k == "nccl":
        return f"ncclDevKernel_{_NEW[op]}(ncclDevKernelArgsStorage<4096ul>)"
    if k == "nccl_old":
        base = _OLD.get(op, "SendRecv_RING_SIMPLE_Sum_int8_t")
        if op == "all_reduce" and P["old_sendrecv_ar"]:
            base = "SendRecv_RING_SIMPLE_Sum_int8_t"
        return f"ncclKernel_{base}(ncclDevComm*, unsigned long, ncclWork*)"
    if k == "rccl":
        if P["rccl_generic"]:
            return "ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)"
        base = _OLD.get(op, "SendRecv_RING_SIMPLE_Sum_int8_t").replace("bfloat16", "bf16")
        return f"ncclKernel_{base}(ncclDevComm*, unsigned long, ncclWork*)"
    if k == "oneccl":
        return _ONECCL[op]
    return f"my_{_CUSTOM[op]}_kernel"


# --------------------------------------------------------------------------------------------
# Emission


class _Clock:
    def __init__(self, job: Job, rank: int, base: float):
        host = rank // max(1, job.ranks_per_host)
        self.off = job.host_offset_us.get(host, 0.0)
        self.drift = job.host_drift_us_per_s.get(host, 0.0)
        self.gpu_only, self.base = job.gpu_only_drift, base

    def cpu(self, t: float) -> float:
        d = 0.0 if self.gpu_only else self.drift * t / 1e6
        return round(self.base + t + self.off + d, 3)

    def gpu(self, t: float) -> float:
        return round(self.base + t + self.off + self.drift * t / 1e6, 3)


class _Emitter:
    """Builds one rank's events; ids continue across its windows."""

    def __init__(self, job: Job, P: dict, rank: int, tables: dict, clock: _Clock):
        self.job, self.P, self.rank, self.table, self.clk = job, P, rank, tables[rank], clock
        self.pid = 4000 + 37 * rank + int(job.seed % 97)
        self.dev = rank % max(1, job.ranks_per_host)
        self.ext, self.corr, self.comm_k = 50, 1000, 0
        self.drops = set(job.drop.get(rank, []))
        self.sidecar: list[dict] = []
        self.streams: dict[str, int] = {}

    def stream_id(self, s: str) -> int:
        if s == "compute":
            return 0 if self.job.kernels == "rccl" else 7
        if s not in self.streams:
            self.streams[s] = 20 + 4 * len(self.streams)
        return self.streams[s]

    def nid(self, attr: str) -> int:
        v = getattr(self, attr) + 1
        setattr(self, attr, v)
        return v

    def x(self, ev: list, cat: str, name: str, t0: float, t1: float, args: dict, gpu=False,
          tid=None) -> dict:
        ts = self.clk.gpu(t0) if gpu else self.clk.cpu(t0)
        te = self.clk.gpu(t1) if gpu else self.clk.cpu(t1)
        e = {"ph": "X", "cat": cat, "name": name, "pid": self.dev if gpu else self.pid,
             "tid": tid if tid is not None else self.pid, "ts": ts, "dur": round(te - ts, 3),
             "args": args}
        ev.append(e)
        return e

    def launch(self, ev: list, t: float, ext: int, corr: int, kname: str, k0: float, k1: float,
               stream: str, comm_args: dict | None, drop: bool) -> None:
        v = _vendor(self.job)
        rt = {"nvidia": "cudaLaunchKernel", "amd": "hipLaunchKernel",
              "xpu": "urEnqueueKernelLaunch"}[v]
        cat = "xpu_runtime" if v == "xpu" else "cuda_runtime"
        self.x(ev, cat, rt, t, t + 3.5, {"External id": ext, "cbid": 211, "correlation": corr})
        if drop:
            return
        sid = self.stream_id(stream)
        args = {"External id": ext, "queued": 0, "device": self.dev, "context": 1,
                "correlation": corr, "registers per thread": 32, "shared memory": 0,
                "grid": [132, 1, 1], "block": [256, 1, 1]}
        if v == "xpu":
            args.update({"sycl queue": sid, "l0 queue": f"0x55d0c1{sid:02x}", "appended": 0,
                         "submitted": 0, "engine_ordinal": 0, "engine_index": 0})
        else:
            args["stream"] = sid
        args.update(comm_args or {})
        self.x(ev, "kernel", kname, k0, k1, args, gpu=True, tid=sid)
        ev.append({"ph": "s", "id": corr, "pid": self.pid, "tid": self.pid,
                   "ts": self.clk.cpu(t), "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "f", "id": corr, "pid": self.dev, "tid": sid, "ts": self.clk.gpu(k0),
                   "cat": "ac2g", "name": "ac2g", "bp": "e"})

    def comp(self, ev: list, rec: dict) -> None:
        ext, corr = self.nid("ext"), self.nid("corr")
        v = _vendor(self.job)
        kname = {"gemm": _GEMM[v], "optim": _OPTIM, "expert": _EXPERT,
                 "router": _TOPK, "attention": _FLASH[0], "attention_bwd": _FLASH[1]}[rec["name"]]
        if v != "nvidia" and rec["name"] not in ("gemm", "router", "attention", "attention_bwd"):
            kname = _GEMM[v]
        op = {"optim": "aten::_fused_adamw_", "router": "aten::topk",
              "attention": "aten::_flash_attention_forward",
              "attention_bwd": "aten::_flash_attention_backward"}.get(rec["name"], "aten::mm")
        self.x(ev, "cpu_op", op, rec["cpu"], rec["cpu"] + 12.0, {"External id": ext})
        self.launch(ev, rec["launch"], ext, corr, kname, rec["start"], rec["end"], "compute",
                    None, False)


def _comm_args(em: _Emitter, ins: _Ins, seq: int, size: int, nsum: int) -> dict:
    """record_param_comms args for the metadata level (empty for "none"/"records")."""
    lvl = em.job.metadata
    if lvl not in ("seq", "names"):
        return {}
    name, desc, _ = em.table[ins.ranks]
    n = len(ins.ranks)
    op = ins.op
    nel = nsum // ELEM
    in_n, out_n = nel, nel
    if op == "all_gather":
        in_n = nel // n
    elif op == "reduce_scatter":
        out_n = nel // n
    cname = _COLL_NAME[op]
    if op in ("all_gather", "reduce_scatter") and em.P["fsdp_style"]:
        cname = {"all_gather": "allgather_into_tensor_coalesced",
                 "reduce_scatter": "reduce_scatter_tensor_coalesced"}[op]
    a = {"Collective name": cname, "dtype": "BFloat16", "In msg nelems": in_n,
         "Out msg nelems": out_n, "Group size": n, "In split size": "[]", "Out split size": "[]",
         "Process Group Name": name, "Process Group Description": desc}
    grank = ins.ranks.index(em.rank)
    if op in ("send", "recv"):
        grank = ins.ranks.index(ins.peer)
    elif op == "broadcast":
        grank = ins.ranks.index(ins.root) if ins.root >= 0 else 0
    a["Rank"] = grank
    if lvl == "seq":
        r = list(ins.ranks)
        stride = r[1] - r[0] if n > 1 else 1
        arith = all(r[i + 1] - r[i] == stride for i in range(n - 1))
        a["Global rank start"] = r[0] if arith else -1
        a["Global rank stride"] = stride if arith else -1
        a["Process Group Ranks"] = str(r)
        a["Seq"] = seq
    if op in ("send", "recv") and em.P["p2p_style"] == "dst_src":
        a["Dst Rank" if op == "send" else "Src Rank"] = ins.peer
    return a


def _cpu_op_name(em: _Emitter, op: str) -> tuple[str, str]:
    if em.job.kernels == "oneccl":
        return "cpu_op", _C10D_OP[op]
    name = _NCCL_OP[op]
    if op in ("all_gather", "reduce_scatter") and em.P["fsdp_style"]:
        name = {"all_gather": "nccl:all_gather_into_tensor_coalesced",
                "reduce_scatter": "nccl:reduce_scatter_tensor_coalesced"}[op]
    return "user_annotation", name


def _emit_comm(em: _Emitter, ev: list, rec: dict, results: dict) -> None:
    ins: _Ins = rec["ins"]
    kints, Ts, _ = results[rec["key"]]
    kints = kints[em.rank]
    c0, c1 = rec["cpu"], rec["cpu_end"]
    coalesced = len(ins.sizes) > 1
    if ins.wrap:
        em.x(ev, "cpu_op", ins.wrap, c0, c1, {"External id": em.nid("ext")})
    cat, opname = _cpu_op_name(em, ins.op)
    if coalesced:
        for i, sz in enumerate(ins.sizes):
            a = _comm_args(em, ins, rec["seq"], sz, sz)
            if a:
                t = c0 + 0.5 + i * 1.5
                em.x(ev, "cpu_op", "record_param_comms", t, t + 1.2,
                     {"External id": em.nid("ext"), **a})
        cat, opname = "user_annotation", "nccl:coalesced"
        copy = {}
    else:
        copy = _comm_args(em, ins, rec["seq"], ins.sizes[0], ins.sizes[0])
        if copy:
            em.x(ev, "cpu_op", "record_param_comms", c0 + 1.0, c1 - 1.0,
                 {"External id": em.nid("ext"), **copy})
    ext = em.nid("ext")
    em.x(ev, cat, opname, c0 + 2.0, c1 - 2.0, {"External id": ext})
    kops = [ins.op] * len(kints)
    for i, (k0, k1) in enumerate(kints):
        drop = em.comm_k in em.drops
        em.comm_k += 1
        kname = _kernel_name(em.job, em.P, kops[i])
        em.launch(ev, rec["launches"][i], ext, em.nid("corr"), kname, k0, k1, ins.stream,
                  copy, drop)
        if coalesced or i == 0:
            em.sidecar.append(_side_rec(em, rec, i, kints, drop, c0, c1))


def _side_rec(em: _Emitter, rec: dict, i: int, kints: list, drop: bool, c0, c1) -> dict:
    ins: _Ins = rec["ins"]
    name, desc, _ = em.table[ins.ranks]
    sz = ins.sizes[i] if len(ins.sizes) > 1 else ins.sizes[0]
    n = len(ins.ranks)
    in_b = sz // n if ins.op == "all_gather" else sz
    out_b = sz // n if ins.op == "reduce_scatter" else sz
    if len(ins.sizes) > 1:
        s, e = kints[i]
    else:
        s, e = kints[0][0], kints[-1][1]
    gpu = not drop
    return {"op": ins.op, "trace_name": _cpu_op_name(em, ins.op)[1], "pg_name": name,
            "pg_desc": desc, "pg_ranks": list(ins.ranks), "seq": rec["seq"],
            "in_bytes": in_b, "out_bytes": out_b, "bytes": sz, "numel": sz // ELEM,
            "dtype": "BFloat16", "peer": ins.peer if ins.peer >= 0 else None,
            "source": "p2p_hook" if ins.op in ("send", "recv") else "flight_recorder",
            "issue_us": em.clk.cpu(c0),
            "start_us": em.clk.gpu(s) if gpu else em.clk.cpu(c0 + 2.0),
            "end_us": em.clk.gpu(e) if gpu else em.clk.cpu(c1 - 2.0),
            "matched": "kernel" if gpu else "cpu_op",
            **({"stream": em.stream_id(ins.stream)} if gpu else {})}


def _meta_events(em: _Emitter) -> list[dict]:
    v = _vendor(em.job)
    ev = [{"ph": "M", "name": "process_name", "pid": em.pid, "tid": 0, "args": {"name": "python"}},
          {"ph": "M", "name": "process_labels", "pid": em.pid, "tid": 0, "args": {"labels": "CPU"}},
          {"ph": "M", "name": "thread_name", "pid": em.pid, "tid": em.pid,
           "args": {"name": f"thread {em.pid} (python)"}},
          {"ph": "M", "name": "process_name", "pid": em.dev, "tid": 0, "args": {"name": "python"}},
          {"ph": "M", "name": "process_labels", "pid": em.dev, "tid": 0,
           "args": {"labels": f"{'XPU' if v == 'xpu' else 'GPU'} {em.dev}"}}]
    for s in ["compute"] + list(em.streams):
        sid = em.stream_id(s)
        ev.append({"ph": "M", "name": "thread_name", "pid": em.dev, "tid": sid,
                   "args": {"name": f"stream {sid}"}})
    return ev


def _header(job: Job, P: dict, rank: int, listing: dict, counts: dict) -> dict:
    v = _vendor(job)
    dev = {"nvidia": ("NVIDIA H100 80GB HBM3", 85029158912, 9, 0, 132),
           "amd": ("AMD Instinct MI300X", 206141652992, 9, 4, 304),
           "xpu": ("Intel(R) Data Center GPU Max 1550", 68719476736, 12, 60, 1024)}[v]
    backend = "xccl" if v == "xpu" else "nccl"
    di: dict = {"backend": backend, "rank": rank, "world_size": _world(job)}
    if job.metadata in ("seq", "names"):
        cfg = []
        for g, name, desc, _ in listing[rank]:
            cfg.append({"pg_name": name, "pg_desc": desc,
                        "backend_config": "cpu:gloo" if desc.endswith("_GLOO") else
                        "xpu:xccl" if v == "xpu" else "cuda:nccl",
                        "pg_size": len(g), "ranks": list(g)})
        di.update({"pg_count": counts[rank], "pg_config": cfg})
    hdr = {"schemaVersion": 1,
           "deviceProperties": [{"id": rank % max(1, job.ranks_per_host), "name": dev[0],
                                 "totalGlobalMem": dev[1], "computeMajor": dev[2],
                                 "computeMinor": dev[3], "numSms": dev[4]}],
           "distributedInfo": di, "record_shapes": 1, "displayTimeUnit": "ms",
           "traceName": "trace.json"}
    if job.metadata in ("seq", "records"):
        hdr["host_name"] = f"node{rank // max(1, job.ranks_per_host):02d}"
    return hdr


def _windows(job: Job, P: dict) -> list[list[int]]:
    out = []
    for w in range(job.windows):
        s0 = w * (job.steps + P["gap_steps"])
        out.append(list(range(s0, s0 + job.steps)))
    return out


def _emit_window(em: _Emitter, st: _Rank, steps: list[int], results: dict, P: dict) -> list:
    ev: list = []
    want = set(steps)
    recs = [r for r in st.recs if r["step"] in want]
    step_recs = [r for r in st.recs if r["t"] == "step"]
    for rec in recs:
        t = rec["t"]
        if t == "step":
            nxt = [s for s in step_recs if s["step"] == rec["step"] + 1]
            end = nxt[0]["cpu"] if nxt else max(r.get("cpu_end", r["cpu"]) for r in recs)
            if nxt and rec["step"] + 1 not in want:
                end = max(r.get("cpu_end", r["cpu"]) for r in recs if r["step"] == rec["step"])
            em.x(ev, "user_annotation", f"ProfilerStep#{P['step0'] + rec['step']}", rec["cpu"],
                 end, {"External id": em.nid("ext")})
        elif t == "comp":
            em.comp(ev, rec)
        elif t == "data":
            em.x(ev, "user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter."
                 "__next__", rec["cpu"], rec["cpu_end"], {"External id": em.nid("ext")})
        elif t == "comm":
            _emit_comm(em, ev, rec, results)
        elif t == "sync":
            name = "hipDeviceSynchronize" if em.job.kernels == "rccl" else "cudaDeviceSynchronize"
            cat = "xpu_runtime" if em.job.kernels == "oneccl" else "cuda_runtime"
            em.x(ev, cat, name, rec["cpu"], rec["cpu_end"],
                 {"External id": em.nid("ext"), "cbid": 165, "correlation": em.nid("corr")})
    return ev


def _dump(path: Path, doc: dict, gz: bool) -> None:
    data = orjson.dumps(doc) if orjson is not None else json.dumps(doc).encode()
    if gz:
        with gzip.open(path, "wb", compresslevel=3) as f:
            f.write(data)
    else:
        path.write_bytes(data)


# --------------------------------------------------------------------------------------------
# Truth


def _truth_comm(job: Job, sts: list[_Rank], results: dict, P: dict):
    want = {s for w in _windows(job, P) for s in w}
    counts = {st.rank: dict.fromkeys(OPS, 0) for st in sts}
    sizes: dict[str, set] = {}
    xfer: dict[str, set] = {}
    seen = set()
    for st in sts:
        for rec in st.recs:
            if rec["t"] != "comm" or rec["step"] not in want:
                continue
            ins = rec["ins"]
            counts[st.rank][ins.op] += len(ins.sizes)
            for sz in ins.sizes:
                sizes.setdefault(ins.op, set()).add(int(sz))
            if rec["key"] in seen:
                continue
            seen.add(rec["key"])
            for sz, T in zip(ins.sizes, results[rec["key"]][1]):
                xfer.setdefault(ins.op, set()).add((int(sz), round(T, 6)))
    algbw = {}
    for op, pairs in xfer.items():
        if op in RELEASE_TOGETHER and len(pairs) == 1 and len(sizes[op]) == 1:
            sz, T = next(iter(pairs))
            algbw[op] = sz / T / 1e3
    return counts, {op: sorted(v) for op, v in sizes.items()}, algbw


def _straggler(job: Job, sts: list[_Rank], results: dict, P: dict) -> int | None:
    """The planted slow rank blamed for the most waiting (last arrival of release-together and
    p2p ops in the recorded windows; >= 10 µs), else None."""
    want = {s for w in _windows(job, P) for s in w}
    blame: dict[int, float] = {}
    seen = set()
    for st in sts:
        for rec in st.recs:
            if rec["t"] != "comm" or rec["step"] not in want or rec["key"] in seen:
                continue
            seen.add(rec["key"])
            if rec["ins"].op == "broadcast":
                continue
            arr = results[rec["key"]][2]
            last = max(arr, key=arr.get)
            wait = sum(arr[last] - a for a in arr.values())
            blame[last] = blame.get(last, 0.0) + wait
    slow = {**job.slow_ranks, **job.host_slow_ranks}
    cands = [(blame.get(r, 0.0), r) for r in slow if slow[r] > 0]
    if not cands:
        return None
    b, r = max(cands)
    return r if b >= 10.0 else None


#: A planted host delay is a straggler in the truth when removing it saves at least this much of
#: the step (µs) and this share of it: its true delay cost (:func:`_host_delay_cost`). A sleep
#: the schedule hides (a pipeline's last stage waiting for its first forward anyway) costs none.
#: (Time outside computation varies with a host's load: a rank whose host time costs less than
#: 2% of the step is no straggler to act on; the analysis names none below that either.)
TRUE_COST_MIN_US = 10.0
TRUE_COST_MIN_SHARE = 0.02


def _step_ends(sts: list[_Rank], P: dict) -> np.ndarray:
    """Each step's end (µs): the latest end of a computation of that step on any rank."""
    ends = np.full(P["total_steps"], -np.inf)
    for st in sts:
        for rec in st.recs:
            if rec["t"] == "comp":
                ends[rec["step"]] = max(ends[rec["step"]], rec["end"])
    return ends


def _host_delay_cost(job: Job, P: dict, sts: list[_Rank]) -> tuple[float, float]:
    """The step time the planted host delays cost (µs per step, the median over the recorded
    steps of the step's length with them less without them: the job simulated again without
    `host_slow_ranks`), and the median step without them (µs)."""
    clean, _, _ = _simulate(replace(job, host_slow_ranks={}), P)
    d_slow, d_clean = np.diff(_step_ends(sts, P)), np.diff(_step_ends(clean, P))
    want = [s - 1 for w in _windows(job, P) for s in w if s >= 1]
    return (float(np.median(d_slow[want] - d_clean[want])) if want else 0.0,
            float(np.median(d_clean[want])) if want else 0.0)


def _bubble(job: Job, sts: list[_Rank], P: dict) -> float | None:
    if not job.schedule.startswith("pp") or "pp" not in job.mesh:
        return None
    dims = _dims(job)
    want = [s for w in _windows(job, P) for s in w]
    groups = sorted({_group(st.rank, dims, "pp") for st in sts})
    vals = []
    for g in groups:
        for s in want:
            ivs = {r: [(c["start"], c["end"]) for c in sts[r].recs
                       if c["t"] == "comp" and c["tag"] == "pp" and c["step"] == s] for r in g}
            lo = min(a for v in ivs.values() for a, _ in v)
            hi = max(b for v in ivs.values() for _, b in v)
            for v in ivs.values():
                vals.append(1.0 - sum(b - a for a, b in v) / (hi - lo))
    return float(np.mean(vals)) if vals else None


def _kernels(st: _Rank, results: dict, graph: dict) -> dict[int, tuple[list, list]]:
    """Per step, the rank's kernels launched in it: their starts and ends as (time, node)."""
    out: dict[int, tuple[list, list]] = {}
    for rec in st.recs:
        if rec["t"] not in ("comp", "comm"):
            continue
        starts, ends = out.setdefault(rec["step"], ([], []))
        if rec["t"] == "comp":
            starts.append((rec["start"], rec["start_node"]))
            ends.append((rec["end"], rec["end_node"]))
        elif rec["t"] == "comm":
            k = results[rec["key"]][0][st.rank]
            starts.append((k[0][0], graph["arr"][rec["key"]][st.rank]))
            ends.append((k[-1][1], graph["end"][rec["key"]][st.rank]))
    return out


def _host_step_us(st: _Rank, s: int, w: list[int]) -> float:
    """How long rank ``st``'s host ``ProfilerStep`` range of step ``s`` (in window ``w``) is,
    as :func:`_emit_window` writes it (µs)."""
    steps = {r["step"]: r["cpu"] for r in st.recs if r["t"] == "step"}
    if s + 1 in steps:
        return (steps[s + 1] if s + 1 in w else
                max(r.get("cpu_end", r["cpu"]) for r in st.recs if r["step"] == s)) - steps[s]
    return max(r.get("cpu_end", r["cpu"]) for r in st.recs if r["step"] in w) - steps[s]


def _dim_of(job: Job, key: tuple) -> str:
    gkey = key[0]
    if gkey[0] == "p2p":
        return "pp"
    dims = _dims(job)
    return next((d for d, n in dims if n > 1 and _group(gkey[1][0], dims, d) == gkey[1]),
                "other")


#: Arrivals closer than this (µs) are a tie: a trace's timestamps (ns) and its clock alignment
#: cannot order them.
TIE_US = 1.0


def _true_path(job: Job, P: dict, sts: list[_Rank], results: dict, graph: dict) -> dict:
    """The true critical path of every recorded step, from the simulation's own dependencies
    (each start waited for the later of its stream's previous end and its launch; each op's end
    for its last arrival; the host for the compute stream at each step's synchronisation).

    Step windows are pardiag's for GPU ranks: per rank from the first kernel launched in the
    step to the next step's first kernel (the window's last step: as long as its host's
    ``ProfilerStep`` range, or to its last kernel's end if later; the time after that end is
    the host's, "other"). The walk starts at the latest window end (the lowest rank on a tie)
    and follows each node's
    predecessor back to the start of the window of the rank it reaches; intervals are summed by
    part: a rank's computation ("compute"), DataLoader ("data loading") and the rest ("other"),
    and each dimension's transfers ("communication").

    Returns ``{"steps": [{"step", "path_us", "end_rank", "ties", "segments"}], "shares":
    [{"part", "rank", "dim", "us", "share_pct"}]}`` (step: the ``ProfilerStep#`` number; µs;
    ``segments``: the path latest first, ``{"part", "rank", "dim", "start_us", "end_us"}`` on
    the simulation's clock (µs from the job's start, before clock offsets); shares largest first;
    ``ties``: the joins on the path whose last arrival another member matched to within
    `TIE_US`, and the step's end if another rank's matched it: a path through that member is as
    true, and its shares by rank differ)."""
    acc: dict[tuple, float] = {}
    rows = []
    by_rank = {st.rank: _kernels(st, results, graph) for st in sts}
    st_of = {st.rank: st for st in sts}
    for w in _windows(job, P):
        for s in w:
            kern = {r: k[s] for r, k in by_rank.items()}
            start = {r: min(t for t, _ in k[0]) for r, k in kern.items()}
            end, tail = {}, {}
            for r, (_, ends) in kern.items():
                nxt = by_rank[r].get(s + 1, ([], []))[0] if s + 1 in w else []
                end[r] = min(nxt, key=lambda x: x[0]) if nxt else max(ends, key=lambda x: x[0])
                tail[r] = 0.0 if nxt else max(
                    0.0, start[r] + _host_step_us(st_of[r], s, w) - end[r][0])
            r_end = max(end, key=lambda r: (end[r][0] + tail[r], -r))
            node, total, segs = end[r_end][1], tail[r_end], []
            if tail[r_end]:
                acc[("other", r_end, None)] = acc.get(("other", r_end, None), 0.0) + tail[r_end]
                segs.append({"part": "other", "rank": r_end, "dim": None,
                             "start_us": end[r_end][0], "end_us": end[r_end][0] + tail[r_end]})
            last = end[r_end][0] + tail[r_end]
            ties = int(any(r != r_end and last - (e + tail[r]) < TIE_US
                           for r, (e, _) in end.items()))
            while node.pred is not None:
                p = node.pred
                comm = isinstance(node.cat, tuple)
                if comm:
                    arr = results[node.cat[1]][2]
                    ties += sum(1 for r, a in arr.items() if r != p.rank
                                and arr[p.rank] - a < TIE_US) > 0
                floor = start[p.rank if comm else node.rank]
                lo = max(p.t, floor)
                if node.t > lo:
                    part = (("communication", None, _dim_of(job, node.cat[1])) if comm else
                            ({"data": "data loading"}.get(node.cat, node.cat), node.rank, None))
                    acc[part] = acc.get(part, 0.0) + node.t - lo
                    total += node.t - lo
                    segs.append({"part": part[0], "rank": node.rank, "dim": part[2],
                                 "start_us": lo, "end_us": node.t})
                if p.t <= floor:
                    break
                node = p
            rows.append({"step": P["step0"] + s, "path_us": total, "end_rank": r_end,
                         "ties": ties, "segments": segs})
    whole = sum(acc.values())
    shares = [{"part": k[0], "rank": k[1], "dim": k[2], "us": v,
               "share_pct": 100.0 * v / whole if whole else float("nan")}
              for k, v in sorted(acc.items(), key=lambda kv: -kv[1])]
    return {"steps": rows, "shares": shares}


def _clock_truth(job: Job, sts: list[_Rank], P: dict, base: float):
    first = _windows(job, P)[0][0]
    t0 = next(r["cpu"] for r in sts[0].recs if r["t"] == "step" and r["step"] == first)
    c0 = _Clock(job, 0, base)
    off, drift = {}, {}
    for st in sts:
        c = _Clock(job, st.rank, base)
        off[st.rank] = round(c.gpu(t0) - c0.gpu(t0), 3)
        drift[st.rank] = c.drift - c0.drift
    return off, drift


# --------------------------------------------------------------------------------------------
# Public entry points


def _validate(job: Job) -> None:
    if job.backend != "gpu":
        raise NotImplementedError("only backend='gpu' is modelled (gloo is not)")
    if job.schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {job.schedule!r}")
    if job.metadata not in METADATA:
        raise ValueError(f"unknown metadata level {job.metadata!r}")
    if job.kernels not in ("nccl", "nccl_old", "rccl", "oneccl", "custom"):
        raise ValueError(f"unknown kernels {job.kernels!r}")
    pp = job.mesh.get("pp", 1) > 1
    if job.schedule.startswith("pp") != pp:
        raise ValueError("pp_* schedules need a pp dim of degree > 1, and a pp dim needs one")
    if job.schedule == "pp_interleaved" and job.microbatches < job.mesh["pp"]:
        raise ValueError("pp_interleaved needs microbatches >= pp")
    if job.schedule == "ep" and job.mesh.get("ep", 1) < 2:
        raise ValueError("schedule 'ep' needs an ep dim")


def _write_records(job: Job, out: Path, r: int, em: _Emitter, listing: dict,
                   files: list) -> None:
    side = out / "pardiag"
    side.mkdir(exist_ok=True)
    hdr = {"schema": "pardiag", "schema_version": 1}
    pgs = [{"name": n, "desc": d, "ranks": list(g), "size": len(g), "backend": "nccl",
            "dim": dim if dim in _DESC["plain"] else None} for g, n, d, dim in listing[r]]
    comms = {**hdr, "kind": "comms", "rank": r, "process_groups": pgs, "records": em.sidecar}
    host = r // max(1, job.ranks_per_host)
    meta = {**hdr, "kind": "rank", "rank": r, "world_size": _world(job),
            "local_rank": r % max(1, job.ranks_per_host), "node_rank": host, "pid": em.pid,
            "host": f"node{host:02d}", "backend": "nccl", "device": f"cuda:{em.dev}",
            "device_name": "NVIDIA H100 80GB HBM3", "trace_file": f"rank{r}.trace.json.gz",
            "comm_records": len(em.sidecar), "status": "ok", "exit_code": 0}
    for name, doc in ((f"rank{r}.comms.json", comms), (f"rank{r}.meta.json", meta)):
        (side / name).write_text(json.dumps(doc))
        files.append(str(side / name))


def _write_run(job: Job, out: Path, files: list) -> None:
    world, rph = _world(job), max(1, job.ranks_per_host)
    nodes: dict[str, list[int]] = {}
    for r in range(world):
        nodes.setdefault(f"node{r // rph:02d}", []).append(r)
    doc = {"schema": "pardiag", "schema_version": 1, "kind": "run", "pardiag_version": "0.1.0",
           "command": "pardiag profile train.py", "script": "train.py", "script_args": [],
           "world_size": world, "nproc_per_node": min(world, rph),
           "nnodes": max(1, math.ceil(world / rph)), "node_rank": 0,
           "schedule": {"wait": 1, "warmup": 1, "active": job.steps},
           "started_unix": 1700000000.0, "ended_unix": 1700000100.0, "torchrun_exit_code": 0,
           "exit_code": 0, "nodes": nodes, "backend": "nccl", "failed_ranks": {},
           "missing_ranks": []}
    (out / "pardiag" / "run.json").write_text(json.dumps(doc))
    files.append(str(out / "pardiag" / "run.json"))


def generate(job: Job, out_dir: str | os.PathLike) -> Truth:
    """Simulate `job`, write its traces under `out_dir`, return what was planted."""
    _validate(job)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    P = _params(job)
    sts, results, graph = _simulate(job, P)
    tables, pgcounts, listing = _pg_tables(job, P)
    base = BASE_US + float(np.random.default_rng([job.seed, 5]).uniform(0, 5e10))
    files: list[str] = []
    for st in sts:
        r = st.rank
        em = _Emitter(job, P, r, tables, _Clock(job, r, base))
        for steps in _windows(job, P):
            ev = _emit_window(em, st, steps, results, P)
            doc = {**_header(job, P, r, listing, pgcounts),
                   "traceEvents": _meta_events(em) + ev}
            ts0 = min(e["ts"] for e in ev if e["ph"] == "X")
            if job.metadata == "records" and job.windows == 1:
                path = out / f"rank{r}.trace.json.gz"
            elif job.windows > 1:
                path = out / f"rank{r}.{int(ts0 * 1000)}.pt.trace.json"
            else:
                path = out / f"rank{r}.json"
            _dump(path, doc, gz=path.suffix == ".gz")
            files.append(str(path))
        if job.metadata == "records":
            _write_records(job, out, r, em, listing, files)
    if job.metadata == "records":
        _write_run(job, out, files)
    return _truth(job, P, sts, results, base, files, graph)


def _truth(job, P, sts, results, base, files, graph) -> Truth:
    counts, sizes, algbw = _truth_comm(job, sts, results, P)
    off, drift = _clock_truth(job, sts, P, base)
    world = _world(job)
    strag = _straggler(job, sts, results, P)
    judged = True
    if strag is not None and strag in job.host_slow_ranks:
        cost, step = _host_delay_cost(job, P, sts)
        least = max(TRUE_COST_MIN_US, TRUE_COST_MIN_SHARE * step)
        if cost < least:
            strag = None   # the schedule hid the delay: it cost the job (next to) nothing
        # within a factor of 2 of the bound either answer is defensible: not judged
        judged = not 0.5 * least <= cost <= 2.0 * least
    bub = _bubble(job, sts, P)
    parts = [f"{world} ranks, mesh {job.mesh}, schedule {job.schedule}, {job.steps} steps x "
             f"{job.windows} window(s), metadata {job.metadata}, kernels {job.kernels}"]
    if job.slow_ranks:
        parts.append(f"slow ranks {job.slow_ranks} (µs/step) -> straggler {strag}")
    if job.host_slow_ranks:
        parts.append(f"ranks slow on the host {job.host_slow_ranks} (µs/step) -> straggler "
                     f"{strag}")
    if job.host_offset_us:
        parts.append(f"host clock offsets {job.host_offset_us} µs")
    if job.host_drift_us_per_s:
        parts.append(f"host drift {job.host_drift_us_per_s} µs/s"
                     + (" on GPU timestamps only" if job.gpu_only_drift else ""))
    if job.start_skew_us:
        parts.append(f"profiler-start skew {job.start_skew_us} µs (not a straggler)")
    if job.drop:
        parts.append(f"dropped comm kernels {job.drop}")
    if job.coalesced:
        parts.append("DP all_reduces in one nccl:coalesced block per step")
    if job.replicas > 1:
        parts.append(f"{job.replicas} independent replicas that no collective joins (no layout "
                     f"of the world)")
    if job.broadcasts_per_step:
        parts.append(f"{job.broadcasts_per_step} rooted broadcasts per step (chain ends)")
    if job.data_loading_us:
        parts.append(f"DataLoader {job.data_loading_us} µs per step (input-bound ranks)")
    if bub is not None:
        p, m = job.mesh["pp"], job.microbatches
        v = 2 if job.schedule == "pp_interleaved" else 1
        parts.append(f"bubble {bub:.4f} measured (ideal {(p - 1) / (v * m + p - 1):.4f})")
    parts.append(f"pg naming {P['naming']}/{P['family']}, p2p keys {P['p2p_style']}")
    layout = {} if job.replicas > 1 else {d: n for d, n in job.mesh.items() if n > 1}
    if "edp" in job.mesh:   # folded: data parallel over every rank, ep inside it
        layout = {"dp": world, **({"ep": job.mesh["ep"]} if job.mesh.get("ep", 1) > 1 else {})}
    unknown: tuple[str, ...] = ()
    if job.opaque_a2a:   # routing or a sequence exchange: the traces cannot tell
        unknown = ("ep", "cp")
        layout = {d: n for d, n in layout.items() if d != "ep"}
        parts.append("all-to-alls with no router and no attention next to them (role unknown)")
    if job.loss_broadcast:
        parts.append("the loss broadcast from the last stage over the pipe group")
    return Truth(
        world=world, layout=layout, unknown=unknown,
        hosts={r: r // max(1, job.ranks_per_host) for r in range(world)},
        offset_us=off, drift_us_per_s=drift, straggler=strag, counts=counts, bytes=sizes,
        algbw_gbps={k: round(v, 4) for k, v in algbw.items()}, bubble=bub,
        comm_kernel_regex=CUSTOM_REGEX if job.kernels == "custom" else None,
        files=files, notes="; ".join(parts) + ".",
        path=_true_path(job, P, sts, results, graph), straggler_judged=judged)


def _base_mesh(rng: random.Random, schedule: str) -> dict[str, int]:
    n = rng.choice([2, 4, 8])
    return {"ddp": {"dp": n}, "fsdp": {"fsdp": n}, "tp": {"tp": n}, "ep": {"ep": n}}[schedule]


def random_job(rng: random.Random, kind: str | None = None,
               metadata: str | None = None) -> Job:
    """A random valid job of `kind` (one of KINDS; random when None)."""
    kind = kind or rng.choice(KINDS)
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    sched = rng.choice(["ddp", "fsdp", "tp", "ep"])
    job = Job(mesh=_base_mesh(rng, sched), schedule=sched, steps=rng.randint(3, 5),
              metadata=metadata or rng.choice(METADATA), seed=rng.randrange(1 << 30),
              jitter_us=rng.choice([0.0, 0.0, 2.0]))
    w = _world(job)
    if kind == "straggler":
        job.slow_ranks = {rng.randrange(w): rng.uniform(400, 1500)}
    elif kind in ("clock_offset", "drift"):
        job.schedule, job.mesh, job.ranks_per_host = "ddp", {"dp": rng.choice([4, 8])}, 2
        hosts = _world(job) // 2
        if kind == "clock_offset":
            job.host_offset_us = {h: rng.uniform(-900, 900) for h in range(1, hosts)}
        else:
            job.host_drift_us_per_s = {h: rng.choice([-1, 1]) * rng.uniform(20, 60)
                                       for h in range(1, hosts)}
            # hosts without a common time source can be seconds apart: an offset that large
            # times the drift is tens of µs, which a fit on the wrong time axis mistakes
            apart = 2e6 if rng.random() < 1 / 3 else 300.0
            job.host_offset_us = {h: rng.uniform(-apart, apart) for h in range(1, hosts)}
            job.gpu_only_drift, job.compute_scale = rng.random() < 0.5, 150.0
            job.steps = rng.randint(12, 20)
    elif kind == "start_skew":
        job.start_skew_us = {rng.randrange(1, w): rng.uniform(5000, 40000)}
    elif kind == "dropped":
        r = rng.randrange(w)
        job.drop = {r: sorted(rng.sample(range(6), rng.randint(1, 3)))}
    elif kind == "multi_kernel_a2a":
        job.schedule, job.mesh, job.kernels = "ep", {"ep": rng.choice([4, 8])}, "nccl"
    elif kind == "coalesced":
        job.schedule, job.mesh, job.coalesced = "ddp", {"dp": rng.choice([2, 4, 8])}, True
        if rng.random() < 0.4:  # PP x DP: each stage's DP group runs its block at its own time
            job.schedule, job.mesh = rng.choice(["pp_gpipe", "pp_1f1b"]), {"pp": 2, "dp": 2}
    elif kind in ("old_nccl", "rccl", "xpu_oneccl", "custom_kernel"):
        job.kernels = {"old_nccl": "nccl_old", "rccl": "rccl", "xpu_oneccl": "oneccl",
                       "custom_kernel": "custom"}[kind]
    elif kind == "rooted_broadcast":
        job.schedule, job.mesh, job.broadcasts_per_step = "ddp", {"dp": rng.choice([4, 8])}, 2
    elif kind == "pipeline":
        job.schedule = rng.choice(["pp_gpipe", "pp_1f1b", "pp_interleaved"])
        p = rng.choice([2, 4])
        job.mesh = rng.choice([{"pp": p}, {"pp": 2, "dp": 2}])
        job.microbatches = rng.choice([4, 8])
    elif kind == "pipeline_straggler":   # one rank of a pipeline computes slower
        job.schedule = rng.choice(["pp_gpipe", "pp_1f1b", "pp_interleaved"])
        job.mesh = rng.choice([{"pp": 2}, {"pp": 4}, {"pp": 2, "dp": 2}])
        job.microbatches = rng.choice([4, 8])
        job.slow_ranks = {rng.randrange(_world(job)): rng.uniform(400, 1500)}
    elif kind == "pipeline_host_straggler":   # one rank's host sleeps at each step's start
        job.schedule = rng.choice(["pp_gpipe", "pp_1f1b", "pp_interleaved"])
        job.mesh = rng.choice([{"pp": 2}, {"pp": 4}, {"pp": 2, "dp": 2}])
        job.microbatches = rng.choice([4, 8])
        job.host_slow_ranks = {rng.randrange(_world(job)): rng.uniform(400, 1500)}
    elif kind == "windows":
        job.windows = rng.randint(2, 3)
    elif kind == "mesh_layout":
        job.mesh, job.schedule = rng.choice([
            ({"dp": 2, "tp": 2}, "ddp"), ({"fsdp": 2, "tp": 4}, "fsdp"),
            ({"dp": 4, "tp": 2}, "ddp"), ({"dp": 2, "ep": 4}, "ep"),
            ({"pp": 2, "dp": 2, "tp": 2}, "pp_1f1b"), ({"dp": 2, "fsdp": 2}, "fsdp"),
            ({"dp": 2, "fsdp": 2, "tp": 2}, "fsdp"), ({"pp": 4, "dp": 2}, "pp_1f1b"),
            ({"dp": 2, "cp": 4}, "ddp")])
        job.ranks_per_host = rng.choice([4, 8])
    elif kind == "moe_folded":   # EP carved out of DP (Megatron's MoE parallel folding)
        job.schedule = "ep"
        job.mesh = {"edp": rng.choice([2, 4]), "ep": rng.choice([2, 4])}
    elif kind == "cp_ring":   # ring attention's send/recv: context parallelism, no pipeline
        job.schedule, job.cp_ring = "ddp", True
        job.mesh = rng.choice([{"cp": 4}, {"dp": 2, "cp": 4}, {"dp": 2, "cp": 2}])
    elif kind == "simple_fsdp":   # FSDP through functional collectives: no tensor parallelism
        job.schedule, job.functional_fsdp = "fsdp", True
        job.mesh = rng.choice([{"fsdp": rng.choice([2, 4, 8])}, {"fsdp": 2, "tp": 2},
                               {"fsdp": 4, "tp": 2}])
    elif kind == "ulysses":   # sequence all-to-alls around attention: cp, no ep
        job.schedule = rng.choice(["ddp", "fsdp"])
        job.mesh = rng.choice([{"cp": rng.choice([2, 4, 8])}, {"dp": 2, "cp": 4},
                               {"dp": 4, "cp": 2}])
        if job.schedule == "fsdp" and "dp" in job.mesh:
            job.mesh = {"fsdp": job.mesh["dp"], "cp": job.mesh["cp"]}
    elif kind == "deepspeed_pipe":   # PipelineEngine: 1F1B, undescribed groups, loss broadcast
        job.schedule, job.family, job.loss_broadcast = "pp_1f1b", "deepspeed", True
        job.mesh = rng.choice([{"pp": 2}, {"pp": 4}, {"pp": 2, "dp": 2}, {"pp": 2, "dp": 4}])
        job.microbatches = rng.choice([4, 8])
    elif kind == "opaque_a2a":   # all-to-alls no evidence places: ep or cp unknown
        job.schedule, job.family, job.opaque_a2a = "ep", "deepspeed", True
        job.mesh = rng.choice([{"ep": 4}, {"dp": 2, "ep": 2}, {"dp": 2, "ep": 4}])
    elif kind == "independent_groups":
        job.schedule = rng.choice(["ddp", "tp"])
        job.mesh = {"dp": 2} if job.schedule == "ddp" else {"tp": rng.choice([2, 4])}
        job.replicas = rng.choice([2, 3, 4])
        if rng.random() < 0.5:
            job.slow_ranks = {rng.randrange(_world(job)): rng.uniform(400, 1500)}
    return job


# --------------------------------------------------------------------------------------------
# Smoke test


def _check_files(truth: Truth) -> None:
    """Every file loads as JSON; every kernel has a runtime launch with its correlation."""
    for f in truth.files:
        opener = gzip.open if f.endswith(".gz") else open
        with opener(f, "rb") as fh:
            doc = json.loads(fh.read())
        if "traceEvents" not in doc:
            continue
        ev = doc["traceEvents"]
        launches = {e["args"]["correlation"] for e in ev
                    if e.get("cat") in ("cuda_runtime", "xpu_runtime")}
        for e in ev:
            if e.get("cat") == "kernel" and e["args"]["correlation"] not in launches:
                raise AssertionError(f"{f}: kernel {e['name']} has no launch")
            if e.get("ph") == "X" and e["dur"] < 0:
                raise AssertionError(f"{f}: negative duration on {e['name']}")


def _smoke(out: Path) -> None:
    rng = random.Random(1234)
    for kind in KINDS:
        for md in METADATA:
            job = random_job(rng, kind, md)
            truth = generate(job, out / f"{kind}_{md}")
            _check_files(truth)
            print(f"{kind:16s} {md:8s} world={truth.world:<3d} files={len(truth.files):<3d} "
                  f"straggler={truth.straggler} layout={truth.layout}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", metavar="DIR", help="write one job of every kind x metadata")
    args = ap.parse_args(argv)
    if args.smoke:
        _smoke(Path(args.smoke))
    else:
        ap.print_help()


if __name__ == "__main__":
    main()
