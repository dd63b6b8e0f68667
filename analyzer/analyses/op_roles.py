"""What the ops say a group or a message carries: the evidence :mod:`infer_layout` weighs
before it names a dimension or a strategy (unknown where the evidence disagrees).

* all-to-alls: expert dispatch or a sequence exchange (:func:`all_to_all_role`);
* sends and receives: a pipeline's, or ring attention's (:func:`p2p_role`, :func:`ring_lines`);
* functional collectives: tensor parallelism's activations or FSDP's parameters
  (:func:`functional_role`, :func:`functional_roles`; scalar reductions are neither,
  :func:`scalar_reductions`);
* gradient reductions: over which groups they ran (:func:`reducing_groups`), how many ran over
  groups the traces do not name (:func:`unplaced_reductions`), ZeRO-1/2's pattern
  (:func:`zero12_line`).
"""

from __future__ import annotations

import pandas as pd

from ..per_rank.layout_marks import A2A_EVIDENCE, P2P_EVIDENCE
from ..per_rank.summary import summary_of
from ..trace.traceset import TraceSet
from .comm_events import AMBIGUOUS_GROUP, SCALAR_BYTES
from .mesh import DP_OPS

#: Messages next to attention, as a share of all of them, that say a sequence exchange
#: (all-to-alls: Ulysses) or ring attention (sends and receives).
ATTENTION_SHARE = 0.5


def ring_lines(marks: dict) -> list[str]:
    """What in the ranks' own events says their sends and receives are ring attention's
    (:data:`vocab.RING_ATTENTION_RE` names; at least :data:`ATTENTION_SHARE` of them next to
    attention), one line each; ``[]`` when nothing does."""
    total = {k: sum(m.counts.get(k, 0) for m in marks.values()) for k in P2P_EVIDENCE}
    out = []
    if total["ring_exchange"]:
        out.append(f"{total['ring_exchange']} events named as ring attention's exchange")
    if total["p2p_events"] and total["p2p_attention"] >= ATTENTION_SHARE * total["p2p_events"]:
        out.append(f"{total['p2p_attention']} of {total['p2p_events']} sends and receives "
                   f"next to attention")
    return out


def p2p_role(comps: list[list[int]], marks: dict, member: dict) -> tuple[str | None, str]:
    """What the point-to-point messages among ``comps`` (groups of ranks that exchange them)
    are, by weighing the evidence of every rank: ``("cp", line)`` for context parallelism's
    ring attention (events named so, :data:`vocab.RING_ATTENTION_RE`; messages next to
    attention in at least :data:`ATTENTION_SHARE` of them; or the ranks of each group in one
    group described as context parallel), ``("pp", line)`` for a pipeline (per-microbatch
    ranges, or the ranks in groups described as pipeline parallel; also when nothing speaks
    for a ring, as send/recv between ranks most often is), ``(None, line)`` when the evidence
    says both: the line names it. ``member``: ``{rank: {dim: its group's ranks}}`` of the
    described groups."""
    ranks = [r for c in comps for r in c]
    ring = ring_lines(marks)
    pipe: list[str] = []
    for dim, says in (("cp", ring), ("pp", pipe)):
        if comps and all(member.get(r, {}).get(dim) and set(c) <= set(member[r][dim])
                         for c in comps for r in c):
            says.append(f"their ranks in groups described as {dim}")
    ranged = sorted(r for r in (ranks or marks) if r in marks and len(marks[r].stored("chunks")))
    if ranged:
        pipe.append(f"per-microbatch ranges on rank(s) {ranged}")
    groups = ", ".join(str(c) for c in comps) or "whose peers the traces do not name"
    if ring and pipe:
        return None, (f"what the point-to-point messages among ranks {groups} carry is unknown: "
                      f"ring attention by {'; '.join(ring)}, a pipeline by {'; '.join(pipe)}: "
                      f"neither a pipeline nor context parallelism is inferred")
    if ring:
        return "cp", (f"cp: the point-to-point messages among ranks {groups} are context "
                      f"parallelism's ring attention, not a pipeline ({'; '.join(ring)})")
    return "pp", ""


def all_to_all_role(traces: TraceSet) -> tuple[str | None, str]:
    """What the run's all-to-alls carry, by weighing the evidence of every rank
    (:func:`pardiag.analyzer.per_rank.layout_marks.all_to_all_evidence`): ``("ep", line)``
    when they dispatch tokens to experts (split sizes that differ, or routing's ops: a top-k
    gate, routers, experts), ``("cp", line)`` when they exchange sequence and head shards
    (named so, or next to attention in at least :data:`ATTENTION_SHARE` of them: Ulysses-style
    sequence parallelism), and ``(None, line)`` when the evidence is for both or for neither:
    the line names it. ``line`` is one line of evidence, or of what stays unknown."""
    return a2a_role_of(a2a_evidence_totals(traces), uneven_count(traces))


