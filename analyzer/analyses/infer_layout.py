"""The parallel layout and pipeline schedule of traces recorded without pardiag.

A run profiled with plain ``torch.profiler`` (or torchtitan's, Megatron's profiling) has no
``run.json`` and no sidecars, but its traces still say much (FACTS §1):

* ``distributedInfo.pg_config``: the groups that contain the rank, with descriptions naming mesh
  dimensions (``mesh_dp``, ``mesh_tp``, ...); ``pg_count`` counts all groups;
* wrappers' ranges: FSDP2 ``FSDP::pre_forward`` / ``FSDP::all_gather`` / ``FSDP::pre_backward``,
  FSDP1 ``FullyShardedDataParallel.*``, DDP ``DistributedDataParallel.forward``,
  ``ZeroRedundancyOptimizer`` steps (with their ``broadcast``s);
* tensor parallelism's functional collectives (``_c10d_functional::all_reduce``,
  ``all_gather_into_tensor``, ``reduce_scatter_tensor``); ``all_to_all``, read as expert
  parallelism when routing shows (a top-k gate, split sizes that differ), as sequence
  parallelism when it swaps shards around attention (Ulysses), else unknown
  (:func:`all_to_all_role`);
* ``torch.distributed.pipelining``'s ranges: ``Forward i`` / ``Backward i`` (GPipe),
  ``PP:{stage}F{mb}`` / ``PP:{stage}B{mb}`` / ``I`` / ``W`` (schedules run by the action runtime,
  e.g. Interleaved1F1B); Schedule1F1B marks no microbatch; and the point-to-point messages between
  stages (``c10d::send`` / ``c10d::recv_`` with the peer's group rank in ``Concrete Inputs[2]``,
  or NCCL's ``record_param_comms`` with ``Collective name`` send/recv).

Two steps, as for the other analyses: :func:`rank_marks` reduces one rank's events to the few
marks above (kept in the rank's summary, so a report from stored summaries never re-reads a trace),
and :func:`infer_layout` combines the ranks' marks into an :class:`InferredLayout`: dimensions
and degrees, strategies, and the pipeline (schedule, stages, microbatches, stages per rank),
with one line of evidence per conclusion and one line per thing that could not be inferred or
is only estimated. pardiag never presents it as recorded: its ``source`` is
:data:`INFERRED_SOURCE`.

Pipeline chunks: the per-microbatch ranges, minus the point-to-point calls and waits inside them
(GPipe's ``Forward i`` holds the receive of its input and the send of its output), are the busy
intervals from which :func:`pardiag.analyzer.analyses.pipeline.compute_pipeline` measures bubbles as
for pardiag's own records. Where no range marks microbatches (1F1B), the number of microbatches is
counted from the messages (sends per step to one neighbouring stage) and the bubble can only be
estimated.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..per_rank.layout_marks import CHUNK_COLUMNS, MARKERS
from ..per_rank.summary import summary_of
from ..trace import vocab
from ..trace.traceset import (
    TraceSet,
)
from .comm_events import AMBIGUOUS_GROUP
from .mesh import dim_of, fold_expert_parallel, mesh_dims, role_of
from .op_roles import (
    all_to_all_role,
    functional_role,
    functional_roles,
    hybrid_sharding,
    p2p_role,
    reducing_groups,
    ring_lines,
    scalar_reductions,
    unplaced_reductions,
    zero12_line,
)

#: What :attr:`InferredLayout.source` says (and the report shows).
INFERRED_SOURCE = "inferred from traces"


def canonical_dim(desc: str | None) -> str | None:
    """A group description (``mesh_tp``, ``mesh_dp_shard``, Megatron's
    ``TENSOR_MODEL_PARALLEL_GROUP``) → ``dp``/``tp``/``pp``/``ep``/``cp``, or None
    (``default_pg``, embedding groups; :func:`pardiag.analyzer.analyses.mesh.dim_of`)."""
    return dim_of(desc)


@dataclasses.dataclass(frozen=True)
class InferredLayout:
    """Result of :func:`infer_layout`: what the traces say about the layout.

    Attributes:
        dims: ``{dim: degree}`` (``dp``, ``tp``, ``pp``, ``ep``, ``cp``); only degrees the traces
            determine.
        strategies: sorted, in pardiag's vocabulary: ``ddp``, ``fsdp1``, ``fsdp2``, ``zero1``,
            ``tp``, ``ep``, ``cp``, ``pipeline``.
        pipeline: ``{"schedule"`` (torch's class name: ``ScheduleGPipe``, ``Schedule1F1B``,
            ``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``), ``"stages"``,
            ``"microbatches"``, ``"pp_group_size"``, ``"stages_per_rank"``, ``"stage_ranks"``
            (``{stage: rank}``), ``"microbatches_from"`` (``"ranges"`` or ``"sends"``)``}``, or
            None.
        chunks: the per-microbatch busy intervals of every rank: ``rank``, ``stage``,
            ``microbatch``, ``phase``, ``step``, ``start_us``, ``end_us`` (µs, each rank's own
            clock); empty where the traces mark no microbatch.
        pp_ranks: ranks that exchange point-to-point messages with another pipeline stage.
        evidence: one line per conclusion: what in the traces it rests on.
        not_inferred: one line per thing that could not be inferred, or is only estimated and how.
        source: always :data:`INFERRED_SOURCE`.
        group_dims: ``{sorted ranks: dim}`` of the groups that are a dimension of the inferred
            mesh (see :meth:`dim_of_group`), and ``"edp"`` for the expert-data-parallel groups
            of a folded layout.
        folded: ``{"ep": "dp"}`` when expert parallelism is folded into data parallelism
            (:func:`pardiag.analyzer.analyses.mesh.fold_expert_parallel`: ``dp`` and ``ep``
            then do not multiply to the world), else ``{}``.
        p2p_role: what the point-to-point messages are (:func:`p2p_role`): ``"pp"`` (a
            pipeline's, also when there are none), ``"cp"`` (ring attention's) or None
            (unknown): only a pipeline's make the ranks that exchange them a pipeline.
    """

    dims: dict
    strategies: list
    pipeline: dict | None
    chunks: pd.DataFrame
    pp_ranks: tuple[int, ...]
    evidence: tuple[str, ...]
    not_inferred: tuple[str, ...]
    source: str = INFERRED_SOURCE
    group_dims: dict = dataclasses.field(default_factory=dict)
    folded: dict = dataclasses.field(default_factory=dict)
    p2p_role: str | None = "pp"

    def dim_of_group(self, ranks) -> str | None:
        """The dimension whose groups include ``ranks`` (a mesh dimension's group, or the whole
        world when one dimension spans it), else None: a group of one rank, a flattened or
        internal group (torchtitan's ``mesh_batch``, ``mesh_loss``), the default group of a
        multi-dimensional mesh."""
        return self.group_dims.get(tuple(sorted(int(r) for r in ranks)))


def is_pardiag_run(traces: TraceSet) -> bool:
    """True for a run folder of ``pardiag profile`` (``run.json``, rank metadata or sidecars):
    its layout is recorded, never inferred."""
    return bool(traces.run_info or traces.rank_meta
                or any(traces.sidecars.get(k) for k in ("comms", "pipeline")))


def _world(traces: TraceSet) -> int:
    sizes = [vocab.DIST_WORLD_SIZE.get(vocab.DISTRIBUTED_INFO.get(t.metadata))
             for t in traces.ranks.values()]
    sizes = [s for s in sizes if isinstance(s, int) and s > 0]
    return max(sizes) if sizes else len(traces.ranks)


def _mesh_dims(traces: TraceSet, events: pd.DataFrame | None, a2a_role: str | None,
               fn_role: str | None = "tp", p2p: str | None = "pp"
               ) -> tuple[dict, dict, dict, tuple[str, ...]]:
    """``({dim: degree}, {dim: "descriptions"}, {rank: {dim: group ranks}}, notes)`` from the
    process groups, a mesh or nothing (:func:`pardiag.analyzer.analyses.mesh.mesh_dims`: dp of a
    hybrid mesh is replicate × shard; a flattened ``mesh_dp`` is no further dimension). Groups
    come from ``distributedInfo.pg_config`` and from the communication ``events``' group ranks;
    a group whose description names no dimension is named by the ops that ran over it
    (:func:`pardiag.analyzer.analyses.mesh.role_of`; an all-to-all group by ``a2a_role``,
    :func:`all_to_all_role`; a group of functional collectives by ``fn_role``,
    :func:`functional_role`; a group of sends and receives by ``p2p``, :func:`ring_lines`)."""
    groups = [(str(vocab.PG_CONFIG_DESC.get(g, "")), list(vocab.PG_CONFIG_RANKS.get(g)))
              for t in traces.ranks.values() for g in t.pg_config]
    fn_roles = functional_roles(events)
    roles = {}
    if events is not None and len(events):
        ev = events[~events["group"].astype(str).isin(["", AMBIGUOUS_GROUP])]
        for key, sub in ev.groupby("group"):
            ranks, _, desc = str(key).partition("|")
            members = frozenset(int(r) for r in ranks.split(","))
            groups.append((desc, sorted(members)))
            role = role_of(sub["op"].value_counts().to_dict(),
                           float(sub["functional"].astype(bool).mean()), a2a_role,
                           fn_roles.get(str(key), (fn_role, ""))[0], p2p)
            if role:
                roles[members] = role
    m = mesh_dims(groups, roles, _world(traces))
    return dict(m.dims), dict(m.descs), m.member, m.notes


def _global_peers(traces: TraceSet, marks: dict, member: dict) -> tuple[dict, list[str]]:
    """``{rank: DataFrame of its p2p with a global ``peer``}``, notes. A peer is the global
    rank its record names (``global_peer``), else its rank in the group read through the
    rank's pipeline group (``member``), or its only group of two or more ranks."""
    notes, out = [], {}
    for rank, m in marks.items():
        if not len(m.stored("p2p")):   # most ranks of most runs: nothing to filter or copy
            continue
        p = m.p2p[m.p2p["peer"] >= 0].copy()
        if p.empty:
            continue
        if (p["global_peer"] >= 0).all():   # every record names its peer's global rank
            out[rank] = p.assign(peer=p["global_peer"])
            continue
        # groups of one rank carry no message (torchtitan lists a size-1 group per unused dim)
        groups = list({tuple(vocab.PG_CONFIG_RANKS.get(g)): g
                       for g in traces.ranks[rank].pg_config
                       if len(vocab.PG_CONFIG_RANKS.get(g)) > 1}.values())
        pp_group = member.get(rank, {}).get("pp")
        if pp_group:
            ranks = pp_group
        elif len(groups) <= 1:
            ranks = vocab.PG_CONFIG_RANKS.get(groups[0]) if groups else None
        else:
            ranks = None
            notes.append(f"rank {rank}: several process groups and none described as mesh_pp; "
                         f"point-to-point peers read as global ranks")
        if ranks:
            p["peer"] = [ranks[q] if 0 <= q < len(ranks) else -1 for q in p["peer"]]
            p = p[p["peer"] >= 0]
        out[rank] = p
    return out, notes


def _components(edges: dict[int, set[int]]) -> list[list[int]]:
    seen, comps = set(), []
    for r in sorted(edges):
        if r in seen:
            continue
        stack, comp = [r], []
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            comp.append(x)
            stack.extend(edges.get(x, ()))
        comps.append(sorted(comp))
    return comps


def _first_step(p: pd.DataFrame) -> pd.DataFrame:
    """The rank's point-to-point calls of one whole profiled step (the second when there are
    more than two: the first may be cut by the profiler's start)."""
    steps = sorted(s for s in p["step"].unique() if s >= 0)
    if not steps:
        return p
    return p[p["step"] == steps[1 if len(steps) > 2 else 0]]


def _stage_order(comp: list[int], peers: dict, marks: dict) -> tuple[list[int], str]:
    """Pipeline ranks in stage order, and how it was found. A rank that only its peers'
    messages name (its own trace absent) has no marks and no messages of its own."""
    named = {r: sorted(set(marks[r].chunks.loc[marks[r].chunks["stage"] >= 0, "stage"]))
             if r in marks else [] for r in comp}
    if all(named.values()):
        return sorted(comp, key=lambda r: named[r][0]), "stage numbers of the PP: ranges"
    first = {}
    for r in comp:
        if r not in peers:
            continue
        s = _first_step(peers[r])
        if len(s):
            first[r] = s.iloc[0]
    heads = [r for r, row in first.items() if row["op"] == "send"]
    pred = {r: int(row["peer"]) for r, row in first.items() if row["op"] == "recv"}
    if len(heads) == 1 and len(first) == len(comp):
        order, nxt = [heads[0]], {v: k for k, v in pred.items()}
        while order[-1] in nxt and nxt[order[-1]] not in order:
            order.append(nxt[order[-1]])
        if len(order) == len(comp):
            return order, ("the direction of the first message of a step (stage 0 sends first, "
                           "every later stage first receives from the one before)")
    return sorted(comp), "rank order (the messages did not show the order of the stages)"


def infer_layout(traces: TraceSet, events: pd.DataFrame | None = None) -> InferredLayout:
    """The layout and pipeline schedule the traces show (see the module docstring).

    ``events``: the ranks' communication events
    (:func:`pardiag.analyzer.analyses.comm_events.comm_events`), whose groups and ops name the
    dimensions that no group description names."""
    marks = {r: summary_of(t).marks for r, t in traces.ranks.items()}
    world = _world(traces)
    evidence, missing = [], []
    a2a_role, a2a_line = all_to_all_role(traces)
    fn_role = "tp" if scalar_reductions(events) else functional_role(events)[0]
    dims, descs, member, mesh_notes = _mesh_dims(traces, events, a2a_role, fn_role,
                                                 "cp" if ring_lines(marks) else "pp")
    missing += list(mesh_notes)
    for d, n in dims.items():
        evidence.append(f"{d}={n}: process groups {descs[d]}" if "running" in descs[d] else
                        f"{d}={n}: process groups described as {descs[d]} "
                        f"(distributedInfo.pg_config)")
    strategies = _strategies(marks, events, evidence, missing, (a2a_role, a2a_line))
    for d, s in (("tp", "tp"), ("ep", "ep"), ("cp", "cp")):
        if d in dims:
            strategies.add(s)
    reducing = reducing_groups(events)
    gradients = {g for g, _ in reducing_groups(events, gradients=True)}
    fold, fold_conflict = _fold(dims, descs, member, reducing, world, evidence, missing,
                                gradients)

    # pipeline: ranks exchanging point-to-point messages
    peers, notes = _global_peers(traces, marks, member)
    missing += notes
    edges: dict[int, set[int]] = {}
    for r, p in peers.items():
        for q in set(p["peer"]) - {r}:
            edges.setdefault(r, set()).add(int(q))
            edges.setdefault(int(q), set()).add(r)
    comps = [c for c in _components(edges) if len(c) > 1]
    pipeline, chunks_out, pp_ranks = None, [], []
    role: str | None = "pp"
    if comps or any(m.counts.get("p2p_events") for m in marks.values()):
        role, line = p2p_role(comps, marks, member)
        if role != "pp":
            (evidence if role == "cp" else missing).append(line)
            sizes = {len(c) for c in comps}
            if role == "cp":
                strategies.add("cp")
                if "cp" not in dims and len(sizes) == 1:
                    dims["cp"] = sizes.pop()
            comps = []
    if comps:
        pipeline, chunks_out, pp_ranks = _infer_pipeline(comps, peers, marks, evidence, missing)
        strategies.add("pipeline")
        if pipeline and "pp" not in dims:
            dims["pp"] = pipeline["pp_group_size"]

    _the_rest(dims, strategies, world, unplaced_reductions(events), evidence, missing)
    if fold is None and not fold_conflict and dims.get("ep") == world and "dp" not in dims:
        # expert parallelism over the world (its groups no description names): the dense
        # gradients' reductions over the world too are data parallelism over the same ranks
        for r in range(world):
            member.setdefault(r, {}).setdefault("ep", list(range(world)))
        fold, fold_conflict = _fold(dims, descs, member, reducing, world, evidence, missing,
                                    gradients)
    if not strategies and not dims:
        missing.append("no parallel strategy recognized: no DDP, FSDP, ZeRO, tensor-parallel, "
                       "expert-parallel or pipeline marks in the traces")
    if "fsdp2" in strategies or "fsdp1" in strategies:
        hybrid = hybrid_sharding(events, member, dims.get("dp"))
        if hybrid:
            evidence.append(hybrid)
        missing.append("FSDP's reshard-after-forward is not in the traces" if hybrid else
                       "FSDP's reshard-after-forward / sharding strategy is not in the traces")
    if "ddp" in strategies:
        missing.append("DDP's bucket size is not in the traces")
    if any(isinstance(count := vocab.DIST_PG_COUNT.get(vocab.DISTRIBUTED_INFO.get(t.metadata)),
                      int)
           and count > len(t.pg_config) for t in traces.ranks.values()) and not dims:
        missing.append("process groups: pg_config lists only the groups holding each rank, "
                       "and none is described as a mesh dimension")
    dims = _as_mesh(dims, world, missing, folded=fold is not None,
                    reducing_sizes=() if fold_conflict else {len(g) for g, _ in reducing})
    cols = ["rank", *CHUNK_COLUMNS]
    chunks = (pd.concat(chunks_out, ignore_index=True)[cols] if chunks_out
              else pd.DataFrame(columns=cols))
    order = {"dp": 0, "pp": 1, "tp": 2, "cp": 3, "ep": 4}
    dims = {k: int(dims[k]) for k in sorted(dims, key=lambda d: order.get(d, 9))}
    group_dims = {tuple(g): d for m in member.values() for d, g in m.items() if d in dims}
    if len(dims) == 1 and next(iter(dims.values())) == world:
        group_dims[tuple(range(world))] = next(iter(dims))
    folded = {}
    if fold is not None and "ep" in dims:
        folded = {"ep": "dp"}
        group_dims.update({tuple(g): "edp" for g in fold.expert_dp if len(g) > 1})
    return InferredLayout(dims, sorted(strategies), pipeline, chunks, tuple(sorted(pp_ranks)),
                          tuple(evidence), tuple(missing), group_dims=group_dims,
                          folded=folded, p2p_role=role)


def _fold(dims: dict, descs: dict, member: dict, reducing, world: int, evidence: list[str],
          missing: list[str], gradients=()):
    """Expert parallelism folded into data parallelism
    (:func:`pardiag.analyzer.analyses.mesh.fold_expert_parallel`), applied to ``dims``,
    ``member`` (the dense groups as dp), ``evidence`` and ``missing``. Groups named dp by their
    reductions alone may be the expert-data-parallel groups of a folded layout: the dense
    gradients' group decides; a described dp that the reductions contradict is dropped
    (unknown); ``gradients``: the reducing groups that moved more than scalars. Returns
    ``(fold or None, conflict line or None)``."""
    by_ops = "running" in descs.get("dp", "")
    fold, conflict = fold_expert_parallel(
        {d: n for d, n in dims.items() if not (by_ops and d == "dp")},
        {tuple(m["ep"]) for m in member.values() if "ep" in m}, reducing, world, gradients)
    if fold is not None and by_ops:
        evidence[:] = [ln for ln in evidence if not ln.startswith(f"dp={dims['dp']}: ")]
        evidence.append(f"the {descs['dp']} are the expert-data-parallel groups")
    if conflict:
        missing.append(conflict)
        dims.pop("dp", None)
    if fold is not None:
        dims["dp"] = fold.dp
        evidence.append(fold.evidence)
        for g in fold.dense_groups:
            for r in g:
                member.setdefault(r, {})["dp"] = sorted(g)
    return fold, conflict


def _the_rest(dims: dict, strategies: set, world: int, unplaced: int, evidence: list[str],
              missing: list[str]) -> None:
    """The degree no group description gives, when one strategy's is missing: what the world
    leaves over the others (not for ep, cp or tp while ``unplaced`` gradient reductions ran
    over groups the traces do not name: data parallelism may share those ranks); several
    missing degrees stay unknown. Applied to ``dims``, ``evidence``, ``missing``."""
    rest = world
    for d in dims.values():
        rest //= max(int(d), 1)
    unknown = [d for d, s in (("dp", {"ddp", "fsdp", "fsdp1", "fsdp2", "zero1", "zero",
                                      "zero3"}),
                              ("tp", {"tp"}),
                              ("ep", {"ep"}), ("cp", {"cp"})) if strategies & s and d not in dims]
    if len(unknown) == 1 and unknown[0] != "dp" and rest > 1 and unplaced:
        missing.append(
            f"{unknown[0]}: degree unknown; its groups are not in the traces, and {unplaced} "
            f"gradient reductions over groups the traces do not name say data parallelism "
            f"may share the {rest} ranks left (or hold several {unknown[0]} groups, as expert "
            f"parallelism folded into it): {unknown[0]} divides {rest}, but which divisor is "
            f"not shown")
    elif len(unknown) == 1 and rest > 1:
        dims[unknown[0]] = rest
        evidence.append(
            f"{unknown[0]}={rest}: the world of {world} ranks over the other degrees "
            f"({', '.join(f'{k}={v}' for k, v in dims.items() if k != unknown[0]) or 'none'})")
    elif len(unknown) > 1:
        missing.append(f"degrees of {' and '.join(unknown)}: no process group is described as "
                       f"their mesh dimension (mesh_dp, mesh_tp, ...), so the traces do not split "
                       f"the {rest} ranks between them")


#: Wrapper marks → (strategy, what the evidence line calls them).
_MARK_STRATEGIES = {
    "fsdp2": ("fsdp2", "FSDP2's FSDP::pre_forward / all_gather / pre_backward ranges"),
    "fsdp1": ("fsdp1", "FSDP1's FullyShardedDataParallel.forward / _pre_forward ranges"),
    "ddp": ("ddp", "DistributedDataParallel.forward ranges"),
    "zero": ("zero1", "ZeroRedundancyOptimizer step ranges"),
    "functional": ("tp", "functional collectives (_c10d_functional::all_reduce / "
                         "all_gather_into_tensor / reduce_scatter_tensor)"),
    "all_to_all": ("", "all-to-all collectives"),   # what they carry: all_to_all_role
    "zero3": ("zero3", "DeepSpeed ZeRO-3's LinearFunctionForZeroStage3 / "
                       "Pre/PostBackwardFunction autograd functions")}


def _strategies(marks: dict, events: pd.DataFrame | None, evidence: list[str],
                missing: list[str], a2a: tuple[str | None, str]) -> set[str]:
    """The strategies the ranks' marks show (:data:`_MARK_STRATEGIES`; functional collectives
    that are only scalar reductions are none, :func:`scalar_reductions`; all-to-alls are the
    strategy ``a2a`` names, ``(role, line)`` of :func:`all_to_all_role`, or none when it is
    unknown), else ZeRO-1/2 by its pattern (:func:`zero12_line`); appends a line of evidence per
    strategy to ``evidence`` and what stays unknown to ``missing``."""
    total = {k: sum(m.counts.get(k, 0) for m in marks.values()) for k in MARKERS}
    first_rank = {k: next((r for r, m in marks.items() if m.counts.get(k)), None) for k in MARKERS}
    strategies = set()
    tp_note = scalar_reductions(events)
    if tp_note:
        total["functional"] = 0
        evidence.append(tp_note)
    roles = (functional_roles(events) or {"": functional_role(events)}
             if total["functional"] else {})
    for key, (strategy, text) in _MARK_STRATEGIES.items():
        if total[key] and key == "all_to_all":
            if a2a[0] is None:
                missing.append(a2a[1])
                continue
            strategy, text = a2a[0], f"{text}: {a2a[1]}"
        if total[key] and key == "functional":
            for g, (role, line) in sorted(roles.items()):
                where = f" on group {g.split('|')[0]}" if g and len(roles) > 1 else ""
                if role == "":   # all-to-alls alone: the all-to-alls' evidence names them
                    continue
                if role is None:
                    missing.append(line + where)
                elif role not in strategies:
                    strategies.add(role)
                    evidence.append(f"{role}: {text}{where}: {line}" if line else
                                    f"{role}: {text}, {total[key]} events (first on rank "
                                    f"{first_rank[key]})")
            continue
        if total[key]:
            strategies.add(strategy)
            evidence.append(f"{strategy}: {text}, {total[key]} events "
                            f"(first on rank {first_rank[key]})")
    zero12 = None if strategies else zero12_line(events)
    if zero12:
        strategies.add("zero")
        evidence.append(zero12)
        missing.append("the ZeRO stage (1 or 2): both reduce the gradients and gather the "
                       "updated partitions each step (pardiag profile records the stage)")
    return strategies


def _as_mesh(dims: dict, world: int, missing: list[str], folded: bool = False,
             reducing_sizes=None) -> dict:
    """``dims`` when they can be a mesh of ``world`` ranks (degrees multiplying to it, or to a
    divisor of it that leaves the rest to data parallelism nobody described), else ``{}`` with
    a note in ``missing`` that says why: never an impossible layout. With ``folded`` (expert
    parallelism folded into data parallelism), ``ep`` is left out of the product: its groups
    partition the data-parallel groups
    (:func:`pardiag.analyzer.analyses.mesh.fold_expert_parallel`).
    With expert parallelism and no described data parallelism, the rest of the world is data
    parallel only when gradient reductions ran over groups of that size (``reducing_sizes``):
    a folded layout leaves more, and without that evidence ``dp`` stays unknown."""
    dims = {k: int(v) for k, v in dims.items() if int(v) > 1}
    prod = int(np.prod([v for k, v in dims.items() if not (folded and k == "ep")])) if dims else 1
    if prod == world or not dims:
        return dims
    if world % prod == 0 and "dp" not in dims and "ep" in dims and world // prod not in (
            reducing_sizes or ()):
        missing.append(
            f"dp: unknown; {world // prod} if expert parallelism is a mesh dimension of its own "
            f"(dp × ep = {world} ranks), up to {world} if it is folded into data parallelism "
            f"(the dense gradients reduced over groups that hold whole expert-parallel groups); "
            f"the traces do not say over which groups the gradient reductions ran")
        return dims
    if world % prod == 0 and "dp" not in dims:
        missing.append(f"dp={world // prod}: no group describes it; the {world} ranks over the "
                       f"other degrees")
        return {**dims, "dp": world // prod}
    missing.append(f"no layout: the degrees found ({', '.join(f'{k}={v}' for k, v in dims.items())}"
                   f") multiply to {prod}, not to the world of {world} ranks")
    return {}


def _infer_pipeline(comps, peers, marks, evidence, missing):
    """Schedule, stages and microbatches of the largest pipeline group (see
    :func:`infer_layout`); appends to ``evidence`` and ``missing``."""
    comp = max(comps, key=len)
    p = len(comp)
    if len(comps) > 1 and len({len(c) for c in comps}) > 1:
        missing.append(f"pipeline groups of different sizes {sorted(len(c) for c in comps)}: "
                       f"the largest is described")
    order, how = _stage_order(comp, peers, marks)
    pos = {r: i for i, r in enumerate(order)}
    all_pp = sorted(r for c in comps for r in c)
    evidence.append(f"pipeline over ranks {order} ({p} ranks per pipeline, {len(comps)} "
                    f"pipeline(s)): point-to-point sends and receives between them; stage order "
                    f"from {how}")
    chunks = {r: marks[r].chunks for r in all_pp if r in marks}
    absent = [r for r in all_pp if r not in marks]
    if absent:
        missing.append(f"pipeline rank(s) {absent} named only by their peers' messages (no "
                       f"trace): their stages are not described")
    has_action = any((c["stage"] >= 0).any() for c in chunks.values())
    has_gpipe = any(len(c) and (c["stage"] < 0).any() for c in chunks.values())
    phases = set().union(*(set(c["phase"]) for c in chunks.values()))
    out = []
    for r in chunks:
        c = chunks[r]
        if len(c):
            c = c.copy()
            if (c["stage"] < 0).any():  # GPipe's ranges name no stage: the rank's position
                local = {rr: i for c2 in comps for i, rr in enumerate(
                    _stage_order(c2, peers, marks)[0])}
                c.loc[c["stage"] < 0, "stage"] = local.get(r, pos.get(r, 0))
            out.append(c.assign(rank=r))
    head = peers.get(order[0])
    if has_action:
        stages = int(max(int(c["stage"].max()) for c in chunks.values() if len(c))) + 1
    else:
        stages = p
    v = max(stages // p, 1)
    m_from = None
    if out:
        allc = pd.concat(out, ignore_index=True)
        f = allc[allc["phase"] == "F"]
        per = f.groupby(["rank", "stage", "step"])["microbatch"].nunique()
        m = int(per.max()) if len(per) else None
        m_from = "ranges"
        evidence.append(f"microbatches {m}: per-microbatch ranges "
                        + ("PP:{stage}F{mb} / B{mb}" if has_action
                           else "'Forward i' / 'Backward i'")
                        + " per stage and step")
    else:
        m = None
        if head is not None and len(order) > 1:
            sends = head[(head["op"] == "send") & (head["peer"] == order[1]) & (head["step"] >= 0)]
            per = sends.groupby("step").size()
            if len(per):
                m = int(np.median(per.to_numpy()))
                m_from = "sends"
    stage_ranks = {}
    for c in out:
        for s in sorted(set(c["stage"])):
            stage_ranks.setdefault(int(s), int(c["rank"].iloc[0]))
    if has_action and v > 1:
        schedule, why = _placed_schedule(stage_ranks, order, phases, out)
    elif has_gpipe and not has_action:
        schedule, why = "ScheduleGPipe", "'Forward i' / 'Backward i' ranges (only GPipe marks them)"
    else:
        schedule, why = _order_schedule(head, order)
    evidence.append(f"schedule {schedule}: {why}")
    if m_from == "sends":
        missing.append(f"microbatches: {schedule} marks no microbatch in the trace; {m} is "
                       f"estimated as the activations stage 0 (rank {order[0]}) sends to stage 1 "
                       f"(rank {order[1]}) per step; the bubbles are estimated as idle + exposed "
                       f"point-to-point time, without the warmup / steady / cooldown split")
    elif m is None:
        missing.append("microbatches: neither ranges nor messages per step show them")
    if not stage_ranks:
        stage_ranks = {i: r for i, r in enumerate(order)}
    pipe = {"schedule": schedule, "stages": stages, "microbatches": m, "pp_group_size": p,
            "stages_per_rank": v, "stage_ranks": dict(sorted(stage_ranks.items())),
            "microbatches_from": m_from}
    return pipe, out, all_pp


def _placed_schedule(stage_ranks: dict[int, int], order: list[int], phases: set[str],
                     chunks: list[pd.DataFrame]) -> tuple[str, str]:
    """The schedule of a pipeline with several stages per rank, from what ran: where the stages
    sit, whether the backward is split (``I``/``W``) and whether backwards interleave with
    forwards. torch's class name only where those match one schedule alone (looped placement:
    ``ScheduleInterleavedZeroBubble`` with a split backward, ``ScheduleInterleaved1F1B`` when
    backwards run between forwards); otherwise a description, never the nearest name (a V
    placement is ``ScheduleZBVZeroBubble``'s and ``ScheduleDualPipeV``'s; every forward before
    any backward on a looped placement is ``ScheduleLoopedBFS``'s order, and Interleaved1F1B's
    with as few microbatches)."""
    p, stages = len(order), len(stage_ranks)
    where = f"{stages} stages on {p} ranks"
    split = bool(phases & {"I", "W"})
    looped = all(r == order[s % p] for s, r in stage_ranks.items())
    vee = stages == 2 * p and all(r == order[s if s < p else 2 * p - 1 - s]
                                  for s, r in stage_ranks.items())
    # a backward before the rank's last forward of the same step (steps follow one another,
    # so the whole trace would always "interleave")
    interleaves = any(
        len(g[g["phase"].isin(["B", "I"])]) and len(g[g["phase"] == "F"])
        and g.loc[g["phase"].isin(["B", "I"]), "start_us"].min()
        < g.loc[g["phase"] == "F", "start_us"].max()
        for c in chunks for _, g in (c.groupby("step") if "step" in c else [(0, c)]))
    how = "PP: action ranges: stage placement " + ", ".join(
        f"{s}→{r}" for s, r in sorted(stage_ranks.items()))
    if looped and split:
        return "ScheduleInterleavedZeroBubble", f"{how} (looped), backward split into I and W"
    if looped and interleaves:
        return "ScheduleInterleaved1F1B", f"{how} (looped), backwards between forwards"
    if looped:
        return (f"looped placement, {where}, every forward before any backward",
                f"{how}: ScheduleLoopedBFS's order, or Interleaved1F1B's with as few "
                f"microbatches: not named")
    if vee:
        return (f"V placement, {where}" + (", split backward" if split else ""),
                f"{how} (a V: ScheduleZBVZeroBubble and ScheduleDualPipeV place stages so): "
                f"not named")
    return (f"{where}, placement " + ", ".join(f"{s}→{r}" for s, r in sorted(stage_ranks.items())),
            f"{how}: no schedule torch ships places stages so: not named")


def _order_schedule(head: pd.DataFrame | None, order: list[int]) -> tuple[str, str]:
    """GPipe or 1F1B from the order of stage 0's messages in a step: GPipe sends every
    activation before it receives any gradient; 1F1B receives gradients between sends."""
    if head is None or len(order) < 2:
        return "Schedule1F1B", "no per-microbatch ranges (1F1B marks none)"
    s = _first_step(head)
    s = s[s["peer"] == order[1]]
    sends = s.loc[s["op"] == "send", "start_us"]
    recvs = s.loc[s["op"] == "recv", "start_us"]
    if len(sends) and len(recvs) and recvs.min() < sends.max():
        return "Schedule1F1B", ("no per-microbatch ranges (1F1B marks none), and stage 0 receives "
                                "gradients between its sends of activations")
    return "ScheduleGPipe", ("no per-microbatch ranges, and stage 0 sends every activation before "
                             "it receives a gradient (GPipe's order; 1F1B with no more "
                             "microbatches than stages has the same)")
