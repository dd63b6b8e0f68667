"""A parallel layout that is a device mesh: dimensions from the process groups' descriptions,
accepted only when they partition the ranks and their degrees multiply to the world.

Candidate dimensions come from the groups' descriptions in ``distributedInfo.pg_config``:
torchtitan's and DeviceMesh's ``mesh_<dim>`` (with the flattened ``mesh_dp`` and
``mesh_dp_shard_cp`` it synthesizes for data loading and loss reduction), Megatron-LM's
``DATA_PARALLEL_GROUP``, ``TENSOR_MODEL_PARALLEL_GROUP``, ``PIPELINE_MODEL_PARALLEL_GROUP``,
``EXPERT_MODEL_PARALLEL_GROUP``, ``CONTEXT_PARALLEL_GROUP`` (their ``*_GLOO`` twins are the same
ranks on another backend). A description is a dimension only when its groups all have one size
and are disjoint (a partition of the ranks it covers); one whose every group is the span of
other accepted dimensions' groups (torchtitan's ``mesh_dp`` = ``dp_replicate`` × ``dp_shard``,
Megatron's ``MODEL_PARALLEL_GROUP`` = tp × pp) is their product, not a further dimension.
Dimensions that name one canonical dimension multiply (``dp_replicate`` × ``dp_shard`` is dp).

Groups whose description names no dimension (DeepSpeed's ``undefined``, a creation-order number)
are still candidates: a mesh dimension's groups are translates of one another (the same spacing
between their ranks: ``[0, 2]``, ``[1, 3]``), so groups of one size and one spacing form a
candidate, named by what runs over them (:func:`role_of`) and accepted under the same rules.
"""

from __future__ import annotations

import dataclasses
import re

#: ``mesh_<name>`` → canonical dimension (DeviceMesh dimension names seen in torchtitan and
#: torch's own examples; flattened names such as ``dp_shard_cp`` take their first part). ``sp``
#: is none: Megatron's sequence parallelism runs over the tensor-parallel group, verl's and
#: DeepSpeed's (Ulysses) is context parallelism by all-to-all, so what runs over an ``sp``
#: group names it (:func:`role_of`).
MESH_ALIASES = {"dp": "dp", "data": "dp", "dp_shard": "dp", "dp_replicate": "dp",
                "fsdp": "dp", "ddp": "dp", "hsdp": "dp", "replicate": "dp", "shard": "dp",
                "tp": "tp", "tensor": "tp", "pp": "pp", "pipe": "pp",
                "pipeline": "pp", "ep": "ep", "expert": "ep", "moe": "ep", "cp": "cp",
                "context": "cp", "dp_cp": "dp", "dp_shard_cp": "dp",
                "dp_shard_in_ep": "ep", "etp": "tp"}
#: Names of expert-data-parallel groups: the ranks that hold the same experts, one per
#: expert-parallel group (Megatron's ``EXPERT_DATA_PARALLEL_GROUP``, torchtitan's
#: ``dp_shard_mod_ep``). They are no dimension of the dense mesh: expert parallelism is folded
#: into data parallelism (:func:`fold_expert_parallel`).
EXPERT_DP_NAMES = frozenset({"edp", "expert_dp", "ep_dp", "dp_mod_ep", "dp_shard_mod_ep",
                             "EXPERT_DATA_PARALLEL_GROUP"})
#: Megatron-LM's group names (megatron/core/parallel_state.py) → canonical dimension; None for
#: groups that are no dimension of the mesh (embedding groups hold the first and last stages).
MEGATRON_GROUPS = {"DATA_PARALLEL_GROUP": "dp", "DATA_PARALLEL_GROUP_WITH_CP": "dp",
                   "TENSOR_MODEL_PARALLEL_GROUP": "tp", "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
                   "EXPERT_MODEL_PARALLEL_GROUP": "ep", "CONTEXT_PARALLEL_GROUP": "cp",
                   "MODEL_PARALLEL_GROUP": "tp", "TENSOR_AND_DATA_PARALLEL_GROUP": "dp",
                   "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp",
                   "EMBEDDING_GROUP": None, "POSITION_EMBEDDING_GROUP": None}