def uneven_count(traces: TraceSet) -> int:
    """All-to-alls of every rank whose split sizes differ (:func:`uneven_splits`)."""
    return sum(uneven_splits(summary_of(t).a2a) for t in traces.ranks.values())


def uneven_splits(a2a: pd.DataFrame) -> int:
    """All-to-alls of a rank's summary table (``send_splits`` column) whose split sizes
    differ: tokens routed unevenly."""
    if not len(a2a):
        return 0
    return int(sum(isinstance(s, list) and len(set(s)) > 1 for s in a2a["send_splits"]))


def a2a_role_of(total: dict, uneven: int) -> tuple[str | None, str]:
    """:func:`all_to_all_role` from the counts of
    :func:`pardiag.analyzer.per_rank.layout_marks.all_to_all_evidence` (summed over the ranks
    read) and the all-to-alls whose split sizes differ (:func:`uneven_splits`); ``profile``
    weighs one rank's own this way when it records the layout."""
    routing = [s for s, n in ((f"{uneven} with split sizes that differ", uneven),
                              (f"{total['router']} routing events (top-k gate, router, experts)",
                               total["router"])) if n]
    sequence = sequence_exchange_evidence(total)
    if uneven and not total["router"] and total["sequence_exchange"]:
        # split sizes that differ are no router: attention heads split over ranks that do not
        # divide them differ too (13 over 4: 4, 3, 3, 3), and the exchange is named as one
        return "cp", ("they exchange sequence and head shards around attention "
                      f"({'; '.join(sequence)}; {uneven} with split sizes that differ, as heads "
                      f"that do not divide over the ranks split, and no router)")
    if routing and not sequence:
        return "ep", f"they dispatch tokens to experts ({'; '.join(routing)})"
    if sequence and not routing:
        return "cp", ("they exchange sequence and head shards around attention "
                       f"({'; '.join(sequence)})")
    if routing:
        return None, (f"what the all-to-alls carry is unknown: expert dispatch by "
                      f"{'; '.join(routing)}, but a sequence exchange by {'; '.join(sequence)}")
    return None, ("what the all-to-alls carry is unknown: no router, no split sizes that differ "
                  "and no attention next to them say expert (ep) or sequence (cp) parallelism")


def sequence_exchange_evidence(total: dict) -> list[str]:
    """The lines of evidence that all-to-alls exchange sequence and head shards (Ulysses-style
    sequence parallelism), from the counts :func:`a2a_role_of` takes: events named as such, or
    all-to-alls next to attention in at least :data:`ATTENTION_SHARE` of them; [] for none."""
    n = total["a2a_events"]
    near = total["a2a_attention"]
    return [s for s, hit in (
        (f"{total['sequence_exchange']} events named as a sequence exchange (_SeqAllToAll, "
         f"Ulysses)", total["sequence_exchange"] > 0),
        (f"{near} of {n} next to attention", n > 0 and near >= ATTENTION_SHARE * n)) if hit]


def a2a_evidence_totals(traces: TraceSet) -> dict:
    """The all-to-all evidence counts (:data:`pardiag.analyzer.per_rank.layout_marks.
    A2A_EVIDENCE`) summed over the ranks of ``traces``."""
    marks = [summary_of(t).marks for t in traces.ranks.values()]
    return {k: sum(m.counts.get(k, 0) for m in marks) for k in A2A_EVIDENCE}


def unplaced_reductions(events: pd.DataFrame | None) -> int:
    """Gradient reductions (all-reduce, reduce-scatter, all-gather of more than scalars, not
    issued through functional collectives, which tensor parallelism runs) whose group the
    events do not name."""
    if events is None or not len(events):
        return 0
    size = pd.to_numeric(events["bytes"], errors="coerce")
    sel = (events["group"].astype(str).isin(["", AMBIGUOUS_GROUP]) & events["op"].isin(DP_OPS)
           & ~(size <= SCALAR_BYTES))
    if "functional" in events.columns:
        sel &= ~events["functional"].astype(bool)
    return int(sel.sum())


