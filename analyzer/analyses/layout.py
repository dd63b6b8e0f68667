"""The parallel layout of a run: dimensions and degrees, strategies, the process groups of each
dimension, and which groups span more than one node (not to be confused with
:mod:`pardiag.layout`, the run folder's layout on disk).

A pardiag run keeps the layout it recorded (``run.json``, the comms sidecars, the rank metadata);
traces recorded without pardiag get the layout :mod:`pardiag.analyzer.analyses.infer_layout`
infers from them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..trace import vocab
from ..trace.traceset import TraceSet
from .infer_layout import InferredLayout, is_pardiag_run


@dataclasses.dataclass(frozen=True)
class LayoutResult:
    """Result of :func:`compute_layout`.

    Attributes:
        dims: ``{dim: degree}`` (e.g. ``{"dp": 2, "tp": 2}``); ``{}`` when unknown.
        strategies: e.g. ``["fsdp2", "tp"]``.
        pipeline: schedule, stages, microbatches, stages per rank, or None.
        groups: ``dim``, ``pg``, ``desc``, ``ranks``, ``size``, ``nodes`` (hosts spanned),
            ``spans_nodes``.
        nodes: ``{host: [ranks]}``.
        source: ``"recorded"`` (pardiag's records of the run) or ``"inferred from traces"``
            (:mod:`pardiag.analyzer.analyses.infer_layout`, for traces recorded without pardiag).
        evidence: for an inferred layout, what each conclusion rests on (one line each).
        not_inferred: for an inferred layout, what could not be inferred or is only estimated,
            and how (one line each).
        folded: ``{"ep": "dp"}`` when expert parallelism is folded into data parallelism (its
            groups partition the data-parallel groups, so ``dp`` and ``ep`` do not multiply to
            the world: :func:`pardiag.analyzer.analyses.mesh.fold_expert_parallel`), else
            ``{}``.
    """

    dims: dict
    strategies: list
    pipeline: dict | None
    groups: pd.DataFrame
    nodes: dict
    source: str = "recorded"
    evidence: tuple[str, ...] = ()
    not_inferred: tuple[str, ...] = ()
    folded: dict = dataclasses.field(default_factory=dict)


def dims_text(dims: dict, folded: dict | None = None, eq: str = "=") -> str:
    """``"DP=4, EP=2 folded into DP"``: the degrees in upper case in their order, each folded
    dimension (``folded``, :attr:`LayoutResult.folded`) last and said to be folded."""
    folded = folded or {}
    order = sorted(dims, key=lambda d: d in folded)
    return ", ".join(f"{str(k).upper()}{eq}{dims[k]}"
                     + (f" folded into {str(folded[k]).upper()}" if k in folded else "")
                     for k in order)


def compute_layout(traces: TraceSet, inferred: InferredLayout | None = None) -> LayoutResult:
    """The run's parallel layout from ``run.json``, the comms sidecars and rank metadata.

    Traces from elsewhere carry less: process groups from ``distributedInfo.pg_config`` (a group's
    dimension is the inferred mesh's that holds it, never a name read off a description: size-1
    and internal groups such as torchtitan's ``mesh_batch`` have none), hosts unknown; dimensions,
    strategies and the pipeline come from ``inferred`` (:func:`infer_layout.infer_layout`), and the
    result says so (``source``, ``evidence``, ``not_inferred``). A pardiag run keeps its recorded
    layout.
    """
    run = traces.run_info
    lay = (run.layout if run else None) or {}
    if not lay.get("dims"):  # rank 0 failed before recording it: a surviving rank's record
        lay = next((m.layout for _, m in sorted(traces.rank_meta.items())
                    if m.layout and m.layout.get("dims")), lay)
    hosts = {r: m.host for r, m in traces.rank_meta.items() if m.host}
    nodes = (run.nodes if run else None) or {}
    if not nodes and hosts:
        for r, h in sorted(hosts.items()):
            nodes.setdefault(h, []).append(r)
    rows, seen = [], set()
    for doc in traces.sidecars.get("comms", {}).values():
        for g in doc.process_groups:
            key = (str(g.name), tuple(g.ranks))
            if key not in seen:
                seen.add(key)
                rows.append((g.dim, str(g.name), g.desc, list(g.ranks)))
    if not rows:  # traces from elsewhere: distributedInfo.pg_config
        for t in traces.ranks.values():
            groups = vocab.DIST_PG_CONFIG.get(vocab.DISTRIBUTED_INFO.get(t.metadata))
            for g in groups if isinstance(groups, list) else []:
                if not isinstance(g, dict):
                    continue
                ranks = vocab.PG_CONFIG_RANKS.get(g)
                ranks = ranks if isinstance(ranks, list) else []
                name = str(vocab.PG_CONFIG_NAME.get(g))
                key = (name, tuple(ranks))
                if key not in seen:
                    seen.add(key)
                    dim = inferred.dim_of_group(ranks) if inferred is not None else None
                    rows.append((dim, name, str(vocab.PG_CONFIG_DESC.get(g, "")), ranks))
    out = []
    for dim, pg, desc, ranks in rows:
        spanned = sorted({hosts[r] for r in ranks if r in hosts})
        out.append({"dim": dim, "pg": pg, "desc": desc, "ranks": ranks, "size": len(ranks),
                    "nodes": len(spanned) if spanned else np.nan,
                    "spans_nodes": len(spanned) > 1 if spanned else None})
    groups = pd.DataFrame(out, columns=["dim", "pg", "desc", "ranks", "size", "nodes",
                                        "spans_nodes"])
    if inferred is not None and not is_pardiag_run(traces):
        return LayoutResult(dict(inferred.dims), list(inferred.strategies), inferred.pipeline,
                            groups, nodes, inferred.source, tuple(inferred.evidence),
                            tuple(inferred.not_inferred), dict(inferred.folded))
    return LayoutResult(dict(lay.get("dims") or {}), list(lay.get("strategies") or []),
                        lay.get("pipeline"), groups, nodes, folded=dict(lay.get("folded") or {}))