_MEGATRON_RE = re.compile(r"^(?:mcore_)?([A-Z_]+?)(?:_GLOO)?$")
#: Groups that are by definition the product of other dimensions' groups (Megatron's model-,
#: tensor-and-data-, tensor-and-context-parallel and data-with-context groups; torchtitan's
#: flattened ``dp_cp`` and ``dp_shard_cp``). Where one has the size of a factor (the other
#: factors of degree 1: MODEL_PARALLEL_GROUP with tensor parallelism 1 is the pipeline group),
#: the factor's own description names the dimension.
COMPOSITE_GROUPS = frozenset({"MODEL_PARALLEL_GROUP", "TENSOR_AND_DATA_PARALLEL_GROUP",
                              "TENSOR_AND_CONTEXT_PARALLEL_GROUP", "DATA_PARALLEL_GROUP_WITH_CP",
                              "dp_cp", "dp_shard_cp"})


def is_composite(desc: str | None) -> bool:
    """A description of a group that is the product of others (:data:`COMPOSITE_GROUPS`, bare,
    as ``mesh_<name>`` or with Megatron's ``mcore_`` prefix and ``_GLOO`` suffix), or a
    flattened mesh whose name joins two or more dimensions' names (``mesh_cp_tp``:
    :func:`_joined_dims`)."""
    d = str(desc or "").strip()
    m = _MEGATRON_RE.match(d)
    return (d.removeprefix("mesh_") in COMPOSITE_GROUPS
            or bool(m and m.group(1) in COMPOSITE_GROUPS)
            or len(_joined_dims(d.removeprefix("mesh_").lower())) >= 2)


def _joined_dims(name: str) -> set[str]:
    """The canonical dimensions a flattened mesh's name joins (``cp_tp`` → {cp, tp};
    DeviceMesh's ``_flatten`` names the new dimension by joining its parts' names with ``_``),
    empty for a name that is one dimension's (:data:`MESH_ALIASES`: ``dp_shard``,
    ``dp_replicate``) or not made of the names of two or more dimensions."""
    if name in MESH_ALIASES:
        return set()
    parts = name.split("_")

    def split(i: int) -> list[str] | None:   # the parts from i on as alias names, fewest first
        if i == len(parts):
            return []
        for j in range(len(parts), i, -1):
            head = "_".join(parts[i:j])
            rest = split(j) if head in MESH_ALIASES else None
            if rest is not None:
                return [MESH_ALIASES[head], *rest]
        return None
    dims = split(0)
    return set(dims) if dims and len(set(dims)) >= 2 else set()


def dim_of(desc: str | None) -> str | None:
    """The canonical dimension (``dp``, ``tp``, ``pp``, ``ep``, ``cp``) a group description
    names, or None (``default_pg``, an embedding group, an expert-data-parallel group, a name
    of no known family). A bare dimension name (``tp``, ``dp_shard``:
    ``new_group(group_desc=...)``) names its dimension."""
    if not desc or is_expert_dp(desc):
        return None
    d = str(desc).strip()
    if d.startswith("mesh_"):
        key = d[len("mesh_"):].lower()
        return MESH_ALIASES.get(key, MESH_ALIASES.get(key.split("_")[0]))
    m = _MEGATRON_RE.match(d)
    if m and m.group(1) in MEGATRON_GROUPS:
        return MEGATRON_GROUPS[m.group(1)]
    return MESH_ALIASES.get(d.lower())


def is_expert_dp(desc: str | None) -> bool:
    """A description of an expert-data-parallel group (:data:`EXPERT_DP_NAMES`, bare, as
    ``mesh_<name>`` or with Megatron's ``mcore_`` prefix and ``_GLOO`` suffix)."""
    d = str(desc or "").strip()
    m = _MEGATRON_RE.match(d)
    return (d.removeprefix("mesh_") in EXPERT_DP_NAMES
            or bool(m and m.group(1) in EXPERT_DP_NAMES))


def _not_a_dim(desc: str | None) -> bool:
    """A description that says its group is no mesh dimension: the default group, Megatron's
    embedding groups (the first and last stages), expert-data-parallel groups
    (:func:`is_expert_dp`)."""
    d = str(desc or "").strip()
    m = _MEGATRON_RE.match(d)
    return (d == "default_pg" or is_expert_dp(d)
            or bool(m and MEGATRON_GROUPS.get(m.group(1), "") is None))