def reducing_groups(events: pd.DataFrame | None, gradients: bool = False
                    ) -> list[tuple[frozenset, str]]:
    """``(ranks, description or ranks)`` of every group the communication events show running
    a collective of :data:`pardiag.analyzer.analyses.mesh.DP_OPS`; with ``gradients``, only
    those where one moved more than :data:`~pardiag.analyzer.per_rank.comm_events.SCALAR_BYTES`
    (a loss's or a norm's all-reduce is no gradient's)."""
    if events is None or not len(events):
        return []
    ev = events[~events["group"].astype(str).isin(["", AMBIGUOUS_GROUP])
                & events["op"].isin(DP_OPS)]
    if gradients:
        ev = ev[pd.to_numeric(ev["bytes"], errors="coerce").gt(SCALAR_BYTES).to_numpy()]
    out = []
    for key in ev["group"].astype(str).unique():
        ranks, _, desc = key.partition("|")
        out.append((frozenset(int(r) for r in ranks.split(",")), desc or f"ranks {ranks}"))
    return out


#: Tensor parallelism issues more than this many per rank and step (two per layer in the
#: forward and two in the backward of a model of three layers; trainers reduce 2-5 scalars a step).
SCALAR_PER_STEP = 8


def scalar_reductions(events: pd.DataFrame | None) -> str | None:
    """A line of evidence when the functional collectives are only scalar reductions — all-reduces
    of at most :data:`~pardiag.analyzer.analyses.comm_events.SCALAR_BYTES` bytes, at most
    :data:`SCALAR_PER_STEP` per rank and profiled step, no functional all-gather or
    reduce-scatter — which trainers run for the loss, token
    counts and the gradient norm (torchtitan's ``dist_mean`` / ``dist_max``, DTensor's
    ``full_tensor()`` of a norm): no evidence of tensor parallelism, whose functional collectives
    move activations (all-reduces of ``batch × seq × hidden`` elements, or all-gathers and
    reduce-scatters with sequence parallelism). None when they may be tensor parallelism, or when
    ``events`` do not say (no events, unknown sizes)."""
    if events is None or events.empty or "functional" not in events.columns:
        return None
    fn = events[events["functional"].astype(bool)]
    if fn.empty or (fn["op"] != "all_reduce").any():
        return None
    size = pd.to_numeric(fn["bytes"], errors="coerce")
    if size.isna().any() or (size > SCALAR_BYTES).any():
        return None
    stepped = fn[fn["step"] >= 0]
    per = stepped.groupby(["rank", "step"]).size() if len(stepped) else pd.Series(dtype=int)
    if len(per) and per.max() > SCALAR_PER_STEP:
        return None
    return (f"no tp: the {len(fn)} functional collectives are all-reduces of at most "
            f"{int(size.max())} bytes, {int(per.max()) if len(per) else 0} or fewer per rank and "
            f"step — the loss, token counts and gradient norm a trainer reduces, not tensor "
            f"parallelism's activations")


def functional_role(events: pd.DataFrame | None) -> tuple[str | None, str]:
    """What the functional collectives (``_c10d_functional::*``, the ones that are more than
    scalar reductions) carry, over all of them (:func:`functional_roles` per group), from their
    order and sizes in each rank's profiled steps (the first step of a rank, which the profiler
    may have cut, left out where there are more):

    * ``("ddp", line)``: all-reduces of more than
      :data:`~pardiag.analyzer.analyses.comm_events.SCALAR_BYTES` bytes, every one issued in
      the backward (:func:`pardiag.analyzer.per_rank.comm_events.in_backward`) beside no
      gather or scatter: gradients, as DDP under compiled autograd reduces them (tensor
      parallelism reduces activations in the forward too);
    * ``("tp", line)``: all-reduces of more than
      :data:`~pardiag.analyzer.analyses.comm_events.SCALAR_BYTES` bytes (tensor parallelism
      reduces activations), or all-gathers and reduce-scatters that alternate from the step's
      start (sequence parallelism gathers before each block and scatters after it);
    * ``("fsdp", line)``: no such all-reduce (nor one of unknown size), and every step of every
      rank opens with two or more all-gathers before its first reduce-scatter, at least as many
      as the step's reduce-scatters: FSDP gathers the parameters of each unit for the forward
      and reduce-scatters the gradients in the backward (SimpleFSDP, torch.compile'd FSDP, whose
      collectives are functional and which no wrapper range names); sequence parallelism's
      scatters, mixed in where the groups are not named, come early and outnumber the lead;
    * ``(None, line)``: the order says neither (all-gathers only, one unit, steps that differ);
      the line says so;
    * ``("", "")``: they are all-to-alls (and scalar all-reduces) alone, which say nothing of
      tensor parallelism: what all-to-alls carry is :func:`all_to_all_role`'s to say.

    Without ``events`` the functional collectives are read as tensor parallelism's, as when
    nothing else is known."""
    if events is None or events.empty or "functional" not in events.columns:
        return "tp", ""
    fn = _in_steps(events[events["functional"].astype(bool)])
    role = _role_of_functional(fn)
    if role[0] == "" and len(fn) and set(fn["op"]) <= {"all_to_all", "all_reduce"} \
            and (fn["op"] == "all_to_all").any():
        return "", ""   # all-to-alls (what they carry: all_to_all_role) and scalars: no tp
    return role if role[0] != "" else ("tp", "")


