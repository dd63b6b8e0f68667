"""The recommendation rules, one per kind of change, registered in :data:`RULES`.

A rule is a plain function ``(RuleContext) -> list[Recommendation]``: it reads the one typed context
(:class:`pardiag.analyzer.predict.recommend.context.RuleContext`), evaluates its changes and returns
them all — those predicted not to help too; ranking them, the noise rule and the verdict are
:mod:`pardiag.analyzer.predict.recommend.policy`'s. A new rule is one module here and one line in
:data:`RULES`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..context import RuleContext
from ..types import Recommendation
from .ddp_buckets import ddp_buckets
from .degrees import degrees
from .fsdp import fsdp_prefetch, fsdp_reshard
from .memory import memory_sharding
from .pipeline import pipeline_changes
from .placement import placement
from .pp_to_dp import pp_to_dp
from .routing import moe_routing
from .straggler import straggler
from .zero import zero_changes


@dataclasses.dataclass(frozen=True)
class Rule:
    """One registered rule: its name and the function evaluating its changes."""

    name: str
    compute: Callable[[RuleContext], list[Recommendation]]


#: Every rule, in the order their changes are listed when they tie.
RULES: tuple[Rule, ...] = (
    Rule("pipeline", pipeline_changes),
    Rule("pp_to_dp", pp_to_dp),
    Rule("straggler", straggler),
    Rule("moe_routing", moe_routing),
    Rule("ddp_buckets", ddp_buckets),
    Rule("fsdp_reshard", fsdp_reshard),
    Rule("fsdp_prefetch", fsdp_prefetch),
    Rule("degrees", degrees),
    Rule("placement", placement),
    Rule("memory_sharding", memory_sharding),
    Rule("zero", zero_changes),
)