def role_of(ops: dict[str, int], functional: float, all_to_all: str | None,
            functional_role: str | None = "tp", p2p: str | None = "pp") -> str | None:
    """The dimension a group serves, from the ops that ran over it: point-to-point → ``pp``
    (pipeline stages; ``p2p`` says otherwise for ring attention's), all-to-all →
    ``all_to_all`` (what the run's evidence says its all-to-alls carry: ``ep`` for token
    dispatch, ``cp`` for a sequence exchange, None when unknown), ops issued mostly through
    functional
    collectives → ``tp`` (tensor and sequence parallelism run DTensor's functional collectives),
    any other collective → ``dp`` (gradient reductions, FSDP's gathers, ZeRO's broadcasts);
    None without ops.

    ``ops``: ``{op type: count}``; ``functional``: the share of them issued through functional
    collectives; ``functional_role``: what the run's functional collectives carry (``tp``,
    ``fsdp`` → ``dp``, None when unknown: the group is then named by nothing); ``p2p``: what
    the run's point-to-point messages are (``pp``, ``cp`` for ring attention's, None when
    unknown)."""
    if not ops:
        return None
    if ops.keys() & {"send", "recv", "send_recv"}:
        return p2p
    if "all_to_all" in ops:
        return all_to_all
    if functional > 0.5:
        return {"tp": "tp", "fsdp": "dp", "ddp": "dp"}.get(functional_role or "")
    return "dp"


def spacing(ranks) -> tuple:
    """A group's size and the gaps between its sorted ranks: the groups of one mesh dimension
    share it (``[0, 2]`` and ``[1, 3]``: ``(2, 2)``)."""
    r = sorted(int(x) for x in ranks)
    return (len(r), *(b - a for a, b in zip(r, r[1:])))


def family(desc: str) -> str:
    """A description without a ``_GLOO`` suffix: the gloo twin of a group is the same group."""
    return desc[:-len("_GLOO")] if desc.endswith("_GLOO") else desc


@dataclasses.dataclass(frozen=True)
class Mesh:
    """Dimensions found by :func:`mesh_dims`.

    Attributes:
        dims: ``{canonical dim: degree}`` (products of the accepted descriptions' sizes).
        descs: ``{canonical dim: "description, ..."}`` of the accepted descriptions.
        member: ``{rank: {canonical dim: its group's ranks}}`` (the first accepted description
            of that dimension holding the rank).
        notes: one line per description left out, and why.
    """

    dims: dict
    descs: dict
    member: dict
    notes: tuple[str, ...]


def _span(r: int, basis: list[dict], ranks_of: dict) -> frozenset:
    """The ranks reachable from ``r`` moving along the groups of ``basis`` (each
    ``{rank: frozenset}``)."""
    seen, todo = {r}, [r]
    while todo:
        x = todo.pop()
        for g in basis:
            for y in g.get(x, ()):
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
    return frozenset(seen)


def _candidates(groups: list[tuple[str, list[int]]], roles: dict, world: int | None
                ) -> tuple[dict[str, dict[int, frozenset]], dict[str, str]]:
    """``({candidate: {rank: its group}}, {candidate: canonical dim})``: described groups by
    their description's family, undescribed ones (of fewer ranks than the world) by spacing,
    named by their ops' role where every group of the spacing has one and they agree."""
    by_key: dict[str, dict[int, frozenset]] = {}
    dim: dict[str, str] = {}
    loose: dict[tuple, set[frozenset]] = {}
    for desc, ranks in groups:
        if not ranks or _not_a_dim(desc):
            continue
        g = frozenset(int(r) for r in ranks)
        d = dim_of(desc)
        if d is not None:
            by_key.setdefault(family(desc), {}).update({r: g for r in g})
            dim[family(desc)] = d
        elif len(g) > 1 and (world is None or len(g) < world):
            loose.setdefault(spacing(g), set()).add(g)
    described = {g for gmap in by_key.values() for g in gmap.values()}
    for sp, gs in sorted(loose.items()):
        gs -= described  # a twin of a described group (the same ranks) is that group
        named = {roles.get(g) for g in gs}
        if not gs or len(named) != 1 or None in named:
            continue
        d = named.pop()
        assert d is not None  # ruled out above
        key = f"groups of {sp[0]} ranks spaced {'/'.join(map(str, sp[1:]))} running {d} ops"
        by_key[key] = {r: g for g in gs for r in g}
        dim[key] = d
    return by_key, dim