def _in_steps(fn: pd.DataFrame) -> pd.DataFrame:
    """The functional collectives ``fn`` of the profiled steps; where none falls in a step (a
    trace without ``ProfilerStep`` ranges: inference, a server), all of them as one step, so
    that their order is read rather than taken for tensor parallelism's."""
    inside = fn[fn["step"] >= 0]
    return inside if len(inside) or fn.empty else fn.assign(step=0)


def functional_roles(events: pd.DataFrame | None) -> dict[str, tuple[str | None, str]]:
    """:func:`functional_role` for the functional collectives of each group the events name
    (``{group key: (role, line)}``; the key ``""`` holds those of no named group), leaving out
    groups that ran only scalar reductions: FSDP's and tensor parallelism's groups are told
    apart where a job runs both through functional collectives (SimpleFSDP × TP)."""
    if events is None or events.empty or "functional" not in events.columns:
        return {}
    fn = _in_steps(events[events["functional"].astype(bool)])
    key = fn["group"].astype(str).where(fn["group"].astype(str) != AMBIGUOUS_GROUP, "")
    out = {}
    for g, sub in fn.groupby(key):
        role = _role_of_functional(sub)
        if role[0] != "":
            out[str(g)] = role
    return out


def _role_of_functional(fn: pd.DataFrame) -> tuple[str | None, str]:
    """The role of the functional collectives ``fn`` (see :func:`functional_role`);
    ``("", "")`` when they are only scalar all-reduces (or none)."""
    size = pd.to_numeric(fn["bytes"], errors="coerce")
    big = fn[(fn["op"] == "all_reduce") & (size > SCALAR_BYTES)]
    if len(big) and "backward" in big.columns and big["backward"].astype(bool).all() \
            and not fn["op"].isin(["all_gather", "reduce_scatter"]).any():
        return "ddp", (f"{len(big)} all-reduces of more than {SCALAR_BYTES} bytes, every one "
                       f"issued in the backward and none in the forward: gradient reductions "
                       f"(DDP under compiled autograd), not tensor parallelism's activations, "
                       f"which it reduces in the forward too")
    if len(big):
        return "tp", (f"{len(big)} all-reduces of more than {SCALAR_BYTES} bytes "
                      f"(activations)")
    moves = fn[fn["op"].isin(["all_gather", "reduce_scatter"])]
    if moves.empty:
        return "", ""
    unsized = int(((fn["op"] == "all_reduce") & size.isna()).sum())
    leads, scatters = [], []
    for _, by_rank in moves.groupby("rank"):
        steps = sorted(by_rank["step"].unique())
        for st in steps[1:] if len(steps) > 1 else steps:
            ops = list(by_rank[by_rank["step"] == st].sort_values("start_us")["op"])
            if "reduce_scatter" in ops:
                leads.append(ops.index("reduce_scatter"))
                scatters.append(ops.count("reduce_scatter"))
    if leads and min(leads) >= 2 and all(a >= b for a, b in zip(leads, scatters)):
        if unsized:
            return None, (f"what the functional collectives carry is unknown: FSDP's order of "
                          f"gathers and scatters beside {unsized} all-reduces of unknown size "
                          f"(tensor parallelism's activations, or scalars)")
        return "fsdp", (f"every step opens with {min(leads)} or more all-gathers before its "
                        f"first reduce-scatter, as many as its reduce-scatters or more, and no "
                        f"all-reduce moves activations: FSDP's order (parameters gathered for "
                        f"the forward, gradients reduce-scattered in the backward)")
    if leads and max(leads) <= 1 and min(scatters) >= 2:
        return "tp", ("all-gathers and reduce-scatters alternate from the step's start "
                      "(sequence parallelism)")
    return None, ("what the functional collectives carry is unknown: "
                  + ("all-gathers without reduce-scatters" if not leads else
                     f"{min(leads)}–{max(leads)} all-gathers before a step's first "
                     f"reduce-scatter") + " fit both tensor parallelism and FSDP: neither is "
                  "inferred from them")


