"""What each communication op says across ranks: one table the matching, the clock model, the
waits and the bandwidth read.

* **Release-together ops** (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
  ``barrier``): no member can finish before every member has contributed, and every member
  finishes when the last contribution has travelled the ring or tree, so all members leave at
  about the same moment (nccl-tests, doc/PERFORMANCE.md: the time of an op is bounded by its last
  arrival). Their ends are the only evidence of how the ranks' clocks relate, and their arrival
  skew the only evidence of who is late for a group.
* **Rooted ops** (``broadcast``, ``reduce``, ``scatter``, ``gather``): data flows from (or to) one
  root along a chain or tree; members end one hop after another by design, so their ends say
  nothing about clocks. A member waits only for the root (broadcast, scatter) or the root for the
  members (reduce, gather); the waits are measured against the root.
* **Point-to-point** (``send``, ``recv``, ``send_recv``): a pair relates only its two ranks; each
  side waits for its peer.

Anything else (a custom kernel a ``--comm-kernel`` pattern names) is release-together when its
name says it runs one of those ops (``my_allreduce_kernel``), else :data:`UNKNOWN`: matched, but
no evidence of clocks or lateness.
"""

from __future__ import annotations

TOGETHER = "together"
ROOTED = "rooted"
PAIR = "pair"
UNKNOWN = "unknown"

RELEASE_TOGETHER_OPS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                  "barrier"})
ROOTED_OPS = frozenset({"broadcast", "reduce", "scatter", "gather"})
P2P_OPS = frozenset({"send", "recv", "send_recv"})
#: Rooted ops whose data leaves the root: members wait for the root to arrive.
FROM_ROOT = frozenset({"broadcast", "scatter"})
_TOGETHER_WORDS = ("allreduce", "allgather", "reducescatter", "alltoall", "barrier")


def semantics(op: str) -> str:
    """:data:`TOGETHER`, :data:`ROOTED`, :data:`PAIR` or :data:`UNKNOWN` for a standard
    collective name (:func:`pardiag.analyzer.trace.classify.collective_type`) or a custom
    kernel's name."""
    if op in RELEASE_TOGETHER_OPS:
        return TOGETHER
    if op in ROOTED_OPS:
        return ROOTED
    if op in P2P_OPS:
        return PAIR
    flat = str(op).lower().replace("_", "")
    return TOGETHER if any(w in flat for w in _TOGETHER_WORDS) else UNKNOWN


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of collective ``op`` over ``n`` ranks (doc/PERFORMANCE.md):
    2(n−1)/n for all_reduce, (n−1)/n for all_gather, reduce_scatter and all_to_all, 1 for
    broadcast, reduce and point-to-point; 0 for a collective of one rank."""
    if n <= 1:
        return 0.0 if op not in P2P_OPS else 1.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0