def mesh_dims(groups: list[tuple[str, list[int]]], roles: dict | None = None,
              world: int | None = None) -> Mesh:
    """The mesh the groups form.

    ``groups``: ``(description, ranks)`` of every group the traces list (repeats allowed);
    ``roles``: ``{frozenset of ranks: canonical dim}`` of groups by the ops that ran over them
    (:func:`role_of`), for groups whose description names no dimension; ``world``: the world
    size (a group of all ranks is no dimension of its own).

    Returns:
        :class:`Mesh`; degree-1 dimensions are kept out.
    """
    by_desc, dim_of_key = _candidates(groups, roles or {}, world)
    notes: list[str] = []
    cands = []
    for desc, gmap in by_desc.items():
        distinct = set(gmap.values())
        sizes = {len(g) for g in distinct}
        if len(sizes) != 1 or sum(len(g) for g in distinct) != len(gmap):
            notes.append(f"groups described as {desc} are not one partition of the ranks "
                         f"(sizes {sorted(sizes)}): not a mesh dimension")
            continue
        cands.append((sizes.pop(), desc, gmap))
    basis: list[tuple[int, str, dict]] = []
    # at one size, a factor's own description before a product's (:func:`is_composite`)
    for size, desc, gmap in sorted(cands, key=lambda c: (c[0], is_composite(c[1]), c[1])):
        if size == 1:
            continue
        inside = [b for b in basis if all(b[2].get(r, frozenset({r})) <= g
                                          for r, g in gmap.items())]
        # the same partition described as another dimension, by a factor's description
        # (Megatron's expert-parallel group equal to its data-parallel one: experts folded into
        # data parallelism over the same ranks), is that dimension too, not a product of the
        # first
        twin = [b for b in inside if b[2] == gmap and dim_of_key[b[1]] != dim_of_key[desc]]
        if twin and not is_composite(desc):
            basis.append((size, desc, gmap))
            continue
        if inside and all(_span(r, [b[2] for b in inside], gmap) == g for r, g in gmap.items()):
            notes.append(f"{desc} ({size} ranks) is the product of "
                         f"{' × '.join(b[1] for b in inside)}: not a further dimension")
            continue
        if is_composite(desc) and basis and all(
                g <= _span(r, [b[2] for b in basis], gmap) for r, g in gmap.items()):
            # a flattened mesh whose factors are partly folded into others (torchtitan's
            # dp_shard_cp beside a dp that is dp_replicate × dp_shard, and no dp_shard group)
            meets = [b[1] for b in basis
                     if any(len(b[2].get(r, frozenset()) & g) > 1 for r, g in gmap.items())]
            notes.append(f"{desc} ({size} ranks) lies within {' × '.join(meets)}: not a "
                         f"further dimension")
            continue
        # the same dimension's smaller groups inside this one are parts of it (torchtitan's
        # dp over dp_replicate where no dp_shard group is listed): this one stands for them
        same = [b for b in inside if dim_of_key[b[1]] == dim_of_key[desc]]
        if same and not is_composite(desc):
            notes.append(f"{desc} ({size} ranks) holds {', '.join(b[1] for b in same)}: "
                         f"one dimension, of {size}")
            basis = [b for b in basis if b not in same]
        basis.append((size, desc, gmap))
    dims: dict[str, int] = {}
    descs: dict[str, list[str]] = {}
    member: dict[int, dict[str, list[int]]] = {}
    for size, desc, gmap in basis:
        dim = dim_of_key[desc]
        dims[dim] = dims.get(dim, 1) * size
        descs.setdefault(dim, []).append(desc)
        for r, g in gmap.items():
            member.setdefault(r, {}).setdefault(dim, sorted(g))
    return Mesh(dims, {d: ", ".join(v) for d, v in descs.items()}, member, tuple(notes))


#: Collectives that reduce or gather gradients and parameters: what data parallelism runs over
#: its group (DDP's and a hand-written all-reduce, FSDP's and ZeRO's gathers and scatters).
DP_OPS = frozenset({"all_reduce", "reduce_scatter", "all_gather"})


@dataclasses.dataclass(frozen=True)
class Fold:
    """Expert parallelism folded into data parallelism, found by :func:`fold_expert_parallel`.

    Attributes:
        dp: the dense data-parallel degree (the ranks of one dense group).
        dense_groups: the dense data-parallel groups (each holds whole expert-parallel groups).
        expert_dp: the expert-data-parallel groups: the ranks of one dense group at the same
            place in their expert-parallel groups (they hold the same experts), each sorted.
        evidence: one line, what the fold rests on.
    """

    dp: int
    dense_groups: tuple[frozenset, ...]
    expert_dp: tuple[tuple[int, ...], ...]
    evidence: str