def zero12_line(events: pd.DataFrame | None) -> str | None:
    """A line of evidence when, with no wrapper's marks, one group's ops each profiled step are
    gradient reductions (all-reduce or reduce-scatter) and at most as many all-gathers: ZeRO-1/2's
    pattern (DeepSpeed reduces the gradients in buckets and gathers the updated partitions;
    DDP has its own marks, FSDP gathers before each module); else None. Functional collectives
    are left out: DeepSpeed issues c10d's own."""
    if events is None or events.empty:
        return None
    ev = events[events["step"] >= 0]
    if "functional" in ev.columns:   # DeepSpeed issues c10d ops; functional ones are others'
        ev = ev[~ev["functional"].astype(bool)]
    for key, sub in ev.groupby(ev["group"].astype(str) + "|" + ev["pg"].astype(str)):
        per = sub.groupby(["rank", "step"])["op"].value_counts().unstack(fill_value=0)
        red = per.reindex(columns=["all_reduce", "reduce_scatter"], fill_value=0).sum(axis=1)
        ag = per.get("all_gather", pd.Series(0, index=per.index))
        other = per.drop(columns=[c for c in ("all_reduce", "reduce_scatter", "all_gather")
                                  if c in per.columns]).sum(axis=1)
        if len(per) and (red >= 1).all() and (ag >= 1).all() and (ag <= red).all() \
                and (other == 0).all():
            return (f"zero: on group {key.split('|')[0] or 'of unknown ranks'} every profiled "
                    f"step reduces gradients ({int(red.median())}) and gathers the updated "
                    f"partitions ({int(ag.median())}), with no DDP or FSDP marks: ZeRO-1/2 "
                    f"(DeepSpeed)")
    return None


def hybrid_sharding(events: pd.DataFrame | None, member: dict, dp: int | None) -> str | None:
    """The evidence line of hybrid sharding (HSDP: ``HYBRID_SHARD``, or FSDP2 on a 2-D data
    parallel mesh), else None: over groups of no other dimension (``member``: ``{rank: {dim:
    group ranks}}``), the parameters are all-gathered and the gradients reduce-scattered over
    groups of ``s`` ranks (the shards) and the gradients all-reduced over groups of ``r`` ranks
    (the replicas), ``s·r = dp``, both above 1, each shard group meeting each replica group in
    at most one rank. Only transfers above
    :data:`~pardiag.analyzer.per_rank.comm_events.SCALAR_BYTES` count (a loss or a norm is
    all-reduced over any group)."""
    if events is None or not len(events) or not dp or dp < 4:
        return None
    ev = events[~events["group"].astype(str).isin(["", AMBIGUOUS_GROUP])]
    ev = ev[pd.to_numeric(ev["bytes"], errors="coerce").gt(SCALAR_BYTES).to_numpy()]
    shards: dict[frozenset[int], str] = {}
    replicas: dict[frozenset[int], str] = {}
    for key, sub in ev.groupby("group"):
        ranks_text, _, desc = str(key).partition("|")
        ranks = frozenset(int(r) for r in ranks_text.split(","))
        if any(frozenset(g) == ranks for r in ranks
               for d, g in member.get(r, {}).items() if d != "dp"):
            continue   # another dimension's group (tensor parallelism all-reduces too)
        ops = set(sub["op"])
        if {"all_gather", "reduce_scatter"} <= ops:
            shards[ranks] = desc
        elif ops == {"all_reduce"}:
            replicas[ranks] = desc
    s_sizes, r_sizes = {len(g) for g in shards}, {len(g) for g in replicas}
    if len(s_sizes) != 1 or len(r_sizes) != 1:
        return None
    s, r = s_sizes.pop(), r_sizes.pop()
    if s < 2 or r < 2 or s * r != dp or any(len(a & b) > 1 for a in shards for b in replicas):
        return None

    def named(groups: dict[frozenset[int], str]) -> str:
        descs = sorted({d for d in groups.values() if d})
        return f" ({', '.join(descs)})" if descs else ""
    return (f"hybrid sharding (HSDP): parameters all-gathered and gradients reduce-scattered "
            f"over {len(shards)} groups of {s} ranks{named(shards)}, gradients all-reduced over "
            f"{len(replicas)} groups of {r}{named(replicas)}: sharded {s} ways, replicated "
            f"{r} ways")