def fold_expert_parallel(dims: dict, ep_groups, reducing, world: int, gradients=()
                         ) -> tuple[Fold | None, str | None]:
    """Whether expert parallelism is carved out of data parallelism (Megatron's MoE parallel
    folding, torchtitan's ``dp_shard_in_ep``, DeepSpeed-MoE): the dense weights are data
    parallel over groups that each hold several whole expert-parallel groups, and each expert's
    gradients are reduced over the ranks that hold the same experts (expert data parallel,
    ``dp / ep`` ranks). Then ``dp`` and ``ep`` do not multiply to the world: the layout is
    valid when every dimension's groups partition the world (the dense mesh ``dp × cp × tp ×
    pp`` and the expert mesh ``edp × ep × … × pp`` are two partitions of the same ranks).

    ``dims``: the degrees found so far (``ep`` among them); ``ep_groups``: the expert-parallel
    groups (iterables of global ranks); ``reducing``: ``(ranks, label)`` of every group that ran
    a collective of :data:`DP_OPS` (``label`` names it in the evidence: its description or
    name); ``world``: the world size; ``gradients``: the groups (frozensets) among them whose
    reductions move more than scalars — one of them may be an expert-parallel group itself
    (expert parallelism over the whole data-parallel group: each expert held once, no expert
    data parallelism), where a loss's all-reduce over it would say nothing.

    Returns ``(fold, None)`` when one set of groups ran the reductions, each holds whole
    expert-parallel groups and more than one, and with its size as ``dp`` the degrees other than
    ``ep`` multiply to the world (a described ``dp`` of the same size agrees); ``(None, line)``
    when the evidence disagrees (the line names it: the fold is then unknown); ``(None, None)``
    without expert parallelism or a group that could fold it."""
    eps = {frozenset(int(r) for r in g) for g in ep_groups}
    if "ep" not in dims or not eps:
        return None, None
    cands: dict[frozenset, str] = {}
    for ranks, label in reducing:
        g = frozenset(int(r) for r in ranks)
        inside = [e for e in eps if e <= g]
        if inside and (len(g) > max(len(e) for e in inside) or g in gradients) and all(
                e <= g or not (e & g) for e in eps):
            cands.setdefault(g, str(label))
    if not cands:
        return None, None
    size = max(len(g) for g in cands)
    dense = sorted((g for g in cands if len(g) == size), key=min)
    rest = 1
    for d, n in dims.items():
        if d not in ("dp", "ep"):
            rest *= int(n)
    covered = frozenset().union(*dense)
    if "dp" in dims and int(dims["dp"]) != size:
        return None, (f"ep={dims['ep']} folded into data parallelism is unknown: gradient "
                      f"reductions run over groups of {size} ranks ({cands[dense[0]]}) that hold "
                      f"whole expert-parallel groups, but dp={dims['dp']} by the groups' "
                      f"descriptions")
    if size * rest != world or any(len(e & covered) not in (0, len(e)) for e in eps) or any(
            a & b for i, a in enumerate(dense) for b in dense[i + 1:]):
        return None, (f"ep={dims['ep']} folded into data parallelism is unknown: gradient "
                      f"reductions run over groups of {size} ranks ({cands[dense[0]]}) that hold "
                      f"whole expert-parallel groups, but {size} × the other degrees "
                      f"({rest}) is not the world of {world} ranks")
    ep_of = {r: sorted(e) for e in eps for r in e}
    edp: dict[tuple, list[int]] = {}
    for g in dense:
        for r in sorted(g):
            if r in ep_of:
                edp.setdefault((min(g), ep_of[r].index(r)), []).append(r)
    expert_dp = tuple(tuple(v) for _, v in sorted(edp.items()))
    ranks_of = ", ".join(str(list(x)) for x in expert_dp[:4]) + (
        ", ..." if len(expert_dp) > 4 else "")
    held = size // len(next(iter(eps)))
    line = (f"dp={size}: gradient reductions over groups of {size} ranks ({cands[dense[0]]}), "
            + (f"each holding {held} whole expert-parallel groups: ep={dims['ep']} is folded "
               f"into data parallelism (expert-data-parallel groups of "
               f"{len(expert_dp[0]) if expert_dp else 0}: {ranks_of})" if held > 1 else
               f"each an expert-parallel group itself: ep={dims['ep']} is folded into data "
               f"parallelism over the same ranks (each expert held once: no expert data "
               f"parallelism)"))
    return Fold(size, tuple(dense), expert_dp, line), None
